//! What the suite's test files share: the backends this machine has, and whether CI demands wgpu.

use attn_core::{Attention, Availability};

/// Whether CI demands the wgpu backend (`ATTN_REQUIRE_WGPU=1`, set by `cargo xtask test`, which
/// installs lavapipe first): then a missing adapter fails the suite instead of skipping it.
pub fn wgpu_required() -> bool {
    attn_wgpu::options::REQUIRE_WGPU.on_off().expect("ATTN_REQUIRE_WGPU").unwrap_or(false)
}

/// Every backend of the build that is available here; the ones unavailable are named (as
/// `SKIPPED <test> on <backend>`), not silently dropped.
pub fn available(test: &str) -> Vec<Box<dyn Attention>> {
    let mut out = vec![];
    for b in attn::Backend::all().expect("every ATTN_* setting readable") {
        match b.availability() {
            Availability::Available { .. } => out.push(b),
            Availability::Unavailable { reason } if b.name() == "wgpu" && wgpu_required() => {
                panic!("the wgpu backend is required (ATTN_REQUIRE_WGPU=1) but unavailable: {reason}")
            }
            Availability::Unavailable { reason } => eprintln!("SKIPPED {test} on {}: {reason}", b.name()),
        }
    }
    out
}
