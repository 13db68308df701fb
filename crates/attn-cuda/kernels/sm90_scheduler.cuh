// Which work a CTA does and how the producer hands it to the consumers: tiles (one query block
// of one batch and head, numbered by tile_at so that neighbours share K/V in L2 and, under a
// causal mask or a window, the longest go first), pieces (key tiles [j0, j1) of a tile: without
// a mask the tail's tiles are cut into runs dealt evenly to the CTAs, first_piece
// and next_piece), and the piece slots through which each piece travels from the producer
// (announce, slot_free) to the consumers (take_piece).
//
// Contract with the others: included by flash_fwd_sm90.cu after the configuration (BN, BM,
// CAUSAL, BOTTOM, Q_SLOTS, SPLIT_TAIL), `Params` (the shape, q_blocks, head_group, and the
// split: whole, tail_units, tail_iters) and the shared-memory layout. Piece n of a CTA goes
// through Q slot n % Q_SLOTS (`Smem::piece`, SLOT_INTS ints each): the producer waits for the
// slot's q_empty (parity ((n / Q_SLOTS) & 1) ^ 1; every consumer thread arrives once it is done
// with the slot: Ctx::release_q, Ctx::free_prev_q in sm90_mainloop.cuh), writes the piece and its
// tile, and hand_out's q_full arrival (sm90_mainloop.cuh) publishes them with the slot's Q; the
// consumers wait for q_full (parity (n / Q_SLOTS) & 1). Drawing units from the counter
// (`Params::schedule`) is the producer's (produce), merging a split tile's pieces the epilogue's.
#pragma once

// The (batch * head, query block) of tile t, and how many key tiles it sees (ATTN_SEQS: -1 for a
// block past its sequence's, which no CTA computes).
struct Tile {
    int b, h, m0, n_kv;
#if ATTN_SEQS
    int q_off, q_len;  // the sequence's first query row in the tensor map's rows (0 where dense), its queries
    int k_off, k_len;  // the same of its keys (k_len: the keys it uses)
#endif
};

// A tile's query and key counts: its sequence's (ATTN_SEQS), else the problem's.
__device__ __forceinline__ int queries_of(const Params& p, const Tile& t) {
#if ATTN_SEQS
    return t.q_len;
#else
    return p.seq_q;
#endif
}
__device__ __forceinline__ int keys_of(const Params& p, const Tile& t) {
#if ATTN_SEQS
    return t.k_len;
#else
    return p.seq_k;
#endif
}

// Where a tile's query row `row` is in Q's (and O's) tensor map, and key row `row` in K's and
// V's: (row, batch) coordinates. Packed rows (ATTN_SEQS) are all in batch 0, from the sequence's
// first.
__device__ __forceinline__ int q_map_row(const Tile& t, int row) {
#if ATTN_SEQS
    return t.q_off + row;
#else
    return row;
#endif
}
__device__ __forceinline__ int q_map_batch(const Params& p, const Tile& t) {
#if ATTN_SEQS
    if (p.cu_seqlens_q != nullptr) return 0;
#endif
    return t.b;
}
__device__ __forceinline__ int k_map_row(const Tile& t, int row) {
#if ATTN_SEQS
    return t.k_off + row;
#else
    return row;
#endif
}
__device__ __forceinline__ int k_map_batch(const Params& p, const Tile& t) {
#if ATTN_SEQS
    if (p.cu_seqlens_k != nullptr) return 0;
#endif
    return t.b;
}

// The key tiles that query rows before `row_end` see under the bottom-right causal mask (row i
// sees keys j <= i + seq_k - seq_q).
__device__ __forceinline__ int visible_key_tiles(int seq_q, int seq_k, int row_end) {
    const int n_end = min(seq_k, max(0, row_end + seq_k - seq_q));
    return (n_end + BN - 1) / BN;
}

#if ATTN_WINDOW
// Under a window: the end of the keys that query rows m0 .. m0 + BM - 1 see (the last row's
// last key), and the first key tile (the first row's first key's; at most the end's).
__device__ __forceinline__ int window_end(const Params& p, int seq_q, int seq_k, int m0) {
    return min(seq_k, max(0, m0 + BM + seq_k - seq_q + p.win_right));
}
__device__ __forceinline__ int window_first_tile(const Params& p, const Tile& t) {
    const int seq_q = queries_of(p, t), seq_k = keys_of(p, t);
    return min(max(0, t.m0 + seq_k - seq_q - p.win_left), window_end(p, seq_q, seq_k, t.m0)) / BN;
}
#endif

// The key tile of the tile's last query row's diagonal (key_tile_at; a row before key 0 counts
// as tile 0).
__device__ __forceinline__ int diagonal_tile(const Params& p, const Tile& t) {
    return max(0, t.m0 + BM - 1 + keys_of(p, t) - queries_of(p, t)) / BN;
}

#if ATTN_SEQS
// Sequence b's rows (attn_core::SeqMap's definitions), each index clamped into the problem's
// bounds first, as the Ampere/Ada kernel's (a few scalar loads per tile, by the producer): the
// device-resident calls take the caller's arrays unchecked, and corrupt contents must give wrong
// rows, never an access outside o or the LSE (TMA clips its own). Offsets land in [0, q_total]
// and [0, kv_total], a sequence ends at or after its start and within seq_q (seq_k) rows, a key
// count in [0, the keys the sequence holds]; valid arrays pass unchanged.
__device__ __forceinline__ void sequence_rows(const Params& p, Tile& t) {
    const int* cu_q = p.cu_seqlens_q;
    const int* cu_k = p.cu_seqlens_k;
    t.q_off = cu_q != nullptr ? min(max(cu_q[t.b], 0), p.q_total) : 0;
    t.q_len = cu_q != nullptr ? min(min(max(cu_q[t.b + 1], t.q_off), p.q_total) - t.q_off, p.seq_q) : p.seq_q;
    t.k_off = cu_k != nullptr ? min(max(cu_k[t.b], 0), p.kv_total) : 0;
    const int held = cu_k != nullptr ? min(min(max(cu_k[t.b + 1], t.k_off), p.kv_total) - t.k_off, p.seq_k) : p.seq_k;
    t.k_len = p.seqused_k != nullptr ? min(max(p.seqused_k[t.b], 0), held) : held;
}
#endif

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
#if ATTN_WINDOW && !ATTN_SEQS
        // A window's blocks go from each head's last: under a window that ends at the diagonal
        // a head's first blocks see fewer keys than the rest, and taken last they fill the end
        // of the persistent grid's last wave instead of leaving full-length pieces there (the
        // (4096, 0) window at S=32768 0.991x the time on the H100, h100-window-order.json).
        qb = p.q_blocks - 1 - qb;
#endif
    }
    Tile tile;
    tile.b = bh / p.heads_q;
    tile.h = bh % p.heads_q;
#if ATTN_SEQS
    // The blocks run over the longest sequence's; this sequence has `blocks` of them. Under a
    // causal mask they count from each sequence's last (its longest, first in the order; the
    // blocks past a short sequence's then come last), else from its first.
    sequence_rows(p, tile);
    const int blocks = (tile.q_len + BM - 1) / BM;
    if (CAUSAL) qb -= p.q_blocks - blocks;
    tile.m0 = BOTTOM ? tile.q_len - (blocks - qb) * BM : qb * BM;
#if ATTN_WINDOW
    tile.n_kv = (window_end(p, tile.q_len, tile.k_len, tile.m0) + BN - 1) / BN;
#else
    tile.n_kv = CAUSAL ? visible_key_tiles(tile.q_len, tile.k_len, tile.m0 + BM) : (tile.k_len + BN - 1) / BN;
#endif
    if (qb < 0 || qb >= blocks) tile.n_kv = -1;  // past the sequence's blocks: skipped
#else
    // BOTTOM: the first block starts before row 0 where BM does not divide seq_q.
    tile.m0 = BOTTOM ? p.seq_q - (p.q_blocks - qb) * BM : qb * BM;
#if ATTN_WINDOW
    tile.n_kv = (window_end(p, p.seq_q, p.seq_k, tile.m0) + BN - 1) / BN;
#else
    tile.n_kv = CAUSAL ? visible_key_tiles(p.seq_q, p.seq_k, tile.m0 + BM) : (p.seq_k + BN - 1) / BN;
#endif
#endif
    return tile;
}

// A piece of work: key tiles [j0, j1) of tile t (under a window, a whole tile's piece starts at
// its first visible key tile). The units of work a CTA draws are whole tiles
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
#if ATTN_WINDOW
    // A window's tiles are never split: the piece is the tile's key tiles, first to last.
    if (u >= p.tiles) return Piece{u, 0, 0, -1};
    const Tile tile = tile_at(p, u);
    return Piece{u, window_first_tile(p, tile), tile.n_kv, -1};
#else
    if (!SPLIT_TAIL || u < p.whole) return Piece{u, 0, u < p.tiles ? tile_at(p, u).n_kv : 0, -1};
#endif
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

// Piece pc's tile; none (zeros) for the piece past the last tile, which says the work is done.
__device__ __forceinline__ Tile tile_or_none(const Params& p, const Piece& pc) {
    return pc.t < p.tiles ? tile_at(p, pc.t) : Tile{0, 0, 0, 0};
}

// ATTN_SEQS: past a tile beyond its sequence's blocks (n_kv -1) to the next unit of work, drawn
// from the counter at once, until a real one or the end. (Nothing in other variants.)
__device__ __forceinline__ void skip_past_blocks(const Params& p, Piece& pc, Tile& tile) {
#if ATTN_SEQS
    while (pc.t < p.tiles && tile.n_kv < 0) {
        pc = first_piece(p, gridDim.x + atomicAdd(p.schedule, 1u));
        tile = tile_or_none(p, pc);
    }
#endif
}

// ---- The piece slots.

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
#if ATTN_SEQS
    slot[8] = tile.q_off;
    slot[9] = tile.q_len;
    slot[10] = tile.k_off;
    slot[11] = tile.k_len;
#endif
    return q;
}

// Whether the Q slot of piece n is free (announce would not wait).
__device__ __forceinline__ bool slot_free(const Smem& s, int n) {
    return sm90::mbar_test(s.q_empty + n % Q_SLOTS, ((n / Q_SLOTS) & 1) ^ 1);
}

// Piece n of this CTA and its tile: its Q has landed in slot n % Q_SLOTS, and the slot names
// them.
__device__ __forceinline__ Piece take_piece(const Params& p, const Smem& s, int n, Tile& tile) {
    const int q = n % Q_SLOTS;
    sm90::mbar_wait(s.q_full + q, (n / Q_SLOTS) & 1);
    const volatile int* slot = s.piece + SLOT_INTS * q;
#if ATTN_SEQS
    tile = Tile{slot[4], slot[5], slot[6], slot[7], slot[8], slot[9], slot[10], slot[11]};
#else
    tile = Tile{slot[4], slot[5], slot[6], slot[7]};
#endif
    return Piece{slot[0], slot[1], slot[2], slot[3]};
}
