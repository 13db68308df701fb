//! The FMA kernel's WGSL: `kernels/flash.wgsl` with one [`Variant`]'s constants substituted and
//! its register-resident code unrolled: the score micro-tile (`Scores`), the K/V staging registers
//! (`Staging`), the row reductions (`Reductions`), the O accumulator (`Output`) and P·V.
//!
//! O lives in `4 · D/(4·TX)` named vec4 variables per invocation rather than an array, so that no
//! driver is tempted to put it in memory that is indexed at run time; the loops that touch it
//! (rescale, P·V per head-dim chunk, store) are unrolled here, in Rust, where the count is known.

use crate::plan::{MICRO, Variant};
use crate::wgsl::{bindings, fill};
use std::fmt::Write;

/// The kernel template.
const TEMPLATE: &str = include_str!("../kernels/flash.wgsl");
/// Guarded Q/K/V loads and vec4 reductions.
const LOADS: &str = include_str!("../kernels/loads.wgsl");
/// The block set-up (hook `BLOCK`: which block, its key tiles, the first K stage's loads, Qᵀ
/// staged).
const FMA_BLOCK: &str = include_str!("../kernels/fma_block.wgsl");
/// Qᵀ staged into workgroup memory (hook `STAGE_Q` of [`FMA_BLOCK`]).
const STAGE_Q: &str = include_str!("../kernels/stage_q.wgsl");

/// Components of a vec4, by row of the micro-tile.
const LANE: [&str; 4] = ["x", "y", "z", "w"];

/// The WGSL source of `variant` (an FMA one), ready for `create_shader_module`.
pub(crate) fn generate(variant: &Variant) -> String {
    debug_assert!(variant.kernel == crate::plan::Kernel::Fma);
    let (et, enable) = match variant.ty {
        crate::plan::KernelType::F32 => ("f32", ""),
        crate::plan::KernelType::F16 => ("f16", "enable f16;"),
    };
    let rows = Reductions::new(variant);
    let scores = Scores::new(variant);
    let out = Output::new(variant);
    let staging = Staging::new(variant);
    // Probabilities travel from the invocation that computed them to the row's other TX - 1
    // either through workgroup memory (Pᵀ in `ps`) or, on the subgroup path, by shuffles.
    let ps_decl = if variant.p_shuffle() {
        String::new()
    } else {
        "// Pᵀ: ps[n·TY + m/4] holds the probabilities of rows m..m+3 for key n.\n\
         var<workgroup> ps: array<vec4<f32>, BN * TY>;"
            .to_string()
    };
    // The row's first lane, for shuffles from the row's lanes (of P, or of Q in registers).
    let mut row_lane0 = if variant.p_shuffle() || variant.q_regs {
        "    let row_lane0 = sg_lane & ~((TX - 1u) * IL);".to_string()
    } else {
        String::new()
    };
    if variant.split_d {
        row_lane0.push_str(&split_offsets(variant));
    }

    let block = fill(
        FMA_BLOCK,
        &[
            ("PRE_DECL", &staging.declare("    ")),
            ("PARAMS_COPY", params_copy(variant)),
            ("SEQ_LENS", seq_lens(variant)),
            ("SCORE_SETUP", &score_setup(variant)),
            ("FIRST_TILE", first_tile(variant)),
            ("FETCH_K_FIRST", &staging.fetch_k("        ", "t_first * BN", "0u")),
            ("STAGE_Q", &stage_q(variant)),
        ],
    );
    let k_stages = if variant.skip_unseen { "stages_seen" } else { "NCH" };
    let src = fill(
        TEMPLATE,
        &[
            ("ENABLE", enable),
            ("ET", et),
            ("D", &variant.head_dim.to_string()),
            ("DC", &variant.chunk.to_string()),
            ("TY", &variant.row_groups.to_string()),
            ("TX", &variant.row_threads.to_string()),
            ("IL", &variant.interleave.to_string()),
            ("KG", &variant.key_groups.to_string()),
            ("CAUSAL", &variant.causal.to_string()),
            ("STAGES", "1"),
            ("BINDINGS", &bindings(variant)),
            ("QS_DECL", qs_decl(variant)),
            ("KV_DECL", kv_decl(variant)),
            ("PS_DECL", &ps_decl),
            ("RED_DECL", &rows.decl),
            ("LOADS", LOADS),
            ("REDUCE_MAX", &rows.max),
            ("REDUCE_SUM", &rows.sum),
            ("SG_ARGS", &rows.args),
            ("LID", rows.lid),
            ("ROW_LANE0", &row_lane0),
            ("BLOCK", &block),
            ("BARRIER_AFTER_Q", if variant.direct { "    workgroupBarrier();" } else { "" }),
            ("O_DECL", &out.decl),
            ("STAGES_SEEN", &stages_seen(variant)),
            ("S_DECL", &scores.decl),
            ("K_STAGES_LOOP", k_stages),
            ("K_BASE", k_base(variant)),
            ("BARRIER_BEFORE_STORE", &barrier_before_store(variant, "            ")),
            ("STORE_K", &staging.store_k("            ")),
            ("BARRIER_AFTER_STORE", if variant.direct { "" } else { "            workgroupBarrier();" }),
            ("K_STAGES_NEXT", k_stages),
            ("FETCH_K_NEXT", &staging.fetch_k("                ", "n0", "c + 1u")),
            ("FETCH_V_FIRST", &after_last_k_chunk(variant, &staging)),
            ("QK", &qk(variant, &scores.fma)),
            ("SCORE_MODS", &score_mods(variant)),
            ("MASK_TILE", mask_tile(variant)),
            ("WINDOW_LIM", window_lim(variant)),
            ("S_MASK", &scores.mask),
            ("S_ROWMAX", &scores.row_max),
            ("S_EXP", &scores.exp),
            ("S_ROWSUM", &scores.row_sum),
            ("P_STORE", &scores.p_store),
            ("O_RESCALE", &out.rescale),
            ("PV", &pv(variant, &staging)),
            ("O_STORE", &out.store),
        ],
    );
    format!("// {}\n{}", variant.name(), src)
}

/// Sequences of their own lengths ([`Variant::seq_lens`]): the block's copy of the parameters,
/// made first (hook `PARAMS_COPY` of [`FMA_BLOCK`]; `wgsl::bindings` declares it).
fn params_copy(variant: &Variant) -> &'static str {
    if variant.seq_lens { "    P = P_in;\n" } else { "" }
}

/// Sequences of their own lengths: once the buffers' bases are known (laid out by the longest
/// sequence), the block's copy of the parameters takes its sequence's key count and diagonal,
/// which every mask, window and ALiBi bias after reads (hook `SEQ_LENS` of [`FMA_BLOCK`]).
fn seq_lens(variant: &Variant) -> &'static str {
    if variant.seq_lens {
        "    // This sequence's own key count and diagonal (the buffers hold every sequence padded to\n\
         \x20   // the longest; rows past its queries are computed and never read back).\n\
         \x20   P.seq_k = seq_lens[2u * b + 1u];\n\
         \x20   P.causal_offset = i32(P.seq_k) - i32(seq_lens[2u * b]);\n"
    } else {
        ""
    }
}

/// The block's share of a window, a soft-cap or ALiBi, after its key range is known (hook
/// `SCORE_SETUP` of [`FMA_BLOCK`]): a window ends the block's keys at its last row's last key
/// (`n_end`) and starts them at its first row's first key (`n_start`); ALiBi reads the head's
/// slope once. Nothing for plain or causal scores.
fn score_setup(variant: &Variant) -> String {
    let mut s = String::new();
    if variant.window {
        s.push_str(
            "    // Sliding window: the block's keys end at its last row's last key and start at its first\n\
             \x20   // row's first key (rows see keys in order, so no row sees one outside).\n\
             \x20   n_end = u32(clamp(i32(m0 + BM) + P.causal_offset + P.win_right, 0, i32(n_end)));\n\
             \x20   let n_start = u32(clamp(i32(m0) + P.causal_offset - P.win_left, 0, i32(P.seq_k)));\n",
        );
    }
    if variant.alibi {
        s.push_str(
            "    // ALiBi: this head's slope, in the scores' log2 units.\n\
             \x20   let alibi_slope = alibi_slopes[b * P.alibi_batch_stride + h] * 1.4426950408889634;\n",
        );
    }
    s
}

/// The block's first key tile (hook `FIRST_TILE` of [`FMA_BLOCK`]): this dispatch's first key
/// (a multiple of the tile), or, with a window, the tile of its first row's first key if later.
fn first_tile(variant: &Variant) -> &'static str {
    if variant.window { "max(P.key_begin, n_start) / BN" } else { "P.key_begin / BN" }
}

/// The soft-cap and ALiBi on every tile's scores, before the mask (hook `SCORE_MODS`): the
/// soft-cap `softcap·tanh(s·inv_softcap)` in log2 units, its argument clamped to ±15 where tanh
/// is ±1 in f32 (so that no driver's tanh meets an overflowing exponential), then minus the
/// slope times each key's distance from its row's diagonal. The scores are `s{i}_{g}` (row `i`,
/// keys of group `g`) or, with S split over the head dim, `st{g}_{j}` (one key, four rows).
fn score_mods(variant: &Variant) -> String {
    let mut s = String::new();
    if !(variant.softcap || variant.alibi) {
        return s;
    }
    // (score, the four keys or the one key, which of the row diagonals: a row or all four)
    let mut scores: Vec<(String, String, Option<&str>)> = Vec::new();
    for g in 0..variant.key_groups {
        if variant.split_d {
            for j in 0..4 {
                let key = format!("vec4<i32>(i32(n0 + ({g}u * TX + tx) * 4u + {j}u))");
                scores.push((format!("st{g}_{j}"), key, None));
            }
        } else {
            for (i, l) in LANE.iter().enumerate() {
                scores.push((format!("s{i}_{g}"), format!("ak{g}"), Some(l)));
            }
        }
    }
    if variant.softcap {
        s.push_str(
            "        // Soft-cap (log2 units); tanh's argument clamped to ±15, where tanh is ±1 in f32.\n",
        );
        for (x, _, _) in &scores {
            let _ = writeln!(
                s,
                "        {x} = P.softcap * tanh(clamp({x} * P.inv_softcap, vec4<f32>(-15.0), vec4<f32>(15.0)));"
            );
        }
    }
    if variant.alibi {
        s.push_str(
            "        // ALiBi: minus the slope times each key's distance from its row's diagonal.\n\
             \x20       let diag = vec4<i32>(i32(row0) + P.causal_offset) + vec4<i32>(0, 1, 2, 3);\n",
        );
        if !variant.split_d {
            for g in 0..variant.key_groups {
                let _ = writeln!(
                    s,
                    "        let ak{g} = vec4<i32>(vec4<u32>(n0 + ({g}u * TX + tx) * 4u) + vec4<u32>(0u, 1u, 2u, 3u));"
                );
            }
        }
        for (x, key, row) in &scores {
            let diag = row.map_or("diag".to_string(), |l| format!("vec4<i32>(diag.{l})"));
            let _ = writeln!(s, "        {x} = {x} - alibi_slope * abs(vec4<f32>({diag} - {key}));");
        }
    }
    s
}

/// Which tiles are masked besides those that reach past `seq_k` (hook `MASK_TILE`): causal,
/// those past the first row's diagonal; with a window, those past the first row's last key or
/// before the last row's first key.
fn mask_tile(variant: &Variant) -> &'static str {
    if variant.window {
        "i32(n0 + BN) - 1 > i32(m0) + P.causal_offset + P.win_right\n            \
         || i32(n0) < i32(m0 + BM) - 1 + P.causal_offset - P.win_left"
    } else {
        "(CAUSAL && i32(n0 + BN) - 1 > i32(m0) + P.causal_offset)"
    }
}

/// A window's bounds in a masked tile (hook `WINDOW_LIM`): each row's keys end before `lim`
/// and start at `lo`.
fn window_lim(variant: &Variant) -> &'static str {
    if variant.window {
        "            // Sliding window: row i sees keys lo.i..lim.i.\n\
         \x20           lim = min(lim, vec4<i32>(i32(row0) + P.causal_offset + P.win_right + 1) + vec4<i32>(0, 1, 2, 3));\n\
         \x20           let lo = vec4<i32>(i32(row0) + P.causal_offset - P.win_left) + vec4<i32>(0, 1, 2, 3);\n"
    } else {
        ""
    }
}

/// The K/V stage buffers in workgroup memory, or (K and V read straight from their buffers)
/// none.
fn kv_decl(variant: &Variant) -> &'static str {
    if variant.direct {
        "// K (packed transposed per tile) and V are read straight from their buffers."
    } else {
        "// A K chunk transposed (kv[d·BN4 + n/4]: keys n..n+3 at dim d) or a V chunk (kv[n·DC4 + d/4];\n\
         // staged by keys, kv[(n - c·BN/NCH)·D4 + d/4] for stage c), per stage buffer.\n\
         var<workgroup> kv: array<vec4<f32>, KV_STAGE * STAGES>;"
    }
}

/// Qᵀ of the block in workgroup memory, or (Q in registers) nothing.
fn qs_decl(variant: &Variant) -> &'static str {
    if variant.q_regs {
        "// Q is held in registers (q{k}_{c}), not in workgroup memory: see `fma::stage_q`."
    } else {
        "// Qᵀ of the block, scaled: qs[d·TY + m/4] holds rows m..m+3 at dim d.\n\
         var<workgroup> qs: array<vec4<f32>, D * TY>;"
    }
}

/// Q of the block, scaled, into workgroup memory ([`STAGE_Q`]), or ([`Variant::q_regs`]) into
/// registers: `q{k}_{c}` holds the invocation's four rows at dim `4·(k·TX + tx) + c`.
fn stage_q(variant: &Variant) -> String {
    if !variant.q_regs {
        return STAGE_Q.into();
    }
    let mut s = String::from(
        "    // Q into registers: q{k}_{c} holds rows 4·ty..4·ty+3 at dim 4·(k·TX + tx) + c, scaled.\n",
    );
    s.push_str("    let q_scale = P.scale_log2;\n");
    for k in 0..variant.head_dim / 4 / variant.row_threads {
        for i in 0..4 {
            let _ = writeln!(s, "    let qr{k}_{i} = load_q(q_base, m0 + ty * 4u + {i}u, {k}u * TX + tx);");
        }
        for (c, l) in LANE.iter().enumerate() {
            let _ = writeln!(
                s,
                "    let q{k}_{c} = vec4<f32>(qr{k}_0.{l}, qr{k}_1.{l}, qr{k}_2.{l}, qr{k}_3.{l}) * q_scale;"
            );
        }
    }
    s
}

/// The S = Q·Kᵀ loop over this K chunk's dims `d` (`fma` its body, with `a` the four rows' Q at
/// dim `d` of the chunk), from Qᵀ in workgroup memory; or, where Q is in registers (the measured
/// shapes), S split over the head dim ([`split_qk`]).
fn qk(variant: &Variant, fma: &str) -> String {
    if variant.split_d {
        return split_qk(variant);
    }
    assert!(!variant.q_regs, "{}: Q in registers comes with S split over the head dim", variant.name());
    format!(
        "            let qd = c * DC * TY + ty;\n            for (var d = 0u; d < DC; d++) {{\n                \
         let a = qs[qd + d * TY];\n{fma}\n            }}"
    )
}

/// Where lane `tx`'s register `r{i}` finds its key's row in a K stage staged by keys
/// ([`Variant::split_d`]): `xo{i}` = `4·(i ^ tx)·D4 + tx`, the row of key quad `i ^ tx` (plus the
/// run's key within the quad and the group, constants) at the lane's first vec4 of dims.
fn split_offsets(variant: &Variant) -> String {
    let mut s = String::from(
        "\n    // S split over the head dim: lane tx's register r{i} takes key quad i ^ tx of each run.\n",
    );
    for i in 0..variant.row_threads {
        let _ = writeln!(s, "    let xo{i} = ({i}u ^ tx) * 4u * D4 + tx;");
    }
    s
}

/// S = Q·Kᵀ split over the head dim ([`Variant::split_d`]). K stage `c` holds keys
/// `c·BN/NCH..(c+1)·BN/NCH` with all `D` columns, whole key groups (`kv[kb + (n - c·BN/NCH)·D4 +
/// d/4]`). The tile's keys go in runs of `TX`: run `(g, j)` is keys `4·(g·TX + t) + j`, `t < TX`,
/// whose whole scores end in lane `t`'s `st{g}_{j}` (its four rows, as `pt{g}_{j}` is for P·V).
/// Each lane multiplies its own dims of Q (`q{k}_{c}`: dims `4·(k·TX + tx) + c`) with the same
/// dims of the run's keys, key `t = i ^ tx` into register `r{i}`; then a butterfly over the row's
/// lanes (`IL·h` apart, `h` = TX/2, .., 1) adds partner's `r{i + h}` into `r{i}` for `i < h`: the
/// partner (`tx ^ h`) holds in `r{i + h}` key `(i + h) ^ tx ^ h = i ^ tx`, the one in this lane's
/// `r{i}`, so every lane sends the same register and keeps the other half. Each step runs as soon
/// as the registers it sends are whole (see the code), and after the last `r0` holds the whole
/// score of key `t = tx`. A `switch` on `c` picks the stage's groups, so that no register is
/// indexed at run time.
fn split_qk(variant: &Variant) -> String {
    let tx = variant.row_threads;
    let stages = variant.head_dim / variant.chunk;
    let per_stage = variant.key_groups / stages;
    assert!(
        variant.q_regs && variant.v_by_keys && per_stage * stages == variant.key_groups && tx >= 4,
        "{}: S split over the head dim needs Q in registers, stages by keys, one stage buffer, \
         whole key groups per stage and at least 4 invocations per row",
        variant.name()
    );
    let dims = variant.head_dim / 4 / tx; // vec4s of the lane's dims per key
    let d4 = variant.head_dim / 4;
    let mut s = String::from("            switch c {\n");
    for c in 0..stages {
        let _ = writeln!(s, "                case {c}u: {{");
        for gl in 0..per_stage {
            let g = c * per_stage + gl;
            for j in 0..4 {
                let ind = "                    ";
                let _ = writeln!(s, "{ind}{{");
                let _ = writeln!(s, "{ind}// Keys 4·({g}·TX + t) + {j}, t < TX: key t = i ^ tx into r{{i}}.");
                // Registers `regs` of the run: one vec4 of the lane's dims at a time, for all
                // of them.
                let products = |regs: std::ops::Range<u32>| -> String {
                    let mut p = String::new();
                    for k in 0..dims {
                        let _ = writeln!(p, "{ind}{{");
                        for i in regs.clone() {
                            let at = (4 * gl * tx + j) * d4 + k * tx;
                            let _ = writeln!(p, "{ind}    let k{i} = kv[kb + xo{i} + {at}u];");
                        }
                        for i in regs.clone() {
                            for (comp, l) in LANE.iter().enumerate() {
                                let _ = writeln!(
                                    p,
                                    "{ind}    r{i} = fma(q{k}_{comp}, vec4<f32>(k{i}.{l}), r{i});"
                                );
                            }
                        }
                        let _ = writeln!(p, "{ind}}}");
                    }
                    p
                };
                let send = |h: u32, first: bool| -> String {
                    let mut p = String::new();
                    for i in 0..h {
                        let shuffled = format!("subgroupShuffleXor(r{}, {}u)", i + h, variant.interleave * h);
                        let _ = if first {
                            writeln!(p, "{ind}var r{i} = {shuffled};")
                        } else {
                            writeln!(p, "{ind}r{i} = r{i} + {shuffled};")
                        };
                    }
                    p
                };
                // The butterfly's halves are sent as soon as they are whole, so that half the
                // accumulators are live at once: registers h..2h (h = TX/2, .., 2) are
                // multiplied, then sent, and what arrives starts registers 0..h (no add at the
                // first step); then r1 and r0, and the last step. On the H100 0.6% (D=128) to 3%
                // (D=64) faster than all TX multiplied first, causal D=128 0.2% slower
                // (measured, see docs/experiments.md).
                let mut h = tx / 2;
                for i in h..tx {
                    let _ = writeln!(s, "{ind}var r{i} = vec4<f32>(0.0);");
                }
                s.push_str(&products(h..tx));
                s.push_str(&send(h, true));
                h /= 2;
                while h >= 2 {
                    s.push_str(&products(h..2 * h));
                    s.push_str(&send(h, false));
                    h /= 2;
                }
                s.push_str(&products(0..2));
                s.push_str(&send(1, false));
                let _ = writeln!(s, "{ind}st{g}_{j} = r0;");
                let _ = writeln!(s, "{ind}}}");
            }
        }
        let _ = writeln!(s, "                }}");
    }
    s + "                default: {}\n            }"
}

/// `stages_seen` ([`Variant::skip_unseen`]): how many of the tile's `NCH` K (and V) stages,
/// staged by keys, hold a key that the block sees; fewer than `NCH` only in its last tile.
fn stages_seen(variant: &Variant) -> String {
    if !variant.skip_unseen {
        return String::new();
    }
    "        let stages_seen = min(NCH, (n_end - n0 + BN / NCH - 1u) / (BN / NCH));".into()
}

/// `kb`, where the S = Q·Kᵀ loop finds Kᵀ (`{kb + d·BN4 + n/4}`: keys n..n+3 at dim d): this
/// chunk's stage buffer, or this tile's block of the K buffer, which packing transposed per tile.
fn k_base(variant: &Variant) -> &'static str {
    if variant.direct {
        concat!(
            "            // This tile's Kᵀ block of the buffer (packed transposed per tile, rows padded).\n",
            "            let kb = kv_base + n0 * D4;"
        )
    } else {
        concat!(
            "            // This chunk's buffer; with two, stage c of 2·NCH per tile uses buffer c % 2.\n",
            "            let kb = (c % STAGES) * KV_STAGE;"
        )
    }
}

/// What the last K chunk's stage loads next: the first V chunk (nothing where K and V are read
/// straight from their buffers).
fn after_last_k_chunk(variant: &Variant, staging: &Staging) -> String {
    if variant.direct { String::new() } else { staging.fetch_v("                ", "n0", "0u") }
}

/// The next tile's first K chunk into the staging registers, where there is a next tile: what
/// the tile's last stage (its last V chunk's) loads.
fn next_tile_first_k(staging: &Staging, ind: &str) -> String {
    format!(
        "{ind}if (t + 1u < n_tiles) {{\n{}{ind}}}\n",
        staging.fetch_k(&format!("{ind}    "), "n0 + BN", "0u")
    )
}

/// Row max and sum over a row's TX invocations: subgroup shuffles, or workgroup memory.
struct Reductions {
    decl: String,
    max: String,
    sum: String,
    /// The subgroup builtins the entry point takes.
    args: String,
    /// The invocation index the roles follow.
    lid: &'static str,
}

impl Reductions {
    fn new(variant: &Variant) -> Self {
        if variant.subgroup {
            Reductions {
                decl: String::new(),
                max: shuffle_reduce(|mask| format!("max(r, subgroupShuffleXor(r, {mask}u))"), variant),
                sum: shuffle_reduce(|mask| format!("r + subgroupShuffleXor(r, {mask}u)"), variant),
                args:
                    "    @builtin(subgroup_id) sg_id: u32,\n    @builtin(subgroup_size) sg_size: u32,\n    \
                       @builtin(subgroup_invocation_id) sg_lane: u32,"
                        .to_string(),
                // Roles follow subgroup lanes, so the TX invocations of a row are lanes IL apart
                // that differ in bits log2(IL)..log2(IL·TX) of their index, whatever order the
                // driver numbers them in.
                lid: "sg_id * sg_size + sg_lane",
            }
        } else {
            Reductions {
                decl: "// Row-reduction scratch: red[tx·TY + ty] holds one invocation's part of 4 rows.\n\
                       var<workgroup> red: array<vec4<f32>, TX * TY>;"
                    .to_string(),
                max: memory_reduce("max(r, red[i * TY + ty])"),
                sum: memory_reduce("r + red[i * TY + ty]"),
                args: String::new(),
                lid: "lidx",
            }
        }
    }
}

/// The score micro-tile: s{i}_{g} is row i's vec4 of scores for key group g (keys
/// 4·(g·TX + tx)..+3); p{i}_{g} the probabilities; then their hand-over (`p_store`): Pᵀ stores,
/// or pt{g}_{j}, key 4·(g·TX + tx) + j's probabilities of the four rows, for shuffling.
#[derive(Default)]
struct Scores {
    decl: String,
    fma: String,
    mask: String,
    row_max: String,
    exp: String,
    row_sum: String,
    p_store: String,
}

impl Scores {
    fn new(variant: &Variant) -> Self {
        if variant.split_d {
            return Scores::split(variant);
        }
        let groups = variant.key_groups;
        let mut c = Scores::default();
        for g in 0..groups {
            // Kᵀ at `kb`: the stage buffer, or the K buffer itself (`direct`).
            let at = format!("kb + d * BN4 + {g}u * TX + tx");
            let load = if variant.direct { format!("vec4<f32>(k[{at}])") } else { format!("kv[{at}]") };
            let _ = writeln!(c.fma, "                let k{g} = {load};");
            let _ = writeln!(
                c.mask,
                "            let key{g} = vec4<i32>(vec4<u32>(n0 + ({g}u * TX + tx) * 4u) + vec4<u32>(0u, 1u, 2u, 3u));"
            );
            if !variant.p_shuffle() {
                let _ = writeln!(c.p_store, "        let pn{g} = ({g}u * TX + tx) * 4u * TY + ty;");
            }
            for (j, l) in LANE.iter().enumerate() {
                let value = format!("vec4<f32>(p0_{g}.{l}, p1_{g}.{l}, p2_{g}.{l}, p3_{g}.{l})");
                let _ = if variant.p_shuffle() {
                    writeln!(c.p_store, "        let pt{g}_{j} = {value};")
                } else {
                    writeln!(c.p_store, "        ps[pn{g} + {j}u * TY] = {value};")
                };
            }
            for (i, l) in LANE.iter().enumerate() {
                let _ = writeln!(c.decl, "        var s{i}_{g} = vec4<f32>(0.0);");
                let _ = writeln!(c.fma, "                s{i}_{g} = fma(vec4<f32>(a.{l}), k{g}, s{i}_{g});");
                let seen = if variant.window {
                    format!("(key{g} < vec4<i32>(lim.{l})) & (key{g} >= vec4<i32>(lo.{l}))")
                } else {
                    format!("key{g} < vec4<i32>(lim.{l})")
                };
                let _ = writeln!(c.mask, "            s{i}_{g} = select(vec4<f32>(NEG), s{i}_{g}, {seen});");
                let _ = writeln!(c.exp, "        let p{i}_{g} = exp2(s{i}_{g} - vec4<f32>(m_use.{l}));");
            }
        }
        // Per-row reductions over the invocation's own keys: vec4(row 0, .., row 3).
        let over_groups = |f: &str, v: &str, join: &str| -> String {
            let rows: Vec<String> = (0..4)
                .map(|i| {
                    let terms = (0..groups).map(|g| format!("{f}({v}{i}_{g})"));
                    terms.reduce(|a, b| format!("{join}({a}, {b})")).unwrap_or_default()
                })
                .collect();
            format!("vec4<f32>({})", rows.join(", "))
        };
        c.row_max = over_groups("hmax", "s", "max");
        c.row_sum = over_groups("hsum", "p", "add");
        c
    }
}

impl Scores {
    /// With S split over the head dim ([`Variant::split_d`]), the scores come out transposed:
    /// st{g}_{j} holds the four rows' scores of key 4·(g·TX + tx) + j, and the probabilities
    /// pt{g}_{j} are already what P·V shuffles. The row max and sum are vec4 operations over
    /// them.
    fn split(variant: &Variant) -> Self {
        let mut c = Scores::default();
        let mut names = Vec::new();
        for g in 0..variant.key_groups {
            for j in 0..4 {
                let _ = writeln!(c.decl, "        var st{g}_{j} = vec4<f32>(0.0);");
                let key = format!("vec4<i32>(i32(n0 + ({g}u * TX + tx) * 4u + {j}u))");
                let seen = if variant.window {
                    format!("({key} < lim) & ({key} >= lo)")
                } else {
                    format!("{key} < lim")
                };
                let _ =
                    writeln!(c.mask, "            st{g}_{j} = select(vec4<f32>(NEG), st{g}_{j}, {seen});");
                let _ = writeln!(c.exp, "        let pt{g}_{j} = exp2(st{g}_{j} - m_use);");
                names.push((format!("st{g}_{j}"), format!("pt{g}_{j}")));
            }
        }
        c.row_max =
            names.iter().map(|n| n.0.clone()).reduce(|a, b| format!("max({a}, {b})")).unwrap_or_default();
        c.row_sum = names.iter().map(|n| n.1.clone()).collect::<Vec<_>>().join(" + ");
        c
    }
}

/// O: 4 rows x D/TX columns per invocation, as named vec4s o{i}_{c}.
struct Output {
    decl: String,
    rescale: String,
    store: String,
}

impl Output {
    fn new(variant: &Variant) -> Self {
        let per_row = variant.head_dim / 4 / variant.row_threads; // vec4 columns of O per invocation and row
        let mut o = Output { decl: String::new(), rescale: String::new(), store: String::new() };
        for (i, l) in LANE.iter().enumerate() {
            for c in 0..per_row {
                let _ = writeln!(o.decl, "    var o{i}_{c} = vec4<f32>(0.0);");
                let _ = writeln!(o.rescale, "        o{i}_{c} = o{i}_{c} * alpha.{l};");
            }
            let _ = writeln!(o.store, "    if (row0 + {i}u < P.seq_q) {{");
            let _ = writeln!(o.store, "        let ob = q_base + (row0 + {i}u) * D4 + tx;");
            for c in 0..per_row {
                let _ = writeln!(o.store, "        o[ob + {c}u * TX] = vec4<ET>(o{i}_{c} * inv.{l});");
            }
            let _ = writeln!(o.store, "    }}");
        }
        o
    }
}

/// O += P·V, one V chunk at a time: store the staged chunk, start loading the next stage (the
/// next V chunk, or the next tile's first K chunk), then the FMAs over this chunk's columns.
fn pv(variant: &Variant, staging: &Staging) -> String {
    if variant.direct {
        return pv_direct(variant);
    }
    let per_chunk = variant.chunk / 4 / variant.row_threads;
    let chunks = variant.head_dim / variant.chunk;
    // Staged by keys, stage `c` holds key quads `c·per_stage..(c+1)·per_stage` (keys 4·q..4·q+3).
    let per_stage = variant.block_n() / MICRO / chunks;
    assert!(
        !variant.v_by_keys
            || (variant.chunk < variant.head_dim && per_stage * chunks * MICRO == variant.block_n()),
        "{}: V staged by keys needs several stages that split the tile's key quads evenly",
        variant.name()
    );
    let mut pv = String::new();
    for chunk in 0..chunks {
        // The one stage buffer, at the start of `kv`.
        let buf = "0u";
        let stage_quads = chunk * per_stage..(chunk + 1) * per_stage;
        let first_key = stage_quads.start * MICRO;
        if variant.v_by_keys {
            let last = stage_quads.end * MICRO;
            let _ = writeln!(pv, "        // V keys {first_key}..{last}, all columns, stage buffer at {buf}");
        } else {
            let (first, last) = (chunk * variant.chunk / 4, (chunk + 1) * variant.chunk / 4);
            let _ = writeln!(pv, "        // V columns {first}..{last} (vec4 units), stage buffer at {buf}");
        }
        // Skipping unseen stages: a stage after the first only where the block sees a key of
        // it; then none after it is seen, there is no next tile, and nothing more to load.
        let skip = variant.skip_unseen && variant.v_by_keys;
        if skip && chunk > 0 {
            let _ = writeln!(pv, "        if ({chunk}u < stages_seen) {{");
        }
        pv.push_str(&barrier_before_store(variant, "        "));
        pv.push_str(&staging.store_v("        ", buf));
        let _ = writeln!(pv, "        workgroupBarrier();");
        if chunk + 1 < chunks {
            let fetch = staging.fetch_v("        ", "n0", &format!("{}u", chunk + 1));
            if skip {
                let _ = writeln!(pv, "        if ({}u < stages_seen) {{\n{fetch}        }}", chunk + 1);
            } else {
                pv.push_str(&fetch);
            }
        } else {
            pv.push_str(&next_tile_first_k(staging, "        "));
        }
        // Where this stage's V row `n` starts, which O columns it feeds, and its keys (in
        // quads of the tile: key 4·q + j, j < 4).
        let (row, columns, quads) = if variant.v_by_keys {
            (format!("{buf} + (n - {first_key}u) * D4 + tx"), 0..chunks * per_chunk, stage_quads)
        } else {
            (
                format!("{buf} + n * DC4 + tx"),
                chunk * per_chunk..(chunk + 1) * per_chunk,
                0..variant.block_n() / MICRO,
            )
        };
        let fmas = |ind: &str| v_row_fmas(ind, &row, &|lc| format!("kv[vb + {lc}u * TX]"), columns.clone());
        if variant.p_shuffle() {
            pv.push_str(&shuffled_keys(variant, quads, &fmas));
        } else {
            // Pᵀ in workgroup memory (V staged by columns: only the measured shapes, which
            // shuffle, stage it by keys).
            let _ = writeln!(pv, "        for (var n = 0u; n < BN; n++) {{");
            let _ = writeln!(pv, "            let pv = ps[n * TY + ty];");
            pv.push_str(&fmas("            "));
            let _ = writeln!(pv, "        }}");
        }
        if skip && chunk > 0 {
            let _ = writeln!(pv, "        }}");
        }
    }
    pv
}

/// O += P·V with V read straight from its buffer (`Variant::direct`): no stages and no
/// barriers; for each key, one shuffle of its four rows' probabilities, then all of the
/// invocation's `D/(4·TX)` vec4 columns of that V row (the row's TX invocations read consecutive
/// vec4s; the subgroup's other rows read the same ones).
fn pv_direct(variant: &Variant) -> String {
    let per_row = variant.head_dim / 4 / variant.row_threads;
    let fmas = |ind: &str| {
        v_row_fmas(ind, "vrow0 + n * D4", &|c| format!("vec4<f32>(v[vb + {c}u * TX])"), 0..per_row)
    };
    let mut pv =
        String::from("        // V rows n0..n0+BN, straight from the buffer (padded to whole tiles).\n");
    pv += "        let vrow0 = kv_base + n0 * D4 + tx;\n";
    pv + &shuffled_keys(variant, 0..variant.block_n() / MICRO, &fmas)
}

/// O += P·V for key `n`, with its four rows' probabilities in `pv`: `vb` = `row` (where the
/// invocation's first vec4 of V's row `n` is), the vec4s `v{j} = load(j)`, j = 0, 1, .., each
/// times `pv` into O's columns `columns` (vec4 units, in order).
fn v_row_fmas(ind: &str, row: &str, load: &dyn Fn(u32) -> String, columns: std::ops::Range<u32>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{ind}let vb = {row};");
    for j in 0..columns.len() as u32 {
        let _ = writeln!(s, "{ind}let v{j} = {};", load(j));
    }
    for (i, l) in LANE.iter().enumerate() {
        for (j, c) in columns.clone().enumerate() {
            let _ = writeln!(s, "{ind}o{i}_{c} = fma(vec4<f32>(pv.{l}), v{j}, o{i}_{c});");
        }
    }
    s
}

/// The loop over a tile's keys in quads `quads` (key quad q = g·TX + src holds keys 4·q + j,
/// j < 4), where probabilities are shuffled: key `n` = 4·(g·TX + src) + j is held by lane `src`
/// of the row's TX, as pt{g}_{j}; for each, `pv` (its four rows' probabilities) and `n` are set
/// and `body` (indented as given) uses them. `quads` is whole key groups (one loop over all
/// lanes, every group in it), or lanes of one group (V staged by keys in stages smaller than a
/// group).
fn shuffled_keys(variant: &Variant, quads: std::ops::Range<u32>, body: &dyn Fn(&str) -> String) -> String {
    let tx = variant.row_threads;
    let mut s = String::new();
    let groups = if quads.start.is_multiple_of(tx) && quads.end.is_multiple_of(tx) {
        let _ = writeln!(s, "        for (var src = 0u; src < TX; src++) {{");
        quads.start / tx..quads.end / tx
    } else {
        let g = quads.start / tx;
        assert_eq!(g, (quads.end - 1) / tx, "key quads {quads:?} span parts of several groups");
        let _ = writeln!(
            s,
            "        for (var src = {}u; src < {}u; src++) {{",
            quads.start - g * tx,
            quads.end - g * tx
        );
        g..g + 1
    };
    let _ = writeln!(s, "            let owner = row_lane0 + src * IL;");
    for g in groups {
        for j in 0..4 {
            let _ = writeln!(s, "            {{");
            let _ = writeln!(s, "                let n = ({g}u * TX + src) * 4u + {j}u;");
            let _ = writeln!(s, "                let pv = subgroupShuffle(pt{g}_{j}, owner);");
            s.push_str(&body("                "));
            let _ = writeln!(s, "            }}");
        }
    }
    let _ = writeln!(s, "        }}");
    s
}

/// How one stage (a `BN × DC` chunk of K or V, or, with V staged by keys, `BN/NCH` keys × all `D`
/// columns of V) travels from global memory through each invocation's `pre*` registers into
/// `kv`: K in blocks of 4 keys × 4 dims, transposed on the way (`kv[d·BN4 + n/4]`), or (S split
/// over the head dim) staged by keys as V is, V as plain
/// vec4s (`kv[n·DC4 + d/4]`, or by keys `kv[(n - c·BN/NCH)·D4 + d/4]` for stage `c`). Invocation
/// `lid` takes K blocks `lid + b·T` and V vec4s `lid + r·T`; where a chunk has fewer blocks than
/// invocations, the rest idle (guarded).
struct Staging {
    /// K blocks per invocation (each 4 vec4 registers).
    k_blocks: u32,
    /// K blocks in a chunk: `BN/4 · DC/4`.
    k_total: u32,
    /// V vec4s per invocation.
    v_vecs: u32,
    /// V vec4s in a chunk: `BN · DC/4`.
    v_total: u32,
    /// Invocations per workgroup.
    threads: u32,
    /// V stages hold runs of keys with all columns ([`Variant::v_by_keys`]).
    v_by_keys: bool,
    /// K stages do too, as plain vec4s (`k_blocks` and `k_total` then count vec4s; with S split
    /// over the head dim, [`Variant::split_d`]).
    k_by_keys: bool,
}

impl Staging {
    fn new(v: &Variant) -> Self {
        let t = v.threads();
        let k_total = match (v.direct, v.split_d) {
            (true, _) => 0,
            (false, false) => v.block_n() / 4 * v.chunk / 4,
            (false, true) => v.block_n() * v.chunk / 4,
        };
        let v_total = if v.direct { 0 } else { v.block_n() * v.chunk / 4 };
        Staging {
            k_blocks: k_total.div_ceil(t),
            k_total,
            v_vecs: v_total.div_ceil(t),
            v_total,
            threads: t,
            v_by_keys: v.v_by_keys,
            k_by_keys: v.split_d,
        }
    }

    /// vec4 registers: four per K block (one per K vec4 staged by keys), which is at least one per
    /// V vec4.
    fn registers(&self) -> u32 {
        let k = if self.k_by_keys { self.k_blocks } else { 4 * self.k_blocks };
        k.max(self.v_vecs)
    }

    fn declare(&self, ind: &str) -> String {
        (0..self.registers()).map(|r| format!("{ind}var pre{r} = vec4<f32>(0.0);\n")).collect()
    }

    fn each(
        &self,
        ind: &str,
        count: u32,
        total: u32,
        index: &str,
        body: impl Fn(u32) -> Vec<String>,
    ) -> String {
        per_item(ind, count, total, self.threads, index, body)
    }

    /// Which K block `blk` is: its key quad `nb` and dim quad `db` within the stage (a warp's
    /// 32 blocks are 32 key quads at one dim quad; 8 key quads × 4 dim quads was slower on the
    /// H100: measured, see docs/experiments.md).
    fn k_block(&self) -> Vec<String> {
        vec!["let nb = blk % BN4;".into(), "let db = blk / BN4;".into()]
    }

    /// Loads K chunk `c` of the tile starting at key `n0` into the registers (by keys: keys
    /// `c·BN/NCH..` with all columns).
    fn fetch_k(&self, ind: &str, n0: &str, c: &str) -> String {
        if self.k_by_keys {
            return self.each(ind, self.k_blocks, self.k_total, "e", |r| {
                vec![format!("pre{r} = load_k(kv_base, {n0} + ({c}) * (BN / NCH) + e / D4, e % D4);")]
            });
        }
        self.each(ind, self.k_blocks, self.k_total, "blk", |b| {
            let mut lines = self.k_block();
            lines.push(format!("let dq = ({c}) * DC4 + db;"));
            lines.extend(
                (0..4).map(|j| format!("pre{} = load_k(kv_base, {n0} + nb * 4u + {j}u, dq);", 4 * b + j)),
            );
            lines
        })
    }

    /// Stores the registers' K blocks transposed into `kv` (by keys: the vec4s as they are).
    fn store_k(&self, ind: &str) -> String {
        if self.k_by_keys {
            return self
                .each(ind, self.k_blocks, self.k_total, "e", |r| vec![format!("kv[kb + e] = pre{r};")]);
        }
        self.each(ind, self.k_blocks, self.k_total, "blk", |b| {
            let mut lines = self.k_block();
            let r = 4 * b;
            lines.extend(LANE.iter().enumerate().map(|(j, l)| {
                format!(
                    "kv[kb + (db * 4u + {j}u) * BN4 + nb] = vec4<f32>(pre{r}.{l}, pre{}.{l}, pre{}.{l}, pre{}.{l});",
                    r + 1,
                    r + 2,
                    r + 3
                )
            }));
            lines
        })
    }

    /// Loads V stage `c` of the tile starting at key `n0` into the registers: columns
    /// `c·DC..(c+1)·DC` of its `BN` keys, or (by keys) keys `c·BN/NCH..` with all columns.
    fn fetch_v(&self, ind: &str, n0: &str, c: &str) -> String {
        self.each(ind, self.v_vecs, self.v_total, "e", |r| {
            vec![if self.v_by_keys {
                format!("pre{r} = load_v(kv_base, {n0} + ({c}) * (BN / NCH) + e / D4, e % D4);")
            } else {
                format!("pre{r} = load_v(kv_base, {n0} + e / DC4, ({c}) * DC4 + e % DC4);")
            }]
        })
    }

    /// Stores the registers' V vec4s into `kv`, in the stage buffer at `buf`.
    fn store_v(&self, ind: &str, buf: &str) -> String {
        self.each(ind, self.v_vecs, self.v_total, "e", |r| vec![format!("kv[{buf} + e] = pre{r};")])
    }
}

/// A stage's unrolled per-invocation code: one block per
/// item `i` in `0..count` of invocation `lid` (of `threads`, which must be the template's WGSL
/// constant `T`, the code's stride): `let {index} = lid + i·T;`, then
/// `body(i)` (lines, indented under `ind`), behind `{index} < total` where the stage does not
/// give every invocation the same share (otherwise the test would always hold: lid < T).
fn per_item(
    ind: &str,
    count: u32,
    total: u32,
    threads: u32,
    index: &str,
    body: impl Fn(u32) -> Vec<String>,
) -> String {
    let mut s = String::new();
    let guarded = !total.is_multiple_of(threads);
    let inner = if guarded { format!("{ind}        ") } else { format!("{ind}    ") };
    for i in 0..count {
        let _ = writeln!(s, "{ind}{{");
        let _ = writeln!(s, "{ind}    let {index} = lid + {i}u * T;");
        if guarded {
            let _ = writeln!(s, "{ind}    if ({index} < {total}u) {{");
        }
        for line in body(i) {
            let _ = writeln!(s, "{inner}{line}");
        }
        if guarded {
            let _ = writeln!(s, "{ind}    }}");
        }
        let _ = writeln!(s, "{ind}}}");
    }
    s
}

/// The barrier before a stage is stored: every invocation must first be done reading the
/// previous stage from the one stage buffer (none where K and V are not staged). Pᵀ (`ps`) and
/// the reduction scratch (`red`) rely only on the barrier after each store.
fn barrier_before_store(variant: &Variant, ind: &str) -> String {
    if !variant.direct { format!("{ind}workgroupBarrier();\n") } else { String::new() }
}

/// A butterfly over the `TX` lanes of a row (`IL` apart, [`Variant::interleave`]): `step(mask)`
/// combines `r` with its partner `mask` lanes away.
fn shuffle_reduce(step: impl Fn(u32) -> String, variant: &Variant) -> String {
    let mut s = String::from("    var r = x;\n");
    for mask in (0..variant.row_threads.trailing_zeros()).map(|b| variant.interleave << b) {
        let _ = writeln!(s, "    r = {};", step(mask));
    }
    s.push_str("    return r;");
    s
}

/// Through workgroup memory: every invocation writes its part, then reads the row's TX parts.
/// The caller's next barrier (there is always one before `red` is written again) keeps the
/// next reduction from overwriting parts still being read.
fn memory_reduce(step: &str) -> String {
    format!(
        "    red[tx * TY + ty] = x;\n    workgroupBarrier();\n    var r = red[ty];\n    \
         for (var i = 1u; i < TX; i++) {{\n        r = {step};\n    }}\n    return r;"
    )
}
