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
//   ATTN_BF16, ATTN_D (64, 128 or 256), ATTN_BN (keys per tile), ATTN_CONSUMERS (1 to 4),
//   ATTN_STAGES (K/V ring depth), ATTN_CAUSAL (bottom-right mask),
//   ATTN_TMA        1: a producer warpgroup copies Q, K and V with TMA (the family's kernels);
//                   0: no producer, the one consumer warpgroup loads its tiles with cp.async
//                   (the first, simplest form, kept to check the wgmma path alone),
//   ATTN_OVERLAP    1: inside a warpgroup, the softmax of tile j runs while the tensor cores
//                   compute P_{j-1} V_{j-1} (and S_j was issued with it),
//   ATTN_PINGPONG   1: the consumer warpgroups take turns issuing their products (named
//                   barriers, in a ring), so one's softmax runs under another's products,
//   ATTN_PERSISTENT 1: one CTA per SM (or fewer: the host may cap the grid to verify the path
//                   where a CTA computes many tiles); after its first tile (blockIdx.x) each
//                   CTA's producer takes the next tile from a counter in global memory, so CTAs
//                   that drew short tiles take more (0: a CTA per tile, the hardware hands them
//                   out),
//                   Without a mask the persistent form also splits the tail: the tiles past
//                   the last whole wave are cut into runs of key tiles dealt evenly to the CTAs
//                   (see Piece), and a tile's partial results are merged by whichever of its
//                   pieces ends last (merge_partials),
//   ATTN_O_STAGED   1: O goes to global memory through shared memory and a TMA store,
//   ATTN_Q_SLOTS    1: one Q tile in shared memory, loaded for the next piece once every
//                   consumer has issued its last S of this one; 2 (overlapped forms, O staged):
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
//   ATTN_BOTTOM     1 (causal, persistent form): a head's query blocks end at its last row, so
//                   the block that S % BM leaves short is the first, whose rows see the fewest
//                   keys, not the last, whose see the most (its rows before 0 are TMA's zero
//                   fill on load; a warpgroup whose rows start there stores O from registers,
//                   skipping them, as a TMA store at a negative row faults); 0: blocks start
//                   at row 0,
//   ATTN_TRIM       1 (causal, overlapped forms): a consumer warpgroup computes only the key
//                   tiles its own 64 rows see, and for the rest of its tile's key tiles only
//                   takes its turns and frees the stages (see mainloop_overlapped).
//   ATTN_X_*        experiment overrides of compile-time choices (ATTN_X_SPECULATE,
//                   ATTN_X_STORER), set only through ATTN_CUDA_SM90_DEFINES, to time a choice
//                   against the default in one binary,
//   ATTN_TRACE      1 (a diagnostic build, never the default): the producer and one thread of
//                   each consumer warpgroup stamp each piece's steps in SM clock cycles into
//                   `trace` (see trace_put), for a timeline of where a CTA's cycles go
//                   (ATTN_CUDA_SM90_TRACE, bench/device/trace.sh).
// The barriers, stages and turns are modelled in kernels/sm90_protocol.py (random interleavings,
// checked for deadlocks and stale reads): run it after changing how any of them is used.
// Tiles are numbered so that neighbours share K/V in L2 and, under a causal mask, the longest
// come first (tile_at); both ways of handing them out take them in that order.

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
constexpr bool TMA = ATTN_TMA;
constexpr bool OVERLAP = ATTN_OVERLAP;
constexpr bool PINGPONG = ATTN_PINGPONG;
constexpr bool PERSISTENT = ATTN_PERSISTENT;
constexpr bool O_STAGED = ATTN_O_STAGED;
constexpr bool TRIM = ATTN_TRIM;
constexpr bool BOTTOM = ATTN_BOTTOM;
constexpr int Q_SLOTS = ATTN_Q_SLOTS;
// Two Q slots stage O in the Q slot of its own piece (free_prev_q).
constexpr bool O_IN_Q = Q_SLOTS == 2;
#ifdef ATTN_X_STORER  // an experiment override (ATTN_CUDA_SM90_DEFINES): 0 turns the storer off
constexpr bool STORER = ATTN_X_STORER && TMA && O_STAGED && !O_IN_Q && CONSUMERS <= 3;
#else
constexpr bool STORER = TMA && O_STAGED && !O_IN_Q && CONSUMERS <= 3;
#endif
constexpr bool SPLIT_TAIL = PERSISTENT && !CAUSAL;  // the host splits no other variant's tail
constexpr int THREADS = 128 * (CONSUMERS + (TMA ? 1 : 0));
constexpr int NS = BN / 2;  // S accumulators per thread: 64 x BN over 128 threads
constexpr int NO = D / 2;   // O accumulators per thread
constexpr int D_BLOCKS = D / 64;
#define NEG_INF __int_as_float(0xff800000)
constexpr float RESCALE_SLACK = 8.f;
constexpr float RESCALE_LIMIT = 256.f;  // 2^RESCALE_SLACK: the largest p the slack lets through
// Key tiles past a piece's first exponentiate against the running max without finding their own
// (softmax_speculative); not at D=256, where the second S product it may issue spills registers.
#ifdef ATTN_X_SPECULATE  // an experiment override (ATTN_CUDA_SM90_DEFINES): 0 turns it off
constexpr bool SPECULATE = ATTN_X_SPECULATE && D <= 128;
#else
constexpr bool SPECULATE = D <= 128;
#endif

static_assert(D % 64 == 0 && D <= 256, "head dims 64, 128, 256: whole 64-column (128-byte) blocks");
static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "wgmma N: a multiple of 16 up to 256");
static_assert(TMA || (CONSUMERS == 1 && STAGES == 2 && !OVERLAP && !PINGPONG), "the cp.async form is one warpgroup");
static_assert(CONSUMERS >= 1 && CONSUMERS <= 4, "64 to 256 query rows");
static_assert(!PINGPONG || (CONSUMERS >= 2 && OVERLAP), "ping-pong: several consumer warpgroups, each overlapping");
static_assert(TMA || (!PERSISTENT && !O_STAGED), "the producer hands out tiles and stores O");
static_assert(!TRIM || (CAUSAL && OVERLAP), "trimmed key ranges: causal, in the overlapped main loop");
static_assert(!BOTTOM || (CAUSAL && PERSISTENT && O_STAGED), "blocks from the bottom: causal, Q and O by TMA");
static_assert(Q_SLOTS == 1 || (Q_SLOTS == 2 && OVERLAP && O_STAGED), "two Q slots: overlapped forms, O staged");
static_assert(!ATTN_TRACE || (TMA && CONSUMERS < 5), "the trace: a producer and up to four consumer warpgroups");

// The generated wgmma wrappers wgmma_qk (S += Q K^T, 64 x BN) and wgmma_pv (O += P V, 64 x D).
#include "sm90_wgmma.cuh"

// Must match `Sm90Params` in crates/attn-cuda/src/hopper/launch.rs field for field; its test
// `layout_matches_the_kernel` asserts these offsets (NVRTC's headers have no offsetof): q 512,
// schedule 552, q_sb 560, batch 656, scale_log2 676, head_group 688, whole 692, partials 704,
// trace 712; 768 bytes in all.
struct Params {
    // (D, seq, heads, batch); boxes of 64 columns x BM (q), BN (k, v) or 64 (o) rows.
    sm90::TensorMap q_map, k_map, v_map, o_map;
    const elem_t* q;                      // the same tensors by pointer, for the cp.async form
    const elem_t* k;
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
    // The split tail (see Piece; `Split` in crates/attn-cuda/src/hopper/plan.rs): tiles before
    // `whole` go out whole, one per unit of work; the tail_iters key tiles of the tiles from
    // `whole` on are dealt to tail_units units in even runs. No split: whole = tiles, 0 units.
    int whole;
    int tail_units;
    int tail_iters;
    // Two slots per tail unit, for the partial results of its first and last pieces:
    // [slot][consumer warpgroup][NO / 4 + 1][128 threads] float4s (see merge_partials).
    float* partials;
    long long* trace;  // ATTN_TRACE: [CTA][TRACE_PIECES + 1][TRACE_ROLES][TRACE_EVENTS] stamps
};

// ---- ATTN_TRACE: a CTA's timeline, for finding where its cycles go (a diagnostic build).
// Row (piece n, role) holds the events below: role w < CONSUMERS is consumer warpgroup w's
// thread 0, role TRACE_ROLES - 1 the producer's; stamps are clock64, this SM's cycles, and waits
// are summed over the piece. Row TRACE_PIECES holds the CTA's own. The host names the events in
// the same order (bench/device/trace.py).
#ifndef ATTN_TRACE
#define ATTN_TRACE 0
#endif
constexpr bool TRACE = ATTN_TRACE;
constexpr int TRACE_PIECES = 64, TRACE_ROLES = 5, TRACE_EVENTS = 16;
enum ConsumerEvent {
    C_START, C_Q_READY, C_FIRST_S, C_LOOP_END, C_STORED, C_K_WAIT, C_V_WAIT, C_TURN_WAIT,
    C_FIRST_ISSUED, C_STORE_SYNCED, C_STORE_WRITTEN, C_STORE_FENCED, C_STORE_SUMMED, C_STORE_WAITED
};
enum ProducerEvent { P_ANNOUNCE, P_ANNOUNCED, P_ISSUED, P_K_WAIT, P_V_WAIT, P_PIECE };
enum CtaEvent { CTA_START, CTA_END, CTA_SM, CTA_GLOBAL_START, CTA_GLOBAL_END };
// The sums of the waits, and the first S's stamp, of the piece each role is on.
enum Sum {
    SUM_K, SUM_V, SUM_TURN, SUM_FIRST_S, SUM_FIRST_ISSUED, SUM_STORE_SYNCED, SUM_STORE_WRITTEN, SUM_STORE_FENCED,
    SUM_STORE_SUMMED, SUM_STORE_WAITED
};

__device__ __forceinline__ bool tracer() { return TRACE && threadIdx.x % 128 == 0; }
__device__ __forceinline__ long long global_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ long long stamp() { return TRACE ? clock64() : 0; }
constexpr int PRODUCER_ROLE = TRACE_ROLES - 1;
// Event e of piece n (row TRACE_PIECES: the CTA's) for `role`, from its tracing thread.
__device__ __forceinline__ void trace_put(const Params& p, int n, int role, int e, long long v) {
    if (tracer() && n <= TRACE_PIECES)
        p.trace[((blockIdx.x * (TRACE_PIECES + 1) + n) * TRACE_ROLES + role) * TRACE_EVENTS + e] = v;
}
#if ATTN_TRACE
__shared__ long long trace_sums[TRACE_ROLES][10];
__device__ __forceinline__ long long sum_get(int role, int k) { return trace_sums[role][k]; }
__device__ __forceinline__ void sum_set(int role, int k, long long v) {
    if (tracer()) trace_sums[role][k] = v;
}
// Runs the call (a wait), adding the cycles it took to the role's sum k.
#define TIMED(role, k, ...)                                                          \
    do {                                                                             \
        const long long t0_ = clock64();                                             \
        __VA_ARGS__;                                                                 \
        if (tracer()) trace_sums[role][k] += clock64() - t0_;                        \
    } while (0)
#else
__device__ __forceinline__ long long sum_get(int, int) { return 0; }
__device__ __forceinline__ void sum_set(int, int, long long) {}
#define TIMED(role, k, ...) __VA_ARGS__
#endif

// Shared memory, from a 1024-byte aligned base (the 128-byte swizzle repeats every 1024 bytes
// and the descriptors assume tiles start on that boundary). The host adds 1024 bytes of slack
// for the alignment: crates/attn-cuda/src/hopper/plan.rs mirrors these sizes.
constexpr int Q_BYTES = BM * D * 2;
constexpr int KV_BYTES = BN * D * 2;  // one K or V stage
constexpr int O_BYTES = O_STAGED && !O_IN_Q ? BM * D * 2 : 0;  // O_IN_Q: O goes out through Q's
// The mbarriers (Q's, the stages', O's for the storer), the piece slots (SLOT_INTS ints each),
// the merge flags (4 ints) and where each warpgroup's O goes (4 ints each, for the storer).
constexpr int SLOT_INTS = 8;  // a Piece and its Tile
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

// The (batch * head, query block) of tile t, and how many key tiles it sees.
struct Tile {
    int b, h, m0, n_kv;
};

// The key tiles that query rows before `row_end` see under the bottom-right causal mask (row i
// sees keys j <= i + seq_k - seq_q).
__device__ __forceinline__ int visible_key_tiles(const Params& p, int row_end) {
    const int n_end = min(p.seq_k, max(0, row_end + p.seq_k - p.seq_q));
    return (n_end + BN - 1) / BN;
}

// Without a mask a head's query blocks are neighbours, so the CTAs running at once share K/V
// in L2. Under a causal mask the longest tiles go first, but across all heads at once each
// wave of CTAs would read every head's K/V (at S=2048, D=128: 128 MB, against 50 MB of L2) and
// the next wave read them again: tiles go longest first within groups of `head_group` heads,
// whose K/V the host sized to fit L2, one group after another.
__device__ __forceinline__ Tile tile_at(const Params& p, int t) {
    const int bh_total = p.batch * p.heads_q;
    int bh, qb;
    if (CAUSAL) {
        const int group = t / (p.head_group * p.q_blocks), r = t % (p.head_group * p.q_blocks);
        const int heads = min(p.head_group, bh_total - group * p.head_group);  // the last may be short
        bh = group * p.head_group + r % heads;
        qb = p.q_blocks - 1 - r / heads;
    } else {
        bh = t / p.q_blocks;
        qb = t % p.q_blocks;
    }
    Tile tile;
    tile.b = bh / p.heads_q;
    tile.h = bh % p.heads_q;
    // BOTTOM: the first block starts before row 0 where BM does not divide seq_q.
    tile.m0 = BOTTOM ? p.seq_q - (p.q_blocks - qb) * BM : qb * BM;
    tile.n_kv = CAUSAL ? visible_key_tiles(p, tile.m0 + BM) : (p.seq_k + BN - 1) / BN;
    return tile;
}

// A piece of work: key tiles [j0, j1) of tile t. The units of work a CTA draws are whole tiles
// (`unit` -1), then, past `whole`, the tail's units: without a mask every tile has the same
// key tiles, and the tail's tail_iters of them, tile after tile, are dealt to tail_units units
// in runs as even as integers allow. A run may cross from one tile into the next, so a unit is
// one piece or more; a piece that is not its tile's whole range is partial. t >= p.tiles: no
// work is left.
struct Piece {
    int t, j0, j1, unit;
};

__device__ __forceinline__ int key_tiles(const Params& p) { return (p.seq_k + BN - 1) / BN; }
// The first key tile (counted over the tail) of tail unit g, and the unit that holds key tile x
// (the host keeps tail_units * tail_iters under 2^31).
__device__ __forceinline__ int unit_start(const Params& p, int g) { return g * p.tail_iters / p.tail_units; }
__device__ __forceinline__ int unit_of(const Params& p, int x) { return ((x + 1) * p.tail_units - 1) / p.tail_iters; }

// Tail unit g's piece that starts at the tail's key tile x: up to the unit's end or the tile's.
__device__ __forceinline__ Piece run_at(const Params& p, int g, int x) {
    const int nk = key_tiles(p), tail_tile = x / nk;
    const int end = min(unit_start(p, g + 1), (tail_tile + 1) * nk);
    return Piece{p.whole + tail_tile, x - tail_tile * nk, end - tail_tile * nk, g};
}

// The first piece of unit of work u.
__device__ __forceinline__ Piece first_piece(const Params& p, int u) {
    if (!SPLIT_TAIL || u < p.whole) return Piece{u, 0, u < p.tiles ? tile_at(p, u).n_kv : 0, -1};
    const int g = u - p.whole;
    if (g >= p.tail_units) return Piece{p.tiles, 0, 0, -1};
    return run_at(p, g, unit_start(p, g));
}

// Moves `pc` on to the next piece of its unit; false when the unit has no more.
__device__ __forceinline__ bool next_piece(const Params& p, Piece& pc) {
    if (!SPLIT_TAIL || pc.unit < 0) return false;
    const int x = (pc.t - p.whole) * key_tiles(p) + pc.j1;
    if (x >= unit_start(p, pc.unit + 1)) return false;
    pc = run_at(p, pc.unit, x);
    return true;
}

// ---- The producer: one thread of the producer warpgroup issues every copy.

// Waits until the consumers are done with the Q slot of piece n (they last used it for piece
// n - Q_SLOTS), then names piece n and its tile in the slot (so that no consumer divides to
// find the tile: its integer divisions would queue behind the exponentials on the MUFU pipe at
// the piece's start) and returns the slot. The q_full arrival that follows releases the slot's
// stores to the consumers that wait on it. `n` counts the pieces handed out.
__device__ __forceinline__ int announce(const Smem& s, const Piece& pc, const Tile& tile, int& n) {
    const int q = n % Q_SLOTS;
    sm90::mbar_wait(s.q_empty + q, ((n++ / Q_SLOTS) & 1) ^ 1);
    volatile int* slot = s.piece + SLOT_INTS * q;
    slot[0] = pc.t;
    slot[1] = pc.j0;
    slot[2] = pc.j1;
    slot[3] = pc.unit;
    slot[4] = tile.b;
    slot[5] = tile.h;
    slot[6] = tile.m0;
    slot[7] = tile.n_kv;
    return q;
}

// Whether the Q slot of piece n is free (announce would not wait).
__device__ __forceinline__ bool slot_free(const Smem& s, int n) {
    return sm90::mbar_test(s.q_empty + n % Q_SLOTS, ((n / Q_SLOTS) & 1) ^ 1);
}

// Hands piece pc (of tile `tile`) out: names it in its Q slot and loads its Q there; a piece
// past the last tile is the end, named without a Q.
__device__ __forceinline__ void hand_out(const Params& p, const Smem& s, const Piece& pc, const Tile& tile, int& n) {
    const int traced = n;  // this piece's row of the trace
    trace_put(p, traced, PRODUCER_ROLE, P_ANNOUNCE, stamp());
    const int q = announce(s, pc, tile, n);
    trace_put(p, traced, PRODUCER_ROLE, P_ANNOUNCED, stamp());
    if (pc.t >= p.tiles) {
        sm90::mbar_arrive(s.q_full + q);  // no Q: the consumers read the slot and stop
        return;
    }
    sm90::mbar_arrive_expect_tx(s.q_full + q, Q_BYTES);
#pragma unroll
    for (int c = 0; c < D_BLOCKS; ++c)
        sm90::tma_load_4d(s.q + q * (Q_BYTES / 2) + c * BM * 64, &p.q_map, s.q_full + q, 64 * c, tile.m0, tile.h,
                          tile.b);
}

__device__ __forceinline__ Tile tile_or_none(const Params& p, const Piece& pc) {
    return pc.t < p.tiles ? tile_at(p, pc.t) : Tile{0, 0, 0, 0};
}

// Hands out each piece, then loads its K/V tiles into the stages. With one Q slot the next
// piece goes out after this piece's last K/V tile (its slot is free once this piece's last S
// is done); with two, as soon as its slot is free while this piece's tiles go out (the slot
// frees under this piece's first key tiles), so that its Q lands long before this piece ends
// (handed out after the last tile, the next Q landed 1.5 key tiles after a consumer that wanted
// it under this piece's last P V needed it, by the trace). The next unit is drawn from the
// counter as this piece starts; the draw is waited for only when the next piece goes out.
__device__ void produce(const Params& p, const Smem& s) {
    sm90::tma_prefetch(&p.q_map);
    sm90::tma_prefetch(&p.k_map);
    sm90::tma_prefetch(&p.v_map);
    int it = 0;  // K/V tiles issued so far: stage it % STAGES, phase (it / STAGES) & 1
    int n = 0;   // pieces handed out so far
    Piece pc = first_piece(p, blockIdx.x);
    Tile tile = tile_or_none(p, pc);
    hand_out(p, s, pc, tile, n);
    while (pc.t < p.tiles) {
        const int traced = n - 1;  // this piece's row of the trace
        Piece next = pc;
        const bool same_unit = next_piece(p, next);
        const unsigned drawn = same_unit || !PERSISTENT ? 0u : atomicAdd(p.schedule, 1u);
        sum_set(PRODUCER_ROLE, SUM_K, 0);
        sum_set(PRODUCER_ROLE, SUM_V, 0);
        bool handed = false;  // the next piece
        Tile upcoming;
        const int g = tile.h / (p.heads_q / p.heads_kv);
        for (int j = pc.j0; j < pc.j1; ++j, ++it) {
            const int st = it % STAGES;
            const unsigned free_parity = ((it / STAGES) & 1) ^ 1;
            elem_t* k = s.k + st * (KV_BYTES / 2);
            elem_t* v = s.v + st * (KV_BYTES / 2);
            TIMED(PRODUCER_ROLE, SUM_K, sm90::mbar_wait(s.k_empty + st, free_parity));
            sm90::mbar_arrive_expect_tx(s.k_full + st, KV_BYTES);
#pragma unroll
            for (int c = 0; c < D_BLOCKS; ++c)
                sm90::tma_load_4d(k + c * BN * 64, &p.k_map, s.k_full + st, 64 * c, j * BN, g, tile.b);
            TIMED(PRODUCER_ROLE, SUM_V, sm90::mbar_wait(s.v_empty + st, free_parity));
            sm90::mbar_arrive_expect_tx(s.v_full + st, KV_BYTES);
#pragma unroll
            for (int c = 0; c < D_BLOCKS; ++c)
                sm90::tma_load_4d(v + c * BN * 64, &p.v_map, s.v_full + st, 64 * c, j * BN, g, tile.b);
            if (Q_SLOTS == 2 && !handed && slot_free(s, n)) {
                if (!same_unit) next = first_piece(p, PERSISTENT ? gridDim.x + drawn : p.tiles);
                upcoming = tile_or_none(p, next);
                hand_out(p, s, next, upcoming, n);
                handed = true;
            }
        }
        trace_put(p, traced, PRODUCER_ROLE, P_ISSUED, stamp());
        trace_put(p, traced, PRODUCER_ROLE, P_K_WAIT, sum_get(PRODUCER_ROLE, SUM_K));
        trace_put(p, traced, PRODUCER_ROLE, P_V_WAIT, sum_get(PRODUCER_ROLE, SUM_V));
        trace_put(p, traced, PRODUCER_ROLE, P_PIECE, ((long long)pc.t << 32) | ((long long)pc.j0 << 16) | (long long)pc.j1);
        if (!handed) {
            if (!same_unit) next = first_piece(p, PERSISTENT ? gridDim.x + drawn : p.tiles);
            upcoming = tile_or_none(p, next);
            hand_out(p, s, next, upcoming, n);
        }
        pc = next;
        tile = upcoming;
    }
    if (PERSISTENT) __threadfence();  // this CTA's last draw from the counter, before it says so
    if (PERSISTENT && atomicAdd(p.schedule + 1, 1u) == gridDim.x - 1) {
        // Every CTA has run out: none will touch the counters again in this launch.
        atomicExch(p.schedule, 0u);
        atomicExch(p.schedule + 1, 0u);
    }
}

// ---- The consumers' arithmetic. Thread (warp w of the warpgroup, lane) holds, of each 8-column
// chunk c of an accumulator, the elements (row 16w + lane/4, columns 8c + 2(lane%4) + {0,1})
// at [4c], [4c + 1] and the same columns of row + 8 at [4c + 2], [4c + 3].

// Starts a batch of wgmma: what the registers the batch reads (O, P) were given must be done
// before it (see sm90::fence_regs).
__device__ __forceinline__ void begin_batch(float (&o)[NO], unsigned (&pa)[BN / 16][4]) {
    sm90::fence_regs(o);
    sm90::fence_regs(pa);
    sm90::wgmma_fence();
}

// S = Q K^T for this warpgroup's 64 rows. `q` and `k` are the tiles' shared addresses.
__device__ __forceinline__ void issue_qk(float (&s)[NS], unsigned q, unsigned k) {
    const unsigned long long qd = sm90::sw128_desc(q, 0), kd = sm90::sw128_desc(k, 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const unsigned long long qa = sm90::desc_advance(qd, (kk / 4) * BM * 128 + (kk % 4) * 32);
        const unsigned long long ka = sm90::desc_advance(kd, (kk / 4) * BN * 128 + (kk % 4) * 32);
        wgmma_qk(s, qa, ka, kk > 0);
    }
    sm90::wgmma_commit();
}

// O += P V, P as BN / 16 A fragments; V's 64-column blocks are BN rows (BN * 128 bytes) apart.
__device__ __forceinline__ void issue_pv(float (&o)[NO], unsigned (&pa)[BN / 16][4], unsigned v) {
    const unsigned long long vd = sm90::sw128_desc(v, BN * 128);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv(o, pa[kk], sm90::desc_advance(vd, kk * 16 * 128), 1);
    sm90::wgmma_commit();
}

// Ping-pong: a consumer warpgroup waits for its turn to issue products, and after issuing hands
// the turn to the next in the ring (named barrier TURN + w is warpgroup w's, met by its 128
// threads waiting and the previous warpgroup's 128 arriving). Barriers 1 + w are warpgroup w's
// own (128 threads); 0 is __syncthreads'.
constexpr int TURN = 1 + CONSUMERS;
__device__ __forceinline__ void await_turn(int wg) {
    if (PINGPONG) sm90::named_sync(TURN + wg, 256);
}
__device__ __forceinline__ void pass_turn(int wg) {
    if (PINGPONG) sm90::named_arrive(TURN + (wg + 1) % CONSUMERS, 256);
}

// Whether `x` holds in any thread of warpgroup wg (a reduction on its own named barrier, 1 + wg),
// read through a vote so that ptxas knows every lane has the same answer.
__device__ __forceinline__ bool warpgroup_any(int wg, bool x) {
    unsigned any;
    asm volatile(
        "{\n"
        ".reg .pred p, q;\n"
        "setp.ne.u32 q, %1, 0;\n"
        "bar.red.or.pred p, %2, 128, q;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(any)
        : "r"(static_cast<unsigned>(x)), "r"(1 + wg)
        : "memory");
    return __any_sync(0xffffffffu, any != 0);
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// 2^x in one MUFU.EX2 (2^-inf = 0).
__device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 1 / x for a positive normal x on the FMA pipe, not MUFU's (which the other warpgroups'
// exponentials keep busy while a warpgroup stores its O): an estimate from the bits and three
// Newton steps, each of which squares the relative error (under 6% first; about 1 ulp after).
__device__ __forceinline__ float reciprocal(float x) {
    float y = __int_as_float(0x7ef311c3 - __float_as_int(x));
#pragma unroll
    for (int i = 0; i < 3; ++i) y = y * fmaf(-x, y, 2.f);
    return y;
}

__device__ __forceinline__ unsigned as_u32(elem2_t x) { return *reinterpret_cast<unsigned*>(&x); }

// A thread's row reductions (max, sum) run in CHAINS independent chains per row, element
// (chunk c, e) in chain chain(c, e), combined pairwise at the end: ILP for the softmax, though
// on the H100 it timed the same as one chain (bench/results/2026-11-25-h100-hopper-0fb8596).
constexpr int CHAINS = 4;
__device__ __forceinline__ int chain(int c, int e) { return (2 * c + (e & 1)) % CHAINS; }
__device__ __forceinline__ float max_of(const float (&x)[CHAINS]) {
    return fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
}
__device__ __forceinline__ float sum_of(const float (&x)[CHAINS]) { return (x[0] + x[1]) + (x[2] + x[3]); }
static_assert(CHAINS == 4, "max_of and sum_of combine four chains");

// The running softmax state of this thread's two rows.
struct RowState {
    float max[2];    // log2 units, -inf before any visible key
    float sum[2];    // this thread's part of the row sum (the quad's four parts add up at the end)
    float total[2];  // once final: the quad's sums
    float inv[2];    // and their inverses (0 where a row saw no key)
    bool final;      // total and inv hold the sums as they are now
};

// The rows' sums added over the quad and inverted, once no tile is left to add to them: ahead of
// the store, under the last P V (a chain of shuffles that costs a few hundred cycles when it
// waits instead).
__device__ __forceinline__ void finalize(RowState& st) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        st.total[r] = quad_sum(st.sum[r]);
        st.inv[r] = st.total[r] > 0.f ? reciprocal(st.total[r]) : 0.f;  // a row that sees no key: o = 0
    }
    st.final = true;
}

// Masks the scores of key columns past seq_k or (causal) past a row's diagonal to -inf.
// `row` is this thread's first row, `n0` the tile's first key. Each row's last visible key is
// found once, as an offset from this thread's first column, so that each score then takes one
// compare against a constant and one select (not a column sum and two compares).
__device__ __forceinline__ void mask(float (&s)[NS], int row, int n0, int seq_k, int shift) {
    const int first_col = n0 + 2 * (threadIdx.x % 4);
    int last[2];  // per row, the last visible column's offset from first_col
#pragma unroll
    for (int r = 0; r < 2; ++r) last[r] = (CAUSAL ? min(seq_k - 1, row + 8 * r + shift) : seq_k - 1) - first_col;
#pragma unroll
    for (int c = 0; c < BN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (8 * c + (e & 1) > last[e >> 1]) s[4 * c + e] = NEG_INF;
}

// The new running max of a tile's scores; returns, per row, the factor by which the old sums
// and O must be scaled (1 where the max did not move). The max moves only when some row of the
// warp outgrew it by more than RESCALE_SLACK: until then probabilities stay below
// 2^RESCALE_SLACK, which f32 sums and 16-bit P hold as well, and O / sum is unchanged.
__device__ __forceinline__ bool update_max(const float (&s)[NS], RowState& st, float sl2, float (&alpha)[2]) {
    float part[2][CHAINS];  // per row, CHAINS running maxima instead of one BN / 4 long
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int k = 0; k < CHAINS; ++k) part[r][k] = NEG_INF;
#pragma unroll
    for (int c = 0; c < BN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float& m = part[e >> 1][chain(c, e)];
            m = fmaxf(m, s[4 * c + e]);
        }
    const float tile_max[2] = {max_of(part[0]), max_of(part[1])};
    float new_max[2];
    bool grow = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float m = quad_max(tile_max[r]);
        new_max[r] = fmaxf(st.max[r], m == NEG_INF ? NEG_INF : m * sl2);
        grow |= new_max[r] > st.max[r] + RESCALE_SLACK;
    }
    alpha[0] = alpha[1] = 1.f;
    if (!__any_sync(0xffffffff, grow)) return false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        // A row with no visible key yet keeps -inf; exp2(-inf - 0) = 0, never NaN.
        alpha[r] = exp2_fast(st.max[r] - (new_max[r] == NEG_INF ? 0.f : new_max[r]));
        st.max[r] = new_max[r];
        st.sum[r] *= alpha[r];
    }
    return true;
}

__device__ __forceinline__ void rescale(float (&o)[NO], const float (&alpha)[2]) {
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
        o[4 * c] *= alpha[0];
        o[4 * c + 1] *= alpha[0];
        o[4 * c + 2] *= alpha[1];
        o[4 * c + 3] *= alpha[1];
    }
}

// p = exp2(s * sl2 - max) in place (masked scores, -inf, give exactly 0), added to the sums.
// (The same, with this thread's part of the tile's row sums returned in `sums`, not added.)
__device__ __forceinline__ void exponentiate_rows(float (&s)[NS], const RowState& st, float sl2, float (&sums)[2]) {
    const float base[2] = {st.max[0] == NEG_INF ? 0.f : st.max[0], st.max[1] == NEG_INF ? 0.f : st.max[1]};
    float part[2][CHAINS] = {};  // the tile's sums, in independent chains as the max
#pragma unroll
    for (int c = 0; c < BN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[4 * c + e] = exp2_fast(fmaf(s[4 * c + e], sl2, -base[e >> 1]));
            part[e >> 1][chain(c, e)] += s[4 * c + e];
        }
#pragma unroll
    for (int r = 0; r < 2; ++r) sums[r] = sum_of(part[r]);
}

__device__ __forceinline__ void exponentiate(float (&s)[NS], RowState& st, float sl2) {
    float sums[2];
    exponentiate_rows(s, st, sl2, sums);
#pragma unroll
    for (int r = 0; r < 2; ++r) st.sum[r] += sums[r];
}

// The probabilities as 16-bit A fragments: key chunks 2kk and 2kk + 1 make fragment kk.
__device__ __forceinline__ void to_fragments(const float (&s)[NS], unsigned (&pa)[BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        pa[kk][0] = as_u32(pack2(s[8 * kk + 0], s[8 * kk + 1]));
        pa[kk][1] = as_u32(pack2(s[8 * kk + 2], s[8 * kk + 3]));
        pa[kk][2] = as_u32(pack2(s[8 * kk + 4], s[8 * kk + 5]));
        pa[kk][3] = as_u32(pack2(s[8 * kk + 6], s[8 * kk + 7]));
    }
}

// O / sum to the output (rows past seq_q skipped), and the LSE when asked for. Staged: this
// warpgroup's 64 rows go into its part of the O buffer in the 128-byte swizzled layout (each
// quad's 16 bytes of a row land in a chunk of their own, so a warp's stores are free of bank
// conflicts), then one thread hands them to TMA, which skips the rows past seq_q; the thread
// waits for its previous store to have read the buffer before anyone writes it again.
__device__ __forceinline__ void store_output(const Params& p, const Smem& s, elem_t* q_tile, const Tile& tile,
                                             int wg, int row0, float (&o)[NO], RowState& st, int& stores) {
    const int t = threadIdx.x % 128, lane = threadIdx.x % 32;
    // Through a vote, which ptxas knows is the same in every lane: a branch on the flag itself
    // would make it take the key-tile loop for divergent code (28 R2UR in it at D=64, not 8).
    if (__any_sync(0xffffffffu, !st.final)) finalize(st);
    const float* inv = st.inv;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float sum = st.total[r];
        const int row = row0 + 8 * r;
        if (p.lse != nullptr && lane % 4 == 0 && row >= 0 && row < p.seq_q) {
            p.lse[((long long)tile.b * p.heads_q + tile.h) * p.seq_q + row] =
                sum > 0.f ? (st.max[r] + log2f(sum)) * 0.69314718055994531f : NEG_INF;
        }
    }
    // BOTTOM: a warpgroup whose rows start before row 0 stores them one by one, since a TMA
    // store at a negative row is an illegal instruction on the H100 (loads there zero-fill).
    // The test goes through a warp reduction, as trimmed_end's does, to stay uniform.
    if (!O_STAGED || (BOTTOM && __reduce_min_sync(0xffffffffu, tile.m0 + 64 * wg) < 0)) {
        elem_t* out = p.o + tile.b * p.o_sb + tile.h * p.o_sh;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 8 * r;
            if (row < 0 || row >= p.seq_q) continue;
#pragma unroll
            for (int c = 0; c < D / 8; ++c) {
                const int col = 8 * c + 2 * (lane % 4);
                *reinterpret_cast<elem2_t*>(out + row * p.o_ss + col) =
                    pack2(o[4 * c + 2 * r] * inv[r], o[4 * c + 2 * r + 1] * inv[r]);
            }
        }
        return;
    }
    // This warpgroup's rows of each 64-column block: of the O tile, whose last store must have
    // read them; or, with O_IN_Q, of this piece's Q tile, which the warpgroup is done with
    // (its last S has completed) and which the store must read before the slot is freed
    // (Ctx::free_prev_q).
    elem_t* mine = (O_IN_Q ? q_tile : s.o) + wg * 64 * 64;
    sum_set(wg, SUM_STORE_SUMMED, stamp());
    if (STORER) {
        sm90::mbar_wait(s.o_empty + wg, (stores++ & 1) ^ 1);  // the last store has read the tile
        sum_set(wg, SUM_STORE_WAITED, stamp());
    } else {
        if (!O_IN_Q && t == 0) sm90::bulk_wait_read();
        sum_set(wg, SUM_STORE_WAITED, stamp());
        sm90::named_sync(1 + wg, 128);
    }
    sum_set(wg, SUM_STORE_SYNCED, stamp());
    const int r0 = (t / 32) * 16 + lane / 4;  // this thread's first row of the warpgroup's 64
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r0 + 8 * r;
#pragma unroll
        for (int c = 0; c < D / 8; ++c) {
            const unsigned at = sm90::smem_u32(mine) + (c / 8) * BM * 128 + row * 128 + (((c % 8) ^ (row & 7)) * 16)
                                + (lane % 4) * 4;
            const elem2_t v = pack2(o[4 * c + 2 * r] * inv[r], o[4 * c + 2 * r + 1] * inv[r]);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(as_u32(v)));
        }
    }
    sum_set(wg, SUM_STORE_WRITTEN, stamp());
    sm90::fence_proxy_async();  // the stores, before the bulk copy (async proxy) reads them
    if (STORER) {
        if (t == 0) {
            volatile int* at = s.o_at + 4 * wg;
            at[0] = tile.m0 + 64 * wg;
            at[1] = tile.h;
            at[2] = tile.b;
        }
        sm90::mbar_arrive(s.o_full + wg);  // releases this thread's writes to the storer
        sum_set(wg, SUM_STORE_FENCED, stamp());
        // Reconverges the warp after thread 0's writes: without it ptxas takes the next piece's
        // key-tile loop for divergent code and builds every wgmma descriptor in vector
        // registers (28 R2UR in the D=64 loop against 8).
        __syncwarp();
        return;
    }
    sm90::named_sync(1 + wg, 128);
    sum_set(wg, SUM_STORE_FENCED, stamp());
    if (t == 0) {
#pragma unroll
        for (int c = 0; c < D_BLOCKS; ++c)
            sm90::tma_store_4d(&p.o_map, mine + c * BM * 64, 64 * c, tile.m0 + 64 * wg, tile.h, tile.b);
        sm90::bulk_commit();
    }
}

// STORER: consumer warpgroup wg's O stores, by one thread of the producer warpgroup, until the
// warpgroup says it is done (head -1); then waits until the last has left shared memory.
__device__ void store_for(const Params& p, const Smem& s, int wg) {
    for (int k = 0;; ++k) {
        sm90::mbar_wait(s.o_full + wg, k & 1);
        const volatile int* at = s.o_at + 4 * wg;
        const int row = at[0], h = at[1], b = at[2];
        if (h < 0) break;
        elem_t* mine = s.o + wg * 64 * 64;
#pragma unroll
        for (int c = 0; c < D_BLOCKS; ++c) sm90::tma_store_4d(&p.o_map, mine + c * BM * 64, 64 * c, row, h, b);
        sm90::bulk_commit();
        sm90::bulk_wait_read();
        sm90::mbar_arrive(s.o_empty + wg);
    }
    sm90::bulk_wait();
}

// STORER: tells warpgroup wg's storer that no O is left to store.
__device__ __forceinline__ void end_stores(const Smem& s, int wg, int& stores) {
    if (!STORER) return;
    sm90::mbar_wait(s.o_empty + wg, (stores++ & 1) ^ 1);
    if (threadIdx.x % 128 == 0) s.o_at[4 * wg + 1] = -1;
    sm90::mbar_arrive(s.o_full + wg);
}

// Scores are scaled inside the exponent, exp2(s * sl2 - max), one FFMA each; that needs sl2 > 0
// (a masked score is -inf, and -inf * 0 is NaN), so a negative scale is applied by negating this
// warpgroup's rows of Q in shared memory instead, and a zero scale runs as 1e-30: every score
// times it then rounds to nothing next to the max, and exp2 gives 1, as it would for 0.
__device__ __forceinline__ void negate_q_rows(elem_t* q, int wg) {
    const int t = threadIdx.x % 128;
#pragma unroll
    for (int c = 0; c < D_BLOCKS; ++c)
#pragma unroll
        for (int i = t; i < 64 * 8; i += 128) {  // 64 rows of 8 16-byte chunks
            uint4* x = reinterpret_cast<uint4*>(q + c * BM * 64 + (wg * 64) * 64) + i;
            uint4 y = *x;
            y.x ^= 0x80008000u, y.y ^= 0x80008000u, y.z ^= 0x80008000u, y.w ^= 0x80008000u;
            *x = y;
        }
    sm90::fence_proxy_async();  // the generic writes, before wgmma (async proxy) reads them
    sm90::named_sync(1 + wg, 128);
}

// ---- The cp.async form (ATTN_TMA=0): 16-byte copies into the same swizzled layout.

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    // src-size 0 zero-fills: rows past the sequence end read as zeros.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// Rows r0 .. r0 + ROWS of a [seq][D] matrix into a [D / 64][ROWS][64] 128-byte-swizzled tile;
// rows at or past `limit` become zeros.
template <int ROWS>
__device__ __forceinline__ void cp_tile(elem_t* tile, const elem_t* g, long long stride, int r0, int limit) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    static_assert(ROWS * CPR % 128 == 0, "whole passes of the warpgroup");
#pragma unroll
    for (int it = 0; it < ROWS * CPR / 128; ++it) {
        const int i = threadIdx.x + 128 * it;
        const int r = i / CPR, c = i % CPR;
        const unsigned dst = sm90::smem_u32(tile) + (c / 8) * ROWS * 128 + r * 128 + (((c % 8) ^ (r & 7)) * 16);
        const bool valid = r0 + r < limit;
        cp_async16(dst, valid ? g + (long long)(r0 + r) * stride + c * 8 : g, valid);
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

// ---- One consumer warpgroup's tiles.

// What a consumer warpgroup's thread knows while it computes one tile.
struct Ctx {
    const Params& p;
    const Smem& s;
    int wg, lane;
    float sl2;         // |scale| * log2(e), at least 1e-30 (see negate_q_rows)
    int shift;         // seq_k - seq_q: row i sees keys j <= i + shift
    int row0;          // this thread's first row (the other is row0 + 8)
    int warp_row0;     // this warp's first row: a key tile past its diagonal needs the mask
    unsigned q_smem;   // this warpgroup's 64 rows of Q
    int j0, j1;        // this piece's key tiles of the query tile: [j0, j1)
    int g, b;          // K/V head and batch (cp.async form)
    int j_end;         // this warpgroup's key tiles end here (TRIM: its rows see none past it), <= j1
    int q_prev;        // the Q slot of the last piece, to free (O_IN_Q), or -1

    __device__ unsigned k_smem(int stage) const { return sm90::smem_u32(s.k) + stage * KV_BYTES; }
    __device__ unsigned v_smem(int stage) const { return sm90::smem_u32(s.v) + stage * KV_BYTES; }
    // Producer and consumers count K/V tiles the same way: tile `it` sits in stage it % STAGES,
    // whose barriers are in their (it / STAGES)-th phase.
    __device__ static int stage(int it) { return it % STAGES; }
    __device__ static unsigned phase(int it) { return (it / STAGES) & 1; }
    // One arrival per warp on a K or V stage's "empty" barrier: this warp is done reading the
    // stage (its wgmma, which reads shared memory asynchronously, has completed).
    // The whole warp calls it: every lane is past its wait before lane 0 arrives.
    __device__ void release(unsigned long long* bar) const {
        if (!TMA) return;
        __syncwarp();
        if (lane == 0) sm90::mbar_arrive(bar);
    }
    // One arrival per thread on Q's "empty" barrier: this thread is done with Q and with the
    // piece slot it read, and its own arrival (a release) orders that read before the producer's
    // next write of the slot (racecheck found the per-warp arrival's ordering through
    // __syncwarp wanting). Once per piece, at the piece's last S (so that a Q loads under the
    // last P V); with O_IN_Q, see free_prev_q().
    __device__ void release_q() const {
        if (TMA && !O_IN_Q) sm90::mbar_arrive(s.q_empty);  // the one slot
    }
    // O_IN_Q: frees the last piece's Q slot, where its O was staged, under this piece's first S.
    // Thread 0 issued that O's TMA store and waits until the store has read the slot (done long
    // before now; waiting for it at the end of the last piece instead cost D=64 2-3.5%, 24ae121),
    // then the warpgroup's threads arrive, as release_q's do.
    __device__ void free_prev_q() const {
        if (!O_IN_Q || q_prev < 0) return;
        if (threadIdx.x % 128 == 0) sm90::bulk_wait_read();
        sm90::named_sync(1 + wg, 128);
        sm90::mbar_arrive(s.q_empty + q_prev);
    }
};

// ---- A tile split across pieces (the tail without a mask; see Piece).

// The float4s of the slot where tail unit g leaves its piece of the tail tile whose first key
// tile is x0, for consumer warpgroup wg, seen from thread `thread`: slot 2g holds a unit's first
// piece, 2g + 1 its last (the pieces between are whole tiles). Thread-major in float4s, so a
// warpgroup's stores and loads of each float4 are 2 KB in a row.
__device__ __forceinline__ float4* partial_slot(const Params& p, int g, int x0, int wg, int thread) {
    const int slot = 2 * g + (unit_start(p, g) >= x0 ? 0 : 1);
    return reinterpret_cast<float4*>(p.partials) + (size_t)(slot * CONSUMERS + wg) * (NO / 4 + 1) * 128 + thread;
}

// A partial piece leaves this warpgroup's O (not yet divided by the sums), row maxima and
// partial sums in its slot, then counts itself in at its tile's counter (one per warpgroup);
// the piece that arrives last takes the others' results into its own and returns true: it
// stores the tile. Each piece's O is relative to its own maxima; rescaled to the larger,
//   O = O_a 2^(m_a - m) + O_b 2^(m_b - m),  sum = sum_a 2^(m_a - m) + sum_b 2^(m_b - m).
// The writes are released to the last piece by __threadfence, the counter and __threadfence
// again, and read past L1 (ld.global.cg): another SM wrote them.
__device__ bool merge_partials(const Ctx& c, const Piece& pc, float (&o)[NO], RowState& st) {
    const Params& p = c.p;
    const int thread = threadIdx.x % 128;
    const int nk = key_tiles(p), x0 = (pc.t - p.whole) * nk;
    const int first = unit_of(p, x0), last = unit_of(p, x0 + nk - 1);
    float4* mine = partial_slot(p, pc.unit, x0, c.wg, thread);
#pragma unroll
    for (int i = 0; i < NO / 4; ++i) __stcg(mine + i * 128, make_float4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]));
    __stcg(mine + NO / 4 * 128, make_float4(st.max[0], st.max[1], st.sum[0], st.sum[1]));
    __threadfence();
    sm90::named_sync(1 + c.wg, 128);
    volatile int* arrived_last = c.s.merge + c.wg;
    if (thread == 0) {
        unsigned* count = p.schedule + 2 + (pc.t - p.whole) * CONSUMERS + c.wg;
        const bool is_last = atomicAdd(count, 1u) == (unsigned)(last - first);
        if (is_last) atomicExch(count, 0u);  // every piece is in: zero for the next launch
        *arrived_last = is_last;
    }
    sm90::named_sync(1 + c.wg, 128);
    // Read through a vote, which ptxas knows is the same in every lane: a branch it took for
    // divergent would make it build the next piece's wgmma descriptors in vector registers.
    if (!__any_sync(0xffffffff, *arrived_last)) return false;
    __threadfence();
    for (int g = first; g <= last; ++g) {
        if (g == pc.unit) continue;
        const float4* theirs = partial_slot(p, g, x0, c.wg, thread);
        const float4 state = __ldcg(theirs + NO / 4 * 128);
        const float max[2] = {state.x, state.y}, sum[2] = {state.z, state.w};
        float mine_by[2], theirs_by[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float m = fmaxf(st.max[r], max[r]);
            const float base = m == NEG_INF ? 0.f : m;  // no visible key in either: both 0
            mine_by[r] = exp2_fast(st.max[r] - base);
            theirs_by[r] = exp2_fast(max[r] - base);
            st.sum[r] = st.sum[r] * mine_by[r] + sum[r] * theirs_by[r];
            st.max[r] = m;
        }
        st.final = false;
#pragma unroll
        for (int i = 0; i < NO / 4; ++i) {
            const float4 x = __ldcg(theirs + i * 128);
            o[4 * i] = o[4 * i] * mine_by[0] + x.x * theirs_by[0];
            o[4 * i + 1] = o[4 * i + 1] * mine_by[0] + x.y * theirs_by[0];
            o[4 * i + 2] = o[4 * i + 2] * mine_by[1] + x.z * theirs_by[1];
            o[4 * i + 3] = o[4 * i + 3] * mine_by[1] + x.w * theirs_by[1];
        }
    }
    return true;
}

// Masks, then exponentiates tile j's scores in place; returns whether O must be rescaled.
__device__ __forceinline__ bool softmax_step(const Ctx& c, float (&sc)[NS], RowState& st, int j, float (&alpha)[2]) {
    const int n0 = j * BN;
    if (n0 + BN > c.p.seq_k || (CAUSAL && n0 + BN - 1 > c.warp_row0 + c.shift)) mask(sc, c.row0, n0, c.p.seq_k, c.shift);
    const bool moved = update_max(sc, st, c.sl2, alpha);
    exponentiate(sc, st, c.sl2);
    return moved;
}

// Key tile j's softmax against the running max as it stands, without finding the tile's own max
// first: at D=64 that search (60 FMNMX and two shuffles a tile) is what the consumers wait on most,
// and the kernel without it ran 4-12% faster (bench/results/2026-11-26-h100-hopper-speculate-*).
// The running max moves only when a row outgrows it by RESCALE_SLACK anyway; as long as no row
// did, every p is below 2^RESCALE_SLACK and so is each thread's part of a row's sum. Where a part
// is above that (or is not a number), or a row has seen no key yet, the warpgroup issues S_j again
// (K and Q are still in place: see next_tile) and takes the usual way, max first. Returns whether
// O must be rescaled, as softmax_step does.
__device__ __forceinline__ bool softmax_speculative(const Ctx& c, float (&o)[NO], unsigned (&pa)[BN / 16][4],
                                                    float (&sc)[NS], RowState& st, int j, unsigned k_smem,
                                                    float (&alpha)[2]) {
    const int n0 = j * BN;
    const bool masked = n0 + BN > c.p.seq_k || (CAUSAL && n0 + BN - 1 > c.warp_row0 + c.shift);
    if (masked) mask(sc, c.row0, n0, c.p.seq_k, c.shift);
    const bool fresh = st.max[0] == NEG_INF || st.max[1] == NEG_INF;  // a row that has seen no key
    float sums[2] = {0.f, 0.f};
    if (!fresh) exponentiate_rows(sc, st, c.sl2, sums);
    const bool outgrown = fresh || !(sums[0] <= RESCALE_LIMIT) || !(sums[1] <= RESCALE_LIMIT);
    if (!warpgroup_any(c.wg, outgrown)) {
        st.sum[0] += sums[0];
        st.sum[1] += sums[1];
        alpha[0] = alpha[1] = 1.f;
        return false;
    }
    begin_batch(o, pa);
    issue_qk(sc, c.q_smem, k_smem);
    sm90::wgmma_wait<0>();  // S_j again, and the P V before it
    sm90::fence_regs(sc);
    sm90::fence_regs(o);
    return softmax_step(c, sc, st, j, alpha);
}

// The piece's key tiles one after the other: S, softmax, P V, each waiting for the last (the
// cp.async and TMA forms). `it` counts K/V tiles across this CTA's pieces.
__device__ void mainloop_sequential(const Ctx& c, float (&o)[NO], RowState& st, int& it) {
    unsigned pa[BN / 16][4];
    for (int j = c.j0; j < c.j1; ++j, ++it) {
        const int stg = Ctx::stage(it);
        if (!TMA && j + 1 < c.j1) {
            // Tile j + 1 into the other stage, under this tile's arithmetic.
            const int next = Ctx::stage(it + 1);
            cp_tile<BN>(c.s.k + next * (KV_BYTES / 2), c.p.k + c.b * c.p.k_sb + c.g * c.p.k_sh, c.p.k_ss, (j + 1) * BN, c.p.seq_k);
            cp_tile<BN>(c.s.v + next * (KV_BYTES / 2), c.p.v + c.b * c.p.v_sb + c.g * c.p.v_sh, c.p.v_ss, (j + 1) * BN, c.p.seq_k);
        }
        float sc[NS];
        if (TMA) sm90::mbar_wait(c.s.k_full + stg, Ctx::phase(it));
        begin_batch(o, pa);
        issue_qk(sc, c.q_smem, c.k_smem(stg));
        sm90::wgmma_wait<0>();
        sm90::fence_regs(sc);
        c.release(c.s.k_empty + stg);
        if (j + 1 == c.j1) c.release_q();  // the piece's last use of Q
        float alpha[2];
        if (softmax_step(c, sc, st, j, alpha)) rescale(o, alpha);
        to_fragments(sc, pa);
        if (TMA) sm90::mbar_wait(c.s.v_full + stg, Ctx::phase(it));
        begin_batch(o, pa);
        issue_pv(o, pa, c.v_smem(stg));
        sm90::wgmma_wait<0>();
        sm90::fence_regs(o);
        c.release(c.s.v_empty + stg);
        if (!TMA) {
            asm volatile("cp.async.wait_group 0;\n" ::);
            sm90::fence_proxy_async();
            __syncthreads();  // tile j + 1 landed for all; every thread is done with stage j
        }
    }
}

// The piece's first S, alone in its turn, and its softmax (O is still 0: nothing to rescale);
// P goes to `pa`. `it` is the piece's first K/V tile.
__device__ __forceinline__ void first_tile(const Ctx& c, float (&o)[NO], unsigned (&pa)[BN / 16][4],
                                           float (&sc)[NS], RowState& st, int it) {
    float alpha[2];
    TIMED(c.wg, SUM_K, sm90::mbar_wait(c.s.k_full + Ctx::stage(it), Ctx::phase(it)));
    TIMED(c.wg, SUM_TURN, await_turn(c.wg));
    begin_batch(o, pa);
    issue_qk(sc, c.q_smem, c.k_smem(Ctx::stage(it)));
    pass_turn(c.wg);
    sum_set(c.wg, SUM_FIRST_ISSUED, stamp());
    c.free_prev_q();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(sc);
    sum_set(c.wg, SUM_FIRST_S, stamp());
    c.release(c.s.k_empty + Ctx::stage(it));
    if (c.j_end - c.j0 == 1) c.release_q();
    softmax_step(c, sc, st, c.j0, alpha);
    to_fragments(sc, pa);
}

// Key tile j: S_j issued with P_{j-1} V_{j-1} (tile `it`), S_j's softmax under that P V, then
// O rescaled where the max moved and P_j packed; `it` moves on to tile j. SPECULATE: the softmax
// against the running max (softmax_speculative), which may issue S_j again: not for the piece's
// last tile, whose S frees Q for the next piece. K's stage is freed before it all the same: the
// producer loads the stage's next K only after the V before that, into the stage that P_{j-1} V_{j-1}
// frees once done, after this softmax (kernels/sm90_protocol.py checks the re-read).
template <bool SPECULATE>
__device__ __forceinline__ void next_tile(const Ctx& c, float (&o)[NO], unsigned (&pa)[BN / 16][4], float (&sc)[NS],
                                          RowState& st, int& it, int j) {
    float alpha[2];
    const int prev = it++;
    TIMED(c.wg, SUM_K, sm90::mbar_wait(c.s.k_full + Ctx::stage(it), Ctx::phase(it)));
    TIMED(c.wg, SUM_TURN, await_turn(c.wg));
    begin_batch(o, pa);
    issue_qk(sc, c.q_smem, c.k_smem(Ctx::stage(it)));
    TIMED(c.wg, SUM_V, sm90::mbar_wait(c.s.v_full + Ctx::stage(prev), Ctx::phase(prev)));
    begin_batch(o, pa);
    issue_pv(o, pa, c.v_smem(Ctx::stage(prev)));
    pass_turn(c.wg);
    sm90::wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
    sm90::fence_regs(sc);
    c.release(c.s.k_empty + Ctx::stage(it));
    if (j + 1 == c.j_end) c.release_q();
    const bool moved = SPECULATE ? softmax_speculative(c, o, pa, sc, st, j, c.k_smem(Ctx::stage(it)), alpha)
                                 : softmax_step(c, sc, st, j, alpha);
    sm90::wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: O and P's registers are free
    sm90::fence_regs(o);
    c.release(c.s.v_empty + Ctx::stage(prev));
    if (moved) rescale(o, alpha);
    to_fragments(sc, pa);
}

// The piece's last P V, alone in its turn; `it` moves past it.
__device__ __forceinline__ void last_pv(const Ctx& c, float (&o)[NO], unsigned (&pa)[BN / 16][4], RowState& st,
                                       int& it) {
    TIMED(c.wg, SUM_V, sm90::mbar_wait(c.s.v_full + Ctx::stage(it), Ctx::phase(it)));
    TIMED(c.wg, SUM_TURN, await_turn(c.wg));
    begin_batch(o, pa);
    issue_pv(o, pa, c.v_smem(Ctx::stage(it)));
    pass_turn(c.wg);
    finalize(st);  // while the P V runs
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
    c.release(c.s.v_empty + Ctx::stage(it));
    ++it;
}

// This warpgroup's key tiles of the piece, [j0, j_end), software-pipelined inside the
// warpgroup (the overlap and later forms): S_j is issued together with P_{j-1} V_{j-1}, and
// S_j's softmax runs while that P V is still on the tensor cores; only then is O rescaled and
// P_j packed. The first S and the last P V
// stand outside the loop, so that every path through it waits for the same groups (ptxas
// serializes all wgmma of a kernel where it cannot tell a group is complete).
__device__ void mainloop_computed(const Ctx& c, float (&o)[NO], RowState& st, int& it) {
    unsigned pa[BN / 16][4];
    float sc[NS];
    first_tile(c, o, pa, sc, st, it);
    // The piece's last tile frees Q (release_q) with its S, so only the tiles before it speculate.
    int j = c.j0 + 1;
    for (; j + 1 < c.j_end; ++j) next_tile<SPECULATE>(c, o, pa, sc, st, it, j);
    if (j < c.j_end) next_tile<false>(c, o, pa, sc, st, it, j);
    last_pv(c, o, pa, st, it);
}

// The piece for one consumer warpgroup: its key tiles computed (above), then, with TRIM, the
// ones it does not see passed over.
__device__ void mainloop_overlapped(const Ctx& c, float (&o)[NO], RowState& st, int& it) {
    if (!TRIM) return mainloop_computed(c, o, st, it);  // j_end is j1
    if (c.j_end > c.j0) {
        mainloop_computed(c, o, st, it);
    } else {
        c.release_q();  // its rows see no key of this piece: O stays 0
        c.free_prev_q();
        await_turn(c.wg);  // the turn its last P V would have taken
        pass_turn(c.wg);
    }
    // TRIM: the key tiles past this warpgroup's diagonal, which the other warpgroups compute.
    // It takes the turn each would have taken, and frees each stage once the stage holds that
    // tile (an arrival before that would count towards the stage's previous use).
    for (int j = max(c.j_end, c.j0); j < c.j1; ++j, ++it) {
        await_turn(c.wg);
        pass_turn(c.wg);
        sm90::mbar_wait(c.s.k_full + Ctx::stage(it), Ctx::phase(it));
        c.release(c.s.k_empty + Ctx::stage(it));
        sm90::mbar_wait(c.s.v_full + Ctx::stage(it), Ctx::phase(it));
        c.release(c.s.v_empty + Ctx::stage(it));
    }
}

// TRIM: the end of warpgroup wg's key tiles in piece pc, the same in every lane. Through a
// warp reduction, whose result ptxas keeps in a uniform register: computed from wg (that is,
// from threadIdx) it would take the key-tile loop for divergent code and build every wgmma
// descriptor in vector registers (28 R2UR in the D=64 loop against 8).
__device__ __forceinline__ int trimmed_end(const Params& p, const Tile& tile, const Piece& pc, int wg) {
    return __reduce_min_sync(0xffffffffu, min(pc.j1, visible_key_tiles(p, tile.m0 + 64 * (wg + 1))));
}

// Piece n of this CTA and its tile: its Q has landed in slot n % Q_SLOTS, and the slot names
// them (the TMA forms; the cp.async form deals the tiles out by blockIdx).
__device__ __forceinline__ Piece take_piece(const Params& p, const Smem& s, int n, Tile& tile) {
    if (!TMA) {
        const Piece pc = first_piece(p, blockIdx.x + n * gridDim.x);
        tile = tile_or_none(p, pc);
        return pc;
    }
    const int q = n % Q_SLOTS;
    sm90::mbar_wait(s.q_full + q, (n / Q_SLOTS) & 1);
    const volatile int* slot = s.piece + SLOT_INTS * q;
    tile = Tile{slot[4], slot[5], slot[6], slot[7]};
    return Piece{slot[0], slot[1], slot[2], slot[3]};
}

__device__ __forceinline__ elem_t* q_tile_of(const Smem& s, int n) { return s.q + (n % Q_SLOTS) * (Q_BYTES / 2); }

// What consumer warpgroup wg's thread knows of piece n (pc, of tile `tile`).
__device__ __forceinline__ Ctx context(const Params& p, const Smem& s, int wg, const Piece& pc, const Tile& tile, int n) {
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    return Ctx{p,
               s,
               wg,
               lane,
               fmaxf(fabsf(p.scale_log2), 1e-30f),
               p.seq_k - p.seq_q,
               tile.m0 + 64 * wg + 16 * warp + lane / 4,
               tile.m0 + 64 * wg + 16 * warp,
               sm90::smem_u32(q_tile_of(s, n)) + wg * 64 * 128,
               pc.j0,
               pc.j1,
               tile.h / (p.heads_q / p.heads_kv),
               tile.b,
               TRIM ? trimmed_end(p, tile, pc, wg) : pc.j1,
               n > 0 ? (n - 1) % Q_SLOTS : -1};
}

// The trace's per-piece sums, zeroed as a piece starts.
__device__ __forceinline__ void trace_new_piece(int wg) {
    for (int k = SUM_K; k <= SUM_STORE_WAITED; ++k) sum_set(wg, k, 0);
}

// The trace's row of consumer warpgroup wg for piece n, once its O is out.
__device__ __forceinline__ void trace_piece(const Params& p, int n, int wg, long long started, long long q_ready,
                                            long long loop_end) {
    trace_put(p, n, wg, C_START, started);
    trace_put(p, n, wg, C_Q_READY, q_ready);
    trace_put(p, n, wg, C_LOOP_END, loop_end);
    trace_put(p, n, wg, C_STORED, stamp());
    trace_put(p, n, wg, C_FIRST_S, sum_get(wg, SUM_FIRST_S));
    trace_put(p, n, wg, C_K_WAIT, sum_get(wg, SUM_K));
    trace_put(p, n, wg, C_V_WAIT, sum_get(wg, SUM_V));
    trace_put(p, n, wg, C_TURN_WAIT, sum_get(wg, SUM_TURN));
    trace_put(p, n, wg, C_FIRST_ISSUED, sum_get(wg, SUM_FIRST_ISSUED));
    trace_put(p, n, wg, C_STORE_SYNCED, sum_get(wg, SUM_STORE_SYNCED));
    trace_put(p, n, wg, C_STORE_WRITTEN, sum_get(wg, SUM_STORE_WRITTEN));
    trace_put(p, n, wg, C_STORE_FENCED, sum_get(wg, SUM_STORE_FENCED));
    trace_put(p, n, wg, C_STORE_SUMMED, sum_get(wg, SUM_STORE_SUMMED));
    trace_put(p, n, wg, C_STORE_WAITED, sum_get(wg, SUM_STORE_WAITED));
}

// Piece pc's O (this warpgroup's rows) out: stored, or, for a part of a split tile, merged with
// the others' parts by whichever arrives last, which stores the tile.
__device__ __forceinline__ void finish_piece(const Ctx& c, const Piece& pc, const Tile& tile, elem_t* q_tile,
                                             float (&o)[NO], RowState& st, int& stores) {
    const bool partial = SPLIT_TAIL && (pc.j0 > 0 || pc.j1 < tile.n_kv);
    if (!partial || merge_partials(c, pc, o, st)) store_output(c.p, c.s, q_tile, tile, c.wg, c.row0, o, st, stores);
}

// A consumer warpgroup's end: its last store has left the CTA, the turns are all taken.
__device__ __forceinline__ void consumed(const Params& p, const Smem& s, int wg, int& stores) {
    end_stores(s, wg, stores);
    if (O_STAGED && !STORER && threadIdx.x % 128 == 0) sm90::bulk_wait();  // the last store has left the CTA
    if (PINGPONG && wg == 0) await_turn(wg);  // takes the last warpgroup's last arrival
    if (wg == 0) {
        trace_put(p, TRACE_PIECES, 0, CTA_END, stamp());
        trace_put(p, TRACE_PIECES, 0, CTA_GLOBAL_END, TRACE ? global_ns() : 0);
    }
}

__device__ void consume(const Params& p, const Smem& s, int wg) {
    if (PINGPONG && wg == CONSUMERS - 1) pass_turn(wg);  // warpgroup 0 issues first
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

        if (!TMA) {
            // Q, and the piece's first K/V tile into the stage the count says.
            const int stg = Ctx::stage(it);
            cp_tile<64>(s.q, p.q + tile.b * p.q_sb + tile.h * p.q_sh, p.q_ss, tile.m0, p.seq_q);
            if (pc.j1 > pc.j0) {
                const int n0 = pc.j0 * BN;
                cp_tile<BN>(s.k + stg * (KV_BYTES / 2), p.k + c.b * p.k_sb + c.g * p.k_sh, p.k_ss, n0, p.seq_k);
                cp_tile<BN>(s.v + stg * (KV_BYTES / 2), p.v + c.b * p.v_sb + c.g * p.v_sh, p.v_ss, n0, p.seq_k);
            }
            asm volatile("cp.async.wait_group 0;\n" ::);
            sm90::fence_proxy_async();
            __syncthreads();
        }
        if (p.scale_log2 < 0.f) negate_q_rows(q_tile, wg);

        if (pc.j1 == pc.j0) {
            c.release_q();
            c.free_prev_q();
        } else if (OVERLAP) {
            mainloop_overlapped(c, o, st, it);
        } else {
            mainloop_sequential(c, o, st, it);
        }
        const long long loop_end = stamp();
        finish_piece(c, pc, tile, q_tile, o, st, stores);
        trace_piece(p, n, wg, started, q_ready, loop_end);
        if (!TMA) __syncthreads();  // Q and the stages are reloaded for the next tile
    }
    consumed(p, s, wg, stores);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) attn_fwd_sm90(const __grid_constant__ Params p) {
    extern __shared__ unsigned char smem_raw[];
    const Smem s = carve(smem_raw);
    const int wg = threadIdx.x / 128;
    if (!TMA) {
        consume(p, s, 0);
        return;
    }
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
