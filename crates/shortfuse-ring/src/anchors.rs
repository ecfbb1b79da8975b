//! Open handles owned by open file descriptions rather than by a ring
//! connection.
//!
//! A program's open file description outlives the process image that
//! opened it: a shell opens `> /mnt/f` in a forked child and execs the
//! command (a new image, a new connection); a parent and its forked child
//! share one description and one offset. So the shim gives every open file
//! of a ring mount a kernel file of its own (a memfd, whose descriptors are
//! the program's descriptors of that open file, in every process) and, once
//! the description can reach another process (before a fork, an exec, a
//! descriptor sent over a socket), hands the daemon that file with the
//! handle ([`crate::proto::AnchorMsg`]); until then the handle is the
//! opening process's (the server's `Handle`). The
//! daemon watches it with inotify: IN_CLOSE fires when the kernel drops the
//! open file description, that is when the last descriptor of it closes, in
//! whichever process, however it ends (close, exit, kill -9, FD_CLOEXEC at
//! exec). Then the daemon releases the handle, the lookup the description
//! held, and the description's flock and OFD locks.
//!
//! The kernel does the counting, so the daemon needs nothing from the
//! processes: a description passed to another program over a Unix socket
//! stays open too. The one thing that fools it is an open of the memfd's
//! own inode through `/proc/PID/fd/N` by a program without the shim (the
//! shim serves those paths itself for its descriptors): its close reads
//! as the last one.

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// What an anchored description holds in the file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub node: u64,
    pub fh: u64,
    pub dir: bool,
    /// Lookups of `node` the description keeps (given to it by a
    /// connection that ended before it).
    pub lookups: u64,
    /// The lock owner of the description's flock and OFD locks.
    pub owner: u64,
}

/// The descriptions the daemon watches.
pub(crate) struct Anchors {
    inotify: OwnedFd,
    held: Mutex<HashMap<i32, Held>>,
    /// Held from reading close events until the locks of the descriptions
    /// they name are gone (see [`Anchors::closed`]).
    reading: Mutex<()>,
    /// Taken by [`Anchors::closed`], not yet [`Anchors::released`].
    releasing: AtomicUsize,
}

/// Lock owners of flock and OFD locks taken through a description: this
/// bit and the inode number of its memfd (the shim computes the same).
pub const DESCRIPTION_OWNER: u64 = 1 << 63;

impl Anchors {
    pub fn new() -> io::Result<Anchors> {
        Ok(Anchors {
            inotify: sys::inotify()?,
            held: Mutex::new(HashMap::new()),
            reading: Mutex::new(()),
            releasing: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Held>> {
        self.held.lock().unpoison()
    }

    /// The lock owner of the description `fd` stands for, when `fd` is a
    /// memfd (what the shim passes); `None` for anything else.
    pub fn owner_of(fd: BorrowedFd<'_>) -> Option<u64> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
        if !link.as_os_str().as_encoded_bytes().starts_with(b"/memfd:") {
            return None;
        }
        sys::inode(fd).map(|ino| DESCRIPTION_OWNER | ino)
    }

    /// Watches `description` and gives it `held`; `Err` gives `held` back
    /// when it cannot be watched. The daemon's own descriptor of it is
    /// dropped here: if it was the last, the close event comes at once.
    pub fn add(&self, description: OwnedFd, held: Held) -> Result<(), Held> {
        let mut table = self.lock();
        match sys::watch_close(self.inotify.as_raw_fd(), description.as_raw_fd()) {
            Ok(wd) => {
                table.insert(wd, held);
                drop(table);
                drop(description);
                Ok(())
            }
            Err(_) => Err(held),
        }
    }

    /// Gives one lookup of `node` to a description open on it that holds
    /// none; false when there is no such description.
    pub fn keep_lookup(&self, node: u64) -> bool {
        let mut t = self.lock();
        match t.values_mut().find(|h| h.node == node && h.lookups == 0) {
            Some(h) => {
                h.lookups = 1;
                true
            }
            None => false,
        }
    }

    /// Whether the description whose lock owner is `owner` (see
    /// [`Anchors::owner_of`]) holds handle `fh` on `node`.
    pub fn holds(&self, owner: u64, node: u64, fh: u64) -> bool {
        self.lock()
            .values()
            .any(|h| h.owner == owner && h.node == node && h.fh == fh && !h.dir)
    }

    /// Whether the description whose lock owner is `owner` holds handle
    /// `fh` on `node`, of a file or a directory.
    pub fn holds_any(&self, owner: u64, node: u64, fh: u64) -> bool {
        self.lock()
            .values()
            .any(|h| h.owner == owner && h.node == node && h.fh == fh)
    }

    /// Whether one of the descriptions `mine` says is the asker's holds a
    /// handle on `node`.
    pub fn holds_node(&self, node: u64, mine: impl Fn(u64) -> bool) -> bool {
        self.lock().values().any(|h| h.node == node && mine(h.owner))
    }

    /// Descriptions watched now or still being released.
    pub fn len(&self) -> usize {
        self.lock().len() + self.releasing.load(Ordering::SeqCst)
    }

    /// The caller of [`Anchors::closed`] gave back what one of the
    /// descriptions it took held.
    pub fn released(&self) {
        self.releasing.fetch_sub(1, Ordering::SeqCst);
    }

    /// Calls `settle` whenever close events are queued, until `stop` is
    /// set (looked at every 200 ms); `settle` takes them with
    /// [`Anchors::closed`].
    pub fn run(&self, stop: &AtomicBool, mut settle: impl FnMut()) {
        while !stop.load(Ordering::Relaxed) {
            match sys::wait_events(self.inotify.as_raw_fd(), Duration::from_millis(200)) {
                Ok(true) => settle(),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!("shortfuse ring: inotify: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// Takes from the table every description whose close event is queued
    /// now (without waiting) and hands each to `drop_locks` before
    /// returning. The kernel queues the event before the closing `close`
    /// returns, and a caller that comes after another's read waits here
    /// until that one has dropped the locks too: so a lock request that
    /// conflicts with a description can call this and try again, and the
    /// locks of a description closed before the request was sent are gone,
    /// as a kernel drops a description's flock in the last `close`. The
    /// rest of the release (handle, lookups) is the caller's, after, and
    /// it says [`Anchors::released`] for each.
    pub fn closed(&self, mut drop_locks: impl FnMut(&Held)) -> Vec<Held> {
        let _reading = self.reading.lock().unpoison();
        let mut buf = [0u8; 4096];
        let mut gone = Vec::new();
        loop {
            let n = match sys::read_events(self.inotify.as_raw_fd(), &mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("shortfuse ring: inotify: {e}");
                    break;
                }
            };
            let mut at = 0;
            while at + 16 <= n {
                let word = |i: usize| u32::from_ne_bytes(buf[at + i..at + i + 4].try_into().unwrap_or([0; 4]));
                let wd = word(0) as i32;
                let len = word(12) as usize;
                at += 16 + len;
                // IN_ONESHOT: one close event, then IN_IGNORED; either ends it.
                let h = {
                    let mut t = self.lock();
                    let h = t.remove(&wd);
                    if h.is_some() {
                        // Counted in before it leaves the table.
                        self.releasing.fetch_add(1, Ordering::SeqCst);
                    }
                    h
                };
                if let Some(h) = h {
                    drop_locks(&h);
                    gone.push(h);
                }
            }
        }
        gone
    }
}

mod sys {
    #![allow(unsafe_code)]

    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
    use std::time::Duration;

    pub fn inotify() -> io::Result<OwnedFd> {
        // SAFETY: no pointers; a new descriptor we own.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is new and ours.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// One close event for the inode of open file `fd` (through its magic
    /// link, which names the file itself, not a path).
    pub fn watch_close(inotify: RawFd, fd: RawFd) -> io::Result<i32> {
        let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).map_err(|_| io::ErrorKind::InvalidInput)?;
        let mask = libc::IN_CLOSE_WRITE | libc::IN_CLOSE_NOWRITE | libc::IN_ONESHOT;
        // SAFETY: a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(inotify, path.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(wd)
    }

    /// Waits up to `timeout` for events; true when some are queued.
    pub fn wait_events(inotify: RawFd, timeout: Duration) -> io::Result<bool> {
        let mut p = libc::pollfd {
            fd: inotify,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd.
        let r = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
        match r {
            r if r > 0 => Ok(true),
            0 => Ok(false),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => Ok(false),
                e => Err(e),
            },
        }
    }

    /// Reads the events queued now into `buf` (the descriptor does not
    /// block); 0 when there are none.
    pub fn read_events(inotify: RawFd, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::read(inotify, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        Ok(n as usize)
    }

    pub fn inode(fd: BorrowedFd<'_>) -> Option<u64> {
        // SAFETY: zeroed stat is valid; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is writable.
        (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0).then_some(st.st_ino)
    }
}
