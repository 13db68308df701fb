//! Keys and values, widened to f32 and laid out for the micro-kernel once per (batch, kv head),
//! instead of once per query block.
//!
//! Per head and key tile `t`: `Kᵀ` as `head_dim × block_n` (so `S = Q·Kᵀ` reads `B` contiguous
//! along keys), `V` as `block_n × dp` (padded to the kernel's width). Keys past a sequence's keys are zero,
//! so partial tiles need no special case in the products (the mask removes their scores).

use super::CpuElement;
use attn_core::{Problem, SeqMap};
use rayon::prelude::*;

/// Sizes of the packed form of one (batch, kv head).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackDims {
    pub tiles: usize,
    pub kt_per_head: usize,
    pub v_per_head: usize,
}

impl PackDims {
    /// `v_direct`: `V` is read in place, so only `Kᵀ` is packed.
    pub fn new(problem: &Problem, block_n: usize, dp: usize, v_direct: bool) -> Self {
        let tiles = problem.shape.seq_k.div_ceil(block_n);
        PackDims {
            tiles,
            kt_per_head: tiles * problem.shape.head_dim * block_n,
            v_per_head: if v_direct { 0 } else { tiles * block_n * dp },
        }
    }
}

/// Packs the kv heads `pairs` (numbered `b · heads_kv + g`) into `kt_out` and, unless `dims`
/// says `V` is read in place, `v_out`; in parallel over (head, tile).
pub(crate) fn pack<T: CpuElement>(
    map: &SeqMap<'_>,
    k: &[T],
    v: &[T],
    pairs: std::ops::Range<usize>,
    (block_n, dp, dims): (usize, usize, PackDims),
    kt_out: &mut [f32],
    v_out: &mut [f32],
) {
    let s = map.problem().shape;
    let d = s.head_dim;
    let n = pairs.len();
    // One (head, tile): `rows` holds the tile's keys, widened, before they are transposed.
    let tile = |rows: &mut Vec<f32>, i: usize, kt: &mut [f32], vt: Option<&mut [f32]>| {
        let (pair, t) = (pairs.start + i / dims.tiles, i % dims.tiles);
        let (b, g) = (pair / s.heads_kv, pair % s.heads_kv);
        let j0 = t * block_n;
        // Keys past the sequence's own (a shorter sequence, a partly filled cache) pack as zeros.
        let cols = block_n.min(map.k_len(b).saturating_sub(j0));
        for c in 0..cols {
            T::widen(&k[map.k_offset(b, g, j0 + c)..][..d], &mut rows[c * d..(c + 1) * d]);
        }
        // Transposed with contiguous writes: one output row (one feature of every key) at a
        // time, reading the widened rows with stride `d` (a strided write per element was about
        // three times slower).
        for (kk, dst) in kt.chunks_exact_mut(block_n).enumerate() {
            for (c, x) in dst[..cols].iter_mut().enumerate() {
                *x = rows[c * d + kk];
            }
            dst[cols..].fill(0.0);
        }
        if let Some(vt) = vt {
            for c in 0..cols {
                let vrow = &mut vt[c * dp..(c + 1) * dp];
                T::widen(&v[map.v_offset(b, g, j0 + c)..][..d], &mut vrow[..d]);
                vrow[d..].fill(0.0);
            }
            vt[cols * dp..].fill(0.0);
        }
    };
    let init = || vec![0.0f32; block_n * d];
    let kt_tiles = kt_out[..n * dims.kt_per_head].par_chunks_mut(d * block_n).enumerate();
    if dims.v_per_head == 0 {
        kt_tiles.for_each_init(init, |rows, (i, kt)| tile(rows, i, kt, None));
    } else {
        let v_tiles = v_out[..n * dims.v_per_head].par_chunks_mut(block_n * dp);
        kt_tiles.zip(v_tiles).for_each_init(init, |rows, ((i, kt), vt)| tile(rows, i, kt, Some(vt)));
    }
}
