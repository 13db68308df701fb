//! The command's bad inputs (issue 35's list, tried as a new user would): each is an error that
//! says what is allowed, at once; never "unexpected argument", a silent substitute or a hang.

use std::process::{Command, Output};

fn attn(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attn"));
    cmd.args(args).env_remove("ATTN_BACKEND");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn bad_counts_are_errors_that_say_what_is_allowed() {
    for (args, says) in [
        (&["run", "--batch", "-1"][..], "not a negative one"),
        (&["run", "--heads", "0"], "at least 1"),
        (&["plan", "--seq", "-5"], "not a negative one"),
        (&["run", "--seq", "1.5"], "whole number"),
        (&["run", "--threads", "0"], "1 to 1024 worker threads"),
        (&["run", "--threads", "100000"], "1 to 1024 worker threads"),
        (&["run", "--iters", "0"], "at least 1"),
        (&["bench", "--seqs", "512,-1"], "not a negative one"),
        (&["bench", "--threads", "100000"], "1 to 1024 worker threads"),
    ] {
        let out = attn(args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "attn {args:?}: {stderr}");
        assert!(stderr.contains(says) && !stderr.contains("unexpected argument"), "attn {args:?}: {stderr}");
    }
}

#[test]
fn sizes_in_scientific_notation_are_read_whole() {
    let out = attn(&["plan", "--seq", "1e3", "--backend", "cpu-reference", "--json"], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1000"), "{stdout}");
}

#[test]
fn bench_refuses_a_quotient_of_zero() {
    let out = attn(&["bench", "--tokens", "100", "--seqs", "512", "--dims", "64", "--dtypes", "f32"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--tokens 100 is less than one sequence of 512"), "{stderr}");
}

#[test]
fn backend_names_are_read_in_any_case_and_verify_follows_attn_backend() {
    let out = attn(&["plan", "--seq", "64", "--backend", "CPU-Reference"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = attn(&["verify", "--quick", "--family", "standard"], &[("ATTN_BACKEND", "CPU-Reference")]);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("ATTN_BACKEND=CPU-Reference: verifying that backend alone"), "{said}");
    assert!(said.contains("on 1 backend(s): cpu-reference"), "{said}");
    let out = attn(&["verify", "--quick", "--family", "standard"], &[("ATTN_BACKEND", "tpu")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("backend `tpu` cannot be verified here"), "{stderr}");
}

#[test]
fn check_rows_past_the_problem_say_how_many_are_checked() {
    let args = [
        "run",
        "--seq",
        "64",
        "--heads",
        "1",
        "--check-rows",
        "1e9",
        "--iters",
        "1",
        "--backend",
        "cpu-reference",
    ];
    let out = attn(&args, &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("checking 64 of 64 rows"), "{stderr}");
    assert!(stdout.contains("on 64 rows"), "{stdout}");
}
