//! Sequences of different lengths in one call, FlashAttention's way: packed ("varlen") queries
//! and keys, a paged key/value cache, per-sequence key counts; and the per-head ALiBi slopes.
//!
//! The split follows what each side needs. The [`Problem`] says which layout is used and its
//! sizes ([`Batching`]: plain values, enough to plan a launch); the indices themselves
//! (cumulative lengths, the block table, key counts, slopes) are data that travel with the
//! inputs ([`Extras`]), because on a GPU they live in device memory and change every step.
//! [`SeqMap`] joins the two on the host: every backend that computes on the host, and the
//! reference, find each sequence's lengths and each row's address through it, so that the
//! layouts are defined once.
//!
//! ## Worked example
//! Two sequences of 3 and 1 queries against 5 and 2 keys, packed (`[total, heads, head_dim]`):
//! `cu_seqlens_q = [0, 3, 4]`, `cu_seqlens_k = [0, 5, 7]`, with `seq_q = 3` and `seq_k = 5` the
//! longest of each. Query row 1 of sequence 0 is packed row 1; sequence 1's only query is packed
//! row 3 and sees its two keys (packed rows 5 and 6). Under a causal mask each sequence aligns its
//! diagonal bottom-right on its own lengths: sequence 0's row 0 sees keys 0..=2.
//!
//! The same keys in a paged cache of 4-row pages: `block_table = [[2, 0], [1, 3]]` (two pages
//! per sequence), `seqused_k = [5, 2]`: sequence 0's key 4 is row 0 of page 0, its key 1 is row
//! 1 of page 2; sequence 1 uses page 1 only (its second entry is never read).

use crate::{Error, Problem, Result};
use std::ops::Range;

/// How query (and output) rows are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueryRows {
    /// `seq_q` rows per sequence, placed by the strides' batch, head and seq strides.
    #[default]
    Dense,
    /// All sequences' rows back to back (`[total, heads_q, head_dim]` as the head and seq
    /// strides place them; the batch stride is unused): sequence `b` is rows
    /// `cu_seqlens_q[b]..cu_seqlens_q[b+1]`, at most `seq_q` of them. The LSE is then
    /// `[heads_q, total]` (FlashAttention's varlen layout).
    Packed {
        /// Rows of q and o.
        total: usize,
    },
}

/// How key and value rows are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvRows {
    /// `seq_k` rows per sequence, placed by the strides.
    #[default]
    Dense,
    /// All sequences' rows back to back: sequence `b` is rows `cu_seqlens_k[b]..cu_seqlens_k[b+1]`,
    /// at most `seq_k` of them.
    Packed {
        /// Rows of k and v.
        total: usize,
    },
    /// A paged cache: k and v are `[pages, page_size, heads_kv, head_dim]` as the strides place
    /// them (the batch stride steps from page to page); key `j` of sequence `b` is row
    /// `j % page_size` of page `block_table[b][j / page_size]`. Each sequence has `seq_k` keys, or
    /// `seqused_k[b]` where those are given.
    Paged {
        /// Keys per page.
        page_size: usize,
        /// Pages in the cache.
        pages: usize,
        /// Entries per sequence in the block table (`[batch, pages_per_seq]`, row-major).
        pages_per_seq: usize,
    },
}

/// Where a problem's rows are: [`QueryRows`], [`KvRows`] and whether per-sequence key counts
/// are given. The default is the dense `[batch, seq, ...]` layout of [`crate::Strides`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Batching {
    /// Query and output rows.
    pub q: QueryRows,
    /// Key and value rows.
    pub kv: KvRows,
    /// Whether each sequence uses only `seqused_k[b]` of its keys (FlashAttention's
    /// `seqused_k`, and `cache_seqlens` of `flash_attn_with_kvcache`).
    pub keys_used: bool,
}

impl Batching {
    /// Whether this is the plain dense layout.
    pub fn is_dense(&self) -> bool {
        *self == Batching::default()
    }
}

/// How ALiBi slopes are given ([`crate::Params::alibi`]): one f32 per query head, or one per
/// (batch, query head).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Alibi {
    /// `[heads_q]`.
    PerHead,
    /// `[batch, heads_q]`, row-major.
    PerBatchHead,
}

/// The ALiBi bias of query row `i` and key `j` of a sequence of `q_len` queries and `k_len`
/// keys: `-slope · |i + k_len - q_len - j|`, the distance from the bottom-right diagonal
/// (FlashAttention's convention and its reference's). It is added to the scaled (and
/// soft-capped) score. FlashAttention's causal kernel adds `slope · j` instead, which differs by a
/// constant per row: the same output, a log-sum-exp shifted by `slope · (i + k_len - q_len)`.
pub fn alibi_bias(slope: f32, i: usize, j: usize, q_len: usize, k_len: usize) -> f64 {
    let diagonal = i as i128 + k_len as i128 - q_len as i128;
    -(slope as f64) * (diagonal - j as i128).abs() as f64
}

/// The data of a problem beyond q, k and v: the indices of [`Batching`] and the ALiBi slopes.
/// Each must be present exactly when the problem's layout asks for it
/// ([`Problem::check_extras`]). All are host slices here; the GPU backends take the same arrays
/// in device memory through their device-resident calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras<'a> {
    /// `[batch + 1]` cumulative query counts, from 0 (for [`QueryRows::Packed`]).
    pub cu_seqlens_q: Option<&'a [i32]>,
    /// `[batch + 1]` cumulative key counts, from 0 (for [`KvRows::Packed`]).
    pub cu_seqlens_k: Option<&'a [i32]>,
    /// `[batch]` keys each sequence uses (for [`Batching::keys_used`]).
    pub seqused_k: Option<&'a [i32]>,
    /// `[batch, pages_per_seq]` page numbers (for [`KvRows::Paged`]).
    pub block_table: Option<&'a [i32]>,
    /// `[heads_q]` or `[batch, heads_q]` ALiBi slopes (for [`crate::Params::alibi`]).
    pub alibi_slopes: Option<&'a [f32]>,
}

/// The owned arrays behind [`Extras`], each present when a problem needs it (what
/// [`batch_of`] builds, and what a caller that makes its own indices can fill).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct OwnedExtras {
    /// `[batch + 1]` query offsets.
    pub cu_seqlens_q: Option<Vec<i32>>,
    /// `[batch + 1]` key offsets.
    pub cu_seqlens_k: Option<Vec<i32>>,
    /// `[batch]` keys used.
    pub seqused_k: Option<Vec<i32>>,
    /// `[batch, pages_per_seq]` pages.
    pub block_table: Option<Vec<i32>>,
    /// ALiBi slopes.
    pub alibi_slopes: Option<Vec<f32>>,
}

impl OwnedExtras {
    /// A copy of `e`'s arrays.
    pub fn copy_of(e: &Extras<'_>) -> Self {
        OwnedExtras {
            cu_seqlens_q: e.cu_seqlens_q.map(<[i32]>::to_vec),
            cu_seqlens_k: e.cu_seqlens_k.map(<[i32]>::to_vec),
            seqused_k: e.seqused_k.map(<[i32]>::to_vec),
            block_table: e.block_table.map(<[i32]>::to_vec),
            alibi_slopes: e.alibi_slopes.map(<[f32]>::to_vec),
        }
    }

    /// Borrowed, as inputs carry them.
    pub fn borrow(&self) -> Extras<'_> {
        Extras {
            cu_seqlens_q: self.cu_seqlens_q.as_deref(),
            cu_seqlens_k: self.cu_seqlens_k.as_deref(),
            seqused_k: self.seqused_k.as_deref(),
            block_table: self.block_table.as_deref(),
            alibi_slopes: self.alibi_slopes.as_deref(),
        }
    }
}

/// The slopes ALiBi's authors give for `heads` heads, `2^(-8 (h + 1) / heads)` for a power of
/// two (the usual choice; other head counts interleave two such series, as models do).
pub fn alibi_standard_slopes(heads: usize) -> Vec<f32> {
    if heads == 0 {
        return vec![];
    }
    let series = |n: usize| (0..n).map(move |h| 2f32.powf(-8.0 * (h + 1) as f32 / n as f32));
    let pow2 = 1usize << heads.max(1).ilog2();
    series(pow2).chain(series(2 * pow2).step_by(2).take(heads - pow2)).collect()
}

/// Cumulative offsets of `lens`, from 0.
fn offsets(lens: &[usize]) -> Vec<i32> {
    std::iter::once(0)
        .chain(lens.iter().scan(0, |sum, &n| {
            *sum += n as i32;
            Some(*sum)
        }))
        .collect()
}

/// How [`batch_of`] stores the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyStore {
    /// Packed back to back ([`KvRows::Packed`]).
    Packed,
    /// In a paged cache of `page_size`-key pages ([`KvRows::Paged`]), handed out in an order
    /// shuffled by `seed`, with as many spare pages as used ones: pages are neither contiguous nor
    /// ordered, as in a cache that has lived a while.
    Paged {
        /// Keys per page.
        page_size: usize,
        /// Seed of the page order.
        seed: u64,
    },
    /// Dense `[batch, seq_k]` rows, sequence `b` using `seqused_k[b]` of them.
    DenseUsed,
}

/// A problem for sequences of `q_lens` queries and `k_lens` keys (the same count of each) in
/// FlashAttention's layouts, and its extras: queries dense `[batch, seq, heads, head_dim]` when all
/// `q_lens` are equal, else packed `[total, heads, head_dim]`; keys as `keys` says. `shape` gives
/// the heads and head dim (its batch and lengths are replaced). No mask, no LSE: add them to the
/// problem.
pub fn batch_of(
    shape: crate::Shape,
    dtype: crate::DType,
    q_lens: &[usize],
    k_lens: &[usize],
    keys: KeyStore,
) -> (Problem, OwnedExtras) {
    use crate::{Layout, Strides, TensorStrides};
    let batch = q_lens.len().min(k_lens.len()).max(1);
    let d = shape.head_dim;
    let seq_q = q_lens.iter().copied().max().unwrap_or(1).max(1);
    let seq_k = k_lens.iter().copied().max().unwrap_or(1).max(1);
    let shape = crate::Shape { batch, seq_q, seq_k, ..shape };
    let mut extras = OwnedExtras::default();
    let packed_rows = |heads: usize| Strides { batch: 0, head: d, seq: heads * d };
    let (q_rows, q_strides) = if q_lens.iter().all(|&n| n == seq_q) {
        (QueryRows::Dense, Layout::Bshd.strides(shape.heads_q, seq_q, d))
    } else {
        extras.cu_seqlens_q = Some(offsets(q_lens));
        (QueryRows::Packed { total: q_lens.iter().sum::<usize>().max(1) }, packed_rows(shape.heads_q))
    };
    let used = || Some(k_lens.iter().map(|&n| n as i32).collect());
    let (kv, kv_strides, keys_used) = match keys {
        KeyStore::Packed => {
            extras.cu_seqlens_k = Some(offsets(k_lens));
            (
                KvRows::Packed { total: k_lens.iter().sum::<usize>().max(1) },
                packed_rows(shape.heads_kv),
                false,
            )
        }
        KeyStore::DenseUsed => {
            extras.seqused_k = used();
            (KvRows::Dense, Layout::Bshd.strides(shape.heads_kv, seq_k, d), true)
        }
        KeyStore::Paged { page_size, seed } => {
            let page_size = page_size.max(1);
            let pages_per_seq = seq_k.div_ceil(page_size);
            let pages = 2 * batch * pages_per_seq;
            let mut order: Vec<i32> = (0..pages as i32).collect();
            let mut rng = crate::rng::SplitMix64::new(seed);
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            extras.block_table = Some(order[..batch * pages_per_seq].to_vec());
            extras.seqused_k = used();
            let strides = Strides { batch: page_size * shape.heads_kv * d, head: d, seq: shape.heads_kv * d };
            (KvRows::Paged { page_size, pages, pages_per_seq }, strides, true)
        }
    };
    let problem = Problem::new(shape, dtype)
        .with_strides(TensorStrides { q: q_strides, k: kv_strides, v: kv_strides, o: q_strides })
        .with_batching(Batching { q: q_rows, kv, keys_used });
    (problem, extras)
}

/// One of the arrays a problem reads beside q, k and v ([`Extras`]' fields), as
/// [`Problem::extras_read`] describes it for the checks of the device-resident calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtraArray {
    /// The field's name: `cu_seqlens_q`, `cu_seqlens_k`, `seqused_k`, `block_table` or
    /// `alibi_slopes`.
    pub name: &'static str,
    /// What in a problem needs it ("packed (varlen) queries", ...).
    pub why: &'static str,
    /// Where this problem needs it: the entries it reads, and how that count is made
    /// (`"[batch + 1]"`, ...); `None` where it has no use for the array.
    pub read: Option<(usize, &'static str)>,
}

impl Problem {
    /// The five arrays of [`Extras`], in its order, each with the entries this problem reads
    /// from it: `[batch + 1]` offsets for packed queries and keys, `[batch]` key counts,
    /// `[batch, pages_per_seq]` page numbers, `[heads_q]` or `[batch, heads_q]` slopes.
    pub fn extras_read(&self) -> [ExtraArray; 5] {
        let s = self.shape;
        let b = self.batching;
        let array = |name, why, read| ExtraArray { name, why, read };
        let paged = match b.kv {
            KvRows::Paged { pages_per_seq, .. } => Some((s.batch * pages_per_seq, "[batch, pages_per_seq]")),
            _ => None,
        };
        let slopes = match self.params.alibi {
            Some(Alibi::PerHead) => Some((s.heads_q, "[heads_q]")),
            Some(Alibi::PerBatchHead) => Some((s.batch * s.heads_q, "[batch, heads_q]")),
            None => None,
        };
        [
            array(
                "cu_seqlens_q",
                "packed (varlen) queries",
                matches!(b.q, QueryRows::Packed { .. }).then_some((s.batch + 1, "[batch + 1]")),
            ),
            array(
                "cu_seqlens_k",
                "packed (varlen) keys",
                matches!(b.kv, KvRows::Packed { .. }).then_some((s.batch + 1, "[batch + 1]")),
            ),
            array("seqused_k", "per-sequence key counts", b.keys_used.then_some((s.batch, "[batch]"))),
            array("block_table", "paged KV cache", paged),
            array("alibi_slopes", "ALiBi", slopes),
        ]
    }

    /// Checks that `extras` holds exactly the arrays this problem's layout and parameters ask
    /// for, of the right lengths, with indices in range: offsets that start at 0 and never
    /// decrease, sequences no longer than `seq_q`/`seq_k`, key counts within each sequence's
    /// keys, page numbers below the cache's pages (those that cover used keys), finite slopes.
    pub fn check_extras(&self, e: &Extras<'_>) -> Result<()> {
        let s = self.shape;
        let b = self.batching;
        // In extras_read's order (Extras').
        let given = [
            e.cu_seqlens_q.is_some(),
            e.cu_seqlens_k.is_some(),
            e.seqused_k.is_some(),
            e.block_table.is_some(),
            e.alibi_slopes.is_some(),
        ];
        for (array, given) in self.extras_read().into_iter().zip(given) {
            present(array.name, given, array.read.is_some(), array.why)?;
        }
        if let (QueryRows::Packed { total }, Some(cu)) = (b.q, e.cu_seqlens_q) {
            check_offsets("cu_seqlens_q", cu, s.batch, s.seq_q, "seq_q", total)?;
        }
        if let (KvRows::Packed { total }, Some(cu)) = (b.kv, e.cu_seqlens_k) {
            check_offsets("cu_seqlens_k", cu, s.batch, s.seq_k, "seq_k", total)?;
        }
        // Keys each sequence holds before `seqused_k`.
        let stored = |i: usize| match (b.kv, e.cu_seqlens_k) {
            (KvRows::Packed { .. }, Some(cu)) => (cu[i + 1] - cu[i]) as usize,
            _ => s.seq_k,
        };
        if let Some(used) = e.seqused_k {
            check_len("seqused_k", used.len(), s.batch, "batch")?;
            for (i, &n) in used.iter().enumerate() {
                if n < 0 || n as usize > stored(i) {
                    return Err(bad(format!(
                        "seqused_k[{i}] = {n}: a sequence uses 0 to {} keys (the keys it holds)",
                        stored(i)
                    )));
                }
            }
        }
        if let (KvRows::Paged { page_size, pages, pages_per_seq }, Some(table)) = (b.kv, e.block_table) {
            check_len("block_table", table.len(), s.batch * pages_per_seq, "batch * pages_per_seq")?;
            for seq in 0..s.batch {
                let keys = e.seqused_k.map_or(s.seq_k, |u| u[seq] as usize);
                for (slot, &page) in
                    table[seq * pages_per_seq..][..keys.div_ceil(page_size)].iter().enumerate()
                {
                    if page < 0 || page as usize >= pages {
                        return Err(bad(format!(
                            "block_table[{seq}][{slot}] = {page}: a page number is 0 to {} (the cache has \
                             {pages} pages)",
                            pages - 1
                        )));
                    }
                }
            }
        }
        if let (Some(alibi), Some(slopes)) = (self.params.alibi, e.alibi_slopes) {
            let (need, what) = match alibi {
                Alibi::PerHead => (s.heads_q, "heads_q"),
                Alibi::PerBatchHead => (s.batch * s.heads_q, "batch * heads_q"),
            };
            check_len("alibi_slopes", slopes.len(), need, what)?;
            if let Some((i, x)) = slopes.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(bad(format!("alibi_slopes[{i}] = {x}: slopes must be finite")));
            }
        }
        Ok(())
    }

    /// The rows of this problem's sequences, resolved against `extras` (checked first).
    pub fn seq_map<'a>(&'a self, extras: Extras<'a>) -> Result<SeqMap<'a>> {
        self.check_extras(&extras)?;
        Ok(SeqMap { p: self, e: extras })
    }
}

fn present(name: &str, given: bool, needed: bool, why: &str) -> Result<()> {
    match (given, needed) {
        (false, true) => {
            Err(bad(format!("the problem uses {why}, so `{name}` is required but was not given")))
        }
        (true, false) => Err(bad(format!("`{name}` was given but the problem uses no {why}"))),
        _ => Ok(()),
    }
}

fn check_len(name: &str, len: usize, need: usize, what: &str) -> Result<()> {
    if len != need {
        return Err(bad(format!("`{name}` has {len} entries; it must have {what} = {need}")));
    }
    Ok(())
}

fn check_offsets(
    name: &str,
    cu: &[i32],
    batch: usize,
    max_len: usize,
    max_name: &str,
    total: usize,
) -> Result<()> {
    check_len(name, cu.len(), batch + 1, "batch + 1")?;
    if cu[0] != 0 {
        return Err(bad(format!("{name}[0] = {}: the offsets start at 0", cu[0])));
    }
    for (i, w) in cu.windows(2).enumerate() {
        let len = w[1] as i64 - w[0] as i64;
        if len < 0 || len as usize > max_len {
            return Err(bad(format!(
                "{name}[{}] - {name}[{i}] = {len}: each sequence has 0 to {max_name} = {max_len} rows",
                i + 1
            )));
        }
    }
    let last = cu[batch] as usize;
    if last > total {
        return Err(bad(format!("{name}[{batch}] = {last}: past the {total} packed rows")));
    }
    Ok(())
}

fn bad(what: String) -> Error {
    Error::InvalidParameter { what }
}

/// A problem's rows, resolved: each sequence's lengths, each row's element offset, each row's
/// LSE slot and ALiBi slope. Made by [`Problem::seq_map`], which checked the indices, so no
/// method here can index out of range.
#[derive(Clone, Copy, Debug)]
pub struct SeqMap<'a> {
    p: &'a Problem,
    e: Extras<'a>,
}

impl SeqMap<'_> {
    /// Queries of sequence `b`.
    #[inline]
    pub fn q_len(&self, b: usize) -> usize {
        match self.e.cu_seqlens_q {
            Some(cu) => (cu[b + 1] - cu[b]) as usize,
            None => self.p.shape.seq_q,
        }
    }

    /// Keys sequence `b` attends to.
    #[inline]
    pub fn k_len(&self, b: usize) -> usize {
        match (self.e.seqused_k, self.e.cu_seqlens_k) {
            (Some(used), _) => used[b] as usize,
            (None, Some(cu)) => (cu[b + 1] - cu[b]) as usize,
            (None, None) => self.p.shape.seq_k,
        }
    }

    /// The keys query row `i` of sequence `b` sees, by the mask on the sequence's own lengths.
    #[inline]
    pub fn visible(&self, b: usize, i: usize) -> Range<usize> {
        self.p.params.mask.visible_range(i, self.q_len(b), self.k_len(b))
    }

    /// The packed row of query `i` of sequence `b` (for dense queries, `i` itself).
    #[inline]
    fn q_row(&self, b: usize, i: usize) -> (usize, usize) {
        match self.e.cu_seqlens_q {
            Some(cu) => (0, cu[b] as usize + i),
            None => (b, i),
        }
    }

    /// Element offset of query row `(b, h, i)` in q.
    #[inline]
    pub fn q_offset(&self, b: usize, h: usize, i: usize) -> usize {
        let (b, i) = self.q_row(b, i);
        self.p.strides.q.offset(b, h, i)
    }

    /// Element offset of output row `(b, h, i)` in o.
    #[inline]
    pub fn o_offset(&self, b: usize, h: usize, i: usize) -> usize {
        let (b, i) = self.q_row(b, i);
        self.p.strides.o.offset(b, h, i)
    }

    /// Where key `j` of sequence `b` is: (batch or page, row) for the strides.
    #[inline]
    fn k_row(&self, b: usize, j: usize) -> (usize, usize) {
        match (self.p.batching.kv, self.e.cu_seqlens_k, self.e.block_table) {
            (KvRows::Paged { page_size, pages_per_seq, .. }, _, Some(table)) => {
                (table[b * pages_per_seq + j / page_size] as usize, j % page_size)
            }
            (_, Some(cu), _) => (0, cu[b] as usize + j),
            _ => (b, j),
        }
    }

    /// Element offset of key `j` of kv head `g` in sequence `b`.
    #[inline]
    pub fn k_offset(&self, b: usize, g: usize, j: usize) -> usize {
        let (b, j) = self.k_row(b, j);
        self.p.strides.k.offset(b, g, j)
    }

    /// Element offset of value `j` of kv head `g` in sequence `b`.
    #[inline]
    pub fn v_offset(&self, b: usize, g: usize, j: usize) -> usize {
        let (b, j) = self.k_row(b, j);
        self.p.strides.v.offset(b, g, j)
    }

    /// Index of row `(b, h, i)`'s log-sum-exp: `[batch, heads_q, seq_q]`, or `[heads_q, total]`
    /// for packed queries.
    #[inline]
    pub fn lse_index(&self, b: usize, h: usize, i: usize) -> usize {
        match (self.p.batching.q, self.e.cu_seqlens_q) {
            (QueryRows::Packed { total }, Some(cu)) => h * total + cu[b] as usize + i,
            _ => (b * self.p.shape.heads_q + h) * self.p.shape.seq_q + i,
        }
    }

    /// The ALiBi slope of query head `h` in sequence `b`, if the problem has ALiBi.
    #[inline]
    pub fn alibi_slope(&self, b: usize, h: usize) -> Option<f32> {
        let slopes = self.e.alibi_slopes?;
        Some(match self.p.params.alibi? {
            Alibi::PerHead => slopes[h],
            Alibi::PerBatchHead => slopes[b * self.p.shape.heads_q + h],
        })
    }

    /// Every output row `(b, h, i)` that exists (sequence `b` has more than `i` queries).
    pub fn rows(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let s = self.p.shape;
        (0..s.batch)
            .flat_map(move |b| (0..s.heads_q).flat_map(move |h| (0..self.q_len(b)).map(move |i| (b, h, i))))
    }

    /// Floating-point operations by FlashAttention's convention, counted over the (query, key)
    /// pairs each sequence's mask lets through: `4 · D` per pair and query head (for a dense,
    /// square causal problem [`Problem::flops`] keeps the convention's halving instead).
    pub fn flops(&self) -> f64 {
        if self.p.batching.is_dense() {
            return self.p.flops();
        }
        let s = self.p.shape;
        let pairs: usize =
            (0..s.batch).map(|b| (0..self.q_len(b)).map(|i| self.visible(b, i).len()).sum::<usize>()).sum();
        4.0 * (s.heads_q * s.head_dim) as f64 * pairs as f64
    }

    /// The problem it resolves.
    pub fn problem(&self) -> &Problem {
        self.p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Shape, Strides, TensorStrides};

    /// The module's worked example: two sequences, packed queries, keys packed or paged.
    fn example(kv: KvRows) -> Problem {
        let shape = Shape { batch: 2, heads_q: 1, heads_kv: 1, seq_q: 3, seq_k: 5, head_dim: 4 };
        let rows = Strides { batch: 0, head: 4, seq: 4 };
        let keys_used = matches!(kv, KvRows::Paged { .. });
        Problem::new(shape, DType::F32)
            .with_strides(TensorStrides { q: rows, k: rows, v: rows, o: rows })
            .with_batching(Batching { q: QueryRows::Packed { total: 4 }, kv, keys_used })
    }

    #[test]
    fn the_worked_example_resolves_as_documented() {
        let packed = example(KvRows::Packed { total: 7 }).causal();
        let (cu_q, cu_k) = ([0, 3, 4], [0, 5, 7]);
        let e = Extras { cu_seqlens_q: Some(&cu_q), cu_seqlens_k: Some(&cu_k), ..Extras::default() };
        let map = packed.seq_map(e).unwrap();
        assert_eq!((map.q_len(0), map.q_len(1), map.k_len(0), map.k_len(1)), (3, 1, 5, 2));
        assert_eq!(map.q_offset(0, 0, 1), 4); // packed row 1
        assert_eq!(map.q_offset(1, 0, 0), 12); // packed row 3
        assert_eq!((map.k_offset(1, 0, 0), map.k_offset(1, 0, 1)), (20, 24)); // rows 5 and 6
        assert_eq!(map.visible(0, 0), 0..3);
        assert_eq!(map.visible(1, 0), 0..2);
        assert_eq!(map.lse_index(1, 0, 0), 3); // [heads_q, total]
        assert_eq!(map.rows().count(), 4);

        let paged = Problem {
            strides: TensorStrides {
                k: Strides { batch: 16, head: 4, seq: 4 },
                v: Strides { batch: 16, head: 4, seq: 4 },
                ..packed.strides
            },
            ..example(KvRows::Paged { page_size: 4, pages: 4, pages_per_seq: 2 })
        };
        let (table, used) = ([2, 0, 1, 3], [5, 2]);
        let e = Extras { cu_seqlens_q: Some(&cu_q), seqused_k: Some(&used), block_table: Some(&table), ..e };
        let e = Extras { cu_seqlens_k: None, ..e };
        let map = paged.seq_map(e).unwrap();
        assert_eq!(map.k_offset(0, 0, 4), 0); // row 0 of page 0
        assert_eq!(map.k_offset(0, 0, 1), 2 * 16 + 4); // row 1 of page 2
        assert_eq!(map.k_offset(1, 0, 1), 16 + 4); // row 1 of page 1
        assert_eq!(map.k_len(1), 2);
    }

    #[test]
    fn bad_extras_are_typed_errors_that_say_what_is_allowed() {
        let p = example(KvRows::Packed { total: 7 });
        let err = |e: Extras<'_>| p.check_extras(&e).unwrap_err().to_string();
        let (good_q, good_k) = ([0, 3, 4], [0, 5, 7]);
        let with = |q: &'static [i32], k: &'static [i32]| Extras {
            cu_seqlens_q: Some(q),
            cu_seqlens_k: Some(k),
            ..Extras::default()
        };
        assert!(
            p.check_extras(&Extras {
                cu_seqlens_q: Some(&good_q),
                cu_seqlens_k: Some(&good_k),
                ..Extras::default()
            })
            .is_ok()
        );
        assert!(
            err(Extras { cu_seqlens_q: Some(&good_q), ..Extras::default() })
                .contains("`cu_seqlens_k` is required")
        );
        assert!(err(with(&[0, 3], &[0, 5, 7])).contains("batch + 1 = 3"));
        assert!(err(with(&[1, 3, 4], &[0, 5, 7])).contains("start at 0"));
        assert!(err(with(&[0, 3, 2], &[0, 5, 7])).contains("0 to seq_q = 3"));
        assert!(err(with(&[0, 3, 4], &[0, 6, 7])).contains("0 to seq_k = 5"));
        assert!(err(with(&[0, 3, 5], &[0, 5, 7])).contains("past the 4 packed rows"));
        let slopes = [0.5f32];
        let e = Extras { alibi_slopes: Some(&slopes), ..with(&[0, 3, 4], &[0, 5, 7]) };
        assert!(err(e).contains("no ALiBi"));
        let p = p.with_alibi(Alibi::PerBatchHead);
        let e2 = p.check_extras(&e).unwrap_err().to_string();
        assert!(e2.contains("batch * heads_q = 2"), "{e2}");
    }

    #[test]
    fn block_tables_and_key_counts_are_checked() {
        let p = example(KvRows::Paged { page_size: 4, pages: 3, pages_per_seq: 2 });
        let e = |table: &'static [i32], used: &'static [i32]| Extras {
            cu_seqlens_q: Some(&[0, 3, 4]),
            seqused_k: Some(used),
            block_table: Some(table),
            ..Extras::default()
        };
        assert!(p.check_extras(&e(&[2, 0, 1, -7], &[5, 2])).is_ok()); // the unused slot is not read
        let msg = p.check_extras(&e(&[2, 3, 1, 0], &[5, 2])).unwrap_err().to_string();
        assert!(msg.contains("block_table[0][1] = 3") && msg.contains("0 to 2"), "{msg}");
        let msg = p.check_extras(&e(&[2, 0, 1, 0], &[6, 2])).unwrap_err().to_string();
        assert!(msg.contains("seqused_k[0] = 6") && msg.contains("0 to 5"), "{msg}");
        // A cache too small for seq_k is refused before any data is read.
        let small = example(KvRows::Paged { page_size: 2, pages: 3, pages_per_seq: 2 });
        assert!(small.validate().unwrap_err().to_string().contains("at most pages_per_seq * page_size"));
    }

    #[test]
    fn standard_slopes_follow_the_alibi_schedule() {
        assert_eq!(alibi_standard_slopes(8), (1..=8).map(|h| 0.5f32.powi(h)).collect::<Vec<_>>());
        // 12 heads: the 8-head series, then every other slope of the 16-head one.
        let twelve = alibi_standard_slopes(12);
        assert_eq!(twelve.len(), 12);
        assert_eq!(twelve[8], 2f32.powf(-0.5));
        assert_eq!(twelve[11], 2f32.powf(-3.5));
        assert!(alibi_standard_slopes(0).is_empty());
    }

    #[test]
    fn alibi_is_minus_slope_times_the_distance_from_the_bottom_right_diagonal() {
        // seq_q 2, seq_k 5: row 0's diagonal is key 3, row 1's key 4.
        assert_eq!(alibi_bias(0.5, 0, 3, 2, 5), 0.0);
        assert_eq!(alibi_bias(0.5, 0, 0, 2, 5), -1.5);
        assert_eq!(alibi_bias(0.5, 1, 4, 2, 5), 0.0);
        assert_eq!(alibi_bias(0.25, 0, 4, 2, 5), -0.25); // ahead of the diagonal too
    }
}
