//! Calls on descriptors of ours: data transfers, seeks, syncs, the
//! descriptor table (close, dup, fcntl) and locks.
#![allow(unsafe_code)] // the program's memory, through `user`

use shortfuse::Errno;
use shortfuse_vfs::OpenFile;

use super::kernel;
use super::locks::{self, owner};
use super::reply::{done, err, res};
use super::resolve::file;
use super::shared;
use super::spare;
use super::table::{Direction, Fd, Offset, Ptr, Regs};
use crate::state;
use crate::sys::{fs, raw};
use crate::user;

pub fn read(fd: Fd, buf: Ptr, len: usize) -> Option<i64> {
    let f = file(fd)?;
    Some(res(into(&f, buf.0, len, None).map(|n| n as i64)))
}

/// Reads up to `len` bytes into the program's buffer at `p`, at `off` or
/// the shared offset. A buffer the program cannot have written fails as
/// the kernel's copy to it does, late: the file's own errors come first
/// (EBADF on a descriptor not open for reading, EISDIR), and a read with
/// nothing to copy (at the end of the file) returns 0; only a byte to
/// copy makes it EFAULT. The offset stays where it was.
fn into(f: &OpenFile, p: i64, len: usize, off: Option<u64>) -> Result<usize, Errno> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let b = match unsafe { user::slice_mut(p, len) } {
        Ok(b) => b,
        Err(fault) => {
            let at = match off {
                Some(o) => o,
                None => f.lseek(0, libc::SEEK_CUR)?,
            };
            return match f.pread(&mut [0u8; 1], at)? {
                0 => Ok(0),
                _ => Err(fault),
            };
        }
    };
    match off {
        Some(o) => f.pread(b, o),
        None => f.read(b),
    }
}

pub fn write(fd: Fd, buf: Ptr, len: usize) -> Option<i64> {
    let f = file(fd)?;
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    Some(res(unsafe { user::slice(buf.0, len) }
        .and_then(|b| f.write(b))
        .map(|n| n as i64)))
}

pub fn pread(fd: Fd, buf: Ptr, len: usize, off: i64) -> Option<i64> {
    let f = file(fd)?;
    if off < 0 {
        return Some(err(Errno::EINVAL));
    }
    Some(res(into(&f, buf.0, len, Some(off as u64)).map(|n| n as i64)))
}

pub fn pwrite(fd: Fd, buf: Ptr, len: usize, off: i64) -> Option<i64> {
    let f = file(fd)?;
    if off < 0 {
        return Some(err(Errno::EINVAL));
    }
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    Some(res(unsafe { user::slice(buf.0, len) }
        .and_then(|b| f.pwrite(b, off as u64))
        .map(|n| n as i64)))
}

/// The kernel's UIO_MAXIOV: readv and its kin refuse more buffers.
const IOV_MAX: i64 = 1024;

/// readv/writev/preadv/pwritev and the `2` forms: one request per buffer,
/// stopping at the first short transfer; an error after some bytes moved
/// reports the bytes.
pub fn vectored(fd: Fd, iov: Ptr, iovcnt: i64, dir: Direction, at: Offset) -> Option<i64> {
    let f = file(fd)?;
    let at = match at {
        Offset::Current => None,
        Offset::At(off) if off < 0 => return Some(err(Errno::EINVAL)),
        Offset::At(off) => Some(off as u64),
    };
    Some(transfer(&f, iov, iovcnt, dir, at))
}

fn transfer(f: &OpenFile, iov: Ptr, n: i64, dir: Direction, at: Option<u64>) -> i64 {
    if !(0..=IOV_MAX).contains(&n) {
        return err(Errno::EINVAL);
    }
    let mut total = 0i64;
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let iov = match unsafe { user::iovecs(iov.0, n) } {
        Ok(v) => v,
        Err(e) => return err(e),
    };
    for v in iov {
        let (base, len) = (v.iov_base as i64, v.iov_len);
        let r = match (dir, at) {
            (Direction::Read, None) => into(f, base, len, None),
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            (Direction::Write, None) => unsafe { user::slice(base, len) }.and_then(|b| f.write(b)),
            (Direction::Read, Some(off)) => into(f, base, len, Some(off + total as u64)),
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            (Direction::Write, Some(off)) => {
                unsafe { user::slice(base, len) }.and_then(|b| f.pwrite(b, off + total as u64))
            }
        };
        match r {
            Ok(got) => {
                total += got as i64;
                if got < v.iov_len {
                    break;
                }
            }
            Err(e) if total == 0 => return err(e),
            Err(_) => break,
        }
    }
    total
}

pub fn lseek(fd: Fd, off: i64, whence: i32) -> Option<i64> {
    let f = file(fd)?;
    Some(res(f.lseek(off, whence).map(|n| n as i64)))
}

pub fn ftruncate(fd: Fd, len: i64) -> Option<i64> {
    let f = file(fd)?;
    if len < 0 {
        return Some(err(Errno::EINVAL));
    }
    Some(done(f.truncate(len as u64)))
}

pub fn fsync(fd: Fd, data_only: bool) -> Option<i64> {
    let f = file(fd)?;
    Some(done(f.fsync(data_only)))
}

pub fn fallocate(fd: Fd, mode: i32, off: i64, len: i64) -> Option<i64> {
    let f = file(fd)?;
    if off < 0 || len <= 0 {
        return Some(err(Errno::EINVAL));
    }
    Some(done(f.fallocate(mode, off as u64, len as u64)))
}

/// fadvise64, sync_file_range: nothing for the file system to do.
pub fn advise(fd: Fd) -> Option<i64> {
    file(fd)?;
    Some(0)
}

/// FIONREAD; no other ioctl is served on a mount file (FICLONE, FS_IOC_*,
/// TCGETS): the answer of a file without them.
pub fn ioctl(regs: Regs, fd: Fd) -> Option<i64> {
    let f = file(fd)?;
    Some(kernel::ioctl(&f, regs.a))
}

pub fn mmap(regs: Regs, fd: Fd, flags: i32) -> Option<i64> {
    let f = file(fd)?;
    if flags & libc::MAP_ANONYMOUS != 0 {
        return None;
    }
    Some(kernel::mmap(&f, regs.a))
}

/// copy_file_range, sendfile, splice with a descriptor of ours on a side.
pub fn copy(regs: Regs, out: Fd, input: Fd) -> Option<i64> {
    if file(out).is_none() && file(input).is_none() {
        return None;
    }
    kernel::copy(regs.nr, regs.a)
}

pub fn close(fd: Fd) -> Option<i64> {
    let f = file(fd)?;
    let lock_owner = if f.needs_flush() { owner() } else { 0 };
    locks::closed(&f);
    // A kernel-backed or shared description's close must reach the kernel
    // now; a bare placeholder may wait for the next open.
    let placeholder = !f.kernel_backed() && f.shared().is_none();
    if f.beneath_map() && f.flags() & libc::O_ACCMODE != libc::O_RDONLY {
        // Written through the kernel: the next open (or a walk) asks the
        // file system for the attributes again.
        f.vfs()
            .drop_cached_path(f.path().strip_prefix(b"/").unwrap_or(f.path()));
    }
    drop(f);
    let (r, cloexec) = state().fds.close_with_cloexec(fd.0, lock_owner)?;
    spare::close(fd.0, placeholder, cloexec);
    Some(done(r))
}

pub fn close_range(first: u32, last: u32, flags: u32) -> Option<i64> {
    let st = state();
    let _swaps = shared::descriptors();
    let r = fs::close_range(first, last, flags);
    let range = first..=last;
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC == 0 {
        for (fd, _) in st.fds.fds() {
            if range.contains(&(fd as u32)) {
                if let Some(f) = st.fds.get(fd) {
                    locks::closed(&f);
                }
            }
        }
        st.fds.close_range(first, last, owner());
    } else if r == 0 {
        for (fd, _) in st.fds.fds() {
            if range.contains(&(fd as u32)) {
                let _ = st.fds.set_cloexec(fd, true);
            }
        }
    }
    Some(r)
}

pub fn dup(fd: Fd) -> Option<i64> {
    file(fd)?;
    let _swaps = shared::descriptors();
    let new = fs::dup(fd.0);
    if new >= 0 {
        let _ = state().fds.dup(fd.0, new as i32, false);
    }
    Some(new)
}

/// dup2 (`flags` None) and dup3.
pub fn dup3(old: Fd, new: Fd, flags: Option<i32>) -> Option<i64> {
    let ours_old = file(old).is_some();
    let ours_new = file(new).is_some();
    if !ours_old && !ours_new {
        return None;
    }
    let st = state();
    let _swaps = shared::descriptors();
    let r = match flags {
        None => fs::dup2(old.0, new.0),
        Some(fl) => fs::dup3(old.0, new.0, fl),
    };
    if r >= 0 && old != new {
        if let Some(f) = file(new).filter(|_| ours_new) {
            locks::closed(&f);
        }
        if ours_new && !ours_old {
            st.fds.close(new.0, owner());
        } else if let Ok(Some(replaced)) = st.fds.dup(old.0, new.0, flags.unwrap_or(0) & libc::O_CLOEXEC != 0) {
            let _ = replaced.flush(owner());
        }
    }
    Some(r)
}

pub fn fcntl(fd: Fd, cmd: i32, arg: i64) -> Option<i64> {
    let f = file(fd)?;
    let st = state();
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let _swaps = shared::descriptors();
            let new = fs::fcntl_int(fd.0, cmd, arg);
            if new >= 0 {
                let _ = st.fds.dup(fd.0, new as i32, cmd == libc::F_DUPFD_CLOEXEC);
            }
            Some(new)
        }
        // The kernel forces O_LARGEFILE on every open of a 64-bit process.
        libc::F_GETFL => Some(i64::from((f.flags() & !libc::O_CLOEXEC) | libc::O_LARGEFILE)),
        libc::F_SETFL => {
            f.set_flags(arg as i32);
            Some(0)
        }
        libc::F_SETFD => {
            let _swaps = shared::descriptors();
            let r = fs::fcntl_int(fd.0, cmd, arg);
            if r == 0 {
                let _ = st.fds.set_cloexec(fd.0, arg as i32 & libc::FD_CLOEXEC != 0);
            }
            Some(r)
        }
        libc::F_GETFD => None,
        libc::F_GETLK | libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW
            if locks::remote(&f) =>
        {
            Some(locks::fcntl(&f, cmd, arg))
        }
        libc::F_GETLK | libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW => {
            if crate::page0::faults(libc::SYS_fcntl, &[fd.0 as i64, cmd as i64, arg, 0, 0, 0]) {
                return Some(err(Errno::EFAULT));
            }
            Some(match f.lock_fd() {
                // SAFETY: the program's own `struct flock` argument, handed
                // on as it gave it: the kernel checks it as it would have.
                #[allow(unsafe_code)]
                Ok(l) => unsafe { fs::fcntl_lock(l, cmd, arg) },
                Err(e) => err(e),
            })
        }
        // Leases, notifications, pipe sizes, seals: not for a placeholder
        // to answer for a file it does not stand for.
        _ => Some(err(Errno::EINVAL)),
    }
}

pub fn flock(fd: Fd, op: i32) -> Option<i64> {
    let f = file(fd)?;
    if locks::remote(&f) {
        return Some(locks::flock(&f, op));
    }
    Some(match f.lock_fd() {
        Ok(l) => fs::flock(l, op),
        Err(e) => err(e),
    })
}

/// Where descriptors of our own code go (see [`nested`]): above the small
/// numbers programs pick themselves (shells use 3 to 9 for `exec N>`, and
/// save descriptors at 10 and up with F_DUPFD, which finds free ones).
pub const OWN_FD_FLOOR: i64 = shortfuse_fs::registry::IN_PROCESS_FD_FLOOR as i64;

/// A system call made by our own code (the in-process file system, the
/// allocator) while it serves one of the program's. Runs it, and moves a
/// descriptor it creates above [`OWN_FD_FLOOR`]: the file system's
/// descriptors live in the program's table, and a program picks some
/// numbers itself (`exec 3> f` in a shell is `dup2(fd, 3)`, after probing 3
/// with `fcntl(F_GETFD)`; `closefrom(3)`), which must never be ours.
///
/// The hook in lib.rs calls it for every call it passes on while a call
/// is served (with the zpoline entry; under Syscall User Dispatch alone the
/// selector lets such calls reach the kernel directly, and their
/// descriptors stay where the kernel put them). `mounts::Fence` keeps the
/// descriptors opened while the mounts are built high.
///
/// # Safety
///
/// `nr` and `a` are a system call of our own code, as it made it (its
/// contract is the caller's, as for [`crate::sys::raw`]).
#[allow(unsafe_code)]
pub unsafe fn nested(nr: i64, a: [i64; 6]) -> i64 {
    // SAFETY: the caller's contract (see above).
    let r = unsafe { raw(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    let creates = match nr {
        libc::SYS_open | libc::SYS_openat | libc::SYS_openat2 | libc::SYS_creat | libc::SYS_dup => true,
        libc::SYS_fcntl => matches!(a[1] as i32, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC),
        libc::SYS_socket | libc::SYS_memfd_create | libc::SYS_eventfd2 | libc::SYS_epoll_create1 => true,
        _ => false,
    };
    if !creates || r < 0 {
        return r;
    }
    let floor = OWN_FD_FLOOR;
    if r >= floor {
        return r;
    }
    let low = r as i32;
    // SAFETY: the call succeeded with these arguments of our own code.
    let cloexec = unsafe { closes_on_exec(nr, &a) }.unwrap_or_else(|| {
        let flags = fs::fcntl_int(low, libc::F_GETFD, 0);
        flags > 0 && flags & i64::from(libc::FD_CLOEXEC) != 0
    });
    let cmd = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
    let high = fs::fcntl_int(low, cmd, floor);
    if high < 0 {
        // No room up there (a tiny limit): keep the low number.
        return r;
    }
    fs::close(low);
    high
}

/// Whether the descriptor that call `nr` made is close-on-exec, as its own
/// arguments say (an open's flags, the command of a dup by fcntl); None
/// where only the kernel knows, to be asked with F_GETFD. Spares a system
/// call for every directory the namespace maps keep and every file the
/// in-process file systems open.
///
/// # Safety
///
/// `nr` and `a` are a call of our own code that succeeded: an openat2's
/// `struct open_how` is ours and the kernel has read its flags.
#[allow(unsafe_code)]
unsafe fn closes_on_exec(nr: i64, a: &[i64; 6]) -> Option<bool> {
    let cloexec = i64::from(libc::O_CLOEXEC);
    match nr {
        libc::SYS_open => Some(a[1] & cloexec != 0),
        libc::SYS_openat => Some(a[2] & cloexec != 0),
        // SAFETY: the caller's contract: `open_how` starts with the flags,
        // a u64, which the kernel read.
        libc::SYS_openat2 => Some(unsafe { core::ptr::read_unaligned(a[2] as *const u64) } as i64 & cloexec != 0),
        // Neither ever makes a close-on-exec descriptor.
        libc::SYS_creat | libc::SYS_dup => Some(false),
        libc::SYS_fcntl => Some(a[1] as i32 == libc::F_DUPFD_CLOEXEC),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT_FDCWD: i64 = libc::AT_FDCWD as i64;

    #[test]
    fn nested_descriptors_move_above_the_programs_numbers() {
        let flags = i64::from(libc::O_RDONLY | libc::O_CLOEXEC);
        // SAFETY (the three nested calls): an open of a literal path and a
        // dup, as our own code would make them.
        #[allow(unsafe_code)]
        let nested = |nr, a| unsafe { nested(nr, a) };
        let fd = nested(
            libc::SYS_openat,
            [AT_FDCWD, c"/dev/null".as_ptr() as i64, flags, 0, 0, 0],
        );
        let floor = OWN_FD_FLOOR;
        assert!(fd >= floor, "fd {fd} below {floor}");
        let fdflags = fs::fcntl_int(fd as i32, libc::F_GETFD, 0);
        assert_eq!(fdflags & i64::from(libc::FD_CLOEXEC), i64::from(libc::FD_CLOEXEC));
        let dup = nested(libc::SYS_dup, [fd, 0, 0, 0, 0, 0]);
        assert!(dup >= floor && dup != fd);
        // Moved up with the close-on-exec flag the call gave it, or not.
        let cloexec = |fd: i64| fs::fcntl_int(fd as i32, libc::F_GETFD, 0) & i64::from(libc::FD_CLOEXEC) != 0;
        assert!(!cloexec(dup));
        let kept = nested(
            libc::SYS_openat,
            [
                AT_FDCWD,
                c"/dev/null".as_ptr() as i64,
                i64::from(libc::O_RDONLY),
                0,
                0,
                0,
            ],
        );
        assert!(kept >= floor && !cloexec(kept));
        let how: [u64; 3] = [(libc::O_PATH | libc::O_CLOEXEC) as u64, 0, 0];
        let path = nested(
            libc::SYS_openat2,
            [AT_FDCWD, c"/dev".as_ptr() as i64, how.as_ptr() as i64, 24, 0, 0],
        );
        assert!(path >= floor && cloexec(path));
        fs::close(kept as i32);
        fs::close(path as i32);
        // Failures pass through.
        let bad = nested(
            libc::SYS_openat,
            [AT_FDCWD, c"/nonexistent/x".as_ptr() as i64, flags, 0, 0, 0],
        );
        assert_eq!(bad, -i64::from(libc::ENOENT));
        fs::close(fd as i32);
        fs::close(dup as i32);
    }
}
