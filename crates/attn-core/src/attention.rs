//! The backend trait.

use crate::{
    BackwardOptions, Buffer, DType, Error, GradInputs, Gradients, Inputs, Outputs, Plan, Problem, Result,
};
use std::time::{Duration, Instant};

/// What kind of hardware a backend computes on; [`Attention::availability`] reports it, so that
/// the facade can rank backends without knowing them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// A hardware GPU.
    Gpu,
    /// A GPU API implemented in software on the CPU (e.g. Mesa's lavapipe): correct, slow.
    SoftwareGpu,
}

/// Whether a backend can run on this machine.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Availability {
    /// It can; `device` names what it runs on.
    Available {
        /// e.g. "AMD EPYC (2 threads, avx512f)" or "NVIDIA H100 80GB HBM3 (sm_90)".
        device: String,
        /// What kind of device that is.
        kind: DeviceKind,
    },
    /// It cannot, and why (missing library, no adapter, not compiled in).
    Unavailable {
        /// A sentence a user can act on.
        reason: String,
    },
}

impl Availability {
    /// Whether the backend is usable.
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available { .. })
    }
}

/// How a backend rounds: its numerical promise, which decides the tolerance `attn-verify` holds
/// it to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Numerics {
    /// Exact arithmetic, rounded once to the output dtype.
    Exact,
    /// f32 scores, probabilities and accumulation; output rounded once.
    F32Accumulate,
    /// f32 scores and accumulation, but the probabilities P rounded to the input dtype before
    /// the P·V product (tensor-core kernels, as FlashAttention does).
    LowPrecisionP,
}

/// An exact scaled-dot-product attention forward pass:
/// `o[b,h,i] = Σ_j softmax_j(scale · q[b,h,i] · k[b,g(h),j] + mask(i,j)) v[b,g(h),j]`.
///
/// Object-safe, so applications can hold a `Box<dyn Attention>` chosen at run time. The life of a
/// call: [`plan`](Attention::plan) (cheap, validates everything and can be printed), then
/// [`prepare`](Attention::prepare) (moves inputs to the device), then any number of
/// [`Prepared::run`], then [`Prepared::read`]. [`forward`](Attention::forward) does all of it.
pub trait Attention: Send + Sync {
    /// A short, stable name (`cpu-flash`, `cuda`, `wgpu`), used on the command line.
    fn name(&self) -> &str;

    /// Whether this backend can run here, and if not, why. Never panics, even when drivers or
    /// libraries are missing.
    fn availability(&self) -> Availability;

    /// How this backend rounds problems of `dtype` (default: f32 throughout).
    fn numerics(&self, dtype: DType) -> Numerics {
        let _ = dtype;
        Numerics::F32Accumulate
    }

    /// Decides how to run `problem`, or says why it cannot: unsupported head dim or dtype, or a
    /// launch over the device's limits. No device work happens here: nothing is allocated,
    /// loaded or launched on the device. A GPU backend may open the device once to read its
    /// limits, and compile on the host (cached) to report registers and spills; its docs say so.
    fn plan(&self, problem: &Problem) -> Result<Plan>;

    /// Makes the inputs resident where the backend computes (device buffers for GPUs), ready for
    /// repeated runs. `plan` must come from this backend's [`plan`](Attention::plan).
    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>>;

    /// Plans, prepares, runs once and reads the result into `outputs`. Returns the plan used.
    fn forward(&self, problem: &Problem, inputs: Inputs<'_>, outputs: Outputs<'_>) -> Result<Plan> {
        problem.check_outputs(&outputs)?;
        let plan = self.plan(problem)?;
        let mut prepared = self.prepare(&plan, inputs)?;
        prepared.run()?;
        prepared.read(outputs)?;
        Ok(plan)
    }

    /// Decides how to run the backward pass of `problem` ([`crate::backward`]), or says why it
    /// cannot, with the same promise as [`plan`](Attention::plan): no device work. The default
    /// is the typed refusal of a backend without a backward pass.
    fn plan_backward(&self, problem: &Problem, options: BackwardOptions) -> Result<Plan> {
        let _ = options;
        problem.validate_backward()?;
        Err(Error::Unsupported {
            backend: self.name().into(),
            what: format!(
                "{problem}: this backend has no backward pass (cpu-reference, cpu-flash, cuda and wgpu have one)"
            ),
        })
    }

    /// Runs a backward `plan` made by this backend's [`plan_backward`] over buffers that
    /// [`Problem::check_backward`] accepted for its problem, writing the gradients into `grads`.
    /// The default refuses, as [`plan_backward`]'s does.
    ///
    /// [`plan_backward`]: Attention::plan_backward
    fn run_backward(&self, plan: &Plan, inputs: GradInputs<'_>, grads: Gradients<'_>) -> Result<()> {
        let _ = (inputs, grads);
        Err(Error::Unsupported {
            backend: self.name().into(),
            what: format!("{}: this backend plans a backward pass but does not run one", plan.problem),
        })
    }

    /// Writes the gradients of q, k and v into `grads`, from the forward's inputs, output and
    /// log-sum-exp and the gradient of the loss with respect to the output
    /// ([`crate::backward`]): checks the buffers ([`Problem::check_backward`]), plans
    /// ([`plan_backward`](Attention::plan_backward)) and runs the plan
    /// ([`run_backward`](Attention::run_backward)). Returns the plan used.
    fn backward(
        &self,
        problem: &Problem,
        options: BackwardOptions,
        inputs: GradInputs<'_>,
        grads: Gradients<'_>,
    ) -> Result<Plan> {
        problem.check_backward(&inputs, &grads)?;
        let plan = self.plan_backward(problem, options)?;
        self.run_backward(&plan, inputs, grads)?;
        Ok(plan)
    }
}

/// A problem with its inputs resident on the backend's device.
pub trait Prepared {
    /// The plan this was prepared for.
    fn plan(&self) -> &Plan;

    /// Computes the attention once and returns the time the computation took on the device
    /// (device timers where the backend has them; no host-device copies are included).
    fn run(&mut self) -> Result<Duration>;

    /// [`run`](Prepared::run) as a benchmark times it: a backend whose timer would otherwise
    /// also count the host's launch may first queue work of its own (the CUDA backend: an
    /// untimed run of the same kernel), so that the time is the device's in a stream of such
    /// calls. The default is `run`.
    fn run_timed(&mut self) -> Result<Duration> {
        self.run()
    }

    /// Copies the result of the last [`run`](Prepared::run) into `outputs`.
    fn read(&mut self, outputs: Outputs<'_>) -> Result<()>;

    /// Device memory this call holds (inputs, outputs, any workspace) as the device's own
    /// allocator measured it, for backends with device memory; `None` for host backends.
    fn device_bytes(&self) -> Option<u64> {
        None
    }
}

/// A [`Prepared`] for backends that compute on the host: inputs stay where they are, outputs go
/// to owned buffers, and `compute` writes them.
pub struct HostPrepared<'a, F> {
    plan: Plan,
    inputs: Inputs<'a>,
    o: Buffer,
    lse: Option<Vec<f32>>,
    compute: F,
}

impl<'a, F> HostPrepared<'a, F>
where
    F: FnMut(&Plan, &Inputs<'a>, Outputs<'_>) -> Result<()>,
{
    /// Checks the inputs against the plan's problem and allocates the outputs.
    pub fn new(plan: &Plan, inputs: Inputs<'a>, compute: F) -> Result<Self> {
        let p = &plan.problem;
        p.check_inputs(&inputs)?;
        let o = Buffer::zeros(p.dtype, p.required_lens()[3].1);
        let lse = p.params.return_lse.then(|| vec![0.0; p.lse_len()]);
        Ok(HostPrepared { plan: plan.clone(), inputs, o, lse, compute })
    }
}

impl<'a, F> Prepared for HostPrepared<'a, F>
where
    F: FnMut(&Plan, &Inputs<'a>, Outputs<'_>) -> Result<()>,
{
    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn run(&mut self) -> Result<Duration> {
        let t = Instant::now();
        let outputs = Outputs { o: self.o.as_data_mut(), lse: self.lse.as_deref_mut() };
        (self.compute)(&self.plan, &self.inputs, outputs)?;
        Ok(t.elapsed())
    }

    fn read(&mut self, mut outputs: Outputs<'_>) -> Result<()> {
        self.plan.problem.check_outputs(&outputs)?;
        outputs.o.copy_view_from(self.o.as_data(), &self.plan.problem)?;
        if let (Some(dst), Some(src)) = (outputs.lse.as_deref_mut(), &self.lse) {
            dst.copy_from_slice(src);
        }
        Ok(())
    }
}
