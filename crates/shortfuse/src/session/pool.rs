//! /dev/fuse readers started on demand, up to the configured number.
//!
//! Every reader of a connection waits on the same kernel queue, and the
//! kernel wakes them in turn: with N readers and one program waiting on
//! each reply, every request wakes a different, cold thread, and the
//! asynchronous messages (FORGET, RELEASE) run beside the next request and
//! compete with it for the CPUs. On this project's 2-core machines that
//! made open+close and unlink 35-40% slower with two readers than with one
//! (measured at real-time priority: 19.5 against 14.4 µs, 38 against
//! 29 µs). So a session starts with one reader, as libfuse's
//! single-threaded loop does, and adds one only when callers keep waiting:
//! having handled a synchronous request, before replying, a reader checks
//! (`poll`, no wait) whether the queue already holds another, and when the
//! request it then reads is synchronous too, a second caller waited;
//! [`GROW_AFTER`] such requests in a row start the next reader. Requests
//! nobody waits for (FORGET, RELEASE after close) are left out: a lone
//! program produces them between its own requests (counting them grew a
//! second reader under a single open/close loop), parallel programs show
//! a backlog of real requests at once. The request read must also come
//! from another caller (thread id in the request header) than the one just
//! answered: what was waiting at the check may be a FORGET that the
//! kernel lets the same program's next request overtake (it does so after
//! runs of FORGETs), and counting that grew a second reader under a lone
//! create/unlink loop, where a second reader makes each unlink slower.
//! Readers never retire: a daemon that has seen parallel load keeps its
//! readers.

use crate::sync::Unpoison;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::abi;
use crate::dispatch::Dispatcher;
use crate::mount;
use crate::sys;

/// Consecutive handled requests that found another one waiting before a
/// reader is added.
pub const GROW_AFTER: u32 = 4;

type Worker = fn(File, &Dispatcher, &Arc<Pool>) -> io::Result<()>;

/// The readers of one connection.
pub struct Pool {
    master: File,
    dispatcher: Arc<Dispatcher>,
    worker: Worker,
    max: usize,
    started: AtomicUsize,
    handles: Mutex<Vec<JoinHandle<io::Result<()>>>>,
}

impl Pool {
    /// A pool of up to `max` readers of the connection `master` (kept to
    /// clone new readers' descriptors from); none runs yet.
    pub fn new(master: File, dispatcher: Arc<Dispatcher>, max: usize, worker: Worker) -> Arc<Pool> {
        Arc::new(Pool {
            master,
            dispatcher,
            worker,
            max: max.max(1),
            started: AtomicUsize::new(0),
            handles: Mutex::new(Vec::new()),
        })
    }

    /// Readers started so far.
    pub fn started(&self) -> usize {
        self.started.load(Ordering::Relaxed)
    }

    /// Whether another reader may still be started.
    pub fn can_grow(&self) -> bool {
        self.started() < self.max
    }

    /// Starts one more reader on `fd` (the first one reads the master
    /// descriptor itself, later ones a clone of it). False at the limit.
    pub fn grow(self: &Arc<Pool>) -> io::Result<bool> {
        let n = self.started.fetch_add(1, Ordering::AcqRel);
        if n >= self.max {
            self.started.fetch_sub(1, Ordering::AcqRel);
            return Ok(false);
        }
        let started = (|| {
            let fd = if n == 0 {
                self.master.try_clone()?
            } else {
                mount::clone_dev_fd(&self.master)?
            };
            let pool = self.clone();
            std::thread::Builder::new()
                .name(format!("shortfuse-dev-{n}"))
                .spawn(move || (pool.worker)(fd, &pool.dispatcher, &pool))
        })();
        match started {
            Ok(h) => {
                self.handles.lock().unpoison().push(h);
                Ok(true)
            }
            Err(e) => {
                self.started.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Whether all readers started so far have ended.
    pub fn all_finished(&self) -> bool {
        self.handles.lock().unpoison().iter().all(|h| h.is_finished())
    }

    /// Waits for every reader, including those started while waiting (a
    /// reader pushes its successor's handle before it can end). Returns the
    /// first error.
    pub fn join(&self) -> io::Result<()> {
        let mut result = Ok(());
        loop {
            let next = self.handles.lock().unpoison().pop();
            let Some(h) = next else {
                return result;
            };
            let r = h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a worker thread panicked")));
            if result.is_ok() {
                result = r;
            }
        }
    }
}

/// Per-reader bookkeeping of the backlog seen after each request.
#[derive(Default)]
pub struct Backlog {
    streak: u32,
    /// A request was waiting when the last synchronous one was answered.
    pending: bool,
    /// The caller of the last synchronous request answered.
    answered: u32,
}

/// Requests nobody waits for: the kernel sends them after the caller's
/// system call returned (RELEASE after close), or without a reply at all.
/// A lone program produces them between its own requests, so they say
/// nothing about parallel callers.
fn asynchronous(opcode: u32) -> bool {
    matches!(
        opcode,
        abi::FUSE_FORGET
            | abi::FUSE_BATCH_FORGET
            | abi::FUSE_RELEASE
            | abi::FUSE_RELEASEDIR
            | abi::FUSE_INTERRUPT
            | abi::FUSE_NOTIFY_REPLY
    )
}

/// What the pool looks at in a raw request's `fuse_in_header`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub opcode: u32,
    /// The calling thread (`pid`, bytes 32..36; 0 outside the mount's
    /// pid namespace).
    pub caller: u32,
}

impl Seen {
    /// The opcode (bytes 4..8) and caller of a raw request; `None` when
    /// it is shorter than a header.
    pub fn of(request: &[u8]) -> Option<Seen> {
        let word = |at: usize| Some(u32::from_ne_bytes(request.get(at..at + 4)?.try_into().ok()?));
        Some(Seen {
            opcode: word(4)?,
            caller: word(32)?,
        })
    }

    fn synchronous(self) -> bool {
        !asynchronous(self.opcode)
    }
}

impl Backlog {
    /// Called once `seen` was handled on `dev`, before its reply is
    /// written: notes whether another request is already waiting. Only for
    /// a synchronous request: its caller is still blocked on us, so a
    /// request waiting now comes from a second caller. (After the reply the
    /// caller, woken on this CPU, often runs first and sends its next
    /// request before we look: a lone program then looked like two.)
    pub fn handled(&mut self, seen: Option<Seen>, dev: &File, pool: &Pool) {
        if !pool.can_grow() {
            return;
        }
        self.pending = false;
        let Some(seen) = seen.filter(|s| s.synchronous()) else {
            return;
        };
        self.answered = seen.caller;
        self.pending = sys::readable_now(dev.as_fd());
        if !self.pending {
            self.streak = 0;
        }
    }

    /// Called with the next request read: a synchronous request of another
    /// caller that was already waiting extends the streak, and
    /// [`GROW_AFTER`] in a row start another reader. Failing to start one
    /// is not fatal.
    pub fn read(&mut self, seen: Option<Seen>, pool: &Arc<Pool>) {
        if self.counts(seen) {
            self.streak += 1;
            if self.streak >= GROW_AFTER {
                self.streak = 0;
                if let Err(e) = pool.grow() {
                    tracing::warn!("starting another /dev/fuse reader: {e}");
                }
            }
        }
    }

    /// Whether `seen`, just read, shows a second caller waiting. A caller
    /// outside the mount's pid namespace reads as 0, which tells nothing:
    /// it counts, as every waiting request did before callers were told
    /// apart.
    fn counts(&mut self, seen: Option<Seen>) -> bool {
        std::mem::take(&mut self.pending)
            && seen.is_some_and(|s| s.synchronous() && (s.caller != self.answered || s.caller == 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(opcode: u32, caller: u32) -> Vec<u8> {
        let mut r = vec![0u8; 40];
        r[4..8].copy_from_slice(&opcode.to_ne_bytes());
        r[32..36].copy_from_slice(&caller.to_ne_bytes());
        r
    }

    /// A backlog that saw a request waiting after answering `caller`.
    fn waiting_after(caller: u32) -> Backlog {
        Backlog {
            pending: true,
            answered: caller,
            ..Backlog::default()
        }
    }

    #[test]
    fn the_header_gives_the_opcode_and_the_calling_thread() {
        let seen = Seen::of(&request(abi::FUSE_UNLINK, 4242));
        assert_eq!(
            seen,
            Some(Seen {
                opcode: abi::FUSE_UNLINK,
                caller: 4242
            })
        );
        assert_eq!(Seen::of(&[0u8; 20]), None);
    }

    #[test]
    fn only_another_callers_waiting_request_counts() {
        let next = |op, caller| Seen::of(&request(op, caller));
        // The same program's next request overtook a FORGET that was waiting.
        assert!(!waiting_after(7).counts(next(abi::FUSE_GETATTR, 7)));
        assert!(!waiting_after(7).counts(next(abi::FUSE_FORGET, 8)));
        assert!(waiting_after(7).counts(next(abi::FUSE_GETATTR, 8)));
        // Callers outside the mount's pid namespace cannot be told apart.
        assert!(waiting_after(0).counts(next(abi::FUSE_GETATTR, 0)));
        let mut b = waiting_after(7);
        assert!(b.counts(next(abi::FUSE_LOOKUP, 8)));
        assert!(!b.counts(next(abi::FUSE_LOOKUP, 8)), "one check counts once");
    }
}
