//! The backward pass, in three launches: the `D = rowsum(dO ∘ O)` pre-pass, the main pass with dK
//! and dV in registers and dQ added in f32, dQ's conversion. The pre-pass and the conversion are
//! `kernels/flash_bwd.cu`'s on every architecture; the main pass is
//!
//! - on sm_90, the Hopper family's (`kernels/flash_bwd_sm90.cu`): TMA loads by a producer
//!   warpgroup, two MMA warpgroups on wgmma with P and dS as register operands, dQ handed to two
//!   writer warps that add it by bulk reduce-adds (at D=256 the MMA warpgroups split the columns
//!   and add dQ themselves);
//! - elsewhere, or with `ATTN_CUDA_FAMILY=ampere`, the Ampere/Ada family's (`kernels/flash_bwd.cu`):
//!   FlashAttention-2-class on `mma.sync`, `ldmatrix` and `cp.async`, within L4-class limits.
//!
//! Both share the parameter block, the workspace and the score's gradient
//! (`kernels/flash_bwd_common.cuh`).
//!
//! It runs every problem the forward takes but a paged cache (refused by
//! `Problem::validate_backward`): f16/bf16, head dims that are multiples of 8 up to 256 in the
//! Hopper family and up to 128 in the Ampere/Ada one (a typed refusal past it; 64, 128 and 256 by
//! their own variants, the others padded to the next), strides that are multiples of 8 elements,
//! GQA, every mask, soft-cap, ALiBi, packed sequences and key counts, as run-time parameters of
//! the one kernel per (family, dtype, head dim).
//!
//! - `variant`: one specialisation, its shared memory, launches and NVRTC request.
//! - `launch`: the kernels' parameter block.
//! - `run`: the plan, and the host-copy path's uploads, launches and read-back.
//! - `resident`: the same on the caller's device tensors and stream
//!   ([`crate::Cuda::backward_on_stream`]).

pub(crate) mod launch;
pub(crate) mod resident;
pub(crate) mod run;
pub(crate) mod variant;

pub use resident::DeviceGrads;
pub use run::BackwardTimes;
pub use variant::{DETERMINISTIC_DQ_COPIES, DqAdd, DvIssue, Form, Variant, Walk};
