//! `shortfuse --version` names the commit it was built from: `git describe`
//! of the checkout (with `-dirty` for uncommitted changes), or nothing more
//! than the crate version when there is no git or no repository (a source
//! tarball).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    let version = env!("CARGO_PKG_VERSION");
    let full = match git(&["describe", "--always", "--dirty", "--abbrev=12"]) {
        Some(commit) => format!("{version} (commit {commit})"),
        None => version.to_string(),
    };
    println!("cargo:rustc-env=SHORTFUSE_VERSION={full}");
    // Again when HEAD moves or the index changes (a commit, a checkout).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/index");
        // Branch refs live in the common directory (a worktree's own has
        // only HEAD), loose or packed.
        let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]).unwrap_or(dir);
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            if std::path::Path::new(&format!("{common}/{head}")).exists() {
                println!("cargo:rerun-if-changed={common}/{head}");
            }
        }
        if std::path::Path::new(&format!("{common}/packed-refs")).exists() {
            println!("cargo:rerun-if-changed={common}/packed-refs");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
