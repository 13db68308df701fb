//! How close each backend family must come to the f64 reference, per dtype.

use attn_core::{DType, Numerics};

/// An element passes when `|x − ref| ≤ atol + rtol·|ref|` (NaN never passes), the output's
/// relative L2 error is at most `rel_l2`, and each LSE is within `lse_atol + lse_rtol·|lse|`.
///
/// Why these numbers (u = unit roundoff of the dtype: 2^-24 f32, 2^-11 f16, 2^-8 bf16):
/// - The output is rounded once to its dtype, which alone costs up to `u·|ref|`; `rtol = 2u`
///   leaves as much again for f32 accumulation (whose own error, ~1e-7 relative for these sizes,
///   is far below u for f16/bf16).
/// - Outputs are weighted averages of values of size ~1; where the average nearly cancels,
///   relative error means nothing, so `atol` bounds the absolute error of the accumulation: 2e-6
///   for f32, and for f16/bf16 the rounding of a value of size ~1 (`u`) shared by the terms.
/// - Rounding P to the dtype (tensor cores) adds up to `u` relative error per weight; weights
///   sum to 1, so the output error is at most about `u · max|v|`: `atol = 4u` allows |v| up to 4
///   (normal inputs) and twice that for f16.
/// - Every kernel computes scores in f32, so a score `s` carries an error of order `u₃₂·|s|`,
///   which moves each softmax weight by that much relatively and the output by up to
///   `u₃₂·|s|·max|v|`. [`Tolerance::widened`] adds `8·u₃₂·M·max|v|` to `atol` and `2·u₃₂·M` to
///   `rel_l2` (a convex combination of values keeps the weights' relative error), with `M` a
///   bound on the scores (`scale · max‖q‖ · max‖k‖`): negligible for ordinary inputs, decisive
///   for the large-logit cases in f32.
/// - The LSE is f32 throughout: `1e-4` absolute plus the same score term.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Tolerance {
    /// Absolute part of the per-element bound.
    pub atol: f64,
    /// Relative part of the per-element bound.
    pub rtol: f64,
    /// Bound on ‖out − ref‖₂ / ‖ref‖₂.
    pub rel_l2: f64,
    /// Absolute part of the LSE bound.
    pub lse_atol: f64,
    /// Relative part of the LSE bound.
    pub lse_rtol: f64,
}

impl Tolerance {
    /// The table: one entry per (numerics, dtype).
    pub fn for_numerics(numerics: Numerics, dtype: DType) -> Tolerance {
        let u = dtype.unit_roundoff();
        let (atol, rtol, rel_l2) = match (numerics, dtype) {
            (Numerics::Exact, _) => (1e-30, 1.01 * u, 1.01 * u),
            (Numerics::F32Accumulate, DType::F32) => (2e-6, 2e-5, 1e-5),
            (Numerics::F32Accumulate, _) => (u, 2.0 * u, 2.0 * u),
            (Numerics::LowPrecisionP, DType::F32) => (2e-6, 2e-5, 1e-5),
            (Numerics::LowPrecisionP, _) => (4.0 * u, 2.0 * u, 4.0 * u),
        };
        Tolerance { atol, rtol, rel_l2, lse_atol: 1e-4, lse_rtol: 1e-5 }
    }

    /// This tolerance with the score-error allowance for inputs whose scaled scores are bounded
    /// by `score_bound` and whose values by `v_max` (see the type's documentation).
    pub fn widened(mut self, score_bound: f64, v_max: f64) -> Tolerance {
        let u32 = DType::F32.unit_roundoff();
        self.atol += 8.0 * u32 * score_bound * v_max;
        self.rel_l2 += 2.0 * u32 * score_bound;
        self.lse_atol += 8.0 * u32 * score_bound;
        self
    }

    /// The per-element bound for a reference value.
    pub fn bound(&self, reference: f64) -> f64 {
        self.atol + self.rtol * reference.abs()
    }
}
