//! The CPU path's tuning knobs: every `ATTN_CPU_*` variable, read once by
//! [`Options::from_env`] (see `docs/tuning.md`).

use crate::Isa;
use attn_core::{Knob, Result};

/// `ATTN_CPU_ISA`.
const ISA: Knob = Knob {
    name: "ATTN_CPU_ISA",
    allowed: "`avx512` | `avx2` | `portable`",
    default: "the best this CPU supports",
    purpose: "Runs `cpu-flash`'s inner loops compiled for this instruction set, to compare the variants on one machine.",
};

/// `ATTN_CPU_TILES`.
const TILES: Knob = Knob {
    name: "ATTN_CPU_TILES",
    allowed: "`<rows>x<keys>`, e.g. `64x64`",
    default: "the planner's (128 or 64 query rows, 64 keys)",
    purpose: "Pins `cpu-flash`'s tile: query rows per task and keys per step (the plan rejects sizes the micro-kernel cannot tile).",
};

/// Every variable this crate reads.
pub const KNOBS: &[Knob] = &[ISA, TILES];

/// The CPU path's settings from the environment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// The inner loops' instruction set (`ATTN_CPU_ISA`), instead of the best detected one.
    pub isa: Option<Isa>,
    /// Query rows × keys per tile (`ATTN_CPU_TILES`), instead of the planner's.
    pub tiles: Option<(usize, usize)>,
}

impl Options {
    /// Reads every `ATTN_CPU_*` variable; a value that cannot be read is an
    /// [`attn_core::Error::InvalidSetting`].
    pub fn from_env() -> Result<Options> {
        let isa = ISA.choice(&[("avx512", Isa::Avx512), ("avx2", Isa::Avx2), ("portable", Isa::Portable)])?;
        let tiles = TILES.parse(|v| {
            let (m, n) = v.split_once('x')?;
            Some((m.trim().parse().ok()?, n.trim().parse().ok()?))
        })?;
        Ok(Options { isa, tiles })
    }
}
