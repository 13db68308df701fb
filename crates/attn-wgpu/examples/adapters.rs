//! Lists the adapters wgpu finds here, with the features and limits the backend plans with, and
//! the cooperative-matrix shapes each reports.
fn main() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    for a in pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all())) {
        let i = a.get_info();
        let l = a.limits();
        println!("{} ({:?}, {:?}, driver {} {})", i.name, i.device_type, i.backend, i.driver, i.driver_info);
        println!(
            "  f16 {} subgroup {} timestamp {} ",
            a.features().contains(wgpu::Features::SHADER_F16),
            a.features().contains(wgpu::Features::SUBGROUP),
            a.features().contains(wgpu::Features::TIMESTAMP_QUERY)
        );
        println!(
            "  wg storage {} invocations {} binding {} buffer {} sg {}..{}",
            l.max_compute_workgroup_storage_size,
            l.max_compute_invocations_per_workgroup,
            l.max_storage_buffer_binding_size,
            l.max_buffer_size,
            a.get_info().subgroup_min_size,
            a.get_info().subgroup_max_size
        );
        for p in a.cooperative_matrix_properties() {
            println!(
                "  cooperative matrix {}x{}x{} {:?} -> {:?}{}",
                p.m_size,
                p.n_size,
                p.k_size,
                p.ab_type,
                p.cr_type,
                if a.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                    ""
                } else {
                    " (feature not offered)"
                }
            );
        }
    }
}
