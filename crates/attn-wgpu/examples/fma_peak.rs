//! The adapter's f32 fused-multiply-add rate through wgpu: the ceiling the wgpu backend's f32
//! figures are read against ("50% of the measured FMA peak" in docs/performance.md).
//!
//! Every invocation runs eight independent vec4 FMA chains (32 FMAs, 64 FLOPs per step) for
//! `STEPS` steps, and writes their sum so that nothing is optimised away. The shader is built
//! without naga's loop caps (as the backend's kernels are: see `attn_wgpu::options::Checks`),
//! which would otherwise add a counter and a test to every step. Timed with GPU timestamps where
//! the adapter has them, else the host clock; prints the median of the timed runs.
//!
//! `cargo run --release -p attn-wgpu --example fma_peak [workgroups] [bytes] [chains] [threads]`
//! (threads per workgroup: 32 to 256, default 256)
//!
//! As a residency probe (how many workgroups the driver runs at once on an SM, by workgroup
//! memory): `bytes` of workgroup memory per workgroup (a vec4 array each invocation writes and,
//! after a barrier, reads a neighbour's element of), and `chains` (default 8) independent vec4
//! chains; `chains` = 0 runs one scalar chain, so that each invocation waits on every FMA and
//! an SM needs many resident warps to fill its FMA pipes: the time of `132·k` workgroups then
//! stays flat while `k` workgroups fit at once per SM. `bench/device/wgpu-residency.sh` runs that
//! grid.

use std::time::Instant;

const STEPS: u32 = 4096;

fn shader(chains: u32, bytes: u32, threads: u32) -> String {
    let (ty, chains) = if chains == 0 { ("f32", 1) } else { ("vec4<f32>", chains) };
    let decl: String = (0..chains).map(|i| format!("    var a{i} = {ty}(seed + {i}.0);\n")).collect();
    let step: String = (0..chains).map(|i| format!("        a{i} = fma(a{i}, m, c);\n")).collect();
    let sum = (0..chains).map(|i| format!("a{i}")).collect::<Vec<_>>().join(" + ");
    let n = bytes / 16;
    let (pad_decl, pad_use) = if n == 0 {
        (String::new(), String::new())
    } else {
        (
            format!("var<workgroup> pad: array<vec4<f32>, {n}>;\n"),
            format!(
                "    pad[lid % {n}u] = vec4<f32>(f32(lid));\n    workgroupBarrier();\n    \
                 let seed = f32(g.x) * 1e-9 + pad[(lid + 1u) % {n}u].x * 1e-12;\n"
            ),
        )
    };
    let seed = if n == 0 { "    let seed = f32(g.x) * 1e-9;\n" } else { "" };
    format!(
        "@group(0) @binding(0) var<storage, read_write> out: array<vec4<f32>>;\n\
         {pad_decl}\
         @compute @workgroup_size({threads})\n\
         fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n\
         {pad_use}{seed}\
         \x20   let m = {ty}(0.999999);\n\
         \x20   let c = {ty}(1e-7);\n\
         {decl}\
         \x20   for (var i = 0u; i < {STEPS}u; i++) {{\n\
         {step}\
         \x20   }}\n\
         \x20   out[g.x] = vec4<f32>({sum});\n\
         }}\n"
    )
}

fn main() {
    let arg =
        |i: usize, default: u32| std::env::args().nth(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (workgroups, bytes, chains, threads) =
        (arg(1, 4096), arg(2, 0), arg(3, 8), arg(4, 256).clamp(32, 256));
    if !(1..=65535).contains(&workgroups) {
        eprintln!("fma_peak: workgroups must be 1..=65535 (one dispatch dimension), not {workgroups}");
        std::process::exit(2);
    }
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let Ok(adapter) = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    })) else {
        println!("SKIPPED fma_peak: no adapter");
        return;
    };
    let timestamps = adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: if timestamps { wgpu::Features::TIMESTAMP_QUERY } else { wgpu::Features::empty() },
        ..Default::default()
    }))
    .expect("a device on the adapter just found");
    if bytes > adapter.limits().max_compute_workgroup_storage_size {
        eprintln!("fma_peak: {bytes} B of workgroup memory is over the adapter's limit");
        std::process::exit(2);
    }
    let source = shader(chains, bytes, threads);
    // SAFETY: the one loop is bounded by a constant, `out` is indexed by the invocation id,
    // which the dispatch keeps below its length, and `pad` modulo its length.
    let module = unsafe {
        device.create_shader_module_trusted(
            wgpu::ShaderModuleDescriptor {
                label: Some("fma_peak"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            },
            wgpu::ShaderRuntimeChecks::unchecked(),
        )
    };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("fma_peak"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let out = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("out"),
        size: workgroups as u64 * threads as u64 * 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry { binding: 0, resource: out.as_entire_binding() }],
    });
    let queries = timestamps.then(|| {
        device.create_query_set(&wgpu::QuerySetDescriptor {
            label: None,
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        })
    });
    let buffer = |usage| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 16,
            usage,
            mapped_at_creation: false,
        })
    };
    let resolve = buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
    let readback = buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);

    let lanes = if chains == 0 { 1 } else { 4 * chains }; // FMAs per step
    let flops = 2.0 * lanes as f64 * STEPS as f64 * (workgroups * threads) as f64;
    let mut seconds = Vec::new();
    for run in 0..13 {
        let start = Instant::now();
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: queries.as_ref().map(|q| wgpu::ComputePassTimestampWrites {
                    query_set: q,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(workgroups, 1, 1);
        }
        if let Some(q) = &queries {
            encoder.resolve_query_set(q, 0..2, &resolve, 0);
            encoder.copy_buffer_to_buffer(&resolve, 0, &readback, 0, 16);
        }
        queue.submit([encoder.finish()]);
        device.poll(wgpu::PollType::wait_indefinitely()).expect("the dispatch completes");
        let mut secs = start.elapsed().as_secs_f64();
        if queries.is_some() {
            readback.map_async(wgpu::MapMode::Read, .., |r| r.expect("timestamps map"));
            device.poll(wgpu::PollType::wait_indefinitely()).expect("the map completes");
            let ticks: [u64; 2] = {
                let view = readback.get_mapped_range(..).expect("mapped");
                bytemuck::pod_read_unaligned(&view[..16])
            };
            readback.unmap();
            secs = ticks[1].saturating_sub(ticks[0]) as f64 * queue.get_timestamp_period() as f64 * 1e-9;
        }
        if run >= 3 {
            seconds.push(secs); // the first three warm up
        }
    }
    seconds.sort_by(f64::total_cmp);
    let median = seconds[seconds.len() / 2];
    println!(
        "{}: f32 FMA {:.2} TFLOP/s (median of {} runs, {:.3} ms each, {} workgroups of {threads}, \
         {bytes} B workgroup memory, {chains} chains, {} clock)",
        adapter.get_info().name,
        flops / median / 1e12,
        seconds.len(),
        median * 1e3,
        workgroups,
        if timestamps { "GPU timestamp" } else { "host" }
    );
}
