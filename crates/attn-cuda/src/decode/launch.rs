//! The decode kernel's parameter block, and the workspace a host-copy run holds.

use super::plan::{Split, window};
use super::variant::Variant;
use crate::hopper::launch::Workspace;
use crate::runtime::driver;
use crate::tensors::{DevicePointers, ExtraPointers, strides};
use attn_core::{Alibi, KvRows, Problem, QueryRows, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use std::sync::Arc;

/// The kernel's only argument, passed by value (`__grid_constant__`). Must match `struct Params`
/// in `kernels/decode.cu` field for field; `layout_matches_the_kernel` checks it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeParams {
    q: u64,
    k: u64,
    v: u64,
    o: u64,
    lse: u64,
    partial_o: u64,
    partial_lse: u64,
    tickets: u64,
    q_strides: [i64; 3],
    k_strides: [i64; 3],
    v_strides: [i64; 3],
    o_strides: [i64; 3],
    batch: i32,
    heads_q: i32,
    heads_kv: i32,
    seq_q: i32,
    seq_k: i32,
    group: i32,
    rows: i32,
    row_blocks: i32,
    splits: i32,
    window_left: i32,
    window_right: i32,
    scale_log2: f32,
    /// The problem's head dim: the variant's, or below it (`Variant::pad`).
    head_dim: i32,
    // Read by the extras variants only (`ATTN_EXTRAS`); the plain ones declare the 212 bytes
    // above, and the launch copies just those.
    block_table: u64,
    seqused_k: u64,
    alibi_slopes: u64,
    page_size: i32,
    pages_per_seq: i32,
    alibi_batch_stride: i32,
    /// The soft-cap's factors ([`crate::scores::ScoreParams`]'s `softcap_out`, `softcap_in`).
    softcap_log2: f32,
    softcap_inv: f32,
    /// Pages in a paged cache: the kernel clamps page numbers below it (a device-resident
    /// caller's block table is not checked on the host).
    pages: i32,
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    /// Packed query and key rows: the kernel clamps offsets into them (unchecked, as pages are).
    q_total: i32,
    kv_total: i32,
}

// SAFETY: plain old data of the layout the kernel declares (repr(C), no padding beyond C's).
unsafe impl DeviceRepr for DecodeParams {}

impl DecodeParams {
    /// The parameter block for `problem` over the tensors at `at`, cut as `split` says; `work`
    /// holds the tickets (zero) and the partial results (`Split::partial_floats` of them) where
    /// there are several splits.
    pub fn new(
        at: DevicePointers,
        extras: ExtraPointers,
        work: Workspace,
        problem: &Problem,
        variant: &Variant,
        split: &Split,
    ) -> Self {
        let s = problem.shape;
        let t = problem.strides;
        let (window_left, window_right) = window(problem).unwrap_or((0, 0));
        // The partial LSEs follow the partial outputs.
        let o_floats =
            split.pairs as u64 * split.splits as u64 * (variant.block_m() * variant.head_dim) as u64;
        let several = split.splits > 1;
        let (page_size, pages_per_seq, pages) = match problem.batching.kv {
            KvRows::Paged { page_size, pages_per_seq, pages } => {
                (page_size as i32, pages_per_seq as i32, pages as i32)
            }
            _ => (0, 0, 0),
        };
        let scores = crate::scores::ScoreParams::of(problem);
        DecodeParams {
            q: at.q,
            k: at.k,
            v: at.v,
            o: at.o,
            lse: at.lse.unwrap_or(0),
            partial_o: if several { work.partials } else { 0 },
            partial_lse: if several { work.partials + 4 * o_floats } else { 0 },
            tickets: if several { work.counters } else { 0 },
            q_strides: strides(t.q),
            k_strides: strides(t.k),
            v_strides: strides(t.v),
            o_strides: strides(t.o),
            batch: s.batch as i32,
            heads_q: s.heads_q as i32,
            heads_kv: s.heads_kv as i32,
            seq_q: s.seq_q as i32,
            seq_k: s.seq_k as i32,
            group: (s.heads_q / s.heads_kv) as i32,
            rows: (s.heads_q / s.heads_kv * s.seq_q) as i32,
            row_blocks: split.row_blocks as i32,
            splits: split.splits as i32,
            window_left,
            window_right,
            scale_log2: problem.scale() * std::f32::consts::LOG2_E,
            head_dim: s.head_dim as i32,
            block_table: extras.block_table,
            seqused_k: extras.seqused_k,
            alibi_slopes: extras.alibi_slopes,
            page_size,
            pages_per_seq,
            alibi_batch_stride: match problem.params.alibi {
                Some(Alibi::PerBatchHead) => s.heads_q as i32,
                _ => 0,
            },
            softcap_log2: scores.softcap_out,
            softcap_inv: scores.softcap_in,
            pages,
            cu_seqlens_q: extras.cu_seqlens_q,
            cu_seqlens_k: extras.cu_seqlens_k,
            q_total: match problem.batching.q {
                QueryRows::Packed { total } => total as i32,
                QueryRows::Dense => 0,
            },
            kv_total: match problem.batching.kv {
                KvRows::Packed { total } => total as i32,
                _ => 0,
            },
        }
    }
}

/// A host-copy run's parameter block and the workspace it points at (tickets and partial
/// results, allocated with the problem's buffers where there are several splits).
pub(crate) struct Bound {
    /// The kernel's argument.
    pub params: DecodeParams,
    _tickets: Option<CudaSlice<u32>>,
    _partials: Option<CudaSlice<f32>>,
}

impl Bound {
    /// Allocates what `variant` cut as `split` needs beyond the tensors at `at` and the index
    /// arrays at `extras` (the block table, key counts and slopes `DeviceTensors` copied).
    pub fn new(
        at: DevicePointers,
        extras: ExtraPointers,
        stream: &Arc<CudaStream>,
        problem: &Problem,
        variant: &Variant,
        split: &Split,
    ) -> Result<Bound> {
        let (tickets, partials) = match split.splits > 1 {
            false => (None, None),
            true => (
                // Zero; the kernel leaves them so.
                Some(
                    stream
                        .alloc_zeros::<u32>(split.counters())
                        .map_err(driver("allocate the decode tickets"))?,
                ),
                // SAFETY: every partial a launch reads, a CTA of the same launch wrote first.
                Some(
                    unsafe { stream.alloc::<f32>(split.partial_floats(variant)) }
                        .map_err(driver("allocate the decode partial results"))?,
                ),
            ),
        };
        let work = Workspace {
            counters: tickets.as_ref().map_or(0, |t| t.device_ptr(stream).0),
            partials: partials.as_ref().map_or(0, |p| p.device_ptr(stream).0),
        };
        let params = DecodeParams::new(at, extras, work, problem, variant, split);
        Ok(Bound { params, _tickets: tickets, _partials: partials })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn layout_matches_the_kernel() {
        // 8 pointers + 12 strides (8 bytes each) + 11 ints + 1 float + 1 int = 212 bytes: all the
        // plain variants declare. Then 4 bytes of padding and the extras: 3 pointers + 6
        // four-byte fields, then 2 pointers + 2 four-byte fields (packed sequences) = 288.
        assert_eq!(std::mem::size_of::<super::DecodeParams>(), 288);
        assert_eq!(std::mem::align_of::<super::DecodeParams>(), 8);
        use std::mem::offset_of;
        assert_eq!(offset_of!(super::DecodeParams, q_strides), 64);
        assert_eq!(offset_of!(super::DecodeParams, batch), 160);
        assert_eq!(offset_of!(super::DecodeParams, scale_log2), 204);
        assert_eq!(offset_of!(super::DecodeParams, head_dim), 208);
        assert_eq!(offset_of!(super::DecodeParams, block_table), 216);
        assert_eq!(offset_of!(super::DecodeParams, page_size), 240);
        assert_eq!(offset_of!(super::DecodeParams, softcap_inv), 256);
        assert_eq!(offset_of!(super::DecodeParams, pages), 260);
        assert_eq!(offset_of!(super::DecodeParams, cu_seqlens_k), 272);
        assert_eq!(offset_of!(super::DecodeParams, kv_total), 284);
    }
}
