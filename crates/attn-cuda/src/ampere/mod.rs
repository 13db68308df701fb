//! The Ampere/Ada family (sm_80 to sm_90): `kernels/flash_fwd.cu`, a FlashAttention-2-class
//! forward on `mma.sync`, `ldmatrix` and `cp.async`, with swizzled shared memory.
//!
//! It runs every problem the backend takes (f16/bf16; head dims that are multiples of 8 from 8
//! to 256: 32, 64, 96, 128 and 256 by their own variants, the others by a padded variant of the
//! next of these; strides that are multiples of 8 elements), on Hopper too where the Hopper
//! family does not.
//!
//! - `variant`: one specialisation, its tiles, shared memory, launch and NVRTC request.
//! - `plan`: each head dim's ranked tile configurations, the one a device takes, and the
//!   variants that ship.
//! - `launch`: the kernel's parameter block.

pub(crate) mod launch;
pub(crate) mod plan;
pub(crate) mod variant;

pub use variant::{HEADERS, Variant};
