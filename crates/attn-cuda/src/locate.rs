//! Where the CUDA pieces we load at run time live: the NVRTC library and the CUDA headers.
//!
//! Two installations are common and both must work: a CUDA toolkit under `/usr/local/cuda`, and
//! NVIDIA's Python wheels (`nvidia-cuda-nvrtc`, `nvidia-cuda-runtime`), which put the library and
//! headers under `site-packages/nvidia/cu13/`, a place the dynamic loader never searches. The
//! wheels are how CI machines without a toolkit get NVRTC.

use attn_core::Knob;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `ATTN_NVRTC_LIB`.
pub const NVRTC_LIB: Knob = Knob {
    name: "ATTN_NVRTC_LIB",
    allowed: "`libnvrtc.so.13` or a folder holding it",
    default: "the loader's search path, `/usr/local/cuda/lib64`, then the `nvidia-cuda-nvrtc` wheel in Python's site-packages",
    purpose: "Which NVRTC to load; when set, the only place looked, so that a wrong value is an error rather than another NVRTC.",
};

/// `ATTN_CUDA_INCLUDE`.
pub const CUDA_INCLUDE: Knob = Knob {
    name: "ATTN_CUDA_INCLUDE",
    allowed: "a folder holding `cuda_fp16.h`",
    default: "`/usr/local/cuda/include`, then the `nvidia-cuda-runtime` wheel in Python's site-packages",
    purpose: "Where NVRTC finds the CUDA headers the kernels include.",
};

/// The NVRTC library's file name (and SONAME) for the CUDA major version cudarc is built for.
pub const NVRTC_SONAME: &str = "libnvrtc.so.13";

/// NVRTC loads its builtins library by this name when it starts compiling.
pub const NVRTC_BUILTINS_SONAME: &str = "libnvrtc-builtins.so.13.0";

/// The CUDA driver library's SONAME, installed with the GPU driver, never by a toolkit or wheel.
pub const CUDA_DRIVER_SONAME: &str = "libcuda.so.1";

/// The toolkit's default install prefix.
const TOOLKIT: &str = "/usr/local/cuda";

/// One place to try loading NVRTC from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvrtcCandidate {
    /// A full path, from `ATTN_NVRTC_LIB`, the toolkit or a wheel.
    Path(PathBuf),
    /// The bare SONAME, so that the loader's own search (`LD_LIBRARY_PATH`, `ld.so.cache`) runs.
    SearchPath,
}

/// Where to look for NVRTC, in order. `Err` when `ATTN_NVRTC_LIB` is set but names nothing
/// usable: the user asked for one library and must hear that it is not there.
pub fn nvrtc_candidates() -> Result<Vec<NvrtcCandidate>, String> {
    if let Some(value) = NVRTC_LIB.value() {
        let path = PathBuf::from(&value);
        let file = if path.is_dir() { path.join(NVRTC_SONAME) } else { path };
        if !file.is_file() {
            return Err(format!(
                "{}={} does not name {NVRTC_SONAME} or a directory holding it",
                NVRTC_LIB.name,
                Path::new(&value).display()
            ));
        }
        return Ok(vec![NvrtcCandidate::Path(file)]);
    }
    let mut out = vec![NvrtcCandidate::SearchPath];
    let dirs = std::iter::once(PathBuf::from(TOOLKIT).join("lib64")).chain(wheel_dirs("lib"));
    out.extend(dirs.map(|d| d.join(NVRTC_SONAME)).filter(|f| f.is_file()).map(NvrtcCandidate::Path));
    Ok(out)
}

/// The directory holding the CUDA headers NVRTC needs for `#include <cuda_fp16.h>`:
/// `ATTN_CUDA_INCLUDE`, the toolkit's, then a wheel's. `None` when none has `cuda_fp16.h`.
pub fn cuda_include_dir() -> Option<PathBuf> {
    if let Some(dir) = CUDA_INCLUDE.value() {
        // An explicit choice is returned even if wrong, so the compile error names it.
        return Some(PathBuf::from(dir));
    }
    std::iter::once(PathBuf::from(TOOLKIT).join("include"))
        .chain(wheel_dirs("include"))
        .find(|d| d.join("cuda_fp16.h").is_file())
}

/// `site-packages/nvidia/cu13/<sub>` for every Python site directory that has one.
pub fn wheel_dirs(sub: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = site_packages()
        .into_iter()
        .map(|sp| sp.join("nvidia").join("cu13").join(sub))
        .filter(|d| d.is_dir())
        .collect();
    out.dedup();
    out
}

/// Python's site-packages directories: asked of `python3` (which knows about virtual
/// environments and pyenv), else the usual system locations. Cached: the answer cannot change
/// during a process and asking costs a Python start-up.
fn site_packages() -> Vec<PathBuf> {
    static DIRS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        // `nvidia` is a namespace package (one per wheel), so its parent is the site directory;
        // `site.getsitepackages()` also covers installs where the import fails.
        let script = "import site, os\n\
                      dirs = site.getsitepackages() + [site.getusersitepackages()]\n\
                      try:\n    import nvidia\n    dirs = [os.path.dirname(p) for p in nvidia.__path__] + dirs\n\
                      except Exception:\n    pass\n\
                      print('\\n'.join(dirs))";
        let asked = Command::new("python3")
            .args(["-c", script])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(PathBuf::from).collect::<Vec<_>>())
            .unwrap_or_default();
        let mut dirs = asked;
        dirs.extend(common_site_packages());
        let mut unique: Vec<PathBuf> = Vec::new();
        for d in dirs {
            if d.is_dir() && !unique.contains(&d) {
                unique.push(d);
            }
        }
        unique
    })
    .clone()
}

/// Site-packages directories of system and pyenv Pythons, for machines where `python3` is not on
/// `PATH` (e.g. a test binary started with a bare environment).
fn common_site_packages() -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("/usr/lib"), PathBuf::from("/usr/local/lib")];
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".local/lib"));
        if let Ok(versions) = std::fs::read_dir(Path::new(&home).join(".pyenv/versions")) {
            roots.extend(versions.flatten().map(|e| e.path().join("lib")));
        }
    }
    let mut out = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else { continue };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for p in pythons {
            out.push(p.join("site-packages"));
            out.push(p.join("dist-packages"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_path_comes_first_without_override() {
        // Only meaningful when the override is not set by the environment running the tests.
        if NVRTC_LIB.value().is_some() {
            return;
        }
        let c = nvrtc_candidates().unwrap();
        assert_eq!(c[0], NvrtcCandidate::SearchPath);
        assert!(c[1..].iter().all(|c| matches!(c, NvrtcCandidate::Path(p) if p.is_file())));
    }
}
