// A piece's results out of the consumer warpgroup: O / sum, and the LSE where asked for, stored
// from registers or staged in shared memory for a TMA store (store_output), which the warpgroup
// issues itself or hands to a storer thread of the producer warpgroup (STORER: store_for,
// end_stores); and, for the pieces of a tile split in the tail, their partial results merged by
// whichever arrives last, which then stores the tile (merge_partials, finish_piece).
//
// Contract with the others: included by flash_fwd_sm90.cu after sm90_mainloop.cuh (Ctx,
// RowState, finalize, exp2_fast) and sm90_scheduler.cuh (Piece, Tile, the tail's units). Shared
// memory: O's tile `Smem::o` (64 rows per consumer warpgroup) or, with O_IN_Q, the piece's own Q
// slot (which Ctx::free_prev_q frees once the store has read it); STORER: per warpgroup o_full
// (its 128 threads' writes), o_empty (the storer's store has read them) and o_at (where its O
// goes; head -1: no more); `Smem::merge`, per warpgroup, whether its piece arrived last. Global
// memory: `Params::partials` (two slots per tail unit) and the per-tile arrival counters from
// `Params::schedule` + 2, which the last piece of each tile zeroes. Named barrier 1 + wg
// synchronizes the warpgroup. Flags: O_STAGED, O_IN_Q, STORER, BOTTOM, SPLIT_TAIL, CONSUMERS.
#pragma once

// Where row `row` of the tile's sequence has its LSE: [batch, heads_q, seq_q], or with packed
// queries (ATTN_SEQS) [heads_q, q_total], FlashAttention's varlen layout.
__device__ __forceinline__ long long lse_index(const Params& p, const Tile& tile, int row) {
#if ATTN_SEQS
    if (p.cu_seqlens_q != nullptr) return (long long)tile.h * p.q_total + tile.q_off + row;
#endif
    return ((long long)tile.b * p.heads_q + tile.h) * p.seq_q + row;
}

// ATTN_SEQS: whether warpgroup wg's 64 rows of the tile run past its sequence's queries.
__device__ __forceinline__ bool runs_past(const Tile& tile, int wg) {
#if ATTN_SEQS
    return __reduce_max_sync(0xffffffffu, tile.m0 + 64 * wg + 64 - tile.q_len) > 0;
#else
    return false;
#endif
}

// O / sum to the output (rows past seq_q skipped), and the LSE when asked for. Staged: this
// warpgroup's 64 rows go into its part of the O buffer in the 128-byte swizzled layout (each
// quad's 16 bytes of a row land in a chunk of their own, so a warp's stores are free of bank
// conflicts), then one thread hands them to TMA, which skips the rows past seq_q; the thread
// waits for its previous store to have read the buffer before anyone writes it again.
__device__ __forceinline__ void store_output(const Params& p, const Smem& s, elem_t* q_tile, const Tile& piece_tile,
                                             int wg, int row0, float (&o)[NO], RowState& st, int& stores) {
    const int t = threadIdx.x % 128, lane = threadIdx.x % 32;
#if ATTN_SEQS
    // The sequence's rows read again from the arrays (cached), rather than held in registers
    // through the key-tile loop, where D=256's consumers have none to spare.
    Tile tile = piece_tile;
    sequence_rows(p, tile);
#else
    const Tile& tile = piece_tile;
#endif
    // Through a vote, which ptxas knows is the same in every lane: a branch on the flag itself
    // would make it take the key-tile loop for divergent code (28 R2UR in it at D=64, not 8).
    if (__any_sync(0xffffffffu, !st.final)) finalize(st);
    const float* inv = st.inv;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float sum = st.total[r];
        const int row = row0 + 8 * r;
        if (p.lse != nullptr && lane % 4 == 0 && row >= 0 && row < queries_of(p, tile)) {
            p.lse[lse_index(p, tile, row)] = sum > 0.f ? (st.max[r] + log2f(sum)) * 0.69314718055994531f : NEG_INF;
        }
    }
    // BOTTOM: a warpgroup whose rows start before row 0 stores them one by one, since a TMA
    // store at a negative row is an illegal instruction on the H100 (loads there zero-fill).
    // ATTN_SEQS: so does one whose rows run past its sequence's, which a TMA store would write
    // into the next sequence's rows. The tests go through a warp reduction, whose result ptxas
    // keeps in a uniform register.
    if (!O_STAGED || (BOTTOM && __reduce_min_sync(0xffffffffu, tile.m0 + 64 * wg) < 0) || runs_past(tile, wg)) {
        elem_t* out = p.o + q_map_batch(p, tile) * p.o_sb + q_map_row(tile, 0) * p.o_ss + tile.h * p.o_sh;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 8 * r;
            if (row < 0 || row >= queries_of(p, tile)) continue;
#pragma unroll
            for (int c = 0; c < D / 8; ++c) {
                const int col = 8 * c + 2 * (lane % 4);
#if ATTN_PAD
                if (8 * c >= p.head_dim) break;  // the problem's columns end at a multiple of 8
#endif
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
            at[0] = q_map_row(tile, tile.m0 + 64 * wg);
            at[1] = tile.h;
            at[2] = q_map_batch(p, tile);
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
            sm90::tma_store_4d(&p.o_map, mine + c * BM * 64, 64 * c, q_map_row(tile, tile.m0 + 64 * wg), tile.h,
                               q_map_batch(p, tile));
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
// the piece that arrives last merges every part (its own read back from its slot, in unit
// order, so that the result does not depend on the arrival order) and returns true: it stores
// the tile. Each piece's O is relative to its own maxima; rescaled to the larger,
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
    // Every part, this piece's own included, is taken from its slot in unit order: the sums do
    // not depend on which piece arrived last, so a launch gives the same bits however its CTAs
    // are timed (other streams running beside it, another grid size).
    for (int g = first; g <= last; ++g) {
        const float4* theirs = partial_slot(p, g, x0, c.wg, thread);
        const float4 state = __ldcg(theirs + NO / 4 * 128);
        const float max[2] = {state.x, state.y}, sum[2] = {state.z, state.w};
        if (g == first) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                st.max[r] = max[r];
                st.sum[r] = sum[r];
            }
            st.final = false;
#pragma unroll
            for (int i = 0; i < NO / 4; ++i) {
                const float4 x = __ldcg(theirs + i * 128);
                o[4 * i] = x.x;
                o[4 * i + 1] = x.y;
                o[4 * i + 2] = x.z;
                o[4 * i + 3] = x.w;
            }
            continue;
        }
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

// Piece pc's O (this warpgroup's rows) out: stored, or, for a part of a split tile, merged with
// the others' parts by whichever arrives last, which stores the tile.
__device__ __forceinline__ void finish_piece(const Ctx& c, const Piece& pc, const Tile& tile, elem_t* q_tile,
                                             float (&o)[NO], RowState& st, int& stores) {
    const bool partial = SPLIT_TAIL && (pc.j0 > 0 || pc.j1 < tile.n_kv);
    if (!partial || merge_partials(c, pc, o, st)) store_output(c.p, c.s, q_tile, tile, c.wg, c.row0, o, st, stores);
}
