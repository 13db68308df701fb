//! The ndarray route (`attn::host`) against the slice path on the same data: bit-identical
//! outputs and log-sum-exps on cpu-flash and the reference, for every dtype, contiguous BSHD,
//! permuted BHSD and sliced views with gaps, GQA, causal; nothing outside the output views
//! written.

use attn::half::{bf16, f16};
use attn::ndarray::{Array3, Array4, ArrayView4, ArrayViewMut3, ArrayViewMut4, s};
use attn::rng::SplitMix64;
use attn::{Attention, Element, Inputs, Layout, Mask, Outputs, Params, Problem, Shape, host};
use attn_cpu::{Flash, Reference};

/// How a test holds its tensors: the array it owns and the view it hands over.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// A contiguous `[batch, seq, heads, dim]` array.
    Bshd,
    /// A contiguous `[batch, heads, seq, dim]` array seen through `.permuted_axes`.
    Bhsd,
    /// Every second row and some heads of a larger BSHD array.
    Gaps,
}

const FORMS: [Form; 3] = [Form::Bshd, Form::Bhsd, Form::Gaps];

impl Form {
    /// The owned array for a `[b, s, h, d]` view, filled from `fill`.
    fn base<T: Element>(self, [b, s, h, d]: [usize; 4], fill: T) -> Array4<T> {
        let shape = match self {
            Form::Bshd => (b, s, h, d),
            Form::Bhsd => (b, h, s, d),
            Form::Gaps => (b, 2 * s + 1, h + 3, d),
        };
        Array4::from_elem(shape, fill)
    }

    fn view<T>(self, base: &Array4<T>, [_, s, h, _]: [usize; 4]) -> ArrayView4<'_, T> {
        match self {
            Form::Bshd => base.view(),
            Form::Bhsd => base.view().permuted_axes([0, 2, 1, 3]),
            Form::Gaps => base.slice(s![.., 1..2 * s + 1;2, 2..2 + h, ..]),
        }
    }

    fn view_mut<T>(self, base: &mut Array4<T>, [_, s, h, _]: [usize; 4]) -> ArrayViewMut4<'_, T> {
        match self {
            Form::Bshd => base.view_mut(),
            Form::Bhsd => base.view_mut().permuted_axes([0, 2, 1, 3]),
            Form::Gaps => base.slice_mut(s![.., 1..2 * s + 1;2, 2..2 + h, ..]),
        }
    }

    /// The owned array for an lse `[b, h, s]` view and the view: contiguous for the first two
    /// forms, transposed with gaps for the last.
    fn lse_base(self, [b, h, s]: [usize; 3]) -> Array3<f32> {
        match self {
            Form::Bshd | Form::Bhsd => Array3::from_elem((b, h, s), f32::NAN),
            Form::Gaps => Array3::from_elem((s + 1, h + 2, b), f32::NAN),
        }
    }

    fn lse_view(self, base: &mut Array3<f32>, [b, h, s]: [usize; 3]) -> ArrayViewMut3<'_, f32> {
        match self {
            Form::Bshd | Form::Bhsd => base.view_mut(),
            Form::Gaps => base.slice_mut(s![1..s + 1, ..h, ..b]).permuted_axes([2, 1, 0]),
        }
    }
}

/// Values from N(0, 1), rounded to `T`, into every element of `view`'s base array.
fn fill_random<T: Element>(a: &mut Array4<T>, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    a.iter_mut().for_each(|x| *x = T::from_f32(rng.normal() as f32));
}

fn bits<T: Element>(x: T) -> u32 {
    x.to_f32().to_bits()
}

/// o and lse of the slice path on contiguous BSHD copies of the views.
fn slice_path<T: Element>(
    backend: &dyn Attention,
    [q, k, v]: [ArrayView4<'_, T>; 3],
    params: &Params,
) -> (Array4<T>, Option<Array3<f32>>) {
    let (q, k, v) = (q.as_standard_layout(), k.as_standard_layout(), v.as_standard_layout());
    let (b, sq, hq, d) = q.dim();
    let (_, sk, hkv, _) = k.dim();
    let shape = Shape { batch: b, heads_q: hq, heads_kv: hkv, seq_q: sq, seq_k: sk, head_dim: d };
    let problem = Problem { params: *params, ..Problem::new(shape, T::DTYPE).with_layout(Layout::Bshd) };
    let mut o = Array4::from_elem((b, sq, hq, d), T::from_f32(0.0));
    let mut lse = params.return_lse.then(|| Array3::from_elem((b, hq, sq), 0.0f32));
    let inputs = Inputs::new(
        T::data(q.as_slice().unwrap()),
        T::data(k.as_slice().unwrap()),
        T::data(v.as_slice().unwrap()),
    );
    let outputs = Outputs {
        o: T::data_mut(o.as_slice_mut().unwrap()),
        lse: lse.as_mut().map(|l| l.as_slice_mut().unwrap()),
    };
    backend.forward(&problem, inputs, outputs).unwrap();
    (o, lse)
}

/// Runs every form and parameter set on `backend` for dtype `T` and compares with the slice
/// path bit for bit; checks that elements outside the output views keep their NaN.
fn agrees_with_the_slice_path<T: Element>(backend: &dyn Attention) {
    // GQA (4 query heads on 2 k/v heads), seq_q != seq_k, a head_dim that is not a power of 2.
    let (b, sq, sk, hq, hkv, d) = (2, 19, 27, 4, 2, 24);
    let (q_dims, kv_dims) = ([b, sq, hq, d], [b, sk, hkv, d]);
    let param_sets = [
        Params::default(),
        Params { mask: Mask::Causal, return_lse: true, ..Params::default() },
        Params { scale: Some(0.3), return_lse: true, ..Params::default() },
    ];
    for form in FORMS {
        let [mut q, mut k, mut v] = [q_dims, kv_dims, kv_dims].map(|dims| form.base(dims, T::NAN));
        for (seed, a) in [&mut q, &mut k, &mut v].into_iter().enumerate() {
            fill_random(a, seed as u64);
        }
        let views = || [form.view(&q, q_dims), form.view(&k, kv_dims), form.view(&v, kv_dims)];
        for params in &param_sets {
            let case = format!("{} {} {form:?} {params:?}", backend.name(), T::DTYPE);
            let (want_o, want_lse) = slice_path(backend, views(), params);

            let mut o_base = form.base(q_dims, T::NAN);
            let mut lse_base = form.lse_base([b, hq, sq]);
            let o = form.view_mut(&mut o_base, q_dims);
            let lse = params.return_lse.then(|| form.lse_view(&mut lse_base, [b, hq, sq]));
            let [qv, kv, vv] = views();
            let plan = host::attention_into(backend, qv, kv, vv, o, lse, params).unwrap();
            assert_eq!(plan.backend, backend.name());

            let o = form.view(&o_base, q_dims);
            assert!(o.iter().zip(&want_o).all(|(x, y)| bits(*x) == bits(*y)), "{case}: o differs");
            let written = o.len();
            let nan = o_base.iter().filter(|x| x.to_f32().is_nan()).count();
            assert_eq!(nan, o_base.len() - written, "{case}: elements outside the o view were written");
            if let Some(want_lse) = want_lse {
                let mut lse_base = lse_base;
                let lse = form.lse_view(&mut lse_base, [b, hq, sq]);
                assert!(
                    lse.iter().zip(&want_lse).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{case}: lse differs"
                );
                let nan = lse_base.iter().filter(|x| x.is_nan()).count();
                assert_eq!(
                    nan,
                    lse_base.len() - want_lse.len(),
                    "{case}: elements outside the lse view were written"
                );
            } else {
                assert!(lse_base.iter().all(|x| x.is_nan()), "{case}: lse written though not asked for");
            }

            // The allocating form gives the same.
            let [qv, kv, vv] = views();
            let (o, lse) = host::attention(backend, qv, kv, vv, params).unwrap();
            assert!(o.iter().zip(&want_o).all(|(x, y)| bits(*x) == bits(*y)), "{case}: allocated o differs");
            assert_eq!(lse.is_some(), params.return_lse, "{case}");
        }
    }
}

#[test]
fn cpu_flash_on_views_equals_the_slice_path_f32() {
    agrees_with_the_slice_path::<f32>(&Flash::new());
}

#[test]
fn cpu_flash_on_views_equals_the_slice_path_f16() {
    agrees_with_the_slice_path::<f16>(&Flash::new());
}

#[test]
fn cpu_flash_on_views_equals_the_slice_path_bf16() {
    agrees_with_the_slice_path::<bf16>(&Flash::new());
}

#[test]
fn reference_on_views_equals_the_slice_path_every_dtype() {
    agrees_with_the_slice_path::<f32>(&Reference);
    agrees_with_the_slice_path::<f16>(&Reference);
    agrees_with_the_slice_path::<bf16>(&Reference);
}

#[test]
fn packed_qkvo_buffer_runs_through_a_temporary_and_agrees() {
    // q, k, v and o as four head groups of one [batch, seq, 4 * heads, dim] buffer, o written
    // through `multi_slice_mut`: o's memory range holds q, k and v.
    let (b, seq, h, d) = (2, 16, 2, 32);
    let mut packed = Array4::<bf16>::from_elem((b, seq, 4 * h, d), bf16::NAN);
    fill_random(&mut packed, 9);
    let flash = Flash::new();
    let params = Params { mask: Mask::Causal, ..Params::default() };
    let group = |g: usize| s![.., .., g * h..(g + 1) * h, ..];
    let (want, _) = {
        let views = [0, 1, 2].map(|g| packed.slice(group(g)));
        slice_path(&flash, views, &params)
    };
    let kept = packed.slice(s![.., .., ..3 * h, ..]).to_owned();
    let (q, k, v, o) = packed.multi_slice_mut((group(0), group(1), group(2), group(3)));
    let plan = host::attention_into(&flash, q.view(), k.view(), v.view(), o, None, &params).unwrap();
    // The plan that ran wrote a contiguous temporary, not the interleaved view.
    assert_eq!(plan.problem.strides.o, Layout::Bshd.strides(h, seq, d));
    assert_eq!(plan.problem.strides.q.head, d, "q is read in place from the packed buffer");
    assert_eq!(packed.slice(group(3)).map(|x| x.to_bits()), want.map(|x| x.to_bits()));
    assert_eq!(packed.slice(s![.., .., ..3 * h, ..]).map(|x| x.to_bits()), kept.map(|x| x.to_bits()));
}

#[test]
fn the_facade_runs_views_on_the_chosen_backend() {
    let q = Array4::from_shape_fn((1, 8, 2, 16), |(_, s, h, d)| f16::from_f32((s + h + d) as f32 * 0.05));
    let params = Params { return_lse: true, ..Params::default() };
    let (o, lse) = attn::attention(q.view(), q.view(), q.view(), &params).unwrap();
    assert_eq!((o.shape(), lse.unwrap().shape()), (&[1, 8, 2, 16][..], &[1, 2, 8][..]));
    let mut o_view = Array4::from_elem((1, 8, 2, 16), f16::NAN);
    let plan =
        attn::attention_into(q.view(), q.view(), q.view(), o_view.view_mut(), None, &Params::default())
            .unwrap();
    assert!(o_view.iter().all(|x| x.is_finite()), "{}", plan.backend);
}
