//! The device-resident tensors of one prepared problem, as both kernel families read them.

use crate::driver;
use attn_core::{Buffer, DType, Data, Error, Problem, Result, Strides};
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
fn bits(data: Data<'_>, tensor: &'static str) -> Result<Vec<u16>> {
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
        Ok(DeviceTensors { q, k, v, o, lse })
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

/// That `problem` is valid and of what a family computes: f16 or bf16 (both families run on
/// tensor cores) and one of `head_dims`; `backend` names the family in the error.
pub(crate) fn check_supported(problem: &Problem, backend: &str, head_dims: &[usize]) -> Result<()> {
    problem.validate()?;
    if !matches!(problem.dtype, DType::F16 | DType::Bf16) {
        return Err(Error::UnsupportedDType {
            backend: backend.into(),
            dtype: problem.dtype,
            supported: "f16 and bf16 (tensor cores); use cpu-flash or wgpu for f32".into(),
        });
    }
    if !head_dims.contains(&problem.shape.head_dim) {
        return Err(Error::UnsupportedHeadDim {
            backend: backend.into(),
            head_dim: problem.shape.head_dim,
            supported: format!("{head_dims:?}"),
        });
    }
    Ok(())
}

/// A tensor's strides as a kernel's parameter block holds them: batch, head, row.
pub(crate) fn strides(s: Strides) -> [i64; 3] {
    [s.batch as i64, s.head as i64, s.seq as i64]
}
