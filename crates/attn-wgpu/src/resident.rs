//! Attention on tensors that already live in `wgpu::Buffer`s, on the caller's device and queue.
//!
//! The [`Attention`](attn_core::Attention) trait's path packs host slices on the host and reads
//! the output back: right for a benchmark or a one-off call, wrong inside a renderer or an ML
//! runtime whose tensors are on the GPU already. These calls take the caller's buffers instead:
//!
//! - [`Wgpu::from_device`] builds the backend on the caller's `wgpu::Device` and `wgpu::Queue`
//!   (plans, pipelines and buffers all live there; it never opens a device of its own).
//! - [`Wgpu::record`] records one attention call into the caller's `wgpu::CommandEncoder`; the
//!   caller submits it, together with their own commands, whenever they like.
//! - [`Wgpu::submit`] records into an encoder of its own and submits it on the queue.
//!
//! Plans come from [`Attention::plan`](attn_core::Attention::plan), as for the host path; the
//! [`Problem`] in the plan describes the caller's tensors: their dtype (f32,
//! f16, bf16), shape and strides (any, with a contiguous head dim).
//!
//! ## Why there are layout passes
//! The attention kernels read one layout only: contiguous `[batch, heads, seq, d_pad]` with the
//! head dim padded with zeros to a multiple of 32, each head's K and V rows padded with zeros to
//! whole key tiles (their loads are unguarded), K transposed per tile for some kernels, and f32
//! or f16 elements (bf16 has no WGSL type, and widening it to f32 is exact). The host path
//! builds that layout on the host; here a pack pass per input builds it on the GPU, from the
//! caller's buffers into scratch buffers, and an unpack pass writes the packed output into the
//! caller's o (rounding to f16 or bf16 where needed, as the host path does) and copies the LSE.
//! One call records a clear of the status word, with ALiBi a copy of the caller's slopes into a
//! scratch buffer, with packed or paged sequences copies of their index arrays into another,
//! then, in one compute pass: with sequences the sequence pass (each sequence's lengths and first
//! packed rows, [`DeviceSequences`]), three pack dispatches, the
//! attention dispatch (or, on software adapters with a loop limit, one per part of the keys,
//! each followed by a merge dispatch: the planner's key split), and the unpack dispatch.
//! The results are the host path's bit for bit.
//!
//! ## What is cached, what a call allocates
//! Pipelines are compiled once per device (on the first call that needs them). The packed
//! buffers are scratch shared by every plan of the backend, grown (to the next power of two, up
//! to the device's binding limit) when a larger problem comes and otherwise reused: memory is
//! bounded by the largest problem seen, not by the number of shapes. Each plan's uniform blocks
//! and the bind groups of its attention dispatches are kept for the last [`PLANS_KEPT`] plans
//! used; the layout passes' uniform blocks depend on where the tensors start within their
//! bindings and are kept per plan for the last [`PLACES_KEPT`] placements. After the first call
//! of a plan at a placement, a call creates no buffer; it creates four bind groups over the
//! caller's buffers (host objects, no device memory) and records its passes.
//!
//! ## What the caller guarantees
//! - The buffers were created on this backend's device (wgpu reports another device's buffer
//!   as a validation error, which becomes an [`Error::Backend`]).
//! - q, k, v, o (and the LSE) hold the plan's problem: elements of its dtype (f32 as `f32`, f16
//!   and bf16 as their 16-bit patterns, little-endian), starting at the given byte offset, laid
//!   out by its strides; ALiBi's slopes (where the problem has ALiBi) are f32 as
//!   [`DeviceInputs::alibi_slopes`] says, the index arrays of packed or paged sequences i32 as
//!   [`DeviceSequences`] says. The tensors' buffers need `STORAGE` usage; q, k and v may be one
//!   buffer (a fused QKV projection) and may alias each other freely, o and the LSE must not
//!   overlap each other or the inputs.
//! - Nothing else writes o or the LSE between the recording and the end of the submission.
//!
//! Everything that can be checked is checked before anything is recorded, each failure a typed
//! [`Error`]: a plan of another backend, problem or device ([`Error::PlanMismatch`]), a buffer
//! without `STORAGE` usage, an offset that is not a whole element, a buffer smaller than what the
//! strides reach, an LSE buffer missing where the problem asks for one or given where it does not
//! ([`Error::Shape`]), a tensor whose span exceeds one storage binding of the device
//! ([`Error::OverDeviceLimit`]), ALiBi's slopes missing where the problem has ALiBi or given where
//! it has none, at an offset that is not a whole f32, in a buffer without `COPY_SRC` usage or too
//! short for `[heads_q]` or `[batch, heads_q]` ([`Error::Shape`] of `alibi_slopes`), the same
//! for each index array of packed or paged sequences, which must be given exactly where the
//! problem reads it ([`Error::Shape`] of `cu_seqlens_q`, `cu_seqlens_k`, `seqused_k`,
//! `block_table`). Sliding windows and soft-caps need no data beyond q, k and v. The slopes'
//! values are not checked (that would need a copy back): non-finite ones give non-finite
//! scores, as they would on the host path unchecked. Nor are the index arrays' entries: the
//! sequence pass clamps offsets into `[0, total]`, lengths into `[0, seq_q]` / `[0, seq_k]`
//! (never past the packed rows) and key counts into `[0, the keys a sequence holds]`, the pack
//! pass page numbers into the cache: corrupt arrays give wrong rows, never a read or a write
//! outside the tensors' views, and valid ones pass the clamps unchanged (the host path's bits).
//! Nothing outside the views is written: where a 16-bit element shares its 4-byte word with
//! memory outside the view, only its half of the word is changed.
//!
//! ## ALiBi
//! The kernels read the slopes from a storage binding, as the host path's (which uploads them
//! with the inputs) do. The caller's slopes are copied (`copy_buffer_to_buffer`, a few hundred
//! bytes) into a scratch buffer of the backend's before the compute pass, rather than bound in
//! place: the attention dispatches' bind groups then stay those cached with the plan, over
//! scratch only, and the slopes need no storage-offset alignment.
//!
//! ## Errors the GPU finds
//! A kernel whose loops a software adapter cut short (Mesa's, past 65535 loop iterations of
//! an invocation; the planner's key split prevents it) cannot return an error from the GPU: the unpack pass
//! writes NaN to the whole output and LSE instead, never a finite wrong answer.

use crate::backend::{Chosen, Wgpu};
use crate::dispatch::{self, Dispatches, Sizes};
use crate::plan::Variant;
use crate::repack::{self, Extent, Input, Repack, Window};
use crate::runtime::Gpu;
use attn_core::{Error, Plan, Problem, Result};
use std::sync::Mutex;
use wgpu::util::DeviceExt;

/// Plans whose bindings the backend keeps (the least recently used goes first).
pub const PLANS_KEPT: usize = 32;

/// Placements (where the tensors start within their bindings) whose layout-pass uniform blocks
/// a plan keeps.
pub const PLACES_KEPT: usize = 8;

/// A tensor in a caller's buffer: the buffer, and the byte offset of the tensor's element
/// `[0, 0, 0, 0]` in it (a multiple of the element size; no other alignment is needed).
#[derive(Clone, Copy, Debug)]
pub struct DeviceTensor<'a> {
    /// The buffer; it needs `STORAGE` usage.
    pub buffer: &'a wgpu::Buffer,
    /// Bytes from the buffer's start to the tensor's first element.
    pub offset: u64,
}

impl<'a> DeviceTensor<'a> {
    /// The tensor that starts at the beginning of `buffer`.
    pub fn new(buffer: &'a wgpu::Buffer) -> Self {
        DeviceTensor { buffer, offset: 0 }
    }

    /// The tensor that starts `offset` bytes into `buffer`.
    pub fn at(buffer: &'a wgpu::Buffer, offset: u64) -> Self {
        DeviceTensor { buffer, offset }
    }
}

/// The inputs of a device-resident call, laid out as the plan's problem says.
#[derive(Clone, Copy, Debug)]
pub struct DeviceInputs<'a> {
    /// Queries, `[batch, heads_q, seq_q, head_dim]` by the problem's `strides.q`.
    pub q: DeviceTensor<'a>,
    /// Keys, `[batch, heads_kv, seq_k, head_dim]` by `strides.k`.
    pub k: DeviceTensor<'a>,
    /// Values, `[batch, heads_kv, seq_k, head_dim]` by `strides.v`.
    pub v: DeviceTensor<'a>,
    /// ALiBi's slopes, f32 in natural units, `[heads_q]` (`Alibi::PerHead`) or `[batch,
    /// heads_q]` (`Alibi::PerBatchHead`) contiguous: given exactly when the problem has ALiBi
    /// (`Params::alibi`). The buffer needs `COPY_SRC` usage (the call copies the slopes into a
    /// scratch buffer the kernel binds); the offset is a multiple of 4.
    pub alibi_slopes: Option<DeviceTensor<'a>>,
    /// The index arrays of packed or paged sequences (none for a dense problem).
    pub sequences: DeviceSequences<'a>,
}

impl<'a> DeviceInputs<'a> {
    /// q, k and v, without ALiBi's slopes or index arrays.
    pub fn new(q: DeviceTensor<'a>, k: DeviceTensor<'a>, v: DeviceTensor<'a>) -> Self {
        DeviceInputs { q, k, v, alibi_slopes: None, sequences: DeviceSequences::default() }
    }

    /// The same inputs with ALiBi's slopes in `slopes` (see [`DeviceInputs::alibi_slopes`]).
    pub fn with_alibi_slopes(self, slopes: DeviceTensor<'a>) -> Self {
        DeviceInputs { alibi_slopes: Some(slopes), ..self }
    }

    /// The same inputs with the index arrays of packed or paged sequences.
    pub fn with_sequences(self, sequences: DeviceSequences<'a>) -> Self {
        DeviceInputs { sequences, ..self }
    }
}

/// The index arrays of packed (varlen) sequences and of a paged KV cache in the caller's
/// buffers, what [`attn_core::Extras`] holds on the host: `i32`, contiguous, each given exactly
/// when the plan's problem reads it ([`Problem::extras_read`]), at an offset that is a multiple
/// of 4 in a buffer with `COPY_SRC` usage (the call copies them into a scratch buffer, as it
/// does ALiBi's slopes). Their contents are not checked (that would need a copy back): the
/// passes clamp every index into the problem's bounds (see the [module notes](self)).
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceSequences<'a> {
    /// `[batch + 1]` query offsets from 0: for packed (varlen) queries.
    pub cu_seqlens_q: Option<DeviceTensor<'a>>,
    /// `[batch + 1]` key offsets from 0: for packed (varlen) keys.
    pub cu_seqlens_k: Option<DeviceTensor<'a>>,
    /// `[batch]` keys each sequence uses: for per-sequence key counts (a cache's `seqused_k`).
    pub seqused_k: Option<DeviceTensor<'a>>,
    /// `[batch, pages_per_seq]` page numbers, row-major: for a paged KV cache.
    pub block_table: Option<DeviceTensor<'a>>,
}

impl<'a> DeviceSequences<'a> {
    /// In [`Problem::extras_read`]'s order.
    fn arrays(&self) -> [Option<DeviceTensor<'a>>; 4] {
        [self.cu_seqlens_q, self.cu_seqlens_k, self.seqused_k, self.block_table]
    }
}

/// The outputs of a device-resident call.
#[derive(Clone, Copy, Debug)]
pub struct DeviceOutputs<'a> {
    /// The output, `[batch, heads_q, seq_q, head_dim]` by the problem's `strides.o`, in its dtype.
    pub o: DeviceTensor<'a>,
    /// The log-sum-exp, f32, `[batch, heads_q, seq_q]` contiguous: given exactly when the
    /// problem asks for it (`Params::return_lse`).
    pub lse: Option<DeviceTensor<'a>>,
}

/// The device-resident calls' state inside a [`Wgpu`] backend.
#[derive(Default)]
pub(crate) struct Resident {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    scratch: Scratch,
    /// Most recently used last.
    plans: Vec<PlanEntry>,
}

/// The packed buffers, shared by all plans, and a count of their reallocations.
#[derive(Default)]
struct Scratch {
    buffers: [Option<wgpu::Buffer>; SLOTS],
    /// Bumped whenever a buffer is replaced: bindings made before are stale.
    generation: u64,
}

/// q, k, v, o, lse, status, o part, lse part, o running, a word that stands for an LSE where
/// none is asked for, ALiBi's slopes, the sequence table and the copied index arrays.
const SLOTS: usize = 13;
const NAMES: [&str; SLOTS] = [
    "attn q",
    "attn k",
    "attn v",
    "attn o",
    "attn lse",
    "attn status",
    "attn o part",
    "attn lse part",
    "attn o running",
    "attn no lse",
    "attn alibi slopes",
    "attn sequence table",
    "attn indices",
];
const STATUS: usize = 5;
const NO_LSE: usize = 9;
const SLOPES: usize = 10;
/// Each sequence's query and key counts (the kernel's `seq_lens`) and first packed rows
/// (`kernels/seqs.wgsl`); bound, unused, by the layout passes of a dense problem too.
const SEQ_TABLE: usize = 11;
/// The caller's index arrays, one after another ([`repack::index_layout`]).
const INDICES: usize = 12;

impl Scratch {
    /// Makes slot `i` hold at least `bytes`, replacing a smaller buffer with one of the next
    /// power of two (at most `limit`, at least `bytes`).
    fn ensure(&mut self, gpu: &Gpu, i: usize, bytes: u64, limit: u64) {
        if self.buffers[i].as_ref().is_some_and(|b| b.size() >= bytes) {
            return;
        }
        let size = bytes.next_power_of_two().min(limit / 4 * 4).max(bytes);
        let mut usage = wgpu::BufferUsages::STORAGE;
        if i == STATUS || i == SLOPES || i == INDICES {
            usage |= wgpu::BufferUsages::COPY_DST;
        }
        self.buffers[i] = Some(gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(NAMES[i]),
            size,
            usage,
            mapped_at_creation: false,
        }));
        self.generation += 1;
    }

    fn get(&self, i: usize) -> &wgpu::Buffer {
        self.buffers[i].as_ref().expect("ensured before use")
    }
}

/// One plan's attention dispatches (over the scratch of one generation) and its layout passes'
/// uniform blocks by placement.
struct PlanEntry {
    /// What the plan chose, for the problem it was made for.
    key: Chosen,
    generation: u64,
    dispatches: Dispatches,
    /// Most recently used last.
    places: Vec<([u32; 5], Uniforms)>,
}

/// The layout passes' uniform blocks for one placement, and their grids (the sequence pass's,
/// with sequences of their own lengths).
struct Uniforms {
    pack: [(wgpu::Buffer, [u32; 3]); 3],
    unpack: (wgpu::Buffer, [u32; 3]),
    seqs: Option<(wgpu::Buffer, [u32; 3])>,
}

impl Wgpu {
    /// Records attention on the caller's buffers into `encoder`: the pack passes, the attention
    /// dispatch(es) and the unpack pass, in one compute pass, preceded by a clear of the
    /// backend's status word. Nothing is submitted: the results are in `outputs` once the
    /// caller's submission of `encoder` has run, ordered after any command recorded into
    /// `encoder` before and before any recorded after.
    ///
    /// `plan` comes from [`Attention::plan`](attn_core::Attention::plan) of this backend; the
    /// module docs ([`crate::resident`]) say what the caller guarantees and what is checked.
    /// `encoder` must be one of this backend's device: one of another device fails when it is
    /// finished, by wgpu's validation.
    pub fn record(
        &self,
        plan: &Plan,
        encoder: &mut wgpu::CommandEncoder,
        inputs: DeviceInputs<'_>,
        outputs: DeviceOutputs<'_>,
    ) -> Result<()> {
        let gpu = self.gpu()?;
        let chosen = self.chosen(plan)?;
        if chosen.device != gpu.id {
            return Err(Error::PlanMismatch {
                what: format!(
                    "plan `{}` was made for another device than this backend's ({}); plan again with this backend",
                    plan.kernel, gpu.caps.name
                ),
            });
        }
        let problem = &plan.problem;
        let windows = windows(&gpu, problem, &inputs, &outputs)?;
        let slopes = slopes(problem, &inputs)?;
        let indices = index_arrays(problem, &inputs.sequences)?;
        let variant = chosen.variant;
        let pack = gpu.repack_pipeline(Repack::Pack { src: problem.dtype, ty: variant.ty })?;
        let unpack = gpu.repack_pipeline(Repack::Unpack { ty: variant.ty, dst: problem.dtype })?;
        let seqs = match problem.batching.is_dense() {
            true => None,
            false => Some(gpu.repack_pipeline(Repack::Seqs)?),
        };
        let sizes = Sizes::of(problem, &variant, chosen.split);

        let mut state = self.resident.state.lock().unwrap_or_else(|e| e.into_inner());
        let State { scratch, plans } = &mut *state;
        let limit = gpu.caps.storage_binding;
        let grown = gpu.scoped("allocating scratch buffers", || {
            let mut wanted = vec![(0, sizes.q), (1, sizes.k), (2, sizes.v), (3, sizes.o), (4, sizes.lse)];
            wanted.extend([(STATUS, 4), (NO_LSE, 4)]);
            // Four u32 a sequence; the indices' entries (a word where there are none).
            wanted.push((SEQ_TABLE, 16 * problem.shape.batch as u64));
            wanted.push((INDICES, 4 * repack::index_layout(problem).1.max(1)));
            if let Some((_, bytes)) = slopes {
                wanted.push((SLOPES, bytes));
            }
            if let Some(o_acc) = sizes.o_acc {
                wanted.extend([(6, sizes.o), (7, sizes.lse), (8, o_acc)]);
            }
            for (i, bytes) in wanted {
                scratch.ensure(&gpu, i, bytes, limit);
            }
        });
        if let Err(e) = grown {
            // A buffer that failed to allocate is invalid: start from none next time.
            *scratch = Scratch { buffers: Default::default(), generation: scratch.generation + 1 };
            return Err(e);
        }
        let key = chosen;
        let at = match plans.iter().position(|e| e.key == key) {
            Some(at) => at,
            None => {
                if plans.len() == PLANS_KEPT {
                    plans.remove(0);
                }
                plans.push(PlanEntry {
                    key,
                    generation: scratch.generation,
                    dispatches: dispatches(&gpu, problem, &chosen, scratch)?,
                    places: vec![],
                });
                plans.len() - 1
            }
        };
        let mut entry = plans.remove(at);
        if entry.generation != scratch.generation {
            entry.dispatches = dispatches(&gpu, problem, &chosen, scratch)?;
            entry.generation = scratch.generation;
        }
        let place = windows.place();
        let uniforms = match entry.places.iter().position(|(p, _)| *p == place) {
            Some(i) => entry.places.remove(i).1,
            None => uniforms(&gpu, problem, &variant, place)?,
        };
        if entry.places.len() == PLACES_KEPT {
            entry.places.remove(0);
        }
        let result = record_call(
            &gpu,
            encoder,
            scratch,
            &entry.dispatches,
            &uniforms,
            Bound {
                pack: &pack,
                unpack: &unpack,
                seqs: seqs.as_deref(),
                inputs: &inputs,
                outputs: &outputs,
                windows: &windows,
                slopes,
                indices: &indices,
            },
        );
        entry.places.push((place, uniforms));
        plans.push(entry);
        result
    }

    /// [`Wgpu::record`] into an encoder of the backend's own, submitted on the queue. Returns
    /// the submission's index, for `wgpu::PollType::Wait` or the caller's own ordering; the call
    /// does not wait.
    pub fn submit(
        &self,
        plan: &Plan,
        inputs: DeviceInputs<'_>,
        outputs: DeviceOutputs<'_>,
    ) -> Result<wgpu::SubmissionIndex> {
        let gpu = self.gpu()?;
        let mut encoder =
            gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("attn") });
        self.record(plan, &mut encoder, inputs, outputs)?;
        gpu.scoped("submitting", || gpu.queue.submit([encoder.finish()]))
    }
}

impl Wgpu {
    /// Bytes of device memory the device-resident calls' scratch buffers hold now: the packed
    /// q, k, v, o and LSE (and a key split's partial results) of the largest problem seen,
    /// rounded up to powers of two. It changes only when a call needs more.
    pub fn scratch_bytes(&self) -> u64 {
        let state = self.resident.state.lock().unwrap_or_else(|e| e.into_inner());
        state.scratch.buffers.iter().flatten().map(wgpu::Buffer::size).sum()
    }

    /// Drops the device-resident calls' scratch buffers and cached bindings (work already
    /// recorded keeps what it uses alive until it has run); the next call allocates again.
    pub fn release_scratch(&self) {
        let mut state = self.resident.state.lock().unwrap_or_else(|e| e.into_inner());
        let generation = state.scratch.generation + 1;
        *state = State { scratch: Scratch { buffers: Default::default(), generation }, plans: vec![] };
    }
}

/// The bindings of the caller's q, k, v, o and LSE (the LSE's only where asked for), or the
/// first reason one cannot be bound.
fn windows(
    gpu: &Gpu,
    problem: &Problem,
    inputs: &DeviceInputs<'_>,
    outputs: &DeviceOutputs<'_>,
) -> Result<Windows> {
    if problem.params.return_lse != outputs.lse.is_some() {
        return Err(Error::Shape {
            tensor: "lse",
            what: match problem.params.return_lse {
                true => "the problem asks for the LSE, but no LSE buffer was given".into(),
                false => "an LSE buffer was given, but the problem does not ask for the LSE".into(),
            },
        });
    }
    let element = problem.dtype.size() as u64;
    let spans = problem.required_lens().map(|(_, n)| n as u128);
    let tensors = [("q", inputs.q), ("k", inputs.k), ("v", inputs.v), ("o", outputs.o)];
    let window = |tensor, t: DeviceTensor<'_>, element, span| {
        let extent = Extent {
            tensor,
            buffer_size: t.buffer.size(),
            usage: t.buffer.usage(),
            offset: t.offset,
            element,
            span,
        };
        repack::window(&extent, gpu.storage_offset_alignment, gpu.caps.storage_binding, &gpu.caps.name)
    };
    let nth = |i: usize| window(tensors[i].0, tensors[i].1, element, spans[i]);
    let qkvo = [nth(0)?, nth(1)?, nth(2)?, nth(3)?];
    let lse = outputs.lse.map(|t| window("lse", t, 4, problem.lse_len() as u128)).transpose()?;
    Ok(Windows { qkvo, lse })
}

/// ALiBi's slopes: their offset in the caller's buffer and their bytes, where the problem has
/// ALiBi; or the first reason they cannot be copied (missing, given for a problem without ALiBi,
/// an offset that is not a whole f32, a buffer without `COPY_SRC` or too short).
fn slopes(problem: &Problem, inputs: &DeviceInputs<'_>) -> Result<Option<(u64, u64)>> {
    let bad = |what: String| Error::Shape { tensor: "alibi_slopes", what };
    let s = problem.shape;
    let (alibi, t) = match (problem.params.alibi, inputs.alibi_slopes) {
        (None, None) => return Ok(None),
        (Some(alibi), Some(t)) => (alibi, t),
        (Some(_), None) => return Err(bad("the problem has ALiBi, but no slopes buffer was given".into())),
        (None, Some(_)) => return Err(bad("a slopes buffer was given, but the problem has no ALiBi".into())),
    };
    let (count, what) = match alibi {
        attn_core::Alibi::PerHead => (s.heads_q, "heads_q"),
        attn_core::Alibi::PerBatchHead => (s.batch * s.heads_q, "batch * heads_q"),
    };
    let bytes = copyable("alibi_slopes", &t, count, what, "f32")?;
    Ok(Some((t.offset, bytes)))
}

/// The bytes of `count` 4-byte elements (`kind`) at `t`, or why the call cannot copy them: an
/// offset that is not a whole element, a buffer without `COPY_SRC` or too short.
fn copyable(name: &'static str, t: &DeviceTensor<'_>, count: usize, what: &str, kind: &str) -> Result<u64> {
    let bad = |what: String| Error::Shape { tensor: name, what };
    let bytes = 4 * count as u64;
    if !t.offset.is_multiple_of(4) {
        return Err(bad(format!(
            "offset {} is not a multiple of the element size (4 bytes, {kind})",
            t.offset
        )));
    }
    if !t.buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
        return Err(bad(format!(
            "the buffer's usage {:?} lacks COPY_SRC (the call copies the {kind} values into its scratch)",
            t.buffer.usage()
        )));
    }
    let end = t.offset.saturating_add(bytes);
    if end > t.buffer.size() {
        return Err(bad(format!(
            "{count} values ({what}) from byte {} reach byte {end}, past the buffer's {} bytes",
            t.offset,
            t.buffer.size()
        )));
    }
    Ok(bytes)
}

/// One index array's copy into the call's scratch: the caller's buffer, the offset and bytes
/// there, and the byte offset in the scratch copy.
struct IndexCopy<'b> {
    from: DeviceTensor<'b>,
    bytes: u64,
    to: u64,
}

/// The copies of the index arrays the problem reads, or the first reason one cannot be made:
/// missing where the problem reads it, given where it does not, or not copyable ([`copyable`]).
fn index_arrays<'b>(problem: &Problem, given: &DeviceSequences<'b>) -> Result<Vec<IndexCopy<'b>>> {
    let (at, _) = repack::index_layout(problem);
    let mut copies = vec![];
    for ((array, t), at) in problem.extras_read().into_iter().zip(given.arrays()).zip(at) {
        let name = array.name;
        let bad = |what: String| Error::Shape { tensor: name, what };
        match (array.read, t) {
            (None, None) => {}
            (Some((n, dims)), None) => {
                return Err(bad(format!(
                    "the problem uses {}, so `{name}` ({dims} = {n} i32 in a buffer) is required but was not given",
                    array.why
                )));
            }
            (None, Some(_)) => {
                return Err(bad(format!(
                    "`{name}` was given, but the problem uses no {}: give it only with one",
                    array.why
                )));
            }
            (Some((n, dims)), Some(t)) => {
                let bytes = copyable(name, &t, n, dims, "i32")?;
                copies.push(IndexCopy { from: t, bytes, to: 4 * at as u64 });
            }
        }
    }
    Ok(copies)
}

/// Where each of the caller's tensors is bound.
struct Windows {
    /// q, k, v, o.
    qkvo: [Window; 4],
    /// The LSE, where asked for.
    lse: Option<Window>,
}

impl Windows {
    /// Where each tensor starts in its binding (q, k, v, o, lse; 0 for no LSE): what the layout
    /// passes' uniform blocks depend on.
    fn place(&self) -> [u32; 5] {
        let q = self.qkvo.map(|w| w.base);
        [q[0], q[1], q[2], q[3], self.lse.map_or(0, |w| w.base)]
    }
}

/// The binding of `t` through `w`.
fn range<'b>(t: &DeviceTensor<'b>, w: Window) -> wgpu::BindingResource<'b> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: t.buffer,
        offset: w.offset,
        size: wgpu::BufferSize::new(w.size),
    })
}

/// The attention dispatches of `chosen` over the scratch buffers.
fn dispatches(gpu: &Gpu, problem: &Problem, chosen: &Chosen, scratch: &Scratch) -> Result<Dispatches> {
    let s = |i| scratch.get(i);
    let buffers = dispatch::Buffers {
        q: s(0),
        k: s(1),
        v: s(2),
        o: s(3),
        lse: s(4),
        status: s(STATUS),
        partial: chosen.split.map(|_| [s(6), s(7), s(8)]),
        // The call copies the caller's slopes here before the compute pass.
        alibi_slopes: problem.params.alibi.map(|_| s(SLOPES)),
        // The sequence pass writes each sequence's lengths here, first in the compute pass.
        seq_lens: (!problem.batching.is_dense()).then(|| s(SEQ_TABLE)),
    };
    Dispatches::new(gpu, problem, &chosen.variant, chosen.grid, chosen.split, &buffers)
}

/// The layout passes' uniform blocks for tensors starting at elements `place` (q, k, v, o, lse)
/// of their bindings.
fn uniforms(gpu: &Gpu, problem: &Problem, variant: &Variant, place: [u32; 5]) -> Result<Uniforms> {
    let per_dim = gpu.caps.workgroups_per_dim;
    let packs = [Input::Q, Input::K, Input::V]
        .into_iter()
        .zip(place)
        .map(|(input, base)| repack::pack_pass(problem, variant, input, base, per_dim))
        .collect::<Result<Vec<_>>>()?;
    let unpack = repack::unpack_pass(problem, variant, place[3], place[4], per_dim)?;
    let seqs = (!problem.batching.is_dense()).then(|| repack::seqs_pass(problem)).transpose()?;
    let uniform = |label, bytes: &[u8]| {
        gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytes,
            usage: wgpu::BufferUsages::UNIFORM,
        })
    };
    gpu.scoped("creating the layout passes' parameters", || {
        let pack = |i: usize| (uniform("attn pack", bytemuck::bytes_of(&packs[i].params)), packs[i].grid);
        Uniforms {
            pack: [pack(0), pack(1), pack(2)],
            unpack: (uniform("attn unpack", bytemuck::bytes_of(&unpack.params)), unpack.grid),
            seqs: seqs.map(|p| (uniform("attn seqs", bytemuck::bytes_of(&p.params)), p.grid)),
        }
    })
}

/// What one call binds besides the scratch: the layout passes' pipelines and the caller's
/// tensors with their bindings.
struct Bound<'c> {
    pack: &'c wgpu::ComputePipeline,
    unpack: &'c wgpu::ComputePipeline,
    /// The sequence pass, with sequences of their own lengths.
    seqs: Option<&'c wgpu::ComputePipeline>,
    inputs: &'c DeviceInputs<'c>,
    outputs: &'c DeviceOutputs<'c>,
    windows: &'c Windows,
    /// ALiBi's slopes: offset and bytes in `inputs.alibi_slopes`.
    slopes: Option<(u64, u64)>,
    /// The index arrays' copies into the scratch.
    indices: &'c [IndexCopy<'c>],
}

/// Creates the bind groups over the caller's buffers, then records the call.
fn record_call(
    gpu: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    scratch: &Scratch,
    dispatches: &Dispatches,
    uniforms: &Uniforms,
    bound: Bound<'_>,
) -> Result<()> {
    let whole = |i: usize| scratch.get(i).as_entire_binding();
    let group = |layout, label, resources: Vec<wgpu::BindingResource<'_>>| {
        let entries: Vec<_> = resources
            .into_iter()
            .enumerate()
            .map(|(i, resource)| wgpu::BindGroupEntry { binding: i as u32, resource })
            .collect();
        gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout,
            entries: &entries,
        })
    };
    let (inputs, outputs, windows) = (bound.inputs, bound.outputs, bound.windows);
    let groups = gpu.scoped("binding the caller's buffers", || {
        let packs: Vec<_> = [inputs.q, inputs.k, inputs.v]
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let u = uniforms.pack[i].0.as_entire_binding();
                let bindings = vec![u, range(t, windows.qkvo[i]), whole(i), whole(SEQ_TABLE), whole(INDICES)];
                group(&gpu.pack_layout, "attn pack", bindings)
            })
            .collect();
        let lse = match (&outputs.lse, windows.lse) {
            (Some(t), Some(w)) => range(t, w),
            _ => whole(NO_LSE),
        };
        let unpack = group(
            &gpu.unpack_layout,
            "attn unpack",
            vec![
                uniforms.unpack.0.as_entire_binding(),
                whole(3),
                whole(4),
                whole(STATUS),
                range(&outputs.o, windows.qkvo[3]),
                lse,
                whole(SEQ_TABLE),
            ],
        );
        let seqs = uniforms.seqs.as_ref().map(|(u, _)| {
            let bindings = vec![u.as_entire_binding(), whole(INDICES), whole(SEQ_TABLE)];
            group(&gpu.seqs_layout, "attn seqs", bindings)
        });
        (packs, unpack, seqs)
    })?;
    let (packs, unpack, seqs) = groups;
    encoder.clear_buffer(scratch.get(STATUS), 0, None);
    if let (Some(t), Some((offset, bytes))) = (inputs.alibi_slopes, bound.slopes) {
        encoder.copy_buffer_to_buffer(t.buffer, offset, scratch.get(SLOPES), 0, bytes);
    }
    for c in bound.indices {
        encoder.copy_buffer_to_buffer(c.from.buffer, c.from.offset, scratch.get(INDICES), c.to, c.bytes);
    }
    let mut pass = encoder
        .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("attn"), timestamp_writes: None });
    if let (Some(pipeline), Some(group), Some((_, [x, y, z]))) = (bound.seqs, &seqs, &uniforms.seqs) {
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(*x, *y, *z);
    }
    pass.set_pipeline(bound.pack);
    for (group, (_, [x, y, z])) in packs.iter().zip(&uniforms.pack) {
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(*x, *y, *z);
    }
    dispatches.record(&mut pass);
    pass.set_pipeline(bound.unpack);
    pass.set_bind_group(0, &unpack, &[]);
    let [x, y, z] = uniforms.unpack.1;
    pass.dispatch_workgroups(x, y, z);
    Ok(())
}
