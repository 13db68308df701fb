//! The project's CI driver: `cargo xtask test` is the whole check, and each of its steps is also a
//! subcommand of its own so that a person can rerun just the one that failed.
//!
//! Plain std on purpose: this crate has to build on a bare machine before anything else does.

mod bundle;
mod cmd;
mod cuda;
mod env;
mod prereq;
mod size;
mod steps;
mod vulkan;

use std::process::ExitCode;

/// A subcommand that is not one of the CI steps.
struct Extra {
    /// What a person types after `cargo xtask`.
    name: &'static str,
    /// One line for `cargo xtask help`.
    about: &'static str,
    /// The whole subcommand; its exit code is the process's.
    run: fn() -> ExitCode,
}

/// Subcommands besides the single steps, in the order `help` lists them.
const EXTRAS: &[Extra] = &[
    Extra {
        name: "test",
        about: "the full CI check: environment inventory, then every step",
        run: steps::run_all,
    },
    Extra { name: "env", about: "print the environment inventory that `test` starts with", run: env::run },
    Extra {
        name: "prerequisites",
        about: "install what optional backends need (NVRTC for CUDA, lavapipe for wgpu); `test` does this first",
        run: prereq::run,
    },
    Extra {
        name: "bundle",
        about: "build release binaries into .device/ for the GPU machine and print its command",
        run: || exit_code(bundle::bundle()),
    },
    Extra {
        name: "bundle-base",
        about: "ATTN_BASE=<commit>: build attn and backward_bench at that commit into .device/base, to time against",
        run: || exit_code(bundle::bundle_base()),
    },
    Extra {
        name: "vulkan-loader",
        about: "download the Vulkan loader and libglvnd .debs into .gl/ for the GPU machine (carry .gl there)",
        run: || exit_code(vulkan::fetch_loader_debs()),
    },
    Extra { name: "help", about: "list the subcommands", run: help },
];

/// Success, or the error printed and failure.
fn exit_code(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Dispatches on the one argument; usage errors exit 2 so they read differently from a failed step.
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first() else {
        return help();
    };
    // Extra arguments would be silently dropped otherwise, which hides typos such as `test fmt`.
    if args.len() > 1 {
        eprintln!("error: `cargo xtask {name}` takes no arguments, got: {}", args[1..].join(" "));
        return ExitCode::from(2);
    }
    if matches!(name.as_str(), "-h" | "--help") {
        return help();
    }
    if let Some(extra) = EXTRAS.iter().find(|e| e.name == name) {
        return (extra.run)();
    }
    if let Some(step) = steps::STEPS.iter().find(|s| s.name == name) {
        return steps::run_one(step);
    }
    eprintln!("error: unknown subcommand `{name}`; `cargo xtask help` lists them");
    ExitCode::from(2)
}

/// Prints every subcommand with its one-line description; the steps' text comes from their `why`,
/// so the list cannot drift from what `test` actually runs.
fn help() -> ExitCode {
    println!("usage: cargo xtask <subcommand>");
    println!();
    let width = EXTRAS.iter().map(|e| e.name.len()).chain(steps::STEPS.iter().map(|s| s.name.len())).max();
    let width = width.unwrap_or(0);
    for extra in EXTRAS {
        println!("  {:width$}  {}", extra.name, extra.about);
    }
    println!();
    println!("single steps of `test`, in the order it runs them:");
    for step in steps::STEPS {
        println!("  {:width$}  {}", step.name, step.why);
    }
    ExitCode::SUCCESS
}
