//! Prints a hash of the PTX of every decode variant (NVRTC, no GPU needed) and ptxas's registers
//! and spills, one line each, so
//! that a kernel change that must leave some variants' code alone can be checked: run it on the
//! source before and after (`git show main:crates/attn-cuda/kernels/decode.cu > old.cu`), and
//! diff. The hash is of the instructions: source line markers (`.loc`, which move with any edit
//! of the file), register declarations and comments are left out, and virtual registers and
//! labels are renumbered in order of first use, so equal hashes mean the same code. With an output folder, each variant's PTX is written there too; with a filter, only the
//! variants whose name contains it are compiled.
//!
//! ```text
//! cargo run --release -p attn-cuda --example decode_ptx -- [sm_80|sm_89|sm_90a] [SOURCE.cu|-] [OUT_DIR|-] [FILTER]
//! ```

use attn_cuda::{Arch, CompileRequest, compile, decode};
use std::hash::{Hash, Hasher};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arch = match args.first().map(String::as_str) {
        Some("sm_80") => Arch::Sm80,
        Some("sm_89") => Arch::Sm89,
        _ => Arch::Sm90a,
    };
    let source = match args.get(1).map(String::as_str) {
        None | Some("-") => decode::SOURCE.to_string(),
        Some(path) => std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}")),
    };
    let out = args.get(2).filter(|d| *d != "-");
    let filter = args.get(3).map_or("", String::as_str);
    for v in decode::Variant::all().into_iter().filter(|v| v.name().contains(filter)) {
        let req =
            CompileRequest::new(v.name(), source.clone(), arch).headers(decode::HEADERS).defines(v.defines());
        match compile(&req) {
            Ok(c) => {
                // SipHash with fixed keys: the same PTX gives the same number on every run.
                let mut h = std::collections::hash_map::DefaultHasher::new();
                normalized(&c.ptx).hash(&mut h);
                let r = c.resources_of("attn_decode");
                let (regs, spill) = r.map_or((0, 0), |r| (r.registers, r.spill_stores));
                println!(
                    "{} {} {:016x} {regs} registers {spill} B spilled",
                    v.name(),
                    arch.as_str(),
                    h.finish()
                );
                if let Some(dir) = out {
                    let path = format!("{dir}/{}_{}.ptx", v.name(), arch.as_str());
                    std::fs::write(&path, &c.ptx).unwrap_or_else(|e| panic!("write {path}: {e}"));
                }
            }
            Err(e) => println!("{} {} error: {e}", v.name(), arch.as_str()),
        }
    }
}

/// The PTX's instructions and directives, without `.loc`, `.file`, `.reg` lines and comments,
/// with each `%name123` register and `$L__name` label renamed by order of first use.
fn normalized(ptx: &str) -> String {
    let mut names: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut out = String::new();
    for line in ptx.lines().map(str::trim) {
        if line.is_empty() || [".loc", ".file", ".reg", "//"].iter().any(|p| line.starts_with(p)) {
            continue;
        }
        let mut chars = line.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c != '%' && c != '$' {
                out.push(c);
                continue;
            }
            // A register (`%` letters digits) or a label (`$` then name characters).
            let mut end = i + 1;
            while let Some(&(j, d)) = chars.peek() {
                if d.is_ascii_alphanumeric() || d == '_' {
                    end = j + d.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            let token = &line[i..end];
            let kind = token.trim_end_matches(|d: char| d.is_ascii_digit());
            if c == '%' && kind.len() == token.len() {
                out.push_str(token); // a special register, e.g. %tid
                continue;
            }
            let next = names.len();
            let n = *names.entry(token.to_string()).or_insert(next);
            out.push_str(&format!("{}#{n}", if c == '$' { "$L" } else { kind }));
        }
        out.push('\n');
    }
    out
}
