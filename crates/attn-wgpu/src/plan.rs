//! Tile choice from the adapter's limits: pure functions, so that every rule can be tested with
//! synthetic limits on a machine without an adapter.
//!
//! The kernel's shape (see `kernels/flash.wgsl`): a workgroup of `TX·TY` invocations (`TX` = 8
//! or 16 per query row) computes a `BM × BN = 4·TY × 4·TX·KG` score tile, each invocation a
//! 4 × 4·KG micro-tile of S and the matching 4 rows × `D/TX` columns of O. Workgroup memory holds
//! Qᵀ (`BM × D`), one K or V chunk per stage buffer (`BN × DC`, the head dim staged `DC` columns at
//! a time when all of it does not fit), Pᵀ (`BN × BM`), and, on the path without subgroup
//! operations, the row-reduction scratch (`TX × BM`). All f32. The cooperative-matrix kernel
//! (`coop`) has its own layout ([`Variant::shared_bytes`]).

use attn_core::{
    DType, DeviceKind, DeviceLimits, Error, Feature, Launch, Mask, Problem, Result, Strides, TensorStrides,
    Tiles,
};

/// Invocations sharing one query row's scores (the `TX` of the kernel), in order of preference;
/// the subgroup path needs subgroups at least this wide. 16 halves each invocation's share of O
/// (and its registers) for twice the invocations per row (measured no faster on the H100). 4
/// doubles it and halves the probability shuffles per FMA of P·V, but measured slower on the H100
/// (229-255 registers, some spilled; measured, see docs/experiments.md); it comes last, so that
/// only `ATTN_WGPU_ROW_THREADS=4` picks it (or an adapter too small for the others).
pub const ROW_THREADS: [u32; 3] = [8, 16, 4];
/// Rows of each invocation's score micro-tile, and keys per key group.
pub const MICRO: u32 = 4;
/// Key groups per invocation (`KG`): 8 or 4 keys of each score row; then 16 (4x16 micro-tiles,
/// fewer workgroup-memory loads per FMA: 20 floats per 64 where 4x8 loads 12 per 32; measured
/// 6-11% slower on the H100 with Qᵀ in workgroup memory), last, so that only
/// `ATTN_WGPU_KEY_GROUPS=4` picks it (it needs more memory than the others, so the planner never
/// reaches it on its own), except f32 D=64's measured shape (with Q in registers, faster).
pub const KEY_GROUPS: [u32; 3] = [2, 1, 4];
/// The shape measured fastest on the H100 (48 KiB of workgroup memory, subgroups of 32) for the
/// grid's head dims, tried before the generic order of [`candidates`] where it fits; f32's, which
/// f16 on the FMA kernel (no cooperative matrices, or `ATTN_WGPU_COOP=0`) takes too (12-24%
/// faster at D=64 and 42-51% at D=128 than the shapes measured for f16 before). Each choice was
/// timed against its alternatives (measured, see docs/experiments.md; the commits are named
/// there):
/// - both head dims: 8 invocations per row, probabilities shuffled, V staged by keys, Q in
///   registers (16 KiB of workgroup memory), two row groups' lanes interleaved where subgroups
///   span 16 lanes (4-7.5% faster than one, four no faster than two), S = Q·Kᵀ split over the
///   head dim (7-8% faster non-causal than Q shuffled);
/// - f32 D=64: 4x16 micro-tiles (128-key tiles), K in 32-column stages (with V by keys and Q in
///   registers 3-8% faster than the 4x8 shape; none of the three faster alone), 64 rows without a
///   mask, 128 causal (since unguarded K/V loads, 25.7-35.1 against 25.3-34.0 TFLOP/s at
///   S=512-8192), no skip of unseen stages (4-5% slower with it);
/// - f32 D=128: 4x8 micro-tiles, K in 64-column stages, 128 rows, the stages no row sees
///   skipped ([`Variant::skip_unseen`]): the driver then keeps it in 249 registers without
///   spills, 3.1-3.4% faster non-causal (short causal problems: [`SHORT_CAUSAL_MAX_KEYS`]).
fn measured_best(head_dim: u32, causal: bool) -> Option<Measured> {
    // Rows, 4-key groups per invocation and row, head-dim columns per K stage, the skip.
    let (rows, key_groups, chunk, skip_unseen) = match head_dim {
        64 => (if causal { 128 } else { 64 }, 4, 32, false),
        128 => (128, 2, 64, true),
        _ => return None,
    };
    // Both: V staged by keys, Q in registers, two row groups' lanes interleaved, S split over
    // the head dim (all with probabilities shuffled: they need subgroups spanning a row).
    Some(Measured {
        rows,
        key_groups,
        chunk,
        v_by_keys: true,
        q_regs: true,
        interleave: 2,
        split_d: true,
        skip_unseen,
    })
}

/// The longest causal key length (`seq_k`) for which f32 D=128 takes its measured shape's
/// 64-row form without `skip_unseen` instead: on the H100, after the unguarded loads, the
/// 128-row form was 6.4% slower at S=512 and 1.8% at 1024 (26.6 and 30.9 against 28.4 and 31.4
/// TFLOP/s), and faster from 2048 on (measured, see docs/experiments.md).
pub const SHORT_CAUSAL_MAX_KEYS: usize = 1024;

/// The [`Variant`] fields that [`measured_best`] sets.
struct Measured {
    /// Query rows per workgroup (64 or 128).
    rows: u32,
    key_groups: u32,
    chunk: u32,
    v_by_keys: bool,
    q_regs: bool,
    /// Where subgroups span the lanes it needs (`TX·interleave`); 1 otherwise.
    interleave: u32,
    /// S = Q·Kᵀ split over the head dim ([`Variant::split_d`]).
    split_d: bool,
    /// The stages no row sees skipped ([`Variant::skip_unseen`]).
    skip_unseen: bool,
}

/// Head dims are padded with zeros to a multiple of this (zeros change no dot product).
pub const HEAD_DIM_ALIGN: usize = 32;
/// The largest head dim (after padding) the kernel is built for: O takes `4·D/TX` registers per
/// invocation (`D/2` with 8 invocations per row).
pub const MAX_HEAD_DIM: usize = 256;
/// Row groups (`TY`) tried, largest first: 128, 64 and 32 invocations, `BM` = 64, 32 and 16
/// (and, with V read straight from its buffer, twice the first: see [`candidates`]).
pub const ROW_GROUPS: [u32; 3] = [16, 8, 4];

/// What the planner needs to know about an adapter: read off a real one by the runtime, or
/// written by hand in tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterCaps {
    /// Adapter name, for messages.
    pub name: String,
    /// Hardware GPU or a software rasteriser (lavapipe).
    pub kind: DeviceKind,
    /// `max_compute_workgroup_storage_size`, bytes.
    pub workgroup_storage: u32,
    /// `max_compute_invocations_per_workgroup` (capped by `max_compute_workgroup_size_x`).
    pub invocations: u32,
    /// `max_compute_workgroups_per_dimension`.
    pub workgroups_per_dim: u32,
    /// `max_storage_buffer_binding_size` (capped by `max_buffer_size`), bytes.
    pub storage_binding: u64,
    /// `SHADER_F16`.
    pub f16: bool,
    /// The smallest subgroup size, where the adapter has `SUBGROUP`.
    pub subgroup_min: Option<u32>,
    /// `TIMESTAMP_QUERY`: kernel time from GPU timestamps rather than the host clock.
    pub timestamps: bool,
    /// Cooperative matrices of 16×16×16 with f16 inputs and f32 accumulators, on subgroups of
    /// exactly 32, opened for use (see `runtime`): the tensor-core kernel for f16.
    pub coop_f16: bool,
    /// Loop iterations an invocation may run in all its loops together before the driver ends
    /// them ([`SOFTWARE_LOOP_LIMIT`] on software adapters; none on hardware ones).
    pub loop_limit: Option<u32>,
}

/// Mesa's llvmpipe (lavapipe, the software Vulkan driver) counts the iterations of every loop
/// of a shader invocation together and, past this many, ends every loop without an error
/// (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`): a kernel that walks more key tiles than that
/// allows would stop short and return a finite, wrong answer. Software adapters are taken to
/// share the limit; each kernel also checks it at run time (`loop_limit_probe` in
/// `kernels/bindings.wgsl`), so that a wrong bound would be an error and never a wrong answer.
pub const SOFTWARE_LOOP_LIMIT: u32 = 65535;

/// The share of [`AdapterCaps::loop_limit`] the key tiles of one dispatch may use: the rest is
/// left to the loops outside the tile loop (Q staging, the row sums, the stores, the probe).
const LOOP_BUDGET_SHARE: u32 = 2;

/// Where an adapter's loop limit (see [`SOFTWARE_LOOP_LIMIT`]) is lower than the tile loop
/// needs, the keys are split into parts of `keys` (a multiple of the key tile), one dispatch
/// each into a partial output, merged by log-sum-exp into the running output after each
/// (`kernels/merge.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySplit {
    /// Keys per dispatch.
    pub keys: u32,
    /// Dispatches: `seq_k / keys`, rounded up.
    pub parts: u32,
}

impl AdapterCaps {
    /// WebGPU's default limits (16 KiB of workgroup memory, 256 invocations, 128 MiB bindings),
    /// no optional features: the least any adapter offers.
    pub fn webgpu_defaults() -> Self {
        AdapterCaps {
            name: "WebGPU default limits".into(),
            kind: DeviceKind::Gpu,
            workgroup_storage: 16 * 1024,
            invocations: 256,
            workgroups_per_dim: 65535,
            storage_binding: 128 << 20,
            f16: false,
            subgroup_min: None,
            timestamps: false,
            coop_f16: false,
            loop_limit: None,
        }
    }

    /// The limits in attn-core's vocabulary, for [`Launch::validate`].
    pub fn device_limits(&self) -> DeviceLimits {
        DeviceLimits {
            name: self.name.clone(),
            max_threads_per_block: self.invocations,
            shared_per_block: self.workgroup_storage,
            shared_per_block_optin: self.workgroup_storage,
            registers_per_block: u32::MAX,
            max_registers_per_thread: u32::MAX,
            max_grid: [self.workgroups_per_dim; 3],
        }
    }
}

/// The element type the kernel reads and writes (bf16 is widened to f32 on upload).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelType {
    /// f32 storage (f32 and bf16 problems).
    F32,
    /// f16 storage, `enable f16;` (needs `SHADER_F16`).
    F16,
}

impl KernelType {
    /// Bytes per element in device buffers.
    pub fn size(self) -> u64 {
        match self {
            KernelType::F32 => 4,
            KernelType::F16 => 2,
        }
    }
}

/// One specialisation of the WGSL kernel: every constant substituted into the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Storage element type.
    pub ty: KernelType,
    /// Head dim after padding to [`HEAD_DIM_ALIGN`].
    pub head_dim: u32,
    /// Row groups: `row_threads·row_groups` invocations, `BM = 4·row_groups`.
    pub row_groups: u32,
    /// Invocations per query row (`TX`, one of [`ROW_THREADS`]).
    pub row_threads: u32,
    /// Groups of four keys per invocation and score row: `BN = 4·row_threads·key_groups`.
    pub key_groups: u32,
    /// Head-dim columns of K or V staged at once; divides `head_dim`, multiple of 32.
    pub chunk: u32,
    /// Bottom-right causal mask.
    pub causal: bool,
    /// Row reductions, and (FMA kernel, [`Variant::p_shuffle`]) the hand-over of probabilities
    /// to the row's other invocations, by subgroup shuffles instead of through workgroup memory
    /// (the reduction scratch and Pᵀ).
    pub subgroup: bool,
    /// V is staged by keys rather than by head-dim columns: stage `c` of a tile's `NCH = D/DC`
    /// V stages holds keys `c·BN/NCH..(c+1)·BN/NCH` with all `D` columns (the same stage
    /// memory as `BN` keys × `DC` columns), so each key's probabilities are shuffled (or read
    /// from Pᵀ) once per tile for all of the head dim rather than once per chunk, and each
    /// stage's global loads are one contiguous run of V rows. Needs `chunk < head_dim` and `NCH`
    /// dividing the tile's `BN/4` key quads; not with `direct`. On the H100: 5% faster at f32
    /// D=128 alone, 3% slower at D=64 alone; with Q in registers the default at both (see
    /// `measured_best`).
    pub v_by_keys: bool,
    /// Q stays in registers instead of workgroup memory: invocation `tx` of a row group holds
    /// its four rows at dims `4·(k·TX + tx)..+3`, and S = Q·Kᵀ shuffles each dim's four values
    /// from the lane that holds it (one shuffle per dim, where Qᵀ costs one workgroup-memory
    /// load). Frees `BM·D` floats of workgroup memory, of which the driver keeps only 48 KiB
    /// resident per SM. Needs `subgroup`; not with `direct`. On the H100: 8-12% faster at f32
    /// D=128 (the default there, see `measured_best`); at D=64 the same alone, and 3-8% faster
    /// with V by keys and 4x16 micro-tiles (the default there).
    pub q_regs: bool,
    /// K and V are read straight from their buffers instead of staged through workgroup
    /// memory: S = Q·Kᵀ reads Kᵀ from the K buffer, which packing lays out transposed per tile
    /// of `BN` keys (`pack::pack_inputs`), and P·V reads V rows (each head's K/V rows zero-padded
    /// to whole tiles), one probability shuffle per key for all of the head dim. No stages and no
    /// barriers in the tile loop; workgroup memory holds only Qᵀ (and Pᵀ or the reduction
    /// scratch where used). Needs `subgroup` and `chunk == head_dim`. What an adapter with
    /// WebGPU's 16 KiB of workgroup memory gets at D=256, where no staged shape fits.
    pub direct: bool,
    /// Row groups whose lanes interleave in a subgroup (1, 2 or 4): invocation `lid` takes
    /// `tx = (lid / IL) % TX` and `ty = lid / (TX·IL) · IL + lid % IL`, so that the lanes `2k` and
    /// `2k + 1` (and, with 4, `k` and `k ^ 2`) belong to different row groups with the same `tx`
    /// and read the same K and V vec4s from workgroup memory. NVIDIA returns a 128-bit
    /// workgroup-memory load over twice fewer cycles when such lane pairs share addresses (one
    /// register per lane and cycle otherwise); with `IL = 1` neighbouring lanes read neighbouring
    /// vec4s. Needs `subgroup` with subgroups of at least `TX·IL` lanes; FMA kernel only. On the
    /// H100 2 is 4-7.5% faster than 1 for f32's measured shapes (their default), 4 no faster.
    pub interleave: u32,
    /// S = Q·Kᵀ split over the head dim instead of shuffling Q: each invocation multiplies its
    /// own dims of Q (held in registers, `q_regs`) with the same dims of `TX` keys at a time,
    /// and the row's `TX` lanes then add up their partial scores by a butterfly that leaves each
    /// lane the whole score of one of those keys (a reduce-scatter of `TX - 1` vec4 shuffles per
    /// `TX` keys, against one per head dim and four rows with Q shuffled: at D=128 and 64-key
    /// tiles, 224 shuffled floats per tile and invocation instead of 512). K is staged by keys,
    /// like V (`v_by_keys`), so that a stage holds whole rows of K. Lane `tx` accumulates key
    /// `j ^ tx` of each run in its register `j`, so that every lane sends the same register at
    /// every step and no select is needed. Needs `q_regs`, `v_by_keys`, one stage buffer and
    /// whole key groups per stage, and `subgroup` (probabilities through Pᵀ instead were 7-9%
    /// slower on the H100 at f32 D=128, and are retired). On the H100 7-8% faster for f32's
    /// measured shapes non-causal, and their default (see `measured_best`).
    pub split_d: bool,
    /// A tile's K and V stages (staged by keys) that hold no key the block sees (past `seq_k`,
    /// or causal past its last row's diagonal) are neither loaded nor multiplied: the block's
    /// last tile stops at its last stage with a key seen. The scores left out stay masked, so
    /// their probabilities are exactly 0, as without the skip. Needs `split_d` (K and V staged
    /// by keys). On the H100 f32 D=128's default (the driver then compiles it without spills),
    /// not D=64's (slower there; see `measured_best`).
    pub skip_unseen: bool,
    /// A sliding window ([`attn_core::Mask::Window`]): each row sees the keys from
    /// `win_left` before its bottom-right diagonal to `win_right` after it (run-time parameters,
    /// the unbounded sides given as `seq_q + seq_k`); a block walks only the tiles between its
    /// first row's first key and its last row's last key, and masks the tiles on either edge.
    /// Not with `causal`; FMA kernel only.
    pub window: bool,
    /// Scores soft-capped, `cap · tanh(s / cap)` on the scaled score ([`attn_core::Params::softcap`];
    /// the cap a run-time parameter). FMA kernel only.
    pub softcap: bool,
    /// ALiBi's bias `-slope · |i + seq_k - seq_q - j|` added after the soft-cap, the slopes read
    /// from a storage buffer (one per query head, or per batch and query head: a run-time
    /// stride). FMA kernel only.
    pub alibi: bool,
    /// Sequences of their own lengths (packed queries or keys, a paged cache, per-sequence key
    /// counts): the host gathers each sequence's rows into the usual buffers, every sequence
    /// padded to the longest (`seq_q`, `seq_k`), and the kernel reads each sequence's query and
    /// key counts from a storage buffer, masking and aligning its diagonal by them. FMA kernel
    /// only.
    pub seq_lens: bool,
    /// Which kernel template this specialises; the fields above are the 4x8 kernel's and
    /// [`Kernel`] says what each other kernel makes of them.
    pub kernel: Kernel,
}

/// The kernel templates a [`Variant`] can specialise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `kernels/flash.wgsl` ([`crate::fma`]): FMAs on 4 x 4·KG score micro-tiles; the f32
    /// kernel, and f16's where there are no cooperative matrices.
    Fma,
    /// `kernels/flash_coop.wgsl` ([`crate::coop`], f16 only): cooperative matrices, one
    /// subgroup of 32 per 16 query rows, `key_groups` 16-key blocks per tile; `row_threads`,
    /// and `chunk` do not apply (8, the head dim).
    Coop,
}

impl Variant {
    /// `kernel` for this dtype, head dim and mask with none of the optional techniques above (no
    /// subgroups, shuffles, V or K from their buffers, V by keys, Q in registers, interleave or
    /// split S), one row group of 8 invocations, one key group, one stage holding the whole head
    /// dim: the base that the candidate lists set field by field.
    fn plain(ty: KernelType, head_dim: u32, causal: bool, kernel: Kernel) -> Variant {
        Variant {
            ty,
            head_dim,
            row_groups: 1,
            row_threads: ROW_THREADS[0],
            key_groups: 1,
            chunk: head_dim,
            causal,
            subgroup: false,
            v_by_keys: false,
            q_regs: false,
            direct: false,
            interleave: 1,
            split_d: false,
            skip_unseen: false,
            window: false,
            softcap: false,
            alibi: false,
            seq_lens: false,
            kernel,
        }
    }

    /// This shape with a window (in place of a causal mask), a soft-cap, ALiBi and sequences of
    /// their own lengths: what the tests that generate every variant check besides the plain and
    /// causal ones.
    #[cfg(test)]
    pub(crate) fn with_every_feature(self) -> Variant {
        Variant { causal: false, window: true, softcap: true, alibi: true, seq_lens: true, ..self }
    }

    /// Whether the scores are more than a plain or causal softmax's (a window, a soft-cap or
    /// ALiBi) or its sequences have their own lengths: the kernel then declares the score
    /// parameters of `kernels/bindings.wgsl`.
    pub fn score_mods(&self) -> bool {
        self.window || self.softcap || self.alibi || self.seq_lens
    }

    /// Probabilities handed to the row's other invocations by subgroup shuffles (the FMA kernel
    /// with subgroups; through Pᵀ in workgroup memory even where subgroups could shuffle them,
    /// they need more of it and were no faster, see docs/experiments.md).
    pub fn p_shuffle(&self) -> bool {
        self.subgroup && self.kernel == Kernel::Fma
    }

    /// Invocations per workgroup.
    pub fn threads(&self) -> u32 {
        if self.kernel == Kernel::Coop {
            return 2 * self.block_m(); // a subgroup of 32 per 16 rows
        }
        self.row_groups * self.row_threads
    }

    /// Query rows per workgroup.
    pub fn block_m(&self) -> u32 {
        self.row_groups * MICRO
    }

    /// An upper bound on the loop iterations one invocation runs per key tile, in all the loops
    /// of the tile loop's body (each counted as the driver counts them, the tile loop's own
    /// included): the FMA kernel's stage loop (`NCH`), its S = Q·Kᵀ loop over the head dim (`D`
    /// over the stages), at most one P·V loop over the tile's keys per V stage, and at most two
    /// loops over a row's invocations; the cooperative-matrix kernel's loops over each lane's half
    /// row (a test counts every variant's loops in its WGSL and checks this bound).
    pub fn loop_trips_per_tile(&self) -> u32 {
        let (d, bn) = (self.head_dim, self.block_n());
        if self.kernel == Kernel::Coop {
            return 1 + (d / 16 + 4) * (bn / 8 + 1);
        }
        let stages = d / self.chunk;
        1 + stages + d + stages * bn + 2 * self.row_threads
    }

    /// Keys per score tile.
    pub fn block_n(&self) -> u32 {
        if self.kernel == Kernel::Coop {
            return 16 * self.key_groups; // 16-key blocks
        }
        self.row_threads * MICRO * self.key_groups
    }

    /// The packed Q, K and V hold each head's rows padded with zeros to a multiple of these
    /// (Q, K/V): whole blocks for the cooperative-matrix kernel, which loads its matrices straight
    /// from the buffers; whole key tiles for the FMA kernels, whose K and V loads are not guarded
    /// (only Q's are: `kernels/loads.wgsl`).
    pub fn row_align(&self) -> (usize, usize) {
        if self.kernel == Kernel::Coop {
            (self.block_m() as usize, self.block_n() as usize)
        } else {
            (1, self.block_n() as usize)
        }
    }

    /// Workgroup memory, bytes: Qᵀ, the K/V chunk, Pᵀ and (without subgroups) the reduction
    /// scratch, all f32. Must match the `var<workgroup>` declarations of the kernel, which a
    /// test checks through naga.
    pub fn shared_bytes(&self) -> u32 {
        let (bm, bn) = (self.block_m(), self.block_n());
        if self.kernel == Kernel::Coop {
            // S (f32) and P (f16) per 16 rows, the rescale flags (two, in 16 bytes).
            return bm * bn * (4 + 2) + 16;
        }
        let red = if self.subgroup { 0 } else { self.row_threads * bm };
        let p = if self.p_shuffle() { 0 } else { bn * bm };
        let kv = if self.direct { 0 } else { bn * self.chunk };
        let q = if self.q_regs { 0 } else { bm * self.head_dim };
        4 * (q + kv + p + red)
    }

    /// The name plans and errors use, e.g. `flash_f32_d128_m64n64_c64_causal_sg_pshfl` (`window`
    /// in place of `causal` for a sliding window; with `_tx16` at the end for 16 invocations per row, `_vd_kd` for V and K read straight from
    /// their buffers, `_vk` for V staged by keys, `_qr` for Q held in registers, `_il2` for two
    /// row groups' lanes interleaved, `_sd` for S split over the head dim, `_sk` for unseen stages
    /// skipped, `_cap` for a soft-cap, `_alibi` for ALiBi, `_vl` for sequences of their own
    /// lengths).
    pub fn name(&self) -> String {
        let ty = match self.ty {
            KernelType::F32 => "f32",
            KernelType::F16 => "f16",
        };
        format!(
            "flash_{ty}_d{}_m{}n{}_c{}_{}_{}{}{}",
            self.head_dim,
            self.block_m(),
            self.block_n(),
            self.chunk,
            if self.causal {
                "causal"
            } else if self.window {
                "window"
            } else {
                "full"
            },
            if self.subgroup { "sg" } else { "wgmem" },
            if self.p_shuffle() { "_pshfl" } else { "" },
            if self.row_threads == ROW_THREADS[0] {
                String::new()
            } else {
                format!("_tx{}", self.row_threads)
            },
        ) + if self.direct { "_vd" } else { "" }
            + if self.v_by_keys { "_vk" } else { "" }
            + if self.q_regs { "_qr" } else { "" }
            + if self.direct { "_kd" } else { "" }
            + &if self.interleave > 1 { format!("_il{}", self.interleave) } else { String::new() }
            + if self.split_d { "_sd" } else { "" }
            + if self.skip_unseen { "_sk" } else { "" }
            + if self.softcap { "_cap" } else { "" }
            + if self.alibi { "_alibi" } else { "" }
            + if self.seq_lens { "_vl" } else { "" }
            + if self.kernel == Kernel::Coop { "_coop" } else { "" }
    }
}

/// Rows per head of the packed Q and of K/V: `seq_q` and `seq_k` rounded up to
/// [`Variant::row_align`].
pub fn padded_rows(variant: &Variant, seq_q: usize, seq_k: usize) -> (usize, usize) {
    let (q, k) = variant.row_align();
    (seq_q.div_ceil(q) * q, seq_k.div_ceil(k) * k)
}

/// The head dim the kernel runs at: `d` rounded up to a multiple of [`HEAD_DIM_ALIGN`].
pub fn padded_head_dim(d: usize) -> usize {
    d.div_ceil(HEAD_DIM_ALIGN) * HEAD_DIM_ALIGN
}

/// Everything [`choose`] decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The specialisation.
    pub variant: Variant,
    /// Workgroups and invocations, checked against the adapter.
    pub launch: Launch,
    /// Tiles, as plans print them.
    pub tiles: Tiles,
    /// Device memory of the call (q, k, v, o, lse, and a split's partial and running outputs),
    /// bytes.
    pub device_bytes: u64,
    /// The keys split over several dispatches, where the adapter's loop limit requires it.
    pub split: Option<KeySplit>,
    /// Lines for the plan.
    pub notes: Vec<String>,
}

/// Picks the specialisation and launch for `problem` on an adapter with `caps`, or says why it
/// cannot run there: a typed error, raised before any buffer exists.
pub fn choose(problem: &Problem, caps: &AdapterCaps) -> Result<Choice> {
    choose_among(problem, caps, &|_| true)
}

/// [`choose`] among the variants that `allowed` accepts (tuning knobs, so that one tile shape
/// can be timed against another on the same adapter).
pub fn choose_among(
    problem: &Problem,
    caps: &AdapterCaps,
    allowed: &dyn Fn(&Variant) -> bool,
) -> Result<Choice> {
    problem.validate()?;
    problem.require_features("wgpu", &SCORE_FEATURES)?;
    let s = problem.shape;
    let unsupported_dim = || Error::UnsupportedHeadDim {
        backend: "wgpu".into(),
        head_dim: s.head_dim,
        supported: format!("1..={MAX_HEAD_DIM} (padded to a multiple of {HEAD_DIM_ALIGN})"),
    };
    if s.head_dim > MAX_HEAD_DIM {
        return Err(unsupported_dim());
    }
    let ty = match problem.dtype {
        DType::F32 | DType::Bf16 => KernelType::F32,
        DType::F16 if caps.f16 => KernelType::F16,
        DType::F16 => {
            return Err(Error::UnsupportedDType {
                backend: "wgpu".into(),
                dtype: DType::F16,
                supported: format!("f32 and bf16 (widened to f32); {} lacks SHADER_F16", caps.name),
            });
        }
    };
    let d = padded_head_dim(s.head_dim) as u32;
    let window = matches!(problem.params.mask, Mask::Window { .. });
    let (softcap, alibi) = (problem.params.softcap.is_some(), problem.params.alibi.is_some());
    let seq_lens = !problem.batching.is_dense();
    if window && s.seq_q.saturating_add(s.seq_k) > WINDOW_MAX_ROWS {
        return Err(Error::Unsupported {
            backend: "wgpu".into(),
            what: format!(
                "{problem}: a sliding window over seq_q + seq_k > {WINDOW_MAX_ROWS} rows (the kernel \
                 computes each row's window in i32)"
            ),
        });
    }
    if let Some(cap) = problem.params.softcap.filter(|c| !SOFTCAP_RANGE.contains(c)) {
        return Err(Error::Unsupported {
            backend: "wgpu".into(),
            what: format!(
                "{problem}: a soft-cap of {cap}, outside {SOFTCAP_RANGE:?} (the kernel multiplies by its \
                 f32 inverse, which must stay a normal number)"
            ),
        });
    }
    // The cooperative-matrix kernel computes plain and causal scores of dense batches only.
    let plain_scores = !(window || softcap || alibi || seq_lens);
    let coop = coop_candidates(d, problem.is_causal())
        .filter(|_| caps.coop_f16 && ty == KernelType::F16 && plain_scores);
    let mut wanted: Vec<Variant> = coop
        .chain(candidates(ty, d, problem.is_causal(), caps.subgroup_min).map(|v| Variant {
            window,
            softcap,
            alibi,
            seq_lens,
            ..v
        }))
        .filter(|v| allowed(v))
        .collect();
    // Short causal problems at f32 D=128 take the measured shape's 64-row form, every stage
    // loaded, where the knobs leave it (see `SHORT_CAUSAL_MAX_KEYS`).
    let short_causal = problem.is_causal() && s.seq_k <= SHORT_CAUSAL_MAX_KEYS;
    if let Some(&first) =
        wanted.first().filter(|m| short_causal && m.ty == KernelType::F32 && m.split_d && m.head_dim == 128)
    {
        let short = Variant { row_groups: ROW_GROUPS[0], skip_unseen: false, ..first };
        if let Some(i) = wanted.iter().position(|v| *v == short) {
            let v = wanted.remove(i);
            wanted.insert(0, v);
        }
    }
    // Report the smallest wanted variant's needs where none fits: nothing smaller exists.
    let Some(smallest) = wanted.iter().min_by_key(|v| v.shared_bytes()) else {
        return Err(Error::Unsupported {
            backend: "wgpu".into(),
            what: format!(
                "no {ty:?} kernel for head dim {d} matches the tile pins (ATTN_WGPU_ROWS, _KEY_GROUPS, \
                 _CHUNK, _ROW_THREADS, or Options) on {}",
                caps.name
            ),
        });
    };
    let variant = *wanted
        .iter()
        .find(|v| v.threads() <= caps.invocations && v.shared_bytes() <= caps.workgroup_storage)
        .ok_or_else(|| Error::OverDeviceLimit {
            kernel: smallest.name(),
            resource: "workgroup storage (bytes)",
            needed: smallest.shared_bytes() as u64,
            allowed: caps.workgroup_storage as u64,
            device: caps.name.clone(),
        })?;

    let split = key_split(&variant, s.seq_k, caps);

    // Buffers: every tensor is packed contiguous (BHSD, head dim padded) on upload; a split adds
    // the partial output (as o and lse) and the running one (f32).
    let elem = ty.size();
    let bh = (s.batch * s.heads_q) as u64;
    let bhkv = (s.batch * s.heads_kv) as u64;
    let (q_rows, k_rows) = padded_rows(&variant, s.seq_q, s.seq_k);
    let o_elems = bh * s.seq_q as u64 * d as u64;
    let mut tensors = vec![
        ("q", bh * q_rows as u64 * d as u64 * elem),
        ("k", bhkv * k_rows as u64 * d as u64 * elem),
        ("v", bhkv * k_rows as u64 * d as u64 * elem),
        ("o", o_elems * elem),
        ("lse", bh * s.seq_q as u64 * 4),
    ];
    if split.is_some() {
        tensors.extend([("o", o_elems * elem), ("lse", bh * s.seq_q as u64 * 4), ("o_acc", o_elems * 4)]);
    }
    // The kernels index buffers with u32 arithmetic: in vec4 units of the element type, lse in
    // f32, and the cooperative-matrix kernel its inputs in f16 elements.
    for &(name, bytes) in &tensors {
        let unit = match name {
            "lse" => 4,
            "o" => 4 * elem,
            "o_acc" => 16,
            _ if variant.kernel == Kernel::Coop => elem,
            _ => 4 * elem,
        };
        let allowed = caps.storage_binding.min(unit * (u32::MAX as u64));
        if bytes > allowed {
            return Err(Error::OverDeviceLimit {
                kernel: variant.name(),
                resource: match name {
                    "q" => "storage buffer binding of q (bytes)",
                    "k" => "storage buffer binding of k (bytes)",
                    "v" => "storage buffer binding of v (bytes)",
                    "o" => "storage buffer binding of o (bytes)",
                    "o_acc" => "storage buffer binding of the split's running output (bytes)",
                    _ => "storage buffer binding of lse (bytes)",
                },
                needed: bytes,
                allowed,
                device: caps.name.clone(),
            });
        }
    }
    let device_bytes = tensors.iter().map(|(_, b)| b).sum();

    let q_blocks = s.seq_q.div_ceil(variant.block_m() as usize) as u64;
    let per_dim = caps.workgroups_per_dim.max(1) as u64;
    let grid_y = bh.min(per_dim);
    let grid_z = bh.div_ceil(grid_y);
    let launch = Launch {
        grid: [q_blocks.min(u32::MAX as u64) as u32, grid_y as u32, grid_z.min(u32::MAX as u64) as u32],
        block: [variant.threads(), 1, 1],
        dynamic_shared_bytes: 0,
        static_shared_bytes: variant.shared_bytes(),
        registers_per_thread: None,
        spill_bytes: None,
    };
    launch.validate(&variant.name(), &caps.device_limits())?;

    let memory = format!("workgroup memory {} of {} B", variant.shared_bytes(), caps.workgroup_storage);
    let mut notes = vec![];
    if variant.kernel == Kernel::Coop {
        notes.push(format!(
            "{} invocations, a subgroup of 32 per 16 query rows, S = Q·Kᵀ and O += P·V on 16x16x16 \
             cooperative matrices (f16 inputs, P rounded to f16, f32 accumulators); {memory}",
            variant.threads()
        ));
        notes.push(
            "K, V and Q matrices loaded straight from the buffers (rows padded per head to whole \
             tiles); running max raised only when a row's tile max exceeds it by 8 (log2): O is \
             rescaled through workgroup memory then; wgpu's experimental cooperative matrices \
             (ATTN_WGPU_COOP=0 for the FMA kernel)"
                .into(),
        );
    } else {
        notes.push(format!(
            "{} invocations, each a {MICRO}x{} tile of S and {MICRO} rows x {} columns of O; {memory}",
            variant.threads(),
            MICRO * variant.key_groups,
            d / variant.row_threads,
        ));
        let staged = if variant.v_by_keys { "K" } else { "K and V" };
        if variant.direct {
            notes.push(
                "S = Q·Kᵀ reads Kᵀ straight from its buffer (packed transposed per tile): no stages, \
                 no barriers in the tile loop"
                    .into(),
            );
        } else if variant.chunk < d {
            notes.push(format!("{staged} staged {} of {d} head-dim columns at a time", variant.chunk));
        }
        if variant.q_regs {
            notes.push(format!(
                "Q held in registers ({} per invocation), each dim's four rows shuffled from its lane in S = Q·Kᵀ; no Qᵀ in workgroup memory",
                4 * d / variant.row_threads
            ));
        }
        if variant.v_by_keys {
            let stages = d / variant.chunk;
            notes.push(format!(
                "V staged {} of {} keys at a time, all {d} columns (each key's probabilities fetched once per tile)",
                variant.block_n() / stages,
                variant.block_n()
            ));
        }
        if variant.direct {
            notes.push(
                "P·V reads V straight from its buffer (each head's K/V rows padded to whole tiles): \
                 no V stages, one probability shuffle per key"
                    .into(),
            );
        }
        if variant.interleave > 1 {
            notes.push(format!(
                "lanes of {} row groups interleaved: neighbouring lanes read the same K and V vec4s",
                variant.interleave
            ));
        }
        if variant.split_d {
            notes.push(format!(
                "S = Q·Kᵀ split over the head dim: each invocation's {} dims of Q against {} keys at a \
                 time, partial scores added across the row's lanes by a reduce-scatter ({} vec4 shuffles \
                 per {} keys); K staged by keys too",
                d / variant.row_threads,
                variant.row_threads,
                variant.row_threads - 1,
                variant.row_threads
            ));
        }
        notes.push(if variant.subgroup {
            format!("row max/sum by subgroup shuffles (subgroups of {}+)", caps.subgroup_min.unwrap_or(0))
        } else {
            format!(
                "row max/sum through workgroup memory (no SUBGROUP, or subgroups narrower than a row's {} \
                 invocations)",
                variant.row_threads
            )
        });
        notes.push(if variant.p_shuffle() {
            "probabilities handed to the row's other invocations by subgroup shuffles".into()
        } else {
            format!(
                "probabilities handed around through workgroup memory (Pᵀ, {} B)",
                4 * variant.block_m() * variant.block_n()
            )
        });
    }
    if let Some(note) = score_note(problem) {
        notes.push(note);
    }
    if d as usize != s.head_dim {
        notes.push(format!("head dim {} padded with zeros to {d} on upload", s.head_dim));
    }
    if problem.dtype == DType::Bf16 {
        notes
            .push("bf16 inputs widened to f32 on upload (exact); output rounded once to bf16 on read".into());
    }
    let packed = |st: &Strides, heads: usize, seq: usize| {
        *st == attn_core::Layout::Bhsd.strides(heads, seq, s.head_dim)
    };
    let t: &TensorStrides = &problem.strides;
    if !(packed(&t.q, s.heads_q, s.seq_q)
        && packed(&t.k, s.heads_kv, s.seq_k)
        && packed(&t.v, s.heads_kv, s.seq_k))
        || d as usize != s.head_dim
        || problem.dtype == DType::Bf16
    {
        notes.push("inputs repacked on the host to contiguous BHSD at prepare (not timed)".into());
    }
    if let Some(split) = split {
        notes.push(format!(
            "keys split over {} dispatches of {} (a multiple of the {}-key tile), merged by log-sum-exp \
             after each: {} ends every loop of an invocation after {} iterations in all, and this \
             kernel's tile loop runs at most {} per tile",
            split.parts,
            split.keys,
            variant.block_n(),
            caps.name,
            caps.loop_limit.unwrap_or(0),
            variant.loop_trips_per_tile()
        ));
        notes.push(format!(
            "device memory {device_bytes} B: q, k, v, o and lse, one partial o and lse, the running o \
             (f32); linear in S"
        ));
    } else {
        notes.push(format!(
            "device memory {device_bytes} B: q, k, v, o and lse only; no workspace, linear in S"
        ));
    }
    notes.push(if caps.timestamps {
        "kernel time from GPU timestamp queries around the dispatch".into()
    } else {
        "kernel time from the host clock around submit and wait (no TIMESTAMP_QUERY)".into()
    });
    if caps.kind == DeviceKind::SoftwareGpu {
        notes.push(format!("{} is a software rasteriser on the CPU: correct, slow", caps.name));
    }
    let tiles = Tiles { block_m: variant.block_m() as usize, block_n: variant.block_n() as usize, stages: 1 };
    Ok(Choice { variant, launch, tiles, device_bytes, split, notes })
}

/// The features beyond dense plain or causal scores that the FMA kernel runs (the
/// cooperative-matrix kernel none: such problems take the FMA kernel).
pub const SCORE_FEATURES: [Feature; 7] = Feature::ALL;

/// The longest `seq_q + seq_k` a sliding window is planned for: the kernel computes each row's
/// first and last key in i32, from sums of up to about twice this.
pub const WINDOW_MAX_ROWS: usize = 1 << 29;

/// The soft-caps planned: the kernel works in log2 units with the cap's f32 inverse, which
/// stays a normal number across this range (wider than any model's, 30 or 50).
pub const SOFTCAP_RANGE: std::ops::RangeInclusive<f32> = 1e-30..=1e30;

/// The plan's line on a window, a soft-cap or ALiBi, where the problem has one.
fn score_note(problem: &Problem) -> Option<String> {
    let p = &problem.params;
    let mut parts = Vec::new();
    if let Mask::Window { left, right } = p.mask {
        let side = |b: Option<usize>| b.map_or("unbounded".to_string(), |n| n.to_string());
        parts.push(format!(
            "sliding window ({} left, {} right of the diagonal): each block walks only the key tiles \
             between its first row's first key and its last row's last key, masking the edge tiles",
            side(left),
            side(right)
        ));
    }
    if let Some(cap) = p.softcap {
        parts.push(format!("scores soft-capped at {cap} (cap·tanh(s/cap), in f32)"));
    }
    if let Some(alibi) = p.alibi {
        parts.push(format!("ALiBi bias after the soft-cap, slopes {alibi:?} from a storage buffer"));
    }
    if !problem.batching.is_dense() {
        parts.push(format!(
            "sequences of their own lengths ({:?}): each sequence's rows gathered on the host into \
             buffers padded to the longest (seq_q {}, seq_k {}); the kernel reads each sequence's \
             query and key counts from a storage buffer",
            problem.batching, problem.shape.seq_q, problem.shape.seq_k
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// How `variant` splits `seq_k` keys on an adapter with `caps`: not at all where the adapter has
/// no loop limit or one dispatch stays within its budget ([`LOOP_BUDGET_SHARE`]).
pub fn key_split(variant: &Variant, seq_k: usize, caps: &AdapterCaps) -> Option<KeySplit> {
    let limit = caps.loop_limit?;
    let tiles = (limit / LOOP_BUDGET_SHARE / variant.loop_trips_per_tile()).max(1);
    let keys = tiles * variant.block_n();
    (seq_k > keys as usize).then(|| KeySplit { keys, parts: seq_k.div_ceil(keys as usize) as u32 })
}

/// Every variant for this dtype, head dim and mask, in order of preference; the planner takes
/// the first that fits the adapter. First, where there is one, the shape measured fastest for
/// this head dim (`measured_best`), then the same with the other of 64 and 128 rows (what an
/// adapter with fewer invocations takes, and, for f32 D=128, short causal problems: see
/// `SHORT_CAUSAL_MAX_KEYS`). Then the generic shapes: probabilities exchanged by shuffles where
/// subgroups allow (no Pᵀ in workgroup memory), then more rows per workgroup (K/V tiles reused
/// by more queries), then wider micro-tiles, then more of the head dim per stage (fewer
/// barriers), 8 invocations per row before 16 and 4. Last, K and V read straight from their
/// buffers ([`Variant::direct`]), for adapters where no staged shape fits (D=256 with WebGPU's
/// 16 KiB). A variant uses subgroup operations where the adapter's
/// smallest subgroup (`subgroup_min`) spans a row's invocations. No variant is listed twice.
///
/// Alternatives that were measured and rejected (two stage buffers, V staged by keys or Q in
/// registers outside the measured shapes, V alone read from its buffer, other interleaves, S
/// not split in the measured shapes, probabilities through Pᵀ where subgroups could shuffle
/// them, the 8x8 kernel) are retired: see docs/experiments.md.
pub fn candidates(
    ty: KernelType,
    head_dim: u32,
    causal: bool,
    subgroup_min: Option<u32>,
) -> impl Iterator<Item = Variant> {
    let spans = move |row_threads: u32| subgroup_min.is_some_and(|m| m >= row_threads);
    let variant = move |row_threads, row_groups, key_groups, chunk| Variant {
        row_groups,
        row_threads,
        key_groups,
        chunk,
        subgroup: spans(row_threads),
        ..Variant::plain(ty, head_dim, causal, Kernel::Fma)
    };
    // The measured shape, with its lanes interleaved where a subgroup spans them; then its form
    // with the other of 64 and 128 rows (which holds Q in registers too, so costs no more
    // workgroup memory), and, where the measured shape skips unseen stages, that form loading
    // every stage (f32 D=128's choice for short causal problems).
    let other_rows = |groups: u32| if groups == ROW_GROUPS[0] { 2 * ROW_GROUPS[0] } else { ROW_GROUPS[0] };
    let mut all: Vec<Variant> = Vec::new();
    if let Some(m) = measured_best(head_dim, causal).filter(|_| spans(ROW_THREADS[0])) {
        let v = Variant {
            v_by_keys: m.v_by_keys,
            q_regs: m.q_regs,
            interleave: if spans(ROW_THREADS[0] * m.interleave) { m.interleave } else { 1 },
            split_d: m.split_d,
            skip_unseen: m.skip_unseen,
            ..variant(ROW_THREADS[0], m.rows / MICRO, m.key_groups, m.chunk)
        };
        all.push(v);
        let other = Variant { row_groups: other_rows(v.row_groups), ..v };
        let forms = [Some(other), other.skip_unseen.then_some(Variant { skip_unseen: false, ..other })];
        let fits = |w: &Variant| {
            !(w.subgroup && w.q_regs)
                || (spans(w.row_threads * w.interleave) && w.row_groups.is_multiple_of(w.interleave))
        };
        all.extend(forms.into_iter().flatten().filter(fits));
    }
    let measured = all.len().min(1);
    for row_threads in ROW_THREADS {
        // Stages of whole vec4s of O per invocation and row, dividing the head dim.
        let chunks: Vec<u32> = (1..=head_dim / 32)
            .rev()
            .map(|k| k * 32)
            .filter(|c| head_dim.is_multiple_of(*c) && c.is_multiple_of(4 * row_threads))
            .collect();
        for row_groups in ROW_GROUPS {
            for key_groups in KEY_GROUPS {
                for &chunk in &chunks {
                    let v = variant(row_threads, row_groups, key_groups, chunk);
                    // The measured shape is already first.
                    if !all[..measured].contains(&v) {
                        all.push(v);
                    }
                }
            }
        }
    }
    // K and V straight from their buffers, last: the shuffled shapes of 8 invocations per row
    // with the whole head dim in one pass and Qᵀ in workgroup memory.
    let direct: Vec<Variant> = all
        .iter()
        .filter(|v| v.p_shuffle() && v.row_threads == ROW_THREADS[0])
        .map(|&v| Variant {
            direct: true,
            v_by_keys: false,
            q_regs: false,
            interleave: 1,
            split_d: false,
            skip_unseen: false,
            row_groups: v.row_groups.min(ROW_GROUPS[0]),
            ..v
        })
        .filter(|v| v.chunk == head_dim)
        .fold(Vec::new(), push_new);
    direct.into_iter().fold(all, push_new).into_iter()
}

/// Appends `v` to `list` unless it is there already (for `fold`, keeping the first place).
fn push_new(mut list: Vec<Variant>, v: Variant) -> Vec<Variant> {
    if !list.contains(&v) {
        list.push(v);
    }
    list
}

/// The cooperative-matrix kernel's shape for head dim `head_dim` (a multiple of 16): 16 rows per
/// workgroup (one subgroup of 32) and 16-key tiles, 1.5 KiB of workgroup memory, so that 32
/// subgroups fit in the 48 KiB the driver keeps resident per SM: on the H100 7-18% faster than
/// 32-key tiles at S=512 and 4096, D=64, and 2-11% at D=128; 32 or 64 rows slower; 64-key tiles
/// failed verification (measured, see docs/experiments.md).
pub fn coop_candidates(head_dim: u32, causal: bool) -> impl Iterator<Item = Variant> {
    let shapes = [(16, 16)];
    shapes.into_iter().filter(move |_| head_dim.is_multiple_of(16)).map(move |(bm, bn): (u32, u32)| Variant {
        row_groups: bm / MICRO,
        key_groups: bn / 16,
        subgroup: true,
        ..Variant::plain(KernelType::F16, head_dim, causal, Kernel::Coop)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::Shape;

    fn lavapipe() -> AdapterCaps {
        AdapterCaps {
            name: "llvmpipe (stated)".into(),
            kind: DeviceKind::SoftwareGpu,
            workgroup_storage: 32 * 1024,
            invocations: 1024,
            workgroups_per_dim: 65535,
            storage_binding: 128 << 20,
            f16: true,
            subgroup_min: Some(8),
            timestamps: true,
            coop_f16: false,
            loop_limit: Some(SOFTWARE_LOOP_LIMIT),
        }
    }

    /// K and V read straight from their buffers, and 128 rows or Q in registers outside f32's
    /// measured shapes, are the planner's choice only where no other shape fits the adapter (at
    /// D=256 with 16 KiB, only Qᵀ of 16 rows does), on any adapter size, head dim, dtype or mask.
    #[test]
    fn knob_only_shapes_are_chosen_only_where_nothing_else_fits() {
        let mut chosen_alone = 0;
        for kib in [16, 32, 48, 64, 100, 228] {
            for subgroup_min in [None, Some(8), Some(32), Some(64)] {
                for invocations in [128, 256, 1024] {
                    let caps = AdapterCaps {
                        workgroup_storage: kib * 1024,
                        invocations,
                        subgroup_min,
                        ..lavapipe()
                    };
                    for d in (32..=256).step_by(32) {
                        for dtype in [DType::F32, DType::F16] {
                            for causal in [false, true] {
                                let mut p = Problem::new(Shape::new(1, 2, 300, d), dtype);
                                if causal {
                                    p = p.causal();
                                }
                                let Ok(choice) = choose(&p, &caps) else { continue };
                                let v = choice.variant;
                                // Interleaved lanes and Q in registers: f32's measured shape,
                                // first in the list, or its form with the other of 64 and 128
                                // rows where the measured one has more invocations than the
                                // adapter or the problem is short and causal (then also
                                // loading every stage).
                                let first = candidates(v.ty, v.head_dim, causal, subgroup_min).next();
                                let form = first.is_some_and(|f| {
                                    Variant { row_groups: f.row_groups, skip_unseen: f.skip_unseen, ..v } == f
                                });
                                assert!(v.interleave == 1 || form, "{}", v.name());
                                let measured =
                                    form && measured_best(v.head_dim, v.causal).is_some_and(|m| m.q_regs);
                                if v.direct || ((v.block_m() > 64 || v.q_regs) && !measured) {
                                    let fits = |w: &Variant| {
                                        w.shared_bytes() <= caps.workgroup_storage
                                            && w.threads() <= caps.invocations
                                    };
                                    let other = candidates(v.ty, v.head_dim, causal, subgroup_min)
                                        .find(|w| !w.direct && w.block_m() <= 64 && !w.q_regs && fits(w));
                                    assert!(other.is_none(), "{} chosen over {:?}", v.name(), other);
                                    chosen_alone += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        // The branch above is reached (D=256 with 16 KiB): the check is not vacuous.
        assert!(chosen_alone > 0);
    }

    /// f32 D=128 causal takes the 64-row form with every stage loaded up to
    /// `SHORT_CAUSAL_MAX_KEYS` keys and the 128-row form that skips unseen stages after; knobs
    /// still pick either, and nothing else moves.
    #[test]
    fn short_causal_d128_takes_64_rows() {
        let h100 = AdapterCaps { workgroup_storage: 48 * 1024, subgroup_min: Some(32), ..lavapipe() };
        let plan = |seq: usize, causal: bool, allowed: &dyn Fn(&Variant) -> bool| {
            let p = Problem::new(Shape::new(1, 16, seq, 128), DType::F32);
            choose_among(&if causal { p.causal() } else { p }, &h100, allowed).unwrap().variant.name()
        };
        let any = |_: &Variant| true;
        let short = "flash_f32_d128_m64n64_c64_causal_sg_pshfl_vk_qr_il2_sd";
        let long = "flash_f32_d128_m128n64_c64_causal_sg_pshfl_vk_qr_il2_sd_sk";
        assert_eq!(plan(SHORT_CAUSAL_MAX_KEYS, true, &any), short);
        assert_eq!(plan(SHORT_CAUSAL_MAX_KEYS + 1, true, &any), long);
        assert_eq!(plan(512, false, &any), "flash_f32_d128_m128n64_c64_full_sg_pshfl_vk_qr_il2_sd_sk");
        assert_eq!(plan(512, true, &|v: &Variant| v.skip_unseen), long);
        assert_eq!(plan(8192, true, &|v: &Variant| v.block_m() == 64 && !v.skip_unseen), short);
        // Knobs that leave nothing: the typed error, as for any problem.
        let p = Problem::new(Shape::new(1, 16, 512, 128), DType::F32).causal();
        assert!(matches!(choose_among(&p, &h100, &|_| false), Err(Error::Unsupported { .. })));
    }

    /// V staged by keys, Q in registers and S split over the head dim are the planner's own
    /// choice only for the shapes timed faster with them (D=64 and D=128, subgroups spanning a
    /// row; f32, and f16 on the FMA kernel), and no head dim lists a variant twice.
    #[test]
    fn v_by_keys_only_where_measured_and_no_variant_listed_twice() {
        for d in (32..=256).step_by(32) {
            for ty in [KernelType::F32, KernelType::F16] {
                for causal in [false, true] {
                    for subgroup_min in [None, Some(8), Some(32)] {
                        let all: Vec<Variant> = candidates(ty, d, causal, subgroup_min).collect();
                        for (i, v) in all.iter().enumerate() {
                            assert!(!all[..i].contains(v), "{} listed twice", v.name());
                            // Only the measured shapes' forms (64 or 128 rows, S split over the
                            // head dim or not, probabilities shuffled or through Pᵀ) interleave
                            // lanes or split S: no other list takes them over from them.
                            let first = all[0];
                            let form = Variant {
                                interleave: first.interleave,
                                row_groups: first.row_groups,
                                split_d: first.split_d,
                                skip_unseen: first.skip_unseen,
                                ..*v
                            };
                            assert!(!v.skip_unseen || v.split_d, "{}", v.name());
                            assert!(v.interleave == 1 || form == first, "{}", v.name());
                            assert!(!v.split_d || form == first, "{}", v.name());
                        }
                    }
                }
            }
        }
        let h100 = AdapterCaps { workgroup_storage: 48 * 1024, subgroup_min: Some(32), ..lavapipe() };
        for d in [64, 128] {
            for dtype in [DType::F32, DType::F16] {
                for caps in [h100.clone(), lavapipe()] {
                    let p = Problem::new(Shape::new(1, 2, 300, d), dtype);
                    let v = choose(&p, &caps).unwrap().variant;
                    // Both have subgroups spanning a row and room for its 16 KiB, and no
                    // cooperative matrices: f16 takes the FMA kernel on f32's shapes.
                    assert!(v.v_by_keys && v.q_regs && v.split_d, "{} on {}", v.name(), caps.name);
                    // Interleaved in pairs where subgroups span 16 lanes (not lavapipe's 8).
                    let paired = caps.subgroup_min >= Some(16);
                    assert_eq!(v.interleave, if paired { 2 } else { 1 }, "{} on {}", v.name(), caps.name);
                }
                // Causal too: 128 rows at both (at D=64 64 without a mask), where D=128 alone
                // skips the stages no row sees (past `SHORT_CAUSAL_MAX_KEYS` keys).
                let causal = Problem::new(Shape::new(1, 2, 2048, d), dtype).causal();
                let v = choose(&causal, &h100).unwrap().variant;
                assert!(v.split_d && v.block_m() == 128, "{} causal", v.name());
                assert_eq!(v.skip_unseen, d == 128, "{} causal", v.name());
                // With cooperative matrices f16 takes those instead.
                let coop = choose(&causal, &AdapterCaps { coop_f16: true, ..h100.clone() }).unwrap();
                assert_eq!(
                    coop.variant.kernel == Kernel::Coop,
                    dtype == DType::F16,
                    "{}",
                    coop.variant.name()
                );
                // Without subgroups spanning a row (Q in registers needs them), none of the three.
                for subgroup_min in [None, Some(4)] {
                    let caps = AdapterCaps { subgroup_min, ..h100.clone() };
                    let v = choose(&Problem::new(Shape::new(1, 2, 300, d), dtype), &caps).unwrap().variant;
                    assert!(
                        !v.v_by_keys && !v.q_regs && !v.split_d,
                        "{} with subgroups of {subgroup_min:?}",
                        v.name()
                    );
                }
            }
        }
    }

    /// Pins that leave only shapes too big for the adapter are a typed error naming the
    /// smallest of them, not a panic.
    #[test]
    fn too_big_for_the_pins_is_a_typed_error() {
        let p = Problem::new(Shape::new(1, 2, 300, 256), DType::F32);
        let tall = choose_among(&p, &lavapipe(), &|v| v.direct && v.block_m() == 64);
        assert!(
            matches!(&tall, Err(Error::OverDeviceLimit { kernel, .. }) if kernel.contains("_m64n") && kernel.ends_with("_vd_kd")),
            "{tall:?}"
        );
    }

    #[test]
    fn head_dims_to_128_fit_webgpu_defaults_and_256_is_a_typed_error() {
        for d in [1, 32, 40, 64, 96, 128] {
            let p = Problem::new(Shape::new(1, 2, 100, d), DType::F32);
            let c = choose(&p, &AdapterCaps::webgpu_defaults()).unwrap();
            assert!(c.variant.shared_bytes() <= 16 * 1024, "d{d}: {}", c.variant.name());
            assert_eq!(c.variant.head_dim as usize, padded_head_dim(d));
        }
        // Qᵀ alone of the smallest block (16 rows x 256) takes all 16 KiB.
        let p = Problem::new(Shape::new(1, 2, 100, 256), DType::F32);
        assert!(matches!(
            choose(&p, &AdapterCaps::webgpu_defaults()),
            Err(Error::OverDeviceLimit { resource: "workgroup storage (bytes)", .. })
        ));
    }

    #[test]
    fn more_workgroup_memory_gives_larger_tiles() {
        let tiles = |d: usize, kib: u32, subgroups: bool| {
            let p = Problem::new(Shape::new(1, 2, 1000, d), DType::F32);
            let caps = AdapterCaps {
                workgroup_storage: kib * 1024,
                subgroup_min: subgroups.then_some(32),
                ..lavapipe()
            };
            let v = choose(&p, &caps).unwrap().variant;
            assert!(v.shared_bytes() <= kib * 1024, "{}", v.name());
            (v.block_m(), v.block_n(), v.chunk, v.p_shuffle())
        };
        // With subgroups, P is shuffled and takes no workgroup memory: f32 D=128 and D=64 get
        // their measured tiles with Q in registers wherever their K/V chunk (16 KiB: 64 keys x
        // 64 columns, 128 keys x 32 columns) fits; D=128 non-causal with 128 rows.
        for kib in [16, 32, 48] {
            assert_eq!(tiles(128, kib, true), (128, 64, 64, true));
            assert_eq!(tiles(64, kib, true), (64, 128, 32, true));
        }
        // Without, Pᵀ and the reduction scratch share the memory: 64 x 32 tiles at 48 KiB.
        assert_eq!(tiles(128, 48, false), (64, 32, 32, false));
        assert_eq!(tiles(64, 48, false), (64, 64, 32, false));
        // f16 on the FMA kernel takes the same tiles.
        let p = Problem::new(Shape::new(1, 2, 1000, 128), DType::F16);
        let caps = AdapterCaps { workgroup_storage: 48 * 1024, subgroup_min: Some(32), ..lavapipe() };
        let v = choose(&p, &caps).unwrap().variant;
        assert_eq!((v.block_m(), v.block_n(), v.chunk, v.p_shuffle()), (128, 64, 64, true));
    }

    #[test]
    fn shared_bytes_formula() {
        let v = Variant { row_groups: 8, ..Variant::plain(KernelType::F32, 64, false, Kernel::Fma) };
        assert_eq!((v.row_threads, v.key_groups, v.chunk), (8, 1, 64));
        // Qᵀ 32x64, K/V 32x64, Pᵀ 32x32, scratch 8x32, f32.
        assert_eq!(v.shared_bytes(), 4 * (32 * 64 + 32 * 64 + 32 * 32 + 8 * 32));
        // Twice the keys: K/V 64x64, Pᵀ 64x32.
        let two_groups = Variant { key_groups: 2, ..v };
        assert_eq!(two_groups.block_n(), 64);
        assert_eq!(two_groups.shared_bytes(), 4 * (32 * 64 + 64 * 64 + 64 * 32 + 8 * 32));
        // Subgroups: P shuffled and the rows reduced by shuffles, so neither Pᵀ nor the scratch.
        let shuffled = Variant { subgroup: true, ..two_groups };
        assert_eq!(shuffled.shared_bytes(), 4 * (32 * 64 + 64 * 64));
    }

    #[test]
    fn over_the_binding_limit_is_a_typed_plan_error() {
        // 2·32·4096·128 f32 = 128 MiB per tensor, one byte over a limit one byte smaller.
        let p = Problem::new(Shape::new(2, 32, 4096, 128), DType::F32);
        let caps = AdapterCaps { storage_binding: (128 << 20) - 1, ..lavapipe() };
        match choose(&p, &caps) {
            Err(Error::OverDeviceLimit { resource, needed, allowed, .. }) => {
                assert!(resource.contains("storage buffer binding of q"), "{resource}");
                assert_eq!((needed, allowed), (128 << 20, (128 << 20) - 1));
            }
            other => panic!("expected OverDeviceLimit, got {other:?}"),
        }
        assert!(choose(&p, &lavapipe()).is_ok());
    }

    #[test]
    fn too_little_workgroup_memory_is_a_typed_error() {
        let p = Problem::new(Shape::new(1, 1, 10, 256), DType::F32);
        let caps = AdapterCaps { workgroup_storage: 8 * 1024, ..lavapipe() };
        assert!(matches!(
            choose(&p, &caps),
            Err(Error::OverDeviceLimit { resource: "workgroup storage (bytes)", .. })
        ));
    }

    #[test]
    fn f16_needs_shader_f16_and_big_head_dims_are_refused() {
        let p = Problem::new(Shape::new(1, 1, 10, 64), DType::F16);
        let caps = AdapterCaps { f16: false, ..lavapipe() };
        assert!(matches!(choose(&p, &caps), Err(Error::UnsupportedDType { .. })));
        assert_eq!(choose(&p, &lavapipe()).unwrap().variant.ty, KernelType::F16);
        let p = Problem::new(Shape::new(1, 1, 10, 257), DType::F32);
        assert!(matches!(choose(&p, &lavapipe()), Err(Error::UnsupportedHeadDim { .. })));
    }

    #[test]
    fn many_heads_spill_into_grid_z() {
        let p = Problem::new(Shape::new(70000, 1, 4, 32), DType::F32);
        let caps = AdapterCaps { storage_binding: 1 << 40, ..lavapipe() };
        let c = choose(&p, &caps).unwrap();
        assert_eq!(c.launch.grid, [1, 65535, 2]);
    }

    #[test]
    fn cooperative_matrices_take_f16_where_opened() {
        let caps = AdapterCaps {
            workgroup_storage: 48 * 1024,
            subgroup_min: Some(32),
            coop_f16: true,
            ..lavapipe()
        };
        let pick =
            |d: usize, dtype| choose(&Problem::new(Shape::new(1, 2, 1000, d), dtype), &caps).unwrap().variant;
        let v = pick(128, DType::F16);
        assert!(v.kernel == Kernel::Coop && v.block_m() == 16 && v.block_n() == 16, "{}", v.name());
        // Workgroup memory does not grow with the head dim (K and V come straight from the
        // buffers): S and P of 16 rows by 16 keys, and the flags.
        assert_eq!(pick(256, DType::F16).name(), "flash_f16_d256_m16n16_c256_full_sg_coop");
        assert_eq!(pick(256, DType::F16).shared_bytes(), 16 * 16 * 6 + 16);
        // f32 and bf16 keep the FMA kernel; so does f16 where the device was not opened for them.
        assert!(pick(128, DType::F32).kernel == Kernel::Fma && pick(128, DType::Bf16).kernel == Kernel::Fma);
        let plain = AdapterCaps { coop_f16: false, ..caps.clone() };
        let f16 = Problem::new(Shape::new(1, 2, 1000, 128), DType::F16);
        assert_eq!(choose(&f16, &plain).unwrap().variant.kernel, Kernel::Fma);
    }

    /// Windows, soft-caps and ALiBi take the FMA kernel's usual shapes with the features on
    /// (never the cooperative-matrix kernel), named by them, and so do packed or paged sequences;
    /// a window's rows must fit the kernel's i32 arithmetic.
    #[test]
    fn score_features_take_the_fma_shapes() {
        let caps = AdapterCaps {
            workgroup_storage: 48 * 1024,
            subgroup_min: Some(32),
            coop_f16: true,
            ..lavapipe()
        };
        let base = Problem::new(Shape::new(1, 2, 1000, 128), DType::F16);
        assert_eq!(choose(&base, &caps).unwrap().variant.kernel, Kernel::Coop);
        for (p, suffix) in [
            (base.with_window(Some(64), Some(0)), "_window_"),
            (base.with_softcap(30.0), "_cap"),
            (base.causal().with_alibi(attn_core::Alibi::PerHead), "_alibi"),
        ] {
            let c = choose(&p, &caps).unwrap();
            let v = c.variant;
            assert!(v.kernel == Kernel::Fma && v.name().contains(suffix), "{}", v.name());
            // The same shape as the plain problem's on the FMA kernel.
            let plain = AdapterCaps { coop_f16: false, ..caps.clone() };
            let mask = if p.is_causal() { base.causal() } else { base };
            let w = choose(&mask, &plain).unwrap().variant;
            assert_eq!(Variant { window: false, softcap: false, alibi: false, ..v }, w);
            assert!(
                c.notes.iter().any(|n| n.contains("sliding window")
                    || n.contains("soft-capped")
                    || n.contains("ALiBi"))
            );
        }
        for cap in [1e-31, 2e30] {
            let p = base.with_softcap(cap);
            assert!(matches!(choose(&p, &caps), Err(Error::Unsupported { .. })), "{cap}");
        }
        let long = Shape { seq_q: WINDOW_MAX_ROWS, seq_k: 1, ..Shape::new(1, 1, 1, 32) };
        let p = Problem::new(long, DType::F32).with_window(Some(4), Some(0));
        assert!(matches!(choose(&p, &caps), Err(Error::Unsupported { .. })));
        // Packed or paged sequences: the same, with the sequence lengths read by the kernel.
        let paged = base.with_batching(attn_core::Batching {
            kv: attn_core::KvRows::Paged { page_size: 256, pages: 4, pages_per_seq: 4 },
            keys_used: true,
            ..Default::default()
        });
        let v = choose(&paged, &caps).unwrap().variant;
        assert!(v.kernel == Kernel::Fma && v.seq_lens && v.name().ends_with("_vl"), "{}", v.name());
    }

    #[test]
    fn narrow_subgroups_use_workgroup_memory() {
        let p = Problem::new(Shape::new(1, 1, 10, 64), DType::F32);
        let caps = AdapterCaps { subgroup_min: Some(4), ..lavapipe() };
        assert!(!choose(&p, &caps).unwrap().variant.subgroup);
    }
}
