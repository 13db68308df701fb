//! The device-resident path (`attn_wgpu::resident`) against the host path of the same backend:
//! the same bits for f32, f16 and bf16, strided and offset views (BSHD, padded rows, q, k and v in
//! one fused buffer, 16-bit tensors starting in the middle of a word), GQA, causal masks, the LSE
//! on and off, a problem long enough for the key split on software adapters, packed and paged
//! sequences from index arrays in the caller's buffers, and recording into the caller's encoder
//! between the caller's own commands. Outputs are poisoned first, and everything outside the
//! output views must stay poisoned, with corrupt index arrays too. Then the typed errors.
//!
//! The backend runs on a device the test opens itself ([`Wgpu::from_device`]). Without an
//! adapter each test prints `SKIPPED <test>: <reason>` and passes, unless `ATTN_REQUIRE_WGPU=1`,
//! where it fails.

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::{
    Attention, Buffer, DType, Error, Inputs, Layout, Outputs, Plan, Problem, Shape, Strides, TensorStrides,
};
use attn_wgpu::options::REQUIRE_WGPU;
use attn_wgpu::{DeviceInputs, DeviceOutputs, DeviceSequences, DeviceTensor, Options, Wgpu};
use std::sync::OnceLock;
use wgpu::util::DeviceExt;

/// The byte every poisoned output starts as: 0xffff.. is a NaN in f32, f16 and bf16 alike.
const POISON: u8 = 0xff;

/// The test binary's backend, on a device opened here, or `None` after printing why the test is
/// skipped.
fn backend(test: &str) -> Option<&'static Wgpu> {
    static BACKEND: OnceLock<Result<Wgpu, String>> = OnceLock::new();
    match BACKEND.get_or_init(open) {
        Ok(b) => Some(b),
        Err(reason) => {
            if REQUIRE_WGPU.on_off().unwrap() == Some(true) {
                panic!("an adapter is required (ATTN_REQUIRE_WGPU=1) but none opened: {reason}");
            }
            eprintln!("SKIPPED {test}: {reason}");
            None
        }
    }
}

/// A device as an application would open it: the adapter's limits, and the optional features
/// the backend can use where the adapter has them.
fn open() -> Result<Wgpu, String> {
    open_with(wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP)
}

/// A device opened with those of `wanted` that the adapter has, and the backend on it.
fn open_with(wanted: wgpu::Features) -> Result<Wgpu, String> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
        .map_err(|e| format!("no adapter: {e}"))?;
    let features = adapter.features() & wanted;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("the caller's device"),
        required_features: features,
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .map_err(|e| format!("no device: {e}"))?;
    Wgpu::from_device(&adapter, device, queue, Options::default()).map_err(|e| e.to_string())
}

/// A buffer on the backend's device holding `bytes`.
fn upload(b: &Wgpu, label: &str, bytes: &[u8], usage: wgpu::BufferUsages) -> wgpu::Buffer {
    b.device().unwrap().create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytes,
        usage,
    })
}

/// The bytes of `buffer`, after everything submitted so far.
fn download(b: &Wgpu, buffer: &wgpu::Buffer) -> Vec<u8> {
    let (device, queue) = (b.device().unwrap(), b.queue().unwrap());
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: buffer.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, buffer.size());
    queue.submit([encoder.finish()]);
    staging.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
    device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
    let bytes = staging.get_mapped_range(..).expect("mapped").to_vec();
    staging.unmap();
    bytes
}

/// The little-endian bytes of a host buffer's elements.
fn bytes(x: &Buffer) -> Vec<u8> {
    match x {
        Buffer::F32(v) => v.iter().flat_map(|e| e.to_le_bytes()).collect(),
        Buffer::F16(v) => v.iter().flat_map(|e| e.to_bits().to_le_bytes()).collect(),
        Buffer::Bf16(v) => v.iter().flat_map(|e| e.to_bits().to_le_bytes()).collect(),
    }
}

/// The usages of the test's tensors.
const USAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

/// Where the test puts a tensor: `lead` bytes of its buffer before it, `tail` after.
#[derive(Clone, Copy)]
struct Placement {
    lead: u64,
    tail: u64,
}

impl Placement {
    /// Where the LSE starts (f32: the lead rounded down to whole elements).
    fn lse(self) -> Placement {
        Placement { lead: self.lead / 4 * 4, ..self }
    }
}

const AT_ZERO: Placement = Placement { lead: 0, tail: 0 };

/// One problem's inputs and the host path's results.
struct Case {
    problem: Problem,
    plan: Plan,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    /// The host path's output buffer (its view written, the rest NaN) and LSE.
    o: Buffer,
    lse: Vec<f32>,
    /// ALiBi's slopes, where the problem has ALiBi.
    slopes: Option<Vec<f32>>,
    /// The index arrays of packed or paged sequences (none for a dense problem).
    indices: attn_core::OwnedExtras,
}

impl Case {
    fn new(b: &Wgpu, problem: Problem, seed: u64) -> Case {
        Case::with_indices(b, problem, attn_core::OwnedExtras::default(), seed)
    }

    /// A problem of packed or paged sequences, with its index arrays.
    fn with_indices(b: &Wgpu, problem: Problem, indices: attn_core::OwnedExtras, seed: u64) -> Case {
        let mut rng = SplitMix64::new(seed);
        let [q_len, k_len, v_len, o_len] = problem.required_lens().map(|(_, n)| n);
        let q = normal_buffer(&mut rng, problem.dtype, q_len, 1.0);
        let k = normal_buffer(&mut rng, problem.dtype, k_len, 1.0);
        let v = normal_buffer(&mut rng, problem.dtype, v_len, 1.0);
        let s = problem.shape;
        // Distinct slopes per head (and batch), as ALiBi's geometric ones are.
        let slopes = problem.params.alibi.map(|alibi| {
            let n = match alibi {
                attn_core::Alibi::PerHead => s.heads_q,
                attn_core::Alibi::PerBatchHead => s.batch * s.heads_q,
            };
            (0..n).map(|i| 0.5f32.powi(i as i32 % 8 + 1) * (1.0 + 0.1 * (i / 8) as f32)).collect::<Vec<_>>()
        });
        let mut o = Buffer::zeros(problem.dtype, o_len);
        let mut lse = vec![0.0f32; problem.lse_len()];
        let extras = attn_core::Extras { alibi_slopes: slopes.as_deref(), ..indices.borrow() };
        let inputs = Inputs::new(q.as_data(), k.as_data(), v.as_data()).with_extras(extras);
        let lse_out = problem.params.return_lse.then_some(lse.as_mut_slice());
        let mut outputs = Outputs { o: o.as_data_mut(), lse: lse_out };
        outputs.poison();
        let plan = b.forward(&problem, inputs, outputs).unwrap_or_else(|e| panic!("{problem}: {e}"));
        Case { problem, plan, q, k, v, o, lse, slopes, indices }
    }

    /// Buffers for the device path: q, k, v with their data at `at`, o and the LSE poisoned.
    fn buffers(&self, b: &Wgpu, at: Placement) -> [wgpu::Buffer; 5] {
        let placed = |label, data: Vec<u8>, fill: u8, at: Placement| {
            let mut all = vec![fill; at.lead as usize];
            all.extend(data);
            all.extend(vec![fill; at.tail as usize]);
            all.resize(all.len().div_ceil(4) * 4, fill);
            upload(b, label, &all, USAGE)
        };
        let o_bytes = self.o.len() * self.problem.dtype.size();
        [
            placed("q", bytes(&self.q), 0x11, at),
            placed("k", bytes(&self.k), 0x22, at),
            placed("v", bytes(&self.v), 0x33, at),
            placed("o", vec![POISON; o_bytes], POISON, at),
            placed("lse", vec![POISON; 4 * self.lse.len().max(1)], POISON, at.lse()),
        ]
    }

    /// Checks the device path's o and LSE (read from `o` and `lse` at `at`) against the host
    /// path's, bit for bit, and that nothing else in the two buffers was written.
    fn check(&self, b: &Wgpu, o: &wgpu::Buffer, lse: &wgpu::Buffer, at: Placement) {
        let name = format!("{} ({})", self.problem, self.plan.kernel);
        let got = download(b, o);
        let lead = at.lead as usize;
        let want = bytes(&self.o);
        let size = self.problem.dtype.size();
        let s = self.problem.shape;
        let mut in_view = vec![false; self.o.len()];
        let extras = attn_core::Extras { alibi_slopes: self.slopes.as_deref(), ..self.indices.borrow() };
        let map = self.problem.seq_map(extras).expect("valid indices");
        for (b, h, i) in map.rows() {
            let at = map.o_offset(b, h, i);
            in_view[at..at + s.head_dim].iter_mut().for_each(|x| *x = true);
        }
        for (i, (w, g)) in want.chunks(size).zip(got[lead..].chunks(size)).enumerate() {
            if in_view[i] {
                assert_eq!(w, g, "{name}: o element {i}");
            } else {
                assert!(g.iter().all(|&x| x == POISON), "{name}: element {i} outside the view was written");
            }
        }
        assert!(
            got[..lead].iter().chain(&got[lead + want.len()..]).all(|&x| x == POISON),
            "{name}: o's margins"
        );
        let got = download(b, lse);
        let lead = at.lse().lead as usize;
        if self.problem.params.return_lse {
            let want: Vec<u8> = self.lse.iter().flat_map(|x| x.to_le_bytes()).collect();
            assert_eq!(&got[lead..lead + want.len()], &want[..], "{name}: lse");
            assert!(
                got[..lead].iter().chain(&got[lead + want.len()..]).all(|&x| x == POISON),
                "{name}: lse margins"
            );
        } else {
            assert!(got.iter().all(|&x| x == POISON), "{name}: an LSE not asked for was written");
        }
    }

    /// The slopes (where the problem has ALiBi) in a buffer of their own, at `at`'s lead
    /// rounded down to whole f32s, with garbage around them.
    fn slopes_buffer(&self, b: &Wgpu, at: Placement) -> Option<wgpu::Buffer> {
        let slopes = self.slopes.as_ref()?;
        let mut all = vec![0x7f; at.lse().lead as usize];
        all.extend(slopes.iter().flat_map(|x| x.to_le_bytes()));
        all.extend(vec![0x7f; at.tail as usize / 4 * 4]);
        Some(upload(b, "slopes", &all, USAGE))
    }

    /// The index arrays, each in a buffer of its own at `at`'s lead rounded down to whole
    /// i32s, with garbage around them.
    fn index_buffers(&self, b: &Wgpu, at: Placement) -> [Option<wgpu::Buffer>; 4] {
        let e = &self.indices;
        [&e.cu_seqlens_q, &e.cu_seqlens_k, &e.seqused_k, &e.block_table].map(|x| {
            let mut all = vec![0x5a; at.lse().lead as usize];
            all.extend(x.as_ref()?.iter().flat_map(|i| i.to_le_bytes()));
            all.extend(vec![0x5a; at.tail as usize / 4 * 4]);
            Some(upload(b, "indices", &all, USAGE))
        })
    }

    /// Runs the device path at `at` through [`Wgpu::submit`] and checks it.
    fn run_and_check(&self, b: &Wgpu, at: Placement) {
        let [q, k, v, o, lse] = self.buffers(b, at);
        let slopes = self.slopes_buffer(b, at);
        let indices = self.index_buffers(b, at);
        let t = |buffer| DeviceTensor::at(buffer, at.lead);
        let mut inputs = DeviceInputs::new(t(&q), t(&k), t(&v));
        inputs.alibi_slopes = slopes.as_ref().map(|s| DeviceTensor::at(s, at.lse().lead));
        let [cu_seqlens_q, cu_seqlens_k, seqused_k, block_table] =
            indices.each_ref().map(|x| x.as_ref().map(|x| DeviceTensor::at(x, at.lse().lead)));
        inputs.sequences = DeviceSequences { cu_seqlens_q, cu_seqlens_k, seqused_k, block_table };
        let outputs = DeviceOutputs {
            o: t(&o),
            lse: self.problem.params.return_lse.then(|| DeviceTensor::at(&lse, at.lse().lead)),
        };
        b.submit(&self.plan, inputs, outputs).unwrap_or_else(|e| panic!("{}: {e}", self.problem));
        self.check(b, &o, &lse, at);
    }
}

fn shape(batch: usize, heads_q: usize, heads_kv: usize, seq_q: usize, seq_k: usize, d: usize) -> Shape {
    Shape { heads_q, heads_kv, seq_q, seq_k, ..Shape::new(batch, heads_q, 1, d) }
}

#[test]
fn same_bits_as_the_host_path_for_every_dtype() {
    let Some(b) = backend("same_bits_as_the_host_path_for_every_dtype") else { return };
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for (i, (s, causal, lse)) in [
            (shape(1, 1, 1, 1, 1, 32), false, true),
            (shape(2, 4, 2, 37, 45, 40), false, true),
            (shape(2, 4, 2, 37, 45, 40), true, false),
            (shape(1, 8, 1, 70, 19, 64), true, true),
            (shape(1, 2, 2, 33, 130, 128), false, false),
        ]
        .into_iter()
        .enumerate()
        {
            let p = Problem::new(s, dtype).with_lse(lse);
            let p = if causal { p.causal() } else { p };
            Case::new(b, p, 100 + i as u64).run_and_check(b, AT_ZERO);
        }
    }
}

#[test]
fn strided_and_offset_views() {
    let Some(b) = backend("strided_and_offset_views") else { return };
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        let s = shape(2, 4, 2, 29, 53, 24);
        // BSHD, contiguous.
        let p = Problem::new(s, dtype).with_layout(Layout::Bshd).with_lse(true);
        Case::new(b, p, 1).run_and_check(b, AT_ZERO);
        // Rows padded (seq stride past the head dim) and a gap between batches, in BHSD and
        // BSHD orders; the output too.
        let padded =
            |heads: usize, seq: usize| Strides { batch: heads * seq * 40 + 8, head: seq * 40, seq: 40 };
        let bshd =
            |heads: usize, seq: usize| Strides { batch: seq * heads * 32 + 6, head: 32, seq: heads * 32 };
        let t = TensorStrides { q: padded(4, 29), k: bshd(2, 53), v: padded(2, 53), o: bshd(4, 29) };
        let p = Problem::new(s, dtype).with_strides(t).causal().with_lse(true);
        let case = Case::new(b, p, 2);
        // At offset 0, at a multiple of the alignment, and (16-bit) at an odd element, where
        // rows share words with the gaps and the margin.
        case.run_and_check(b, AT_ZERO);
        case.run_and_check(b, Placement { lead: 512, tail: 8 });
        let odd = if dtype.size() == 2 { 10 } else { 12 };
        case.run_and_check(b, Placement { lead: odd, tail: 6 });
    }
}

/// q, k and v interleaved in one buffer, as a fused QKV projection writes them: [batch, seq,
/// 3, heads, d].
#[test]
fn fused_qkv_in_one_buffer() {
    let Some(b) = backend("fused_qkv_in_one_buffer") else { return };
    let (h, d, seq) = (4, 32, 41);
    let s = shape(2, h, h, seq, seq, d);
    let st = Strides { batch: seq * 3 * h * d, head: d, seq: 3 * h * d };
    let p = Problem::new(s, DType::F16).with_strides(TensorStrides { q: st, k: st, v: st, o: st }).causal();
    // The host path reads its q, k and v from one slice each; give each the whole fused buffer.
    let mut rng = SplitMix64::new(7);
    let fused = normal_buffer(&mut rng, DType::F16, 2 * seq * 3 * h * d, 1.0);
    let Buffer::F16(all) = &fused else { unreachable!() };
    let view = |at: usize| Buffer::F16(all[at..].to_vec());
    let (q, k, v) = (view(0), view(h * d), view(2 * h * d));
    let p = p.with_strides(TensorStrides { o: Layout::Bshd.strides(h, seq, d), ..p.strides });
    let mut o = Buffer::zeros(DType::F16, p.required_lens()[3].1);
    let inputs = Inputs::new(q.as_data(), k.as_data(), v.as_data());
    let plan = b.forward(&p, inputs, Outputs { o: o.as_data_mut(), lse: None }).unwrap();
    let qkv = upload(b, "qkv", &bytes(&fused), USAGE);
    let dev_o = upload(b, "o", &vec![POISON; o.len() * 2], USAGE);
    let el = 2;
    let inputs = DeviceInputs::new(
        DeviceTensor::at(&qkv, 0),
        DeviceTensor::at(&qkv, (h * d * el) as u64),
        DeviceTensor::at(&qkv, (2 * h * d * el) as u64),
    );
    b.submit(&plan, inputs, DeviceOutputs { o: DeviceTensor::new(&dev_o), lse: None }).unwrap();
    assert_eq!(download(b, &dev_o), bytes(&o));
}

/// The backend plans with the features the caller's device was opened with, not the adapter's:
/// without `SHADER_F16`, f16 is a typed error at plan time (f32 still runs).
#[test]
fn plans_follow_the_callers_device_features() {
    let Some(_) = backend("plans_follow_the_callers_device_features") else { return };
    let b = open_with(wgpu::Features::empty()).expect("the adapter opened once already");
    let e = b.plan(&Problem::new(shape(1, 2, 1, 8, 8, 32), DType::F16)).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    let case = Case::new(&b, Problem::new(shape(1, 2, 1, 29, 53, 24), DType::Bf16).causal(), 50);
    case.run_and_check(&b, Placement { lead: 262, tail: 2 });
}

/// Enough keys that software adapters split them over dispatches (plan::KeySplit).
#[test]
fn long_keys_split_on_software_adapters() {
    let Some(b) = backend("long_keys_split_on_software_adapters") else { return };
    for dtype in [DType::F32, DType::Bf16] {
        let p = Problem::new(shape(1, 2, 1, 3, 20_000, 32), dtype).with_lse(true);
        let case = Case::new(b, p, 11);
        let split = case.plan.notes.iter().any(|n| n.contains("keys split over"));
        eprintln!("{}: key split {split}", case.plan.kernel);
        if matches!(
            b.availability(),
            attn_core::Availability::Available { kind: attn_core::DeviceKind::SoftwareGpu, .. }
        ) {
            assert!(split, "{:?}", case.plan.notes);
        }
        case.run_and_check(b, AT_ZERO);
    }
}

/// Sliding windows and soft-caps need no data beyond q, k and v: the device path runs them, bit
/// for bit as the host path, split over keys on software adapters too.
#[test]
fn windows_and_soft_caps() {
    let Some(b) = backend("windows_and_soft_caps") else { return };
    for (i, p) in [
        Problem::new(shape(2, 4, 2, 37, 90, 64), DType::F32).with_window(Some(10), Some(3)).with_lse(true),
        Problem::new(shape(1, 2, 2, 70, 45, 128), DType::F16).with_softcap(3.0).causal(),
        Problem::new(shape(1, 2, 1, 3, 20_000, 32), DType::Bf16)
            .with_window(Some(5000), Some(0))
            .with_softcap(8.0)
            .with_lse(true),
    ]
    .into_iter()
    .enumerate()
    {
        let case = Case::new(b, p, 60 + i as u64);
        assert!(
            case.plan.kernel.contains("_window_") || case.plan.kernel.contains("_cap"),
            "{}",
            case.plan.kernel
        );
        case.run_and_check(b, AT_ZERO);
    }
}

/// ALiBi with the slopes in the caller's buffer (per head and per batch and head, at an offset,
/// with the other score features, split over keys on software adapters): the host path's bits.
#[test]
fn alibi_with_slopes_in_the_callers_buffer() {
    let Some(b) = backend("alibi_with_slopes_in_the_callers_buffer") else { return };
    use attn_core::Alibi::{PerBatchHead, PerHead};
    for (i, (p, at)) in [
        (Problem::new(shape(2, 4, 2, 37, 45, 40), DType::F32).with_alibi(PerHead).with_lse(true), AT_ZERO),
        (
            Problem::new(shape(3, 4, 1, 29, 53, 64), DType::F16).with_alibi(PerBatchHead).causal(),
            Placement { lead: 516, tail: 8 },
        ),
        (
            Problem::new(shape(2, 2, 2, 70, 19, 128), DType::Bf16)
                .with_alibi(PerBatchHead)
                .with_window(Some(9), Some(4))
                .with_softcap(5.0)
                .with_lse(true),
            Placement { lead: 10, tail: 6 },
        ),
        (
            Problem::new(shape(1, 2, 1, 3, 20_000, 32), DType::F32).with_alibi(PerHead).with_lse(true),
            Placement { lead: 8, tail: 0 },
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let case = Case::new(b, p, 80 + i as u64);
        assert!(case.plan.kernel.contains("_alibi"), "{}", case.plan.kernel);
        case.run_and_check(b, at);
    }
}

/// The slopes are checked before anything is recorded: missing, given without ALiBi, short, at
/// an odd offset, in a buffer without `COPY_SRC`; so is a paged cache's missing block table.
#[test]
fn alibi_and_paged_typed_errors() {
    let Some(b) = backend("alibi_and_paged_typed_errors") else { return };
    let p = Problem::new(shape(2, 2, 2, 8, 8, 32), DType::F32).with_alibi(attn_core::Alibi::PerBatchHead);
    let case = Case::new(b, p, 70);
    let [q, k, v, o, lse] = case.buffers(b, AT_ZERO);
    let slopes = case.slopes_buffer(b, AT_ZERO).expect("slopes");
    let t = DeviceTensor::new;
    let inputs = DeviceInputs::new(t(&q), t(&k), t(&v));
    let outputs = DeviceOutputs { o: t(&o), lse: None };
    let slopes_error = |plan: &Plan, inputs| match b.submit(plan, inputs, outputs) {
        Err(Error::Shape { tensor: "alibi_slopes", what }) => what,
        other => panic!("{other:?}"),
    };
    let what = slopes_error(&case.plan, inputs);
    assert!(what.contains("no slopes buffer"), "{what}");
    let plain = b.plan(&Problem { params: attn_core::Params { alibi: None, ..p.params }, ..p }).unwrap();
    let what = slopes_error(&plain, inputs.with_alibi_slopes(t(&slopes)));
    assert!(what.contains("has no ALiBi"), "{what}");
    // [heads_q] slopes for a [batch, heads_q] problem.
    let short = upload(b, "short slopes", &[0; 8], USAGE);
    let what = slopes_error(&case.plan, inputs.with_alibi_slopes(t(&short)));
    assert!(what.contains("past the buffer"), "{what}");
    let what = slopes_error(&case.plan, inputs.with_alibi_slopes(DeviceTensor::at(&slopes, 2)));
    assert!(what.contains("multiple of"), "{what}");
    let no_copy = upload(b, "no copy", &[0; 16], wgpu::BufferUsages::STORAGE);
    let what = slopes_error(&case.plan, inputs.with_alibi_slopes(t(&no_copy)));
    assert!(what.contains("COPY_SRC"), "{what}");
    // Paged keys without their block table.
    let paged = Problem::new(shape(1, 2, 2, 8, 8, 32), DType::F32).with_batching(attn_core::Batching {
        kv: attn_core::KvRows::Paged { page_size: 8, pages: 1, pages_per_seq: 1 },
        ..Default::default()
    });
    match b.submit(&b.plan(&paged).unwrap(), inputs, outputs) {
        Err(Error::Shape { tensor: "block_table", what }) => assert!(what.contains("required"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert!(download(b, &o).iter().all(|&x| x == POISON), "o was written");
    // After all that, the right call runs.
    b.submit(&case.plan, inputs.with_alibi_slopes(t(&slopes)), outputs).unwrap();
    case.check(b, &o, &lse, AT_ZERO);
}

/// Packed (varlen) queries and keys (an empty sequence, one-token ones, queries longer than
/// keys), a paged cache with shuffled pages, a dense cache with key counts: with their index
/// arrays in the caller's buffers at offsets, the host path's bits; with the score features and
/// the LSE too.
#[test]
fn sequences_from_the_callers_index_arrays() {
    let Some(b) = backend("sequences_from_the_callers_index_arrays") else { return };
    use attn_core::sequences::{KeyStore, batch_of};
    let (q_lens, k_lens) = ([5, 0, 1, 40, 17], [9, 3, 1, 33, 70]);
    let gqa = shape(1, 4, 2, 1, 1, 64);
    let paged = KeyStore::Paged { page_size: 16, seed: 3 };
    for (i, (keys, dtype, at)) in [
        (KeyStore::Packed, DType::F32, AT_ZERO),
        (KeyStore::Packed, DType::Bf16, Placement { lead: 6, tail: 2 }),
        (paged, DType::F16, Placement { lead: 260, tail: 4 }),
        (KeyStore::DenseUsed, DType::Bf16, Placement { lead: 8, tail: 0 }),
    ]
    .into_iter()
    .enumerate()
    {
        let (p, indices) = batch_of(gqa, dtype, &q_lens, &k_lens, keys);
        let mut problems = vec![p.causal().with_lse(true), p.with_window(Some(6), Some(2)).with_softcap(8.0)];
        if i == 2 {
            problems.push(p.causal().with_alibi(attn_core::Alibi::PerBatchHead).with_lse(true));
        }
        // Decode: one query a sequence (dense queries) over the same keys.
        let (decode, decode_indices) = batch_of(gqa, dtype, &[1; 5], &k_lens, keys);
        for (j, p) in problems.into_iter().enumerate() {
            let case = Case::with_indices(b, p, indices.clone(), 100 + 10 * i as u64 + j as u64);
            assert!(case.plan.kernel.ends_with("_vl"), "{}", case.plan.kernel);
            case.run_and_check(b, at);
        }
        Case::with_indices(b, decode.causal().with_lse(true), decode_indices, 150 + i as u64)
            .run_and_check(b, at);
    }
}

/// Index arrays whose contents are wrong (offsets past the rows, decreasing or negative; key
/// counts past the keys; page numbers past the cache or negative): the call runs, and writes
/// nothing outside o's and the LSE's views (the passes clamp every index into the problem's
/// bounds; a wrong row, never a bad access). The arrays given or missing are checked first.
#[test]
fn corrupt_index_arrays_stay_in_bounds() {
    let Some(b) = backend("corrupt_index_arrays_stay_in_bounds") else { return };
    use attn_core::sequences::{KeyStore, batch_of};
    let gqa = shape(1, 4, 2, 1, 1, 32);
    let paged = KeyStore::Paged { page_size: 16, seed: 5 };
    for (i, keys) in [KeyStore::Packed, paged].into_iter().enumerate() {
        let (p, indices) = batch_of(gqa, DType::F16, &[3, 9, 1], &[20, 7, 40], keys);
        let case = Case::with_indices(b, p.causal().with_lse(true), indices, 200 + i as u64);
        let at = Placement { lead: 12, tail: 8 };
        let [q, k, v, o, lse] = case.buffers(b, at);
        let int = |x: &[i32]| upload(b, "bad indices", bytemuck::cast_slice(x), USAGE);
        let cu_q = int(&[0, 1 << 30, -7, 5]);
        let cu_k = int(&[3, 1, i32::MAX, -1]);
        let used = int(&[1000, -3, 40]);
        let table = int(&[i32::MIN, 99, 7, -1, 1 << 20, 2, 0, 0, 0]);
        let e = &case.indices;
        fn t(x: &wgpu::Buffer) -> Option<DeviceTensor<'_>> {
            Some(DeviceTensor::new(x))
        }
        let sequences = DeviceSequences {
            cu_seqlens_q: e.cu_seqlens_q.as_ref().and(t(&cu_q)),
            cu_seqlens_k: e.cu_seqlens_k.as_ref().and(t(&cu_k)),
            seqused_k: e.seqused_k.as_ref().and(t(&used)),
            block_table: e.block_table.as_ref().and(t(&table)),
        };
        let d = |x| DeviceTensor::at(x, at.lead);
        let inputs = DeviceInputs::new(d(&q), d(&k), d(&v)).with_sequences(sequences);
        let outputs = DeviceOutputs { o: d(&o), lse: Some(DeviceTensor::at(&lse, at.lse().lead)) };
        b.submit(&case.plan, inputs, outputs).unwrap_or_else(|e| panic!("{}: {e}", case.problem));
        let lead = at.lead as usize;
        let o_bytes = case.o.len() * 2;
        let got = download(b, &o);
        assert!(got[..lead].iter().chain(&got[lead + o_bytes..]).all(|&x| x == POISON), "o's margins");
        let got = download(b, &lse);
        let lead = at.lse().lead as usize;
        let lse_bytes = 4 * case.lse.len();
        assert!(got[..lead].iter().chain(&got[lead + lse_bytes..]).all(|&x| x == POISON), "lse's margins");
        // Missing, given where the problem reads none, short, at an odd offset.
        let shape_error = |sequences| match b.submit(&case.plan, inputs.with_sequences(sequences), outputs) {
            Err(Error::Shape { tensor, what }) => format!("{tensor}: {what}"),
            other => panic!("{other:?}"),
        };
        let what = shape_error(DeviceSequences { cu_seqlens_q: None, ..sequences });
        assert!(what.starts_with("cu_seqlens_q") && what.contains("required"), "{what}");
        let what =
            shape_error(DeviceSequences { cu_seqlens_k: t(&cu_k), block_table: t(&table), ..sequences });
        assert!(what.contains("was given, but the problem uses no"), "{what}");
        let short = int(&[0, 1]);
        let what = shape_error(DeviceSequences { cu_seqlens_q: t(&short), ..sequences });
        assert!(what.contains("past the buffer"), "{what}");
        let odd = Some(DeviceTensor::at(&cu_q, 2));
        let what = shape_error(DeviceSequences { cu_seqlens_q: odd, ..sequences });
        assert!(what.contains("multiple of"), "{what}");
        // After all that, the right arrays give the host path's bits.
        case.run_and_check(b, at);
    }
}

/// Two calls recorded into the caller's encoder between the caller's own copies, one submit:
/// the copy before feeds q, the copy after reads o.
#[test]
fn records_into_the_callers_encoder() {
    let Some(b) = backend("records_into_the_callers_encoder") else { return };
    let (device, queue) = (b.device().unwrap(), b.queue().unwrap());
    let first =
        Case::new(b, Problem::new(shape(1, 2, 2, 50, 50, 64), DType::F32).causal().with_lse(true), 21);
    let second = Case::new(b, Problem::new(shape(2, 4, 1, 17, 300, 32), DType::F16).with_lse(false), 22);
    let [q1, k1, v1, o1, lse1] = first.buffers(b, AT_ZERO);
    let [q2, k2, v2, o2, lse2] = second.buffers(b, AT_ZERO);
    // The first call's q arrives by the caller's copy, recorded before the call; its buffer
    // holds zeros until then.
    let q1_later = upload(b, "q later", &vec![0; q1.size() as usize], USAGE);
    let o1_after = upload(b, "o after", &vec![0; o1.size() as usize], USAGE);
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(&q1, 0, &q1_later, 0, q1.size());
    let t = DeviceTensor::new;
    b.record(
        &first.plan,
        &mut encoder,
        DeviceInputs::new(t(&q1_later), t(&k1), t(&v1)),
        DeviceOutputs { o: t(&o1), lse: Some(t(&lse1)) },
    )
    .unwrap();
    b.record(
        &second.plan,
        &mut encoder,
        DeviceInputs::new(t(&q2), t(&k2), t(&v2)),
        DeviceOutputs { o: t(&o2), lse: None },
    )
    .unwrap();
    encoder.copy_buffer_to_buffer(&o1, 0, &o1_after, 0, o1.size());
    queue.submit([encoder.finish()]);
    first.check(b, &o1_after, &lse1, AT_ZERO);
    second.check(b, &o2, &lse2, AT_ZERO);
}

/// The scratch is allocated by the first call and reused: the same plan again, or a smaller
/// problem, allocates nothing.
#[test]
fn scratch_is_reused() {
    let Some(b) = backend("scratch_is_reused") else { return };
    // A backend of its own on the same device, so that other tests' calls do not interfere.
    let own = Wgpu::from_device(
        &adapter_of(b),
        b.device().unwrap().clone(),
        b.queue().unwrap().clone(),
        Options::default(),
    );
    let Ok(own) = own else { return };
    let big = Case::new(&own, Problem::new(shape(1, 4, 4, 64, 64, 64), DType::F32), 31);
    let small = Case::new(&own, Problem::new(shape(1, 2, 2, 16, 40, 64), DType::F32), 32);
    assert_eq!(own.scratch_bytes(), 0);
    big.run_and_check(&own, AT_ZERO);
    let after_first = own.scratch_bytes();
    assert!(after_first > 0);
    big.run_and_check(&own, AT_ZERO);
    small.run_and_check(&own, AT_ZERO);
    assert_eq!(own.scratch_bytes(), after_first);
    own.release_scratch();
    assert_eq!(own.scratch_bytes(), 0);
    small.run_and_check(&own, AT_ZERO);
}

/// An adapter for a second backend on the test's device (only its info and cooperative-matrix
/// properties are read).
fn adapter_of(_: &Wgpu) -> wgpu::Adapter {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default())).expect("an adapter")
}

#[test]
fn typed_errors_before_anything_is_recorded() {
    let Some(b) = backend("typed_errors_before_anything_is_recorded") else { return };
    let case = Case::new(b, Problem::new(shape(1, 2, 2, 8, 8, 32), DType::F16).with_lse(true), 41);
    let [q, k, v, o, lse] = case.buffers(b, AT_ZERO);
    let t = DeviceTensor::new;
    let inputs = DeviceInputs::new(t(&q), t(&k), t(&v));
    let outputs = DeviceOutputs { o: t(&o), lse: Some(t(&lse)) };
    let err = |plan: &Plan, inputs, outputs| b.submit(plan, inputs, outputs).unwrap_err();
    let shape_of = |e: Error| match e {
        Error::Shape { tensor, what } => (tensor, what),
        other => panic!("not a shape error: {other}"),
    };

    let short = upload(b, "short k", &vec![0; k.size() as usize - 4], USAGE);
    let (tensor, what) = shape_of(err(&case.plan, DeviceInputs { k: t(&short), ..inputs }, outputs));
    assert_eq!(tensor, "k");
    assert!(what.contains("reach byte"), "{what}");

    let offset = DeviceTensor::at(&v, 64);
    let (tensor, what) = shape_of(err(&case.plan, DeviceInputs { v: offset, ..inputs }, outputs));
    assert_eq!(tensor, "v", "{what}");

    let odd = DeviceTensor::at(&q, 1);
    let (tensor, what) = shape_of(err(&case.plan, DeviceInputs { q: odd, ..inputs }, outputs));
    assert!(tensor == "q" && what.contains("element size"), "{what}");

    let no_storage = upload(b, "no storage", &vec![0; o.size() as usize], wgpu::BufferUsages::COPY_SRC);
    let (tensor, what) = shape_of(err(&case.plan, inputs, DeviceOutputs { o: t(&no_storage), ..outputs }));
    assert!(tensor == "o" && what.contains("STORAGE"), "{what}");

    let (tensor, _) = shape_of(err(&case.plan, inputs, DeviceOutputs { lse: None, ..outputs }));
    assert_eq!(tensor, "lse");

    // A plan of the same problem, made for another device (the backend's own default one).
    let other = Wgpu::new();
    if let Ok(plan) = other.plan(&case.problem) {
        let e = err(&plan, inputs, outputs);
        assert!(matches!(e, Error::PlanMismatch { .. }), "{e}");
    }
    // A plan of another problem, and one of another backend.
    let mut plan = case.plan.clone();
    plan.problem = plan.problem.causal();
    assert!(matches!(err(&plan, inputs, outputs), Error::PlanMismatch { .. }));
    let cpu = attn_cpu::Reference.plan(&case.problem).unwrap();
    assert!(matches!(err(&cpu, inputs, outputs), Error::PlanMismatch { .. }));

    // After all that, the right call still runs.
    b.submit(&case.plan, inputs, outputs).unwrap();
    case.check(b, &o, &lse, AT_ZERO);
}
