//! Every `ATTN_*` environment variable this crate reads ([`KNOBS`]), parsed once into
//! [`Options`]. The library reads nothing else from the environment; code generation and
//! planning take the typed values as arguments.

use attn_core::{Knob, Result};
use std::path::PathBuf;

/// Plan as if the adapter had no `SUBGROUP`.
pub const SUBGROUPS: Knob = Knob {
    name: "ATTN_WGPU_SUBGROUPS",
    allowed: "`on` | `off` (`1` | `0`)",
    default: "on: subgroup shuffles where the adapter's subgroups span a query row",
    purpose: "`off` runs the row reductions and probability hand-over through workgroup memory, \
              the path of adapters without subgroups: to verify it on one that has them.",
};
/// Only workgroups of this many query rows.
pub const ROWS: Knob = Knob {
    name: "ATTN_WGPU_ROWS",
    allowed: "`16` | `32` | `64` | `128`",
    default: "the planner's choice (the measured shape, or the most rows that fit)",
    purpose: "Pins the FMA kernel's query rows per workgroup, to time one height against another \
              on a new GPU; a problem no such shape fits is a plan error.",
};
/// Only score micro-tiles of this many 4-key groups.
pub const KEY_GROUPS: Knob = Knob {
    name: "ATTN_WGPU_KEY_GROUPS",
    allowed: "`1` | `2` | `4` (4x4, 4x8, 4x16 micro-tiles)",
    default: "the planner's choice (4x8, or the measured shape's)",
    purpose: "Pins the FMA kernel's score micro-tile width (keys per tile), to time one against \
              another on a new GPU.",
};
/// Only K/V stages of this many head-dim columns.
pub const CHUNK: Knob = Knob {
    name: "ATTN_WGPU_CHUNK",
    allowed: "a multiple of 32 that divides the padded head dim",
    default: "the planner's choice (the widest stage that fits)",
    purpose: "Pins how many head-dim columns of K and V each workgroup-memory stage holds (less \
              memory, more barriers), to time one against another on a new GPU.",
};
/// Only this many invocations per query row.
pub const ROW_THREADS: Knob = Knob {
    name: "ATTN_WGPU_ROW_THREADS",
    allowed: "`4` | `8` | `16`",
    default: "8 (4 only where nothing else fits the adapter)",
    purpose: "Pins the invocations sharing a query row (16 halves each one's registers, 4 doubles \
              them), to time one against another on a new GPU.",
};
/// Plan as if the adapter had at most this much workgroup memory.
pub const WORKGROUP_STORAGE: Knob = Knob {
    name: "ATTN_WGPU_WORKGROUP_STORAGE",
    allowed: "bytes, e.g. `16384`",
    default: "the adapter's `max_compute_workgroup_storage_size`",
    purpose: "Plans as if the adapter had at most this much workgroup memory, to verify and time \
              on a large GPU the shapes a small one gets (e.g. K and V read straight from their \
              buffers at D=256 with WebGPU's 16 KiB).",
};
/// The cooperative-matrix (tensor-core) kernel for f16.
pub const COOP: Knob = Knob {
    name: "ATTN_WGPU_COOP",
    allowed: "`on` | `off` (`1` | `0`)",
    default: "on for NVIDIA adapters (where it passed verification), off elsewhere",
    purpose: "Opens the device with wgpu's experimental cooperative matrices so that f16 runs on \
              them: `on` to try them on another vendor's adapter, `off` for the FMA kernel.",
};
/// naga's run-time guards.
pub const CHECKS: Knob = Knob {
    name: "ATTN_WGPU_CHECKS",
    allowed: "`none` | `bounds` | `all`",
    default: "none (every loop ends and every index is in bounds by construction)",
    purpose: "Compiles the kernels with naga's index clamps (`bounds`) or clamps and loop caps \
              (`all`): a safety net while changing a kernel, at 12% to 2x of its speed.",
};
/// Where the `pipeline_stats` example writes the driver's internal representations.
pub const IR_DIR: Knob = Knob {
    name: "ATTN_WGPU_IR_DIR",
    allowed: "a directory",
    default: "none written",
    purpose: "The `pipeline_stats` example writes there the internal representations the Vulkan \
              driver reports for each kernel, besides its register and spill counts.",
};
/// The crate's tests: a missing adapter fails rather than skips.
pub const REQUIRE_WGPU: Knob = Knob {
    name: "ATTN_REQUIRE_WGPU",
    allowed: "`1` | `0`",
    default: "0: tests that need an adapter print `SKIPPED` without one",
    purpose: "Makes the wgpu tests fail where no adapter opens (set by `cargo xtask test`).",
};

/// Every `ATTN_*` variable this crate (library, examples, tests) reads.
pub const KNOBS: &[Knob] =
    &[SUBGROUPS, ROWS, KEY_GROUPS, CHUNK, ROW_THREADS, WORKGROUP_STORAGE, COOP, CHECKS, IR_DIR, REQUIRE_WGPU];

/// Which of naga's run-time guards the kernels are compiled with ([`CHECKS`]).
///
/// The default is none of them, because both promises they stand in for hold by construction:
/// - every loop ends: its bound is a constant of the variant or a uniform size, never data;
/// - every index is in bounds: workgroup arrays are indexed by loop counters whose limits are
///   the arrays' own dimensions (`kernels/flash.wgsl` spells each out), and storage buffers by
///   rows below `seq_q` (Q and O: each load and store is guarded) times the padded head dim,
///   which is how the planner sizes the buffers; K and V reads (the FMA kernel's) and the
///   cooperative-matrix kernel's matrix loads are not guarded but stay inside the tiles a block
///   sees, within each head's rows, which are padded to whole tiles; the verify suite runs this
///   default;
/// - every integer divisor is non-zero (without checks naga emits plain divisions): the kernel
///   divides only by constants and by head counts and the group size, which
///   `Problem::validate` requires to be positive.
///
/// What they cost on the H100 (f32, D=128; measured, see docs/experiments.md): the loop caps
/// halved the kernel's rate (S=8192: 9.7 TFLOP/s with them, 19.7 without); the index clamps
/// took another 12% (S=4096: 21.5 TFLOP/s with them, 24.5 without).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Checks {
    /// Every guard: indices clamped into their arrays, every loop given an iteration cap.
    All,
    /// Indices still clamped; loops not capped (all of the kernel's loops end by construction).
    NoLoopBounds,
    /// Neither: the generated code is the kernel as written.
    #[default]
    None,
}

impl Checks {
    /// The plan's line for this mode.
    pub fn describe(self) -> &'static str {
        match self {
            Checks::All => {
                "naga run-time checks: all (index clamps, loop iteration caps; ATTN_WGPU_CHECKS=all)"
            }
            Checks::NoLoopBounds => "naga run-time checks: index clamps only (ATTN_WGPU_CHECKS=bounds)",
            Checks::None => "naga run-time checks: none (indices and loops bounded by construction)",
        }
    }

    /// The same for wgpu's shader-module creation.
    pub(crate) fn runtime_checks(self) -> wgpu::ShaderRuntimeChecks {
        let mut c = wgpu::ShaderRuntimeChecks::checked();
        if self != Checks::All {
            c.force_loop_bounding = false;
        }
        if self == Checks::None {
            c.bounds_checks = false;
            c.int_div_checks = false;
        }
        c
    }
}

/// The backend's settings: what [`KNOBS`] say, or what a program sets. `Default` is every
/// variable unset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Plan as if the adapter had no `SUBGROUP` ([`SUBGROUPS`] = `off`).
    pub no_subgroups: bool,
    /// Only FMA-kernel variants with this many query rows per workgroup ([`ROWS`]).
    pub rows: Option<u32>,
    /// Only micro-tiles of this many key groups ([`KEY_GROUPS`]).
    pub key_groups: Option<u32>,
    /// Only K/V stages of this many head-dim columns ([`CHUNK`]).
    pub chunk: Option<u32>,
    /// Only this many invocations per query row ([`ROW_THREADS`]).
    pub row_threads: Option<u32>,
    /// At most this much workgroup memory, bytes ([`WORKGROUP_STORAGE`]).
    pub workgroup_storage: Option<u32>,
    /// Cooperative matrices on (`Some(true)`), off, or by vendor (`None`) ([`COOP`]).
    pub coop: Option<bool>,
    /// naga's run-time guards ([`CHECKS`]).
    pub checks: Checks,
    /// Where the `pipeline_stats` example writes the driver's representations ([`IR_DIR`]).
    pub ir_dir: Option<PathBuf>,
}

impl Options {
    /// Every variable of [`KNOBS`] the library and its examples use, read once; a value outside
    /// what a knob allows is an [`attn_core::Error::InvalidSetting`] naming it.
    pub fn from_env() -> Result<Options> {
        let number =
            |knob: &Knob, ok: &dyn Fn(u32) -> bool| knob.parse(|v| v.parse::<u32>().ok().filter(|n| ok(*n)));
        Ok(Options {
            no_subgroups: SUBGROUPS.on_off()? == Some(false),
            rows: number(&ROWS, &|n| matches!(n, 16 | 32 | 64 | 128))?,
            key_groups: number(&KEY_GROUPS, &|n| matches!(n, 1 | 2 | 4))?,
            chunk: number(&CHUNK, &|n| n > 0 && n.is_multiple_of(32))?,
            row_threads: number(&ROW_THREADS, &|n| matches!(n, 4 | 8 | 16))?,
            workgroup_storage: number(&WORKGROUP_STORAGE, &|n| n > 0)?,
            coop: COOP.on_off()?,
            checks: CHECKS
                .choice(&[("none", Checks::None), ("bounds", Checks::NoLoopBounds), ("all", Checks::All)])?
                .unwrap_or_default(),
            ir_dir: IR_DIR.value().map(PathBuf::from),
        })
    }

    /// Whether the tile pins ([`ROWS`], [`KEY_GROUPS`], [`CHUNK`], [`ROW_THREADS`]) allow
    /// `variant` (the cooperative-matrix kernel has none of these).
    pub(crate) fn allows(&self, variant: &crate::plan::Variant) -> bool {
        if variant.kernel == crate::plan::Kernel::Coop {
            return true;
        }
        self.rows.is_none_or(|r| variant.block_m() == r)
            && self.key_groups.is_none_or(|k| variant.key_groups == k)
            && self.chunk.is_none_or(|c| variant.chunk == c)
            && self.row_threads.is_none_or(|t| variant.row_threads == t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each knob is listed once, and the crate reads no `ATTN_*` variable that is not listed.
    #[test]
    fn knobs_are_complete_and_unique() {
        let names: std::collections::HashSet<_> = KNOBS.iter().map(|k| k.name).collect();
        assert_eq!(names.len(), KNOBS.len());
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut read = std::collections::BTreeSet::new();
        for dir in ["src", "examples", "tests", "kernels"] {
            for entry in std::fs::read_dir(root.join(dir)).into_iter().flatten().flatten() {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                for (i, _) in text.match_indices("ATTN_") {
                    let name: String = text[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if name.len() > "ATTN_".len() && !name.ends_with('_') {
                        read.insert(name);
                    }
                }
            }
        }
        let unlisted: Vec<_> = read.iter().filter(|n| !names.contains(n.as_str())).collect();
        assert!(unlisted.is_empty(), "ATTN_* names in the crate that KNOBS does not list: {unlisted:?}");
    }
}
