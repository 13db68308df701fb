//! Keys and values, widened to f32 and laid out for the micro-kernel once per (batch, kv head),
//! instead of once per query block.
//!
//! Per head and key tile `t`: `Kᵀ` as `head_dim × block_n` (so `S = Q·Kᵀ` reads `B` contiguous
//! along keys), `V` as `block_n × dp` (padded to the kernel's width). Keys past `seq_k` are zero,
//! so partial tiles need no special case in the products (the mask removes their scores).

use super::CpuElement;
use attn_core::Problem;
use rayon::prelude::*;

/// Sizes of the packed form of one (batch, kv head).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackDims {
    pub tiles: usize,
    pub kt_per_head: usize,
    pub v_per_head: usize,
}

impl PackDims {
    pub fn new(problem: &Problem, block_n: usize, dp: usize) -> Self {
        let tiles = problem.shape.seq_k.div_ceil(block_n);
        PackDims {
            tiles,
            kt_per_head: tiles * problem.shape.head_dim * block_n,
            v_per_head: tiles * block_n * dp,
        }
    }
}

/// Packs the kv heads `pairs` (numbered `b · heads_kv + g`) into `kt` and `v`, in parallel over
/// (head, tile).
pub(crate) fn pack<T: CpuElement>(
    problem: &Problem,
    k: &[T],
    v: &[T],
    pairs: std::ops::Range<usize>,
    block_n: usize,
    dp: usize,
    kt_out: &mut [f32],
    v_out: &mut [f32],
) {
    let s = problem.shape;
    let d = s.head_dim;
    let dims = PackDims::new(problem, block_n, dp);
    let n = pairs.len();
    kt_out[..n * dims.kt_per_head]
        .par_chunks_mut(d * block_n)
        .zip(v_out[..n * dims.v_per_head].par_chunks_mut(block_n * dp))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; d],
            |row, (i, (kt, vt))| {
                let (pair, t) = (pairs.start + i / dims.tiles, i % dims.tiles);
                let (b, g) = (pair / s.heads_kv, pair % s.heads_kv);
                let j0 = t * block_n;
                let cols = block_n.min(s.seq_k - j0);
                for c in 0..cols {
                    T::widen(&k[problem.strides.k.offset(b, g, j0 + c)..][..d], row);
                    for (kk, &x) in row.iter().enumerate() {
                        kt[kk * block_n + c] = x;
                    }
                    let vrow = &mut vt[c * dp..(c + 1) * dp];
                    T::widen(&v[problem.strides.v.offset(b, g, j0 + c)..][..d], &mut vrow[..d]);
                    vrow[d..].fill(0.0);
                }
                for kk in 0..d {
                    kt[kk * block_n + cols..(kk + 1) * block_n].fill(0.0);
                }
                vt[cols * dp..].fill(0.0);
            },
        );
}
