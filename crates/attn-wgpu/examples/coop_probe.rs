//! Checks, on one adapter, what the cooperative-matrix kernel takes for granted: how `coopLoad`,
//! `coopLoadT` and `coopStoreT` lay out 16×16 matrices in workgroup memory, that f16 × f16 + f32
//! products come out right, and that a matrix survives a trip through workgroup memory in which
//! each lane scales its own elements (the kernel's rescale), that a matrix variable declared
//! with the zero value starts at zero, that one carried through a loop accumulates, and the
//! kernel's O rescale with 64-key tiles (four matrices in 64-wide rows, one row scaled by 0,
//! reloaded), which fails verification on the H100 while 32-key tiles pass. Each case is
//! computed on the host too and the largest difference printed; inputs are small integers, so
//! every result is exact.
//!
//! `ATTN_WGPU_COOP` is not needed: this opens its own device with the experimental feature.
//! `cargo run --release -p attn-wgpu --example coop_probe`

const N: usize = 16;
/// Row stride of the matrices in workgroup memory: wider than a matrix, as in the kernel.
const STRIDE: usize = 48;

const SHADER: &str = r#"
enable f16;
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> a_in: array<f32>;
@group(0) @binding(1) var<storage, read> b_in: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
const N: u32 = 16u;
const S: u32 = 48u;
var<workgroup> ah: array<f16, 768>;
var<workgroup> bh: array<f16, 768>;
var<workgroup> c32: array<f32, 768>;
// Four C matrices side by side in 64-wide rows, as the kernel's O rescale with 64-key tiles.
var<workgroup> wide: array<f32, 1024>;

fn copy_out(which: u32, l: u32) {
    for (var i = l; i < N * N; i += 32u) {
        out[which * N * N + i] = c32[(i / N) * S + 16u + i % N];
    }
}

@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) l: u32) {
    // A and B (row-major 16x16 on the host) at column 16 of 48-wide rows.
    for (var i = l; i < N * N; i += 32u) {
        ah[(i / N) * S + 16u + i % N] = f16(a_in[i]);
        bh[(i / N) * S + 16u + i % N] = f16(b_in[i]);
    }
    workgroupBarrier();
    let a = coopLoadT<coop_mat16x16<f16, A>>(&ah[16], S);
    // Case 0: B row-major: A·B.
    let b = coopLoadT<coop_mat16x16<f16, B>>(&bh[16], S);
    var c = coopMultiplyAdd(a, b, coop_mat16x16<f32, C>());
    coopStoreT(c, &c32[16], S);
    workgroupBarrier();
    copy_out(0u, l);
    workgroupBarrier();
    // Case 1: B column-major: A·Bᵀ.
    let bt = coopLoad<coop_mat16x16<f16, B>>(&bh[16], S);
    c = coopMultiplyAdd(a, bt, coop_mat16x16<f32, C>());
    coopStoreT(c, &c32[16], S);
    workgroupBarrier();
    copy_out(1u, l);
    workgroupBarrier();
    // Case 2: A·B through workgroup memory, each lane scaling half of row l/2 by (row + 1),
    // reloaded as C, and A·B added once more: (row + 2)·A·B.
    c = coopMultiplyAdd(a, b, coop_mat16x16<f32, C>());
    coopStoreT(c, &c32[16], S);
    workgroupBarrier();
    let row = l / 2u;
    for (var j = (l % 2u) * 8u; j < (l % 2u) * 8u + 8u; j++) {
        c32[row * S + 16u + j] = c32[row * S + 16u + j] * f32(row + 1u);
    }
    workgroupBarrier();
    c = coopLoadT<coop_mat16x16<f32, C>>(&c32[16], S);
    workgroupBarrier();
    c = coopMultiplyAdd(a, b, c);
    coopStoreT(c, &c32[16], S);
    workgroupBarrier();
    copy_out(2u, l);
    workgroupBarrier();
    // Case 3: a scalar times a matrix: 0.5·A·B.
    c = 0.5 * coopMultiplyAdd(a, b, coop_mat16x16<f32, C>());
    coopStoreT(c, &c32[16], S);
    workgroupBarrier();
    copy_out(3u, l);
    workgroupBarrier();
    // Case 4: a variable initialised to the zero matrix (naga: an OpVariable initializer), then
    // accumulated into once: A·B.
    var z = coop_mat16x16<f32, C>();
    z = coopMultiplyAdd(a, b, z);
    coopStoreT(z, &c32[16], S);
    workgroupBarrier();
    copy_out(4u, l);
    workgroupBarrier();
    // Case 5: a product carried through a loop (zero only as an operand): 3·A·B.
    var acc = coopMultiplyAdd(a, b, coop_mat16x16<f32, C>());
    for (var i = 0u; i < 2u; i++) {
        acc = coopMultiplyAdd(a, b, acc);
    }
    coopStoreT(acc, &c32[16], S);
    workgroupBarrier();
    copy_out(5u, l);
    workgroupBarrier();
    // Cases 6-9: the kernel's rescale with 64-key tiles. Blocks j = 0..3 hold (j + 1)·A·B side
    // by side at stride 64; each lane scales its half of one row (32 columns) by 0 for row 4
    // (a row whose max jumped) and 1 otherwise; reloaded, and A·B added to each block.
    let ab = coopMultiplyAdd(a, b, coop_mat16x16<f32, C>());
    coopStoreT(ab, &wide[0], 64u);
    coopStoreT(2.0 * ab, &wide[16], 64u);
    coopStoreT(3.0 * ab, &wide[32], 64u);
    coopStoreT(4.0 * ab, &wide[48], 64u);
    workgroupBarrier();
    let scale = select(1.0, 0.0, row == 4u);
    for (var c = (l % 2u) * 32u; c < (l % 2u + 1u) * 32u; c += 4u) {
        wide[row * 64u + c] = wide[row * 64u + c] * scale;
        wide[row * 64u + c + 1u] = wide[row * 64u + c + 1u] * scale;
        wide[row * 64u + c + 2u] = wide[row * 64u + c + 2u] * scale;
        wide[row * 64u + c + 3u] = wide[row * 64u + c + 3u] * scale;
    }
    workgroupBarrier();
    let w0 = coopMultiplyAdd(a, b, coopLoadT<coop_mat16x16<f32, C>>(&wide[0], 64u));
    let w1 = coopMultiplyAdd(a, b, coopLoadT<coop_mat16x16<f32, C>>(&wide[16], 64u));
    let w2 = coopMultiplyAdd(a, b, coopLoadT<coop_mat16x16<f32, C>>(&wide[32], 64u));
    let w3 = coopMultiplyAdd(a, b, coopLoadT<coop_mat16x16<f32, C>>(&wide[48], 64u));
    workgroupBarrier();
    coopStoreT(w0, &wide[0], 64u);
    coopStoreT(w1, &wide[16], 64u);
    coopStoreT(w2, &wide[32], 64u);
    coopStoreT(w3, &wide[48], 64u);
    workgroupBarrier();
    for (var i = l; i < 4u * N * N; i += 32u) {
        let block = i / (N * N);
        let e = i % (N * N);
        out[(6u + block) * N * N + e] = wide[(e / N) * 64u + block * 16u + e % N];
    }
}
"#;

fn main() {
    assert_eq!(STRIDE, 48, "the shader's S");
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let Ok(adapter) = pollster::block_on(instance.request_adapter(&Default::default())) else {
        println!("SKIPPED coop_probe: no adapter");
        return;
    };
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    if !adapter.features().contains(needed) {
        println!("SKIPPED coop_probe: {} offers no cooperative matrices with f16", adapter.get_info().name);
        return;
    }
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: needed,
        // SAFETY: a probe of the experimental feature, which is what it is for.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        ..Default::default()
    }))
    .expect("a device with the features the adapter offers");
    device.on_uncaptured_error(std::sync::Arc::new(|e: wgpu::Error| eprintln!("wgpu error: {e}")));

    let a: Vec<f32> = (0..N * N).map(|i| ((i * 7 + 3) % 9) as f32 - 4.0).collect();
    let b: Vec<f32> = (0..N * N).map(|i| ((i * 5 + 1) % 7) as f32 - 3.0).collect();
    let mm = |transpose_b: bool| -> Vec<f32> {
        let mut c = vec![0.0; N * N];
        for i in 0..N {
            for j in 0..N {
                c[i * N + j] = (0..N)
                    .map(|k| a[i * N + k] * if transpose_b { b[j * N + k] } else { b[k * N + j] })
                    .sum();
            }
        }
        c
    };
    let ab = mm(false);
    // Cases 6-9: block j is (j + 2)·A·B, but only A·B in row 4 (scaled by 0 before the add).
    let rescaled = |j: usize| -> Vec<f32> {
        (0..N * N).map(|i| if i / N == 4 { ab[i] } else { ab[i] * (j as f32 + 2.0) }).collect()
    };
    let cases: [(&str, Vec<f32>); 10] = [
        ("A·B (coopLoadT for B)", ab.clone()),
        ("A·Bᵀ (coopLoad for B)", mm(true)),
        (
            "lane-scaled trip through workgroup memory",
            (0..N * N).map(|i| ab[i] * ((i / N) as f32 + 2.0)).collect(),
        ),
        ("0.5 · A·B", ab.iter().map(|x| 0.5 * x).collect()),
        ("A·B into a zero-initialised variable", ab.clone()),
        ("3 · A·B carried through a loop", ab.iter().map(|x| 3.0 * x).collect()),
        ("64-wide rescale trip, block 0", rescaled(0)),
        ("64-wide rescale trip, block 1", rescaled(1)),
        ("64-wide rescale trip, block 2", rescaled(2)),
        ("64-wide rescale trip, block 3", rescaled(3)),
    ];

    use wgpu::util::DeviceExt;
    let input = |data: &[f32]| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytemuck::cast_slice(data),
            usage: wgpu::BufferUsages::STORAGE,
        })
    };
    let (a_buf, b_buf) = (input(&a), input(&b));
    let size = (cases.len() * N * N * 4) as u64;
    let out = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("coop_probe"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("coop_probe"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: a_buf.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: b_buf.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 2, resource: out.as_entire_binding() },
        ],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    encoder.copy_buffer_to_buffer(&out, 0, &read, 0, size);
    queue.submit([encoder.finish()]);
    read.map_async(wgpu::MapMode::Read, .., |r| r.expect("readback maps"));
    device.poll(wgpu::PollType::wait_indefinitely()).expect("the probe completes");
    let got: Vec<f32> = bytemuck::cast_slice(&read.get_mapped_range(..).expect("mapped")).to_vec();

    println!("{}: cooperative matrices, 16x16x16 f16 x f16 + f32", adapter.get_info().name);
    for (case, (name, want)) in cases.iter().enumerate() {
        let got = &got[case * N * N..(case + 1) * N * N];
        let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        let verdict = if worst == 0.0 { "ok" } else { "WRONG" };
        println!("  {verdict:<5} {name}: max |got - want| = {worst}");
        if worst != 0.0 {
            println!("        got  row 0: {:?}", &got[..N]);
            println!("        want row 0: {:?}", &want[..N]);
        }
    }
}
