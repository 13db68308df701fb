// FlashAttention forward on FMAs with 8x8 register tiles, one workgroup per (batch·head, block of
// BM query rows). No subgroup operations: what invocations share goes through workgroup memory.
//
// Template: `wide.rs` substitutes every double-brace marker (constants, and the register tiles'
// code unrolled). Scores are kept in base-2 units (Q is pre-multiplied by scale·log2(e)), so
// every exponential is one exp2.
//
// Roles: invocation (ty, tx), tx in 0..TX = D/8, ty in 0..TY, owns query rows 8·ty..8·ty+7 of the
// block (two vec4 groups: a = rows 0..3, b = rows 4..7), and
// - in S = Q·Kᵀ, the keys 4·(g·TX + tx)..+3, g in 0..2, of each tile of BN = D keys: an 8x8 tile
//   of S, s{i}_{g} = row i's vec4 of scores for key group g;
// - in O += P·V, O's columns (vec4 units) tx and TX + tx: an 8x8 tile of O, o{i}_{c}.
// Every product step reads two vec4s of each operand from workgroup memory for 64 FMAs.
// The invocations of a row group meet through workgroup memory only: the tile's row max (each
// writes its part to `red`), and the probabilities (each writes its 8x8 tile of P, transposed, to
// `ps`; P·V reads them back by key, four rows per vec4). Row sums stay per invocation until the
// end.
{{ENABLE}}
alias ET = {{ET}};
alias IN = vec4<ET>;

const D: u32 = {{D}}u;
const D4: u32 = D / 4u;
const TX: u32 = {{TX}}u;
const TY: u32 = {{TY}}u;
const T: u32 = TX * TY;
const BM: u32 = 8u * TY;
const BM4: u32 = BM / 4u;
const BN: u32 = 8u * TX;
const BN4: u32 = BN / 4u;
// K is staged DC head-dim columns at a time (NKC stages per tile), V KC keys at a time (NVC
// stages), both in the same buffer: DC·BN = KC·D elements.
const DC: u32 = {{DC}}u;
const DC4: u32 = DC / 4u;
const NKC: u32 = D / DC;
const KC: u32 = DC * BN / D;
const NVC: u32 = BN / KC;
// Pᵀ row stride in vec4s: one more than the block's, so that the row groups' stores of one key
// land in different banks.
const PS: u32 = BM4 + 1u;
const CAUSAL: bool = {{CAUSAL}};
// Masked scores: finite, so that max and subtraction never meet inf - inf.
const NEG: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;

{{BINDINGS}}

// Indices stay in bounds by construction (the shader is compiled without naga's clamps, see
// runtime::Checks): qs[d·BM4 + m/4] with d < D, m < BM; kv[d·BN4 + n/4] (K) with d < DC,
// n < BN, or kv[n·D4 + d/4] (V) with n < KC, d < D; ps[n·PS + m/4] with n < BN, m < BM;
// red[2·lid + 1] with lid < T; the storage buffers at (row · D4 + d/4) with d/4 < D4 and row <
// seq_q (Q and O, guarded) or row < n_tiles·BN (K and V: each head's rows padded to whole tiles).
// Qᵀ of the block, scaled: qs[d·BM4 + m/4] holds rows m..m+3 at dim d.
var<workgroup> qs: array<vec4<f32>, D * BM4>;
// A K stage transposed (kv[d·BN4 + n/4]: keys n..n+3 at dim d) or a V stage (kv[n·D4 + d/4]).
var<workgroup> kv: array<vec4<f32>, DC * BN4>;
// Pᵀ of the tile: ps[n·PS + m/4] holds the probabilities of rows m..m+3 for key n.
var<workgroup> ps: array<vec4<f32>, BN * PS>;
// Each invocation's part of its rows' max (or sum): red[2·lid] rows 0..3, red[2·lid + 1] 4..7.
var<workgroup> red: array<vec4<f32>, 2u * T>;

{{LOADS}}

// The row group's maxima (or sums) of its rows a (h = 0) or b (h = 1) over its TX invocations,
// from `red` (written, then a barrier, by the caller).
fn group_max(ty: u32, h: u32) -> vec4<f32> {
    var r = red[2u * ty * TX + h];
    for (var i = 1u; i < TX; i++) {
        r = max(r, red[2u * (ty * TX + i) + h]);
    }
    return r;
}

fn group_sum(ty: u32, h: u32) -> vec4<f32> {
    var r = red[2u * ty * TX + h];
    for (var i = 1u; i < TX; i++) {
        r = r + red[2u * (ty * TX + i) + h];
    }
    return r;
}

@compute @workgroup_size(T)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let tx = lid % TX;
    let ty = lid / TX;
{{BLOCK}}
    // The first K stage's barrier makes Qᵀ visible.

    let row0 = m0 + 8u * ty;
    var m_a = vec4<f32>(NEG);
    var m_b = vec4<f32>(NEG);
    var l_a = vec4<f32>(0.0);
    var l_b = vec4<f32>(0.0);
{{O_DECL}}
    for (var t = 0u; t < n_tiles; t++) {
        let n0 = t * BN;
{{S_DECL}}
        for (var c = 0u; c < NKC; c++) {
            // Every invocation is done with the buffer (the previous K stage, or the previous
            // tile's last V stage) before it is overwritten.
            workgroupBarrier();
{{STORE_K}}
            workgroupBarrier();
            // The next stage's loads, in flight under this stage's FMAs.
            if (c + 1u < NKC) {
{{FETCH_K_NEXT}}
            } else {
{{FETCH_V_FIRST}}
            }
            let qd = c * DC * BM4 + 2u * ty;
            for (var d = 0u; d < DC; d++) {
                let a0 = qs[qd + d * BM4];
                let a1 = qs[qd + d * BM4 + 1u];
                let k0 = kv[d * BN4 + tx];
                let k1 = kv[d * BN4 + TX + tx];
{{S_FMA}}
            }
        }

        // Mask only the tiles that reach past seq_k or past the first row's diagonal.
        if (n0 + BN > P.seq_k || (CAUSAL && i32(n0 + BN) - 1 > i32(m0) + P.causal_offset)) {
            var lim_a = vec4<i32>(i32(P.seq_k));
            var lim_b = lim_a;
            if (CAUSAL) {
                let diag = vec4<i32>(i32(row0) + P.causal_offset + 1) + vec4<i32>(0, 1, 2, 3);
                lim_a = min(lim_a, diag);
                lim_b = min(lim_b, diag + vec4<i32>(4));
            }
{{S_MASK}}
        }

        // The tile's row max over the row group (the previous tile's reads of `red` all came
        // before this tile's K stage barriers).
        red[2u * lid] = {{S_ROWMAX_A}};
        red[2u * lid + 1u] = {{S_ROWMAX_B}};
        workgroupBarrier();
        let mn_a = max(m_a, group_max(ty, 0u));
        let mn_b = max(m_b, group_max(ty, 1u));
        // Rows that have seen no key yet keep NEG; subtracting 0 makes their exp2 underflow to 0.
        let mu_a = select(mn_a, vec4<f32>(0.0), mn_a <= vec4<f32>(NEG));
        let mu_b = select(mn_b, vec4<f32>(0.0), mn_b <= vec4<f32>(NEG));
        let alpha_a = exp2(m_a - mu_a);
        let alpha_b = exp2(m_b - mu_b);
        m_a = mn_a;
        m_b = mn_b;
{{S_EXP}}
        // Each invocation keeps its own part of the row sums; they are reduced once, at the end.
        l_a = l_a * alpha_a + {{S_ROWSUM_A}};
        l_b = l_b * alpha_b + {{S_ROWSUM_B}};
{{O_RESCALE}}
{{P_STORE}}
        for (var vc = 0u; vc < NVC; vc++) {
            // Every invocation is done with the buffer (K, or the previous V stage); for the
            // first stage, this barrier also makes Pᵀ visible.
            workgroupBarrier();
{{STORE_V}}
            workgroupBarrier();
            if (vc + 1u < NVC) {
{{FETCH_V_NEXT}}
            } else if (t + 1u < n_tiles) {
{{FETCH_K_NEXT_TILE}}
            }
            let pn = vc * KC * PS + 2u * ty;
            for (var n = 0u; n < KC; n++) {
                let pa = ps[pn + n * PS];
                let pb = ps[pn + n * PS + 1u];
                let v0 = kv[n * D4 + tx];
                let v1 = kv[n * D4 + TX + tx];
{{PV_FMA}}
            }
        }
    }

    // Row sums over the row group (every invocation is done reading `red` for the row max).
    workgroupBarrier();
    red[2u * lid] = l_a;
    red[2u * lid + 1u] = l_b;
    workgroupBarrier();
    let ls_a = group_sum(ty, 0u);
    let ls_b = group_sum(ty, 1u);
    let inv_a = select(vec4<f32>(1.0) / ls_a, vec4<f32>(0.0), ls_a == vec4<f32>(0.0));
    let inv_b = select(vec4<f32>(1.0) / ls_b, vec4<f32>(0.0), ls_b == vec4<f32>(0.0));
{{O_STORE}}
    if (tx == 0u) {
        let ninf = bitcast<f32>(P.neg_inf_bits);
        let lse_a = (m_a + log2(ls_a)) * LN2;
        let lse_b = (m_b + log2(ls_b)) * LN2;
        for (var i = 0u; i < 4u; i++) {
            if (row0 + i < P.seq_q) {
                lse[bh * P.seq_q + row0 + i] = select(lse_a[i], ninf, ls_a[i] == 0.0);
            }
            if (row0 + 4u + i < P.seq_q) {
                lse[bh * P.seq_q + row0 + 4u + i] = select(lse_b[i], ninf, ls_b[i] == 0.0);
            }
        }
    }
}
