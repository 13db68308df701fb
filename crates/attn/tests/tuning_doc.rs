//! `docs/tuning.md` lists exactly the variables the crates read: its generated block must equal
//! `attn knobs --markdown`.

const BEGIN: &str = "<!-- knobs:begin -->";
const END: &str = "<!-- knobs:end -->";

#[test]
fn docs_tuning_md_lists_every_knob_the_crates_read() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/tuning.md");
    let doc = std::fs::read_to_string(path).expect("docs/tuning.md");
    let (Some(begin), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/tuning.md has no {BEGIN} ... {END} block");
    };
    let held = &doc[begin + BEGIN.len()..end];
    let wanted = attn::knobs::markdown();
    assert!(
        held == wanted,
        "docs/tuning.md's variable tables differ from the code; replace the lines between {BEGIN} and {END} \
         with the output of `cargo run -p attn -- knobs --markdown`:\n{wanted}"
    );
}

#[test]
fn knob_names_are_unique_and_prefixed() {
    let mut names: Vec<&str> =
        attn::knobs::all().iter().flat_map(|c| c.knobs.iter().map(|k| k.name)).collect();
    assert!(names.iter().all(|n| n.starts_with("ATTN_")), "{names:?}");
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "a variable is listed twice");
}
