//! The device-resident calls (`attn_cuda::device`) on a real GPU: the same bits as the
//! host-copy path for every kernel family, head dim, dtype and mask; many threads and streams at
//! once giving what serial calls give; no device memory taken per call; the raw entry; and the
//! typed errors. Prints `SKIPPED <test>: <reason>` where there is no GPU (fails instead with
//! `ATTN_REQUIRE_CUDA=on`).

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::{Attention, Buffer, DType, Inputs, Layout, Outputs, Problem, Shape};
use attn_cuda::{Cuda, DeviceArrays, DeviceElement, DevicePointers, ExtraPointers, Family, Options, probe};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use std::sync::Arc;

/// The problems every test runs: both dtypes, every head dim a family ships (32, 64, 96, 128,
/// 256), causal and not, GQA, BSHD strides, the LSE on and off, lengths off the tiles, a decode
/// row.
fn problems() -> Vec<Problem> {
    let mut all = vec![];
    for (i, d) in [64, 128, 256].into_iter().enumerate() {
        let dtype = if i % 2 == 0 { DType::Bf16 } else { DType::F16 };
        let shape = Shape { heads_kv: 2, ..Shape::new(2, 4, 300 + 17 * i, d) };
        all.push(Problem::new(shape, dtype).with_lse(true));
        all.push(Problem::new(shape, dtype).causal().with_layout(Layout::Bshd));
    }
    // Head dims the Ampere/Ada family runs natively and the Hopper family padded (ATTN_PAD).
    for (i, d) in [32, 96].into_iter().enumerate() {
        let dtype = if i == 0 { DType::F16 } else { DType::Bf16 };
        all.push(Problem::new(Shape::new(1, 4, 200, d), dtype).causal().with_lse(true));
    }
    // Decode rows (the decode family, several splits: its workspace): causal with 4 queries at
    // D = 64 in f16, then the bf16 row the tests below take as the last.
    let causal = Shape { heads_kv: 2, seq_q: 4, seq_k: 3001, ..Shape::new(2, 8, 1, 64) };
    all.push(Problem::new(causal, DType::F16).causal().with_lse(true));
    let decode = Shape { seq_q: 1, seq_k: 4000, ..Shape::new(1, 8, 1, 128) };
    all.push(Problem::new(Shape { heads_kv: 2, ..decode }, DType::Bf16).with_lse(true));
    all
}

/// The backend, or why the test is skipped (a failure with `ATTN_REQUIRE_CUDA=on`).
fn backend(test: &str, options: Options) -> Option<Cuda> {
    match probe() {
        Ok(_) => Some(Cuda::with_options(options)),
        Err(reason) if attn_cuda::options::REQUIRE_CUDA.on_off().unwrap() == Some(true) => {
            panic!("a CUDA device is required (ATTN_REQUIRE_CUDA=on) but unavailable: {reason}")
        }
        Err(reason) => {
            println!("SKIPPED {test}: {reason}");
            None
        }
    }
}

/// The inputs of a problem, drawn from `seed`.
fn inputs(problem: &Problem, seed: u64) -> [Buffer; 3] {
    let mut rng = SplitMix64::new(seed);
    problem.required_lens()[..3]
        .iter()
        .map(|(_, n)| normal_buffer(&mut rng, problem.dtype, *n, 1.0))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap()
}

/// o's bits and the LSE through the host-copy path.
fn host_path(cuda: &Cuda, problem: &Problem, x: &[Buffer; 3]) -> (Vec<u16>, Vec<f32>) {
    let mut o = Buffer::zeros(problem.dtype, problem.required_lens()[3].1);
    let mut lse = vec![0f32; problem.lse_len()];
    let inputs = Inputs::new(x[0].as_data(), x[1].as_data(), x[2].as_data());
    let lse_out = problem.params.return_lse.then_some(lse.as_mut_slice());
    cuda.forward(problem, inputs, Outputs { o: o.as_data_mut(), lse: lse_out }).unwrap();
    (bits(&o), lse)
}

fn bits(b: &Buffer) -> Vec<u16> {
    match b {
        Buffer::F16(v) => v.iter().map(|x| x.to_bits()).collect(),
        Buffer::Bf16(v) => v.iter().map(|x| x.to_bits()).collect(),
        Buffer::F32(_) => panic!("f32 is not a CUDA dtype"),
    }
}

/// The elements of a 16-bit buffer as `T`.
trait Half: DeviceElement + DeviceRepr + ValidAsZeroBits + Send + Sync {
    fn from_buffer(b: &Buffer) -> Vec<Self>;
    fn to_bits(self) -> u16;
    fn from_bits(bits: u16) -> Self;
}

impl Half for f16 {
    fn from_buffer(b: &Buffer) -> Vec<Self> {
        let Buffer::F16(v) = b else { panic!("not f16") };
        v.clone()
    }
    fn to_bits(self) -> u16 {
        f16::to_bits(self)
    }
    fn from_bits(bits: u16) -> Self {
        f16::from_bits(bits)
    }
}

impl Half for bf16 {
    fn from_buffer(b: &Buffer) -> Vec<Self> {
        let Buffer::Bf16(v) = b else { panic!("not bf16") };
        v.clone()
    }
    fn to_bits(self) -> u16 {
        bf16::to_bits(self)
    }
    fn from_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }
}

/// A caller's tensors on the device: q, k, v copied there, o filled with NaN bits, and the LSE.
struct Resident<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    o: CudaSlice<T>,
    lse: CudaSlice<f32>,
}

impl<T: Half> Resident<T> {
    fn new(stream: &Arc<CudaStream>, problem: &Problem, x: &[Buffer; 3]) -> Self {
        let up = |b: &Buffer| stream.clone_htod(&T::from_buffer(b)).unwrap();
        // o starts as NaN (0xffff in both 16-bit formats): an element the kernel should write
        // but does not shows.
        let o = stream.clone_htod(&vec![T::from_bits(0xffff); problem.required_lens()[3].1]).unwrap();
        let lse = stream.alloc_zeros(problem.lse_len().max(1)).unwrap();
        Resident { q: up(&x[0]), k: up(&x[1]), v: up(&x[2]), o, lse }
    }

    /// Runs `plan` on these tensors on `stream`.
    fn run(
        &mut self,
        cuda: &Cuda,
        plan: &attn_core::Plan,
        stream: &Arc<CudaStream>,
    ) -> attn_core::Result<()> {
        let lse = plan.problem.params.return_lse.then(|| self.lse.as_view_mut());
        let arrays = DeviceArrays { lse, ..DeviceArrays::default() };
        cuda.run_on_stream(plan, &self.q, &self.k, &self.v, &mut self.o, arrays, stream)
    }

    /// o's bits and the LSE, back on the host.
    fn read(&self, stream: &Arc<CudaStream>, problem: &Problem) -> (Vec<u16>, Vec<f32>) {
        let o = stream.clone_dtoh(&self.o).unwrap().into_iter().map(T::to_bits).collect();
        let lse = stream.clone_dtoh(&self.lse).unwrap();
        (o, lse[..problem.lse_len()].to_vec())
    }
}

/// `plan` on fresh device copies of `x` on `stream`, its o's bits and LSE (in the problem's dtype).
fn on_stream(
    cuda: &Cuda,
    plan: &attn_core::Plan,
    stream: &Arc<CudaStream>,
    p: &Problem,
    x: &[Buffer; 3],
) -> (Vec<u16>, Vec<f32>) {
    fn typed<T: Half>(
        cuda: &Cuda,
        plan: &attn_core::Plan,
        stream: &Arc<CudaStream>,
        p: &Problem,
        x: &[Buffer; 3],
    ) -> (Vec<u16>, Vec<f32>) {
        let mut t = Resident::<T>::new(stream, p, x);
        t.run(cuda, plan, stream).unwrap();
        stream.synchronize().unwrap();
        t.read(stream, p)
    }
    match p.dtype {
        DType::F16 => typed::<f16>(cuda, plan, stream, p, x),
        _ => typed::<bf16>(cuda, plan, stream, p, x),
    }
}

/// The device path's o and LSE for `problem` on a caller's context and stream.
fn device_path(cuda: &Cuda, problem: &Problem, x: &[Buffer; 3]) -> (Vec<u16>, Vec<f32>) {
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let plan = cuda.plan_on(&ctx, problem).unwrap();
    on_stream(cuda, &plan, &stream, problem, x)
}

fn same_bits(cuda: &Cuda, what: &str) {
    for (i, problem) in problems().into_iter().enumerate() {
        let x = inputs(&problem, 100 + i as u64);
        let host = host_path(cuda, &problem, &x);
        let device = device_path(cuda, &problem, &x);
        let kernel = cuda.plan(&problem).unwrap().kernel;
        assert!(host.0 == device.0, "{what} {problem} ({kernel}): o differs from the host-copy path");
        let lse_bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if problem.params.return_lse {
            assert_eq!(lse_bits(&host.1), lse_bits(&device.1), "{what} {problem} ({kernel}): lse");
        }
        println!("{what} {problem}: {kernel}: same bits");
    }
}

#[test]
fn the_device_path_gives_the_host_paths_bits() {
    let Some(cuda) = backend("the_device_path_gives_the_host_paths_bits", Options::default()) else { return };
    same_bits(&cuda, "default family");
    let ampere = Options { family: Some(Family::Ampere), ..Options::default() };
    same_bits(&Cuda::with_options(ampere), "ampere family");
    // The decode rows on the prefill families (on Hopper its split tail: counters and partials).
    let prefill = Options { decode: Some(false), ..Options::default() };
    same_bits(&Cuda::with_options(prefill), "decode family off");
}

/// 8 threads, each with 2 streams of its own on one context, calling at once on their own
/// inputs: every result equals the serial call's, bit for bit.
#[test]
fn threads_and_streams_at_once_equal_serial_calls() {
    let Some(cuda) = backend("threads_and_streams_at_once_equal_serial_calls", Options::default()) else {
        return;
    };
    let ctx = CudaContext::new(0).unwrap();
    let problems = problems();
    let serial: Vec<(Vec<u16>, Vec<f32>)> = (0..16)
        .map(|job| {
            let p = &problems[job % problems.len()];
            let x = inputs(p, 1000 + job as u64);
            device_path(&cuda, p, &x)
        })
        .collect();
    std::thread::scope(|scope| {
        for thread in 0..8 {
            let (cuda, ctx, problems, serial) = (&cuda, &ctx, &problems, &serial);
            scope.spawn(move || {
                let streams = [ctx.new_stream().unwrap(), ctx.new_stream().unwrap()];
                for round in 0..5 {
                    for (s, stream) in streams.iter().enumerate() {
                        let job = 2 * thread + s;
                        let p = &problems[job % problems.len()];
                        let x = inputs(p, 1000 + job as u64);
                        let plan = cuda.plan_cached(ctx, p).unwrap();
                        let got = on_stream(cuda, &plan, stream, p, &x);
                        assert!(
                            got.0 == serial[job].0,
                            "thread {thread} stream {s} round {round}: o differs"
                        );
                        assert_eq!(got.1, serial[job].1, "thread {thread} stream {s} round {round}: lse");
                    }
                }
            });
        }
    });
}

/// After the first call on a stream, calls take no device memory: 200 calls leave the free
/// memory where one call left it.
#[test]
fn calls_take_no_device_memory() {
    let Some(cuda) = backend("calls_take_no_device_memory", Options::default()) else { return };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    // The bf16 decode row (the decode family's workspace: tickets and partial results).
    let p = *problems().last().unwrap();
    assert_eq!(p.dtype, DType::Bf16);
    let plan = cuda.plan_on(&ctx, &p).unwrap();
    let mut t = Resident::<bf16>::new(&stream, &p, &inputs(&p, 7));
    t.run(&cuda, &plan, &stream).unwrap();
    stream.synchronize().unwrap();
    let free = || ctx.mem_get_info().unwrap().0;
    let before = free();
    for _ in 0..200 {
        t.run(&cuda, &plan, &stream).unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(free(), before, "device memory changed over 200 calls");
}

/// The raw entry on cudarc's buffers' addresses and stream gives the typed path's bits.
#[test]
fn the_raw_entry_gives_the_same_bits() {
    let Some(cuda) = backend("the_raw_entry_gives_the_same_bits", Options::default()) else { return };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let p = problems()[0];
    let x = inputs(&p, 11);
    let want = device_path(&cuda, &p, &x);
    let plan = cuda.plan_on(&ctx, &p).unwrap();
    let t = Resident::<bf16>::new(&stream, &p, &x);
    let ptr = |s: &CudaSlice<bf16>| s.device_ptr(&stream).0;
    let at = DevicePointers {
        q: ptr(&t.q),
        k: ptr(&t.k),
        v: ptr(&t.v),
        o: ptr(&t.o),
        lse: Some(t.lse.device_ptr(&stream).0),
    };
    // SAFETY: the buffers hold the problem's elements and live until the stream is synchronized;
    // the stream is of the plan's context.
    unsafe { cuda.run_raw(&plan, at, ExtraPointers::default(), stream.cu_stream()) }.unwrap();
    stream.synchronize().unwrap();
    let got = t.read(&stream, &p);
    assert!(got.0 == want.0 && got.1 == want.1, "the raw entry's result differs");
}

/// Wrong dtype, short or misaligned buffers, an LSE buffer against the problem, another
/// backend's plan: typed errors, nothing launched.
#[test]
fn bad_calls_are_typed_errors() {
    let Some(cuda) = backend("bad_calls_are_typed_errors", Options::default()) else { return };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let p = problems()[0];
    let x = inputs(&p, 3);
    let plan = cuda.plan_on(&ctx, &p).unwrap();
    let mut t = Resident::<bf16>::new(&stream, &p, &x);
    let err = |r: attn_core::Result<()>| r.unwrap_err().to_string();
    // f16 tensors for a bf16 plan.
    let pf = Problem { dtype: DType::F16, ..p };
    let mut f = Resident::<f16>::new(&stream, &pf, &inputs(&pf, 3));
    let e = err(cuda.run_on_stream(
        &plan,
        &f.q,
        &f.k,
        &f.v,
        &mut f.o,
        DeviceArrays::with_lse(t.lse.as_view_mut()),
        &stream,
    ));
    assert!(e.contains("f16") && e.contains("bf16"), "{e}");
    // A q one element short.
    let short = t.q.slice(..t.q.len() - 1);
    let e = err(cuda.run_on_stream(
        &plan,
        &short,
        &t.k,
        &t.v,
        &mut t.o,
        DeviceArrays::with_lse(t.lse.as_view_mut()),
        &stream,
    ));
    assert!(e.contains("elements"), "{e}");
    // A q of the full length starting one element (2 bytes) into a larger buffer.
    let q_len = p.required_lens()[0].1;
    let wide = stream.clone_htod(&vec![bf16::ZERO; q_len + 8]).unwrap();
    let shifted = wide.slice(1..1 + q_len);
    let e = err(cuda.run_on_stream(
        &plan,
        &shifted,
        &t.k,
        &t.v,
        &mut t.o,
        DeviceArrays::with_lse(t.lse.as_view_mut()),
        &stream,
    ));
    assert!(e.contains("16-byte aligned"), "{e}");
    // A plan whose problem was edited after planning (the kernel is compiled for head dim 64).
    let mut edited = plan.clone();
    edited.problem.shape.head_dim = 32;
    let e = err(cuda.run_on_stream(
        &edited,
        &t.q,
        &t.k,
        &t.v,
        &mut t.o,
        DeviceArrays::with_lse(t.lse.as_view_mut()),
        &stream,
    ));
    assert!(e.contains("plan"), "{e}");
    // No LSE buffer for a problem that asks for it.
    let e = err(cuda.run_on_stream(&plan, &t.q, &t.k, &t.v, &mut t.o, DeviceArrays::default(), &stream));
    assert!(e.contains("LSE"), "{e}");
    // A plan of another backend.
    let cpu = attn_cpu_plan(&p);
    let e = err(t.run(&cuda, &cpu, &stream));
    assert!(e.contains("cuda") || e.contains("plan"), "{e}");
}

/// A plan made by another backend (its name and payload are not the CUDA backend's).
fn attn_cpu_plan(p: &Problem) -> attn_core::Plan {
    attn_core::Plan {
        backend: "cpu-flash".into(),
        kernel: "flash".into(),
        problem: *p,
        tiles: attn_core::Tiles { block_m: 1, block_n: 1, stages: 1 },
        execution: attn_core::Execution::Cpu { threads: 1, tasks: 1, isa: "scalar".into() },
        notes: vec![],
        payload: attn_core::Payload::default(),
    }
}

/// One backend serving two devices at once: a thread per device, each planning for its own
/// context and running on its own stream, gives what device 0 gives serially, bit for bit
/// (skipped by name on a machine with one device).
#[test]
fn two_devices_at_once() {
    let Some(cuda) = backend("two_devices_at_once", Options::default()) else { return };
    let devices = CudaContext::device_count().unwrap() as usize;
    if devices < 2 {
        println!("SKIPPED two_devices_at_once: {devices} CUDA device here");
        return;
    }
    let problems = problems();
    let serial: Vec<(Vec<u16>, Vec<f32>)> = problems
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let x = inputs(p, 500 + i as u64);
            device_path(&cuda, p, &x)
        })
        .collect();
    std::thread::scope(|scope| {
        for ordinal in 0..2 {
            let (cuda, problems, serial) = (&cuda, &problems, &serial);
            scope.spawn(move || {
                let ctx = CudaContext::new(ordinal).unwrap();
                let stream = ctx.new_stream().unwrap();
                for (i, p) in problems.iter().enumerate() {
                    let x = inputs(p, 500 + i as u64);
                    let plan = cuda.plan_cached(&ctx, p).unwrap();
                    let got = on_stream(cuda, &plan, &stream, p, &x);
                    assert!(got == serial[i], "device {ordinal}, {p}: differs from device 0's serial result");
                }
                println!("device {ordinal}: {} problems, same bits as device 0", problems.len());
            });
        }
    });
}

/// Problems with index arrays (FlashAttention's layouts, from `attn_core::batch_of`): packed
/// queries and keys with empty and one-token sequences, causal (the Ampere/Ada family); a paged
/// cache of shuffled pages with ALiBi per (batch, head), one query per sequence (the decode
/// family) and four (Ampere/Ada); dense keys with per-sequence counts and soft-cap.
fn sequence_problems() -> Vec<(Problem, attn_core::OwnedExtras)> {
    use attn_core::Alibi;
    use attn_core::sequences::{KeyStore, alibi_standard_slopes, batch_of};
    let shape = Shape { heads_kv: 2, ..Shape::new(1, 8, 1, 64) };
    let mut all = vec![];
    let (p, e) = batch_of(shape, DType::Bf16, &[70, 0, 1, 130], &[90, 3, 0, 200], KeyStore::Packed);
    all.push((p.causal().with_lse(true), e));
    for q in [1, 4] {
        let paged = KeyStore::Paged { page_size: 16, seed: 5 };
        let (p, mut e) = batch_of(shape, DType::F16, &[q; 3], &[700, 33, 1000], paged);
        let slopes: Vec<f32> = (0..3).flat_map(|_| alibi_standard_slopes(8)).collect();
        e.alibi_slopes = Some(slopes);
        all.push((p.with_alibi(Alibi::PerBatchHead).causal().with_lse(true), e));
    }
    let (p, e) = batch_of(shape, DType::Bf16, &[64; 2], &[100, 257], KeyStore::DenseUsed);
    all.push((p.with_softcap(30.0), e));
    all
}

/// Device copies of `e`'s arrays on `stream`.
struct DeviceIndices {
    ints: [Option<CudaSlice<i32>>; 4],
    slopes: Option<CudaSlice<f32>>,
}

impl DeviceIndices {
    fn new(stream: &Arc<CudaStream>, e: &attn_core::OwnedExtras) -> Self {
        let up = |x: &Option<Vec<i32>>| x.as_ref().map(|x| stream.clone_htod(x).unwrap());
        DeviceIndices {
            ints: [up(&e.cu_seqlens_q), up(&e.cu_seqlens_k), up(&e.seqused_k), up(&e.block_table)],
            slopes: e.alibi_slopes.as_ref().map(|x| stream.clone_htod(x).unwrap()),
        }
    }

    /// The arrays as a call takes them, with `lse`.
    fn arrays<'a>(&'a self, lse: Option<cudarc::driver::CudaViewMut<'a, f32>>) -> DeviceArrays<'a> {
        let [q, k, used, table] = self.ints.each_ref().map(|x| x.as_ref().map(|x| x.as_view()));
        DeviceArrays {
            lse,
            cu_seqlens_q: q,
            cu_seqlens_k: k,
            seqused_k: used,
            block_table: table,
            alibi_slopes: self.slopes.as_ref().map(|x| x.as_view()),
        }
    }
}

/// `plan` on fresh device copies of `x` and the index arrays `idx` on `stream` (waited for): o's
/// bits and the LSE, or the call's error.
fn with_indices<T: Half>(
    cuda: &Cuda,
    plan: &attn_core::Plan,
    stream: &Arc<CudaStream>,
    x: &[Buffer; 3],
    idx: &DeviceIndices,
) -> attn_core::Result<(Vec<u16>, Vec<f32>)> {
    let p = &plan.problem;
    let mut t = Resident::<T>::new(stream, p, x);
    let arrays = idx.arrays(p.params.return_lse.then(|| t.lse.as_view_mut()));
    cuda.run_on_stream(plan, &t.q, &t.k, &t.v, &mut t.o, arrays, stream)?;
    stream.synchronize().unwrap_or_else(|err| panic!("{p} ({}): the kernel faulted: {err}", plan.kernel));
    Ok(t.read(stream, p))
}

/// [`with_indices`] in the problem's dtype.
fn run_indices(
    cuda: &Cuda,
    plan: &attn_core::Plan,
    stream: &Arc<CudaStream>,
    x: &[Buffer; 3],
    idx: &DeviceIndices,
) -> attn_core::Result<(Vec<u16>, Vec<f32>)> {
    match plan.problem.dtype {
        DType::F16 => with_indices::<f16>(cuda, plan, stream, x, idx),
        _ => with_indices::<bf16>(cuda, plan, stream, x, idx),
    }
}

/// Index arrays given as device memory: the host-copy path's bits (which copies them itself);
/// an array missing is a typed error naming it.
#[test]
fn index_arrays_in_device_memory_give_the_host_paths_bits() {
    let Some(cuda) = backend("index_arrays_in_device_memory_give_the_host_paths_bits", Options::default())
    else {
        return;
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    for (i, (p, e)) in sequence_problems().into_iter().enumerate() {
        let x = inputs(&p, 40 + i as u64);
        let mut o = Buffer::zeros(p.dtype, p.required_lens()[3].1);
        let mut lse = vec![0f32; p.lse_len()];
        let host_inputs = Inputs::new(x[0].as_data(), x[1].as_data(), x[2].as_data()).with_extras(e.borrow());
        let lse_out = p.params.return_lse.then_some(lse.as_mut_slice());
        cuda.forward(&p, host_inputs, Outputs { o: o.as_data_mut(), lse: lse_out }).unwrap();
        let plan = cuda.plan_on(&ctx, &p).unwrap();
        let got = run_indices(&cuda, &plan, &stream, &x, &DeviceIndices::new(&stream, &e)).unwrap();
        assert!(got.0 == bits(&o), "{p} ({}): o differs from the host-copy path", plan.kernel);
        if p.params.return_lse {
            let b = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(b(&got.1), b(&lse), "{p} ({}): lse", plan.kernel);
        }
        // Without one of its arrays: a typed error naming it, before any launch.
        let mut fewer = e.clone();
        let name = match () {
            _ if fewer.block_table.take().is_some() => "block_table",
            _ if fewer.cu_seqlens_k.take().is_some() => "cu_seqlens_k",
            _ => {
                fewer.seqused_k.take();
                "seqused_k"
            }
        };
        let err = run_indices(&cuda, &plan, &stream, &x, &DeviceIndices::new(&stream, &fewer)).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
        println!("{p}: {}: same bits", plan.kernel);
    }
}

/// Corrupt index arrays (page numbers past the cache and negative, offsets that decrease or
/// run past the packed rows, key counts far past the cache): the kernels clamp them, so the
/// call runs without a fault (run it under compute-sanitizer to see no access outside the
/// buffers: `bench/device/resident-extras.sh`).
#[test]
fn corrupt_index_arrays_run_without_faults() {
    let Some(cuda) = backend("corrupt_index_arrays_run_without_faults", Options::default()) else { return };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    for (i, (p, mut e)) in sequence_problems().into_iter().enumerate() {
        let corrupt = |v: &mut Option<Vec<i32>>, bad: &[i32]| {
            if let Some(v) = v {
                v.iter_mut().zip(bad.iter().cycle()).for_each(|(x, b)| *x = *b);
            }
        };
        corrupt(&mut e.block_table, &[1 << 30, -5, i32::MAX, i32::MIN]);
        corrupt(&mut e.seqused_k, &[i32::MAX, -1, 1 << 20]);
        corrupt(&mut e.cu_seqlens_q, &[0, 500, 3, i32::MAX, -9]);
        corrupt(&mut e.cu_seqlens_k, &[i32::MIN, 10_000, 2, 1 << 29, 0]);
        assert!(p.check_extras(&e.borrow()).is_err(), "{p}: the arrays are not corrupt");
        let x = inputs(&p, 70 + i as u64);
        let plan = cuda.plan_on(&ctx, &p).unwrap();
        run_indices(&cuda, &plan, &stream, &x, &DeviceIndices::new(&stream, &e)).unwrap();
        println!("{p}: {}: corrupt arrays ran without a fault", plan.kernel);
    }
}
