//! Which Ampere/Ada specialisation runs a problem, with what launch, and whether it fits the device.
//! Pure host logic: testable (and tested against stated L4 and H100 limits) without a GPU.

use super::variant::Variant;
use crate::scores::KernelMask;
use crate::tensors::{check_alignment, check_paged_cache, check_supported_by};
use attn_core::{DType, DeviceLimits, KvRows, Launch, Problem, Result};

/// Head dimensions the kernel is specialised for.
pub const HEAD_DIMS: [usize; 5] = [32, 64, 96, 128, 256];

/// The largest head dim the family runs.
pub const MAX_HEAD_DIM: usize = 256;

/// The head dims whose kernels have padded variants (`ATTN_PAD`), so that head dims 8 to 56 take
/// 64, 72 to 120 take 128 and 136 to 248 take 256. Not 96, whose 12-chunk rows left no registers
/// for the padding's (its padded variants spilled 12 bytes with sequences under ptxas for sm_80,
/// and ran at 255 registers otherwise), nor 32 (a causal soft-capped variant with sequences
/// spilled 20 bytes for sm_90a).
pub const PADDED_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// The head dim of the kernel that runs head dim `d`: `d` itself where it is one of
/// [`HEAD_DIMS`], else (a multiple of 8 from 8 to [`MAX_HEAD_DIM`]) the next one of
/// [`PADDED_HEAD_DIMS`] above it, whose padded variant loads zeros past `d`; `None` for any other
/// head dim.
pub fn kernel_head_dim(d: usize) -> Option<usize> {
    crate::tensors::kernel_head_dim_of(d, &HEAD_DIMS, &PADDED_HEAD_DIMS)
}

impl Variant {
    /// Every specialisation the backend can choose, for the CI compile check: each mask (none,
    /// causal, window) with and without the soft-cap, each plain, with sequences, and with
    /// sequences and ALiBi (a dense problem with ALiBi runs the latter, its index arrays null);
    /// and at `plan::PADDED_HEAD_DIMS` each of these padded (`ATTN_PAD`) in its one configuration.
    pub fn all() -> Vec<Variant> {
        let mut v = vec![];
        for dtype in [DType::F16, DType::Bf16] {
            for head_dim in HEAD_DIMS {
                for mask in [KernelMask::None, KernelMask::Causal, KernelMask::Window] {
                    for softcap in [false, true] {
                        for (seqs, alibi) in [(false, false), (true, false), (true, true)] {
                            let window = mask == KernelMask::Window;
                            let extended = seqs || alibi;
                            let variant = |(warps, m_tiles, block_n, stages), pad| Variant {
                                dtype,
                                head_dim,
                                warps,
                                m_tiles,
                                block_n,
                                stages,
                                causal: mask == KernelMask::Causal,
                                window,
                                softcap,
                                seqs,
                                alibi,
                                pad,
                            };
                            for tiles in tile_candidates(head_dim, window, softcap, extended) {
                                v.push(variant(tiles, false));
                            }
                            if PADDED_HEAD_DIMS.contains(&head_dim) {
                                // The padded form of each combination, in its one tile configuration.
                                v.push(variant(padded_tiles(head_dim, window, softcap, extended), true));
                            }
                        }
                    }
                }
            }
        }
        v
    }
}

/// Tile configurations (warps, m-tiles per warp, keys per tile, K/V stages) for a head dim,
/// preferred first; a device takes the first that fits it.
///
/// - Two m-tiles per warp halve the shared-memory reads per matrix product (the first version,
///   one m-tile, measured 0.47-0.67x FlashAttention-2 on the H100, bound by those reads).
/// - Keys per tile are as many as the registers hold without a spill (CI checks every entry): at
///   D = 128 the second m-tile's accumulators (128 registers) leave room for 64 keys with no
///   register to spare; D = 96, whose 12-chunk rows need more address arithmetic, spills with 48
///   keys, or with two stages, under a causal mask.
/// - Two stages hide the K/V load latency behind a whole tile where shared memory allows (96 KB
///   at D = 128: within an L4's 99 KB).
/// - D = 256 keeps one m-tile (its accumulators alone are 128 registers) and 64 rows, so that
///   Q + K + V (96 KB) fit an L4's 99 KB.
///
/// The last entries are for devices with less shared memory.
pub fn candidates(head_dim: usize) -> &'static [(u32, u32, usize, u32)] {
    match head_dim {
        d if d > 128 => &[(4, 1, 64, 1), (4, 1, 32, 2), (4, 1, 32, 1)],
        d if d > 96 => &[(4, 2, 64, 2), (4, 2, 48, 2), (4, 2, 48, 1), (4, 2, 32, 1), (4, 1, 32, 1)],
        d if d > 64 => &[(4, 2, 32, 1), (4, 1, 32, 1)],
        _ => &[(4, 2, 64, 2), (4, 2, 64, 1), (4, 1, 32, 1)],
    }
}

/// [`candidates`] for a variant with a window or a soft-cap, whose extra live values (the first
/// key tile, the bounds; tanh's temporaries) push some configurations into spills on one
/// architecture or another (NVRTC 13, found by the CI compile check): D = 128 with a soft-cap
/// keeps only 32-key tiles (64 and 48 keys spilled 8-24 bytes), with a window alone drops 48
/// keys in one stage; D = 96 with either keeps one m-tile; D <= 64 with a window keeps only the
/// first (the one-stage and one-m-tile forms spilled 8-24 bytes of cold values on sm_90a or
/// sm_80). The others are [`candidates`]' own.
pub fn candidates_for(head_dim: usize, window: bool, softcap: bool) -> &'static [(u32, u32, usize, u32)] {
    match head_dim {
        d if d <= 64 && window => &candidates(head_dim)[..1],
        d if d > 128 || d <= 64 => candidates(head_dim),
        d if d > 96 && softcap => &[(4, 2, 32, 1), (4, 1, 32, 1)],
        d if d > 96 && window => &[(4, 2, 64, 2), (4, 2, 48, 2), (4, 2, 32, 1), (4, 1, 32, 1)],
        d if d <= 96 && (window || softcap) => &[(4, 1, 32, 1)],
        _ => candidates(head_dim),
    }
}

/// The tile configurations a variant may take: [`candidates_for`]; with sequences (and ALiBi,
/// `extended`) one only, so that CI compiles one more variant per combination rather than every
/// candidate again (it fits an L4's and an H100's shared memory; a device with less gets a typed
/// error for these problems). The first, except where the sequence lengths' registers made ptxas
/// spill on one architecture or another (NVRTC 13, sm_80, sm_89, sm_90a): D = 128 takes 32-key
/// tiles in one stage (64 keys spilled 8-104 bytes, 48 keys 80-96); D = 96 two m-tiles with a
/// window or a soft-cap, one without (each other choice spilled 12-56 bytes somewhere).
pub fn tile_candidates(
    head_dim: usize,
    window: bool,
    softcap: bool,
    extended: bool,
) -> Vec<(u32, u32, usize, u32)> {
    let all = candidates_for(head_dim, window, softcap);
    match (extended, head_dim) {
        (false, _) => all.to_vec(),
        (true, 97..=128) => vec![(4, 2, 32, 1)],
        (true, 65..=96) if window || softcap => vec![(4, 2, 32, 1)],
        (true, 65..=96) => vec![(4, 1, 32, 1)],
        (true, _) => all[..1].to_vec(),
    }
}

/// The one tile configuration of a padded variant (`ATTN_PAD`, a head dim that is not one of
/// [`HEAD_DIMS`]), so that CI compiles one more variant per combination rather than every
/// candidate again (a device with less shared memory than it needs gets a typed error for these
/// head dims): the first of [`tile_candidates`], except at D = 128, whose first configurations
/// (64 keys, two stages) spilled 8-28 bytes padded under a causal mask or a window (sm_80): 32
/// keys in one stage, as with sequences.
pub fn padded_tiles(head_dim: usize, window: bool, softcap: bool, extended: bool) -> (u32, u32, usize, u32) {
    match head_dim {
        128 => (4, 2, 32, 1),
        _ => tile_candidates(head_dim, window, softcap, extended)[0],
    }
}

/// What the plan says about `problem`'s sequences (nothing where it has none; ALiBi's note is
/// `crate::scores::notes`').
fn sequence_notes(problem: &Problem) -> Vec<String> {
    let b = problem.batching;
    let mut notes = vec![];
    if !b.is_dense() {
        let keys = match b.kv {
            KvRows::Dense => "dense keys".to_string(),
            KvRows::Packed { total } => format!("{total} packed key rows (cu_seqlens_k)"),
            KvRows::Paged { page_size, pages, .. } => {
                format!("a paged cache of {pages} pages of {page_size} keys (block table)")
            }
        };
        notes.push(format!(
            "sequences of their own lengths: {} queries, {keys}{}; the grid covers the longest sequence \
             (seq_q = {}) and blocks past a sequence's queries walk no key tile; masks align on each \
             sequence's own lengths",
            match b.q {
                attn_core::QueryRows::Dense => "dense".to_string(),
                attn_core::QueryRows::Packed { total } => format!("{total} packed (cu_seqlens_q)"),
            },
            if b.keys_used { ", per-sequence key counts (seqused_k)" } else { "" },
            problem.shape.seq_q
        ));
    }
    notes
}

/// Chooses the variant for `problem` on a device with `limits`, or says why none fits. `rank`
/// restricts the choice to the candidate of that rank (0 = preferred; the last one where the
/// list is shorter), so that tuning and tests can run every compiled configuration.
pub fn choose(
    problem: &Problem,
    limits: &DeviceLimits,
    rank: Option<usize>,
) -> Result<(Variant, Launch, Vec<String>)> {
    let s = problem.shape;
    let kernel_d = kernel_head_dim(s.head_dim);
    check_supported_by(problem, "cuda", kernel_d.is_some(), || {
        format!("multiples of 8 from 8 to {MAX_HEAD_DIM}")
    })?;
    let kernel_d = kernel_d.unwrap_or(s.head_dim);
    let pad = kernel_d != s.head_dim;
    check_alignment(problem)?;
    check_paged_cache(problem)?;
    let mut notes = vec![];
    let mut last_err = None;
    let mask = KernelMask::of(problem);
    let softcap = problem.params.softcap.is_some();
    let alibi = problem.params.alibi.is_some();
    let seqs = !problem.batching.is_dense() || alibi;
    let all = match pad {
        false => tile_candidates(s.head_dim, mask == KernelMask::Window, softcap, seqs || alibi),
        true => vec![padded_tiles(kernel_d, mask == KernelMask::Window, softcap, seqs || alibi)],
    };
    if pad {
        notes.push(format!(
            "head dim {} runs the D = {kernel_d} kernel padded (ATTN_PAD): Q, K and V load zeros in columns \
             {}..{kernel_d}, O is stored in its {} columns, the scale is the problem's",
            s.head_dim, s.head_dim, s.head_dim
        ));
    }
    let tried = match rank {
        None => &all[..],
        Some(r) => {
            let i = r.min(all.len() - 1);
            let c = all[i];
            notes.push(format!(
                "tiles forced to candidate {i}: {}x{}x{}x{} (warps x m-tiles x keys x stages)",
                c.0, c.1, c.2, c.3
            ));
            &all[i..=i]
        }
    };
    for &(warps, m_tiles, block_n, stages) in tried {
        let variant = Variant {
            dtype: problem.dtype,
            head_dim: kernel_d,
            warps,
            m_tiles,
            block_n,
            stages,
            causal: mask == KernelMask::Causal,
            window: mask == KernelMask::Window,
            softcap,
            seqs,
            alibi,
            pad,
        };
        let launch = variant.launch(problem);
        match launch.validate(&variant.name(), limits) {
            Ok(()) => {
                notes.extend(crate::scores::notes(problem, variant.block_m(), variant.block_n));
                notes.extend(sequence_notes(problem));
                if launch.needs_shared_optin(limits) {
                    notes.push(format!(
                        "{} B of shared memory: above the {} B default, uses the opt-in limit ({} B)",
                        launch.shared_bytes(),
                        limits.shared_per_block,
                        limits.shared_per_block_optin
                    ));
                }
                return Ok((variant, launch, notes));
            }
            Err(e) => {
                notes.push(format!("{} does not fit: {e}", variant.name()));
                last_err = Some(e);
            }
        }
    }
    Err(last_err.expect("at least one candidate"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::Error;
    use attn_core::Shape;

    fn problem(d: usize, dtype: DType) -> Problem {
        Problem::new(Shape::new(2, 16, 4096, d), dtype).causal()
    }

    #[test]
    fn every_head_dim_fits_an_l4_and_an_h100() {
        for d in HEAD_DIMS {
            for limits in [DeviceLimits::l4(), DeviceLimits::h100()] {
                let (v, launch, _) = choose(&problem(d, DType::Bf16), &limits, None).unwrap();
                assert!(
                    launch.shared_bytes() <= limits.shared_per_block_optin,
                    "{} on {}",
                    v.name(),
                    limits.name
                );
                assert_eq!(launch.grid, [32, 4096u32.div_ceil(v.block_m() as u32), 1]);
            }
        }
    }

    #[test]
    fn shared_memory_is_what_the_kernel_uses() {
        // D=128: Q 128x128 + 2 stages of K 64x128 and V 64x128, 2 bytes each = 96 KB: above
        // the L4's 48 KB default, within its 99 KB opt-in, and the plan says so.
        let (v, launch, notes) = choose(&problem(128, DType::F16), &DeviceLimits::l4(), None).unwrap();
        assert_eq!(v.shared_bytes(), 98304);
        assert_eq!(launch.threads_per_block(), 128);
        assert!(notes.iter().any(|n| n.contains("opt-in")), "{notes:?}");
        // D=64: Q 128x64 + 2 stages of K 64x64 and V 64x64 = 48 KB, within the default.
        let (v, _, notes) = choose(&problem(64, DType::F16), &DeviceLimits::l4(), None).unwrap();
        assert_eq!(v.shared_bytes(), 49152);
        assert!(!notes.iter().any(|n| n.contains("opt-in")), "{notes:?}");
        // D=256: 64 + 2*64 rows x 256 x 2 B = 96 KB, under the L4's 99 KB.
        let (v, _, _) = choose(&problem(256, DType::F16), &DeviceLimits::l4(), None).unwrap();
        assert_eq!(v.shared_bytes(), 98304);
    }

    #[test]
    fn a_device_without_the_optin_gets_smaller_tiles_or_a_clear_error() {
        let small = DeviceLimits { shared_per_block_optin: 40 * 1024, ..DeviceLimits::l4() };
        let (v, _, notes) = choose(&problem(128, DType::Bf16), &small, None).unwrap();
        assert_eq!((v.warps, v.m_tiles, v.block_n, v.stages), (4, 1, 32, 1));
        assert!(notes[0].contains("does not fit"), "{notes:?}");
        let err = choose(&problem(256, DType::Bf16), &small, None).unwrap_err().to_string();
        assert!(err.contains("shared memory per block") && err.contains("40960"), "{err}");
    }

    #[test]
    fn unsupported_inputs_are_typed_errors() {
        assert!(matches!(
            choose(&problem(128, DType::F32), &DeviceLimits::h100(), None),
            Err(Error::UnsupportedDType { .. })
        ));
        assert!(matches!(
            choose(&problem(84, DType::F16), &DeviceLimits::h100(), None),
            Err(Error::UnsupportedHeadDim { .. })
        ));
        for d in [0, 4, 12, 264, 512] {
            match choose(&problem(d, DType::F16), &DeviceLimits::h100(), None) {
                Err(Error::UnsupportedHeadDim { supported, .. }) => {
                    assert!(supported.contains("multiples of 8"), "{supported}")
                }
                // A zero head dim is the problem's own error.
                Err(_) if d == 0 => {}
                other => panic!("head dim {d}: {other:?}"),
            }
        }
        let odd =
            Problem::new(Shape::new(1, 2, 100, 64), DType::F16).with_strides(attn_core::TensorStrides {
                q: attn_core::Strides { batch: 2 * 100 * 68, head: 100 * 68, seq: 68 },
                ..Problem::new(Shape::new(1, 2, 100, 64), DType::F16).strides
            });
        let err = choose(&odd, &DeviceLimits::h100(), None).unwrap_err().to_string();
        assert!(err.contains("multiple of 8 elements"), "{err}");
    }

    #[test]
    fn a_rank_picks_that_candidate_or_the_last() {
        let h100 = DeviceLimits::h100();
        let (v, _, notes) = choose(&problem(128, DType::Bf16), &h100, Some(3)).unwrap();
        assert_eq!((v.warps, v.m_tiles, v.block_n, v.stages), (4, 2, 32, 1));
        assert!(notes[0].contains("candidate 3"), "{notes:?}");
        let (v, _, _) = choose(&problem(64, DType::Bf16), &h100, Some(5)).unwrap();
        assert_eq!((v.warps, v.m_tiles, v.block_n, v.stages), *candidates(64).last().unwrap());
    }

    #[test]
    fn windows_and_soft_caps_plan_compiled_variants() {
        let all = Variant::all();
        for d in HEAD_DIMS {
            let p = Problem::new(Shape::new(1, 8, 2048, d), DType::F16);
            let masks = [p, p.causal(), p.with_window(Some(256), Some(0)), p.with_window(Some(4), Some(9))];
            for m in masks.into_iter().flat_map(|m| [m, m.with_softcap(5.0)]) {
                for limits in [DeviceLimits::l4(), DeviceLimits::h100()] {
                    let (v, launch, notes) = choose(&m, &limits, None).unwrap();
                    assert!(all.contains(&v), "{} for {m} is not compiled in CI", v.name());
                    assert_eq!(
                        (v.window, v.softcap),
                        (!m.params.mask.is_prefix(), m.params.softcap.is_some())
                    );
                    // A window keeps the plain grid order (its blocks see about as many keys each).
                    assert_eq!(
                        launch.grid[1] as usize,
                        if v.causal { 2048usize.div_ceil(v.block_m()) } else { 8 }
                    );
                    assert_eq!(notes.iter().any(|n| n.contains("sliding window")), v.window, "{notes:?}");
                }
            }
        }
    }

    #[test]
    fn sequences_and_alibi_plan_compiled_variants() {
        use attn_core::sequences::{KeyStore, batch_of};
        let all = Variant::all();
        for d in HEAD_DIMS {
            let shape = Shape { heads_kv: 2, ..Shape::new(1, 4, 1, d) };
            let stores = [KeyStore::Packed, KeyStore::Paged { page_size: 32, seed: 1 }, KeyStore::DenseUsed];
            for keys in stores {
                let (p, _) = batch_of(shape, DType::Bf16, &[5, 300, 1], &[9, 300, 700], keys);
                let alibi =
                    Problem::new(Shape::new(2, 4, 100, d), DType::F16).with_alibi(attn_core::Alibi::PerHead);
                let masks = [p, p.causal(), p.with_window(Some(64), Some(0)), p.with_softcap(5.0), alibi];
                for m in masks.into_iter().flat_map(|m| [m, m.with_alibi(attn_core::Alibi::PerBatchHead)]) {
                    for limits in [DeviceLimits::l4(), DeviceLimits::h100()] {
                        let (v, launch, notes) = choose(&m, &limits, None).unwrap();
                        assert!(all.contains(&v), "{} for {m} is not compiled in CI", v.name());
                        let alibi = m.params.alibi.is_some();
                        assert!(v.seqs && v.alibi == alibi, "{}", v.name());
                        // The grid covers the longest sequence of every batch entry.
                        let rows = m.shape.seq_q.div_ceil(v.block_m()) as u32;
                        assert!(launch.grid.contains(&rows), "{:?}", launch.grid);
                        assert_eq!(notes.iter().any(|n| n.contains("ALiBi")), alibi, "{notes:?}");
                        let seqs = notes.iter().any(|n| n.contains("sequences of their own lengths"));
                        assert_eq!(seqs, !m.batching.is_dense(), "{notes:?}");
                    }
                }
                let (v, _, _) = choose(&p, &DeviceLimits::h100(), None).unwrap();
                assert!(v.seqs && !v.alibi && all.contains(&v), "{}", v.name());
            }
        }
    }

    #[test]
    fn pages_that_are_not_a_multiple_of_16_keys_are_a_typed_error() {
        use attn_core::sequences::{KeyStore, batch_of};
        let shape = Shape::new(1, 2, 1, 64);
        let (p, _) =
            batch_of(shape, DType::F16, &[1, 1], &[40, 7], KeyStore::Paged { page_size: 8, seed: 2 });
        match choose(&p, &DeviceLimits::h100(), None) {
            Err(Error::Unsupported { what, .. }) => assert!(what.contains("multiples of 16"), "{what}"),
            other => panic!("{other:?}"),
        }
        let (p, _) =
            batch_of(shape, DType::F16, &[1, 1], &[40, 7], KeyStore::Paged { page_size: 48, seed: 2 });
        assert!(choose(&p, &DeviceLimits::h100(), None).is_ok());
    }

    #[test]
    fn every_multiple_of_8_runs_a_padded_variant_of_the_next_kernel_head_dim() {
        assert_eq!(kernel_head_dim(8), Some(64));
        assert_eq!(kernel_head_dim(32), Some(32));
        assert_eq!(kernel_head_dim(40), Some(64));
        assert_eq!(kernel_head_dim(64), Some(64));
        assert_eq!(kernel_head_dim(136), Some(256));
        assert_eq!(kernel_head_dim(80), Some(128));
        assert_eq!(kernel_head_dim(96), Some(96));
        assert_eq!(kernel_head_dim(20), None);
        assert_eq!(kernel_head_dim(264), None);
        let all = Variant::all();
        for d in (8..=MAX_HEAD_DIM).step_by(8) {
            let p = Problem::new(Shape { heads_kv: 2, ..Shape::new(1, 8, 300, d) }, DType::Bf16);
            let masks = [p, p.causal(), p.with_window(Some(64), Some(0)), p.with_softcap(5.0)];
            for m in masks.into_iter().flat_map(|m| [m, m.with_alibi(attn_core::Alibi::PerHead)]) {
                for limits in [DeviceLimits::l4(), DeviceLimits::h100()] {
                    let (v, _, notes) = choose(&m, &limits, None).unwrap();
                    assert!(all.contains(&v), "{} for {m} is not compiled in CI", v.name());
                    assert_eq!(v.head_dim, kernel_head_dim(d).unwrap());
                    assert_eq!(v.pad, !HEAD_DIMS.contains(&d), "{}", v.name());
                    assert_eq!(notes.iter().any(|n| n.contains("padded (ATTN_PAD)")), v.pad, "{notes:?}");
                }
            }
        }
    }

    #[test]
    fn every_variant_has_a_distinct_name() {
        let all = Variant::all();
        let mut names: Vec<String> = all.iter().map(|v| v.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }
}
