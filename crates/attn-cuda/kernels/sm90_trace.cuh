// The traced build of flash_fwd_sm90.cu (ATTN_TRACE=1, a diagnostic, never the default): the
// producer thread and thread 0 of each consumer warpgroup stamp each piece's steps in SM clock
// cycles into `Params::trace`, for a timeline of where a CTA's cycles go (ATTN_CUDA_SM90_TRACE;
// bench/device/trace.py names the events). In every other build the stamps cost nothing:
// stamp() is 0, trace_put and sum_set store nothing, TIMED(role, k, call) is just the call.
//
// Contract with the others: included by flash_fwd_sm90.cu after the configuration
// (CONSUMERS) and `Params`, before the other parts (the producer and consumers stamp through it).
// Roles: consumer warpgroup w is role w, the producer PRODUCER_ROLE; only a role's tracer()
// thread writes. Shared memory: in the traced build `trace_sums`, a __shared__ array of its own,
// outside the carved layout (Smem); no barrier. The buffer's shape on the host side is
// TRACE_LEN_PER_CTA in crates/attn-cuda/src/hopper/launch.rs.
#pragma once

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
