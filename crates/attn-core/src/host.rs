//! Host tensors as `ndarray` views: any backend on q, k, v, o (and the log-sum-exp) in
//! FlashAttention's axis order, with the views' own strides.
//!
//! | tensor | type | axes |
//! |---|---|---|
//! | q | [`ArrayView4<T>`] | `[batch, seq_q, heads_q, head_dim]` |
//! | k, v | [`ArrayView4<T>`] | `[batch, seq_k, heads_kv, head_dim]` |
//! | o | [`ArrayViewMut4<T>`] | `[batch, seq_q, heads_q, head_dim]` |
//! | lse | [`ArrayViewMut3<f32>`] | `[batch, heads_q, seq_q]` |
//!
//! `T` is `f32`, `half::f16` or `half::bf16` (any [`Element`]); grouped-query attention follows
//! from the head counts. [`attention_into`] writes into the caller's views and returns the
//! [`Plan`] that ran; [`attention`] allocates the outputs; [`problem`] is the [`Problem`] either
//! one runs, for choosing or planning a backend first; [`gradients`] runs the backward pass.
//!
//! ## Which views are accepted
//! The views' shapes and strides become the problem's [`Shape`] and [`Strides`], so nothing is
//! transposed or packed: a BSHD array, a BHSD array seen through `.permuted_axes([0, 2, 1, 3])`,
//! a slice of a larger array with gaps, and (inputs only) a broadcast with stride 0 all run in
//! place. What every backend needs, and what is therefore required:
//! - q, k, v and o: non-negative strides, and the `head_dim` axis contiguous (stride 1), since
//!   every backend reads and writes rows of `head_dim` elements with vector loads. Anything else
//!   is an [`Error::Stride`]; `.as_standard_layout()` makes a copy that qualifies.
//! - o: no element reachable by two indices ([`Error::Stride`] otherwise; ndarray itself refuses
//!   such a mutable view in debug builds, and [`problem`] checks the same for any view).
//! - lse: the shape above and no element reachable by two indices; any strides otherwise.
//! - The stride of an axis of length 1 is never used; any value is accepted and 0 is recorded.
//!
//! ## Copies
//! None on the host in the common case: the backend gets q, k, v and o where they are. Two
//! cases go through a temporary buffer, then into the view: an lse view that is not contiguous
//! in standard order, and an o view whose memory range (its first to its last element)
//! interleaves with the range of q, k, v or lse, e.g. when all of them are views of one packed
//! buffer. (A GPU backend still copies to its device and back, as its [`Attention::forward`]
//! does for slices.)
//!
//! The slice-based path ([`Problem`], [`Inputs`], [`Outputs`], [`Attention::forward`]) remains
//! the layer underneath: it is what this module calls, what the GPU backends' host-copy path and
//! the `attn` command take, and it describes memory that is not held as an ndarray.

use crate::{
    Attention, Element, Error, Inputs, Layout, Outputs, Params, Plan, Problem, Result, Shape, Strides,
    TensorStrides,
};
use ndarray::{Array3, Array4, ArrayView3, ArrayView4, ArrayViewMut3, ArrayViewMut4};
use std::ops::Range;

/// The problem that [`attention_into`] (with output view `o`) or [`attention`] (with `o = None`:
/// the contiguous `[batch, seq_q, heads_q, head_dim]` array it allocates) runs: the views' sizes
/// and strides with `params`, validated. Hand it to `plan` or to a backend chooser before running.
///
/// Errors: [`Error::Shape`] when k, v or o disagree with q (k and v must be
/// `[batch, seq_k, heads_kv, head_dim]` with q's batch and head_dim, v exactly k's shape, o
/// exactly q's), [`Error::Stride`] for a negative stride, a `head_dim` axis that is not
/// contiguous or an output with overlapping elements, and whatever [`Problem::validate`] finds.
pub fn problem<T: Element>(
    q: &ArrayView4<'_, T>,
    k: &ArrayView4<'_, T>,
    v: &ArrayView4<'_, T>,
    o: Option<&ArrayView4<'_, T>>,
    params: &Params,
) -> Result<Problem> {
    let [batch, seq_q, heads_q, head_dim] = dims(q);
    let [_, seq_k, heads_kv, _] = dims(k);
    let q_dims = [batch, seq_q, heads_q, head_dim];
    let kv_dims = [batch, seq_k, heads_kv, head_dim];
    expect_shape("k", k.shape(), &kv_dims, "[batch, seq_k, heads_kv, head_dim] with q's batch and head_dim")?;
    expect_shape("v", v.shape(), &kv_dims, "the shape of k")?;
    let o_strides = match o {
        Some(o) => {
            expect_shape("o", o.shape(), &q_dims, "the shape of q")?;
            strides_of("o", o.shape(), o.strides())?
        }
        None => Layout::Bshd.strides(heads_q, seq_q, head_dim),
    };
    let strides = TensorStrides {
        q: strides_of("q", q.shape(), q.strides())?,
        k: strides_of("k", k.shape(), k.strides())?,
        v: strides_of("v", v.shape(), v.strides())?,
        o: o_strides,
    };
    let shape = Shape { batch, heads_q, heads_kv, seq_q, seq_k, head_dim };
    let problem = Problem { shape, dtype: T::DTYPE, params: *params, strides, batching: Default::default() };
    problem.validate()?;
    Ok(problem)
}

/// Runs `backend` on ndarray views: `o = softmax(scale · q kᵀ + mask) v` per batch and query
/// head, written into `o` (and the natural-log log-sum-exp of each row's scaled scores into
/// `lse`), in place and with the views' own strides (see the [module docs](self) for what is
/// accepted). Returns the [`Plan`] that ran, as [`Attention::forward`] does; its problem's `o`
/// strides are those of a temporary buffer in the one case the module docs name.
///
/// `params` gives the scale, the mask and whether the log-sum-exp is wanted: `lse` must be
/// `Some` exactly when `params.return_lse` is set. Elements of the arrays behind the views that
/// lie outside `o` and `lse` are never written. Errors are those of [`problem`], an lse view of
/// the wrong shape or with overlapping elements, and the backend's own.
///
/// ```
/// use attn_core::ndarray::{Array4, Axis};
/// use attn_core::{host, Mask, Params};
///
/// // [batch, seq, heads, head_dim]: 2 sequences of 16 tokens, 4 query heads sharing 2 k/v heads.
/// let q = Array4::from_shape_fn((2, 16, 4, 8), |(b, s, h, d)| (b + s + h + d) as f32 * 0.01);
/// let k = Array4::from_shape_fn((2, 16, 2, 8), |(b, s, h, d)| (b * s + h * d) as f32 * 0.01);
/// let v = Array4::from_shape_fn((2, 16, 2, 8), |(_, s, _, d)| (s * 8 + d) as f32);
///
/// // Write into heads 1..5 of a larger output: the other heads stay untouched.
/// let mut out = Array4::from_elem((2, 16, 6, 8), f32::NAN);
/// let o = out.slice_axis_mut(Axis(2), (1..5).into());
/// let params = Params { mask: Mask::Causal, ..Params::default() };
/// let plan = host::attention_into(&attn_cpu::Flash::new(), q.view(), k.view(), v.view(), o, None, &params)?;
///
/// assert_eq!(plan.problem.shape.heads_kv, 2);
/// // Causal: the first query row sees only the first key, so its output is v's first row.
/// assert_eq!(out[[0, 0, 1, 3]], v[[0, 0, 0, 3]]);
/// assert!(out[[0, 0, 0, 3]].is_nan() && out[[0, 0, 5, 3]].is_nan());
/// # Ok::<(), attn_core::Error>(())
/// ```
pub fn attention_into<T: Element>(
    backend: &dyn Attention,
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    mut o: ArrayViewMut4<'_, T>,
    mut lse: Option<ArrayViewMut3<'_, f32>>,
    params: &Params,
) -> Result<Plan> {
    let mut problem = problem(&q, &k, &v, Some(&o.view()), params)?;
    check_lse(lse.as_ref().map(|l| l.view()).as_ref(), &problem)?;
    let [q_len, k_len, v_len, o_len] = problem.required_lens().map(|(_, n)| n);

    // SAFETY (the three `span`s here and the `span_mut` below): `problem` accepted each view,
    // so its strides are non-negative with the head_dim axis at stride 1, and its required
    // length is exactly the view's extent (the offset of its last element plus one). ndarray
    // guarantees that all elements of a view lie in one allocation, alive and borrowed for the
    // view's lifetime; an allocation is contiguous, so the memory between the first and the
    // last element (the gaps of a strided view) lies in it too, and `validate` bounded the span
    // by `isize::MAX` bytes. Each slice borrows its view, so the view is unused while the slice
    // lives. The gaps are never read or written: backends touch only the offsets the problem's
    // strides give, which are the views' own elements (and check the slices' lengths against
    // the problem). The aliasing ruled out below: a gap of o's range that holds elements of q,
    // k, v or lse (views carved from one buffer) would put o's `&mut` slice over their slices,
    // so o then goes through a temporary. The one assumption beyond ndarray's guarantees: no
    // other thread mutates memory in the gaps of q, k, v or o (through another view split off
    // the same array) while this call runs; nothing here accesses it, but the slices cover it.
    let (qs, ks, vs) = unsafe { (span(&q, q_len), span(&k, k_len), span(&v, v_len)) };
    let inputs = Inputs::new(T::data(qs), T::data(ks), T::data(vs));

    let lse_direct = lse.as_ref().filter(|l| l.is_standard_layout());
    let lse_range = lse_direct.map(|l| address_range(l.as_ptr(), l.len()));
    let o_range = address_range(o.as_ptr(), o_len);
    let o_alone = [address_range(qs.as_ptr(), q_len), address_range(ks.as_ptr(), k_len)]
        .into_iter()
        .chain([address_range(vs.as_ptr(), v_len)])
        .chain(lse_range.clone())
        .all(|r| r.end <= o_range.start || o_range.end <= r.start);

    let mut o_temp: Option<Array4<T>> = None;
    let o_out: &mut [T] = if o_alone {
        // SAFETY: as for the spans above; `o_alone` says no other slice here reaches o's range.
        unsafe { span_mut(&mut o, o_len) }
    } else {
        let s = problem.shape;
        problem.strides.o = Layout::Bshd.strides(s.heads_q, s.seq_q, s.head_dim);
        let temp = o_temp.insert(Array4::from_elem(o.raw_dim(), T::from_f32(0.0)));
        temp.as_slice_mut().expect("a new array is contiguous in standard order")
    };
    // The LSE is written in place only where it is contiguous and its range meets none of the
    // inputs' (views carved from one buffer could put it in a gap of q, k or v).
    let lse_alone = lse_range.as_ref().is_some_and(|l| {
        [
            address_range(qs.as_ptr(), q_len),
            address_range(ks.as_ptr(), k_len),
            address_range(vs.as_ptr(), v_len),
        ]
        .iter()
        .all(|r| r.end <= l.start || l.end <= r.start)
    });
    let mut lse_temp: Option<Array3<f32>> = None;
    let lse_out: Option<&mut [f32]> = match lse.as_mut() {
        None => None,
        Some(view) if lse_alone => view.as_slice_mut(),
        Some(view) => lse_temp.insert(Array3::zeros(view.raw_dim())).as_slice_mut(),
    };

    let plan = backend.forward(&problem, inputs, Outputs { o: T::data_mut(o_out), lse: lse_out })?;
    if let Some(temp) = o_temp {
        o.assign(&temp);
    }
    if let (Some(view), Some(temp)) = (lse.as_mut(), lse_temp) {
        view.assign(&temp);
    }
    Ok(plan)
}

/// [`attention_into`] with outputs it allocates: o as a contiguous
/// `[batch, seq_q, heads_q, head_dim]` array of q's dtype, and the log-sum-exp
/// `[batch, heads_q, seq_q]` when `params.return_lse` is set. The problem is validated before
/// anything is allocated.
///
/// ```
/// use attn_core::ndarray::Array4;
/// use attn_core::{host, Params};
///
/// let q = Array4::from_elem((1, 3, 2, 4), 0.5f32);
/// let v = Array4::from_shape_fn((1, 3, 2, 4), |(_, s, _, _)| s as f32);
/// let params = Params { return_lse: true, ..Params::default() };
/// let (o, lse) = host::attention(&attn_cpu::Reference, q.view(), q.view(), v.view(), &params)?;
///
/// // Equal scores: every row averages v's rows (0, 1, 2), and its log-sum-exp is s + ln 3.
/// assert!((o[[0, 1, 0, 0]] - 1.0).abs() < 1e-6);
/// let score = 0.5 * 0.5 * 4.0 / 2.0; // q·k / sqrt(head_dim)
/// assert!((lse.unwrap()[[0, 1, 2]] - (score + 3f32.ln())).abs() < 1e-6);
/// # Ok::<(), attn_core::Error>(())
/// ```
pub fn attention<T: Element>(
    backend: &dyn Attention,
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    params: &Params,
) -> Result<(Array4<T>, Option<Array3<f32>>)> {
    let Shape { batch, heads_q, seq_q, head_dim, .. } = problem(&q, &k, &v, None, params)?.shape;
    let mut o = Array4::from_elem((batch, seq_q, heads_q, head_dim), T::from_f32(0.0));
    let mut lse = params.return_lse.then(|| Array3::zeros((batch, heads_q, seq_q)));
    attention_into(backend, q, k, v, o.view_mut(), lse.as_mut().map(|l| l.view_mut()), params)?;
    Ok((o, lse))
}

/// The backward pass on host arrays ([`crate::backward`]): the gradients of q, k and v for the
/// loss gradient `d_o` of the output `o` that [`attention`] (or any backend's forward) gave with
/// its log-sum-exp `lse` (`[batch, heads_q, seq_q]`). Views of any strides are read through
/// contiguous copies; the gradients come back contiguous in their inputs' shapes. `params` are the
/// forward's (`return_lse` is not needed).
///
/// ```
/// use attn_core::ndarray::Array4;
/// use attn_core::{host, BackwardOptions, Params};
///
/// let q = Array4::from_shape_fn((1, 5, 2, 8), |(_, s, h, d)| (s * 3 + h + d) as f32 * 0.05);
/// let k = Array4::from_shape_fn((1, 5, 1, 8), |(_, s, _, d)| ((s + d) % 4) as f32 * 0.1);
/// let v = Array4::from_shape_fn((1, 5, 1, 8), |(_, s, _, d)| (s * 8 + d) as f32);
/// let params = Params { return_lse: true, ..Params::default() };
/// let (o, lse) = host::attention(&attn_cpu::Flash::new(), q.view(), k.view(), v.view(), &params)?;
/// let d_o = Array4::from_elem(o.raw_dim(), 1.0f32);
/// let (dq, dk, dv) = host::gradients(&attn_cpu::Flash::new(), q.view(), k.view(), v.view(),
///     o.view(), lse.unwrap().view(), d_o.view(), &params, BackwardOptions::default())?;
/// // L = Σ o: every query row's weights sum to 1, so dV sums to the number of rows (2 heads of 5).
/// assert!((dv.sum() - 8.0 * 10.0).abs() < 1e-3);
/// assert_eq!((dq.dim(), dk.dim()), ((1, 5, 2, 8), (1, 5, 1, 8)));
/// # Ok::<(), attn_core::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn gradients<T: Element>(
    backend: &dyn Attention,
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    o: ArrayView4<'_, T>,
    lse: ArrayView3<'_, f32>,
    d_o: ArrayView4<'_, T>,
    params: &Params,
    options: crate::BackwardOptions,
) -> Result<(Array4<T>, Array4<T>, Array4<T>)> {
    let (q, k, v) = (q.as_standard_layout(), k.as_standard_layout(), v.as_standard_layout());
    let (o, d_o, lse) = (o.as_standard_layout(), d_o.as_standard_layout(), lse.as_standard_layout());
    let problem = problem(&q.view(), &k.view(), &v.view(), Some(&o.view()), params)?;
    expect_shape("d_o", d_o.shape(), o.shape(), "the output's shape")?;
    let (mut dq, mut dk, mut dv) = (
        Array4::from_elem(q.raw_dim(), T::from_f32(0.0)),
        Array4::from_elem(k.raw_dim(), T::from_f32(0.0)),
        Array4::from_elem(v.raw_dim(), T::from_f32(0.0)),
    );
    fn data<'a, T: Element>(a: &'a ndarray::CowArray<'_, T, ndarray::Ix4>) -> Option<crate::Data<'a>> {
        a.as_slice().map(T::data)
    }
    let std = "a standard-layout copy is contiguous";
    let inputs = crate::GradInputs {
        inputs: Inputs::new(data(&q).expect(std), data(&k).expect(std), data(&v).expect(std)),
        o: data(&o).expect(std),
        lse: lse.as_slice().expect(std),
        d_o: data(&d_o).expect(std),
    };
    let grads = crate::Gradients {
        dq: T::data_mut(dq.as_slice_mut().expect(std)),
        dk: T::data_mut(dk.as_slice_mut().expect(std)),
        dv: T::data_mut(dv.as_slice_mut().expect(std)),
    };
    backend.backward(&problem, options, inputs, grads)?;
    Ok((dq, dk, dv))
}

/// A view's four axis lengths.
fn dims<T>(a: &ArrayView4<'_, T>) -> [usize; 4] {
    let (b, s, h, d) = a.dim();
    [b, s, h, d]
}

fn expect_shape(tensor: &'static str, found: &[usize], expected: &[usize], rule: &str) -> Result<()> {
    if found == expected {
        return Ok(());
    }
    Err(Error::Shape { tensor, what: format!("has shape {found:?} but must be {expected:?}: {rule}") })
}

/// The [`Strides`] of a `[batch, seq, heads, head_dim]` view, or why it has none.
fn strides_of(tensor: &'static str, shape: &[usize], strides: &[isize]) -> Result<Strides> {
    let error = |what: String| Error::Stride {
        tensor,
        strides: format!("{strides:?} (axes [batch, seq, heads, head_dim], shape {shape:?})"),
        what,
    };
    let allowed = "allowed: non-negative strides with head_dim contiguous (stride 1), any order \
                   of the other axes; `.as_standard_layout()` makes a copy that qualifies";
    if shape.contains(&0) {
        // No element to address: any strides (ndarray reports 0s); the problem's validation
        // names the empty dimension.
        return Ok(Strides { batch: 0, head: 0, seq: 0 });
    }
    let used = |axis: usize| shape[axis] > 1;
    if let Some(axis) = (0..4).find(|&a| used(a) && strides[a] < 0) {
        return Err(error(format!("axis {axis} has a negative stride; {allowed}")));
    }
    if used(3) && strides[3] != 1 {
        return Err(error(format!("the head_dim axis has stride {}; {allowed}", strides[3])));
    }
    let stride = |axis: usize| if used(axis) { strides[axis].unsigned_abs() } else { 0 };
    Ok(Strides { batch: stride(0), seq: stride(1), head: stride(2) })
}

/// That `lse` is given exactly when asked for, has the shape `[batch, heads_q, seq_q]`, and no
/// two indices of it reach one element. (ndarray refuses to make such a mutable view in debug
/// builds; this also covers views built with `from_shape_ptr` in release builds.)
fn check_lse(lse: Option<&ArrayView3<'_, f32>>, problem: &Problem) -> Result<()> {
    let s = problem.shape;
    let expected = [s.batch, s.heads_q, s.seq_q];
    let lse = match (lse, problem.params.return_lse) {
        (None, false) => return Ok(()),
        (Some(lse), true) => lse,
        (None, true) => {
            return Err(Error::Shape {
                tensor: "lse",
                what: format!(
                    "Params::return_lse is set but no lse view was given; pass one of shape \
                     [batch, heads_q, seq_q] = {expected:?}"
                ),
            });
        }
        (Some(_), false) => {
            return Err(Error::Shape {
                tensor: "lse",
                what: "an lse view was given but Params::return_lse is not set".into(),
            });
        }
    };
    expect_shape("lse", lse.shape(), &expected, "[batch, heads_q, seq_q]")?;
    let st = lse.strides();
    let stride = |axis: usize| if expected[axis] > 1 { st[axis].unsigned_abs() } else { 0 };
    let strides = Strides { batch: stride(0), head: stride(1), seq: stride(2) };
    if !strides.is_non_overlapping(s.batch, s.heads_q, s.seq_q, 1) {
        return Err(Error::Stride {
            tensor: "lse",
            strides: format!("{st:?} (axes [batch, heads_q, seq_q])"),
            what: "two indices reach the same element; the log-sum-exp needs one element per row".into(),
        });
    }
    Ok(())
}

/// The `len` elements from `view`'s first one on, as one slice.
///
/// # Safety
/// The view's strides must be non-negative and `len` at most its extent (the offset of its last
/// element plus one).
unsafe fn span<'v, T>(view: &'v ArrayView4<'_, T>, len: usize) -> &'v [T] {
    // SAFETY: the caller's contract; the elements are in the view's allocation and borrowed
    // as long as `view` is.
    unsafe { std::slice::from_raw_parts(view.as_ptr(), len) }
}

/// The `len` elements from `view`'s first one on, as one mutable slice.
///
/// # Safety
/// As [`span`], and no other live reference may reach into that range.
unsafe fn span_mut<'v, T>(view: &'v mut ArrayViewMut4<'_, T>, len: usize) -> &'v mut [T] {
    // SAFETY: the caller's contract; the view is borrowed mutably as long as the slice lives.
    unsafe { std::slice::from_raw_parts_mut(view.as_mut_ptr(), len) }
}

/// The bytes `len` elements from `ptr` on occupy.
fn address_range<T>(ptr: *const T, len: usize) -> Range<usize> {
    let start = ptr as usize;
    start..start + len * size_of::<T>()
}

#[cfg(test)]
mod tests;
