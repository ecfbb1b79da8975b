//! File and descriptor calls (rustix's `fs` and `io` families) with typed
//! arguments: descriptors are `i32`, paths NUL-terminated byte strings,
//! buffers slices of memory the caller owns. Each returns what the kernel returns: a value,
//! or a negated errno. Calls that hand the kernel memory of the program
//! are `unsafe`.

use std::ffi::CStr;

use super::raw;

/// The address of a path for the kernel: `p` must end in a NUL (the
/// kernel reads up to the first one); EINVAL otherwise, with nothing read.
fn path(p: &[u8]) -> Result<i64, i64> {
    if p.last() == Some(&0) {
        Ok(p.as_ptr() as i64)
    } else {
        Err(-i64::from(libc::EINVAL))
    }
}

fn fd(fd: i32) -> i64 {
    i64::from(fd)
}

// SAFETY (every call below): the arguments are descriptors, numbers, and
// paths and buffers borrowed for the call from memory the caller owns,
// with their lengths; the kernel writes nothing beyond them.
#[allow(unsafe_code)]
mod calls {
    use super::*;

    pub fn openat(dirfd: i32, p: &[u8], flags: i32, mode: u32) -> i64 {
        let (f, m) = (i64::from(flags), i64::from(mode));
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_openat, fd(dirfd), p, f, m, 0, 0) },
            Err(e) => e,
        }
    }

    pub fn close(d: i32) -> i64 {
        unsafe { raw(libc::SYS_close, fd(d), 0, 0, 0, 0, 0) }
    }

    pub fn close_range(first: u32, last: u32, flags: u32) -> i64 {
        let (f, l, fl) = (i64::from(first), i64::from(last), i64::from(flags));
        unsafe { raw(libc::SYS_close_range, f, l, fl, 0, 0, 0) }
    }

    pub fn dup(d: i32) -> i64 {
        unsafe { raw(libc::SYS_dup, fd(d), 0, 0, 0, 0, 0) }
    }

    pub fn dup2(old: i32, new: i32) -> i64 {
        unsafe { raw(libc::SYS_dup2, fd(old), fd(new), 0, 0, 0, 0) }
    }

    pub fn dup3(old: i32, new: i32, flags: i32) -> i64 {
        unsafe { raw(libc::SYS_dup3, fd(old), fd(new), i64::from(flags), 0, 0, 0) }
    }

    /// fcntl with an integer argument (F_DUPFD*, F_GETFD, F_SETFD,
    /// F_GETFL, F_SETFL...): nothing of memory.
    pub fn fcntl_int(d: i32, cmd: i32, arg: i64) -> i64 {
        debug_assert!(!is_lock_cmd(cmd));
        unsafe { raw(libc::SYS_fcntl, fd(d), i64::from(cmd), arg, 0, 0, 0) }
    }

    pub fn flock(d: i32, op: i32) -> i64 {
        unsafe { raw(libc::SYS_flock, fd(d), i64::from(op), 0, 0, 0, 0) }
    }

    pub fn fstat(d: i32, out: &mut libc::stat) -> i64 {
        unsafe { raw(libc::SYS_fstat, fd(d), out as *mut libc::stat as i64, 0, 0, 0, 0) }
    }

    pub fn lseek(d: i32, off: i64, whence: i32) -> i64 {
        unsafe { raw(libc::SYS_lseek, fd(d), off, i64::from(whence), 0, 0, 0) }
    }

    pub fn read(d: i32, buf: &mut [u8]) -> i64 {
        let (p, n) = (buf.as_mut_ptr() as i64, buf.len() as i64);
        unsafe { raw(libc::SYS_read, fd(d), p, n, 0, 0, 0) }
    }

    pub fn write(d: i32, buf: &[u8]) -> i64 {
        let (p, n) = (buf.as_ptr() as i64, buf.len() as i64);
        unsafe { raw(libc::SYS_write, fd(d), p, n, 0, 0, 0) }
    }

    pub fn pread(d: i32, buf: &mut [u8], off: u64) -> i64 {
        let (p, n) = (buf.as_mut_ptr() as i64, buf.len() as i64);
        unsafe { raw(libc::SYS_pread64, fd(d), p, n, off as i64, 0, 0) }
    }

    pub fn pwrite(d: i32, buf: &[u8], off: u64) -> i64 {
        let (p, n) = (buf.as_ptr() as i64, buf.len() as i64);
        unsafe { raw(libc::SYS_pwrite64, fd(d), p, n, off as i64, 0, 0) }
    }

    pub fn readlink(p: &[u8], buf: &mut [u8]) -> i64 {
        let (b, n) = (buf.as_mut_ptr() as i64, buf.len() as i64);
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_readlink, p, b, n, 0, 0, 0) },
            Err(e) => e,
        }
    }

    pub fn chdir(p: &[u8]) -> i64 {
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_chdir, p, 0, 0, 0, 0, 0) },
            Err(e) => e,
        }
    }

    pub fn fchdir(d: i32) -> i64 {
        unsafe { raw(libc::SYS_fchdir, fd(d), 0, 0, 0, 0, 0) }
    }

    pub fn getcwd(buf: &mut [u8]) -> i64 {
        let (p, n) = (buf.as_mut_ptr() as i64, buf.len() as i64);
        unsafe { raw(libc::SYS_getcwd, p, n, 0, 0, 0, 0) }
    }

    /// The old mask.
    pub fn umask(mask: u32) -> i64 {
        unsafe { raw(libc::SYS_umask, i64::from(mask), 0, 0, 0, 0, 0) }
    }

    pub fn mkdir(p: &[u8], mode: u32) -> i64 {
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_mkdir, p, i64::from(mode), 0, 0, 0, 0) },
            Err(e) => e,
        }
    }

    pub fn rmdir(p: &[u8]) -> i64 {
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_rmdir, p, 0, 0, 0, 0, 0) },
            Err(e) => e,
        }
    }

    pub fn renameat2(od: i32, old: &[u8], nd: i32, new: &[u8], flags: u32) -> i64 {
        let fl = i64::from(flags);
        match (path(old), path(new)) {
            (Ok(o), Ok(n)) => unsafe { raw(libc::SYS_renameat2, fd(od), o, fd(nd), n, fl, 0) },
            (Err(e), _) | (_, Err(e)) => e,
        }
    }

    pub fn linkat(od: i32, old: &[u8], nd: i32, new: &[u8], flags: i32) -> i64 {
        let fl = i64::from(flags);
        match (path(old), path(new)) {
            (Ok(o), Ok(n)) => unsafe { raw(libc::SYS_linkat, fd(od), o, fd(nd), n, fl, 0) },
            (Err(e), _) | (_, Err(e)) => e,
        }
    }

    pub fn inotify_add_watch(d: i32, p: &[u8], mask: u32) -> i64 {
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_inotify_add_watch, fd(d), p, i64::from(mask), 0, 0, 0) },
            Err(e) => e,
        }
    }

    pub fn fchmod(d: i32, mode: u32) -> i64 {
        unsafe { raw(libc::SYS_fchmod, fd(d), i64::from(mode), 0, 0, 0, 0) }
    }

    pub fn fchmodat(dirfd: i32, p: &[u8], mode: u32) -> i64 {
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_fchmodat, fd(dirfd), p, i64::from(mode), 0, 0, 0) },
            Err(e) => e,
        }
    }

    pub fn mkdirat(dirfd: i32, p: &[u8], mode: u32) -> i64 {
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_mkdirat, fd(dirfd), p, i64::from(mode), 0, 0, 0) },
            Err(e) => e,
        }
    }

    pub fn mknodat(dirfd: i32, p: &[u8], mode: u32, dev: u32) -> i64 {
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_mknodat, fd(dirfd), p, i64::from(mode), i64::from(dev), 0, 0) },
            Err(e) => e,
        }
    }

    pub fn unlinkat(dirfd: i32, p: &[u8], flags: i32) -> i64 {
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_unlinkat, fd(dirfd), p, i64::from(flags), 0, 0, 0) },
            Err(e) => e,
        }
    }

    pub fn newfstatat(dirfd: i32, p: &[u8], out: &mut libc::stat, flags: i32) -> i64 {
        let o = out as *mut libc::stat as i64;
        match path(p) {
            Ok(p) => unsafe { raw(libc::SYS_newfstatat, fd(dirfd), p, o, i64::from(flags), 0, 0) },
            Err(e) => e,
        }
    }

    pub fn memfd_create(name: &CStr, flags: u32) -> i64 {
        unsafe {
            raw(
                libc::SYS_memfd_create,
                name.as_ptr() as i64,
                i64::from(flags),
                0,
                0,
                0,
                0,
            )
        }
    }
}

pub use calls::*;

/// The fcntl commands whose argument points to a `struct flock`.
pub fn is_lock_cmd(cmd: i32) -> bool {
    matches!(
        cmd,
        libc::F_GETLK | libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW
    )
}

/// fcntl with a `struct flock` argument (`is_lock_cmd`).
///
/// # Safety
///
/// `lock` is the address of a `struct flock` that the kernel may read and,
/// for F_GETLK, write: the program's own argument, handed on as it gave it
/// (the kernel checks the address as it would have), or memory of ours.
#[allow(unsafe_code)]
pub unsafe fn fcntl_lock(d: i32, cmd: i32, lock: i64) -> i64 {
    // SAFETY: the caller vouches for `lock` (see above).
    unsafe { raw(libc::SYS_fcntl, fd(d), i64::from(cmd), lock, 0, 0, 0) }
}

/// linkat with the old path the program's own pointer.
///
/// # Safety
///
/// `old` is a path argument of the program, handed on as it gave it: the
/// kernel reads (and checks) it as it would have.
#[allow(unsafe_code)]
pub unsafe fn linkat_program(od: i32, old: i64, nd: i32, new: &[u8], flags: i32) -> i64 {
    match path(new) {
        // SAFETY: the caller vouches for `old` (see above); `new` ends in a NUL.
        Ok(n) => unsafe { raw(libc::SYS_linkat, fd(od), old, fd(nd), n, i64::from(flags), 0) },
        Err(e) => e,
    }
}
