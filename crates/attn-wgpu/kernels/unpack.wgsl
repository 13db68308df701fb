// The unpack pass of a device-resident call (`repack.rs`): the packed output of the attention
// kernels ([batch·heads_q·seq_q rows, d_pad], f32 or f16) into the caller's o (any strides with
// a contiguous head dim; f32, f16 or bf16, rounded to nearest even where narrower), and the
// packed LSE into the caller's (f32, [batch, heads_q, seq_q] contiguous). What `pack.rs` and
// `backend.rs` do on the host for the host path. Nothing outside the caller's view is written:
// a 16-bit element that shares its word with memory outside the view is written by atomic
// and/or of its half. Where a kernel's loops were cut short (the status word, see
// `loop_limit_probe`), the output is NaN, never a wrong finite answer.
// With sequences of their own lengths, only each sequence's rows are written: packed queries at
// their packed rows (first row from the sequence table, `seqs.wgsl`), their LSE at
// [heads_q, total]; rows past a sequence's length (padding) are not written.
// One invocation per (row, word of the caller's row).
{{CONVERT}}

// The packed output holds f16, two per word (else f32).
const SRC_F16: bool = {{SRC_F16}};
// The caller's elements: 0 f32, 1 f16, 2 bf16.
const DST: u32 = {{DST}}u;
// A quiet NaN of the caller's element type.
const NAN: u32 = {{NAN}}u;

struct Unpack {
    // The output's first element and strides, in elements of the bound range.
    base: u32,
    stride_b: u32,
    stride_h: u32,
    stride_s: u32,
    heads: u32,
    seq: u32,
    d: u32,
    d_pad: u32,
    // Invocations per row (the words a row of `d` elements can touch), and in all.
    row_words: u32,
    invocations: u32,
    groups_x: u32,
    // The LSE's first element in its bound range, and whether to write it.
    lse_base: u32,
    lse_on: u32,
    // Sequences of their own lengths: 1; else 0. Packed queries: 1, and their rows in all.
    seqs: u32,
    q_packed: u32,
    q_total: u32,
    batch: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> P: Unpack;
@group(0) @binding(1) var<storage, read> o_packed: array<u32>;
@group(0) @binding(2) var<storage, read> lse_packed: array<u32>;
@group(0) @binding(3) var<storage, read> status: array<u32>;
@group(0) @binding(4) var<storage, read_write> o: array<{{O_WORD}}>;
@group(0) @binding(5) var<storage, read_write> lse: array<u32>;
// The sequence table, with sequences.
@group(0) @binding(6) var<storage, read> table: array<u32>;

// Element `c` of packed row `row`, as bits of the caller's type.
fn value(row: u32, c: u32) -> u32 {
    if (status[0] != 0u) {
        return NAN;
    }
    let p = row * P.d_pad + c;
    if (SRC_F16) {
        return (o_packed[p >> 1u] >> ((p & 1u) * 16u)) & 0xffffu;
    }
    let x = o_packed[p];
    if (DST == 1u) {
        return f32_to_f16(x);
    }
    if (DST == 2u) {
        return f32_to_bf16(x);
    }
    return x;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * P.groups_x + wid.x) * 64u + lid;
    if (i >= P.invocations) {
        return;
    }
    let row = i / P.row_words;
    let w = i % P.row_words;
    let bh = row / P.seq;
    let h = bh % P.heads;
    var b = bh / P.heads;
    var out_row = row % P.seq;
    var lse_at = row;
    if (P.seqs != 0u) {
        let seq = b;
        if (out_row >= table[2u * seq]) {
            return;
        }
        if (P.q_packed != 0u) {
            b = 0u;
            out_row += table[2u * P.batch + 2u * seq];
            lse_at = h * P.q_total + out_row;
        }
    }
    let first = P.base + b * P.stride_b + h * P.stride_h + out_row * P.stride_s;
{{STORE}}
    if (P.lse_on != 0u && w == 0u) {
        lse[P.lse_base + lse_at] = select(lse_packed[row], 0x7fc00000u, status[0] != 0u);
    }
}
