//! Prints a hash of each Ampere/Ada variant's PTX for one architecture (or, with `hopper`, of
//! each Hopper variant's for sm_90a; with `decode`, of each decode variant's for every
//! architecture it runs on: sm_80, sm_89 and sm_90a; with `backward`, of the backward's builds
//! for sm_90a), with the line-number directives (`.loc`, `.file`) and
//! comments left out, so that a change to the kernel source can be checked not to touch the code
//! of variants it should leave alone: run it before and after and compare (`diff`). No GPU
//! needed (NVRTC only).
//!
//! ```text
//! cargo run --release -p attn-cuda --example ptx_hashes -- [sm_80|sm_89|sm_90a|hopper|decode|backward] [NAME-PART] > hashes.txt
//! ```
//!
//! Each line: the variant's name (a decode variant's with its architecture after it), the hash, its registers and spilled bytes; only the variants
//! whose name contains NAME-PART where it is given (`!NAME-PART`: those whose name does not).
//! With `PTX_DIR=<folder>` each variant's PTX and CUBIN are written there as well (`<name>.ptx`,
//! `<name>.cubin`: compare SASS, by `cuobjdump -sass`, where the PTX's register numbers moved).
//! To compare with another commit, build its worktree with a `CARGO_TARGET_DIR` of its own: in a
//! shared one, `cargo run` in either tree may run the example binary the other tree built last.

use attn_cuda::{Arch, CompileRequest, ampere, backward, compile, decode, hopper};
use std::hash::{Hash, Hasher};

/// The PTX without what moves when source lines move.
fn code_only(ptx: &str) -> String {
    ptx.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with(".loc") && !l.starts_with(".file") && !l.starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let arch = match which.as_str() {
        "sm_89" => Arch::Sm89,
        "sm_90a" | "hopper" => Arch::Sm90a,
        _ => Arch::Sm80,
    };
    let part = std::env::args().nth(2).unwrap_or_default();
    let keep = |name: &str| match part.strip_prefix('!') {
        Some(left_out) => !name.contains(left_out),
        None => name.contains(&part),
    };
    // Each variant's name, its compile request and its entry function.
    let variants: Vec<(String, CompileRequest, &str)> = match std::env::args().nth(1).as_deref() {
        Some("hopper") => {
            hopper::Variant::all().into_iter().map(|v| (v.name(), v.request(), "attn_fwd_sm90")).collect()
        }
        Some("decode") => [Arch::Sm80, Arch::Sm89, Arch::Sm90a]
            .into_iter()
            .flat_map(|arch| {
                decode::Variant::all()
                    .into_iter()
                    .map(move |v| (format!("{} {}", v.name(), arch.as_str()), v.request(arch), "attn_decode"))
            })
            .collect(),
        // The backward's main passes (each family's, the Hopper one's knob forms too) and its row
        // passes, for sm_90a.
        Some("backward") => {
            let forms = backward::Form::knob_forms();
            let mut mains: Vec<backward::Variant> = Vec::new();
            for v in backward::Variant::all().into_iter().flat_map(|v| forms.map(|f| v.with_form(f))) {
                if !mains.contains(&v) {
                    mains.push(v);
                }
            }
            // The row passes' PTX holds both entries; the pre-pass's resources are printed.
            let rows = backward::Variant::all()
                .into_iter()
                .filter(|v| v.hopper)
                .map(|v| (format!("{} rows", v.name()), v.request(Arch::Sm90a), "attn_bwd_pre"));
            mains
                .into_iter()
                .map(|v| (v.name(), v.main_request(Arch::Sm90a), v.main_entry()))
                .chain(rows)
                .collect()
        }
        _ => ampere::Variant::all().into_iter().map(|v| (v.name(), v.request(arch), "attn_fwd")).collect(),
    };
    let variants: Vec<_> = variants.into_iter().filter(|(name, _, _)| keep(name)).collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let lines: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = variants
            .chunks(variants.len().div_ceil(threads).max(1))
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|(name, request, entry)| match compile(request) {
                            Ok(c) => {
                                // PTX_DIR: each variant's PTX there too, for a diff of two builds.
                                if let Ok(dir) = std::env::var("PTX_DIR") {
                                    let file = std::path::Path::new(&dir)
                                        .join(format!("{}.ptx", name.replace(' ', "-")));
                                    std::fs::write(&file, &c.ptx).expect("write the PTX");
                                    // And the CUBIN, for `cuobjdump -sass` (the PTX's register
                                    // numbers move with any change upstream of them).
                                    std::fs::write(file.with_extension("cubin"), &c.cubin)
                                        .expect("write the CUBIN");
                                }
                                let mut h = std::collections::hash_map::DefaultHasher::new();
                                code_only(&c.ptx).hash(&mut h);
                                let r = c.resources_of(entry).cloned().unwrap_or_default();
                                format!(
                                    "{name} {:016x} {} registers {} B spilled",
                                    h.finish(),
                                    r.registers,
                                    r.spill_bytes()
                                )
                            }
                            Err(e) => format!("{name} error: {e}"),
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("compile thread")).collect()
    });
    for line in lines {
        println!("{line}");
    }
}
