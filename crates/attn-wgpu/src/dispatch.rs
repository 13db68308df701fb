//! The attention dispatches of one plan over packed buffers, shared by the host path
//! (`backend.rs`, buffers of its own per prepared call) and the device-resident path
//! (`resident.rs`, the backend's scratch buffers): one dispatch of the kernel over all keys, or,
//! with a key split ([`KeySplit`]), one per part of the keys, each followed by the merge step.

use crate::plan::{KeySplit, Variant};
use crate::runtime::Gpu;
use attn_core::{Alibi, Mask, Problem, Result};
use std::sync::Arc;
use wgpu::util::DeviceExt;

/// The kernel's uniform block; field order and types match `struct Params` in
/// `kernels/bindings.wgsl` (whose score parameters only the kernels with a window, a soft-cap or
/// ALiBi declare: the others read a prefix of the block).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
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
    // The score parameters (`wgsl::SCORE_PARAMS`), declared by the kernels that use them.
    win_left: i32,
    win_right: i32,
    softcap: f32,
    inv_softcap: f32,
    alibi_batch_stride: u32,
    pad_scores: [u32; 4],
}

/// The merge step's uniform block; matches `struct Merge` in `merge.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Merge {
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

/// Bytes of each packed buffer a plan's dispatches use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub(crate) q: u64,
    pub(crate) k: u64,
    pub(crate) v: u64,
    /// The output, in the kernel's element type; with a split, each part's too.
    pub(crate) o: u64,
    /// The LSE (f32 per query row); with a split, each part's too.
    pub(crate) lse: u64,
    /// With a split, the running output (f32).
    pub(crate) o_acc: Option<u64>,
}

impl Sizes {
    /// The sizes for `problem` run by `variant`, split as `split` says.
    pub(crate) fn of(problem: &Problem, variant: &Variant, split: Option<KeySplit>) -> Sizes {
        let s = problem.shape;
        let d = variant.head_dim as u64;
        let el = variant.ty.size();
        let (rq, rk) = crate::plan::padded_rows(variant, s.seq_q, s.seq_k);
        let rows_q = (s.batch * s.heads_q * s.seq_q) as u64;
        Sizes {
            q: (s.batch * s.heads_q * rq) as u64 * d * el,
            k: (s.batch * s.heads_kv * rk) as u64 * d * el,
            v: (s.batch * s.heads_kv * rk) as u64 * d * el,
            o: rows_q * d * el,
            lse: rows_q * 4,
            o_acc: split.map(|_| rows_q * d * 4),
        }
    }
}

/// The packed buffers one plan's dispatches read and write.
pub(crate) struct Buffers<'a> {
    pub(crate) q: &'a wgpu::Buffer,
    pub(crate) k: &'a wgpu::Buffer,
    pub(crate) v: &'a wgpu::Buffer,
    pub(crate) o: &'a wgpu::Buffer,
    pub(crate) lse: &'a wgpu::Buffer,
    /// The kernel's loop-limit flag (one u32, cleared before each run).
    pub(crate) status: &'a wgpu::Buffer,
    /// With a split: each part's o and LSE, and the running o (f32).
    pub(crate) partial: Option<[&'a wgpu::Buffer; 3]>,
    /// With ALiBi: the slopes (f32, `[heads_q]` or `[batch, heads_q]`).
    pub(crate) alibi_slopes: Option<&'a wgpu::Buffer>,
    /// With sequences of their own lengths: each sequence's query and key counts (u32 pairs).
    pub(crate) seq_lens: Option<&'a wgpu::Buffer>,
}

/// The compiled dispatches of one plan over one set of [`Buffers`]: record them as often as the
/// plan runs.
pub(crate) struct Dispatches {
    pipeline: Arc<wgpu::ComputePipeline>,
    /// The kernel's bind group for each dispatch: one, or one per part of a key split.
    flash: Vec<wgpu::BindGroup>,
    /// With a key split: the merge step, its bind group after each part, and its grid.
    merge: Option<(Arc<wgpu::ComputePipeline>, Vec<wgpu::BindGroup>, [u32; 3])>,
    grid: [u32; 3],
}

impl Dispatches {
    /// The pipelines (compiled on first use, then cached by the runtime), uniform blocks and
    /// bind groups of `variant` on `problem` over `buffers`.
    pub(crate) fn new(
        gpu: &Gpu,
        problem: &Problem,
        variant: &Variant,
        grid: [u32; 3],
        split: Option<KeySplit>,
        buffers: &Buffers<'_>,
    ) -> Result<Dispatches> {
        let pipeline = gpu.pipeline(variant)?;
        let merge = split.map(|_| gpu.merge_pipeline(variant.ty)).transpose()?;
        let s = problem.shape;
        let d = variant.head_dim;
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
            ..score_params(problem)
        };
        let rows_q = (s.batch * s.heads_q * s.seq_q) as u32;
        let merge_groups = rows_q.div_ceil(MERGE_WORKGROUP);
        let merge_x = merge_groups.min(gpu.caps.workgroups_per_dim.max(1));
        let merge_grid = [merge_x, merge_groups.div_ceil(merge_x), 1];
        let device = &gpu.device;
        let uniform = |label, bytes: &[u8]| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytes,
                usage: wgpu::BufferUsages::UNIFORM,
            })
        };
        let (flash, merges) = gpu.scoped("creating the kernel's bindings", || {
            // With a split, each part writes the partial buffers and the merge step folds them in.
            let (o_dst, lse_dst) = match &buffers.partial {
                Some([o_part, lse_part, _]) => (*o_part, *lse_part),
                None => (buffers.o, buffers.lse),
            };
            let mut flash = vec![];
            let mut merges = vec![];
            for (i, &range) in parts.iter().enumerate() {
                let u = uniform("params", bytemuck::bytes_of(&params(range)));
                let b = buffers;
                // The layout always has the slopes' and the lengths' bindings; kernels that do
                // not declare them get q there (read-only, never read).
                let slopes = b.alibi_slopes.unwrap_or(b.q);
                let lens = b.seq_lens.unwrap_or(b.q);
                flash.push(bind(
                    device,
                    &gpu.layout,
                    "attn flash",
                    &[&u, b.q, b.k, b.v, o_dst, lse_dst, b.status, slopes, lens],
                ));
                if let Some([o_part, lse_part, o_acc]) = &buffers.partial {
                    let m = Merge {
                        rows: rows_q,
                        d4: d / 4,
                        first: u32::from(i == 0),
                        last: u32::from(i + 1 == parts.len()),
                        groups_x: merge_grid[0],
                        neg_inf_bits: f32::NEG_INFINITY.to_bits(),
                        pad: [0; 2],
                    };
                    let u = uniform("merge", bytemuck::bytes_of(&m));
                    merges.push(bind(
                        device,
                        &gpu.merge_layout,
                        "attn merge",
                        &[&u, o_part, lse_part, o_acc, buffers.lse, buffers.o],
                    ));
                }
            }
            (flash, merges)
        })?;
        Ok(Dispatches { pipeline, flash, merge: merge.map(|m| (m, merges, merge_grid)), grid })
    }

    /// Records the dispatches into `pass`, in order (each part, then its merge).
    pub(crate) fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
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
}

/// The score parameters of `problem`'s uniform block, every other field zero: the window's
/// sides (an unbounded one, and any longer, as `seq_q + seq_k`, which reaches past every key:
/// the planner keeps that within i32, `plan::WINDOW_MAX_ROWS`), the soft-cap in the scores' log2
/// units, and the slopes' batch stride.
fn score_params(problem: &Problem) -> Params {
    let s = problem.shape;
    let p = &problem.params;
    let unbounded = (s.seq_q + s.seq_k).min(i32::MAX as usize);
    let side = |b: Option<usize>| b.map_or(unbounded, |n| n.min(unbounded)) as i32;
    let (win_left, win_right) = match p.mask {
        Mask::Window { left, right } => (side(left), side(right)),
        Mask::None | Mask::Causal => (0, 0),
    };
    let cap = p.softcap.map_or(0.0, |c| c * std::f32::consts::LOG2_E);
    Params {
        win_left,
        win_right,
        softcap: cap,
        inv_softcap: if cap > 0.0 { 1.0 / cap } else { 0.0 },
        alibi_batch_stride: match p.alibi {
            Some(Alibi::PerBatchHead) => s.heads_q as u32,
            Some(Alibi::PerHead) | None => 0,
        },
        ..bytemuck::Zeroable::zeroed()
    }
}

/// A bind group of `layout` with `buffers`, whole, at bindings 0, 1, ...
pub(crate) fn bind(
    device: &wgpu::Device,
    layout: &wgpu::BindGroupLayout,
    label: &str,
    buffers: &[&wgpu::Buffer],
) -> wgpu::BindGroup {
    let entries: Vec<_> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
        .collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout, entries: &entries })
}
