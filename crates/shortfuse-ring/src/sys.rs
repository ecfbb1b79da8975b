//! The system calls of the rings: futexes, memfds, mappings and the
//! handshake socket. The futex calls run inside the preload shim's hook,
//! where libc's own `syscall` instruction would be rewritten: they issue
//! the instruction themselves (the shim's mapping is never rewritten and is
//! exempt from Syscall User Dispatch).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// A system call straight to the kernel; returns the raw result
/// (negative errno on failure). The one raw system call of the rings and
/// of the preload shim (which re-exports it): inlined into the shim's
/// mapping, which is never rewritten and is exempt from Syscall User
/// Dispatch, this `syscall` instruction always reaches the kernel. The
/// typed wrappers below (and the shim's `fs` and `process`) are the safe
/// way in.
///
/// # Safety
///
/// The call may do anything a system call can to this process: the caller
/// vouches that every pointer argument is either the program's own, handed
/// on as the program gave it (the kernel checks it as it would have), or
/// memory of ours valid for what call `nr` reads and writes there; and
/// that the call does not unmap, remap or overwrite memory Rust code
/// still uses, nor close a descriptor something else of ours owns.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn raw(nr: i64, a1: i64, a2: i64, a3: i64, a4: i64, a5: i64, a6: i64) -> i64 {
    let ret: i64;
    // SAFETY: see the function's contract. rcx and r11 are clobbered by
    // `syscall`.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a1, in("rsi") a2, in("rdx") a3, in("r10") a4, in("r8") a5, in("r9") a6,
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// As the x86_64 `raw`, through libc's wrapper.
///
/// # Safety
///
/// As for the x86_64 `raw`.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn raw(nr: i64, a1: i64, a2: i64, a3: i64, a4: i64, a5: i64, a6: i64) -> i64 {
    // SAFETY: the caller's contract; libc's wrapper returns -1 and sets errno.
    let r = unsafe { libc::syscall(nr, a1, a2, a3, a4, a5, a6) };
    if r < 0 {
        -(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) as i64)
    } else {
        r
    }
}

/// Sleeps while `*word == expected`, at most `timeout` (forever with
/// `None`). Shared (not FUTEX_PRIVATE): the word lives in memory mapped by
/// two processes. Spurious returns are the caller's to handle.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(0, |t| t as *const libc::timespec as i64);
    // SAFETY: `word` and `ts` are live for the call; the kernel only reads them.
    unsafe {
        raw(
            libc::SYS_futex,
            word.as_ptr() as i64,
            i64::from(libc::FUTEX_WAIT),
            i64::from(expected),
            tsp,
            0,
            0,
        )
    };
}

/// Wakes up to `n` sleepers on `word`.
pub fn futex_wake(word: &AtomicU32, n: i32) {
    // SAFETY: `word` is live; FUTEX_WAKE only reads its address.
    unsafe {
        raw(
            libc::SYS_futex,
            word.as_ptr() as i64,
            i64::from(libc::FUTEX_WAKE),
            i64::from(n),
            0,
            0,
            0,
        )
    };
}

pub fn getpid() -> u32 {
    // SAFETY: no arguments.
    unsafe { raw(libc::SYS_getpid, 0, 0, 0, 0, 0, 0) as u32 }
}

/// Registers `child` to run in the child of every fork(3).
pub fn at_fork_child(child: extern "C" fn()) {
    // SAFETY: a plain registration; `child` is async-signal-safe (one raw
    // system call and an atomic store).
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

/// Takes (`lock`) or drops a write lock on the whole of `fd`'s file,
/// waiting for it. A POSIX record lock belongs to a process: it keeps out
/// the other processes that share the descriptor (a forked child), not
/// this one's threads. Errors are ignored: at worst the exchange is not
/// exclusive.
pub fn lock_file(fd: BorrowedFd<'_>, lock: bool) {
    // SAFETY: an all-zero flock is a valid value (whole file from offset 0).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: `fl` is live for the call; F_SETLKW only reads it.
    while unsafe {
        raw(
            libc::SYS_fcntl,
            i64::from(fd.as_raw_fd()),
            i64::from(libc::F_SETLKW),
            &fl as *const libc::flock as i64,
            0,
            0,
            0,
        )
    } == -i64::from(libc::EINTR)
    {}
}

pub fn sched_yield() {
    // SAFETY: no arguments.
    unsafe { raw(libc::SYS_sched_yield, 0, 0, 0, 0, 0, 0) };
}

/// True when the peer of a connected SOCK_SEQPACKET socket has closed it
/// (or the socket is broken). The daemon never sends after the handshake,
/// so a live peer leaves nothing to read: EAGAIN.
pub fn peer_gone(fd: RawFd) -> bool {
    let mut b = 0u8;
    // SAFETY: `b` is one live byte the kernel may write; no address asked.
    let r = unsafe {
        raw(
            libc::SYS_recvfrom,
            i64::from(fd),
            &mut b as *mut u8 as i64,
            1,
            i64::from(libc::MSG_PEEK | libc::MSG_DONTWAIT),
            0,
            0,
        )
    };
    r == 0 || (r < 0 && r != -i64::from(libc::EAGAIN) && r != -i64::from(libc::EINTR))
}

/// Whether `fd` has something to read (or its peer went away) within
/// `timeout`.
pub fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX).max(1);
    // SAFETY: `p` is one live pollfd the kernel may write.
    let r = unsafe { raw(libc::SYS_poll, &mut p as *mut libc::pollfd as i64, 1, ms, 0, 0, 0) };
    r > 0
}

/// The CPU this thread runs on (glibc reads it from rseq or the vDSO: no
/// system call, no lock).
pub fn current_cpu() -> usize {
    // SAFETY: no arguments; returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).unwrap_or(0)
}

/// The CPU this thread runs on, if it can be told (see [`current_cpu`]).
pub fn cpu() -> Option<u32> {
    // SAFETY: no arguments; returns -1 on failure.
    u32::try_from(unsafe { libc::sched_getcpu() }).ok()
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A sealed memfd of `len` bytes: neither side can shrink or grow it, so
/// a client cannot make the daemon's accesses fault (SIGBUS) by truncating
/// the file under its mapping.
pub fn sealed_memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let fd = memfd(name, len)?;
    seal(std::os::fd::AsFd::as_fd(&fd), 0)?;
    Ok(fd)
}

/// A memfd of `len` bytes that may still be sealed ([`seal`]).
pub fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated name; the result is a new descriptor we own.
    let fd = check(unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) })?;
    // SAFETY: fd was just returned to us and nobody else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain calls on our descriptor.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), size) })?;
    Ok(fd)
}

/// Seals memfd `fd` against resizing and further seals, and with `more`.
pub fn seal(fd: BorrowedFd<'_>, more: i32) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL | more;
    // SAFETY: a plain call on a descriptor we hold.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

/// Now on CLOCK_MONOTONIC, in nanoseconds: one clock for every process.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: fills the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The size of the file behind `fd`.
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: fstat fills the zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a stat buffer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st.st_size as u64)
}

/// A shared read-write mapping of the whole of `fd`.
pub fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<*mut u8> {
    map(fd, len, libc::PROT_READ | libc::PROT_WRITE)
}

/// A shared mapping of the whole of `fd` that this process can only read.
pub fn map_shared_read(fd: BorrowedFd<'_>, len: usize) -> io::Result<*mut u8> {
    map(fd, len, libc::PROT_READ)
}

fn map(fd: BorrowedFd<'_>, len: usize, prot: i32) -> io::Result<*mut u8> {
    // SAFETY: a fresh mapping chosen by the kernel; nothing else is touched.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// Unmaps what [`map_shared`] returned.
///
/// # Safety
/// Nothing may use the mapping afterwards.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: the caller guarantees the mapping is no longer used.
    unsafe { libc::munmap(p.cast(), len) };
}

fn sockaddr(path: &std::path::Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path {} is too long", path.display()),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: creates a new descriptor.
    let fd = check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd is new and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A listening SOCK_SEQPACKET socket at `path`.
pub fn listen(path: &std::path::Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = sockaddr(path)?;
    // SAFETY: addr is a valid sockaddr_un of length len.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    // SAFETY: a bound socket.
    check(unsafe { libc::listen(fd.as_raw_fd(), 64) })?;
    Ok(fd)
}

/// A close-on-exec duplicate of `fd` at the lowest free number from
/// `floor` on.
pub fn dup_from(fd: BorrowedFd<'_>, floor: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain call on a descriptor we hold.
    let dup = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) })?;
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// Connects a SOCK_SEQPACKET socket to `path`.
pub fn connect(path: &std::path::Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = sockaddr(path)?;
    // SAFETY: addr is a valid sockaddr_un of length len.
    check(unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    Ok(fd)
}

/// Accepts one connection (blocking; EINTR retried).
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: no address is asked for.
        let r = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        match check(r) {
            // SAFETY: a new descriptor we own.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Wakes a thread blocked in [`accept`] on `fd` (accept then fails).
pub fn shutdown(fd: BorrowedFd<'_>) {
    // SAFETY: plain call on a descriptor we hold.
    unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
}

/// Sends one message, with `pass` as SCM_RIGHTS when given.
pub fn send(sock: BorrowedFd<'_>, data: &[u8], pass: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 4];
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = pass {
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds one cmsg with room for one fd.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd.as_raw_fd());
        }
    }
    // SAFETY: msg describes live buffers.
    let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends one message gathered from `iov`.
pub fn sendv(sock: BorrowedFd<'_>, iov: &[libc::iovec]) -> io::Result<()> {
    // SAFETY: zeroed msghdr is valid; `iov` outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len();
    loop {
        // SAFETY: msg describes live buffers.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// write(2) of `data` to `fd`, once: the bytes written.
pub fn write(fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<usize> {
    // SAFETY: `data` is a live buffer of its length.
    let r = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Receives one message into `buf` and the descriptor passed with it;
/// returns the length (0: the peer closed).
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: msg describes live buffers.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut passed = None;
    // SAFETY: walking the control messages the kernel filled in.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                // Only the first descriptor is kept; any other is closed by
                // being wrapped and dropped.
                let owned = OwnedFd::from_raw_fd(fd);
                if passed.is_none() {
                    passed = Some(owned);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n, passed))
}

/// The credentials of the process at the other end of a Unix socket, as
/// they were when it connected (SO_PEERCRED): (pid, uid, gid).
pub fn peer_creds(sock: BorrowedFd<'_>) -> io::Result<(u32, u32, u32)> {
    let mut c = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are valid out-pointers for one ucred.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((c.pid as u32, c.uid, c.gid))
}

/// This thread's file-system ids and supplementary groups become `uid`,
/// `gid` and `groups` (the raw calls act on the calling thread alone;
/// glibc's wrappers would change every thread of the daemon). The order
/// keeps the capabilities each step needs: groups and gid while the fsuid
/// is still 0. Returns false if one did not take.
pub fn set_thread_creds(uid: u32, gid: u32, groups: &[u32]) -> bool {
    // SAFETY: `groups` is live and holds `groups.len()` ids the kernel
    // reads; the id calls take no pointers.
    let g = unsafe {
        raw(
            libc::SYS_setgroups,
            groups.len() as i64,
            groups.as_ptr() as i64,
            0,
            0,
            0,
            0,
        )
    };
    set_fsgid(gid);
    set_fsuid(uid);
    // setfsuid and setfsgid return the previous id, never an error: ask
    // again with an invalid one, which changes nothing.
    g == 0 && fsuid() == uid && fsgid() == gid
}

/// This thread's file-system user id (setfsuid with an invalid id changes
/// nothing and returns the current one).
pub fn fsuid() -> u32 {
    // SAFETY: no pointers.
    unsafe { raw(libc::SYS_setfsuid, -1, 0, 0, 0, 0, 0) as u32 }
}

/// This thread's file-system group id, as [`fsuid`].
pub fn fsgid() -> u32 {
    // SAFETY: no pointers.
    unsafe { raw(libc::SYS_setfsgid, -1, 0, 0, 0, 0, 0) as u32 }
}

/// Sets this thread's file-system user id (this thread alone, unlike
/// glibc's wrapper); check with [`fsuid`].
pub fn set_fsuid(uid: u32) {
    // SAFETY: no pointers.
    unsafe { raw(libc::SYS_setfsuid, i64::from(uid), 0, 0, 0, 0, 0) };
}

/// Sets this thread's file-system group id, as [`set_fsuid`].
pub fn set_fsgid(gid: u32) {
    // SAFETY: no pointers.
    unsafe { raw(libc::SYS_setfsgid, i64::from(gid), 0, 0, 0, 0, 0) };
}

/// The process's effective user id.
pub fn geteuid() -> u32 {
    // SAFETY: no arguments.
    unsafe { raw(libc::SYS_geteuid, 0, 0, 0, 0, 0, 0) as u32 }
}

/// The calling thread's supplementary groups.
pub fn thread_groups() -> Vec<u32> {
    // SAFETY: a size of 0 asks for the count and writes nothing.
    let n = unsafe { raw(libc::SYS_getgroups, 0, 0, 0, 0, 0, 0) };
    if n <= 0 {
        return Vec::new();
    }
    let mut g = vec![0u32; n as usize];
    // SAFETY: `g` holds `n` live ids the kernel may write.
    let got = unsafe { raw(libc::SYS_getgroups, n, g.as_mut_ptr() as i64, 0, 0, 0, 0) };
    g.truncate(got.max(0) as usize);
    g
}

/// The device and inode numbers of the directory open at `fd` (`None`
/// when it is no directory or fstat fails).
pub fn dir_id(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: a descriptor we hold and a stat buffer of the right size.
    let r = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    // SAFETY: filled in by a successful fstat.
    let st = (r == 0).then(|| unsafe { st.assume_init() })?;
    (st.st_mode & libc::S_IFMT == libc::S_IFDIR).then_some((st.st_dev, st.st_ino))
}

/// An `O_PATH` descriptor of directory `path` (close-on-exec; symbolic
/// links followed, as the daemon's own opening of its source did).
pub fn open_dir(path: &[u8]) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path.
    let fd = check(unsafe { libc::open(c.as_ptr(), flags) })?;
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `path` names, for this process, the directory with device `dev`
/// and inode `ino` (the daemon's source, as the daemon saw it).
pub fn same_dir(path: &[u8], dev: u64, ino: u64) -> bool {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let p = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
    std::fs::metadata(p).is_ok_and(|m| m.is_dir() && m.dev() == dev && m.ino() == ino)
}

/// mknod(2) of `path` with `mode` (type and permission bits) and device
/// number `rdev`.
pub fn mknod(path: &std::path::Path, mode: u32, rdev: u64) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path.
    done(unsafe { libc::mknod(c.as_ptr(), mode, rdev) })
}

fn c_path(path: &std::path::Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    Ok(std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?)
}

fn done(r: i32) -> io::Result<()> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// truncate(2) of `path` to `len` bytes (by path: no open, so no IN_OPEN).
pub fn truncate(path: &std::path::Path, len: i64) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path.
    done(unsafe { libc::truncate(c.as_ptr(), len) })
}

/// Sets both times of `path` (not following a final symlink) to now, as
/// utimes(2) does.
pub fn touch(path: &std::path::Path) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path; a null `times` means now.
    done(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), libc::AT_SYMLINK_NOFOLLOW) })
}

/// renameat2(2) of `from` to `to` with `flags` (RENAME_*).
pub fn rename2(from: &std::path::Path, to: &std::path::Path, flags: u32) -> io::Result<()> {
    let (f, t) = (c_path(from)?, c_path(to)?);
    // SAFETY: NUL-terminated paths.
    done(unsafe { libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), flags) })
}
