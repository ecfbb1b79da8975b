//! Arguments the kernel refuses are refused alike on a mount.
//!
//! Bad pointers handed to file calls on a mount give EFAULT, as the
//! kernel's copy_from_user does, instead of killing the program; a null
//! path is EFAULT too, although the shim's trampoline is mapped at address
//! 0, and nothing is made from the trampoline's bytes (a symbolic link
//! `rel` to them in the current directory, outside the mount, say).
//! tests/c/badptr.c runs natively on a directory of ext4 and under
//! the shim on in-process mounts and over the rings (`shortfuse serve mem`
//! and `serve passthrough`, then `shortfuse run -m`); the outputs must be
//! the same. Runs as root, which maps the trampoline at address 0 whatever
//! vm.mmap_min_addr says.
//!
//! It also passes a path from a page a call has just read, then unmapped
//! or protected (munmap, mprotect, mmap MAP_FIXED, a guard region, a
//! forked child without the parent's MADV_DONTFORK page): EFAULT, although
//! the shim remembers pages it found readable.
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

/// Builds tests/c/NAME.c, as NAME-TAG (tests run at once: one must not
/// replace the program another runs).
fn build(name: &str, tag: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{tag}"));
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("cc (build-essential, installed by scripts/setup.sh)");
    assert!(o.status.success(), "cc: {}", String::from_utf8_lossy(&o.stderr));
    out
}

/// How the program reaches the mount.
enum Under<'a> {
    Native,
    /// In process: the SHORTFUSE_MOUNTS value.
    Mounts(&'a str),
    /// Over the rings: `shortfuse run -m` of this mount point.
    Ring(&'a str),
}

/// Runs `prog` on `dir` from the empty directory `cwd`, as `under` says;
/// its output, after checking that it exited 0 and that `cwd` stayed
/// empty.
fn run(prog: &Path, dir: &str, cwd: &Path, under: Under<'_>) -> String {
    let mut c = Command::new("timeout");
    c.args(["-s", "KILL", "60"]);
    let mounts = match under {
        Under::Native => None,
        Under::Mounts(m) => {
            c.env("SHORTFUSE_MOUNTS", m).env("LD_PRELOAD", shim());
            Some(m.to_string())
        }
        Under::Ring(mp) => {
            c.arg(shortfuse()).args(["run", "-m", mp, "--"]);
            Some(format!("the daemon of {mp}"))
        }
    };
    c.arg(prog).arg(dir).current_dir(cwd);
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
    let want = run(prog, native.to_str().unwrap(), &cwd, Under::Native);
    let mp = format!("/shortfuse-pointers-{}-{tag}/m", std::process::id());
    for mounts in [format!("{mp}=mem"), format!("{mp}=passthrough:{}", src.display())] {
        let got = run(prog, &mp, &cwd, Under::Mounts(&mounts));
        assert_eq!(got, want, "under {mounts}");
    }
    std::fs::remove_dir_all(&base).unwrap();
    want
}

/// The `shortfuse` binary of this build, beside the shim.
fn shortfuse() -> PathBuf {
    shim().with_file_name("shortfuse")
}

/// `shortfuse serve ARGS` in the background, once it serves; stopped
/// (SIGTERM) when dropped.
struct Daemon(std::process::Child);

impl Daemon {
    fn start(args: &[&str]) -> Daemon {
        use std::io::BufRead;
        let mut child = Command::new(shortfuse())
            .arg("serve")
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("shortfuse (cargo build --workspace first)");
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("shortfuse serve:") {
            line.clear();
            if err.read_line(&mut line).unwrap() == 0 {
                let _ = child.wait();
                panic!("shortfuse serve {args:?} did not start");
            }
        }
        Daemon(child)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM)
        };
        let _ = self.0.wait();
    }
}

/// The output of `prog` over the rings, on `serve mem` and `serve
/// passthrough`, checked against its native output.
fn same_as_native_over_the_rings(prog: &Path, tag: &str) {
    let base = scratch("shortfuse-pointers-ring", tag);
    let (native, cwd, src, mp) = (base.join("native"), base.join("cwd"), base.join("src"), base.join("mp"));
    for d in [&native, &cwd, &src, &mp] {
        std::fs::create_dir(d).unwrap();
    }
    let want = run(prog, native.to_str().unwrap(), &cwd, Under::Native);
    let (mp, src) = (mp.to_str().unwrap(), src.to_str().unwrap());
    for args in [vec!["mem", mp], vec!["passthrough", src, mp]] {
        let daemon = Daemon::start(&args);
        let got = run(prog, mp, &cwd, Under::Ring(mp));
        drop(daemon);
        assert_eq!(got, want, "over the rings of serve {args:?}");
        for e in std::fs::read_dir(src).unwrap() {
            let p = e.unwrap().path();
            let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p));
        }
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn bad_pointers_give_efault_on_in_process_mounts() {
    let want = same_as_native(&build("badptr", "in-process"), "bad");
    for line in [
        "open null: EFAULT",
        "stat buffer bad: EFAULT",
        "read buffer of a dir bad: EISDIR",
        "read buffer at the end null: ok",
        "fcntl F_GETLK null: EFAULT",
        "fchownat empty null: EFAULT",
        "newfstatat empty null: ok",
    ] {
        assert!(want.contains(line), "{line} not in\n{want}");
    }
    // A path in a page found readable before, unreadable now.
    for how in ["munmap", "mprotect", "mmap fixed", "fork dontfork"] {
        assert!(
            want.contains(&format!("{how} before: ok\n{how} after: EFAULT")),
            "{how}: {want}"
        );
    }
}

#[test]
fn bad_pointers_give_efault_over_the_rings() {
    same_as_native_over_the_rings(&build("badptr", "ring"), "bad");
}

#[test]
fn refused_counts_and_trailing_slashes_give_the_kernels_errors() {
    let want = same_as_native(&build("argchecks", "in-process"), "args");
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
