//! Timing and accuracy measurement shared by `attn run`, `attn bench` and the examples.

use attn_core::rng::SplitMix64;
use attn_core::{Attention, Buffer, GradInputs, Gradients, Inputs, Outputs, Plan, Problem, Result};
use attn_cpu::Reference;
use rayon::prelude::*;
use std::time::Duration;

/// Checks that the host buffers [`random_inputs`] and an output for `problem` take (q, k, v
/// and o, and an f32 copy of one tensor while it is drawn) fit in the memory available now, so
/// that a problem too large for this machine is an [`attn_core::Error::TooLarge`] before
/// anything is allocated, not an abort. Where the available memory cannot be read (not Linux),
/// only the sizes are checked ([`Problem::validate`]).
pub fn check_host_memory(problem: &Problem) -> Result<()> {
    check_host_buffers(problem, false)
}

/// [`check_host_memory`] for a backward pass: its buffers are the forward's with the LSE, dO and
/// the three gradients besides.
pub fn check_host_memory_backward(problem: &Problem) -> Result<()> {
    check_host_buffers(&problem.with_lse(true), true)
}

fn check_host_buffers(problem: &Problem, backward: bool) -> Result<()> {
    problem.validate()?;
    let lens = problem.required_lens().map(|(_, n)| n as u128);
    let largest = lens.iter().copied().max().unwrap_or(0);
    // dO as o, dq, dk and dv as q, k and v.
    let gradients = if backward { lens.iter().sum::<u128>() * problem.dtype.size() as u128 } else { 0 };
    let needed = problem.bytes() + gradients + 4 * largest;
    let what = if backward { "q, k, v, o, the LSE, dO and the three gradients" } else { "q, k, v and o" };
    match available_memory() {
        Some(available) if needed > available => Err(attn_core::Error::TooLarge {
            what: format!(
                "{problem}: its host buffers ({what} and an f32 copy of one while the inputs are drawn) \
                 need {needed} bytes, but {available} bytes of memory are available"
            ),
        }),
        _ => Ok(()),
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes: what can be allocated without swapping.
fn available_memory() -> Option<u128> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Random inputs for a problem: q, k, v drawn from N(0, 1) and rounded to its dtype. Drawn on
/// every core in chunks of 2^20 values, each chunk from its own stream, seeded in order from
/// `seed`: the same seed gives the same inputs on any machine and thread count. (The GPU grid's
/// tensors hold 2^25 values each; drawn one after another they took seconds per shape.)
pub fn random_inputs(problem: &Problem, seed: u64) -> [Buffer; 3] {
    const CHUNK: usize = 1 << 20;
    let mut seeds = SplitMix64::new(seed);
    let lens = problem.required_lens();
    [0, 1, 2].map(|t| {
        let len = lens[t].1;
        let chunks: Vec<(usize, u64)> = (0..len.div_ceil(CHUNK)).map(|i| (i, seeds.next_u64())).collect();
        let values: Vec<f32> = chunks
            .into_par_iter()
            .flat_map_iter(|(i, s)| {
                let mut rng = SplitMix64::new(s);
                (0..CHUNK.min(len - i * CHUNK)).map(move |_| rng.normal() as f32)
            })
            .collect();
        Buffer::from_f32(problem.dtype, values)
    })
}

/// Borrows three buffers as [`Inputs`].
pub fn inputs(bufs: &[Buffer; 3]) -> Inputs<'_> {
    Inputs::new(bufs[0].as_data(), bufs[1].as_data(), bufs[2].as_data())
}

/// Median, minimum and maximum of repeated timings, and every run in order.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Timing {
    /// Median seconds.
    pub median_s: f64,
    /// Fastest run, seconds.
    pub min_s: f64,
    /// Slowest run, seconds.
    pub max_s: f64,
    /// Timed runs.
    pub runs: usize,
    /// Each timed run, seconds, in the order they ran.
    pub each_s: Vec<f64>,
    /// Device memory the prepared call held, as measured by the backend
    /// ([`attn_core::Prepared::device_bytes`]).
    pub device_bytes: Option<u64>,
}

/// The default least wall-clock time spent warming up before timed runs (`attn bench
/// --min-warmup-ms`): a device left idle while the host prepared the inputs needs a moment to
/// reach full speed. The peer scripts in `bench/peers/` warm up by the same rule.
pub const MIN_WARMUP: Duration = Duration::from_millis(200);

/// Runs `backend` on `inputs` untimed `warmup` times and for at least `min_warmup` (see
/// [`MIN_WARMUP`]), then `runs` times timed (the backend's own device-side timing,
/// [`attn_core::Prepared::run_timed`], the warm-up the same way), and leaves the output of the
/// last run in `outputs`.
pub fn time(
    backend: &dyn Attention,
    plan: &Plan,
    inputs: Inputs<'_>,
    outputs: Outputs<'_>,
    warmup: usize,
    min_warmup: Duration,
    runs: usize,
) -> Result<Timing> {
    let mut prepared = backend.prepare(plan, inputs)?;
    let mut timing = repeat(warmup, min_warmup, runs, || prepared.run_timed())?;
    prepared.read(outputs)?;
    timing.device_bytes = prepared.device_bytes();
    Ok(timing)
}

/// `once` untimed `warmup` times and for at least `min_warmup`, then `runs` times (at least once)
/// timed, each run's time as `once` returns it.
fn repeat(
    warmup: usize,
    min_warmup: Duration,
    runs: usize,
    mut once: impl FnMut() -> Result<Duration>,
) -> Result<Timing> {
    let start = std::time::Instant::now();
    let mut warmed = 0;
    while warmed < warmup || start.elapsed() < min_warmup {
        once()?;
        warmed += 1;
    }
    let mut times: Vec<Duration> = (0..runs.max(1)).map(|_| once()).collect::<Result<_>>()?;
    let each_s = times.iter().map(Duration::as_secs_f64).collect();
    times.sort();
    Ok(Timing {
        median_s: times[times.len() / 2].as_secs_f64(),
        min_s: times[0].as_secs_f64(),
        max_s: times[times.len() - 1].as_secs_f64(),
        runs: times.len(),
        each_s,
        device_bytes: None,
    })
}

/// The backward pass of `plan` (from [`Attention::plan_backward`]) on `inputs`, untimed `warmup`
/// times and for at least `min_warmup`, then `runs` times timed by the wall clock around each
/// [`Attention::run_backward`]: a call through host memory, so a GPU backend's uploads and
/// read-back are in the time. The gradients of the last run are left in `grads` (dq, dk, dv).
pub fn time_backward(
    backend: &dyn Attention,
    plan: &Plan,
    inputs: GradInputs<'_>,
    grads: &mut [Buffer; 3],
    warmup: usize,
    min_warmup: Duration,
    runs: usize,
) -> Result<Timing> {
    repeat(warmup, min_warmup, runs, || {
        let [dq, dk, dv] = &mut *grads;
        let gradients = Gradients { dq: dq.as_data_mut(), dk: dk.as_data_mut(), dv: dv.as_data_mut() };
        let start = std::time::Instant::now();
        backend.run_backward(plan, inputs, gradients)?;
        Ok(start.elapsed())
    })
}

/// Error of an output against the f64 reference on a sample of rows.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Accuracy {
    /// Rows compared.
    pub rows: usize,
    /// Largest |out − ref|.
    pub max_abs: f64,
    /// ‖out − ref‖₂ / ‖ref‖₂ over the sampled rows.
    pub rel_l2: f64,
    /// Elements that are NaN or infinite.
    pub non_finite: usize,
}

/// Compares `rows` query rows of `o` (spread evenly over every (sequence, head, row) the problem
/// has, always including the first and last) with [`Reference::row`].
pub fn accuracy(problem: &Problem, inputs: &Inputs<'_>, o: &Buffer, rows: usize) -> Result<Accuracy> {
    let map = problem.seq_map(inputs.extras)?;
    let all: Vec<(usize, usize, usize)> = map.rows().collect();
    let total = all.len().max(1);
    let rows = rows.clamp(1, total).min(all.len());
    let picks: Vec<(usize, usize, usize)> =
        (0..rows).map(|r| all[if rows == 1 { 0 } else { r * (total - 1) / (rows - 1) }]).collect();
    let o = o.as_data();
    let (mut diff2, mut ref2, mut max_abs, mut non_finite) = (0.0, 0.0, 0.0f64, 0);
    let results = picks
        .par_iter()
        .map(|&(b, h, i)| Ok((Reference::row(problem, inputs, b, h, i)?, map.o_offset(b, h, i))))
        .collect::<Result<Vec<_>>>()?;
    for (want, off) in results {
        for (d, w) in want.o.iter().enumerate() {
            let x = o.get_f32(off + d) as f64;
            if !x.is_finite() {
                non_finite += 1;
                continue;
            }
            diff2 += (x - w) * (x - w);
            ref2 += w * w;
            max_abs = max_abs.max((x - w).abs());
        }
    }
    let rel_l2 = if ref2 > 0.0 { (diff2 / ref2).sqrt() } else { diff2.sqrt() };
    Ok(Accuracy { rows, max_abs, rel_l2, non_finite })
}
