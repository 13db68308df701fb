//! System packages that optional backends need before their steps can run.
//!
//! CI machines start bare, so `cargo xtask test` installs what is missing before it takes the
//! inventory; a prerequisite already present is left alone, so a developer's own setup is never
//! touched and reruns cost nothing.

use std::process::ExitCode;

/// Something outside cargo's reach that a backend needs at test time.
pub struct Prerequisite {
    /// Short name used in headers and errors.
    pub name: &'static str,
    /// Which backend needs it and for what; shown before installing.
    pub why: &'static str,
    /// Whether it is already usable; checked first so installs only happen on bare machines.
    pub present: fn() -> bool,
    /// Installs it, e.g. through `crate::cmd::run("apt-get", &["install", "-y", ...])`.
    pub install: fn() -> Result<(), String>,
}

/// Every prerequisite, in install order.
///
/// This is where backends that need more than cargo register what to install.
pub fn prerequisites() -> Vec<Prerequisite> {
    vec![
        Prerequisite {
            name: "nvrtc",
            why: "the CUDA backend compiles every kernel for sm_80/sm_89/sm_90a with NVRTC, GPU or not, \
                  and reads the Hopper kernels' SASS (pip wheels nvidia-cuda-nvrtc and nvidia-cuda-runtime \
                  13.0: library and headers; nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm 13.2: the \
                  disassembler)",
            present: crate::cuda::present,
            install: crate::cuda::install,
        },
        Prerequisite {
            name: "lavapipe",
            why: "the wgpu backend's WGSL kernel runs on Mesa's software Vulkan driver where there is \
                  no GPU (apt-get install mesa-vulkan-drivers, after apt-get update)",
            present: crate::vulkan::present,
            install: crate::vulkan::install,
        },
    ]
}

/// Installs every missing prerequisite, stopping at the first that fails.
pub fn install_missing() -> Result<(), String> {
    for p in prerequisites() {
        if (p.present)() {
            println!("prerequisite `{}`: present", p.name);
            continue;
        }
        println!("==> installing prerequisite `{}`: {}", p.name, p.why);
        (p.install)().map_err(|e| format!("prerequisite `{}`: {e}", p.name))?;
        if !(p.present)() {
            return Err(format!("prerequisite `{}`: still missing after installing it", p.name));
        }
    }
    Ok(())
}

/// `cargo xtask prerequisites`: only the installs, for setting up a machine by hand.
pub fn run() -> ExitCode {
    match install_missing() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
