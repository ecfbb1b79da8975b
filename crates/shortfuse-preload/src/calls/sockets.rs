//! Unix sockets named by a path in a mount (bind, connect).
//!
//! The kernel makes and finds a socket's name itself, so a path in a mount
//! means nothing to it: an absolute one would fail (ENOENT) or, where the
//! mount point is a real directory, name a file under it, outside the
//! mount. Such a path is given to the kernel as the backing directory's
//! where the mount has one (passthrough, in process or a daemon's): the
//! socket file is then in the mount and every program, with or without the
//! shim, connects to it. A relative path there already starts at the
//! backing directory (the kernel's current directory, see
//! `kernel_cwd_inside`). A mount without one (mem) has no kernel directory
//! to hold a socket: bind fails with EOPNOTSUPP and connect with
//! ECONNREFUSED, never reaching a path outside the mount. A daemon's mount
//! that is also a kernel mount needs nothing: its paths are the kernel's.
#![allow(unsafe_code)] // the program's memory, through `user`

use shortfuse::sync::Unpoison;
use shortfuse::Errno;

use super::table::{Fd, Ptr};
use crate::state;
use crate::sys::raw;
use crate::user;

/// Where `sun_path` starts in a `sockaddr_un`.
const PATH_AT: usize = 2;

/// Serves bind and connect of a Unix socket to a path in a mount: `None`
/// lets the kernel take the call as it is.
pub fn call(fd: Fd, addr: Ptr, len: u32, bind: bool) -> Option<i64> {
    let len = len as usize;
    if len <= PATH_AT || len > std::mem::size_of::<libc::sockaddr_un>() {
        return None;
    }
    // A bad address is the kernel's to refuse.
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let addr = unsafe { user::slice(addr.0, len) }.ok()?;
    if u16::from_ne_bytes([addr[0], addr[1]]) != libc::AF_UNIX as u16 {
        return None;
    }
    let raw_path = &addr[PATH_AT..];
    let path = &raw_path[..raw_path.iter().position(|&b| b == 0).unwrap_or(raw_path.len())];
    // Empty: autobind; a leading NUL: the abstract namespace.
    if path.is_empty() {
        return None;
    }
    let abs = if path.starts_with(b"/") {
        shortfuse_vfs::normalize(path)
    } else {
        let cwd = state().cwd.lock().unpoison().clone();
        let (vfs, here) = cwd?;
        let mut p = here.host_path(&vfs);
        p.push(b'/');
        p.extend_from_slice(path);
        shortfuse_vfs::normalize(&p)
    };
    let (vfs, rest) = super::resolve::mount_of(&abs)?;
    if super::unserved::kernel_mounted(&vfs) {
        return None;
    }
    let refused = || {
        let e = if bind { Errno::EOPNOTSUPP } else { Errno::ECONNREFUSED };
        Some(super::reply::err(e))
    };
    let Some(src) = vfs.source() else {
        return refused();
    };
    if !path.starts_with(b"/") {
        // The kernel's current directory is the backing one.
        return None;
    }
    let rest = if rest.is_empty() { b"/".as_slice() } else { rest };
    let backing = super::exec::backing_path(src, rest);
    let mut un: libc::sockaddr_un = user::zeroed();
    un.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // backing ends with its NUL.
    if backing.len() > un.sun_path.len() {
        return Some(super::reply::err(Errno::ENAMETOOLONG));
    }
    for (d, &s) in un.sun_path.iter_mut().zip(&backing) {
        *d = s as libc::c_char;
    }
    let n = (PATH_AT + backing.len()) as i64;
    // SAFETY: the program's bind or connect on its own socket, with a
    // sockaddr_un of ours (alive across the call, `n` its length) in place
    // of its address.
    #[allow(unsafe_code)]
    let nr = if bind { libc::SYS_bind } else { libc::SYS_connect };
    let r = unsafe { raw(nr, i64::from(fd.0), &un as *const libc::sockaddr_un as i64, n, 0, 0, 0) };
    Some(r)
}
