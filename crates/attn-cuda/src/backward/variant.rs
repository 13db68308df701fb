//! One specialisation of the backward: `kernels/flash_bwd.cu` (the pre-pass, dQ's conversion and
//! the Ampere/Ada family's main pass) and, for the Hopper family, `kernels/flash_bwd_sm90.cu`'s
//! main pass; their tiles, shared memory, launches and the NVRTC requests that compile them.

use crate::compile::{Arch, CompileRequest};
use attn_core::{DType, Launch, Problem};

/// The kernel source, compiled at run time for the device's exact architecture.
pub const SOURCE: &str = include_str!("../../kernels/flash_bwd.cu");
/// The Hopper family's main pass, compiled for sm_90a.
pub const SOURCE_SM90: &str = include_str!("../../kernels/flash_bwd_sm90.cu");

/// The headers the sources include, by name (the Hopper one adds its generated wgmma wrappers).
pub const HEADERS: &[(&str, &str)] = &[
    ("mma_sm80.cuh", include_str!("../../kernels/mma_sm80.cuh")),
    ("flash_bwd_common.cuh", include_str!("../../kernels/flash_bwd_common.cuh")),
    ("sm90.cuh", include_str!("../../kernels/sm90.cuh")),
];

/// Keys per CTA of the Ampere/Ada main pass (`BN` in `flash_bwd.cu`: 16 per warp, 4 warps).
pub const BLOCK_N: usize = 64;
/// Query rows per step of the Ampere/Ada main pass (`BM`), and the blocks the deterministic
/// mode's counters are laid out by (the Hopper family's blocks are whole multiples of it).
pub const BLOCK_M: usize = 64;
/// Threads per block of each of the three kernels of the Ampere/Ada family.
pub const THREADS: u32 = 128;
/// Keys per CTA of the Hopper main pass (`BN` in `flash_bwd_sm90.cu`: 64 per MMA warpgroup; at
/// D=256 the two warpgroups share 64 keys and split the columns).
pub const SM90_BLOCK_N: usize = 128;
/// Columns of dK, dV and dQ one Hopper MMA warpgroup owns at most (`DC`): D=256 splits them.
const SM90_MAX_COLUMNS: usize = 128;
/// Threads of the Hopper main pass: two MMA warpgroups and the producer's.
pub const SM90_THREADS: u32 = 384;
/// Registers a thread of the Hopper main pass's three warpgroups share after `setmaxnreg`, the
/// producer's ([`Form::producer_registers`]) and the two MMA warpgroups': what the launch gives
/// the CTA, 384 threads at 168 registers (64512, the forward's `REGISTER_POOL`), over 128
/// threads. `setmaxnreg.inc` waits for registers free in the CTA's own allocation, so a split
/// over 504 hangs every launch (the joined parts' 48 + 2 x 232 did).
const SM90_REGISTERS_PER_LANE: u32 = crate::hopper::variant::REGISTER_POOL / 128;
/// Copies of the f32 dQ accumulator in the deterministic mode (`ATTN_CUDA_BWD_DQ_COPIES`): the key
/// blocks meeting a query block take them in turn, so each waits for the one this many above it
/// rather than the next (`dq_turn_of` in `flash_bwd_common.cuh`). Two were 2.6-10% slower under a
/// causal mask at D=128 on the H200 and at most 2.7% faster without one (docs/experiments.md).
pub const DETERMINISTIC_DQ_COPIES: usize = 1;
/// The order of the Hopper main pass's walks over the query blocks (`ATTN_CUDA_BWD_WALK`): each key
/// block from the first query block (`Aligned`), or, where every key block meets every query
/// block, key block n from query block n, wrapping round (`Rotated`), so that the sequence's key
/// blocks add to different query blocks' dQ at any step, and in the deterministic mode each takes
/// its turn a step after the one before it rather than at the end of a chain from the last key
/// block (`Work` in `kernels/flash_bwd_sm90.cu`). The deterministic mode rotates a sequence's walks
/// only where all of its key blocks fit on the GPU at once ([`Walk::rotation_limit`]), each
/// sequence by its own length, so that its bits do not depend on the others of its batch. The
/// Ampere/Ada family's main pass always walks aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    /// Every key block from the first query block it meets.
    Aligned,
    /// Key block n from query block n where every key block meets every query block.
    Rotated,
}

impl Walk {
    /// The walk a plan takes when the knob is unset: rotated in the deterministic mode (on the
    /// H200 14-25% faster without a mask at S=1k-4k, 7-17% at 8k; unchanged under a causal mask,
    /// where nothing rotates), aligned in the default mode (rotated was 0-2% slower there):
    /// `bench/results/h200-backward-walk.json`.
    pub fn default_for(deterministic: bool) -> Walk {
        match deterministic {
            true => Walk::Rotated,
            false => Walk::Aligned,
        }
    }

    /// The most key blocks a sequence may have for its walks to rotate, on a GPU of `sm_count`
    /// SMs (as the device reports them); 0: none rotates. In the deterministic mode a key block
    /// of a rotated walk waits for others of its sequence launched after it, so all of them must
    /// be resident at once (at least one CTA an SM). The main pass tests each sequence against it,
    /// so a sequence's deterministic bits depend on its own length, not on its batch's longest
    /// (they do on the SM count: a GPU of fewer SMs walks aligned sooner).
    pub fn rotation_limit(self, deterministic: bool, sm_count: usize) -> usize {
        match (self, deterministic) {
            (Walk::Aligned, _) => 0,
            (Walk::Rotated, true) => sm_count,
            (Walk::Rotated, false) => usize::MAX,
        }
    }
}
/// The trace of a traced Hopper build ([`Form::trace`]), per CTA: `TRACE_ROWS` rows (the MMA
/// warpgroups, the producer, the two writers, the CTA) of `TRACE_SLOTS` 64-bit words, as the
/// same constants in `kernels/flash_bwd_sm90.cu` lay it out.
pub const TRACE_ROWS: usize = 6;
/// See [`TRACE_ROWS`].
pub const TRACE_SLOTS: usize = 15;
/// See [`TRACE_ROWS`].
pub const TRACE_WORDS_PER_CTA: usize = TRACE_ROWS * TRACE_SLOTS;

/// How the Hopper main pass adds each step's dQ parts to the f32 accumulator (the first part of
/// `ATTN_CUDA_SM90_BWD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DqAdd {
    /// The MMA warpgroups hand their parts to the writer warps through shared memory, whose bulk
    /// reduce-adds add them a row at a time (64 of 256 bytes a part).
    #[default]
    Writers,
    /// At D=128, where the warpgroups split dQ's columns: their two parts are the halves of one
    /// buffer of whole rows, and each writer adds 32 rows of 512 bytes of both (`ATTN_DQ_JOINED`),
    /// half the bulk reduce-adds; the accumulator stays row-major. Elsewhere `Writers`.
    Joined,
    /// The writers add each part in one bulk reduce-add of 16 KiB (`ATTN_DQ_PLANES`), the
    /// accumulator laid out in planes of 64 columns that the row passes read too
    /// (`flash_bwd_common.cuh`'s `dq_at`).
    Planes,
    /// The planes with two part buffers a warpgroup (`ATTN_DQ_BUFFERS=2`): an MMA warpgroup puts
    /// a step's part in one while its writer adds the last from the other, rather than waiting
    /// for it to have been read. D=128 only (at D=64 the buffers do not fit); elsewhere `Planes`.
    /// Not the deterministic mode's default ([`Variant::mode_form`]).
    PlanesTwoBuffers,
    /// The MMA warpgroups add their parts themselves by 8-byte reductions (`ATTN_DQ_RED`), the
    /// writers idle. Always so at D=256 (no shared memory is left for the parts).
    Reductions,
}

impl DqAdd {
    /// Every choice, with its name in `ATTN_CUDA_SM90_BWD` and in a variant's name.
    pub const ALL: [(DqAdd, &'static str); 5] = [
        (DqAdd::Writers, "writers"),
        (DqAdd::Joined, "joined"),
        (DqAdd::Planes, "planes"),
        (DqAdd::PlanesTwoBuffers, "planes2"),
        (DqAdd::Reductions, "red"),
    ];

    /// Its name in `ATTN_CUDA_SM90_BWD` and in a variant's name.
    pub fn name(self) -> &'static str {
        DqAdd::ALL.iter().find(|(d, _)| *d == self).map_or("writers", |(_, n)| n)
    }

    /// Whether the accumulator is laid out in planes of 64 columns (`ATTN_DQ_PLANES`), which the
    /// row passes then read too.
    pub fn in_planes(self) -> bool {
        matches!(self, DqAdd::Planes | DqAdd::PlanesTwoBuffers)
    }

    /// Buffers of each MMA warpgroup's part in shared memory, each with its pair of mbarriers
    /// (`ATTN_DQ_BUFFERS`; with reductions the one buffer is empty).
    pub fn part_buffers(self) -> usize {
        match self {
            DqAdd::PlanesTwoBuffers => 2,
            _ => 1,
        }
    }
}

/// How the Hopper main pass is built (`ATTN_CUDA_SM90_BWD`, [`crate::options::SM90_BWD`]); the
/// Ampere/Ada family has no such choices and ignores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Form {
    /// How dQ's parts are added.
    pub dq: DqAdd,
    /// Stages of the Q and dO ring (`ATTN_STAGES`): 2 or 3 (D=256: 2).
    pub stages: u32,
    /// Registers of a producer thread after `setmaxnreg` (TMA issue, the LSE's loads, the dQ
    /// writers); the MMA warpgroups get the rest ([`Form::consumer_registers`]).
    pub producer_registers: u32,
    /// A traced build (`ATTN_TRACE`, asked for by `ATTN_CUDA_SM90_TRACE`): each role's waits
    /// summed in SM cycles, per CTA ([`TRACE_WORDS_PER_CTA`]); a diagnostic, never the default.
    pub trace: bool,
    /// When the MMA warpgroups issue dV's product in a step (`ATTN_DV_ISSUE`).
    pub dv_issue: DvIssue,
}

/// When an MMA warpgroup of the Hopper backward issues dV += Pᵀ dO in a step (its A operand, Pᵀ,
/// is in its registers once the exponentials are done).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DvIssue {
    /// After the barrier that both warpgroups' dSᵀ are in shared memory, with dQ's and dK's.
    #[default]
    AfterBarrier,
    /// Before dSᵀ's stores and the barrier: the tensor pipe has it to run through them. (Before
    /// the wait for dPᵀ's product, on tiles without a masked element, spills at D=64 and 128:
    /// Pᵀ's and dPᵀ's registers live together.)
    BeforeBarrier,
    /// After dSᵀ's stores, before the barrier.
    AfterStores,
}

impl DvIssue {
    /// Every choice, in the order of `ATTN_DV_ISSUE`'s values.
    pub const ALL: [DvIssue; 3] = [DvIssue::AfterBarrier, DvIssue::BeforeBarrier, DvIssue::AfterStores];

    /// The value of `ATTN_DV_ISSUE` and of the knob's `dv<n>`.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl Default for Form {
    /// The base of every head dim's own form ([`Variant::own_form`]): the writer warps a row at
    /// a time, two stages, 40 producer registers (232 each MMA thread), dV issued after the dS barrier.
    fn default() -> Form {
        Form {
            dq: DqAdd::Writers,
            stages: 2,
            producer_registers: 40,
            trace: false,
            dv_issue: DvIssue::default(),
        }
    }
}

impl Form {
    /// The forms `ATTN_CUDA_SM90_BWD` can ask for that CI compiles at every head dim (besides each
    /// head dim's own and each mode's traced build) and `ptx_hashes` prints: dQ by reductions in
    /// two and three stages, dV's issue points, the planes (with one part buffer and two), the
    /// joined parts, traced builds.
    pub fn knob_forms() -> [Form; 13] {
        let (dv1, dv2) = (DvIssue::BeforeBarrier, DvIssue::AfterStores);
        let red = Form { dq: DqAdd::Reductions, ..Form::default() };
        [
            Form::default(),
            red,
            Form { stages: 3, producer_registers: 24, ..red },
            Form { trace: true, ..Form::default() },
            Form { dv_issue: dv1, ..Form::default() },
            Form { dv_issue: dv2, ..Form::default() },
            Form { dq: DqAdd::Planes, ..Form::default() },
            Form { dq: DqAdd::Planes, dv_issue: dv1, ..Form::default() },
            Form { dq: DqAdd::Joined, dv_issue: dv1, ..Form::default() },
            Form { dq: DqAdd::Planes, dv_issue: dv1, trace: true, ..Form::default() },
            Form { dq: DqAdd::Joined, dv_issue: dv1, trace: true, ..Form::default() },
            Form { dq: DqAdd::PlanesTwoBuffers, dv_issue: dv1, ..Form::default() },
            Form { dq: DqAdd::PlanesTwoBuffers, dv_issue: dv1, trace: true, ..Form::default() },
        ]
    }

    /// Registers of an MMA thread after `setmaxnreg`: what the producer leaves, halved, in
    /// multiples of 8 (the instruction's granule): 128 × (40 + 2 × 232) = 64512 by default.
    pub fn consumer_registers(&self) -> u32 {
        (SM90_REGISTERS_PER_LANE - self.producer_registers) / 2 / 8 * 8
    }
}

/// One compiled specialisation of the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// f16 or bf16.
    pub dtype: DType,
    /// Head dimension the kernel is compiled for (`ATTN_D`): 64 or 128, and 256 in the Hopper
    /// family; the problem's own (a multiple of 8 up to it) is a run-time parameter.
    pub head_dim: usize,
    /// The Hopper family's main pass (`flash_bwd_sm90.cu`, sm_90a) instead of the Ampere/Ada one.
    pub hopper: bool,
    /// How the Hopper main pass is built ([`Variant::with_form`]; the default elsewhere).
    pub form: Form,
}

/// The three launches of one backward call, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launches {
    /// `attn_bwd_pre`: D and the zeroed dQ accumulator.
    pub pre: Launch,
    /// `attn_bwd`: dK, dV and dQ's accumulation.
    pub main: Launch,
    /// `attn_bwd_dq`: dQ from its accumulator.
    pub dq: Launch,
}

impl Variant {
    /// The head dims each family's kernels are compiled for: the Hopper family's (`hopper`) or
    /// the Ampere/Ada family's, whose dK and dV of 16 keys a warp by 256 columns would take every
    /// register a thread has.
    pub fn head_dims(hopper: bool) -> &'static [usize] {
        if hopper { &[64, 128, 256] } else { &[64, 128] }
    }

    /// Every variant that ships: each family at each dtype and head dim.
    pub fn all() -> Vec<Variant> {
        [false, true]
            .into_iter()
            .flat_map(|hopper| {
                [DType::F16, DType::Bf16].into_iter().flat_map(move |dtype| {
                    Self::head_dims(hopper).iter().map(move |&head_dim| Variant::new(dtype, head_dim, hopper))
                })
            })
            .collect()
    }

    /// The variant for a problem of `dtype` and head dim `d` in the family `hopper` says, or
    /// `None` past the family's largest (or not a multiple of 8).
    pub fn for_problem(dtype: DType, d: usize, hopper: bool) -> Option<Variant> {
        let head_dim =
            Self::head_dims(hopper).iter().copied().find(|&k| d <= k && d.is_multiple_of(8) && d > 0)?;
        Some(Variant::new(dtype, head_dim, hopper))
    }

    /// The variant of a family at a dtype and kernel head dim, in the head dim's own form
    /// ([`Variant::own_form`]).
    fn new(dtype: DType, head_dim: usize, hopper: bool) -> Variant {
        // D=128: dV's product ahead of the dS barrier, 2-8% faster on the H200 (1% slower in the
        // deterministic mode; 2-3.5% slower at D=64), and dQ's parts in planes with two buffers a
        // warpgroup, 10-22% faster than the writers' rows (docs/experiments.md).
        let form = match head_dim {
            128 => Form { dq: DqAdd::PlanesTwoBuffers, dv_issue: DvIssue::BeforeBarrier, ..Form::default() },
            _ => Form::default(),
        };
        Variant { dtype, head_dim, hopper, form: Form::default() }.with_form(form)
    }

    /// The form this variant's family and head dim take by default: [`Form::default`], but at
    /// D=128 dV issued before the dS barrier and dQ's parts in planes with two buffers, and at
    /// D=256 dQ by reductions.
    pub fn own_form(&self) -> Form {
        Variant::new(self.dtype, self.head_dim, self.hopper).form
    }

    /// The form a call in the mode `deterministic` says runs unless `ATTN_CUDA_SM90_BWD` is set:
    /// the head dim's own, but in the deterministic mode the writers add each part in one bulk
    /// reduce-add from one buffer (`planes`) where they add dQ at all. The writer limits that
    /// mode, waiting its turn and then issuing 64 row adds a step; on the H200 the planes made it
    /// 11-13% faster at D=64 without a mask and 18-38% faster at D=128, and the default mode 1-4%
    /// slower; a second buffer gained nothing there (-1.6% to +0.1% at D=128, and a writer's count
    /// held a step late with it cost more; docs/experiments.md).
    pub fn mode_form(&self, deterministic: bool) -> Form {
        let own = self.own_form();
        match deterministic {
            true => self.with_form(Form { dq: DqAdd::Planes, ..own }).form,
            false => own,
        }
    }

    /// This variant built as `form` says, as far as it can be: the Ampere/Ada family keeps the
    /// default, at D=256 the dQ parts always go by reductions in two stages, and the planes are
    /// the writers' only, the joined parts and two part buffers D=128's. A traced build's
    /// producer warpgroup (the producer's and the writers' warps) takes every register the MMA
    /// warpgroups leave, for its timers (40 where 40 is asked: 504 a lane less 2 x 232).
    pub fn with_form(self, form: Form) -> Variant {
        let form = match (self.hopper, self.splits_columns()) {
            (false, _) => Form::default(),
            (true, false) => match form.dq {
                DqAdd::Joined if self.head_dim != 128 => Form { dq: DqAdd::Writers, ..form },
                DqAdd::PlanesTwoBuffers if self.head_dim != 128 => Form { dq: DqAdd::Planes, ..form },
                _ => form,
            },
            (true, true) => Form { dq: DqAdd::Reductions, stages: 2, ..form },
        };
        let free = SM90_REGISTERS_PER_LANE - 2 * form.consumer_registers();
        let form = if form.trace { Form { producer_registers: free, ..form } } else { form };
        Variant { form, ..self }
    }

    /// Whether the Hopper main pass's MMA warpgroups share their keys and split the columns
    /// (`SPLIT_COLUMNS`: D=256), adding dQ by atomics rather than through the writer warps.
    pub fn splits_columns(&self) -> bool {
        self.hopper && self.head_dim > SM90_MAX_COLUMNS
    }

    /// Keys per CTA of the main pass.
    pub fn block_n(&self) -> usize {
        match (self.hopper, self.splits_columns()) {
            (false, _) => BLOCK_N,
            (true, false) => SM90_BLOCK_N,
            (true, true) => SM90_BLOCK_N / 2,
        }
    }

    /// Query rows per step of the main pass: the Hopper family's 128 at D=64 (its MMA warpgroups
    /// split dQ's rows) and 64 at D=128 and 256 (dK and dV's registers leave room for no more).
    pub fn block_m(&self) -> usize {
        match (self.hopper, self.head_dim) {
            (true, 64) => 128,
            _ => BLOCK_M,
        }
    }

    /// Dynamic shared memory of the main pass. Ampere/Ada: K and V (`BLOCK_N` rows), Q and dO
    /// (`BLOCK_M` rows), dSᵀ (`BLOCK_N × BLOCK_M`), all 16-bit, and the step's LSE and D (f32),
    /// as the pointer arithmetic at the top of `attn_bwd`. Hopper: K and V, the stages of Q and
    /// dO, two dSᵀ buffers, the two warpgroups' f32 dQ parts for the writers (64 rows of 68, of 64
    /// in planes, of 66 joined; two buffers of them in `planes2`; none when they go by reductions),
    /// the stages of LSE and D, the mbarriers and 1024 bytes of slack
    /// for the alignment, as `SMEM_BYTES` in `flash_bwd_sm90.cu`.
    pub fn shared_bytes(&self) -> u32 {
        let (n, m, d) = (self.block_n(), self.block_m(), self.head_dim);
        let stages = self.form.stages as usize;
        let row = match self.form.dq {
            DqAdd::Reductions => 0,
            DqAdd::Writers => 68,
            DqAdd::Planes | DqAdd::PlanesTwoBuffers => 64,
            DqAdd::Joined => 66,
        };
        let buffers = self.form.dq.part_buffers();
        let dq_parts = buffers * 2 * 64 * row * 4;
        let bytes = match self.hopper {
            false => ((2 * n + 2 * m) * d + n * m) * 2 + 2 * m * 4,
            true => {
                (2 * n * d + 2 * stages * m * d + 2 * n * m) * 2
                    + dq_parts
                    + 2 * stages * m * 4
                    + 8 * (1 + 2 * stages + 4 * buffers)
                    + 1024
            }
        };
        bytes as u32
    }

    /// The name of the specialisation.
    pub fn name(&self) -> String {
        let family = if self.hopper { "_sm90" } else { "" };
        let form = match self.form {
            f if f == self.own_form() => String::new(),
            f => format!(
                "_{}_s{}_p{}{}{}",
                f.dq.name(),
                f.stages,
                f.producer_registers,
                match f.dv_issue {
                    DvIssue::AfterBarrier => String::new(),
                    dv => format!("_dv{}", dv.index()),
                },
                if f.trace { "_trace" } else { "" }
            ),
        };
        format!(
            "flash_bwd{family}_{}_d{}_bm{}_bn{}{form}",
            self.dtype,
            self.head_dim,
            self.block_m(),
            self.block_n()
        )
    }

    /// The NVRTC `-D` defines that select it.
    pub fn defines(&self) -> Vec<(String, String)> {
        let mut defines = vec![
            ("ATTN_BF16".into(), u8::from(self.dtype == DType::Bf16).to_string()),
            ("ATTN_D".into(), self.head_dim.to_string()),
        ];
        if self.hopper {
            let f = self.form;
            defines.push(("ATTN_PRODUCER_REGS".into(), f.producer_registers.to_string()));
            defines.push(("ATTN_CONSUMER_REGS".into(), f.consumer_registers().to_string()));
            defines.push(("ATTN_DQ_RED".into(), u8::from(f.dq == DqAdd::Reductions).to_string()));
            defines.push(("ATTN_DQ_PLANES".into(), u8::from(f.dq.in_planes()).to_string()));
            defines.push(("ATTN_DQ_JOINED".into(), u8::from(f.dq == DqAdd::Joined).to_string()));
            defines.push(("ATTN_DQ_BUFFERS".into(), f.dq.part_buffers().to_string()));
            defines.push(("ATTN_STAGES".into(), f.stages.to_string()));
            defines.push(("ATTN_TRACE".into(), u8::from(f.trace).to_string()));
            defines.push(("ATTN_DV_ISSUE".into(), f.dv_issue.index().to_string()));
        }
        defines
    }

    /// The NVRTC request that compiles the pre-pass and dQ's conversion (and the Ampere/Ada main
    /// pass, but where the Hopper main pass's accumulator is in planes) for `arch`.
    pub fn request(&self, arch: Arch) -> CompileRequest {
        let rows = Variant { hopper: false, form: Form::default(), ..*self };
        let (mut name, mut defines) = (rows.name(), rows.defines());
        if self.hopper && self.form.dq.in_planes() {
            name.push_str("_planes");
            defines.push(("ATTN_DQ_PLANES".into(), "1".into()));
        }
        CompileRequest::new(name, SOURCE, arch).headers(HEADERS).defines(defines)
    }

    /// The NVRTC request that compiles the main pass: [`Variant::request`]'s for the Ampere/Ada
    /// family, `flash_bwd_sm90.cu` for sm_90a for the Hopper family.
    pub fn main_request(&self, arch: Arch) -> CompileRequest {
        match self.hopper {
            false => self.request(arch),
            true => CompileRequest::new(self.name(), SOURCE_SM90, Arch::Sm90a)
                .header(
                    "sm90_wgmma.cuh",
                    crate::hopper::wgmma::backward_header(
                        self.dtype,
                        self.block_m(),
                        self.head_dim.min(SM90_MAX_COLUMNS),
                    ),
                )
                .headers(HEADERS)
                .defines(self.defines()),
        }
    }

    /// The main pass's entry function.
    pub fn main_entry(&self) -> &'static str {
        if self.hopper { "attn_bwd_sm90" } else { "attn_bwd" }
    }

    /// Registers one thread of the main pass may use: 255 at 128 threads; with `setmaxnreg` the
    /// cap that 65536 registers over 384 threads give at entry (168), which ptxas allocates to.
    pub fn register_budget(&self) -> u32 {
        let threads = if self.hopper { SM90_THREADS } else { THREADS };
        (65536 / threads / 8 * 8).min(255)
    }

    /// Query rows a block of the row passes takes (`ROW_BLOCK` in `flash_bwd.cu`): a row is D/8
    /// lanes, each a 16-byte chunk of 8 of its elements, in 4 warps.
    pub fn row_block(&self) -> usize {
        THREADS as usize / (self.head_dim / 8)
    }

    /// The launches for `problem`: the main pass one block per (key block, kv head, sequence),
    /// the row passes a block per [`Variant::row_block`] query rows of a (query head, sequence),
    /// over the longest sequence.
    pub fn launches(&self, problem: &Problem) -> Launches {
        let s = problem.shape;
        let rows = Launch {
            grid: [s.seq_q.div_ceil(self.row_block()) as u32, s.heads_q as u32, s.batch as u32],
            block: [THREADS, 1, 1],
            dynamic_shared_bytes: 0,
            static_shared_bytes: 0,
            registers_per_thread: None,
            spill_bytes: None,
        };
        let main = Launch {
            grid: [s.seq_k.div_ceil(self.block_n()) as u32, s.heads_kv as u32, s.batch as u32],
            block: [if self.hopper { SM90_THREADS } else { THREADS }, 1, 1],
            dynamic_shared_bytes: self.shared_bytes(),
            // A traced build's sums (`trace_sums` in `flash_bwd_sm90.cu`).
            static_shared_bytes: if self.form.trace { (TRACE_ROWS * TRACE_SLOTS * 8) as u32 } else { 0 },
            ..rows.clone()
        };
        Launches { pre: rows.clone(), main, dq: rows }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_fits_an_l4_and_head_dims_pick_their_kernel() {
        // An L4 (sm_89) opts in to 99 KiB a block; D=128 takes 72.5 KiB. Hopper: 227 KiB.
        for v in Variant::all() {
            let limit = if v.hopper { 227 * 1024 } else { 99 * 1024 };
            assert!(v.shared_bytes() <= limit, "{}: {} B", v.name(), v.shared_bytes());
        }
        assert_eq!(
            Variant { dtype: DType::Bf16, head_dim: 128, hopper: false, form: Form::default() }
                .shared_bytes(),
            74_240
        );
        // Hopper D=128: K, V 32 KiB each, Q and dO 2 x 16 KiB each, dS^T 2 x 16 KiB (160 KiB), dQ 2 x 17 KiB.
        assert_eq!(
            Variant { dtype: DType::Bf16, head_dim: 128, hopper: true, form: Form::default() }.shared_bytes(),
            163_840 + 34_816 + 1024 + 72 + 1024
        );
        assert_eq!(Variant::for_problem(DType::F16, 40, false).map(|v| v.head_dim), Some(64));
        assert_eq!(
            Variant::for_problem(DType::F16, 72, true).map(|v| (v.head_dim, v.block_m())),
            Some((128, 64))
        );
        assert_eq!(Variant::for_problem(DType::F16, 64, true).map(|v| v.block_m()), Some(128));
        assert_eq!(Variant::for_problem(DType::F16, 136, false), None);
        // Hopper D=256: 64 keys shared by the warpgroups; K, V 32 KiB each, Q and dO 2 x 32 KiB
        // each, dS^T 2 x 8 KiB, no dQ parts.
        let wide = Variant::for_problem(DType::Bf16, 136, true).unwrap();
        assert_eq!(
            (wide.head_dim, wide.block_m(), wide.block_n(), wide.splits_columns()),
            (256, 64, 64, true)
        );
        assert_eq!(wide.shared_bytes(), 212_992 + 1024 + 72 + 1024);
        // The forms: three stages fit at D=128 once dQ goes by reductions, not beside the writers'
        // parts; D=256 keeps its reductions in two stages whatever is asked; names say the form.
        let own128 = Variant::for_problem(DType::Bf16, 128, true).unwrap();
        assert_eq!((own128.form.dq, own128.form.dv_issue), (DqAdd::PlanesTwoBuffers, DvIssue::BeforeBarrier));
        assert_eq!(own128.name(), "flash_bwd_sm90_bf16_d128_bm64_bn128");
        let d128 = own128.with_form(Form { dq: DqAdd::Writers, ..own128.form });
        assert_eq!(d128.name(), "flash_bwd_sm90_bf16_d128_bm64_bn128_writers_s2_p40_dv1");
        let red3 = Form { dq: DqAdd::Reductions, stages: 3, producer_registers: 24, ..Form::default() };
        assert_eq!(d128.with_form(red3).shared_bytes(), 196_608 + 1536 + 88 + 1024);
        assert!(d128.with_form(Form { stages: 3, ..Form::default() }).shared_bytes() > 227 * 1024);
        assert_eq!(d128.with_form(red3).name(), "flash_bwd_sm90_bf16_d128_bm64_bn128_red_s3_p24");
        // The planes: 16 KiB a part (no padding), the writers' only, and the row passes read them.
        let planes = d128.with_form(Form { dq: DqAdd::Planes, ..d128.form });
        assert_eq!(planes.shared_bytes(), d128.shared_bytes() - 2 * 64 * 4 * 4);
        assert_eq!(planes.name(), "flash_bwd_sm90_bf16_d128_bm64_bn128_planes_s2_p40_dv1");
        assert_eq!(d128.with_form(red3).form.dq, DqAdd::Reductions);
        assert!(planes.request(Arch::Sm90a).key() != d128.request(Arch::Sm90a).key());
        // Joined parts: whole rows of 2 x 64 + 4 floats, D=128's writers only.
        let joined = d128.with_form(Form { dq: DqAdd::Joined, ..d128.form });
        assert_eq!(joined.shared_bytes(), d128.shared_bytes() - 2 * 64 * 2 * 4);
        assert_eq!(joined.name(), "flash_bwd_sm90_bf16_d128_bm64_bn128_joined_s2_p40_dv1");
        // Two buffers of planes: 32 KiB and four mbarriers more, within the 227 KiB; D=128 only.
        let twice = d128.with_form(Form { dq: DqAdd::PlanesTwoBuffers, ..d128.form });
        assert_eq!(twice.shared_bytes(), planes.shared_bytes() + 2 * 64 * 64 * 4 + 4 * 8);
        let traced_sums = (TRACE_ROWS * TRACE_SLOTS * 8) as u32;
        assert!(twice.shared_bytes() + traced_sums <= 227 * 1024, "{}", twice.shared_bytes());
        assert_eq!(
            twice.request(Arch::Sm90a).key(),
            planes.request(Arch::Sm90a).key(),
            "the same row passes"
        );
        let d64 = Variant::for_problem(DType::Bf16, 64, true).unwrap();
        assert_eq!(d64.with_form(Form { dq: DqAdd::Joined, ..d64.form }).form.dq, DqAdd::Writers);
        assert_eq!(d64.with_form(Form { dq: DqAdd::PlanesTwoBuffers, ..d64.form }).form.dq, DqAdd::Planes);
        assert_eq!(wide.with_form(Form { dq: DqAdd::Joined, ..wide.form }).form.dq, DqAdd::Reductions);
        assert_eq!(wide.with_form(red3).form, Form { stages: 2, ..red3 });
        assert_eq!(wide.name(), "flash_bwd_sm90_bf16_d256_bm64_bn64");
        assert_eq!(red3.consumer_registers(), 240);
        assert_eq!(Form::default().consumer_registers(), 232);
        assert_eq!(Variant::for_problem(DType::F16, 264, true), None);
        assert_eq!(Variant::for_problem(DType::F16, 60, false), None);
    }

    #[test]
    fn row_passes_take_a_16_byte_chunk_a_lane() {
        let rows = |d, hopper| Variant::for_problem(DType::Bf16, d, hopper).map(|v| v.row_block());
        assert_eq!((rows(64, true), rows(128, true), rows(256, true)), (Some(16), Some(8), Some(4)));
        assert_eq!(rows(128, false), Some(8));
    }

    #[test]
    fn deterministic_walks_rotate_only_where_a_sequence_fits_the_gpu() {
        let rotated = Walk::default_for(true);
        assert_eq!(rotated, Walk::Rotated);
        assert_eq!(
            rotated.rotation_limit(true, 132),
            132,
            "133 key blocks: one would wait for one never resident"
        );
        assert_eq!(rotated.rotation_limit(false, 132), usize::MAX, "the default mode waits for nobody");
        assert_eq!(Walk::default_for(false).rotation_limit(false, 132), 0);
    }

    /// `setmaxnreg.inc` waits for registers free in the CTA's allocation at launch (384 threads at
    /// 168): a split over it hangs every launch, as the joined parts' 48 + 2 x 232 did.
    #[test]
    fn every_register_split_fits_what_the_launch_allocates() {
        let launch = 65536 / SM90_THREADS / 8 * 8;
        assert_eq!(3 * launch, SM90_REGISTERS_PER_LANE);
        for v in Variant::all().into_iter().filter(|v| v.hopper) {
            let traced = [false, true].map(|d| Form { trace: true, ..v.mode_form(d) });
            for form in Form::knob_forms().into_iter().chain(traced).map(|f| v.with_form(f).form) {
                let split = form.producer_registers + 2 * form.consumer_registers();
                assert!(split <= 3 * launch, "{}: {split} registers a lane", v.with_form(form).name());
                assert!(form.consumer_registers() >= launch && form.producer_registers <= launch);
            }
        }
    }

    #[test]
    fn a_traced_build_takes_the_registers_the_mma_warps_leave() {
        let v = Variant::for_problem(DType::Bf16, 128, true).expect("a Hopper variant");
        let traced = v.with_form(Form { trace: true, ..v.own_form() }).form;
        assert_eq!((traced.producer_registers, traced.consumer_registers()), (40, 232));
        assert_eq!(v.with_form(v.own_form()).form.producer_registers, 40);
    }
}
