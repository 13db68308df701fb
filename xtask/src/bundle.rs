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

/// `ATTN_BASE=<commit> cargo xtask bundle-base`: the backward's and the CLI's binaries built at
/// another commit into `.device/base` (with its `COMMIT`), so that one device call can time a
/// change that has no knob against the build before it (`BIN=.device/base` in
/// `bench/device/backward-ab.sh`'s settings). The commit is checked out in a git worktree under
/// `target/base/`, built with its own target folder (`target/base-target`, kept between calls).
pub fn bundle_base() -> Result<(), String> {
    let commit =
        std::env::var("ATTN_BASE").map_err(|_| "set ATTN_BASE to the commit to build".to_string())?;
    let root = cmd::workspace_root();
    let full = cmd::output("git", &["rev-parse", "--verify", &format!("{commit}^{{commit}}")])
        .ok_or_else(|| format!("ATTN_BASE={commit} is not a commit of this repository"))?;
    let short = &full[..full.len().min(7)];
    let tree = root.join("target/base").join(short);
    if !tree.exists() {
        cmd::run("git", &["worktree", "add", "--detach", &tree.to_string_lossy(), &full])?;
    }
    let target_dir = root.join("target/base-target");
    let manifest = tree.join("Cargo.toml");
    let (manifest, target) = (manifest.to_string_lossy(), target_dir.to_string_lossy());
    let base = root.join(".device/base");
    std::fs::create_dir_all(&base).map_err(|e| format!("create {}: {e}", base.display()))?;
    for (package, example) in [("attn", None), ("attn-cuda", Some("backward_bench"))] {
        let mut args =
            vec!["build", "--release", "--manifest-path", &manifest, "--target-dir", &target, "-p", package];
        args.extend(example.iter().flat_map(|e| ["--example", e]));
        cmd::cargo_run(&args)?;
        let name = example.unwrap_or(package);
        let built = match example {
            Some(e) => target_dir.join("release/examples").join(e),
            None => target_dir.join("release").join(package),
        };
        std::fs::copy(&built, base.join(name)).map_err(|e| format!("copy {}: {e}", built.display()))?;
        if cmd::run("strip", &[&base.join(name).to_string_lossy()]).is_err() {
            println!("(strip failed on {name}; it keeps its debug information)");
        }
    }
    std::fs::write(base.join("COMMIT"), short).map_err(|e| format!("write COMMIT: {e}"))?;
    println!("bundled attn and backward_bench at {short} into .device/base (carry .device/base too)");
    Ok(())
}
