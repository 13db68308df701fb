//! The device-resident tensors of one prepared problem, as both kernel families read them.

use crate::driver;
use attn_core::{Buffer, DType, Data, Error, KvRows, Problem, Result, Strides};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};
use std::sync::Arc;

/// Device copies of the inputs and room for the outputs.
pub struct DeviceTensors {
    pub q: CudaSlice<u16>,
    pub k: CudaSlice<u16>,
    pub v: CudaSlice<u16>,
    pub o: CudaSlice<u16>,
    pub lse: Option<CudaSlice<f32>>,
    /// The problem's sequence indices and ALiBi slopes ([`attn_core::Extras`]), on the device.
    pub extras: DeviceExtras,
}

/// Device copies of a problem's [`attn_core::Extras`], each where the problem has it.
#[derive(Default)]
pub struct DeviceExtras {
    cu_seqlens_q: Option<CudaSlice<i32>>,
    cu_seqlens_k: Option<CudaSlice<i32>>,
    seqused_k: Option<CudaSlice<i32>>,
    block_table: Option<CudaSlice<i32>>,
    alibi_slopes: Option<CudaSlice<f32>>,
}

/// The device addresses of a problem's sequence indices and ALiBi slopes, 0 (null) for each it
/// does not have: what the kernels' parameter blocks hold, and what the raw entry
/// ([`crate::Cuda::run_raw`]) takes beside [`DevicePointers`] (under its safety contract; the
/// contents are not checked there, the kernels clamp every index into the problem's bounds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtraPointers {
    /// `[batch + 1]` i32 query offsets.
    pub cu_seqlens_q: u64,
    /// `[batch + 1]` i32 key offsets.
    pub cu_seqlens_k: u64,
    /// `[batch]` i32 key counts.
    pub seqused_k: u64,
    /// `[batch, pages_per_seq]` i32 page numbers.
    pub block_table: u64,
    /// `[heads_q]` or `[batch, heads_q]` f32 slopes.
    pub alibi_slopes: u64,
}

impl DeviceExtras {
    /// Copies each array `extras` holds to the device (checked against the problem before).
    pub fn upload(stream: &Arc<CudaStream>, extras: &attn_core::Extras<'_>) -> Result<Self> {
        fn copy<T: cudarc::driver::DeviceRepr>(
            stream: &Arc<CudaStream>,
            host: Option<&[T]>,
            name: &'static str,
        ) -> Result<Option<CudaSlice<T>>> {
            host.map(|h| stream.clone_htod(h).map_err(driver(name))).transpose()
        }
        Ok(DeviceExtras {
            cu_seqlens_q: copy(stream, extras.cu_seqlens_q, "copy cu_seqlens_q to the device")?,
            cu_seqlens_k: copy(stream, extras.cu_seqlens_k, "copy cu_seqlens_k to the device")?,
            seqused_k: copy(stream, extras.seqused_k, "copy seqused_k to the device")?,
            block_table: copy(stream, extras.block_table, "copy block_table to the device")?,
            alibi_slopes: copy(stream, extras.alibi_slopes, "copy alibi_slopes to the device")?,
        })
    }

    /// Views of them, as a device-resident call takes them (no LSE).
    pub fn arrays(&self) -> crate::indices::DeviceArrays<'_> {
        crate::indices::DeviceArrays {
            lse: None,
            cu_seqlens_q: self.cu_seqlens_q.as_ref().map(CudaSlice::as_view),
            cu_seqlens_k: self.cu_seqlens_k.as_ref().map(CudaSlice::as_view),
            seqused_k: self.seqused_k.as_ref().map(CudaSlice::as_view),
            block_table: self.block_table.as_ref().map(CudaSlice::as_view),
            alibi_slopes: self.alibi_slopes.as_ref().map(CudaSlice::as_view),
        }
    }

    /// Their device addresses (0 for an absent one).
    pub fn pointers(&self) -> ExtraPointers {
        fn ptr<T>(x: &Option<CudaSlice<T>>) -> u64 {
            x.as_ref().map_or(0, |x| x.device_ptr(x.stream()).0)
        }
        ExtraPointers {
            cu_seqlens_q: ptr(&self.cu_seqlens_q),
            cu_seqlens_k: ptr(&self.cu_seqlens_k),
            seqused_k: ptr(&self.seqused_k),
            block_table: ptr(&self.block_table),
            alibi_slopes: ptr(&self.alibi_slopes),
        }
    }
}

/// The device addresses of one call's tensors: what the kernels' parameter blocks hold, and what
/// the raw entry ([`crate::Cuda::run_raw`]) takes. Each tensor's elements are at the address plus
/// the offsets its strides give (`attn_core::Strides::offset`), in elements of the problem's
/// dtype; `lse` is `[batch, heads_q, seq_q]` f32, contiguous, where the problem asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePointers {
    /// Queries.
    pub q: u64,
    /// Keys.
    pub k: u64,
    /// Values.
    pub v: u64,
    /// The output.
    pub o: u64,
    /// The log-sum-exp, where the problem asks for it.
    pub lse: Option<u64>,
}

/// The raw bits of a 16-bit tensor (the kernel reinterprets them as f16 or bf16).
pub(crate) fn bits(data: Data<'_>, tensor: &'static str) -> Result<Vec<u16>> {
    match data {
        Data::F16(s) => Ok(s.iter().map(|x| x.to_bits()).collect()),
        Data::Bf16(s) => Ok(s.iter().map(|x| x.to_bits()).collect()),
        Data::F32(_) => Err(Error::Shape { tensor, what: "the cuda backend takes f16 or bf16".into() }),
    }
}

/// A host buffer of `dtype` from raw bits.
pub fn from_bits(dtype: DType, bits: Vec<u16>) -> Buffer {
    match dtype {
        DType::Bf16 => Buffer::Bf16(bits.into_iter().map(bf16::from_bits).collect()),
        _ => Buffer::F16(bits.into_iter().map(f16::from_bits).collect()),
    }
}

impl DeviceTensors {
    /// Copies q, k, v to the device and allocates o (and the LSE when asked for).
    pub fn upload(
        stream: &Arc<CudaStream>,
        problem: &Problem,
        inputs: &attn_core::Inputs<'_>,
    ) -> Result<Self> {
        let q = stream.clone_htod(&bits(inputs.q, "q")?).map_err(driver("copy q to the device"))?;
        let k = stream.clone_htod(&bits(inputs.k, "k")?).map_err(driver("copy k to the device"))?;
        let v = stream.clone_htod(&bits(inputs.v, "v")?).map_err(driver("copy v to the device"))?;
        let o = stream.alloc_zeros::<u16>(problem.required_lens()[3].1).map_err(driver("allocate o"))?;
        let lse = match problem.params.return_lse {
            true => Some(stream.alloc_zeros::<f32>(problem.lse_len()).map_err(driver("allocate lse"))?),
            false => None,
        };
        let extras = DeviceExtras::upload(stream, &inputs.extras)?;
        Ok(DeviceTensors { q, k, v, o, lse, extras })
    }

    /// Their device addresses. The stream-ordering guards cudarc returns are dropped: the
    /// host-copy path uses one stream, which orders every copy and launch already.
    pub fn pointers(&self) -> DevicePointers {
        let ptr = |x: &CudaSlice<u16>| x.device_ptr(x.stream()).0;
        DevicePointers {
            q: ptr(&self.q),
            k: ptr(&self.k),
            v: ptr(&self.v),
            o: ptr(&self.o),
            lse: self.lse.as_ref().map(|l| l.device_ptr(l.stream()).0),
        }
    }
}

/// 16-byte vector loads need every row to start on a 16-byte boundary: strides that are
/// multiples of 8 elements (buffers themselves are allocated aligned).
pub(crate) fn check_alignment(problem: &Problem) -> Result<()> {
    let t = problem.strides;
    for (name, st) in [("q", t.q), ("k", t.k), ("v", t.v), ("o", t.o)] {
        if [st.batch, st.head, st.seq].iter().any(|x| x % 8 != 0) {
            return Err(Error::Stride {
                tensor: name,
                strides: st.to_string(),
                what: "the cuda backend loads rows 16 bytes at a time: every stride must be a multiple of 8 elements"
                    .into(),
            });
        }
    }
    Ok(())
}

/// The problem's paged cache, where the kernels cannot take it: a page size that is a multiple
/// of 16 keeps every 16-key group of a tile on one page and every page's first row aligned to a
/// tile's 16-row groups (the Hopper family loads a tile a box of such groups at a time, the
/// Ampere/Ada family looks pages up per key row); page numbers and block-table indices must fit
/// 32 bits (TMA's coordinates, the kernels' indices).
pub(crate) fn check_paged_cache(problem: &Problem) -> Result<()> {
    match problem.batching.kv {
        KvRows::Paged { page_size, pages, pages_per_seq }
            if page_size % 16 != 0
                || pages > i32::MAX as usize
                || (problem.shape.batch as u128) * (pages_per_seq as u128) > i32::MAX as u128 =>
        {
            Err(Error::Unsupported {
                backend: "cuda".into(),
                what: format!(
                    "{problem}: a paged cache of {pages} pages of {page_size} keys, {pages_per_seq} block-table \
                     entries per sequence; the cuda backend takes page sizes that are multiples of 16, at most \
                     2^31 - 1 pages and 2^31 - 1 block-table entries"
                ),
            })
        }
        _ => Ok(()),
    }
}

/// The head dim of the kernel that runs head dim `d` in a family with kernels for `native` head
/// dims and padded builds for `padded` ones: `d` where it is native, else (a multiple of 8, the
/// rows' 16 bytes) the smallest of `padded` above it; `None` for any other head dim.
pub(crate) fn kernel_head_dim_of(d: usize, native: &[usize], padded: &[usize]) -> Option<usize> {
    if d == 0 || !d.is_multiple_of(8) {
        return None;
    }
    match native.contains(&d) {
        true => Some(d),
        false => padded.iter().copied().find(|&k| k >= d),
    }
}

/// That `problem` is valid and of what a family computes: f16 or bf16 (every family runs on
/// tensor cores) and a head dim it runs (`head_dim_ok`, the supported ones described by
/// `supported`, called only for the error); `backend` names the family in the error.
pub(crate) fn check_supported_by(
    problem: &Problem,
    backend: &str,
    head_dim_ok: bool,
    supported: impl FnOnce() -> String,
) -> Result<()> {
    problem.validate()?;
    if !matches!(problem.dtype, DType::F16 | DType::Bf16) {
        return Err(Error::UnsupportedDType {
            backend: backend.into(),
            dtype: problem.dtype,
            supported: "f16 and bf16 (tensor cores); use cpu-flash or wgpu for f32".into(),
        });
    }
    if !head_dim_ok {
        return Err(Error::UnsupportedHeadDim {
            backend: backend.into(),
            head_dim: problem.shape.head_dim,
            supported: supported(),
        });
    }
    Ok(())
}

/// A tensor's strides as a kernel's parameter block holds them: batch, head, row.
pub(crate) fn strides(s: Strides) -> [i64; 3] {
    [s.batch as i64, s.head as i64, s.seq as i64]
}
