//! The backward pass on every backend this machine has, and the planted backward bugs.

use attn_core::{Attention, BackwardOptions};
use attn_verify::grad::{self, run_grad_suite};
use attn_verify::{Outcome, report};

mod common;
use common::{available, wgpu_required};

#[test]
fn every_available_backend_passes_the_gradient_grid() {
    let backends = available("every_available_backend_passes_the_gradient_grid");
    let refs: Vec<&dyn Attention> = backends.iter().map(|b| b.as_ref()).collect();
    let results = run_grad_suite(&refs, &grad::quick(), BackwardOptions::default(), |r| {
        if let Outcome::Skip { reason } = &r.outcome {
            eprintln!("SKIPPED {} on {}: {reason}", r.case, r.backend);
        }
    });
    let table = report::table(&results);
    println!("{table}");
    for r in &results {
        println!("{:<13} {:<40} worst {:.3}", r.backend, r.case, r.worst_ratio);
    }
    assert!(results.iter().all(|r| !r.outcome.is_fail()), "{table}");
    let mut must = vec!["cpu-flash", "cpu-reference"];
    // CI installs lavapipe and demands wgpu (`ATTN_REQUIRE_WGPU=1`): its portable backward then
    // runs every quick case (each fits a software adapter's loop limit).
    if wgpu_required() {
        must.push("wgpu");
    }
    for must in must {
        let passed =
            results.iter().filter(|r| r.backend == must && matches!(r.outcome, Outcome::Pass { .. }));
        assert_eq!(passed.count(), grad::quick().len(), "{must} must pass every gradient case");
    }
}

/// The test of the gradient tester: each planted backward bug is caught, by the family meant for it.
#[test]
fn planted_backward_bugs_are_caught_by_their_named_cases() {
    use attn_verify::planted_grad::{GradFlaw, PlantedGrad};
    let expected = [
        (GradFlaw::WrongDTerm, "standard"),
        (GradFlaw::MissingGqaSum, "gqa"),
        (GradFlaw::TopLeftCausal, "causal-offset"),
        (GradFlaw::DropsLastTile, "odd-lengths"),
    ];
    assert_eq!(expected.len(), GradFlaw::ALL.len());
    let cases = grad::quick();
    for (flaw, family) in expected {
        let planted = PlantedGrad::new(flaw);
        let results = run_grad_suite(&[&planted], &cases, BackwardOptions::default(), |_| {});
        let caught: Vec<&str> =
            results.iter().filter(|r| r.outcome.is_fail()).map(|r| r.case.as_str()).collect();
        println!("{flaw:?} caught by {caught:?}");
        assert!(
            results.iter().any(|r| r.family == family && r.outcome.is_fail()),
            "{flaw:?} was not caught by a `{family}` case; failing cases: {caught:?}"
        );
        // Where a flaw of one feature does not apply, the naive backward is right: the bug, not
        // the rest of the backend, fails. (A missing D term is wrong on every case.)
        if flaw != GradFlaw::WrongDTerm {
            assert!(
                results.iter().any(|r| matches!(r.outcome, Outcome::Pass { .. })),
                "{flaw:?} passed nothing"
            );
        }
    }
}

/// cpu-flash's backward is deterministic whatever the thread count: each gradient row is summed
/// by one task in a fixed order.
#[test]
fn cpu_flash_backward_is_bit_identical_across_thread_counts() {
    use attn_core::{Buffer, GradInputs, Gradients, Outputs};
    let case = grad::quick().into_iter().find(|c| c.family == "gqa").expect("a gqa case");
    let p = case.problem.with_lse(true);
    let inputs = case.inputs();
    let ins = case.as_inputs(&inputs);
    let o_len = p.required_lens()[3].1;
    let mut o = Buffer::zeros(p.dtype, o_len);
    let mut lse = vec![0.0f32; p.lse_len()];
    attn_cpu::Flash::new().forward(&p, ins, Outputs { o: o.as_data_mut(), lse: Some(&mut lse) }).unwrap();
    let d_o = Buffer::from_f32(p.dtype, (0..o_len).map(|i| ((i * 7919) % 13) as f32 / 13.0 - 0.5));
    let run = |threads: usize| {
        let flash = attn_cpu::Flash::with_threads(threads).unwrap();
        let [q, k, v, _] = p.required_lens().map(|(_, n)| n);
        let mut g = [Buffer::zeros(p.dtype, q), Buffer::zeros(p.dtype, k), Buffer::zeros(p.dtype, v)];
        let [dq, dk, dv] = &mut g;
        let grads = Gradients { dq: dq.as_data_mut(), dk: dk.as_data_mut(), dv: dv.as_data_mut() };
        let gi = GradInputs { inputs: ins, o: o.as_data(), lse: &lse, d_o: d_o.as_data() };
        let plan = flash.backward(&p, BackwardOptions { deterministic: true }, gi, grads).unwrap();
        assert!(plan.notes.iter().any(|n| n.contains("deterministic")), "{:?}", plan.notes);
        g.map(|b| b.to_f32_vec().iter().map(|x| x.to_bits()).collect::<Vec<_>>())
    };
    let one = run(1);
    for threads in [2, 3, 5] {
        for _ in 0..3 {
            assert!(run(threads) == one, "{threads} threads differ from one");
        }
    }
}
