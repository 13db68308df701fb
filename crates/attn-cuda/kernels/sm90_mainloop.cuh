// The work on K and V: the producer thread's loop (produce: hands each piece out, loads its Q,
// then its K/V tiles into the ring of stages by TMA) and a consumer warpgroup's loop over a
// piece's key tiles (S = Q K^T, the online softmax, O += P V): mainloop_overlapped
// (software-pipelined, with the ping-pong turns and the speculative softmax), with the wgmma
// issue helpers and the softmax's arithmetic (RowState).
//
// Contract with the others: included by flash_fwd_sm90.cu after the configuration, `Params`,
// the shared-memory layout, sm90_trace.cuh and sm90_scheduler.cuh. K/V tile `it` (counted in the
// same order by the producer and every consumer, across the CTA's pieces) is in stage
// it % STAGES, whose barriers are in phase (it / STAGES) & 1: k_full / v_full complete on the
// producer's arrival and the TMA bytes, k_empty / v_empty on one arrival per consumer warp
// (Ctx::release). Q: the piece slots of sm90_scheduler.cuh, freed by Ctx::release_q at the
// piece's last S (one slot) or by Ctx::free_prev_q under the next piece's first S (O_IN_Q).
// Named barriers: 0 is __syncthreads', 1 + w consumer warpgroup w's own (128 threads), TURN + w
// the ping-pong ring's (256). A consumer leaves sm90_epilogue.cuh the piece's O, not yet divided
// by the row sums, and its RowState (finalized under the overlapped loop's last P V;
// store_output finalizes it where it is not). Flags: D, BN, STAGES, CONSUMERS, CAUSAL,
// Q_SLOTS (O_IN_Q), SPECULATE, and ATTN_WINDOW, ATTN_SOFTCAP, ATTN_ALIBI (by `#if`, so that the
// variants without them compile to what they did before they existed).
#pragma once

// ---- The producer: one thread of the producer warpgroup issues every copy.

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
        sm90::tma_load_4d(s.q + q * (Q_BYTES / 2) + c * BM * 64, &p.q_map, s.q_full + q, 64 * c,
                          q_map_row(tile, tile.m0), tile.h, q_map_batch(p, tile));
}

// Key (or value) tile n0 of KV head g into a stage (`dst`, arrivals on `bar`): one box of BN rows
// per 64 columns at (row, batch) = (k_map_row, k_batch); from a paged cache (ATTN_PAGED),
// BN / page_box boxes of page_box rows (a multiple of 16 dividing the page size: no box crosses
// a page), each from its page and at its rows' place in the stage (a multiple of 8 rows, so the
// 128-byte swizzle lays the boxes out as one box of BN rows would). A box past the sequence's
// last table entry (in the tile past its keys) reads that entry's page, and a page number past
// the cache, or negative, reads zeros (TMA clips every box): a corrupt table gives wrong rows,
// never a stray access. The rows past the sequence's keys are masked (K) and cleared (V,
// clear_v_past_keys) as dense rows are. The page numbers are read box by box in a loop kept
// rolled, and its column blocks' copies too (unrolled, or with the numbers held in an array, the
// producer's 40 registers spilled, or ptxas's choices spilled D=256's consumers); the table's
// line stays in L1, which TMA's traffic does not touch.
__device__ __forceinline__ void load_kv_tile(const Params& p, const Tile& tile, elem_t* dst, const sm90::TensorMap* map,
                                             unsigned long long* bar, int n0, int g, int k_batch) {
#if ATTN_PAGED
    const int* table = p.block_table + tile.b * p.pages_per_seq;
#pragma unroll 1
    for (int r = 0; r < BN; r += p.page_box) {
        const unsigned key = n0 + r;
        const int page = __ldg(table + min(key / (unsigned)p.page_size, (unsigned)p.pages_per_seq - 1u));
#pragma unroll 1
        for (int c = 0; c < D_BLOCKS; ++c)
            sm90::tma_load_4d(dst + c * BN * 64 + r * 64, map, bar, 64 * c, key % (unsigned)p.page_size, g, page);
    }
#else
#pragma unroll
    for (int c = 0; c < D_BLOCKS; ++c) sm90::tma_load_4d(dst + c * BN * 64, map, bar, 64 * c, k_map_row(tile, n0), g, k_batch);
#endif
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
    skip_past_blocks(p, pc, tile);
    hand_out(p, s, pc, tile, n);
    while (pc.t < p.tiles) {
        const int traced = n - 1;  // this piece's row of the trace
        Piece next = pc;
        const bool same_unit = next_piece(p, next);
        const unsigned drawn = same_unit ? 0u : atomicAdd(p.schedule, 1u);
        sum_set(PRODUCER_ROLE, SUM_K, 0);
        sum_set(PRODUCER_ROLE, SUM_V, 0);
        bool handed = false;  // the next piece
        Tile upcoming;
        const int g = tile.h / (p.heads_q / p.heads_kv);
        const int k_batch = k_map_batch(p, tile);
        const int diag = diagonal_tile(p, tile);
        for (int j = pc.j0; j < pc.j1; ++j, ++it) {
            const int st = it % STAGES;
            const unsigned free_parity = ((it / STAGES) & 1) ^ 1;
            const int n0 = key_tile_at(pc.j0, pc.j1, diag, j) * BN;  // the tile's first key
            elem_t* k = s.k + st * (KV_BYTES / 2);
            elem_t* v = s.v + st * (KV_BYTES / 2);
            TIMED(PRODUCER_ROLE, SUM_K, sm90::mbar_wait(s.k_empty + st, free_parity));
            sm90::mbar_arrive_expect_tx(s.k_full + st, KV_BYTES);
            load_kv_tile(p, tile, k, &p.k_map, s.k_full + st, n0, g, k_batch);
            TIMED(PRODUCER_ROLE, SUM_V, sm90::mbar_wait(s.v_empty + st, free_parity));
            sm90::mbar_arrive_expect_tx(s.v_full + st, KV_BYTES);
            load_kv_tile(p, tile, v, &p.v_map, s.v_full + st, n0, g, k_batch);
            if (Q_SLOTS == 2 && !handed && slot_free(s, n)) {
                if (!same_unit) next = first_piece(p, gridDim.x + drawn);
                upcoming = tile_or_none(p, next);
                skip_past_blocks(p, next, upcoming);
                hand_out(p, s, next, upcoming, n);
                handed = true;
            }
        }
        trace_put(p, traced, PRODUCER_ROLE, P_ISSUED, stamp());
        trace_put(p, traced, PRODUCER_ROLE, P_K_WAIT, sum_get(PRODUCER_ROLE, SUM_K));
        trace_put(p, traced, PRODUCER_ROLE, P_V_WAIT, sum_get(PRODUCER_ROLE, SUM_V));
        trace_put(p, traced, PRODUCER_ROLE, P_PIECE, ((long long)pc.t << 32) | ((long long)pc.j0 << 16) | (long long)pc.j1);
        if (!handed) {
            if (!same_unit) next = first_piece(p, gridDim.x + drawn);
            upcoming = tile_or_none(p, next);
            skip_past_blocks(p, next, upcoming);
            hand_out(p, s, next, upcoming, n);
        }
        pc = next;
        tile = upcoming;
    }
    __threadfence();  // this CTA's last draw from the counter, before it says so
    if (atomicAdd(p.schedule + 1, 1u) == gridDim.x - 1) {
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
    sm90::named_sync(TURN + wg, 256);
}
__device__ __forceinline__ void pass_turn(int wg) {
    sm90::named_arrive(TURN + (wg + 1) % CONSUMERS, 256);
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

// tanh(x) in one MUFU.TANH (tanh.approx.f32: the soft-cap's; its error in
// crates/attn-cuda/src/scores.rs, ScoreParams::softcap_in). The Ampere/Ada and decode kernels'
// is mma_sm80.cuh's, the same instruction.
__device__ __forceinline__ float tanh_fast(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
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
// on the H100 it timed the same as one chain (commit 0fb8596, docs/experiments.md).
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
#if ATTN_ALIBI
    float bias[2];   // the tile's ALiBi term per row, in units of s (add_alibi's linear form; else 0)
#endif
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

#if ATTN_WINDOW
// mask() under a window, one side at a time (each called only for the tiles that side crosses,
// mask_window_tile): mask_window_right sets key columns past seq_k or more than `right` keys after
// a row's diagonal to -inf, mask_window_left those more than `left` keys before it; each row's
// bound found once. (With all four bounds live at a time, D=256's consumers spilled.)
__device__ __forceinline__ void mask_window_right(float (&s)[NS], int row, int n0, int seq_k, int shift, int right) {
    const int first_col = n0 + 2 * (threadIdx.x % 4);
    int last[2];  // per row, the last visible column's offset from first_col
#pragma unroll
    for (int r = 0; r < 2; ++r) last[r] = min(seq_k - 1, row + 8 * r + shift + right) - first_col;
#pragma unroll
    for (int c = 0; c < BN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (8 * c + (e & 1) > last[e >> 1]) s[4 * c + e] = NEG_INF;
}
__device__ __forceinline__ void mask_window_left(float (&s)[NS], int row, int n0, int shift, int left) {
    const int first_col = n0 + 2 * (threadIdx.x % 4);
    int first[2];  // per row, the first visible column's offset from first_col
#pragma unroll
    for (int r = 0; r < 2; ++r) first[r] = row + 8 * r + shift - left - first_col;
#pragma unroll
    for (int c = 0; c < BN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (8 * c + (e & 1) < first[e >> 1]) s[4 * c + e] = NEG_INF;
}
#endif

// A raw score soft-capped under ATTN_SOFTCAP (tanh(|scale| s / cap), see cap_scores), else as it is.
__device__ __forceinline__ float capped(float s, float softcap_in) {
#if ATTN_SOFTCAP
    s = tanh_fast(s * softcap_in);
#endif
    return s;
}

#if ATTN_SOFTCAP
// The soft-cap, in place on a tile's raw scores: s <- tanh(|scale| s / cap) (Params::softcap_in
// = |scale| / cap), which the exponent's factor (Ctx::sl2 = cap * log2(e)) turns into the capped
// score; one MUFU.TANH a score (its error: ScoreParams::softcap_in in src/scores.rs). Before the
// mask, which must leave -inf. With ALiBi, add_alibi caps each score as it adds the bias instead
// (capped()): the whole tile capped first, ptxas spilled 12-172 bytes in 13 of the ALiBi variants.
__device__ __forceinline__ void cap_scores(float (&s)[NS], float softcap_in) {
#pragma unroll
    for (int i = 0; i < NS; ++i) s[i] = capped(s[i], softcap_in);
}
#endif

#if ATTN_ALIBI
// ALiBi, in place on a tile's scores (each capped first under ATTN_SOFTCAP, by capped(), in the
// general form, the only one with a soft-cap): -slope |row + shift - col| in the units of s
// (`slope_s`: the slope times log2(e) / sl2, so that the exponent's factor makes it the bias in
// base-2 units). This thread's distances d = row + shift - col are one base d0 plus compile-time
// offsets (its rows row, row + 8; its keys n0 + 8c + 2 (lane % 4) + {0, 1}), integers below 2^24,
// exact in f32. Before the mask, which must leave -inf.
// Linear form: where the tile's keys lie on one side of the diagonal for all the warp's 16 rows
// (all at or before it, d >= 0: every tile before the diagonal's; or all after it, d <= 0), |d|
// is d or -d, and the bias splits into a part per key, +-slope (8c + e), one FFMA with an
// immediate per score, and a part per row, -+slope (d0 + 8r), kept in st.bias (update_max adds it
// to the row's max, exponentiate_rows takes it off the exponent's base). The per-key part stays
// below slope_s * BN, so the scores keep their precision however far the keys are from the
// diagonal. The tiles the diagonal crosses take the general form, one FFMA (on |d|) per score and
// one FADD per distance, which two scores share.
// The distances do not depend on the scores, and ptxas computed them all ahead of the wait for S
// (to hide their latency under the product), which holds NS more registers: D=64 spilled 274
// bytes. So the base is made to depend on a score: fminf(|s[0]|, 0) is +0 whatever s[0] is
// (NaN too), which ptxas does not know, and which leaves each distance exact.
// The linear form where it keeps the consumers' registers: not with a soft-cap at D=64 (24-40
// bytes spilled), nor at D=256 (36-48 with sequences); nor where it was slower: D=64 without a
// mask (1.017-1.030x the general form's time at S=4096 in two calls, h100-hopper-alibi-linear.json).
// Those take the general form on every tile.
constexpr bool ALIBI_LINEAR = D <= 128 && !ATTN_SOFTCAP && (D == 128 || CAUSAL || ATTN_WINDOW);
static_assert(!(ALIBI_LINEAR && ATTN_SOFTCAP), "the linear form does not cap its scores (capped()); softmax_step skips cap_scores with ALiBi");
__device__ __forceinline__ void add_alibi(float (&s)[NS], RowState& st, int row, int warp_row0, int n0, int shift,
                                          float slope_s, float softcap_in) {
    const int d0 = row + shift - n0 - 2 * (int)(threadIdx.x % 4);
    const bool before = n0 + BN - 1 <= warp_row0 + shift;  // the warp's first row sees the tile's last key
    const bool after = n0 >= warp_row0 + 15 + shift;       // its last row's diagonal is before the first key
    if (ALIBI_LINEAR && (before || after)) {
        const float ks = before ? slope_s : -slope_s;  // -slope |d| = ks (8c + e) - ks (d0 + 8r)
#pragma unroll
        for (int c = 0; c < BN / 8; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[4 * c + e] = fmaf(ks, (float)(8 * c + (e & 1)), s[4 * c + e]);
#pragma unroll
        for (int r = 0; r < 2; ++r) st.bias[r] = -ks * (float)(d0 + 8 * r);
        return;
    }
    if (ALIBI_LINEAR) st.bias[0] = st.bias[1] = 0.f;
    const float base = (float)d0 + fminf(fabsf(s[0]), 0.f);
#pragma unroll
    for (int c = 0; c < BN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float d = base + (float)(8 * (e >> 1) - 8 * c - (e & 1));
            s[4 * c + e] = fmaf(-slope_s, fabsf(d), capped(s[4 * c + e], softcap_in));
        }
}
#endif

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
#if ATTN_ALIBI
    const float tile_max[2] = {ALIBI_LINEAR ? max_of(part[0]) + st.bias[0] : max_of(part[0]),
                               ALIBI_LINEAR ? max_of(part[1]) + st.bias[1] : max_of(part[1])};
#else
    const float tile_max[2] = {max_of(part[0]), max_of(part[1])};
#endif
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
#if ATTN_ALIBI
    // The row's ALiBi term (add_alibi's linear form) in the exponent: p = exp2((s + bias) sl2 - max).
    float base[2] = {st.max[0] == NEG_INF ? 0.f : st.max[0], st.max[1] == NEG_INF ? 0.f : st.max[1]};
    if (ALIBI_LINEAR) base[0] -= st.bias[0] * sl2, base[1] -= st.bias[1] * sl2;
#else
    const float base[2] = {st.max[0] == NEG_INF ? 0.f : st.max[0], st.max[1] == NEG_INF ? 0.f : st.max[1]};
#endif
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

// ---- One consumer warpgroup's tiles.

// The keys a piece's rows may see at most: its sequence's (ATTN_SEQS) or the problem's. (A macro:
// a member function of Ctx moved the other variants' code about.)
#if ATTN_SEQS
#define KEYS(c) ((c).seq_k)
#else
#define KEYS(c) ((c).p.seq_k)
#endif

// What a consumer warpgroup's thread knows while it computes one tile.
struct Ctx {
    const Params& p;
    const Smem& s;
    int wg, lane;
    float sl2;         // |scale| * log2(e), at least 1e-30 (see negate_q_rows); cap * log2(e) with a soft-cap
    int shift;         // seq_k - seq_q: row i sees keys j <= i + shift
    int row0;          // this thread's first row (the other is row0 + 8)
    int warp_row0;     // this warp's first row: a key tile past its diagonal needs the mask
    unsigned q_smem;   // this warpgroup's 64 rows of Q
    int j0, j1;        // this piece's key tiles of the query tile: [j0, j1)
    int q_prev;        // the Q slot of the last piece, to free (O_IN_Q), or -1
#if ATTN_ALIBI
    float alibi;       // the piece's (batch, head)'s ALiBi slope in the units of s (add_alibi)
#endif
#if ATTN_SEQS
    int seq_k;         // the sequence's keys (else the problem's: KEYS)
#endif
#if ATTN_DIAGONAL_FIRST
    int diag;          // the key tile of the tile's last diagonal (diagonal_tile, walk)
#endif

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
        __syncwarp();
        if (lane == 0) sm90::mbar_arrive(bar);
    }
    // One arrival per thread on Q's "empty" barrier: this thread is done with Q and with the
    // piece slot it read, and its own arrival (a release) orders that read before the producer's
    // next write of the slot (racecheck found the per-warp arrival's ordering through
    // __syncwarp wanting). Once per piece, at the piece's last S (so that a Q loads under the
    // last P V); with O_IN_Q, see free_prev_q().
    __device__ void release_q() const {
        if (!O_IN_Q) sm90::mbar_arrive(s.q_empty);  // the one slot
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

#if ATTN_WINDOW
// A window's mask on the tile of keys from n0, each side where the tile crosses it for the
// warp's 16 rows: the keys' end or the window's right edge (the first row's last key), its left
// edge (the last row's first key). A tile crosses one side, but where the window is narrower
// than a tile: each side costs a compare and a select a score, on 2 of 33 tiles a piece at
// (4096, 0) with 128-key tiles.
__device__ __forceinline__ void mask_window_tile(const Ctx& c, float (&sc)[NS], int n0) {
    const int diag0 = c.warp_row0 + c.shift;
    if (n0 + BN > KEYS(c) || n0 + BN - 1 > diag0 + c.p.win_right)
        mask_window_right(sc, c.row0, n0, KEYS(c), c.shift, c.p.win_right);
    if (n0 < diag0 + 15 - c.p.win_left) mask_window_left(sc, c.row0, n0, c.shift, c.p.win_left);
}
#endif

// Caps (ATTN_SOFTCAP), adds ALiBi's bias (ATTN_ALIBI), masks, then exponentiates tile j's scores in place; returns whether O
// must be rescaled.
__device__ __forceinline__ bool softmax_step(const Ctx& c, float (&sc)[NS], RowState& st, int j, float (&alpha)[2]) {
    const int n0 = j * BN;
#if ATTN_SOFTCAP && !ATTN_ALIBI
    cap_scores(sc, c.p.softcap_in);
#endif
#if ATTN_ALIBI
    add_alibi(sc, st, c.row0, c.warp_row0, n0, c.shift, c.alibi, c.p.softcap_in);
#endif
#if ATTN_WINDOW
    mask_window_tile(c, sc, n0);
#else
    if (n0 + BN > KEYS(c) || (CAUSAL && n0 + BN - 1 > c.warp_row0 + c.shift)) mask(sc, c.row0, n0, KEYS(c), c.shift);
#endif
    const bool moved = update_max(sc, st, c.sl2, alpha);
    exponentiate(sc, st, c.sl2);
    return moved;
}

// Key tile j's softmax against the running max as it stands, without finding the tile's own max
// first: at D=64 that search (60 FMNMX and two shuffles a tile) is what the consumers wait on most,
// and the kernel without it ran 4-12% faster (commit 841c170, docs/experiments.md).
// The running max moves only when a row outgrows it by RESCALE_SLACK anyway; as long as no row
// did, every p is below 2^RESCALE_SLACK and so is each thread's part of a row's sum. Where a part
// is above that (or is not a number), or a row has seen no key yet, the warpgroup issues S_j again
// (K and Q are still in place: see next_tile) and takes the usual way, max first. Returns whether
// O must be rescaled, as softmax_step does.
__device__ __forceinline__ bool softmax_speculative(const Ctx& c, float (&o)[NO], unsigned (&pa)[BN / 16][4],
                                                    float (&sc)[NS], RowState& st, int j, unsigned k_smem,
                                                    float (&alpha)[2]) {
    const int n0 = j * BN;
#if ATTN_SOFTCAP && !ATTN_ALIBI
    cap_scores(sc, c.p.softcap_in);
#endif
#if ATTN_ALIBI
    add_alibi(sc, st, c.row0, c.warp_row0, n0, c.shift, c.alibi, c.p.softcap_in);
#endif
#if ATTN_WINDOW
    mask_window_tile(c, sc, n0);
#else
    const bool masked = n0 + BN > KEYS(c) || (CAUSAL && n0 + BN - 1 > c.warp_row0 + c.shift);
    if (masked) mask(sc, c.row0, n0, KEYS(c), c.shift);
#endif
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

// The key tile a consumer takes j-th of its piece (key_tile_at, as the producer loads them).
__device__ __forceinline__ int walk(const Ctx& c, int j) {
#if ATTN_DIAGONAL_FIRST
    return key_tile_at(c.j0, c.j1, c.diag, j);
#else
    return j;
#endif
}

// V's rows past the sequence's keys, in key tile `kt` (K/V tile `it`), set to zero before a P V
// reads them (ATTN_SEQS). TMA loads whole tiles from tensor maps that span every packed row: the
// last key tile's rows past the keys hold the next sequence's rows or a cache's unwritten slots
// (seqused_k), where P is 0, but 0 times a NaN or an infinity there is NaN. Called once the
// tile's S and softmax are done (its P packed, S's registers free), which waits for V there on
// that tile only. A row is 128 contiguous bytes of each 64-column block (the 128-byte swizzle
// moves 16-byte pieces within their row). Both consumer warpgroups clear the rows (the same
// zeros; neither frees the stage before its own P V is done), each before its own wgmma reads
// them through the async proxy.
// Where: walked in order, only a piece's last tile can hold the sequence's last key with rows
// past it (a block's last visible tile ends at or before the keys' end, or is that tile), so the
// clearing stands before the piece's last P V, outside the key-tile loop; walked diagonal first
// (ALiBi), after the softmax of whichever tile it is, and D=256 keeps that place too (before its
// last P V, two of its variants spilled).
constexpr bool CLEAR_IN_LOOP = ATTN_DIAGONAL_FIRST || D == 256;
__device__ __forceinline__ void clear_v_past_keys(const Ctx& c, int it, int kt) {
#if ATTN_SEQS
    const int first = max(KEYS(c) - kt * BN, 0);  // the tile's first row past the keys
    if (first >= BN) return;                        // the same for the whole warpgroup
    TIMED(c.wg, SUM_V, sm90::mbar_wait(c.s.v_full + Ctx::stage(it), Ctx::phase(it)));
    // The warpgroup's 128 threads clear 16 rows (2048 bytes) of each block a pass, a thread the
    // 16 bytes at its own offset, from the pass that holds row `first` on.
    const int mine = (threadIdx.x % 128) * 16;
    const unsigned v = c.v_smem(Ctx::stage(it)) + mine;
#pragma unroll
    for (int pass = 0; pass < BN / 16; ++pass)
        if (pass * 2048 + mine >= first * 128)
#pragma unroll
            for (int b = 0; b < D_BLOCKS; ++b)
                asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(v + b * BN * 128 + pass * 2048), "r"(0u)
                             : "memory");
    sm90::fence_proxy_async();
    sm90::named_sync(1 + c.wg, 128);
#endif
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
    if (c.j1 - c.j0 == 1) c.release_q();
    softmax_step(c, sc, st, walk(c, c.j0), alpha);
    to_fragments(sc, pa);
    if (CLEAR_IN_LOOP) clear_v_past_keys(c, it, walk(c, c.j0));
}

// The piece's j-th key tile (key_tile_at; j - j0 tiles in): S_j issued with P_{j-1} V_{j-1} (tile
// `it`), S_j's softmax under that P V, then O rescaled where the max moved and P_j packed; `it`
// moves on to tile j. SPECULATE: the softmax
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
    if (j + 1 == c.j1) c.release_q();
    const int kt = walk(c, j);
    const bool moved = SPECULATE ? softmax_speculative(c, o, pa, sc, st, kt, c.k_smem(Ctx::stage(it)), alpha)
                                 : softmax_step(c, sc, st, kt, alpha);
    sm90::wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: O and P's registers are free
    sm90::fence_regs(o);
    c.release(c.s.v_empty + Ctx::stage(prev));
    if (moved) rescale(o, alpha);
    to_fragments(sc, pa);
    if (CLEAR_IN_LOOP) clear_v_past_keys(c, it, kt);
}

// The piece's last P V, alone in its turn; `it` moves past it.
__device__ __forceinline__ void last_pv(const Ctx& c, float (&o)[NO], unsigned (&pa)[BN / 16][4], RowState& st,
                                       int& it) {
    if (!CLEAR_IN_LOOP) clear_v_past_keys(c, it, c.j1 - 1);
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

// This warpgroup's key tiles of the piece, [j0, j1), software-pipelined inside the warpgroup:
// S_j is issued together with P_{j-1} V_{j-1}, and
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
#if ATTN_DIAGONAL_FIRST
    // Walked back from the block's last diagonal, a row above the first tile's diagonals sees no
    // key (causal), or its largest bias, only at its own diagonal's tile, and a warpgroup with such
    // a row would issue S again on each of those tiles: the tiles a block's rows span (and one for
    // the blocks laid from the bottom) find their max first.
    for (const int spanned = min(c.j1 - 1, c.j0 + (BM - 1) / BN + 2); j < spanned; ++j)
        next_tile<false>(c, o, pa, sc, st, it, j);
#endif
    for (; j + 1 < c.j1; ++j) next_tile<SPECULATE>(c, o, pa, sc, st, it, j);
    if (j < c.j1) next_tile<false>(c, o, pa, sc, st, it, j);
    last_pv(c, o, pa, st, it);
}

// The piece for one consumer warpgroup: its key tiles computed (above).
__device__ void mainloop_overlapped(const Ctx& c, float (&o)[NO], RowState& st, int& it) {
    mainloop_computed(c, o, st, it);
}

// What consumer warpgroup wg's thread knows of piece n (pc, of tile `tile`).
__device__ __forceinline__ Ctx context(const Params& p, const Smem& s, int wg, const Piece& pc, const Tile& tile, int n) {
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    return Ctx{p,
               s,
               wg,
               lane,
#if ATTN_SOFTCAP
               p.softcap_out,
#else
               fmaxf(fabsf(p.scale_log2), 1e-30f),
#endif
               keys_of(p, tile) - queries_of(p, tile),
               tile.m0 + 64 * wg + 16 * warp + lane / 4,
               tile.m0 + 64 * wg + 16 * warp,
               sm90::smem_u32(q_tile_of(s, n)) + wg * 64 * 128,
               pc.j0,
               pc.j1,
               n > 0 ? (n - 1) % Q_SLOTS : -1
#if ATTN_ALIBI
               ,
               // The slope times log2(e) / sl2 (as Ctx::sl2 above)
               p.alibi_slopes[tile.b * p.alibi_batch_stride + tile.h] * 1.4426950408889634f /
#if ATTN_SOFTCAP
                   p.softcap_out
#else
                   fmaxf(fabsf(p.scale_log2), 1e-30f)
#endif
#endif
#if ATTN_SEQS
               ,
               tile.k_len
#endif
#if ATTN_DIAGONAL_FIRST
               ,
               diagonal_tile(p, tile)
#endif
    };
}
