//! Running one case on one backend and measuring its error against the reference.

use crate::case::Case;
use crate::tolerance::Tolerance;
use attn_core::{Attention, Buffer, Data, Outputs, SeqMap};
use attn_cpu::Reference;
use rayon::prelude::*;

/// Error statistics of one output against the reference.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ErrorStats {
    /// Largest |out − ref|.
    pub max_abs: f64,
    /// ‖out − ref‖₂ / ‖ref‖₂ (absolute when the reference is all zero).
    pub rel_l2: f64,
    /// Share of elements over the per-element bound.
    pub frac_over: f64,
    /// Largest `|out − ref| / bound` over elements: ≤ 1 passes.
    pub worst_ratio: f64,
    /// Largest LSE error (0 when the case asks for no LSE).
    pub lse_max_err: f64,
    /// Largest `LSE error / LSE bound`.
    pub lse_worst_ratio: f64,
}

/// What happened when a backend ran a case.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Outcome {
    /// Within tolerance everywhere.
    Pass {
        /// The measured errors.
        stats: ErrorStats,
    },
    /// Outside tolerance, or a structural fault (NaN, unwritten or stray writes, an error).
    Fail {
        /// The measured errors, where the run produced an output.
        stats: Option<ErrorStats>,
        /// The first thing that was wrong, with the place.
        reason: String,
    },
    /// The backend does not support the case (its plan said why); not a failure.
    Skip {
        /// The plan's error.
        reason: String,
    },
}

impl Outcome {
    /// Whether this outcome is a failure.
    pub fn is_fail(&self) -> bool {
        matches!(self, Outcome::Fail { .. })
    }
}

/// The f64 reference of a case, computed once and shared by every backend.
pub struct Expected {
    o: Vec<f64>,
    lse: Vec<f64>,
    score_bound: f64,
    v_max: f64,
}

impl Expected {
    /// Computes the reference for `case` on `inputs`.
    pub fn compute(case: &Case, inputs: &[Buffer; 3]) -> Expected {
        let p = &case.problem;
        let ins = case.as_inputs(inputs);
        let (o, lse) = Reference::compute(p, &ins).expect("verification cases are valid problems");
        let map = p.seq_map(ins.extras).expect("verification cases have valid extras");
        let s = p.shape;
        let norm = |data: Data<'_>, off: usize| {
            (0..s.head_dim).map(|d| (data.get_f32(off + d) as f64).powi(2)).sum::<f64>().sqrt()
        };
        let qn = map.rows().map(|(b, h, i)| norm(ins.q, map.q_offset(b, h, i))).fold(0.0, f64::max);
        let kn = (0..s.batch)
            .flat_map(|b| (0..s.heads_kv).flat_map(move |g| (0..map.k_len(b)).map(move |j| (b, g, j))))
            .map(|(b, g, j)| norm(ins.k, map.k_offset(b, g, j)))
            .fold(0.0, f64::max);
        let v_max = (0..ins.v.len()).map(|i| ins.v.get_f32(i).abs() as f64).fold(0.0, f64::max);
        Expected { o, lse, score_bound: p.scale().abs() as f64 * qn * kn, v_max }
    }
}

impl Expected {
    /// `base` widened for this case's score magnitude (see [`Tolerance::widened`]).
    pub fn tolerance(&self, base: Tolerance) -> Tolerance {
        base.widened(self.score_bound, self.v_max)
    }
}

/// Runs `case` on `backend` with poisoned outputs and compares with `expected` within
/// `tolerance` (already widened for the case by [`Expected::tolerance`]).
pub fn run_case(
    backend: &dyn Attention,
    case: &Case,
    inputs: &[Buffer; 3],
    expected: &Expected,
    tolerance: Tolerance,
) -> Outcome {
    let p = &case.problem;
    if let Err(e) = backend.plan(p) {
        return Outcome::Skip { reason: e.to_string() };
    }
    let o_len = p.required_lens()[3].1;
    let mut o = Buffer::zeros(p.dtype, o_len);
    let mut lse = vec![0.0f32; p.lse_len()];
    let mut outputs = Outputs { o: o.as_data_mut(), lse: p.params.return_lse.then_some(lse.as_mut_slice()) };
    outputs.poison();
    if let Err(e) = backend.forward(p, case.as_inputs(inputs), outputs) {
        return Outcome::Fail { stats: None, reason: format!("the backend returned an error: {e}") };
    }
    let map = p.seq_map(case.extras.borrow()).expect("verification cases have valid extras");
    compare(&map, &o, &lse, expected, tolerance)
}

fn compare(map: &SeqMap<'_>, o: &Buffer, lse: &[f32], expected: &Expected, tol: Tolerance) -> Outcome {
    let p = map.problem();
    let s = p.shape;
    let d = s.head_dim;
    let got = o.as_data();
    // The rows the sequences have, and where the reference keeps each (`[batch, heads_q, seq_q]`).
    let rows: Vec<(usize, usize, usize)> = map.rows().collect();
    let logical = |(b, h, i): (usize, usize, usize)| (b * s.heads_q + h) * s.seq_q + i;
    // Per row: (diff², ref², max abs, worst ratio, elements over, first fault).
    let per_row: Vec<(f64, f64, f64, f64, usize, Option<String>)> = rows
        .par_iter()
        .map(|&(b, h, i)| {
            let row = logical((b, h, i));
            let off = map.o_offset(b, h, i);
            let (mut diff2, mut ref2, mut max_abs, mut worst, mut over, mut fault) = (0.0, 0.0, 0.0f64, 0.0f64, 0, None);
            for x in 0..d {
                let (y, r) = (got.get_f32(off + x) as f64, expected.o[row * d + x]);
                if !y.is_finite() {
                    fault.get_or_insert_with(|| {
                        format!("o[{b},{h},{i},{x}] = {y} (reference {r:.6e}): unwritten (poison) or non-finite")
                    });
                    over += 1;
                    continue;
                }
                let err = (y - r).abs();
                diff2 += err * err;
                ref2 += r * r;
                max_abs = max_abs.max(err);
                let ratio = err / tol.bound(r);
                worst = worst.max(ratio);
                if ratio > 1.0 {
                    over += 1;
                    fault.get_or_insert_with(|| {
                        format!("o[{b},{h},{i},{x}] = {y:.6e}, reference {r:.6e}: |error| {err:.2e} > bound {:.2e}", tol.bound(r))
                    });
                }
            }
            (diff2, ref2, max_abs, worst, over, fault)
        })
        .collect();
    let mut stats = ErrorStats::default();
    let (mut diff2, mut ref2, mut over, mut fault) = (0.0, 0.0, 0usize, None);
    for (d2, r2, m, w, n, f) in per_row {
        diff2 += d2;
        ref2 += r2;
        stats.max_abs = stats.max_abs.max(m);
        stats.worst_ratio = stats.worst_ratio.max(w);
        over += n;
        if fault.is_none() {
            fault = f;
        }
    }
    stats.rel_l2 = if ref2 > 0.0 { (diff2 / ref2).sqrt() } else { diff2.sqrt() };
    stats.frac_over = over as f64 / (rows.len() * d).max(1) as f64;

    if p.params.return_lse {
        for &(b, h, i) in &rows {
            let (l, r) = (lse[map.lse_index(b, h, i)] as f64, expected.lse[logical((b, h, i))]);
            let (err, ratio) = if r == f64::NEG_INFINITY {
                if l == f64::NEG_INFINITY { (0.0, 0.0) } else { (f64::INFINITY, f64::INFINITY) }
            } else if l.is_finite() {
                let err = (l - r).abs();
                (err, err / (tol.lse_atol + tol.lse_rtol * r.abs()))
            } else {
                (f64::INFINITY, f64::INFINITY)
            };
            stats.lse_max_err = stats.lse_max_err.max(err);
            stats.lse_worst_ratio = stats.lse_worst_ratio.max(ratio);
            if ratio > 1.0 && fault.is_none() {
                fault = Some(format!("lse[{b},{h},{i}] = {l}, reference {r}"));
            }
        }
    }

    // Elements outside the output view must keep their poison.
    if let Some(stray) = stray_write(map, &rows, got) {
        fault.get_or_insert(stray);
    }
    if stats.rel_l2 > tol.rel_l2 && fault.is_none() {
        fault = Some(format!("relative L2 error {:.2e} > {:.2e}", stats.rel_l2, tol.rel_l2));
    }
    match fault {
        None => Outcome::Pass { stats },
        Some(reason) => Outcome::Fail { stats: Some(stats), reason },
    }
}

/// The first element outside the output rows of the sequences that is not NaN any more, if any.
fn stray_write(map: &SeqMap<'_>, rows: &[(usize, usize, usize)], got: Data<'_>) -> Option<String> {
    let d = map.problem().shape.head_dim;
    let mut in_view = vec![false; got.len()];
    for &(b, h, i) in rows {
        let off = map.o_offset(b, h, i);
        in_view[off..off + d].iter_mut().for_each(|x| *x = true);
    }
    let i = (0..got.len()).find(|&i| !in_view[i] && !got.get_f32(i).is_nan())?;
    Some(format!("element {i} of o lies outside the output view but was written"))
}
