//! The register-blocked micro-kernel behind both matrix products of a tile.
//!
//! Both `S = Q·Kᵀ` and `O += P·V` have the form `C = A·B` with `A` packed in panels of `MR` rows
//! (each panel stored k-major, so one step of the inner loop reads `MR` consecutive values) and
//! `B` row-major and contiguous along `n`. A [`Kernel`] keeps an `MR × NR` block of `C` in
//! registers for the whole `k` loop: `MR` broadcasts and `NR / lanes` vector loads feed
//! `MR · NR / lanes` fused multiply-adds per step.
//!
//! The x86 kernels are written with `core::arch` intrinsics: left to itself, the compiler
//! vectorised this loop nest across the wrong axis (with gathers) and ran 20x slower.

/// How the computed block combines with what `C` held.
#[derive(Clone, Copy)]
pub enum Accumulate<'a> {
    /// `C = A·B`; `C` is not read (it may hold garbage).
    Overwrite,
    /// `C[i, :] = factor[i] · C[i, :] + A·B`, one factor per row of `C`.
    ScaleRows(&'a [f32]),
}

/// An `MR × NR` register-blocked product.
pub trait Kernel {
    /// Rows of `C` per block (the panel height of `A`).
    const MR: usize;
    /// Columns of `C` per block.
    const NR: usize;
    /// `C[r, j0 + c] ⊕= Σ_kk panel[kk·MR + r] · b[kk·ldb + j0 + c]` for `kk < k`, where `c` starts
    /// at row 0 of the block (row stride `ldc`) and `⊕=` is set by `mode` (whose factors, if
    /// any, are this block's `MR`).
    fn block(
        k: usize,
        panel: &[f32],
        b: &[f32],
        ldb: usize,
        j0: usize,
        c: &mut [f32],
        ldc: usize,
        mode: Accumulate<'_>,
    );
}

/// `C (m × n, row stride ldc) ⊕= A (panels) · B (k × n, row stride ldb)`.
///
/// `a` holds `m / MR` panels of `k · MR` values; `b` holds `k` rows of `ldb ≥ n` values; `m` is a
/// multiple of `MR` and `n` of `NR`.
#[inline(always)]
pub fn gemm<K: Kernel>(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    acc_mode: Accumulate<'_>,
) {
    debug_assert!(m.is_multiple_of(K::MR) && n.is_multiple_of(K::NR));
    for (p, panel) in a[..m * k].chunks_exact(k * K::MR).enumerate() {
        let rows = &mut c[p * K::MR * ldc..];
        let mode = match acc_mode {
            Accumulate::Overwrite => Accumulate::Overwrite,
            Accumulate::ScaleRows(f) => Accumulate::ScaleRows(&f[p * K::MR..(p + 1) * K::MR]),
        };
        for j0 in (0..n).step_by(K::NR) {
            K::block(k, panel, b, ldb, j0, rows, ldc, mode);
        }
    }
}

/// Plain Rust, for CPUs without the x86 extensions below (and as the tests' yardstick).
pub struct Portable;

impl Kernel for Portable {
    const MR: usize = 4;
    const NR: usize = 8;
    #[inline(always)]
    fn block(
        k: usize,
        panel: &[f32],
        b: &[f32],
        ldb: usize,
        j0: usize,
        c: &mut [f32],
        ldc: usize,
        mode: Accumulate<'_>,
    ) {
        let mut acc = [[0.0f32; 8]; 4];
        for (a, brow) in panel[..k * 4].chunks_exact(4).zip(b.chunks(ldb)) {
            let brow = &brow[j0..j0 + 8];
            for r in 0..4 {
                for c in 0..8 {
                    acc[r][c] += a[r] * brow[c];
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let row = &mut c[r * ldc + j0..r * ldc + j0 + 8];
            match mode {
                Accumulate::Overwrite => row.copy_from_slice(acc),
                Accumulate::ScaleRows(f) => row.iter_mut().zip(acc).for_each(|(x, a)| *x = f[r] * *x + a),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Accumulate, Kernel};
    use std::arch::x86_64::*;

    /// 8 × 32 with AVX-512: 16 of the 32 zmm registers accumulate.
    pub struct Avx512;
    /// 4 × 16 with AVX2 and FMA: 8 of the 16 ymm registers accumulate.
    pub struct Avx2;

    /// Bounds of everything the unsafe kernels touch, and the row factors as a pointer (null
    /// for overwrite).
    #[inline(always)]
    fn check(
        mr: usize,
        nr: usize,
        k: usize,
        panel: &[f32],
        b: &[f32],
        ldb: usize,
        j0: usize,
        c: &[f32],
        ldc: usize,
        mode: Accumulate<'_>,
    ) -> *const f32 {
        assert!(k >= 1 && panel.len() >= k * mr, "A panel too short");
        assert!(b.len() >= (k - 1) * ldb + j0 + nr, "B tile too short");
        assert!(c.len() >= (mr - 1) * ldc + j0 + nr, "C block too short");
        match mode {
            Accumulate::Overwrite => std::ptr::null(),
            Accumulate::ScaleRows(f) => {
                assert!(f.len() >= mr, "too few row factors");
                f.as_ptr()
            }
        }
    }

    impl Kernel for Avx512 {
        const MR: usize = 8;
        const NR: usize = 32;
        #[inline(always)]
        fn block(
            k: usize,
            panel: &[f32],
            b: &[f32],
            ldb: usize,
            j0: usize,
            c: &mut [f32],
            ldc: usize,
            mode: Accumulate<'_>,
        ) {
            let f = check(8, 32, k, panel, b, ldb, j0, c, ldc, mode);
            // SAFETY: bounds checked above; the caller (a task compiled for avx512f) only
            // exists when Isa::detect found the feature.
            unsafe { block_8x32(k, panel.as_ptr(), b.as_ptr().add(j0), ldb, c.as_mut_ptr().add(j0), ldc, f) }
        }
    }

    impl Kernel for Avx2 {
        const MR: usize = 4;
        const NR: usize = 16;
        #[inline(always)]
        fn block(
            k: usize,
            panel: &[f32],
            b: &[f32],
            ldb: usize,
            j0: usize,
            c: &mut [f32],
            ldc: usize,
            mode: Accumulate<'_>,
        ) {
            let f = check(4, 16, k, panel, b, ldb, j0, c, ldc, mode);
            // SAFETY: as for Avx512, with avx2 and fma.
            unsafe { block_4x16(k, panel.as_ptr(), b.as_ptr().add(j0), ldb, c.as_mut_ptr().add(j0), ldc, f) }
        }
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block_8x32(
        k: usize,
        panel: *const f32,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        f: *const f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; 8];
        for kk in 0..k {
            // SAFETY: `check` bounded every pointer below.
            unsafe {
                let bp = b.add(kk * ldb);
                let (b0, b1) = (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)));
                let ap = panel.add(kk * 8);
                for r in 0..8 {
                    let a = _mm512_set1_ps(*ap.add(r));
                    acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
                }
            }
        }
        for r in 0..8 {
            // SAFETY: `check` bounded the 8 rows of 32 values at `c` and the 8 factors at `f`.
            unsafe {
                let row = c.add(r * ldc);
                if !f.is_null() {
                    let fr = _mm512_set1_ps(*f.add(r));
                    acc[r][0] = _mm512_fmadd_ps(fr, _mm512_loadu_ps(row), acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(fr, _mm512_loadu_ps(row.add(16)), acc[r][1]);
                }
                _mm512_storeu_ps(row, acc[r][0]);
                _mm512_storeu_ps(row.add(16), acc[r][1]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block_4x16(
        k: usize,
        panel: *const f32,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        f: *const f32,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        for kk in 0..k {
            // SAFETY: `check` bounded every pointer below.
            unsafe {
                let bp = b.add(kk * ldb);
                let (b0, b1) = (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)));
                let ap = panel.add(kk * 4);
                for r in 0..4 {
                    let a = _mm256_set1_ps(*ap.add(r));
                    acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
                }
            }
        }
        for r in 0..4 {
            // SAFETY: `check` bounded the 4 rows of 16 values at `c` and the 4 factors at `f`.
            unsafe {
                let row = c.add(r * ldc);
                if !f.is_null() {
                    let fr = _mm256_set1_ps(*f.add(r));
                    acc[r][0] = _mm256_fmadd_ps(fr, _mm256_loadu_ps(row), acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(fr, _mm256_loadu_ps(row.add(8)), acc[r][1]);
                }
                _mm256_storeu_ps(row, acc[r][0]);
                _mm256_storeu_ps(row.add(8), acc[r][1]);
            }
        }
    }
}

/// Packs rows `rows` of a row-major matrix (row stride `ld`, `k` columns used) into the panel
/// format `gemm` reads: panel `p`, row `r`, column `kk` at `p·k·MR + kk·MR + r`. Rows past the end
/// of `src` are packed as zeros, so `m` may be rounded up to a multiple of `MR`.
#[inline(always)]
pub fn pack_panels(mr: usize, src: &[f32], ld: usize, rows: usize, k: usize, dst: &mut [f32]) {
    let m = rows.div_ceil(mr) * mr;
    for (p, panel) in dst[..m * k].chunks_exact_mut(k * mr).enumerate() {
        for r in 0..mr {
            let i = p * mr + r;
            if i < rows {
                let row = &src[i * ld..i * ld + k];
                for (kk, &x) in row.iter().enumerate() {
                    panel[kk * mr + r] = x;
                }
            } else {
                for kk in 0..k {
                    panel[kk * mr + r] = 0.0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_matches_naive_for_both_modes() {
        check_kernel::<Portable>();
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                check_kernel::<Avx2>();
            }
            if is_x86_feature_detected!("avx512f") {
                check_kernel::<Avx512>();
            }
        }
    }

    fn check_kernel<K: Kernel>() {
        let (m, n, k) = (2 * K::MR, 2 * K::NR, 5);
        let a: Vec<f32> = (0..m * k).map(|x| (x % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|x| (x % 5) as f32 * 0.5).collect();
        let mut panels = vec![f32::NAN; m * k];
        pack_panels(K::MR, &a, k, m, k, &mut panels);
        let naive = |i: usize, j: usize| (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum::<f32>();

        let mut c = vec![f32::NAN; m * n];
        gemm::<K>(m, n, k, &panels, &b, n, &mut c, n, Accumulate::Overwrite);
        for i in 0..m {
            for j in 0..n {
                assert_eq!(c[i * n + j], naive(i, j));
            }
        }
        let factors: Vec<f32> = (0..m).map(|i| i as f32).collect();
        let before = c.clone();
        gemm::<K>(m, n, k, &panels, &b, n, &mut c, n, Accumulate::ScaleRows(&factors));
        for i in 0..m {
            for j in 0..n {
                assert_eq!(c[i * n + j], factors[i] * before[i * n + j] + naive(i, j));
            }
        }
    }

    #[test]
    fn packing_pads_with_zeros() {
        let src = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 3 rows x 2
        let mut dst = [f32::NAN; 8];
        pack_panels(4, &src, 2, 3, 2, &mut dst);
        assert_eq!(dst, [1.0, 3.0, 5.0, 0.0, 2.0, 4.0, 6.0, 0.0]);
    }
}
