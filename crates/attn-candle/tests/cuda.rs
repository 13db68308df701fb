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

fn randn(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// Cumulative offsets of `lens` as a u32 tensor on the CPU.
fn offsets(lens: &[usize]) -> Tensor {
    let mut sum = 0u32;
    let cu: Vec<u32> = std::iter::once(0)
        .chain(lens.iter().map(|&n| {
            sum += n as u32;
            sum
        }))
        .collect();
    Tensor::new(cu, &Device::Cpu).unwrap()
}

/// The CUDA result against the CPU one of the same call (cpu-flash, checked against the reference
/// in tests/cpu.rs), in the tensors' dtype.
fn close(what: &str, cuda: &Tensor, cpu: &Tensor, dtype: DType) {
    assert!(cuda.device().is_cuda(), "{what}: the output is not on CUDA");
    let tol = if dtype == DType::BF16 { 3e-2 } else { 4e-3 };
    let e = max_diff(&values(cuda), &values(cpu));
    assert!(e <= tol, "{what}: max |o_cuda - o_cpu| = {e}");
    println!("{what}: max |o_cuda - o_cpu| = {e}");
}

/// Packed sequences on CUDA, the offsets on the GPU (read in place) and on the CPU (uploaded),
/// as u32 and i32; an empty and a one-token sequence.
#[test]
fn varlen_on_cuda_matches_cpu() {
    let Some(gpu) = device("varlen_on_cuda_matches_cpu") else { return };
    let (q_lens, k_lens) = ([70usize, 0, 1, 130], [90usize, 3, 1, 200]);
    let (tq, tk) = (q_lens.iter().sum::<usize>(), k_lens.iter().sum::<usize>());
    for dtype in [DType::BF16, DType::F16] {
        let (q, k, v) = (randn(&[tq, 8, 64], dtype), randn(&[tk, 2, 64], dtype), randn(&[tk, 2, 64], dtype));
        let on = |t: &Tensor| t.to_device(&gpu).unwrap();
        for causal in [false, true] {
            let (cq, ck) = (offsets(&q_lens), offsets(&k_lens));
            let want = attn_candle::flash_attn_varlen(&q, &k, &v, &cq, &ck, 130, 200, 0.125, causal).unwrap();
            for (where_, cq2, ck2) in [
                ("on the GPU, u32", on(&cq), on(&ck)),
                ("on the CPU, u32", cq.clone(), ck.clone()),
                (
                    "on the GPU, i32",
                    on(&cq.to_dtype(DType::I32).unwrap()),
                    on(&ck.to_dtype(DType::I32).unwrap()),
                ),
            ] {
                let o = attn_candle::flash_attn_varlen(
                    &on(&q),
                    &on(&k),
                    &on(&v),
                    &cq2,
                    &ck2,
                    130,
                    200,
                    0.125,
                    causal,
                )
                .unwrap();
                close(&format!("varlen {dtype:?} causal={causal}, offsets {where_}"), &o, &want, dtype);
            }
        }
    }
}

/// ALiBi (per head and per (batch, head)), alone and with a window and a soft-cap, on CUDA.
#[test]
fn alibi_on_cuda_matches_cpu() {
    let Some(gpu) = device("alibi_on_cuda_matches_cpu") else { return };
    let dtype = DType::BF16;
    let (q, k, v) =
        (randn(&[2, 77, 8, 64], dtype), randn(&[2, 300, 2, 64], dtype), randn(&[2, 300, 2, 64], dtype));
    let on = |t: &Tensor| t.to_device(&gpu).unwrap();
    let per_head: Vec<f32> = (1..=8).map(|h| 0.5f32.powi(h)).collect();
    let per_batch: Vec<f32> = per_head.iter().chain(&per_head).map(|x| x * 0.7).collect();
    for (name, slopes) in [
        ("per head", Tensor::new(per_head.as_slice(), &Device::Cpu).unwrap()),
        ("per batch and head", Tensor::from_vec(per_batch, (2, 8), &Device::Cpu).unwrap()),
    ] {
        for causal in [false, true] {
            let want = attn_candle::flash_attn_alibi(&q, &k, &v, &slopes, 0.125, causal).unwrap();
            let o = attn_candle::flash_attn_alibi(&on(&q), &on(&k), &on(&v), &on(&slopes), 0.125, causal)
                .unwrap();
            close(&format!("alibi {name} causal={causal}"), &o, &want, dtype);
        }
        let all = |q: &Tensor, k: &Tensor, v: &Tensor, s: &Tensor| {
            attn_candle::flash_attn_alibi_windowed_softcap(
                q,
                k,
                v,
                Some(s),
                0.125,
                Some(64),
                Some(0),
                Some(20.0),
            )
            .unwrap()
        };
        let want = all(&q, &k, &v, &slopes);
        close(
            &format!("alibi {name}, window and soft-cap"),
            &all(&on(&q), &on(&k), &on(&v), &on(&slopes)),
            &want,
            dtype,
        );
    }
}

/// `flash_attn_with_kvcache` on CUDA, dense and paged (16-key pages, shuffled), the key counts and
/// block table on the GPU.
#[test]
fn kvcache_on_cuda_matches_cpu() {
    let Some(gpu) = device("kvcache_on_cuda_matches_cpu") else { return };
    let dtype = DType::F16;
    let on = |t: &Tensor| t.to_device(&gpu).unwrap();
    let q = randn(&[3, 1, 8, 64], dtype);
    let seqlens = Tensor::new(&[50u32, 0, 64], &Device::Cpu).unwrap();
    let table = Tensor::new(&[[4u32, 0, 7, 9], [2, 8, 5, 10], [1, 6, 3, 11]], &Device::Cpu).unwrap();
    for paged in [false, true] {
        let (kc, vc) = match paged {
            false => (randn(&[3, 64, 2, 64], dtype), randn(&[3, 64, 2, 64], dtype)),
            true => (randn(&[12, 16, 2, 64], dtype), randn(&[12, 16, 2, 64], dtype)),
        };
        let bt = paged.then_some(&table);
        let want = attn_candle::flash_attn_with_kvcache(&q, &kc, &vc, None, None, &seqlens, bt, 0.125, true)
            .unwrap();
        let bt_gpu = bt.map(on);
        let o = attn_candle::flash_attn_with_kvcache(
            &on(&q),
            &on(&kc),
            &on(&vc),
            None,
            None,
            &on(&seqlens),
            bt_gpu.as_ref(),
            0.125,
            true,
        )
        .unwrap();
        close(&format!("kvcache paged={paged}"), &o, &want, dtype);
    }
}

/// Appending `k_new`/`v_new` on CUDA (`kernels/append.cu`), dense and paged caches, the counts
/// and block table on the GPU: two decode steps of 1 and then 3 new rows (crossing a page), each
/// leaving the caches bit for bit as the CPU append does and giving the CPU's output; the
/// caller's `cache_seqlens` unchanged.
#[test]
fn kvcache_append_on_cuda_matches_cpu() {
    let Some(gpu) = device("kvcache_append_on_cuda_matches_cpu") else { return };
    let dtype = DType::BF16;
    let on = |t: &Tensor| t.to_device(&gpu).unwrap();
    let seqlens = Tensor::new(&[50i32, 0, 60], &Device::Cpu).unwrap();
    let table = Tensor::new(&[[4u32, 0, 7, 9], [2, 8, 5, 10], [1, 6, 3, 11]], &Device::Cpu).unwrap();
    let bits = |t: &Tensor| t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
    for paged in [false, true] {
        let (kc, vc) = match paged {
            false => (randn(&[3, 64, 2, 64], dtype), randn(&[3, 64, 2, 64], dtype)),
            true => (randn(&[12, 16, 2, 64], dtype), randn(&[12, 16, 2, 64], dtype)),
        };
        let (kc_gpu, vc_gpu, seqlens_gpu) = (on(&kc), on(&vc), on(&seqlens));
        let bt = paged.then_some(&table);
        let bt_gpu = bt.map(on);
        let mut used = seqlens.clone();
        let mut used_gpu = seqlens_gpu.clone();
        for len in [1, 3] {
            let q = randn(&[3, len, 8, 64], dtype);
            let (k_new, v_new) = (randn(&[3, len, 2, 64], dtype), randn(&[3, len, 2, 64], dtype));
            let want = attn_candle::flash_attn_with_kvcache(
                &q,
                &kc,
                &vc,
                Some(&k_new),
                Some(&v_new),
                &used,
                bt,
                0.125,
                true,
            )
            .unwrap();
            let o = attn_candle::flash_attn_with_kvcache(
                &on(&q),
                &kc_gpu,
                &vc_gpu,
                Some(&on(&k_new)),
                Some(&on(&v_new)),
                &used_gpu,
                bt_gpu.as_ref(),
                0.125,
                true,
            )
            .unwrap();
            let what = format!("append paged={paged} len={len}");
            assert!(bits(&kc_gpu) == bits(&kc), "{what}: the key cache differs from the CPU append");
            assert!(bits(&vc_gpu) == bits(&vc), "{what}: the value cache differs from the CPU append");
            close(&what, &o, &want, dtype);
            assert_eq!(
                used_gpu.to_vec1::<i32>().unwrap(),
                used.to_vec1::<i32>().unwrap(),
                "{what}: cache_seqlens changed"
            );
            let next: Vec<i32> = used.to_vec1::<i32>().unwrap().iter().map(|n| n + len as i32).collect();
            used = Tensor::new(next, &Device::Cpu).unwrap();
            used_gpu = on(&used);
        }
    }
}

/// The op's gradients on CUDA (attn's CUDA backward on candle's stream) equal its gradients on
/// the CPU (cpu-flash's backward) within bf16/f16 rounding: GQA, causal with seq_q != seq_k, a
/// strided q, a loss through `Var`s.
#[test]
fn gradients_on_cuda_match_cpu() {
    use candle_core::Var;
    let Some(gpu) = device("gradients_on_cuda_match_cpu") else { return };
    for dtype in [DType::BF16, DType::F16] {
        let q = randn(&[2, 8, 70, 64], dtype).transpose(1, 2).unwrap();
        let k = randn(&[2, 150, 2, 64], dtype);
        let v = randn(&[2, 150, 2, 64], dtype);
        let d_o = randn(&[2, 70, 8, 64], dtype);
        let grads = |dev: &Device| {
            let vars = [&q, &k, &v].map(|t| Var::from_tensor(&t.to_device(dev).unwrap()).unwrap());
            let o = attn_candle::flash_attn(&vars[0], &vars[1], &vars[2], 0.125, true).unwrap();
            let loss = (o.to_dtype(DType::F32).unwrap()
                * d_o.to_device(dev).unwrap().to_dtype(DType::F32).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
            let store = loss.backward().unwrap();
            vars.map(|x| values(store.get(&x).unwrap()))
        };
        let (cuda, cpu) = (grads(&gpu), grads(&Device::Cpu));
        for ((name, a), b) in ["dq", "dk", "dv"].iter().zip(&cuda).zip(&cpu) {
            let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let tol = if dtype == DType::BF16 { 2e-2 } else { 4e-3 } * scale.max(1.0);
            assert!(max_diff(a, b) < tol, "{dtype:?} {name}: {} (largest {scale})", max_diff(a, b));
        }
    }
}
