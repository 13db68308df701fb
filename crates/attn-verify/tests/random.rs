//! Randomized differential testing (issue 35): problems drawn over every feature, on every
//! backend here (and each variant a knob or the CPU selects) against the f64 reference; a
//! failure is shrunk to the smallest problem that still fails. `ATTN_RANDOM_CASES` and
//! `ATTN_RANDOM_GPU_CASES` set how many (`attn_verify::random::KNOBS`), `ATTN_RANDOM_SEED` the
//! draw.

mod common;

use attn_core::{Attention, Availability, DType, Inputs, Numerics, Plan, Prepared, Problem};
use attn_verify::planted::{Flaw, Planted};
use attn_verify::random::{self, Pass, Rows};
use std::time::Duration;

fn setting(knob: attn_core::Knob) -> Option<u64> {
    knob.parse(|v| v.trim().parse().ok()).unwrap_or_else(|e| panic!("{e}"))
}

/// A backend under a name of its own, so that a variant's failures and counts are its own.
struct Labeled {
    inner: Box<dyn Attention>,
    label: String,
}

impl Attention for Labeled {
    fn name(&self) -> &str {
        &self.label
    }
    fn availability(&self) -> Availability {
        self.inner.availability()
    }
    fn numerics(&self, dtype: DType) -> Numerics {
        self.inner.numerics(dtype)
    }
    fn plan(&self, problem: &Problem) -> attn_core::Result<Plan> {
        self.inner.plan(problem)
    }
    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> attn_core::Result<Box<dyn Prepared + 'a>> {
        self.inner.prepare(plan, inputs)
    }
}

/// Backends of a group.
type Backends = Vec<Box<dyn Attention>>;

fn labeled(inner: Box<dyn Attention>, variant: &str) -> Box<dyn Attention> {
    let label = format!("{}/{variant}", inner.name());
    Box::new(Labeled { inner, label })
}

/// The backends available here but the reference itself, in two groups: those on the CPU
/// (cpu-flash and its other instruction sets) and the GPU ones (wgpu, and wgpu without
/// subgroups), which take far longer a case on a software adapter.
fn backends(test: &str) -> (Backends, Backends) {
    let (mut cpu, mut gpu) = (vec![], vec![]);
    for b in common::available(test).into_iter().filter(|b| b.name() != "cpu-reference") {
        if b.name().starts_with("cpu") { cpu.push(b) } else { gpu.push(b) }
    }
    let best = attn_cpu::Isa::supported().into_iter().next();
    for isa in attn_cpu::Isa::supported().into_iter().filter(|&i| Some(i) != best) {
        cpu.push(labeled(
            Box::new(attn_cpu::Flash::new().with_isa(isa).expect("a supported ISA")),
            isa.name(),
        ));
    }
    if gpu.iter().any(|b| b.name() == "wgpu") {
        let options = attn_wgpu::Options { no_subgroups: true, ..attn_wgpu::Options::default() };
        gpu.push(labeled(Box::new(attn_wgpu::Wgpu::with_options(options)), "no-subgroups"));
    }
    (cpu, gpu)
}

/// Draws `cases` random cases on `backends` and fails with the smallest failing one.
fn soak(what: &str, backends: &[Box<dyn Attention>], pass: Pass, cases: usize, seed: u64) {
    if backends.is_empty() {
        return;
    }
    let refs: Vec<&dyn Attention> = backends.iter().map(|b| b.as_ref()).collect();
    let tally = random::soak(&refs, pass, cases, Duration::from_secs(3600), seed);
    eprintln!("random cases, {what}: {} drawn with ATTN_RANDOM_SEED={seed}", tally.cases);
    eprintln!("  inputs and the f64 reference {:.1} s", tally.reference.as_secs_f64());
    for (name, ran, skipped, time) in &tally.ran {
        eprintln!(
            "  {name:<22} {ran} ran, {skipped} refused by its plan (skipped), {:.1} s",
            time.as_secs_f64()
        );
    }
    if let Some((spec, why)) = tally.failure {
        panic!("{why}\nthe smallest failing case (ATTN_RANDOM_SEED={seed} repeats the draw): {spec:#?}");
    }
    assert_eq!(tally.cases, cases);
    for (name, ran, _, _) in &tally.ran {
        assert!(*ran * 2 >= cases, "{name} ran only {ran} of {cases} cases");
    }
}

#[test]
fn random_problems_agree_with_the_reference_on_every_backend() {
    let (cpu, gpu) = backends("random_problems_agree_with_the_reference_on_every_backend");
    let seed = setting(random::SEED).unwrap_or_else(random::clock_seed);
    let cases = setting(random::CASES).unwrap_or(random::CI_CASES as u64) as usize;
    soak("CPU backends", &cpu, Pass::Forward, cases, seed);
    let gpu_cases = setting(random::GPU_CASES).unwrap_or(random::CI_GPU_CASES as u64) as usize;
    soak("GPU backends", &gpu, Pass::Forward, gpu_cases, seed);
}

#[test]
fn planted_bugs_are_found_and_shrunk_to_their_smallest_case() {
    // A wrong K/V head shows only with several K/V heads and several query heads a group.
    let wrong_head = Planted::new(Flaw::WrongKvHead);
    let tally = random::soak(&[&wrong_head], Pass::Forward, 200, Duration::from_secs(300), 7);
    let (spec, why) = tally.failure.expect("the random cases catch a wrong K/V head");
    assert!(why.contains("planted-WrongKvHead"), "{why}");
    assert_eq!((spec.heads_kv, spec.group, spec.batch), (2, 2, 1), "shrunk: {spec:#?}");
    assert!(spec.seq_q == 1 && spec.seq_k == 1 && spec.head_dim == 8, "shrunk: {spec:#?}");
    // A top-left causal diagonal shows only with fewer queries than keys, under a causal mask.
    let top_left = Planted::new(Flaw::TopLeftCausal);
    let tally = random::soak(&[&top_left], Pass::Forward, 200, Duration::from_secs(300), 7);
    let (spec, _) = tally.failure.expect("the random cases catch a top-left causal diagonal");
    assert_eq!(spec.mask, attn_core::Mask::Causal, "shrunk: {spec:#?}");
    assert!(spec.seq_q < spec.seq_k && spec.seq_k <= 2, "shrunk: {spec:#?}");
    // A block table ignored shows only in a paged cache.
    let in_order = Planted::new(Flaw::PagesInOrder);
    let tally = random::soak(&[&in_order], Pass::Forward, 400, Duration::from_secs(300), 7);
    let (spec, _) = tally.failure.expect("the random cases catch a block table ignored");
    assert!(matches!(spec.rows, Rows::Paged(_)), "shrunk: {spec:#?}");
}
