//! Backward timings on this GPU, on the grid: bf16 BHSD, batch = 16384 / S, heads =
//! 2048 / D, D in {64, 128} (or those given), S from 1k to 16k, causal and not. Per row: our
//! forward gives O and the LSE, then `Cuda::backward_timed` runs the three backward launches
//! `iters` times (default 20) on the same buffers; the median of the CUDA-event times, TFLOP/s by
//! FlashAttention's convention (2.5 times the forward's FLOPs, halved for causal), and the device
//! memory the call held and its workspace (the allocator's count), in both modes. Then each mode
//! is run 10 times on one shape per head dim and its gradients compared bit for bit, and the
//! deterministic mode's bits of a sequence alone against the same sequence in a larger grid. One
//! JSON object per line on stdout.
//!
//! `cargo run --release -p attn-cuda --example backward_bench -- [iters] [max_seq] [head_dims] [modes] [min_seq]`
//! (`bench/device/backward.sh` runs it beside PyTorch SDPA's backward on the same shapes).

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::sequences::{KeyStore, OwnedExtras, batch_of};
use attn_core::{
    Attention, BackwardOptions, Buffer, DType, GradInputs, Gradients, Inputs, Outputs, Problem, Shape,
};
use attn_cuda::Cuda;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One problem's buffers: q, k, v, dO, the forward's O and LSE, and the sequences' arrays.
struct Data {
    q: Buffer,
    k: Buffer,
    v: Buffer,
    d_o: Buffer,
    o: Buffer,
    lse: Vec<f32>,
    extras: OwnedExtras,
}

/// Random inputs and dO for `p`, and our forward's O and LSE of them.
fn setup(cuda: &Cuda, p: &Problem, seed: u64) -> attn_core::Result<Data> {
    setup_with(cuda, p, OwnedExtras::default(), seed)
}

/// [`setup`] for a problem whose sequences `extras` describes.
fn setup_with(cuda: &Cuda, p: &Problem, extras: OwnedExtras, seed: u64) -> attn_core::Result<Data> {
    let mut rng = SplitMix64::new(seed);
    let [q, k, v, o] = p.required_lens().map(|(_, n)| n);
    let mut draw = |n: usize| normal_buffer(&mut rng, DType::Bf16, n, 1.0);
    let (q, k, v, d_o) = (draw(q), draw(k), draw(v), draw(o));
    let mut out = Buffer::zeros(DType::Bf16, o);
    let mut lse = vec![0f32; p.lse_len()];
    cuda.forward(
        &p.with_lse(true),
        Inputs::new(q.as_data(), k.as_data(), v.as_data()).with_extras(extras.borrow()),
        Outputs { o: out.as_data_mut(), lse: Some(&mut lse) },
    )?;
    Ok(Data { q, k, v, d_o, o: out, lse, extras })
}

/// The gradients of the last of `runs` backward runs, each run's time (ms), and the device memory
/// the call held and its workspace (bytes).
fn backward(
    cuda: &Cuda,
    p: &Problem,
    data: &Data,
    options: BackwardOptions,
    runs: usize,
) -> attn_core::Result<([Buffer; 3], Vec<f64>, [u64; 2])> {
    let [q, k, v, _] = p.required_lens().map(|(_, n)| n);
    let mut grads =
        [Buffer::zeros(DType::Bf16, q), Buffer::zeros(DType::Bf16, k), Buffer::zeros(DType::Bf16, v)];
    let [dq, dk, dv] = &mut grads;
    let inputs = GradInputs {
        inputs: Inputs::new(data.q.as_data(), data.k.as_data(), data.v.as_data())
            .with_extras(data.extras.borrow()),
        o: data.o.as_data(),
        lse: &data.lse,
        d_o: data.d_o.as_data(),
    };
    let gradients = Gradients { dq: dq.as_data_mut(), dk: dk.as_data_mut(), dv: dv.as_data_mut() };
    let (_, measured) = cuda.backward_timed(p, options, inputs, gradients, runs)?;
    let ms = measured.times.into_iter().map(|t| t.as_secs_f64() * 1e3).collect();
    Ok((grads, ms, [measured.device_bytes, measured.workspace_bytes]))
}

/// Now, in seconds since the Unix epoch: the rows' `t0` and `t1` around their timed runs, which
/// bench/device/clocks.py matches with the GPU's clock samples.
fn unix_seconds() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn main() -> attn_core::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let iters: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let max_seq: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(16384);
    // The shortest sequence timed (default 1024): an A/B of the long rows alone.
    let min_seq: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(1024);
    // The head dims, a comma list of 64, 128 and 256 (e.g. one for a profiled launch); default 64,128.
    let dims: Vec<usize> = match args.get(3) {
        Some(list) => list.split(',').filter_map(|d| d.trim().parse().ok()).collect(),
        None => vec![64, 128],
    };
    // The modes timed: `both` (default), `default` or `deterministic`.
    let modes: &[bool] = match args.get(4).map(String::as_str) {
        None | Some("both") => &[false, true],
        Some("default") => &[false],
        Some("deterministic") => &[true],
        Some(other) => {
            eprintln!("backward_bench: modes `{other}`: expected both, default or deterministic");
            std::process::exit(2);
        }
    };
    if let Err(reason) = attn_cuda::probe() {
        eprintln!("backward_bench: CUDA is unavailable, because {reason}");
        std::process::exit(1);
    }
    let cuda = Cuda::from_env()?;
    for &d in &dims {
        for seq in
            [1024usize, 2048, 4096, 8192, 16384].into_iter().filter(|&s| (min_seq..=max_seq).contains(&s))
        {
            for causal in [false, true] {
                let shape = Shape::new(16384 / seq, 2048 / d, seq, d);
                let mut p = Problem::new(shape, DType::Bf16);
                if causal {
                    p = p.causal();
                }
                let data = setup(&cuda, &p, seq as u64 + d as u64)?;
                for &deterministic in modes {
                    let options = BackwardOptions { deterministic };
                    let t0 = unix_seconds();
                    let (_, times, [held, workspace]) = backward(&cuda, &p, &data, options, iters + 2)?;
                    let t1 = unix_seconds();
                    let ms = median(times[2..].to_vec());
                    let plan = cuda.plan_backward(&p, options)?;
                    println!(
                        "{{\"impl\": \"{}\", \"batch\": {}, \"heads\": {}, \"seq\": {seq}, \"head_dim\": {d}, \
                         \"causal\": {causal}, \"ms\": {ms:.4}, \"tflops\": {:.1}, \"kernel\": \"{}\", \"iters\": {iters}, \
                         \"device_mib\": {:.1}, \"workspace_mib\": {:.1}, \"t0\": {t0:.3}, \"t1\": {t1:.3}}}",
                        if deterministic { "attn-deterministic" } else { "attn" },
                        shape.batch,
                        shape.heads_q,
                        p.backward_flops() / ms / 1e9,
                        plan.kernel,
                        held as f64 / 1048576.0,
                        workspace as f64 / 1048576.0
                    );
                }
            }
        }
    }
    // Bit-identical over 10 runs of the deterministic mode (GQA, causal and not, a sequence not a
    // multiple of the blocks) at each head dim, and the default mode's spread on the same inputs.
    for &d in &dims {
        determinism(&cuda, d)?;
    }
    // The deterministic mode's bits of a sequence alone and in a larger grid, at each head dim.
    let sm_count = attn_cuda::probe().map_or(132, |info| info.sm_count as usize);
    for &d in &dims {
        across_grids(&cuda, d, sm_count)?;
    }
    Ok(())
}

/// Ten runs of each mode on two problems at head dim `d` (causal, and without a mask, where the
/// walks may be rotated): how many give the first one's bits.
fn determinism(cuda: &Cuda, d: usize) -> attn_core::Result<()> {
    let shape = Shape { heads_kv: 2, ..Shape::new(2, 8, 1000, d) };
    for p in [Problem::new(shape, DType::Bf16).causal(), Problem::new(shape, DType::Bf16)] {
        determinism_of(cuda, p)?;
    }
    Ok(())
}

fn determinism_of(cuda: &Cuda, p: Problem) -> attn_core::Result<()> {
    let data = setup(cuda, &p, 7)?;
    for deterministic in [true, false] {
        let options = BackwardOptions { deterministic };
        let bits = |x: &[Vec<f32>; 3]| x.iter().flatten().map(|v| v.to_bits()).collect::<Vec<_>>();
        let first = bits(&backward(cuda, &p, &data, options, 1)?.0.map(|b| b.to_f32_vec()));
        let mut same = 0;
        for _ in 0..9 {
            let next = bits(&backward(cuda, &p, &data, options, 1)?.0.map(|b| b.to_f32_vec()));
            same += usize::from(next == first);
        }
        // The first run's bits hashed (FNV-1a over the 32-bit words of dQ, dK, dV), to compare
        // builds: in the deterministic mode two forms that add dQ in the same order hash the same.
        // (16-bit gradients widened to f32 leave the words' low halves zero, so every hash ends in
        // the same four hex digits; the rest tells the builds apart. Kept so, to compare with the
        // hashes recorded in bench/results.)
        let hash = first
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &w| (h ^ u64::from(w)).wrapping_mul(0x100_0000_01b3));
        println!(
            "{{\"determinism\": \"{}\", \"problem\": \"{p}\", \"runs\": 10, \"identical_to_first\": {}, \"bits\": \"{hash:016x}\"}}",
            if deterministic { "deterministic" } else { "default" },
            same + 1
        );
    }
    Ok(())
}

/// The deterministic mode's gradients of a sequence alone and in a batch that launches a larger
/// grid, bit for bit: (a) dense, batch 3 against its first sequence alone; (b) packed, beside a
/// sequence of more key blocks than the GPU has SMs (which walks aligned, while the first, without
/// a mask, may rotate: its walk is its own length's). The sequence's inputs, O and LSE are the
/// batch's (a forward alone could round differently); each check one JSON line, in the
/// determinism checks' form (`runs` 2: alone and in the batch).
fn across_grids(cuda: &Cuda, d: usize, sm_count: usize) -> attn_core::Result<()> {
    let options = BackwardOptions { deterministic: true };
    let shape = Shape { heads_kv: 2, ..Shape::new(1, 8, 1000, d) };
    let rows = |b: &Buffer, n: usize| Buffer::from_f32(DType::Bf16, b.to_f32_vec()[..n].iter().copied());
    let bits = |b: &Buffer, n: usize| b.to_f32_vec()[..n].iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    // The sequence alone: the batch's leading rows of every buffer, its LSE and its arrays.
    let alone_of = |batch: &Data, one: &Problem, lse: Vec<f32>, extras: OwnedExtras| {
        let [q, k, v, o] = one.required_lens().map(|(_, n)| n);
        Data {
            q: rows(&batch.q, q),
            k: rows(&batch.k, k),
            v: rows(&batch.v, v),
            d_o: rows(&batch.d_o, o),
            o: rows(&batch.o, o),
            lse,
            extras,
        }
    };
    // Its gradients' bits alike in both, over the sequence's rows (the first of each buffer).
    let report = |what: &str,
                  one: &Problem,
                  alone: &Data,
                  big: &Problem,
                  batch: &Data|
     -> attn_core::Result<()> {
        let [q, k, v, _] = one.required_lens().map(|(_, n)| n);
        let (g_one, ..) = backward(cuda, one, alone, options, 1)?;
        let (g_big, ..) = backward(cuda, big, batch, options, 1)?;
        let same =
            [q, k, v].iter().zip(g_one.iter().zip(&g_big)).all(|(&n, (a, b))| bits(a, n) == bits(b, n));
        println!(
            "{{\"determinism\": \"deterministic, across grids\", \"problem\": \"{one} alone and in {big} ({what})\", \
             \"runs\": 2, \"identical_to_first\": {}}}",
            1 + usize::from(same)
        );
        Ok(())
    };
    // (a) Dense, BHSD: the first sequence is the first third of every buffer and of the LSE.
    let one = Problem::new(shape, DType::Bf16);
    let big = Problem::new(Shape { batch: 3, ..shape }, DType::Bf16);
    let batch = setup(cuda, &big, 11)?;
    let alone = alone_of(&batch, &one, batch.lse[..one.lse_len()].to_vec(), OwnedExtras::default());
    report("batch 3, dense", &one, &alone, &big, &batch)?;
    // (b) Packed: the first sequence's rows lead every buffer; the LSE is [head][rows].
    let long = (sm_count + 8) * 128;
    let (big, extras) = batch_of(shape, DType::Bf16, &[1000, long], &[1000, long], KeyStore::Packed);
    let (one, one_extras) = batch_of(shape, DType::Bf16, &[1000], &[1000], KeyStore::Packed);
    let batch = setup_with(cuda, &big, extras, 13)?;
    let total = 1000 + long;
    let lse =
        (0..shape.heads_q).flat_map(|h| batch.lse[h * total..h * total + 1000].iter().copied()).collect();
    let alone = alone_of(&batch, &one, lse, one_extras);
    let what = format!("packed beside {long} keys, more key blocks than the GPU's {sm_count} SMs");
    report(&what, &one, &alone, &big, &batch)
}
