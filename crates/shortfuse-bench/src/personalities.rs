//! The filebench personalities (fileserver, webserver, varmail) as
//! `notes/workloads.md` defines them: our own code, each thread looping over
//! its flow, every step timed.
//!
//! Each thread owns the files whose number is its index modulo the thread
//! count, so "create picks a file that does not exist yet" and "open picks
//! one that does" hold without locks between threads.

use shortfuse::sync::Unpoison;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::report::Figure;
use crate::samples::{Rng, Samples};
use crate::scale::Scale;
use crate::{io as wio, sys};

const IO_SIZE: usize = 1 << 20;
const APPEND: u64 = 16 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Fileserver,
    Webserver,
    Varmail,
}

/// One personality, scaled.
#[derive(Clone, Copy, Debug)]
pub struct Persona {
    pub kind: Kind,
    pub files: usize,
    /// Files per directory; 0 puts them all in one directory.
    pub width: usize,
    pub mean_size: f64,
    pub prealloc: f64,
    pub threads: usize,
}

impl Persona {
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Fileserver => "fileserver",
            Kind::Webserver => "webserver",
            Kind::Varmail => "varmail",
        }
    }

    /// The three personalities at `scale`: files cut from 10,000/1,000 and
    /// threads from 50/100/16 (2 cores here instead of the papers' dozens).
    pub fn all(scale: Scale) -> [Persona; 3] {
        [
            Persona {
                kind: Kind::Fileserver,
                files: scale.pick(64, 200, 10_000),
                width: 20,
                mean_size: 128.0 * 1024.0,
                prealloc: 0.8,
                threads: scale.pick(2, 8, 8),
            },
            Persona {
                kind: Kind::Webserver,
                files: scale.pick(64, 100, 1000),
                width: 20,
                mean_size: 16.0 * 1024.0,
                prealloc: 1.0,
                threads: scale.pick(2, 16, 16),
            },
            Persona {
                kind: Kind::Varmail,
                files: scale.pick(64, 100, 1000),
                width: 0,
                mean_size: 16.0 * 1024.0,
                prealloc: 0.8,
                threads: scale.pick(2, 4, 4),
            },
        ]
    }

    pub fn describe(scale: Scale, duration: Duration) -> String {
        let p = Persona::all(scale);
        format!(
            "fileserver {} files x {} threads, webserver {} files x {} threads, varmail {} files x {} threads, {:.2} s each (the papers: 10,000/1,000/1,000 files, 50/100/16 threads)",
            p[0].files,
            p[0].threads,
            p[1].files,
            p[1].threads,
            p[2].files,
            p[2].threads,
            duration.as_secs_f64()
        )
    }
}

/// What one run of a personality measured.
pub struct Outcome {
    /// Flow steps per second over all threads.
    pub ops: Figure,
    /// Per-step latency, in flow order.
    pub steps: Vec<Figure>,
}

struct Owned {
    exist: Vec<PathBuf>,
    missing: Vec<PathBuf>,
}

impl Owned {
    fn take_missing(&mut self, rng: &mut Rng) -> Option<PathBuf> {
        let n = self.missing.len();
        (n > 0).then(|| self.missing.swap_remove(rng.below(n as u64) as usize))
    }
    fn take_existing(&mut self, rng: &mut Rng) -> Option<PathBuf> {
        let n = self.exist.len();
        (n > 0).then(|| self.exist.swap_remove(rng.below(n as u64) as usize))
    }
    fn peek_existing(&self, rng: &mut Rng) -> Option<&PathBuf> {
        let n = self.exist.len();
        (n > 0).then(|| &self.exist[rng.below(n as u64) as usize])
    }
}

struct Steps {
    order: Vec<&'static str>,
    samples: BTreeMap<&'static str, Samples>,
}

impl Steps {
    fn new() -> Steps {
        Steps {
            order: Vec::new(),
            samples: BTreeMap::new(),
        }
    }
    fn time<T>(&mut self, step: &'static str, op: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        if !self.samples.contains_key(step) {
            self.order.push(step);
        }
        self.samples.entry(step).or_default().time(op)
    }
}

fn read_whole(fd: i32, buf: &mut [u8]) -> io::Result<u64> {
    let mut total = 0u64;
    loop {
        let n = sys::pread(fd, buf, total)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

fn write_whole(fd: i32, buf: &[u8], size: u64) -> io::Result<()> {
    let mut off = 0;
    while off < size {
        let n = (size - off).min(buf.len() as u64) as usize;
        sys::pwrite(fd, &buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

fn append(fd: i32, buf: &[u8], rng: &mut Rng) -> io::Result<()> {
    let n = 1 + rng.below(APPEND) as usize;
    sys::write(fd, &buf[..n]).map(|_| ())
}

fn open(p: &Path, flags: i32) -> io::Result<i32> {
    sys::open(&sys::cpath(p), flags, 0o644)
}

/// Lays out the personality's files under `dir` and runs it for `duration`.
pub fn run(dir: &Path, p: Persona, duration: Duration) -> io::Result<Outcome> {
    let root = dir.join(p.name());
    std::fs::create_dir_all(&root)?;
    let mut rng = Rng::new(42);
    let path = |i: usize| match i.checked_div(p.width) {
        None => root.join(format!("f{i}")),
        Some(d) => root.join(format!("d{d}")).join(format!("f{i}")),
    };
    let mut owned: Vec<Owned> = (0..p.threads)
        .map(|_| Owned {
            exist: Vec::new(),
            missing: Vec::new(),
        })
        .collect();
    let block = vec![0x77u8; IO_SIZE];
    let per_thread = p.files / p.threads;
    if per_thread < 2 {
        return Err(io::Error::other(format!(
            "{}: {} files for {} threads; each thread needs at least 2",
            p.name(),
            p.files,
            p.threads
        )));
    }
    // An exact share per thread (not a coin flip per file) so that every
    // thread has both a file to create and one to open.
    let existing = ((per_thread as f64 * p.prealloc).round() as usize)
        .clamp(1, if p.prealloc < 1.0 { per_thread - 1 } else { per_thread });
    for i in 0..per_thread * p.threads {
        let f = path(i);
        if let Some(d) = f.parent() {
            std::fs::create_dir_all(d)?;
        }
        let o = &mut owned[i % p.threads];
        if i / p.threads < existing {
            let size = size_of(&mut rng, p.mean_size);
            let fd = open(&f, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC)?;
            write_whole(fd, &block, size)?;
            sys::close(fd)?;
            o.exist.push(f);
        } else {
            o.missing.push(f);
        }
    }
    let log = root.join("log");
    std::fs::write(&log, b"")?;
    let owned: Vec<std::sync::Mutex<Owned>> = owned.into_iter().map(std::sync::Mutex::new).collect();
    let steps: Vec<std::sync::Mutex<Steps>> = (0..p.threads).map(|_| std::sync::Mutex::new(Steps::new())).collect();
    let (_, elapsed) = wio::together(p.threads, |t| {
        let mut own = owned[t].lock().unpoison();
        let mut st = steps[t].lock().unpoison();
        let mut rng = Rng::new(1000 + t as u64);
        let mut buf = vec![0u8; IO_SIZE];
        let wbuf = vec![0x42u8; IO_SIZE];
        let logfd = open(&log, libc::O_WRONLY | libc::O_APPEND)?;
        let deadline = Instant::now() + duration;
        let mut result = Ok(());
        while Instant::now() < deadline {
            result = match p.kind {
                Kind::Fileserver => fileserver(&mut own, &mut st, &mut rng, &mut buf, &wbuf, p.mean_size),
                Kind::Webserver => webserver(&own, &mut st, &mut rng, &mut buf, &wbuf, logfd),
                Kind::Varmail => varmail(&mut own, &mut st, &mut rng, &mut buf, &wbuf),
            };
            if result.is_err() {
                break;
            }
        }
        sys::close(logfd)?;
        result.map(|_| 0)
    })?;
    let mut order: Vec<&'static str> = Vec::new();
    let mut merged: BTreeMap<&'static str, Samples> = BTreeMap::new();
    for s in steps {
        let s = s.into_inner().unpoison();
        for name in &s.order {
            if !order.contains(name) {
                order.push(name);
            }
        }
        for (k, v) in s.samples {
            merged.entry(k).or_default().extend(v);
        }
    }
    let total: u64 = merged.values().map(|s| s.len() as u64).sum();
    let _ = std::fs::remove_dir_all(&root);
    if total == 0 {
        return Err(io::Error::other(format!("{}: no flow step finished", p.name())));
    }
    let name = p.name();
    let steps = order
        .into_iter()
        .filter_map(|k| merged.remove(k).map(|s| s.figure(&format!("{name}:{k}"))))
        .collect();
    Ok(Outcome {
        ops: Figure::rate(
            format!("{name}-ops"),
            "ops/s",
            total as f64 / elapsed.as_secs_f64(),
            total,
        ),
        steps,
    })
}

fn size_of(rng: &mut Rng, mean: f64) -> u64 {
    // Capped so one unlucky draw cannot dominate a short run.
    (rng.gamma(mean, 1.5) as u64).clamp(1, (mean * 16.0) as u64)
}

fn missing_file() -> io::Error {
    io::Error::other("personality ran out of files: too few files per thread")
}

fn fileserver(
    own: &mut Owned,
    st: &mut Steps,
    rng: &mut Rng,
    buf: &mut [u8],
    wbuf: &[u8],
    mean: f64,
) -> io::Result<()> {
    let f = own.take_missing(rng).ok_or_else(missing_file)?;
    let fd = st.time("createfile1", || {
        open(&f, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY)
    })?;
    let size = size_of(rng, mean);
    st.time("wrtfile1", || write_whole(fd, wbuf, size))?;
    st.time("closefile1", || sys::close(fd))?;
    own.exist.push(f);
    let f = own.peek_existing(rng).ok_or_else(missing_file)?.clone();
    let fd = st.time("openfile1", || open(&f, libc::O_WRONLY | libc::O_APPEND))?;
    st.time("appendfilerand1", || append(fd, wbuf, rng))?;
    st.time("closefile2", || sys::close(fd))?;
    let f = own.peek_existing(rng).ok_or_else(missing_file)?.clone();
    let fd = st.time("openfile2", || open(&f, libc::O_RDONLY))?;
    st.time("readfile1", || read_whole(fd, buf))?;
    st.time("closefile3", || sys::close(fd))?;
    let f = own.take_existing(rng).ok_or_else(missing_file)?;
    st.time("deletefile1", || sys::unlink(&sys::cpath(&f)))?;
    own.missing.push(f);
    let f = own.peek_existing(rng).ok_or_else(missing_file)?.clone();
    st.time("statfile1", || sys::stat(&sys::cpath(&f)))?;
    Ok(())
}

fn webserver(own: &Owned, st: &mut Steps, rng: &mut Rng, buf: &mut [u8], wbuf: &[u8], logfd: i32) -> io::Result<()> {
    for _ in 0..10 {
        let f = own.peek_existing(rng).ok_or_else(missing_file)?;
        let fd = st.time("openfile", || open(f, libc::O_RDONLY))?;
        st.time("readfile", || read_whole(fd, buf))?;
        st.time("closefile", || sys::close(fd))?;
    }
    st.time("appendlog", || append(logfd, wbuf, rng))
}

fn varmail(own: &mut Owned, st: &mut Steps, rng: &mut Rng, buf: &mut [u8], wbuf: &[u8]) -> io::Result<()> {
    let f = own.take_existing(rng).ok_or_else(missing_file)?;
    st.time("deletefile1", || sys::unlink(&sys::cpath(&f)))?;
    own.missing.push(f);
    let f = own.take_missing(rng).ok_or_else(missing_file)?;
    let fd = st.time("createfile2", || {
        open(&f, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_APPEND)
    })?;
    st.time("appendfilerand2", || append(fd, wbuf, rng))?;
    st.time("fsyncfile2", || sys::fsync(fd))?;
    st.time("closefile2", || sys::close(fd))?;
    own.exist.push(f);
    let f = own.peek_existing(rng).ok_or_else(missing_file)?.clone();
    let fd = st.time("openfile3", || open(&f, libc::O_RDWR | libc::O_APPEND))?;
    st.time("readfile3", || read_whole(fd, buf))?;
    st.time("appendfilerand3", || append(fd, wbuf, rng))?;
    st.time("fsyncfile3", || sys::fsync(fd))?;
    st.time("closefile3", || sys::close(fd))?;
    let f = own.peek_existing(rng).ok_or_else(missing_file)?.clone();
    let fd = st.time("openfile4", || open(&f, libc::O_RDONLY))?;
    st.time("readfile4", || read_whole(fd, buf))?;
    st.time("closefile4", || sys::close(fd))?;
    Ok(())
}

/// The `personalities` suite: ops/s and per-step latency of each flow.
pub fn suite(dir: &Path, scale: Scale, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let duration = duration(scale);
    let mut out = Vec::new();
    for p in Persona::all(scale) {
        progress(p.name());
        let o = run(dir, p, duration)?;
        out.push(o.ops);
        out.extend(o.steps);
    }
    Ok(out)
}

pub fn duration(scale: Scale) -> Duration {
    scale.pick(
        Duration::from_millis(200),
        Duration::from_millis(300),
        Duration::from_secs(30),
    )
}
