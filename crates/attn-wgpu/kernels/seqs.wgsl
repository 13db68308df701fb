// The sequence pass of a device-resident call with sequences of their own lengths (`repack.rs`):
// one invocation per sequence b reads the caller's index arrays (copied into `indices`: the
// offsets of packed queries and keys, the key counts; `i32`) and writes the sequence table the
// other passes and the attention kernel read:
//   table[2b], table[2b + 1]                    the queries and keys of sequence b (the kernel's
//                                               `seq_lens`),
//   table[2 batch + 2b], table[2 batch + 2b + 1] the packed row of its first query and first key.
// The contents of the arrays are not checked (that would need a copy back): every value is
// clamped into the problem's bounds here, offsets into [0, total], lengths into [0, seq_q] or
// [0, seq_k] and never past the packed rows, key counts into [0, the keys the sequence holds].
// Valid arrays pass the clamps unchanged (the host path's `SeqMap` without clamps); a corrupt
// one gives wrong rows, never a row outside the tensors.

struct Seqs {
    batch: u32,
    seq_q: u32,
    seq_k: u32,
    // Packed queries: 1, and their rows in all; else 0.
    q_packed: u32,
    q_total: u32,
    // Packed keys: 1, and their rows in all; else 0.
    k_packed: u32,
    k_total: u32,
    // Per-sequence key counts: 1; else 0.
    k_used: u32,
    // Where each array starts in `indices`, in entries.
    cu_q_at: u32,
    cu_k_at: u32,
    used_at: u32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> P: Seqs;
@group(0) @binding(1) var<storage, read> indices: array<i32>;
@group(0) @binding(2) var<storage, read_write> table: array<u32>;

// `x` clamped into [0, hi].
fn clamped(x: i32, hi: u32) -> u32 {
    return min(u32(max(x, 0)), hi);
}

// A packed sequence's first row and length from its offsets at `indices[at]` and
// `indices[at + 1]`: both clamped into [0, total], the length into [0, longest].
fn packed(at: u32, total: u32, longest: u32) -> vec2<u32> {
    let start = clamped(indices[at], total);
    let end = max(clamped(indices[at + 1u], total), start);
    return vec2<u32>(start, min(end - start, longest));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    if (b >= P.batch) {
        return;
    }
    var q = vec2<u32>(0u, P.seq_q);
    if (P.q_packed != 0u) {
        q = packed(P.cu_q_at + b, P.q_total, P.seq_q);
    }
    var k = vec2<u32>(0u, P.seq_k);
    if (P.k_packed != 0u) {
        k = packed(P.cu_k_at + b, P.k_total, P.seq_k);
    }
    if (P.k_used != 0u) {
        k.y = clamped(indices[P.used_at + b], k.y);
    }
    table[2u * b] = q.y;
    table[2u * b + 1u] = k.y;
    table[2u * P.batch + 2u * b] = q.x;
    table[2u * P.batch + 2u * b + 1u] = k.x;
}
