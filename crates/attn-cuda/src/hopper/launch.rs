//! The Hopper kernel's parameter block: the tensors by pointer and by TMA tensor map.

use super::Variant;
use super::plan::Split;
use crate::launch::DeviceTensors;
use attn_core::{DType, Error, Problem, Result, Strides};
use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};

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
}

/// The trace of a [`super::Variant::trace`] build, per CTA: `TRACE_PIECES + 1` rows (a piece each,
/// the last the CTA's own) of `TRACE_ROLES` roles (consumer warpgroups, then the producer) of
/// `TRACE_EVENTS` 64-bit stamps, as `kernels/flash_fwd_sm90.cu` lays it out (`trace_put`).
pub const TRACE_PIECES: usize = 64;
/// See [`TRACE_PIECES`].
pub const TRACE_ROLES: usize = 5;
/// See [`TRACE_PIECES`].
pub const TRACE_EVENTS: usize = 16;
/// The trace's 64-bit words per CTA.
pub const TRACE_LEN_PER_CTA: usize = (TRACE_PIECES + 1) * TRACE_ROLES * TRACE_EVENTS;

/// L2 the causal tile order may fill with K/V (see [`head_group`]): about two thirds of the
/// H100's 50 MB (the H200 has 60), leaving room for Q, O and the copies in flight.
const L2_BUDGET: usize = 32 << 20;

/// Under a causal mask the kernel takes tiles longest first within groups of this many heads
/// (`tile_at` in the kernel): as many heads as have K and V together within [`L2_BUDGET`], so
/// that the CTAs running at once reread K/V from L2 rather than from memory.
/// Query heads that share a K/V head (GQA) count once.
pub fn head_group(problem: &Problem) -> usize {
    let s = problem.shape;
    let kv_bytes_per_query_head =
        (2 * s.seq_k * s.head_dim * 2).div_ceil(s.heads_q / s.heads_kv.max(1)).max(1);
    (L2_BUDGET / kv_bytes_per_query_head).clamp(1, s.batch * s.heads_q)
}

// SAFETY: plain old data of the layout the kernel declares (repr(C); the tensor maps are the
// driver's opaque 128-byte values).
unsafe impl DeviceRepr for Sm90Params {}

fn strides(s: Strides) -> [i64; 3] {
    [s.batch as i64, s.head as i64, s.seq as i64]
}

/// A 4-D tensor map of a [batch][heads][seq][head_dim] tensor with these element strides, whose
/// boxes are 64 columns (128 bytes) by `rows` rows, 128-byte swizzled; rows past `seq` read as
/// zeros.
fn tensor_map(
    dtype: DType,
    base: u64,
    dims: [usize; 4],
    st: Strides,
    rows: usize,
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
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
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

impl Sm90Params {
    /// The parameter block of `variant` for `problem` over these buffers; `schedule` is the
    /// persistent scheduler's counters, zero ([`Split::counters`], the persistent form only),
    /// and `partials` the split tail's partial results (where `split` has units).
    pub fn new(
        tensors: &DeviceTensors,
        schedule: Option<&CudaSlice<u32>>,
        partials: Option<&CudaSlice<f32>>,
        split: &Split,
        stream: &CudaStream,
        problem: &Problem,
        variant: &Variant,
    ) -> Result<Self> {
        let s = problem.shape;
        let t = problem.strides;
        let ptr = |x: &CudaSlice<u16>| x.device_ptr(stream).0;
        let map = |name: &'static str, base: u64, heads: usize, seq: usize, st: Strides, rows: usize| {
            tensor_map(problem.dtype, base, [s.head_dim, seq, heads, s.batch], st, rows)
                .map_err(|e| Error::backend("cuda", format!("cuTensorMapEncodeTiled for {name}: {e:?}")))
        };
        let (q, k, v, o) = (ptr(&tensors.q), ptr(&tensors.k), ptr(&tensors.v), ptr(&tensors.o));
        let q_blocks = s.seq_q.div_ceil(variant.block_m());
        Ok(Sm90Params {
            q_map: map("q", q, s.heads_q, s.seq_q, t.q, variant.block_m())?,
            k_map: map("k", k, s.heads_kv, s.seq_k, t.k, variant.block_n)?,
            v_map: map("v", v, s.heads_kv, s.seq_k, t.v, variant.block_n)?,
            // Stored by each consumer warpgroup: 64 rows.
            o_map: map("o", o, s.heads_q, s.seq_q, t.o, 64)?,
            q,
            k,
            v,
            o,
            lse: tensors.lse.as_ref().map_or(0, |l| l.device_ptr(stream).0),
            schedule: schedule.map_or(0, |c| c.device_ptr(stream).0),
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
            partials: partials.map_or(0, |c| c.device_ptr(stream).0),
            trace: 0,
        })
    }

    /// Points a trace build at `buffer` ([`TRACE_LEN_PER_CTA`] words per CTA of the grid).
    pub fn with_trace(self, buffer: &CudaSlice<i64>, stream: &CudaStream) -> Self {
        Sm90Params { trace: buffer.device_ptr(stream).0, ..self }
    }
}

#[cfg(test)]
mod tests {
    use attn_core::{DType, Problem, Shape};

    #[test]
    fn head_groups_keep_k_and_v_within_l2() {
        // S=2048, D=128: 1 MiB of K and V per head, 32 heads to a group (of 128).
        let p =
            |s: usize, d: usize| Problem::new(Shape::new(16384 / s, 2048 / d, s, d), DType::Bf16).causal();
        assert_eq!(super::head_group(&p(2048, 128)), 32);
        // S=16384, D=128: 8 MiB per head, 4 to a group; S=512, D=64: 128 KiB, 256 (of 1024).
        assert_eq!(super::head_group(&p(16384, 128)), 4);
        assert_eq!(super::head_group(&p(512, 64)), 256);
        // Never more than there are; query heads sharing K/V (GQA 4:1) count once.
        assert_eq!(super::head_group(&Problem::new(Shape::new(1, 2, 64, 64), DType::Bf16)), 2);
        let gqa = Problem::new(Shape { heads_kv: 4, ..Shape::new(8, 16, 2048, 128) }, DType::Bf16);
        assert_eq!(super::head_group(&gqa), 128);
    }

    #[test]
    fn layout_matches_the_kernel() {
        // 4 tensor maps (128 bytes, 128-byte aligned) + 6 pointers + 12 strides (8 bytes each)
        // + 12 ints and floats + 4 bytes of padding + 2 pointers = 720 bytes, padded to the
        // 128-byte alignment: 768.
        assert_eq!(std::mem::size_of::<super::Sm90Params>(), 768);
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
        ];
        assert_eq!(at, [512, 552, 560, 656, 676, 688, 692, 704, 712]);
    }
}
