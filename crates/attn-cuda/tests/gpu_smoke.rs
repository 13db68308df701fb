//! Runs the smoke kernels on a real GPU: compile, load, launch with pointer arguments and with a
//! by-value parameter struct, time, read back. Prints `SKIPPED` where there is no GPU (fails
//! instead with `ATTN_REQUIRE_CUDA=on`).

use attn_cuda::{CompileRequest, Gpu, driver, probe};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

const SMOKE: &str = include_str!("../kernels/smoke.cu");

/// Mirrors `struct SmokeParams` in `kernels/smoke.cu`.
#[repr(C)]
#[derive(Clone, Copy)]
struct SmokeParams {
    x: u64,
    y: u64,
    n: u32,
    factor: f32,
}

// SAFETY: plain data with the C layout the kernel declares.
unsafe impl DeviceRepr for SmokeParams {}

#[test]
fn smoke_kernels_run_on_the_gpu() -> attn_core::Result<()> {
    let info = match probe() {
        Ok(info) => info,
        Err(reason) if attn_cuda::options::REQUIRE_CUDA.on_off()? == Some(true) => {
            panic!("a CUDA device is required (ATTN_REQUIRE_CUDA=on) but unavailable: {reason}")
        }
        Err(reason) => {
            println!("SKIPPED smoke_kernels_run_on_the_gpu: {reason}");
            return Ok(());
        }
    };
    println!("device: {info}, limits: {:?}", info.limits);
    let gpu = Gpu::open(0)?;
    let Some(arch) = gpu.arch() else {
        println!("SKIPPED smoke_kernels_run_on_the_gpu: no compile target for {info}");
        return Ok(());
    };
    let req = CompileRequest::new("smoke", SMOKE, arch);
    let stream = gpu.stream()?.clone();
    let n = 1000u32;
    let x_host: Vec<f32> = (0..n).map(|i| i as f32 - 500.25).collect();
    let x = stream.clone_htod(&x_host).map_err(driver("cuMemcpyHtoD x"))?;
    // 256-thread blocks: smoke_halves stages one block through a 256-float shared array.
    let cfg = LaunchConfig { grid_dim: (n.div_ceil(256), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };

    // Pointer arguments.
    let scale = gpu.kernel(&req, "smoke_scale_f32")?;
    println!("smoke_scale_f32: ptxas {:?}, driver {:?}", scale.resources, gpu.attributes(&scale.function)?);
    // ptxas's report and the driver agree on registers.
    let report = scale.resources.clone().expect("ptxas reports smoke_scale_f32");
    assert_eq!(report.registers, gpu.attributes(&scale.function)?.registers);
    let mut y = stream.alloc_zeros::<f32>(n as usize).map_err(driver("cuMemAlloc y"))?;
    let elapsed = gpu.time(attn_cuda::Lead::Hold(std::time::Duration::from_micros(50)), |s| {
        // SAFETY: arguments match the kernel's (x, y, n); both buffers hold n floats.
        unsafe { s.launch_builder(&scale.function).arg(&x).arg(&mut y).arg(&n).launch(cfg) }
            .map(|_| ())
            .map_err(driver("cuLaunchKernel smoke_scale_f32"))
    })?;
    println!("smoke_scale_f32 took {elapsed:?}");
    let y_host = stream.clone_dtoh(&y).map_err(driver("cuMemcpyDtoH y"))?;
    assert!(y_host.iter().zip(&x_host).all(|(y, x)| *y == 2.0 * x));

    // One by-value parameter struct, with the shared-memory opt-in set (a no-op amount here,
    // but it exercises the call the attention kernel needs).
    let params_kernel = gpu.kernel(&req, "smoke_params")?;
    gpu.set_max_dynamic_shared(&params_kernel.function, 64 * 1024)?;
    assert_eq!(gpu.attributes(&params_kernel.function)?.max_dynamic_shared_bytes, 64 * 1024);
    let mut y2 = stream.alloc_zeros::<f32>(n as usize).map_err(driver("cuMemAlloc y2"))?;
    let params = SmokeParams { x: gpu.device_ptr(&x), y: gpu.device_ptr_mut(&mut y2), n, factor: -3.0 };
    // SAFETY: `params` matches `SmokeParams` and its buffers outlive the launch (synchronised below).
    unsafe { stream.launch_builder(&params_kernel.function).arg(&params).launch(cfg) }
        .map_err(driver("cuLaunchKernel smoke_params"))?;
    gpu.synchronize()?;
    let y2_host = stream.clone_dtoh(&y2).map_err(driver("cuMemcpyDtoH y2"))?;
    assert!(y2_host.iter().zip(&x_host).all(|(y, x)| *y == -3.0 * x));

    // 16-bit types from cuda_fp16.h / cuda_bf16.h.
    let halves = gpu.kernel(&req, "smoke_halves")?;
    let h_host: Vec<u16> = x_host.iter().map(|&v| f16::from_f32(v / 64.0).to_bits()).collect();
    let h = stream.clone_htod(&h_host).map_err(driver("cuMemcpyHtoD h"))?;
    let mut b = stream.alloc_zeros::<u16>(n as usize).map_err(driver("cuMemAlloc b"))?;
    // SAFETY: arguments match (x, y, n) with 16-bit elements; 256-thread blocks as required.
    unsafe { stream.launch_builder(&halves.function).arg(&h).arg(&mut b).arg(&n).launch(cfg) }
        .map_err(driver("cuLaunchKernel smoke_halves"))?;
    let b_host = stream.clone_dtoh(&b).map_err(driver("cuMemcpyDtoH b"))?;
    for (&hb, &bb) in h_host.iter().zip(&b_host) {
        let want = bf16::from_f32(2.0 * f16::from_bits(hb).to_f32());
        assert_eq!(bf16::from_bits(bb), want);
    }

    // The second request for a variant comes from the caches: same function, no recompile.
    let again = gpu.kernel(&req, "smoke_scale_f32")?;
    assert!(std::sync::Arc::ptr_eq(&again.compiled, &scale.compiled));

    // The allocator's count: 64 MiB allocated shows in the current use and the peak, and is gone
    // from the current use once freed, also when the pool keeps the block for later allocations.
    gpu.reset_memory_peak()?;
    let before = gpu.memory_use()?;
    let big = stream.alloc_zeros::<u8>(64 << 20).map_err(driver("cuMemAlloc 64 MiB"))?;
    let with = gpu.memory_use()?;
    drop(big);
    let after = gpu.memory_use()?;
    println!("memory use: before {before:?}, with 64 MiB {with:?}, after freeing it {after:?}");
    assert!(with.current - before.current >= 64 << 20, "{before:?} -> {with:?}");
    assert!(with.peak >= with.current);
    assert_eq!(after.current, before.current);
    Ok(())
}
