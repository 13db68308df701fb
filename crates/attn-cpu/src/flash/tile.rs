//! One task: a block of query rows of one (batch, head), against every key tile it can see.
//!
//! Written once, generic over the element type and the micro-kernel shape; `mod.rs` compiles it
//! per instruction set. Scores are kept in natural-log units so that [`RowStats`] (the shared
//! online-softmax rule of attn-core) applies unchanged.

use super::exp::{exp_sub_sum, max};
use super::gemm::{Accumulate, Kernel, gemm, pack_panels};
use super::{CpuElement, Ctx, Task};
use attn_core::softmax::RowStats;

/// Per-thread buffers, sized once for a plan (`m` = block_m, `n` = block_n, `d` = head_dim,
/// `dp` = head_dim rounded up to the micro-kernel's width).
pub(crate) struct Scratch {
    q_rows: Vec<f32>,   // m × d, scaled queries, row-major
    q_panels: Vec<f32>, // m × d in panels
    kt: Vec<f32>,       // d × n: the key tile transposed
    v: Vec<f32>,        // n × dp: the value tile
    s: Vec<f32>,        // m × n: scores, then probabilities
    p_panels: Vec<f32>, // m × n in panels
    o: Vec<f32>,        // m × dp: unnormalised output
    stats: Vec<RowStats>,
    factors: Vec<f32>,
    row: Vec<f32>, // d: one widened input row
}

impl Scratch {
    pub(crate) fn new(m: usize, n: usize, d: usize, dp: usize) -> Self {
        Scratch {
            q_rows: vec![0.0; m * d],
            q_panels: vec![0.0; m * d],
            kt: vec![0.0; d * n],
            v: vec![0.0; n * dp],
            s: vec![0.0; m * n],
            p_panels: vec![0.0; m * n],
            o: vec![0.0; m * dp],
            stats: vec![RowStats::EMPTY; m],
            factors: vec![0.0; m],
            row: vec![0.0; d],
        }
    }
}

/// Computes the output rows (and LSE) of `task`.
#[inline(always)]
pub(crate) fn run_task<T: CpuElement, K: Kernel>(ctx: &Ctx<'_, T>, task: Task, sc: &mut Scratch) {
    let p = ctx.problem;
    let s = p.shape;
    let (d, dp, bm, bn) = (s.head_dim, ctx.dp, ctx.block_m, ctx.block_n);
    let (b, h, g) = (task.b, task.h, s.kv_head(task.h));
    let i0 = task.q_block * bm;
    let rows = bm.min(s.seq_q - i0);
    let m = rows.div_ceil(K::MR) * K::MR;
    let mask = p.params.mask;
    let visible = |r: usize| if r < rows { mask.visible_keys(i0 + r, s.seq_q, s.seq_k) } else { 0 };

    // Queries, widened and pre-scaled once for all key tiles.
    let scale = p.scale();
    for r in 0..rows {
        let dst = &mut sc.q_rows[r * d..(r + 1) * d];
        T::widen(&ctx.q[p.strides.q.offset(b, h, i0 + r)..][..d], dst);
        dst.iter_mut().for_each(|x| *x *= scale);
    }
    pack_panels(K::MR, &sc.q_rows, d, rows, d, &mut sc.q_panels);

    sc.o[..m * dp].fill(0.0);
    sc.stats[..m].fill(RowStats::EMPTY);
    let kv_end = visible(rows - 1); // rows see key prefixes that grow with r
    for j0 in (0..kv_end).step_by(bn) {
        let cols = bn.min(kv_end - j0);
        load_kv_tile(ctx, sc, b, g, j0, cols);

        gemm::<K>(m, bn, d, &sc.q_panels, &sc.kt, bn, &mut sc.s, bn, Accumulate::Overwrite);

        for r in 0..m {
            let row = &mut sc.s[r * bn..(r + 1) * bn];
            let n_vis = visible(r).saturating_sub(j0).min(cols);
            row[n_vis..].fill(f32::NEG_INFINITY);
            let tile_max = max(&row[..n_vis]);
            sc.factors[r] = sc.stats[r].rescale_to(tile_max);
            sc.stats[r].sum += exp_sub_sum(row, sc.stats[r].exp_offset());
        }
        pack_panels(K::MR, &sc.s, bn, m, bn, &mut sc.p_panels);

        gemm::<K>(m, dp, bn, &sc.p_panels, &sc.v, dp, &mut sc.o, dp, Accumulate::ScaleRows(&sc.factors));
    }

    for r in 0..rows {
        let inv = sc.stats[r].inv_sum();
        let o = &mut sc.o[r * dp..r * dp + d];
        o.iter_mut().for_each(|x| *x *= inv);
        // SAFETY: (b, h, i0 + r) is this task's own row; rows of distinct tasks are disjoint
        // because the output strides were checked non-overlapping (Problem::validate).
        let dst = unsafe { ctx.out.slice(p.strides.o.offset(b, h, i0 + r), d) };
        T::narrow(o, dst);
        if let Some(lse) = &ctx.lse {
            // SAFETY: as above; the LSE is contiguous [batch, heads_q, seq_q].
            unsafe { lse.slice((b * s.heads_q + h) * s.seq_q + i0 + r, 1)[0] = sc.stats[r].lse() };
        }
    }
}

/// Widens keys `j0..j0+cols` into `kt` (transposed, d × n) and values into `v` (n × dp); the
/// columns/rows past `cols` are zeroed so the padded part of the tile contributes nothing.
#[inline(always)]
fn load_kv_tile<T: CpuElement>(
    ctx: &Ctx<'_, T>,
    sc: &mut Scratch,
    b: usize,
    g: usize,
    j0: usize,
    cols: usize,
) {
    let p = ctx.problem;
    let (d, dp, bn) = (p.shape.head_dim, ctx.dp, ctx.block_n);
    for c in 0..cols {
        T::widen(&ctx.k[p.strides.k.offset(b, g, j0 + c)..][..d], &mut sc.row);
        for (kk, &x) in sc.row.iter().enumerate() {
            sc.kt[kk * bn + c] = x;
        }
        T::widen(&ctx.v[p.strides.v.offset(b, g, j0 + c)..][..d], &mut sc.v[c * dp..c * dp + d]);
    }
    if cols < bn {
        for kk in 0..d {
            sc.kt[kk * bn + cols..(kk + 1) * bn].fill(0.0);
        }
        sc.v[cols * dp..].fill(0.0);
    }
}
