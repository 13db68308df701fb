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
//! `cargo run --release -p attn-candle --example train -- [steps] [batch] [seq] [--cuda]`: on the
//! CPU (300 steps, batch 16, sequences of 64, model width 64, 4 heads of 16) the model and its
//! attention run in f32 and the rounding baseline in f64; with `--cuda` (the `cuda` feature; 200
//! steps, batch 4, sequences of 1024, width 512, 8 heads of 64) the weights stay f32, q, k and v
//! go to bf16 for the attention (both runs), and the baseline's attention runs in f32.

use attn_core::rng::SplitMix64;
use candle_core::{D, DType, Device, Result, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use std::time::Instant;

const VOCAB: usize = 32;
const LAYERS: usize = 2;

/// The model's sizes and where it runs.
#[derive(Clone)]
struct Config {
    model: usize,
    heads: usize,
    device: Device,
    /// The attention's dtype (both runs), and the baseline's.
    attn: DType,
    precise: DType,
}

impl Config {
    fn head_dim(&self) -> usize {
        self.model / self.heads
    }
}

/// Which attention a run uses.
#[derive(Clone, Copy)]
enum Attn {
    /// attn's op.
    Op,
    /// candle's own.
    Candle,
    /// candle's own at a higher precision: how far two trainings drift apart from rounding alone.
    Precise,
}

/// Every weight, as candle `Var`s.
struct Model {
    embed: Var,
    /// Per layer: wq, wk, wv, wo (model × model), w1 (model × 4 model), w2 (4 model × model).
    layers: Vec<[Var; 6]>,
    out: Var,
}

impl Model {
    /// Weights drawn from N(0, 1/fan_in) by `seed`: the same values for both runs.
    fn new(seed: u64, c: &Config) -> Result<Model> {
        let (dev, model, mlp) = (&c.device, c.model, 4 * c.model);
        let mut rng = SplitMix64::new(seed);
        let mut var = |rows: usize, cols: usize| {
            let sd = 1.0 / (rows as f64).sqrt();
            let values: Vec<f32> = (0..rows * cols).map(|_| (rng.normal() * sd) as f32).collect();
            Var::from_tensor(&Tensor::from_vec(values, (rows, cols), dev)?)
        };
        let embed = var(VOCAB, model)?;
        let mut layers = vec![];
        for _ in 0..LAYERS {
            layers.push([
                var(model, model)?,
                var(model, model)?,
                var(model, model)?,
                var(model, model)?,
                var(model, mlp)?,
                var(mlp, model)?,
            ]);
        }
        let out = var(model, VOCAB)?;
        Ok(Model { embed, layers, out })
    }

    fn vars(&self) -> Vec<Var> {
        let mut v = vec![self.embed.clone(), self.out.clone()];
        v.extend(self.layers.iter().flatten().cloned());
        v
    }

    /// Logits `[batch, seq, VOCAB]` for tokens `[batch, seq]`.
    fn forward(&self, tokens: &Tensor, with_attn: Attn, c: &Config) -> Result<Tensor> {
        let (b, s) = tokens.dims2()?;
        let (heads, hd) = (c.heads, c.head_dim());
        let mut x = self.embed.as_tensor().embedding(&tokens.flatten_all()?)?.reshape((b, s, c.model))?;
        for [wq, wk, wv, wo, w1, w2] in &self.layers {
            let h = rms_norm(&x)?;
            let proj = |w: &Var| h.broadcast_matmul(w.as_tensor())?.reshape((b, s, heads, hd));
            let (q, k, v) = (proj(wq)?, proj(wk)?, proj(wv)?);
            let scale = 1.0 / (hd as f32).sqrt();
            let a = match with_attn {
                Attn::Op => {
                    let t = |x: &Tensor| x.to_dtype(c.attn);
                    attn_candle::flash_attn(&t(&q)?, &t(&k)?, &t(&v)?, scale, true)?
                }
                Attn::Candle => candle_attention(&q, &k, &v, scale, c.attn)?,
                // The same function at a higher precision: other roundings only.
                Attn::Precise => candle_attention(&q, &k, &v, scale, c.precise)?,
            };
            let a = a.to_dtype(DType::F32)?.reshape((b, s, c.model))?;
            x = (x + a.broadcast_matmul(wo.as_tensor())?)?;
            let h = rms_norm(&x)?;
            x = (x + h.broadcast_matmul(w1.as_tensor())?.relu()?.broadcast_matmul(w2.as_tensor())?)?;
        }
        rms_norm(&x)?.broadcast_matmul(self.out.as_tensor())
    }
}

fn rms_norm(x: &Tensor) -> Result<Tensor> {
    x.broadcast_div(&(x.sqr()?.mean_keepdim(D::Minus1)? + 1e-5)?.sqrt()?)
}

/// candle's own causal attention on `[batch, seq, heads, head_dim]` tensors: q, k, v in `dtype`,
/// the softmax in f32 or wider.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, dtype: DType) -> Result<Tensor> {
    let s = q.dim(1)?;
    let t = |x: &Tensor| x.to_dtype(dtype)?.transpose(1, 2)?.contiguous();
    let (q, k, v) = (t(q)?, t(k)?, t(v)?);
    let soft = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let mask: Vec<f32> =
        (0..s).flat_map(|i| (0..s).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 })).collect();
    let mask = Tensor::from_vec(mask, (s, s), q.device())?.to_dtype(soft)?;
    let scores = (q.matmul(&k.t()?)?.to_dtype(soft)? * scale as f64)?.broadcast_add(&mask)?;
    candle_nn::ops::softmax(&scores, D::Minus1)?.to_dtype(dtype)?.matmul(&v)?.transpose(1, 2)
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
fn train(with_attn: Attn, steps: usize, b: usize, s: usize, c: &Config) -> Result<(Vec<f32>, f64)> {
    let dev = &c.device;
    let model = Model::new(1, c)?;
    let mut opt =
        AdamW::new(model.vars(), ParamsAdamW { lr: 3e-3, weight_decay: 0.0, ..Default::default() })?;
    let (mut losses, mut ms) = (vec![], vec![]);
    for step in 0..steps {
        let (x, y) = batch(1000 + step as u64, b, s, dev)?;
        let t = Instant::now();
        let logits = model.forward(&x, with_attn, c)?;
        let loss = candle_nn::loss::cross_entropy(&logits.reshape((b * s, VOCAB))?, &y.flatten_all()?)?;
        opt.backward_step(&loss)?;
        // Reading the loss back waits for the step's work (on CUDA too).
        losses.push(loss.to_scalar::<f32>()?);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let timed = &ms[5.min(ms.len() - 1)..];
    Ok((losses, timed.iter().sum::<f64>() / timed.len() as f64))
}

fn main() -> Result<()> {
    let cuda = std::env::args().any(|a| a == "--cuda");
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (config, defaults) = match cuda {
        false => (
            Config { model: 64, heads: 4, device: Device::Cpu, attn: DType::F32, precise: DType::F64 },
            (300, 16, 64),
        ),
        true => (
            Config {
                model: 512,
                heads: 8,
                device: Device::new_cuda(0)?,
                attn: DType::BF16,
                precise: DType::F32,
            },
            (200, 4, 1024),
        ),
    };
    let steps = args.first().copied().unwrap_or(defaults.0);
    let b = args.get(1).copied().unwrap_or(defaults.1);
    let s = args.get(2).copied().unwrap_or(defaults.2);
    let c = &config;
    let (ours, ours_ms) = train(Attn::Op, steps, b, s, c)?;
    let (theirs, theirs_ms) = train(Attn::Candle, steps, b, s, c)?;
    let (floor, _) = train(Attn::Precise, steps, b, s, c)?;
    println!("step  loss (attn op)  loss (candle attention)  loss (candle, {:?} attention)", c.precise);
    for i in (0..steps).step_by(25).chain([steps - 1]) {
        println!("{i:>4}  {:>14.5}  {:>23.5}  {:>28.5}", ours[i], theirs[i], floor[i]);
    }
    let diff = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(a, c)| ((a - c) / c).abs()).fold(0f32, f32::max);
    println!(
        "largest relative difference of the loss curves: attn op vs candle {:.2e}; candle vs candle with its \
         attention in {:?} (rounding alone) {:.2e}",
        diff(&ours, &theirs),
        c.precise,
        diff(&floor, &theirs)
    );
    println!(
        "step time ({}, attention in {:?}, batch {b}, seq {s}, width {}): attn op {ours_ms:.2} ms, candle attention \
         {theirs_ms:.2} ms, ratio {:.2}x",
        if cuda { "CUDA" } else { "CPU" },
        c.attn,
        c.model,
        theirs_ms / ours_ms
    );
    Ok(())
}
