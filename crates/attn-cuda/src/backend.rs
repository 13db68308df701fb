//! The `cuda` backend behind [`Attention`]: the Ampere/Ada FlashAttention-2-class kernel, and on
//! Hopper (compute capability 9.0) the warp-specialized wgmma/TMA kernel where it applies.

use crate::ampere::{self, launch::KernelParams};
use crate::compile::{Arch, CompileRequest, compile_cached};
use crate::decode;
use crate::hopper::{self, launch::Bound, split::Split};
use crate::options::{Family, Options};
use crate::runtime::{Gpu, Lead, driver};
use crate::tensors::{DeviceTensors, from_bits};
use attn_core::{
    Attention, Availability, BackwardOptions, DeviceKind, Error, Execution, Feature, GradInputs, Gradients,
    Inputs, Launch, Numerics, Outputs, Payload, Plan, Prepared, Problem, Result, Tiles,
};
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Whether devices of compute capability 9.0 get the Hopper family without being asked
/// (`ATTN_CUDA_FAMILY=hopper`): on since it passed `attn verify` on the H100 (full grid, 36 of 36
/// f16/bf16 cases, at commit 62e8e71).
const HOPPER_BY_DEFAULT: bool = true;

/// What the backend runs beyond a dense plain or causal softmax: every feature, on both prefill
/// families (the Hopper family hands the combinations its registers cannot hold to the
/// Ampere/Ada one: `hopper::plan`).
pub(crate) const FEATURES: &[Feature] = &Feature::ALL;

/// One specialisation of either family, as a plan chose it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Kernel {
    Ampere(ampere::Variant),
    /// With how its launch deals out the work.
    Hopper(hopper::Variant, Split),
    /// With how its launch cuts the rows and keys.
    Decode(decode::Variant, decode::Split),
}

/// What `plan` chose, carried in [`Plan::payload`] so that `prepare` (and the device-resident
/// calls) run exactly that.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Chosen {
    pub(crate) kernel: Kernel,
    pub(crate) launch: Launch,
    /// The compile request's key ([`CompileRequest::key`]), so that a call finds the loaded
    /// kernel without hashing its source again.
    pub(crate) key: u64,
    /// The device planned for: its name, compute capability and SM count (the Hopper family's
    /// persistent grid is one CTA per SM).
    pub(crate) device: (String, (u32, u32), u32),
    /// The problem planned: the kernel is compiled for its head dim, dtype and mask, so a plan
    /// whose (public) problem was edited since is refused.
    pub(crate) problem: Problem,
}

impl Kernel {
    pub(crate) fn name(&self) -> String {
        match self {
            Kernel::Ampere(v) => v.name(),
            Kernel::Hopper(v, _) => v.name(),
            Kernel::Decode(v, _) => v.name(),
        }
    }

    /// The entry function of its source.
    pub(crate) fn entry(&self) -> &'static str {
        match self {
            Kernel::Ampere(_) => "attn_fwd",
            Kernel::Hopper(..) => "attn_fwd_sm90",
            Kernel::Decode(..) => "attn_decode",
        }
    }

    /// The NVRTC request that compiles it for `arch`.
    pub(crate) fn request(&self, arch: Arch) -> CompileRequest {
        match self {
            Kernel::Ampere(v) => v.request(arch),
            Kernel::Hopper(v, _) => v.request(),
            Kernel::Decode(v, _) => v.request(arch),
        }
    }

    pub(crate) fn shared_bytes(&self) -> u32 {
        match self {
            Kernel::Ampere(v) => v.shared_bytes(),
            Kernel::Hopper(v, _) => v.shared_bytes(),
            Kernel::Decode(v, _) => v.shared_bytes(),
        }
    }
}

/// Which family plans a problem, decided before either plans it.
enum Choice {
    /// The Hopper kernel, already chosen, with its launch and how it deals out the work.
    Hopper(hopper::Variant, Launch, Split),
    /// The Ampere/Ada kernel, and why where the device would otherwise take the Hopper one.
    Ampere(Option<String>),
    /// The decode kernel, already chosen, with its launch, its cut and the planner's notes.
    Decode(decode::Variant, Launch, decode::Split, Vec<String>),
}

/// What a family's planner decided: the kernel, its launch, what the plan says about it, and
/// the device memory the launch holds beyond the tensors (for the plan's memory note).
struct Planned {
    kernel: Kernel,
    launch: Launch,
    notes: Vec<String>,
    tiles: Tiles,
    workspace: String,
}

/// The CUDA backend on device 0. On a machine without CUDA it reports itself unavailable, with
/// the reason.
///
/// What each step of [`Attention`] does here:
/// - `plan` opens the device's context (once) to read its compute capability, SM count and
///   limits, chooses a family and variant, and compiles the variant with NVRTC (host work,
///   cached per process by a hash of the source, headers, defines and architecture) so that the
///   plan can state and check its registers and spills from ptxas's report. It loads no module
///   and allocates nothing on the device.
/// - `prepare` loads the compiled kernel (once per device), sets its shared-memory opt-in and
///   allocates and fills the problem's buffers; it runs the variant and launch the plan holds in
///   its payload, never a kernel looked up again by name.
#[derive(Default)]
pub struct Cuda {
    pub(crate) gpu: OnceLock<std::result::Result<Arc<Gpu>, String>>,
    pub(crate) options: Options,
    /// State for the device-resident calls (`crate::device`): callers' contexts, plans by
    /// problem, workspaces by stream.
    pub(crate) resident: crate::device::Resident,
}

impl Cuda {
    /// The backend on device 0 with the default options (nothing is opened until it is used).
    pub fn new() -> Self {
        Self::default()
    }

    /// The backend on device 0 with `options`.
    pub fn with_options(options: Options) -> Self {
        Cuda { gpu: OnceLock::new(), options, resident: Default::default() }
    }

    /// The backend with the options of the environment ([`Options::from_env`]; every variable
    /// in `crate::options::KNOBS`), or the error that names a variable whose value cannot be read.
    pub fn from_env() -> Result<Self> {
        Ok(Self::with_options(Options::from_env()?))
    }

    /// The backward pass run `runs` times on the same uploaded buffers (for benchmarks), with each
    /// run's device time (its three launches between CUDA events) and the device memory the call
    /// held; the gradients of the last run are written into `grads`.
    pub fn backward_timed(
        &self,
        problem: &Problem,
        options: BackwardOptions,
        inputs: GradInputs<'_>,
        grads: Gradients<'_>,
        runs: usize,
    ) -> Result<(Plan, crate::backward::BackwardTimes)> {
        problem.check_backward(&inputs, &grads)?;
        let gpu = self.gpu()?;
        let plan = crate::backward::run::plan(&gpu, problem, options, &self.options)?;
        let measured = crate::backward::run::run(&gpu, &plan, &inputs, grads, runs, true)?;
        Ok((plan, measured))
    }

    pub(crate) fn gpu(&self) -> Result<Arc<Gpu>> {
        self.gpu
            .get_or_init(|| {
                Gpu::open(0).map(Arc::new).map_err(|e| match e {
                    Error::Unavailable { reason, .. } => reason,
                    other => other.to_string(),
                })
            })
            .clone()
            .map_err(|reason| Error::Unavailable { backend: "cuda".into(), reason })
    }

    /// The architecture this backend compiles for on `gpu`, or why it has none.
    pub(crate) fn arch(gpu: &Gpu) -> Result<Arch> {
        gpu.arch().ok_or_else(|| {
            let (major, minor) = gpu.info().compute_capability;
            Error::Unsupported {
                backend: "cuda".into(),
                what: format!(
                    "compute capability {major}.{minor}: this backend is built for sm_80, sm_86, sm_89 and sm_90"
                ),
            }
        })
    }

    /// Compiles `kernel` for `gpu` (host work, cached per process), fills in the registers and
    /// spills ptxas reports into `launch`, and validates it again now that they are known.
    fn compiled(&self, gpu: &Gpu, kernel: &Kernel, mut launch: Launch) -> Result<Launch> {
        let compiled = compile_cached(&kernel.request(Self::arch(gpu)?))?;
        let resources = compiled.resources_of(kernel.entry());
        launch.registers_per_thread = resources.map(|r| r.registers);
        launch.spill_bytes = resources.map(|r| r.spill_bytes());
        launch.validate(&kernel.name(), &gpu.info().limits)?;
        Ok(launch)
    }

    /// Which family plans `problem` on `gpu`, and why not the decode family where the problem
    /// has its short query length but it cannot run it. The decode family first, on every
    /// architecture, where a GQA group holds few query rows (`decode::plan::applies`); forced
    /// (`ATTN_CUDA_FAMILY=decode`) it runs or fails, and a forced other family, a Hopper knob or
    /// `ATTN_CUDA_DECODE=off` skips it. Otherwise [`Cuda::choose_prefill`].
    fn choose_family(&self, gpu: &Gpu, problem: &Problem) -> Result<(Choice, Option<String>)> {
        let info = gpu.info();
        let (asked, sm90) = (self.options.family, &self.options.hopper);
        let decode_allowed = self.options.decode != Some(false) && !sm90.any();
        let mut why_not = None;
        if asked == Some(Family::Decode) || (asked.is_none() && decode_allowed) {
            match decode::plan::choose(problem, &info.limits, info.sm_count, &self.options.decode_forced) {
                Ok((variant, launch, split, notes)) => {
                    return Ok((Choice::Decode(variant, launch, split, notes), None));
                }
                Err(e) if asked == Some(Family::Decode) => return Err(e),
                Err(e) => {
                    let s = problem.shape;
                    if s.heads_q / s.heads_kv.max(1) * s.seq_q <= decode::plan::MAX_ROWS {
                        why_not = Some(format!(
                            "the decode family does not run this problem ({e}): a prefill family does"
                        ));
                    }
                }
            }
        }
        Ok((self.choose_prefill(gpu, problem)?, why_not))
    }

    /// Which prefill family plans `problem` on `gpu`. The Hopper family where the device is sm_90
    /// and it runs the problem, with the reason in the plan where it does not; any Hopper setting
    /// (`hopper::Settings`) asks for the Hopper kernel, so that a problem it cannot run is then
    /// an error rather than a silent run of the other family.
    fn choose_prefill(&self, gpu: &Gpu, problem: &Problem) -> Result<Choice> {
        let info = gpu.info();
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
    fn plan_ampere(&self, gpu: &Gpu, problem: &Problem) -> Result<Planned> {
        let limits = &gpu.info().limits;
        let (variant, launch, mut notes) = ampere::plan::choose(problem, limits, self.options.rank)?;
        let kernel = Kernel::Ampere(variant);
        let launch = self.compiled(gpu, &kernel, launch)?;
        notes.push(match launch.registers_per_thread {
            Some(registers) => {
                let regs_per_sm = 65536 / (registers * variant.threads()).max(1);
                let smem_per_sm = limits.shared_per_block_optin / variant.shared_bytes().max(1);
                format!(
                    "at most {} block(s) per SM (registers allow {regs_per_sm}, shared memory {smem_per_sm})",
                    regs_per_sm.min(smem_per_sm).max(1)
                )
            }
            None => "registers per thread unknown: ptxas's report was missing from the NVRTC log".into(),
        });
        let tiles =
            Tiles { block_m: variant.block_m(), block_n: variant.block_n, stages: variant.stages as usize };
        Ok(Planned { kernel, launch, notes, tiles, workspace: "; no workspace".into() })
    }

    /// The plan of the Hopper family, for the variant and launch it chose.
    fn plan_hopper(
        &self,
        gpu: &Gpu,
        problem: &Problem,
        variant: hopper::Variant,
        launch: Launch,
        split: Split,
    ) -> Result<Planned> {
        let kernel = Kernel::Hopper(variant, split);
        let launch = self.compiled(gpu, &kernel, launch)?;
        let mut notes = variant.notes(problem, &launch, split);
        notes.push(match launch.registers_per_thread {
            Some(registers) => format!(
                "{registers} registers per thread at entry (the compiler's allocation under the launch bound), \
                 1 CTA per SM"
            ),
            None => "registers per thread unknown: ptxas's report was missing from the NVRTC log".into(),
        });
        let tiles =
            Tiles { block_m: variant.block_m(), block_n: variant.block_n, stages: variant.stages as usize };
        let workspace = split.workspace(&variant);
        Ok(Planned { kernel, launch, notes, tiles, workspace })
    }
    /// The plan of the decode family, for the variant and launch it chose.
    fn plan_decode(
        &self,
        gpu: &Gpu,
        variant: decode::Variant,
        launch: Launch,
        split: decode::Split,
        mut notes: Vec<String>,
    ) -> Result<Planned> {
        let kernel = Kernel::Decode(variant, split);
        let launch = self.compiled(gpu, &kernel, launch)?;
        notes.push(match launch.registers_per_thread {
            Some(registers) => {
                format!("{registers} registers per thread, {} threads per CTA", variant.threads())
            }
            None => "registers per thread unknown: ptxas's report was missing from the NVRTC log".into(),
        });
        let tiles =
            Tiles { block_m: variant.block_m(), block_n: variant.block_n, stages: variant.stages as usize };
        let workspace = split.workspace(&variant);
        Ok(Planned { kernel, launch, notes, tiles, workspace })
    }

    /// The plan of `problem` on `gpu`. Where `host_buffers`, the host-copy path will allocate the
    /// tensors on the device, so they must fit its free memory now; the device-resident calls
    /// run on tensors that already exist there.
    pub(crate) fn plan_with(&self, gpu: &Gpu, problem: &Problem, host_buffers: bool) -> Result<Plan> {
        problem.validate()?;
        let (choice, why_not_decode) = self.choose_family(gpu, problem)?;
        // What the prefill families run beyond plain and causal masks ([`FEATURES`]; the decode
        // family checks its own set in decode/plan.rs).
        if !matches!(choice, Choice::Decode(..)) {
            problem.require_features("cuda", FEATURES)?;
        }
        let Planned { kernel, launch, mut notes, tiles, workspace } = match choice {
            Choice::Decode(variant, launch, split, notes) => {
                self.plan_decode(gpu, variant, launch, split, notes)?
            }
            Choice::Hopper(variant, launch, split) => {
                self.plan_hopper(gpu, problem, variant, launch, split)?
            }
            Choice::Ampere(why) => {
                let mut planned = self.plan_ampere(gpu, problem)?;
                planned.notes.extend(why);
                planned
            }
        };
        notes.extend(why_not_decode);
        let bytes = problem.bytes();
        if host_buffers {
            // The tensors must fit the device's free memory now: a typed error before anything is
            // allocated, instead of a failed allocation halfway through `prepare`.
            let (free, _) = gpu.context().mem_get_info().map_err(driver("cuMemGetInfo"))?;
            if bytes > free as u128 {
                return Err(Error::TooLarge {
                    what: format!(
                        "{problem}: q, k, v, o and lse need {bytes} bytes of device memory, but {} has {free} bytes free",
                        gpu.info().name
                    ),
                });
            }
            notes.push(format!("device memory {bytes} B: q, k, v, o and lse{workspace}, linear in S"));
        } else {
            notes.push(format!("on the caller's tensors ({bytes} B of q, k, v, o and lse){workspace}"));
        }
        notes.push(format!(
            "benchmarks time each launch by CUDA events, {}",
            self.options.timing_lead.describe()
        ));
        let info = gpu.info();
        let chosen = Chosen {
            key: kernel.request(Self::arch(gpu)?).key(),
            device: (info.name.clone(), info.compute_capability, info.sm_count),
            kernel: kernel.clone(),
            launch: launch.clone(),
            problem: *problem,
        };
        Ok(Plan {
            backend: self.name().into(),
            kernel: kernel.name(),
            problem: *problem,
            tiles,
            execution: Execution::Gpu(launch),
            notes,
            payload: Payload::new(chosen),
        })
    }
}

impl Attention for Cuda {
    fn name(&self) -> &str {
        "cuda"
    }

    fn availability(&self) -> Availability {
        match self.gpu() {
            Ok(gpu) => Availability::Available { device: gpu.info().to_string(), kind: DeviceKind::Gpu },
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
        self.plan_with(&*self.gpu()?, problem, true)
    }

    /// The backward family ([`crate::backward`]): compiled and checked against the device's
    /// limits, as `plan` is.
    fn plan_backward(&self, problem: &Problem, options: BackwardOptions) -> Result<Plan> {
        problem.validate_backward()?;
        crate::backward::run::plan(&*self.gpu()?, problem, options, &self.options)
    }

    fn run_backward(&self, plan: &Plan, inputs: GradInputs<'_>, grads: Gradients<'_>) -> Result<()> {
        plan.check_for(self.name(), &plan.problem)?;
        crate::backward::run::run(&*self.gpu()?, plan, &inputs, grads, 1, false).map(|_| ())
    }

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        // The plan decides what runs: the kernel and launch it holds, for the problem it planned.
        let Chosen { kernel, launch, problem: planned, .. } = plan.payload::<Chosen>()?;
        plan.check_for(self.name(), planned)?;
        let problem = &plan.problem;
        problem.check_inputs(&inputs)?;
        if plan.execution != Execution::Gpu(launch.clone()) {
            return Err(Error::PlanMismatch {
                what: format!("the launch of plan `{}` differs from the one its backend chose", plan.kernel),
            });
        }
        let gpu = self.gpu()?;
        let loaded = gpu.kernel(&kernel.request(Self::arch(&gpu)?), kernel.entry())?;
        gpu.set_max_dynamic_shared(&loaded.function, kernel.shared_bytes())?;
        // What the process holds on the device before and after the allocations (the allocator's
        // count, Gpu::memory_use): what this call holds, measured.
        let held_before = gpu.memory_use()?.current;
        let stream = gpu.stream()?;
        let tensors = DeviceTensors::upload(stream, problem, &inputs)?;
        let params = match kernel {
            Kernel::Ampere(_) => Params::Ampere(Box::new(KernelParams::new(
                tensors.pointers(),
                tensors.extras.pointers(),
                problem,
            ))),
            Kernel::Hopper(v, split) => {
                let trace = self.options.hopper.trace.as_deref();
                Params::Hopper(Box::new(Bound::new(
                    tensors.pointers(),
                    tensors.extras.pointers(),
                    stream,
                    problem,
                    v,
                    split,
                    launch.grid[0],
                    trace,
                )?))
            }
            Kernel::Decode(v, split) => Params::Decode(Box::new(decode::launch::Bound::new(
                tensors.pointers(),
                tensors.extras.pointers(),
                stream,
                problem,
                v,
                split,
            )?)),
        };
        let device_bytes = gpu.memory_use()?.current.saturating_sub(held_before);
        let cfg = LaunchConfig {
            grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
            block_dim: (launch.block[0], launch.block[1], launch.block[2]),
            shared_mem_bytes: launch.dynamic_shared_bytes,
        };
        Ok(Box::new(CudaPrepared {
            plan: plan.clone(),
            gpu,
            function: loaded.function,
            tensors,
            params,
            cfg,
            device_bytes,
            lead: self.options.timing_lead,
        }))
    }
}

/// The parameter block of either family's kernel (the Hopper one's with the buffers it points
/// at beyond the tensors).
enum Params {
    Ampere(Box<KernelParams>),
    Hopper(Box<Bound>),
    Decode(Box<decode::launch::Bound>),
}

struct CudaPrepared {
    plan: Plan,
    gpu: Arc<Gpu>,
    function: CudaFunction,
    tensors: DeviceTensors,
    params: Params,
    cfg: LaunchConfig,
    device_bytes: u64,
    /// What [`Gpu::time`] queues ahead of each launch a benchmark times (`run_timed`).
    lead: Lead,
}

impl CudaPrepared {
    fn launch_timed(&mut self, lead: Lead) -> Result<Duration> {
        let (function, params, cfg) = (&self.function, &self.params, self.cfg);
        self.gpu.time(lead, |stream| {
            let mut builder = stream.launch_builder(function);
            match params {
                Params::Ampere(p) => builder.arg(&**p),
                Params::Hopper(bound) => builder.arg(&bound.params),
                Params::Decode(bound) => builder.arg(&bound.params),
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

    /// Device memory the buffers took, as the allocator counts it ([`Gpu::memory_use`] before and
    /// after their allocation). The kernel allocates nothing more.
    fn device_bytes(&self) -> Option<u64> {
        Some(self.device_bytes)
    }

    fn read(&mut self, mut outputs: Outputs<'_>) -> Result<()> {
        let problem = self.plan.problem;
        problem.check_outputs(&outputs)?;
        let stream = self.gpu.stream()?;
        let bits = stream.clone_dtoh(&self.tensors.o).map_err(driver("copy o to the host"))?;
        outputs.o.copy_view_from(from_bits(problem.dtype, bits).as_data(), &problem)?;
        if let (Some(dst), Some(src)) = (outputs.lse.as_deref_mut(), &self.tensors.lse) {
            let lse = stream.clone_dtoh(src).map_err(driver("copy lse to the host"))?;
            dst.copy_from_slice(&lse);
        }
        Ok(())
    }
}
