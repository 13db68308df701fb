//! What ptxas says each kernel uses, read from its `-v` report in the NVRTC log.
//!
//! Registers, spills and shared memory decide occupancy and whether a tile configuration is
//! viable, and they are only known after compilation; the plan and the tests read them here
//! instead of guessing. The report looks like this (CUDA 13):
//!
//! ```text
//! ptxas info    : Compiling entry function 'k' for 'sm_80'
//! ptxas info    : Function properties for k
//! ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ptxas info    : Used 34 registers, used 1 barriers, 256 bytes cumulative stack size, 1024 bytes smem, 372 bytes cmem[0]
//! ```

use std::collections::HashMap;

/// One kernel's resources as ptxas reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// The entry point's name: as written for `extern "C"` kernels, mangled otherwise.
    pub kernel: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes per thread stored to local memory because registers ran out.
    pub spill_stores: u32,
    /// Bytes per thread loaded back from those spills.
    pub spill_loads: u32,
    /// Static shared memory per block, bytes (dynamic shared memory is not known to ptxas).
    pub shared_bytes: u32,
    /// Stack per thread, bytes: the larger of the kernel's own frame and the cumulative size
    /// including the functions it calls.
    pub stack_bytes: u32,
}

impl KernelResources {
    /// Spill traffic per thread, stores plus loads, bytes; what [`attn_core::Launch`] records.
    pub fn spill_bytes(&self) -> u32 {
        self.spill_stores + self.spill_loads
    }
}

/// Parses every entry function's resources out of an NVRTC log compiled with
/// `--ptxas-options=-v`, in the order ptxas reports them. Lines it does not know are skipped,
/// so other messages in the log do no harm.
pub fn parse(log: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    // `Function properties` blocks also appear for non-inlined device functions, and need not
    // follow their entry's `Compiling` line, so frames are collected by name and joined at the end.
    let mut frames: HashMap<String, (u32, u32, u32)> = HashMap::new();
    let mut properties_of: Option<String> = None;
    for line in log.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("ptxas info    : Compiling entry function '") {
            let name = rest.split('\'').next().unwrap_or_default();
            kernels.push(KernelResources { kernel: name.to_string(), ..Default::default() });
        } else if let Some(name) = line.strip_prefix("ptxas info    : Function properties for ") {
            properties_of = Some(name.trim().to_string());
        } else if line.starts_with("ptxas") && line.contains("bytes stack frame") {
            if let Some(name) = properties_of.take() {
                let frame = number_before(line, "bytes stack frame").unwrap_or(0);
                let stores = number_before(line, "bytes spill stores").unwrap_or(0);
                let loads = number_before(line, "bytes spill loads").unwrap_or(0);
                frames.insert(name, (frame, stores, loads));
            }
        } else if line.starts_with("ptxas info    : Used ")
            && let Some(k) = kernels.last_mut()
        {
            k.registers = number_before(line, "registers").unwrap_or(0);
            k.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
            k.stack_bytes = number_before(line, "bytes cumulative stack size").unwrap_or(0);
        }
    }
    for k in &mut kernels {
        if let Some(&(frame, stores, loads)) = frames.get(&k.kernel) {
            k.stack_bytes = k.stack_bytes.max(frame);
            k.spill_stores = stores;
            k.spill_loads = loads;
        }
    }
    kernels
}

/// The number just before `unit` in a comma-separated ptxas line (`..., 1024 bytes smem, ...`).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let at = line.find(unit)?;
    line[..at].split([' ', ',', ':']).rfind(|w| !w.is_empty())?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Verbatim NVRTC 13.0 output for sm_80 (a template kernel and an `extern "C"` one), plus a
    /// warning line and a spilling kernel whose numbers were edited in, since it has the same
    /// shape as the real ones.
    const LOG: &str = "\
smoke.cu(4): warning #177-D: variable \"unused\" was declared but never referenced
ptxas warning : For profile sm_80 adjusting per thread register count of 16 to lower bound of 24
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z1tILi3EEvPf' for 'sm_80'
ptxas info    : Function properties for _Z1tILi3EEvPf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 1.858 ms
ptxas info    : Compiling entry function 'k' for 'sm_80'
ptxas info    : Function properties for k
ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 34 registers, used 1 barriers, 256 bytes cumulative stack size, 1024 bytes smem, 372 bytes cmem[0]
ptxas info    : Compile time = 19.299 ms
ptxas info    : Function properties for _Z6helperv
ptxas         .     16 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'spilly' for 'sm_80'
ptxas info    : Function properties for spilly
ptxas         .     96 bytes stack frame, 88 bytes spill stores, 92 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 112 bytes cumulative stack size, 49152 bytes smem, 372 bytes cmem[0]
";

    #[test]
    fn parses_every_entry_in_order() {
        let r = parse(LOG);
        let names: Vec<&str> = r.iter().map(|k| k.kernel.as_str()).collect();
        assert_eq!(names, ["_Z1tILi3EEvPf", "k", "spilly"]);
        assert_eq!(
            r[0],
            KernelResources { kernel: "_Z1tILi3EEvPf".into(), registers: 8, ..Default::default() }
        );
        assert_eq!(
            r[1],
            KernelResources {
                kernel: "k".into(),
                registers: 34,
                spill_stores: 0,
                spill_loads: 0,
                shared_bytes: 1024,
                stack_bytes: 256,
            }
        );
        assert_eq!(
            r[2],
            KernelResources {
                kernel: "spilly".into(),
                registers: 255,
                spill_stores: 88,
                spill_loads: 92,
                shared_bytes: 49152,
                stack_bytes: 112,
            }
        );
        assert_eq!(r[2].spill_bytes(), 180);
    }

    #[test]
    fn sm90_lines_without_cmem_parse() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                   ptxas info    : Used 37 registers, used 1 barriers, 256 bytes cumulative stack size, 1024 bytes smem\n";
        let r = parse(log);
        assert_eq!((r[0].registers, r[0].shared_bytes, r[0].stack_bytes), (37, 1024, 256));
    }

    #[test]
    fn logs_without_a_report_give_nothing() {
        assert!(parse("").is_empty());
        assert!(parse("x.cu(2): error: identifier \"y\" is undefined\n").is_empty());
    }
}
