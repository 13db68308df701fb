//! What every WGSL generator of the crate shares ([`crate::fma`], [`crate::coop`]): the bindings
//! template, and [`fill`], which puts each generated piece of code at its named hook.

use crate::plan::Variant;

/// Parameters and buffers, shared by every kernel template (hook `{{BINDINGS}}`, filled by
/// [`bindings`]).
pub(crate) const BINDINGS: &str = include_str!("../kernels/bindings.wgsl");

/// The score parameters' members of `struct Params` (`dispatch::Params` has them always; a
/// kernel declares them only where its scores use them, [`Variant::score_mods`], so that the
/// plain and causal kernels are what they were before these features).
const SCORE_PARAMS: &str = "\
    // Sliding window (`Mask::Window`): row i sees keys i + causal_offset - win_left ..=
    // i + causal_offset + win_right, an unbounded side given as seq_q + seq_k.
    win_left: i32,
    win_right: i32,
    // Soft-cap in log2 units (cap·log2(e)) and its inverse: s -> softcap·tanh(s·inv_softcap).
    softcap: f32,
    inv_softcap: f32,
    // ALiBi: the slope of (batch b, query head h) is alibi_slopes[b·alibi_batch_stride + h].
    alibi_batch_stride: u32,
    pad_scores0: u32,
    pad_scores1: u32,
    pad_scores2: u32,
    pad_scores3: u32,
";

/// The ALiBi slopes' binding (f32, natural units), for the kernels with ALiBi.
const ALIBI_BINDING: &str = "\
// ALiBi slopes: [heads_q], or [batch, heads_q] (`Params::alibi_batch_stride`).
@group(0) @binding(7) var<storage, read> alibi_slopes: array<f32>;
";

/// The sequence lengths' binding, and the parameters' block-local copy that `main` fills
/// (`fma::params_copy`), for the kernels of sequences of their own lengths.
const SEQ_LENS_BINDING: &str = "\
// Sequences of their own lengths: seq_lens[2b] and seq_lens[2b + 1] are the queries and keys of
// sequence b. The kernel reads the parameters through P, its copy of the uniform block P_in with
// its sequence's key count and diagonal (seq_k, causal_offset); seq_q and seq_k in P_in are the
// longest sequence's, by which the buffers are laid out.
@group(0) @binding(8) var<storage, read> seq_lens: array<u32>;
var<private> P: Params;
";

/// [`BINDINGS`] for `variant`: the score parameters where its scores use them, the slopes'
/// binding where it has ALiBi, the sequence lengths' where its sequences have their own.
pub(crate) fn bindings(variant: &Variant) -> String {
    let mut extra = String::new();
    if variant.alibi {
        extra.push_str(ALIBI_BINDING);
    }
    if variant.seq_lens {
        extra.push_str(SEQ_LENS_BINDING);
    }
    fill(
        BINDINGS,
        &[
            ("PARAMS_VAR", if variant.seq_lens { "P_in" } else { "P" }),
            ("SCORE_PARAMS", if variant.score_mods() { SCORE_PARAMS } else { "" }),
            ("SCORE_BINDINGS", &extra),
        ],
    )
}

/// `template` with each hook `{{NAME}}` replaced by the code `hooks` gives for `NAME`, in one
/// pass (the code put in is not searched again). Every hook in the template must have code, and
/// every name in `hooks` must be a hook of the template, exactly once: a generator bug otherwise,
/// which the tests that generate every variant would catch.
pub(crate) fn fill(template: &str, hooks: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + hooks.iter().map(|(_, c)| c.len()).sum::<usize>());
    let mut used = vec![false; hooks.len()];
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let len = rest[at..].find("}}").unwrap_or_else(|| panic!("an unclosed hook at `{}`", &rest[at..]));
        let name = &rest[at + 2..at + len];
        let i = hooks
            .iter()
            .position(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no code for the hook {{{{{name}}}}}"));
        assert!(!used[i], "the hook {{{{{name}}}}} occurs more than once");
        used[i] = true;
        out.push_str(hooks[i].1);
        rest = &rest[at + len + 2..];
    }
    out.push_str(rest);
    if let Some(i) = used.iter().position(|u| !u) {
        panic!("no hook {{{{{}}}}} in the template", hooks[i].0);
    }
    out
}

/// The names of `template`'s hooks, in order.
#[cfg(test)]
pub(crate) fn hooks(template: &str) -> Vec<&str> {
    template.split("{{").skip(1).map(|s| s.split_once("}}").expect("a closed hook").0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every template's hooks occur once each (and `fill` enforces it for every generated
    /// variant).
    #[test]
    fn every_hook_occurs_once() {
        for (name, template) in [
            ("flash.wgsl", include_str!("../kernels/flash.wgsl")),
            ("fma_block.wgsl", include_str!("../kernels/fma_block.wgsl")),
            ("flash_coop.wgsl", include_str!("../kernels/flash_coop.wgsl")),
            ("bindings.wgsl", BINDINGS),
            ("loads.wgsl", include_str!("../kernels/loads.wgsl")),
            ("stage_q.wgsl", include_str!("../kernels/stage_q.wgsl")),
        ] {
            let all = hooks(template);
            let mut once = all.clone();
            once.sort();
            once.dedup();
            assert_eq!(once.len(), all.len(), "{name}: a hook occurs twice in {all:?}");
            assert!(
                all.iter().all(|h| !h.is_empty()
                    && h.chars().all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())),
                "{name}: {all:?}"
            );
        }
    }

    #[test]
    fn fill_puts_each_piece_at_its_hook_once() {
        assert_eq!(fill("a {{X}} b {{Y}}", &[("Y", "{{X}}"), ("X", "1")]), "a 1 b {{X}}");
    }

    #[test]
    #[should_panic(expected = "occurs more than once")]
    fn a_hook_twice_is_refused() {
        fill("{{X}} {{X}}", &[("X", "1")]);
    }

    #[test]
    #[should_panic(expected = "no hook {{Y}}")]
    fn code_for_no_hook_is_refused() {
        fill("{{X}}", &[("X", "1"), ("Y", "2")]);
    }

    #[test]
    #[should_panic(expected = "no code for the hook {{Y}}")]
    fn a_hook_without_code_is_refused() {
        fill("{{X}} {{Y}}", &[("X", "1")]);
    }
}
