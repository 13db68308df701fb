//! Writes, for a few shapes, the inputs of a backward pass and attn's CUDA gradients of them as
//! `.npy` files (16-bit values as raw bits), for `bench/peers/accuracy_backward.py` to compare
//! with PyTorch SDPA's backward and an fp64 reference on the same numbers. Per shape: q, k, v,
//! dO (random normal, bf16, BHSD), attn's forward O and LSE, and attn's dq, dk, dv from them (as a
//! training step would compute them), plus a JSON file of the shape.
//!
//! `cargo run --release -p attn --example backward_dump -- DIR` (needs CUDA).

use attn::npy;
use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::{
    Attention, BackwardOptions, Buffer, DType, GradInputs, Gradients, Inputs, Outputs, Problem, Shape,
};
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: backward_dump DIR")?;
    std::fs::create_dir_all(&dir)?;
    if let Err(reason) = attn_cuda::probe() {
        return Err(format!("CUDA is unavailable, because {reason}").into());
    }
    let cuda = attn_cuda::Cuda::from_env()?;
    for (d, seq, causal) in
        [(64, 1024, false), (64, 1024, true), (128, 1024, false), (128, 2048, true), (256, 1024, true)]
    {
        let shape = Shape::new(2, 8, seq, d);
        let mut p = Problem::new(shape, DType::Bf16);
        if causal {
            p = p.causal();
        }
        let mut rng = SplitMix64::new(seq as u64 + d as u64 + u64::from(causal));
        let n = p.required_lens()[0].1;
        let [q, k, v, d_o] = [(); 4].map(|_| normal_buffer(&mut rng, DType::Bf16, n, 1.0));
        let mut o = Buffer::zeros(DType::Bf16, n);
        let mut lse = vec![0f32; p.lse_len()];
        let inputs = Inputs::new(q.as_data(), k.as_data(), v.as_data());
        cuda.forward(&p.with_lse(true), inputs, Outputs { o: o.as_data_mut(), lse: Some(&mut lse) })?;
        let mut grads = [(); 3].map(|_| Buffer::zeros(DType::Bf16, n));
        let [dq, dk, dv] = &mut grads;
        cuda.backward(
            &p,
            BackwardOptions::default(),
            GradInputs { inputs, o: o.as_data(), lse: &lse, d_o: d_o.as_data() },
            Gradients { dq: dq.as_data_mut(), dk: dk.as_data_mut(), dv: dv.as_data_mut() },
        )?;
        let stem = format!("d{d}-s{seq}-{}", if causal { "causal" } else { "none" });
        let [dq, dk, dv] = grads;
        for (name, buf) in
            [("q", &q), ("k", &k), ("v", &v), ("do", &d_o), ("dq", &dq), ("dk", &dk), ("dv", &dv)]
        {
            npy::write(&Path::new(&dir).join(format!("{stem}.{name}.npy")), buf)?;
        }
        let meta = format!(
            "{{\"impl\": \"attn\", \"dtype\": \"bf16\", \"batch\": {}, \"heads\": {}, \"seq\": {seq}, \"head_dim\": {d}, \
             \"causal\": {causal}, \"scale\": {}}}",
            shape.batch,
            shape.heads_q,
            p.scale()
        );
        std::fs::write(Path::new(&dir).join(format!("{stem}.json")), meta)?;
        eprintln!("wrote {stem}");
    }
    Ok(())
}
