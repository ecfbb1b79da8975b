//! The `transport` suite: what `/dev/fuse` and FUSE over io_uring
//! cost, side by side.
//!
//! On `null` (which keeps nothing: create succeeds, every lookup fails) it
//! times empty operations, whose cost is the trip to the daemon and back:
//! a create (open with O_CREAT, then close), a stat of a missing name and an
//! open+close of the mount's root directory. On configurations that hold
//! files it runs the `passthrough` rows: 4 KiB random reads, buffered (from
//! cold caches) and O_DIRECT, and empty-file creates in one shared directory
//! and in one directory per thread, each on 1 to 2x the machine's cores
//! ([`thread_counts`]): where the transports stop scaling shows.

use shortfuse::sync::Unpoison;
use std::io;
use std::path::Path;
use std::time::Duration;

use crate::io::{prealloc, together, IoRow, Pattern};
use crate::report::Figure;
use crate::samples::Samples;
use crate::scale::Scale;
use crate::sys;

/// The thread counts of the threaded rows on a machine of `cores` CPUs:
/// the powers of two up to twice the cores, the cores and twice the cores
/// (1, 2, 4 on 2 cores; 1, 2, 4, 8, 16, 32 on 16).
pub fn thread_counts(cores: usize) -> Vec<usize> {
    let top = 2 * cores.max(1);
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|n| *n <= top)
        .chain([cores.max(1), top])
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// [`thread_counts`] of this machine (the CPUs this process may run on).
pub fn machine_thread_counts() -> Vec<usize> {
    thread_counts(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// Parses `--thread-counts` (`8,16,32`): at least one count, each at least
/// 1; sorted, repeats dropped.
pub fn parse_thread_counts(s: &str) -> Result<Vec<usize>, String> {
    let mut v = s
        .split(',')
        .map(|t| match t.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("thread counts: {t:?} is not a count of at least 1")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// Counts as [`parse_thread_counts`] reads them back (a worker's argument).
pub fn format_thread_counts(counts: &[usize]) -> String {
    counts.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}
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

pub fn describe(scale: Scale, counts: &[usize]) -> String {
    let s = sizes(scale);
    format!(
        "Scale {}. On null configurations, empty operations, {} of each after {WARMUP} untimed: `empty-create` is open(O_CREAT|O_WRONLY) + close of one of {NAMES} names (null answers CREATE but keeps nothing, so the kernel sends a LOOKUP that fails, a CREATE and a RELEASE each time, and the shim, which does not look up a name it is about to create, a CREATE and a RELEASE; a stat afterwards fails, which the suite checks), `empty-stat-missing` is stat of a name never created (one failing LOOKUP), `empty-open+close-root` is open(O_DIRECTORY) + close of the mount's root (OPENDIR + RELEASEDIR); median latency in µs (the mean, which this VM's scheduling tails sway, and p99 in the JSON). On the other configurations, passthrough rows on {threads:?} threads (by default 1 to 2x this machine's cores; `--thread-counts` chooses others): 4 KiB random reads over a {} MiB file, buffered after dropping caches (`rand-read-4K`), buffered with the whole file read through the mount first, so that every read is a page-cache hit and the row measures the path of a call rather than the disk (`rand-read-4K-cached`), and with O_DIRECT (`rand-read-4K-direct`), {:.2} s each, in MB/s; creates of empty files (open O_CREAT|O_EXCL + close) in one shared directory (`create`) and in one directory per thread (`create-own-dir`), {:.2} s or {} files each, in ops/s. On preload and ring the rows run in one process under `shortfuse run`, its threads sharing the shim (and, for ring, the connection to the daemon).",
        scale.name(),
        s.empty_ops,
        s.file >> 20,
        s.row.as_secs_f64(),
        s.row.as_secs_f64(),
        s.max_creates,
        threads = counts,
    )
}

/// Runs the rows that fit the configuration: empty operations where names
/// do not persist (`holds_files` false), the passthrough rows elsewhere.
pub fn run(
    dir: &Path,
    scale: Scale,
    holds_files: bool,
    counts: &[usize],
    progress: &mut dyn FnMut(&str),
) -> io::Result<Vec<Figure>> {
    let s = sizes(scale);
    if holds_files {
        files(dir, &s, counts, progress)
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

fn files(dir: &Path, s: &Sizes, counts: &[usize], progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let file = vec![dir.join("rand")];
    progress("laying out");
    prealloc(&file[0], s.file)?;
    let mut out = Vec::new();
    let reads = [
        ("rand-read-4K", Cache::Dropped, 0),
        ("rand-read-4K-cached", Cache::Warm, 0),
        ("rand-read-4K-direct", Cache::Dropped, libc::O_DIRECT),
    ];
    for (series, cache, flags) in reads {
        for &threads in counts {
            let op = format!("{series}-{threads}th");
            progress(&op);
            match cache {
                Cache::Dropped if flags == 0 => sys::drop_caches()?,
                Cache::Dropped => {}
                // Every page in the cache before the clock starts, read
                // through the mount as the row reads it: what the row
                // measures is the path of a call, not the disk.
                Cache::Warm => read_whole(&file[0])?,
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
    for series in ["create", "create-own-dir"] {
        for &threads in counts {
            let op = format!("{series}-{threads}th");
            progress(&op);
            let own = series == "create-own-dir";
            out.push(creates(&dir.join(&op), &op, threads, own, s)?.at(series, threads));
        }
    }
    Ok(out)
}

/// Where the file's pages are when a read row starts.
#[derive(Clone, Copy)]
enum Cache {
    /// Dropped (with O_DIRECT, not used at all).
    Dropped,
    /// All of them in the page cache.
    Warm,
}

/// Reads all of `path`, so that its pages are in the page cache.
fn read_whole(path: &Path) -> io::Result<()> {
    let fd = sys::open(&sys::cpath(path), libc::O_RDONLY, 0)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    let done = loop {
        match sys::pread(fd, &mut buf, off) {
            Ok(0) => break Ok(()),
            Ok(n) => off += n as u64,
            Err(e) => break Err(e),
        }
    };
    sys::close(fd)?;
    done
}

/// Empty-file creates in one shared directory, or with `own_dirs` in one
/// directory per thread (made before the clock starts), removed (untimed)
/// afterwards.
fn creates(dir: &Path, op: &str, threads: usize, own_dirs: bool, s: &Sizes) -> io::Result<Figure> {
    std::fs::create_dir_all(dir)?;
    let sub = |t: usize| {
        if own_dirs {
            dir.join(format!("t{t}"))
        } else {
            dir.to_path_buf()
        }
    };
    if own_dirs {
        for t in 0..threads {
            std::fs::create_dir(sub(t))?;
        }
    }
    let made = std::sync::Mutex::new(Vec::new());
    let result = together(threads, |t| {
        let deadline = std::time::Instant::now() + s.row;
        let mut mine = Vec::new();
        let mut i = t;
        let mut outcome = Ok(());
        let here = sub(t);
        while i < s.max_creates && std::time::Instant::now() < deadline {
            let p = sys::cpath(&here.join(format!("c{i}")));
            outcome = sys::open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644).and_then(sys::close);
            if outcome.is_err() {
                break;
            }
            mine.push(p);
            i += threads;
        }
        let n = mine.len() as u64;
        // Kept even on failure, so that the files are removed below.
        made.lock().unpoison().extend(mine);
        outcome.map(|()| n)
    });
    let cleanup = || -> io::Result<()> {
        for p in made.into_inner().unpoison() {
            sys::unlink(&p)?;
        }
        if own_dirs {
            for t in 0..threads {
                std::fs::remove_dir(sub(t))?;
            }
        }
        std::fs::remove_dir(dir)
    };
    let cleaned = cleanup();
    // The workload's own error first: after a failed create the directory
    // may hold a file nobody recorded (the daemon made it, then the call
    // failed), and the removal's ENOTEMPTY would hide why.
    let (n, elapsed) = result?;
    cleaned.map_err(|e| io::Error::new(e.kind(), format!("{op}: removing the files: {e}")))?;
    if n == 0 {
        return Err(io::Error::other(format!("{op}: no file created")));
    }
    Ok(Figure::rate(op, "ops/s", n as f64 / elapsed.as_secs_f64(), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_go_from_one_to_twice_the_cores() {
        assert_eq!(thread_counts(1), [1, 2]);
        assert_eq!(thread_counts(2), [1, 2, 4]);
        assert_eq!(thread_counts(3), [1, 2, 3, 4, 6]);
        assert_eq!(thread_counts(16), [1, 2, 4, 8, 16, 32]);
        assert_eq!(thread_counts(0), [1, 2]);
    }

    #[test]
    fn chosen_counts_are_read_sorted_and_survive_the_worker_argument() {
        let v = parse_thread_counts("32,8,16,8").unwrap();
        assert_eq!(v, [8, 16, 32]);
        assert_eq!(parse_thread_counts(&format_thread_counts(&v)).unwrap(), v);
        for bad in ["", "0", "4,x", "-1"] {
            assert!(parse_thread_counts(bad).is_err(), "{bad:?}");
        }
    }
}
