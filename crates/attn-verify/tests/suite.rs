//! The suite on every backend this machine has, the planted bugs, and the error snapshot.

use attn_core::Attention;
use attn_verify::planted::{Flaw, Planted};
use attn_verify::{Outcome, grid, report, run_suite};

mod common;
use common::{available, wgpu_required};

#[test]
fn every_available_backend_passes_the_quick_grid() {
    let backends = available("every_available_backend_passes_the_quick_grid");
    let refs: Vec<&dyn Attention> = backends.iter().map(|b| b.as_ref()).collect();
    let results = run_suite(&refs, &grid::quick(), |_| {});
    let table = report::table(&results);
    println!("{table}");
    assert!(results.iter().all(|r| !r.outcome.is_fail()), "{table}");
    let mut must = vec!["cpu-flash", "cpu-reference"];
    if wgpu_required() {
        must.push("wgpu");
    }
    for must in must {
        assert!(
            results.iter().any(|r| r.backend == must && matches!(r.outcome, Outcome::Pass { .. })),
            "{must} passed no case"
        );
    }
}

/// The test of the tester: each planted bug is caught, and by the case family meant for it.
#[test]
fn planted_bugs_are_caught_by_their_named_cases() {
    let expected = [
        (Flaw::NoMaxSubtraction, "large-logits"),
        (Flaw::WrongKvHead, "gqa"),
        (Flaw::TopLeftCausal, "causal-offset"),
        (Flaw::DropsPartialTile, "odd-lengths"),
        (Flaw::SkipsLastRow, "standard"),
        (Flaw::StopsAfterKeys, "long-keys"),
        (Flaw::WindowOffByOne, "window"),
        (Flaw::SoftcapBeforeScale, "softcap"),
        (Flaw::AlibiTopLeft, "alibi"),
        (Flaw::VarlenMaxLengths, "varlen"),
        (Flaw::PagesInOrder, "paged"),
        (Flaw::WeighsUnusedSlots, "kv-cache"),
    ];
    assert_eq!(expected.len(), Flaw::ALL.len());
    let cases = grid::quick();
    for (flaw, family) in expected {
        let planted = Planted::new(flaw);
        let results = run_suite(&[&planted], &cases, |_| {});
        let caught: Vec<&str> =
            results.iter().filter(|r| r.outcome.is_fail()).map(|r| r.case.as_str()).collect();
        println!("{flaw:?} caught by {caught:?}");
        assert!(
            results.iter().any(|r| r.family == family && r.outcome.is_fail()),
            "{flaw:?} was not caught by a `{family}` case; failing cases: {caught:?}"
        );
    }
}

/// The error statistics of the quick grid on the CPU backends, rounded to half-decades so that
/// they are stable across machines: a change that makes results less accurate shows up here as a
/// snapshot diff in review.
#[test]
fn cpu_error_statistics_snapshot() {
    let flash = attn_cpu::Flash::new();
    let reference = attn_cpu::Reference;
    let results = run_suite(&[&flash, &reference], &grid::quick(), |_| {});
    let mut lines = vec![];
    for r in &results {
        let stats = match &r.outcome {
            Outcome::Pass { stats } => stats,
            other => panic!("{} {}: {other:?}", r.backend, r.case),
        };
        lines.push(format!(
            "{:<13} {:<44} max_abs {:>7} rel_l2 {:>7} lse {:>7}",
            r.backend,
            r.case,
            bucket(stats.max_abs),
            bucket(stats.rel_l2),
            bucket(stats.lse_max_err)
        ));
    }
    insta::assert_snapshot!(lines.join("\n"));
}

/// `x` rounded up to the next half decade (1, 3 × 10^k), as text; 0 stays `0`.
fn bucket(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let e = x.log10();
    let k = e.floor();
    let m = if e - k <= 3f64.log10() { 3.0 } else { 10.0 };
    let m = if e - k == 0.0 { 1.0 } else { m };
    format!("{:.0e}", m * 10f64.powf(k))
}

#[test]
fn a_cache_with_key_counts_has_nan_in_its_unused_slots_only() {
    // The cases with per-sequence key counts poison every K and V element outside the used keys:
    // a backend that reads one into an output fails them (unwritten cache memory may hold anything).
    let cases: Vec<_> = grid::quick().into_iter().filter(|c| c.problem.batching.keys_used).collect();
    assert!(!cases.is_empty());
    for case in cases {
        let [_, k, v] = case.inputs();
        let map = case.problem.seq_map(case.extras.borrow()).unwrap();
        let s = case.problem.shape;
        let used: usize = (0..s.batch).map(|b| map.k_len(b) * s.heads_kv * s.head_dim).sum();
        for (name, x) in [("k", k.to_f32_vec()), ("v", v.to_f32_vec())] {
            let finite = x.iter().filter(|e| e.is_finite()).count();
            let nan = x.iter().filter(|e| e.is_nan()).count();
            assert_eq!((finite, nan), (used, x.len() - used), "{}: {name}", case.name);
            assert!(nan > 0, "{}: no unused slot to poison", case.name);
        }
    }
}
