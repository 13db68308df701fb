//! One task: a block of query rows of one (batch, head), against every key tile it can see.
//!
//! Written once, generic over the element type and the micro-kernel; `mod.rs` compiles it per
//! instruction set. Keys and values arrive already widened and packed ([`super::pack`]); scores
//! are kept in natural-log units so that [`RowStats`] (the shared online-softmax rule of
//! attn-core) applies unchanged.

use super::exp::{exp, exp_sub_sum, max};
use super::gemm::{Accumulate, Kernel, gemm};
use super::{CpuElement, Ctx, Pass, Task};
use attn_core::softmax::RowStats;
use std::cell::RefCell;

/// Per-thread buffers for one task (`m` = block_m, `n` = block_n, `d` = head_dim, `dp` = head_dim
/// rounded up to the micro-kernel's width).
pub(crate) struct Scratch {
    dims: (usize, usize, usize, usize),
    q: Vec<f32>, // m × d: scaled queries
    s: Vec<f32>, // m × n: scores, then probabilities
    o: Vec<f32>, // m × dp: unnormalised output
    stats: Vec<RowStats>,
    factors: Vec<f32>,
}

impl Scratch {
    fn new(dims @ (m, n, d, dp): (usize, usize, usize, usize)) -> Self {
        Scratch {
            dims,
            q: vec![0.0; m * d],
            s: vec![0.0; m * n],
            o: vec![0.0; m * dp],
            stats: vec![RowStats::EMPTY; m],
            factors: vec![0.0; m],
        }
    }
}

thread_local! {
    /// Kept across calls: fresh buffers per task would cost an allocation and page faults.
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's scratch, sized for `dims`.
#[inline(always)]
pub(crate) fn with_scratch<R>(dims: (usize, usize, usize, usize), f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|s| s.dims != dims) {
            *slot = Some(Scratch::new(dims));
        }
        f(slot.as_mut().expect("just set"))
    })
}

/// Computes the output rows (and LSE) of `task`.
#[inline(always)]
pub(crate) fn run_task<T: CpuElement, K: Kernel>(
    ctx: &Ctx<'_, T>,
    pass: &Pass<'_>,
    task: Task,
    sc: &mut Scratch,
) {
    let p = ctx.problem;
    let s = p.shape;
    let (d, dp, bm, bn) = (s.head_dim, ctx.dp, ctx.block_m, ctx.block_n);
    let map = &ctx.map;
    let (b, h) = (task.b, task.h);
    let (q_len, k_len) = (map.q_len(b), map.k_len(b));
    let i0 = task.q_block * bm;
    if i0 >= q_len {
        return; // a block past a shorter sequence's queries
    }
    let rows = bm.min(q_len - i0);
    let m = rows.div_ceil(K::MR) * K::MR;
    // Each row's keys, a range whose ends grow with the row (every mask is bottom-right
    // aligned, on the sequence's own lengths); the padding rows past `rows` see none.
    let visible = |r: usize| if r < rows { map.visible(b, i0 + r) } else { 0..0 };
    let (kt_all, v_all) = pass.packed(b, s.kv_head(h));
    // ALiBi: each score less `slope · |diagonal - j|`, the row's diagonal at key
    // `i + k_len - q_len` (attn_core::sequences::alibi_bias).
    let slope = map.alibi_slope(b, h);
    let diagonal = |r: usize| (i0 + r) as i64 + k_len as i64 - q_len as i64;

    // Queries, widened and pre-scaled once for all key tiles. Rows rows..m only pad the last
    // micro-kernel block: their results are never written out.
    let scale = p.scale();
    // The soft-cap acts on the scaled scores (the queries carry the scale).
    let softcap = p.params.softcap;
    for r in 0..rows {
        let dst = &mut sc.q[r * d..(r + 1) * d];
        T::widen(&ctx.q[map.q_offset(b, h, i0 + r)..][..d], dst);
        dst.iter_mut().for_each(|x| *x *= scale);
    }

    sc.o[..m * dp].fill(0.0);
    sc.stats[..m].fill(RowStats::EMPTY);
    // The block's keys: from its first row's first to its last row's last, whole tiles.
    let (kv_start, kv_end) = (visible(0).start / bn * bn, visible(rows - 1).end);
    for j0 in (kv_start..kv_end).step_by(bn) {
        let t = j0 / bn;
        let cols = bn.min(kv_end - j0);
        let kt = &kt_all[t * d * bn..(t + 1) * d * bn];
        // `V` rows j0..j0 + cols: packed (bn rows, zero past seq_k) or in place (only `cols`).
        let (v, ldv, v_rows) = match ctx.v_direct {
            Some(v) => (&v[map.v_offset(b, s.kv_head(h), j0)..], p.strides.v.seq, cols),
            None => (&v_all[t * bn * dp..(t + 1) * bn * dp], dp, bn),
        };

        gemm::<K>(m, bn, d, &sc.q, d, kt, bn, &mut sc.s, bn, Accumulate::Overwrite);

        // In two passes over the rows, so that each pass's rows are independent of each other
        // and the core overlaps one row's reductions (dependent chains) with the next row's.
        for r in 0..m {
            let row = &mut sc.s[r * bn..(r + 1) * bn];
            let keys = visible(r);
            let hi = keys.end.saturating_sub(j0).min(cols);
            let lo = keys.start.saturating_sub(j0).min(hi);
            row[..lo].fill(f32::NEG_INFINITY);
            row[hi..].fill(f32::NEG_INFINITY);
            if let Some(cap) = softcap {
                row[lo..hi].iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
            }
            if let Some(slope) = slope.filter(|_| r < rows) {
                let first = j0 as i64 + lo as i64 - diagonal(r);
                for (c, x) in row[lo..hi].iter_mut().enumerate() {
                    *x -= slope * (first + c as i64).unsigned_abs() as f32;
                }
            }
            sc.factors[r] = sc.stats[r].rescale_to_with(max(&row[lo..hi]), exp::<K::Madd>);
        }
        for (row, stats) in sc.s.chunks_exact_mut(bn).zip(&mut sc.stats[..m]) {
            stats.sum += exp_sub_sum::<K::Madd>(row, stats.exp_offset());
        }

        gemm::<K>(m, dp, v_rows, &sc.s, bn, v, ldv, &mut sc.o, dp, Accumulate::ScaleRows(&sc.factors));
    }

    for r in 0..rows {
        let inv = sc.stats[r].inv_sum();
        let o = &mut sc.o[r * dp..r * dp + d];
        o.iter_mut().for_each(|x| *x *= inv);
        // SAFETY: (b, h, i0 + r) is this task's own row; rows of distinct tasks are disjoint
        // because the output strides were checked non-overlapping (Problem::validate).
        let dst = unsafe { ctx.out.slice(map.o_offset(b, h, i0 + r), d) };
        T::narrow(o, dst);
        if let Some(lse) = &ctx.lse {
            // SAFETY: as above; each row has its own LSE slot.
            unsafe { lse.slice(map.lse_index(b, h, i0 + r), 1)[0] = sc.stats[r].lse() };
        }
    }
}
