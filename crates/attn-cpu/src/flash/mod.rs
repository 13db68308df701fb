//! The fast CPU path: tiled FlashAttention with an online softmax, parallel over
//! (batch, head, query block).
//!
//! Keys and values are first widened to f32 and packed once per (batch, kv head) ([`pack`]).
//! Then each task holds a block of `block_m` query rows and walks the key/value tiles it can see,
//! `block_n` keys at a time: `S = Q·Kᵀ` by a register-blocked micro-kernel ([`gemm`]), masking,
//! the online-softmax update ([`attn_core::softmax::RowStats`]), then `O = diag(α)·O + P·V` by the
//! same micro-kernel. Extra memory is the packed K/V (O(S), at most [`Flash::PACK_BUDGET`] bytes
//! beyond one head's) plus one tile per thread, never O(S²). Accumulation is f32; the output is
//! rounded once.
//!
//! The inner loops are plain Rust compiled three times (AVX-512, AVX2+FMA, portable) and chosen
//! at run time, so one binary runs well on any x86-64. [`Flash::with_isa`] (`ATTN_CPU_ISA`)
//! forces a variant (for tests and comparisons).

mod backward;
mod decode;
mod exp;
mod gemm;
mod pack;
mod tile;

use attn_core::{
    Attention, Availability, BackwardOptions, DeviceKind, Element, Error, Execution, GradInputs, Gradients,
    HostPrepared, Inputs, Outputs, Payload, Plan, Prepared, Problem, Result, SeqMap, Tiles,
};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use pack::PackDims;
use rayon::prelude::*;
use std::sync::Mutex;
use tile::Scratch;

/// An element type the CPU path can widen to f32 and narrow back, a row at a time.
pub trait CpuElement: Element {
    /// `dst[i] = src[i]` as f32.
    fn widen(src: &[Self], dst: &mut [f32]);
    /// `dst[i] = src[i]` rounded to nearest even.
    fn narrow(src: &[f32], dst: &mut [Self]);
    /// The slice itself where the element type is already `f32` (nothing to widen).
    #[inline(always)]
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
}

impl CpuElement for f32 {
    #[inline(always)]
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn as_f32(src: &[f32]) -> Option<&[f32]> {
        Some(src)
    }
}

impl CpuElement for f16 {
    #[inline(always)]
    fn widen(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
}

impl CpuElement for bf16 {
    #[inline(always)]
    fn widen(src: &[bf16], dst: &mut [f32]) {
        // bf16 is the top half of an f32: a shift, which vectorises.
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [bf16]) {
        dst.convert_from_f32_slice(src);
    }
}

/// The instruction set the inner loops run with, and the micro-kernel shape that fits its
/// registers (`MR` rows × `NR` columns of accumulators).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// 32 × 512-bit registers: an 8 × 32 block is 16 of them.
    Avx512,
    /// 16 × 256-bit registers: a 4 × 16 block is 8 of them, leaving room for loads.
    Avx2,
    /// Whatever the compiler's baseline target gives (SSE2 on x86-64, NEON on aarch64).
    Portable,
}

impl Isa {
    /// The best variant this CPU supports.
    pub fn best() -> Isa {
        Self::supported().into_iter().next().unwrap_or(Isa::Portable)
    }

    /// The variants this CPU can run, best first.
    pub fn supported() -> Vec<Isa> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("fma")
            {
                v.push(Isa::Avx512);
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2);
            }
        }
        v.push(Isa::Portable);
        v
    }

    /// Name for plans and `ATTN_CPU_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    /// Micro-kernel height: `block_m` must be a multiple of it.
    fn mr(self) -> usize {
        match self {
            Isa::Avx512 => 8,
            Isa::Avx2 | Isa::Portable => 4,
        }
    }

    /// Micro-kernel width: `block_n` must be a multiple of it, `head_dim` is padded to one.
    fn nr(self) -> usize {
        match self {
            Isa::Avx512 => 32,
            Isa::Avx2 => 16,
            Isa::Portable => 8,
        }
    }
}

/// The fast CPU backend. `Flash::new()` uses rayon's global pool; [`Flash::with_threads`] makes
/// its own pool of `n` threads.
pub struct Flash {
    pool: Option<rayon::ThreadPool>,
    isa: Option<Isa>,
    tiles: Option<(usize, usize)>,
    /// Packed K and V, kept between calls so that repeated calls do not page-fault fresh
    /// buffers in. Held for the duration of a call: concurrent calls on one `Flash` take turns.
    packed: Mutex<(Vec<f32>, Vec<f32>)>,
}

impl Default for Flash {
    fn default() -> Self {
        Self::new()
    }
}

impl Flash {
    /// Query rows per task. Each task streams all the K/V rows it sees, so taller blocks read
    /// less per flop: 128 measured 10-20% faster than 64 on a 2-core Zen 4 (`attn run`, D=128,
    /// S=2048). The plan drops to [`Flash::BLOCK_M_SMALL`] when that leaves too few tasks.
    pub const BLOCK_M: usize = 128;
    /// Query rows per task when `BLOCK_M` would give fewer than [`Flash::TASKS_PER_THREAD`]
    /// tasks per thread (short sequences, few heads).
    pub const BLOCK_M_SMALL: usize = 64;
    /// Tasks per thread below which the plan uses smaller blocks (equal tasks: no mask).
    pub const TASKS_PER_THREAD: usize = 4;
    /// The same under a causal mask, whose tasks differ in length and balance only in numbers:
    /// on 16 Xeon cores (B=1, H=16, f32, S=512 and 1024) 64-row blocks were 7-17% faster than
    /// 128-row ones with a causal mask and within 2% without
    /// (docs/experiments.md, attn-cpu).
    pub const TASKS_PER_THREAD_CAUSAL: usize = 16;
    /// Keys per tile; a multiple of every ISA's `NR`.
    pub const BLOCK_N: usize = 64;
    /// Bytes of packed K/V per pass: heads are processed in groups that fit (one head at least).
    pub const PACK_BUDGET: usize = 512 << 20;

    /// The fewest tasks per thread that keep 128-row blocks (see [`Flash::TASKS_PER_THREAD`]).
    fn tasks_per_thread(&self, problem: &Problem) -> usize {
        if problem.is_causal() { Self::TASKS_PER_THREAD_CAUSAL } else { Self::TASKS_PER_THREAD }
    }

    /// On rayon's global thread pool.
    pub fn new() -> Self {
        Flash { pool: None, isa: None, tiles: None, packed: Mutex::new((Vec::new(), Vec::new())) }
    }

    /// On a pool of its own with `threads` threads.
    pub fn with_threads(threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| Error::backend("cpu-flash", e))?;
        Ok(Flash { pool: Some(pool), ..Self::new() })
    }

    /// Uses the inner loops compiled for `isa` instead of the best detected one (to compare the
    /// variants, and to test each of them on one machine).
    pub fn with_isa(mut self, isa: Isa) -> Result<Self> {
        if !Isa::supported().contains(&isa) {
            return Err(Error::Unsupported {
                backend: "cpu-flash".into(),
                what: format!("this CPU cannot run the {} variant", isa.name()),
            });
        }
        self.isa = Some(isa);
        Ok(self)
    }

    /// Uses `block_m × block_n` tiles instead of the planner's choice (for tuning; the plan
    /// rejects sizes the micro-kernel cannot tile).
    pub fn with_tiles(mut self, block_m: usize, block_n: usize) -> Self {
        self.tiles = Some((block_m, block_n));
        self
    }

    /// With the settings `ATTN_CPU_ISA` and `ATTN_CPU_TILES` name ([`crate::Options`]), on
    /// rayon's global pool.
    pub fn from_env() -> Result<Self> {
        Self::with_options(crate::Options::from_env()?)
    }

    /// With `options`, on rayon's global pool.
    pub fn with_options(options: crate::Options) -> Result<Self> {
        let mut flash = Self::new();
        if let Some(isa) = options.isa {
            flash = flash.with_isa(isa)?;
        }
        if let Some((block_m, block_n)) = options.tiles {
            flash = flash.with_tiles(block_m, block_n);
        }
        Ok(flash)
    }

    fn isa(&self) -> Isa {
        self.isa.unwrap_or_else(Isa::best)
    }

    /// The instruction set `plan` names, where this CPU runs it.
    fn isa_of(&self, plan: &Plan) -> Result<Isa> {
        Isa::supported()
            .into_iter()
            .find(|i| matches!(&plan.execution, Execution::Cpu { isa, .. } if isa == i.name()))
            .ok_or_else(|| Error::PlanMismatch {
                what: format!("the plan's instruction set is not one this CPU runs: {:?}", plan.execution),
            })
    }

    fn threads(&self) -> usize {
        self.pool.as_ref().map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }

    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    /// Computes straight into `outputs` (no staging copy). `plan` must be this backend's.
    pub fn run_into(&self, plan: &Plan, inputs: &Inputs<'_>, mut outputs: Outputs<'_>) -> Result<()> {
        let problem = &plan.problem;
        plan.check_for(self.name(), problem)?;
        problem.check_inputs(inputs)?;
        problem.check_outputs(&outputs)?;
        let map = problem.seq_map(inputs.extras)?;
        // The plan decides what runs: the instruction set it names, not one detected anew.
        let isa = self.isa_of(plan)?;
        macro_rules! typed {
            ($t:ty) => {{
                let dp = problem.shape.head_dim.div_ceil(isa.nr()) * isa.nr();
                let v_in: &[$t] = inputs.v.typed().unwrap();
                // f32 values whose rows are already a whole number of kernel widths are read
                // in place by `O += P·V`: only Kᵀ is packed. Not from a paged cache, whose
                // tiles may cross pages.
                let paged = matches!(problem.batching.kv, attn_core::KvRows::Paged { .. });
                let v_direct = <$t>::as_f32(v_in).filter(|_| dp == problem.shape.head_dim && !paged);
                let ctx = Ctx::<$t> {
                    problem,
                    map,
                    q: inputs.q.typed().unwrap(),
                    k: inputs.k.typed().unwrap(),
                    v: v_in,
                    v_direct,
                    out: RowWriter::new(outputs.o.reborrow().typed::<$t>().unwrap()),
                    lse: outputs.lse.as_deref_mut().map(RowWriter::new),
                    block_m: plan.tiles.block_m,
                    block_n: plan.tiles.block_n,
                    dp,
                    pack: PackDims::new(problem, plan.tiles.block_n, dp, v_direct.is_some()),
                };
                match plan.payload.get::<Path>() {
                    Some(Path::Decode) => self.install(|| run_decode(&ctx, isa, self.threads())),
                    _ => {
                        let mut packed = self.packed.lock().unwrap_or_else(|e| e.into_inner());
                        let (kt, v) = &mut *packed;
                        self.install(|| run_all(&ctx, isa, kt, v));
                    }
                }
            }};
        }
        match problem.dtype {
            attn_core::DType::F32 => typed!(f32),
            attn_core::DType::F16 => typed!(f16),
            attn_core::DType::Bf16 => typed!(bf16),
        }
        Ok(())
    }
}

/// What every task of one call shares.
pub(crate) struct Ctx<'a, T> {
    problem: &'a Problem,
    /// Each sequence's lengths and each row's address.
    map: SeqMap<'a>,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    /// `v` itself when it is read in place (see `run_into`); `None` when `V` is packed.
    v_direct: Option<&'a [f32]>,
    out: RowWriter<T>,
    lse: Option<RowWriter<f32>>,
    block_m: usize,
    block_n: usize,
    dp: usize,
    pack: PackDims,
}

/// One pass over a group of kv heads whose K and V are packed.
pub(crate) struct Pass<'p> {
    /// The kv heads (`b · heads_kv + g`) packed in `kt` and `vp`.
    pairs: std::ops::Range<usize>,
    kt: &'p [f32],
    vp: &'p [f32],
    heads_kv: usize,
    pack: PackDims,
}

impl Pass<'_> {
    /// Packed `Kᵀ` and `V` tiles of kv head `g` in batch `b` (which this pass holds).
    #[inline(always)]
    fn packed(&self, b: usize, g: usize) -> (&[f32], &[f32]) {
        let i = b * self.heads_kv + g - self.pairs.start;
        let (kn, vn) = (self.pack.kt_per_head, self.pack.v_per_head);
        (&self.kt[i * kn..(i + 1) * kn], &self.vp[i * vn..(i + 1) * vn])
    }
}

/// One task: query block `q_block` of head `h` in batch `b`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Task {
    b: usize,
    h: usize,
    q_block: usize,
}

/// Lets parallel tasks write their own disjoint rows of one output slice.
pub(crate) struct RowWriter<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: a RowWriter is only used to write disjoint ranges from different threads (see `slice`).
unsafe impl<T: Send> Send for RowWriter<T> {}
unsafe impl<T: Send> Sync for RowWriter<T> {}

impl<T> RowWriter<T> {
    fn new(slice: &mut [T]) -> Self {
        RowWriter { ptr: slice.as_mut_ptr(), len: slice.len() }
    }

    /// # Safety
    /// No two live slices from one writer may overlap.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, offset: usize, len: usize) -> &mut [T] {
        assert!(offset + len <= self.len, "row {offset}..{} outside the output ({})", offset + len, self.len);
        // SAFETY: in bounds (asserted); exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

/// Which loops a plan runs, recorded in its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// Packed K/V, a task per (sequence, query head, query block).
    Prefill,
    /// A task per (sequence, kv head, key range), K/V read in place ([`decode`]).
    Decode,
}

/// The decode path: every split in parallel, then the merge.
fn run_decode<T: CpuElement>(ctx: &Ctx<'_, T>, isa: Isa, threads: usize) {
    let splits = decode::splits(ctx, threads);
    let parts: Vec<decode::Part> = splits
        .par_iter()
        .map(|split| match isa {
            // SAFETY: `isa` came from Isa::supported, which checked the CPU has these features.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { decode_avx512(ctx, split) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { decode_avx2(ctx, split) },
            _ => decode::run_split::<T, gemm::Portable>(ctx, split),
        })
        .collect();
    decode::write(ctx, &splits, parts);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
fn decode_avx512<T: CpuElement>(ctx: &Ctx<'_, T>, split: &decode::Split) -> decode::Part {
    decode::run_split::<T, gemm::Avx512>(ctx, split)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn decode_avx2<T: CpuElement>(ctx: &Ctx<'_, T>, split: &decode::Split) -> decode::Part {
    decode::run_split::<T, gemm::Avx2>(ctx, split)
}

/// Packs K/V for as many kv heads as fit [`Flash::PACK_BUDGET`], runs their tasks, and repeats.
fn run_all<T: CpuElement>(ctx: &Ctx<'_, T>, isa: Isa, kt: &mut Vec<f32>, vp: &mut Vec<f32>) {
    let s = ctx.problem.shape;
    let per_head = (ctx.pack.kt_per_head + ctx.pack.v_per_head) * 4;
    let heads_per_pass = (Flash::PACK_BUDGET / per_head).clamp(1, s.batch * s.heads_kv);
    let (kt_len, v_len) = (heads_per_pass * ctx.pack.kt_per_head, heads_per_pass * ctx.pack.v_per_head);
    if kt.len() < kt_len || vp.len() < v_len {
        *kt = vec![0.0; kt_len];
        *vp = vec![0.0; v_len];
    }
    let blocks = s.seq_q.div_ceil(ctx.block_m);
    let group = s.group_size();
    for first in (0..s.batch * s.heads_kv).step_by(heads_per_pass) {
        let pairs = first..(first + heads_per_pass).min(s.batch * s.heads_kv);
        pack::pack(&ctx.map, ctx.k, ctx.v, pairs.clone(), (ctx.block_n, ctx.dp, ctx.pack), kt, vp);
        let pass = Pass { pairs: pairs.clone(), kt, vp, heads_kv: s.heads_kv, pack: ctx.pack };
        // Last query blocks first: under a causal mask they see the most keys, and starting the
        // longest tasks first keeps all threads busy to the end.
        let tasks: Vec<Task> = (0..blocks)
            .rev()
            .flat_map(|q_block| {
                pairs.clone().flat_map(move |pair| {
                    let (b, g) = (pair / s.heads_kv, pair % s.heads_kv);
                    (g * group..(g + 1) * group).map(move |h| Task { b, h, q_block })
                })
            })
            .collect();
        let dims = (ctx.block_m, ctx.block_n, s.head_dim, ctx.dp);
        let pass = &pass;
        tasks.par_iter().for_each(|&task| {
            tile::with_scratch(dims, |scratch| match isa {
                // SAFETY: `isa` came from Isa::detect/supported, which checked the CPU has these features.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { task_avx512(ctx, pass, task, scratch) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { task_avx2(ctx, pass, task, scratch) },
                _ => tile::run_task::<T, gemm::Portable>(ctx, pass, task, scratch),
            })
        });
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
fn task_avx512<T: CpuElement>(ctx: &Ctx<'_, T>, pass: &Pass<'_>, task: Task, scratch: &mut Scratch) {
    tile::run_task::<T, gemm::Avx512>(ctx, pass, task, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn task_avx2<T: CpuElement>(ctx: &Ctx<'_, T>, pass: &Pass<'_>, task: Task, scratch: &mut Scratch) {
    tile::run_task::<T, gemm::Avx2>(ctx, pass, task, scratch)
}

impl Attention for Flash {
    fn name(&self) -> &str {
        "cpu-flash"
    }

    fn availability(&self) -> Availability {
        let isa = self.isa().name();
        Availability::Available {
            device: format!("host CPU ({} threads, {isa})", self.threads()),
            kind: DeviceKind::Cpu,
        }
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        problem.validate()?;
        let isa = self.isa();
        let s = problem.shape;
        let tasks = |block_m: usize| s.batch * s.heads_q * s.seq_q.div_ceil(block_m);
        let (block_m, block_n) = match self.tiles {
            Some((m, n))
                if m == 0 || n == 0 || !m.is_multiple_of(isa.mr()) || !n.is_multiple_of(isa.nr()) =>
            {
                return Err(Error::Unsupported {
                    backend: self.name().into(),
                    what: format!(
                        "tiles {m}x{n}: with the {} kernel block_m must be a positive multiple of {} \
                         and block_n of {}",
                        isa.name(),
                        isa.mr(),
                        isa.nr()
                    ),
                });
            }
            Some(tiles) => tiles,
            None if tasks(Self::BLOCK_M) >= self.tasks_per_thread(problem) * self.threads() => {
                (Self::BLOCK_M, Self::BLOCK_N)
            }
            None => (Self::BLOCK_M_SMALL, Self::BLOCK_N),
        };
        let mut notes = vec![];
        let path =
            if self.tiles.is_none() && decode::applies(problem) { Path::Decode } else { Path::Prefill };
        if path == Path::Decode {
            notes.push(format!(
                "decode: {} query rows per (sequence, kv head) in one task, K/V read in place, keys split \
                 over tasks and merged by LSE",
                s.seq_q * s.group_size()
            ));
        }
        if !s.head_dim.is_multiple_of(isa.nr()) {
            notes.push(format!(
                "head_dim {} padded to {} for the {}-wide micro-kernel",
                s.head_dim,
                s.head_dim.div_ceil(isa.nr()) * isa.nr(),
                isa.nr()
            ));
        }
        Ok(Plan {
            backend: self.name().into(),
            kernel: format!(
                "cpu-flash{} {} d{} bm{} bn{}{}",
                if path == Path::Decode { " decode" } else { "" },
                problem.dtype,
                s.head_dim,
                if path == Path::Decode { s.seq_q * s.group_size() } else { block_m },
                block_n,
                if problem.is_causal() { " causal" } else { "" }
            ),
            problem: *problem,
            tiles: match path {
                Path::Decode => {
                    Tiles { block_m: s.seq_q * s.group_size(), block_n: Self::BLOCK_N, stages: 1 }
                }
                Path::Prefill => Tiles { block_m, block_n, stages: 1 },
            },
            execution: Execution::Cpu {
                threads: self.threads(),
                tasks: match path {
                    // At most; a sequence of fewer key tiles is cut into fewer parts.
                    Path::Decode => decode::tasks(s, Self::BLOCK_N, self.threads()),
                    Path::Prefill => tasks(block_m),
                },
                isa: isa.name().into(),
            },
            notes,
            payload: Payload::new(path),
        })
    }

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        plan.check_for(self.name(), &plan.problem)?;
        let compute =
            |plan: &Plan, inputs: &Inputs<'a>, outputs: Outputs<'_>| self.run_into(plan, inputs, outputs);
        Ok(Box::new(HostPrepared::new(plan, inputs, compute)?))
    }

    fn forward(&self, problem: &Problem, inputs: Inputs<'_>, outputs: Outputs<'_>) -> Result<Plan> {
        let plan = self.plan(problem)?;
        self.run_into(&plan, &inputs, outputs)?;
        Ok(plan)
    }

    fn plan_backward(&self, problem: &Problem, _options: BackwardOptions) -> Result<Plan> {
        problem.validate_backward()?;
        let (isa, s) = (self.isa(), problem.shape);
        let (bm, bn) = (backward::BM, backward::BN);
        let key_tasks: usize = s.batch * s.heads_kv * s.seq_k.div_ceil(bn);
        let query_tasks: usize = s.batch * s.heads_q * s.seq_q.div_ceil(bm);
        Ok(Plan {
            backend: self.name().into(),
            kernel: format!("cpu-flash backward {} d{} bm{bm} bn{bn}", problem.dtype, s.head_dim),
            problem: *problem,
            tiles: Tiles { block_m: bm, block_n: bn, stages: 1 },
            execution: Execution::Cpu {
                threads: self.threads(),
                tasks: key_tasks + query_tasks,
                isa: isa.name().into(),
            },
            notes: vec![
                format!(
                    "two passes: dK/dV over {key_tasks} (sequence, kv head, key block) tasks, then dQ over \
                     {query_tasks} (sequence, query head, query block) tasks; P recomputed from the LSE"
                ),
                "deterministic: each gradient row is summed by one task in a fixed order, whatever the \
                 options or thread count"
                    .into(),
            ],
            payload: Default::default(),
        })
    }

    fn run_backward(&self, plan: &Plan, inputs: GradInputs<'_>, grads: Gradients<'_>) -> Result<()> {
        let problem = &plan.problem;
        plan.check_for(self.name(), problem)?;
        // The plan decides what runs: the instruction set it names.
        let isa = self.isa_of(plan)?;
        self.install(|| match problem.dtype {
            attn_core::DType::F32 => backward::run::<f32>(problem, isa, &inputs, grads),
            attn_core::DType::F16 => backward::run::<f16>(problem, isa, &inputs, grads),
            attn_core::DType::Bf16 => backward::run::<bf16>(problem, isa, &inputs, grads),
        });
        Ok(())
    }
}
