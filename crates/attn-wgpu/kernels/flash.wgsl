// FlashAttention forward, one workgroup per (batch·head, block of BM query rows).
//
// Template: `fma.rs` fills every named hook (constants, unrolled O code) per specialisation
// through `wgsl::fill`; see `plan.rs` for how the constants are chosen. Scores are kept in base-2
// units (Q is pre-multiplied by scale·log2(e)), so every exponential is one exp2.
//
// Roles: invocation (ty, tx) (IL below says which lid), tx in 0..TX, ty in 0..TY, owns query
// rows 4·ty..4·ty+3 of the block, and in each score tile the KG groups of four keys
// 4·(g·TX + tx)..+3, g in 0..KG (so that the TX invocations of a row read consecutive vec4s of
// Kᵀ), and O columns (vec4 units) tx, tx+TX, ...
// The TX invocations of a row reduce its max and sum together. The generated names s{i}_{g} and
// p{i}_{g} hold row i's scores and probabilities for key group g.
{{ENABLE}}
alias ET = {{ET}};
alias IN = vec4<ET>;

const D: u32 = {{D}}u;
const D4: u32 = D / 4u;
const DC: u32 = {{DC}}u;
const DC4: u32 = DC / 4u;
const NCH: u32 = D / DC;
const TY: u32 = {{TY}}u;
const TX: u32 = {{TX}}u;
const T: u32 = TY * TX;
// Row groups whose lanes interleave (`Variant::interleave`): lanes 2k and 2k+1 (with 4, also k
// and k^2) have the same tx in different row groups, so they read the same K and V vec4s.
const IL: u32 = {{IL}}u;
const KG: u32 = {{KG}}u;
const BM: u32 = TY * 4u;
const BN: u32 = TX * 4u * KG;
const BN4: u32 = BN / 4u;
const CAUSAL: bool = {{CAUSAL}};
// K/V stage buffers: 1, or 2 so that a stage is stored while the previous one is still read.
const STAGES: u32 = {{STAGES}}u;
const KV_STAGE: u32 = DC * BN4;
// Masked scores: finite, so that max and subtraction never meet inf - inf.
const NEG: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;

{{BINDINGS}}

// Indices stay in bounds by construction (the shader is compiled without naga's clamps, see
// options::Checks): qs[d·TY + m/4] with d < D, m/4 < TY; kv[buf + d·BN4 + n/4] (K) with d < DC,
// n/4 < BN4, or kv[buf + n·DC4 + d/4] (V) with n < BN, d/4 < DC4, or (V by keys, stage c)
// kv[buf + (n - c·BN/NCH)·D4 + d/4] with c·BN/NCH <= n < (c+1)·BN/NCH, d/4 < D4, buf = s·KV_STAGE
// with s < STAGES; ps[n·TY + m/4] with n < BN; the
// storage buffers at (row · D4 + d/4) with d/4 < D4 and row < seq_q (Q and O: guarded) or
// row < n_tiles·BN (K and V, staged or read straight from the buffer; Kᵀ at kv_base + n0·D4 +
// d·BN4 + n/4, the tile's transposed block): each head's K/V rows are padded to whole tiles.
{{QS_DECL}}
{{KV_DECL}}
{{PS_DECL}}
{{RED_DECL}}

{{LOADS}}

fn add(x: f32, y: f32) -> f32 {
    return x + y;
}

// The four rows' maxima (or sums) over the TX invocations of each row.
fn row_max(x: vec4<f32>, tx: u32, ty: u32) -> vec4<f32> {
{{REDUCE_MAX}}
}

fn row_sum(x: vec4<f32>, tx: u32, ty: u32) -> vec4<f32> {
{{REDUCE_SUM}}
}

@compute @workgroup_size(T)
fn main(
    @builtin(local_invocation_index) lidx: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
{{SG_ARGS}}
) {
    let lid = {{LID}};
    let tx = (lid / IL) % TX;
    let ty = lid / (TX * IL) * IL + lid % IL;
{{ROW_LANE0}}
{{BLOCK}}
{{BARRIER_AFTER_Q}}

    var m = vec4<f32>(NEG);
    var l = vec4<f32>(0.0);
{{O_DECL}}
    for (var t = t_first; t < n_tiles; t++) {
        let n0 = t * BN;
{{STAGES_SEEN}}
{{S_DECL}}
        for (var c = 0u; c < {{K_STAGES_LOOP}}; c++) {
{{K_BASE}}
{{BARRIER_BEFORE_STORE}}
{{STORE_K}}
{{BARRIER_AFTER_STORE}}
            if (c + 1u < {{K_STAGES_NEXT}}) {
{{FETCH_K_NEXT}}
            } else {
{{FETCH_V_FIRST}}
            }
{{QK}}
        }

        // Mask only the tiles that reach past seq_k or past the first row's diagonal.
        let row0 = m0 + ty * 4u;
{{SCORE_MODS}}        if (n0 + BN > P.seq_k || {{MASK_TILE}}) {
            var lim = vec4<i32>(i32(P.seq_k));
            if (CAUSAL) {
                lim = min(lim, vec4<i32>(i32(row0) + P.causal_offset + 1) + vec4<i32>(0, 1, 2, 3));
            }
{{WINDOW_LIM}}{{S_MASK}}
        }

        let m_new = max(m, row_max({{S_ROWMAX}}, tx, ty));
        // Rows that have seen no key yet keep NEG; subtracting 0 makes their exp2 underflow to 0.
        let m_use = select(m_new, vec4<f32>(0.0), m_new <= vec4<f32>(NEG));
        let alpha = exp2(m - m_use);
        m = m_new;
{{S_EXP}}
        // Each invocation keeps its own part of the row sums; they are reduced once, at the end.
        l = l * alpha + {{S_ROWSUM}};
{{P_STORE}}
{{O_RESCALE}}
{{PV}}
    }

    let l_row = row_sum(l, tx, ty);
    let inv = select(vec4<f32>(1.0) / l_row, vec4<f32>(0.0), l_row == vec4<f32>(0.0));
    let row0 = m0 + ty * 4u;
{{O_STORE}}
    if (tx == 0u) {
        let lse_row = (m + log2(l_row)) * LN2;
        let empty = l_row == vec4<f32>(0.0);
        let ninf = bitcast<f32>(P.neg_inf_bits);
        for (var i = 0u; i < 4u; i++) {
            if (row0 + i < P.seq_q) {
                lse[bh * P.seq_q + row0 + i] = select(lse_row[i], ninf, empty[i]);
            }
        }
    }
    loop_limit_probe();
}
