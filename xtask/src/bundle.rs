//! `cargo xtask bundle`: what the GPU machine needs, which has no Rust toolchain. Builds the
//! release `attn`, attn-wgpu's diagnostic examples (`pipeline_stats`, `adapters`, `fma_peak`)
//! and attn-cuda's `cubin` here (same x86-64), copies them, stripped,
//! into `.device/bin` (git-ignored, sent with the device tool's `carry`), records the commit,
//! and prints the command to run there.

use crate::cmd;

/// Builds and stages the bundle.
pub fn bundle() -> Result<(), String> {
    cmd::cargo_run(&["build", "--release", "-p", "attn"])?;
    let root = cmd::workspace_root();
    let bin = root.join(".device/bin");
    std::fs::create_dir_all(&bin).map_err(|e| format!("create {}: {e}", bin.display()))?;
    std::fs::copy(root.join("target/release/attn"), bin.join("attn"))
        .map_err(|e| format!("copy attn: {e}"))?;
    let examples = [
        ("attn-wgpu", "pipeline_stats"),
        ("attn-wgpu", "adapters"),
        ("attn-wgpu", "fma_peak"),
        ("attn-cuda", "cubin"),
    ];
    for (package, example) in examples {
        cmd::cargo_run(&["build", "--release", "-p", package, "--example", example])?;
        std::fs::copy(root.join("target/release/examples").join(example), bin.join(example))
            .map_err(|e| format!("copy {example}: {e}"))?;
    }
    // Without their debug information the binaries are a tenth of the size: the device tool
    // carries at most 64 MiB.
    for entry in std::fs::read_dir(&bin).map_err(|e| format!("list {}: {e}", bin.display()))?.flatten() {
        if cmd::run("strip", &[&entry.path().to_string_lossy()]).is_err() {
            println!("(strip failed on {}; the bundle keeps its debug information)", entry.path().display());
        }
    }
    let commit = cmd::output("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        cmd::output("git", &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let commit = if dirty { format!("{commit}+dirty") } else { commit };
    std::fs::write(root.join(".device/COMMIT"), &commit).map_err(|e| format!("write COMMIT: {e}"))?;
    println!("bundled attn at {commit} into .device/bin");
    println!("on the GPU machine (carry .device):  bash bench/device/gpu.sh   # or bench/device/cpu.sh");
    Ok(())
}
