//! The exact reference: naive attention in f64, one query row at a time, and its exact
//! backward pass ([`backward`]).

mod backward;

pub use backward::RefGrads;

use attn_core::sequences::alibi_bias;
use attn_core::{
    Attention, Availability, BackwardOptions, Buffer, DataMut, DeviceKind, Element, Execution, GradInputs,
    Gradients, HostPrepared, Inputs, Numerics, Outputs, Plan, Prepared, Problem, Result, SeqMap, Tiles,
    with_elements,
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
    /// Computes query row `i` of head `h` in sequence `b`, exactly. Errors where the inputs do
    /// not fit the problem (dtype, lengths, extras); rows past the sequence's queries see no key.
    pub fn row(problem: &Problem, inputs: &Inputs<'_>, b: usize, h: usize, i: usize) -> Result<RefRow> {
        problem.check_inputs(inputs)?;
        let map = problem.seq_map(inputs.extras)?;
        let mut o = vec![0.0; problem.shape.head_dim];
        let lse = row_any(&map, inputs, (b, h, i), &mut o);
        Ok(RefRow { o, lse })
    }

    /// Every row, in f64: `o` as `[batch, heads_q, seq_q, head_dim]` contiguous and `lse` as
    /// `[batch, heads_q, seq_q]`, whatever the problem's layout (sequences' rows at their index
    /// within the sequence; rows a sequence does not have are 0 with an LSE of `-inf`). Parallel
    /// over rows.
    pub fn compute(problem: &Problem, inputs: &Inputs<'_>) -> Result<(Vec<f64>, Vec<f64>)> {
        problem.check_inputs(inputs)?;
        let map = problem.seq_map(inputs.extras)?;
        let s = problem.shape;
        let d = s.head_dim;
        let mut o = vec![0.0; s.batch * s.heads_q * s.seq_q * d];
        let mut lse = vec![0.0; s.batch * s.heads_q * s.seq_q];
        o.par_chunks_mut(d).zip(lse.par_iter_mut()).enumerate().for_each(|(row, (o, lse))| {
            let (bh, i) = (row / s.seq_q, row % s.seq_q);
            *lse = row_any(&map, inputs, (bh / s.heads_q, bh % s.heads_q, i), o);
        });
        Ok((o, lse))
    }
}

/// Row `(b, h, i)` into `o`, returning its LSE.
fn row_any(map: &SeqMap<'_>, inputs: &Inputs<'_>, at: (usize, usize, usize), o: &mut [f64]) -> f64 {
    with_elements!(inputs.q, |q| {
        let k = inputs.k.typed().expect("k has q's dtype (checked by Problem::check_inputs)");
        let v = inputs.v.typed().expect("v has q's dtype (checked by Problem::check_inputs)");
        row_typed(map, [q, k, v], at, o)
    })
}

/// An element the reference reads exactly as f64: the three input dtypes, and f64 itself for
/// the finite-difference checks of the backward pass.
pub(crate) trait Exact: Copy + Send + Sync {
    fn exact(self) -> f64;
}

impl<T: Element> Exact for T {
    #[inline]
    fn exact(self) -> f64 {
        self.to_f32() as f64
    }
}

/// An f64 input of the tests: `Element` is closed to f32, f16 and bf16, so f64 goes through a
/// wrapper.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct F64(pub f64);

#[cfg(test)]
impl Exact for F64 {
    #[inline]
    fn exact(self) -> f64 {
        self.0
    }
}

/// The scores of one query row, as the forward and backward passes both need them.
pub(crate) struct RowScores {
    /// The keys the row sees.
    pub keys: std::ops::Range<usize>,
    /// `s_j = cap(scale · q·k_j) + bias_j`, one per key of `keys`.
    pub s: Vec<f64>,
    /// `ds_j / dx_j` with `x_j = scale · q·k_j`: `1 − tanh²(x_j / cap)` under a soft-cap, else 1.
    pub ds_dx: Vec<f64>,
}

impl RowScores {
    /// Computes row `(b, h, i)`'s scores exactly (an empty range for rows past the sequence).
    pub(crate) fn compute<T: Exact>(
        map: &SeqMap<'_>,
        q: &[T],
        k: &[T],
        (b, h, i): (usize, usize, usize),
    ) -> Self {
        let p = map.problem();
        let (d, g) = (p.shape.head_dim, p.shape.kv_head(h));
        let keys = if i < map.q_len(b) { map.visible(b, i) } else { 0..0 };
        let scale = p.scale() as f64;
        let softcap = p.params.softcap.map(f64::from);
        let slope = map.alibi_slope(b, h);
        let (q_len, k_len) = (map.q_len(b), map.k_len(b));
        let (mut s, mut ds_dx) = (Vec::with_capacity(keys.len()), Vec::with_capacity(keys.len()));
        if !keys.is_empty() {
            let qrow = &q[map.q_offset(b, h, i)..][..d];
            for j in keys.clone() {
                let krow = &k[map.k_offset(b, g, j)..][..d];
                let x = scale * qrow.iter().zip(krow).map(|(a, c)| a.exact() * c.exact()).sum::<f64>();
                // The soft-cap acts on the scaled score: cap · tanh(x / cap); ALiBi's bias comes after.
                let (capped, slope_of_cap) = match softcap {
                    Some(cap) => {
                        let t = (x / cap).tanh();
                        (cap * t, 1.0 - t * t)
                    }
                    None => (x, 1.0),
                };
                s.push(capped + slope.map_or(0.0, |m| alibi_bias(m, i, j, q_len, k_len)));
                ds_dx.push(slope_of_cap);
            }
        }
        RowScores { keys, s, ds_dx }
    }

    /// The two-pass log-sum-exp of the scores (`-inf` for a row that sees no key).
    pub(crate) fn lse(&self) -> f64 {
        if self.s.is_empty() {
            return f64::NEG_INFINITY;
        }
        let max = self.s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        max + self.s.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
    }
}

fn row_typed<T: Exact>(
    map: &SeqMap<'_>,
    [q, k, v]: [&[T]; 3],
    (b, h, i): (usize, usize, usize),
    o: &mut [f64],
) -> f64 {
    o.fill(0.0);
    let p = map.problem();
    let (d, g) = (p.shape.head_dim, p.shape.kv_head(h));
    let row = RowScores::compute(map, q, k, (b, h, i));
    let lse = row.lse();
    for (j, s) in row.keys.clone().zip(&row.s) {
        let w = (s - lse).exp();
        let vrow = &v[map.v_offset(b, g, j)..][..d];
        for (o, x) in o.iter_mut().zip(vrow) {
            *o += w * x.exact();
        }
    }
    lse
}

impl Reference {
    /// Computes every row and writes it, rounded once, into `outputs`: the rows the sequences
    /// have, at their places in the problem's layout; nothing else is written.
    pub fn forward_into(problem: &Problem, inputs: &Inputs<'_>, mut outputs: Outputs<'_>) -> Result<()> {
        problem.check_outputs(&outputs)?;
        let (o, lse) = Self::compute(problem, inputs)?;
        let map = problem.seq_map(inputs.extras)?;
        let s = problem.shape;
        let d = s.head_dim;
        let rounded = Buffer::from_f32(problem.dtype, o.iter().map(|&x| x as f32));
        for (b, h, i) in map.rows() {
            let row = (b * s.heads_q + h) * s.seq_q + i;
            let off = map.o_offset(b, h, i);
            let src = row * d..row * d + d;
            match (&mut outputs.o, &rounded) {
                (DataMut::F32(dst), Buffer::F32(v)) => dst[off..off + d].copy_from_slice(&v[src]),
                (DataMut::F16(dst), Buffer::F16(v)) => dst[off..off + d].copy_from_slice(&v[src]),
                (DataMut::Bf16(dst), Buffer::Bf16(v)) => dst[off..off + d].copy_from_slice(&v[src]),
                _ => unreachable!("dtypes checked by check_outputs"),
            }
            if let Some(dst) = outputs.lse.as_deref_mut() {
                dst[map.lse_index(b, h, i)] = lse[row] as f32;
            }
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

    fn plan_backward(&self, problem: &Problem, _options: BackwardOptions) -> Result<Plan> {
        problem.validate_backward()?;
        let s = problem.shape;
        Ok(Plan {
            backend: self.name().into(),
            kernel: format!("reference backward f64 {}", problem.dtype),
            problem: *problem,
            tiles: Tiles { block_m: 1, block_n: s.seq_k, stages: 1 },
            execution: Execution::Cpu {
                threads: rayon::current_num_threads(),
                tasks: s.batch * s.heads_kv,
                isa: "scalar f64".into(),
            },
            notes: vec![
                "exact: f64 gradients from q, k, v and dO alone, rounded once".into(),
                "deterministic: every sum in a fixed order, whatever the options".into(),
            ],
            payload: Default::default(),
        })
    }

    fn run_backward(&self, plan: &Plan, inputs: GradInputs<'_>, grads: Gradients<'_>) -> Result<()> {
        plan.check_for(self.name(), &plan.problem)?;
        Self::backward_into(&plan.problem, &inputs, grads)
    }
}
