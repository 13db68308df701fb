//! What every WGSL generator of the crate shares ([`crate::fma`], [`crate::coop`]).

/// Parameters and buffers, shared by every kernel template (`{{BINDINGS}}`).
pub(crate) const BINDINGS: &str = include_str!("../kernels/bindings.wgsl");
