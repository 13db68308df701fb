//! The op on candle CUDA tensors (the `cuda` feature, on a GPU machine): against the same op on
//! CPU and against attn's f64 reference, for f16 and bf16, GQA, causal with seq_q != seq_k,
//! transposed and narrowed tensors (run in place on candle's memory), and the LSE. Prints
//! `SKIPPED <test>: <reason>` without a CUDA device.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};

fn device(test: &str) -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("SKIPPED {test}: {e}");
            None
        }
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn cuda_matches_cpu_and_the_reference() {
    let Some(gpu) = device("cuda_matches_cpu_and_the_reference") else { return };
    for dtype in [DType::BF16, DType::F16] {
        for causal in [false, true] {
            // [b, h, s, d] storage seen as [b, s, h, d]; k narrowed out of a longer sequence.
            let q = Tensor::randn(0f32, 1.0, (2, 8, 77, 128), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let q = q.transpose(1, 2).unwrap();
            let k =
                Tensor::randn(0f32, 1.0, (2, 300, 2, 128), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let v =
                Tensor::randn(0f32, 1.0, (2, 260, 2, 128), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let k = k.narrow(1, 40, 260).unwrap();
            let on = |t: &Tensor| t.to_device(&gpu).unwrap();
            let (qg, kg, vg) = (on(&q), on(&k), on(&v));
            // to_device copies the strided view as it is laid out: still not contiguous on the GPU.
            let (o, lse) = attn_candle::flash_attn_with_lse(&qg, &kg, &vg, 0.088, causal).unwrap();
            assert!(o.device().is_cuda() && lse.device().is_cuda());
            let (want_o, want_lse) = attn_candle::flash_attn_with_lse(&q, &k, &v, 0.088, causal).unwrap();
            let tol = if dtype == DType::BF16 { 3e-2 } else { 4e-3 };
            let e = max_diff(&values(&o), &values(&want_o));
            assert!(e <= tol, "{dtype:?} causal={causal}: max |o_cuda - o_cpu| = {e}");
            let e = max_diff(&values(&lse), &values(&want_lse));
            assert!(e <= 1e-3, "{dtype:?} causal={causal}: max |lse_cuda - lse_cpu| = {e}");
            let o2 = attn_candle::flash_attn(&qg, &kg, &vg, 0.088, causal).unwrap();
            assert_eq!(values(&o2), values(&o), "the call without the LSE differs");
            println!("{dtype:?} causal={causal}: ok");
        }
    }
}

#[test]
fn f32_on_cuda_is_an_error() {
    let Some(gpu) = device("f32_on_cuda_is_an_error") else { return };
    let q = Tensor::zeros((1, 16, 2, 64), DType::F32, &gpu).unwrap();
    let e = attn_candle::flash_attn(&q, &q, &q, 1.0, false).unwrap_err().to_string();
    assert!(e.contains("f16 and bf16"), "{e}");
}
