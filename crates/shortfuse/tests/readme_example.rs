//! The README's file-system examples are the compiled `examples/hello.rs`
//! and `examples/hello_nodes.rs`, word for word, so the README cannot drift
//! from code that builds (and that `examples_mount` mounts).

#[test]
fn readme_shows_the_hello_examples() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    for name in ["hello", "hello_nodes"] {
        let path = format!("{}/examples/{name}.rs", env!("CARGO_MANIFEST_DIR"));
        let example = std::fs::read_to_string(&path).unwrap();
        assert!(
            readme.contains(example.trim_end()),
            "README.md must quote examples/{name}.rs verbatim"
        );
    }
}
