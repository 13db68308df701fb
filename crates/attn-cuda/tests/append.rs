//! The device-resident cache append (`Cuda::append_rows_on_stream`) on a real GPU: the bits of
//! `attn_core::append_kv` on the host, for dense caches with key counts and paged ones (pages
//! shuffled, new rows crossing pages); a decode step (append keys, append values, attend with
//! the counts the first append wrote) giving the host path's bits; corrupt counts and page
//! numbers writing nothing outside the cache; the typed errors. Prints `SKIPPED <test>:
//! <reason>` where there is no GPU (fails instead with `ATTN_REQUIRE_CUDA=on`).

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::sequences::{KeyStore, batch_of};
use attn_core::{Attention, Buffer, CacheTensor, DType, Inputs, NewRows, Outputs, Problem, Shape, Strides};
use attn_cuda::{AppendArrays, Cuda, DeviceArrays, DeviceElement, Options, probe};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaViewMut, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use std::sync::Arc;

/// The backend, or why the test is skipped (a failure with `ATTN_REQUIRE_CUDA=on`).
fn backend(test: &str) -> Option<Cuda> {
    match probe() {
        Ok(_) => Some(Cuda::with_options(Options::default())),
        Err(reason) if attn_cuda::options::REQUIRE_CUDA.on_off().unwrap() == Some(true) => {
            panic!("a CUDA device is required (ATTN_REQUIRE_CUDA=on) but unavailable: {reason}")
        }
        Err(reason) => {
            println!("SKIPPED {test}: {reason}");
            None
        }
    }
}

/// A cache and what is appended to it: the attention problem over the cache after the append
/// (`len` queries per sequence, causal), its index arrays with the counts *before* the append,
/// and `len`.
struct Case {
    problem: Problem,
    extras: attn_core::OwnedExtras,
    len: usize,
}

/// Three sequences holding 37, 0 and 115 keys of room for 120: a dense cache (bf16, D = 64) and
/// a paged one of 16-key pages in shuffled order (f16, D = 128), one new row and five (which
/// cross a page boundary), GQA 8:2.
fn cases() -> Vec<Case> {
    let mut all = vec![];
    for (store, dtype, d) in [
        (KeyStore::DenseUsed, DType::Bf16, 64),
        (KeyStore::Paged { page_size: 16, seed: 9 }, DType::F16, 128),
    ] {
        for len in [1, 5] {
            let shape = Shape { heads_kv: 2, ..Shape::new(1, 8, 1, d) };
            let (problem, mut extras) = batch_of(shape, dtype, &[len; 3], &[37, 0, 120], store);
            extras.seqused_k = Some(vec![37, 0, 115]);
            all.push(Case { problem: problem.causal(), extras, len });
        }
    }
    all
}

/// The new rows' strides: `[batch, len, heads_kv, head_dim]`, contiguous.
fn new_strides(s: Shape, len: usize) -> Strides {
    Strides { batch: len * s.heads_kv * s.head_dim, seq: s.heads_kv * s.head_dim, head: s.head_dim }
}

trait Half: DeviceElement + DeviceRepr + ValidAsZeroBits + Send + Sync {
    fn from_buffer(b: &Buffer) -> Vec<Self>;
    fn bits(v: Vec<Self>) -> Vec<u16>;
}

impl Half for f16 {
    fn from_buffer(b: &Buffer) -> Vec<Self> {
        let Buffer::F16(v) = b else { panic!("not f16") };
        v.clone()
    }
    fn bits(v: Vec<Self>) -> Vec<u16> {
        v.into_iter().map(f16::to_bits).collect()
    }
}

impl Half for bf16 {
    fn from_buffer(b: &Buffer) -> Vec<Self> {
        let Buffer::Bf16(v) = b else { panic!("not bf16") };
        v.clone()
    }
    fn bits(v: Vec<Self>) -> Vec<u16> {
        v.into_iter().map(bf16::to_bits).collect()
    }
}

fn bits(b: &Buffer) -> Vec<u16> {
    match b {
        Buffer::F16(v) => v.iter().map(|x| x.to_bits()).collect(),
        Buffer::Bf16(v) => v.iter().map(|x| x.to_bits()).collect(),
        Buffer::F32(_) => panic!("f32 is not a CUDA dtype"),
    }
}

/// What one decode step gave: the caches' bits, the counts after, and o's bits.
struct Step {
    k: Vec<u16>,
    v: Vec<u16>,
    used: Vec<i32>,
    o: Vec<u16>,
}

/// Random inputs for `case`: q, the caches, the new keys and values.
fn draw(case: &Case, seed: u64) -> [Buffer; 5] {
    let p = &case.problem;
    let mut rng = SplitMix64::new(seed);
    let [q, k, v, _] = p.required_lens().map(|(_, n)| n);
    let new = new_strides(p.shape, case.len).required_len(
        p.shape.batch,
        p.shape.heads_kv,
        case.len,
        p.shape.head_dim,
    );
    [q, k, v, new, new].map(|n| normal_buffer(&mut rng, p.dtype, n, 1.0))
}

/// The step on the host: `attn_core::append_kv`, then the host-copy path's attention.
fn host_step(cuda: &Cuda, case: &Case, x: &[Buffer; 5]) -> Step {
    let p = &case.problem;
    let [q, k, v, k_new, v_new] = x.clone();
    let (mut k, mut v) = (k, v);
    let strides = new_strides(p.shape, case.len);
    let used = attn_core::append_kv(
        p,
        case.extras.borrow(),
        k.as_data_mut(),
        v.as_data_mut(),
        NewRows { data: k_new.as_data(), strides, len: case.len },
        NewRows { data: v_new.as_data(), strides, len: case.len },
    )
    .unwrap();
    let mut after = case.extras.clone();
    after.seqused_k = Some(used.clone());
    let mut o = Buffer::zeros(p.dtype, p.required_lens()[3].1);
    let inputs = Inputs::new(q.as_data(), k.as_data(), v.as_data()).with_extras(after.borrow());
    cuda.forward(p, inputs, Outputs { o: o.as_data_mut(), lse: None }).unwrap();
    Step { k: bits(&k), v: bits(&v), used, o: bits(&o) }
}

/// An append's arrays: the counts before, the block table where the cache is paged, and where
/// to write the counts after.
fn arrays<'a>(
    used: &'a CudaSlice<i32>,
    table: Option<&'a CudaSlice<i32>>,
    after: Option<CudaViewMut<'a, i32>>,
) -> AppendArrays<'a> {
    AppendArrays { seqused_k: used.as_view(), block_table: table.map(|t| t.as_view()), counts_after: after }
}

/// The step on the device, on `stream`: two appends (the first writing the counts after), then
/// the attention reading those counts; nothing copied back until it has all run.
fn device_step<T: Half>(
    cuda: &Cuda,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    case: &Case,
    x: &[Buffer; 5],
) -> Step {
    let p = &case.problem;
    let up = |b: &Buffer| stream.clone_htod(&T::from_buffer(b)).unwrap();
    let (q, mut k, mut v, k_new, v_new) = (up(&x[0]), up(&x[1]), up(&x[2]), up(&x[3]), up(&x[4]));
    let used: CudaSlice<i32> = stream.clone_htod(case.extras.seqused_k.as_ref().unwrap()).unwrap();
    let table = case.extras.block_table.as_ref().map(|t| stream.clone_htod(t).unwrap());
    let mut after: CudaSlice<i32> = stream.alloc_zeros(p.shape.batch).unwrap();
    let mut o: CudaSlice<T> = stream.alloc_zeros(p.required_lens()[3].1).unwrap();
    let strides = new_strides(p.shape, case.len);
    let keys = arrays(&used, table.as_ref(), Some(after.as_view_mut()));
    cuda.append_rows_on_stream(p, CacheTensor::Keys, &mut k, &k_new, strides, case.len, keys, stream)
        .unwrap();
    let values = arrays(&used, table.as_ref(), None);
    cuda.append_rows_on_stream(p, CacheTensor::Values, &mut v, &v_new, strides, case.len, values, stream)
        .unwrap();
    let plan = cuda.plan_on(ctx, p).unwrap();
    let attend = DeviceArrays {
        seqused_k: Some(after.as_view()),
        block_table: table.as_ref().map(|t| t.as_view()),
        ..DeviceArrays::default()
    };
    cuda.run_on_stream(&plan, &q, &k, &v, &mut o, attend, stream).unwrap();
    stream.synchronize().unwrap_or_else(|e| panic!("{p}: the step faulted: {e}"));
    Step {
        k: T::bits(stream.clone_dtoh(&k).unwrap()),
        v: T::bits(stream.clone_dtoh(&v).unwrap()),
        used: stream.clone_dtoh(&after).unwrap(),
        o: T::bits(stream.clone_dtoh(&o).unwrap()),
    }
}

/// A decode step on device memory gives the host's bits: the caches after the append, the
/// counts after it, and the attention over them.
#[test]
fn a_decode_step_on_the_device_gives_the_host_bits() {
    let Some(cuda) = backend("a_decode_step_on_the_device_gives_the_host_bits") else { return };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    for (i, case) in cases().iter().enumerate() {
        let p = &case.problem;
        let x = draw(case, 500 + i as u64);
        let host = host_step(&cuda, case, &x);
        let device = match p.dtype {
            DType::F16 => device_step::<f16>(&cuda, &ctx, &stream, case, &x),
            _ => device_step::<bf16>(&cuda, &ctx, &stream, case, &x),
        };
        assert_eq!(device.used, host.used, "{p}: counts after the append");
        assert!(device.k == host.k, "{p}, {} new rows: the key cache differs from the host append", case.len);
        assert!(
            device.v == host.v,
            "{p}, {} new rows: the value cache differs from the host append",
            case.len
        );
        assert!(device.o == host.o, "{p}, {} new rows: o differs from the host path", case.len);
        // The appended rows changed the caches (the test would pass on a no-op otherwise).
        assert!(host.k != bits(&x[1]) && host.v != bits(&x[2]), "{p}: nothing appended");
        println!("{p}, {} new rows: same caches, counts {:?} and o", case.len, host.used);
    }
}

/// Corrupt counts and page numbers (negative, past the cache, i32's extremes): nothing is
/// written outside the cache (every element past the cache's own, in a longer buffer, keeps its
/// bits; run under compute-sanitizer to see no access outside the buffers), and the counts
/// written after are clamped into `[0, seq_k]`.
#[test]
fn corrupt_counts_and_pages_write_nothing_outside_the_cache() {
    let Some(cuda) = backend("corrupt_counts_and_pages_write_nothing_outside_the_cache") else { return };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    for (i, case) in cases().iter().enumerate() {
        let p = &case.problem;
        let x = draw(case, 700 + i as u64);
        let k_len = p.required_lens()[1].1;
        // The cache in a buffer with a guard of NaN after it.
        let mut guarded = bits(&x[1]);
        guarded.extend(std::iter::repeat_n(0xffff, 4096));
        let guarded: Vec<bf16> = guarded.into_iter().map(bf16::from_bits).collect();
        let mut k = stream.clone_htod(&guarded).unwrap();
        let k_new: Vec<bf16> = bits(&x[3]).into_iter().map(bf16::from_bits).collect();
        let k_new = stream.clone_htod(&k_new).unwrap();
        let used = stream.clone_htod(&[i32::MAX, -7, 1 << 30]).unwrap();
        let table = case.extras.block_table.as_ref().map(|t| {
            let bad: Vec<i32> =
                [i32::MIN, -1, 1 << 29, i32::MAX].iter().copied().cycle().take(t.len()).collect();
            stream.clone_htod(&bad).unwrap()
        });
        let mut after: CudaSlice<i32> = stream.alloc_zeros(3).unwrap();
        let problem = Problem { dtype: DType::Bf16, ..*p };
        let mut cache = k.slice_mut(..k_len);
        cuda.append_rows_on_stream(
            &problem,
            CacheTensor::Keys,
            &mut cache,
            &k_new,
            new_strides(p.shape, case.len),
            case.len,
            AppendArrays {
                seqused_k: used.as_view(),
                block_table: table.as_ref().map(|t| t.as_view()),
                counts_after: Some(after.as_view_mut()),
            },
            &stream,
        )
        .unwrap();
        stream.synchronize().unwrap_or_else(|e| panic!("{p}: the append faulted: {e}"));
        let back: Vec<u16> = stream.clone_dtoh(&k).unwrap().into_iter().map(bf16::to_bits).collect();
        assert!(back[k_len..].iter().all(|&b| b == 0xffff), "{p}: a row was written past the cache");
        let seq_k = p.shape.seq_k as i32;
        assert_eq!(
            stream.clone_dtoh(&after).unwrap(),
            vec![seq_k, case.len as i32, seq_k],
            "{p}: clamped counts"
        );
        println!("{p}, {} new rows: corrupt arrays wrote inside the cache only", case.len);
    }
}

/// The error of appending `new` (`len` rows per sequence as `strides` place them) to the keys
/// `dst` of the cache `problem`; a panic where the append is accepted.
#[allow(clippy::too_many_arguments)]
fn fails<T: DeviceElement>(
    cuda: &Cuda,
    stream: &Arc<CudaStream>,
    problem: &Problem,
    dst: &mut CudaSlice<T>,
    new: &impl cudarc::driver::DevicePtr<T>,
    (strides, len): (Strides, usize),
    arrays: AppendArrays<'_>,
) -> String {
    cuda.append_rows_on_stream(problem, CacheTensor::Keys, dst, new, strides, len, arrays, stream)
        .expect_err("the append was accepted")
        .to_string()
}

/// The typed errors, before anything is enqueued.
#[test]
fn bad_appends_are_typed_errors() {
    let Some(cuda) = backend("bad_appends_are_typed_errors") else { return };
    let stream = CudaContext::new(0).unwrap().new_stream().unwrap();
    let cases = cases();
    let paged = &cases[3];
    let p = &paged.problem;
    let x = draw(paged, 3);
    let mut k = stream.clone_htod(&f16::from_buffer(&x[1])).unwrap();
    let k_new = stream.clone_htod(&f16::from_buffer(&x[3])).unwrap();
    let used = stream.clone_htod(&[1i32, 2, 3]).unwrap();
    let table = stream.clone_htod(paged.extras.block_table.as_ref().unwrap()).unwrap();
    let mut after: CudaSlice<i32> = stream.alloc_zeros(3).unwrap();
    let strides = new_strides(p.shape, paged.len);
    // The block table missing for a paged cache.
    let e = fails(&cuda, &stream, p, &mut k, &k_new, (strides, paged.len), arrays(&used, None, None));
    assert!(e.contains("block_table") && e.contains("paged"), "{e}");
    // New rows one element short.
    let short = k_new.slice(..k_new.len() - 1);
    let e = fails(&cuda, &stream, p, &mut k, &short, (strides, paged.len), arrays(&used, Some(&table), None));
    assert!(e.contains("new rows") && e.contains("elements"), "{e}");
    // Too few key counts.
    let e = fails(
        &cuda,
        &stream,
        p,
        &mut k,
        &k_new,
        (strides, paged.len),
        AppendArrays { seqused_k: used.slice(..2), ..arrays(&used, Some(&table), None) },
    );
    assert!(e.contains("seqused_k") && e.contains("[batch] = 3"), "{e}");
    // Counts after written over the counts read: a second handle on `used`'s memory (safe
    // code cannot make one; a caller of raw pointers could), leaked so it is freed once.
    let (used_at, _) = cudarc::driver::DevicePtr::device_ptr(&used, &stream);
    // SAFETY: the handle aliases `used`, which outlives it; it is leaked below, never freed.
    let mut alias = unsafe { stream.upgrade_device_ptr::<i32>(used_at, 3) };
    let e = fails(
        &cuda,
        &stream,
        p,
        &mut k,
        &k_new,
        (strides, paged.len),
        arrays(&used, Some(&table), Some(alias.as_view_mut())),
    );
    alias.leak();
    assert!(e.contains("overlaps `seqused_k`"), "{e}");
    // A stride that is not a whole number of 16-byte vectors (shorter, so the rows still fit).
    let odd = Strides { seq: strides.seq - 4, ..strides };
    let e = fails(&cuda, &stream, p, &mut k, &k_new, (odd, paged.len), arrays(&used, Some(&table), None));
    assert!(e.contains("multiples of 8"), "{e}");
    // bf16 rows for an f16 cache.
    let mut kb = stream.clone_htod(&vec![bf16::ZERO; k.len()]).unwrap();
    let nb = stream.clone_htod(&vec![bf16::ZERO; k_new.len()]).unwrap();
    let e = fails(&cuda, &stream, p, &mut kb, &nb, (strides, paged.len), arrays(&used, Some(&table), None));
    assert!(e.contains("f16") && e.contains("bf16"), "{e}");
    // A dense problem without key counts.
    let dense = Problem::new(p.shape, p.dtype);
    let e = fails(
        &cuda,
        &stream,
        &dense,
        &mut k,
        &k_new,
        (strides, paged.len),
        arrays(&used, Some(&table), Some(after.as_view_mut())),
    );
    assert!(e.contains("seqused_k"), "{e}");
}
