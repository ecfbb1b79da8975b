//! The `latency` suite: the cost of one operation of each kind, as the
//! foundation issue and `notes/kernel-fuse.md` list them.

use std::io;
use std::path::Path;
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
        // Sized with fio's quick scale for `make demo`'s two minutes.
        Sizes {
            meta_ops: 2_000,
            data_ops: 10_000,
            seq_mib: 64,
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

/// Runs every latency workload in `dir` (which must be empty and writable).
pub fn run(dir: &Path, sizes: Sizes, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
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
    out.push(s.figure("stat"));

    progress("stat (missing)");
    let missing = sys::cpath(&dir.join("missing"));
    let mut s = Samples::with_capacity(sizes.data_ops);
    for _ in 0..sizes.data_ops {
        let r = s.time(|| Ok(sys::stat(&missing)))?;
        if r.is_ok() {
            return Err(io::Error::other("stat of a missing name succeeded"));
        }
    }
    out.push(s.figure("stat-missing"));

    progress("open+close");
    let mut s = Samples::with_capacity(n * 5);
    for _ in 0..n * 5 {
        s.time(|| sys::open(&cfile, libc::O_RDONLY, 0).and_then(sys::close))?;
    }
    out.push(s.figure("open+close"));

    progress("create");
    let names: Vec<_> = (0..n).map(|i| sys::cpath(&dir.join(format!("c{i}")))).collect();
    let mut s = Samples::with_capacity(n);
    for p in &names {
        s.time(|| sys::open(p, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644).and_then(sys::close))?;
    }
    out.push(s.figure("create"));

    progress("unlink");
    let mut s = Samples::with_capacity(n);
    for p in &names {
        s.time(|| sys::unlink(p))?;
    }
    out.push(s.figure("unlink"));

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
    out.push(s.figure("4KiB-pread-cached"));

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
    out.push(s.figure("4KiB-write"));

    progress("sequential read");
    out.push(sequential_read(dir, sizes.seq_mib, &block)?);
    sys::unlink(&cfile)?;
    Ok(out)
}

/// Writes a file of `mib` MiB, reads it once to warm the caches, then times
/// a second whole read with 1 MiB calls.
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
    let (total, secs) = read_all()?;
    sys::unlink(&path)?;
    if total != (mib as u64) << 20 {
        return Err(io::Error::other(format!(
            "sequential read returned {total} bytes, expected {mib} MiB"
        )));
    }
    Ok(Figure {
        op: "seq-read".into(),
        unit: "GB/s".into(),
        value: total as f64 / secs / 1e9,
        p50: None,
        p99: None,
        samples: 1,
        lower_is_better: false,
        ..Figure::default()
    })
}
