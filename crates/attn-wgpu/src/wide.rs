//! WGSL generation for the FMA kernel with 8x8 register tiles (`kernels/flash_wide.wgsl`,
//! [`Kernel::Wide`]): each invocation computes 8 query rows × 8 keys of S and 8 rows × 8
//! columns of O, reading two vec4s of each operand from workgroup memory per 64 FMAs (the 4x8
//! kernel reads three per 32 in S = Q·Kᵀ, and in P·V receives each key's probabilities by a
//! subgroup shuffle per 16 FMAs). Probabilities reach the row's other invocations through
//! workgroup memory (Pᵀ), read back four rows per vec4; no subgroup operations.
//!
//! **Status** (H100, bench/results/2026-11-23-h100-wgpu-wide-890d7ec): passes `attn verify
//! --quick` there and on lavapipe, but runs 2.3-2.5x slower than the 4x8 kernel (9-12 TFLOP/s in
//! f32 at S=4096), so only `ATTN_WGPU_WIDE=1` picks it. The driver keeps at most 48 KiB of
//! workgroup memory resident per SM (bench/results/2026-11-23-h100-wgpu-residency-5215df6), so
//! its 44 KiB per two warps (Qᵀ and Pᵀ both grow with the rows) leave one workgroup, two warps,
//! per SM. It honours the `ATTN_WGPU_ABLATE` parts `qk`, `exp`, `pv`, `barrier` and `load` for
//! timing.
//!
//! Names: s{i}_{g}, p{i}_{g}: row i's (0..8) vec4 of scores or probabilities for key group g
//! (0..2); o{i}_{c}: row i's vec4 of O for column group c (0..2). Rows 0..3 are group `a`,
//! 4..7 group `b` (the kernel's vec4s of row statistics: m_a, l_a, ...).

use crate::plan::{Kernel, KernelType, Variant};
use std::fmt::Write;

/// The kernel template.
pub const TEMPLATE: &str = include_str!("../kernels/flash_wide.wgsl");

/// Components of a vec4, by row within a group of four.
const LANE: [&str; 4] = ["x", "y", "z", "w"];
/// Rows of each invocation's tiles.
const ROWS: usize = 8;
/// vec4s of keys (S) or of columns (O) per invocation and row.
const GROUPS: usize = 2;

/// Row `i`'s group (`a` or `b`) and component.
fn row(i: usize) -> (&'static str, &'static str) {
    (if i < 4 { "a" } else { "b" }, LANE[i % 4])
}

/// The WGSL source of `variant` (a `wide` one).
pub fn generate(variant: &Variant) -> String {
    debug_assert!(variant.kernel == Kernel::Wide && variant.key_groups as usize == GROUPS);
    // The template's tiles are `D` keys wide: D4 = 2·TX, so `BN = D`.
    assert_eq!(
        variant.row_threads * 8,
        variant.head_dim,
        "{}: the 8x8 kernel needs TX = D/8",
        variant.name()
    );
    let (et, enable) = match variant.ty {
        KernelType::F32 => ("f32", ""),
        KernelType::F16 => ("f16", "enable f16;"),
    };
    let ablate = crate::shader::Ablation::current();
    let mut c = Code::default();
    for i in 0..ROWS {
        let (grp, l) = row(i);
        let q = if i < 4 { "a0" } else { "a1" };
        for g in 0..GROUPS {
            let _ = writeln!(c.s_decl, "        var s{i}_{g} = vec4<f32>(0.0);");
            if !ablate.qk {
                let _ =
                    writeln!(c.s_fma, "                s{i}_{g} = fma(vec4<f32>({q}.{l}), k{g}, s{i}_{g});");
            } else if i == 0 {
                let _ = writeln!(c.s_fma, "                s{i}_{g} = s{i}_{g} + k{g};");
            }
            let _ = writeln!(
                c.s_mask,
                "            s{i}_{g} = select(vec4<f32>(NEG), s{i}_{g}, key{g} < vec4<i32>(lim_{grp}.{l}));"
            );
            let exp = if ablate.exp { "" } else { "exp2" };
            let _ = writeln!(c.s_exp, "        let p{i}_{g} = {exp}(s{i}_{g} - vec4<f32>(mu_{grp}.{l}));");
            let _ = writeln!(c.o_decl, "    var o{i}_{g} = vec4<f32>(0.0);");
            let _ = writeln!(c.o_rescale, "        o{i}_{g} = o{i}_{g} * alpha_{grp}.{l};");
            let p = if i < 4 { "pa" } else { "pb" };
            if !ablate.pv {
                let _ =
                    writeln!(c.pv_fma, "                o{i}_{g} = fma(vec4<f32>({p}.{l}), v{g}, o{i}_{g});");
            }
        }
        let _ = writeln!(c.o_store, "    if (row0 + {i}u < P.seq_q) {{");
        let _ = writeln!(c.o_store, "        let ob = q_base + (row0 + {i}u) * D4 + tx;");
        for g in 0..GROUPS {
            let _ = writeln!(c.o_store, "        o[ob + {g}u * TX] = vec4<ET>(o{i}_{g} * inv_{grp}.{l});");
        }
        let _ = writeln!(c.o_store, "    }}");
    }
    for g in 0..GROUPS {
        let key = format!("vec4<u32>(n0 + ({g}u * TX + tx) * 4u) + vec4<u32>(0u, 1u, 2u, 3u)");
        c.s_mask = format!("            let key{g} = vec4<i32>({key});\n") + &c.s_mask;
        // Key 4·(g·TX + tx) + j's probabilities of rows 0..3 and 4..7.
        for (j, l) in LANE.iter().enumerate() {
            let at = format!("(({g}u * TX + tx) * 4u + {j}u) * PS + 2u * ty");
            for (half, rows) in [(0, 0..4), (1, 4..8)] {
                let values: Vec<String> = rows.map(|i| format!("p{i}_{g}.{l}")).collect();
                let _ = writeln!(c.p_store, "        ps[{at} + {half}u] = vec4<f32>({});", values.join(", "));
            }
        }
    }
    // A vec4 of four rows' reductions (max, or sum) over the invocation's keys.
    let rows = |rows: std::ops::Range<usize>, each: &dyn Fn(usize) -> String| -> String {
        format!("vec4<f32>({})", rows.map(each).collect::<Vec<_>>().join(", "))
    };
    let row_max = |i| format!("max(hmax(s{i}_0), hmax(s{i}_1))");
    let row_sum = |i| format!("hsum(p{i}_0) + hsum(p{i}_1)");

    let staging = Staging::new(variant);
    let mut src = TEMPLATE.to_string();
    for (key, value) in [
        // First: the block set-up holds markers that the entries after it fill.
        ("{{BLOCK}}", crate::shader::FMA_BLOCK.to_string()),
        ("{{STAGE_Q}}", crate::shader::STAGE_Q.replace("{{Q_QUADS}}", "BM4")),
        ("{{BINDINGS}}", crate::shader::BINDINGS.to_string()),
        ("{{LOADS}}", crate::shader::LOADS.to_string()),
        ("{{ENABLE}}", enable.to_string()),
        ("{{ET}}", et.to_string()),
        ("{{D}}", variant.head_dim.to_string()),
        ("{{TX}}", variant.row_threads.to_string()),
        ("{{TY}}", variant.row_groups.to_string()),
        ("{{DC}}", variant.chunk.to_string()),
        ("{{CAUSAL}}", variant.causal.to_string()),
        ("{{O_DECL}}", c.o_decl),
        ("{{S_DECL}}", c.s_decl),
        ("{{S_FMA}}", c.s_fma),
        ("{{S_MASK}}", c.s_mask),
        ("{{S_ROWMAX_A}}", rows(0..4, &row_max)),
        ("{{S_ROWMAX_B}}", rows(4..8, &row_max)),
        ("{{S_EXP}}", c.s_exp),
        ("{{S_ROWSUM_A}}", rows(0..4, &row_sum)),
        ("{{S_ROWSUM_B}}", rows(4..8, &row_sum)),
        ("{{O_RESCALE}}", c.o_rescale),
        ("{{P_STORE}}", c.p_store),
        ("{{PV_FMA}}", c.pv_fma),
        ("{{O_STORE}}", c.o_store),
        ("{{PRE_DECL}}", staging.declare()),
        ("{{FETCH_K_FIRST}}", staging.fetch_k("        ", "0u", "0u")),
        ("{{STORE_K}}", staging.store_k("            ")),
        ("{{FETCH_K_NEXT}}", ablate.fetch(staging.fetch_k("                ", "n0", "c + 1u"))),
        ("{{FETCH_V_FIRST}}", ablate.fetch(staging.fetch_v("                ", "n0", "0u"))),
        ("{{STORE_V}}", staging.store_v("            ")),
        ("{{FETCH_V_NEXT}}", ablate.fetch(staging.fetch_v("                ", "n0", "vc + 1u"))),
        ("{{FETCH_K_NEXT_TILE}}", ablate.fetch(staging.fetch_k("                ", "n0 + BN", "0u"))),
    ] {
        src = src.replace(key, &value);
    }
    if ablate.barrier {
        src = crate::shader::without_loop_barriers(&src);
    }
    format!("// {}{}\n{}", variant.name(), ablate.comment(), crate::shader::with_padding(src))
}

/// The unrolled pieces of the kernel, one field per template marker.
#[derive(Default)]
struct Code {
    s_decl: String,
    s_fma: String,
    s_mask: String,
    s_exp: String,
    p_store: String,
    o_decl: String,
    o_rescale: String,
    pv_fma: String,
    o_store: String,
}

/// How one stage travels from global memory through each invocation's `pre*` registers into
/// `kv`: a K stage (`BN` keys × `DC` head-dim columns) in blocks of 4 keys × 4 columns, transposed
/// on the way (`kv[d·BN4 + n/4]`); a V stage (`KC` keys × `D` columns) as plain vec4s
/// (`kv[n·D4 + d/4]`). Invocation `lid` takes K blocks `lid + b·T` and V vec4s `lid + r·T`, the
/// code unrolled so that all of a stage's loads are in flight at once; where a stage has fewer
/// items than invocations, the rest idle (guarded).
struct Staging {
    /// K blocks in a stage, and per invocation.
    k_total: u32,
    k_each: u32,
    /// V vec4s in a stage, and per invocation.
    v_total: u32,
    v_each: u32,
    /// Invocations per workgroup.
    threads: u32,
}

impl Staging {
    fn new(v: &Variant) -> Self {
        let t = v.threads();
        let (bn, d) = (v.block_n(), v.head_dim);
        let k_total = bn / 4 * (v.chunk / 4);
        let v_total = v.chunk * bn / d * (d / 4);
        Staging { k_total, k_each: k_total.div_ceil(t), v_total, v_each: v_total.div_ceil(t), threads: t }
    }

    /// The vec4 registers: four per K block, one per V vec4.
    fn declare(&self) -> String {
        (0..(4 * self.k_each).max(self.v_each))
            .map(|r| format!("    var pre{r} = vec4<f32>(0.0);\n"))
            .collect()
    }

    /// The invocation's `count` items of a stage of `total`, index `e` ([`crate::shader::per_item`]).
    fn each(&self, ind: &str, count: u32, total: u32, body: impl Fn(u32) -> Vec<String>) -> String {
        crate::shader::per_item(ind, count, total, self.threads, "e", body)
    }

    /// Loads K stage `c` (head-dim columns `c·DC..`) of the tile starting at key `n0`.
    fn fetch_k(&self, ind: &str, n0: &str, c: &str) -> String {
        self.each(ind, self.k_each, self.k_total, |b| {
            (0..4)
                .map(|j| {
                    format!(
                        "pre{} = load_k(kv_base, {n0} + (e % BN4) * 4u + {j}u, ({c}) * DC4 + e / BN4);",
                        4 * b + j
                    )
                })
                .collect()
        })
    }

    /// Stores the registers' K blocks transposed into `kv`.
    fn store_k(&self, ind: &str) -> String {
        self.each(ind, self.k_each, self.k_total, |b| {
            let r = 4 * b;
            LANE.iter()
                .enumerate()
                .map(|(j, l)| {
                    format!(
                        "kv[((e / BN4) * 4u + {j}u) * BN4 + e % BN4] = vec4<f32>(pre{r}.{l}, pre{}.{l}, pre{}.{l}, pre{}.{l});",
                        r + 1,
                        r + 2,
                        r + 3
                    )
                })
                .collect()
        })
    }

    /// Loads V stage `vc` (keys `n0 + vc·KC..`, all columns).
    fn fetch_v(&self, ind: &str, n0: &str, vc: &str) -> String {
        self.each(ind, self.v_each, self.v_total, |r| {
            vec![format!("pre{r} = load_v(kv_base, {n0} + ({vc}) * KC + e / D4, e % D4);")]
        })
    }

    /// Stores the registers' V vec4s into `kv`.
    fn store_v(&self, ind: &str) -> String {
        self.each(ind, self.v_each, self.v_total, |r| vec![format!("kv[e] = pre{r};")])
    }
}
