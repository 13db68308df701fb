//! Whether CUDA can be used here, answered without ever panicking.
//!
//! cudarc (built with `dynamic-loading`) opens `libcuda` and `libnvrtc` on first use and panics
//! when one is missing. So we open them ourselves first, with `libloading`, and only call cudarc
//! once both are known to load. The handles are kept open for the life of the process: glibc's
//! `dlopen` then hands cudarc's later `dlopen("libnvrtc.so.13")` the library we already loaded
//! (it matches loaded objects by SONAME), even when we found it somewhere the loader does not
//! search, such as a Python wheel. [`nvrtc_available`] checks that this worked rather than
//! trusting it.

use crate::locate::{self, NvrtcCandidate};
use attn_core::DeviceLimits;
use cudarc::driver::{CudaContext, DriverError, sys::CUdevice_attribute as Attr};
use libloading::Library;
use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// A CUDA device, as the backend needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0).
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors: the number of blocks that run at once is a multiple of this.
    pub sm_count: u32,
    /// Device memory, bytes.
    pub total_memory_bytes: u64,
    /// Per-block limits, read from the device's attributes, for [`attn_core::Launch::validate`].
    pub limits: DeviceLimits,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = self.compute_capability;
        write!(f, "{} (sm_{major}{minor}, {} SMs)", self.name, self.sm_count)
    }
}

/// Device 0, if this machine can run CUDA kernels: the driver library loads, NVRTC loads, and
/// the driver reports a device. Otherwise a sentence saying what is missing and how to get it.
/// Never panics. The answer is cached: it cannot change while the process lives, and creating
/// a context to ask costs a fraction of a second.
pub fn probe() -> Result<DeviceInfo, String> {
    static DEVICE0: OnceLock<Result<DeviceInfo, String>> = OnceLock::new();
    DEVICE0.get_or_init(|| probe_ordinal(0)).clone()
}

/// Like [`probe`], for any device ordinal, uncached.
pub fn probe_ordinal(ordinal: usize) -> Result<DeviceInfo, String> {
    driver_available()?;
    nvrtc_available()?;
    guarded("probing the CUDA device", || {
        let count = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e}"))?;
        if ordinal >= count.max(0) as usize {
            return Err(format!("the CUDA driver reports {count} device(s); there is no device {ordinal}"));
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| format!("creating a context on device {ordinal}: {e}"))?;
        device_info(&ctx).map_err(|e| format!("reading the attributes of device {ordinal}: {e}"))
    })
}

/// Reads a [`DeviceInfo`] off a context's device.
pub(crate) fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, DriverError> {
    let attr = |a: Attr| ctx.attribute(a).map(|v| v.max(0) as u32);
    let name = ctx.name()?;
    let (major, minor) = ctx.compute_capability()?;
    let limits = DeviceLimits {
        name: format!("{name} (sm_{major}{minor})"),
        max_threads_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        shared_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
        shared_per_block_optin: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        registers_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)?,
        // No device attribute reports it; it has been 255 on every architecture since sm_50.
        max_registers_per_thread: 255,
        max_grid: [
            attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ],
    };
    Ok(DeviceInfo {
        ordinal: ctx.ordinal(),
        name,
        compute_capability: (major.max(0) as u32, minor.max(0) as u32),
        sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        total_memory_bytes: ctx.total_mem()? as u64,
        limits,
    })
}

/// Whether the CUDA driver library (`libcuda.so.1`, installed with the GPU driver) loads.
pub fn driver_available() -> Result<(), String> {
    static DRIVER: OnceLock<Result<Library, String>> = OnceLock::new();
    let loaded = DRIVER.get_or_init(|| {
        // SAFETY: loading the driver runs only its initialisers, which have no preconditions.
        unsafe { Library::new(locate::CUDA_DRIVER_SONAME) }.map_err(|e| {
            format!(
                "the CUDA driver library {} is not installed ({}); it comes with the NVIDIA GPU \
                 driver, so this machine has no usable NVIDIA GPU",
                locate::CUDA_DRIVER_SONAME,
                describe(&e)
            )
        })
    });
    loaded.as_ref().map(|_| ()).map_err(Clone::clone)
}

/// NVRTC as loaded for this process: where from, and its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcInfo {
    /// The library file, or the bare SONAME when the loader's search path found it.
    pub library: PathBuf,
    /// NVRTC's version (major, minor).
    pub version: (u32, u32),
}

/// Whether NVRTC can compile kernels here; no GPU needed (CI compiles kernels without one).
/// Looks in `ATTN_NVRTC_LIB` if set (and only there), else the loader's search path,
/// `/usr/local/cuda/lib64`, and the `nvidia-cuda-nvrtc` wheel in Python's site-packages. Never
/// panics. Loads the library on success; every other NVRTC use must come after this call.
pub fn nvrtc_available() -> Result<(), String> {
    nvrtc_info().map(|_| ())
}

/// [`nvrtc_available`], returning where NVRTC was loaded from and its version.
pub fn nvrtc_info() -> Result<NvrtcInfo, String> {
    static NVRTC: OnceLock<Result<NvrtcInfo, String>> = OnceLock::new();
    NVRTC.get_or_init(load_nvrtc).clone()
}

/// The signature of `nvrtcVersion`.
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

fn load_nvrtc() -> Result<NvrtcInfo, String> {
    let (library, lib) = open_nvrtc()?;
    // SAFETY: `nvrtcVersion` has this signature in every NVRTC release.
    let ours = unsafe { lib.get::<VersionFn>(b"nvrtcVersion") }
        .map_err(|e| format!("{} has no nvrtcVersion: {e}", library.display()))?;
    let ours: VersionFn = *ours;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let rc = unsafe { ours(&mut major, &mut minor) };
    if rc != 0 {
        return Err(format!("nvrtcVersion failed ({rc}) in {}", library.display()));
    }
    if major != 13 {
        return Err(format!(
            "{} is NVRTC {major}.{minor}, but this build targets the CUDA 13 API; install NVRTC 13 \
             (`python3 -m pip install 'nvidia-cuda-nvrtc==13.0.*'`) and point {} at it",
            library.display(),
            locate::NVRTC_LIB.name
        ));
    }
    // Kept open for the whole process so that cudarc's own dlopen resolves to this library.
    let lib: &'static Library = Box::leak(Box::new(lib));
    // Now cudarc's lookup cannot come up empty (the SONAME matches), so it will not panic; but a
    // different libnvrtc on the search path would win, since cudarc tries `libnvrtc.so` first.
    #[cfg(not(feature = "dynamic-linking"))]
    let theirs = guarded("loading NVRTC through cudarc", || {
        // SAFETY: as above; the symbol is only compared, not called.
        let sym = unsafe { cudarc::nvrtc::sys::culib().get::<VersionFn>(b"nvrtcVersion") };
        sym.map(|s| *s as usize).map_err(|e| e.to_string())
    })?;
    // Linked rather than loaded by cudarc (the `dynamic-linking` feature): the loader bound
    // nvrtcVersion at start-up from libnvrtc.so.13, a DT_NEEDED entry; compare with that.
    #[cfg(feature = "dynamic-linking")]
    let theirs = {
        unsafe extern "C" {
            fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> c_int;
        }
        nvrtcVersion as VersionFn as usize
    };
    // SAFETY: as above.
    let ours_addr = unsafe { lib.get::<VersionFn>(b"nvrtcVersion") }.map(|s| *s as usize).ok();
    if ours_addr != Some(theirs) {
        return Err(format!(
            "cudarc loaded a different libnvrtc from the loader's search path than the one found at \
             {}; set {} or LD_LIBRARY_PATH so that both agree",
            library.display(),
            locate::NVRTC_LIB.name
        ));
    }
    Ok(NvrtcInfo { library, version: (major as u32, minor as u32) })
}

/// Opens the first NVRTC candidate that loads, with its builtins library.
fn open_nvrtc() -> Result<(PathBuf, Library), String> {
    let mut tried = Vec::new();
    for candidate in locate::nvrtc_candidates()? {
        let (shown, result) = match &candidate {
            // SAFETY: loading NVRTC runs only its initialisers, which have no preconditions.
            NvrtcCandidate::SearchPath => {
                (PathBuf::from(locate::NVRTC_SONAME), unsafe { Library::new(locate::NVRTC_SONAME) })
            }
            NvrtcCandidate::Path(file) => {
                // NVRTC dlopens `libnvrtc-builtins.so.13.0` by bare name when it compiles, which
                // fails outside the search path; loaded first, it is found by SONAME.
                if let Some(builtins) = file.parent().map(|d| d.join(locate::NVRTC_BUILTINS_SONAME)) {
                    // SAFETY: as above; a failure shows up as NVRTC's own error when compiling.
                    if let Ok(b) = unsafe { Library::new(&builtins) } {
                        std::mem::forget(b);
                    }
                }
                // SAFETY: as above.
                (file.clone(), unsafe { Library::new(file) })
            }
        };
        match result {
            Ok(lib) => return Ok((shown, lib)),
            Err(e) => tried.push(format!("{}: {}", shown.display(), describe(&e))),
        }
    }
    Err(format!(
        "NVRTC ({}) not found (tried {}); install it with `python3 -m pip install \
         'nvidia-cuda-nvrtc==13.0.*'` or a CUDA 13 toolkit, or set {} to the library's path",
        locate::NVRTC_SONAME,
        tried.join("; "),
        locate::NVRTC_LIB.name
    ))
}

/// A `libloading` error with its cause: its `Display` alone says only "dlopen failed", while
/// the cause carries `dlerror()`'s text (file not found, wrong ELF class, missing dependency).
fn describe(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// Runs `f`, turning a panic inside cudarc (a missing symbol, say) into an error: the second
/// guard behind the library checks.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        Err(format!("{what}: cudarc panicked: {message}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_answers_without_panicking() {
        match probe() {
            Ok(info) => {
                println!("probe: {info}");
                assert!(info.sm_count > 0 && info.limits.max_threads_per_block >= 1024);
            }
            Err(reason) => println!("probe: unavailable: {reason}"),
        }
        match nvrtc_info() {
            Ok(info) => println!("nvrtc: {info:?}"),
            Err(reason) => println!("nvrtc: unavailable: {reason}"),
        }
    }

    #[test]
    fn guarded_turns_panics_into_errors() {
        // `resume_unwind` unwinds like a panic without running the panic hook, keeping the log clean.
        let r: Result<(), String> = guarded("testing", || std::panic::resume_unwind(Box::new("boom")));
        assert!(r.unwrap_err().contains("boom"));
    }
}
