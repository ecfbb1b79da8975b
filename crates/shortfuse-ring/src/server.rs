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
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use shortfuse::{Dispatcher, Filesystem, MountOptions, Notifier, Stats};
use shortfuse_abi::{self as abi};
use zerocopy::{FromBytes, IntoBytes};

use crate::anchors::Anchors;
use crate::client::Notice;
use crate::foreign::{DirectClient, Forward, ForwardFs};
use crate::locks::{Locks, Reaper};
use crate::proto::{
    AnchorAck, AnchorMsg, EarlyMsg, Hello, NamesMsg, Welcome, ANCHOR_MAGIC, CLAIM_MAGIC, EARLY_MAGIC, NAMES_MAGIC,
};
use crate::region::{self, header, Geometry, Region, DAEMON_ALIVE, DAEMON_GONE, EMPTY};
use crate::sys;

mod backings;
mod caller;
mod direct;
mod entries;
mod listings;
mod nodes;
mod notices;
mod ownership;
mod track;
mod watches;
mod worker;

use backings::Backings;
use entries::Entries;
use nodes::Nodes;
use watches::Watches;

use caller::{Acting, Peer, Who};
use ownership::{Locked, Parked};

pub use direct::DirectJob;
use direct::{jobs, relay, run, Jobs};
pub use notices::changes;
use notices::ClientsSink;
use track::{Handle, Track};
use worker::worker;

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
    /// Some client asked for a lock (see [`header::LOCKS`]).
    locks_asked: AtomicBool,
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
    /// The kernel objects standing for watched nodes (inotify).
    watches: Watches,
    /// Names and attributes an unmodified daemon gave, kept across
    /// programs for its timeouts (see `entries`).
    entries: Entries,
    /// The listings being gathered to share (see `listings`).
    listing_parts: listings::Gathering,
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
    /// What the daemon left to the server, for a client it serves directly.
    jobs: Jobs,
    /// The daemon serves this client directly: what it hands out reaches
    /// `track` a moment after the client has it.
    direct: AtomicBool,
    /// Told when the job thread has added to `track`.
    tracked: std::sync::Condvar,
}

struct NotifyTail {
    tail: u32,
    rec: Vec<u8>,
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
        let owner = sys::geteuid();
        let nodes = Nodes::new(path, owner == 0);
        // Only for an unmodified daemon: our own file systems list with
        // their nodes (READDIRPLUS), and the kernel keeps their names.
        let keep = std::env::var_os(crate::foreign::KEEP_VAR).is_none_or(|v| v != "0");
        let share = std::env::var_os(crate::foreign::SHARE_VAR).is_none_or(|v| v != "0");
        let entries = Entries::new(forward.is_some() && keep, share);
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
            locks_asked: AtomicBool::new(false),
            reaper: Reaper::new()?,
            parked: Mutex::new(Vec::new()),
            retrying: AtomicBool::new(false),
            retry_again: AtomicBool::new(false),
            notifier: notifier.clone(),
            backings: Arc::default(),
            watches: Watches::new(nodes.dir().map(Path::to_path_buf)),
            nodes,
            entries,
            listing_parts: Default::default(),
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
        if shared.entries.enabled() {
            // Not joined: it holds the server weakly and ends with it.
            let s = Arc::downgrade(&shared);
            thread::Builder::new()
                .name("sf-ring-entries".into())
                .spawn(move || entries::expiry(s))?;
        }
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
        self.shared.watches.clear();
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

    /// Replays a change the kernel mount made (answered with `reply`) on
    /// the mirrors of watched nodes (see `watches`).
    pub fn mirror(&self, r: &abi::Request<'_>, reply: &[u8]) {
        self.0.watches.apply(r, reply);
    }

    /// The server's request counters.
    pub fn stats(&self) -> &Stats {
        &self.0.stats
    }

    /// Work the daemon left for direct client `id` (gone: dropped): true
    /// when it was done here and then, on the caller's thread (the
    /// daemon's reader), rather than queued for the client's job thread.
    pub fn direct_job(&self, id: u64, job: DirectJob) -> bool {
        let conn = lock(&self.0.clients).iter().find(|c| c.id == id).cloned();
        let Some(c) = conn else {
            return false;
        };
        let Some(job) = c.jobs.push_or_take(job) else {
            return false;
        };
        run(&self.0, &c, job, &mut Vec::new(), &mut Vec::new());
        c.jobs.ran();
        true
    }

    pub fn notify_all(&self, notice: Notice<'_>) {
        self.0.entries.invalidate(notice, std::time::Instant::now());
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
    // Room for the longest message: a watch with a name of NAME_MAX bytes.
    let mut buf = [0u8; 512];
    // The hello, and the requests that came with it (see `EarlyMsg`).
    let mut hello = vec![0u8; crate::proto::EARLY_ROOM];
    let hello = match sys::recv(sock.as_fd(), &mut hello) {
        Ok((n, _)) => Hello::read_from_prefix(&hello[..n])
            .ok()
            .filter(|(h, _)| h.magic == region::MAGIC && h.version == region::VERSION)
            .map(|(h, rest)| (h.pid, rest.to_vec())),
        Err(_) => None,
    };
    let Some((pid, early)) = hello else {
        let _ = sys::send(
            sock.as_fd(),
            b"error: not a shortfuse ring hello (version mismatch?)",
            None,
        );
        return;
    };
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
            let answers = early_answers(&shared, &conn, pid, &early);
            // The names the server keeps, to read from (see `name_table`):
            // to a client that may name any node, as the daemon's own
            // user, and that the server does not act for.
            let table = shared
                .entries
                .table()
                .filter(|_| !shared.config.impersonate && conn.peer.may_name_any_node(owner));
            if let Err(e) = sys::send(sock.as_fd(), &answers, table) {
                tracing::warn!("shortfuse ring: handshake: {e}");
                return;
            }
            (Arc::new(conn), memfd)
        }
        Err(e) => {
            let _ = sys::send(sock.as_fd(), format!("error: {e}").as_bytes(), None);
            return;
        }
    };
    let (conn, conn_memfd) = conn;
    lock(&shared.clients).push(conn.clone());
    // After the listing: a first lock asked meanwhile either finds this
    // client listed or is seen here.
    if shared.locks_asked.load(Ordering::SeqCst) {
        conn.region.u32_at(header::LOCKS).store(1, Ordering::Release);
    }
    // `stop` halts the clients it finds listed; one listed too late for
    // it is halted here (its workers then end before serving anything).
    if shared.stopping.load(Ordering::SeqCst) {
        conn.halt();
    }
    // The daemon takes the requests itself only of a client that may name
    // any node (others are checked node by node, here) and where this
    // server does not act as the caller.
    let direct = !shared.config.impersonate
        && conn.peer.may_name_any_node(owner)
        && shared.forward.as_ref().is_some_and(|f| {
            let client = DirectClient {
                id: conn.id,
                queues: shared.geo.queues,
                slots: shared.geo.slots,
                slot_data: shared.geo.slot_data,
                records: shared.geo.records,
                uid: conn.peer.uid(),
                gid: conn.peer.gid(),
                root: u32::from(conn.peer.is_root()),
                owner,
                allow_other: u32::from(shared.opts.allow_other),
                readdirplus: 0,
            };
            f.direct(&client, conn_memfd.as_fd())
        });
    drop(conn_memfd);
    conn.direct.store(direct, Ordering::SeqCst);
    if direct {
        let c = conn.clone();
        let s = shared.clone();
        match thread::Builder::new()
            .name(format!("sf-ring-c{}jobs", conn.id))
            .spawn(move || jobs(&s, &c))
        {
            Ok(h) => lock(&conn.workers).push(h),
            Err(e) => tracing::warn!("shortfuse ring: cannot start a worker: {e}"),
        }
    }
    for q in 0..shared.geo.queues as usize {
        let c = conn.clone();
        let s = shared.clone();
        match thread::Builder::new()
            .name(format!("sf-ring-c{}q{q}", conn.id))
            .spawn(move || if direct { relay(&s, &c, q) } else { worker(&s, &c, q) })
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
                    shared.backings.answer(sock.as_fd(), &m, owns, &*shared.fs);
                    continue;
                }
                if let Some(m) = Nodes::parse(&buf[..n]) {
                    Nodes::answer(sock.as_fd(), &m, conn.kernel_node(&shared, m.node));
                    continue;
                }
                if let Some((m, name)) = Watches::parse(&buf[..n]) {
                    Watches::answer(sock.as_fd(), &m, conn.watch_node(&shared, &m, name));
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
    if direct {
        if let Some(f) = &shared.forward {
            f.direct_gone(conn.id);
        }
    }
    conn.halt();
    conn.join_workers();
    lock(&shared.clients).retain(|c| c.id != conn.id);
    lock(&shared.parked).retain(|p| p.conn != conn.id);
    conn.reclaim(&shared);
}

/// The [`EarlyMsg`] answering the requests that came with a client's hello:
/// those a process makes as its mount is set up (INIT, GETATTR), served here
/// with every check a queue worker makes, before the workers have started.
/// Any other request is left for the rings.
fn early_answers(shared: &Shared, conn: &Conn, pid: u32, requests: &[u8]) -> Vec<u8> {
    let mut replies = Vec::new();
    let mut count = 0u32;
    let mut reply = Vec::new();
    for req in crate::proto::fuse_messages(requests) {
        let early = abi::parse_header(req).is_ok_and(|h| matches!(h.opcode, abi::FUSE_INIT | abi::FUSE_GETATTR));
        if !early {
            break;
        }
        reply.clear();
        conn.dispatch(shared, req, &mut reply, pid);
        if reply.is_empty() || replies.len() + reply.len() > crate::proto::EARLY_ROOM {
            break;
        }
        replies.extend_from_slice(&reply);
        count += 1;
    }
    let mut msg = EarlyMsg {
        magic: EARLY_MAGIC,
        count,
        padding: 0,
    }
    .as_bytes()
    .to_vec();
    msg.extend_from_slice(&replies);
    msg
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
            jobs: Jobs::default(),
            direct: AtomicBool::new(false),
            tracked: std::sync::Condvar::new(),
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
        if self
            .track_with(|t| t.handles.get(&(m.fh, false)).is_some_and(|h| h.node == m.node))
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
        self.jobs.wake();
        for q in 0..self.geo.queues as usize {
            let bell = self.region.u32_at(self.geo.doorbell_off(q));
            bell.store(0, Ordering::SeqCst);
            sys::futex_wake(bell, i32::MAX);
        }
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

/// Encodes as few BATCH_FORGETs as carry `forgets` (the kernel's own limit
/// of entries per request), numbered down from `unique`, and hands each to
/// `send`.
pub(crate) fn build_forgets(
    req: &mut Vec<u8>,
    mut unique: u64,
    forgets: &[abi::fuse_forget_one],
    mut send: impl FnMut(&[u8]),
) {
    for chunk in forgets.chunks(1024) {
        let arg = abi::fuse_batch_forget_in {
            count: chunk.len() as u32,
            dummy: 0,
        };
        build(
            req,
            abi::FUSE_BATCH_FORGET,
            unique,
            0,
            &[arg.as_bytes(), chunk.as_bytes()],
        );
        unique = unique.wrapping_sub(1);
        send(req);
    }
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
