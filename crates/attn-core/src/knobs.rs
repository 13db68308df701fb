//! Tuning knobs: the `ATTN_*` environment variables a crate reads.
//!
//! Each crate lists its variables in one table of [`Knob`]s (`KNOBS` in its `options` module)
//! and reads them in one place, once, into a typed options struct; a value it cannot read is
//! an [`Error::InvalidSetting`] that names the variable and what it accepts, never ignored.
//! `docs/tuning.md` holds the tables of every crate, and a test in the `attn` crate checks that
//! it agrees with them.

use crate::{Error, Result};

/// One environment variable a crate reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knob {
    /// The variable, e.g. `ATTN_CUDA_RANK`.
    pub name: &'static str,
    /// What it accepts, for errors and the docs, e.g. `0, 1, 2, ...` or `on | off`.
    pub allowed: &'static str,
    /// What happens when it is unset.
    pub default: &'static str,
    /// What it is for, one sentence.
    pub purpose: &'static str,
}

impl Knob {
    /// The variable's value, trimmed; `None` when unset or empty.
    pub fn value(&self) -> Option<String> {
        let value = std::env::var(self.name).ok()?;
        let value = value.trim();
        (!value.is_empty()).then(|| value.to_string())
    }

    /// The value read by `parse` (`None` when unset); a value `parse` refuses is an
    /// [`Error::InvalidSetting`].
    pub fn parse<T>(&self, parse: impl FnOnce(&str) -> Option<T>) -> Result<Option<T>> {
        match self.value() {
            None => Ok(None),
            Some(value) => parse(&value).map(Some).ok_or_else(|| self.invalid(value)),
        }
    }

    /// `on` / `off` (also `1` / `0`).
    pub fn on_off(&self) -> Result<Option<bool>> {
        self.parse(|v| match v {
            "on" | "1" => Some(true),
            "off" | "0" => Some(false),
            _ => None,
        })
    }

    /// One of `choices`, by name.
    pub fn choice<T: Copy>(&self, choices: &[(&str, T)]) -> Result<Option<T>> {
        self.parse(|v| choices.iter().find(|(name, _)| *name == v).map(|&(_, t)| t))
    }

    /// The error for `value`.
    pub fn invalid(&self, value: impl Into<String>) -> Error {
        Error::InvalidSetting { name: self.name, value: value.into(), allowed: self.allowed }
    }
}

/// The Markdown table of `knobs` (one row each: variable, values, default, purpose), the form
/// `docs/tuning.md` holds for each crate.
pub fn markdown_table(knobs: &[Knob]) -> String {
    let mut out = String::from("| variable | values | default | what it is for |\n|---|---|---|---|\n");
    for k in knobs {
        let cell = |s: &str| s.replace('|', "\\|");
        out +=
            &format!("| `{}` | {} | {} | {} |\n", k.name, cell(k.allowed), cell(k.default), cell(k.purpose));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: Knob =
        Knob { name: "ATTN_CORE_TEST_KNOB", allowed: "on | off", default: "on", purpose: "a test" };

    #[test]
    fn unset_is_none_and_bad_values_name_the_variable() {
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::remove_var(K.name) };
        assert_eq!(K.on_off().unwrap(), None);
        unsafe { std::env::set_var(K.name, " off ") };
        assert_eq!(K.on_off().unwrap(), Some(false));
        unsafe { std::env::set_var(K.name, "maybe") };
        let err = K.on_off().unwrap_err().to_string();
        assert!(err.contains("ATTN_CORE_TEST_KNOB") && err.contains("on | off"), "{err}");
        unsafe { std::env::remove_var(K.name) };
    }

    #[test]
    fn table_escapes_pipes() {
        let table = markdown_table(&[K]);
        assert!(table.contains("| `ATTN_CORE_TEST_KNOB` | on \\| off | on | a test |"), "{table}");
    }
}
