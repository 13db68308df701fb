//! Compiling CUDA C++ to a CUBIN with NVRTC, with ptxas's resource report attached.
//!
//! Kernels are compiled at run time, once per specialisation (dtype, head dim, tiles, mask as
//! `-D` macros), for the real architecture of the device: a CUBIN loads without a JIT step and
//! comes with ptxas's register and spill counts. The same call works without a GPU, so CI
//! compiles every specialisation for every target architecture.

use crate::locate;
use crate::probe::{self, guarded};
use crate::ptxas::{self, KernelResources};
use cudarc::nvrtc::{result, sys};
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// A real GPU architecture we compile CUBINs for. A CUBIN runs on devices of its major version
/// with an equal or higher minor version, except `sm_90a`, which runs on sm_90 only (it unlocks
/// Hopper's wgmma and TMA instructions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Ampere data centre (A100).
    Sm80,
    /// Ampere consumer and workstation (RTX 30xx, A10, A40).
    Sm86,
    /// Ada (L4, L40, RTX 40xx).
    Sm89,
    /// Hopper (H100, H200) with its architecture-specific features.
    Sm90a,
}

impl Arch {
    /// Every architecture, oldest first.
    pub const ALL: [Arch; 4] = [Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90a];

    /// The name NVRTC takes in `--gpu-architecture`, e.g. `sm_90a`.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm86 => "sm_86",
            Arch::Sm89 => "sm_89",
            Arch::Sm90a => "sm_90a",
        }
    }

    /// The newest architecture whose CUBINs run on a device of this compute capability, or
    /// `None` when none does (pre-Ampere, or Blackwell and later, which need their own target).
    pub fn for_device(major: u32, minor: u32) -> Option<Arch> {
        match (major, minor) {
            (8, m) if m >= 9 => Some(Arch::Sm89),
            (8, m) if m >= 6 => Some(Arch::Sm86),
            (8, _) => Some(Arch::Sm80),
            (9, 0) => Some(Arch::Sm90a),
            _ => None,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One compilation: a whole `.cu` source and how to specialise it.
#[derive(Clone, Debug)]
pub struct CompileRequest {
    /// The complete source text (kernels embed theirs with `include_str!`).
    pub source: String,
    /// A name for messages and the log, e.g. the variant's name; NVRTC reports errors against
    /// `<name>.cu(<line>)`. Not part of [`CompileRequest::key`].
    pub name: String,
    /// The architecture to compile for.
    pub arch: Arch,
    /// Macros, each passed as `-D NAME=VALUE` (`-D NAME` when the value is empty).
    pub defines: Vec<(String, String)>,
    /// Extra include directories; the CUDA headers' directory is added on its own (see
    /// `locate::cuda_include_dir`).
    pub include_dirs: Vec<PathBuf>,
    /// Headers handed to NVRTC by name and text: `#include "<name>"` in the source finds them
    /// without touching the file system (kernels embed theirs, or generate them).
    pub headers: Vec<(String, String)>,
    /// Pass `--use_fast_math`. Off by default: it flushes denormals and approximates `exp2f`
    /// and division, which changes the numbers the verification holds us to.
    pub fast_math: bool,
    /// Fail when the log has any warning (compiler or ptxas), so kernels stay warning-free.
    pub deny_warnings: bool,
    /// Let NVRTC reuse CUBINs from the driver's compute cache (`~/.nv/ComputeCache`, CUDA
    /// 12.9+, only where a driver is installed). Off by default: on a cache hit ptxas does not
    /// run, so the log has no `-v` report and [`Compiled::resources`] comes back empty (seen on
    /// the H100 machine). Turning it on trades that report for faster start-up across processes.
    pub driver_cache: bool,
}

impl CompileRequest {
    /// A request with no defines, no extra includes, exact math and warnings denied.
    pub fn new(name: impl Into<String>, source: impl Into<String>, arch: Arch) -> Self {
        CompileRequest {
            source: source.into(),
            name: name.into(),
            arch,
            defines: Vec::new(),
            include_dirs: Vec::new(),
            headers: Vec::new(),
            fast_math: false,
            deny_warnings: true,
            driver_cache: false,
        }
    }

    /// Adds `-D name=value`.
    pub fn define(mut self, name: impl Into<String>, value: impl ToString) -> Self {
        self.defines.push((name.into(), value.to_string()));
        self
    }

    /// Adds a header that `#include "<name>"` finds.
    pub fn header(mut self, name: impl Into<String>, text: impl Into<String>) -> Self {
        self.headers.push((name.into(), text.into()));
        self
    }

    /// Adds each `(name, value)` as [`CompileRequest::define`] does, in order.
    pub fn defines(self, defines: impl IntoIterator<Item = (String, String)>) -> Self {
        defines.into_iter().fold(self, |req, (name, value)| req.define(name, value))
    }

    /// Adds each `(name, text)` as [`CompileRequest::header`] does, in order (a kernel family's
    /// `HEADERS` list).
    pub fn headers(self, headers: &[(&str, &str)]) -> Self {
        headers.iter().fold(self, |req, (name, text)| req.header(*name, *text))
    }

    /// What identifies the program this request compiles: a hash of its source, its headers,
    /// its NVRTC options (architecture, defines, include directories, flags) and whether a
    /// warning fails it. Two requests
    /// with one key compile to the same program whatever their names, which only label messages.
    pub fn key(&self) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        (&self.source, &self.headers, self.options(), self.deny_warnings).hash(&mut h);
        h.finish()
    }

    /// The NVRTC options this request compiles with.
    pub fn options(&self) -> Vec<String> {
        let mut opts = vec![
            "--std=c++17".to_string(),
            format!("--gpu-architecture={}", self.arch),
            // ptxas's resource report goes to the log, where `ptxas::parse` reads it.
            "--ptxas-options=-v".to_string(),
            // Source lines in the CUBIN, so profilers can attribute time to lines; free at run time.
            "-lineinfo".to_string(),
        ];
        if !self.driver_cache {
            opts.push("--no-cache".into());
        }
        if self.fast_math {
            opts.push("--use_fast_math".into());
        }
        let includes = self.include_dirs.iter().cloned().chain(locate::cuda_include_dir());
        opts.extend(includes.map(|d| format!("--include-path={}", d.display())));
        opts.extend(self.defines.iter().map(|(k, v)| match v.is_empty() {
            true => format!("--define-macro={k}"),
            false => format!("--define-macro={k}={v}"),
        }));
        opts
    }
}

/// A compiled program.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The request's name.
    pub name: String,
    /// What it was compiled for.
    pub arch: Arch,
    /// The CUBIN, ready for `Gpu::load` (`runtime`).
    pub cubin: Vec<u8>,
    /// The PTX the CUBIN was assembled from, for reading what the compiler made of the source.
    pub ptx: String,
    /// The whole NVRTC log (warnings and ptxas's report).
    pub log: String,
    /// Each entry function's resources, from ptxas's report.
    pub resources: Vec<KernelResources>,
}

impl Compiled {
    /// The resources of the entry function `kernel` (as named in [`KernelResources::kernel`]).
    pub fn resources_of(&self, kernel: &str) -> Option<&KernelResources> {
        self.resources.iter().find(|r| r.kernel == kernel)
    }
}

/// Why a compilation failed, with everything needed to fix it without re-running.
#[derive(Clone, Debug)]
pub struct CompileError {
    /// The request's name.
    pub name: String,
    /// The architecture it was compiled for.
    pub arch: Arch,
    /// What went wrong, in one line.
    pub reason: String,
    /// The whole NVRTC log (empty when NVRTC never ran).
    pub log: String,
    /// The source, numbered, around the first line the log complains about.
    pub excerpt: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "compiling `{}` for {}: {}", self.name, self.arch, self.reason)?;
        if !self.log.trim().is_empty() {
            write!(f, "\n--- NVRTC log ---\n{}", self.log.trim_end())?;
        }
        if !self.excerpt.is_empty() {
            write!(f, "\n--- source ---\n{}", self.excerpt.trim_end())?;
        }
        Ok(())
    }
}

impl std::error::Error for CompileError {}

impl From<CompileError> for attn_core::Error {
    fn from(e: CompileError) -> Self {
        attn_core::Error::backend("cuda", e)
    }
}

/// Compiles `req` to a CUBIN. Fails when NVRTC is missing, when compilation fails, or (with
/// `deny_warnings`) when the log has a warning; the error carries the log and the source lines
/// it points at.
pub fn compile(req: &CompileRequest) -> Result<Compiled, CompileError> {
    let fail = |reason: String, log: String| CompileError {
        excerpt: excerpt(&req.source, &req.name, &log),
        name: req.name.clone(),
        arch: req.arch,
        reason,
        log,
    };
    probe::nvrtc_available().map_err(|e| fail(e, String::new()))?;
    let source = CString::new(req.source.as_str())
        .map_err(|_| fail("the source contains a NUL byte".into(), String::new()))?;
    let file = CString::new(format!("{}.cu", req.name))
        .map_err(|_| fail("the name contains a NUL byte".into(), String::new()))?;
    let options = req.options();
    let mut headers = Vec::with_capacity(req.headers.len());
    for (name, text) in &req.headers {
        let c = |s: &str| {
            CString::new(s).map_err(|_| fail(format!("header `{name}` contains a NUL byte"), String::new()))
        };
        headers.push((c(name)?, c(text)?));
    }
    let out = guarded("NVRTC", || Ok(run_nvrtc(&source, &file, &headers, &options)))
        .map_err(|e| fail(e, String::new()))?;
    let log = out.log;
    let (cubin, ptx) = match (out.compiled, out.cubin, out.ptx) {
        (Err(e), ..) => return Err(fail(format!("NVRTC failed ({e})"), log)),
        (Ok(()), Ok(cubin), Ok(ptx)) => (cubin, ptx),
        (Ok(()), Err(e), _) | (Ok(()), _, Err(e)) => {
            return Err(fail(format!("reading the compiled program: {e}"), log));
        }
    };
    if req.deny_warnings {
        let warnings: Vec<&str> = log.lines().filter(|l| is_warning(l)).collect();
        if !warnings.is_empty() {
            let reason =
                format!("{} warning(s), and warnings are denied: {}", warnings.len(), warnings[0].trim());
            return Err(fail(reason, log));
        }
    }
    let resources = ptxas::parse(&log);
    Ok(Compiled { name: req.name.clone(), arch: req.arch, cubin, ptx, log, resources })
}

/// [`compile`], once per process for each program: the one cache of compiled kernels, keyed by
/// [`CompileRequest::key`] (a hash of the source, headers, defines, architecture and options).
/// NVRTC takes a second or more per specialisation, and a backend asks for the same ones on
/// every call. A failed compile is not kept: the next request tries again.
pub fn compile_cached(req: &CompileRequest) -> Result<Arc<Compiled>, CompileError> {
    static CACHE: OnceLock<Mutex<HashMap<u64, Arc<Compiled>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    // Locked across the compile: two threads asking for one program compile it once, and
    // NVRTC gains nothing from running concurrently in one process.
    let mut cache = cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let key = req.key();
    if let Some(compiled) = cache.get(&key) {
        return Ok(compiled.clone());
    }
    let compiled = Arc::new(compile(req)?);
    cache.insert(key, compiled.clone());
    Ok(compiled)
}

/// What one NVRTC run produced; each step's error kept apart so the log is never lost.
struct NvrtcOutput {
    compiled: Result<(), String>,
    log: String,
    cubin: Result<Vec<u8>, String>,
    ptx: Result<String, String>,
}

fn run_nvrtc(source: &CStr, file: &CStr, headers: &[(CString, CString)], options: &[String]) -> NvrtcOutput {
    let prog = match create_program(source, file, headers) {
        Ok(p) => p,
        Err(e) => {
            let compiled = Err(format!("nvrtcCreateProgram: {e}"));
            return NvrtcOutput {
                compiled,
                log: String::new(),
                cubin: Err("not compiled".into()),
                ptx: Err("not compiled".into()),
            };
        }
    };
    // SAFETY: `prog` is live until `destroy_program` below; `source` and `file` outlive it.
    unsafe {
        let compiled =
            result::compile_program(prog, options).map_err(|e| format!("nvrtcCompileProgram: {e}"));
        let log = result::get_program_log(prog).map(|l| c_chars_to_string(&l)).unwrap_or_default();
        let (cubin, ptx) = match compiled {
            Ok(()) => (
                get_cubin(prog),
                result::get_ptx(prog).map(|p| c_chars_to_string(&p)).map_err(|e| format!("nvrtcGetPTX: {e}")),
            ),
            Err(_) => (Err("not compiled".into()), Err("not compiled".into())),
        };
        // Nothing to do about a failure to free; the results are already copied out.
        let _ = result::destroy_program(prog);
        NvrtcOutput { compiled, log, cubin, ptx }
    }
}

/// `nvrtcCreateProgram` with headers (cudarc's wrapper passes none).
fn create_program(
    source: &CStr,
    file: &CStr,
    headers: &[(CString, CString)],
) -> Result<sys::nvrtcProgram, result::NvrtcError> {
    let names: Vec<*const std::ffi::c_char> = headers.iter().map(|(n, _)| n.as_ptr()).collect();
    let texts: Vec<*const std::ffi::c_char> = headers.iter().map(|(_, t)| t.as_ptr()).collect();
    let mut prog = std::mem::MaybeUninit::uninit();
    // SAFETY: every pointer refers to a NUL-terminated string that outlives the call (NVRTC
    // copies them); `names` and `texts` hold `headers.len()` entries each.
    unsafe {
        sys::nvrtcCreateProgram(
            prog.as_mut_ptr(),
            source.as_ptr(),
            file.as_ptr(),
            headers.len() as i32,
            texts.as_ptr(),
            names.as_ptr(),
        )
        .result()?;
        Ok(prog.assume_init())
    }
}

/// The CUBIN of a program compiled for a real architecture (cudarc has no wrapper for it).
///
/// # Safety
/// `prog` must be a live, successfully compiled program.
unsafe fn get_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: per the contract, `prog` is live; `size` is a valid out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| format!("nvrtcGetCUBINSize: {e}"))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds the `size` bytes NVRTC asked for.
    unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| format!("nvrtcGetCUBIN: {e}"))?;
    if cubin.is_empty() {
        return Err("NVRTC returned no CUBIN (was a virtual compute_XX architecture requested?)".into());
    }
    Ok(cubin)
}

/// NVRTC's NUL-terminated C strings as Rust text.
fn c_chars_to_string(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether a log line is a warning: the front end's `name.cu(12): warning #177-D: ...` or
/// `ptxas warning : ...`.
fn is_warning(line: &str) -> bool {
    line.contains("): warning")
        || line.trim_start().starts_with("ptxas warning")
        || line.starts_with("nvrtc warning")
}

/// Lines around the first `name.cu(LINE): error` (else warning) in `log`, numbered, the line
/// itself marked; empty when the log names no line (e.g. the error came from ptxas).
fn excerpt(source: &str, name: &str, log: &str) -> String {
    let prefix = format!("{name}.cu(");
    let located = |kind: &str| {
        log.lines().find_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (line, tail) = rest.split_once(')')?;
            tail.starts_with(&format!(": {kind}")).then(|| line.parse::<usize>().ok()).flatten()
        })
    };
    let Some(at) = located("error").or_else(|| located("warning")) else { return String::new() };
    const CONTEXT: usize = 6;
    let first = at.saturating_sub(CONTEXT).max(1);
    source
        .lines()
        .enumerate()
        .map(|(i, text)| (i + 1, text))
        .skip(first - 1)
        .take(2 * CONTEXT + 1)
        .map(|(n, text)| format!("{} {n:>5} | {text}\n", if n == at { ">" } else { " " }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOKE: &str = include_str!("../kernels/smoke.cu");
    const HOLD: &str = include_str!("../kernels/hold.cu");

    /// Whether NVRTC tests should run; prints the skip line and returns false when they cannot,
    /// unless `ATTN_REQUIRE_NVRTC=on` (CI), where a missing NVRTC fails the test.
    fn nvrtc_or_skip(test: &str) -> bool {
        match probe::nvrtc_available() {
            Ok(()) => true,
            Err(reason)
                if crate::options::REQUIRE_NVRTC.on_off().unwrap_or_else(|e| panic!("{e}")) == Some(true) =>
            {
                panic!("{test}: NVRTC is required (ATTN_REQUIRE_NVRTC=1) but unavailable: {reason}")
            }
            Err(reason) => {
                println!("SKIPPED {test}: {reason}");
                false
            }
        }
    }

    #[test]
    fn smoke_kernel_compiles_for_every_target() {
        if !nvrtc_or_skip("smoke_kernel_compiles_for_every_target") {
            return;
        }
        println!("nvrtc: {:?}", probe::nvrtc_info().unwrap());
        for arch in [Arch::Sm80, Arch::Sm89, Arch::Sm90a] {
            let compiled =
                compile(&CompileRequest::new("smoke", SMOKE, arch)).unwrap_or_else(|e| panic!("{e}"));
            // A CUBIN is an ELF file.
            assert_eq!(&compiled.cubin[..4], b"\x7fELF", "{arch}");
            assert!(compiled.ptx.contains(".entry"), "{arch}");
            for r in &compiled.resources {
                println!("{arch}: {r:?}");
            }
            let Some(scale) = compiled.resources_of("smoke_scale_f32") else {
                panic!("{arch}: no ptxas report for smoke_scale_f32 in the log:\n{}", compiled.log)
            };
            assert!(scale.registers > 0 && scale.spill_bytes() == 0, "{arch}: {scale:?}");
            let Some(halves) = compiled.resources_of("smoke_halves") else {
                panic!("{arch}: no ptxas report for smoke_halves in the log:\n{}", compiled.log)
            };
            assert!(halves.shared_bytes > 0, "{arch}: {halves:?}");
            // The kernel that holds the stream before a timed launch (runtime::Gpu::time).
            let hold = compile(&CompileRequest::new("hold", HOLD, arch)).unwrap_or_else(|e| panic!("{e}"));
            assert!(hold.resources_of("hold_stream").is_some(), "{arch}: {}", hold.log);
            // The device-resident cache append (crate::append).
            let append = compile(&crate::append::request(arch)).unwrap_or_else(|e| panic!("{e}"));
            let rows = append.resources_of("append_rows");
            assert!(rows.is_some_and(|r| r.spill_stores == 0), "{arch}: {}", append.log);
        }
    }

    #[test]
    fn errors_carry_the_log_and_the_source_lines() {
        if !nvrtc_or_skip("errors_carry_the_log_and_the_source_lines") {
            return;
        }
        let source =
            "// line 1\n\nextern \"C\" __global__ void broken(float* y) {\n    y[0] = undefined_thing;\n}\n";
        let err = compile(&CompileRequest::new("broken", source, Arch::Sm80)).unwrap_err();
        let shown = err.to_string();
        println!("{shown}");
        assert!(err.log.contains("undefined_thing"), "{shown}");
        assert!(err.excerpt.contains(">     4 |     y[0] = undefined_thing;"), "{shown}");
    }

    #[test]
    fn warnings_fail_only_when_denied() {
        if !nvrtc_or_skip("warnings_fail_only_when_denied") {
            return;
        }
        let source = "extern \"C\" __global__ void w(float* y) { int unused; y[0] = 1.0f; }\n";
        let mut req = CompileRequest::new("warns", source, Arch::Sm80);
        let err = compile(&req).unwrap_err();
        assert!(err.reason.contains("warning"), "{err}");
        req.deny_warnings = false;
        let ok = compile(&req).unwrap_or_else(|e| panic!("{e}"));
        assert!(ok.log.contains("warning"));
    }

    #[test]
    fn options_spell_the_request() {
        let req = CompileRequest::new("x", "", Arch::Sm90a).define("ATTN_D", 128).define("ATTN_CAUSAL", "");
        let opts = req.options();
        assert!(opts.contains(&"--gpu-architecture=sm_90a".to_string()));
        assert!(opts.contains(&"--define-macro=ATTN_D=128".to_string()));
        assert!(opts.contains(&"--define-macro=ATTN_CAUSAL".to_string()));
        assert!(!opts.iter().any(|o| o.contains("fast_math")));
        // Without it a driver-cache hit drops ptxas's report (see `driver_cache`).
        assert!(opts.contains(&"--no-cache".to_string()));
    }

    #[test]
    fn the_cache_key_is_the_program_not_its_name() {
        let a = CompileRequest::new("a", "src", Arch::Sm80).define("X", 1);
        let renamed = CompileRequest { name: "b".into(), ..a.clone() };
        assert_eq!(a.key(), renamed.key());
        for other in [
            a.clone().define("Y", 2),
            a.clone().header("h.cuh", "x"),
            CompileRequest { arch: Arch::Sm89, ..a.clone() },
            CompileRequest { source: "src ".into(), ..a.clone() },
            CompileRequest { fast_math: true, ..a.clone() },
        ] {
            assert_ne!(a.key(), other.key(), "{other:?}");
        }
        if !nvrtc_or_skip("the_cache_key_is_the_program_not_its_name") {
            return;
        }
        let first = compile_cached(&CompileRequest::new("smoke", SMOKE, Arch::Sm80)).unwrap();
        let again = compile_cached(&CompileRequest::new("smoke-again", SMOKE, Arch::Sm80)).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
    }

    #[test]
    fn excerpt_marks_the_first_error() {
        let source: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let log = "k.cu(9): warning #1: w\nk.cu(12): error: e\n";
        let ex = excerpt(&source, "k", log);
        assert!(ex.starts_with("      6 | line 6\n"), "{ex}");
        assert!(ex.contains(">    12 | line 12\n"), "{ex}");
        assert!(ex.trim_end().ends_with("18 | line 18"), "{ex}");
        assert_eq!(excerpt(&source, "k", "ptxas fatal : whatever"), "");
    }

    #[test]
    fn arch_for_device() {
        assert_eq!(Arch::for_device(8, 0), Some(Arch::Sm80));
        assert_eq!(Arch::for_device(8, 6), Some(Arch::Sm86));
        assert_eq!(Arch::for_device(8, 7), Some(Arch::Sm86));
        assert_eq!(Arch::for_device(8, 9), Some(Arch::Sm89));
        assert_eq!(Arch::for_device(9, 0), Some(Arch::Sm90a));
        assert_eq!(Arch::for_device(7, 5), None);
        assert_eq!(Arch::for_device(10, 0), None);
    }
}
