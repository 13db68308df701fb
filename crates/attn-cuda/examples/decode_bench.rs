//! Decode timings on this GPU: for each row of a rows file (`batch heads_q heads_kv seq_q seq_k
//! head_dim` per line, `#` comments), bf16 BHSD tensors on the device, no mask, the plan's
//! kernel run through `Cuda::run_on_stream` on a caller's stream; each timed call (CUDA events
//! around it) behind an untimed twin, so that calls run back to back as in a decode loop; the
//! median of `iters` (default 50) after a 100 ms warm-up. One JSON object per row on stdout, with
//! the K/V bytes read per call over the time (GB/s) and the plan's split note.
//!
//! `cargo run --release -p attn-cuda --example decode_bench -- bench/device/decode-rows.txt [iters]`
//! (`bench/device/decode.sh` runs it beside PyTorch SDPA on the same rows).

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::{Buffer, DType, Problem, Shape};
use attn_cuda::{Cuda, driver};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Elements of random data uploaded once and copied across every tensor (values do not change
/// a decode kernel's time; generating gigabytes on the host would).
const BLOCK: usize = 1 << 24;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A device tensor of `n` elements, tiled with `block`.
fn tiled(stream: &Arc<CudaStream>, block: &CudaSlice<bf16>, n: usize) -> attn_core::Result<CudaSlice<bf16>> {
    let mut t = stream.alloc_zeros::<bf16>(n).map_err(driver("allocate a tensor"))?;
    let mut at = 0;
    while at < n {
        let len = (n - at).min(BLOCK);
        stream
            .memcpy_dtod(&block.slice(0..len), &mut t.slice_mut(at..at + len))
            .map_err(driver("fill a tensor"))?;
        at += len;
    }
    Ok(t)
}

fn main() -> attn_core::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: decode_bench <rows file> [iters]");
        std::process::exit(2);
    };
    let rows = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(50);
    if let Err(reason) = attn_cuda::probe() {
        eprintln!("decode_bench: CUDA is unavailable, because {reason}");
        std::process::exit(1);
    }
    let cuda = Cuda::from_env()?;
    let ctx = CudaContext::new(0).map_err(driver("cuCtxCreate"))?;
    let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
    let Buffer::Bf16(random) = normal_buffer(&mut SplitMix64::new(1), DType::Bf16, BLOCK, 1.0) else {
        unreachable!("bf16")
    };
    let block = stream.clone_htod(&random).map_err(driver("upload the random block"))?;
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    for line in rows.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let n: Vec<usize> = line.split_whitespace().map(|x| x.parse().expect("a number")).collect();
        let [batch, heads_q, heads_kv, seq_q, seq_k, head_dim] = n[..] else {
            panic!("row `{line}`: 6 numbers")
        };
        let shape = Shape { batch, heads_q, heads_kv, seq_q, seq_k, head_dim };
        let p = Problem::new(shape, DType::Bf16);
        let plan = cuda.plan_on(&ctx, &p)?;
        let lens = p.required_lens();
        let (q, k, v) = (
            tiled(&stream, &block, lens[0].1)?,
            tiled(&stream, &block, lens[1].1)?,
            tiled(&stream, &block, lens[2].1)?,
        );
        let mut o = stream.alloc_zeros::<bf16>(lens[3].1).map_err(driver("allocate o"))?;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(100) {
            cuda.run_on_stream(&plan, &q, &k, &v, &mut o, Default::default(), &stream)?;
            stream.synchronize().map_err(driver("sync"))?;
        }
        let mut times = vec![];
        for _ in 0..iters {
            cuda.run_on_stream(&plan, &q, &k, &v, &mut o, Default::default(), &stream)?;
            let a = stream.record_event(timed).map_err(driver("event"))?;
            cuda.run_on_stream(&plan, &q, &k, &v, &mut o, Default::default(), &stream)?;
            let b = stream.record_event(timed).map_err(driver("event"))?;
            b.synchronize().map_err(driver("the kernel"))?;
            times.push(f64::from(a.elapsed_ms(&b).map_err(driver("elapsed"))?) / 1e3);
        }
        let t = median(times);
        let kv_bytes = 2 * batch * heads_kv * seq_k * head_dim * 2;
        let split = plan.notes.iter().find(|n| n.contains("split(s)")).cloned().unwrap_or_default();
        println!(
            "{{\"batch\": {batch}, \"heads_q\": {heads_q}, \"heads_kv\": {heads_kv}, \"seq_q\": {seq_q}, \"seq_k\": {seq_k}, \
             \"head_dim\": {head_dim}, \"kernel\": \"{}\", \"us\": {:.2}, \"kv_gbps\": {:.1}, \"split\": {:?}}}",
            plan.kernel,
            t * 1e6,
            kv_bytes as f64 / t / 1e9,
            split
        );
    }
    Ok(())
}
