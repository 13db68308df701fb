//! Attention on tensors that already live on a CUDA device, on the caller's stream.
//!
//! The [`Attention`](attn_core::Attention) trait's path copies host slices to the device and
//! back (`prepare`, `read`): right for a benchmark or a one-off call, wrong inside a model whose
//! tensors are on the GPU already. These calls take the caller's memory and stream instead:
//!
//! - [`Cuda::plan_on`] plans a problem for the device of a caller's context (the same planner and
//!   kernels as [`Attention::plan`](attn_core::Attention::plan); it compiles the kernel, once
//!   per process, and allocates nothing). [`Cuda::plan_cached`] keeps each problem's plan, for
//!   callers that see the same shapes over and over (the candle op, the raw entry's users).
//! - [`Cuda::run_on_stream`] runs a plan on cudarc memory (`CudaSlice`, `CudaView`,
//!   `CudaViewMut` of `half::f16` or `half::bf16`) on the caller's `Arc<CudaStream>`, writing o
//!   (and the LSE) into the caller's buffers. The index arrays of packed (varlen) sequences, a
//!   paged cache, per-sequence key counts and ALiBi's slopes come as device memory too
//!   ([`DeviceArrays`]): a serving stack's block table and offsets stay where they are. It is
//!   asynchronous: it enqueues one kernel and returns. Errors found when the kernel runs
//!   surface where the caller synchronizes.
//! - [`Cuda::run_raw`] is the same for callers that are not cudarc users (other frameworks, FFI):
//!   device addresses and a `CUstream`, under a safety contract.
//!
//! The index arrays' contents are unchecked on this path (checking them would need a copy back;
//! [`attn_core::Problem::check_extras`] checks host copies): the kernels clamp every index into
//! the problem's bounds, a few scalar instructions per CTA (per page lookup for page numbers),
//! so corrupt contents give wrong rows, never a read or write outside the tensors (see
//! [`crate::indices`]).
//!
//! What a call does on the host, after the first one on a context and stream: it checks the
//! plan, the dtype, the buffers' lengths and alignment, finds the kernel loaded for the context
//! (compiled once per process, loaded once per context, shared by all threads and streams),
//! fills the kernel's parameter block (the Hopper family encodes four TMA descriptors) and
//! launches. No allocation, no copy between host and device, no synchronization: the Hopper and
//! decode families' workspace (counters, which every launch leaves at zero: the Hopper
//! scheduler's or the decode merge's tickets; and partial results: the Hopper split tail's or
//! the decode splits') is allocated on the first call on a (context, stream) and
//! reused; a problem that needs a larger one allocates it then (the smaller one is kept until
//! the backend is dropped, which waits for the device first). The first call on a stream thus
//! allocates and waits for the context's default stream once; calls after it do neither. The
//! backend holds each stream it has seen until it is dropped.
//!
//! The backend ([`Cuda`]) is `Send + Sync`: one instance serves any number of threads, streams
//! and devices at once. A plan is made for one device model (its SM count sizes the Hopper
//! family's persistent grid): a stream on another model is a [`Error::PlanMismatch`].

use crate::ampere::launch::KernelParams;
use crate::backend::{Chosen, Cuda, Kernel};
use crate::decode::launch::DecodeParams;
use crate::hopper::launch::{Sm90Params, Workspace};
use crate::indices::{self, DeviceArrays};
use crate::runtime::{Gpu, driver};
use crate::tensors::{DeviceExtras, DevicePointers, ExtraPointers};
use attn_core::{DType, Error, Mask, Plan, Problem, Result, Shape, TensorStrides};
use cudarc::driver::sys::CUstream;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchConfig, PushKernelArg,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// An element type the CUDA kernels read and write: `half::f16` or `half::bf16` (sealed: the
/// kernels' element sizes are fixed, so no other type may stand for a dtype).
pub trait DeviceElement: sealed::Sealed + Copy + 'static {
    /// The problem dtype it stands for.
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

impl DeviceElement for half::f16 {
    const DTYPE: DType = DType::F16;
}

impl DeviceElement for half::bf16 {
    const DTYPE: DType = DType::Bf16;
}

/// The device-resident calls' state inside a [`Cuda`] backend.
#[derive(Default)]
pub(crate) struct Resident {
    /// Callers' contexts other than the backend's own (device 0's primary one), each with the
    /// kernels loaded there.
    contexts: Mutex<Vec<Arc<Gpu>>>,
    /// Plans by (context, problem), for [`Cuda::plan_cached`]: at most [`PLANS_KEPT`].
    plans: Mutex<HashMap<(usize, ProblemKey), Arc<Plan>>>,
    /// The Hopper and decode families' workspace by [`StreamKey`].
    workspaces: Mutex<HashMap<StreamKey, StreamWorkspace>>,
    /// Workspaces a larger one replaced: a launch may still be using them (another thread
    /// may have read their addresses just before), so they live as long as the backend.
    retired: Mutex<Vec<StreamWorkspace>>,
}

/// Plans [`Cuda::plan_cached`] keeps; past this many, it starts afresh (planning again costs a
/// lookup in the process's compile cache, not a compilation).
pub const PLANS_KEPT: usize = 256;

/// Which stream a workspace belongs to: the context, the stream's handle and, for the
/// per-thread default stream (one handle, a different stream on each thread), the thread.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct StreamKey {
    context: usize,
    stream: usize,
    thread: Option<std::thread::ThreadId>,
}

impl StreamKey {
    fn of(context: &CudaContext, stream: &CudaStream) -> StreamKey {
        // CU_STREAM_PER_THREAD.
        let per_thread = stream.cu_stream() as usize == 0x2;
        StreamKey {
            context: context.cu_ctx() as usize,
            stream: stream.cu_stream() as usize,
            thread: per_thread.then(|| std::thread::current().id()),
        }
    }
}

/// A [`Problem`] as a hash key (its scale and soft-cap compared by bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ProblemKey {
    shape: Shape,
    dtype: DType,
    strides: TensorStrides,
    mask: Mask,
    scale: Option<u32>,
    softcap: Option<u32>,
    alibi: Option<attn_core::Alibi>,
    batching: attn_core::Batching,
    return_lse: bool,
}

impl ProblemKey {
    fn of(p: &Problem) -> Self {
        ProblemKey {
            shape: p.shape,
            dtype: p.dtype,
            strides: p.strides,
            mask: p.params.mask,
            scale: p.params.scale.map(f32::to_bits),
            softcap: p.params.softcap.map(f32::to_bits),
            alibi: p.params.alibi,
            batching: p.batching,
            return_lse: p.params.return_lse,
        }
    }
}

/// One stream's workspace (Hopper and decode families): zeroed counters and room for partial
/// results, with their addresses, and the stream (held, so that its handle cannot be reused by
/// a new stream while the workspace is keyed by it).
struct StreamWorkspace {
    counters: CudaSlice<u32>,
    partials: Option<CudaSlice<f32>>,
    at: Workspace,
    _stream: Arc<CudaStream>,
}

impl Drop for StreamWorkspace {
    /// A kernel on the caller's stream may still use the buffers: wait for the context before
    /// they are freed (when the backend is dropped).
    fn drop(&mut self) {
        let _ = self.counters.context().synchronize();
    }
}

impl Cuda {
    /// The backend's state for the context `ctx`: the backend's own device where that is open
    /// and `ctx` is its context, else the caller's context, attached on first use (reading its
    /// device's attributes; nothing is created on it).
    pub(crate) fn context_for(&self, ctx: &Arc<CudaContext>) -> Result<Arc<Gpu>> {
        // The backend's own device, where it is open already (a caller on another device must
        // not make it open device 0).
        if let Some(Ok(own)) = self.gpu.get()
            && own.context().cu_ctx() == ctx.cu_ctx()
        {
            return Ok(own.clone());
        }
        let mut contexts = self.resident.contexts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gpu) = contexts.iter().find(|g| g.context().cu_ctx() == ctx.cu_ctx()) {
            return Ok(gpu.clone());
        }
        crate::probe::driver_available()
            .map_err(|reason| Error::Unavailable { backend: "cuda".into(), reason })?;
        let gpu = Arc::new(Gpu::attach(ctx.clone())?);
        contexts.push(gpu.clone());
        Ok(gpu)
    }

    /// Plans `problem` for the device of `ctx` (a caller's context, e.g. candle's
    /// `CudaDevice::cuda_stream().context()`): the plan [`Cuda::run_on_stream`] and
    /// [`Cuda::run_raw`] take. Compiles the kernel (host work, cached per process); allocates
    /// nothing on the device. Every problem the host-copy path runs plans here too, sequences
    /// and ALiBi included (their arrays are given to the run, as device memory).
    pub fn plan_on(&self, ctx: &Arc<CudaContext>, problem: &Problem) -> Result<Plan> {
        self.plan_with(&*self.context_for(ctx)?, problem, false)
    }

    /// [`Cuda::plan_on`], kept per (context, problem) so that a repeated problem costs a lookup.
    pub fn plan_cached(&self, ctx: &Arc<CudaContext>, problem: &Problem) -> Result<Arc<Plan>> {
        let key = (ctx.cu_ctx() as usize, ProblemKey::of(problem));
        if let Some(plan) = self.resident.plans.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(plan.clone());
        }
        let plan = Arc::new(self.plan_on(ctx, problem)?);
        let mut plans = self.resident.plans.lock().unwrap_or_else(|e| e.into_inner());
        if plans.len() >= PLANS_KEPT {
            plans.clear();
        }
        plans.insert(key, plan.clone());
        Ok(plan)
    }

    /// Runs `plan` on tensors on the device, on `stream`: q, k and v (cudarc `CudaSlice`s or
    /// views) are read, o and, where the plan's problem asks for it, `arrays.lse` (`[batch,
    /// heads_q, seq_q]` f32) are written; each tensor's elements are where the problem's strides
    /// put them from the start of its buffer. The index arrays and ALiBi slopes the problem
    /// needs are `arrays`' others ([`DeviceArrays`]; `DeviceArrays::default()` for a dense
    /// problem without LSE or ALiBi). Asynchronous: one kernel is enqueued on `stream`; nothing
    /// is copied or waited for, and nothing allocated after the first call on this stream (see
    /// the module's notes).
    ///
    /// Errors, before anything is enqueued: a plan of another backend or device model (or one
    /// whose problem was edited since), an element type other than the problem's, a buffer of
    /// another context than the stream's, shorter than the problem's strides reach or not
    /// 16-byte aligned, an LSE buffer given or missing against the problem, an index array
    /// given or missing against the problem, shorter than the entries it reads or not 4-byte
    /// aligned, a failed launch. The index arrays' contents are not checked: see the module's
    /// notes.
    pub fn run_on_stream<T: DeviceElement>(
        &self,
        plan: &Plan,
        q: &impl DevicePtr<T>,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        o: &mut impl DevicePtrMut<T>,
        arrays: DeviceArrays<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let problem = &plan.problem;
        check_dtype::<T>(plan)?;
        // Memory of another context (another device) would fault on the device, where the error
        // is sticky: refused here.
        // The LSE is a written buffer, apart from the read-only index arrays left in `arrays`.
        let mut arrays = arrays;
        let mut lse = arrays.lse.take();
        let contexts = [("q", q.stream()), ("k", k.stream()), ("v", v.stream()), ("o", o.stream())];
        check_contexts(contexts.into_iter().chain(lse.as_ref().map(|l| ("lse", l.stream()))), stream)?;
        let [q_len, k_len, v_len, o_len] = problem.required_lens().map(|(_, n)| n);
        check_len("q", q.len(), q_len)?;
        check_len("k", k.len(), k_len)?;
        check_len("v", v.len(), v_len)?;
        check_len("o", o.len(), o_len)?;
        if let Some(l) = &lse {
            check_len("lse", l.len(), problem.lse_len())?;
        }
        let (given, _index_guards) = arrays.given(stream);
        let extras = indices::check(problem, given, stream.context().ordinal())?;
        // The addresses, with cudarc's stream-ordering guards held until the launch is
        // enqueued (where the context tracks events, the stream first waits for the tensors'
        // last writes on other streams, and the guards record this use when dropped).
        let (q_at, _q) = q.device_ptr(stream);
        let (k_at, _k) = k.device_ptr(stream);
        let (v_at, _v) = v.device_ptr(stream);
        let (o_at, _o) = o.device_ptr_mut(stream);
        let (lse_at, _lse) = match lse.as_mut() {
            Some(l) => {
                let (at, guard) = l.device_ptr_mut(stream);
                (Some(at), Some(guard))
            }
            None => (None, None),
        };
        let at = DevicePointers { q: q_at, k: k_at, v: v_at, o: o_at, lse: lse_at };
        self.launch_resident(plan, at, extras, stream)
    }

    /// [`Cuda::run_on_stream`] for callers that hold raw device addresses and a raw stream
    /// (other frameworks, FFI): the tensors at `at`, laid out as `plan`'s problem says (its
    /// shape, strides and dtype), and the index arrays and slopes at `extras` (0 for each the
    /// problem does not use; `ExtraPointers::default()` for a dense problem), on `stream`. Asynchronous, as `run_on_stream` is. The plan
    /// must come from [`Cuda::plan_on`] (or [`Cuda::plan_cached`]) for the context `stream`
    /// belongs to, or from [`Attention::plan`](attn_core::Attention::plan) where that is device
    /// 0's primary context.
    ///
    /// # Safety
    ///
    /// The caller guarantees that:
    /// - `stream` is a valid CUDA stream of `plan`'s context, and stays valid until the enqueued
    ///   kernel has run;
    /// - `at.q`, `at.k`, `at.v` and `at.o` point to device memory of that context holding every
    ///   element the problem's shape and strides reach (`Problem::required_lens` elements of its
    ///   dtype from each address), and `at.lse`, where present, to `batch · heads_q · seq_q`
    ///   f32 values;
    /// - each non-zero address of `extras` points to device memory of that context holding at
    ///   least the entries the problem reads from it (`[batch + 1]` i32 for `cu_seqlens_q` and
    ///   `cu_seqlens_k`, `[batch]` i32 for `seqused_k`, `[batch, pages_per_seq]` i32 for
    ///   `block_table`, `[heads_q]` or `[batch, heads_q]` f32 for `alibi_slopes`), written
    ///   before this stream's next work; their contents may be anything (the kernels clamp every
    ///   index into the problem's bounds: bad contents give wrong rows, not bad accesses);
    /// - that memory stays allocated until the kernel has run, o and lse overlap nothing the
    ///   kernel reads or another kernel uses meanwhile, and every earlier write to q, k and v
    ///   is ordered before this stream's next work.
    ///
    /// - the memory is accessible from the stream's device, and a CUDA graph that captures this
    ///   call is replayed only while the backend lives (the launch uses the backend's
    ///   workspace for this stream, whose address the graph keeps);
    /// - a stream whose handle is reused for a new one (after the old was destroyed) has
    ///   finished the kernels this call enqueued on it: the workspace is keyed by the handle.
    ///
    /// What is checked, with a typed error: the plan, the device, the alignment of each address,
    /// the LSE and each index array present exactly when the problem needs it, the launch.
    pub unsafe fn run_raw(
        &self,
        plan: &Plan,
        at: DevicePointers,
        extras: ExtraPointers,
        stream: CUstream,
    ) -> Result<()> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `stream` is valid by the caller's contract; the call writes one pointer.
        unsafe { cudarc::driver::sys::cuStreamGetCtx(stream, &mut ctx) }
            .result()
            .map_err(driver("cuStreamGetCtx"))?;
        let gpu = self.gpu_of_raw_context(ctx)?;
        // SAFETY: `stream` belongs to this context and outlives the launch (the contract); the
        // wrapper does not destroy it.
        let wrapped = unsafe { gpu.context().wrap_borrowed_stream(stream) };
        let extras = indices::check(&plan.problem, indices::given_raw(extras), gpu.context().ordinal())?;
        self.launch_resident(plan, at, extras, &wrapped)
    }

    /// The state of the context `ctx` (raw): one the backend knows already (its own, or one
    /// attached by [`Cuda::plan_on`]), or a device's primary context, retained here.
    fn gpu_of_raw_context(&self, ctx: cudarc::driver::sys::CUcontext) -> Result<Arc<Gpu>> {
        if let Some(Ok(own)) = self.gpu.get()
            && own.context().cu_ctx() == ctx
        {
            return Ok(own.clone());
        }
        if let Some(gpu) = self
            .resident
            .contexts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|g| g.context().cu_ctx() == ctx)
        {
            return Ok(gpu.clone());
        }
        // A primary context: the one PyTorch, candle and cudarc use.
        for ordinal in 0..CudaContext::device_count().map_err(driver("cuDeviceGetCount"))? as usize {
            let primary = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
            if primary.cu_ctx() == ctx {
                return self.context_for(&primary);
            }
        }
        Err(Error::Unsupported {
            backend: "cuda".into(),
            what: "the stream belongs to a context this backend does not know: plan with Cuda::plan_on on \
                   that context first (or use a device's primary context)"
                .into(),
        })
    }

    /// Checks `plan` against the device of `stream` and the addresses, then launches its kernel
    /// (`extras`: the index arrays, checked against the problem by `indices::check`).
    fn launch_resident(
        &self,
        plan: &Plan,
        at: DevicePointers,
        extras: ExtraPointers,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let chosen = plan.payload::<Chosen>()?;
        // The kernel was compiled for the problem planned; one edited since is not the plan's.
        plan.check_for("cuda", &chosen.problem)?;
        let problem = &plan.problem;
        if problem.params.return_lse != at.lse.is_some() {
            return Err(Error::Shape {
                tensor: "lse",
                what: match problem.params.return_lse {
                    true => "the problem asks for the LSE, but no LSE buffer was given".into(),
                    false => "an LSE buffer was given, but the problem does not ask for the LSE".into(),
                },
            });
        }
        for (tensor, address) in
            [("q", at.q), ("k", at.k), ("v", at.v), ("o", at.o)].into_iter().chain(at.lse.map(|l| ("lse", l)))
        {
            check_aligned(tensor, address)?;
        }
        let gpu = self.context_for(stream.context())?;
        let info = gpu.info();
        if (info.compute_capability, info.sm_count) != (chosen.device.1, chosen.device.2) {
            return Err(Error::PlanMismatch {
                what: format!(
                    "plan `{}` was made for {} ({} SMs), the stream is on {info}: plan with Cuda::plan_on \
                     for this stream's context",
                    plan.kernel, chosen.device.0, chosen.device.2
                ),
            });
        }
        let arch = Self::arch(&gpu)?;
        let kernel = &chosen.kernel;
        let function =
            gpu.ready_kernel(chosen.key, kernel.entry(), || kernel.request(arch), kernel.shared_bytes())?;
        let l = &chosen.launch;
        let cfg = LaunchConfig {
            grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
            block_dim: (l.block[0], l.block[1], l.block[2]),
            shared_mem_bytes: l.dynamic_shared_bytes,
        };
        let mut builder = stream.launch_builder(&function);
        let (ampere, hopper, decode);
        match kernel {
            Kernel::Decode(variant, split) => {
                let work = match split.splits > 1 {
                    true => self.workspace(&gpu, stream, split.counters(), split.partial_floats(variant))?,
                    false => Workspace { counters: 0, partials: 0 },
                };
                decode = DecodeParams::new(at, extras, work, problem, variant, split);
                builder.arg(&decode);
            }
            Kernel::Ampere(_) => {
                ampere = KernelParams::new(at, extras, problem);
                builder.arg(&ampere);
            }
            Kernel::Hopper(variant, split) => {
                if variant.trace {
                    return Err(Error::PlanMismatch {
                        what: format!(
                            "plan `{}` is a traced build, which only the host-copy path runs",
                            plan.kernel
                        ),
                    });
                }
                let work = self.workspace(&gpu, stream, split.counters(variant.consumers), {
                    if split.units > 0 {
                        split.partial_floats(variant.head_dim, variant.consumers)
                    } else {
                        0
                    }
                })?;
                hopper = Sm90Params::new(at, extras, work, split, problem, variant)?;
                builder.arg(&hopper);
            }
        }
        // SAFETY: the parameter block holds the caller's buffers, checked above to hold every
        // element the problem's strides reach (or promised so, for the raw entry), index arrays
        // checked (or promised) to hold the entries the problem reads, whose contents the kernels
        // clamp into the problem's bounds, and this stream's workspace; the launch is the
        // plan's, validated against the device's limits.
        unsafe { builder.launch(cfg) }.map(|_| ()).map_err(driver("cuLaunchKernel"))
    }

    /// The workspace of `stream` on `gpu` (the Hopper and decode families share it: each leaves
    /// the counters at zero) with at least `counters` counters and
    /// `partials` partial floats: the stream's own, allocated on first use (zeroed on the
    /// context's default stream, which is then waited for) and grown where too small (the
    /// smaller one kept until the backend is dropped: a launch may hold its addresses).
    fn workspace(
        &self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        counters: usize,
        partials: usize,
    ) -> Result<Workspace> {
        let key = StreamKey::of(gpu.context(), stream);
        let mut all = self.resident.workspaces.lock().unwrap_or_else(|e| e.into_inner());
        let (mut counters, mut partials) = (counters.max(1), partials);
        if let Some(w) = all.get(&key) {
            let have = (w.counters.len(), w.partials.as_ref().map_or(0, |p| p.len()));
            if have.0 >= counters && have.1 >= partials {
                return Ok(w.at);
            }
            // Grown to hold both the old and the new need, so that problems that alternate do
            // not replace it every call.
            (counters, partials) = (counters.max(have.0), partials.max(have.1));
        }
        let own = gpu.context().default_stream();
        let counter_slice = own.alloc_zeros::<u32>(counters).map_err(driver("allocate the tile counters"))?;
        let partial_slice = match partials {
            0 => None,
            n => Some(
                // SAFETY: every slot a launch reads, it first writes (merge_partials).
                unsafe { own.alloc::<f32>(n) }
                    .map_err(driver("allocate the split tail's partial results"))?,
            ),
        };
        own.synchronize().map_err(driver("cuStreamSynchronize (the workspace's zeros)"))?;
        let at = Workspace {
            counters: counter_slice.device_ptr(&own).0,
            partials: partial_slice.as_ref().map_or(0, |p| p.device_ptr(&own).0),
        };
        let fresh =
            StreamWorkspace { counters: counter_slice, partials: partial_slice, at, _stream: stream.clone() };
        if let Some(old) = all.insert(key, fresh) {
            self.resident.retired.lock().unwrap_or_else(|e| e.into_inner()).push(old);
        }
        Ok(at)
    }
}

/// That a buffer of `len` elements holds the `needed` a tensor's strides reach.
/// That every buffer (by the stream it was made on) belongs to `stream`'s context: memory of
/// another context (another device) would fault on the device, where the error is sticky.
pub(crate) fn check_contexts<'s>(
    owners: impl IntoIterator<Item = (&'static str, &'s Arc<CudaStream>)>,
    stream: &CudaStream,
) -> Result<()> {
    for (tensor, owner) in owners {
        if owner.context().cu_ctx() != stream.context().cu_ctx() {
            return Err(Error::Shape {
                tensor,
                what: format!(
                    "its buffer belongs to the context of device {}, the stream to device {}'s: tensors and stream \
                     must share a context",
                    owner.context().ordinal(),
                    stream.context().ordinal()
                ),
            });
        }
    }
    Ok(())
}

/// Tensors of element type `T` for `plan`: its problem's dtype, or a typed error.
pub(crate) fn check_dtype<T: DeviceElement>(plan: &Plan) -> Result<()> {
    match T::DTYPE == plan.problem.dtype {
        true => Ok(()),
        false => Err(Error::Shape {
            tensor: "q",
            what: format!(
                "the tensors hold {} but plan `{}` is for {}",
                T::DTYPE,
                plan.kernel,
                plan.problem.dtype
            ),
        }),
    }
}

/// A device address the kernels read or write 16 bytes at a time from: 16-byte aligned, or a
/// typed error naming the tensor.
pub(crate) fn check_aligned(tensor: &'static str, address: u64) -> Result<()> {
    match address % 16 {
        0 => Ok(()),
        _ => Err(Error::Shape {
            tensor,
            what: format!(
                "device address {address:#x} is not 16-byte aligned: the kernels load and store 16 bytes at a time"
            ),
        }),
    }
}

pub(crate) fn check_len(tensor: &'static str, len: usize, needed: usize) -> Result<()> {
    if len < needed {
        return Err(Error::Shape {
            tensor,
            what: format!(
                "the device buffer holds {len} elements; the problem's shape and strides reach {needed}"
            ),
        });
    }
    Ok(())
}

/// The device-resident path behind the [`Attention`](attn_core::Attention) trait, for `attn
/// verify --resident` and benchmarks: `prepare` copies the inputs into buffers it owns on a
/// stream of its own (as a caller's would be), on device 0's primary context, which it holds
/// as a caller does (the same context as the backend's own, so the path through
/// `Gpu::attach` is not what it exercises: `tests/resident.rs`'s two-device test does); `run`
/// calls [`Cuda::run_on_stream`] and times it with CUDA events; `read` copies o and the LSE back.
/// Its results must equal the `cuda` backend's bit for bit.
#[derive(Default)]
pub struct OnStream {
    cuda: Cuda,
    caller: std::sync::OnceLock<std::result::Result<Caller, String>>,
}

/// A caller's context and a stream on it.
type Caller = (Arc<CudaContext>, Arc<CudaStream>);

impl OnStream {
    /// The harness over `cuda`.
    pub fn new(cuda: Cuda) -> Self {
        OnStream { cuda, caller: Default::default() }
    }

    /// The caller's context (device 0's primary one, opened apart from the backend's) and a
    /// stream on it.
    fn caller(&self) -> Result<Caller> {
        self.caller
            .get_or_init(|| {
                crate::probe::driver_available()?;
                let ctx = CudaContext::new(0).map_err(|e| format!("cuCtxCreate: {e}"))?;
                let stream = ctx.new_stream().map_err(|e| format!("cuStreamCreate: {e}"))?;
                Ok((ctx, stream))
            })
            .clone()
            .map_err(|reason| Error::Unavailable { backend: "cuda-resident".into(), reason })
    }
}

/// A prepared call's device buffers, typed by the problem's dtype.
enum Buffers {
    F16([CudaSlice<half::f16>; 4]),
    Bf16([CudaSlice<half::bf16>; 4]),
}

struct OnStreamPrepared<'a> {
    harness: &'a OnStream,
    plan: Plan,
    stream: Arc<CudaStream>,
    buffers: Buffers,
    lse: Option<CudaSlice<f32>>,
    /// The problem's index arrays and slopes, copied to the caller's device once (as a serving
    /// stack's would be there already), given to each run as device memory.
    extras: DeviceExtras,
}

impl attn_core::Attention for OnStream {
    fn name(&self) -> &str {
        "cuda-resident"
    }

    fn availability(&self) -> attn_core::Availability {
        self.cuda.availability()
    }

    fn numerics(&self, dtype: DType) -> attn_core::Numerics {
        self.cuda.numerics(dtype)
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        self.cuda.plan_on(&self.caller()?.0, problem)
    }

    fn prepare<'a>(
        &'a self,
        plan: &Plan,
        inputs: attn_core::Inputs<'a>,
    ) -> Result<Box<dyn attn_core::Prepared + 'a>> {
        let problem = plan.problem;
        problem.check_inputs(&inputs)?;
        let (_, stream) = self.caller()?;
        let copy = driver("copy an input to the device");
        let o_len = problem.required_lens()[3].1;
        let buffers = match (inputs.q, inputs.k, inputs.v) {
            (attn_core::Data::F16(q), attn_core::Data::F16(k), attn_core::Data::F16(v)) => Buffers::F16([
                stream.clone_htod(q).map_err(&copy)?,
                stream.clone_htod(k).map_err(&copy)?,
                stream.clone_htod(v).map_err(&copy)?,
                stream.clone_htod(&vec![half::f16::NAN; o_len]).map_err(&copy)?,
            ]),
            (attn_core::Data::Bf16(q), attn_core::Data::Bf16(k), attn_core::Data::Bf16(v)) => {
                Buffers::Bf16([
                    stream.clone_htod(q).map_err(&copy)?,
                    stream.clone_htod(k).map_err(&copy)?,
                    stream.clone_htod(v).map_err(&copy)?,
                    stream.clone_htod(&vec![half::bf16::NAN; o_len]).map_err(&copy)?,
                ])
            }
            _ => {
                return Err(Error::UnsupportedDType {
                    backend: "cuda-resident".into(),
                    dtype: problem.dtype,
                    supported: "f16 and bf16".into(),
                });
            }
        };
        let lse = match problem.params.return_lse {
            true => Some(stream.alloc_zeros::<f32>(problem.lse_len()).map_err(driver("allocate lse"))?),
            false => None,
        };
        let extras = DeviceExtras::upload(&stream, &inputs.extras)?;
        Ok(Box::new(OnStreamPrepared { harness: self, plan: plan.clone(), stream, buffers, lse, extras }))
    }
}

impl attn_core::Prepared for OnStreamPrepared<'_> {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    /// One `run_on_stream` call between two CUDA events on the caller's stream.
    fn run(&mut self) -> Result<std::time::Duration> {
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(timed).map_err(driver("cuEventRecord (start)"))?;
        let arrays = DeviceArrays { lse: self.lse.as_mut().map(|l| l.as_view_mut()), ..self.extras.arrays() };
        let (cuda, plan, stream) = (&self.harness.cuda, &self.plan, &self.stream);
        match &mut self.buffers {
            Buffers::F16([q, k, v, o]) => cuda.run_on_stream(plan, q, k, v, o, arrays, stream)?,
            Buffers::Bf16([q, k, v, o]) => cuda.run_on_stream(plan, q, k, v, o, arrays, stream)?,
        }
        let end = self.stream.record_event(timed).map_err(driver("cuEventRecord (end)"))?;
        end.synchronize().map_err(driver("the kernel (cuEventSynchronize)"))?;
        let ms = start.elapsed_ms(&end).map_err(driver("cuEventElapsedTime"))?;
        Ok(std::time::Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    fn read(&mut self, mut outputs: attn_core::Outputs<'_>) -> Result<()> {
        let problem = self.plan.problem;
        problem.check_outputs(&outputs)?;
        let back = driver("copy an output to the host");
        let o = match &self.buffers {
            Buffers::F16([.., o]) => attn_core::Buffer::F16(self.stream.clone_dtoh(o).map_err(&back)?),
            Buffers::Bf16([.., o]) => attn_core::Buffer::Bf16(self.stream.clone_dtoh(o).map_err(&back)?),
        };
        outputs.o.copy_view_from(o.as_data(), &problem)?;
        if let (Some(dst), Some(src)) = (outputs.lse.as_deref_mut(), &self.lse) {
            dst.copy_from_slice(&self.stream.clone_dtoh(src).map_err(&back)?);
        }
        Ok(())
    }
}
