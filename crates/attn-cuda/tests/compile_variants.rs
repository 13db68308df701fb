//! Every kernel specialisation the backend can choose compiles with NVRTC for sm_80, sm_89 and
//! sm_90a, with no warning, no spill and registers within the variant's budget. Runs on a
//! machine without a GPU; CI requires NVRTC (ATTN_REQUIRE_NVRTC=1), elsewhere it is skipped by
//! name when NVRTC is missing.

use attn_cuda::plan::Variant;
use attn_cuda::{Arch, compile, nvrtc_available};

#[test]
fn every_variant_compiles_without_spills_for_every_arch() {
    if let Err(reason) = nvrtc_available() {
        if std::env::var("ATTN_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!("NVRTC is required (ATTN_REQUIRE_NVRTC=1) but unavailable: {reason}");
        }
        println!("SKIPPED every_variant_compiles_without_spills_for_every_arch: {reason}");
        return;
    }
    let jobs: Vec<(Variant, Arch)> = Variant::all()
        .into_iter()
        .flat_map(|v| [Arch::Sm80, Arch::Sm89, Arch::Sm90a].map(move |a| (v, a)))
        .collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .chunks(jobs.len().div_ceil(threads))
            .map(|chunk| {
                s.spawn(move || {
                    let mut failures = vec![];
                    for (variant, arch) in chunk {
                        match compile(&variant.request(*arch)) {
                            Err(e) => failures.push(format!("{} {}: {e}", variant.name(), arch.as_str())),
                            Ok(c) => {
                                let r = c.resources_of("attn_fwd").cloned().unwrap_or_default();
                                println!(
                                    "{:<40} {:<6} {:>3} registers (budget {}), {} B spilled, {} B stack",
                                    variant.name(),
                                    arch.as_str(),
                                    r.registers,
                                    variant.register_budget(),
                                    r.spill_bytes(),
                                    r.stack_bytes
                                );
                                if r.registers == 0 {
                                    failures.push(format!(
                                        "{} {}: no ptxas report in the log",
                                        variant.name(),
                                        arch.as_str()
                                    ));
                                } else if r.spill_bytes() > 0 || r.registers > variant.register_budget() {
                                    failures.push(format!(
                                        "{} {}: {} registers (budget {}), {} B spilled",
                                        variant.name(),
                                        arch.as_str(),
                                        r.registers,
                                        variant.register_budget(),
                                        r.spill_bytes()
                                    ));
                                }
                            }
                        }
                    }
                    failures
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("compile thread panicked")).collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} compiles failed:\n{}",
        failures.len(),
        jobs.len(),
        failures.join("\n")
    );
}

/// The Hopper family: every variant compiles for sm_90a with no warning, no spill, registers
/// at entry within the launch bound's cap, and none of ptxas's notes on wgmma pipelines (C75xx:
/// fences it had to inject, or every wgmma serialized because it could not prove a group
/// complete before its registers were used).
#[test]
fn every_hopper_variant_compiles_without_spills() {
    if let Err(reason) = nvrtc_available() {
        if std::env::var("ATTN_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!("NVRTC is required (ATTN_REQUIRE_NVRTC=1) but unavailable: {reason}");
        }
        println!("SKIPPED every_hopper_variant_compiles_without_spills: {reason}");
        return;
    }
    let all = attn_cuda::hopper::Variant::all();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = all
            .chunks(all.len().div_ceil(threads))
            .map(|chunk| {
                s.spawn(move || {
                    let mut failures = vec![];
                    for v in chunk {
                        match compile(&v.request()) {
                            Err(e) => failures.push(format!("{}: {e}", v.name())),
                            Ok(c) => {
                                let r = c.resources_of("attn_fwd_sm90").cloned().unwrap_or_default();
                                println!(
                                    "{:<52} {:>3} registers (budget {}), {} B spilled, {} B stack",
                                    v.name(),
                                    r.registers,
                                    v.register_budget(),
                                    r.spill_bytes(),
                                    r.stack_bytes
                                );
                                let notes: Vec<&str> = c.log.lines().filter(|l| l.contains("(C75")).collect();
                                if r.registers == 0 {
                                    failures.push(format!("{}: no ptxas report in the log", v.name()));
                                } else if !notes.is_empty() {
                                    failures.push(format!(
                                        "{}: ptxas notes on wgmma:\n{}",
                                        v.name(),
                                        notes.join("\n")
                                    ));
                                } else if r.spill_bytes() > 0 || r.registers > v.register_budget() {
                                    failures.push(format!(
                                        "{}: {} registers (budget {}), {} B spilled",
                                        v.name(),
                                        r.registers,
                                        v.register_budget(),
                                        r.spill_bytes()
                                    ));
                                }
                            }
                        }
                    }
                    failures
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("compile thread panicked")).collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} compiles failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}
