//! Whether a head dim's row alignment costs time: the padded head dims that miss issue 33's 0.9
//! target are all D ≡ 8 (mod 16), whose packed rows (D × 2 bytes) start on 16-byte but not
//! 32-byte boundaries every other row. For each head dim given (default 72 88 104 120 136 232
//! 248), bf16, S = 4096, batch 4, heads ⌊2048/D⌋, causal and not, this times the problem with
//! packed BHSD rows (row stride D) and in views whose rows are padded to a multiple of 16
//! elements (32-byte aligned; same kernel, the padding unread), through `Cuda::run_on_stream`:
//! CUDA-event medians of `ITERS` (default 20) calls, each behind an untimed twin, the two
//! layouts in alternating rounds (`ROUNDS`, default 3). One JSON object per (head dim, mask).
//!
//! `cargo run --release -p attn-cuda --example row_align -- [D ...]` (on the GPU machine: the
//! bundle's binary; no rows file).

use attn_core::{DType, Mask, Problem, Shape, Strides, TensorStrides};
use attn_cuda::{Cuda, driver};
use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUevent_flags;
use half::bf16;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The problem with BHSD rows `row` elements apart (`row` ≥ D).
fn with_rows(shape: Shape, mask: Mask, row: usize) -> Problem {
    let bhsd = |heads: usize, seq: usize| Strides { batch: heads * seq * row, head: seq * row, seq: row };
    let mut p = Problem::new(shape, DType::Bf16).with_mask(mask);
    let (q, kv) = (bhsd(shape.heads_q, shape.seq_q), bhsd(shape.heads_kv, shape.seq_k));
    p.strides = TensorStrides { q, k: kv, v: kv, o: q };
    p
}

fn main() -> attn_core::Result<()> {
    let env =
        |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (iters, rounds) = (env("ITERS", 20), env("ROUNDS", 3));
    let dims: Vec<usize> =
        match std::env::args().skip(1).map(|a| a.parse().expect("a head dim")).collect::<Vec<_>>() {
            d if d.is_empty() => vec![72, 88, 104, 120, 136, 232, 248],
            d => d,
        };
    if let Err(reason) = attn_cuda::probe() {
        eprintln!("row_align: CUDA is unavailable, because {reason}");
        std::process::exit(1);
    }
    let cuda = Cuda::from_env()?;
    let ctx = CudaContext::new(0).map_err(driver("cuCtxCreate"))?;
    let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    for d in dims {
        let seq = 4096;
        let heads = 2048 / d;
        let shape = Shape { batch: 4, heads_q: heads, heads_kv: heads, seq_q: seq, seq_k: seq, head_dim: d };
        for mask in [Mask::None, Mask::Causal] {
            let layouts = [
                ("packed", with_rows(shape, mask, d)),
                ("aligned", with_rows(shape, mask, d.next_multiple_of(16))),
            ];
            let mut times = [vec![], vec![]];
            let mut kernel = String::new();
            for round in 0..rounds {
                for pick in [round % 2, 1 - round % 2] {
                    let p = &layouts[pick].1;
                    let plan = cuda.plan_on(&ctx, p)?;
                    kernel = plan.kernel.clone();
                    let lens = p.required_lens();
                    let alloc = |n| stream.alloc_zeros::<bf16>(n).map_err(driver("allocate a tensor"));
                    let (q, k, v, mut o) =
                        (alloc(lens[0].1)?, alloc(lens[1].1)?, alloc(lens[2].1)?, alloc(lens[3].1)?);
                    let mut each = vec![];
                    for i in 0..iters + 3 {
                        cuda.run_on_stream(&plan, &q, &k, &v, &mut o, Default::default(), &stream)?;
                        let a = stream.record_event(timed).map_err(driver("event"))?;
                        cuda.run_on_stream(&plan, &q, &k, &v, &mut o, Default::default(), &stream)?;
                        let b = stream.record_event(timed).map_err(driver("event"))?;
                        b.synchronize().map_err(driver("the kernel"))?;
                        if i >= 3 {
                            each.push(f64::from(a.elapsed_ms(&b).map_err(driver("elapsed"))?));
                        }
                    }
                    times[pick].push(median(each));
                }
            }
            let (packed, aligned) = (median(times[0].clone()), median(times[1].clone()));
            println!(
                "{{\"head_dim\": {d}, \"mask\": \"{}\", \"kernel\": \"{kernel}\", \"packed_ms\": {:?}, \"aligned_ms\": {:?}, \
                 \"packed_over_aligned\": {:.3}}}",
                if mask == Mask::None { "none" } else { "causal" },
                times[0],
                times[1],
                packed / aligned
            );
        }
    }
    Ok(())
}
