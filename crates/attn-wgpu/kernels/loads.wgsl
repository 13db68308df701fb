// Guarded loads of one vec4 of Q, K or V (zeros past seq_q or seq_k, in f32 whatever the
// storage type), and a vec4's max and sum: shared by the FMA kernels.
fn load_q(base: u32, row: u32, dq: u32) -> vec4<f32> {
    if (row < P.seq_q) {
        return vec4<f32>(q[base + row * D4 + dq]);
    }
    return vec4<f32>(0.0);
}

fn load_k(base: u32, key: u32, dq: u32) -> vec4<f32> {
    if (key < P.seq_k) {
        return vec4<f32>(k[base + key * D4 + dq]);
    }
    return vec4<f32>(0.0);
}

fn load_v(base: u32, key: u32, dq: u32) -> vec4<f32> {
    if (key < P.seq_k) {
        return vec4<f32>(v[base + key * D4 + dq]);
    }
    return vec4<f32>(0.0);
}

fn hmax(x: vec4<f32>) -> f32 {
    return max(max(x.x, x.y), max(x.z, x.w));
}

fn hsum(x: vec4<f32>) -> f32 {
    return (x.x + x.y) + (x.z + x.w);
}
