// FlashAttention-2-class forward for Ampere/Ada (sm_80, sm_86, sm_89; also runs on sm_90).
//
// One CTA computes BM = 16 * MT * WARPS query rows of one (batch, head); each warp owns MT tiles
// of 16 rows, so the softmax of a row never crosses warps, and every K or V fragment read from
// shared memory feeds MT matrix products. Per key/value tile of BN keys:
//   S = Q K^T      mma.sync m16n8k16 (16-bit in, f32 accumulate), Q and K fragments by ldmatrix
//   online softmax in registers, in base 2: p = exp2(s * scale * log2(e) - max), one FFMA and
//                  one MUFU.EX2 per score
//   O += P V       P converted from the S accumulators to 16-bit A fragments in registers,
//                  V fragments by ldmatrix.trans
// K/V loads are cp.async, 16 bytes a thread, with two block barriers per tile. With one stage
// (ATTN_STAGES=1) K and V have one buffer each and are double-buffered against each other: the
// load of V_j overlaps S_j and its softmax, the load of K_{j+1} overlaps P_j V_j. With two
// stages K and V have two buffers each, and the loads of tile j+2 overlap all of tile j+1.
// The running max is only moved (and O rescaled) when some row of the warp grew by more than
// RESCALE_SLACK (in log2 units): until then probabilities may reach 2^RESCALE_SLACK, which f32
// sums and 16-bit P hold exactly as well, and O / sum is unchanged. Most tiles skip the rescale.
// Shared-memory rows are XOR-swizzled in 16-byte chunks so that ldmatrix reads are free of bank
// conflicts.
//
// Specialised at compile time (NVRTC -D): ATTN_BF16 (else f16), ATTN_D (head dim, multiple of
// 16), ATTN_WARPS, ATTN_MTILES, ATTN_BN (keys per tile, multiple of 16), ATTN_STAGES (1 or 2),
// ATTN_CAUSAL, ATTN_WINDOW (a sliding window: each query block walks only the key tiles its rows
// see, from the first to the last, and masks the tiles at either edge; its bounds are run-time
// parameters), ATTN_SOFTCAP (scores capped at +-cap: cap * tanh(scaled score / cap), the cap a
// run-time parameter), ATTN_SEQS (sequences of their own lengths: packed queries and keys,
// a paged key/value cache, per-sequence key counts; which of them is given by the parameter
// block's null or non-null index arrays), ATTN_ALIBI (a bias -slope |i + k_len - q_len - j| on
// each score), ATTN_PAD (a head dim below D, a multiple of 8 given at run time: the chunks of Q,
// K and V past it load as zeros, so that the scores and the first columns of O are those of the
// real head dim, and O's chunks past it are not stored). The host's plan (crates/attn-cuda/src/ampere/variant.rs) mirrors the shared-memory size
// computed here.

#include "mma_sm80.cuh"  // elem_t, mma.sync, ldmatrix, cp.async groups, quad reductions

constexpr int D = ATTN_D;
constexpr int WARPS = ATTN_WARPS;
constexpr int MT = ATTN_MTILES;
constexpr int WM = 16 * MT;  // rows per warp
constexpr int BM = WM * WARPS;
constexpr int BN = ATTN_BN;
constexpr int STAGES = ATTN_STAGES;
static_assert(STAGES == 1 || STAGES == 2, "one or two K/V stages");
constexpr bool CAUSAL = ATTN_CAUSAL;
// ATTN_WINDOW, ATTN_SOFTCAP, ATTN_SEQS, ATTN_ALIBI and ATTN_PAD are read by `#if` alone: a constant of each would add a PTX global
// to every variant, whose PTX stays what it was without them.
static_assert(!(ATTN_CAUSAL && ATTN_WINDOW), "a causal window is a window with right = 0");
constexpr int THREADS = 32 * WARPS;
constexpr int CPR = D / 8;  // 16-byte chunks per row
// How far (log2 units) the running max may lag behind a row's true max before O is rescaled.
constexpr float RESCALE_SLACK = 8.f;

static_assert(D % 16 == 0 && BN % 16 == 0, "head dim and key tile must be multiples of 16");

// Must match `KernelParams` in crates/attn-cuda/src/ampere/launch.rs field for field.
struct Params {
    const elem_t* q;
    const elem_t* k;
    const elem_t* v;
    elem_t* o;
    float* lse;  // null when not asked for
    long long q_sb, q_sh, q_ss;
    long long k_sb, k_sh, k_ss;
    long long v_sb, v_sh, v_ss;
    long long o_sb, o_sh, o_ss;
    int batch, heads_q, heads_kv, seq_q, seq_k;
    float scale_log2;  // softmax scale * log2(e)
#if ATTN_WINDOW || ATTN_SOFTCAP || ATTN_SEQS || ATTN_ALIBI || ATTN_PAD
    // Only these variants declare the fields (the others' parameter block, and so their code,
    // stays as it was); the host passes them to every variant, and the driver copies the size
    // the kernel declares.
    int win_left, win_right;  // row i sees keys i + shift - win_left ..= i + shift + win_right
    float softcap_in;         // |scale| / cap: tanh's argument per unscaled score
    float softcap_out;        // cap * log2(e): the capped score in base-2 softmax units
#endif
#if ATTN_SEQS || ATTN_ALIBI || ATTN_PAD
    // Sequences (read by ATTN_SEQS variants; each array null where the problem has none, and then
    // the dense sizes hold), as attn_core::SeqMap defines them.
    const int* cu_seqlens_q;    // [batch + 1] packed query offsets
    const int* cu_seqlens_k;    // [batch + 1] packed key offsets
    const int* seqused_k;       // [batch] keys each sequence uses
    const int* block_table;     // [batch, pages_per_seq] pages of a paged cache (k_sb steps pages)
    const float* alibi_slopes;  // ATTN_ALIBI: [heads_q], or [batch, heads_q]
    int page_size;              // keys per page, a multiple of 16
    int pages_per_seq;
    int alibi_batch_stride;     // 0 (a slope per head) or heads_q (per batch and head)
    int q_total;                // packed query rows: the LSE is then [heads_q, q_total]
    int kv_total;               // packed key rows, or the pages of a paged cache (the clamps' bound)
#endif
#if ATTN_PAD
    int head_dim;  // the problem's head dim: a multiple of 8, at most D
#endif
};

// With ATTN_PAD the tile loads and O's store take the number of 16-byte chunks a row really has
// (`chunks`, from Params::head_dim) and skip the chunks past it; without it every chunk of D is
// real, and the code is what it was without ATTN_PAD.
#if ATTN_PAD
#define CHUNKS_PARAM , int chunks
#define CHUNKS_ARG , chunks
#define CHUNK_REAL(c) ((c) < chunks)
#else
#define CHUNKS_PARAM
#define CHUNKS_ARG
#define CHUNK_REAL(c) true
#endif

#if ATTN_SEQS
// Address of key (or value) row `j` of one sequence and head, as attn_core::SeqMap::k_offset
// places it: `base` + j rows where the rows are contiguous in the sequence (dense or packed;
// `pages` null), else row j % page_size of page pages[j / page_size], `base` being head g of
// page 0 and `page_stride` the batch stride.
__device__ __forceinline__ const elem_t* kv_row(const elem_t* base, long long row_stride, long long page_stride,
                                                const int* pages, int page_size, unsigned page_last, int j) {
    if (pages == nullptr) return base + (long long)j * row_stride;
    // A page number past the cache (or negative: huge as unsigned) reads the last page instead
    // (`page_last`, pages - 1): the contents of a caller's device table are not checked on the
    // host, and a corrupt one must give wrong rows, never a read outside k or v. One min per
    // lookup, which loads the number anyway.
    const unsigned page = min((unsigned)__ldg(pages + j / page_size), page_last);
    return base + (long long)page * page_stride + (long long)(j % page_size) * row_stride;
}
#endif

// Physical 16-byte chunk of logical chunk `c` in row `row`: XOR within groups of 8 chunks (128
// bytes), or of the 4-chunk tail group (D = 32, 96) with every other row.
__device__ __forceinline__ int swizzle(int row, int c) {
    const int base = c & ~7;
    if (base + 8 <= CPR) return base | ((c & 7) ^ (row & 7));
    return base | ((c - base) ^ ((row >> 1) & (CPR - base - 1)));
}

// Byte address in shared memory of logical chunk `c` of row `row` of a [rows][D] tile.
__device__ __forceinline__ unsigned tile_addr(const elem_t* tile, int row, int c) {
    return smem_u32(tile) + (row * D + swizzle(row, c) * 8) * 2;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    // src-size 0 zero-fills: rows past the sequence end read as zeros.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// Rows r0 .. r0+ROWS of a [seq][D] matrix with row stride `stride` (elements) into a swizzled
// shared tile; rows at or past `limit` (and, with ATTN_PAD, chunks at or past `chunks`) become zeros. A compile-time trip count: each thread issues
// about ROWS * CPR / THREADS copies with no loop overhead.
template <int ROWS>
__device__ __forceinline__ void load_tile(elem_t* tile, const elem_t* g, long long stride, int r0,
                                          int limit CHUNKS_PARAM) {
    constexpr int STEP = THREADS / CPR;  // rows between a thread's copies, when CPR divides THREADS
    if constexpr (THREADS % CPR == 0 && ROWS % STEP == 0 && (STEP % 8 == 0 || 8 % STEP == 0)) {
        // Each thread keeps one chunk column and steps down STEP rows at a time. The swizzle
        // repeats every 8 rows, so KEYS shared addresses (1 or 8 / STEP) plus constants cover
        // all its copies, and one global pointer advances by a multiple of the stride.
        constexpr int KEYS = STEP >= 8 ? 1 : 8 / STEP;
        const int r = threadIdx.x / CPR, c = threadIdx.x % CPR;
        unsigned dst[KEYS];
#pragma unroll
        for (int k = 0; k < KEYS; ++k) dst[k] = tile_addr(tile, r + k * STEP, c) - k * STEP * D * 2;
        const elem_t* src = g + (long long)(r0 + r) * stride + c * 8;
#pragma unroll
        for (int it = 0; it < ROWS / STEP; ++it) {
            const bool valid = r0 + r + it * STEP < limit && CHUNK_REAL(c);
            cp_async16(dst[it % KEYS] + it * STEP * D * 2, valid ? src + it * STEP * stride : g, valid);
        }
    } else {
#pragma unroll
        for (int it = 0; it < (ROWS * CPR + THREADS - 1) / THREADS; ++it) {
            const int i = threadIdx.x + it * THREADS;
            if (ROWS * CPR % THREADS != 0 && i >= ROWS * CPR) break;
            const int r = i / CPR, c = i % CPR;
            const bool valid = r0 + r < limit && CHUNK_REAL(c);
            const elem_t* src = g + (valid ? (long long)(r0 + r) * stride : 0) + c * 8;
            cp_async16(tile_addr(tile, r, c), src, valid);
        }
    }
}

#if ATTN_SEQS
// load_tile for one sequence's keys or values through kv_row: rows of a paged cache are looked
// up one by one (a tile may span pages), in a loop kept rolled so that the page lookups do not
// each hold an address in registers across the tile; contiguous rows take load_tile's path.
template <int ROWS>
__device__ __forceinline__ void load_kv_tile(elem_t* tile, const elem_t* base, long long row_stride,
                                             long long page_stride, const int* pages, int page_size,
                                             unsigned page_last, int r0, int limit CHUNKS_PARAM) {
    if (pages == nullptr) {
        load_tile<ROWS>(tile, base, row_stride, r0, limit CHUNKS_ARG);
        return;
    }
#pragma unroll 1
    for (int it = 0; it < (ROWS * CPR + THREADS - 1) / THREADS; ++it) {
        const int i = threadIdx.x + it * THREADS;
        if (ROWS * CPR % THREADS != 0 && i >= ROWS * CPR) break;
        const int r = i / CPR, c = i % CPR;
        const bool valid = r0 + r < limit && CHUNK_REAL(c);
        const elem_t* src = valid ? kv_row(base, row_stride, page_stride, pages, page_size, page_last, r0 + r) + c * 8 : base;
        cp_async16(tile_addr(tile, r, c), src, valid);
    }
}
#endif

// One thread's ldmatrix addresses into a swizzled tile, for logical chunks 2u + hi of rows
// row + 16i (hi is 0 or 1 per lane). Rows 16 apart share a swizzle, and within a group of chunks
// the swizzle is an XOR with a per-thread key, so four registers (two for the 4-chunk tail of
// D = 32, 96) plus compile-time offsets cover the whole tile, instead of one register per read.
struct FragAddr {
    unsigned main[4], tail[2];
    __device__ __forceinline__ FragAddr(const elem_t* tile, int row, int hi) {
        const unsigned row_base = smem_u32(tile) + row * D * 2;
        const int x8 = hi ^ (row & 7), x4 = hi ^ ((row >> 1) & 3);
#pragma unroll
        for (int k = 0; k < 4; ++k) main[k] = row_base + ((2 * k) ^ x8) * 16;
#pragma unroll
        for (int k = 0; k < 2; ++k) tail[k] = row_base + ((2 * k) ^ x4) * 16;
    }
    // Chunk 2u + hi of row + rows (rows a multiple of 16); u and rows are compile-time constants
    // once the caller's loops are unrolled.
    __device__ __forceinline__ unsigned at(int u, int rows) const {
        const int c = 2 * u, base = c & ~7;
        const unsigned off = base * 16 + rows * D * 2;
        return (base + 8 <= CPR ? main[(c & 7) >> 1] : tail[(c - base) >> 1]) + off;
    }
    // The same addresses in a tile `bytes` further on (the other K/V stage).
    __device__ __forceinline__ FragAddr shifted(unsigned bytes) const {
        FragAddr f = *this;
#pragma unroll
        for (int k = 0; k < 4; ++k) f.main[k] += bytes;
#pragma unroll
        for (int k = 0; k < 2; ++k) f.tail[k] += bytes;
        return f;
    }
};

// Whether key tile [n0, n0 + BN) crosses a window's edge for the WM rows whose first diagonal is
// `diag0` (row + shift): its last key past the first row's last visible one, or its first key
// before the last row's first visible one. Always false without a window.
__device__ __forceinline__ bool window_edge(const Params& p, int n0, int diag0) {
#if ATTN_WINDOW
    return n0 + BN - 1 > diag0 + p.win_right || n0 < diag0 + WM - 1 - p.win_left;
#else
    return false;
#endif
}

// Whether key `col` lies outside the window of the row whose diagonal is `diag`.
__device__ __forceinline__ bool outside_window(const Params& p, int col, int diag) {
#if ATTN_WINDOW
    return col > diag + p.win_right || col < diag - p.win_left;
#else
    return false;
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS) attn_fwd(const __grid_constant__ Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    elem_t* sQ = reinterpret_cast<elem_t*>(smem);
    elem_t* sK = sQ + BM * D;            // STAGES tiles of BN x D
    elem_t* sV = sK + STAGES * BN * D;   // STAGES tiles of BN x D

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // Blocks start in grid order, x fastest. Without a mask the grid is (query blocks, batch *
    // heads): neighbouring blocks share one head's K/V, which stays in L2. Under a causal mask it
    // is (batch * heads, query blocks), reversed: the last query blocks of every head, which see
    // the most keys, go first and the short ones fill in at the end (measured on the H100: 1.2x
    // at D=128 S=2048 causal; the same order without a mask lost 6% at S=1024 to L2 misses).
#if ATTN_CAUSAL
    const int m_block = gridDim.y - 1 - blockIdx.y;
    const int b = blockIdx.x / p.heads_q, h = blockIdx.x % p.heads_q;
#else
    const int m_block = blockIdx.x;
    const int b = blockIdx.y / p.heads_q, h = blockIdx.y % p.heads_q;
#endif
    const int g = h / (p.heads_q / p.heads_kv);
    const int m0 = m_block * BM;
#if ATTN_PAD
    const int chunks = p.head_dim / 8;  // 16-byte chunks of a row that hold the real head dim
#endif
#if ATTN_SEQS
    // This sequence's lengths and first rows (attn_core::SeqMap's definitions); the grid covers
    // the longest sequence.
    // Each index is clamped into the problem's bounds first (a few scalar instructions per CTA):
    // the device-resident calls take the caller's arrays unchecked, and corrupt contents must
    // give wrong rows, never an access outside q, k, v, o or the LSE. Offsets land in
    // [0, q_total] and [0, kv_total], a sequence ends at or after its start and within seq_q
    // (seq_k) rows, a key count in [0, the keys the sequence holds]; valid arrays pass unchanged.
    const int* cu_q = p.cu_seqlens_q;
    const int* cu_k = p.cu_seqlens_k;
    const int q_start = cu_q != nullptr ? min(max(cu_q[b], 0), p.q_total) : 0;
    const int q_len = cu_q != nullptr ? min(min(max(cu_q[b + 1], q_start), p.q_total) - q_start, p.seq_q) : p.seq_q;
    const int k_start = cu_k != nullptr ? min(max(cu_k[b], 0), p.kv_total) : 0;
    const int k_held = cu_k != nullptr ? min(min(max(cu_k[b + 1], k_start), p.kv_total) - k_start, p.seq_k) : p.seq_k;
    const int k_len = p.seqused_k != nullptr ? min(max(p.seqused_k[b], 0), k_held) : k_held;
    const int* pages = p.block_table != nullptr ? p.block_table + (long long)b * p.pages_per_seq : nullptr;
    const unsigned page_last = (unsigned)p.kv_total - 1u;
#define SEQ_Q q_len
#define SEQ_K k_len
#define LOAD_K(tile, n) load_kv_tile<BN>(tile, k, p.k_ss, p.k_sb, pages, p.page_size, page_last, n, k_len CHUNKS_ARG)
#define LOAD_V(tile, n) load_kv_tile<BN>(tile, v, p.v_ss, p.v_sb, pages, p.page_size, page_last, n, k_len CHUNKS_ARG)
#define LSE_INDEX(row) \
    (cu_q != nullptr ? (long long)h * p.q_total + q_start + (row) : ((long long)b * p.heads_q + h) * p.seq_q + (row))
#else
#define SEQ_Q p.seq_q
#define SEQ_K p.seq_k
#define LOAD_K(tile, n) load_tile<BN>(tile, k, p.k_ss, n, p.seq_k CHUNKS_ARG)
#define LOAD_V(tile, n) load_tile<BN>(tile, v, p.v_ss, n, p.seq_k CHUNKS_ARG)
#define LSE_INDEX(row) ((long long)b * p.heads_q + h) * p.seq_q + row
#endif
    const int shift = SEQ_K - SEQ_Q;  // bottom-right causal: row i sees keys j <= i + shift
    // Scores are scaled inside the exponent, exp2(s * sl2 - max), one FFMA each; that needs
    // sl2 > 0 (a masked score is -inf, and -inf * 0 is NaN), so a negative scale is applied by
    // negating Q in shared memory once instead, and a zero scale runs as 1e-30: every score
    // times it then rounds to nothing next to the max, and exp2 gives 1, as it would for 0.
    // With a soft-cap the exponent's factor is cap * log2(e) instead (positive too): the capped
    // score is cap * tanh(.), and tanh's argument carries |scale| (Params::softcap_in).
#if ATTN_SOFTCAP
    const float sl2 = p.softcap_out;
#else
    const float sl2 = fmaxf(fabsf(p.scale_log2), 1e-30f);
#endif

#if ATTN_SEQS
    // Packed rows ignore the batch stride; a paged cache's pages are found per row (kv_row).
    const elem_t* q = p.q + (cu_q != nullptr ? q_start * p.q_ss : b * p.q_sb) + h * p.q_sh;
    const elem_t* k = p.k + (pages != nullptr ? 0 : cu_k != nullptr ? k_start * p.k_ss : b * p.k_sb) + g * p.k_sh;
    const elem_t* v = p.v + (pages != nullptr ? 0 : cu_k != nullptr ? k_start * p.v_ss : b * p.v_sb) + g * p.v_sh;
#else
    const elem_t* q = p.q + b * p.q_sb + h * p.q_sh;
    const elem_t* k = p.k + b * p.k_sb + g * p.k_sh;
    const elem_t* v = p.v + b * p.v_sb + g * p.v_sh;
#endif
#if ATTN_ALIBI
    // ALiBi's slope in the units of s, whose exponent factor is sl2: the bias -slope |d| in
    // natural-log units is -slope |d| log2(e) / sl2 in s (before the soft-cap's or scale's factor).
    const float alibi = p.alibi_slopes[b * p.alibi_batch_stride + h] * 1.4426950408889634f / sl2;
#endif

    int n_end = SEQ_K;
    if (CAUSAL) n_end = min(SEQ_K, max(0, m0 + BM + shift));
    // Key tiles [j_begin, n_tiles): under a window, from the first key the block's first row
    // sees to the last its last row sees (none where the window lies outside the keys).
    int j_begin = 0;
#if ATTN_WINDOW
    n_end = min(SEQ_K, max(0, m0 + BM + shift + p.win_right));
    j_begin = min(max(0, m0 + shift - p.win_left), n_end) / BN;
#endif
#if ATTN_SEQS
    // A block past this sequence's queries walks no key tile and writes no row. (Not a `return`
    // at the top: that one cost D = 128 and 256 hundreds of bytes of spills under ptxas.)
    if (m0 >= q_len) n_end = 0, j_begin = 0;
#endif
    const int n_tiles = (n_end + BN - 1) / BN;
    const int n_first = j_begin * BN;

    // Commit groups: (Q, K_0) with one stage; (Q, K_0, V_0), (K_1, V_1) with two.
    load_tile<BM>(sQ, q, p.q_ss, m0, SEQ_Q CHUNKS_ARG);
    if (n_tiles > j_begin) LOAD_K(sK, n_first);
    if (STAGES == 2) {
        if (n_tiles > j_begin) LOAD_V(sV, n_first);
        cp_commit();
        if (n_tiles > j_begin + 1) {
            LOAD_K(sK + BN * D, n_first + BN);
            LOAD_V(sV + BN * D, n_first + BN);
        }
    }
    cp_commit();

    // This thread's rows: 2 per m-tile (lane/4 and lane/4 + 8 within each 16-row tile).
    const int row0 = m0 + warp * WM + lane / 4;
    float acc[MT][D / 8][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int i = 0; i < D / 8; ++i) acc[t][i][0] = acc[t][i][1] = acc[t][i][2] = acc[t][i][3] = 0.f;
    // Running max (log2 units, -inf before any visible key) and sum of this thread's part of a row.
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int t = 0; t < MT; ++t) row_max[t][0] = row_max[t][1] = NEG_INF, row_sum[t][0] = row_sum[t][1] = 0.f;

    const FragAddr q_frag(sQ, warp * WM + (lane & 15), lane >> 4);
    const FragAddr k_frag(sK, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    const FragAddr v_frag(sV, (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);

    for (int j = j_begin; j < n_tiles; ++j) {
        const int n0 = j * BN;
        const int stage = STAGES == 2 ? (j - j_begin) & 1 : 0;
        const FragAddr kf = k_frag.shifted(stage * BN * D * 2);
        const FragAddr vf = v_frag.shifted(stage * BN * D * 2);
        if (STAGES == 1) {
            cp_wait<0>();     // K_j (and Q) have landed
            __syncthreads();  // ... for every thread; and every warp is done with V_{j-1}
            LOAD_V(sV, n0);
            cp_commit();
        } else {
            cp_wait<1>();     // tile j has landed (tile j+1 may still be in flight)
            __syncthreads();  // ... for every thread
        }
        if (j == j_begin && p.scale_log2 < 0.f) {
            // Each warp reads only its own rows of Q: it flips their signs itself.
#pragma unroll
            for (int it = 0; it < WM * CPR / 32; ++it) {
                const int i = lane + it * 32;
                const unsigned addr = tile_addr(sQ, warp * WM + i / CPR, i % CPR);
                uint4 x;
                asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                             : "r"(addr));
                x.x ^= 0x80008000u, x.y ^= 0x80008000u, x.z ^= 0x80008000u, x.w ^= 0x80008000u;
                asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(x.x), "r"(x.y), "r"(x.z),
                             "r"(x.w));
            }
            __syncwarp();
        }

        float s[MT][BN / 8][4];
        zero_scores(s);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned a[MT][4];
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                ldsm_x4(q_frag.at(kk, t * 16), a[t]);
            }
#pragma unroll
            for (int n2 = 0; n2 < BN / 16; ++n2) {
                unsigned bk[4];
                ldsm_x4(kf.at(kk, n2 * 16), bk);
#pragma unroll
                for (int t = 0; t < MT; ++t) {
                    mma(s[t][2 * n2], a[t], bk[0], bk[1]);
                    mma(s[t][2 * n2 + 1], a[t], bk[2], bk[3]);
                }
            }
        }

#if ATTN_SOFTCAP
        // s <- tanh(|scale| s / cap); sl2 = cap * log2(e) scales it in the exponent. Before the
        // mask, which must leave -inf.
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[t][nt][e] = tanh_fast(s[t][nt][e] * p.softcap_in);
#endif
#if ATTN_ALIBI
        {
            // ALiBi before the mask (which must leave -inf): -slope |row + shift - col| in s's
            // units. This thread's distances are one base plus compile-time offsets (its rows
            // row0 + 16 t + 8 (e >> 1), its keys n0 + 8 nt + 2 (lane % 4) + (e & 1)); integers
            // below 2^24, exact in f32.
            const float d0 = (float)(row0 + shift - n0 - 2 * (lane % 4));
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float d = d0 + (float)(t * 16 + (e >> 1) * 8 - nt * 8 - (e & 1));
                        s[t][nt][e] = fmaf(-alibi, fabsf(d), s[t][nt][e]);
                    }
        }
#endif
        // Mask: only tiles that reach past the sequence or the diagonal, or (window) whose first
        // key some row of the warp does not see yet (one branch per tile, so the other tiles run
        // no mask code at all).
        if (n0 + BN > SEQ_K || (CAUSAL && n0 + BN - 1 > m0 + warp * WM + shift) || window_edge(p, n0, m0 + warp * WM + shift)) {
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int col = n0 + nt * 8 + 2 * (lane % 4) + (e & 1);
                        const int row = row0 + t * 16 + (e >> 1) * 8;
                        if (col >= SEQ_K || (CAUSAL && col > row + shift) || outside_window(p, col, row + shift))
                            s[t][nt][e] = NEG_INF;
                    }
        }
        float tile_max[MT][2];
#pragma unroll
        for (int t = 0; t < MT; ++t) {
            tile_max[t][0] = tile_max[t][1] = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) tile_max[t][e >> 1] = fmaxf(tile_max[t][e >> 1], s[t][nt][e]);
        }
        // Move the running max only when some row of the warp outgrew it by RESCALE_SLACK.
        float new_max[MT][2];
        bool grow = false;
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float m = quad_max(tile_max[t][r]);
                new_max[t][r] = fmaxf(row_max[t][r], m == NEG_INF ? NEG_INF : m * sl2);
                grow |= new_max[t][r] > row_max[t][r] + RESCALE_SLACK;
            }
        if (__any_sync(0xffffffff, grow)) {
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    // A row with no visible key yet keeps -inf; exp2(-inf - 0) = 0, never NaN.
                    const float alpha =
                        exp2_fast(row_max[t][r] - (new_max[t][r] == NEG_INF ? 0.f : new_max[t][r]));
                    row_max[t][r] = new_max[t][r];
                    row_sum[t][r] *= alpha;
#pragma unroll
                    for (int dt = 0; dt < D / 8; ++dt) {
                        acc[t][dt][2 * r] *= alpha;
                        acc[t][dt][2 * r + 1] *= alpha;
                    }
                }
        }
        // p = exp2(s * sl2 - max); masked scores (-inf) give exactly 0.
#pragma unroll
        for (int t = 0; t < MT; ++t) {
            const float base[2] = {row_max[t][0] == NEG_INF ? 0.f : row_max[t][0],
                                   row_max[t][1] == NEG_INF ? 0.f : row_max[t][1]};
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[t][nt][e] = exp2_fast(fmaf(s[t][nt][e], sl2, -base[e >> 1]));
                    row_sum[t][e >> 1] += s[t][nt][e];
                }
            }
        }

        if (STAGES == 1) {
            cp_wait<0>();     // V_j has landed
            __syncthreads();  // ... for every thread; and every warp is done with K_j
            if (j + 1 < n_tiles) LOAD_K(sK, n0 + BN);
            cp_commit();
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            // The S accumulators of two adjacent n-tiles are exactly an A fragment of P.
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
                ldsm_x4_trans(vf.at(d2, kk * 16), bv);
#pragma unroll
                for (int t = 0; t < MT; ++t) {
                    mma(acc[t][2 * d2], a[t], bv[0], bv[1]);
                    mma(acc[t][2 * d2 + 1], a[t], bv[2], bv[3]);
                }
            }
        }
        if (STAGES == 2) {
            __syncthreads();  // every warp is done with stage j: refill it with tile j + 2
            if (j + 2 < n_tiles) {
                LOAD_K(sK + stage * BN * D, n0 + 2 * BN);
                LOAD_V(sV + stage * BN * D, n0 + 2 * BN);
            }
            cp_commit();
        }
    }
    cp_wait<0>();
    // A block that walked no key tile (rows above a causal diagonal before the first key, a
    // sequence without keys, a window outside them) met no barrier since Q's copies: cp_wait
    // covers only this thread's own, and another warp's copy into this warp's rows of sQ could
    // still land on top of the O staged there. (Unconditional: testing for no tile spilled the
    // tightest D=128 builds.)
#if ATTN_CAUSAL || ATTN_WINDOW || ATTN_SEQS
    __syncthreads();
#endif

    // O is staged through this warp's own rows of sQ (only this warp ever read them), then
    // written with 16-byte stores: whole rows per group of lanes instead of 4-byte pieces.
    __syncwarp();
    float inv[MT][2];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float sum = quad_sum(row_sum[t][r]);
            inv[t][r] = sum > 0.f ? 1.f / sum : 0.f;  // a row that sees no key: o = 0
            const int row = row0 + t * 16 + r * 8;
            if (p.lse != nullptr && lane % 4 == 0 && row < SEQ_Q) {
                p.lse[LSE_INDEX(row)] =
                    sum > 0.f ? (row_max[t][r] + log2f(sum)) * 0.69314718055994531f : NEG_INF;
            }
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int srow = warp * WM + t * 16 + lane / 4 + r * 8;
                const int col = dt * 8 + 2 * (lane % 4);
                const unsigned addr = tile_addr(sQ, srow, col / 8) + (col % 8) * 2;
                const elem2_t val = pack2(acc[t][dt][2 * r] * inv[t][r], acc[t][dt][2 * r + 1] * inv[t][r]);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(as_u32(val)));
            }
        }
    }
    __syncwarp();
#if ATTN_SEQS
    elem_t* o = p.o + (cu_q != nullptr ? q_start * p.o_ss : b * p.o_sb) + h * p.o_sh;
#else
    elem_t* o = p.o + b * p.o_sb + h * p.o_sh;
#endif
#pragma unroll
    for (int it = 0; it < WM * CPR / 32; ++it) {
        const int i = lane + it * 32;
        const int r = i / CPR, c = i % CPR;
        const int srow = warp * WM + r;
        if (m0 + srow < SEQ_Q && CHUNK_REAL(c)) {
            uint4 val;
            asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                         : "r"(tile_addr(sQ, srow, c)));
            *reinterpret_cast<uint4*>(o + (long long)(m0 + srow) * p.o_ss + c * 8) = val;
        }
    }
}
