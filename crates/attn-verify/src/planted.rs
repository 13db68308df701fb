//! Backends with one deliberate bug each: the test of the tester. Each must be caught by a
//! named case of the quick grid (`tests/suite.rs` checks which).
//!
//! They share a naive row-at-a-time f32 implementation that is correct without its flaw.

use attn_core::sequences::alibi_bias;
use attn_core::{
    Attention, Availability, DeviceKind, Element, Execution, HostPrepared, Inputs, KvRows, Outputs, Plan,
    Prepared, Problem, Result, Tiles,
};

/// One classic attention-kernel bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// `exp(s)` instead of `exp(s − max)`: overflows on large logits.
    NoMaxSubtraction,
    /// Query head `h` reads kv head `h % heads_kv` instead of `h / (heads_q / heads_kv)`.
    WrongKvHead,
    /// The causal diagonal aligned top-left (PyTorch's `is_causal`) instead of bottom-right.
    TopLeftCausal,
    /// Ignores the keys of a last, partial 64-key tile.
    DropsPartialTile,
    /// Never writes the last query row of each head.
    SkipsLastRow,
    /// Sees only the first 16,384 keys of a row, as a kernel whose loops a driver ends early
    /// (Mesa's software adapters' loop limit): finite output, an LSE too small.
    StopsAfterKeys,
    /// A sliding window one key short on the left: the farthest key back is dropped.
    WindowOffByOne,
    /// The soft-cap applied to the unscaled score, then scaled: `scale · cap · tanh(q·k / cap)`.
    SoftcapBeforeScale,
    /// ALiBi's distance taken from the top-left diagonal, `|i - j|`, ignoring `seq_k - seq_q`.
    AlibiTopLeft,
    /// Every sequence of a packed batch masked as if it had the longest lengths (`seq_q`,
    /// `seq_k`): the causal diagonal of shorter sequences lands in the wrong place.
    VarlenMaxLengths,
    /// The block table ignored: a sequence's pages read as if stored in order,
    /// `b · pages_per_seq + j / page_size`.
    PagesInOrder,
    /// A cache's slots past a sequence's key count (`seqused_k`) up to the end of its 64-key tile
    /// weighed in with probability 0, as a kernel that loads whole tiles does: 0 times the NaN of
    /// an unwritten slot is NaN.
    WeighsUnusedSlots,
}

impl Flaw {
    /// Every planted flaw.
    pub const ALL: [Flaw; 12] = [
        Flaw::NoMaxSubtraction,
        Flaw::WrongKvHead,
        Flaw::TopLeftCausal,
        Flaw::DropsPartialTile,
        Flaw::SkipsLastRow,
        Flaw::StopsAfterKeys,
        Flaw::WindowOffByOne,
        Flaw::SoftcapBeforeScale,
        Flaw::AlibiTopLeft,
        Flaw::VarlenMaxLengths,
        Flaw::PagesInOrder,
        Flaw::WeighsUnusedSlots,
    ];
}

/// A naive backend with `flaw`.
pub struct Planted {
    /// The bug.
    pub flaw: Flaw,
    name: String,
}

impl Planted {
    /// A backend with `flaw`.
    pub fn new(flaw: Flaw) -> Self {
        Planted { flaw, name: format!("planted-{flaw:?}") }
    }

    fn compute(&self, p: &Problem, inputs: &Inputs<'_>, mut outputs: Outputs<'_>) -> Result<()> {
        let s = p.shape;
        let d = s.head_dim;
        let map = p.seq_map(inputs.extras)?;
        let (q, k, v) = (widen(inputs.q), widen(inputs.k), widen(inputs.v));
        // Where key (or, with `value`, value) `j` of sequence `b` is, with the flaw that ignores
        // the block table.
        let k_place = |b: usize, g: usize, j: usize, value: bool| match p.batching.kv {
            KvRows::Paged { page_size, pages_per_seq, .. } if self.flaw == Flaw::PagesInOrder => {
                let strides = if value { p.strides.v } else { p.strides.k };
                strides.offset(b * pages_per_seq + j / page_size, g, j % page_size)
            }
            _ if value => map.v_offset(b, g, j),
            _ => map.k_offset(b, g, j),
        };
        let mut o = outputs.o.reborrow();
        for (b, h, i) in map.rows() {
            let g = if self.flaw == Flaw::WrongKvHead { h % s.heads_kv } else { s.kv_head(h) };
            let (q_len, k_len) = match self.flaw {
                Flaw::VarlenMaxLengths => (s.seq_q, s.seq_k),
                _ => (map.q_len(b), map.k_len(b)),
            };
            if self.flaw == Flaw::SkipsLastRow && i == q_len - 1 {
                continue;
            }
            let mut visible = p.params.mask.visible_range(i, q_len, k_len);
            visible.end = visible.end.min(map.k_len(b));
            visible.start = visible.start.min(visible.end);
            if self.flaw == Flaw::TopLeftCausal && p.is_causal() {
                visible = 0..(i + 1).min(k_len);
            }
            let n = visible.len();
            if self.flaw == Flaw::DropsPartialTile && !n.is_multiple_of(64) && n > 64 {
                visible.end -= n % 64;
            }
            if self.flaw == Flaw::StopsAfterKeys {
                visible.end = visible.end.min(visible.start + 16_384);
            }
            if self.flaw == Flaw::WindowOffByOne
                && matches!(p.params.mask, attn_core::Mask::Window { left: Some(_), .. })
                && !visible.is_empty()
                && visible.start > 0
            {
                visible.start += 1;
            }
            let slope = map.alibi_slope(b, h);
            let qo = map.q_offset(b, h, i);
            let scores: Vec<f32> = visible
                .clone()
                .map(|j| {
                    let ko = k_place(b, g, j, false);
                    let dot = (0..d).map(|x| q[qo + x] * k[ko + x]).sum::<f32>();
                    let score = match p.params.softcap {
                        Some(cap) if self.flaw == Flaw::SoftcapBeforeScale => {
                            p.scale() * cap * (dot / cap).tanh()
                        }
                        Some(cap) => cap * (p.scale() * dot / cap).tanh(),
                        None => p.scale() * dot,
                    };
                    let bias = match (slope, self.flaw) {
                        (Some(m), Flaw::AlibiTopLeft) => -m * (i as f32 - j as f32).abs(),
                        (Some(m), _) => alibi_bias(m, i, j, q_len, k_len) as f32,
                        (None, _) => 0.0,
                    };
                    score + bias
                })
                .collect();
            let max = if self.flaw == Flaw::NoMaxSubtraction {
                0.0
            } else {
                scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max)
            };
            let w: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f32 = w.iter().sum();
            let oo = map.o_offset(b, h, i);
            // The flaw's zero-weight slots: past the key count to its tile's end, in the cache.
            let unused = match self.flaw {
                Flaw::WeighsUnusedSlots if p.batching.keys_used && visible.end == k_len => {
                    k_len..k_len.next_multiple_of(64).min(s.seq_k)
                }
                _ => 0..0,
            };
            for x in 0..d {
                let acc: f32 =
                    visible.clone().zip(&w).map(|(j, w)| w * v[k_place(b, g, j, true) + x]).sum::<f32>()
                        + unused.clone().map(|j| 0.0 * v[k_place(b, g, j, true) + x]).sum::<f32>();
                let val = if sum > 0.0 { acc / sum } else { 0.0 };
                set(&mut o, oo + x, val);
            }
            if let Some(lse) = outputs.lse.as_deref_mut() {
                lse[map.lse_index(b, h, i)] = if sum > 0.0 { max + sum.ln() } else { f32::NEG_INFINITY };
            }
        }
        Ok(())
    }
}

fn widen(data: attn_core::Data<'_>) -> Vec<f32> {
    (0..data.len()).map(|i| data.get_f32(i)).collect()
}

fn set(o: &mut attn_core::DataMut<'_>, i: usize, x: f32) {
    match o {
        attn_core::DataMut::F32(s) => s[i] = x,
        attn_core::DataMut::F16(s) => s[i] = Element::from_f32(x),
        attn_core::DataMut::Bf16(s) => s[i] = Element::from_f32(x),
    }
}

impl Attention for Planted {
    fn name(&self) -> &str {
        &self.name
    }

    fn availability(&self) -> Availability {
        Availability::Available { device: "host CPU (deliberately broken)".into(), kind: DeviceKind::Cpu }
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        problem.validate()?;
        Ok(Plan {
            backend: self.name.clone(),
            kernel: format!("naive f32 with {:?}", self.flaw),
            problem: *problem,
            tiles: Tiles { block_m: 1, block_n: problem.shape.seq_k, stages: 1 },
            execution: Execution::Cpu { threads: 1, tasks: 1, isa: "scalar".into() },
            notes: vec![],
            payload: Default::default(),
        })
    }

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        plan.check_for(self.name(), &plan.problem)?;
        let compute = |plan: &Plan, inputs: &Inputs<'a>, outputs: Outputs<'_>| {
            self.compute(&plan.problem, inputs, outputs)
        };
        Ok(Box::new(HostPrepared::new(plan, inputs, compute)?))
    }
}
