//! The kernel's parameter block and the device-resident state of one prepared problem.

use crate::driver;
use attn_core::{Buffer, DType, Data, Error, Problem, Result, Strides};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use half::{bf16, f16};
use std::sync::Arc;

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
}

// SAFETY: plain old data of the layout the kernel declares (repr(C), no padding beyond C's).
unsafe impl DeviceRepr for KernelParams {}

fn strides(s: Strides) -> [i64; 3] {
    [s.batch as i64, s.head as i64, s.seq as i64]
}

/// Device copies of the inputs and room for the outputs.
pub struct DeviceTensors {
    pub q: CudaSlice<u16>,
    pub k: CudaSlice<u16>,
    pub v: CudaSlice<u16>,
    pub o: CudaSlice<u16>,
    pub lse: Option<CudaSlice<f32>>,
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

    /// The parameter block for `problem` over these buffers.
    pub fn params(&self, stream: &CudaStream, problem: &Problem) -> KernelParams {
        let s = problem.shape;
        let t = problem.strides;
        // The pointers stay valid while `self` lives; the SyncOnDrop guards only matter for
        // cudarc's multi-stream event tracking, which one stream does not need.
        let ptr = |x: &CudaSlice<u16>| x.device_ptr(stream).0;
        KernelParams {
            q: ptr(&self.q),
            k: ptr(&self.k),
            v: ptr(&self.v),
            o: ptr(&self.o),
            lse: self.lse.as_ref().map_or(0, |l| l.device_ptr(stream).0),
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
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn layout_matches_the_kernel() {
        // 5 pointers + 12 strides (8 bytes each) + 5 ints + 1 float = 160 bytes, no padding.
        assert_eq!(std::mem::size_of::<super::KernelParams>(), 160);
        assert_eq!(std::mem::align_of::<super::KernelParams>(), 8);
    }
}
