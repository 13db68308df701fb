//! The one error type of the workspace.

use crate::DType;

/// Everything that can go wrong in attn, from a bad shape to a kernel that does not fit the
/// device. Each message says what was wrong *and* what is allowed, so the user can fix the call
/// without reading our source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A dimension of the problem is zero.
    #[error("dimension `{dim}` is 0; every dimension of an attention problem must be at least 1")]
    EmptyDimension {
        /// Which dimension.
        dim: &'static str,
    },

    /// GQA/MQA needs the query heads to be a multiple of the key/value heads.
    #[error(
        "heads_q = {heads_q} is not a multiple of heads_kv = {heads_kv}; \
         grouped-query attention needs heads_q = g * heads_kv for a whole g (g = 1 is plain MHA)"
    )]
    HeadsNotDivisible {
        /// Query heads.
        heads_q: usize,
        /// Key/value heads.
        heads_kv: usize,
    },

    /// A tensor's shape disagrees with the problem.
    #[error("tensor `{tensor}`: {what}")]
    Shape {
        /// Which tensor (`q`, `k`, `v`, `o`, `lse`).
        tensor: &'static str,
        /// What is wrong and what was expected.
        what: String,
    },

    /// A tensor's strides cannot describe it (out of bounds, overlapping output rows, ...).
    #[error("tensor `{tensor}` strides {strides}: {what}")]
    Stride {
        /// Which tensor.
        tensor: &'static str,
        /// The strides as given.
        strides: String,
        /// What is wrong and what is allowed.
        what: String,
    },

    /// A tensor's element type differs from the problem's.
    #[error(
        "tensor `{tensor}` holds {found} but the problem's dtype is {expected}; q, k, v and o share one dtype"
    )]
    DTypeMismatch {
        /// Which tensor.
        tensor: &'static str,
        /// The problem's dtype.
        expected: DType,
        /// What the tensor holds.
        found: DType,
    },

    /// The softmax scale is NaN or infinite.
    #[error("softmax scale {scale} is not finite; use a finite number (default 1/sqrt(head_dim))")]
    NonFiniteScale {
        /// The scale as given.
        scale: f32,
    },

    /// A parameter of the computation is out of its range (what, and what is allowed).
    #[error("{what}")]
    InvalidParameter {
        /// The parameter, its value and what it must be.
        what: String,
    },

    /// The backend cannot run this head dimension.
    #[error("backend `{backend}` does not support head_dim = {head_dim}; it supports {supported}")]
    UnsupportedHeadDim {
        /// Backend name.
        backend: String,
        /// Requested head dimension.
        head_dim: usize,
        /// A human description of the allowed set.
        supported: String,
    },

    /// The backend cannot run this dtype.
    #[error("backend `{backend}` does not support dtype {dtype}; it supports {supported}")]
    UnsupportedDType {
        /// Backend name.
        backend: String,
        /// Requested dtype.
        dtype: DType,
        /// A human description of the allowed set.
        supported: String,
    },

    /// Some other option the backend cannot honour.
    #[error("backend `{backend}` cannot run this problem: {what}")]
    Unsupported {
        /// Backend name.
        backend: String,
        /// What is missing.
        what: String,
    },

    /// A plan asks for more than the device has. Raised before any launch.
    #[error("plan `{kernel}` exceeds device limit: {resource} needs {needed} but {device} allows {allowed}")]
    OverDeviceLimit {
        /// The kernel variant.
        kernel: String,
        /// The resource (`threads per block`, `shared memory per block`, ...).
        resource: &'static str,
        /// What the plan needs.
        needed: u64,
        /// What the device allows.
        allowed: u64,
        /// The device's name.
        device: String,
    },

    /// The backend cannot run on this machine at all.
    #[error("backend `{backend}` is unavailable: {reason}")]
    Unavailable {
        /// Backend name.
        backend: String,
        /// Why (missing library, no adapter, ...).
        reason: String,
    },

    /// A plan made by one backend was handed to another, or for another problem.
    #[error("plan mismatch: {what}")]
    PlanMismatch {
        /// What differs.
        what: String,
    },

    /// A problem too large for the memory it needs: sizes past what one allocation can address,
    /// or buffers larger than the memory available. Raised before anything is allocated.
    #[error("problem too large: {what}")]
    TooLarge {
        /// What needs how much, and what is available.
        what: String,
    },

    /// An `ATTN_*` environment variable holds a value its crate cannot read. Raised when the
    /// settings are parsed, never ignored.
    #[error("{name}={value:?} is not a valid setting; allowed: {allowed}")]
    InvalidSetting {
        /// The variable.
        name: &'static str,
        /// The value as given.
        value: String,
        /// What the variable accepts.
        allowed: &'static str,
    },

    /// A failure inside a backend (driver call, compiler, device loss), boxed.
    #[error("backend `{backend}` failed: {source}")]
    Backend {
        /// Backend name.
        backend: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// Wraps a backend's own error.
    pub fn backend(
        backend: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Backend { backend: backend.into(), source: source.into() }
    }
}

/// The workspace's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
