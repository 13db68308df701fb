//! The backward family (sm_80 to sm_90): `kernels/flash_bwd.cu`, a FlashAttention-2-class
//! backward on `mma.sync`, `ldmatrix` and `cp.async`, in three launches (the `D = rowsum(dO ∘ O)`
//! pre-pass, the main pass with dK and dV in registers and dQ added in f32, dQ's conversion).
//!
//! It runs every problem the forward takes but a paged cache (refused by
//! `Problem::validate_backward`) and head dims over 128 (a typed refusal for now): f16/bf16, head
//! dims that are multiples of 8 up to 128 (64 and 128 by their own variants, the others padded
//! to the next), strides that are multiples of 8 elements, GQA, every mask, soft-cap, ALiBi,
//! packed sequences and key counts, as run-time parameters of the one kernel per (dtype, head
//! dim).
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
pub use variant::Variant;
