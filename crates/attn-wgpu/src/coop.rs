//! WGSL generation for the cooperative-matrix kernel (`kernels/flash_coop.wgsl`): f16 inputs on
//! 16×16×16 tensor-core products with f32 accumulators, where the adapter offers them
//! (wgpu's `EXPERIMENTAL_COOPERATIVE_MATRIX`; see [`crate::runtime`] for when it is asked for).
//! Its SPIR-V is compiled by [`crate::spirv`] and passed through.
//!
//! Matrices are named variables, unrolled here where their counts are known: `qa{k}`, Q's
//! 16-column blocks (A); `s{n}`, the tile's 16-key blocks of S (C); `o{j}`, O's 16-column blocks
//! (C); `pa{kk}`, P's 16-key blocks (A). K and V blocks are loaded from the storage buffers as B
//! matrices where they are used.
//!
//! **Status** (H100, NVIDIA 580.159.04): passes `attn verify` with 16- and 32-key tiles. How it
//! got there, each step measured (see docs/experiments.md):
//! - The first version failed every f16 case with random data. Naga's Vulkan memory model was
//!   suspected and ruled out (the module moved to GLSL450: same failures, same values).
//!   First-tile dumps then showed Q·Kᵀ already wrong, and the cause was alignment: an 8-byte
//!   workgroup variable (two flags) had shifted the matrices off 16-byte boundaries. Every
//!   workgroup variable is now a multiple of 16 bytes.
//! - The second version loads K, V and Q straight from the buffers (rows padded per head), with
//!   three barriers per tile instead of five and a softmax free of bank conflicts: 33-37 TFLOP/s
//!   at S=4096 where the first ran 10-24.
//! - With 64-key tiles it fails in causal cases with large scores, where a tile after the first
//!   rescales O (outputs of 0 in the second query block); 32-key tiles pass the same grid. The
//!   cause is not known, and those tiles are not planned.
//! - Timed with parts taken out (S=4096): without S's store to scratch and the softmax over it,
//!   3.2x faster at D=64 (108 against 34 TFLOP/s), although those parts alone (no products) take
//!   2.1 of the 16.2 ms; without exp2 or the barriers, no faster. So the chain of products,
//!   scratch and softmax in each subgroup is latency-bound, and the subgroups an SM holds are
//!   too few to hide it: the driver keeps 48 KiB of workgroup memory resident per SM, 15
//!   workgroups of 3 KiB with 32-key tiles. 16-key tiles (1.5 KiB) are 7-18% faster at D=64 and
//!   2-11% at D=128, the one shape planned now; issuing the next tile's S products before the
//!   softmax was no faster.

use crate::plan::Variant;
use crate::wgsl::{bindings, fill};
use std::fmt::Write;

/// The kernel template.
const TEMPLATE: &str = include_str!("../kernels/flash_coop.wgsl");

/// Side of the cooperative matrices.
const M: u32 = 16;

/// The WGSL source of `variant` (a `coop` one).
pub(crate) fn generate(variant: &Variant) -> String {
    debug_assert!(variant.kernel == crate::plan::Kernel::Coop);
    // Plain or causal scores of dense batches only: the planner gives the rest the FMA kernel.
    debug_assert!(!variant.score_mods(), "{}", variant.name());
    let (d, bn) = (variant.head_dim, variant.block_n());
    let (d_blocks, n_blocks) = (d / M, bn / M);
    let mut q_load = String::new();
    let mut o_decl = String::new();
    let mut s_mma = String::new();
    let mut s_read = String::new();
    let mut p_write = String::new();
    let mut pv = String::new();
    for kb in 0..d_blocks {
        let _ =
            writeln!(q_load, "    let qa{kb} = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + {}u], D);", kb * M);
    }
    // O starts from the zero matrix, and each tile's S from a product whose accumulator operand
    // is zero. (Until 65b11f8 O's zero blocks were loaded from scratch, a workaround for a
    // suspicion that proved wrong; the two ran equally fast, and loading the next tile's K blocks
    // ahead of the softmax was slower: measured, see docs/experiments.md.)
    for j in 0..d_blocks {
        let _ = writeln!(o_decl, "    var o{j} = coop_mat16x16<f32, C>();");
    }
    // S: the tile's products, then its store to scratch. (Issuing the next tile's products
    // before this tile's softmax, stored after its P·V, was timed no faster and removed: see
    // docs/experiments.md.)
    for n in 0..n_blocks {
        let _ = writeln!(s_mma, "        var s{n} = coop_mat16x16<f32, C>();");
    }
    s_mma += &s_products(n_blocks, d_blocks);
    s_mma += &s_stores(n_blocks);
    let _ = writeln!(s_mma, "        workgroupBarrier(); // S in scratch");
    // The lane's W = BN/2 scores, held in registers between the two passes.
    for e in 0..bn / 2 {
        let _ = writeln!(s_read, "        let c{e} = ({e}u + rot) % W;");
        let _ = writeln!(
            s_read,
            "        let x{e} = select(NEG, scratch[mine + c{e}], first + i32(c{e}) < lim);"
        );
        let _ = writeln!(s_read, "        tmax = max(tmax, x{e});");
        let _ = writeln!(p_write, "        let p{e} = exp2(x{e} - offset);");
        let _ = writeln!(p_write, "        l_run += p{e};");
        let _ = writeln!(p_write, "        ps[mine + c{e}] = f16(p{e});");
    }
    for kk in 0..n_blocks {
        let _ =
            writeln!(pv, "        let pa{kk} = coopLoadT<coop_mat16x16<f16, A>>(&ps[sc + {}u], BN);", kk * M);
    }
    for kk in 0..n_blocks {
        for j in 0..d_blocks {
            let v_block =
                format!("coopLoadT<coop_mat16x16<f16, B>>(&v[k_at + {}u * D + {}u], D)", kk * M, j * M);
            let _ = writeln!(pv, "        o{j} = coopMultiplyAdd(pa{kk}, {v_block}, o{j});");
        }
    }

    let src = fill(
        TEMPLATE,
        &[
            ("D", &d.to_string()),
            ("BM", &variant.block_m().to_string()),
            ("BN", &bn.to_string()),
            ("CAUSAL", &variant.causal.to_string()),
            ("BINDINGS", &bindings(variant)),
            ("Q_LOAD", &q_load),
            ("O_DECL", &o_decl),
            ("S_MMA", &s_mma),
            ("S_READ", &s_read),
            ("P_WRITE", &p_write),
            (
                "O_RESCALE",
                &through_scratch(variant, "            ", Some(&|x: &str| format!("{x} = {x} * alpha;"))),
            ),
            ("PV_MMA", &pv),
            ("O_STORE", &through_scratch(variant, "    ", None)),
        ],
    );
    format!("// {}\n{src}", variant.name())
}

/// S = Q·Kᵀ for the tile's keys (K rows from `k_at`), into the matrices `s{n}` (declared before):
/// the k-blocks outermost, so that the `BN/16` products in flight are independent.
fn s_products(n_blocks: u32, d_blocks: u32) -> String {
    let mut s = String::new();
    for kb in 0..d_blocks {
        for n in 0..n_blocks {
            let k_block =
                format!("coopLoad<coop_mat16x16<f16, B>>(&k[k_at + {}u * D + {}u], D)", n * M, kb * M);
            let acc = if kb == 0 { "coop_mat16x16<f32, C>()".to_string() } else { format!("s{n}") };
            let _ = writeln!(s, "        s{n} = coopMultiplyAdd(qa{kb}, {k_block}, {acc});");
        }
    }
    s
}

/// The matrices `s{n}`, scaled to log2 units, stored row by row to the subgroup's scratch.
fn s_stores(n_blocks: u32) -> String {
    let mut s = String::new();
    for n in 0..n_blocks {
        let _ = writeln!(s, "        coopStoreT(P.scale_log2 * s{n}, &scratch[sc + {}u], BN);", n * M);
    }
    s
}

/// O's blocks through the subgroup's scratch, `BN/16` at a time: stored row-major, then each
/// lane works on its half of its row. The hand-overs take workgroup barriers although the data is
/// the subgroup's own: a subgroup barrier does not order workgroup memory under Vulkan (naga
/// emits it with SubgroupMemory semantics, which Vulkan ignores). Both callers are in uniform
/// control flow, and neither runs often (a rescale, or once at the end). With `update`: the lanes
/// apply it to each element (its code for the element `x`) and the blocks are loaded back (the
/// rescale);
/// otherwise the lanes write their elements to the output, normalised (the end).
fn through_scratch(variant: &Variant, ind: &str, update: Option<&dyn Fn(&str) -> String>) -> String {
    let (d_blocks, n_blocks) = (variant.head_dim / M, variant.block_n() / M);
    let mut s = String::new();
    let mut first = 0;
    while first < d_blocks {
        let count = n_blocks.min(d_blocks - first);
        for i in 0..count {
            let _ = writeln!(s, "{ind}coopStoreT(o{}, &scratch[sc + {}u], BN);", first + i, i * M);
        }
        let _ = writeln!(s, "{ind}workgroupBarrier();");
        // This lane's half of the `count·16` columns just stored.
        let width = count * M;
        let _ = writeln!(
            s,
            "{ind}for (var c = half * {}u; c < (half + 1u) * {}u; c += 4u) {{",
            width / 2,
            width / 2
        );
        if let Some(update) = update {
            for e in 0..4 {
                let x = format!("scratch[sc + row * BN + c + {e}u]");
                let _ = writeln!(s, "{ind}    {}", update(&x));
            }
        } else {
            let _ = writeln!(s, "{ind}    if (q_row < P.seq_q) {{");
            let _ = writeln!(s, "{ind}        let x = sc + row * BN + c;");
            let row4 = "vec4<f32>(scratch[x], scratch[x + 1u], scratch[x + 2u], scratch[x + 3u])";
            let _ = writeln!(s, "{ind}        let y = {row4} * inv;");
            let _ = writeln!(
                s,
                "{ind}        o[(bh * P.seq_q + q_row) * D4 + ({}u + c) / 4u] = vec4<f16>(y);",
                first * M
            );
            let _ = writeln!(s, "{ind}    }}");
        }
        let _ = writeln!(s, "{ind}}}");
        let _ = writeln!(s, "{ind}workgroupBarrier();");
        if update.is_some() {
            for i in 0..count {
                let _ = writeln!(
                    s,
                    "{ind}o{} = coopLoadT<coop_mat16x16<f32, C>>(&scratch[sc + {}u], BN);",
                    first + i,
                    i * M
                );
            }
            let _ = writeln!(s, "{ind}workgroupBarrier();");
        }
        first += count;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where lane `lane` (of 32) starts its walk over its half row of a `block_n`-key tile in the
    /// kernel (`rot`); the walk visits column `(e + rot) % (block_n / 2)` at step `e`. Chosen so that
    /// at every step the 32 lanes read f32 scores, and write f16 probabilities, in 32 different
    /// banks of 4 bytes (checked by a test).
    fn start_column(lane: u32, block_n: u32) -> u32 {
        lane * (block_n / 2) / 32
    }

    /// At every step of the softmax walk, the 32 lanes (row = lane / 2, half = lane % 2) touch
    /// 32 different 4-byte banks, both reading scores (f32) and writing probabilities (f16; two
    /// lanes writing the two halves of one word share it, which is no conflict).
    /// The kernel's `rot` is `start_column`'s formula (W = BN / 2), which the test below checks.
    #[test]
    fn the_kernel_starts_where_start_column_says() {
        assert!(TEMPLATE.contains("const W: u32 = BN / 2u;"));
        assert!(TEMPLATE.contains("let rot = lane * W / 32u;"));
        assert!((0..32).all(|lane| start_column(lane, 64) == lane * 32 / 32));
    }

    #[test]
    fn the_softmax_walk_is_free_of_bank_conflicts() {
        for bn in [16u32, 32, 64] {
            let w = bn / 2;
            for step in 0..w {
                let column = |lane: u32| {
                    let (row, half) = (lane / 2, lane % 2);
                    row * bn + half * w + (step + start_column(lane, bn)) % w
                };
                let f32_banks: std::collections::HashSet<u32> = (0..32).map(|l| column(l) % 32).collect();
                assert_eq!(f32_banks.len(), 32, "BN={bn} step {step}: f32 reads conflict");
                let mut words: Vec<u32> = (0..32).map(|l| column(l) / 2).collect();
                words.sort();
                words.dedup();
                let f16_banks: std::collections::HashSet<u32> = words.iter().map(|w| w % 32).collect();
                assert_eq!(f16_banks.len(), words.len(), "BN={bn} step {step}: f16 writes conflict");
            }
        }
    }
}
