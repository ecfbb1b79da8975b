//! The `data` suite: DeFUSE's rows (IEEE Access 2019). A single stream of 1 MiB
//! writes then reads over a big file; the data-centric rows (sequential and
//! random read and write, on 1 and 2 threads, with 4 KiB, 32 KiB, 128 KiB
//! and 1 MiB I/O); and fileserver with 1 to 8 threads (the cost of small
//! files). By default it runs on native, `dev` (passthrough without maps)
//! and kernel passthrough on `dev` and `uring`, and the report puts every
//! row against native and against `dev`.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::io::Pattern;
use crate::personalities::{self, Persona};
use crate::report::Figure;
use crate::scale::Scale;
use crate::sys;
use crate::workloads;

/// DeFUSE's four I/O sizes.
pub const IOS: &[(usize, &str)] = &[(4 << 10, "4K"), (32 << 10, "32K"), (128 << 10, "128K"), (1 << 20, "1M")];
/// DeFUSE's "single thread" and "multiple thread" modes (32 threads there),
/// scaled to this 2-core machine.
pub const THREADS: usize = 2;
/// DeFUSE's data-centric rows, with N = [`THREADS`]: (pattern, threads,
/// one file per thread, name).
pub const ROWS: &[(Pattern, usize, bool, &str)] = &[
    (Pattern::SeqRead, 1, false, "seq-rd-1th-1f"),
    (Pattern::SeqRead, THREADS, true, "seq-rd-2th-2f"),
    (Pattern::RandRead, 1, false, "rnd-rd-1th-1f"),
    (Pattern::RandRead, THREADS, false, "rnd-rd-2th-1f"),
    (Pattern::SeqWrite, 1, false, "seq-wr-1th-1f"),
    (Pattern::SeqWrite, THREADS, true, "seq-wr-2th-2f"),
    (Pattern::RandWrite, 1, false, "rnd-wr-1th-1f"),
    (Pattern::RandWrite, THREADS, false, "rnd-wr-2th-1f"),
];
pub const FILESERVER_THREADS: &[usize] = &[1, 2, 4, 8];

fn stream_size(scale: Scale) -> u64 {
    scale.pick(16 << 20, 32 << 20, 8 << 30)
}

fn fileserver_time(scale: Scale) -> Duration {
    scale.pick(
        Duration::from_millis(100),
        Duration::from_millis(150),
        Duration::from_secs(20),
    )
}

pub fn describe(scale: Scale) -> String {
    let t = workloads::Sizes::of(scale);
    format!(
        "Scale {}: single stream over a {} MiB file (paper: 60 GiB), read after dropping caches; DeFUSE's data rows with 1 and {THREADS} threads (paper: 32) on one {} MiB file or {THREADS} files of half that (paper: 60 GiB / 32 x 2 GiB), {:.2} s each or until the files are covered, reads after dropping caches; fileserver with {:?} threads, {:.2} s each. Values in MB/s and ops/s.",
        scale.name(),
        stream_size(scale) >> 20,
        t.file >> 20,
        t.row.as_secs_f64(),
        FILESERVER_THREADS,
        fileserver_time(scale).as_secs_f64()
    )
}

/// Writes `size` bytes with 1 MiB calls (and fsync), drops caches, reads
/// them back with 1 MiB calls.
fn stream(dir: &Path, size: u64) -> io::Result<Vec<Figure>> {
    let path = sys::cpath(&dir.join("stream"));
    let block = vec![0x99u8; 1 << 20];
    let t = Instant::now();
    let fd = sys::open(&path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o644)?;
    let mut off = 0;
    while off < size {
        off += sys::write(fd, &block)? as u64;
    }
    sys::fsync(fd)?;
    sys::close(fd)?;
    let write = off as f64 / t.elapsed().as_secs_f64() / 1e6;
    sys::drop_caches()?;
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let fd = sys::open(&path, libc::O_RDONLY, 0)?;
    let mut got = 0u64;
    loop {
        let n = sys::read(fd, &mut buf)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    sys::close(fd)?;
    let read = got as f64 / t.elapsed().as_secs_f64() / 1e6;
    sys::unlink(&path)?;
    if got != off {
        return Err(io::Error::other(format!("stream read {got} bytes of {off}")));
    }
    let calls = size >> 20;
    Ok(vec![
        Figure::rate("stream-write-1M", "MB/s", write, calls),
        Figure::rate("stream-read-1M", "MB/s", read, calls),
    ])
}

pub fn run(dir: &Path, scale: Scale, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    progress("single stream");
    let mut out = stream(dir, stream_size(scale))?;
    out.extend(workloads::data_rows(
        dir,
        &workloads::Sizes::of(scale),
        ROWS,
        IOS,
        progress,
    )?);
    let base = Persona::all(scale)[0];
    for &threads in FILESERVER_THREADS {
        progress(&format!("fileserver {threads} threads"));
        let p = Persona {
            threads,
            files: base.files.max(threads * 8),
            ..base
        };
        let o = personalities::run(dir, p, fileserver_time(scale))?;
        let mut f = o.ops.at("fileserver", threads);
        f.op = format!("fileserver-{threads}th");
        out.push(f);
    }
    Ok(out)
}
