//! Plans: what a backend will do for a problem, printable and validated before any work starts.
//!
//! The lesson behind this module: a launch configuration that silently disagrees with its kernel
//! (wrong thread count, tiles over the device's shared memory) is the costliest bug a kernel
//! project can have. So every backend turns a [`Problem`] into a [`Plan`] first; GPU plans carry a
//! [`Launch`] that [`Launch::validate`] checks against [`DeviceLimits`] and that a person can read.

use crate::{Error, Problem, Result};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A backend's decision for one problem.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Plan {
    /// The backend that made the plan (and the only one that may run it).
    pub backend: String,
    /// The kernel variant, named by its specialisation (dtype, head dim, tiles, mask).
    pub kernel: String,
    /// The problem it was made for.
    pub problem: Problem,
    /// Tile sizes.
    pub tiles: Tiles,
    /// How the work is spread over the hardware.
    pub execution: Execution,
    /// Anything else a person reading the plan should know (fallbacks taken, padding, ...).
    pub notes: Vec<String>,
    /// The backend's own typed record of what it chose (its kernel variant, launch, options),
    /// so that `prepare` runs exactly what `plan` decided without looking it up again by name.
    #[serde(skip)]
    pub payload: Payload,
}

/// A backend's typed record inside a [`Plan`]: opaque to everyone but the backend that put it
/// there, which reads it back with [`Payload::get`]. Two payloads are equal when they hold equal
/// values of the same type.
#[derive(Clone, Default)]
pub struct Payload(Option<Arc<dyn PayloadValue>>);

/// What a payload may hold: any plain value a backend can compare and print.
trait PayloadValue: Any + Send + Sync + fmt::Debug {
    /// `self == other`, where `other` holds the same type.
    fn equals(&self, other: &dyn PayloadValue) -> bool;
    /// `self` as `Any`, for [`Payload::get`].
    fn as_any(&self) -> &dyn Any;
}

impl<T: Any + Send + Sync + fmt::Debug + PartialEq> PayloadValue for T {
    fn equals(&self, other: &dyn PayloadValue) -> bool {
        other.as_any().downcast_ref::<T>().is_some_and(|o| o == self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Payload {
    /// A payload holding `value`.
    pub fn new<T: Any + Send + Sync + fmt::Debug + PartialEq>(value: T) -> Self {
        Payload(Some(Arc::new(value)))
    }

    /// The value, if this payload holds a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.as_deref().and_then(|v| v.as_any().downcast_ref::<T>())
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => a.equals(b.as_ref()),
            _ => false,
        }
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => write!(f, "Payload({v:?})"),
            None => f.write_str("Payload(none)"),
        }
    }
}

/// Tile sizes of a tiled attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Tiles {
    /// Query rows per block (per task on the CPU).
    pub block_m: usize,
    /// Key rows per inner-loop step.
    pub block_n: usize,
    /// K/V tiles in flight (pipeline depth); 1 when loads are not overlapped.
    pub stages: usize,
}

/// How a plan runs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Execution {
    /// Tasks on CPU threads.
    Cpu {
        /// Worker threads.
        threads: usize,
        /// Independent tasks (batch · heads · query blocks).
        tasks: usize,
        /// The instruction set the inner loops were compiled for.
        isa: String,
    },
    /// One GPU kernel launch (or a sequence of identical ones).
    Gpu(Launch),
}

/// A GPU kernel launch: everything that decides whether it fits the device.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Launch {
    /// Blocks (workgroups) in x, y, z.
    pub grid: [u32; 3],
    /// Threads (invocations) per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared (workgroup) memory per block, bytes.
    pub dynamic_shared_bytes: u32,
    /// Static shared memory per block, bytes, where the compiler reports it.
    pub static_shared_bytes: u32,
    /// Registers per thread, where the compiler reports it.
    pub registers_per_thread: Option<u32>,
    /// Bytes of spill stores + loads per thread, where the compiler reports it.
    pub spill_bytes: Option<u32>,
}

/// What a device allows one block. Read off the device when there is one; [`DeviceLimits::l4`]
/// and [`DeviceLimits::h100`] state the limits of the two CUDA targets we design for, so that
/// plans can be validated on a machine that has neither.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceLimits {
    /// Device name, for messages.
    pub name: String,
    /// Threads per block.
    pub max_threads_per_block: u32,
    /// Shared memory a block may use without opting in (static + dynamic), bytes.
    pub shared_per_block: u32,
    /// Shared memory a block may use after opting in to the larger dynamic limit, bytes.
    pub shared_per_block_optin: u32,
    /// Registers one block may use.
    pub registers_per_block: u32,
    /// Registers one thread may use.
    pub max_registers_per_thread: u32,
    /// Grid size in x, y, z.
    pub max_grid: [u32; 3],
}

impl DeviceLimits {
    /// An NVIDIA L4 (Ada, sm_89): 48 KB of shared memory per block, 99 KB with opt-in.
    pub fn l4() -> Self {
        DeviceLimits {
            name: "NVIDIA L4 (sm_89, stated limits)".into(),
            max_threads_per_block: 1024,
            shared_per_block: 48 * 1024,
            shared_per_block_optin: 99 * 1024,
            registers_per_block: 64 * 1024,
            max_registers_per_thread: 255,
            max_grid: [i32::MAX as u32, 65535, 65535],
        }
    }

    /// An NVIDIA A100 (sm_80): 163 KB of shared memory per block with opt-in.
    pub fn a100() -> Self {
        DeviceLimits {
            name: "NVIDIA A100 (sm_80, stated limits)".into(),
            shared_per_block_optin: 163 * 1024,
            ..Self::l4()
        }
    }

    /// An NVIDIA H100 (sm_90): 227 KB of shared memory per block with opt-in.
    pub fn h100() -> Self {
        DeviceLimits {
            name: "NVIDIA H100 (sm_90, stated limits)".into(),
            shared_per_block_optin: 227 * 1024,
            ..Self::l4()
        }
    }
}

impl Launch {
    /// Threads per block.
    pub fn threads_per_block(&self) -> u32 {
        self.block.iter().product()
    }

    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }

    /// Shared memory per block, static plus dynamic.
    pub fn shared_bytes(&self) -> u32 {
        self.dynamic_shared_bytes + self.static_shared_bytes
    }

    /// Checks the launch against `limits`; the error names the resource, what the plan needs and
    /// what the device allows. Called by every GPU backend before it launches.
    pub fn validate(&self, kernel: &str, limits: &DeviceLimits) -> Result<()> {
        let over = |resource, needed: u64, allowed: u64| Error::OverDeviceLimit {
            kernel: kernel.to_string(),
            resource,
            needed,
            allowed,
            device: limits.name.clone(),
        };
        let threads = self.threads_per_block() as u64;
        if threads == 0 || threads > limits.max_threads_per_block as u64 {
            return Err(over("threads per block", threads, limits.max_threads_per_block as u64));
        }
        for (axis, (&g, &max)) in self.grid.iter().zip(&limits.max_grid).enumerate() {
            if g == 0 || g > max {
                let resource = ["grid x", "grid y", "grid z"][axis];
                return Err(over(resource, g as u64, max as u64));
            }
        }
        if self.shared_bytes() > limits.shared_per_block_optin {
            return Err(over(
                "shared memory per block (bytes)",
                self.shared_bytes() as u64,
                limits.shared_per_block_optin as u64,
            ));
        }
        if let Some(regs) = self.registers_per_thread {
            if regs > limits.max_registers_per_thread {
                return Err(over(
                    "registers per thread",
                    regs as u64,
                    limits.max_registers_per_thread as u64,
                ));
            }
            let per_block = regs as u64 * threads;
            if per_block > limits.registers_per_block as u64 {
                return Err(over("registers per block", per_block, limits.registers_per_block as u64));
            }
        }
        Ok(())
    }

    /// Whether the launch needs the opt-in to more than the default shared memory per block.
    pub fn needs_shared_optin(&self, limits: &DeviceLimits) -> bool {
        self.shared_bytes() > limits.shared_per_block
    }
}

impl Plan {
    /// The backend's payload as a `T`, or a [`Error::PlanMismatch`] saying the plan holds none
    /// (it was made by another backend, or built by hand).
    pub fn payload<T: Any>(&self) -> Result<&T> {
        self.payload.get::<T>().ok_or_else(|| Error::PlanMismatch {
            what: format!(
                "plan `{}` holds no {} (made by `{}`); use the plan this backend's `plan` returned",
                self.kernel,
                std::any::type_name::<T>(),
                self.backend
            ),
        })
    }

    /// Checks that this plan was made by `backend` for `problem`.
    pub fn check_for(&self, backend: &str, problem: &Problem) -> Result<()> {
        if self.backend != backend {
            return Err(Error::PlanMismatch {
                what: format!("plan was made by `{}` but handed to `{backend}`", self.backend),
            });
        }
        if &self.problem != problem {
            return Err(Error::PlanMismatch {
                what: format!("plan was made for {} but the call is {problem}", self.problem),
            });
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "backend   {}", self.backend)?;
        writeln!(f, "kernel    {}", self.kernel)?;
        writeln!(f, "problem   {}", self.problem)?;
        let t = self.tiles;
        writeln!(f, "tiles     block_m={} block_n={} stages={}", t.block_m, t.block_n, t.stages)?;
        match &self.execution {
            Execution::Cpu { threads, tasks, isa } => {
                writeln!(f, "threads   {threads} ({tasks} tasks, inner loops for {isa})")?;
            }
            Execution::Gpu(l) => {
                writeln!(f, "grid      {:?} ({} blocks)", l.grid, l.blocks())?;
                writeln!(f, "block     {:?} ({} threads)", l.block, l.threads_per_block())?;
                writeln!(
                    f,
                    "shared    {} B dynamic + {} B static",
                    l.dynamic_shared_bytes, l.static_shared_bytes
                )?;
                match l.registers_per_thread {
                    Some(r) => {
                        writeln!(f, "registers {r} per thread, spills {} B", l.spill_bytes.unwrap_or(0))?
                    }
                    None => writeln!(f, "registers (not reported by this backend)")?,
                }
            }
        }
        for note in &self.notes {
            writeln!(f, "note      {note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(threads: u32, shared: u32) -> Launch {
        Launch {
            grid: [16, 64, 1],
            block: [threads, 1, 1],
            dynamic_shared_bytes: shared,
            static_shared_bytes: 0,
            registers_per_thread: Some(128),
            spill_bytes: Some(0),
        }
    }

    #[test]
    fn h100_tiles_do_not_fit_an_l4() {
        // 192 KB of shared memory is fine on an H100 and must be refused for an L4.
        let l = launch(128, 192 * 1024);
        assert!(l.validate("k", &DeviceLimits::h100()).is_ok());
        let err = l.validate("k", &DeviceLimits::l4()).unwrap_err().to_string();
        assert!(err.contains("shared memory per block"), "{err}");
        assert!(err.contains("101376"), "{err}");
    }

    #[test]
    fn registers_and_threads_are_checked() {
        let l = launch(1024, 0);
        let err = l.validate("k", &DeviceLimits::h100()).unwrap_err().to_string();
        assert!(err.contains("registers per block"), "{err}");
        let l = launch(2048, 0);
        assert!(matches!(
            l.validate("k", &DeviceLimits::h100()),
            Err(Error::OverDeviceLimit { resource: "threads per block", .. })
        ));
    }

    #[test]
    fn payloads_compare_by_value_and_type() {
        let a = Payload::new(3u32);
        assert_eq!(a, Payload::new(3u32));
        assert_ne!(a, Payload::new(4u32));
        assert_ne!(a, Payload::new(3u64));
        assert_ne!(a, Payload::default());
        assert_eq!(a.get::<u32>(), Some(&3));
        assert_eq!(a.get::<u64>(), None);
    }

    #[test]
    fn optin_needed_above_48k() {
        assert!(!launch(128, 48 * 1024).needs_shared_optin(&DeviceLimits::l4()));
        assert!(launch(128, 48 * 1024 + 1).needs_shared_optin(&DeviceLimits::l4()));
    }
}
