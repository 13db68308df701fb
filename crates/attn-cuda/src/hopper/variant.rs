//! One specialisation of `kernels/flash_fwd_sm90.cu`: its compile-time choices, the resources
//! they take (shared memory, registers) and the NVRTC request that compiles it.

use super::wgmma;
use crate::compile::{Arch, CompileRequest};
use attn_core::{DType, Error, Problem, Result};

/// The kernel source, compiled at run time for sm_90a.
pub const SOURCE: &str = include_str!("../../kernels/flash_fwd_sm90.cu");
/// The headers it includes, by name: the Hopper primitives and the kernel's parts (the generated
/// `sm90_wgmma.cuh` comes from `wgmma`).
pub const HEADERS: &[(&str, &str)] = &[
    ("sm90.cuh", include_str!("../../kernels/sm90.cuh")),
    ("sm90_trace.cuh", include_str!("../../kernels/sm90_trace.cuh")),
    ("sm90_scheduler.cuh", include_str!("../../kernels/sm90_scheduler.cuh")),
    ("sm90_mainloop.cuh", include_str!("../../kernels/sm90_mainloop.cuh")),
    ("sm90_epilogue.cuh", include_str!("../../kernels/sm90_epilogue.cuh")),
];

/// Head dimensions the Hopper kernel is specialised for: whole 64-column (128-byte) blocks.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// The largest head dim the family runs: every multiple of 8 up to it runs, those between
/// [`HEAD_DIMS`] on the next one's kernel padded ([`Variant::pad`], [`kernel_head_dim`]).
pub const MAX_HEAD_DIM: usize = 256;

/// The head dim of the kernel that runs head dim `d`: `d` itself where it is one of
/// [`HEAD_DIMS`], else (a multiple of 8 from 8 to [`MAX_HEAD_DIM`]) the next one above it, run
/// padded ([`Variant::pad`]); `None` for any other head dim. A multiple of 8 keeps every row of
/// a packed 16-bit tensor on the 16 bytes TMA needs.
pub fn kernel_head_dim(d: usize) -> Option<usize> {
    crate::tensors::kernel_head_dim_of(d, &HEAD_DIMS, &HEAD_DIMS)
}

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
/// 240, the whole 65536, hung every launch on the H100 (976d895); 64512 (FlashAttention-3's
/// 24 + 2 x 240)
/// leaves a 1024-register margin. The pool is also at most what the launch gave the CTA (its
/// threads times the cap at entry, [`Variant::register_pool`]): with four consumers (640 threads,
/// 96 each at entry, 61440 in all) the 112 that 64512 would leave each consumer hung every launch
/// (d4ae16f).
pub const REGISTER_POOL: u32 = 64512;

/// One specialisation of `kernels/flash_fwd_sm90.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// f16 or bf16.
    pub dtype: DType,
    /// Head dimension of the kernel (64, 128 or 256); the problem's where not [`Variant::pad`].
    pub head_dim: usize,
    /// A smaller head dim run on this kernel (`ATTN_PAD`): the problem's (a multiple of 8 below
    /// `head_dim`) is a run-time parameter. Q, K and V come in by TMA, whose tensor maps end at
    /// the problem's head dim: the columns past it load as zeros (which add nothing to S, and
    /// give O columns of zeros), and O's TMA store leaves them out; where the kernel stores O
    /// from registers it stops at the problem's head dim. The scale is the problem's.
    pub pad: bool,
    /// Keys per tile: the N of S's wgmma.
    pub block_n: usize,
    /// K/V stages in the shared-memory ring.
    pub stages: u32,
    /// Consumer warpgroups of 64 query rows each (2 to 4), beside the producer warpgroup.
    pub consumers: u32,
    /// Causal (bottom-right) masking compiled in.
    pub causal: bool,
    /// A sliding window compiled in (`ATTN_WINDOW`; never with `causal`): a tile's piece is the
    /// key tiles its rows see, first to last; no split tail. The bounds are run-time parameters
    /// (`crate::scores`).
    pub window: bool,
    /// Score soft-capping compiled in (`ATTN_SOFTCAP`); the cap is a run-time parameter.
    pub softcap: bool,
    /// ALiBi's bias compiled in (`ATTN_ALIBI`); the slopes are a run-time device array (a slope
    /// per head, or per batch and head).
    pub alibi: bool,
    /// Q tiles in shared memory (`ATTN_Q_SLOTS`): 1, loaded for the next piece once every
    /// consumer has issued its last S of this one; or 2 (where shared memory has room), so that the next piece's Q loads while this one's key tiles run, with O staged
    /// in its own tile's Q slot. See [`Variant::with_q_slots`].
    pub q_slots: u32,
    /// Causal, O staged: a head's query blocks end at its last row, so that
    /// the block `seq_q % block_m` leaves short is the first (whose rows see the fewest keys), not
    /// the last (whose rows see the most); `ATTN_BOTTOM`, see [`Variant::bottoms`]. The default
    /// where it applies (`ATTN_CUDA_SM90_BLOCKS=top` for the old order): fewer products where
    /// the sequence leaves a block short (at D=64, 4% at S=4096, 12% at 1024, none at 2048 or
    /// 8192), and as much faster on the H100 (measured at 781ff61, see docs/experiments.md).
    pub bottom: bool,
    /// Sequences of their own lengths compiled in (`ATTN_SEQS`): packed queries or keys
    /// (`cu_seqlens_q`, `cu_seqlens_k`) and per-sequence key counts (`seqused_k`), each a device
    /// array the kernel reads (clamped) per tile. Tiles run over the longest sequence's query
    /// blocks, those past a sequence's own are skipped; a sequence's last key tile has V's rows
    /// past its keys cleared in shared memory before its P V (`clear_v_past_keys`: the rows TMA
    /// loads there are the next sequence's, or a cache's unwritten slots); a warpgroup whose rows
    /// run past its sequence stores O from registers; no split tail.
    pub seqs: bool,
    /// A paged cache compiled in (`ATTN_PAGED`, with [`Variant::seqs`]; the block table a
    /// run-time device array): a key tile loads a TMA box of rows at a time, each from its page
    /// (`launch::Paging`). A variant of its own, so that the others' code is what it was (the
    /// page loop in every sequence variant's producer moved ptxas's register choices in some
    /// consumers into spills).
    pub paged: bool,
    /// A diagnostic build (`ATTN_TRACE`, asked for by `ATTN_CUDA_SM90_TRACE`): the kernel stamps
    /// each piece's steps in SM cycles into a buffer the host writes out (see
    /// `TRACE_LEN_PER_CTA` in `hopper/launch.rs`). Never planned unless asked for.
    pub trace: bool,
    /// How far L2 widens the tensor maps' misses ([`L2Promotion`]): not compiled in (the maps are
    /// encoded at each launch), chosen per problem by [`L2Promotion::for_problem`].
    pub l2: L2Promotion,
}

/// The L2 promotion of the Hopper kernel's tensor maps: how many bytes L2 fetches from memory
/// for a TMA load's miss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum L2Promotion {
    /// The load's own sectors.
    None,
    /// 64-byte blocks.
    B64,
    /// 128-byte blocks: where rows start off 32-byte boundaries (a head dim of 8 mod 16, packed
    /// or strided so), 1.0-6.1% faster than 256 on the H200's padded head dims of 8 mod 16 from
    /// 72 to 248, causal and not (`bench/results/h200-l2-promotion.json`).
    B128,
    /// 256-byte blocks: where every row starts on a 32-byte boundary, 0-1.2% faster than 128 at
    /// D=128 and 256 in the same call.
    B256,
}

impl L2Promotion {
    /// Every promotion, as `ATTN_CUDA_SM90_L2` names them ([`L2Promotion::name`]).
    pub const ALL: [L2Promotion; 4] =
        [L2Promotion::None, L2Promotion::B64, L2Promotion::B128, L2Promotion::B256];

    /// 256-byte blocks, or 128 where a row of Q, K, V or O can start off a 32-byte boundary (a
    /// stride of any of them, in bytes, not a multiple of 32).
    pub fn for_problem(problem: &Problem) -> L2Promotion {
        let t = problem.strides;
        let bytes = problem.dtype.size();
        let aligned = [t.q, t.k, t.v, t.o]
            .iter()
            .all(|st| [st.batch, st.head, st.seq].iter().all(|&x| (x * bytes).is_multiple_of(32)));
        match aligned {
            true => L2Promotion::B256,
            false => L2Promotion::B128,
        }
    }

    /// Its name in the plan and in `ATTN_CUDA_SM90_L2`.
    pub fn name(self) -> &'static str {
        match self {
            L2Promotion::None => "none",
            L2Promotion::B64 => "64",
            L2Promotion::B128 => "128",
            L2Promotion::B256 => "256",
        }
    }
}

impl Variant {
    /// Registers per consumer thread after `setmaxnreg`: what the producer's
    /// `PRODUCER_REGISTERS` leave of the [`Variant::register_pool`], in units of 8, at most
    /// `CONSUMER_REGISTERS` (232 with two consumers, 152 with three, 104 with four).
    pub fn consumer_registers(&self) -> u32 {
        let left = self.register_pool() - 128 * PRODUCER_REGISTERS;
        CONSUMER_REGISTERS.min(left / (128 * self.consumers) / 8 * 8)
    }

    /// Whether the kernel lays its query blocks from the bottom ([`Variant::bottom`] where it
    /// applies: causal, O staged. The first block's rows before 0 are TMA's
    /// zero fill on load; a warpgroup whose rows start there stores O from registers, skipping
    /// them, as a TMA store at a negative row faults. D=256, whose O is not staged, keeps the top
    /// order: the combination was never run).
    pub fn bottoms(&self) -> bool {
        self.bottom && self.causal && self.o_staged()
    }

    /// This variant with its causal query blocks laid from the bottom or not, or why they cannot
    /// be: where asked of a causal variant whose blocks cannot be (O not staged, as at D=256), an
    /// error rather than the usual order under another name.
    /// Without a mask there is no order to change, and the setting is left as asked.
    pub fn with_bottom(self, bottom: bool) -> Result<Variant> {
        let v = Variant { bottom, ..self };
        match bottom && self.causal && !v.bottoms() {
            false => Ok(v),
            true => Err(Error::Unsupported {
                backend: "cuda (Hopper family)".into(),
                what: format!(
                    "causal query blocks from the bottom in {}: only with O staged through shared memory; \
                     ATTN_CUDA_SM90_BLOCKS=top",
                    self.name()
                ),
            }),
        }
    }

    /// Query rows per CTA tile: 64 per consumer warpgroup.
    pub fn block_m(&self) -> usize {
        64 * self.consumers as usize
    }

    /// Threads per CTA: the consumer warpgroups and the producer.
    pub fn threads(&self) -> u32 {
        128 * (self.consumers + 1)
    }

    /// Whether the kernel moves registers from the producer to the consumers (`setmaxnreg`):
    /// with 384 threads the cap at entry is 168 per thread, under what the consumers need.
    pub fn reallocates_registers(&self) -> bool {
        self.threads() > 256
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
        // warpgroups), a piece slot (8 ints: the piece and its tile; 12 with its sequence's
        // rows) per Q slot, the merge flags (4 ints) and where each warpgroup's O goes (4 ints
        // each).
        let slot_ints = if self.seqs { 12 } else { 8 };
        let barriers = 8 * (2 * self.q_slots as usize + 4 * self.stages as usize + 8)
            + 4 * slot_ints * self.q_slots as usize
            + 16
            + 64;
        q + kv + barriers + 1024
    }

    fn o_bytes(&self) -> usize {
        self.block_m() * self.head_dim * 2
    }

    /// Whether O goes out through shared memory and a TMA store (coalesced, and the rows past
    /// the sequence are TMA's to skip): where shared memory has room for it next to the rest (not at D = 256, whose Q and K/V take 192 KB); with two Q slots always,
    /// in its tile's Q slot.
    pub fn o_staged(&self) -> bool {
        self.q_slots == 2 || self.unstaged_bytes() + self.o_bytes() <= SHARED_LIMIT
    }

    /// This variant with `slots` Q slots, or why it cannot have them: two need room for a second
    /// Q tile (O then goes out through the Q slots, so the room is
    /// the second tile's, not O's).
    pub fn with_q_slots(self, slots: u32) -> Result<Variant> {
        let v = Variant { q_slots: slots, ..self };
        let fits = slots == 1 || (slots == 2 && v.unstaged_bytes() <= SHARED_LIMIT);
        match fits {
            true => Ok(v),
            false => Err(Error::Unsupported {
                backend: "cuda (Hopper family)".into(),
                what: format!(
                    "{slots} Q slots in {}: 1, or 2 where two Q tiles and the K/V stages fit \
                     {SHARED_LIMIT} bytes of shared memory ({} needed)",
                    self.name(),
                    v.unstaged_bytes()
                ),
            }),
        }
    }

    /// The name of the specialisation: dtype, head dim, tiles, Q slots, block order, mask,
    /// soft-cap, ALiBi, padding, sequences, a paged cache.
    pub fn name(&self) -> String {
        format!(
            "flash_sm90_{}_d{}_bm{}_bn{}_s{}{}{}{}{}{}{}{}{}{}{}",
            self.dtype,
            self.head_dim,
            self.block_m(),
            self.block_n,
            self.stages,
            if self.q_slots == 2 { "_q2" } else { "" },
            if self.bottoms() { "_bottom" } else { "" },
            if self.causal { "_causal" } else { "" },
            if self.window { "_window" } else { "" },
            if self.softcap { "_softcap" } else { "" },
            if self.alibi { "_alibi" } else { "" },
            if self.pad { "_pad" } else { "" },
            if self.seqs { "_seqs" } else { "" },
            if self.paged { "_paged" } else { "" },
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
            ("ATTN_WINDOW".into(), flag(self.window)),
            ("ATTN_SOFTCAP".into(), flag(self.softcap)),
            ("ATTN_ALIBI".into(), flag(self.alibi)),
            ("ATTN_O_STAGED".into(), flag(self.o_staged())),
            ("ATTN_PRODUCER_REGS".into(), producer.to_string()),
            ("ATTN_CONSUMER_REGS".into(), consumer.to_string()),
            ("ATTN_Q_SLOTS".into(), self.q_slots.to_string()),
            ("ATTN_BOTTOM".into(), flag(self.bottoms())),
            ("ATTN_TRACE".into(), flag(self.trace)),
            ("ATTN_PAD".into(), flag(self.pad)),
            ("ATTN_SEQS".into(), flag(self.seqs)),
            ("ATTN_PAGED".into(), flag(self.paged)),
        ]
    }

    /// The NVRTC request that compiles it (for sm_90a only: wgmma, TMA and setmaxnreg are
    /// Hopper's own).
    pub fn request(&self) -> CompileRequest {
        CompileRequest::new(self.name(), SOURCE, Arch::Sm90a)
            .header("sm90_wgmma.cuh", wgmma::header(self.dtype, self.block_n, self.head_dim))
            .headers(HEADERS)
            .defines(self.defines())
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
    /// [`Variant::register_budget`]), at most `REGISTER_POOL`. `setmaxnreg.inc` waits for
    /// registers that are free in the CTA's own allocation, so asking for more hangs.
    pub fn register_pool(&self) -> u32 {
        REGISTER_POOL.min(self.threads() * self.register_budget())
    }

    /// Tiles of `problem` this variant computes: query blocks times batch times heads.
    pub fn tiles(&self, problem: &Problem) -> u64 {
        let s = problem.shape;
        (s.seq_q.div_ceil(self.block_m()) * s.batch * s.heads_q) as u64
    }
}
