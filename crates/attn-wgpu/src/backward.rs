//! The portable backward pass: `kernels/backward.wgsl`, correct first (one invocation per row,
//! f32 throughout; no tiling, no performance target).
//!
//! The host lays q, k, v and dO out logically in f32 (each sequence's rows at their index within
//! it, head dims padded to whole vec4s), forms `D = rowsum(dO ∘ O)` and reads the LSE per row,
//! uploads them in one buffer, runs the `dkv` and `dq` entry points in one submission, and
//! scatters the f32 gradients back, rounded once, to the rows the sequences have. Every feature of
//! the forward but a paged cache (refused by `Problem::validate_backward`) runs; head dims up to
//! 256.

use crate::backend::read_buffer;
use crate::runtime::Gpu;
use attn_core::{Error, Execution, GradInputs, Gradients, Launch, Plan, Problem, Result, SeqMap, Tiles};
use wgpu::util::DeviceExt;

/// The kernel source.
const SOURCE: &str = include_str!("../kernels/backward.wgsl");
/// Invocations per workgroup (`@workgroup_size` in the kernel).
const WORKGROUP: u32 = 64;
/// The largest head dim the kernel's private accumulators hold (`MAX_D4` vec4s).
const MAX_HEAD_DIM: usize = 256;
/// Workgroups per grid row: the grid's y counts the rows of this many.
const PER_DIM: u32 = 32_768;

/// The kernel's uniform block; matches `struct P` in `kernels/backward.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    batch: u32,
    heads_q: u32,
    heads_kv: u32,
    seq_q: u32,
    seq_k: u32,
    d4: u32,
    group: u32,
    rows_q: u32,
    rows_k: u32,
    q_off: u32,
    k_off: u32,
    v_off: u32,
    do_off: u32,
    dk_off: u32,
    dv_off: u32,
    per_dim: u32,
    scale: f32,
    softcap: f32,
    win_left: i32,
    win_right: i32,
}

/// The sizes one call needs, checked against the adapter before anything is allocated.
struct Sizes {
    d4: usize,
    rows_q: usize,
    rows_k: usize,
}

impl Sizes {
    fn of(problem: &Problem) -> Sizes {
        let s = problem.shape;
        Sizes {
            d4: s.head_dim.div_ceil(4),
            rows_q: s.batch * s.heads_q * s.seq_q,
            rows_k: s.batch * s.heads_kv * s.seq_k,
        }
    }

    /// vec4s of the input buffer (q, k, v, dO) and of the output (dq, dk, dv).
    fn vec4s(&self) -> (usize, usize) {
        (self.d4 * (2 * self.rows_q + 2 * self.rows_k), self.d4 * (self.rows_q + 2 * self.rows_k))
    }

    /// Loop iterations of the longest invocation (a software adapter ends every loop of an
    /// invocation past its limit): dq walks up to seq_k keys, dkv up to group · seq_q rows, each
    /// with three passes over the head dim.
    fn iterations(&self, problem: &Problem) -> u64 {
        let s = problem.shape;
        let per_pair = 3 * self.d4 as u64 + 2;
        (s.seq_k as u64).max((s.group_size() * s.seq_q) as u64) * per_pair + 2 * self.d4 as u64 + 8
    }
}

/// Plans the backward of `problem` on `gpu`, or says why it cannot run there.
pub(crate) fn plan(gpu: &Gpu, problem: &Problem) -> Result<Plan> {
    problem.validate_backward()?;
    let s = problem.shape;
    if s.head_dim > MAX_HEAD_DIM {
        return Err(Error::UnsupportedHeadDim {
            backend: "wgpu".into(),
            head_dim: s.head_dim,
            supported: format!("up to {MAX_HEAD_DIM} in the backward pass"),
        });
    }
    let sizes = Sizes::of(problem);
    let (inputs, outputs) = sizes.vec4s();
    let largest = 16 * inputs.max(outputs) as u64;
    if largest > gpu.caps.storage_binding || sizes.rows_q.max(sizes.rows_k) > u32::MAX as usize / 2 {
        return Err(Error::TooLarge {
            what: format!(
                "{problem}: the backward pass binds {largest} bytes in one buffer; adapter {} binds at most {}",
                gpu.caps.name, gpu.caps.storage_binding
            ),
        });
    }
    let iterations = sizes.iterations(problem);
    if let Some(limit) = gpu.caps.loop_limit
        && iterations > limit as u64
    {
        return Err(Error::Unsupported {
            backend: "wgpu".into(),
            what: format!(
                "{problem}: the backward pass's longest invocation runs {iterations} loop iterations, past the \
                 {limit} this software adapter runs before it ends every loop silently; use cpu-flash"
            ),
        });
    }
    let groups = sizes.rows_q.max(sizes.rows_k).div_ceil(WORKGROUP as usize) as u32;
    let launch = Launch {
        grid: [groups.min(PER_DIM), groups.div_ceil(PER_DIM), 1],
        block: [WORKGROUP, 1, 1],
        dynamic_shared_bytes: 0,
        static_shared_bytes: 0,
        registers_per_thread: None,
        spill_bytes: None,
    };
    Ok(Plan {
        backend: "wgpu".into(),
        kernel: format!("backward f32 d4x{}", sizes.d4),
        problem: *problem,
        tiles: Tiles { block_m: 1, block_n: 1, stages: 1 },
        execution: Execution::Gpu(launch),
        notes: vec![
            format!("adapter {}", gpu.description),
            "portable backward: an invocation per key row (dK, dV) and per query row (dQ), f32 throughout"
                .into(),
            "deterministic: each gradient row is summed by one invocation in a fixed order".into(),
        ],
        payload: Default::default(),
    })
}

/// Runs the backward `plan` (made by [`plan`]) and writes the gradients.
pub(crate) fn run(gpu: &Gpu, plan: &Plan, inputs: &GradInputs<'_>, grads: Gradients<'_>) -> Result<()> {
    let problem = &plan.problem;
    let map = problem.seq_map(inputs.inputs.extras)?;
    let s = problem.shape;
    let sizes = Sizes::of(problem);
    let (d, d4) = (s.head_dim, sizes.d4);
    let (n_in, _) = sizes.vec4s();
    // q, dO, k, v in logical order, one buffer; rows the sequences do not have stay zero.
    let mut t = vec![0f32; 4 * n_in];
    let (q_off, do_off) = (0, sizes.rows_q * d4);
    let (k_off, v_off) = (2 * sizes.rows_q * d4, 2 * sizes.rows_q * d4 + sizes.rows_k * d4);
    let mut rows = vec![[0f32; 2]; sizes.rows_q];
    let ins = &inputs.inputs;
    for (b, h, i) in map.rows() {
        let row = (b * s.heads_q + h) * s.seq_q + i;
        let (qo, oo) = (map.q_offset(b, h, i), map.o_offset(b, h, i));
        let mut delta = 0f32;
        for x in 0..d {
            t[4 * (q_off + row * d4) + x] = ins.q.get_f32(qo + x);
            let g = inputs.d_o.get_f32(oo + x);
            t[4 * (do_off + row * d4) + x] = g;
            delta += g * inputs.o.get_f32(oo + x);
        }
        rows[row] = [inputs.lse[map.lse_index(b, h, i)], delta];
    }
    for (b, g, j) in key_rows(&map) {
        let row = (b * s.heads_kv + g) * s.seq_k + j;
        let (ko, vo) = (map.k_offset(b, g, j), map.v_offset(b, g, j));
        for x in 0..d {
            t[4 * (k_off + row * d4) + x] = ins.k.get_f32(ko + x);
            t[4 * (v_off + row * d4) + x] = ins.v.get_f32(vo + x);
        }
    }
    let seqs: Vec<[u32; 2]> = (0..s.batch).map(|b| [map.q_len(b) as u32, map.k_len(b) as u32]).collect();
    let slopes: Vec<f32> = (0..s.batch * s.heads_q)
        .map(|bh| map.alibi_slope(bh / s.heads_q, bh % s.heads_q).unwrap_or(0.0))
        .collect();
    // Every mask as a window: an unbounded side as seq_k keys back or seq_q ahead.
    let (win_left, win_right) = match problem.params.mask {
        attn_core::Mask::None => (s.seq_k, s.seq_q),
        attn_core::Mask::Causal => (s.seq_k, 0),
        attn_core::Mask::Window { left, right } => {
            (left.unwrap_or(s.seq_k).min(s.seq_k), right.unwrap_or(s.seq_q).min(s.seq_q))
        }
    };
    let Execution::Gpu(launch) = &plan.execution else { unreachable!("plan gives a GPU launch") };
    let params = Params {
        batch: s.batch as u32,
        heads_q: s.heads_q as u32,
        heads_kv: s.heads_kv as u32,
        seq_q: s.seq_q as u32,
        seq_k: s.seq_k as u32,
        d4: d4 as u32,
        group: s.group_size() as u32,
        rows_q: sizes.rows_q as u32,
        rows_k: sizes.rows_k as u32,
        q_off: q_off as u32,
        k_off: k_off as u32,
        v_off: v_off as u32,
        do_off: do_off as u32,
        dk_off: (sizes.rows_q * d4) as u32,
        dv_off: ((sizes.rows_q + sizes.rows_k) * d4) as u32,
        per_dim: launch.grid[0] * WORKGROUP,
        scale: problem.scale(),
        softcap: problem.params.softcap.unwrap_or(0.0),
        win_left: win_left as i32,
        win_right: win_right as i32,
    };
    let (_, n_out) = sizes.vec4s();
    let bytes = gpu.scoped("the backward pass", || {
        let device = &gpu.device;
        let init = |label: &str, contents: &[u8], usage: wgpu::BufferUsages| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage,
            })
        };
        let storage = wgpu::BufferUsages::STORAGE;
        let uniform = init("backward params", bytemuck::bytes_of(&params), wgpu::BufferUsages::UNIFORM);
        let tensors = init("backward inputs", bytemuck::cast_slice(&t), storage);
        let row_buf = init("backward rows", bytemuck::cast_slice(&rows), storage);
        let seq_buf = init("backward seqs", bytemuck::cast_slice(&seqs), storage);
        let slope_buf = init("backward slopes", bytemuck::cast_slice(&slopes), storage);
        let out = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("backward gradients"),
            size: (16 * n_out) as u64,
            usage: storage | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("attn backward"),
            source: wgpu::ShaderSource::Wgsl(SOURCE.into()),
        });
        let mut encoder = device.create_command_encoder(&Default::default());
        for entry in ["dkv", "dq"] {
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
            let buffers = [&uniform, &tensors, &row_buf, &seq_buf, &slope_buf, &out];
            let entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
                .collect();
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(entry),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(launch.grid[0], launch.grid[1], 1);
        }
        gpu.queue.submit([encoder.finish()]);
        out
    })?;
    let bytes = read_buffer(gpu, &bytes)?;
    let grads_f32: &[f32] = bytemuck::cast_slice(&bytes);
    let Gradients { mut dq, mut dk, mut dv } = grads;
    let at = |base: usize, row: usize| &grads_f32[4 * (base + row * d4)..][..d];
    for (b, h, i) in map.rows() {
        let row = (b * s.heads_q + h) * s.seq_q + i;
        dq.store_f32(map.q_offset(b, h, i), at(0, row));
    }
    for (b, g, j) in key_rows(&map) {
        let row = (b * s.heads_kv + g) * s.seq_k + j;
        dk.store_f32(map.k_offset(b, g, j), at(params.dk_off as usize, row));
        dv.store_f32(map.v_offset(b, g, j), at(params.dv_off as usize, row));
    }
    Ok(())
}

/// Every key row `(b, g, j)` the sequences have.
fn key_rows<'a>(map: &'a SeqMap<'a>) -> impl Iterator<Item = (usize, usize, usize)> + 'a {
    let s = map.problem().shape;
    (0..s.batch)
        .flat_map(move |b| (0..s.heads_kv).flat_map(move |g| (0..map.k_len(b)).map(move |j| (b, g, j))))
}

#[cfg(test)]
mod tests {
    #[test]
    fn params_match_the_wgsl_struct() {
        let module = naga::front::wgsl::parse_str(super::SOURCE).expect("the kernel parses");
        let p = module.types.iter().find(|(_, t)| t.name.as_deref() == Some("P")).expect("struct P").1;
        let naga::TypeInner::Struct { members, span } = &p.inner else { panic!("P is not a struct") };
        assert_eq!(*span as usize, std::mem::size_of::<super::Params>());
        assert_eq!(members.len(), std::mem::size_of::<super::Params>() / 4);
    }
}
