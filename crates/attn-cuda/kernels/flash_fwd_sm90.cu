// FlashAttention forward for Hopper (sm_90a): wgmma tensor-core products with accumulators in
// registers, K/V tiles brought in by the bulk tensor copy engine (TMA) into a ring of
// shared-memory stages guarded by mbarriers, and warp specialization: one producer warpgroup
// issues the copies, CONSUMERS consumer warpgroups compute.
//
// A CTA computes tiles of BM = 64 * CONSUMERS query rows of one (batch, head); consumer
// warpgroup w owns rows 64w .. 64w + 63 of the tile, so a row's softmax never leaves its warp
// (each row lives in one quad of lanes, as in mma.sync's accumulator layout). Per key tile of BN
// keys, each consumer warpgroup computes
//   S = Q K^T        wgmma m64nBNk16, Q and K from shared memory (both K-major, 128-byte swizzle)
//   online softmax   in registers, base 2: p = exp2(s * scale * log2(e) - max); the running max
//                    moves (and O is rescaled) only when a row outgrows it by RESCALE_SLACK,
//                    and past a piece's first key tile a tile's own max is looked for only
//                    when a row's p says it outgrew the running one (softmax_speculative)
//   O += P V         wgmma m64nDk16, P from registers (the S accumulators of two 8-key column
//                    chunks are exactly one 16-key A fragment once rounded to 16 bits), V from
//                    shared memory (MN-major: its rows are keys)
// Shared-memory tiles are [D / 64][rows][64]: 64-column blocks of 128-byte rows, 128-byte
// swizzled, which is what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B and what wgmma's
// descriptors describe (sm90.cuh, sw128_desc).
//
// Variants (NVRTC -D, chosen by crates/attn-cuda/src/hopper/plan.rs):
//   ATTN_BF16, ATTN_D (64, 128 or 256), ATTN_BN (keys per tile), ATTN_CONSUMERS (2 to 4),
//   ATTN_STAGES (K/V ring depth), ATTN_CAUSAL (bottom-right mask), ATTN_WINDOW (a sliding
//   window, never with CAUSAL: a tile's piece is the key tiles its rows see, from the first to
//   the last, as the causal mask's ends at the diagonal; the tiles at either edge are masked;
//   the bounds are run-time parameters; no split tail), ATTN_SOFTCAP (scores capped at +-cap,
//   cap * tanh(scaled score / cap), the cap a run-time parameter), ATTN_ALIBI (a bias
//   -slope |i + seq_k - seq_q - j| added to each score after the soft-cap, before the mask; the
//   slopes a device array, one per head or per (batch, head); at D <= 128 a piece's key tiles are
//   walked from its block's diagonal outwards: DIAGONAL_FIRST below),
// and in every variant: a producer warpgroup copies Q, K and V with TMA; inside a consumer
// warpgroup the softmax of tile j runs while the tensor cores compute P_{j-1} V_{j-1} (and S_j
// was issued with it); the consumer warpgroups take turns issuing their products (named
// barriers, in a ring), so one's softmax runs under another's products; and the grid is
// persistent: one CTA per SM (or fewer: the host may cap the grid to verify the path where a
// CTA computes many tiles); after its first tile (blockIdx.x) each CTA's producer takes the
// next tile from a counter in global memory, so CTAs that drew short tiles take more. Without a
// mask the tail is also split: the tiles past the last whole wave are cut into runs of key
// tiles dealt evenly to the CTAs (see Piece), and a tile's partial results are merged by
// whichever of its pieces ends last (merge_partials). (The forms without each of these, built
// one after another, were measured slower and retired; see docs/experiments.md.)
//   ATTN_O_STAGED   1: O goes to global memory through shared memory and a TMA store,
//   ATTN_Q_SLOTS    1: one Q tile in shared memory, loaded for the next piece once every
//                   consumer has issued its last S of this one; 2 (O staged):
//                   two slots, so that the producer loads the next piece's Q while this one's
//                   key tiles still run (as soon as its slot is free), and O is staged in its
//                   own tile's Q slot (freed under the next piece's first S, once the TMA store
//                   has read it),
//   (derived) STORER: O staged in a tile of its own (not O_IN_Q), up to three consumers: a
//                   consumer warpgroup writes its O to shared memory and arrives on o_full;
//                   a storer thread of the producer warpgroup (warp 1 + wg, lane 0) issues the
//                   TMA store and frees the tile (o_empty), so that no consumer waits for a
//                   barrier of its warpgroup or issues the store between its piece and the next,
//   ATTN_PRODUCER_REGS, ATTN_CONSUMER_REGS: registers per thread after setmaxnreg,
//   ATTN_BOTTOM     1 (causal, O staged): a head's query blocks end at its last row, so
//                   the block that S % BM leaves short is the first, whose rows see the fewest
//                   keys, not the last, whose see the most (its rows before 0 are TMA's zero
//                   fill on load; a warpgroup whose rows start there stores O from registers,
//                   skipping them, as a TMA store at a negative row faults); 0: blocks start
//                   at row 0,
//   ATTN_PAD        1: the problem's head dim (Params::head_dim, a multiple of 8) is below D. The
//                   tensor maps end at it, so TMA loads zeros past it into Q, K and V (S is
//                   unchanged, O's columns past it are zeros) and its stores leave those columns
//                   out; O stored from registers stops at it. Read by `#if` alone, like
//                   ATTN_WINDOW: the other variants' PTX is what it was,
//   ATTN_SEQS       1: sequences of their own lengths (attn_core::SeqMap): packed queries
//                   (`cu_seqlens_q`, the tensor maps then over all packed rows, batch 1),
//                   packed keys (`cu_seqlens_k`) and per-sequence key counts (`seqused_k`),
//                   each a device array or null. Tiles are (sequence, head, query block) over
//                   the longest sequence's blocks; the producer skips a tile past its own
//                   sequence's blocks (drawing the next at once). Loads past a sequence's end
//                   read its neighbour's rows (or a cache's unused slots), whose scores the key
//                   mask drops and whose query rows are never stored (V's rows there meet
//                   probabilities of 0, which a NaN or an infinity would still turn to NaN: the
//                   consumers zero them first, clear_v_past_keys): a warpgroup whose 64 rows run past its sequence
//                   stores O from registers, the others by TMA as usual. Causal masks align on
//                   each sequence's own lengths; no split tail. Read by `#if` alone,
//   ATTN_PAGED      1 (with ATTN_SEQS): keys and values in a paged cache (`block_table`): each
//                   key tile loaded a TMA box of `page_box` rows at a time, each from its page
//                   (load_kv_tile). Read by `#if` alone,
//   ATTN_TRACE      1 (a diagnostic build, never the default): the producer and one thread of
//                   each consumer warpgroup stamp each piece's steps in SM clock cycles into
//                   `trace` (see trace_put), for a timeline of where a CTA's cycles go
//                   (ATTN_CUDA_SM90_TRACE, bench/device/trace.sh).
// The barriers, stages and turns are modelled in kernels/sm90_protocol.py (random interleavings,
// checked for deadlocks and stale reads): run it after changing how any of them is used.
// Tiles are numbered so that neighbours share K/V in L2 and, under a causal mask, the longest
// come first (tile_at); both ways of handing them out take them in that order.
//
// Files: this one holds the configuration (the -D flags and what follows from them), the
// parameter block, the shared-memory layout, a consumer warpgroup's loop over its pieces and the
// entry; sm90.cuh the Hopper primitives, sm90_wgmma.cuh (generated) the wgmma wrappers, and
// sm90_trace.cuh, sm90_scheduler.cuh, sm90_mainloop.cuh and sm90_epilogue.cuh the parts, each
// opening with what it holds and what it relies on of the others.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "sm90.cuh"

#if ATTN_BF16
typedef __nv_bfloat16 elem_t;
typedef __nv_bfloat162 elem2_t;
__device__ __forceinline__ elem2_t pack2(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
#else
typedef __half elem_t;
typedef __half2 elem2_t;
__device__ __forceinline__ elem2_t pack2(float lo, float hi) { return __floats2half2_rn(lo, hi); }
#endif

constexpr int D = ATTN_D;
constexpr int BN = ATTN_BN;
constexpr int CONSUMERS = ATTN_CONSUMERS;
constexpr int BM = 64 * CONSUMERS;
constexpr int STAGES = ATTN_STAGES;
constexpr bool CAUSAL = ATTN_CAUSAL;
// ATTN_WINDOW, ATTN_SOFTCAP and ATTN_ALIBI are read by `#if` alone: a constant of each would add a PTX global
// to every variant, and their code stays out of the variants without them, whose PTX is what it
// was before they existed.
constexpr bool O_STAGED = ATTN_O_STAGED;
constexpr bool BOTTOM = ATTN_BOTTOM;
constexpr int Q_SLOTS = ATTN_Q_SLOTS;
// Two Q slots stage O in the Q slot of its own piece (free_prev_q).
constexpr bool O_IN_Q = Q_SLOTS == 2;
constexpr bool STORER = O_STAGED && !O_IN_Q && CONSUMERS <= 3;
constexpr bool SPLIT_TAIL = !CAUSAL && !ATTN_WINDOW && !ATTN_SEQS;  // the host splits no masked or varlen variant's tail
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int NS = BN / 2;  // S accumulators per thread: 64 x BN over 128 threads
constexpr int NO = D / 2;   // O accumulators per thread
constexpr int D_BLOCKS = D / 64;
#define NEG_INF __int_as_float(0xff800000)
constexpr float RESCALE_SLACK = 8.f;
constexpr float RESCALE_LIMIT = 256.f;  // 2^RESCALE_SLACK: the largest p the slack lets through
// Under ALiBi (at D <= 128, where the softmax speculates), a piece walks its key tiles from the
// one holding its query block's last diagonal back to its first, then on past the diagonal
// (DIAGONAL_FIRST, key_tile_at): the bias -slope |i - j| then only falls along the walk, so the
// running max the first tiles set holds. Walked forward, scores grow by slope * BN from each key
// tile to the next before the diagonal: for about half the standard slopes by more than
// RESCALE_SLACK, so that every tile issued S again (47-102% slower than no bias on the H100,
// 0528746). Causal, the walk is the key tiles from the last back.
#if ATTN_ALIBI && ATTN_D <= 128
#define ATTN_DIAGONAL_FIRST 1
#else
#define ATTN_DIAGONAL_FIRST 0
#endif
// Key tiles past a piece's first exponentiate against the running max without finding their own
// (softmax_speculative); not at D=256, where the second S product it may issue spills registers.
constexpr bool SPECULATE = D <= 128;

// The key tile that a piece of key tiles [j0, j1) takes k-th (j0 <= k < j1): k itself, or with
// DIAGONAL_FIRST the tile `diag` (of the block's last diagonal; held within the piece) first,
// then back to j0, then on from diag + 1.
__device__ __forceinline__ int key_tile_at(int j0, int j1, int diag, int k) {
#if ATTN_DIAGONAL_FIRST
    const int d = min(max(diag, j0), j1 - 1);
    return k <= d ? d - (k - j0) : k;
#else
    return k;
#endif
}

static_assert(D % 64 == 0 && D <= 256, "head dims 64, 128, 256: whole 64-column (128-byte) blocks");
static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "wgmma N: a multiple of 16 up to 256");
static_assert(CONSUMERS >= 2 && CONSUMERS <= 4, "128 to 256 query rows: several consumer warpgroups taking turns");
static_assert(!BOTTOM || (CAUSAL && O_STAGED), "blocks from the bottom: causal, Q and O by TMA");
static_assert(!(CAUSAL && ATTN_WINDOW), "a causal window is a window with right = 0");
static_assert(!ATTN_PAGED || ATTN_SEQS, "a paged cache is read as sequences of their own lengths");
static_assert(Q_SLOTS == 1 || (Q_SLOTS == 2 && O_STAGED), "two Q slots: O staged");
static_assert(!ATTN_TRACE || CONSUMERS < 5, "the trace: a producer and up to four consumer warpgroups");

// The generated wgmma wrappers wgmma_qk (S += Q K^T, 64 x BN) and wgmma_pv (O += P V, 64 x D).
#include "sm90_wgmma.cuh"

// Must match `Sm90Params` in crates/attn-cuda/src/hopper/launch.rs field for field; its test
// `layout_matches_the_kernel` asserts these offsets (NVRTC's headers have no offsetof): q 512,
// schedule 552, q_sb 560, batch 656, scale_log2 676, head_group 688, whole 692, partials 704,
// trace 712, win_left 720, alibi_slopes 736, alibi_batch_stride 744, head_dim 748; 768 bytes in
// all (the last eight fields fill what was
// padding, so the parameter block of the variants that do not read them is what it was). The
// ATTN_SEQS variants declare five more (cu_seqlens_q 752 ... kv_total 780) and ATTN_PAGED four
// (block_table 784 ... page_box 800; 896 bytes in both): the host passes them to every variant,
// and the driver copies the size the kernel declares.
struct Params {
    // (D, seq, heads, batch); boxes of 64 columns x BM (q), BN (k, v) or 64 (o) rows.
    sm90::TensorMap q_map, k_map, v_map, o_map;
    const elem_t* q;                      // the same tensors by pointer (the kernel reads only o,
    const elem_t* k;                      // to store O from registers; the others keep the layout)
    const elem_t* v;
    elem_t* o;
    float* lse;  // null when not asked for
    // The persistent scheduler's counters: [0] the next unit of work past the first gridDim.x,
    // [1] CTAs that have run out, then one per (tail tile, consumer warpgroup): the pieces of
    // that tile's rows that have arrived (merge_partials). Zero at every launch: the last CTA to
    // run out puts [0] and [1] back, the last piece of a tile its own.
    unsigned* schedule;
    long long q_sb, q_sh, q_ss;
    long long k_sb, k_sh, k_ss;
    long long v_sb, v_sh, v_ss;
    long long o_sb, o_sh, o_ss;
    int batch, heads_q, heads_kv, seq_q, seq_k;
    float scale_log2;  // softmax scale * log2(e)
    int q_blocks;      // query blocks per (batch, head)
    int tiles;         // q_blocks * batch * heads_q
    int head_group;    // causal: heads whose tiles go longest first together (see tile_at)
    // The split tail (see Piece; `Split` in crates/attn-cuda/src/hopper/split.rs): tiles before
    // `whole` go out whole, one per unit of work; the tail_iters key tiles of the tiles from
    // `whole` on are dealt to tail_units units in even runs. No split: whole = tiles, 0 units.
    int whole;
    int tail_units;
    int tail_iters;
    // Two slots per tail unit, for the partial results of its first and last pieces:
    // [slot][consumer warpgroup][NO / 4 + 1][128 threads] float4s (see merge_partials).
    float* partials;
    long long* trace;  // ATTN_TRACE: [CTA][TRACE_PIECES + 1][TRACE_ROLES][TRACE_EVENTS] stamps
    int win_left, win_right;  // ATTN_WINDOW: row i sees keys i + shift - win_left ..= i + shift + win_right
    float softcap_in;         // ATTN_SOFTCAP: |scale| / cap, tanh's argument per unscaled score
    float softcap_out;        // ATTN_SOFTCAP: cap * log2(e), the capped score in base-2 softmax units
    const float* alibi_slopes;  // ATTN_ALIBI: [heads_q], or [batch, heads_q]
    int alibi_batch_stride;     // ATTN_ALIBI: 0 (a slope per head) or heads_q (per batch and head)
    int head_dim;               // ATTN_PAD: the problem's head dim, a multiple of 8 below D
#if ATTN_SEQS
    // Sequences, as attn_core::SeqMap defines them; each array null where the problem has none
    // (the dense sizes then hold). seq_q and seq_k above are the longest sequence's.
    const int* cu_seqlens_q;  // [batch + 1] packed query offsets
    const int* cu_seqlens_k;  // [batch + 1] packed key offsets
    const int* seqused_k;     // [batch] keys each sequence uses
    int q_total;              // packed query rows (the LSE is then [heads_q, q_total])
    int kv_total;             // packed key rows
#if ATTN_PAGED
    // A paged cache (attn_core::KvRows::Paged): k_map and v_map span [D, page_size, heads_kv,
    // pages] with boxes of page_box rows, a multiple of 16 that divides both BN and page_size
    // (load_kv_tile).
    const int* block_table;   // [batch, pages_per_seq] page numbers (fewer than 2^31 entries)
    int page_size, pages_per_seq;
    int page_box;             // rows per TMA box of a key tile
#endif
#endif
};

// The pieces, in this order: each relies on what the ones before it declare (the configuration
// above, Params, the layout below), and none is compiled alone. The order also fixes the order of
// the constants' PTX globals, which a before-and-after comparison of the PTX sees.
#include "sm90_trace.cuh"       // the traced build's stamps (nothing in other builds)

// Shared memory, from a 1024-byte aligned base (the 128-byte swizzle repeats every 1024 bytes
// and the descriptors assume tiles start on that boundary). The host adds 1024 bytes of slack
// for the alignment: crates/attn-cuda/src/hopper/variant.rs mirrors these sizes.
constexpr int Q_BYTES = BM * D * 2;
constexpr int KV_BYTES = BN * D * 2;  // one K or V stage
constexpr int O_BYTES = O_STAGED && !O_IN_Q ? BM * D * 2 : 0;  // O_IN_Q: O goes out through Q's
// The mbarriers (Q's, the stages', O's for the storer), the piece slots (SLOT_INTS ints each),
// the merge flags (4 ints) and where each warpgroup's O goes (4 ints each, for the storer).
#if ATTN_SEQS
constexpr int SLOT_INTS = 12;  // a Piece and its Tile, with its sequence's rows
#else
constexpr int SLOT_INTS = 8;  // a Piece and its Tile
#endif
constexpr int BARRIER_BYTES = 8 * (2 * Q_SLOTS + 4 * STAGES + 2 * 4) + 4 * SLOT_INTS * Q_SLOTS + 16 + 4 * 4 * 4;
constexpr int SMEM_BYTES = Q_SLOTS * Q_BYTES + 2 * STAGES * KV_BYTES + O_BYTES + BARRIER_BYTES;
static_assert(SMEM_BYTES + 1024 <= 227 * 1024, "within the H100's opt-in shared memory per block");

struct Smem {
    elem_t* q;  // Q_SLOTS slots of Q_BYTES; piece n's Q is in slot n % Q_SLOTS
    elem_t* k;  // STAGES stages
    elem_t* v;
    elem_t* o;  // O on its way out (O_STAGED; with O_IN_Q, O uses its piece's Q slot instead)
    int* piece;  // [Q_SLOTS][SLOT_INTS]: the piece whose Q a slot holds and its tile, written before the producer arms q_full
    int* merge;  // per consumer warpgroup: whether its piece arrived last (merge_partials)
    unsigned long long* q_full;  // [Q_SLOTS] Q landed
    unsigned long long* q_empty; // [Q_SLOTS] every consumer thread is done with the Q slot and its piece
    unsigned long long* k_full;  // [STAGES]
    unsigned long long* k_empty;
    unsigned long long* v_full;
    unsigned long long* v_empty;
    unsigned long long* o_full;   // [4] STORER: the warpgroup's O is in its part of the O tile
    unsigned long long* o_empty;  // [4] STORER: its TMA store has read it
    int* o_at;                    // [4][4] STORER: where the warpgroup's O goes (row, head, batch), head -1 at the end
};

__device__ __forceinline__ Smem carve(unsigned char* raw) {
    const unsigned base = sm90::smem_u32(raw);
    unsigned char* p = raw + ((1024 - (base & 1023)) & 1023);
    Smem s;
    s.q = reinterpret_cast<elem_t*>(p);
    p += Q_SLOTS * Q_BYTES;
    s.k = reinterpret_cast<elem_t*>(p);
    s.v = reinterpret_cast<elem_t*>(p + STAGES * KV_BYTES);
    s.o = reinterpret_cast<elem_t*>(p + 2 * STAGES * KV_BYTES);
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(p + 2 * STAGES * KV_BYTES + O_BYTES);
    s.q_full = bars;
    s.q_empty = bars + Q_SLOTS;
    s.k_full = bars + 2 * Q_SLOTS;
    s.k_empty = s.k_full + STAGES;
    s.v_full = s.k_full + 2 * STAGES;
    s.v_empty = s.k_full + 3 * STAGES;
    s.o_full = s.k_full + 4 * STAGES;
    s.o_empty = s.o_full + 4;
    s.piece = reinterpret_cast<int*>(s.o_empty + 4);
    s.merge = s.piece + SLOT_INTS * Q_SLOTS;
    s.o_at = s.merge + 4;
    return s;
}

// Piece n's Q tile (slot n % Q_SLOTS).
__device__ __forceinline__ elem_t* q_tile_of(const Smem& s, int n) { return s.q + (n % Q_SLOTS) * (Q_BYTES / 2); }

#include "sm90_scheduler.cuh"   // tiles, pieces, the split tail, the piece slots
#include "sm90_mainloop.cuh"    // the producer, the consumers' key-tile loops, the softmax
#include "sm90_epilogue.cuh"    // O and the LSE out, the split tail's merge

// ---- A consumer warpgroup's pieces, and the entry.

// A consumer warpgroup's end: its last store has left the CTA, the turns are all taken.
__device__ __forceinline__ void consumed(const Params& p, const Smem& s, int wg, int& stores) {
    end_stores(s, wg, stores);
    if (O_STAGED && !STORER && threadIdx.x % 128 == 0) sm90::bulk_wait();  // the last store has left the CTA
    if (wg == 0) await_turn(wg);  // takes the last warpgroup's last arrival
    if (wg == 0) {
        trace_put(p, TRACE_PIECES, 0, CTA_END, stamp());
        trace_put(p, TRACE_PIECES, 0, CTA_GLOBAL_END, TRACE ? global_ns() : 0);
    }
}

__device__ void consume(const Params& p, const Smem& s, int wg) {
    if (wg == CONSUMERS - 1) pass_turn(wg);  // warpgroup 0 issues first
    int it = 0;      // K/V tiles consumed so far (the producer's count, in the same order)
    int stores = 0;  // STORER: O tiles handed to the storer so far
    for (int n = 0;; ++n) {  // n: pieces of this CTA so far
        const long long started = stamp();
        Tile tile;
        const Piece pc = take_piece(p, s, n, tile);
        if (pc.t >= p.tiles) break;
        const long long q_ready = stamp();
        trace_new_piece(wg);
        elem_t* const q_tile = q_tile_of(s, n);
        const Ctx c = context(p, s, wg, pc, tile, n);
        float o[NO];
#pragma unroll
        for (int i = 0; i < NO; ++i) o[i] = 0.f;
        RowState st = {{NEG_INF, NEG_INF}, {0.f, 0.f}};

        if (p.scale_log2 < 0.f) negate_q_rows(q_tile, wg);

        if (pc.j1 == pc.j0) {
            c.release_q();
            c.free_prev_q();
        } else {
            mainloop_overlapped(c, o, st, it);
        }
        const long long loop_end = stamp();
        finish_piece(c, pc, tile, q_tile, o, st, stores);
        trace_piece(p, n, wg, started, q_ready, loop_end);
    }
    consumed(p, s, wg, stores);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) attn_fwd_sm90(const __grid_constant__ Params p) {
    extern __shared__ unsigned char smem_raw[];
    const Smem s = carve(smem_raw);
    const int wg = threadIdx.x / 128;
    if (TRACE && threadIdx.x == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        trace_put(p, TRACE_PIECES, 0, CTA_START, stamp());
        trace_put(p, TRACE_PIECES, 0, CTA_SM, sm);
        trace_put(p, TRACE_PIECES, 0, CTA_GLOBAL_START, global_ns());
    }
    if (threadIdx.x == 0) {
        for (int i = 0; i < Q_SLOTS; ++i) {
            sm90::mbar_init(s.q_full + i, 1);
            sm90::mbar_init(s.q_empty + i, 128 * CONSUMERS);
        }
        for (int i = 0; i < 4; ++i) {
            sm90::mbar_init(s.o_full + i, 128);
            sm90::mbar_init(s.o_empty + i, 1);
        }
        for (int i = 0; i < STAGES; ++i) {
            sm90::mbar_init(s.k_full + i, 1);
            sm90::mbar_init(s.k_empty + i, 4 * CONSUMERS);
            sm90::mbar_init(s.v_full + i, 1);
            sm90::mbar_init(s.v_empty + i, 4 * CONSUMERS);
        }
        sm90::mbar_init_fence();
    }
    __syncthreads();
    // Warpgroup CONSUMERS produces (its registers go to the consumers); the others consume.
    if (wg == CONSUMERS) {
        sm90::regs_release<ATTN_PRODUCER_REGS>();
        const int warp = threadIdx.x % 128 / 32;
        if (threadIdx.x % 128 == 0) {
            produce(p, s);
        } else if (STORER && threadIdx.x % 32 == 0 && warp <= CONSUMERS) {
            store_for(p, s, warp - 1);
        }
    } else {
        sm90::regs_claim<ATTN_CONSUMER_REGS>();
        consume(p, s, wg);
    }
}