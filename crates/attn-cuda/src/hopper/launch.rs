//! The Hopper kernel's parameter block: the tensors by pointer and by TMA tensor map.

use super::plan::{head_group, page_box};
use super::split::Split;
use super::variant::{L2Promotion, Variant};
use crate::runtime::driver;
use crate::scores::ScoreParams;
use crate::tensors::{DevicePointers, ExtraPointers, strides};
use attn_core::{Alibi, DType, Error, KvRows, Problem, QueryRows, Result, Strides};
use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The kernel's only argument, passed by value (`__grid_constant__`, which lets the kernel hand
/// the tensor maps' addresses to the copy engine). Must match `struct Params` in
/// `kernels/flash_fwd_sm90.cu` field for field; `layout_matches_the_kernel` checks the size.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Sm90Params {
    q_map: CUtensorMap,
    k_map: CUtensorMap,
    v_map: CUtensorMap,
    o_map: CUtensorMap,
    q: u64,
    k: u64,
    v: u64,
    o: u64,
    lse: u64,
    schedule: u64,
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
    q_blocks: i32,
    tiles: i32,
    head_group: i32,
    whole: i32,
    tail_units: i32,
    tail_iters: i32,
    partials: u64,
    trace: u64,
    // The window and soft-cap variants' values (`crate::scores`), in what was the padding.
    window_left: i32,
    window_right: i32,
    softcap_in: f32,
    softcap_out: f32,
    // The ALiBi variants' slopes (a device array, null in the others) and their batch stride.
    alibi_slopes: u64,
    alibi_batch_stride: i32,
    // The padded variants' head dim (`Variant::pad`): the problem's, below the kernel's.
    head_dim: i32,
    // The sequence variants' arrays (`Variant::seqs`; device arrays, each null where the problem
    // has none) and packed row counts (0 where dense). Past the 768 bytes the other variants
    // declare: the driver copies what each kernel declares.
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    seqused_k: u64,
    q_total: i32,
    kv_total: i32,
    // A paged cache (null and zeros where there is none): the block table, the page size, the
    // table's entries per sequence, the rows of one TMA box of a key tile.
    block_table: u64,
    page_size: i32,
    pages_per_seq: i32,
    page_box: i32,
}

/// Device addresses of the Hopper kernel's workspace: the persistent scheduler's counters (zero
/// before a launch, and the kernel leaves them so) and the split tail's partial results (0 where
/// the split has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workspace {
    /// `u32` counters, [`Split::counters`] of them.
    pub counters: u64,
    /// `f32` partial results, [`Split::partial_floats`] of them, or 0.
    pub partials: u64,
}

/// The trace of a [`Variant::trace`] build, per CTA: `TRACE_PIECES + 1` rows (a piece each,
/// the last the CTA's own) of `TRACE_ROLES` roles (consumer warpgroups, then the producer) of
/// `TRACE_EVENTS` 64-bit stamps, as `kernels/sm90_trace.cuh` lays it out (`trace_put`).
pub const TRACE_PIECES: usize = 64;
/// See [`TRACE_PIECES`].
pub const TRACE_ROLES: usize = 5;
/// See [`TRACE_PIECES`].
pub const TRACE_EVENTS: usize = 16;
/// The trace's 64-bit words per CTA.
pub const TRACE_LEN_PER_CTA: usize = (TRACE_PIECES + 1) * TRACE_ROLES * TRACE_EVENTS;

// SAFETY: plain old data of the layout the kernel declares (repr(C); the tensor maps are the
// driver's opaque 128-byte values).
unsafe impl DeviceRepr for Sm90Params {}

/// A 4-D tensor map of a [batch][heads][seq][head_dim] tensor with these element strides, whose
/// boxes are 64 columns (128 bytes) by `rows` rows, 128-byte swizzled, with L2 promotion `l2`;
/// rows past `seq` read as zeros.
pub(crate) fn tensor_map(
    dtype: DType,
    base: u64,
    dims: [usize; 4],
    st: Strides,
    rows: usize,
    l2: L2Promotion,
) -> std::result::Result<CUtensorMap, sys::CUresult> {
    let data_type = match dtype {
        DType::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        _ => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    };
    let [head_dim, seq, heads, batch] = dims;
    let global_dims = [head_dim as u64, seq as u64, heads as u64, batch as u64];
    // A dimension of extent 1 is never stepped along, so its stride is free: the one it would
    // have if packed (its own may be 0, which the driver need not accept).
    let seq_stride = if seq > 1 { st.seq } else { st.seq.max(head_dim) };
    let head_stride = if heads > 1 { st.head } else { st.head.max(seq_stride * seq) };
    let batch_stride = if batch > 1 { st.batch } else { st.batch.max(head_stride * heads) };
    let global_strides = [2 * seq_stride as u64, 2 * head_stride as u64, 2 * batch_stride as u64];
    let boxes = [64u32, rows as u32, 1, 1];
    let element_strides = [1u32; 4];
    let mut map = std::mem::MaybeUninit::<CUtensorMap>::uninit();
    // SAFETY: every array holds the rank's (4) or rank - 1 entries the call reads; `map` is
    // written by the call before it is read, and only on success.
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            4,
            base as *mut std::ffi::c_void,
            global_dims.as_ptr(),
            global_strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            match l2 {
                L2Promotion::None => CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_NONE,
                L2Promotion::B64 => CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
                L2Promotion::B128 => CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                L2Promotion::B256 => CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            },
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    match status {
        sys::CUresult::CUDA_SUCCESS => {
            // SAFETY: the call succeeded, so it wrote the map.
            Ok(unsafe { map.assume_init() })
        }
        err => Err(err),
    }
}

/// How the Hopper kernel loads a paged cache's key tiles: boxes of `page_box` rows
/// ([`page_box`]), each from the page the block table names (`load_kv_tile` in
/// `kernels/sm90_mainloop.cuh`), through tensor maps of `[head_dim, page_size, heads_kv, pages]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Paging {
    page_size: usize,
    pages: usize,
    pages_per_seq: usize,
    page_box: usize,
}

impl Sm90Params {
    /// The parameter block of `variant` for `problem` over the tensors at `at` (and ALiBi's
    /// slopes at `extras`, which an ALiBi variant must have); `work` holds the addresses of the
    /// persistent scheduler's counters, zero ([`Split::counters`]), and of the split tail's
    /// partial results (where `split` has units, else 0).
    pub fn new(
        at: DevicePointers,
        extras: ExtraPointers,
        work: Workspace,
        split: &Split,
        problem: &Problem,
        variant: &Variant,
    ) -> Result<Self> {
        let s = problem.shape;
        let t = problem.strides;
        // Packed rows (sequences of their own lengths) are one batch of all the rows.
        let q_total = match problem.batching.q {
            QueryRows::Packed { total } => Some(total),
            QueryRows::Dense => None,
        };
        let (kv_total, paging) = match problem.batching.kv {
            KvRows::Packed { total } => (Some(total), None),
            KvRows::Dense => (None, None),
            KvRows::Paged { page_size, pages, pages_per_seq } => {
                let page_box = page_box(variant.block_n, page_size);
                (None, Some(Paging { page_size, pages, pages_per_seq, page_box }))
            }
        };
        // Each tensor's (rows, heads, batches) as its map spans them: packed rows are one batch
        // of all of them, a paged cache's pages are its batches; and K's and V's box rows.
        let q_extent = match q_total {
            Some(total) => (total, s.heads_q, 1),
            None => (s.seq_q, s.heads_q, s.batch),
        };
        let (kv_extent, kv_box) = match (paging, kv_total) {
            (Some(pg), _) => ((pg.page_size, s.heads_kv, pg.pages), pg.page_box),
            (None, Some(total)) => ((total, s.heads_kv, 1), variant.block_n),
            (None, None) => ((s.seq_k, s.heads_kv, s.batch), variant.block_n),
        };
        let map = |name: &'static str, base: u64, (seq, heads, batch), st: Strides, rows: usize| {
            tensor_map(problem.dtype, base, [s.head_dim, seq, heads, batch], st, rows, variant.l2)
                .map_err(|e| Error::backend("cuda", format!("cuTensorMapEncodeTiled for {name}: {e:?}")))
        };
        let (q, k, v, o) = (at.q, at.k, at.v, at.o);
        let q_blocks = s.seq_q.div_ceil(variant.block_m());
        let scores = ScoreParams::of(problem);
        if variant.seqs == problem.batching.is_dense() {
            return Err(Error::PlanMismatch {
                what: format!(
                    "plan `{}` for {problem}: a sequence variant needs a problem with sequences of their own \
                     lengths, and a variant without them a dense problem",
                    variant.name()
                ),
            });
        }
        if variant.paged != paging.is_some() {
            return Err(Error::PlanMismatch {
                what: format!(
                    "plan `{}` for {problem}: a paged variant needs a problem with a paged cache, and a variant \
                     without it a problem without one",
                    variant.name()
                ),
            });
        }
        if variant.alibi != problem.params.alibi.is_some() || (variant.alibi && extras.alibi_slopes == 0) {
            return Err(Error::PlanMismatch {
                what: format!(
                    "plan `{}` for {problem}: an ALiBi variant needs a problem with ALiBi and its slopes on the \
                     device, and a variant without it a problem without it",
                    variant.name()
                ),
            });
        }
        Ok(Sm90Params {
            q_map: map("q", q, q_extent, t.q, variant.block_m())?,
            k_map: map("k", k, kv_extent, t.k, kv_box)?,
            v_map: map("v", v, kv_extent, t.v, kv_box)?,
            // Stored by each consumer warpgroup: 64 rows.
            o_map: map("o", o, q_extent, t.o, 64)?,
            q,
            k,
            v,
            o,
            lse: at.lse.unwrap_or(0),
            schedule: work.counters,
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
            q_blocks: q_blocks as i32,
            tiles: variant.tiles(problem).min(i32::MAX as u64) as i32,
            head_group: head_group(problem) as i32,
            whole: split.whole as i32,
            tail_units: split.units as i32,
            tail_iters: split.tail_iters() as i32,
            partials: work.partials,
            trace: 0,
            window_left: scores.window_left,
            window_right: scores.window_right,
            softcap_in: scores.softcap_in,
            softcap_out: scores.softcap_out,
            alibi_slopes: extras.alibi_slopes,
            alibi_batch_stride: match problem.params.alibi {
                Some(Alibi::PerBatchHead) => s.heads_q as i32,
                _ => 0,
            },
            head_dim: s.head_dim as i32,
            cu_seqlens_q: extras.cu_seqlens_q,
            cu_seqlens_k: extras.cu_seqlens_k,
            seqused_k: extras.seqused_k,
            q_total: q_total.unwrap_or(0) as i32,
            kv_total: kv_total.unwrap_or(0) as i32,
            block_table: if paging.is_some() { extras.block_table } else { 0 },
            page_size: paging.map_or(0, |pg| pg.page_size as i32),
            pages_per_seq: paging.map_or(0, |pg| pg.pages_per_seq as i32),
            page_box: paging.map_or(0, |pg| pg.page_box as i32),
        })
    }

    /// Points a trace build at `buffer` ([`TRACE_LEN_PER_CTA`] words per CTA of the grid).
    pub fn with_trace(self, buffer: &CudaSlice<i64>, stream: &CudaStream) -> Self {
        Sm90Params { trace: buffer.device_ptr(stream).0, ..self }
    }
}

/// The Hopper kernel's parameter block for one prepared problem, and the buffers it points at
/// beyond the tensors: the persistent scheduler's counters, the split tail's partial results,
/// and a traced build's timeline.
pub(crate) struct Bound {
    /// The kernel's argument.
    pub params: Sm90Params,
    _counters: CudaSlice<u32>,
    _partials: Option<CudaSlice<f32>>,
    _trace: Option<Trace>,
}

impl Bound {
    /// Allocates what `variant` needs beyond `tensors` (at `at`, ALiBi's slopes at `extras`) for
    /// `problem`, dealt out as `split` over `ctas` CTAs; a traced build's timeline goes to a file
    /// in `trace_folder`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        at: DevicePointers,
        extras: ExtraPointers,
        stream: &Arc<CudaStream>,
        problem: &Problem,
        variant: &Variant,
        split: &Split,
        ctas: u32,
        trace_folder: Option<&Path>,
    ) -> Result<Bound> {
        // The persistent scheduler's counters, zero; the kernel leaves them so.
        let counters = stream
            .alloc_zeros::<u32>(split.counters(variant.consumers))
            .map_err(driver("allocate the tile counters"))?;
        // The split tail's partial results, written before they are read.
        let partials = match split.units > 0 {
            true => Some(
                // SAFETY: every slot a launch reads, it first writes (merge_partials).
                unsafe { stream.alloc::<f32>(split.partial_floats(variant.head_dim, variant.consumers)) }
                    .map_err(driver("allocate the split tail's partial results"))?,
            ),
            false => None,
        };
        let work = Workspace {
            counters: counters.device_ptr(stream).0,
            partials: partials.as_ref().map_or(0, |p| p.device_ptr(stream).0),
        };
        let mut params = Sm90Params::new(at, extras, work, split, problem, variant)?;
        let mut trace = None;
        // A traced build stamps through its trace pointer unconditionally: it must have one.
        if variant.trace && trace_folder.is_none() {
            return Err(Error::PlanMismatch {
                what: format!(
                    "plan `{}` is a traced build, but this backend has no trace folder (ATTN_CUDA_SM90_TRACE)",
                    variant.name()
                ),
            });
        }
        if let (true, Some(folder)) = (variant.trace, trace_folder) {
            let words = ctas as usize * TRACE_LEN_PER_CTA;
            let buffer = stream.alloc_zeros::<i64>(words).map_err(driver("allocate the trace"))?;
            params = params.with_trace(&buffer, stream);
            let s = problem.shape;
            let file =
                format!("trace-{}-b{}h{}-s{}x{}.csv", variant.name(), s.batch, s.heads_q, s.seq_q, s.seq_k);
            trace = Some(Trace { buffer, path: folder.join(file), stream: stream.clone() });
        }
        Ok(Bound { params, _counters: counters, _partials: partials, _trace: trace })
    }
}

/// The timeline a traced build stamps ([`Variant::trace`]), and the file it goes to when dropped.
struct Trace {
    buffer: CudaSlice<i64>,
    path: PathBuf,
    stream: Arc<CudaStream>,
}

impl Trace {
    /// The last launch's stamps as CSV: a row per (CTA, piece, role) that holds any, the piece
    /// `TRACE_PIECES` being the CTA's own row (see `kernels/sm90_trace.cuh`, `trace_put`).
    fn write(&self) -> std::result::Result<(), String> {
        let words = self.stream.clone_dtoh(&self.buffer).map_err(|e| format!("copy the trace back: {e}"))?;
        let names: Vec<String> = (0..TRACE_EVENTS).map(|e| format!("e{e}")).collect();
        let mut csv = format!("cta,piece,role,{}\n", names.join(","));
        for (row, events) in words.chunks(TRACE_EVENTS).enumerate() {
            if events.iter().all(|&e| e == 0) {
                continue;
            }
            let (role, piece, cta) = (
                row % TRACE_ROLES,
                row / TRACE_ROLES % (TRACE_PIECES + 1),
                row / TRACE_ROLES / (TRACE_PIECES + 1),
            );
            let stamps: Vec<String> = events.iter().map(i64::to_string).collect();
            csv.push_str(&format!("{cta},{piece},{role},{}\n", stamps.join(",")));
        }
        std::fs::create_dir_all(self.path.parent().unwrap_or(Path::new(".")))
            .and_then(|()| std::fs::write(&self.path, csv))
            .map_err(|e| format!("write {}: {e}", self.path.display()))
    }
}

impl Drop for Trace {
    /// Writes the timeline; a failure is reported on stderr (a diagnostic, which must not turn
    /// a finished run into an error).
    fn drop(&mut self) {
        match self.write() {
            Ok(()) => eprintln!("trace: {}", self.path.display()),
            Err(e) => eprintln!("trace not written: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn layout_matches_the_kernel() {
        // 4 tensor maps (128 bytes, 128-byte aligned) + 6 pointers + 12 strides (8 bytes each)
        // + 12 ints and floats + 4 bytes of padding + 2 pointers = 720 bytes, the window and
        // soft-cap's 2 ints and 2 floats (736), ALiBi's pointer and int (748), the padded
        // variants' head dim (752), padded to the 128-byte alignment: 768, as before they were
        // added; then the sequence variants' three pointers and two ints (784), the paged
        // cache's pointer and three ints (804), padded: 896.
        assert_eq!(std::mem::size_of::<super::Sm90Params>(), 896);
        assert_eq!(std::mem::align_of::<super::Sm90Params>(), 128);
        // The offsets listed beside `struct Params` in kernels/flash_fwd_sm90.cu.
        use std::mem::offset_of;
        let at = [
            offset_of!(super::Sm90Params, q),
            offset_of!(super::Sm90Params, schedule),
            offset_of!(super::Sm90Params, q_strides),
            offset_of!(super::Sm90Params, batch),
            offset_of!(super::Sm90Params, scale_log2),
            offset_of!(super::Sm90Params, head_group),
            offset_of!(super::Sm90Params, whole),
            offset_of!(super::Sm90Params, partials),
            offset_of!(super::Sm90Params, trace),
            offset_of!(super::Sm90Params, window_left),
            offset_of!(super::Sm90Params, alibi_slopes),
            offset_of!(super::Sm90Params, alibi_batch_stride),
            offset_of!(super::Sm90Params, head_dim),
            offset_of!(super::Sm90Params, cu_seqlens_q),
            offset_of!(super::Sm90Params, kv_total),
            offset_of!(super::Sm90Params, block_table),
            offset_of!(super::Sm90Params, page_box),
        ];
        assert_eq!(at, [512, 552, 560, 656, 676, 688, 692, 704, 712, 720, 736, 744, 748, 752, 780, 784, 800]);
    }
}
