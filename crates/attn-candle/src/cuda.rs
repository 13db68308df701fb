//! The op's CUDA path: attn's kernels on candle's stream and memory, through
//! `attn_cuda`'s device-resident calls (`Cuda::run_on_stream`).

use attn_core::{DType, Problem};
use attn_cuda::Cuda;
use candle_core::Layout;
use candle_core::cuda_backend::{CudaDType, CudaStorage};
use cudarc::driver::{CudaSlice, CudaView};
use std::sync::OnceLock;

/// The CUDA backend the ops share: kernels compiled once per process, loaded once per context,
/// plans kept per (context, problem).
fn backend() -> &'static Cuda {
    static CUDA: OnceLock<Cuda> = OnceLock::new();
    CUDA.get_or_init(Cuda::new)
}

/// Runs `problem` on candle's storages (q, k, v with their layouts) on candle's stream: the
/// output (and the LSE, where the problem asks for it) in new storages of candle's device.
pub fn forward(
    problem: &Problem,
    s: [&CudaStorage; 3],
    l: [&Layout; 3],
) -> candle_core::Result<(CudaStorage, Option<CudaStorage>)> {
    match problem.dtype {
        DType::F16 => run::<half::f16>(problem, s, l),
        DType::Bf16 => run::<half::bf16>(problem, s, l),
        DType::F32 => Err(candle_core::Error::Msg(
            "attn: the CUDA kernels take f16 and bf16 (f32 runs on the CPU)".into(),
        )),
    }
}

fn run<T: CudaDType + attn_cuda::DeviceElement + cudarc::driver::DeviceRepr>(
    problem: &Problem,
    s: [&CudaStorage; 3],
    l: [&Layout; 3],
) -> candle_core::Result<(CudaStorage, Option<CudaStorage>)> {
    let device = s[0].device.clone();
    let stream = device.cuda_stream();
    let wrap = candle_core::Error::wrap;
    let plan = backend().plan_cached(stream.context(), problem).map_err(wrap)?;
    let (q, k, v) = (view::<T>(s[0], l[0])?, view::<T>(s[1], l[1])?, view::<T>(s[2], l[2])?);
    // SAFETY: every element of o (and of the LSE) is written by the kernel before it is read.
    let mut o: CudaSlice<T> = unsafe { device.alloc::<T>(problem.required_lens()[3].1) }?;
    let mut lse = match problem.params.return_lse {
        // SAFETY: as for o.
        true => Some(unsafe { device.alloc::<f32>(problem.lse_len()) }?),
        false => None,
    };
    let mut lse_view = lse.as_mut().map(|l| l.as_view_mut());
    backend().run_on_stream(&plan, &q, &k, &v, &mut o, lse_view.as_mut(), &stream).map_err(wrap)?;
    let o = CudaStorage::wrap_cuda_slice(o, device.clone());
    Ok((o, lse.map(|l| CudaStorage::wrap_cuda_slice(l, device))))
}

/// A tensor's storage from its layout's first element on: the problem's strides address it from
/// there.
fn view<'a, T: CudaDType>(x: &'a CudaStorage, l: &Layout) -> candle_core::Result<CudaView<'a, T>> {
    Ok(x.as_cuda_slice::<T>()?.slice(l.start_offset()..))
}
