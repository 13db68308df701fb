//! The Hopper family (sm_90a, H100/H200): `kernels/flash_fwd_sm90.cu`, a warp-specialized
//! FlashAttention forward on wgmma tensor-core products, TMA copies and mbarriers.
//!
//! The backend picks it on devices of compute capability 9.0 for what it supports (f16/bf16,
//! every head dim that is a multiple of 8 up to 256: 64, 128 and 256 by their own kernels, the
//! others by the next one's padded (`Variant::pad`); strides that are multiples of 8 elements), and says in the plan
//! why it fell back to the Ampere/Ada family otherwise. Its settings ([`Settings`], read from the
//! `ATTN_CUDA_SM90_*` knobs in `crate::options`) force tiles, a smaller persistent grid, every
//! tile whole, one or two Q slots, the causal block order or a traced build.
//!
//! - `variant`: one specialisation, its compile-time choices, shared memory and registers, and
//!   the NVRTC request that compiles it.
//! - `plan`: which variant runs a problem (its tiles, the settings applied), the launch, and
//!   the causal tile order's head groups; the variants that ship.
//! - `split`: how the persistent grid deals out the tiles and splits the tail.
//! - `launch`: the kernel's parameter block with its four TMA tensor maps (Q, K, V in; O out),
//!   the buffers it points at, and a traced build's timeline.
//! - `wgmma`: the generated wgmma wrappers (the header `sm90_wgmma.cuh`).

pub(crate) mod launch;
pub(crate) mod plan;
pub(crate) mod split;
pub(crate) mod variant;
pub(crate) mod wgmma;

pub use plan::{Settings, Tiles, tiles};
pub use variant::{L2Promotion, Variant};
