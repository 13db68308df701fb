//! The library in use: describe a problem, let attn pick the best backend here, run it, read the
//! output, and check one row against the exact reference. `cargo run --release --example quickstart`.

use attn::measure::{accuracy, random_inputs};
use attn::{Backend, Buffer, Outputs, Problem, Shape};

fn main() -> Result<(), attn::Error> {
    // 2 sequences of 1024 tokens, 8 query heads sharing 2 key/value heads, head_dim 64, causal.
    let shape = Shape { heads_kv: 2, ..Shape::new(2, 8, 1024, 64) };
    let problem = Problem::new(shape, attn::DType::Bf16).causal().with_lse(true);

    let backend = Backend::auto(&problem)?;
    println!("backend: {}\n{}", backend.name(), backend.plan(&problem)?);

    let [q, k, v] = random_inputs(&problem, 7);
    let inputs = attn::Inputs { q: q.as_data(), k: k.as_data(), v: v.as_data() };
    let mut o = Buffer::zeros(problem.dtype, problem.required_lens()[3].1);
    let mut lse = vec![0.0f32; problem.lse_len()];
    backend.forward(&problem, inputs, Outputs { o: o.as_data_mut(), lse: Some(&mut lse) })?;

    // Row 0 of head 0 attends only to key 0 (causal), so its output is v[0] and its LSE is the
    // single scaled score q·k / sqrt(64).
    let first: Vec<f32> = o.to_f32_vec()[..4].to_vec();
    println!("o[0,0,0,..4] = {first:?}, lse[0] = {}", lse[0]);

    let acc = accuracy(&problem, &inputs, &o, 64);
    println!("vs f64 reference on {} rows: relative L2 {:.2e}", acc.rows, acc.rel_l2);
    assert!(acc.rel_l2 < 1e-2 && acc.non_finite == 0, "bf16 result too far from the reference");
    Ok(())
}
