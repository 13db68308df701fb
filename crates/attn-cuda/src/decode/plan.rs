//! When the decode family runs a problem, with what variant, split count and launch, and whether
//! it fits the device. Pure host logic, tested without a GPU against stated L4 and H100 limits.

use super::variant::{Variant, WARPS};
use crate::tensors::{check_alignment, check_supported_by};
use attn_core::{DType, DeviceLimits, Error, Feature, KvRows, Launch, Mask, Problem, Result};

/// Head dimensions the kernel is specialised for: the common ones (80 and 96 as Phi-2 and
/// Phi-3-mini have them); the other multiples of 8 up to 256 run on the next of these, padded
/// ([`kernel_head_dim`], [`Variant::pad`]). D = 80 on its own build reads K/V 1.14x faster than
/// padded on the 128 build (h100-decode-native.json against h100-decode-pad.json).
pub const HEAD_DIMS: [usize; 5] = [64, 80, 96, 128, 256];

/// The kernel head dim that runs head dim `d`: the smallest of [`HEAD_DIMS`] at least `d`, for a
/// multiple of 8 up to 256; `None` for the others.
pub fn kernel_head_dim(d: usize) -> Option<usize> {
    crate::tensors::kernel_head_dim_of(d, &HEAD_DIMS, &HEAD_DIMS)
}

/// The features beyond a dense, plain or causal softmax that the family runs.
pub const FEATURES: [Feature; 7] = Feature::ALL;

/// Keys per page of a paged cache: a multiple of this (every chunk size divides 32 and starts
/// on a multiple of itself, so a chunk lies in at most two pages).
pub const PAGE_MULTIPLE: usize = 16;

/// Whether `problem` needs the extras variant ([`Variant::extras`]): packed sequences,
/// per-sequence key counts, a paged cache, a soft-cap or ALiBi.
pub fn needs_extras(problem: &Problem) -> bool {
    problem.features().iter().any(|f| *f != Feature::Window)
}

/// The most query rows per GQA group (`heads_q / heads_kv · seq_q`) the family takes: up to 64
/// rows a CTA holds them in one or a few row blocks (at D = 128, two of 32), each reading the
/// K/V head once per split; past that the prefill kernels' 64- to 192-row tiles are full and
/// read K/V once per tile, as this family would.
pub const MAX_ROWS: usize = 64;

/// The most splits of one (sequence, KV head, row block): the merging CTA reads this many
/// partial rows and its weights fill `block_m · MAX_SPLITS` floats of shared memory.
pub const MAX_SPLITS: u32 = 128;

/// The fewest key chunks a split takes: two per warp, so that each warp's copy ring has a
/// chunk in flight while it computes one.
pub const MIN_CHUNKS_PER_SPLIT: u64 = 2 * WARPS as u64;

/// A split count within this fraction of the best wave efficiency is taken if it is smaller
/// (FlashAttention's rule for split-KV, which takes 85%: fewer splits, less merging). On the
/// H100 a full wave was 1.5% faster than 0.88 of one (33 splits against 29 at 128k keys), and
/// 128 splits 3% slower: the merge costs little, an idle SM more.
pub const WAVE_EFFICIENCY: f64 = 0.95;

/// 16-row tiles a CTA holds at most: the f32 accumulators (`block_m · D / 32` per lane) stay
/// at or under 128 registers.
pub fn max_m_tiles(head_dim: usize) -> u32 {
    if head_dim > 128 { 1 } else { 2 }
}

/// Tile configurations (keys per chunk, ring stages) of a head dim, preferred first; a device
/// takes the first that fits its shared memory (the last ones fit an L4's 99 KB).
///
/// Measured on the H100 (bench/device/decode-explore.sh, at 16d50f8): at D = 128, chunks of 32
/// keys in two stages (140 KB then, one CTA per SM; 132 KB since the rings' rows are swizzled
/// instead of padded) read K/V 1-3% faster than 16 keys in three (two CTAs per SM), and 16 keys
/// in four or two stages were no faster; the L2 prefetch hint ([`L2_PREFETCH`]) added 1-2% to
/// either then, on padded rows, and costs 5-7% on swizzled ones (H200). Two row tiles at
/// D = 128 keep 16-key chunks: with 32, the masked kernel spills (its S and O accumulators and P
/// take every register). At D = 80 and 96 the fallbacks for smaller devices (an L4 fits neither's
/// first) are those ptxas compiles without a spill on sm_80 to sm_90a: 16-key chunks in two
/// stages spilled 8-16 bytes, in three at D = 96 8, 32-key chunks in one stage at D = 80 8.
pub fn candidates(head_dim: usize, m_tiles: u32) -> &'static [(usize, u32)] {
    match head_dim {
        d if d <= 64 => &[(32, 3), (32, 2)],
        80 if m_tiles == 1 => &[(32, 2), (16, 3)],
        96 if m_tiles == 1 => &[(32, 2), (32, 1)],
        80 | 96 => &[(16, 3)],
        d if d <= 128 && m_tiles == 1 => &[(32, 2), (16, 2)],
        d if d <= 128 => &[(16, 3), (16, 2)],
        _ => &[(16, 3), (16, 2), (16, 1)],
    }
}

/// Tiles forced by `ATTN_CUDA_DECODE_TILES`: keys per chunk, ring stages, the L2 prefetch hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    /// Keys per chunk, a multiple of 16.
    pub block_n: usize,
    /// Chunks in each warp's ring, at least 1.
    pub stages: u32,
    /// [`Variant::l2_prefetch`].
    pub l2_prefetch: bool,
}

/// Whether K/V copies carry the L2 256-byte prefetch hint by default: no. It was measured 1-2%
/// faster at D = 128 on the H100 (see [`candidates`]) while the rings' rows were padded; with
/// swizzled rows the copies without it stream 5-7% faster (H200, 0.93-0.95x cuDNN with the hint,
/// 0.98-1.01x without, `bench/results/h200-decode-swizzle.json`), as a bare copy of K/V into
/// shared memory does (`bench/device/stream_probe.cu`: 4.27 against 4.66 TB/s).
pub const L2_PREFETCH: bool = false;

/// How the launch cuts a problem: the query rows of a group into row blocks, the keys into
/// splits, one CTA per (split, row block, KV head, sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// Splits of each row block's keys.
    pub splits: u32,
    /// Row blocks per GQA group.
    pub row_blocks: u32,
    /// (sequence, KV head, row block) triples: `batch · heads_kv · row_blocks`.
    pub pairs: u32,
    /// Chunks of `block_n` keys the rows of a group see.
    pub chunks: u64,
    /// CTAs launched: `pairs · splits`, or fewer with the persistent form, each taking pairs in
    /// turn ([`persistent`]).
    pub ctas: u32,
}

impl Split {
    /// The launch's u32 tickets, zero before and after it: one per pair, where there are
    /// several splits.
    pub fn counters(&self) -> usize {
        if self.splits > 1 { self.pairs as usize } else { 0 }
    }

    /// The f32s of partial results: each split's normalised o and LSE per row, where there are
    /// several splits.
    pub fn partial_floats(&self, variant: &Variant) -> usize {
        match self.splits {
            0 | 1 => 0,
            s => self.pairs as usize * s as usize * variant.block_m() * (variant.head_dim + 1),
        }
    }

    /// The device memory a launch holds beyond the tensors, as the plan's memory note ends.
    pub fn workspace(&self, variant: &Variant) -> String {
        match self.partial_floats(variant) {
            0 => "; no workspace (one split)".into(),
            n => format!(
                ", the split partial results ({} B) and tickets ({} B), once per stream",
                4 * n,
                4 * self.counters()
            ),
        }
    }
}

/// What the knobs force on the decode plan (`Options`: `ATTN_CUDA_DECODE_SPLITS`,
/// `ATTN_CUDA_DECODE_TILES`, `ATTN_CUDA_DECODE_PERSIST`); the default forces nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forced {
    /// The split count (clamped to 1 .. [`MAX_SPLITS`]).
    pub splits: Option<u32>,
    /// The chunk, stages and hint.
    pub tiles: Option<Tiles>,
    /// The persistent form: off, or on wherever the variant has it, with at most this many CTAs
    /// (`u32::MAX`: as many as the device holds at once).
    pub persist: Option<Persist>,
}

/// [`Forced::persist`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persist {
    /// One CTA per (split, sequence, KV head, row block) item.
    Off,
    /// The persistent form wherever a variant has it, on at most this many CTAs.
    On(u32),
}

/// Whether `variant` has the persistent form ([`Variant::persist`]): plain and unmasked (every
/// item's keys alike), one row tile and 32-key chunks (a warp's merge area, `block_m · (D + 2)`
/// f32s, fits in the ring chunk it folded last).
pub fn has_persistent_form(variant: &Variant) -> bool {
    !variant.masked && !variant.extras && variant.m_tiles == 1 && variant.block_n == 32
}

/// The CTAs of the persistent form for `items` (sequence, KV head, row block) items of one
/// split, where it is taken: by default where the items outnumber what the device holds at once
/// (`slots`) and the head dim is at most [`PERSISTENT_MAX_HEAD_DIM`]. Launched one CTA per item,
/// a CTA spends a fixed time (about 1.3-1.5 µs on an H200) filling its warps' copy rings at its
/// start and draining them at its end, 2-5% of a 1-2 MB item; the persistent CTAs' rings run on
/// from one item into the next. `None`: one CTA per item.
pub fn persistent(
    variant: &Variant,
    items: u64,
    splits: u32,
    slots: u64,
    forced: Option<Persist>,
) -> Option<u32> {
    // The kernel counts items in an int.
    if !has_persistent_form(variant) || splits != 1 || items > i32::MAX as u64 {
        return None;
    }
    match forced {
        Some(Persist::Off) => None,
        Some(Persist::On(cap)) => Some(items.min(slots).min(cap.max(1) as u64) as u32),
        None => (items > slots && variant.head_dim <= PERSISTENT_MAX_HEAD_DIM).then_some(slots as u32),
    }
}

/// The largest head dim that takes the persistent form by default. Measured on an H200
/// (`bench/results/h200-decode-persistent.json`, interleaved with one CTA per item and cuDNN):
/// D = 64 (three-stage rings, two CTAs an SM), batch 128 × 8 KV heads at 4k keys, 0.973 → 0.995x
/// and 0.979 → 0.988x cuDNN in two calls; D = 128 (two-stage rings) 0.6-1.7% slower on 6 of the 7
/// multi-wave rows (8 MB items too, whose CTAs change items once: a cost per chunk, not per item),
/// so it keeps one CTA per item; D = 80 and 96 not timed. `ATTN_CUDA_DECODE_PERSIST=on` takes the
/// form at any head dim that has it.
pub const PERSISTENT_MAX_HEAD_DIM: usize = 64;

/// Why the family does not take `problem`, or `Ok` where it does.
pub fn applies(problem: &Problem) -> Result<()> {
    let s = problem.shape;
    check_supported_by(problem, "cuda decode", kernel_head_dim(s.head_dim).is_some(), || {
        format!("multiples of 8 from 8 to 256 ({HEAD_DIMS:?} natively, the others padded)")
    })?;
    check_alignment(problem)?;
    problem.require_features("cuda decode", &FEATURES)?;
    if let KvRows::Paged { page_size, .. } = problem.batching.kv
        && (page_size == 0 || page_size % PAGE_MULTIPLE != 0)
    {
        return Err(Error::Unsupported {
            backend: "cuda decode".into(),
            what: format!(
                "a paged KV cache of {page_size}-key pages: the decode kernel takes pages of a multiple of \
                 {PAGE_MULTIPLE} keys (a key chunk then lies in at most two pages)"
            ),
        });
    }
    let rows = s.heads_q / s.heads_kv * s.seq_q;
    if s.heads_q == s.heads_kv && kernel_head_dim(s.head_dim) != Some(s.head_dim) {
        return Err(Error::Unsupported {
            backend: "cuda decode".into(),
            what: format!(
                "D={} without GQA: a padded head dim's rows on the decode kernel are one of its 16 a head, and \
                 the prefill families read such heads as fast or faster (H100, D=80 padded to 128 at 8 x 8k \
                 keys: 1.16x faster)",
                s.head_dim
            ),
        });
    }
    if rows > MAX_ROWS || s.seq_q == 0 || s.seq_k == 0 {
        return Err(Error::Unsupported {
            backend: "cuda decode".into(),
            what: format!(
                "{} query rows per GQA group ({} heads x {} queries): the decode family takes 1 to {MAX_ROWS}",
                rows,
                s.heads_q / s.heads_kv,
                s.seq_q
            ),
        });
    }
    Ok(())
}

/// The kernel's window bounds (keys before and after the diagonal a row sees), with
/// "unbounded" as `seq_k + seq_q`, which no row's window reaches past; `None` without a mask.
pub fn window(problem: &Problem) -> Option<(i32, i32)> {
    let s = problem.shape;
    let unbounded = (s.seq_k + s.seq_q).min(i32::MAX as usize / 4);
    let bound = |b: Option<usize>| b.map_or(unbounded, |x| x.min(unbounded)) as i32;
    match problem.params.mask {
        Mask::None => None,
        Mask::Causal => Some((unbounded as i32, 0)),
        Mask::Window { left, right } => Some((bound(left), bound(right))),
    }
}

/// Keys some query row of the group sees: `[lo, hi)` (the kernel's for a row block holding
/// every query).
pub fn key_range(problem: &Problem) -> (usize, usize) {
    let s = problem.shape;
    match window(problem) {
        None => (0, s.seq_k),
        Some((left, right)) => {
            let shift = s.seq_k as i64 - s.seq_q as i64;
            let lo = (shift - left as i64).max(0);
            let hi = (s.seq_q as i64 - 1 + shift + right as i64 + 1).clamp(0, s.seq_k as i64);
            (lo as usize, (hi as usize).max(lo as usize))
        }
    }
}

/// The split count for `pairs` CTAs' worth of rows over `chunks` chunks, in waves of `wave`
/// CTAs (the plan passes the SM count, one CTA per SM, not the CTAs an SM could hold at once:
/// splitting further to fill a second CTA slot per SM was slower on every H100 row tried, 2-20%,
/// in docs/experiments.md). 1 where the pairs fill 80% of a wave; else the fewest splits within
/// [`WAVE_EFFICIENCY`] of the best wave efficiency, each split at least
/// [`MIN_CHUNKS_PER_SPLIT`] chunks, at most [`MAX_SPLITS`].
pub fn splits_for(pairs: u64, chunks: u64, wave: u64) -> u32 {
    let most = (chunks / MIN_CHUNKS_PER_SPLIT).clamp(1, MAX_SPLITS as u64);
    if pairs * 5 >= wave * 4 || most == 1 {
        return 1;
    }
    let efficiency = |s: u64| {
        let n = pairs * s;
        n as f64 / (n.div_ceil(wave) * wave) as f64
    };
    let best = (1..=most).map(efficiency).fold(0.0, f64::max);
    (1..=most).find(|&s| efficiency(s) >= WAVE_EFFICIENCY * best).unwrap_or(1) as u32
}

/// CTAs of `variant` an SM holds at once, by shared memory (the per-SM pool is the per-block
/// opt-in limit plus the 1 KB the driver reserves per block), at most 4.
pub fn ctas_per_sm(variant: &Variant, limits: &DeviceLimits) -> u32 {
    let per_block = variant.shared_bytes() + Variant::STATIC_SHARED + 1024;
    ((limits.shared_per_block_optin + 1024) / per_block).clamp(1, 4)
}

impl Variant {
    /// Every specialisation the backend can choose, for the CI compile check.
    pub fn all() -> Vec<Variant> {
        let mut v = vec![];
        for dtype in [DType::F16, DType::Bf16] {
            for head_dim in HEAD_DIMS {
                // Padded head dims come with the extras (Variant::pad).
                for (masked, extras, pad) in [
                    (false, false, false),
                    (true, false, false),
                    (false, true, false),
                    (true, true, false),
                    (false, true, true),
                    (true, true, true),
                ] {
                    for m_tiles in 1..=max_m_tiles(head_dim) {
                        for &(block_n, stages) in candidates(head_dim, m_tiles) {
                            let l2_prefetch = L2_PREFETCH;
                            let one = Variant {
                                dtype,
                                head_dim,
                                m_tiles,
                                block_n,
                                stages,
                                masked,
                                l2_prefetch,
                                extras,
                                pad,
                                persist: false,
                            };
                            v.push(one);
                            if has_persistent_form(&one) {
                                v.push(Variant { persist: true, ..one });
                            }
                        }
                    }
                }
            }
        }
        v
    }

    /// The launch: a CTA per (split, row block · KV head, sequence), or the persistent form's
    /// `split.ctas` in a row.
    pub fn launch(&self, problem: &Problem, split: &Split) -> Launch {
        let s = problem.shape;
        Launch {
            grid: match self.persist {
                true => [split.ctas, 1, 1],
                false => [split.splits, (s.heads_kv as u32).saturating_mul(split.row_blocks), s.batch as u32],
            },
            block: [self.threads(), 1, 1],
            dynamic_shared_bytes: self.shared_bytes(),
            static_shared_bytes: Variant::STATIC_SHARED,
            registers_per_thread: None,
            spill_bytes: None,
        }
    }
}

/// Chooses the variant, split and launch for `problem` on a device with `limits` and `sms`
/// multiprocessors, or says why the family cannot run it. `forced_splits` (the
/// `ATTN_CUDA_DECODE_SPLITS` knob) replaces the chosen split count (clamped to 1 ..
/// [`MAX_SPLITS`]); `forced_tiles` (`ATTN_CUDA_DECODE_TILES`) the chunk, stages and hint.
pub fn choose(
    problem: &Problem,
    limits: &DeviceLimits,
    sms: u32,
    forced: &Forced,
) -> Result<(Variant, Launch, Split, Vec<String>)> {
    let (forced_splits, forced_tiles, forced_persist) = (forced.splits, forced.tiles, forced.persist);
    applies(problem)?;
    let s = problem.shape;
    let group = s.heads_q / s.heads_kv;
    let rows = group * s.seq_q;
    let kernel_d = kernel_head_dim(s.head_dim).unwrap_or(s.head_dim);
    let pad = kernel_d != s.head_dim;
    let m_tiles = (rows.div_ceil(16) as u32).min(max_m_tiles(kernel_d));
    let block_m = 16 * m_tiles as usize;
    let row_blocks = rows.div_ceil(block_m) as u32;
    let (lo, hi) = key_range(problem);
    let forced = forced_tiles.map(|t| [(t.block_n, t.stages)]);
    let tried: &[(usize, u32)] = match &forced {
        Some(one) => one,
        None => candidates(kernel_d, m_tiles),
    };
    let pairs = s.batch as u64 * s.heads_kv as u64 * row_blocks as u64;
    let mut last_err = None;
    let mut notes = vec![];
    for &(bn, stages) in tried {
        let chunks = (hi - lo).div_ceil(bn) as u64;
        let variant = Variant {
            dtype: problem.dtype,
            head_dim: kernel_d,
            m_tiles,
            block_n: bn,
            stages,
            masked: window(problem).is_some(),
            l2_prefetch: forced_tiles.map_or(L2_PREFETCH, |t| t.l2_prefetch),
            extras: needs_extras(problem) || pad,
            pad,
            persist: false,
        };
        if variant.extras && bn > 32 {
            last_err = Some(Error::InvalidParameter {
                what: format!(
                    "{}: chunks of {bn} keys; with per-sequence key counts, pages, a soft-cap or ALiBi the \
                     decode kernel takes 16 or 32",
                    variant.name()
                ),
            });
            continue;
        }
        let splits = match forced_splits {
            Some(n) => n.clamp(1, MAX_SPLITS),
            None => splits_for(pairs, chunks, sms.max(1) as u64),
        };
        // The persistent form where its second Q buffer fits too (else one CTA per item).
        let with_form = Variant { persist: true, ..variant };
        let form_fits = with_form.shared_bytes() + Variant::STATIC_SHARED <= limits.shared_per_block_optin;
        let persist_slots = sms.max(1) as u64 * ctas_per_sm(&with_form, limits) as u64;
        let ctas = persistent(&variant, pairs, splits, persist_slots, forced_persist).filter(|_| form_fits);
        let variant = Variant { persist: ctas.is_some(), ..variant };
        let per_sm = ctas_per_sm(&variant, limits);
        let slots = sms.max(1) as u64 * per_sm as u64;
        let pairs_u32 = pairs.min(u32::MAX as u64) as u32;
        let ctas = ctas.unwrap_or(pairs_u32.saturating_mul(splits));
        let split = Split { splits, row_blocks, pairs: pairs_u32, chunks, ctas };
        let launch = variant.launch(problem, &split);
        if let Err(e) = launch.validate(&variant.name(), limits) {
            notes.push(format!("{} does not fit: {e}", variant.name()));
            last_err = Some(e);
            continue;
        }
        let items = pairs * splits as u64;
        notes.push(format!(
            "decode (split-KV): the {rows} query rows of each GQA group ({group} heads x {} queries) in {row_blocks} \
             block(s) of {block_m}, so each K/V byte is read {row_blocks} time(s); chosen because {rows} <= {MAX_ROWS} rows",
            s.seq_q
        ));
        notes.push(format!(
            "{WARPS} warps per CTA, each walking its own chunks of {bn} keys through a {stages}-stage cp.async ring{}{}",
            if variant.l2_prefetch { " (L2 256-byte prefetch hint)" } else { "" },
            if forced_tiles.is_some() { " (forced by ATTN_CUDA_DECODE_TILES)" } else { "" }
        ));
        notes.push(format!(
            "{splits} split(s){} of {} keys ({chunks} chunks): {pairs} (sequence, KV head, row block) x {splits} = {items} {}, \
             {per_sm} per SM on {sms} SMs = {:.2} waves",
            if forced_splits.is_some() { " (forced by ATTN_CUDA_DECODE_SPLITS)" } else { "" },
            hi - lo,
            if variant.persist { "items" } else { "CTAs" },
            items as f64 / slots as f64
        ));
        if variant.persist {
            notes.push(format!(
                "persistent{}: {} CTAs take the items in turn, each warp's copy ring running on from one item's keys \
                 into the next's (a CTA an item filled and drained its rings each time)",
                if forced_persist.is_some() { " (forced by ATTN_CUDA_DECODE_PERSIST)" } else { "" },
                split.ctas
            ));
        }
        notes.push(match splits {
            1 => "one split: o and the LSE are written directly".into(),
            _ => "the last CTA of each (sequence, KV head, row block) merges the splits by LSE, in split order \
                  (deterministic)"
                .into(),
        });
        if pad {
            notes.push(format!(
                "head dim {} on the D={kernel_d} kernel: the columns past {} are zeros in shared memory, neither \
                 loaded nor stored",
                s.head_dim, s.head_dim
            ));
        }
        if let Some((left, right)) = window(problem) {
            notes.push(format!(
                "mask: each row sees keys [i + {} - {left}, i + {} + {right}] (bottom-right)",
                s.seq_k as i64 - s.seq_q as i64,
                s.seq_k as i64 - s.seq_q as i64
            ));
        }
        return Ok((variant, launch, split, notes));
    }
    Err(last_err.expect("at least one candidate"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::Shape;
    use attn_core::sequences::{KeyStore, batch_of};

    fn decode(batch: usize, hq: usize, hkv: usize, sq: usize, sk: usize, d: usize) -> Problem {
        Problem::new(
            Shape { heads_kv: hkv, seq_q: sq, seq_k: sk, ..Shape::new(batch, hq, 1, d) },
            DType::Bf16,
        )
    }

    #[test]
    fn the_rule_takes_short_groups_only() {
        assert!(applies(&decode(1, 32, 8, 1, 4096, 128)).is_ok());
        assert!(applies(&decode(1, 32, 8, 8, 4096, 128)).is_ok());
        assert!(applies(&decode(1, 32, 32, 16, 4096, 128)).is_ok());
        let err = applies(&decode(1, 32, 4, 9, 4096, 128)).unwrap_err().to_string();
        assert!(err.contains("72 query rows"), "{err}");
        assert!(applies(&decode(1, 8, 2, 1, 64, 96)).is_ok());
        assert!(matches!(applies(&decode(1, 8, 8, 1, 64, 100)), Err(Error::UnsupportedHeadDim { .. })));
        assert!(matches!(applies(&decode(1, 8, 8, 1, 64, 264)), Err(Error::UnsupportedHeadDim { .. })));
        let f32 = Problem { dtype: DType::F32, ..decode(1, 8, 8, 1, 64, 128) };
        assert!(matches!(applies(&f32), Err(Error::UnsupportedDType { .. })));
        assert!(applies(&decode(1, 8, 8, 1, 64, 128).with_softcap(5.0)).is_ok());
        let alibi = decode(1, 8, 8, 1, 64, 128).with_alibi(attn_core::Alibi::PerHead);
        assert!(applies(&alibi).is_ok());
        assert!(applies(&decode(1, 8, 8, 1, 64, 128).with_window(Some(16), Some(0))).is_ok());
    }

    fn cache(page_size: usize, q_lens: &[usize]) -> Problem {
        let store = KeyStore::Paged { page_size, seed: 1 };
        batch_of(Shape { heads_kv: 8, ..Shape::new(1, 32, 1, 128) }, DType::Bf16, q_lens, &[100, 3000], store)
            .0
    }

    #[test]
    fn caches_of_pages_of_16_keys_and_packed_sequences_run() {
        let h100 = DeviceLimits::h100();
        for page in [16, 64, 256] {
            let (v, _, split, _) = choose(&cache(page, &[1, 1]), &h100, 132, &Forced::default()).unwrap();
            assert!(v.extras && v.name().ends_with("_ext"), "{}", v.name());
            // Splits sized by the longest sequence.
            assert_eq!(split.chunks, 3000u64.div_ceil(v.block_n as u64));
        }
        let err = applies(&cache(24, &[1, 1])).unwrap_err().to_string();
        assert!(err.contains("24-key pages") && err.contains("multiple of 16"), "{err}");
        // Packed queries (one and two a sequence) from a paged cache, and packed keys: the
        // extras variant, the group's rows sized by the longest sequence.
        let (v, _, split, _) = choose(&cache(16, &[1, 2]), &h100, 132, &Forced::default()).unwrap();
        assert!(v.extras && (split.pairs, split.row_blocks) == (16, 1), "{} {split:?}", v.name());
        let packed =
            batch_of(Shape::new(1, 32, 1, 128), DType::Bf16, &[4, 1, 0], &[300, 9, 5], KeyStore::Packed).0;
        let (v, _, split, _) = choose(&packed.causal(), &h100, 132, &Forced::default()).unwrap();
        assert!(v.extras && v.masked && split.row_blocks == 1, "{} {split:?}", v.name());
        // Past 64 rows a group goes to the prefill families.
        let mqa = Shape { heads_kv: 1, ..Shape::new(1, 32, 1, 128) };
        let long = batch_of(mqa, DType::Bf16, &[3, 1], &[300, 9], KeyStore::Packed).0;
        assert!(applies(&long).unwrap_err().to_string().contains("96 query rows"));
        // Plain problems keep the plain variants.
        let (v, ..) =
            choose(&decode(1, 32, 8, 1, 4096, 128).causal(), &h100, 132, &Forced::default()).unwrap();
        assert!(!v.extras);
        let (v, ..) =
            choose(&decode(1, 32, 8, 1, 4096, 128).with_softcap(30.0), &h100, 132, &Forced::default())
                .unwrap();
        assert!(v.extras);
        // Chunks of 64 keys could span three pages: a typed error, not a kernel that cannot compile.
        let wide = Tiles { block_n: 64, stages: 1, l2_prefetch: false };
        let err = choose(&cache(64, &[1, 1]), &h100, 132, &Forced { tiles: Some(wide), ..Forced::default() })
            .unwrap_err()
            .to_string();
        assert!(err.contains("16 or 32"), "{err}");
    }

    #[test]
    fn splits_fill_the_device_and_no_more() {
        // Waves of 264 CTAs.
        assert_eq!(splits_for(8, 2048, 264), 32); // 256 CTAs: 0.97 of a wave
        assert_eq!(splits_for(64, 2048, 264), 4); // 256 CTAs
        assert_eq!(splits_for(256, 2048, 264), 1); // the pairs fill the device already
        assert_eq!(splits_for(8, 20, 264), 2); // 20 chunks: at most 2 splits of 8 or more
        // One pair: at most MAX_SPLITS CTAs (0.48 of a wave), the fewest within 95% of that.
        assert_eq!(splits_for(1, 1_000_000, 264), 122);
        assert_eq!(splits_for(8, 7, 264), 1);
        // Waves of 132 CTAs (one per SM on 132 SMs, as the plan fills them).
        assert_eq!(splits_for(8, 2048, 132), 16);
        assert_eq!(splits_for(32, 2048, 132), 4);
    }

    #[test]
    fn row_blocks_and_tiles_follow_the_group() {
        let h100 = DeviceLimits::h100();
        let (v, launch, split, notes) =
            choose(&decode(1, 32, 8, 1, 32768, 128), &h100, 132, &Forced::default()).unwrap();
        assert_eq!((v.m_tiles, split.row_blocks, v.block_n, v.stages), (1, 1, 32, 2));
        assert_eq!(launch.grid, [split.splits, 8, 1]);
        // One CTA per SM: 8 x 16 = 128 CTAs, 0.97 of a wave.
        assert_eq!(split.splits, 16, "{split:?}");
        assert!(notes.iter().any(|n| n.contains("waves")), "{notes:?}");
        // Splits fill one CTA per SM, not every CTA an SM could hold: D = 64 (two per SM) takes
        // 16 splits of 8 pairs, not 32; 16 queries' 128 pairs on 132 SMs are not split.
        let (_, _, split, _) =
            choose(&decode(1, 32, 8, 1, 32768, 64), &h100, 132, &Forced::default()).unwrap();
        assert_eq!(split.splits, 16, "{split:?}");
        let (_, _, split, _) =
            choose(&decode(8, 32, 8, 16, 4096, 128), &h100, 132, &Forced::default()).unwrap();
        assert_eq!((split.pairs, split.splits), (128, 1), "{split:?}");
        // 8 heads x 8 queries = 64 rows at D = 128: two blocks of 32.
        let (v, launch, split, _) =
            choose(&decode(2, 32, 4, 8, 4096, 128), &h100, 132, &Forced::default()).unwrap();
        assert_eq!((v.m_tiles, split.row_blocks), (2, 2));
        assert_eq!(launch.grid[1..], [8, 2]);
        // D = 256 holds 16 rows.
        let (v, _, split, _) =
            choose(&decode(1, 8, 1, 4, 4096, 256), &h100, 132, &Forced::default()).unwrap();
        assert_eq!((v.m_tiles, split.row_blocks), (1, 2));
        // Large batches: one split, no workspace.
        let (v, _, split, _) =
            choose(&decode(128, 32, 8, 1, 4096, 128), &h100, 132, &Forced::default()).unwrap();
        assert_eq!(split.splits, 1);
        assert_eq!((split.counters(), split.partial_floats(&v)), (0, 0));
    }

    #[test]
    fn more_items_than_the_device_holds_take_the_persistent_form() {
        let h100 = DeviceLimits::h100();
        let plan = |p: &Problem, forced: &Forced| choose(p, &h100, 132, forced).unwrap();
        // 128 x 8 items at D = 64: 264 CTAs in a row (its second Q buffer still leaves two CTAs
        // per SM).
        let (v, launch, split, notes) = plan(&decode(128, 32, 8, 1, 4096, 64), &Forced::default());
        assert!(v.persist && v.name().ends_with("_persist"), "{}", v.name());
        assert_eq!((split.pairs, split.splits, split.ctas, launch.grid), (1024, 1, 264, [264, 1, 1]));
        assert!(notes.iter().any(|n| n.starts_with("persistent: 264 CTAs")), "{notes:?}");
        // D = 128 has the form (one CTA per SM: 132) but takes it only when asked.
        let on = Forced { persist: Some(Persist::On(u32::MAX)), ..Forced::default() };
        let (v, launch, split, _) = plan(&decode(128, 32, 8, 1, 4096, 128), &on);
        assert!(v.persist && split.ctas == 132 && launch.grid == [132, 1, 1], "{} {split:?}", v.name());
        // Within one wave, D = 128 by default, masked, with the extras, two row tiles or 16-key
        // chunks: a CTA an item.
        for p in [
            decode(8, 32, 8, 1, 32768, 64),
            decode(128, 32, 8, 1, 4096, 128),
            decode(128, 32, 8, 1, 4096, 128).causal(),
            decode(128, 32, 8, 1, 4096, 128).with_softcap(30.0),
            decode(128, 32, 4, 8, 4096, 128),
            decode(128, 8, 1, 1, 4096, 256),
        ] {
            let (v, launch, split, _) = plan(&p, &Forced::default());
            assert!(!v.persist, "{}", v.name());
            assert_eq!(launch.grid[0] * launch.grid[1] * launch.grid[2], split.ctas);
        }
        // Forced: off, or on at most 5 CTAs on a small problem (each then takes several items).
        let off = Forced { persist: Some(Persist::Off), ..Forced::default() };
        assert!(!plan(&decode(128, 32, 8, 1, 4096, 64), &off).0.persist);
        let five = Forced { splits: Some(1), persist: Some(Persist::On(5)), ..Forced::default() };
        let (v, launch, split, notes) = plan(&decode(3, 32, 8, 1, 1000, 128), &five);
        assert!(v.persist && split.splits == 1 && launch.grid == [5, 1, 1], "{split:?}");
        assert!(notes.iter().any(|n| n.contains("forced by ATTN_CUDA_DECODE_PERSIST")), "{notes:?}");
        // On an L4-class device (99 KB of shared memory a block) D = 64's three-stage rings fit,
        // with the form's second Q buffer they do not: one CTA per item.
        let l4 = DeviceLimits::l4();
        let (v, launch, ..) = choose(&decode(128, 32, 8, 1, 4096, 64), &l4, 58, &Forced::default()).unwrap();
        assert!(
            !v.persist && v.stages == 3 && launch.shared_bytes() <= l4.shared_per_block_optin,
            "{}",
            v.name()
        );
        assert!(Variant { persist: true, ..v }.shared_bytes() > l4.shared_per_block_optin);
        // Every variant with the form is compiled with and without it.
        let all = Variant::all();
        assert!(all.iter().filter(|v| v.persist).all(|v| all.contains(&Variant { persist: false, ..*v })));
        assert!(
            all.iter().any(|v| v.persist && v.head_dim == 64)
                && all.iter().any(|v| v.persist && v.head_dim == 128)
        );
    }

    #[test]
    fn other_head_dims_run_padded_on_the_next_kernel() {
        let h100 = DeviceLimits::h100();
        for (d, kernel) in
            [(8, 64), (40, 64), (72, 80), (88, 96), (104, 128), (120, 128), (136, 256), (248, 256)]
        {
            let (v, _, _, notes) =
                choose(&decode(2, 32, 8, 1, 4096, d), &h100, 132, &Forced::default()).unwrap();
            assert_eq!((v.head_dim, v.pad, v.extras), (kernel, true, true), "D={d}: {}", v.name());
            assert!(v.name().ends_with("_ext_pad"), "{}", v.name());
            assert!(
                notes.iter().any(|n| n.contains(&format!("head dim {d} on the D={kernel} kernel"))),
                "{notes:?}"
            );
            assert!(Variant::all().contains(&v), "{} is not among the variants CI compiles", v.name());
        }
        for d in HEAD_DIMS {
            let (v, ..) = choose(&decode(2, 32, 8, 1, 4096, d), &h100, 132, &Forced::default()).unwrap();
            assert!(v.head_dim == d && !v.pad && !v.extras, "{}", v.name());
        }
        // Without GQA the prefill families read padded heads as fast or faster.
        let mha = applies(&decode(8, 32, 32, 1, 8192, 72)).unwrap_err().to_string();
        assert!(mha.contains("without GQA"), "{mha}");
        assert!(applies(&decode(8, 32, 32, 1, 8192, 80)).is_ok());
        // Masked, with two row blocks.
        let (v, _, split, _) =
            choose(&decode(1, 32, 4, 4, 4096, 112).causal(), &h100, 132, &Forced::default()).unwrap();
        assert!(v.pad && v.masked && split.row_blocks == 1 && v.m_tiles == 2, "{} {split:?}", v.name());
    }

    #[test]
    fn shared_memory_fits_an_h100_and_an_l4() {
        let h100 = DeviceLimits::h100();
        let l4 = DeviceLimits::l4();
        let p = decode(1, 32, 8, 1, 4096, 128);
        let (v, _, _, _) = choose(&p, &h100, 132, &Forced::default()).unwrap();
        // Q 16 x 136 (padded rows) + 4 warps x 2 stages x (K + V) 32 x 128 (swizzled), 2 bytes each.
        assert_eq!(v.shared_bytes(), (16 * 136 + 4 * 2 * 2 * 32 * 128) * 2);
        assert_eq!(ctas_per_sm(&v, &h100), 1);
        let (v, launch, _, notes) = choose(&p, &l4, 58, &Forced::default()).unwrap();
        assert!(launch.shared_bytes() <= l4.shared_per_block_optin, "{notes:?}");
        assert_eq!((v.block_n, v.stages), (16, 2));
        assert!(notes[0].contains("does not fit"), "{notes:?}");
        for v in Variant::all() {
            let fits = v.shared_bytes() + Variant::STATIC_SHARED <= l4.shared_per_block_optin;
            // Every head dim's last candidate fits an L4.
            if (v.block_n, v.stages) == *candidates(v.head_dim, v.m_tiles).last().unwrap() {
                assert!(fits, "{}: {} B", v.name(), v.shared_bytes());
            }
            assert!(v.shared_bytes() + Variant::STATIC_SHARED <= h100.shared_per_block_optin, "{}", v.name());
        }
    }

    #[test]
    fn forced_splits_and_windows() {
        let h100 = DeviceLimits::h100();
        let (_, launch, split, notes) = choose(
            &decode(1, 8, 8, 1, 4096, 64),
            &h100,
            132,
            &Forced { splits: Some(1000), ..Forced::default() },
        )
        .unwrap();
        assert_eq!((split.splits, launch.grid[0]), (MAX_SPLITS, MAX_SPLITS));
        assert!(notes.iter().any(|n| n.contains("forced")), "{notes:?}");
        let tiles = Tiles { block_n: 32, stages: 2, l2_prefetch: true };
        let (v, _, _, notes) = choose(
            &decode(1, 8, 8, 1, 4096, 128),
            &h100,
            132,
            &Forced { tiles: Some(tiles), ..Forced::default() },
        )
        .unwrap();
        assert_eq!((v.block_n, v.stages, v.l2_prefetch), (32, 2, true));
        assert!(notes.iter().any(|n| n.contains("ATTN_CUDA_DECODE_TILES")), "{notes:?}");
        let deep = Tiles { block_n: 64, stages: 8, l2_prefetch: false };
        let err = choose(
            &decode(1, 8, 8, 1, 4096, 128),
            &h100,
            132,
            &Forced { tiles: Some(deep), ..Forced::default() },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("shared memory"), "{err}");
        // A window of 1000 keys behind the diagonal: the group's rows see 1000 + seq_q keys.
        let p = decode(1, 8, 2, 4, 100_000, 128).with_window(Some(1000), Some(0));
        assert_eq!(key_range(&p), (100_000 - 4 - 1000, 100_000));
        let (v, _, split, _) = choose(&p, &h100, 132, &Forced::default()).unwrap();
        assert!(v.masked);
        assert_eq!(split.chunks, 1004u64.div_ceil(32));
        assert_eq!(key_range(&decode(1, 8, 2, 4, 100, 128).causal()), (0, 100));
        // seq_q > seq_k under a causal mask: the first rows see nothing.
        assert_eq!(key_range(&decode(1, 8, 2, 8, 5, 128).causal()), (0, 5));
    }

    #[test]
    fn grids_past_the_device_are_plan_errors() {
        let h100 = DeviceLimits::h100();
        let off = Forced { persist: Some(Persist::Off), ..Forced::default() };
        let err = choose(&decode(70_000, 8, 8, 1, 64, 128), &h100, 132, &off).unwrap_err().to_string();
        assert!(err.contains("grid z"), "{err}");
        // The persistent form's grid is the device's CTAs, whatever the batch.
        let (v, launch, ..) =
            choose(&decode(70_000, 8, 8, 1, 64, 64), &h100, 132, &Forced::default()).unwrap();
        assert!(v.persist && launch.grid == [264, 1, 1], "{}", v.name());
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
