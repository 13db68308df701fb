// What every kernel variant takes: the parameters (laid out as `backend.rs`'s `Params`) and the
// buffers, all contiguous BHSD with the head dim padded. O is in vec4 units of the element type
// ET; the inputs in units of IN (the FMA kernel: vec4<ET>; the cooperative-matrix kernel: ET).
struct Params {
    seq_q: u32,
    seq_k: u32,
    heads_q: u32,
    heads_kv: u32,
    group: u32,
    // The grid is (query blocks, batch·head over y and z); workgroups start in that order, x
    // fastest. Without a mask one head's blocks are neighbours, so its K and V stay in L2. Under
    // a causal mask the kernels read the same order across heads instead: every head's last
    // query block (the most keys) starts first, then every head's one before it, so that the
    // shortest blocks fill the tail (the CUDA kernel's order). Read within one head only, each
    // head's longest block could start near the end of the dispatch.
    n_qblocks: u32,
    grid_y: u32,
    bh_total: u32,
    // seq_k - seq_q: row i sees key j iff j <= i + causal_offset (bottom-right).
    causal_offset: i32,
    scale_log2: f32,
    neg_inf_bits: u32,
    // The keys this dispatch sees, key_begin..key_end: all of them, or (on a software adapter
    // with a loop limit, `plan::KeySplit`) one part, key_begin a multiple of the key tile.
    key_begin: u32,
    key_end: u32,
    // Trips of `loop_limit_probe`'s loop: 2, from the host, so that no compiler can unroll it.
    probe_trips: u32,
    pad: u32,
{{SCORE_PARAMS}}}

@group(0) @binding(0) var<uniform> {{PARAMS_VAR}}: Params;
@group(0) @binding(1) var<storage, read> q: array<IN>;
@group(0) @binding(2) var<storage, read> k: array<IN>;
@group(0) @binding(3) var<storage, read> v: array<IN>;
@group(0) @binding(4) var<storage, read_write> o: array<vec4<ET>>;
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;
// status[0]: set to 1 by an invocation whose loops were cut short (`loop_limit_probe`).
@group(0) @binding(6) var<storage, read_write> status: array<u32>;
{{SCORE_BINDINGS}}
// Mesa's software adapters (llvmpipe, lavapipe) end every loop of an invocation once 65535
// iterations have run in all its loops together, without an error: the kernel would go on with
// the keys it has seen so far. Called last, after every other loop: a loop of two trips that no
// compiler can unroll (its bound is a parameter) runs only once if that limit has been reached,
// and the host turns the flag into an error.
fn loop_limit_probe() {
    var trips = 0u;
    for (var i = 0u; i < P.probe_trips; i++) {
        trips += 1u;
    }
    if (trips != P.probe_trips) {
        status[0] = 1u;
    }
}
