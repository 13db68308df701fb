//! Every kernel specialisation the backend can choose compiles with NVRTC, with no warning, no
//! spill, registers within the variant's budget and none of ptxas's notes on wgmma pipelines:
//! the Ampere/Ada and decode families for sm_80, sm_89 and sm_90a, the Hopper family for sm_90a; and the
//! Hopper family's SASS (read with cuobjdump) has the shape its speed depends on. Runs on a
//! machine without a GPU; CI requires NVRTC and cuobjdump (ATTN_REQUIRE_NVRTC=1), elsewhere each
//! test is skipped by name when they are missing.

use attn_cuda::options::{CUOBJDUMP, REQUIRE_NVRTC};
use attn_cuda::{Arch, CompileRequest, Compiled, ampere, backward, compile, decode, hopper, nvrtc_available};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One compilation to check.
struct Job {
    /// The variant and architecture, for messages.
    name: String,
    request: CompileRequest,
    /// The entry function whose resources are checked.
    entry: &'static str,
    /// Registers per thread the variant may use.
    budget: u32,
}

/// Whether CI requires NVRTC and cuobjdump (`ATTN_REQUIRE_NVRTC`).
fn required() -> bool {
    REQUIRE_NVRTC.on_off().unwrap_or_else(|e| panic!("{e}")) == Some(true)
}

/// Whether NVRTC is here; if not, the test is reported skipped by name (or fails where CI
/// requires NVRTC).
fn nvrtc_or_skip(test: &str) -> bool {
    match nvrtc_available() {
        Ok(()) => true,
        Err(reason) if required() => {
            panic!("NVRTC is required (ATTN_REQUIRE_NVRTC=1) but unavailable: {reason}")
        }
        Err(reason) => {
            println!("SKIPPED {test}: {reason}");
            false
        }
    }
}

/// A job and what NVRTC made of it (or why it could not).
type Outcome = (Job, Result<Compiled, String>);

/// Compiles the jobs on every core.
fn compile_all(jobs: Vec<Job>) -> Vec<Outcome> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let compile_one = |job: &Job| compile(&job.request).map_err(|e| format!("{}: {e}", job.name));
    let compiled: Vec<Result<Compiled, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .chunks(jobs.len().div_ceil(threads).max(1))
            .map(|part| s.spawn(move || part.iter().map(compile_one).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("compile thread panicked")).collect()
    });
    jobs.into_iter().zip(compiled).collect()
}

/// Every Hopper variant compiled once for the tests that read it (NVRTC takes a second or more
/// per variant); the second test to ask waits for the first's compiles.
fn hopper_compiled() -> &'static [Outcome] {
    static COMPILED: OnceLock<Vec<Outcome>> = OnceLock::new();
    COMPILED.get_or_init(|| compile_all(hopper_jobs()))
}

/// What is wrong with a compiled job: no ptxas report, a spill, registers over the budget, or a
/// note of ptxas's on wgmma (C75xx: fences it had to inject, or every wgmma serialized because it
/// could not prove a group complete before its registers were used).
fn check_resources(job: &Job, c: &Compiled) -> Option<String> {
    check_resources_spilling(job, c, 0)
}

/// [`check_resources`], with up to `spill` bytes of spill allowed.
fn check_resources_spilling(job: &Job, c: &Compiled, spill: u32) -> Option<String> {
    let r = c.resources_of(job.entry).cloned().unwrap_or_default();
    println!(
        "{:<60} {:>3} registers (budget {}), {} B spilled, {} B stack",
        job.name,
        r.registers,
        job.budget,
        r.spill_bytes(),
        r.stack_bytes
    );
    let notes: Vec<&str> = c.log.lines().filter(|l| l.contains("(C75")).collect();
    if r.registers == 0 {
        Some(format!("{}: no ptxas report in the log", job.name))
    } else if !notes.is_empty() {
        Some(format!("{}: ptxas notes on wgmma:\n{}", job.name, notes.join("\n")))
    } else if r.spill_bytes() > spill || r.registers > job.budget {
        Some(format!(
            "{}: {} registers (budget {}), {} B spilled",
            job.name,
            r.registers,
            job.budget,
            r.spill_bytes()
        ))
    } else {
        None
    }
}

/// Fails with every job whose compile failed or that `check` finds wrong.
fn assert_all_pass(outcomes: &[Outcome], check: impl Fn(&Job, &Compiled) -> Option<String>) {
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|(job, compiled)| match compiled {
            Ok(c) => check(job, c),
            Err(e) => Some(e.clone()),
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} variants failed:\n{}",
        failures.len(),
        outcomes.len(),
        failures.join("\n")
    );
}

#[test]
fn every_variant_compiles_without_spills_for_every_arch() {
    if !nvrtc_or_skip("every_variant_compiles_without_spills_for_every_arch") {
        return;
    }
    let jobs: Vec<Job> = ampere::Variant::all()
        .into_iter()
        .flat_map(|v| [Arch::Sm80, Arch::Sm89, Arch::Sm90a].map(move |a| (v, a)))
        .map(|(v, arch)| Job {
            name: format!("{} {arch}", v.name()),
            request: v.request(arch),
            entry: "attn_fwd",
            budget: v.register_budget(),
        })
        .collect();
    assert_all_pass(&compile_all(jobs), check_resources);
}

/// The Hopper backward's main pass of `v`, for sm_90a.
fn hopper_backward_main(v: backward::Variant) -> Job {
    Job {
        name: format!("{} sm_90a {}", v.name(), v.main_entry()),
        request: v.main_request(Arch::Sm90a),
        entry: v.main_entry(),
        budget: v.register_budget(),
    }
}

/// The Hopper backward's SASS, for each head dim's own form and the deterministic mode's: tensor
/// products present, no local memory, and the step loop's wgmma descriptors on the uniform
/// datapath: at most 4 R2UR in the loop (mbarrier addresses not counted). The descriptors that
/// depend on the warpgroup (its keys of K and V, its part of dS^T or K for dQ) took two R2UR a
/// product (33 a step at D=64) until the warpgroup's index came through a warp reduction.
#[test]
fn every_hopper_backward_step_keeps_its_descriptors_uniform() {
    let Some(tool) = sass_tools_or_skip("every_hopper_backward_step_keeps_its_descriptors_uniform") else {
        return;
    };
    let mut variants: Vec<backward::Variant> = Vec::new();
    for v in backward::Variant::all().into_iter().filter(|v| v.hopper) {
        for deterministic in [false, true] {
            let built = v.with_form(v.mode_form(deterministic));
            if !variants.contains(&built) {
                variants.push(built);
            }
        }
    }
    let jobs = variants.into_iter().map(hopper_backward_main).collect();
    assert_all_pass(&compile_all(jobs), |job, compiled| {
        let sass = match dump_sass(job, compiled, &tool) {
            Ok(sass) => sass,
            Err(e) => return Some(e),
        };
        let (hgmma, local) = products_and_local_memory(&sass);
        let Some(lp) = key_tile_loop(&sass) else {
            return Some(format!(
                "{}: no loop with both shared-memory and register-operand products",
                job.name
            ));
        };
        let r2ur = counted_r2ur(lp);
        println!(
            "{:<60} HGMMA {hgmma:>3}, LDL/STL {local}, step loop {} instructions, {r2ur} R2UR",
            job.name,
            lp.len()
        );
        (hgmma == 0 || local > 0 || r2ur > 4).then(|| {
            format!(
                "{}: HGMMA {hgmma} (none is wrong), LDL/STL {local} (any is wrong), R2UR in the step loop {r2ur} \
                 (more than 4 is wrong)",
                job.name
            )
        })
    });
}

/// The decode family, for every architecture it runs on: no spill, registers within 255.
#[test]
fn every_backward_kernel_compiles_without_spills_for_every_arch() {
    if !nvrtc_or_skip("every_backward_kernel_compiles_without_spills_for_every_arch") {
        return;
    }
    // The Ampere/Ada family everywhere (its main pass and the row passes both families use), the
    // Hopper family's main pass for sm_90a, and its row passes at the head dims only it has.
    let jobs: Vec<Job> = backward::Variant::all()
        .into_iter()
        .flat_map(|v| [Arch::Sm80, Arch::Sm89, Arch::Sm90a].map(move |a| (v, a)))
        .filter(|(v, arch)| !v.hopper || *arch == Arch::Sm90a)
        .flat_map(|(v, arch)| {
            let rows = ["attn_bwd_pre", "attn_bwd_dq"].map(move |entry| Job {
                name: format!("{} {arch} {entry}", v.name()),
                request: v.request(arch),
                entry,
                budget: 255,
            });
            let main = Job {
                name: format!("{} {arch} {}", v.name(), v.main_entry()),
                request: v.main_request(arch),
                entry: v.main_entry(),
                budget: v.register_budget(),
            };
            let own_rows = !backward::Variant::head_dims(false).contains(&v.head_dim);
            rows.into_iter()
                .chain([main])
                .filter(move |job| !v.hopper || own_rows || job.entry == v.main_entry())
        })
        .collect();
    assert_all_pass(&compile_all(jobs), check_resources);
}

/// The Hopper backward's other forms (`ATTN_CUDA_SM90_BWD`, `backward::Form::knob_forms`: dQ by
/// reductions, in planes (one part buffer or two) or in joined parts, three stages and the
/// register split they take, dV's issue points; the traced builds) at the head dims where they
/// apply, and the row passes the planes change: no spill, but up to [`TRACED_SPILL_BYTES`] in a
/// traced build.
#[test]
fn every_hopper_backward_form_compiles_without_spills() {
    if !nvrtc_or_skip("every_hopper_backward_form_compiles_without_spills") {
        return;
    }
    let forms = backward::Form::knob_forms();
    // Each form where it differs from the head dim's own (D=256 always adds by reductions in two
    // stages: only its traced build is another).
    let mut variants: Vec<backward::Variant> = Vec::new();
    for v in backward::Variant::all().into_iter().filter(|v| v.hopper) {
        // The traced builds of each mode's form too: what ATTN_CUDA_SM90_TRACE runs.
        let traced = [false, true].map(|d| v.with_form(backward::Form { trace: true, ..v.mode_form(d) }));
        for built in forms.map(|f| v.with_form(f)).into_iter().chain(traced) {
            if built != v && !variants.contains(&built) {
                variants.push(built);
            }
        }
    }
    // The main passes, and the row passes where the form changes them (the planes).
    let mut jobs: Vec<Job> = Vec::new();
    for v in variants {
        jobs.push(hopper_backward_main(v));
        let own = backward::Variant { form: v.own_form(), ..v };
        if v.request(Arch::Sm90a).key() != own.request(Arch::Sm90a).key()
            && !jobs.iter().any(|j| j.request.key() == v.request(Arch::Sm90a).key())
        {
            jobs.push(Job {
                name: format!("{} rows sm_90a attn_bwd_dq", v.name()),
                request: v.request(Arch::Sm90a),
                entry: "attn_bwd_dq",
                budget: 255,
            });
        }
    }
    assert_all_pass(&compile_all(jobs), |job, c| {
        let traced = job.name.contains("_trace ");
        check_resources_spilling(job, c, if traced { TRACED_SPILL_BYTES } else { 0 })
    });
}

/// What a traced build of the Hopper backward may spill: its timers take the producer
/// warpgroup's registers, 40 a thread at most (the launch's 504 a lane less the MMA warps' 2 x
/// 232; 48 hung every launch). At `adc9c02` the D=128 builds spilled 8 bytes, the
/// writers' head base, stored once and reloaded once a head, outside the step loop (the writers'
/// and joined forms' traced builds still do).
const TRACED_SPILL_BYTES: u32 = 8;

#[test]
fn every_decode_variant_compiles_without_spills_for_every_arch() {
    if !nvrtc_or_skip("every_decode_variant_compiles_without_spills_for_every_arch") {
        return;
    }
    let jobs: Vec<Job> = decode::Variant::all()
        .into_iter()
        .flat_map(|v| [Arch::Sm80, Arch::Sm89, Arch::Sm90a].map(move |a| (v, a)))
        .map(|(v, arch)| Job {
            name: format!("{} {arch}", v.name()),
            request: v.request(arch),
            entry: "attn_decode",
            budget: v.register_budget(),
        })
        .collect();
    // The static shared memory the plan adds to the dynamic (Variant::STATIC_SHARED) covers
    // what ptxas reports.
    assert_all_pass(&compile_all(jobs), |job, c| {
        check_resources(job, c).or_else(|| {
            let shared = c.resources_of(job.entry).map_or(0, |r| r.shared_bytes);
            (shared > decode::Variant::STATIC_SHARED).then(|| {
                format!(
                    "{}: {shared} B of static shared memory, the plan counts {}",
                    job.name,
                    decode::Variant::STATIC_SHARED
                )
            })
        })
    });
}

/// The Hopper family, for sm_90a only; with `setmaxnreg` the budget is the cap at entry (the
/// consumers then claim more, which ptxas's spill count covers).
#[test]
fn every_hopper_variant_compiles_without_spills() {
    if !nvrtc_or_skip("every_hopper_variant_compiles_without_spills") {
        return;
    }
    assert_all_pass(hopper_compiled(), check_resources);
}

fn hopper_jobs() -> Vec<Job> {
    hopper::Variant::all()
        .into_iter()
        .map(|v| Job {
            name: v.name(),
            request: v.request(),
            entry: "attn_fwd_sm90",
            budget: v.register_budget(),
        })
        .collect()
}

/// The Hopper family's SASS: tensor-core products (HGMMA) present, no local-memory traffic
/// (LDL/STL), and the key-tile loop's wgmma descriptors on the uniform datapath: at most two
/// R2UR (a vector register moved to a uniform one) per S product, for Q's descriptor, which
/// depends on the warpgroup; none for K's and V's. (An R2UR into an mbarrier instruction's
/// address is not counted.) Where ptxas takes the loop for divergent code it builds every
/// descriptor in vector registers: an attempt at D=128 had 48 R2UR per iteration against 16, and
/// was 5-8% slower on the H100 (measured at 8bf801d, see docs/experiments.md).
#[test]
fn every_hopper_variant_has_hgmma_no_local_memory_and_a_uniform_key_tile_loop() {
    let Some(tool) =
        sass_tools_or_skip("every_hopper_variant_has_hgmma_no_local_memory_and_a_uniform_key_tile_loop")
    else {
        return;
    };
    assert_all_pass(hopper_compiled(), |job, compiled| check_sass(job, compiled, &tool));
}

/// What a SASS check needs: NVRTC, and `cuobjdump`, whose path it returns (each reported skipped
/// by name where missing, or failing where CI requires it).
fn sass_tools_or_skip(test: &str) -> Option<PathBuf> {
    if !nvrtc_or_skip(test) {
        return None;
    }
    cuobjdump_or_skip(test)
}

/// `cuobjdump`: `ATTN_CUOBJDUMP` (which `cargo xtask test` sets), else the first on `PATH`; if
/// neither, the test is reported skipped by name (or fails where CI requires it).
fn cuobjdump_or_skip(test: &str) -> Option<PathBuf> {
    let from_env = CUOBJDUMP.value().map(PathBuf::from);
    let on_path = || {
        std::env::var_os("PATH")
            .and_then(|p| std::env::split_paths(&p).map(|d| d.join("cuobjdump")).find(|f| f.is_file()))
    };
    match from_env.or_else(on_path) {
        Some(tool) => Some(tool),
        None if required() => {
            panic!("cuobjdump is required (ATTN_REQUIRE_NVRTC=1) but neither ATTN_CUOBJDUMP nor PATH has it")
        }
        None => {
            println!("SKIPPED {test}: no cuobjdump (set ATTN_CUOBJDUMP, or `cargo xtask prerequisites`)");
            None
        }
    }
}

/// `PATH` with cuobjdump's own directory first: `cuobjdump -sass` runs `nvdisasm` from `PATH`,
/// and the toolkit and NVIDIA's wheels keep the two side by side.
fn with_tool_dir(tool: &Path) -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = tool.parent().map(Path::to_path_buf).into_iter().chain(std::env::split_paths(&path));
    std::env::join_paths(dirs).unwrap_or(path)
}

/// A compiled job's SASS, through `cuobjdump -sass`.
fn dump_sass(job: &Job, compiled: &Compiled, tool: &Path) -> Result<Vec<Instruction>, String> {
    let file = std::env::temp_dir().join(format!("attn-sass-{}-{}.cubin", std::process::id(), job.name));
    let dump = std::fs::write(&file, &compiled.cubin).map_err(|e| e.to_string()).and_then(|()| {
        std::process::Command::new(tool)
            .arg("-sass")
            .arg(&file)
            .env("PATH", with_tool_dir(tool))
            .output()
            .map_err(|e| e.to_string())
    });
    let _ = std::fs::remove_file(&file);
    match dump {
        Ok(out) if out.status.success() => Ok(parse_sass(&String::from_utf8_lossy(&out.stdout))),
        Ok(out) => Err(format!("{}: cuobjdump failed: {}", job.name, String::from_utf8_lossy(&out.stderr))),
        Err(e) => Err(format!("{}: cuobjdump did not run: {e}", job.name)),
    }
}

fn check_sass(job: &Job, compiled: &Compiled, tool: &Path) -> Option<String> {
    let sass = match dump_sass(job, compiled, tool) {
        Ok(sass) => sass,
        Err(e) => return Some(e),
    };
    let (hgmma, local) = products_and_local_memory(&sass);
    let Some(lp) = key_tile_loop(&sass) else {
        return Some(format!("{}: no loop with both S and P·V products in the SASS", job.name));
    };
    let s_products = lp.iter().filter(|i| i.product() == Some(Product::S)).count();
    let r2ur = counted_r2ur(lp);
    println!(
        "{:<60} HGMMA {hgmma:>3}, LDL/STL {local}, key-tile loop {} instructions, {s_products} S products, \
         {r2ur} R2UR",
        job.name,
        lp.len()
    );
    if hgmma == 0 || local > 0 || r2ur > 2 * s_products {
        Some(format!(
            "{}: HGMMA {hgmma} (none is wrong), LDL/STL {local} (any is wrong), R2UR in the key-tile loop \
             {r2ur} (more than 2 per S product, {s_products}, is wrong)",
            job.name
        ))
    } else {
        None
    }
}

/// A listing's tensor-core products (HGMMA) and local-memory instructions (LDL, STL: spills).
fn products_and_local_memory(sass: &[Instruction]) -> (usize, usize) {
    let hgmma = sass.iter().filter(|i| i.opcode().starts_with("HGMMA")).count();
    let local = sass.iter().filter(|i| ["LDL", "STL"].iter().any(|op| i.opcode().starts_with(op))).count();
    (hgmma, local)
}

/// One SASS instruction of a `cuobjdump -sass` listing: its address and its text, predicate
/// included, `;` and encoding left out.
struct Instruction {
    addr: u64,
    text: String,
}

/// Which product an HGMMA computes: S = Q K^T reads both operands from shared memory
/// (`HGMMA... Rd, gdesc[..], ..`); O += P V reads P from registers (`HGMMA... Rd, Rp, ..`).
#[derive(Clone, Copy, PartialEq)]
enum Product {
    S,
    PV,
}

impl Instruction {
    /// The opcode with its modifiers, e.g. `HGMMA.64x128x16.F32.BF16`.
    fn opcode(&self) -> &str {
        let mut words = self.text.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.starts_with('@') { words.next().unwrap_or("") } else { first }
    }

    fn product(&self) -> Option<Product> {
        if !self.opcode().starts_with("HGMMA") {
            return None;
        }
        let operands: Vec<&str> = self.text.split(',').map(str::trim).collect();
        match operands.get(1) {
            Some(a) if a.starts_with("gdesc") => Some(Product::S),
            Some(a) if a.starts_with('R') => Some(Product::PV),
            _ => None,
        }
    }

    /// Where a backward or forward branch goes (`BRA 0x1f40`), if this is one.
    fn branch_target(&self) -> Option<u64> {
        let at = self.text.find("BRA 0x")?;
        let hex: String = self.text[at + 6..].chars().take_while(char::is_ascii_hexdigit).collect();
        u64::from_str_radix(&hex, 16).ok()
    }
}

/// The instructions of a listing: lines `/*0470*/ OPCODE operands ;`.
fn parse_sass(listing: &str) -> Vec<Instruction> {
    listing
        .lines()
        .filter_map(|line| {
            let line = line.trim_start().strip_prefix("/*")?;
            let (addr, rest) = line.split_once("*/")?;
            let addr = u64::from_str_radix(addr, 16).ok()?;
            let (text, _) = rest.split_once(';')?;
            Some(Instruction { addr, text: text.trim().to_string() })
        })
        .collect()
}

/// The R2UR in `body` but those into a register that an mbarrier instruction (SYNCS) of the
/// body reads as its address: what is left moves descriptors and other values of the products.
fn counted_r2ur(body: &[Instruction]) -> usize {
    let uniform = |s: &str| s.strip_prefix("UR").and_then(|n| n.parse::<u32>().ok());
    let registers = |text: &str| -> Vec<u32> {
        text.split(|c: char| !c.is_ascii_alphanumeric()).filter_map(uniform).collect()
    };
    let barrier_addresses: Vec<u32> =
        body.iter().filter(|i| i.opcode().starts_with("SYNCS")).flat_map(|i| registers(&i.text)).collect();
    body.iter()
        .filter(|i| i.opcode().starts_with("R2UR"))
        .filter(|i| {
            let operands = i.text.split_once(i.opcode()).map_or("", |(_, rest)| rest);
            !registers(operands).first().is_some_and(|ur| barrier_addresses.contains(ur))
        })
        .count()
}

/// The key-tile loop: the shortest span from a backward branch's target to the branch that holds
/// both S and P·V products.
fn key_tile_loop(sass: &[Instruction]) -> Option<&[Instruction]> {
    sass.iter()
        .enumerate()
        .filter_map(|(end, branch)| {
            let target = branch.branch_target().filter(|&t| t < branch.addr)?;
            let start = sass.iter().position(|i| i.addr == target)?;
            let body = &sass[start..=end];
            let has = |p: Product| body.iter().any(|i| i.product() == Some(p));
            (has(Product::S) && has(Product::PV)).then_some(body)
        })
        .min_by_key(|body| body.len())
}
