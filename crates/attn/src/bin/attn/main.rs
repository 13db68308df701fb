//! `attn`: compute attention on the best backend here, and say how fast and how accurate it was.

mod bench;
mod cli;
mod numbers;
mod report;
mod verify;

use clap::Parser;

fn main() {
    quiet_vulkan_layers();
    let cli = cli::Cli::parse();
    if let Err(e) = cli.run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Mesa's device-select Vulkan layer (loaded implicitly wherever Mesa's drivers are installed)
/// looks for a Wayland or X display when adapters are listed, and prints
/// "XDG_RUNTIME_DIR is invalid or not set" on machines without one. attn picks its adapter
/// itself, so the layer has nothing to do here; `NODEVICE_SELECT=1` is its documented off
/// switch. A value the user set is kept.
fn quiet_vulkan_layers() {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        // SAFETY: the first statement of `main`, before any other thread exists, so nothing
        // reads the environment concurrently.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
}
