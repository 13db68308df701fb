// What the backward's kernels share (flash_bwd.cu, the Ampere/Ada family's, and flash_bwd_sm90.cu,
// the Hopper family's main pass): the parameter block, one sequence's rows and where they lie,
// which query blocks meet a key block, and the gradient of one score. Included after
// mma_sm80.cuh (elem_t, exp2_fast) with ATTN_BF16 defined.
#pragma once

constexpr float LOG2E = 1.4426950408889634f;
#define POS_INF __int_as_float(0x7f800000)

#if ATTN_BF16
__device__ __forceinline__ float to_f(elem_t x) { return __bfloat162float(x); }
__device__ __forceinline__ elem_t from_f(float x) { return __float2bfloat16_rn(x); }
#else
__device__ __forceinline__ float to_f(elem_t x) { return __half2float(x); }
__device__ __forceinline__ elem_t from_f(float x) { return __float2half_rn(x); }
#endif

// Must match `KernelParams` in crates/attn-cuda/src/backward/launch.rs field for field.
struct Params {
    const elem_t* q;
    const elem_t* k;
    const elem_t* v;
    const elem_t* o;
    const elem_t* d_o;  // o's strides
    const float* lse;   // the forward's, natural log, laid out as attn_core's LSE
    float* delta;       // D per row, the LSE's layout
    float* dq_accum;    // [dq_copies][LSE rows][D] f32
    int* counters;      // deterministic mode: [batch, heads_q, query blocks][dq_copies]
    elem_t* dq;         // q's strides
    elem_t* dk;         // k's strides
    elem_t* dv;         // v's strides
    long long q_sb, q_sh, q_ss;
    long long k_sb, k_sh, k_ss;
    long long v_sb, v_sh, v_ss;
    long long o_sb, o_sh, o_ss;
    const int* cu_seqlens_q;  // [batch + 1] packed query offsets, or null
    const int* cu_seqlens_k;  // [batch + 1] packed key offsets, or null
    const int* seqused_k;     // [batch] keys each sequence uses, or null
    const float* alibi_slopes;  // [heads_q] or [batch, heads_q], or null
    int batch, heads_q, heads_kv, seq_q, seq_k;
    int q_total, kv_total;  // packed rows (0 where dense)
    int alibi_batch_stride;
    int win_left, win_right;  // row i sees keys i + shift - win_left ..= i + shift + win_right
    float scale;
    float softcap;  // 0: none
    int head_dim;   // a multiple of 8, at most D
    int deterministic;
    int m_blocks;   // blocks of 64 query rows in the longest sequence (the counters' layout)
    int dq_copies;  // copies of the dQ accumulator (1 but in the deterministic mode; see dq_turn_of)
    int rotate_key_blocks;  // Hopper main pass: the most key blocks a sequence may have for its walks
                            // over every query block to start at the key block's index (0: none)
};

// One sequence's rows, as attn_core::SeqMap defines them; every index clamped into the
// problem's bounds (a device caller's arrays are not checked on the host).
struct Seq {
    int q_start, q_len, k_start, k_len;
};

__device__ __forceinline__ Seq seq_of(const Params& p, int b) {
    Seq s;
    const int* cu_q = p.cu_seqlens_q;
    const int* cu_k = p.cu_seqlens_k;
    s.q_start = cu_q != nullptr ? min(max(cu_q[b], 0), p.q_total) : 0;
    s.q_len = cu_q != nullptr ? min(min(max(cu_q[b + 1], s.q_start), p.q_total) - s.q_start, p.seq_q) : p.seq_q;
    s.k_start = cu_k != nullptr ? min(max(cu_k[b], 0), p.kv_total) : 0;
    const int held = cu_k != nullptr ? min(min(max(cu_k[b + 1], s.k_start), p.kv_total) - s.k_start, p.seq_k) : p.seq_k;
    s.k_len = p.seqused_k != nullptr ? min(max(p.seqused_k[b], 0), held) : held;
    return s;
}

// Index of row i of (b, h) in the LSE's layout (and delta's, and dq_accum's rows).
__device__ __forceinline__ long long row_index(const Params& p, const Seq& s, int b, int h, int i) {
    return p.cu_seqlens_q != nullptr ? (long long)h * p.q_total + s.q_start + i
                                     : ((long long)b * p.heads_q + h) * p.seq_q + i;
}

// The dQ accumulator's layout. Row-major by default: row i's D floats at row_index(i) * D. With
// ATTN_DQ_PLANES (the Hopper writers' `planes` form, backward::DqAdd::Planes) a head's rows lie in
// D / 64 planes of 64 columns, so that 64 rows of a plane are 16 contiguous KiB, one bulk
// reduce-add from the writer's part; within a row the 16-byte chunks are XOR-swizzled by the
// row's index in its sequence mod 8, as in that part (whose stores from the MMA fragments are then
// free of bank conflicts). Element (row i, column c) of one copy, in floats from the copy's start;
// `row` is row_index(p, s, b, h, i), which the row-major layout takes (callers have it).
#ifndef ATTN_DQ_PLANES
#define ATTN_DQ_PLANES 0
#endif
template <int D>
__device__ __forceinline__ long long dq_at(const Params& p, const Seq& s, int b, int h, int i, long long row, int c) {
    if (!ATTN_DQ_PLANES) return row * D + c;
    const bool packed = p.cu_seqlens_q != nullptr;
    const long long rows = packed ? p.q_total : p.seq_q;  // a head's rows: a plane's
    const long long head = packed ? h : (long long)b * p.heads_q + h;
    const long long r = packed ? (long long)s.q_start + i : i;
    return (head * D + (c / 64) * 64) * rows + r * 64 + ((((c % 64) / 4) ^ (i % 8)) * 4 + c % 4);
}

// First element of (b, head) in a tensor with these strides (packed rows ignore the batch stride).
__device__ __forceinline__ long long q_base(const Params& p, const Seq& s, int b, int h, long long sb, long long sh,
                                            long long ss) {
    return (p.cu_seqlens_q != nullptr ? s.q_start * ss : b * sb) + h * sh;
}
__device__ __forceinline__ long long k_base(const Params& p, const Seq& s, int b, int g, long long sb, long long sh,
                                            long long ss) {
    return (p.cu_seqlens_k != nullptr ? s.k_start * ss : b * sb) + g * sh;
}

// The query rows of a sequence that see some key of [n0, n_end): [lo, hi) (empty when hi <= lo).
struct Rows {
    int lo, hi;
};
__device__ __forceinline__ Rows rows_seeing(const Params& p, const Seq& s, int n0, int n_end) {
    const long long shift = s.k_len - s.q_len;
    Rows r;
    r.lo = (int)max(0LL, (long long)n0 - shift - p.win_right);
    r.hi = (int)min((long long)s.q_len, (long long)n_end - 1 - shift + p.win_left + 1);
    return r;
}

// Whether key block n of BN keys and query rows [m0, m0 + BM) of one sequence meet.
template <int BN, int BM>
__device__ __forceinline__ bool meets(const Params& p, const Seq& s, int n, int m0) {
    const int n0 = n * BN;
    const Rows r = rows_seeing(p, s, n0, min(n0 + BN, s.k_len));
    return n0 < s.k_len && r.lo < r.hi && r.lo < m0 + BM && r.hi > m0;
}

// The deterministic mode's rank of key block n (which meets query block m0) among those meeting
// the query block, the highest first: last - n. The search for the last starts at the block of the
// last key the query block's last row can see, usually the answer (the loop's steps are for
// windows and ranges cut by the sequence); from the sequence's last block it took up to S / BN
// tests a step under a causal mask.
template <int BN, int BM>
__device__ __forceinline__ int rank_from_top(const Params& p, const Seq& s, int n, int m0) {
    int last = (s.k_len + BN - 1) / BN - 1;
    const long long reach = (long long)min(m0 + BM, s.q_len) - 1 + (s.k_len - s.q_len) + p.win_right;
    if (reach < (long long)last * BN) last = max(n, (int)(reach / BN));
    while (!meets<BN, BM>(p, s, last, m0)) --last;
    return last - n;
}

// Floats of one copy of the dQ accumulator: D for every row of the LSE's layout (D: the kernel's).
template <int D>
__device__ __forceinline__ long long dq_copy_floats(const Params& p) {
    return (p.cu_seqlens_q != nullptr ? (long long)p.heads_q * p.q_total : (long long)p.batch * p.heads_q * p.seq_q) *
           D;
}

// The deterministic mode's counter of one copy of query block m's dQ for query head h of sequence b.
__device__ __forceinline__ int* counter_at(const Params& p, int b, int h, int m, int copy) {
    return p.counters + (((long long)b * p.heads_q + h) * p.m_blocks + m) * p.dq_copies + copy;
}

// Where key block n adds its part of query block m's dQ (of the kernel's block rows, for query
// head h of sequence b), and in the deterministic mode after how many additions there. The key
// blocks meeting the query block take the copies of the accumulator in turn from the top (rank
// r to copy r mod dq_copies), and each copy's additions go in rank order under its own counter:
// a key block waits only for the one dq_copies above it, which is dq_copies steps ahead of it
// under a causal mask, rather than for the next one up. dQ's conversion sums the copies in order,
// so the bits are the same on every run and grid.
struct DqTurn {
    float* accum;  // the copy's dQ accumulator
    int* counter;  // deterministic: the copy's counter of additions (null otherwise)
    int before;    // deterministic: the additions (key blocks) to wait for there
};
// `rank`: the key block's place among those adding to the query block (deterministic mode).
template <int D>
__device__ __forceinline__ DqTurn dq_turn_at(const Params& p, int b, int h, int m, int rank) {
    DqTurn t;
    t.accum = p.dq_accum;
    t.counter = nullptr;
    t.before = 0;
    if (p.deterministic) {
        const int copy = rank % p.dq_copies;
        t.accum += copy * dq_copy_floats<D>(p);
        t.counter = counter_at(p, b, h, m, copy);
        t.before = rank / p.dq_copies;
    }
    return t;
}
template <int BN, int BM, int D>
__device__ __forceinline__ DqTurn dq_turn_of(const Params& p, const Seq& s, int b, int h, int n, int m) {
    return dq_turn_at<D>(p, b, h, m, p.deterministic ? rank_from_top<BN, BM>(p, s, n, m * BM) : 0);
}

// One score's P^T and dS^T (without the softmax scale, which dQ and dK take at the end): raw
// score `st`, its dP^T, the row's LSE in log2 units and D, ALiBi's slope. `seen`: the key is in
// the row's range (false: both 0). The soft-cap's factor (1 - tanh^2) is taken before masking,
// where the score is finite.
struct Grad {
    float p, ds;
};
__device__ __forceinline__ Grad grad_of(const Params& p, bool seen, int key, int diag, float slope, float st, float dpt,
                                        float lse2, float delta) {
    float score = st * p.scale, slope_of_cap = 1.f;
    if (p.softcap > 0.f) {
        const float t = tanhf(score / p.softcap);
        score = p.softcap * t;
        slope_of_cap = 1.f - t * t;
    }
    score -= slope * fabsf((float)(diag - key));
    Grad g;
    g.p = seen ? exp2_fast(fmaf(score, LOG2E, -lse2)) : 0.f;
    g.ds = g.p * (dpt - delta) * slope_of_cap;
    return g;
}

// Whether `key` is in row `diag - shift`'s range (diag = row + shift, shift = k_len - q_len).
__device__ __forceinline__ bool sees(const Params& p, const Seq& s, int key, int row, int diag) {
    return key < s.k_len && row < s.q_len && key <= diag + p.win_right && key >= diag - p.win_left;
}
