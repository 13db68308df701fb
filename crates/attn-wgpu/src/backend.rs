//! The `wgpu` backend: [`Attention`] over the WGSL kernel, with device-resident inputs.

use crate::options::Options;
use crate::pack::{pack_inputs, unpack_output};
use crate::plan::{self, AdapterCaps, Variant};
use crate::runtime::Gpu;
use attn_core::{
    Attention, Availability, DType, Error, Execution, Inputs, Numerics, Outputs, Payload, Plan, Prepared,
    Problem, Result,
};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use wgpu::util::DeviceExt;

/// The kernel's uniform block; field order and types match `struct Params` in `flash.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    seq_q: u32,
    seq_k: u32,
    heads_q: u32,
    heads_kv: u32,
    group: u32,
    n_qblocks: u32,
    grid_y: u32,
    bh_total: u32,
    causal_offset: i32,
    scale_log2: f32,
    neg_inf_bits: u32,
    pad: u32,
}

/// The wgpu backend on the preferred adapter. The adapter is opened on first use; without one
/// (no Vulkan loader or driver) the backend reports itself unavailable, with the reason.
#[derive(Default)]
pub struct Wgpu {
    gpu: OnceLock<std::result::Result<Arc<Gpu>, String>>,
    options: Options,
}

impl Wgpu {
    /// The backend with every option at its default (nothing is opened until it is used).
    pub fn new() -> Self {
        Self::default()
    }

    /// The backend with `options` (tile pins, subgroups, cooperative matrices, naga's checks).
    pub fn with_options(options: Options) -> Self {
        Wgpu { gpu: OnceLock::new(), options }
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
    fn gpu(&self) -> Result<Arc<Gpu>> {
        self.gpu
            .get_or_init(|| Gpu::open(&self.options).map(Arc::new))
            .clone()
            .map_err(|reason| Error::Unavailable { backend: "wgpu".into(), reason })
    }
}

/// What `plan` chose, carried in the plan's payload for `prepare`: the kernel and its grid.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Chosen {
    variant: Variant,
    grid: [u32; 3],
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
        let chosen = Chosen { variant: choice.variant, grid: choice.launch.grid };
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

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        plan.check_for(self.name(), &plan.problem)?;
        let problem = plan.problem;
        problem.check_inputs(&inputs)?;
        let gpu = self.gpu()?;
        let &Chosen { variant, grid } = plan.payload::<Chosen>()?;
        // The plan decides what runs: a launch edited after planning would not be the variant's.
        if !matches!(&plan.execution, Execution::Gpu(launch) if launch.grid == grid) {
            return Err(attn_core::Error::PlanMismatch {
                what: format!("the launch of plan `{}` differs from the one its backend chose", plan.kernel),
            });
        }
        // Compiled on first use (once per variant and process, cached by the runtime): planning
        // does no device work.
        let pipeline = gpu.pipeline(&variant)?;
        let s = problem.shape;
        let d = variant.head_dim as usize;
        let rows = plan::padded_rows(&variant, s.seq_q, s.seq_k);
        let k_tiles = variant.direct.then_some(variant.block_n() as usize);
        let [q, k, v] = pack_inputs(&problem, &inputs, variant.ty, d, rows, k_tiles);
        let params = Params {
            seq_q: s.seq_q as u32,
            seq_k: s.seq_k as u32,
            heads_q: s.heads_q as u32,
            heads_kv: s.heads_kv as u32,
            group: s.group_size() as u32,
            n_qblocks: grid[0],
            grid_y: grid[1],
            bh_total: (s.batch * s.heads_q) as u32,
            causal_offset: s.seq_k as i32 - s.seq_q as i32,
            scale_log2: problem.scale() * std::f32::consts::LOG2_E,
            neg_inf_bits: f32::NEG_INFINITY.to_bits(),
            pad: 0,
        };
        let o_bytes = (s.batch * s.heads_q * s.seq_q * d) as u64 * variant.ty.size();
        let lse_bytes = (problem.lse_len() * 4) as u64;
        let device = &gpu.device;
        let buffers = gpu.scoped("allocating and uploading buffers", || {
            let input = |label, bytes: &[u8]| {
                device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: bytes,
                    usage: wgpu::BufferUsages::STORAGE,
                })
            };
            let output = |label, size| {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                })
            };
            let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: bytemuck::bytes_of(&params),
                usage: wgpu::BufferUsages::UNIFORM,
            });
            let (q, k, v) = (input("q", &q), input("k", &k), input("v", &v));
            let (o, lse) = (output("o", o_bytes), output("lse", lse_bytes));
            let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("attn flash"),
                layout: &gpu.layout,
                entries: &[&uniform, &q, &k, &v, &o, &lse]
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
                    .collect::<Vec<_>>(),
            });
            let timer = gpu.caps.timestamps.then(|| Timer::new(device));
            (bind_group, o, lse, timer, [uniform, q, k, v])
        })?;
        let (bind_group, o, lse, timer, inputs) = buffers;
        gpu.wait("uploading inputs")?;
        Ok(Box::new(WgpuPrepared {
            plan: plan.clone(),
            gpu,
            pipeline,
            bind_group,
            grid,
            o,
            lse,
            timer,
            variant,
            _inputs: inputs,
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
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    grid: [u32; 3],
    o: wgpu::Buffer,
    lse: wgpu::Buffer,
    timer: Option<Timer>,
    variant: Variant,
    /// Kept alive for the bind group.
    _inputs: [wgpu::Buffer; 4],
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
                pass.set_pipeline(&self.pipeline);
                pass.set_bind_group(0, &self.bind_group, &[]);
                pass.dispatch_workgroups(self.grid[0], self.grid[1], self.grid[2]);
            }
            if let Some(t) = &self.timer {
                encoder.resolve_query_set(&t.queries, 0..2, &t.resolve, 0);
                encoder.copy_buffer_to_buffer(&t.resolve, 0, &t.readback, 0, 16);
            }
            gpu.queue.submit([encoder.finish()]);
        })?;
        gpu.wait("running the kernel")?;
        let host = start.elapsed();
        let Some(t) = &self.timer else { return Ok(host) };
        let ticks: [u64; 2] = bytemuck::cast(read_back::<16>(gpu, &t.readback)?);
        let ns = ticks[1].saturating_sub(ticks[0]) as f64 * gpu.queue.get_timestamp_period() as f64;
        Ok(Duration::from_secs_f64(ns * 1e-9))
    }

    fn read(&mut self, mut outputs: Outputs<'_>) -> Result<()> {
        let problem = self.plan.problem;
        problem.check_outputs(&outputs)?;
        let bytes = read_buffer(&self.gpu, &self.o)?;
        unpack_output(&problem, self.variant.ty, self.variant.head_dim as usize, &bytes, &mut outputs.o);
        if let Some(dst) = outputs.lse.as_deref_mut() {
            let bytes = read_buffer(&self.gpu, &self.lse)?;
            dst.copy_from_slice(bytemuck::cast_slice(&bytes));
        }
        Ok(())
    }
}

/// Copies a device buffer into a fresh mappable one and returns its bytes.
fn read_buffer(gpu: &Gpu, src: &wgpu::Buffer) -> Result<Vec<u8>> {
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

/// The first `N` bytes of a mappable buffer.
fn read_back<const N: usize>(gpu: &Gpu, buffer: &wgpu::Buffer) -> Result<[u8; N]> {
    let bytes = map_read(gpu, buffer)?;
    bytes
        .get(..N)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Error::backend("wgpu", "short timestamp read"))
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
    use super::Params;
    use crate::plan::{KernelType, candidates};
    use crate::shader::generate;

    /// `Params` is written twice, here and in `flash.wgsl`: the WGSL struct (as naga lays it out)
    /// must have the Rust struct's size, and as many 4-byte members, so that neither side can
    /// gain or lose a field alone.
    #[test]
    fn params_match_the_wgsl_struct() {
        let v = candidates(KernelType::F32, 64, false, None).next().expect("a variant");
        let module = naga::front::wgsl::parse_str(&generate(&v)).expect("the kernel parses");
        let (_, ty) =
            module.types.iter().find(|(_, t)| t.name.as_deref() == Some("Params")).expect("struct Params");
        let naga::TypeInner::Struct { members, span } = &ty.inner else { panic!("Params is not a struct") };
        assert_eq!(*span as usize, std::mem::size_of::<Params>());
        assert_eq!(members.len(), std::mem::size_of::<Params>() / 4, "every field is 4 bytes");
    }
}
