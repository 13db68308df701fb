//! The register-blocked micro-kernel behind both matrix products of a tile.
//!
//! Both `S = Q·Kᵀ` and `O += P·V` have the form `C = A·B` with `A` and `B` row-major and `B`
//! contiguous along `n` (so `Kᵀ` is packed once per head). A [`Kernel`] keeps an `MR × NR` block
//! of `C` in registers for the whole `k` loop: `MR` broadcast loads from `MR` rows of `A` and
//! `NR / lanes` vector loads of `B` feed `MR · NR / lanes` fused multiply-adds per step. `A` needs
//! no packing: a broadcast costs one load wherever its value lies.
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

/// Where one `MR × NR` block reads and writes: `A` and `C` start at the block's first row.
pub struct Block<'a> {
    /// Inner dimension.
    pub k: usize,
    /// `MR` rows of `A`, row stride `lda`.
    pub a: &'a [f32],
    /// Row stride of `A`.
    pub lda: usize,
    /// `k` rows of `B`, row stride `ldb`.
    pub b: &'a [f32],
    /// Row stride of `B`.
    pub ldb: usize,
    /// First column of the block in `B` and `C`.
    pub j0: usize,
    /// `MR` rows of `C`, row stride `ldc`.
    pub c: &'a mut [f32],
    /// Row stride of `C`.
    pub ldc: usize,
    /// Overwrite or scale-and-add, with this block's `MR` factors.
    pub mode: Accumulate<'a>,
}

/// An `MR × NR` register-blocked product.
pub trait Kernel {
    /// Rows of `C` per block.
    const MR: usize;
    /// Columns of `C` per block.
    const NR: usize;
    /// How the code around the kernel (the softmax) multiplies and adds: fused where the kernel
    /// is compiled with FMA.
    type Madd: super::exp::Madd;
    /// `C[r, j0 + c] ⊕= Σ_kk A[r, kk] · B[kk, j0 + c]` for `r < MR`, `c < NR`, `kk < k`.
    fn block(blk: Block<'_>);
}

/// `C (m × n, row stride ldc) ⊕= A (m × k, row stride lda) · B (k × n, row stride ldb)`, with `m`
/// a multiple of `MR` and `n` of `NR`.
#[inline(always)]
pub fn gemm<K: Kernel>(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    mode: Accumulate<'_>,
) {
    debug_assert!(m.is_multiple_of(K::MR) && n.is_multiple_of(K::NR));
    for i0 in (0..m).step_by(K::MR) {
        let mode = match mode {
            Accumulate::Overwrite => Accumulate::Overwrite,
            Accumulate::ScaleRows(f) => Accumulate::ScaleRows(&f[i0..i0 + K::MR]),
        };
        let (a, c) = (&a[i0 * lda..], &mut c[i0 * ldc..]);
        for j0 in (0..n).step_by(K::NR) {
            K::block(Block { k, a, lda, b, ldb, j0, c: &mut *c, ldc, mode });
        }
    }
}

/// Plain Rust, for CPUs without the x86 extensions below.
pub struct Portable;

impl Kernel for Portable {
    const MR: usize = 4;
    const NR: usize = 8;
    #[cfg(any(target_feature = "fma", target_arch = "aarch64"))]
    type Madd = super::exp::Fused;
    #[cfg(not(any(target_feature = "fma", target_arch = "aarch64")))]
    type Madd = super::exp::Unfused;
    #[inline(always)]
    fn block(blk: Block<'_>) {
        let Block { k, a, lda, b, ldb, j0, c, ldc, mode } = blk;
        let mut acc = [[0.0f32; 8]; 4];
        for (kk, brow) in b.chunks(ldb).take(k).enumerate() {
            let brow = &brow[j0..j0 + 8];
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = a[r * lda + kk];
                for (acc, y) in acc.iter_mut().zip(brow) {
                    *acc += x * y;
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
    use super::{Accumulate, Block, Kernel};
    use std::arch::x86_64::*;

    /// 8 × 32 with AVX-512: 16 of the 32 zmm registers accumulate.
    pub struct Avx512;
    /// 4 × 16 with AVX2 and FMA: 8 of the 16 ymm registers accumulate.
    pub struct Avx2;

    /// Raw pointers for the unsafe kernels, after checking the bounds of everything they touch.
    /// The factor pointer is null for overwrite.
    #[inline(always)]
    fn checked(
        blk: Block<'_>,
        mr: usize,
        nr: usize,
    ) -> (usize, *const f32, usize, *const f32, usize, *mut f32, usize, *const f32) {
        let Block { k, a, lda, b, ldb, j0, c, ldc, mode } = blk;
        assert!(k >= 1 && a.len() >= (mr - 1) * lda + k, "A block too short");
        assert!(b.len() >= (k - 1) * ldb + j0 + nr, "B tile too short");
        assert!(c.len() >= (mr - 1) * ldc + j0 + nr, "C block too short");
        let f = match mode {
            Accumulate::Overwrite => std::ptr::null(),
            Accumulate::ScaleRows(f) => {
                assert!(f.len() >= mr, "too few row factors");
                f.as_ptr()
            }
        };
        // SAFETY: j0 + nr is within b and c (asserted).
        unsafe { (k, a.as_ptr(), lda, b.as_ptr().add(j0), ldb, c.as_mut_ptr().add(j0), ldc, f) }
    }

    impl Kernel for Avx512 {
        const MR: usize = 8;
        const NR: usize = 32;
        type Madd = super::super::exp::Fused;
        #[inline(always)]
        fn block(blk: Block<'_>) {
            let (k, a, lda, b, ldb, c, ldc, f) = checked(blk, 8, 32);
            // SAFETY: bounds checked; a task compiled for avx512f runs only where Isa found it.
            unsafe { block_8x32(k, a, lda, b, ldb, c, ldc, f) }
        }
    }

    impl Kernel for Avx2 {
        const MR: usize = 4;
        const NR: usize = 16;
        type Madd = super::super::exp::Fused;
        #[inline(always)]
        fn block(blk: Block<'_>) {
            let (k, a, lda, b, ldb, c, ldc, f) = checked(blk, 4, 16);
            // SAFETY: as for Avx512, with avx2 and fma.
            unsafe { block_4x16(k, a, lda, b, ldb, c, ldc, f) }
        }
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block_8x32(
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        f: *const f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; 8];
        let rows: [*const f32; 8] = std::array::from_fn(|r| a.wrapping_add(r * lda));
        // Four steps of `k` per iteration: each row's address is formed once for four broadcasts
        // (at constant offsets), and the eight `B` loads of the four steps issue together.
        // One step at a time, address arithmetic took a third of the loop's instructions.
        let k4 = k - k % 4;
        for kk in (0..k4).step_by(4) {
            // SAFETY: `checked` bounded every pointer below (kk + 3 < k).
            unsafe {
                let bp = b.add(kk * ldb);
                let bs: [[__m512; 2]; 4] = std::array::from_fn(|u| {
                    let p = bp.add(u * ldb);
                    [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
                });
                for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                    let ap = row.add(kk);
                    for (u, b) in bs.iter().enumerate() {
                        let x = _mm512_set1_ps(*ap.add(u));
                        acc[0] = _mm512_fmadd_ps(x, b[0], acc[0]);
                        acc[1] = _mm512_fmadd_ps(x, b[1], acc[1]);
                    }
                }
            }
        }
        for kk in k4..k {
            // SAFETY: `checked` bounded every pointer below.
            unsafe {
                let bp = b.add(kk * ldb);
                let (b0, b1) = (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)));
                for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                    let x = _mm512_set1_ps(*row.add(kk));
                    acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
                }
            }
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `checked` bounded the 8 rows of 32 values at `c` and the 8 factors at `f`.
            unsafe {
                let row = c.add(r * ldc);
                if !f.is_null() {
                    let fr = _mm512_set1_ps(*f.add(r));
                    acc[0] = _mm512_fmadd_ps(fr, _mm512_loadu_ps(row), acc[0]);
                    acc[1] = _mm512_fmadd_ps(fr, _mm512_loadu_ps(row.add(16)), acc[1]);
                }
                _mm512_storeu_ps(row, acc[0]);
                _mm512_storeu_ps(row.add(16), acc[1]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block_4x16(
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        f: *const f32,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        let rows: [*const f32; 4] = std::array::from_fn(|r| a.wrapping_add(r * lda));
        // Two steps of `k` per iteration (as in `block_8x32`, where four fit the registers).
        let k2 = k - k % 2;
        for kk in (0..k2).step_by(2) {
            // SAFETY: `checked` bounded every pointer below (kk + 1 < k).
            unsafe {
                let bp = b.add(kk * ldb);
                let bs: [[__m256; 2]; 2] = std::array::from_fn(|u| {
                    let p = bp.add(u * ldb);
                    [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]
                });
                for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                    let ap = row.add(kk);
                    for (u, b) in bs.iter().enumerate() {
                        let x = _mm256_set1_ps(*ap.add(u));
                        acc[0] = _mm256_fmadd_ps(x, b[0], acc[0]);
                        acc[1] = _mm256_fmadd_ps(x, b[1], acc[1]);
                    }
                }
            }
        }
        for kk in k2..k {
            // SAFETY: `checked` bounded every pointer below.
            unsafe {
                let bp = b.add(kk * ldb);
                let (b0, b1) = (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)));
                for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                    let x = _mm256_set1_ps(*row.add(kk));
                    acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
                }
            }
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `checked` bounded the 4 rows of 16 values at `c` and the 4 factors at `f`.
            unsafe {
                let row = c.add(r * ldc);
                if !f.is_null() {
                    let fr = _mm256_set1_ps(*f.add(r));
                    acc[0] = _mm256_fmadd_ps(fr, _mm256_loadu_ps(row), acc[0]);
                    acc[1] = _mm256_fmadd_ps(fr, _mm256_loadu_ps(row.add(8)), acc[1]);
                }
                _mm256_storeu_ps(row, acc[0]);
                _mm256_storeu_ps(row.add(8), acc[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_matches_naive_in_both_modes() {
        check_kernel::<Portable>();
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                check_kernel::<Avx2>();
            } else {
                eprintln!(
                    "SKIPPED every_kernel_matches_naive_in_both_modes (avx2): this CPU lacks AVX2 and FMA"
                );
            }
            if is_x86_feature_detected!("avx512f") {
                check_kernel::<Avx512>();
            } else {
                eprintln!(
                    "SKIPPED every_kernel_matches_naive_in_both_modes (avx512): this CPU lacks AVX-512"
                );
            }
        }
    }

    /// Small integers, so every product and sum is exact whatever the order or fusion. Inner
    /// lengths 1..=9 cover the kernels' unrolled steps and every remainder after them.
    fn check_kernel<K: Kernel>() {
        for k in 1..=9 {
            check_kernel_at::<K>(k);
        }
    }

    fn check_kernel_at<K: Kernel>(k: usize) {
        let (m, n, lda) = (2 * K::MR, 2 * K::NR, 9);
        let a: Vec<f32> = (0..m * lda).map(|x| (x % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|x| (x % 5) as f32 * 0.5).collect();
        let naive = |i: usize, j: usize| (0..k).map(|kk| a[i * lda + kk] * b[kk * n + j]).sum::<f32>();

        let mut c = vec![f32::NAN; m * n];
        gemm::<K>(m, n, k, &a, lda, &b, n, &mut c, n, Accumulate::Overwrite);
        for i in 0..m {
            for j in 0..n {
                assert_eq!(c[i * n + j], naive(i, j), "k = {k}");
            }
        }
        let factors: Vec<f32> = (0..m).map(|i| i as f32).collect();
        let before = c.clone();
        gemm::<K>(m, n, k, &a, lda, &b, n, &mut c, n, Accumulate::ScaleRows(&factors));
        for i in 0..m {
            for j in 0..n {
                assert_eq!(c[i * n + j], factors[i] * before[i * n + j] + naive(i, j), "k = {k}");
            }
        }
    }
}
