//! When a /dev/fuse descriptor of the daemon is ready to be read, for the
//! daemons that wait before they read (poll, select or epoll on it: a
//! loop of their own, Python's trio under pyfuse3, the tokio-based Rust
//! crates).
//!
//! The kernel finds the descriptor readable for its own requests only;
//! the ring clients' come on our socket. So a wait for the descriptor to
//! be readable also waits for the socket, and a request there makes the
//! descriptor readable: the read that follows returns it (see `read`).
//!
//! - poll, ppoll, select and pselect6 are served: the wait is made with
//!   the socket added, and answered as if for the program's descriptors
//!   alone.
//! - An epoll wait names no descriptor, so epoll_ctl is served instead:
//!   adding a /dev/fuse descriptor for reading adds beside it, with the
//!   same data and flags, an epoll descriptor of ours that watches the
//!   socket; changing or removing the descriptor (or closing it, or the
//!   epoll descriptor) changes or removes that watch. Ours is an epoll
//!   descriptor rather than a copy of the socket because closing it takes
//!   it out of the program's epoll (a copy of the socket would stay
//!   there as long as the socket is open), and because taking the socket
//!   out of it once `shortfuse serve` has gone silences every watch at
//!   once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use shortfuse::sync::Unpoison;

use super::{dev, direct, ring_alive, CHANNEL};
use crate::calls::table::{Ptr, Timeout};
use crate::sys::fs;
use crate::user;

const EFAULT: i64 = -(libc::EFAULT as i64);
const EINVAL: i64 = -(libc::EINVAL as i64);

/// The readiness a request on the socket lends a /dev/fuse descriptor.
const READABLE: i16 = libc::POLLIN | libc::POLLRDNORM;

/// A wait on the kernel for the daemon's descriptors and our socket: it
/// holds none of our locks, so a fork meanwhile need not wait for it (a
/// daemon's reading threads spend most of their time in one).
pub(super) fn blocking(wait: impl FnOnce() -> i64) -> i64 {
    crate::fork_gate::outside(wait)
}

/// The signal mask a wait runs with: the one the program gave the call
/// (ppoll's, pselect6's), else the one of the call being served; never
/// SIGSYS, which Syscall User Dispatch needs.
pub(super) fn wait_mask(given: Option<u64>) -> Option<u64> {
    given
        .or_else(crate::calls::special::program_mask)
        .map(|m| m & !crate::sud::SIGSYS_BIT)
}

/// The program's timeout as a timespec of ours (None: no limit).
fn timeout_in(t: Timeout) -> Result<Option<libc::timespec>, i64> {
    // SAFETY (of each get): a pointer argument of the call, into the program's memory, to a plain C type.
    Ok(match t {
        Timeout::Millis(ms) if ms < 0 => None,
        Timeout::Millis(ms) => Some(libc::timespec {
            tv_sec: i64::from(ms / 1000),
            tv_nsec: i64::from(ms % 1000) * 1_000_000,
        }),
        Timeout::Spec(p) | Timeout::Val(p) if p.is_null() => None,
        Timeout::Spec(p) => Some(unsafe { user::get::<libc::timespec>(p.0) }.map_err(|_| EFAULT)?),
        Timeout::Val(p) => {
            let tv = unsafe { user::get::<libc::timeval>(p.0) }.map_err(|_| EFAULT)?;
            if !(0..1_000_000).contains(&tv.tv_usec) {
                return Err(EINVAL);
            }
            Some(libc::timespec {
                tv_sec: tv.tv_sec,
                tv_nsec: tv.tv_usec * 1000,
            })
        }
    })
}

/// What was left of the timeout, given back where the kernel gives it.
fn timeout_out(t: Timeout, left: Option<libc::timespec>) {
    let Some(left) = left else { return };
    // SAFETY (of each put): the call's own timeout argument, which the kernel would have written.
    let _ = match t {
        Timeout::Millis(_) => Ok(()),
        Timeout::Spec(p) => unsafe { user::put(p.0, &left) },
        Timeout::Val(p) => unsafe {
            user::put(
                p.0,
                &libc::timeval {
                    tv_sec: left.tv_sec,
                    tv_usec: left.tv_nsec / 1000,
                },
            )
        },
    };
}

/// ppoll's signal set at `p` (null: none given).
fn sigset_at(p: Ptr) -> Result<Option<u64>, i64> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
    unsafe { user::get::<u64>(p.0) }.map(Some).map_err(|_| EFAULT)
}

/// poll and ppoll: None when no /dev/fuse descriptor of ours is waited
/// for to be readable (the call goes on as it is).
pub(super) fn poll(fds: Ptr, n: u64, timeout: Timeout, mask: Ptr) -> Option<i64> {
    const SIZE: usize = std::mem::size_of::<libc::pollfd>();
    if !ring_alive() || n == 0 || n > super::MAX_FD as u64 {
        return None;
    }
    let len = n as usize * SIZE;
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let theirs = unsafe { user::slice(fds.0, len) }.ok()?;
    let mut set: Vec<libc::pollfd> = theirs
        .chunks_exact(SIZE)
        .map(|c| libc::pollfd {
            fd: i32::from_ne_bytes([c[0], c[1], c[2], c[3]]),
            events: i16::from_ne_bytes([c[4], c[5]]),
            revents: 0,
        })
        .collect();
    let asks = |p: &libc::pollfd| p.events & READABLE != 0 && dev(p.fd.into()) != 0;
    if !set.iter().any(asks) {
        return None;
    }
    let mut left = match timeout_in(timeout) {
        Ok(t) => t,
        Err(e) => return Some(e),
    };
    let mask = match sigset_at(mask) {
        Ok(m) => wait_mask(m),
        Err(e) => return Some(e),
    };
    set.push(libc::pollfd {
        fd: direct::bell().unwrap_or(-1),
        events: libc::POLLIN,
        revents: 0,
    });
    set.push(libc::pollfd {
        fd: CHANNEL.load(Ordering::Relaxed),
        events: libc::POLLIN,
        revents: 0,
    });
    let queued = direct::bell().is_some() && direct::waits_elsewhere();
    let mut zero = Some(libc::timespec { tv_sec: 0, tv_nsec: 0 });
    let wait = if queued { zero.as_mut() } else { left.as_mut() };
    let r = blocking(|| fs::ppoll(&mut set, wait, mask.as_ref()));
    timeout_out(timeout, left);
    if r < 0 {
        return Some(r);
    }
    let ring = set.pop().is_some_and(|c| c.revents != 0);
    let ring = set.pop().is_some_and(|c| c.revents != 0) || ring || queued;
    // SAFETY: as above; nothing of ours refers to it any longer.
    let Ok(out) = (unsafe { user::slice_mut(fds.0, len) }) else {
        return Some(EFAULT);
    };
    let mut ready = 0;
    for (p, c) in set.iter_mut().zip(out.chunks_exact_mut(SIZE)) {
        if ring && asks(p) {
            p.revents |= p.events & READABLE;
        }
        ready += i64::from(p.revents != 0);
        c[6..8].copy_from_slice(&p.revents.to_ne_bytes());
    }
    Some(ready)
}

/// Whether bit `fd` is set in a descriptor set.
fn has(set: &[u64], fd: usize) -> bool {
    set.get(fd / 64).is_some_and(|w| w & (1 << (fd % 64)) != 0)
}

/// select and pselect6: None as for [`poll`].
pub(super) fn select(n: i32, sets: [Ptr; 3], timeout: Timeout, mask: Ptr) -> Option<i64> {
    let ch = usize::try_from(CHANNEL.load(Ordering::Relaxed)).ok()?;
    let bits = usize::try_from(n).ok().filter(|&b| b > 0 && b <= super::MAX_FD)?;
    if !ring_alive() || sets[0].is_null() {
        return None;
    }
    // The kernel reads and writes whole words of each set.
    let theirs = bits.div_ceil(64) * 8;
    // The eventfd a ring client's request wakes, waited for beside the socket.
    let bell = direct::bell().and_then(|b| usize::try_from(b).ok());
    let top = bits.max(ch + 1).max(bell.map_or(0, |b| b + 1));
    let words = top.div_ceil(64);
    let mut ours = [vec![0u64; words], vec![0u64; words], vec![0u64; words]];
    for (p, set) in sets.iter().zip(ours.iter_mut()) {
        if p.is_null() {
            continue;
        }
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        let b = unsafe { user::slice(p.0, theirs) }.ok()?;
        for (w, c) in set.iter_mut().zip(b.chunks_exact(8)) {
            *w = u64::from_ne_bytes(c.try_into().unwrap_or_default());
        }
    }
    let asked: Vec<usize> = (0..bits)
        .filter(|&fd| has(&ours[0], fd) && dev(fd as i64) != 0)
        .collect();
    if asked.is_empty() {
        return None;
    }
    let mut left = match timeout_in(timeout) {
        Ok(t) => t,
        Err(e) => return Some(e),
    };
    let given = if mask.is_null() {
        Ok(None)
    } else {
        // SAFETY: pselect6's pointer to its { sigset pointer, size } pair, in the program's memory.
        match unsafe { user::get::<[u64; 2]>(mask.0) } {
            Ok([set, _]) => sigset_at(Ptr(set as i64)),
            Err(_) => Err(EFAULT),
        }
    };
    let mask = match given {
        Ok(m) => wait_mask(m),
        Err(e) => return Some(e),
    };
    ours[0][ch / 64] |= 1 << (ch % 64);
    if let Some(b) = bell {
        ours[0][b / 64] |= 1 << (b % 64);
    }
    let queued = bell.is_some() && direct::waits_elsewhere();
    let mut zero = Some(libc::timespec { tv_sec: 0, tv_nsec: 0 });
    let wait = if queued { zero.as_mut() } else { left.as_mut() };
    let nfds = top as i32;
    let [r, w, e] = &mut ours;
    let w = (!sets[1].is_null()).then_some(w.as_mut_slice());
    let e = (!sets[2].is_null()).then_some(e.as_mut_slice());
    let r = blocking(|| fs::pselect6(nfds, [Some(r.as_mut_slice()), w, e], wait, mask.as_ref()));
    timeout_out(timeout, left);
    if r < 0 {
        return Some(r);
    }
    // Our descriptors are never the program's: their bits are cleared.
    let rung = bell.is_some_and(|b| {
        let hit = has(&ours[0], b);
        ours[0][b / 64] &= !(1 << (b % 64));
        hit
    });
    if has(&ours[0], ch) || rung || queued {
        ours[0][ch / 64] &= !(1 << (ch % 64));
        for fd in asked {
            ours[0][fd / 64] |= 1 << (fd % 64);
        }
    }
    let mut ready = 0;
    for (p, set) in sets.iter().zip(ours.iter()) {
        if p.is_null() {
            continue;
        }
        ready += (0..bits).filter(|&fd| has(set, fd)).count() as i64;
        // SAFETY: as above.
        let Ok(out) = (unsafe { user::slice_mut(p.0, theirs) }) else {
            return Some(EFAULT);
        };
        for (w, c) in set.iter().zip(out.chunks_exact_mut(8)) {
            c.copy_from_slice(&w.to_ne_bytes());
        }
    }
    Some(ready)
}

/// A watch of the socket beside a /dev/fuse descriptor in an epoll.
struct Watch {
    ep: i32,
    fd: i32,
    /// Our epoll descriptor, which watches the socket.
    ours: i32,
}

static WATCHES: Mutex<Vec<Watch>> = Mutex::new(Vec::new());
/// Whether there may be a watch (spares every close the lock).
static ANY: AtomicBool = AtomicBool::new(false);

/// epoll_ctl of a /dev/fuse descriptor, made by `reissue` as the program
/// asked; the watch beside it follows. None for any other descriptor.
pub(super) fn epoll_ctl(ep: i32, op: i32, fd: i32, event: Ptr, reissue: impl Fn() -> i64) -> Option<i64> {
    if dev(fd.into()) == 0 {
        return None;
    }
    let r = reissue();
    if r < 0 {
        return Some(r);
    }
    let mut t = WATCHES.lock().unpoison();
    // A change is made as a new watch: it starts as the kernel's change
    // leaves the descriptor (re-armed after EPOLLONESHOT, say).
    if matches!(op, libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL) {
        unwatch(&mut t, |w| w.ep == ep && w.fd == fd);
    }
    if op == libc::EPOLL_CTL_DEL || !ring_alive() {
        return Some(r);
    }
    // SAFETY: the call's own event argument, which the kernel has just read.
    let Ok(ev) = (unsafe { user::get::<libc::epoll_event>(event.0) }) else {
        return Some(r);
    };
    let events = ev.events;
    if events & (libc::EPOLLIN | libc::EPOLLRDNORM) as u32 == 0 {
        return Some(r);
    }
    // EPOLLEXCLUSIVE is refused for an epoll descriptor as the target.
    let kept = (libc::EPOLLET | libc::EPOLLONESHOT | libc::EPOLLWAKEUP) as u32;
    let theirs = libc::epoll_event {
        events: libc::EPOLLIN as u32 | events & kept,
        u64: ev.u64,
    };
    if let Some(ours) = watch(ep, &theirs) {
        t.push(Watch { ep, fd, ours });
        ANY.store(true, Ordering::Relaxed);
    }
    Some(r)
}

/// Our epoll descriptor watching the socket, added to `ep` with `ev`.
fn watch(ep: i32, ev: &libc::epoll_event) -> Option<i32> {
    let low = fs::epoll_create1(libc::EPOLL_CLOEXEC);
    if low < 0 {
        return None;
    }
    // Out of the daemon's way, as our socket is.
    let ours = fs::fcntl_int(low as i32, libc::F_DUPFD_CLOEXEC, super::CHANNEL_FLOOR);
    fs::close(low as i32);
    let ours = i32::try_from(ours).ok().filter(|&d| d >= 0)?;
    let socket = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    let ch = CHANNEL.load(Ordering::Relaxed);
    if fs::epoll_ctl(ours, libc::EPOLL_CTL_ADD, ch, Some(&socket)) < 0
        || direct::bell().is_some_and(|b| fs::epoll_ctl(ours, libc::EPOLL_CTL_ADD, b, Some(&socket)) < 0)
        || fs::epoll_ctl(ep, libc::EPOLL_CTL_ADD, ours, Some(ev)) < 0
    {
        fs::close(ours);
        return None;
    }
    // A request already queued is reported by the eventfd.
    if direct::bell().is_some() && direct::waits_elsewhere() {
        if let Some(b) = direct::bell() {
            fs::write(b, &1u64.to_ne_bytes());
        }
    }
    Some(ours)
}

/// Removes the watches `which` picks, closing ours (which takes each out
/// of the program's epoll).
fn unwatch(t: &mut Vec<Watch>, which: impl Fn(&Watch) -> bool) {
    t.retain(|w| {
        let out = which(w);
        if out {
            fs::close(w.ours);
        }
        !out
    });
}

/// The program closes `fd`: the watches beside it, or in it, go.
pub(super) fn closed(fd: i32) {
    if ANY.load(Ordering::Relaxed) {
        unwatch(&mut WATCHES.lock().unpoison(), |w| w.fd == fd || w.ep == fd);
    }
}

/// `shortfuse serve` has gone: no watch reports the socket (at its end)
/// again.
pub(super) fn gone() {
    if ANY.load(Ordering::Relaxed) {
        let ch = CHANNEL.load(Ordering::Relaxed);
        for w in WATCHES.lock().unpoison().iter() {
            fs::epoll_ctl(w.ours, libc::EPOLL_CTL_DEL, ch, None);
        }
    }
}
