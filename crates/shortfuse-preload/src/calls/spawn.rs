//! The calls of a vfork or posix_spawn child before its exec: python's
//! subprocess with `cwd=` (chdir), posix_spawn's file actions
//! (`posix_spawn_file_actions_addchdir_np`, `addfchdir_np`, `addopen`).
//!
//! The child shares the parent's memory, so it must not change our tables
//! (see `calls::vfork_exec`); what it changes is its own and goes with it
//! to the exec:
//!
//! - a current directory inside a mount is remembered for this child alone
//!   ([`Cwd`], in the thread's state, which the child has to itself while
//!   the parent waits; reset before every vfork-like call) and handed to
//!   the new image in `SHORTFUSE_CWD`. On a mount with a source directory
//!   the kernel's current directory becomes the backing directory (which
//!   also checks that it is one), elsewhere the mount walks the path on a
//!   stack of its own;
//! - relative paths of the child's later calls (opens, the exec's program)
//!   start there;
//! - an open of a path on a mount with a source directory opens the backing
//!   file in the kernel, the descriptor the new image inherits (as the
//!   parent's own opens of such a file do). On a mount without one the
//!   file system opens it, on a stack of its own: a daemon's file gets
//!   its shared description at once, held by the daemon rather than by
//!   our tables, which the new image adopts (see `shared`); a file of
//!   `mem` in process, opened for reading, gets a memfd copy of its bytes
//!   (the new image's `mem` is a new one), and other opens there fail
//!   with EACCES: nothing the new image could write would reach the file.
//!
//! The calls reach us through a rewritten site or, where there is none
//! (Syscall User Dispatch alone; glibc 2.36's `__open64_nocancel`, which
//! posix_spawn's `addopen` calls and whose site straddles a cache line, in
//! a process with threads), through Syscall User Dispatch, which the
//! assembly turns on in the child too (`sys`).
#![allow(unsafe_code)]

use shortfuse::sync::Unpoison;
use std::cell::{Cell, RefCell};
use std::sync::Arc;

use shortfuse::{Errno, FileType};
use shortfuse_vfs::{Location, Vfs, Walk, WalkFlags};

use super::directories::enter_dead_directory;
use super::reply::err;
use super::resolve::{mount_of, resolve_for, with_nul, Resolved};
use super::table::Call;
use crate::state;

const AT_FDCWD: i64 = libc::AT_FDCWD as i64;
use crate::sys::fs;

/// The current directory of a vfork child.
#[derive(Clone)]
pub enum Cwd {
    /// As the parent's (no chdir yet).
    Parent,
    /// This directory (absolute, normalised) inside a mount.
    Mount(Vec<u8>),
    /// The kernel's.
    Kernel,
}

thread_local! {
    static CWD: RefCell<Cwd> = const { RefCell::new(Cwd::Parent) };
    /// The vfork child opened a file of a mount (its own descriptor, which
    /// the new image must look for).
    static OPENED: Cell<bool> = const { Cell::new(false) };
}

/// Before a vfork-like call (in the parent): the child starts where the
/// parent is, with no file of a mount opened.
pub fn reset() {
    CWD.with(|c| *c.borrow_mut() = Cwd::Parent);
    OPENED.with(|o| o.set(false));
}

/// Before a clone-family call `nr` (clone's `flags`): a vfork-like one
/// makes a child that may need the daemon of a mount without a source
/// directory (a chdir, an open or the exec there), which it cannot connect
/// to itself (see [`may_connect`]), so we connect first. Mounts with a
/// source serve the child from the kernel, and stay as they are.
pub fn before_vfork(nr: i64, flags: i64) {
    let vfork = i64::from(libc::CLONE_VM | libc::CLONE_VFORK);
    if nr != libc::SYS_vfork && (nr != libc::SYS_clone || flags & vfork != vfork) {
        return;
    }
    for m in &state().mounts {
        if m.client().shared() && m.source().is_none() {
            // A failure is the child's: its call gets ENOTCONN.
            let _ = m.client().init_out();
        }
    }
}

/// Whether this process may connect to a daemon now: not in a vfork
/// child, which shares our memory but not our descriptors (the connection
/// would stay with the parent, its socket with the child).
pub fn may_connect() -> bool {
    crate::sys::thread().vforked.load(std::sync::atomic::Ordering::Relaxed) == 0
}

/// Whether the vfork child opened a file of a mount since the call.
pub fn opened_on_mount() -> bool {
    OPENED.with(Cell::get)
}

/// The vfork child's own current directory; [`Cwd::Parent`] in any other
/// process (what a child left behind in the thread's state is stale once
/// the parent resumes).
fn child_cwd() -> Cwd {
    if crate::sys::thread().vforked.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return Cwd::Parent;
    }
    CWD.with(|c| c.borrow().clone())
}

/// The current directory inside a mount (absolute), if it is in
/// one: the parent's unless the child changed it.
pub fn mount_cwd() -> Option<Vec<u8>> {
    match child_cwd() {
        Cwd::Mount(p) => Some(p),
        Cwd::Kernel => None,
        Cwd::Parent => {
            let st = state();
            let cwd = st.cwd.lock().unpoison();
            cwd.as_ref().map(|(vfs, here)| here.host_path(vfs))
        }
    }
}

/// The absolute, normalised form of `path` (relative to `dirfd`) as the
/// child sees it, when that can be told without the kernel: `None` for a
/// path relative to a kernel directory.
pub fn absolute(dirfd: i64, path: &[u8]) -> Option<Vec<u8>> {
    let mut abs = if path.starts_with(b"/") {
        Vec::new()
    } else if dirfd as i32 == libc::AT_FDCWD {
        match mount_cwd() {
            Some(p) => p,
            None if matches!(child_cwd(), Cwd::Kernel) => return None,
            None => state().host_cwd.lock().unpoison().clone(),
        }
    } else {
        let f = state().fds.get(dirfd as i32)?;
        f.vfs().host_path(f.location()?)
    };
    abs.push(b'/');
    abs.extend_from_slice(path);
    Some(shortfuse_vfs::normalize(&abs))
}

/// Serves call `c` of a vfork child (see the module doc); `None` sends it
/// to the kernel.
pub fn call(c: Call) -> Option<i64> {
    match c {
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        Call::Chdir { at } => chdir(AT_FDCWD, unsafe { crate::user::cstr(at.path.0) }.ok()?),
        Call::Fchdir { fd } => {
            let f = state().fds.get(fd.0);
            let Some(f) = f else {
                let r = fs::fchdir(fd.0);
                if r == 0 {
                    CWD.with(|c| *c.borrow_mut() = Cwd::Kernel);
                }
                return Some(r);
            };
            let Some(loc) = f.location() else {
                return Some(err(Errno::ENOTDIR));
            };
            let p = f.vfs().host_path(loc);
            chdir(AT_FDCWD, &p)
        }
        Call::Open { at, flags, mode } => {
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            let path = unsafe { crate::user::cstr(at.path.0) }.ok()?;
            open(i64::from(at.dirfd), path, flags, mode)
        }
        // A bad pointer: the kernel's EFAULT (above, too). Every other
        // call of the child reaches the kernel: relative
        // paths there start at the kernel's current directory.
        _ => None,
    }
}

fn chdir(dirfd: i64, path: &[u8]) -> Option<i64> {
    let Some(abs) = absolute(dirfd, path) else {
        let r = fs::chdir(&with_nul(path.to_vec()));
        return Some(r);
    };
    let Some((vfs, rest)) = mount_of(&abs) else {
        let r = fs::chdir(&with_nul(abs));
        if r == 0 {
            CWD.with(|c| *c.borrow_mut() = Cwd::Kernel);
        }
        return Some(r);
    };
    let r = match vfs.source() {
        Some(src) => {
            let p = super::exec::backing_path(src, &slash(rest));
            fs::chdir(&p)
        }
        None => {
            let rest = rest.to_vec();
            let mut got = err(Errno::ENOMEM);
            crate::sys::on_own_stack(&mut || got = directory(&vfs, &rest));
            if got == 0 {
                // The child's own kernel directory (posix_spawn does not
                // share it): never the parent's, where a program the shim
                // does not reach would put what was meant for the mount.
                enter_dead_directory();
            }
            got
        }
    };
    if r == 0 {
        CWD.with(|c| *c.borrow_mut() = Cwd::Mount(abs));
    }
    Some(r)
}

/// `/rest`, or `/` for the mount point itself.
pub(super) fn slash(rest: &[u8]) -> Vec<u8> {
    if rest.is_empty() {
        b"/".to_vec()
    } else {
        rest.to_vec()
    }
}

/// 0 when `rest` (below the mount point) walks to a directory, else the
/// negated errno chdir gives.
fn directory(vfs: &Arc<Vfs>, rest: &[u8]) -> i64 {
    let flags = WalkFlags {
        attrs_only: false,
        follow: true,
        create: false,
    };
    match vfs.walk(&Location::root(), rest, flags, 0) {
        Ok(Walk::Inside(t)) => match t.node {
            Some((_, attr)) if attr.file_type() == FileType::Directory => 0,
            Some(_) => err(Errno::ENOTDIR),
            None => err(Errno::ENOENT),
        },
        // A walk that left the mount: the kernel decides.
        Ok(Walk::Outside { .. }) => err(Errno::EXDEV),
        Err(e) => err(e),
    }
}

fn open(dirfd: i64, path: &[u8], flags: i32, mode: u32) -> Option<i64> {
    let abs = absolute(dirfd, path)?;
    let (vfs, rest) = mount_of(&abs)?;
    OPENED.with(|o| o.set(true));
    if let Some(src) = vfs.source() {
        let p = super::exec::backing_path(src, &slash(rest));
        return Some(fs::openat(libc::AT_FDCWD, &p, flags, mode));
    }
    // The file system's code needs more stack than the child has.
    let mut got = err(Errno::ENOMEM);
    crate::sys::on_own_stack(&mut || got = open_unbacked(&abs, flags, mode));
    Some(got)
}

/// An open of absolute path `abs` on a mount without a source directory
/// (see the module doc): a daemon's regular file gets a shared description
/// of its own, which the daemon holds and the new image adopts; a regular
/// file of a mount served in process, opened for reading, gets a memfd
/// copy (the new image has a file system of its own, where the file is
/// not); anything else there fails with EACCES.
fn open_unbacked(abs: &[u8], flags: i32, mode: u32) -> i64 {
    let excl = libc::O_CREAT | libc::O_EXCL;
    let follow = flags & libc::O_NOFOLLOW == 0 && flags & excl != excl;
    let walk = WalkFlags {
        attrs_only: false,
        follow,
        create: false,
    };
    let (vfs, t) = match resolve_for(libc::AT_FDCWD, abs, walk) {
        Ok(Resolved::Ours(vfs, t)) => (vfs, t),
        // A walk that left the mount: the kernel opens what it reached.
        Ok(Resolved::Kernel(p)) => {
            let p = p.unwrap_or_else(|| with_nul(abs.to_vec()));
            return fs::openat(libc::AT_FDCWD, &p, flags, mode);
        }
        Err(e) => return err(e),
    };
    let f = match vfs.open(&t, flags, mode) {
        Ok(f) => f,
        Err(e) => return err(e),
    };
    let cloexec = flags & libc::O_CLOEXEC != 0;
    if super::shared::wanted(&f, flags) {
        return super::shared::hand_out(&f, cloexec);
    }
    if f.file_type() != FileType::Regular || flags & libc::O_ACCMODE != libc::O_RDONLY || vfs.client().shared() {
        return err(Errno::EACCES);
    }
    let mflags = if cloexec { libc::MFD_CLOEXEC } else { 0 };
    match super::exec::copy_to_memfd(&f, c"shortfuse-copy", mflags) {
        Ok(fd) => fd,
        Err(e) => err(e),
    }
}
