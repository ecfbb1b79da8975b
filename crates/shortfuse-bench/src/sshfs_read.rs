//! The `sshfs-read` suite: the read test of the Prefuse-SSHFS caching thesis. 100 reads of 1 MiB over a big
//! file, each starting 1024 bytes further than the last, timed as one run
//! (open, the reads, close: a fresh open is where sshfs drops its cached
//! pages); runs repeated, through the page cache and with O_DIRECT. Its
//! defaults are the thesis's comparison: kernel-FUSE sshfs against our own
//! SFTP client (`sftp`) on a loopback server, with native and `dev`.
//! `pread` stands for the thesis's read-at-offset: the kernel sends the same
//! FUSE READs for both.

use std::io;
use std::path::Path;
use std::time::Instant;

use crate::io::prealloc;
use crate::report::Figure;
use crate::samples::Samples;
use crate::scale::Scale;
use crate::sys;

const READS: u64 = 100;
const STEP: u64 = 1024;
const SIZE: usize = 1 << 20;
/// Longer than the window in which a cache distrusts a whole-second mtime
/// (`shortfuse::cache::seen`).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(2100);

fn file_size(scale: Scale) -> u64 {
    scale.pick(8 << 20, 16 << 20, 1 << 30)
}

fn repeats(scale: Scale) -> usize {
    scale.pick(3, 5, 100)
}

pub fn describe(scale: Scale) -> String {
    format!(
        "Scale {}: the read test of the Prefuse-SSHFS caching thesis: a {} MiB file (thesis: 1 GiB), runs of {READS} reads of 1 MiB moving {STEP} bytes, repeated {} times (thesis: 100); value = mean time of one run in µs. The thesis measured sshfs on localhost at 8513 µs through the page cache and 372620 µs with O_DIRECT.",
        scale.name(),
        file_size(scale) >> 20,
        repeats(scale)
    )
}

fn one_run(path: &std::ffi::CString, flags: i32, buf: &mut [u8]) -> io::Result<()> {
    let fd = sys::open(path, libc::O_RDONLY | flags, 0)?;
    for i in 0..READS {
        let n = sys::pread(fd, buf, i * STEP)?;
        if n != SIZE {
            sys::close(fd)?;
            return Err(io::Error::other(format!("read at {} returned {n} bytes", i * STEP)));
        }
    }
    sys::close(fd)
}

pub fn run(dir: &Path, scale: Scale, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let file = dir.join("sshfs-read");
    progress("laying out");
    prealloc(&file, file_size(scale))?;
    // The thesis reads a file that was on the server before the test. A
    // file written in the last two seconds is one whose next change could
    // keep its size and whole-second mtime (SFTP's), so caches that check
    // at open (close-to-open) read it again at every open until it
    // settles: the test starts once it has.
    progress("letting the file settle");
    std::thread::sleep(SETTLE);
    let path = sys::cpath(&file);
    let mut buf = sys::Aligned::new(SIZE);
    let mut out = Vec::new();
    for (name, flags) in [("100x1MiB-read", 0), ("100x1MiB-read-odirect", libc::O_DIRECT)] {
        progress(name);
        let mut s = Samples::with_capacity(repeats(scale));
        for _ in 0..repeats(scale) {
            let t = Instant::now();
            one_run(&path, flags, buf.as_mut()).map_err(|e| io::Error::new(e.kind(), format!("{name}: {e}")))?;
            s.0.push(t.elapsed().as_nanos() as u64);
        }
        out.push(s.figure(name));
    }
    sys::unlink(&path)?;
    Ok(out)
}
