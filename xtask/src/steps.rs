//! The CI steps and the runner that strings them together.
//!
//! Adding a check means adding one [`Step`] to [`STEPS`]: `test` runs it in order, `help` lists
//! it, and it becomes a subcommand of its own.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::{cmd, cuda, env, prereq, size, vulkan};

/// One named CI check.
pub struct Step {
    /// The subcommand name, also used in headers, errors and the summary.
    pub name: &'static str,
    /// What the step guards against; shown in its header and in `help`.
    pub why: &'static str,
    /// Runs the check; the error says what failed, the step name is added by the runner.
    pub run: fn() -> Result<(), String>,
}

/// Every step, in the order `cargo xtask test` runs them: cheapest first, so that a formatting
/// slip fails in seconds rather than after a full build.
pub const STEPS: &[Step] = &[
    Step {
        name: "size",
        why: "bench/results/ under 2 MB, tracked files outside crates/ under 5 MB",
        run: size::check,
    },
    Step { name: "fmt", why: "formatting matches rustfmt.toml", run: fmt },
    Step { name: "clippy", why: "no compiler or clippy warnings in any target", run: clippy },
    Step { name: "tests", why: "unit, integration and example-target tests pass", run: tests },
    Step { name: "doc-tests", why: "code in doc comments compiles and passes", run: doc_tests },
    Step { name: "examples", why: "the shipped examples run to completion", run: examples },
    Step {
        name: "verify",
        why: "every available backend agrees with the f64 reference; planted bugs are caught",
        run: verify,
    },
];

/// `attn verify --quick --planted`: the backend × case-family table in the CI log (the same
/// suite also runs as a test; this shows what ran and what was skipped, by name). It runs the
/// `attn` binary of the `tests` step's build (cargo builds a package's binaries for its
/// integration tests; asking for that build again rebuilds nothing after `tests`, and brings a
/// stale binary up to date when this step runs alone): `cargo run` would resolve the
/// dependencies' features without the dev-dependencies and build much of the workspace again.
fn verify() -> Result<(), String> {
    cmd::cargo_run(&[&["test", "--no-run", "--quiet"][..], &TESTS_TARGETS].concat())?;
    let root = cmd::workspace_root();
    // A relative CARGO_TARGET_DIR is cargo's, relative to where it runs: the workspace root.
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |t| root.join(t));
    let attn = target.join("debug/attn");
    if !attn.is_file() {
        return Err(format!(
            "{} is missing after the tests' build (another target-dir setting?)",
            attn.display()
        ));
    }
    cmd::run(attn, &["verify", "--quick", "--planted"])
}

/// `cargo fmt --all -- --check`.
fn fmt() -> Result<(), String> {
    cmd::cargo_run(&["fmt", "--all", "--", "--check"])
}

/// `cargo clippy --workspace --all-targets -- -D warnings`: warnings fail CI so they never pile up.
fn clippy() -> Result<(), String> {
    cmd::cargo_run(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])
}

/// `cargo test` of every target but the examples (the next step's) and the doc tests
/// (`doc-tests`).
fn tests() -> Result<(), String> {
    cmd::cargo_run(&[&["test"][..], &TESTS_TARGETS].concat())
}

/// What the `tests` step builds and runs: every target but the examples and the doc tests.
const TESTS_TARGETS: [&str; 5] = ["--workspace", "--lib", "--bins", "--tests", "--benches"];

/// `cargo test --workspace --doc`.
fn doc_tests() -> Result<(), String> {
    cmd::cargo_run(&["test", "--workspace", "--doc"])
}

/// `cargo test --workspace --examples`: builds every example from the `tests` step's build
/// (the same features, so nothing else is rebuilt) and runs the ones without a test harness,
/// the quickstart the docs point newcomers at among them. Fails if the quickstart is missing or
/// would not run.
fn examples() -> Result<(), String> {
    let root = cmd::workspace_root();
    if !root.join("crates/attn/examples/quickstart.rs").is_file() {
        return Err("crates/attn/examples/quickstart.rs is missing".into());
    }
    let manifest = std::fs::read_to_string(root.join("crates/attn/Cargo.toml")).map_err(|e| e.to_string())?;
    if !runs_without_harness(&manifest, "quickstart") {
        return Err(
            "crates/attn/Cargo.toml must declare the quickstart example with `harness = false` (and \
                    `test = true`), or this step would build it without running it"
                .into(),
        );
    }
    cmd::cargo_run(&["test", "--workspace", "--examples"])
}

/// Whether `manifest` declares the example `name` as a test without a harness: an
/// `[[example]]` table with `name = "<name>"`, `test = true` and `harness = false`, in any order.
fn runs_without_harness(manifest: &str, name: &str) -> bool {
    manifest.split("[[example]]").skip(1).any(|table| {
        let table = table.split("\n[").next().unwrap_or("");
        let has = |key: &str, value: &str| {
            table
                .lines()
                .any(|l| l.split('#').next().unwrap_or("").replace(' ', "") == format!("{key}={value}"))
        };
        has("name", &format!("\"{name}\"")) && has("test", "true") && has("harness", "false")
    })
}

/// How one step ended, for the summary.
struct Outcome {
    /// The step's name.
    name: &'static str,
    /// Wall time the step took.
    took: Duration,
    /// `None` on success, otherwise why it failed.
    error: Option<String>,
}

/// Runs one step under a header naming it, and times it.
fn run_step(step: &Step) -> Outcome {
    println!();
    println!("==> step `{}`: {}", step.name, step.why);
    let start = Instant::now();
    let error = (step.run)().err();
    Outcome { name: step.name, took: start.elapsed(), error }
}

/// `cargo xtask <step>`: one step alone, without the inventory or the summary.
pub fn run_one(step: &Step) -> ExitCode {
    // Paths only: a single step reruns on whatever machine it is, NVRTC or lavapipe or not.
    cmd::set_child_env([cuda::child_env(false), vulkan::child_env(false)].concat());
    let outcome = run_step(step);
    match outcome.error {
        None => ExitCode::SUCCESS,
        Some(e) => {
            eprintln!("error: step `{}` failed: {e}", step.name);
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask test`: prerequisites, inventory, then every step, stopping at the first failure
/// because later steps mostly rebuild what an earlier one already found broken.
pub fn run_all() -> ExitCode {
    let start = Instant::now();
    let mut outcomes = Vec::new();
    // A failed install is reported like a failed step, so the closing count never reads as a pass.
    if let Err(e) = prereq::install_missing() {
        outcomes.push(Outcome { name: "prerequisites", took: start.elapsed(), error: Some(e) });
    } else {
        env::print_inventory();
        // The prerequisites are installed now, so CI requires NVRTC and a wgpu adapter
        // (lavapipe at least): their tests fail, not skip.
        cmd::set_child_env([cuda::child_env(true), vulkan::child_env(true)].concat());
        for step in STEPS {
            let outcome = run_step(step);
            let failed = outcome.error.is_some();
            outcomes.push(outcome);
            if failed {
                break;
            }
        }
    }
    summarize(&outcomes, start.elapsed())
}

/// Prints a line per step with its time, the errors again (they may be far up the log), and the
/// closing count; returns the exit code for the whole run.
fn summarize(outcomes: &[Outcome], total: Duration) -> ExitCode {
    let ran: Vec<&str> = outcomes.iter().map(|o| o.name).collect();
    let not_run: Vec<&str> = STEPS.iter().map(|s| s.name).filter(|n| !ran.contains(n)).collect();
    let width = ran.iter().chain(&not_run).map(|n| n.len()).max().unwrap_or(0);

    println!();
    println!("summary ({:.1}s):", total.as_secs_f64());
    for outcome in outcomes {
        let verdict = if outcome.error.is_some() { "FAILED" } else { "ok" };
        println!("  {:width$}  {verdict:<6} {:>7.1}s", outcome.name, outcome.took.as_secs_f64());
    }
    for name in &not_run {
        println!("  {name:width$}  not run");
    }
    let mut failed = 0;
    for outcome in outcomes {
        if let Some(e) = &outcome.error {
            failed += 1;
            eprintln!("error: step `{}` failed: {e}", outcome.name);
        }
    }
    // Kept last and in exactly this shape: it is the line the CI reader looks for.
    println!("{} passed, {failed} failed", outcomes.len() - failed);
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// The step table is data: check what a typo there would break.
#[cfg(test)]
mod tests {
    use super::*;

    /// The examples step's check reads the keys in any order, with comments and spacing.
    #[test]
    fn finds_an_example_declared_without_a_harness() {
        let toml = "[package]\nname = \"x\"\n\n[[example]]\nharness = false # runs main\nname  =  \"quickstart\"\ntest = true\n";
        assert!(runs_without_harness(toml, "quickstart"));
        assert!(!runs_without_harness(toml, "other"));
        assert!(!runs_without_harness(&toml.replace("harness = false", "harness = true"), "quickstart"));
        let split =
            "[[example]]\nname = \"quickstart\"\n\n[dev-dependencies]\nharness = false\ntest = true\n";
        assert!(!runs_without_harness(split, "quickstart"));
    }

    /// Names are subcommands, so a duplicate would make one step unreachable.
    #[test]
    fn step_names_are_unique() {
        let mut names: Vec<&str> = STEPS.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), STEPS.len());
    }
}
