//! Kernel files a shared daemon lends to its programs: the backing file of
//! an open file, for memory maps.
//!
//! A descriptor of a daemon's file is a placeholder or a sealed memfd
//! standing for the open file description (see `shared`), so the kernel
//! has no pages to map for it. When the daemon's file system has a single
//! backing file for the open (passthrough), or keeps the file's bytes in a
//! kernel file for maps (mem's memfd, `Filesystem::map_file`), the daemon
//! hands its descriptor over the ring's socket and the map is the kernel's map of that file:
//! MAP_SHARED maps of every program of the daemon share the backing file's
//! page cache, and with it the daemon's own reads and writes, so they are
//! coherent as on the host; MAP_PRIVATE maps load lazily and share clean
//! pages, as natively. The descriptor is closed once mapped (the map holds
//! the file).

use std::os::fd::{AsFd, AsRawFd};

use shortfuse::Errno;
use shortfuse_vfs::OpenFile;

use crate::sys::mm;

/// mmap of a daemon's file through the backing file the daemon lends:
/// `None` when there is none to lend (not a daemon's file, no handle, a
/// file system without a single backing file, a cache in the daemon), and
/// the caller falls back to what a placeholder can do.
pub fn mmap(f: &OpenFile, a: [i64; 6]) -> Option<i64> {
    if !f.vfs().client().shared() {
        return None;
    }
    let fh = f.handle()?;
    // What the kernel checks against the program's open (the lent
    // descriptor's own access may be wider).
    let (prot, flags, acc) = (a[2] as i32, a[3] as i32, f.flags() & libc::O_ACCMODE);
    let shared = matches!(flags & libc::MAP_TYPE, libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE);
    let shared_write = shared && prot & libc::PROT_WRITE != 0;
    if acc == libc::O_WRONLY || shared_write && (acc != libc::O_RDWR || f.flags() & libc::O_APPEND != 0) {
        return Some(-i64::from(libc::EACCES));
    }
    let description = f.shared().map(|d| d.as_fd());
    let backing = match f.vfs().client().backing_file(f.node(), fh, description) {
        Ok(b) => b,
        Err(e) if e == Errno::ENODEV => return None,
        Err(e) => return Some(-i64::from(e.raw())),
    };
    // SAFETY: the program's own map request, on the lent descriptor in
    // place of its own: it may replace memory only where the program asked.
    #[allow(unsafe_code)]
    let r = unsafe { mm::mmap(a[0], a[1], a[2], a[3], i64::from(backing.as_raw_fd()), a[5]) };
    drop(backing);
    Some(r)
}
