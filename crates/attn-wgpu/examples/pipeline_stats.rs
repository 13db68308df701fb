//! What the driver made of each kernel variant: registers, spills, instruction counts, as the
//! Vulkan driver reports them through `VK_KHR_pipeline_executable_properties`.
//!
//! wgpu neither enables that extension nor asks for statistics, so this opens its own Vulkan
//! device (through `ash`) on the adapter wgpu would pick, compiles the same WGSL to SPIR-V with
//! the same naga options the backend uses (no index clamps, no loop caps), and prints every
//! statistic of every variant that fits the adapter for the given dtypes and head dims (the
//! planner's choice marked `*`). Workgroup memory is not zero-initialised here (wgpu does that
//! per dispatch); everything else matches.
//!
//! `cargo run --release -p attn-wgpu --example pipeline_stats -- [f32,f16] [64,128] [part] [causal]`
//! (`part`: only variants whose name contains it, e.g. `_vd`; the planner's choice is always
//! printed; `causal`: the causal variants instead of those without a mask).
//! Prints why not and exits 0 where there is no Vulkan adapter or the driver lacks the extension.
//! With `ATTN_WGPU_IR_DIR=<dir>`, also writes whatever internal representations the driver
//! gives for each printed variant (`<dir>/<variant>.<n>.<name>.txt`; none is a valid answer).

use ash::vk;
use attn_core::DType;
use attn_wgpu::inspect;
use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dtypes = args.first().map_or("f32,f16", String::as_str).to_string();
    let dims = args.get(1).map_or("64,128", String::as_str).to_string();
    let part = args.get(2).cloned().unwrap_or_default();
    let causal = args.get(3).is_some_and(|m| m == "causal");
    let options = attn_wgpu::Options::from_env()?;
    let caps = match inspect::adapter(&options) {
        Ok(caps) => caps,
        Err(reason) => {
            println!("SKIPPED pipeline_stats: {reason}");
            return Ok(());
        }
    };
    // SAFETY: loading the system's Vulkan loader; it stays loaded for the life of `entry`.
    let vulkan = match unsafe { Vulkan::open(&caps.name) } {
        Ok(v) => v,
        Err(reason) => {
            println!("SKIPPED pipeline_stats: {reason}");
            return Ok(());
        }
    };
    println!("adapter {} ({} B of workgroup memory)", caps.name, caps.workgroup_storage);
    for dtype in dtypes.split(',') {
        let dtype = if dtype == "f16" { DType::F16 } else { DType::F32 };
        for d in dims.split(',').map(str::parse::<u32>) {
            for k in inspect::fma_kernels(&caps, dtype, d?, causal) {
                if !k.chosen && !k.name.contains(&part) {
                    continue;
                }
                let mark = if k.chosen { "*" } else { " " };
                // SAFETY: `vulkan` owns a live device; the SPIR-V comes from a validated module.
                let stats = unsafe { vulkan.statistics(&k.spirv()?, &k.name, options.ir_dir.as_deref())? };
                println!("{mark} {:<44} {:>6} B  {stats}", k.name, k.shared_bytes);
            }
        }
    }
    Ok(())
}

/// A Vulkan device with pipeline statistics enabled, and the one layout every variant uses.
struct Vulkan {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    stats: ash::khr::pipeline_executable_properties::Device,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
}

impl Vulkan {
    /// Opens the physical device whose name contains `name`, with the extension and the 16-bit
    /// features the f16 kernels need.
    unsafe fn open(name: &str) -> Result<Vulkan, String> {
        fn err(what: &'static str) -> impl Fn(vk::Result) -> String {
            move |e| format!("{what}: {e}")
        }
        // SAFETY (whole body): plain Vulkan setup calls on objects created here, in order.
        unsafe {
            let entry = ash::Entry::load().map_err(|e| format!("no Vulkan loader: {e}"))?;
            let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_2);
            let instance = entry
                .create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None)
                .map_err(err("vkCreateInstance"))?;
            let physical = instance
                .enumerate_physical_devices()
                .map_err(err("vkEnumeratePhysicalDevices"))?
                .into_iter()
                .find(|&pd| {
                    let props = instance.get_physical_device_properties(pd);
                    props.device_name_as_c_str().is_ok_and(|n| name.contains(&*n.to_string_lossy()))
                })
                .ok_or_else(|| format!("no Vulkan device named like {name}"))?;
            let ext = ash::khr::pipeline_executable_properties::NAME;
            let has_ext = instance
                .enumerate_device_extension_properties(physical)
                .map_err(err("vkEnumerateDeviceExtensionProperties"))?
                .iter()
                .any(|e| e.extension_name_as_c_str() == Ok(ext));
            if !has_ext {
                return Err(format!("{name} does not offer {}", ext.to_string_lossy()));
            }
            let family = instance
                .get_physical_device_queue_family_properties(physical)
                .iter()
                .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
                .ok_or("no compute queue")? as u32;
            let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
            let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
            let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut v11).push_next(&mut v12);
            instance.get_physical_device_features2(physical, &mut features);
            let (f16, storage16) = (v12.shader_float16, v11.storage_buffer16_bit_access);
            let mut v11 =
                vk::PhysicalDeviceVulkan11Features::default().storage_buffer16_bit_access(storage16 != 0);
            let mut v12 = vk::PhysicalDeviceVulkan12Features::default().shader_float16(f16 != 0);
            let mut exec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
                .pipeline_executable_info(true);
            let priorities = [1.0];
            let queues = [vk::DeviceQueueCreateInfo::default()
                .queue_family_index(family)
                .queue_priorities(&priorities)];
            let names = [ext.as_ptr()];
            let info = vk::DeviceCreateInfo::default()
                .queue_create_infos(&queues)
                .enabled_extension_names(&names)
                .push_next(&mut exec)
                .push_next(&mut v11)
                .push_next(&mut v12);
            let device = instance.create_device(physical, &info, None).map_err(err("vkCreateDevice"))?;
            let stats = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
            // The backend's bind group layout: a uniform, then q, k, v (read) and o, lse.
            let bindings: Vec<_> = (0..6)
                .map(|b| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(b)
                        .descriptor_type(if b == 0 {
                            vk::DescriptorType::UNIFORM_BUFFER
                        } else {
                            vk::DescriptorType::STORAGE_BUFFER
                        })
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            let set_layout = device
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                    None,
                )
                .map_err(err("vkCreateDescriptorSetLayout"))?;
            let sets = [set_layout];
            let layout = device
                .create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&sets), None)
                .map_err(err("vkCreatePipelineLayout"))?;
            Ok(Vulkan { _entry: entry, instance, device, stats, set_layout, layout })
        }
    }

    /// Compiles `words` into a compute pipeline and returns the driver's statistics, one line;
    /// with `ATTN_WGPU_IR_DIR` set, writes the internal representations there under `name`.
    unsafe fn statistics(
        &self,
        words: &[u32],
        name: &str,
        ir_dir: Option<&std::path::Path>,
    ) -> Result<String, Box<dyn Error>> {
        // SAFETY (whole body): the module and pipeline are created, queried and destroyed here.
        unsafe {
            let module =
                self.device.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(words), None)?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            let info = vk::ComputePipelineCreateInfo::default().stage(stage).layout(self.layout).flags(
                if ir_dir.is_some() {
                    vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                        | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR
                } else {
                    vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                },
            );
            let pipeline = self
                .device
                .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
                .map_err(|(_, e)| e)?[0];
            let mut parts = vec![];
            let executables = self
                .stats
                .get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))?;
            for index in 0..executables.len() as u32 {
                let which =
                    vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(index);
                for s in self.stats.get_pipeline_executable_statistics(&which)? {
                    let name =
                        s.name_as_c_str().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    let value = match s.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                        _ => format!("{:.1}", s.value.f64),
                    };
                    parts.push(format!("{name}={value}"));
                }
                if let Some(dir) = &ir_dir {
                    let written = self.write_representations(&which, dir, &format!("{name}.{index}"))?;
                    parts.push(format!("representations={written}"));
                }
            }
            self.device.destroy_pipeline(pipeline, None);
            self.device.destroy_shader_module(module, None);
            Ok(parts.join(" "))
        }
    }
}

impl Vulkan {
    /// Writes each internal representation of executable `which` to `dir/<stem>.<n>.<name>.txt`;
    /// returns how many there were.
    unsafe fn write_representations(
        &self,
        which: &vk::PipelineExecutableInfoKHR,
        dir: &std::path::Path,
        stem: &str,
    ) -> Result<usize, Box<dyn Error>> {
        // SAFETY: the two-call idiom of vkGetPipelineExecutableInternalRepresentationsKHR: the
        // first (through ash) gives the count and each size, the second fills buffers of those
        // sizes, which outlive the call.
        unsafe {
            let sized = self.stats.get_pipeline_executable_internal_representations(which)?;
            let mut buffers: Vec<Vec<u8>> = sized.iter().map(|r| vec![0u8; r.data_size]).collect();
            let mut reps: Vec<vk::PipelineExecutableInternalRepresentationKHR> = buffers
                .iter_mut()
                .map(|b| vk::PipelineExecutableInternalRepresentationKHR {
                    data_size: b.len(),
                    p_data: b.as_mut_ptr().cast(),
                    ..Default::default()
                })
                .collect();
            let mut count = reps.len() as u32;
            (self.stats.fp().get_pipeline_executable_internal_representations_khr)(
                self.device.handle(),
                which,
                &mut count,
                reps.as_mut_ptr(),
            )
            .result()?;
            std::fs::create_dir_all(dir)?;
            for (n, (r, bytes)) in reps.iter().zip(&buffers).enumerate() {
                let name = r
                    .name_as_c_str()
                    .map(|c| c.to_string_lossy().replace([' ', '/'], "_"))
                    .unwrap_or_default();
                let text: Vec<u8> = bytes.iter().copied().take_while(|&b| b != 0 || r.is_text == 0).collect();
                std::fs::write(dir.join(format!("{stem}.{n}.{name}.txt")), text)?;
            }
            Ok(reps.len())
        }
    }
}

impl Drop for Vulkan {
    fn drop(&mut self) {
        // SAFETY: every pipeline and module made from these was destroyed after its query; the
        // layouts go before the device, the device before the instance.
        unsafe {
            self.device.destroy_pipeline_layout(self.layout, None);
            self.device.destroy_descriptor_set_layout(self.set_layout, None);
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}
