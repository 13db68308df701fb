// Loads of one vec4 of Q, K or V, in f32 whatever the storage type, and a vec4's max and sum:
// shared by the FMA kernels. Q is guarded (zeros past seq_q). K and V are not: each head's K/V
// rows are padded with zeros to whole tiles (`plan::padded_rows`), and every key loaded lies in
// a tile the block sees. The guards cost 3% (f32 D=128 without a mask) to 6% (causal) on the
// H100 (commit a9fa2c0, docs/experiments.md).
fn load_q(base: u32, row: u32, dq: u32) -> vec4<f32> {
    if (row < P.seq_q) {
        return vec4<f32>(q[base + row * D4 + dq]);
    }
    return vec4<f32>(0.0);
}

fn load_k(base: u32, key: u32, dq: u32) -> vec4<f32> {
    return vec4<f32>(k[base + key * D4 + dq]);
}

fn load_v(base: u32, key: u32, dq: u32) -> vec4<f32> {
    return vec4<f32>(v[base + key * D4 + dq]);
}

fn hmax(x: vec4<f32>) -> f32 {
    return max(max(x.x, x.y), max(x.z, x.w));
}

fn hsum(x: vec4<f32>) -> f32 {
    return (x.x + x.y) + (x.z + x.w);
}
