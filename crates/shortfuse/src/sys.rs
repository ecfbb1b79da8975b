//! The few system calls the session and mount code need that std does not
//! wrap. Every `unsafe` block of those modules lives here.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn getuid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory of ours.
    unsafe { libc::getuid() }
}

pub fn getgid() -> u32 {
    // SAFETY: as getuid.
    unsafe { libc::getgid() }
}

pub fn geteuid() -> u32 {
    // SAFETY: as getuid.
    unsafe { libc::geteuid() }
}

pub fn getegid() -> u32 {
    // SAFETY: as getuid.
    unsafe { libc::getegid() }
}

/// `ioctl(new, FUSE_DEV_IOC_CLONE, &master)`: attaches the fresh /dev/fuse fd
/// `new` to the connection of `master`.
pub fn fuse_dev_clone(new: BorrowedFd<'_>, master: BorrowedFd<'_>) -> io::Result<()> {
    let master_fd: u32 = master.as_raw_fd() as u32;
    // SAFETY: both fds are open for the call; the kernel reads a u32 through
    // the pointer, which points to a live local.
    let ret = unsafe {
        libc::ioctl(
            new.as_raw_fd(),
            shortfuse_abi::FUSE_DEV_IOC_CLONE as _,
            &master_fd as *const u32,
        )
    };
    check(ret).map(drop)
}

/// mount(2).
pub fn mount(source: &OsStr, target: &Path, fstype: &str, flags: u64, data: &str) -> io::Result<()> {
    let source = cstr(source)?;
    let target = cstr(target.as_os_str())?;
    let fstype = cstr(OsStr::new(fstype))?;
    let data = cstr(OsStr::new(data))?;
    // SAFETY: every pointer is a NUL-terminated string alive for the call.
    let ret = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags as libc::c_ulong,
            data.as_ptr().cast(),
        )
    };
    check(ret).map(drop)
}

/// umount2(2).
pub fn umount2(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = cstr(target.as_os_str())?;
    // SAFETY: `target` is a NUL-terminated string alive for the call.
    check(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

/// Receives one fd sent with SCM_RIGHTS (fusermount3's `_FUSE_COMMFD`
/// protocol). `Ok(None)` when the peer closed without sending one.
pub fn recv_fd(sock: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Aligned room for one cmsghdr carrying one int.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; zero is a valid value for every field.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    loop {
        // SAFETY: msg points to live buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(None);
        }
        break;
    }
    // SAFETY: the CMSG macros walk the control buffer filled in by recvmsg,
    // bounded by msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let fd: RawFd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                return Ok(Some(OwnedFd::from_raw_fd(fd)));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(None)
}

/// Lets the child of `cmd` inherit `fd` (std opens everything O_CLOEXEC).
pub fn inherit_fd(cmd: &mut Command, fd: RawFd) {
    // SAFETY: fcntl is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(move || check(libc::fcntl(fd, libc::F_SETFD, 0)).map(drop));
    }
}

/// A set of signals blocked in the calling thread (and so in every thread
/// it spawns afterwards), to be taken synchronously with [`SignalMask::wait`].
pub struct SignalMask {
    set: SignalSet,
    old: libc::sigset_t,
}

/// Signals to wait for; may be sent to another thread.
#[derive(Clone, Copy)]
pub struct SignalSet(libc::sigset_t);

impl SignalMask {
    pub fn block(signals: &[libc::c_int]) -> io::Result<SignalMask> {
        // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` and `old` are live sigset_t values.
        unsafe {
            libc::sigemptyset(&mut set);
            for &s in signals {
                libc::sigaddset(&mut set, s);
            }
            let e = libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            if e != 0 {
                return Err(io::Error::from_raw_os_error(e));
            }
        }
        Ok(SignalMask {
            set: SignalSet(set),
            old,
        })
    }

    pub fn set(&self) -> SignalSet {
        self.set
    }
}

impl SignalSet {
    /// Waits up to `timeout` for one of the signals; `None` on timeout.
    /// Works from any thread that blocks the signals.
    pub fn wait(&self, timeout: Duration) -> Option<libc::c_int> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        // SAFETY: `set` and `ts` are live; no siginfo is asked for.
        let sig = unsafe { libc::sigtimedwait(&self.0, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}

/// The thread that waits for the session's signals, for [`pass_on`].
static TAKER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The handler threads that do not block the session's signals run: those
/// a file system started before the session blocked them (when it was
/// built). It hands the signal to the thread that waits for it.
extern "C" fn pass_on(sig: libc::c_int) {
    let tid = TAKER.load(std::sync::atomic::Ordering::Relaxed);
    if tid > 0 {
        // SAFETY: getpid and tgkill are async-signal-safe and touch no memory.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig) };
    }
}

/// While alive, signals of a [`SignalSet`] that reach any thread go to the
/// thread that made it; the old handlers come back when it drops.
pub struct Taker {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalSet {
    /// Makes the calling thread, which blocks the set and waits for it,
    /// take the set's signals wherever the kernel delivers them: the
    /// kernel may pick any thread that does not block them, and a thread
    /// started before the mask was set would otherwise die of them.
    pub fn take_here(&self) -> io::Result<Taker> {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        TAKER.store(tid, std::sync::atomic::Ordering::Relaxed);
        let mut taker = Taker { old: Vec::new() };
        // SAFETY: `self.0` is an initialised set; any signal number may be asked.
        let signals = (1..libc::SIGRTMIN()).filter(|&s| unsafe { libc::sigismember(&self.0, s) } == 1);
        for sig in signals {
            // SAFETY: sigaction is plain data; zeroed is its empty value.
            let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
            act.sa_sigaction = pass_on as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            // SAFETY: as above.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: `act` and `old` are live; `pass_on` is async-signal-safe.
            check(unsafe { libc::sigaction(sig, &act, &mut old) })?;
            taker.old.push((sig, old));
        }
        Ok(taker)
    }
}

impl Drop for Taker {
    fn drop(&mut self) {
        for (sig, old) in &self.old {
            // SAFETY: restores a handler `take_here` saved.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
        TAKER.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for SignalMask {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `block` in this thread. A
        // signal still pending is delivered with its default action, as it
        // would have been without us.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut());
        }
    }
}

/// The number of CPUs this process may run on.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// shutdown(2) on a listening socket: wakes every thread blocked in
/// accept(2) on it (which then fails with EINVAL), whatever its path now
/// names.
pub fn shutdown_listener(fd: BorrowedFd<'_>) {
    // SAFETY: `fd` is open for the call; shutdown touches no memory of ours.
    unsafe {
        libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR);
    }
}

/// The never-reused id (`STATX_MNT_ID_UNIQUE`, Linux 6.8+) and device of
/// the mount at `path`, without asking a FUSE daemon anything
/// (`AT_STATX_DONT_SYNC`: a mount's root attributes come from the cache, so
/// this works on a mount whose daemon is not serving yet, or any more).
/// `Ok(None)` when the kernel does not report unique ids.
pub fn mount_unique_id(path: &Path) -> io::Result<Option<(u64, (u32, u32))>> {
    let path = cstr(path.as_os_str())?;
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `path` is NUL-terminated and `stx` a valid out-pointer for the call.
    check(unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_DONT_SYNC | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID_UNIQUE,
            stx.as_mut_ptr(),
        )
    })?;
    // SAFETY: statx succeeded and filled the struct (zeroed before).
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 {
        return Ok(None);
    }
    Ok(Some((stx.stx_mnt_id, (stx.stx_dev_major, stx.stx_dev_minor))))
}

/// Whether `fd` is readable now (`poll` with a zero timeout).
pub fn readable_now(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & libc::POLLIN != 0
}

/// CLOCK_MONOTONIC_COARSE in nanoseconds: the tick of the last timer
/// interrupt (a few ms of resolution), read from the vDSO in a few ns
/// where `Instant::now()` costs ~100 ns on a virtual machine; enough to
/// expire cache entries that live for a second.
pub fn coarse_now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; this clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
