//! For tools that hand the kernels to a driver themselves (the `pipeline_stats` example, which
//! asks the Vulkan driver for each kernel's registers and spills): the adapter as the planner
//! sees it, and each kernel the planner could pick there, with its SPIR-V.

use crate::options::{Checks, Options};
use crate::plan::{self, AdapterCaps, KernelType, Variant};
use attn_core::{DType, Problem, Shape};

/// One kernel that fits the adapter.
pub struct KernelSource {
    /// The name plans use.
    pub name: String,
    /// Workgroup memory, bytes.
    pub shared_bytes: u32,
    /// The planner's own choice for the problem asked about.
    pub chosen: bool,
    variant: Variant,
}

impl KernelSource {
    /// Its SPIR-V (Vulkan 1.1 words) as the backend would build it: no naga run-time checks.
    pub fn spirv(&self) -> Result<Vec<u32>, String> {
        crate::spirv::compile(&crate::shader::generate(&self.variant), Checks::None, (1, 3))
    }
}

/// The preferred adapter's capabilities, as the backend with `options` plans with them, or why
/// there is none.
pub fn adapter(options: &Options) -> Result<AdapterCaps, String> {
    crate::runtime::Gpu::open(options).map(|gpu| gpu.caps)
}

/// Every FMA kernel for `dtype` (f32 or f16), `head_dim` (a multiple of 32) and the mask that
/// fits `caps`, in the planner's order; the one it picks for a problem of 4096 rows is marked.
pub fn fma_kernels(caps: &AdapterCaps, dtype: DType, head_dim: u32, causal: bool) -> Vec<KernelSource> {
    let ty = if dtype == DType::F16 { KernelType::F16 } else { KernelType::F32 };
    let mut problem = Problem::new(Shape::new(1, 1, 4096, head_dim as usize), dtype);
    if causal {
        problem = problem.causal();
    }
    let chosen = plan::choose(&problem, caps).map(|c| c.variant).ok();
    plan::candidates(ty, head_dim, causal, caps.subgroup_min)
        .filter(|v| v.shared_bytes() <= caps.workgroup_storage && v.threads() <= caps.invocations)
        .map(|variant| KernelSource {
            name: variant.name(),
            shared_bytes: variant.shared_bytes(),
            chosen: Some(variant) == chosen,
            variant,
        })
        .collect()
}
