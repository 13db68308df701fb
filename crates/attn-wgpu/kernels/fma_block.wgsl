{{PARAMS_COPY}}    // ---- The block's set-up, shared by the FMA kernels (kernels/fma_block.wgsl): which
    // (batch·head, query block) this workgroup computes, how many key tiles it sees, the first
    // K stage's loads, and Q: staged into `qs` (kernels/stage_q.wgsl), or into registers.
    let bh_grid = wid.y + wid.z * P.grid_y;
    if (bh_grid >= P.bh_total) {
        return;
    }
    // Causal: the blocks with the most keys start first, across heads (see `Params`).
    let order = wid.x + bh_grid * P.n_qblocks;
    let bh = select(bh_grid, order % P.bh_total, CAUSAL);
    let qblk = select(wid.x, P.n_qblocks - 1u - order / P.bh_total, CAUSAL);
    let m0 = qblk * BM;
    let b = bh / P.heads_q;
    let h = bh % P.heads_q;
    let q_base = bh * P.seq_q * D4;
    // K/V rows per head: seq_k padded with zeros to whole tiles (`plan::padded_rows`).
    let kv_base = (b * P.heads_kv + h / P.group) * ((P.seq_k + BN - 1u) / BN * BN) * D4;
{{SEQ_LENS}}
    // Keys this block can see: this dispatch's (all, or one part: `Params`), and (causal) up to
    // the last row's diagonal; tiles t_first..n_tiles.
    var n_end = min(P.seq_k, P.key_end);
    if (CAUSAL) {
        n_end = u32(clamp(i32(m0 + BM) + P.causal_offset, 0, i32(n_end)));
    }
{{SCORE_SETUP}}    let n_tiles = (n_end + BN - 1u) / BN;
    let t_first = {{FIRST_TILE}};

    // K and V (or, where P·V reads V straight from its buffer, K alone) pass through registers on
    // their way to workgroup memory: each stage's global loads (pre*) are issued before the
    // previous stage's arithmetic and stored after it, so their latency hides under that
    // arithmetic. The first K chunk is loaded under the Q staging.
{{PRE_DECL}}
    if (n_tiles > t_first) {
{{FETCH_K_FIRST}}
    }

{{STAGE_Q}}
    // ---- End of the shared set-up.
