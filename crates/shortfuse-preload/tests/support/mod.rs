//! What the shim's integration tests share: the built shim, page 0 for its
//! trampoline, and scratch directories.

use std::path::PathBuf;

/// `libshortfuse_preload.so` of this build (`cargo test` does not rebuild
/// it: `make test` builds first).
pub fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let so = dir.join("libshortfuse_preload.so");
    assert!(so.exists(), "{} not built", so.display());
    so
}

pub fn allow_page_zero() {
    let now = std::fs::read_to_string("/proc/sys/vm/mmap_min_addr").unwrap();
    if now.trim() != "0" {
        std::fs::write("/proc/sys/vm/mmap_min_addr", "0")
            .expect("setting vm.mmap_min_addr=0 needs root: the preload shim maps its trampoline at address 0");
    }
}

/// A fresh, empty directory `TAG-NAME-PID` in the temporary directory.
pub fn scratch(tag: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{tag}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
