//! Changes answered later (`-o page_cache`): a write or a truncation that
//! must give back a read lease whose pages the kernel holds drops those
//! pages first ([`Inner::lock_dropping_pages`]), and the kernel waits for
//! every READ in flight on them before it has. Such a READ waits in the
//! kernel's queue for a worker; with every worker waiting in a
//! notification (one worker is enough), neither would ever go on.
//!
//! So a worker never waits for the kernel: WRITE and SETATTR are answered
//! through the library's `*_deferred` methods. They run on the worker at
//! once, as before, unless they come to a notification: then they stop
//! there ([`MUST_WAIT`], before anything was changed under the lease) and
//! go on from that point on a helper thread, which answers; the worker
//! goes back to the kernel's queue and serves the READs. Only the rare
//! change that gives back a caching lease pays for the thread hand-off
//! (and a copy of what is still to be written).

use std::cell::Cell;

use shortfuse::{Attr, Errno, NodeId, ReplyAttr, ReplyWrite, Request, Result, SetAttr, WriteArgs};

use super::{DistFs, Inner};

/// What a change fails with on a worker when it would wait for the kernel
/// (see the module docs); never answered to the kernel.
pub(super) const MUST_WAIT: Errno = Errno::EDEADLK;

thread_local! {
    /// Set while a worker runs a change that may be finished elsewhere.
    static ON_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// While it lives, this thread is a worker the kernel may be waiting on:
/// [`Inner::lock_dropping_pages`] fails with [`MUST_WAIT`] rather than
/// wait for the kernel.
struct OnWorker(());

impl OnWorker {
    fn enter() -> OnWorker {
        ON_WORKER.set(true);
        OnWorker(())
    }
}

impl Drop for OnWorker {
    fn drop(&mut self) {
        ON_WORKER.set(false);
    }
}

/// Whether this thread may not wait for the kernel (see [`OnWorker`]).
pub(super) fn on_worker() -> bool {
    ON_WORKER.get()
}

/// What a write of which `done` bytes went through answers: an error only
/// when nothing was written.
pub(super) fn written(done: usize, r: Result<()>) -> Result<usize> {
    match r {
        Err(e) if done == 0 => Err(e),
        _ => Ok(done),
    }
}

/// Answers a write of which `done` bytes went through (see [`written`]).
fn answer_write(reply: ReplyWrite, done: usize, r: Result<()>) {
    match written(done, r) {
        Ok(n) => reply.written(n),
        Err(e) => reply.error(e),
    }
}

impl DistFs {
    /// WRITE, finished on a helper thread when it must wait for the kernel.
    pub(super) fn write_later(&self, req: &Request, node: NodeId, data: &[u8], args: &WriteArgs, reply: ReplyWrite) {
        let inner = &self.inner;
        let (mut at, mut done) = (None, 0);
        let r = {
            let _worker = OnWorker::enter();
            inner.write_start(req, node, args).and_then(|start| {
                let at = at.insert(start);
                inner.write_all(node.0, at, data, &mut done)
            })
        };
        let (Err(MUST_WAIT), Some(mut at)) = (r, at) else {
            return answer_write(reply, done, r);
        };
        let rest = data[done..].to_vec();
        let me = inner.clone();
        inner.run_elsewhere(Box::new(move || {
            let mut more = 0;
            let r = me.write_all(node.0, &mut at, &rest, &mut more);
            answer_write(reply, done + more, r);
        }));
    }

    /// SETATTR, done again on a helper thread when it must wait for the
    /// kernel (it stops before it changes anything).
    pub(super) fn setattr_later(&self, req: &Request, node: NodeId, set: &SetAttr, reply: ReplyAttr) {
        let answer = |reply: ReplyAttr, r: Result<Attr>| match r {
            Ok(a) => reply.attr(&a),
            Err(e) => reply.error(e),
        };
        let r = {
            let _worker = OnWorker::enter();
            self.inner.setattr(req, node, set)
        };
        if !matches!(r, Err(MUST_WAIT)) {
            return answer(reply, r);
        }
        let (me, req, set) = (self.inner.clone(), *req, *set);
        self.inner
            .run_elsewhere(Box::new(move || answer(reply, me.setattr(&req, node, &set))));
    }
}

impl Inner {
    /// Runs `job` on a helper thread (the revokers' pool, which starts
    /// another thread whenever all are busy, so it never waits behind a
    /// revocation). If no thread can start, `job` waits for the next one
    /// that does.
    fn run_elsewhere(&self, job: super::revokers::Job) {
        if let Err(e) = self.revokers.run(job) {
            tracing::warn!("distfs: starting a thread to finish a change: {e}");
        }
    }
}
