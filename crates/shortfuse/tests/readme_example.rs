//! The README's file-system example is the compiled `examples/hello.rs`,
//! word for word, so the README cannot drift from code that builds.

#[test]
fn readme_shows_the_hello_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/hello.rs")).unwrap();
    assert!(
        readme.contains(example.trim_end()),
        "README.md must quote examples/hello.rs verbatim"
    );
}
