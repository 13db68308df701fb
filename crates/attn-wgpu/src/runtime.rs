//! The adapter, the device, and everything created once per backend: the bind-group layout,
//! the pipeline layout, and a cache of compiled pipelines keyed by [`Variant`].
//!
//! The device is the backend's own ([`Gpu::open`]) or the caller's ([`Gpu::attach`]).
//!
//! wgpu reports validation errors through a callback that panics by default; a device the
//! backend opens installs one that records the message instead (a caller's device keeps its
//! own), and every call that can fail is wrapped in an error scope, so that a mistake becomes an
//! [`Error`] and never a panic or a lost device.

use crate::options::{Checks, Options};
use crate::plan::{AdapterCaps, KernelType, SOFTWARE_LOOP_LIMIT, Variant};
use crate::repack::Repack;
use crate::shader;
use attn_core::{DeviceKind, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// An open device and its per-backend state.
pub struct Gpu {
    /// The adapter's name and kind, limits and features, as the planner sees them.
    pub caps: AdapterCaps,
    /// `name (backend, driver)`, for `attn backends`.
    pub description: String,
    /// This process's number for the device: plans carry it, so that a plan made for one
    /// device is refused on another.
    pub(crate) id: u64,
    /// `min_storage_buffer_offset_alignment` (at least 4): where a binding of a caller's buffer
    /// may start.
    pub(crate) storage_offset_alignment: u64,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    pipelines: Mutex<HashMap<Variant, Arc<wgpu::ComputePipeline>>>,
    /// The bindings of `kernels/merge.wgsl` (a key split's merge step), and its pipelines by
    /// element type.
    pub(crate) merge_layout: wgpu::BindGroupLayout,
    merge_pipeline_layout: wgpu::PipelineLayout,
    merges: Mutex<HashMap<KernelType, Arc<wgpu::ComputePipeline>>>,
    /// The bindings of `kernels/pack.wgsl` and `kernels/unpack.wgsl` (the device-resident
    /// calls' layout changes), and their pipelines by direction and element types.
    pub(crate) pack_layout: wgpu::BindGroupLayout,
    pack_pipeline_layout: wgpu::PipelineLayout,
    pub(crate) unpack_layout: wgpu::BindGroupLayout,
    unpack_pipeline_layout: wgpu::PipelineLayout,
    /// The bindings of `kernels/seqs.wgsl` (the sequence table of a device-resident call).
    pub(crate) seqs_layout: wgpu::BindGroupLayout,
    seqs_pipeline_layout: wgpu::PipelineLayout,
    repacks: Mutex<HashMap<Repack, Arc<wgpu::ComputePipeline>>>,
    /// What naga adds to every shader: see [`Checks`].
    checks: Checks,
    /// The last error wgpu reported outside an error scope.
    uncaptured: Arc<Mutex<Option<String>>>,
}

/// The one sentence a user without an adapter needs.
const NO_ADAPTER: &str = "no Vulkan, Metal or DX12 adapter found: install a GPU driver, or \
     Mesa's software one (Debian/Ubuntu: apt-get install mesa-vulkan-drivers) for lavapipe";

impl Gpu {
    /// Opens the preferred adapter (high performance; `WGPU_ADAPTER_NAME` and `WGPU_BACKEND`
    /// are honoured) with its real limits, not wgpu's defaults, and the optional features the
    /// kernel uses. Returns why not, as a sentence, when there is none.
    pub fn open(options: &Options) -> std::result::Result<Gpu, String> {
        // A missing loader can surface as a panic inside a driver probe; never let it escape.
        std::panic::catch_unwind(|| Self::open_inner(options))
            .unwrap_or_else(|_| Err(format!("{NO_ADAPTER} (wgpu panicked while probing)")))
    }

    fn open_inner(settings: &Options) -> std::result::Result<Gpu, String> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        if std::env::var_os("WGPU_BACKEND").is_none() {
            desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
        }
        let instance = wgpu::Instance::new(desc);
        let options = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        };
        let adapter = match std::env::var("WGPU_ADAPTER_NAME") {
            Ok(name) if !name.is_empty() => {
                let all = pollster::block_on(instance.enumerate_adapters(desc_backends()));
                let lower = name.to_lowercase();
                all.into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&lower))
                    .ok_or_else(|| format!("no adapter matches WGPU_ADAPTER_NAME={name}"))?
            }
            _ => {
                pollster::block_on(instance.request_adapter(&options)).map_err(|_| NO_ADAPTER.to_string())?
            }
        };
        let info = adapter.get_info();
        let wanted = wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
        let mut features = adapter.features() & wanted;
        let coop_wanted = settings.coop.unwrap_or(info.vendor == NVIDIA);
        if coop_wanted && coop_f16_offered(&adapter) {
            // Its SPIR-V is compiled here and passed through (crate::spirv says why).
            features |= COOP_FEATURES;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("attn"),
            required_features: features,
            required_limits: adapter.limits(),
            memory_hints: wgpu::MemoryHints::Performance,
            // SAFETY: wgpu's experimental cooperative matrices, asked for only where the adapter
            // offers them and the kernel that uses them has passed verification on that vendor's
            // driver (or ATTN_WGPU_COOP=1 says to try); see `NVIDIA`.
            experimental_features: if features.contains(COOP_FEATURES) {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        }))
        .map_err(|e| format!("{}: could not open a device: {e}", info.name))?;
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            *sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        }));
        Ok(Self::on_device(&adapter, device, queue, settings, uncaptured))
    }

    /// The backend's state on a device the caller opened: limits and features are read off
    /// `device` (what it was opened with, not what the adapter could offer), and nothing on it is
    /// changed: its uncaptured-error handler stays the caller's (every call of this crate runs in
    /// its own error scopes).
    pub fn attach(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        settings: &Options,
    ) -> Gpu {
        Self::on_device(adapter, device, queue, settings, Arc::new(Mutex::new(None)))
    }

    /// Caps, layouts and empty caches on an open device.
    fn on_device(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        settings: &Options,
        uncaptured: Arc<Mutex<Option<String>>>,
    ) -> Gpu {
        let info = adapter.get_info();
        let features = device.features();
        let limits = device.limits();
        let coop_wanted = settings.coop.unwrap_or(info.vendor == NVIDIA);
        let coop_f16 = coop_wanted && features.contains(COOP_FEATURES) && coop_f16_offered(adapter);
        let software = info.device_type == wgpu::DeviceType::Cpu;
        let caps = AdapterCaps {
            name: info.name.clone(),
            kind: if software { DeviceKind::SoftwareGpu } else { DeviceKind::Gpu },
            workgroup_storage: limits.max_compute_workgroup_storage_size,
            invocations: limits
                .max_compute_invocations_per_workgroup
                .min(limits.max_compute_workgroup_size_x),
            workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
            storage_binding: limits.max_storage_buffer_binding_size.min(limits.max_buffer_size),
            f16: features.contains(wgpu::Features::SHADER_F16),
            subgroup_min: features.contains(wgpu::Features::SUBGROUP).then_some(info.subgroup_min_size),
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            coop_f16,
            loop_limit: software.then_some(SOFTWARE_LOOP_LIMIT),
        };
        let coop_note = match (coop_wanted, coop_f16) {
            (true, true) => {
                "; f16 on cooperative matrices (wgpu's experimental feature; ATTN_WGPU_COOP=0 turns it off)"
            }
            (true, false) => {
                "; no cooperative matrices for f16: no 16x16x16 f16/f32 ones on subgroups of 32 here, \
                 or the device was opened without them"
            }
            _ => "",
        };
        let description = format!(
            "{} ({:?}, {:?}, {} {}{coop_note})",
            info.name, info.device_type, info.backend, info.driver, info.driver_info
        );
        // `kernels/bindings.wgsl`: q, k, v; o, lse, status; the ALiBi slopes and the sequence
        // lengths (declared only by the kernels that read them).
        let (layout, pipeline_layout) =
            layouts(&device, "attn flash", &[true, true, true, false, false, false, true, true]);
        // `kernels/merge.wgsl`: the part's o and lse; the running o, lse, o.
        let (merge_layout, merge_pipeline_layout) =
            layouts(&device, "attn merge", &[true, true, false, false, false]);
        // `kernels/pack.wgsl`: the caller's tensor; the packed one; the sequence table and the
        // index arrays.
        let (pack_layout, pack_pipeline_layout) = layouts(&device, "attn pack", &[true, false, true, true]);
        // `kernels/unpack.wgsl`: the packed o and lse, the status word; the caller's o and lse;
        // the sequence table.
        let (unpack_layout, unpack_pipeline_layout) =
            layouts(&device, "attn unpack", &[true, true, true, false, false, true]);
        // `kernels/seqs.wgsl`: the index arrays; the sequence table.
        let (seqs_layout, seqs_pipeline_layout) = layouts(&device, "attn seqs", &[true, false]);
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Gpu {
            caps,
            description,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            storage_offset_alignment: u64::from(limits.min_storage_buffer_offset_alignment.max(4)),
            device,
            queue,
            layout,
            pipeline_layout,
            pipelines: Mutex::new(HashMap::new()),
            merge_layout,
            merge_pipeline_layout,
            merges: Mutex::new(HashMap::new()),
            pack_layout,
            pack_pipeline_layout,
            unpack_layout,
            unpack_pipeline_layout,
            seqs_layout,
            seqs_pipeline_layout,
            repacks: Mutex::new(HashMap::new()),
            checks: settings.checks,
            uncaptured,
        }
    }

    /// The run-time guards its shaders are compiled with.
    pub fn checks(&self) -> Checks {
        self.checks
    }

    /// The compiled pipeline of `variant`: generated, compiled and cached on first use.
    pub(crate) fn pipeline(&self, variant: &Variant) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.pipelines.lock().unwrap_or_else(|e| e.into_inner()).get(variant) {
            return Ok(p.clone());
        }
        let source = shader::generate(variant);
        let name = variant.name();
        let spirv = if variant.kernel == crate::plan::Kernel::Coop {
            let words = crate::spirv::compile_coop(&source, self.checks)
                .map_err(|e| Error::backend("wgpu", format!("compiling {name}: {e}")))?;
            Some(words)
        } else {
            None
        };
        let pipeline = self.scoped(&format!("compiling {name}"), || {
            // SAFETY (both arms): the kernel's loops all end (their bounds are constants or
            // uniform sizes, never data) and its indices stay in bounds (workgroup arrays by
            // their constant loop limits; storage buffers by the FMA kernels' seq_q guards (Q
            // and O), or, for their unguarded K and V reads and the cooperative-matrix kernel's
            // matrix loads, each head's rows padded to whole tiles (`plan::padded_rows`,
            // `pack::pack_inputs`), and the buffer sizes `plan::choose` derives from the same
            // problem); `Checks` says which
            // promise each mode leans on. The passed-through SPIR-V is naga's output for the
            // validated module, changed only by `spirv::annotate_vulkan_memory_model` (its memory-model
            // declaration or annotations), and its bindings are the layout's.
            let module = match &spirv {
                Some(words) => unsafe {
                    self.device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                        label: Some(&name),
                        entry_points: vec![wgpu::PassthroughShaderEntryPoint {
                            name: "main".into(),
                            workgroup_size: (variant.threads(), 1, 1),
                        }]
                        .into(),
                        spirv: Some(words.as_slice().into()),
                        ..Default::default()
                    })
                },
                None => {
                    let desc = wgpu::ShaderModuleDescriptor {
                        label: Some(&name),
                        source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
                    };
                    unsafe { self.device.create_shader_module_trusted(desc, self.checks.runtime_checks()) }
                }
            };
            self.compute_pipeline(&name, &self.pipeline_layout, &module)
        })?;
        let pipeline = Arc::new(pipeline);
        self.pipelines.lock().unwrap_or_else(|e| e.into_inner()).insert(*variant, pipeline.clone());
        Ok(pipeline)
    }

    /// The compiled merge step of a key split for outputs of element type `ty`.
    pub(crate) fn merge_pipeline(&self, ty: KernelType) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.merges.lock().unwrap_or_else(|e| e.into_inner()).get(&ty) {
            return Ok(p.clone());
        }
        let source = shader::merge(ty);
        let pipeline = self.scoped("compiling the key split's merge step", || {
            let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("attn merge"),
                source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
            });
            self.compute_pipeline("attn merge", &self.merge_pipeline_layout, &module)
        })?;
        let pipeline = Arc::new(pipeline);
        self.merges.lock().unwrap_or_else(|e| e.into_inner()).insert(ty, pipeline.clone());
        Ok(pipeline)
    }

    /// The compiled pack or unpack pass `which` (device-resident calls: see [`crate::repack`]).
    pub(crate) fn repack_pipeline(&self, which: Repack) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.repacks.lock().unwrap_or_else(|e| e.into_inner()).get(&which) {
            return Ok(p.clone());
        }
        let (label, source, layout) = match which {
            Repack::Pack { .. } => ("attn pack", which.source(), &self.pack_pipeline_layout),
            Repack::Unpack { .. } => ("attn unpack", which.source(), &self.unpack_pipeline_layout),
            Repack::Seqs => ("attn seqs", which.source(), &self.seqs_pipeline_layout),
        };
        let pipeline = self.scoped(&format!("compiling {label}"), || {
            let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
            });
            self.compute_pipeline(label, layout, &module)
        })?;
        let pipeline = Arc::new(pipeline);
        self.repacks.lock().unwrap_or_else(|e| e.into_inner()).insert(which, pipeline.clone());
        Ok(pipeline)
    }

    /// The pipeline of `module`'s `main` with `layout`.
    fn compute_pipeline(
        &self,
        label: &str,
        layout: &wgpu::PipelineLayout,
        module: &wgpu::ShaderModule,
    ) -> wgpu::ComputePipeline {
        self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: Some(layout),
            module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        })
    }

    /// Runs `f` inside validation and out-of-memory error scopes; an error in either (or one
    /// reported through the uncaptured-error callback meanwhile) becomes an [`Error::Backend`]
    /// that names `what`.
    pub(crate) fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f();
        let errors = [pollster::block_on(validation.pop()), pollster::block_on(oom.pop())];
        let uncaptured = self.uncaptured.lock().unwrap_or_else(|e| e.into_inner()).take();
        match errors.into_iter().flatten().map(|e| e.to_string()).chain(uncaptured).next() {
            None => Ok(value),
            Some(message) => Err(Error::backend("wgpu", format!("{what}: {message}"))),
        }
    }

    /// Waits for all submitted work; a lost device or a timeout is an error.
    pub(crate) fn wait(&self, what: &str) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::backend("wgpu", format!("{what}: {e}")))
    }
}

/// What the cooperative-matrix kernel needs the device to be opened with.
const COOP_FEATURES: wgpu::Features =
    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX.union(wgpu::Features::PASSTHROUGH_SHADERS);

/// A bind-group layout of a uniform block at binding 0, then storage buffers (read-only or not,
/// as `read_only` says) at 1, 2, ..., and its pipeline layout.
fn layouts(
    device: &wgpu::Device,
    label: &str,
    read_only: &[bool],
) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
    let buffer = |binding, ty| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None },
        count: None,
    };
    let storage = read_only
        .iter()
        .enumerate()
        .map(|(i, &read_only)| buffer(i as u32 + 1, wgpu::BufferBindingType::Storage { read_only }));
    let entries: Vec<_> =
        std::iter::once(buffer(0, wgpu::BufferBindingType::Uniform)).chain(storage).collect();
    let group = device
        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries: &entries });
    let pipeline = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(label),
        bind_group_layouts: &[Some(&group)],
        immediate_size: 0,
    });
    (group, pipeline)
}

/// PCI vendor id of NVIDIA, the one vendor whose driver has run the cooperative-matrix kernel
/// through `attn verify` (the H100, driver 580.159.04): the device is opened with cooperative
/// matrices there by default, so that f16 problems run on the cooperative-matrix kernel, and
/// elsewhere only where `ATTN_WGPU_COOP=on` asks ([`crate::options::COOP`]).
const NVIDIA: u32 = 0x10de;

/// The adapter offers what the cooperative-matrix kernel needs: the feature, a 16×16×16
/// configuration with f16 inputs and f32 accumulators, and subgroups of exactly 32 (the kernel
/// gives each lane half of one of 16 rows).
fn coop_f16_offered(adapter: &wgpu::Adapter) -> bool {
    use wgpu::CooperativeScalarType as S;
    let info = adapter.get_info();
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::PASSTHROUGH_SHADERS
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP;
    adapter.features().contains(needed)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == S::F16 && p.cr_type == S::F32
        })
}

/// The backends an instance from the environment enumerates.
fn desc_backends() -> wgpu::Backends {
    wgpu::Backends::from_env()
        .unwrap_or(wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12)
}
