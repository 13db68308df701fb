//! How a problem's score modifiers reach both kernel families: which mask a variant compiles in
//! ([`KernelMask`]), and the run-time values of a sliding window and a soft-cap in the parameter
//! blocks ([`ScoreParams`]).
//!
//! Whether a window or a soft-cap exists is a compile-time choice (`ATTN_WINDOW`,
//! `ATTN_SOFTCAP`): the plain and causal variants do not change. Their bounds and the cap are
//! run-time values, so that one variant runs every window and every cap.

use attn_core::{Mask, Problem};

/// The mask a kernel variant compiles in. A window equivalent to no mask (`(None, None)`) or to
/// the causal one (`(None, Some(0))`) runs on that mask's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelMask {
    /// Every key.
    None,
    /// Bottom-right causal.
    Causal,
    /// A sliding window, its bounds in [`ScoreParams`].
    Window,
}

impl KernelMask {
    /// The mask `problem`'s variant compiles in.
    pub fn of(problem: &Problem) -> KernelMask {
        match problem.params.mask {
            Mask::None | Mask::Window { left: None, right: None } => KernelMask::None,
            Mask::Causal | Mask::Window { left: None, right: Some(0) } => KernelMask::Causal,
            Mask::Window { .. } => KernelMask::Window,
        }
    }
}

/// The run-time values of a window and a soft-cap, as both kernels' parameter blocks hold them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScoreParams {
    /// Keys a row sees before its diagonal, an unbounded side clamped to `seq_k` (which already
    /// reaches key 0 from every row), so that the kernel's `row + shift - left` cannot overflow.
    pub window_left: i32,
    /// Keys a row sees after its diagonal, an unbounded side clamped to `seq_q` (which already
    /// reaches the last key from every row).
    pub window_right: i32,
    /// The soft-cap's inner factor, `|scale| / cap`: every CUDA kernel computes
    /// `tanh(scale · s / cap)` as `tanh.approx.f32(s · softcap_in)` on the unscaled score `s`
    /// (with the scale's sign already in Q), one MUFU.TANH. Its error, measured on the H100 on
    /// 2^24 points of [-12, 12] (`bench/device/tanh_error.cu`): at most 7.9e-6 from tanh
    /// (2.4e-4 of a capped score at cap 30), mean 7e-8 on (0, 4); the verify grid's soft-capped
    /// LSEs moved by at most 6.5e-5 against the exact `1 - 2 / (1 + 2^x)` (MUFU.EX2 and a
    /// reciprocal) it replaced, for 1.19-1.33x the speed of soft-capped attention on Hopper and
    /// 1.10x on Ampere/Ada (`bench/results/h100-softcap-tanh.json`). 0 without a cap.
    pub softcap_in: f32,
    /// The soft-cap's outer factor, `cap · log2(e)`: the capped score in the base-2 units of
    /// the kernels' softmax, in place of `|scale| · log2(e)`. 0 without a cap.
    pub softcap_out: f32,
}

impl ScoreParams {
    /// The values for `problem` (zeros for what it does not ask).
    pub fn of(problem: &Problem) -> ScoreParams {
        let s = problem.shape;
        let clamp = |bound: Option<usize>, limit: usize| {
            bound.unwrap_or(limit).min(limit).min(i32::MAX as usize) as i32
        };
        let (window_left, window_right) = match problem.params.mask {
            Mask::Window { left, right } => (clamp(left, s.seq_k), clamp(right, s.seq_q)),
            _ => (0, 0),
        };
        let (softcap_in, softcap_out) = match problem.params.softcap {
            Some(cap) => {
                let (cap, scale) = (f64::from(cap), f64::from(problem.scale()).abs());
                let log2e = std::f64::consts::LOG2_E;
                ((scale / cap) as f32, (cap * log2e) as f32)
            }
            None => (0.0, 0.0),
        };
        ScoreParams { window_left, window_right, softcap_in, softcap_out }
    }
}

/// Key tiles `[first, end)` that the query block of rows `m0 .. m0 + block_m` walks under a
/// window of `problem` (both kernels' arithmetic: the first row's first key, the last row's last).
pub fn window_key_tiles(
    problem: &Problem,
    m0: usize,
    block_m: usize,
    block_n: usize,
) -> std::ops::Range<usize> {
    let s = problem.shape;
    let w = ScoreParams::of(problem);
    let shift = s.seq_k as i64 - s.seq_q as i64;
    let end = (m0 as i64 + block_m as i64 + shift + w.window_right as i64).clamp(0, s.seq_k as i64);
    let first = (m0 as i64 + shift - w.window_left as i64).clamp(0, end);
    (first as usize / block_n)..(end as usize).div_ceil(block_n)
}

/// What the plan says about `problem`'s window, soft-cap and ALiBi on a kernel of `block_m` query rows
/// and `block_n` keys per tile (nothing where it has none).
pub fn notes(problem: &Problem, block_m: usize, block_n: usize) -> Vec<String> {
    let mut notes = vec![];
    if let (KernelMask::Window, Mask::Window { left, right }) = (KernelMask::of(problem), problem.params.mask)
    {
        let s = problem.shape;
        let side = |b: Option<usize>| b.map_or("unbounded".to_string(), |b| b.to_string());
        let blocks = s.seq_q.div_ceil(block_m);
        let walked: usize =
            (0..blocks).map(|b| window_key_tiles(problem, b * block_m, block_m, block_n).len()).sum();
        let most = (0..blocks).map(|b| window_key_tiles(problem, b * block_m, block_m, block_n).len()).max();
        notes.push(format!(
            "sliding window ({} keys left of the diagonal, {} right): each query block walks only the key \
             tiles its rows see, at most {} of {}, {walked} of {} in all; only the tiles at the window's edges are masked",
            side(left),
            side(right),
            most.unwrap_or(0),
            s.seq_k.div_ceil(block_n),
            blocks * s.seq_k.div_ceil(block_n)
        ));
    }
    if let Some(cap) = problem.params.softcap {
        notes.push(format!(
            "soft-cap {cap}: scores become {cap}·tanh(score / {cap}) after the scale, before the softmax \
             (an exp2 and a reciprocal more per score)"
        ));
    }
    if let Some(alibi) = problem.params.alibi {
        notes.push(format!(
            "ALiBi ({}): -slope·|i + k_len - q_len - j| added to each scaled (and soft-capped) score before the mask",
            match alibi {
                attn_core::Alibi::PerHead => "a slope per head",
                attn_core::Alibi::PerBatchHead => "a slope per batch and head",
            }
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{DType, Shape};

    fn problem(sq: usize, sk: usize) -> Problem {
        Problem::new(Shape { seq_q: sq, seq_k: sk, ..Shape::new(1, 2, 1, 64) }, DType::Bf16)
    }

    #[test]
    fn windows_equivalent_to_other_masks_take_their_variants() {
        let p = problem(100, 100);
        assert_eq!(KernelMask::of(&p.with_window(None, None)), KernelMask::None);
        assert_eq!(KernelMask::of(&p.with_window(None, Some(0))), KernelMask::Causal);
        assert_eq!(KernelMask::of(&p.with_window(None, Some(1))), KernelMask::Window);
        assert_eq!(KernelMask::of(&p.with_window(Some(5), None)), KernelMask::Window);
        assert_eq!(KernelMask::of(&p.causal()), KernelMask::Causal);
    }

    #[test]
    fn unbounded_and_wide_sides_clamp_to_what_reaches_every_key() {
        // Row i sees j >= i + (sk - sq) - left and j <= i + (sk - sq) + right: left = sk puts
        // every row's first key at or before 0, right = sq every row's last at or past sk - 1.
        let s = ScoreParams::of(&problem(40, 150).with_window(None, Some(3)));
        assert_eq!((s.window_left, s.window_right), (150, 3));
        let s = ScoreParams::of(&problem(40, 150).with_window(Some(1000), None));
        assert_eq!((s.window_left, s.window_right), (150, 40));
        assert_eq!(ScoreParams::of(&problem(40, 150)), ScoreParams::default());
    }

    #[test]
    fn a_window_walks_the_key_tiles_its_rows_see() {
        // S = 1000, window (100, 0), blocks of 128 rows, tiles of 64 keys: rows 256..384 see
        // keys 156..384, tiles 2..6.
        let p = problem(1000, 1000).with_window(Some(100), Some(0));
        assert_eq!(window_key_tiles(&p, 256, 128, 64), 2..6);
        // Every key a row of the block sees is in a walked tile (checked against the definition).
        for (sq, sk, l, r) in
            [(40, 150, Some(16), Some(0)), (150, 40, Some(8), Some(0)), (130, 130, Some(0), Some(24))]
        {
            let p = problem(sq, sk).with_window(l, r);
            for m0 in (0..sq).step_by(64) {
                let tiles = window_key_tiles(&p, m0, 64, 32);
                for row in m0..(m0 + 64).min(sq) {
                    let keys = p.params.mask.visible_range(row, sq, sk);
                    if !keys.is_empty() {
                        assert!(tiles.start * 32 <= keys.start && keys.end <= tiles.end * 32, "{row}");
                    }
                }
            }
        }
        let notes = notes(&p.with_softcap(30.0), 128, 64);
        assert!(notes[0].contains("at most 4 of 16") && notes[1].contains("soft-cap 30"), "{notes:?}");
    }

    #[test]
    fn the_cap_factors_give_cap_tanh_of_the_scaled_score() {
        let p = problem(8, 8).with_scale(-0.25).with_softcap(5.0);
        let c = ScoreParams::of(&p);
        // The kernel's formula for a score s = 7 (its sign flipped with Q's for a negative scale).
        let s = 7.0f64;
        let t = (s * f64::from(c.softcap_in)).tanh();
        let capped = t * f64::from(c.softcap_out) / std::f64::consts::LOG2_E;
        assert!((capped - 5.0 * (0.25 * s / 5.0).tanh()).abs() < 1e-6, "{capped}");
    }
}
