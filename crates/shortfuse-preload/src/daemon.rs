//! Daemon mode: an unmodified FUSE daemon under `shortfuse serve --
//! COMMAND` (see `shortfuse_ring::foreign` for the other side).
//!
//! The daemon opens /dev/fuse (or gets the descriptor from fusermount3
//! over `_FUSE_COMMFD`, a recvmsg) and mounts as it always does; we note
//! that descriptor and make it carry the ring clients' requests beside the
//! kernel's:
//!
//! - a read (read, readv, or splice into a pipe, which libfuse 3 uses)
//!   returns the next request of either: ring requests come as messages on
//!   the socket to `shortfuse serve`; the descriptor is non-blocking
//!   underneath, and a reader with nothing to read waits in ppoll on both,
//!   with the program's signal mask (a SIGTERM ends the wait as it would
//!   end a read of /dev/fuse);
//! - a write (write, writev, or splice from a pipe) is routed by its
//!   `unique`: ring ids (`RING_UNIQUE`) go back over the socket, the rest
//!   to the kernel; notifications (unique 0) go to the kernel and, copied
//!   over the socket, to the ring clients' caches; the reply to the
//!   kernel's INIT is copied over the socket, and answers the ring
//!   clients' INITs; the descriptor goes with it, for the notifications
//!   `shortfuse serve` writes to the kernel about the ring clients' changes.
//!
//! A cloned descriptor (FUSE_DEV_IOC_CLONE on a new open of /dev/fuse) is
//! one more descriptor of ours, so libfuse's `clone_fd` works; every
//! thread's read may return a ring request. Kernel passthrough
//! registrations are lent to the ring clients (see `backing`). poll,
//! select and epoll find the descriptor readable when a ring request
//! waits (see `ready`). Not handled: FUSE over io_uring (libfuse then
//! stays on /dev/fuse).
#![allow(unsafe_code)]

mod backing;
mod direct;
mod later;
mod ready;

use std::cell::RefCell;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering};

use shortfuse_ring::foreign::{
    lane_of, DAEMON_FD_VAR, DAEMON_LANES_VAR, LANES, MSG_CLIENT, MSG_CLIENT_GONE, MSG_INIT, MSG_NOTIFY, MSG_REPLY,
    MSG_REQUEST, RING_UNIQUE,
};

use crate::calls::table::{is_daemon_call, Call, Direction, Offset, Regs};
use crate::sys::{fs, raw};
use crate::user;

/// Our descriptor of the socket to `shortfuse serve`; -1 when not a daemon.
static CHANNEL: AtomicI32 = AtomicI32::new(-1);
/// The socket has closed: `shortfuse serve` went; the kernel alone is served.
static CHANNEL_GONE: AtomicU8 = AtomicU8::new(0);
/// Descriptors below this number may be /dev/fuse descriptors of ours.
const MAX_FD: usize = 4096;
static DEVS: [AtomicU8; MAX_FD] = [const { AtomicU8::new(0) }; MAX_FD];
/// A /dev/fuse descriptor of the daemon.
const DEV: u8 = 1;
/// ... which the daemon itself made non-blocking: a read never waits.
const DEV_NONBLOCK: u8 = 2;
/// The `unique` of the kernel's INIT, until the daemon answers it.
static INIT_UNIQUE: AtomicU64 = AtomicU64::new(0);
/// Where our socket goes: above the numbers daemons use.
const CHANNEL_FLOOR: i64 = 700;
/// Our ends of the reply lanes (see `shortfuse_ring::foreign::LANES`); -1
/// where there is none: those replies take the socket.
static LANE_FDS: [AtomicI32; LANES] = [const { AtomicI32::new(-1) }; LANES];

/// Whether this process is a daemon under `shortfuse serve --`.
pub fn on() -> bool {
    CHANNEL.load(Ordering::Relaxed) >= 0
}

/// At start-up: takes the socket [`DAEMON_FD_VAR`] names, if it is one (a
/// program the daemon starts inherits the variable, not the descriptor).
pub fn setup() -> bool {
    let Some(fd) = std::env::var(DAEMON_FD_VAR).ok().and_then(|v| v.parse::<i64>().ok()) else {
        return false;
    };
    let mut ty = 0i32;
    let mut len = 4u32;
    // SAFETY: an int and its length, of ours.
    let r = unsafe {
        raw(
            libc::SYS_getsockopt,
            fd,
            i64::from(libc::SOL_SOCKET),
            i64::from(libc::SO_TYPE),
            &mut ty as *mut i32 as i64,
            &mut len as *mut u32 as i64,
            0,
        )
    };
    if r != 0 || ty != libc::SOCK_SEQPACKET {
        return false;
    }
    // Out of the daemon's way, and not inherited by what it runs (ssh).
    let high = fs::fcntl_int(fd as i32, libc::F_DUPFD_CLOEXEC, CHANNEL_FLOOR);
    if high < 0 {
        return false;
    }
    fs::close(fd as i32);
    CHANNEL.store(high as i32, Ordering::Relaxed);
    let lanes = std::env::var(DAEMON_LANES_VAR).unwrap_or_default();
    for (slot, fd) in LANE_FDS
        .iter()
        .zip(lanes.split(',').filter_map(|v| v.parse::<i64>().ok()))
    {
        let high = fs::fcntl_int(fd as i32, libc::F_DUPFD_CLOEXEC, CHANNEL_FLOOR);
        fs::close(fd as i32);
        if high >= 0 {
            slot.store(high as i32, Ordering::Relaxed);
        }
    }
    direct::setup(CHANNEL_FLOOR);
    true
}

/// Whether `fd` is our socket or one of our lanes.
fn ours(fd: i64) -> bool {
    fd >= 0
        && (fd == i64::from(CHANNEL.load(Ordering::Relaxed))
            || LANE_FDS.iter().any(|l| i64::from(l.load(Ordering::Relaxed)) == fd))
}

/// Where the reply to ring request `unique` goes: its lane, or the socket.
fn reply_fd(unique: u64) -> i32 {
    lane_of(unique)
        .map(|l| LANE_FDS[l].load(Ordering::Relaxed))
        .filter(|&fd| fd >= 0)
        .unwrap_or_else(|| CHANNEL.load(Ordering::Relaxed))
}

/// The calls daemon mode serves that are not file calls.
pub fn wants(nr: i64) -> bool {
    is_daemon_call(nr) && on()
}

fn dev(fd: i64) -> u8 {
    usize::try_from(fd)
        .ok()
        .and_then(|i| DEVS.get(i))
        .map_or(0, |d| d.load(Ordering::Relaxed))
}

fn set_dev(fd: i64, v: u8) {
    if let Some(d) = usize::try_from(fd).ok().and_then(|i| DEVS.get(i)) {
        d.store(v, Ordering::Relaxed);
    }
}

/// Notes `fd` as a /dev/fuse descriptor of the daemon, non-blocking
/// underneath (see the module doc).
fn register(fd: i64) {
    if fd < 0 || fd as usize >= MAX_FD {
        return;
    }
    let flags = fs::fcntl_int(fd as i32, libc::F_GETFL, 0);
    if flags < 0 {
        return;
    }
    let wished = flags & i64::from(libc::O_NONBLOCK) != 0;
    fs::fcntl_int(fd as i32, libc::F_SETFL, flags | i64::from(libc::O_NONBLOCK));
    set_dev(fd, DEV | if wished { DEV_NONBLOCK } else { 0 });
}

/// Whether `fd` is a descriptor of /dev/fuse (char device 10:229).
fn is_fuse_device(fd: i64) -> bool {
    let mut st: libc::stat = user::zeroed();
    fs::fstat(fd as i32, &mut st) == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFCHR
        && st.st_rdev == libc::makedev(10, 229)
}

/// Serves call `c` (`regs` as the program made it) when it concerns a
/// /dev/fuse descriptor of the daemon or our socket; None: the call goes
/// on as usual.
pub fn call(c: &Call, regs: Regs) -> Option<i64> {
    // SAFETY (of each use): the program's own call, its arguments as it
    // gave them: the kernel checks them as it would have.
    let reissue = || unsafe { crate::sys::raw6(regs.nr, regs.a) };
    match *c {
        Call::Open { at, .. } => {
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            if unsafe { user::cstr(at.path.0) }.ok()? != b"/dev/fuse" {
                return None;
            }
            let r = reissue();
            register(r);
            Some(r)
        }
        Call::Recv { msg } => {
            let r = reissue();
            if r >= 0 {
                // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
                if let Ok(msg) = unsafe { user::get::<libc::msghdr>(msg.0) } {
                    let mut fds = Vec::new();
                    user::passed_fds(&msg, &mut fds);
                    for fd in fds {
                        if is_fuse_device(i64::from(fd)) {
                            register(i64::from(fd));
                        }
                    }
                }
            }
            Some(r)
        }
        Call::Close { fd } if ours(fd.into()) => Some(0),
        Call::Close { fd } => {
            ready::closed(fd.0);
            set_dev(fd.into(), 0);
            None
        }
        Call::Dup3 { new, .. } if ours(new.into()) => Some(-i64::from(libc::EBUSY)),
        Call::Dup { fd: old } | Call::Dup3 { old, .. } => {
            let from = dev(old.into());
            if let Call::Dup3 { new, .. } = *c {
                set_dev(new.into(), 0);
            }
            if from == 0 {
                return None;
            }
            let r = reissue();
            if r >= 0 {
                set_dev(r, from);
            }
            Some(r)
        }
        Call::Poll { fds, n, timeout, mask } => ready::poll(fds, n, timeout, mask),
        Call::Select { n, sets, timeout, mask } => ready::select(n, sets, timeout, mask),
        Call::EpollCtl { ep, op, fd, event } => ready::epoll_ctl(ep.0, op, fd.0, event, reissue),
        Call::Fcntl { fd, cmd, arg } if dev(fd.into()) != 0 => fcntl(fd.into(), cmd, arg, reissue),
        Call::Ioctl { fd } if dev(fd.into()) != 0 && regs.a[1] as u64 == libc::FIONBIO => {
            Some(fionbio(fd.into(), regs.a[2]))
        }
        Call::Ioctl { fd } if dev(fd.into()) != 0 => backing::ioctl(regs.a[1] as u32, regs.a[2], reissue),
        Call::Read { fd, buf, len } if dev(fd.into()) != 0 => {
            let iov = [libc::iovec {
                iov_base: buf.0 as *mut libc::c_void,
                iov_len: len,
            }];
            Some(read(fd.into(), &iov))
        }
        Call::Write { fd, buf, len } if dev(fd.into()) != 0 => {
            let iov = [libc::iovec {
                iov_base: buf.0 as *mut libc::c_void,
                iov_len: len,
            }];
            Some(write(fd.into(), &iov))
        }
        // readv and writev (preadv2 and pwritev2 at offset -1 alike).
        Call::Vectored {
            fd,
            iov,
            iovcnt,
            dir,
            at: Offset::Current,
        } if dev(fd.into()) != 0 => {
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            Some(match unsafe { user::iovecs(iov.0, iovcnt) } {
                Ok(iov) if dir == Direction::Read => read(fd.into(), iov),
                Ok(iov) => write(fd.into(), iov),
                Err(e) => -(e.raw() as i64),
            })
        }
        Call::Copy {
            out,
            input,
            len,
            splice: true,
        } if dev(input.into()) != 0 => Some(splice_out(input.into(), out.into(), len)),
        Call::Copy {
            out,
            input,
            len,
            splice: true,
        } if dev(out.into()) != 0 => Some(splice_in(input.into(), out.into(), len)),
        _ => None,
    }
}

/// fcntl on a /dev/fuse descriptor: it stays non-blocking underneath,
/// while the daemon sees (and sets) the flag it asked for. `reissue`
/// makes the program's call as it is.
fn fcntl(fd: i64, cmd: i32, arg: i64, reissue: impl Fn() -> i64) -> Option<i64> {
    let nb = i64::from(libc::O_NONBLOCK);
    match cmd {
        libc::F_GETFL => {
            let r = reissue();
            if r < 0 || dev(fd) & DEV_NONBLOCK != 0 {
                return Some(r);
            }
            Some(r & !nb)
        }
        libc::F_SETFL => {
            let r = fs::fcntl_int(fd as i32, libc::F_SETFL, arg | nb);
            if r == 0 {
                set_dev(fd, DEV | if arg & nb != 0 { DEV_NONBLOCK } else { 0 });
            }
            Some(r)
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let from = dev(fd);
            let r = reissue();
            if r >= 0 {
                set_dev(r, from);
            }
            Some(r)
        }
        _ => None,
    }
}

/// ioctl FIONBIO on a /dev/fuse descriptor (how Python's `os.set_blocking`
/// sets the flag): as F_SETFL, the daemon's wish is noted, and the
/// descriptor stays non-blocking underneath.
fn fionbio(fd: i64, arg: i64) -> i64 {
    // SAFETY: the call's own argument, an int in the program's memory.
    match unsafe { user::get::<i32>(arg) } {
        Ok(on) => {
            set_dev(fd, DEV | if on != 0 { DEV_NONBLOCK } else { 0 });
            0
        }
        Err(e) => -(e.raw() as i64),
    }
}

/// The first 16 bytes the iovecs hold (a FUSE header's start), if readable.
fn head(iov: &[libc::iovec]) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    peek(iov, 0, &mut out).then_some(out)
}

/// Copies the bytes the iovecs hold at `at` into `out`: false when they
/// do not reach that far or cannot be read.
fn peek(iov: &[libc::iovec], at: usize, out: &mut [u8]) -> bool {
    let (mut skip, mut got) = (at, 0);
    for v in iov {
        if got == out.len() {
            break;
        }
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        let n = (v.iov_len - skip).min(out.len() - got);
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        let Ok(b) = (unsafe { user::slice(v.iov_base as i64 + skip as i64, n) }) else {
            return false;
        };
        out[got..got + n].copy_from_slice(b);
        got += n;
        skip = 0;
    }
    got == out.len()
}

fn u64_at(b: &[u8; 16], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// Sends `kind` then the bytes of `iov` over the socket.
fn send(kind: u32, iov: &[libc::iovec]) -> i64 {
    send_with(CHANNEL.load(Ordering::Relaxed), kind, iov, None)
}

/// Sends `kind` then `parts` to `shortfuse serve`, with descriptor `pass`.
fn send_parts(kind: u32, parts: &[&[u8]], pass: Option<i32>) -> i64 {
    let iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    send_with(CHANNEL.load(Ordering::Relaxed), kind, &iov, pass)
}

/// [`send`] on socket `sock`, passing descriptor `pass` with the message.
fn send_with(sock: i32, kind: u32, iov: &[libc::iovec], pass: Option<i32>) -> i64 {
    let kind = kind.to_ne_bytes();
    let mut all = Vec::with_capacity(iov.len() + 1);
    all.push(libc::iovec {
        iov_base: kind.as_ptr() as *mut libc::c_void,
        iov_len: 4,
    });
    all.extend_from_slice(iov);
    let mut msg: libc::msghdr = user::zeroed();
    msg.msg_iov = all.as_mut_ptr();
    msg.msg_iovlen = all.len();
    let mut cbuf = [0u64; 4];
    if let Some(fd) = pass {
        // SAFETY: CMSG_SPACE and CMSG_LEN are pure computations; the control
        // buffer is ours and holds one header with room for one descriptor.
        unsafe {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), fd);
        }
    }
    // SAFETY: a msghdr of ours whose buffers live across the call.
    unsafe {
        raw(
            libc::SYS_sendmsg,
            i64::from(sock),
            &msg as *const libc::msghdr as i64,
            i64::from(libc::MSG_NOSIGNAL),
            0,
            0,
            0,
        )
    }
}

fn ring_alive() -> bool {
    on() && CHANNEL_GONE.load(Ordering::Relaxed) == 0
}

/// The next request for the daemon, from a ring client or the kernel,
/// into `iov`.
fn read(fd: i64, iov: &[libc::iovec]) -> i64 {
    let mut polled = false;
    loop {
        if direct::active() {
            if let Some(r) = direct::take(|req| scatter(iov, req).then_some(req.len() as i64)) {
                return r;
            }
        }
        if ring_alive() {
            if let Some(r) = ring_request(iov) {
                return r;
            }
        }
        // SAFETY: iovecs built for the call, of buffers the caller vouched for.
        let r = unsafe { raw(libc::SYS_readv, fd, iov.as_ptr() as i64, iov.len() as i64, 0, 0, 0) };
        if r >= 0 {
            if let Some(h) = head(iov) {
                let opcode = u32::from_ne_bytes([h[4], h[5], h[6], h[7]]);
                if opcode == shortfuse_abi::FUSE_INIT {
                    INIT_UNIQUE.store(u64_at(&h, 8), Ordering::Relaxed);
                }
            }
            return r;
        }
        if r == -i64::from(libc::EAGAIN) && dev(fd) & DEV_NONBLOCK != 0 && direct::active() {
            // The daemon goes back to its poll, select or epoll: the clients
            // must ring, and a request that came meanwhile is taken now.
            direct::drain();
            if direct::arm() {
                continue;
            }
        }
        if r != -i64::from(libc::EAGAIN) || dev(fd) & DEV_NONBLOCK != 0 {
            return r;
        }
        if direct::active() {
            if !polled {
                polled = true;
                if direct::poll(|| ready(fd)) {
                    continue;
                }
            }
            polled = false;
            if direct::arm() {
                direct::disarm();
                continue;
            }
        }
        let w = wait(fd);
        if direct::active() {
            direct::disarm();
        }
        if w < 0 {
            return w;
        }
    }
}

/// A wait for `fd` to be readable.
fn pollin(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Whether the kernel or `serve` has something for `fd`'s reader now.
fn ready(fd: i64) -> bool {
    let mut fds = [pollin(fd as i32), pollin(CHANNEL.load(Ordering::Relaxed))];
    let mut zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    fs::ppoll(&mut fds, Some(&mut zero), None) > 0
}

/// Copies `bytes` into the buffers of `iov`: false when they do not fit.
fn scatter(iov: &[libc::iovec], bytes: &[u8]) -> bool {
    if iov.iter().map(|v| v.iov_len).sum::<usize>() < bytes.len() {
        return false;
    }
    let mut done = 0;
    for v in iov {
        if done == bytes.len() {
            break;
        }
        let n = v.iov_len.min(bytes.len() - done);
        // SAFETY: the daemon's own read buffer, which it handed us for the
        // call, `iov_len` bytes long.
        unsafe { std::ptr::copy_nonoverlapping(bytes[done..].as_ptr(), v.iov_base.cast::<u8>(), n) };
        done += n;
    }
    true
}

/// A ring request waiting on the socket, taken into `iov`: its length, or
/// None when there is none.
fn ring_request(iov: &[libc::iovec]) -> Option<i64> {
    let ch = i64::from(CHANNEL.load(Ordering::Relaxed));
    let mut kind = [0u8; 4];
    let mut all = Vec::with_capacity(iov.len() + 1);
    all.push(libc::iovec {
        iov_base: kind.as_mut_ptr() as *mut libc::c_void,
        iov_len: 4,
    });
    all.extend_from_slice(iov);
    loop {
        let mut msg: libc::msghdr = user::zeroed();
        msg.msg_iov = all.as_mut_ptr();
        msg.msg_iovlen = all.len();
        let mut cbuf = [0u64; 4];
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        // SAFETY: a msghdr of ours whose buffers live across the call.
        let r = unsafe {
            raw(
                libc::SYS_recvmsg,
                ch,
                &mut msg as *mut libc::msghdr as i64,
                i64::from(libc::MSG_DONTWAIT),
                0,
                0,
                0,
            )
        };
        if r == 0 {
            // `shortfuse serve` went: the kernel alone is left.
            CHANNEL_GONE.store(1, Ordering::Relaxed);
            ready::gone();
            return None;
        }
        if r < 0 {
            return None;
        }
        let mut passed = Vec::new();
        user::passed_fds(&msg, &mut passed);
        match u32::from_ne_bytes(kind) {
            MSG_CLIENT => {
                let mut body = [0u8; std::mem::size_of::<shortfuse_ring::foreign::DirectClient>()];
                match passed.first() {
                    Some(&fd) if peek(iov, 0, &mut body) => direct::add(&body, fd),
                    _ => passed.iter().for_each(|&fd| {
                        fs::close(fd);
                    }),
                }
                continue;
            }
            MSG_CLIENT_GONE => {
                let mut id = [0u8; 8];
                if peek(iov, 0, &mut id) {
                    direct::remove(u64::from_ne_bytes(id));
                }
                continue;
            }
            _ => passed.iter().for_each(|&fd| {
                fs::close(fd);
            }),
        }
        if u32::from_ne_bytes(kind) != MSG_REQUEST || r < 4 + 40 {
            continue;
        }
        if msg.msg_flags & libc::MSG_TRUNC != 0 {
            // Larger than the daemon's buffer: that call fails, not the ring.
            if let Some(h) = head(iov) {
                refuse(u64_at(&h, 8), libc::EIO);
            }
            continue;
        }
        return Some(r - 4);
    }
}

/// Answers ring request `unique` with `errno` ourselves.
fn refuse(unique: u64, errno: i32) {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&16u32.to_ne_bytes());
    h[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    h[8..].copy_from_slice(&unique.to_ne_bytes());
    let iov = [libc::iovec {
        iov_base: h.as_mut_ptr() as *mut libc::c_void,
        iov_len: 16,
    }];
    send_with(reply_fd(unique), MSG_REPLY, &iov, None);
}

/// Waits until the kernel or the rings have a request for `fd`, with the
/// program's signal mask: 0, or -EINTR.
fn wait(fd: i64) -> i64 {
    let mut fds = [
        pollin(fd as i32),
        pollin(CHANNEL.load(Ordering::Relaxed)),
        pollin(direct::bell().unwrap_or(-1)),
    ];
    let n = if ring_alive() { 3 } else { 1 };
    let mask = ready::wait_mask(None);
    let r = ready::blocking(|| fs::ppoll(&mut fds[..n], None, mask.as_ref()));
    if r == -i64::from(libc::EINTR) {
        return r;
    }
    0
}

/// A reply or notification from the daemon, routed by its `unique`.
fn write(fd: i64, iov: &[libc::iovec]) -> i64 {
    let Some(h) = head(iov) else {
        // SAFETY: iovecs built for the call, of buffers the caller vouched for.
        return unsafe { raw(libc::SYS_writev, fd, iov.as_ptr() as i64, iov.len() as i64, 0, 0, 0) };
    };
    let unique = u64_at(&h, 8);
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    if direct::is_direct(unique) {
        // The daemon's buffers as they are: the reply goes from them to
        // the client's slot (a READ's data copied once, not gathered first).
        let parts: Result<Vec<&[u8]>, _> = iov
            .iter()
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            .map(|v| unsafe { user::slice(v.iov_base as i64, v.iov_len) })
            .collect();
        let lent = backing::lent_by(total, |at, out| peek(iov, at, out));
        direct::complete(unique, parts.as_deref().ok(), lent);
        if let Some(fd) = lent {
            fs::close(fd);
        }
        return total as i64;
    }
    if unique & RING_UNIQUE != 0 {
        if !ring_alive() {
            // As the kernel answers a reply nobody waits for.
            return -i64::from(libc::ENOENT);
        }
        let lent = backing::lent_by(total, |at, out| peek(iov, at, out));
        let r = send_with(reply_fd(unique), MSG_REPLY, iov, lent);
        if let Some(fd) = lent {
            fs::close(fd);
        }
        if r < 0 {
            // Too large for the socket: that call fails, not the daemon.
            refuse(unique, libc::EIO);
            return r;
        }
        return total as i64;
    }
    // SAFETY: iovecs built for the call, of buffers the caller vouched for.
    let r = unsafe { raw(libc::SYS_writev, fd, iov.as_ptr() as i64, iov.len() as i64, 0, 0, 0) };
    if ring_alive() {
        if unique == 0 && (r >= 0 || r == -i64::from(libc::ENOENT)) {
            send(MSG_NOTIFY, iov);
        } else if unique != 0 && r >= 0 && INIT_UNIQUE.load(Ordering::Relaxed) == unique {
            INIT_UNIQUE.store(0, Ordering::Relaxed);
            let total: usize = iov.iter().map(|v| v.iov_len).sum();
            let mut msg = vec![0u8; total.min(16 + 256)];
            if peek(iov, 0, &mut msg) {
                direct::init_seen(&msg);
            }
            // With the descriptor: `shortfuse serve` tells the kernel mount
            // through it what the ring clients change.
            send_with(CHANNEL.load(Ordering::Relaxed), MSG_INIT, iov, Some(fd as i32));
        }
    }
    r
}

thread_local! {
    /// A buffer per thread for splice, which libfuse 3 reads requests with.
    static SPLICE_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_buf<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SPLICE_BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < len {
            b.resize(len, 0);
        }
        f(&mut b[..len])
    })
}

/// splice from a /dev/fuse descriptor into a pipe: the request, read as
/// [`read`] does, written to the pipe (which libfuse sized for it).
fn splice_out(fd: i64, pipe: i64, len: usize) -> i64 {
    with_buf(len.min(16 << 20), |b| {
        let iov = [libc::iovec {
            iov_base: b.as_mut_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        }];
        let n = read(fd, &iov);
        if n <= 0 {
            return n;
        }
        let mut done = 0usize;
        while done < n as usize {
            let w = crate::sys::fs::write(pipe as i32, &b[done..n as usize]);
            if w <= 0 {
                // The request is lost for the daemon: its call fails.
                return if w < 0 { w } else { -i64::from(libc::EIO) };
            }
            done += w as usize;
        }
        n
    })
}

/// splice from a pipe into a /dev/fuse descriptor: a reply, `len` bytes
/// taken from the pipe and routed as [`write`] does.
fn splice_in(pipe: i64, fd: i64, len: usize) -> i64 {
    with_buf(len.min(16 << 20), |b| {
        let mut got = 0usize;
        while got < b.len() {
            let r = crate::sys::fs::read(pipe as i32, &mut b[got..]);
            if r <= 0 {
                break;
            }
            got += r as usize;
        }
        let iov = [libc::iovec {
            iov_base: b.as_mut_ptr() as *mut libc::c_void,
            iov_len: got,
        }];
        let r = write(fd, &iov);
        if r < 0 {
            r
        } else {
            got as i64
        }
    })
}
