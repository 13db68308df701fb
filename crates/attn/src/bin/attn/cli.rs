//! Command-line arguments and the subcommands that use them.

use crate::numbers::{count, count_or_zero, threads};
use crate::report::RunReport;
use crate::{bench, report, verify};
use attn::measure;
use attn::sequences::{KeyStore, alibi_standard_slopes, batch_of};
use attn::{Alibi, Attention, Backend, Buffer, DType, Layout, Outputs, OwnedExtras, Problem, Shape};
use clap::{Args, Parser, Subcommand};

/// Exact scaled-dot-product attention on CPU and GPU backends, checked against an f64 reference.
#[derive(Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compute attention on the best available backend (or --backend), time it, and check it
    /// against the f64 reference on a sample of rows.
    #[command(allow_negative_numbers = true)]
    Run(RunArgs),
    /// Print the plan a backend would use, without running anything.
    #[command(allow_negative_numbers = true)]
    Plan(ProblemArgs),
    /// List every backend with whether it is available here and why.
    Backends {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Time a grid of shapes (for benchmark tables); JSON rows on stdout.
    #[command(allow_negative_numbers = true)]
    Bench(bench::BenchArgs),
    /// Check every available backend against the f64 reference on the case grid; non-zero
    /// exit on any failure.
    Verify(verify::VerifyArgs),
    /// List every ATTN_* tuning variable, with its value here where one is set.
    Knobs {
        /// The Markdown tables of docs/tuning.md instead.
        #[arg(long)]
        markdown: bool,
    },
}

/// The problem, from flags. Defaults: a realistic long-context decoder layer.
#[derive(Args, Clone)]
pub struct ProblemArgs {
    /// Batch size.
    #[arg(short, long, default_value_t = 1, value_parser = count)]
    pub batch: usize,
    /// Query heads.
    #[arg(long, default_value_t = 8, value_parser = count)]
    pub heads: usize,
    /// Key/value heads (GQA); defaults to --heads.
    #[arg(long, value_parser = count)]
    pub kv_heads: Option<usize>,
    /// Sequence length of queries and keys.
    #[arg(short, long, default_value_t = 2048, value_parser = count)]
    pub seq: usize,
    /// Query sequence length, if different from --seq.
    #[arg(long, value_parser = count)]
    pub seq_q: Option<usize>,
    /// Key sequence length, if different from --seq.
    #[arg(long, value_parser = count)]
    pub seq_k: Option<usize>,
    /// Head dimension.
    #[arg(short = 'd', long, default_value_t = 128, value_parser = count)]
    pub head_dim: usize,
    /// Element type: f32, f16 or bf16.
    #[arg(long, default_value = "bf16")]
    pub dtype: DType,
    /// No causal mask (the default is causal, bottom-right aligned).
    #[arg(long)]
    pub no_causal: bool,
    /// Memory layout: bhsd or bshd.
    #[arg(long, default_value = "bhsd")]
    pub layout: Layout,
    /// Softmax scale (default 1/sqrt(head_dim)).
    #[arg(long)]
    pub scale: Option<f32>,
    /// A sliding window `LEFT,RIGHT` of keys around the bottom-right diagonal, -1 unbounded
    /// (FlashAttention's window_size; replaces the causal mask: `--window 4096,0` is causal
    /// with 4096 keys back).
    #[arg(long, value_name = "LEFT,RIGHT", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Soft-cap the scaled scores at ±CAP (`cap · tanh(s / cap)`).
    #[arg(long, value_name = "CAP")]
    pub softcap: Option<f32>,
    /// ALiBi biases with the standard slopes, `2^(-8 (h + 1) / heads)` per query head.
    #[arg(long)]
    pub alibi: bool,
    /// Sequences of different lengths, packed (FlashAttention's varlen layout): each of the
    /// --batch sequences gets a length drawn from MIN..=--seq (queries and keys alike; with
    /// --seq-q below --seq-k, every sequence keeps --seq-q queries and its keys vary).
    #[arg(long, value_name = "MIN", value_parser = count)]
    pub varlen: Option<usize>,
    /// Keys and values in a paged cache of PAGE-key pages, shuffled (FlashAttention's
    /// block_table layout).
    #[arg(long, value_name = "PAGE", value_parser = count)]
    pub page_size: Option<usize>,
    /// Keys and values in a dense cache, `[batch, slots, heads, head_dim]`, that each sequence
    /// fills only up to its key count (`seqused_k`, FlashAttention's `cache_seqlens`; with
    /// --varlen the counts it draws, and as many slots as the largest).
    #[arg(long)]
    pub kv_cache: bool,
    /// Also compute the log-sum-exp per row.
    #[arg(long)]
    pub lse: bool,
    /// Backend name (see `attn backends`); default: the best available, or ATTN_BACKEND.
    #[arg(long)]
    pub backend: Option<String>,
    /// CPU worker threads (cpu backends), 1 to 1024; default: all cores.
    #[arg(long, value_parser = threads)]
    pub threads: Option<usize>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

impl ProblemArgs {
    /// The problem without its data: enough to plan.
    pub fn problem(&self) -> attn::Result<Problem> {
        Ok(self.problem_and_extras()?.0)
    }

    /// The problem and the indices and slopes its inputs carry (--alibi, --varlen, --page-size).
    pub fn problem_and_extras(&self) -> attn::Result<(Problem, OwnedExtras)> {
        let shape = Shape {
            batch: self.batch,
            heads_q: self.heads,
            heads_kv: self.kv_heads.unwrap_or(self.heads),
            seq_q: self.seq_q.unwrap_or(self.seq),
            seq_k: self.seq_k.unwrap_or(self.seq),
            head_dim: self.head_dim,
        };
        let mut p = Problem::new(shape, self.dtype).with_layout(self.layout).with_lse(self.lse);
        if !self.no_causal {
            p = p.causal();
        }
        if let Some(s) = self.scale {
            p = p.with_scale(s);
        }
        if let Some(window) = &self.window {
            let (left, right) = parse_window(window)?;
            p = p.with_window(left, right);
        }
        if let Some(cap) = self.softcap {
            p = p.with_softcap(cap);
        }
        let mut extras = OwnedExtras::default();
        if self.kv_cache && self.page_size.is_some() {
            return Err(attn::Error::InvalidParameter {
                what: "--kv-cache with --page-size: a paged cache already has per-sequence key counts; \
                       give one of them"
                    .into(),
            });
        }
        if self.varlen.is_some() || self.page_size.is_some() || self.kv_cache {
            let (q_lens, k_lens) = match self.varlen {
                Some(min) => varlen_lengths(shape.batch, shape.seq_q, shape.seq_k, min)?,
                None => (vec![shape.seq_q; shape.batch], vec![shape.seq_k; shape.batch]),
            };
            let keys = match (self.page_size, self.kv_cache) {
                (Some(page_size), _) => KeyStore::Paged { page_size, seed: LENGTHS_SEED },
                (None, true) => KeyStore::DenseUsed,
                (None, false) => KeyStore::Packed,
            };
            (p, extras) = into_sequences(p, &q_lens, &k_lens, keys);
        }
        if self.alibi {
            p = p.with_alibi(Alibi::PerHead);
            extras.alibi_slopes = Some(alibi_standard_slopes(shape.heads_q));
        }
        p.validate()?;
        p.check_extras(&extras.borrow())?;
        Ok((p, extras))
    }

    /// The backend named by --backend, or the best one for `problem`.
    pub fn backend(&self, problem: &Problem) -> attn::Result<Box<dyn Attention>> {
        if let Some(threads) = self.threads {
            // CPU backends run on rayon's global pool; this sizes it (once per process).
            let _ = rayon::ThreadPoolBuilder::new().num_threads(threads).build_global();
        }
        match &self.backend {
            Some(name) => Backend::by_name(name),
            None => Backend::choose(problem).map(|(backend, why)| {
                if !self.json {
                    eprintln!("... backend {} ({why})", backend.name());
                }
                backend
            }),
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    problem: ProblemArgs,
    /// Timed runs (the median is reported).
    #[arg(long, default_value_t = 10, value_parser = count)]
    iters: usize,
    /// Untimed runs first.
    #[arg(long, default_value_t = 2, value_parser = count_or_zero)]
    warmup: usize,
    /// Query rows checked against the f64 reference (0: no check).
    #[arg(long, default_value_t = 256, value_parser = count_or_zero)]
    check_rows: usize,
    /// Seed of the random inputs (printed, so any run can be repeated).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl Cli {
    pub fn run(self) -> Result<(), Box<dyn std::error::Error>> {
        match self.command {
            Command::Run(args) => run(args),
            Command::Plan(args) => {
                let problem = args.problem()?;
                let plan = args.backend(&problem)?.plan(&problem)?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&plan)?);
                } else {
                    print!("{plan}");
                }
                Ok(())
            }
            Command::Backends { json } => {
                let all: Vec<_> =
                    Backend::all()?.iter().map(|b| (b.name().to_string(), b.availability())).collect();
                if json {
                    println!("{}", serde_json::to_string_pretty(&all)?);
                } else {
                    report::backends(&all);
                }
                Ok(())
            }
            Command::Bench(args) => bench::run(args),
            Command::Verify(args) => verify::run(args),
            Command::Knobs { markdown } => {
                if markdown {
                    print!("{}", attn::knobs::markdown());
                } else {
                    report::knobs(&attn::knobs::all());
                }
                Ok(())
            }
        }
    }
}

fn run(args: RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (problem, extras) = args.problem.problem_and_extras()?;
    let backend = args.problem.backend(&problem)?;
    let plan = backend.plan(&problem)?;
    let device = match backend.availability() {
        attn::Availability::Available { device, .. } => device,
        attn::Availability::Unavailable { reason } => reason,
    };
    let progress = |msg: &str| {
        if !args.problem.json {
            eprintln!("... {msg}");
        }
    };
    progress(&format!("inputs: {problem}, N(0,1) seed {}", args.seed));
    measure::check_host_memory(&problem)?;
    let bufs = measure::random_inputs(&problem, args.seed);
    let mut o = Buffer::zeros(problem.dtype, problem.required_lens()[3].1);
    let mut lse = problem.params.return_lse.then(|| vec![0.0f32; problem.lse_len()]);
    let mut outputs = Outputs { o: o.as_data_mut(), lse: lse.as_deref_mut() };
    outputs.poison();
    progress(&format!("running {} ({} warm-up + {} timed)", backend.name(), args.warmup, args.iters));
    let timing = measure::time(
        &*backend,
        &plan,
        measure::inputs(&bufs).with_extras(extras.borrow()),
        outputs,
        args.warmup,
        measure::MIN_WARMUP,
        args.iters,
    )?;
    let accuracy = (args.check_rows > 0)
        .then(|| {
            let rows = problem.seq_map(extras.borrow())?.rows().count();
            progress(&format!(
                "checking {} of {rows} rows against the f64 reference",
                args.check_rows.min(rows)
            ));
            measure::accuracy(
                &problem,
                &measure::inputs(&bufs).with_extras(extras.borrow()),
                &o,
                args.check_rows,
            )
        })
        .transpose()?;
    let flops = problem.seq_map(extras.borrow())?.flops();
    let report =
        RunReport { gflops: flops / timing.median_s / 1e9, plan, device, seed: args.seed, timing, accuracy };
    if args.problem.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report::run(&report);
    }
    if let Some(a) = report.accuracy
        && a.non_finite > 0
    {
        return Err(format!("{} output elements are NaN or infinite", a.non_finite).into());
    }
    Ok(())
}

/// Seed of the sequence lengths of --varlen and the page order of --page-size: fixed, so that a
/// run's problem depends on its flags only.
const LENGTHS_SEED: u64 = 7;

/// Each of `batch` sequences' (queries, keys) for `--varlen MIN`: key counts drawn uniformly
/// from `MIN..=seq_k` (seeded by [`LENGTHS_SEED`], so the same flags give the same lengths);
/// the query counts equal them where `seq_q == seq_k`, else every sequence keeps `seq_q`.
pub(crate) fn varlen_lengths(
    batch: usize,
    seq_q: usize,
    seq_k: usize,
    min: usize,
) -> attn::Result<(Vec<usize>, Vec<usize>)> {
    if min == 0 || min > seq_k {
        return Err(attn::Error::InvalidParameter {
            what: format!("--varlen {min}: the shortest sequence is 1 to --seq ({seq_k}) tokens"),
        });
    }
    let mut rng = attn::rng::SplitMix64::new(LENGTHS_SEED);
    let k_lens: Vec<usize> = (0..batch).map(|_| min + rng.below(seq_k - min + 1)).collect();
    let q_lens = match seq_q == seq_k {
        true => k_lens.clone(),
        false => vec![seq_q; batch],
    };
    Ok((q_lens, k_lens))
}

/// `p` with its rows in sequences of the given lengths, laid out by [`batch_of`] (packed
/// queries, keys packed or paged); the mask, scale and other parameters stay as `p` has them.
pub(crate) fn into_sequences(
    p: Problem,
    q_lens: &[usize],
    k_lens: &[usize],
    keys: KeyStore,
) -> (Problem, OwnedExtras) {
    let (batched, extras) = batch_of(p.shape, p.dtype, q_lens, k_lens, keys);
    (Problem { shape: batched.shape, strides: batched.strides, batching: batched.batching, ..p }, extras)
}

/// `LEFT,RIGHT` as window bounds, -1 meaning unbounded.
pub(crate) fn parse_window(text: &str) -> attn::Result<(Option<usize>, Option<usize>)> {
    let invalid = || attn::Error::InvalidParameter {
        what: format!(
            "--window {text}: expected LEFT,RIGHT, each a key count or -1 (unbounded), e.g. 4096,0"
        ),
    };
    let bound = |b: &str| -> attn::Result<Option<usize>> {
        match b.trim() {
            "-1" => Ok(None),
            n => n.parse().map(Some).map_err(|_| invalid()),
        }
    };
    let (left, right) = text.split_once(',').ok_or_else(invalid)?;
    Ok((bound(left)?, bound(right)?))
}

#[cfg(test)]
mod window_tests {
    #[test]
    fn windows_parse_with_unbounded_sides() {
        assert_eq!(super::parse_window("4096,0").unwrap(), (Some(4096), Some(0)));
        assert_eq!(super::parse_window("-1, 3").unwrap(), (None, Some(3)));
        for bad in ["", "4096", "a,b", "-2,0", "1,2,3"] {
            assert!(super::parse_window(bad).unwrap_err().to_string().contains("LEFT,RIGHT"), "{bad}");
        }
    }
}

#[cfg(test)]
mod sequence_flag_tests {
    use super::*;

    fn problem(flags: &str) -> attn::Result<(Problem, OwnedExtras)> {
        let line = format!("attn run {flags}");
        match Cli::try_parse_from(line.split_whitespace()).expect("flags parse").command {
            Command::Run(run) => run.problem.problem_and_extras(),
            _ => unreachable!("a run command"),
        }
    }

    #[test]
    fn varlen_paged_and_alibi_flags_build_checked_problems() {
        let (p, e) = problem("--varlen 10 -b 5 --seq 300").unwrap();
        let map = p.seq_map(e.borrow()).unwrap();
        assert!((0..5).all(|b| (10..=300).contains(&map.q_len(b)) && map.q_len(b) == map.k_len(b)));
        let (p, e) = problem("--page-size 16 -b 2 --seq-q 1 --seq-k 100 --alibi").unwrap();
        assert!(
            matches!(p.batching.kv, attn::KvRows::Paged { page_size: 16, .. }) && e.alibi_slopes.is_some()
        );
        assert_eq!(p.seq_map(e.borrow()).unwrap().k_len(1), 100);
        let (p, e) = problem("--varlen 100 -b 3 --seq-q 64 --seq-k 500 --kv-cache").unwrap();
        let map = p.seq_map(e.borrow()).unwrap();
        assert!(p.batching.keys_used && matches!(p.batching.kv, attn::KvRows::Dense));
        assert!((0..3).all(|b| map.q_len(b) == 64 && (100..=500).contains(&map.k_len(b))));
        let err = problem("--kv-cache --page-size 16").unwrap_err().to_string();
        assert!(err.contains("--kv-cache with --page-size"), "{err}");
        let err = problem("--varlen 500 --seq 300").unwrap_err().to_string();
        assert!(err.contains("--varlen 500") && err.contains("1 to --seq"), "{err}");
        let err = Cli::try_parse_from("attn run --varlen 0".split_whitespace()).err().unwrap().to_string();
        assert!(err.contains("--varlen") && err.contains("at least 1"), "{err}");
    }
}
