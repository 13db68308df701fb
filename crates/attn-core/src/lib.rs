//! # attn-core
//!
//! The vocabulary every attn backend shares: the [`Attention`] trait, the [`Problem`] it solves
//! (shape, dtype, strides, parameters), the [`Plan`] it makes before doing any work, the one
//! [`Error`] type, and the online-softmax math ([`softmax`]) that CPU, CUDA and WGSL kernels all
//! implement.
//!
//! Host tensors enter as `ndarray` views in FlashAttention's `[batch, seq, heads, head_dim]`
//! order through [`host`], which turns their shapes and strides into a [`Problem`] and their
//! memory into [`Inputs`]/[`Outputs`] without copying. `ndarray` and `half` are re-exported so
//! that callers use the versions attn was built with.
//!
//! ## Design note: tensors on a device
//! [`Attention`] is the one interface chosen at run time, and it speaks host memory: `prepare`
//! copies the inputs to wherever the backend computes and `read` copies the output back. That
//! is what a benchmark, a CLI or a cross-check between backends needs, and every backend can
//! offer it. Tensors that already live on a device cannot go through it without a round trip,
//! and their types are the device API's own (cudarc buffers and streams, wgpu buffers and
//! encoders), which a backend-neutral trait could only erase into raw pointers. So each GPU
//! backend exposes its device-resident calls as methods of its own type, reachable from the same
//! value the trait is implemented on: `attn_cuda::Cuda::{plan_on, run_on_stream, run_raw}`
//! (cudarc `CudaSlice`/`CudaView` on the caller's `Arc<CudaStream>`, or raw pointers and a
//! `CUstream`) and the wgpu backend's calls on the caller's device, queue, buffers and encoder.
//! They take the same [`Plan`] and [`Problem`] (shape, dtype, strides, parameters) as the trait,
//! run the same kernels and give the same bits. Framework adapters (the candle op in
//! `attn-candle`) sit on those calls.
//!
//! ## Contract
//! For each sequence `b`, query head `h` and query row `i`:
//! `o[b,h,i,:] = Σ_j p_j v[b,g,j,:]`, `p = softmax_j(s_j)` over the keys `j` the [`Mask`] lets row
//! `i` see, with `g = h / (heads_q / heads_kv)` and the score
//! `s_j = cap(scale · q[b,h,i,:]·k[b,g,j,:]) + alibi(b, h, i, j)`: `cap` the optional soft-cap
//! ([`Params::softcap`]), `alibi` the optional linear bias ([`Params::alibi`],
//! [`sequences::alibi_bias`]). A row that sees no key has `o = 0` and `lse = -inf`. Masks align
//! the diagonal bottom-right, on each sequence's own lengths when the batch holds sequences of
//! different lengths ([`sequences`]: packed rows, a paged cache, per-sequence key counts).
//!
//! The backward pass ([`Attention::backward`], [`backward`]) differentiates exactly this function:
//! gradients of q, k and v for every feature but a paged cache.
//!
//! ## Numerical promises
//! Backends accumulate in f32 or wider and round the output once to the input dtype. How close
//! each backend must come to the f64 reference is stated, per dtype, in `attn-verify`.

pub mod attention;
pub mod backward;
pub mod dtype;
pub mod error;
pub mod host;
pub mod knobs;
pub mod kv_cache;
pub mod plan;
pub mod problem;
pub mod rng;
pub mod sequences;
pub mod softmax;
pub mod tensor;

pub use attention::{Attention, Availability, DeviceKind, HostPrepared, Numerics, Prepared};
pub use backward::{BackwardOptions, GradInputs, Gradients};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use knobs::Knob;
pub use kv_cache::{CacheTensor, NewRows, append_kv, append_rows, check_append_layout};
pub use plan::{DeviceLimits, Execution, Launch, Payload, Plan, Tiles};
pub use problem::{Feature, Layout, Mask, Params, Problem, Shape, Strides, TensorStrides};
pub use sequences::{Alibi, Batching, ExtraArray, Extras, KvRows, OwnedExtras, QueryRows, SeqMap};
pub use tensor::{Buffer, Data, DataMut, Inputs, Outputs};

pub use half;
pub use ndarray;
