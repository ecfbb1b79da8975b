//! flock and fcntl locks on descriptors that are not kernel-backed.
//!
//! - Files of a shared daemon (the rings): the locks are the daemon's (see
//!   `shortfuse_ring::locks`), sent as FUSE GETLK/SETLK/SETLKW, so that
//!   every program on the daemon (and the kernel mount of it) agrees. POSIX
//!   locks belong to the process (`POSIX_OWNER | pid`), OFD and flock locks
//!   to the open file description (its memfd, see `shared`): the daemon
//!   drops them when the process dies or the description closes.
//! - Files served in process: each open file description gets a
//!   descriptor on a per-node anonymous kernel file (`OpenFile::lock_fd`)
//!   and the kernel keeps the locks.
//!
//! Either way a process's POSIX locks on a file go when it closes any
//! descriptor of that file ([`closed`]), as POSIX says, not only at the
//! last close of the description.
#![allow(unsafe_code)]

use shortfuse::sync::Unpoison;
use std::sync::{Arc, Mutex};

use shortfuse::{Errno, FileType, NodeId};
use shortfuse_abi as abi;
use shortfuse_vfs::OpenFile;

use super::reply::{err, res};
use crate::sys::{process, raw};
use crate::user;

/// This process's lock owner (FLUSH and POSIX locks): what a shared
/// daemon's lock table knows it by.
pub fn owner() -> u64 {
    shortfuse_ring::POSIX_OWNER | u64::from(shortfuse_ring::pid())
}

/// The (mount, node) pairs on which this process took POSIX locks through
/// the daemon: a close of any of their descriptors unlocks them. A forked
/// child inherits the list, and at worst unlocks what it never held.
static LOCKED: Mutex<Vec<(usize, NodeId)>> = Mutex::new(Vec::new());

fn key(f: &OpenFile) -> (usize, NodeId) {
    (std::sync::Arc::as_ptr(f.vfs()) as usize, f.node())
}

/// Whether lock calls on `f` go to a daemon.
pub fn remote(f: &OpenFile) -> bool {
    f.vfs().client().shared() && f.handle().is_some() && (f.shared().is_some() || super::shared::pending(f))
}

/// The flock(2) call on a file of a daemon.
pub fn flock(f: &Arc<OpenFile>, op: i32) -> i64 {
    let typ = match op & !libc::LOCK_NB {
        libc::LOCK_SH => libc::F_RDLCK,
        libc::LOCK_EX => libc::F_WRLCK,
        libc::LOCK_UN => libc::F_UNLCK,
        _ => return err(Errno::EINVAL),
    };
    let (Some(fh), Some(owner)) = (f.handle(), super::shared::description_owner(f)) else {
        return err(Errno::EBADF);
    };
    let lk = abi::fuse_file_lock {
        start: 0,
        end: u64::MAX,
        typ: typ as u32,
        pid: process::getpid() as u32,
    };
    let sleep = op & libc::LOCK_NB == 0 && typ != libc::F_UNLCK;
    match f.vfs().client().setlk(f.node(), fh, owner, &lk, sleep, true) {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

/// fcntl F_GETLK, F_SETLK(W) and their OFD forms on a file of a daemon.
pub fn fcntl(f: &Arc<OpenFile>, cmd: i32, arg: i64) -> i64 {
    let ofd = matches!(cmd, libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW);
    // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
    let mut fl: libc::flock = match unsafe { user::get(arg) } {
        Ok(fl) => fl,
        Err(e) => return err(e),
    };
    if ofd && fl.l_pid != 0 {
        return err(Errno::EINVAL);
    }
    let typ = i32::from(fl.l_type);
    if !matches!(typ, libc::F_RDLCK | libc::F_WRLCK | libc::F_UNLCK) {
        return err(Errno::EINVAL);
    }
    let (start, end) = match range(f, &fl) {
        Ok(r) => r,
        Err(e) => return err(e),
    };
    let Some(fh) = f.handle() else { return err(Errno::EBADF) };
    let owner = if ofd {
        match super::shared::description_owner(f) {
            Some(o) => o,
            None => return err(Errno::EBADF),
        }
    } else {
        owner()
    };
    let pid = process::getpid() as u32;
    let lk = abi::fuse_file_lock {
        start,
        end,
        typ: typ as u32,
        pid,
    };
    let client = f.vfs().client();
    if matches!(cmd, libc::F_GETLK | libc::F_OFD_GETLK) {
        if typ == libc::F_UNLCK {
            return err(Errno::EINVAL);
        }
        return match client.getlk(f.node(), fh, owner, &lk) {
            Ok(got) if got.typ as i32 == libc::F_UNLCK => {
                fl.l_type = libc::F_UNLCK as i16;
                // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
                res(unsafe { user::put(arg, &fl) }.map(|()| 0i64))
            }
            Ok(got) => {
                fl.l_type = got.typ as i16;
                fl.l_whence = libc::SEEK_SET as i16;
                fl.l_start = got.start as i64;
                fl.l_len = if got.end == u64::MAX {
                    0
                } else {
                    (got.end - got.start + 1) as i64
                };
                // An OFD lock has no process (the kernel says -1).
                fl.l_pid = if got.pid == 0 { -1 } else { got.pid as i32 };
                // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
                res(unsafe { user::put(arg, &fl) }.map(|()| 0i64))
            }
            Err(e) => err(e),
        };
    }
    // As the kernel: a read lock needs a readable descriptor, a write lock
    // a writable one.
    let acc = f.flags() & libc::O_ACCMODE;
    if (typ == libc::F_RDLCK && acc == libc::O_WRONLY) || (typ == libc::F_WRLCK && acc == libc::O_RDONLY) {
        return err(Errno::EBADF);
    }
    let sleep = matches!(cmd, libc::F_SETLKW | libc::F_OFD_SETLKW) && typ != libc::F_UNLCK;
    let lk = abi::fuse_file_lock {
        pid: if ofd { 0 } else { pid },
        ..lk
    };
    match client.setlk(f.node(), fh, owner, &lk, sleep, false) {
        Ok(()) => {
            if !ofd && typ != libc::F_UNLCK {
                let mut l = LOCKED.lock().unpoison();
                if !l.contains(&key(f)) {
                    l.push(key(f));
                }
            }
            0
        }
        Err(e) => err(e),
    }
}

/// The absolute byte range `[start, end]` of a `struct flock`.
fn range(f: &OpenFile, fl: &libc::flock) -> Result<(u64, u64), Errno> {
    let base = match i32::from(fl.l_whence) {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => f.offset() as i64,
        libc::SEEK_END => f.stat()?.size as i64,
        _ => return Err(Errno::EINVAL),
    };
    let start = base.checked_add(fl.l_start).ok_or(Errno::EOVERFLOW)?;
    let (start, end) = match fl.l_len {
        0 => (start, u64::MAX as i128),
        n if n > 0 => (start, i128::from(start) + i128::from(n) - 1),
        n => (start + n, i128::from(start) - 1),
    };
    if start < 0 || end < i128::from(start) {
        return Err(Errno::EINVAL);
    }
    Ok((start as u64, end.min(u64::MAX as i128) as u64))
}

/// A descriptor of `f` was closed by this process: its POSIX locks on the
/// file go (see the module doc).
pub fn closed(f: &OpenFile) {
    if f.kernel_backed() || f.file_type() != FileType::Regular {
        return;
    }
    if remote(f) {
        let held = {
            let mut l = LOCKED.lock().unpoison();
            let before = l.len();
            l.retain(|k| *k != key(f));
            l.len() != before
        };
        if let (true, Some(fh)) = (held, f.handle()) {
            let lk = abi::fuse_file_lock {
                start: 0,
                end: u64::MAX,
                typ: libc::F_UNLCK as u32,
                pid: 0,
            };
            let _ = f.vfs().client().setlk(f.node(), fh, owner(), &lk, false, false);
        }
    } else if let Some(fd) = f.lock_inode_fd() {
        let mut fl: libc::flock = user::zeroed();
        fl.l_type = libc::F_UNLCK as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        // SAFETY: a `struct flock` of ours on the stack, alive across the call.
        unsafe {
            raw(
                libc::SYS_fcntl,
                i64::from(fd),
                i64::from(libc::F_SETLK),
                &fl as *const libc::flock as i64,
                0,
                0,
                0,
            )
        };
    }
}
