// The pack pass of a device-resident call (`repack.rs`): one of q, k, v, read from the caller's
// buffer (any strides with a contiguous head dim; f32, f16 or bf16) into the layout the attention
// kernels read: contiguous [batch, heads, seq_pad, d_pad] with zeros in the padding, f32 or f16,
// and for kernels that read K straight from its buffer each tile of `tile` rows transposed (dim
// d of row t·tile + n at d·tile + n). Exactly what `pack.rs` does on the host for the host path.
// With sequences of their own lengths, sequence b's rows come first in its slot and zeros after:
// its length and first packed row from the sequence table (`seqs.wgsl`), a paged cache's rows
// from the block table (page numbers clamped into the cache).
// One invocation per 32-bit word of the packed tensor. 16-bit elements are read as halves of
// words: the binding need not start at an element of the tensor.
{{CONVERT}}

// The caller's elements: 0 f32, 1 f16, 2 bf16.
const SRC: u32 = {{SRC}}u;
// The packed tensor holds f16, two per word (else f32).
const DST_F16: bool = {{DST_F16}};

struct Pack {
    // The tensor's first element and its strides, in elements of the bound range.
    base: u32,
    stride_b: u32,
    stride_h: u32,
    stride_s: u32,
    heads: u32,
    seq: u32,
    d: u32,
    // Rows per head and elements per row of the packed tensor.
    seq_pad: u32,
    d_pad: u32,
    // Rows per transposed tile, or 0 for none.
    tile: u32,
    // Words of the packed tensor, and workgroups along x (the grid is x, then y).
    words: u32,
    groups_x: u32,
    // Sequences of their own lengths: 1 (rows past a sequence's length are zeros); else 0.
    seqs: u32,
    // Where a sequence's rows are: 0 at (b, row), 1 packed at (0, first + row), 2 in pages.
    rows: u32,
    // 0 for q (the table's query entries), 1 for k and v (its key entries).
    which: u32,
    batch: u32,
    // A paged cache: keys per page, pages in the cache, block-table entries per sequence, and
    // where the block table starts in `indices`.
    page_size: u32,
    pages: u32,
    pages_per_seq: u32,
    table_at: u32,
}

@group(0) @binding(0) var<uniform> P: Pack;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
// The sequence table (`seqs.wgsl`) and the caller's index arrays (i32 bits), with sequences.
@group(0) @binding(3) var<storage, read> table: array<u32>;
@group(0) @binding(4) var<storage, read> indices: array<u32>;

// The 16 bits of the caller's element `e`.
fn half_at(e: u32) -> u32 {
    return (src[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu;
}

// The bits of packed element `e`: the caller's element converted to the packed type, or a zero
// of the padding.
fn element(e: u32) -> u32 {
    let per_head = P.seq_pad * P.d_pad;
    let bh = e / per_head;
    let r = e % per_head;
    var row = r / P.d_pad;
    var col = r % P.d_pad;
    if (P.tile != 0u) {
        let per_tile = P.d_pad * P.tile;
        let in_tile = r % per_tile;
        row = (r / per_tile) * P.tile + in_tile % P.tile;
        col = in_tile / P.tile;
    }
    var len = P.seq;
    var b = bh / P.heads;
    var src_row = row;
    if (P.seqs != 0u) {
        let seq = b;
        len = min(table[2u * seq + P.which], P.seq);
        if (P.rows == 1u) {
            b = 0u;
            src_row = table[2u * P.batch + 2u * seq + P.which] + row;
        } else if (P.rows == 2u && row < len) {
            let page = bitcast<i32>(indices[P.table_at + seq * P.pages_per_seq + row / P.page_size]);
            b = min(u32(max(page, 0)), P.pages - 1u);
            src_row = row % P.page_size;
        }
    }
    if (row >= len || col >= P.d) {
        return 0u;
    }
    let at = P.base + b * P.stride_b + (bh % P.heads) * P.stride_h + src_row * P.stride_s + col;
    if (SRC == 0u) {
        return src[at];
    }
    if (SRC == 2u) {
        return half_at(at) << 16u;
    }
    if (DST_F16) {
        return half_at(at);
    }
    return f16_to_f32(half_at(at));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = (wid.y * P.groups_x + wid.x) * 64u + lid;
    if (w >= P.words) {
        return;
    }
    if (DST_F16) {
        dst[w] = element(2u * w) | (element(2u * w + 1u) << 16u);
    } else {
        dst[w] = element(w);
    }
}
