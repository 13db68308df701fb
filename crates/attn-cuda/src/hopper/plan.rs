//! Which Hopper specialisation runs a problem, with what launch, and whether it fits. Pure host
//! logic, tested without a GPU against the H100's stated limits.

use super::wgmma;
use crate::{Arch, CompileRequest};
use attn_core::{DType, DeviceLimits, Error, Launch, Problem, Result};
use std::fmt;

/// Head dimensions the Hopper kernel is specialised for: whole 64-column (128-byte) blocks.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Shared memory a CTA may have on the devices this family runs on (the H100's and H200's opt-in
/// limit); the kernel asserts it too.
pub const SHARED_LIMIT: usize = 227 * 1024;

/// Registers per thread of the producer warpgroup after `setmaxnreg`: it only issues copies and
/// takes tiles from the scheduler (with 24 that spilled), and cuts the split tail into pieces
/// (with 32 that spilled). 40 leaves the consumers what 32 did: 232 each for two warpgroups,
/// 152 for three (in units of 8).
pub const PRODUCER_REGISTERS: u32 = 40;

/// Registers per consumer thread after `setmaxnreg` at most: the O and S accumulators (D / 2 +
/// BN / 2 floats), P (BN / 4) and the softmax state, with no spill.
pub const CONSUMER_REGISTERS: u32 = 240;

/// The registers the warpgroups of a CTA may claim together after `setmaxnreg`. `setmaxnreg.inc`
/// waits until the registers are free, so asking for more hangs the kernel: 128 x 32 + 256 x
/// 240, the whole 65536, hung every launch on the H100
/// (bench/results/2026-11-25-h100-hopper-976d895); 64512 (FlashAttention-3's 24 + 2 x 240)
/// leaves a 1024-register margin. The pool is also at most what the launch gave the CTA (its
/// threads times the cap at entry, [`Variant::register_pool`]): with four consumers (640 threads,
/// 96 each at entry, 61440 in all) the 112 that 64512 would leave each consumer hung every launch
/// (bench/results/2026-11-26-h100-hopper-knobs-d4ae16f).
pub const REGISTER_POOL: u32 = 64512;

/// The fewest key tiles in a unit of the split tail ([`Split`]): a partial piece writes its O
/// and reads the others' (about a key tile's worth of time at D=128), so runs shorter than this
/// would spend more on the merge than they save.
pub const MIN_RUN: u64 = 4;

/// Key tiles the split must take off the busiest CTA (or a quarter of its work, for problems of
/// one wave or less) before the tail is split: each piece pays a tile's start and end again and
/// the merge, which a small gain does not cover. Measured on the H100, D=128 without a mask
/// (bench/results/2026-11-25-h100-hopper-split-6ccb445): 128 tiles on 132 SMs, cut into 132
/// runs, were 13% slower at S=4096 and 4% at S=16384 (a gain of 0 and 3 key tiles); 2048 tiles
/// of 16 key tiles (S=2048, a gain of 7) came out even or 2% slower, of 32 (15) 0.6% faster, of
/// 128 (62) 3%; one head's 32 tiles at S=4096 (a gain of 24) 1.85x, 32 tiles of 8 key tiles
/// (S=1024, 4 of 8) 1.12x.
pub const MIN_GAIN: u64 = 12;

/// How the persistent form deals out its work (`Piece` in the kernel). Without a mask every
/// tile takes the same time, so `tiles` over `ctas` CTAs leaves the last wave part-empty: at
/// D=128, S=4096 on 132 SMs, 2048 tiles are 15 waves and 68 tiles, and 64 SMs wait out the 16th
/// (3% of the whole). The tail (the tiles past the last whole wave, or all of them when there
/// are fewer tiles than CTAs) is cut instead into `units` runs of its key tiles, as even as
/// integers allow and at least [`MIN_RUN`] long, which the CTAs draw after the whole tiles (where
/// that gains at least [`MIN_GAIN`] key tiles or a quarter of the busiest CTA's work); a
/// tile cut between runs is merged by the piece that ends last. Under a causal mask tiles differ
/// in length and go longest first instead: no split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// Tiles handed out whole: the first `whole` of the tile order.
    pub whole: u32,
    /// Units the tail's key tiles are dealt to (0: no split).
    pub units: u32,
    /// Tiles in the tail.
    pub tail_tiles: u32,
    /// Key tiles per tile (every tile's, without a mask).
    pub key_tiles: u32,
}

impl Split {
    /// Every tile whole.
    pub fn none(tiles: u32) -> Split {
        Split { whole: tiles, units: 0, tail_tiles: 0, key_tiles: 0 }
    }

    /// Key tiles in the tail.
    pub fn tail_iters(&self) -> u32 {
        self.tail_tiles * self.key_tiles
    }

    /// The launch's u32 counters: the scheduler's two, then one per tail tile and consumer
    /// warpgroup (its pieces that have arrived).
    pub fn counters(&self, consumers: u32) -> usize {
        2 + (self.tail_tiles * consumers) as usize
    }

    /// f32s of partial results: two slots per unit (its first and last piece), each with, per
    /// consumer thread, its O accumulators (D / 2) and its rows' maxima and sums (4).
    pub fn partial_floats(&self, head_dim: usize, consumers: u32) -> usize {
        2 * self.units as usize * consumers as usize * 128 * (head_dim / 2 + 4)
    }
}

/// How the kernel's warpgroups share the work: each form adds one thing to the one before,
/// following the steps the kernel was built in, so that each can be verified and timed alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Form {
    /// One warpgroup, no producer: K/V by `cp.async` into two stages, then wgmma products,
    /// one tile at a time.
    CpAsync,
    /// Warp-specialized: a producer warpgroup copies Q, K and V with TMA into a ring of stages
    /// guarded by mbarriers; two or three consumer warpgroups (64 query rows each) compute.
    Tma,
    /// Inside each consumer warpgroup, tile j's softmax runs while the tensor cores compute
    /// tile j - 1's P·V (issued together with tile j's S).
    Overlap,
    /// The consumer warpgroups take turns issuing their products (named barriers, in a ring), so
    /// that one's softmax runs under another's products.
    PingPong,
    /// One CTA per SM; each takes its next tile from a counter in global memory as it finishes
    /// one (a persistent grid with dynamic scheduling; causal: longest first).
    Persistent,
}

impl Form {
    /// Every form, in the order they build on each other.
    pub const ALL: [Form; 5] = [Form::CpAsync, Form::Tma, Form::Overlap, Form::PingPong, Form::Persistent];

    /// The name in kernel names and `ATTN_CUDA_FORM`.
    pub fn as_str(self) -> &'static str {
        match self {
            Form::CpAsync => "cpasync",
            Form::Tma => "tma",
            Form::Overlap => "overlap",
            Form::PingPong => "pingpong",
            Form::Persistent => "persistent",
        }
    }

    /// The form named `name` (as [`Form::as_str`] spells it).
    pub fn parse(name: &str) -> Option<Form> {
        Form::ALL.into_iter().find(|f| f.as_str() == name.trim())
    }
}

impl fmt::Display for Form {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One specialisation of `kernels/flash_fwd_sm90.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// f16 or bf16.
    pub dtype: DType,
    /// Head dimension (64, 128 or 256).
    pub head_dim: usize,
    /// Keys per tile: the N of S's wgmma.
    pub block_n: usize,
    /// K/V stages in the shared-memory ring.
    pub stages: u32,
    /// Consumer warpgroups of 64 query rows each: 1 in the `cp.async` form, 2 or 3 after it.
    pub consumers: u32,
    /// Causal (bottom-right) masking compiled in.
    pub causal: bool,
    /// How the warpgroups share the work.
    pub form: Form,
    /// Whether the consumer warpgroups take turns issuing their products (from the ping-pong
    /// form on, unless turned off to measure what the turns cost).
    pub pingpong: bool,
    /// Causal, from the overlap form on: each consumer warpgroup computes only the key tiles its
    /// own 64 rows see and passes over the rest of its tile's (`ATTN_TRIM`; off unless asked).
    pub trim: bool,
    /// Q tiles in shared memory (`ATTN_Q_SLOTS`): 1, loaded for the next piece once every
    /// consumer has issued its last S of this one; or 2 (overlapped forms, where shared memory
    /// has room), so that the next piece's Q loads while this one's key tiles run, with O staged
    /// in its own tile's Q slot. See [`Variant::with_q_slots`].
    pub q_slots: u32,
    /// Causal, persistent form, O staged: a head's query blocks end at its last row, so that
    /// the block `seq_q % block_m` leaves short is the first (whose rows see the fewest keys), not
    /// the last (whose rows see the most); `ATTN_BOTTOM`, see [`Variant::bottoms`]. The default
    /// where it applies (`ATTN_CUDA_SM90_BLOCKS=top` for the old order). Counted from the tile
    /// shapes (192 x 96 at D=64, every block's key tiles times its rows, padding included): 4.2%
    /// fewer products at S=4096, 12% at 1024, 1.1% at 16384, none at 2048 or 8192 (there the
    /// last block's padding rows become every block's part-filled last key tile). Measured on the
    /// H100 at D=64, three interleaved rounds (bench/results/2026-11-26-h100-hopper-bottom-781ff61):
    /// S=4096 420.4-420.5 TFLOP/s against 405.4-406.7 from the top, S=1024 283-292 against
    /// 261-264, S=16384 +1.3%, S=2048 and 8192 even.
    pub bottom: bool,
    /// A diagnostic build (`ATTN_TRACE`, asked for by `ATTN_CUDA_SM90_TRACE`): the kernel stamps
    /// each piece's steps in SM cycles into a buffer the host writes out (see
    /// `TRACE_LEN_PER_CTA` in `hopper/launch.rs`). Never planned unless asked for.
    pub trace: bool,
}

impl Variant {
    /// Registers per consumer thread after `setmaxnreg`: what the producer's
    /// [`PRODUCER_REGISTERS`] leave of the [`Variant::register_pool`], in units of 8, at most
    /// [`CONSUMER_REGISTERS`] (232 with two consumers, 152 with three, 104 with four).
    pub fn consumer_registers(&self) -> u32 {
        let left = self.register_pool() - 128 * PRODUCER_REGISTERS;
        CONSUMER_REGISTERS.min(left / (128 * self.consumers) / 8 * 8)
    }

    /// Whether the kernel lays its query blocks from the bottom ([`Variant::bottom`] where it
    /// applies: causal, the persistent form, O staged. The first block's rows before 0 are TMA's
    /// zero fill on load; a warpgroup whose rows start there stores O from registers, skipping
    /// them, as a TMA store at a negative row faults. D=256, whose O is not staged, keeps the top
    /// order: the combination was never run).
    pub fn bottoms(&self) -> bool {
        self.bottom && self.causal && self.form == Form::Persistent && self.o_staged()
    }

    /// This variant with its causal query blocks laid from the bottom or not, or why they cannot
    /// be: where asked of a causal variant whose blocks cannot be (not the persistent form, or O
    /// not staged, as at D=256), an error rather than the usual order under another name.
    /// Without a mask there is no order to change, and the setting is left as asked.
    pub fn with_bottom(self, bottom: bool) -> Result<Variant> {
        let v = Variant { bottom, ..self };
        match bottom && self.causal && !v.bottoms() {
            false => Ok(v),
            true => Err(Error::Unsupported {
                backend: "cuda (Hopper family)".into(),
                what: format!(
                    "causal query blocks from the bottom in {}: only in the persistent form with O staged \
                     through shared memory; ATTN_CUDA_SM90_BLOCKS=top",
                    self.name()
                ),
            }),
        }
    }

    /// Whether the kernel trims each warpgroup's key tiles ([`Variant::trim`] where it applies).
    pub fn trims(&self) -> bool {
        self.trim && self.causal && self.form >= Form::Overlap
    }

    /// Query rows per CTA tile: 64 per consumer warpgroup.
    pub fn block_m(&self) -> usize {
        64 * self.consumers as usize
    }

    /// Threads per CTA: the consumer warpgroups and, from the TMA form on, the producer.
    pub fn threads(&self) -> u32 {
        128 * (self.consumers + u32::from(self.form >= Form::Tma))
    }

    /// Whether the kernel moves registers from the producer to the consumers (`setmaxnreg`):
    /// with 384 threads the cap at entry is 168 per thread, under what the consumers need.
    pub fn reallocates_registers(&self) -> bool {
        self.threads() > 256
    }

    /// Whether the launch holds the persistent scheduler's counters (zero at every launch:
    /// [`Split::counters`]).
    pub fn uses_tile_counters(&self) -> bool {
        self.form >= Form::Persistent
    }

    /// Dynamic shared memory: Q, `stages` K and V tiles (16-bit), O on its way out where it is
    /// staged, the mbarriers, the piece slot and merge flags (32 bytes), and 1024 bytes of slack
    /// to align the tiles to the 128-byte swizzle's 1024-byte period. Mirrors `SMEM_BYTES` in
    /// `kernels/flash_fwd_sm90.cu`.
    pub fn shared_bytes(&self) -> u32 {
        (self.unstaged_bytes() + if self.o_staged() && self.q_slots == 1 { self.o_bytes() } else { 0 }) as u32
    }

    fn unstaged_bytes(&self) -> usize {
        let q = self.q_slots as usize * self.block_m() * self.head_dim * 2;
        let kv = 2 * self.stages as usize * self.block_n * self.head_dim * 2;
        // The mbarriers (Q's, the stages', and O's full/empty for each of up to four consumer
        // warpgroups), a piece slot (8 ints: the piece and its tile) per Q slot, the merge flags
        // (4 ints) and where each warpgroup's O goes (4 ints each).
        let barriers = 8 * (2 * self.q_slots as usize + 4 * self.stages as usize + 8)
            + 32 * self.q_slots as usize
            + 16
            + 64;
        q + kv + barriers + 1024
    }

    fn o_bytes(&self) -> usize {
        self.block_m() * self.head_dim * 2
    }

    /// Whether O goes out through shared memory and a TMA store (coalesced, and the rows past
    /// the sequence are TMA's to skip): in the TMA forms, where shared memory has room for it
    /// next to the rest (not at D = 256, whose Q and K/V take 192 KB); with two Q slots always,
    /// in its tile's Q slot.
    pub fn o_staged(&self) -> bool {
        self.form >= Form::Tma
            && (self.q_slots == 2 || self.unstaged_bytes() + self.o_bytes() <= SHARED_LIMIT)
    }

    /// This variant with `slots` Q slots, or why it cannot have them: two need an overlapped
    /// form and room for a second Q tile (O then goes out through the Q slots, so the room is
    /// the second tile's, not O's).
    pub fn with_q_slots(self, slots: u32) -> Result<Variant> {
        let v = Variant { q_slots: slots, ..self };
        let fits =
            slots == 1 || (slots == 2 && self.form >= Form::Overlap && v.unstaged_bytes() <= SHARED_LIMIT);
        match fits {
            true => Ok(v),
            false => Err(Error::Unsupported {
                backend: "cuda (Hopper family)".into(),
                what: format!(
                    "{slots} Q slots in {}: 1, or 2 in the overlapped forms where two Q tiles and the K/V stages fit \
                     {SHARED_LIMIT} bytes of shared memory ({} needed)",
                    self.name(),
                    v.unstaged_bytes()
                ),
            }),
        }
    }

    /// The name of the specialisation: dtype, head dim, tiles, form, mask.
    pub fn name(&self) -> String {
        format!(
            "flash_sm90_{}_d{}_bm{}_bn{}_s{}_{}{}{}{}{}{}{}",
            self.dtype,
            self.head_dim,
            self.block_m(),
            self.block_n,
            self.stages,
            self.form,
            if self.form >= Form::PingPong && !self.pingpong { "_noturns" } else { "" },
            if self.trims() { "_trim" } else { "" },
            if self.q_slots == 2 { "_q2" } else { "" },
            if self.bottoms() { "_bottom" } else { "" },
            if self.causal { "_causal" } else { "" },
            if self.trace { "_trace" } else { "" }
        )
    }

    /// The NVRTC `-D` defines that select it.
    pub fn defines(&self) -> Vec<(String, String)> {
        let flag = |b: bool| u8::from(b).to_string();
        let (producer, consumer) = match self.reallocates_registers() {
            true => (PRODUCER_REGISTERS, self.consumer_registers()),
            false => (0, 0),
        };
        vec![
            ("ATTN_BF16".into(), flag(self.dtype == DType::Bf16)),
            ("ATTN_D".into(), self.head_dim.to_string()),
            ("ATTN_BN".into(), self.block_n.to_string()),
            ("ATTN_CONSUMERS".into(), self.consumers.to_string()),
            ("ATTN_STAGES".into(), self.stages.to_string()),
            ("ATTN_CAUSAL".into(), flag(self.causal)),
            ("ATTN_TMA".into(), flag(self.form >= Form::Tma)),
            ("ATTN_OVERLAP".into(), flag(self.form >= Form::Overlap)),
            ("ATTN_PINGPONG".into(), flag(self.form >= Form::PingPong && self.pingpong)),
            ("ATTN_PERSISTENT".into(), flag(self.form >= Form::Persistent)),
            ("ATTN_O_STAGED".into(), flag(self.o_staged())),
            ("ATTN_PRODUCER_REGS".into(), producer.to_string()),
            ("ATTN_CONSUMER_REGS".into(), consumer.to_string()),
            ("ATTN_TRIM".into(), flag(self.trims())),
            ("ATTN_Q_SLOTS".into(), self.q_slots.to_string()),
            ("ATTN_BOTTOM".into(), flag(self.bottoms())),
            ("ATTN_TRACE".into(), flag(self.trace)),
        ]
    }

    /// The NVRTC request that compiles it (for sm_90a only: wgmma, TMA and setmaxnreg are
    /// Hopper's own). Its name encodes every define, since compiled kernels are cached by name.
    pub fn request(&self) -> CompileRequest {
        let mut req = CompileRequest::new(self.name(), super::SOURCE, Arch::Sm90a)
            .header("sm90_wgmma.cuh", wgmma::header(self.dtype, self.block_n, self.head_dim));
        for (name, text) in super::HEADERS {
            req = req.header(*name, *text);
        }
        for (k, v) in self.defines() {
            req = req.define(k, v);
        }
        req
    }

    /// The registers a thread may hold at entry without a spill: 255, or with `setmaxnreg` the
    /// cap that 65536 registers over the CTA's threads give (168 for 384 threads), which the
    /// compiler then allocates to. CI fails a variant over it, or with any spill.
    pub fn register_budget(&self) -> u32 {
        match 65536 / self.threads() {
            cap if cap >= 255 => 255,
            cap => cap / 8 * 8, // allocated in units of 8
        }
    }

    /// The registers `setmaxnreg` may hand out in a CTA: what the launch allocated (threads times
    /// [`Variant::register_budget`]), at most [`REGISTER_POOL`]. `setmaxnreg.inc` waits for
    /// registers that are free in the CTA's own allocation, so asking for more hangs.
    pub fn register_pool(&self) -> u32 {
        REGISTER_POOL.min(self.threads() * self.register_budget())
    }

    /// Every specialisation the backend can choose, for the CI compile check: each head dim's
    /// tiles in every form (and the [`long_tiles`] and [`short_causal_tiles`] where a head dim
    /// has them), both masks, both dtypes, the trimmed causal ones ([`Variant::trim`],
    /// whose loop ptxas once took for divergent code), the persistent ones with two Q slots
    /// ([`Variant::q_slots`]) where they fit, and the causal persistent ones in both block orders
    /// ([`Variant::bottom`]) where they have two. Tiles forced by
    /// `ATTN_CUDA_SM90_TILES` and the forms without turns are compiled where they are asked for.
    pub fn all() -> Vec<Variant> {
        let mut v = vec![];
        for dtype in [DType::F16, DType::Bf16] {
            for head_dim in HEAD_DIMS {
                for causal in [false, true] {
                    for form in Form::ALL {
                        let Tiles { block_n, stages, consumers } = tiles(head_dim, form);
                        let pingpong = form >= Form::PingPong;
                        let mut here = vec![Variant {
                            dtype,
                            head_dim,
                            block_n,
                            stages,
                            consumers,
                            causal,
                            form,
                            pingpong,
                            trim: false,
                            q_slots: 1,
                            bottom: false,
                            trace: false,
                        }];
                        if let Some(long) = long_tiles(head_dim, form, causal) {
                            here.push(Variant { block_n: long.block_n, ..here[0] });
                        }
                        if causal && form >= Form::Overlap {
                            here.push(Variant { trim: true, ..here[0] });
                        }
                        // Each with two Q slots too, in the persistent form, where they fit.
                        if form == Form::Persistent {
                            let twins: Vec<Variant> =
                                here.iter().filter_map(|x| x.with_q_slots(2).ok()).collect();
                            here.extend(twins);
                            // Blocks from the bottom (the default where they apply), compiled
                            // next to the top order that ATTN_CUDA_SM90_BLOCKS=top asks for.
                            let bottom = Variant { bottom: true, ..here[0] };
                            if bottom.bottoms() {
                                here.push(bottom);
                            }
                        }
                        // The short causal tiles, as planned: one Q slot, blocks from the bottom.
                        if let Some(t) = short_causal_tiles(head_dim, form, causal) {
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
        }
        v
    }

    /// Tiles of `problem` this variant computes: query blocks times batch times heads.
    pub fn tiles(&self, problem: &Problem) -> u64 {
        let s = problem.shape;
        (s.seq_q.div_ceil(self.block_m()) * s.batch * s.heads_q) as u64
    }

    /// How the persistent form splits the tail of `problem` over `ctas` CTAs ([`Split`]);
    /// `Split::none` in the other forms, under a causal mask, or where it would not help (the
    /// tiles fill whole waves, runs of [`MIN_RUN`] would not outnumber the tail's tiles, or the
    /// busiest CTA would gain less than [`MIN_GAIN`] key tiles and a quarter of its work).
    /// The grid [`Variant::launch`] gives for `ctas` splits the same way as `ctas`.
    pub fn split(&self, problem: &Problem, ctas: u32) -> Split {
        let tiles = self.tiles(problem).min(i32::MAX as u64) as u32;
        let key_tiles = problem.shape.seq_k.div_ceil(self.block_n) as u64;
        let rest = tiles % ctas.max(1);
        if self.form < Form::Persistent || self.causal || rest == 0 || key_tiles == 0 {
            return Split::none(tiles);
        }
        let units = (rest as u64 * key_tiles / MIN_RUN).min(ctas as u64) as u32;
        // The kernel's piece arithmetic multiplies units by the tail's key tiles in 32 bits.
        if units <= rest || units as u64 * rest as u64 * key_tiles > i32::MAX as u64 {
            return Split::none(tiles);
        }
        // The busiest CTA's key tiles: a whole tile of the last wave, or its run of the tail.
        let unsplit = tiles.div_ceil(ctas.max(1)) as u64 * key_tiles;
        let gain = key_tiles - (rest as u64 * key_tiles).div_ceil(units as u64);
        if gain < MIN_GAIN && 4 * gain < unsplit {
            return Split::none(tiles);
        }
        Split { whole: tiles - rest, units, tail_tiles: rest, key_tiles: key_tiles as u32 }
    }

    /// The launch on a device with `sms` multiprocessors: a CTA per tile, or (persistent) one
    /// per SM, each taking units of work (tiles, then runs of the split tail: `split` says
    /// whether to cut it) from the scheduler's counter after its first, `blockIdx.x`.
    pub fn launch(&self, problem: &Problem, sms: u32, split: bool) -> Launch {
        let tiles = self.tiles(problem).min(i32::MAX as u64) as u32;
        let grid = match self.form >= Form::Persistent {
            true => {
                let ctas = sms.max(1);
                let s = if split { self.split(problem, ctas) } else { Split::none(tiles) };
                (s.whole + s.units).min(ctas)
            }
            false => tiles,
        };
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
        let mut notes = vec![match self.form {
            Form::CpAsync => format!(
                "sm_90a wgmma, one warpgroup of 128 threads: cp.async K/V into {} stages, {} query rows",
                self.stages,
                self.block_m()
            ),
            _ => format!(
                "sm_90a warp-specialized: warpgroup {} produces (TMA copies of Q, K, V; {} registers per thread \
                 after setmaxnreg), warpgroups 0-{} consume (wgmma; {} registers per thread), {} threads",
                self.consumers,
                PRODUCER_REGISTERS,
                self.consumers - 1,
                self.consumer_registers(),
                self.threads()
            ),
        }];
        notes.push(format!(
            "shared memory: Q {} B{}, K and V {} stages of {kv} B each, 128-byte swizzled (TMA's and wgmma's layout)",
            self.block_m() * self.head_dim * 2,
            match self.q_slots {
                2 => " x 2 slots (the next piece's Q loads under this one's key tiles)",
                _ => "",
            },
            self.stages
        ));
        if self.form >= Form::Overlap {
            notes.push("each tile's softmax runs under the previous tile's P·V (overlap)".into());
        }
        if self.form >= Form::PingPong {
            notes.push("the consumer warpgroups take turns issuing products (ping-pong)".into());
        }
        if self.uses_tile_counters() {
            notes.push(format!(
                "persistent: {} CTAs take tiles from a counter as they finish one (put back to zero by \
                 the last CTA)",
                launch.grid[0]
            ));
        }
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
        if self.causal && self.form >= Form::Tma {
            notes.push(format!(
                "causal tile order: longest first within groups of {} heads, whose K and V fit L2{}",
                super::launch::head_group(problem),
                match self.bottoms() {
                    true => "; query blocks laid from the last row, so that a short block is the first",
                    false => "",
                }
            ));
        }
        notes.push(match self.o_staged() {
            true if self.q_slots == 2 => "O leaves through its tile's Q slot and a TMA store".into(),
            true => "O leaves through shared memory and a TMA store".into(),
            false => "O is stored from registers (no room left in shared memory to stage it)".into(),
        });
        notes
    }
}

/// A tile configuration: keys per tile, K/V stages, consumer warpgroups (64 query rows each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    /// Keys per tile: the N of S's wgmma, a multiple of 16 up to 256.
    pub block_n: usize,
    /// K/V stages in the shared-memory ring.
    pub stages: u32,
    /// Consumer warpgroups (ignored by the `cp.async` form, which has one). In tiles forced on
    /// [`choose`], 0 stands for the head dim's default.
    pub consumers: u32,
}

/// The tiles of a head dim and form. The S accumulators (BN / 2 registers) and O's (D / 2) fit
/// the consumers' registers together with P (BN / 4); two stages of K and V with Q fit the
/// H100's 227 KB (D = 256: 64 KB of Q and 128 KB of K/V). The `cp.async` form's one warpgroup
/// also computes the copies' addresses, and at D = 256 spills with 64 keys.
///
/// D = 64 takes three consumer warpgroups (192 rows): its softmax costs as much as its products
/// (one exp2 per score on the multi-function unit, 16 a clock per SM, against 4·64 tensor-core
/// FLOPs), and with three warpgroups two can be in their softmax while the third's products run.
/// Measured on the H100 against two warpgroups and 128 keys, S = 4096 / 16384: 469 / 522 against
/// 424 / 460 TFLOP/s without a mask, 377 / 489 against 354 / 425 causal
/// (bench/results/2026-11-25-h100-hopper-20f664e). D = 64's tiles are 112 keys in three stages
/// (152 registers each; 128 keys spill): against 96 keys in
/// two (the default until 2026-11-26), three interleaved rounds on the H100, ratios to cuDNN,
/// causal / no mask: S = 2048 1.025 / 1.080 against 0.964 / 1.032, S = 4096 1.112 / 1.189 against
/// 1.076 / 1.146, S = 8192 1.164 / 1.219 against 1.129 / 1.190, S = 1024 0.916 / 0.901 against
/// 0.895 / 0.890; 112 keys in two stages in between, 64 or 80 keys (two or three stages) slower
/// (bench/results/2026-11-26-h100-hopper-tiles-8c44a2b). At D = 128, 96 and 112 keys were slower
/// than 128 at S = 2048 and 4096 with either mask (the same calls), and three consumers (64
/// keys) slower but for causal sequences up to 4096 keys ([`short_causal_tiles`]).
pub fn tiles(head_dim: usize, form: Form) -> Tiles {
    match (head_dim, form) {
        (256, Form::CpAsync) => Tiles { block_n: 32, stages: 2, consumers: 1 },
        (_, Form::CpAsync) => Tiles { block_n: 128, stages: 2, consumers: 1 },
        (64, _) => Tiles { block_n: 112, stages: 3, consumers: 3 },
        (256, _) => Tiles { block_n: 64, stages: 2, consumers: 2 },
        _ => Tiles { block_n: 128, stages: 2, consumers: 2 },
    }
}

/// Longer key tiles than [`tiles`]' where they were measured faster per key: D = 128 in the
/// persistent form without a mask, 144 keys (the S accumulators 72 registers, P 36). Measured
/// on the H100 against 128, interleaved, three rounds (bench/results/2026-11-25-h100-hopper-bn144-
/// ba763ae): S = 8192 656.5-678.1 against 647.6-649.0 TFLOP/s, S = 16384 682.9-692.6 against
/// 678.1-685.8; at S = 4096 even (630.0-633.3 against 611.3-635.9), where 4096 keys make 29 tiles
/// of 144, the last 64 keys long: 2% of the products wasted on masked keys. [`key_tiles_for`]
/// takes them where that waste is smaller than what they gain.
pub fn long_tiles(head_dim: usize, form: Form, causal: bool) -> Option<Tiles> {
    match (head_dim, form, causal) {
        (128, Form::Persistent, false) => Some(Tiles { block_n: 144, ..tiles(head_dim, form) }),
        _ => None,
    }
}

/// Tiles for short causal sequences where they were measured faster than [`tiles`]': D = 128 in
/// the persistent form under a causal mask takes three consumer warpgroups (192 query rows) on
/// 64-key tiles in three stages where the keys are at most [`SHORT_CAUSAL_MAX_KEYS`]. Against
/// [`tiles`]' two on 128 keys, three interleaved rounds on the H100, ratios to cuDNN
/// (bench/results/2026-11-26-h100-hopper-short-b38aefc): S = 512 0.821 against 0.801, S = 1024
/// 0.967 against 0.941, S = 2048 1.077 against 1.065 (and 1.035 against 1.022 in an earlier call),
/// S = 4096 1.123 against 1.118; S = 8192 even by the medians (627.0 TFLOP/s each), S = 16384
/// slower (1.153 against 1.166). Without a mask they were slower at S = 512 and 1024.
pub fn short_causal_tiles(head_dim: usize, form: Form, causal: bool) -> Option<Tiles> {
    match (head_dim, form, causal) {
        (128, Form::Persistent, true) => Some(Tiles { block_n: 64, stages: 3, consumers: 3 }),
        _ => None,
    }
}

/// The most keys for which [`short_causal_tiles`] are taken.
pub const SHORT_CAUSAL_MAX_KEYS: usize = 4096;

/// How many Q slots ([`Variant::q_slots`]) a variant of `form` takes by default: two at D = 128
/// without a mask in the persistent form, where loading the next piece's Q under this one's key
/// tiles was measured a little faster at S = 2048 (1.5-3.4% by the means of two runs on the H100,
/// of three and four interleaved rounds: bench/results/2026-11-26-h100-hopper-qslots-a9e155f and
/// -targets-e5b4086) and at S = 4096 by 1.7-2.7% (0-1.3% by the medians: one fast round) and
/// even at S = 8192 and 16384; one elsewhere, where two were even or slower (D = 64 without a
/// mask 1.5-4% slower, causal within 2% either way). A small gain, near the rounds' spread.
pub fn q_slots_for(head_dim: usize, causal: bool, form: Form) -> u32 {
    match (head_dim, causal, form) {
        (128, false, Form::Persistent) => 2,
        _ => 1,
    }
}

/// What a key of a [`long_tiles`] tile costs against one of [`tiles`]' (per 1000): 1.5% less,
/// as measured at S = 8192 (where 144-key tiles waste 0.2% of their keys and 128-key ones none).
const LONG_TILE_COST_PER_MILLE: usize = 985;

/// The tiles of `form` for `problem`: [`short_causal_tiles`] up to [`SHORT_CAUSAL_MAX_KEYS`]
/// keys; [`long_tiles`] where the keys they pad the sequence to, at their lower cost per key,
/// come to less than [`tiles`]' (S = 8192 and 16384 at D = 128, not S = 2048 or 4096); else
/// [`tiles`].
pub fn key_tiles_for(problem: &Problem, form: Form) -> Tiles {
    let (d, seq_k) = (problem.shape.head_dim, problem.shape.seq_k);
    if let Some(t) =
        short_causal_tiles(d, form, problem.is_causal()).filter(|_| seq_k <= SHORT_CAUSAL_MAX_KEYS)
    {
        return t;
    }
    let short = tiles(d, form);
    match long_tiles(d, form, problem.is_causal()) {
        Some(long)
            if seq_k.div_ceil(long.block_n) * long.block_n * LONG_TILE_COST_PER_MILLE
                < seq_k.div_ceil(short.block_n) * short.block_n * 1000 =>
        {
            long
        }
        _ => short,
    }
}

/// Chooses the Hopper variant of `form` for `problem` on a device with `limits` and `sms`
/// multiprocessors, with [`key_tiles_for`] or the tiles `forced`, or says why the family cannot
/// run it.
pub fn choose(
    problem: &Problem,
    limits: &DeviceLimits,
    sms: u32,
    form: Form,
    forced: Option<Tiles>,
    split: bool,
) -> Result<(Variant, Launch)> {
    problem.validate()?;
    let s = problem.shape;
    if !matches!(problem.dtype, DType::F16 | DType::Bf16) {
        return Err(Error::UnsupportedDType {
            backend: "cuda (Hopper family)".into(),
            dtype: problem.dtype,
            supported: "f16 and bf16 (tensor cores); use cpu-flash or wgpu for f32".into(),
        });
    }
    if !HEAD_DIMS.contains(&s.head_dim) {
        return Err(Error::UnsupportedHeadDim {
            backend: "cuda (Hopper family)".into(),
            head_dim: s.head_dim,
            supported: format!("{HEAD_DIMS:?}"),
        });
    }
    // TMA: global strides must be multiples of 16 bytes (and the buffers, allocated here, are
    // 256-byte aligned); the same rule the Ampere family's 16-byte loads need.
    crate::plan::check_alignment(problem)?;
    let default = key_tiles_for(problem, form);
    let Tiles { block_n, stages, mut consumers } = forced.unwrap_or(default);
    if consumers == 0 || form == Form::CpAsync {
        consumers = default.consumers; // the cp.async form has its one warpgroup
    }
    // That warpgroup double-buffers: two stages.
    let form_ok = if form == Form::CpAsync { stages == 2 } else { (2..=4).contains(&consumers) };
    if block_n % 16 != 0 || !(16..=256).contains(&block_n) || !(1..=4).contains(&stages) || !form_ok {
        return Err(Error::Unsupported {
            backend: "cuda (Hopper family)".into(),
            what: format!(
                "{block_n} keys per tile, {stages} stages, {consumers} consumer warpgroups: keys per tile must \
                 be a multiple of 16 from 16 to 256 (wgmma's N), stages 1 to 4 (2 in the cpasync form), \
                 consumers 2 to 4"
            ),
        });
    }
    let variant = Variant {
        dtype: problem.dtype,
        head_dim: s.head_dim,
        block_n,
        stages,
        consumers,
        causal: problem.is_causal(),
        form,
        pingpong: form >= Form::PingPong,
        trim: false,
        q_slots: 1,
        bottom: false,
        trace: false,
    };
    // Two slots where they are the default and fit (forced tiles may leave no room).
    let variant = variant.with_q_slots(q_slots_for(s.head_dim, problem.is_causal(), form)).unwrap_or(variant);
    // Causal blocks from the bottom where the variant can lay them so (Variant::bottom).
    let variant = Variant { bottom: Variant { bottom: true, ..variant }.bottoms(), ..variant };
    let launch = variant.launch(problem, sms, split);
    launch.validate(&variant.name(), limits)?;
    Ok((variant, launch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::Shape;

    fn problem(d: usize) -> Problem {
        Problem::new(Shape::new(4, 16, 4096, d), DType::Bf16)
    }

    #[test]
    fn every_head_dim_fits_an_h100_in_every_form() {
        let h100 = DeviceLimits::h100();
        for d in HEAD_DIMS {
            for form in Form::ALL {
                let (v, launch) = choose(&problem(d), &h100, 132, form, None, true).unwrap();
                assert!(launch.shared_bytes() <= h100.shared_per_block_optin, "{}", v.name());
                let tiles = 4096u32.div_ceil(v.block_m() as u32) * 64;
                assert_eq!(
                    launch.grid[0],
                    if form == Form::Persistent { 132 } else { tiles },
                    "{}",
                    v.name()
                );
            }
        }
    }

    #[test]
    fn the_tail_past_the_last_whole_wave_is_split() {
        let persistent =
            |p: &Problem| choose(p, &DeviceLimits::h100(), 132, Form::Persistent, None, true).unwrap();
        // D=128, S=4096, 4 x 16: 2048 tiles of 32 key tiles, 15 waves of 132 and 68 tiles.
        let p = problem(128);
        let (v, launch) = persistent(&p);
        let s = v.split(&p, 132);
        assert_eq!(s, Split { whole: 1980, units: 132, tail_tiles: 68, key_tiles: 32 });
        assert_eq!((s.tail_iters(), launch.grid[0]), (2176, 132));
        assert_eq!((s.counters(2), s.partial_floats(128, 2)), (2 + 136, 2 * 132 * 2 * 128 * 68));
        // Causal tiles go longest first instead; whole waves need nothing; nor do other forms.
        // (At S=4096 causal D=128 takes the short causal tiles: 192 rows, 22 blocks a head.)
        let causal = p.causal();
        assert_eq!(persistent(&causal).0.split(&causal, 132), Split::none(22 * 64));
        assert_eq!(v.split(&p, 128), Split::none(2048));
        let (pingpong, _) = choose(&p, &DeviceLimits::h100(), 132, Form::PingPong, None, true).unwrap();
        assert_eq!(pingpong.split(&p, 132), Split::none(2048));
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
        let (_, launch) = choose(&few, &DeviceLimits::h100(), 132, Form::Persistent, None, false).unwrap();
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
                let (v, launch) =
                    choose(&p, &DeviceLimits::h100(), ctas, Form::Persistent, None, true).unwrap();
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
    fn long_key_tiles_where_they_waste_little() {
        let keys = |s: usize, d: usize, causal: bool| {
            let p = Problem::new(Shape::new(16384 / s, 2048 / d, s, d), DType::Bf16);
            let p = if causal { p.causal() } else { p };
            choose(&p, &DeviceLimits::h100(), 132, Form::Persistent, None, true).unwrap().0.block_n
        };
        // 8192 keys: 57 tiles of 144 (8208 keys) at 1.5% less a key than 64 of 128; 4096: 29
        // tiles (4176 keys, 2% masked), no.
        assert_eq!([2048, 4096, 8192, 16384].map(|s| keys(s, 128, false)), [128, 128, 144, 144]);
        assert_eq!(keys(8192, 128, true), 128);
        assert_eq!((keys(8192, 64, false), keys(8192, 256, false)), (112, 64));
        // Only in the persistent form, and in the list CI compiles.
        let p = Problem::new(Shape::new(2, 16, 8192, 128), DType::Bf16);
        let (v, _) = choose(&p, &DeviceLimits::h100(), 132, Form::PingPong, None, true).unwrap();
        assert_eq!(v.block_n, 128);
        let (v, _) = choose(&p, &DeviceLimits::h100(), 132, Form::Persistent, None, true).unwrap();
        assert!(Variant::all().contains(&v), "{}", v.name());
    }

    #[test]
    fn shared_memory_is_what_the_kernel_uses() {
        // D=128, causal, S=8192: Q 128x128 + 2 stages of K and V, 128 keys each, 2 bytes = 160
        // KB, O staged (32 KB), the barriers (8 B each: Q full/empty, 4 per stage, O full/empty
        // for four warpgroups), the piece slot (32 B), merge flags (16 B) and O's destinations
        // (64 B), and 1 KB of alignment slack.
        let long = Problem::new(Shape::new(4, 16, 8192, 128), DType::Bf16).causal();
        let (v, _) = choose(&long, &DeviceLimits::h100(), 132, Form::Persistent, None, true).unwrap();
        assert_eq!(v.shared_bytes(), 163840 + 32768 + 256 + 1024);
        assert_eq!(v.threads(), 384);
        assert!(v.o_staged());
        // S=4096, the short causal tiles: Q 192x128 (48 KB) + 3 stages of K and V, 64 keys each
        // (96 KB), O staged (48 KB), the barriers with four more for the third stage (288 B).
        let (v, _) =
            choose(&problem(128).causal(), &DeviceLimits::h100(), 132, Form::Persistent, None, true).unwrap();
        assert_eq!((v.block_n, v.stages, v.consumers), (64, 3, 3));
        assert_eq!(v.shared_bytes(), 49152 + 98304 + 49152 + 288 + 1024);
        assert_eq!(v.threads(), 512);
        assert!(v.o_staged());
        // D=256: Q 64 KB + 2 x 2 x 64 keys x 512 B = 192 KB: no room to stage O.
        let (v, _) = choose(&problem(256), &DeviceLimits::h100(), 132, Form::Persistent, None, true).unwrap();
        assert_eq!(v.shared_bytes(), 196608 + 256 + 1024);
        assert!(!v.o_staged());
        // Two Q slots (D=128 without a mask, by default): a second Q tile where O's staging was, O
        // going out through them; the barriers 16 B more (the second slot's full/empty) and its
        // piece slot 32 B.
        let (q2, _) =
            choose(&problem(128), &DeviceLimits::h100(), 132, Form::Persistent, None, true).unwrap();
        assert_eq!(q2.shared_bytes(), 163840 + 32768 + 256 + 48 + 1024);
        assert!(q2.o_staged() && q2.name().contains("_q2") && !v.name().contains("_q2"));
        assert!(q2.defines().contains(&("ATTN_Q_SLOTS".into(), "2".into())));
        assert_eq!(q2.with_q_slots(1).unwrap(), Variant { q_slots: 1, ..q2 });
        // Only there: not causal, not at D=64, not in the other forms.
        for (p, form) in [
            (problem(128).causal(), Form::Persistent),
            (problem(64), Form::Persistent),
            (problem(128), Form::PingPong),
        ] {
            let (v, _) = choose(&p, &DeviceLimits::h100(), 132, form, None, true).unwrap();
            assert_eq!(v.q_slots, 1, "{}", v.name());
        }
        // Not at D=256 (Q 64 KB more would make 256 KB), nor without TMA, nor three slots.
        let (v, _) = choose(&problem(256), &DeviceLimits::h100(), 132, Form::Persistent, None, true).unwrap();
        let err = v.with_q_slots(2).unwrap_err().to_string();
        assert!(err.contains("2 Q slots") && err.contains("263472 needed"), "{err}");
        let (v, _) = choose(&problem(64), &DeviceLimits::h100(), 132, Form::CpAsync, None, true).unwrap();
        assert!(v.with_q_slots(2).is_err() && v.with_q_slots(3).is_err());
        // The cp.async form is one warpgroup of 64 rows, no producer.
        let (v, _) = choose(&problem(64), &DeviceLimits::h100(), 132, Form::CpAsync, None, true).unwrap();
        assert_eq!((v.threads(), v.block_m()), (128, 64));
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
        // The TMA forms: D=128 and 256 with two consumers (and D=128's 144-key tiles for the
        // persistent form without a mask), D=64 with three; each causal one from the overlap
        // form on also trimmed (12 and 6); the persistent ones with two Q slots, except at
        // D=256, where a second Q tile does not fit (8 and 6); the causal persistent ones with
        // their blocks from the bottom, except at D=256, where O is not staged (2 and 2); and
        // D=128's short causal tiles, three consumers, from the bottom (2 more of 512).
        assert_eq!(Variant::all().iter().filter(|v| v.threads() == 384).count(), 56);
        assert_eq!(Variant::all().iter().filter(|v| v.threads() == 512).count(), 32);
    }

    #[test]
    fn an_l4_sized_device_gets_a_clear_error() {
        // The Hopper family runs on sm_90 only, but its plan is validated like any other.
        let err = choose(&problem(128), &DeviceLimits::l4(), 58, Form::Persistent, None, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("shared memory per block") && err.contains("101376"), "{err}");
    }

    #[test]
    fn unsupported_inputs_are_typed_errors() {
        let h100 = DeviceLimits::h100();
        assert!(matches!(
            choose(&problem(96), &h100, 132, Form::Persistent, None, true),
            Err(Error::UnsupportedHeadDim { .. })
        ));
        let f32 = Problem::new(Shape::new(1, 2, 64, 64), DType::F32);
        assert!(matches!(
            choose(&f32, &h100, 132, Form::Persistent, None, true),
            Err(Error::UnsupportedDType { .. })
        ));
    }

    #[test]
    fn forced_tiles_are_checked() {
        let h100 = DeviceLimits::h100();
        let (v, _) = choose(
            &problem(128),
            &h100,
            132,
            Form::Persistent,
            Some(Tiles { block_n: 176, stages: 2, consumers: 2 }),
            true,
        )
        .unwrap();
        assert_eq!((v.block_n, v.stages), (176, 2));
        let err = choose(
            &problem(128),
            &h100,
            132,
            Form::Persistent,
            Some(Tiles { block_n: 100, stages: 2, consumers: 2 }),
            true,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("multiple of 16"), "{err}");
        // 128 keys and 3 stages at D=128 fit (224 KB) without staging O, 4 do not (288 KB).
        let (v, _) = choose(
            &problem(128),
            &h100,
            132,
            Form::Persistent,
            Some(Tiles { block_n: 128, stages: 3, consumers: 2 }),
            true,
        )
        .unwrap();
        assert!(!v.o_staged() && v.shared_bytes() as usize <= SHARED_LIMIT);
        let err = choose(
            &problem(128),
            &h100,
            132,
            Form::Persistent,
            Some(Tiles { block_n: 128, stages: 4, consumers: 2 }),
            true,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("shared memory per block"), "{err}");
    }

    #[test]
    fn forced_tiles_fill_in_the_consumers_and_the_cpasync_form_takes_two_stages() {
        let h100 = DeviceLimits::h100();
        let unsaid = Some(Tiles { block_n: 64, stages: 3, consumers: 0 });
        let (v, _) = choose(&problem(64), &h100, 132, Form::Persistent, unsaid, true).unwrap();
        assert_eq!((v.block_n, v.stages, v.consumers), (64, 3, tiles(64, Form::Persistent).consumers));
        let three_stages = Some(Tiles { block_n: 64, stages: 3, consumers: 1 });
        let err =
            choose(&problem(64), &h100, 132, Form::CpAsync, three_stages, true).unwrap_err().to_string();
        assert!(err.contains("2 in the cpasync form"), "{err}");
    }

    #[test]
    fn more_consumers_split_the_registers_that_are_left() {
        // What 128 x 40 registers for the producer leave of 64512, per consumer thread, and the
        // cap at entry (65536 over the threads). Four consumers only by forced tiles
        // (ATTN_CUDA_SM90_TILES=64:2:4); at D=64 even 64-key tiles spill there now (80 bytes
        // at 25ce4b4, by the cubin example), so none is planned.
        let persistent =
            |tiles| choose(&problem(64), &DeviceLimits::h100(), 132, Form::Persistent, Some(tiles), true);
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
    fn names_are_distinct_and_forms_parse() {
        let all = Variant::all();
        let mut names: Vec<String> = all.iter().map(|v| v.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for f in Form::ALL {
            assert_eq!(Form::parse(f.as_str()), Some(f));
        }
        assert_eq!(Form::parse("fast"), None);
    }

    #[test]
    fn turns_are_on_from_the_ping_pong_form_and_off_only_by_name() {
        let h100 = DeviceLimits::h100();
        for form in Form::ALL {
            let (v, _) = choose(&problem(64), &h100, 132, form, None, true).unwrap();
            assert_eq!(v.pingpong, form >= Form::PingPong, "{}", v.name());
        }
        let (on, _) = choose(&problem(64), &h100, 132, Form::Persistent, None, true).unwrap();
        let off = Variant { pingpong: false, ..on };
        // Compiled kernels are cached by name: the two must differ, as their defines do.
        assert_ne!(on.name(), off.name());
        let define = |v: &Variant| v.defines().into_iter().find(|(k, _)| k == "ATTN_PINGPONG").unwrap().1;
        assert_eq!((define(&on).as_str(), define(&off).as_str()), ("1", "0"));
    }

    #[test]
    fn causal_blocks_are_laid_from_the_bottom_where_o_is_staged() {
        let h100 = DeviceLimits::h100();
        let pick = |d, causal: bool, form| {
            let p = if causal { problem(d).causal() } else { problem(d) };
            Variant { bottom: true, ..choose(&p, &h100, 132, form, None, true).unwrap().0 }
        };
        for d in [64, 128] {
            let v = pick(d, true, Form::Persistent);
            let (default, _) =
                choose(&problem(d).causal(), &h100, 132, Form::Persistent, None, true).unwrap();
            assert_eq!(default, v, "the default");
            assert!(v.bottoms() && v.name().contains("_bottom"), "{}", v.name());
            assert!(v.defines().contains(&("ATTN_BOTTOM".into(), "1".into())));
            assert!(Variant::all().contains(&v), "{}", v.name());
            let top = Variant { bottom: false, ..v };
            assert!(!top.bottoms() && !top.name().contains("_bottom"));
        }
        // Not without a mask, not in the other forms, not at D=256 (O stored from registers).
        assert!(!pick(64, false, Form::Persistent).bottoms());
        assert!(!pick(64, true, Form::PingPong).bottoms());
        assert!(!pick(256, true, Form::Persistent).bottoms());
        // Asked where it cannot be: an error for a causal variant, never a silent top order.
        for (d, form) in [(64, Form::PingPong), (256, Form::Persistent)] {
            let v = Variant { bottom: false, ..pick(d, true, form) };
            let err = v.with_bottom(true).unwrap_err().to_string();
            assert!(err.contains("from the bottom") && err.contains(&v.name()), "{err}");
            assert!(v.with_bottom(false).is_ok());
        }
        assert!(pick(64, true, Form::Persistent).with_bottom(true).unwrap().bottoms());
        assert!(pick(64, false, Form::Persistent).with_bottom(true).is_ok());
    }

    #[test]
    fn only_causal_overlapped_forms_trim() {
        let h100 = DeviceLimits::h100();
        for (form, causal) in
            [(Form::Tma, true), (Form::Overlap, true), (Form::Persistent, true), (Form::Persistent, false)]
        {
            let p = if causal { problem(64).causal() } else { problem(64) };
            let (v, _) = choose(&p, &h100, 132, form, None, true).unwrap();
            let trimmed = Variant { trim: true, ..v };
            assert!(!v.trims(), "{}", v.name());
            assert_eq!(trimmed.trims(), causal && form >= Form::Overlap, "{}", trimmed.name());
            assert_eq!(trimmed.name() != v.name(), trimmed.trims());
        }
    }
}
