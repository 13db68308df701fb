//! A CUDA device ready to run our kernels: a context (ours, or a caller's), a stream of our own
//! for the host-copy path, what the device allows, and the kernels loaded on it.
//!
//! The backend launches its kernels itself with cudarc's launch builder, passing the kernel's
//! parameters as one `#[repr(C)]` struct by value:
//!
//! ```no_run
//! use attn_cuda::{Arch, CompileRequest, Gpu};
//! use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
//!
//! /// Mirrors `struct SmokeParams` in `kernels/smoke.cu` field for field.
//! #[repr(C)]
//! #[derive(Clone, Copy)]
//! struct SmokeParams { x: u64, y: u64, n: u32, factor: f32 }
//! // SAFETY: plain data with the C layout the kernel declares.
//! unsafe impl DeviceRepr for SmokeParams {}
//!
//! # fn main() -> attn_core::Result<()> {
//! let gpu = Gpu::open(0)?;
//! let arch = gpu.arch().expect("a device we compile for");
//! let req = CompileRequest::new("smoke", include_str!("../kernels/smoke.cu"), arch);
//! let kernel = gpu.kernel(&req, "smoke_params")?;
//! let stream = gpu.stream()?;
//! let x = stream.clone_htod(&[1.0f32; 1000]).map_err(attn_cuda::driver("cuMemcpyHtoD"))?;
//! let mut y = stream.alloc_zeros::<f32>(1000).map_err(attn_cuda::driver("cuMemAlloc"))?;
//! let params = SmokeParams {
//!     x: gpu.device_ptr(&x),
//!     y: gpu.device_ptr_mut(&mut y),
//!     n: 1000,
//!     factor: 2.0,
//! };
//! let cfg = LaunchConfig { grid_dim: (4, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
//! let elapsed = gpu.time(attn_cuda::Lead::Repeat, |stream| {
//!     // SAFETY: `params` matches the kernel's parameter and its pointers outlive the launch.
//!     unsafe { stream.launch_builder(&kernel.function).arg(&params).launch(cfg) }
//!         .map(|_| ())
//!         .map_err(attn_cuda::driver("cuLaunchKernel smoke_params"))
//! })?;
//! let y = stream.clone_dtoh(&y).map_err(attn_cuda::driver("cuMemcpyDtoH"))?;
//! assert_eq!(y[999], 2.0);
//! println!("{elapsed:?}");
//! # Ok(()) }
//! ```

use crate::compile::{self, Arch, CompileRequest, Compiled};
use crate::probe::{self, DeviceInfo, guarded};
use crate::ptxas::KernelResources;
use attn_core::{Error, Result};
use cudarc::driver::sys::{self, CUevent_flags, CUfunction_attribute, CUmemPool_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The backend name our errors carry.
const BACKEND: &str = "cuda";

/// What runs on the stream just before a timed launch's start event ([`Gpu::time`]).
///
/// An idle stream stamps an event as soon as it is recorded, so timing a launch on its own
/// also counts what the host does until the launch reaches the device: microseconds for this
/// backend, up to 0.1-0.28 ms a call for PyTorch's SDPA backends, which the peer script times
/// the same way (measured, see docs/experiments.md). Ahead of other work the start is
/// stamped when that work ends, with the timed launch already queued behind it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lead {
    /// Nothing: the start event is stamped when it reaches an idle device.
    Idle,
    /// The same work once more, untimed: the timed launch runs back to back with its twin, as
    /// in a stream of such calls (what the backend's benchmarked runs take by default).
    #[default]
    Repeat,
    /// A one-thread kernel that waits this long ([`Gpu::hold`]): the host's part is not
    /// counted, but the device rests before the timed launch and starts it at a higher clock
    /// than a stream of such calls would see (on the H100, at its power cap, up to 15% faster).
    Hold(Duration),
}

impl Lead {
    /// What runs ahead of a timed launch, in words (for the plan's notes).
    pub fn describe(&self) -> String {
        match self {
            Lead::Idle => {
                "nothing ahead of it (ATTN_CUDA_TIMING_LEAD=idle: the host's launch counted)".into()
            }
            Lead::Repeat => "each behind an untimed twin of itself (ATTN_CUDA_TIMING_LEAD=repeat)".into(),
            Lead::Hold(span) => format!(
                "each behind a {} us wait (ATTN_CUDA_TIMING_LEAD=hold: a rested device, faster than steady state)",
                span.as_micros()
            ),
        }
    }

    /// Reads `idle`, `repeat` or `hold:<microseconds>`.
    pub fn parse(text: &str) -> Option<Lead> {
        match text {
            "idle" => Some(Lead::Idle),
            "repeat" => Some(Lead::Repeat),
            _ => text.strip_prefix("hold:")?.parse().ok().map(|us| Lead::Hold(Duration::from_micros(us))),
        }
    }
}

/// The kernel [`Gpu::hold`] launches.
const HOLD_SOURCE: &str = include_str!("../kernels/hold.cu");

/// Turns a cudarc driver error into the workspace's error, naming the call that failed:
/// `.map_err(driver("cuModuleLoadData"))`.
pub fn driver(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::backend(BACKEND, format!("{call}: {e}"))
}

/// What [`Gpu::memory_use`] reads: device bytes this process holds, as its allocator counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    /// Held now.
    pub current: u64,
    /// The most held since the last [`Gpu::reset_memory_peak`] (without memory pools: `current`).
    pub peak: u64,
}

/// One device context and what we keep on it: the kernels loaded there (once, shared by every
/// thread and stream), and a stream of our own for the host-copy path, created on first use (so
/// that attaching to a caller's context adds no stream to it until that path is used).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: OnceLock<Arc<CudaStream>>,
    info: DeviceInfo,
    /// Functions loaded on this context, by (program key, entry function), so that each is
    /// loaded once; the program itself comes from [`compile::compile_cached`], keyed the same.
    kernels: Mutex<HashMap<(u64, String), Kernel>>,
    /// What [`Gpu::ready_kernel`] hands out, by (program key, entry function): the function and
    /// the dynamic shared memory it has been allowed, found without allocating.
    ready: Mutex<ReadyKernels>,
}

/// [`Gpu::ready_kernel`]'s table: (program key, entry) to (function, shared bytes allowed).
type ReadyKernels = HashMap<(u64, &'static str), (CudaFunction, u32)>;

/// A kernel loaded on a [`Gpu`], with what ptxas reported about it.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The function, for `stream.launch_builder(&kernel.function)`.
    pub function: CudaFunction,
    /// The compiled program it came from (CUBIN, PTX, log).
    pub compiled: Arc<Compiled>,
    /// ptxas's report for this entry function; `None` if the log had none for it.
    pub resources: Option<KernelResources>,
}

/// What the driver says about a loaded function; the numbers a plan needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionAttributes {
    /// Registers per thread.
    pub registers: u32,
    /// Local memory per thread, bytes (stack and spills).
    pub local_bytes: u32,
    /// Static shared memory per block, bytes.
    pub static_shared_bytes: u32,
    /// The most threads per block this function can be launched with, given its registers.
    pub max_threads_per_block: u32,
    /// The dynamic shared memory the function may currently be launched with, bytes.
    pub max_dynamic_shared_bytes: u32,
}

impl Gpu {
    /// Opens device `ordinal`: checks the driver library loads (an [`Error::Unavailable`]
    /// saying what is missing if not), creates a context and a stream, reads the device's
    /// limits. Never panics.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let unavailable = |reason: String| Error::Unavailable { backend: BACKEND.into(), reason };
        probe::driver_available().map_err(unavailable)?;
        let opened = guarded("opening the CUDA device", || {
            let ctx =
                CudaContext::new(ordinal).map_err(|e| format!("cuCtxCreate on device {ordinal}: {e}"))?;
            let stream = ctx.new_stream().map_err(|e| format!("cuStreamCreate: {e}"))?;
            let info = probe::device_info(&ctx).map_err(|e| format!("cuDeviceGetAttribute: {e}"))?;
            Ok((ctx, stream, info))
        });
        let (ctx, stream, info) = opened.map_err(|e| Error::backend(BACKEND, e))?;
        Ok(Gpu {
            ctx,
            stream: OnceLock::from(stream),
            info,
            kernels: Mutex::new(HashMap::new()),
            ready: Mutex::new(HashMap::new()),
        })
    }

    /// A caller's context (candle's, or any cudarc user's): reads the device's limits, creates
    /// nothing on it.
    pub fn attach(ctx: Arc<CudaContext>) -> Result<Gpu> {
        let info = guarded("reading the CUDA device's attributes", || {
            probe::device_info(&ctx).map_err(|e| format!("cuDeviceGetAttribute: {e}"))
        })
        .map_err(|e| Error::backend(BACKEND, e))?;
        Ok(Gpu {
            ctx,
            stream: OnceLock::new(),
            info,
            kernels: Mutex::new(HashMap::new()),
            ready: Mutex::new(HashMap::new()),
        })
    }

    /// The device's name, compute capability, SM count and limits.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The architecture to compile for on this device, or `None` when we have no target whose
    /// CUBIN runs on it.
    pub fn arch(&self) -> Option<Arch> {
        let (major, minor) = self.info.compute_capability;
        Arch::for_device(major, minor)
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Our stream on this context, where the host-copy path's copies and launches go (created
    /// on first use).
    pub fn stream(&self) -> Result<&Arc<CudaStream>> {
        if let Some(stream) = self.stream.get() {
            return Ok(stream);
        }
        let stream = self.ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        Ok(self.stream.get_or_init(|| stream))
    }

    /// Loads entry function `kernel` from a compiled program (uncached; see [`Gpu::kernel`]).
    pub fn load(&self, compiled: &Compiled, kernel: &str) -> Result<CudaFunction> {
        let module = self.ctx.load_module(Ptx::from_binary(compiled.cubin.clone())).map_err(|e| {
            Error::backend(BACKEND, format!("cuModuleLoadData `{}` ({}): {e}", compiled.name, compiled.arch))
        })?;
        module.load_function(kernel).map_err(|e| {
            Error::backend(BACKEND, format!("cuModuleGetFunction `{kernel}` in `{}`: {e}", compiled.name))
        })
    }

    /// Entry function `kernel` of the program `req`, compiled once per process and loaded once
    /// per [`Gpu`] (both keyed by [`CompileRequest::key`]).
    pub fn kernel(&self, req: &CompileRequest, kernel: &str) -> Result<Kernel> {
        let key = (req.key(), kernel.to_string());
        let mut kernels = self.kernels.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(k) = kernels.get(&key) {
            return Ok(k.clone());
        }
        let compiled = compile::compile_cached(req)?;
        let function = self.load(&compiled, kernel)?;
        let resources = compiled.resources_of(kernel).cloned();
        let k = Kernel { function, compiled, resources };
        kernels.insert(key, k.clone());
        Ok(k)
    }

    /// [`Gpu::kernel`] for a request whose key is known (`key`, from a plan; `request` is built
    /// only if the kernel is not loaded yet), allowed `shared_bytes` of dynamic shared memory:
    /// after the first call, a lookup with neither a driver call nor an allocation (the hot path
    /// of the device-resident calls).
    pub fn ready_kernel(
        &self,
        key: u64,
        entry: &'static str,
        request: impl FnOnce() -> CompileRequest,
        shared_bytes: u32,
    ) -> Result<CudaFunction> {
        let ready = |r: &Mutex<ReadyKernels>| {
            let found = r.lock().unwrap_or_else(|p| p.into_inner()).get(&(key, entry)).cloned();
            found.filter(|(_, allowed)| *allowed >= shared_bytes).map(|(f, _)| f)
        };
        if let Some(function) = ready(&self.ready) {
            return Ok(function);
        }
        // First use here (or a larger opt-in): load and allow, outside the lookup's lock.
        let function = self.kernel(&request(), entry)?.function;
        self.set_max_dynamic_shared(&function, shared_bytes)?;
        let mut all = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let slot = all.entry((key, entry)).or_insert((function.clone(), 0));
        slot.1 = slot.1.max(shared_bytes);
        Ok(function)
    }

    /// Lets `function` be launched with up to `bytes` of dynamic shared memory. Needed above the
    /// default 48 KB per block ([`attn_core::Launch::needs_shared_optin`]); the device's opt-in
    /// limit is `info().limits.shared_per_block_optin`.
    pub fn set_max_dynamic_shared(&self, function: &CudaFunction, bytes: u32) -> Result<()> {
        // cudarc's `set_attribute` does not bind the context, and this call needs it current.
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let value = i32::try_from(bytes).unwrap_or(i32::MAX);
        function
            .set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value)
            .map_err(|e| {
                Error::backend(
                    BACKEND,
                    format!("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = {bytes}): {e}"),
                )
            })
    }

    /// What the driver reports about a loaded function.
    pub fn attributes(&self, function: &CudaFunction) -> Result<FunctionAttributes> {
        let get = |a: CUfunction_attribute, name: &'static str| {
            function
                .get_attribute(a)
                .map(|v| v.max(0) as u32)
                .map_err(|e| Error::backend(BACKEND, format!("cuFuncGetAttribute({name}): {e}")))
        };
        use CUfunction_attribute as A;
        Ok(FunctionAttributes {
            registers: get(A::CU_FUNC_ATTRIBUTE_NUM_REGS, "NUM_REGS")?,
            local_bytes: get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "LOCAL_SIZE_BYTES")?,
            static_shared_bytes: get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "SHARED_SIZE_BYTES")?,
            max_threads_per_block: get(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "MAX_THREADS_PER_BLOCK")?,
            max_dynamic_shared_bytes: get(
                A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                "MAX_DYNAMIC_SHARED_SIZE_BYTES",
            )?,
        })
    }

    /// Device time of the work `launch` enqueues on the stream, between CUDA events recorded
    /// before and after it, with `lead` queued ahead of the start event (see [`Lead`]). Waits
    /// for the work to finish.
    pub fn time(
        &self,
        lead: Lead,
        mut launch: impl FnMut(&Arc<CudaStream>) -> Result<()>,
    ) -> Result<Duration> {
        let stream = self.stream()?;
        match lead {
            Lead::Idle => {}
            Lead::Repeat => launch(stream)?,
            Lead::Hold(span) => self.hold(span)?,
        }
        // Timing needs events created without CU_EVENT_DISABLE_TIMING, cudarc's default.
        let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = stream.record_event(timed).map_err(driver("cuEventRecord (start)"))?;
        launch(stream)?;
        let end = stream.record_event(timed).map_err(driver("cuEventRecord (end)"))?;
        end.synchronize().map_err(driver("the timed work (cuEventSynchronize)"))?;
        let ms = start.elapsed_ms(&end).map_err(driver("cuEventElapsedTime"))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    /// Queues a one-thread kernel that keeps the stream busy (and the device all but idle) for
    /// `span` of the device's global timer (`kernels/hold.cu`), compiled and loaded on first use.
    pub fn hold(&self, span: Duration) -> Result<()> {
        let arch = self
            .arch()
            .ok_or_else(|| Error::backend(BACKEND, format!("no compile target for {}", self.info.name)))?;
        let hold = self.kernel(&CompileRequest::new("hold", HOLD_SOURCE, arch), "hold_stream")?;
        let ns = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the kernel takes one u64 by value and touches no memory.
        unsafe { self.stream()?.launch_builder(&hold.function).arg(&ns).launch(one) }
            .map(|_| ())
            .map_err(driver("cuLaunchKernel hold_stream"))
    }

    /// Waits for everything queued on the stream; the error of an earlier asynchronous launch
    /// surfaces here.
    pub fn synchronize(&self) -> Result<()> {
        self.stream()?.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    /// Device bytes this process holds once the stream's queued work is done: the use of the
    /// device's default memory pool, which cudarc's stream-ordered allocations (`cuMemAllocAsync`)
    /// draw from, now and at its peak since the last [`Gpu::reset_memory_peak`]; where the device
    /// has no pools (cudarc then allocates with `cuMemAlloc`), its used memory by cuMemGetInfo.
    /// Blocks a call frees go back to the pool, not to the device, so cuMemGetInfo alone cannot
    /// tell what a later call holds.
    pub fn memory_use(&self) -> Result<MemoryUse> {
        self.synchronize()?;
        let Some(pool) = self.default_pool()? else {
            let (free, total) = self.ctx.mem_get_info().map_err(driver("cuMemGetInfo"))?;
            let used = (total - free) as u64;
            return Ok(MemoryUse { current: used, peak: used });
        };
        let get = |attr: CUmemPool_attribute, name: &'static str| -> Result<u64> {
            let mut value = 0u64;
            // SAFETY: `pool` is the device's default pool; both attributes are 64-bit values.
            unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) }
                .result()
                .map_err(driver(name))?;
            Ok(value)
        };
        Ok(MemoryUse {
            current: get(
                CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                "cuMemPoolGetAttribute(USED_MEM_CURRENT)",
            )?,
            peak: get(
                CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                "cuMemPoolGetAttribute(USED_MEM_HIGH)",
            )?,
        })
    }

    /// Starts [`MemoryUse::peak`] again from what the pool holds now (no-op without pools).
    pub fn reset_memory_peak(&self) -> Result<()> {
        let Some(pool) = self.default_pool()? else { return Ok(()) };
        let mut zero = 0u64;
        // SAFETY: resetting USED_MEM_HIGH takes a 64-bit zero.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        }
        .result()
        .map_err(driver("cuMemPoolSetAttribute(USED_MEM_HIGH)"))
    }

    fn default_pool(&self) -> Result<Option<sys::CUmemoryPool>> {
        if !self.ctx.has_async_alloc() {
            return Ok(None);
        }
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: an out-pointer for the pool of this context's device.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) }
            .result()
            .map_err(driver("cuDeviceGetDefaultMemPool"))?;
        Ok(Some(pool))
    }

    /// The device address of `slice`, for a `#[repr(C)]` parameter struct. The address stays
    /// valid while `slice` lives. All our work goes to one stream, so the stream-ordering events
    /// cudarc attaches to slices for multi-stream use are not needed and are dropped here.
    pub fn device_ptr<T>(&self, slice: &CudaSlice<T>) -> u64 {
        let (ptr, _sync) = slice.device_ptr(slice.stream());
        ptr
    }

    /// [`Gpu::device_ptr`] for a slice the kernel writes.
    pub fn device_ptr_mut<T>(&self, slice: &mut CudaSlice<T>) -> u64 {
        let stream = slice.stream().clone();
        let (ptr, _sync) = slice.device_ptr_mut(&stream);
        ptr
    }
}

#[cfg(test)]
mod tests {
    use super::Lead;
    use std::time::Duration;

    #[test]
    fn leads_read_from_their_names_and_say_what_they_are() {
        assert_eq!(Lead::parse("repeat"), Some(Lead::Repeat));
        assert_eq!(Lead::parse("idle"), Some(Lead::Idle));
        assert_eq!(Lead::parse("hold:200"), Some(Lead::Hold(Duration::from_micros(200))));
        for wrong in ["", "hold", "hold:", "hold:-1", "hold:1.5", "Repeat"] {
            assert_eq!(Lead::parse(wrong), None, "{wrong:?}");
        }
        assert!(Lead::Repeat.describe().contains("untimed twin"));
        assert!(Lead::Hold(Duration::from_micros(200)).describe().contains("200 us"));
    }
}
