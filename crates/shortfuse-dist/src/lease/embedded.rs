//! The lease manager: per-file shared-read and exclusive-write leases
//! (DistFUSE, Algorithm 2).
//!
//! A file has at most one writer, or any number of readers, or any number
//! of direct holders ([`LeaseMode::Direct`]: clients that cache nothing of
//! a contended file and read and write it at the server; which modes share
//! is [`LeaseMode::compatible`]). A request that
//! conflicts with current holders sends each of them a revocation and waits
//! until every one has released, or is gone: leases hang off a client's
//! session, which lives while the client renews it (heartbeats) and ends
//! when its connection closes or it misses renewals for the TTL. A holder
//! that does not answer a revocation within the TTL loses the lease too.
//!
//! Every lease has a fresh id. Releases and data requests name the id, so a
//! late release of an old lease cannot drop a newer one, and the block
//! service refuses I/O under a lease that is no longer held (fencing): a
//! client cut off from the manager cannot write over data of the client
//! that holds the lease now. Data requests also register as running I/O
//! ([`IoGuard`]): a conflicting grant waits for them, so a write that passed
//! the check lands before the next holder reads.
//!
//! # Restarts
//!
//! A manager opened on a file ([`LeaseManager::open`]) appends its
//! sessions, holders and id counters there after every change, as one
//! length-prefixed record of the whole state (a few hundred bytes: one
//! `write`, no rename or fsync on the path of a grant; a killed process
//! loses nothing; renewals are not written, expiry times are not kept).
//! The last whole record wins; a torn last one is dropped; the file is
//! rewritten with one record at start and once it passes [`LOG_MAX`]. A restarted manager gives every session it
//! loads one TTL from the restart to come back ([`LeaseManager::resume`]):
//! until then no conflicting lease is granted, so a client that reconnects
//! in time keeps its leases and its dirty cache, and one that does not
//! loses them as if it had died. Revocations sent while a holder was away
//! are sent again when it resumes. Lease and client ids never repeat across
//! restarts, so fencing stays exact.
//!
//! # Open files
//!
//! The manager also keeps which sessions hold each file open, so that a
//! file whose last name is removed while it is open stays (an orphan in
//! [`crate::meta`]) until its last opener closes it or its session ends
//! (POSIX open-after-unlink, across clients). A session that ends leaves
//! the files it was the last opener of in a queue ([`LeaseManager::take_closed`])
//! for the server to reap. Only the openers of orphans are saved with the
//! sessions ([`LeaseManager::pin_if_open`]): that keeps opens and closes
//! of named files free of writes, and a client that resumes its session
//! after a restart tells its open files again.
//!
//! Seam for the scale-out step: the public methods (`open_session`,
//! `renew`, `end_session`, `acquire`, `release`, `begin_io`) are the whole
//! interface the server uses; an etcd-backed manager keeps the same shape
//! (sessions as etcd leases, holders as keys attached to them, grants as
//! transactions, revocations through a watch).

use shortfuse::sync::Unpoison;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shortfuse::{Errno, Result};
use tokio::sync::{mpsc, Notify};

use super::{ends_session, RevokeSender};
use crate::proto::{ClientId, Gfi, LeaseMode, ServerMsg};

/// Size of the lease file past which it is rewritten with one record.
pub const LOG_MAX: u64 = 1 << 20;

struct Session {
    expires: Instant,
    revokes: RevokeSender,
}

#[derive(Default)]
struct FileLeases {
    /// `None` when nobody holds a lease.
    mode: Option<LeaseMode>,
    /// Holder → lease id.
    holders: HashMap<ClientId, u64>,
    /// Holders sent a revocation, with when it was sent.
    revoking: HashMap<ClientId, Instant>,
    /// Running data requests per client (read or write).
    io: HashMap<ClientId, u32>,
    /// Requests waiting for conflicting holders: while one waits, no
    /// direct request joins the direct holders. Direct holders of a
    /// contended file take turns (each one revoked asks again at once), so
    /// the lease would stay shared for ever and the waiting request, a
    /// probe for a caching lease, would starve. Readers keep joining as
    /// before: a writer asks their new holders again.
    waiting: HashMap<ClientId, LeaseMode>,
}

impl FileLeases {
    fn idle(&self) -> bool {
        self.holders.is_empty() && self.io.is_empty() && self.waiting.is_empty()
    }
}

/// An [`LeaseManager::acquire`] that waits: its entry in
/// [`FileLeases::waiting`] goes when it ends, granted or not.
struct Waiting<'a> {
    mgr: &'a LeaseManager,
    gfi: Gfi,
    client: ClientId,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut st = self.mgr.lock();
        let Some(f) = st.files.get_mut(&self.gfi) else { return };
        if f.waiting.remove(&self.client).is_none() {
            return;
        }
        if f.idle() {
            st.files.remove(&self.gfi);
        }
        drop(st);
        // Requests held back for this one may go now.
        self.mgr.changed.notify_waiters();
    }
}

#[derive(Default)]
struct State {
    sessions: HashMap<ClientId, Session>,
    files: HashMap<Gfi, FileLeases>,
    next_client: u64,
    next_lease: u64,
    /// Which sessions hold each file open.
    opens: HashMap<Gfi, HashSet<ClientId>>,
    /// Open files that lost their last name (orphans): their openers are
    /// saved.
    pinned: HashSet<Gfi>,
    /// Files whose last opener went away, not yet taken by the server.
    closed: Vec<Gfi>,
}

/// One file's saved lease: mode and holders with their lease ids.
type SavedFile = (Gfi, LeaseMode, Vec<(ClientId, u64)>);

/// What survives a restart (see the module docs).
#[derive(Default, Serialize, Deserialize)]
struct Saved {
    next_client: u64,
    next_lease: u64,
    sessions: Vec<ClientId>,
    files: Vec<SavedFile>,
    opens: Vec<(Gfi, Vec<ClientId>)>,
}

/// The lease manager. Cheap to share (`Arc`).
pub struct LeaseManager {
    state: Mutex<State>,
    /// Woken on every release, session end and finished I/O.
    changed: Notify,
    ttl: Duration,
    /// Where the state is kept across restarts, if anywhere.
    file: Option<PathBuf>,
    /// That file open for appending, and its length.
    log: Mutex<Option<(std::fs::File, u64)>>,
    /// Set when the server stops: what its dying connections do must not
    /// reach the file (a crash would not write it either).
    frozen: AtomicBool,
}

/// Running I/O under a lease; conflicting grants wait until it is dropped.
pub struct IoGuard {
    mgr: Arc<LeaseManager>,
    gfi: Gfi,
    client: ClientId,
}

impl Drop for IoGuard {
    fn drop(&mut self) {
        let mut st = self.mgr.lock();
        if let Some(f) = st.files.get_mut(&self.gfi) {
            if let Some(n) = f.io.get_mut(&self.client) {
                *n -= 1;
                if *n == 0 {
                    f.io.remove(&self.client);
                }
            }
            if f.idle() {
                st.files.remove(&self.gfi);
            }
        }
        drop(st);
        self.mgr.changed.notify_waiters();
    }
}

impl LeaseManager {
    /// A manager that keeps its state in memory only.
    pub fn new(ttl: Duration) -> Arc<LeaseManager> {
        Arc::new(LeaseManager {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            ttl,
            file: None,
            log: Mutex::new(None),
            frozen: AtomicBool::new(false),
        })
    }

    /// The last whole record of a lease file.
    fn last_record(file: &Path, bytes: &[u8]) -> std::io::Result<Option<Saved>> {
        let bad = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", file.display()));
        let mut rest = bytes;
        let mut last = None;
        while rest.len() >= 4 {
            let len = crate::proto::frame_len([rest[0], rest[1], rest[2], rest[3]]).map_err(bad)?;
            let Some(body) = rest.get(4..4 + len) else {
                // A torn last record: its write never finished.
                break;
            };
            last = Some(crate::proto::decode::<Saved>(body).map_err(bad)?);
            rest = &rest[4 + len..];
        }
        Ok(last)
    }

    /// Replaces the lease file with one record and opens it for appending.
    fn rewrite(file: &Path, frame: &[u8]) -> std::io::Result<(std::fs::File, u64)> {
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, frame)?;
        std::fs::rename(&tmp, file)?;
        let f = std::fs::OpenOptions::new().append(true).open(file)?;
        Ok((f, frame.len() as u64))
    }

    /// A manager whose state is kept in `file`, loaded from it if present.
    pub fn open(ttl: Duration, file: &Path) -> std::io::Result<Arc<LeaseManager>> {
        let mut st = State::default();
        let saved = match std::fs::read(file) {
            Ok(bytes) => Self::last_record(file, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(std::io::Error::new(e.kind(), format!("{}: {e}", file.display()))),
        };
        if let Some(saved) = saved {
            st.next_client = saved.next_client;
            st.next_lease = saved.next_lease;
            let expires = Instant::now() + ttl;
            for c in saved.sessions {
                // Revocations go nowhere until the client resumes.
                let (revokes, _) = mpsc::unbounded_channel();
                st.sessions.insert(c, Session { expires, revokes });
            }
            for (gfi, mode, holders) in saved.files {
                let f = st.files.entry(gfi).or_default();
                f.mode = Some(mode);
                f.holders = holders
                    .into_iter()
                    .filter(|(c, _)| st.sessions.contains_key(c))
                    .collect();
            }
            st.files.retain(|_, f| !f.idle());
            for (gfi, openers) in saved.opens {
                let openers: HashSet<ClientId> = openers.into_iter().filter(|c| st.sessions.contains_key(c)).collect();
                if !openers.is_empty() {
                    st.opens.insert(gfi, openers);
                    st.pinned.insert(gfi);
                }
            }
        }
        let frame = crate::proto::encode(&Self::saved(&st))?;
        let log = Self::rewrite(file, &frame)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
        Ok(Arc::new(LeaseManager {
            state: Mutex::new(st),
            changed: Notify::new(),
            ttl,
            file: Some(file.to_path_buf()),
            log: Mutex::new(Some(log)),
            frozen: AtomicBool::new(false),
        }))
    }

    /// Stops writing the state file (the server is going away).
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }

    /// Writes the state file; called with the state locked, after every
    /// change of sessions or holders, so the file never runs behind a
    /// grant a client was told about. A failure to write is reported to
    /// the caller: a grant that would not survive a restart is refused.
    fn save(&self, st: &State) -> Result<()> {
        let Some(file) = &self.file else { return Ok(()) };
        if self.frozen.load(Ordering::Acquire) {
            return Ok(());
        }
        let frame = crate::proto::encode(&Self::saved(st))?;
        let mut log = self.log.lock().unpoison();
        let appended = match log.as_mut() {
            Some((f, len)) if *len + frame.len() as u64 <= LOG_MAX => {
                use std::io::Write;
                *len += frame.len() as u64;
                Some(f.write_all(&frame))
            }
            _ => None,
        };
        match appended {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                // Part of the record may be there: the next save rewrites
                // the file rather than append after it.
                *log = None;
                return Err(e.into());
            }
            None => *log = Some(Self::rewrite(file, &frame)?),
        }
        Ok(())
    }

    fn saved(st: &State) -> Saved {
        Saved {
            next_client: st.next_client,
            next_lease: st.next_lease,
            sessions: st.sessions.keys().copied().collect(),
            files: st
                .files
                .iter()
                .filter_map(|(g, f)| Some((*g, f.mode?, f.holders.iter().map(|(c, l)| (*c, *l)).collect())))
                .collect(),
            opens: st
                .pinned
                .iter()
                .filter_map(|g| Some((*g, st.opens.get(g)?.iter().copied().collect())))
                .collect(),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent maps (every
        // update is a single insert/remove), so poisoning is not fatal.
        self.state.lock().unpoison()
    }

    /// Starts a session; revocations for it are sent to `revokes`.
    pub fn open_session(&self, revokes: RevokeSender) -> Result<ClientId> {
        let mut st = self.lock();
        st.next_client += 1;
        let id = ClientId(st.next_client);
        let expires = Instant::now() + self.ttl;
        st.sessions.insert(id, Session { expires, revokes });
        if let Err(e) = self.save(&st) {
            st.sessions.remove(&id);
            return Err(e);
        }
        Ok(id)
    }

    /// Takes back session `client` on a new connection if it still lives
    /// (renewed, revocations now to `revokes`), else starts a new one.
    /// Revocations sent while the client was away are not sent again
    /// here: the connection's first message must be its welcome; see
    /// [`LeaseManager::resend_revocations`].
    pub fn resume(&self, client: ClientId, revokes: RevokeSender) -> Result<ClientId> {
        let mut st = self.lock();
        self.expire(&mut st, Instant::now());
        let Some(s) = st.sessions.get_mut(&client) else {
            drop(st);
            return self.open_session(revokes);
        };
        s.expires = Instant::now() + self.ttl;
        s.revokes = revokes;
        Ok(client)
    }

    /// Sends `client` again the revocations it has not answered (they may
    /// have gone to a connection that died).
    pub fn resend_revocations(&self, client: ClientId) {
        let st = self.lock();
        let Some(s) = st.sessions.get(&client) else { return };
        for (gfi, f) in &st.files {
            if let (true, Some(&lease)) = (f.revoking.contains_key(&client), f.holders.get(&client)) {
                let _ = s.revokes.send(ServerMsg::Revoke { gfi: *gfi, lease });
            }
        }
    }

    /// Extends the session by one TTL from now. `ESTALE` once it expired:
    /// its leases are gone and the client must start over.
    pub fn renew(&self, client: ClientId) -> Result<()> {
        let mut st = self.lock();
        self.expire(&mut st, Instant::now());
        match st.sessions.get_mut(&client) {
            Some(s) => {
                s.expires = Instant::now() + self.ttl;
                Ok(())
            }
            None => Err(Errno::ESTALE),
        }
    }

    /// Ends a session (its connection closed): every lease it held is free.
    pub fn end_session(&self, client: ClientId) {
        self.end_session_if(client, None)
    }

    /// Ends session `client` if its connection is still the one whose
    /// revocations go to `revokes`: a connection that closes after its
    /// session was resumed on a newer one (a half-open socket noticed
    /// late) must not end the session.
    pub fn end_connection(&self, client: ClientId, revokes: &RevokeSender) {
        self.end_session_if(client, Some(revokes))
    }

    fn end_session_if(&self, client: ClientId, revokes: Option<&RevokeSender>) {
        let mut st = self.lock();
        let current = st
            .sessions
            .get(&client)
            .is_some_and(|s| ends_session(&s.revokes, revokes));
        if !current {
            return;
        }
        st.sessions.remove(&client);
        Self::drop_holder_everywhere(&mut st, client);
        Self::drop_opens(&mut st, client);
        // A failed write is harmless: a restart that still finds the
        // session expires it after one TTL.
        let _ = self.save(&st);
        drop(st);
        self.changed.notify_waiters();
    }

    fn drop_holder_everywhere(st: &mut State, client: ClientId) {
        st.files.retain(|_, f| {
            if f.holders.remove(&client).is_some() {
                f.revoking.remove(&client);
                if f.holders.is_empty() {
                    f.mode = None;
                }
            }
            !f.idle()
        });
    }

    /// Closes every file `client` holds open.
    fn drop_opens(st: &mut State, client: ClientId) {
        let closed = &mut st.closed;
        st.opens.retain(|gfi, openers| {
            if openers.remove(&client) && openers.is_empty() {
                closed.push(*gfi);
            }
            !openers.is_empty()
        });
        let opens = &st.opens;
        st.pinned.retain(|g| opens.contains_key(g));
    }

    /// Records that `client` holds `gfi` open (once, however many times
    /// its kernel opened it). `ESTALE` when the session is gone.
    pub fn open_file(&self, client: ClientId, gfi: Gfi) -> Result<()> {
        let mut st = self.lock();
        self.expire(&mut st, Instant::now());
        if !st.sessions.contains_key(&client) {
            return Err(Errno::ESTALE);
        }
        if st.opens.entry(gfi).or_default().insert(client) && st.pinned.contains(&gfi) {
            if let Err(e) = self.save(&st) {
                Self::close_locked(&mut st, client, gfi);
                return Err(e);
            }
        }
        Ok(())
    }

    /// `client` no longer holds `gfi` open. Returns whether nobody does
    /// now (the file is also queued for [`LeaseManager::take_closed`]).
    pub fn close_file(&self, client: ClientId, gfi: Gfi) -> bool {
        let mut st = self.lock();
        let pinned = st.pinned.contains(&gfi);
        let last = Self::close_locked(&mut st, client, gfi);
        if pinned {
            // A failed write keeps the opener after a restart until its
            // session expires: the orphan lives a little longer, no more.
            let _ = self.save(&st);
        }
        last
    }

    fn close_locked(st: &mut State, client: ClientId, gfi: Gfi) -> bool {
        let Some(openers) = st.opens.get_mut(&gfi) else {
            return false;
        };
        if !openers.remove(&client) || !openers.is_empty() {
            return false;
        }
        st.opens.remove(&gfi);
        st.pinned.remove(&gfi);
        st.closed.push(gfi);
        true
    }

    /// Whether any session holds `gfi` open, and if so, saves its openers
    /// from now on: the metadata service is about to keep it as an orphan,
    /// which must outlive a restart as long as they do.
    pub fn pin_if_open(&self, gfi: Gfi) -> Result<bool> {
        let mut st = self.lock();
        if !st.opens.contains_key(&gfi) {
            return Ok(false);
        }
        if st.pinned.insert(gfi) {
            if let Err(e) = self.save(&st) {
                st.pinned.remove(&gfi);
                return Err(e);
            }
        }
        Ok(true)
    }

    /// Whether any session holds `gfi` open.
    pub fn is_open(&self, gfi: Gfi) -> bool {
        self.lock().opens.contains_key(&gfi)
    }

    /// Files whose last opener closed them or went away since the last
    /// call: the server frees those that have no name left.
    pub fn take_closed(&self) -> Vec<Gfi> {
        std::mem::take(&mut self.lock().closed)
    }

    /// Expires what is due now (sessions not renewed, holders that ignored
    /// a revocation); the server calls it periodically so that a dead
    /// client's open files are released even when nobody asks for a lease.
    pub fn sweep(&self) {
        let mut st = self.lock();
        if self.expire(&mut st, Instant::now()) {
            drop(st);
            self.changed.notify_waiters();
        }
    }

    /// Drops expired sessions and holders that ignored a revocation for a
    /// whole TTL. Returns whether anything changed.
    fn expire(&self, st: &mut State, now: Instant) -> bool {
        let dead: Vec<ClientId> = st
            .sessions
            .iter()
            .filter(|(_, s)| s.expires <= now)
            .map(|(c, _)| *c)
            .collect();
        for c in &dead {
            st.sessions.remove(c);
            Self::drop_holder_everywhere(st, *c);
            Self::drop_opens(st, *c);
        }
        let mut changed = !dead.is_empty();
        let ttl = self.ttl;
        st.files.retain(|_, f| {
            let late: Vec<ClientId> = f
                .revoking
                .iter()
                .filter(|(_, since)| now.duration_since(**since) >= ttl)
                .map(|(c, _)| *c)
                .collect();
            for c in late {
                f.revoking.remove(&c);
                f.holders.remove(&c);
                changed = true;
            }
            if f.holders.is_empty() {
                f.mode = None;
            }
            !f.idle()
        });
        if changed {
            let _ = self.save(st);
        }
        changed
    }

    /// Grants `mode` on `gfi` to `client` (Algorithm 2). Compatible requests
    /// join the holders; conflicting ones revoke the other holders and wait
    /// until they released, expired, and finished their running I/O. A
    /// client that already holds a lease that satisfies `mode` gets its id
    /// back; one that holds a read lease and asks to write is upgraded once
    /// the other readers are gone.
    pub async fn acquire(&self, client: ClientId, gfi: Gfi, mode: LeaseMode) -> Result<u64> {
        let _waiting = Waiting { mgr: self, gfi, client };
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before looking at the state, so a change made
            // after the look wakes this waiter.
            notified.as_mut().enable();
            let deadline = {
                let mut st = self.lock();
                let now = Instant::now();
                self.expire(&mut st, now);
                if !st.sessions.contains_key(&client) {
                    return Err(Errno::ESTALE);
                }
                let st = &mut *st;
                let f = st.files.entry(gfi).or_default();
                let others: Vec<(ClientId, u64)> = f
                    .holders
                    .iter()
                    .filter(|(c, _)| **c != client)
                    .map(|(c, l)| (*c, *l))
                    .collect();
                let others_io = f.io.keys().any(|c| *c != client);
                // Other clients' running I/O is harmless only when it runs
                // under leases that this one may share: reads under read
                // leases, or direct I/O, which nobody caches.
                if let Some(&id) = f.holders.get(&client) {
                    if f.mode.is_some_and(|held| held.covers(mode)) {
                        return Ok(id);
                    }
                }
                let queued =
                    mode == LeaseMode::Direct && f.waiting.iter().any(|(c, m)| *c != client && !m.compatible(mode));
                let compatible = match f.mode {
                    Some(held) if held.compatible(mode) && !queued => true,
                    // Nor does it take the file from a waiting request
                    // once the holders are gone: that one goes first.
                    _ => !queued && others.is_empty() && !others_io,
                };
                if compatible {
                    f.waiting.remove(&client);
                    st.next_lease += 1;
                    let id = st.next_lease;
                    let before = (f.mode, f.holders.insert(client, id));
                    f.revoking.remove(&client);
                    // Shared with the others only in the mode they hold.
                    f.mode = Some(mode);
                    if let Err(e) = self.save(st) {
                        let f = st.files.entry(gfi).or_default();
                        f.mode = before.0;
                        match before.1 {
                            Some(old) => f.holders.insert(client, old),
                            None => f.holders.remove(&client),
                        };
                        return Err(e);
                    }
                    return Ok(id);
                }
                f.waiting.insert(client, mode);
                let mut deadline = now + self.ttl;
                // Held back only by a waiting request: the holders are
                // that one's to revoke.
                let others = match f.mode {
                    Some(held) if held.compatible(mode) => Vec::new(),
                    _ => others,
                };
                // A writer that a reader waits for may keep a read lease
                // (and its cache) once it wrote back.
                let step_down = mode == LeaseMode::Read && f.mode == Some(LeaseMode::Write);
                for (holder, lease) in others {
                    let since = *f.revoking.entry(holder).or_insert_with(|| {
                        if let Some(s) = st.sessions.get(&holder) {
                            // A closed channel means the connection is
                            // going away: its session end frees the lease.
                            let _ = s.revokes.send(if step_down {
                                ServerMsg::StepDown { gfi, lease }
                            } else {
                                ServerMsg::Revoke { gfi, lease }
                            });
                        }
                        now
                    });
                    deadline = deadline.min(since + self.ttl);
                    if let Some(s) = st.sessions.get(&holder) {
                        deadline = deadline.min(s.expires);
                    }
                }
                deadline
            };
            // Wake on any change, or when a holder's time runs out.
            let _ = tokio::time::timeout_at(deadline.into(), notified).await;
        }
    }

    /// Gives lease `lease` back. A release of a lease that is no longer
    /// held (already revoked, expired or replaced) does nothing.
    pub fn release(&self, client: ClientId, gfi: Gfi, lease: u64) {
        let mut st = self.lock();
        if let Some(f) = st.files.get_mut(&gfi) {
            if f.holders.get(&client) == Some(&lease) {
                f.holders.remove(&client);
                f.revoking.remove(&client);
                if f.holders.is_empty() {
                    f.mode = None;
                }
            }
            if f.idle() {
                st.files.remove(&gfi);
            }
        }
        // A failed write only delays the next grant after a restart.
        let _ = self.save(&st);
        drop(st);
        self.changed.notify_waiters();
    }

    /// Turns write lease `lease` into a read lease with the same id (the
    /// holder wrote back, after a [`ServerMsg::StepDown`]): readers may
    /// join it, and writes under it are refused from now on. Does nothing
    /// unless `client` holds `lease` for writing.
    pub fn step_down(&self, client: ClientId, gfi: Gfi, lease: u64) {
        let mut st = self.lock();
        let Some(f) = st.files.get_mut(&gfi) else { return };
        if f.holders.get(&client) != Some(&lease) || f.mode != Some(LeaseMode::Write) {
            return;
        }
        f.mode = Some(LeaseMode::Read);
        f.revoking.remove(&client);
        // A failed write: a restart finds the write lease, which the
        // holder no longer uses as one; its next upgrade replaces it.
        let _ = self.save(&st);
        drop(st);
        self.changed.notify_waiters();
    }

    /// Checks that `client` still holds `lease` on `gfi` (one that allows
    /// writes when `write`: [`LeaseMode::writes`]) and registers running
    /// I/O until the guard is dropped.
    /// `ESTALE` when the lease is gone: the caller's cache is no longer
    /// valid and its data must not reach storage.
    pub fn begin_io(self: &Arc<Self>, client: ClientId, gfi: Gfi, lease: u64, write: bool) -> Result<IoGuard> {
        let mut st = self.lock();
        if self.expire(&mut st, Instant::now()) {
            self.changed.notify_waiters();
        }
        let f = st.files.get_mut(&gfi).ok_or(Errno::ESTALE)?;
        if f.holders.get(&client) != Some(&lease) || (write && !f.mode.is_some_and(LeaseMode::writes)) {
            return Err(Errno::ESTALE);
        }
        *f.io.entry(client).or_insert(0) += 1;
        Ok(IoGuard {
            mgr: self.clone(),
            gfi,
            client,
        })
    }

    /// [`LeaseManager::begin_io`], or nothing for unleased I/O
    /// ([`crate::proto::NO_LEASE`]).
    pub fn begin_io_unless_unleased(
        self: &Arc<Self>,
        client: ClientId,
        gfi: Gfi,
        lease: u64,
        write: bool,
    ) -> Result<Option<IoGuard>> {
        if lease == crate::proto::NO_LEASE {
            return Ok(None);
        }
        self.begin_io(client, gfi, lease, write).map(Some)
    }

    /// The holders of `gfi` and the mode, for tests and diagnostics.
    pub fn holders(&self, gfi: Gfi) -> (Option<LeaseMode>, HashSet<ClientId>) {
        let st = self.lock();
        match st.files.get(&gfi) {
            Some(f) => (f.mode, f.holders.keys().copied().collect()),
            None => (None, HashSet::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Gfi = Gfi { node: 1, ino: 5 };

    fn session(m: &LeaseManager) -> (ClientId, mpsc::UnboundedReceiver<ServerMsg>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (m.open_session(tx).unwrap(), rx)
    }

    #[tokio::test]
    async fn readers_share_writer_revokes() {
        let m = LeaseManager::new(Duration::from_secs(30));
        let (a, _ra) = session(&m);
        let (b, mut rb) = session(&m);
        let (c, mut rc) = session(&m);
        let la = m.acquire(a, F, LeaseMode::Read).await.unwrap();
        let lb = m.acquire(b, F, LeaseMode::Read).await.unwrap();
        assert_ne!(la, lb);
        assert_eq!(m.holders(F).1.len(), 2);
        // Same mode again: the same lease.
        assert_eq!(m.acquire(a, F, LeaseMode::Read).await.unwrap(), la);

        // C wants to write: A and B get revocations; C waits for both.
        let m2 = m.clone();
        let writer = tokio::spawn(async move { m2.acquire(c, F, LeaseMode::Write).await });
        assert_eq!(rb.recv().await, Some(ServerMsg::Revoke { gfi: F, lease: lb }));
        m.release(b, F, lb);
        // A stale release changes nothing.
        m.release(a, F, la + 100);
        assert!(!writer.is_finished());
        m.release(a, F, la);
        let lc = writer.await.unwrap().unwrap();
        assert_eq!(m.holders(F), (Some(LeaseMode::Write), [c].into()));

        // Fencing: the old readers' leases no longer allow I/O.
        assert_eq!(m.begin_io(a, F, la, false).err(), Some(Errno::ESTALE));
        let io = m.begin_io(c, F, lc, true).unwrap();

        // A reader now waits for the writer's release and its running I/O
        // (the writer may step down instead; it releases here).
        let m2 = m.clone();
        let reader = tokio::spawn(async move { m2.acquire(a, F, LeaseMode::Read).await });
        assert_eq!(rc.recv().await, Some(ServerMsg::StepDown { gfi: F, lease: lc }));
        m.release(c, F, lc);
        tokio::task::yield_now().await;
        assert!(!reader.is_finished(), "granted while the writer's I/O runs");
        drop(io);
        reader.await.unwrap().unwrap();
        assert_eq!(m.holders(F).0, Some(LeaseMode::Read));
    }

    #[tokio::test]
    async fn a_writer_steps_down_for_a_reader_and_is_revoked_for_a_writer() {
        let m = LeaseManager::new(Duration::from_secs(30));
        let (a, mut ra) = session(&m);
        let (b, _rb) = session(&m);
        let (c, mut rc) = session(&m);
        let la = m.acquire(a, F, LeaseMode::Write).await.unwrap();
        let io = m.begin_io(a, F, la, true).unwrap();
        let m2 = m.clone();
        let reader = tokio::spawn(async move { m2.acquire(b, F, LeaseMode::Read).await });
        assert_eq!(ra.recv().await, Some(ServerMsg::StepDown { gfi: F, lease: la }));
        // Only the holder of that write lease steps it down.
        m.step_down(b, F, la);
        m.step_down(a, F, la + 1);
        assert_eq!(m.holders(F).0, Some(LeaseMode::Write));
        drop(io);
        m.step_down(a, F, la);
        let lb = reader.await.unwrap().unwrap();
        assert_eq!(m.holders(F), (Some(LeaseMode::Read), [a, b].into()));
        // Fencing: the stepped-down lease still reads, no longer writes.
        assert!(m.begin_io(a, F, la, false).is_ok());
        assert_eq!(m.begin_io(a, F, la, true).err(), Some(Errno::ESTALE));
        // A read lease stays one: a second step-down changes nothing.
        m.step_down(a, F, la);
        assert_eq!(m.holders(F).0, Some(LeaseMode::Read));
        // A writer revokes both readers outright.
        let m2 = m.clone();
        let writer = tokio::spawn(async move { m2.acquire(c, F, LeaseMode::Write).await });
        assert_eq!(ra.recv().await, Some(ServerMsg::Revoke { gfi: F, lease: la }));
        m.release(a, F, la);
        m.release(b, F, lb);
        writer.await.unwrap().unwrap();
        assert_eq!(m.holders(F), (Some(LeaseMode::Write), [c].into()));
        // A reader's request while the writer is held: a step-down again.
        let m2 = m.clone();
        let _reader = tokio::spawn(async move { m2.acquire(a, F, LeaseMode::Read).await });
        assert!(matches!(rc.recv().await, Some(ServerMsg::StepDown { .. })));
    }

    #[tokio::test]
    async fn direct_holders_share_and_conflict_with_caching_leases() {
        let m = LeaseManager::new(Duration::from_secs(30));
        let (a, mut ra) = session(&m);
        let (b, mut rb) = session(&m);
        let (c, mut rc) = session(&m);
        let la = m.acquire(a, F, LeaseMode::Write).await.unwrap();
        // A direct request revokes the writer outright (no step-down: a
        // direct holder caches nothing, the writer's cache must go).
        let m2 = m.clone();
        let direct = tokio::spawn(async move { m2.acquire(b, F, LeaseMode::Direct).await });
        assert_eq!(ra.recv().await, Some(ServerMsg::Revoke { gfi: F, lease: la }));
        m.release(a, F, la);
        let lb = direct.await.unwrap().unwrap();
        // Direct holders share, even while one's I/O runs.
        let io_b = m.begin_io(b, F, lb, true).unwrap();
        let lc = m.acquire(c, F, LeaseMode::Direct).await.unwrap();
        assert_eq!(m.holders(F), (Some(LeaseMode::Direct), [b, c].into()));
        assert_eq!(m.acquire(c, F, LeaseMode::Direct).await.unwrap(), lc);
        // Both read and write under it.
        drop(m.begin_io(c, F, lc, true).unwrap());
        drop(m.begin_io(c, F, lc, false).unwrap());
        // A reader revokes every direct holder and waits for their I/O.
        let m2 = m.clone();
        let reader = tokio::spawn(async move { m2.acquire(a, F, LeaseMode::Read).await });
        assert_eq!(rb.recv().await, Some(ServerMsg::Revoke { gfi: F, lease: lb }));
        assert_eq!(rc.recv().await, Some(ServerMsg::Revoke { gfi: F, lease: lc }));
        m.release(b, F, lb);
        m.release(c, F, lc);
        tokio::task::yield_now().await;
        assert!(!reader.is_finished(), "granted while a direct write runs");
        drop(io_b);
        let la = reader.await.unwrap().unwrap();
        assert_eq!(m.begin_io(b, F, lb, false).err(), Some(Errno::ESTALE));
        // A read lease neither writes nor serves a direct request: the
        // holder gets a new lease once the other readers are gone.
        assert_eq!(m.begin_io(a, F, la, true).err(), Some(Errno::ESTALE));
        let ld = m.acquire(a, F, LeaseMode::Direct).await.unwrap();
        assert_ne!(ld, la);
        assert_eq!(m.holders(F), (Some(LeaseMode::Direct), [a].into()));
        // A write lease covers direct I/O: its holder keeps it.
        let lw = m.acquire(a, F, LeaseMode::Write).await.unwrap();
        assert_eq!(m.acquire(a, F, LeaseMode::Direct).await.unwrap(), lw);
    }

    #[tokio::test]
    async fn a_waiting_writer_holds_back_new_direct_holders() {
        let m = LeaseManager::new(Duration::from_secs(30));
        let (a, mut ra) = session(&m);
        let (b, mut rb) = session(&m);
        let (c, _rc) = session(&m);
        let lb = m.acquire(b, F, LeaseMode::Direct).await.unwrap();
        let m2 = m.clone();
        let writer = tokio::spawn(async move { m2.acquire(a, F, LeaseMode::Write).await });
        assert_eq!(rb.recv().await, Some(ServerMsg::Revoke { gfi: F, lease: lb }));
        // C could share B's direct lease, but the writer waits first:
        // holders that take turns would otherwise keep it for ever.
        let m2 = m.clone();
        let joiner = tokio::spawn(async move { m2.acquire(c, F, LeaseMode::Direct).await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!joiner.is_finished(), "joined the direct lease past a waiting writer");
        m.release(b, F, lb);
        let la = writer.await.unwrap().unwrap();
        // Now C's request revokes the writer in its turn.
        assert_eq!(ra.recv().await, Some(ServerMsg::Revoke { gfi: F, lease: la }));
        m.release(a, F, la);
        joiner.await.unwrap().unwrap();
        assert_eq!(m.holders(F), (Some(LeaseMode::Direct), [c].into()));
    }

    #[tokio::test]
    async fn dead_and_silent_holders_lose_their_lease() {
        let m = LeaseManager::new(Duration::from_millis(200));
        let (a, _ra) = session(&m);
        let (b, _rb) = session(&m);
        let la = m.acquire(a, F, LeaseMode::Write).await.unwrap();
        // B keeps its session alive; A neither renews nor answers.
        let m2 = m.clone();
        let keep = tokio::spawn(async move {
            loop {
                if m2.renew(b).is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let t = Instant::now();
        let lb = m.acquire(b, F, LeaseMode::Write).await.unwrap();
        assert!(t.elapsed() >= Duration::from_millis(150), "{:?}", t.elapsed());
        assert_eq!(m.renew(a), Err(Errno::ESTALE));
        assert_eq!(m.begin_io(a, F, la, true).err(), Some(Errno::ESTALE));
        assert!(m.begin_io(b, F, lb, true).is_ok());
        m.end_session(b);
        assert_eq!(m.holders(F).0, None);
        keep.await.unwrap();
    }

    #[tokio::test]
    async fn the_lease_file_keeps_the_last_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases");
        let m = LeaseManager::open(Duration::from_secs(30), &path).unwrap();
        let (a, _ra) = session(&m);
        // Enough changes to pass LOG_MAX: the file is rewritten, not grown.
        let mut last = 0;
        for _ in 0..LOG_MAX / 40 {
            last = m.acquire(a, F, LeaseMode::Write).await.unwrap();
            m.release(a, F, last);
        }
        let held = m.acquire(a, F, LeaseMode::Write).await.unwrap();
        assert!(held > last);
        assert!(std::fs::metadata(&path).unwrap().len() <= LOG_MAX);
        drop(m);
        // A torn record at the end (a crash mid-append) is dropped.
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, &[0, 0, 1, 0, 7, 7]).unwrap();
        drop(f);
        let m = LeaseManager::open(Duration::from_secs(30), &path).unwrap();
        assert_eq!(m.holders(F), (Some(LeaseMode::Write), [a].into()));
        let (tx, _rx) = mpsc::unbounded_channel();
        assert_eq!(m.resume(a, tx).unwrap(), a);
        assert!(m.begin_io(a, F, held, true).is_ok());
        // Ids go on from where they were.
        let (b, _rb) = session(&m);
        assert!(b.0 > a.0);
    }

    #[tokio::test]
    async fn a_resumed_session_outlives_its_old_connection() {
        let m = LeaseManager::new(Duration::from_secs(30));
        let (old_tx, _old_rx) = mpsc::unbounded_channel();
        let a = m.open_session(old_tx.clone()).unwrap();
        let la = m.acquire(a, F, LeaseMode::Write).await.unwrap();
        let (new_tx, _new_rx) = mpsc::unbounded_channel();
        assert_eq!(m.resume(a, new_tx.clone()).unwrap(), a);
        // The old connection is noticed closed only now.
        m.end_connection(a, &old_tx);
        assert!(m.begin_io(a, F, la, true).is_ok(), "the resumed session lost its lease");
        m.end_connection(a, &new_tx);
        assert_eq!(m.holders(F).0, None);
        // A session that is gone is not resumed: a new one starts.
        let (tx, _rx) = mpsc::unbounded_channel();
        assert_ne!(m.resume(a, tx).unwrap(), a);
    }
}
