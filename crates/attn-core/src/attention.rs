//! The backend trait.

use crate::{Inputs, Outputs, Plan, Problem, Result};
use std::time::Duration;

/// What kind of hardware a backend computes on; [`Attention::kind`] lets the facade rank
/// backends without knowing them.
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

    /// Decides how to run `problem`, or says why it cannot: unsupported head dim or dtype, or a
    /// launch over the device's limits. No device work happens here.
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
}

/// A problem with its inputs resident on the backend's device.
pub trait Prepared {
    /// The plan this was prepared for.
    fn plan(&self) -> &Plan;

    /// Computes the attention once and returns the time the computation took on the device
    /// (device timers where the backend has them; no host-device copies are included).
    fn run(&mut self) -> Result<Duration>;

    /// Copies the result of the last [`run`](Prepared::run) into `outputs`.
    fn read(&mut self, outputs: Outputs<'_>) -> Result<()>;
}
