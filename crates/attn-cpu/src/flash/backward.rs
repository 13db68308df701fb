//! cpu-flash's backward pass: FlashAttention-2's, a tile at a time, never an S×S matrix.
//!
//! `P` is recomputed from the forward's log-sum-exp. A pre-pass forms `D[i] = dO[i] · O[i]` (the
//! forward's rounded output, as every FlashAttention backward reads it). Then two passes, each
//! parallel with rayon and each writing only its own rows, so no sum needs a lock or an atomic
//! and every result is the same bits whatever the thread count (the mode is deterministic
//! always):
//!
//! - **dK, dV**: a task per (sequence, kv head, block of [`BN`] keys) holds its dK and dV in f32
//!   and walks every query head of the group and every query block that sees its keys:
//!   `S = Q·Kᵀ`, `dP = dO·Vᵀ`, `P` and `dS` elementwise, `dV += Pᵀ·dO`, `dK += dSᵀ·Q`.
//! - **dQ**: a task per (sequence, query head, block of [`BM`] rows) walks the key blocks its rows
//!   see, recomputes `S`, `dP`, `P` and `dS`, and adds `dQ += dS·K`.
//!
//! The second pass repeats two of the five products (7 in all against FlashAttention-2's 5 with
//! atomics); on a CPU that is cheaper than serialising dQ's updates. Products run on the forward's
//! register-blocked micro-kernels ([`super::gemm`]), compiled per instruction set.

use super::gemm::{self, Accumulate, Kernel};
use super::{CpuElement, Isa, RowWriter};
use attn_core::sequences::alibi_bias;
use attn_core::{GradInputs, Gradients, Problem, SeqMap};
use rayon::prelude::*;

/// Query rows per block (a multiple of every kernel's `MR`).
pub(crate) const BM: usize = 64;
/// Keys per block (a multiple of every kernel's `NR`).
pub(crate) const BN: usize = 64;

/// What every task of one backward call shares.
struct Ctx<'a, T> {
    map: SeqMap<'a>,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    d_o: &'a [T],
    lse: &'a [f32],
    /// `D[i] = dO[i] · O[i]`, at the LSE's index of row `i`.
    delta: Vec<f32>,
    dq: RowWriter<T>,
    dk: RowWriter<T>,
    dv: RowWriter<T>,
    /// `head_dim` padded to the kernel's width.
    dp: usize,
}

/// Runs the backward pass of `problem` with the micro-kernels of `isa`. Buffers were checked by
/// the caller ([`Problem::check_backward`]).
pub(crate) fn run<'a, T: CpuElement>(
    problem: &'a Problem,
    isa: Isa,
    inputs: &GradInputs<'a>,
    grads: Gradients<'_>,
) {
    let map = problem.seq_map(inputs.inputs.extras).expect("extras checked by check_backward");
    fn typed<'a, T: CpuElement>(x: attn_core::Data<'a>) -> &'a [T] {
        T::slice(x).expect("dtypes checked by check_backward")
    }
    let (q, k, v, o, d_o) = (
        typed::<T>(inputs.inputs.q),
        typed::<T>(inputs.inputs.k),
        typed::<T>(inputs.inputs.v),
        typed::<T>(inputs.o),
        typed::<T>(inputs.d_o),
    );
    let d = problem.shape.head_dim;
    let rows: Vec<(usize, usize, usize)> = map.rows().collect();
    let deltas: Vec<(usize, f32)> = rows
        .par_iter()
        .map(|&(b, h, i)| {
            let off = map.o_offset(b, h, i);
            let (mut x, mut y) = (vec![0.0f32; d], vec![0.0f32; d]);
            T::widen(&o[off..off + d], &mut x);
            T::widen(&d_o[off..off + d], &mut y);
            (map.lse_index(b, h, i), x.iter().zip(&y).map(|(a, c)| a * c).sum())
        })
        .collect();
    let mut delta = vec![0.0f32; problem.lse_len()];
    for (at, x) in deltas {
        delta[at] = x;
    }
    let writer = |g: attn_core::DataMut<'_>| RowWriter::new(T::slice_mut(g).expect("dtypes checked"));
    let ctx = Ctx {
        map,
        q,
        k,
        v,
        d_o,
        lse: inputs.lse,
        delta,
        dq: writer(grads.dq),
        dk: writer(grads.dk),
        dv: writer(grads.dv),
        dp: d.div_ceil(isa.nr()) * isa.nr(),
    };
    let s = problem.shape;
    let kv_tasks: Vec<(usize, usize, usize)> = (0..s.batch)
        .flat_map(|b| {
            (0..s.heads_kv).flat_map(move |g| (0..ctx.map.k_len(b).div_ceil(BN)).map(move |n| (b, g, n)))
        })
        .collect();
    kv_tasks.par_iter().for_each(|&task| dispatch(isa, &ctx, Task::Keys(task)));
    let q_tasks: Vec<(usize, usize, usize)> = (0..s.batch)
        .flat_map(|b| {
            (0..s.heads_q).flat_map(move |h| (0..ctx.map.q_len(b).div_ceil(BM)).map(move |m| (b, h, m)))
        })
        .collect();
    q_tasks.par_iter().for_each(|&task| dispatch(isa, &ctx, Task::Queries(task)));
}

/// Tasks of [`run`]'s two passes.
#[derive(Clone, Copy)]
enum Task {
    /// dK and dV of (sequence, kv head, key block).
    Keys((usize, usize, usize)),
    /// dQ of (sequence, query head, query block).
    Queries((usize, usize, usize)),
}

fn dispatch<T: CpuElement>(isa: Isa, ctx: &Ctx<'_, T>, task: Task) {
    match isa {
        // SAFETY: `isa` came from Isa::supported, which checked the CPU has these features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { task_avx512(ctx, task) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { task_avx2(ctx, task) },
        _ => run_task::<T, gemm::Portable>(ctx, task),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
fn task_avx512<T: CpuElement>(ctx: &Ctx<'_, T>, task: Task) {
    run_task::<T, gemm::Avx512>(ctx, task)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn task_avx2<T: CpuElement>(ctx: &Ctx<'_, T>, task: Task) {
    run_task::<T, gemm::Avx2>(ctx, task)
}

#[inline(always)]
fn run_task<T: CpuElement, K: Kernel>(ctx: &Ctx<'_, T>, task: Task) {
    match task {
        Task::Keys(t) => keys_task::<T, K>(ctx, t),
        Task::Queries(t) => queries_task::<T, K>(ctx, t),
    }
}

/// One block's operands and products, `dp` columns wide (zero past `head_dim` and past the
/// block's last row).
struct Tiles {
    q: Vec<f32>,
    d_o: Vec<f32>,
    k: Vec<f32>,
    kt: Vec<f32>,
    v: Vec<f32>,
    vt: Vec<f32>,
    /// `S`, then `P`.
    p: Vec<f32>,
    /// `dP`, then `dS` (times the soft-cap's derivative).
    ds: Vec<f32>,
    /// Transposes of `P` and `dS` for the key-side products.
    t: Vec<f32>,
    ones: Vec<f32>,
}

impl Tiles {
    fn new(dp: usize) -> Self {
        let z = |n: usize| vec![0.0f32; n];
        Tiles {
            q: z(BM * dp),
            d_o: z(BM * dp),
            k: z(BN * dp),
            kt: z(dp * BN),
            v: z(BN * dp),
            vt: z(dp * BN),
            p: z(BM * BN),
            ds: z(BM * BN),
            t: z(BN * BM),
            ones: vec![1.0; BM.max(BN)],
        }
    }
}

/// Widens rows into a `rows × dp` tile: row `r` from element `offset(r)`, zero where `None`.
fn load<T: CpuElement>(
    src: &[T],
    d: usize,
    dp: usize,
    dst: &mut [f32],
    offset: impl Fn(usize) -> Option<usize>,
) {
    for (r, row) in dst.chunks_mut(dp).enumerate() {
        match offset(r) {
            Some(off) => {
                T::widen(&src[off..off + d], &mut row[..d]);
                row[d..].fill(0.0);
            }
            None => row.fill(0.0),
        }
    }
}

/// `dst (cols × rows) = srcᵀ` for a row-major `rows × cols` `src`.
fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    for r in 0..rows {
        for c in 0..cols {
            dst[c * rows + r] = src[r * cols + c];
        }
    }
}

impl<T: CpuElement> Ctx<'_, T> {
    fn d(&self) -> usize {
        self.map.problem().shape.head_dim
    }

    /// Loads K (and Kᵀ, Vᵀ) of keys `j0..j0 + BN` of kv head `g` in sequence `b`.
    fn load_keys(&self, tl: &mut Tiles, (b, g, j0): (usize, usize, usize)) {
        let (d, dp, k_len) = (self.d(), self.dp, self.map.k_len(b));
        let live = |r: usize| j0 + r < k_len;
        load(self.k, d, dp, &mut tl.k, |r| live(r).then(|| self.map.k_offset(b, g, j0 + r)));
        transpose(&tl.k, BN, dp, &mut tl.kt);
        load(self.v, d, dp, &mut tl.v, |r| live(r).then(|| self.map.v_offset(b, g, j0 + r)));
        transpose(&tl.v, BN, dp, &mut tl.vt);
    }

    /// Loads Q and dO of rows `i0..i0 + BM` of query head `h` in sequence `b`.
    fn load_queries(&self, tl: &mut Tiles, (b, h, i0): (usize, usize, usize)) {
        let (d, dp, q_len) = (self.d(), self.dp, self.map.q_len(b));
        let live = |r: usize| i0 + r < q_len;
        load(self.q, d, dp, &mut tl.q, |r| live(r).then(|| self.map.q_offset(b, h, i0 + r)));
        load(self.d_o, d, dp, &mut tl.d_o, |r| live(r).then(|| self.map.o_offset(b, h, i0 + r)));
    }

    /// `S = Q·Kᵀ` and `dP = dO·Vᵀ`, then `P` and `dS` in their place, for rows `i0..` of head
    /// `h` against keys `j0..` (tiles loaded).
    fn scores<K: Kernel>(&self, tl: &mut Tiles, (b, h, i0, j0): (usize, usize, usize, usize)) {
        let dp = self.dp;
        gemm::gemm::<K>(BM, BN, dp, &tl.q, dp, &tl.kt, BN, &mut tl.p, BN, Accumulate::Overwrite);
        gemm::gemm::<K>(BM, BN, dp, &tl.d_o, dp, &tl.vt, BN, &mut tl.ds, BN, Accumulate::Overwrite);
        let p = self.map.problem();
        let scale = p.scale();
        let softcap = p.params.softcap;
        let slope = self.map.alibi_slope(b, h);
        let (q_len, k_len) = (self.map.q_len(b), self.map.k_len(b));
        for r in 0..BM {
            let i = i0 + r;
            let (pr, dsr) = (&mut tl.p[r * BN..][..BN], &mut tl.ds[r * BN..][..BN]);
            let keys = if i < q_len { self.map.visible(b, i) } else { 0..0 };
            let at = if i < q_len { self.map.lse_index(b, h, i) } else { 0 };
            let (lse, delta) = (self.lse[at], self.delta[at]);
            for c in 0..BN {
                let j = j0 + c;
                if !keys.contains(&j) {
                    pr[c] = 0.0;
                    dsr[c] = 0.0;
                    continue;
                }
                let x = scale * pr[c];
                let (capped, slope_of_cap) = match softcap {
                    Some(cap) => {
                        let t = (x / cap).tanh();
                        (cap * t, 1.0 - t * t)
                    }
                    None => (x, 1.0),
                };
                let s = capped + slope.map_or(0.0, |m| alibi_bias(m, i, j, q_len, k_len) as f32);
                let prob = (s - lse).exp();
                pr[c] = prob;
                dsr[c] = prob * (dsr[c] - delta) * slope_of_cap;
            }
        }
    }

    /// Whether rows `i0..i0 + BM` of sequence `b` see any of keys `j0..j0 + BN` (visible ranges
    /// move right with the row, so the first and last rows bound them).
    fn meets(&self, b: usize, i0: usize, j0: usize) -> bool {
        let q_len = self.map.q_len(b);
        if i0 >= q_len {
            return false;
        }
        let (first, last) = (self.map.visible(b, i0), self.map.visible(b, (i0 + BM).min(q_len) - 1));
        first.start < j0 + BN && last.end > j0
    }
}

/// dK and dV of keys `n·BN..` of kv head `g` in sequence `b`.
fn keys_task<T: CpuElement, K: Kernel>(ctx: &Ctx<'_, T>, (b, g, n): (usize, usize, usize)) {
    let s = ctx.map.problem().shape;
    let (d, dp, j0) = (s.head_dim, ctx.dp, n * BN);
    let mut tl = Tiles::new(dp);
    let (mut dk, mut dv) = (vec![0.0f32; BN * dp], vec![0.0f32; BN * dp]);
    ctx.load_keys(&mut tl, (b, g, j0));
    let group = s.group_size();
    for h in g * group..(g + 1) * group {
        for i0 in (0..ctx.map.q_len(b)).step_by(BM).filter(|&i0| ctx.meets(b, i0, j0)) {
            ctx.load_queries(&mut tl, (b, h, i0));
            ctx.scores::<K>(&mut tl, (b, h, i0, j0));
            let ones = Accumulate::ScaleRows(&tl.ones);
            transpose(&tl.p, BM, BN, &mut tl.t);
            gemm::gemm::<K>(BN, dp, BM, &tl.t, BM, &tl.d_o, dp, &mut dv, dp, ones);
            transpose(&tl.ds, BM, BN, &mut tl.t);
            gemm::gemm::<K>(BN, dp, BM, &tl.t, BM, &tl.q, dp, &mut dk, dp, ones);
        }
    }
    let scale = ctx.map.problem().scale();
    let mut out = vec![T::from_f32(0.0); d];
    for r in 0..BN.min(ctx.map.k_len(b) - j0) {
        let j = j0 + r;
        let dk_row: Vec<f32> = dk[r * dp..][..d].iter().map(|x| x * scale).collect();
        T::narrow(&dk_row, &mut out);
        // SAFETY: key row (b, g, j) belongs to this task alone (validate_backward: dk's
        // strides do not overlap).
        unsafe { ctx.dk.slice(ctx.map.k_offset(b, g, j), d) }.copy_from_slice(&out);
        T::narrow(&dv[r * dp..][..d], &mut out);
        // SAFETY: as above, for dv.
        unsafe { ctx.dv.slice(ctx.map.v_offset(b, g, j), d) }.copy_from_slice(&out);
    }
}

/// dQ of rows `m·BM..` of query head `h` in sequence `b`.
fn queries_task<T: CpuElement, K: Kernel>(ctx: &Ctx<'_, T>, (b, h, m): (usize, usize, usize)) {
    let s = ctx.map.problem().shape;
    let (d, dp, i0) = (s.head_dim, ctx.dp, m * BM);
    let g = s.kv_head(h);
    let mut tl = Tiles::new(dp);
    let mut dq = vec![0.0f32; BM * dp];
    ctx.load_queries(&mut tl, (b, h, i0));
    let k_len = ctx.map.k_len(b);
    for j0 in (0..k_len).step_by(BN).filter(|&j0| ctx.meets(b, i0, j0)) {
        ctx.load_keys(&mut tl, (b, g, j0));
        ctx.scores::<K>(&mut tl, (b, h, i0, j0));
        gemm::gemm::<K>(BM, dp, BN, &tl.ds, BN, &tl.k, dp, &mut dq, dp, Accumulate::ScaleRows(&tl.ones));
    }
    let scale = ctx.map.problem().scale();
    let mut out = vec![T::from_f32(0.0); d];
    for r in 0..BM.min(ctx.map.q_len(b) - i0) {
        let row: Vec<f32> = dq[r * dp..][..d].iter().map(|x| x * scale).collect();
        T::narrow(&row, &mut out);
        // SAFETY: query row (b, h, i) belongs to this task alone (dq's strides do not overlap).
        unsafe { ctx.dq.slice(ctx.map.q_offset(b, h, i0 + r), d) }.copy_from_slice(&out);
    }
}
