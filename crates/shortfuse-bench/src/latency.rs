//! The `latency` suite: the cost of one operation of each kind, as the
//! foundation issue and `notes/kernel-fuse.md` list them, and of one system
//! call that no file system serves (`getpid`: on `preload`, the cost of the
//! hook every intercepted call pays).
//!
//! On the `preload` configuration the workload runs in a worker process
//! started with `shortfuse run -m MNT=passthrough:SRC -- shortfuse bench
//! --latency-worker ...` (the shim has to be loaded at exec): the worker
//! runs the same code against the shim's mount and prints its figures as
//! JSON.

use std::io;
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use crate::report::Figure;
use crate::samples::Samples;
use crate::sys;

/// How many times each operation runs.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub meta_ops: usize,
    pub data_ops: usize,
    /// Size of the file read sequentially, in MiB.
    pub seq_mib: usize,
}

impl Sizes {
    pub fn of(scale: crate::Scale) -> Sizes {
        scale.pick(Sizes::tiny(), Sizes::quick(), Sizes::full())
    }
    pub fn quick() -> Sizes {
        // Every suite together runs in two minutes at the quick scale.
        Sizes {
            meta_ops: 1_000,
            data_ops: 5_000,
            // Four times the 32 MiB L3 cache of the machines this runs on:
            // a file that fits in it can be read partly from the CPU's
            // cache, more or less so from one configuration to the next.
            seq_mib: 128,
        }
    }
    pub fn full() -> Sizes {
        Sizes {
            meta_ops: 20_000,
            data_ops: 200_000,
            seq_mib: 1024,
        }
    }
    pub fn tiny() -> Sizes {
        Sizes {
            meta_ops: 50,
            data_ops: 200,
            seq_mib: 4,
        }
    }
}

/// Runs every latency workload in `dir` (which must be empty and writable),
/// in a preload worker when `dir` is a `preload` configuration's.
pub fn run(dir: &Path, sizes: Sizes, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    match crate::config::preload_worker(dir) {
        Some(w) => in_worker(&w, dir, sizes, progress),
        None => workload(dir, sizes, progress),
    }
}

const WORKER_FLAG: &str = "--latency-worker";

/// The worker's side: `--latency-worker DIR META_OPS DATA_OPS SEQ_MIB`
/// runs the workload in DIR and prints the figures as JSON. `None` when
/// `args` are not a worker's.
pub fn worker_main(args: &[String]) -> Option<i32> {
    if args.first().map(String::as_str) != Some(WORKER_FLAG) {
        return None;
    }
    // `shortfuse bench` adds `--shortfuse PATH` after the arguments.
    let args = match args {
        [head @ .., flag, _] if flag == "--shortfuse" => head,
        all => all,
    };
    let parsed = match args {
        [_, dir, m, d, s] => match (m.parse(), d.parse(), s.parse()) {
            (Ok(meta_ops), Ok(data_ops), Ok(seq_mib)) => Some((
                dir,
                Sizes {
                    meta_ops,
                    data_ops,
                    seq_mib,
                },
            )),
            _ => None,
        },
        _ => None,
    };
    let Some((dir, sizes)) = parsed else {
        eprintln!("usage: {WORKER_FLAG} DIR META_OPS DATA_OPS SEQ_MIB");
        return Some(2);
    };
    Some(print_figures(workload(Path::new(dir), sizes, &mut |_| {})))
}

/// Prints a worker's figures as JSON; its exit status.
pub(crate) fn print_figures(figures: io::Result<Vec<Figure>>) -> i32 {
    match figures {
        Ok(figures) => match serde_json::to_string(&figures) {
            Ok(json) => {
                println!("{json}");
                0
            }
            Err(e) => {
                eprintln!("bench worker: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("bench worker: {e}");
            1
        }
    }
}

const SUITE_FLAG: &str = "--suite-worker";

/// The worker's side for the other suites that run under the shim:
/// `--suite-worker SUITE DIR SCALE WORKERS HOLDS_FILES` runs `transport` or
/// `meta` in DIR and prints the figures as JSON. `None` when `args` are not
/// a worker's.
pub fn suite_worker_main(args: &[String]) -> Option<i32> {
    if args.first().map(String::as_str) != Some(SUITE_FLAG) {
        return None;
    }
    let args = match args {
        [head @ .., flag, _] if flag == "--shortfuse" => head,
        all => all,
    };
    let scale = |s: &str| match s {
        "tiny" => Some(crate::Scale::Tiny),
        "quick" => Some(crate::Scale::Quick),
        "full" => Some(crate::Scale::Full),
        _ => None,
    };
    let parsed = match args {
        [_, suite, dir, s, w, c, h] => match (scale(s), w.parse(), crate::transport::parse_thread_counts(c), h.parse())
        {
            (Some(s), Ok(w), Ok(c), Ok(h)) => Some((suite.as_str(), Path::new(dir), s, w, c, h)),
            _ => None,
        },
        _ => None,
    };
    let figures = match parsed {
        Some(("transport", dir, scale, _, counts, holds)) => {
            crate::transport::run(dir, scale, holds, &counts, &mut |_| {})
        }
        Some(("meta", dir, scale, workers, _, _)) => crate::meta::run(dir, scale, workers, &mut |_| {}),
        Some(("sshfs-read", dir, scale, _, _, _)) => crate::sshfs_read::run(dir, scale, &mut |_| {}),
        Some(("personalities", dir, scale, _, _, _)) => crate::personalities::suite(dir, scale, &mut |_| {}),
        _ => {
            eprintln!(
                "usage: {SUITE_FLAG} transport|meta|sshfs-read|personalities DIR tiny|quick|full WORKERS THREAD,COUNTS true|false"
            );
            return Some(2);
        }
    };
    Some(print_figures(figures))
}

/// What a suite run in a worker is told besides its directory and scale.
pub(crate) struct SuiteParams<'a> {
    /// `meta`'s workers.
    pub workers: usize,
    /// `transport`'s thread counts.
    pub thread_counts: &'a [usize],
    /// Whether the configuration keeps files (`transport`).
    pub holds_files: bool,
}

/// Runs `suite` in a worker under the shim (a `preload` or ring
/// configuration's directory).
pub(crate) fn suite_in_worker(
    w: &crate::config::PreloadWorker,
    suite: &str,
    dir: &Path,
    scale: crate::Scale,
    p: &SuiteParams<'_>,
    progress: &mut dyn FnMut(&str),
) -> io::Result<Vec<Figure>> {
    progress(&format!("{suite}, in a worker under shortfuse run"));
    let args = [
        SUITE_FLAG.to_string(),
        suite.to_string(),
        dir.display().to_string(),
        scale.name().to_string(),
        p.workers.to_string(),
        crate::transport::format_thread_counts(p.thread_counts),
        p.holds_files.to_string(),
    ];
    run_worker(w, &args)
}

/// Runs the workload in a process under the preload shim and reads its
/// figures back.
fn in_worker(
    w: &crate::config::PreloadWorker,
    dir: &Path,
    sizes: Sizes,
    progress: &mut dyn FnMut(&str),
) -> io::Result<Vec<Figure>> {
    progress("all operations, in a worker under shortfuse run");
    let mut args = vec![WORKER_FLAG.to_string(), dir.display().to_string()];
    args.extend([sizes.meta_ops, sizes.data_ops, sizes.seq_mib].map(|n| n.to_string()));
    run_worker(w, &args)
}

/// Runs `shortfuse bench ARGS` (a worker's arguments) under the preload
/// shim with `w`'s mount and reads back the figures it prints as JSON.
pub(crate) fn run_worker(w: &crate::config::PreloadWorker, args: &[String]) -> io::Result<Vec<Figure>> {
    let out = w
        .command()
        .arg(&w.shortfuse_bin)
        .arg("bench")
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "preload worker ({}): {}",
            out.status,
            stderr.trim()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| io::Error::other(format!("preload worker output: {e}; stderr: {}", stderr.trim())))?;
    let figures = v
        .as_array()
        .ok_or_else(|| io::Error::other("preload worker output is not a list"))?
        .iter()
        .map(|f| Figure {
            op: f["op"].as_str().unwrap_or_default().to_string(),
            unit: f["unit"].as_str().unwrap_or_default().to_string(),
            value: f["value"].as_f64().unwrap_or(f64::NAN),
            mean: f["mean"].as_f64(),
            p50: f["p50"].as_f64(),
            p99: f["p99"].as_f64(),
            samples: f["samples"].as_u64().unwrap_or(0),
            lower_is_better: f["lower_is_better"].as_bool().unwrap_or(true),
            // The point of a scaling curve (transport's threaded rows).
            series: f["series"].as_str().map(str::to_string),
            threads: f["threads"].as_u64().map(|t| t as u32),
            ..Figure::default()
        })
        .collect::<Vec<_>>();
    if figures.is_empty() || figures.iter().any(|f| f.op.is_empty() || !f.value.is_finite()) {
        return Err(io::Error::other(format!("preload worker gave no usable figures: {v}")));
    }
    Ok(figures)
}

/// The workload itself, in this process.
fn workload(dir: &Path, sizes: Sizes, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let mut out = Vec::new();
    let n = sizes.meta_ops;
    let file = dir.join("file");
    let cfile = sys::cpath(&file);
    let fd = sys::open(&cfile, libc::O_CREAT | libc::O_RDWR, 0o644)?;
    let block = vec![0x5au8; 1 << 20];
    sys::pwrite(fd, &block, 0)?;
    sys::close(fd)?;

    progress("stat");
    let mut s = Samples::with_capacity(sizes.data_ops);
    for _ in 0..sizes.data_ops {
        s.time(|| sys::stat(&cfile))?;
    }
    out.push(s.median_figure("stat"));

    progress("stat (missing)");
    let missing = sys::cpath(&dir.join("missing"));
    let mut s = Samples::with_capacity(sizes.data_ops);
    for _ in 0..sizes.data_ops {
        let r = s.time(|| Ok(sys::stat(&missing)))?;
        if r.is_ok() {
            return Err(io::Error::other("stat of a missing name succeeded"));
        }
    }
    out.push(s.median_figure("stat-missing"));

    progress("open+close");
    let mut s = Samples::with_capacity(n * 5);
    for _ in 0..n * 5 {
        s.time(|| sys::open(&cfile, libc::O_RDONLY, 0).and_then(sys::close))?;
    }
    out.push(s.median_figure("open+close"));

    progress("create");
    let names: Vec<_> = (0..n).map(|i| sys::cpath(&dir.join(format!("c{i}")))).collect();
    let mut s = Samples::with_capacity(n);
    for p in &names {
        s.time(|| sys::open(p, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644).and_then(sys::close))?;
    }
    out.push(s.median_figure("create"));

    progress("unlink");
    let mut s = Samples::with_capacity(n);
    for p in &names {
        s.time(|| sys::unlink(p))?;
    }
    out.push(s.median_figure("unlink"));

    progress("4 KiB pread (cached)");
    let fd = sys::open(&cfile, libc::O_RDONLY, 0)?;
    let mut buf = vec![0u8; 4096];
    for off in (0..(1u64 << 20)).step_by(4096) {
        sys::pread(fd, &mut buf, off)?;
    }
    let mut s = Samples::with_capacity(sizes.data_ops);
    for i in 0..sizes.data_ops as u64 {
        let off = (i.wrapping_mul(2654435761) % 256) * 4096;
        let got = s.time(|| sys::pread(fd, &mut buf, off))?;
        if got != 4096 || buf[0] != 0x5a {
            return Err(io::Error::other(format!("short or wrong read at {off}: {got} bytes")));
        }
    }
    sys::close(fd)?;
    out.push(s.median_figure("4KiB-pread-cached"));

    progress("4 KiB write");
    let wfile = sys::cpath(&dir.join("wfile"));
    let fd = sys::open(&wfile, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o644)?;
    let mut s = Samples::with_capacity(sizes.data_ops);
    for i in 0..sizes.data_ops as u64 {
        let off = (i % 16384) * 4096;
        s.time(|| sys::pwrite(fd, &block[..4096], off))?;
    }
    sys::fsync(fd)?;
    sys::close(fd)?;
    sys::unlink(&wfile)?;
    out.push(s.median_figure("4KiB-write"));

    progress("sequential read");
    out.push(sequential_read(dir, sizes.seq_mib, &block)?);
    sys::unlink(&cfile)?;

    progress("getpid");
    out.push(getpid(sizes.data_ops));
    Ok(out)
}

/// The cost of a system call no file system serves, in batches of 100 (a
/// clock read per call would cost as much as the call).
fn getpid(batches: usize) -> Figure {
    const BATCH: u64 = 100;
    let mut s = Samples::with_capacity(batches);
    for _ in 0..batches {
        let _ = s.time(|| {
            for _ in 0..BATCH {
                // SAFETY: getpid takes no arguments and cannot fail; the raw
                // system call (not glibc's wrapper) is what the shim hooks.
                std::hint::black_box(unsafe { libc::syscall(libc::SYS_getpid) });
            }
            Ok(())
        });
    }
    let mut f = s.median_figure("getpid");
    f.value /= BATCH as f64;
    f.mean = f.mean.map(|v| v / BATCH as f64);
    f.p50 = f.p50.map(|v| v / BATCH as f64);
    f.p99 = f.p99.map(|v| v / BATCH as f64);
    f.samples *= BATCH;
    f
}

/// Writes a file of `mib` MiB, reads it once to warm the caches, then times
/// three more whole reads with 1 MiB calls.
fn sequential_read(dir: &Path, mib: usize, block: &[u8]) -> io::Result<Figure> {
    let path = sys::cpath(&dir.join("seq"));
    let fd = sys::open(&path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o644)?;
    for i in 0..mib as u64 {
        sys::pwrite(fd, block, i << 20)?;
    }
    sys::close(fd)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut read_all = || -> io::Result<(u64, f64)> {
        let fd = sys::open(&path, libc::O_RDONLY, 0)?;
        let t = Instant::now();
        let mut total = 0u64;
        loop {
            let n = sys::read(fd, &mut buf)?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        let secs = t.elapsed().as_secs_f64();
        sys::close(fd)?;
        Ok((total, secs))
    };
    read_all()?;
    // The median of three timed passes: one pass of a fast configuration
    // lasts milliseconds, and a single preemption on this shared machine
    // changes it severalfold.
    let mut passes = Vec::new();
    let mut total = 0;
    for _ in 0..3 {
        let (t, secs) = read_all()?;
        total = t;
        passes.push(t as f64 / secs / 1e9);
    }
    sys::unlink(&path)?;
    if total != (mib as u64) << 20 {
        return Err(io::Error::other(format!(
            "sequential read returned {total} bytes, expected {mib} MiB"
        )));
    }
    Ok(Figure {
        op: "seq-read".into(),
        unit: "GB/s".into(),
        value: crate::report::median(&passes),
        p50: None,
        p99: None,
        samples: 1,
        lower_is_better: false,
        ..Figure::default()
    })
}
