//! The online-softmax math every backend implements.
//!
//! A tiled kernel sees a query row's scores one key tile at a time. It keeps the running maximum
//! `m` and the running sum `l = Σ exp(s - m)`, and an unnormalised accumulator `acc = Σ exp(s - m)
//! v`. When a new tile raises the maximum to `m'`, the old sum and accumulator are multiplied by
//! `exp(m - m')` ([`RowStats::rescale_to`]). At the end, `o = acc / l` and `lse = m + ln l`.
//!
//! Two partial results over disjoint key sets, each normalised and carrying its LSE, combine
//! with [`merge`]; that is how split-KV and multi-device attention reuse the same math.
//!
//! Rows that see no key keep `m = -inf` and `l = 0`; their output is 0 and their LSE `-inf`.
//! [`RowStats::exp_offset`] avoids the `(-inf) - (-inf) = NaN` that naive code hits there.

/// Running maximum and sum of exponentials of one query row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    /// Largest score seen so far (`-inf` before any visible key).
    pub max: f32,
    /// `Σ exp(s - max)` over the scores seen so far.
    pub sum: f32,
}

impl Default for RowStats {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl RowStats {
    /// No score seen yet.
    pub const EMPTY: RowStats = RowStats { max: f32::NEG_INFINITY, sum: 0.0 };

    /// Raises the running maximum to include `tile_max` and returns the factor by which the
    /// caller must multiply its accumulator (the sum is rescaled here). The factor is 1 when the
    /// maximum does not change and 0 when nothing was seen before.
    #[inline(always)]
    pub fn rescale_to(&mut self, tile_max: f32) -> f32 {
        self.rescale_to_with(tile_max, f32::exp)
    }

    /// [`rescale_to`](RowStats::rescale_to) with the caller's `exp` (a kernel's own, faster one).
    #[inline(always)]
    pub fn rescale_to_with(&mut self, tile_max: f32, exp: impl Fn(f32) -> f32) -> f32 {
        if tile_max <= self.max {
            return 1.0;
        }
        let factor = if self.max == f32::NEG_INFINITY { 0.0 } else { exp(self.max - tile_max) };
        self.max = tile_max;
        self.sum *= factor;
        factor
    }

    /// The value to subtract from scores before `exp`: the running max, or 0 while it is `-inf`
    /// (then every score is `-inf` too and `exp` gives 0, not NaN).
    #[inline(always)]
    pub fn exp_offset(&self) -> f32 {
        if self.max == f32::NEG_INFINITY { 0.0 } else { self.max }
    }

    /// The log-sum-exp of the row's scores: `max + ln(sum)`, `-inf` for a row that saw no key.
    pub fn lse(&self) -> f32 {
        if self.sum == 0.0 { f32::NEG_INFINITY } else { self.max + self.sum.ln() }
    }

    /// `1 / sum`, or 0 for a row that saw no key (so its output is 0, never NaN).
    pub fn inv_sum(&self) -> f32 {
        if self.sum == 0.0 { 0.0 } else { 1.0 / self.sum }
    }
}

/// Combines two normalised partial results of one query row over disjoint key sets.
///
/// `(lse_a, o_a)` and `(lse_b, o_b)` are each a softmax-weighted average of values with the
/// log-sum-exp of its scores. Writes `o = w_a o_a + w_b o_b` with `w_x = exp(lse_x - lse)` into
/// `out` and returns `lse = ln(exp(lse_a) + exp(lse_b))`. A side with `lse = -inf` (no key)
/// contributes nothing; two such sides give `o = 0`, `lse = -inf`.
pub fn merge(lse_a: f32, o_a: &[f32], lse_b: f32, o_b: &[f32], out: &mut [f32]) -> f32 {
    assert!(o_a.len() == out.len() && o_b.len() == out.len(), "merge: rows of different lengths");
    let max = lse_a.max(lse_b);
    if max == f32::NEG_INFINITY {
        out.fill(0.0);
        return f32::NEG_INFINITY;
    }
    let (ea, eb) = ((lse_a - max).exp(), (lse_b - max).exp());
    let total = ea + eb;
    let (wa, wb) = (ea / total, eb / total);
    for ((o, a), b) in out.iter_mut().zip(o_a).zip(o_b) {
        *o = wa * a + wb * b;
    }
    max + total.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Softmax-weighted average of `values` (one scalar per key) with its LSE, computed directly.
    fn direct(scores: &[f32], values: &[f32]) -> (f32, f32) {
        let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            return (f32::NEG_INFINITY, 0.0);
        }
        let w: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
        let l: f32 = w.iter().sum();
        (m + l.ln(), w.iter().zip(values).map(|(w, v)| w * v).sum::<f32>() / l)
    }

    /// The online form, tile by tile, as a kernel does it.
    fn online(scores: &[f32], values: &[f32], tile: usize) -> (f32, f32) {
        let (mut stats, mut acc) = (RowStats::EMPTY, 0.0f32);
        for (s, v) in scores.chunks(tile).zip(values.chunks(tile)) {
            let tile_max = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            acc *= stats.rescale_to(tile_max);
            let off = stats.exp_offset();
            for (s, v) in s.iter().zip(v) {
                let p = (s - off).exp();
                stats.sum += p;
                acc += p * v;
            }
        }
        (stats.lse(), acc * stats.inv_sum())
    }

    #[test]
    fn online_equals_direct_including_huge_logits() {
        let scores = [3.0, -1.0, 80.0, 79.5, -200.0, 85.0, 0.0];
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
        let (lse, o) = direct(&scores, &values);
        for tile in 1..=scores.len() {
            let (lse2, o2) = online(&scores, &values, tile);
            assert!((lse - lse2).abs() < 1e-5 && (o - o2).abs() < 1e-5, "tile {tile}");
        }
    }

    #[test]
    fn masked_row_gives_zero_and_neg_inf() {
        let ninf = f32::NEG_INFINITY;
        let (lse, o) = online(&[ninf, ninf, ninf], &[1.0, 2.0, 3.0], 2);
        assert_eq!(lse, ninf);
        assert_eq!(o, 0.0);
    }

    #[test]
    fn merge_of_halves_equals_whole() {
        let scores = [0.5, 2.0, -3.0, 1.0, 40.0, -1.0];
        let values = [[1.0, -1.0], [2.0, 0.5], [3.0, 3.0], [4.0, -4.0], [5.0, 1.0], [6.0, 2.0]];
        for split in 0..=scores.len() {
            let part = |r: std::ops::Range<usize>| -> (f32, [f32; 2]) {
                let mut o = [0.0; 2];
                let mut lse = f32::NEG_INFINITY;
                for d in 0..2 {
                    let v: Vec<f32> = values[r.clone()].iter().map(|v| v[d]).collect();
                    (lse, o[d]) = direct(&scores[r.clone()], &v);
                }
                (lse, o)
            };
            let (la, oa) = part(0..split);
            let (lb, ob) = part(split..scores.len());
            let (lw, ow) = part(0..scores.len());
            let mut out = [f32::NAN; 2];
            let l = merge(la, &oa, lb, &ob, &mut out);
            assert!((l - lw).abs() < 1e-5, "split {split}: lse {l} vs {lw}");
            for d in 0..2 {
                assert!((out[d] - ow[d]).abs() < 1e-5, "split {split}: o[{d}] {} vs {}", out[d], ow[d]);
            }
        }
        let mut out = [f32::NAN; 2];
        let ninf = f32::NEG_INFINITY;
        assert_eq!(merge(ninf, &[9.0, 9.0], ninf, &[9.0, 9.0], &mut out), ninf);
        assert_eq!(out, [0.0, 0.0]);
    }
}
