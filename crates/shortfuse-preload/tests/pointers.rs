//! Arguments the kernel refuses are refused alike on a mount.
//!
//! Bad pointers handed to file calls on a mount give EFAULT, as the
//! kernel's copy_from_user does, instead of killing the program; a null
//! path is EFAULT too, although the shim's trampoline is mapped at address
//! 0, and nothing is made from the trampoline's bytes (a symbolic link
//! `rel` to them in the current directory, outside the mount, say).
//! tests/c/badptr.c runs natively on a directory of ext4 and under
//! the shim on in-process mounts; the outputs must be the same. Runs as
//! root, which maps the trampoline at address 0 whatever vm.mmap_min_addr
//! says.
//!
//! tests/c/argchecks.c does the same for counts and paths the kernel
//! refuses before it looks at a file (readv's count, readlink's buffer
//! size, a negative truncate length, a trailing slash on a regular file).

// Not every helper is used here.
#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::{scratch, shim};

/// Builds tests/c/NAME.c.
fn build(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("cc (build-essential, installed by scripts/setup.sh)");
    assert!(o.status.success(), "cc: {}", String::from_utf8_lossy(&o.stderr));
    out
}

/// Runs `prog` on `dir` from the empty directory `cwd`, under the shim
/// with `mounts` when given; its output, after checking that it exited 0
/// and that `cwd` stayed empty.
fn run(prog: &Path, dir: &str, cwd: &Path, mounts: Option<&str>) -> String {
    let mut c = Command::new("timeout");
    c.args(["-s", "KILL", "60"]).arg(prog).arg(dir).current_dir(cwd);
    if let Some(m) = mounts {
        c.env("SHORTFUSE_MOUNTS", m).env("LD_PRELOAD", shim());
    }
    let o = c.output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{} under {mounts:?}: {:?}\n{out}{}",
        prog.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(cwd)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "made outside the mount under {mounts:?}: {left:?}");
    out
}

/// The output of `prog` under the shim on a mem and on a passthrough
/// mount, checked against its native output; the native output.
fn same_as_native(prog: &Path, tag: &str) -> String {
    let base = scratch("shortfuse-pointers", tag);
    let (native, cwd, src) = (base.join("native"), base.join("cwd"), base.join("src"));
    for d in [&native, &cwd, &src] {
        std::fs::create_dir(d).unwrap();
    }
    let want = run(prog, native.to_str().unwrap(), &cwd, None);
    let mp = format!("/shortfuse-pointers-{}-{tag}/m", std::process::id());
    for mounts in [format!("{mp}=mem"), format!("{mp}=passthrough:{}", src.display())] {
        let got = run(prog, &mp, &cwd, Some(&mounts));
        assert_eq!(got, want, "under {mounts}");
    }
    std::fs::remove_dir_all(&base).unwrap();
    want
}

#[test]
fn bad_pointers_give_efault_on_in_process_mounts() {
    let want = same_as_native(&build("badptr"), "bad");
    assert!(
        want.contains("open null: EFAULT") && want.contains("stat buffer bad: EFAULT"),
        "{want}"
    );
}

#[test]
fn refused_counts_and_trailing_slashes_give_the_kernels_errors() {
    let want = same_as_native(&build("argchecks"), "args");
    for line in [
        "readv iovcnt -1: EINVAL",
        "writev iovcnt 1025: EINVAL",
        "fchmodat f/: ENOTDIR",
        "readlink l -1: EINVAL",
        "readlink missing 0: EINVAL",
        "truncate missing -1: EINVAL",
        "mode 644 size 5",
    ] {
        assert!(want.contains(line), "{line} not in\n{want}");
    }
}
