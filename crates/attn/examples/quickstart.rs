//! The library in use: q, k, v as ndarray arrays in FlashAttention's `[batch, seq, heads,
//! head_dim]` order, the best backend here chosen for their problem, the output read back, and
//! the result checked against the exact reference. `cargo run --release --example quickstart`.

use attn::half::bf16;
use attn::ndarray::Array4;
use attn::rng::SplitMix64;
use attn::{Backend, Mask, Params, host};

fn main() -> Result<(), attn::Error> {
    // 2 sequences of 512 tokens, 8 query heads sharing 2 key/value heads, head_dim 64.
    let mut rng = SplitMix64::new(7);
    let mut normal = |_| bf16::from_f32(rng.normal() as f32);
    let q = Array4::from_shape_fn((2, 512, 8, 64), &mut normal);
    let k = Array4::from_shape_fn((2, 512, 2, 64), &mut normal);
    let v = Array4::from_shape_fn((2, 512, 2, 64), &mut normal);
    let params = Params { mask: Mask::Causal, return_lse: true, ..Params::default() };

    // The views' shapes and strides are the problem; any strided view with head_dim contiguous
    // works the same (e.g. a BHSD array through `.permuted_axes([0, 2, 1, 3])`).
    let problem = host::problem(&q.view(), &k.view(), &v.view(), None, &params)?;
    let backend = Backend::auto(&problem)?;
    println!("backend: {}\n{}", backend.name(), backend.plan(&problem)?);

    let (o, lse) = host::attention(&*backend, q.view(), k.view(), v.view(), &params)?;
    let lse = lse.expect("asked for with return_lse");

    // Row 0 attends only to key 0 (causal), so its output is v's first row and its LSE is the
    // single scaled score q·k / sqrt(64).
    println!("o[0, 0, 0, ..4] = {:?}, lse[0, 0, 0] = {}", &o.as_slice().unwrap()[..4], lse[[0, 0, 0]]);

    let (exact, _) =
        host::attention(&*Backend::by_name("cpu-reference")?, q.view(), k.view(), v.view(), &params)?;
    let sq = |x: f32| (x as f64) * (x as f64);
    let diff2: f64 = o.iter().zip(&exact).map(|(a, b)| sq(a.to_f32() - b.to_f32())).sum();
    let rel_l2 = (diff2 / exact.iter().map(|x| sq(x.to_f32())).sum::<f64>()).sqrt();
    println!("vs the exact reference: relative L2 {rel_l2:.2e}");
    assert!(rel_l2 < 1e-2, "bf16 result too far from the reference");
    Ok(())
}
