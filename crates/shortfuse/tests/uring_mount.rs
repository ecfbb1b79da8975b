//! Mounted tests of `--transport uring` through the `shortfuse` binary, as
//! root: file operations on `mem` and `passthrough`, a check from `shortfuse
//! stats --json` that the requests travelled over the rings, and teardown
//! by SIGTERM while a reader is busy.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// The `shortfuse` binary of this target directory, built once so that it
/// matches the library under test.
fn bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
        let target_dir = profile_dir.parent().expect("target dir");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-q", "-p", "shortfuse-cli", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo build -p shortfuse-cli");
        assert!(status.success(), "cargo build -p shortfuse-cli failed");
        let bin = profile_dir.join("shortfuse");
        assert!(bin.exists(), "{} missing after the build", bin.display());
        bin
    })
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the uring tests mount file systems and switch the kernel on: run them as root"
    );
}

fn is_mounted(mp: &Path) -> bool {
    let mp = fs::canonicalize(mp).unwrap_or_else(|_| mp.to_path_buf());
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sf-uring-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// A background mount, unmounted on drop.
struct Mounted {
    mp: PathBuf,
    dir: PathBuf,
}

impl Mounted {
    fn new(tag: &str, fs_name: &str, with_source: bool, extra: &[&str]) -> Mounted {
        require_root();
        let dir = tempdir(tag);
        let mp = dir.join("mnt");
        fs::create_dir(&mp).unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(["mount", fs_name, "--transport", "uring"]).args(extra);
        if with_source {
            let src = dir.join("src");
            fs::create_dir(&src).unwrap();
            cmd.arg(&src);
        }
        let out = cmd.arg(&mp).output().unwrap();
        assert!(
            out.status.success(),
            "mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("unavailable"), "fell back to dev: {stderr}");
        assert!(is_mounted(&mp), "not mounted");
        Mounted { mp, dir }
    }

    fn stats_json(&self) -> String {
        let out = Command::new(bin())
            .args(["stats", "--json"])
            .arg(&self.mp)
            .output()
            .unwrap();
        assert!(out.status.success(), "stats: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new(bin()).arg("umount").arg(&self.mp).status();
        let start = Instant::now();
        while is_mounted(&self.mp) && start.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(20));
        }
        if is_mounted(&self.mp) {
            let _ = Command::new(bin()).args(["umount", "-l"]).arg(&self.mp).status();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `"key":NUMBER` after `after` in `json`.
fn number_after(json: &str, after: &str, key: &str) -> Option<u64> {
    let start = json.find(after)?;
    let rest = &json[start..];
    let k = format!("\"{key}\":");
    let i = rest.find(&k)? + k.len();
    let digits: String = rest[i..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn op_count(json: &str, name: &str) -> u64 {
    number_after(json, &format!("\"name\":\"{name}\""), "count").unwrap_or(0)
}

fn transport_count(json: &str, t: &str) -> u64 {
    number_after(json, "\"transports\":", t).unwrap_or_else(|| panic!("no transport {t} in {json}"))
}

/// Everything but INIT and the messages that never travel over the rings
/// (FORGET, BATCH_FORGET, INTERRUPT) must have been served over uring.
fn assert_served_over_uring(json: &str) {
    let dev = transport_count(json, "dev");
    let uring = transport_count(json, "uring");
    let dev_only = 1 + op_count(json, "FORGET") + op_count(json, "BATCH_FORGET") + op_count(json, "INTERRUPT");
    assert!(uring > 100, "only {uring} requests over uring: {json}");
    assert!(
        dev <= dev_only,
        "{dev} requests over /dev/fuse, but only {dev_only} belong there: {json}"
    );
    for op in ["LOOKUP", "CREATE", "WRITE", "READ", "RENAME", "UNLINK"] {
        assert!(op_count(json, op) > 0, "no {op} served: {json}");
    }
}

fn pattern(offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let x = offset + i as u64;
        *b = (x.wrapping_mul(31) ^ (x >> 13)) as u8;
    }
}

fn exercise(mp: &Path) {
    // create, write, read
    let a = mp.join("a.txt");
    fs::write(&a, b"hello over io_uring\n").unwrap();
    assert_eq!(fs::read(&a).unwrap(), b"hello over io_uring\n");
    // mkdir, readdir, rename, unlink
    let d = mp.join("dir");
    fs::create_dir(&d).unwrap();
    for i in 0..20 {
        fs::write(d.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names, want);
    fs::rename(&a, d.join("renamed.txt")).unwrap();
    assert!(!a.exists());
    assert_eq!(fs::read(d.join("renamed.txt")).unwrap(), b"hello over io_uring\n");
    for i in 0..20 {
        fs::remove_file(d.join(format!("f{i}"))).unwrap();
    }
    fs::remove_file(d.join("renamed.txt")).unwrap();
    assert_eq!(fs::read_dir(&d).unwrap().count(), 0);
    fs::remove_dir(&d).unwrap();

    // 16 MiB with data verification, in odd-sized chunks.
    let big = mp.join("big.bin");
    const SIZE: u64 = 16 << 20;
    let mut f = fs::File::create(&big).unwrap();
    let mut buf = vec![0u8; 300_007];
    let mut off = 0;
    while off < SIZE {
        let n = buf.len().min((SIZE - off) as usize);
        pattern(off, &mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        off += n as u64;
    }
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::metadata(&big).unwrap().len(), SIZE);
    let mut f = fs::File::open(&big).unwrap();
    let mut got = vec![0u8; 1 << 20];
    let mut want = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < SIZE {
        let n = f.read(&mut got).unwrap();
        assert!(n > 0, "short file at {off}");
        pattern(off, &mut want[..n]);
        assert!(got[..n] == want[..n], "data differs in the chunk at {off}");
        off += n as u64;
    }
    drop(f);
    fs::remove_file(&big).unwrap();

    // Several threads at once (requests land on both CPUs' queues).
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let mp = mp.to_path_buf();
            thread::spawn(move || {
                let dir = mp.join(format!("t{t}"));
                fs::create_dir(&dir).unwrap();
                for i in 0..50 {
                    let p = dir.join(format!("file{i}"));
                    let body = format!("thread {t} file {i} ").repeat(i + 1);
                    fs::write(&p, &body).unwrap();
                    assert_eq!(fs::read_to_string(&p).unwrap(), body);
                    let q = dir.join(format!("moved{i}"));
                    fs::rename(&p, &q).unwrap();
                    fs::remove_file(&q).unwrap();
                }
                fs::remove_dir(&dir).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread failed");
    }
}

#[test]
fn mem_over_uring_serves_file_operations() {
    let m = Mounted::new("mem", "mem", false, &[]);
    exercise(&m.mp);
    assert_served_over_uring(&m.stats_json());
}

#[test]
fn passthrough_over_uring_serves_file_operations() {
    // Without kernel passthrough (a default as root), so that reads and
    // writes reach the daemon over the rings this test is about.
    let m = Mounted::new("pt", "passthrough", true, &["-o", "no_passthrough"]);
    exercise(&m.mp);
    // The data really lives in the source directory.
    fs::write(m.mp.join("seen.txt"), b"x").unwrap();
    assert_eq!(fs::read(m.dir.join("src/seen.txt")).unwrap(), b"x");
    assert_served_over_uring(&m.stats_json());
}

#[test]
fn uring_depth_and_workers_options_serve_too() {
    let m = Mounted::new(
        "opts",
        "mem",
        false,
        &["-o", "uring_depth=2,uring_workers=2,max_write=1M"],
    );
    exercise(&m.mp);
    assert_served_over_uring(&m.stats_json());
}

fn wait_child(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if start.elapsed() > timeout {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_with_a_busy_reader_ends_daemon_and_mount() {
    require_root();
    let dir = tempdir("term");
    let mp = dir.join("mnt");
    fs::create_dir(&mp).unwrap();
    let mut child = Command::new(bin())
        .args(["mount", "-f", "mem", "--transport", "uring"])
        .arg(&mp)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the mount", Duration::from_secs(10), || is_mounted(&mp));
    let file = mp.join("busy.bin");
    let mut chunk = vec![0u8; 1 << 20];
    pattern(0, &mut chunk);
    {
        let mut f = fs::File::create(&file).unwrap();
        for _ in 0..8 {
            f.write_all(&chunk).unwrap();
        }
    }
    let reading = Arc::new(AtomicBool::new(false));
    let reader = {
        let (file, reading) = (file.clone(), reading.clone());
        thread::spawn(move || {
            // Bounded: reads for two seconds, errors (connection gone) end it.
            let start = Instant::now();
            let mut buf = vec![0u8; 1 << 16];
            while start.elapsed() < Duration::from_secs(2) {
                let Ok(mut f) = fs::File::open(&file) else { return };
                reading.store(true, Ordering::Release);
                loop {
                    match f.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            }
        })
    };
    wait_until("the reader", Duration::from_secs(10), || {
        reading.load(Ordering::Acquire)
    });
    // SAFETY: kill(2) on our own child.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = wait_child(&mut child, Duration::from_secs(20));
    if status.is_none() {
        let _ = child.kill();
        let _ = Command::new(bin()).args(["umount", "-l"]).arg(&mp).status();
        panic!("the daemon did not exit within 20 s of SIGTERM");
    }
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(status.unwrap().success(), "daemon exit status {status:?}: {stderr}");
    assert!(!is_mounted(&mp), "mount left behind");
    let start = Instant::now();
    while !reader.is_finished() {
        assert!(start.elapsed() < Duration::from_secs(10), "the reader hangs");
        thread::sleep(Duration::from_millis(20));
    }
    reader.join().unwrap();
    let _ = fs::remove_dir_all(&dir);
}
