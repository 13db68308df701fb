//! The CI steps and the runner that strings them together.
//!
//! Adding a check means adding one [`Step`] to [`STEPS`]: `test` runs it in order, `help` lists
//! it, and it becomes a subcommand of its own.

use std::path::{Path, PathBuf};
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

/// The profile the steps after `tests` build with: the test profile's artifacts (opt-level 1)
/// are already built by then, where a release build would compile the workspace and every
/// dependency once more (most of CI's time on a 2-core machine); the kernels under test run on
/// lavapipe, which compiles them itself, and the quick grid is small.
const RUN_PROFILE: [&str; 2] = ["--profile", "test"];

/// `attn verify --quick --planted`: the backend × case-family table in the CI log (the same
/// suite also runs as a test; this shows what ran and what was skipped, by name).
fn verify() -> Result<(), String> {
    let args =
        [&["run"][..], &RUN_PROFILE, &["--quiet", "-p", "attn", "--", "verify", "--quick", "--planted"]];
    cmd::cargo_run(&args.concat())
}

/// `cargo fmt --all -- --check`.
fn fmt() -> Result<(), String> {
    cmd::cargo_run(&["fmt", "--all", "--", "--check"])
}

/// `cargo clippy --workspace --all-targets -- -D warnings`: warnings fail CI so they never pile up.
fn clippy() -> Result<(), String> {
    cmd::cargo_run(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])
}

/// `cargo test --workspace --all-targets`; `--all-targets` leaves out doc tests, hence `doc-tests`.
fn tests() -> Result<(), String> {
    cmd::cargo_run(&["test", "--workspace", "--all-targets"])
}

/// `cargo test --workspace --doc`.
fn doc_tests() -> Result<(), String> {
    cmd::cargo_run(&["test", "--workspace", "--doc"])
}

/// Runs the quickstart example, the one the docs point newcomers at. Until it exists, runs every
/// example in the workspace instead, so that the step still checks something.
fn examples() -> Result<(), String> {
    let root = cmd::workspace_root();
    if root.join("crates/attn/examples/quickstart.rs").is_file() {
        return cmd::cargo_run(
            &[&["run"][..], &RUN_PROFILE, &["-p", "attn", "--example", "quickstart"]].concat(),
        );
    }
    let found = all_examples(&root);
    if found.is_empty() {
        println!("note: no examples under crates/*/examples yet; nothing to run");
        return Ok(());
    }
    println!("note: crates/attn/examples/quickstart.rs does not exist yet; running every example");
    for (package, example) in found {
        cmd::cargo_run(&[&["run"][..], &RUN_PROFILE, &["-p", &package, "--example", &example]].concat())?;
    }
    Ok(())
}

/// `(package, example)` for every example cargo discovers on its own: `examples/<name>.rs` and
/// `examples/<name>/main.rs`, in a stable order.
fn all_examples(root: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for crate_dir in sorted_entries(&root.join("crates")) {
        let Some(package) = package_name(&crate_dir) else { continue };
        for entry in sorted_entries(&crate_dir.join("examples")) {
            let is_example = if entry.is_dir() {
                entry.join("main.rs").is_file()
            } else {
                entry.extension().is_some_and(|e| e == "rs")
            };
            let name = entry.file_stem().map(|s| s.to_string_lossy().into_owned());
            if let (true, Some(name)) = (is_example, name) {
                found.push((package.clone(), name));
            }
        }
    }
    found
}

/// The entries of `dir`, sorted; empty if it does not exist.
fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    entries.sort();
    entries
}

/// The `name` in a crate's `[package]` table; a line scan is enough for the manifests in this
/// repository and spares a TOML dependency.
fn package_name(crate_dir: &Path) -> Option<String> {
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).ok()?;
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package && let Some(value) = line.strip_prefix("name") {
            let value = value.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_string());
        }
    }
    None
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

/// The example discovery is the only logic here not exercised by every CI run.
#[cfg(test)]
mod tests {
    use super::*;

    /// A throwaway workspace with one crate holding both kinds of example and a non-example file.
    fn fake_workspace() -> PathBuf {
        let root = std::env::temp_dir().join(format!("xtask-steps-{}", std::process::id()));
        let krate = root.join("crates/some-dir");
        std::fs::create_dir_all(krate.join("examples/multi")).unwrap();
        let manifest = "[workspace]\nname = \"not-this\"\n\n[package]\nname = \"pkg\"\nedition = \"2024\"\n";
        std::fs::write(krate.join("Cargo.toml"), manifest).unwrap();
        std::fs::write(krate.join("examples/single.rs"), "fn main() {}").unwrap();
        std::fs::write(krate.join("examples/multi/main.rs"), "fn main() {}").unwrap();
        std::fs::write(krate.join("examples/README.md"), "").unwrap();
        root
    }

    /// The package name comes from the manifest, and only cargo's two example layouts count.
    #[test]
    fn finds_examples_under_the_package_name_not_the_directory() {
        let root = fake_workspace();
        let found = all_examples(&root);
        std::fs::remove_dir_all(&root).unwrap();
        let pair = |e: &str| ("pkg".to_string(), e.to_string());
        assert_eq!(found, vec![pair("multi"), pair("single")]);
    }

    /// A workspace without `crates/` is not an error, just nothing to run.
    #[test]
    fn no_crates_dir_means_no_examples() {
        assert!(all_examples(Path::new("/nonexistent-xtask-root")).is_empty());
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
