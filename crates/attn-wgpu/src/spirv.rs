//! SPIR-V for the cooperative-matrix kernel, compiled here instead of by wgpu, so that it can be
//! given the memory model its workgroup hand-overs need.
//!
//! naga (30) declares the Vulkan memory model for any shader with cooperative matrices, but
//! writes SPIR-V for the older GLSL450 model: no access is marked `NonPrivatePointer` and its
//! barriers carry no `MakeAvailable`/`MakeVisible` semantics (gfx-rs/wgpu#8805). Under the
//! Vulkan model such plain workgroup stores are not ordered before another invocation's loads
//! by a barrier, which is exactly what the kernel relies on (probabilities stored by lanes, read
//! by a cooperative load). [`compile_coop`] therefore runs naga itself and declares the GLSL450
//! model instead ([`use_glsl450_memory_model`]): nothing in naga's output uses the Vulkan
//! model's extra operands, and `SPV_KHR_cooperative_matrix` does not require that model. The
//! module then goes to the driver through wgpu's SPIR-V passthrough.

use crate::runtime::Checks;

/// SPIR-V words of `wgsl` (one compute entry point, `main`) for a Vulkan 1.3 device, as
/// wgpu would compile them with `checks`, then moved to the GLSL450 memory model when `glsl450`
/// (the fix; `false` keeps naga's declaration, to reproduce the fault).
pub fn compile_coop(wgsl: &str, checks: Checks, glsl450: bool) -> Result<Vec<u32>, String> {
    // What wgpu asks of naga on a Vulkan 1.3+ device; the cooperative-matrix path is only
    // opened where the driver offers VK_KHR_cooperative_matrix, which needs such a driver.
    let mut words = compile(wgsl, checks, (1, 6))?;
    if glsl450 {
        use_glsl450_memory_model(&mut words)?;
    }
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

const OP_EXTENSION: u32 = 10;
const OP_MEMORY_MODEL: u32 = 14;
const OP_CAPABILITY: u32 = 17;
const OP_LOAD: u32 = 61;
const OP_STORE: u32 = 62;
const CAPABILITY_VULKAN_MEMORY_MODEL: u32 = 5345;
const MEMORY_MODEL_GLSL450: u32 = 1;
const MEMORY_MODEL_VULKAN: u32 = 3;
/// Memory-operand bits that exist only under the Vulkan model: MakePointerAvailable,
/// MakePointerVisible, NonPrivatePointer.
const VULKAN_ONLY_OPERANDS: u32 = 0x8 | 0x10 | 0x20;
const VULKAN_EXTENSION: &str = "SPV_KHR_vulkan_memory_model";

/// Rewrites a module that declares the Vulkan memory model to declare GLSL450: drops the
/// `VulkanMemoryModel` capability and its extension and changes `OpMemoryModel`. Refuses (rather
/// than change the meaning of) a module whose loads or stores use operands of the Vulkan model.
/// A module already on GLSL450 is left as it is.
pub fn use_glsl450_memory_model(words: &mut Vec<u32>) -> Result<(), String> {
    const HEADER: usize = 5;
    if words.len() < HEADER || words[0] != 0x0723_0203 {
        return Err("not a SPIR-V module (bad magic number)".into());
    }
    let mut out = words[..HEADER].to_vec();
    let mut at = HEADER;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        let opcode = words[at] & 0xffff;
        if count == 0 || at + count > words.len() {
            return Err(format!("malformed SPIR-V: instruction at word {at} runs past the end"));
        }
        let inst = &words[at..at + count];
        let drop = match opcode {
            OP_CAPABILITY => inst[1] == CAPABILITY_VULKAN_MEMORY_MODEL,
            OP_EXTENSION => literal_string(&inst[1..]) == VULKAN_EXTENSION,
            _ => false,
        };
        // Memory operands follow the fixed operands: OpLoad (type, result, pointer) and OpStore
        // (pointer, object).
        let operands = match opcode {
            OP_LOAD => inst.get(4),
            OP_STORE => inst.get(3),
            _ => None,
        };
        if operands.is_some_and(|m| m & VULKAN_ONLY_OPERANDS != 0) {
            return Err(format!("word {at}: a load or store uses the Vulkan memory model's operands"));
        }
        if !drop {
            out.extend_from_slice(inst);
            if opcode == OP_MEMORY_MODEL && count == 3 && inst[2] == MEMORY_MODEL_VULKAN {
                let last = out.len() - 1;
                out[last] = MEMORY_MODEL_GLSL450;
            }
        }
        at += count;
    }
    *words = out;
    Ok(())
}

/// A nul-terminated SPIR-V literal string (four bytes per word, little-endian).
fn literal_string(words: &[u32]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The memory model a module declares, and whether it names the `VulkanMemoryModel` capability.
pub fn memory_model(words: &[u32]) -> Option<(u32, bool)> {
    let mut at = 5;
    let (mut model, mut capability) = (None, false);
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        let opcode = words[at] & 0xffff;
        if count == 0 || at + count > words.len() {
            return None;
        }
        match opcode {
            OP_MEMORY_MODEL if count == 3 => model = Some(words[at + 2]),
            OP_CAPABILITY if words[at + 1] == CAPABILITY_VULKAN_MEMORY_MODEL => capability = true,
            _ => {}
        }
        at += count;
    }
    model.map(|m| (m, capability))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Variant, coop_candidates};

    fn coop_variant() -> Variant {
        coop_candidates(64, true).next().expect("a coop shape for D=64")
    }

    #[test]
    fn naga_declares_the_vulkan_model_and_the_rewrite_moves_it_to_glsl450() {
        let wgsl = crate::shader::generate(&coop_variant());
        let naga_words = compile_coop(&wgsl, Checks::None, false).unwrap();
        assert_eq!(memory_model(&naga_words), Some((MEMORY_MODEL_VULKAN, true)));
        let fixed = compile_coop(&wgsl, Checks::None, true).unwrap();
        assert_eq!(memory_model(&fixed), Some((MEMORY_MODEL_GLSL450, false)));
        // Only the capability (2 words) and the extension went (1 word, then the name with its
        // nul in 4-byte words).
        assert_eq!(naga_words.len() - fixed.len(), 2 + 1 + VULKAN_EXTENSION.len() / 4 + 1);
        let text: Vec<u8> = fixed.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert!(!text.windows(VULKAN_EXTENSION.len()).any(|w| w == VULKAN_EXTENSION.as_bytes()));
    }

    #[test]
    fn refuses_what_it_cannot_rewrite() {
        let mut not_spirv = vec![1, 2, 3, 4, 5, 6];
        assert!(use_glsl450_memory_model(&mut not_spirv).unwrap_err().contains("magic"));
        // Header, then an OpStore (3 words + memory operands) with NonPrivatePointer.
        let mut vulkan_store = vec![0x0723_0203, 0x0001_0600, 0, 10, 0, (4 << 16) | OP_STORE, 1, 2, 0x20];
        assert!(use_glsl450_memory_model(&mut vulkan_store).unwrap_err().contains("operands"));
        let mut truncated = vec![0x0723_0203, 0x0001_0600, 0, 10, 0, (9 << 16) | OP_STORE, 1];
        assert!(use_glsl450_memory_model(&mut truncated).unwrap_err().contains("past the end"));
    }
}
