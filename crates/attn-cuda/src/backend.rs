//! The `cuda` backend behind [`Attention`]: the Ampere/Ada FlashAttention-2-class kernel, and on
//! Hopper (compute capability 9.0) the warp-specialized wgmma/TMA kernel where it applies.

use crate::ampere::{self, launch::KernelParams};
use crate::hopper::{self, launch::Bound, split::Split};
use crate::options::{Family, Options};
use crate::runtime::{Gpu, Lead, driver};
use crate::tensors::{DeviceTensors, from_bits};
use attn_core::{
    Attention, Availability, DeviceKind, Error, Execution, Inputs, Numerics, Outputs, Plan, Prepared,
    Problem, Result, Tiles,
};
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Whether devices of compute capability 9.0 get the Hopper family without being asked
/// (`ATTN_CUDA_FAMILY=hopper`): on since it passed `attn verify` on the H100 (full grid, 36 of 36
/// f16/bf16 cases, bench/results/2026-11-25-h100-hopper-62e8e71).
const HOPPER_BY_DEFAULT: bool = true;

/// One specialisation of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kernel {
    Ampere(ampere::Variant),
    Hopper(hopper::Variant),
}

impl Kernel {
    fn name(&self) -> String {
        match self {
            Kernel::Ampere(v) => v.name(),
            Kernel::Hopper(v) => v.name(),
        }
    }

    /// The specialisation a plan names, from either family's list (kernels planned with forced
    /// tiles are found among the loaded ones instead).
    fn named(name: &str) -> Option<Kernel> {
        let ampere = ampere::Variant::all().into_iter().map(Kernel::Ampere);
        let hopper = hopper::Variant::all().into_iter().map(Kernel::Hopper);
        ampere.chain(hopper).find(|k| k.name() == name)
    }

    fn shared_bytes(&self) -> u32 {
        match self {
            Kernel::Ampere(v) => v.shared_bytes(),
            Kernel::Hopper(v) => v.shared_bytes(),
        }
    }
}

/// Which family plans a problem, decided before either plans it.
enum Choice {
    /// The Hopper kernel, already chosen, with its launch and how it deals out the work.
    Hopper(hopper::Variant, attn_core::Launch, Split),
    /// The Ampere/Ada kernel, and why where the device would otherwise take the Hopper one.
    Ampere(Option<String>),
}

/// What a family's planner decided: the kernel, its launch, what the plan says about it, and
/// the device memory the launch holds beyond the tensors (for the plan's memory note).
struct Planned {
    kernel: Kernel,
    launch: attn_core::Launch,
    notes: Vec<String>,
    tiles: Tiles,
    workspace: String,
}

/// An open device and the specialisations loaded on it so far.
struct Device {
    gpu: Gpu,
    kernels: Mutex<HashMap<Kernel, Arc<Loaded>>>,
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
    options: Options,
}

impl Cuda {
    /// The backend on device 0 with the default options (nothing is opened until it is used).
    pub fn new() -> Self {
        Self::default()
    }

    /// The backend on device 0 with `options`.
    pub fn with_options(options: Options) -> Self {
        Cuda { device: OnceLock::new(), options }
    }

    /// The backend with the options of the environment ([`Options::from_env`]; every variable
    /// in `crate::options::KNOBS`), or the error that names a variable whose value cannot be read.
    pub fn from_env() -> Result<Self> {
        Ok(Self::with_options(Options::from_env()?))
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

    /// The specialisation `which`, compiled for this device and loaded (once per process).
    fn kernel(&self, dev: &Device, which: Kernel) -> Result<Arc<Loaded>> {
        if let Some(k) = dev.kernels.lock().unwrap_or_else(|e| e.into_inner()).get(&which) {
            return Ok(k.clone());
        }
        let info = dev.gpu.info();
        let arch = dev.gpu.arch().ok_or_else(|| Error::Unsupported {
            backend: "cuda".into(),
            what: format!(
                "compute capability {}.{}: this backend is built for sm_80, sm_86, sm_89 and sm_90",
                info.compute_capability.0, info.compute_capability.1
            ),
        })?;
        let kernel = match which {
            Kernel::Ampere(v) => dev.gpu.kernel(&v.request(arch), "attn_fwd")?,
            Kernel::Hopper(v) => {
                let req = hopper::with_experiments(
                    v.request(),
                    self.options.hopper.defines.as_deref().unwrap_or_default(),
                );
                dev.gpu.kernel(&req, "attn_fwd_sm90")?
            }
        };
        dev.gpu.set_max_dynamic_shared(&kernel.function, which.shared_bytes())?;
        let attrs = dev.gpu.attributes(&kernel.function)?;
        let spills = kernel.resources.as_ref().map_or(0, |r| r.spill_bytes());
        let loaded = Arc::new(Loaded {
            function: kernel.function,
            registers: attrs.registers,
            spill_bytes: spills.max(attrs.local_bytes),
        });
        dev.kernels.lock().unwrap_or_else(|e| e.into_inner()).insert(which, loaded.clone());
        Ok(loaded)
    }

    /// Which family plans `problem` on `dev`. The Hopper family where the device is sm_90 and
    /// it runs the problem, with the reason in the plan where it does not; any Hopper knob
    /// (`ATTN_CUDA_FORM`, `_SM90_TILES`, `_SM90_GRID`, `_SM90_SPLIT`, `_SM90_TURNS`,
    /// `_SM90_TRIM`, `_SM90_QSLOTS`, `_SM90_BLOCKS`, `_SM90_TRACE`, `_SM90_DEFINES`) asks for the Hopper kernel, so that a problem it cannot run is then an error rather than a silent run of the
    /// other family.
    fn choose_family(&self, dev: &Device, problem: &Problem) -> Result<Choice> {
        let info = dev.gpu.info();
        let (asked, sm90) = (self.options.family, &self.options.hopper);
        if asked == Some(Family::Ampere) {
            return Ok(Choice::Ampere(None));
        }
        let wanted = asked == Some(Family::Hopper) || sm90.any();
        if info.compute_capability != (9, 0) {
            return match wanted {
                true => Err(Error::Unsupported {
                    backend: "cuda".into(),
                    what: format!(
                        "the Hopper family (ATTN_CUDA_FAMILY=hopper or a Hopper knob) needs compute capability \
                         9.0 (sm_90a); {info} is not one"
                    ),
                }),
                false => Ok(Choice::Ampere(None)),
            };
        }
        if !wanted && !HOPPER_BY_DEFAULT {
            return Ok(Choice::Ampere(None));
        }
        match hopper::plan::plan(problem, &info.limits, info.sm_count, sm90) {
            Ok((variant, launch, split)) => Ok(Choice::Hopper(variant, launch, split)),
            Err(e) if wanted => Err(e),
            Err(e) => Ok(Choice::Ampere(Some(format!(
                "the Hopper family does not run this problem ({e}): the Ampere/Ada family does"
            )))),
        }
    }

    /// The plan of the Ampere/Ada family.
    fn plan_ampere(&self, dev: &Device, problem: &Problem) -> Result<Planned> {
        let (variant, launch, mut notes) =
            ampere::plan::choose(problem, &dev.gpu.info().limits, self.options.rank)?;
        let (kernel, launch) = self.load_for(dev, Kernel::Ampere(variant), launch)?;
        let regs_per_sm = 65536 / (kernel.registers * variant.threads()).max(1);
        let smem_per_sm = dev.gpu.info().limits.shared_per_block_optin / variant.shared_bytes().max(1);
        notes.push(format!(
            "at most {} block(s) per SM (registers allow {regs_per_sm}, shared memory {smem_per_sm})",
            regs_per_sm.min(smem_per_sm).max(1)
        ));
        let tiles =
            Tiles { block_m: variant.block_m(), block_n: variant.block_n, stages: variant.stages as usize };
        Ok(Planned {
            kernel: Kernel::Ampere(variant),
            launch,
            notes,
            tiles,
            workspace: "; no workspace".into(),
        })
    }

    /// Compiles and loads `which` for its plan, fills in the registers and spills the compiler
    /// reports, and validates the launch again now that they are known.
    fn load_for(
        &self,
        dev: &Device,
        which: Kernel,
        mut launch: attn_core::Launch,
    ) -> Result<(Arc<Loaded>, attn_core::Launch)> {
        let kernel = self.kernel(dev, which)?;
        launch.registers_per_thread = Some(kernel.registers);
        launch.spill_bytes = Some(kernel.spill_bytes);
        launch.validate(&which.name(), &dev.gpu.info().limits)?;
        Ok((kernel, launch))
    }

    /// The plan of the Hopper family, for the variant and launch it chose.
    fn plan_hopper(
        &self,
        dev: &Device,
        problem: &Problem,
        variant: hopper::Variant,
        launch: attn_core::Launch,
        split: Split,
    ) -> Result<Planned> {
        let (kernel, launch) = self.load_for(dev, Kernel::Hopper(variant), launch)?;
        let mut notes = variant.notes(problem, &launch, split);
        notes.push(format!(
            "{} registers per thread at entry (the compiler's allocation under the launch bound), 1 CTA per SM",
            kernel.registers
        ));
        let tiles =
            Tiles { block_m: variant.block_m(), block_n: variant.block_n, stages: variant.stages as usize };
        let workspace = split.workspace(&variant);
        Ok(Planned { kernel: Kernel::Hopper(variant), launch, notes, tiles, workspace })
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
        let Planned { kernel, launch, mut notes, tiles, workspace } =
            match self.choose_family(&dev, problem)? {
                Choice::Hopper(variant, launch, split) => {
                    self.plan_hopper(&dev, problem, variant, launch, split)?
                }
                Choice::Ampere(why) => {
                    let mut planned = self.plan_ampere(&dev, problem)?;
                    planned.notes.extend(why);
                    planned
                }
            };
        let elems: usize = problem.required_lens().iter().map(|(_, n)| n).sum();
        let bytes = 2 * elems + if problem.params.return_lse { 4 * problem.lse_len() } else { 0 };
        notes.push(format!("device memory {bytes} B: q, k, v, o and lse{workspace}, linear in S"));
        notes.push(format!(
            "benchmarks time each launch by CUDA events, {}",
            self.options.timing_lead.describe()
        ));
        Ok(Plan {
            backend: self.name().into(),
            kernel: kernel.name(),
            problem: *problem,
            tiles,
            execution: Execution::Gpu(launch),
            notes,
            payload: Default::default(),
        })
    }

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        plan.check_for(self.name(), &plan.problem)?;
        let problem = &plan.problem;
        problem.check_inputs(&inputs)?;
        let dev = self.device()?;
        // The plan decides what runs: the kernel it names, with the launch it holds.
        let loaded = dev
            .kernels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .find(|k| k.name() == plan.kernel)
            .copied();
        let which = loaded.or_else(|| Kernel::named(&plan.kernel)).ok_or_else(|| Error::PlanMismatch {
            what: format!("`{}` is not a kernel of the cuda backend", plan.kernel),
        })?;
        let kernel = self.kernel(&dev, which)?;
        // Free device memory before and after the allocations: what this call holds, measured.
        let free =
            || dev.gpu.context().mem_get_info().map(|(free, _)| free as u64).map_err(driver("cuMemGetInfo"));
        let free_before = free()?;
        let Execution::Gpu(launch) = &plan.execution else {
            return Err(Error::PlanMismatch { what: "a cuda plan must hold a GPU launch".into() });
        };
        let tensors = DeviceTensors::upload(dev.gpu.stream(), problem, &inputs)?;
        let stream = dev.gpu.stream();
        let params = match which {
            Kernel::Ampere(_) => Params::Ampere(KernelParams::new(&tensors, stream, problem)),
            Kernel::Hopper(v) => {
                let split = match self.options.hopper.splits() {
                    true => v.split(problem, launch.grid[0]),
                    false => Split::none(v.tiles(problem).min(i32::MAX as u64) as u32),
                };
                let trace = self.options.hopper.trace.as_deref();
                Params::Hopper(Box::new(Bound::new(
                    &tensors,
                    stream,
                    problem,
                    &v,
                    &split,
                    launch.grid[0],
                    trace,
                )?))
            }
        };
        dev.gpu.stream().synchronize().map_err(driver("cuStreamSynchronize"))?;
        let device_bytes = free_before.saturating_sub(free()?);
        let cfg = LaunchConfig {
            grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
            block_dim: (launch.block[0], launch.block[1], launch.block[2]),
            shared_mem_bytes: launch.dynamic_shared_bytes,
        };
        let lead = self.options.timing_lead;
        Ok(Box::new(CudaPrepared {
            plan: plan.clone(),
            dev,
            kernel,
            tensors,
            params,
            cfg,
            device_bytes,
            lead,
        }))
    }
}

/// The parameter block of either family's kernel (the Hopper one's with the buffers it points
/// at beyond the tensors).
enum Params {
    Ampere(KernelParams),
    Hopper(Box<Bound>),
}

struct CudaPrepared {
    plan: Plan,
    dev: Arc<Device>,
    kernel: Arc<Loaded>,
    tensors: DeviceTensors,
    params: Params,
    cfg: LaunchConfig,
    device_bytes: u64,
    /// What [`Gpu::time`] queues ahead of each launch a benchmark times (`run_timed`).
    lead: Lead,
}

impl CudaPrepared {
    fn launch_timed(&mut self, lead: Lead) -> Result<Duration> {
        let (kernel, params, cfg) = (&self.kernel, &self.params, self.cfg);
        self.dev.gpu.time(lead, |stream| {
            let mut builder = stream.launch_builder(&kernel.function);
            match params {
                Params::Ampere(p) => builder.arg(p),
                Params::Hopper(bound) => builder.arg(&bound.params),
            };
            // SAFETY: the parameter block points at buffers owned by `self.tensors`, sized by
            // Problem::required_lens for the strides the kernel reads, and the launch is the
            // plan's, validated against the device's limits.
            unsafe { builder.launch(cfg) }.map(|_| ()).map_err(driver("cuLaunchKernel"))
        })
    }
}

impl Prepared for CudaPrepared {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    /// One launch, timed by CUDA events around it on the idle stream (so the time also holds
    /// the launch's way to the device); launch and execution errors are both checked.
    fn run(&mut self) -> Result<Duration> {
        self.launch_timed(Lead::Idle)
    }

    /// The launch timed behind the lead ([`Gpu::time`]: by default an untimed launch of the same
    /// kernel first, so that the timed one runs back to back with it).
    fn run_timed(&mut self) -> Result<Duration> {
        self.launch_timed(self.lead)
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
