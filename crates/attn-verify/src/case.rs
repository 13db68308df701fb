//! Verification cases: a problem, a family, and how its inputs are drawn.

use attn_core::rng::SplitMix64;
use attn_core::sequences::OwnedExtras;
use attn_core::{Buffer, Inputs, Problem};

/// How the inputs of a case are drawn. Never all zeros: zeros hide unwritten outputs and wrong
/// indexing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Distribution {
    /// q, k, v ~ N(0, 1).
    Normal,
    /// q, k ~ N(0, 20²): scaled scores of a few hundred, so `exp` without max-subtraction
    /// overflows f32 (and f16/bf16 far sooner).
    LargeMagnitude,
    /// Each query is a large multiple of one random key of its kv head, so its softmax is nearly
    /// one-hot and its output nearly that key's value: a wrong head or key index is unmissable.
    OneHotPeaked,
    /// q, k, v drawn as N(0,1) / max(U(0,1), 0.05): heavy tails, occasional values 20x typical.
    HeavyTailed,
    /// Small integers in -3..=3: inputs exact in every dtype.
    SmallIntegers,
}

/// One verification case.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Case {
    /// The family it belongs to (a row of the report), e.g. `large-logits`.
    pub family: &'static str,
    /// A short unique name, e.g. `large-logits/bf16/causal`.
    pub name: String,
    /// The problem, with its shape, dtype, strides and parameters.
    pub problem: Problem,
    /// How inputs are drawn.
    pub dist: Distribution,
    /// Seed of the inputs (printed in every failure).
    pub seed: u64,
    /// The indices and slopes the problem needs (packed offsets, block table, ALiBi slopes).
    pub extras: OwnedExtras,
}

impl Case {
    /// `bufs` (from [`Case::inputs`]) with this case's extras, as a backend takes them.
    pub fn as_inputs<'a>(&'a self, bufs: &'a [Buffer; 3]) -> Inputs<'a> {
        Inputs::new(bufs[0].as_data(), bufs[1].as_data(), bufs[2].as_data()).with_extras(self.extras.borrow())
    }

    /// Fresh inputs for this case: q, k, v, each long enough for the problem's strides.
    /// Elements outside the strided views are drawn too (they must not matter).
    pub fn inputs(&self) -> [Buffer; 3] {
        let p = &self.problem;
        let mut rng = SplitMix64::new(self.seed);
        let [q_len, k_len, v_len, _] = p.required_lens().map(|(_, n)| n);
        let dtype = p.dtype;
        let mut draw = |len: usize, sigma: f64| -> Vec<f32> {
            (0..len)
                .map(|_| match self.dist {
                    Distribution::Normal | Distribution::OneHotPeaked => (rng.normal() * sigma) as f32,
                    Distribution::LargeMagnitude => (rng.normal() * sigma) as f32,
                    Distribution::HeavyTailed => (rng.normal() / rng.uniform().max(0.05)) as f32,
                    Distribution::SmallIntegers => rng.below(7) as f32 - 3.0,
                })
                .collect()
        };
        let sigma_qk = if self.dist == Distribution::LargeMagnitude { 20.0 } else { 1.0 };
        let mut q = draw(q_len, sigma_qk);
        let mut k = draw(k_len, sigma_qk);
        let mut v = draw(v_len, 1.0);
        if self.dist == Distribution::OneHotPeaked {
            self.peak_queries(&mut q, &k, &mut rng);
        }
        if p.batching.keys_used {
            self.poison_unused_keys(&mut k, &mut v);
        }
        [Buffer::from_f32(dtype, q), Buffer::from_f32(dtype, k), Buffer::from_f32(dtype, v)]
    }

    /// A cache with per-sequence key counts (`seqused_k`): every element of k and v outside the
    /// keys the sequences use (the slots past each count, spare pages) becomes NaN, as unwritten
    /// cache memory may hold; a backend that lets one reach an output fails.
    fn poison_unused_keys(&self, k: &mut [f32], v: &mut [f32]) {
        let p = &self.problem;
        let s = p.shape;
        let map = p.seq_map(self.extras.borrow()).expect("verification cases have valid extras");
        let (mut k_used, mut v_used) = (vec![false; k.len()], vec![false; v.len()]);
        for b in 0..s.batch {
            for g in 0..s.heads_kv {
                for j in 0..map.k_len(b) {
                    let (ko, vo) = (map.k_offset(b, g, j), map.v_offset(b, g, j));
                    k_used[ko..ko + s.head_dim].fill(true);
                    v_used[vo..vo + s.head_dim].fill(true);
                }
            }
        }
        for (x, used) in k.iter_mut().zip(&k_used).chain(v.iter_mut().zip(&v_used)) {
            if !used {
                *x = f32::NAN;
            }
        }
    }

    /// Sets each query row to `α · k[j]` for a random visible key `j` of its kv head, with `α`
    /// such that its score exceeds the others' by about 30.
    fn peak_queries(&self, q: &mut [f32], k: &[f32], rng: &mut SplitMix64) {
        let p = &self.problem;
        let s = p.shape;
        let d = s.head_dim;
        let alpha = 30.0 / (d as f32).sqrt() / p.scale() / (d as f32).sqrt();
        let map = p.seq_map(self.extras.borrow()).expect("verification cases have valid extras");
        for (b, h, i) in map.rows() {
            let visible = map.visible(b, i);
            if visible.is_empty() {
                continue;
            }
            let j = visible.start + rng.below(visible.len());
            let (qo, ko) = (map.q_offset(b, h, i), map.k_offset(b, s.kv_head(h), j));
            for x in 0..d {
                q[qo + x] = alpha * k[ko + x];
            }
        }
    }
}
