// The Hopper family's backward main pass (sm_90a): warp-specialized, TMA loads and wgmma. The
// pre-pass (D = rowsum(dO ∘ O), the dQ accumulator zeroed) and dQ's conversion are flash_bwd.cu's
// attn_bwd_pre and attn_bwd_dq, on the same parameter block and workspace.
//
// A CTA per (block of BN keys, kv head, sequence), three warpgroups:
//   warpgroup 2, the producer: one thread loads K and V once by TMA, then for every step (a query
//     head of the GQA group and a block of BM query rows that sees the keys) Q and dO by TMA into
//     a ring of STAGES (two by default), the warp's lanes the step's LSE (in log2 units) and D beside them;
//     warps 1 and 2 are the dQ writers, one per MMA warpgroup: each adds its warpgroup's part of
//     the step's dQ, handed over in shared memory, to the f32 accumulator by bulk reduce-adds
//     (TMA, a row of 256 bytes each; in the deterministic mode after waiting for its turn; with
//     joined parts at D = 128 each writer adds half the rows of both parts, 512 bytes a row), so
//     the MMA warps never wait on global memory;
//   warpgroups 0 and 1, the MMA warpgroups: at D = 64 and 128 (BN = 128) warpgroup w owns keys
//     64w .. 64w + 63 of the block, their dK and dV in its registers over every step; at D = 256
//     (BN = 64) both take the block's 64 keys and warpgroup w owns columns 128w .. 128w + 127 of
//     their dK, dV and dQ (dK and dV of 64 keys by 256 columns would take 256 registers a
//     thread), both computing the block's S^T and dP^T (see SPLIT_COLUMNS); per step
//       S^T  = K Q^T,  dP^T = V dO^T            wgmma, shared x shared (the keys are wgmma's M,
//                                               so the query block can be 64 rows)
//       P^T  = exp2(S^T scale log2(e) - lse),   dS^T = P^T (dP^T - D) (1 - tanh^2)
//                                               (the exponentials while dP^T's product runs)
//       dS^T to shared memory (two buffers, one barrier of both warpgroups a step)
//       dQ   = dS K, this warpgroup's 64 x 64 part (at D = 128 its 64 columns, at D = 64 its 64
//              of the 128 rows; at D = 256 two parts, its 128 columns), then
//       dV  += P^T dO, dK += dS^T Q             wgmma, P^T and dS^T as register A operands (P
//                                               never goes to shared memory), running while
//                                               dQ's part goes to shared memory for its writer.
// At D = 256 the MMA warpgroups add their dQ parts to the accumulator themselves, by 8-byte
// reductions (two stages of Q and dO leave no shared memory for the writers' parts); the writer
// warps idle.
// With p.deterministic the additions to one query block's dQ are ordered by its counter, as in
// flash_bwd.cu (the last key block first; the grid starts there; with copies of the accumulator,
// flash_bwd_common.cuh's dq_turn_of, one counter a copy), or in a rotated walk by step (Work); a
// counter counts writers' additions, two a key block (one per writer), and a writer adds once both
// of the key block before it are in.
//
// Every feature but a paged cache is a run-time parameter (flash_bwd_common.cuh); rows past a
// sequence come in by TMA (zeros past the tensor, the next sequence's rows where packed) and are
// masked. Specialised at compile time (NVRTC -D): ATTN_BF16, ATTN_D (64, 128 or 256),
// ATTN_PRODUCER_REGS and ATTN_CONSUMER_REGS (setmaxnreg), and the form (backward::Form, the knob
// ATTN_CUDA_SM90_BWD): ATTN_DQ_RED (the MMA warps add their dQ parts by reductions at D = 64 and
// 128 too, the writers idle), ATTN_DQ_PLANES (the writers add a part in one bulk reduce-add, the
// accumulator in planes: see DQ_PLANES), ATTN_DQ_JOINED (D = 128: a writer adds whole rows of
// both parts, see DQ_JOINED), ATTN_DQ_BUFFERS (1, or 2 for D = 128's planes: see DQ_BUFS),
// ATTN_STAGES (2 or 3 stages of Q and dO), ATTN_DV_ISSUE
// (see DV_ISSUE) and ATTN_TRACE (the traced build: see Trace). The host's variant
// (crates/attn-cuda/src/backward/variant.rs) mirrors the shared-memory size computed here.

#include "mma_sm80.cuh"          // elem_t, pack2, as_u32, exp2_fast
#include "flash_bwd_common.cuh"  // Params, sequences, the mask and the gradient of one score
#include "sm90.cuh"              // mbarriers, TMA, wgmma fences and descriptors, setmaxnreg
#include "sm90_wgmma.cuh"        // generated: wgmma_qk (S^T, dP^T), wgmma_pv (dV, dK), wgmma_dq

constexpr int D = ATTN_D;
static_assert(D == 64 || D == 128 || D == 256, "head dims 64, 128 and 256 (smaller ones run padded)");
// D = 256: the MMA warpgroups share the block's keys and split the columns of dK, dV and dQ. Each
// computes the whole of S^T and dP^T (1.4 times the tensor work of the five products), which keeps
// P^T and dS^T in registers as the A operands of dV and dK, as at the smaller head dims.
constexpr bool SPLIT_COLUMNS = D == 256;
constexpr int BN = SPLIT_COLUMNS ? 64 : 128;  // keys per CTA: 64 per MMA warpgroup, or 64 shared
constexpr int BM = D == 64 ? 128 : 64;        // query rows per step (D >= 128: registers allow 64)
constexpr int DC = SPLIT_COLUMNS ? D / 2 : D;  // columns of dK, dV (and dQ at D = 256) a warpgroup owns
// Whether the MMA warpgroups add their dQ parts to the accumulator themselves (8-byte reductions)
// rather than hand them to the writer warps through shared memory: always at D = 256, where no
// shared memory is left for the parts; ATTN_DQ_RED elsewhere.
constexpr bool DQ_BY_RED = SPLIT_COLUMNS || ATTN_DQ_RED;
// Whether the walks may be rotated (Work): not at D = 256, whose MMA warps would spill for it.
constexpr bool ROTATES = !SPLIT_COLUMNS;
// Whether a tile that the causal diagonal or a window's edge crosses inside the sequence (no
// soft-cap, no ALiBi) takes the plain path, the range test a selection, rather than grad_of's
// per-element path (a step there cost 2.6x a plain one at D = 64, 1.9x at D = 128): at D = 64,
// where it measured 1-14.5% faster under a causal mask (H200, docs/experiments.md). The D = 128
// build with it lost 3-5% on the rows without a mask, all of whose tiles are plain (its schedule,
// not the path), and D = 256 was not timed; both keep the code they were timed with.
constexpr bool BOUNDED_EDGES = D == 64;
// Whether a writer adds its warpgroup's part in one bulk reduce-add of 16 KiB into the
// accumulator's 64-column planes (ATTN_DQ_PLANES, flash_bwd_common.cuh's dq_at) rather than in 64
// of 256 bytes, one a row, into its rows.
constexpr bool DQ_PLANES = ATTN_DQ_PLANES;
static_assert(!(DQ_PLANES && DQ_BY_RED), "the planes are the writers'");
// Whether (D = 128, the accumulator row-major) the two warpgroups' parts are the two column halves
// of one buffer of 64 whole rows, each writer adding 32 rows of 512 bytes (ATTN_DQ_JOINED: 32 bulk
// reduce-adds a writer and step rather than 64 of 256 bytes).
#ifndef ATTN_DQ_JOINED
#define ATTN_DQ_JOINED 0
#endif
constexpr bool DQ_JOINED = ATTN_DQ_JOINED;
static_assert(!DQ_JOINED || (D == 128 && !DQ_PLANES && !DQ_BY_RED), "joined parts: D = 128's writers, row-major");
// Buffers of each warpgroup's dQ part (ATTN_DQ_BUFFERS): with two (the planes at D = 128, where
// shared memory has room for them), an MMA warpgroup puts a step's part in the one its writer is
// not adding, rather than waiting for the writer to have read the last.
#ifndef ATTN_DQ_BUFFERS
#define ATTN_DQ_BUFFERS 1
#endif
constexpr int DQ_BUFS = ATTN_DQ_BUFFERS;
static_assert(DQ_BUFS == 1 || (DQ_BUFS == 2 && DQ_PLANES && D == 128), "two part buffers: D = 128's planes");
// Whether a deterministic writer reads its next step's counter before it counts this step's
// additions in (write_dq), so that the read's trip to L2 overlaps the additions' landing, rather
// than waiting for it at the next turn (about 1000 cycles a step, a fifth of the writer's step at
// D = 128 in the traced build, even where the turn had come): in the planes with one part buffer,
// the deterministic mode's own form; every other build keeps the code it was timed with. H200:
// +1.5-5% on D = 128's deterministic rows but S = 16k causal (whose tail bounds it), D = 64's
// within 3% (docs/experiments.md).
constexpr bool EARLY_TURNS = DQ_PLANES && DQ_BUFS == 1;
// When dV += P^T dO is issued (backward::DvIssue, ATTN_DV_ISSUE): 0 after the dS^T barrier, with
// dQ's and dK's products; 1 once P^T and dS^T are packed, before dS^T's stores and the barrier
// (its product fills the tensor pipe's gap there); 2 after the stores, before the barrier.
// (Issuing it before dP^T's wait, on tiles without a masked element, spills: P^T's and dP^T's
// registers are live together.)
#ifndef ATTN_DV_ISSUE
#define ATTN_DV_ISSUE 0
#endif
constexpr int DV_ISSUE = ATTN_DV_ISSUE;
static_assert(DV_ISSUE >= 0 && DV_ISSUE <= 2, "dV's issue point: 0, 1 or 2");
constexpr int STAGES = ATTN_STAGES;           // Q/dO ring
static_assert(STAGES == 2 || STAGES == 3, "two or three stages of Q and dO");
constexpr int THREADS = 3 * 128;
constexpr int D_BLOCKS = D / 64;              // 64-column (128-byte) TMA boxes per row
constexpr int NS = BM / 2;                    // S^T, dP^T accumulators per thread (64 x BM a warpgroup)
constexpr int ND = DC / 2;                    // dK, dV accumulators per thread (64 x DC)
constexpr int NQ = 32;                        // dQ accumulators per thread (a 64 x 64 part)

// Shared memory from a 1024-byte aligned base (the host adds 1024 bytes of slack). Every tile is a
// run of 64-column blocks, each [rows][64] with the 128-byte swizzle TMA writes.
constexpr unsigned KV_BYTES = BN * D * 2;
constexpr unsigned TILE_BYTES = BM * D * 2;  // Q or dO
constexpr unsigned DS_BYTES = BN * BM * 2;   // dS^T: BM / 64 blocks of [BN keys][64 queries]
// Floats a row of a dQ part takes: 64 and 4 of padding (the stores from the fragments free of
// bank conflicts), or, for the planes, 64 with its 16-byte chunks swizzled as dq_at's; joined, 64
// and 2 (the sizes' accounting: a whole row of both parts is 128 floats and 4 of padding, 132
// floats apart from the next, the same banks as 68).
constexpr int DQ_ROW = DQ_PLANES ? 64 : DQ_JOINED ? 66 : 68;
constexpr unsigned DQ_BYTES = DQ_BY_RED ? 0 : 64 * DQ_ROW * 4;  // a warpgroup's dQ part for its writer, f32
// The stride of a part's rows, and where warpgroup w's part starts in the parts' buffer.
constexpr int PART_ROW = DQ_JOINED ? 2 * DQ_ROW : DQ_ROW;
__device__ __forceinline__ int part_start(int wg) { return DQ_JOINED ? 64 * wg : wg * 64 * DQ_ROW; }
// The buffer of the parts a step's go to, and the phase of its barriers that step completes.
__device__ __forceinline__ int part_buffer(int step) { return DQ_BUFS == 1 ? 0 : step % DQ_BUFS; }
__device__ __forceinline__ unsigned part_phase(int step) { return (step / DQ_BUFS) & 1; }
constexpr unsigned SMEM_BYTES = 2 * KV_BYTES + 2 * STAGES * TILE_BYTES + 2 * DS_BYTES + 2 * DQ_BUFS * DQ_BYTES +
                                2 * STAGES * BM * 4 + 8 * (1 + 2 * STAGES + 4 * DQ_BUFS);
static_assert(SMEM_BYTES + 1024 <= 227 * 1024, "within Hopper's opt-in shared memory per block");

struct Smem {
    elem_t *k, *v, *q, *d_o, *ds;  // q, d_o: STAGES tiles; ds: two buffers
    float* dq;                     // [DQ_BUFS][2][64][DQ_ROW]: each MMA warpgroup's dQ part (joined:
                                   // [64][2 DQ_ROW], part w at columns 64w .., 4 floats of padding at
                                   // a row's end)
    float *lse, *delta;            // [STAGES][BM]
    unsigned long long* kv_full;   // K and V landed
    unsigned long long* full;      // [STAGES] Q, dO (TMA bytes) and the LSE and D (32 lanes) landed
    unsigned long long* empty;     // [STAGES] the 256 MMA threads are done with the stage
    unsigned long long* dq_full;   // [DQ_BUFS][2] warpgroup w's 128 threads have put their dQ part in
    unsigned long long* dq_empty;  // [DQ_BUFS][2] its writer has read it (joined: both writers their rows)
};

__device__ __forceinline__ Smem carve(unsigned char* raw) {
    unsigned char* p = raw + ((1024 - (sm90::smem_u32(raw) & 1023)) & 1023);
    Smem s;
    s.k = reinterpret_cast<elem_t*>(p);
    s.v = reinterpret_cast<elem_t*>(p + KV_BYTES);
    s.q = reinterpret_cast<elem_t*>(p + 2 * KV_BYTES);
    s.d_o = reinterpret_cast<elem_t*>(p + 2 * KV_BYTES + STAGES * TILE_BYTES);
    s.ds = reinterpret_cast<elem_t*>(p + 2 * KV_BYTES + 2 * STAGES * TILE_BYTES);
    s.dq = reinterpret_cast<float*>(p + 2 * KV_BYTES + 2 * STAGES * TILE_BYTES + 2 * DS_BYTES);
    s.lse = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(s.dq) + 2 * DQ_BUFS * DQ_BYTES);
    s.delta = s.lse + STAGES * BM;
    s.kv_full = reinterpret_cast<unsigned long long*>(s.delta + STAGES * BM);
    s.full = s.kv_full + 1;
    s.empty = s.full + STAGES;
    s.dq_full = s.empty + STAGES;
    s.dq_empty = s.dq_full + 2 * DQ_BUFS;
    return s;
}

// The main pass's parameter block: the tensor maps first (128-byte aligned), then the family's
// common block. Must match `Sm90BackwardParams` in crates/attn-cuda/src/backward/launch.rs.
struct Sm90Params {
    sm90::TensorMap q_map, k_map, v_map, do_map;  // [head_dim, rows, heads, batches], boxes of 64 columns
    Params p;
    long long* trace;  // ATTN_TRACE builds: [CTA][TRACE_ROWS][TRACE_SLOTS]; null otherwise
};

// ---- ATTN_TRACE, a diagnostic build (ATTN_CUDA_SM90_TRACE; never timed as the kernel): each
// role's first thread sums the SM cycles its waits take over the CTA's steps and writes them with
// its start and end (clock64) to its row of the trace; the CTA's row holds its global start and end
// (ns) and where it ran. Rows: MMA warpgroups 0 and 1, the producer, writers 0 and 1, the CTA.
// bench/device/backward_trace.py names the slots; the host's TRACE_WORDS_PER_CTA mirrors the shape.
// In other builds TIMED is the call and the rest stores nothing.
#ifndef ATTN_TRACE
#define ATTN_TRACE 0
#endif
constexpr bool TRACE = ATTN_TRACE;
enum TraceRow { ROW_MMA0, ROW_MMA1, ROW_PRODUCER, ROW_WRITER0, ROW_WRITER1, ROW_CTA };
// Slots 0, 1 and 9 of every role's row: its start, its end and its steps; 2 .. 8 its waits, and
// 10 .. 14 the MMA warpgroups' own work by phase.
enum TraceSlot { T_START, T_END, T_W2, T_W3, T_W4, T_W5, T_W6, T_W7, T_W8, T_STEPS, T_W10, T_W11, T_W12, T_W13, T_W14 };
// The waits by role. MMA: Q and dO landed, S^T's product, dP^T's, both warpgroups' dS^T, dQ's
// product, dQ's part handed over (or added, with its turn), dV's and dK's products. Producer: a
// free stage. Writer: its turn, its part, the part read, the additions landed and counted; and
// its own work, not waits: the fence after the turn, the adds' issue (timing the turn's rank too
// spills at D = 128). The MMA warps' own work, not waits: issuing S^T's and dP^T's products, the
// exponentials (while dP^T's product runs), packing P^T and dS^T, storing dS^T (with dV's product's
// issue at dv1 and dv2), issuing dQ's, dK's (and at dv0 dV's) products.
enum { MMA_FULL = T_W2, MMA_S, MMA_DP, MMA_DS_SYNC, MMA_DQ, MMA_DQ_OUT, MMA_GRAD };
enum { MMA_ISSUE_SDP = T_W10, MMA_EXP, MMA_PACK, MMA_STORE, MMA_ISSUE_GRAD };
enum { PRODUCER_EMPTY = T_W2 };
enum { WRITER_TURN = T_W2, WRITER_FULL, WRITER_READ, WRITER_LANDED, WRITER_FENCE, WRITER_ISSUE };

#if ATTN_TRACE
constexpr int TRACE_ROWS = 6, TRACE_SLOTS = 15;
__shared__ long long trace_sums[TRACE_ROWS][TRACE_SLOTS];  // outside the carved layout (Smem)
#endif
// A role's sums: in shared memory, written by its first thread only (no barrier), out at its end.
// The role and its first thread follow from the thread's index: warpgroups 0 and 1 are the MMA
// rows, warps 0, 1 and 2 of warpgroup 2 the producer's and the writers'.
__device__ __forceinline__ int trace_row() {
    return threadIdx.x < 256 ? threadIdx.x / 128 : 2 + (threadIdx.x - 256) / 32;
}
__device__ __forceinline__ bool trace_first() {
    return threadIdx.x < 256 ? threadIdx.x % 128 == 0 : threadIdx.x % 32 == 0;
}
// The CTA's index in the trace: its linear index in the grid.
__device__ __forceinline__ long long trace_cta_index() {
    return blockIdx.x + (long long)gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
}
struct Trace {
    __device__ __forceinline__ void begin() {
#if ATTN_TRACE
        if (trace_first()) {
            for (int i = 0; i < TRACE_SLOTS; ++i) trace_sums[trace_row()][i] = 0;
            trace_sums[trace_row()][T_START] = clock64();
        }
#endif
    }
    __device__ __forceinline__ void add(int i, long long cycles) {
#if ATTN_TRACE
        if (trace_first()) trace_sums[trace_row()][i] += cycles;
#endif
    }
    __device__ __forceinline__ void end(const Sm90Params& P) {
#if ATTN_TRACE
        if (trace_first()) {
            const int row = trace_row();
            trace_sums[row][T_END] = clock64();
            long long* out = P.trace + (trace_cta_index() * TRACE_ROWS + row) * TRACE_SLOTS;
            for (int i = 0; i < TRACE_SLOTS; ++i) out[i] = trace_sums[row][i];
        }
#endif
    }
};
#if ATTN_TRACE
#define TIMED(trace, i, ...)                       \
    do {                                           \
        const long long t0_ = clock64();           \
        __VA_ARGS__;                               \
        (trace).add((i), clock64() - t0_);         \
    } while (0)
#else
#define TIMED(trace, i, ...) __VA_ARGS__
#endif

__device__ __forceinline__ long long stamp() { return TRACE ? clock64() : 0; }
// A 32-bit stamp, for spans in the writer warps' few registers (differences modulo 2^32 cycles).
__device__ __forceinline__ unsigned stamp32() { return TRACE ? (unsigned)clock() : 0u; }
__device__ __forceinline__ long long global_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The key block and the steps a CTA walks; the producer, the MMA warpgroups and the writers agree
// on them. The walk goes over query blocks m_lo .. m_hi - 1 (for each query head of the group) from
// m_first, wrapping round to m_lo. m_first is m_lo unless the plan lets the sequence's walks rotate
// (it has at most rotate_key_blocks key blocks) and every key block of the sequence meets every
// query block; then key block n starts at query block n (mod their count), and at any step the
// sequence's key blocks add to different query blocks' dQ.
// In the deterministic mode a rotated walk also orders the additions by step (rotated_rank), so
// that a key block's turn at a query block comes a step after the one before it got there, not a
// chain of turns after the last key block's; it is taken only where a key block comes to each
// query block at a different step (no more key blocks than query blocks) and, since each key
// block then waits for others of its sequence launched after it, only where they fit on the GPU
// at once (the plan's limit: a CTA an SM). Each sequence by its own length: its bits do not
// depend on the other sequences of the batch.
struct Work {
    int n_block, g, b, n0;
    Seq s;
    int m_lo, m_hi, group;
    int m_first;    // the walk's first query block
    int m_end;      // m_first + its length: the walk's steps are i = m_first .. m_end - 1 (walk_m)
    bool by_step;   // deterministic: additions ordered by step (rotated_rank), not from the top
};

// The query block of step i of the walk; only a rotated walk wraps round, and it starts at 0.
__device__ __forceinline__ int walk_m(const Work& w, int i) { return !ROTATES || i < w.m_hi ? i : i - w.m_hi; }

// In a rotated walk, key block n is at query block m at step (m - n) mod M (M query blocks, at
// least the N key blocks): those before it there are n + 1 .. m (mod M) among 0 .. N - 1.
__device__ __forceinline__ int rotated_rank(const Work& w, int m) {
    const int n = w.n_block, n_blocks = (w.s.k_len + BN - 1) / BN;
    return n <= m ? min(m, n_blocks - 1) - n : n_blocks - n + m;
}

__device__ __forceinline__ Work work_of(const Params& p) {
    Work w;
    // Deterministic: the last key block first (see flash_bwd.cu: a CTA waits only for earlier ones).
    w.n_block = p.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    w.g = blockIdx.y;
    w.b = blockIdx.z;
    w.s = seq_of(p, w.b);
    w.n0 = w.n_block * BN;
    const Rows rows = rows_seeing(p, w.s, w.n0, min(w.n0 + BN, w.s.k_len));
    w.m_lo = rows.lo / BM;
    w.m_hi = rows.hi > rows.lo ? (rows.hi + BM - 1) / BM : w.m_lo;
    w.group = p.heads_q / p.heads_kv;
    w.m_first = w.m_lo;
    w.by_step = false;
    if (ROTATES && p.rotate_key_blocks > 0 && w.m_hi > w.m_lo) {
        // Every key block meets every query row if the first and the last do (rows_seeing's
        // bounds rise with the block).
        const int m_blocks = (w.s.q_len + BM - 1) / BM, n_blocks = (w.s.k_len + BN - 1) / BN;
        const Rows first = rows_seeing(p, w.s, 0, min(BN, w.s.k_len));
        const Rows last = rows_seeing(p, w.s, (n_blocks - 1) * BN, w.s.k_len);
        const bool every = first.lo == 0 && first.hi == w.s.q_len && last.lo == 0 && last.hi == w.s.q_len;
        if (every && n_blocks <= p.rotate_key_blocks && (!p.deterministic || n_blocks <= m_blocks)) {
            w.m_first = w.n_block % m_blocks;
            w.by_step = p.deterministic;
        }
    }
    w.m_end = w.m_first + (w.m_hi - w.m_lo);
    return w;
}

// TMA row and batch coordinates of row r of a sequence (packed rows: one batch of all of them).
__device__ __forceinline__ int q_map_row(const Params& p, const Work& w, int r) {
    return p.cu_seqlens_q != nullptr ? w.s.q_start + r : r;
}
__device__ __forceinline__ int q_map_batch(const Params& p, const Work& w) {
    return p.cu_seqlens_q != nullptr ? 0 : w.b;
}

// The CTA's row of the trace (thread 0, at its start and at its end): its global start and end
// (ns), its SM, and its key block, kv head and sequence.
__device__ __forceinline__ void trace_cta(const Sm90Params& P, const Work& w, bool start) {
#if ATTN_TRACE
    if (start) {
        trace_sums[ROW_CTA][0] = global_ns();
        return;
    }
    const long long cta = trace_cta_index();
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const long long row[6] = {trace_sums[ROW_CTA][0], global_ns(), sm, w.n_block, w.g, w.b};
    for (int i = 0; i < 6; ++i) P.trace[(cta * TRACE_ROWS + ROW_CTA) * TRACE_SLOTS + i] = row[i];
#endif
}

// ---- The producer: K and V once, then each step's Q, dO, LSE and D into its stage.
__device__ void produce(const Sm90Params& P, const Smem& s, const Work& w) {
    const Params& p = P.p;
    const int lane = threadIdx.x % 32;
    if (lane == 0) {
        sm90::tma_prefetch(&P.q_map);
        sm90::tma_prefetch(&P.do_map);
        const int k_row = p.cu_seqlens_k != nullptr ? w.s.k_start + w.n0 : w.n0;
        const int k_batch = p.cu_seqlens_k != nullptr ? 0 : w.b;
        sm90::mbar_arrive_expect_tx(s.kv_full, 2 * KV_BYTES);
#pragma unroll
        for (int c = 0; c < D_BLOCKS; ++c) {
            sm90::tma_load_4d(s.k + c * BN * 64, &P.k_map, s.kv_full, 64 * c, k_row, w.g, k_batch);
            sm90::tma_load_4d(s.v + c * BN * 64, &P.v_map, s.kv_full, 64 * c, k_row, w.g, k_batch);
        }
    }
    Trace trace;
    trace.begin();
    int step = 0;
    for (int hh = 0; hh < w.group; ++hh) {
        const int h = w.g * w.group + hh;
        for (int i = w.m_first; i < w.m_end; ++i, ++step) {
            const int m = walk_m(w, i);
            const int st = step % STAGES, m0 = m * BM;
            trace.add(T_STEPS, 1);
            TIMED(trace, PRODUCER_EMPTY, sm90::mbar_wait(s.empty + st, ((step / STAGES) & 1) ^ 1));
            // Q's and dO's copies first, so that they run while the lanes read the LSE and D
            // (a read of global memory each, which the copies used to wait behind); every lane
            // arrives once its own stores are done.
            if (lane == 0) {
                sm90::mbar_expect_tx(s.full + st, 2 * TILE_BYTES);
                const int row = q_map_row(p, w, m0), batch = q_map_batch(p, w);
#pragma unroll
                for (int c = 0; c < D_BLOCKS; ++c) {
                    sm90::tma_load_4d(s.q + st * (TILE_BYTES / 2) + c * BM * 64, &P.q_map, s.full + st, 64 * c, row, h,
                                      batch);
                    sm90::tma_load_4d(s.d_o + st * (TILE_BYTES / 2) + c * BM * 64, &P.do_map, s.full + st, 64 * c,
                                      row, h, batch);
                }
            }
            for (int r = lane; r < BM; r += 32) {
                const int i = m0 + r;
                const bool row = i < w.s.q_len;
                const long long at = row_index(p, w.s, w.b, h, row ? i : 0);
                s.lse[st * BM + r] = row ? p.lse[at] * LOG2E : POS_INF;
                s.delta[st * BM + r] = row ? p.delta[at] : 0.f;
            }
            sm90::mbar_arrive(s.full + st);
        }
    }
    trace.end(P);
}

// The counter's value, read with acquire semantics at GPU scope (a spin without a sleep: each
// key block's turn follows the one above it, and a sleep would add to every turn of the chain).
__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The counter's value, read relaxed at GPU scope: an acquire once a fence.acq_rel follows it.
__device__ __forceinline__ int ld_relaxed(const int* p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Adds one to a turn's counter with release semantics at GPU scope: what this thread wrote before,
// and (the ordering being transitive) what the threads that met it at a barrier before wrote, is
// seen by whoever acquires the count. EARLY_TURNS: a fence.acq_rel and a relaxed add (the same
// release; on sm_90 the same instructions and an L1 invalidation), whose fence also makes the next
// turn's counter read before it an acquire (the PTX memory model's acquire pattern).
__device__ __forceinline__ void release_one(int* counter) {
    if constexpr (EARLY_TURNS)
        asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
    else
        asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Spins (one thread) until both parts of every key block before this one at the turn's copy of
// query block m's dQ are in (flash_bwd_common.cuh's dq_turn_of).
__device__ __forceinline__ void wait_for_turn(const DqTurn& turn) {
    while (ld_acquire(turn.counter) < 2 * turn.before) {
    }
}

__device__ __forceinline__ DqTurn turn_of(const Params& p, const Work& w, int h, int m) {
    if (ROTATES && w.by_step) return dq_turn_at<D>(p, w.b, h, m, rotated_rank(w, m));
    return dq_turn_of<BN, BM, D>(p, w.s, w.b, h, w.n_block, m);
}

// ---- A dQ writer: warpgroup w's part of every step's dQ into the f32 accumulator. Its rows are
// 256 contiguous bytes there (D = 64: whole rows; D = 128: half rows), one bulk reduce-add each,
// two per lane; the planes' 64 rows one of 16 KiB; joined (D = 128), rows 32w .. 32w + 31 of both
// parts, one of 512 bytes per lane.
__device__ __forceinline__ void bulk_add_f32(float* dst, const float* src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(sm90::smem_u32(src)), "r"(bytes)
                 : "memory");
}

// Deterministic: once the writer's bulk groups are done, counts their additions in at a turn's
// `counter`: each lane's additions (the async proxy's writes) made visible to its generic proxy,
// the warp's gathered by the barrier, lane 0's release.
__device__ __forceinline__ void count_in(int* counter, int lane) {
    sm90::bulk_wait();
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    __syncwarp();
    if (lane == 0) release_one(counter);
}

__device__ void write_dq(const Sm90Params& P, const Smem& s, const Work& w, int wg) {
    const Params& p = P.p;
    const int lane = threadIdx.x % 32;
    Trace trace;
    trace.begin();
    int step = 0;
    int seen = -1;  // EARLY_TURNS, lane 0: this step's counter as read before the last count's fence
    for (int hh = 0; hh < w.group; ++hh) {
        const int h = w.g * w.group + hh;
        for (int i = w.m_first; i < w.m_end; ++i, ++step) {
            const int m = walk_m(w, i);
            const int m0 = m * BM;
            const DqTurn turn = turn_of(p, w, h, m);
            trace.add(T_STEPS, 1);
            if (p.deterministic) {
                // After both parts of every key block before this one at the copy (the parts
                // touch different elements, so their own order does not matter); a count already
                // seen there is acquired (EARLY_TURNS).
                TIMED(trace, WRITER_TURN, {
                    if (lane == 0 && !(EARLY_TURNS && seen >= 2 * turn.before)) wait_for_turn(turn);
                    __syncwarp();  // lane 0's acquire passed to the warp
                });
                // Lane 0's acquire, passed to the warp by the barrier, ordered before each lane's
                // bulk reduce-adds (the async proxy's accesses).
                const unsigned t_fence = stamp32();
                asm volatile("fence.proxy.async.global;\n" ::: "memory");
                trace.add(WRITER_FENCE, stamp32() - t_fence);
            }
            const int buf = part_buffer(step);
            const float* part = s.dq + buf * 2 * 64 * DQ_ROW + part_start(wg);
            // Joined: both parts, at fixed places (fewer registers than by wg).
            TIMED(trace, WRITER_FULL, if (DQ_JOINED) {
                sm90::mbar_wait(s.dq_full, part_phase(step));
                sm90::mbar_wait(s.dq_full + 1, part_phase(step));
            } else sm90::mbar_wait(s.dq_full + 2 * buf + wg, part_phase(step)));
            const unsigned t_issue = stamp32();
            const int row0 = m0 + (D == 64 ? 64 * wg : 0), col0 = (D == 128 ? 64 * wg : 0);
            if constexpr (DQ_JOINED) {
                // Row 32 wg + lane of both parts: a whole row of the accumulator.
                const int r = 32 * wg + lane;
                if (m0 + r < w.s.q_len)
                    bulk_add_f32(turn.accum + row_index(p, w.s, w.b, h, m0 + r) * D, s.dq + r * PART_ROW, D * 4);
            } else if constexpr (DQ_PLANES) {
                // The part's rows in the sequence, contiguous in the plane (row0 is a multiple of
                // 8: the swizzles agree; the planes' dq_at takes no row index).
                const int rows = min(64, w.s.q_len - row0);
                if (lane == 0 && rows > 0)
                    bulk_add_f32(turn.accum + dq_at<D>(p, w.s, w.b, h, row0, 0, col0), part, rows * 64 * 4);
            } else {
#pragma unroll
                for (int r = lane; r < 64; r += 32)
                    if (row0 + r < w.s.q_len)
                        bulk_add_f32(turn.accum + row_index(p, w.s, w.b, h, row0 + r) * D + col0, part + r * PART_ROW,
                                     256);
            }
            sm90::bulk_commit();
            trace.add(WRITER_ISSUE, stamp32() - t_issue);
            TIMED(trace, WRITER_READ, sm90::bulk_wait_read(); __syncwarp());
            // The part read: its warpgroup may write the next one while, in the deterministic
            // mode, this warp waits for the additions to be done before it counts them in.
            if (lane == 0) {
                if (DQ_JOINED) {
                    sm90::mbar_arrive(s.dq_empty);
                    sm90::mbar_arrive(s.dq_empty + 1);
                } else {
                    sm90::mbar_arrive(s.dq_empty + 2 * buf + wg);
                }
            }
            if (p.deterministic) {
                if constexpr (EARLY_TURNS) {
                    // The next step's counter in this head's walk, read while this step's additions
                    // land; count_in's fence makes the read an acquire. (A head's first step waits
                    // as before: reading across heads spilled the writer's registers.)
                    if (lane == 0) seen = i + 1 < w.m_end ? ld_relaxed(turn_of(p, w, h, walk_m(w, i + 1)).counter) : -1;
                }
                // The additions done, not only the part read.
                const long long t0 = stamp();
                count_in(turn.counter, lane);
                trace.add(WRITER_LANDED, stamp() - t0);
            }
        }
    }
    sm90::bulk_wait();  // the last additions done before the thread leaves, not only read
    trace.end(P);
}

// ---- The MMA warpgroups. Thread (warp r of the warpgroup, lane) holds, of each 8-column chunk c
// of a 64-row accumulator, (row 16r + lane/4, columns 8c + 2(lane%4) + {0,1}) at [4c], [4c + 1]
// and the same columns of row + 8 at [4c + 2], [4c + 3]; pairs [2j], [2j + 1] are the A fragment
// registers of wgmma's register-operand form, fragment kk = j / 4, register j % 4.

// S^T (or dP^T) = K Q^T (or V dO^T) for this warpgroup's 64 keys, from the block's key0: both K-major.
__device__ __forceinline__ void issue_keys_by_rows(float (&acc)[NS], const elem_t* keys, const elem_t* rows, int key0) {
    const unsigned long long kd = sm90::sw128_desc(sm90::smem_u32(keys) + key0 * 128, 0);
    const unsigned long long rd = sm90::sw128_desc(sm90::smem_u32(rows), 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        wgmma_qk(acc, sm90::desc_advance(kd, (kk / 4) * BN * 128 + (kk % 4) * 32),
                 sm90::desc_advance(rd, (kk / 4) * BM * 128 + (kk % 4) * 32), kk > 0);
    sm90::wgmma_commit();
}

// acc (dV or dK, 64 keys x DC) += frag (P^T or dS^T, 64 keys x BM) times rows (DC columns of dO or
// Q, BM x DC, MN-major: its 64-column blocks BM rows apart).
__device__ __forceinline__ void issue_grad(float (&acc)[ND], unsigned (&frag)[BM / 16][4], const elem_t* rows) {
    const unsigned long long rd = sm90::sw128_desc(sm90::smem_u32(rows), BM * 128);
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) wgmma_pv(acc, frag[kk], sm90::desc_advance(rd, kk * 16 * 128), 1);
}

// DV_ISSUE 1 and 2: dV's product on its own, ahead of the dS^T barrier (a group of its own: the waits
// after the barrier count it in).
__device__ __forceinline__ void issue_dv(float (&dv)[ND], unsigned (&pa)[BM / 16][4], const elem_t* d_o) {
    sm90::fence_regs(pa);
    sm90::fence_regs(dv);
    sm90::wgmma_fence();
    issue_grad(dv, pa, d_o);
    sm90::wgmma_commit();
}

__device__ __forceinline__ float2 ld_f2(const float* x) { return *reinterpret_cast<const float2*>(x); }

// A 64 x 64 part of dQ = dS K over the block's keys: A = dS, queries 64 qb .. of dS^T's buffer
// (MN-major: its rows are keys), B = K's 64-column block kb (MN-major).
__device__ __forceinline__ void issue_dq(float (&dq)[NQ], unsigned ds_buf, const elem_t* k, int qb, int kb) {
    const unsigned long long ad = sm90::sw128_desc(ds_buf + qb * BN * 128, BN * 128);
    const unsigned long long bd = sm90::sw128_desc(sm90::smem_u32(k) + kb * BN * 128, BN * 128);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
        wgmma_dq(dq, sm90::desc_advance(ad, kk * 16 * 128), sm90::desc_advance(bd, kk * 16 * 128), kk > 0);
    sm90::wgmma_commit();
}

// DQ_BY_RED: this warpgroup's dQ part (64 query rows from m0, 64 columns from col0) added to the f32
// accumulator by 8-byte reductions (red: no value comes back, so the warp does not wait for the
// L2), rows past the sequence left alone.
__device__ __forceinline__ void add_dq(const Params& p, const Work& w, const DqTurn& turn, int h, int m0, int col0,
                                       const float (&dq)[NQ]) {
    const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = m0 + 16 * warp + lane / 4 + 8 * r;
        if (row >= w.s.q_len) continue;
        float* acc = turn.accum + row_index(p, w.s, w.b, h, row) * D + col0 + 2 * (lane % 4);
#pragma unroll
        for (int c = 0; c < 8; ++c)
            asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(acc + 8 * c), "f"(dq[4 * c + 2 * r]),
                         "f"(dq[4 * c + 2 * r + 1])
                         : "memory");
    }
}

// DQ_BY_RED, deterministic: the MMA warpgroup waits for its turn at query block m's dQ (both parts
// of every higher key block in), or, with `done`, counts its part in. Named barrier 2 + wg.
// The warpgroup's reductions before the barrier are released by its first thread's count after it;
// the first thread's acquire is passed to the others by the barrier.
__device__ __forceinline__ void dq_turn(const DqTurn& turn, int wg, bool done) {
    if (done) {
        sm90::named_sync(2 + wg, 128);
        if (threadIdx.x % 128 == 0) release_one(turn.counter);
    } else {
        if (threadIdx.x % 128 == 0) wait_for_turn(turn);
        sm90::named_sync(2 + wg, 128);
    }
}

__device__ void consume(const Sm90Params& P, const Smem& s, const Work& w, int wg) {
    const Params& p = P.p;
    const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int key0 = SPLIT_COLUMNS ? 0 : 64 * wg;       // this warpgroup's first key in the block
    // The warpgroup again, through a warp reduction, whose result ptxas keeps in a uniform
    // register: for the wgmma descriptors that depend on it (its keys' rows of K and V, its
    // queries of dS^T at D = 64, its columns of K, Q and dO at D = 128 and 256), built then on
    // the uniform datapath rather than in vector registers moved over (R2UR) two a product. Only
    // there: as the index of everything, it made ptxas spill.
    const int wg_u = __reduce_min_sync(0xffffffffu, wg);
    const int key0_u = SPLIT_COLUMNS ? 0 : 64 * wg_u, col0_u = SPLIT_COLUMNS ? DC * wg_u : 0;
    const int col0 = SPLIT_COLUMNS ? DC * wg : 0;       // and its first column of dK, dV (and dQ)
    const int key_local = key0 + 16 * warp + lane / 4;  // and + 8: this thread's keys in the block
    const int shift = w.s.k_len - w.s.q_len;
    // The scores' factor to log2 units: out of the loop with BOUNDED_EDGES, in it without (as timed).
    const float scale_log2_once = p.scale * LOG2E;
    float dk[ND], dv[ND];
#pragma unroll
    for (int i = 0; i < ND; ++i) dk[i] = dv[i] = 0.f;
    Trace trace;
    trace.begin();
    sm90::mbar_wait(s.kv_full, 0);

    int step = 0;
    for (int hh = 0; hh < w.group; ++hh) {
        const int h = w.g * w.group + hh;
        const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[w.b * p.alibi_batch_stride + h] : 0.f;
        for (int i = w.m_first; i < w.m_end; ++i, ++step) {
            const int m = walk_m(w, i);
            const int st = step % STAGES, m0 = m * BM;
            const elem_t* q = s.q + st * (TILE_BYTES / 2);
            const elem_t* d_o = s.d_o + st * (TILE_BYTES / 2);
            const float* lse = s.lse + st * BM;
            const float* delta = s.delta + st * BM;
            trace.add(T_STEPS, 1);
            TIMED(trace, MMA_FULL, sm90::mbar_wait(s.full + st, (step / STAGES) & 1));

            float sacc[NS], dpacc[NS];
            long long t_work = stamp();
            sm90::wgmma_fence();
            issue_keys_by_rows(sacc, s.k, q, key0_u);
            issue_keys_by_rows(dpacc, s.v, d_o, key0_u);
            trace.add(MMA_ISSUE_SDP, stamp() - t_work);
            TIMED(trace, MMA_S, sm90::wgmma_wait<1>());
            sm90::fence_regs(sacc);

            // Read the same by every thread: whether the tile is within the sequence's rows and
            // keys, without soft-cap or ALiBi (`bounded`: then P^T is one FMA and one exp2, or 0
            // where the key is out of the row's range; without BOUNDED_EDGES, `plain` itself), and
            // whether no element of it is masked (`plain`). The tests are in each build's order as
            // timed: the order changes ptxas's code.
            bool bounded, plain;
            if constexpr (BOUNDED_EDGES) {
                bounded = w.n0 + BN <= w.s.k_len && m0 + BM <= w.s.q_len && p.softcap == 0.f && slope == 0.f;
                plain = bounded && (long long)w.n0 + BN - 1 <= (long long)m0 + shift + p.win_right &&
                        (long long)w.n0 >= (long long)m0 + BM - 1 + shift - p.win_left;
            } else {
                plain = w.n0 + BN <= w.s.k_len && m0 + BM <= w.s.q_len &&
                        (long long)w.n0 + BN - 1 <= (long long)m0 + shift + p.win_right &&
                        (long long)w.n0 >= (long long)m0 + BM - 1 + shift - p.win_left && p.softcap == 0.f &&
                        slope == 0.f;
                bounded = plain;
            }
            const float scale_log2 = BOUNDED_EDGES ? scale_log2_once : p.scale * LOG2E;
            // P^T (in place of S^T) while dP^T's product runs; the general path keeps the raw
            // scores for grad_of, which takes both at once.
            t_work = stamp();
            if (plain) {
#pragma unroll
                for (int j = 0; j < NS / 2; ++j) {
                    const float2 l2 = ld_f2(lse + 8 * (j / 2) + 2 * t);
                    sacc[2 * j] = exp2_fast(fmaf(sacc[2 * j], scale_log2, -l2.x));
                    sacc[2 * j + 1] = exp2_fast(fmaf(sacc[2 * j + 1], scale_log2, -l2.y));
                }
            } else if (bounded) {
                // A tile the mask's diagonal (or the window's edge) crosses: each element's key -
                // row - shift is the thread's first one's plus a constant of the unrolled loop (keys
                // + 8 r, queries + 8 c + x). A masked P^T is 0 by selection, whatever the row's LSE,
                // so dS^T = P^T (dP^T - D) is 0 too: dP^T and D are finite on the sequence's rows.
                const int d0 = w.n0 + key_local - m0 - 2 * t - shift;
#pragma unroll
                for (int j = 0; j < NS / 2; ++j) {
                    const int c = j / 2, r = j % 2;
                    const float2 l2 = ld_f2(lse + 8 * c + 2 * t);
                    const int d = d0 + 8 * r - 8 * c;
                    const float p0 = exp2_fast(fmaf(sacc[2 * j], scale_log2, -l2.x));
                    const float p1 = exp2_fast(fmaf(sacc[2 * j + 1], scale_log2, -l2.y));
                    sacc[2 * j] = d <= p.win_right && d >= -p.win_left ? p0 : 0.f;
                    sacc[2 * j + 1] = d - 1 <= p.win_right && d - 1 >= -p.win_left ? p1 : 0.f;
                }
            }
            trace.add(MMA_EXP, stamp() - t_work);
            TIMED(trace, MMA_DP, sm90::wgmma_wait<0>());
            sm90::fence_regs(dpacc);
            // P^T and dS^T packed in pairs as the A operands of dV's and dK's products. The two
            // paths are two loops, not one test a pair: the bounded path stays one short run of
            // code (as one loop, the compiler kept a flag a pair and jumped over the general
            // code for each).
            t_work = stamp();
            unsigned pa[BM / 16][4], da[BM / 16][4];
            if (bounded) {
#pragma unroll
                for (int j = 0; j < NS / 2; ++j) {
                    const float2 dd = ld_f2(delta + 8 * (j / 2) + 2 * t);
                    pa[j / 4][j % 4] = as_u32(pack2(sacc[2 * j], sacc[2 * j + 1]));
                    da[j / 4][j % 4] = as_u32(pack2(sacc[2 * j] * (dpacc[2 * j] - dd.x),
                                                    sacc[2 * j + 1] * (dpacc[2 * j + 1] - dd.y)));
                }
            } else {
#pragma unroll
                for (int j = 0; j < NS / 2; ++j) {
                    const int c = j / 2, r = j % 2;  // chunk, and row + 8 r
                    const int ql = 8 * c + 2 * t;    // the pair's first query of the block
                    const float2 dd = ld_f2(delta + ql);
                    const float2 l2 = ld_f2(lse + ql);
                    const int key = w.n0 + key_local + 8 * r;
                    float pr[2], ds[2];
#pragma unroll
                    for (int x = 0; x < 2; ++x) {
                        const int row = m0 + ql + x, diag = row + shift;
                        const Grad gr = grad_of(p, sees(p, w.s, key, row, diag), key, diag, slope, sacc[2 * j + x],
                                                dpacc[2 * j + x], x ? l2.y : l2.x, x ? dd.y : dd.x);
                        pr[x] = gr.p;
                        ds[x] = gr.ds;
                    }
                    pa[j / 4][j % 4] = as_u32(pack2(pr[0], pr[1]));
                    da[j / 4][j % 4] = as_u32(pack2(ds[0], ds[1]));
                }
            }
            trace.add(MMA_PACK, stamp() - t_work);
            t_work = stamp();
            if (DV_ISSUE == 1) issue_dv(dv, pa, d_o + col0_u * BM);

            // dS^T into this step's buffer: [BN keys][BM queries] as BM / 64 swizzled blocks (at
            // D = 256 both warpgroups hold all of it, and each stores half the queries), by
            // stmatrix: da[g] is four 8 x 8 matrices, queries 16 g (+ 8 for the last two) by keys
            // 16 warp (+ 8 for the odd ones); lane l gives row l % 8 of matrix l / 8: its key and
            // its 16-byte chunk, 2 (g % 4) + l / 16 of the 64-query block g / 4, swizzled by key % 8.
            const unsigned ds_buf = sm90::smem_u32(s.ds) + (step % 2) * DS_BYTES;
            const int ds_key = key0 + 16 * warp + lane % 8 + 8 * (lane / 8 % 2);
            const unsigned ds_row = ds_buf + ds_key * 128;
            const int ds_chunk = (lane / 16) ^ (ds_key % 8);
#pragma unroll
            for (int g = 0; g < BM / 16; ++g) {
                if (SPLIT_COLUMNS && 2 * g / (BM / 16) != wg) continue;
                sm90::stmatrix_x4(ds_row + (g / 4) * BN * 128 + ((2 * (g % 4)) ^ ds_chunk) * 16, da[g]);
            }
            sm90::fence_proxy_async();  // the stores above, before wgmma reads them
            if (DV_ISSUE == 2) issue_dv(dv, pa, d_o + col0_u * BM);
            trace.add(MMA_STORE, stamp() - t_work);

            // dQ = dS K, once both warpgroups' dS^T are in, then dV += P^T dO and dK += dS^T Q,
            // which run while dQ goes to the writer (or, at D = 256, to the accumulator).
            TIMED(trace, MMA_DS_SYNC, sm90::named_sync(1, 256));
            t_work = stamp();
            float dq[NQ];
            sm90::fence_regs(pa);
            sm90::fence_regs(da);
            sm90::fence_regs(dv);
            sm90::fence_regs(dk);
            sm90::wgmma_fence();
            if constexpr (SPLIT_COLUMNS) {
                // Two dQ parts, columns col0 and col0 + 64, the first under dV's and dK's products.
                issue_dq(dq, ds_buf, s.k, 0, 2 * wg_u);
                if (DV_ISSUE == 0) issue_grad(dv, pa, d_o + col0_u * BM);
                issue_grad(dk, da, q + col0_u * BM);
                sm90::wgmma_commit();
                trace.add(MMA_ISSUE_GRAD, stamp() - t_work);
                TIMED(trace, MMA_DQ, sm90::wgmma_wait<1>());
                sm90::fence_regs(dq);
                const DqTurn turn = turn_of(p, w, h, m);
                TIMED(trace, MMA_DQ_OUT, if (p.deterministic) dq_turn(turn, wg, false);
                      add_dq(p, w, turn, h, m0, col0, dq));
                sm90::wgmma_fence();  // dq's registers read above, before the next product writes them
                issue_dq(dq, ds_buf, s.k, 0, 2 * wg_u + 1);
                TIMED(trace, MMA_GRAD, sm90::wgmma_wait<0>());
                sm90::fence_regs(dq);
                TIMED(trace, MMA_DQ_OUT, add_dq(p, w, turn, h, m0, col0 + 64, dq);
                      if (p.deterministic) dq_turn(turn, wg, true));
            } else {
                // D = 128: columns 64 wg ..; D = 64: rows 64 wg ...
                issue_dq(dq, ds_buf, s.k, D == 64 ? wg_u : 0, D == 128 ? wg_u : 0);
                if (DV_ISSUE == 0) issue_grad(dv, pa, d_o);
                issue_grad(dk, da, q);
                sm90::wgmma_commit();
                trace.add(MMA_ISSUE_GRAD, stamp() - t_work);
                TIMED(trace, MMA_DQ, sm90::wgmma_wait<1>());
                sm90::fence_regs(dq);
                const long long t0 = stamp();
                if constexpr (DQ_BY_RED) {
                    const DqTurn turn = turn_of(p, w, h, m);
                    if (p.deterministic) dq_turn(turn, wg, false);
                    add_dq(p, w, turn, h, m0 + (D == 64 ? 64 * wg : 0), D == 128 ? 64 * wg : 0, dq);
                    if (p.deterministic) dq_turn(turn, wg, true);
                } else {
                    // This warpgroup's dQ part to its writer, once it has added the last one.
                    const int buf = part_buffer(step);
                    sm90::mbar_wait(s.dq_empty + 2 * buf + wg, part_phase(step) ^ 1);
                    float* part = s.dq + buf * 2 * 64 * DQ_ROW + part_start(wg) + (16 * warp + lane / 4) * PART_ROW +
                                  (DQ_PLANES ? 0 : 2 * t);
                    if constexpr (DQ_PLANES) {
                        // Row 16 warp + lane / 4 + 8 r: its 16-byte chunk 2 c + t / 2 swizzled by
                        // the row mod 8 (lane / 4), as dq_at lays the planes.
#pragma unroll
                        for (int c = 0; c < 8; ++c)
#pragma unroll
                            for (int r = 0; r < 2; ++r)
                                *reinterpret_cast<float2*>(part + 8 * r * PART_ROW + 4 * ((2 * c + t / 2) ^ (lane / 4)) +
                                                           2 * (t % 2)) =
                                    make_float2(dq[4 * c + 2 * r], dq[4 * c + 2 * r + 1]);
                    } else {
#pragma unroll
                        for (int c = 0; c < 8; ++c)
#pragma unroll
                            for (int r = 0; r < 2; ++r)
                                *reinterpret_cast<float2*>(part + 8 * r * PART_ROW + 8 * c) =
                                    make_float2(dq[4 * c + 2 * r], dq[4 * c + 2 * r + 1]);
                    }
                    sm90::fence_proxy_async();  // the stores above, before the writer's bulk copies read them
                    sm90::mbar_arrive(s.dq_full + 2 * buf + wg);
                }
                trace.add(MMA_DQ_OUT, stamp() - t0);
                TIMED(trace, MMA_GRAD, sm90::wgmma_wait<0>());
            }
            sm90::fence_regs(dv);
            sm90::fence_regs(dk);
            sm90::mbar_arrive(s.empty + st);  // Q, dO, LSE and D read by this thread
        }
    }

    // dK (times the scale) and dV: 4-byte stores of pairs, rows past the keys and columns past
    // the head dim left alone.
    elem_t* dk_out = p.dk + k_base(p, w.s, w.b, w.g, p.k_sb, p.k_sh, p.k_ss);
    elem_t* dv_out = p.dv + k_base(p, w.s, w.b, w.g, p.v_sb, p.v_sh, p.v_ss);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = w.n0 + key_local + 8 * r;
        if (key >= w.s.k_len) continue;
#pragma unroll
        for (int c = 0; c < DC / 8; ++c) {
            const int col = col0 + 8 * c + 2 * t;
            if (col >= p.head_dim) continue;
            *reinterpret_cast<unsigned*>(dk_out + (long long)key * p.k_ss + col) =
                as_u32(pack2(dk[4 * c + 2 * r] * p.scale, dk[4 * c + 2 * r + 1] * p.scale));
            *reinterpret_cast<unsigned*>(dv_out + (long long)key * p.v_ss + col) =
                as_u32(pack2(dv[4 * c + 2 * r], dv[4 * c + 2 * r + 1]));
        }
    }
    trace.end(P);
}

// Grid (ceil(seq_k / BN), heads_kv, batch), THREADS threads.
extern "C" __global__ void __launch_bounds__(THREADS, 1) attn_bwd_sm90(const __grid_constant__ Sm90Params P) {
    extern __shared__ unsigned char smem_raw[];
    const Smem s = carve(smem_raw);
    const Work w = work_of(P.p);
    if (w.n0 >= w.s.k_len) return;  // the whole CTA: no barrier is left waiting
    if (threadIdx.x == 0) trace_cta(P, w, true);
    if (threadIdx.x == 0) {
        sm90::mbar_init(s.kv_full, 1);
        for (int i = 0; i < STAGES; ++i) {
            sm90::mbar_init(s.full + i, 32);
            sm90::mbar_init(s.empty + i, 256);
        }
        for (int i = 0; i < 2 * DQ_BUFS; ++i) {
            sm90::mbar_init(s.dq_full + i, 128);
            sm90::mbar_init(s.dq_empty + i, DQ_JOINED ? 2 : 1);
        }
        sm90::mbar_init_fence();
    }
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 2) {
        sm90::regs_release<ATTN_PRODUCER_REGS>();
        const int warp = threadIdx.x % 128 / 32;
        if (warp == 0) produce(P, s, w);
        if (!DQ_BY_RED && (warp == 1 || warp == 2)) write_dq(P, s, w, warp - 1);
    } else {
        sm90::regs_claim<ATTN_CONSUMER_REGS>();
        consume(P, s, w, wg);
    }
    if (threadIdx.x == 0) trace_cta(P, w, false);
}
