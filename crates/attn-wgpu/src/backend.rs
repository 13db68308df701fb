//! The `wgpu` backend: [`Attention`] over the WGSL kernel (the host path: inputs packed on the
//! host and uploaded at `prepare`, the output read back by `read`), and the backend's
//! constructors, including [`Wgpu::from_device`] for a caller's device.

use crate::dispatch::{self, Dispatches, Sizes};
use crate::options::Options;
use crate::pack::{pack_inputs, seq_lens, unpack_lse, unpack_output};
use crate::plan::{self, AdapterCaps, KeySplit, Variant};
use crate::resident::Resident;
use crate::runtime::Gpu;
use attn_core::{
    Attention, Availability, BackwardOptions, DType, Error, Execution, GradInputs, Gradients, Inputs,
    Numerics, Outputs, OwnedExtras, Payload, Plan, Prepared, Problem, Result,
};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use wgpu::util::DeviceExt;

/// The wgpu backend on the preferred adapter. The adapter is opened on first use; without one
/// (no Vulkan loader or driver) the backend reports itself unavailable, with the reason.
///
/// [`Wgpu::from_device`] makes one on a device the caller opened instead, for the
/// device-resident calls ([`Wgpu::record`], [`Wgpu::submit`]; see [`crate::resident`]) and the
/// [`Attention`] trait alike.
#[derive(Default)]
pub struct Wgpu {
    gpu: OnceLock<std::result::Result<Arc<Gpu>, String>>,
    options: Options,
    /// The device-resident calls' scratch buffers and bindings.
    pub(crate) resident: Resident,
}

impl Wgpu {
    /// The backend with every option at its default (nothing is opened until it is used).
    pub fn new() -> Self {
        Self::default()
    }

    /// The backend with `options` (tile pins, subgroups, cooperative matrices, naga's checks).
    pub fn with_options(options: Options) -> Self {
        Wgpu { gpu: OnceLock::new(), options, resident: Resident::default() }
    }

    /// The backend on the caller's `device` and `queue`, opened from `adapter`: it compiles its
    /// pipelines there and never opens a device of its own. Limits and features are the ones
    /// `device` was opened with (a device opened with WebGPU's default limits gets the plans
    /// those allow); `SHADER_F16` and `SUBGROUP` are used where the device has them, and the
    /// cooperative-matrix kernel only where it was opened with
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` and `PASSTHROUGH_SHADERS` and `options` allow it. The
    /// device's uncaptured-error handler is left alone: every call of the backend runs in its own
    /// error scopes.
    ///
    /// Errors: [`Error::Unavailable`] where wgpu panics while reading the adapter (never on a
    /// working device).
    pub fn from_device(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        options: Options,
    ) -> Result<Self> {
        let gpu = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Gpu::attach(adapter, device, queue, &options)
        }))
        .map_err(|_| Error::Unavailable {
            backend: "wgpu".into(),
            reason: "wgpu panicked while reading the caller's adapter and device".into(),
        })?;
        Ok(Wgpu { gpu: OnceLock::from(Ok(Arc::new(gpu))), options, resident: Resident::default() })
    }

    /// The device this backend runs on (its own, opened on first use, or the caller's), or why
    /// there is none.
    pub fn device(&self) -> Result<&wgpu::Device> {
        self.gpu_ref().map(|g| &g.device)
    }

    /// The queue this backend submits on (see [`Wgpu::device`]).
    pub fn queue(&self) -> Result<&wgpu::Queue> {
        self.gpu_ref().map(|g| &g.queue)
    }

    /// The backend with the options the `ATTN_WGPU_*` variables set ([`Options::from_env`]); a
    /// value a variable does not allow is an error.
    pub fn from_env() -> Result<Self> {
        Ok(Self::with_options(Options::from_env()?))
    }

    /// What this backend was built with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The planner's choice under this backend's tile pins.
    fn choose(&self, problem: &Problem, caps: &AdapterCaps) -> Result<plan::Choice> {
        plan::choose_among(problem, caps, &|v| self.options.allows(v))
    }

    /// The adapter's capabilities as this backend plans with them.
    fn caps(&self, gpu: &Gpu) -> AdapterCaps {
        let mut caps = gpu.caps.clone();
        if self.options.no_subgroups {
            caps.subgroup_min = None;
        }
        if let Some(bytes) = self.options.workgroup_storage {
            caps.workgroup_storage = caps.workgroup_storage.min(bytes);
        }
        caps
    }

    /// The open device, or why there is none.
    pub(crate) fn gpu(&self) -> Result<Arc<Gpu>> {
        self.gpu_ref().cloned()
    }

    fn gpu_ref(&self) -> Result<&Arc<Gpu>> {
        self.gpu
            .get_or_init(|| Gpu::open(&self.options).map(Arc::new))
            .as_ref()
            .map_err(|reason| Error::Unavailable { backend: "wgpu".into(), reason: reason.clone() })
    }

    /// What `plan` chose, once the plan is checked: made by this backend for its own problem,
    /// its launch unedited.
    pub(crate) fn chosen(&self, plan: &Plan) -> Result<Chosen> {
        plan.check_for(self.name(), &plan.problem)?;
        let chosen = *plan.payload::<Chosen>()?;
        if chosen.problem != plan.problem {
            return Err(Error::PlanMismatch {
                what: format!(
                    "plan `{}` was made for {} but now says {}: plan the new problem",
                    plan.kernel, chosen.problem, plan.problem
                ),
            });
        }
        // The plan decides what runs: a launch edited after planning would not be the variant's.
        if !matches!(&plan.execution, Execution::Gpu(launch) if launch.grid == chosen.grid) {
            return Err(attn_core::Error::PlanMismatch {
                what: format!("the launch of plan `{}` differs from the one its backend chose", plan.kernel),
            });
        }
        Ok(chosen)
    }
}

/// What `plan` chose, carried in the plan's payload for `prepare`: the kernel, its grid, the
/// key split where the adapter needs one, and the device it was chosen for (`Gpu::id`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Chosen {
    pub(crate) variant: Variant,
    pub(crate) grid: [u32; 3],
    pub(crate) split: Option<KeySplit>,
    pub(crate) device: u64,
    /// The problem planned (a plan whose problem was edited afterwards is refused).
    pub(crate) problem: Problem,
}

impl Attention for Wgpu {
    fn name(&self) -> &str {
        "wgpu"
    }

    fn availability(&self) -> Availability {
        match self.gpu() {
            Ok(gpu) => Availability::Available { device: gpu.description.clone(), kind: gpu.caps.kind },
            Err(Error::Unavailable { reason, .. }) => Availability::Unavailable { reason },
            Err(other) => Availability::Unavailable { reason: other.to_string() },
        }
    }

    /// Scores, probabilities and accumulation in f32 for every dtype, the output rounded once;
    /// but where the device was opened with cooperative matrices (by default on NVIDIA), f16
    /// problems round P to f16 for the P·V product, as tensor-core kernels do.
    fn numerics(&self, dtype: DType) -> Numerics {
        match self.gpu() {
            Ok(gpu) if gpu.caps.coop_f16 && dtype == DType::F16 => Numerics::LowPrecisionP,
            _ => Numerics::F32Accumulate,
        }
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let gpu = self.gpu()?;
        let mut choice = self.choose(problem, &self.caps(&gpu))?;
        choice.notes.insert(0, format!("adapter {}", gpu.description));
        choice.notes.push(gpu.checks().describe().into());
        let chosen = Chosen {
            variant: choice.variant,
            grid: choice.launch.grid,
            split: choice.split,
            device: gpu.id,
            problem: *problem,
        };
        Ok(Plan {
            backend: self.name().into(),
            kernel: choice.variant.name(),
            problem: *problem,
            tiles: choice.tiles,
            execution: Execution::Gpu(choice.launch),
            notes: choice.notes,
            payload: Payload::new(chosen),
        })
    }

    /// The portable backward pass ([`crate::backward`]); deterministic whatever the options.
    fn plan_backward(&self, problem: &Problem, _options: BackwardOptions) -> Result<Plan> {
        crate::backward::plan(&*self.gpu()?, problem)
    }

    fn run_backward(&self, plan: &Plan, inputs: GradInputs<'_>, grads: Gradients<'_>) -> Result<()> {
        plan.check_for(self.name(), &plan.problem)?;
        crate::backward::run(&*self.gpu()?, plan, &inputs, grads)
    }

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        let Chosen { variant, grid, split, .. } = self.chosen(plan)?;
        let problem = plan.problem;
        problem.check_inputs(&inputs)?;
        let gpu = self.gpu()?;
        // Compiled on first use (once per variant and process, cached by the runtime): planning
        // does no device work.
        let s = problem.shape;
        let d = variant.head_dim as usize;
        let rows = plan::padded_rows(&variant, s.seq_q, s.seq_k);
        let k_tiles = variant.direct.then_some(variant.block_n() as usize);
        let map = problem.seq_map(inputs.extras)?;
        let [q, k, v] = pack_inputs(&map, &inputs, variant.ty, d, rows, k_tiles);
        let sizes = Sizes::of(&problem, &variant, split);
        let device = &gpu.device;
        let buffers = gpu.scoped("allocating and uploading buffers", || {
            let input = |label, bytes: &[u8]| {
                device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: bytes,
                    usage: wgpu::BufferUsages::STORAGE,
                })
            };
            let output = |label, size, usage| {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size,
                    usage,
                    mapped_at_creation: false,
                })
            };
            let (storage, copy_src) = (wgpu::BufferUsages::STORAGE, wgpu::BufferUsages::COPY_SRC);
            let (o, lse) =
                (output("o", sizes.o, storage | copy_src), output("lse", sizes.lse, storage | copy_src));
            let status = output("status", 4, storage | copy_src | wgpu::BufferUsages::COPY_DST);
            let status_read =
                output("status readback", 4, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
            // With a split, each part writes the partial buffers and the merge step folds them in.
            let partial = sizes.o_acc.map(|o_acc| {
                [
                    output("o part", sizes.o, storage),
                    output("lse part", sizes.lse, storage),
                    output("o running", o_acc, storage),
                ]
            });
            let timer = gpu.caps.timestamps.then(|| Timer::new(device));
            // ALiBi's slopes as given (f32; `check_inputs` checked their count).
            let slopes = inputs.extras.alibi_slopes.map(|x| input("alibi slopes", bytemuck::cast_slice(x)));
            // Each sequence's lengths, for the kernels of sequences of their own lengths.
            let lens =
                variant.seq_lens.then(|| input("sequence lengths", bytemuck::cast_slice(&seq_lens(&map))));
            let qkv = [input("q", &q), input("k", &k), input("v", &v)];
            (qkv, o, lse, status, status_read, partial, timer, [slopes, lens])
        })?;
        let ([q, k, v], o, lse, status, status_read, partial, timer, [slopes, lens]) = buffers;
        let dispatches = Dispatches::new(
            &gpu,
            &problem,
            &variant,
            grid,
            split,
            &dispatch::Buffers {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &lse,
                status: &status,
                partial: partial.as_ref().map(|[a, b, c]| [a, b, c]),
                alibi_slopes: slopes.as_ref(),
                seq_lens: lens.as_ref(),
            },
        )?;
        gpu.wait("uploading inputs")?;
        Ok(Box::new(WgpuPrepared {
            plan: plan.clone(),
            gpu,
            dispatches,
            o,
            lse,
            status,
            status_read,
            timer,
            variant,
            extras: OwnedExtras::copy_of(&inputs.extras),
        }))
    }
}

/// Two GPU timestamps around the dispatch, resolved and read back after each run.
struct Timer {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
}

impl Timer {
    fn new(device: &wgpu::Device) -> Self {
        let buffer = |label, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: 16,
                usage,
                mapped_at_creation: false,
            })
        };
        Timer {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("attn timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolve: buffer("timestamps", wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            readback: buffer(
                "timestamps readback",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
        }
    }
}

struct WgpuPrepared {
    plan: Plan,
    gpu: Arc<Gpu>,
    /// The kernel's dispatches over this call's buffers.
    dispatches: Dispatches,
    o: wgpu::Buffer,
    lse: wgpu::Buffer,
    /// Set by a kernel whose loops the driver cut short (`loop_limit_probe`), and its readback.
    status: wgpu::Buffer,
    status_read: wgpu::Buffer,
    timer: Option<Timer>,
    variant: Variant,
    /// The call's extras, through which `read` finds each sequence's output rows.
    extras: OwnedExtras,
}

impl Prepared for WgpuPrepared {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    /// One dispatch; its time from GPU timestamps where the adapter has them (the plan says
    /// which), otherwise from the host clock around submit and wait.
    fn run(&mut self) -> Result<Duration> {
        let gpu = &self.gpu;
        let start = Instant::now();
        gpu.scoped("dispatching the kernel", || {
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            encoder.clear_buffer(&self.status, 0, None);
            {
                let timestamp_writes = self.timer.as_ref().map(|t| wgpu::ComputePassTimestampWrites {
                    query_set: &t.queries,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                });
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("attn flash"),
                    timestamp_writes,
                });
                self.dispatches.record(&mut pass);
            }
            encoder.copy_buffer_to_buffer(&self.status, 0, &self.status_read, 0, 4);
            if let Some(t) = &self.timer {
                encoder.resolve_query_set(&t.queries, 0..2, &t.resolve, 0);
                encoder.copy_buffer_to_buffer(&t.resolve, 0, &t.readback, 0, 16);
            }
            gpu.queue.submit([encoder.finish()]);
        })?;
        gpu.wait("running the kernel")?;
        let host = start.elapsed();
        if read_back::<4>(gpu, &self.status_read)? != [0; 4] {
            return Err(Error::backend(
                "wgpu",
                format!(
                    "{} ended the loops of `{}` early, at its limit on the loop iterations of one \
                     invocation ({} as the planner knows it): the output would be wrong, so none is \
                     returned. The key split the planner chose was too coarse for this adapter; \
                     please report it with this plan",
                    gpu.caps.name,
                    self.variant.name(),
                    gpu.caps.loop_limit.map_or("none".to_string(), |l| l.to_string()),
                ),
            ));
        }
        let Some(t) = &self.timer else { return Ok(host) };
        let ticks: [u64; 2] = bytemuck::cast(read_back::<16>(gpu, &t.readback)?);
        let ns = ticks[1].saturating_sub(ticks[0]) as f64 * gpu.queue.get_timestamp_period() as f64;
        Ok(Duration::from_secs_f64(ns * 1e-9))
    }

    fn read(&mut self, mut outputs: Outputs<'_>) -> Result<()> {
        let problem = self.plan.problem;
        problem.check_outputs(&outputs)?;
        let map = problem.seq_map(self.extras.borrow())?;
        let bytes = read_buffer(&self.gpu, &self.o)?;
        unpack_output(&map, self.variant.ty, self.variant.head_dim as usize, &bytes, &mut outputs.o);
        if let Some(dst) = outputs.lse.as_deref_mut() {
            let bytes = read_buffer(&self.gpu, &self.lse)?;
            unpack_lse(&map, bytemuck::cast_slice(&bytes), dst);
        }
        Ok(())
    }
}

/// Copies a device buffer into a fresh mappable one and returns its bytes.
pub(crate) fn read_buffer(gpu: &Gpu, src: &wgpu::Buffer) -> Result<Vec<u8>> {
    let size = src.size();
    let staging = gpu.scoped("reading back", || {
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(src, 0, &staging, 0, size);
        gpu.queue.submit([encoder.finish()]);
        staging
    })?;
    map_read(gpu, &staging)
}

/// The first `N` bytes of a mappable buffer (the timestamps, the status word).
fn read_back<const N: usize>(gpu: &Gpu, buffer: &wgpu::Buffer) -> Result<[u8; N]> {
    let bytes = map_read(gpu, buffer)?;
    bytes
        .get(..N)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Error::backend("wgpu", "short read of a mapped buffer"))
}

/// Maps `buffer` for reading, waits, copies its bytes out and unmaps it.
fn map_read(gpu: &Gpu, buffer: &wgpu::Buffer) -> Result<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    buffer.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    gpu.wait("mapping a buffer")?;
    rx.recv()
        .map_err(|e| Error::backend("wgpu", format!("map callback: {e}")))?
        .map_err(|e| Error::backend("wgpu", format!("mapping a buffer: {e}")))?;
    let bytes = buffer
        .get_mapped_range(..)
        .map_err(|e| Error::backend("wgpu", format!("mapped range: {e}")))?
        .to_vec();
    buffer.unmap();
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::{Chosen, Wgpu};
    use crate::dispatch::{Merge, Params};
    use crate::plan::{KernelType, candidates};
    use crate::shader::generate;
    use attn_core::{Attention, Buffer, DType, Inputs, Outputs, Payload, Problem, Shape};

    /// `Params` is written twice, here and in `bindings.wgsl`: the WGSL struct (as naga lays it
    /// out) of a kernel with a window, a soft-cap or ALiBi must have the Rust struct's size, and as
    /// many 4-byte members, so that neither side can gain or lose a field alone; a plain kernel's
    /// is the same without the score parameters (the 15 words before them).
    #[test]
    fn params_match_the_wgsl_struct() {
        let plain = candidates(KernelType::F32, 64, false, None).next().expect("a variant");
        let scored = plain.with_every_feature();
        for (v, words) in [(scored, std::mem::size_of::<Params>() / 4), (plain, 15)] {
            let module = naga::front::wgsl::parse_str(&generate(&v)).expect("the kernel parses");
            let (_, ty) = module
                .types
                .iter()
                .find(|(_, t)| t.name.as_deref() == Some("Params"))
                .expect("struct Params");
            let naga::TypeInner::Struct { members, span } = &ty.inner else {
                panic!("Params is not a struct")
            };
            assert_eq!(*span as usize, 4 * words, "{}", v.name());
            assert_eq!(members.len(), words, "{}: every field is 4 bytes", v.name());
        }
    }

    /// The same for the merge step's `Merge` and `kernels/merge.wgsl` (its padding is one Rust
    /// array of two words, two WGSL members).
    #[test]
    fn merge_params_match_the_wgsl_struct() {
        let source = crate::shader::merge(KernelType::F32);
        let module = naga::front::wgsl::parse_str(&source).expect("the merge step parses");
        let (_, ty) =
            module.types.iter().find(|(_, t)| t.name.as_deref() == Some("Merge")).expect("struct Merge");
        let naga::TypeInner::Struct { members, span } = &ty.inner else { panic!("Merge is not a struct") };
        assert_eq!(*span as usize, std::mem::size_of::<Merge>());
        assert_eq!(members.len(), std::mem::size_of::<Merge>() / 4, "every field is 4 bytes");
    }

    /// A kernel whose loops the driver ends early is an error, not an answer: the key split
    /// removed from a plan that needs it, on an adapter with a loop limit (skipped by name
    /// elsewhere: hardware adapters have none to reach).
    #[test]
    fn a_kernel_cut_short_by_the_loop_limit_is_an_error() {
        let backend = Wgpu::with_options(crate::Options { no_subgroups: true, ..Default::default() });
        let software = backend.gpu().is_ok_and(|g| g.caps.loop_limit.is_some());
        if !software {
            eprintln!(
                "SKIPPED a_kernel_cut_short_by_the_loop_limit_is_an_error: no adapter with a loop limit"
            );
            return;
        }
        let shape = Shape { seq_q: 1, seq_k: 40_000, ..Shape::new(1, 1, 1, 64) };
        let problem = Problem::new(shape, DType::F32).with_lse(true);
        let mut plan = backend.plan(&problem).unwrap();
        let chosen = *plan.payload::<Chosen>().unwrap();
        assert!(chosen.split.is_some(), "{:?}", plan.notes);
        plan.payload = Payload::new(Chosen { split: None, ..chosen });
        let [q, k, v, o] = problem.required_lens().map(|(_, n)| Buffer::zeros(DType::F32, n));
        let inputs = Inputs::new(q.as_data(), k.as_data(), v.as_data());
        let mut prepared = backend.prepare(&plan, inputs).unwrap();
        let err = prepared.run().unwrap_err().to_string();
        assert!(err.contains("ended the loops"), "{err}");
        // The same plan with its split runs.
        let mut o = o;
        let mut lse = vec![0.0; problem.lse_len()];
        backend.forward(&problem, inputs, Outputs { o: o.as_data_mut(), lse: Some(&mut lse) }).unwrap();
    }
}
