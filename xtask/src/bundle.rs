//! `cargo xtask bundle`: what the GPU machine needs, which has no Rust toolchain. Builds the
//! release `attn`, attn-wgpu's diagnostic examples (`pipeline_stats`, `adapters`, `fma_peak`),
//! attn-cuda's `cubin`, `resident_overhead` and `decode_bench` examples, and the test binaries
//! that need a GPU (`test-cuda-resident`, `test-cuda-gpu_smoke`, `test-wgpu-resident`) here (same
//! x86-64), copies them, stripped, into `.device/bin` (git-ignored, sent with the device tool's
//! `carry`), records the commit, and prints the command to run there.

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
        ("attn", "backward_dump"),
        ("attn-wgpu", "pipeline_stats"),
        ("attn-wgpu", "adapters"),
        ("attn-wgpu", "fma_peak"),
        ("attn-cuda", "cubin"),
        ("attn-cuda", "resident_overhead"),
        ("attn-cuda", "decode_bench"),
        ("attn-cuda", "backward_bench"),
        ("attn-cuda", "row_align"),
    ];
    for (package, example) in examples {
        cmd::cargo_run(&["build", "--release", "-p", package, "--example", example])?;
        std::fs::copy(root.join("target/release/examples").join(example), bin.join(example))
            .map_err(|e| format!("copy {example}: {e}"))?;
    }
    // Test binaries that need a GPU: cargo names them with a hash, which its JSON messages give.
    for (package, test) in [
        ("attn-cuda", "resident"),
        ("attn-cuda", "append"),
        ("attn-cuda", "gpu_smoke"),
        ("attn-wgpu", "resident"),
    ] {
        let args = ["test", "--release", "-p", package, "--test", test, "--no-run", "--message-format=json"];
        cmd::cargo_run(&args[..args.len() - 1])?;
        let messages = cmd::output(&cmd::cargo().to_string_lossy(), &args)
            .ok_or_else(|| format!("cargo test --no-run --test {test} failed"))?;
        let executable = messages
            .lines()
            .filter(|l| l.contains(&format!("\"name\":\"{test}\"")))
            .find_map(|l| l.split("\"executable\":\"").nth(1)?.split('"').next())
            .ok_or_else(|| format!("no executable for the test {test} in cargo's messages"))?;
        let name = format!("test-{}-{test}", package.trim_start_matches("attn-"));
        std::fs::copy(executable, bin.join(name)).map_err(|e| format!("copy {executable}: {e}"))?;
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
