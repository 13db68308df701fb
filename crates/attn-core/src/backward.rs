//! The backward pass: what it reads, what it writes, and the checks every backend shares.
//!
//! For a loss `L` whose gradient with respect to the forward's output is `dO`, the backward pass
//! writes `dQ = ∂L/∂q`, `dK = ∂L/∂k` and `dV = ∂L/∂v`. With `P` the softmax weights of a row
//! (recomputed from the forward's log-sum-exp, never stored), `x = scale · q·k` the raw score and
//! `s = cap(x) + bias` the score the softmax sees:
//!
//! - `dV[j] = Σ_i P[i,j] · dO[i]`
//! - `dP[i,j] = dO[i] · v[j]`, `D[i] = Σ_j P[i,j] · dP[i,j] = dO[i] · O[i]`
//! - `dS[i,j] = P[i,j] · (dP[i,j] − D[i])`, and through the soft-cap
//!   `dX[i,j] = dS[i,j] · (1 − tanh²(x / cap))` (`dX = dS` without one; ALiBi's bias is constant)
//! - `dQ[i] = scale · Σ_j dX[i,j] · k[j]`, `dK[j] = scale · Σ_i dX[i,j] · q[i]`
//!
//! Under grouped-query attention `dK` and `dV` of a key/value head sum over every query head of
//! its group. Gradients have their input's dtype and strides: `dq` is laid out as `q`, `dk` as
//! `k`, `dv` as `v`, and `dO` as `o`. Rows a sequence has are written (keys no query sees get
//! zero); rows in the gaps of a strided or packed view are not touched.
//!
//! Every feature of the forward has its gradient except a paged KV cache, which is an inference
//! structure (nothing trains through a cache): [`Problem::validate_backward`] refuses it.

use crate::problem::Strides;
use crate::tensor::check_tensor;
use crate::{Data, DataMut, Error, Feature, Inputs, Problem, Result};

/// What the backward pass reads: the forward's inputs, its output and log-sum-exp, and the
/// gradient of the loss with respect to that output.
#[derive(Clone, Copy, Debug)]
pub struct GradInputs<'a> {
    /// q, k, v and the extras, exactly as the forward took them.
    pub inputs: Inputs<'a>,
    /// The forward's output `o`, with the problem's output strides.
    pub o: Data<'a>,
    /// The forward's natural-log log-sum-exp ([`Problem::lse_len`] values, laid out as the
    /// forward writes it).
    pub lse: &'a [f32],
    /// `∂L/∂o`, with the output's strides and dtype.
    pub d_o: Data<'a>,
}

/// Where the backward pass writes: one gradient per input, each with its input's strides.
#[derive(Debug)]
pub struct Gradients<'a> {
    /// `∂L/∂q`, laid out as `q`.
    pub dq: DataMut<'a>,
    /// `∂L/∂k`, laid out as `k`.
    pub dk: DataMut<'a>,
    /// `∂L/∂v`, laid out as `v`.
    pub dv: DataMut<'a>,
}

impl Gradients<'_> {
    /// Fills every gradient with NaN, so that an element a backend forgets to write shows up.
    pub fn poison(&mut self) {
        self.dq.poison();
        self.dk.poison();
        self.dv.poison();
    }
}

/// How the backward pass may order its sums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct BackwardOptions {
    /// Accumulate `dQ` (and every other sum) in a fixed order, so that results are bit-identical
    /// across runs and across thread or grid counts. Off by default: a GPU backend may then add
    /// partial `dQ` tiles in whatever order its blocks finish. Backends whose default is already
    /// deterministic say so in their plan.
    pub deterministic: bool,
}

impl Problem {
    /// Checks what the backward pass needs beyond the forward's [`Problem::validate`]: no paged
    /// KV cache, and gradient views whose elements do not overlap (an input may alias, e.g. a
    /// batch stride of 0, but its gradient then has two writers per element).
    pub fn validate_backward(&self) -> Result<()> {
        self.validate()?;
        if self.features().contains(&Feature::PagedKv) {
            return Err(Error::InvalidParameter {
                what: format!(
                    "{self}: the backward pass takes dense or packed (varlen) keys; a paged KV cache is an \
                     inference structure with no gradient (train on the packed rows instead)"
                ),
            });
        }
        let [q, k, v, _] = self.extents();
        let d = self.shape.head_dim;
        let t = self.strides;
        for (name, input, st, (n, heads, rows)) in
            [("dq", "q", t.q, q), ("dk", "k", t.k, k), ("dv", "v", t.v, v)]
        {
            if !st.is_non_overlapping(n, heads, rows, d) {
                return Err(overlap(name, input, st, (n, heads, rows, d)));
            }
        }
        Ok(())
    }

    /// Checks a backward call's buffers: the forward's inputs as [`Problem::check_inputs`] does,
    /// `o` and `dO` as long as the output view, the LSE of [`Problem::lse_len`] values, and each
    /// gradient as long as its input, all of the problem's dtype.
    pub fn check_backward(&self, inputs: &GradInputs<'_>, grads: &Gradients<'_>) -> Result<()> {
        self.validate_backward()?;
        self.check_inputs(&inputs.inputs)?;
        let [(_, q), (_, k), (_, v), (_, o)] = self.required_lens();
        check_tensor(self.dtype, "o", o, inputs.o.dtype(), inputs.o.len())?;
        check_tensor(self.dtype, "d_o", o, inputs.d_o.dtype(), inputs.d_o.len())?;
        if inputs.lse.len() != self.lse_len() {
            return Err(Error::Shape {
                tensor: "lse",
                what: format!(
                    "has {} elements; the backward pass needs the forward's {} (Params::return_lse)",
                    inputs.lse.len(),
                    self.lse_len()
                ),
            });
        }
        check_tensor(self.dtype, "dq", q, grads.dq.dtype(), grads.dq.len())?;
        check_tensor(self.dtype, "dk", k, grads.dk.dtype(), grads.dk.len())?;
        check_tensor(self.dtype, "dv", v, grads.dv.dtype(), grads.dv.len())?;
        Ok(())
    }

    /// Floating-point operations of the backward pass by FlashAttention's convention: 2.5 times
    /// the forward's ([`Problem::flops`]: five matrix products against the forward's two).
    pub fn backward_flops(&self) -> f64 {
        2.5 * self.flops()
    }
}

fn overlap(
    name: &'static str,
    input: &str,
    st: Strides,
    (n, heads, rows, d): (usize, usize, usize, usize),
) -> Error {
    Error::Stride {
        tensor: name,
        strides: st.to_string(),
        what: format!(
            "the gradient is written with `{input}`'s strides, whose elements overlap for [{n}, {heads}, {rows}, {d}]; \
             give `{input}` distinct addresses (e.g. contiguous BHSD or BSHD) to take its gradient"
        ),
    }
}

#[cfg(test)]
mod tests {
    use crate::sequences::{Batching, KvRows};
    use crate::{Buffer, DType, Gradients, Problem, Shape, Strides};

    #[test]
    fn paged_caches_and_aliased_inputs_are_refused_with_reasons() {
        let p = Problem::new(Shape::new(2, 2, 8, 4), DType::F32);
        assert!(p.validate_backward().is_ok());
        let paged = p.with_batching(Batching {
            kv: KvRows::Paged { page_size: 4, pages: 4, pages_per_seq: 2 },
            ..Batching::default()
        });
        let e = paged.validate_backward().unwrap_err().to_string();
        assert!(e.contains("paged KV cache") && e.contains("packed"), "{e}");
        // k shared by both batches (batch stride 0): valid forward, no gradient.
        let mut s = p.strides;
        s.k = Strides { batch: 0, ..s.k };
        let aliased = p.with_strides(s);
        assert!(aliased.validate().is_ok());
        let e = aliased.validate_backward().unwrap_err().to_string();
        assert!(e.contains("dk") && e.contains("overlap"), "{e}");
    }

    #[test]
    fn buffers_are_checked_by_name() {
        let p = Problem::new(Shape::new(1, 2, 8, 4), DType::F32);
        let n = p.required_lens()[0].1;
        let full = Buffer::zeros(DType::F32, n);
        let short = Buffer::zeros(DType::F32, n - 1);
        let lse = vec![0.0; p.lse_len()];
        let ins = crate::Inputs::new(full.as_data(), full.as_data(), full.as_data());
        let grad_in = super::GradInputs { inputs: ins, o: full.as_data(), lse: &lse, d_o: short.as_data() };
        let (mut a, mut b, mut c) = (full.clone(), full.clone(), full.clone());
        let grads = Gradients { dq: a.as_data_mut(), dk: b.as_data_mut(), dv: c.as_data_mut() };
        let e = p.check_backward(&grad_in, &grads).unwrap_err().to_string();
        assert!(e.contains("d_o"), "{e}");
        let grad_in = super::GradInputs { d_o: full.as_data(), lse: &lse[1..], ..grad_in };
        let e = p.check_backward(&grad_in, &grads).unwrap_err().to_string();
        assert!(e.contains("lse") && e.contains("return_lse"), "{e}");
    }
}
