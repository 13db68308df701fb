//! `attn bench`: one JSON row per (dtype, head_dim, seq, mask) on one backend, in the format the
//! peer scripts in `bench/peers/` also write, so `bench/report.py` can set them side by side.

use attn::measure;
use attn::{Attention, Buffer, DType, Outputs, Problem, Shape};
use clap::Args;

#[derive(Args)]
pub struct BenchArgs {
    /// Backend name (default: the best available, or ATTN_BACKEND).
    #[arg(long)]
    backend: Option<String>,
    /// Element types, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16")]
    dtypes: Vec<DType>,
    /// Head dims, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64,128")]
    dims: Vec<usize>,
    /// Sequence lengths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096")]
    seqs: Vec<usize>,
    /// Masks to run: `none`, `causal` or both (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "none,causal")]
    masks: Vec<String>,
    /// Fixed batch size; with --tokens the batch is tokens / seq instead.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Tokens per call (batch = tokens / seq), the GPU grid's convention.
    #[arg(long)]
    tokens: Option<usize>,
    /// Fixed head count; with --model-dim the heads are model_dim / head_dim instead.
    #[arg(long, default_value_t = 16)]
    heads: usize,
    /// Model width (heads = model_dim / head_dim), the GPU grid's convention.
    #[arg(long)]
    model_dim: Option<usize>,
    /// CPU threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Untimed runs per shape.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Least wall-clock time of untimed runs per shape, milliseconds (on top of --warmup).
    #[arg(long, default_value_t = attn::measure::MIN_WARMUP.as_millis() as u64)]
    min_warmup_ms: u64,
    /// Timed runs per shape (median reported).
    #[arg(long, default_value_t = 7)]
    iters: usize,
    /// Rows per shape checked against the f64 reference.
    #[arg(long, default_value_t = 32)]
    check_rows: usize,
    /// Also write each shape's q, k, v and our o as .npy files (plus a JSON description) into
    /// this folder, for `bench/peers/accuracy_gpu.py` to score peers on the same inputs.
    #[arg(long)]
    dump: Option<std::path::PathBuf>,
    /// Soft-cap every row's scaled scores at ±CAP (`cap · tanh(s / cap)`).
    #[arg(long, value_name = "CAP")]
    softcap: Option<f32>,
    /// ALiBi biases on every row, with the standard slopes `2^(-8 (h + 1) / heads)`.
    #[arg(long)]
    alibi: bool,
}

pub fn run(args: BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(t) = args.threads {
        let _ = rayon::ThreadPoolBuilder::new().num_threads(t).build_global();
    }
    // One instance for the whole grid: a GPU backend opens its device and loads kernels once.
    let named = args.backend.as_deref().map(attn::Backend::by_name).transpose()?;
    for &dtype in &args.dtypes {
        for &d in &args.dims {
            for &seq in &args.seqs {
                for mask in &args.masks {
                    let batch = args.tokens.map_or(args.batch, |t| (t / seq).max(1));
                    let heads = args.model_dim.map_or(args.heads, |m| (m / d).max(1));
                    let mut problem = Problem::new(Shape::new(batch, heads, seq, d), dtype);
                    match mask.as_str() {
                        "none" => {}
                        "causal" => problem = problem.causal(),
                        other => return Err(format!("unknown mask `{other}`; use none or causal").into()),
                    }
                    let mut extras = attn::OwnedExtras::default();
                    if let Some(cap) = args.softcap {
                        problem = problem.with_softcap(cap);
                    }
                    if args.alibi {
                        problem = problem.with_alibi(attn::Alibi::PerHead);
                        extras.alibi_slopes = Some(attn::sequences::alibi_standard_slopes(heads));
                    }
                    let auto;
                    let backend: &dyn Attention = match &named {
                        Some(b) => b.as_ref(),
                        None => {
                            auto = attn::Backend::auto(&problem)?;
                            auto.as_ref()
                        }
                    };
                    let row = bench_one(backend, &problem, &extras, &args)?;
                    println!("{}", serde_json::to_string(&row)?);
                    eprintln!(
                        "{:>10} {:>5} d{:<3} s{:<6} {:<6} {:>9.3} ms {:>8.1} GFLOP/s  rel_l2 {:.2e}",
                        backend.name(),
                        dtype,
                        d,
                        seq,
                        mask,
                        row["median_ms"].as_f64().unwrap_or(0.0),
                        row["gflops"].as_f64().unwrap_or(0.0),
                        row["rel_l2"].as_f64().unwrap_or(f64::NAN)
                    );
                }
            }
        }
    }
    Ok(())
}

fn bench_one(
    backend: &dyn Attention,
    problem: &Problem,
    extras: &attn::OwnedExtras,
    args: &BenchArgs,
) -> attn::Result<serde_json::Value> {
    let plan = backend.plan(problem)?;
    measure::check_host_memory(problem)?;
    let bufs = measure::random_inputs(problem, 1);
    let inputs = || measure::inputs(&bufs).with_extras(extras.borrow());
    let mut o = Buffer::zeros(problem.dtype, problem.required_lens()[3].1);
    let mut outputs = Outputs { o: o.as_data_mut(), lse: None };
    outputs.poison();
    let t = measure::time(
        backend,
        &plan,
        inputs(),
        outputs,
        args.warmup,
        std::time::Duration::from_millis(args.min_warmup_ms),
        args.iters,
    )?;
    let acc = measure::accuracy(problem, &inputs(), &o, args.check_rows)?;
    if let Some(dir) = &args.dump {
        dump(dir, backend.name(), problem, &bufs, &o).map_err(|e| attn::Error::backend("dump", e))?;
    }
    let s = problem.shape;
    let threads = match &plan.execution {
        attn::Execution::Cpu { threads, .. } => Some(*threads),
        attn::Execution::Gpu(_) => None,
    };
    Ok(serde_json::json!({
        "impl": backend.name(),
        "kernel": plan.kernel,
        "dtype": problem.dtype.name(),
        "batch": s.batch, "heads": s.heads_q, "seq": s.seq_q, "head_dim": s.head_dim,
        "causal": problem.is_causal(),
        "softcap": problem.params.softcap,
        "alibi": problem.params.alibi.is_some(),
        "threads": threads,
        "median_ms": t.median_s * 1e3, "min_ms": t.min_s * 1e3, "max_ms": t.max_s * 1e3, "runs": t.runs,
        "each_ms": t.each_s.iter().map(|s| s * 1e3).collect::<Vec<_>>(),
        "gflops": problem.flops() / t.median_s / 1e9,
        "rel_l2": acc.rel_l2, "max_abs": acc.max_abs, "non_finite": acc.non_finite,
        "device_bytes": t.device_bytes,
    }))
}

/// Writes `<stem>.{q,k,v,o}.npy` and `<stem>.json` (shape, dtype, layout) into `dir`.
fn dump(
    dir: &std::path::Path,
    backend: &str,
    p: &Problem,
    bufs: &[Buffer; 3],
    o: &Buffer,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let s = p.shape;
    let stem =
        format!("{}_d{}_s{}_{}", p.dtype, s.head_dim, s.seq_q, if p.is_causal() { "causal" } else { "full" });
    for (name, buf) in [("q", &bufs[0]), ("k", &bufs[1]), ("v", &bufs[2]), ("o", o)] {
        attn::npy::write(&dir.join(format!("{stem}.{name}.npy")), buf)?;
    }
    let meta = serde_json::json!({
        "impl": backend, "dtype": p.dtype.name(), "layout": "bhsd", "causal": p.is_causal(),
        "batch": s.batch, "heads": s.heads_q, "seq": s.seq_q, "head_dim": s.head_dim, "scale": p.scale(),
    });
    std::fs::write(dir.join(format!("{stem}.json")), meta.to_string())
}
