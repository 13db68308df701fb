//! The WGSL of any [`Variant`]: the FMA kernel's ([`crate::fma`]) or the cooperative-matrix
//! kernel's ([`crate::coop`]). Both generators build on the pieces of [`crate::wgsl`] and not on
//! each other.

use crate::plan::{Kernel, Variant};

/// The WGSL source of `variant`, ready for `create_shader_module` (or, for the
/// cooperative-matrix kernel, for `spirv::compile_coop`).
pub(crate) fn generate(variant: &Variant) -> String {
    match variant.kernel {
        Kernel::Fma => crate::fma::generate(variant),
        Kernel::Coop => crate::coop::generate(variant),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{KernelType, candidates};

    /// Every specialisation the planner can pick parses and validates (naga, no adapter needed),
    /// and its workgroup memory is what `Variant::shared_bytes` says.
    #[test]
    fn every_variant_validates_and_matches_its_shared_bytes() {
        // One thread per head dim: a few thousand shaders go through naga.
        let counts: Vec<(usize, usize)> = std::thread::scope(|scope| {
            let dims: Vec<_> =
                (32..=256).step_by(32).map(|d| scope.spawn(move || check_head_dim(d))).collect();
            dims.into_iter().map(|t| t.join().expect("a head dim's check panicked")).collect()
        });
        let checked: usize = counts.iter().map(|c| c.0).sum();
        let checked_coop: usize = counts.iter().map(|c| c.1).sum();
        assert!(checked > 100, "{checked}");
        assert!(checked_coop >= 16, "{checked_coop}");
    }

    /// Every variant of head dim `d` (both dtypes and masks, every subgroup size): (checked,
    /// of which cooperative-matrix).
    fn check_head_dim(d: u32) -> (usize, usize) {
        // Each variant once: most are the same for several subgroup sizes.
        let mut seen = std::collections::HashSet::new();
        let mut variants = Vec::new();
        for ty in [KernelType::F32, KernelType::F16] {
            for causal in [false, true] {
                for subgroup_min in [None, Some(8), Some(32)] {
                    // The cooperative-matrix kernel: f16, subgroups of 32.
                    let coop = crate::plan::coop_candidates(d, causal)
                        .filter(|_| ty == KernelType::F16 && subgroup_min == Some(32));
                    // The 8x8 kernel's shapes (the same for every subgroup size).
                    let all = coop.chain(candidates(ty, d, causal, subgroup_min));
                    variants.extend(all.filter(|v| seen.insert(*v)));
                }
            }
        }
        let (mut checked, mut checked_coop) = (0, 0);
        for v in variants {
            let src = generate(&v);
            assert!(!src.contains("{{"), "{}: unsubstituted placeholder", v.name());
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{}: {}", v.name(), e.emit_to_string(&src)));
            // Only what the device is opened with (runtime.rs): not, for example, subgroup
            // barriers.
            use naga::valid::Capabilities as C;
            let caps = C::SUBGROUP
                | if v.ty == KernelType::F16 { C::SHADER_FLOAT16 } else { C::empty() }
                | if v.kernel == Kernel::Coop { C::COOPERATIVE_MATRIX } else { C::empty() };
            let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
            validator
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {}", v.name(), e.emit_to_string(&src)));
            let shared: u32 = module
                .global_variables
                .iter()
                .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
                .map(|(_, g)| module.types[g.ty].inner.size(module.to_ctx()))
                .sum();
            assert_eq!(shared, v.shared_bytes(), "{}", v.name());
            checked += 1;
            checked_coop += usize::from(v.kernel == Kernel::Coop);
        }
        (checked, checked_coop)
    }
}
