//! Vulkan for the wgpu backend: Mesa's lavapipe (a software Vulkan driver) so that CI machines
//! without a GPU run the WGSL kernel, and the Vulkan loader packages that the GPU machine lacks.
//!
//! CI requires the backend once lavapipe is installed (`ATTN_REQUIRE_WGPU=1`): a missing
//! adapter then fails the tests instead of skipping them.

use std::ffi::OsString;
use std::path::Path;

use crate::cmd;

/// The Debian package with lavapipe (and the loader, `libvulkan1`, as a dependency).
const MESA: &str = "mesa-vulkan-drivers";

/// Where Vulkan drivers register themselves (ICD manifests).
const ICD_DIRS: [&str; 3] = ["/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d"];

/// Whether lavapipe's manifest and the loader are both installed.
pub fn present() -> bool {
    let lavapipe = ICD_DIRS.iter().any(|d| {
        std::fs::read_dir(d)
            .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with("lvp_icd")))
            .unwrap_or(false)
    });
    let arch = std::env::consts::ARCH;
    let loader = [format!("/usr/lib/{arch}-linux-gnu/libvulkan.so.1"), "/usr/lib64/libvulkan.so.1".into()]
        .iter()
        .any(|p| Path::new(p).exists());
    lavapipe && loader
}

/// `apt-get update` then `apt-get install -y mesa-vulkan-drivers`, through sudo unless root.
pub fn install() -> Result<(), String> {
    apt(&["update"])?;
    apt(&["install", "-y", "--no-install-recommends", MESA])
}

fn apt(args: &[&str]) -> Result<(), String> {
    if cmd::output("id", &["-u"]).as_deref() == Some("0") {
        cmd::run("apt-get", args)
    } else {
        let mut with = vec!["apt-get"];
        with.extend(args);
        cmd::run("sudo", &with)
    }
}

/// `cargo xtask vulkan-loader`: downloads the amd64 Vulkan loader and the GL vendor-neutral
/// dispatch packages into `.gl/` (git-ignored) for the GPU machine, whose image has the NVIDIA
/// driver's Vulkan manifest but no loader; the driver's ICD library also needs libglvnd's
/// dispatch (the loader alone finds no adapter there, as a run showed). A
/// device run carries `.gl` and unpacks it with `dpkg -x` (see `bench/device/wgpu.sh`).
pub fn fetch_loader_debs() -> Result<(), String> {
    let root = cmd::workspace_root();
    let gl = root.join(".gl");
    std::fs::create_dir_all(&gl).map_err(|e| format!("create {}: {e}", gl.display()))?;
    std::fs::create_dir_all("/tmp/amd64/partial").map_err(|e| format!("create /tmp/amd64: {e}"))?;
    // A private package list for amd64, so that this works from any host architecture and
    // leaves the system's lists alone.
    let opts = ["-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", "-oDir::State::Lists=/tmp/amd64"];
    let mut update = opts.to_vec();
    update.push("update");
    cmd::run("apt-get", &update)?;
    let script = format!(
        "cd .gl && apt-get {} download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2",
        opts.join(" ")
    );
    cmd::run("sh", &["-c", &script])?;
    println!("Vulkan loader in {}: carry `.gl` in device runs", gl.display());
    Ok(())
}

/// The environment for child cargo processes: with `require`, `ATTN_REQUIRE_WGPU=1`; and an
/// `XDG_RUNTIME_DIR`, whose absence makes Mesa print an error line on every adapter probe.
pub fn child_env(require: bool) -> Vec<(&'static str, OsString)> {
    let mut vars = Vec::new();
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        vars.push(("XDG_RUNTIME_DIR", std::env::temp_dir().into_os_string()));
    }
    if require {
        vars.push(("ATTN_REQUIRE_WGPU", "1".into()));
    }
    vars
}
