//! The queue workers: taking requests from a client's queues, checking
//! who may ask what, serving them and handing the replies back.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shortfuse::{Outcome, Transport};
use shortfuse_abi::{self as abi};
use zerocopy::FromBytes;

use crate::region::{self, slot, SLOT_HEADER};
use crate::{sys, wait};

use super::changes;
use super::track::tracked;
use super::{error_reply, Acting, Conn, Locked, Shared, Who};

impl Conn {
    /// The next slot index published in queue `q` at `head`, if any; an
    /// index outside the queue is consumed and dropped.
    pub(super) fn take(&self, q: usize, head: &mut u32) -> Option<Option<usize>> {
        let e = self.region.u32_at(self.geo.entry_off(q, *head)).load(Ordering::Acquire);
        let i = region::entry_slot(*head, e)?;
        *head = head.wrapping_add(1);
        Some((i < self.geo.slots).then_some(i as usize))
    }

    pub(super) fn has_work(&self, q: usize, head: u32) -> bool {
        let e = self.region.u32_at(self.geo.entry_off(q, head)).load(Ordering::SeqCst);
        region::entry_slot(head, e).is_some()
    }

    /// Serves the request in slot `i` of queue `q`.
    pub(super) fn serve(&self, shared: &Shared, q: usize, i: usize, req: &mut Vec<u8>, reply: &mut Vec<u8>) {
        let off = self.geo.slot_off(q, i);
        let len = self.region.u32_at(off + 4).load(Ordering::Acquire) as usize;
        reply.clear();
        if (std::mem::size_of::<abi::fuse_in_header>()..=self.geo.slot_data as usize).contains(&len) {
            req.resize(len, 0);
            self.region.read(off + SLOT_HEADER, req);
            let pid = self.region.u32_at(off + 8).load(Ordering::Relaxed);
            match self.lock_request(shared, req, reply, true) {
                Some(Locked::Wait) => {
                    // Answered by `Shared::retry_parked` once it can be.
                    shared.park(self.id, q, i, req);
                    return;
                }
                Some(Locked::Done) => {}
                None => self.dispatch(shared, req, reply, pid),
            }
        }
        self.complete(q, i, req, reply);
    }

    /// Writes the reply to `req` in slot `i` of queue `q` and hands the
    /// slot back to the client.
    pub(super) fn complete(&self, q: usize, i: usize, req: &[u8], reply: &mut Vec<u8>) {
        let off = self.geo.slot_off(q, i);
        let state = self.region.u32_at(off);
        let len_word = self.region.u32_at(off + 4);
        if state.load(Ordering::Acquire) == slot::DETACHED
            && state
                .compare_exchange(slot::DETACHED, slot::FREE, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            // Nobody reads this reply: the slot goes back to the clients.
            return;
        }
        if reply.len() > self.geo.slot_data as usize {
            let unique = abi::parse_header(req).map_or(0, |h| h.unique);
            error_reply(reply, unique, libc::EIO);
        }
        self.region.write(off + SLOT_HEADER, reply);
        len_word.store(reply.len() as u32, Ordering::Relaxed);
        if state.swap(slot::DONE, Ordering::AcqRel) == slot::SLEEPING {
            sys::futex_wake(state, 1);
        }
    }

    /// Serves one request; `pid` is the process the client says sent it
    /// (only used to spare it the notifications of its own changes).
    pub(super) fn dispatch(&self, shared: &Shared, req: &[u8], reply: &mut Vec<u8>, pid: u32) {
        let Ok(h) = abi::parse_header(req) else {
            return;
        };
        // DESTROY would end the file system for every client: a client
        // leaves by closing its socket.
        if h.opcode == abi::FUSE_DESTROY {
            error_reply(reply, h.unique, libc::EPERM);
            return;
        }
        let dir = h.opcode == abi::FUSE_RELEASEDIR;
        if (dir || h.opcode == abi::FUSE_RELEASE) && !self.releasing(req, h.nodeid, pid, dir) {
            error_reply(reply, h.unique, 0);
            return;
        }
        // Who asks, and whether the client may say so (see `caller`).
        let Some(who) = Who::of(req, &h) else {
            error_reply(reply, h.unique, libc::EINVAL);
            return;
        };
        if !self.peer.may_be(&who) {
            error_reply(reply, h.unique, libc::EPERM);
            return;
        }
        let letting_go = matches!(
            h.opcode,
            abi::FUSE_FORGET | abi::FUSE_BATCH_FORGET | abi::FUSE_FLUSH | abi::FUSE_RELEASE | abi::FUSE_RELEASEDIR
        );
        if who.uid != shared.owner && !shared.opts.allow_other && !letting_go {
            // A program that left the daemon's user (setuid) is another
            // user now: as for a kernel mount without allow_other.
            error_reply(reply, h.unique, libc::EACCES);
            return;
        }
        if !self.peer.may_name_any_node(shared.owner) && !self.names_given_nodes(shared, req, &h) {
            // Node ids are not capabilities the file system checks (mem
            // trusts them): another user's program could name a file
            // below a directory it may not search. The kernel hands a
            // daemon only the nodes it looked up; so does this server.
            if matches!(h.opcode, abi::FUSE_FORGET | abi::FUSE_BATCH_FORGET) {
                reply.clear();
            } else {
                error_reply(reply, h.unique, libc::ESTALE);
            }
            return;
        }
        let acting = match Acting::start(&who, shared.config.impersonate) {
            Ok(a) => a,
            Err(e) => {
                error_reply(reply, h.unique, e);
                return;
            }
        };
        let outcome = self.handle(shared, req, reply);
        drop(acting);
        if outcome == Outcome::NoReply {
            reply.clear();
        }
        shared.fill_listing(req, reply);
        self.settle(shared, req, reply, pid);
    }

    /// After the file system answered `req` (from process `pid`) with
    /// `reply`: what the client now holds, and telling the other clients,
    /// the kernel mount and the watches of a change.
    pub(super) fn settle(&self, shared: &Shared, req: &[u8], reply: &[u8], pid: u32) {
        let Ok(h) = abi::parse_header(req) else {
            return;
        };
        let ok = shortfuse::answered_ok(reply);
        // A failed request hands out nothing and changes nothing; only the
        // ones giving something back count when they fail (a stat of a
        // missing name skips the parse and the lock).
        let gives_back = matches!(h.opcode, abi::FUSE_FORGET | abi::FUSE_BATCH_FORGET);
        if !tracked(h.opcode) || !(ok || gives_back) {
            return;
        }
        let Ok(parsed) = abi::parse(req) else {
            return;
        };
        if let (true, abi::Operation::Lookup { name }) = (ok, &parsed.op) {
            if let Ok((e, _)) = abi::fuse_entry_out::read_from_prefix(reply.get(16..).unwrap_or(&[])) {
                use std::os::unix::ffi::OsStrExt;
                shared.entries.learn(h.nodeid, name.as_bytes(), &e, Instant::now());
            }
        }
        if let Some(p) = self.track(&parsed, ok, reply, pid) {
            if !shared.reaper.watch(p) {
                shared.process_ended(p);
            }
        }
        if ok {
            changes(&parsed, |n| {
                shared.announce(self.id, pid, n);
                shared.tell_kernel(n);
            });
            // Before the caller has its answer: a program sees the events
            // of its own changes once the call returns, as on a kernel
            // file system.
            shared.watches.apply(&parsed, reply);
        }
    }

    /// One request to the file system: through the dispatcher, or as bytes
    /// to an unmodified daemon.
    pub(super) fn handle(&self, shared: &Shared, req: &[u8], reply: &mut Vec<u8>) -> Outcome {
        let Some(f) = &shared.forward else {
            return self.dispatcher.handle(req, reply, Transport::Ring);
        };
        let start = shared.stats.timed().then(Instant::now);
        let outcome = f.forward(req, reply);
        let opcode = abi::parse_header(req).map_or(0, |h| h.opcode);
        let nanos = start.map_or(0, |s| u64::try_from(s.elapsed().as_nanos()).unwrap_or(u64::MAX));
        shared.stats.record(opcode, Transport::Ring, nanos);
        outcome
    }
}

/// How long an idle worker sleeps before it looks for a stalled queue.
const HOLE_WAIT: Duration = Duration::from_millis(500);

/// How long a reserved position may stay empty, with later ones reserved,
/// before the worker goes on past it. Wall time, not wake-ups: other
/// threads' rings wake the worker many times while a thread that reserved
/// is merely descheduled on a loaded machine.
const HOLE_SKIP: Duration = Duration::from_secs(1);

/// Positions a worker went on past, still watched: a request published at
/// one late is served all the same.
#[derive(Default)]
pub(super) struct Holes {
    positions: Vec<u32>,
    /// Since when `head` has been empty with later positions reserved.
    since: Option<Instant>,
}

impl Holes {
    /// After a sleep that found nothing at `head`: goes past it once it
    /// has stayed empty for [`HOLE_SKIP`] while `tail` is beyond it.
    pub(super) fn look(&mut self, head: &mut u32, tail: u32, slots: u32) {
        if tail == *head {
            self.since = None;
            return;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() >= HOLE_SKIP {
            self.positions.push(*head);
            *head = head.wrapping_add(1);
            self.since = None;
        }
        // A position's entry word is reused `slots` positions later.
        self.positions.retain(|p| head.wrapping_sub(*p) < slots);
    }

    /// The slot published late at a position gone past, if any (consumed).
    pub(super) fn take(&mut self, conn: &Conn, q: usize) -> Option<Option<usize>> {
        let k = self.positions.iter().position(|p| conn.has_work(q, *p))?;
        let mut p = self.positions.swap_remove(k);
        conn.take(q, &mut p)
    }

    pub(super) fn any(&self, conn: &Conn, q: usize) -> bool {
        self.positions.iter().any(|p| conn.has_work(q, *p))
    }
}

/// One queue's worker: take, serve, and when the queue stays empty for the
/// spin budget, sleep on the queue's doorbell until a client rings it.
pub(super) fn worker(shared: &Shared, conn: &Conn, q: usize) {
    // Not pinned anywhere: see `wait` for why.
    let mut head = 0u32;
    let mut holes = Holes::default();
    let poll = wait::Poll::default();
    let mut req = Vec::with_capacity(conn.geo.slot_data as usize);
    let mut reply = Vec::with_capacity(conn.geo.slot_data as usize);
    let bell = conn.region.u32_at(conn.geo.doorbell_off(q));
    loop {
        if conn.stop.load(Ordering::Relaxed) {
            return;
        }
        let taken = match conn.take(q, &mut head) {
            Some(i) => {
                holes.since = None;
                Some(i)
            }
            None if holes.positions.is_empty() => None,
            None => holes.take(conn, q),
        };
        if let Some(i) = taken {
            if let Some(i) = i {
                conn.serve(shared, q, i, &mut req, &mut reply);
            }
            continue;
        }
        if poll.until(shared.config.spin, || {
            conn.stop.load(Ordering::Relaxed) || conn.has_work(q, head)
        }) {
            continue;
        }
        bell.store(1, Ordering::SeqCst);
        if conn.has_work(q, head) || conn.stop.load(Ordering::SeqCst) || holes.any(conn, q) {
            bell.store(0, Ordering::Relaxed);
            continue;
        }
        // A client that keeps the word away from 1 only makes its own
        // worker poll.
        sys::futex_wait(bell, 1, Some(HOLE_WAIT));
        if conn.has_work(q, head) || holes.any(conn, q) {
            // The client rang: its next requests follow closely (the rest of
            // an open, a loop of calls), and each would ring again and wait
            // for a wake-up if we kept sleeping at once.
            poll.reset();
            continue;
        }
        // A process that shares the connection (forked from the client) and
        // died between reserving a position and publishing its slot there
        // would stall the queue for everyone else.
        let tail = conn.region.u32_at(conn.geo.tail_off(q)).load(Ordering::Relaxed);
        holes.look(&mut head, tail, conn.geo.slots);
    }
}
