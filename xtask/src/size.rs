//! `cargo xtask size`: the tree stays small enough to clone fast and to carry to a GPU machine
//! (whose tool takes 64 MiB in all): measured results stay what the docs cite, not raw logs.

use crate::cmd;

/// Most bytes `bench/results/` may hold: one small file per current figure.
const RESULTS_MAX: u64 = 2 << 20;
/// Most bytes the tracked files outside `crates/` and `Cargo.lock` may hold.
const OUTSIDE_CRATES_MAX: u64 = 5 << 20;

/// Sums the sizes of the tracked files and fails past either limit.
pub fn check() -> Result<(), String> {
    let root = cmd::workspace_root();
    let listed =
        cmd::output("git", &["ls-files", "-z"]).ok_or("`git ls-files` failed: is this a git checkout?")?;
    let (mut results, mut outside, mut biggest) = (0u64, 0u64, Vec::new());
    for path in listed.split('\0').filter(|p| !p.is_empty()) {
        // A file deleted but not yet committed is still listed; it takes no room.
        let Ok(meta) = std::fs::metadata(root.join(path)) else { continue };
        let bytes = meta.len();
        if path.starts_with("bench/results/") {
            results += bytes;
        }
        if !path.starts_with("crates/") && path != "Cargo.lock" {
            outside += bytes;
            biggest.push((bytes, path.to_string()));
        }
    }
    biggest.sort_unstable_by(|a, b| b.cmp(a));
    println!(
        "bench/results/: {results} B (at most {RESULTS_MAX}); outside crates/ and Cargo.lock: {outside} B (at most {OUTSIDE_CRATES_MAX})"
    );
    let top: Vec<String> = biggest.iter().take(5).map(|(b, p)| format!("{p} ({b} B)")).collect();
    if results > RESULTS_MAX {
        return Err(format!(
            "bench/results/ holds {results} B, over {RESULTS_MAX}: keep one small file per figure the docs cite (git history keeps the rest)"
        ));
    }
    if outside > OUTSIDE_CRATES_MAX {
        return Err(format!(
            "tracked files outside crates/ hold {outside} B, over {OUTSIDE_CRATES_MAX}; the largest: {}",
            top.join(", ")
        ));
    }
    Ok(())
}
