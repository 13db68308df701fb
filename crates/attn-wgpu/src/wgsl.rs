//! What every WGSL generator of the crate shares ([`crate::fma`], [`crate::coop`]): the bindings
//! template, and [`fill`], which puts each generated piece of code at its named hook.

/// Parameters and buffers, shared by every kernel template (hook `{{BINDINGS}}`).
pub(crate) const BINDINGS: &str = include_str!("../kernels/bindings.wgsl");

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
