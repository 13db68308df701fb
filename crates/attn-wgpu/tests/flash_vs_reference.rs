//! The wgpu backend against the exact `Reference` on the edge cases of its kernel: one row,
//! lengths that are not multiples of the tiles, every head-dim class, causal masks with
//! seq_q < seq_k and seq_q > seq_k (rows that see nothing), GQA, both layouts and padded views,
//! all three dtypes, and the LSE. Outputs are poisoned with NaN first, and elements outside a
//! strided output view must stay poisoned.
//!
//! Without an adapter each test prints `SKIPPED <test>: <reason>` and passes, unless
//! `ATTN_REQUIRE_WGPU=1` (set by `cargo xtask test`), where it fails.

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::{
    Attention, Availability, Buffer, DType, DeviceKind, Inputs, Layout, Outputs, Plan, Problem, Shape,
    Strides, TensorStrides,
};
use attn_cpu::Reference;
use attn_wgpu::options::REQUIRE_WGPU;
use attn_wgpu::{Options, Wgpu};
use std::sync::OnceLock;

/// The one backend of this test binary (one device, pipelines shared between tests), or `None`
/// after printing why the test is skipped.
fn backend(test: &str) -> Option<&'static Wgpu> {
    static BACKEND: OnceLock<Wgpu> = OnceLock::new();
    let b = BACKEND.get_or_init(Wgpu::new);
    match b.availability() {
        Availability::Available { .. } => Some(b),
        Availability::Unavailable { reason } => {
            if REQUIRE_WGPU.on_off().unwrap() == Some(true) {
                panic!("an adapter is required (ATTN_REQUIRE_WGPU=1) but wgpu is unavailable: {reason}");
            }
            eprintln!("SKIPPED {test}: {reason}");
            None
        }
    }
}

/// Allowed |wgpu − reference| per element, `atol + rtol·|reference|`: f32 accumulation plus one
/// rounding of the output (the same rule the CPU backend's test uses).
fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-6, 2e-5),
        DType::F16 => (2e-5, 2.0 * 2f64.powi(-11)),
        DType::Bf16 => (2e-5, 2.0 * 2f64.powi(-8)),
    }
}

/// Runs the backend on normal inputs and compares every row and LSE with the reference.
fn check(backend: &Wgpu, problem: &Problem, seed: u64) {
    let problem = problem.with_lse(true);
    let mut rng = SplitMix64::new(seed);
    let [q_len, k_len, v_len, o_len] = problem.required_lens().map(|(_, n)| n);
    let q = normal_buffer(&mut rng, problem.dtype, q_len, 1.0);
    let k = normal_buffer(&mut rng, problem.dtype, k_len, 1.0);
    let v = normal_buffer(&mut rng, problem.dtype, v_len, 1.0);
    let inputs = Inputs::new(q.as_data(), k.as_data(), v.as_data());
    let mut o = Buffer::zeros(problem.dtype, o_len);
    let mut lse = vec![0.0f32; problem.lse_len()];
    let mut outputs = Outputs { o: o.as_data_mut(), lse: Some(lse.as_mut_slice()) };
    outputs.poison();
    let plan = backend.forward(&problem, inputs, outputs).unwrap_or_else(|e| panic!("{problem}: {e}"));

    let s = problem.shape;
    let (atol, rtol) = tolerance(problem.dtype);
    // Scores carry an f32 error of about u32·|score|, which moves the output by that much times
    // max|v|: the allowance attn-verify makes too, with the score bound scale·max‖q‖·max‖k‖.
    let norm = |x: &Buffer, st: Strides, heads: usize, seq: usize| {
        let x = x.to_f32_vec();
        let mut max = 0f64;
        for (b, h, i) in
            (0..s.batch).flat_map(|b| (0..heads).flat_map(move |h| (0..seq).map(move |i| (b, h, i))))
        {
            let at = st.offset(b, h, i);
            max = max.max(x[at..at + s.head_dim].iter().map(|&y| (y as f64).powi(2)).sum::<f64>().sqrt());
        }
        max
    };
    let bound = problem.scale() as f64
        * norm(&q, problem.strides.q, s.heads_q, s.seq_q)
        * norm(&k, problem.strides.k, s.heads_kv, s.seq_k);
    let v_max = v.to_f32_vec().iter().fold(0f64, |m, &y| m.max((y as f64).abs()));
    let atol = atol + 8.0 * 2f64.powi(-24) * bound * v_max;
    let got = o.to_f32_vec();
    let mut written = vec![false; o_len];
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            for i in 0..s.seq_q {
                let want = Reference::row(&problem, &inputs, b, h, i).unwrap();
                let off = problem.strides.o.offset(b, h, i);
                for (d, &w) in want.o.iter().enumerate() {
                    let x = got[off + d] as f64;
                    written[off + d] = true;
                    assert!(
                        (x - w).abs() <= atol + rtol * w.abs(),
                        "seed {seed} {problem} ({}): o[{b},{h},{i},{d}] = {x}, reference {w}",
                        plan.kernel
                    );
                }
                let l = lse[(b * s.heads_q + h) * s.seq_q + i] as f64;
                let ok = if want.lse == f64::NEG_INFINITY {
                    l == f64::NEG_INFINITY
                } else {
                    (l - want.lse).abs() <= 1e-4 * want.lse.abs().max(1.0) + 8.0 * 2f64.powi(-24) * bound
                };
                assert!(
                    ok,
                    "seed {seed} {problem} ({}): lse[{b},{h},{i}] = {l}, reference {}",
                    plan.kernel, want.lse
                );
            }
        }
    }
    if let Some(i) = (0..o_len).find(|&i| !written[i] && !got[i].is_nan()) {
        panic!("seed {seed} {problem}: element {i} outside the output view was written");
    }
}

fn sk(sq: usize, sk: usize, heads: usize, d: usize) -> Shape {
    Shape { seq_q: sq, seq_k: sk, ..Shape::new(1, heads, 1, d) }
}

#[test]
fn one_row_and_lengths_off_the_tiles() {
    let Some(b) = backend("one_row_and_lengths_off_the_tiles") else { return };
    check(b, &Problem::new(Shape::new(1, 2, 1, 64), DType::F32), 1);
    check(b, &Problem::new(Shape::new(1, 2, 77, 32), DType::Bf16).causal(), 2);
    check(b, &Problem::new(sk(65, 130, 2, 64), DType::F32), 3);
    check(b, &Problem::new(sk(1, 33, 1, 64), DType::F32).causal(), 4);
}

#[test]
fn head_dims() {
    let Some(b) = backend("head_dims") else { return };
    for (i, d) in [32, 40, 64, 96, 128, 256].into_iter().enumerate() {
        check(b, &Problem::new(Shape::new(1, 2, 70, d), DType::F32), 10 + i as u64);
        check(b, &Problem::new(Shape::new(1, 1, 45, d), DType::F16).causal(), 20 + i as u64);
    }
}

#[test]
fn causal_offsets_and_empty_rows() {
    let Some(b) = backend("causal_offsets_and_empty_rows") else { return };
    // seq_q < seq_k: every row sees a prefix longer than its index.
    check(b, &Problem::new(sk(40, 150, 2, 64), DType::F32).causal(), 30);
    // seq_q > seq_k: the first 110 rows see nothing (o = 0, lse = -inf), spanning whole blocks.
    check(b, &Problem::new(sk(150, 40, 2, 64), DType::F32).causal(), 31);
    check(b, &Problem::new(sk(150, 40, 2, 64), DType::Bf16).causal(), 32);
    check(b, &Problem::new(Shape::new(2, 2, 200, 128), DType::F16).causal(), 33);
}

#[test]
fn grouped_query_attention() {
    let Some(b) = backend("grouped_query_attention") else { return };
    for (i, kv) in [8, 2, 1].into_iter().enumerate() {
        let shape = Shape { heads_kv: kv, ..Shape::new(2, 8, 50, 64) };
        check(b, &Problem::new(shape, DType::F32).causal(), 40 + i as u64);
        check(b, &Problem::new(shape, DType::F16), 45 + i as u64);
    }
}

#[test]
fn layouts_and_padded_views() {
    let Some(b) = backend("layouts_and_padded_views") else { return };
    let shape = Shape { heads_kv: 2, ..Shape::new(2, 4, 80, 64) };
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        check(b, &Problem::new(shape, dtype).with_layout(Layout::Bshd), 50 + i as u64);
    }
    let s = Shape::new(2, 2, 70, 64);
    let row = s.head_dim + 8;
    let pad = |heads: usize, seq: usize| Strides {
        batch: heads * (seq + 2) * row,
        head: (seq + 2) * row,
        seq: row,
    };
    let t = TensorStrides { q: pad(2, 70), k: pad(2, 70), v: pad(2, 70), o: pad(2, 70) };
    check(b, &Problem::new(s, DType::Bf16).causal().with_strides(t), 55);
}

#[test]
fn large_logits_and_explicit_scale() {
    let Some(b) = backend("large_logits_and_explicit_scale") else { return };
    // Scores of size ~100: the running max must be subtracted before exp2.
    check(b, &Problem::new(Shape::new(1, 2, 100, 64), DType::F32).with_scale(12.0), 60);
    check(b, &Problem::new(Shape::new(1, 2, 100, 64), DType::F32).with_scale(0.01).causal(), 61);
}

#[test]
fn plans_name_the_variant_and_reuse_the_pipeline() {
    let Some(b) = backend("plans_name_the_variant_and_reuse_the_pipeline") else { return };
    let p = Problem::new(Shape::new(1, 4, 300, 128), DType::F16).causal();
    let plan = b.plan(&p).unwrap();
    assert!(plan.kernel.starts_with("flash_f16_d128_"), "{}", plan.kernel);
    assert!(plan.kernel.contains("_causal_"), "{}", plan.kernel);
    let text = plan.to_string();
    assert!(text.contains("workgroup memory") && text.contains("kernel time from"), "{text}");
    assert_eq!(b.plan(&p).unwrap(), plan);
    // `prepare` takes the kernel from the plan's payload, not from its name, and compiles it
    // once: the second finds the pipeline in the cache, well under a second.
    let [q_len, k_len, v_len, _] = p.required_lens().map(|(_, n)| n);
    let [q, k, v] = [q_len, k_len, v_len].map(|n| Buffer::zeros(p.dtype, n));
    let inputs = || Inputs::new(q.as_data(), k.as_data(), v.as_data());
    assert!(b.prepare(&plan, inputs()).is_ok());
    let t = std::time::Instant::now();
    assert!(b.prepare(&plan, inputs()).is_ok());
    assert!(t.elapsed().as_secs_f64() < 1.0, "{:?}", t.elapsed());
    // A plan without the payload is refused.
    let bare = Plan { payload: Default::default(), ..plan };
    assert!(matches!(b.prepare(&bare, inputs()), Err(attn_core::Error::PlanMismatch { .. })));
}

/// The backend with `options` (a device of its own).
fn with(options: Options) -> Wgpu {
    Wgpu::with_options(options)
}

#[test]
fn reductions_through_workgroup_memory() {
    let Some(_) = backend("reductions_through_workgroup_memory") else { return };
    let b = with(Options { no_subgroups: true, ..Options::default() });
    let p = Problem::new(Shape { heads_kv: 1, ..Shape::new(1, 4, 150, 96) }, DType::F32).causal();
    assert!(b.plan(&p).unwrap().kernel.ends_with("_wgmem"));
    check(&b, &p, 70);
    check(&b, &Problem::new(sk(150, 40, 2, 64), DType::F16).causal(), 71);
    check(&b, &Problem::new(Shape::new(1, 2, 33, 256), DType::Bf16), 72);
}

#[test]
fn sixteen_invocations_per_row() {
    let Some(_) = backend("sixteen_invocations_per_row") else { return };
    let b = with(Options { row_threads: Some(16), ..Options::default() });
    let p = Problem::new(Shape { heads_kv: 2, ..Shape::new(1, 4, 150, 128) }, DType::F32).causal();
    assert!(b.plan(&p).unwrap().kernel.ends_with("_tx16"), "{}", b.plan(&p).unwrap().kernel);
    check(&b, &p, 80);
    check(&b, &Problem::new(sk(70, 130, 2, 64), DType::F16).causal(), 81);
    check(&b, &Problem::new(Shape::new(2, 2, 65, 128), DType::Bf16), 82);
    // Head dims that are not a multiple of 64 have no such variant: a plan error, not a fallback.
    assert!(b.plan(&Problem::new(Shape::new(1, 1, 8, 96), DType::F32)).is_err());
}

/// f32's measured shapes with each number of rows (Q in registers, V staged by keys, S split
/// over the head dim), with and without the skip of unseen stages, whatever the problem's
/// length would pick.
#[test]
fn s_split_over_the_head_dim() {
    let Some(_) = backend("s_split_over_the_head_dim") else { return };
    let rows = |r| with(Options { rows: Some(r), ..Options::default() });
    // D=128, 64 rows, every stage loaded (short causal problems' form): GQA, causal with an
    // offset, keys off the tiles.
    let p = Problem::new(Shape { heads_kv: 1, ..sk(90, 150, 3, 128) }, DType::F32).causal();
    assert!(rows(64).plan(&p).unwrap().kernel.ends_with("_sd"), "{}", rows(64).plan(&p).unwrap().kernel);
    check(&rows(64), &p, 160);
    // Causal with seq_q > seq_k (rows that see no key), 128 rows.
    check(&rows(128), &Problem::new(sk(150, 70, 2, 128), DType::F32).causal(), 161);
    // D=64 (two key groups per stage), non-causal, bf16 widened, the BSHD layout.
    let p = Problem::new(Shape::new(2, 2, 75, 64), DType::Bf16).with_layout(Layout::Bshd);
    assert!(backend_plan(&p).contains("_d64_"), "{}", backend_plan(&p));
    check(&rows(64), &p, 162);
    check(&rows(128), &p, 164);
    // A head dim padded to 64 (40), large logits.
    check(&rows(64), &Problem::new(Shape::new(1, 2, 130, 40), DType::F32).with_scale(4.0), 163);
}

/// The default backend's kernel for `p`.
fn backend_plan(p: &Problem) -> String {
    backend("backend_plan").map(|b| b.plan(p).unwrap().kernel).unwrap_or_default()
}

#[test]
fn unseen_keys_skipped() {
    let Some(_) = backend("unseen_keys_skipped") else { return };
    // f32 D=128's measured shape, 128 rows (short causal problems take 64 without the skip).
    let b = with(Options { rows: Some(128), ..Options::default() });
    // Causal offsets (seq_k - seq_q) that put a block's last key on, just before and just after
    // the first key of a 32-key stage; seq_q off the blocks.
    for (i, offset) in [0, 1, 15, 16, 17, 31, 33, 63, 65].into_iter().enumerate() {
        let p = Problem::new(sk(70, 70 + offset, 2, 128), DType::F32).causal();
        assert!(b.plan(&p).unwrap().kernel.ends_with("_sd_sk"), "{}", b.plan(&p).unwrap().kernel);
        check(&b, &p, 170 + i as u64);
    }
    // Rows that see nothing (seq_q > seq_k), and keys that end inside a tile without a mask.
    check(&b, &Problem::new(sk(150, 40, 2, 128), DType::F32).causal(), 190);
    check(&b, &Problem::new(sk(100, 70, 2, 128), DType::F32), 191);
    check(&b, &Problem::new(sk(64, 33, 2, 128), DType::Bf16), 192);
}

/// What an adapter with WebGPU's 16 KiB of workgroup memory gets at D=256, where no staged shape
/// fits: K and V read straight from their buffers.
#[test]
fn k_and_v_read_straight_from_their_buffers() {
    let Some(_) = backend("k_and_v_read_straight_from_their_buffers") else { return };
    let b = with(Options { workgroup_storage: Some(16 * 1024), ..Options::default() });
    // Keys off the tiles (the padded rows of the transposed K tiles), GQA, causal with an offset.
    let p = Problem::new(Shape { heads_kv: 1, ..sk(90, 150, 3, 256) }, DType::F32).causal();
    assert!(b.plan(&p).unwrap().kernel.ends_with("_vd_kd"), "{}", b.plan(&p).unwrap().kernel);
    check(&b, &p, 110);
    check(&b, &Problem::new(sk(70, 200, 2, 256), DType::F16), 111);
    check(&b, &Problem::new(Shape::new(2, 2, 65, 256), DType::Bf16).causal(), 112);
    // A head dim that is padded (240 -> 256), and the BSHD layout.
    check(&b, &Problem::new(Shape::new(1, 2, 40, 240), DType::F32).with_layout(Layout::Bshd), 113);
}

/// Past the keys one dispatch may walk on an adapter with a loop limit (Mesa's software ones,
/// `plan::SOFTWARE_LOOP_LIMIT`), the planner splits the keys over dispatches merged by LSE; it
/// does not split on hardware. With subgroups (the default) and without (whose kernels run more
/// loop trips per tile, so split sooner); causal with GQA, and decode rows in f16 and f32.
#[test]
fn keys_split_past_a_software_adapters_loop_limit() {
    let Some(default) = backend("keys_split_past_a_software_adapters_loop_limit") else { return };
    let plain = with(Options { no_subgroups: true, ..Options::default() });
    let software =
        matches!(default.availability(), Availability::Available { kind: DeviceKind::SoftwareGpu, .. });
    for (i, b) in [default, &plain].into_iter().enumerate() {
        let seed = 200 + 10 * i as u64;
        let p = Problem::new(Shape { heads_kv: 1, ..sk(50, 40_000, 2, 64) }, DType::F32).causal();
        let plan = b.plan(&p).unwrap();
        let split = plan.notes.iter().any(|n| n.starts_with("keys split over"));
        assert_eq!(split, software, "{}: {:?}", plan.kernel, plan.notes);
        check(b, &p, seed);
        check(b, &Problem::new(sk(1, 40_000, 1, 128), DType::F16), seed + 1);
        check(b, &Problem::new(Shape { heads_kv: 2, ..sk(3, 33_333, 4, 96) }, DType::F32), seed + 2);
    }
}

/// An invalid setting is an error that names the variable, not a silent default.
#[test]
fn invalid_settings_are_errors() {
    let knob = attn_wgpu::options::ROWS;
    let err = knob.invalid("48");
    assert!(err.to_string().contains("ATTN_WGPU_ROWS"), "{err}");
}

/// The shapes whose 16 invocations per row share scores by subgroup shuffles (the subgroup path
/// of `ATTN_WGPU_ROW_THREADS=16`, timed on the H100) need subgroups of 16 lanes or more; lavapipe
/// has 8 unless its vectors are 512 bits wide (`LP_NATIVE_VECTOR_WIDTH=512`, read when the
/// driver loads). So this runs `sixteen_lane_subgroups_inner` in a child process of this test
/// binary with that setting.
#[test]
fn sixteen_lane_subgroups() {
    let Some(_) = backend("sixteen_lane_subgroups") else { return };
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args(["--ignored", "--exact", "sixteen_lane_subgroups_inner", "--nocapture"])
        .env("LP_NATIVE_VECTOR_WIDTH", "512")
        .output()
        .expect("running the test binary again");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let ran = text.contains("test sixteen_lane_subgroups_inner ... ok");
    assert!(out.status.success() && ran, "the child process failed:\n{text}");
    if let Some(line) = text.lines().find(|l| l.starts_with("SKIPPED")) {
        eprintln!("{line}");
    }
}

#[test]
#[ignore = "run by sixteen_lane_subgroups, in a child process with 16-lane lavapipe subgroups"]
fn sixteen_lane_subgroups_inner() {
    let Some(_) = backend("sixteen_lane_subgroups_inner") else { return };
    let b = with(Options { row_threads: Some(16), ..Options::default() });
    let p = Problem::new(Shape { heads_kv: 2, ..sk(150, 200, 4, 128) }, DType::F32).causal();
    let kernel = b.plan(&p).unwrap().kernel;
    if !kernel.contains("_sg_pshfl_tx16") {
        // CI's lavapipe has them with LP_NATIVE_VECTOR_WIDTH=512: there a skip is a failure.
        let reason = format!("subgroups narrower than 16 lanes here ({kernel})");
        assert!(REQUIRE_WGPU.on_off().unwrap() != Some(true), "{reason}");
        eprintln!("SKIPPED sixteen_lane_subgroups: {reason}");
        return;
    }
    // Probabilities shuffled; GQA, causal with an offset, keys off the tiles; f16; D=64.
    check(&b, &p, 150);
    check(&b, &Problem::new(sk(70, 130, 2, 64), DType::F16).causal(), 151);
    // f32's measured shapes with two row groups' lanes interleaved (8 per row, 16 lanes) and S
    // split over the head dim (the butterfly's shuffles 2 lanes apart), with either number of
    // rows: 128 at D=128 and 64 at D=64 are f32's defaults without a mask.
    for (d, seed) in [(128, 157), (64, 158)] {
        for (rows, extra) in [(64, 0), (128, 10)] {
            let b = with(Options { rows: Some(rows), ..Options::default() });
            let p = Problem::new(Shape { heads_kv: 1, ..sk(150, 290, 2, d) }, DType::F32).causal();
            let kernel = b.plan(&p).unwrap().kernel;
            assert!(kernel.contains("_il2_sd"), "{kernel}");
            check(&b, &p, seed + extra);
            let p = Problem::new(Shape { heads_kv: 2, ..sk(200, 170, 4, d) }, DType::F32);
            check(&b, &p, seed + extra + 20);
        }
    }
}
