//! # attn-verify
//!
//! How we (and users) know that every backend computes the same function as the exact
//! reference, on every shape and option we claim, on whatever hardware is present.
//!
//! - [`case`]: a case is a problem (shape, layout, dtype, mask, GQA ratio, scale) plus a seed and
//!   an input distribution (normal, large logits, one-hot peaked rows, heavy tails, small
//!   integers); [`grid`] holds the `quick` and `full` grids, grouped in families.
//! - [`run`]: runs a case with poisoned (NaN) outputs and compares with `attn_cpu::Reference` in
//!   f64: max |error|, relative L2, the share of elements over tolerance, LSE error, NaN/Inf where
//!   the reference has none, unwritten elements, and writes outside a strided output view.
//! - [`tolerance`]: one table per (numerics, dtype), each number justified.
//! - [`report`]: backend × family table and a verdict.
//! - [`planted`]: backends with one deliberate bug each, which the quick grid must catch.
//! - [`random`]: problems drawn at random over every feature, shrunk to the smallest failing
//!   one (`tests/random.rs` in CI, `attn verify --soak` on GPU machines).
//! - [`grad`]: the same for the backward pass: gradient grids, [`grad::GradTolerance`], and
//!   [`planted_grad::GradFlaw`]s each caught by its named case.
//!
//! ## Adding a backend
//! Implement [`attn_core::Attention`] (and [`attn_core::Attention::numerics`] if it does not
//! keep everything in f32), then add one line to the registry behind `attn::Backend::all()`. `cargo xtask test` and
//! `attn verify` then run every case on it wherever it is available.

pub mod case;
pub mod grad;
pub mod grid;
pub mod planted;
pub mod planted_grad;
pub mod random;
pub mod report;
pub mod run;
pub mod tolerance;

use attn_core::Attention;
pub use case::{Case, Distribution};
pub use report::CaseResult;
pub use run::{ErrorStats, Outcome};
pub use tolerance::Tolerance;

/// Runs every case on every backend (the reference of each case is computed once). `progress`
/// sees each result as it comes.
pub fn run_suite(
    backends: &[&dyn Attention],
    cases: &[Case],
    mut progress: impl FnMut(&CaseResult),
) -> Vec<CaseResult> {
    let mut results = vec![];
    for case in cases {
        let inputs = case.inputs();
        let expected = run::Expected::compute(case, &inputs);
        for backend in backends {
            let tol = expected
                .tolerance(Tolerance::for_numerics(backend.numerics(case.problem.dtype), case.problem.dtype));
            let outcome = run::run_case(*backend, case, &inputs, &expected, tol);
            let worst_ratio = match &outcome {
                Outcome::Pass { stats } | Outcome::Fail { stats: Some(stats), .. } => {
                    stats.worst_ratio.max(stats.lse_worst_ratio).max(stats.rel_l2 / tol.rel_l2)
                }
                _ => 0.0,
            };
            let result = CaseResult::new(*backend, case, outcome, worst_ratio);
            progress(&result);
            results.push(result);
        }
    }
    results
}
