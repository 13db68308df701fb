// FlashAttention forward on cooperative matrices (tensor cores), f16 inputs, f32 accumulation;
// one workgroup per (batch·head, block of BM query rows), one subgroup of 32 per 16 of those rows.
//
// Template: `coop.rs` substitutes the double-brace markers (constants, and the matrix code
// unrolled per 16×16 block). Each subgroup works on its own 16 rows; per key tile of BN keys:
//   S = Q·Kᵀ on 16×16×16 products (Q's blocks stay in registers as A matrices, K's are loaded
//   straight from the storage buffer as B matrices) → scratch (f32); each lane takes half of one
//   row: mask, max, P = exp2(S - m) → ps (f16); O += P·V (V's blocks from the buffer, O's blocks
//   in registers).
// The subgroups share only the K/V lines in cache and the rescale flag (one row's raise sends
// every subgroup through the rescale); workgroup barriers otherwise order each subgroup's
// hand-overs between its lanes and its matrices (a subgroup barrier would not order workgroup
// memory under Vulkan).
// The running max is raised only when a row's tile max exceeds it by more than RESCALE (P then
// stays below 2^RESCALE): O sits in cooperative matrices, whose elements no invocation can
// scale by row, so a rescale takes a trip through scratch, and most tiles need none. Whether any
// row of the workgroup needs one is made uniform with workgroupUniformLoad, because cooperative
// operations must be in uniform control flow.
//
// Layouts: Q, K and V are packed per head with their rows padded with zeros to whole blocks
// (Q to BM rows, K and V to BN; `pack.rs`), so every matrix load stays inside its head and keys
// past seq_k carry zeros; O is unpadded. scratch[sg][row][key] and ps[sg][row][key]. A lane
// walks its half row starting at a lane-dependent column (ROT), so that the 32 lanes of a
// subgroup touch 32 different banks at every step.
enable f16;
enable wgpu_cooperative_matrix;
alias ET = f16;
alias IN = f16;

const D: u32 = {{D}}u;
const D4: u32 = D / 4u;
const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const W: u32 = BN / 2u; // keys per lane per tile
const SG: u32 = BM / 16u;
const T: u32 = SG * 32u;
const CAUSAL: bool = {{CAUSAL}};
const NEG: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;
// log2 units: P stays below 2^RESCALE between rescales.
const RESCALE: f32 = 8.0;

{{BINDINGS}}

// Every workgroup variable is a multiple of 16 bytes, so that wherever the driver places them,
// matrix rows stay on 16-byte boundaries: with an 8-byte variable among them the H100 returned
// wrong products (docs/experiments.md).
var<workgroup> scratch: array<f32, SG * 16u * BN>;
var<workgroup> ps: array<f16, SG * 16u * BN>;
// Set by any invocation whose row needs a rescale in this tile; two, alternating by tile, so
// that one is reset while the other is in use (four words: see above).
var<workgroup> rescale_any: array<atomic<u32>, 4>;

@compute @workgroup_size(T)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let bh_grid = wid.y + wid.z * P.grid_y;
    if (bh_grid >= P.bh_total) {
        return;
    }
    // Causal: the blocks with the most keys start first, across heads (see `Params`).
    let order = wid.x + bh_grid * P.n_qblocks;
    let bh = select(bh_grid, order % P.bh_total, CAUSAL);
    let qblk = select(wid.x, P.n_qblocks - 1u - order / P.bh_total, CAUSAL);
    let m0 = qblk * BM;
    let b = bh / P.heads_q;
    let h = bh % P.heads_q;
    // Padded rows per head of the packed Q and K/V.
    let q_rows = (P.seq_q + BM - 1u) / BM * BM;
    let k_rows = (P.seq_k + BN - 1u) / BN * BN;
    let q_at = (bh * q_rows + m0 + sg * 16u) * D; // this subgroup's first Q element
    let kv_at = (b * P.heads_kv + h / P.group) * k_rows * D;
    // This dispatch's keys (`Params`), and (causal) up to the last row's diagonal.
    var n_end = min(P.seq_k, P.key_end);
    if (CAUSAL) {
        n_end = u32(clamp(i32(m0 + BM) + P.causal_offset, 0, i32(n_end)));
    }
    let n_tiles = (n_end + BN - 1u) / BN;

    // This lane's row of the subgroup's 16, which half of the tile's keys it takes, and where in
    // that half it starts.
    let row = lane / 2u;
    let half = lane % 2u;
    let rot = lane * W / 32u;
    let q_row = m0 + sg * 16u + row;
    let sc = sg * 16u * BN; // this subgroup's scratch and ps
    let mine = sc + row * BN + half * W; // this lane's half row in them
    if (lid < 2u) {
        atomicStore(&rescale_any[lid], 0u);
    }

{{Q_LOAD}}
{{O_DECL}}
    var m_run = NEG; // this row's running max (both lanes of the row hold it)
    var l_run = 0.0; // this lane's part of the row sum

    for (var t = P.key_begin / BN; t < n_tiles; t++) {
        let n0 = t * BN;
        let k_at = kv_at + n0 * D;
{{S_MMA}}

        // Softmax of this lane's half row, in base-2 units (scores were scaled by scale·log2 e).
        let lim = select(i32(P.seq_k), min(i32(P.seq_k), i32(q_row) + P.causal_offset + 1), CAUSAL);
        let first = i32(n0 + half * W);
        var tmax = NEG;
{{S_READ}}
        tmax = max(tmax, subgroupShuffleXor(tmax, 1u));
        let raise = tmax > m_run + RESCALE;
        let m_new = select(m_run, tmax, raise);
        let alpha = exp2(m_run - m_new); // 1 unless raised; 0 from the initial NEG
        m_run = m_new;
        l_run = l_run * alpha;
        // Rows that have seen no key keep NEG; subtracting 0 makes their exp2 underflow to 0.
        let offset = select(m_run, 0.0, m_run <= NEG);
{{P_WRITE}}
        if (raise) {
            atomicStore(&rescale_any[t % 2u], 1u);
        }
        // A barrier (P now visible) that also makes the flag uniform.
        let any_raise = workgroupUniformLoad(&rescale_any[t % 2u]);
        if (lid == 0u) {
            atomicStore(&rescale_any[(t + 1u) % 2u], 0u);
        }
        if (any_raise != 0u) {
{{O_RESCALE}}
        }
{{PV_MMA}}
    }

    // Row sums, then O through scratch to global memory, normalised.
    let l_row = l_run + subgroupShuffleXor(l_run, 1u);
    let inv = select(1.0 / l_row, 0.0, l_row == 0.0);
    workgroupBarrier(); // every lane is done with scratch
{{O_STORE}}
    if (half == 0u && q_row < P.seq_q) {
        let empty = l_row == 0.0;
        lse[bh * P.seq_q + q_row] = select((m_run + log2(l_row)) * LN2, bitcast<f32>(P.neg_inf_bits), empty);
    }
    loop_limit_probe();
}
