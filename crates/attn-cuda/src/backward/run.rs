//! Planning and running the backward family through the host-copy path: inputs and gradients
//! uploaded, three launches on the backend's stream, gradients read back.

use super::launch::{BackwardPointers, KernelParams, Sm90BackwardParams};
use super::variant::{BLOCK_M, Form, Launches, TRACE_ROWS, TRACE_SLOTS, TRACE_WORDS_PER_CTA, Variant};
use crate::backend::Cuda;
use crate::compile::Arch;
use crate::options::Family;
use crate::runtime::{Gpu, MemoryUse, driver};
use crate::tensors::{DeviceExtras, bits, check_alignment, check_supported_by, from_bits};
use attn_core::{
    BackwardOptions, DataMut, Execution, GradInputs, Gradients, Payload, Plan, Problem, Result, Tiles,
};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;
use std::time::Duration;

/// The row passes' entry functions (the main pass's is [`Variant::main_entry`]).
pub const ENTRIES: [&str; 2] = ["attn_bwd_pre", "attn_bwd_dq"];

/// What [`Cuda::backward_timed`](crate::Cuda::backward_timed) measured.
#[derive(Clone, Debug, PartialEq)]
pub struct BackwardTimes {
    /// Each run's device time: its three launches between CUDA events.
    pub times: Vec<Duration>,
    /// Device memory the call held at its peak, as the allocator counts it ([`Gpu::memory_use`]):
    /// the inputs, the gradients and the workspace. The count is the process's: allocations by
    /// other threads during the call count too.
    pub device_bytes: u64,
    /// Of which the workspace: D per query row, the f32 dQ accumulator and the deterministic
    /// mode's counters, measured the same way.
    pub workspace_bytes: u64,
}

/// What `plan_backward` chose, in the plan's payload.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ChosenBackward {
    pub(crate) variant: Variant,
    launches: Launches,
    pub(crate) deterministic: bool,
    /// Copies of the dQ accumulator: the deterministic mode's ([`crate::options::BWD_DQ_COPIES`]),
    /// else 1.
    pub(crate) dq_copies: usize,
    /// The most key blocks a sequence may have for the Hopper main pass's walks over it to rotate
    /// ([`super::Walk::rotation_limit`]; 0: none).
    pub(crate) rotate_key_blocks: usize,
    /// Where a traced build ([`super::Form::trace`]) writes its CSV (`ATTN_CUDA_SM90_TRACE`).
    pub(crate) trace_folder: Option<std::path::PathBuf>,
}

impl ChosenBackward {
    /// What a cuda backward plan chose, or a typed error for any other plan.
    pub(crate) fn of(plan: &Plan) -> Result<&ChosenBackward> {
        plan.payload.get::<ChosenBackward>().ok_or_else(|| attn_core::Error::PlanMismatch {
            what: format!("plan `{}` is not a cuda backward plan", plan.kernel),
        })
    }
}

/// Plans the backward of `problem` on `gpu`: the variant (the Hopper family on sm_90 unless
/// `family` forces the Ampere/Ada one), its three launches (each compiled, with ptxas's
/// registers and spills, and validated against the device's limits).
pub(crate) fn plan(
    gpu: &Gpu,
    problem: &Problem,
    options: BackwardOptions,
    settings: &crate::options::Options,
) -> Result<Plan> {
    problem.validate_backward()?;
    let d = problem.shape.head_dim;
    let arch = Cuda::arch(gpu)?;
    let hopper = hopper_family(arch, settings.family, problem)?;
    let variant = Variant::for_problem(problem.dtype, d, hopper);
    let allowed = match hopper {
        true => {
            "multiples of 8 up to 256 in the backward pass (64, 128 and 256 natively, the others padded to the next)"
        }
        false => {
            "multiples of 8 up to 128 in the Ampere/Ada family's backward pass (64 and 128 natively, the others padded \
             to the next); up to 256 on sm_90's Hopper family"
        }
    };
    check_supported_by(problem, "cuda", variant.is_some(), || allowed.into())?;
    // TMA (the Hopper family) and the Ampere/Ada family's 16-byte loads: strides in multiples of
    // 16 bytes.
    check_alignment(problem)?;
    let trace = settings.hopper.trace.is_some();
    let variant = variant.expect("checked by check_supported_by");
    let variant = variant.with_form(Form {
        trace,
        ..settings.sm90_backward.unwrap_or(variant.mode_form(options.deterministic))
    });
    let rows_compiled = crate::compile::compile_cached(&variant.request(arch))?;
    let main_compiled = crate::compile::compile_cached(&variant.main_request(arch))?;
    let mut launches = variant.launches(problem);
    for (launch, compiled, entry) in [
        (&mut launches.pre, &rows_compiled, ENTRIES[0]),
        (&mut launches.main, &main_compiled, variant.main_entry()),
        (&mut launches.dq, &rows_compiled, ENTRIES[1]),
    ] {
        let resources = compiled.resources_of(entry);
        launch.registers_per_thread = resources.map(|r| r.registers);
        launch.spill_bytes = resources.map(|r| r.spill_bytes());
        launch.validate(&format!("{} {entry}", variant.name()), &gpu.info().limits)?;
    }
    let rows = problem.lse_len();
    let dq_copies = match options.deterministic {
        true => settings.dq_copies.unwrap_or(super::DETERMINISTIC_DQ_COPIES),
        false => 1,
    };
    let workspace = rows * 4 * (1 + dq_copies * variant.head_dim);
    let rotate_key_blocks = match variant.hopper && !variant.splits_columns() {
        true => settings
            .walk
            .unwrap_or(super::Walk::default_for(options.deterministic))
            .rotation_limit(options.deterministic, gpu.info().sm_count as usize),
        false => 0,
    };
    let walk = match rotate_key_blocks {
        0 => String::new(),
        usize::MAX => {
            "; where every key block meets every query block, key block n walks from query block n, wrapping round"
                .into()
        }
        limit => format!(
            "; where every key block meets every query block and the sequence has at most {limit} key blocks \
             (a CTA an SM), key block n walks from query block n, wrapping round"
        ),
    };
    let mode = match options.deterministic {
        true => format!(
            "deterministic: the key blocks meeting a query block add to its dQ from the last down{}, taking \
             {dq_copies} copies of the accumulator in turn (a counter per query block and copy orders each copy's \
             additions; the grid starts with the last key block; dQ's conversion sums the copies in order){walk}",
            if rotate_key_blocks > 0 { " (in a rotated walk in the order they get there)" } else { "" }
        ),
        false => format!(
            "dQ added with f32 atomics in the order blocks finish (BackwardOptions::deterministic orders them){walk}"
        ),
    };
    Ok(Plan {
        backend: "cuda".into(),
        kernel: variant.name(),
        problem: *problem,
        tiles: Tiles {
            block_m: variant.block_m(),
            block_n: variant.block_n(),
            stages: if variant.hopper { variant.form.stages as usize } else { 1 },
        },
        execution: Execution::Gpu(launches.main.clone()),
        notes: vec![
            format!(
                "three launches: attn_bwd_pre {:?} (D = rowsum(dO*O), dQ accumulator zeroed), {} {:?} (a CTA per \
                 key block, kv head and sequence{}), attn_bwd_dq {:?}",
                launches.pre.grid,
                variant.main_entry(),
                launches.main.grid,
                match variant.hopper {
                    true => {
                        let f = variant.form;
                        format!(
                            "; TMA and wgmma, a producer warpgroup and two MMA warpgroups{}, {} stages of Q and dO, dQ \
                             parts added {}, {}/{} registers a producer/MMA thread",
                            if variant.splits_columns() {
                                " sharing 64 keys, 128 columns each"
                            } else {
                                " of 64 keys each"
                            },
                            f.stages,
                            if f.dq == super::DqAdd::Reductions {
                                "by the MMA warps' 8-byte reductions"
                            } else {
                                "by the writer warps' bulk reduce-adds"
                            },
                            f.producer_registers,
                            f.consumer_registers()
                        )
                    }
                    false => "; mma.sync, 4 warps of 16 keys".to_string(),
                },
                launches.dq.grid
            ),
            mode,
            format!(
                "workspace {workspace} bytes: D and the f32 dQ accumulator{}, linear in the query rows",
                if dq_copies > 1 { format!(" ({dq_copies} copies)") } else { String::new() }
            ),
        ],
        payload: Payload::new(ChosenBackward {
            variant,
            launches,
            deterministic: options.deterministic,
            dq_copies,
            rotate_key_blocks,
            trace_folder: settings.hopper.trace.clone().filter(|_| variant.form.trace),
        }),
    })
}

/// Whether the backward of `problem` takes the Hopper family's main pass on `arch`: by default
/// on sm_90; `family` forces either (the Hopper one refused elsewhere; the decode family, which
/// has no backward, leaves the default).
fn hopper_family(arch: Arch, family: Option<Family>, problem: &Problem) -> Result<bool> {
    match family {
        Some(Family::Hopper) if arch != Arch::Sm90a => Err(attn_core::Error::Unsupported {
            backend: "cuda (Hopper family)".into(),
            what: format!(
                "the backward of {problem}: the Hopper family needs compute capability 9.0 (sm_90a)"
            ),
        }),
        Some(Family::Ampere) => Ok(false),
        Some(Family::Hopper) | Some(Family::Decode) | None => Ok(arch == Arch::Sm90a),
    }
}

/// Runs the plan's three launches `runs` times (at least once) over the buffers of `inputs` and
/// `grads` (uploaded, and the gradients read back whole after the last run, so that elements
/// outside the rows keep what they held). Returns each run's device time (CUDA events around its
/// three launches) and, with `measure_memory`, the device memory the call held (the allocator's
/// count: a stream synchronization at each mark, and the process's peak reset; zeros without).
pub(crate) fn run(
    gpu: &Gpu,
    plan: &Plan,
    inputs: &GradInputs<'_>,
    grads: Gradients<'_>,
    runs: usize,
    measure_memory: bool,
) -> Result<BackwardTimes> {
    let chosen = ChosenBackward::of(plan)?;
    let problem = &plan.problem;
    let functions = functions(gpu, chosen)?;
    let stream = gpu.stream()?;
    let held = || -> Result<MemoryUse> {
        match measure_memory {
            true => gpu.memory_use(),
            false => Ok(MemoryUse { current: 0, peak: 0 }),
        }
    };
    if measure_memory {
        gpu.reset_memory_peak()?;
    }
    let held_before = held()?.current;
    let up16 = |data: attn_core::Data<'_>, name: &'static str| -> Result<CudaSlice<u16>> {
        stream.clone_htod(&bits(data, name)?).map_err(driver("copy a backward input to the device"))
    };
    let ins = &inputs.inputs;
    let (q, k, v) = (up16(ins.q, "q")?, up16(ins.k, "k")?, up16(ins.v, "v")?);
    let (o, d_o) = (up16(inputs.o, "o")?, up16(inputs.d_o, "d_o")?);
    let lse = stream.clone_htod(inputs.lse).map_err(driver("copy lse to the device"))?;
    let extras = DeviceExtras::upload(stream, &ins.extras)?;
    let Gradients { dq: mut dq_host, dk: mut dk_host, dv: mut dv_host } = grads;
    let up_mut = |g: &DataMut<'_>, name: &'static str| -> Result<CudaSlice<u16>> {
        let bits = match g {
            DataMut::F16(x) => x.iter().map(|e| e.to_bits()).collect::<Vec<u16>>(),
            DataMut::Bf16(x) => x.iter().map(|e| e.to_bits()).collect(),
            DataMut::F32(_) => {
                return Err(attn_core::Error::Shape {
                    tensor: name,
                    what: "the cuda backend takes f16 or bf16".into(),
                });
            }
        };
        stream.clone_htod(&bits).map_err(driver("copy a gradient buffer to the device"))
    };
    let (mut dq, mut dk, mut dv) =
        (up_mut(&dq_host, "dq")?, up_mut(&dk_host, "dk")?, up_mut(&dv_host, "dv")?);
    let held_before_workspace = held()?.current;
    let mut workspace = Workspace::new(stream, problem, chosen)?;
    let held_with_workspace = held()?.current;
    let ptr = |x: &CudaSlice<u16>| x.device_ptr(stream).0;
    let at = BackwardPointers {
        q: ptr(&q),
        k: ptr(&k),
        v: ptr(&v),
        o: ptr(&o),
        d_o: ptr(&d_o),
        lse: lse.device_ptr(stream).0,
        dq: dq.device_ptr_mut(stream).0,
        dk: dk.device_ptr_mut(stream).0,
        dv: dv.device_ptr_mut(stream).0,
        ..Default::default()
    };
    let params = LaunchParams::new(
        KernelParams::new(
            workspace.add_to(at, stream),
            extras.pointers(),
            problem,
            chosen.deterministic,
            chosen.dq_copies,
            chosen.rotate_key_blocks,
        ),
        problem,
        chosen,
        workspace.trace_address(stream),
    )?;
    let time = |stream: &Arc<CudaStream>| -> Result<()> {
        // SAFETY: the parameter block points at buffers allocated above for this problem
        // (Problem::required_lens, lse_len rows of workspace), kept alive until the copies back
        // below; the launches are the plan's, validated against the device's limits.
        unsafe { enqueue(&functions, chosen, &params, stream) }
    };
    let times =
        (0..runs.max(1)).map(|_| gpu.time(crate::runtime::Lead::Idle, time)).collect::<Result<Vec<_>>>()?;
    for (dst, src, name) in [
        (&mut dq_host, &dq, "copy dq to the host"),
        (&mut dk_host, &dk, "copy dk to the host"),
        (&mut dv_host, &dv, "copy dv to the host"),
    ] {
        let bits = stream.clone_dtoh(src).map_err(driver(name))?;
        dst.copy_from(from_bits(problem.dtype, bits).as_data())?;
    }
    workspace.write_trace(stream, problem, chosen);
    let peak = held()?.peak;
    Ok(BackwardTimes {
        times,
        device_bytes: peak.saturating_sub(held_before),
        workspace_bytes: held_with_workspace.saturating_sub(held_before_workspace),
    })
}

/// The chosen variant's three entry functions, loaded in `gpu`'s context, the main pass allowed
/// its shared memory.
pub(crate) fn functions(gpu: &Gpu, chosen: &ChosenBackward) -> Result<[CudaFunction; 3]> {
    let arch = Cuda::arch(gpu)?;
    let v = &chosen.variant;
    let rows = v.request(arch);
    let pre = gpu.kernel(&rows, ENTRIES[0])?.function;
    let dq = gpu.kernel(&rows, ENTRIES[1])?.function;
    let main = gpu.kernel(&v.main_request(arch), v.main_entry())?.function;
    gpu.set_max_dynamic_shared(&main, v.shared_bytes())?;
    Ok([pre, main, dq])
}

/// The launches' parameter blocks: the common one, and the Hopper main pass's (with its tensor
/// maps over the same tensors) where the plan has that family.
pub(crate) struct LaunchParams {
    base: KernelParams,
    sm90: Option<Sm90BackwardParams>,
}

impl LaunchParams {
    /// `trace`: a traced build's buffer ([`Workspace::trace_address`]).
    pub(crate) fn new(
        base: KernelParams,
        problem: &Problem,
        chosen: &ChosenBackward,
        trace: u64,
    ) -> Result<Self> {
        let v = &chosen.variant;
        let sm90 = match v.hopper {
            true => Some(Sm90BackwardParams::new(base, problem, v.block_m(), v.block_n())?.with_trace(trace)),
            false => None,
        };
        Ok(LaunchParams { base, sm90 })
    }
}

/// The backward's device workspace: D per query row, the f32 dQ accumulator, the
/// deterministic mode's counters, and a traced build's buffer. Allocated on the call's stream
/// (and freed there, after the launches that use it).
pub(crate) struct Workspace {
    delta: CudaSlice<f32>,
    dq_accum: CudaSlice<f32>,
    counters: CudaSlice<i32>,
    trace: Option<CudaSlice<i64>>,
}

impl Workspace {
    pub(crate) fn new(stream: &Arc<CudaStream>, problem: &Problem, chosen: &ChosenBackward) -> Result<Self> {
        let rows = problem.lse_len();
        let s = problem.shape;
        let counters = match chosen.deterministic {
            true => s.batch * s.heads_q * s.seq_q.div_ceil(BLOCK_M) * chosen.dq_copies,
            false => 1,
        };
        Ok(Workspace {
            delta: stream.alloc_zeros::<f32>(rows).map_err(driver("allocate the backward's D"))?,
            dq_accum: stream
                .alloc_zeros::<f32>(rows * chosen.variant.head_dim * chosen.dq_copies)
                .map_err(driver("allocate the dQ accumulator"))?,
            counters: stream.alloc_zeros::<i32>(counters).map_err(driver("allocate the dQ counters"))?,
            trace: match chosen.variant.form.trace {
                true => {
                    let ctas = chosen.launches.main.grid.iter().map(|&g| g as usize).product::<usize>();
                    let words = ctas * TRACE_WORDS_PER_CTA;
                    Some(stream.alloc_zeros::<i64>(words).map_err(driver("allocate the backward's trace"))?)
                }
                false => None,
            },
        })
    }

    /// The traced build's buffer (0 without one: the kernel then stores nothing there).
    pub(crate) fn trace_address(&self, stream: &Arc<CudaStream>) -> u64 {
        self.trace.as_ref().map_or(0, |t| t.device_ptr(stream).0)
    }

    /// A traced build's last run to `<folder>/backward-<kernel>-<shape>.csv`: a row per (CTA,
    /// role) of its ten words (`bench/device/backward_trace.py` reads it). A failure goes to
    /// stderr: a diagnostic must not turn a finished run into an error.
    pub(crate) fn write_trace(&self, stream: &Arc<CudaStream>, problem: &Problem, chosen: &ChosenBackward) {
        let (Some(buffer), Some(folder)) = (&self.trace, &chosen.trace_folder) else { return };
        let s = problem.shape;
        let file = folder.join(format!(
            "backward-{}-b{}h{}kv{}-s{}x{}{}{}.csv",
            chosen.variant.name(),
            s.batch,
            s.heads_q,
            s.heads_kv,
            s.seq_q,
            s.seq_k,
            if problem.params.mask == attn_core::Mask::None { "" } else { "-masked" },
            if chosen.deterministic { "-deterministic" } else { "" }
        ));
        let written =
            stream.clone_dtoh(buffer).map_err(|e| format!("copy the trace back: {e}")).and_then(|words| {
                let names: Vec<String> = (0..TRACE_SLOTS).map(|i| format!("s{i}")).collect();
                let mut csv = format!("cta,row,{}\n", names.join(","));
                for (i, slots) in words.chunks(TRACE_SLOTS).enumerate() {
                    let slots: Vec<String> = slots.iter().map(i64::to_string).collect();
                    csv.push_str(&format!("{},{},{}\n", i / TRACE_ROWS, i % TRACE_ROWS, slots.join(",")));
                }
                std::fs::create_dir_all(folder)
                    .and_then(|()| std::fs::write(&file, csv))
                    .map_err(|e| format!("write {}: {e}", file.display()))
            });
        if let Err(e) = written {
            eprintln!("attn-cuda: the backward's trace was not written: {e}");
        }
    }

    /// `at` with the workspace's addresses.
    pub(crate) fn add_to(&mut self, at: BackwardPointers, stream: &Arc<CudaStream>) -> BackwardPointers {
        BackwardPointers {
            delta: self.delta.device_ptr_mut(stream).0,
            dq_accum: self.dq_accum.device_ptr_mut(stream).0,
            counters: self.counters.device_ptr_mut(stream).0,
            ..at
        }
    }
}

/// Enqueues the three launches on `stream`.
///
/// # Safety
/// `params` must point at live device buffers of the plan's problem (its required lengths, the
/// workspace of [`Workspace::new`]) that stay alive until the launches complete on `stream`.
pub(crate) unsafe fn enqueue(
    functions: &[CudaFunction; 3],
    chosen: &ChosenBackward,
    params: &LaunchParams,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    let launches = [&chosen.launches.pre, &chosen.launches.main, &chosen.launches.dq];
    for (i, (function, launch)) in functions.iter().zip(launches).enumerate() {
        let cfg = LaunchConfig {
            grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
            block_dim: (launch.block[0], launch.block[1], launch.block[2]),
            shared_mem_bytes: launch.dynamic_shared_bytes,
        };
        let mut builder = stream.launch_builder(function);
        match (i, &params.sm90) {
            (1, Some(sm90)) => builder.arg(sm90),
            _ => builder.arg(&params.base),
        };
        // SAFETY: the caller's promise on the buffers; the launch is the plan's, validated
        // against the device's limits.
        unsafe { builder.launch(cfg) }.map_err(driver("cuLaunchKernel (backward)"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{DType, Shape};

    #[test]
    fn sm90_takes_the_hopper_family_unless_told_otherwise() {
        let p = Problem::new(Shape::new(1, 2, 128, 64), DType::Bf16);
        for (arch, family, hopper) in [
            (Arch::Sm90a, None, true),
            (Arch::Sm90a, Some(Family::Decode), true),
            (Arch::Sm90a, Some(Family::Hopper), true),
            (Arch::Sm90a, Some(Family::Ampere), false),
            (Arch::Sm89, None, false),
            (Arch::Sm80, Some(Family::Ampere), false),
        ] {
            assert_eq!(hopper_family(arch, family, &p).unwrap(), hopper, "{arch} {family:?}");
        }
        let refused = hopper_family(Arch::Sm89, Some(Family::Hopper), &p).unwrap_err().to_string();
        assert!(refused.contains("compute capability 9.0"), "{refused}");
    }
}
