//! SPIR-V for the cooperative-matrix kernel, compiled here instead of by wgpu, so that its
//! memory model can be completed; the module goes to the driver through wgpu's SPIR-V
//! passthrough.
//!
//! naga (30) declares the Vulkan memory model for any shader with cooperative matrices, but
//! writes the rest of the module as for the older GLSL450 model: no workgroup access is marked
//! `NonPrivatePointer` and its barriers carry no `MakeAvailable`/`MakeVisible` semantics
//! (gfx-rs/wgpu#8805). Under the Vulkan model, plain workgroup stores are then not ordered
//! before other invocations' loads by a barrier, which is what the kernel's hand-overs rely on.
//! [`annotate_vulkan_memory_model`] keeps the Vulkan model and adds what naga leaves out: the
//! module is then what the specification asks for (it passes `spirv-val`), and on the H100 it
//! passed `attn verify` on the full grid at the speed of the alternatives (naga's module as it
//! is, or declared GLSL450, which SPIRV-Tools rejects: both retired, see docs/experiments.md).

use crate::options::Checks;
use std::collections::{HashMap, HashSet};

/// SPIR-V words of `wgsl` (one compute entry point, `main`) for a Vulkan 1.3 device, as
/// wgpu would compile them with `checks`, with the Vulkan memory model's annotations added
/// ([`annotate_vulkan_memory_model`]).
pub(crate) fn compile_coop(wgsl: &str, checks: Checks) -> Result<Vec<u32>, String> {
    // What wgpu asks of naga on a Vulkan 1.3+ device; the cooperative-matrix path is only
    // opened where the driver offers VK_KHR_cooperative_matrix, which needs such a driver.
    let mut words = compile(wgsl, checks, (1, 6))?;
    annotate_vulkan_memory_model(&mut words)?;
    Ok(words)
}

/// SPIR-V (version `lang_version`) of `wgsl`'s compute entry point `main`, with naga's run-time
/// guards as `checks` says and no zero-filling of workgroup memory (the kernels write every
/// workgroup variable before reading it).
pub fn compile(wgsl: &str, checks: Checks, lang_version: (u8, u8)) -> Result<Vec<u32>, String> {
    use naga::back::spv;
    use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let info =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .map_err(|e| e.emit_to_string(wgsl))?;
    let policy =
        if checks == Checks::None { BoundsCheckPolicy::Unchecked } else { BoundsCheckPolicy::Restrict };
    let options = spv::Options {
        lang_version,
        flags: spv::WriterFlags::empty(),
        fake_missing_bindings: true,
        bounds_check_policies: BoundsCheckPolicies {
            index: policy,
            buffer: policy,
            image_load: policy,
            binding_array: BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: checks == Checks::All,
        emit_int_div_checks: checks != Checks::None,
        ..spv::Options::default()
    };
    let pipeline =
        spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: "main".into() };
    spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| e.to_string())
}

const MAGIC: u32 = 0x0723_0203;
const HEADER: usize = 5;
const OP_NAME: u32 = 5;
const OP_MEMBER_NAME: u32 = 6;
const OP_EXTENSION: u32 = 10;
const OP_MEMORY_MODEL: u32 = 14;
const OP_CAPABILITY: u32 = 17;
const OP_TYPE_VOID: u32 = 19;
const OP_TYPE_POINTER: u32 = 32;
const OP_TYPE_FORWARD_POINTER: u32 = 39;
const OP_CONSTANT: u32 = 43;
const OP_VARIABLE: u32 = 59;
const OP_DECORATE: u32 = 71;
const OP_MEMBER_DECORATE: u32 = 72;
const DECORATION_ARRAY_STRIDE: u32 = 6;
const OP_LOAD: u32 = 61;
const OP_STORE: u32 = 62;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
const OP_PTR_ACCESS_CHAIN: u32 = 67;
const OP_COPY_OBJECT: u32 = 83;
const OP_CONTROL_BARRIER: u32 = 224;
const OP_MEMORY_BARRIER: u32 = 225;
const OP_COOP_LOAD: u32 = 4457;
const OP_COOP_STORE: u32 = 4458;
const CAPABILITY_VULKAN_MEMORY_MODEL: u32 = 5345;
const MEMORY_MODEL_VULKAN: u32 = 3;
const STORAGE_WORKGROUP: u32 = 4;
const NON_PRIVATE_POINTER: u32 = 0x20;
/// Memory-semantics bits: Acquire, Release, AcquireRelease, SequentiallyConsistent (any
/// ordering), and MakeAvailable, MakeVisible (Vulkan model only).
const ORDERING: u32 = 0x2 | 0x4 | 0x8 | 0x10;
const MAKE_AVAILABLE: u32 = 0x2000;
const MAKE_VISIBLE: u32 = 0x4000;

/// The instructions of a module: (first word, word count) each, after the header.
fn instructions(words: &[u32]) -> Result<Vec<(usize, usize)>, String> {
    if words.len() < HEADER || words[0] != MAGIC {
        return Err("not a SPIR-V module (bad magic number)".into());
    }
    let mut all = vec![];
    let mut at = HEADER;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        if count == 0 || at + count > words.len() {
            return Err(format!("malformed SPIR-V: instruction at word {at} runs past the end"));
        }
        all.push((at, count));
        at += count;
    }
    Ok(all)
}

/// Where an instruction's memory operands start (its fixed operands before them), for the
/// accesses the passes look at: OpLoad (type, result, pointer), OpStore (pointer, object), and
/// the cooperative load (type, result, pointer, layout, stride) and store (pointer, object,
/// layout, stride), which naga always writes with a stride. Also the pointer's word.
fn memory_access(opcode: u32) -> Option<(usize, usize)> {
    match opcode {
        OP_LOAD => Some((4, 3)),
        OP_STORE => Some((3, 1)),
        OP_COOP_LOAD => Some((6, 3)),
        OP_COOP_STORE => Some((5, 1)),
        _ => None,
    }
}

/// The module's 32-bit scalar constants: id -> value.
fn constants(words: &[u32], all: &[(usize, usize)]) -> HashMap<u32, u32> {
    all.iter()
        .filter(|&&(at, count)| words[at] & 0xffff == OP_CONSTANT && count == 4)
        .map(|&(at, _)| (words[at + 2], words[at + 3]))
        .collect()
}

/// The semantics operand of a barrier (its word), if `opcode` is one.
fn barrier_semantics(opcode: u32) -> Option<usize> {
    match opcode {
        OP_CONTROL_BARRIER => Some(3),
        OP_MEMORY_BARRIER => Some(2),
        _ => None,
    }
}

/// Adds to a module on the Vulkan memory model what its workgroup hand-overs need there: every
/// load and store (plain or cooperative) through a workgroup pointer becomes `NonPrivatePointer`,
/// and every barrier that orders memory also makes it available and visible (`MakeAvailable |
/// MakeVisible`, through new constants defined after the ones they copy). Also drops the
/// `ArrayStride` that naga puts on arrays used only in workgroup memory, which Vulkan forbids
/// there (VUID-StandaloneSpirv-None-10684). Refuses a module that does not declare the Vulkan
/// model. The result passes SPIRV-Tools' validator (2025.5) for Vulkan 1.3.
pub fn annotate_vulkan_memory_model(words: &mut Vec<u32>) -> Result<(), String> {
    let all = instructions(words)?;
    if memory_model(words) != Some((MEMORY_MODEL_VULKAN, true)) {
        return Err("the module does not declare the Vulkan memory model".into());
    }
    let values = constants(words, &all);
    let pointers = workgroup_pointers(words, &all);
    // The semantics constants barriers use, and their annotated twins (new ids past the bound,
    // defined right after the originals).
    let mut twins: HashMap<u32, u32> = HashMap::new();
    let mut bound = words[3];
    for &(at, _) in &all {
        let opcode = words[at] & 0xffff;
        if let Some(w) = barrier_semantics(opcode) {
            let id = words[at + w];
            let value =
                *values.get(&id).ok_or_else(|| format!("word {at}: barrier semantics not a constant"))?;
            if value & ORDERING != 0 && !twins.contains_key(&id) {
                twins.insert(id, bound);
                bound += 1;
            }
        }
    }
    let strideless = workgroup_only_arrays(words, &all);
    let mut out = words[..HEADER].to_vec();
    out[3] = bound;
    for &(at, count) in &all {
        let mut inst = words[at..at + count].to_vec();
        let opcode = inst[0] & 0xffff;
        if opcode == OP_DECORATE
            && count == 4
            && inst[2] == DECORATION_ARRAY_STRIDE
            && strideless.contains(&inst[1])
        {
            continue;
        }
        if let Some((mem, ptr)) = memory_access(opcode)
            && pointers.contains(&inst[ptr])
        {
            if inst.len() > mem {
                inst[mem] |= NON_PRIVATE_POINTER;
            } else {
                inst.push(NON_PRIVATE_POINTER);
                inst[0] = ((inst.len() as u32) << 16) | opcode;
            }
        }
        if let Some(w) = barrier_semantics(opcode)
            && let Some(&twin) = twins.get(&inst[w])
        {
            inst[w] = twin;
        }
        out.extend_from_slice(&inst);
        if opcode == OP_CONSTANT
            && count == 4
            && let Some(&twin) = twins.get(&inst[2])
        {
            out.extend_from_slice(&[
                (4 << 16) | OP_CONSTANT,
                inst[1],
                twin,
                inst[3] | MAKE_AVAILABLE | MAKE_VISIBLE,
            ]);
        }
    }
    *words = out;
    Ok(())
}

/// Every pointer value into workgroup memory: the workgroup pointer types, then the values of
/// those types (variables, access chains and copies of them).
fn workgroup_pointers(words: &[u32], all: &[(usize, usize)]) -> HashSet<u32> {
    let mut types = HashSet::new();
    let mut pointers = HashSet::new();
    for &(at, count) in all {
        let opcode = words[at] & 0xffff;
        if opcode == OP_TYPE_POINTER && count == 4 && words[at + 2] == STORAGE_WORKGROUP {
            types.insert(words[at + 1]);
        }
        let derives =
            [OP_VARIABLE, OP_ACCESS_CHAIN, OP_IN_BOUNDS_ACCESS_CHAIN, OP_PTR_ACCESS_CHAIN, OP_COPY_OBJECT];
        if derives.contains(&opcode) && count >= 3 && types.contains(&words[at + 1]) {
            pointers.insert(words[at + 2]);
        }
    }
    pointers
}

/// Types that only workgroup pointer types point to. A type is used where an instruction names
/// it as its result type (word 1 of a value instruction) or another type is built from it
/// (struct members, array elements, other pointers, function signatures); ids are unique, so a
/// word 1 that is a pointer or a block is never mistaken for a type.
fn workgroup_only_arrays(words: &[u32], all: &[(usize, usize)]) -> HashSet<u32> {
    const OP_SOURCE: u32 = 3;
    const OP_TYPE_ARRAY: u32 = 28;
    const OP_TYPE_RUNTIME_ARRAY: u32 = 29;
    const OP_TYPE_STRUCT: u32 = 30;
    const OP_TYPE_FUNCTION: u32 = 33;
    let mut pointees = HashSet::new();
    let mut used = HashSet::new();
    for &(at, count) in all {
        let opcode = words[at] & 0xffff;
        let operands = &words[at + 1..at + count];
        match opcode {
            OP_TYPE_POINTER if operands[1] == STORAGE_WORKGROUP => {
                pointees.insert(operands[2]);
            }
            OP_TYPE_POINTER => {
                used.insert(operands[2]);
            }
            OP_TYPE_ARRAY | OP_TYPE_RUNTIME_ARRAY => {
                used.insert(operands[1]);
            }
            OP_TYPE_STRUCT | OP_TYPE_FUNCTION => used.extend(&operands[1..]),
            // Literals in word 1, or declarations: nothing to count.
            OP_SOURCE | OP_NAME | OP_MEMBER_NAME | OP_EXTENSION | OP_MEMORY_MODEL | OP_CAPABILITY
            | OP_DECORATE | OP_MEMBER_DECORATE => {}
            OP_TYPE_VOID..=OP_TYPE_FORWARD_POINTER => {}
            _ => {
                if let Some(&first) = operands.first() {
                    used.insert(first);
                }
            }
        }
    }
    pointees.difference(&used).copied().collect()
}

/// The memory model a module declares, and whether it names the `VulkanMemoryModel` capability.
fn memory_model(words: &[u32]) -> Option<(u32, bool)> {
    let all = instructions(words).ok()?;
    let (mut model, mut capability) = (None, false);
    for (at, count) in all {
        match words[at] & 0xffff {
            OP_MEMORY_MODEL if count == 3 => model = Some(words[at + 2]),
            OP_CAPABILITY if words[at + 1] == CAPABILITY_VULKAN_MEMORY_MODEL => capability = true,
            _ => {}
        }
    }
    model.map(|m| (m, capability))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Variant, coop_candidates};

    fn coop_wgsl() -> String {
        let v: Variant = coop_candidates(64, true).next().expect("a coop shape for D=64");
        crate::shader::generate(&v)
    }

    /// An FMA kernel's module (no cooperative matrices: naga declares GLSL450).
    fn fma_words() -> Vec<u32> {
        let v =
            crate::plan::candidates(crate::plan::KernelType::F32, 64, false, None).next().expect("a variant");
        compile(&crate::shader::generate(&v), Checks::None, (1, 6)).unwrap()
    }

    #[test]
    fn naga_declares_the_vulkan_model_for_cooperative_matrices_only() {
        let naga_words = compile(&coop_wgsl(), Checks::None, (1, 6)).unwrap();
        assert_eq!(memory_model(&naga_words), Some((MEMORY_MODEL_VULKAN, true)));
        // GLSL450 is memory model 1.
        assert_eq!(memory_model(&fma_words()), Some((1, false)));
    }

    /// Every workgroup access of the annotated module is non-private and every ordering barrier
    /// makes memory available and visible; nothing else changed.
    #[test]
    fn the_annotations_cover_every_workgroup_access_and_barrier() {
        let naga_words = compile(&coop_wgsl(), Checks::None, (1, 6)).unwrap();
        let mut words = naga_words.clone();
        annotate_vulkan_memory_model(&mut words).unwrap();
        let all = instructions(&words).unwrap();
        let values = constants(&words, &all);
        let (mut accesses, mut barriers) = (0, 0);
        let workgroup = workgroup_pointers(&words, &all);
        for &(at, count) in &all {
            let opcode = words[at] & 0xffff;
            if let Some((mem, ptr)) = memory_access(opcode)
                && workgroup.contains(&words[at + ptr])
            {
                assert!(count > mem && words[at + mem] & NON_PRIVATE_POINTER != 0, "word {at}");
                accesses += 1;
            }
            if let Some(w) = barrier_semantics(opcode) {
                let value = values[&words[at + w]];
                assert_eq!(
                    value & (MAKE_AVAILABLE | MAKE_VISIBLE),
                    MAKE_AVAILABLE | MAKE_VISIBLE,
                    "word {at}"
                );
                barriers += 1;
            }
        }
        assert!(accesses > 10 && barriers > 3, "{accesses} accesses, {barriers} barriers");
        // ArrayStride stays on the buffers' runtime arrays and goes from the workgroup arrays.
        let strides = |w: &[u32]| {
            let all = instructions(w).unwrap();
            all.iter()
                .filter(|&&(at, count)| {
                    w[at] & 0xffff == OP_DECORATE && count == 4 && w[at + 2] == DECORATION_ARRAY_STRIDE
                })
                .count()
        };
        let workgroup_arrays = workgroup_only_arrays(&naga_words, &instructions(&naga_words).unwrap()).len();
        assert_eq!(workgroup_arrays, 3, "scratch, ps and the flags");
        assert_eq!(strides(&words), strides(&naga_words) - workgroup_arrays);
        assert!(strides(&words) >= 3, "q/k/v, o and lse keep theirs");
        // Each access grew by at most one word, each twin constant is 4 words, and each dropped
        // decoration 4 words less.
        let twins = (words[3] - naga_words[3]) as usize;
        assert!(words.len() <= naga_words.len() + accesses + 4 * twins);
    }

    #[test]
    fn refuses_what_it_cannot_rewrite() {
        let mut not_spirv = vec![1, 2, 3, 4, 5, 6];
        assert!(annotate_vulkan_memory_model(&mut not_spirv).unwrap_err().contains("magic"));
        let mut truncated = vec![MAGIC, 0x0001_0600, 0, 10, 0, (9 << 16) | OP_STORE, 1];
        assert!(annotate_vulkan_memory_model(&mut truncated).unwrap_err().contains("past the end"));
        let mut glsl = fma_words();
        assert!(annotate_vulkan_memory_model(&mut glsl).unwrap_err().contains("does not declare"));
    }
}
