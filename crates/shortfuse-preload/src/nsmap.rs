//! Path calls served by the kernel beneath a mount's backing directory,
//! for mounts whose file system declared a namespace map (see
//! `shortfuse::namespace`; passthrough does).
//!
//! stat, lstat, fstatat, statx, access, faccessat and readlink of a path
//! beneath such a mount become one `*at` call on the directory that holds
//! the last name, with the program's own credentials (so the kernel checks
//! every permission), presented as the file system presents them (the
//! mount's device number, the backing inode's attributes and number). The
//! directory is the backing root for a name at the top, else one found by
//! `openat2(RESOLVE_BENEATH)` and kept for the entry timeout
//! ([`shortfuse_vfs::Namespace`]). The file system sees none of it.
//!
//! Whatever the kernel cannot decide beneath the backing directory the
//! same way the walk would goes the usual way (`None`): a symbolic link to
//! follow as the last name, a directory path that leaves the backing
//! directory through a symbolic link (`EXDEV` from `RESOLVE_BENEATH`), `.`
//! or `..` components, the mount's root itself, a mount inside the mount,
//! a relative path from a kernel descriptor.
#![allow(unsafe_code)]

use std::borrow::Cow;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use shortfuse::{Attr, Errno};
use shortfuse_vfs::{Namespace, Vfs};

use crate::calls::table::{Call, XattrOp};
use crate::calls::{mount_of, nested, to_stat, to_statx};
use crate::state;
use crate::sys::raw;
use crate::user;

const AT_FDCWD: i64 = libc::AT_FDCWD as i64;

/// Calls that can move a directory or change who may search one: every
/// kept directory is forgotten before they run, wherever their path leads.
fn moves_or_guards_directories(c: &Call) -> bool {
    match *c {
        Call::Rename { .. } | Call::Chmod { .. } | Call::Fchmod { .. } | Call::Chown { .. } | Call::Fchown { .. } => {
            true
        }
        Call::Xattr {
            op: XattrOp::Set { .. } | XattrOp::Remove { .. },
            ..
        } => true,
        // rmdir, and unlinkat of a directory.
        Call::Unlink { flags, .. } => flags & libc::AT_REMOVEDIR != 0,
        _ => false,
    }
}

/// A call that would close or replace descriptor numbers, among them
/// perhaps a kept directory's (a program that closes every descriptor, a
/// `dup2` onto a high number): the directories are forgotten (closed)
/// before it runs, so that no number of the program's is taken for one.
fn takes_numbers(c: &Call, st: &crate::State) -> bool {
    let fd = match *c {
        Call::CloseRange { .. } => return true,
        Call::Close { fd } | Call::Dup3 { new: fd, .. } => fd.0,
        _ => return false,
    };
    fd >= crate::calls::OWN_FD_FLOOR as i32 && st.mounts.iter().any(|m| m.namespace().is_some_and(|ns| ns.holds(fd)))
}

/// Serves call `c` through a namespace map, or `None` for the usual way.
pub fn call(c: &Call) -> Option<i64> {
    let st = state();
    if moves_or_guards_directories(c) || takes_numbers(c, st) {
        for m in &st.mounts {
            if let Some(ns) = m.namespace() {
                ns.forget_dirs();
            }
        }
        return None;
    }
    let mut statx_flags = 0;
    // (where the path is, follow the last name, what to do)
    let (at, follow, op) = match *c {
        Call::Stat { at, out, flags } => {
            if flags.0 & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT) != 0 {
                return None;
            }
            (at, flags.follow(), Op::Stat(out.0))
        }
        Call::Statx { at, flags, out } => {
            statx_flags = flags.0;
            let known = libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT | libc::AT_STATX_SYNC_TYPE;
            if flags.0 & !known != 0 {
                return None;
            }
            (at, flags.follow(), Op::Statx(out.0))
        }
        Call::Access { at, mode, flags } => {
            if flags.0 & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_EACCESS) != 0 {
                return None;
            }
            (at, flags.follow(), Op::Access(mode, flags.0 & libc::AT_EACCESS))
        }
        Call::Readlink { at, buf, len } => (at, false, Op::Readlink(buf.0, i64::from(len))),
        _ => return None,
    };
    let (dirfd, path) = (i64::from(at.dirfd), at.path.0);
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = unsafe { user::cstr(path) }.ok()?;
    // The kernel's links to descriptors are the usual way's to answer.
    if matches!(op, Op::Readlink(..)) && (path.starts_with(b"/proc/") || path.starts_with(b"/dev/fd/")) {
        return None;
    }
    let (vfs, rel) = beneath(dirfd, path)?;
    let ns = vfs.namespace_current()?;
    if let Op::Access(mode, _) = op {
        if mode & libc::W_OK != 0 && vfs.is_read_only() {
            return None;
        }
    }
    let caller = crate::creds::current();
    if !ns.serves(&caller) {
        return None;
    }
    let (dir, name) = match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&rel[..0], &rel[..]),
    };
    let held;
    let dirfd = if dir.is_empty() {
        ns.root().as_raw_fd()
    } else {
        held = match ns.dir(dir, &caller, || open_dir(ns, dir)) {
            Ok(fd) => fd,
            // Decided beneath the backing directory as the walk decides.
            Err(e @ (Errno::ENOENT | Errno::ENOTDIR | Errno::EACCES | Errno::ENAMETOOLONG)) => return Some(err(e)),
            // A symbolic link out of it, a mount point, anything else.
            Err(_) => return None,
        };
        held.as_raw_fd()
    };
    let mut cname = [0u8; 256];
    if name.len() >= cname.len() {
        return Some(err(Errno::ENAMETOOLONG));
    }
    cname[..name.len()].copy_from_slice(name);
    let cname = cname.as_ptr() as i64;
    let dirfd = i64::from(dirfd);
    let lstat = || -> Result<libc::stat, Errno> {
        let mut k: libc::stat = user::zeroed();
        let nofollow = i64::from(libc::AT_SYMLINK_NOFOLLOW);
        // SAFETY: a NUL-terminated name of ours and a stat struct of ours.
        let r = unsafe {
            raw(
                libc::SYS_newfstatat,
                dirfd,
                cname,
                &mut k as *mut libc::stat as i64,
                nofollow,
                0,
                0,
            )
        };
        if r < 0 {
            return Err(Errno::from_raw(-r as i32));
        }
        Ok(k)
    };
    let is_link = |k: &libc::stat| k.st_mode & libc::S_IFMT == libc::S_IFLNK;
    let dev = vfs.dev();
    Some(match op {
        // The kernel fills the program's struct (and says EFAULT for a bad
        // one); then it is made what the file system would have reported.
        Op::Stat(out) => {
            let nofollow = i64::from(libc::AT_SYMLINK_NOFOLLOW);
            // SAFETY: a NUL-terminated name of ours, and the program's own
            // output struct handed on: the kernel checks and fills it as it
            // would have.
            let r = unsafe { raw(libc::SYS_newfstatat, dirfd, cname, out, nofollow, 0, 0) };
            if r < 0 {
                return Some(r);
            }
            let mut link = false;
            user::amend::<libc::stat>(out, |s| {
                link = follow && is_link(s);
                *s = to_stat(&Attr::from_stat(s), dev);
            });
            // The walk follows it (it may lead anywhere).
            if link {
                return None;
            }
            0
        }
        Op::Statx(out) => {
            let flags = i64::from(libc::AT_SYMLINK_NOFOLLOW | (statx_flags & libc::AT_STATX_SYNC_TYPE));
            let mask = i64::from(libc::STATX_BASIC_STATS);
            // SAFETY: as for stat above.
            let r = unsafe { raw(libc::SYS_statx, dirfd, cname, flags, mask, out, 0) };
            if r < 0 {
                return Some(r);
            }
            let mut link = false;
            user::amend::<libc::statx>(out, |s| {
                link = follow && u32::from(s.stx_mode) & libc::S_IFMT == libc::S_IFLNK;
                *s = to_statx(&Attr::from_statx(s), dev);
            });
            if link {
                return None;
            }
            0
        }
        Op::Access(mode, eaccess) => match lstat() {
            Ok(k) if follow && is_link(&k) => return None,
            // SAFETY: a NUL-terminated name of ours; no other memory.
            Ok(_) => unsafe {
                raw(
                    libc::SYS_faccessat2,
                    dirfd,
                    cname,
                    i64::from(mode),
                    i64::from(eaccess | libc::AT_SYMLINK_NOFOLLOW),
                    0,
                    0,
                )
            },
            Err(e) => err(e),
        },
        // The kernel writes the program's buffer itself.
        // SAFETY: a NUL-terminated name of ours, and the program's own
        // buffer and size handed on: the kernel checks and fills it as it
        // would have.
        Op::Readlink(buf, len) => unsafe { raw(libc::SYS_readlinkat, dirfd, cname, buf, len, 0, 0) },
    })
}

enum Op {
    /// stat/lstat/fstatat into a `struct stat` at this address.
    Stat(i64),
    /// statx into a `struct statx` at this address.
    Statx(i64),
    /// access(mode) with `AT_EACCESS` or 0.
    Access(i32, i32),
    /// readlink into (buffer, length).
    Readlink(i64, i64),
}

fn err(e: Errno) -> i64 {
    -(e.raw() as i64)
}

/// The mount `path` (from `dirfd`) leads into and the path below its root,
/// when that mount has a namespace map and the path is one the kernel can
/// follow beneath the backing directory: no `.`, `..` or empty components,
/// not the root itself, no other mount inside.
fn beneath(dirfd: i64, path: &[u8]) -> Option<(Arc<Vfs>, Cow<'_, [u8]>)> {
    let st = state();
    let dirfd = dirfd as i32 as i64;
    if path.is_empty() {
        return None;
    }
    let (vfs, rel): (Arc<Vfs>, Cow<'_, [u8]>) = if path.starts_with(b"/") {
        let (vfs, rest) = mount_of(path)?;
        vfs.namespace()?;
        (vfs, Cow::Borrowed(rest.strip_prefix(b"/").unwrap_or(rest)))
    } else {
        let (vfs, base) = if dirfd == AT_FDCWD {
            let cwd = st.cwd.lock().unwrap_or_else(|e| e.into_inner());
            match &*cwd {
                Some((vfs, loc)) => {
                    vfs.namespace()?;
                    (vfs.clone(), loc.path())
                }
                None => {
                    drop(cwd);
                    let host = st.host_cwd.lock().unwrap_or_else(|e| e.into_inner());
                    let mut abs = host.clone();
                    drop(host);
                    abs.push(b'/');
                    abs.extend_from_slice(path);
                    let (vfs, rest) = mount_of(&abs)?;
                    vfs.namespace()?;
                    let rest = rest.strip_prefix(b"/").unwrap_or(rest).to_vec();
                    return plain(&rest).then_some((vfs, Cow::Owned(rest)));
                }
            }
        } else {
            let f = st.fds.get(dirfd as i32)?;
            f.vfs().namespace()?;
            (f.vfs().clone(), f.location()?.path())
        };
        let mut rel = base;
        if rel != b"/" {
            rel.push(b'/');
        }
        rel.extend_from_slice(path);
        rel.remove(0);
        (vfs, Cow::Owned(rel))
    };
    if !plain(&rel) {
        return None;
    }
    // A mount inside this one takes its paths: the walk knows where.
    let mp = vfs.mountpoint();
    let inner = st.mounts.iter().any(|m| {
        let p = m.mountpoint();
        p.len() > mp.len() && p.starts_with(mp) && (mp == b"/" || p[mp.len()] == b'/')
    });
    (!inner).then_some((vfs, rel))
}

/// A relative path of names alone: no empty, `.` or `..` component (so no
/// leading, doubled or trailing slash).
fn plain(rel: &[u8]) -> bool {
    !rel.is_empty()
        && rel
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// `openat2(root, dir, O_PATH | O_DIRECTORY, RESOLVE_BENEATH ...)`, the
/// descriptor kept above the program's numbers.
fn open_dir(ns: &Namespace, dir: &[u8]) -> Result<OwnedFd, Errno> {
    let mut c = Vec::with_capacity(dir.len() + 1);
    c.extend_from_slice(dir);
    c.push(0);
    // struct open_how: flags, mode, resolve.
    let how: [u64; 3] = [
        (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        0,
        ns.resolve(),
    ];
    // SAFETY: our own openat2 of a NUL-terminated path of ours with an
    // open_how of ours, its size given.
    let fd = unsafe {
        nested(
            libc::SYS_openat2,
            [
                i64::from(ns.root().as_raw_fd()),
                c.as_ptr() as i64,
                how.as_ptr() as i64,
                std::mem::size_of_val(&how) as i64,
                0,
                0,
            ],
        )
    };
    if fd < 0 {
        return Err(Errno::from_raw(-fd as i32));
    }
    Ok(OwnedFd::from(crate::sys::owned_file(fd)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_are_plain() {
        for ok in [&b"a"[..], b"a/b", b".hidden/x", b"a/..b", b"a/b.c"] {
            assert!(plain(ok), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [&b""[..], b"/a", b"a/", b"a//b", b"./a", b"a/.", b"a/../b", b".."] {
            assert!(!plain(bad), "{}", String::from_utf8_lossy(bad));
        }
    }
}
