// Split-KV decode (flash-decoding) for short query lengths, on mma.sync (sm_80 and later).
//
// One CTA owns BM = 16 * MTILES query rows that read the same K/V head: the rows of a GQA group
// (group * seq_q rows in all, head-major: row R is query R % seq_q of the group's head
// R / seq_q), or a block of them where there are more than BM (`row_blocks`). The CTA reads
// one split of the keys (flash-decoding: the keys are cut into `splits` runs of whole chunks,
// one CTA each), so every K/V byte is read once per row block, not once per query head.
//
// Inside a CTA the WARPS warps take the split's chunks of BN keys in turn (warp w: chunks w,
// w + WARPS, ...), each warp with its own STAGES-deep ring of cp.async copies (16 bytes a lane)
// and its own online softmax over all BM rows: no block barrier in the key loop. Per chunk:
//   S = Q K^T      mma.sync m16n8k16, Q from shared memory (ldmatrix), K (ldmatrix)
//   online softmax in base 2, p = exp2(s * scale * log2(e) - max)
//   O += P V       P from the S accumulators as A fragments, V by ldmatrix.trans
// Q's shared-memory rows are padded to D + 8 elements, so that the 8 rows an ldmatrix phase reads
// fall in distinct banks. The rings' rows are not: where a row is a whole number of 128-byte
// lines (D = 64, 128, 256) each 16-byte piece c of row r sits at piece c ^ (r % 8) of its row (the
// 128-byte swizzle), which spreads those 8 rows over the banks as the padding does, and keeps each
// copied line whole in shared memory: copies into padded rows streamed K/V 9% slower (4.24 against
// 4.64 TB/s on an H200, bench/device/stream_probe.cu). D = 80 and 96 keep padded rings.
//
// Then the warps' results are merged through shared memory (in warp order), and:
// - with one split, o and the LSE are written;
// - with several, the split's normalised o (f32) and LSE go to the workspace, and the last CTA of
//   the (batch, KV head, row block) to finish (an atomic ticket, reset to 0 by that CTA) merges
//   all splits by log-sum-exp in split order (deterministic, whichever CTA is last): the math of
//   attn-core's `softmax::merge`.
//
// The persistent form (ATTN_PERSIST, `persistent` below): fewer CTAs than (sequence, KV head,
// row block) items, each taking items in turn with its warps' copy rings running on from one
// item into the next.
//
// Masks (ATTN_MASKED): a per-row window [i + shift - left, i + shift + right] with shift =
// seq_k - seq_q (bottom-right); causal is left = unbounded, right = 0. The CTA walks only the
// keys some of its rows see.
//
// Extras (ATTN_EXTRAS; the plain variants compile without any of it, to the same PTX):
// - packed (varlen) queries and keys (`cu_seqlens_q`, `cu_seqlens_k`, null: dense rows): a
//   sequence's rows start at its offset (the batch stride unused) and its lengths are its own;
//   rows of a group past a sequence's queries (the launch's rows are sized by the longest) are
//   padding that sees nothing and is not stored.
// - per-sequence key counts (`seqused_k`, null: `seq_k` each): a sequence's keys, shift and
//   window are its own. Every sequence cuts its keys into the launch's `splits` (sized by the
//   host for the longest); a split past a short sequence's last chunk walks no key and leaves
//   an empty partial (LSE -inf), which the merge weighs 0.
// - a paged cache (`block_table`, null: dense rows): key j of sequence b is row j % page_size of
//   page block_table[b][j / page_size], `k_sb` stepping from page to page. The key range starts
//   on a chunk boundary, so a chunk (BN <= 32 keys) with pages of a multiple of 16 keys lies in
//   at most two pages: `load_chunk` reads both pages' numbers once per chunk.
// - soft-cap and ALiBi: each score becomes cap * tanh(s / cap) (s the scaled score) minus
//   slope * |i + shift - j|, computed in base-2 units (so the softmax takes it unscaled).
//
// Padded head dims (ATTN_PAD, with the extras): the problem's head dim (`head_dim`, a multiple
// of 8) is below D, the kernel's. Its columns are loaded and stored as they are; the columns past
// it are zeros in shared memory (Q's written as zeros, the rings' zeroed once, which no copy
// overwrites), so the products over D add nothing for them, and nothing is stored from them.
//
// Specialised at compile time (NVRTC -D): ATTN_BF16, ATTN_D (multiple of 16), ATTN_MTILES,
// ATTN_WARPS, ATTN_BN (multiple of 16), ATTN_STAGES, ATTN_MASKED, ATTN_L2_PREFETCH, ATTN_EXTRAS, ATTN_PAD,
// ATTN_PERSIST (the persistent form, see `persistent`), ATTN_SHARED_BYTES (the host's dynamic
// shared memory, checked against what this file computes). The host's plan
// (crates/attn-cuda/src/decode/variant.rs) mirrors the shared-memory size computed here.

#include "mma_sm80.cuh"  // elem_t, mma.sync, ldmatrix, cp.async groups, quad reductions

constexpr int D = ATTN_D;
constexpr int DP = D + 8;  // Q's shared-memory row, elements: padded (see the file's notes)
constexpr int MT = ATTN_MTILES;
constexpr int BM = 16 * MT;
constexpr int WARPS = ATTN_WARPS;
constexpr int BN = ATTN_BN;
constexpr int STAGES = ATTN_STAGES;
constexpr bool MASKED = ATTN_MASKED;
constexpr bool PAD = ATTN_PAD;
constexpr int Q_BUFFERS = ATTN_PERSIST ? 2 : 1;  // the persistent form copies the next item's Q in
constexpr int THREADS = 32 * WARPS;
constexpr int CPR = D / 8;  // 16-byte chunks per row
// The K/V rings' rows (see the file's notes): unpadded, with 16-byte piece c of row r at piece
// c ^ (r % 8), where a row is a whole number of 128-byte lines (D = 64, 128, 256); padded as Q's
// where it is not (D = 80, 96).
constexpr bool SWIZZLED = CPR % 8 == 0;
constexpr int RP = SWIZZLED ? D : DP;  // a ring row, elements
// Where piece c of ring row r lies, in bytes from the ring chunk's start. (flash_fwd.cu's
// swizzle() on whole 128-byte groups, written as the XOR alone: its general form, tails included,
// compiled to other code here, 2026-11-28.)
__device__ __forceinline__ unsigned ring_at(int r, int c) { return r * RP * 2 + (SWIZZLED ? c ^ (r & 7) : c) * 16; }
// x, which ptxas cannot see through (so that what derives from it is not hoisted out of a loop);
// unpadded rings only: the padded ones' columns are constants added to the addresses.
__device__ __forceinline__ unsigned opaque(unsigned x) {
    if (SWIZZLED) asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
    return x;
}
constexpr float RESCALE_SLACK = 8.f;
constexpr float LN2 = 0.69314718055994531f;

static_assert(D % 16 == 0 && BN % 16 == 0, "head dim and key chunk must be multiples of 16");
static_assert(STAGES >= 1, "at least one stage");
static_assert(!ATTN_EXTRAS || BN <= 32, "a paged chunk must lie in at most two pages of 16 keys or more");
static_assert(!PAD || ATTN_EXTRAS, "padded head dims come with the extras");

// Shared memory: Q (BM rows; two buffers in the persistent form), then each warp's ring of STAGES (K, V) chunk pairs; the warps'
// merge reuses it from the start. Mirrored by `Variant::shared_bytes`.
constexpr int Q_ELEMS = BM * DP;
constexpr int CHUNK_ELEMS = BN * RP;
constexpr int RING_ELEMS = STAGES * 2 * CHUNK_ELEMS;
constexpr int KV_BYTES = (Q_BUFFERS * Q_ELEMS + WARPS * RING_ELEMS) * 2;
constexpr int MERGE_BYTES = WARPS * BM * (D + 2) * 4;
// The host's size (ATTN_SHARED_BYTES, `Variant::shared_bytes`) holds both.
static_assert(ATTN_SHARED_BYTES >= KV_BYTES && ATTN_SHARED_BYTES >= MERGE_BYTES, "host and kernel disagree on shared memory");

// Must match `DecodeParams` in crates/attn-cuda/src/decode/launch.rs field for field.
struct Params {
    const elem_t* q;
    const elem_t* k;
    const elem_t* v;
    elem_t* o;
    float* lse;          // null when not asked for
    float* partial_o;    // [pairs][splits][BM][D], with several splits
    float* partial_lse;  // [pairs][splits][BM]
    unsigned* tickets;   // [pairs], zero before a launch and after it
    long long q_sb, q_sh, q_ss;
    long long k_sb, k_sh, k_ss;
    long long v_sb, v_sh, v_ss;
    long long o_sb, o_sh, o_ss;
    int batch, heads_q, heads_kv, seq_q, seq_k;
    int group;       // heads_q / heads_kv
    int rows;        // group * seq_q
    int row_blocks;  // ceil(rows / BM)
    int splits;
    int window_left, window_right;  // keys before / after the diagonal a row sees (masked only)
    float scale_log2;               // softmax scale * log2(e)
    int head_dim;                   // the problem's: D, or below it with ATTN_PAD
#if ATTN_EXTRAS
    // Read by the extras variants only (the host always passes them, after the fields above).
    const int* block_table;     // [batch, pages_per_seq] page numbers; null: dense K/V rows
    const int* seqused_k;       // [batch] keys each sequence uses; null: seq_k
    const float* alibi_slopes;  // [heads_q] or [batch, heads_q]; null: no ALiBi
    int page_size, pages_per_seq;
    int alibi_batch_stride;     // 0 (a slope per head) or heads_q (per sequence and head)
    float softcap_log2;         // cap * log2(e); 0: no soft-cap
    float softcap_inv;          // |softmax scale| / cap
    int pages;                  // pages in a paged cache (the page numbers' clamp)
    const int* cu_seqlens_q;    // [batch + 1] packed query offsets; null: dense queries
    const int* cu_seqlens_k;    // [batch + 1] packed key offsets; null: dense or paged keys
    int q_total;                // packed query rows (the offsets' clamp; the LSE is [heads_q, q_total])
    int kv_total;               // packed key rows (the offsets' clamp)
#endif
};

// The element offset of key (or value) row `j` of KV head `g` of sequence `b`, in a tensor of
// strides (sb, sh, ss). The one place a K/V row's address is formed: a paged cache replaces it
// with a block-table lookup (page = table[b][j / page_size]) and nothing else changes.
__device__ __forceinline__ long long kv_row(long long sb, long long sh, long long ss, int b, int g, int j) {
    return (long long)b * sb + (long long)g * sh + (long long)j * ss;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
#if ATTN_L2_PREFETCH
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
#endif
}

#if ATTN_EXTRAS
// Packed rows of sequence b (attn_core::SeqMap's definition): its first row and its length,
// from the offsets `cu` (`total` rows in all, at most `most` a sequence); null offsets: dense,
// row 0 and `most`. Each index is clamped into the problem's bounds (a caller's device arrays
// are not checked on the host): the start into [0, total], the end at or after the start,
// within `total` and at most `most` rows on. Valid offsets pass unchanged.
struct SeqRows {
    int start, len;
};
__device__ __forceinline__ SeqRows seq_rows(const int* cu, int b, int total, int most) {
    if (cu == nullptr) return {0, most};
    const int start = min(max(cu[b], 0), total);
    return {start, min(min(max(cu[b + 1], start), total) - start, most)};
}
#endif

// One warp's copy of keys n0 .. n0 + BN into a chunk of its ring (K and V); keys at or past
// `end` read as zeros (their scores are masked, and zero values keep P V finite).
__device__ __forceinline__ void load_chunk(const Params& p, elem_t* sk, elem_t* sv, int b, int g, int n0,
                                           int end, int lane) {
#if ATTN_EXTRAS
    // Where the chunk's rows are: sequence b's rows (dense, or packed from its first row), or
    // rows of at most two pages (n0 is a multiple of BN, see the file's notes): keys before
    // `boundary` on the first, the rest on the second. The element offset of key j is
    // base + g * sh + j * ss, base by its sequence or page.
    // (Packed keys: the sequence's first row is read again for each chunk, a cached load, rather
    // than held in a register through the key loop.)
    const int first_row = seq_rows(p.cu_seqlens_k, b, p.kv_total, p.seq_k).start;
    const bool packed = p.cu_seqlens_k != nullptr;
    long long k_base0 = packed ? (long long)first_row * p.k_ss : (long long)b * p.k_sb;
    long long v_base0 = packed ? (long long)first_row * p.v_ss : (long long)b * p.v_sb;
    long long k_base1 = k_base0, v_base1 = v_base0;
    int boundary = end;
    if (p.block_table != nullptr) {
        const int* table = p.block_table + (long long)b * p.pages_per_seq;
        const int first = n0 / p.page_size;
        boundary = (first + 1) * p.page_size;
        // n0 < end: a used page. A page number outside [0, pages) (negative ones are huge as
        // unsigned) reads the last page: the contents of a caller's device table are not checked
        // on the host, and must not move a read outside k or v. Two mins per chunk.
        const unsigned last = (unsigned)p.pages - 1u;
        const long long page0 = min((unsigned)table[first], last);
        const long long page1 = boundary < end ? min((unsigned)table[first + 1], last) : page0;
        const long long start0 = (long long)first * p.page_size;
        k_base0 = page0 * p.k_sb - start0 * p.k_ss, v_base0 = page0 * p.v_sb - start0 * p.v_ss;
        k_base1 = page1 * p.k_sb - boundary * p.k_ss, v_base1 = page1 * p.v_sb - boundary * p.v_ss;
    }
#pragma unroll
    for (int it = 0; it < BN * CPR / 32; ++it) {
        const int i = lane + it * 32;
        const int r = i / CPR, c = i % CPR;
        if (PAD && c >= p.head_dim / 8) continue;  // zeros already (see the file's notes)
        const int j = n0 + r;
        const bool valid = j < end;
        const int jj = valid ? j : n0;  // a row that exists (nothing is read from it)
        const bool second = jj >= boundary;
        const unsigned off = ring_at(r, c);
        const long long k_row = (second ? k_base1 : k_base0) + (long long)g * p.k_sh + (long long)jj * p.k_ss;
        const long long v_row = (second ? v_base1 : v_base0) + (long long)g * p.v_sh + (long long)jj * p.v_ss;
        cp_async16(smem_u32(sk) + off, p.k + k_row + c * 8, valid);
        cp_async16(smem_u32(sv) + off, p.v + v_row + c * 8, valid);
    }
#else
#pragma unroll
    for (int it = 0; it < BN * CPR / 32; ++it) {
        const int i = lane + it * 32;
        const int r = i / CPR, c = i % CPR;
        const int j = n0 + r;
        const bool valid = j < end;
        const int jj = valid ? j : 0;
        const unsigned off = ring_at(r, c);
        cp_async16(smem_u32(sk) + off, p.k + kv_row(p.k_sb, p.k_sh, p.k_ss, b, g, jj) + c * 8, valid);
        cp_async16(smem_u32(sv) + off, p.v + kv_row(p.v_sb, p.v_sh, p.v_ss, b, g, jj) + c * 8, valid);
    }
#endif
}

// This thread's rows of the CTA's block (two per m-tile: lane / 4 and lane / 4 + 8): the keys
// each sees, and with the extras ALiBi's slope (base-2 units) and diagonal key i + shift.
struct Rows {
    int lo[MT][2], hi[MT][2];
#if ATTN_EXTRAS
    float slope[MT][2];
    int diagonal[MT][2];
#endif
};

// A warp's online softmax over the block's rows: unnormalised o, running max (log2 units), sum.
struct Softmax {
    float acc[MT][D / 8][4];
    float max[MT][2], sum[MT][2];
};

// A lane's ldmatrix offsets into a ring chunk: K's (non-transposed) and V's (transposed) B
// fragments' rows, and their 16-byte columns. A lane's ring row is a multiple of 8 plus
// lane % 8, and its piece 2 kk plus 0 or 1 (its `half`), so that on swizzled rows the piece lies
// at (2 kk + half) ^ (lane % 8), which is 2 kk ^ (half ^ lane % 8): the lane's own part, `k_col`
// and `v_col` in bytes, with 32 kk xored in at each step (ring_col).
struct Lanes {
    unsigned k_off, v_off, k_col, v_col;
};
__device__ __forceinline__ Lanes lanes_of(int lane) {
    return {((lane & 7) + ((lane >> 4) << 3)) * RP * 2u, ((lane & 7) + (((lane >> 3) & 1) << 3)) * RP * 2u,
            (SWIZZLED ? ((lane >> 3) & 1) ^ (lane & 7) : (lane >> 3) & 1) * 16u,
            (SWIZZLED ? (lane >> 4) ^ (lane & 7) : lane >> 4) * 16u};
}
__device__ __forceinline__ unsigned ring_col(int step, unsigned col) { return SWIZZLED ? (32u * step) ^ col : 32u * step + col; }

// Q's rows r0 .. r0 + BM of KV head g's group into `dst`: zeros past the group's last row and for
// queries at or past `q_len` (a packed sequence's own count), negated for a negative scale (scores
// are scaled inside the exponent by |scale|, see flash_fwd.cu). `q_seq`: the element offset of the
// sequence's first query row.
__device__ __forceinline__ void load_q(const Params& p, elem_t* dst, int r0, int g, long long q_seq, int q_len) {
    const unsigned flip = p.scale_log2 < 0.f ? 0x80008000u : 0u;
    for (int i = threadIdx.x; i < BM * CPR; i += THREADS) {
        const int r = i / CPR, c = i % CPR;
        const int row = r0 + r;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (row < p.rows && (!PAD || c < p.head_dim / 8)) {
            const int h = g * p.group + row / p.seq_q, qi = row % p.seq_q;
            if (qi < q_len) {
                x = *reinterpret_cast<const uint4*>(p.q + q_seq + (long long)h * p.q_sh + (long long)qi * p.q_ss + c * 8);
                x.x ^= flip, x.y ^= flip, x.z ^= flip, x.w ^= flip;
            }
        }
        *reinterpret_cast<uint4*>(dst + r * DP + c * 8) = x;
    }
}

// One chunk of BN keys from n0 (K at `sk`, V right after it in the warp's ring) folded into the
// warp's online softmax: S = Q K^T (Q's A fragments at q_addr), soft-cap and ALiBi (extras), the
// mask, the running max and its rescale, P = exp2(S - max), O += P V.
__device__ __forceinline__ void fold_chunk(const Params& p, unsigned q_addr, unsigned sk, const Lanes& ln, int n0,
                                           int hi, const Rows& rows, Softmax& sm, int lane, float sl2, float mul) {
    const unsigned sv = sk + CHUNK_ELEMS * 2;
    // The lane's swizzled columns, each taken anew where it is used (opaque(): held through the
    // loop, the addresses ptxas derived from them took 16 registers and spilled 8-16 bytes).
    const unsigned k_col = opaque(ln.k_col);

    float s[MT][BN / 8][4];
    zero_scores(s);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int t = 0; t < MT; ++t) ldsm_x4(q_addr + (t * 16 * DP + kk * 16) * 2, a[t]);
#pragma unroll
        for (int n2 = 0; n2 < BN / 16; ++n2) {
            unsigned bk[4];
            ldsm_x4(sk + ln.k_off + n2 * 16 * RP * 2 + ring_col(kk, k_col), bk);
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                mma(s[t][2 * n2], a[t], bk[0], bk[1]);
                mma(s[t][2 * n2 + 1], a[t], bk[2], bk[3]);
            }
        }
    }
#if ATTN_EXTRAS
    // Scores to base-2 units: soft-capped, then ALiBi's bias.
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = n0 + nt * 8 + 2 * (lane % 4) + (e & 1);
                float x = p.softcap_log2 > 0.f ? p.softcap_log2 * tanh_fast(s[t][nt][e] * p.softcap_inv)
                                               : s[t][nt][e] * sl2;
                x -= rows.slope[t][e >> 1] * fabsf((float)(rows.diagonal[t][e >> 1] - col));
                s[t][nt][e] = x;
            }
#endif
    if (MASKED || n0 + BN > hi) {
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = n0 + nt * 8 + 2 * (lane % 4) + (e & 1);
                    if (col >= hi || col < rows.lo[t][e >> 1] || col > rows.hi[t][e >> 1]) s[t][nt][e] = NEG_INF;
                }
    }
    float new_max[MT][2];
    bool grow = false;
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float m = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) m = fmaxf(m, fmaxf(s[t][nt][2 * r], s[t][nt][2 * r + 1]));
            m = quad_max(m);
            new_max[t][r] = fmaxf(sm.max[t][r], m == NEG_INF ? NEG_INF : m * mul);
            grow |= new_max[t][r] > sm.max[t][r] + RESCALE_SLACK;
        }
    if (__any_sync(0xffffffff, grow)) {
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float alpha = exp2_fast(sm.max[t][r] - (new_max[t][r] == NEG_INF ? 0.f : new_max[t][r]));
                sm.max[t][r] = new_max[t][r];
                sm.sum[t][r] *= alpha;
#pragma unroll
                for (int dt = 0; dt < D / 8; ++dt) {
                    sm.acc[t][dt][2 * r] *= alpha;
                    sm.acc[t][dt][2 * r + 1] *= alpha;
                }
            }
    }
#pragma unroll
    for (int t = 0; t < MT; ++t) {
        const float base[2] = {sm.max[t][0] == NEG_INF ? 0.f : sm.max[t][0], sm.max[t][1] == NEG_INF ? 0.f : sm.max[t][1]};
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[t][nt][e] = exp2_fast(fmaf(s[t][nt][e], mul, -base[e >> 1]));
                sm.sum[t][e >> 1] += s[t][nt][e];
            }
    }
    const unsigned v_col = opaque(ln.v_col);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int t = 0; t < MT; ++t) {
            a[t][0] = as_u32(pack2(s[t][2 * kk][0], s[t][2 * kk][1]));
            a[t][1] = as_u32(pack2(s[t][2 * kk][2], s[t][2 * kk][3]));
            a[t][2] = as_u32(pack2(s[t][2 * kk + 1][0], s[t][2 * kk + 1][1]));
            a[t][3] = as_u32(pack2(s[t][2 * kk + 1][2], s[t][2 * kk + 1][3]));
        }
#pragma unroll
        for (int d2 = 0; d2 < D / 16; ++d2) {
            unsigned bv[4];
            ldsm_x4_trans(sv + ln.v_off + kk * 16 * RP * 2 + ring_col(d2, v_col), bv);
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                mma(sm.acc[t][2 * d2], a[t], bv[0], bv[1]);
                mma(sm.acc[t][2 * d2 + 1], a[t], bv[2], bv[3]);
            }
        }
    }
}

// The start of a softmax: nothing seen.
__device__ __forceinline__ void clear(Softmax& sm) {
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) sm.acc[t][i][0] = sm.acc[t][i][1] = sm.acc[t][i][2] = sm.acc[t][i][3] = 0.f;
        sm.max[t][0] = sm.max[t][1] = NEG_INF, sm.sum[t][0] = sm.sum[t][1] = 0.f;
    }
}

// A warp's merge area: f32, [BM][D] unnormalised accumulators, then BM maxima and BM sums.
constexpr int AREA_FLOATS = BM * (D + 2);

// The warp's results into its merge area.
__device__ __forceinline__ void put_results(const Softmax& sm, float* area, int lane) {
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = t * 16 + lane / 4 + r * 8;
            const float sum = quad_sum(sm.sum[t][r]);
            if (lane % 4 == 0) {
                area[BM * D + row] = sm.max[t][r];
                area[BM * D + BM + row] = sum;
            }
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                const int col = dt * 8 + 2 * (lane % 4);
                *reinterpret_cast<float2*>(area + row * D + col) = make_float2(sm.acc[t][dt][2 * r], sm.acc[t][dt][2 * r + 1]);
            }
        }
}

// Per-sequence rows (extras): a sequence's packed queries are stored from its first row (the LSE
// then [heads_q, q_total]); rows of a group past its queries are not stored.
#if ATTN_EXTRAS
#define STORED(qi) ((qi) < stored.len)
#define O_SEQ (p.cu_seqlens_q != nullptr ? (long long)stored.start * p.o_ss : (long long)b * p.o_sb)
#define LSE_INDEX(h, qi)                                                               \
    (p.cu_seqlens_q != nullptr ? (long long)(h) * p.q_total + stored.start + (qi)      \
                               : ((long long)b * p.heads_q + (h)) * p.seq_q + (qi))
#else
#define STORED(qi) true
#define O_SEQ (long long)b * p.o_sb
#define LSE_INDEX(h, qi) (((long long)b * p.heads_q + (h)) * p.seq_q + (qi))
#endif

// The warps' results merged in warp order (`area(w)`: warp w's merge area): o = sum_w 2^(m_w - M)
// acc_w / L, L = sum_w 2^(m_w - M) l_w, lse = (M + log2 L) ln 2 (natural log of the scaled
// scores). A row that sees no key: o = 0, lse = -inf. With one split o and the LSE are stored;
// with several the split's normalised o (f32) and LSE go to the workspace's `slot`.
template <class Area>
__device__ __forceinline__ void store_merged(const Params& p, Area area, int r0, int g, int b, long long slot) {
#if ATTN_EXTRAS
    // The query rows again, read after the key loop rather than held through it.
    const SeqRows stored = seq_rows(p.cu_seqlens_q, b, p.q_total, p.seq_q);
#endif
    const int valid_rows = min(BM, p.rows - r0);
    const bool direct = p.splits == 1;
    for (int i = threadIdx.x; i < valid_rows * (D / 4); i += THREADS) {
        const int row = i / (D / 4), col = (i % (D / 4)) * 4;
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, area(w)[BM * D + row]);
        float l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
        if (mx != NEG_INF) {
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                const float f = exp2f(area(w)[BM * D + row] - mx);
                l += f * area(w)[BM * D + BM + row];
                const float4 a = *reinterpret_cast<const float4*>(area(w) + row * D + col);
                o[0] += f * a.x, o[1] += f * a.y, o[2] += f * a.z, o[3] += f * a.w;
            }
        }
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const float lse = l > 0.f ? (mx + log2f(l)) * LN2 : NEG_INF;
        const int grow_ = r0 + row;
        const int h = g * p.group + grow_ / p.seq_q, qi = grow_ % p.seq_q;
        if (direct) {
            if (STORED(qi) && (!PAD || col < p.head_dim)) {
                elem_t* out = p.o + O_SEQ + (long long)h * p.o_sh + (long long)qi * p.o_ss + col;
                const elem2_t lo2 = pack2(o[0] * inv, o[1] * inv), hi2 = pack2(o[2] * inv, o[3] * inv);
                *reinterpret_cast<uint2*>(out) = make_uint2(as_u32(lo2), as_u32(hi2));
                if (p.lse != nullptr && col == 0) p.lse[LSE_INDEX(h, qi)] = lse;
            }
        } else {
            *reinterpret_cast<float4*>(p.partial_o + (slot * BM + row) * D + col) =
                make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
            if (col == 0) p.partial_lse[slot * BM + row] = lse;
        }
    }
}

// The rows of a block from r0 (dense plain rows: no packed queries, no ALiBi): padding rows past
// the group's see nothing.
__device__ __forceinline__ void plain_rows(const Params& p, Rows& rows, int r0, int lane) {
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const bool real = r0 + t * 16 + lane / 4 + r * 8 < p.rows;
            rows.lo[t][r] = real ? 0 : 1;
            rows.hi[t][r] = real ? p.seq_k - 1 : 0;
        }
}

#if ATTN_PERSIST
// The persistent form (ATTN_PERSIST; plain, unmasked, one split, BN = 32 and one m-tile): a CTA
// per SM slot, each taking the (sequence, KV head, row block) items blockIdx.x, + gridDim.x, ...
// with no gap between them in a warp's copies: its ring runs on from one item's chunks into the
// next's (an issue cursor STAGES - 1 chunks ahead of the one folded), the next item's Q is copied
// in during this one, and the warps' merge areas are the ring chunk each warp just folded (the
// only one no copy is landing in). Launched as one CTA per item, a CTA spends about 1.3-1.5 µs
// filling its ring and draining it, 2-5% of a 1-2 MB item's time on an H200; the plan takes the
// form by default at D <= 64 only (at D = 128 it measured 1% slower: decode::plan::persistent).
// One split: o and the LSE are stored directly.
static_assert(!(ATTN_PERSIST) || (!ATTN_EXTRAS && !MASKED), "the persistent form is plain and unmasked");
static_assert(!(ATTN_PERSIST) || AREA_FLOATS * 4 <= CHUNK_ELEMS * 2 * 2, "a merge area fits in a ring chunk");
__device__ __forceinline__ void persistent(const Params& p, unsigned char* smem) {
    elem_t* sQ = reinterpret_cast<elem_t*>(smem);  // two buffers: this item's Q and the next's
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    elem_t* ring = sQ + Q_BUFFERS * Q_ELEMS + warp * RING_ELEMS;
    const int items = p.batch * p.heads_kv * p.row_blocks;
    const float sl2 = fmaxf(fabsf(p.scale_log2), 1e-30f);
    // Every item's keys are [0, seq_k): the same chunks, the same share for a warp.
    const int hi = p.seq_k, chunks = (hi + BN - 1) / BN;
    const auto mine_of = [&](int w) { return chunks > w ? (chunks - w + WARPS - 1) / WARPS : 0; };
    const int mine = mine_of(warp);
    // Item i's (sequence, KV head, first row of the group).
    struct Item {
        int b, g, r0;
    };
    const auto item_at = [&](int i) {
        return Item{i / (p.heads_kv * p.row_blocks), i / p.row_blocks % p.heads_kv, i % p.row_blocks * BM};
    };

    // The issue cursor: the next chunk to copy, as (item, index among the warp's chunks of it),
    // the item's sequence and KV head found once per item, after its last chunk's copies rather
    // than ahead of each chunk's. Each call commits one group, empty once the items are done.
    int next_item = blockIdx.x, next_it = 0;
    Item next_at = item_at(next_item);
    const auto issue = [&](int stage) {
        if (mine > 0 && next_item < items) {
            elem_t* sk = ring + stage * 2 * CHUNK_ELEMS;
            load_chunk(p, sk, sk + CHUNK_ELEMS, next_at.b, next_at.g, (warp + next_it * WARPS) * BN, hi, lane);
            if (++next_it == mine) next_it = 0, next_item += gridDim.x, next_at = item_at(next_item);
        }
        cp_commit();
    };

    const Item first = item_at(blockIdx.x);
    if (blockIdx.x < items) load_q(p, sQ, first.r0, first.g, (long long)first.b * p.q_sb, p.seq_q);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);
    __syncthreads();  // Q is in shared memory

    const Lanes ln = lanes_of(lane);
    int folded = 0;  // chunks this warp has folded, over all its items: chunk f sits in stage f % STAGES
    for (int k = 0, item = blockIdx.x; item < items; ++k, item += gridDim.x) {
        const Item at = item_at(item);
        elem_t* q_now = sQ + (k & 1) * Q_ELEMS;
        // The next item's Q into the other buffer (zeros past the group's rows), in the group
        // of this item's first refill; negated after it lands for a negative scale.
        const int after = item + gridDim.x;
        if (after < items) {
            const Item nx = item_at(after);
            elem_t* q_next = sQ + ((k + 1) & 1) * Q_ELEMS;
            for (int i = threadIdx.x; i < BM * CPR; i += THREADS) {
                const int r = i / CPR, c = i % CPR, row = nx.r0 + r;
                const bool real = row < p.rows;
                const int h = nx.g * p.group + (real ? row : 0) / p.seq_q, qi = (real ? row : 0) % p.seq_q;
                cp_async16(smem_u32(q_next + r * DP + c * 8),
                           p.q + (long long)nx.b * p.q_sb + (long long)h * p.q_sh + (long long)qi * p.q_ss + c * 8, real);
            }
        }
        Rows rows;
        plain_rows(p, rows, at.r0, lane);
        Softmax sm;
        clear(sm);
        const unsigned q_addr = smem_u32(q_now) + ((lane & 15) * DP + (lane >> 4) * 8) * 2;
        for (int it = 0; it < mine; ++it, ++folded) {
            __syncwarp();  // every lane is past chunk folded - 1: its stage takes chunk folded + STAGES - 1
            issue((folded + STAGES - 1) % STAGES);
            cp_wait<STAGES - 1>();  // chunk `folded` has landed (for this lane) ...
            __syncwarp();           // ... and for every lane of the warp
            fold_chunk(p, q_addr, smem_u32(ring + (folded % STAGES) * 2 * CHUNK_ELEMS), ln, (warp + it * WARPS) * BN, hi,
                       rows, sm, lane, sl2, sl2);
        }
        // The next Q's copies are older than the newest STAGES - 1 groups where the warp folded
        // STAGES chunks or more of this item; else wait for all (and commit them, with none).
        if (mine < STAGES) {
            cp_commit();
            cp_wait<0>();
        }
        __syncwarp();  // every lane's reads of the chunk it folded last are done: it becomes the merge area
        // Each warp's merge area: the stage of the last chunk it folded (stage 0 if none).
        const auto area = [&](int w) {
            const int f = (k + 1) * mine_of(w);
            return reinterpret_cast<float*>(sQ + Q_BUFFERS * Q_ELEMS + w * RING_ELEMS + (f > 0 ? (f - 1) % STAGES : 0) * 2 * CHUNK_ELEMS);
        };
        put_results(sm, area(warp), lane);
        __syncthreads();
        store_merged(p, area, at.r0, at.g, at.b, 0);
        if (p.scale_log2 < 0.f && after < items)
            for (int i = threadIdx.x; i < BM * CPR; i += THREADS) {
                uint4* x = reinterpret_cast<uint4*>(sQ + ((k + 1) & 1) * Q_ELEMS + (i / CPR) * DP + (i % CPR) * 8);
                x->x ^= 0x80008000u, x->y ^= 0x80008000u, x->z ^= 0x80008000u, x->w ^= 0x80008000u;
            }
        __syncthreads();  // the merge areas are read and the next Q is whole: the rings run on
    }
    cp_wait<0>();
}
#endif

// One CTA per SM is all the plan counts on (its split counts fill one a SM), so ptxas may take up
// to 255 registers a thread; without the bound it held some variants to 80 or 128 registers and
// spilled 8-16 bytes.
extern "C" __global__ void __launch_bounds__(THREADS, 1) attn_decode(const __grid_constant__ Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
#if ATTN_PERSIST
    persistent(p, smem);
    return;
#endif
    elem_t* sQ = reinterpret_cast<elem_t*>(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    elem_t* ring = sQ + Q_ELEMS + warp * RING_ELEMS;

    const int split = blockIdx.x;
    const int rb = blockIdx.y % p.row_blocks, g = blockIdx.y / p.row_blocks;
    const int b = blockIdx.z;
    const int pair = (b * p.heads_kv + g) * p.row_blocks + rb;
    const int r0 = rb * BM;  // this block's first row of the group
#if ATTN_EXTRAS
    // This sequence's query rows (packed or dense) and the keys it uses: its packed keys or its
    // count of them, clamped into [0, the keys it holds] (one min and max per CTA).
    const SeqRows queries = seq_rows(p.cu_seqlens_q, b, p.q_total, p.seq_q);
    const int k_held = seq_rows(p.cu_seqlens_k, b, p.kv_total, p.seq_k).len;
    const int seq_k = p.seqused_k != nullptr ? min(max(p.seqused_k[b], 0), k_held) : k_held;
    // The group's rows are sized by the longest sequence: query qi is one of this one's while
    // qi < its length, and packed rows start at its first (the batch stride unused).
#define SEQ_Q queries.len
#define SEQ_K seq_k
#define QUERY_REAL(qi) ((qi) < queries.len)
#define Q_SEQ (p.cu_seqlens_q != nullptr ? (long long)queries.start * p.q_ss : (long long)b * p.q_sb)
#else
// Read where they are used, as the plain kernel always has.
#define SEQ_Q p.seq_q
#define SEQ_K p.seq_k
#define QUERY_REAL(qi) true
#define Q_SEQ (long long)b * p.q_sb
#endif
    const int shift = SEQ_K - SEQ_Q;
    const float sl2 = fmaxf(fabsf(p.scale_log2), 1e-30f);
    // What multiplies a raw score into base-2 units: the extras variants convert their scores
    // (soft-cap, ALiBi) to those units first.
    const float mul = ATTN_EXTRAS ? 1.f : sl2;

    load_q(p, sQ, r0, g, Q_SEQ, SEQ_Q);
    if (PAD) {
        // This warp's ring rows (STAGES K and V chunks of BN rows, one after the other): the
        // columns past the head dim to zero, once.
        const int real = p.head_dim / 8, pad = CPR - real;
        for (int i = lane; i < STAGES * 2 * BN * pad; i += 32)
            *reinterpret_cast<uint4*>(reinterpret_cast<char*>(ring) + ring_at(i / pad, real + i % pad)) = make_uint4(0, 0, 0, 0);
    }

    // The keys some row of the block sees: [lo, hi).
    int lo = 0, hi = SEQ_K;
    if (MASKED) {
        const int last = min(p.rows, r0 + BM) - 1;
        const bool one_head = r0 / p.seq_q == last / p.seq_q;
        const int q_first = one_head ? r0 % p.seq_q : 0, q_last = one_head ? last % p.seq_q : p.seq_q - 1;
        lo = max(0, q_first + shift - p.window_left);
        hi = min(SEQ_K, max(0, q_last + shift + p.window_right + 1));
        if (ATTN_EXTRAS) lo -= lo % BN;  // chunks start on multiples of BN (pages); rows mask the rest
    }
    // This split's chunks of BN keys from lo, and this warp's share of them.
    const int chunks = hi > lo ? (hi - lo + BN - 1) / BN : 0;
    const int per_split = (chunks + p.splits - 1) / p.splits;
    const int c_begin = min(chunks, split * per_split), c_end = min(chunks, c_begin + per_split);
    const int mine = c_end - c_begin > warp ? (c_end - c_begin - warp + WARPS - 1) / WARPS : 0;

    Rows rows;
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = r0 + t * 16 + lane / 4 + r * 8;
            const int qi = row % p.seq_q;
            rows.lo[t][r] = MASKED ? qi + shift - p.window_left : 0;
            rows.hi[t][r] = MASKED ? qi + shift + p.window_right : SEQ_K - 1;
            if (row >= p.rows || !QUERY_REAL(qi)) rows.lo[t][r] = 1, rows.hi[t][r] = 0;  // padding: sees nothing
#if ATTN_EXTRAS
            const int h = g * p.group + row / p.seq_q;
            rows.slope[t][r] = p.alibi_slopes != nullptr && row < p.rows
                                   ? p.alibi_slopes[(long long)b * p.alibi_batch_stride + h] * 1.4426950408889634f
                                   : 0.f;
            rows.diagonal[t][r] = qi + shift;
#endif
        }
    Softmax sm;
    clear(sm);
    const unsigned q_addr = smem_u32(sQ) + ((lane & 15) * DP + (lane >> 4) * 8) * 2;
    const Lanes ln = lanes_of(lane);

    // Prologue: the first STAGES - 1 chunks (one commit group each, empty or not).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < mine) {
            const int n0 = lo + (c_begin + warp + s * WARPS) * BN;
            load_chunk(p, ring + s * 2 * CHUNK_ELEMS, ring + s * 2 * CHUNK_ELEMS + CHUNK_ELEMS, b, g, n0, hi,
                       lane);
        }
        cp_commit();
    }
    __syncthreads();  // Q is in shared memory

    for (int it = 0; it < mine; ++it) {
        // Refill the stage chunk it - 1 used (every lane is past it) with chunk it + STAGES - 1.
        __syncwarp();
        if (it + STAGES - 1 < mine) {
            const int s = (it + STAGES - 1) % STAGES;
            const int n0 = lo + (c_begin + warp + (it + STAGES - 1) * WARPS) * BN;
            load_chunk(p, ring + s * 2 * CHUNK_ELEMS, ring + s * 2 * CHUNK_ELEMS + CHUNK_ELEMS, b, g, n0, hi,
                       lane);
        }
        cp_commit();
        cp_wait<STAGES - 1>();  // chunk it has landed (for this lane) ...
        __syncwarp();           // ... and for every lane of the warp
        fold_chunk(p, q_addr, smem_u32(ring + (it % STAGES) * 2 * CHUNK_ELEMS), ln, lo + (c_begin + warp + it * WARPS) * BN,
                   hi, rows, sm, lane, sl2, mul);
    }
    cp_wait<0>();
    __syncthreads();  // every warp is done with its ring: shared memory becomes the merge area

    // Each warp's merge area, one after the other from the start of shared memory.
    const auto area = [&](int w) { return reinterpret_cast<float*>(smem) + w * AREA_FLOATS; };
    put_results(sm, area(warp), lane);
    __syncthreads();
    const long long slot = (long long)pair * p.splits + split;
    store_merged(p, area, r0, g, b, slot);
    if (p.splits == 1) return;

    // The ticket: the last CTA of this (batch, KV head, row block) merges every split.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(p.tickets + pair, 1u) == (unsigned)(p.splits - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int valid_rows = min(BM, p.rows - r0);
#if ATTN_EXTRAS
    const SeqRows stored = seq_rows(p.cu_seqlens_q, b, p.q_total, p.seq_q);
#endif

    // Per row, each split's weight exp(lse_s - lse) into shared memory (the merge area is free
    // again: this CTA's own partials are in the workspace), and the row's LSE.
    float* weight = reinterpret_cast<float*>(smem);  // [BM][splits]
    const long long first = (long long)pair * p.splits;
    for (int row = warp; row < valid_rows; row += WARPS) {
        float mx = NEG_INF;
        for (int s = lane; s < p.splits; s += 32) mx = fmaxf(mx, __ldcg(p.partial_lse + (first + s) * BM + row));
#pragma unroll
        for (int x = 16; x > 0; x /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, x));
        float sum = 0.f;
        for (int s = lane; s < p.splits; s += 32) {
            const float l = __ldcg(p.partial_lse + (first + s) * BM + row);
            const float w = mx == NEG_INF ? 0.f : expf(l - mx);
            weight[row * p.splits + s] = w;
            sum += w;
        }
#pragma unroll
        for (int x = 16; x > 0; x /= 2) sum += __shfl_xor_sync(0xffffffff, sum, x);
        __syncwarp();
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        for (int s = lane; s < p.splits; s += 32) weight[row * p.splits + s] *= inv;
        if (lane == 0 && p.lse != nullptr) {
            const int grow_ = r0 + row;
            const int h = g * p.group + grow_ / p.seq_q, qi = grow_ % p.seq_q;
            if (STORED(qi)) p.lse[LSE_INDEX(h, qi)] = sum > 0.f ? mx + logf(sum) : NEG_INF;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < valid_rows * (D / 4); i += THREADS) {
        const int row = i / (D / 4), col = (i % (D / 4)) * 4;
        float o[4] = {0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < p.splits; ++s) {
            const float w = weight[row * p.splits + s];
            const float4 x = __ldcg(reinterpret_cast<const float4*>(p.partial_o + ((first + s) * BM + row) * D + col));
            o[0] += w * x.x, o[1] += w * x.y, o[2] += w * x.z, o[3] += w * x.w;
        }
        const int grow_ = r0 + row;
        const int h = g * p.group + grow_ / p.seq_q, qi = grow_ % p.seq_q;
        if (!STORED(qi) || (PAD && col >= p.head_dim)) continue;
        elem_t* out = p.o + O_SEQ + (long long)h * p.o_sh + (long long)qi * p.o_ss + col;
        *reinterpret_cast<uint2*>(out) = make_uint2(as_u32(pack2(o[0], o[1])), as_u32(pack2(o[2], o[3])));
    }
    if (threadIdx.x == 0) p.tickets[pair] = 0;  // every split has taken its ticket: ready for the next launch
}
