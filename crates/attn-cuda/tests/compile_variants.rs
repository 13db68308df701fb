//! Every kernel specialisation the backend can choose compiles with NVRTC, with no warning, no
//! spill, registers within the variant's budget and none of ptxas's notes on wgmma pipelines:
//! the Ampere/Ada family for sm_80, sm_89 and sm_90a, the Hopper family for sm_90a. Runs on a
//! machine without a GPU; CI requires NVRTC (ATTN_REQUIRE_NVRTC=1), elsewhere each test is
//! skipped by name when NVRTC is missing.

use attn_cuda::{Arch, CompileRequest, compile, hopper, nvrtc_available, plan};

/// One compilation to check.
struct Job {
    /// The variant and architecture, for messages.
    name: String,
    request: CompileRequest,
    /// The entry function whose resources are checked.
    entry: &'static str,
    /// Registers per thread the variant may use.
    budget: u32,
}

/// Whether NVRTC is here; if not, the test is reported skipped by name (or fails where CI
/// requires NVRTC).
fn nvrtc_or_skip(test: &str) -> bool {
    match nvrtc_available() {
        Ok(()) => true,
        Err(reason) if std::env::var("ATTN_REQUIRE_NVRTC").as_deref() == Ok("1") => {
            panic!("NVRTC is required (ATTN_REQUIRE_NVRTC=1) but unavailable: {reason}")
        }
        Err(reason) => {
            println!("SKIPPED {test}: {reason}");
            false
        }
    }
}

/// Compiles the jobs on every core and returns what is wrong with each that fails: a compile
/// error, no ptxas report, a spill, registers over the budget, or a note of ptxas's on wgmma
/// (C75xx: fences it had to inject, or every wgmma serialized because it could not prove a
/// group complete before its registers were used).
fn check_all(jobs: &[Job]) -> Vec<String> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .chunks(jobs.len().div_ceil(threads).max(1))
            .map(|chunk| s.spawn(move || chunk.iter().filter_map(check).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("compile thread panicked")).collect()
    })
}

fn check(job: &Job) -> Option<String> {
    let c = match compile(&job.request) {
        Ok(c) => c,
        Err(e) => return Some(format!("{}: {e}", job.name)),
    };
    let r = c.resources_of(job.entry).cloned().unwrap_or_default();
    println!(
        "{:<60} {:>3} registers (budget {}), {} B spilled, {} B stack",
        job.name,
        r.registers,
        job.budget,
        r.spill_bytes(),
        r.stack_bytes
    );
    let notes: Vec<&str> = c.log.lines().filter(|l| l.contains("(C75")).collect();
    if r.registers == 0 {
        Some(format!("{}: no ptxas report in the log", job.name))
    } else if !notes.is_empty() {
        Some(format!("{}: ptxas notes on wgmma:\n{}", job.name, notes.join("\n")))
    } else if r.spill_bytes() > 0 || r.registers > job.budget {
        Some(format!(
            "{}: {} registers (budget {}), {} B spilled",
            job.name,
            r.registers,
            job.budget,
            r.spill_bytes()
        ))
    } else {
        None
    }
}

fn assert_all_pass(jobs: &[Job]) {
    let failures = check_all(jobs);
    assert!(
        failures.is_empty(),
        "{} of {} compiles failed:\n{}",
        failures.len(),
        jobs.len(),
        failures.join("\n")
    );
}

#[test]
fn every_variant_compiles_without_spills_for_every_arch() {
    if !nvrtc_or_skip("every_variant_compiles_without_spills_for_every_arch") {
        return;
    }
    let jobs: Vec<Job> = plan::Variant::all()
        .into_iter()
        .flat_map(|v| [Arch::Sm80, Arch::Sm89, Arch::Sm90a].map(move |a| (v, a)))
        .map(|(v, arch)| Job {
            name: format!("{} {arch}", v.name()),
            request: v.request(arch),
            entry: "attn_fwd",
            budget: v.register_budget(),
        })
        .collect();
    assert_all_pass(&jobs);
}

/// The Hopper family, for sm_90a only; with `setmaxnreg` the budget is the cap at entry (the
/// consumers then claim more, which ptxas's spill count covers).
#[test]
fn every_hopper_variant_compiles_without_spills() {
    if !nvrtc_or_skip("every_hopper_variant_compiles_without_spills") {
        return;
    }
    let jobs: Vec<Job> = hopper::Variant::all()
        .into_iter()
        .map(|v| Job {
            name: v.name(),
            request: v.request(),
            entry: "attn_fwd_sm90",
            budget: v.register_budget(),
        })
        .collect();
    assert_all_pass(&jobs);
}
