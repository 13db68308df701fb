//! Issue 35: nothing panics or aborts for any input the public API accepts. Valid random cases
//! (`attn_verify::random`) are corrupted one way each (a size of 0 or past memory, heads that do
//! not divide, strides that alias or reach past the buffers, buffers too short or of another
//! dtype, sequence offsets, key counts, page indices and slopes out of range, a NaN scale or
//! soft-cap, an LSE buffer too short) and handed to every backend's forward and backward: each
//! call must return, `Ok` or a typed error, never panic.

mod common;

use attn_core::{Attention, BackwardOptions, Buffer, DType, GradInputs, Gradients, Inputs, Outputs, Strides};
use attn_verify::random;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// One way to break a valid case.
#[derive(Clone, Copy, Debug)]
enum Corruption {
    ZeroSize(u8),
    HugeSize(u8),
    HeadsNotDividing,
    AliasingStrides,
    StridesPastTheBuffer,
    ShortBuffer(u8),
    WrongDtype,
    Offsets(u8),
    KeyCounts(u8),
    Pages(u8),
    Slopes(u8),
    Scale(u8),
    Softcap(u8),
    ShortLse,
}

fn corruptions() -> impl Strategy<Value = Corruption> {
    use Corruption::*;
    prop_oneof![
        (0u8..4).prop_map(ZeroSize),
        (0u8..4).prop_map(HugeSize),
        Just(HeadsNotDividing),
        Just(AliasingStrides),
        Just(StridesPastTheBuffer),
        (0u8..4).prop_map(ShortBuffer),
        Just(WrongDtype),
        (0u8..4).prop_map(Offsets),
        (0u8..3).prop_map(KeyCounts),
        (0u8..3).prop_map(Pages),
        (0u8..3).prop_map(Slopes),
        (0u8..3).prop_map(Scale),
        (0u8..3).prop_map(Softcap),
        Just(ShortLse),
    ]
}

/// Calls `backend`'s forward and backward on `spec`'s case broken by `how`; a panic is the error.
fn call(backend: &dyn Attention, spec: &random::Spec, how: Corruption) -> Result<(), String> {
    use Corruption::*;
    let Some(case) = spec.case() else { return Ok(()) };
    let mut p = case.problem;
    let mut extras = case.extras.clone();
    let [mut q, mut k, v] = case.inputs();
    let mut o_len = p.required_lens()[3].1;
    let mut lse_len = p.lse_len();
    let nudge = |x: &mut i32, n: u8| {
        *x = match n {
            0 => -1,
            1 => i32::MAX,
            2 => *x + 1_000_000,
            _ => *x - 1,
        }
    };
    match how {
        ZeroSize(n) | HugeSize(n) => {
            let to = if matches!(how, ZeroSize(_)) { 0 } else { 1 << 40 };
            let s = &mut p.shape;
            *[&mut s.batch, &mut s.heads_q, &mut s.seq_q, &mut s.head_dim][n as usize] = to;
        }
        HeadsNotDividing => p.shape.heads_q = p.shape.heads_kv * 2 + 1,
        AliasingStrides => p.strides.k = Strides { seq: 1, ..p.strides.k },
        StridesPastTheBuffer => p.strides.v = Strides { batch: p.strides.v.batch * 1000 + 7, ..p.strides.v },
        ShortBuffer(n) => match n {
            0 => q = Buffer::zeros(p.dtype, q.len() / 2),
            1 => k = Buffer::zeros(p.dtype, k.len().saturating_sub(1)),
            2 => o_len /= 2,
            _ => o_len = 0,
        },
        WrongDtype => {
            q = Buffer::zeros(if p.dtype == DType::F32 { DType::Bf16 } else { DType::F32 }, q.len())
        }
        Offsets(n) => match extras.cu_seqlens_q.as_mut().or(extras.cu_seqlens_k.as_mut()) {
            Some(cu) if n == 3 => cu.reverse(),
            Some(cu) => nudge(cu.last_mut().expect("offsets"), n),
            None => extras.cu_seqlens_q = Some(vec![0, -5]),
        },
        KeyCounts(n) => match extras.seqused_k.as_mut() {
            Some(used) => nudge(&mut used[0], n),
            None => extras.seqused_k = Some(vec![3]),
        },
        Pages(n) => match extras.block_table.as_mut() {
            Some(table) => nudge(&mut table[0], n),
            None => extras.block_table = Some(vec![0]),
        },
        Slopes(n) => match n {
            0 => extras.alibi_slopes = Some(vec![f32::NAN; p.shape.heads_q]),
            1 => extras.alibi_slopes = Some(vec![0.5]),
            _ => extras.alibi_slopes = None,
        },
        Scale(n) => p.params.scale = Some([f32::NAN, f32::INFINITY, 0.0][n as usize]),
        Softcap(n) => p.params.softcap = Some([f32::NAN, -1.0, 0.0][n as usize]),
        ShortLse => {
            p.params.return_lse = true;
            lse_len = p.lse_len().saturating_sub(1);
        }
    }
    let inputs = || Inputs::new(q.as_data(), k.as_data(), v.as_data()).with_extras(extras.borrow());
    let forward = catch_unwind(AssertUnwindSafe(|| {
        let mut o = Buffer::zeros(p.dtype, o_len.min(1 << 24));
        let mut lse = vec![0.0f32; lse_len.min(1 << 24)];
        let lse = p.params.return_lse.then_some(lse.as_mut_slice());
        let _ = backend.forward(&p, inputs(), Outputs { o: o.as_data_mut(), lse });
    }));
    let backward = catch_unwind(AssertUnwindSafe(|| {
        let o = Buffer::zeros(p.dtype, o_len.min(1 << 24));
        let d_o = Buffer::zeros(p.dtype, o_len.min(1 << 24));
        let lse = vec![0.0f32; lse_len.min(1 << 24)];
        let (mut dq, mut dk, mut dv) = (
            Buffer::zeros(p.dtype, q.len()),
            Buffer::zeros(p.dtype, k.len()),
            Buffer::zeros(p.dtype, v.len()),
        );
        let grads = Gradients { dq: dq.as_data_mut(), dk: dk.as_data_mut(), dv: dv.as_data_mut() };
        let grad_inputs = GradInputs { inputs: inputs(), o: o.as_data(), lse: &lse, d_o: d_o.as_data() };
        let _ = backend.backward(&p.with_lse(true), BackwardOptions::default(), grad_inputs, grads);
    }));
    match (forward, backward) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(_), _) => Err(format!("{}'s forward panicked on {} broken by {how:?}", backend.name(), p)),
        (_, Err(_)) => Err(format!("{}'s backward panicked on {} broken by {how:?}", backend.name(), p)),
    }
}

fn no_backend_panics(backends: &[Box<dyn Attention>], cases: u32) {
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let result = runner.run(&(random::specs(), corruptions()), |(spec, how)| {
        for backend in backends {
            if let Err(e) = call(backend.as_ref(), &spec, how) {
                prop_assert!(false, "{e}");
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn broken_inputs_are_errors_not_panics_on_the_cpu_backends() {
    let backends: Vec<_> = common::available("broken_inputs_are_errors_not_panics")
        .into_iter()
        .filter(|b| b.name().starts_with("cpu"))
        .collect();
    no_backend_panics(&backends, 2000);
}

#[test]
fn broken_inputs_are_errors_not_panics_on_the_gpu_backends() {
    let backends: Vec<_> = common::available("broken_inputs_are_errors_not_panics")
        .into_iter()
        .filter(|b| !b.name().starts_with("cpu"))
        .collect();
    no_backend_panics(&backends, 100);
}
