//! One small f16 problem on the wgpu backend with inputs whose outputs can be read by eye: V's
//! element (key j, dim d) is j + d/32, so every output element says which keys it averaged. For
//! debugging the cooperative-matrix kernel (`ATTN_WGPU_COOP=1`) against the FMA kernel. With
//! `ATTN_WGPU_COOP_DUMP=s` or `=p` the kernel writes its first tile's scores or probabilities
//! instead of O, and the host's values of the same are printed beside them.
//! `cargo run --release -p attn-wgpu --example coop_debug`

use attn_core::{Attention, Buffer, DType, Inputs, Outputs, Problem, Shape};

fn main() {
    let backend = attn_wgpu::Wgpu::from_env();
    let dump = std::env::var("ATTN_WGPU_COOP_DUMP").unwrap_or_default();
    let cases =
        [("Q = 0, full", true, false), ("random Q, full", false, false), ("random Q, causal", false, true)];
    for (name, zero_q, causal) in cases {
        let (s, d) = (16usize, 32usize);
        let mut problem = Problem::new(Shape::new(1, 1, s, d), DType::F16).with_lse(true);
        if causal {
            problem = problem.causal();
        }
        let mut rng = attn_core::rng::SplitMix64::new(5);
        let q =
            Buffer::from_f32(DType::F16, (0..s * d).map(|_| if zero_q { 0.0 } else { rng.normal() as f32 }));
        let k = Buffer::from_f32(DType::F16, (0..s * d).map(|_| rng.normal() as f32));
        let v = Buffer::from_f32(DType::F16, (0..s * d).map(|i| (i / d) as f32 + (i % d) as f32 / 32.0));
        let mut o = Buffer::zeros(DType::F16, s * d);
        let mut lse = vec![0.0f32; s];
        let plan = match backend.forward(
            &problem,
            Inputs { q: q.as_data(), k: k.as_data(), v: v.as_data() },
            Outputs { o: o.as_data_mut(), lse: Some(&mut lse) },
        ) {
            Ok(plan) => plan,
            Err(e) => {
                println!("SKIPPED coop_debug: {e}");
                return;
            }
        };
        let (q, k, v, o) = (q.to_f32_vec(), k.to_f32_vec(), v.to_f32_vec(), o.to_f32_vec());
        // The host's scores in log2 units (what the kernel keeps), masked, and the rest from them.
        let scale = problem.scale() * std::f32::consts::LOG2_E;
        let score = |i: usize, j: usize| -> f32 {
            if causal && j > i {
                return f32::NEG_INFINITY;
            }
            (0..d).map(|x| q[i * d + x] * k[j * d + x]).sum::<f32>() * scale
        };
        println!("{name}: {} (dump: {})", plan.kernel, if dump.is_empty() { "none" } else { &dump });
        for r in [0, 1, 2, 15] {
            let row: Vec<String> = o[r * d..r * d + 8].iter().map(|x| format!("{x:8.3}")).collect();
            let max = (0..s).map(|j| score(r, j)).fold(f32::NEG_INFINITY, f32::max);
            let p: Vec<f32> = (0..s).map(|j| (score(r, j) - max).exp2()).collect();
            let sum: f32 = p.iter().sum();
            let want: Vec<f32> = match dump.as_str() {
                "s" => (0..8).map(|j| score(r, j).max(-60000.0)).collect(),
                "p" => p[..8].to_vec(),
                _ => (0..8).map(|x| (0..s).map(|j| p[j] * v[j * d + x]).sum::<f32>() / sum).collect(),
            };
            let want: Vec<String> = want.iter().map(|x| format!("{x:8.3}")).collect();
            println!("  row {r:2} got  {}  lse {:.3}", row.join(" "), lse[r]);
            println!(
                "         want {}  lse {:.3}",
                want.join(" "),
                (max + sum.log2()) * std::f32::consts::LN_2
            );
        }
    }
}
