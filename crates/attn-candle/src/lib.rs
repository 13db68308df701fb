//! # attn-candle
//!
//! attn's attention as candle custom ops, with candle-flash-attn's call:
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! # fn main() -> candle_core::Result<()> {
//! // [batch, seq, heads, head_dim]: 8 query heads over 2 key/value heads (GQA).
//! let q = Tensor::randn(0f32, 1.0, (1, 128, 8, 64), &Device::Cpu)?;
//! let k = Tensor::randn(0f32, 1.0, (1, 128, 2, 64), &Device::Cpu)?;
//! let v = Tensor::randn(0f32, 1.0, (1, 128, 2, 64), &Device::Cpu)?;
//! let o = attn_candle::flash_attn(&q, &k, &v, 0.125, true)?;
//! assert_eq!(o.dims(), &[1, 128, 8, 64]);
//! let (o2, lse) = attn_candle::flash_attn_with_lse(&q, &k, &v, 0.125, true)?;
//! assert_eq!(lse.dims(), &[1, 8, 128]);
//! # let _ = o2; Ok(()) }
//! ```
//!
//! - Tensors in FlashAttention's order `[batch, seq, heads, head_dim]`, any strides whose last
//!   axis is contiguous (views, narrowed or transposed tensors run in place, without a copy);
//!   GQA and MQA by head counts (the query heads a multiple of the key/value heads); the causal
//!   mask aligned bottom-right when `seq_q != seq_k` (FlashAttention 2's convention since 2.1).
//! - On CPU: attn's `cpu-flash` (f32, f16, bf16). On CUDA (the `cuda` feature): attn's kernels
//!   (f16, bf16) on candle's own stream and memory, through `attn_cuda`'s device-resident calls:
//!   no copy, no synchronization; the output is allocated by candle's device as any op's is.
//! - Switching from candle-flash-attn is a one-line change: `flash_attn(q, k, v, softmax_scale,
//!   causal)` has its signature. What differs: f32 runs (on CPU), the LSE is available
//!   ([`flash_attn_with_lse`]); windows ([`flash_attn_windowed`]), soft-caps, ALiBi
//!   ([`flash_attn_alibi`], [`flash_attn_alibi_windowed_softcap`]), packed variable-length
//!   batches ([`flash_attn_varlen`]) and decoding against a dense or paged cache
//!   ([`flash_attn_with_kvcache`], appending new keys and values into the cache in place) run
//!   on CPU and CUDA tensors.
//! - **Training**: every op but the cache's has a backward pass, from the LSE its forward kept:
//!   attn's cpu-flash backward on CPU tensors, attn's CUDA backward on candle's stream and memory
//!   on CUDA tensors (f16, bf16, head dims up to 256 on sm_90, 128 elsewhere); a graph of `Var`s
//!   trains through it (`examples/train.rs`).
//! - Index tensors (offsets, key counts, block tables: u32 or i32; ALiBi slopes: f32) go where
//!   q is: on CUDA the kernels read them in place on candle's stream, with no copy and no
//!   synchronization. An index tensor on another device than q is copied there first (a small
//!   upload, `Tensor::to_device`; keep them on q's device to avoid it). On CUDA their contents
//!   are not checked (that would need a copy back): the kernels clamp every index into the
//!   problem's bounds, so bad contents give wrong rows, never a bad memory access; on CPU they
//!   are checked and a bad one is an error.
//!
//! Errors (shapes that do not match, a head dim or dtype a backend does not take) are candle
//! errors wrapping attn's typed error, with its message.

use attn_core::{DType as AttnDType, Mask, Problem, Shape as AttnShape, Strides, TensorStrides};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Shape, Tensor};
use std::sync::{Arc, Mutex};

mod backward;
#[cfg(feature = "cuda")]
mod cuda;
mod kvcache;

pub use kvcache::flash_attn_with_kvcache;

/// `softmax(softmax_scale · q kᵀ + mask) v` for `[batch, seq, heads, head_dim]` tensors, with a
/// bottom-right causal mask when `causal`; returns `[batch, seq_q, heads_q, head_dim]`, contiguous.
pub fn flash_attn(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> candle_core::Result<Tensor> {
    let op = AttnOp::new(softmax_scale, causal, false);
    q.apply_op3(k, v, op)
}

/// [`flash_attn`] with a sliding window (candle-flash-attn's `flash_attn_windowed`): row `i`
/// sees the keys from `window_size_left` before its bottom-right diagonal to
/// `window_size_right` after it, `None` unbounded (`(None, Some(0))` is causal). Runs on CPU
/// and CUDA tensors.
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> candle_core::Result<Tensor> {
    let mut op = AttnOp::new(softmax_scale, false, false);
    op.window = Some((window_size_left, window_size_right));
    q.apply_op3(k, v, op)
}

/// [`flash_attn`] and the log-sum-exp of each row's scaled scores (natural log, f32,
/// `[batch, heads_q, seq_q]`; `-inf` for a row that sees no key), from the same kernel call.
pub fn flash_attn_with_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> candle_core::Result<(Tensor, Tensor)> {
    let op = AttnOp::new(softmax_scale, causal, true);
    let slot = op.lse.clone();
    let o = q.apply_op3(k, v, op)?;
    // The LSE the kernel wrote, handed over as a tensor of its own (a custom op has one output).
    // It carries no gradient: the backward pass differentiates `o`.
    let lse = o.apply_op1_no_bwd(&TakeLse(slot))?;
    Ok((o, lse))
}

/// [`flash_attn`] with ALiBi (candle-flash-attn's `flash_attn_alibi`): `alibi_slopes` is an f32
/// tensor of `[heads_q]` or `[batch, heads_q]` slopes (other float dtypes are converted), and
/// each scaled score gains `-slope · |i + seq_k - seq_q - j|`. Runs on CPU and CUDA tensors.
pub fn flash_attn_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> candle_core::Result<Tensor> {
    let mut op = AttnOp::new(softmax_scale, causal, false);
    op.alibi = Some(slopes(alibi_slopes, q)?);
    q.apply_op3(k, v, op)
}

/// Everything at once (candle-flash-attn's `flash_attn_alibi_windowed_softcap` shape): optional
/// ALiBi slopes, a window (`None` bounds unbounded; `(None, Some(0))` is causal) and a soft-cap of
/// the scaled scores, `cap · tanh(s / cap)`. Runs on CPU and CUDA tensors.
pub fn flash_attn_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
) -> candle_core::Result<Tensor> {
    let mut op = AttnOp::new(softmax_scale, false, false);
    op.window = Some((window_size_left, window_size_right));
    op.softcap = softcap;
    op.alibi = alibi_slopes.map(|t| slopes(t, q)).transpose()?;
    q.apply_op3(k, v, op)
}

/// Variable-length batches (candle-flash-attn's `flash_attn_varlen`): `q` is `[total_q,
/// heads_q, head_dim]` and `k`, `v` are `[total_k, heads_kv, head_dim]`, the sequences packed
/// back to back; `seqlens_q`/`seqlens_k` are u32 (or i32) tensors of `batch + 1` cumulative
/// offsets from 0, on q's device; `max_seqlen_q`/`max_seqlen_k` bound each sequence's length.
/// Each sequence's causal diagonal aligns bottom-right on its own lengths. Returns `[total_q,
/// heads_q, head_dim]`. Runs on CPU and CUDA tensors.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> candle_core::Result<Tensor> {
    let mut op = AttnOp::new(softmax_scale, causal, false);
    op.varlen = Some(Varlen {
        cu_q: Index::new(seqlens_q, q, "seqlens_q")?,
        cu_k: Index::new(seqlens_k, q, "seqlens_k")?,
        max_q: max_seqlen_q,
        max_k: max_seqlen_k,
    });
    q.apply_op3(k, v, op)
}

/// ALiBi slopes as a flat, contiguous f32 tensor on q's device (`[heads]` or `[batch, heads]`).
fn slopes(t: &Tensor, q: &Tensor) -> candle_core::Result<Tensor> {
    t.to_device(q.device())?.to_dtype(DType::F32)?.flatten_all()?.contiguous()
}

/// An index tensor (offsets, key counts, a block table) as the op keeps it: flat, contiguous,
/// u32 or i32 (other integer dtypes converted to i32 on the host), on q's device.
#[derive(Clone)]
pub(crate) struct Index {
    pub(crate) tensor: Tensor,
    pub(crate) name: &'static str,
}

impl Index {
    /// `t` for a call on `q`.
    pub(crate) fn new(t: &Tensor, q: &Tensor, name: &'static str) -> candle_core::Result<Self> {
        let t = match t.dtype() {
            DType::U32 | DType::I32 => t.clone(),
            _ => Tensor::new(Self::host_of(t, name)?, &candle_core::Device::Cpu)?,
        };
        let tensor = t.to_device(q.device())?.flatten_all()?.contiguous()?;
        Ok(Index { tensor, name })
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.tensor.elem_count()
    }

    /// The values on the host, checked to fit i32 (a copy: the CPU path's, which checks them).
    pub(crate) fn host(&self) -> candle_core::Result<Vec<i32>> {
        Self::host_of(&self.tensor, self.name)
    }

    fn host_of(t: &Tensor, name: &str) -> candle_core::Result<Vec<i32>> {
        let wide: Vec<i64> = match t.dtype() {
            DType::I32 => return t.flatten_all()?.to_vec1::<i32>(),
            DType::U32 => t.flatten_all()?.to_vec1::<u32>()?.into_iter().map(i64::from).collect(),
            DType::U8 | DType::I64 | DType::I16 => t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?,
            other => {
                return Err(candle_core::Error::Msg(format!(
                    "attn: {name} holds {other:?}; index tensors are u32 or i32 (u8, i16, i64 converted)"
                )));
            }
        };
        wide.into_iter()
            .map(|x| {
                i32::try_from(x)
                    .map_err(|_| candle_core::Error::Msg(format!("attn: {name} holds {x}, past i32")))
            })
            .collect()
    }
}

/// Packed sequences: their offsets (from 0) and longest lengths.
struct Varlen {
    cu_q: Index,
    cu_k: Index,
    max_q: usize,
    max_k: usize,
}

/// The custom op: one attention call.
struct AttnOp {
    scale: f32,
    causal: bool,
    /// A sliding window (left, right), instead of `causal`.
    window: Option<(Option<usize>, Option<usize>)>,
    /// A soft-cap of the scaled scores.
    softcap: Option<f32>,
    /// ALiBi slopes, `[heads_q]` or `[batch, heads_q]`, f32 on q's device.
    alibi: Option<Tensor>,
    /// Packed sequences instead of a dense batch.
    varlen: Option<Varlen>,
    /// Keys from a cache that each sequence fills partly, dense or paged.
    cache: Option<kvcache::CacheIndex>,
    /// Whether to compute the LSE, and where the call leaves it for [`TakeLse`].
    with_lse: bool,
    lse: Arc<Mutex<Option<Lse>>>,
    /// The LSE of the CPU forward, kept for the backward pass (which recomputes P from it).
    saved_lse: Mutex<Option<Vec<f32>>>,
    /// The same of the CUDA forward, on the device.
    #[cfg(feature = "cuda")]
    saved_cuda_lse: Mutex<Option<candle_core::CudaStorage>>,
}

/// An LSE the op computed, on the device the call ran on.
enum Lse {
    Cpu(Vec<f32>, Shape),
    #[cfg(feature = "cuda")]
    Cuda(candle_core::CudaStorage, Shape),
}

impl AttnOp {
    fn new(scale: f32, causal: bool, with_lse: bool) -> Self {
        AttnOp {
            scale,
            causal,
            window: None,
            softcap: None,
            alibi: None,
            varlen: None,
            cache: None,
            with_lse,
            lse: Arc::new(Mutex::new(None)),
            saved_lse: Mutex::new(None),
            #[cfg(feature = "cuda")]
            saved_cuda_lse: Mutex::new(None),
        }
    }

    /// The attn problem of these tensors: shapes and strides from the layouts (in candle's
    /// `[batch, seq, heads, head_dim]` order, the last axis contiguous), the output contiguous
    /// in the same order.
    fn problem(&self, dtype: DType, l: [&Layout; 3]) -> candle_core::Result<Problem> {
        let msg = |m: String| candle_core::Error::Msg(m);
        // Packed tensors are `[total, heads, head_dim]`: one "batch" of `total` rows.
        let rank = if self.varlen.is_some() { 3 } else { 4 };
        let what = if rank == 3 { "[total, heads, head_dim]" } else { "[batch, seq, heads, head_dim]" };
        let dims = |l: &Layout, name: &str| -> candle_core::Result<[usize; 4]> {
            let d = l.dims();
            match (rank, d) {
                (4, &[b, s, h, x]) => Ok([b, s, h, x]),
                (3, &[s, h, x]) => Ok([1, s, h, x]),
                _ => Err(msg(format!("attn: {name} must be {what}, got shape {d:?}"))),
            }
        };
        let [b, sq, hq, d] = dims(l[0], "q")?;
        let [bk, sk, hk, dk] = dims(l[1], "k")?;
        if l[2].dims() != l[1].dims() {
            return Err(msg(format!("attn: v's shape {:?} differs from k's {:?}", l[2].dims(), l[1].dims())));
        }
        // A paged cache's first axis counts pages, not sequences.
        let paged = self.cache.as_ref().is_some_and(|c| c.table.is_some());
        if (bk != b && !paged) || dk != d {
            return Err(msg(format!(
                "attn: k is {:?} but q is {:?}: batch and head_dim must agree",
                l[1].dims(),
                l[0].dims()
            )));
        }
        let strides = |l: &Layout, name: &str| -> candle_core::Result<Strides> {
            let st = l.stride();
            let st = if rank == 3 { [0, st[0], st[1], st[2]] } else { [st[0], st[1], st[2], st[3]] };
            if st[3] != 1 {
                return Err(msg(format!(
                    "attn: {name}'s head_dim axis has stride {} (strides {:?}); it must be contiguous (1)",
                    st[3],
                    l.stride()
                )));
            }
            Ok(Strides { batch: st[0], head: st[2], seq: st[1] })
        };
        let dtype = match dtype {
            DType::F32 => AttnDType::F32,
            DType::F16 => AttnDType::F16,
            DType::BF16 => AttnDType::Bf16,
            other => return Err(msg(format!("attn: dtype {other:?} (f32, f16 and bf16 run)"))),
        };
        let mut shape = AttnShape { batch: b, heads_q: hq, heads_kv: hk, seq_q: sq, seq_k: sk, head_dim: d };
        let o = attn_core::Layout::Bshd.strides(hq, sq, d);
        let tensor_strides =
            TensorStrides { q: strides(l[0], "q")?, k: strides(l[1], "k")?, v: strides(l[2], "v")?, o };
        let mut batching = attn_core::Batching::default();
        if let Some(cache) = &self.cache {
            batching.keys_used = true;
            if let Some((_, pages_per_seq)) = &cache.table {
                // k is [pages, page_size, heads_kv, head_dim].
                batching.kv =
                    attn_core::KvRows::Paged { page_size: sk, pages: bk, pages_per_seq: *pages_per_seq };
                shape.seq_k = pages_per_seq * sk;
            }
        }
        if let Some(varlen) = &self.varlen {
            // FlashAttention's max_seqlen takes any bound at least the longest sequence; no
            // sequence is longer than all the rows, the most attn_core's packed batches take.
            shape = AttnShape {
                batch: varlen.cu_q.len().saturating_sub(1),
                seq_q: varlen.max_q.min(sq),
                seq_k: varlen.max_k.min(sk),
                ..shape
            };
            batching.q = attn_core::QueryRows::Packed { total: sq };
            batching.kv = attn_core::KvRows::Packed { total: sk };
        }
        let mut problem = Problem::new(shape, dtype)
            .with_strides(tensor_strides)
            .with_batching(batching)
            .with_scale(self.scale)
            .with_lse(self.with_lse);
        if self.causal {
            problem = problem.with_mask(Mask::Causal);
        }
        if let Some((left, right)) = self.window {
            problem = problem.with_window(left, right);
        }
        if let Some(cap) = self.softcap {
            problem = problem.with_softcap(cap);
        }
        if let Some(slopes) = &self.alibi {
            let per_batch = slopes.elem_count() != hq;
            problem = problem.with_alibi(if per_batch {
                attn_core::Alibi::PerBatchHead
            } else {
                attn_core::Alibi::PerHead
            });
        }
        problem.validate().map_err(candle_core::Error::wrap)?;
        Ok(problem)
    }

    /// The index tensors and slopes the call carries, in `attn_core::Extras`' order: cu_seqlens_q,
    /// cu_seqlens_k, seqused_k, block_table (each where the call has it), and the slopes.
    fn index_tensors(&self) -> ([Option<&Index>; 4], Option<&Tensor>) {
        let cache = self.cache.as_ref();
        (
            [
                self.varlen.as_ref().map(|v| &v.cu_q),
                self.varlen.as_ref().map(|v| &v.cu_k),
                cache.map(|c| &c.seqused),
                cache.and_then(|c| c.table.as_ref()).map(|(t, _)| t),
            ],
            self.alibi.as_ref(),
        )
    }

    /// The indices and slopes as host copies (the CPU path; small arrays).
    fn host_extras(&self) -> candle_core::Result<attn_core::OwnedExtras> {
        let ([q, k, used, table], slopes) = self.index_tensors();
        let host = |i: Option<&Index>| i.map(Index::host).transpose();
        Ok(attn_core::OwnedExtras {
            cu_seqlens_q: host(q)?,
            cu_seqlens_k: host(k)?,
            seqused_k: host(used)?,
            block_table: host(table)?,
            alibi_slopes: slopes.map(|s| s.to_vec1::<f32>()).transpose()?,
        })
    }

    /// The output's shape, `[batch, seq_q, heads_q, head_dim]`, and the LSE's, `[batch,
    /// heads_q, seq_q]`; for packed queries `[total, heads_q, head_dim]` and `[heads_q, total]`.
    fn shapes(p: &Problem) -> (Shape, Shape) {
        let s = p.shape;
        match p.batching.q {
            attn_core::QueryRows::Packed { total } => {
                (Shape::from((total, s.heads_q, s.head_dim)), Shape::from((s.heads_q, total)))
            }
            attn_core::QueryRows::Dense => (
                Shape::from((s.batch, s.seq_q, s.heads_q, s.head_dim)),
                Shape::from((s.batch, s.heads_q, s.seq_q)),
            ),
        }
    }
}

#[cfg(feature = "cuda")]
impl AttnOp {
    /// The backward pass on CUDA tensors `[q, k, v, o, d_o]`, on candle's stream, from the LSE
    /// the CUDA forward kept.
    fn cuda_bwd(&self, t: [&Tensor; 5]) -> candle_core::Result<[Tensor; 3]> {
        let saved = self.saved_cuda_lse.lock().unwrap_or_else(|e| e.into_inner());
        let lse = saved.as_ref().ok_or_else(|| {
            candle_core::Error::Msg("attn: backward before the op's CUDA forward ran".into())
        })?;
        let [q, k, v, o, d_o] = t.map(Tensor::contiguous);
        let (q, k, v, o, d_o) = (q?, k?, v?, o?, d_o?);
        let problem = self.problem(q.dtype(), [q.layout(), k.layout(), v.layout()])?.with_lse(true);
        cuda::backward(&problem, [&q, &k, &v, &o, &d_o], lse, self.index_tensors())
    }
}

/// The CPU backend the ops share.
fn cpu_flash() -> &'static attn_cpu::Flash {
    static FLASH: std::sync::OnceLock<attn_cpu::Flash> = std::sync::OnceLock::new();
    FLASH.get_or_init(attn_cpu::Flash::new)
}

/// `x` from element `offset` on: the view's storage as its layout addresses it.
fn from<T>(x: &[T], offset: usize) -> candle_core::Result<&[T]> {
    x.get(offset..).ok_or_else(|| candle_core::Error::Msg("attn: a layout starts past its storage".into()))
}

impl candle_core::CustomOp3 for AttnOp {
    fn name(&self) -> &'static str {
        "attn-flash"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        use attn_core::{Attention, Data, DataMut, Inputs, Outputs};
        // The LSE is written on every call: the backward pass needs it, and it costs one f32 a row.
        let problem = self.problem(s1.dtype(), [l1, l2, l3])?.with_lse(true);
        let extras = self.host_extras()?;
        problem.check_extras(&extras.borrow()).map_err(candle_core::Error::wrap)?;
        if s2.dtype() != s1.dtype() || s3.dtype() != s1.dtype() {
            return Err(candle_core::Error::Msg(format!(
                "attn: q, k and v must share a dtype, got {:?}, {:?}, {:?}",
                s1.dtype(),
                s2.dtype(),
                s3.dtype()
            )));
        }
        let offsets = [l1.start_offset(), l2.start_offset(), l3.start_offset()];
        let o_len = problem.required_lens()[3].1;
        let mut lse = vec![0f32; problem.lse_len()];
        let run = |inputs: Inputs<'_>, o: DataMut<'_>, lse: &mut [f32]| -> candle_core::Result<()> {
            cpu_flash()
                .forward(&problem, inputs.with_extras(extras.borrow()), Outputs { o, lse: Some(lse) })
                .map(|_| ())
                .map_err(candle_core::Error::wrap)
        };
        let o = match (s1, s2, s3) {
            (CpuStorage::F32(q), CpuStorage::F32(k), CpuStorage::F32(v)) => {
                let mut o = vec![0f32; o_len];
                let inputs = Inputs::new(
                    Data::F32(from(q, offsets[0])?),
                    Data::F32(from(k, offsets[1])?),
                    Data::F32(from(v, offsets[2])?),
                );
                run(inputs, DataMut::F32(&mut o), &mut lse)?;
                CpuStorage::F32(o)
            }
            (CpuStorage::F16(q), CpuStorage::F16(k), CpuStorage::F16(v)) => {
                let mut o = vec![half::f16::ZERO; o_len];
                let inputs = Inputs::new(
                    Data::F16(from(q, offsets[0])?),
                    Data::F16(from(k, offsets[1])?),
                    Data::F16(from(v, offsets[2])?),
                );
                run(inputs, DataMut::F16(&mut o), &mut lse)?;
                CpuStorage::F16(o)
            }
            (CpuStorage::BF16(q), CpuStorage::BF16(k), CpuStorage::BF16(v)) => {
                let mut o = vec![half::bf16::ZERO; o_len];
                let inputs = Inputs::new(
                    Data::Bf16(from(q, offsets[0])?),
                    Data::Bf16(from(k, offsets[1])?),
                    Data::Bf16(from(v, offsets[2])?),
                );
                run(inputs, DataMut::Bf16(&mut o), &mut lse)?;
                CpuStorage::BF16(o)
            }
            _ => unreachable!("the dtype was checked by AttnOp::problem"),
        };
        let (o_shape, lse_shape) = AttnOp::shapes(&problem);
        *self.saved_lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(lse.clone());
        if self.with_lse {
            *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(Lse::Cpu(lse, lse_shape));
        }
        Ok((o, o_shape))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if q.device().is_cuda() {
            let [dq, dk, dv] = self.cuda_bwd([q, k, v, o, d_o])?;
            return Ok((Some(dq), Some(dk), Some(dv)));
        }
        let [dq, dk, dv] = backward::cpu(self, [q, k, v, o, d_o])?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        // The LSE is written on every call: the backward pass needs it.
        let problem = self.problem(s1.dtype(), [l1, l2, l3])?.with_lse(true);
        let (o, lse) = cuda::forward(&problem, [s1, s2, s3], [l1, l2, l3], self.index_tensors())?;
        let (o_shape, lse_shape) = AttnOp::shapes(&problem);
        if let Some(lse) = lse {
            if self.with_lse {
                let copy = lse.try_clone(&Layout::contiguous(lse_shape.clone()))?;
                *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(Lse::Cuda(copy, lse_shape));
            }
            *self.saved_cuda_lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(lse);
        }
        Ok((o, o_shape))
    }
}

/// Hands over the LSE that an [`AttnOp`] left (applied to that op's output, so that candle runs
/// it after the op).
struct TakeLse(Arc<Mutex<Option<Lse>>>);

impl TakeLse {
    fn take(&self) -> candle_core::Result<Lse> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| candle_core::Error::Msg("attn: the LSE was taken already".into()))
    }
}

impl candle_core::CustomOp1 for TakeLse {
    fn name(&self) -> &'static str {
        "attn-lse"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        match self.take()? {
            Lse::Cpu(values, shape) => Ok((CpuStorage::F32(values), shape)),
            #[cfg(feature = "cuda")]
            Lse::Cuda(..) => {
                Err(candle_core::Error::Msg("attn: the LSE is on CUDA, its output on the CPU".into()))
            }
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        match self.take()? {
            Lse::Cuda(storage, shape) => Ok((storage, shape)),
            Lse::Cpu(..) => {
                Err(candle_core::Error::Msg("attn: the LSE is on the CPU, its output on CUDA".into()))
            }
        }
    }
}
