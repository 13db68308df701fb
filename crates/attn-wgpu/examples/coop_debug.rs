//! One small f16 problem on the wgpu backend with inputs whose outputs can be read by eye: V's
//! element (key j, dim d) is j + d/32, so every output element says which keys it averaged. For
//! debugging the cooperative-matrix kernel (`ATTN_WGPU_COOP=1`) against the FMA kernel.
//! `cargo run --release -p attn-wgpu --example coop_debug`

use attn_core::{Attention, Buffer, DType, Inputs, Outputs, Problem, Shape};

fn main() {
    let backend = attn_wgpu::Wgpu::from_env();
    for (name, zero_q, causal) in [("Q = 0, full", true, false), ("random Q, causal", false, true)] {
        let (s, d) = (16usize, 32usize);
        let mut problem = Problem::new(Shape::new(1, 1, s, d), DType::F16);
        if causal {
            problem = problem.causal();
        }
        let mut rng = attn_core::rng::SplitMix64::new(5);
        let q =
            Buffer::from_f32(DType::F16, (0..s * d).map(|_| if zero_q { 0.0 } else { rng.normal() as f32 }));
        let k = Buffer::from_f32(DType::F16, (0..s * d).map(|_| rng.normal() as f32));
        let v = Buffer::from_f32(DType::F16, (0..s * d).map(|i| (i / d) as f32 + (i % d) as f32 / 32.0));
        let mut o = Buffer::zeros(DType::F16, s * d);
        let plan = match backend.forward(
            &problem,
            Inputs { q: q.as_data(), k: k.as_data(), v: v.as_data() },
            Outputs { o: o.as_data_mut(), lse: None },
        ) {
            Ok(plan) => plan,
            Err(e) => {
                println!("SKIPPED coop_debug: {e}");
                return;
            }
        };
        let o = o.to_f32_vec();
        println!("{name}: {}", plan.kernel);
        for r in [0, 1, 2, 15] {
            let row: Vec<String> = o[r * d..r * d + 8].iter().map(|x| format!("{x:.3}")).collect();
            println!("  o[{r:2}][0..8] = {}", row.join(" "));
        }
    }
}
