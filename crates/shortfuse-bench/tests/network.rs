//! The network rows at a tiny scale: `sftp` (shortfuse's client) and
//! `sshfs` (Debian's) on the loopback sshd the bench starts itself. The
//! sshfs-read, sftp and latency suites give figures for both and the "sftp vs sshfs"
//! comparison; afterwards no mount, no server or session process and no
//! scratch directory is left, also when a mount fails after the server
//! started and when the bench is interrupted.

mod support;

use shortfuse::sync::Unpoison;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::{mounts_under, shortfuse_bin};

use shortfuse_bench::{BenchOptions, Config};

/// The checks look at every sshd on the machine: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("sfbench-net-{name}-{}", std::process::id()))
}

fn options(name: &str, suites: &[&str], configs: &[&str]) -> BenchOptions {
    let mut o = BenchOptions::new(out_dir(name));
    o.suites = suites.iter().map(|s| s.to_string()).collect();
    let names: Vec<String> = configs.iter().map(|s| s.to_string()).collect();
    o.configs = Some(Config::select(&names).unwrap());
    o.tiny = true;
    o.shortfuse_bin = shortfuse_bin();
    o
}

/// Live sshd processes the bench could have started: any naming `dir` on
/// its command line (the listener), and any sshd in a PID namespace other
/// than ours (the bench's server and its sessions live in their own).
fn servers(dir: &Path) -> Vec<String> {
    let ours = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let needle = dir.to_string_lossy().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let p = e.path();
        let Ok(cmdline) = std::fs::read(p.join("cmdline")) else {
            continue;
        };
        // A zombie runs nothing (and waits for whoever adopted it).
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        if stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')) {
            continue;
        }
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let foreign_sshd = comm.trim() == "sshd" && std::fs::read_link(p.join("ns/pid")).is_ok_and(|ns| ns != ours);
        if cmdline.contains(&needle) || foreign_sshd {
            found.push(format!("{}: {cmdline}", p.display()));
        }
    }
    found
}

/// Nothing of the run is left: no mount, no server, no scratch.
fn nothing_left(out: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !servers(out).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(servers(out).is_empty(), "left running: {:?}", servers(out));
    assert!(mounts_under(out).is_empty(), "left mounted: {:?}", mounts_under(out));
    let scratch: Vec<_> = std::fs::read_dir(out.join("work"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(scratch.is_empty(), "scratch left: {scratch:?}");
}

#[test]
fn sshfs_read_sftp_and_latency_on_sftp_and_sshfs() {
    let _one = SERIAL.lock().unpoison();
    let opts = options("run", &["sshfs-read", "sftp", "latency"], &["native", "sftp", "sshfs"]);
    let report = shortfuse_bench::run(&opts).expect("run");
    let md = std::fs::read_to_string(opts.out.join("report.md")).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(opts.out.join("report.json")).unwrap()).unwrap();
    for (si, suite) in report.suites.iter().enumerate() {
        assert_eq!(suite.results.len(), 3);
        let native = &suite.results[0];
        assert!(native.error.is_none(), "{:?}", native.error);
        for (ri, r) in suite.results.iter().enumerate() {
            assert!(r.error.is_none(), "{} on {}: {:?}", suite.suite, r.config, r.error);
            let ops: Vec<_> = r.figures.iter().map(|f| f.op.as_str()).collect();
            let native_ops: Vec<_> = native.figures.iter().map(|f| f.op.as_str()).collect();
            assert_eq!(ops, native_ops, "{} on {}", suite.suite, r.config);
            let jfigs = json["suites"][si]["results"][ri]["figures"].as_array().unwrap();
            assert_eq!(jfigs.len(), r.figures.len());
            for f in &r.figures {
                assert!(
                    f.value.is_finite() && f.value > 0.0,
                    "{} {}: {f:?}",
                    suite.suite,
                    r.config
                );
            }
        }
        let table = suite.markdown();
        assert!(table.contains("| op | unit | native | sftp | sshfs |"), "{table}");
        assert!(
            suite.comparisons.iter().any(|c| c.title == "sftp vs sshfs"),
            "{:?}",
            suite.comparisons
        );
        // Every row has its ratio to native in both columns and a
        // speed-up of sftp over sshfs.
        for f in &native.figures {
            let rows: Vec<&str> = table
                .lines()
                .filter(|l| l.starts_with(&format!("| {} |", f.op)))
                .collect();
            assert_eq!(rows.len(), 2, "{}: {table}", f.op);
            assert_eq!(rows[0].matches("x, ").count(), 2, "{}", rows[0]);
            assert!(rows[1].contains("x ("), "{}", rows[1]);
        }
        assert!(md.contains(&format!("### {}", suite.suite)));
    }
    let reads: Vec<_> = report.suites[0].results[1]
        .figures
        .iter()
        .map(|f| f.op.as_str())
        .collect();
    assert_eq!(reads, ["100x1MiB-read", "100x1MiB-read-odirect"]);
    nothing_left(&opts.out);
    std::fs::remove_dir_all(&opts.out).unwrap();
}

#[test]
fn failed_mount_stops_the_server() {
    let _one = SERIAL.lock().unpoison();
    // The server starts, then the client cannot: its binary is missing.
    let mut opts = options("fail", &["latency"], &["sftp"]);
    opts.shortfuse_bin = opts.out.join("no-such-shortfuse");
    let report = shortfuse_bench::run(&opts).expect("run");
    let err = report.suites[0].results[0].error.as_deref().expect("must fail");
    assert!(err.contains("no-such-shortfuse"), "{err}");
    let md = std::fs::read_to_string(opts.out.join("report.md")).unwrap();
    assert!(md.contains("`sftp` did not run"), "{md}");
    nothing_left(&opts.out);
    std::fs::remove_dir_all(&opts.out).unwrap();
}

#[test]
fn ctrl_c_stops_the_server_and_unmounts() {
    let _one = SERIAL.lock().unpoison();
    let out = out_dir("int");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shortfuse-bench"))
        .args(["sshfs-read", "--tiny", "--configs", "sshfs", "--shortfuse"])
        .arg(shortfuse_bin())
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while mounts_under(&out).is_empty() {
        assert!(Instant::now() < deadline, "sshfs never mounted");
        assert!(child.try_wait().unwrap().is_none(), "bench ended before mounting");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!servers(&out).is_empty(), "no server while mounted");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status}");
    nothing_left(&out);
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn sshfs_read_in_process_with_the_cache_and_sshfs_without_page_cache() {
    let _one = SERIAL.lock().unpoison();
    // sftp served inside a worker under `shortfuse run` (its own sshd),
    // and sshfs with -o direct_io: the remaining rows of the Prefuse-SSHFS caching thesis.
    let opts = options("pre", &["sshfs-read"], &["sshfs", "sshfs-direct", "sftp-preload-cache"]);
    let report = shortfuse_bench::run(&opts).expect("run");
    let suite = &report.suites[0];
    for r in &suite.results {
        assert!(r.error.is_none(), "{}: {:?}", r.config, r.error);
        let ops: Vec<_> = r.figures.iter().map(|f| f.op.as_str()).collect();
        assert_eq!(ops, ["100x1MiB-read", "100x1MiB-read-odirect"], "{}", r.config);
        assert!(r.figures.iter().all(|f| f.value.is_finite() && f.value > 0.0), "{r:?}");
    }
    assert!(
        suite
            .comparisons
            .iter()
            .any(|c| c.title == "sftp-preload-cache vs sshfs"),
        "{:?}",
        suite.comparisons
    );
    nothing_left(&opts.out);
    std::fs::remove_dir_all(&opts.out).unwrap();
}
