//! # attn-wgpu
//!
//! The portable GPU backend: a FlashAttention forward written in WGSL and run through `wgpu` on
//! whatever adapter the machine has (Vulkan, Metal, DX12), down to Mesa's lavapipe on a CPU.
//!
//! ## Contract
//! [`Wgpu`] implements [`attn_core::Attention`] for f32, f16 (where the adapter has
//! `SHADER_F16`) and bf16 (widened to f32 on upload, exactly; the output is rounded once back to
//! bf16), any sequence lengths, bottom-right causal masks, grouped-query attention and head dims
//! up to 256 (padded with zeros to a multiple of 32). Inputs of any strides are packed on the host
//! into contiguous BHSD buffers when prepared; the output is written back into the caller's view.
//!
//! ## Numerical promises
//! Scores, probabilities, row statistics and the P·V accumulation are f32 for every dtype
//! ([`attn_core::Numerics::F32Accumulate`]); the scale is folded with log2(e) into Q so that the
//! softmax uses exp2. Rows that see no key give 0 and an LSE of -inf, never NaN.
//!
//! ## Shape of the work
//! [`plan`] picks the tiles from the adapter's limits (workgroup memory, invocations, binding
//! sizes) and refuses with a typed error what cannot run; [`shader`] generates the WGSL of each
//! specialisation from `kernels/flash.wgsl`; [`runtime`] opens the adapter with its real limits,
//! and compiles each pipeline once per process. Where the adapter has `SUBGROUP` (subgroups of
//! 8 or more), row reductions and the hand-over of probabilities from the invocation that
//! computed them to its row's others use subgroup shuffles, otherwise workgroup memory; so does
//! Q, held in registers, in f32's defaults on the H100. Kernel time
//! comes from timestamp queries where the adapter has `TIMESTAMP_QUERY`. K and V pass through
//! registers on their way to workgroup memory (or V is read straight from its buffer, by knob),
//! so that each chunk's global loads overlap the previous chunk's arithmetic. Shaders are compiled without naga's run-time index clamps and
//! loop caps ([`runtime::Checks`] says why that is sound and what it bought).
//!
//! ## Knobs (environment)
//! They exist to verify and time the alternatives (`bench/device/wgpu-explore.sh`).
//! - FMA kernel: `ATTN_WGPU_SUBGROUPS=0`: the reductions through workgroup memory;
//!   `ATTN_WGPU_KEY_GROUPS=1|2|4`: only 4x4, 4x8 or 4x16 score micro-tiles;
//!   `ATTN_WGPU_CHUNK=32|64|..`: only K/V stages of that many head-dim columns;
//!   `ATTN_WGPU_ROW_THREADS=8|16|4`: only that many invocations per query row (16 halves each
//!   one's registers, measured no faster on the H100); `ATTN_WGPU_STAGES=2`: two K/V stage
//!   buffers, one barrier per stage (measured slower on the H100); `ATTN_WGPU_P_SHUFFLE=0`:
//!   probabilities through workgroup memory even where subgroups could shuffle them (with S
//!   split over the head dim too: each lane stores its keys' probabilities as Pᵀ);
//!   `ATTN_WGPU_V_DIRECT=1`: P·V reads V straight from its buffer; `ATTN_WGPU_K_DIRECT=1`: K
//!   too, packed transposed per tile (no stages and no barriers in the tile loop); both picked
//!   only by their knobs until timed on a GPU (or where nothing else fits the adapter);
//!   `ATTN_WGPU_V_KEYS=1|0`: only shapes with V staged by keys with all columns (each key's
//!   probabilities shuffled once per tile, not once per chunk), or none;
//!   `ATTN_WGPU_Q_REGS=1`: Q held in registers and shuffled within the row instead of Qᵀ in
//!   workgroup memory (head dims up to 128; also with 128 rows and with V staged by keys), or
//!   `=0` none: both the default only for f32 (D=128: V by keys 5% faster, then Q in registers
//!   8-12% more; D=64: both with 4x16 micro-tiles, 3-8% faster, each alone no faster; on the
//!   H100); `ATTN_WGPU_ROWS=16|32|64|128`: only workgroups of that many query
//!   rows (128 exists only with V read straight from its buffer, with Q in registers, or with 16
//!   invocations per row at D=64; f32 D=128 non-causal takes 128 by default, up to 3% faster
//!   on the H100, and f32 D=64 64 with either mask, 2-4% faster causal than 128). 4x16 tiles (but for f32 D=64's default) and 4 invocations per row were timed slower
//!   on the H100 and are picked only by their knobs;
//!   `ATTN_WGPU_INTERLEAVE=1|2|4`: shapes with one row group's lanes together (every shape but
//!   f32's defaults), or f32's measured shapes with two or four row groups' lanes interleaved, so
//!   that neighbouring lanes read the same K and V vec4s (f32's default is two where subgroups
//!   span 16 lanes: 4-7.5% faster than one on the H100);
//!   `ATTN_WGPU_SPLIT_D=1|0`: f32's measured shapes with S = Q·Kᵀ split over the head dim (each
//!   lane its own dims of Q, partial scores added across the row by a reduce-scatter instead of
//!   Q shuffled per dim; K staged by keys), or none (f32's default splits: 7-8% faster
//!   non-causal on the H100);
//!   `ATTN_WGPU_SKIP_UNSEEN=1|0`: those split shapes with a tile's stages that the block does not
//!   see (past its last row's diagonal, or past `seq_k`) not loaded nor multiplied, or every
//!   stage computed and masked (f32 D=128's default skips: with it the driver's code fits 249
//!   registers without spills, 3.1-3.4% faster non-causal on the H100; D=64's does not).
//! - FMA kernel with 8x8 register tiles ([`wide`]): `ATTN_WGPU_WIDE=1` (timed 2.3-2.5x slower
//!   on the H100, so only this knob picks it); the FMA knobs on chunk and rows choose among its
//!   shapes, and the others (key groups, invocations per row, stages, shuffles, V staged by keys
//!   or read from its buffer) leave it none unless set to what it has (2, D/8, 1, 0, 0, 0).
//! - Cooperative-matrix kernel ([`coop`], tensor cores through wgpu's experimental feature):
//!   `ATTN_WGPU_COOP=0|1`: off, or on for any adapter with 16×16×16 f16/f32 matrices (by
//!   default on NVIDIA adapters, where it passed verification); `ATTN_WGPU_COOP_ROWS=16|32|64`
//!   and `ATTN_WGPU_COOP_KEYS=16|32|64`: only its shapes with that many rows or keys (the default,
//!   16 rows and 16-key tiles, was fastest on the H100; 64-key tiles fail verification there
//!   and are never planned otherwise);
//!   `ATTN_WGPU_COOP_MODEL=annotated|glsl450|vulkan`: how its SPIR-V declares the memory model
//!   ([`spirv::MemoryModel`]).
//! - Both: `ATTN_WGPU_CHECKS=all|bounds`: naga's guards back on.
//! - Timing diagnostics only, wrong results: `ATTN_WGPU_ABLATE=qk,exp,shuffle,pv,barrier,load,softmax`
//!   (any of them, separated by `,` or `+`) takes those parts out of the FMA and
//!   cooperative-matrix kernels ([`shader::Ablation`]); the plan says so. `ATTN_WGPU_PAD_SHARED=<bytes>`: the FMA kernels
//!   declare that much more (unused) workgroup memory, to time how workgroup memory limits them
//!   (results unchanged; counted against the adapter's limit at plan time).
//!
//! ## Without an adapter
//! Nothing panics: [`Wgpu`] reports itself unavailable with the reason. Tests that need an
//! adapter print `SKIPPED <test>: <reason>`, unless `ATTN_REQUIRE_WGPU=1` (as `cargo xtask test`
//! sets), where they fail.

mod backend;
pub mod coop;
mod pack;
pub mod plan;
pub mod runtime;
pub mod shader;
pub mod spirv;
pub mod wide;

pub use backend::Wgpu;
pub use plan::{AdapterCaps, Kernel, Variant};
#[cfg(test)]
mod wgsl_dump;
