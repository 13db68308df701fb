//! The device-resident calls (`attn_cuda::device`) on a real GPU: the same bits as the
//! host-copy path for every kernel family, head dim, dtype and mask; many threads and streams at
//! once giving what serial calls give; no device memory taken per call; the raw entry; and the
//! typed errors. Prints `SKIPPED <test>: <reason>` where there is no GPU (fails instead with
//! `ATTN_REQUIRE_CUDA=on`).

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::{Attention, Buffer, DType, Inputs, Layout, Outputs, Problem, Shape};
use attn_cuda::{Cuda, DeviceElement, DevicePointers, Family, Options, probe};
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
        let mut lse = self.lse.as_view_mut();
        let lse = plan.problem.params.return_lse.then_some(&mut lse);
        cuda.run_on_stream(plan, &self.q, &self.k, &self.v, &mut self.o, lse, stream)
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
    unsafe { cuda.run_raw(&plan, at, stream.cu_stream()) }.unwrap();
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
    let mut lse = t.lse.as_view_mut();
    let e = err(cuda.run_on_stream(&plan, &f.q, &f.k, &f.v, &mut f.o, Some(&mut lse), &stream));
    assert!(e.contains("f16") && e.contains("bf16"), "{e}");
    // A q one element short.
    let short = t.q.slice(..t.q.len() - 1);
    let e = err(cuda.run_on_stream(&plan, &short, &t.k, &t.v, &mut t.o, Some(&mut lse), &stream));
    assert!(e.contains("elements"), "{e}");
    // A q of the full length starting one element (2 bytes) into a larger buffer.
    let q_len = p.required_lens()[0].1;
    let wide = stream.clone_htod(&vec![bf16::ZERO; q_len + 8]).unwrap();
    let shifted = wide.slice(1..1 + q_len);
    let e = err(cuda.run_on_stream(&plan, &shifted, &t.k, &t.v, &mut t.o, Some(&mut lse), &stream));
    assert!(e.contains("16-byte aligned"), "{e}");
    // A plan whose problem was edited after planning (the kernel is compiled for head dim 64).
    let mut edited = plan.clone();
    edited.problem.shape.head_dim = 32;
    let e = err(cuda.run_on_stream(&edited, &t.q, &t.k, &t.v, &mut t.o, Some(&mut lse), &stream));
    assert!(e.contains("plan"), "{e}");
    // No LSE buffer for a problem that asks for it.
    let e = err(cuda.run_on_stream(&plan, &t.q, &t.k, &t.v, &mut t.o, None, &stream));
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
