//! # attn-wgpu
//!
//! The portable GPU backend: a FlashAttention forward written in WGSL and run through `wgpu` on
//! whatever adapter the machine has (Vulkan, Metal, DX12), down to Mesa's lavapipe on a CPU.
//!
//! ## Contract
//! [`Wgpu`] implements [`attn_core::Attention`] for f32, f16 (where the adapter has
//! `SHADER_F16`) and bf16 (widened to f32 on upload, exactly; the output is rounded once back to
//! bf16), any sequence lengths, bottom-right causal masks, sliding windows, soft-capping and ALiBi
//! (slopes per head or per batch and head), packed (varlen) queries and keys, a paged KV cache
//! and per-sequence key counts, grouped-query attention and head dims up to 256 (padded with
//! zeros to a multiple of 32). Windows, soft-caps, ALiBi and sequences of their own lengths run on
//! the FMA kernel only (f16 then without cooperative matrices); a block walks only the key tiles
//! its rows' windows reach. Packed and paged sequences are gathered into the kernel's layout,
//! each padded to the longest, and the kernel reads each sequence's lengths: on the host for the
//! host path, on the GPU from the caller's index arrays for the device-resident path, which takes
//! those and ALiBi's slopes as buffers of the caller's. Inputs of any strides are packed
//! on the host into contiguous BHSD buffers when prepared; the output is written back into the
//! caller's view.
//!
//! ## Two paths: host slices, or the caller's device and buffers
//! The [`Attention`](attn_core::Attention) trait is the host path: `prepare` packs host slices
//! and uploads them, `run` dispatches, `read` downloads. For tensors that already live on a GPU
//! (a renderer's buffers, an ML runtime's), [`resident`] is the device-resident path:
//! [`Wgpu::from_device`] builds the backend on the caller's `wgpu::Device` and `wgpu::Queue`
//! (it then never opens its own), and [`Wgpu::record`] records a call on the caller's
//! `wgpu::Buffer`s (q, k, v in the problem's dtype and strides; o and the LSE written in place)
//! into the caller's command encoder, or [`Wgpu::submit`] submits it on the queue. Both paths
//! take plans from [`Attention::plan`](attn_core::Attention::plan) and give the same bits; the
//! device-resident one is a method of [`Wgpu`] rather than part of the trait because its
//! arguments (a `wgpu` encoder and buffers) are this backend's own types. Its layout changes are
//! small compute passes on the GPU (pack before the kernel, unpack after), its scratch buffers
//! are cached and reused; [`resident`] says what is checked and what the caller guarantees.
//! [`OnDevice`] puts the device-resident path behind the trait (`wgpu-resident`, for `attn
//! verify --resident`).
//!
//! ## Numerical promises
//! Scores, probabilities, row statistics and the P·V accumulation are f32 for every dtype
//! ([`attn_core::Numerics::F32Accumulate`]); the scale is folded with log2(e) into Q so that the
//! softmax uses exp2. Rows that see no key give 0 and an LSE of -inf, never NaN.
//!
//! ## Shape of the work
//! `plan` picks the tiles from the adapter's limits (workgroup memory, invocations, binding
//! sizes) and refuses with a typed error what cannot run; `fma` generates the WGSL of each
//! specialisation from `kernels/flash.wgsl`, `coop` the cooperative-matrix kernel's from
//! `kernels/flash_coop.wgsl` (both on the pieces of `wgsl`, `shader` picks between them);
//! `runtime` opens the adapter with its real limits, and compiles each pipeline once per
//! process, when a plan is first prepared (planning does no device work). Where the adapter has `SUBGROUP` (subgroups of 8 or more), row
//! reductions and the hand-over of probabilities from the invocation that computed them to its
//! row's others use subgroup shuffles, otherwise workgroup memory; f32's measured shapes (D=64,
//! D=128) also hold Q in registers, stage V by keys and split S = Q·Kᵀ over the head dim. Kernel
//! time comes from timestamp queries where the adapter has `TIMESTAMP_QUERY`. K and V pass
//! through registers on their way to workgroup memory, so that each chunk's global loads overlap
//! the previous chunk's arithmetic. Shaders are compiled without naga's run-time index clamps
//! and loop caps ([`options::Checks`] says why that is sound and what it bought).
//!
//! ## Knobs (environment)
//! [`options::KNOBS`] lists every `ATTN_*` variable the crate reads, and [`Options::from_env`]
//! parses them once (an invalid value is an error naming the variable): subgroups off (to verify
//! the workgroup-memory path), tile pins for timing shapes on a new GPU, a cap on workgroup
//! memory (to verify what small adapters get), cooperative matrices on or off, and naga's
//! run-time checks. `docs/tuning.md` has the table; alternatives measured and rejected are in
//! `docs/experiments.md`.
//!
//! ## Without an adapter
//! Nothing panics: [`Wgpu`] reports itself unavailable with the reason. Tests that need an
//! adapter print `SKIPPED <test>: <reason>`, unless `ATTN_REQUIRE_WGPU=1` (as `cargo xtask test`
//! sets), where they fail.

mod backend;
mod backward;
mod coop;
mod dispatch;
mod fma;
pub mod inspect;
mod on_device;
pub mod options;
mod pack;
mod plan;
mod repack;
pub mod resident;
mod runtime;
mod shader;
mod spirv;
mod wgsl;

pub use backend::Wgpu;
pub use on_device::OnDevice;
pub use options::{KNOBS, Options};
pub use plan::AdapterCaps;
pub use resident::{DeviceInputs, DeviceOutputs, DeviceSequences, DeviceTensor};

#[cfg(test)]
mod wgsl_dump;
