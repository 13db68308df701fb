//! The `wgpu` backend: [`Attention`] over the WGSL kernel, with device-resident inputs.

use crate::pack::{pack_inputs, unpack_output};
use crate::plan::{self, AdapterCaps, Kernel, Variant};
use crate::runtime::Gpu;
use attn_core::{
    Attention, Availability, DType, Error, Execution, Inputs, Numerics, Outputs, Plan, Prepared, Problem,
    Result,
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
    /// Plan as if the adapter had no `SUBGROUP` (the workgroup-memory reductions).
    no_subgroups: bool,
    /// Only this micro-tile width (key groups per invocation), where set.
    key_groups: Option<u32>,
    /// Only this K/V chunk width (head-dim columns per stage), where set.
    chunk: Option<u32>,
    /// Only this many invocations per query row (8 or 16), where set.
    row_threads: Option<u32>,
    /// Only this many K/V stage buffers (1 or 2), where set.
    stages: Option<u32>,
    /// Only cooperative-matrix shapes of this many rows (16, 32 or 64), where set.
    coop_rows: Option<u32>,
    /// Only cooperative-matrix shapes with tiles of this many keys (32, or 16 or 64, which the
    /// planner never picks on its own: see `plan::coop_candidates`), where set.
    coop_keys: Option<u32>,
    /// Only this way of handing probabilities around (shuffles or workgroup memory), where set.
    p_shuffle: Option<bool>,
    /// Only variants that read V straight from its buffer (`true`) or stage it (`false`), where
    /// set.
    v_direct: Option<bool>,
    /// Only variants that stage V by keys (`true`) or by head-dim columns (`false`), where set.
    v_by_keys: Option<bool>,
    /// Only variants that hold Q in registers (`true`) or stage Qᵀ (`false`), where set.
    q_regs: Option<bool>,
    /// Only variants that read K straight from its buffer too (`true`), or not (`false`), where
    /// set.
    k_direct: Option<bool>,
    /// Only FMA-kernel variants with this many row groups' lanes interleaved (1, 2 or 4), where
    /// set.
    interleave: Option<u32>,
    /// Only variants that split S over the head dim (`true`), or not (`false`), where set.
    split_d: Option<bool>,
    /// Only variants that skip what no row sees (`true`), or not (`false`), where set.
    skip_unseen: Option<bool>,
    /// Only FMA-kernel variants with this many query rows per workgroup, where set.
    rows: Option<u32>,
    /// Only the 8x8 FMA kernel (`true`), or never it (`false`), where set.
    wide: Option<bool>,
}

impl Wgpu {
    /// The backend (nothing is opened until it is used).
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses the reductions through workgroup memory even where subgroups exist: to verify that
    /// path on adapters that have both.
    pub fn without_subgroups(mut self) -> Self {
        self.no_subgroups = true;
        self
    }

    /// Plans only with micro-tiles of `groups` key groups (1: 4x4, 2: 4x8, 4: 4x16, f32 D=64's
    /// default): to time one width against another. A problem that no variant of that width
    /// fits is a plan error.
    pub fn with_key_groups(mut self, groups: u32) -> Self {
        self.key_groups = Some(groups);
        self
    }

    /// Plans only with K/V chunks of `columns` head-dim columns (a multiple of 32): to time
    /// smaller stages (less workgroup memory, more barriers) against larger ones.
    pub fn with_chunk(mut self, columns: u32) -> Self {
        self.chunk = Some(columns);
        self
    }

    /// Plans only with `threads` invocations per query row (8 or 16; 16 needs subgroups of 16
    /// or more where subgroups are used): to time one against the other.
    pub fn with_row_threads(mut self, threads: u32) -> Self {
        self.row_threads = Some(threads);
        self
    }

    /// Plans only with `stages` K/V stage buffers (1 or 2; 2 saves a barrier per stage for twice
    /// the chunk's workgroup memory): to time one against the other.
    pub fn with_stages(mut self, stages: u32) -> Self {
        self.stages = Some(stages);
        self
    }

    /// Plans only with V read straight from its buffer by P·V (`true`) or staged through
    /// workgroup memory (`false`): to time one against the other.
    pub fn with_v_direct(mut self, direct: bool) -> Self {
        self.v_direct = Some(direct);
        self
    }

    /// Plans only with V staged by keys, all columns at a time (`true`,
    /// [`crate::plan::Variant::v_by_keys`]), or never (`false`): to time it against V staged by
    /// head-dim columns.
    pub fn with_v_by_keys(mut self, by_keys: bool) -> Self {
        self.v_by_keys = Some(by_keys);
        self
    }

    /// Plans only with Q held in registers and shuffled (`true`,
    /// [`crate::plan::Variant::q_regs`]), or with Qᵀ in workgroup memory (`false`): to time one
    /// against the other.
    pub fn with_q_regs(mut self, regs: bool) -> Self {
        self.q_regs = Some(regs);
        self
    }

    /// Plans only with K read straight from its buffer (packed transposed per tile) as well as V
    /// (`true`), or never (`false`): to time one against the other.
    pub fn with_k_direct(mut self, direct: bool) -> Self {
        self.k_direct = Some(direct);
        self
    }

    /// Plans only with workgroups of `rows` query rows (FMA kernel: 16 to 128): to time one
    /// height against another.
    pub fn with_rows(mut self, rows: u32) -> Self {
        self.rows = Some(rows);
        self
    }

    /// Plans only with `groups` row groups' lanes interleaved (1, 2 or 4,
    /// [`crate::plan::Variant::interleave`]): to time paired workgroup-memory loads against
    /// neighbouring ones.
    pub fn with_interleave(mut self, groups: u32) -> Self {
        self.interleave = Some(groups);
        self
    }

    /// Plans only with S = Q·Kᵀ split over the head dim and reduced across the row's lanes
    /// (`true`, [`crate::plan::Variant::split_d`]), or with Q shuffled (`false`): to time one
    /// against the other.
    pub fn with_split_d(mut self, split: bool) -> Self {
        self.split_d = Some(split);
        self
    }

    /// Plans only with the K/V stages that no row sees skipped (`true`,
    /// [`crate::plan::Variant::skip_unseen`]), or loaded, computed and masked (`false`): to time
    /// one against the other.
    pub fn with_skip_unseen(mut self, skip: bool) -> Self {
        self.skip_unseen = Some(skip);
        self
    }

    /// Plans only with the FMA kernel of 8x8 register tiles (`true`, [`Kernel::Wide`]) or never
    /// with it (`false`): to time it against the 4x8 kernel.
    pub fn with_wide(mut self, wide: bool) -> Self {
        self.wide = Some(wide);
        self
    }

    /// Plans only with probabilities exchanged by subgroup shuffles (`true`) or through
    /// workgroup memory (`false`): to time one against the other.
    pub fn with_p_shuffle(mut self, shuffle: bool) -> Self {
        self.p_shuffle = Some(shuffle);
        self
    }

    /// [`Wgpu::new`], with [`Wgpu::without_subgroups`] when `ATTN_WGPU_SUBGROUPS=0`,
    /// [`Wgpu::with_key_groups`] from `ATTN_WGPU_KEY_GROUPS` (1 or 2), [`Wgpu::with_chunk`]
    /// from `ATTN_WGPU_CHUNK`, [`Wgpu::with_row_threads`] from `ATTN_WGPU_ROW_THREADS` (8, 16 or 4),
    /// [`Wgpu::with_stages`] from `ATTN_WGPU_STAGES` (1 or 2), [`Wgpu::with_p_shuffle`] from
    /// `ATTN_WGPU_P_SHUFFLE` (0 or 1), [`Wgpu::with_v_direct`] from `ATTN_WGPU_V_DIRECT` (0
    /// or 1), [`Wgpu::with_v_by_keys`] from `ATTN_WGPU_V_KEYS` (0 or 1), [`Wgpu::with_q_regs`]
    /// from `ATTN_WGPU_Q_REGS` (0 or 1), [`Wgpu::with_k_direct`] from `ATTN_WGPU_K_DIRECT` (0 or
    /// 1), [`Wgpu::with_interleave`] from `ATTN_WGPU_INTERLEAVE` (1, 2 or 4),
    /// [`Wgpu::with_split_d`] from `ATTN_WGPU_SPLIT_D` (0 or 1), [`Wgpu::with_skip_unseen`] from
    /// `ATTN_WGPU_SKIP_UNSEEN` (0 or 1), [`Wgpu::with_rows`] from
    /// `ATTN_WGPU_ROWS` and [`Wgpu::with_wide`] from
    /// `ATTN_WGPU_WIDE` (0 or 1), all for the FMA kernels;
    /// `ATTN_WGPU_COOP_ROWS` (16, 32 or 64) and `ATTN_WGPU_COOP_KEYS` (16, 32 or 64) keep the
    /// cooperative-matrix kernel's shapes with that many rows per workgroup or keys per tile.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().and_then(|v| v.trim().parse::<u32>().ok());
        let off = std::env::var("ATTN_WGPU_SUBGROUPS").is_ok_and(|v| v.trim() == "0");
        Wgpu {
            no_subgroups: off,
            key_groups: var("ATTN_WGPU_KEY_GROUPS"),
            chunk: var("ATTN_WGPU_CHUNK"),
            row_threads: var("ATTN_WGPU_ROW_THREADS"),
            stages: var("ATTN_WGPU_STAGES"),
            coop_rows: var("ATTN_WGPU_COOP_ROWS"),
            coop_keys: var("ATTN_WGPU_COOP_KEYS"),
            p_shuffle: var("ATTN_WGPU_P_SHUFFLE").map(|v| v != 0),
            v_direct: var("ATTN_WGPU_V_DIRECT").map(|v| v != 0),
            v_by_keys: var("ATTN_WGPU_V_KEYS").map(|v| v != 0),
            q_regs: var("ATTN_WGPU_Q_REGS").map(|v| v != 0),
            rows: var("ATTN_WGPU_ROWS"),
            interleave: var("ATTN_WGPU_INTERLEAVE"),
            split_d: var("ATTN_WGPU_SPLIT_D").map(|v| v != 0),
            skip_unseen: var("ATTN_WGPU_SKIP_UNSEEN").map(|v| v != 0),
            k_direct: var("ATTN_WGPU_K_DIRECT").map(|v| v != 0),
            wide: var("ATTN_WGPU_WIDE").map(|v| v != 0),
            ..Self::default()
        }
    }

    /// [`plan::choose`], limited to this backend's tile knobs where it has them: each kernel's
    /// knobs filter only that kernel's shapes, so that timing one never moves a dtype to the
    /// other (`ATTN_WGPU_COOP=0` is how f16 gets the FMA kernel where both exist).
    fn choose(&self, problem: &attn_core::Problem, caps: &AdapterCaps) -> Result<plan::Choice> {
        let allowed = |v: &Variant| {
            if v.kernel == Kernel::Coop {
                self.coop_rows.is_none_or(|r| v.block_m() == r)
                    && self.coop_keys.is_none_or(|n| v.block_n() == n)
            } else {
                self.key_groups.is_none_or(|g| v.key_groups == g)
                    && self.chunk.is_none_or(|c| v.chunk == c)
                    && self.row_threads.is_none_or(|t| v.row_threads == t)
                    && self.stages.is_none_or(|n| v.stages == n)
                    && self.p_shuffle.is_none_or(|p| v.p_shuffle == p)
                    && self.v_direct.is_none_or(|d| v.v_direct == d)
                    && self.v_by_keys.is_none_or(|k| v.v_by_keys == k)
                    && self.q_regs.is_none_or(|q| v.q_regs == q)
                    && self.rows.is_none_or(|r| v.block_m() == r)
                    && self.interleave.is_none_or(|i| v.interleave == i)
                    && self.split_d.is_none_or(|s| v.split_d == s)
                    && self.skip_unseen.is_none_or(|s| v.skip_unseen == s)
                    && self.k_direct.is_none_or(|d| v.k_direct == d)
                    && self.wide.is_none_or(|w| (v.kernel == Kernel::Wide) == w)
            }
        };
        let choice = plan::choose_among(problem, caps, &allowed)?;
        // The timing experiment's unused workgroup memory counts against the limit too: the
        // driver hung, rather than refused, a kernel declared over it.
        let padded = choice.variant.shared_bytes() + crate::shader::padding_bytes();
        if padded > caps.workgroup_storage {
            return Err(Error::OverDeviceLimit {
                kernel: choice.variant.name(),
                resource: "workgroup storage with ATTN_WGPU_PAD_SHARED (bytes)",
                needed: padded as u64,
                allowed: caps.workgroup_storage as u64,
                device: caps.name.clone(),
            });
        }
        Ok(choice)
    }

    /// The adapter's capabilities as this backend plans with them.
    fn caps(&self, gpu: &Gpu) -> AdapterCaps {
        let mut caps = gpu.caps.clone();
        if self.no_subgroups {
            caps.subgroup_min = None;
        }
        caps
    }

    /// The open device, or why there is none.
    pub fn gpu(&self) -> Result<Arc<Gpu>> {
        self.gpu
            .get_or_init(|| Gpu::open().map(Arc::new))
            .clone()
            .map_err(|reason| Error::Unavailable { backend: "wgpu".into(), reason })
    }

    /// The variant and launch the plan names, recomputed (planning is deterministic).
    fn variant_of(&self, gpu: &Gpu, plan: &Plan) -> Result<(Variant, [u32; 3])> {
        let choice = self.choose(&plan.problem, &self.caps(gpu))?;
        if choice.variant.name() != plan.kernel {
            return Err(Error::PlanMismatch {
                what: format!(
                    "`{}` is not what the wgpu backend plans here ({})",
                    plan.kernel,
                    choice.variant.name()
                ),
            });
        }
        Ok((choice.variant, choice.launch.grid))
    }
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
        // Compiled here (once per variant and process), so that a compile error is a plan error.
        gpu.pipeline(&choice.variant)?;
        choice.notes.insert(0, format!("adapter {}", gpu.description));
        choice.notes.push(gpu.checks().describe().into());
        let padding = crate::shader::padding_bytes();
        if choice.variant.kernel != Kernel::Coop && padding > 0 {
            choice.notes.push(format!(
                "ATTN_WGPU_PAD_SHARED: {padding} B more workgroup memory declared (unused) for a timing experiment"
            ));
        }
        let ablated = crate::shader::Ablation::current().parts();
        if !ablated.is_empty() {
            choice.notes.push(format!(
                "ATTN_WGPU_ABLATE: {} taken out of the kernel for timing; RESULTS ARE WRONG",
                ablated.join(", ")
            ));
        }
        Ok(Plan {
            backend: self.name().into(),
            kernel: choice.variant.name(),
            problem: *problem,
            tiles: choice.tiles,
            execution: Execution::Gpu(choice.launch),
            notes: choice.notes,
            payload: Default::default(),
        })
    }

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        plan.check_for(self.name(), &plan.problem)?;
        let problem = plan.problem;
        problem.check_inputs(&inputs)?;
        let gpu = self.gpu()?;
        let (variant, grid) = self.variant_of(&gpu, plan)?;
        let pipeline = gpu.pipeline(&variant)?;
        let s = problem.shape;
        let d = variant.head_dim as usize;
        let rows = plan::padded_rows(&variant, s.seq_q, s.seq_k);
        let k_tiles = variant.k_direct.then_some(variant.block_n() as usize);
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
