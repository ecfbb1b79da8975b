//! What clients own beyond one request: open handles given to open file
//! descriptions (see [`crate::anchors`]), the lookups those keep, and locks
//! (see [`crate::locks`]), with the SETLKW requests that wait for one.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;

use shortfuse::{LockType, Transport};
use shortfuse_abi as abi;
use zerocopy::FromBytes;

use super::{error_reply, lock, Conn, Shared};
use crate::anchors::{Anchors, Held, DESCRIPTION_OWNER};
use crate::locks::POSIX_OWNER;
use crate::proto::{AnchorMsg, ANCHOR_MAGIC};

/// What [`Conn::lock_request`] did.
pub(super) enum Locked {
    /// Answered.
    Done,
    /// A SETLKW that has to wait.
    Wait,
}

/// A SETLKW waiting for its lock: the connection, slot and request.
pub(super) struct Parked {
    pub conn: u64,
    q: usize,
    i: usize,
    req: Vec<u8>,
}

fn nanos(t: std::time::Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Conn {
    /// Moves an open handle of this client to the open file description
    /// `fd` stands for; a handle the client does not hold, or a descriptor
    /// that is not a description's memfd, is ignored. The lookups stay the
    /// connection's: its processes still use the node (see
    /// [`Shared::keep_lookups`] for when it goes first).
    pub(super) fn anchor(&self, shared: &Shared, m: &AnchorMsg, fd: OwnedFd) {
        if m.magic != ANCHOR_MAGIC || m.dir > 1 {
            return;
        }
        let Some(owner) = Anchors::owner_of(fd.as_fd()) else {
            return;
        };
        let dir = m.dir == 1;
        let mut t = self.track_with(|t| t.handles.get(&(m.fh, dir)).is_some_and(|h| h.node == m.node));
        let pid = match t.handles.get(&(m.fh, dir)) {
            Some(h) if h.node == m.node => h.pid,
            _ => return,
        };
        t.handles.remove(&(m.fh, dir));
        drop(t);
        let held = Held {
            node: m.node,
            fh: m.fh,
            dir,
            lookups: 0,
            owner,
        };
        // Counted this client's before the table has it: a close seen at
        // once takes it out again (see `settle_anchors`).
        lock(&self.track).described.insert(owner);
        if let Err(h) = shared.anchors.add(fd, held) {
            let mut t = lock(&self.track);
            t.described.remove(&owner);
            t.handles.insert((h.fh, h.dir), super::Handle { node: h.node, pid });
        }
    }

    /// A claim ([`crate::proto::CLAIM_MAGIC`]): the description of
    /// `description` becomes one of this client's when it is anchored with
    /// handle `m.fh` on `m.node`; anything else is ignored.
    pub(super) fn claim(&self, shared: &Shared, m: &AnchorMsg, description: BorrowedFd<'_>) {
        let Some(owner) = Anchors::owner_of(description) else {
            return;
        };
        if shared.anchors.holds_any(owner, m.node, m.fh) {
            lock(&self.track).described.insert(owner);
        }
    }

    /// GETLK, SETLK and SETLKW, served from the daemon's lock table (see
    /// [`crate::locks`]); FLUSH drops the owner's byte-range locks on the
    /// file and goes on to the file system (`None`), as does every other
    /// request. A SETLKW that conflicts answers [`Locked::Wait`] when `park`
    /// says it may wait, else EAGAIN.
    pub(super) fn lock_request(&self, shared: &Shared, req: &[u8], reply: &mut Vec<u8>, park: bool) -> Option<Locked> {
        let h = abi::parse_header(req).ok()?;
        let body = req.get(std::mem::size_of::<abi::fuse_in_header>()..)?;
        if h.opcode == abi::FUSE_FLUSH {
            if let Ok((f, _)) = abi::fuse_flush_in::read_from_prefix(body) {
                shared.locks.release_on(h.nodeid, f.lock_owner);
            }
            return None;
        }
        if !matches!(h.opcode, abi::FUSE_GETLK | abi::FUSE_SETLK | abi::FUSE_SETLKW) {
            return None;
        }
        if h.opcode != abi::FUSE_GETLK {
            shared.note_locks(self);
        }
        let start = std::time::Instant::now();
        let Ok((arg, _)) = abi::fuse_lk_in::read_from_prefix(body) else {
            error_reply(reply, h.unique, libc::EINVAL);
            return Some(Locked::Done);
        };
        let lock = match shortfuse::Lock::try_from(&arg.lk) {
            Ok(l) => l,
            Err(e) => {
                error_reply(reply, h.unique, e.raw());
                return Some(Locked::Done);
            }
        };
        let (node, owner) = (h.nodeid, arg.owner);
        if h.opcode == abi::FUSE_GETLK {
            let mut l = shared.locks.test(node, owner, &lock);
            if l.typ != LockType::Unlock {
                // The holder may be a description closed a moment ago.
                shared.settle_anchors();
                l = shared.locks.test(node, owner, &lock);
            }
            shortfuse::dispatch::encode::reply_struct(reply, h.unique, &abi::fuse_lk_out::from(l));
            shared.stats.record(h.opcode, Transport::Ring, nanos(start));
            return Some(Locked::Done);
        }
        let take = || {
            if arg.lk_flags & abi::FUSE_LK_FLOCK != 0 {
                let op = match lock.typ {
                    LockType::Read => libc::LOCK_SH,
                    LockType::Write => libc::LOCK_EX,
                    LockType::Unlock => libc::LOCK_UN,
                };
                shared.locks.flock(node, owner, op)
            } else {
                shared.locks.set(node, owner, &lock)
            }
        };
        let mut r = take();
        if r == Err(shortfuse::Errno::EAGAIN) {
            // The conflicting lock may be a description's whose last close
            // the daemon has not read yet: the kernel queued its event
            // before that close returned, so before this request was sent.
            shared.settle_anchors();
            r = take();
        }
        if r == Err(shortfuse::Errno::EAGAIN) && h.opcode == abi::FUSE_SETLKW && park {
            return Some(Locked::Wait);
        }
        if r.is_ok() && lock.typ != LockType::Unlock && owner & (DESCRIPTION_OWNER | POSIX_OWNER) == POSIX_OWNER {
            let pid = owner as u32;
            if !shared.reaper.watch(pid) {
                shared.process_ended(pid);
            }
        }
        error_reply(reply, h.unique, r.err().map_or(0, |e| e.raw()));
        shared.stats.record(h.opcode, Transport::Ring, nanos(start));
        Some(Locked::Done)
    }
}

impl Shared {
    /// Client `asking` asks for a lock: from now on the closes of every
    /// client go through the server, which lets their locks go (see
    /// [`crate::region::header::LOCKS`]). Its own region is marked before
    /// it has its answer, so its next close cannot miss the lock.
    pub(super) fn note_locks(&self, asking: &Conn) {
        let word = crate::region::header::LOCKS;
        asking.region.u32_at(word).store(1, Ordering::Release);
        if !self.locks_asked.swap(true, Ordering::SeqCst) {
            for c in lock(&self.clients).iter() {
                c.region.u32_at(word).store(1, Ordering::Release);
            }
        }
    }

    pub(super) fn park(&self, conn: u64, q: usize, i: usize, req: &[u8]) {
        lock(&self.parked).push(Parked {
            conn,
            q,
            i,
            req: req.to_vec(),
        });
        // The holder may have let go between the try and the parking.
        self.retry_parked();
    }

    /// Tries every parked SETLKW again: answers those that got their lock
    /// (or an error), drops those of departed clients. Entered again from a
    /// release it causes itself, it only asks the running round for one more.
    pub(super) fn retry_parked(&self) {
        self.retry_again.store(true, Ordering::SeqCst);
        loop {
            if self.retrying.swap(true, Ordering::SeqCst) {
                return;
            }
            while self.retry_again.swap(false, Ordering::SeqCst) {
                self.retry_round();
            }
            self.retrying.store(false, Ordering::SeqCst);
            if !self.retry_again.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    fn retry_round(&self) {
        let parked = std::mem::take(&mut *lock(&self.parked));
        let mut still = Vec::new();
        let mut reply = Vec::new();
        for p in parked {
            let conn = lock(&self.clients).iter().find(|c| c.id == p.conn).cloned();
            let Some(conn) = conn.filter(|c| !c.stop.load(Ordering::Relaxed)) else {
                continue;
            };
            match conn.lock_request(self, &p.req, &mut reply, true) {
                Some(Locked::Wait) => still.push(p),
                _ => conn.complete(p.q, p.i, &p.req, &mut reply),
            }
        }
        lock(&self.parked).extend(still);
    }

    /// A departed connection's lookups of nodes that open descriptions still
    /// use (a program exec'd from it, a child): one of each stays, with a
    /// description, and is forgotten when that description closes. Returns
    /// how many lookups of `node` may be forgotten now.
    pub(super) fn keep_lookups(&self, node: u64, n: u64) -> u64 {
        if n > 0 && self.anchors.keep_lookup(node) {
            n - 1
        } else {
            n
        }
    }

    /// Gives back what the descriptions closed by now held: their flock and
    /// OFD locks first (a kernel drops them in the last close, before the
    /// release), then, with the table's lock let go, tells the waiters and
    /// releases the handles and lookups.
    pub(super) fn settle_anchors(&self) {
        let mut dropped = false;
        let gone = self.anchors.closed(|h| dropped |= self.locks.forget_owner(h.owner));
        if dropped {
            self.locks.tell_waiters();
        }
        if !gone.is_empty() {
            // A closed description's memfd inode may come back for
            // another: nobody keeps it as theirs.
            for c in lock(&self.clients).iter() {
                let mut t = lock(&c.track);
                for h in &gone {
                    t.described.remove(&h.owner);
                }
            }
        }
        for h in gone {
            self.release_anchor(h);
            self.anchors.released();
        }
    }

    /// Gives back the handle and lookups of a description whose last
    /// descriptor closed (counted in the statistics as the requests a
    /// client would have sent).
    fn release_anchor(&self, h: Held) {
        let req = shortfuse::Request {
            unique: 0,
            uid: 0,
            gid: 0,
            pid: 0,
        };
        let (node, fh) = (shortfuse::NodeId(h.node), shortfuse::FileHandle(h.fh));
        let start = std::time::Instant::now();
        let (op, _) = if h.dir {
            (
                abi::FUSE_RELEASEDIR,
                self.fs.releasedir(&req, node, fh, shortfuse::OpenFlags::RDONLY),
            )
        } else {
            let args = shortfuse::ReleaseArgs {
                flags: shortfuse::OpenFlags::RDONLY,
                flush: false,
                flock_release: true,
                lock_owner: Some(h.owner),
            };
            (abi::FUSE_RELEASE, self.fs.release(&req, node, fh, &args))
        };
        self.stats.record(op, Transport::Ring, nanos(start));
        if h.lookups > 0 {
            let start = std::time::Instant::now();
            self.fs.forget(node, h.lookups);
            self.stats.record(abi::FUSE_FORGET, Transport::Ring, nanos(start));
        }
    }
}
