    // Qᵀ staged (kernels/stage_q.wgsl; Q_QUADS: the WGSL constant counting the block's quads of rows).
    // Q block -> Qᵀ, 4 rows x 4 dims per step, transposed in registers so stores are vec4.
    for (var blk = lid; blk < TY * D4; blk += T) {
        let mb = blk % TY;
        let db = blk / TY;
        let r0 = load_q(q_base, m0 + mb * 4u, db);
        let r1 = load_q(q_base, m0 + mb * 4u + 1u, db);
        let r2 = load_q(q_base, m0 + mb * 4u + 2u, db);
        let r3 = load_q(q_base, m0 + mb * 4u + 3u, db);
        let sc = P.scale_log2;
        qs[(db * 4u) * TY + mb] = vec4<f32>(r0.x, r1.x, r2.x, r3.x) * sc;
        qs[(db * 4u + 1u) * TY + mb] = vec4<f32>(r0.y, r1.y, r2.y, r3.y) * sc;
        qs[(db * 4u + 2u) * TY + mb] = vec4<f32>(r0.z, r1.z, r2.z, r3.z) * sc;
        qs[(db * 4u + 3u) * TY + mb] = vec4<f32>(r0.w, r1.w, r2.w, r3.w) * sc;
    }
