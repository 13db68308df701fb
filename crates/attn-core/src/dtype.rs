//! Element types: f32, f16 and bf16 (the last two from `half`).

use crate::{Data, DataMut};
use half::{bf16, f16};
use std::fmt;

/// The element type of q, k, v and o. Accumulation is always f32 or wider; the log-sum-exp
/// output is always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision (10-bit mantissa, max 65504).
    F16,
    /// bfloat16 (7-bit mantissa, f32's exponent range).
    Bf16,
}

impl DType {
    /// All dtypes, in a stable order.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// Unit roundoff of the format (half an ulp of 1.0): the relative error of one rounding.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => 2f64.powi(-24),
            DType::F16 => 2f64.powi(-11),
            DType::Bf16 => 2f64.powi(-8),
        }
    }

    /// The lowercase name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(DType::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            other => Err(format!("unknown dtype `{other}`; use f32, f16 or bf16")),
        }
    }
}

/// A scalar type attn can read and write. Implemented for `f32`, `half::f16`, `half::bf16`.
pub trait Element: Copy + Send + Sync + 'static + fmt::Debug {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Widens to f32 (exact for all three types).
    fn to_f32(self) -> f32;
    /// Rounds an f32 to this type (round to nearest even).
    fn from_f32(x: f32) -> Self;
    /// A NaN of this type, used to poison outputs before a run.
    const NAN: Self;
    /// The typed slice inside `data`, if it holds this type.
    fn slice(data: Data<'_>) -> Option<&[Self]>;
    /// The typed mutable slice inside `data`, if it holds this type.
    fn slice_mut(data: DataMut<'_>) -> Option<&mut [Self]>;
    /// Borrows `elements` as [`Data`], the inverse of [`Element::slice`].
    fn data(elements: &[Self]) -> Data<'_>;
    /// Borrows `elements` as [`DataMut`], the inverse of [`Element::slice_mut`].
    fn data_mut(elements: &mut [Self]) -> DataMut<'_>;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn slice(data: Data<'_>) -> Option<&[Self]> {
        match data {
            Data::F32(s) => Some(s),
            _ => None,
        }
    }
    fn slice_mut(data: DataMut<'_>) -> Option<&mut [Self]> {
        match data {
            DataMut::F32(s) => Some(s),
            _ => None,
        }
    }
    fn data(elements: &[Self]) -> Data<'_> {
        Data::F32(elements)
    }
    fn data_mut(elements: &mut [Self]) -> DataMut<'_> {
        DataMut::F32(elements)
    }
    const NAN: Self = f32::NAN;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn slice(data: Data<'_>) -> Option<&[Self]> {
        match data {
            Data::F16(s) => Some(s),
            _ => None,
        }
    }
    fn slice_mut(data: DataMut<'_>) -> Option<&mut [Self]> {
        match data {
            DataMut::F16(s) => Some(s),
            _ => None,
        }
    }
    fn data(elements: &[Self]) -> Data<'_> {
        Data::F16(elements)
    }
    fn data_mut(elements: &mut [Self]) -> DataMut<'_> {
        DataMut::F16(elements)
    }
    const NAN: Self = f16::NAN;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
    fn slice(data: Data<'_>) -> Option<&[Self]> {
        match data {
            Data::Bf16(s) => Some(s),
            _ => None,
        }
    }
    fn slice_mut(data: DataMut<'_>) -> Option<&mut [Self]> {
        match data {
            DataMut::Bf16(s) => Some(s),
            _ => None,
        }
    }
    fn data(elements: &[Self]) -> Data<'_> {
        Data::Bf16(elements)
    }
    fn data_mut(elements: &mut [Self]) -> DataMut<'_> {
        DataMut::Bf16(elements)
    }
    const NAN: Self = bf16::NAN;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}
