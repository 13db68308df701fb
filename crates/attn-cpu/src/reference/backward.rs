//! The exact backward pass: the gradients of q, k and v in f64, one query row at a time.
//!
//! It differentiates the forward of [`super::row_typed`] itself, from q, k, v and dO alone: the
//! probabilities are recomputed from exact scores, and `D[i] = Σ_j P[i,j] · dP[i,j]` is the exact
//! `dO[i] · O[i]`. The forward's rounded output and f32 log-sum-exp, which the fast backends read,
//! play no part, so that the reference is the gradient of the function and not of a backend's
//! approximation of it. The formulas are [`attn_core::backward`]'s.

use super::{Exact, Reference, RowScores};
use attn_core::{Data, DataMut, Error, GradInputs, Gradients, Problem, Result, SeqMap};
use rayon::prelude::*;

/// Exact gradients, unrounded, in logical order whatever the problem's layout: `dq` as
/// `[batch, heads_q, seq_q, head_dim]`, `dk` and `dv` as `[batch, heads_kv, seq_k, head_dim]`
/// (each sequence's rows at their index within the sequence; rows a sequence does not have are
/// 0).
#[derive(Clone, Debug, PartialEq)]
pub struct RefGrads {
    /// `∂L/∂q`.
    pub dq: Vec<f64>,
    /// `∂L/∂k`, summed over the query heads of each group.
    pub dk: Vec<f64>,
    /// `∂L/∂v`, summed over the query heads of each group.
    pub dv: Vec<f64>,
}

impl Reference {
    /// The exact gradients of `L = Σ dO ∘ o(q, k, v)` for `problem` on `inputs`, with `d_o` laid
    /// out as the output. Parallel over (batch, kv head).
    pub fn gradients(problem: &Problem, inputs: &attn_core::Inputs<'_>, d_o: Data<'_>) -> Result<RefGrads> {
        problem.validate_backward()?;
        problem.check_inputs(inputs)?;
        if d_o.dtype() != problem.dtype || d_o.len() < problem.required_lens()[3].1 {
            return Err(Error::Shape {
                tensor: "d_o",
                what: format!(
                    "must be {} with the output's strides ({} elements)",
                    problem.dtype,
                    problem.required_lens()[3].1
                ),
            });
        }
        let map = problem.seq_map(inputs.extras)?;
        Ok(attn_core::with_elements!(inputs.q, |q| {
            let why = "dtypes checked by check_inputs";
            let (k, v, d_o) =
                (inputs.k.typed().expect(why), inputs.v.typed().expect(why), d_o.typed().expect(why));
            grads_typed(&map, [q, k, v, d_o])
        }))
    }

    /// Computes the exact gradients and writes them, rounded once, into `grads`: the rows the
    /// sequences have, at their places in each input's layout; nothing else is written.
    pub fn backward_into(problem: &Problem, inputs: &GradInputs<'_>, mut grads: Gradients<'_>) -> Result<()> {
        problem.check_backward(inputs, &grads)?;
        let exact = Self::gradients(problem, &inputs.inputs, inputs.d_o)?;
        let map = problem.seq_map(inputs.inputs.extras)?;
        let s = problem.shape;
        let q_rows = map.rows().map(|(b, h, i)| ((b * s.heads_q + h) * s.seq_q + i, map.q_offset(b, h, i)));
        write_rows(&mut grads.dq, &exact.dq, s.head_dim, q_rows);
        let kv_rows = || {
            (0..s.batch).flat_map(move |b| {
                (0..s.heads_kv).flat_map(move |g| (0..map.k_len(b)).map(move |j| (b, g, j)))
            })
        };
        let logical = |(b, g, j): (usize, usize, usize)| (b * s.heads_kv + g) * s.seq_k + j;
        write_rows(
            &mut grads.dk,
            &exact.dk,
            s.head_dim,
            kv_rows().map(|r| (logical(r), map.k_offset(r.0, r.1, r.2))),
        );
        write_rows(
            &mut grads.dv,
            &exact.dv,
            s.head_dim,
            kv_rows().map(|r| (logical(r), map.v_offset(r.0, r.1, r.2))),
        );
        Ok(())
    }
}

/// Rounds rows of `src` (logical row `r` at `r · d`) into `dst` at element offsets (through f32,
/// as the forward rounds its output).
fn write_rows(dst: &mut DataMut<'_>, src: &[f64], d: usize, rows: impl Iterator<Item = (usize, usize)>) {
    let mut row = vec![0f32; d];
    for (r, off) in rows {
        row.iter_mut().zip(&src[r * d..r * d + d]).for_each(|(y, x)| *y = *x as f32);
        dst.store_f32(off, &row);
    }
}

/// The gradients of every (batch, kv head) group, in parallel: each group owns its dK and dV
/// rows and the dQ rows of its query heads, so no two tasks write one element.
pub(crate) fn grads_typed<T: Exact>(map: &SeqMap<'_>, [q, k, v, d_o]: [&[T]; 4]) -> RefGrads {
    let s = map.problem().shape;
    let (d, group) = (s.head_dim, s.group_size());
    let groups: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = (0..s.batch * s.heads_kv)
        .into_par_iter()
        .map(|bg| group_grads(map, [q, k, v, d_o], (bg / s.heads_kv, bg % s.heads_kv)))
        .collect();
    let mut out = RefGrads {
        dq: vec![0.0; s.batch * s.heads_q * s.seq_q * d],
        dk: vec![0.0; s.batch * s.heads_kv * s.seq_k * d],
        dv: vec![0.0; s.batch * s.heads_kv * s.seq_k * d],
    };
    let (q_span, kv_span) = (group * s.seq_q * d, s.seq_k * d);
    for (bg, (dq, dk, dv)) in groups.into_iter().enumerate() {
        // Query heads h = g·group .. (g+1)·group are contiguous in [batch, heads_q, ...].
        out.dq[bg * q_span..][..q_span].copy_from_slice(&dq);
        out.dk[bg * kv_span..][..kv_span].copy_from_slice(&dk);
        out.dv[bg * kv_span..][..kv_span].copy_from_slice(&dv);
    }
    out
}

/// Group `(b, g)`: dQ of its query heads (`[group, seq_q, d]`), and its dK, dV (`[seq_k, d]`).
fn group_grads<T: Exact>(
    map: &SeqMap<'_>,
    [q, k, v, d_o]: [&[T]; 4],
    (b, g): (usize, usize),
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let p = map.problem();
    let s = p.shape;
    let (d, group) = (s.head_dim, s.group_size());
    let scale = p.scale() as f64;
    let (mut dq, mut dk, mut dv) =
        (vec![0.0; group * s.seq_q * d], vec![0.0; s.seq_k * d], vec![0.0; s.seq_k * d]);
    let row = |x: &[T], off: usize| -> Vec<f64> { x[off..off + d].iter().map(|e| e.exact()).collect() };
    for hh in 0..group {
        let h = g * group + hh;
        for i in 0..map.q_len(b) {
            let scores = RowScores::compute(map, q, k, (b, h, i));
            if scores.keys.is_empty() {
                continue;
            }
            let lse = scores.lse();
            let (qi, doi) = (row(q, map.q_offset(b, h, i)), row(d_o, map.o_offset(b, h, i)));
            let probs: Vec<f64> = scores.s.iter().map(|x| (x - lse).exp()).collect();
            let dp: Vec<f64> = scores
                .keys
                .clone()
                .map(|j| row(v, map.v_offset(b, g, j)).iter().zip(&doi).map(|(a, c)| a * c).sum())
                .collect();
            let big_d: f64 = probs.iter().zip(&dp).map(|(a, c)| a * c).sum();
            let dqi = &mut dq[(hh * s.seq_q + i) * d..][..d];
            for (n, j) in scores.keys.clone().enumerate() {
                let dx = probs[n] * (dp[n] - big_d) * scores.ds_dx[n];
                let kj = row(k, map.k_offset(b, g, j));
                for x in 0..d {
                    dqi[x] += scale * dx * kj[x];
                    dk[j * d + x] += scale * dx * qi[x];
                    dv[j * d + x] += probs[n] * doi[x];
                }
            }
        }
    }
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::super::{F64, row_typed};
    use super::*;
    use attn_core::rng::SplitMix64;
    use attn_core::sequences::{Alibi, Batching, Extras, KvRows, QueryRows};
    use attn_core::{DType, Layout, Shape};

    /// `L = Σ dO ∘ o` over the rows the sequences have.
    fn loss(map: &SeqMap<'_>, [q, k, v, d_o]: [&[F64]; 4]) -> f64 {
        let d = map.problem().shape.head_dim;
        let mut o = vec![0.0; d];
        map.rows()
            .map(|(b, h, i)| {
                row_typed(map, [q, k, v], (b, h, i), &mut o);
                let off = map.o_offset(b, h, i);
                o.iter().zip(&d_o[off..off + d]).map(|(a, c)| a * c.0).sum::<f64>()
            })
            .sum()
    }

    /// Checks every gradient element the problem has against central differences of the loss.
    fn check_finite_differences(problem: Problem, extras: Extras<'_>, seed: u64) {
        let map = problem.seq_map(extras).unwrap();
        let mut rng = SplitMix64::new(seed);
        let lens = problem.required_lens().map(|(_, n)| n);
        let mut draw = |n: usize| (0..n).map(|_| F64(rng.normal())).collect::<Vec<_>>();
        let mut ins = [draw(lens[0]), draw(lens[1]), draw(lens[2]), draw(lens[3])];
        let g = grads_typed(&map, [&ins[0], &ins[1], &ins[2], &ins[3]]);
        let s = problem.shape;
        let d = s.head_dim;
        let h = 1e-5;
        let mut worst = 0.0f64;
        let mut check = |which: usize, off: usize, analytic: f64, ins: &mut [Vec<F64>; 4]| {
            let x = ins[which][off].0;
            ins[which][off].0 = x + h;
            let up = loss(&map, [&ins[0], &ins[1], &ins[2], &ins[3]]);
            ins[which][off].0 = x - h;
            let down = loss(&map, [&ins[0], &ins[1], &ins[2], &ins[3]]);
            ins[which][off].0 = x;
            let numeric = (up - down) / (2.0 * h);
            let err = (numeric - analytic).abs() / (1.0 + analytic.abs());
            assert!(
                err < 1e-6,
                "{problem}: input {which} element {off}: analytic {analytic}, numeric {numeric}"
            );
            worst = worst.max(err);
        };
        for (b, hq, i) in map.rows().collect::<Vec<_>>() {
            for x in 0..d {
                check(
                    0,
                    map.q_offset(b, hq, i) + x,
                    g.dq[((b * s.heads_q + hq) * s.seq_q + i) * d + x],
                    &mut ins,
                );
            }
        }
        for b in 0..s.batch {
            for kvh in 0..s.heads_kv {
                for j in 0..map.k_len(b) {
                    let row = ((b * s.heads_kv + kvh) * s.seq_k + j) * d;
                    for x in 0..d {
                        check(1, map.k_offset(b, kvh, j) + x, g.dk[row + x], &mut ins);
                        check(2, map.v_offset(b, kvh, j) + x, g.dv[row + x], &mut ins);
                    }
                }
            }
        }
        assert!(worst > 0.0 || map.rows().count() == 0);
    }

    fn base() -> Problem {
        Problem::new(Shape { batch: 2, heads_q: 4, heads_kv: 2, seq_q: 5, seq_k: 7, head_dim: 3 }, DType::F32)
    }

    #[test]
    fn gradients_match_finite_differences_for_every_feature() {
        let slopes = [0.5f32, 0.25, 0.125, 0.0625];
        let with_slopes = Extras { alibi_slopes: Some(&slopes), ..Extras::default() };
        let cases: Vec<(&str, Problem, Extras<'_>)> = vec![
            ("plain GQA", base(), Extras::default()),
            ("causal bottom-right, seq_q < seq_k", base().causal(), Extras::default()),
            (
                "causal, seq_q > seq_k (empty rows)",
                Problem::new(Shape { seq_q: 7, seq_k: 4, ..base().shape }, DType::F32).causal(),
                Extras::default(),
            ),
            ("window (2, 1)", base().with_window(Some(2), Some(1)), Extras::default()),
            ("soft-cap 1.5, scale 0.8", base().with_softcap(1.5).with_scale(0.8), Extras::default()),
            ("ALiBi, causal", base().with_alibi(Alibi::PerHead).causal(), with_slopes),
            ("BSHD strides", base().with_layout(Layout::Bshd).causal(), Extras::default()),
        ];
        for (i, (name, p, e)) in cases.into_iter().enumerate() {
            eprintln!("{name}: {p}");
            check_finite_differences(p, e, 7 + i as u64);
        }
    }

    #[test]
    fn packed_sequences_and_key_counts_match_finite_differences() {
        let cu_q = [0, 3, 4];
        let cu_k = [0, 5, 7];
        let p = Problem::new(Shape { seq_q: 3, seq_k: 5, ..base().shape }, DType::F32)
            .with_layout(Layout::Bshd)
            .causal()
            .with_batching(Batching {
                q: QueryRows::Packed { total: 4 },
                kv: KvRows::Packed { total: 7 },
                keys_used: false,
            });
        // Packed strides: one "batch" of `total` rows.
        let strides = attn_core::TensorStrides {
            q: Layout::Bshd.strides(4, 4, 3),
            k: Layout::Bshd.strides(2, 7, 3),
            v: Layout::Bshd.strides(2, 7, 3),
            o: Layout::Bshd.strides(4, 4, 3),
        };
        let extras = Extras { cu_seqlens_q: Some(&cu_q), cu_seqlens_k: Some(&cu_k), ..Extras::default() };
        check_finite_differences(p.with_strides(strides), extras, 3);
        let used = [4, 2];
        let dense = base().with_batching(Batching { keys_used: true, ..Batching::default() }).causal();
        check_finite_differences(dense, Extras { seqused_k: Some(&used), ..Extras::default() }, 4);
    }
}
