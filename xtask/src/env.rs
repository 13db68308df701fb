//! The environment inventory printed before any step, so that a CI log says up front which
//! toolchain ran and which optional backends could have been exercised.
//!
//! Every probe is read-only and answers "absent" rather than failing: a missing optional backend is
//! information, not an error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cmd;

/// Prints one `environment:` line per fact.
pub fn print_inventory() {
    let line = |what: &str, value: String| println!("environment: {what}: {value}");
    let rustc = cmd::output("rustc", &["-vV"]);
    let rustc_line = |key: &str| {
        let value = rustc.as_deref()?.lines().find_map(|l| l.strip_prefix(key))?;
        Some(value.trim().to_string())
    };
    line("rustc", rustc.as_deref().and_then(|v| v.lines().next()).unwrap_or("not found").to_string());
    line("host", rustc_line("host:").unwrap_or_else(|| "unknown".into()));
    let cargo = cmd::cargo().into_string().ok().and_then(|c| cmd::output(&c, &["-V"]));
    line("cargo", cargo.unwrap_or_else(|| "not found".into()));
    let cpus = std::thread::available_parallelism().map(|n| n.to_string());
    line("cpus", cpus.unwrap_or_else(|_| "unknown".into()));
    line("vulkan loader", found(find_library("libvulkan.so")));
    line("vulkan drivers", vulkan_drivers().unwrap_or_else(|| "absent".into()));
    line("nvrtc", found(find_nvrtc()));
    line("cuobjdump", found(crate::cuda::cuobjdump()));
    line("nvdisasm", found(crate::cuda::nvdisasm()));
    line("nvidia gpu", found(nvidia_gpu()));
}

/// `cargo xtask env`: the inventory alone, to check a machine before a long run.
pub fn run() -> ExitCode {
    print_inventory();
    ExitCode::SUCCESS
}

/// Formats a probe's answer for the inventory.
fn found(path: Option<PathBuf>) -> String {
    path.map_or_else(|| "absent".into(), |p| format!("present ({})", p.display()))
}

/// Directories the dynamic loader searches, roughly; good enough to tell present from absent
/// without linking anything.
fn library_dirs() -> Vec<PathBuf> {
    let arch = std::env::consts::ARCH;
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("LD_LIBRARY_PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.extend(
        [
            format!("/lib/{arch}-linux-gnu"),
            format!("/usr/lib/{arch}-linux-gnu"),
            "/usr/lib64".into(),
            "/usr/lib".into(),
            "/usr/local/lib".into(),
            "/usr/local/cuda/lib64".into(),
        ]
        .map(PathBuf::from),
    );
    dirs
}

/// The first file in `dirs` whose name starts with `prefix`, so that versioned names such as
/// `libvulkan.so.1` count.
fn find_in(dirs: &[PathBuf], prefix: &str) -> Option<PathBuf> {
    dirs.iter().find_map(|dir| {
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| e.path())
            .collect();
        // Directory order is arbitrary; sorting keeps the log stable between runs.
        names.sort();
        names.into_iter().next()
    })
}

/// A shared library on the loader's usual paths.
fn find_library(prefix: &str) -> Option<PathBuf> {
    find_in(&library_dirs(), prefix)
}

/// Installed Vulkan drivers (ICD manifests), e.g. `lvp_icd.x86_64.json` for Mesa's lavapipe.
fn vulkan_drivers() -> Option<String> {
    // The loader honours these overrides before its default directories.
    for var in ["VK_DRIVER_FILES", "VK_ICD_FILENAMES"] {
        if let Some(files) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            return Some(format!("{var}={}", files.to_string_lossy()));
        }
    }
    let dirs = ["/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d"];
    let mut names: Vec<String> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    names.dedup();
    (!names.is_empty()).then(|| names.join(", "))
}

/// NVRTC, either from a CUDA toolkit or from the `nvidia-cuda-nvrtc` wheel, which puts it under
/// `site-packages/nvidia/<component>/lib` where the loader does not look on its own.
fn find_nvrtc() -> Option<PathBuf> {
    find_library("libnvrtc.so").or_else(|| {
        let script = "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))";
        let site_dirs = cmd::output("python3", &["-c", script])?;
        let lib_dirs: Vec<PathBuf> = site_dirs
            .lines()
            .filter_map(|d| std::fs::read_dir(Path::new(d).join("nvidia")).ok())
            .flatten()
            .flatten()
            .map(|e| e.path().join("lib"))
            .collect();
        find_in(&lib_dirs, "libnvrtc.so")
    })
}

/// An NVIDIA device node: NVRTC alone can compile kernels, but running them needs a GPU.
fn nvidia_gpu() -> Option<PathBuf> {
    let dev = PathBuf::from("/dev/nvidia0");
    dev.exists().then_some(dev)
}
