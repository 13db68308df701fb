//! `attn verify`: the attn-verify suite on every available backend.

use attn::{Attention, Availability, Backend};
use attn_verify::planted::{Flaw, Planted};
use attn_verify::random::Pass;
use attn_verify::{Outcome, grid, report, run_suite};
use clap::Args;
use std::io::Write;

#[derive(Args)]
pub struct VerifyArgs {
    /// The quick grid (about thirty small cases, seconds) instead of the full one.
    #[arg(long)]
    quick: bool,
    /// Only these backends (repeatable); default: ATTN_BACKEND's, or every available one.
    #[arg(long)]
    backend: Vec<String>,
    /// Only the cases of these families (repeatable; e.g. `decode`, `long-keys`); default: all.
    #[arg(long)]
    family: Vec<String>,
    /// Also run the deliberately broken test backends, to see each caught (they are expected to
    /// fail and do not change the exit code).
    #[arg(long)]
    planted: bool,
    /// Machine-readable output: every result and the verdict.
    #[arg(long)]
    json: bool,
    /// Also verify the device-resident APIs of the GPU backends verified (`--backend`, or all
    /// available): `cuda-resident` (inputs in buffers of a caller's context and stream, run by
    /// `Cuda::run_on_stream`) and `wgpu-resident` (inputs in `wgpu::Buffer`s, run by
    /// `Wgpu::submit`). At least one must be available.
    #[arg(long)]
    resident: bool,
    /// The backward pass instead of the forward: the gradient grid (`attn_verify::grad`), each
    /// backend's dQ, dK, dV against the exact f64 gradients; backends without a backward pass
    /// skip every case, saying so.
    #[arg(long)]
    grad: bool,
    /// With `--grad`: ask for the deterministic backward (`BackwardOptions::deterministic`).
    #[arg(long, requires = "grad")]
    deterministic: bool,
    /// Instead of a grid: problems drawn at random over every feature (`attn_verify::random`)
    /// for this many minutes, each on every backend verified (the reference itself only by
    /// name), the forward pass or with `--grad` the backward; the first failure is shrunk to the
    /// smallest problem that still fails.
    #[arg(long, value_name = "MINUTES", conflicts_with_all = ["quick", "family", "planted"])]
    soak: Option<f64>,
    /// With `--soak`: the draw's seed (default: from the clock, printed).
    #[arg(long, requires = "soak")]
    seed: Option<u64>,
}

pub fn run(mut args: VerifyArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.backend.is_empty()
        && let Some(name) = Backend::named_by_env()
    {
        if !args.json {
            eprintln!("... ATTN_BACKEND={name}: verifying that backend alone");
        }
        args.backend.push(name);
    }
    // Each name as the build knows it (any case, `cpu` for cpu-flash); an unknown one is kept as
    // given, for the error below.
    for name in &mut args.backend {
        if let Some(known) = Backend::canonical(name) {
            *name = known.to_string();
        }
    }
    let mut backends: Vec<Box<dyn Attention>> = vec![];
    let mut skipped = vec![];
    for b in Backend::all()? {
        if !args.backend.is_empty() && !args.backend.iter().any(|n| n == b.name()) {
            continue;
        }
        match b.availability() {
            Availability::Available { .. } => backends.push(b),
            Availability::Unavailable { reason } => skipped.push((b.name().to_string(), reason)),
        }
    }
    if args.resident {
        let verified = |name: &str| backends.iter().any(|b| b.name() == name);
        let mut resident: Vec<Box<dyn Attention>> = vec![];
        if verified("cuda") {
            resident.push(Box::new(attn_cuda::OnStream::new(attn_cuda::Cuda::from_env()?)));
        }
        if verified("wgpu") {
            resident.push(Box::new(attn_wgpu::OnDevice::new(attn_wgpu::Wgpu::from_env()?)));
        }
        if resident.is_empty() {
            return Err("--resident needs CUDA or wgpu among the backends verified; neither is".into());
        }
        for r in resident {
            match r.availability() {
                Availability::Available { .. } => backends.push(r),
                Availability::Unavailable { reason } => {
                    return Err(format!("--resident: {} is unavailable here: {reason}", r.name()).into());
                }
            }
        }
    }
    for wanted in &args.backend {
        if !backends.iter().any(|b| b.name() == wanted) {
            let why =
                skipped.iter().find(|(n, _)| n == wanted).map_or("no such backend", |(_, r)| r.as_str());
            return Err(format!("backend `{wanted}` cannot be verified here: {why}").into());
        }
    }
    if let Some(minutes) = args.soak {
        return soak(&args, backends, minutes);
    }
    let mut cases = match (args.grad, args.quick) {
        (false, true) => grid::quick(),
        (false, false) => grid::full(),
        (true, true) => attn_verify::grad::quick(),
        (true, false) => attn_verify::grad::full(),
    };
    if !args.family.is_empty() {
        cases.retain(|c| args.family.iter().any(|f| f == c.family));
        if cases.is_empty() {
            return Err(format!("no case of the families {:?} in this grid", args.family).into());
        }
    }
    if !args.json {
        for (name, reason) in &skipped {
            eprintln!("skipped backend {name}: {reason}");
        }
        eprintln!("... {} cases on {} backend(s)", cases.len(), backends.len());
    }
    let refs: Vec<&dyn Attention> = backends.iter().map(|b| b.as_ref()).collect();
    let mut done = 0;
    let total = cases.len() * refs.len();
    let progress = |r: &attn_verify::CaseResult| {
        done += 1;
        if !args.json {
            let mark = match r.outcome {
                Outcome::Pass { .. } => ".",
                Outcome::Fail { .. } => "F",
                Outcome::Skip { .. } => "s",
            };
            eprint!("{mark}");
            if done % 60 == 0 || done == total {
                eprintln!(" {done}/{total}");
            }
            let _ = std::io::stderr().flush();
        }
    };
    let results = if args.grad {
        let options = attn::BackwardOptions { deterministic: args.deterministic };
        attn_verify::grad::run_grad_suite(&refs, &cases, options, progress)
    } else {
        run_suite(&refs, &cases, progress)
    };
    let planted = if args.planted && args.grad {
        use attn_verify::planted_grad::{GradFlaw, PlantedGrad};
        let planted: Vec<PlantedGrad> = GradFlaw::ALL.into_iter().map(PlantedGrad::new).collect();
        let refs: Vec<&dyn Attention> = planted.iter().map(|p| p as &dyn Attention).collect();
        attn_verify::grad::run_grad_suite(&refs, &attn_verify::grad::quick(), Default::default(), |_| {})
    } else if args.planted {
        let planted: Vec<Planted> = Flaw::ALL.into_iter().map(Planted::new).collect();
        let refs: Vec<&dyn Attention> = planted.iter().map(|p| p as &dyn Attention).collect();
        run_suite(&refs, &grid::quick(), |_| {})
    } else {
        vec![]
    };
    let failed = results.iter().any(|r| r.outcome.is_fail());
    if args.json {
        let json = serde_json::json!({
            "verdict": report::verdict(&results),
            "passed": !failed,
            "skipped_backends": skipped,
            "results": results,
            "planted": planted,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{}", report::table(&results));
        if args.planted {
            println!("\nplanted bugs (each must be caught):");
            let mut names: Vec<&str> = vec![];
            for r in &planted {
                if !names.contains(&r.backend.as_str()) {
                    names.push(&r.backend);
                }
            }
            for name in names {
                let caught: Vec<&str> = planted
                    .iter()
                    .filter(|r| r.backend == name && r.outcome.is_fail())
                    .map(|r| r.case.as_str())
                    .collect();
                println!(
                    "  {name:<28} caught by {} case(s), first: {}",
                    caught.len(),
                    caught.first().unwrap_or(&"NONE")
                );
            }
        }
    }
    if failed { Err("verification failed".into()) } else { Ok(()) }
}

/// `--soak`: random cases on `backends` for `minutes`.
fn soak(
    args: &VerifyArgs,
    mut backends: Vec<Box<dyn Attention>>,
    minutes: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    if !(minutes.is_finite() && minutes > 0.0) {
        return Err(format!("--soak {minutes}: a positive number of minutes").into());
    }
    if !args.backend.iter().any(|n| n == "cpu-reference") {
        backends.retain(|b| b.name() != "cpu-reference");
    }
    if backends.is_empty() {
        return Err("--soak: no backend to verify besides the reference".into());
    }
    let seed = args.seed.unwrap_or_else(attn_verify::random::clock_seed);
    let names: Vec<&str> = backends.iter().map(|b| b.name()).collect();
    let what = if args.grad { "gradients" } else { "outputs" };
    eprintln!(
        "... random cases' {what} for {minutes} min on {} (--seed {seed} repeats the draw)",
        names.join(", ")
    );
    let refs: Vec<&dyn Attention> = backends.iter().map(|b| b.as_ref()).collect();
    let time = std::time::Duration::from_secs_f64(minutes * 60.0);
    let pass = match args.grad {
        true => Pass::Backward(attn::BackwardOptions { deterministic: args.deterministic }),
        false => Pass::Forward,
    };
    let tally = attn_verify::random::soak(&refs, pass, usize::MAX, time, seed);
    let rows: Vec<serde_json::Value> = tally
        .ran
        .iter()
        .map(|(name, ran, skipped, time)| {
            serde_json::json!({"backend": name, "ran": ran, "skipped": skipped, "seconds": time.as_secs_f64()})
        })
        .collect();
    let failure =
        tally.failure.as_ref().map(|(spec, why)| format!("{why}\nsmallest failing case: {spec:#?}"));
    if args.json {
        let json =
            serde_json::json!({"seed": seed, "cases": tally.cases, "backends": rows, "failure": failure});
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!("random cases: {} (seed {seed})", tally.cases);
        for (name, ran, skipped, time) in &tally.ran {
            println!("  {name:<14} {ran} passed, {skipped} refused by its plan, {:.1} s", time.as_secs_f64());
        }
        if let Some(f) = &failure {
            println!("FAIL: {f}");
        }
    }
    if failure.is_some() { Err("verification failed".into()) } else { Ok(()) }
}
