//! What a device-resident call costs next to the bare kernel, on this GPU: for each problem, the
//! kernel's time through the host-copy path's timed launch (CUDA events, behind an untimed twin:
//! the bare kernel), the same through `Cuda::run_on_stream` on a caller's stream and buffers
//! (events around one call behind an untimed twin), alternating, medians of 40 each;
//! and the host time one `run_on_stream` call takes (median of calls made while the stream holds
//! one kernel ahead of it), with cudarc's event tracking
//! on (its default) and off (what a framework that orders its own streams sets). Also the free
//! device memory before and after all the calls. One JSON object per line on stdout.
//!
//! `cargo run --release -p attn-cuda --example resident_overhead` (bf16, D=128, 16 heads of
//! 8k tokens in all per call, S = 2k..16k, causal and not).

use attn_core::rng::{SplitMix64, normal_buffer};
use attn_core::{Attention, Buffer, DType, Inputs, Problem, Shape};
use attn_cuda::Cuda;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn upload(stream: &Arc<CudaStream>, b: &Buffer) -> CudaSlice<bf16> {
    let Buffer::Bf16(v) = b else { unreachable!("bf16 inputs") };
    stream.clone_htod(v).expect("copy to the device")
}

fn main() -> attn_core::Result<()> {
    let cuda = Cuda::new();
    let ctx = CudaContext::new(0).map_err(attn_cuda::driver("cuCtxCreate"))?;
    for tracking in [true, false] {
        if !tracking {
            // SAFETY: every stream here is synchronized before its buffers are read or freed.
            unsafe { ctx.disable_event_tracking() };
        }
        let stream = ctx.new_stream().map_err(attn_cuda::driver("cuStreamCreate"))?;
        for seq in [2048, 4096, 8192, 16384] {
            for causal in [false, true] {
                let mut p = Problem::new(Shape::new(16384 / seq, 16, seq, 128), DType::Bf16);
                if causal {
                    p = p.causal();
                }
                let mut rng = SplitMix64::new(seq as u64);
                let x: Vec<Buffer> = p.required_lens()[..3]
                    .iter()
                    .map(|(_, n)| normal_buffer(&mut rng, p.dtype, *n, 1.0))
                    .collect();

                // The bare kernel (the host-copy path's timed launches) and the device path on a
                // caller's buffers and stream, alternating launch by launch, 40 of each.
                let host_plan = cuda.plan(&p)?;
                let inputs = Inputs::new(x[0].as_data(), x[1].as_data(), x[2].as_data());
                let mut prepared = cuda.prepare(&host_plan, inputs)?;
                let plan = cuda.plan_on(&ctx, &p)?;
                let (q, k, v) = (upload(&stream, &x[0]), upload(&stream, &x[1]), upload(&stream, &x[2]));
                let mut o = stream.alloc_zeros::<bf16>(p.required_lens()[3].1).expect("allocate o");
                cuda.run_on_stream(&plan, &q, &k, &v, &mut o, Default::default(), &stream)?;
                stream.synchronize().expect("sync");
                let free_before = ctx.mem_get_info().expect("cuMemGetInfo").0;
                let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
                let (mut bare, mut device, mut host) = (vec![], vec![], vec![]);
                for _ in 0..40 {
                    bare.push(prepared.run_timed()?.as_secs_f64());
                    cuda.run_on_stream(&plan, &q, &k, &v, &mut o, Default::default(), &stream)?;
                    let start = stream.record_event(timed).expect("event");
                    let t = Instant::now();
                    cuda.run_on_stream(&plan, &q, &k, &v, &mut o, Default::default(), &stream)?;
                    host.push(t.elapsed().as_secs_f64());
                    let end = stream.record_event(timed).expect("event");
                    end.synchronize().expect("sync");
                    device.push(f64::from(start.elapsed_ms(&end).expect("elapsed")) / 1e3);
                }
                drop(prepared);
                stream.synchronize().expect("sync");
                let free_after = ctx.mem_get_info().expect("cuMemGetInfo").0;
                let flops = 4.0 * (16384 * 16 * 128) as f64 * seq as f64 / if causal { 2.0 } else { 1.0 };
                let (bare, device) = (median(bare), median(device));
                println!(
                    "{{\"seq\": {seq}, \"causal\": {causal}, \"event_tracking\": {tracking}, \"kernel\": \"{}\", \
                     \"bare_ms\": {:.4}, \"device_path_ms\": {:.4}, \"ratio\": {:.4}, \"host_us_per_call\": {:.2}, \
                     \"bare_tflops\": {:.1}, \"device_free_bytes_change\": {}}}",
                    plan.kernel,
                    bare * 1e3,
                    device * 1e3,
                    device / bare,
                    median(host) * 1e6,
                    flops / bare / 1e12,
                    free_after as i64 - free_before as i64,
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    Ok(())
}
