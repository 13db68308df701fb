//! Decode timings from a paged KV cache against dense K/V, on this GPU: for each row of a rows
//! file (`batch heads_q heads_kv seq_q seq_k head_dim layout` per line, `#` comments; layout
//! `bhsd` or `bshd` (dense), `used` (dense BSHD with every sequence's key count given as
//! `seqused_k`) or `pageN` (a cache of N-key pages, `[pages, N, heads_kv, D]`, handed out in a
//! shuffled order, every sequence using all `seq_k` keys)), bf16, no mask, run through the
//! host-copy path (`Attention::prepare`, inputs and index arrays copied to the device once);
//! each timed call (CUDA events around it) behind an untimed twin (`Prepared::run_timed`), the
//! median of `iters` (default 50) after a 100 ms warm-up. One JSON object per row on stdout,
//! with the K/V bytes read per call over the time (GB/s) and the plan's split note.
//!
//! `cargo run --release -p attn-cuda --example paged_bench -- bench/device/paged-rows.txt [iters]`
//! (`bench/device/paged.sh` runs it beside PyTorch SDPA on the dense rows).

use attn_core::rng::SplitMix64;
use attn_core::sequences::{Batching, KvRows, OwnedExtras};
use attn_core::{Attention, DType, Data, Inputs, Layout, Problem, Shape, Strides, TensorStrides};
use attn_cuda::Cuda;
use half::bf16;
use std::time::{Duration, Instant};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `n` values cycling through a block of random ones (values do not change a decode kernel's
/// time; generating gigabytes of distinct ones on the host would take long).
fn tiled(rng: &mut SplitMix64, n: usize) -> Vec<bf16> {
    let block: Vec<bf16> = (0..4099).map(|_| bf16::from_f64(rng.normal())).collect();
    block.iter().copied().cycle().take(n).collect()
}

/// The problem and index arrays of one row.
fn problem(shape: Shape, layout: &str, rng: &mut SplitMix64) -> (Problem, OwnedExtras) {
    let (hkv, d) = (shape.heads_kv, shape.head_dim);
    let bshd = Layout::Bshd.strides(shape.heads_q, shape.seq_q, d);
    let dense_bshd = Problem::new(shape, DType::Bf16).with_layout(Layout::Bshd);
    let all_used = || Some(vec![shape.seq_k as i32; shape.batch]);
    match layout {
        "bhsd" => (Problem::new(shape, DType::Bf16), OwnedExtras::default()),
        "bshd" => (dense_bshd, OwnedExtras::default()),
        "used" => (
            dense_bshd.with_batching(Batching { keys_used: true, ..Batching::default() }),
            OwnedExtras { seqused_k: all_used(), ..OwnedExtras::default() },
        ),
        page => {
            let page_size: usize = page
                .strip_prefix("page")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("layout `{layout}`: bhsd, bshd, used or pageN"));
            let pages_per_seq = shape.seq_k.div_ceil(page_size);
            let pages = shape.batch * pages_per_seq;
            let mut table: Vec<i32> = (0..pages as i32).collect();
            for i in (1..table.len()).rev() {
                table.swap(i, rng.below(i + 1));
            }
            let kv = Strides { batch: page_size * hkv * d, head: d, seq: hkv * d };
            let p = Problem::new(shape, DType::Bf16)
                .with_strides(TensorStrides { q: bshd, k: kv, v: kv, o: bshd })
                .with_batching(Batching {
                    kv: KvRows::Paged { page_size, pages, pages_per_seq },
                    keys_used: true,
                    ..Batching::default()
                });
            let extras =
                OwnedExtras { block_table: Some(table), seqused_k: all_used(), ..OwnedExtras::default() };
            (p, extras)
        }
    }
}

fn main() -> attn_core::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: paged_bench <rows file> [iters]");
        std::process::exit(2);
    };
    let rows = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(50);
    let cuda = Cuda::from_env()?;
    let mut rng = SplitMix64::new(1);
    for line in rows.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let n: Vec<usize> = f[..f.len().min(6)].iter().map(|x| x.parse().expect("a number")).collect();
        let (&[batch, heads_q, heads_kv, seq_q, seq_k, head_dim], Some(layout)) = (&n[..], f.get(6)) else {
            panic!("row `{line}`: 6 numbers and a layout")
        };
        let shape = Shape { batch, heads_q, heads_kv, seq_q, seq_k, head_dim };
        let (p, extras) = problem(shape, layout, &mut rng);
        let plan = cuda.plan(&p)?;
        let lens = p.required_lens();
        let (q, k, v) = (tiled(&mut rng, lens[0].1), tiled(&mut rng, lens[1].1), tiled(&mut rng, lens[2].1));
        let inputs = Inputs::new(Data::Bf16(&q), Data::Bf16(&k), Data::Bf16(&v)).with_extras(extras.borrow());
        let mut prepared = cuda.prepare(&plan, inputs)?;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(100) {
            prepared.run()?;
        }
        let times: Vec<f64> =
            (0..iters).map(|_| prepared.run_timed().map(|t| t.as_secs_f64())).collect::<Result<_, _>>()?;
        let t = median(times);
        let kv_bytes = 2 * batch * heads_kv * seq_k * head_dim * 2;
        let split = plan.notes.iter().find(|n| n.contains("split(s)")).cloned().unwrap_or_default();
        println!(
            "{{\"batch\": {batch}, \"heads_q\": {heads_q}, \"heads_kv\": {heads_kv}, \"seq_q\": {seq_q}, \"seq_k\": {seq_k}, \
             \"head_dim\": {head_dim}, \"layout\": \"{layout}\", \"kernel\": \"{}\", \"us\": {:.2}, \"kv_gbps\": {:.1}, \
             \"split\": {:?}}}",
            plan.kernel,
            t * 1e6,
            kv_bytes as f64 / t / 1e9,
            split
        );
    }
    Ok(())
}
