//! Backward passes with one deliberate bug each: the test of the gradient tester. Each must be
//! caught by a named case of the gradient grid (`tests/gradients.rs` checks which).
//!
//! They share a naive row-at-a-time f32 backward that is correct without its flaw and reads the
//! forward's output and LSE as a real backend does.

use attn_core::sequences::alibi_bias;
use attn_core::{
    Attention, Availability, BackwardOptions, DeviceKind, Error, Execution, GradInputs, Gradients, Inputs,
    Plan, Prepared, Problem, Result, Tiles,
};

/// One classic backward-pass bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradFlaw {
    /// `dS = P · dP`: the `D = rowsum(dO ∘ O)` term left out (a pre-pass that never ran).
    WrongDTerm,
    /// dK and dV of a kv head taken from the last query head of its group only: written, not
    /// summed, per query head.
    MissingGqaSum,
    /// The causal diagonal aligned top-left in the backward (the forward's bottom-right kept).
    TopLeftCausal,
    /// The keys of a last, partial 64-key tile left out of every gradient.
    DropsLastTile,
}

impl GradFlaw {
    /// Every planted backward flaw.
    pub const ALL: [GradFlaw; 4] =
        [GradFlaw::WrongDTerm, GradFlaw::MissingGqaSum, GradFlaw::TopLeftCausal, GradFlaw::DropsLastTile];
}

/// A naive backward with `flaw` (it has no forward).
pub struct PlantedGrad {
    /// The bug.
    pub flaw: GradFlaw,
    name: String,
}

impl PlantedGrad {
    /// A backend with `flaw`.
    pub fn new(flaw: GradFlaw) -> Self {
        PlantedGrad { flaw, name: format!("planted-grad-{flaw:?}") }
    }

    fn compute(&self, p: &Problem, inputs: &GradInputs<'_>, mut grads: Gradients<'_>) -> Result<()> {
        let s = p.shape;
        let (d, group) = (s.head_dim, s.group_size());
        let map = p.seq_map(inputs.inputs.extras)?;
        let ins = &inputs.inputs;
        let (q, k, v, o, d_o) =
            (widen(ins.q), widen(ins.k), widen(ins.v), widen(inputs.o), widen(inputs.d_o));
        let (mut dq, mut dk, mut dv) = (vec![0.0f32; q.len()], vec![0.0f32; k.len()], vec![0.0f32; v.len()]);
        let scale = p.scale();
        for (b, h, i) in map.rows() {
            let g = s.kv_head(h);
            let (q_len, k_len) = (map.q_len(b), map.k_len(b));
            let mut keys = map.visible(b, i);
            if self.flaw == GradFlaw::TopLeftCausal && p.is_causal() {
                keys = 0..(i + 1).min(k_len);
            }
            if self.flaw == GradFlaw::DropsLastTile && k_len > 64 && !k_len.is_multiple_of(64) {
                keys.end = keys.end.min(k_len - k_len % 64);
                keys.start = keys.start.min(keys.end);
            }
            let (qo, oo) = (map.q_offset(b, h, i), map.o_offset(b, h, i));
            let lse = inputs.lse[map.lse_index(b, h, i)];
            let delta: f32 = if self.flaw == GradFlaw::WrongDTerm {
                0.0
            } else {
                (0..d).map(|x| d_o[oo + x] * o[oo + x]).sum()
            };
            let keeps_kv = self.flaw != GradFlaw::MissingGqaSum || h % group == group - 1;
            for j in keys {
                let (ko, vo) = (map.k_offset(b, g, j), map.v_offset(b, g, j));
                let x = scale * (0..d).map(|e| q[qo + e] * k[ko + e]).sum::<f32>();
                let (capped, dcap) = match p.params.softcap {
                    Some(cap) => {
                        let t = (x / cap).tanh();
                        (cap * t, 1.0 - t * t)
                    }
                    None => (x, 1.0),
                };
                let bias = map.alibi_slope(b, h).map_or(0.0, |m| alibi_bias(m, i, j, q_len, k_len) as f32);
                let prob = (capped + bias - lse).exp();
                let dp: f32 = (0..d).map(|e| d_o[oo + e] * v[vo + e]).sum();
                let ds = prob * (dp - delta) * dcap;
                for e in 0..d {
                    dq[qo + e] += scale * ds * k[ko + e];
                    if keeps_kv {
                        dk[ko + e] += scale * ds * q[qo + e];
                        dv[vo + e] += prob * d_o[oo + e];
                    }
                }
            }
        }
        for (b, h, i) in map.rows() {
            let off = map.q_offset(b, h, i);
            grads.dq.store_f32(off, &dq[off..off + d]);
        }
        for b in 0..s.batch {
            for g in 0..s.heads_kv {
                for j in 0..map.k_len(b) {
                    let (ko, vo) = (map.k_offset(b, g, j), map.v_offset(b, g, j));
                    grads.dk.store_f32(ko, &dk[ko..ko + d]);
                    grads.dv.store_f32(vo, &dv[vo..vo + d]);
                }
            }
        }
        Ok(())
    }
}

fn widen(data: attn_core::Data<'_>) -> Vec<f32> {
    (0..data.len()).map(|i| data.get_f32(i)).collect()
}

impl Attention for PlantedGrad {
    fn name(&self) -> &str {
        &self.name
    }

    fn availability(&self) -> Availability {
        Availability::Available {
            device: "host CPU (deliberately broken backward)".into(),
            kind: DeviceKind::Cpu,
        }
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        Err(Error::Unsupported {
            backend: self.name.clone(),
            what: format!("{problem}: a backward pass only"),
        })
    }

    fn prepare<'a>(&'a self, plan: &Plan, _inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        self.plan(&plan.problem).map(|_| unreachable!("plan always refuses"))
    }

    fn plan_backward(&self, problem: &Problem, _options: BackwardOptions) -> Result<Plan> {
        problem.validate_backward()?;
        Ok(Plan {
            backend: self.name.clone(),
            kernel: format!("naive f32 backward with {:?}", self.flaw),
            problem: *problem,
            tiles: Tiles { block_m: 1, block_n: problem.shape.seq_k, stages: 1 },
            execution: Execution::Cpu { threads: 1, tasks: 1, isa: "scalar".into() },
            notes: vec![],
            payload: Default::default(),
        })
    }

    fn run_backward(&self, plan: &Plan, inputs: GradInputs<'_>, grads: Gradients<'_>) -> Result<()> {
        self.compute(&plan.problem, &inputs, grads)
    }
}
