//! Leases, sessions and open files on etcd: the lease manager of one agent
//! when several agents serve one file system (`shortfuse dist up --etcd`).
//!
//! The algorithms are those of [`crate::lease`] (DistFUSE, Algorithm 2):
//! shared-read or exclusive-write per file, a conflicting request revokes
//! the holders and waits for their release or their end. What changes is
//! where the state lives: in etcd, so that every agent sees the leases of
//! every other agent's clients, and a restarted agent finds its own.
//!
//! # Keys (under the prefix given to [`EtcdLeases::connect`])
//!
//! - `s/<client>`: a client's session. The session *is* an etcd lease (its
//!   id is the [`ClientId`]); the value is its TTL in seconds. The agent
//!   serving the client keeps it alive while the client renews, and ends
//!   it (etcd `LeaseRevoke`) when the client's connection closes or it
//!   stops renewing. Every key below is attached to the session's etcd
//!   lease, so a client that is gone with its agent (nobody keeps the
//!   session alive) loses everything after the etcd TTL.
//! - `h/<gfi>/<client>`: a holder; the value is the mode (`r`, `w`, or
//!   `d/<agent>` for a direct lease: direct holders share a file only when
//!   one agent serves them all, whose lock serializes their writes), the
//!   key's `mod_revision` is the lease id. A grant is one transaction:
//!   compare that no key under `h/<gfi>/` changed since the holders were
//!   read, then put the holder. Revisions never repeat, so lease ids are
//!   unique across agents and restarts, and a release (a delete compared
//!   on that revision) can never drop a newer lease.
//! - `c/<client>/<gfi>`: the index of a session's holders (what a restarted
//!   agent loads when the client resumes).
//! - `r/<gfi>/<client>`: a waiting conflicting request (value: mode). Every
//!   agent watches the prefix; the agent of a conflicting holder turns the
//!   request into the [`ServerMsg::Revoke`] that its client already knows
//!   (flush, then release). The release deletes the holder key; the
//!   waiting agent sees the delete through its watch and grants.
//!
//! # Open files
//!
//! Which of its clients hold a file open is the agent's own business, kept
//! in memory as the embedded manager does ([`EtcdLeases::open_file`],
//! [`EtcdLeases::close_file`], [`EtcdLeases::take_closed`]): across agents,
//! the metadata service on etcd publishes one open mark per agent and file
//! while a client of that agent holds it open (module [`crate::meta::etcd`]), and
//! its removals compare on those marks in the same transaction. A client
//! that resumes on a restarted agent tells its open files again.
//!
//! An agent is the only writer of the holder keys of the sessions it
//! serves (besides etcd expiring them): it drops a holder that ignored a
//! revocation for a TTL, and it fences I/O ([`EtcdLeases::begin_io`])
//! with its own view of its sessions' holders, so the data path asks etcd
//! nothing.
//!
//! # Clocks
//!
//! Clients get the TTL `ttl` and count it on their own clock from when
//! they *sent* a renewal the agent confirmed ([`crate::conn`]). The etcd
//! lease of a session has a longer TTL (2 `ttl`, at least etcd's 2 s).
//! The agent counts it on its own clock too, from when it sent the last
//! keep-alive etcd answered, and confirms a client's renewal only while
//! that etcd lease is sure to outlive one more client TTL. So the client's
//! lease always runs out, on its own clock, before etcd may drop the
//! holder key and another agent grant the lease: an agent cut off from
//! etcd stops confirming renewals one client TTL before its etcd leases
//! could expire, its clients go write-through at their soft timeout and
//! stop trusting their leases before anyone else gets them. An etcd lease
//! that outlives its TTL (etcd extends them across a leader change) only
//! delays the next grant. The agent also refuses I/O under a lease whose
//! session's etcd lease it cannot vouch for ([`EtcdLeases::begin_io`]).
//!
//! # A slow etcd
//!
//! A slow etcd (a loaded disk delays its fsyncs, and so its answers) must
//! make operations slower, not fail them. Every wait for etcd is bounded
//! by the manager's *patience*: the client TTL (10 s by default; at least
//! 5 s). An etcd that does not answer for longer fails the requests that
//! wait for it with `EIO`; one that answers within it only delays them:
//! - keep-alives go out every eighth of the etcd TTL without waiting for
//!   the last answer, and the etcd TTL is two client TTLs: an etcd that
//!   answers keep-alives up to a TTL late leaves every session vouched
//!   for, and one that stalls for less than a TTL and then goes on has
//!   expired no session;
//! - a renewal that would be refused waits a fifth of a TTL for a
//!   keep-alive first, and a refused renewal is a missed one: the client
//!   renews again, and once its clock ran out, renews before it uses its
//!   cache, which stays ([`crate::client`]);
//! - a data request whose session etcd cannot vouch for waits for a
//!   keep-alive instead of being refused ([`EtcdLeases::begin_io`]);
//! - etcd itself gives up on a request it queued for about 7 s: what can
//!   be done again is (an acquire's reads and grant, a file's size and
//!   attributes, a create, which knows its own inode number); an unlink,
//!   rename or link etcd gave up on may or may not have happened, and
//!   fails with `EIO`.
//!
//! # Restarts
//!
//! Nothing of a lease lives only in an agent. A killed agent's sessions
//! stay in etcd for the etcd TTL; a client that reconnects meanwhile (to
//! the restarted agent, or to any other) resumes its session with its
//! leases and dirty cache ([`EtcdLeases::resume`]); revocations that
//! waited for it are sent again.

use shortfuse::sync::Unpoison;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use shortfuse::{Errno, Result};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::lease::RevokeSender;
use crate::proto::{ClientId, Gfi, LeaseMode, ServerMsg};

/// Longest wait for etcd at start (the agent refuses to start without it),
/// and for one request of a manager whose TTL is shorter.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Keep-alives of one session in flight at most: a slow etcd gets the next
/// one before it answered the last, so that each answer counts from a
/// recent send.
const KEEPING_MAX: u32 = 2;
/// Operations per transaction when loading a session's holders (etcd's
/// default limit is 128).
const TXN_OPS: usize = 64;
/// Pause before watching again after the watch failed.
const WATCH_RETRY: Duration = Duration::from_millis(200);

/// A session this agent serves.
struct Session {
    revokes: RevokeSender,
    /// When the client last renewed (or resumed).
    renewed: Instant,
    /// The session's etcd lease lives at least until then (this agent's
    /// clock: send time of the last keep-alive etcd answered, plus its TTL).
    etcd_until: Instant,
    etcd_ttl: Duration,
    /// Keep-alives in flight.
    keeping: u32,
    /// The client was welcomed: revocations may go to it (the first
    /// message of a connection must be the welcome).
    welcomed: bool,
}

/// A lease held by a client of this agent.
#[derive(Clone, Copy)]
struct Held {
    mode: LeaseMode,
    lease: u64,
    /// Given back: no new I/O; its key goes once the running I/O is done.
    released: bool,
}

#[derive(Default)]
struct State {
    sessions: HashMap<ClientId, Session>,
    held: HashMap<Gfi, HashMap<ClientId, Held>>,
    /// Holders sent a revocation: lease id and when.
    revoking: HashMap<(Gfi, ClientId), (u64, Instant)>,
    /// Running data requests.
    io: HashMap<(Gfi, ClientId), u32>,
    /// Holder keys to delete (released; the first try failed).
    unheld: Vec<(Gfi, ClientId, u64)>,
    /// Which of this agent's sessions hold each file open.
    opens: HashMap<Gfi, HashSet<ClientId>>,
    /// Files whose last opener here went away, not yet taken by the server.
    closed: Vec<Gfi>,
}

impl State {
    fn held(&self, gfi: Gfi, client: ClientId) -> Option<&Held> {
        self.held.get(&gfi)?.get(&client)
    }

    fn drop_held(&mut self, gfi: Gfi, client: ClientId) {
        if let Some(m) = self.held.get_mut(&gfi) {
            m.remove(&client);
            if m.is_empty() {
                self.held.remove(&gfi);
            }
        }
        self.revoking.remove(&(gfi, client));
    }

    fn drop_session(&mut self, client: ClientId) {
        self.sessions.remove(&client);
        self.held.retain(|_, m| {
            m.remove(&client);
            !m.is_empty()
        });
        self.revoking.retain(|(_, c), _| *c != client);
        self.unheld.retain(|(_, c, _)| *c != client);
        let closed = &mut self.closed;
        self.opens.retain(|gfi, openers| {
            if openers.remove(&client) && openers.is_empty() {
                closed.push(*gfi);
            }
            !openers.is_empty()
        });
    }
}

/// One agent's lease manager on etcd. Cheap to share (`Arc`).
pub struct EtcdLeases {
    /// This agent's name in direct holders' keys (see [`Tagged`]).
    agent: u64,
    etcd: Client,
    prefix: String,
    ttl: Duration,
    etcd_ttl_secs: i64,
    /// How long a request waits for etcd before it fails (see the module
    /// docs, "A slow etcd").
    patience: Duration,
    st: Mutex<State>,
    /// Woken on every change of a holder key and every local release.
    changed: Notify,
    /// Woken when a keep-alive moved a session's `etcd_until`, or failed.
    kept: Notify,
    /// Set when the agent stops: its sessions must outlive it.
    frozen: AtomicBool,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Test hook ([`EtcdLeases::pause_grants`]): grants wait here between
    /// their transaction and their record.
    grants_paused: tokio::sync::watch::Sender<bool>,
}

/// Running I/O under a lease; the holder key stays until it is dropped.
pub struct IoGuard {
    mgr: Arc<EtcdLeases>,
    gfi: Gfi,
    client: ClientId,
}

impl Drop for IoGuard {
    fn drop(&mut self) {
        let key = (self.gfi, self.client);
        let mut st = self.mgr.lock();
        let Some(n) = st.io.get_mut(&key) else { return };
        *n -= 1;
        if *n > 0 {
            return;
        }
        st.io.remove(&key);
        let Some(h) = st.held(self.gfi, self.client).copied().filter(|h| h.released) else {
            return;
        };
        // Released while this I/O ran: its key goes now.
        st.drop_held(self.gfi, self.client);
        st.unheld.push((self.gfi, self.client, h.lease));
        drop(st);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let mgr = self.mgr.clone();
            rt.spawn(async move { mgr.delete_unheld().await });
        }
    }
}

/// What a key under the prefix names.
#[derive(Debug, PartialEq, Eq)]
enum Key {
    Session(ClientId),
    Holder(Gfi, ClientId),
    Request(Gfi, ClientId),
    Other,
}

fn gfi_str(g: Gfi) -> String {
    format!("{:08x}.{:016x}", g.node, g.ino)
}

fn client_str(c: ClientId) -> String {
    format!("{:016x}", c.0)
}

fn parse_gfi(s: &str) -> Option<Gfi> {
    let (node, ino) = s.split_once('.')?;
    Some(Gfi {
        node: u32::from_str_radix(node, 16).ok()?,
        ino: u64::from_str_radix(ino, 16).ok()?,
    })
}

fn parse_client(s: &str) -> Option<ClientId> {
    u64::from_str_radix(s, 16).ok().map(ClientId)
}

/// What `key` names, under `prefix`.
fn parse_key(prefix: &str, key: &[u8]) -> Key {
    let Some(rest) = std::str::from_utf8(key).ok().and_then(|k| k.strip_prefix(prefix)) else {
        return Key::Other;
    };
    let mut parts = rest.split('/');
    let parsed = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("s"), Some(c), None, None) => parse_client(c).map(Key::Session),
        (Some(kind), Some(g), Some(c), None) => parse_gfi(g).zip(parse_client(c)).and_then(|(g, c)| match kind {
            "h" => Some(Key::Holder(g, c)),
            "r" => Some(Key::Request(g, c)),
            _ => None,
        }),
        _ => None,
    };
    parsed.unwrap_or(Key::Other)
}

/// A holder's or request's mode as the keys keep it, with the agent that
/// serves the client: direct holders share a file only when one agent
/// serves them all. That agent's lock makes each direct write (which may
/// merge a partly written block: read, change, put) one step with respect
/// to the others; the block store offers no such step across agents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tagged {
    mode: LeaseMode,
    agent: u64,
}

/// `r`, `w`, or `d/<agent>`.
fn mode_value(m: Tagged) -> String {
    match m.mode {
        LeaseMode::Read => "r".into(),
        LeaseMode::Write => "w".into(),
        LeaseMode::Direct => format!("d/{:016x}", m.agent),
    }
}

fn parse_mode(v: &[u8]) -> Option<Tagged> {
    let tagged = |mode| Some(Tagged { mode, agent: 0 });
    match v {
        b"r" => tagged(LeaseMode::Read),
        b"w" => tagged(LeaseMode::Write),
        _ => {
            let agent = std::str::from_utf8(v.strip_prefix(b"d/")?).ok()?;
            Some(Tagged {
                mode: LeaseMode::Direct,
                agent: u64::from_str_radix(agent, 16).ok()?,
            })
        }
    }
}

/// [`LeaseMode::compatible`], and direct holders of different agents
/// conflict (see [`Tagged`]).
fn conflicts(a: Tagged, b: Tagged) -> bool {
    !a.mode.compatible(b.mode) || (a.mode == LeaseMode::Direct && a.agent != b.agent)
}

/// Names an agent among those sharing one etcd: time, process and a count
/// (tests run several agents in one process).
fn new_agent_id() -> u64 {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ u64::from(std::process::id()).rotate_left(40) ^ COUNT.fetch_add(1, Ordering::Relaxed).rotate_left(20)
}

/// etcd's errors as the file system's: a session whose etcd lease is gone
/// is `ESTALE` (the client starts over), anything else `EIO`.
fn etcd_errno(e: &etcd_client::Error) -> Errno {
    let lost = match e {
        etcd_client::Error::GRpcStatus(s) => s.message().contains("lease not found"),
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("lease not found"),
        _ => false,
    };
    if lost {
        Errno::ESTALE
    } else {
        Errno::EIO
    }
}

/// Runs one etcd request with [`OP_TIMEOUT`].
async fn op<T>(f: impl Future<Output = std::result::Result<T, etcd_client::Error>>) -> Result<T> {
    op_within(OP_TIMEOUT, f).await
}

/// Runs one etcd request, `EIO` when etcd did not answer within `limit`.
async fn op_within<T>(
    limit: Duration,
    f: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(etcd_errno(&e)),
        Err(_) => Err(Errno::EIO),
    }
}

fn with_lease(client: ClientId) -> Option<PutOptions> {
    Some(PutOptions::new().with_lease(client.0 as i64))
}

/// The holders of one file as read at `revision`.
struct Snapshot {
    revision: i64,
    holders: Vec<(ClientId, Tagged, u64)>,
    session_alive: bool,
    /// Requests waiting for conflicting holders (their request keys),
    /// with the revision that created each key: their order of arrival.
    waiting: Vec<(ClientId, Tagged, i64)>,
}

/// A request key of an `acquire` in progress, deleted when it ends
/// without a grant (a grant deletes it in its own transaction).
struct Request {
    mgr: Arc<EtcdLeases>,
    key: String,
    /// Conflicting holder leases when the key was last put.
    asked: HashSet<(ClientId, u64)>,
    done: bool,
}

impl Drop for Request {
    fn drop(&mut self) {
        if self.done || self.mgr.frozen.load(Ordering::Acquire) {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let mut kv = self.mgr.etcd.kv_client();
            let key = std::mem::take(&mut self.key);
            // If this fails the key goes with the session.
            rt.spawn(async move { op(kv.delete(key, None)).await });
        }
    }
}

impl EtcdLeases {
    /// Connects to etcd at `endpoints` and starts watching the lease keys
    /// under `prefix`. Clients get `ttl`. Must run inside a tokio runtime,
    /// which also runs the watch and keep-alives.
    pub async fn connect(endpoints: &[String], prefix: &str, ttl: Duration) -> std::io::Result<Arc<EtcdLeases>> {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            // etcd refuses pings more often than every 5 s (it closes the
            // connection: too many pings). An etcd that stalls answers no
            // ping either: the connection (and every request on it) goes
            // only after as long as a request waits.
            .with_keep_alive(Duration::from_secs(10), ttl.max(OP_TIMEOUT))
            .with_keep_alive_while_idle(true);
        let etcd = Client::connect(endpoints, Some(opts))
            .await
            .map_err(|e| std::io::Error::other(format!("etcd {}: {e}", endpoints.join(","))))?;
        // etcd grants whole seconds, at least 2 (its minimum lease TTL).
        let etcd_ttl_secs = (ttl.as_millis() as u64 * 2).div_ceil(1000).max(2) as i64;
        let mgr = Arc::new(EtcdLeases {
            agent: new_agent_id(),
            etcd,
            prefix: prefix.to_string(),
            ttl,
            etcd_ttl_secs,
            patience: ttl.max(OP_TIMEOUT),
            st: Mutex::new(State::default()),
            changed: Notify::new(),
            kept: Notify::new(),
            frozen: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            grants_paused: tokio::sync::watch::Sender::new(false),
        });
        // Reachable now, or the agent refuses to start.
        let mut kv = mgr.etcd.kv_client();
        let probe = kv.get(mgr.prefix.clone(), Some(GetOptions::new().with_count_only()));
        match tokio::time::timeout(OP_TIMEOUT, probe).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(std::io::Error::other(format!("etcd {}: {e}", endpoints.join(",")))),
            Err(_) => {
                let msg = format!("etcd {}: no answer in {OP_TIMEOUT:?}", endpoints.join(","));
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, msg));
            }
        }
        let watch = tokio::spawn(Self::watch_loop(Arc::downgrade(&mgr)));
        let keeper = tokio::spawn(Self::keep_loop(Arc::downgrade(&mgr)));
        *mgr.tasks.lock().unpoison() = vec![watch.abort_handle(), keeper.abort_handle()];
        Ok(mgr)
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The TTL of the sessions' etcd leases.
    pub fn etcd_ttl(&self) -> Duration {
        Duration::from_secs(self.etcd_ttl_secs as u64)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a few inserts and removes: a panic leaves maps
        // that are consistent enough to go on.
        self.st.lock().unpoison()
    }

    /// Runs one etcd request, `EIO` when etcd did not answer within the
    /// manager's patience.
    async fn op<T>(&self, f: impl Future<Output = std::result::Result<T, etcd_client::Error>>) -> Result<T> {
        op_within(self.patience, f).await
    }

    fn key(&self, kind: &str, a: &str, b: &str) -> String {
        if b.is_empty() {
            format!("{}{kind}/{a}", self.prefix)
        } else {
            format!("{}{kind}/{a}/{b}", self.prefix)
        }
    }

    fn session_key(&self, c: ClientId) -> String {
        self.key("s", &client_str(c), "")
    }

    fn holder_key(&self, g: Gfi, c: ClientId) -> String {
        self.key("h", &gfi_str(g), &client_str(c))
    }

    fn index_key(&self, c: ClientId, g: Gfi) -> String {
        self.key("c", &client_str(c), &gfi_str(g))
    }

    fn request_key(&self, g: Gfi, c: ClientId) -> String {
        self.key("r", &gfi_str(g), &client_str(c))
    }

    /// `kind/<a>/`: every key of one file (or session) of a kind.
    fn dir(&self, kind: &str, a: &str) -> String {
        format!("{}{kind}/{a}/", self.prefix)
    }

    /// `mode` as a client of this agent holds it.
    fn tagged(&self, mode: LeaseMode) -> Tagged {
        Tagged {
            mode,
            agent: self.agent,
        }
    }

    fn parse_key(&self, key: &[u8]) -> Key {
        parse_key(&self.prefix, key)
    }

    /// Stops the background work and keeps every session in etcd: the
    /// agent is going away, and its clients may resume elsewhere or on
    /// its successor (a crash would leave them too).
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
        for t in self.tasks.lock().unpoison().drain(..) {
            t.abort();
        }
    }

    fn frozen(&self) -> bool {
        self.frozen.load(Ordering::Acquire)
    }

    /// Test hook: with `true`, grants stop after their transaction, before
    /// this agent records them (as a busy agent's may, for a while), until
    /// called with `false`.
    pub fn pause_grants(&self, pause: bool) {
        self.grants_paused.send_replace(pause);
    }

    /// Starts a session; revocations for it are sent to `revokes`.
    pub async fn open_session(&self, revokes: RevokeSender) -> Result<ClientId> {
        let mut lc = self.etcd.lease_client();
        let sent = Instant::now();
        let granted = self.op(lc.grant(self.etcd_ttl_secs, None)).await?;
        let client = ClientId(granted.id() as u64);
        let etcd_ttl = Duration::from_secs(granted.ttl().max(0) as u64);
        let mut kv = self.etcd.kv_client();
        let key = self.session_key(client);
        if let Err(e) = self
            .op(kv.put(key, granted.ttl().to_string(), with_lease(client)))
            .await
        {
            let _ = self.op(lc.revoke(granted.id())).await;
            return Err(e);
        }
        self.lock().sessions.insert(
            client,
            Session {
                revokes,
                renewed: Instant::now(),
                etcd_until: sent + etcd_ttl,
                etcd_ttl,
                keeping: 0,
                welcomed: true,
            },
        );
        Ok(client)
    }

    /// Takes back session `client` on a new connection if it still lives,
    /// here or in etcd (a restarted agent, or a client that moved from
    /// another agent: its leases come along), else starts a new one.
    /// Revocations that wait for it are sent by
    /// [`EtcdLeases::resend_revocations`] (after the welcome).
    pub async fn resume(&self, client: ClientId, revokes: RevokeSender) -> Result<ClientId> {
        let local = {
            let mut st = self.lock();
            match st.sessions.get_mut(&client) {
                Some(s) => {
                    s.revokes = revokes.clone();
                    s.renewed = Instant::now();
                    s.welcomed = false;
                    true
                }
                None => false,
            }
        };
        if local {
            // With etcd away it is still this client's session: its
            // renewals wait for etcd, its clock runs meanwhile.
            return match self.keep_alive(client).await {
                Err(Errno::ESTALE) => self.open_session(revokes).await,
                Ok(()) | Err(_) => Ok(client),
            };
        }
        let mut kv = self.etcd.kv_client();
        let got = self.op(kv.get(self.session_key(client), None)).await?;
        let Some(etcd_ttl) = got
            .kvs()
            .first()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<u64>().ok())
        else {
            return self.open_session(revokes).await;
        };
        // Its etcd lease is unproven until the keep-alive below.
        let now = Instant::now();
        self.lock().sessions.insert(
            client,
            Session {
                revokes: revokes.clone(),
                renewed: now,
                etcd_until: now,
                etcd_ttl: Duration::from_secs(etcd_ttl),
                keeping: 0,
                welcomed: false,
            },
        );
        let loaded = match self.keep_alive(client).await {
            Ok(()) => self.load_session(client).await,
            Err(e) => Err(e),
        };
        match loaded {
            Ok(()) => Ok(client),
            Err(e) => {
                self.lock().drop_session(client);
                if e == Errno::ESTALE {
                    self.open_session(revokes).await
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Loads the holders of a session taken over from etcd, and the
    /// requests that wait for them.
    async fn load_session(&self, client: ClientId) -> Result<()> {
        let mut kv = self.etcd.kv_client();
        let index = self
            .op(kv.get(
                self.dir("c", &client_str(client)),
                Some(GetOptions::new().with_prefix()),
            ))
            .await?;
        let gfis: Vec<Gfi> = index
            .kvs()
            .iter()
            .filter_map(|kv| parse_gfi(std::str::from_utf8(kv.key()).ok()?.rsplit('/').next()?))
            .collect();
        for chunk in gfis.chunks(TXN_OPS) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|g| TxnOp::get(self.holder_key(*g, client), None))
                .collect();
            let resp = self.op(kv.txn(Txn::new().and_then(ops))).await?;
            let mut st = self.lock();
            for (g, r) in chunk.iter().zip(resp.op_responses()) {
                let TxnOpResponse::Get(r) = r else { continue };
                let Some(h) = r.kvs().first() else { continue };
                let Some(tagged) = parse_mode(h.value()) else { continue };
                st.held.entry(*g).or_default().insert(
                    client,
                    Held {
                        mode: tagged.mode,
                        lease: h.mod_revision() as u64,
                        released: false,
                    },
                );
            }
        }
        // Requests put while nobody served the session: their watch
        // events went to no one of ours.
        for g in gfis {
            let reqs = self
                .op(kv.get(self.dir("r", &gfi_str(g)), Some(GetOptions::new().with_prefix())))
                .await?;
            for r in reqs.kvs() {
                if let (Key::Request(g, asker), Some(mode)) = (self.parse_key(r.key()), parse_mode(r.value())) {
                    self.revoke_for(g, asker, mode);
                }
            }
        }
        Ok(())
    }

    /// Sends `client` again the revocations it has not answered (they may
    /// have gone to a connection that died, or waited for its welcome).
    pub fn resend_revocations(&self, client: ClientId) {
        let mut st = self.lock();
        let Some(s) = st.sessions.get_mut(&client) else { return };
        s.welcomed = true;
        let st = &*st;
        let Some(s) = st.sessions.get(&client) else { return };
        for ((gfi, c), (lease, _)) in &st.revoking {
            if *c == client {
                let _ = s.revokes.send(ServerMsg::Revoke {
                    gfi: *gfi,
                    lease: *lease,
                });
            }
        }
    }

    /// One keep-alive of `client`'s etcd lease; moves its `etcd_until`.
    /// `ESTALE` when etcd no longer has it (the session is dropped here).
    async fn keep_alive(&self, client: ClientId) -> Result<()> {
        let mut lc = self.etcd.lease_client();
        let sent = Instant::now();
        // etcd answers the first keep-alive of a stream: one stream each
        // time keeps a lost answer from being taken for a later one.
        match self.op(lc.keep_alive(client.0 as i64)).await {
            Ok(_) => {
                let mut st = self.lock();
                if let Some(s) = st.sessions.get_mut(&client) {
                    s.etcd_until = s.etcd_until.max(sent + s.etcd_ttl);
                }
                drop(st);
                self.kept.notify_waiters();
                Ok(())
            }
            Err(Errno::ESTALE) => {
                self.lock().drop_session(client);
                self.changed.notify_waiters();
                self.kept.notify_waiters();
                Err(Errno::ESTALE)
            }
            Err(e) => Err(e),
        }
    }

    /// Sends a keep-alive of `client`'s etcd lease in the background,
    /// unless [`KEEPING_MAX`] are in flight already.
    fn kick(self: &Arc<Self>, client: ClientId) {
        {
            let mut st = self.lock();
            let Some(s) = st.sessions.get_mut(&client) else { return };
            if s.keeping >= KEEPING_MAX {
                return;
            }
            s.keeping += 1;
        }
        let m = self.clone();
        tokio::spawn(async move {
            let _ = m.keep_alive(client).await;
            if let Some(s) = m.lock().sessions.get_mut(&client) {
                s.keeping = s.keeping.saturating_sub(1);
            }
        });
    }

    /// Waits until `client`'s etcd lease surely outlives `margin` from now
    /// (keep-alives are sent meanwhile), at most until `deadline` and no
    /// longer than the etcd lease is sure to live. `ETIMEDOUT` when etcd
    /// did not answer by `deadline`; `ESTALE` when the session is gone or
    /// its etcd lease may have expired.
    async fn vouch(self: &Arc<Self>, client: ClientId, margin: Duration, deadline: Instant) -> Result<()> {
        loop {
            let kept = self.kept.notified();
            tokio::pin!(kept);
            // Registered before looking, so a keep-alive after the look wakes.
            kept.as_mut().enable();
            let until = self.lock().sessions.get(&client).ok_or(Errno::ESTALE)?.etcd_until;
            let now = Instant::now();
            if until >= now + margin {
                return Ok(());
            }
            if until <= now {
                // Another agent may hold its leases by now.
                return Err(Errno::ESTALE);
            }
            if now >= deadline {
                return Err(Errno::ETIMEDOUT);
            }
            self.kick(client);
            let _ = tokio::time::timeout(deadline.min(until) - now, kept).await;
        }
    }

    /// Confirms a client's renewal: `Ok` only while its session's etcd
    /// lease is sure to outlive one more client TTL (see the module docs),
    /// waiting a little for a keep-alive; `ETIMEDOUT` when etcd did not
    /// make it so in time (a missed renewal: the client's clock runs on,
    /// it asks again), `ESTALE` once the session is gone.
    pub async fn renew(self: &Arc<Self>, client: ClientId) -> Result<()> {
        {
            let mut st = self.lock();
            let s = st.sessions.get_mut(&client).ok_or(Errno::ESTALE)?;
            s.renewed = Instant::now();
        }
        // Answered before the client's wait for it ends (a quarter TTL).
        let deadline = Instant::now() + self.ttl / 5;
        match self.vouch(client, self.ttl, deadline).await {
            // Its clock would run out before the etcd lease may: no reason
            // to end the session here (a keep-alive may yet come back).
            Err(Errno::ESTALE) if self.lock().sessions.contains_key(&client) => Err(Errno::ETIMEDOUT),
            r => r,
        }
    }

    /// Ends a session (its connection closed): every lease it held, every
    /// file it held open and every request it made go with its etcd lease.
    pub async fn end_session(&self, client: ClientId) {
        self.end_session_if(client, None).await
    }

    /// Ends session `client` if its connection is still the one whose
    /// revocations go to `revokes` (see [`crate::lease::embedded::LeaseManager::end_connection`]).
    pub async fn end_connection(&self, client: ClientId, revokes: &RevokeSender) {
        self.end_session_if(client, Some(revokes)).await
    }

    async fn end_session_if(&self, client: ClientId, revokes: Option<&RevokeSender>) {
        if self.frozen() {
            return;
        }
        {
            let mut st = self.lock();
            let current = st
                .sessions
                .get(&client)
                .is_some_and(|s| crate::lease::ends_session(&s.revokes, revokes));
            if !current {
                return;
            }
            st.drop_session(client);
        }
        let mut lc = self.etcd.lease_client();
        // On failure the etcd lease expires by itself: later, nothing lost.
        let _ = self.op(lc.revoke(client.0 as i64)).await;
        self.changed.notify_waiters();
    }

    /// The holders of `gfi`, read at one revision.
    async fn snapshot(&self, client: ClientId, gfi: Gfi) -> Result<Snapshot> {
        let mut kv = self.etcd.kv_client();
        let txn = Txn::new().and_then([
            TxnOp::get(self.dir("h", &gfi_str(gfi)), Some(GetOptions::new().with_prefix())),
            TxnOp::get(self.session_key(client), Some(GetOptions::new().with_count_only())),
            TxnOp::get(self.dir("r", &gfi_str(gfi)), Some(GetOptions::new().with_prefix())),
        ]);
        let resp = self.op(kv.txn(txn)).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut snap = Snapshot {
            revision,
            holders: Vec::new(),
            session_alive: false,
            waiting: Vec::new(),
        };
        let gets: Vec<_> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let [holders, session, requests] = &gets[..] else {
            return Err(Errno::EIO);
        };
        for kv in requests.kvs() {
            if let (Key::Request(_, c), Some(mode)) = (self.parse_key(kv.key()), parse_mode(kv.value())) {
                snap.waiting.push((c, mode, kv.create_revision()));
            }
        }
        snap.session_alive = session.count() > 0;
        for kv in holders.kvs() {
            if let (Key::Holder(_, c), Some(mode)) = (self.parse_key(kv.key()), parse_mode(kv.value())) {
                snap.holders.push((c, mode, kv.mod_revision() as u64));
            }
        }
        Ok(snap)
    }

    /// Grants `mode` on `gfi` to `client` (Algorithm 2): compatible
    /// requests join the holders; a conflicting one puts its request key
    /// (the holders' agents revoke) and waits until the holders' keys are
    /// gone. A client that holds a lease that satisfies `mode` gets its id
    /// back; one that holds a read lease and asks to write is upgraded once
    /// the other readers are gone.
    pub async fn acquire(self: &Arc<Self>, client: ClientId, gfi: Gfi, mode: LeaseMode) -> Result<u64> {
        let mut request: Option<Request> = None;
        // Since when etcd has been failing this acquire's requests.
        let mut failing = None;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before looking, so a change after the look wakes.
            notified.as_mut().enable();
            {
                let st = self.lock();
                if !st.sessions.contains_key(&client) {
                    return Err(Errno::ESTALE);
                }
                if let Some(h) = st.held(gfi, client).filter(|h| !h.released) {
                    if h.mode.covers(mode) {
                        return Ok(h.lease);
                    }
                }
            }
            let snap = match self.snapshot(client, gfi).await {
                Ok(snap) => snap,
                Err(e) if self.retry_after(e, &mut failing) => {
                    tokio::time::sleep(WATCH_RETRY).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            failing = None;
            if !snap.session_alive {
                self.lock().drop_session(client);
                return Err(Errno::ESTALE);
            }
            let conflicting: HashSet<(ClientId, u64)> = snap
                .holders
                .iter()
                .filter(|(c, m, _)| *c != client && conflicts(*m, self.tagged(mode)))
                .map(|(c, _, l)| (*c, *l))
                .collect();
            // While a request waits, no direct request that conflicts with
            // it goes first (see `LeaseManager::acquire`), neither joining
            // the direct holders it waits for nor, once they are gone,
            // racing it for the free file: the one that arrived first (its
            // request key is older) is granted first. A direct request
            // that waits has its own key, so two never defer to each other.
            let arrived = snap
                .waiting
                .iter()
                .find(|(c, _, _)| *c == client)
                .map_or(i64::MAX, |(_, _, since)| *since);
            let queued = mode == LeaseMode::Direct
                && snap
                    .waiting
                    .iter()
                    .any(|(c, m, since)| *c != client && *since < arrived && conflicts(*m, self.tagged(mode)));
            if conflicting.is_empty() && queued {
                let _ = tokio::time::timeout(self.ttl / 4, notified).await;
                continue;
            }
            if conflicting.is_empty() {
                let granted = match self.grant(client, gfi, mode, snap.revision).await {
                    Ok(granted) => granted,
                    // Applied or not, the next look tells.
                    Err(e) if self.retry_after(e, &mut failing) => {
                        tokio::time::sleep(WATCH_RETRY).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if let Some(lease) = granted {
                    if let Some(r) = &mut request {
                        r.done = true;
                    }
                    // Not on the way of the grant's reply.
                    let m = self.clone();
                    tokio::spawn(async move { m.revoke_for_requests(gfi).await });
                    return Ok(lease);
                }
                // A holder changed meanwhile: look again.
                continue;
            }
            let ask = match &request {
                None => true,
                // New conflicting holders since the last ask (they were
                // granted before this request was seen): ask again, so
                // that their agents revoke them too.
                Some(r) => !conflicting.is_subset(&r.asked),
            };
            if ask {
                let key = self.request_key(gfi, client);
                let mut kv = self.etcd.kv_client();
                match self
                    .op(kv.put(key.clone(), mode_value(self.tagged(mode)), with_lease(client)))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if self.retry_after(e, &mut failing) => {
                        tokio::time::sleep(WATCH_RETRY).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                match &mut request {
                    Some(r) => r.asked = conflicting,
                    None => {
                        request = Some(Request {
                            mgr: self.clone(),
                            key,
                            asked: conflicting,
                            done: false,
                        })
                    }
                }
            }
            // Woken by the watch on any holder change; the timeout covers
            // a watch that is down and being set up again.
            let _ = tokio::time::timeout(self.ttl / 4, notified).await;
        }
    }

    /// Whether an acquire goes on after error `e`: etcd failed a request
    /// (`EIO`: slow, or it gave up on it), and has been failing them for
    /// less than the manager's patience.
    fn retry_after(&self, e: Errno, failing: &mut Option<Instant>) -> bool {
        e == Errno::EIO && failing.get_or_insert_with(Instant::now).elapsed() < self.patience
    }

    /// The grant transaction: `client` becomes a holder of `gfi` if no
    /// holder key changed since `revision`. `None` if one did.
    async fn grant(&self, client: ClientId, gfi: Gfi, mode: LeaseMode, revision: i64) -> Result<Option<u64>> {
        let txn = Txn::new()
            .when([
                Compare::mod_revision(self.dir("h", &gfi_str(gfi)), CompareOp::Less, revision + 1).with_prefix(),
                Compare::version(self.session_key(client), CompareOp::Greater, 0),
            ])
            .and_then([
                TxnOp::put(
                    self.holder_key(gfi, client),
                    mode_value(self.tagged(mode)),
                    with_lease(client),
                ),
                TxnOp::put(self.index_key(client, gfi), "", with_lease(client)),
                TxnOp::delete(self.request_key(gfi, client), None),
            ]);
        let mut kv = self.etcd.kv_client();
        let resp = self.op(kv.txn(txn)).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let lease = resp.header().map_or(0, |h| h.revision()) as u64;
        let _ = self.grants_paused.subscribe().wait_for(|paused| !paused).await;
        let mut st = self.lock();
        if !st.sessions.contains_key(&client) {
            // Ended meanwhile: its etcd lease takes the key along.
            return Err(Errno::ESTALE);
        }
        st.revoking.remove(&(gfi, client));
        st.held.entry(gfi).or_default().insert(
            client,
            Held {
                mode,
                lease,
                released: false,
            },
        );
        Ok(Some(lease))
    }

    /// Revokes this agent's holders of `gfi` for the requests waiting on it
    /// in etcd, once a grant is recorded. A grant is recorded only after
    /// its transaction: an agent that saw the new holder key may put its
    /// request meanwhile, and the watch may bring it before the record,
    /// when there is no holder here to revoke. That agent does not ask
    /// again for a holder it has asked already, so its request would wait
    /// until its client gives up (ETIMEDOUT): on a loaded machine, under
    /// contention, it did. If etcd fails this look, the holder is revoked
    /// at the next request for the file.
    async fn revoke_for_requests(&self, gfi: Gfi) {
        let mut kv = self.etcd.kv_client();
        let dir = self.dir("r", &gfi_str(gfi));
        let Ok(reqs) = self.op(kv.get(dir, Some(GetOptions::new().with_prefix()))).await else {
            return;
        };
        for r in reqs.kvs() {
            if let (Key::Request(g, asker), Some(mode)) = (self.parse_key(r.key()), parse_mode(r.value())) {
                self.revoke_for(g, asker, mode);
            }
        }
    }

    /// Gives lease `lease` back. A release of a lease that is no longer
    /// held does nothing; the key goes once the running I/O under it is
    /// done.
    pub async fn release(&self, client: ClientId, gfi: Gfi, lease: u64) {
        {
            let mut st = self.lock();
            let busy = st.io.contains_key(&(gfi, client));
            match st.held.get_mut(&gfi).and_then(|m| m.get_mut(&client)) {
                Some(h) if h.lease == lease => {
                    h.released = true;
                    st.revoking.remove(&(gfi, client));
                    if busy {
                        // The last I/O guard deletes the key.
                        return;
                    }
                    st.drop_held(gfi, client);
                }
                Some(_) => return,
                // Not known here (taken over, say): the compared delete
                // below can only remove that very lease.
                None => {}
            }
            st.unheld.push((gfi, client, lease));
        }
        self.delete_unheld().await;
    }

    /// Deletes the holder keys of released leases (compared on their
    /// revision, so a newer grant stays); what fails is tried again by the
    /// next [`EtcdLeases::sweep`].
    async fn delete_unheld(&self) {
        let todo = std::mem::take(&mut self.lock().unheld);
        let mut kv = self.etcd.kv_client();
        let mut failed = Vec::new();
        for (gfi, client, lease) in todo {
            let hkey = self.holder_key(gfi, client);
            let txn = Txn::new()
                .when([Compare::mod_revision(hkey.clone(), CompareOp::Equal, lease as i64)])
                .and_then([
                    TxnOp::delete(hkey, None),
                    TxnOp::delete(self.index_key(client, gfi), None),
                ]);
            if self.op(kv.txn(txn)).await.is_err() {
                failed.push((gfi, client, lease));
            }
        }
        if !failed.is_empty() {
            self.lock().unheld.extend(failed);
        }
        self.changed.notify_waiters();
    }

    /// Checks that `client` still holds `lease` on `gfi` (a write lease
    /// when `write`), and that its session's etcd lease is vouched for,
    /// and registers running I/O until the guard is dropped. `ESTALE` when
    /// not: the caller's cache is no longer valid and its data must not
    /// reach storage. When etcd is slow to answer the keep-alives, waits
    /// for one (while the etcd lease is sure to live, at most the
    /// manager's patience: then `EIO`).
    pub async fn begin_io(self: &Arc<Self>, client: ClientId, gfi: Gfi, lease: u64, write: bool) -> Result<IoGuard> {
        // The margin the client's clock keeps too: a request that passes
        // has that long to land before etcd could drop the holder.
        let margin = self.ttl / 10;
        let deadline = Instant::now() + self.patience;
        loop {
            {
                let mut st = self.lock();
                let s = st.sessions.get(&client).ok_or(Errno::ESTALE)?;
                let vouched = s.etcd_until >= Instant::now() + margin;
                match st.held(gfi, client) {
                    Some(h) if h.lease == lease && !h.released && (!write || h.mode.writes()) => {}
                    _ => return Err(Errno::ESTALE),
                }
                if vouched {
                    *st.io.entry((gfi, client)).or_insert(0) += 1;
                    return Ok(IoGuard {
                        mgr: self.clone(),
                        gfi,
                        client,
                    });
                }
            }
            match self.vouch(client, margin, deadline).await {
                // Looks again at the lease, which may have gone meanwhile.
                Ok(()) => {}
                Err(Errno::ETIMEDOUT) => return Err(Errno::EIO),
                Err(e) => return Err(e),
            }
        }
    }

    /// Revokes the holders of `gfi` on this agent that conflict with a
    /// request of `asker` for `mode` (once per lease; a client not welcomed
    /// yet gets it with [`EtcdLeases::resend_revocations`]).
    fn revoke_for(&self, gfi: Gfi, asker: ClientId, mode: Tagged) {
        let mut st = self.lock();
        let st = &mut *st;
        let Some(holders) = st.held.get(&gfi) else { return };
        let now = Instant::now();
        for (c, h) in holders {
            if *c == asker || h.released || !conflicts(self.tagged(h.mode), mode) {
                continue;
            }
            if st.revoking.get(&(gfi, *c)).is_some_and(|(l, _)| *l == h.lease) {
                continue;
            }
            st.revoking.insert((gfi, *c), (h.lease, now));
            if let Some(s) = st.sessions.get(c).filter(|s| s.welcomed) {
                // A closed channel: the connection is going away.
                let _ = s.revokes.send(ServerMsg::Revoke { gfi, lease: h.lease });
            }
        }
    }

    /// Records that `client` holds `gfi` open (once, however many times
    /// its kernel opened it). `ESTALE` when the session is gone.
    pub fn open_file(&self, client: ClientId, gfi: Gfi) -> Result<()> {
        let mut st = self.lock();
        if !st.sessions.contains_key(&client) {
            return Err(Errno::ESTALE);
        }
        st.opens.entry(gfi).or_default().insert(client);
        Ok(())
    }

    /// `client` no longer holds `gfi` open. Returns whether no client of
    /// this agent does now (the file is also queued for
    /// [`EtcdLeases::take_closed`]).
    pub fn close_file(&self, client: ClientId, gfi: Gfi) -> bool {
        let mut st = self.lock();
        let Some(openers) = st.opens.get_mut(&gfi) else {
            return false;
        };
        if !openers.remove(&client) || !openers.is_empty() {
            return false;
        }
        st.opens.remove(&gfi);
        st.closed.push(gfi);
        true
    }

    /// Whether a client of this agent holds `gfi` open.
    pub fn is_open(&self, gfi: Gfi) -> bool {
        self.lock().opens.contains_key(&gfi)
    }

    /// Files whose last opener here closed them or went away since the
    /// last call.
    pub fn take_closed(&self) -> Vec<Gfi> {
        std::mem::take(&mut self.lock().closed)
    }

    /// Periodic work: ends the sessions whose clients stopped renewing,
    /// drops holders that ignored a revocation for a TTL, and deletes the
    /// released holder keys whose first delete failed.
    pub async fn sweep(&self) {
        if self.frozen() {
            return;
        }
        let now = Instant::now();
        let (silent, retry) = {
            let mut st = self.lock();
            let silent: Vec<ClientId> = st
                .sessions
                .iter()
                .filter(|(_, s)| now.duration_since(s.renewed) >= self.ttl)
                .map(|(c, _)| *c)
                .collect();
            let late: Vec<(Gfi, ClientId, u64)> = st
                .revoking
                .iter()
                .filter(|(_, (_, since))| now.duration_since(*since) >= self.ttl)
                .map(|((g, c), (l, _))| (*g, *c, *l))
                .collect();
            for (g, c, l) in late {
                st.revoking.remove(&(g, c));
                let busy = st.io.contains_key(&(g, c));
                if let Some(h) = st.held.get_mut(&g).and_then(|m| m.get_mut(&c)).filter(|h| h.lease == l) {
                    h.released = true;
                    if !busy {
                        st.drop_held(g, c);
                        st.unheld.push((g, c, l));
                    }
                }
            }
            (silent, !st.unheld.is_empty())
        };
        for c in silent {
            self.end_session(c).await;
        }
        if retry {
            self.delete_unheld().await;
        }
    }

    /// The holders of `gfi` and the mode, as etcd has them (for tests and
    /// diagnostics).
    pub async fn holders(&self, gfi: Gfi) -> Result<(Option<LeaseMode>, HashSet<ClientId>)> {
        let mut kv = self.etcd.kv_client();
        let r = self
            .op(kv.get(self.dir("h", &gfi_str(gfi)), Some(GetOptions::new().with_prefix())))
            .await?;
        let mut mode = None;
        let mut holders = HashSet::new();
        for kv in r.kvs() {
            if let (Key::Holder(_, c), Some(m)) = (self.parse_key(kv.key()), parse_mode(kv.value())) {
                mode = Some(if mode == Some(LeaseMode::Write) {
                    LeaseMode::Write
                } else {
                    m.mode
                });
                holders.insert(c);
            }
        }
        Ok((mode, holders))
    }

    /// Keeps the etcd leases of the sessions whose clients renew alive:
    /// a keep-alive every eighth of their TTL, without waiting for the
    /// last one's answer (see [`KEEPING_MAX`]), so that a renewal finds
    /// its session vouched for even when etcd takes seconds to answer.
    async fn keep_loop(mgr: Weak<EtcdLeases>) {
        loop {
            let period = {
                let Some(m) = mgr.upgrade() else { return };
                let now = Instant::now();
                let due: Vec<ClientId> = m
                    .lock()
                    .sessions
                    .iter()
                    .filter(|(_, s)| now.duration_since(s.renewed) < m.ttl)
                    .map(|(c, _)| *c)
                    .collect();
                for c in due {
                    m.kick(c);
                }
                m.etcd_ttl() / 8
            };
            tokio::time::sleep(period).await;
        }
    }

    /// Watches every key under the prefix, from a fresh look at the
    /// requests each time the watch (re)starts.
    async fn watch_loop(mgr: Weak<EtcdLeases>) {
        loop {
            let Some(m) = mgr.upgrade() else { return };
            let stream = m.start_watch().await;
            drop(m);
            if let Ok(mut stream) = stream {
                loop {
                    let msg = stream.message().await;
                    let Some(m) = mgr.upgrade() else { return };
                    match msg {
                        Ok(Some(resp)) if !resp.canceled() => m.on_events(resp.events()),
                        // Cancelled (compacted past our revision, say),
                        // closed or failed: look again and watch anew.
                        _ => break,
                    }
                }
            }
            // Waiters look again themselves after a change they missed.
            if let Some(m) = mgr.upgrade() {
                m.changed.notify_waiters();
            }
            tokio::time::sleep(WATCH_RETRY).await;
        }
    }

    /// Reads the pending requests and watches from the revision after.
    async fn start_watch(&self) -> Result<etcd_client::WatchStream> {
        let mut kv = self.etcd.kv_client();
        let reqs = self
            .op(kv.get(self.key("r", "", ""), Some(GetOptions::new().with_prefix())))
            .await?;
        let revision = reqs.header().map_or(0, |h| h.revision());
        for r in reqs.kvs() {
            if let (Key::Request(g, asker), Some(mode)) = (self.parse_key(r.key()), parse_mode(r.value())) {
                self.revoke_for(g, asker, mode);
            }
        }
        let mut wc = self.etcd.watch_client();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(revision + 1);
        self.op(wc.watch(self.prefix.clone(), Some(opts))).await
    }

    fn on_events(&self, events: &[etcd_client::Event]) {
        let mut changed = false;
        for ev in events {
            let Some(kv) = ev.kv() else { continue };
            let put = ev.event_type() == EventType::Put;
            match self.parse_key(kv.key()) {
                Key::Request(gfi, asker) if put => {
                    if let Some(mode) = parse_mode(kv.value()) {
                        // A put again means new holders to revoke, or a
                        // holder that missed the first revocation.
                        self.revoke_for(gfi, asker, mode);
                    }
                }
                Key::Holder(gfi, c) => {
                    changed = true;
                    if !put {
                        // Gone without a release here: its session
                        // expired in etcd. No I/O under it any more.
                        let lease = ev.prev_kv().map(|p| p.mod_revision() as u64);
                        let mut st = self.lock();
                        if st.held(gfi, c).is_some_and(|h| Some(h.lease) == lease) {
                            st.drop_held(gfi, c);
                        }
                    }
                }
                Key::Session(c) if !put => {
                    let mut st = self.lock();
                    if st.sessions.contains_key(&c) {
                        st.drop_session(c);
                    }
                    changed = true;
                }
                _ => {}
            }
        }
        if changed {
            self.changed.notify_waiters();
        }
    }
}

impl Drop for EtcdLeases {
    fn drop(&mut self) {
        for t in self.tasks.get_mut().unpoison().drain(..) {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let p = "/fs/lease/";
        let g = Gfi { node: 7, ino: 1 << 40 };
        let c = ClientId(0x694d_8f2a_11c0_0003);
        for (kind, want) in [("h", Key::Holder(g, c)), ("r", Key::Request(g, c))] {
            let k = format!("{p}{kind}/{}/{}", gfi_str(g), client_str(c));
            assert_eq!(parse_key(p, k.as_bytes()), want);
        }
        assert_eq!(
            parse_key(p, format!("{p}s/{}", client_str(c)).as_bytes()),
            Key::Session(c)
        );
        // The session index is not watched for anything.
        let index = format!("{p}c/{}/{}", client_str(c), gfi_str(g));
        assert_eq!(parse_key(p, index.as_bytes()), Key::Other);
        // Fixed widths: one file's key range holds no other file's keys.
        let one = format!("{p}h/{}/", gfi_str(Gfi { node: 7, ino: 1 }));
        let other = format!("{p}h/{}/{}", gfi_str(Gfi { node: 7, ino: 16 }), client_str(c));
        assert!(!other.starts_with(&one));
        // Other prefixes, junk and extra parts name nothing.
        assert_eq!(
            parse_key("/other/", format!("{p}s/{}", client_str(c)).as_bytes()),
            Key::Other
        );
        assert_eq!(
            parse_key(p, format!("{p}h/zz.1/{}", client_str(c)).as_bytes()),
            Key::Other
        );
        assert_eq!(
            parse_key(p, format!("{p}h/{}/{}/x", gfi_str(g), client_str(c)).as_bytes()),
            Key::Other
        );
        assert_eq!(parse_mode(b"x"), None);
        for mode in [LeaseMode::Read, LeaseMode::Write, LeaseMode::Direct] {
            let t = Tagged { mode, agent: 0xab };
            let back = parse_mode(mode_value(t).as_bytes()).unwrap();
            assert_eq!(back.mode, mode);
        }
        assert_eq!(parse_mode(b"d/zz"), None);
        // Direct holders share within one agent only; the rest follows
        // LeaseMode::compatible.
        let d = |agent| Tagged {
            mode: LeaseMode::Direct,
            agent,
        };
        let r = Tagged {
            mode: LeaseMode::Read,
            agent: 1,
        };
        assert!(!conflicts(d(1), d(1)));
        assert!(conflicts(d(1), d(2)));
        assert!(conflicts(d(1), r) && conflicts(r, d(1)));
        assert!(!conflicts(r, Tagged { agent: 2, ..r }));
    }
}
