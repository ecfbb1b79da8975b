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

/// Room for one SCM_RIGHTS message of up to `SCM_MAX_FD` descriptors,
/// aligned as a `cmsghdr`.
struct FdControl([u64; FdControl::WORDS]);

impl FdControl {
    /// The kernel's SCM_MAX_FD.
    const MAX: usize = 253;
    const WORDS: usize = (core::mem::size_of::<libc::cmsghdr>() + FdControl::MAX * 4).div_ceil(8);

    fn new() -> FdControl {
        FdControl([0; FdControl::WORDS])
    }

    /// Writes one SCM_RIGHTS header and `fds`; returns the control length.
    fn fill(&mut self, fds: &[i32]) -> Option<usize> {
        if fds.is_empty() || fds.len() > FdControl::MAX {
            return None;
        }
        let head = core::mem::size_of::<libc::cmsghdr>();
        let len = head + fds.len() * 4;
        let hdr = libc::cmsghdr {
            cmsg_len: len,
            cmsg_level: libc::SOL_SOCKET,
            cmsg_type: libc::SCM_RIGHTS,
        };
        let bytes = self.bytes_mut();
        // SAFETY: the buffer holds a header and MAX descriptors; `bytes` is 8-byte aligned.
        #[allow(unsafe_code)]
        unsafe {
            core::ptr::write(bytes.as_mut_ptr().cast::<libc::cmsghdr>(), hdr)
        };
        for (i, d) in fds.iter().enumerate() {
            bytes[head + i * 4..head + i * 4 + 4].copy_from_slice(&d.to_ne_bytes());
        }
        Some(len.div_ceil(8) * 8)
    }

    /// The descriptors of the first SCM_RIGHTS header the kernel wrote, into `out`.
    fn read(&self, msg: &libc::msghdr, out: &mut [i32]) -> usize {
        let head = core::mem::size_of::<libc::cmsghdr>();
        if msg.msg_controllen < head {
            return 0;
        }
        // SAFETY: the kernel wrote a header at the start of our aligned buffer.
        #[allow(unsafe_code)]
        let hdr = unsafe { core::ptr::read(self.0.as_ptr().cast::<libc::cmsghdr>()) };
        if hdr.cmsg_level != libc::SOL_SOCKET || hdr.cmsg_type != libc::SCM_RIGHTS || hdr.cmsg_len < head {
            return 0;
        }
        let n = ((hdr.cmsg_len - head) / 4).min(FdControl::MAX);
        let bytes = self.bytes();
        let mut got = 0;
        for i in 0..n {
            let d = i32::from_ne_bytes(bytes[head + i * 4..head + i * 4 + 4].try_into().unwrap_or([0xff; 4]));
            if got < out.len() {
                out[got] = d;
                got += 1;
            } else {
                // No room to say it: not to be leaked.
                close(d);
            }
        }
        got
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: plain integers seen as bytes, same length.
        #[allow(unsafe_code)]
        unsafe {
            core::slice::from_raw_parts(self.0.as_ptr().cast(), core::mem::size_of_val(&self.0))
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: plain integers seen as bytes, same length.
        #[allow(unsafe_code)]
        unsafe {
            core::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), core::mem::size_of_val(&self.0))
        }
    }
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

    /// A connected pair of local datagram sockets, close-on-exec.
    pub fn socketpair_dgram(out: &mut [i32; 2]) -> i64 {
        let ty = i64::from(libc::SOCK_DGRAM | libc::SOCK_CLOEXEC);
        unsafe {
            raw(
                libc::SYS_socketpair,
                i64::from(libc::AF_UNIX),
                ty,
                0,
                out.as_mut_ptr() as i64,
                0,
                0,
            )
        }
    }

    /// Sends `fds` (at most `SCM_MAX_FD`, 253) over the socket `d` in one
    /// message of one byte.
    pub fn send_fds(d: i32, fds: &[i32]) -> i64 {
        let mut byte = 0u8;
        let mut iov = libc::iovec {
            iov_base: (&mut byte as *mut u8).cast(),
            iov_len: 1,
        };
        let mut control = FdControl::new();
        let Some(len) = control.fill(fds) else {
            return -i64::from(libc::EINVAL);
        };
        // SAFETY (zeroed): a plain C struct, every field then set.
        let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = len;
        unsafe { raw(libc::SYS_sendmsg, fd(d), &msg as *const _ as i64, 0, 0, 0, 0) }
    }

    /// Receives one message from `d` and the descriptors it carries,
    /// close-on-exec, into `out`; returns how many (or a negated errno).
    pub fn recv_fds(d: i32, out: &mut [i32]) -> i64 {
        let mut byte = 0u8;
        let mut iov = libc::iovec {
            iov_base: (&mut byte as *mut u8).cast(),
            iov_len: 1,
        };
        let mut control = FdControl::new();
        // SAFETY (zeroed): a plain C struct, every field then set.
        let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = core::mem::size_of_val(&control.0);
        let flags = i64::from(libc::MSG_CMSG_CLOEXEC);
        let r = unsafe { raw(libc::SYS_recvmsg, fd(d), &mut msg as *mut _ as i64, flags, 0, 0, 0) };
        if r < 0 {
            return r;
        }
        control.read(&msg, out) as i64
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

    pub fn epoll_create1(flags: i32) -> i64 {
        unsafe { raw(libc::SYS_epoll_create1, i64::from(flags), 0, 0, 0, 0, 0) }
    }

    /// epoll_ctl with an event of ours (None: EPOLL_CTL_DEL's null).
    pub fn epoll_ctl(ep: i32, op: i32, d: i32, ev: Option<&libc::epoll_event>) -> i64 {
        let ev = ev.map_or(0, |e| e as *const libc::epoll_event as i64);
        unsafe { raw(libc::SYS_epoll_ctl, fd(ep), i64::from(op), fd(d), ev, 0, 0) }
    }

    /// ppoll on `fds`, for at most `left` (None: no limit), which the
    /// kernel leaves holding what was left of it, with the signal mask
    /// `mask` while it waits (None: the thread's own).
    pub fn ppoll(fds: &mut [libc::pollfd], left: Option<&mut libc::timespec>, mask: Option<&u64>) -> i64 {
        let left = left.map_or(0, |t| t as *mut libc::timespec as i64);
        let mask = mask.map_or(0, |m| m as *const u64 as i64);
        let n = fds.len() as i64;
        unsafe { raw(libc::SYS_ppoll, fds.as_mut_ptr() as i64, n, left, mask, 8, 0) }
    }

    /// pselect6 on the first `n` descriptors of the read, write and except
    /// sets (EINVAL for a set shorter than that), `left` and `mask` as for
    /// [`ppoll`].
    pub fn pselect6(
        n: i32,
        sets: [Option<&mut [u64]>; 3],
        left: Option<&mut libc::timespec>,
        mask: Option<&u64>,
    ) -> i64 {
        let bits = usize::try_from(n).unwrap_or(0);
        if sets.iter().flatten().any(|s| s.len() * 64 < bits) {
            return -i64::from(libc::EINVAL);
        }
        let [r, w, e] = sets.map(|s| s.map_or(0, |s| s.as_mut_ptr() as i64));
        let left = left.map_or(0, |t| t as *mut libc::timespec as i64);
        // pselect6's last argument: { const sigset_t *, size_t }.
        let pair = mask.map(|m| [m as *const u64 as u64, 8]);
        let pair = pair.as_ref().map_or(0, |p| p.as_ptr() as i64);
        unsafe { raw(libc::SYS_pselect6, i64::from(n), r, w, e, left, pair) }
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
