//! The suite's results as a table (backend × case family) and a verdict.

use crate::run::Outcome;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One backend's result on one case.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CaseResult {
    /// Backend name.
    pub backend: String,
    /// Case family (a column of the table).
    pub family: &'static str,
    /// Case name.
    pub case: String,
    /// Input seed.
    pub seed: u64,
    /// What happened.
    pub outcome: Outcome,
    /// The largest of the error ratios (element, LSE, relative L2) against the tolerance:
    /// ≤ 1 passes.
    pub worst_ratio: f64,
}

impl CaseResult {
    /// `backend`'s result on `case`.
    pub fn new(
        backend: &dyn attn_core::Attention,
        case: &crate::Case,
        outcome: Outcome,
        worst_ratio: f64,
    ) -> Self {
        CaseResult {
            backend: backend.name().to_string(),
            family: case.family,
            case: case.name.clone(),
            seed: case.seed,
            outcome,
            worst_ratio,
        }
    }
}

/// Pass/fail counts and the worst ratio of one (backend, family) cell.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Cell {
    /// Cases passed.
    pub pass: usize,
    /// Cases failed.
    pub fail: usize,
    /// Cases the backend does not support.
    pub skip: usize,
    /// Worst error ratio over the cell's cases.
    pub worst_ratio: f64,
}

/// Every result, by backend and family.
pub fn cells(results: &[CaseResult]) -> BTreeMap<(String, &'static str), Cell> {
    let mut cells: BTreeMap<(String, &'static str), Cell> = BTreeMap::new();
    for r in results {
        let cell = cells.entry((r.backend.clone(), r.family)).or_default();
        match r.outcome {
            Outcome::Pass { .. } => cell.pass += 1,
            Outcome::Fail { .. } => cell.fail += 1,
            Outcome::Skip { .. } => cell.skip += 1,
        }
        cell.worst_ratio = cell.worst_ratio.max(r.worst_ratio);
    }
    cells
}

/// A table with a row per backend and a column per family: `ok 0.31` (all passed, worst ratio
/// 0.31 of the tolerance), `FAIL 2/3`, `skip`; then the failures with their reasons and a verdict.
pub fn table(results: &[CaseResult]) -> String {
    let cells = cells(results);
    let mut families: Vec<&str> = results.iter().map(|r| r.family).collect();
    families.dedup();
    let families: Vec<&str> = families.iter().fold(vec![], |mut v, f| {
        if !v.contains(f) {
            v.push(*f);
        }
        v
    });
    let mut backends: Vec<&str> = vec![];
    for r in results {
        if !backends.contains(&r.backend.as_str()) {
            backends.push(&r.backend);
        }
    }
    let width = backends.iter().map(|b| b.len()).max().unwrap_or(7).max(7);
    let mut out = String::new();
    let _ = write!(out, "{:width$}", "backend");
    for f in &families {
        let _ = write!(out, "  {f:>13}");
    }
    out.push('\n');
    for b in &backends {
        let _ = write!(out, "{b:width$}");
        for f in &families {
            let text = match cells.get(&(b.to_string(), *f)) {
                None => "-".to_string(),
                Some(c) if c.fail > 0 => format!("FAIL {}/{}", c.fail, c.pass + c.fail),
                Some(c) if c.pass == 0 => "skip".to_string(),
                Some(c) => format!("ok {:.2}", c.worst_ratio),
            };
            let _ = write!(out, "  {text:>13}");
        }
        out.push('\n');
    }
    for r in results {
        if let Outcome::Fail { reason, .. } = &r.outcome {
            let _ = writeln!(out, "FAIL {} {} (seed {}): {reason}", r.backend, r.case, r.seed);
        }
    }
    out.push_str(&verdict(results));
    out.push('\n');
    out
}

/// One line: how many cases passed, failed and were skipped, on how many backends.
pub fn verdict(results: &[CaseResult]) -> String {
    let fails = results.iter().filter(|r| r.outcome.is_fail()).count();
    let skips = results.iter().filter(|r| matches!(r.outcome, Outcome::Skip { .. })).count();
    let mut backends: Vec<&str> = results.iter().map(|r| r.backend.as_str()).collect();
    backends.sort();
    backends.dedup();
    let passes = results.len() - fails - skips;
    let word = if fails == 0 { "PASS" } else { "FAIL" };
    format!(
        "verdict: {word}: {passes} passed, {fails} failed, {skips} skipped (unsupported) on {} backend(s): {}",
        backends.len(),
        backends.join(", ")
    )
}
