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
//! a backlog of real requests at once. Not perfect: a FORGET waiting at the
//! check, read after the program's next LOOKUP (the kernel lets requests
//! overtake long runs of FORGETs), counts too, so an unlink-heavy lone
//! program can still grow a second reader.
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

/// The opcode of a raw request (`fuse_in_header.opcode`, bytes 4..8).
pub fn opcode_of(request: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(request.get(4..8)?.try_into().ok()?))
}

impl Backlog {
    /// Called once `opcode` was handled on `dev`, before its reply is
    /// written: notes whether another request is already waiting. Only for
    /// a synchronous request: its caller is still blocked on us, so a
    /// request waiting now comes from a second caller. (After the reply the
    /// caller, woken on this CPU, often runs first and sends its next
    /// request before we look: a lone program then looked like two.)
    pub fn handled(&mut self, opcode: Option<u32>, dev: &File, pool: &Pool) {
        if !pool.can_grow() {
            return;
        }
        self.pending = false;
        if opcode.is_none_or(asynchronous) {
            return;
        }
        self.pending = sys::readable_now(dev.as_fd());
        if !self.pending {
            self.streak = 0;
        }
    }

    /// Called with the opcode of the next request read: a synchronous
    /// request that was already waiting extends the streak, and
    /// [`GROW_AFTER`] in a row start another reader. Failing to start one
    /// is not fatal.
    pub fn read(&mut self, opcode: Option<u32>, pool: &Arc<Pool>) {
        if !std::mem::take(&mut self.pending) || opcode.is_none_or(asynchronous) {
            return;
        }
        self.streak += 1;
        if self.streak >= GROW_AFTER {
            self.streak = 0;
            if let Err(e) = pool.grow() {
                tracing::warn!("starting another /dev/fuse reader: {e}");
            }
        }
    }
}
