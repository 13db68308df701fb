//! # attn-cpu
//!
//! Two CPU backends of the [`attn_core::Attention`] trait:
//!
//! - [`Reference`]: the exact one. f64 scores and accumulation, two-pass softmax, one query row
//!   at a time. The ground truth for every other backend; slow by design.
//! - [`Flash`]: the fast one. Tiled FlashAttention with an online softmax, f32 accumulation,
//!   parallel over (batch, head, query block) with rayon, reading f16/bf16 directly and
//!   vectorised for the CPU it runs on. O(threads · tile) extra memory.
//!
//! ## Numerical promises
//! `Reference` rounds only once, when writing the output dtype. `Flash` rounds the pre-scaled
//! query and every product in f32 and uses an exp with ~2e-7 relative error, so its f32 output
//! is within about 1e-6 relative L2 of `Reference` for ordinary inputs; for f16/bf16 the output
//! rounding (2^-11, 2^-8 relative) dominates.

mod flash;
mod options;
mod reference;

pub use flash::{CpuElement, Flash, Isa};
pub use options::{KNOBS, Options};
pub use reference::{RefGrads, RefRow, Reference};
