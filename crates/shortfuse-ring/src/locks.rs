//! The daemon's lock table: flock(2), POSIX and OFD byte-range locks taken
//! by every program on the rings and, with `--transport`, through the
//! kernel mount of the same daemon, so that all of them agree.
//!
//! The bundled file systems keep no locks (they leave them to the kernel),
//! so the daemon keeps them, by lock owner as FUSE names them:
//!
//! - POSIX locks: one owner per process. Ring clients send
//!   [`POSIX_OWNER`]` | pid`; the kernel sends its own opaque owner. A
//!   process's locks on a file go at any close of a descriptor of that file
//!   (FLUSH carries the owner) and when the process dies: the daemon
//!   watches every ring process holding a POSIX lock through a pidfd, so
//!   `kill -9` of a holder frees its locks at once.
//! - OFD locks (`F_OFD_SETLK`): the same table, owned by the open file
//!   description ([`crate::anchors::DESCRIPTION_OWNER`] `|` its memfd's
//!   inode for ring clients), released with the description.
//! - flock locks: whole-file, by description too, in a table of their own
//!   (as on Linux, they do not conflict with byte-range locks).
//!
//! F_SETLKW never holds up a ring worker: the ring server tries the lock
//! and, when it conflicts, parks the request; every change to the table
//! ([`Locks::on_change`]) retries the parked ones. Through the kernel mount
//! a waiting SETLKW blocks the kernel session's thread (as in libfuse) until
//! the table changes. Deadlocks between waiters are not detected.
//!
//! Owners are the clients' word, as FUSE's lock owners are the kernel's: a
//! client naming another process's owner can drop that process's locks
//! (advisory locks protect cooperating programs, not against a hostile one);
//! nothing it sends can make the daemon fault or block.

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use shortfuse::{Errno, Lock, LockType};

/// Lock owners of ring clients' POSIX locks: this bit and the pid.
pub const POSIX_OWNER: u64 = 1 << 62;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    owner: u64,
    start: u64,
    /// Inclusive; `u64::MAX` to end of file.
    end: u64,
    /// Read or Write.
    typ: LockType,
    pid: u32,
}

impl Range {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }
}

#[derive(Default)]
struct NodeLocks {
    posix: Vec<Range>,
    /// (owner, Read or Write)
    flock: Vec<(u64, LockType)>,
}

/// Every lock of a daemon.
#[derive(Default)]
pub struct Locks {
    nodes: Mutex<HashMap<u64, NodeLocks>>,
    changed: Condvar,
    /// Called after every release (the ring server retries parked waiters).
    on_change: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

fn conflicts(a: LockType, b: LockType) -> bool {
    a == LockType::Write || b == LockType::Write
}

impl Locks {
    pub fn new() -> Locks {
        Locks::default()
    }

    fn table(&self) -> MutexGuard<'_, HashMap<u64, NodeLocks>> {
        self.nodes.lock().unpoison()
    }

    /// Registers what runs after each release (once).
    pub fn on_change(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_change.set(f);
    }

    fn released(&self) {
        self.changed.notify_all();
        if let Some(f) = self.on_change.get() {
            f();
        }
    }

    /// F_GETLK: the first lock of another owner that conflicts with `lock`,
    /// or `lock` with `typ` Unlock.
    pub fn test(&self, node: u64, owner: u64, lock: &Lock) -> Lock {
        let t = self.table();
        let hit = t.get(&node).and_then(|n| {
            n.posix
                .iter()
                .find(|r| r.owner != owner && r.overlaps(lock.start, lock.end) && conflicts(r.typ, lock.typ))
        });
        match hit {
            Some(r) => Lock {
                start: r.start,
                end: r.end,
                typ: r.typ,
                pid: r.pid,
            },
            None => Lock {
                typ: LockType::Unlock,
                ..*lock
            },
        }
    }

    /// F_SETLK: takes, changes or drops `owner`'s lock on the range;
    /// EAGAIN when another owner's lock conflicts.
    pub fn set(&self, node: u64, owner: u64, lock: &Lock) -> Result<(), Errno> {
        if lock.start > lock.end {
            return Err(Errno::EINVAL);
        }
        let mut t = self.table();
        let n = t.entry(node).or_default();
        if lock.typ != LockType::Unlock
            && n.posix
                .iter()
                .any(|r| r.owner != owner && r.overlaps(lock.start, lock.end) && conflicts(r.typ, lock.typ))
        {
            return Err(Errno::EAGAIN);
        }
        // Cut the owner's ranges around [start, end], then add the new one.
        let mut kept = Vec::with_capacity(n.posix.len() + 2);
        let mut dropped = false;
        for r in n.posix.drain(..) {
            if r.owner != owner || !r.overlaps(lock.start, lock.end) {
                kept.push(r);
                continue;
            }
            dropped = true;
            if r.start < lock.start {
                kept.push(Range {
                    end: lock.start - 1,
                    ..r
                });
            }
            if r.end > lock.end {
                kept.push(Range {
                    start: lock.end + 1,
                    ..r
                });
            }
        }
        if lock.typ != LockType::Unlock {
            kept.push(Range {
                owner,
                start: lock.start,
                end: lock.end,
                typ: lock.typ,
                pid: lock.pid,
            });
        }
        n.posix = kept;
        self.settle(t, node, dropped);
        Ok(())
    }

    /// Ends a change to `node`'s locks: forgets a node left without any,
    /// lets go of the table, and tells the waiters when locks were dropped.
    fn settle(&self, mut t: MutexGuard<'_, HashMap<u64, NodeLocks>>, node: u64, dropped: bool) {
        if t.get(&node).is_some_and(|n| n.posix.is_empty() && n.flock.is_empty()) {
            t.remove(&node);
        }
        drop(t);
        if dropped {
            self.released();
        }
    }

    /// F_SETLKW through the kernel mount: waits until [`Locks::set`] succeeds.
    pub fn set_wait(&self, node: u64, owner: u64, lock: &Lock) -> Result<(), Errno> {
        self.wait_for(|| self.set(node, owner, lock))
    }

    /// Retries `take` until it does not answer EAGAIN, waking at every
    /// release (a timeout bounds a missed one).
    fn wait_for(&self, take: impl Fn() -> Result<(), Errno>) -> Result<(), Errno> {
        loop {
            match take() {
                Err(e) if e == Errno::EAGAIN => {}
                r => return r,
            }
            let t = self.table();
            let _ = self.changed.wait_timeout(t, std::time::Duration::from_millis(100));
        }
    }

    /// flock(2): `op` LOCK_SH, LOCK_EX or LOCK_UN (LOCK_NB ignored: the
    /// caller waits, see [`Locks::flock_wait`]). EWOULDBLOCK on conflict.
    pub fn flock(&self, node: u64, owner: u64, op: i32) -> Result<(), Errno> {
        let typ = match op & !libc::LOCK_NB {
            libc::LOCK_SH => LockType::Read,
            libc::LOCK_EX => LockType::Write,
            libc::LOCK_UN => LockType::Unlock,
            _ => return Err(Errno::EINVAL),
        };
        let mut t = self.table();
        let n = t.entry(node).or_default();
        if typ != LockType::Unlock && n.flock.iter().any(|&(o, held)| o != owner && conflicts(held, typ)) {
            return Err(Errno::EAGAIN);
        }
        let before = n.flock.len();
        n.flock.retain(|&(o, _)| o != owner);
        let dropped = n.flock.len() != before;
        if typ != LockType::Unlock {
            n.flock.push((owner, typ));
        }
        self.settle(t, node, dropped);
        Ok(())
    }

    /// flock(2) without LOCK_NB through the kernel mount.
    pub fn flock_wait(&self, node: u64, owner: u64, op: i32) -> Result<(), Errno> {
        self.wait_for(|| self.flock(node, owner, op))
    }

    /// Drops `owner`'s byte-range locks on `node` (a close of one of its
    /// descriptors of the file: FLUSH).
    pub fn release_on(&self, node: u64, owner: u64) {
        let mut t = self.table();
        let Some(n) = t.get_mut(&node) else { return };
        let before = n.posix.len();
        n.posix.retain(|r| r.owner != owner);
        let dropped = n.posix.len() != before;
        self.settle(t, node, dropped);
    }

    /// Drops every lock of `owner` (a process that died, a description
    /// closed for good).
    pub fn release_owner(&self, owner: u64) {
        if self.forget_owner(owner) {
            self.released();
        }
    }

    /// [`Locks::release_owner`] without telling the waiters (the caller
    /// does, with [`Locks::tell_waiters`], once it holds no lock of its
    /// own that a waiter's retry may need); true when locks were dropped.
    pub(crate) fn forget_owner(&self, owner: u64) -> bool {
        let mut t = self.table();
        let mut dropped = false;
        t.retain(|_, n| {
            let before = n.posix.len() + n.flock.len();
            n.posix.retain(|r| r.owner != owner);
            n.flock.retain(|&(o, _)| o != owner);
            dropped |= n.posix.len() + n.flock.len() != before;
            !(n.posix.is_empty() && n.flock.is_empty())
        });
        dropped
    }

    /// Tells the waiters that locks were dropped (see
    /// [`Locks::forget_owner`]).
    pub(crate) fn tell_waiters(&self) {
        self.released();
    }

    /// Locks held now (byte ranges and flocks), for tests and statistics.
    pub fn count(&self) -> usize {
        self.table().values().map(|n| n.posix.len() + n.flock.len()).sum()
    }
}

/// Watches the processes of ring clients that hold POSIX locks or file
/// handles of their own: a pidfd each, polled by one thread, which tells
/// the daemon when one ends (it then drops what the process held).
pub(crate) struct Reaper {
    epoll: std::os::fd::OwnedFd,
    pids: Mutex<HashMap<u32, std::os::fd::OwnedFd>>,
}

impl Reaper {
    pub fn new() -> std::io::Result<Reaper> {
        Ok(Reaper {
            epoll: sys::epoll()?,
            pids: Mutex::new(HashMap::new()),
        })
    }

    fn pids(&self) -> MutexGuard<'_, HashMap<u32, std::os::fd::OwnedFd>> {
        self.pids.lock().unpoison()
    }

    /// Watches process `pid` (see [`Reaper::run`]); false when it has
    /// ended already. A process that cannot be watched (the daemon is out
    /// of descriptors) counts as watched: what it holds then waits for its
    /// connection to end.
    pub fn watch(&self, pid: u32) -> bool {
        let mut pids = self.pids();
        if pids.contains_key(&pid) {
            return true;
        }
        match sys::pidfd(pid) {
            Ok(fd) => {
                if sys::epoll_add(&self.epoll, &fd, pid).is_ok() {
                    pids.insert(pid, fd);
                }
                true
            }
            Err(e) => e != libc::ESRCH,
        }
    }

    /// Hands `ended` every watched process that ends, until `stop` is set.
    pub fn run(&self, stop: &std::sync::atomic::AtomicBool, mut ended: impl FnMut(u32)) {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            for pid in sys::epoll_wait(&self.epoll, 200) {
                self.pids().remove(&pid);
                ended(pid);
            }
        }
    }
}

mod sys {
    #![allow(unsafe_code)]

    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    pub fn epoll() -> std::io::Result<OwnedFd> {
        // SAFETY: no pointers; a new descriptor we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is new and ours.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// A pidfd of `pid`, or the errno (ESRCH: no such process).
    pub fn pidfd(pid: u32) -> Result<OwnedFd, i32> {
        // pid 0 and negative pids are not processes to pidfd_open.
        let Ok(p) = libc::pid_t::try_from(pid) else {
            return Err(libc::ESRCH);
        };
        if p == 0 {
            return Err(libc::ESRCH);
        }
        // SAFETY: no pointers; a new descriptor we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, p, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        // SAFETY: fd is new and ours.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    pub fn epoll_add(epoll: &OwnedFd, fd: &OwnedFd, pid: u32) -> std::io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: u64::from(pid),
        };
        // SAFETY: ev is a valid event.
        let r = unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The pids whose pidfds became readable (their process ended) within
    /// `ms` milliseconds. Their pidfds close when the caller drops them,
    /// which takes them out of the epoll set.
    pub fn epoll_wait(epoll: &OwnedFd, ms: i32) -> Vec<u32> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 32];
        // SAFETY: evs is writable for its length.
        let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, ms) };
        evs[..usize::try_from(n).unwrap_or(0)]
            .iter()
            .map(|e| e.u64 as u32)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lk(start: u64, end: u64, typ: LockType) -> Lock {
        Lock {
            start,
            end,
            typ,
            pid: 7,
        }
    }

    #[test]
    fn byte_ranges_conflict_split_and_go_with_their_owner() {
        let l = Locks::new();
        l.set(1, 10, &lk(0, 99, LockType::Write)).unwrap();
        assert_eq!(l.set(1, 20, &lk(50, 60, LockType::Read)), Err(Errno::EAGAIN));
        assert_eq!(l.test(1, 20, &lk(50, 60, LockType::Read)).start, 0);
        // The owner's own lock never conflicts; a hole in the middle.
        l.set(1, 10, &lk(40, 59, LockType::Unlock)).unwrap();
        l.set(1, 20, &lk(45, 55, LockType::Write)).unwrap();
        assert_eq!(l.test(1, 30, &lk(0, 10, LockType::Read)).typ, LockType::Write);
        assert_eq!(l.test(1, 30, &lk(60, 99, LockType::Read)).start, 60);
        // Readers share.
        l.set(2, 10, &lk(0, u64::MAX, LockType::Read)).unwrap();
        l.set(2, 20, &lk(5, 5, LockType::Read)).unwrap();
        assert_eq!(l.set(2, 30, &lk(5, 5, LockType::Write)), Err(Errno::EAGAIN));
        l.release_on(2, 10);
        l.release_owner(20);
        l.set(2, 30, &lk(5, 5, LockType::Write)).unwrap();
        assert_eq!(l.test(1, 30, &lk(45, 55, LockType::Read)).typ, LockType::Unlock);
        assert_eq!(l.set(1, 1, &lk(9, 3, LockType::Read)), Err(Errno::EINVAL));
    }

    #[test]
    fn flocks_are_whole_file_and_apart_from_byte_ranges() {
        let l = Locks::new();
        l.flock(1, 10, libc::LOCK_SH).unwrap();
        l.flock(1, 20, libc::LOCK_SH).unwrap();
        assert_eq!(l.flock(1, 30, libc::LOCK_EX | libc::LOCK_NB), Err(Errno::EAGAIN));
        l.set(1, 30, &lk(0, u64::MAX, LockType::Write)).unwrap();
        l.flock(1, 10, libc::LOCK_UN).unwrap();
        l.release_owner(20);
        l.flock(1, 30, libc::LOCK_EX).unwrap();
        assert_eq!(l.count(), 2);
    }

    #[test]
    fn a_waiter_wakes_when_the_holder_lets_go() {
        let l = std::sync::Arc::new(Locks::new());
        l.set(1, 10, &lk(0, 0, LockType::Write)).unwrap();
        let l2 = l.clone();
        let t = std::thread::spawn(move || l2.set_wait(1, 20, &lk(0, 0, LockType::Write)));
        std::thread::sleep(std::time::Duration::from_millis(50));
        l.release_owner(10);
        assert_eq!(t.join().unwrap(), Ok(()));
    }
}
