// FlashAttention-2-class backward for sm_80+ (Ampere/Ada; runs on Hopper too), in three kernels:
//
//   attn_bwd_pre   D/8 lanes per query row: D = rowsum(dO ∘ O) in f32, the row's dQ accumulator
//                  zeroed (and, for the deterministic mode, the query blocks' counters)
//   attn_bwd       one CTA per (block of BN keys, kv head, sequence): K and V stay in shared
//                  memory, dK and dV in registers (each of the 4 warps owns 16 keys), and the CTA
//                  walks every query head of its GQA group and every block of BM query rows that
//                  sees its keys:
//                    S^T  = K Q^T,  dP^T = V dO^T          mma.sync m16n8k16, f32 accumulate
//                    P^T  = exp2(s log2(e) - lse log2(e)), dS^T = P^T (dP^T - D) (1 - tanh^2)
//                    dV  += P^T dO, dK += dS^T Q            P^T, dS^T from the accumulators
//                    dQ  += dS K                            dS^T through shared memory, added to
//                                                           the f32 accumulator with atomics
//   attn_bwd_dq    D/8 lanes per query row: dQ = scale * accumulator, rounded to the dtype
//
// With p.deterministic the dQ additions of the key blocks meeting one query block are ordered by
// a counter per (sequence, query head, query block): key block n adds after every higher one has,
// so the sums are the same bits on every run and grid (with p.dq_copies > 1 each copy of the
// accumulator has its counter and its share of the key blocks: flash_bwd_common.cuh's
// dq_turn_of). Blocks start in grid order (key blocks fastest, the last first in this mode), so a
// CTA only ever waits for CTAs started before it.
//
// Every feature of the forward but a paged cache is a run-time parameter here (mask bounds,
// soft-cap, ALiBi slopes, packed sequences, key counts), and the head dim is too (a multiple of 8
// up to D, the chunks past it load as zeros). Specialised at compile time (NVRTC -D): ATTN_BF16
// (else f16), ATTN_D (64 or 128; 256 compiles the row passes only, for the Hopper family's main
// pass: here dK and dV of 16 keys a warp by 256 columns would take every register). The host's
// variant (crates/attn-cuda/src/backward/variant.rs) mirrors the shared-memory size computed here.

#include "mma_sm80.cuh"         // elem_t, mma.sync, ldmatrix, cp.async groups, quad reductions
#include "flash_bwd_common.cuh"  // Params, sequences, the mask and the gradient of one score

constexpr int D = ATTN_D;
constexpr int WARPS = 4;
constexpr int THREADS = 32 * WARPS;
constexpr int BM = 64;          // query rows per step: 16 per warp in the dQ product
static_assert(D == 64 || D == 128 || D == 256, "head dims 64, 128 and 256 (smaller ones run padded)");

// Byte address of 16-byte chunk c of row `row` in a [rows][LEN] tile whose rows are
// XOR-swizzled in groups of 8 chunks (LEN a multiple of 64): ldmatrix reads are conflict-free.
template <int LEN>
__device__ __forceinline__ unsigned addr(const elem_t* tile, int row, int c) {
    return smem_u32(tile) + (row * LEN + ((c & ~7) | ((c & 7) ^ (row & 7))) * 8) * 2;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    // src-size 0 zero-fills: rows past the sequence and chunks past the head dim read as zeros.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// Rows r0 .. r0 + ROWS of a [rows][D] matrix (row stride `stride`) into a swizzled tile; rows at or
// past `limit` and chunks at or past `chunks` become zeros.
template <int ROWS>
__device__ __forceinline__ void load_rows(elem_t* tile, const elem_t* g, long long stride, int r0, int limit,
                                          int chunks) {
    constexpr int CPR = D / 8;
#pragma unroll
    for (int it = 0; it < ROWS * CPR / THREADS; ++it) {
        const int i = threadIdx.x + it * THREADS;
        const int r = i / CPR, c = i % CPR;
        const bool valid = r0 + r < limit && c < chunks;
        cp_async16(addr<D>(tile, r, c), valid ? g + (long long)(r0 + r) * stride + c * 8 : g, valid);
    }
}

// ---------------------------------------------------------------------------------------------
// The row passes: grid (ceil(seq_q / ROW_BLOCK), heads_q, batch), 4 warps. A row takes ROW_LANES
// lanes, each one 16-byte chunk of 8 of its head dims (ROW_LANES * 8 = D: 8, 16 or 32 lanes, 4, 2
// or 1 rows a warp), and 2 chunks of 4 floats of each copy of the accumulator (16-byte chunks in
// either of dq_at's layouts). Strides are multiples of 8 elements (check_alignment).
constexpr int ROW_LANES = D / 8;
constexpr int ROW_BLOCK = WARPS * (32 / ROW_LANES);  // rows a block: variant.rs's row_block
static_assert(ROW_LANES <= 32 && 32 % ROW_LANES == 0, "a row's lanes within a warp");

// This thread's row of its (head, sequence); its chunk of the row is threadIdx.x % ROW_LANES.
__device__ __forceinline__ int row_of_thread() {
    return blockIdx.x * ROW_BLOCK + threadIdx.x / ROW_LANES;
}

// Eight elements from 16 bytes, as floats.
__device__ __forceinline__ void unpack8(uint4 v, float (&x)[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const elem2_t e = *reinterpret_cast<const elem2_t*>(&w[k]);
        x[2 * k] = to_f(e.x);
        x[2 * k + 1] = to_f(e.y);
    }
}

// Pre-pass: D = rowsum(dO * O) for every row, its dQ accumulator zeroed (every copy), and in the
// deterministic mode the counters of the query blocks.
extern "C" __global__ void __launch_bounds__(THREADS) attn_bwd_pre(const __grid_constant__ Params p) {
    const int c = threadIdx.x % ROW_LANES;
    const int h = blockIdx.y, b = blockIdx.z;
    const int i = row_of_thread();
    const Seq s = seq_of(p, b);
    if (p.deterministic && i < p.seq_q && i % BM == 0) {
        for (int copy = c; copy < p.dq_copies; copy += ROW_LANES) *counter_at(p, b, h, i / BM, copy) = 0;
    }
    const bool row = i < s.q_len;  // no return before the shuffles: every lane takes part
    float sum = 0.f;
    if (row && c < p.head_dim / 8) {
        const long long at = q_base(p, s, b, h, p.o_sb, p.o_sh, p.o_ss) + (long long)i * p.o_ss + 8 * c;
        float o[8], d_o[8];
        unpack8(*reinterpret_cast<const uint4*>(p.o + at), o);
        unpack8(*reinterpret_cast<const uint4*>(p.d_o + at), d_o);
#pragma unroll
        for (int k = 0; k < 8; ++k) sum += o[k] * d_o[k];
    }
#pragma unroll
    for (int off = ROW_LANES / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffff, sum, off);
    if (!row) return;
    const long long r = row_index(p, s, b, h, i);
    if (c == 0) p.delta[r] = sum;
#pragma unroll
    for (int k = 0; k < 2; ++k) {  // chunks c and c + ROW_LANES: each store a row's contiguous half
        const long long at = dq_at<D>(p, s, b, h, i, r, 4 * (c + k * ROW_LANES));
        for (int copy = 0; copy < p.dq_copies; ++copy)
            *reinterpret_cast<float4*>(p.dq_accum + copy * dq_copy_floats<D>(p) + at) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// dQ from its accumulator (the copies summed in order): scale * sum, rounded to the dtype.
extern "C" __global__ void __launch_bounds__(THREADS) attn_bwd_dq(const __grid_constant__ Params p) {
    const int c = threadIdx.x % ROW_LANES;
    const int h = blockIdx.y, b = blockIdx.z;
    const int i = row_of_thread();
    const Seq s = seq_of(p, b);
    if (i >= s.q_len || c >= p.head_dim / 8) return;  // no shuffles here
    const long long r = row_index(p, s, b, h, i);
    float x[8];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const long long at = dq_at<D>(p, s, b, h, i, r, 4 * (2 * c + k));
        float4 v = *reinterpret_cast<const float4*>(p.dq_accum + at);
        for (int copy = 1; copy < p.dq_copies; ++copy) {
            const float4 w = *reinterpret_cast<const float4*>(p.dq_accum + copy * dq_copy_floats<D>(p) + at);
            v.x += w.x;
            v.y += w.y;
            v.z += w.z;
            v.w += w.w;
        }
        x[4 * k] = v.x;
        x[4 * k + 1] = v.y;
        x[4 * k + 2] = v.z;
        x[4 * k + 3] = v.w;
    }
    uint4 out;
    out.x = as_u32(pack2(x[0] * p.scale, x[1] * p.scale));
    out.y = as_u32(pack2(x[2] * p.scale, x[3] * p.scale));
    out.z = as_u32(pack2(x[4] * p.scale, x[5] * p.scale));
    out.w = as_u32(pack2(x[6] * p.scale, x[7] * p.scale));
    *reinterpret_cast<uint4*>(p.dq + q_base(p, s, b, h, p.q_sb, p.q_sh, p.q_ss) + (long long)i * p.q_ss + 8 * c) = out;
}

// ---------------------------------------------------------------------------------------------
// Main pass: grid (ceil(seq_k / BN), heads_kv, batch). Head dims 64 and 128. Not in the row
// passes built for the Hopper main pass's planes (ATTN_DQ_PLANES): this one adds row-major.
#if ATTN_D <= 128 && !ATTN_DQ_PLANES
constexpr int BN = 16 * WARPS;  // keys per CTA: 16 per warp
extern "C" __global__ void __launch_bounds__(THREADS) attn_bwd(const __grid_constant__ Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    elem_t* sK = reinterpret_cast<elem_t*>(smem);
    elem_t* sV = sK + BN * D;
    elem_t* sQ = sV + BN * D;
    elem_t* sdO = sQ + BM * D;
    elem_t* sS = sdO + BM * D;  // dS^T, [BN][BM]
    float* sLse = reinterpret_cast<float*>(sS + BN * BM);
    float* sDelta = sLse + BM;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // Blocks start in grid order, x fastest. By default key block 0 first: under a causal mask
    // the low key blocks meet the most query blocks, and the longest CTAs should start first.
    // Deterministic, the last key block first, because dQ's additions go from the last key block
    // down (see below) and a CTA may only wait for CTAs that started before it.
    const int n_block = p.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int g = blockIdx.y, b = blockIdx.z;
    const Seq s = seq_of(p, b);
    const int n0 = n_block * BN;
    if (n0 >= s.k_len) return;  // the whole CTA: no barrier is left waiting
    const int chunks = p.head_dim / 8;
    const int shift = s.k_len - s.q_len;
    const elem_t* k = p.k + k_base(p, s, b, g, p.k_sb, p.k_sh, p.k_ss);
    const elem_t* v = p.v + k_base(p, s, b, g, p.v_sb, p.v_sh, p.v_ss);
    load_rows<BN>(sK, k, p.k_ss, n0, s.k_len, chunks);
    load_rows<BN>(sV, v, p.v_ss, n0, s.k_len, chunks);
    cp_commit();

    // The query rows that see some key of this block: [rows.lo, rows.hi).
    const Rows rows = rows_seeing(p, s, n0, min(n0 + BN, s.k_len));
    const int m_lo = rows.lo / BM, m_hi = rows.hi > rows.lo ? (rows.hi + BM - 1) / BM : m_lo;

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.f;

    const int group = p.heads_q / p.heads_kv;
    const int key0 = n0 + warp * 16 + lane / 4;  // this thread's keys: key0 and key0 + 8
    for (int hh = 0; hh < group; ++hh) {
        const int h = g * group + hh;
        const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;
        const long long qb = q_base(p, s, b, h, p.q_sb, p.q_sh, p.q_ss);
        const long long ob = q_base(p, s, b, h, p.o_sb, p.o_sh, p.o_ss);
        for (int m = m_lo; m < m_hi; ++m) {
            const int m0 = m * BM;
            __syncthreads();  // every warp is done with the last step's Q, dO, dS^T
            load_rows<BM>(sQ, p.q + qb, p.q_ss, m0, s.q_len, chunks);
            load_rows<BM>(sdO, p.d_o + ob, p.o_ss, m0, s.q_len, chunks);
            cp_commit();
            if (threadIdx.x < BM) {
                const int i = m0 + threadIdx.x;
                const bool row = i < s.q_len;
                const long long at = row_index(p, s, b, h, row ? i : 0);
                sLse[threadIdx.x] = row ? p.lse[at] * LOG2E : POS_INF;
                sDelta[threadIdx.x] = row ? p.delta[at] : 0.f;
            }
            cp_wait<0>();
            __syncthreads();

            // S^T = K Q^T and dP^T = V dO^T: this warp's 16 keys against the BM rows.
            float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.f;
            // Rolled at D = 128: unrolled, ptxas hoists the loads of every step and spills beside
            // dK and dV's 128 registers.
#pragma unroll(D == 128 ? 1 : D / 16)
            for (int kk = 0; kk < D / 16; ++kk) {
                unsigned ak[4], av[4];
                ldsm_x4(addr<D>(sK, warp * 16 + (lane & 15), 2 * kk + (lane >> 4)), ak);
                ldsm_x4(addr<D>(sV, warp * 16 + (lane & 15), 2 * kk + (lane >> 4)), av);
#pragma unroll
                for (int n2 = 0; n2 < BM / 16; ++n2) {
                    const int r = n2 * 16 + (lane & 7) + ((lane >> 4) << 3), c = 2 * kk + ((lane >> 3) & 1);
                    unsigned bq[4], bo[4];
                    ldsm_x4(addr<D>(sQ, r, c), bq);
                    ldsm_x4(addr<D>(sdO, r, c), bo);
                    mma(st[2 * n2], ak, bq[0], bq[1]);
                    mma(st[2 * n2 + 1], ak, bq[2], bq[3]);
                    mma(dpt[2 * n2], av, bo[0], bo[1]);
                    mma(dpt[2 * n2 + 1], av, bo[2], bo[3]);
                }
            }
            // P^T and dS^T, rounded to 16 bits as A fragments at once (so that the f32 tiles die
            // here): the accumulators of row tiles 2kk and 2kk + 1 are fragment kk, element
            // pairs (e, e + 1) one register each.
            unsigned ap[BM / 16][4], ad[BM / 16][4];
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float prob[2], ds[2];
#pragma unroll
                    for (int x = 0; x < 2; ++x) {
                        const int e = 2 * r + x;
                        const int key = key0 + r * 8;
                        const int qi = nt * 8 + 2 * (lane % 4) + x;
                        const int row = m0 + qi, diag = row + shift;
                        const Grad gr = grad_of(p, sees(p, s, key, row, diag), key, diag, slope, st[nt][e],
                                                dpt[nt][e], sLse[qi], sDelta[qi]);
                        prob[x] = gr.p;
                        ds[x] = gr.ds;
                    }
                    ap[nt / 2][(nt % 2) * 2 + r] = as_u32(pack2(prob[0], prob[1]));
                    ad[nt / 2][(nt % 2) * 2 + r] = as_u32(pack2(ds[0], ds[1]));
                }
            // dV += P^T dO, dK += dS^T Q; dO and Q by ldmatrix.trans.
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk) {
#pragma unroll
                for (int d2 = 0; d2 < D / 16; ++d2) {
                    const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), c = 2 * d2 + (lane >> 4);
                    unsigned bo[4], bq[4];
                    ldsm_x4_trans(addr<D>(sdO, r, c), bo);
                    ldsm_x4_trans(addr<D>(sQ, r, c), bq);
                    mma(dv[2 * d2], ap[kk], bo[0], bo[1]);
                    mma(dv[2 * d2 + 1], ap[kk], bo[2], bo[3]);
                    mma(dk[2 * d2], ad[kk], bq[0], bq[1]);
                    mma(dk[2 * d2 + 1], ad[kk], bq[2], bq[3]);
                }
            }
            // dS^T to shared memory, for dQ's product across the warps' keys.
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = warp * 16 + lane / 4 + r * 8, col = nt * 8 + 2 * (lane % 4);
                    const unsigned a = addr<BM>(sS, row, col / 8) + (col % 8) * 2;
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(ad[nt / 2][(nt % 2) * 2 + r]));
                }
            __syncthreads();

            // dQ[rows of this warp] += dS K: A = dS by ldmatrix.trans of dS^T, B = K by .trans.
            unsigned as[BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk)
                ldsm_x4_trans(addr<BM>(sS, kk * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * warp + ((lane >> 3) & 1)), as[kk]);
            // Deterministic: after every higher key block that adds to the same copy of this
            // query block's dQ (they started earlier). From the top down, each CTA waits only for
            // ones above it to be steps ahead: from the bottom up, under a causal mask, the CTA
            // of key block n would wait for key block 0's CTA to walk n query blocks first.
            const DqTurn turn = dq_turn_of<BN, BM, D>(p, s, b, h, n_block, m);
            if (p.deterministic) {
                if (threadIdx.x == 0) {
                    while (atomicAdd(turn.counter, 0) != turn.before) __nanosleep(64);
                }
                __syncthreads();
                __threadfence();
            }
            const int qrow = m0 + warp * 16 + lane / 4;
#pragma unroll
            for (int d2 = 0; d2 < D / 16; ++d2) {
                float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
                for (int kk = 0; kk < BN / 16; ++kk) {
                    unsigned bk[4];
                    ldsm_x4_trans(addr<D>(sK, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), 2 * d2 + (lane >> 4)), bk);
                    mma(acc[0], as[kk], bk[0], bk[1]);
                    mma(acc[1], as[kk], bk[2], bk[3]);
                }
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = qrow + (e >> 1) * 8;
                        const int col = (2 * d2 + j) * 8 + 2 * (lane % 4) + (e & 1);
                        if (row < s.q_len) atomicAdd(turn.accum + row_index(p, s, b, h, row) * D + col, acc[j][e]);
                    }
            }
            if (p.deterministic) {
                __threadfence();
                __syncthreads();
                if (threadIdx.x == 0) atomicAdd(turn.counter, 1);
            }
        }
    }

    // dK (times the scale) and dV through this warp's own rows of sK and sV, then 16-byte stores.
    __syncthreads();  // every warp is done reading sK and sV
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = warp * 16 + lane / 4 + r * 8, col = dt * 8 + 2 * (lane % 4);
            const unsigned off = (col % 8) * 2;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr<D>(sK, row, col / 8) + off),
                         "r"(as_u32(pack2(dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale))));
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr<D>(sV, row, col / 8) + off),
                         "r"(as_u32(pack2(dv[dt][2 * r], dv[dt][2 * r + 1]))));
        }
    __syncwarp();
    elem_t* dk_out = p.dk + k_base(p, s, b, g, p.k_sb, p.k_sh, p.k_ss);
    elem_t* dv_out = p.dv + k_base(p, s, b, g, p.v_sb, p.v_sh, p.v_ss);
#pragma unroll
    for (int it = 0; it < 16 * (D / 8) / 32; ++it) {
        const int i = lane + it * 32;
        const int r = warp * 16 + i / (D / 8), c = i % (D / 8);
        if (n0 + r < s.k_len && c < chunks) {
            uint4 x, y;
            asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                         : "r"(addr<D>(sK, r, c)));
            asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(y.x), "=r"(y.y), "=r"(y.z), "=r"(y.w)
                         : "r"(addr<D>(sV, r, c)));
            *reinterpret_cast<uint4*>(dk_out + (long long)(n0 + r) * p.k_ss + c * 8) = x;
            *reinterpret_cast<uint4*>(dv_out + (long long)(n0 + r) * p.v_ss + c * 8) = y;
        }
    }
}
#endif  // ATTN_D <= 128 && !ATTN_DQ_PLANES
