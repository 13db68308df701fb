// One step of a key split (`plan::KeySplit`): folds the partial result of one part of the keys
// (o_part, normalised over that part, and its log-sum-exp) into the running one (o_acc, f32, and
// lse), and after the last part writes the output. One invocation per query row.
//
// With a = the running LSE and b = the part's, the merged LSE is m + ln(e^(a-m) + e^(b-m)),
// m = max(a, b), and the merged output the same weights' average of the two outputs. A row that
// has seen no key (LSE -inf) takes weight 0; one that sees none in either stays 0 with LSE -inf.
{{ENABLE}}
alias ET = {{ET}};

struct Merge {
    // Query rows (batch·heads·seq_q) and vec4 columns per row.
    rows: u32,
    d4: u32,
    // 1 for the first part (nothing to merge with yet), 1 for the last (write o).
    first: u32,
    last: u32,
    // Workgroups along x (the grid is x, then y, when rows exceed one dimension).
    groups_x: u32,
    neg_inf_bits: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> M: Merge;
@group(0) @binding(1) var<storage, read> o_part: array<vec4<ET>>;
@group(0) @binding(2) var<storage, read> lse_part: array<f32>;
@group(0) @binding(3) var<storage, read_write> o_acc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;
@group(0) @binding(5) var<storage, read_write> o: array<vec4<ET>>;

// Below every finite LSE: -inf, as the flash kernel writes it for a row without keys.
const EMPTY: f32 = -3.0e38;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * M.groups_x + wid.x) * 64u + lid;
    if (row >= M.rows) {
        return;
    }
    let b = lse_part[row];
    var a = bitcast<f32>(M.neg_inf_bits);
    if (M.first == 0u) {
        a = lse[row];
    }
    var wa = 0.0;
    var wb = 0.0;
    var merged = bitcast<f32>(M.neg_inf_bits);
    if (a > EMPTY && b > EMPTY) {
        let m = max(a, b);
        wa = exp(a - m);
        wb = exp(b - m);
        merged = m + log(wa + wb);
    } else if (a > EMPTY) {
        wa = 1.0;
        merged = a;
    } else if (b > EMPTY) {
        wb = 1.0;
        merged = b;
    }
    let inv = select(1.0 / (wa + wb), 0.0, wa + wb == 0.0);
    let at = row * M.d4;
    for (var c = 0u; c < M.d4; c++) {
        var acc = vec4<f32>(0.0);
        if (wa != 0.0) {
            acc = o_acc[at + c];
        }
        let x = (wa * acc + wb * vec4<f32>(o_part[at + c])) * inv;
        o_acc[at + c] = x;
        if (M.last != 0u) {
            o[at + c] = vec4<ET>(x);
        }
    }
    lse[row] = merged;
}
