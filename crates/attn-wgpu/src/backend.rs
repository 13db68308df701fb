//! The `wgpu` backend: [`Attention`] over the WGSL kernel, with device-resident inputs.

use crate::options::Options;
use crate::pack::{pack_inputs, unpack_output};
use crate::plan::{self, AdapterCaps, KeySplit, Variant};
use crate::runtime::Gpu;
use attn_core::{
    Attention, Availability, DType, Error, Execution, Inputs, Numerics, Outputs, Payload, Plan, Prepared,
    Problem, Result,
};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use wgpu::util::DeviceExt;

/// The kernel's uniform block; field order and types match `struct Params` in `kernels/bindings.wgsl`.
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
    key_begin: u32,
    key_end: u32,
    probe_trips: u32,
    pad: u32,
}

/// The merge step's uniform block; matches `struct Merge` in `merge.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Merge {
    rows: u32,
    d4: u32,
    first: u32,
    last: u32,
    groups_x: u32,
    neg_inf_bits: u32,
    pad: [u32; 2],
}

/// Invocations per workgroup of the merge step (`@workgroup_size` in `merge.wgsl`).
const MERGE_WORKGROUP: u32 = 64;

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

/// What `plan` chose, carried in the plan's payload for `prepare`: the kernel, its grid, and
/// the key split where the adapter needs one.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Chosen {
    variant: Variant,
    grid: [u32; 3],
    split: Option<KeySplit>,
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
        let chosen = Chosen { variant: choice.variant, grid: choice.launch.grid, split: choice.split };
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
        let &Chosen { variant, grid, split } = plan.payload::<Chosen>()?;
        // The plan decides what runs: a launch edited after planning would not be the variant's.
        if !matches!(&plan.execution, Execution::Gpu(launch) if launch.grid == grid) {
            return Err(attn_core::Error::PlanMismatch {
                what: format!("the launch of plan `{}` differs from the one its backend chose", plan.kernel),
            });
        }
        // Compiled on first use (once per variant and process, cached by the runtime): planning
        // does no device work.
        let pipeline = gpu.pipeline(&variant)?;
        let merge = split.map(|_| gpu.merge_pipeline(variant.ty)).transpose()?;
        let s = problem.shape;
        let d = variant.head_dim as usize;
        let rows = plan::padded_rows(&variant, s.seq_q, s.seq_k);
        let k_tiles = variant.direct.then_some(variant.block_n() as usize);
        let [q, k, v] = pack_inputs(&problem, &inputs, variant.ty, d, rows, k_tiles);
        // One dispatch over all keys, or one per part of a split.
        let parts: Vec<(u32, u32)> = match split {
            None => vec![(0, s.seq_k as u32)],
            Some(KeySplit { keys, parts }) => {
                (0..parts).map(|p| (p * keys, ((p + 1) * keys).min(s.seq_k as u32))).collect()
            }
        };
        let params = |(key_begin, key_end): (u32, u32)| Params {
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
            key_begin,
            key_end,
            probe_trips: 2,
            pad: 0,
        };
        let rows_q = (s.batch * s.heads_q * s.seq_q) as u64;
        let o_bytes = rows_q * d as u64 * variant.ty.size();
        let lse_bytes = rows_q * 4;
        let merge_groups = (rows_q as u32).div_ceil(MERGE_WORKGROUP);
        let merge_x = merge_groups.min(gpu.caps.workgroups_per_dim.max(1));
        let merge_grid = [merge_x, merge_groups.div_ceil(merge_x), 1];
        let device = &gpu.device;
        let buffers = gpu.scoped("allocating and uploading buffers", || {
            let input = |label, bytes: &[u8], usage| {
                device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: bytes,
                    usage,
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
            let (q, k, v) = (input("q", &q, storage), input("k", &k, storage), input("v", &v, storage));
            let (o, lse) =
                (output("o", o_bytes, storage | copy_src), output("lse", lse_bytes, storage | copy_src));
            let status = output("status", 4, storage | copy_src | wgpu::BufferUsages::COPY_DST);
            let status_read =
                output("status readback", 4, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
            // With a split, each part writes the partial buffers and the merge step folds them in.
            let partial = split.map(|_| {
                (
                    output("o part", o_bytes, storage),
                    output("lse part", lse_bytes, storage),
                    output("o running", rows_q * d as u64 * 4, storage),
                )
            });
            let (o_dst, lse_dst) = match &partial {
                Some((o_part, lse_part, _)) => (o_part, lse_part),
                None => (&o, &lse),
            };
            let bind = |layout, label, buffers: &[&wgpu::Buffer]| {
                device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(label),
                    layout,
                    entries: &buffers
                        .iter()
                        .enumerate()
                        .map(|(i, b)| wgpu::BindGroupEntry {
                            binding: i as u32,
                            resource: b.as_entire_binding(),
                        })
                        .collect::<Vec<_>>(),
                })
            };
            let mut keep = vec![];
            let mut flash = vec![];
            let mut merges = vec![];
            for (i, &range) in parts.iter().enumerate() {
                let uniform =
                    input("params", bytemuck::bytes_of(&params(range)), wgpu::BufferUsages::UNIFORM);
                flash.push(bind(&gpu.layout, "attn flash", &[&uniform, &q, &k, &v, o_dst, lse_dst, &status]));
                keep.push(uniform);
                if let Some((o_part, lse_part, o_acc)) = &partial {
                    let m = Merge {
                        rows: rows_q as u32,
                        d4: (d / 4) as u32,
                        first: u32::from(i == 0),
                        last: u32::from(i + 1 == parts.len()),
                        groups_x: merge_grid[0],
                        neg_inf_bits: f32::NEG_INFINITY.to_bits(),
                        pad: [0; 2],
                    };
                    let uniform = input("merge", bytemuck::bytes_of(&m), wgpu::BufferUsages::UNIFORM);
                    merges.push(bind(
                        &gpu.merge_layout,
                        "attn merge",
                        &[&uniform, o_part, lse_part, o_acc, &lse, &o],
                    ));
                    keep.push(uniform);
                }
            }
            keep.extend([q, k, v]);
            keep.extend(partial.into_iter().flat_map(|(a, b, c)| [a, b, c]));
            let timer = gpu.caps.timestamps.then(|| Timer::new(device));
            (flash, merges, o, lse, status, status_read, timer, keep)
        })?;
        let (flash, merges, o, lse, status, status_read, timer, keep) = buffers;
        gpu.wait("uploading inputs")?;
        Ok(Box::new(WgpuPrepared {
            plan: plan.clone(),
            gpu,
            pipeline,
            flash,
            merge: merge.map(|pipeline| (pipeline, merges, merge_grid)),
            grid,
            o,
            lse,
            status,
            status_read,
            timer,
            variant,
            _buffers: keep,
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
    /// The kernel's bind group for each dispatch: one, or one per part of a key split.
    flash: Vec<wgpu::BindGroup>,
    /// With a key split: the merge step, its bind group after each part, and its grid.
    merge: Option<(Arc<wgpu::ComputePipeline>, Vec<wgpu::BindGroup>, [u32; 3])>,
    grid: [u32; 3],
    o: wgpu::Buffer,
    lse: wgpu::Buffer,
    /// Set by a kernel whose loops the driver cut short (`loop_limit_probe`), and its readback.
    status: wgpu::Buffer,
    status_read: wgpu::Buffer,
    timer: Option<Timer>,
    variant: Variant,
    /// Kept alive for the bind groups.
    _buffers: Vec<wgpu::Buffer>,
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
                for (i, bind_group) in self.flash.iter().enumerate() {
                    pass.set_pipeline(&self.pipeline);
                    pass.set_bind_group(0, bind_group, &[]);
                    pass.dispatch_workgroups(self.grid[0], self.grid[1], self.grid[2]);
                    if let Some((merge, groups, [x, y, z])) = &self.merge {
                        pass.set_pipeline(merge);
                        pass.set_bind_group(0, &groups[i], &[]);
                        pass.dispatch_workgroups(*x, *y, *z);
                    }
                }
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
    use super::{Chosen, Params, Wgpu};
    use crate::plan::{KernelType, candidates};
    use crate::shader::generate;
    use attn_core::{Attention, Buffer, DType, Inputs, Outputs, Payload, Problem, Shape};

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

    /// The same for the merge step's `Merge` and `kernels/merge.wgsl` (its padding is one Rust
    /// array of two words, two WGSL members).
    #[test]
    fn merge_params_match_the_wgsl_struct() {
        let source = crate::shader::merge(KernelType::F32);
        let module = naga::front::wgsl::parse_str(&source).expect("the merge step parses");
        let (_, ty) =
            module.types.iter().find(|(_, t)| t.name.as_deref() == Some("Merge")).expect("struct Merge");
        let naga::TypeInner::Struct { members, span } = &ty.inner else { panic!("Merge is not a struct") };
        assert_eq!(*span as usize, std::mem::size_of::<super::Merge>());
        assert_eq!(members.len(), std::mem::size_of::<super::Merge>() / 4, "every field is 4 bytes");
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
        let inputs = Inputs { q: q.as_data(), k: k.as_data(), v: v.as_data() };
        let mut prepared = backend.prepare(&plan, inputs).unwrap();
        let err = prepared.run().unwrap_err().to_string();
        assert!(err.contains("ended the loops"), "{err}");
        // The same plan with its split runs.
        let mut o = o;
        let mut lse = vec![0.0; problem.lse_len()];
        backend.forward(&problem, inputs, Outputs { o: o.as_data_mut(), lse: Some(&mut lse) }).unwrap();
    }
}
