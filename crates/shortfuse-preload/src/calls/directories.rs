//! The current directory (chdir, fchdir, getcwd: ours when it is inside a
//! mount, with the kernel's kept somewhere safe) and directory listings.
#![allow(unsafe_code)] // the program's memory, through `user`

use shortfuse::sync::Unpoison;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use shortfuse::Errno;
use shortfuse_vfs::Vfs;

use super::exec;
use super::reply::{err, res};
use super::resolve::{file, resolve, with_nul, Resolved};
use super::table::{Fd, Ptr};
use super::unserved;
use crate::state;
use crate::sys::{fs, process};
use crate::user;

pub fn getdents(fd: Fd, buf: Ptr, len: usize) -> Option<i64> {
    let f = file(fd)?;
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    Some(res(unsafe { user::slice_mut(buf.0, len) }
        .and_then(|b| f.getdents64(b))
        .map(|n| n as i64)))
}

pub fn fchdir(fd: Fd) -> Option<i64> {
    let Some(f) = file(fd) else {
        let r = fs::fchdir(fd.0);
        if r == 0 {
            follow_kernel_cwd();
        }
        return Some(r);
    };
    let Some(loc) = super::resolve::location_of(fd.0, &f) else {
        return Some(err(Errno::ENOTDIR));
    };
    set_cwd(Some((f.vfs().clone(), loc)));
    Some(0)
}

pub fn getcwd(buf: Ptr, len: usize) -> Option<i64> {
    let cwd = state().cwd.lock().unpoison().clone();
    let (vfs, loc) = cwd?;
    // As the kernel: a removed current directory has no path.
    match vfs.getattr_fresh(loc.node(), None) {
        Ok(a) if a.nlink == 0 => return Some(err(Errno::ENOENT)),
        Err(e) => return Some(err(e)),
        Ok(_) => {}
    }
    let p = vfs.host_path(&loc);
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let buf = match unsafe { user::slice_mut(buf.0, len) } {
        Ok(b) => b,
        Err(e) => return Some(err(e)),
    };
    if buf.len() < p.len() + 1 {
        return Some(err(Errno::ERANGE));
    }
    buf[..p.len()].copy_from_slice(&p);
    buf[p.len()] = 0;
    Some(p.len() as i64 + 1)
}

fn set_cwd(new: Option<(Arc<Vfs>, shortfuse_vfs::Location)>) {
    let st = state();
    if let Some((vfs, loc)) = &new {
        vfs.pin_location(loc);
        kernel_cwd_inside(vfs, loc);
    }
    let old = std::mem::replace(&mut *st.cwd.lock().unpoison(), new);
    if let Some((vfs, loc)) = old {
        vfs.unpin_location(&loc);
    }
}

/// Points the kernel's current directory, which relative paths of calls we
/// do not serve start at (a program the shim does not reach, a statically
/// linked one, all of its calls), at a safe place while ours is `loc` in
/// `vfs`: the backing directory of a mount that has one (a static program
/// then works in the mount's source), the directory itself where a
/// daemon's mount point is mounted in the kernel too, else an empty
/// directory where nothing can be created ([`enter_dead_directory`]). Never the directory
/// the program left to enter the mount.
pub(crate) fn kernel_cwd_inside(vfs: &Vfs, loc: &shortfuse_vfs::Location) {
    if let Some(src) = vfs.source() {
        let rest = if loc.is_root() {
            b"/".to_vec()
        } else {
            loc.path().to_vec()
        };
        let p = exec::backing_path(src, &rest);
        if fs::chdir(&p) == 0 {
            return;
        }
    } else if unserved::kernel_mounted(vfs) {
        // A daemon's mount in the kernel: the very directory.
        let p = with_nul(vfs.host_path(loc));
        if fs::chdir(&p) == 0 {
            return;
        }
    }
    enter_dead_directory();
}

/// Makes the kernel's current directory an empty directory that has been
/// removed, below two more removed ones: creating anything there, or one
/// or two levels up, fails (ENOENT, for root too), and it lists empty.
/// Raw system calls and a stack buffer only (a vfork child calls it).
pub(crate) fn enter_dead_directory() {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut buf = [0u8; 96];
    let mut len = 0;
    fn put(buf: &mut [u8], len: &mut usize, b: &[u8]) {
        buf[*len..*len + b.len()].copy_from_slice(b);
        *len += b.len();
    }
    put(&mut buf, &mut len, b"/tmp/.shortfuse-cwd-");
    let pid = process::getpid() as u64;
    for (i, n) in [pid, NEXT.fetch_add(1, Ordering::Relaxed)].into_iter().enumerate() {
        if i > 0 {
            put(&mut buf, &mut len, b"-");
        }
        let mut digits = [0u8; 20];
        let mut k = digits.len();
        let mut n = n;
        loop {
            k -= 1;
            digits[k] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        put(&mut buf, &mut len, &digits[k..]);
    }
    let mut ends = [0usize; 3];
    for (level, end) in ends.iter_mut().enumerate() {
        if level > 0 {
            put(&mut buf, &mut len, b"/d");
        }
        *end = len;
        buf[len] = 0;
        if fs::mkdir(&buf[..=len], 0o500) < 0 {
            // Nothing to stand in (no /tmp): take back what was made.
            for &e in ends[..level].iter().rev() {
                buf[e] = 0;
                fs::rmdir(&buf[..=e]);
            }
            return;
        }
    }
    fs::chdir(&buf[..=len]);
    for &e in ends.iter().rev() {
        buf[e] = 0;
        fs::rmdir(&buf[..=e]);
    }
}

/// The kernel's current directory changed: remember it, leave the mount's.
fn follow_kernel_cwd() {
    let mut buf = vec![0u8; 4096];
    let n = fs::getcwd(&mut buf);
    if n > 0 {
        buf.truncate(n as usize - 1);
        *state().host_cwd.lock().unpoison() = buf;
    }
    set_cwd(None);
}

/// chdir: ours, or the kernel's (then our idea of the cwd follows it).
pub fn chdir(path: Ptr) -> Option<i64> {
    Some(chdir_to(path))
}

fn chdir_to(arg: Ptr) -> i64 {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = match unsafe { user::cstr(arg.0) } {
        Ok(p) => p,
        Err(e) => return err(e),
    };
    let kernel = |p: Option<Vec<u8>>| {
        let r = fs::chdir(&p.unwrap_or_else(|| with_nul(path.to_vec())));
        if r == 0 {
            follow_kernel_cwd();
        }
        r
    };
    match resolve(libc::AT_FDCWD, path, true) {
        Err(e) => err(e),
        Ok(Resolved::Kernel(p)) => kernel(p),
        Ok(Resolved::Ours(vfs, t)) => res(vfs.chdir(&t).map(|loc| {
            set_cwd(Some((vfs.clone(), loc)));
            0i64
        })),
    }
}
