//! Which Hopper specialisation runs a problem, with what launch, and whether it fits. Pure host
//! logic, tested without a GPU against the H100's stated limits.

use super::split::Split;
use super::variant::{HEAD_DIMS, L2Promotion, MAX_HEAD_DIM, PRODUCER_REGISTERS, Variant, kernel_head_dim};
use crate::scores::KernelMask;
use crate::tensors::{check_alignment, check_paged_cache, check_supported_by};
use attn_core::{DType, DeviceLimits, Error, Launch, Problem, Result};

impl Variant {
    /// Every specialisation the backend can choose, for the CI compile check: each head dim's
    /// tiles (and the `long_tiles` and `short_causal_tiles` where a head dim has them), both
    /// masks, both dtypes, each with two Q slots ([`Variant::q_slots`]) where they fit, and the
    /// causal ones in both block orders ([`Variant::bottom`]) where they have two; a window on
    /// each head dim's tiles; each of these with the soft-cap; and all of them with ALiBi
    /// (which changes no choice of the plan's). Tiles forced by
    /// `ATTN_CUDA_SM90_TILES` are compiled where they are asked for.
    pub fn all() -> Vec<Variant> {
        let mut v = Self::all_plain();
        for dtype in [DType::F16, DType::Bf16] {
            for head_dim in HEAD_DIMS {
                let Tiles { block_n, stages, consumers } = tiles(head_dim);
                let window = Variant {
                    dtype,
                    head_dim,
                    block_n,
                    stages,
                    consumers,
                    causal: false,
                    window: true,
                    softcap: false,
                    alibi: false,
                    q_slots: 1,
                    bottom: false,
                    trace: false,
                    l2: L2Promotion::B256,
                    pad: false,
                    seqs: false,
                    paged: false,
                };
                v.push(window);
                v.extend(window.with_q_slots(2).ok());
            }
        }
        let capped: Vec<Variant> = v.iter().filter_map(|x| x.capped()).collect();
        v.extend(capped);
        let biased: Vec<Variant> = v.iter().filter_map(|x| x.biased()).collect();
        v.extend(biased);
        v.extend(Self::all_padded());
        v.extend(Self::all_seqs());
        v
    }

    /// The sequence variants ([`Variant::seqs`]), as [`choose`] plans them for packed queries and
    /// keys and for a paged cache ([`Variant::paged`]): each mask (none, causal, a window) with
    /// and without the soft-cap and ALiBi, both dtypes, each native head dim on its one tile
    /// configuration (see [`key_tiles_for`]; a paged cache's [`paged_tiles`] too).
    fn all_seqs() -> Vec<Variant> {
        use attn_core::sequences::{KeyStore, batch_of};
        let mut v = vec![];
        for dtype in [DType::F16, DType::Bf16] {
            for d in HEAD_DIMS {
                let shape = attn_core::Shape::new(1, 2, 1, d);
                let (p, _) = batch_of(shape, dtype, &[100, 4096], &[4096, 100], KeyStore::Packed);
                let masks = [p, p.causal(), p.with_window(Some(256), Some(0))];
                let capped = masks.into_iter().flat_map(|m| [m, m.with_softcap(30.0)]);
                for m in capped.flat_map(|m| [m, m.with_alibi(attn_core::Alibi::PerHead)]) {
                    // (None where the family hands the problem over: hands_over.)
                    if let Ok((x, _)) = choose(&m, &DeviceLimits::h100(), 132, None, true) {
                        v.push(x);
                    }
                }
                // The same from a paged cache, of pages that take `paged_tiles` and of pages
                // that do not.
                for page_size in [16, 64] {
                    let store = KeyStore::Paged { page_size, seed: 1 };
                    let (p, _) = batch_of(shape, dtype, &[100, 4096], &[4096, 100], store);
                    let masks = [p, p.causal(), p.with_window(Some(256), Some(0))];
                    let capped = masks.into_iter().flat_map(|m| [m, m.with_softcap(30.0)]);
                    for m in capped.flat_map(|m| [m, m.with_alibi(attn_core::Alibi::PerHead)]) {
                        match choose(&m, &DeviceLimits::h100(), 132, None, true) {
                            Ok((x, _)) if !v.contains(&x) => v.push(x),
                            _ => {}
                        }
                    }
                }
            }
        }
        v
    }

    /// The padded variants ([`Variant::pad`]), as [`choose`] plans them for a head dim below each
    /// kernel's: each mask (none, causal, a window) with and without the soft-cap, both dtypes,
    /// on the kernel's one tile configuration (see [`key_tiles_for`]).
    fn all_padded() -> Vec<Variant> {
        let mut v = vec![];
        for dtype in [DType::F16, DType::Bf16] {
            for kernel_d in HEAD_DIMS {
                let p = Problem::new(attn_core::Shape::new(1, 2, 4096, kernel_d - 8), dtype);
                let masks = [p, p.causal(), p.with_window(Some(256), Some(0))];
                for m in masks.into_iter().flat_map(|m| [m, m.with_softcap(30.0)]) {
                    // (None where the family runs no such problem: D=256's window with a soft-cap.)
                    if let Ok((x, _)) = choose(&m, &DeviceLimits::h100(), 132, None, true) {
                        v.push(x);
                    }
                }
            }
        }
        v
    }

    /// The soft-capped form of this variant, or none where the plan takes no such variant:
    /// D=128's short causal tiles (with the cap's tanh ptxas spills 12 bytes there, so a
    /// soft-capped causal D=128 takes [`tiles`]); D=256 windows; windows in two Q slots, whose
    /// key-tile loop ptxas then built on the vector datapath: 42 R2UR, against at most 8.
    fn capped(&self) -> Option<Variant> {
        let v = Variant { softcap: true, ..*self };
        match (v.causal, v.window, v.head_dim, v.consumers) {
            (true, _, 128, 3) | (_, true, 256, _) => None,
            (_, true, _, _) if v.q_slots == 2 => None,
            _ => Some(v),
        }
    }

    /// The ALiBi form of this variant, or none where the plan takes no such variant
    /// ([`hands_over`]).
    fn biased(&self) -> Option<Variant> {
        let v = Variant { alibi: true, ..*self };
        (!hands_over(v.head_dim, v.window, v.causal, v.softcap, true)).then_some(v)
    }

    /// The variants without a window or a soft-cap.
    fn all_plain() -> Vec<Variant> {
        let mut v = vec![];
        for dtype in [DType::F16, DType::Bf16] {
            for head_dim in HEAD_DIMS {
                for causal in [false, true] {
                    let Tiles { block_n, stages, consumers } = tiles(head_dim);
                    let mut here = vec![Variant {
                        dtype,
                        head_dim,
                        block_n,
                        stages,
                        consumers,
                        causal,
                        window: false,
                        softcap: false,
                        alibi: false,
                        q_slots: 1,
                        bottom: false,
                        trace: false,
                        l2: L2Promotion::B256,
                        pad: false,
                        seqs: false,
                        paged: false,
                    }];
                    if let Some(long) = long_tiles(head_dim, causal) {
                        here.push(Variant { block_n: long.block_n, ..here[0] });
                    }
                    let twins: Vec<Variant> = here.iter().filter_map(|x| x.with_q_slots(2).ok()).collect();
                    here.extend(twins);
                    // Blocks from the bottom (the default where they apply), compiled next to the
                    // top order that ATTN_CUDA_SM90_BLOCKS=top asks for.
                    let bottom = Variant { bottom: true, ..here[0] };
                    if bottom.bottoms() {
                        here.push(bottom);
                    }
                    // The short causal tiles, as planned: one Q slot, blocks from the bottom.
                    if let Some(t) = short_causal_tiles(head_dim, causal) {
                        let x = Variant {
                            block_n: t.block_n,
                            stages: t.stages,
                            consumers: t.consumers,
                            ..here[0]
                        };
                        here.push(Variant { bottom: Variant { bottom: true, ..x }.bottoms(), ..x });
                    }
                    v.extend(here);
                }
            }
        }
        v
    }

    /// The launch on a device with `sms` multiprocessors: a persistent grid of at most one CTA
    /// per SM, each taking units of work (tiles, then runs of the split tail: `split` says
    /// whether to cut it) from the scheduler's counter after its first, `blockIdx.x`.
    pub fn launch(&self, problem: &Problem, sms: u32, split: bool) -> Launch {
        let tiles = self.tiles(problem).min(i32::MAX as u64) as u32;
        let ctas = sms.max(1);
        let s = if split { self.split(problem, ctas) } else { Split::none(tiles) };
        let grid = (s.whole + s.units).min(ctas);
        Launch {
            grid: [grid, 1, 1],
            block: [self.threads(), 1, 1],
            dynamic_shared_bytes: self.shared_bytes(),
            static_shared_bytes: 0,
            registers_per_thread: None,
            spill_bytes: None,
        }
    }

    /// What the plan says about the kernel's roles, registers, memory and tile order for
    /// `problem`.
    /// `split`: how the launch deals out its work ([`Variant::split`]).
    pub fn notes(&self, problem: &Problem, launch: &Launch, split: Split) -> Vec<String> {
        let kv = self.block_n * self.head_dim * 2;
        let mut notes = vec![format!(
            "sm_90a warp-specialized: warpgroup {} produces (TMA copies of Q, K, V; {} registers per thread \
             after setmaxnreg), warpgroups 0-{} consume (wgmma; {} registers per thread), {} threads",
            self.consumers,
            PRODUCER_REGISTERS,
            self.consumers - 1,
            self.consumer_registers(),
            self.threads()
        )];
        notes.push(format!(
            "shared memory: Q {} B{}, K and V {} stages of {kv} B each, 128-byte swizzled (TMA's and wgmma's layout)",
            self.block_m() * self.head_dim * 2,
            match self.q_slots {
                2 => " x 2 slots (the next piece's Q loads under this one's key tiles)",
                _ => "",
            },
            self.stages
        ));
        notes.push(format!(
            "tensor maps' L2 promotion: {}{}",
            match self.l2 {
                L2Promotion::None => "none".to_string(),
                l2 => format!("{} bytes", l2.name()),
            },
            match (self.l2, L2Promotion::for_problem(problem)) {
                (ours, default) if ours != default => " (ATTN_CUDA_SM90_L2)",
                (L2Promotion::B128, _) =>
                    " (rows start off 32-byte boundaries, where 128 is faster than 256)",
                _ => "",
            }
        ));
        notes.push("each tile's softmax runs under the previous tile's P·V (overlap)".into());
        notes.push("the consumer warpgroups take turns issuing products (ping-pong)".into());
        notes.push(format!(
            "persistent: {} CTAs take tiles from a counter as they finish one (put back to zero by the last CTA)",
            launch.grid[0]
        ));
        if split.units > 0 {
            notes.push(format!(
                "split tail: the last {} tiles' {} key tiles dealt to {} units ({}-{} each) after the {} \
                 whole tiles; a cut tile is merged by its last piece ({} B of partial results)",
                split.tail_tiles,
                split.tail_iters(),
                split.units,
                split.tail_iters() / split.units,
                split.tail_iters().div_ceil(split.units),
                split.whole,
                4 * split.partial_floats(self.head_dim, self.consumers)
            ));
        }
        if self.causal {
            notes.push(format!(
                "causal tile order: longest first within groups of {} heads, whose K and V fit L2{}",
                head_group(problem),
                match self.bottoms() {
                    true => "; query blocks laid from the last row, so that a short block is the first",
                    false => "",
                }
            ));
        }
        if self.pad {
            let d = problem.shape.head_dim;
            notes.push(format!(
                "head dim {d} runs the D = {} kernel padded (ATTN_PAD): Q, K and V load zeros in columns \
                 {d}..{} (TMA's fill past the tensor maps' {d} columns), O is stored in its {d} columns, \
                 the scale is the problem's",
                self.head_dim, self.head_dim
            ));
        }
        if self.seqs {
            notes.push(format!(
                "sequences of their own lengths (ATTN_SEQS): tiles over the longest sequence's {} query blocks, \
                 each reading its sequence's offsets and lengths from the device arrays (clamped); the blocks past \
                 a sequence's own are skipped, a sequence's last key tile has V's rows past its keys cleared before \
                 its P V (clear_v_past_keys), and a warpgroup whose rows run past its sequence stores O from \
                 registers",
                problem.shape.seq_q.div_ceil(self.block_m())
            ));
        }
        if let attn_core::KvRows::Paged { page_size, .. } = problem.batching.kv {
            let rows = page_box(self.block_n, page_size);
            notes.push(format!(
                "paged cache: each {}-key tile loaded in {} TMA box(es) of {rows} rows per 64 columns, each \
                 from the page the block table names (pages of {page_size} keys; ATTN_PAGED), the rows past a \
                 sequence's keys masked and cleared as dense rows are",
                self.block_n,
                self.block_n / rows
            ));
        }
        if self.alibi && self.head_dim <= 128 {
            notes.push(
                "ALiBi: each piece walks its key tiles from its block's last diagonal back, then on past it \
                 (ATTN_DIAGONAL_FIRST), so that the bias only falls and the softmax speculates"
                    .into(),
            );
        }
        notes.extend(crate::scores::notes(problem, self.block_m(), self.block_n));
        notes.push(match self.o_staged() {
            true if self.q_slots == 2 => "O leaves through its tile's Q slot and a TMA store".into(),
            true => "O leaves through shared memory and a TMA store".into(),
            false => "O is stored from registers (no room left in shared memory to stage it)".into(),
        });
        notes
    }
}

/// Rows per TMA box of a paged cache's key tile of `block_n` keys: the largest number dividing
/// both the tile's keys and the page size (both multiples of 16), so that no box crosses a page
/// and a tile takes as few boxes as it can (one where pages hold whole tiles).
pub(crate) fn page_box(block_n: usize, page_size: usize) -> usize {
    let (mut a, mut b) = (block_n, page_size);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A tile configuration: keys per tile, K/V stages, consumer warpgroups (64 query rows each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    /// Keys per tile: the N of S's wgmma, a multiple of 16 up to 256.
    pub block_n: usize,
    /// K/V stages in the shared-memory ring.
    pub stages: u32,
    /// Consumer warpgroups, 2 to 4. In tiles forced on `choose`, 0 stands for the head dim's.
    pub consumers: u32,
}

/// The tiles of a head dim. The S accumulators (BN / 2 registers) and O's (D / 2) fit the
/// consumers' registers together with P (BN / 4); two stages of K and V with Q fit the H100's
/// 227 KB (D = 256: 64 KB of Q and 128 KB of K/V).
///
/// D = 64 takes three consumer warpgroups (192 rows): its softmax costs as much as its products
/// (one exp2 per score on the multi-function unit, 16 a clock per SM, against 4·64 tensor-core
/// FLOPs), and with three warpgroups two can be in their softmax while the third's products run
/// (7-15% faster than two on the H100, 20f664e). D = 64's tiles are 112 keys in three stages
/// (152 registers each; 128 keys spill), 1-6% faster than 96 keys in two (8c44a2b). At D = 128,
/// 96 and 112 keys were slower than 128 at S = 2048 and 4096 with either mask, and three
/// consumers (64 keys) slower but for causal sequences up to 4096 keys (`short_causal_tiles`).
/// Measured, see docs/experiments.md.
pub fn tiles(head_dim: usize) -> Tiles {
    match head_dim {
        64 => Tiles { block_n: 112, stages: 3, consumers: 3 },
        256 => Tiles { block_n: 64, stages: 2, consumers: 2 },
        _ => Tiles { block_n: 128, stages: 2, consumers: 2 },
    }
}

/// Longer key tiles than [`tiles`]' where they were measured faster per key: D = 128 without a
/// mask, 144 keys (the S accumulators 72 registers, P 36): 1-4% faster than 128 at S = 8192
/// and about 1% at 16384 on the H100, even at 4096, where 4096 keys make 29 tiles of 144, the last
/// 64 keys long (measured at ba763ae, see docs/experiments.md). [`key_tiles_for`] takes them
/// where the keys they waste are fewer than what they gain.
pub fn long_tiles(head_dim: usize, causal: bool) -> Option<Tiles> {
    match (head_dim, causal) {
        (128, false) => Some(Tiles { block_n: 144, ..tiles(head_dim) }),
        _ => None,
    }
}

/// Tiles for short causal sequences where they were measured faster than [`tiles`]': D = 128
/// under a causal mask takes three consumer warpgroups (192 query rows) on
/// 64-key tiles in three stages where the keys are at most [`SHORT_CAUSAL_MAX_KEYS`]: 0.5-3%
/// faster than [`tiles`]' two on 128 keys up to S = 4096 on the H100, even at 8192, slower at
/// 16384, and slower without a mask (measured at b38aefc, see docs/experiments.md).
pub fn short_causal_tiles(head_dim: usize, causal: bool) -> Option<Tiles> {
    match (head_dim, causal) {
        (128, true) => Some(Tiles { block_n: 64, stages: 3, consumers: 3 }),
        _ => None,
    }
}

/// Tiles for a paged cache whose pages hold a multiple of 64 keys, where [`tiles`]' key tiles
/// are not a multiple of 64: D = 64's 112 keys load in boxes of 16 rows (`page_box`) whatever the
/// page size, and the producer waits for a page number per box. 64 keys in 4 stages take one box
/// per tile: chunked prefill from pages of 64 and 256 keys 1.49-1.52x faster than on 112-key
/// tiles on the H100, causal and not, 1.11-1.14x a dense cache's time (128 keys with two
/// consumers: 1.40-1.48x; h100-hopper-paged-d64.json).
pub fn paged_tiles(head_dim: usize, page_size: usize) -> Option<Tiles> {
    match head_dim {
        64 if page_size.is_multiple_of(64) => Some(Tiles { block_n: 64, stages: 4, consumers: 3 }),
        _ => None,
    }
}

/// Tiles for a soft-cap with sequences (packed or paged) under a causal mask or with ALiBi:
/// D = 64's 96 keys, 1.7% faster than its [`tiles`]' 112 with packed sequences and 3.7% faster
/// than its [`paged_tiles`] from pages of 64 keys, where a dense problem ran 2.6-2.8% faster on
/// 112 than on 96 (H200, h200-softcap-d64-tiles.json).
pub fn capped_sequence_tiles(head_dim: usize) -> Option<Tiles> {
    match head_dim {
        64 => Some(Tiles { block_n: 96, ..tiles(head_dim) }),
        _ => None,
    }
}

/// Whether the Hopper family hands a problem of these features to the Ampere/Ada family, whose
/// consumers would spill registers: D = 256 with a window and a soft-cap (20 bytes), with a
/// window and ALiBi (16), causal with a soft-cap and ALiBi (28).
pub fn hands_over(head_dim: usize, window: bool, causal: bool, softcap: bool, alibi: bool) -> bool {
    head_dim == 256 && ((window && (softcap || alibi)) || (causal && softcap && alibi))
}

/// The most keys for which [`short_causal_tiles`] are taken.
pub const SHORT_CAUSAL_MAX_KEYS: usize = 4096;

/// How many Q slots ([`Variant::q_slots`]) a variant takes by default: two at D = 128 without a
/// mask, where loading the next piece's Q under this one's key tiles was measured 1.5-3% faster
/// at S = 2048 and 4096 on the H100 and even at 8192 and 16384; one elsewhere, where two were
/// even or slower (measured at a9e155f and e5b4086, see docs/experiments.md). A small gain, near
/// the rounds' spread.
pub fn q_slots_for(head_dim: usize, causal: bool) -> u32 {
    match (head_dim, causal) {
        (128, false) => 2,
        _ => 1,
    }
}

/// What a key of a [`long_tiles`] tile costs against one of [`tiles`]' (per 1000): 1.5% less,
/// as measured at S = 8192 (where 144-key tiles waste 0.2% of their keys and 128-key ones none).
const LONG_TILE_COST_PER_MILLE: usize = 985;

/// The tiles for `problem`: [`short_causal_tiles`] up to [`SHORT_CAUSAL_MAX_KEYS`]
/// keys; [`long_tiles`] where the keys they pad the sequence to, at their lower cost per key,
/// come to less than [`tiles`]' (S = 8192 and 16384 at D = 128, not S = 2048 or 4096); else
/// [`tiles`].
///
/// A window takes [`tiles`]: its key tiles per query block are few (their ends masked), and
/// neither the causal tiles' nor the long tiles' measurements apply. A soft-cap never takes the
/// short causal tiles (where ptxas spills with it); with sequences, under a causal mask or with
/// ALiBi, it takes [`capped_sequence_tiles`] where a head dim has them.
///
/// A padded head dim ([`Variant::pad`]) takes its kernel's [`tiles`] whatever the keys: one
/// padded build per mask and kernel head dim, not one per tile choice; so do sequences of their
/// own lengths ([`Variant::seqs`]), whose lengths the plan does not see.
pub fn key_tiles_for(problem: &Problem) -> Tiles {
    let (d, seq_k) = (problem.shape.head_dim, problem.shape.seq_k);
    let kernel_d = kernel_head_dim(d).unwrap_or(d);
    let capped = problem.params.softcap.is_some();
    let causal = match KernelMask::of(problem) {
        KernelMask::Window => return tiles(kernel_d),
        mask => mask == KernelMask::Causal,
    };
    let sequences = !problem.batching.is_dense();
    let biased = problem.params.alibi.is_some();
    if let Some(t) = capped_sequence_tiles(kernel_d).filter(|_| sequences && capped && (causal || biased)) {
        return t;
    }
    if let attn_core::KvRows::Paged { page_size, .. } = problem.batching.kv {
        return paged_tiles(kernel_d, page_size).unwrap_or(tiles(kernel_d));
    }
    if kernel_d != d || sequences {
        return tiles(kernel_d);
    }
    if let Some(t) = short_causal_tiles(d, causal).filter(|_| seq_k <= SHORT_CAUSAL_MAX_KEYS && !capped) {
        return t;
    }
    let short = tiles(d);
    match long_tiles(d, causal) {
        Some(long)
            if seq_k.div_ceil(long.block_n) * long.block_n * LONG_TILE_COST_PER_MILLE
                < seq_k.div_ceil(short.block_n) * short.block_n * 1000 =>
        {
            long
        }
        _ => short,
    }
}

/// Chooses the Hopper variant for `problem` on a device with `limits` and `sms`
/// multiprocessors, with [`key_tiles_for`] or the tiles `forced`, or says why the family cannot
/// run it.
pub fn choose(
    problem: &Problem,
    limits: &DeviceLimits,
    sms: u32,
    forced: Option<Tiles>,
    split: bool,
) -> Result<(Variant, Launch)> {
    let s = problem.shape;
    let kernel_d = kernel_head_dim(s.head_dim);
    check_supported_by(problem, "cuda (Hopper family)", kernel_d.is_some(), || {
        format!("multiples of 8 from 8 to {MAX_HEAD_DIM} ({HEAD_DIMS:?} natively, the others padded)")
    })?;
    let kernel_d = kernel_d.unwrap_or(s.head_dim);
    let mask = KernelMask::of(problem);
    let (softcap, alibi) = (problem.params.softcap.is_some(), problem.params.alibi.is_some());
    let seqs = !problem.batching.is_dense();
    // With sequences, D=256's causal soft-cap (without ALiBi) spills 52 bytes since its consumers
    // clear V's rows past a sequence's keys (clear_v_past_keys). (D=64's window with a soft-cap
    // spilled 48 on 112-key tiles until the soft-cap became one MUFU.TANH; none since.)
    let spills = !alibi && softcap && kernel_d == 256 && mask == KernelMask::Causal;
    if seqs && (kernel_d != s.head_dim || spills) {
        // Padded builds with sequences are not compiled (one padded build per mask and soft-cap
        // is enough to carry). (A cache's slots past a sequence's key count, which TMA loads into
        // the last key tile, are zeroed in V before its P V: clear_v_past_keys.)
        return Err(Error::Unsupported {
            backend: "cuda (Hopper family)".into(),
            what: format!(
                "{problem}: sequences of their own lengths on a head dim other than {HEAD_DIMS:?}, or with \
                 a soft-cap at D=256 causal (the consumers would spill registers); the Ampere/Ada family \
                 runs it"
            ),
        });
    }
    if alibi && kernel_d != s.head_dim {
        // Not compiled: one padded build per mask and soft-cap is enough to carry.
        return Err(Error::Unsupported {
            backend: "cuda (Hopper family)".into(),
            what: format!(
                "{problem}: ALiBi on a head dim other than {HEAD_DIMS:?} (the Ampere/Ada family runs it)"
            ),
        });
    }
    if hands_over(kernel_d, mask == KernelMask::Window, mask == KernelMask::Causal, softcap, alibi) {
        return Err(Error::Unsupported {
            backend: "cuda (Hopper family)".into(),
            what: format!(
                "{problem}: at D=256, a window with a soft-cap or ALiBi, or a causal mask with both, spill \
                 the consumers' registers (the Ampere/Ada family runs it)"
            ),
        });
    }
    // TMA: global strides must be multiples of 16 bytes (and the buffers, allocated here, are
    // 256-byte aligned); the same rule the Ampere family's 16-byte loads need.
    check_alignment(problem)?;
    check_paged_cache(problem)?;
    let default = key_tiles_for(problem);
    let Tiles { block_n, stages, mut consumers } = forced.unwrap_or(default);
    if consumers == 0 {
        consumers = default.consumers;
    }
    if block_n % 16 != 0
        || !(16..=256).contains(&block_n)
        || !(1..=4).contains(&stages)
        || !(2..=4).contains(&consumers)
    {
        return Err(Error::Unsupported {
            backend: "cuda (Hopper family)".into(),
            what: format!(
                "{block_n} keys per tile, {stages} stages, {consumers} consumer warpgroups: keys per tile must \
                 be a multiple of 16 from 16 to 256 (wgmma's N), stages 1 to 4, consumers 2 \
                 to 4"
            ),
        });
    }
    let variant = Variant {
        dtype: problem.dtype,
        head_dim: kernel_d,
        block_n,
        stages,
        consumers,
        causal: mask == KernelMask::Causal,
        window: mask == KernelMask::Window,
        softcap,
        alibi,
        q_slots: 1,
        bottom: false,
        trace: false,
        l2: L2Promotion::B256,
        pad: kernel_d != s.head_dim,
        seqs: !problem.batching.is_dense(),
        paged: matches!(problem.batching.kv, attn_core::KvRows::Paged { .. }),
    };
    // Two slots where they are the default and fit (forced tiles may leave no room); a window's
    // as without a mask: its pieces are short, and the next one's Q loads under this one's.
    let slots = match (mask, variant.softcap) {
        (KernelMask::Window, true) => 1, // see Variant::capped
        // A paged cache's page loop in the producer moved D=128's ALiBi consumers with two Q
        // slots into spills (4-24 bytes; one slot: none).
        _ if variant.paged && alibi => 1,
        _ => q_slots_for(kernel_d, mask == KernelMask::Causal),
    };
    let variant = variant.with_q_slots(slots).unwrap_or(variant);
    // Causal blocks from the bottom where the variant can lay them so (Variant::bottom).
    let variant = Variant { bottom: Variant { bottom: true, ..variant }.bottoms(), ..variant };
    let launch = variant.launch(problem, sms, split);
    launch.validate(&variant.name(), limits)?;
    Ok((variant, launch))
}

/// The Hopper family's settings (`crate::options`): each `None` leaves the plan's choice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// `ATTN_CUDA_SM90_TILES`: tiles instead of the plan's (`key_tiles_for`); consumers
    /// 0 stands for the head dim's.
    pub tiles: Option<Tiles>,
    /// `ATTN_CUDA_SM90_GRID`: at most this many CTAs in the persistent grid (at most one per SM
    /// anyway).
    pub grid: Option<u32>,
    /// `ATTN_CUDA_SM90_SPLIT`: whether the persistent grid may split its tail (`Split`;
    /// default yes).
    pub split: Option<bool>,
    /// `ATTN_CUDA_SM90_QSLOTS`: Q tiles in shared memory ([`Variant::q_slots`]).
    pub q_slots: Option<u32>,
    /// `ATTN_CUDA_SM90_BLOCKS`: causal query blocks from the bottom or not ([`Variant::bottom`]).
    pub bottom: Option<bool>,
    /// `ATTN_CUDA_SM90_TRACE`: where a traced build ([`Variant::trace`]) writes its timelines.
    pub trace: Option<std::path::PathBuf>,
    /// `ATTN_CUDA_SM90_L2`: the tensor maps' L2 promotion instead of the problem's
    /// ([`L2Promotion::for_problem`]).
    pub l2: Option<L2Promotion>,
}

impl Settings {
    /// Whether any is set (and so asks for the Hopper family).
    pub fn any(&self) -> bool {
        *self != Settings::default()
    }

    /// Whether the persistent grid may split its tail.
    pub fn splits(&self) -> bool {
        self.split.unwrap_or(true)
    }
}

/// The variant and launch for `problem` on a device with `limits` and `sms` multiprocessors,
/// with `settings` applied, and how the launch deals out its work.
pub fn plan(
    problem: &Problem,
    limits: &DeviceLimits,
    sms: u32,
    settings: &Settings,
) -> Result<(Variant, Launch, Split)> {
    let ctas = settings.grid.map_or(sms, |cap| cap.min(sms));
    let (mut variant, mut launch) = choose(problem, limits, ctas, settings.tiles, settings.splits())?;
    if let Some(slots) = settings.q_slots {
        // Shared memory changes with the slots: the launch is planned and checked again.
        variant = variant.with_q_slots(slots)?;
        launch = variant.launch(problem, ctas, settings.splits());
        launch.validate(&variant.name(), limits)?;
    }
    if let Some(bottom) = settings.bottom {
        variant = variant.with_bottom(bottom)?;
    }
    variant.trace = settings.trace.is_some();
    variant.l2 = settings.l2.unwrap_or_else(|| L2Promotion::for_problem(problem));
    let split = match settings.splits() {
        true => variant.split(problem, launch.grid[0]),
        false => Split::none(variant.tiles(problem).min(i32::MAX as u64) as u32),
    };
    Ok((variant, launch, split))
}

/// L2 the causal tile order may fill with K/V (see [`head_group`]): about two thirds of the
/// H100's 50 MB (the H200 has 60), leaving room for Q, O and the copies in flight.
const L2_BUDGET: usize = 32 << 20;

/// Under a causal mask the kernel takes tiles longest first within groups of this many heads
/// (`tile_at` in the kernel): as many heads as have K and V together within [`L2_BUDGET`], so
/// that the CTAs running at once reread K/V from L2 rather than from memory.
/// Query heads that share a K/V head (GQA) count once.
pub fn head_group(problem: &Problem) -> usize {
    let s = problem.shape;
    let kv_bytes_per_query_head =
        (2 * s.seq_k * s.head_dim * 2).div_ceil(s.heads_q / s.heads_kv.max(1)).max(1);
    (L2_BUDGET / kv_bytes_per_query_head).clamp(1, s.batch * s.heads_q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hopper::variant::SHARED_LIMIT;
    use attn_core::Shape;

    fn problem(d: usize) -> Problem {
        Problem::new(Shape::new(4, 16, 4096, d), DType::Bf16)
    }

    #[test]
    fn rows_off_32_byte_boundaries_take_128_byte_l2_promotion() {
        let promotion = |d: usize, layout: attn_core::Layout| {
            let p = Problem::new(Shape::new(4, 2048 / d, 4096, d), DType::Bf16).with_layout(layout);
            let settings = Settings::default();
            plan(&p, &DeviceLimits::h100(), 132, &settings).unwrap().0.l2
        };
        for layout in [attn_core::Layout::Bhsd, attn_core::Layout::Bshd] {
            // 176, 208, 240 and 464 bytes a row: every other row starts 16 bytes past a boundary.
            for d in [88, 104, 120, 232] {
                assert_eq!(promotion(d, layout), L2Promotion::B128, "D={d} {layout:?}");
            }
            for d in [64, 80, 96, 128, 256] {
                assert_eq!(promotion(d, layout), L2Promotion::B256, "D={d} {layout:?}");
            }
        }
        // Each has its own name, which the knob lists.
        for l2 in L2Promotion::ALL {
            assert_eq!(L2Promotion::ALL.iter().filter(|x| x.name() == l2.name()).count(), 1);
            assert!(crate::options::SM90_L2.allowed.contains(&format!("`{}`", l2.name())), "{l2:?}");
        }
        // Forced, whatever the rows.
        let p = problem(88);
        let forced = Settings { l2: Some(L2Promotion::None), ..Settings::default() };
        assert_eq!(plan(&p, &DeviceLimits::h100(), 132, &forced).unwrap().0.l2, L2Promotion::None);
    }

    #[test]
    fn every_head_dim_fits_an_h100() {
        let h100 = DeviceLimits::h100();
        for d in HEAD_DIMS {
            let (v, launch) = choose(&problem(d), &h100, 132, None, true).unwrap();
            assert!(launch.shared_bytes() <= h100.shared_per_block_optin, "{}", v.name());
            assert_eq!(launch.grid[0], 132, "{}", v.name());
        }
    }

    #[test]
    fn the_tail_past_the_last_whole_wave_is_split() {
        let persistent = |p: &Problem| choose(p, &DeviceLimits::h100(), 132, None, true).unwrap();
        // D=128, S=4096, 4 x 16: 2048 tiles of 32 key tiles, 15 waves of 132 and 68 tiles.
        let p = problem(128);
        let (v, launch) = persistent(&p);
        let s = v.split(&p, 132);
        assert_eq!(s, Split { whole: 1980, units: 132, tail_tiles: 68, key_tiles: 32 });
        assert_eq!((s.tail_iters(), launch.grid[0]), (2176, 132));
        assert_eq!((s.counters(2), s.partial_floats(128, 2)), (2 + 136, 2 * 132 * 2 * 128 * 68));
        // Causal tiles go longest first instead; whole waves need nothing.
        // (At S=4096 causal D=128 takes the short causal tiles: 192 rows, 22 blocks a head.)
        let causal = p.causal();
        assert_eq!(persistent(&causal).0.split(&causal, 132), Split::none(22 * 64));
        assert_eq!(v.split(&p, 128), Split::none(2048));
        // Fewer tiles than SMs: all of them are the tail, and the grid is the units.
        let few = Problem::new(Shape::new(1, 4, 1024, 128), DType::Bf16); // 32 tiles of 8 key tiles
        let (v, launch) = persistent(&few);
        assert_eq!(v.split(&few, 132), Split { whole: 0, units: 64, tail_tiles: 32, key_tiles: 8 });
        assert_eq!(launch.grid[0], 64);
        // Runs too short or a gain too small: no split, a CTA a tile. 8 tiles of 2 key tiles:
        // runs of MIN_RUN would not outnumber them; 128 tiles of 32 or 128 on 132 CTAs: runs of
        // 32 or 125 save the busiest CTA 0 or 3 key tiles (measured 13% and 4% slower split).
        for (b, h, s) in [(1, 4, 4096), (1, 1, 16384)] {
            let p = Problem::new(Shape::new(b, h, s, 128), DType::Bf16);
            let (v, launch) = persistent(&p);
            assert_eq!((v.split(&p, 132), launch.grid[0]), (Split::none(128), 128), "{p:?}");
        }
        // 2048 tiles of 16 key tiles (S=2048) save 7 of 256: no split; of 128 (S=16384) 62.
        let s2048 = Problem::new(Shape::new(8, 16, 2048, 128), DType::Bf16);
        assert_eq!(persistent(&s2048).0.split(&s2048, 132), Split::none(2048));
        let s16384 = Problem::new(Shape::new(1, 16, 16384, 128), DType::Bf16);
        assert_eq!(persistent(&s16384).0.split(&s16384, 132).units, 132);
        // One head at S=4096: 32 tiles of 32 key tiles in 132 runs of 7-8 (a gain of 24).
        let one = Problem::new(Shape::new(1, 1, 4096, 128), DType::Bf16);
        assert_eq!(
            persistent(&one).0.split(&one, 132),
            Split { whole: 0, units: 132, tail_tiles: 32, key_tiles: 32 }
        );
        let short = Problem::new(Shape::new(1, 4, 256, 128), DType::Bf16); // 8 tiles of 2
        let (v, launch) = persistent(&short);
        assert_eq!((v.split(&short, 132), launch.grid[0]), (Split::none(8), 8));
        // Without the split the grid is as before.
        let (_, launch) = choose(&few, &DeviceLimits::h100(), 132, None, false).unwrap();
        assert_eq!(launch.grid[0], 32);
    }

    #[test]
    fn the_grid_splits_the_tail_as_the_ctas_it_came_from() {
        // The kernel's parameters are built from the launch's grid, not the SM count.
        for (b, h, s, d) in
            [(4, 16, 4096, 128), (1, 4, 1024, 128), (3, 5, 777, 64), (1, 1, 16384, 256), (2, 3, 100, 64)]
        {
            let p = Problem::new(Shape::new(b, h, s, d), DType::F16);
            for ctas in [1, 2, 3, 7, 132] {
                let (v, launch) = choose(&p, &DeviceLimits::h100(), ctas, None, true).unwrap();
                assert_eq!(v.split(&p, launch.grid[0]), v.split(&p, ctas), "{p:?} on {ctas}");
            }
        }
    }

    #[test]
    fn every_tail_key_tile_is_in_one_piece_and_every_slot_is_written_once() {
        // The kernel's piece arithmetic (unit_start, unit_of, run_at, partial_slot), replayed.
        for (tail_tiles, nk, units) in [(68u32, 32u32, 132u32), (5, 9, 11), (32, 8, 64), (1, 2, 2), (2, 3, 3)]
        {
            let iters = (tail_tiles * nk) as u64;
            let start = |g: u32| (g as u64 * iters / units as u64) as u32;
            let unit_of = |x: u32| (((x as u64 + 1) * units as u64 - 1) / iters) as u32;
            let mut seen = vec![0u32; iters as usize];
            let mut slots = vec![0u32; 2 * units as usize];
            let mut pieces_of_tile = vec![0u32; tail_tiles as usize];
            for g in 0..units {
                let mut x = start(g);
                while x < start(g + 1) {
                    let (tile, j0) = (x / nk, x % nk);
                    let j1 = (start(g + 1) - tile * nk).min(nk);
                    (j0..j1).for_each(|j| seen[(tile * nk + j) as usize] += 1);
                    assert!(unit_of(tile * nk + j0) == g && unit_of(tile * nk + j1 - 1) == g);
                    pieces_of_tile[tile as usize] += 1;
                    if j0 > 0 || j1 < nk {
                        slots[(2 * g + u32::from(start(g) < tile * nk)) as usize] += 1;
                    }
                    x = tile * nk + j1;
                }
            }
            assert!(seen.iter().all(|&n| n == 1));
            assert!(slots.iter().all(|&n| n <= 1));
            // A tile's pieces are the units from the one holding its first key tile to its last's.
            for (t, &n) in pieces_of_tile.iter().enumerate() {
                let x0 = t as u32 * nk;
                assert_eq!(n, unit_of(x0 + nk - 1) - unit_of(x0) + 1);
            }
        }
    }

    #[test]
    fn head_groups_keep_k_and_v_within_l2() {
        // S=2048, D=128: 1 MiB of K and V per head, 32 heads to a group (of 128).
        let p =
            |s: usize, d: usize| Problem::new(Shape::new(16384 / s, 2048 / d, s, d), DType::Bf16).causal();
        assert_eq!(head_group(&p(2048, 128)), 32);
        // S=16384, D=128: 8 MiB per head, 4 to a group; S=512, D=64: 128 KiB, 256 (of 1024).
        assert_eq!(head_group(&p(16384, 128)), 4);
        assert_eq!(head_group(&p(512, 64)), 256);
        // Never more than there are; query heads sharing K/V (GQA 4:1) count once.
        assert_eq!(head_group(&Problem::new(Shape::new(1, 2, 64, 64), DType::Bf16)), 2);
        let gqa = Problem::new(Shape { heads_kv: 4, ..Shape::new(8, 16, 2048, 128) }, DType::Bf16);
        assert_eq!(head_group(&gqa), 128);
    }

    #[test]
    fn long_key_tiles_where_they_waste_little() {
        let keys = |s: usize, d: usize, causal: bool| {
            let p = Problem::new(Shape::new(16384 / s, 2048 / d, s, d), DType::Bf16);
            let p = if causal { p.causal() } else { p };
            choose(&p, &DeviceLimits::h100(), 132, None, true).unwrap().0.block_n
        };
        // 8192 keys: 57 tiles of 144 (8208 keys) at 1.5% less a key than 64 of 128; 4096: 29
        // tiles (4176 keys, 2% masked), no.
        assert_eq!([2048, 4096, 8192, 16384].map(|s| keys(s, 128, false)), [128, 128, 144, 144]);
        assert_eq!(keys(8192, 128, true), 128);
        assert_eq!((keys(8192, 64, false), keys(8192, 256, false)), (112, 64));
        // In the list CI compiles.
        let p = Problem::new(Shape::new(2, 16, 8192, 128), DType::Bf16);
        let (v, _) = choose(&p, &DeviceLimits::h100(), 132, None, true).unwrap();
        assert!(Variant::all().contains(&v), "{}", v.name());
    }

    #[test]
    fn shared_memory_is_what_the_kernel_uses() {
        // D=128, causal, S=8192: Q 128x128 + 2 stages of K and V, 128 keys each, 2 bytes = 160
        // KB, O staged (32 KB), the barriers (8 B each: Q full/empty, 4 per stage, O full/empty
        // for four warpgroups), the piece slot (32 B), merge flags (16 B) and O's destinations
        // (64 B), and 1 KB of alignment slack.
        let long = Problem::new(Shape::new(4, 16, 8192, 128), DType::Bf16).causal();
        let (v, _) = choose(&long, &DeviceLimits::h100(), 132, None, true).unwrap();
        assert_eq!(v.shared_bytes(), 163840 + 32768 + 256 + 1024);
        assert_eq!(v.threads(), 384);
        assert!(v.o_staged());
        // S=4096, the short causal tiles: Q 192x128 (48 KB) + 3 stages of K and V, 64 keys each
        // (96 KB), O staged (48 KB), the barriers with four more for the third stage (288 B).
        let (v, _) = choose(&problem(128).causal(), &DeviceLimits::h100(), 132, None, true).unwrap();
        assert_eq!((v.block_n, v.stages, v.consumers), (64, 3, 3));
        assert_eq!(v.shared_bytes(), 49152 + 98304 + 49152 + 288 + 1024);
        assert_eq!(v.threads(), 512);
        assert!(v.o_staged());
        // D=256: Q 64 KB + 2 x 2 x 64 keys x 512 B = 192 KB: no room to stage O.
        let (v, _) = choose(&problem(256), &DeviceLimits::h100(), 132, None, true).unwrap();
        assert_eq!(v.shared_bytes(), 196608 + 256 + 1024);
        assert!(!v.o_staged());
        // Two Q slots (D=128 without a mask, by default): a second Q tile where O's staging was, O
        // going out through them; the barriers 16 B more (the second slot's full/empty) and its
        // piece slot 32 B.
        let (q2, _) = choose(&problem(128), &DeviceLimits::h100(), 132, None, true).unwrap();
        assert_eq!(q2.shared_bytes(), 163840 + 32768 + 256 + 48 + 1024);
        assert!(q2.o_staged() && q2.name().contains("_q2") && !v.name().contains("_q2"));
        assert!(q2.defines().contains(&("ATTN_Q_SLOTS".into(), "2".into())));
        assert_eq!(q2.with_q_slots(1).unwrap(), Variant { q_slots: 1, ..q2 });
        // Only there: not causal, not at D=64.
        for p in [problem(128).causal(), problem(64)] {
            let (v, _) = choose(&p, &DeviceLimits::h100(), 132, None, true).unwrap();
            assert_eq!(v.q_slots, 1, "{}", v.name());
        }
        // Not at D=256 (Q 64 KB more would make 256 KB), nor three slots.
        let (v, _) = choose(&problem(256), &DeviceLimits::h100(), 132, None, true).unwrap();
        let err = v.with_q_slots(2).unwrap_err().to_string();
        assert!(err.contains("2 Q slots") && err.contains("263472 needed"), "{err}");
        assert!(v.with_q_slots(3).is_err());
    }

    #[test]
    fn the_register_split_fits_the_register_file() {
        for v in Variant::all() {
            let regs = match v.reallocates_registers() {
                true => 128 * PRODUCER_REGISTERS + 128 * v.consumers * v.consumer_registers(),
                false => v.threads() * v.register_budget(),
            };
            assert!(
                regs <= if v.reallocates_registers() { v.register_pool() } else { 65536 },
                "{}: {regs} registers",
                v.name()
            );
            // setmaxnreg.inc must raise, never lower, what a consumer had at entry.
            if v.reallocates_registers() {
                assert!(
                    v.register_budget() <= v.consumer_registers()
                        && v.register_budget() >= PRODUCER_REGISTERS
                );
            }
        }
        // Per dtype, 384 threads (two consumers): D=128 without a mask in 128- and 144-key tiles,
        // each with one and two Q slots (4); D=128 causal with one and two slots and from the
        // bottom (3); D=256 with either mask (2: no room for a second Q tile, O not staged).
        // 512 (three consumers): D=64 without a mask with one and two slots, causal with one and
        // two and from the bottom (5); D=128's short causal tiles, from the bottom (1). A window
        // on each head dim's tiles, with two Q slots too where they fit (D=64 and 128). Each of
        // these with the soft-cap too, but D=256's window, windows in two Q slots and D=128's
        // short causal tiles (Variant::capped). All of them with ALiBi too, but D=256's window
        // and causal soft-capped tiles (hands_over).
        let native: Vec<Variant> = Variant::all().into_iter().filter(|v| !v.pad && !v.seqs).collect();
        assert_eq!(native.iter().filter(|v| v.threads() == 384).count(), 2 * (2 * (9 + 3 + 9 + 1) - 2));
        assert_eq!(native.iter().filter(|v| v.threads() == 512).count(), 2 * 2 * (6 + 2 + 5 + 1));
        assert_eq!(native.len(), 140);
        // Padded (one per mask, with and without the soft-cap; no ALiBi, which the Ampere/Ada
        // family runs on those head dims): 6 at D=64 and 128, 5 at D=256 (no window with a
        // soft-cap), for each dtype.
        assert_eq!(Variant::all().iter().filter(|v| v.pad).count(), 34);
        // Sequences (each mask with and without the soft-cap and ALiBi, on each native head dim's
        // one tile configuration): 12 per head dim but D=256's 4 handed over (hands_over), and
        // its soft-capped causal mask (which spills with sequences), for each dtype.
        // The same again from a paged cache, and once more the five of D=64's that take its
        // paged tiles (paged_tiles: no window, no soft-cap under a causal mask or with ALiBi,
        // capped_sequence_tiles).
        assert_eq!(Variant::all().iter().filter(|v| v.seqs && !v.paged).count(), 2 * (12 + 12 + 7));
        assert_eq!(Variant::all().iter().filter(|v| v.paged).count(), 2 * (12 + 12 + 7 + 5));
    }

    #[test]
    fn sequences_and_paged_caches_plan_compiled_variants() {
        use attn_core::sequences::{KeyStore, batch_of};
        let h100 = DeviceLimits::h100();
        let all = Variant::all();
        for d in HEAD_DIMS {
            for (s, keys) in
                [512, 8192].into_iter().flat_map(|s| [(s, KeyStore::Packed), (s, KeyStore::DenseUsed)])
            {
                let shape = Shape { heads_kv: 4, ..Shape::new(1, 16, 1, d) };
                let (p, _) = batch_of(shape, DType::Bf16, &[s / 2, s, 1], &[s, s / 3, 7], keys);
                for m in [p, p.causal(), p.with_window(Some(100), Some(0)), p.with_softcap(30.0)] {
                    let (v, launch) = choose(&m, &h100, 132, None, true).unwrap();
                    assert!(v.seqs && all.contains(&v), "{} for {m} is not compiled in CI", v.name());
                    // The head dim's one tile configuration, whatever the longest sequence.
                    assert_eq!(v.block_n, tiles(d).block_n, "{}", v.name());
                    assert_eq!(v.split(&m, launch.grid[0]).units, 0, "{}: no split tail", v.name());
                    assert!(v.name().ends_with("_seqs"), "{}", v.name());
                    let notes = v.notes(&m, &launch, v.split(&m, launch.grid[0]));
                    assert!(notes.iter().any(|n| n.contains("ATTN_SEQS")), "{notes:?}");
                }
            }
            // A paged cache: the sequence variants, boxes of the largest multiple of 16 dividing
            // the tile's keys and the page size.
            for page_size in [16, 48, 64, 256] {
                let store = KeyStore::Paged { page_size, seed: 1 };
                let (paged, _) =
                    batch_of(Shape::new(1, 16, 1, d), DType::Bf16, &[300, 900], &[1000, 2000], store);
                let (v, launch) = choose(&paged, &h100, 132, None, true).unwrap();
                assert!(v.seqs && v.paged && all.contains(&v), "{} for {paged}", v.name());
                let rows = page_box(v.block_n, page_size);
                assert!(
                    rows.is_multiple_of(16)
                        && page_size.is_multiple_of(rows)
                        && v.block_n.is_multiple_of(rows)
                );
                let notes = v.notes(&paged, &launch, v.split(&paged, launch.grid[0]));
                assert!(notes.iter().any(|n| n.contains(&format!("box(es) of {rows} rows"))), "{notes:?}");
            }
            // Pages that are not a multiple of 16 keys: a typed refusal, as on Ampere/Ada.
            let store = KeyStore::Paged { page_size: 24, seed: 1 };
            let (odd, _) = batch_of(Shape::new(1, 16, 1, d), DType::Bf16, &[300, 900], &[1000, 2000], store);
            let e = choose(&odd, &h100, 132, None, true).unwrap_err().to_string();
            assert!(e.contains("multiples of 16"), "{e}");
            // A padded head dim with sequences: the Ampere/Ada family's.
            let (padded, _) =
                batch_of(Shape::new(1, 16, 1, d - 8), DType::Bf16, &[3, 9], &[100, 200], KeyStore::Packed);
            let e = choose(&padded, &h100, 132, None, true).unwrap_err().to_string();
            assert!(e.contains("Ampere/Ada family runs it"), "{e}");
        }
        // D=64 soft-capped under a causal mask: 96-key tiles with sequences, packed or paged
        // (capped_sequence_tiles), 112 dense; without a mask or ALiBi, a paged cache's tiles.
        let shape = Shape::new(1, 16, 1, 64);
        for (store, causal, block_n) in [
            (KeyStore::Packed, true, 96),
            (KeyStore::Paged { page_size: 64, seed: 1 }, true, 96),
            (KeyStore::Paged { page_size: 64, seed: 1 }, false, 64),
        ] {
            let (p, _) = batch_of(shape, DType::Bf16, &[300, 900], &[1000, 2000], store);
            let m = if causal { p.causal() } else { p }.with_softcap(30.0);
            assert_eq!(choose(&m, &h100, 132, None, true).unwrap().0.block_n, block_n, "{m}");
        }
        let dense = Problem::new(Shape::new(1, 16, 4096, 64), DType::Bf16).causal().with_softcap(30.0);
        assert_eq!(choose(&dense, &h100, 132, None, true).unwrap().0.block_n, 112);
    }

    #[test]
    fn windows_soft_caps_and_alibi_plan_compiled_variants() {
        let h100 = DeviceLimits::h100();
        let all = Variant::all();
        for d in HEAD_DIMS {
            for s in [1024, 4096, 16384] {
                let p = Problem::new(Shape::new(1, 16, s, d), DType::Bf16);
                let masks = [
                    p,
                    p.causal(),
                    p.with_window(Some(256), Some(0)),
                    p.with_window(None, Some(0)),
                    p.with_window(Some(8), None),
                ];
                let capped = masks.into_iter().flat_map(|m| [m, m.with_softcap(30.0)]);
                let biased = capped.flat_map(|m| {
                    [m, m.with_alibi(attn_core::Alibi::PerHead), m.with_alibi(attn_core::Alibi::PerBatchHead)]
                });
                for m in biased {
                    let windowed = KernelMask::of(&m) == KernelMask::Window;
                    let causal = KernelMask::of(&m) == KernelMask::Causal;
                    let (capped, biased) = (m.params.softcap.is_some(), m.params.alibi.is_some());
                    if hands_over(d, windowed, causal, capped, biased) {
                        let e = choose(&m, &h100, 132, None, true).unwrap_err().to_string();
                        assert!(e.contains("Ampere/Ada family runs it"), "{e}");
                        continue;
                    }
                    let (v, launch) = choose(&m, &h100, 132, None, true).unwrap();
                    assert!(all.contains(&v), "{} for {m} is not compiled in CI", v.name());
                    assert_eq!(v.softcap, m.params.softcap.is_some());
                    // ALiBi changes no other choice of the plan's.
                    assert_eq!(v.alibi, biased);
                    let plain = Problem { params: attn_core::Params { alibi: None, ..m.params }, ..m };
                    let (p, _) = choose(&plain, &h100, 132, None, true).unwrap();
                    assert_eq!(Variant { alibi: false, ..v }, p);
                    let notes = v.notes(&m, &launch, v.split(&m, launch.grid[0]));
                    assert_eq!(notes.iter().any(|n| n.contains("ALiBi")), v.alibi, "{notes:?}");
                    if v.window {
                        // The Q slots of no mask, the head dim's tiles, no split tail.
                        assert_eq!(
                            (v.q_slots, v.block_n),
                            (if v.softcap { 1 } else { q_slots_for(d, false) }, tiles(d).block_n),
                            "{}",
                            v.name()
                        );
                        assert_eq!(v.split(&m, launch.grid[0]).units, 0);
                    }
                }
            }
        }
        // A window equal to the causal mask takes the causal variant.
        let p = Problem::new(Shape::new(1, 16, 8192, 128), DType::Bf16);
        let (causal, _) = choose(&p.causal(), &h100, 132, None, true).unwrap();
        assert_eq!(choose(&p.with_window(None, Some(0)), &h100, 132, None, true).unwrap().0, causal);
    }

    #[test]
    fn an_l4_sized_device_gets_a_clear_error() {
        // The Hopper family runs on sm_90 only, but its plan is validated like any other.
        let err = choose(&problem(128), &DeviceLimits::l4(), 58, None, true).unwrap_err().to_string();
        assert!(err.contains("shared memory per block") && err.contains("101376"), "{err}");
    }

    #[test]
    fn unsupported_inputs_are_typed_errors() {
        let h100 = DeviceLimits::h100();
        for d in [0, 100, 4, 264] {
            let err = choose(&problem(d), &h100, 132, None, true).unwrap_err();
            assert!(
                matches!(err, Error::UnsupportedHeadDim { .. } | Error::EmptyDimension { .. }),
                "{d}: {err}"
            );
        }
        let err = choose(&problem(264), &h100, 132, None, true).unwrap_err().to_string();
        assert!(err.contains("multiples of 8 from 8 to 256"), "{err}");
        let f32 = Problem::new(Shape::new(1, 2, 64, 64), DType::F32);
        assert!(matches!(choose(&f32, &h100, 132, None, true), Err(Error::UnsupportedDType { .. })));
    }

    #[test]
    fn every_multiple_of_8_runs_the_next_kernel_padded() {
        let h100 = DeviceLimits::h100();
        let all = Variant::all();
        for d in (8..=256).step_by(8) {
            let next = HEAD_DIMS.into_iter().find(|&k| k >= d).unwrap();
            for p in [
                problem(d),
                problem(d).causal(),
                problem(d).with_softcap(30.0),
                problem(d).causal().with_softcap(30.0),
            ] {
                let (v, launch) = choose(&p, &h100, 132, None, true).unwrap();
                assert_eq!((v.head_dim, v.pad), (next, d != next), "{d}: {}", v.name());
                assert!(all.contains(&v), "{} for {p} is not compiled in CI", v.name());
                assert_eq!(v.name().ends_with("_pad"), v.pad);
                let notes = v.notes(&p, &launch, v.split(&p, launch.grid[0]));
                let said = notes
                    .iter()
                    .any(|n| n.contains(&format!("head dim {d} runs the D = {next} kernel padded")));
                assert_eq!(said, v.pad, "{notes:?}");
                // The padded build is the kernel's one configuration (no short or long key
                // tiles), ATTN_PAD added.
                if v.pad {
                    let t = tiles(next);
                    assert_eq!((v.block_n, v.stages, v.consumers), (t.block_n, t.stages, t.consumers));
                    assert!(v.defines().contains(&("ATTN_PAD".into(), "1".into())));
                }
            }
        }
        // A window with a soft-cap at D=256 spills there: 136..=248 too go to the Ampere/Ada family.
        let m = problem(200).with_window(Some(64), Some(0)).with_softcap(30.0);
        assert!(
            choose(&m, &h100, 132, None, true).unwrap_err().to_string().contains("Ampere/Ada family runs it")
        );
    }

    #[test]
    fn forced_tiles_are_checked() {
        let h100 = DeviceLimits::h100();
        let (v, _) =
            choose(&problem(128), &h100, 132, Some(Tiles { block_n: 176, stages: 2, consumers: 2 }), true)
                .unwrap();
        assert_eq!((v.block_n, v.stages), (176, 2));
        let err =
            choose(&problem(128), &h100, 132, Some(Tiles { block_n: 100, stages: 2, consumers: 2 }), true)
                .unwrap_err()
                .to_string();
        assert!(err.contains("multiple of 16"), "{err}");
        // 128 keys and 3 stages at D=128 fit (224 KB) without staging O, 4 do not (288 KB).
        let (v, _) =
            choose(&problem(128), &h100, 132, Some(Tiles { block_n: 128, stages: 3, consumers: 2 }), true)
                .unwrap();
        assert!(!v.o_staged() && v.shared_bytes() as usize <= SHARED_LIMIT);
        let err =
            choose(&problem(128), &h100, 132, Some(Tiles { block_n: 128, stages: 4, consumers: 2 }), true)
                .unwrap_err()
                .to_string();
        assert!(err.contains("shared memory per block"), "{err}");
    }

    #[test]
    fn forced_tiles_fill_in_the_consumers() {
        let unsaid = Some(Tiles { block_n: 64, stages: 3, consumers: 0 });
        let (v, _) = choose(&problem(64), &DeviceLimits::h100(), 132, unsaid, true).unwrap();
        assert_eq!((v.block_n, v.stages, v.consumers), (64, 3, tiles(64).consumers));
    }

    #[test]
    fn more_consumers_split_the_registers_that_are_left() {
        // What 128 x 40 registers for the producer leave of 64512, per consumer thread, and the
        // cap at entry (65536 over the threads). Four consumers only by forced tiles
        // (ATTN_CUDA_SM90_TILES=64:2:4); at D=64 even 64-key tiles spill there now (80 bytes
        // at 25ce4b4, by the cubin example), so none is planned.
        let persistent = |tiles| choose(&problem(64), &DeviceLimits::h100(), 132, Some(tiles), true);
        for (consumers, block_n, rows, threads, regs, entry) in
            [(3, 128, 192, 512, 152, 128), (4, 64, 256, 640, 104, 96)]
        {
            let (v, launch) = persistent(Tiles { block_n, stages: 2, consumers }).unwrap();
            assert_eq!((v.block_m(), v.threads(), launch.block[0]), (rows, threads, threads));
            assert_eq!((v.consumer_registers(), v.register_budget()), (regs, entry));
            assert!(v.name().contains(&format!("bm{rows}")));
        }
        assert!(persistent(Tiles { block_n: 64, stages: 2, consumers: 5 }).is_err());
    }

    #[test]
    fn names_are_distinct() {
        let all = Variant::all();
        let mut names: Vec<String> = all.iter().map(|v| v.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }

    #[test]
    fn causal_blocks_are_laid_from_the_bottom_where_o_is_staged() {
        let h100 = DeviceLimits::h100();
        let pick = |d, causal: bool| {
            let p = if causal { problem(d).causal() } else { problem(d) };
            Variant { bottom: true, ..choose(&p, &h100, 132, None, true).unwrap().0 }
        };
        for d in [64, 128] {
            let v = pick(d, true);
            let (default, _) = choose(&problem(d).causal(), &h100, 132, None, true).unwrap();
            assert_eq!(default, v, "the default");
            assert!(v.bottoms() && v.name().contains("_bottom"), "{}", v.name());
            assert!(v.defines().contains(&("ATTN_BOTTOM".into(), "1".into())));
            assert!(Variant::all().contains(&v), "{}", v.name());
            let top = Variant { bottom: false, ..v };
            assert!(!top.bottoms() && !top.name().contains("_bottom"));
        }
        // Not without a mask, not at D=256 (O stored from registers).
        assert!(!pick(64, false).bottoms());
        assert!(!pick(256, true).bottoms());
        // Asked where it cannot be: an error for a causal variant, never a silent top order.
        let v = Variant { bottom: false, ..pick(256, true) };
        let err = v.with_bottom(true).unwrap_err().to_string();
        assert!(err.contains("from the bottom") && err.contains(&v.name()), "{err}");
        assert!(v.with_bottom(false).is_ok());
        assert!(pick(64, true).with_bottom(true).unwrap().bottoms());
        assert!(pick(64, false).with_bottom(true).is_ok());
    }
}
