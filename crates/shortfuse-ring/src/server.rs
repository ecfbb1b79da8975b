//! The daemon's side: a listening socket, and per client a region, a
//! dispatcher and one worker thread per queue.
//!
//! Each client gets its own memfd (sealed against shrinking), so a client
//! only ever sees its own requests. A worker takes slot indices from its
//! queue in order, copies the request out of the shared memory before
//! looking at it (the client could change it under our feet), serves it
//! with the same [`Dispatcher`] code as the kernel sessions, copies the
//! reply back and flips the slot's state to DONE. The worker of queue q
//! keeps off CPU q (its clients' CPU when they submit there), so that both
//! can poll at once (see [`crate::wait`]); a thread the file system starts
//! from inside a request inherits that affinity. Indices, lengths and
//! states read from the shared memory are checked against the daemon's
//! private copy of the geometry: garbage gets an error reply or is skipped,
//! never a fault or an access outside the client's region.
//!
//! Coherence: a change made through one client (a write, a setattr, a new
//! or removed name) is announced to every other client as FUSE
//! INVAL_INODE / INVAL_ENTRY notifications in its notification ring, which
//! the client drains before it next looks at its cache.
//!
//! A client that goes away (exit, kill -9, even mid-request) closes its
//! socket; a watcher thread sees the end, stops the client's workers,
//! releases the handles it left open and forgets the nodes it looked up,
//! then unmaps its region.

use shortfuse::sync::lock;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use shortfuse::{
    Dispatcher, Filesystem, MountOptions, NodeId, Notification, Notifier, NotifySink, Outcome, Stats, Transport,
};
use shortfuse_abi::{self as abi, Operation};
use zerocopy::{FromBytes, IntoBytes};

use crate::anchors::Anchors;
use crate::client::{encode_record, Notice};
use crate::foreign::{Forward, ForwardFs};
use crate::locks::{Locks, Reaper};
use crate::proto::{AnchorAck, AnchorMsg, Hello, NamesMsg, Welcome, ANCHOR_MAGIC, CLAIM_MAGIC, NAMES_MAGIC};
use crate::region::{self, header, slot, Geometry, Region, DAEMON_ALIVE, DAEMON_GONE, EMPTY, SLOT_HEADER};
use crate::{sys, wait};

mod backings;
mod caller;
mod nodes;
mod ownership;

use backings::Backings;
use nodes::Nodes;

use caller::{Acting, Peer, Who};
use ownership::{Locked, Parked};

/// How the daemon shapes and polls its rings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Submission queues per client (default: one per CPU).
    pub queues: u32,
    /// Slots per queue: requests in flight per queue.
    pub slots: u32,
    /// Largest READ/WRITE payload; a slot holds it and a page of headers.
    pub max_io: u32,
    /// How long an idle worker spins before it sleeps.
    pub spin: Duration,
    /// How long a client spins for its reply before it sleeps.
    pub client_spin: Duration,
    /// Notification records per client.
    pub records: u32,
    /// The daemon's notifier, when a kernel mount of the same file system
    /// has one ([`shortfuse::DevSession::notifier`]): the server adds its
    /// clients to it, so that what the file system notifies reaches them,
    /// and tells the kernel of every change a client makes. `None`: a
    /// notifier of the server's own, reaching the clients alone.
    pub notifier: Option<Notifier>,
    /// Serve each request with the caller's credentials (see
    /// `server::caller`): for a daemon running as root whose file system
    /// works on the host's files, so that the kernel checks permissions as
    /// for the caller and the caller owns what it creates.
    pub impersonate: bool,
    /// The host directory the file system mirrors (passthrough), told to
    /// each client after the welcome (see [`crate::proto::SourceDir`]).
    pub source: Option<PathBuf>,
    /// The file system's namespace map, handed to clients of the daemon's
    /// own user (see [`crate::proto::NamesMsg`]); `None` when the file
    /// system declares none or must see every call (a cache in front).
    pub names: Option<shortfuse::NamespaceMap>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            queues: thread::available_parallelism().map_or(1, |n| n.get() as u32),
            slots: 4,
            max_io: 1 << 20,
            spin: Duration::from_micros(DEFAULT_SPIN_US),
            client_spin: Duration::from_micros(DEFAULT_SPIN_US),
            records: 256,
            notifier: None,
            impersonate: false,
            source: None,
            names: None,
        }
    }
}

/// The default spin budget of both sides, in microseconds (see
/// [`crate::wait`] for what was measured on 2 cores).
pub const DEFAULT_SPIN_US: u64 = 20;

impl ServerConfig {
    pub fn geometry(&self) -> Geometry {
        Geometry {
            queues: self.queues,
            slots: self.slots,
            slot_data: self.max_io.saturating_add(region::PAGE as u32),
            records: self.records,
        }
    }
}

/// A running ring server; stops (and tells its clients) when dropped.
pub struct Server {
    shared: Arc<Shared>,
    path: PathBuf,
    accept: Option<JoinHandle<()>>,
    anchors: Option<JoinHandle<()>>,
    reaper: Option<JoinHandle<()>>,
}

struct Shared {
    fs: Arc<dyn Filesystem>,
    /// An unmodified daemon that takes the requests as bytes (see
    /// [`crate::foreign`]); `fs` then only forwards the server's own calls.
    forward: Option<Arc<dyn Forward>>,
    /// The daemon's user: without `allow_other`, the only one served.
    owner: u32,
    opts: MountOptions,
    stats: Arc<Stats>,
    config: ServerConfig,
    geo: Geometry,
    listener: OwnedFd,
    clients: Mutex<Vec<Arc<Conn>>>,
    stopping: AtomicBool,
    next_id: AtomicU64,
    /// Handles owned by open file descriptions (see [`crate::anchors`]).
    anchors: Anchors,
    /// The lock table, shared with a kernel mount of the same daemon.
    locks: Arc<Locks>,
    reaper: Reaper,
    /// SETLKW requests waiting for their lock.
    parked: Mutex<Vec<Parked>>,
    /// A retry of the parked requests runs; `retry_again`: run it once more.
    retrying: AtomicBool,
    retry_again: AtomicBool,
    /// Given to every client's dispatcher (the file system's `init`).
    notifier: Notifier,
    /// The backing files of open handles (for clients' shared maps).
    backings: Arc<Backings>,
    /// The kernel nodes standing for FIFOs and device nodes.
    nodes: Nodes,
}

/// One client's connection.
struct Conn {
    id: u64,
    /// What the client's process may claim to be.
    peer: Peer,
    region: Region,
    geo: Geometry,
    dispatcher: Dispatcher,
    track: Mutex<Track>,
    notify: Mutex<NotifyTail>,
    stop: AtomicBool,
    /// Its queues' workers, joined by whoever ends the client first: its
    /// watcher when it goes, or [`Server::stop`].
    workers: Mutex<Vec<JoinHandle<()>>>,
}

struct NotifyTail {
    tail: u32,
    rec: Vec<u8>,
}

/// What a client holds in the file system, to give back when it goes.
#[derive(Default)]
struct Track {
    /// (fh, directory?) -> what the handle is open on, and who owns it.
    handles: HashMap<(u64, bool), Handle>,
    /// node -> lookups handed out and not forgotten.
    lookups: HashMap<u64, u64>,
    /// The anchored descriptions (by lock owner) this client anchored or
    /// claimed (see [`crate::proto::CLAIM_MAGIC`]): it may name their
    /// nodes.
    described: std::collections::HashSet<u64>,
}

impl Server {
    /// Listens at `path` (a stale socket there is replaced; a live daemon
    /// there is an error) and serves `fs` to every client that connects.
    pub fn start(
        path: &Path,
        fs: Arc<dyn Filesystem>,
        opts: MountOptions,
        stats: Arc<Stats>,
        config: ServerConfig,
    ) -> io::Result<Server> {
        Server::start_with_locks(path, fs, Arc::new(Locks::new()), opts, stats, config)
    }

    /// [`Server::start`] with a lock table shared with a kernel mount of the
    /// same file system (see [`crate::Announcing::new`]).
    pub fn start_with_locks(
        path: &Path,
        fs: Arc<dyn Filesystem>,
        locks: Arc<Locks>,
        opts: MountOptions,
        stats: Arc<Stats>,
        config: ServerConfig,
    ) -> io::Result<Server> {
        Server::start_inner(path, fs, None, locks, opts, stats, config)
    }

    /// Serves the requests of every client that connects at `path` with
    /// `forward`, which takes them as bytes: an unmodified FUSE daemon
    /// (see [`crate::foreign`]).
    pub fn start_forward(
        path: &Path,
        forward: Arc<dyn Forward>,
        opts: MountOptions,
        stats: Arc<Stats>,
        config: ServerConfig,
    ) -> io::Result<Server> {
        let fs: Arc<dyn Filesystem> = Arc::new(ForwardFs(forward.clone()));
        Server::start_inner(path, fs, Some(forward), Arc::new(Locks::new()), opts, stats, config)
    }

    fn start_inner(
        path: &Path,
        fs: Arc<dyn Filesystem>,
        forward: Option<Arc<dyn Forward>>,
        locks: Arc<Locks>,
        opts: MountOptions,
        stats: Arc<Stats>,
        config: ServerConfig,
    ) -> io::Result<Server> {
        let geo = config.geometry();
        geo.check()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        if path.exists() {
            if sys::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("a daemon already serves rings at {}", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = sys::listen(path)?;
        let notifier = config.notifier.clone().unwrap_or_default();
        // Anybody may connect: the handshake tells another user why it is
        // refused (without `allow_other`), or serves it.
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
        let owner = sys::raw(libc::SYS_geteuid, 0, 0, 0, 0, 0, 0) as u32;
        let shared = Arc::new(Shared {
            fs,
            forward,
            owner,
            opts,
            stats,
            config,
            geo,
            listener,
            clients: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            anchors: Anchors::new()?,
            locks: locks.clone(),
            reaper: Reaper::new()?,
            parked: Mutex::new(Vec::new()),
            retrying: AtomicBool::new(false),
            retry_again: AtomicBool::new(false),
            notifier: notifier.clone(),
            backings: Arc::default(),
            nodes: Nodes::new(path, owner == 0),
        });
        notifier.add_sink(Arc::new(ClientsSink(Arc::downgrade(&shared))));
        let weak = Arc::downgrade(&shared);
        locks.on_change(Box::new(move || {
            if let Some(s) = weak.upgrade() {
                s.retry_parked();
            }
        }));
        let s = shared.clone();
        let reaper = thread::Builder::new()
            .name("sf-ring-reaper".into())
            .spawn(move || s.reaper.run(&s.stopping, |pid| s.process_ended(pid)))?;
        let s = shared.clone();
        let accept = thread::Builder::new()
            .name("sf-ring-accept".into())
            .spawn(move || accept_loop(s))?;
        let s = shared.clone();
        let anchors = thread::Builder::new()
            .name("sf-ring-anchors".into())
            .spawn(move || s.anchors.run(&s.stopping, || s.settle_anchors()))?;
        Ok(Server {
            shared,
            path: path.to_path_buf(),
            accept: Some(accept),
            anchors: Some(anchors),
            reaper: Some(reaper),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        lock(&self.shared.clients).len()
    }

    /// Handles and looked-up nodes the clients hold now (for tests and
    /// the stats: both drop to zero once every client has gone and every
    /// open file description of theirs has closed).
    pub fn held(&self) -> (usize, usize) {
        let clients = lock(&self.shared.clients);
        let anchored = self.shared.anchors.len();
        clients.iter().fold((anchored, 0), |(h, l), c| {
            let t = lock(&c.track);
            (h + t.handles.len(), l + t.lookups.len())
        })
    }

    /// A handle that announces changes made elsewhere (a kernel mount of
    /// the same file system) to every client; see [`crate::Announcing`].
    pub fn announcer(&self) -> Announcer {
        Announcer(self.shared.clone())
    }

    /// The notifier the file system gets in `init`: every client, and the
    /// kernel when [`ServerConfig::notifier`] came from a kernel session.
    pub fn notifier(&self) -> &Notifier {
        &self.shared.notifier
    }

    /// Stops accepting, tells every client the daemon is gone (their
    /// calls fail with ENOTCONN) and removes the socket.
    pub fn stop(&mut self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        sys::shutdown(self.shared.listener.as_fd());
        for t in [self.accept.take(), self.anchors.take(), self.reaper.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
        // Not under the lock: a worker finishing a request may need it.
        let clients = lock(&self.shared.clients).clone();
        for c in &clients {
            c.halt();
            c.region.u32_at(header::DAEMON).store(DAEMON_GONE, Ordering::Release);
            for q in 0..c.geo.queues as usize {
                for i in 0..c.geo.slots as usize {
                    sys::futex_wake(c.region.u32_at(c.geo.slot_off(q, i)), i32::MAX);
                }
            }
        }
        // The requests in flight finish before `stop` returns: the caller
        // then gives the file system its `destroy`, which must be last.
        for c in &clients {
            c.join_workers();
        }
        self.shared.nodes.remove();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Tells every client of a [`Server`] about a change made elsewhere.
#[derive(Clone)]
pub struct Announcer(Arc<Shared>);

impl Announcer {
    /// The lock table of the server.
    pub fn locks(&self) -> &Arc<Locks> {
        &self.0.locks
    }

    pub fn notify_all(&self, notice: Notice<'_>) {
        for c in lock(&self.0.clients).iter() {
            c.push_notice(0, notice);
        }
    }
}

fn accept_loop(shared: Arc<Shared>) {
    loop {
        let sock = match sys::accept(shared.listener.as_fd()) {
            Ok(s) => s,
            Err(_) if shared.stopping.load(Ordering::SeqCst) => return,
            Err(e) => {
                tracing::warn!("shortfuse ring: accept: {e}");
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let s = shared.clone();
        // The handshake runs on the client's own watcher thread, so a client
        // that connects and says nothing holds up nobody else.
        let spawned = thread::Builder::new()
            .name("sf-ring-client".into())
            .spawn(move || serve_client(s, sock));
        if let Err(e) = spawned {
            tracing::warn!("shortfuse ring: cannot start a client thread: {e}");
        }
    }
}

/// Handshake, workers, then wait for the client to go and clean up.
fn serve_client(shared: Arc<Shared>, sock: OwnedFd) {
    let mut buf = [0u8; 64];
    let ok = match sys::recv(sock.as_fd(), &mut buf) {
        Ok((n, _)) => Hello::read_from_prefix(&buf[..n])
            .ok()
            .is_some_and(|(h, _)| h.magic == region::MAGIC && h.version == region::VERSION),
        Err(_) => false,
    };
    if !ok {
        let _ = sys::send(
            sock.as_fd(),
            b"error: not a shortfuse ring hello (version mismatch?)",
            None,
        );
        return;
    }
    let peer = match Peer::of(sock.as_fd()) {
        Ok(p) => p,
        Err(e) => {
            let _ = sys::send(sock.as_fd(), format!("error: who is connecting: {e}").as_bytes(), None);
            return;
        }
    };
    let owner = shared.owner;
    if peer.uid() != owner && !shared.opts.allow_other {
        // As the kernel refuses other users a FUSE mount without allow_other.
        let msg = format!(
            "error: this daemon runs as uid {owner} and serves only its own user's programs (uid {} asked); start it \
             with `shortfuse serve -o allow_other` to serve every user",
            peer.uid()
        );
        let _ = sys::send(sock.as_fd(), msg.as_bytes(), None);
        return;
    }
    let peer_uid = peer.uid();
    let conn = match Conn::new(&shared, peer) {
        Ok((conn, memfd)) => {
            let mut welcome = Welcome::new(&shared.geo, shared.config.client_spin).as_bytes().to_vec();
            if let Some(src) = &shared.config.source {
                source_dir(&mut welcome, src);
            }
            if let Err(e) = sys::send(sock.as_fd(), &welcome, Some(memfd.as_fd())) {
                tracing::warn!("shortfuse ring: handshake: {e}");
                return;
            }
            // The backing directory, to the daemon's own user alone.
            let grant = shared.config.names.as_ref().filter(|_| peer_uid == owner);
            let names = NamesMsg {
                magic: NAMES_MAGIC,
                granted: u32::from(grant.is_some()),
                no_xdev: u32::from(grant.is_some_and(|m| m.no_xdev)),
                uid: owner,
                padding: 0,
            };
            if let Err(e) = sys::send(sock.as_fd(), names.as_bytes(), grant.map(|m| m.root.as_fd())) {
                tracing::warn!("shortfuse ring: handshake: {e}");
                return;
            }
            Arc::new(conn)
        }
        Err(e) => {
            let _ = sys::send(sock.as_fd(), format!("error: {e}").as_bytes(), None);
            return;
        }
    };
    lock(&shared.clients).push(conn.clone());
    // `stop` halts the clients it finds listed; one listed too late for
    // it is halted here (its workers then end before serving anything).
    if shared.stopping.load(Ordering::SeqCst) {
        conn.halt();
    }
    for q in 0..shared.geo.queues as usize {
        let c = conn.clone();
        let s = shared.clone();
        match thread::Builder::new()
            .name(format!("sf-ring-c{}q{q}", conn.id))
            .spawn(move || worker(&s, &c, q))
        {
            Ok(h) => lock(&conn.workers).push(h),
            Err(e) => {
                tracing::warn!("shortfuse ring: cannot start a worker: {e}");
                break;
            }
        }
    }
    // After its hello the client only gives handles to descriptions
    // (anything else is ignored); the end of the stream (or an error) means
    // it has gone.
    loop {
        match sys::recv(sock.as_fd(), &mut buf) {
            Ok((0, _)) | Err(_) => break,
            Ok((n, fd)) => {
                if let Some(m) = Backings::parse(&buf[..n]) {
                    let owns = conn.owns(&m, fd.as_ref().map(|f| f.as_fd()), &shared);
                    shared.backings.answer(sock.as_fd(), &m, owns);
                    continue;
                }
                if let Some(m) = Nodes::parse(&buf[..n]) {
                    Nodes::answer(sock.as_fd(), &m, conn.kernel_node(&shared, m.node));
                    continue;
                }
                let Ok((m, _)) = AnchorMsg::read_from_prefix(&buf[..n]) else {
                    continue;
                };
                if let Some(fd) = fd {
                    if m.magic == CLAIM_MAGIC {
                        conn.claim(&shared, &m, fd.as_fd());
                    } else {
                        conn.anchor(&shared, &m, fd);
                    }
                }
                if (m.magic == ANCHOR_MAGIC || m.magic == CLAIM_MAGIC) && m.ack != 0 {
                    let ack = AnchorAck {
                        magic: ANCHOR_MAGIC,
                        ack: m.ack,
                        padding: 0,
                    };
                    let _ = sys::send(sock.as_fd(), ack.as_bytes(), None);
                }
            }
        }
    }
    conn.halt();
    conn.join_workers();
    lock(&shared.clients).retain(|c| c.id != conn.id);
    lock(&shared.parked).retain(|p| p.conn != conn.id);
    conn.reclaim(&shared);
}

impl Conn {
    fn new(shared: &Shared, peer: Peer) -> io::Result<(Conn, OwnedFd)> {
        let geo = shared.geo;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let memfd = sys::sealed_memfd(&format!("shortfuse-ring-{id}"), geo.bytes())?;
        let region = Region::map(memfd.as_fd(), geo.bytes())?;
        region.u64_at(header::MAGIC).store(region::MAGIC, Ordering::Relaxed);
        region.u32_at(header::VERSION).store(region::VERSION, Ordering::Relaxed);
        region.u32_at(header::QUEUES).store(geo.queues, Ordering::Relaxed);
        region.u32_at(header::SLOTS).store(geo.slots, Ordering::Relaxed);
        region.u32_at(header::SLOT_DATA).store(geo.slot_data, Ordering::Relaxed);
        region.u32_at(header::RECORDS).store(geo.records, Ordering::Relaxed);
        let spin = u64::try_from(shared.config.client_spin.as_nanos()).unwrap_or(u64::MAX);
        region.u64_at(header::SPIN_NS).store(spin, Ordering::Relaxed);
        region.u32_at(header::DAEMON).store(DAEMON_ALIVE, Ordering::Release);
        for q in 0..geo.queues as usize {
            for i in 0..geo.slots {
                region.u32_at(geo.entry_off(q, i)).store(EMPTY, Ordering::Relaxed);
            }
        }
        let pages = (geo.slot_data as usize - region::PAGE) / region::PAGE;
        let dispatcher = Dispatcher::with_max_pages_limit(
            shared.fs.clone(),
            shared.opts.clone(),
            shared.stats.clone(),
            pages as u32,
        )
        .with_notifier(shared.notifier.clone())
        .with_map_tap(shared.backings.tap());
        let conn = Conn {
            id,
            peer,
            region,
            geo,
            dispatcher,
            track: Mutex::new(Track::default()),
            notify: Mutex::new(NotifyTail {
                tail: 0,
                rec: Vec::with_capacity(region::RECORD),
            }),
            stop: AtomicBool::new(false),
            workers: Mutex::new(Vec::new()),
        };
        Ok((conn, memfd))
    }

    /// Whether handle `m.fh` on `m.node` is this client's to map: opened
    /// through this connection, or held by the description whose memfd
    /// came with the message.
    fn owns(
        &self,
        m: &crate::proto::BackingMsg,
        description: Option<std::os::fd::BorrowedFd<'_>>,
        shared: &Shared,
    ) -> bool {
        if lock(&self.track)
            .handles
            .get(&(m.fh, false))
            .is_some_and(|h| h.node == m.node)
        {
            return true;
        }
        description
            .and_then(Anchors::owner_of)
            .is_some_and(|owner| shared.anchors.holds(owner, m.node, m.fh))
    }

    /// Waits for the workers that [`Conn::halt`] told to end.
    fn join_workers(&self) {
        let workers = std::mem::take(&mut *lock(&self.workers));
        for w in workers {
            let _ = w.join();
        }
    }

    /// Tells the workers to end, waking those asleep.
    fn halt(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for q in 0..self.geo.queues as usize {
            let bell = self.region.u32_at(self.geo.doorbell_off(q));
            bell.store(0, Ordering::SeqCst);
            sys::futex_wake(bell, i32::MAX);
        }
    }

    /// The next slot index published in queue `q` at `head`, if any; an
    /// index outside the queue is consumed and dropped.
    fn take(&self, q: usize, head: &mut u32) -> Option<Option<usize>> {
        let e = self.region.u32_at(self.geo.entry_off(q, *head)).load(Ordering::Acquire);
        let i = region::entry_slot(*head, e)?;
        *head = head.wrapping_add(1);
        Some((i < self.geo.slots).then_some(i as usize))
    }

    fn has_work(&self, q: usize, head: u32) -> bool {
        let e = self.region.u32_at(self.geo.entry_off(q, head)).load(Ordering::SeqCst);
        region::entry_slot(head, e).is_some()
    }

    /// Serves the request in slot `i` of queue `q`.
    fn serve(&self, shared: &Shared, q: usize, i: usize, req: &mut Vec<u8>, reply: &mut Vec<u8>) {
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
    fn complete(&self, q: usize, i: usize, req: &[u8], reply: &mut Vec<u8>) {
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
    fn dispatch(&self, shared: &Shared, req: &[u8], reply: &mut Vec<u8>, pid: u32) {
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
        }
    }

    /// Whether every node `req` names is the root, one this client holds a
    /// lookup of, or one an open file description of its own holds (a
    /// program's descriptions outlive the connection that opened them, see
    /// [`crate::anchors`]). A malformed request passes: the dispatcher
    /// refuses it.
    fn names_given_nodes(&self, shared: &Shared, req: &[u8], h: &abi::fuse_in_header) -> bool {
        let Ok(parsed) = abi::parse(req) else {
            return true;
        };
        let mut nodes = vec![h.nodeid];
        match &parsed.op {
            Operation::Link { arg, .. } => nodes.push(arg.oldnodeid),
            Operation::Rename { arg, .. } => nodes.push(arg.newdir),
            Operation::Rename2 { arg, .. } => nodes.push(arg.newdir),
            Operation::CopyFileRange { arg } => nodes.push(arg.nodeid_out),
            Operation::BatchForget { nodes: list, .. } => nodes.extend(list.iter().map(|f| f.nodeid)),
            _ => {}
        }
        let t = lock(&self.track);
        // 0 names no node (INIT, INTERRUPT).
        nodes.iter().all(|&n| n == 0 || self.given(shared, &t, n))
    }

    /// Whether this client may name `node`: the root (everybody's), one it
    /// holds a lookup of, or one an open file description it anchored or
    /// claimed holds (another client's descriptions are not its own).
    fn given(&self, shared: &Shared, t: &Track, node: u64) -> bool {
        node == abi::FUSE_ROOT_ID
            || t.lookups.contains_key(&node)
            || shared.anchors.holds_node(node, |owner| t.described.contains(&owner))
    }

    /// The kernel node standing for FIFO or device node `node` (see
    /// [`nodes`]), for a client that may name it.
    fn kernel_node(&self, shared: &Shared, node: u64) -> Result<OwnedFd, i32> {
        let given = self.peer.may_name_any_node(shared.owner) || self.given(shared, &lock(&self.track), node);
        if !given {
            return Err(libc::ESTALE);
        }
        let (mut req, mut reply) = (Vec::new(), Vec::new());
        let arg = abi::fuse_getattr_in {
            getattr_flags: 0,
            dummy: 0,
            fh: 0,
        };
        build(&mut req, abi::FUSE_GETATTR, u64::MAX, node, &[arg.as_bytes()]);
        self.handle(shared, &req, &mut reply);
        let (out, body) = abi::fuse_out_header::read_from_prefix(&reply).map_err(|_| libc::EIO)?;
        if out.error != 0 {
            return Err(-out.error);
        }
        let (attr, _) = abi::fuse_attr_out::read_from_prefix(body).map_err(|_| libc::EIO)?;
        shared.nodes.open(node, &attr.attr)
    }

    /// Records handles and lookups handed out to this client, and their
    /// return; returns the process to watch when it got a file handle.
    fn track(&self, r: &abi::Request<'_>, ok: bool, reply: &[u8], pid: u32) -> Option<u32> {
        let body = reply.get(16..).unwrap_or(&[]);
        let entry = || abi::fuse_entry_out::read_from_prefix(body).ok().map(|(e, _)| e);
        let mut t = lock(&self.track);
        match &r.op {
            Operation::Forget { arg } => t.forget(r.header.nodeid, arg.nlookup),
            Operation::BatchForget { nodes, .. } => {
                for f in nodes.iter() {
                    t.forget(f.nodeid, f.nlookup);
                }
            }
            _ if !ok => {}
            Operation::Open { .. } | Operation::Opendir { .. } => {
                if let Ok((o, _)) = abi::fuse_open_out::read_from_prefix(body) {
                    let dir = matches!(r.op, Operation::Opendir { .. });
                    let pid = if dir { 0 } else { pid };
                    t.handles.insert(
                        (o.fh, dir),
                        Handle {
                            node: r.header.nodeid,
                            pid,
                        },
                    );
                    return (!dir).then_some(pid);
                }
            }
            Operation::Create { .. } => {
                if let Some(e) = entry().filter(|e| e.nodeid != 0) {
                    *t.lookups.entry(e.nodeid).or_default() += 1;
                    let rest = body.get(std::mem::size_of::<abi::fuse_entry_out>()..).unwrap_or(&[]);
                    if let Ok((o, _)) = abi::fuse_open_out::read_from_prefix(rest) {
                        t.handles.insert((o.fh, false), Handle { node: e.nodeid, pid });
                        return Some(pid);
                    }
                }
            }
            Operation::Lookup { .. }
            | Operation::Mknod { .. }
            | Operation::Mkdir { .. }
            | Operation::Symlink { .. }
            | Operation::Link { .. } => {
                if let Some(e) = entry().filter(|e| e.nodeid != 0) {
                    *t.lookups.entry(e.nodeid).or_default() += 1;
                }
            }
            _ => {}
        }
        None
    }

    /// Gives back what a departed client held: RELEASE/RELEASEDIR for its
    /// open handles, one BATCH_FORGET for its lookups.
    fn reclaim(&self, shared: &Shared) {
        let t = std::mem::take(&mut *lock(&self.track));
        let mut req = Vec::new();
        let mut reply = Vec::new();
        let mut unique = u64::MAX;
        for ((fh, dir), h) in t.handles {
            self.release_for(shared, &mut req, &mut reply, unique, fh, dir, h.node);
            unique -= 1;
        }
        let forgets: Vec<abi::fuse_forget_one> = t
            .lookups
            .into_iter()
            .map(|(nodeid, n)| abi::fuse_forget_one {
                nodeid,
                nlookup: shared.keep_lookups(nodeid, n),
            })
            .filter(|f| f.nlookup > 0)
            .collect();
        for chunk in forgets.chunks(1024) {
            let arg = abi::fuse_batch_forget_in {
                count: chunk.len() as u32,
                dummy: 0,
            };
            build(
                &mut req,
                abi::FUSE_BATCH_FORGET,
                unique,
                0,
                &[arg.as_bytes(), chunk.as_bytes()],
            );
            unique -= 1;
            self.handle(shared, &req, &mut reply);
        }
    }

    /// RELEASE (or RELEASEDIR) of handle `fh` on `node` on behalf of the
    /// client, which can no longer send it.
    #[allow(clippy::too_many_arguments)]
    fn release_for(
        &self,
        shared: &Shared,
        req: &mut Vec<u8>,
        reply: &mut Vec<u8>,
        unique: u64,
        fh: u64,
        dir: bool,
        node: u64,
    ) {
        let arg = abi::fuse_release_in {
            fh,
            flags: 0,
            release_flags: 0,
            lock_owner: 0,
        };
        let op = if dir { abi::FUSE_RELEASEDIR } else { abi::FUSE_RELEASE };
        build(req, op, unique, node, &[arg.as_bytes()]);
        self.handle(shared, req, reply);
    }

    /// One request to the file system: through the dispatcher, or as bytes
    /// to an unmodified daemon.
    fn handle(&self, shared: &Shared, req: &[u8], reply: &mut Vec<u8>) -> Outcome {
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

    /// Gives back the file handles process `pid` opened through this
    /// connection and never gave to a description (see [`Handle`]).
    fn release_pid(&self, shared: &Shared, pid: u32) {
        let mine: Vec<((u64, bool), Handle)> = {
            let mut t = lock(&self.track);
            let keys: Vec<(u64, bool)> = t
                .handles
                .iter()
                .filter(|(_, h)| h.pid == pid && pid != 0)
                .map(|(k, _)| *k)
                .collect();
            keys.into_iter()
                .filter_map(|k| t.handles.remove(&k).map(|h| (k, h)))
                .collect()
        };
        let (mut req, mut reply) = (Vec::new(), Vec::new());
        for (i, ((fh, dir), h)) in mine.into_iter().enumerate() {
            self.release_for(shared, &mut req, &mut reply, u64::MAX - i as u64, fh, dir, h.node);
        }
    }

    /// Takes a RELEASE or RELEASEDIR out of the client's handles before it
    /// goes to the file system: false (answer it, but do not pass it on)
    /// for a handle the client does not own, or that another process of
    /// the connection opened: one given to a description already (a
    /// forked child closing its copy), or garbage.
    fn releasing(&self, req: &[u8], node: u64, pid: u32, dir: bool) -> bool {
        let body = req.get(std::mem::size_of::<abi::fuse_in_header>()..).unwrap_or(&[]);
        let Ok((arg, _)) = abi::fuse_release_in::read_from_prefix(body) else {
            return false;
        };
        let mut t = lock(&self.track);
        match t.handles.get(&(arg.fh, dir)) {
            Some(h) if h.node == node && (h.pid == 0 || h.pid == pid) => {
                t.handles.remove(&(arg.fh, dir));
                true
            }
            _ => false,
        }
    }

    /// Appends one notification to this client's ring; when the ring is
    /// full (or the message too long) counts an overflow instead, which
    /// makes the client forget its whole cache.
    fn push_notice(&self, origin: u32, notice: Notice<'_>) {
        let g = &self.geo;
        let mut n = lock(&self.notify);
        let NotifyTail { tail, rec } = &mut *n;
        // The head is the client's: if it is garbage, so is its cache.
        let head = self.region.u32_at(g.notify_head_off()).load(Ordering::Acquire);
        if tail.wrapping_sub(head) >= g.records || !encode_record(rec, origin, notice) {
            self.region
                .u32_at(g.notify_overflow_off())
                .fetch_add(1, Ordering::AcqRel);
            return;
        }
        self.region.write(g.record_off(*tail), rec);
        *tail = tail.wrapping_add(1);
        self.region.u32_at(g.notify_tail_off()).store(*tail, Ordering::Release);
    }
}

/// An open handle a connection owns: released when the connection ends,
/// and a file's handle (not yet given to its description, see
/// [`crate::anchors`]) also when the process that opened it ends: the
/// connection is shared by the processes forked from its owner, and the
/// shim gives every description to the daemon before another process can
/// hold it, so until then it is that one process's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Handle {
    node: u64,
    /// The opening process (0 for directories: theirs stay the
    /// connection's, whichever of its processes closes them).
    pid: u32,
}

impl Track {
    fn forget(&mut self, node: u64, n: u64) {
        if let Some(c) = self.lookups.get_mut(&node) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                self.lookups.remove(&node);
            }
        }
    }
}

impl Shared {
    /// Process `pid` of some client ended: its POSIX locks go, and so do the
    /// file handles it opened and kept to itself.
    fn process_ended(&self, pid: u32) {
        self.locks.release_owner(crate::locks::POSIX_OWNER | u64::from(pid));
        let clients: Vec<Arc<Conn>> = lock(&self.clients).clone();
        for c in clients {
            c.release_pid(self, pid);
        }
    }

    /// Tells every client about a change made through connection `from` by
    /// process `pid`. The connection itself is told too, for the processes
    /// forked from its owner that share it: each skips its own changes.
    fn announce(&self, from: u64, pid: u32, notice: Notice<'_>) {
        for c in lock(&self.clients).iter() {
            c.push_notice(if c.id == from { pid } else { 0 }, notice);
        }
    }
}

impl Shared {
    /// Tells the kernel mount of the same daemon, if any, that a client
    /// changed something, so that it drops what it cached. Errors are
    /// ignored: ENOENT means the kernel had nothing cached.
    fn tell_kernel(&self, notice: Notice<'_>) {
        if !self.notifier.has_kernel() {
            return;
        }
        if let Some(n) = notification(notice) {
            let _ = self.notifier.send_to_kernel(&n);
        }
    }
}

/// A ring notice as a FUSE notification (`Notice::All` has none).
fn notification(notice: Notice<'_>) -> Option<Notification<'_>> {
    use std::os::unix::ffi::OsStrExt;
    match notice {
        Notice::Inode(node) => Some(Notification::InvalInode {
            node: NodeId(node),
            offset: 0,
            len: 0,
        }),
        Notice::Entry { parent, name } => Some(Notification::InvalEntry {
            parent: NodeId(parent),
            name: std::ffi::OsStr::from_bytes(name),
        }),
        Notice::All => None,
    }
}

/// The clients of a server as a [`NotifySink`]: what the file system
/// notifies becomes records in every client's notification ring. Weak: the
/// notifier outlives neither the server nor its clients.
struct ClientsSink(std::sync::Weak<Shared>);

impl NotifySink for ClientsSink {
    fn notify(&self, n: &Notification<'_>) {
        use std::os::unix::ffi::OsStrExt;
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let notice = match *n {
            Notification::InvalInode { node, .. } | Notification::Store { node, .. } => Notice::Inode(node.0),
            Notification::InvalEntry { parent, name } | Notification::Delete { parent, name, .. } => Notice::Entry {
                parent: parent.0,
                name: name.as_bytes(),
            },
            // Only the kernel has pages to hand back or poll waiters.
            Notification::Retrieve { .. } | Notification::PollWakeup { .. } => return,
        };
        for c in lock(&shared.clients).iter() {
            c.push_notice(0, notice);
        }
    }
}

/// Opcodes whose requests change what clients hold or cache.
fn tracked(opcode: u32) -> bool {
    matches!(
        opcode,
        abi::FUSE_LOOKUP
            | abi::FUSE_FORGET
            | abi::FUSE_BATCH_FORGET
            | abi::FUSE_OPEN
            | abi::FUSE_OPENDIR
            | abi::FUSE_CREATE
            | abi::FUSE_MKNOD
            | abi::FUSE_MKDIR
            | abi::FUSE_SYMLINK
            | abi::FUSE_LINK
            | abi::FUSE_UNLINK
            | abi::FUSE_RMDIR
            | abi::FUSE_RENAME
            | abi::FUSE_RENAME2
            | abi::FUSE_SETATTR
            | abi::FUSE_WRITE
            | abi::FUSE_FALLOCATE
            | abi::FUSE_SETXATTR
            | abi::FUSE_REMOVEXATTR
            | abi::FUSE_COPY_FILE_RANGE
    )
}

/// The invalidations a successful request calls for in other clients:
/// what each request changes, said once for the rings' requests (the
/// server's) and for a kernel mount's beside them ([`crate::Announcing`]).
pub fn changes(r: &abi::Request<'_>, mut f: impl FnMut(Notice<'_>)) {
    use std::os::unix::ffi::OsStrExt;
    let node = r.header.nodeid;
    match &r.op {
        Operation::Setattr { .. }
        | Operation::Write { .. }
        | Operation::Fallocate { .. }
        | Operation::Setxattr { .. }
        | Operation::Removexattr { .. } => f(Notice::Inode(node)),
        Operation::CopyFileRange { arg } => f(Notice::Inode(arg.nodeid_out)),
        // With `FUSE_ATOMIC_O_TRUNC` the open itself empties the file.
        Operation::Open { arg } if arg.flags as i32 & libc::O_TRUNC != 0 => f(Notice::Inode(node)),
        Operation::Create { name, .. }
        | Operation::Mknod { name, .. }
        | Operation::Mkdir { name, .. }
        | Operation::Symlink { name, .. }
        | Operation::Unlink { name }
        | Operation::Rmdir { name } => f(Notice::Entry {
            parent: node,
            name: name.as_bytes(),
        }),
        Operation::Link { arg, name } => {
            f(Notice::Inode(arg.oldnodeid));
            f(Notice::Entry {
                parent: node,
                name: name.as_bytes(),
            });
        }
        Operation::Rename {
            arg: abi::fuse_rename_in { newdir },
            name,
            new_name,
        }
        | Operation::Rename2 {
            arg: abi::fuse_rename2_in { newdir, .. },
            name,
            new_name,
        } => {
            f(Notice::Entry {
                parent: node,
                name: name.as_bytes(),
            });
            f(Notice::Entry {
                parent: *newdir,
                name: new_name.as_bytes(),
            });
        }
        _ => {}
    }
}

/// Appends the [`crate::proto::SourceDir`] of `dir` to a welcome, when
/// the daemon can name and stat it.
fn source_dir(welcome: &mut Vec<u8>, dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(abs) = std::fs::canonicalize(dir) else { return };
    let Ok(md) = std::fs::metadata(&abs) else { return };
    let path = abs.as_os_str().as_encoded_bytes();
    let head = crate::proto::SourceDir {
        magic: crate::proto::SOURCE_MAGIC,
        dev: md.dev(),
        ino: md.ino(),
        len: path.len() as u32,
        padding: 0,
    };
    welcome.extend_from_slice(head.as_bytes());
    welcome.extend_from_slice(path);
}

pub(crate) fn error_reply(reply: &mut Vec<u8>, unique: u64, errno: i32) {
    reply.clear();
    let h = abi::fuse_out_header {
        len: 16,
        error: -errno,
        unique,
    };
    reply.extend_from_slice(h.as_bytes());
}

/// Encodes a request the daemon makes on a departed client's behalf.
pub(crate) fn build(req: &mut Vec<u8>, opcode: u32, unique: u64, nodeid: u64, parts: &[&[u8]]) {
    req.clear();
    let len = std::mem::size_of::<abi::fuse_in_header>() + parts.iter().map(|p| p.len()).sum::<usize>();
    let h = abi::fuse_in_header {
        len: len as u32,
        opcode,
        unique,
        nodeid,
        uid: 0,
        gid: 0,
        pid: 0,
        total_extlen: 0,
        padding: 0,
    };
    req.extend_from_slice(h.as_bytes());
    for p in parts {
        req.extend_from_slice(p);
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
struct Holes {
    positions: Vec<u32>,
    /// Since when `head` has been empty with later positions reserved.
    since: Option<Instant>,
}

impl Holes {
    /// After a sleep that found nothing at `head`: goes past it once it
    /// has stayed empty for [`HOLE_SKIP`] while `tail` is beyond it.
    fn look(&mut self, head: &mut u32, tail: u32, slots: u32) {
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
    fn take(&mut self, conn: &Conn, q: usize) -> Option<Option<usize>> {
        let k = self.positions.iter().position(|p| conn.has_work(q, *p))?;
        let mut p = self.positions.swap_remove(k);
        conn.take(q, &mut p)
    }

    fn any(&self, conn: &Conn, q: usize) -> bool {
        self.positions.iter().any(|p| conn.has_work(q, *p))
    }
}

/// One queue's worker: take, serve, and when the queue stays empty for the
/// spin budget, sleep on the queue's doorbell until a client rings it.
fn worker(shared: &Shared, conn: &Conn, q: usize) {
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
