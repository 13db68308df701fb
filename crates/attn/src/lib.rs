//! # attn
//!
//! Exact scaled-dot-product attention (FlashAttention-style: tiled, online softmax, never the
//! S×S matrix) on several backends behind one trait, [`Attention`]. Depend on this crate; pick a
//! backend at run time with [`Backend::auto`] or by name with [`Backend::by_name`].
//!
//! ```
//! use attn::{Backend, Buffer, DType, Inputs, Outputs, Problem, Shape};
//!
//! let problem = Problem::new(Shape::new(1, 4, 256, 64), DType::F32).causal();
//! let [q, k, v, o] = problem.required_lens().map(|(_, n)| n);
//! let (q, k, v) = (Buffer::from_f32(DType::F32, (0..q).map(|i| (i % 7) as f32 * 0.1)),
//!                  Buffer::from_f32(DType::F32, (0..k).map(|i| (i % 5) as f32 * 0.1)),
//!                  Buffer::from_f32(DType::F32, (0..v).map(|i| (i % 3) as f32)));
//! let mut out = Buffer::zeros(DType::F32, o);
//!
//! let backend = Backend::auto(&problem)?;
//! backend.forward(&problem, Inputs { q: q.as_data(), k: k.as_data(), v: v.as_data() },
//!                 Outputs { o: out.as_data_mut(), lse: None })?;
//! # Ok::<(), attn::Error>(())
//! ```

mod backend;
pub mod knobs;
pub mod measure;
pub mod npy;

pub use attn_core::*;
pub use backend::{Backend, Choice, Ranking};
