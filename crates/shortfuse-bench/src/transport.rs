//! The `transport` suite: what `/dev/fuse` and FUSE over io_uring
//! cost, side by side.
//!
//! On `null` (which keeps nothing: create succeeds, every lookup fails) it
//! times empty operations, whose cost is the trip to the daemon and back:
//! a create (open with O_CREAT, then close), a stat of a missing name and an
//! open+close of the mount's root directory. On configurations that hold
//! files it runs the `passthrough` rows: 4 KiB random reads, buffered (from
//! cold caches) and O_DIRECT, on 1, 2, 4 and 8 threads, and empty-file
//! creates on 1 and 2 threads.

use std::io;
use std::path::Path;
use std::time::Duration;

use crate::io::{prealloc, together, IoRow, Pattern};
use crate::report::Figure;
use crate::samples::Samples;
use crate::scale::Scale;
use crate::sys;

pub const READ_THREADS: &[usize] = &[1, 2, 4, 8];
pub const CREATE_THREADS: &[usize] = &[1, 2];
/// Names the null workload creates over and over (none of them persists).
const NAMES: usize = 64;
/// Untimed operations before each timed loop, so that connection and ring
/// set-up are not counted.
const WARMUP: usize = 100;

struct Sizes {
    /// Timed empty operations of each kind.
    empty_ops: usize,
    /// The file the random reads spread over.
    file: u64,
    /// Time cap of each read row and each create row.
    row: Duration,
    /// Cap on the files one create row makes.
    max_creates: usize,
}

fn sizes(scale: Scale) -> Sizes {
    Sizes {
        empty_ops: scale.pick(200, 2_000, 50_000),
        file: scale.pick(8 << 20, 32 << 20, 1 << 30),
        row: scale.pick(
            Duration::from_millis(20),
            Duration::from_millis(100),
            Duration::from_secs(5),
        ),
        max_creates: scale.pick(200, 2_000, 200_000),
    }
}

pub fn describe(scale: Scale) -> String {
    let s = sizes(scale);
    format!(
        "Scale {}. On null configurations, empty operations, {} of each after {WARMUP} untimed: `empty-create` is open(O_CREAT|O_WRONLY) + close of one of {NAMES} names (null answers CREATE but keeps nothing, so the kernel sends a LOOKUP that fails, a CREATE and a RELEASE each time, and the shim, which does not look up a name it is about to create, a CREATE and a RELEASE; a stat afterwards fails, which the suite checks), `empty-stat-missing` is stat of a name never created (one failing LOOKUP), `empty-open+close-root` is open(O_DIRECTORY) + close of the mount's root (OPENDIR + RELEASEDIR); median latency in µs (the mean, which this VM's scheduling tails sway, and p99 in the JSON). On the other configurations, passthrough rows: 4 KiB random reads over a {} MiB file on {READ_THREADS:?} threads, buffered after dropping caches (`rand-read-4K`) and with O_DIRECT (`rand-read-4K-direct`), {:.2} s each, in MB/s; creates of empty files (open O_CREAT|O_EXCL + close) in one shared directory on {CREATE_THREADS:?} threads, {:.2} s or {} files each, in ops/s.",
        scale.name(),
        s.empty_ops,
        s.file >> 20,
        s.row.as_secs_f64(),
        s.row.as_secs_f64(),
        s.max_creates,
    )
}

/// Runs the rows that fit the configuration: empty operations where names
/// do not persist (`holds_files` false), the passthrough rows elsewhere.
pub fn run(dir: &Path, scale: Scale, holds_files: bool, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let s = sizes(scale);
    if holds_files {
        files(dir, &s, progress)
    } else {
        empty(dir, &s, progress)
    }
}

/// Warms up, then times `n` calls of `op`.
fn timed(n: usize, mut op: impl FnMut() -> io::Result<()>) -> io::Result<Samples> {
    for _ in 0..WARMUP {
        op()?;
    }
    let mut s = Samples::with_capacity(n);
    for _ in 0..n {
        s.time(&mut op)?;
    }
    Ok(s)
}

fn empty(dir: &Path, s: &Sizes, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let names: Vec<_> = (0..NAMES).map(|i| sys::cpath(&dir.join(format!("n{i}")))).collect();
    let missing = sys::cpath(&dir.join("missing"));
    let root = sys::cpath(dir);

    // The workload below is only what it claims on a file system that
    // forgets names: check that first.
    sys::close(sys::open(&names[0], libc::O_CREAT | libc::O_WRONLY, 0o644)?)?;
    match sys::stat(&names[0]) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("stat after create: {e}"))),
        Ok(()) => {
            return Err(io::Error::other(
                "a created name persisted: the empty-operation rows need a null file system",
            ))
        }
    }

    let mut out = Vec::new();
    progress("empty create");
    let mut i = 0;
    let create = timed(s.empty_ops, || {
        i = (i + 1) % NAMES;
        sys::close(sys::open(&names[i], libc::O_CREAT | libc::O_WRONLY, 0o644)?)
    })?;
    out.push(create.median_figure("empty-create"));

    progress("empty stat of a missing name");
    let stat = timed(s.empty_ops, || match sys::stat(&missing) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), format!("stat of a missing name: {e}"))),
        Ok(()) => Err(io::Error::other("stat of a missing name succeeded")),
    })?;
    out.push(stat.median_figure("empty-stat-missing"));

    progress("empty open+close of the root");
    let open = timed(s.empty_ops, || {
        sys::close(sys::open(&root, libc::O_RDONLY | libc::O_DIRECTORY, 0)?)
    })?;
    out.push(open.median_figure("empty-open+close-root"));
    Ok(out)
}

fn files(dir: &Path, s: &Sizes, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let file = vec![dir.join("rand")];
    progress("laying out");
    prealloc(&file[0], s.file)?;
    let mut out = Vec::new();
    for (series, flags) in [("rand-read-4K", 0), ("rand-read-4K-direct", libc::O_DIRECT)] {
        for &threads in READ_THREADS {
            let op = format!("{series}-{threads}th");
            progress(&op);
            if flags == 0 {
                sys::drop_caches()?;
            }
            let row = IoRow {
                pattern: Pattern::RandRead,
                bs: 4096,
                threads,
                files: &file,
                file_size: s.file,
                duration: s.row,
                flags,
            };
            out.push(row.run(&op)?.at(series, threads));
        }
    }
    std::fs::remove_file(&file[0])?;
    for &threads in CREATE_THREADS {
        let op = format!("create-{threads}th");
        progress(&op);
        out.push(creates(&dir.join(&op), threads, s)?.at("create", threads));
    }
    Ok(out)
}

/// Empty-file creates in one shared directory, removed (untimed) afterwards.
fn creates(dir: &Path, threads: usize, s: &Sizes) -> io::Result<Figure> {
    std::fs::create_dir_all(dir)?;
    let made = std::sync::Mutex::new(Vec::new());
    let result = together(threads, |t| {
        let deadline = std::time::Instant::now() + s.row;
        let mut mine = Vec::new();
        let mut i = t;
        let mut outcome = Ok(());
        while i < s.max_creates && std::time::Instant::now() < deadline {
            let p = sys::cpath(&dir.join(format!("c{i}")));
            outcome = sys::open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644).and_then(sys::close);
            if outcome.is_err() {
                break;
            }
            mine.push(p);
            i += threads;
        }
        let n = mine.len() as u64;
        // Kept even on failure, so that the files are removed below.
        made.lock().unwrap_or_else(|e| e.into_inner()).extend(mine);
        outcome.map(|()| n)
    });
    let cleanup = || -> io::Result<()> {
        for p in made.into_inner().unwrap_or_else(|e| e.into_inner()) {
            sys::unlink(&p)?;
        }
        std::fs::remove_dir(dir)
    };
    let cleaned = cleanup();
    // The workload's own error first: after a failed create the directory
    // may hold a file nobody recorded (the daemon made it, then the call
    // failed), and the removal's ENOTEMPTY would hide why.
    let (n, elapsed) = result?;
    cleaned.map_err(|e| io::Error::new(e.kind(), format!("create-{threads}th: removing the files: {e}")))?;
    if n == 0 {
        return Err(io::Error::other(format!("create-{threads}th: no file created")));
    }
    Ok(Figure::rate(
        format!("create-{threads}th"),
        "ops/s",
        n as f64 / elapsed.as_secs_f64(),
        n,
    ))
}
