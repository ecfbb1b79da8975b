//! Interception: the rewrite (zpoline), Syscall User Dispatch, and both,
//! checked with small C programs (tests/intercept/*.c, built with `cc` at
//! test time) on a `mem` mount whose mount point does not exist on disk, so
//! that only a served call can see its files. Needs root (vm.mmap_min_addr
//! is set to 0 for the trampoline page); fails, saying why, otherwise.

mod support;

use shortfuse::sync::Unpoison;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{OnceLock, RwLock};
use support::{allow_page_zero, scratch, shim};

/// Shared by every run that needs page 0; taken exclusively by the test
/// that takes page 0 away for a moment.
static PAGE_ZERO: RwLock<()> = RwLock::new(());

/// The test programs: `prog` and the library `libraw.so`.
fn programs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/intercept");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("intercept");
        std::fs::create_dir_all(&out).unwrap();
        let cc = |args: &[&str]| {
            let o = Command::new("cc")
                .args(args)
                .output()
                .expect("cc (build-essential, installed by scripts/setup.sh)");
            assert!(
                o.status.success(),
                "cc {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        let (prog, raw) = (out.join("prog"), out.join("libraw.so"));
        cc(&[
            "-O1",
            "-Wall",
            // Sites are handed down by build-id (`known_sites`).
            "-Wl,--build-id",
            "-o",
            prog.to_str().unwrap(),
            src.join("prog.c").to_str().unwrap(),
            "-lpthread",
            "-ldl",
        ]);
        cc(&[
            "-O1",
            "-shared",
            "-fPIC",
            "-o",
            raw.to_str().unwrap(),
            src.join("raw.c").to_str().unwrap(),
        ]);
        out
    })
}

fn mountpoint(name: &str) -> String {
    let mp = format!("/shortfuse-intercept-{}/{name}", std::process::id());
    assert!(!Path::new(&mp).exists());
    mp
}

/// Runs `prog CMD DIR ARGS` natively (mode None and a real directory) or
/// under the shim with DIR a mem mount and `SHORTFUSE_INTERCEPT=mode`
/// ("" for the default). Killed after 60 s, so that a hang fails.
fn prog(mode: Option<&str>, cmd: &str, dir: &str, args: &[&str]) -> Output {
    prog_with(mode, cmd, dir, args, &[])
}

/// [`prog`] with more variables in its environment.
fn prog_with(mode: Option<&str>, cmd: &str, dir: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let _page0 = PAGE_ZERO.read().unpoison();
    let mut c = Command::new("timeout");
    c.args(["-s", "KILL", "60"])
        .arg(programs().join("prog"))
        .args([cmd, dir])
        .args(args);
    if let Some(m) = mode {
        allow_page_zero();
        c.env("SHORTFUSE_MOUNTS", format!("{dir}=mem"))
            .env("LD_PRELOAD", shim());
        if m.is_empty() {
            c.env_remove("SHORTFUSE_INTERCEPT");
        } else {
            c.env("SHORTFUSE_INTERCEPT", m);
        }
    }
    c.envs(env.iter().copied());
    c.output().unwrap()
}

fn stdout(o: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what}: {:?}\n{err}", o.status);
    assert!(err.is_empty(), "{what}: stderr: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const MODES: [&str; 3] = ["", "zpoline", "sud"];

/// The same program output natively and in every interception mode.
fn same_as_native(cmd: &str) -> String {
    let real = scratch("sfint", cmd);
    let native = stdout(&prog(None, cmd, real.to_str().unwrap(), &[]), "native");
    std::fs::remove_dir_all(&real).unwrap();
    let mp = mountpoint(cmd);
    for m in MODES {
        let got = stdout(
            &prog(Some(m), cmd, &mp, &[]),
            &format!("{cmd} SHORTFUSE_INTERCEPT={m:?}"),
        );
        assert_eq!(got, native, "{cmd} SHORTFUSE_INTERCEPT={m:?}");
    }
    native
}

#[test]
fn file_calls_give_native_results_in_every_mode() {
    let out = same_as_native("ops");
    assert!(out.contains("fgets abcdefghXY\n"), "{out}");
    assert!(out.contains("ls dir: . .. file2 other\n"), "{out}");
}

#[test]
fn library_loaded_with_dlopen_is_served_and_rewritten_lazily() {
    let lib = programs().join("libraw.so");
    let lib = lib.to_str().unwrap();
    let mp = mountpoint("dl");
    let served = "raw read 17 only-in-the-mount\n";
    // Default: Syscall User Dispatch catches the first call and rewrites
    // the site; the second goes through the trampoline.
    let both = stdout(&prog(Some(""), "dlopen", &mp, &[lib]), "default");
    assert_eq!(
        both,
        format!("site before 0f05\n{served}site after ffd0\n{served}site after ffd0\n")
    );
    // Dispatch alone: served every time, the site stays a syscall.
    let sud = stdout(&prog(Some("sud"), "dlopen", &mp, &[lib]), "sud");
    assert_eq!(
        sud,
        format!("site before 0f05\n{served}site after 0f05\n{served}site after 0f05\n")
    );
    // The rewrite alone misses the library: its call reaches the kernel,
    // which has no such path.
    let zp = stdout(&prog(Some("zpoline"), "dlopen", &mp, &[lib]), "zpoline");
    assert!(zp.contains("raw read -2 \n"), "{zp}");
}

/// By default a site of the program is rewritten when it first runs, not
/// at start-up; the rewrite alone does them all at start-up; dispatch
/// alone never rewrites.
#[test]
fn syscall_sites_are_rewritten_when_they_first_run() {
    let mp = mountpoint("lazy");
    for (mode, before, after) in [
        ("", "0f05", "ffd0"),
        ("zpoline", "ffd0", "ffd0"),
        ("sud", "0f05", "0f05"),
    ] {
        let out = stdout(&prog(Some(mode), "lazy", &mp, &[]), mode);
        assert_eq!(
            out,
            format!("site before {before}\ngetpid 1\nsite after {after}\n"),
            "SHORTFUSE_INTERCEPT={mode:?}"
        );
    }
}

/// The sites an image rewrote are handed to the image it execs, where the
/// first site of the program's text that traps has every other one it was
/// handed rewritten with it: site b calls the trampoline before it first
/// runs there.
#[test]
fn sites_an_image_learned_are_rewritten_at_once_in_the_image_it_execs() {
    let mp = mountpoint("handed");
    let out = stdout(&prog(Some(""), "handed", &mp, &[]), "default");
    assert_eq!(
        out,
        "first: a 0f05 b 0f05\nafter a: a ffd0 b 0f05\nids 1\n\
         second: a 0f05 b 0f05\nafter a: a ffd0 b ffd0\nids 1\n"
    );
}

/// A handed-down site is rewritten only in an object of the same
/// build-id, and only where it holds a `syscall`.
#[test]
fn handed_down_sites_are_checked_before_they_are_rewritten() {
    let exe = programs().join("prog");
    let tool = |cmd: &str, args: &[&str]| {
        let o = Command::new(cmd).args(args).arg(&exe).output().unwrap();
        assert!(o.status.success(), "{cmd}: {o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let notes = tool("readelf", &["-n"]);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build-id: {notes}"))
        .to_string();
    let symbols = tool("nm", &[]);
    let b = symbols
        .lines()
        .find_map(|l| l.strip_suffix(" prog_site2"))
        .and_then(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
        .unwrap_or_else(|| panic!("no prog_site2: {symbols}"));
    let other_id = format!("{}{}", &id[..id.len() - 1], if id.ends_with('0') { '1' } else { '0' });
    let mp = mountpoint("checked");
    for (var, b_after_a) in [
        (format!("{id}:{b:x}"), "ffd0"),
        (format!("{other_id}:{b:x}"), "0f05"),
        (format!("{id}:{:x}", b + 1), "0f05"),
    ] {
        let out = stdout(
            &prog_with(Some(""), "handed2", &mp, &[], &[("SHORTFUSE_SITES", &var)]),
            &var,
        );
        assert_eq!(
            out,
            format!("second: a 0f05 b 0f05\nafter a: a ffd0 b {b_after_a}\nids 1\n"),
            "SHORTFUSE_SITES={var}"
        );
    }
}

#[test]
fn vfork_posix_spawn_and_fork_work() {
    let out = same_as_native("spawn");
    assert_eq!(
        out,
        "posix_spawn 0 exit 7\nvfork exec exit 5\nvfork _exit 3\nsystem 4\nparent read 4 data\nfork child read exit 9\n"
    );
}

#[test]
fn threads_created_during_the_run_are_served() {
    let out = same_as_native("threads");
    assert_eq!(out, "ls .: . .. t0 t1 t2 t3 t4 t5 t6 t7\nthreads bad 0\n");
}

/// A SIGALRM handler (sa_mask full) opens and reads a mount file every
/// 200 us while the interrupted thread keeps issuing file calls on the
/// mount: every handler call is served, nothing deadlocks.
#[test]
fn signal_handlers_doing_file_calls_are_served() {
    let out = same_as_native("signals");
    assert_eq!(out, "signals handled>=20 1 bad 0 in handler 0\n");
}

/// Closes and opens give the numbers POSIX does (the lowest free one), in
/// every order the shim's spare placeholder must get right: reused, taken
/// by a kernel open, pipe or socket, below another closed one, after a
/// lower one closed in the kernel, closed to fcntl, fstat, read, lseek, a
/// second close, /proc and a dirfd, across a stat, dup2'd over,
/// close-on-exec either way, in a forked child.
#[test]
fn descriptor_numbers_are_the_lowest_free_ones() {
    let out = same_as_native("fds");
    assert_eq!(out, format!("fds{}\n", " 1".repeat(23)));
}

/// xmm0-15, ymm0-15 (upper halves clean and in use) and the argument
/// registers across a served pread issued by a raw `syscall`.
#[test]
fn registers_survive_a_served_call() {
    let out = same_as_native("regs");
    assert_eq!(
        out,
        "pread 16 0123456789abcdef\nargs kept 1\nvector kept 1\nymm kept 1\n"
    );
}

const PY: &str = r#"
import os, sys, subprocess, threading
root = sys.argv[1]
os.makedirs(root + "/a/b")
for i in range(5):
    with open(f"{root}/a/b/f{i}", "w") as f:
        f.write(str(i) * (i + 1))
t = threading.Thread(target=lambda: open(root + "/a/t", "w").write("thread"))
t.start(); t.join()
print(subprocess.run(["sh", "-c", "echo child $((6*7))"], capture_output=True, text=True).stdout, end="")
for d, dirs, files in os.walk(root):
    print(d.replace(root, "R"), sorted(dirs), sorted(files))
print([open(f"{root}/a/b/f{i}").read() for i in range(5)], open(root + "/a/t").read())
os.rename(root + "/a/b/f0", root + "/a/g")
print(os.stat(root + "/a/g").st_size, os.path.exists(root + "/a/b/f0"))
"#;

/// A real program gives the same results with Syscall User Dispatch alone
/// as with the rewrite, and as natively.
#[test]
fn python_gives_the_same_results_with_dispatch_alone() {
    let real = scratch("sfint", "py");
    let script = real.join("t.py");
    std::fs::write(&script, PY).unwrap();
    let run = |mode: Option<&str>, dir: &str| {
        let _page0 = PAGE_ZERO.read().unpoison();
        let mut c = Command::new("timeout");
        c.args(["-s", "KILL", "120", "python3"]).arg(&script).arg(dir);
        if let Some(m) = mode {
            allow_page_zero();
            c.env("SHORTFUSE_MOUNTS", format!("{dir}=mem"))
                .env("LD_PRELOAD", shim())
                .env("SHORTFUSE_INTERCEPT", m);
        }
        stdout(&c.output().unwrap(), &format!("python3 {mode:?}"))
    };
    let work = real.join("w");
    std::fs::create_dir(&work).unwrap();
    let native = run(None, work.to_str().unwrap());
    let mp = mountpoint("py");
    let zp = run(Some("zpoline"), &mp);
    let sud = run(Some("sud"), &mp);
    assert!(native.contains("child 42\n"), "{native}");
    assert_eq!(zp, native);
    assert_eq!(sud, zp);
    std::fs::remove_dir_all(&real).unwrap();
}

/// Puts vm.mmap_min_addr back when dropped, also on a failed assertion.
struct MinAddr(String);

impl Drop for MinAddr {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/vm/mmap_min_addr", &self.0);
    }
}

/// Without page 0 the default mode falls back to Syscall User Dispatch
/// alone, still serves the mount, and says so once for the process tree.
/// CAP_SYS_RAWIO lets root map below vm.mmap_min_addr: the shell runs
/// without it. The knob is system-wide: another test run on the same
/// machine that sets it back to 0 meanwhile (programs.rs does) makes this
/// one see page 0 mapped and no warning.
#[test]
fn without_page_zero_dispatch_alone_serves_and_says_so_once() {
    let _only_us = PAGE_ZERO.write().unpoison();
    let knob = "/proc/sys/vm/mmap_min_addr";
    let _restore = MinAddr(std::fs::read_to_string(knob).unwrap().trim().to_string());
    std::fs::write(knob, "65536").expect("setting vm.mmap_min_addr needs root");
    let mp = mountpoint("nopage0");
    // dash runs the redirections and `read` itself: served in its process;
    // /bin/true is a child that loads the shim again.
    let script = format!("echo served > {mp}/f; read x < {mp}/f; /bin/true; echo $x");
    let o = Command::new("timeout")
        .args([
            "-s",
            "KILL",
            "60",
            "setpriv",
            "--bounding-set",
            "-sys_rawio",
            "sh",
            "-c",
            &script,
        ])
        .env("SHORTFUSE_MOUNTS", format!("{mp}=mem"))
        .env("LD_PRELOAD", shim())
        .env_remove("SHORTFUSE_INTERCEPT")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?} {err}", o.status);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "served\n");
    assert_eq!(err.matches("Syscall User Dispatch alone").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
