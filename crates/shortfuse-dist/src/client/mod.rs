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
//! With `-o page_cache` (`lease` and `writethrough`), read-only opens read
//! through the kernel's page cache instead, kept under the leases:
//! - a READ is served under a caching lease only (never a direct one), so
//!   every page the kernel holds was read under a lease this client holds;
//! - before such a lease goes (revoked, or given back to change mode), the
//!   kernel is told to drop the file's pages and attributes (see
//!   [`Inner::lock_dropping_pages`] for the order that keeps a READ in
//!   flight from filling a page behind the notification);
//! - the kernel trusts no attribute of a regular file (timeout 0): a size
//!   it was given outside a lease is asked again before a read past it,
//!   and `FUSE_AUTO_INVAL_DATA` is not asked for, so a read within the
//!   size asks nothing while the pages are cached;
//! - writable opens stay direct, and shared writable mappings are refused
//!   (no `FUSE_DIRECT_IO_ALLOW_MMAP`), so the kernel never holds a dirty
//!   page that a notification would have to write back;
//! - no worker waits for a notification: a write or truncation that must
//!   drop pages first goes on from another thread and is answered later
//!   ([`later`]), since the kernel waits for READs a worker must serve.
//!
//! A lease lost with its session (a client cut off from the manager) is
//! not given back: a watcher drops every file's pages once this client's
//! clock no longer vouches for its leases, a tenth of the lease TTL
//! before the manager's clock lets them go (the margin this client's own
//! reads and writes already keep; [`Inner::watch_leases`]).
//!
//! # Lock order
//!
//! `Inner::conn` and `Inner::files` are leaf locks held for a lookup only,
//! but for `Inner::conn` while a new session starts: it takes `files` and
//! the files' `opens` then, so nothing asks for a connection while holding
//! either (a guard in an `if let` or `match` scrutinee lives to the end of
//! the statement: take the value out first).
//! Per file: the lease slot, then the block cache; never two files at once.

use shortfuse::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use shortfuse::{Entry, NodeId, Result};

use crate::conn::Conn;
use crate::proto::{ClientId, Gfi, LeaseMode, NodeAttr, NodeInfo, Request as Req};

mod cache;
mod config;
mod fs;
mod io;
mod later;
mod lease;
mod pages;
mod revokers;
mod session;

use cache::Cache;
pub use config::{
    ClientConfig, Consistency, CONTENDED_WITHIN, DEFAULT_DIRECT_SPELL, DEFAULT_LEASE_HOLD, RECONNECT_WAIT,
    WEAK_CACHE_TTL,
};
use fs::{node_reply, to_attr};
use lease::{LeaseFigures, Slot};
use revokers::Revokers;

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
    /// READs served here under a lease (`-o page_cache`): see
    /// [`Inner::lock_dropping_pages`].
    served: AtomicU64,
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
    /// Tells the kernel to drop pages (`-o page_cache`), from `init`.
    notifier: std::sync::OnceLock<shortfuse::Notifier>,
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
                notifier: std::sync::OnceLock::new(),
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
                    served: AtomicU64::new(0),
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
}
