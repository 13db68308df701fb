//! The ndarray route with the backend chosen for you: [`attention`] and [`attention_into`] are
//! [`host::attention`] and [`host::attention_into`] on the backend [`Backend::auto`] picks for
//! the views' problem.

use crate::Backend;
use attn_core::ndarray::{Array3, Array4, ArrayView4, ArrayViewMut3, ArrayViewMut4};
use attn_core::{Element, Params, Plan, Result, host};

/// Attention on ndarray views in FlashAttention's order, q `[batch, seq_q, heads_q, head_dim]`,
/// k and v `[batch, seq_k, heads_kv, head_dim]` (any non-negative strides with `head_dim`
/// contiguous; see [`host`]), on the best backend here ([`Backend::auto`], or `ATTN_BACKEND`).
/// Returns o `[batch, seq_q, heads_q, head_dim]` and, when `params.return_lse` is set, the
/// log-sum-exp `[batch, heads_q, seq_q]`.
///
/// The backend is chosen on every call, which probes the devices; to call repeatedly, choose
/// once (`Backend::auto(&host::problem(..)?)?`) and call [`host::attention`] with it.
///
/// ```
/// use attn::ndarray::Array4;
/// use attn::{Mask, Params};
///
/// // 1 sequence of 32 tokens, 4 query heads sharing 2 key/value heads, head_dim 16.
/// let q = Array4::from_shape_fn((1, 32, 4, 16), |(_, s, h, d)| ((s + h + d) % 5) as f32 * 0.1);
/// let k = Array4::from_shape_fn((1, 32, 2, 16), |(_, s, h, d)| ((s * h + d) % 3) as f32 * 0.1);
/// let v = Array4::from_shape_fn((1, 32, 2, 16), |(_, s, _, d)| (s + d) as f32);
///
/// let params = Params { mask: Mask::Causal, return_lse: true, ..Params::default() };
/// let (o, lse) = attn::attention(q.view(), k.view(), v.view(), &params)?;
/// assert_eq!(o.shape(), &[1, 32, 4, 16]);
/// assert_eq!(lse.unwrap().shape(), &[1, 4, 32]);
/// // Causal: the first query row sees only the first key.
/// assert_eq!(o[[0, 0, 3, 5]], v[[0, 0, 1, 5]]);
/// # Ok::<(), attn::Error>(())
/// ```
pub fn attention<T: Element>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    params: &Params,
) -> Result<(Array4<T>, Option<Array3<f32>>)> {
    let backend = Backend::auto(&host::problem(&q, &k, &v, None, params)?)?;
    host::attention(&*backend, q, k, v, params)
}

/// [`attention`] into the caller's views: o `[batch, seq_q, heads_q, head_dim]` and, exactly
/// when `params.return_lse` is set, lse `[batch, heads_q, seq_q]`, in place and with their own
/// strides (see [`host::attention_into`], which this calls). Returns the plan that ran.
pub fn attention_into<T: Element>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    o: ArrayViewMut4<'_, T>,
    lse: Option<ArrayViewMut3<'_, f32>>,
    params: &Params,
) -> Result<Plan> {
    let backend = Backend::auto(&host::problem(&q, &k, &v, Some(&o.view()), params)?)?;
    host::attention_into(&*backend, q, k, v, o, lse, params)
}
