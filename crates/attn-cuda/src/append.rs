//! Appending new keys and values to a KV cache that lives on the device, on the caller's
//! stream: the device form of [`attn_core::append_rows`], which defines where each row lands
//! (FlashAttention's `flash_attn_with_kvcache` with `k`/`v`: sequence `b`'s new row `t` goes to
//! key `seqused_k[b] + t` of its cache, dense or paged). A decode step on device memory is two
//! appends (keys, then values) and the attention call, all enqueued without a copy or a wait:
//!
//! ```text
//! cuda.append_rows_on_stream(&cache, CacheTensor::Keys, &mut k_cache, &k_new, strides, 1,
//!     AppendArrays { seqused_k, block_table, counts_after: Some(used_after) }, &stream)?;
//! cuda.append_rows_on_stream(&cache, CacheTensor::Values, &mut v_cache, &v_new, strides, 1,
//!     AppendArrays { seqused_k, block_table, counts_after: None }, &stream)?;
//! cuda.run_on_stream(&plan, &q, &k_cache, &v_cache, &mut o,
//!     DeviceArrays { seqused_k: Some(used_after), block_table, .. }, &stream)?;
//! ```
//!
//! As with the attention calls (see [`crate::indices`]), the index arrays' contents are not
//! checked on this path (that would need a copy back): `kernels/append.cu` clamps a key count
//! into `[0, seq_k]` and a page number into `[0, pages)`, and does not write a row that would
//! land past its sequence's `seq_k` keys, so bad contents put rows in the wrong place (or drop
//! them) but never write outside the cache. The host-copy form refuses them with a typed error.

use crate::backend::Cuda;
use crate::compile::{Arch, CompileRequest};
use crate::device::DeviceElement;
use crate::indices::{self, DeviceArrays};
use crate::runtime::driver;
use attn_core::{CacheTensor, Error, KvRows, Problem, QueryRows, Result, Strides};
use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, LaunchConfig};
use std::sync::{Arc, OnceLock};

/// The kernel's source.
const SOURCE: &str = include_str!("../kernels/append.cu");

/// The kernel's entry point.
const ENTRY: &str = "append_rows";

/// Threads per block: each moves 16 bytes.
const THREADS: u32 = 256;

/// The compile request for `arch`.
pub(crate) fn request(arch: Arch) -> CompileRequest {
    CompileRequest::new("append", SOURCE, arch)
}

/// [`request`]'s key for each architecture, made once: the hot path finds the loaded kernel
/// by it without building the request.
fn key(arch: Arch) -> u64 {
    static KEYS: OnceLock<Vec<(Arch, u64)>> = OnceLock::new();
    let keys = KEYS.get_or_init(|| Arch::ALL.iter().map(|&a| (a, request(a).key())).collect());
    keys.iter().find(|(a, _)| *a == arch).map_or_else(|| request(arch).key(), |(_, k)| *k)
}

/// The index arrays an append reads and writes: device memory on the stream's context.
#[derive(Debug)]
pub struct AppendArrays<'a> {
    /// `[batch]` i32: the keys each sequence holds before the append (read).
    pub seqused_k: CudaView<'a, i32>,
    /// `[batch, pages_per_seq]` i32 page numbers, row-major: for a paged cache, and only then.
    pub block_table: Option<CudaView<'a, i32>>,
    /// `[batch]` i32, written where given: the key counts after the append (`seqused_k + len`,
    /// at most `seq_k`), which the attention call after it takes as its `seqused_k`. It must not
    /// overlap `seqused_k` or `block_table` (the launch reads them while it writes this).
    pub counts_after: Option<CudaViewMut<'a, i32>>,
}

/// `AppendParams` in `kernels/append.cu`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct AppendParams {
    dst: u64,
    src: u64,
    seqused: u64,
    block_table: u64,
    counts_after: u64,
    dst_strides: [i64; 3],
    src_strides: [i64; 3],
    batch: i32,
    len: i32,
    heads_kv: i32,
    vectors: i32,
    capacity: i32,
    page_size: i32,
    pages_per_seq: i32,
    pages: i32,
}

// SAFETY: plain old data, passed by value as the kernel's one parameter.
unsafe impl cudarc::driver::DeviceRepr for AppendParams {}

impl Cuda {
    /// Writes `len` new rows per sequence (`new`, `[batch, len, heads_kv, head_dim]` as
    /// `new_strides` place them) into one tensor of the cache `cache` describes (`tensor`: its
    /// keys or its values, `dst`, placed by the problem's `k` or `v` strides), after each
    /// sequence's `arrays.seqused_k` keys, on `stream`; writes the counts after the append to
    /// `arrays.counts_after` where given. `cache` is the attention problem over the cache (per-
    /// sequence key counts; dense or paged keys), as [`attn_core::append_rows`] takes it, and the
    /// result equals that function's bit for bit. Asynchronous: one kernel is enqueued; nothing
    /// is copied, waited for or allocated.
    ///
    /// Errors, before anything is enqueued: a cache without key counts or with packed keys, an
    /// element type other than the problem's, a buffer shorter than the problem or the strides
    /// reach, a head dim or stride that is not a multiple of 8 elements or an address that is
    /// not 16-byte aligned (the kernel moves 16 bytes at a time), a key-count or block-table
    /// array given or missing against the cache, too short, of another context or misaligned
    /// (`crate::indices`' checks, as for the attention calls), a `counts_after` too short, of
    /// another context, misaligned or overlapping an array the launch reads, a failed launch.
    #[allow(clippy::too_many_arguments)]
    pub fn append_rows_on_stream<T: DeviceElement>(
        &self,
        cache: &Problem,
        tensor: CacheTensor,
        dst: &mut impl DevicePtrMut<T>,
        new: &impl DevicePtr<T>,
        new_strides: Strides,
        len: usize,
        arrays: AppendArrays<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        attn_core::check_append_layout(
            cache,
            tensor,
            (T::DTYPE, dst.len()),
            (T::DTYPE, new.len()),
            new_strides,
            len,
        )?;
        let s = cache.shape;
        let cache_strides = match tensor {
            CacheTensor::Keys => cache.strides.k,
            CacheTensor::Values => cache.strides.v,
        };
        let name = match tensor {
            CacheTensor::Keys => "k",
            CacheTensor::Values => "v",
        };
        for (what, st) in [("cache", cache_strides), ("new rows", new_strides)] {
            if !s.head_dim.is_multiple_of(8)
                || [st.batch, st.seq, st.head].iter().any(|x| !x.is_multiple_of(8))
            {
                return Err(Error::Shape {
                    tensor: name,
                    what: format!(
                        "{what}: the head dim ({}) and the strides ({st:?}) must be multiples of 8 elements: \
                         the kernel moves 16 bytes at a time",
                        s.head_dim
                    ),
                });
            }
        }
        let (page_size, pages, pages_per_seq) = match cache.batching.kv {
            KvRows::Paged { page_size, pages, pages_per_seq } => (page_size, pages, pages_per_seq),
            _ => (0, 0, 0),
        };
        let fits = |x: usize, what: &str| {
            i32::try_from(x)
                .map_err(|_| Error::InvalidParameter { what: format!("{what} = {x}: at most {}", i32::MAX) })
        };
        let ctx = stream.context().cu_ctx();
        let other = |tensor: &'static str, owner: &CudaStream| {
            (owner.context().cu_ctx() != ctx).then(|| Error::Shape {
                tensor,
                what: format!(
                    "its buffer belongs to the context of device {}, the stream to device {}'s: buffers and \
                     stream must share a context",
                    owner.context().ordinal(),
                    stream.context().ordinal()
                ),
            })
        };
        let counts_short = |c: &CudaViewMut<'_, i32>| {
            (c.len() < s.batch).then(|| Error::Shape {
                tensor: "counts_after",
                what: format!(
                    "the device buffer holds {} i32; the append writes [batch] = {}",
                    c.len(),
                    s.batch
                ),
            })
        };
        let mut counts_after = arrays.counts_after;
        let problems = [
            other(name, dst.stream()),
            other(name, new.stream()),
            counts_after.as_ref().and_then(|c| other("counts_after", c.stream())),
            counts_after.as_ref().and_then(counts_short),
        ];
        if let Some(e) = problems.into_iter().flatten().next() {
            return Err(e);
        }
        // The key counts and block table are checked as the attention calls check them (present
        // exactly when the cache needs them, long enough, on the stream's context, aligned), against
        // the cache's keys alone: its queries' layout and ALiBi's slopes are no concern here.
        let mut keys = *cache;
        keys.batching.q = QueryRows::Dense;
        keys.params.alibi = None;
        let table_need = s.batch * pages_per_seq;
        let index = DeviceArrays {
            seqused_k: Some(arrays.seqused_k),
            block_table: arrays.block_table,
            ..DeviceArrays::default()
        };
        // The addresses, with cudarc's stream-ordering guards held until the launch is enqueued.
        let (given, _index_guards) = index.given(stream);
        let at = indices::check(&keys, given, stream.context().ordinal())?;
        let (used_at, table_at) = (at.seqused_k, at.block_table);
        let (dst_at, _dst) = dst.device_ptr_mut(stream);
        let (src_at, _src) = new.device_ptr(stream);
        let (after_at, _after) = match counts_after.as_mut() {
            Some(c) => {
                let (at, guard) = c.device_ptr_mut(stream);
                (at, Some(guard))
            }
            None => (0, None),
        };
        for (tensor, address) in [(name, dst_at), (name, src_at)] {
            if address % 16 != 0 {
                return Err(Error::Shape {
                    tensor,
                    what: format!(
                        "device address {address:#x} is not 16-byte aligned: the kernel moves 16 bytes at a time"
                    ),
                });
            }
        }
        if after_at % 4 != 0 {
            return Err(Error::Shape {
                tensor: "counts_after",
                what: format!("device address {after_at:#x} is not 4-byte aligned"),
            });
        }
        if after_at != 0 {
            let written = after_at..after_at + 4 * s.batch as u64;
            let read = [(used_at, s.batch, "seqused_k"), (table_at, table_need, "block_table")];
            if let Some((_, _, what)) = read
                .into_iter()
                .find(|&(at, n, _)| at != 0 && at < written.end && written.start < at + 4 * n as u64)
            {
                return Err(Error::Shape {
                    tensor: "counts_after",
                    what: format!(
                        "it overlaps `{what}`, which the same launch reads: give it a buffer of its own"
                    ),
                });
            }
        }
        let stride = |st: Strides| [st.batch, st.seq, st.head].map(|x| x as i64);
        let params = AppendParams {
            dst: dst_at,
            src: src_at,
            seqused: used_at,
            block_table: table_at,
            counts_after: after_at,
            dst_strides: stride(cache_strides),
            src_strides: stride(new_strides),
            batch: fits(s.batch, "batch")?,
            len: fits(len, "new rows per sequence")?,
            heads_kv: fits(s.heads_kv, "heads_kv")?,
            vectors: fits(s.head_dim / 8, "head_dim / 8")?,
            capacity: fits(s.seq_k, "seq_k")?,
            page_size: fits(page_size, "page_size")?,
            pages_per_seq: fits(pages_per_seq, "pages_per_seq")?,
            pages: fits(pages, "pages")?,
        };
        let rows = (s.batch * len * s.heads_kv * (s.head_dim / 8)) as u64;
        let threads = rows.max(if after_at != 0 { s.batch as u64 } else { 0 });
        if threads == 0 {
            return Ok(());
        }
        let blocks =
            u32::try_from(threads.div_ceil(u64::from(THREADS))).map_err(|_| Error::InvalidParameter {
                what: format!(
                    "{rows} 16-byte moves in one append: more than a grid holds; append fewer rows at a time"
                ),
            })?;
        let gpu = self.context_for(stream.context())?;
        let arch = Self::arch(&gpu)?;
        let function = gpu.ready_kernel(key(arch), ENTRY, || request(arch), 0)?;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut builder = stream.launch_builder(&function);
        builder.arg(&params);
        // SAFETY: the parameter block holds the caller's buffers, checked above to hold every
        // element the problem's and the new rows' strides reach, 16-byte aligned with strides of
        // whole 16-byte vectors; the index arrays hold the entries the kernel reads, whose
        // contents it clamps into the cache; `counts_after` overlaps nothing the launch reads.
        unsafe { builder.launch(cfg) }.map(|_| ()).map_err(driver("cuLaunchKernel append_rows"))
    }
}
