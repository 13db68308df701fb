//! The ops' backward pass on CPU tensors: attn's cpu-flash backward, fed by the LSE the forward
//! kept.
//!
//! candle hands `bwd` the op's inputs, its output and the output's gradient. The gradients come
//! back contiguous in the inputs' shapes (candle adds them into its gradient store, which takes
//! any layout); strided inputs are read through a contiguous copy here, since the gradients are
//! laid out as the inputs are and must not share a view's gaps.

use crate::{AttnOp, cpu_flash};
use attn_core::{Attention, BackwardOptions, Buffer, GradInputs, Gradients, Inputs};
use candle_core::{DType, Device, Tensor};

/// `[dq, dk, dv]` of `[q, k, v, o, d_o]` on the CPU.
pub(crate) fn cpu(op: &AttnOp, tensors: [&Tensor; 5]) -> candle_core::Result<[Tensor; 3]> {
    let msg = |m: String| candle_core::Error::Msg(m);
    if !tensors[0].device().is_cpu() {
        return Err(msg(
            "attn: the backward pass's tensors must be on the CPU here (CUDA tensors need the `cuda` feature)"
                .into(),
        ));
    }
    let lse =
        op.saved_lse.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or_else(|| {
            msg("attn: backward before the op's forward ran on the CPU (no LSE kept)".into())
        })?;
    let [q, k, v, o, d_o] = tensors.map(Tensor::contiguous);
    let (q, k, v, o, d_o) = (q?, k?, v?, o?, d_o?);
    let problem = op.problem(q.dtype(), [q.layout(), k.layout(), v.layout()])?.with_lse(true);
    let extras = op.host_extras()?;
    let host = |t: &Tensor| -> candle_core::Result<Buffer> {
        let flat = t.flatten_all()?;
        Ok(match t.dtype() {
            DType::F32 => Buffer::F32(flat.to_vec1()?),
            DType::F16 => Buffer::F16(flat.to_vec1()?),
            DType::BF16 => Buffer::Bf16(flat.to_vec1()?),
            other => return Err(msg(format!("attn: dtype {other:?} (f32, f16 and bf16 run)"))),
        })
    };
    let [hq, hk, hv, ho, hd] = [&q, &k, &v, &o, &d_o].map(host);
    let (hq, hk, hv, ho, hd) = (hq?, hk?, hv?, ho?, hd?);
    let mut grads = [&q, &k, &v].map(|t| Buffer::zeros(problem.dtype, t.elem_count()));
    let [gq, gk, gv] = &mut grads;
    let inputs = Inputs::new(hq.as_data(), hk.as_data(), hv.as_data()).with_extras(extras.borrow());
    cpu_flash()
        .backward(
            &problem,
            BackwardOptions::default(),
            GradInputs { inputs, o: ho.as_data(), lse: &lse, d_o: hd.as_data() },
            Gradients { dq: gq.as_data_mut(), dk: gk.as_data_mut(), dv: gv.as_data_mut() },
        )
        .map_err(candle_core::Error::wrap)?;
    let [gq, gk, gv] = grads;
    let tensor = |b: Buffer, like: &Tensor| match b {
        Buffer::F32(x) => Tensor::from_vec(x, like.shape(), &Device::Cpu),
        Buffer::F16(x) => Tensor::from_vec(x, like.shape(), &Device::Cpu),
        Buffer::Bf16(x) => Tensor::from_vec(x, like.shape(), &Device::Cpu),
    };
    Ok([tensor(gq, &q)?, tensor(gk, &k)?, tensor(gv, &v)?])
}
