//! An `exp` the compiler can vectorise.
//!
//! `f32::exp` is a libm call per element, which no compiler turns into SIMD; in a tile of softmax
//! it would cost more than the matrix products. This one is branch-free arithmetic: `x = n·ln2 + r`
//! with `r` in `[-ln2/2, ln2/2]` (Cody–Waite: `ln2` split in a short high part, exact when
//! multiplied by `n`, and a low part), a degree-6 Taylor polynomial for `e^r`, and `2^n` built
//! from exponent bits. Relative error below 4e-7 (tested below against f64). The polynomial's
//! multiply-adds are fused where the caller is compiled with FMA ([`Madd`]).

/// `1/k!` for k = 0..=6.
const C: [f32; 7] = [1.0, 1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0];
/// `ln 2` rounded to 9 significant bits, so `n · LN2_HI` is exact for |n| < 2^15.
const LN2_HI: f32 = 0.693_359_4;
/// `ln 2 - LN2_HI`.
const LN2_LO: f32 = -2.121_944_4e-4;

/// How `a·b + c` is computed: Rust never fuses `a * b + c` by itself, and `f32::mul_add` is one
/// instruction only where the caller is compiled with FMA (elsewhere, a libm call per element).
pub trait Madd {
    /// `a·b + c`.
    fn madd(a: f32, b: f32, c: f32) -> f32;
}

/// One fused multiply-add (for code compiled with FMA).
pub struct Fused;
/// A multiply, then an add.
pub struct Unfused;

impl Madd for Fused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl Madd for Unfused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// `e^x` for one value. Below `-87.3` (where f32's normal range ends) the result is exactly 0, so
/// masked scores (`-inf`) give a weight of 0; above 88.37 it stays at `e^88.37`, finite (`2^n`
/// with `n` at most 127). Softmax only ever asks for `x ≤ 0`.
#[inline(always)]
pub fn exp<M: Madd>(x: f32) -> f32 {
    let xc = x.clamp(-87.3, 88.37);
    let n = (xc * std::f32::consts::LOG2_E).round_ties_even();
    let r = M::madd(-n, LN2_LO, M::madd(-n, LN2_HI, xc));
    let p = C[..6].iter().rev().fold(C[6], |acc, &c| M::madd(acc, r, c)); // Horner
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
pub fn exp_sub_sum<M: Madd>(xs: &mut [f32], offset: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (x, l) in c.iter_mut().zip(&mut lanes) {
            *x = exp::<M>(*x - offset);
            *l += *x;
        }
    }
    for x in chunks.into_remainder() {
        *x = exp::<M>(*x - offset);
        lanes[0] += *x;
    }
    fold(lanes, |a, b| a + b)
}

/// Combines the lanes pairwise (halves, then quarters, ...): four dependent steps instead of
/// fifteen. A row's reductions are a dependent chain that the tile's other work cannot hide; one
/// lane at a time they cost about as much as a D=64 row's share of the matrix products.
#[inline(always)]
fn fold(mut lanes: [f32; LANES], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] = f(lanes[i], lanes[i + width]);
        }
    }
    lanes[0]
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
    fold(lanes, |m, x| if x > m { x } else { m })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_f64_exp() {
        check_exp::<Unfused>("unfused");
        check_exp::<Fused>("fused");
    }

    fn check_exp<M: Madd>(name: &str) {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let rel = ((exp::<M>(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 4e-7, "{name}: worst relative error {worst}");
        assert_eq!(exp::<M>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp::<M>(-100.0), 0.0);
        assert_eq!(exp::<M>(0.0), 1.0);
        assert!(exp::<M>(1000.0).is_finite(), "{name}: exp(1000) = {}", exp::<M>(1000.0));
    }

    #[test]
    fn reductions_cover_every_element() {
        for n in [0, 1, 15, 16, 17, 40] {
            let xs: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let want = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max(&xs), want, "n = {n}");
            let mut ys = xs.clone();
            let sum = exp_sub_sum::<Unfused>(&mut ys, 1.0);
            let want: f64 = xs.iter().map(|&x| ((x - 1.0) as f64).exp()).sum();
            assert!((sum as f64 - want).abs() <= 1e-5 * want.max(1.0), "n = {n}");
        }
    }
}
