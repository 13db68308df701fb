//! Decode: a handful of query rows per (sequence, kv head) against many keys.
//!
//! The prefill path packs every (sequence, kv head)'s keys and values once per call, which pays
//! when many query blocks reuse them; with one to a few query rows per head the packing is most
//! of the work, and each query head's task reads the packed keys again. Here one task holds
//! *all* the query rows of a GQA group (every query head reading the kv head, every query row of
//! the sequence) against one range of key tiles, and widens each key and value tile straight from
//! the input as it goes: each K/V element is read once per call. When sequences × kv heads are
//! too few to keep every thread busy, a sequence's keys are split over tasks whose parts merge by
//! their log-sum-exp (flash-decoding, `attn_core::softmax::merge`).

use super::gemm::{Accumulate, Kernel, gemm};
use super::tile::{RowKeys, softmax_tile};
use super::{CpuElement, Ctx};
use attn_core::softmax::{RowStats, merge};
use attn_core::{Problem, Shape};
use std::cell::RefCell;
use std::ops::Range;

/// Query rows per (sequence, kv head), `seq_q · heads_q / heads_kv`, up to which the decode path
/// runs: one task holds them all, so they bound its scratch.
pub const MAX_ROWS: usize = 64;
/// Query rows per sequence up to which the decode path runs (FlashAttention's decode kernels
/// take up to 16 as well: speculative decoding's drafts).
pub const MAX_SEQ_Q: usize = 16;
/// Tasks per thread the key splits aim at: enough that uneven sequences still balance.
const TASKS_PER_THREAD: usize = 4;

/// Whether `problem` runs on the decode path.
pub(crate) fn applies(problem: &Problem) -> bool {
    let s = problem.shape;
    s.seq_q <= MAX_SEQ_Q && s.seq_q * s.group_size() <= MAX_ROWS
}

/// One task: the query rows of kv head `g` in sequence `b`, against key tiles `tiles`.
#[derive(Clone, Debug)]
pub(crate) struct Split {
    b: usize,
    g: usize,
    tiles: Range<usize>,
}

/// Parts each (sequence, kv head)'s keys are cut into: about [`TASKS_PER_THREAD`] tasks per thread
/// over the whole call.
fn parts(s: Shape, threads: usize) -> usize {
    (TASKS_PER_THREAD * threads).div_ceil(s.batch * s.heads_kv).max(1)
}

/// The most tasks a call of shape `s` makes (sequences with fewer key tiles make fewer).
pub(crate) fn tasks(s: Shape, block_n: usize, threads: usize) -> usize {
    s.batch * s.heads_kv * parts(s, threads).min(s.seq_k.div_ceil(block_n))
}

/// The tasks of a call: each (sequence, kv head)'s key tiles cut into [`parts`] even ranges (one
/// tile at least each).
pub(crate) fn splits<T>(ctx: &Ctx<'_, T>, threads: usize) -> Vec<Split> {
    let s = ctx.problem.shape;
    let parts = parts(s, threads);
    let mut out = Vec::new();
    for b in 0..s.batch {
        let tiles = ctx.map.k_len(b).div_ceil(ctx.block_n);
        let n = parts.clamp(1, tiles.max(1));
        for g in 0..s.heads_kv {
            out.extend((0..n).map(|i| Split { b, g, tiles: tiles * i / n..tiles * (i + 1) / n }));
        }
    }
    out
}

/// One task's result: each row's output (normalised over the task's keys, `d` per row) and LSE.
pub(crate) struct Part {
    o: Vec<f32>,
    lse: Vec<f32>,
}

/// Per-thread buffers (`m` rows, `n` keys per tile, `d` head dim, `dp` padded to the kernel's
/// width).
struct Scratch {
    dims: (usize, usize, usize, usize),
    q: Vec<f32>,    // m × d: scaled queries
    s: Vec<f32>,    // m × n: scores, then probabilities
    o: Vec<f32>,    // m × dp: unnormalised output
    kt: Vec<f32>,   // d × n: the key tile, transposed
    rows: Vec<f32>, // n × d: the key tile, widened, before the transpose
    vt: Vec<f32>,   // n × dp: the value tile, widened
    stats: Vec<RowStats>,
    factors: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

fn with_scratch<R>(
    dims @ (m, n, d, dp): (usize, usize, usize, usize),
    f: impl FnOnce(&mut Scratch) -> R,
) -> R {
    SCRATCH.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|s| s.dims != dims) {
            *slot = Some(Scratch {
                dims,
                q: vec![0.0; m * d],
                s: vec![0.0; m * n],
                o: vec![0.0; m * dp],
                kt: vec![0.0; d * n],
                rows: vec![0.0; n * d],
                vt: vec![0.0; n * dp],
                stats: vec![RowStats::EMPTY; m],
                factors: vec![0.0; m],
            });
        }
        f(slot.as_mut().expect("just set"))
    })
}

/// Runs one task: row `r` is query row `r % q_len` of query head `g · group + r / q_len`.
#[inline(always)]
pub(crate) fn run_split<T: CpuElement, K: Kernel>(ctx: &Ctx<'_, T>, split: &Split) -> Part {
    let p = ctx.problem;
    let s = p.shape;
    let map = &ctx.map;
    let (d, dp, bn) = (s.head_dim, ctx.dp, ctx.block_n);
    let Split { b, g, ref tiles } = *split;
    let group = s.group_size();
    let (q_len, k_len) = (map.q_len(b), map.k_len(b));
    let rows = group * q_len;
    let m = (MAX_ROWS.div_ceil(K::MR) * K::MR).max(K::MR);
    let head = |r: usize| (g * group + r / q_len.max(1), r % q_len.max(1));
    let scale = p.scale();
    with_scratch((m, bn, d, dp), |sc| {
        let mr = rows.div_ceil(K::MR) * K::MR;
        for r in 0..rows {
            let (h, i) = head(r);
            let dst = &mut sc.q[r * d..(r + 1) * d];
            T::widen(&ctx.q[map.q_offset(b, h, i)..][..d], dst);
            dst.iter_mut().for_each(|x| *x *= scale);
        }
        sc.q[rows * d..mr * d].fill(0.0);
        sc.o[..mr * dp].fill(0.0);
        sc.stats[..mr].fill(RowStats::EMPTY);
        let row_keys = |r: usize| match r < rows {
            true => {
                let (h, i) = head(r);
                let diagonal = i as i64 + k_len as i64 - q_len as i64;
                RowKeys { keys: map.visible(b, i), alibi: map.alibi_slope(b, h).map(|m| (m, diagonal)) }
            }
            false => RowKeys { keys: 0..0, alibi: None },
        };
        // A sequence without queries has nothing to compute.
        let tiles = if rows == 0 { 0..0 } else { tiles.clone() };
        for t in tiles {
            let j0 = t * bn;
            let cols = bn.min(k_len - j0);
            for c in 0..cols {
                T::widen(&ctx.k[map.k_offset(b, g, j0 + c)..][..d], &mut sc.rows[c * d..(c + 1) * d]);
                let vrow = &mut sc.vt[c * dp..(c + 1) * dp];
                T::widen(&ctx.v[map.v_offset(b, g, j0 + c)..][..d], &mut vrow[..d]);
                vrow[d..].fill(0.0);
            }
            sc.vt[cols * dp..].fill(0.0);
            // Transposed with contiguous writes, as the prefill path packs.
            for (kk, dst) in sc.kt.chunks_exact_mut(bn).enumerate() {
                for (c, x) in dst[..cols].iter_mut().enumerate() {
                    *x = sc.rows[c * d + kk];
                }
                dst[cols..].fill(0.0);
            }
            gemm::<K>(mr, bn, d, &sc.q, d, &sc.kt, bn, &mut sc.s, bn, Accumulate::Overwrite);
            let (stats, factors) = (&mut sc.stats[..mr], &mut sc.factors[..mr]);
            softmax_tile::<K>(
                &mut sc.s[..mr * bn],
                (j0, bn, cols),
                row_keys,
                p.params.softcap,
                stats,
                factors,
            );
            gemm::<K>(
                mr,
                dp,
                bn,
                &sc.s,
                bn,
                &sc.vt,
                dp,
                &mut sc.o,
                dp,
                Accumulate::ScaleRows(&sc.factors[..mr]),
            );
        }
        let mut part = Part { o: vec![0.0; rows * d], lse: vec![0.0; rows] };
        for r in 0..rows {
            let inv = sc.stats[r].inv_sum();
            part.o[r * d..(r + 1) * d].iter_mut().zip(&sc.o[r * dp..]).for_each(|(o, x)| *o = x * inv);
            part.lse[r] = sc.stats[r].lse();
        }
        part
    })
}

/// Merges the parts of each (sequence, kv head), in key order, and writes its rows.
pub(crate) fn write<T: CpuElement>(ctx: &Ctx<'_, T>, splits: &[Split], parts: Vec<Part>) {
    let s = ctx.problem.shape;
    let (map, d, group) = (&ctx.map, s.head_dim, s.group_size());
    let mut merged: Option<(usize, usize, Part)> = None;
    let mut buf = vec![0.0; d];
    let flush = |(b, g, acc): (usize, usize, Part)| {
        let q_len = map.q_len(b);
        for r in 0..group * q_len {
            let (h, i) = (g * group + r / q_len, r % q_len);
            // SAFETY: each (b, h, i) is written once, here, after every task has finished.
            let dst = unsafe { ctx.out.slice(map.o_offset(b, h, i), d) };
            T::narrow(&acc.o[r * d..(r + 1) * d], dst);
            if let Some(lse) = &ctx.lse {
                // SAFETY: as above.
                unsafe { lse.slice(map.lse_index(b, h, i), 1)[0] = acc.lse[r] };
            }
        }
    };
    for (split, part) in splits.iter().zip(parts) {
        merged = Some(match merged.take() {
            Some((b, g, mut acc)) if (b, g) == (split.b, split.g) => {
                for r in 0..acc.lse.len() {
                    let o = &mut acc.o[r * d..(r + 1) * d];
                    acc.lse[r] = merge(acc.lse[r], o, part.lse[r], &part.o[r * d..(r + 1) * d], &mut buf);
                    o.copy_from_slice(&buf);
                }
                (b, g, acc)
            }
            done => {
                if let Some(done) = done {
                    flush(done);
                }
                (split.b, split.g, part)
            }
        });
    }
    if let Some(done) = merged {
        flush(done);
    }
}
