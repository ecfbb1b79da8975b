//! Real programs with the shim preloaded, compared with the same programs on
//! a real directory. Needs root (vm.mmap_min_addr is set to 0 for the
//! trampoline page); fails, saying why, otherwise.

mod support;

use std::process::{Command, Output};
use support::{allow_page_zero, scratch, shim};

fn run(mounts: Option<&str>, prog: &str, args: &[&str]) -> Output {
    let mut c = Command::new(prog);
    c.args(args);
    if let Some(m) = mounts {
        c.env("SHORTFUSE_MOUNTS", m).env("LD_PRELOAD", shim());
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

// Test set-up of the same shape as the PY of tests/test_run.py: kept apart so
// each test reads on its own.
const PY: &str = r#"
import os, sys
root = sys.argv[1]
os.makedirs(root + "/d/e", exist_ok=True)
with open(root + "/d/f.txt", "w") as f:
    f.write("hello\n" * 3)
with open(root + "/d/f.txt", "a") as f:
    f.write("more\n")
print(open(root + "/d/f.txt").read(), end="")
os.rename(root + "/d/f.txt", root + "/d/g.txt")
print(sorted(os.listdir(root + "/d")))
st = os.stat(root + "/d/g.txt")
print(st.st_size, oct(st.st_mode))
os.chdir(root + "/d")
print(os.getcwd().replace(root, "ROOT"))
print(open("g.txt").readline(), end="")
print(os.path.exists("../d/e"), os.path.isdir("e"), os.path.exists("nope"))
fd = os.open("g.txt", os.O_RDWR)
fd2 = os.dup(fd)
os.lseek(fd, 6, 0)
print(os.read(fd2, 6), os.lseek(fd, 0, 1))
os.ftruncate(fd, 4)
os.close(fd); os.close(fd2)
print(os.stat("g.txt").st_size)
for dirpath, dirs, files in os.walk(root):
    print(dirpath.replace(root, "ROOT"), sorted(dirs), sorted(files))
os.unlink("g.txt")
os.rmdir("e")
os.chdir("/")
print(os.listdir(root + "/d"))
for bad in [lambda: os.rmdir(root + "/nonexist"), lambda: os.mkdir(root + "/d"), lambda: open(root + "/d/x/y")]:
    try:
        bad()
    except OSError as e:
        print("err", e.errno)
"#;

#[test]
fn python_on_a_mem_mount_matches_a_real_directory() {
    allow_page_zero();
    let real = scratch("sfpre", "py");
    let script = real.join("t.py");
    std::fs::write(&script, PY).unwrap();
    let work = real.join("work");
    std::fs::create_dir(&work).unwrap();
    let native = run(None, "python3", &[script.to_str().unwrap(), work.to_str().unwrap()]);
    let mp = format!("/shortfuse-test-{}/m", std::process::id());
    assert!(!std::path::Path::new(&mp).exists());
    let shim = run(Some(&format!("{mp}=mem")), "python3", &[script.to_str().unwrap(), &mp]);
    assert!(native.status.success(), "{}", text(&native));
    assert_eq!(text(&shim), text(&native));
    assert_eq!(shim.status.code(), native.status.code());
    std::fs::remove_dir_all(&real).unwrap();
}

/// Each command is its own process: the mount's state has to live on disk,
/// so coreutils run on a passthrough mount.
#[test]
fn coreutils_on_a_passthrough_mount_match_a_real_directory() {
    allow_page_zero();
    let src = scratch("sfpre", "cu-src");
    let real = scratch("sfpre", "cu-real");
    let mp = format!("/shortfuse-test-{}/p", std::process::id());
    let mounts = format!("{mp}=passthrough:{}", src.display());
    let steps: &[&[&str]] = &[
        &["mkdir", "R/d"],
        &["mkdir", "-p", "R/d/e/f"],
        &["cp", "/etc/passwd", "R/d/h"],
        &["cat", "R/d/h"],
        &["ls", "R/d"],
        &["mv", "R/d/h", "R/d/e/h2"],
        &["stat", "-c", "%s %F %a", "R/d/e/h2"],
        &["cp", "-r", "R/d", "R/d2"],
        &["ls", "-R", "R"],
        &["rm", "-r", "R/d"],
        &["ls", "-a", "R"],
        &["rmdir", "R/nonexistent"],
        &["cat", "R/d2/e/h2/"],
    ];
    for step in steps {
        let sub = |root: &str| -> Vec<String> { step[1..].iter().map(|a| a.replace('R', root)).collect() };
        let nargs = sub(real.to_str().unwrap());
        let sargs = sub(&mp);
        let n = run(None, step[0], &nargs.iter().map(String::as_str).collect::<Vec<_>>());
        let s = run(
            Some(&mounts),
            step[0],
            &sargs.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let norm = |o: &Output, root: &str| text(o).replace(root, "ROOT");
        assert_eq!(norm(&s, &mp), norm(&n, real.to_str().unwrap()), "{step:?}");
        assert_eq!(s.status.code(), n.status.code(), "{step:?}");
    }
    std::fs::remove_dir_all(&src).unwrap();
    std::fs::remove_dir_all(&real).unwrap();
}

#[test]
fn programs_that_never_touch_the_mount_run_unchanged() {
    allow_page_zero();
    let mounts = format!("/shortfuse-test-{}/u=mem", std::process::id());
    for (prog, args) in [
        ("sh", &["-c", "echo hi; ls / >/dev/null; exit 3"][..]),
        ("ls", &["/proc/self/fd"][..]),
    ] {
        let n = run(None, prog, args);
        let s = run(Some(&mounts), prog, args);
        assert_eq!(s.status.code(), n.status.code());
        assert_eq!(text(&s), text(&n));
    }
}
