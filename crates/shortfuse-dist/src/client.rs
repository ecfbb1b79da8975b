//! The distfs client: a [`Filesystem`] over the server, with a write-back
//! block cache in the daemon kept coherent by per-file leases.
//!
//! # Leases and the cache (DistFUSE, Algorithm 1)
//!
//! Each file has a lease slot behind an `RwLock`. Reads and writes take it
//! shared and check that the lease suffices (a read lease for reads, the
//! write lease for writes and size changes); if it does not, they take it
//! exclusive and acquire the lease from the manager (a read lease is
//! released first when upgrading, as Algorithm 1 does, so that two readers
//! upgrading at once cannot wait for each other). A revocation takes the
//! slot exclusive, which blocks new I/O on the file and waits for running
//! I/O, then writes the dirty blocks back and releases.
//! Cached blocks are trusted only under a lease: a new lease starts from
//! the size the metadata service holds and from the blocks cached under
//! the last one minus those the grant says changed since (see
//! [`crate::versions`]); a cache whose version is unknown is emptied.
//!
//! Writes stay in the cache until the lease is revoked, the file is
//! fsync'd, too many blocks are dirty, or the file system is unmounted.
//! Data and size go to the server in batches (one request for many blocks).
//! `close(2)` does not write back: that is the point of leases; a client
//! that dies loses what it did not fsync, and nothing else.
//!
//! # Contention
//!
//! When clients take turns on a file, each turn costs a revocation (the
//! holder writes back and releases), a grant and the blocks the new
//! holder needs. What keeps that cost down:
//! - the blocks the I/O that asked for the lease will touch come with the
//!   grant (one round trip less), unless they are cached here and nobody
//!   changed them since;
//! - the cache outlives the lease: written back, it stays, and the next
//!   grant names the blocks others wrote meanwhile, which are dropped (a
//!   client that takes turns with others on a file keeps what they did not
//!   touch);
//! - the manager's state is appended to its file, not rewritten;
//! - a writer revoked for a reader steps down to a read lease
//!   ([`crate::proto::ServerMsg::StepDown`]): it writes back and keeps
//!   its cache, which is clean then, so its next reads need no lease and
//!   no data from the server;
//! - a revoked lease is kept until it served the I/O that asked for it,
//!   so that a lease that moves always does some work (no livelock), and
//!   then for as long as this client goes on using it without a pause of
//!   `lease_hold / 20`, at most [`ClientConfig::lease_hold`] after the
//!   grant (`-o lease_hold=MS`), against ping-pong between clients that
//!   both work on the file: the holder's I/O goes on meanwhile, the
//!   requester waits. A holder that paused gives the lease back at once:
//!   holding a lease nobody uses only makes the requester wait.
//!
//! - a file whose leases keep moving goes *direct* (`lease` mode only):
//!   when a caching lease is revoked within [`CONTENDED_WITHIN`] of its
//!   grant, it did not pay for its move, and this client asks for a
//!   [`LeaseMode::Direct`] lease on the file for
//!   [`ClientConfig::direct_spell`] (`-o direct_spell=MS`), as CephFS's
//!   clients do I/O synchronously when their capabilities conflict. Any
//!   number of clients hold direct leases on a file at once; none caches
//!   anything of it: each read and write is one round trip to the server
//!   ([`crate::proto::Request::ReadDirect`], `WriteDirect`), which makes
//!   each one step (it merges partly written blocks itself, and a write
//!   only ever extends the size), and the server's size and mtime are the
//!   file's. One round trip per access is what `writethrough` pays per
//!   write, against a lease move of a few of them per access when leases
//!   ping-pong. At the end of the spell a caching lease is asked again (a
//!   probe): the direct holders are revoked, and one still using the file
//!   (within [`CONTENDED_WITHIN`]) starts a new spell and asks for a
//!   direct lease again, which revokes the prober's lease soon after its
//!   grant, so the prober goes direct too; a file no longer shared stays
//!   cached. A client alone on a file is never revoked and so never goes
//!   direct.
//!
//! None of this weakens the guarantee: the grant still waits for the
//! holder's write-back, a stepped-down holder can no longer write, and a
//! direct lease is granted only once every caching holder wrote back.
//!
//! # Consistency modes
//!
//! One binary, three modes per mount ([`Consistency`]), so that the
//! trade-off is measured rather than claimed:
//! - `lease` (default): the above;
//! - `writethrough`: the same leases, but every write goes to storage
//!   before it is answered (DistFUSE's baseline, and what ceph-fuse does):
//!   strong, and each write pays a round trip;
//! - `weak`: write-back without leases, like GlusterFS's write-behind or
//!   JuiceFS: dirty blocks go to storage on close, fsync, cache pressure or
//!   when the file's cache expires ([`WEAK_CACHE_TTL`] after it was filled),
//!   and cached blocks are trusted until then. Other clients may read stale
//!   data; the consistency checker ([`crate::check`]) shows it.
//!
//! # Reconnection
//!
//! A lost connection is reopened, from a background thread while this
//! client holds leases, and the new connection resumes the lease session
//! (see [`crate::lease`]): a server restart or a short network cut costs no
//! lease and no cached data as long as the session is resumed within the
//! TTL.
//!
//! # Open files
//!
//! The server learns which files this client holds open (at the first
//! open here and the last close, however many the kernel has), so that a
//! file removed by any client stays readable and writable through the
//! opens until the last one closes (see [`crate::server`]). A client that
//! reconnects tells its open files again.
//!
//! # Kernel page cache
//!
//! The kernel knows nothing about leases, so its page cache could serve a
//! stale page after this client lost its lease. Files are therefore opened
//! with `FOPEN_DIRECT_IO` (configurable): every read and write reaches the
//! daemon, whose cache the leases protect, and the daemon's cache plays the
//! part that the kernel page cache plays in DistFUSE's modified kernel.
//!
//! # Lock order
//!
//! `Inner::conn` and `Inner::files` are leaf locks held for a lookup only,
//! but for `Inner::conn` while a new session starts: it takes the files'
//! `opens` then, so nothing asks for a connection while holding `opens`.
//! Per file: the lease slot, then the block cache; never two files at once.

use shortfuse::sync::lock;
use shortfuse::sync::Unpoison;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, Weak};
use std::time::{Duration, Instant};

use shortfuse::{
    Attr, Created, DirSink, Entry, Errno, FileHandle, FileType, Filesystem, InitConfig, NewNode, NodeId, OpenFlags,
    Opened, ReleaseArgs, RenameFlags, Request, Result, SetAttr, SetTime, Statfs, Timestamp, WriteArgs,
};

use crate::conn::{Conn, Event};
use crate::proto::{
    AttrChange, ByteBuf, ClientId, DataVersion, Gfi, LeaseMode, NewKind, NodeAttr, NodeInfo, Reply, Request as Req,
    WireTime, MAX_DIRECT, NO_LEASE,
};

/// Blocks fetched past a read miss that continues the previous read, when
/// the file has them (random reads fetch what they need only: after a
/// lease moves, a large read-ahead would cost every contended access).
const READAHEAD: u64 = 8;
/// Dirty blocks per file before a write writes back.
const DIRTY_MAX: usize = 256;
/// Cached blocks per file before clean ones are dropped.
const CACHED_MAX: usize = 1024;
/// Bytes of block data per write-back request.
const BATCH_BYTES: usize = 8 << 20;

/// See [`ClientConfig::lease_hold`].
pub const DEFAULT_LEASE_HOLD: Duration = Duration::from_millis(2);

/// See [`ClientConfig::direct_spell`]: long enough that the probes that
/// end a spell (a caching lease asked again, which costs a lease move or
/// two while the file is still contended) are rare, short enough that a
/// file whose contention ended is cached again soon.
pub const DEFAULT_DIRECT_SPELL: Duration = Duration::from_millis(500);

/// A lease revoked sooner than this after its grant did not pay for its
/// move (see the module docs, "Contention"): a move costs one to two
/// milliseconds here (revocation, write-back, grant), a direct I/O one
/// round trip (about a tenth of that), so a lease must serve many cached
/// I/Os to be worth its move, which takes longer than this once moves
/// come this close together. Well above [`DEFAULT_LEASE_HOLD`], which
/// bounds how long a contended lease stays.
pub const CONTENDED_WITHIN: Duration = Duration::from_millis(20);

/// Longest `-o direct_spell=MS`.
const DIRECT_SPELL_MAX_MS: f64 = 60_000.0;

/// How long a `weak` client trusts a file's cache (JuiceFS's default).
pub const WEAK_CACHE_TTL: Duration = Duration::from_secs(1);

/// What a client promises about what others read (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Consistency {
    #[default]
    Lease,
    WriteThrough,
    Weak,
}

impl Consistency {
    pub const ALL: [Consistency; 3] = [Consistency::Lease, Consistency::WriteThrough, Consistency::Weak];

    pub fn name(self) -> &'static str {
        match self {
            Consistency::Lease => "lease",
            Consistency::WriteThrough => "writethrough",
            Consistency::Weak => "weak",
        }
    }
}

impl std::str::FromStr for Consistency {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Consistency, String> {
        Consistency::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("consistency {s:?}: choose lease, writethrough or weak"))
    }
}

/// How long a call waits for an unreachable server (down, restarting)
/// before it fails with `ENOTCONN`.
pub const RECONNECT_WAIT: Duration = Duration::from_secs(10);

/// How a client is set up.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port` of the server.
    pub addr: String,
    /// Shown in the server's diagnostics.
    pub name: String,
    /// Open files with `FOPEN_DIRECT_IO` (see the module docs).
    pub direct_io: bool,
    pub consistency: Consistency,
    /// A revoked lease that is in use here is given back no later than
    /// this after it was granted (see the module docs, "Contention").
    pub lease_hold: Duration,
    /// `lease` mode: how long a file found contended is accessed under
    /// direct leases before a caching lease is tried again (see the module
    /// docs, "Contention"); zero: never direct.
    pub direct_spell: Duration,
}

impl ClientConfig {
    pub fn new(addr: impl Into<String>) -> ClientConfig {
        ClientConfig {
            addr: addr.into(),
            name: format!("pid {}", std::process::id()),
            direct_io: true,
            consistency: Consistency::Lease,
            lease_hold: DEFAULT_LEASE_HOLD,
            direct_spell: DEFAULT_DIRECT_SPELL,
        }
    }

    /// A client of `addr` set up by `shortfuse mount dist`'s own `-o`
    /// options: `consistency=lease|writethrough|weak`, `lease_hold=MS`,
    /// `direct_spell=MS`.
    pub fn from_options(addr: impl Into<String>, opts: &[(String, Option<String>)]) -> std::io::Result<ClientConfig> {
        let mut cfg = ClientConfig::new(addr);
        for (k, v) in opts {
            let bad = |msg: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, msg);
            match (k.as_str(), v) {
                ("consistency", Some(v)) => cfg.consistency = v.parse().map_err(|e| bad(format!("-o {e}")))?,
                ("lease_hold", Some(v)) => {
                    let ms: f64 = v
                        .parse()
                        .ok()
                        .filter(|ms: &f64| (0.0..=1000.0).contains(ms))
                        .ok_or_else(|| bad(format!("-o lease_hold={v}: milliseconds from 0 to 1000")))?;
                    cfg.lease_hold = Duration::from_secs_f64(ms / 1000.0);
                }
                ("direct_spell", Some(v)) => {
                    let ms: f64 = v
                        .parse()
                        .ok()
                        .filter(|ms: &f64| (0.0..=DIRECT_SPELL_MAX_MS).contains(ms))
                        .ok_or_else(|| {
                            bad(format!(
                                "-o direct_spell={v}: milliseconds from 0 (never direct) to {DIRECT_SPELL_MAX_MS}"
                            ))
                        })?;
                    cfg.direct_spell = Duration::from_secs_f64(ms / 1000.0);
                }
                _ => {
                    return Err(bad(format!(
                    "-o {k}{}: unknown option (neither a mount option nor dist's consistency=lease|writethrough|weak, lease_hold=MS or direct_spell=MS)",
                    v.as_ref().map(|v| format!("={v}")).unwrap_or_default()
                )))
                }
            }
        }
        Ok(cfg)
    }
}

/// Where a write lands.
#[derive(Clone, Copy)]
enum At {
    Offset(u64),
    /// The end of the file (O_APPEND), as found in the same step as the
    /// write: under the write lease, or at the server for a direct one,
    /// so that no other client's write comes between.
    End,
}

impl At {
    fn offset(self) -> Option<u64> {
        match self {
            At::Offset(o) => Some(o),
            At::End => None,
        }
    }
}

/// What one read of the cache or the server gave.
struct ReadOut {
    len: usize,
    /// The read reached the end of the file: nothing more to ask.
    eof: bool,
}

/// What a write-back does with the lease after the data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    Keep,
    Release,
    StepDown,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    mode: Option<LeaseMode>,
    id: u64,
    /// The lease session the lease belongs to (`ClientId.0`).
    session: u64,
    /// When it was granted.
    granted: Option<Instant>,
    /// `weak` only: when the cache was filled.
    since: Option<Instant>,
}

struct Block {
    /// The block's bytes up to its last written one; the rest reads as zeros.
    data: Vec<u8>,
    dirty: bool,
}

#[derive(Default)]
struct Cache {
    blocks: HashMap<u64, Block>,
    /// Valid under a lease: the server's size at grant, then this client's.
    size: u64,
    mtime: (i64, u32),
    /// Size or mtime changed here and not yet on the server.
    meta_dirty: bool,
    /// Blocks written to the server since the last fsync, under this
    /// lease or an earlier one.
    unsynced: BTreeSet<u64>,
    /// Dirty data was lost (lease lost or write-back failed); the next
    /// flush/fsync reports EIO once.
    lost: bool,
    /// The block after the last one read: a read starting there is
    /// sequential.
    next_read: u64,
    /// The data version the clean blocks are valid as of (see
    /// [`crate::versions`]): they stay cached when the lease goes, and
    /// the next grant says which of them changed meanwhile. `None`: the
    /// next grant drops them all.
    known: Option<DataVersion>,
}

impl Cache {
    fn dirty_count(&self) -> usize {
        self.blocks.values().filter(|b| b.dirty).count()
    }

    fn clear(&mut self) {
        if self.meta_dirty || self.blocks.values().any(|b| b.dirty) {
            self.lost = true;
        }
        self.blocks.clear();
        self.meta_dirty = false;
        self.known = None;
    }

    /// After the lease went with everything written back: the blocks
    /// stay, clean, for the next grant to validate. (`unsynced` stays
    /// too: the next fsync must make them durable, lease or not.)
    fn keep(&mut self) {
        debug_assert!(!self.meta_dirty && self.blocks.values().all(|b| !b.dirty));
    }

    fn evict_clean(&mut self) {
        if self.blocks.len() > CACHED_MAX {
            let excess = self.blocks.len() - CACHED_MAX / 2;
            let clean: Vec<u64> = self
                .blocks
                .iter()
                .filter(|(_, b)| !b.dirty)
                .map(|(i, _)| *i)
                .take(excess)
                .collect();
            for i in clean {
                self.blocks.remove(&i);
            }
        }
    }
}

struct FileState {
    gfi: Gfi,
    /// `S_IF*` bits: only regular files carry data under leases.
    kind: u32,
    lease: RwLock<Slot>,
    cache: Mutex<Cache>,
    /// Opens of this file here (the kernel's, not yet released).
    opens: Mutex<u32>,
    /// When the last I/O under a lease ended here, in nanoseconds since
    /// [`Inner::epoch`] (0: never): a revocation waits for the lease to be
    /// used once and then for a pause in its use.
    used: AtomicU64,
    /// Until when this file is accessed under direct leases, in
    /// nanoseconds since [`Inner::epoch`] (0: not contended); see the
    /// module docs, "Contention".
    direct_until: AtomicU64,
}

struct Inner {
    cfg: ClientConfig,
    conn: Mutex<Option<Arc<Conn>>>,
    generation: AtomicU64,
    /// The last lease session, resumed by the next connection.
    session: AtomicU64,
    /// A reconnecting thread is running.
    reconnecting: std::sync::atomic::AtomicBool,
    /// Block size of the server, fixed by the first connection.
    block_size: AtomicU32,
    files: Mutex<HashMap<u64, Arc<FileState>>>,
    /// Handed to each connection's reader so revocations find the files.
    me: Weak<Inner>,
    /// The threads that run revocations.
    revokers: Arc<Revokers>,
    /// Origin of [`FileState::used`].
    epoch: Instant,
    /// What `shortfuse stats` shows of the leases.
    figures: Arc<LeaseFigures>,
}

/// Counts of this client's lease work, for `shortfuse stats` and
/// `-o metrics` (group `lease`).
#[derive(Default)]
struct LeaseFigures {
    granted_read: AtomicU64,
    granted_write: AtomicU64,
    granted_direct: AtomicU64,
    revocations: AtomicU64,
    step_downs: AtomicU64,
    revocation_write_backs: AtomicU64,
    direct_spells: AtomicU64,
    reconnections: AtomicU64,
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

/// How long an idle revocation thread waits for more work before it ends.
const REVOKER_IDLE: Duration = Duration::from_secs(5);

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run revocations, which wait for running I/O and for the
/// server and so never run on the connection's reader. Idle threads are
/// reused, so a lease that moves costs no thread start; another starts
/// when all are busy, so that a revocation held back (see
/// [`Inner::hold`]) never delays the next one.
#[derive(Default)]
struct Revokers {
    /// Jobs not yet taken, and how many threads wait for one.
    queue: Mutex<(VecDeque<Job>, usize)>,
    wake: Condvar,
}

impl Revokers {
    fn run(self: &Arc<Self>, job: Job) -> std::io::Result<()> {
        let mut q = lock(&self.queue);
        q.0.push_back(job);
        // A waiting thread leaves the count when it wakes: as many waiting
        // as queued jobs means each will be taken.
        if q.1 >= q.0.len() {
            drop(q);
            self.wake.notify_one();
            return Ok(());
        }
        drop(q);
        let me = self.clone();
        std::thread::Builder::new()
            .name("distfs-revoke".into())
            .spawn(move || me.work())
            .map(|_| ())
    }

    fn work(&self) {
        let mut q = lock(&self.queue);
        loop {
            if let Some(job) = q.0.pop_front() {
                drop(q);
                job();
                q = lock(&self.queue);
                continue;
            }
            q.1 += 1;
            let (g, wait) = self.wake.wait_timeout(q, REVOKER_IDLE).unpoison();
            q = g;
            q.1 -= 1;
            if wait.timed_out() && q.0.is_empty() {
                return;
            }
        }
    }
}

/// The distfs client file system.
pub struct DistFs {
    inner: Arc<Inner>,
    /// Each open directory's listing, taken when it is read from the start:
    /// offsets index it, so that names removed meanwhile (by this or
    /// another client) do not shift the rest past the reader.
    listings: Mutex<HashMap<u64, Arc<Vec<crate::proto::DirEntryInfo>>>>,
    next_dir: AtomicU64,
}

fn to_ts((sec, nsec): (i64, u32)) -> Timestamp {
    Timestamp { sec, nsec }
}

fn to_attr(ino: u64, a: &NodeAttr, block_size: u32) -> Attr {
    Attr {
        ino,
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: to_ts(a.atime),
        mtime: to_ts(a.mtime),
        ctime: to_ts(a.ctime),
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: block_size,
    }
}

fn node_reply(r: Reply) -> Result<NodeInfo> {
    match r {
        Reply::Node(n) => Ok(n),
        _ => Err(Errno::EPROTO),
    }
}

/// A short count, or `EAGAIN` when nothing was done: the caller goes on.
/// A name as the server takes it; longer than a directory entry can be is
/// ENAMETOOLONG, as on a local file system (not ENOENT from the server).
fn name_bytes(name: &OsStr) -> Result<Vec<u8>> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(name.as_bytes().to_vec())
}

const NAME_MAX: usize = 255;

fn partial(done: u64) -> Result<usize> {
    if done == 0 {
        Err(Errno::EAGAIN)
    } else {
        Ok(done as usize)
    }
}

fn wire_time(t: SetTime) -> WireTime {
    match t {
        SetTime::Now => WireTime::Now,
        SetTime::At(t) => WireTime::At(t.sec, t.nsec),
    }
}

impl DistFs {
    /// A client that connects on first use (so that a daemon may fork after
    /// building it). Checks now that the server answers.
    pub fn new(cfg: ClientConfig) -> std::io::Result<DistFs> {
        let fs = DistFs::unconnected(cfg);
        let probe = Conn::open(&fs.inner.cfg.addr, "probe", 0, None, Box::new(|_| {}))?;
        drop(probe);
        Ok(fs)
    }

    /// A client connected now (tests, in-process use).
    pub fn connect(cfg: ClientConfig) -> std::io::Result<DistFs> {
        let fs = DistFs::unconnected(cfg);
        fs.inner.conn().map_err(std::io::Error::from)?;
        Ok(fs)
    }

    fn unconnected(cfg: ClientConfig) -> DistFs {
        DistFs {
            listings: Mutex::new(HashMap::new()),
            next_dir: AtomicU64::new(1),
            inner: Arc::new_cyclic(|me| Inner {
                cfg,
                conn: Mutex::new(None),
                generation: AtomicU64::new(0),
                session: AtomicU64::new(0),
                reconnecting: std::sync::atomic::AtomicBool::new(false),
                block_size: AtomicU32::new(0),
                files: Mutex::new(HashMap::new()),
                me: me.clone(),
                epoch: Instant::now(),
                figures: Arc::default(),
                revokers: Arc::default(),
            }),
        }
    }

    /// How many blocks of `node` this client wrote to the server and no
    /// fsync has made durable yet (a diagnostic).
    pub fn unsynced_blocks(&self, node: NodeId) -> Result<usize> {
        Ok(lock(&self.inner.file(node.0)?.cache).unsynced.len())
    }

    /// The global identifier of `node`.
    pub fn gfi(&self, node: NodeId) -> Result<Gfi> {
        Ok(self.inner.file(node.0)?.gfi)
    }

    /// Writes back every dirty block and releases every lease (what an
    /// unmount does).
    pub fn shutdown(&self) -> Result<()> {
        self.inner.shutdown()
    }

    /// How many direct leases this client was granted (see the module
    /// docs, "Contention"): tests and diagnostics tell from it that
    /// contention was noticed.
    pub fn direct_grants(&self) -> u64 {
        self.inner.figures.granted_direct.load(Ordering::Relaxed)
    }

    /// This client's lease session, once connected.
    pub fn client_id(&self) -> Option<ClientId> {
        lock(&self.inner.conn).as_ref().map(|c| c.client)
    }

    /// When this client stops trusting its leases on its own clock (one
    /// TTL less a margin after the last acknowledged renewal was sent), or
    /// `None` when not connected.
    pub fn leases_valid_until(&self) -> Option<Instant> {
        lock(&self.inner.conn)
            .as_ref()
            .filter(|c| !c.is_dead())
            .map(|c| c.valid_until())
    }

    /// Whether writes go to storage before they are answered: the
    /// `writethrough` mode, or a lease client past its soft timeout.
    pub fn writes_through(&self) -> bool {
        self.inner.cfg.consistency == Consistency::WriteThrough
            || lock(&self.inner.conn).as_ref().is_some_and(|c| c.soft_expired())
    }

    /// Test hook: renewals stop counting unless this client makes them
    /// itself, as when an agent waiting for a slow etcd refuses them (see
    /// [`Conn::ignore_heartbeats`]).
    pub fn ignore_heartbeats(&self) {
        if let Some(c) = lock(&self.inner.conn).as_ref() {
            c.ignore_heartbeats();
        }
    }

    /// Test hook: stop renewing the lease session and ignore revocations,
    /// as a client cut off from the manager would.
    pub fn cut_off(&self) {
        if let Some(c) = lock(&self.inner.conn).as_ref() {
            c.freeze();
        }
    }
}

impl Inner {
    fn conn(&self) -> Result<Arc<Conn>> {
        let mut slot = lock(&self.conn);
        if let Some(c) = slot.as_ref() {
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        // A server that is down or restarting: wait for it, bounded, before
        // failing the call (as sftp's reconnect), saying so once.
        let lost = slot.is_some();
        let deadline = Instant::now() + RECONNECT_WAIT;
        let mut said = false;
        loop {
            match self.open_conn(&mut slot) {
                Ok(c) => {
                    if lost {
                        self.figures.reconnections.fetch_add(1, Ordering::Relaxed);
                    }
                    if lost || said {
                        tracing::info!(
                            "distfs: reconnected to the server at {} (session {:?})",
                            self.cfg.addr,
                            c.client
                        );
                    }
                    return Ok(c);
                }
                Err(e) if Instant::now() >= deadline => {
                    tracing::error!(
                        "distfs: the server at {} is unreachable ({e}) after {RECONNECT_WAIT:?}: the call fails with \
                         ENOTCONN (the next one tries again)",
                        self.cfg.addr
                    );
                    return Err(Errno::ENOTCONN);
                }
                Err(e) => {
                    if !said {
                        tracing::warn!(
                            "distfs: cannot reach the server at {} ({e}); retrying for up to {RECONNECT_WAIT:?}",
                            self.cfg.addr
                        );
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// One attempt at a new connection (resuming the lease session), put in
    /// `slot`.
    fn open_conn(&self, slot: &mut MutexGuard<'_, Option<Arc<Conn>>>) -> std::io::Result<Arc<Conn>> {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let me = self.me.clone();
        let resume = match self.session.load(Ordering::Acquire) {
            0 => None,
            c => Some(ClientId(c)),
        };
        let conn = Conn::open(
            &self.cfg.addr,
            &self.cfg.name,
            generation,
            resume,
            Box::new(move |ev| {
                let Some(inner) = me.upgrade() else { return };
                // Both may wait (for running I/O, for the server): never on
                // the reader thread, which must keep reading.
                let _ = match ev {
                    Event::Revoke { gfi, lease, step_down } => {
                        let revokers = inner.revokers.clone();
                        revokers.run(Box::new(move || inner.revoke(gfi, lease, step_down, generation)))
                    }
                    Event::Closed => {
                        tracing::warn!("distfs: connection to the server at {} lost", inner.cfg.addr);
                        std::thread::Builder::new()
                            .name("distfs-reconnect".into())
                            .spawn(move || inner.reconnect())
                            .map(|_| ())
                    }
                };
            }),
        )?;
        if resume.is_some() {
            // A new session's open files were closed with the old one, and
            // a server that restarted kept only the openers of orphans: tell
            // them again. One removed meanwhile is gone (ENOENT): nothing
            // to keep.
            let open: Vec<u64> = lock(&self.files)
                .iter()
                .filter(|(_, f)| *lock(&f.opens) > 0)
                .map(|(i, _)| *i)
                .collect();
            for ino in open {
                let _ = conn.call(Req::Open { ino });
            }
        }
        self.session.store(conn.client.0, Ordering::Release);
        let bs = self.block_size.load(Ordering::Acquire);
        if bs == 0 {
            self.block_size.store(conn.block_size, Ordering::Release);
        } else if bs != conn.block_size {
            return Err(std::io::Error::other(format!(
                "the server's block size changed from {bs} to {}",
                conn.block_size
            )));
        }
        **slot = Some(conn.clone());
        Ok(conn)
    }

    /// Sends `req`. A connection can die under a request without any
    /// fault of the server's (a heartbeat found the session expired and
    /// ended it): a request that only reads is then sent again on a new
    /// one; any other may have been applied, and fails.
    fn call(&self, req: Req) -> Result<Reply> {
        let conn = self.conn()?;
        let again = req.reads_namespace().then(|| req.clone());
        match (conn.call(req), again) {
            (Err(Errno::ENOTCONN), Some(req)) if conn.is_dead() => self.conn()?.call(req),
            (r, _) => r,
        }
    }

    /// After a lost connection: while this client holds leases, reopens it
    /// (resuming the session) until it works or the leases are past saving.
    fn reconnect(&self) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(ttl) = lock(&self.conn).as_ref().map(|c| c.ttl) else {
            self.reconnecting.store(false, Ordering::Release);
            return;
        };
        let until = Instant::now() + ttl;
        while Instant::now() < until {
            let holding = lock(&self.files).values().any(|f| {
                f.lease
                    .try_read()
                    .map(|g| g.mode.is_some() && g.id != NO_LEASE)
                    .unwrap_or(true)
            });
            if !holding || self.conn().is_ok() {
                break;
            }
            std::thread::sleep(ttl / 20);
        }
        self.reconnecting.store(false, Ordering::Release);
    }

    fn bs(&self) -> u64 {
        u64::from(self.block_size.load(Ordering::Acquire))
    }

    fn file(&self, ino: u64) -> Result<Arc<FileState>> {
        if let Some(f) = lock(&self.files).get(&ino) {
            return Ok(f.clone());
        }
        let info = node_reply(self.call(Req::GetAttr { ino })?)?;
        Ok(self.file_for(&info))
    }

    fn file_for(&self, info: &NodeInfo) -> Arc<FileState> {
        lock(&self.files)
            .entry(info.gfi.ino)
            .or_insert_with(|| {
                Arc::new(FileState {
                    gfi: info.gfi,
                    kind: info.attr.mode & libc::S_IFMT,
                    lease: RwLock::new(Slot::default()),
                    cache: Mutex::new(Cache::default()),
                    opens: Mutex::new(0),
                    used: AtomicU64::new(0),
                    direct_until: AtomicU64::new(0),
                })
            })
            .clone()
    }

    fn entry(&self, info: &NodeInfo) -> Entry {
        let f = self.file_for(info);
        let mut attr = info.attr;
        self.overlay(&f, &mut attr);
        Entry::new(NodeId(info.gfi.ino), to_attr(info.gfi.ino, &attr, self.bs() as u32))
    }

    /// Under this client's write lease, the size and mtime here are newer
    /// than the server's.
    fn overlay(&self, f: &FileState, attr: &mut NodeAttr) {
        let Ok(slot) = f.lease.try_read() else { return };
        if slot.mode == Some(LeaseMode::Write) {
            let c = lock(&f.cache);
            if c.meta_dirty {
                attr.size = c.size;
                attr.mtime = c.mtime;
                // A write changes the inode too (the server does the same
                // when the data arrives).
                attr.ctime = attr.ctime.max(c.mtime);
            }
        }
    }

    /// Holds a lease of at least `mode` on `f` and runs `io` under it, with
    /// the connection the lease belongs to.
    fn with_lease<T>(
        &self,
        f: &FileState,
        mode: LeaseMode,
        io: impl FnMut(&Conn, &RwLockReadGuard<'_, Slot>) -> Result<T>,
    ) -> Result<T> {
        self.with_lease_fetch(f, mode, None, io)
    }

    /// [`Inner::with_lease`]; a lease acquired here comes with blocks
    /// `want` (`(first, last)`, the blocks `io` will read) in the cache.
    fn with_lease_fetch<T>(
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
    fn with_weak_cache<T>(
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

    fn suffices(slot: &Slot, mode: LeaseMode, conn: &Conn) -> bool {
        slot.session == conn.client.0 && conn.leases_valid() && slot.mode.is_some_and(|held| held.covers(mode))
    }

    /// The lease to ask for I/O that needs `mode` on `f`: a direct one
    /// while `f` is found contended (`lease` mode only; see the module
    /// docs, "Contention"), once its spell is over a caching one again.
    fn wanted(&self, f: &FileState, mode: LeaseMode) -> LeaseMode {
        let until = f.direct_until.load(Ordering::Acquire);
        let spell = until != 0 && (self.epoch.elapsed().as_nanos() as u64) < until;
        if spell && self.cfg.consistency == Consistency::Lease {
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
    fn note_revocation(&self, f: &FileState, slot: &Slot) {
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
    fn lapsed(slot: &Slot, conn: &Conn) -> bool {
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
    fn renew_lapsed(&self, conn: &Conn) -> Result<bool> {
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
    fn acquire(&self, f: &FileState, mode: LeaseMode, want: Option<(u64, u64)>, conn: &Conn) -> Result<()> {
        let mut g = f.lease.write().unpoison();
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

    fn mark_used(&self, f: &FileState) {
        let t = self.epoch.elapsed().as_nanos().max(1) as u64;
        f.used.store(t, Ordering::Release);
    }

    /// When the last I/O under a lease on `f` ended, if any did.
    fn last_used(&self, f: &FileState) -> Option<Instant> {
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
    fn hold(&self, f: &FileState, granted: Instant) {
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
    fn revoke(&self, gfi: Gfi, lease: u64, step_down: bool, generation: u64) {
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
            let mut g = f.lease.write().unpoison();
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

    /// Sends every dirty block and the size; with `sync`, makes them and
    /// every block written since the last fsync durable.
    fn write_back(&self, f: &FileState, conn: &Conn, lease: u64, sync: bool) -> Result<()> {
        self.write_back_then(f, conn, lease, sync, Then::Keep).map(|_| ())
    }

    /// [`Inner::write_back`], and the last request gives the lease back or
    /// steps it down as `then` says; returns whether it did (not when
    /// there was nothing to write or the write failed).
    fn write_back_then(&self, f: &FileState, conn: &Conn, lease: u64, sync: bool, then: Then) -> Result<bool> {
        let (dirty, size, mtime, unsynced) = {
            let mut c = lock(&f.cache);
            let mut dirty: Vec<(u64, ByteBuf)> = Vec::new();
            for (i, b) in c.blocks.iter_mut() {
                if b.dirty {
                    b.dirty = false;
                    dirty.push((*i, ByteBuf::from(b.data.clone())));
                }
            }
            if dirty.is_empty() && !c.meta_dirty && !sync {
                return Ok(false);
            }
            c.meta_dirty = false;
            dirty.sort_by_key(|(i, _)| *i);
            let unsynced: Vec<u64> = c.unsynced.iter().copied().collect();
            (dirty, c.size, c.mtime, unsynced)
        };
        let written: Vec<u64> = dirty.iter().map(|(i, _)| *i).collect();
        let mut batches: Vec<Vec<(u64, ByteBuf)>> = vec![Vec::new()];
        let mut bytes = 0;
        for b in dirty {
            if bytes + b.1.len() > BATCH_BYTES && !batches[batches.len() - 1].is_empty() {
                batches.push(Vec::new());
                bytes = 0;
            }
            bytes += b.1.len();
            let last = batches.len() - 1;
            batches[last].push(b);
        }
        let n = batches.len();
        let mut result = Ok(());
        let mut version = None;
        for (k, blocks) in batches.into_iter().enumerate() {
            // Only the last request syncs: it covers the earlier ones too.
            let last_sync = sync && k + 1 == n;
            let mut to_sync = Vec::new();
            if last_sync {
                to_sync = unsynced.clone();
                to_sync.extend(&written);
            }
            let r = conn.call(Req::WriteBlocks {
                gfi: f.gfi,
                lease,
                blocks,
                min_size: size,
                mtime,
                sync: last_sync.then_some(to_sync),
                release: then != Then::Keep && k + 1 == n,
                step_down: then == Then::StepDown,
            });
            match r {
                Ok(Reply::Written { version: v, .. }) => version = v,
                Ok(_) => {
                    result = Err(Errno::EPROTO);
                    break;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut c = lock(&f.cache);
        if result.is_ok() {
            // Nobody else wrote since the cache was last valid (this client
            // held the write lease): it is valid as of this write too.
            c.known = match (c.known, version) {
                (Some(k), Some(v)) if k.epoch == v.epoch => Some(if v.seq > k.seq { v } else { k }),
                _ => None,
            };
        }
        match result {
            Ok(()) if sync => c.unsynced.clear(),
            Ok(()) => c.unsynced.extend(written),
            Err(_) => {
                // Still dirty here; whether it can be retried depends on
                // the lease, which the caller knows.
                for i in written {
                    if let Some(b) = c.blocks.get_mut(&i) {
                        b.dirty = true;
                    }
                }
                c.meta_dirty = true;
            }
        }
        result.map(|()| then != Then::Keep)
    }

    fn read(&self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<ReadOut> {
        let f = self.file(ino)?;
        let bs = self.bs();
        let want = (!buf.is_empty()).then(|| (offset / bs, (offset + buf.len() as u64 - 1) / bs));
        self.with_lease_fetch(&f, LeaseMode::Read, want, |conn, slot| {
            if slot.mode == Some(LeaseMode::Direct) {
                return self.read_direct(&f, conn, slot.id, offset, buf);
            }
            let size = lock(&f.cache).size;
            if offset >= size || buf.is_empty() {
                return Ok(ReadOut { len: 0, eof: true });
            }
            let end = size.min(offset + buf.len() as u64);
            let (first, last) = (offset / bs, (end - 1) / bs);
            let missing: Vec<u64> = {
                let c = lock(&f.cache);
                (first..=last).filter(|i| !c.blocks.contains_key(i)).collect()
            };
            if let (Some(&lo), Some(&hi)) = (missing.first(), missing.last()) {
                let file_blocks = size.div_ceil(bs);
                let sequential = lock(&f.cache).next_read == first;
                let ahead = if sequential { READAHEAD } else { 0 };
                let hi = (hi + ahead).min(file_blocks.saturating_sub(1)).max(hi);
                self.fetch(&f, conn, slot.id, lo, hi)?;
            }
            let mut c = lock(&f.cache);
            c.next_read = last + 1;
            let mut pos = offset;
            while pos < end {
                let i = pos / bs;
                let within = (pos % bs) as usize;
                let n = ((bs - pos % bs).min(end - pos)) as usize;
                let out = &mut buf[(pos - offset) as usize..][..n];
                match c.blocks.get(&i) {
                    Some(b) => {
                        // A block is kept only up to its last written byte:
                        // a read past that (a hole in the block) is zeros.
                        let have = b.data.len().saturating_sub(within).min(n);
                        if have > 0 {
                            out[..have].copy_from_slice(&b.data[within..within + have]);
                        }
                        out[have..].fill(0);
                    }
                    // Dropped between fetch and copy by the cache bound:
                    // rare; the caller retries the read.
                    None => {
                        return partial(pos - offset).map(|len| ReadOut { len, eof: false });
                    }
                }
                pos += n as u64;
            }
            Ok(ReadOut {
                len: (end - offset) as usize,
                eof: end == size,
            })
        })
    }

    /// A read under a direct lease: what the server holds now.
    fn read_direct(&self, f: &FileState, conn: &Conn, lease: u64, offset: u64, buf: &mut [u8]) -> Result<ReadOut> {
        // A larger read is several requests (the caller goes on).
        let len = buf.len().min(MAX_DIRECT as usize);
        let data = match conn.call(Req::ReadDirect {
            gfi: f.gfi,
            lease,
            offset,
            len: len as u32,
        })? {
            Reply::Bytes(b) if b.len() <= len => b,
            _ => return Err(Errno::EPROTO),
        };
        buf[..data.len()].copy_from_slice(&data);
        Ok(ReadOut {
            len: data.len(),
            // Cut at the size the server had: another round trip would
            // only find the end again.
            eof: data.len() < len,
        })
    }

    /// A write under a direct lease: on the server when answered (not yet
    /// durable: an fsync makes it so, [`Inner::sync_written`]). Returns
    /// where it landed (an append: where the server's end was) and how
    /// much it wrote.
    fn write_direct(&self, f: &FileState, conn: &Conn, lease: u64, at: At, data: &[u8]) -> Result<(u64, usize)> {
        // A larger write is several requests (the caller goes on).
        let data = &data[..data.len().min(MAX_DIRECT as usize)];
        let len = data.len() as u64;
        let info = match conn.call(Req::WriteDirect {
            gfi: f.gfi,
            lease,
            offset: at.offset().unwrap_or(0),
            append: at.offset().is_none(),
            data: ByteBuf::from(data.to_vec()),
            mtime: crate::meta::now(),
        })? {
            Reply::Written { info, .. } => info,
            _ => return Err(Errno::EPROTO),
        };
        // The server made the file end where an append ended.
        let offset = match at.offset() {
            Some(offset) => offset,
            None => info.attr.size.checked_sub(len).ok_or(Errno::EPROTO)?,
        };
        if len > 0 {
            let bs = self.bs();
            lock(&f.cache).unsynced.extend(offset / bs..=(offset + len - 1) / bs);
        }
        Ok((offset, data.len()))
    }

    /// An fsync (or unmount) without dirty blocks here: the blocks written to the
    /// server since the last one (directly, or written back under a lease
    /// since gone), and the metadata, made durable by a write request that
    /// writes nothing and, never shrinking a file, changes no size. Under
    /// no lease: a sync changes no data (and a direct lease may have moved
    /// on meanwhile). Nothing to send when nothing was written since.
    fn sync_written(&self, f: &FileState, conn: &Conn) -> Result<()> {
        // Taken: blocks written meanwhile stay listed for the next fsync.
        let unsynced = std::mem::take(&mut lock(&f.cache).unsynced);
        if unsynced.is_empty() {
            return Ok(());
        }
        let r = conn.call(Req::WriteBlocks {
            gfi: f.gfi,
            lease: NO_LEASE,
            blocks: Vec::new(),
            min_size: 0,
            mtime: crate::meta::now(),
            sync: Some(unsynced.iter().copied().collect()),
            release: false,
            step_down: false,
        });
        match r {
            Ok(Reply::Written { .. }) => Ok(()),
            other => {
                lock(&f.cache).unsynced.extend(unsynced);
                Err(other.err().unwrap_or(Errno::EPROTO))
            }
        }
    }

    /// Fetches blocks `lo..=hi` in one request; keeps what this client
    /// wrote meanwhile.
    fn fetch(&self, f: &FileState, conn: &Conn, lease: u64, lo: u64, hi: u64) -> Result<()> {
        let count = u32::try_from(hi - lo + 1).map_err(|_| Errno::EINVAL)?;
        let blocks = match conn.call(Req::ReadBlocks {
            gfi: f.gfi,
            lease,
            first: lo,
            count,
        })? {
            Reply::Blocks(b) if b.len() == count as usize => b,
            _ => return Err(Errno::EPROTO),
        };
        let mut c = lock(&f.cache);
        for (k, data) in blocks.into_iter().enumerate() {
            c.blocks.entry(lo + k as u64).or_insert(Block {
                data: data.map(ByteBuf::into_vec).unwrap_or_default(),
                dirty: false,
            });
        }
        c.evict_clean();
        Ok(())
    }

    /// Writes `data` at `at`; returns where it landed and how much of it
    /// was written (the caller goes on with the rest).
    fn write(&self, ino: u64, at: At, data: &[u8]) -> Result<(u64, usize)> {
        let f = self.file(ino)?;
        let bs = self.bs();
        // Where an append lands is known only under the lease; the end
        // cached now is the guess of which blocks to fetch with it.
        let guess = at.offset().unwrap_or_else(|| lock(&f.cache).size);
        let end = guess.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        // The partly written end blocks are read first (below).
        let (first, last) = (guess / bs, end.saturating_sub(1) / bs);
        let head = !guess.is_multiple_of(bs) || end < (first + 1) * bs;
        let tail = !end.is_multiple_of(bs) && last != first;
        let want = match (head, tail) {
            _ if data.is_empty() => None,
            (true, true) => Some((first, last)),
            (true, false) => Some((first, first)),
            (false, true) => Some((last, last)),
            (false, false) => None,
        };
        self.with_lease_fetch(&f, LeaseMode::Write, want, |conn, slot| {
            if data.is_empty() {
                return Ok((guess, 0));
            }
            if slot.mode == Some(LeaseMode::Direct) {
                return self.write_direct(&f, conn, slot.id, at, data);
            }
            // The lease keeps every other client out until this returns:
            // the end found here is where the append lands.
            let offset = at.offset().unwrap_or_else(|| lock(&f.cache).size);
            let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
            {
                // Partly written blocks that exist on the server and are not
                // cached must be read first.
                let need: Vec<u64> = {
                    let c = lock(&f.cache);
                    let stored = c.size.div_ceil(bs);
                    let (first, last) = (offset / bs, (end - 1) / bs);
                    // The first and last block, once each (a write within
                    // one block fetched it twice).
                    [first, last][..if first == last { 1 } else { 2 }]
                        .iter()
                        .copied()
                        .filter(|&i| {
                            let covers = offset <= i * bs && end >= (i + 1) * bs;
                            !covers && i < stored && !c.blocks.contains_key(&i)
                        })
                        .collect()
                };
                for i in need {
                    self.fetch(&f, conn, slot.id, i, i)?;
                }
                let mut c = lock(&f.cache);
                let stored = c.size.div_ceil(bs);
                let mut pos = offset;
                let mut complete = true;
                while pos < end {
                    let i = pos / bs;
                    let within = (pos % bs) as usize;
                    let n = ((bs - pos % bs).min(end - pos)) as usize;
                    let covers = within == 0 && n as u64 == bs;
                    if !covers && i < stored && !c.blocks.contains_key(&i) {
                        complete = false;
                        break;
                    }
                    let b = c.blocks.entry(i).or_insert(Block {
                        data: Vec::new(),
                        dirty: false,
                    });
                    if b.data.len() < within + n {
                        b.data.resize(within + n, 0);
                    }
                    b.data[within..within + n].copy_from_slice(&data[(pos - offset) as usize..][..n]);
                    b.dirty = true;
                    pos += n as u64;
                }
                if pos > offset {
                    c.size = c.size.max(pos);
                    c.mtime = crate::meta::now();
                    c.meta_dirty = true;
                }
                if !complete {
                    // A needed block was dropped by the cache bound: the
                    // caller fetches the rest again (what is written stays).
                    return partial(pos - offset).map(|n| (offset, n));
                }
                let too_dirty = c.dirty_count() > DIRTY_MAX;
                drop(c);
                // Write-through by mode, or past the soft timeout: the
                // manager may be unreachable and the lease about to go.
                let through = self.cfg.consistency == Consistency::WriteThrough || conn.soft_expired();
                if too_dirty || through {
                    self.write_back(&f, conn, slot.id, false)?;
                }
                Ok((offset, data.len()))
            }
        })
    }

    fn truncate(&self, f: &FileState, size: u64, change: AttrChange) -> Result<NodeInfo> {
        let bs = self.bs();
        self.with_lease(f, LeaseMode::Write, |conn, slot| {
            {
                let mut c = lock(&f.cache);
                c.blocks.retain(|i, _| i * bs < size);
                let tail = (size % bs) as usize;
                if let Some(b) = c.blocks.get_mut(&(size / bs)) {
                    if tail < b.data.len() {
                        b.data.truncate(tail);
                    }
                }
            }
            // Dirty data below the new size goes first, so that the size the
            // server records and the blocks it holds agree.
            self.write_back(f, conn, slot.id, false)?;
            let info = node_reply(conn.call(Req::SetAttr {
                ino: f.gfi.ino,
                change,
                lease: Some(slot.id),
            })?)?;
            let mut c = lock(&f.cache);
            c.size = size;
            c.mtime = info.attr.mtime;
            Ok(info)
        })
    }

    fn fsync(&self, ino: u64) -> Result<()> {
        let f = self.file(ino)?;
        let conn = self.conn()?;
        let g = f.lease.read().unpoison();
        let lost = std::mem::take(&mut lock(&f.cache).lost);
        if g.mode == Some(LeaseMode::Write) && (g.session == conn.client.0 || g.id == NO_LEASE) {
            match self.write_back(&f, &conn, g.id, true) {
                // The server fenced the lease off (gone, or its session
                // may have expired): what is dirty can never be written
                // under it. Lost, and said so now, once.
                Err(Errno::ESTALE) if g.id != NO_LEASE => {
                    let (id, session) = (g.id, g.session);
                    drop(g);
                    let mut g = f.lease.write().unpoison();
                    if g.id == id && g.session == session {
                        lock(&f.cache).clear();
                        *g = Slot::default();
                    }
                    lock(&f.cache).lost = false;
                    return Err(Errno::EIO);
                }
                r => r?,
            }
        } else {
            // Written directly, or written back under a lease since gone.
            self.sync_written(&f, &conn)?;
        }
        if lost {
            return Err(Errno::EIO);
        }
        Ok(())
    }

    fn shutdown(&self) -> Result<()> {
        let files: Vec<Arc<FileState>> = lock(&self.files).values().cloned().collect();
        let Some(conn) = lock(&self.conn).clone() else {
            return Ok(());
        };
        let mut result = Ok(());
        for f in files {
            let mut g = f.lease.write().unpoison();
            let held = g.mode.is_some() && (g.session == conn.client.0 || g.id == NO_LEASE);
            let synced = if held && g.mode == Some(LeaseMode::Write) {
                self.write_back(&f, &conn, g.id, true)
            } else {
                self.sync_written(&f, &conn)
            };
            if let Err(e) = synced {
                result = Err(e);
            }
            if !held {
                continue;
            }
            lock(&f.cache).clear();
            if g.id != NO_LEASE {
                let _ = conn.call(Req::Release {
                    gfi: f.gfi,
                    lease: g.id,
                });
            }
            *g = Slot::default();
        }
        result
    }
}

impl DistFs {
    /// Clears set-user-ID and set-group-ID as a native write by a user
    /// without CAP_FSETID does ([`Request::setid_bits_to_clear`]): the kernel asks for
    /// it on such writes (`FUSE_WRITE_KILL_SUIDGID`, always set for direct
    /// I/O, which distfs uses). Costs a round trip to the server per such
    /// write; root's writes do not ask.
    fn kill_suidgid(&self, req: &Request, node: NodeId) -> Result<()> {
        let attr = node_reply(self.inner.call(Req::GetAttr { ino: node.0 })?)?.attr;
        let mode = attr.mode;
        let kill = req.setid_bits_to_clear(mode, attr.gid);
        if mode & libc::S_IFMT != libc::S_IFREG || kill == 0 {
            return Ok(());
        }
        let change = AttrChange {
            mode: Some(mode & 0o7777 & !kill),
            ..AttrChange::default()
        };
        node_reply(self.inner.call(Req::SetAttr {
            ino: node.0,
            change,
            lease: None,
        })?)
        .map(|_| ())
    }
}

impl Filesystem for DistFs {
    fn init(&self, config: &mut InitConfig) -> Result<()> {
        // Direct I/O keeps reads and writes under the leases; mmap still
        // works through the kernel's pages (coherent across clients only
        // as far as close-to-open, as on NFS).
        config.want |= config.kernel_flags & shortfuse::abi::flags::FUSE_DIRECT_IO_ALLOW_MMAP;
        // Set-id bits are cleared here (setattr and write): the kernel's
        // own clearing for file systems without HANDLE_KILLPRIV_V2 keeps a
        // set-group-ID bit without group execution, which ext4 clears when
        // the truncating caller is not in the file's group.
        config.want |= config.kernel_flags & shortfuse::abi::FUSE_HANDLE_KILLPRIV_V2;
        self.inner.conn().map(|_| ())
    }

    fn destroy(&self) {
        let _ = self.inner.shutdown();
    }

    fn figures(&self) -> Option<Arc<dyn shortfuse::stats::Figures>> {
        Some(self.inner.figures.clone())
    }

    fn lookup(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        let info = node_reply(self.inner.call(Req::Lookup {
            parent: parent.0,
            name: name_bytes(name)?,
        })?)?;
        Ok(self.inner.entry(&info))
    }

    fn getattr(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>) -> Result<Attr> {
        let inner = &self.inner;
        let f = inner.file(node.0)?;
        let attr = if f.kind == libc::S_IFREG {
            // Size and mtime are data: under a read lease nobody else has
            // unwritten changes; under our write lease ours are newest.
            inner.with_lease(&f, LeaseMode::Read, |conn, _| {
                let mut attr = node_reply(conn.call(Req::GetAttr { ino: node.0 })?)?.attr;
                let c = lock(&f.cache);
                if c.meta_dirty {
                    attr.size = c.size;
                    attr.mtime = c.mtime;
                    attr.ctime = attr.ctime.max(c.mtime);
                }
                Ok(attr)
            })?
        } else {
            node_reply(inner.call(Req::GetAttr { ino: node.0 })?)?.attr
        };
        Ok(to_attr(node.0, &attr, inner.bs() as u32))
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        let inner = &self.inner;
        let f = inner.file(node.0)?;
        let chown = set.uid.is_some() || set.gid.is_some() || set.is_empty();
        let mut mode = set.mode;
        if mode.is_none() && (set.kill_suidgid || chown) {
            let attr = node_reply(inner.call(Req::GetAttr { ino: node.0 })?)?.attr;
            let bits = attr.mode & 0o7777;
            let kill = if attr.mode & libc::S_IFMT == libc::S_IFDIR {
                0
            } else if chown {
                // chown, even by root and to the same owner: set-user-ID,
                // and set-group-ID when group-executable.
                bits & (libc::S_ISUID | if bits & libc::S_IXGRP != 0 { libc::S_ISGID } else { 0 })
            } else {
                req.setid_bits_to_clear(bits, attr.gid)
            };
            if kill != 0 {
                mode = Some(bits & !kill);
            }
        }
        let mut change = AttrChange {
            mode,
            uid: set.uid,
            gid: set.gid,
            size: set.size,
            atime: set.atime.map(wire_time),
            mtime: set.mtime.map(wire_time),
        };
        let info = match set.size {
            Some(size) => inner.truncate(&f, size, change)?,
            None => {
                if change.mtime.is_some() {
                    // An explicit mtime must not be overwritten by a later
                    // write-back of an older one.
                    let _ = inner.with_lease(&f, LeaseMode::Write, |conn, slot| {
                        inner.write_back(&f, conn, slot.id, false)
                    });
                }
                change.size = None;
                node_reply(inner.call(Req::SetAttr {
                    ino: node.0,
                    change,
                    lease: None,
                })?)?
            }
        };
        let mut attr = info.attr;
        inner.overlay(&f, &mut attr);
        Ok(to_attr(node.0, &attr, inner.bs() as u32))
    }

    fn readlink(&self, _req: &Request, node: NodeId) -> Result<Vec<u8>> {
        match self.inner.call(Req::Readlink { ino: node.0 })? {
            Reply::Data(d) => Ok(d),
            _ => Err(Errno::EPROTO),
        }
    }

    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        self.create_node(
            req,
            parent,
            name,
            NewKind::Symlink {
                target: target.as_bytes().to_vec(),
            },
            libc::S_IFLNK | 0o777,
            false,
        )
    }

    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        self.create_node(req, parent, name, NewKind::Node { rdev: new.rdev }, new.mode, false)
    }

    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        self.create_node(
            req,
            parent,
            name,
            NewKind::Dir,
            libc::S_IFDIR | (new.mode & 0o7777),
            false,
        )
    }

    fn unlink(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.inner
            .call(Req::Unlink {
                parent: parent.0,
                name: name_bytes(name)?,
            })
            .map(|_| ())
    }

    fn rmdir(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.inner
            .call(Req::Rmdir {
                parent: parent.0,
                name: name_bytes(name)?,
            })
            .map(|_| ())
    }

    fn rename(
        &self,
        _req: &Request,
        parent: NodeId,
        name: &OsStr,
        new_parent: NodeId,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.whiteout {
            return Err(Errno::EINVAL);
        }
        self.inner
            .call(Req::Rename {
                parent: parent.0,
                name: name_bytes(name)?,
                new_parent: new_parent.0,
                new_name: name_bytes(new_name)?,
                flags: flags.raw(),
            })
            .map(|_| ())
    }

    fn link(&self, _req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry> {
        let info = node_reply(self.inner.call(Req::Link {
            ino: node.0,
            new_parent: new_parent.0,
            new_name: name_bytes(new_name)?,
        })?)?;
        Ok(self.inner.entry(&info))
    }

    fn open(&self, _req: &Request, node: NodeId, flags: i32) -> Result<Opened> {
        let f = self.inner.file(node.0)?;
        {
            // The connection first: `Inner::conn` takes `opens` under its
            // own lock when it starts a new session.
            let conn = self.inner.conn()?;
            let mut opens = lock(&f.opens);
            if *opens == 0 {
                conn.call(Req::Open { ino: node.0 })?;
            }
            *opens += 1;
        }
        if flags & libc::O_TRUNC != 0 {
            // The kernel sends O_TRUNC here only with atomic_o_trunc, which
            // is not asked for; a setattr does it otherwise.
            let r = self.inner.truncate(
                &f,
                0,
                AttrChange {
                    size: Some(0),
                    ..AttrChange::default()
                },
            );
            if let Err(e) = r {
                // No handle: the kernel sends no release for it.
                self.close(&f);
                return Err(e);
            }
        }
        Ok(self.opened())
    }

    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, _flags: i32) -> Result<Created> {
        let entry = self.create_node(req, parent, name, NewKind::Node { rdev: 0 }, new.mode, true)?;
        *lock(&self.inner.file(entry.node.0)?.opens) += 1;
        Ok(Created {
            entry,
            opened: self.opened(),
        })
    }

    fn read(&self, _req: &Request, node: NodeId, _fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        // A short count that is not end of file happens only when the cache
        // bound dropped a block mid-copy: finish the request.
        let mut done = 0;
        while done < buf.len() {
            match self.inner.read(node.0, offset + done as u64, &mut buf[done..]) {
                Ok(r) => {
                    done += r.len;
                    if r.eof || r.len == 0 {
                        break;
                    }
                }
                Err(Errno::EAGAIN) => continue,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    fn write(&self, req: &Request, node: NodeId, _fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        // An append goes where the file ends when it is written, which
        // others may change meanwhile (the kernel's idea of the end is
        // stale with direct I/O); the rest of a long one follows it.
        let mut at = if args.flags & libc::O_APPEND as u32 != 0 {
            At::End
        } else {
            At::Offset(args.offset)
        };
        if args.write_flags & shortfuse::abi::FUSE_WRITE_KILL_SUIDGID != 0 {
            self.kill_suidgid(req, node)?;
        }
        let mut done = 0;
        while done < data.len() {
            match self.inner.write(node.0, at, &data[done..]) {
                Ok((offset, n)) => {
                    done += n;
                    at = At::Offset(offset + n as u64);
                }
                Err(Errno::EAGAIN) => continue,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    fn flush(&self, _req: &Request, node: NodeId, _fh: FileHandle, _lock_owner: u64) -> Result<()> {
        // Data stays cached under the lease; only a loss is reported.
        // Without leases, close is when others may see the data (as in
        // NFS's and JuiceFS's close-to-open).
        let f = self.inner.file(node.0)?;
        if self.inner.cfg.consistency == Consistency::Weak {
            let conn = self.inner.conn()?;
            let g = f.lease.read().unpoison();
            if g.mode.is_some() {
                self.inner.write_back(&f, &conn, NO_LEASE, false)?;
            }
        }
        if std::mem::take(&mut lock(&f.cache).lost) {
            return Err(Errno::EIO);
        }
        Ok(())
    }

    fn release(&self, _req: &Request, node: NodeId, _fh: FileHandle, _args: &ReleaseArgs) -> Result<()> {
        if let Some(f) = lock(&self.inner.files).get(&node.0).cloned() {
            self.close(&f);
        }
        Ok(())
    }

    fn fsync(&self, _req: &Request, node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        self.inner.fsync(node.0)
    }

    fn readdir(&self, _req: &Request, node: NodeId, fh: FileHandle, offset: u64, sink: &mut dyn DirSink) -> Result<()> {
        let taken = lock(&self.listings).get(&fh.0).cloned();
        let entries = match taken {
            Some(e) if offset != 0 => e,
            _ => {
                let e = match self.inner.call(Req::ReadDir { ino: node.0 })? {
                    Reply::Entries(e) => Arc::new(e),
                    _ => return Err(Errno::EPROTO),
                };
                if fh.0 != 0 {
                    lock(&self.listings).insert(fh.0, e.clone());
                }
                e
            }
        };
        for (k, e) in entries.iter().enumerate().skip(offset as usize) {
            let typ = FileType::from_mode(e.kind);
            if !sink.add(e.ino, k as u64 + 1, typ, OsStr::from_bytes(&e.name)) {
                break;
            }
        }
        Ok(())
    }

    fn opendir(&self, _req: &Request, _node: NodeId, _flags: i32) -> Result<Opened> {
        Ok(Opened::handle(self.next_dir.fetch_add(1, Ordering::Relaxed)))
    }

    fn releasedir(&self, _req: &Request, _node: NodeId, fh: FileHandle, _flags: u32) -> Result<()> {
        lock(&self.listings).remove(&fh.0);
        Ok(())
    }

    fn fsyncdir(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        // Every name-space change is already on the server when answered.
        Ok(())
    }

    fn statfs(&self, _req: &Request, _node: NodeId) -> Result<Statfs> {
        match self.inner.call(Req::Statfs)? {
            Reply::Statfs {
                blocks,
                bfree,
                files,
                ffree,
                bsize,
            } => Ok(Statfs {
                blocks,
                bfree,
                bavail: bfree,
                files,
                ffree,
                bsize,
                namelen: NAME_MAX as u32,
                frsize: bsize,
            }),
            _ => Err(Errno::EPROTO),
        }
    }
}

impl DistFs {
    fn opened(&self) -> Opened {
        Opened {
            flags: OpenFlags {
                direct_io: self.inner.cfg.direct_io,
                ..OpenFlags::default()
            },
            ..Opened::default()
        }
    }

    /// Drops one open of `f`; the last tells the server, without waiting
    /// (the server takes opens and closes in order). A failure to tell it
    /// (connection lost) is harmless: the session's end closes.
    fn close(&self, f: &FileState) {
        let conn = self.inner.conn();
        let mut opens = lock(&f.opens);
        *opens = opens.saturating_sub(1);
        if let (0, Ok(conn)) = (*opens, conn) {
            let _ = conn.send(Req::Close { ino: f.gfi.ino });
        }
    }

    fn create_node(
        &self,
        req: &Request,
        parent: NodeId,
        name: &OsStr,
        kind: NewKind,
        mode: u32,
        open: bool,
    ) -> Result<Entry> {
        let info = node_reply(self.inner.call(Req::Create {
            parent: parent.0,
            name: name_bytes(name)?,
            kind,
            mode,
            uid: req.uid,
            gid: req.gid,
            open,
        })?)?;
        Ok(self.inner.entry(&info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_spell_is_a_mount_option() {
        let opt = |v: &str| vec![("direct_spell".to_string(), Some(v.to_string()))];
        assert_eq!(ClientConfig::new("a").direct_spell, DEFAULT_DIRECT_SPELL);
        let cfg = ClientConfig::from_options("a", &opt("250")).unwrap();
        assert_eq!(cfg.direct_spell, Duration::from_millis(250));
        let cfg = ClientConfig::from_options("a", &opt("0")).unwrap();
        assert_eq!(cfg.direct_spell, Duration::ZERO, "0 turns direct leases off");
        for bad in ["-1", "x", "1e9"] {
            let e = ClientConfig::from_options("a", &opt(bad)).err().unwrap();
            assert!(e.to_string().contains("direct_spell"), "{e}");
        }
    }

    #[test]
    fn revokers_run_every_job_and_a_waiting_one_holds_up_no_other() {
        let pool = Arc::new(Revokers::default());
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        // The first job waits for the second: one thread for both would
        // never finish it.
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let first = tx.clone();
        pool.run(Box::new(move || {
            let got = go_rx.recv_timeout(Duration::from_secs(10)).is_ok();
            first.send(u32::from(got)).unwrap();
        }))
        .unwrap();
        pool.run(Box::new(move || go_tx.send(()).unwrap())).unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(20)),
            Ok(1),
            "the first job never saw the second"
        );
        // Idle threads take later jobs, one each.
        for k in 0..20 {
            let tx = tx.clone();
            pool.run(Box::new(move || tx.send(10 + k).unwrap())).unwrap();
        }
        let mut got: Vec<u32> = (0..20)
            .map(|_| rx.recv_timeout(Duration::from_secs(20)).unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, (10..30).collect::<Vec<u32>>());
    }
}
