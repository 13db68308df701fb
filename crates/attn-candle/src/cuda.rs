//! The op's CUDA path: attn's kernels on candle's stream and memory, through
//! `attn_cuda`'s device-resident calls (`Cuda::run_on_stream`). Index tensors (offsets, key
//! counts, block tables, ALiBi slopes) are read in place as device memory too.

use crate::Index;
use attn_core::{DType, Problem};
use attn_cuda::{Cuda, DeviceArrays};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::{CudaDType, CudaStorage};
use candle_core::{Layout, Storage, Tensor};
use cudarc::driver::{CudaSlice, CudaView};
use std::sync::OnceLock;

/// The CUDA backend the ops share: kernels compiled once per process, loaded once per context,
/// plans kept per (context, problem).
fn backend() -> &'static Cuda {
    static CUDA: OnceLock<Cuda> = OnceLock::new();
    CUDA.get_or_init(Cuda::new)
}

/// The call's index tensors: cu_seqlens_q, cu_seqlens_k, seqused_k, block_table (each where the
/// call has it), and the ALiBi slopes (f32).
pub(crate) type IndexTensors<'a> = ([Option<&'a Index>; 4], Option<&'a Tensor>);

/// Runs `problem` on candle's storages (q, k, v with their layouts) and index tensors on
/// candle's stream: the output (and the LSE, where the problem asks for it) in new storages of
/// candle's device.
pub fn forward(
    problem: &Problem,
    s: [&CudaStorage; 3],
    l: [&Layout; 3],
    index: IndexTensors<'_>,
) -> candle_core::Result<(CudaStorage, Option<CudaStorage>)> {
    match problem.dtype {
        DType::F16 => run::<half::f16>(problem, s, l, index),
        DType::Bf16 => run::<half::bf16>(problem, s, l, index),
        DType::F32 => Err(candle_core::Error::Msg(
            "attn: the CUDA kernels take f16 and bf16 (f32 runs on the CPU)".into(),
        )),
    }
}

fn run<T: CudaDType + attn_cuda::DeviceElement + cudarc::driver::DeviceRepr>(
    problem: &Problem,
    s: [&CudaStorage; 3],
    l: [&Layout; 3],
    (ints, slopes): IndexTensors<'_>,
) -> candle_core::Result<(CudaStorage, Option<CudaStorage>)> {
    let device = s[0].device.clone();
    let stream = device.cuda_stream();
    let wrap = candle_core::Error::wrap;
    let plan = backend().plan_cached(stream.context(), problem).map_err(wrap)?;
    let (q, k, v) = (view::<T>(s[0], l[0])?, view::<T>(s[1], l[1])?, view::<T>(s[2], l[2])?);
    // The index tensors' storages, read-locked for the call (their views borrow them).
    let int_storages = ints.map(|i| i.map(|i| (i.tensor.storage_and_layout(), i.name)));
    let slope_storage = slopes.map(|t| t.storage_and_layout());
    let (int_views, alibi_slopes) = index_views(&int_storages, &slope_storage)?;
    // SAFETY: every element of o (and of the LSE) is written by the kernel before it is read.
    let mut o: CudaSlice<T> = unsafe { device.alloc::<T>(problem.required_lens()[3].1) }?;
    let mut lse = match problem.params.return_lse {
        // SAFETY: as for o.
        true => Some(unsafe { device.alloc::<f32>(problem.lse_len()) }?),
        false => None,
    };
    let [cu_seqlens_q, cu_seqlens_k, seqused_k, block_table] = int_views;
    let arrays = DeviceArrays {
        lse: lse.as_mut().map(|l| l.as_view_mut()),
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        block_table,
        alibi_slopes,
    };
    backend().run_on_stream(&plan, &q, &k, &v, &mut o, arrays, &stream).map_err(wrap)?;
    let o = CudaStorage::wrap_cuda_slice(o, device.clone());
    Ok((o, lse.map(|l| CudaStorage::wrap_cuda_slice(l, device))))
}

/// The index tensors' and slopes' device memory, in place.
#[allow(clippy::type_complexity)]
fn index_views<'a>(
    ints: &'a [Option<((candle_core::StorageRef<'_>, &Layout), &'static str)>; 4],
    slopes: &'a Option<(candle_core::StorageRef<'_>, &Layout)>,
) -> candle_core::Result<([Option<CudaView<'a, i32>>; 4], Option<CudaView<'a, f32>>)> {
    let mut views: [Option<CudaView<'_, i32>>; 4] = Default::default();
    for (view, given) in views.iter_mut().zip(ints) {
        if let Some(((storage, layout), name)) = given {
            *view = Some(int_view(storage, layout, name)?);
        }
    }
    let slopes = match slopes {
        Some((storage, layout)) => Some(float_view(storage, layout)?),
        None => None,
    };
    Ok((views, slopes))
}

/// The backward pass of `problem` on candle's CUDA tensors `[q, k, v, o, d_o]` (contiguous) and
/// the forward's LSE, on candle's stream: `[dq, dk, dv]` in new tensors of the inputs' shapes.
pub(crate) fn backward(
    problem: &Problem,
    t: [&Tensor; 5],
    lse: &CudaStorage,
    index: IndexTensors<'_>,
) -> candle_core::Result<[Tensor; 3]> {
    match problem.dtype {
        DType::F16 => backward_typed::<half::f16>(problem, t, lse, index),
        DType::Bf16 => backward_typed::<half::bf16>(problem, t, lse, index),
        DType::F32 => Err(candle_core::Error::Msg(
            "attn: the CUDA kernels take f16 and bf16 (f32 runs on the CPU)".into(),
        )),
    }
}

fn backward_typed<
    T: CudaDType + attn_cuda::DeviceElement + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits,
>(
    problem: &Problem,
    t: [&Tensor; 5],
    lse: &CudaStorage,
    (ints, slopes): IndexTensors<'_>,
) -> candle_core::Result<[Tensor; 3]> {
    let wrap = candle_core::Error::wrap;
    let locked = t.map(|x| x.storage_and_layout());
    let cuda = |i: usize| match &*locked[i].0 {
        Storage::Cuda(s) => Ok(s),
        _ => Err(candle_core::Error::Msg("attn: the backward's tensors must all be on CUDA".into())),
    };
    let device = cuda(0)?.device.clone();
    let stream = device.cuda_stream();
    let plan = backend().plan_backward_on(stream.context(), problem, Default::default()).map_err(wrap)?;
    let int_storages = ints.map(|i| i.map(|i| (i.tensor.storage_and_layout(), i.name)));
    let slope_storage = slopes.map(|t| t.storage_and_layout());
    let (int_views, alibi_slopes) = index_views(&int_storages, &slope_storage)?;
    let [cu_seqlens_q, cu_seqlens_k, seqused_k, block_table] = int_views;
    let arrays = DeviceArrays { lse: None, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes };
    let [q_len, k_len, v_len, _] = problem.required_lens().map(|(_, n)| n);
    let mut grads =
        [device.alloc_zeros::<T>(q_len)?, device.alloc_zeros::<T>(k_len)?, device.alloc_zeros::<T>(v_len)?];
    {
        let [dq, dk, dv] = &mut grads;
        let tensors = attn_cuda::backward::DeviceGrads {
            q: view::<T>(cuda(0)?, locked[0].1)?,
            k: view::<T>(cuda(1)?, locked[1].1)?,
            v: view::<T>(cuda(2)?, locked[2].1)?,
            o: view::<T>(cuda(3)?, locked[3].1)?,
            lse: lse.as_cuda_slice::<f32>()?.slice(..),
            d_o: view::<T>(cuda(4)?, locked[4].1)?,
            dq: dq.slice_mut(..),
            dk: dk.slice_mut(..),
            dv: dv.slice_mut(..),
        };
        backend().backward_on_stream(&plan, tensors, arrays, &stream).map_err(wrap)?;
    }
    let [dq, dk, dv] = grads;
    let tensor = |slice: CudaSlice<T>, like: &Tensor| {
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, device.clone()));
        Tensor::from_storage(storage, like.shape().clone(), candle_core::op::BackpropOp::none(), false)
    };
    Ok([tensor(dq, t[0]), tensor(dk, t[1]), tensor(dv, t[2])])
}

/// A tensor's storage from its layout's first element on: the problem's strides address it from
/// there.
fn view<'a, T: CudaDType>(x: &'a CudaStorage, l: &Layout) -> candle_core::Result<CudaView<'a, T>> {
    Ok(x.as_cuda_slice::<T>()?.slice(l.start_offset()..))
}

/// The CUDA storage of an index tensor (flat and contiguous: `Index::new` made it so).
fn cuda_of<'a>(
    storage: &'a Storage,
    layout: &Layout,
    name: &str,
) -> candle_core::Result<(&'a CudaStorage, usize, usize)> {
    match storage {
        Storage::Cuda(s) if layout.is_contiguous() => {
            Ok((s, layout.start_offset(), layout.shape().elem_count()))
        }
        Storage::Cuda(_) => Err(candle_core::Error::Msg(format!("attn: {name} must be contiguous"))),
        _ => Err(candle_core::Error::Msg(format!("attn: {name} is not on CUDA, q is"))),
    }
}

/// An index tensor (u32 or i32) as i32 device memory, in place.
fn int_view<'a>(storage: &'a Storage, layout: &Layout, name: &str) -> candle_core::Result<CudaView<'a, i32>> {
    let (s, at, n) = cuda_of(storage, layout, name)?;
    match s.dtype() {
        candle_core::DType::I32 => Ok(s.as_cuda_slice::<i32>()?.slice(at..at + n)),
        candle_core::DType::U32 => {
            let u = s.as_cuda_slice::<u32>()?.slice(at..at + n);
            // SAFETY: u32 and i32 have the same size and every bit pattern is valid in both (a
            // value past i32::MAX reads negative, and the kernels clamp it into bounds).
            unsafe { u.transmute::<i32>(n) }.ok_or_else(|| {
                candle_core::Error::Msg(format!("attn: {name}: a view of {n} i32 does not fit"))
            })
        }
        other => Err(candle_core::Error::Msg(format!("attn: {name} holds {other:?}; u32 or i32 expected"))),
    }
}

/// ALiBi slopes (f32) as device memory, in place.
fn float_view<'a>(storage: &'a Storage, layout: &Layout) -> candle_core::Result<CudaView<'a, f32>> {
    let (s, at, n) = cuda_of(storage, layout, "alibi_slopes")?;
    Ok(s.as_cuda_slice::<f32>()?.slice(at..at + n))
}

/// The index tensors of an append: the counts before it, the block table of a paged cache, and
/// whether to make the counts after it.
pub(crate) struct AppendIndex<'a> {
    pub(crate) seqused: &'a Index,
    pub(crate) table: Option<&'a Index>,
    pub(crate) counts: bool,
}

/// Appends the rows of `new` into the cache tensor `dst` (in place) on candle's stream
/// (`Cuda::append_rows_on_stream`: `kernels/append.cu`); returns the counts after the append in
/// a new `[batch]` i32 storage where `index.counts` asks for them.
pub(crate) fn append(
    cache: &Problem,
    tensor: attn_core::CacheTensor,
    dst: (&mut CudaStorage, &Layout),
    new: (&CudaStorage, &Layout),
    strides: attn_core::Strides,
    len: usize,
    index: AppendIndex<'_>,
) -> candle_core::Result<Option<CudaStorage>> {
    match cache.dtype {
        DType::F16 => append_typed::<half::f16>(cache, tensor, dst, new, strides, len, index),
        DType::Bf16 => append_typed::<half::bf16>(cache, tensor, dst, new, strides, len, index),
        DType::F32 => Err(candle_core::Error::Msg(
            "attn: the CUDA kernels take f16 and bf16 (f32 runs on the CPU)".into(),
        )),
    }
}

fn append_typed<T: CudaDType + attn_cuda::DeviceElement + cudarc::driver::DeviceRepr>(
    cache: &Problem,
    tensor: attn_core::CacheTensor,
    (dst, dst_layout): (&mut CudaStorage, &Layout),
    (new, new_layout): (&CudaStorage, &Layout),
    strides: attn_core::Strides,
    len: usize,
    index: AppendIndex<'_>,
) -> candle_core::Result<Option<CudaStorage>> {
    let device = dst.device.clone();
    let stream = device.cuda_stream();
    let used_storage = index.seqused.tensor.storage_and_layout();
    let table_storage = index.table.map(|t| (t.tensor.storage_and_layout(), t.name));
    let seqused_k = int_view(&used_storage.0, used_storage.1, index.seqused.name)?;
    let block_table = match &table_storage {
        Some(((storage, layout), name)) => Some(int_view(storage, layout, name)?),
        None => None,
    };
    let mut counts = match index.counts {
        true => Some(device.alloc_zeros::<i32>(cache.shape.batch)?),
        false => None,
    };
    let at = dst_layout.start_offset();
    let mut dst_view = dst.as_cuda_slice_mut::<T>()?.slice_mut(at..);
    let new_view = view::<T>(new, new_layout)?;
    let arrays = attn_cuda::AppendArrays {
        seqused_k,
        block_table,
        counts_after: counts.as_mut().map(|c| c.as_view_mut()),
    };
    backend()
        .append_rows_on_stream(cache, tensor, &mut dst_view, &new_view, strides, len, arrays, &stream)
        .map_err(candle_core::Error::wrap)?;
    Ok(counts.map(|c| CudaStorage::wrap_cuda_slice(c, device)))
}
