//! `attn bench`: one JSON row per (dtype, head_dim, seq, mask) on one backend, in the format the
//! peer scripts in `bench/peers/` also write, so `bench/report.py` can set them side by side.

use crate::cli::{into_sequences, parse_window, varlen_lengths};
use crate::numbers::{count, count_or_zero, threads};
use attn::measure;
use attn::sequences::KeyStore;
use attn::{Attention, Buffer, DType, Mask, Outputs, OwnedExtras, Problem, Shape};
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
    #[arg(long, value_delimiter = ',', default_value = "64,128", value_parser = count)]
    dims: Vec<usize>,
    /// Sequence lengths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096", value_parser = count)]
    seqs: Vec<usize>,
    /// Masks to run, comma-separated: `none`, `causal`, `window` (the --window bounds).
    /// Default: `none,causal`, or `window` where --window is given.
    #[arg(long, value_delimiter = ',')]
    masks: Option<Vec<String>>,
    /// The `window` mask's bounds `LEFT,RIGHT`, -1 unbounded (as `attn run --window`).
    #[arg(long, value_name = "LEFT,RIGHT", allow_hyphen_values = true)]
    window: Option<String>,
    /// Each row's batch as packed sequences of seeded random lengths in MIN..=seq (as `attn run
    /// --varlen`); the row's FLOPs are counted per sequence.
    #[arg(long, value_name = "MIN", value_parser = count)]
    varlen: Option<usize>,
    /// Fixed batch size; with --tokens the batch is tokens / seq instead.
    #[arg(long, default_value_t = 1, value_parser = count)]
    batch: usize,
    /// Tokens per call (batch = tokens / seq), the GPU grid's convention.
    #[arg(long, value_parser = count)]
    tokens: Option<usize>,
    /// Fixed head count; with --model-dim the heads are model_dim / head_dim instead.
    #[arg(long, default_value_t = 16, value_parser = count)]
    heads: usize,
    /// Model width (heads = model_dim / head_dim), the GPU grid's convention.
    #[arg(long, value_parser = count)]
    model_dim: Option<usize>,
    /// Key/value heads (GQA); default: as many as query heads.
    #[arg(long, value_parser = count)]
    kv_heads: Option<usize>,
    /// CPU threads, 1 to 1024.
    #[arg(long, value_parser = threads)]
    threads: Option<usize>,
    /// Untimed runs per shape.
    #[arg(long, default_value_t = 2, value_parser = count_or_zero)]
    warmup: usize,
    /// Least wall-clock time of untimed runs per shape, milliseconds (on top of --warmup).
    #[arg(long, default_value_t = attn::measure::MIN_WARMUP.as_millis() as u64)]
    min_warmup_ms: u64,
    /// Timed runs per shape (median reported).
    #[arg(long, default_value_t = 7, value_parser = count)]
    iters: usize,
    /// Rows per shape checked against the f64 reference.
    #[arg(long, default_value_t = 32, value_parser = count_or_zero)]
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
    /// Time the backward pass (dQ, dK, dV from a random dO, O and the LSE of the backend's own
    /// forward) instead of the forward: each call's wall clock through host memory, uploads and
    /// read-back included; FLOPs 2.5 times the forward's. Timing only: `attn verify --grad`
    /// checks the gradients.
    #[arg(long)]
    backward: bool,
}

pub fn run(args: BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(t) = args.threads {
        let _ = rayon::ThreadPoolBuilder::new().num_threads(t).build_global();
    }
    let masks = args.masks()?;
    if args.dump.is_some() && (args.varlen.is_some() || args.window.is_some() || args.kv_heads.is_some()) {
        return Err("--dump writes dense BHSD rows with a plain or causal mask and as many K/V heads as \
                    query heads: not with --varlen, --window or --kv-heads"
            .into());
    }
    if args.backward && args.dump.is_some() {
        return Err("--dump writes the forward's inputs and output: not with --backward".into());
    }
    // One instance for the whole grid: a GPU backend opens its device and loads kernels once.
    let named = args.backend.as_deref().map(attn::Backend::by_name).transpose()?;
    for &dtype in &args.dtypes {
        for &d in &args.dims {
            for &seq in &args.seqs {
                for &(name, mask) in &masks {
                    let row = args.row(dtype, d, seq, mask)?;
                    let auto;
                    let backend: &dyn Attention = match &named {
                        Some(b) => b.as_ref(),
                        None => {
                            auto = attn::Backend::auto(&row.problem)?;
                            auto.as_ref()
                        }
                    };
                    let json = match args.backward {
                        true => bench_backward(backend, &row, name, &args)?,
                        false => bench_one(backend, &row, name, &args)?,
                    };
                    println!("{}", serde_json::to_string(&json)?);
                    let checked = match json["rel_l2"].as_f64() {
                        Some(e) => format!("rel_l2 {e:.2e}"),
                        None => "backward".into(),
                    };
                    eprintln!(
                        "{:>10} {:>5} d{:<3} s{:<6} {:<6} {:>9.3} ms {:>8.1} GFLOP/s  {checked}",
                        backend.name(),
                        dtype,
                        d,
                        seq,
                        name,
                        json["median_ms"].as_f64().unwrap_or(0.0),
                        json["gflops"].as_f64().unwrap_or(0.0),
                    );
                }
            }
        }
    }
    Ok(())
}

/// One row of the grid: its problem and inputs' extras, and each sequence's lengths.
struct Row {
    problem: Problem,
    extras: OwnedExtras,
    q_lens: Vec<usize>,
    k_lens: Vec<usize>,
}

impl BenchArgs {
    /// The masks to run, each with its name: --masks, checked against --window.
    fn masks(&self) -> attn::Result<Vec<(&'static str, Mask)>> {
        let window = self.window.as_deref().map(parse_window).transpose()?;
        let names = match (&self.masks, window) {
            (Some(names), _) => names.iter().map(String::as_str).collect(),
            (None, Some(_)) => vec!["window"],
            (None, None) => vec!["none", "causal"],
        };
        let masks = names
            .into_iter()
            .map(|name| match (name, window) {
                ("none", _) => Ok(("none", Mask::None)),
                ("causal", _) => Ok(("causal", Mask::Causal)),
                ("window", Some((left, right))) => Ok(("window", Mask::Window { left, right })),
                ("window", None) => Err(attn::Error::InvalidParameter {
                    what: "--masks window needs --window LEFT,RIGHT".into(),
                }),
                (other, _) => Err(attn::Error::InvalidParameter {
                    what: format!("--masks {other}: use none, causal or window"),
                }),
            })
            .collect::<attn::Result<Vec<_>>>()?;
        if window.is_some() && !masks.iter().any(|(name, _)| *name == "window") {
            return Err(attn::Error::InvalidParameter {
                what: "--window is given but --masks has no `window`".into(),
            });
        }
        Ok(masks)
    }

    /// The row of (dtype, head dim, seq, mask): batch and heads by --tokens/--batch and
    /// --model-dim/--heads, --softcap and --alibi on it, and with --varlen its batch as packed
    /// sequences of drawn lengths (seq the longest a sequence may be).
    fn row(&self, dtype: DType, d: usize, seq: usize, mask: Mask) -> attn::Result<Row> {
        // The conventions' quotients, never rounded up to 1 behind the user's back.
        let per = |total: Option<usize>, each: usize, flag: &str, unit: &str, what: &str| match total {
            Some(t) if t < each => Err(attn::Error::InvalidParameter {
                what: format!(
                    "{flag} {t} is less than one {unit} of {each}: a row's {what} is {flag} / {each}"
                ),
            }),
            Some(t) => Ok(Some(t / each)),
            None => Ok(None),
        };
        let batch = per(self.tokens, seq, "--tokens", "sequence", "batch")?.unwrap_or(self.batch);
        let heads = per(self.model_dim, d, "--model-dim", "head", "head count")?.unwrap_or(self.heads);
        let shape = Shape { heads_kv: self.kv_heads.unwrap_or(heads), ..Shape::new(batch, heads, seq, d) };
        let mut problem = Problem::new(shape, dtype).with_mask(mask);
        let mut extras = OwnedExtras::default();
        let (q_lens, k_lens) = match self.varlen {
            Some(min) => varlen_lengths(batch, seq, seq, min)?,
            None => (vec![seq; batch], vec![seq; batch]),
        };
        if self.varlen.is_some() {
            (problem, extras) = into_sequences(problem, &q_lens, &k_lens, KeyStore::Packed);
        }
        if let Some(cap) = self.softcap {
            problem = problem.with_softcap(cap);
        }
        if self.alibi {
            problem = problem.with_alibi(attn::Alibi::PerHead);
            extras.alibi_slopes = Some(attn::sequences::alibi_standard_slopes(heads));
        }
        problem.validate()?;
        problem.check_extras(&extras.borrow())?;
        Ok(Row { problem, extras, q_lens, k_lens })
    }
}

/// Useful floating-point operations of `problem` with sequences of these (queries, keys), by
/// FlashAttention's convention applied to each sequence on its own ([`Problem::flops`] of a
/// one-sequence problem of its lengths and the same mask: `4·H·Sq·Sk·D`, halved where causal and
/// square, the causal diagonal bottom-right on the sequence's own lengths), summed.
fn sequence_flops(problem: &Problem, q_lens: &[usize], k_lens: &[usize]) -> f64 {
    q_lens
        .iter()
        .zip(k_lens)
        .map(|(&seq_q, &seq_k)| {
            let shape = Shape { batch: 1, seq_q, seq_k, ..problem.shape };
            Problem::new(shape, problem.dtype).with_mask(problem.params.mask).flops()
        })
        .sum()
}

fn bench_one(
    backend: &dyn Attention,
    row: &Row,
    mask: &str,
    args: &BenchArgs,
) -> attn::Result<serde_json::Value> {
    let (problem, extras) = (&row.problem, &row.extras);
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
    let threads = match &plan.execution {
        attn::Execution::Cpu { threads, .. } => Some(*threads),
        attn::Execution::Gpu(_) => None,
    };
    let flops = sequence_flops(problem, &row.q_lens, &row.k_lens);
    let mut json = row_json(backend, &plan, row, mask, args, flops, &t);
    json.extend(fields(serde_json::json!({
        "threads": threads,
        "rel_l2": acc.rel_l2, "max_abs": acc.max_abs, "non_finite": acc.non_finite,
        "device_bytes": t.device_bytes,
    })));
    Ok(json.into())
}

/// What every row says: the backend, its kernel, the problem, its FLOPs and the timing.
fn row_json(
    backend: &dyn Attention,
    plan: &attn::Plan,
    row: &Row,
    mask: &str,
    args: &BenchArgs,
    flops: f64,
    t: &measure::Timing,
) -> serde_json::Map<String, serde_json::Value> {
    let problem = &row.problem;
    let s = problem.shape;
    let window = match problem.params.mask {
        Mask::Window { left, right } => Some([left, right]),
        _ => None,
    };
    fields(serde_json::json!({
        "impl": backend.name(),
        "kernel": plan.kernel,
        "dtype": problem.dtype.name(),
        "batch": s.batch, "heads": s.heads_q, "kv_heads": s.heads_kv, "seq": s.seq_q, "head_dim": s.head_dim,
        "causal": problem.is_causal(),
        "mask": mask,
        "window": window,
        "varlen_min": args.varlen,
        "tokens": row.q_lens.iter().sum::<usize>(),
        "seq_lens": args.varlen.map(|_| &row.q_lens),
        "flops": flops,
        "softcap": problem.params.softcap,
        "alibi": problem.params.alibi.is_some(),
        "median_ms": t.median_s * 1e3, "min_ms": t.min_s * 1e3, "max_ms": t.max_s * 1e3, "runs": t.runs,
        "each_ms": t.each_s.iter().map(|s| s * 1e3).collect::<Vec<_>>(),
        "gflops": flops / t.median_s / 1e9,
    }))
}

/// The fields of a JSON object (`json!({...})` always makes one).
fn fields(object: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match object {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

/// One row of `--backward`: the backend's forward gives O and the LSE, then its backward is timed.
fn bench_backward(
    backend: &dyn Attention,
    row: &Row,
    mask: &str,
    args: &BenchArgs,
) -> attn::Result<serde_json::Value> {
    let (problem, extras) = (&row.problem, &row.extras);
    let options = attn::BackwardOptions::default();
    measure::check_host_memory_backward(problem)?;
    let plan = backend.plan_backward(problem, options)?;
    let bufs = measure::random_inputs(problem, 1);
    let inputs = measure::inputs(&bufs).with_extras(extras.borrow());
    let lens = problem.required_lens();
    let mut o = Buffer::zeros(problem.dtype, lens[3].1);
    let mut lse = vec![0f32; problem.lse_len()];
    backend.forward(&problem.with_lse(true), inputs, Outputs { o: o.as_data_mut(), lse: Some(&mut lse) })?;
    let d_o = attn::rng::normal_buffer(&mut attn::rng::SplitMix64::new(2), problem.dtype, lens[3].1, 1.0);
    let grad_inputs = attn::GradInputs { inputs, o: o.as_data(), lse: &lse, d_o: d_o.as_data() };
    let mut grads = [0, 1, 2].map(|t| Buffer::zeros(problem.dtype, lens[t].1));
    let t = measure::time_backward(
        backend,
        &plan,
        grad_inputs,
        &mut grads,
        args.warmup,
        std::time::Duration::from_millis(args.min_warmup_ms),
        args.iters,
    )?;
    let flops = 2.5 * sequence_flops(problem, &row.q_lens, &row.k_lens);
    let mut json = row_json(backend, &plan, row, mask, args, flops, &t);
    json.extend(fields(serde_json::json!({
        "pass": "backward",
        "timing": "wall clock of each host-memory call (uploads and read-back included)",
    })));
    Ok(json.into())
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(flags: &str) -> BenchArgs {
        Cmd::try_parse_from(format!("bench {flags}").split_whitespace()).expect("flags parse").bench
    }

    #[test]
    fn window_and_masks_flags_parse_and_check_each_other() {
        let names = |flags: &str| args(flags).masks().map(|m| m.iter().map(|(n, _)| *n).collect::<Vec<_>>());
        assert_eq!(names("").unwrap(), ["none", "causal"]);
        assert_eq!(
            args("--window 4096,0").masks().unwrap(),
            [("window", Mask::Window { left: Some(4096), right: Some(0) })]
        );
        assert_eq!(
            args("--window -1,8 --masks causal,window").masks().unwrap()[1].1,
            Mask::Window { left: None, right: Some(8) }
        );
        for (flags, says) in [
            ("--masks window", "needs --window"),
            ("--window 4,0 --masks causal", "has no `window`"),
            ("--masks sliding", "use none, causal or window"),
            ("--window 4", "LEFT,RIGHT"),
        ] {
            let err = names(flags).unwrap_err().to_string();
            assert!(err.contains(says), "{flags}: {err}");
        }
    }

    #[test]
    fn varlen_rows_are_packed_sequences_of_seeded_lengths() {
        let a = args("--varlen 128 --batch 64 --heads 32 --kv-heads 8");
        let row = a.row(DType::Bf16, 128, 4096, Mask::Causal).unwrap();
        assert_eq!(row.q_lens.len(), 64);
        assert!(row.q_lens.iter().all(|n| (128..=4096).contains(n)) && row.q_lens == row.k_lens);
        assert!(row.q_lens.iter().any(|&n| n != row.q_lens[0]), "lengths drawn, not all equal");
        let total: usize = row.q_lens.iter().sum();
        assert!(matches!(row.problem.batching.q, attn::QueryRows::Packed { total: t } if t == total));
        assert_eq!((row.problem.shape.heads_q, row.problem.shape.heads_kv), (32, 8));
        let map = row.problem.seq_map(row.extras.borrow()).unwrap();
        assert!((0..64).all(|b| map.q_len(b) == row.q_lens[b]));
        // The same flags draw the same lengths; a dense row keeps its batch.
        assert_eq!(a.row(DType::Bf16, 128, 4096, Mask::None).unwrap().q_lens, row.q_lens);
        let dense = args("--tokens 16384").row(DType::Bf16, 64, 4096, Mask::None).unwrap();
        assert!(dense.problem.batching.is_dense() && dense.q_lens == [4096; 4]);
        let err = args("--varlen 5000").row(DType::Bf16, 64, 4096, Mask::None).err().unwrap().to_string();
        assert!(err.contains("--varlen 5000"), "{err}");
    }

    #[test]
    fn the_conventions_quotients_are_never_rounded_up() {
        let row = |flags: &str, d, seq| args(flags).row(DType::Bf16, d, seq, Mask::None);
        let err = row("--tokens 100", 64, 512).err().unwrap().to_string();
        assert!(err.contains("--tokens 100 is less than one sequence of 512"), "{err}");
        let err = row("--model-dim 32", 64, 512).err().unwrap().to_string();
        assert!(err.contains("--model-dim 32 is less than one head of 64"), "{err}");
        let ok = row("--tokens 1024 --model-dim 256", 64, 512).unwrap();
        assert_eq!((ok.problem.shape.batch, ok.problem.shape.heads_q), (2, 4));
    }

    #[test]
    fn sequence_flops_follow_the_convention_per_sequence() {
        let p = |mask| Problem::new(Shape::new(2, 3, 4, 8), DType::Bf16).with_mask(mask);
        let per_pair = 4.0 * 3.0 * 8.0;
        // Square causal sequences: each halved on its own lengths, 2²/2 + 4²/2 pairs.
        assert_eq!(sequence_flops(&p(Mask::Causal), &[2, 4], &[2, 4]), per_pair * (2.0 + 8.0));
        assert_eq!(sequence_flops(&p(Mask::None), &[2, 4], &[2, 4]), per_pair * (4.0 + 16.0));
        // Fewer queries than keys, causal bottom-right: row i of 2 sees 3 + i of 4 keys.
        assert_eq!(sequence_flops(&p(Mask::Causal), &[2], &[4]), per_pair * (3.0 + 4.0));
        // A window (1, 0) of 4 rows sees 1 + 2 + 2 + 2 keys.
        let window = Mask::Window { left: Some(1), right: Some(0) };
        assert_eq!(sequence_flops(&p(window), &[4], &[4]), per_pair * 7.0);
        // Equal lengths: the dense problem's own count.
        assert_eq!(sequence_flops(&p(Mask::Causal), &[4, 4], &[4, 4]), p(Mask::Causal).flops());
    }
}
