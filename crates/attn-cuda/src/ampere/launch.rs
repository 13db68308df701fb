//! The Ampere/Ada kernel's parameter block.

use crate::scores::ScoreParams;
use crate::tensors::{DevicePointers, ExtraPointers, strides};
use attn_core::{Alibi, KvRows, Problem, QueryRows};
use cudarc::driver::DeviceRepr;

/// The kernel's only argument, passed by value (`__grid_constant__`). Must match `struct Params`
/// in `kernels/flash_fwd.cu` field for field; `layout_matches_the_kernel` checks the size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelParams {
    q: u64,
    k: u64,
    v: u64,
    o: u64,
    lse: u64,
    q_strides: [i64; 3],
    k_strides: [i64; 3],
    v_strides: [i64; 3],
    o_strides: [i64; 3],
    batch: i32,
    heads_q: i32,
    heads_kv: i32,
    seq_q: i32,
    seq_k: i32,
    scale_log2: f32,
    // Declared by the window and soft-cap variants only (`#if` in the kernel): the driver copies
    // as many bytes as the kernel declares, so the other variants never see these.
    window_left: i32,
    window_right: i32,
    softcap_in: f32,
    softcap_out: f32,
    // Declared by the sequence and ALiBi variants only (the same way): device arrays, null where
    // the problem has none.
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    seqused_k: u64,
    block_table: u64,
    alibi_slopes: u64,
    page_size: i32,
    pages_per_seq: i32,
    alibi_batch_stride: i32,
    q_total: i32,
    /// Packed key rows, or a paged cache's pages: the bound the kernel clamps offsets and page
    /// numbers to (a device-resident caller's arrays are not checked on the host).
    kv_total: i32,
    // Declared by the padded variants only (`ATTN_PAD`), which declare all of the above too.
    head_dim: i32,
}

// SAFETY: plain old data of the layout the kernel declares (repr(C), no padding beyond C's).
unsafe impl DeviceRepr for KernelParams {}

impl KernelParams {
    /// The parameter block for `problem` over the tensors at `at` and its sequences' and
    /// ALiBi's arrays at `extras` (all null for a dense problem without ALiBi).
    pub fn new(at: DevicePointers, extras: ExtraPointers, problem: &Problem) -> KernelParams {
        let s = problem.shape;
        let t = problem.strides;
        let scores = ScoreParams::of(problem);
        KernelParams {
            q: at.q,
            k: at.k,
            v: at.v,
            o: at.o,
            lse: at.lse.unwrap_or(0),
            q_strides: strides(t.q),
            k_strides: strides(t.k),
            v_strides: strides(t.v),
            o_strides: strides(t.o),
            batch: s.batch as i32,
            heads_q: s.heads_q as i32,
            heads_kv: s.heads_kv as i32,
            seq_q: s.seq_q as i32,
            seq_k: s.seq_k as i32,
            scale_log2: problem.scale() * std::f32::consts::LOG2_E,
            window_left: scores.window_left,
            window_right: scores.window_right,
            softcap_in: scores.softcap_in,
            softcap_out: scores.softcap_out,
            cu_seqlens_q: extras.cu_seqlens_q,
            cu_seqlens_k: extras.cu_seqlens_k,
            seqused_k: extras.seqused_k,
            block_table: extras.block_table,
            alibi_slopes: extras.alibi_slopes,
            page_size: match problem.batching.kv {
                KvRows::Paged { page_size, .. } => page_size as i32,
                _ => 0,
            },
            pages_per_seq: match problem.batching.kv {
                KvRows::Paged { pages_per_seq, .. } => pages_per_seq as i32,
                _ => 0,
            },
            alibi_batch_stride: match problem.params.alibi {
                Some(Alibi::PerBatchHead) => s.heads_q as i32,
                _ => 0,
            },
            q_total: match problem.batching.q {
                QueryRows::Packed { total } => total as i32,
                QueryRows::Dense => 0,
            },
            kv_total: match problem.batching.kv {
                KvRows::Packed { total } => total as i32,
                KvRows::Paged { pages, .. } => pages as i32,
                KvRows::Dense => 0,
            },
            head_dim: s.head_dim as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn layout_matches_the_kernel() {
        // 5 pointers + 12 strides (8 bytes each) + 5 ints + 1 float = 160 bytes, no padding;
        // then the window and soft-cap variants' 2 ints and 2 floats; then the sequence and ALiBi
        // variants' 5 pointers and 5 ints; then the padded variants' head dim, which ends the
        // struct on its 8-byte alignment (C's sizeof of the struct).
        assert_eq!(std::mem::offset_of!(super::KernelParams, window_left), 160);
        assert_eq!(std::mem::offset_of!(super::KernelParams, cu_seqlens_q), 176);
        assert_eq!(std::mem::offset_of!(super::KernelParams, page_size), 216);
        assert_eq!(std::mem::offset_of!(super::KernelParams, kv_total), 232);
        assert_eq!(std::mem::offset_of!(super::KernelParams, head_dim), 236);
        assert_eq!(std::mem::size_of::<super::KernelParams>(), 240);
        assert_eq!(std::mem::align_of::<super::KernelParams>(), 8);
    }
}
