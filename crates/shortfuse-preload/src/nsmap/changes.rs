//! The rest of the path calls beneath a namespace map: link, symlink,
//! mknod, truncate, utimensat, chmod, chown and the extended-attribute
//! calls by path, each one `*at` call on the directory holding the name
//! (see [`Place`]), with the program's own credentials, so that the
//! kernel checks every permission as it would natively and the file
//! system hears of none of them.
//!
//! A call that follows a symbolic link at the end goes the usual way when
//! the name is one: the link may lead anywhere, and the walk follows it
//! as the mount would. Otherwise the call is made with
//! `AT_SYMLINK_NOFOLLOW`: should the name become a link in between, the
//! call acts on the link itself, never on what it points to outside the
//! backing directory.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use shortfuse::Errno;
use shortfuse_vfs::Vfs;

use super::{err, mapped, Place};
use crate::calls::nested;
use crate::calls::table::{AtFlags, PathAt, Ptr, XattrOp};
use crate::sys::raw;
use crate::user;

/// The kernel's extended-attribute calls on a name beneath a directory
/// (Linux 6.13); older kernels say ENOSYS and the usual way serves.
const SYS_SETXATTRAT: i64 = 463;
const SYS_GETXATTRAT: i64 = 464;
const SYS_LISTXATTRAT: i64 = 465;
const SYS_REMOVEXATTRAT: i64 = 466;

const NOFOLLOW: i64 = libc::AT_SYMLINK_NOFOLLOW as i64;

/// A name beneath a map, found for one call: the mount, the path below
/// its root, and the place of the name.
struct Found {
    vfs: Arc<Vfs>,
    rel: Vec<u8>,
    place: Place,
}

impl Found {
    /// The name `at` names beneath a map, for a call that changes it
    /// (`writes`: not on a read-only mount, which says EROFS itself) or
    /// reads it. `Err` holds the answer when the kernel decided the walk
    /// (`Some`), or `None` for the usual way.
    fn of(at: PathAt, writes: bool) -> Result<Found, Option<i64>> {
        let (vfs, rel, from, caller) = mapped(at, false, writes, false).ok_or(None)?;
        let ns = vfs.namespace().ok_or(None)?;
        let place = Place::of(ns, &caller, &rel, from)?;
        Ok(Found { vfs, rel, place })
    }

    fn dirfd(&self) -> i64 {
        self.place.dirfd()
    }

    fn name(&self) -> i64 {
        self.place.name()
    }

    /// Whether the name is a symbolic link (a call that follows it is the
    /// walk's). A name the kernel cannot stat is none: the call itself
    /// then says why, as natively.
    fn is_link(&self) -> bool {
        let mut k: libc::stat = user::zeroed();
        // SAFETY: a NUL-terminated name of ours and a stat struct of ours.
        let r = unsafe {
            raw(
                libc::SYS_newfstatat,
                self.dirfd(),
                self.name(),
                &mut k as *mut libc::stat as i64,
                NOFOLLOW,
                0,
                0,
            )
        };
        r == 0 && k.st_mode & libc::S_IFMT == libc::S_IFLNK
    }

    /// `r`, after a call that may have changed the name or its node: what
    /// this image's cache held of it goes, since the file system never
    /// hears of the change.
    fn changed(&self, r: i64) -> Option<i64> {
        self.vfs.drop_cached_path(&self.rel);
        Some(r)
    }
}

/// Runs `f` on the found name, or answers as [`Found::of`] decided.
fn with(at: PathAt, writes: bool, f: impl FnOnce(&Found) -> Option<i64>) -> Option<i64> {
    match Found::of(at, writes) {
        Ok(found) => f(&found),
        Err(r) => r,
    }
}

/// link, linkat of two names beneath one map, or of a descriptor the
/// kernel opened beneath it ([`link_descriptor`]). A link followed at the
/// end is the usual way's.
pub(super) fn link(old: PathAt, new: PathAt, flags: i32) -> Option<i64> {
    if let Some(r) = link_descriptor(old, new, flags) {
        return r;
    }
    if flags & !libc::AT_SYMLINK_FOLLOW != 0 {
        return None;
    }
    let a = Found::of(old, true);
    let b = Found::of(new, true);
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) if Arc::ptr_eq(&a.vfs, &b.vfs) => (a, b),
        // Across the map's boundary (EXDEV) or not beneath a map at all.
        (Ok(_), Ok(_)) | (Err(None), _) | (_, Err(None)) => return None,
        (Err(Some(r)), _) | (_, Err(Some(r))) => return Some(r),
    };
    if flags & libc::AT_SYMLINK_FOLLOW != 0 && a.is_link() {
        return None;
    }
    // SAFETY: two NUL-terminated names of ours; no other memory.
    let r = unsafe { raw(libc::SYS_linkat, a.dirfd(), a.name(), b.dirfd(), b.name(), 0, 0) };
    a.changed(r);
    b.changed(r)
}

/// linkat of a descriptor the kernel opened beneath a map (an O_TMPFILE
/// file, say), named by AT_EMPTY_PATH or by its /proc/self/fd link, to a
/// name beneath the same map: the descriptor is
/// the backing file's own, so the program's call, made on the directory
/// holding the new name, links that file, with the program's credentials
/// (AT_EMPTY_PATH wants CAP_DAC_READ_SEARCH, as natively). `None`: no such
/// call; `Some(None)`: the usual way's.
fn link_descriptor(old: PathAt, new: PathAt, flags: i32) -> Option<Option<i64>> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = unsafe { user::cstr(old.path.0) }.ok()?;
    let fd = if path.is_empty() && flags & libc::AT_EMPTY_PATH != 0 {
        old.dirfd
    } else {
        // (Without AT_SYMLINK_FOLLOW the kernel links the /proc link
        // itself, which it refuses with EXDEV, as natively.)
        crate::calls::magic_link(path)?
    };
    let f = crate::state().fds.get(fd)?;
    if !f.beneath_map() {
        return None;
    }
    let b = match Found::of(new, true) {
        Ok(b) if Arc::ptr_eq(&b.vfs, f.vfs()) => b,
        Ok(_) | Err(None) => return Some(None),
        Err(Some(r)) => return Some(Some(r)),
    };
    // SAFETY: the program's own path argument, handed on as it gave it
    // (the kernel reads it as it would have), and a NUL-terminated name of
    // ours.
    let r = unsafe {
        raw(
            libc::SYS_linkat,
            i64::from(old.dirfd),
            old.path.0,
            b.dirfd(),
            b.name(),
            i64::from(flags),
            0,
        )
    };
    Some(b.changed(r))
}

/// A path call on `/proc/self/fd/N` (or `/dev/fd/N`) where N is a
/// descriptor the kernel opened beneath a map: the kernel's magic link
/// leads to the backing file itself (glibc reaches an O_PATH descriptor's
/// file so: fchmodat with AT_SYMLINK_NOFOLLOW, `mkfifo -m`), so the
/// program's call is the kernel's as it stands, and the file system hears
/// of nothing. The open file, whose path leaves this image's cache after.
fn through_descriptor(at: PathAt) -> Option<Arc<shortfuse_vfs::OpenFile>> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = unsafe { user::cstr(at.path.0) }.ok()?;
    let f = crate::state().fds.get(crate::calls::magic_link(path)?)?;
    f.beneath_map().then_some(f)
}

/// After a call [`through_descriptor`] let the kernel make: what the cache
/// held of the file's name goes.
fn changed_through(f: &shortfuse_vfs::OpenFile, r: i64) -> Option<i64> {
    f.vfs()
        .drop_cached_path(f.path().strip_prefix(b"/").unwrap_or(f.path()));
    Some(r)
}

/// symlink, symlinkat: the target is text, stored as given.
pub(super) fn symlink(target: Ptr, at: PathAt) -> Option<i64> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let target = match unsafe { user::cstr(target.0) } {
        Ok(t) => t.iter().copied().chain([0]).collect::<Vec<u8>>(),
        Err(e) => return Some(err(e)),
    };
    with(at, true, |f| {
        // SAFETY: two NUL-terminated strings of ours; no other memory.
        let r = unsafe {
            raw(
                libc::SYS_symlinkat,
                target.as_ptr() as i64,
                f.dirfd(),
                f.name(),
                0,
                0,
                0,
            )
        };
        f.changed(r)
    })
}

/// mknod, mknodat: FIFOs, sockets, regular files (and devices, where the
/// caller may make them), with the program's umask.
pub(super) fn mknod(at: PathAt, mode: u32, dev: u32) -> Option<i64> {
    with(at, true, |f| {
        // SAFETY: a NUL-terminated name of ours; no other memory.
        let r = unsafe {
            raw(
                libc::SYS_mknodat,
                f.dirfd(),
                f.name(),
                i64::from(mode),
                i64::from(dev),
                0,
                0,
            )
        };
        f.changed(r)
    })
}

/// truncate by path: there is no `truncateat`, so the name is opened
/// `O_PATH` without following it and truncated through that descriptor's
/// own link in /proc, which leads to nothing but the file held.
pub(super) fn truncate(at: PathAt, len: i64) -> Option<i64> {
    // (A negative length is refused before the path is looked at.)
    if len < 0 {
        return None;
    }
    with(at, true, |f| {
        let held = match open_path(f) {
            Ok(fd) => fd,
            Err(e) => return Some(err(e)),
        };
        let mut k: libc::stat = user::zeroed();
        if crate::sys::fs::fstat(held.as_raw_fd(), &mut k) != 0 || k.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return None;
        }
        let proc = format!("/proc/self/fd/{}\0", held.as_raw_fd());
        // SAFETY: a NUL-terminated path of ours; no other memory.
        let r = unsafe { raw(libc::SYS_truncate, proc.as_ptr() as i64, len, 0, 0, 0, 0) };
        // No /proc to go through: the usual way.
        if r == err(Errno::ENOENT) {
            return None;
        }
        f.changed(r)
    })
}

/// The name itself, `O_PATH` and not followed, numbered above the
/// program's descriptors.
fn open_path(f: &Found) -> Result<OwnedFd, Errno> {
    let flags = i64::from(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC);
    // SAFETY: our own openat of a NUL-terminated name of ours.
    let fd = unsafe { nested(libc::SYS_openat, [f.dirfd(), f.name(), flags, 0, 0, 0]) };
    if fd < 0 {
        return Err(Errno::from_raw(-fd as i32));
    }
    Ok(OwnedFd::from(crate::sys::owned_file(fd)))
}

/// utimensat of a path (a null path is the descriptor's, served by the
/// kernel on its own descriptor, see `calls::metadata`).
pub(super) fn utimens(at: PathAt, times: Ptr, flags: AtFlags) -> Option<i64> {
    if at.path.is_null() || flags.0 & !libc::AT_SYMLINK_NOFOLLOW != 0 {
        return None;
    }
    // Read first as the kernel does, and handed on from our memory.
    let times = match crate::calls::utime_times(times) {
        Ok(t) => t,
        Err(r) => return Some(r),
    };
    with(at, true, |f| {
        if flags.follow() && f.is_link() {
            return None;
        }
        let t = times.as_ref().map_or(0, |t| t.as_ptr() as i64);
        // SAFETY: a NUL-terminated name and two timespecs of ours (or none).
        let r = unsafe { raw(libc::SYS_utimensat, f.dirfd(), f.name(), t, NOFOLLOW, 0, 0) };
        f.changed(r)
    })
}

/// chmod, fchmodat, fchmodat2 (whose AT_SYMLINK_NOFOLLOW on a link the
/// kernel refuses itself).
pub(super) fn chmod(at: PathAt, mode: u32, flags: AtFlags) -> Option<i64> {
    if flags.0 & !libc::AT_SYMLINK_NOFOLLOW != 0 {
        return None;
    }
    if let Some(f) = through_descriptor(at) {
        let (dirfd, path, mode) = (i64::from(at.dirfd), at.path.0, i64::from(mode));
        // SAFETY: the program's own path argument, handed on as it gave it.
        let mut r = unsafe { raw(libc::SYS_fchmodat2, dirfd, path, mode, i64::from(flags.0), 0, 0) };
        if r == err(Errno::ENOSYS) && flags.0 == 0 {
            // SAFETY: as above.
            r = unsafe { raw(libc::SYS_fchmodat, dirfd, path, mode, 0, 0, 0) };
        }
        return changed_through(&f, r);
    }
    with(at, true, |f| {
        if flags.follow() && f.is_link() {
            return None;
        }
        // SAFETY: a NUL-terminated name of ours; no other memory.
        let r = unsafe {
            raw(
                libc::SYS_fchmodat2,
                f.dirfd(),
                f.name(),
                i64::from(mode),
                NOFOLLOW,
                0,
                0,
            )
        };
        // A kernel without fchmodat2: the usual way.
        if r == err(Errno::ENOSYS) {
            return None;
        }
        f.changed(r)
    })
}

/// chown, lchown, fchownat.
pub(super) fn chown(at: PathAt, uid: i64, gid: i64, flags: AtFlags) -> Option<i64> {
    if flags.0 & !libc::AT_SYMLINK_NOFOLLOW != 0 {
        return None;
    }
    if let Some(f) = through_descriptor(at) {
        let flags = i64::from(flags.0);
        // SAFETY: the program's own path argument, handed on as it gave it.
        let r = unsafe { raw(libc::SYS_fchownat, i64::from(at.dirfd), at.path.0, uid, gid, flags, 0) };
        return changed_through(&f, r);
    }
    with(at, true, |f| {
        if flags.follow() && f.is_link() {
            return None;
        }
        // SAFETY: a NUL-terminated name of ours; no other memory.
        let r = unsafe { raw(libc::SYS_fchownat, f.dirfd(), f.name(), uid, gid, NOFOLLOW, 0) };
        f.changed(r)
    })
}

/// getxattr, setxattr, listxattr, removexattr by path and their `l`
/// forms. The name, value and list are the program's, handed on (the
/// kernel checks and fills them as it would have).
pub(super) fn xattr(at: PathAt, follow: bool, op: XattrOp) -> Option<i64> {
    // A name or value in page 0: EFAULT, as natively (see `calls::xattr`).
    if let Some(r) = crate::calls::xattr::reads_page_zero(op) {
        return Some(r);
    }
    let writes = matches!(op, XattrOp::Set { .. } | XattrOp::Remove { .. });
    with(at, writes, |f| {
        if follow && f.is_link() {
            return None;
        }
        let (dirfd, name) = (f.dirfd(), f.name());
        let r = match op {
            XattrOp::Get { name: a, value, size } => {
                // struct xattr_args: value, size, flags. A size beyond what
                // fits is clamped, as getxattr clamps it (a negative one
                // is a huge size_t).
                let size = u64::try_from(size).unwrap_or(u64::MAX).min(u64::from(u32::MAX));
                let args: [u64; 2] = [value.0 as u64, size];
                // SAFETY: a NUL-terminated name and an xattr_args of ours,
                // the program's attribute name and buffer handed on.
                unsafe {
                    raw(
                        SYS_GETXATTRAT,
                        dirfd,
                        name,
                        NOFOLLOW,
                        a.0,
                        args.as_ptr() as i64,
                        std::mem::size_of_val(&args) as i64,
                    )
                }
            }
            // SAFETY: a NUL-terminated name of ours, the program's buffer
            // handed on.
            XattrOp::List { list, size } => unsafe { raw(SYS_LISTXATTRAT, dirfd, name, NOFOLLOW, list.0, size, 0) },
            XattrOp::Set {
                name: a,
                value,
                size,
                flags,
            } => {
                let args: [u64; 2] = [
                    value.0 as u64,
                    (size as u64 & 0xffff_ffff) | ((flags as u32 as u64) << 32),
                ];
                // As setxattr: sizes beyond what fits the struct are E2BIG.
                if size > u32::MAX as usize {
                    return Some(err(Errno::E2BIG));
                }
                // SAFETY: as for Get above, the program's value handed on.
                unsafe {
                    raw(
                        SYS_SETXATTRAT,
                        dirfd,
                        name,
                        NOFOLLOW,
                        a.0,
                        args.as_ptr() as i64,
                        std::mem::size_of_val(&args) as i64,
                    )
                }
            }
            // SAFETY: a NUL-terminated name of ours, the program's
            // attribute name handed on.
            XattrOp::Remove { name: a } => unsafe { raw(SYS_REMOVEXATTRAT, dirfd, name, NOFOLLOW, a.0, 0, 0) },
        };
        // A kernel without the `*xattrat` calls: the usual way.
        if r == err(Errno::ENOSYS) {
            return None;
        }
        if writes {
            f.changed(r)
        } else {
            Some(r)
        }
    })
}
