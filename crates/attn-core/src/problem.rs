//! What an attention call computes: shape, dtype, layout (strides) and parameters.

use crate::sequences::{Alibi, Batching, KvRows, QueryRows};
use crate::{DType, Error, Result};
use std::fmt;

/// The sizes of one attention call.
///
/// `heads_q` query heads share `heads_kv` key/value heads: query head `h` reads key/value head
/// `h / (heads_q / heads_kv)` (grouped-query attention; `heads_kv == 1` is multi-query,
/// `heads_kv == heads_q` plain multi-head).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Shape {
    /// Batch size.
    pub batch: usize,
    /// Query (and output) heads.
    pub heads_q: usize,
    /// Key and value heads; divides `heads_q`.
    pub heads_kv: usize,
    /// Query (and output) sequence length.
    pub seq_q: usize,
    /// Key and value sequence length.
    pub seq_k: usize,
    /// Head dimension of q, k, v and o.
    pub head_dim: usize,
}

impl Shape {
    /// Self-attention shape: `heads_kv = heads_q`, `seq_k = seq_q`.
    pub fn new(batch: usize, heads: usize, seq: usize, head_dim: usize) -> Self {
        Shape { batch, heads_q: heads, heads_kv: heads, seq_q: seq, seq_k: seq, head_dim }
    }

    /// How many query heads share one key/value head.
    pub fn group_size(&self) -> usize {
        self.heads_q / self.heads_kv
    }

    /// The key/value head read by query head `h`.
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group_size()
    }

    fn validate(&self) -> Result<()> {
        for (dim, n) in [
            ("batch", self.batch),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("seq_q", self.seq_q),
            ("seq_k", self.seq_k),
            ("head_dim", self.head_dim),
        ] {
            if n == 0 {
                return Err(Error::EmptyDimension { dim });
            }
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(Error::HeadsNotDivisible { heads_q: self.heads_q, heads_kv: self.heads_kv });
        }
        Ok(())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "B={} Hq={}", self.batch, self.heads_q)?;
        if self.heads_kv != self.heads_q {
            write!(f, " Hkv={}", self.heads_kv)?;
        }
        if self.seq_q == self.seq_k {
            write!(f, " S={}", self.seq_q)?;
        } else {
            write!(f, " Sq={} Sk={}", self.seq_q, self.seq_k)?;
        }
        write!(f, " D={}", self.head_dim)
    }
}

/// Which keys a query row may attend to. Every mask is aligned to the **bottom-right** diagonal
/// (FlashAttention's convention since 2.1): query row `i` sits at key `i + seq_k - seq_q`, so
/// that the last query row meets the last key whatever the lengths. A row that sees no key has
/// output 0 and log-sum-exp `-inf`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mask {
    /// Every query row sees every key.
    #[default]
    None,
    /// Causal: query row `i` sees key `j` iff `j <= i + (seq_k - seq_q)`. With `seq_q > seq_k`
    /// the first `seq_q - seq_k` rows see no key. (PyTorch's `is_causal=True` aligns top-left
    /// instead; the two agree when `seq_q == seq_k`.)
    Causal,
    /// A sliding window (FlashAttention's `window_size=(left, right)`): row `i` sees key `j` iff
    /// `i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right`, a bound of `None` being
    /// unbounded (FlashAttention's -1). `right: Some(0)` is causal with a window of `left` keys
    /// back; `left: None, right: Some(0)` is [`Mask::Causal`] itself. Example, `seq_q = seq_k =
    /// 6`, `left: Some(2), right: Some(0)`: row 4 sees keys 2, 3 and 4.
    Window {
        /// Keys before the diagonal a row sees (`None`: all of them).
        left: Option<usize>,
        /// Keys after the diagonal a row sees (`None`: all of them).
        right: Option<usize>,
    },
}

impl Mask {
    /// The keys query row `row` may see: a range, empty where it sees none.
    pub fn visible_range(self, row: usize, seq_q: usize, seq_k: usize) -> std::ops::Range<usize> {
        // The diagonal's key, `row + seq_k - seq_q`, in signed arithmetic (it may lie before key 0).
        let diagonal = row as i128 + seq_k as i128 - seq_q as i128;
        let (left, right) = match self {
            Mask::None => return 0..seq_k,
            Mask::Causal => (None, Some(0)),
            Mask::Window { left, right } => (left, right),
        };
        let start = left.map_or(0, |l| (diagonal - l as i128).clamp(0, seq_k as i128) as usize);
        let end = right.map_or(seq_k, |r| (diagonal + r as i128 + 1).clamp(0, seq_k as i128) as usize);
        start..end.max(start)
    }

    /// Whether every row's keys start at key 0 (no mask, causal, or a window unbounded on the
    /// left): kernels that walk keys from 0 need no more.
    pub fn is_prefix(self) -> bool {
        !matches!(self, Mask::Window { left: Some(_), .. })
    }
}

/// The common memory orders, turned into [`Strides`] by [`Layout::strides`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Layout {
    /// `[batch, heads, seq, head_dim]`, contiguous (PyTorch's SDPA order).
    Bhsd,
    /// `[batch, seq, heads, head_dim]`, contiguous (FlashAttention's order; what a fused QKV
    /// projection produces).
    Bshd,
}

impl Layout {
    /// Contiguous strides of this layout for a tensor of `heads` heads and `seq` rows.
    pub fn strides(self, heads: usize, seq: usize, head_dim: usize) -> Strides {
        match self {
            Layout::Bhsd => Strides { batch: heads * seq * head_dim, head: seq * head_dim, seq: head_dim },
            Layout::Bshd => Strides { batch: seq * heads * head_dim, head: head_dim, seq: heads * head_dim },
        }
    }
}

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "bhsd" => Ok(Layout::Bhsd),
            "bshd" => Ok(Layout::Bshd),
            other => Err(format!("unknown layout `{other}`; use bhsd or bshd")),
        }
    }
}

/// Element strides of a 4-d tensor `[batch, head, seq, dim]`. The `dim` stride is always 1:
/// each row of `head_dim` elements is contiguous, which every backend's vector loads rely on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Strides {
    /// Elements between consecutive batches.
    pub batch: usize,
    /// Elements between consecutive heads.
    pub head: usize,
    /// Elements between consecutive sequence positions.
    pub seq: usize,
}

impl Strides {
    /// The element offset of row `(b, h, s)`.
    #[inline(always)]
    pub fn offset(&self, b: usize, h: usize, s: usize) -> usize {
        b * self.batch + h * self.head + s * self.seq
    }

    /// The smallest slice length that holds a `[batch, heads, seq, dim]` tensor with these strides
    /// (0 for an empty one). The sizes must be a validated problem's ([`Problem::validate`]
    /// bounds every offset).
    pub fn required_len(&self, batch: usize, heads: usize, seq: usize, dim: usize) -> usize {
        if batch == 0 || heads == 0 || seq == 0 || dim == 0 {
            return 0;
        }
        self.offset(batch - 1, heads - 1, seq - 1) + dim
    }

    /// Whether no two elements of a `[batch, heads, seq, dim]` tensor share an address.
    /// Outputs must have this; inputs may alias (e.g. a broadcast batch stride of 0).
    pub fn is_non_overlapping(&self, batch: usize, heads: usize, seq: usize, dim: usize) -> bool {
        let mut axes = [(1usize, dim), (self.seq, seq), (self.head, heads), (self.batch, batch)];
        axes.sort_unstable_by_key(|&(stride, _)| stride);
        let mut span = 1; // elements covered by the axes already placed
        for (stride, extent) in axes {
            if extent == 1 {
                continue;
            }
            if stride < span {
                return false;
            }
            span += stride * (extent - 1);
        }
        true
    }
}

impl fmt::Display for Strides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[batch {}, head {}, seq {}, dim 1]", self.batch, self.head, self.seq)
    }
}

/// A feature beyond a dense batch under no mask or a causal one, as [`Problem::features`] lists
/// them and backends declare which they run ([`Problem::require_features`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Feature {
    /// [`Mask::Window`].
    Window,
    /// [`Params::softcap`].
    Softcap,
    /// [`Params::alibi`].
    Alibi,
    /// [`QueryRows::Packed`].
    PackedQueries,
    /// [`KvRows::Packed`].
    PackedKeys,
    /// [`KvRows::Paged`].
    PagedKv,
    /// [`Batching::keys_used`].
    KeysUsed,
}

impl Feature {
    /// Every feature, for a kernel that runs them all.
    pub const ALL: [Feature; 7] = [
        Feature::Window,
        Feature::Softcap,
        Feature::Alibi,
        Feature::PackedQueries,
        Feature::PackedKeys,
        Feature::PagedKv,
        Feature::KeysUsed,
    ];

    /// The feature's name in messages and the README's feature table.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Window => "sliding window",
            Feature::Softcap => "soft-cap",
            Feature::Alibi => "ALiBi",
            Feature::PackedQueries => "packed (varlen) queries",
            Feature::PackedKeys => "packed (varlen) keys",
            Feature::PagedKv => "paged KV cache",
            Feature::KeysUsed => "per-sequence key counts (seqused_k)",
        }
    }
}

/// Options of the computation.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Params {
    /// Multiplies q·k before the softmax; `None` means `1/sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Which keys each query row sees.
    pub mask: Mask,
    /// Caps the scaled scores before the softmax at `±cap`: `s -> cap · tanh(s / cap)`
    /// (Gemma 2's logit soft-capping, FlashAttention's `softcap`); `None` leaves them. Must be
    /// finite and positive.
    pub softcap: Option<f32>,
    /// Adds ALiBi's linear bias `-slope · |i + seq_k - seq_q - j|` to each scaled (and capped)
    /// score ([`crate::sequences::alibi_bias`]), with slopes given as data
    /// ([`crate::Extras::alibi_slopes`]) in the shape this names; `None`: no bias.
    pub alibi: Option<Alibi>,
    /// Whether to write the log-sum-exp of each row's scaled scores (f32, `[batch, heads_q,
    /// seq_q]` contiguous, or `[heads_q, total]` for packed queries; natural log). Training needs it for the backward pass, split-KV needs
    /// it to merge partial results.
    pub return_lse: bool,
}

/// The strides of the four tensors of a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct TensorStrides {
    /// Query, `[batch, heads_q, seq_q, head_dim]`.
    pub q: Strides,
    /// Key, `[batch, heads_kv, seq_k, head_dim]`.
    pub k: Strides,
    /// Value, `[batch, heads_kv, seq_k, head_dim]`.
    pub v: Strides,
    /// Output, `[batch, heads_q, seq_q, head_dim]`.
    pub o: Strides,
}

/// One attention call, fully described: `o = softmax(scale · q kᵀ + mask) v` per (batch, head).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Problem {
    /// Sizes.
    pub shape: Shape,
    /// Element type of q, k, v and o.
    pub dtype: DType,
    /// Scale, mask, LSE output.
    pub params: Params,
    /// Memory layout of each tensor.
    pub strides: TensorStrides,
    /// Where each sequence's rows are: dense (the default), packed, paged
    /// ([`crate::sequences`]).
    pub batching: Batching,
}

impl Problem {
    /// A problem in [`Layout::Bhsd`] with default parameters (no mask, default scale, no LSE).
    pub fn new(shape: Shape, dtype: DType) -> Self {
        let mut p = Problem {
            shape,
            dtype,
            params: Params::default(),
            strides: TensorStrides {
                q: Strides { batch: 0, head: 0, seq: 0 },
                k: Strides { batch: 0, head: 0, seq: 0 },
                v: Strides { batch: 0, head: 0, seq: 0 },
                o: Strides { batch: 0, head: 0, seq: 0 },
            },
            batching: Batching::default(),
        };
        p = p.with_layout(Layout::Bhsd);
        p
    }

    /// Gives all four tensors the contiguous strides of `layout`.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        let s = self.shape;
        let q = layout.strides(s.heads_q, s.seq_q, s.head_dim);
        let kv = layout.strides(s.heads_kv, s.seq_k, s.head_dim);
        self.strides = TensorStrides { q, k: kv, v: kv, o: q };
        self
    }

    /// Sets explicit strides (e.g. views into a larger buffer).
    pub fn with_strides(mut self, strides: TensorStrides) -> Self {
        self.strides = strides;
        self
    }

    /// Sets a sliding window ([`Mask::Window`]): `left` keys before the bottom-right diagonal
    /// and `right` after it, `None` unbounded.
    pub fn with_window(self, left: Option<usize>, right: Option<usize>) -> Self {
        self.with_mask(Mask::Window { left, right })
    }

    /// Sets the score soft-cap ([`Params::softcap`]).
    pub fn with_softcap(mut self, cap: f32) -> Self {
        self.params.softcap = Some(cap);
        self
    }

    /// Sets ALiBi slopes of the given shape ([`Params::alibi`]); the slopes themselves go in
    /// [`crate::Extras::alibi_slopes`].
    pub fn with_alibi(mut self, alibi: Alibi) -> Self {
        self.params.alibi = Some(alibi);
        self
    }

    /// Sets where each sequence's rows are ([`Batching`]). The strides keep their meaning per
    /// row; see [`QueryRows`] and [`KvRows`] for what the batch stride becomes.
    pub fn with_batching(mut self, batching: Batching) -> Self {
        self.batching = batching;
        self
    }

    /// [`Problem::require_features`] with none supported: for backends whose kernels take dense
    /// batches with no mask or a causal one only.
    pub fn require_plain_scores(&self, backend: &str) -> Result<()> {
        self.require_features(backend, &[])
    }

    /// The features beyond a dense, plain or causal softmax that this problem asks for.
    pub fn features(&self) -> Vec<Feature> {
        let b = self.batching;
        [
            (Feature::Window, matches!(self.params.mask, Mask::Window { .. })),
            (Feature::Softcap, self.params.softcap.is_some()),
            (Feature::Alibi, self.params.alibi.is_some()),
            (Feature::PackedQueries, matches!(b.q, QueryRows::Packed { .. })),
            (Feature::PackedKeys, matches!(b.kv, KvRows::Packed { .. })),
            (Feature::PagedKv, matches!(b.kv, KvRows::Paged { .. })),
            (Feature::KeysUsed, b.keys_used),
        ]
        .into_iter()
        .filter_map(|(f, on)| on.then_some(f))
        .collect()
    }

    /// The typed error, naming `backend`, for a problem that asks for a [`Feature`] outside
    /// `supported`; `Ok` when it asks for none.
    pub fn require_features(&self, backend: &str, supported: &[Feature]) -> Result<()> {
        let missing: Vec<&str> =
            self.features().into_iter().filter(|f| !supported.contains(f)).map(Feature::name).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let takes = match supported {
            [] => "dense batches with no mask or a causal one".to_string(),
            some => some.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
        };
        Err(Error::Unsupported {
            backend: backend.into(),
            what: format!(
                "{self}: {} not supported by this backend yet (it takes: {takes}); cpu-flash and \
                 cpu-reference run every feature",
                missing.join(", ")
            ),
        })
    }

    /// Sets the mask.
    pub fn with_mask(mut self, mask: Mask) -> Self {
        self.params.mask = mask;
        self
    }

    /// Sets causal masking (bottom-right aligned).
    pub fn causal(self) -> Self {
        self.with_mask(Mask::Causal)
    }

    /// Sets an explicit softmax scale.
    pub fn with_scale(mut self, scale: f32) -> Self {
        self.params.scale = Some(scale);
        self
    }

    /// Asks for the log-sum-exp output.
    pub fn with_lse(mut self, on: bool) -> Self {
        self.params.return_lse = on;
        self
    }

    /// The softmax scale in effect.
    pub fn scale(&self) -> f32 {
        self.params.scale.unwrap_or(1.0 / (self.shape.head_dim as f32).sqrt())
    }

    /// Whether the mask is causal.
    pub fn is_causal(&self) -> bool {
        self.params.mask == Mask::Causal
    }

    /// Floating-point operations by the FlashAttention convention: `4·B·H·Sq·Sk·D`, halved for
    /// causal. Used for every TFLOP/s figure attn prints, so that ours compare with peers'.
    ///
    /// The halving applies to the square causal case, as the convention has it; under any other
    /// mask (a causal one with `seq_q != seq_k`, a window) the FLOPs are counted over the
    /// (query, key) pairs the mask lets through.
    ///
    /// The sizes are the shape's: for sequences of different lengths ([`Batching`]) that is the
    /// longest of each; [`crate::SeqMap::flops`] counts each sequence's own pairs.
    pub fn flops(&self) -> f64 {
        let s = self.shape;
        let per_pair = 4.0 * (s.batch * s.heads_q) as f64 * s.head_dim as f64;
        match self.params.mask {
            Mask::None => per_pair * s.seq_q as f64 * s.seq_k as f64,
            Mask::Causal if s.seq_q == s.seq_k => per_pair * s.seq_q as f64 * s.seq_k as f64 / 2.0,
            mask => {
                let pairs: usize = (0..s.seq_q).map(|i| mask.visible_range(i, s.seq_q, s.seq_k).len()).sum();
                per_pair * pairs as f64
            }
        }
    }

    /// Per tensor (q, k, v, o): the (batch or page, heads, rows) its strides address. Dense
    /// tensors are `[batch, heads, seq]`; packed ones one "batch" of `total` rows; a paged cache
    /// `pages` of `page_size` rows.
    pub(crate) fn extents(&self) -> [(usize, usize, usize); 4] {
        let s = self.shape;
        let q = match self.batching.q {
            QueryRows::Dense => (s.batch, s.heads_q, s.seq_q),
            QueryRows::Packed { total } => (1, s.heads_q, total),
        };
        let kv = match self.batching.kv {
            KvRows::Dense => (s.batch, s.heads_kv, s.seq_k),
            KvRows::Packed { total } => (1, s.heads_kv, total),
            KvRows::Paged { page_size, pages, .. } => (pages, s.heads_kv, page_size),
        };
        [q, kv, kv, q]
    }

    /// The (batch, heads, rows) the output's strides address: `[batch, heads_q, seq_q]`, or one
    /// batch of the packed total. Rows of packed outputs that no sequence covers are in it.
    pub fn output_extent(&self) -> (usize, usize, usize) {
        self.extents()[3]
    }

    /// Elements (not bytes) each tensor's slice must hold at least.
    pub fn required_lens(&self) -> [(&'static str, usize); 4] {
        let t = self.strides;
        let [q, k, v, o] = self.extents();
        let len = |st: Strides, (n, heads, rows): (usize, usize, usize)| {
            st.required_len(n, heads, rows, self.shape.head_dim)
        };
        [("q", len(t.q, q)), ("k", len(t.k, k)), ("v", len(t.v, v)), ("o", len(t.o, o))]
    }

    /// Bytes of q, k, v and o (as their strides lay them out) and of the LSE when asked for:
    /// the memory one call's tensors take. Exact in `u128`, whatever the sizes.
    pub fn bytes(&self) -> u128 {
        let lse = if self.params.return_lse { 4 * self.spans()[4] } else { 0 };
        self.spans()[..4].iter().map(|e| e * self.dtype.size() as u128).sum::<u128>() + lse
    }

    /// Elements of q, k, v, o (last element's offset + 1, as [`Problem::required_lens`]) and the
    /// LSE, in `u128` so that no size overflows. Every extent is at least 1 (validated first).
    fn spans(&self) -> [u128; 5] {
        let t = self.strides;
        let span = |st: Strides, (n, heads, rows): (usize, usize, usize)| {
            let last = |n: usize, stride: usize| (n as u128 - 1) * stride as u128;
            last(n, st.batch) + last(heads, st.head) + last(rows, st.seq) + self.shape.head_dim as u128
        };
        let [q, k, v, o] = self.extents();
        [
            span(t.q, q),
            span(t.k, k),
            span(t.v, v),
            span(t.o, o),
            self.lse_rows() as u128 * self.shape.heads_q as u128,
        ]
    }

    /// Query rows per head: `batch · seq_q`, or the packed total.
    fn lse_rows(&self) -> usize {
        match self.batching.q {
            QueryRows::Dense => self.shape.batch.saturating_mul(self.shape.seq_q),
            QueryRows::Packed { total } => total,
        }
    }

    /// Every tensor's bytes fit one allocation (`isize::MAX`), so that sizes computed in
    /// `usize` later cannot overflow.
    fn check_sizes(&self) -> Result<()> {
        let names = ["q", "k", "v", "o", "lse"];
        let sizes = [self.dtype.size() as u128; 4].into_iter().chain([4]);
        for ((name, elems), size) in names.into_iter().zip(self.spans()).zip(sizes) {
            let bytes = elems * size;
            if bytes > isize::MAX as u128 {
                return Err(Error::TooLarge {
                    what: format!(
                        "tensor `{name}` of {self} spans {elems} elements ({bytes} bytes), past the {} bytes one allocation can hold",
                        isize::MAX
                    ),
                });
            }
        }
        Ok(())
    }

    /// Length of the LSE output: `batch · heads_q · seq_q` (`[batch, heads_q, seq_q]`), or
    /// `heads_q · total` for packed queries (`[heads_q, total]`).
    pub fn lse_len(&self) -> usize {
        self.shape.heads_q * self.lse_rows()
    }

    /// The sizes of [`Batching`] that need no data to check: packed totals and pages not empty,
    /// pages that hold `seq_k` keys per sequence.
    fn validate_batching(&self) -> Result<()> {
        let b = self.batching;
        // A packed batch's longest sequence has at most all its rows; a larger bound is no
        // sequence's length, and every backend's work (tasks, a grid) grows with it.
        let longest = |what: &str, len: usize, total: usize| match len <= total {
            true => Ok(()),
            false => Err(Error::InvalidParameter {
                what: format!(
                    "{what} = {len}, the longest sequence's, is more than the {total} packed rows; it is \
                     at most the rows (the longest sequence's length, as FlashAttention's max_seqlen)"
                ),
            }),
        };
        if let QueryRows::Packed { total } = b.q {
            if total == 0 {
                return Err(Error::EmptyDimension { dim: "total_q (packed query rows)" });
            }
            longest("seq_q", self.shape.seq_q, total)?;
        }
        match b.kv {
            KvRows::Dense => {}
            KvRows::Packed { total } => {
                if total == 0 {
                    return Err(Error::EmptyDimension { dim: "total_k (packed key rows)" });
                }
                longest("seq_k", self.shape.seq_k, total)?;
            }
            KvRows::Paged { page_size, pages, pages_per_seq } => {
                for (dim, n) in [("page_size", page_size), ("pages", pages), ("pages_per_seq", pages_per_seq)]
                {
                    if n == 0 {
                        return Err(Error::EmptyDimension { dim });
                    }
                }
                if (page_size as u128) * (pages_per_seq as u128) < self.shape.seq_k as u128 {
                    return Err(Error::InvalidParameter {
                        what: format!(
                            "a paged cache of {pages_per_seq} pages of {page_size} keys per sequence holds \
                             fewer than seq_k = {} keys; seq_k is at most pages_per_seq * page_size",
                            self.shape.seq_k
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Checks everything that does not depend on a backend: non-empty dims, GQA divisibility,
    /// a finite scale, output strides that do not overlap.
    pub fn validate(&self) -> Result<()> {
        self.shape.validate()?;
        self.validate_batching()?;
        self.check_sizes()?;
        if let Some(scale) = self.params.scale
            && !scale.is_finite()
        {
            return Err(Error::NonFiniteScale { scale });
        }
        if let Some(cap) = self.params.softcap
            && !(cap.is_finite() && cap > 0.0)
        {
            return Err(Error::InvalidParameter {
                what: format!("softcap {cap}: it must be a finite positive number (or none)"),
            });
        }
        let (n, heads, rows) = self.extents()[3];
        let d = self.shape.head_dim;
        if !self.strides.o.is_non_overlapping(n, heads, rows, d) {
            return Err(Error::Stride {
                tensor: "o",
                strides: self.strides.o.to_string(),
                what: format!(
                    "output elements would overlap for [batch {n}, heads {heads}, seq {rows}, dim {d}]; \
                     the output needs distinct addresses, e.g. contiguous BHSD or BSHD strides"
                ),
            });
        }
        Ok(())
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.shape, self.dtype)?;
        match self.params.mask {
            Mask::None => {}
            Mask::Causal => f.write_str(" causal")?,
            Mask::Window { left, right } => {
                let bound = |b: Option<usize>| b.map_or("-1".to_string(), |b| b.to_string());
                write!(f, " window=({},{})", bound(left), bound(right))?
            }
        }
        if let Some(cap) = self.params.softcap {
            write!(f, " softcap={cap}")?;
        }
        if let Some(alibi) = self.params.alibi {
            f.write_str(match alibi {
                Alibi::PerHead => " alibi",
                Alibi::PerBatchHead => " alibi(per batch)",
            })?;
        }
        let b = self.batching;
        if let QueryRows::Packed { total } = b.q {
            write!(f, " q-packed({total})")?;
        }
        match b.kv {
            KvRows::Dense => {}
            KvRows::Packed { total } => write!(f, " kv-packed({total})")?,
            KvRows::Paged { page_size, pages, pages_per_seq } => {
                write!(f, " kv-paged({pages}x{page_size}, {pages_per_seq}/seq)")?
            }
        }
        if b.keys_used {
            f.write_str(" seqused_k")?;
        }
        if let Some(scale) = self.params.scale {
            write!(f, " scale={scale}")?;
        }
        if self.params.return_lse {
            f.write_str(" +lse")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_is_bottom_right() {
        let keys = |m: Mask, i, sq, sk| m.visible_range(i, sq, sk);
        // seq_q < seq_k: the last query row sees every key, the first sees seq_k - seq_q + 1.
        assert_eq!(keys(Mask::Causal, 0, 2, 5), 0..4);
        assert_eq!(keys(Mask::Causal, 1, 2, 5), 0..5);
        // seq_q > seq_k: the first seq_q - seq_k rows see nothing.
        assert!(keys(Mask::Causal, 0, 5, 2).is_empty());
        assert!(keys(Mask::Causal, 2, 5, 2).is_empty());
        assert_eq!(keys(Mask::Causal, 3, 5, 2), 0..1);
        assert_eq!(keys(Mask::Causal, 4, 5, 2), 0..2);
        assert_eq!(keys(Mask::None, 0, 5, 2), 0..2);
    }

    #[test]
    fn windows_are_bottom_right_and_clamped() {
        let w = |left, right| Mask::Window { left, right };
        // The documented example: seq 6, (2, 0): row 4 sees keys 2..=4.
        assert_eq!(w(Some(2), Some(0)).visible_range(4, 6, 6), 2..5);
        // (None, Some(0)) is causal, (None, None) is no mask, on every row of odd shapes.
        for (sq, sk) in [(6, 6), (2, 5), (5, 2), (1, 9)] {
            for i in 0..sq {
                assert_eq!(w(None, Some(0)).visible_range(i, sq, sk), Mask::Causal.visible_range(i, sq, sk));
                assert_eq!(w(None, None).visible_range(i, sq, sk), 0..sk);
            }
        }
        // Wider than the sequence: clamped to the keys there are.
        assert_eq!(w(Some(100), Some(100)).visible_range(1, 3, 3), 0..3);
        // seq_q > seq_k: early rows' windows lie before key 0 and see nothing.
        assert!(w(Some(1), Some(0)).visible_range(0, 5, 2).is_empty());
        assert_eq!(w(Some(1), Some(0)).visible_range(4, 5, 2), 0..2);
        // A window ahead of the diagonal only.
        assert_eq!(w(Some(0), Some(2)).visible_range(0, 4, 4), 0..3);
        assert_eq!(w(Some(0), Some(2)).visible_range(3, 4, 4), 3..4);
        assert!(!w(Some(0), None).is_prefix() && w(None, Some(3)).is_prefix() && Mask::Causal.is_prefix());
    }

    #[test]
    fn flops_count_the_pairs_a_mask_lets_through() {
        let p = Problem::new(Shape::new(1, 1, 8, 4), DType::F32);
        assert_eq!(p.flops(), 4.0 * 4.0 * 64.0);
        assert_eq!(p.causal().flops(), 4.0 * 4.0 * 32.0); // the convention's halving
        // seq_q 2, seq_k 8, causal: rows see 7 and 8 keys.
        let q2 = Problem::new(Shape { seq_q: 2, seq_k: 8, ..Shape::new(1, 1, 8, 4) }, DType::F32);
        assert_eq!(q2.causal().flops(), 4.0 * 4.0 * 15.0);
        // A causal window of 2 back: rows see 1, 2, 3, 3, ... keys.
        assert_eq!(p.with_window(Some(2), Some(0)).flops(), 4.0 * 4.0 * (1 + 2 + 3 * 6) as f64);
    }

    #[test]
    fn softcap_must_be_finite_and_positive() {
        let p = Problem::new(Shape::new(1, 1, 8, 4), DType::F32);
        assert!(p.with_softcap(30.0).validate().is_ok());
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = p.with_softcap(bad).validate().unwrap_err().to_string();
            assert!(e.contains("softcap") && e.contains("finite positive"), "{e}");
        }
    }

    #[test]
    fn layouts_have_expected_strides_and_do_not_overlap() {
        let bhsd = Layout::Bhsd.strides(8, 100, 64);
        assert_eq!((bhsd.batch, bhsd.head, bhsd.seq), (8 * 100 * 64, 100 * 64, 64));
        let bshd = Layout::Bshd.strides(8, 100, 64);
        assert_eq!((bshd.batch, bshd.head, bshd.seq), (100 * 8 * 64, 64, 8 * 64));
        for s in [bhsd, bshd] {
            assert!(s.is_non_overlapping(2, 8, 100, 64));
            assert_eq!(s.required_len(2, 8, 100, 64), 2 * 8 * 100 * 64);
        }
        // A seq stride smaller than the row aliases rows.
        let bad = Strides { batch: 6400, head: 800, seq: 32 };
        assert!(!bad.is_non_overlapping(1, 8, 100, 64));
    }

    #[test]
    fn validation_names_the_problem() {
        let e = Problem::new(Shape { heads_kv: 3, ..Shape::new(1, 8, 4, 4) }, DType::F32).validate();
        assert!(matches!(e, Err(Error::HeadsNotDivisible { heads_q: 8, heads_kv: 3 })));
        let e = Problem::new(Shape::new(1, 0, 4, 4), DType::F32).validate();
        assert!(e.unwrap_err().to_string().contains("heads_q"));
        let e = Problem::new(Shape::new(1, 1, 4, 4), DType::F32).with_scale(f32::NAN).validate();
        assert!(matches!(e, Err(Error::NonFiniteScale { .. })));
    }

    #[test]
    fn sizes_past_one_allocation_are_an_error_not_an_overflow() {
        let huge = Shape {
            batch: 1 << 20,
            heads_q: 1 << 20,
            heads_kv: 1 << 20,
            seq_q: 1 << 30,
            seq_k: 1 << 30,
            head_dim: 128,
        };
        let err = Problem::new(huge, DType::Bf16).validate().unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        assert!(err.to_string().contains("tensor `q`"), "{err}");
        // Large but addressable: valid, and its bytes are exact.
        let big = Problem::new(Shape::new(1, 8, 1_000_000_000, 128), DType::Bf16);
        assert!(big.validate().is_ok());
        assert_eq!(big.bytes(), 4 * 8 * 1_000_000_000 * 128 * 2);
    }

    #[test]
    fn a_packed_batchs_longest_sequence_is_at_most_its_rows() {
        let (p, _) = crate::sequences::batch_of(
            Shape::new(2, 2, 1, 8),
            DType::F32,
            &[3, 5],
            &[4, 6],
            crate::sequences::KeyStore::Packed,
        );
        assert!(p.validate().is_ok());
        // A bound past every row: the CPU backend once built 2^40 / 64 tasks a head from it.
        for (seq_q, seq_k, says) in [(1 << 40, 6, "seq_q = 1099511627776"), (5, 11, "seq_k = 11")] {
            let err =
                Problem { shape: Shape { seq_q, seq_k, ..p.shape }, ..p }.validate().unwrap_err().to_string();
            assert!(err.contains(says) && err.contains("packed rows"), "{err}");
        }
        // An empty tensor needs no elements (not an underflow).
        assert_eq!(Layout::Bhsd.strides(2, 8, 4).required_len(0, 2, 8, 4), 0);
    }

    #[test]
    fn flops_follow_the_flashattention_convention() {
        let p = Problem::new(Shape::new(2, 3, 5, 7), DType::F16);
        assert_eq!(p.flops(), 4.0 * 6.0 * 25.0 * 7.0);
        assert_eq!(p.causal().flops(), 2.0 * 6.0 * 25.0 * 7.0);
    }
}
