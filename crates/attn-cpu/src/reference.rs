//! The exact reference: naive attention in f64, one query row at a time.

use attn_core::{
    Attention, Availability, Buffer, DataMut, DeviceKind, Element, Execution, HostPrepared, Inputs, Numerics,
    Outputs, Plan, Prepared, Problem, Result, Tiles, with_elements,
};
use rayon::prelude::*;

/// The ground truth every other backend is compared with.
///
/// Inputs are widened to f64, scores are computed exactly in f64 (one row of `seq_k` scores at a
/// time, never the S×S matrix), the softmax is the two-pass textbook form (max, then sum), and
/// the output is rounded to the problem's dtype only when written through [`Attention`].
/// [`Reference::row`] gives the unrounded f64 row, which is what tests compare against.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reference;

/// One reference query row.
#[derive(Clone, Debug, PartialEq)]
pub struct RefRow {
    /// `o[b, h, i, :]` in f64.
    pub o: Vec<f64>,
    /// Natural-log log-sum-exp of the row's scaled, masked scores (`-inf` if it sees no key).
    pub lse: f64,
}

impl Reference {
    /// Computes query row `i` of head `h` in batch `b`, exactly.
    pub fn row(problem: &Problem, inputs: &Inputs<'_>, b: usize, h: usize, i: usize) -> RefRow {
        let mut scores = Vec::new();
        let mut o = vec![0.0; problem.shape.head_dim];
        let lse = with_elements!(inputs.q, |q| {
            let k = inputs.k.typed().expect("k has q's dtype (checked by Problem::check_inputs)");
            let v = inputs.v.typed().expect("v has q's dtype (checked by Problem::check_inputs)");
            row_typed(problem, q, k, v, b, h, i, &mut scores, &mut o)
        });
        RefRow { o, lse }
    }

    /// Every row, in f64: `o` as `[batch, heads_q, seq_q, head_dim]` contiguous and `lse` as
    /// `[batch, heads_q, seq_q]`. Parallel over rows.
    pub fn compute(problem: &Problem, inputs: &Inputs<'_>) -> Result<(Vec<f64>, Vec<f64>)> {
        problem.check_inputs(inputs)?;
        let s = problem.shape;
        let d = s.head_dim;
        let mut o = vec![0.0; s.batch * s.heads_q * s.seq_q * d];
        let mut lse = vec![0.0; s.batch * s.heads_q * s.seq_q];
        o.par_chunks_mut(d).zip(lse.par_iter_mut()).enumerate().for_each(|(row, (o, lse))| {
            let (bh, i) = (row / s.seq_q, row % s.seq_q);
            let r = Self::row(problem, inputs, bh / s.heads_q, bh % s.heads_q, i);
            o.copy_from_slice(&r.o);
            *lse = r.lse;
        });
        Ok((o, lse))
    }
}

fn row_typed<T: Element>(
    p: &Problem,
    q: &[T],
    k: &[T],
    v: &[T],
    b: usize,
    h: usize,
    i: usize,
    scores: &mut Vec<f64>,
    o: &mut [f64],
) -> f64 {
    let s = p.shape;
    let (d, g) = (s.head_dim, s.kv_head(h));
    let scale = p.scale() as f64;
    let qrow = &q[p.strides.q.offset(b, h, i)..][..d];
    let visible = p.params.mask.visible_range(i, s.seq_q, s.seq_k);
    let softcap = p.params.softcap.map(f64::from);
    scores.clear();
    scores.extend(visible.clone().map(|j| {
        let krow = &k[p.strides.k.offset(b, g, j)..][..d];
        let score =
            scale * qrow.iter().zip(krow).map(|(x, y)| x.to_f32() as f64 * y.to_f32() as f64).sum::<f64>();
        // The soft-cap acts on the scaled score: cap · tanh(score / cap).
        softcap.map_or(score, |cap| cap * (score / cap).tanh())
    }));
    o.fill(0.0);
    if visible.is_empty() {
        return f64::NEG_INFINITY;
    }
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for (j, sc) in visible.zip(scores.iter()) {
        let w = (sc - max).exp();
        sum += w;
        let vrow = &v[p.strides.v.offset(b, g, j)..][..d];
        for (o, x) in o.iter_mut().zip(vrow) {
            *o += w * x.to_f32() as f64;
        }
    }
    o.iter_mut().for_each(|x| *x /= sum);
    max + sum.ln()
}

impl Reference {
    /// Computes every row and writes it, rounded once, into `outputs`.
    pub fn forward_into(problem: &Problem, inputs: &Inputs<'_>, mut outputs: Outputs<'_>) -> Result<()> {
        problem.check_outputs(&outputs)?;
        let (o, lse) = Self::compute(problem, inputs)?;
        let s = problem.shape;
        let d = s.head_dim;
        let rounded = Buffer::from_f32(problem.dtype, o.iter().map(|&x| x as f32));
        for row in 0..s.batch * s.heads_q * s.seq_q {
            let (bh, i) = (row / s.seq_q, row % s.seq_q);
            let off = problem.strides.o.offset(bh / s.heads_q, bh % s.heads_q, i);
            let src = row * d..row * d + d;
            match (&mut outputs.o, &rounded) {
                (DataMut::F32(dst), Buffer::F32(v)) => dst[off..off + d].copy_from_slice(&v[src]),
                (DataMut::F16(dst), Buffer::F16(v)) => dst[off..off + d].copy_from_slice(&v[src]),
                (DataMut::Bf16(dst), Buffer::Bf16(v)) => dst[off..off + d].copy_from_slice(&v[src]),
                _ => unreachable!("dtypes checked by check_outputs"),
            }
        }
        if let Some(dst) = outputs.lse.as_deref_mut() {
            dst.iter_mut().zip(&lse).for_each(|(d, &l)| *d = l as f32);
        }
        Ok(())
    }
}

/// The reference as a backend, so that it can be run and compared like any other (slow: for
/// checking, not for use).
impl Attention for Reference {
    fn name(&self) -> &str {
        "cpu-reference"
    }

    fn availability(&self) -> Availability {
        Availability::Available { device: "host CPU (f64 scalar)".into(), kind: DeviceKind::Cpu }
    }

    fn numerics(&self, _dtype: attn_core::DType) -> Numerics {
        Numerics::Exact
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        problem.validate()?;
        let s = problem.shape;
        Ok(Plan {
            backend: self.name().into(),
            kernel: format!("reference f64 {}", problem.dtype),
            problem: *problem,
            tiles: Tiles { block_m: 1, block_n: s.seq_k, stages: 1 },
            execution: Execution::Cpu {
                threads: rayon::current_num_threads(),
                tasks: s.batch * s.heads_q * s.seq_q,
                isa: "scalar f64".into(),
            },
            notes: vec!["exact: f64 scores and accumulation, output rounded once".into()],
            payload: Default::default(),
        })
    }

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        plan.check_for(self.name(), &plan.problem)?;
        let compute = |plan: &Plan, inputs: &Inputs<'a>, outputs: Outputs<'_>| {
            Self::forward_into(&plan.problem, inputs, outputs)
        };
        Ok(Box::new(HostPrepared::new(plan, inputs, compute)?))
    }
}
