//! # attn
//!
//! Exact scaled-dot-product attention (FlashAttention-style: tiled, online softmax, never the
//! S×S matrix) on several backends behind one trait, [`Attention`]. Depend on this crate; pick a
//! backend at run time with [`Backend::auto`] or by name with [`Backend::by_name`].
//!
//! Host tensors are [`ndarray`] views in FlashAttention's order, `[batch, seq, heads, head_dim]`,
//! with any non-negative strides whose `head_dim` axis is contiguous (a BHSD array through
//! `.permuted_axes([0, 2, 1, 3])`, a slice of a larger array): the CPU backends read and write
//! them in place, the GPU backends copy them to the device and back; nothing is packed or
//! transposed on the host.
//!
//! ```
//! use attn::ndarray::Array4;
//! use attn::{Backend, Mask, Params, host};
//!
//! // [batch, seq, heads, head_dim]: 4 query heads sharing 2 key/value heads.
//! let q = Array4::from_shape_fn((1, 256, 4, 64), |(_, s, h, d)| ((s + h * d) % 7) as f32 * 0.1);
//! let k = Array4::from_shape_fn((1, 256, 2, 64), |(_, s, h, d)| ((s * h + d) % 5) as f32 * 0.1);
//! let v = Array4::from_shape_fn((1, 256, 2, 64), |(_, s, _, d)| ((s + d) % 3) as f32);
//! let params = Params { mask: Mask::Causal, ..Params::default() };
//!
//! // The best backend here, or ATTN_BACKEND's:
//! let (o, _lse) = attn::attention(q.view(), k.view(), v.view(), &params)?;
//!
//! // Or a backend chosen once, for many calls: the problem says what the views are.
//! let problem = host::problem(&q.view(), &k.view(), &v.view(), None, &params)?;
//! let backend = Backend::auto(&problem)?;
//! let (again, _) = host::attention(&*backend, q.view(), k.view(), v.view(), &params)?;
//! assert_eq!(o, again);
//! # Ok::<(), attn::Error>(())
//! ```
//!
//! Underneath is the slice-based path, [`Problem`] (shape, dtype, parameters, strides) with
//! [`Inputs`] and [`Outputs`] handed to [`Attention::forward`]: the ndarray route builds exactly
//! that. It stays public because it is the layer every backend implements, what the GPU backends'
//! host-copy path and the `attn` command use, and the way to describe memory not held as an
//! ndarray (a raw buffer with strides, `Layout::Bhsd`/`Layout::Bshd`).

mod backend;
pub mod knobs;
pub mod measure;
pub mod npy;
mod views;

pub use attn_core::*;
pub use backend::{Backend, Choice, Ranking};
pub use views::{attention, attention_into};
