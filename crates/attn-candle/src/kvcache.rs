//! `flash_attn_with_kvcache`: decoding against a cache each sequence fills partly, dense or
//! paged, optionally appending new keys and values first (attn-core's `append_rows` defines
//! where they land).

use crate::{AttnOp, Index};
use attn_core::{
    Batching, CacheTensor, Data, DataMut, KvRows, NewRows, Problem, Shape as AttnShape, Strides,
};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Tensor};
use std::sync::Mutex;

/// Which keys of a cache each sequence uses, and where its pages are (on q's device).
pub(crate) struct CacheIndex {
    /// Keys each sequence attends to.
    pub(crate) seqused: Index,
    /// The block table, `[batch, pages_per_seq]` row-major, and `pages_per_seq`, for a paged cache.
    pub(crate) table: Option<(Index, usize)>,
}

/// Attention of `q` (`[batch, seq_q, heads_q, head_dim]`) over a key/value cache, FlashAttention's
/// `flash_attn_with_kvcache`:
/// - `k_cache`/`v_cache` are `[batch, seq_cache, heads_kv, head_dim]`, or with a `block_table`
///   (`[batch, pages_per_seq]` page numbers, i32 or u32) a paged cache `[pages, page_size,
///   heads_kv, head_dim]`;
/// - `cache_seqlens` (`[batch]`, i32 or u32) are the keys each sequence holds;
/// - `k_new`/`v_new` (`[batch, len, heads_kv, head_dim]`), when given, are written into the
///   caches in place after each sequence's keys, and the attention then sees `cache_seqlens + len`
///   keys (the caller's `cache_seqlens` tensor is not changed: add `len` for the next step);
/// - the causal mask aligns each sequence's last query with its last key.
///
/// Runs on CPU (cpu-flash) and CUDA tensors (attn's kernels on candle's stream, reading
/// `cache_seqlens` and `block_table` in place where they are on q's device; see the crate's
/// notes on index tensors). Appending `k_new`/`v_new` runs where the cache is: on the CPU, with
/// the counts and page numbers checked first (a typed error where the new rows do not fit); on
/// CUDA, one kernel per cache tensor on candle's stream, reading the counts and block table in
/// place and clamping them into the cache (as the attention kernels do), then the attention over
/// the counts the keys' append wrote, without a copy to the host.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_with_kvcache(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    k_new: Option<&Tensor>,
    v_new: Option<&Tensor>,
    cache_seqlens: &Tensor,
    block_table: Option<&Tensor>,
    softmax_scale: f32,
    causal: bool,
) -> candle_core::Result<Tensor> {
    let mut seqused = Index::new(cache_seqlens, q, "cache_seqlens")?;
    let table = match block_table {
        Some(t) => {
            let (_, pages_per_seq) = t.dims2()?;
            Some((Index::new(t, q, "block_table")?, pages_per_seq))
        }
        None => None,
    };
    match (k_new, v_new) {
        (Some(k_new), Some(v_new)) => {
            // The keys' append leaves the counts after it here where it runs on CUDA (a new
            // device buffer); on the CPU they are made on the host below.
            let counts = Mutex::new(None);
            for (cache, new, tensor) in
                [(k_cache, k_new, CacheTensor::Keys), (v_cache, v_new, CacheTensor::Values)]
            {
                let op = Append {
                    seqused: &seqused,
                    table: table.as_ref().map(|(t, n)| (t, *n)),
                    tensor,
                    counts: (tensor == CacheTensor::Keys).then_some(&counts),
                };
                cache.inplace_op2(new, &op)?;
            }
            let len = k_new.dim(1)? as i32;
            let after = match counts.into_inner().unwrap_or_else(|e| e.into_inner()) {
                Some(storage) => storage.into_tensor(),
                None => {
                    let mut used = seqused.host()?;
                    used.iter_mut().for_each(|n| *n += len);
                    Tensor::new(used, &candle_core::Device::Cpu)?
                }
            };
            seqused = Index::new(&after, q, "cache_seqlens")?;
        }
        (None, None) => {}
        _ => return Err(msg("attn: give both k_new and v_new, or neither".into())),
    }
    let mut op = AttnOp::new(softmax_scale, causal, false);
    op.cache = Some(CacheIndex { seqused, table });
    q.apply_op3_no_bwd(k_cache, v_cache, &op)
}

fn msg(m: String) -> candle_core::Error {
    candle_core::Error::Msg(m)
}

/// Writes new rows into one cache tensor, in place.
struct Append<'a> {
    /// The keys each sequence holds before the append.
    seqused: &'a Index,
    /// The block table and pages per sequence, for a paged cache.
    table: Option<(&'a Index, usize)>,
    tensor: CacheTensor,
    /// Where a CUDA append leaves the counts after it (the keys' append only).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    counts: Option<&'a Mutex<Option<Counts>>>,
}

/// The key counts after an append, made on the device that ran it.
enum Counts {
    #[cfg(feature = "cuda")]
    Cuda(candle_core::CudaStorage, usize),
}

impl Counts {
    /// As a tensor (`[batch]` i32).
    fn into_tensor(self) -> Tensor {
        match self {
            #[cfg(feature = "cuda")]
            Counts::Cuda(storage, batch) => Tensor::from_storage(
                candle_core::Storage::Cuda(storage),
                batch,
                candle_core::op::BackpropOp::none(),
                false,
            ),
        }
    }
}

impl Append<'_> {
    /// The cache as attn-core describes it (keys and values alike placed by this tensor's
    /// layout), and the new rows' strides and count.
    fn problem(
        &self,
        dtype: attn_core::DType,
        cache: &Layout,
        new: &Layout,
    ) -> candle_core::Result<(Problem, Strides, usize)> {
        let four = |l: &Layout, name: &str| -> candle_core::Result<([usize; 4], Strides)> {
            match (l.dims(), l.stride()) {
                (&[a, b, c, d], &[sa, sb, sc, 1]) => {
                    Ok(([a, b, c, d], Strides { batch: sa, head: sc, seq: sb }))
                }
                (dims, strides) => Err(msg(format!(
                    "attn: {name} must be 4-d with a contiguous last axis, got shape {dims:?}, strides {strides:?}"
                ))),
            }
        };
        let ([c0, c1, heads_kv, head_dim], cache_strides) = four(cache, "the cache")?;
        let ([_, len, _, _], new_strides) = four(new, "the new rows")?;
        let batch = self.seqused.len();
        let (kv, seq_k) = match self.table {
            Some((_, pages_per_seq)) => {
                (KvRows::Paged { page_size: c1, pages: c0, pages_per_seq }, pages_per_seq * c1)
            }
            None => (KvRows::Dense, c1),
        };
        let shape = AttnShape { batch, heads_q: heads_kv, heads_kv, seq_q: 1, seq_k, head_dim };
        let mut problem =
            Problem::new(shape, dtype).with_batching(Batching { kv, keys_used: true, ..Batching::default() });
        problem.strides.k = cache_strides;
        problem.strides.v = cache_strides;
        Ok((problem, new_strides, len))
    }
}

impl candle_core::InplaceOp2 for Append<'_> {
    fn name(&self) -> &'static str {
        "attn-append-kv"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let dtype = match s1.dtype() {
            DType::F32 => attn_core::DType::F32,
            DType::F16 => attn_core::DType::F16,
            DType::BF16 => attn_core::DType::Bf16,
            other => return Err(msg(format!("attn: cache dtype {other:?} (f32, f16 and bf16 run)"))),
        };
        let (problem, strides, len) = self.problem(dtype, l1, l2)?;
        let (seqused, table) = (self.seqused.host()?, self.table.map(|(t, _)| t.host()).transpose()?);
        let extras = attn_core::Extras {
            seqused_k: Some(&seqused),
            block_table: table.as_deref(),
            ..Default::default()
        };
        let (o1, o2) = (l1.start_offset(), l2.start_offset());
        let (dst, src) = match (s1, s2) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => (DataMut::F32(&mut d[o1..]), Data::F32(&s[o2..])),
            (CpuStorage::F16(d), CpuStorage::F16(s)) => (DataMut::F16(&mut d[o1..]), Data::F16(&s[o2..])),
            (CpuStorage::BF16(d), CpuStorage::BF16(s)) => (DataMut::Bf16(&mut d[o1..]), Data::Bf16(&s[o2..])),
            (d, s) => {
                return Err(msg(format!(
                    "attn: the cache holds {:?}, the new rows {:?}",
                    d.dtype(),
                    s.dtype()
                )));
            }
        };
        let new = NewRows { data: src, strides, len };
        attn_core::append_rows(&problem, extras, self.tensor, dst, new)
            .map(|_| ())
            .map_err(candle_core::Error::wrap)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let dtype = match s1.dtype() {
            DType::F16 => attn_core::DType::F16,
            DType::BF16 => attn_core::DType::Bf16,
            other => {
                return Err(msg(format!("attn: cache dtype {other:?} (the CUDA kernels take f16 and bf16)")));
            }
        };
        let (problem, strides, len) = self.problem(dtype, l1, l2)?;
        let index = crate::cuda::AppendIndex {
            seqused: self.seqused,
            table: self.table.map(|(t, _)| t),
            counts: self.counts.is_some(),
        };
        let counts = crate::cuda::append(&problem, self.tensor, (s1, l1), (s2, l2), strides, len, index)?;
        if let (Some(slot), Some(counts)) = (self.counts, counts) {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(Counts::Cuda(counts, problem.shape.batch));
        }
        Ok(())
    }
}
