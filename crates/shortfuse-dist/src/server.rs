//! The embedded server: lease manager, metadata and block storage in one
//! process, serving clients over TCP ([`crate::proto`]).
//!
//! Each connection has a reader (frames in, one task per request, so a
//! lease request that waits for other clients holds up nothing else) and a
//! writer (replies and revocations out, in the order they were queued).
//! The connection is the client's lease session: when it closes, the
//! client's leases are free. A restarted server finds the sessions of its
//! last run in `DATA/leases` and lets their clients resume them.
//!
//! Open files: clients say which files they hold open ([`Request::Open`],
//! [`Request::Close`]); the lease manager keeps it with the sessions and
//! the metadata service keeps a file that loses its last name while open
//! as an orphan. Orphans are reaped when their last opener closes them,
//! when its session ends or expires (a sweep every [`SWEEP_EVERY`]), and at
//! start for those nobody holds open any more.
//!
//! I/O under [`NO_LEASE`] (clients mounted with `consistency=weak`) is
//! served without any lease check: such clients trade coherence for speed
//! knowingly, and mixing them with leased clients on one file gives the
//! leased ones no guarantee about the unleased writes.

use shortfuse::sync::Unpoison;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use shortfuse::{Errno, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use crate::blocks::BlockStore;
use crate::lease::embedded::LeaseManager;
use crate::lease::etcd::EtcdLeases;
use crate::lease::Leases;
use crate::meta::embedded::Meta;
use crate::meta::etcd::{self as etcdmeta, Creation, EtcdMeta, FsParams};
use crate::meta::Metadata;
use crate::proto::{self, ByteBuf, ClientId, ClientMsg, Reply, Request, ServerMsg, NO_LEASE, PROTOCOL_VERSION};
use crate::versions::{Changed, DataVersions};

/// Block size of a new server (128 KiB: the kernel's largest write is 1 MiB,
/// so a write spans few blocks, and a small random write costs one block).
pub const DEFAULT_BLOCK_SIZE: u32 = 128 << 10;
/// Where the agents keep leases and sessions in etcd (the metadata is
/// under [`crate::meta::etcd::DEFAULT_PREFIX`], keys of other names).
pub const LEASE_PREFIX: &str = "shortfuse/lease/";
/// Lease session lifetime without renewal.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// How often expired sessions are noticed when nobody asks for a lease
/// (at most this late, a dead client's orphans are reaped).
pub const SWEEP_EVERY: Duration = Duration::from_millis(500);

/// Where a server keeps its state: embedded (`data` only) or as an agent of
/// the scale-out mode (`etcd`, with blocks under `data` until they move to
/// S3).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Embedded: metadata under `DATA/meta`, leases `DATA/leases`, blocks
    /// `DATA/blocks`. With `etcd`: only the blocks, under `DATA/blocks`
    /// (every agent of the file system names the same directory).
    pub data: Option<PathBuf>,
    /// etcd client URLs (`http://IP:2379`): the metadata lives there and
    /// this server is one of the agents serving that file system.
    pub etcd: Vec<String>,
    /// Blocks in this S3 bucket instead of `DATA/blocks`
    /// (`http://[KEY:SECRET@]HOST:PORT/BUCKET`, see [`BlockStore::s3`]).
    pub s3: Option<String>,
    pub listen: SocketAddr,
    pub block_size: u32,
    pub lease_ttl: Duration,
}

impl ServerConfig {
    /// The embedded server over the data directory `data`.
    pub fn new(data: PathBuf, listen: SocketAddr) -> ServerConfig {
        ServerConfig {
            data: Some(data),
            etcd: Vec::new(),
            s3: None,
            listen,
            block_size: DEFAULT_BLOCK_SIZE,
            lease_ttl: DEFAULT_LEASE_TTL,
        }
    }

    /// An agent of the file system kept in etcd at `etcd`, its blocks under
    /// `data`.
    pub fn agent(etcd: Vec<String>, data: PathBuf, listen: SocketAddr) -> ServerConfig {
        ServerConfig {
            etcd,
            ..ServerConfig::new(data, listen)
        }
    }
}

/// Locks that make each direct read or write of a file one step with
/// respect to the others (see [`Shared::direct_lock`]); files share them by
/// hash. 64: far more than the files in use at once on this server's few
/// threads, so two files rarely wait for each other, for 64 small locks.
const DIRECT_LOCKS: usize = 64;

struct Shared {
    meta: Arc<Metadata>,
    /// The file system whose free space statfs reports (the blocks').
    space: PathBuf,
    blocks: BlockStore,
    leases: Arc<Leases>,
    /// The record of data changes that lets clients keep their caches
    /// across lease moves ([`crate::versions`]); embedded servers only.
    versions: Option<Mutex<DataVersions>>,
    /// See [`DIRECT_LOCKS`].
    direct: Vec<tokio::sync::RwLock<()>>,
}

impl Shared {
    fn versions(&self) -> Option<MutexGuard<'_, DataVersions>> {
        self.versions.as_ref().map(|v| v.lock().unpoison())
    }

    /// The lock of `gfi`'s direct I/O: several direct holders read and
    /// write the file at once, and each request (a read of several blocks
    /// and the size, a write that merges partly written blocks and extends
    /// the size) must not interleave with a write of another. Holders of a
    /// caching lease need none: the lease keeps everyone else out.
    fn direct_lock(&self, gfi: proto::Gfi) -> &tokio::sync::RwLock<()> {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(gfi);
        &self.direct[(h % self.direct.len() as u64) as usize]
    }

    /// Every block of `gfi` may have changed (truncated or removed).
    fn changed_all(&self, gfi: proto::Gfi) {
        if let Some(mut v) = self.versions() {
            v.wrote_all(gfi);
        }
    }
}

/// A running server; dropping it stops it (connections close, so every
/// client's session ends).
pub struct DistServer {
    rt: Option<Runtime>,
    addr: SocketAddr,
    leases: Arc<Leases>,
}

/// Names this run of the server among all runs: nanoseconds since 1970 at
/// start (data versions of an earlier run must never match).
fn run_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id()) << 48
}

fn new_node_id() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ d.as_secs() as u32)
        .unwrap_or(0);
    (t ^ std::process::id().rotate_left(16)) | 1
}

impl DistServer {
    /// Opens the data directory, binds `listen` and starts serving in
    /// background threads.
    pub fn start(cfg: ServerConfig) -> std::io::Result<DistServer> {
        if !(4096..=(16 << 20)).contains(&cfg.block_size) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("block size {} is outside 4 KiB..16 MiB", cfg.block_size),
            ));
        }
        let Some(data) = &cfg.data else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the blocks need a data directory (--data DIR)",
            ));
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("distfs-server")
            .enable_all()
            .build()?;
        let (meta, leases, block_size) = if cfg.etcd.is_empty() {
            let meta = Metadata::Local(Meta::open(&data.join("meta"), new_node_id())?);
            let leases = Leases::Local(LeaseManager::open(cfg.lease_ttl, &data.join("leases"))?);
            (meta, leases, cfg.block_size)
        } else {
            let params = FsParams {
                node_id: new_node_id(),
                block_size: cfg.block_size,
            };
            let (meta, leases) = rt.block_on(async {
                let client = etcdmeta::connect(&cfg.etcd).await?;
                let meta = EtcdMeta::open(client, etcdmeta::DEFAULT_PREFIX, params, cfg.lease_ttl).await?;
                let leases = EtcdLeases::connect(&cfg.etcd, LEASE_PREFIX, cfg.lease_ttl).await?;
                std::io::Result::Ok((meta, leases))
            })?;
            // The file system's block size is the one it was made with.
            let block_size = meta.params().block_size;
            (Metadata::Etcd(Box::new(meta)), Leases::Etcd(leases), block_size)
        };
        let meta = Arc::new(meta);
        let leases = Arc::new(leases);
        let blocks = match &cfg.s3 {
            Some(url) => BlockStore::s3(url, block_size)?,
            None => BlockStore::local(&data.join("blocks"), block_size)?,
        };
        let etcd = !cfg.etcd.is_empty();
        let listener = std::net::TcpListener::bind(cfg.listen)
            .map_err(|e| std::io::Error::new(e.kind(), format!("listen on {}: {e}", cfg.listen)))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            meta,
            space: data.clone(),
            blocks,
            leases: leases.clone(),
            versions: (!etcd).then(|| Mutex::new(DataVersions::new(run_epoch()))),
            direct: (0..DIRECT_LOCKS).map(|_| tokio::sync::RwLock::new(())).collect(),
        });
        let listener = {
            let _guard = rt.enter();
            TcpListener::from_std(listener)?
        };
        rt.block_on(shared.blocks.probe())?;
        rt.block_on(async { reap_orphans(&shared, shared.meta.orphans().await?).await })
            .map_err(std::io::Error::from)?;
        let sweeper = shared.clone();
        rt.spawn(async move {
            let every = SWEEP_EVERY.min(cfg.lease_ttl / 2);
            let mut tick = tokio::time::interval(every);
            let mut last_orphan_sweep = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                sweeper.leases.sweep().await;
                // A failure (storage down) leaves the orphan for the next
                // restart's reaping: nothing is lost but space.
                let _ = reap_closed(&sweeper).await;
                // On etcd, the orphans of an agent that died are freed by
                // whichever agent looks once its open marks expired.
                if etcd && last_orphan_sweep.elapsed() >= cfg.lease_ttl {
                    last_orphan_sweep = tokio::time::Instant::now();
                    if let Ok(orphans) = sweeper.meta.orphans().await {
                        let _ = reap_orphans(&sweeper, orphans).await;
                    }
                }
            }
        });
        rt.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((sock, _)) => {
                        tokio::spawn(serve_conn(shared.clone(), sock));
                    }
                    // Out of descriptors and the like: try again shortly
                    // rather than spin.
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        Ok(DistServer {
            rt: Some(rt),
            addr,
            leases,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The holders of `gfi` and the mode (for tests and diagnostics).
    pub fn holders(&self, gfi: proto::Gfi) -> Result<(Option<proto::LeaseMode>, HashSet<ClientId>)> {
        match &self.rt {
            Some(rt) => rt.block_on(self.leases.holders(gfi)),
            None => Err(Errno::ENOTCONN),
        }
    }
}

impl Drop for DistServer {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            self.leases.freeze();
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

async fn read_msg(rd: &mut OwnedReadHalf) -> std::io::Result<ClientMsg> {
    let mut prefix = [0u8; 4];
    rd.read_exact(&mut prefix).await?;
    let mut body = vec![0u8; proto::frame_len(prefix)?];
    rd.read_exact(&mut body).await?;
    proto::decode(&body)
}

async fn serve_conn(shared: Arc<Shared>, sock: TcpStream) {
    let _ = sock.set_nodelay(true);
    let peer = sock.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
    let (mut rd, wr) = sock.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<ServerMsg>();
    let writer = tokio::spawn(async move {
        let mut wr = BufWriter::new(wr);
        while let Some(msg) = rx.recv().await {
            let Ok(frame) = proto::encode(&msg) else { break };
            if wr.write_all(&frame).await.is_err() {
                return;
            }
            // Several queued messages go out in one write.
            if rx.is_empty() && wr.flush().await.is_err() {
                return;
            }
        }
    });
    let client = match read_msg(&mut rd).await {
        Ok(ClientMsg {
            id,
            req: Request::Hello { version, resume, name },
        }) if version == PROTOCOL_VERSION => {
            let session = match resume {
                Some(c) => shared.leases.resume(c, tx.clone()).await,
                None => shared.leases.open_session(tx.clone()).await,
            };
            let client = match session {
                Ok(c) => {
                    let how = match resume {
                        Some(r) if r == c => "session resumed",
                        Some(_) => "its session had expired: a new one",
                        None => "new session",
                    };
                    tracing::info!("distfs: client {} ({name}) connected from {peer}: {how}", c.0);
                    c
                }
                Err(e) => {
                    tracing::warn!("distfs: client ({name}) from {peer} refused: {e}");
                    let _ = tx.send(ServerMsg::Reply {
                        id,
                        reply: Reply::Err(e.raw()),
                    });
                    drop(tx);
                    let _ = writer.await;
                    return;
                }
            };
            let _ = tx.send(ServerMsg::Reply {
                id,
                reply: Reply::Welcome {
                    client,
                    node: shared.meta.node_id(),
                    block_size: shared.blocks.block_size(),
                    lease_ttl_ms: shared.leases.ttl().as_millis() as u64,
                },
            });
            if resume == Some(client) {
                shared.leases.resend_revocations(client);
            }
            client
        }
        Ok(ClientMsg { id, .. }) => {
            tracing::warn!("distfs: a client from {peer} speaks another protocol version (ours: {PROTOCOL_VERSION})");
            let _ = tx.send(ServerMsg::Reply {
                id,
                reply: Reply::Err(Errno::EPROTO.raw()),
            });
            drop(tx);
            let _ = writer.await;
            return;
        }
        Err(_) => return,
    };
    // Opens and closes are answered in the order they came (a client sends
    // its close without waiting, then may open again), one at a time by
    // their own task: an open waits for etcd (its open mark), and the
    // reader must not, or this client's renewals would wait behind it.
    let (oc_tx, mut oc_rx) = mpsc::unbounded_channel::<ClientMsg>();
    let opens = {
        let (shared, tx) = (shared.clone(), tx.clone());
        tokio::spawn(async move {
            while let Some(msg) = oc_rx.recv().await {
                let reply = match open_close(&shared, client, msg.req).await {
                    Ok(true) => {
                        let s = shared.clone();
                        // Data removal may take long: not in the queue.
                        tokio::spawn(async move { reap_closed(&s).await });
                        Reply::Ok
                    }
                    Ok(false) => Reply::Ok,
                    Err(e) => Reply::Err(e.raw()),
                };
                let _ = tx.send(ServerMsg::Reply { id: msg.id, reply });
            }
        })
    };
    while let Ok(msg) = read_msg(&mut rd).await {
        if let Request::Open { .. } | Request::Close { .. } = msg.req {
            let _ = oc_tx.send(msg);
            continue;
        }
        let shared = shared.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let reply = handle(&shared, client, msg.req)
                .await
                .unwrap_or_else(|e| Reply::Err(e.raw()));
            let _ = tx.send(ServerMsg::Reply { id: msg.id, reply });
        });
    }
    // The opens and closes that came before the end are done first.
    drop(oc_tx);
    let _ = opens.await;
    tracing::info!("distfs: client {} from {peer} disconnected", client.0);
    shared.leases.end_connection(client, &tx).await;
    let _ = reap_closed(&shared).await;
    drop(tx);
}

async fn handle(s: &Shared, client: ClientId, req: Request) -> Result<Reply> {
    let meta = &s.meta;
    Ok(match req {
        Request::Hello { .. } => return Err(Errno::EPROTO),
        Request::Heartbeat => {
            s.leases.renew(client).await?;
            Reply::Ok
        }
        Request::Lookup { parent, name } => Reply::Node(meta.lookup(parent, &name).await?),
        Request::GetAttr { ino } => Reply::Node(meta.getattr(ino).await?),
        Request::SetAttr { ino, change, lease } => {
            let gfi = meta.getattr(ino).await?.gfi;
            // Changing the size changes data: only the writer may.
            let _io = match (change.size, lease) {
                (None, _) | (Some(_), Some(NO_LEASE)) => None,
                (Some(_), Some(l)) => Some(s.leases.begin_io(client, gfi, l, true).await?),
                (Some(_), None) => return Err(Errno::EINVAL),
            };
            // A truncation is one step for direct readers and writers too.
            let _direct = match change.size {
                Some(_) => Some(s.direct_lock(gfi).write().await),
                None => None,
            };
            let (info, old_size) = meta.setattr(ino, &change).await?;
            if let Some(size) = change.size {
                // Marked first: a failed truncation may have changed some.
                s.changed_all(gfi);
                s.blocks.truncate(gfi, old_size, size).await?;
            }
            Reply::Node(info)
        }
        Request::Create {
            parent,
            name,
            kind,
            mode,
            uid,
            gid,
            open,
        } => {
            let new = Creation {
                parent,
                name: &name,
                kind,
                mode,
                uid,
                gid,
            };
            let info = match (&**meta, open) {
                (Metadata::Etcd(m), true) => create_open(s, m, client, new).await?,
                _ => {
                    let info = meta.create(new).await?;
                    if open {
                        open_file(s, client, info.gfi.ino).await?;
                    }
                    info
                }
            };
            Reply::Node(info)
        }
        Request::Open { .. } | Request::Close { .. } => {
            if open_close(s, client, req).await? {
                reap_closed(s).await?;
            }
            Reply::Ok
        }
        Request::Unlink { parent, name } => {
            let node = meta.node_id();
            let freed = meta.remove(parent, &name, false, |ino| is_open(s, node, ino)).await?;
            remove_data(s, freed).await?;
            Reply::Ok
        }
        Request::Rmdir { parent, name } => {
            meta.remove(parent, &name, true, |_| Ok(false)).await?;
            Reply::Ok
        }
        Request::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
        } => {
            let node = meta.node_id();
            let freed = meta
                .rename(parent, &name, new_parent, &new_name, flags, |ino| is_open(s, node, ino))
                .await?;
            remove_data(s, freed).await?;
            Reply::Ok
        }
        Request::Link {
            ino,
            new_parent,
            new_name,
        } => Reply::Node(meta.link(ino, new_parent, &new_name).await?),
        Request::Readlink { ino } => Reply::Data(meta.readlink(ino).await?),
        Request::ReadDir { ino } => Reply::Entries(meta.readdir(ino).await?),
        Request::Statfs => {
            let (blocks, bfree) = disk_space(&s.space, s.blocks.block_size());
            // No fixed inode table: as many free as a u32 counts, and the
            // total is used plus free (statfs(2) readers take it so).
            let ffree = u64::from(u32::MAX);
            Reply::Statfs {
                blocks,
                bfree,
                files: meta.count().await? + ffree,
                ffree,
                bsize: s.blocks.block_size(),
            }
        }
        Request::Acquire {
            gfi,
            mode,
            release,
            fetch,
            have,
            since,
        } => {
            if let Some(old) = release {
                s.leases.release(client, gfi, old).await;
            }
            let lease = s.leases.acquire(client, gfi, mode).await?;
            let attr = match meta.getattr(gfi.ino).await {
                Ok(info) => info.attr,
                Err(e) => {
                    s.leases.release(client, gfi, lease).await;
                    return Err(e);
                }
            };
            // Nobody else writes while this lease is held: the changes up
            // to now are all there are until the client gives it back.
            let (version, changed) = match s.versions() {
                Some(v) => (Some(v.now()), v.changed_since(gfi, since)),
                None => (None, Changed::All),
            };
            let mut blocks = Vec::new();
            if let Some((first, count)) = fetch.filter(|(_, n)| *n <= proto::MAX_GRANT_BLOCKS) {
                let needed: Vec<u64> = (first..first + u64::from(count))
                    .filter(|&i| have & (1 << (i - first)) == 0 || changed.contains(i))
                    .collect();
                if let (Some(&lo), Some(&hi)) = (needed.first(), needed.last()) {
                    // Under the new lease, as a ReadBlocks would be: a later
                    // grant to another client waits for this read.
                    let _io = s.leases.begin_io(client, gfi, lease, false).await?;
                    let got = s.blocks.get(gfi, lo, (hi - lo + 1) as u32).await?;
                    blocks = (lo..)
                        .zip(got)
                        .filter(|(i, _)| needed.contains(i))
                        .map(|(i, b)| (i, b.map(ByteBuf::from)))
                        .collect();
                }
            }
            let changed = match changed {
                Changed::All => None,
                Changed::Blocks(b) => Some(b),
            };
            Reply::Granted {
                lease,
                attr,
                version,
                changed,
                blocks,
            }
        }
        Request::Release { gfi, lease } => {
            s.leases.release(client, gfi, lease).await;
            Reply::Ok
        }
        Request::ReadBlocks {
            gfi,
            lease,
            first,
            count,
        } => {
            let _io = s.leases.begin_io_unless_unleased(client, gfi, lease, false).await?;
            let blocks = s.blocks.get(gfi, first, count).await?;
            Reply::Blocks(blocks.into_iter().map(|b| b.map(ByteBuf::from)).collect())
        }
        Request::WriteBlocks {
            gfi,
            lease,
            blocks,
            min_size,
            mtime,
            sync,
            release,
            step_down,
        } => {
            let io = s.leases.begin_io_unless_unleased(client, gfi, lease, true).await?;
            // A client's cache may outlive the file (unlinked elsewhere):
            // its blocks must not come back as garbage nobody removes.
            meta.getattr(gfi.ino).await?;
            // Data first, then the size that makes it visible.
            let written: Vec<u64> = blocks.iter().map(|(i, _)| *i).collect();
            let blocks = blocks.into_iter().map(|(i, b)| (i, b.into_vec())).collect();
            // Recorded before the blocks change (a failed put may have
            // changed some) and before the lease can move on.
            let version = s.versions().map(|mut v| match written.is_empty() {
                true => v.now(),
                false => v.wrote(gfi, written.iter().copied()),
            });
            s.blocks.put(gfi, blocks, false).await?;
            if let Some(earlier) = &sync {
                s.blocks.sync(gfi, &written).await?;
                s.blocks.sync(gfi, earlier).await?;
            }
            let info = meta
                .extend(gfi.ino, min_size, (!written.is_empty()).then_some(mtime))
                .await?;
            if sync.is_some() {
                s.meta.sync().await?;
            }
            // The write is over before a reader may join a stepped-down
            // lease (readers wait for no running I/O).
            drop(io);
            match (release, step_down) {
                (true, true) => s.leases.step_down(client, gfi, lease).await,
                (true, false) => s.leases.release(client, gfi, lease).await,
                (false, _) => {}
            }
            Reply::Written { info, version }
        }
        Request::StepDown { gfi, lease } => {
            s.leases.step_down(client, gfi, lease).await;
            Reply::Ok
        }
        Request::ReadDirect {
            gfi,
            lease,
            offset,
            len,
        } => {
            if len > proto::MAX_DIRECT {
                return Err(Errno::EINVAL);
            }
            let _io = s.leases.begin_io(client, gfi, lease, false).await?;
            let _direct = s.direct_lock(gfi).read().await;
            Reply::Bytes(ByteBuf::from(read_direct(s, gfi, offset, len).await?))
        }
        Request::WriteDirect {
            gfi,
            lease,
            offset,
            append,
            data,
            mtime,
        } => {
            if data.len() > proto::MAX_DIRECT as usize {
                return Err(Errno::EINVAL);
            }
            let _io = s.leases.begin_io(client, gfi, lease, true).await?;
            let _direct = s.direct_lock(gfi).write().await;
            write_direct(s, gfi, (!append).then_some(offset), &data, mtime).await?
        }
    })
}

/// [`Request::ReadDirect`]: the bytes the file holds now, cut at its size.
async fn read_direct(s: &Shared, gfi: proto::Gfi, offset: u64, len: u32) -> Result<Vec<u8>> {
    let size = s.meta.getattr(gfi.ino).await?.attr.size;
    let end = size.min(offset.saturating_add(u64::from(len)));
    if offset >= end {
        return Ok(Vec::new());
    }
    let bs = u64::from(s.blocks.block_size());
    let (first, last) = (offset / bs, (end - 1) / bs);
    let count = u32::try_from(last - first + 1).map_err(|_| Errno::EINVAL)?;
    let blocks = s.blocks.get(gfi, first, count).await?;
    let mut out = vec![0u8; (end - offset) as usize];
    for (i, block) in (first..).zip(blocks) {
        // A block holds its bytes up to the last written one; the rest of
        // it (and a missing block, a hole) reads as zeros.
        let Some(block) = block else { continue };
        let start = (i * bs).max(offset);
        let stop = (i * bs + block.len() as u64).min(end);
        if start < stop {
            let from = (start - i * bs) as usize;
            out[(start - offset) as usize..(stop - offset) as usize]
                .copy_from_slice(&block[from..from + (stop - start) as usize]);
        }
    }
    Ok(out)
}

/// [`Request::WriteDirect`]: blocks the write covers only in part are read
/// and merged here (under the file's direct lock, so that writers of other
/// bytes of the same block lose nothing), then the size grows to the end
/// of the write if it is shorter. At `offset`, or at the end (`None`).
async fn write_direct(
    s: &Shared,
    gfi: proto::Gfi,
    offset: Option<u64>,
    data: &[u8],
    mtime: (i64, u32),
) -> Result<Reply> {
    // A file removed elsewhere gets no blocks nobody would remove.
    let info = s.meta.getattr(gfi.ino).await?;
    if data.is_empty() {
        let version = s.versions().map(|v| v.now());
        return Ok(Reply::Written { info, version });
    }
    let size = info.attr.size;
    let offset = offset.unwrap_or(size);
    let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
    let bs = u64::from(s.blocks.block_size());
    let (first, last) = (offset / bs, (end - 1) / bs);
    let mut blocks = Vec::new();
    for i in first..=last {
        let (lo, hi) = ((i * bs).max(offset), ((i + 1) * bs).min(end));
        let whole = lo == i * bs && hi == (i + 1) * bs;
        // Bytes past the size are zeros whatever a block holds there.
        let mut block = match (whole, i * bs < size) {
            (false, true) => {
                let mut old = s.blocks.get(gfi, i, 1).await?.pop().flatten().unwrap_or_default();
                old.truncate((size - i * bs) as usize);
                old
            }
            _ => Vec::new(),
        };
        let within = (lo - i * bs) as usize;
        let n = (hi - lo) as usize;
        if block.len() < within + n {
            block.resize(within + n, 0);
        }
        block[within..within + n].copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
        blocks.push((i, block));
    }
    let version = s.versions().map(|mut v| v.wrote(gfi, first..=last));
    s.blocks.put(gfi, blocks, false).await?;
    let info = s.meta.extend(gfi.ino, end, Some(mtime)).await?;
    Ok(Reply::Written { info, version })
}

/// Whether `ino` is open somewhere (then its openers are saved: it is
/// about to be an orphan); called under the metadata lock, so the node id
/// is the caller's.
fn is_open(s: &Shared, node: u32, ino: u64) -> Result<bool> {
    s.leases.pin_if_open(proto::Gfi { node, ino })
}

/// Records that `client` holds `ino` open; `ENOENT` when the file was
/// freed before the record was made (removed meanwhile by another client).
async fn open_file(s: &Shared, client: ClientId, ino: u64) -> Result<()> {
    let gfi = proto::Gfi {
        node: s.meta.node_id(),
        ino,
    };
    s.leases.open_file(client, gfi)?;
    // Checked with the record: a removal from now on sees it open.
    if let Err(e) = s.meta.open_file(ino).await {
        let _ = s.leases.close_file(client, gfi).await;
        return Err(e);
    }
    Ok(())
}

/// A create that opens, on etcd: one transaction makes the file and its
/// open mark ([`EtcdMeta::create_open`]), after the opener's record here.
async fn create_open(s: &Shared, m: &EtcdMeta, client: ClientId, new: Creation<'_>) -> Result<proto::NodeInfo> {
    let node = m.node_id();
    let mut recorded = None;
    let record = |ino| {
        let gfi = proto::Gfi { node, ino };
        s.leases.open_file(client, gfi)?;
        recorded = Some(gfi);
        Ok(())
    };
    let created = m.create_open(new, record).await;
    if let (Err(_), Some(gfi)) = (&created, recorded) {
        let _ = s.leases.close_file(client, gfi).await;
    }
    created
}

/// [`Request::Open`] or [`Request::Close`]; returns whether a last opener
/// closed (orphans may be reaped).
async fn open_close(s: &Shared, client: ClientId, req: Request) -> Result<bool> {
    match req {
        Request::Open { ino } => open_file(s, client, ino).await.map(|()| false),
        Request::Close { ino } => {
            let node = s.meta.node_id();
            s.leases.close_file(client, proto::Gfi { node, ino }).await
        }
        _ => Err(Errno::EINVAL),
    }
}

/// Frees the orphans among the files whose last opener went away.
async fn reap_closed(s: &Shared) -> Result<()> {
    let closed = s.leases.take_closed();
    reap_orphans(s, closed.into_iter().map(|g| g.ino).collect()).await
}

async fn reap_orphans(s: &Shared, inos: Vec<u64>) -> Result<()> {
    let node = s.meta.node_id();
    for ino in inos {
        let gfi = proto::Gfi { node, ino };
        if s.meta.reap(ino, || s.leases.is_open(gfi)).await? {
            s.changed_all(gfi);
            s.blocks.remove_file(gfi).await?;
        }
    }
    Ok(())
}

async fn remove_data(s: &Shared, freed: crate::meta::Freed) -> Result<()> {
    let node = s.meta.node_id();
    for ino in freed.0 {
        s.changed_all(proto::Gfi { node, ino });
        s.blocks.remove_file(proto::Gfi { node, ino }).await?;
    }
    Ok(())
}

/// Total and free space of the file system holding the data directory, in
/// `block_size` units.
fn disk_space(dir: &std::path::Path, block_size: u32) -> (u64, u64) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return (0, 0);
    };
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a valid NUL-terminated string and `st` points to
    // writable memory the size of `struct statvfs`; it is read only when
    // the call succeeded and so filled it.
    let st = unsafe {
        if libc::statvfs(path.as_ptr(), st.as_mut_ptr()) != 0 {
            return (0, 0);
        }
        st.assume_init()
    };
    let unit = st.f_frsize;
    let bs = u64::from(block_size);
    (st.f_blocks * unit / bs, st.f_bavail * unit / bs)
}

/// `shortfuse dist up`: serves `cfg` in the foreground until `until`
/// returns (the CLI waits there for SIGINT or SIGTERM), then shuts down as
/// a dropped [`DistServer`] does. Prints the address it listens on (useful
/// with port 0) once clients can connect.
pub fn run_up(cfg: ServerConfig, until: impl FnOnce()) -> std::io::Result<()> {
    let mut what = match (&cfg.etcd[..], &cfg.data) {
        ([], Some(data)) => data.display().to_string(),
        ([], None) => String::new(),
        (etcd, _) => format!("etcd {}", etcd.join(",")),
    };
    if let Some(url) = &cfg.s3 {
        what.push_str(&format!(" (blocks in {})", crate::blocks::redact(url)));
    }
    let server = DistServer::start(cfg)?;
    println!("distfs: serving {what} on {}", server.addr());
    use std::io::Write;
    std::io::stdout().flush()?;
    until();
    drop(server);
    Ok(())
}
