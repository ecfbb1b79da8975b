//! Attributes: stat, statx, statfs and their descriptor forms, and the
//! calls that change mode, owner and times.
#![allow(unsafe_code)] // the program's memory, through `user`

use std::sync::Arc;

use shortfuse::{Attr, Errno, NodeId};
use shortfuse::{SetAttr, SetTime};
use shortfuse_vfs::{Target, Vfs};

use super::kernel;
use super::reply::{done, err};
use super::resolve::{file, lookup_attrs, lookup_follow, ours};
use super::table::{AtFlags, Fd, PathAt, Ptr, Regs};
use crate::user;

/// Which calls take a null path for an empty one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Null {
    /// fstatat and statx (since Linux 6.11).
    Empty,
    /// The others: the kernel reads the path, a null one is EFAULT.
    Fault,
}

/// Whether a `*at` call with `flags` names its descriptor itself
/// (AT_EMPTY_PATH and an empty path, or a null one where `null` says so).
fn empty_path(path: Ptr, flags: AtFlags, null: Null) -> bool {
    flags.has(libc::AT_EMPTY_PATH)
        && if path.is_null() {
            null == Null::Empty
        } else {
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            unsafe { user::cstr(path.0) }.is_ok_and(<[u8]>::is_empty)
        }
}

/// The descriptor's own file for `*at` calls with AT_EMPTY_PATH and an
/// empty path: `Some(None)` when it is not ours.
fn empty_path_file(at: PathAt, flags: AtFlags, null: Null) -> Option<Option<Arc<shortfuse_vfs::OpenFile>>> {
    empty_path(at.path, flags, null).then(|| file(Fd(at.dirfd)))
}

/// `f` when calls that change it go to the file system: `None` for a
/// file the kernel opened beneath a namespace map, whose descriptor is the
/// backing file's own, so that the kernel changes it (with the program's
/// credentials), as it would have through the file system.
pub(super) fn own(f: Arc<shortfuse_vfs::OpenFile>) -> Option<Arc<shortfuse_vfs::OpenFile>> {
    (!f.beneath_map()).then_some(f)
}

/// The open file a descriptor call that changes the file (fchmod, fchown,
/// futimens) acts through: `Err(EBADF)` for an O_PATH descriptor, which
/// the kernel lets name a file for a path call (AT_EMPTY_PATH,
/// `/proc/self/fd/N`) but not act on it. gnulib's lchmod, say, tries
/// fchmod first and counts on EBADF to go through `/proc/self/fd`.
fn acting(f: Arc<shortfuse_vfs::OpenFile>) -> Result<Arc<shortfuse_vfs::OpenFile>, Errno> {
    if f.is_path_only() {
        return Err(Errno::EBADF);
    }
    Ok(f)
}

/// stat, lstat, newfstatat.
pub fn stat(regs: Regs, at: PathAt, out: Ptr, flags: AtFlags) -> Option<i64> {
    if let Some(f) = empty_path_file(at, flags, Null::Empty) {
        let f = f?;
        if f.kernel_backed() {
            return Some(done(
                // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
                kernel::fresh_stat(&f, Fd(at.dirfd)).and_then(|s| unsafe { user::put(out.0, &s) }),
            ));
        }
        return fstat_of(&f, out);
    }
    let (vfs, t) = ours!(lookup_attrs(regs, at, flags.follow()));
    Some(done(
        // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
        vfs.stat(&t)
            .and_then(|a| unsafe { user::put(out.0, &to_stat(&a, vfs.dev())) }),
    ))
}

/// fstat of a placeholder (the kernel-backed ones are `kernel`'s).
pub fn fstat(fd: Fd, out: Ptr) -> Option<i64> {
    fstat_of(&file(fd)?, out)
}

fn fstat_of(f: &Arc<shortfuse_vfs::OpenFile>, out: Ptr) -> Option<i64> {
    Some(done(
        // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
        f.stat()
            .and_then(|a| unsafe { user::put(out.0, &to_stat(&a, f.vfs().dev())) }),
    ))
}

pub fn statx(regs: Regs, at: PathAt, flags: AtFlags, out: Ptr) -> Option<i64> {
    let attr = if let Some(f) = empty_path_file(at, flags, Null::Empty) {
        let f = f?;
        if f.kernel_backed() {
            return Some(done(
                // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
                kernel::fresh_statx(&f, Fd(at.dirfd)).and_then(|s| unsafe { user::put(out.0, &s) }),
            ));
        }
        f.stat().map(|a| (a, f.vfs().dev()))
    } else {
        let (vfs, t) = ours!(lookup_attrs(regs, at, flags.follow()));
        vfs.stat(&t).map(|a| (a, vfs.dev()))
    };
    // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
    Some(done(
        attr.and_then(|(a, dev)| unsafe { user::put(out.0, &to_statx(&a, dev)) }),
    ))
}

/// chmod, fchmodat, fchmodat2.
pub fn chmod(regs: Regs, at: PathAt, mode: u32, flags: AtFlags) -> Option<i64> {
    if let Some(f) = empty_path_file(at, flags, Null::Fault) {
        return Some(done(own(f?)?.setattr(&mode_set(mode))));
    }
    let (vfs, t) = ours!(lookup_follow(regs, at, flags.follow()));
    if !flags.follow()
        && t.node
            .is_some_and(|(_, a)| a.file_type() == shortfuse::FileType::Symlink)
    {
        // As the kernel: a symbolic link's mode cannot change.
        return Some(err(Errno::EOPNOTSUPP));
    }
    Some(set_on(&vfs, &t, &mode_set(mode)))
}

pub fn fchmod(fd: Fd, mode: u32) -> Option<i64> {
    let f = own(file(fd)?)?;
    Some(done(acting(f).and_then(|f| f.setattr(&mode_set(mode)))))
}

/// chown, lchown, fchownat.
pub fn chown(regs: Regs, at: PathAt, uid: i64, gid: i64, flags: AtFlags) -> Option<i64> {
    if let Some(f) = empty_path_file(at, flags, Null::Fault) {
        return Some(done(own(f?)?.setattr(&owner_set(uid, gid))));
    }
    let (vfs, t) = ours!(lookup_follow(regs, at, flags.follow()));
    Some(set_on(&vfs, &t, &owner_set(uid, gid)))
}

pub fn fchown(fd: Fd, uid: i64, gid: i64) -> Option<i64> {
    let f = own(file(fd)?)?;
    Some(done(acting(f).and_then(|f| f.setattr(&owner_set(uid, gid)))))
}

/// utimensat; a null path is futimens(2): the descriptor itself, and so is
/// an empty one with AT_EMPTY_PATH.
/// utimensat's two struct timespec (`None`: null, "both now"), read first
/// as the kernel does: a bad pointer is EFAULT and both times UTIME_OMIT
/// return 0 (nothing changes, ctime included) before the path is looked
/// at; nanoseconds out of range are EINVAL once it was found. `Err` is
/// the call's answer already.
pub fn utime_times(times: Ptr) -> Result<Option<[i64; 4]>, i64> {
    if times.is_null() {
        return Ok(None);
    }
    // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
    match unsafe { user::get::<[i64; 4]>(times.0) } {
        Ok(t) if t[1] == libc::UTIME_OMIT && t[3] == libc::UTIME_OMIT => Err(0),
        Ok(t) => Ok(Some(t)),
        Err(e) => Err(err(e)),
    }
}

pub fn utimensat(regs: Regs, at: PathAt, times: Ptr, flags: AtFlags) -> Option<i64> {
    let times = match utime_times(times) {
        Ok(t) => t,
        Err(r) => return Some(r),
    };
    let (vfs, node) = if at.path.is_null() || empty_path(at.path, flags, Null::Fault) {
        let f = own(file(Fd(at.dirfd))?)?;
        // futimens proper (a null path) acts on the descriptor; an empty
        // path with AT_EMPTY_PATH names its file, O_PATH or not.
        let f = if at.path.is_null() {
            match acting(f) {
                Ok(f) => f,
                Err(e) => return Some(err(e)),
            }
        } else {
            f
        };
        (f.vfs().clone(), f.node())
    } else {
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        if let Err(e) = unsafe { user::cstr(at.path.0) } {
            return Some(err(e));
        }
        let (vfs, t) = ours!(lookup_follow(regs, at, flags.follow()));
        let Some((node, _)) = t.node else {
            return Some(err(Errno::ENOENT));
        };
        (vfs, node)
    };
    let valid = |n: i64| n == libc::UTIME_OMIT || n == libc::UTIME_NOW || (0..1_000_000_000).contains(&n);
    if times.is_some_and(|t| !valid(t[1]) || !valid(t[3])) {
        return Some(err(Errno::EINVAL));
    }
    let time = |i: usize| -> Option<SetTime> {
        let Some(ts) = times else {
            return Some(SetTime::Now);
        };
        let (sec, nsec) = (ts[2 * i], ts[2 * i + 1]);
        match nsec {
            n if n == libc::UTIME_OMIT => None,
            n if n == libc::UTIME_NOW => Some(SetTime::Now),
            n => Some(SetTime::At(shortfuse::Timestamp { sec, nsec: n as u32 })),
        }
    };
    let set = SetAttr {
        atime: time(0),
        mtime: time(1),
        ..Default::default()
    };
    Some(done(vfs.setattr(node, &set)))
}

pub fn statfs(regs: Regs, at: PathAt, out: Ptr) -> Option<i64> {
    let (vfs, t) = ours!(lookup_follow(regs, at, true));
    let Some((node, _)) = t.node else {
        return Some(err(Errno::ENOENT));
    };
    Some(done(
        // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
        vfs.statfs(node)
            .and_then(|s| unsafe { user::put(out.0, &to_statfs(&s, &vfs)) }),
    ))
}

pub fn fstatfs(fd: Fd, out: Ptr) -> Option<i64> {
    let f = file(fd)?;
    // A file opened beneath a namespace map has no node: the mount's.
    let node = if f.beneath_map() { NodeId::ROOT } else { f.node() };
    Some(done(
        f.vfs()
            .statfs(node)
            // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
            .and_then(|s| unsafe { user::put(out.0, &to_statfs(&s, f.vfs())) }),
    ))
}

fn mode_set(mode: u32) -> SetAttr {
    SetAttr {
        mode: Some(mode & 0o7777),
        ..Default::default()
    }
}

/// chown's (uid, gid): -1 (as a 32-bit value) leaves one unchanged.
fn owner_set(uid: i64, gid: i64) -> SetAttr {
    let id = |v: i64| (v as u32 != u32::MAX).then_some(v as u32);
    SetAttr {
        uid: id(uid),
        gid: id(gid),
        ..Default::default()
    }
}

fn set_on(vfs: &Vfs, t: &Target, set: &SetAttr) -> i64 {
    let Some((node, _)) = t.node else {
        return err(Errno::ENOENT);
    };
    if t.trailing_slash
        && t.node
            .is_some_and(|(_, a)| a.file_type() != shortfuse::FileType::Directory)
    {
        return err(Errno::ENOTDIR);
    }
    // chown(-1, -1) goes too: on ext4 it moves ctime and clears set-id
    // bits, which the file system does on an empty SETATTR.
    done(vfs.setattr(node, set))
}

/// The kernel's `struct statfs` (x86_64): f_type, f_bsize, f_blocks,
/// f_bfree, f_bavail, f_files, f_ffree, f_fsid, f_namelen, f_frsize,
/// f_flags, f_spare[4]. Written as words: libc's struct hides f_flags.
fn to_statfs(s: &shortfuse::Statfs, vfs: &Vfs) -> [i64; 15] {
    let mut out = [0i64; 15];
    // FUSE_SUPER_MAGIC, as statfs(2) reports for a FUSE mount.
    out[0] = 0x6573_5546;
    out[1] = i64::from(s.bsize);
    out[2] = s.blocks as i64;
    out[3] = s.bfree as i64;
    out[4] = s.bavail as i64;
    out[5] = s.files as i64;
    out[6] = s.ffree as i64;
    // f_fsid stays zero, as for every FUSE mount.
    out[8] = i64::from(s.namelen);
    out[9] = i64::from(if s.frsize == 0 { s.bsize } else { s.frsize });
    // ST_VALID says f_flags is filled in.
    out[10] = 0x20 | if vfs.is_read_only() { libc::ST_RDONLY as i64 } else { 0 };
    out
}

pub fn to_stat(a: &Attr, dev: u64) -> libc::stat {
    let mut s: libc::stat = user::zeroed();
    s.st_dev = dev;
    s.st_ino = a.ino;
    s.st_nlink = u64::from(a.nlink);
    s.st_mode = a.mode;
    s.st_uid = a.uid;
    s.st_gid = a.gid;
    s.st_rdev = u64::from(a.rdev);
    s.st_size = a.size as i64;
    s.st_blksize = if a.blksize == 0 { 4096 } else { i64::from(a.blksize) };
    s.st_blocks = a.blocks as i64;
    s.st_atime = a.atime.sec;
    s.st_atime_nsec = i64::from(a.atime.nsec);
    s.st_mtime = a.mtime.sec;
    s.st_mtime_nsec = i64::from(a.mtime.nsec);
    s.st_ctime = a.ctime.sec;
    s.st_ctime_nsec = i64::from(a.ctime.nsec);
    s
}

pub fn to_statx(a: &Attr, dev: u64) -> libc::statx {
    let mut s: libc::statx = user::zeroed();
    s.stx_mask = libc::STATX_BASIC_STATS;
    s.stx_blksize = if a.blksize == 0 { 4096 } else { a.blksize };
    s.stx_nlink = a.nlink;
    s.stx_uid = a.uid;
    s.stx_gid = a.gid;
    s.stx_mode = a.mode as u16;
    s.stx_ino = a.ino;
    s.stx_size = a.size;
    s.stx_blocks = a.blocks;
    let ts = |t: shortfuse::Timestamp| {
        let mut x: libc::statx_timestamp = user::zeroed();
        x.tv_sec = t.sec;
        x.tv_nsec = t.nsec;
        x
    };
    s.stx_atime = ts(a.atime);
    s.stx_mtime = ts(a.mtime);
    s.stx_ctime = ts(a.ctime);
    s.stx_rdev_major = libc::major(u64::from(a.rdev));
    s.stx_rdev_minor = libc::minor(u64::from(a.rdev));
    s.stx_dev_major = libc::major(dev);
    s.stx_dev_minor = libc::minor(dev);
    s
}
