//! `cargo bench -p attn-cpu`: the CPU path on the shapes of the CPU comparison
//! (B=1, H=16; f32 and bf16; D=64, 128; S=512..4096; causal and not). Throughput is reported in
//! elements = FLOPs by the FlashAttention convention, so criterion's "elem/s" reads as FLOP/s.
//! Filter as usual: `cargo bench -p attn-cpu -- 'f32/d128/s2048'`.

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::{Buffer, DType, Inputs, Outputs, Problem, Shape};
use attn_cpu::Flash;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn flash(c: &mut Criterion) {
    // Under `cargo test` (no `--bench` argument) each benchmark runs once as a smoke test: the
    // smallest length is enough for that.
    let seqs: &[usize] =
        if std::env::args().any(|a| a == "--bench") { &[512, 1024, 2048, 4096] } else { &[512] };
    let backend = Flash::new();
    let mut group = c.benchmark_group("cpu-flash");
    group.sample_size(10);
    for dtype in [DType::F32, DType::Bf16] {
        for d in [64, 128] {
            for &seq in seqs {
                for causal in [false, true] {
                    let mut p = Problem::new(Shape::new(1, 16, seq, d), dtype);
                    if causal {
                        p = p.causal();
                    }
                    let mut rng = SplitMix64::new(1);
                    let [q, k, v, o] = p.required_lens().map(|(_, n)| n);
                    let (q, k, v) = (
                        normal_buffer(&mut rng, dtype, q, 1.0),
                        normal_buffer(&mut rng, dtype, k, 1.0),
                        normal_buffer(&mut rng, dtype, v, 1.0),
                    );
                    let mut out = Buffer::zeros(dtype, o);
                    let plan = attn_core::Attention::plan(&backend, &p).unwrap();
                    group.throughput(Throughput::Elements(p.flops() as u64));
                    let name = format!("{dtype}/d{d}/s{seq}/{}", if causal { "causal" } else { "full" });
                    group.bench_function(name, |bench| {
                        bench.iter(|| {
                            let inputs = Inputs::new(q.as_data(), k.as_data(), v.as_data());
                            let outputs = Outputs { o: out.as_data_mut(), lse: None };
                            backend.run_into(&plan, &inputs, outputs).unwrap();
                        })
                    });
                }
            }
        }
    }
    group.finish();
}

criterion_group!(benches, flash);
criterion_main!(benches);
