//! This client's side of the leases (DistFUSE, Algorithm 1): holding one
//! for I/O, acquiring, revocation and the hold against ping-pong, going
//! direct on a contended file, and the figures of it all.

use shortfuse::sync::lock;
use shortfuse::sync::Unpoison;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLockReadGuard;
use std::time::{Duration, Instant};

use shortfuse::{Errno, Result};

use super::cache::Block;
use super::config::{Consistency, CONTENDED_WITHIN, WEAK_CACHE_TTL};
use super::fs::node_reply;
use super::{FileState, Inner};
use crate::conn::Conn;
use crate::proto::{ByteBuf, Gfi, LeaseMode, Reply, Request as Req, NO_LEASE};

/// What a write-back does with the lease after the data.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
    Keep,
    Release,
    StepDown,
}

#[derive(Clone, Copy, Default)]
pub(super) struct Slot {
    pub(super) mode: Option<LeaseMode>,
    pub(super) id: u64,
    /// The lease session the lease belongs to (`ClientId.0`).
    pub(super) session: u64,
    /// When it was granted.
    pub(super) granted: Option<Instant>,
    /// `weak` only: when the cache was filled.
    pub(super) since: Option<Instant>,
}

/// Counts of this client's lease work, for `shortfuse stats` and
/// `-o metrics` (group `lease`).
#[derive(Default)]
pub(super) struct LeaseFigures {
    pub(super) granted_read: AtomicU64,
    pub(super) granted_write: AtomicU64,
    pub(super) granted_direct: AtomicU64,
    pub(super) revocations: AtomicU64,
    pub(super) step_downs: AtomicU64,
    pub(super) revocation_write_backs: AtomicU64,
    pub(super) direct_spells: AtomicU64,
    pub(super) reconnections: AtomicU64,
}

impl shortfuse::stats::Figures for LeaseFigures {
    fn group(&self) -> &'static str {
        "lease"
    }

    fn figures(&self) -> Vec<shortfuse::stats::Figure> {
        let f = |name, v: &AtomicU64, help| shortfuse::stats::Figure {
            name,
            value: v.load(Ordering::Relaxed),
            gauge: false,
            help,
        };
        vec![
            f("granted_read", &self.granted_read, "Read leases the server granted."),
            f("granted_write", &self.granted_write, "Write leases the server granted."),
            f(
                "granted_direct",
                &self.granted_direct,
                "Direct (uncached) leases the server granted.",
            ),
            f(
                "revocations",
                &self.revocations,
                "Revocations the server sent, of leases held here or already given back.",
            ),
            f(
                "step_downs",
                &self.step_downs,
                "Write leases revoked for a reader that stepped down to read leases.",
            ),
            f(
                "revocation_write_backs",
                &self.revocation_write_backs,
                "Revocations that wrote dirty data back before the lease moved.",
            ),
            f(
                "direct_spells",
                &self.direct_spells,
                "Times a contended file went to direct leases for a spell.",
            ),
            f(
                "reconnections",
                &self.reconnections,
                "Connections to the server lost and made again.",
            ),
        ]
    }
}

impl Inner {
    /// Holds a lease of at least `mode` on `f` and runs `io` under it, with
    /// the connection the lease belongs to.
    pub(super) fn with_lease<T>(
        &self,
        f: &FileState,
        mode: LeaseMode,
        io: impl FnMut(&Conn, &RwLockReadGuard<'_, Slot>) -> Result<T>,
    ) -> Result<T> {
        self.with_lease_fetch(f, mode, None, io)
    }

    /// [`Inner::with_lease`]; a lease acquired here comes with blocks
    /// `want` (`(first, last)`, the blocks `io` will read) in the cache.
    pub(super) fn with_lease_fetch<T>(
        &self,
        f: &FileState,
        mode: LeaseMode,
        want: Option<(u64, u64)>,
        mut io: impl FnMut(&Conn, &RwLockReadGuard<'_, Slot>) -> Result<T>,
    ) -> Result<T> {
        if self.cfg.consistency == Consistency::Weak {
            return self.with_weak_cache(f, io);
        }
        // Two rounds: a revocation may slip in between acquiring and using.
        for _ in 0..8 {
            let conn = self.conn()?;
            let mode = self.wanted(f, mode);
            {
                let g = f.lease.read().unpoison();
                if Self::suffices(&g, mode, &conn) {
                    let r = io(&conn, &g);
                    self.mark_used(f);
                    match r {
                        // The connection died under the I/O (its session
                        // found expired): the lease is gone, and so is
                        // anything `io` did in the cache; go again.
                        Err(Errno::ENOTCONN) if conn.is_dead() => continue,
                        r => return r,
                    }
                }
                if Self::lapsed(&g, &conn) {
                    drop(g);
                    if self.renew_lapsed(&conn)? {
                        continue;
                    }
                }
            }
            match self.acquire(f, mode, want, &conn) {
                // The session expired on the server (this client was cut
                // off): start a new one.
                Err(Errno::ESTALE) => conn.kill(),
                Err(Errno::ENOTCONN) if conn.is_dead() => {}
                r => r?,
            }
        }
        Err(Errno::EAGAIN)
    }

    /// `weak`: runs `io` on the file's cache, refilled (after writing back
    /// what is dirty) once it is older than [`WEAK_CACHE_TTL`] or belongs
    /// to an earlier connection.
    pub(super) fn with_weak_cache<T>(
        &self,
        f: &FileState,
        mut io: impl FnMut(&Conn, &RwLockReadGuard<'_, Slot>) -> Result<T>,
    ) -> Result<T> {
        let fresh = |s: &Slot| s.since.is_some_and(|t| t.elapsed() < WEAK_CACHE_TTL);
        let conn = self.conn()?;
        {
            let g = f.lease.read().unpoison();
            if fresh(&g) {
                return io(&conn, &g);
            }
        }
        {
            let mut g = f.lease.write().unpoison();
            if !fresh(&g) {
                if g.mode.is_some() {
                    // A failure leaves the blocks dirty: `clear` below
                    // reports them lost at the next flush or fsync.
                    let _ = self.write_back(f, &conn, NO_LEASE, false);
                }
                let attr = node_reply(conn.call(Req::GetAttr { ino: f.gfi.ino })?)?.attr;
                let mut c = lock(&f.cache);
                c.clear();
                c.size = attr.size;
                c.mtime = attr.mtime;
                drop(c);
                *g = Slot {
                    mode: Some(LeaseMode::Write),
                    id: NO_LEASE,
                    session: conn.client.0,
                    granted: None,
                    since: Some(Instant::now()),
                };
            }
        }
        let g = f.lease.read().unpoison();
        io(&conn, &g)
    }

    pub(super) fn suffices(slot: &Slot, mode: LeaseMode, conn: &Conn) -> bool {
        slot.session == conn.client.0 && conn.leases_valid() && slot.mode.is_some_and(|held| held.covers(mode))
    }

    /// The lease to ask for I/O that needs `mode` on `f`: a direct one
    /// while `f` is found contended (`lease` mode only; see the module
    /// docs, "Contention"), once its spell is over a caching one again.
    pub(super) fn wanted(&self, f: &FileState, mode: LeaseMode) -> LeaseMode {
        let until = f.direct_until.load(Ordering::Acquire);
        let spell = until != 0 && (self.epoch.elapsed().as_nanos() as u64) < until;
        // Pages a READ fills stay in the kernel's cache: they must be read
        // under a caching lease, which empties them before it goes.
        let reads_pages = mode == LeaseMode::Read && self.caches_pages();
        if spell && self.cfg.consistency == Consistency::Lease && !reads_pages {
            LeaseMode::Direct
        } else {
            mode
        }
    }

    /// A revocation of `slot` (held on `f`) arrived: if it came so soon
    /// after the grant that the lease did not pay for its move, or it
    /// takes a direct lease this client is using, `f` is contended and is
    /// accessed under direct leases for a spell (see the module docs,
    /// "Contention").
    pub(super) fn note_revocation(&self, f: &FileState, slot: &Slot) {
        if self.cfg.consistency != Consistency::Lease || self.cfg.direct_spell.is_zero() || f.kind != libc::S_IFREG {
            return;
        }
        let now = Instant::now();
        let recent = |t: Option<Instant>| t.is_some_and(|t| now.saturating_duration_since(t) < CONTENDED_WITHIN);
        let in_use = slot.mode == Some(LeaseMode::Direct) && recent(self.last_used(f));
        if recent(slot.granted) || in_use {
            let until = (now + self.cfg.direct_spell).saturating_duration_since(self.epoch);
            f.direct_until.store(until.as_nanos().max(1) as u64, Ordering::Release);
            self.figures.direct_spells.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether `slot` holds a lease of this live session that only ran out
    /// on this client's clock: no renewal was confirmed lately.
    pub(super) fn lapsed(slot: &Slot, conn: &Conn) -> bool {
        slot.mode.is_some() && slot.id != NO_LEASE && slot.session == conn.client.0 && !conn.leases_valid()
    }

    /// A refused renewal is a missed one, not a lost lease: an agent
    /// refuses while its etcd is too slow to vouch for the session. Renews
    /// now, retrying for up to a TTL; once confirmed, the session's leases
    /// and the cache under them (dirty blocks too) are valid again (the
    /// agent fences every request under them besides). `Ok(false)` when
    /// the session cannot be renewed (gone, or the connection is): the
    /// caller starts over; `EIO` when renewals were refused for a whole
    /// TTL (the outage outlasts what a client waits).
    pub(super) fn renew_lapsed(&self, conn: &Conn) -> Result<bool> {
        let until = Instant::now() + conn.ttl;
        loop {
            match conn.renew() {
                Ok(()) => return Ok(conn.leases_valid()),
                Err(Errno::ETIMEDOUT) if Instant::now() < until => std::thread::sleep(conn.ttl / 20),
                Err(Errno::ETIMEDOUT) => return Err(Errno::EIO),
                Err(_) => return Ok(false),
            }
        }
    }

    /// Algorithm 1, AcquireLease.
    pub(super) fn acquire(&self, f: &FileState, mode: LeaseMode, want: Option<(u64, u64)>, conn: &Conn) -> Result<()> {
        // A live read lease given back below (an upgrade, or a change to
        // direct): the kernel's pages read under it go first. (Never for a
        // READ, which asks for a read lease: the notification would wait
        // for the pages that READ fills.)
        let mut g = self.lock_dropping_pages(f, conn, |s| {
            s.mode == Some(LeaseMode::Read)
                && s.session == conn.client.0
                && conn.leases_valid()
                && !s.mode.is_some_and(|m| m.covers(mode))
        })?;
        if Self::suffices(&g, mode, conn) {
            return Ok(());
        }
        let mut release = None;
        if g.mode.is_some() {
            if g.session == conn.client.0 && conn.leases_valid() {
                // Upgrade, or a change between caching and direct (a write
                // lease covers every request, so it is not this): the read
                // or direct lease goes back first, with the request
                // (nothing is dirty under either, and the cache stays for
                // the grant to validate).
                release = Some(g.id);
            } else {
                // The lease died with its connection or on our clock: what
                // was dirty can no longer be written back safely.
                lock(&f.cache).clear();
                self.drop_pages_soon(f.gfi.ino);
            }
            *g = Slot::default();
        }
        let direct = mode == LeaseMode::Direct;
        let fetch = want
            .filter(|_| !direct)
            .and_then(|(lo, hi)| Some((lo, u32::try_from(hi.checked_sub(lo)? + 1).ok()?)))
            .filter(|(_, n)| *n <= crate::proto::MAX_GRANT_BLOCKS);
        let (since, have) = {
            let c = lock(&f.cache);
            let have = fetch.map_or(0, |(first, n)| {
                (0..n)
                    .filter(|k| c.blocks.contains_key(&(first + u64::from(*k))))
                    .fold(0, |m, k| m | 1 << k)
            });
            (c.known, have)
        };
        let (lease, attr, version, changed, blocks) = match conn.call(Req::Acquire {
            gfi: f.gfi,
            mode,
            release,
            fetch,
            have,
            since,
        })? {
            Reply::Granted {
                lease,
                attr,
                version,
                changed,
                blocks,
            } => (lease, attr, version, changed, blocks),
            _ => return Err(Errno::EPROTO),
        };
        let mut c = lock(&f.cache);
        match changed {
            Some(changed) => {
                for i in changed {
                    c.blocks.remove(&i);
                }
            }
            None => c.blocks.clear(),
        }
        for (i, data) in blocks {
            let data = data.map(ByteBuf::into_vec).unwrap_or_default();
            c.blocks.insert(i, Block { data, dirty: false });
        }
        c.known = version;
        if direct {
            // Nothing of the file is cached under a direct lease: others
            // write it meanwhile. (Nothing is dirty: a write lease, the
            // only one with dirty blocks, serves direct requests itself.)
            c.clear();
        }
        let granted = match mode {
            LeaseMode::Read => &self.figures.granted_read,
            LeaseMode::Write => &self.figures.granted_write,
            LeaseMode::Direct => &self.figures.granted_direct,
        };
        granted.fetch_add(1, Ordering::Relaxed);
        c.meta_dirty = false;
        c.size = attr.size;
        c.mtime = attr.mtime;
        drop(c);
        *g = Slot {
            mode: Some(mode),
            id: lease,
            session: conn.client.0,
            granted: Some(Instant::now()),
            since: None,
        };
        Ok(())
    }

    pub(super) fn mark_used(&self, f: &FileState) {
        let t = self.epoch.elapsed().as_nanos().max(1) as u64;
        f.used.store(t, Ordering::Release);
    }

    /// When the last I/O under a lease on `f` ended, if any did.
    pub(super) fn last_used(&self, f: &FileState) -> Option<Instant> {
        match f.used.load(Ordering::Acquire) {
            0 => None,
            t => Some(self.epoch + Duration::from_nanos(t)),
        }
    }

    /// Waits until a revoked lease granted at `granted` may go (see the
    /// module docs, "Contention"): once it served one I/O (the one that
    /// asked for it, so that a lease that moves always does some work) and
    /// this client paused using it for [`ClientConfig::lease_hold`] / 20,
    /// or at the latest `lease_hold` after the grant.
    pub(super) fn hold(&self, f: &FileState, granted: Instant) {
        let until = granted + self.cfg.lease_hold;
        let pause = self.cfg.lease_hold / 20;
        loop {
            let now = Instant::now();
            if now >= until {
                return;
            }
            let wake = match self.last_used(f) {
                Some(t) if t >= granted => {
                    if now >= t + pause {
                        return;
                    }
                    t + pause
                }
                // Not used yet: look again shortly.
                _ => now + pause,
            };
            std::thread::sleep(wake.min(until) - now);
        }
    }

    /// Algorithm 1, ReleaseLease, on the manager's request: block new I/O
    /// and wait for running I/O (the exclusive slot), write back, release;
    /// the cache, clean once written back, stays for the next grant to
    /// validate. With `step_down` (a reader asked) a write lease becomes a
    /// read lease instead.
    pub(super) fn revoke(&self, gfi: Gfi, lease: u64, step_down: bool, generation: u64) {
        let f = lock(&self.files).get(&gfi.ino).cloned();
        let conn = lock(&self.conn).clone();
        let Some(conn) = conn.filter(|c| c.generation == generation) else {
            return;
        };
        self.figures.revocations.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = f {
            // The revocation waits here, not holding the slot, so this
            // client's I/O goes on.
            let granted = {
                let g = f.lease.read().unpoison();
                if g.id == lease && g.session == conn.client.0 {
                    self.note_revocation(&f, &g);
                }
                g.granted
            };
            if let Some(granted) = granted {
                self.hold(&f, granted);
            }
            // The kernel's pages of a caching lease go before it does (a
            // step-down too: it may fail and release).
            let mut g = self
                .lock_dropping_pages(&f, &conn, |s| {
                    s.id == lease
                        && s.session == conn.client.0
                        && matches!(s.mode, Some(LeaseMode::Read | LeaseMode::Write))
                })
                .expect("revocations run on the revokers' threads, never on a worker");
            if g.id == lease && g.session == conn.client.0 && g.mode.is_some() {
                // Only caching leases step down (the manager asks no
                // direct holder to).
                if step_down && g.mode != Some(LeaseMode::Direct) {
                    let kept = match g.mode {
                        // Already stepped down (the manager lost that, in a
                        // restart): say so again.
                        Some(LeaseMode::Read) => conn.call(Req::StepDown { gfi, lease }).is_ok(),
                        _ => match self.write_back_then(&f, &conn, lease, false, Then::StepDown) {
                            Ok(true) => {
                                self.figures.revocation_write_backs.fetch_add(1, Ordering::Relaxed);
                                true
                            }
                            Ok(false) => conn.call(Req::StepDown { gfi, lease }).is_ok(),
                            Err(_) => false,
                        },
                    };
                    if kept {
                        self.figures.step_downs.fetch_add(1, Ordering::Relaxed);
                        g.mode = Some(LeaseMode::Read);
                        return;
                    }
                }
                // A failure marks the data lost (reported at the next
                // fsync/close); the lease goes back either way. What was
                // written back stays cached, clean, for the next grant to
                // validate.
                let written = match g.mode {
                    Some(LeaseMode::Write) => self.write_back_then(&f, &conn, lease, false, Then::Release),
                    _ => Ok(false),
                };
                let released = match written {
                    Ok(released) => {
                        if released {
                            self.figures.revocation_write_backs.fetch_add(1, Ordering::Relaxed);
                        }
                        lock(&f.cache).keep();
                        released
                    }
                    Err(_) => {
                        lock(&f.cache).clear();
                        false
                    }
                };
                *g = Slot::default();
                // Released before new I/O may ask again: an acquire that
                // reached the manager first would get this dying lease back.
                if !released {
                    let _ = conn.call(Req::Release { gfi, lease });
                }
                return;
            }
        }
        // Not (or no longer) held here: the manager may still count it.
        let _ = conn.call(Req::Release { gfi, lease });
    }
}
