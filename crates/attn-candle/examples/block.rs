//! One transformer block with random weights (RMSNorm, q/k/v/o projections, RoPE, GQA with 32
//! query heads over 8 key/value heads of 128 dims, a SiLU-gated MLP), run twice on the same
//! input: with candle's own attention (repeat the key/value heads, q·kᵀ, causal mask, softmax in
//! f32, ·v) and with attn's op (`attn_candle::flash_attn`). Prints, per sequence length, the time
//! of a block and of its attention alone with each, and the largest difference between the two
//! blocks' outputs.
//!
//! `cargo run --release -p attn-candle --example block -- [--cuda] [--dtype bf16|f16|f32]
//!  [--seqs 1024,2048] [--batch 1] [--iters 5] [--mlp 14336]`
//! (CPU and f32 by default; `--cuda` needs the `cuda` feature.)

use candle_core::{D, DType, Device, Module, Result, Tensor};
use candle_nn::{Linear, RmsNorm};
use std::time::Instant;

const HEADS: usize = 32;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const HIDDEN: usize = HEADS * HEAD_DIM;

struct Block {
    norm1: RmsNorm,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    norm2: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

fn linear(input: usize, output: usize, dtype: DType, device: &Device) -> Result<Linear> {
    let w = (Tensor::randn(0f32, 1.0, (output, input), device)? / (input as f64).sqrt())?;
    Ok(Linear::new(w.to_dtype(dtype)?, None))
}

impl Block {
    fn new(mlp: usize, dtype: DType, device: &Device) -> Result<Block> {
        let norm = || Ok::<_, candle_core::Error>(RmsNorm::new(Tensor::ones(HIDDEN, dtype, device)?, 1e-5));
        Ok(Block {
            norm1: norm()?,
            wq: linear(HIDDEN, HEADS * HEAD_DIM, dtype, device)?,
            wk: linear(HIDDEN, KV_HEADS * HEAD_DIM, dtype, device)?,
            wv: linear(HIDDEN, KV_HEADS * HEAD_DIM, dtype, device)?,
            wo: linear(HEADS * HEAD_DIM, HIDDEN, dtype, device)?,
            norm2: norm()?,
            gate: linear(HIDDEN, mlp, dtype, device)?,
            up: linear(HIDDEN, mlp, dtype, device)?,
            down: linear(mlp, HIDDEN, dtype, device)?,
        })
    }

    /// q, k, v after the projections and RoPE, `[batch, seq, heads, head_dim]`.
    fn qkv(&self, x: &Tensor, rope: &(Tensor, Tensor)) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, s, _) = x.dims3()?;
        let h = self.norm1.forward(x)?;
        let q = self.wq.forward(&h)?.reshape((b, s, HEADS, HEAD_DIM))?;
        let k = self.wk.forward(&h)?.reshape((b, s, KV_HEADS, HEAD_DIM))?;
        let v = self.wv.forward(&h)?.reshape((b, s, KV_HEADS, HEAD_DIM))?;
        let q = candle_nn::rotary_emb::rope_thd(&q, &rope.0, &rope.1)?;
        let k = candle_nn::rotary_emb::rope_thd(&k, &rope.0, &rope.1)?;
        Ok((q, k, v))
    }

    /// The rest of the block after attention's output `a` (`[batch, seq, heads, head_dim]`).
    fn finish(&self, x: &Tensor, a: &Tensor) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let x = (x + self.wo.forward(&a.reshape((b, s, HIDDEN))?)?)?;
        let h = self.norm2.forward(&x)?;
        let m = (candle_nn::ops::silu(&self.gate.forward(&h)?)? * self.up.forward(&h)?)?;
        x + self.down.forward(&m)?
    }
}

/// The causal mask candle's attention adds to the scores, `[seq, seq]` (0 or -inf), built once
/// per sequence length on the device, as a model keeps it.
fn causal_mask(s: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> =
        (0..s).flat_map(|i| (0..s).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 })).collect();
    Tensor::from_vec(mask, (s, s), device)?.to_dtype(dtype)
}

/// candle's own causal attention, as a model written with candle computes it (`mask` from
/// [`causal_mask`]).
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (b, s, _, _) = q.dims4()?;
    let repeat = |t: &Tensor| -> Result<Tensor> {
        let t = t.transpose(1, 2)?; // [b, kv, s, d]
        t.unsqueeze(2)?.expand((b, KV_HEADS, HEADS / KV_HEADS, s, HEAD_DIM))?.reshape((b, HEADS, s, HEAD_DIM))
    };
    let q = q.transpose(1, 2)?.contiguous()?;
    let (k, v) = (repeat(k)?.contiguous()?, repeat(v)?.contiguous()?);
    let scores = (q.matmul(&k.t()?)? / (HEAD_DIM as f64).sqrt())?.broadcast_add(mask)?;
    let p = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?.to_dtype(q.dtype())?;
    p.matmul(&v)?.transpose(1, 2)
}

fn attn_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    attn_candle::flash_attn(q, k, v, 1.0 / (HEAD_DIM as f32).sqrt(), true)
}

/// RoPE's cos and sin tables, `[seq, head_dim / 2]`.
fn rope(s: usize, dtype: DType, device: &Device) -> Result<(Tensor, Tensor)> {
    let inv: Vec<f32> =
        (0..HEAD_DIM / 2).map(|i| 1.0 / 500000f32.powf(2.0 * i as f32 / HEAD_DIM as f32)).collect();
    let inv = Tensor::from_vec(inv, (1, HEAD_DIM / 2), device)?;
    let pos = Tensor::arange(0u32, s as u32, device)?.to_dtype(DType::F32)?.reshape((s, 1))?;
    let f = pos.broadcast_mul(&inv)?;
    Ok((f.cos()?.to_dtype(dtype)?, f.sin()?.to_dtype(dtype)?))
}

/// Median seconds of `iters` runs of `f` (after one untimed), synchronizing the device.
fn time(device: &Device, iters: usize, mut f: impl FnMut() -> Result<Tensor>) -> Result<(f64, Tensor)> {
    let mut out = f()?;
    device.synchronize()?;
    let mut times = vec![];
    for _ in 0..iters {
        let t = Instant::now();
        out = f()?;
        device.synchronize()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], out))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let device = if args.iter().any(|a| a == "--cuda") { Device::new_cuda(0)? } else { Device::Cpu };
    let dtype = match value("--dtype").as_deref() {
        Some("bf16") => DType::BF16,
        Some("f16") => DType::F16,
        Some("f32") | None => DType::F32,
        Some(other) => return Err(candle_core::Error::Msg(format!("--dtype {other}: bf16, f16 or f32"))),
    };
    let parse = |flag: &str, default: usize| value(flag).map_or(Ok(default), |v| v.parse::<usize>());
    let bad = |e: std::num::ParseIntError| candle_core::Error::Msg(format!("a number: {e}"));
    let (batch, iters, mlp) = (
        parse("--batch", 1).map_err(bad)?,
        parse("--iters", 5).map_err(bad)?,
        parse("--mlp", 14336).map_err(bad)?,
    );
    let seqs: Vec<usize> = value("--seqs")
        .unwrap_or_else(|| "256".into())
        .split(',')
        .map(|s| s.parse().map_err(bad))
        .collect::<Result<_>>()?;
    let block = Block::new(mlp, dtype, &device)?;
    println!(
        "device {device:?}, {dtype:?}, batch {batch}, {HEADS}/{KV_HEADS} heads of {HEAD_DIM}, MLP {mlp}"
    );
    for s in seqs {
        let x = Tensor::randn(0f32, 1.0, (batch, s, HIDDEN), &device)?.to_dtype(dtype)?;
        let rope = rope(s, dtype, &device)?;
        let (q, k, v) = block.qkv(&x, &rope)?;
        let mask = causal_mask(s, dtype, &device)?;
        let (t_candle_attn, a_candle) = time(&device, iters, || candle_attention(&q, &k, &v, &mask))?;
        let (t_attn_attn, a_attn) = time(&device, iters, || attn_attention(&q, &k, &v))?;
        let whole = |attention: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>| {
            let (q, k, v) = block.qkv(&x, &rope)?;
            block.finish(&x, &attention(&q, &k, &v)?)
        };
        let (t_candle, y_candle) =
            time(&device, iters, || whole(&|q, k, v| candle_attention(q, k, v, &mask)))?;
        let (t_attn, y_attn) = time(&device, iters, || whole(&attn_attention))?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
            (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
                .abs()?
                .flatten_all()?
                .max(D::Minus1)?
                .to_scalar::<f32>()
        };
        let scale =
            y_candle.to_dtype(DType::F32)?.abs()?.flatten_all()?.max(D::Minus1)?.to_scalar::<f32>()?;
        #[cfg(feature = "cuda")]
        if device.is_cuda() {
            op_overhead(&q, &k, &v, &device)?;
        }
        println!(
            "{{\"seq\": {s}, \"batch\": {batch}, \"dtype\": \"{dtype:?}\", \"block_ms_candle\": {:.3}, \"block_ms_attn\": {:.3}, \
             \"block_speedup\": {:.3}, \"attention_ms_candle\": {:.3}, \"attention_ms_attn\": {:.3}, \"attention_speedup\": {:.3}, \
             \"max_abs_diff_attention\": {:.3e}, \"max_abs_diff_block\": {:.3e}, \"max_abs_block\": {:.3e}}}",
            t_candle * 1e3,
            t_attn * 1e3,
            t_candle / t_attn,
            t_candle_attn * 1e3,
            t_attn_attn * 1e3,
            t_candle_attn / t_attn_attn,
            diff(&a_candle, &a_attn)?,
            diff(&y_candle, &y_attn)?,
            scale,
        );
    }
    Ok(())
}

/// The op against the bare kernel on these tensors, alternating launch by launch, 40 of each:
/// the kernel's time through attn-cuda's host-copy path (CUDA events, behind an untimed twin),
/// and the op's, between CUDA events on candle's stream around one call behind an untimed twin
/// call; and the host time of that call (median of 40, made while the twin's kernel runs, as in
/// a model's forward pass where nothing waits between layers).
#[cfg(feature = "cuda")]
fn op_overhead(q: &Tensor, k: &Tensor, v: &Tensor, device: &Device) -> Result<()> {
    use attn_core::Attention;
    use cudarc::driver::sys::CUevent_flags;
    let (b, s, _, _) = q.dims4()?;
    let dtype = match q.dtype() {
        DType::BF16 => attn_core::DType::Bf16,
        DType::F16 => attn_core::DType::F16,
        _ => return Ok(()),
    };
    let shape = attn_core::Shape {
        batch: b,
        heads_q: HEADS,
        heads_kv: KV_HEADS,
        seq_q: s,
        seq_k: s,
        head_dim: HEAD_DIM,
    };
    let p = attn_core::Problem::new(shape, dtype).with_layout(attn_core::Layout::Bshd).causal();
    let cuda = attn_cuda::Cuda::new();
    let plan = cuda.plan(&p).map_err(candle_core::Error::wrap)?;
    let host = |t: &Tensor| -> Result<attn_core::Buffer> {
        let v: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        Ok(attn_core::Buffer::from_f32(dtype, v))
    };
    let (hq, hk, hv) = (host(q)?, host(k)?, host(v)?);
    let inputs = attn_core::Inputs::new(hq.as_data(), hk.as_data(), hv.as_data());
    let mut prepared = cuda.prepare(&plan, inputs).map_err(candle_core::Error::wrap)?;
    let stream = device.as_cuda_device()?.cuda_stream();
    let event = |what| {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| candle_core::Error::Msg(format!("{what}: {e}")))
    };
    let (mut bare, mut op, mut host_us) = (vec![], vec![], vec![]);
    for _ in 0..40 {
        bare.push(prepared.run_timed().map_err(candle_core::Error::wrap)?.as_secs_f64());
        let _twin = attn_attention(q, k, v)?;
        let start = event("start")?;
        let t = Instant::now();
        let _timed = attn_attention(q, k, v)?;
        host_us.push(t.elapsed().as_secs_f64() * 1e6);
        let end = event("end")?;
        end.synchronize().map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        op.push(f64::from(start.elapsed_ms(&end).map_err(|e| candle_core::Error::Msg(e.to_string()))?) / 1e3);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (bare, op) = (median(bare), median(op));
    println!(
        "{{\"seq\": {s}, \"kernel\": \"{}\", \"bare_kernel_ms\": {:.4}, \"op_ms\": {:.4}, \"op_over_bare\": {:.4}, \"op_host_us_per_call\": {:.2}}}",
        plan.kernel,
        bare * 1e3,
        op * 1e3,
        op / bare,
        median(host_us)
    );
    Ok(())
}
