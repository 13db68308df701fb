//! The backward kernels' parameter block (one for all three), and the Hopper main pass's (its four
//! TMA tensor maps before it).

use crate::hopper::L2Promotion;
use crate::hopper::launch::tensor_map;
use crate::scores::ScoreParams;
use crate::tensors::{ExtraPointers, strides};
use attn_core::{Alibi, Error, KvRows, Mask, Problem, QueryRows, Result};
use cudarc::driver::DeviceRepr;
use cudarc::driver::sys::CUtensorMap;

/// Device addresses of one backward call's tensors and workspace.
#[derive(Clone, Copy, Debug, Default)]
pub struct BackwardPointers {
    /// q, k, v, o, dO (o's strides).
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub d_o: u64,
    /// The forward's LSE (natural log, f32).
    pub lse: u64,
    /// f32 workspace: D per row, the dQ accumulator (`[rows][kernel head dim]`), and the
    /// deterministic mode's counters (i32, 0 without it).
    pub delta: u64,
    pub dq_accum: u64,
    pub counters: u64,
    /// Gradients, each with its input's strides.
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
}

/// The kernels' only argument, passed by value (`__grid_constant__`). Must match `struct Params`
/// in `kernels/flash_bwd.cu` field for field; `layout_matches_the_kernel` checks the offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelParams {
    q: u64,
    k: u64,
    v: u64,
    o: u64,
    d_o: u64,
    lse: u64,
    delta: u64,
    dq_accum: u64,
    counters: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    q_strides: [i64; 3],
    k_strides: [i64; 3],
    v_strides: [i64; 3],
    o_strides: [i64; 3],
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    seqused_k: u64,
    alibi_slopes: u64,
    batch: i32,
    heads_q: i32,
    heads_kv: i32,
    seq_q: i32,
    seq_k: i32,
    q_total: i32,
    kv_total: i32,
    alibi_batch_stride: i32,
    window_left: i32,
    window_right: i32,
    scale: f32,
    softcap: f32,
    head_dim: i32,
    deterministic: i32,
    m_blocks: i32,
    dq_copies: i32,
    rotate_key_blocks: i32,
}

// SAFETY: plain old data of the layout the kernel declares (repr(C), no padding beyond C's).
unsafe impl DeviceRepr for KernelParams {}

impl KernelParams {
    /// The parameter block for `problem` over the buffers at `at` and the sequences' and ALiBi's
    /// arrays at `extras`.
    /// `dq_copies`: copies of the dQ accumulator the deterministic mode's key blocks take in turn
    /// (1 without it); `rotate_key_blocks`: the most key blocks a sequence may have for the Hopper
    /// main pass's walks over it to rotate ([`super::Walk::rotation_limit`]; 0: none).
    pub fn new(
        at: BackwardPointers,
        extras: ExtraPointers,
        problem: &Problem,
        deterministic: bool,
        dq_copies: usize,
        rotate_key_blocks: usize,
    ) -> Self {
        debug_assert!(!matches!(problem.batching.kv, KvRows::Paged { .. }), "refused by validate_backward");
        let s = problem.shape;
        let t = problem.strides;
        // Every mask as a window's bounds: an unbounded side as seq_k keys back or seq_q ahead,
        // which reach every key of every sequence from any row (and cannot overflow).
        let (window_left, window_right) = match problem.params.mask {
            Mask::None => (s.seq_k as i32, s.seq_q as i32),
            Mask::Causal => (s.seq_k as i32, 0),
            Mask::Window { .. } => {
                let w = ScoreParams::of(problem);
                (w.window_left, w.window_right)
            }
        };
        KernelParams {
            q: at.q,
            k: at.k,
            v: at.v,
            o: at.o,
            d_o: at.d_o,
            lse: at.lse,
            delta: at.delta,
            dq_accum: at.dq_accum,
            counters: at.counters,
            dq: at.dq,
            dk: at.dk,
            dv: at.dv,
            q_strides: strides(t.q),
            k_strides: strides(t.k),
            v_strides: strides(t.v),
            o_strides: strides(t.o),
            cu_seqlens_q: extras.cu_seqlens_q,
            cu_seqlens_k: extras.cu_seqlens_k,
            seqused_k: extras.seqused_k,
            alibi_slopes: extras.alibi_slopes,
            batch: s.batch as i32,
            heads_q: s.heads_q as i32,
            heads_kv: s.heads_kv as i32,
            seq_q: s.seq_q as i32,
            seq_k: s.seq_k as i32,
            q_total: match problem.batching.q {
                QueryRows::Packed { total } => total as i32,
                QueryRows::Dense => 0,
            },
            kv_total: match problem.batching.kv {
                KvRows::Packed { total } => total as i32,
                _ => 0,
            },
            alibi_batch_stride: match problem.params.alibi {
                Some(Alibi::PerBatchHead) => s.heads_q as i32,
                _ => 0,
            },
            window_left,
            window_right,
            scale: problem.scale(),
            softcap: problem.params.softcap.unwrap_or(0.0),
            head_dim: s.head_dim as i32,
            deterministic: i32::from(deterministic),
            m_blocks: s.seq_q.div_ceil(super::variant::BLOCK_M) as i32,
            dq_copies: dq_copies as i32,
            rotate_key_blocks: i32::try_from(rotate_key_blocks).unwrap_or(i32::MAX),
        }
    }
}

/// The Hopper main pass's only argument (`struct Sm90Params` in `kernels/flash_bwd_sm90.cu`): the
/// tensor maps of Q, K, V and dO (boxes of 64 columns by the variant's query block or key block
/// rows, 128-byte swizzled), then the common block.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Sm90BackwardParams {
    maps: [CUtensorMap; 4],
    base: KernelParams,
    /// A traced build's buffer ([`super::variant::TRACE_WORDS_PER_CTA`] words a CTA), or 0.
    trace: u64,
}

// SAFETY: plain old data of the layout the kernel declares (repr(C); the tensor maps are the
// driver's opaque 128-byte values).
unsafe impl DeviceRepr for Sm90BackwardParams {}

impl Sm90BackwardParams {
    /// The block for `problem` over the tensors `base` points at; `block_m` and `block_n` are
    /// the variant's query and key blocks (the boxes' rows).
    pub fn new(base: KernelParams, problem: &Problem, block_m: usize, block_n: usize) -> Result<Self> {
        let s = problem.shape;
        let t = problem.strides;
        // Each tensor's (rows, heads, batches) as its map spans them: packed rows are one batch.
        let q_extent = match problem.batching.q {
            QueryRows::Packed { total } => (total, s.heads_q, 1),
            QueryRows::Dense => (s.seq_q, s.heads_q, s.batch),
        };
        let kv_extent = match problem.batching.kv {
            KvRows::Packed { total } => (total, s.heads_kv, 1),
            _ => (s.seq_k, s.heads_kv, s.batch),
        };
        let map = |name: &'static str, base: u64, (seq, heads, batch), st, rows| {
            tensor_map(
                problem.dtype,
                base,
                [s.head_dim, seq, heads, batch],
                st,
                rows,
                L2Promotion::for_problem(problem),
            )
            .map_err(|e| Error::backend("cuda", format!("cuTensorMapEncodeTiled for {name}: {e:?}")))
        };
        Ok(Sm90BackwardParams {
            maps: [
                map("q", base.q, q_extent, t.q, block_m)?,
                map("k", base.k, kv_extent, t.k, block_n)?,
                map("v", base.v, kv_extent, t.v, block_n)?,
                map("d_o", base.d_o, q_extent, t.o, block_m)?,
            ],
            base,
            trace: 0,
        })
    }

    /// Points a traced build at `trace` (its buffer's address).
    pub fn with_trace(self, trace: u64) -> Self {
        Sm90BackwardParams { trace, ..self }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_hopper_block_puts_the_maps_first() {
        // Four 128-byte maps, then the common block (the kernel's `Params p` at 512), the whole
        // padded to the maps' 128-byte alignment as the kernel's struct is.
        assert_eq!(std::mem::offset_of!(super::Sm90BackwardParams, base), 512);
        assert_eq!(std::mem::offset_of!(super::Sm90BackwardParams, trace), 512 + 296);
        assert_eq!(
            std::mem::size_of::<super::Sm90BackwardParams>(),
            (512 + 296 + 8usize).next_multiple_of(128)
        );
    }

    #[test]
    fn layout_matches_the_kernel() {
        // 12 pointers, 12 strides, 4 pointers (8 bytes each) = 224; then 10 ints, 2 floats and 5
        // ints (4 bytes each) = 68: 292, padded to 296.
        assert_eq!(std::mem::offset_of!(super::KernelParams, q_strides), 96);
        assert_eq!(std::mem::offset_of!(super::KernelParams, cu_seqlens_q), 192);
        assert_eq!(std::mem::offset_of!(super::KernelParams, batch), 224);
        assert_eq!(std::mem::offset_of!(super::KernelParams, scale), 264);
        assert_eq!(std::mem::offset_of!(super::KernelParams, m_blocks), 280);
        assert_eq!(std::mem::offset_of!(super::KernelParams, dq_copies), 284);
        assert_eq!(std::mem::offset_of!(super::KernelParams, rotate_key_blocks), 288);
        assert_eq!(std::mem::size_of::<super::KernelParams>(), 296);
    }
}
