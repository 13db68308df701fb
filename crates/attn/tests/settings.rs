//! A setting that cannot be read is an error that names it, never ignored. Its own test binary:
//! it changes the process's environment.

use attn::{Backend, Error};

#[test]
fn an_unreadable_setting_is_an_error_naming_the_variable_and_what_it_accepts() {
    // SAFETY: this binary's only test; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("ATTN_CPU_TILES", "wide") };
    let err = Backend::all().err().expect("ATTN_CPU_TILES=wide is refused");
    assert!(matches!(err, Error::InvalidSetting { name: "ATTN_CPU_TILES", .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("\"wide\"") && msg.contains("64x64"), "{msg}");
    unsafe { std::env::set_var("ATTN_CPU_TILES", "64x64") };
    assert!(Backend::by_name("cpu").is_ok());
    unsafe { std::env::remove_var("ATTN_CPU_TILES") };
    // Another backend's bad setting fails the whole list, but not a backend chosen by name.
    unsafe { std::env::set_var("ATTN_CUDA_SM90_GRID", "0") };
    assert!(matches!(Backend::all().err(), Some(Error::InvalidSetting { name: "ATTN_CUDA_SM90_GRID", .. })));
    assert!(Backend::by_name("cpu").is_ok());
    unsafe { std::env::remove_var("ATTN_CUDA_SM90_GRID") };
}
