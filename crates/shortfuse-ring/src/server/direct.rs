//! The direct path of an unmodified daemon (see
//! [`crate::foreign::Forward::direct`]): the daemon's own threads take a
//! client's requests from its queues and answer most of them in its slots.
//! What stays with the server runs here, on one job thread per client:
//! the bookkeeping of what the daemon answered (lookups and handles to
//! give back when the client goes, lent backing files, stats), telling
//! other clients and the kernel mount of changes before the caller has its
//! answer, and the requests the daemon hands over whole (releases, locks,
//! requests whose credentials need the full check). An answer to note or
//! tell that finds the job thread idle is done on the thread that read it
//! instead (see [`Jobs::push_or_take`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use shortfuse::sync::{lock, Unpoison};
use shortfuse::Transport;
use shortfuse_abi as abi;

use crate::foreign::DIRECT_AWAKE;
use crate::region::{header, DAEMON_GONE};
use crate::sys;

use super::{Conn, Shared};

/// Work the daemon left to the server for one of a direct client's slots.
pub enum DirectJob {
    /// Serve slot `.1` of queue `.0` as a worker would.
    Handover(usize, usize),
    /// The daemon answered `req` with `reply`: keep the books; with
    /// `complete`, the server hands the reply to the client afterwards.
    Done {
        queue: usize,
        slot: usize,
        pid: u32,
        complete: bool,
        req: Vec<u8>,
        reply: Vec<u8>,
    },
}

/// A direct client's jobs, in the order the daemon sent them.
#[derive(Default)]
pub(super) struct Jobs {
    queue: Mutex<Queue>,
    ready: Condvar,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<DirectJob>,
    /// The job thread runs one (or the reader runs one in its place).
    running: bool,
}

impl Jobs {
    /// Queues `job`, or hands it back to be run at once by the caller
    /// (the daemon's reader, which alone pushes jobs) when nothing of the
    /// client is queued or running and the job is an answer `serve` only
    /// has to note and tell (see [`runs_at_once`]): the job thread would be
    /// one more thread wake-up, on the path of a caller waiting for a
    /// change. [`Jobs::ran`] ends it.
    pub(super) fn push_or_take(&self, job: DirectJob) -> Option<DirectJob> {
        let mut q = lock(&self.queue);
        if q.jobs.is_empty() && !q.running && runs_at_once(&job) {
            q.running = true;
            return Some(job);
        }
        q.jobs.push_back(job);
        drop(q);
        self.ready.notify_one();
        None
    }

    /// A job [`Jobs::push_or_take`] handed back was run.
    pub(super) fn ran(&self) {
        lock(&self.queue).running = false;
        self.ready.notify_one();
    }

    pub(super) fn wake(&self) {
        let _g = lock(&self.queue);
        self.ready.notify_all();
    }
}

/// Whether `job` may run on the daemon's reader: an answer to note (a
/// lookup), or one to tell and hand over (a change, a flush), whose
/// bookkeeping calls nothing of the daemon. Not a handover (it waits for
/// the daemon's answer, which may need the reader), nor what hands out a
/// file handle (a process found gone has its handles released there and
/// then, through the daemon).
fn runs_at_once(job: &DirectJob) -> bool {
    let DirectJob::Done { req, .. } = job else {
        return false;
    };
    abi::parse_header(req).is_ok_and(|h| !matches!(h.opcode, abi::FUSE_OPEN | abi::FUSE_OPENDIR | abi::FUSE_CREATE))
}

/// Runs a direct client's jobs until it is halted and none is left.
pub(super) fn jobs(shared: &Shared, conn: &Conn) {
    let (mut req, mut reply) = (Vec::new(), Vec::new());
    loop {
        let job = {
            let mut q = lock(&conn.jobs.queue);
            loop {
                // Not while the reader runs one in our place: in order.
                if !q.running {
                    if let Some(j) = q.jobs.pop_front() {
                        q.running = true;
                        break j;
                    }
                    if conn.stop.load(Ordering::SeqCst) {
                        return;
                    }
                }
                q = conn.jobs.ready.wait(q).unpoison();
            }
        };
        run(shared, conn, job, &mut req, &mut reply);
        lock(&conn.jobs.queue).running = false;
    }
}

/// Runs one job of a direct client (`req` and `reply`: buffers to reuse).
pub(super) fn run(shared: &Shared, conn: &Conn, job: DirectJob, req: &mut Vec<u8>, reply: &mut Vec<u8>) {
    match job {
        DirectJob::Handover(q, i) if q < conn.geo.queues as usize && i < conn.geo.slots as usize => {
            conn.serve(shared, q, i, req, reply);
        }
        DirectJob::Handover(..) => {}
        DirectJob::Done {
            queue,
            slot,
            pid,
            complete,
            req,
            mut reply,
        } => {
            if let Ok(h) = abi::parse_header(&req) {
                shared.stats.record(h.opcode, Transport::Ring, 0);
            }
            if abi::parse_header(&req).is_ok_and(|h| h.opcode == abi::FUSE_FLUSH) {
                // The caller's POSIX locks on the file go with its close.
                let mut unused = Vec::new();
                conn.lock_request(shared, &req, &mut unused, false);
            }
            shared.fill_listing(&req, &mut reply);
            conn.settle(shared, &req, &reply, pid);
            {
                let _t = lock(&conn.track);
                conn.tracked.notify_all();
            }
            if complete && queue < conn.geo.queues as usize && slot < conn.geo.slots as usize {
                conn.complete(queue, slot, &req, &mut reply);
            }
        }
    }
}

/// How long a relay sleeps before it looks whether the daemon died.
const DEATH_WAIT: Duration = Duration::from_millis(200);

/// A direct client's queue: the daemon takes its requests itself. While it
/// is awake the queue's doorbell holds [`DIRECT_AWAKE`]; before it sleeps
/// it arms the bell (1); the client rings by swapping 1 for 0 and waking
/// us, and we wake the daemon through its eventfd. A daemon that polls
/// never needs us. A daemon that died takes the requests it held with it:
/// the client is told the file system is gone, and its waiting calls fail
/// with ENOTCONN.
pub(super) fn relay(shared: &Shared, conn: &Conn, q: usize) {
    let Some(forward) = shared.forward.as_ref() else {
        return;
    };
    let Some(bell_fd) = forward.bell() else {
        return;
    };
    let bell = conn.region.u32_at(conn.geo.doorbell_off(q));
    loop {
        if conn.stop.load(Ordering::SeqCst) {
            return;
        }
        if forward.daemon_gone() {
            conn.region.u32_at(header::DAEMON).store(DAEMON_GONE, Ordering::Release);
            for i in 0..conn.geo.slots as usize {
                sys::futex_wake(conn.region.u32_at(conn.geo.slot_off(q, i)), i32::MAX);
            }
            sys::futex_wait(bell, bell.load(Ordering::SeqCst), Some(DEATH_WAIT));
            continue;
        }
        let v = bell.load(Ordering::SeqCst);
        if v == 0 {
            // Rung. Taken back to "awake" before the daemon is woken: a
            // ring after it wakes and arms again is a new 0, never one we
            // already passed on (a wait on 0 would sleep through it).
            if bell
                .compare_exchange(0, DIRECT_AWAKE, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                let one = 1u64.to_ne_bytes();
                let _ = sys::write(bell_fd, &one);
                forward.rung();
            }
            continue;
        }
        // A wake reaches us whatever value we waited on.
        sys::futex_wait(bell, v, Some(DEATH_WAIT));
    }
}

/// How long a client's message about a handle the daemon gave it waits
/// for the daemon's word of that handle (already sent when the client had
/// its reply, so only for the server's threads to run).
const TRACK_WAIT: Duration = Duration::from_secs(2);

impl Conn {
    /// The client's books, once `found` holds of them: at once for a client
    /// the server serves itself; for a direct client, once the job thread
    /// recorded what the daemon handed out (or after a bound, for a handle
    /// that was never handed out).
    pub(super) fn track_with(&self, found: impl Fn(&super::Track) -> bool) -> std::sync::MutexGuard<'_, super::Track> {
        let t = lock(&self.track);
        if !self.direct.load(Ordering::Relaxed) || found(&t) {
            return t;
        }
        self.tracked
            .wait_timeout_while(t, TRACK_WAIT, |t| !found(t) && !self.stop.load(Ordering::Relaxed))
            .unpoison()
            .0
    }
}
