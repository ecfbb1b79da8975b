//! Answering later: a request taken now and answered from another thread
//! or an async task, with no worker thread held while it waits.
//!
//! A file system opts in with [`crate::Filesystem::answers_later`]; the
//! dispatcher then calls the `*_deferred` variants of the methods that a
//! network file system spends its time waiting in
//! ([`crate::Filesystem::lookup_deferred`],
//! [`crate::Filesystem::getattr_deferred`],
//! [`crate::Filesystem::read_deferred`],
//! [`crate::Filesystem::write_deferred`],
//! [`crate::Filesystem::setattr_deferred`]), handing each a reply handle
//! ([`ReplyEntry`], [`ReplyAttr`], [`ReplyData`], [`ReplyWrite`]). The handle
//! is `Send + 'static`: keep it, return at once, and call it from any
//! thread when the answer is known. The worker that took the request goes
//! on to the next one at once (libfuse's `fuse_req_t`, fuser's typed
//! `Reply*` objects work the same way). Every other method stays
//! synchronous.
//!
//! Every handle answers exactly once: calling it consumes it, and one
//! dropped unanswered answers `EIO` (a request the kernel never hears of
//! again would hang its caller, unkillable, in the kernel).
//!
//! Transports: `dev` writes the reply to /dev/fuse from the answering
//! thread; `uring` hands it to the ring's worker, which commits the entry
//! (the entry is not parked in the kernel while its request waits, so
//! `uring_depth` bounds the requests one worker has in flight). The
//! in-process and shared-memory transports answer a request before they
//! take the next one by nature: there the dispatcher waits for the handle.
//!
//! # Interrupts
//!
//! When the caller of a waiting request gets a signal, the kernel sends
//! FUSE_INTERRUPT. The dispatcher keeps the requests whose handles are out;
//! an interrupt marks its request, which the file system sees through
//! [`ReplyData::is_interrupted`] (and the same on every handle) or is told of
//! through [`ReplyData::on_interrupt`]. Answering [`Errno::EINTR`] then ends
//! the caller's system call at once; a caller killed by a fatal signal
//! waits for that answer before it can exit. Requests served synchronously
//! are not interrupted: they run to completion as before (the protocol
//! allows a daemon to ignore interrupts).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use shortfuse_abi as abi;

use crate::dispatch::encode;
use crate::errno::Errno;
use crate::sync::Unpoison;
use crate::types::{Attr, Entry, FileType};

/// How long the kernel may trust the attributes in a reply: the mount's
/// timeout, or for regular files the file system's own when it set one
/// ([`crate::InitConfig::file_attr_timeout`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttrTtl {
    pub(crate) any: Duration,
    pub(crate) regular: Option<Duration>,
}

impl AttrTtl {
    /// The timeout of `attr`.
    pub(crate) fn of(&self, attr: &Attr) -> Duration {
        match self.regular {
            Some(t) if attr.file_type() == FileType::Regular => t,
            _ => self.any,
        }
    }
}

/// Where a transport sends a reply that is ready after the request left
/// the dispatcher. Called from whatever thread answers, once per request.
pub trait ReplySink: Send + Sync {
    /// Sends `reply` (a whole message: `fuse_out_header` and payload) for
    /// the request `unique`.
    fn send(&self, unique: u64, reply: &[u8]);
}

type Callback = Box<dyn FnOnce() + Send>;

/// One request whose handle is out.
#[derive(Default)]
struct Waiting {
    interrupted: AtomicBool,
    on_interrupt: Mutex<Option<Callback>>,
}

impl Waiting {
    fn interrupt(&self) {
        self.interrupted.store(true, Ordering::Release);
        let callback = self.on_interrupt.lock().unpoison().take();
        if let Some(f) = callback {
            f();
        }
    }
}

/// Interrupts that arrived before their request's handle was made (another
/// worker read the request and has not reached the file system yet) are
/// kept this many at most; request ids are never reused, so a stale one
/// costs only its slot.
const EARLY_INTERRUPTS: usize = 64;

/// The requests of one connection whose handles are out, by `unique`.
#[derive(Default)]
pub(crate) struct InFlight {
    waiting: Mutex<HashMap<u64, Arc<Waiting>>>,
    early: Mutex<VecDeque<u64>>,
}

impl InFlight {
    fn register(&self, unique: u64) -> Arc<Waiting> {
        let w = Arc::new(Waiting::default());
        self.waiting.lock().unpoison().insert(unique, w.clone());
        let early = {
            let mut early = self.early.lock().unpoison();
            let found = early.iter().position(|&u| u == unique);
            found.and_then(|i| early.remove(i)).is_some()
        };
        if early {
            w.interrupt();
        }
        w
    }

    fn done(&self, unique: u64) {
        self.waiting.lock().unpoison().remove(&unique);
    }

    /// FUSE_INTERRUPT of request `unique`.
    pub(crate) fn interrupt(&self, unique: u64) {
        let found = self.waiting.lock().unpoison().get(&unique).cloned();
        match found {
            Some(w) => w.interrupt(),
            None => {
                let mut early = self.early.lock().unpoison();
                if early.len() == EARLY_INTERRUPTS {
                    early.pop_front();
                }
                early.push_back(unique);
            }
        }
    }

    /// Requests whose handles are out now.
    pub(crate) fn len(&self) -> usize {
        self.waiting.lock().unpoison().len()
    }
}

/// A sink for transports that answer one request before taking the next:
/// the dispatcher waits on it for the reply.
#[derive(Default)]
pub(crate) struct Wait {
    reply: Mutex<Option<Vec<u8>>>,
    ready: Condvar,
}

impl ReplySink for Wait {
    fn send(&self, _unique: u64, reply: &[u8]) {
        *self.reply.lock().unpoison() = Some(reply.to_vec());
        self.ready.notify_all();
    }
}

impl Wait {
    /// Blocks until the reply was sent; it is then in `out`.
    pub(crate) fn take(&self, out: &mut Vec<u8>) {
        let mut slot = self.reply.lock().unpoison();
        loop {
            if let Some(r) = slot.take() {
                out.clear();
                out.extend_from_slice(&r);
                return;
            }
            slot = self.ready.wait(slot).unpoison();
        }
    }
}

/// The untyped core of every handle: where the answer goes and the
/// request's interrupt state.
struct Reply {
    unique: u64,
    sink: Arc<dyn ReplySink>,
    inflight: Arc<InFlight>,
    waiting: Arc<Waiting>,
    sent: bool,
}

impl Reply {
    fn new(unique: u64, sink: Arc<dyn ReplySink>, inflight: Arc<InFlight>) -> Reply {
        let waiting = inflight.register(unique);
        Reply {
            unique,
            sink,
            inflight,
            waiting,
            sent: false,
        }
    }

    fn send(mut self, build: impl FnOnce(&mut Vec<u8>, u64)) {
        let mut buf = Vec::new();
        build(&mut buf, self.unique);
        self.sent = true;
        // Out of the table first: an interrupt arriving now finds nothing.
        self.inflight.done(self.unique);
        self.sink.send(self.unique, &buf);
    }

    fn error(self, err: Errno) {
        self.send(|buf, unique| encode::reply_error(buf, unique, err));
    }

    fn is_interrupted(&self) -> bool {
        self.waiting.interrupted.load(Ordering::Acquire)
    }

    fn on_interrupt(&self, f: Callback) {
        let mut slot = self.waiting.on_interrupt.lock().unpoison();
        if self.is_interrupted() {
            drop(slot);
            f();
        } else {
            *slot = Some(f);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.sent {
            tracing::warn!("request {} dropped unanswered; answering EIO", self.unique);
            self.sent = true;
            self.inflight.done(self.unique);
            let mut buf = Vec::new();
            encode::reply_error(&mut buf, self.unique, Errno::EIO);
            self.sink.send(self.unique, &buf);
        }
    }
}

/// What every reply handle offers besides its answer.
macro_rules! common {
    ($f:tt) => {
        /// Whether the kernel asked to interrupt this request (its caller
        /// got a signal). Answer [`Errno::EINTR`] unless the work is done.
        pub fn is_interrupted(&self) -> bool {
            self.$f.is_interrupted()
        }

        /// Calls `f` once when the request is interrupted: on the thread
        /// that reads the interrupt, or at once when that already
        /// happened. `f` must not block; it typically wakes whatever waits
        /// for the answer. Replaces an earlier callback.
        pub fn on_interrupt(&self, f: impl FnOnce() + Send + 'static) {
            self.$f.on_interrupt(Box::new(f))
        }

        /// The request's id (`fuse_in_header.unique`).
        pub fn unique(&self) -> u64 {
            self.$f.unique
        }
    };
}

/// The answer to READ: the bytes read (fewer than asked only at the end of
/// the file, unless the file is opened with direct I/O).
pub struct ReplyData(Reply);

impl ReplyData {
    common!(0);

    /// Answers with an error.
    pub fn error(self, err: Errno) {
        self.0.error(err)
    }

    /// Answers with `data`.
    pub fn data(self, data: &[u8]) {
        self.0.send(|buf, unique| encode::reply_bytes(buf, unique, data))
    }
}

/// The answer to WRITE: how many bytes were written.
pub struct ReplyWrite(Reply);

impl ReplyWrite {
    common!(0);

    /// Answers with an error.
    pub fn error(self, err: Errno) {
        self.0.error(err)
    }

    /// Answers that `n` bytes were written.
    pub fn written(self, n: usize) {
        let out = abi::fuse_write_out {
            size: u32::try_from(n).unwrap_or(u32::MAX),
            padding: 0,
        };
        self.0.send(|buf, unique| encode::reply_struct(buf, unique, &out))
    }
}

/// The answer to a request that returns nothing but success or an error
/// (FSYNC, FSYNCDIR served on a helper thread by the dispatcher).
pub(crate) struct ReplyEmpty(Reply);

impl ReplyEmpty {
    /// Answers success or the error.
    pub(crate) fn result(self, r: crate::errno::Result<()>) {
        match r {
            Ok(()) => self.0.send(encode::reply_ok),
            Err(e) => self.0.error(e),
        }
    }
}

/// The answer to GETATTR and SETATTR: the node's attributes, cached by the
/// kernel for the mount's attribute timeout.
pub struct ReplyAttr {
    reply: Reply,
    ttl: AttrTtl,
}

impl ReplyAttr {
    common!(reply);

    /// Answers with an error.
    pub fn error(self, err: Errno) {
        self.reply.error(err)
    }

    /// Answers with `attr`.
    pub fn attr(self, attr: &Attr) {
        let out = encode::attr_out(attr, self.ttl.of(attr));
        self.reply.send(|buf, unique| encode::reply_struct(buf, unique, &out))
    }
}

/// The answer to LOOKUP: the entry (one lookup reference the kernel then
/// holds, as from [`crate::Filesystem::lookup`]).
pub struct ReplyEntry {
    reply: Reply,
    entry_ttl: Duration,
    attr_ttl: AttrTtl,
    negative_ttl: Duration,
}

impl ReplyEntry {
    common!(reply);

    /// Answers with an error. `ENOENT` becomes a negative entry cached for
    /// the mount's negative timeout, as from the synchronous `lookup`.
    pub fn error(self, err: Errno) {
        if err == Errno::ENOENT && !self.negative_ttl.is_zero() {
            let (entry_valid, entry_valid_nsec) = encode::split_duration(self.negative_ttl);
            let out = abi::fuse_entry_out {
                entry_valid,
                entry_valid_nsec,
                ..Default::default()
            };
            return self.reply.send(|buf, unique| encode::reply_struct(buf, unique, &out));
        }
        self.reply.error(err)
    }

    /// Answers with `entry`. If the kernel no longer waits (the request
    /// was interrupted meanwhile) the reference is lost, as with libfuse.
    pub fn entry(self, entry: &Entry) {
        let out = encode::entry_out(entry, self.entry_ttl, self.attr_ttl.of(&entry.attr));
        self.reply.send(|buf, unique| encode::reply_struct(buf, unique, &out))
    }
}

/// Makes the handles; the dispatcher's side.
pub(crate) struct Replies {
    pub(crate) sink: Arc<dyn ReplySink>,
    pub(crate) inflight: Arc<InFlight>,
    pub(crate) unique: u64,
}

impl Replies {
    fn core(&self) -> Reply {
        Reply::new(self.unique, self.sink.clone(), self.inflight.clone())
    }

    pub(crate) fn data(&self) -> ReplyData {
        ReplyData(self.core())
    }

    pub(crate) fn write(&self) -> ReplyWrite {
        ReplyWrite(self.core())
    }

    pub(crate) fn empty(&self) -> ReplyEmpty {
        ReplyEmpty(self.core())
    }

    pub(crate) fn attr(&self, ttl: AttrTtl) -> ReplyAttr {
        ReplyAttr {
            reply: self.core(),
            ttl,
        }
    }

    pub(crate) fn entry(&self, entry_ttl: Duration, attr_ttl: AttrTtl, negative_ttl: Duration) -> ReplyEntry {
        ReplyEntry {
            reply: self.core(),
            entry_ttl,
            attr_ttl,
            negative_ttl,
        }
    }
}
