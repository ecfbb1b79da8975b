//! Calls that name files by path and change or read the names: mkdir,
//! mknod, unlink, rename, link, symlink, readlink, truncate, access and
//! inotify watches, and the umask that creations apply.
#![allow(unsafe_code)] // the program's memory, through `user`

use shortfuse::sync::Unpoison;
use std::sync::Arc;

use shortfuse::{Errno, NodeId};
use shortfuse_vfs::{Target, Vfs};
use std::os::fd::AsRawFd;

use super::exec;
use super::reply::{done, err};
use super::resolve::{file, lookup_follow, magic_link, ours, resolve, target_of, with_nul, Resolved};
use super::table::{Fd, PathAt, Ptr, Regs};
use crate::state;
use crate::sys::{fs, process};
use crate::user;

pub fn access(regs: Regs, at: PathAt, mode: i32, flags: super::table::AtFlags) -> Option<i64> {
    let (vfs, t) = ours!(lookup_follow(regs, at, flags.follow()));
    Some(done(vfs.access(&t, mode)))
}

pub fn mkdir(regs: Regs, at: PathAt, mode: u32) -> Option<i64> {
    let (vfs, t) = ours!(lookup_follow(regs, at, false));
    Some(creating(&vfs, || vfs.mkdir(&t, mode)))
}

pub fn mknod(regs: Regs, at: PathAt, mode: u32, dev: u32) -> Option<i64> {
    let (vfs, t) = ours!(lookup_follow(regs, at, false));
    Some(creating(&vfs, || vfs.mknod(&t, mode, dev)))
}

/// unlink, rmdir (AT_REMOVEDIR), unlinkat.
pub fn unlink(regs: Regs, at: PathAt, flags: i32) -> Option<i64> {
    let (vfs, t) = ours!(lookup_follow(regs, at, false));
    Some(done(if flags & libc::AT_REMOVEDIR != 0 {
        vfs.rmdir(&t)
    } else {
        vfs.unlink(&t)
    }))
}

pub fn truncate(regs: Regs, at: PathAt, len: i64) -> Option<i64> {
    // As the kernel: a negative length is refused before the path is
    // looked up (of any path, ours or not).
    if len < 0 {
        return Some(err(Errno::EINVAL));
    }
    let (vfs, t) = ours!(lookup_follow(regs, at, true));
    Some(done(vfs.truncate(&t, len as u64)))
}

pub fn readlink(regs: Regs, at: PathAt, buf: Ptr, len: i32) -> Option<i64> {
    // As the kernel: a size below 1 is refused before the path is looked
    // up (of any path, ours or not).
    if len <= 0 {
        return Some(err(Errno::EINVAL));
    }
    if let Some(r) = proc_link(at.path, buf, len) {
        return Some(r);
    }
    let (vfs, t) = ours!(lookup_follow(regs, at, false));
    Some(readlink_out(&vfs, &t, buf, len))
}

pub fn symlink(regs: Regs, target: Ptr, at: PathAt) -> Option<i64> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let target = match unsafe { user::cstr(target.0) } {
        Ok(t) => t.to_vec(),
        Err(e) => return Some(err(e)),
    };
    let (vfs, t) = ours!(lookup_follow(regs, at, false));
    Some(creating(&vfs, || vfs.symlink(&target, &t)))
}

/// A path argument of a rename or link, and the path the program passed.
#[derive(Clone, Copy)]
struct Named<'a> {
    at: PathAt,
    path: &'a [u8],
}

/// Both paths of a rename or link read from the program, and where they
/// lead (the old one as `first` says); `Err` ends the call with a value.
fn resolve_two<'a>(
    old: PathAt,
    new: PathAt,
    first: impl FnOnce(&'a [u8]) -> Result<Resolved, i64>,
) -> Result<([Named<'a>; 2], [Resolved; 2]), i64> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let (p1, p2) = match (unsafe { user::cstr(old.path.0) }, unsafe { user::cstr(new.path.0) }) {
        (Ok(p1), Ok(p2)) => (p1, p2),
        (Err(e), _) | (_, Err(e)) => return Err(err(e)),
    };
    let r1 = first(p1)?;
    let r2 = resolve(new.dirfd, p2, false).map_err(err)?;
    Ok(([Named { at: old, path: p1 }, Named { at: new, path: p2 }], [r1, r2]))
}

/// Which call [`kernel_two`] makes, with its flags.
enum Two {
    Rename(u32),
    Link(i32),
}

/// renameat2 or linkat (`nr`) on the kernel for two paths that are not
/// ours; `found` the paths a walk that left a mount found instead.
fn kernel_two(nr: Two, names: [Named<'_>; 2], found: [Option<Vec<u8>>; 2]) -> i64 {
    let side = |Named { at, path }: Named<'_>, found: Option<Vec<u8>>| {
        let p = found.unwrap_or_else(|| path.iter().copied().chain([0]).collect());
        let d = if p[0] == b'/' { libc::AT_FDCWD } else { at.dirfd };
        (d, p)
    };
    let [x, y] = found;
    let ((od, o), (nd, n)) = (side(names[0], x), side(names[1], y));
    match nr {
        Two::Rename(flags) => fs::renameat2(od, &o, nd, &n, flags),
        Two::Link(flags) => fs::linkat(od, &o, nd, &n, flags),
    }
}

/// rename, renameat, renameat2.
pub fn rename(old: PathAt, new: PathAt, flags: u32) -> Option<i64> {
    let (names, [r1, r2]) = match resolve_two(old, new, |p1| resolve(old.dirfd, p1, false).map_err(err)) {
        Ok(r) => r,
        Err(e) => return Some(e),
    };
    match (r1, r2) {
        (Resolved::Kernel(None), Resolved::Kernel(None)) => None,
        (Resolved::Kernel(x), Resolved::Kernel(y)) => Some(kernel_two(Two::Rename(flags), names, [x, y])),
        (Resolved::Ours(v1, t1), Resolved::Ours(v2, t2)) if Arc::ptr_eq(&v1, &v2) => {
            Some(done(v1.rename(&t1, &t2, flags)))
        }
        _ => Some(err(Errno::EXDEV)),
    }
}

/// link, linkat.
pub fn link(old: PathAt, new: PathAt, flags: i32) -> Option<i64> {
    let first = |p1: &[u8]| {
        if flags & libc::AT_EMPTY_PATH != 0 && p1.is_empty() {
            return match file(Fd(old.dirfd)) {
                Some(f) => target_of(&f).map(|t| Resolved::Ours(f.vfs().clone(), t)).map_err(err),
                None => Ok(Resolved::Kernel(None)),
            };
        }
        resolve(old.dirfd, p1, flags & libc::AT_SYMLINK_FOLLOW != 0).map_err(err)
    };
    let (names, [r1, r2]) = match resolve_two(old, new, first) {
        Ok(r) => r,
        Err(e) => return Some(e),
    };
    let p1 = names[0].path;
    match (r1, r2) {
        (Resolved::Kernel(None), Resolved::Kernel(None)) => None,
        (Resolved::Kernel(x), Resolved::Kernel(y)) => Some(kernel_two(Two::Link(flags), names, [x, y])),
        (Resolved::Ours(v1, t1), Resolved::Ours(v2, t2)) if Arc::ptr_eq(&v1, &v2) => Some(done(v1.link(&t1, &t2))),
        // A kernel descriptor (an O_TMPFILE of a passthrough mount, see
        // `open`) given a name in a mount with a source: the kernel links
        // it in the backing directory, or says EXDEV.
        (Resolved::Kernel(None), Resolved::Ours(v2, t2))
            if v2.source().is_some() && (p1.is_empty() || magic_link(p1).is_some()) =>
        {
            let target = exec::backing_path(v2.source().unwrap_or_default(), &t2.path());
            // SAFETY: the program's own path argument, handed on as it
            // gave it: the kernel reads it as it would have.
            #[allow(unsafe_code)]
            Some(unsafe { fs::linkat_program(old.dirfd, old.path.0, libc::AT_FDCWD, &target, flags) })
        }
        _ => Some(err(Errno::EXDEV)),
    }
}

/// inotify_add_watch on a mount path: watching the source directory gives
/// the events of a passthrough mount (names are relative to the watched
/// directory); a daemon's mount without one lends the kernel object on
/// which it replays the node's changes (see `shortfuse_ring`'s `WatchMsg`),
/// so the watch, and the descriptor the program reads, stay the kernel's.
/// A file system served in process has neither (ENOSYS).
pub fn inotify_add_watch(regs: Regs, inotify: Fd, at: PathAt, mask: u32) -> Option<i64> {
    let follow = mask & libc::IN_DONT_FOLLOW == 0;
    let (vfs, t) = ours!(lookup_follow(regs, at, follow));
    let Some((node, _)) = t.node else {
        return Some(err(Errno::ENOENT));
    };
    if let Some(src) = vfs.source() {
        let path = exec::backing_path(src, &t.path());
        return Some(fs::inotify_add_watch(inotify.0, &path, mask));
    }
    let (parent, name) = t.place().unwrap_or((NodeId(0), b""));
    let mirror = match vfs.client().watch_node(node, parent, name) {
        Ok(fd) => fd,
        Err(e) => return Some(err(e)),
    };
    // The walk above followed (or not) the final symlink already; the
    // mirror is reached through its descriptor's magic link.
    let path = with_nul(format!("/proc/self/fd/{}", mirror.as_raw_fd()).into_bytes());
    Some(fs::inotify_add_watch(inotify.0, &path, mask & !libc::IN_DONT_FOLLOW))
}

/// umask: the kernel's, and every mount's (an in-process file system
/// applies it itself).
pub fn umask(mask: u32) -> Option<i64> {
    let r = fs::umask(mask);
    for m in &state().mounts {
        m.set_umask(mask);
    }
    Some(r)
}

/// Runs an operation that may create a node (see [`restore_umask`]).
pub fn creating<T>(vfs: &Vfs, f: impl FnOnce() -> Result<T, Errno>) -> i64 {
    let r = f();
    restore_umask(vfs);
    done(r)
}

/// After an operation that may create a node: the in-process passthrough
/// zeroes the calling thread's umask for its own work (it applies the
/// caller's umask itself); give the program its umask back. A daemon's
/// file system runs in the daemon and leaves ours alone.
pub fn restore_umask(vfs: &Vfs) {
    if !vfs.client().shared() {
        fs::umask(vfs.umask());
    }
}

/// readlink of the kernel's links to a descriptor of ours
/// (`/proc/self/fd/N`, `/dev/fd/N`) or to the current directory inside a
/// mount (`/proc/self/cwd`): the path in the mount, as the kernel gives it
/// for a file of a kernel mount (" (deleted)" after a removed file's). The
/// kernel would name a placeholder, a backing file or a directory outside
/// the mount. `None` for any other path (an absolute path only: a path
/// relative to a descriptor of /proc is the kernel's).
fn proc_link(path: Ptr, buf: Ptr, len: i32) -> Option<i64> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = unsafe { user::cstr(path.0) }.ok()?;
    if !path.starts_with(b"/") {
        return None;
    }
    let name = if let Some(f) = magic_link(path).and_then(|fd| state().fds.get(fd)) {
        let mut p = match f.location() {
            Some(loc) => f.vfs().host_path(loc),
            None => {
                let mut p = f.vfs().mountpoint().to_vec();
                if p.ends_with(b"/") {
                    p.pop();
                }
                p.extend_from_slice(f.path());
                p
            }
        };
        let gone = if f.beneath_map() {
            let mut k: libc::stat = user::zeroed();
            fs::fstat(magic_link(path).unwrap_or(-1), &mut k) == 0 && k.st_nlink == 0
        } else {
            f.stat().is_ok_and(|a| a.nlink == 0)
        };
        if gone {
            p.extend_from_slice(b" (deleted)");
        }
        p
    } else if is_cwd_link(path) {
        let cwd = state().cwd.lock().unpoison().clone();
        let (vfs, here) = cwd?;
        here.host_path(&vfs)
    } else {
        return None;
    };
    Some(link_out(&name, buf, len))
}

/// `/proc/self/cwd`, `/proc/thread-self/cwd` or `/proc/PID/cwd` with our pid.
fn is_cwd_link(path: &[u8]) -> bool {
    let Some(who) = path.strip_prefix(b"/proc/").and_then(|p| p.strip_suffix(b"/cwd")) else {
        return false;
    };
    who == b"self"
        || who == b"thread-self"
        || std::str::from_utf8(who)
            .ok()
            .and_then(|w| w.parse::<i64>().ok())
            .is_some_and(|pid| pid == process::getpid())
}

fn readlink_out(vfs: &Vfs, t: &Target, buf: Ptr, len: i32) -> i64 {
    match vfs.readlink(t) {
        Ok(target) => link_out(&target, buf, len),
        Err(e) => err(e),
    }
}

/// Copies a link's `target` to the program's buffer, as readlink does
/// (truncated, no NUL).
fn link_out(target: &[u8], buf: Ptr, len: i32) -> i64 {
    if len <= 0 {
        return err(Errno::EINVAL);
    }
    let n = target.len().min(len as usize);
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    match unsafe { user::slice_mut(buf.0, n) } {
        Ok(out) => {
            out.copy_from_slice(&target[..n]);
            n as i64
        }
        Err(e) => err(e),
    }
}
