//! Human-readable output.

use attn::measure::{Accuracy, Timing};
use attn::{Availability, Plan};

/// What `attn run` measured.
#[derive(serde::Serialize)]
pub struct RunReport {
    pub plan: Plan,
    pub device: String,
    pub seed: u64,
    pub timing: Timing,
    pub gflops: f64,
    pub accuracy: Option<Accuracy>,
}

pub fn run(r: &RunReport) {
    let p = &r.plan.problem;
    println!("attn run: {p}");
    println!("  backend   {} on {}", r.plan.backend, r.device);
    for line in r.plan.to_string().lines().skip(1) {
        println!("  {line}");
    }
    let t = &r.timing;
    println!(
        "  time      {:.3} ms median of {} runs (min {:.3}, max {:.3})",
        t.median_s * 1e3,
        t.runs,
        t.min_s * 1e3,
        t.max_s * 1e3
    );
    let s = p.shape;
    let convention = match p.params.mask {
        _ if !p.batching.is_dense() => "4·H·D per visible (query, key) pair of each sequence",
        attn::Mask::None => "4·B·H·Sq·Sk·D",
        attn::Mask::Causal if s.seq_q == s.seq_k => "4·B·H·Sq·Sk·D / 2",
        _ => "4·B·H·D per visible (query, key) pair",
    };
    println!("  speed     {:.1} GFLOP/s ({convention})", r.gflops);
    match &r.accuracy {
        Some(a) => println!(
            "  accuracy  vs f64 reference on {} rows: max |err| {:.3e}, relative L2 {:.3e}{}  (inputs seed {})",
            a.rows,
            a.max_abs,
            a.rel_l2,
            if a.non_finite > 0 { format!(", {} NON-FINITE", a.non_finite) } else { String::new() },
            r.seed
        ),
        None => println!("  accuracy  not checked (--check-rows 0)"),
    }
}

pub fn backends(all: &[(String, Availability)]) {
    let width = all.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, a) in all {
        match a {
            Availability::Available { device, kind } => {
                println!("{name:width$}  available    {device} ({kind:?})")
            }
            Availability::Unavailable { reason } => println!("{name:width$}  unavailable  {reason}"),
        }
    }
}

/// `attn knobs`: each crate's variables, with the value set here (where one is).
pub fn knobs(all: &[attn::knobs::CrateKnobs]) {
    for c in all {
        println!("{}:", c.krate);
        for k in c.knobs {
            let now = k.value().map_or_else(|| "unset".to_string(), |v| format!("set to {v:?}"));
            println!("  {:<26} {now}; allowed {}; default: {}", k.name, k.allowed, k.default);
            println!("  {:<26} {}", "", k.purpose);
        }
    }
}
