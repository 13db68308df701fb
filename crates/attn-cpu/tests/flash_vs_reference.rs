//! `Flash` against the exact `Reference`, on edge cases and on random shapes and strides, for
//! every instruction-set variant this CPU can run. Outputs are poisoned with NaN first, and
//! elements outside a strided output view must stay poisoned.

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::{Attention, Buffer, DType, Inputs, Layout, Outputs, Problem, Shape, Strides, TensorStrides};
use attn_cpu::{Flash, Isa, Reference};
use proptest::prelude::*;

/// Allowed |flash − reference| per element: `atol + rtol·|reference|`. The inputs are the same
/// rounded values for both, so the difference is f32 accumulation plus one output rounding
/// (unit roundoff 2^-24, 2^-11, 2^-8 for f32, f16, bf16).
fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-6, 2e-5),
        DType::F16 => (2e-5, 2.0 * 2f64.powi(-11)),
        DType::Bf16 => (2e-5, 2.0 * 2f64.powi(-8)),
    }
}

/// Runs `flash` on fresh normal inputs (standard deviation `sigma`) and compares every row.
fn check(flash: &Flash, problem: &Problem, seed: u64, sigma: f64) -> Result<(), String> {
    let mut rng = SplitMix64::new(seed);
    let [q_len, k_len, v_len, o_len] = problem.required_lens().map(|(_, n)| n);
    let q = normal_buffer(&mut rng, problem.dtype, q_len, sigma);
    let k = normal_buffer(&mut rng, problem.dtype, k_len, sigma);
    let v = normal_buffer(&mut rng, problem.dtype, v_len, 1.0);
    let inputs = Inputs::new(q.as_data(), k.as_data(), v.as_data());
    let mut o = Buffer::zeros(problem.dtype, o_len);
    let mut lse = vec![0.0f32; problem.lse_len()];
    let mut outputs =
        Outputs { o: o.as_data_mut(), lse: problem.params.return_lse.then_some(lse.as_mut_slice()) };
    outputs.poison();
    flash.forward(problem, inputs, outputs).map_err(|e| e.to_string())?;

    let s = problem.shape;
    let (mut atol, rtol) = tolerance(problem.dtype);
    if problem.params.softcap.is_some() {
        // A soft-cap only bends scores that are large, and f32 rounds a large score by about
        // 2^-24 of |q|·|k|: the allowance attn-verify makes, scale · max|q| · max|k| · max|v|.
        let norm = |x: &Buffer| {
            x.to_f32_vec()
                .chunks(s.head_dim)
                .map(|r| r.iter().map(|y| y * y).sum::<f32>().sqrt())
                .fold(0f32, f32::max) as f64
        };
        let v_max = v.to_f32_vec().iter().fold(0f32, |m, y| m.max(y.abs())) as f64;
        atol += 8.0 * 2f64.powi(-24) * problem.scale() as f64 * norm(&q) * norm(&k) * v_max;
    }
    let got = o.to_f32_vec();
    let mut written = vec![false; o_len];
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            for i in 0..s.seq_q {
                let want = Reference::row(problem, &inputs, b, h, i).unwrap();
                let off = problem.strides.o.offset(b, h, i);
                for (d, &w) in want.o.iter().enumerate() {
                    let x = got[off + d] as f64;
                    written[off + d] = true;
                    // Written so that a NaN fails too.
                    let within = (x - w).abs() <= atol + rtol * w.abs();
                    if !within {
                        return Err(format!(
                            "seed {seed} {problem}: o[{b},{h},{i},{d}] = {x}, reference {w}"
                        ));
                    }
                }
                if problem.params.return_lse {
                    let l = lse[(b * s.heads_q + h) * s.seq_q + i] as f64;
                    let ok = if want.lse == f64::NEG_INFINITY {
                        l == f64::NEG_INFINITY
                    } else {
                        (l - want.lse).abs() <= 1e-4 * want.lse.abs().max(1.0)
                    };
                    if !ok {
                        return Err(format!(
                            "seed {seed} {problem}: lse[{b},{h},{i}] = {l}, reference {}",
                            want.lse
                        ));
                    }
                }
            }
        }
    }
    if let Some(i) = (0..o_len).find(|&i| !written[i] && !got[i].is_nan()) {
        return Err(format!("seed {seed} {problem}: element {i} outside the output view was written"));
    }
    Ok(())
}

fn all_variants() -> Vec<Flash> {
    Isa::supported().into_iter().map(|isa| Flash::new().with_isa(isa).unwrap()).collect()
}

fn run_all(problem: Problem, sigma: f64) {
    for flash in all_variants() {
        for dtype in DType::ALL {
            let p = Problem { dtype, ..problem };
            if let Err(e) = check(&flash, &p, 42, sigma) {
                panic!("{:?}: {e}", flash.plan(&p).unwrap().execution);
            }
        }
    }
}

#[test]
fn single_row_and_single_key() {
    run_all(Problem::new(Shape::new(1, 2, 1, 64), DType::F32).with_lse(true), 1.0);
}

#[test]
fn sequence_not_a_multiple_of_the_tile() {
    run_all(Problem::new(Shape::new(2, 2, 77, 32), DType::F32).with_lse(true), 1.0);
    run_all(Problem::new(Shape::new(1, 1, 130, 64), DType::F32).causal(), 1.0);
}

#[test]
fn odd_and_large_head_dims() {
    for d in [1, 3, 96, 256] {
        run_all(Problem::new(Shape::new(1, 2, 70, d), DType::F32).causal().with_lse(true), 1.0);
    }
}

#[test]
fn huge_logits_do_not_overflow() {
    // Scores near ±1e4: exp without max-subtraction would be inf.
    run_all(Problem::new(Shape::new(1, 2, 65, 64), DType::F32).with_scale(1.0).with_lse(true), 12.0);
}

#[test]
fn causal_bottom_right_with_rows_that_see_no_key() {
    // seq_q > seq_k: the first 50 rows see nothing: o = 0, lse = -inf.
    let p = Problem::new(Shape { seq_q: 90, seq_k: 40, ..Shape::new(1, 2, 0, 32) }, DType::F32)
        .causal()
        .with_lse(true);
    run_all(p, 1.0);
    // seq_q < seq_k.
    let p = Problem::new(Shape { seq_q: 40, seq_k: 150, ..Shape::new(1, 2, 0, 32) }, DType::F32)
        .causal()
        .with_lse(true);
    run_all(p, 1.0);
}

/// Sliding windows over many key tiles (rows deep in the sequence start past tile 0), on both
/// sides of the diagonal, wider than the sequence, and with seq_q != seq_k; and soft-capped
/// scores, alone and with a window: every instruction set against the reference.
#[test]
fn windows_and_softcap() {
    let long = Shape::new(1, 2, 700, 64);
    run_all(Problem::new(long, DType::F32).with_window(Some(100), Some(0)).with_lse(true), 1.0);
    run_all(Problem::new(long, DType::F32).with_window(Some(37), Some(61)), 1.0);
    run_all(Problem::new(Shape::new(1, 2, 90, 32), DType::F32).with_window(Some(500), Some(500)), 1.0);
    let ragged = Shape { seq_q: 300, seq_k: 520, ..Shape::new(1, 2, 0, 32) };
    run_all(Problem::new(ragged, DType::F32).with_window(Some(64), Some(0)).with_lse(true), 1.0);
    let tall = Shape { seq_q: 200, seq_k: 90, ..Shape::new(1, 2, 0, 32) };
    run_all(Problem::new(tall, DType::F32).with_window(Some(10), Some(5)).with_lse(true), 1.0);
    // Scale 1 makes the scores about 8 wide, so that caps of 5 and 20 bend them (with unit
    // inputs: larger ones make f32's rounding of the scores, not the cap, decide the error).
    let capped = |cap| Problem::new(Shape::new(1, 2, 130, 64), DType::F32).with_scale(1.0).with_softcap(cap);
    run_all(capped(5.0).with_lse(true), 1.0);
    run_all(capped(20.0).causal(), 1.0);
    run_all(
        Problem::new(long, DType::F32).with_scale(1.0).with_softcap(5.0).with_window(Some(200), Some(0)),
        1.0,
    );
}

#[test]
fn grouped_query_ratios() {
    for g in [1, 4, 8] {
        let p = Problem::new(Shape { heads_kv: 8 / g, ..Shape::new(2, 8, 67, 64) }, DType::F32).causal();
        run_all(p, 1.0);
    }
}

#[test]
fn bshd_and_non_contiguous_views() {
    let shape = Shape { heads_kv: 2, ..Shape::new(2, 4, 50, 64) };
    run_all(Problem::new(shape, DType::F32).with_layout(Layout::Bshd).with_lse(true), 1.0);
    // Views into larger buffers: padded rows and heads, and an output with gaps that must stay
    // untouched.
    let padded =
        |heads: usize, seq: usize| Strides { batch: heads * (seq + 3) * 80, head: (seq + 3) * 80, seq: 80 };
    let strides = TensorStrides { q: padded(4, 50), k: padded(2, 50), v: padded(2, 50), o: padded(4, 50) };
    run_all(Problem::new(shape, DType::F32).with_strides(strides).causal(), 1.0);
}

#[test]
fn mismatched_inputs_are_typed_errors() {
    let p = Problem::new(Shape::new(1, 2, 8, 16), DType::F16);
    let short = Buffer::zeros(DType::F16, 10);
    let f32s = Buffer::zeros(DType::F32, 256);
    let mut o = Buffer::zeros(DType::F16, 256);
    let err = Flash::new()
        .forward(
            &p,
            Inputs::new(short.as_data(), short.as_data(), short.as_data()),
            Outputs { o: o.as_data_mut(), lse: None },
        )
        .unwrap_err();
    assert!(err.to_string().contains("tensor `q`"), "{err}");
    let err = Flash::new()
        .forward(
            &p,
            Inputs::new(f32s.as_data(), f32s.as_data(), f32s.as_data()),
            Outputs { o: o.as_data_mut(), lse: None },
        )
        .unwrap_err();
    assert!(err.to_string().contains("holds f32 but the problem's dtype is f16"), "{err}");
}

fn arb_problem() -> impl Strategy<Value = (Problem, u64)> {
    (
        1usize..3,                                                                    // batch
        prop::sample::select(vec![(1usize, 1usize), (2, 2), (4, 1), (4, 2), (8, 1)]), // (heads_q, heads_kv)
        1usize..140,                                                                  // seq_q
        1usize..140,                                                                  // seq_k
        prop::sample::select(vec![1usize, 8, 16, 33, 64, 128]),
        prop::sample::select(DType::ALL.to_vec()),
        any::<bool>(), // causal
        any::<bool>(), // bshd
        0usize..3,     // row padding
        any::<u64>(),
    )
        .prop_map(|(batch, (hq, hkv), sq, sk, d, dtype, causal, bshd, pad, seed)| {
            let shape = Shape { batch, heads_q: hq, heads_kv: hkv, seq_q: sq, seq_k: sk, head_dim: d };
            let layout = if bshd { Layout::Bshd } else { Layout::Bhsd };
            let mut p = Problem::new(shape, dtype).with_layout(layout).with_lse(true);
            if pad > 0 {
                // Widen every row by `pad` elements: a non-contiguous view.
                let widen = |heads: usize, seq: usize| layout.strides(heads, seq, d + pad);
                p.strides = TensorStrides {
                    q: widen(hq, sq),
                    k: widen(hkv, sk),
                    v: widen(hkv, sk),
                    o: widen(hq, sq),
                };
            }
            if causal {
                p = p.causal();
            }
            (p, seed)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn flash_matches_reference_on_random_problems((problem, seed) in arb_problem()) {
        for flash in all_variants() {
            if let Err(e) = check(&flash, &problem, seed, 1.0) {
                prop_assert!(false, "{e}");
            }
        }
    }
}
