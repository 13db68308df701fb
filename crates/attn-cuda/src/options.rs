//! Every `ATTN_*` variable this crate reads ([`KNOBS`]), and [`Options`], the backend's settings
//! parsed from them once: a value that cannot be read is an [`attn_core::Error::InvalidSetting`]
//! when the options are built, never ignored and never left for a later plan to find.
//!
//! The library paths ([`NVRTC_LIB`], [`CUDA_INCLUDE`]) are defined and read where the libraries
//! are looked for (`locate`), and listed here: NVRTC is loaded once per process, before and apart
//! from any backend. The `ATTN_REQUIRE_*` knobs and [`CUOBJDUMP`] are read by the tests only.

use crate::hopper;
pub use crate::locate::{CUDA_INCLUDE, NVRTC_LIB};
use crate::runtime::Lead;
use attn_core::{Knob, Result};

/// A kernel family of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `kernels/flash_fwd.cu`: mma.sync, ldmatrix, cp.async; sm_80 to sm_90.
    Ampere,
    /// `kernels/flash_fwd_sm90.cu`: wgmma, TMA, mbarriers, warp specialization; sm_90 only.
    Hopper,
    /// `kernels/decode.cu`: split-KV decode for short query lengths; sm_80 to sm_90.
    Decode,
}

/// `ATTN_CUDA_FAMILY`.
pub const FAMILY: Knob = Knob {
    name: "ATTN_CUDA_FAMILY",
    allowed: "`ampere` | `hopper` | `decode`",
    default: "the decode family where a GQA group holds at most 64 query rows (heads_q / heads_kv x seq_q), else the Hopper family on compute capability 9.0 where it runs the problem (the plan says why where not), the Ampere/Ada family elsewhere",
    purpose: "Forces one kernel family: the Ampere/Ada kernel on any device it runs on (Hopper too, to compare them), the Hopper kernel or the decode kernel, which then fail to plan what they cannot run instead of falling back. The backward pass follows `ampere` (its mma.sync main pass) and `hopper` (its wgmma one, refused off sm_90); under `decode` it keeps its default.",
};

/// `ATTN_CUDA_DECODE`.
pub const DECODE: Knob = Knob {
    name: "ATTN_CUDA_DECODE",
    allowed: "`on` | `off`",
    default: "`on`: the decode family plans the problems it takes (short query lengths)",
    purpose: "`off` leaves short query lengths to the prefill families, to time them against the decode kernel.",
};

/// `ATTN_CUDA_DECODE_SPLITS`.
pub const DECODE_SPLITS: Knob = Knob {
    name: "ATTN_CUDA_DECODE_SPLITS",
    allowed: "`1`, `2`, ... (at most 128)",
    default: "the fewest splits of the keys within 95% of the best wave efficiency (one where the batch and KV heads fill the device)",
    purpose: "Forces the decode family's split count, to time others or verify the merge on a small problem.",
};

/// `ATTN_CUDA_DECODE_TILES`.
pub const DECODE_TILES: Knob = Knob {
    name: "ATTN_CUDA_DECODE_TILES",
    allowed: "`<keys>:<stages>[:l2]`, e.g. `32:2` or `16:4:l2` (keys per chunk a multiple of 16; `l2`: the 256-byte L2 prefetch hint on K/V copies)",
    default: "the head dim's first configuration that fits the device (`decode::plan::candidates`: 32 keys in 3 stages at D=64, in 2 at D=128 with one row tile, else 16 keys), without the hint (`decode::plan::L2_PREFETCH`)",
    purpose: "Plans the decode kernel with this chunk, ring depth and copy hint, to time others; a shape that does not compile or fit is a plan error.",
};

/// `ATTN_CUDA_DECODE_PERSIST`.
pub const DECODE_PERSIST: Knob = Knob {
    name: "ATTN_CUDA_DECODE_PERSIST",
    allowed: "`on` | `off` | `<ctas>` (1, 2, ...: on, on at most that many CTAs)",
    default: "the persistent form at head dims up to 64 (`decode::plan::PERSISTENT_MAX_HEAD_DIM`, as measured) where a plain, unmasked, one-split problem has more (sequence, KV head) items than the device holds CTAs at once (`decode::plan::persistent`)",
    purpose: "`off` launches one CTA per item, to time the persistent form against it; `on` or a CTA count takes it wherever the variant has it (a small count makes each CTA take many items: the path verification takes on small problems).",
};

/// `ATTN_CUDA_RANK`.
pub const RANK: Knob = Knob {
    name: "ATTN_CUDA_RANK",
    allowed: "`0`, `1`, `2`, ... (past a head dim's last: its last)",
    default: "the first of the head dim's ranked tile configurations that fits the device",
    purpose: "Forces the Ampere/Ada family's tile configuration of this rank (warps, row tiles, keys, stages), to time the ranks against each other or verify each one on a new GPU.",
};

/// `ATTN_CUDA_SM90_TILES`.
pub const SM90_TILES: Knob = Knob {
    name: "ATTN_CUDA_SM90_TILES",
    allowed: "`<keys>:<stages>[:<consumers>]`, e.g. `176:2` or `64:3:3` (keys a multiple of 16 up to 256, 2 to 4 consumer warpgroups)",
    default: "the head dim's measured tiles, longer key tiles for long sequences at D=128 and three consumers for short causal ones",
    purpose: "Plans the Hopper kernel with these tiles (keys per tile, K/V stages, consumer warpgroups; the head dim's consumers unless given), to time others; a shape that does not compile or fit is a plan error.",
};

/// `ATTN_CUDA_SM90_GRID`.
pub const SM90_GRID: Knob = Knob {
    name: "ATTN_CUDA_SM90_GRID",
    allowed: "`1`, `2`, ... (CTAs)",
    default: "one CTA per SM",
    purpose: "Caps the Hopper kernel's persistent grid, so that each CTA computes many tiles and splits: the path that verification takes on a GPU whose SMs outnumber a small problem's tiles.",
};

/// `ATTN_CUDA_SM90_SPLIT`.
pub const SM90_SPLIT: Knob = Knob {
    name: "ATTN_CUDA_SM90_SPLIT",
    allowed: "`on` | `off`",
    default: "`on`: without a mask the tiles past the last whole wave are cut into even runs of key tiles where that gains enough",
    purpose: "`off` hands every tile out whole, to time the split tail against it on a GPU with another SM count.",
};

/// `ATTN_CUDA_SM90_QSLOTS`.
pub const SM90_QSLOTS: Knob = Knob {
    name: "ATTN_CUDA_SM90_QSLOTS",
    allowed: "`1` | `2`",
    default: "`2` at D=128 without a mask, else `1`",
    purpose: "How many Q tiles the Hopper kernel keeps in shared memory (with two, the next piece's Q loads under this one's key tiles): a small measured gain to re-check on another GPU.",
};

/// `ATTN_CUDA_SM90_L2`.
pub const SM90_L2: Knob = Knob {
    name: "ATTN_CUDA_SM90_L2",
    allowed: "`auto` | `none` | `64` | `128` | `256`",
    default: "`auto`: `128` where a row of Q, K, V or O can start off a 32-byte boundary (a head dim of 8 mod 16), else `256`",
    purpose: "The L2 promotion of the Hopper kernel's tensor maps (bytes L2 fetches from memory per miss), to re-time the choice on another GPU.",
};

/// `ATTN_CUDA_SM90_BLOCKS`.
pub const SM90_BLOCKS: Knob = Knob {
    name: "ATTN_CUDA_SM90_BLOCKS",
    allowed: "`bottom` | `top`",
    default: "`bottom` where it applies (causal, D=64 and 128), else `top`",
    purpose: "Lays a causal head's query blocks from its last row (so that the block the sequence leaves short is the one with the fewest keys) or from row 0, to re-check the order on another GPU.",
};

/// `ATTN_CUDA_SM90_TRACE`.
pub const SM90_TRACE: Knob = Knob {
    name: "ATTN_CUDA_SM90_TRACE",
    allowed: "a folder",
    default: "no trace",
    purpose: "Runs a traced build of the Hopper kernel that stamps each piece's steps in SM cycles and writes each prepared problem's last launch there as CSV when it is dropped (`bench/device/trace.py` reads it); the Hopper backward's traced build sums each role's waits per CTA and writes a host-copy call's last run there (`backward-*.csv`, `bench/device/backward_trace.py`): diagnostics, never timed as the kernels.",
};

/// `ATTN_CUDA_SM90_BWD`.
pub const SM90_BWD: Knob = Knob {
    name: "ATTN_CUDA_SM90_BWD",
    allowed: "`<dq>[:<stages>[:<producer registers>[:dv<n>]]]`: `writers`, `planes`, `planes2` (D=128; elsewhere `planes`), `joined` (D=128; elsewhere `writers`) or `red`, 2 or 3 stages of Q and dO, 24 to 56 registers in multiples of 8, dV's product issued after the dS barrier (`dv0`), before dS's stores and the barrier (`dv1`) or between them (`dv2`); e.g. `red:3:24`, `writers:2:40:dv1`",
    default: "each head dim's own form (backward::Variant::own_form): `writers:2:40` at D=64, `planes2:2:40:dv1` at D=128, `red:2:40` at D=256 (where dQ always goes by reductions in two stages), and in the deterministic mode the same with `planes` at D=64 and 128 (backward::Variant::mode_form); a set value is taken as written, its missing parts `2`, `40` and `dv0`",
    purpose: "Builds the Hopper family's backward main pass with dQ added by the writer warps' bulk reduce-adds (a row each, `joined`: a whole row of both warpgroups' parts each, or `planes`: a part each, the accumulator in 64-column planes; `planes2`: the same with two part buffers a warpgroup, so that the MMA warps need not wait for the writer to have read the last part) or by the MMA warps' reductions, this many Q/dO stages and this register split, to time the forms against each other on another GPU (on the H200 `red` was 2-8% slower, 16-33% in the deterministic mode, and a third stage gained nothing: docs/experiments.md); a form that does not fit is a plan error.",
};

/// `ATTN_CUDA_BWD_DQ_COPIES`.
pub const BWD_DQ_COPIES: Knob = Knob {
    name: "ATTN_CUDA_BWD_DQ_COPIES",
    allowed: "`1` to `16`",
    default: "`1` (backward::DETERMINISTIC_DQ_COPIES; more were slower under a causal mask, docs/experiments.md)",
    purpose: "Copies of the f32 dQ accumulator the deterministic backward's key blocks take in turn (each copy's additions ordered by its own counter, the copies summed in order at the end): more copies shorten the chain of waits and take more workspace; the bits differ between counts, never between runs.",
};

/// `ATTN_CUDA_BWD_WALK`.
pub const BWD_WALK: Knob = Knob {
    name: "ATTN_CUDA_BWD_WALK",
    allowed: "`aligned` | `rotated`",
    default: "`rotated` in the deterministic mode, `aligned` in the default one (backward::Walk::default_for; on the H200 rotated was 7-25% faster in the deterministic mode without a mask, 0-2% slower in the default one)",
    purpose: "The order of the Hopper backward main pass's walks over the query blocks where every key block meets every one (no causal mask or window): all from the first, or each key block from its own index (a sequence's key blocks then add to different query blocks' dQ at once, and the deterministic mode's turns come a step apart instead of in a chain from the last key block; there only for a sequence all of whose key blocks fit on the GPU at once, each sequence by its own length). The bits of the deterministic mode's dQ differ between the two, never between runs, nor with the other sequences of a batch; they do with the GPU's SM count for sequences of more key blocks than a smaller GPU's SMs.",
};

/// `ATTN_CUDA_TIMING_LEAD`.
pub const TIMING_LEAD: Knob = Knob {
    name: "ATTN_CUDA_TIMING_LEAD",
    allowed: "`repeat` | `idle` | `hold:<microseconds>`",
    default: "`repeat`",
    purpose: "What runs ahead of each launch a benchmark times: an untimed twin (steady state), nothing (the host's launch is counted, as PyTorch's own timings count it), or a wait (a rested device, faster than steady state).",
};

/// `ATTN_CUOBJDUMP`.
pub const CUOBJDUMP: Knob = Knob {
    name: "ATTN_CUOBJDUMP",
    allowed: "a `cuobjdump` executable",
    default: "the first `cuobjdump` on `PATH`",
    purpose: "Tests: the disassembler that reads every Hopper variant's SASS (`cargo xtask test` sets it to the one it found).",
};

/// `ATTN_REQUIRE_NVRTC`.
pub const REQUIRE_NVRTC: Knob = Knob {
    name: "ATTN_REQUIRE_NVRTC",
    allowed: "`on` | `off` (or `1` | `0`)",
    default: "`off`: tests that need NVRTC (or cuobjdump) print `SKIPPED <test>: <reason>` without it",
    purpose: "Tests: fail instead of skipping where NVRTC or cuobjdump is missing (`cargo xtask test` sets it).",
};

/// `ATTN_REQUIRE_CUDA`.
pub const REQUIRE_CUDA: Knob = Knob {
    name: "ATTN_REQUIRE_CUDA",
    allowed: "`on` | `off` (or `1` | `0`)",
    default: "`off`: tests that need a CUDA device print `SKIPPED <test>: <reason>` without one",
    purpose: "Tests: fail instead of skipping where no CUDA device can be used, on a machine that has one.",
};

/// Every `ATTN_*` variable the crate reads (library, tests and examples), for `docs/tuning.md`.
pub const KNOBS: &[Knob] = &[
    FAMILY,
    DECODE,
    DECODE_SPLITS,
    DECODE_TILES,
    DECODE_PERSIST,
    RANK,
    SM90_TILES,
    SM90_GRID,
    SM90_SPLIT,
    SM90_QSLOTS,
    SM90_L2,
    SM90_BLOCKS,
    SM90_TRACE,
    SM90_BWD,
    BWD_DQ_COPIES,
    BWD_WALK,
    TIMING_LEAD,
    NVRTC_LIB,
    CUDA_INCLUDE,
    CUOBJDUMP,
    REQUIRE_NVRTC,
    REQUIRE_CUDA,
];

/// The backend's settings (`Cuda::with_options`); [`Options::default`] is what an
/// empty environment gives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    /// [`FAMILY`]: a forced family.
    pub family: Option<Family>,
    /// [`RANK`]: a forced tile rank of the Ampere/Ada family.
    pub rank: Option<usize>,
    /// [`DECODE`]: `Some(false)` leaves short query lengths to the prefill families.
    pub decode: Option<bool>,
    /// [`DECODE_SPLITS`], [`DECODE_TILES`], [`DECODE_PERSIST`]: what they force on the decode
    /// family's plan.
    pub decode_forced: crate::decode::plan::Forced,
    /// The Hopper family's settings; any of them set asks for the Hopper family, so that a
    /// problem it cannot run is an error rather than a silent run of the other family.
    pub hopper: hopper::Settings,
    /// [`SM90_BWD`]: how the Hopper family's backward main pass is built.
    pub sm90_backward: Option<crate::backward::Form>,
    /// [`BWD_DQ_COPIES`]: copies of the deterministic backward's dQ accumulator (`None`: the default).
    pub dq_copies: Option<usize>,
    /// [`BWD_WALK`]: the backward main pass's walk (`None`: [`crate::backward::Walk::default_for`] the mode).
    pub walk: Option<crate::backward::Walk>,
    /// [`TIMING_LEAD`]: what runs ahead of a timed launch.
    pub timing_lead: Lead,
}

impl Options {
    /// The options from the environment: every knob of [`KNOBS`] the backend reads, parsed.
    pub fn from_env() -> Result<Options> {
        let tiles = |t: &str| -> Option<hopper::Tiles> {
            let n: Vec<u32> = t.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
            match n[..] {
                [block_n, stages] => Some(hopper::Tiles { block_n: block_n as usize, stages, consumers: 0 }),
                [block_n, stages, consumers] => {
                    Some(hopper::Tiles { block_n: block_n as usize, stages, consumers })
                }
                _ => None,
            }
        };
        Ok(Options {
            family: FAMILY.choice(&[
                ("ampere", Family::Ampere),
                ("hopper", Family::Hopper),
                ("decode", Family::Decode),
            ])?,
            decode: DECODE.on_off()?,
            decode_forced: crate::decode::plan::Forced {
                tiles: DECODE_TILES.parse(|t| {
                    let parts: Vec<&str> = t.split(':').collect();
                    let l2_prefetch = match parts.get(2) {
                        None => false,
                        Some(&"l2") => true,
                        Some(_) => return None,
                    };
                    let block_n: usize =
                        parts.first()?.parse().ok().filter(|n| n % 16 == 0 && *n > 0 && *n <= 64)?;
                    let stages: u32 = parts.get(1)?.parse().ok().filter(|s| (1..=8).contains(s))?;
                    Some(crate::decode::plan::Tiles { block_n, stages, l2_prefetch })
                })?,
                persist: DECODE_PERSIST.parse(|t| {
                    use crate::decode::plan::Persist;
                    match t {
                        "off" => Some(Persist::Off),
                        "on" => Some(Persist::On(u32::MAX)),
                        n => n.parse().ok().filter(|&n: &u32| n > 0).map(Persist::On),
                    }
                })?,
                splits: DECODE_SPLITS.parse(|n| n.parse().ok().filter(|&n: &u32| n > 0))?,
            },
            rank: RANK.parse(|r| r.parse().ok())?,
            hopper: hopper::Settings {
                tiles: SM90_TILES.parse(tiles)?,
                grid: SM90_GRID.parse(|g| g.parse().ok().filter(|&n: &u32| n > 0))?,
                split: SM90_SPLIT.on_off()?,
                q_slots: SM90_QSLOTS.choice(&[("1", 1), ("2", 2)])?,
                bottom: SM90_BLOCKS.choice(&[("bottom", true), ("top", false)])?,
                trace: SM90_TRACE.value().map(Into::into),
                l2: SM90_L2
                    .parse(|v| match v {
                        "auto" => Some(None),
                        _ => hopper::L2Promotion::ALL.into_iter().find(|l| l.name() == v).map(Some),
                    })?
                    .flatten(),
            },
            sm90_backward: SM90_BWD.parse(|v| {
                let parts: Vec<&str> = v.split(':').collect();
                let dq = crate::backward::DqAdd::ALL.iter().find(|(_, name)| *name == parts[0])?.0;
                let stages = match parts.get(1) {
                    None => 2,
                    Some(n) => n.parse().ok().filter(|s| (2..=3).contains(s))?,
                };
                let producer_registers = match parts.get(2) {
                    None => 40,
                    Some(n) => n.parse().ok().filter(|r| (24..=56).contains(r) && r % 8 == 0)?,
                };
                let dv_issue = match parts.get(3) {
                    None => crate::backward::DvIssue::default(),
                    Some(n) => {
                        *crate::backward::DvIssue::ALL.iter().find(|d| **n == format!("dv{}", d.index()))?
                    }
                };
                (parts.len() <= 4).then_some(crate::backward::Form {
                    dq,
                    stages,
                    producer_registers,
                    trace: false,
                    dv_issue,
                })
            })?,
            dq_copies: BWD_DQ_COPIES.parse(|n| n.parse().ok().filter(|n| (1..=16).contains(n)))?,
            walk: BWD_WALK.choice(&[
                ("aligned", crate::backward::Walk::Aligned),
                ("rotated", crate::backward::Walk::Rotated),
            ])?,
            timing_lead: TIMING_LEAD.parse(Lead::parse)?.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_are_distinct_and_described() {
        let mut names: Vec<&str> = KNOBS.iter().map(|k| k.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), KNOBS.len());
        for k in KNOBS {
            assert!(k.name.starts_with("ATTN_"), "{}", k.name);
            assert!(!k.allowed.is_empty() && !k.default.is_empty() && k.purpose.ends_with('.'), "{}", k.name);
        }
    }

    #[test]
    fn every_knob_defined_is_listed_and_none_is_read_around_them() {
        // Every `Knob { name: "ATTN_..." }` in the crate's sources is in KNOBS, and no file reads
        // an ATTN_* variable but through one.
        let sources = [include_str!("options.rs"), include_str!("locate.rs")];
        let defined: Vec<&str> = sources
            .iter()
            .flat_map(|s| s.split("name: \"").skip(1))
            .filter_map(|rest| rest.split('"').next())
            .filter(|name| name.starts_with("ATTN_") && !name.contains('.'))
            .collect();
        let listed: Vec<&str> = KNOBS.iter().map(|k| k.name).collect();
        for name in &defined {
            assert!(listed.contains(name), "{name} is defined but not in KNOBS");
        }
        assert_eq!(defined.len(), listed.len(), "{defined:?}");
        // Every Rust file of the crate (sources, tests, examples), found by walking the folders.
        fn rust_files(dir: &std::path::Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    rust_files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(std::fs::read_to_string(&path).unwrap_or_default());
                }
            }
        }
        let mut others = vec![];
        for dir in ["src", "tests", "examples"] {
            rust_files(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut others);
        }
        assert!(others.len() > 15, "found {} Rust files", others.len());
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        let read = ["env::var(\"ATTN_", "env::var_os(\"ATTN_"];
        assert!(others.iter().all(|s| !read.iter().any(|r| s.contains(r))));
    }

    #[test]
    fn a_value_that_cannot_be_read_names_the_variable() {
        // Only this test sets these variables; nothing else in this binary reads them.
        for (knob, bad) in [
            (SM90_GRID, "0"),
            (SM90_TILES, "128:x"),
            (TIMING_LEAD, "hold:"),
            (FAMILY, "volta"),
            (DECODE_SPLITS, "0"),
            (DECODE, "maybe"),
            (DECODE_TILES, "24:2"),
            (SM90_BWD, "red:4"),
            (SM90_BWD, "red:2:20"),
            (SM90_BWD, "atomics"),
            (SM90_BWD, "red:2:40:x"),
            (SM90_BWD, "red:2:40:dv3"),
            (SM90_BWD, "red:2:40:dv1:x"),
            (BWD_DQ_COPIES, "0"),
            (BWD_DQ_COPIES, "17"),
        ] {
            // SAFETY: see above.
            unsafe { std::env::set_var(knob.name, bad) };
            let err = Options::from_env().unwrap_err();
            unsafe { std::env::remove_var(knob.name) };
            assert!(
                matches!(&err, attn_core::Error::InvalidSetting { name, .. } if *name == knob.name),
                "{err}"
            );
        }
        unsafe { std::env::set_var(SM90_TILES.name, "176:2") };
        let tiles = Options::from_env().map(|o| o.hopper.tiles);
        unsafe { std::env::remove_var(SM90_TILES.name) };
        assert_eq!(tiles.unwrap(), Some(hopper::Tiles { block_n: 176, stages: 2, consumers: 0 }));
        for (value, form) in [
            (
                "red:3:24",
                crate::backward::Form {
                    dq: crate::backward::DqAdd::Reductions,
                    stages: 3,
                    producer_registers: 24,
                    ..Default::default()
                },
            ),
            ("writers", crate::backward::Form::default()),
            (
                "planes:2:40:dv1",
                crate::backward::Form {
                    dq: crate::backward::DqAdd::Planes,
                    dv_issue: crate::backward::DvIssue::BeforeBarrier,
                    ..Default::default()
                },
            ),
            (
                "writers:2:40:dv1",
                crate::backward::Form {
                    dv_issue: crate::backward::DvIssue::BeforeBarrier,
                    ..Default::default()
                },
            ),
            ("red", crate::backward::Form { dq: crate::backward::DqAdd::Reductions, ..Default::default() }),
            ("joined", crate::backward::Form { dq: crate::backward::DqAdd::Joined, ..Default::default() }),
            (
                "planes2:2:40:dv1",
                crate::backward::Form {
                    dq: crate::backward::DqAdd::PlanesTwoBuffers,
                    dv_issue: crate::backward::DvIssue::BeforeBarrier,
                    ..Default::default()
                },
            ),
        ] {
            unsafe { std::env::set_var(SM90_BWD.name, value) };
            let read = Options::from_env().map(|o| o.sm90_backward);
            unsafe { std::env::remove_var(SM90_BWD.name) };
            assert_eq!(read.unwrap(), Some(form), "{value}");
        }
        unsafe { std::env::set_var(BWD_DQ_COPIES.name, "4") };
        let copies = Options::from_env().map(|o| o.dq_copies);
        unsafe { std::env::remove_var(BWD_DQ_COPIES.name) };
        assert_eq!(copies.unwrap(), Some(4));
    }
}
