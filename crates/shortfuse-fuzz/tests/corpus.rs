//! Replays the checked-in fuzz inputs through the targets' functions:
//! `fuzz/corpus/TARGET/*` (seeds and what fuzzing runs kept) and
//! `fuzz/artifacts/TARGET/*` (inputs that once crashed a target, kept once
//! fixed), so that `make test` catches a regression on stable Rust.

use std::path::PathBuf;

fn inputs(dir: &str, target: &str) -> Vec<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(dir)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&d) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

#[test]
fn every_target_has_a_corpus_and_a_cargo_fuzz_binary() {
    let manifest =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/Cargo.toml")).unwrap();
    for (name, _) in shortfuse_fuzz::TARGETS {
        assert!(
            inputs("corpus", name).len() >= 4,
            "fuzz/corpus/{name} holds a few seeds"
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml builds {name}"
        );
    }
}

#[test]
fn corpus_and_crashes_replay_cleanly() {
    let mut ran = 0;
    for (name, check) in shortfuse_fuzz::TARGETS {
        for dir in ["corpus", "artifacts"] {
            for file in inputs(dir, name) {
                let data = std::fs::read(&file).unwrap();
                if let Err(e) = std::panic::catch_unwind(|| check(&data)) {
                    std::panic::resume_unwind(Box::new(format!("{name}: {} fails: {e:?}", file.display())));
                }
                ran += 1;
            }
        }
    }
    assert!(ran > 0);
}
