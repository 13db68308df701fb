//! Host tensors as typed slices, and the input/output bundles a backend receives.
//!
//! Shapes and strides live in the [`Problem`]; a tensor here is only its elements. The enums let
//! an object-safe trait carry any of the three dtypes without generics.

use crate::{DType, Element, Error, Extras, Problem, Result};
use half::{bf16, f16};

/// Borrowed elements of one tensor.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f16 elements.
    F16(&'a [f16]),
    /// bf16 elements.
    Bf16(&'a [bf16]),
}

/// Mutably borrowed elements of one tensor.
#[derive(Debug)]
pub enum DataMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// f16 elements.
    F16(&'a mut [f16]),
    /// bf16 elements.
    Bf16(&'a mut [bf16]),
}

/// Owned elements of one tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Buffer {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    Bf16(Vec<bf16>),
}

/// Calls a generic expression with the typed slice inside a [`Data`], [`DataMut`] or [`Buffer`]:
/// `with_elements!(data, |s| s.len())`.
#[macro_export]
macro_rules! with_elements {
    ($data:expr, |$s:ident| $body:expr) => {
        match $data {
            $crate::Data::F32($s) => $body,
            $crate::Data::F16($s) => $body,
            $crate::Data::Bf16($s) => $body,
        }
    };
}

impl<'a> Data<'a> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F16(_) => DType::F16,
            Data::Bf16(_) => DType::Bf16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_elements!(self, |s| s.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f32.
    pub fn get_f32(&self, i: usize) -> f32 {
        with_elements!(self, |s| s[i].to_f32())
    }

    /// The slice as `&[T]` if `T` is its element type.
    pub fn typed<T: Element>(self) -> Option<&'a [T]> {
        T::slice(self)
    }
}

impl<'a> DataMut<'a> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            DataMut::F32(_) => DType::F32,
            DataMut::F16(_) => DType::F16,
            DataMut::Bf16(_) => DType::Bf16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            DataMut::F32(s) => s.len(),
            DataMut::F16(s) => s.len(),
            DataMut::Bf16(s) => s.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reborrows as a shorter-lived `DataMut`.
    pub fn reborrow(&mut self) -> DataMut<'_> {
        match self {
            DataMut::F32(s) => DataMut::F32(s),
            DataMut::F16(s) => DataMut::F16(s),
            DataMut::Bf16(s) => DataMut::Bf16(s),
        }
    }

    /// The slice as `&mut [T]` if `T` is its element type.
    pub fn typed<T: Element>(self) -> Option<&'a mut [T]> {
        T::slice_mut(self)
    }

    /// Fills every element with NaN, so that an element a backend forgets to write shows up.
    pub fn poison(&mut self) {
        match self {
            DataMut::F32(s) => s.fill(f32::NAN),
            DataMut::F16(s) => s.fill(f16::NAN),
            DataMut::Bf16(s) => s.fill(bf16::NAN),
        }
    }

    /// Copies the rows of `problem`'s output view ([`Problem::output_extent`]) from `src` (same
    /// dtype and strides); elements in the gaps of a strided view are left untouched.
    pub fn copy_view_from(&mut self, src: Data<'_>, problem: &Problem) -> Result<()> {
        let d = problem.shape.head_dim;
        if self.dtype() != src.dtype() || src.len() < problem.required_lens()[3].1 {
            return self.copy_from(src); // reports the mismatch
        }
        let (batch, heads, rows) = problem.output_extent();
        for b in 0..batch {
            for h in 0..heads {
                for i in 0..rows {
                    let r = problem.strides.o.offset(b, h, i)..problem.strides.o.offset(b, h, i) + d;
                    match (&mut *self, src) {
                        (DataMut::F32(dst), Data::F32(src)) => dst[r.clone()].copy_from_slice(&src[r]),
                        (DataMut::F16(dst), Data::F16(src)) => dst[r.clone()].copy_from_slice(&src[r]),
                        (DataMut::Bf16(dst), Data::Bf16(src)) => dst[r.clone()].copy_from_slice(&src[r]),
                        _ => unreachable!("dtypes compared above"),
                    }
                }
            }
        }
        Ok(())
    }

    /// Rounds `values` into the elements from `offset` on (to nearest, ties to even).
    pub fn store_f32(&mut self, offset: usize, values: &[f32]) {
        fn store<T: Element>(dst: &mut [T], values: &[f32]) {
            dst.iter_mut().zip(values).for_each(|(y, x)| *y = T::from_f32(*x));
        }
        let at = offset..offset + values.len();
        match self {
            DataMut::F32(d) => d[at].copy_from_slice(values),
            DataMut::F16(d) => store(&mut d[at], values),
            DataMut::Bf16(d) => store(&mut d[at], values),
        }
    }

    /// Element-wise copy from a buffer of the same dtype and length.
    pub fn copy_from(&mut self, src: Data<'_>) -> Result<()> {
        match (self, src) {
            (DataMut::F32(d), Data::F32(s)) if d.len() == s.len() => d.copy_from_slice(s),
            (DataMut::F16(d), Data::F16(s)) if d.len() == s.len() => d.copy_from_slice(s),
            (DataMut::Bf16(d), Data::Bf16(s)) if d.len() == s.len() => d.copy_from_slice(s),
            (d, s) => {
                return Err(Error::Shape {
                    tensor: "o",
                    what: format!(
                        "cannot copy {} {} elements into {} {} elements",
                        s.len(),
                        s.dtype(),
                        d.len(),
                        d.dtype()
                    ),
                });
            }
        }
        Ok(())
    }
}

impl Buffer {
    /// `len` elements of `dtype`, all zero.
    pub fn zeros(dtype: DType, len: usize) -> Self {
        Self::from_f32(dtype, std::iter::repeat_n(0.0, len))
    }

    /// Rounds f32 values into a buffer of `dtype`.
    pub fn from_f32(dtype: DType, values: impl IntoIterator<Item = f32>) -> Self {
        let it = values.into_iter();
        match dtype {
            DType::F32 => Buffer::F32(it.collect()),
            DType::F16 => Buffer::F16(it.map(f16::from_f32).collect()),
            DType::Bf16 => Buffer::Bf16(it.map(bf16::from_f32).collect()),
        }
    }

    /// Borrows the elements.
    pub fn as_data(&self) -> Data<'_> {
        match self {
            Buffer::F32(v) => Data::F32(v),
            Buffer::F16(v) => Data::F16(v),
            Buffer::Bf16(v) => Data::Bf16(v),
        }
    }

    /// Mutably borrows the elements.
    pub fn as_data_mut(&mut self) -> DataMut<'_> {
        match self {
            Buffer::F32(v) => DataMut::F32(v),
            Buffer::F16(v) => DataMut::F16(v),
            Buffer::Bf16(v) => DataMut::Bf16(v),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.as_data().dtype()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_data().len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All elements widened to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let d = self.as_data();
        (0..d.len()).map(|i| d.get_f32(i)).collect()
    }
}

/// The inputs of a call: q, k, v, and the indices and slopes some problems need.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// Queries.
    pub q: Data<'a>,
    /// Keys.
    pub k: Data<'a>,
    /// Values.
    pub v: Data<'a>,
    /// Sequence offsets, key counts, the block table, ALiBi slopes: each present exactly when
    /// the problem asks for it ([`Problem::check_extras`]).
    pub extras: Extras<'a>,
}

impl<'a> Inputs<'a> {
    /// q, k and v, with no extras (a dense problem without ALiBi).
    pub fn new(q: Data<'a>, k: Data<'a>, v: Data<'a>) -> Self {
        Inputs { q, k, v, extras: Extras::default() }
    }

    /// The same inputs with `extras`.
    pub fn with_extras(self, extras: Extras<'a>) -> Self {
        Inputs { extras, ..self }
    }
}

/// The outputs of a call.
#[derive(Debug)]
pub struct Outputs<'a> {
    /// Attention output, same dtype as the inputs.
    pub o: DataMut<'a>,
    /// Log-sum-exp per (batch, head, query row), `[batch, heads_q, seq_q]` contiguous; required
    /// when the problem asks for it, and must be `None` otherwise.
    pub lse: Option<&'a mut [f32]>,
}

impl Outputs<'_> {
    /// Reborrows for a shorter lifetime.
    pub fn reborrow(&mut self) -> Outputs<'_> {
        Outputs { o: self.o.reborrow(), lse: self.lse.as_deref_mut() }
    }

    /// Fills `o` and `lse` with NaN.
    pub fn poison(&mut self) {
        self.o.poison();
        if let Some(lse) = self.lse.as_deref_mut() {
            lse.fill(f32::NAN);
        }
    }
}

impl Problem {
    /// Checks that the inputs have the problem's dtype, are long enough for its strides, and
    /// carry the extras it needs ([`Problem::check_extras`]).
    pub fn check_inputs(&self, inputs: &Inputs<'_>) -> Result<()> {
        self.validate()?;
        self.check_extras(&inputs.extras)?;
        let lens = self.required_lens();
        for ((name, need), data) in lens.iter().take(3).zip([inputs.q, inputs.k, inputs.v]) {
            check_tensor(self.dtype, name, *need, data.dtype(), data.len())?;
        }
        Ok(())
    }

    /// Checks that the outputs have the problem's dtype, are long enough, and that `lse` is
    /// present exactly when asked for.
    pub fn check_outputs(&self, outputs: &Outputs<'_>) -> Result<()> {
        // The sizes first: the lengths below are computed from them.
        self.validate()?;
        let (name, need) = self.required_lens()[3];
        check_tensor(self.dtype, name, need, outputs.o.dtype(), outputs.o.len())?;
        match (&outputs.lse, self.params.return_lse) {
            (Some(lse), true) if lse.len() != self.lse_len() => Err(Error::Shape {
                tensor: "lse",
                what: format!(
                    "has {} elements; it must have batch*heads_q*seq_q = {}",
                    lse.len(),
                    self.lse_len()
                ),
            }),
            (None, true) => Err(Error::Shape {
                tensor: "lse",
                what: "the problem asks for the log-sum-exp but no lse buffer was given".into(),
            }),
            (Some(_), false) => Err(Error::Shape {
                tensor: "lse",
                what: "an lse buffer was given but the problem does not ask for it (Params::return_lse)"
                    .into(),
            }),
            _ => Ok(()),
        }
    }
}

pub(crate) fn check_tensor(
    expected: DType,
    tensor: &'static str,
    need: usize,
    found: DType,
    len: usize,
) -> Result<()> {
    if found != expected {
        return Err(Error::DTypeMismatch { tensor, expected, found });
    }
    if len < need {
        return Err(Error::Shape {
            tensor,
            what: format!("has {len} elements but its shape and strides reach element {}", need - 1),
        });
    }
    Ok(())
}
