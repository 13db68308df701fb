//! NVRTC, the CUDA headers and `cuobjdump` for the CUDA backend's tests: where they are, how to
//! install them on a bare machine, and the environment that points the child cargo processes at
//! them.
//!
//! CI machines have no GPU and no toolkit, but `attn-cuda` still compiles every kernel
//! specialisation for every target architecture with NVRTC, and reads the Hopper kernels' SASS
//! with `cuobjdump`; NVIDIA's Python wheels supply them (`nvidia-cuda-nvrtc`: the library;
//! `nvidia-cuda-runtime`: `cuda_fp16.h` and friends; `nvidia-cuda-cuobjdump` and
//! `nvidia-cuda-nvdisasm`: the SASS reader, which runs `nvdisasm` from `PATH`) under
//! `site-packages/nvidia/cu13/`, where neither the dynamic loader nor `PATH` looks.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::cmd;

/// The NVRTC library of the CUDA major version attn-cuda's cudarc is built for.
const NVRTC: &str = "libnvrtc.so.13";

/// The wheels, pinned to the CUDA version the kernels are written against (cuobjdump's and
/// nvdisasm's wheels start at 13.2; they read 13.0's CUBINs).
const WHEELS: [&str; 4] = [
    "nvidia-cuda-nvrtc==13.0.*",
    "nvidia-cuda-runtime==13.0.*",
    "nvidia-cuda-cuobjdump==13.2.*",
    "nvidia-cuda-nvdisasm==13.2.*",
];

/// The directory holding `libnvrtc.so.13`: `ATTN_NVRTC_LIB` (file or directory) if set, the
/// toolkit's, the loader's usual directories, then the wheel's.
pub fn nvrtc_dir() -> Option<PathBuf> {
    if let Some(value) = std::env::var_os("ATTN_NVRTC_LIB").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        return if path.is_dir() { Some(path) } else { path.parent().map(Path::to_path_buf) };
    }
    let arch = std::env::consts::ARCH;
    let system =
        ["/usr/local/cuda/lib64".to_string(), format!("/usr/lib/{arch}-linux-gnu"), "/usr/lib64".into()];
    system.into_iter().map(PathBuf::from).chain(wheel_dirs("lib")).find(|d| d.join(NVRTC).is_file())
}

/// The directory holding `cuda_fp16.h`: `ATTN_CUDA_INCLUDE` if set, the toolkit's, the wheel's.
pub fn include_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ATTN_CUDA_INCLUDE").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    std::iter::once(PathBuf::from("/usr/local/cuda/include"))
        .chain(wheel_dirs("include"))
        .find(|d| d.join("cuda_fp16.h").is_file())
}

/// `cuobjdump`: `ATTN_CUOBJDUMP` if set, the toolkit's, `PATH`'s, the wheel's.
pub fn cuobjdump() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ATTN_CUOBJDUMP").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(path));
    }
    tool("cuobjdump")
}

/// `nvdisasm`, which `cuobjdump -sass` runs from `PATH`: the toolkit's, `PATH`'s, the wheel's.
pub fn nvdisasm() -> Option<PathBuf> {
    tool("nvdisasm")
}

/// The first `name` in the toolkit's `bin`, `PATH` and the wheels' `bin`.
fn tool(name: &str) -> Option<PathBuf> {
    let path_dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    std::iter::once(PathBuf::from("/usr/local/cuda/bin"))
        .chain(path_dirs)
        .chain(wheel_dirs("bin"))
        .map(|d| d.join(name))
        .find(|f| f.is_file())
}

/// `site-packages/nvidia/cu13/<sub>` in every Python site directory that has one.
fn wheel_dirs(sub: &str) -> Vec<PathBuf> {
    let script = "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))";
    let sites = cmd::output("python3", &["-c", script]).unwrap_or_default();
    sites.lines().map(|s| Path::new(s).join("nvidia/cu13").join(sub)).filter(|d| d.is_dir()).collect()
}

/// Whether NVRTC, the headers, cuobjdump and nvdisasm are all there.
pub fn present() -> bool {
    nvrtc_dir().is_some() && include_dir().is_some() && cuobjdump().is_some() && nvdisasm().is_some()
}

/// Installs the wheels with the Python that `python3` names.
pub fn install() -> Result<(), String> {
    let mut args = vec!["-m", "pip", "install", "--quiet"];
    args.extend(WHEELS);
    cmd::run("python3", &args)
}

/// The environment for child cargo processes: `ATTN_NVRTC_LIB`, `ATTN_CUDA_INCLUDE` and
/// `ATTN_CUOBJDUMP` pinned to what was found (so tests use exactly what this run reported), the
/// NVRTC directory prepended to `LD_LIBRARY_PATH` (a child's loader reads it at start-up, so it
/// must be set before the child starts, never from inside it), nvdisasm's to `PATH` (where
/// cuobjdump looks for it), and with `require`,
/// `ATTN_REQUIRE_NVRTC=1`, which turns attn-cuda's NVRTC tests (and its SASS test, which needs
/// cuobjdump too) from skipped into failed where they are missing.
pub fn child_env(require: bool) -> Vec<(&'static str, OsString)> {
    let mut vars = Vec::new();
    if let Some(dir) = nvrtc_dir() {
        if let Some(joined) = prepended("LD_LIBRARY_PATH", &dir) {
            vars.push(("LD_LIBRARY_PATH", joined));
        }
        vars.push(("ATTN_NVRTC_LIB", dir.join(NVRTC).into_os_string()));
    }
    if let Some(dir) = include_dir() {
        vars.push(("ATTN_CUDA_INCLUDE", dir.into_os_string()));
    }
    if let Some(path) = cuobjdump() {
        vars.push(("ATTN_CUOBJDUMP", path.into_os_string()));
    }
    if let Some(joined) = nvdisasm().as_deref().and_then(Path::parent).and_then(|dir| prepended("PATH", dir))
    {
        vars.push(("PATH", joined));
    }
    if require {
        vars.push(("ATTN_REQUIRE_NVRTC", "1".into()));
    }
    vars
}

/// The list variable `var` (`PATH`, `LD_LIBRARY_PATH`) as this process has it, with `dir` first.
fn prepended(var: &str, dir: &Path) -> Option<OsString> {
    let rest =
        std::env::var_os(var).map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(rest)).ok()
}
