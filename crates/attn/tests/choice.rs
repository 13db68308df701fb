//! Run-time backend choice.

use attn::{Backend, DType, Error, Problem, Shape};

#[test]
fn auto_picks_an_available_non_reference_backend_and_says_why() {
    let p = Problem::new(Shape::new(1, 2, 64, 64), DType::F32);
    if std::env::var("ATTN_BACKEND").is_ok() {
        return; // the override is the choice; tested below by name
    }
    let (backend, why) = Backend::choose(&p).unwrap();
    assert_ne!(backend.name(), "cpu-reference");
    assert!(why.contains("best available"), "{why}");
}

#[test]
fn unknown_or_unavailable_names_are_errors_that_say_why() {
    let err = Backend::by_name("tpu").err().expect("no backend is called tpu");
    assert!(matches!(err, Error::Unavailable { .. }));
    let msg = err.to_string();
    assert!(msg.contains("known: ") && msg.contains("cpu-flash"), "{msg}");
    assert_eq!(Backend::by_name("cpu").unwrap().name(), "cpu-flash");
}

#[test]
fn every_backend_reports_availability_without_panicking() {
    for b in Backend::all().unwrap() {
        let _ = b.availability();
    }
}
