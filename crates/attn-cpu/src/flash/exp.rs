//! An `exp` the compiler can vectorise.
//!
//! `f32::exp` is a libm call per element, which no compiler turns into SIMD; in a tile of softmax
//! it would cost more than the matrix products. This one is branch-free arithmetic: `x = n·ln2 + r`
//! with `r` in `[-ln2/2, ln2/2]` (Cody–Waite: `ln2` split in a short high part, exact when
//! multiplied by `n`, and a low part), a degree-6 Taylor polynomial for `e^r`, and `2^n` built
//! from exponent bits. Relative error below 4e-7 (tested below against f64).

/// `1/k!` for k = 0..=6.
const C: [f32; 7] = [1.0, 1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0];
/// `ln 2` rounded to 9 significant bits, so `n · LN2_HI` is exact for |n| < 2^15.
const LN2_HI: f32 = 0.693_359_4;
/// `ln 2 - LN2_HI`.
const LN2_LO: f32 = -2.121_944_4e-4;

/// `e^x` for one value. Below `-87.3` (where f32's normal range ends) the result is exactly 0,
/// so masked scores (`-inf`) give a weight of 0.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let xc = x.clamp(-87.3, 88.5);
    let n = (xc * std::f32::consts::LOG2_E).round_ties_even();
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = C[0] + r * (C[1] + r * (C[2] + r * (C[3] + r * (C[4] + r * (C[5] + r * C[6])))));
    // 2^n from bits. Not `n as i32`: Rust's saturating float-to-int cast is done lane by lane
    // (seen in the disassembly). `n + 2^23 + 127` is an exact integer in [2^23, 2^24), whose
    // low mantissa bits are the biased exponent `n + 127`.
    let biased = (n + (8_388_608.0 + 127.0)).to_bits() & 0x7f_ffff;
    let two_n = f32::from_bits(biased << 23);
    if x < -87.3 { 0.0 } else { p * two_n }
}

/// Independent partial results per reduction: a single running sum or max would serialise the
/// loop (float operations are not associative, so the compiler keeps their order).
const LANES: usize = 16;

/// Replaces each `x` by `e^(x - offset)` and returns the sum of the results.
#[inline(always)]
pub fn exp_sub_sum(xs: &mut [f32], offset: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (x, l) in c.iter_mut().zip(&mut lanes) {
            *x = exp(*x - offset);
            *l += *x;
        }
    }
    for x in chunks.into_remainder() {
        *x = exp(*x - offset);
        lanes[0] += *x;
    }
    lanes.iter().sum()
}

/// The largest value (`-inf` for an empty slice; NaNs are ignored).
#[inline(always)]
pub fn max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (x, l) in c.iter().zip(&mut lanes) {
            *l = if *x > *l { *x } else { *l };
        }
    }
    for x in chunks.remainder() {
        lanes[0] = if *x > lanes[0] { *x } else { lanes[0] };
    }
    lanes.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_f64_exp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let rel = ((exp(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn reductions_cover_every_element() {
        for n in [0, 1, 15, 16, 17, 40] {
            let xs: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let want = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max(&xs), want, "n = {n}");
            let mut ys = xs.clone();
            let sum = exp_sub_sum(&mut ys, 1.0);
            let want: f64 = xs.iter().map(|&x| ((x - 1.0) as f64).exp()).sum();
            assert!((sum as f64 - want).abs() <= 1e-5 * want.max(1.0), "n = {n}");
        }
    }
}
