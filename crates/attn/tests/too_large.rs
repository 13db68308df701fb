//! A problem too large for this machine is a typed error from the command, before anything is
//! allocated: not an abort, not the OOM killer.

use std::process::Command;

#[test]
fn run_and_bench_refuse_problems_past_the_memory_available() {
    for args in [
        &["run", "--seq", "1000000000"][..],
        &["run", "--seq-q", "1", "--seq-k", "1000000000"],
        &["run", "--batch", "1000000", "--heads", "1000000"],
        &["bench", "--seqs", "1000000000", "--dims", "128", "--dtypes", "bf16", "--masks", "none"],
        &[
            "bench",
            "--backward",
            "--seqs",
            "1000000000",
            "--dims",
            "128",
            "--dtypes",
            "bf16",
            "--masks",
            "none",
        ],
    ] {
        let out =
            Command::new(env!("CARGO_BIN_EXE_attn")).args(args).env("ATTN_BACKEND", "cpu").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "attn {args:?} succeeded");
        assert_eq!(out.status.code(), Some(1), "attn {args:?}: {stderr}");
        assert!(stderr.contains("problem too large"), "attn {args:?}: {stderr}");
    }
}
