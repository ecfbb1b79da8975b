//! Namespace maps: DeFUSE's data map (IEEE Access 2019) applied to names.
//!
//! As `open` may return a [`crate::DataMap`] so that reads and writes skip
//! the file system, a file system may declare that its whole tree is a
//! 1-to-1 image of a backing directory ([`crate::Filesystem::namespace_map`]).
//! Transports that run next to the caller (the preload shim in process, and
//! over the rings for clients of the daemon's own user) then send path
//! calls beneath the mount (stat, access, readlink, ...) straight to the
//! kernel, beneath the backing directory (`openat2` with `RESOLVE_BENEATH`,
//! `*at` calls on a held directory descriptor), with the caller's own
//! credentials, so that the kernel checks every permission. They present
//! the mount's device number and the attributes the kernel reports
//! ([`Attr::from_stat`]), which is why declaring a map promises that the
//! file system would report exactly those. Whatever the kernel cannot
//! decide beneath the directory (a symbolic link that leads out of it, a
//! `..` above it) still goes to the file system.
//!
//! A file system that must see every operation (to log, to check, to keep
//! a journal, to cache data that is not yet in the backing directory) does
//! not declare one; that is the default.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::types::{Attr, Timestamp};

/// The backing directory a file system's tree is a 1-to-1 image of.
#[derive(Clone, Debug)]
pub struct NamespaceMap {
    /// A descriptor of the backing directory (`O_PATH` is enough), the
    /// mount's root.
    pub root: Arc<OwnedFd>,
    /// Mount points below the backing directory are not part of the image
    /// (`RESOLVE_NO_XDEV`): a path that crosses one goes to the file system.
    pub no_xdev: bool,
}

impl Attr {
    /// The attributes of a `stat` as a 1-to-1 file system reports them:
    /// every field unchanged (`st_ino` included), the device number of a
    /// device file in the kernel's 32-bit encoding.
    pub fn from_stat(st: &libc::stat) -> Attr {
        let major = libc::major(st.st_rdev);
        let minor = libc::minor(st.st_rdev);
        let ts = |sec: i64, nsec: i64| Timestamp { sec, nsec: nsec as u32 };
        Attr {
            ino: st.st_ino,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: ts(st.st_atime, st.st_atime_nsec),
            mtime: ts(st.st_mtime, st.st_mtime_nsec),
            ctime: ts(st.st_ctime, st.st_ctime_nsec),
            mode: st.st_mode,
            nlink: st.st_nlink.min(u32::MAX as u64) as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            // The kernel decodes this with new_decode_dev().
            rdev: (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12),
            blksize: st.st_blksize as u32,
        }
    }

    /// [`Attr::from_stat`] for what `statx` reports (its basic fields).
    pub fn from_statx(st: &libc::statx) -> Attr {
        let (major, minor) = (st.stx_rdev_major, st.stx_rdev_minor);
        let ts = |t: libc::statx_timestamp| Timestamp {
            sec: t.tv_sec,
            nsec: t.tv_nsec,
        };
        Attr {
            ino: st.stx_ino,
            size: st.stx_size,
            blocks: st.stx_blocks,
            atime: ts(st.stx_atime),
            mtime: ts(st.stx_mtime),
            ctime: ts(st.stx_ctime),
            mode: u32::from(st.stx_mode),
            nlink: st.stx_nlink,
            uid: st.stx_uid,
            gid: st.stx_gid,
            rdev: (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12),
            blksize: st.stx_blksize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    #[test]
    fn stat_and_statx_give_one_attr() {
        for path in ["/proc/self/exe", "/dev/null", "/tmp"] {
            let c = CString::new(path).unwrap();
            // SAFETY: zeroed plain C structs, filled by the kernel.
            let (mut st, mut stx): (libc::stat, libc::statx) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
            // SAFETY: valid path and out pointers.
            assert_eq!(unsafe { libc::stat(c.as_ptr(), &mut st) }, 0);
            // SAFETY: as above.
            let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_BASIC_STATS, &mut stx) };
            assert_eq!(r, 0);
            let (a, b) = (Attr::from_stat(&st), Attr::from_statx(&stx));
            // atime may move between the two calls; the rest may not.
            assert_eq!(Attr { atime: b.atime, ..a }, b, "{path}");
            assert_eq!(a.ino, st.st_ino);
        }
        // A device number survives the 32-bit encoding (/dev/null is 1:3).
        // SAFETY: a zeroed plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let c = CString::new("/dev/null").unwrap();
        // SAFETY: valid path and out pointer.
        assert_eq!(unsafe { libc::stat(c.as_ptr(), &mut st) }, 0);
        assert_eq!(u64::from(Attr::from_stat(&st).rdev), st.st_rdev);
    }
}
