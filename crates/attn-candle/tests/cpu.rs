//! The op on candle CPU tensors against attn's exact f64 reference, and against candle's own
//! matmul-softmax attention: contiguous, transposed and narrowed tensors (run in place), GQA,
//! causal with seq_q != seq_k, the LSE, and the errors for what it does not take.

use attn_core::{Attention, Buffer, Inputs, Outputs, Problem};
use candle_core::{D, DType, Device, IndexOp, Tensor};

/// attn's f64 reference on the same values (copied to contiguous BSHD buffers): o as f32 in
/// `[b, s, h, d]` order, and the LSE.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, causal: bool) -> (Vec<f32>, Vec<f32>) {
    let (b, sq, hq, d) = q.dims4().unwrap();
    let (_, sk, hk, _) = k.dims4().unwrap();
    let shape = attn_core::Shape { batch: b, heads_q: hq, heads_kv: hk, seq_q: sq, seq_k: sk, head_dim: d };
    let mut p = Problem::new(shape, attn_core::DType::F32)
        .with_layout(attn_core::Layout::Bshd)
        .with_scale(scale)
        .with_lse(true);
    if causal {
        p = p.causal();
    }
    let flat =
        |t: &Tensor| Buffer::F32(t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap());
    let (q, k, v) = (flat(q), flat(k), flat(v));
    let mut o = Buffer::zeros(attn_core::DType::F32, p.required_lens()[3].1);
    let mut lse = vec![0f32; p.lse_len()];
    attn_cpu::Reference
        .forward(
            &p,
            Inputs::new(q.as_data(), k.as_data(), v.as_data()),
            Outputs { o: o.as_data_mut(), lse: Some(&mut lse) },
        )
        .unwrap();
    (o.to_f32_vec(), lse)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// candle's own attention: repeat the key/value heads, q·kᵀ·scale, a bottom-right causal mask,
/// softmax, ·v; in `[b, s, h, d]` order.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, causal: bool) -> Tensor {
    let (_, sq, hq, _) = q.dims4().unwrap();
    let (_, sk, hk, _) = k.dims4().unwrap();
    let rep = |t: &Tensor| {
        let t = t.transpose(1, 2).unwrap(); // [b, h, s, d]
        let (b, h, s, d) = t.dims4().unwrap();
        t.unsqueeze(2).unwrap().expand((b, h, hq / hk, s, d)).unwrap().reshape((b, hq, s, d)).unwrap()
    };
    let q = q.transpose(1, 2).unwrap().contiguous().unwrap();
    let (k, v) = (rep(k).contiguous().unwrap(), rep(v).contiguous().unwrap());
    let mut s = (q.matmul(&k.t().unwrap()).unwrap() * scale as f64).unwrap();
    if causal {
        let mask: Vec<f32> = (0..sq)
            .flat_map(|i| (0..sk).map(move |j| if j + sq > i + sk { f32::NEG_INFINITY } else { 0.0 }))
            .collect();
        let mask = Tensor::from_vec(mask, (sq, sk), &Device::Cpu).unwrap().to_dtype(s.dtype()).unwrap();
        s = s.broadcast_add(&mask).unwrap();
    }
    // The composed softmax (max, exp, sum), which candle differentiates; `softmax_last_dim` has no backward.
    let p = candle_nn::ops::softmax(&s, D::Minus1).unwrap();
    p.matmul(&v).unwrap().transpose(1, 2).unwrap()
}

fn randn(shape: (usize, usize, usize, usize), dtype: DType) -> Tensor {
    Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

#[test]
fn matches_the_reference_in_every_dtype_with_gqa_and_a_causal_offset() {
    for (dtype, tol) in [(DType::F32, 2e-5), (DType::F16, 2e-3), (DType::BF16, 2e-2)] {
        for causal in [false, true] {
            let q = randn((2, 37, 8, 64), dtype);
            let k = randn((2, 90, 2, 64), dtype);
            let v = randn((2, 90, 2, 64), dtype);
            let (o, lse) = attn_candle::flash_attn_with_lse(&q, &k, &v, 0.125, causal).unwrap();
            assert_eq!(o.dims(), &[2, 37, 8, 64]);
            assert_eq!((o.dtype(), lse.dims()), (dtype, &[2usize, 8, 37][..]));
            let (want_o, want_lse) = reference(&q, &k, &v, 0.125, causal);
            let e = max_diff(&values(&o), &want_o);
            assert!(e <= tol, "{dtype:?} causal={causal}: max |o - reference| = {e}");
            let e = max_diff(&values(&lse), &want_lse);
            assert!(e <= 1e-4, "{dtype:?} causal={causal}: max |lse - reference| = {e}");
            // The plain call gives the same output as the one with the LSE.
            let o2 = attn_candle::flash_attn(&q, &k, &v, 0.125, causal).unwrap();
            assert_eq!(values(&o2), values(&o));
        }
    }
}

/// Causal with more queries than keys: the first rows see no key, so their output is 0 and
/// their LSE -inf (every element of both written, none left as allocated).
#[test]
fn rows_that_see_no_key_are_zero_with_an_lse_of_minus_infinity() {
    let q = randn((1, 10, 2, 32), DType::F32);
    let k = randn((1, 4, 2, 32), DType::F32);
    let (o, lse) = attn_candle::flash_attn_with_lse(&q, &k, &k, 0.2, true).unwrap();
    let (o, lse) = (values(&o), values(&lse));
    // Rows 0..6 of each head see nothing; rows 6..10 see 1..4 keys.
    for i in 0..10 {
        let row = &o[i * 64..(i + 1) * 64];
        assert_eq!(row.iter().all(|&x| x == 0.0), i < 6, "row {i}: {row:?}");
        for h in 0..2 {
            assert_eq!(lse[h * 10 + i] == f32::NEG_INFINITY, i < 6, "lse of head {h} row {i}");
        }
    }
}

#[test]
fn agrees_with_candles_own_attention() {
    let q = randn((1, 64, 8, 32), DType::F32);
    let k = randn((1, 64, 4, 32), DType::F32);
    let v = randn((1, 64, 4, 32), DType::F32);
    for causal in [false, true] {
        let ours = attn_candle::flash_attn(&q, &k, &v, 0.2, causal).unwrap();
        let theirs = candle_attention(&q, &k, &v, 0.2, causal);
        let e = max_diff(&values(&ours), &values(&theirs));
        assert!(e <= 1e-5, "causal={causal}: {e}");
    }
}

/// Transposed (`[b, h, s, d]` storage seen as `[b, s, h, d]`) and narrowed tensors run in place
/// and give what their contiguous copies give, bit for bit.
#[test]
fn strided_and_offset_tensors_run_in_place() {
    let q = randn((2, 8, 50, 64), DType::BF16).transpose(1, 2).unwrap();
    let big = randn((2, 70, 4, 64), DType::BF16);
    let k = big.narrow(1, 10, 40).unwrap();
    let v = randn((2, 40, 6, 64), DType::BF16).narrow(2, 2, 4).unwrap();
    assert!(!q.is_contiguous() && !v.is_contiguous());
    let strided = attn_candle::flash_attn(&q, &k, &v, 0.125, true).unwrap();
    let (qc, kc, vc) = (q.contiguous().unwrap(), k.contiguous().unwrap(), v.contiguous().unwrap());
    let packed = attn_candle::flash_attn(&qc, &kc, &vc, 0.125, true).unwrap();
    assert_eq!(values(&strided), values(&packed));
    let (want, _) = reference(&q, &k, &v, 0.125, true);
    assert!(max_diff(&values(&strided), &want) <= 2e-2);
}

/// A window against the reference with the same window, and `(None, Some(0))` against causal.
#[test]
fn windows_match_the_reference() {
    let q = randn((1, 40, 4, 64), DType::F32);
    let k = randn((1, 100, 2, 64), DType::F32);
    let v = randn((1, 100, 2, 64), DType::F32);
    let o = attn_candle::flash_attn_windowed(&q, &k, &v, 0.125, Some(10), Some(0)).unwrap();
    let shape = attn_core::Shape { batch: 1, heads_q: 4, heads_kv: 2, seq_q: 40, seq_k: 100, head_dim: 64 };
    let p = Problem::new(shape, attn_core::DType::F32)
        .with_layout(attn_core::Layout::Bshd)
        .with_scale(0.125)
        .with_window(Some(10), Some(0));
    let flat = |t: &Tensor| Buffer::F32(values(t));
    let (qb, kb, vb) = (flat(&q), flat(&k), flat(&v));
    let mut want = Buffer::zeros(attn_core::DType::F32, p.required_lens()[3].1);
    attn_cpu::Reference
        .forward(
            &p,
            Inputs::new(qb.as_data(), kb.as_data(), vb.as_data()),
            Outputs { o: want.as_data_mut(), lse: None },
        )
        .unwrap();
    assert!(max_diff(&values(&o), &want.to_f32_vec()) <= 2e-5);
    let causal = attn_candle::flash_attn(&q, &k, &v, 0.125, true).unwrap();
    let unbounded = attn_candle::flash_attn_windowed(&q, &k, &v, 0.125, None, Some(0)).unwrap();
    assert_eq!(values(&causal), values(&unbounded));
}

#[test]
fn what_it_does_not_take_is_an_error() {
    let q = randn((1, 16, 4, 64), DType::F32);
    let k = randn((1, 16, 4, 64), DType::F32);
    let msg = |r: candle_core::Result<Tensor>| r.unwrap_err().to_string();
    // head_dim not contiguous.
    let qt = q.transpose(2, 3).unwrap().transpose(2, 3).unwrap().t().unwrap();
    assert!(msg(attn_candle::flash_attn(&qt, &k, &k, 1.0, false)).contains("attn"));
    // k and v of different shapes; head dims that differ; heads that do not divide.
    let k2 = randn((1, 16, 4, 32), DType::F32);
    assert!(msg(attn_candle::flash_attn(&q, &k, &k2, 1.0, false)).contains("v's shape"));
    assert!(msg(attn_candle::flash_attn(&q, &k2, &k2, 1.0, false)).contains("head_dim"));
    let k3 = randn((1, 16, 3, 64), DType::F32);
    assert!(!msg(attn_candle::flash_attn(&q, &k3, &k3, 1.0, false)).is_empty());
    // A dtype no backend takes, and tensors of mixed dtypes.
    let q64 = q.to_dtype(DType::F64).unwrap();
    assert!(msg(attn_candle::flash_attn(&q64, &q64, &q64, 1.0, false)).contains("dtype"));
    let kh = k.to_dtype(DType::F16).unwrap();
    assert!(!msg(attn_candle::flash_attn(&q, &kh, &kh, 1.0, false)).is_empty());
    // Not 4-D.
    let q3 = q.i(0).unwrap();
    assert!(msg(attn_candle::flash_attn(&q3, &k, &k, 1.0, false)).contains("[batch, seq, heads, head_dim]"));
    let _ = D::Minus1;
}

/// Packed sequences give what each sequence gives alone, through `flash_attn` (itself checked
/// against the reference above): the offsets, each sequence's own causal diagonal, an empty
/// sequence.
#[test]
fn varlen_equals_each_sequence_alone() {
    let (q_lens, k_lens) = ([7usize, 0, 1, 30], [12usize, 4, 1, 25]);
    let (tq, tk) = (q_lens.iter().sum::<usize>(), k_lens.iter().sum::<usize>());
    let q = Tensor::randn(0f32, 1.0, (tq, 4, 32), &Device::Cpu).unwrap();
    let k = Tensor::randn(0f32, 1.0, (tk, 2, 32), &Device::Cpu).unwrap();
    let v = Tensor::randn(0f32, 1.0, (tk, 2, 32), &Device::Cpu).unwrap();
    let cu = |lens: &[usize]| {
        let mut sum = 0u32;
        let offsets: Vec<u32> = std::iter::once(0)
            .chain(lens.iter().map(|&n| {
                sum += n as u32;
                sum
            }))
            .collect();
        Tensor::new(offsets, &Device::Cpu).unwrap()
    };
    for causal in [false, true] {
        let o = attn_candle::flash_attn_varlen(&q, &k, &v, &cu(&q_lens), &cu(&k_lens), 30, 25, 0.2, causal)
            .unwrap();
        assert_eq!(o.dims(), &[tq, 4, 32]);
        let (mut at_q, mut at_k) = (0, 0);
        for (&nq, &nk) in q_lens.iter().zip(&k_lens) {
            if nq > 0 {
                let part = |t: &Tensor, at, n| t.narrow(0, at, n).unwrap().unsqueeze(0).unwrap();
                let alone = attn_candle::flash_attn(
                    &part(&q, at_q, nq),
                    &part(&k, at_k, nk),
                    &part(&v, at_k, nk),
                    0.2,
                    causal,
                )
                .unwrap();
                let packed = o.narrow(0, at_q, nq).unwrap();
                assert!(
                    max_diff(&values(&packed), &values(&alone)) < 1e-6,
                    "causal {causal}, sequence at {at_q}"
                );
            }
            at_q += nq;
            at_k += nk;
        }
    }
    // Offsets that do not fit the tensors are attn's typed error.
    let bad =
        attn_candle::flash_attn_varlen(&q, &k, &v, &cu(&[7, 0, 1, 31]), &cu(&k_lens), 31, 25, 0.2, false);
    assert!(bad.unwrap_err().to_string().contains("cu_seqlens_q"), "the error names the offsets");
}

/// ALiBi against candle's own attention with the bias added: `-slope · |i + sk - sq - j|`.
#[test]
fn alibi_matches_candles_attention_with_the_bias() {
    let (sq, sk, h) = (5, 11, 4);
    let q = randn((1, sq, h, 16), DType::F32);
    let k = randn((1, sk, h, 16), DType::F32);
    let v = randn((1, sk, h, 16), DType::F32);
    let slopes = [0.5f32, 0.25, 0.125, 0.0625];
    let o =
        attn_candle::flash_attn_alibi(&q, &k, &v, &Tensor::new(&slopes, &Device::Cpu).unwrap(), 0.25, false)
            .unwrap();
    let bias: Vec<f32> = slopes
        .iter()
        .flat_map(|m| {
            (0..sq)
                .flat_map(move |i| (0..sk).map(move |j| -m * (i as f32 + (sk - sq) as f32 - j as f32).abs()))
        })
        .collect();
    let bias = Tensor::from_vec(bias, (1, h, sq, sk), &Device::Cpu).unwrap();
    let qt = q.transpose(1, 2).unwrap().contiguous().unwrap();
    let (kt, vt) =
        (k.transpose(1, 2).unwrap().contiguous().unwrap(), v.transpose(1, 2).unwrap().contiguous().unwrap());
    let s = ((qt.matmul(&kt.t().unwrap()).unwrap() * 0.25).unwrap() + bias).unwrap();
    let want = candle_nn::ops::softmax_last_dim(&s).unwrap().matmul(&vt).unwrap().transpose(1, 2).unwrap();
    assert!(max_diff(&values(&o), &values(&want)) < 1e-5);
    // Slopes of the wrong length: attn's typed error.
    let bad = attn_candle::flash_attn_alibi(
        &q,
        &k,
        &v,
        &Tensor::new(&[0.5f32, 0.25], &Device::Cpu).unwrap(),
        0.25,
        false,
    );
    assert!(bad.unwrap_err().to_string().contains("alibi_slopes"));
}

/// `flash_attn_with_kvcache`, dense and paged: new keys appended in place after each sequence's,
/// then attention over exactly those keys, as `flash_attn` on each sequence's keys gathered alone.
#[test]
fn kvcache_appends_then_attends_like_each_sequence_alone() {
    let (hk, d, page) = (2, 16, 4);
    let used = [5usize, 0, 9];
    let q = randn((3, 2, 4, d), DType::F32);
    let (k_new, v_new) = (randn((3, 2, hk, d), DType::F32), randn((3, 2, hk, d), DType::F32));
    let seqlens = Tensor::new(&[5u32, 0, 9], &Device::Cpu).unwrap();
    for paged in [false, true] {
        // Dense: [3, 12, hk, d]. Paged: 9 pages of 4, three per sequence, shuffled.
        let table = [[4u32, 0, 7], [2, 8, 5], [1, 6, 3]];
        let (k_cache, v_cache) = match paged {
            false => (randn((3, 12, hk, d), DType::F32), randn((3, 12, hk, d), DType::F32)),
            true => (randn((9, page, hk, d), DType::F32), randn((9, page, hk, d), DType::F32)),
        };
        // Key j of sequence b, wherever the cache keeps it.
        let row = |t: &Tensor, b: usize, j: usize| match paged {
            false => t.i((b, j)).unwrap(),
            true => t.i((table[b][j / page] as usize, j % page)).unwrap(),
        };
        let block_table = paged.then(|| Tensor::new(&table, &Device::Cpu).unwrap());
        let o = attn_candle::flash_attn_with_kvcache(
            &q,
            &k_cache,
            &v_cache,
            Some(&k_new),
            Some(&v_new),
            &seqlens,
            block_table.as_ref(),
            0.25,
            true,
        )
        .unwrap();
        for (b, &n) in used.iter().enumerate() {
            let gather =
                |t: &Tensor| Tensor::stack(&(0..n + 2).map(|j| row(t, b, j)).collect::<Vec<_>>(), 0).unwrap();
            let (kb, vb) = (gather(&k_cache), gather(&v_cache));
            // The appended rows are the new ones.
            assert_eq!(values(&kb.narrow(0, n, 2).unwrap()), values(&k_new.i(b).unwrap()));
            let alone = attn_candle::flash_attn(
                &q.i(b..b + 1).unwrap(),
                &kb.unsqueeze(0).unwrap(),
                &vb.unsqueeze(0).unwrap(),
                0.25,
                true,
            )
            .unwrap();
            let got = o.i(b..b + 1).unwrap();
            assert!(max_diff(&values(&got), &values(&alone)) < 1e-6, "paged {paged}, sequence {b}");
        }
    }
}

/// Gradients through the op equal candle's own attention's (autograd over matmul and softmax),
/// for strided GQA inputs under a causal mask with seq_q != seq_k, and a `Var` graph trains.
#[test]
fn gradients_agree_with_candles_own_attention() {
    use candle_core::Var;
    let q = Var::from_tensor(&randn((2, 5, 4, 16), DType::F32)).unwrap();
    let k = Var::from_tensor(&randn((2, 9, 2, 16), DType::F32)).unwrap();
    let v = Var::from_tensor(&randn((2, 9, 2, 16), DType::F32)).unwrap();
    let target = randn((2, 5, 4, 16), DType::F32);
    let loss = |o: Tensor| o.sub(&target).unwrap().sqr().unwrap().sum_all().unwrap();
    let ours = loss(attn_candle::flash_attn(&q, &k, &v, 0.3, true).unwrap()).backward().unwrap();
    let theirs = loss(candle_attention(&q, &k, &v, 0.3, true)).backward().unwrap();
    for (name, var) in [("q", &q), ("k", &k), ("v", &v)] {
        let (a, b) = (values(ours.get(var).expect("ours")), values(theirs.get(var).expect("theirs")));
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max_diff(&a, &b) < 1e-5 * scale.max(1.0), "d{name}: {} (largest {scale})", max_diff(&a, &b));
    }
    // A strided view (k's heads transposed in) takes its gradient in its own shape.
    let kt = k.transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap();
    let g = loss(attn_candle::flash_attn(&q, &kt, &v, 0.3, false).unwrap()).backward().unwrap();
    assert_eq!(g.get(&k).unwrap().dims(), k.dims());
}
