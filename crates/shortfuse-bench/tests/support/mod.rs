//! What the bench's integration tests share: the binary under test and the
//! mounts a run may leave behind.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The `shortfuse` binary under test: `SHORTFUSE_BIN` (the Makefile sets
/// it), else the one built next to this test's binary, else the workspace's
/// debug build.
pub fn shortfuse_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SHORTFUSE_BIN") {
        return PathBuf::from(p);
    }
    let sibling = Path::new(env!("CARGO_BIN_EXE_shortfuse-bench")).with_file_name("shortfuse");
    if sibling.is_file() {
        return sibling;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/shortfuse")
}

/// Mount points below `dir`.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&prefix))
        .collect()
}
