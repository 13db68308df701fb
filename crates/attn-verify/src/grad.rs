//! Gradient verification: the backward pass of every backend against the exact f64 gradients.
//!
//! A case is a forward [`Case`] plus a loss gradient `dO` drawn from N(0, 1) with the case's seed.
//! The backend gets the forward's output and LSE as the reference computes them (rounded to the
//! case's dtype and to f32), so that its backward is judged alone. Its `dq`, `dk` and `dv` are
//! poisoned with NaN first, compared element by element with [`attn_cpu::Reference::gradients`]
//! within a [`GradTolerance`], and every element outside the rows the sequences have must keep its
//! poison.

use crate::case::Case;
use crate::grid::{alibi, case, gqa_shape, p, padded, seqs, sk, with_extras};
use crate::report::CaseResult;
use crate::run::Outcome;
use crate::{Distribution, ErrorStats};
use attn_core::rng::SplitMix64;
use attn_core::sequences::KeyStore;
use attn_core::{
    Attention, BackwardOptions, Buffer, DType, Data, GradInputs, Gradients, Layout, Numerics, Outputs,
    SeqMap, Shape,
};
use attn_cpu::{RefGrads, Reference};

/// A gradient element passes when `|x − ref| ≤ atol · G + rtol · |ref|`, with `G` the largest
/// |ref| over all three gradients of the case, and each tensor's relative L2 error is at most
/// `rel_l2`.
///
/// Why relative to `G` (u = the dtype's unit roundoff): a gradient element is a sum of terms
/// `P · (dP − D) · k` of both signs, and where they cancel (a row of one key has `dQ = 0` exactly)
/// its own size says nothing about the error, which is set by the terms. `dV`'s elements, sums of
/// `P · dO`, have the terms' size, so `G` measures them on every case. The numbers, measured on
/// cpu-flash at about a third of each bound at most:
/// - Exact (the reference through the trait): rounded once, `rtol = rel_l2 = 1.01 u`.
/// - f32 accumulation, f32: the products and the softmax in f32 carry ~1e-7 relative error per
///   term over sums of up to a few hundred terms: `atol = 2e-6`, `rtol = 2e-5`, `rel_l2 = 4e-6`.
/// - f32 accumulation, f16/bf16: `D = dO · O` is formed from the output rounded to the dtype, as
///   every FlashAttention backward does, which moves each `dS` by up to `u · |dO| · |O|`, of the
///   order of the largest terms, and the gradient is rounded once more: `atol = rtol = rel_l2 =
///   2 u`.
/// - Tensor cores (`LowPrecisionP`): P and dS are also rounded to the dtype before their products
///   (dV = Pᵀ·dO, dK = dSᵀ·Q, dQ = dS·K), up to `u` relative error per term on top:
///   `atol = rel_l2 = 4 u`, `rtol = 2 u`.
/// - [`GradTolerance::widened`]: the forward's score-error allowance, for large logits.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct GradTolerance {
    /// Absolute part of the per-element bound, as a fraction of the tensor's largest |ref|.
    pub atol: f64,
    /// Relative part of the per-element bound.
    pub rtol: f64,
    /// Bound on each gradient's ‖out − ref‖₂ / ‖ref‖₂.
    pub rel_l2: f64,
}

impl GradTolerance {
    /// The table: one entry per (numerics, dtype).
    pub fn for_numerics(numerics: Numerics, dtype: DType) -> GradTolerance {
        let u = dtype.unit_roundoff();
        let (atol, rtol, rel_l2) = match (numerics, dtype) {
            (Numerics::Exact, _) => (1e-30, 1.01 * u, 1.01 * u),
            (_, DType::F32) => (2e-6, 2e-5, 4e-6),
            (Numerics::LowPrecisionP, _) => (4.0 * u, 2.0 * u, 4.0 * u),
            (_, _) => (2.0 * u, 2.0 * u, 2.0 * u),
        };
        GradTolerance { atol, rtol, rel_l2 }
    }

    /// Adds the score-error allowance for scaled scores bounded by `score_bound`: a score error
    /// of `u₃₂ · M` moves each weight, and so each gradient term, by that much relatively.
    pub fn widened(mut self, score_bound: f64) -> GradTolerance {
        let u32 = DType::F32.unit_roundoff();
        self.atol += 8.0 * u32 * score_bound;
        self.rel_l2 += 2.0 * u32 * score_bound;
        self
    }
}

/// A case's reference forward (rounded, as a backend would hand it to its backward), its `dO`,
/// and its exact gradients.
pub struct GradExpected {
    o: Buffer,
    lse: Vec<f32>,
    d_o: Buffer,
    grads: RefGrads,
    score_bound: f64,
}

impl GradExpected {
    /// Computes everything a gradient case needs from its inputs.
    pub fn compute(case: &Case, inputs: &[Buffer; 3]) -> GradExpected {
        let p = case.problem.with_lse(true);
        let ins = case.as_inputs(inputs);
        let o_len = p.required_lens()[3].1;
        let mut o = Buffer::zeros(p.dtype, o_len);
        let mut lse = vec![0.0f32; p.lse_len()];
        Reference::forward_into(&p, &ins, Outputs { o: o.as_data_mut(), lse: Some(&mut lse) })
            .expect("gradient cases are valid problems");
        let mut rng = SplitMix64::new(case.seed ^ 0x6772_6164);
        let d_o = Buffer::from_f32(p.dtype, (0..o_len).map(|_| rng.normal() as f32));
        let grads = Reference::gradients(&p, &ins, d_o.as_data()).expect("gradient cases are valid problems");
        let map = p.seq_map(ins.extras).expect("valid extras");
        let norm = |data: Data<'_>, off: usize| {
            (0..p.shape.head_dim).map(|x| (data.get_f32(off + x) as f64).powi(2)).sum::<f64>().sqrt()
        };
        let qn = map.rows().map(|(b, h, i)| norm(ins.q, map.q_offset(b, h, i))).fold(0.0, f64::max);
        let kn = kv_rows(&map).map(|(b, g, j)| norm(ins.k, map.k_offset(b, g, j))).fold(0.0, f64::max);
        GradExpected { o, lse, d_o, grads, score_bound: p.scale().abs() as f64 * qn * kn }
    }
}

impl GradExpected {
    /// `base` widened for this case's score magnitude (see [`GradTolerance::widened`]).
    pub fn tolerance(&self, base: GradTolerance) -> GradTolerance {
        base.widened(self.score_bound)
    }
}

/// Every key row `(b, g, j)` the sequences have.
fn kv_rows<'a>(map: &'a SeqMap<'a>) -> impl Iterator<Item = (usize, usize, usize)> + 'a {
    let s = map.problem().shape;
    (0..s.batch)
        .flat_map(move |b| (0..s.heads_kv).flat_map(move |g| (0..map.k_len(b)).map(move |j| (b, g, j))))
}

/// Runs the backward pass of `case` on `backend` with poisoned gradients and compares them with
/// `expected`.
pub fn run_grad_case(
    backend: &dyn Attention,
    case: &Case,
    inputs: &[Buffer; 3],
    expected: &GradExpected,
    tol: GradTolerance,
    options: BackwardOptions,
) -> Outcome {
    let p = case.problem.with_lse(true);
    if let Err(e) = backend.plan_backward(&p, options) {
        return Outcome::Skip { reason: e.to_string() };
    }
    let [q, k, v, _] = p.required_lens().map(|(_, n)| n);
    let (mut dq, mut dk, mut dv) =
        (Buffer::zeros(p.dtype, q), Buffer::zeros(p.dtype, k), Buffer::zeros(p.dtype, v));
    let mut grads = Gradients { dq: dq.as_data_mut(), dk: dk.as_data_mut(), dv: dv.as_data_mut() };
    grads.poison();
    let grad_inputs = GradInputs {
        inputs: case.as_inputs(inputs),
        o: expected.o.as_data(),
        lse: &expected.lse,
        d_o: expected.d_o.as_data(),
    };
    if let Err(e) = backend.backward(&p, options, grad_inputs, grads) {
        return Outcome::Fail { stats: None, reason: format!("the backend returned an error: {e}") };
    }
    let map = p.seq_map(case.extras.borrow()).expect("valid extras");
    let s = p.shape;
    let d = s.head_dim;
    let q_rows: Vec<(usize, usize)> = map
        .rows()
        .map(|(b, h, i)| (((b * s.heads_q + h) * s.seq_q + i) * d, map.q_offset(b, h, i)))
        .collect();
    let logical = |(b, g, j): (usize, usize, usize)| ((b * s.heads_kv + g) * s.seq_k + j) * d;
    let k_rows: Vec<(usize, usize)> =
        kv_rows(&map).map(|r| (logical(r), map.k_offset(r.0, r.1, r.2))).collect();
    let v_rows: Vec<(usize, usize)> =
        kv_rows(&map).map(|r| (logical(r), map.v_offset(r.0, r.1, r.2))).collect();
    let g = &expected.grads;
    let largest = |rows: &[(usize, usize)], x: &[f64]| {
        rows.iter().flat_map(|&(l, _)| &x[l..l + d]).fold(0.0f64, |m, e| m.max(e.abs()))
    };
    let big_g = largest(&q_rows, &g.dq).max(largest(&k_rows, &g.dk)).max(largest(&v_rows, &g.dv));
    let mut stats = ErrorStats::default();
    let mut fault = None;
    for (name, got, exact, rows) in
        [("dq", &dq, &g.dq, &q_rows), ("dk", &dk, &g.dk, &k_rows), ("dv", &dv, &g.dv, &v_rows)]
    {
        let (st, f) = compare(name, got.as_data(), exact, rows, (d, big_g), tol);
        stats.max_abs = stats.max_abs.max(st.max_abs);
        stats.rel_l2 = stats.rel_l2.max(st.rel_l2);
        stats.frac_over = stats.frac_over.max(st.frac_over);
        stats.worst_ratio = stats.worst_ratio.max(st.worst_ratio);
        if fault.is_none() {
            fault = f;
        }
    }
    match fault {
        None => Outcome::Pass { stats },
        Some(reason) => Outcome::Fail { stats: Some(stats), reason },
    }
}

/// One gradient's errors over its rows (`(logical element, element offset)` pairs), `scale` the
/// case's `G` ([`GradTolerance`]), and the
/// first fault: an element over its bound, a NaN, a write outside the rows, or the L2 bound.
fn compare(
    name: &str,
    got: Data<'_>,
    exact: &[f64],
    rows: &[(usize, usize)],
    (d, scale): (usize, f64),
    tol: GradTolerance,
) -> (ErrorStats, Option<String>) {
    let (mut diff2, mut ref2, mut over) = (0.0, 0.0, 0usize);
    let mut st = ErrorStats::default();
    let mut fault = None;
    let mut in_view = vec![false; got.len()];
    for &(l, off) in rows {
        for x in 0..d {
            in_view[off + x] = true;
            let (y, r) = (got.get_f32(off + x) as f64, exact[l + x]);
            let bound = tol.atol * scale + tol.rtol * r.abs();
            let err = (y - r).abs();
            if !y.is_finite() {
                over += 1;
                fault.get_or_insert_with(|| {
                    format!("{name}: element {} = {y}: unwritten (poison) or non-finite", off + x)
                });
                continue;
            }
            diff2 += err * err;
            ref2 += r * r;
            st.max_abs = st.max_abs.max(err);
            let ratio = if bound > 0.0 {
                err / bound
            } else if err == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            st.worst_ratio = st.worst_ratio.max(ratio);
            if ratio > 1.0 {
                over += 1;
                fault.get_or_insert_with(|| {
                    format!("{name}: element {} = {y:.6e}, reference {r:.6e}: |error| {err:.2e} > bound {bound:.2e}", off + x)
                });
            }
        }
    }
    st.rel_l2 = if ref2 > 0.0 { (diff2 / ref2).sqrt() } else { diff2.sqrt() };
    st.frac_over = over as f64 / (rows.len() * d).max(1) as f64;
    if let Some(i) = (0..got.len()).find(|&i| !in_view[i] && !got.get_f32(i).is_nan()) {
        fault.get_or_insert(format!(
            "{name}: element {i} lies outside the rows the sequences have but was written"
        ));
    }
    if st.rel_l2 > tol.rel_l2 {
        fault.get_or_insert(format!("{name}: relative L2 error {:.2e} > {:.2e}", st.rel_l2, tol.rel_l2));
    }
    st.worst_ratio = st.worst_ratio.max(st.rel_l2 / tol.rel_l2);
    (st, fault)
}

/// Runs every gradient case on every backend (each case's reference once).
pub fn run_grad_suite(
    backends: &[&dyn Attention],
    cases: &[Case],
    options: BackwardOptions,
    mut progress: impl FnMut(&CaseResult),
) -> Vec<CaseResult> {
    let mut results = vec![];
    for case in cases {
        let inputs = case.inputs();
        let expected = GradExpected::compute(case, &inputs);
        for backend in backends {
            let dtype = case.problem.dtype;
            let tol = expected.tolerance(GradTolerance::for_numerics(backend.numerics(dtype), dtype));
            let outcome = run_grad_case(*backend, case, &inputs, &expected, tol, options);
            let worst_ratio = match &outcome {
                Outcome::Pass { stats } | Outcome::Fail { stats: Some(stats), .. } => stats.worst_ratio,
                _ => 0.0,
            };
            let result = CaseResult::new(*backend, case, outcome, worst_ratio);
            progress(&result);
            results.push(result);
        }
    }
    results
}

/// A window of `left` keys back and `right` ahead of each row's diagonal.
fn window(left: usize, right: usize) -> attn_core::Mask {
    attn_core::Mask::Window { left: Some(left), right: Some(right) }
}

/// About thirty small gradient cases, one or more per feature: seconds on two cores.
pub fn quick() -> Vec<Case> {
    use DType::*;
    use Distribution::*;
    let mut v = vec![];
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let base = p(Shape::new(2, 4, 128, 64), dtype);
        v.push(case("standard", "b2h4s128d64", base, Normal, 210 + i as u64));
        v.push(case("standard", "b2h4s128d64", base.causal(), Normal, 220 + i as u64));
    }
    v.extend([
        case("large-logits", "s100d64", p(Shape::new(1, 2, 100, 64), F32).causal(), LargeMagnitude, 230),
        case("odd-lengths", "sq65sk130", p(sk(65, 130, 2, 64), F16), Normal, 240),
        case("odd-lengths", "s77d32", p(Shape::new(1, 2, 77, 32), Bf16).causal(), Normal, 241),
        case("odd-lengths", "s1", p(Shape::new(1, 2, 1, 64), F32), Normal, 242),
        case("head-dims", "d96", p(Shape::new(1, 2, 70, 96), F32).causal(), Normal, 250),
        case("head-dims", "d256", p(Shape::new(1, 2, 65, 256), Bf16).causal(), Normal, 251),
        case("head-dims", "d8-gqa", p(gqa_shape(1, 4, 2, 70, 70, 8), F16).causal(), Normal, 252),
        case("gqa", "hq8hkv2", p(gqa_shape(1, 8, 2, 96, 96, 64), Bf16), Normal, 260),
        case("gqa", "mqa-hq8hkv1", p(gqa_shape(1, 8, 1, 96, 96, 64), F32).causal(), Normal, 261),
        case("causal-offset", "sq40sk150", p(sk(40, 150, 2, 64), F32).causal(), Normal, 270),
        case("empty-rows", "sq150sk40", p(sk(150, 40, 2, 64), Bf16).causal(), Normal, 271),
        case(
            "window",
            "s130-(20,0)",
            p(Shape::new(1, 2, 130, 64), F16).with_mask(window(20, 0)),
            Normal,
            280,
        ),
        case(
            "window",
            "sq70sk140-(30,10)",
            p(sk(70, 140, 2, 64), F32).with_mask(window(30, 10)),
            Normal,
            281,
        ),
        case("softcap", "cap2", p(Shape::new(1, 2, 100, 64), F32).with_softcap(2.0).causal(), Normal, 290),
        case(
            "softcap",
            "cap5-large",
            p(Shape::new(1, 2, 100, 64), Bf16).with_softcap(5.0),
            LargeMagnitude,
            291,
        ),
        case("scale", "scale0.3", p(Shape::new(1, 2, 90, 64), F32).with_scale(0.3), Normal, 300),
        alibi(case("alibi", "s120", p(gqa_shape(1, 4, 2, 120, 120, 64), Bf16).causal(), Normal, 310), false),
        alibi(
            case("alibi", "sq60sk130", p(Shape { batch: 2, ..sk(60, 130, 2, 64) }, F32), Normal, 311),
            true,
        ),
        case(
            "layouts",
            "bshd-gqa",
            p(gqa_shape(2, 4, 2, 80, 80, 64), F16).with_layout(Layout::Bshd),
            Normal,
            320,
        ),
        case("layouts", "padded-views", padded(p(Shape::new(2, 2, 70, 64), Bf16).causal()), Normal, 321),
    ]);
    let gqa = gqa_shape(1, 4, 2, 1, 1, 64);
    for (tag, keys, dtype, seed) in
        [("packed", KeyStore::Packed, F16, 330), ("seqused", KeyStore::DenseUsed, F32, 331)]
    {
        let (problem, extras) = seqs(gqa, dtype, &[0, 1, 63, 64, 65, 130], &[5, 1, 100, 64, 140, 130], keys);
        let family = if keys == KeyStore::DenseUsed { "kv-cache" } else { "varlen" };
        v.push(with_extras(family, tag, problem.causal(), extras, Normal, seed));
    }
    v
}

/// Longer gradient cases: sequences of 256 to 1000 over every dtype and both masks, a varlen
/// batch of mixed lengths with every feature at once.
pub fn full() -> Vec<Case> {
    let mut v = quick();
    let mut seed = 2000;
    for dtype in DType::ALL {
        for (seq, d) in [(256, 128), (1000, 64), (511, 256)] {
            for causal in [false, true] {
                let problem = p(gqa_shape(2, 4, 2, seq, seq, d), dtype);
                seed += 1;
                v.push(case(
                    "long",
                    &format!("s{seq}d{d}"),
                    if causal { problem.causal() } else { problem },
                    Distribution::Normal,
                    seed,
                ));
            }
        }
        // Tiles that the causal diagonal (bottom-right, more keys than queries) or a window's
        // edges cross inside the sequence: CUDA's Hopper family masks them on its bounded path at
        // D=64 and by its general one at D=128.
        for (family, tag, problem) in [
            ("causal-offset", "sq192sk448d128", p(gqa_shape(1, 4, 2, 192, 448, 128), dtype).causal()),
            ("window", "s640-(200,30)d64", p(Shape::new(1, 2, 640, 64), dtype).with_mask(window(200, 30))),
            ("window", "s512-(100,20)d128", p(Shape::new(1, 2, 512, 128), dtype).with_mask(window(100, 20))),
        ] {
            seed += 1;
            v.push(case(family, tag, problem, Distribution::Normal, seed));
        }
        let lens = [300, 1, 77, 512, 129];
        let (problem, extras) = seqs(gqa_shape(1, 4, 2, 1, 1, 128), dtype, &lens, &lens, KeyStore::Packed);
        let problem = problem.with_window(Some(100), Some(0)).with_softcap(20.0);
        seed += 1;
        v.push(alibi(
            with_extras("varlen", "b5-window-cap20", problem, extras, Distribution::Normal, seed),
            true,
        ));
        // The same at D=256 (on CUDA the Hopper family's split columns), causal, shorter.
        let lens = [130, 1, 65];
        let (problem, extras) = seqs(gqa_shape(1, 4, 2, 1, 1, 256), dtype, &lens, &lens, KeyStore::Packed);
        seed += 1;
        v.push(alibi(
            with_extras(
                "varlen",
                "b3-d256-causal",
                problem.causal().with_softcap(20.0),
                extras,
                Distribution::Normal,
                seed,
            ),
            true,
        ));
    }
    v
}
