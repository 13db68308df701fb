//! Randomized differential testing: problems drawn at random over every feature (shapes, GQA
//! ratios, `seq_q != seq_k`, strides with gaps, layouts, masks and windows, soft-caps, ALiBi,
//! scales, packed, paged and partly used caches, the LSE, every input distribution), each run
//! on every backend given against the f64 reference, as the grids' cases are.
//!
//! A case is drawn as a [`Spec`], a handful of small numbers that proptest shrinks: a failure
//! found among thousands comes back as the smallest problem that still fails. `cargo xtask test`
//! runs [`CI_CASES`] of them on the CPU backends and [`CI_GPU_CASES`] on the GPU ones
//! (`tests/random.rs`); `attn verify --soak <minutes>` draws until the time is up ([`soak`]).

use crate::case::{Case, Distribution};
use crate::grad::{GradExpected, GradTolerance, run_grad_case};
use crate::grid::{alibi, padded, with_extras};
use crate::run::{Expected, run_case};
use crate::{Outcome, Tolerance};
use attn_core::sequences::{KeyStore, OwnedExtras, batch_of};
use attn_core::{Attention, BackwardOptions, DType, Knob, Layout, Mask, Problem, Shape};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use std::time::{Duration, Instant};

/// The cases `cargo xtask test` draws on the CPU backends (each variant runs them all).
pub const CI_CASES: u32 = 4000;
/// The cases it draws on the GPU backends: on CI's software adapter (lavapipe) wgpu and its
/// variant without subgroups took 1.3-1.4 s a case together, the three cpu-flash variants about
/// 4 ms and the reference 4 ms (test profile, 2 cores).
pub const CI_GPU_CASES: u32 = 40;

/// `ATTN_RANDOM_CASES`.
pub const CASES: Knob = Knob {
    name: "ATTN_RANDOM_CASES",
    allowed: "a whole number",
    default: "4000 (`random::CI_CASES`)",
    purpose: "Tests: the random cases `tests/random.rs` draws on the CPU backends.",
};
/// `ATTN_RANDOM_GPU_CASES`.
pub const GPU_CASES: Knob = Knob {
    name: "ATTN_RANDOM_GPU_CASES",
    allowed: "a whole number",
    default: "40 (`random::CI_GPU_CASES`)",
    purpose: "Tests: the random cases `tests/random.rs` draws on the GPU backends (CUDA, wgpu, and wgpu without subgroups).",
};
/// `ATTN_RANDOM_SEED`.
pub const SEED: Knob = Knob {
    name: "ATTN_RANDOM_SEED",
    allowed: "a whole number",
    default: "a new seed each run, printed",
    purpose: "Tests: the seed of `tests/random.rs`'s draw, to repeat a run (a failure prints its seed and its smallest case).",
};
/// Every variable attn-verify reads.
pub const KNOBS: &[Knob] = &[CASES, GPU_CASES, SEED];

/// How a case's rows are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// `[batch, heads, seq, head_dim]` (or BSHD), padded where `Spec::padded`.
    Dense,
    /// Sequences of drawn lengths, packed back to back (varlen).
    Packed,
    /// Keys in a paged cache of pages of this many keys, shuffled.
    Paged(usize),
    /// Keys in a dense cache each sequence uses only part of (`seqused_k`).
    Used,
}

/// One drawn case, before it is built: every field small, so that shrinking means something.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Element type.
    pub dtype: DType,
    /// Sequences.
    pub batch: usize,
    /// K/V heads.
    pub heads_kv: usize,
    /// Query heads per K/V head.
    pub group: usize,
    /// Query rows (the longest sequence's, for sequences).
    pub seq_q: usize,
    /// Keys (likewise).
    pub seq_k: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// The mask: none, causal, or a window `(left, right)`, `None` unbounded.
    pub mask: Mask,
    /// Soft-cap.
    pub softcap: Option<f32>,
    /// ALiBi with per-head slopes.
    pub alibi: bool,
    /// Softmax scale other than `1/sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Layout of dense rows.
    pub layout: Layout,
    /// Dense rows in padded buffers (a strided view with gaps, which must keep their poison).
    pub padded: bool,
    /// How the rows are stored.
    pub rows: Rows,
    /// Whether the LSE is asked for.
    pub lse: bool,
    /// How the inputs are drawn.
    pub dist: Distribution,
    /// Seed of the inputs and of the sequences' lengths.
    pub seed: u64,
}

impl Spec {
    /// The case this spec describes, or `None` where its parts do not make a valid problem (a
    /// window that sees nothing is valid; a feature a backend lacks is a skip, not a `None`).
    pub fn case(&self) -> Option<Case> {
        let s = Shape {
            batch: self.batch,
            heads_q: self.heads_kv * self.group,
            heads_kv: self.heads_kv,
            seq_q: self.seq_q,
            seq_k: self.seq_k,
            head_dim: self.head_dim,
        };
        let (mut problem, extras) = match self.rows {
            Rows::Dense => {
                let p = Problem::new(s, self.dtype).with_layout(self.layout);
                (if self.padded { padded(p) } else { p }, OwnedExtras::default())
            }
            rows => {
                let (q_lens, k_lens) = self.lengths();
                let keys = match rows {
                    Rows::Paged(page_size) => KeyStore::Paged { page_size, seed: self.seed },
                    Rows::Used => KeyStore::DenseUsed,
                    _ => KeyStore::Packed,
                };
                batch_of(s, self.dtype, &q_lens, &k_lens, keys)
            }
        };
        problem = problem.with_lse(self.lse).with_mask(self.mask);
        if let Some(cap) = self.softcap {
            problem = problem.with_softcap(cap);
        }
        if let Some(scale) = self.scale {
            problem = problem.with_scale(scale);
        }
        let mut case =
            with_extras("random", &format!("{:?}", self.rows), problem, extras, self.dist, self.seed);
        if self.alibi {
            case = alibi(case, false);
        }
        case.problem.validate().ok()?;
        case.problem.check_extras(&case.extras.borrow()).ok()?;
        Some(case)
    }

    /// Each sequence's (queries, keys), drawn from the seed: 0 to `seq_q` queries (a sequence
    /// may have none) and 1 to `seq_k` keys, the longest of each at the bound.
    fn lengths(&self) -> (Vec<usize>, Vec<usize>) {
        let mut rng = attn_core::rng::SplitMix64::new(self.seed ^ 0x5eed);
        let mut q: Vec<usize> = (0..self.batch).map(|_| rng.below(self.seq_q + 1)).collect();
        let mut k: Vec<usize> = (0..self.batch).map(|_| 1 + rng.below(self.seq_k)).collect();
        q[0] = self.seq_q;
        k[self.batch - 1] = self.seq_k;
        (q, k)
    }
}

/// The strategy drawing [`Spec`]s: small problems (up to 3 sequences, 9 query heads, 96 query
/// rows and 160 keys, head dims 8 to 256), every feature about as often as not.
pub fn specs() -> impl Strategy<Value = Spec> {
    let mask = prop_oneof![
        Just(Mask::None),
        Just(Mask::Causal),
        (prop::option::of(0usize..40), prop::option::of(0usize..40))
            .prop_map(|(left, right)| Mask::Window { left, right }),
    ];
    let rows = prop_oneof![
        3 => Just(Rows::Dense),
        1 => Just(Rows::Packed),
        1 => prop::sample::select(vec![1usize, 3, 16, 64]).prop_map(Rows::Paged),
        1 => Just(Rows::Used),
    ];
    let dist = prop::sample::select(vec![
        Distribution::Normal,
        Distribution::LargeMagnitude,
        Distribution::OneHotPeaked,
        Distribution::HeavyTailed,
        Distribution::SmallIntegers,
    ]);
    let shape = (
        prop::sample::select(DType::ALL.to_vec()),
        1usize..=3,
        1usize..=3,
        1usize..=3,
        1usize..=96,
        1usize..=160,
        prop::sample::select(vec![8usize, 16, 24, 32, 40, 64, 72, 96, 128, 256]),
    );
    let features = (
        mask,
        prop::option::of(prop::sample::select(vec![5.0f32, 20.0, 50.0])),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec![0.05f32, 0.3, 1.0])),
        prop::sample::select(vec![Layout::Bhsd, Layout::Bshd]),
        any::<bool>(),
        rows,
        any::<bool>(),
        dist,
        any::<u64>(),
    );
    (shape, features).prop_map(
        |(
            (dtype, batch, heads_kv, group, seq_q, seq_k, head_dim),
            (mask, softcap, alibi, scale, layout, padded, rows, lse, dist, seed),
        )| Spec {
            dtype,
            batch,
            heads_kv,
            group,
            seq_q,
            seq_k,
            head_dim,
            mask,
            softcap,
            alibi,
            scale,
            layout,
            padded,
            rows,
            lse,
            dist,
            seed,
        },
    )
}

/// One backend's run of a case.
pub struct Ran {
    /// Backend name.
    pub backend: String,
    /// What happened.
    pub outcome: Outcome,
    /// How long the backend took (its plan, the run and the comparison).
    pub time: Duration,
}

/// Which pass the random cases check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The output and LSE, against `Reference::compute` (the grids' checks).
    Forward,
    /// dQ, dK and dV, against the reference's exact gradients (the gradient grids' checks and
    /// [`GradTolerance`]; `attn verify --soak --grad`, not yet in CI: docs/reliability.md).
    Backward(BackwardOptions),
}

/// The reference of one case for one pass.
enum Wanted {
    Forward(Expected),
    Backward(GradExpected),
}

/// Runs `case` on every backend against the reference (computed once); the first failure, with
/// the case, or every backend's run.
pub fn check(backends: &[&dyn Attention], case: &Case, pass: Pass) -> Result<Vec<Ran>, String> {
    let inputs = case.inputs();
    let wanted = match pass {
        Pass::Forward => Wanted::Forward(Expected::compute(case, &inputs)),
        Pass::Backward(_) => Wanted::Backward(GradExpected::compute(case, &inputs)),
    };
    let mut ran = Vec::with_capacity(backends.len());
    for backend in backends {
        let start = Instant::now();
        let dtype = case.problem.dtype;
        let numerics = backend.numerics(dtype);
        let outcome = match (&wanted, pass) {
            (Wanted::Forward(expected), _) => {
                let tolerance = expected.tolerance(Tolerance::for_numerics(numerics, dtype));
                run_case(*backend, case, &inputs, expected, tolerance)
            }
            (Wanted::Backward(expected), Pass::Backward(options)) => {
                let tolerance = expected.tolerance(GradTolerance::for_numerics(numerics, dtype));
                run_grad_case(*backend, case, &inputs, expected, tolerance, options)
            }
            (Wanted::Backward(_), Pass::Forward) => unreachable!("the reference follows the pass"),
        };
        if let Outcome::Fail { reason, .. } = &outcome {
            return Err(format!(
                "{} failed {} ({}, seed {}): {reason}",
                backend.name(),
                case.name,
                case.problem,
                case.seed
            ));
        }
        ran.push(Ran { backend: backend.name().to_string(), outcome, time: start.elapsed() });
    }
    Ok(ran)
}

/// What a run of random cases found.
#[derive(Debug, Default)]
pub struct Tally {
    /// Cases drawn that made valid problems.
    pub cases: usize,
    /// Per backend: its name, the cases it ran, the cases its plan refused (skips) and its time.
    pub ran: Vec<(String, usize, usize, Duration)>,
    /// Time spent drawing inputs and computing the f64 reference.
    pub reference: Duration,
    /// The first failure, shrunk to the smallest spec that still fails, and what it said.
    pub failure: Option<(Spec, String)>,
}

impl Tally {
    fn count(&mut self, runs: &[Ran], total: Duration) {
        self.cases += 1;
        self.reference += total.saturating_sub(runs.iter().map(|r| r.time).sum());
        for r in runs {
            let skipped = usize::from(matches!(r.outcome, Outcome::Skip { .. }));
            match self.ran.iter_mut().find(|entry| entry.0 == r.backend) {
                Some(entry) => {
                    entry.1 += 1 - skipped;
                    entry.2 += skipped;
                    entry.3 += r.time;
                }
                None => self.ran.push((r.backend.clone(), 1 - skipped, skipped, r.time)),
            }
        }
    }
}

/// A seed from the clock, for a draw that differs between runs (print it: it repeats the draw).
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

/// Draws cases until `cases` are drawn or `time` has passed (whichever comes first), runs each
/// on `backends` (the `pass` of each), and on the first failure shrinks it (proptest's simplification, each step
/// re-run) and stops. `seed` makes the draw repeatable.
pub fn soak(backends: &[&dyn Attention], pass: Pass, cases: usize, time: Duration, seed: u64) -> Tally {
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config { failure_persistence: None, ..Config::default() },
        proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &seed_bytes),
    );
    let strategy = specs();
    let start = Instant::now();
    let mut tally = Tally::default();
    while tally.cases < cases && start.elapsed() < time {
        let mut tree = strategy.new_tree(&mut runner).expect("the strategy draws without rejection");
        let Some(case) = case_for(&tree.current(), pass) else { continue };
        let start_case = Instant::now();
        match check(backends, &case, pass) {
            Ok(runs) => tally.count(&runs, start_case.elapsed()),
            Err(first) => {
                tally.cases += 1;
                tally.failure = Some(shrink(backends, pass, &mut tree, first));
                break;
            }
        }
    }
    tally
}

/// `spec`'s case where it makes one the pass takes (the backward refuses a paged cache).
fn case_for(spec: &Spec, pass: Pass) -> Option<Case> {
    let case = spec.case()?;
    match pass {
        Pass::Backward(_) => case.problem.validate_backward().ok().map(|_| case),
        Pass::Forward => Some(case),
    }
}

/// The smallest spec under `tree` that still fails, and its failure (proptest's search: simplify
/// while it fails, complicate back where a simpler one passes).
fn shrink(
    backends: &[&dyn Attention],
    pass: Pass,
    tree: &mut impl ValueTree<Value = Spec>,
    first: String,
) -> (Spec, String) {
    let mut failing = (tree.current(), first);
    let fails = |spec: &Spec| case_for(spec, pass).and_then(|case| check(backends, &case, pass).err());
    if !tree.simplify() {
        return failing;
    }
    loop {
        let more = match fails(&tree.current()) {
            Some(why) => {
                failing = (tree.current(), why);
                tree.simplify()
            }
            None => tree.complicate(),
        };
        if !more {
            return failing;
        }
    }
}
