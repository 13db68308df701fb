//! Trains a 2-layer transformer on a synthetic next-token task twice, from the same initial
//! weights and the same batches: once with attn's op (`attn_candle::flash_attn`, its backward
//! through attn's cpu-flash) and once with candle's own attention (q·kᵀ, causal mask, softmax,
//! ·v, differentiated by candle). Prints both loss curves, their largest difference, and the
//! time of a training step with each. A third run, candle's attention computed in f64 (the same
//! function, rounded differently), measures how far two trainings drift apart from rounding alone.
//!
//! The task: each sequence follows `x[t+1] = (a·x[t] + c) mod VOCAB` with its own `a` and `c`,
//! which the model can only read from the sequence's earlier tokens, so the loss falls only once
//! attention works.
//!
//! `cargo run --release -p attn-candle --example train -- [steps] [batch] [seq]` (300, 16, 64;
//! CPU, f32).

use attn_core::rng::SplitMix64;
use candle_core::{D, Device, Result, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use std::time::Instant;

const VOCAB: usize = 32;
const MODEL: usize = 64;
const HEADS: usize = 4;
const HEAD_DIM: usize = MODEL / HEADS;
const LAYERS: usize = 2;
const MLP: usize = 4 * MODEL;

/// Which attention a run uses.
#[derive(Clone, Copy)]
enum Attn {
    /// attn's op.
    Op,
    /// candle's own.
    Candle,
    /// candle's own in f64: how far two f32 trainings drift apart from rounding alone.
    CandleF64,
}

/// Every weight, as candle `Var`s.
struct Model {
    embed: Var,
    /// Per layer: wq, wk, wv, wo (MODEL × MODEL), w1 (MODEL × MLP), w2 (MLP × MODEL).
    layers: Vec<[Var; 6]>,
    out: Var,
}

impl Model {
    /// Weights drawn from N(0, 1/fan_in) by `seed`: the same values for both runs.
    fn new(seed: u64, dev: &Device) -> Result<Model> {
        let mut rng = SplitMix64::new(seed);
        let mut var = |rows: usize, cols: usize| {
            let sd = 1.0 / (rows as f64).sqrt();
            let values: Vec<f32> = (0..rows * cols).map(|_| (rng.normal() * sd) as f32).collect();
            Var::from_tensor(&Tensor::from_vec(values, (rows, cols), dev)?)
        };
        let embed = var(VOCAB, MODEL)?;
        let mut layers = vec![];
        for _ in 0..LAYERS {
            layers.push([
                var(MODEL, MODEL)?,
                var(MODEL, MODEL)?,
                var(MODEL, MODEL)?,
                var(MODEL, MODEL)?,
                var(MODEL, MLP)?,
                var(MLP, MODEL)?,
            ]);
        }
        let out = var(MODEL, VOCAB)?;
        Ok(Model { embed, layers, out })
    }

    fn vars(&self) -> Vec<Var> {
        let mut v = vec![self.embed.clone(), self.out.clone()];
        v.extend(self.layers.iter().flatten().cloned());
        v
    }

    /// Logits `[batch, seq, VOCAB]` for tokens `[batch, seq]`.
    fn forward(&self, tokens: &Tensor, with_attn: Attn) -> Result<Tensor> {
        let (b, s) = tokens.dims2()?;
        let mut x = self.embed.as_tensor().embedding(&tokens.flatten_all()?)?.reshape((b, s, MODEL))?;
        for [wq, wk, wv, wo, w1, w2] in &self.layers {
            let h = rms_norm(&x)?;
            let heads = |w: &Var| h.broadcast_matmul(w.as_tensor())?.reshape((b, s, HEADS, HEAD_DIM));
            let (q, k, v) = (heads(wq)?, heads(wk)?, heads(wv)?);
            let scale = 1.0 / (HEAD_DIM as f32).sqrt();
            let a = match with_attn {
                Attn::Op => attn_candle::flash_attn(&q, &k, &v, scale, true)?,
                Attn::Candle => candle_attention(&q, &k, &v, scale)?,
                // The same function in f64, rounded back to f32: other roundings only.
                Attn::CandleF64 => {
                    let f = |t: &Tensor| t.to_dtype(candle_core::DType::F64);
                    candle_attention(&f(&q)?, &f(&k)?, &f(&v)?, scale)?.to_dtype(candle_core::DType::F32)?
                }
            };
            x = (x + a.reshape((b, s, MODEL))?.broadcast_matmul(wo.as_tensor())?)?;
            let h = rms_norm(&x)?;
            x = (x + h.broadcast_matmul(w1.as_tensor())?.relu()?.broadcast_matmul(w2.as_tensor())?)?;
        }
        rms_norm(&x)?.broadcast_matmul(self.out.as_tensor())
    }
}

fn rms_norm(x: &Tensor) -> Result<Tensor> {
    x.broadcast_div(&(x.sqr()?.mean_keepdim(D::Minus1)? + 1e-5)?.sqrt()?)
}

/// candle's own causal attention on `[batch, seq, heads, head_dim]` tensors.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    let s = q.dim(1)?;
    let (q, k, v) = (
        q.transpose(1, 2)?.contiguous()?,
        k.transpose(1, 2)?.contiguous()?,
        v.transpose(1, 2)?.contiguous()?,
    );
    let mask: Vec<f32> =
        (0..s).flat_map(|i| (0..s).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 })).collect();
    let mask = Tensor::from_vec(mask, (s, s), q.device())?.to_dtype(q.dtype())?;
    let scores = (q.matmul(&k.t()?)? * scale as f64)?.broadcast_add(&mask)?;
    candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(&v)?.transpose(1, 2)
}

/// One batch of sequences and their next tokens, by `seed`.
fn batch(seed: u64, b: usize, s: usize, dev: &Device) -> Result<(Tensor, Tensor)> {
    let mut rng = SplitMix64::new(seed);
    let mut all = vec![];
    for _ in 0..b {
        let (a, c) = (1 + 2 * rng.below(2) as u32, rng.below(VOCAB) as u32);
        let mut x = rng.below(VOCAB) as u32;
        for _ in 0..=s {
            all.push(x);
            x = (a * x + c) % VOCAB as u32;
        }
    }
    let seqs = Tensor::from_vec(all, (b, s + 1), dev)?;
    Ok((seqs.narrow(1, 0, s)?.contiguous()?, seqs.narrow(1, 1, s)?.contiguous()?))
}

/// Losses per step and the mean step time (ms, after the first 5 steps).
fn train(with_attn: Attn, steps: usize, b: usize, s: usize) -> Result<(Vec<f32>, f64)> {
    let dev = Device::Cpu;
    let model = Model::new(1, &dev)?;
    let mut opt =
        AdamW::new(model.vars(), ParamsAdamW { lr: 3e-3, weight_decay: 0.0, ..Default::default() })?;
    let (mut losses, mut ms) = (vec![], vec![]);
    for step in 0..steps {
        let (x, y) = batch(1000 + step as u64, b, s, &dev)?;
        let t = Instant::now();
        let logits = model.forward(&x, with_attn)?;
        let loss = candle_nn::loss::cross_entropy(&logits.reshape((b * s, VOCAB))?, &y.flatten_all()?)?;
        opt.backward_step(&loss)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        losses.push(loss.to_scalar::<f32>()?);
    }
    let timed = &ms[5.min(ms.len() - 1)..];
    Ok((losses, timed.iter().sum::<f64>() / timed.len() as f64))
}

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (steps, b, s) = (
        args.first().copied().unwrap_or(300),
        args.get(1).copied().unwrap_or(16),
        args.get(2).copied().unwrap_or(64),
    );
    let (ours, ours_ms) = train(Attn::Op, steps, b, s)?;
    let (theirs, theirs_ms) = train(Attn::Candle, steps, b, s)?;
    let (floor, _) = train(Attn::CandleF64, steps, b, s)?;
    println!("step  loss (attn op)  loss (candle attention)  loss (candle, f64 attention)");
    for i in (0..steps).step_by(25).chain([steps - 1]) {
        println!("{i:>4}  {:>14.5}  {:>23.5}  {:>28.5}", ours[i], theirs[i], floor[i]);
    }
    let diff = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(a, c)| ((a - c) / c).abs()).fold(0f32, f32::max);
    println!(
        "largest relative difference of the loss curves: attn op vs candle {:.2e}; candle vs candle with its \
         attention in f64 (rounding alone) {:.2e}",
        diff(&ours, &theirs),
        diff(&floor, &theirs)
    );
    println!(
        "step time (CPU, f32, batch {b}, seq {s}): attn op {ours_ms:.2} ms, candle attention {theirs_ms:.2} ms, ratio {:.2}x",
        theirs_ms / ours_ms
    );
    Ok(())
}
