//! Running child processes the way every step wants: from the workspace root, output shown live,
//! and failure turned into an error that says what was run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Extra environment for every child [`run`] starts, set once before the first step.
static CHILD_ENV: OnceLock<Vec<(&'static str, OsString)>> = OnceLock::new();

/// Sets the environment every later child process gets on top of ours (e.g. where NVRTC is).
/// Only the first call counts: the steps of one run must all see the same environment.
pub fn set_child_env(vars: Vec<(&'static str, OsString)>) {
    for (name, value) in &vars {
        println!("environment for steps: {name}={}", value.to_string_lossy());
    }
    let _ = CHILD_ENV.set(vars);
}

/// The workspace root, so that steps behave the same whatever directory `cargo xtask` ran from.
pub fn workspace_root() -> PathBuf {
    // Compile-time path: this crate always sits one level below the root.
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The cargo that launched us, so nested builds use the same toolchain rather than whatever
/// `cargo` happens to be first on `PATH`.
pub fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into())
}

/// Runs `cargo` with `args` in the workspace root, inheriting stdio.
pub fn cargo_run(args: &[&str]) -> Result<(), String> {
    run(cargo(), args)
}

/// Runs `program` with `args` in the workspace root, inheriting stdio, and fails unless it exits 0.
pub fn run(program: impl Into<OsString>, args: &[&str]) -> Result<(), String> {
    let program = program.into();
    let shown = shown(&program, args);
    println!("$ {shown}");
    let status = Command::new(&program)
        .args(args)
        .envs(CHILD_ENV.get().into_iter().flatten().map(|(k, v)| (k, v)))
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("could not start `{shown}`: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("`{shown}` exited with {status}")) }
}

/// Runs `program` with `args` and returns its trimmed stdout, or `None` if it is missing or fails;
/// for probes, where absence is an answer rather than an error.
pub fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).current_dir(workspace_root()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The command line as a person would retype it: `cargo` rather than the toolchain's full path.
fn shown(program: &OsString, args: &[&str]) -> String {
    let name = Path::new(program).file_name().unwrap_or(program.as_os_str()).to_string_lossy();
    std::iter::once(name.as_ref()).chain(args.iter().copied()).collect::<Vec<_>>().join(" ")
}
