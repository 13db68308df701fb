//! The `cuda` backend: the Ampere/Ada FlashAttention-2-class kernel behind [`Attention`].

use crate::launch::{DeviceTensors, KernelParams, from_bits};
use crate::plan::{self, Variant};
use crate::{Gpu, driver};
use attn_core::{
    Attention, Availability, DeviceKind, Error, Execution, Inputs, Numerics, Outputs, Plan, Prepared,
    Problem, Result, Tiles,
};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The kernel source, compiled at run time for the device's exact architecture.
pub const SOURCE: &str = include_str!("../kernels/flash_fwd.cu");

/// An open device and the specialisations loaded on it so far.
struct Device {
    gpu: Gpu,
    kernels: Mutex<HashMap<Variant, Arc<Loaded>>>,
}

/// One loaded specialisation and what the compiler and driver said about it.
struct Loaded {
    function: CudaFunction,
    registers: u32,
    spill_bytes: u32,
}

/// The CUDA backend on device 0. Opening the device and compiling kernels happen on first use;
/// on a machine without CUDA the backend reports itself unavailable, with the reason.
#[derive(Default)]
pub struct Cuda {
    device: OnceLock<std::result::Result<Arc<Device>, String>>,
    /// A forced tile rank, or why `ATTN_CUDA_RANK` could not be read.
    rank: Option<std::result::Result<usize, String>>,
}

impl Cuda {
    /// The backend on device 0 (nothing is opened until it is used).
    pub fn new() -> Self {
        Self::default()
    }

    /// Plans with the tile configuration of this rank in [`plan::candidates`] (0 = preferred)
    /// instead of the first that fits: for tuning, and to verify every compiled configuration.
    pub fn with_rank(mut self, rank: usize) -> Self {
        self.rank = Some(Ok(rank));
        self
    }

    /// [`Cuda::new`], with the rank of `ATTN_CUDA_RANK` when it is set (see [`Cuda::with_rank`]);
    /// a value that is not a number makes every plan fail with the reason.
    pub fn from_env() -> Self {
        let rank = std::env::var("ATTN_CUDA_RANK").ok().map(|r| {
            r.trim().parse().map_err(|_| format!("ATTN_CUDA_RANK={r} is not a rank (0, 1, 2, ...)"))
        });
        Cuda { rank, ..Self::default() }
    }

    fn device(&self) -> Result<Arc<Device>> {
        self.device
            .get_or_init(|| {
                let gpu = Gpu::open(0).map_err(|e| match e {
                    Error::Unavailable { reason, .. } => reason,
                    other => other.to_string(),
                })?;
                Ok(Arc::new(Device { gpu, kernels: Mutex::new(HashMap::new()) }))
            })
            .clone()
            .map_err(|reason| Error::Unavailable { backend: "cuda".into(), reason })
    }

    /// The specialisation `variant`, compiled for this device and loaded (once per process).
    fn kernel(&self, dev: &Device, variant: Variant) -> Result<Arc<Loaded>> {
        if let Some(k) = dev.kernels.lock().unwrap_or_else(|e| e.into_inner()).get(&variant) {
            return Ok(k.clone());
        }
        let info = dev.gpu.info();
        let arch = dev.gpu.arch().ok_or_else(|| Error::Unsupported {
            backend: "cuda".into(),
            what: format!(
                "compute capability {}.{}: this family is built for sm_80, sm_86, sm_89 and sm_90",
                info.compute_capability.0, info.compute_capability.1
            ),
        })?;
        let kernel = dev.gpu.kernel(&variant.request(arch), "attn_fwd")?;
        dev.gpu.set_max_dynamic_shared(&kernel.function, variant.shared_bytes())?;
        let attrs = dev.gpu.attributes(&kernel.function)?;
        let spills = kernel.resources.as_ref().map_or(0, |r| r.spill_bytes());
        let loaded = Arc::new(Loaded {
            function: kernel.function,
            registers: attrs.registers,
            spill_bytes: spills.max(attrs.local_bytes),
        });
        dev.kernels.lock().unwrap_or_else(|e| e.into_inner()).insert(variant, loaded.clone());
        Ok(loaded)
    }
}

impl Attention for Cuda {
    fn name(&self) -> &str {
        "cuda"
    }

    fn availability(&self) -> Availability {
        match self.device() {
            Ok(dev) => Availability::Available { device: dev.gpu.info().to_string(), kind: DeviceKind::Gpu },
            Err(e) => Availability::Unavailable {
                reason: match e {
                    Error::Unavailable { reason, .. } => reason,
                    other => other.to_string(),
                },
            },
        }
    }

    fn numerics(&self, _dtype: attn_core::DType) -> Numerics {
        Numerics::LowPrecisionP
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let dev = self.device()?;
        let rank = match &self.rank {
            None => None,
            Some(Ok(r)) => Some(*r),
            Some(Err(what)) => return Err(Error::Unsupported { backend: "cuda".into(), what: what.clone() }),
        };
        let (variant, mut launch, mut notes) = plan::choose(problem, &dev.gpu.info().limits, rank)?;
        let kernel = self.kernel(&dev, variant)?;
        launch.registers_per_thread = Some(kernel.registers);
        launch.spill_bytes = Some(kernel.spill_bytes);
        // Checked again now that the registers are known.
        launch.validate(&variant.name(), &dev.gpu.info().limits)?;
        let regs_per_sm = 65536 / (kernel.registers * variant.threads()).max(1);
        let smem_per_sm = dev.gpu.info().limits.shared_per_block_optin / variant.shared_bytes().max(1);
        notes.push(format!(
            "at most {} block(s) per SM (registers allow {regs_per_sm}, shared memory {smem_per_sm})",
            regs_per_sm.min(smem_per_sm).max(1)
        ));
        let elems: usize = problem.required_lens().iter().map(|(_, n)| n).sum();
        let bytes = 2 * elems + if problem.params.return_lse { 4 * problem.lse_len() } else { 0 };
        notes.push(format!("device memory {bytes} B: q, k, v, o and lse only; no workspace, linear in S"));
        Ok(Plan {
            backend: self.name().into(),
            kernel: variant.name(),
            problem: *problem,
            tiles: Tiles {
                block_m: variant.block_m(),
                block_n: variant.block_n,
                stages: variant.stages as usize,
            },
            execution: Execution::Gpu(launch),
            notes,
        })
    }

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        plan.check_for(self.name(), &plan.problem)?;
        let problem = &plan.problem;
        problem.check_inputs(&inputs)?;
        let dev = self.device()?;
        // The plan decides what runs: the variant it names, with the launch it holds.
        let variant = Variant::all().into_iter().find(|v| v.name() == plan.kernel).ok_or_else(|| {
            Error::PlanMismatch { what: format!("`{}` is not a kernel of the cuda backend", plan.kernel) }
        })?;
        let kernel = self.kernel(&dev, variant)?;
        // Free device memory before and after the allocations: what this call holds, measured.
        let free =
            || dev.gpu.context().mem_get_info().map(|(free, _)| free as u64).map_err(driver("cuMemGetInfo"));
        let free_before = free()?;
        let tensors = DeviceTensors::upload(dev.gpu.stream(), problem, &inputs)?;
        dev.gpu.stream().synchronize().map_err(driver("cuStreamSynchronize"))?;
        let device_bytes = free_before.saturating_sub(free()?);
        let params = tensors.params(dev.gpu.stream(), problem);
        let Execution::Gpu(launch) = &plan.execution else {
            return Err(Error::PlanMismatch { what: "a cuda plan must hold a GPU launch".into() });
        };
        let cfg = LaunchConfig {
            grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
            block_dim: (launch.block[0], launch.block[1], launch.block[2]),
            shared_mem_bytes: launch.dynamic_shared_bytes,
        };
        Ok(Box::new(CudaPrepared { plan: plan.clone(), dev, kernel, tensors, params, cfg, device_bytes }))
    }
}

struct CudaPrepared {
    plan: Plan,
    dev: Arc<Device>,
    kernel: Arc<Loaded>,
    tensors: DeviceTensors,
    params: KernelParams,
    cfg: LaunchConfig,
    device_bytes: u64,
}

impl Prepared for CudaPrepared {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Kernel time between two CUDA events; launch and execution errors are both checked.
    fn run(&mut self) -> Result<Duration> {
        let stream = self.dev.gpu.stream();
        let start =
            stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("cuEventRecord"))?;
        let mut builder = stream.launch_builder(&self.kernel.function);
        builder.arg(&self.params);
        // SAFETY: the parameter block points at buffers owned by `self.tensors`, sized by
        // Problem::required_lens for the strides the kernel reads, and the launch is the plan's,
        // validated against the device's limits.
        unsafe { builder.launch(self.cfg) }.map_err(driver("cuLaunchKernel"))?;
        let end =
            stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("cuEventRecord"))?;
        stream.synchronize().map_err(driver("kernel execution (cuStreamSynchronize)"))?;
        let ms = start.elapsed_ms(&end).map_err(driver("cuEventElapsedTime"))?;
        Ok(Duration::from_secs_f64(ms as f64 / 1e3))
    }

    /// Free device memory before the buffers were allocated minus after (cuMemGetInfo; the
    /// driver allocates in pages, so this rounds up). The kernel allocates nothing more.
    fn device_bytes(&self) -> Option<u64> {
        Some(self.device_bytes)
    }

    fn read(&mut self, mut outputs: Outputs<'_>) -> Result<()> {
        let problem = self.plan.problem;
        problem.check_outputs(&outputs)?;
        let stream = self.dev.gpu.stream();
        let bits = stream.clone_dtoh(&self.tensors.o).map_err(driver("copy o to the host"))?;
        outputs.o.copy_view_from(from_bits(problem.dtype, bits).as_data(), &problem)?;
        if let (Some(dst), Some(src)) = (outputs.lse.as_deref_mut(), &self.tensors.lse) {
            let lse = stream.clone_dtoh(src).map_err(driver("copy lse to the host"))?;
            dst.copy_from_slice(&lse);
        }
        Ok(())
    }
}
