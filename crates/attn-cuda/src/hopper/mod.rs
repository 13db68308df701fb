//! The Hopper family (sm_90a, H100/H200): `kernels/flash_fwd_sm90.cu`, a warp-specialized
//! FlashAttention forward on wgmma tensor-core products, TMA copies and mbarriers.
//!
//! The backend picks it on devices of compute capability 9.0 for what it supports (f16/bf16,
//! head dims 64, 128 and 256, strides that are multiples of 8 elements), and says in the plan
//! why it fell back to the Ampere/Ada family otherwise. `ATTN_CUDA_FAMILY=ampere|hopper` forces
//! a family; `ATTN_CUDA_FORM` picks one of the kernel's [`Form`]s (each step of its
//! construction stays compilable, to verify and time them one against another),
//! `ATTN_CUDA_SM90_TILES` other tiles, `ATTN_CUDA_SM90_GRID` a smaller persistent grid and
//! `ATTN_CUDA_SM90_SPLIT=off` every tile whole instead of the split tail ([`plan::Split`]; see
//! `attn_cuda::Cuda::from_env`).
//!
//! - [`plan`]: the variants, their tiles, launch and shared memory, validated before launch.
//! - `launch`: the kernel's parameter block with its four TMA tensor maps (Q, K, V in; O out),
//!   and the causal tile order's head groups.
//! - `wgmma`: the generated wgmma wrappers (the header `sm90_wgmma.cuh`).

pub(crate) mod launch;
pub mod plan;
mod wgmma;

pub use plan::{Form, Variant};

/// The kernel source, compiled at run time for sm_90a.
pub const SOURCE: &str = include_str!("../../kernels/flash_fwd_sm90.cu");
/// The headers it includes, by name: the Hopper primitives and the kernel's parts (the generated
/// `sm90_wgmma.cuh` comes from `wgmma`).
pub const HEADERS: &[(&str, &str)] = &[
    ("sm90.cuh", include_str!("../../kernels/sm90.cuh")),
    ("sm90_trace.cuh", include_str!("../../kernels/sm90_trace.cuh")),
    ("sm90_scheduler.cuh", include_str!("../../kernels/sm90_scheduler.cuh")),
    ("sm90_mainloop.cuh", include_str!("../../kernels/sm90_mainloop.cuh")),
    ("sm90_epilogue.cuh", include_str!("../../kernels/sm90_epilogue.cuh")),
];
