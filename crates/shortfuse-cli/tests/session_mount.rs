//! Mounted tests of the `shortfuse` binary on /dev/fuse (need root and
//! /dev/fuse; they fail, not skip, without them).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_shortfuse");

fn shortfuse(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running shortfuse")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh directory to mount on; lazily unmounts anything left on it and
/// removes it when dropped, so a failing test leaves no mount behind.
struct MountDir {
    path: PathBuf,
}

impl MountDir {
    fn new(name: &str) -> MountDir {
        let path = std::env::temp_dir().join(format!("shortfuse-cli-{name}-{}", std::process::id()));
        let _ = Command::new(BIN).args(["umount", "-l"]).arg(&path).output();
        std::fs::create_dir_all(&path).unwrap();
        MountDir {
            path: std::fs::canonicalize(&path).unwrap(),
        }
    }

    fn s(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

impl Drop for MountDir {
    fn drop(&mut self) {
        while is_mounted(&self.path) {
            let _ = Command::new(BIN).args(["umount", "-l"]).arg(&self.path).output();
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

fn is_mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap().replace(' ', "\\040");
    text.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn daemon_pid(mp: &Path) -> i32 {
    let pong = shortfuse::control::request(mp, "ping").expect("ping the daemon");
    pong.trim().strip_prefix("pong ").unwrap().parse().unwrap()
}

fn alive(pid: i32) -> bool {
    // A zombie still has /proc/PID; the daemon's parent (the CLI) exited, so
    // init reaps it promptly.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn kill(pid: i32, sig: &str) {
    let st = Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
    assert!(st.success());
}

fn mount_bg(dir: &MountDir, extra: &[&str]) {
    let mut args = vec!["mount", "null", dir.s()];
    args.extend_from_slice(extra);
    let out = shortfuse(&args);
    assert!(out.status.success(), "mount failed: {}", stderr(&out));
    assert!(is_mounted(&dir.path), "mounted when `shortfuse mount` returns");
}

#[test]
fn null_mount_stat_stats_umount() {
    let dir = MountDir::new("basic");
    mount_bg(&dir, &[]);
    let pid = daemon_pid(&dir.path);
    let md = std::fs::metadata(&dir.path).unwrap();
    assert!(md.is_dir());
    assert_eq!(md.ino(), 1);
    let e = std::fs::metadata(dir.path.join("missing")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));

    let out = shortfuse(&["stats", dir.s()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("opcode"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("INIT ")), "{table}");
    assert!(table.lines().any(|l| l.starts_with("LOOKUP ")), "{table}");
    let out = shortfuse(&["stats", "--json", dir.s()]);
    let json = String::from_utf8(out.stdout).unwrap();
    assert!(json.contains("\"name\":\"LOOKUP\""), "{json}");
    assert!(shortfuse(&["stats", "--reset", dir.s()]).status.success());
    let json = String::from_utf8(shortfuse(&["stats", "--json", dir.s()]).stdout).unwrap();
    assert!(
        !json.contains("\"name\":\"LOOKUP\""),
        "reset zeroes the counters: {json}"
    );

    let out = shortfuse(&["umount", dir.s()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!is_mounted(&dir.path));
    wait_until("the daemon to exit after umount", || !alive(pid));
    let out = shortfuse(&["stats", dir.s()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no shortfuse daemon"), "{}", stderr(&out));
}

#[test]
fn sigterm_and_sigint_unmount_cleanly() {
    for sig in ["-TERM", "-INT"] {
        let dir = MountDir::new(&format!("sig{sig}"));
        mount_bg(&dir, &[]);
        let pid = daemon_pid(&dir.path);
        std::fs::metadata(&dir.path).unwrap();
        kill(pid, sig);
        wait_until("the daemon to exit", || !alive(pid));
        assert!(!is_mounted(&dir.path), "{sig} leaves no mount behind");
        let sock = shortfuse::control::socket_path(&dir.path);
        assert!(!sock.exists(), "{sig} removes {}", sock.display());
    }
}

#[test]
fn kill9_gives_enotconn_and_lazy_umount_cleans() {
    let dir = MountDir::new("kill9");
    mount_bg(&dir, &[]);
    let pid = daemon_pid(&dir.path);
    kill(pid, "-KILL");
    wait_until("the daemon to die", || !alive(pid));
    // Linux 6.18 answers ENOTCONN or, for a connection it marked aborted,
    // ECONNABORTED; both mean "the daemon is gone".
    let dead = |e: io::Error| {
        assert!(
            matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)),
            "{e}"
        )
    };
    dead(std::fs::metadata(&dir.path).unwrap_err());
    dead(std::fs::read_dir(&dir.path).unwrap_err());
    let out = shortfuse(&["umount", "-l", dir.s()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!is_mounted(&dir.path));
    assert!(
        std::fs::metadata(&dir.path).unwrap().is_dir(),
        "the plain directory is back"
    );
    // A new daemon can take the place (and the stale control socket).
    assert!(
        !shortfuse::control::socket_path(&dir.path).exists(),
        "umount removes the dead daemon's socket"
    );
    mount_bg(&dir, &["-o", "ro"]);
    assert!(shortfuse(&["umount", "-z", dir.s()]).status.success());
}

#[test]
fn foreground_mount_ends_on_ctrl_c() {
    let dir = MountDir::new("fg");
    let child = Command::new(BIN)
        .args(["mount", "null", dir.s(), "-f", "--threads", "3"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the foreground mount", || is_mounted(&dir.path));
    wait_until("the control socket", || {
        shortfuse::control::request(&dir.path, "ping").is_ok()
    });
    let pid = child.id() as i32;
    assert_eq!(daemon_pid(&dir.path), pid, "-f serves in the process itself");
    std::fs::metadata(&dir.path).unwrap();
    // main + signal thread + control thread + 1 reader: readers start on demand.
    let threads = || std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
    assert_eq!(threads(), 4);
    // Parallel lookups keep requests waiting: the readers grow to the 3 asked for.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while threads() < 6 && std::time::Instant::now() < deadline {
        lookups_in_parallel(&dir.path);
    }
    assert_eq!(threads(), 6, "main + signals + control + 3 readers after parallel load");
    kill(pid, "-USR1");
    // SIGINT would be taken first if both were pending (lower number).
    std::thread::sleep(Duration::from_millis(300));
    kill(pid, "-INT");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let err = stderr(&out);
    assert!(
        err.contains("opcode") && err.contains("INIT"),
        "SIGUSR1 logs the table: {err}"
    );
    assert!(!is_mounted(&dir.path));
}

/// Eight threads looking up missing names at once.
fn lookups_in_parallel(dir: &std::path::Path) {
    std::thread::scope(|s| {
        for i in 0..8 {
            s.spawn(move || {
                for j in 0..50 {
                    let e = std::fs::metadata(dir.join(format!("n{i}-{j}"))).unwrap_err();
                    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
                }
            });
        }
    });
}

#[test]
fn base_profile_runs_one_worker() {
    let dir = MountDir::new("base");
    mount_bg(&dir, &["-o", "base"]);
    let pid = daemon_pid(&dir.path);
    std::fs::metadata(&dir.path).unwrap();
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
    assert_eq!(threads, 4, "main + signals + control + 1 worker");
    // Many concurrent requests on one worker still all get answered, and no
    // reader is added beyond the one asked for.
    lookups_in_parallel(&dir.path);
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
    assert_eq!(threads, 4, "-o base: one reader, whatever the load");
    assert!(shortfuse(&["umount", dir.s()]).status.success());
    wait_until("the daemon to exit", || !alive(pid));
}

#[test]
fn errors_are_clear() {
    let dir = MountDir::new("errors");
    let missing = dir.path.join("missing");
    let out = shortfuse(&["mount", "null", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));

    let file = dir.path.join("file");
    std::fs::write(&file, b"x").unwrap();
    let out = shortfuse(&["mount", "null", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is not a directory"), "{}", stderr(&out));
    std::fs::remove_file(&file).unwrap();

    let cases: &[(&[&str], &str)] = &[
        (&["mount", "null", dir.s(), "-o", "bogus"], "-o bogus: unknown option"),
        (&["mount", "null", dir.s(), "-o", "max_write=2M"], "1048576"),
        (
            &["mount", "null", dir.s(), "--transport", "carrier-pigeon"],
            "invalid value",
        ),
        (&["mount", "null", "/tmp", dir.s()], "takes no SOURCE"),
        (&["mount", "ext9", dir.s()], "unknown file system"),
        (&["mount", "passthrough", dir.s()], "needs a SOURCE"),
        (
            &["mount", "passthrough", "/nonexistent-src", dir.s()],
            "/nonexistent-src: No such file",
        ),
        (
            &["mount", "passthrough", "/etc/hostname", dir.s()],
            "is not a directory",
        ),
        (&["mount", "mem", dir.s(), "-o", "xattr"], "-o xattr: unknown option"),
        (&["umount", dir.s()], "is not mounted"),
        (&["umount", "/"], "not a FUSE mount"),
    ];
    for (args, want) in cases {
        let out = shortfuse(args);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        assert!(!is_mounted(&dir.path), "{args:?} mounted nothing");
    }

    mount_bg(&dir, &[]);
    let out = shortfuse(&["mount", "null", dir.s()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("already a FUSE mount"), "{}", stderr(&out));
    assert!(shortfuse(&["umount", dir.s()]).status.success());
}

#[test]
fn passthrough_and_mem_mount() {
    let src = MountDir::new("pt-src");
    std::fs::write(src.path.join("hello"), b"world").unwrap();
    let dir = MountDir::new("pt");
    let out = shortfuse(&["mount", "passthrough", src.s(), dir.s()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(dir.path.join("hello")).unwrap(), b"world");
    assert!(shortfuse(&["umount", dir.s()]).status.success());
    let out = shortfuse(&["mount", "mem", dir.s()]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(dir.path.join("f"), b"x").unwrap();
    assert_eq!(std::fs::read(dir.path.join("f")).unwrap(), b"x");
    assert!(shortfuse(&["umount", dir.s()]).status.success());
}

#[test]
fn a_users_writeback_cache_wins_over_the_passthrough_default() {
    // Kernel passthrough, a default of passthrough as root, cannot go with
    // the write-back cache: the user's choice leaves the default out
    // rather than failing the mount.
    let src = MountDir::new("pt-wb-src");
    let dir = MountDir::new("pt-wb");
    for o in ["writeback_cache", "optimized"] {
        let out = shortfuse(&["mount", "passthrough", src.s(), dir.s(), "-o", o]);
        assert!(out.status.success(), "-o {o}: {}", stderr(&out));
        std::fs::write(dir.path.join("f"), o).unwrap();
        assert_eq!(std::fs::read(src.path.join("f")).unwrap(), o.as_bytes());
        assert!(shortfuse(&["umount", dir.s()]).status.success());
    }
    // Both said by the user are still refused.
    let out = shortfuse(&[
        "mount",
        "passthrough",
        src.s(),
        dir.s(),
        "-o",
        "passthrough,writeback_cache",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("cannot be combined"), "{}", stderr(&out));
}

/// What `shortfuse mount --help` must say, written out here rather than read
/// from the table the help is printed from: each option's spelling as a user
/// types it, and words of its meaning (defaults and bounds included), on the
/// option's own line.
const HELP_MUST_SAY: &[(&str, &[&str])] = &[
    ("base", &["1 worker thread", "max_write=4096", "no writeback cache"]),
    (
        "optimized",
        &["writeback_cache", "max_write=131072", "one thread per CPU"],
    ),
    ("ro / rw", &["read-only", "default rw"]),
    ("allow_other", &["users other than the mounting user"]),
    ("default_permissions", &["kernel check permissions"]),
    ("fsname=NAME", &["/proc/mounts"]),
    ("subtype=NAME", &["fuse.NAME"]),
    ("max_read=N", &["READ"]),
    ("nosuid / suid", &["set-user-id", "ignore (default)"]),
    ("nodev / dev", &["device files", "refuse (default)"]),
    ("noexec / exec", &["executing programs", "allow (default)"]),
    ("noatime", &["access times"]),
    ("max_write=N[K|M]", &["WRITE", "4096 to 1M", "default 128K"]),
    ("max_readahead=N[K|M]", &["read-ahead"]),
    ("max_background=N", &["background requests", "12"]),
    ("congestion_threshold=N", &["congested", "9"]),
    (
        "writeback_cache / no_writeback_cache",
        &["kernel page cache", "default off"],
    ),
    (
        "parallel_dirops / no_parallel_dirops",
        &["concurrent lookups", "default on"],
    ),
    ("async_read / sync_read", &["several READs", "default async"]),
    ("readdirplus=yes|no|auto", &["READDIRPLUS", "default auto"]),
    ("keep_cache", &["keep cached file data across opens"]),
    ("direct_io", &["bypass the page cache"]),
    ("attr_timeout=SECONDS", &["attributes", "default 1.0"]),
    ("entry_timeout=SECONDS", &["names", "default 1.0"]),
    ("negative_timeout=SECONDS", &["missing names", "default 0"]),
    (
        "splice_read / splice_write / splice_move",
        &["splice(2)", "default off"],
    ),
    ("handle_killpriv_v2", &["suid/sgid on write"]),
    ("passthrough / no_passthrough", &["kernel passthrough", "default off"]),
    ("threads=N", &["worker threads", "--threads wins"]),
    ("uring_depth=N", &["--transport uring", "1 to 1024", "default 8"]),
    ("uring_workers=N", &["--transport uring", "1 to 64", "default 1"]),
    (
        "uring_spin=MICROSECONDS",
        &["--transport uring", "0 to 10000", "default 20"],
    ),
    ("cache=on|off|auto", &["user-space", "default auto", "sftp"]),
    ("page_size=N[K|M]", &["power of two", "default 128K"]),
    ("page_cache_size=N[K|M|G]", &["file data", "default 64M"]),
    ("meta_cache_size=N", &["attributes and names", "default 5000"]),
    ("cache_policy=clock|lru", &["default clock"]),
    ("readahead=PAGES", &["sequential", "default 8", "1 turns it off"]),
    (
        "meta_timeout=SECONDS",
        &["attributes and names are trusted", "default 1"],
    ),
    ("config=FILE", &["TOML", "-o options win"]),
];

#[test]
fn help_says_what_each_option_does() {
    let out = shortfuse(&["mount", "--help"]);
    let help = String::from_utf8(out.stdout).unwrap();
    let (_, options) = help
        .split_once("Mount options (-o)")
        .expect("--help has a mount options section");
    for (opt, words) in HELP_MUST_SAY {
        // The option starts its line, followed by padding, then its meaning.
        let line = options
            .lines()
            .find(|l| {
                l.strip_prefix("  ")
                    .and_then(|r| r.strip_prefix(opt))
                    .is_some_and(|r| r.starts_with("  "))
            })
            .unwrap_or_else(|| panic!("--help has a line for {opt}:\n{help}"));
        for w in *words {
            assert!(line.contains(w), "--help says {w:?} about {opt}: {line:?}");
        }
    }
    for flag in ["--threads", "--transport", "--foreground", "-o <OPT[,OPT...]>"] {
        assert!(help.contains(flag), "--help lists {flag}");
    }
    for fs in ["null", "mem", "passthrough", "stripe", "pack", "sftp", "dist"] {
        assert!(
            help.lines().any(|l| l.starts_with(&format!("  {fs} "))),
            "--help lists the {fs} file system"
        );
    }
    // Each file system's own defaults, with what they trade.
    let (_, defaults) = help
        .split_once("Defaults of `shortfuse mount FS`")
        .expect("--help has a section for the file systems' defaults");
    let line = defaults
        .lines()
        .find(|l| l.trim_start().starts_with("negative_timeout=1"))
        .unwrap_or_else(|| panic!("--help lists passthrough's negative_timeout default:\n{help}"));
    for w in ["passthrough:", "behind the mount", "negative_timeout=0"] {
        assert!(line.contains(w), "--help says {w:?} about the default: {line:?}");
    }
    let line = defaults
        .lines()
        .find(|l| l.trim_start().starts_with("passthrough "))
        .unwrap_or_else(|| panic!("--help lists passthrough's kernel passthrough default:\n{help}"));
    for w in ["as root", "no READ or WRITE", "no_passthrough", "writeback_cache"] {
        assert!(line.contains(w), "--help says {w:?} about the default: {line:?}");
    }
}

#[test]
fn every_option_the_help_lists_is_accepted() {
    // Each spelling on the mount-option side of the help, as a user would
    // type it, parses (a help line naming an option the parser refuses, or
    // a misspelt one, fails here).
    let mount_options = [
        "base",
        "optimized",
        "ro",
        "rw",
        "allow_other",
        "default_permissions",
        "fsname=x",
        "subtype=x",
        "max_read=4096",
        "nosuid",
        "suid",
        "nodev",
        "dev",
        "noexec",
        "exec",
        "noatime",
        "max_write=1M",
        "max_readahead=128K",
        "max_background=12",
        "congestion_threshold=9",
        "writeback_cache",
        "no_writeback_cache",
        "parallel_dirops",
        "no_parallel_dirops",
        "async_read",
        "sync_read",
        "readdirplus=yes",
        "readdirplus=no",
        "readdirplus=auto",
        "keep_cache",
        "direct_io",
        "attr_timeout=1.0",
        "entry_timeout=1.0",
        "negative_timeout=0",
        "splice_read",
        "splice_write",
        "splice_move",
        "handle_killpriv_v2",
        "passthrough",
        "no_passthrough",
        "threads=2",
        "uring_depth=8",
        "uring_workers=1",
        "uring_spin=20",
    ];
    for o in mount_options {
        shortfuse::options::MountOptions::parse(o).unwrap_or_else(|e| panic!("-o {o} is accepted: {e:?}"));
    }
    assert!(shortfuse::options::MountOptions::parse("no_such_option").is_err());
}

#[test]
fn busy_umount_fails_and_lazy_succeeds() -> io::Result<()> {
    let dir = MountDir::new("busy");
    mount_bg(&dir, &[]);
    let pid = daemon_pid(&dir.path);
    // A process whose working directory is the mount keeps it busy.
    let mut holder = Command::new("sleep").arg("30").current_dir(&dir.path).spawn()?;
    let out = shortfuse(&["umount", dir.s()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("busy"), "{}", stderr(&out));
    let out = shortfuse(&["umount", "-l", dir.s()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!is_mounted(&dir.path));
    assert!(alive(pid), "the daemon serves the detached mount while it is in use");
    holder.kill()?;
    holder.wait()?;
    wait_until("the daemon to exit when the last user leaves", || !alive(pid));
    Ok(())
}
