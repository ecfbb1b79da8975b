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
//! single-threaded loop does, and adds one only when requests keep waiting:
//! after handling a request, a reader checks (`poll`, no wait) whether the
//! queue still holds one, and [`GROW_AFTER`] such checks in a row start the
//! next reader. A lone program whose messages alternate with the replies
//! rarely shows a backlog that long; parallel programs show it at once.
//! Readers never retire: a daemon that has seen parallel load keeps its
//! readers.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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
                self.handles.lock().unwrap_or_else(|p| p.into_inner()).push(h);
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
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .all(|h| h.is_finished())
    }

    /// Waits for every reader, including those started while waiting (a
    /// reader pushes its successor's handle before it can end). Returns the
    /// first error.
    pub fn join(&self) -> io::Result<()> {
        let mut result = Ok(());
        loop {
            let next = self.handles.lock().unwrap_or_else(|p| p.into_inner()).pop();
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
}

impl Backlog {
    /// Called after a request was handled on `dev`: adds a reader once
    /// requests kept waiting. Failing to add one is not fatal.
    pub fn after_request(&mut self, dev: &File, pool: &Arc<Pool>) {
        if !pool.can_grow() {
            return;
        }
        if !sys::readable_now(dev.as_fd()) {
            self.streak = 0;
            return;
        }
        self.streak += 1;
        if self.streak >= GROW_AFTER {
            self.streak = 0;
            if let Err(e) = pool.grow() {
                eprintln!("shortfuse: starting another /dev/fuse reader: {e}");
            }
        }
    }
}
