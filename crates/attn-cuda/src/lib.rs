//! # attn-cuda
//!
//! The CUDA backend's plumbing: finding and loading CUDA at run time, compiling kernels with
//! NVRTC, and running them through the driver API.
//!
//! Three kernel families run behind the one backend ([`Cuda`]): for decode (a GQA group of at
//! most 64 query rows) `kernels/decode.cu` ([`decode`], split-KV, every architecture); else
//! `kernels/flash_fwd.cu` for Ampere/Ada ([`ampere`]), and on Hopper (sm_90a)
//! `kernels/flash_fwd_sm90.cu` ([`hopper`]), chosen where it applies; the plan says which ran and
//! why. The backward pass has its own kernels ([`backward`]: wgmma on Hopper,
//! `kernels/flash_bwd_sm90.cu`; mma.sync elsewhere, `kernels/flash_bwd.cu`), on the host-copy path
//! and on a caller's stream ([`Cuda::backward_on_stream`]).
//! Each family is one module that owns its variants, its plan and its launch; the backend
//! chooses a family and dispatches to it. Below them: compiling ([`compile()`]), finding CUDA (`locate`,
//! [`probe()`]), ptxas's report ([`KernelResources`]), the device ([`Gpu`]) and the tensors on it.
//! Every `ATTN_*` variable the crate reads is in [`options`] ([`KNOBS`], parsed into [`Options`]).
//!
//! Two ways in: the [`Attention`](attn_core::Attention) trait's host-copy path (`plan`,
//! `prepare` uploads, `run`, `read` downloads), and the device-resident calls of [`device`]:
//! [`Cuda::plan_on`] and [`Cuda::run_on_stream`] on the caller's cudarc buffers and stream
//! (candle's, or any cudarc user's), and the unsafe raw entry [`Cuda::run_raw`] (device
//! addresses and a `CUstream`) for other frameworks. They are methods of [`Cuda`] rather than of
//! the trait because their argument types are cudarc's (see attn-core's design note); both paths
//! run the same plan and kernel, bit for bit, and one [`Cuda`] serves any number of threads,
//! streams and devices.
//!
//! Sequences of their own lengths (packed queries and keys, a paged cache, `seqused_k`) and
//! ALiBi run through the host-copy path, which uploads their index arrays and slopes
//! (`attn_core::Extras`) with the inputs, and through the device-resident calls, which take them
//! as the caller's device memory ([`DeviceArrays`], [`ExtraPointers`]), checked for presence,
//! length, context and alignment but not for contents, which every kernel that reads them clamps
//! into the problem's bounds ([`indices`]). Packed sequences, key counts, paged caches and ALiBi
//! run on both prefill families (the Hopper family loads a paged key tile by TMA a box of rows
//! per page), and the decode family takes dense and paged caches. A decode step's new keys and values
//! are appended to a cache in device memory by [`Cuda::append_rows_on_stream`] ([`append`]).
//!
//! Nothing CUDA is needed to build this crate, and nothing panics where CUDA is missing: cudarc
//! loads `libcuda` and `libnvrtc` dynamically, and [`probe()`] / [`nvrtc_available`] open both
//! first and say what is missing and how to get it. Kernels are CUDA C++ in `kernels/`, compiled
//! per specialisation and per architecture into CUBINs ([`compile()`]) whose ptxas resource
//! report (registers, spills, shared memory) is parsed ([`KernelResources`]) so that plans and
//! tests can check it. [`Gpu`] holds a device's context and stream, loads kernels once, sets
//! their shared-memory opt-in and times launches with CUDA events.
//!
//! ## Where CUDA is looked for
//! - The driver, `libcuda.so.1`: the loader's search path only (it comes with the GPU driver).
//! - NVRTC, `libnvrtc.so.13`: `ATTN_NVRTC_LIB` (a file or directory; if set, nothing else), the
//!   loader's search path, `/usr/local/cuda/lib64`, and the `nvidia-cuda-nvrtc` wheel under
//!   Python's `site-packages/nvidia/cu13/lib`. Wherever it is found it is loaded by path before
//!   cudarc asks for it by name, and [`nvrtc_available`] checks that cudarc got the same library.
//! - Headers (`cuda_fp16.h`): `ATTN_CUDA_INCLUDE`, `/usr/local/cuda/include`, and the
//!   `nvidia-cuda-runtime` wheel's `site-packages/nvidia/cu13/include`.
//!
//! Tests that need NVRTC print `SKIPPED <test>: <reason>` without it, unless
//! `ATTN_REQUIRE_NVRTC=1` (as `cargo xtask test` sets), where they fail.

pub mod ampere;
pub mod append;
mod backend;
pub mod backward;
mod compile;
pub mod decode;
pub mod device;
pub mod hopper;
pub mod indices;
mod locate;
pub mod options;
mod probe;
mod ptxas;
mod runtime;
pub mod scores;
mod tensors;

pub use append::AppendArrays;
pub use backend::Cuda;
pub use compile::{Arch, CompileError, CompileRequest, Compiled, compile, compile_cached};
pub use device::{DeviceElement, OnStream};
pub use indices::DeviceArrays;
pub use options::{Family, KNOBS, Options};
pub use probe::{DeviceInfo, NvrtcInfo, driver_available, nvrtc_available, nvrtc_info, probe, probe_ordinal};
pub use ptxas::KernelResources;
pub use runtime::{FunctionAttributes, Gpu, Kernel, Lead, MemoryUse, driver};
pub use tensors::{DevicePointers, ExtraPointers};
