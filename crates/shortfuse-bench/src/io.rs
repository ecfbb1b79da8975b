//! Data and small-file workloads shared by `workloads` and `data`: threads
//! that start together, run until their share is done or the time is up, and
//! report throughput.

use shortfuse::sync::Unpoison;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::report::Figure;
use crate::samples::Rng;
use crate::sys;

/// Runs `work(thread)` on `threads` threads released together; returns the
/// sum of what they report and the wall time from release to the last end.
pub fn together<F>(threads: usize, work: F) -> io::Result<(u64, Duration)>
where
    F: Fn(usize) -> io::Result<u64> + Sync,
{
    let barrier = Barrier::new(threads);
    let results: Vec<io::Result<(u64, Instant, Instant)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let n = work(t)?;
                    Ok((n, start, Instant::now()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("worker thread panicked")))
            })
            .collect()
    });
    let mut total = 0;
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for r in results {
        let (n, a, b) = r?;
        total += n;
        first = Some(first.map_or(a, |f| f.min(a)));
        last = Some(last.map_or(b, |l| l.max(b)));
    }
    let elapsed = match (first, last) {
        (Some(a), Some(b)) => b - a,
        _ => Duration::ZERO,
    };
    Ok((total, elapsed))
}

/// Writes a file of `size` bytes in 1 MiB blocks.
pub fn prealloc(path: &Path, size: u64) -> io::Result<()> {
    let fd = sys::open(&sys::cpath(path), libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o644)?;
    let block = vec![0xa5u8; 1 << 20];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(block.len() as u64) as usize;
        sys::pwrite(fd, &block[..n], off)?;
        off += n as u64;
    }
    sys::fsync(fd)?;
    sys::close(fd)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    SeqRead,
    RandRead,
    SeqWrite,
    RandWrite,
}

/// One data row: `threads` threads doing `bs`-byte I/O with `pattern`. With
/// one file and several threads, sequential threads each take a slice of it
/// and random threads spread over all of it; with one file per thread each
/// thread has its own. Sequential writes create the files; the others need
/// them preallocated to `file_size`.
pub struct IoRow<'a> {
    pub pattern: Pattern,
    pub bs: usize,
    pub threads: usize,
    pub files: &'a [PathBuf],
    pub file_size: u64,
    pub duration: Duration,
    /// Extra open flags (O_DIRECT).
    pub flags: i32,
}

impl IoRow<'_> {
    /// Throughput in MB/s (writes include the final fsync).
    pub fn run(&self, op: &str) -> io::Result<Figure> {
        let shared = self.files.len() == 1 && self.threads > 1;
        let (bytes, elapsed) = together(self.threads, |t| {
            let path = sys::cpath(&self.files[t % self.files.len()]);
            let (lo, hi) = if shared && matches!(self.pattern, Pattern::SeqRead | Pattern::SeqWrite) {
                let share = self.file_size / self.threads as u64;
                (share * t as u64, share * (t as u64 + 1))
            } else {
                (0, self.file_size)
            };
            let flags = match self.pattern {
                Pattern::SeqRead | Pattern::RandRead => libc::O_RDONLY,
                Pattern::SeqWrite if !shared => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                Pattern::SeqWrite => libc::O_WRONLY | libc::O_CREAT,
                Pattern::RandWrite => libc::O_WRONLY,
            };
            let fd = sys::open(&path, flags | self.flags, 0o644)?;
            // Aligned, as O_DIRECT asks of user memory.
            let mut aligned = sys::Aligned::new(self.bs);
            let buf = aligned.as_mut();
            buf.fill(0x3c);
            let slots = ((hi - lo) / self.bs as u64).max(1);
            let mut rng = Rng::new(t as u64 + 1);
            let deadline = Instant::now() + self.duration;
            let mut done = 0u64;
            let mut i = 0u64;
            while i < slots && Instant::now() < deadline {
                let off = match self.pattern {
                    Pattern::SeqRead | Pattern::SeqWrite => lo + i * self.bs as u64,
                    Pattern::RandRead | Pattern::RandWrite => lo + rng.below(slots) * self.bs as u64,
                };
                let n = match self.pattern {
                    Pattern::SeqRead | Pattern::RandRead => sys::pread(fd, buf, off)?,
                    Pattern::SeqWrite | Pattern::RandWrite => sys::pwrite(fd, buf, off)?,
                };
                if n == 0 {
                    break;
                }
                done += n as u64;
                i += 1;
            }
            if matches!(self.pattern, Pattern::SeqWrite | Pattern::RandWrite) {
                sys::fsync(fd)?;
            }
            sys::close(fd)?;
            Ok(done)
        })?;
        if bytes == 0 {
            return Err(io::Error::other(format!("{op}: no data moved")));
        }
        Ok(Figure::rate(
            op,
            "MB/s",
            bytes as f64 / elapsed.as_secs_f64() / 1e6,
            bytes / self.bs as u64,
        ))
    }
}

/// Small files spread over directories of `width` entries, split among
/// threads: thread `t` owns every file whose number is `t` modulo the
/// thread count.
pub struct SmallFiles {
    pub root: PathBuf,
    pub width: usize,
    pub threads: usize,
    /// Files each thread created, in order.
    pub made: Vec<Vec<PathBuf>>,
}

impl SmallFiles {
    pub fn new(root: PathBuf, width: usize, threads: usize) -> SmallFiles {
        SmallFiles {
            root,
            width,
            threads,
            made: vec![Vec::new(); threads],
        }
    }

    fn path(&self, i: usize) -> PathBuf {
        self.root.join(format!("d{}", i / self.width)).join(format!("f{i}"))
    }

    /// files-cr: create + write 4 KiB + close, up to `max` files or `duration`.
    pub fn create(&mut self, op: &str, max: usize, duration: Duration) -> io::Result<Figure> {
        for d in 0..max.div_ceil(self.width) {
            std::fs::create_dir_all(self.root.join(format!("d{d}")))?;
        }
        let threads = self.threads;
        let made: Vec<std::sync::Mutex<Vec<PathBuf>>> = (0..threads).map(|_| Default::default()).collect();
        let (n, elapsed) = together(threads, |t| {
            let page = vec![0x11u8; 4096];
            let deadline = Instant::now() + duration;
            let mut mine = Vec::new();
            let mut i = t;
            while i < max && Instant::now() < deadline {
                let p = self.path(i);
                let fd = sys::open(&sys::cpath(&p), libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644)?;
                sys::pwrite(fd, &page, 0)?;
                sys::close(fd)?;
                mine.push(p);
                i += threads;
            }
            let n = mine.len() as u64;
            *made[t].lock().unpoison() = mine;
            Ok(n)
        })?;
        self.made = made.into_iter().map(|m| m.into_inner().unpoison()).collect();
        ops_figure(op, n, elapsed)
    }

    /// files-rd: open + read whole + close over the created files.
    pub fn read(&self, op: &str, duration: Duration) -> io::Result<Figure> {
        let (n, elapsed) = together(self.threads, |t| {
            let mut buf = vec![0u8; 8192];
            let deadline = Instant::now() + duration;
            let mut n = 0;
            for p in &self.made[t] {
                if Instant::now() >= deadline {
                    break;
                }
                let fd = sys::open(&sys::cpath(p), libc::O_RDONLY, 0)?;
                let got = sys::read(fd, &mut buf)?;
                sys::close(fd)?;
                if got != 4096 {
                    return Err(io::Error::other(format!("{}: read {got} bytes of 4096", p.display())));
                }
                n += 1;
            }
            Ok(n)
        })?;
        ops_figure(op, n, elapsed)
    }

    /// files-del: unlink every created file (not time-capped, so nothing is
    /// left behind).
    pub fn delete(&mut self, op: &str) -> io::Result<Figure> {
        let (n, elapsed) = together(self.threads, |t| {
            for p in &self.made[t] {
                sys::unlink(&sys::cpath(p))?;
            }
            Ok(self.made[t].len() as u64)
        })?;
        self.made.iter_mut().for_each(Vec::clear);
        ops_figure(op, n, elapsed)
    }
}

fn ops_figure(op: &str, n: u64, elapsed: Duration) -> io::Result<Figure> {
    if n == 0 {
        return Err(io::Error::other(format!("{op}: no operation finished")));
    }
    Ok(Figure::rate(op, "ops/s", n as f64 / elapsed.as_secs_f64(), n))
}
