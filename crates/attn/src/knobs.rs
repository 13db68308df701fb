//! Every `ATTN_*` environment variable of the workspace, crate by crate: the tables
//! `attn knobs` prints and `docs/tuning.md` holds (a test keeps the two in agreement).

use attn_core::Knob;

/// One crate's variables.
#[derive(Clone, Copy, Debug)]
pub struct CrateKnobs {
    /// The crate that reads them.
    pub krate: &'static str,
    /// Its variables, in the order its `options` module lists them.
    pub knobs: &'static [Knob],
}

/// Every crate's variables, the facade's first.
pub fn all() -> Vec<CrateKnobs> {
    vec![
        CrateKnobs { krate: "attn", knobs: &[crate::backend::BACKEND] },
        CrateKnobs { krate: "attn-cpu", knobs: attn_cpu::KNOBS },
        CrateKnobs { krate: "attn-cuda", knobs: attn_cuda::KNOBS },
        CrateKnobs { krate: "attn-wgpu", knobs: attn_wgpu::KNOBS },
        CrateKnobs { krate: "attn-verify", knobs: attn_verify::random::KNOBS },
    ]
}

/// The Markdown that `docs/tuning.md` holds between its `<!-- knobs:begin -->` and
/// `<!-- knobs:end -->` lines: a heading and a table per crate.
pub fn markdown() -> String {
    let mut out = String::new();
    for c in all() {
        out += &format!("\n### {}\n\n{}", c.krate, attn_core::knobs::markdown_table(c.knobs));
    }
    out + "\n"
}
