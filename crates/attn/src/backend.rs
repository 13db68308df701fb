//! The registry of backends and the run-time choice among them.

use attn_core::{Attention, Availability, DeviceKind, Error, Knob, Problem, Result};

/// `ATTN_BACKEND`.
pub(crate) const BACKEND: Knob = Knob {
    name: "ATTN_BACKEND",
    allowed: "`cuda` | `wgpu` | `cpu-flash` (or `cpu`) | `cpu-reference`, in any case",
    default: "the best available backend that can run the problem",
    purpose: "Names the backend `Backend::auto` and the `attn` command use (`attn verify` verifies it alone); one that is unavailable or cannot run the problem is an error, never a silent fallback.",
};

/// Every backend this build knows, by name, and the rule for choosing one.
pub struct Backend;

/// One backend considered by [`Backend::auto`], and what it said.
#[derive(Debug, serde::Serialize)]
pub struct Choice {
    /// Backend name.
    pub name: String,
    /// Whether it is available here, and on what.
    pub availability: Availability,
    /// Why it can or cannot run the problem (its plan error, if any).
    pub verdict: std::result::Result<String, String>,
}

/// Builds a backend from its settings.
type Make = fn() -> Result<Box<dyn Attention>>;

/// Every backend of the build by name, in [`Backend::all`]'s order, with how to build it: a new
/// backend is one more line here.
const REGISTRY: [(&str, Make); 4] = [
    ("cuda", || Ok(Box::new(attn_cuda::Cuda::from_env()?))),
    ("wgpu", || Ok(Box::new(attn_wgpu::Wgpu::from_env()?))),
    ("cpu-flash", || Ok(Box::new(attn_cpu::Flash::from_env()?))),
    ("cpu-reference", || Ok(Box::new(attn_cpu::Reference))),
];

/// What [`Backend::rank`] found.
pub struct Ranking {
    /// The backend [`Backend::auto`] picks, if any can run the problem.
    pub best: Option<Box<dyn Attention>>,
    /// Every backend's verdict, in [`Backend::all`]'s order.
    pub choices: Vec<Choice>,
}

impl Backend {
    /// All backends compiled into this build, available or not, in order of preference for
    /// equal device kinds: on a hardware GPU `cuda` before `wgpu` (tensor cores against plain
    /// FMA), then the CPU. Each reads its `ATTN_*` settings here; one that cannot be read is an
    /// [`Error::InvalidSetting`].
    pub fn all() -> Result<Vec<Box<dyn Attention>>> {
        REGISTRY.iter().map(|(_, make)| make()).collect()
    }

    /// The name this build knows `name` by: `cuda`, `wgpu`, `cpu-flash` or `cpu-reference`, in
    /// any case (as element types are); `cpu` means `cpu-flash`. `None` for any other name.
    pub fn canonical(name: &str) -> Option<&'static str> {
        Self::entry(name).map(|(n, _)| *n)
    }

    /// The registry's entry for `name`, read as [`canonical`](Backend::canonical) says.
    fn entry(name: &str) -> Option<&'static (&'static str, Make)> {
        let name = name.trim();
        let name = if name.eq_ignore_ascii_case("cpu") { "cpu-flash" } else { name };
        REGISTRY.iter().find(|(n, _)| n.eq_ignore_ascii_case(name))
    }

    /// The backend name `ATTN_BACKEND` gives, if it is set.
    pub fn named_by_env() -> Option<String> {
        BACKEND.value()
    }

    /// The backend called `name` (as [`canonical`](Backend::canonical) reads it), or an error
    /// that says why it cannot be had. Only that backend is built, so only its own settings must
    /// be readable.
    pub fn by_name(name: &str) -> Result<Box<dyn Attention>> {
        let Some(&(name, make)) = Self::entry(name) else {
            let names: Vec<&str> = REGISTRY.iter().map(|(n, _)| *n).collect();
            return Err(Error::Unavailable {
                backend: name.into(),
                reason: format!("no backend of that name in this build; known: {}", names.join(", ")),
            });
        };
        let backend = make()?;
        if let Availability::Unavailable { reason } = backend.availability() {
            return Err(Error::Unavailable { backend: name.into(), reason });
        }
        Ok(backend)
    }

    /// The backend to use for `problem`: the one `ATTN_BACKEND` names if set (an error that
    /// says why if it is unavailable or cannot run the problem, never a silent fallback),
    /// otherwise the best available one that can plan it: hardware GPUs first, then the CPU,
    /// then software GPU adapters; the exact reference is never chosen automatically.
    pub fn auto(problem: &Problem) -> Result<Box<dyn Attention>> {
        Self::choose(problem).map(|(backend, _)| backend)
    }

    /// [`auto`](Backend::auto), with a sentence saying why that backend was chosen.
    pub fn choose(problem: &Problem) -> Result<(Box<dyn Attention>, String)> {
        if let Some(name) = BACKEND.value() {
            let backend = Self::by_name(&name)?;
            backend.plan(problem)?;
            return Ok((backend, format!("ATTN_BACKEND={name}")));
        }
        let Ranking { best, choices } = Self::rank(problem)?;
        let chosen = best.as_ref().map(|b| b.name().to_string());
        let others: Vec<String> = choices
            .iter()
            .filter(|c| Some(&c.name) != chosen.as_ref())
            .map(|c| match &c.verdict {
                Ok(can) => format!("{}: {can}, but ranks lower", c.name),
                Err(why) => format!("{}: {why}", c.name),
            })
            .collect();
        match best {
            Some(backend) => {
                let why = if others.is_empty() {
                    "best available".to_string()
                } else {
                    format!("best available; not chosen: {}", others.join("; "))
                };
                Ok((backend, why))
            }
            None => Err(Error::Unsupported {
                backend: "auto".into(),
                what: format!("no available backend can run {problem}: {}", others.join("; ")),
            }),
        }
    }

    /// Every backend's verdict on `problem`, and the one [`auto`](Backend::auto) would pick.
    pub fn rank(problem: &Problem) -> Result<Ranking> {
        let rank = |k: DeviceKind| match k {
            DeviceKind::Gpu => 0,
            DeviceKind::Cpu => 1,
            DeviceKind::SoftwareGpu => 2,
        };
        let mut best: Option<(usize, Box<dyn Attention>)> = None;
        let mut choices = vec![];
        for backend in Self::all()? {
            let availability = backend.availability();
            let verdict = match &availability {
                Availability::Unavailable { reason } => Err(reason.clone()),
                Availability::Available { .. } if backend.name() == "cpu-reference" => {
                    Err("exact but slow: chosen only by name".into())
                }
                Availability::Available { kind, .. } => match backend.plan(problem) {
                    Ok(plan) => {
                        let r = rank(*kind);
                        let verdict = Ok(match kind {
                            // lavapipe and kin: the same kernel emulated on the CPU, far slower
                            // than the CPU backend's own loops, so never chosen over them.
                            DeviceKind::SoftwareGpu => format!(
                                "can run it ({}) on a software GPU adapter (emulated on the CPU, slower than cpu-flash)",
                                plan.kernel
                            ),
                            _ => format!("can run it ({})", plan.kernel),
                        });
                        if best.as_ref().is_none_or(|(b, _)| r < *b) {
                            choices.push(Choice { name: backend.name().into(), availability, verdict });
                            best = Some((r, backend));
                            continue;
                        }
                        verdict
                    }
                    Err(e) => Err(e.to_string()),
                },
            };
            choices.push(Choice { name: backend.name().into(), availability, verdict });
        }
        Ok(Ranking { best: best.map(|(_, b)| b), choices })
    }
}
