// The portable backward pass (crates/attn-wgpu/src/backward.rs): correct first, one invocation
// per row, f32 throughout. The host lays every tensor out logically, f32 and padded to whole
// vec4s: q and dO as [batch, heads_q, seq_q, D4], k and v as [batch, heads_kv, seq_k, D4] (each
// sequence's rows at their index within it), all four in `t` at the offsets of `P`; the forward's
// LSE and D = rowsum(dO * O) per query row in `rows`; each sequence's (queries, keys) in `seqs`;
// ALiBi slopes per (batch, query head) in `slopes` (zeros without ALiBi). Two entry points:
//   dkv: one invocation per key row (batch, kv head, key): dK and dV, summed over the query heads
//        of its group and the query rows that see the key
//   dq:  one invocation per query row (batch, query head, row): dQ over the keys it sees
// The formulas are attn_core::backward's; rows a sequence does not have get zeros.

struct P {
    batch: u32, heads_q: u32, heads_kv: u32, seq_q: u32,
    seq_k: u32, d4: u32, group: u32, rows_q: u32,
    rows_k: u32, q_off: u32, k_off: u32, v_off: u32,
    do_off: u32, dk_off: u32, dv_off: u32, per_dim: u32,
    scale: f32, softcap: f32, win_left: i32, win_right: i32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> t: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> rows: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> seqs: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> slopes: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;

// Head dims up to 256: 64 vec4s.
const MAX_D4: u32 = 64u;

// The score of (q row at qb, key row at kb) and the soft-cap's derivative: (s, ds/dx).
fn score(qb: u32, kb: u32, slope: f32, i: i32, j: i32, q_len: i32, k_len: i32) -> vec2<f32> {
    var x = 0.0;
    for (var c = 0u; c < p.d4; c++) {
        x += dot(t[qb + c], t[kb + c]);
    }
    x *= p.scale;
    var dcap = 1.0;
    if (p.softcap > 0.0) {
        let th = tanh(x / p.softcap);
        x = p.softcap * th;
        dcap = 1.0 - th * th;
    }
    x -= slope * abs(f32(i + k_len - q_len - j));
    return vec2<f32>(x, dcap);
}

fn dot_rows(a: u32, b: u32) -> f32 {
    var x = 0.0;
    for (var c = 0u; c < p.d4; c++) {
        x += dot(t[a + c], t[b + c]);
    }
    return x;
}

fn index(gid: vec3<u32>) -> u32 {
    return gid.x + gid.y * p.per_dim;
}

@compute @workgroup_size(64)
fn dq(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = index(gid);
    if (r >= p.rows_q) {
        return;
    }
    let b = r / (p.heads_q * p.seq_q);
    let h = (r / p.seq_q) % p.heads_q;
    let i = r % p.seq_q;
    let g = h / p.group;
    let lens = seqs[b];
    var acc: array<vec4<f32>, MAX_D4>;
    if (i < lens.x) {
        let q_len = i32(lens.x);
        let k_len = i32(lens.y);
        let qb = p.q_off + r * p.d4;
        let ob = p.do_off + r * p.d4;
        let lse = rows[r].x;
        let delta = rows[r].y;
        let slope = slopes[b * p.heads_q + h];
        let diag = i32(i) + k_len - q_len;
        let first = max(0, diag - p.win_left);
        let last = min(k_len - 1, diag + p.win_right);
        for (var j = first; j <= last; j++) {
            let kb = p.k_off + ((b * p.heads_kv + g) * p.seq_k + u32(j)) * p.d4;
            let vb = p.v_off + ((b * p.heads_kv + g) * p.seq_k + u32(j)) * p.d4;
            let sc = score(qb, kb, slope, i32(i), j, q_len, k_len);
            let prob = exp(sc.x - lse);
            let ds = prob * (dot_rows(ob, vb) - delta) * sc.y;
            for (var c = 0u; c < p.d4; c++) {
                acc[c] += ds * t[kb + c];
            }
        }
    }
    for (var c = 0u; c < p.d4; c++) {
        out[r * p.d4 + c] = acc[c] * p.scale;
    }
}

@compute @workgroup_size(64)
fn dkv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = index(gid);
    if (r >= p.rows_k) {
        return;
    }
    let b = r / (p.heads_kv * p.seq_k);
    let g = (r / p.seq_k) % p.heads_kv;
    let j = r % p.seq_k;
    let lens = seqs[b];
    var dk: array<vec4<f32>, MAX_D4>;
    var dv: array<vec4<f32>, MAX_D4>;
    if (j < lens.y) {
        let q_len = i32(lens.x);
        let k_len = i32(lens.y);
        let kb = p.k_off + r * p.d4;
        let vb = p.v_off + r * p.d4;
        // The rows that may see key j: diag - left <= j <= diag + right, diag = i + k_len - q_len.
        let shift = k_len - q_len;
        let first = max(0, i32(j) - shift - p.win_right);
        let last = min(q_len - 1, i32(j) - shift + p.win_left);
        for (var hh = 0u; hh < p.group; hh++) {
            let h = g * p.group + hh;
            let slope = slopes[b * p.heads_q + h];
            for (var i = first; i <= last; i++) {
                let row = (b * p.heads_q + h) * p.seq_q + u32(i);
                let qb = p.q_off + row * p.d4;
                let ob = p.do_off + row * p.d4;
                let sc = score(qb, kb, slope, i, i32(j), q_len, k_len);
                let prob = exp(sc.x - rows[row].x);
                let ds = prob * (dot_rows(ob, vb) - rows[row].y) * sc.y;
                for (var c = 0u; c < p.d4; c++) {
                    dk[c] += ds * t[qb + c];
                    dv[c] += prob * t[ob + c];
                }
            }
        }
    }
    for (var c = 0u; c < p.d4; c++) {
        out[p.dk_off + r * p.d4 + c] = dk[c] * p.scale;
        out[p.dv_off + r * p.d4 + c] = dv[c];
    }
}
