//! WGSL generation: `kernels/flash.wgsl` with one [`Variant`]'s constants substituted and its
//! O accumulator code unrolled.
//!
//! O lives in `4 · D/32` named vec4 variables per invocation rather than an array, so that no
//! driver is tempted to put it in memory that is indexed at run time; the loops that touch it
//! (rescale, P·V per head-dim chunk, store) are unrolled here, in Rust, where the count is known.

use crate::plan::{ROW_THREADS, Variant};
use std::fmt::Write;

/// The kernel template.
pub const TEMPLATE: &str = include_str!("../kernels/flash.wgsl");

/// Components of a vec4, by row of the micro-tile.
const LANE: [&str; 4] = ["x", "y", "z", "w"];

/// The WGSL source of `variant`, ready for `create_shader_module`.
pub fn generate(variant: &Variant) -> String {
    let (et, enable) = match variant.ty {
        crate::plan::KernelType::F32 => ("f32", ""),
        crate::plan::KernelType::F16 => ("f16", "enable f16;"),
    };
    let (red_decl, reduce_max, reduce_sum, sg_args, lid) = if variant.subgroup {
        (
            String::new(),
            shuffle_reduce("max(r, subgroupShuffleXor(r, MASK))"),
            shuffle_reduce("r + subgroupShuffleXor(r, MASK)"),
            "    @builtin(subgroup_id) sg_id: u32,\n    @builtin(subgroup_size) sg_size: u32,\n    \
             @builtin(subgroup_invocation_id) sg_lane: u32,"
                .to_string(),
            // Roles follow subgroup lanes, so the TX invocations of a row are lanes that differ
            // in their low three bits, whatever order the driver numbers invocations in.
            "sg_id * sg_size + sg_lane",
        )
    } else {
        (
            "// Row-reduction scratch: red[tx·TY + ty] holds one invocation's part of 4 rows.\n\
             var<workgroup> red: array<vec4<f32>, TX * TY>;"
                .to_string(),
            memory_reduce("max(r, red[i * TY + ty])"),
            memory_reduce("r + red[i * TY + ty]"),
            String::new(),
            "lidx",
        )
    };
    let per_row = variant.head_dim / 4 / ROW_THREADS; // vec4 columns of O per invocation and row
    let per_chunk = variant.chunk / 4 / ROW_THREADS;
    let chunks = variant.head_dim / variant.chunk;

    let mut o_decl = String::new();
    let mut o_rescale = String::new();
    let mut o_store = String::new();
    for i in 0..4 {
        for c in 0..per_row {
            let _ = writeln!(o_decl, "    var o{i}_{c} = vec4<f32>(0.0);");
            let _ = writeln!(o_rescale, "        o{i}_{c} = o{i}_{c} * alpha.{};", LANE[i]);
        }
        let _ = writeln!(o_store, "    if (row0 + {i}u < P.seq_q) {{");
        let _ = writeln!(o_store, "        let ob = q_base + (row0 + {i}u) * D4 + tx;");
        for c in 0..per_row {
            let _ = writeln!(o_store, "        o[ob + {c}u * TX] = vec4<ET>(o{i}_{c} * inv.{});", LANE[i]);
        }
        let _ = writeln!(o_store, "    }}");
    }
    let mut pv = String::new();
    for chunk in 0..chunks {
        let _ = writeln!(
            pv,
            "        // V columns {}..{} (vec4 units)",
            chunk * variant.chunk / 4,
            (chunk + 1) * variant.chunk / 4
        );
        let _ = writeln!(pv, "        workgroupBarrier();");
        let _ = writeln!(pv, "        for (var blk = lid; blk < BN * DC4; blk += T) {{");
        let _ = writeln!(
            pv,
            "            kv[blk] = load_v(kv_base, n0 + blk / DC4, {chunk}u * DC4 + blk % DC4);"
        );
        let _ = writeln!(pv, "        }}");
        let _ = writeln!(pv, "        workgroupBarrier();");
        let _ = writeln!(pv, "        for (var n = 0u; n < BN; n++) {{");
        let _ = writeln!(pv, "            let pv = ps[n * TY + ty];");
        let _ = writeln!(pv, "            let vb = n * DC4 + tx;");
        for lc in 0..per_chunk {
            let _ = writeln!(pv, "            let v{lc} = kv[vb + {lc}u * TX];");
        }
        for i in 0..4 {
            for lc in 0..per_chunk {
                let c = chunk * per_chunk + lc;
                let _ =
                    writeln!(pv, "            o{i}_{c} = fma(vec4<f32>(pv.{}), v{lc}, o{i}_{c});", LANE[i]);
            }
        }
        let _ = writeln!(pv, "        }}");
    }

    let mut src = TEMPLATE.to_string();
    for (key, value) in [
        ("{{ENABLE}}", enable.to_string()),
        ("{{ET}}", et.to_string()),
        ("{{D}}", variant.head_dim.to_string()),
        ("{{DC}}", variant.chunk.to_string()),
        ("{{TY}}", variant.row_groups.to_string()),
        ("{{CAUSAL}}", variant.causal.to_string()),
        ("{{RED_DECL}}", red_decl),
        ("{{REDUCE_MAX}}", reduce_max),
        ("{{REDUCE_SUM}}", reduce_sum),
        ("{{SG_ARGS}}", sg_args),
        ("{{LID}}", lid.to_string()),
        ("{{O_DECL}}", o_decl),
        ("{{O_RESCALE}}", o_rescale),
        ("{{PV}}", pv),
        ("{{O_STORE}}", o_store),
    ] {
        src = src.replace(key, &value);
    }
    format!("// {}\n{src}", variant.name())
}

/// A butterfly over the TX = 8 lanes of a row: `step` combines `r` with its partner `MASK` away.
fn shuffle_reduce(step: &str) -> String {
    let mut s = String::from("    var r = x;\n");
    for mask in [1, 2, 4] {
        let _ = writeln!(s, "    r = {};", step.replace("MASK", &format!("{mask}u")));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{KernelType, candidates};

    /// Every specialisation the planner can pick parses and validates (naga, no adapter needed),
    /// and its workgroup memory is what `Variant::shared_bytes` says.
    #[test]
    fn every_variant_validates_and_matches_its_shared_bytes() {
        let mut checked = 0;
        for ty in [KernelType::F32, KernelType::F16] {
            for d in (32..=256).step_by(32) {
                for causal in [false, true] {
                    for subgroup in [false, true] {
                        for v in candidates(ty, d, causal, subgroup) {
                            let src = generate(&v);
                            assert!(!src.contains("{{"), "{}: unsubstituted placeholder", v.name());
                            let module = naga::front::wgsl::parse_str(&src)
                                .unwrap_or_else(|e| panic!("{}: {}", v.name(), e.emit_to_string(&src)));
                            let mut validator = naga::valid::Validator::new(
                                naga::valid::ValidationFlags::all(),
                                naga::valid::Capabilities::all(),
                            );
                            validator
                                .validate(&module)
                                .unwrap_or_else(|e| panic!("{}: {}", v.name(), e.emit_to_string(&src)));
                            let shared: u32 = module
                                .global_variables
                                .iter()
                                .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
                                .map(|(_, g)| module.types[g.ty].inner.size(module.to_ctx()))
                                .sum();
                            assert_eq!(shared, v.shared_bytes(), "{}", v.name());
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 100, "{checked}");
    }
}
