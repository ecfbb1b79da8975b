//! Unmodified FUSE daemons on the rings (`shortfuse serve -- COMMAND`).
//!
//! The daemon (sshfs, bindfs, a go-fuse or fuser file system...) runs with
//! the preload shim in daemon mode: [`DAEMON_FD_VAR`] names its end of a
//! SOCK_SEQPACKET socket pair whose other end is the [`Bridge`] here. The
//! shim makes the daemon's /dev/fuse descriptor carry two streams: the
//! kernel's requests, and the ring clients' requests that the bridge sends
//! (their `unique` ids carry [`RING_UNIQUE`], which the kernel's never do).
//! The daemon's replies to those come back here by their id; its
//! notifications reach the kernel and, copied here, the ring clients'
//! caches; its reply to the kernel's INIT is copied here too, and answers
//! every ring client's INIT: one daemon, one negotiation, one set of node
//! ids (the server forgets, for clients that go, the lookups they made).
//!
//! Every message on the socket starts with a `u32` kind ([`MSG_REQUEST`]
//! one way; [`MSG_REPLY`], [`MSG_NOTIFY`], [`MSG_INIT`] the other), then
//! the FUSE message.
//!
//! A daemon that serves files by kernel passthrough (FOPEN_PASSTHROUGH)
//! sends the backing file with its reply to a ring client's OPEN or
//! CREATE; the bridge keeps it for the open handle, and the server lends
//! it to the client ([`Forward::backing`]), whose reads and writes then go
//! to the backing file as the kernel mount's do, not through the daemon.
//!
//! A daemon that dies closes its end: every call waiting for it fails with
//! ENOTCONN at once, and so do the calls after. A reply that is not a
//! well-formed FUSE reply fails the call it answers with EIO, nothing else.

use shortfuse::sync::lock;
use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use shortfuse::{BackingFile, Errno, FileHandle, Filesystem, NodeId, Outcome, ReleaseArgs, Request};
use shortfuse_abi as abi;
use zerocopy::{FromBytes, IntoBytes};

use crate::client::Notice;
use crate::server::{build, error_reply as error, Announcer, DirectJob};
use crate::sys;

/// The environment variable that puts the shim in daemon mode: the number
/// of the daemon's descriptor of its socket to the bridge.
pub const DAEMON_FD_VAR: &str = "SHORTFUSE_DAEMON_FD";
/// Marks the `unique` of a ring client's request on the daemon's descriptor.
pub const RING_UNIQUE: u64 = 1 << 63;
/// Bridge to daemon: a request of a ring client.
pub const MSG_REQUEST: u32 = 1;
/// Daemon to bridge: its reply to a ring request.
pub const MSG_REPLY: u32 = 2;
/// Daemon to bridge: a notification it wrote to the kernel.
pub const MSG_NOTIFY: u32 = 3;
/// Daemon to bridge: its reply to the kernel's INIT.
pub const MSG_INIT: u32 = 4;
/// The environment variable naming the daemon's ends of the reply lanes
/// (comma-separated descriptor numbers).
pub const DAEMON_LANES_VAR: &str = "SHORTFUSE_DAEMON_LANES";
/// Reply lanes: a forwarding thread waits on a socket pair of its own for
/// its reply, which the daemon's writing thread sends there directly: one
/// thread wake-up fewer than a reply read by the bridge's reader and handed
/// on. The lane is in bits 48..56 of a ring `unique` (0: no lane, the
/// shared socket).
pub const LANES: usize = 16;
/// Where a ring `unique` keeps its lane (1-based).
pub const LANE_SHIFT: u32 = 48;
/// Bridge to daemon: a ring client whose queues the daemon takes requests
/// from itself (direct path), with its memfd: a [`DirectClient`].
pub const MSG_CLIENT: u32 = 5;
/// Bridge to daemon: that client has gone (a `u64` id): take nothing more
/// from its queues.
pub const MSG_CLIENT_GONE: u32 = 6;
/// Marks, with [`RING_UNIQUE`], the `unique` of a request the daemon took
/// from a client's queue itself (direct path); the rest says which
/// client, queue and slot.
pub const DIRECT_UNIQUE: u64 = 1 << 62;
/// A direct client's doorbell while the daemon is awake (1: armed, the
/// daemon sleeps; 0: the client rang).
pub const DIRECT_AWAKE: u32 = 2;
/// The environment variable naming the daemon's end of the eventfd that
/// `serve` writes when a client rings a queue the sleeping daemon armed.
pub const DAEMON_BELL_VAR: &str = "SHORTFUSE_DAEMON_BELL";
/// The daemon's environment: how long (µs) its readers poll the clients'
/// queues, its /dev/fuse descriptor and the socket before they sleep
/// (`serve --daemon-spin-us`).
pub const DAEMON_SPIN_VAR: &str = "SHORTFUSE_DIRECT_SPIN_US";
/// `serve --daemon-spin-us` when not given.
pub const DEFAULT_DAEMON_SPIN_US: u64 = 20;
/// `0` in `serve`'s environment: the daemon's threads do not take the ring
/// clients' requests from their queues themselves (see
/// [`Forward::direct`]); every request then goes through `serve`'s
/// workers, as for a client of another user.
pub const DIRECT_VAR: &str = "SHORTFUSE_RING_DIRECT";
/// `1` in the daemon's environment (`serve --backing-handles`): the file
/// handle it answers OPEN with is its descriptor of the file's backing
/// file, whose bytes are the file's (bindfs, libfuse's passthrough
/// examples); a ring client's read-only open is then lent that file as a
/// kernel passthrough registration is.
pub const BACKING_HANDLES_VAR: &str = "SHORTFUSE_DAEMON_BACKING_HANDLES";
/// `0` in `serve`'s environment: the server keeps no names and
/// attributes of the daemon across programs (each program then looks
/// every name up itself, as before it kept them).
pub const KEEP_VAR: &str = "SHORTFUSE_RING_KEEP";
/// `0` in `serve`'s environment: what the server keeps is not shared with
/// the programs (their stats of names other programs looked up go to the
/// server again).
pub const SHARE_VAR: &str = "SHORTFUSE_RING_SHARE";

/// What the daemon is told of a direct client: its id and the shape of
/// its region (the memfd comes with the message).
#[derive(
    Clone, Copy, Debug, Default, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout,
)]
#[repr(C)]
pub struct DirectClient {
    pub id: u64,
    pub queues: u32,
    pub slots: u32,
    pub slot_data: u32,
    pub records: u32,
    /// The ids the client's process connected with; `root` (1): it may
    /// claim any. A request claiming other ids goes through `serve`, which
    /// checks them against everything the process held.
    pub uid: u32,
    pub gid: u32,
    pub root: u32,
    /// The daemon's user, and whether others are served (`allow_other`).
    pub owner: u32,
    pub allow_other: u32,
    /// Whether READDIRPLUS may be offered to the client.
    pub readdirplus: u32,
}

/// Daemon to bridge: a direct request it leaves to `serve` (a
/// [`DirectSlot`]): `serve` serves it as if its own worker had taken it.
pub const MSG_HANDOVER: u32 = 7;
/// Daemon to bridge: a direct request answered (a [`DirectDone`], then
/// the request, then the reply, under the client's own `unique`), for
/// `serve`'s bookkeeping; with the backing file of a passthrough OPEN.
pub const MSG_DONE: u32 = 8;
/// Daemon to bridge: it holds no request of client (`u64` id) any more,
/// after a [`MSG_CLIENT_GONE`]: every [`MSG_DONE`] of it came before.
pub const MSG_GONE_ACK: u32 = 9;
/// Daemon to bridge: how many requests of each opcode it answered for
/// direct clients alone since the last such message (pairs of `u32`
/// opcode and `u32` count).
pub const MSG_COUNTS: u32 = 10;
/// In a [`MSG_COUNTS`] pair in place of an opcode: the count is bytes of
/// the daemon's replies to direct clients gathered into a buffer before
/// the client's slot (replies `serve` is told of too).
pub const COUNT_COPIED: u32 = u32::MAX;
/// Daemon to bridge: [`MSG_DONE`]s (and the message that was sent with
/// them) kept back so that they wake `serve` once: `u32` kind, `u32`
/// length and the message, one after another.
pub const MSG_BATCH: u32 = 11;
/// [`DirectDone::flags`]: `serve` hands the reply to the client (after
/// telling the other clients and the kernel mount of the change).
pub const DONE_COMPLETE: u32 = 1;

/// Where a direct request lies: client, queue and slot.
#[derive(
    Clone, Copy, Debug, Default, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout,
)]
#[repr(C)]
pub struct DirectSlot {
    pub id: u64,
    pub queue: u32,
    pub slot: u32,
}

/// What comes before the request and reply of a [`MSG_DONE`].
#[derive(
    Clone, Copy, Debug, Default, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout,
)]
#[repr(C)]
pub struct DirectDone {
    pub at: DirectSlot,
    /// The process the client says sent it.
    pub pid: u32,
    pub req_len: u32,
    pub flags: u32,
    pub padding: u32,
}

/// The lane (0-based) a ring `unique` names, if any.
pub fn lane_of(unique: u64) -> Option<usize> {
    let l = ((unique >> LANE_SHIFT) & 0xff) as usize;
    (unique & RING_UNIQUE != 0 && (1..=LANES).contains(&l)).then(|| l - 1)
}

/// Something that serves FUSE request bytes as they are (see
/// [`crate::Server::start_forward`]).
pub trait Forward: Send + Sync + 'static {
    /// Serves one request of a ring client, INIT included; `reply` gets the
    /// whole reply, or stays empty with [`Outcome::NoReply`] (FORGET).
    fn forward(&self, req: &[u8], reply: &mut Vec<u8>) -> Outcome;

    /// The backing file the daemon serves open handle `fh` of `node` from
    /// by kernel passthrough, if it does.
    fn backing(&self, node: u64, fh: u64) -> Option<BackingFile> {
        let _ = (node, fh);
        None
    }

    /// Whether the daemon takes the requests of `client` (its region
    /// `memfd`) from its queues itself; then the server relays the
    /// client's doorbell to the sleeping daemon ([`Forward::bell`]) and
    /// does what the daemon leaves to it ([`crate::server::DirectJob`]).
    fn direct(&self, client: &DirectClient, memfd: std::os::fd::BorrowedFd<'_>) -> bool {
        let _ = (client, memfd);
        false
    }

    /// Direct client `id` has gone: returns once the daemon holds none of
    /// its requests any more (and `serve` was told what it answered), or
    /// the daemon is gone, or after a bound.
    fn direct_gone(&self, id: u64) {
        let _ = id;
    }

    /// Whether the daemon has gone (its socket closed).
    fn daemon_gone(&self) -> bool {
        false
    }

    /// The eventfd that wakes the daemon for a direct client's request.
    fn bell(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// A direct client rang while no thread of the daemon looked at the
    /// queues, and the server wrote [`Forward::bell`] (counted).
    fn rung(&self) {}
}

/// A reply of the daemon, and the descriptor that came with it.
type Got = Result<(Vec<u8>, Option<OwnedFd>), i32>;

/// One call waiting for the daemon's reply.
#[derive(Default)]
struct Waiter {
    reply: Mutex<Option<Got>>,
    ready: Condvar,
}

impl Waiter {
    fn give(&self, r: Got) {
        *lock(&self.reply) = Some(r);
        self.ready.notify_one();
    }

    fn wait(&self) -> Got {
        let mut g = lock(&self.reply);
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = self.ready.wait(g).unpoison();
        }
    }
}

/// Our end of a reply lane, and a buffer for its messages.
struct Lane {
    index: usize,
    sock: OwnedFd,
    buf: Vec<u8>,
}

/// The serving side of the socket to a daemon under the shim.
pub struct Bridge {
    sock: OwnedFd,
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Arc<Waiter>>>,
    init: Mutex<Option<abi::fuse_init_out>>,
    init_seen: Condvar,
    gone: AtomicBool,
    /// The largest READ/WRITE payload the rings carry.
    max_io: u32,
    announcer: Mutex<Option<Announcer>>,
    /// The daemon's /dev/fuse descriptor (passed with its INIT reply):
    /// what the ring clients change is told to its kernel mount through it.
    /// Dropped when the daemon goes: a copy left open would keep its dead
    /// connection from being aborted.
    kernel: Mutex<Option<OwnedFd>>,
    /// The reply lanes free now.
    lanes: Mutex<Vec<Lane>>,
    /// The backing files of open handles the daemon serves by kernel
    /// passthrough, by (node, handle).
    lent: Mutex<HashMap<(u64, u64), BackingFile>>,
    /// Whether ring clients may list with READDIRPLUS where the daemon
    /// agreed to it (`-o readdirplus=no` keeps them on READDIR).
    readdirplus: bool,
    /// The eventfd that wakes the daemon for a direct client (set when the
    /// daemon takes ring requests from the queues itself).
    bell: std::sync::OnceLock<OwnedFd>,
    /// Requests `serve`'s threads passed to the daemon over the socket.
    relayed: AtomicU64,
    /// Requests the daemon took from the clients' queues itself.
    taken: AtomicU64,
    /// Bytes of the daemon's direct replies it gathered before the slot.
    copied: AtomicU64,
    /// Requests the daemon took whose answers `serve` was told of
    /// ([`MSG_DONE`]).
    told: AtomicU64,
    /// Times a direct client's ring woke the daemon through its eventfd.
    woken: AtomicU64,
    /// Messages the daemon sent about requests it took ([`MSG_DONE`],
    /// [`MSG_HANDOVER`], [`MSG_BATCH`]): each wakes the reader.
    heard: AtomicU64,
    /// Answers `serve` handed to the client on the reader itself.
    at_once: AtomicU64,
    /// Direct clients the daemon let go of ([`MSG_GONE_ACK`]).
    acked: Mutex<std::collections::HashSet<u64>>,
    acked_seen: Condvar,
}

impl Bridge {
    /// A bridge on `sock` (the other end goes to the daemon) with reply
    /// lanes `lanes` (ours of each pair; at most [`LANES`]); `max_io` as
    /// the server's [`crate::ServerConfig::max_io`]; `readdirplus` whether
    /// ring clients list with READDIRPLUS where the daemon agreed to it.
    pub fn new(sock: OwnedFd, lanes: Vec<OwnedFd>, max_io: u32, readdirplus: bool) -> Arc<Bridge> {
        let lanes = lanes
            .into_iter()
            .take(LANES)
            .enumerate()
            .map(|(index, sock)| Lane {
                index,
                sock,
                buf: Vec::new(),
            })
            .collect();
        Arc::new(Bridge {
            sock,
            next: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            init: Mutex::new(None),
            init_seen: Condvar::new(),
            gone: AtomicBool::new(false),
            max_io,
            announcer: Mutex::new(None),
            kernel: Mutex::new(None),
            lanes: Mutex::new(lanes),
            lent: Mutex::new(HashMap::new()),
            readdirplus,
            bell: std::sync::OnceLock::new(),
            relayed: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            copied: AtomicU64::new(0),
            told: AtomicU64::new(0),
            woken: AtomicU64::new(0),
            heard: AtomicU64::new(0),
            at_once: AtomicU64::new(0),
            acked: Mutex::new(std::collections::HashSet::new()),
            acked_seen: Condvar::new(),
        })
    }

    /// The daemon takes its ring clients' requests from their queues
    /// itself; `bell` (ours of the eventfd it sleeps on) wakes it.
    pub fn set_direct(&self, bell: OwnedFd) {
        let _ = self.bell.set(bell);
    }

    /// Where the daemon's notifications go once the server runs.
    pub fn attach(&self, announcer: Announcer) {
        *lock(&self.announcer) = Some(announcer);
    }

    /// Whether the daemon has gone (its end of the socket closed).
    pub fn gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// Waits until the daemon has answered the kernel's INIT (true), or has
    /// gone, or `timeout` passed (false).
    pub fn wait_init(&self, timeout: Duration) -> bool {
        let g = lock(&self.init);
        let (g, _) = self
            .init_seen
            .wait_timeout_while(g, timeout, |i| i.is_none() && !self.gone())
            .unpoison();
        g.is_some()
    }

    /// Reads the daemon's messages until it goes; run it on a thread of its
    /// own. Then every waiting call fails with ENOTCONN.
    pub fn run(&self) {
        let mut buf = vec![0u8; self.max_io as usize + 2 * 4096];
        loop {
            let (n, passed) = match sys::recv(self.sock.as_fd(), &mut buf) {
                Ok((0, _)) | Err(_) => break,
                Ok(got) => got,
            };
            if n < 4 {
                continue;
            }
            let kind = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let msg = &buf[4..n];
            if matches!(kind, MSG_HANDOVER | MSG_DONE | MSG_BATCH) {
                self.heard.fetch_add(1, Ordering::Relaxed);
            }
            if kind == MSG_BATCH {
                let mut rest = msg;
                while let (Some(head), Some(len)) = (rest.get(..4), rest.get(4..8)) {
                    let kind = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
                    let len = u32::from_ne_bytes([len[0], len[1], len[2], len[3]]) as usize;
                    let Some(one) = rest.get(8..8 + len) else {
                        break;
                    };
                    if kind != MSG_BATCH {
                        self.message(kind, one, None);
                    }
                    rest = &rest[8 + len..];
                }
                continue;
            }
            self.message(kind, msg, passed);
        }
        self.gone.store(true, Ordering::SeqCst);
        lock(&self.kernel).take();
        let waiting = std::mem::take(&mut *lock(&self.pending));
        for w in waiting.values() {
            w.give(Err(libc::ENOTCONN));
        }
        let _g = lock(&self.init);
        self.init_seen.notify_all();
        drop(_g);
        let _g = lock(&self.acked);
        self.acked_seen.notify_all();
    }

    /// One message of the daemon (`kind`, then `msg`), with the descriptor
    /// `passed` with it.
    fn message(&self, kind: u32, msg: &[u8], passed: Option<OwnedFd>) {
        match kind {
            MSG_REPLY => self.reply(msg, passed),
            MSG_NOTIFY => self.notified(msg),
            MSG_HANDOVER => {
                if let (Ok((at, _)), Some(a)) = (DirectSlot::read_from_prefix(msg), lock(&self.announcer).clone()) {
                    a.direct_job(at.id, DirectJob::Handover(at.queue as usize, at.slot as usize));
                }
            }
            MSG_DONE => self.direct_done(msg, passed),
            MSG_COUNTS => {
                if let Some(a) = lock(&self.announcer).clone() {
                    for pair in msg.chunks_exact(8) {
                        let opcode = u32::from_ne_bytes([pair[0], pair[1], pair[2], pair[3]]);
                        let n = u32::from_ne_bytes([pair[4], pair[5], pair[6], pair[7]]);
                        if opcode == COUNT_COPIED {
                            self.copied.fetch_add(u64::from(n), Ordering::Relaxed);
                            continue;
                        }
                        a.stats()
                            .record_untimed(opcode, shortfuse::Transport::Ring, u64::from(n));
                        self.taken.fetch_add(u64::from(n), Ordering::Relaxed);
                    }
                }
            }
            MSG_GONE_ACK => {
                if let Some(id) = msg.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes) {
                    lock(&self.acked).insert(id);
                    self.acked_seen.notify_all();
                }
            }
            MSG_INIT => {
                if let Some(fd) = passed {
                    *lock(&self.kernel) = Some(fd);
                }
                if let Some(out) = msg.get(16..).and_then(init_out) {
                    *lock(&self.init) = Some(out);
                    self.init_seen.notify_all();
                }
            }
            _ => {}
        }
    }

    /// A direct request the daemon answered: the backing file of a
    /// passthrough OPEN is lent, the kernel mount told of a change, and
    /// the rest (bookkeeping, other clients, the answer where `serve`
    /// gives it) goes to the client's job thread.
    fn direct_done(&self, msg: &[u8], passed: Option<OwnedFd>) {
        let Ok((d, rest)) = DirectDone::read_from_prefix(msg) else {
            return;
        };
        let Some((req, reply)) = rest.split_at_checked(d.req_len as usize) else {
            return;
        };
        let Ok(h) = abi::parse_header(req) else {
            return;
        };
        if let Some(file) = passed {
            self.lend(h, reply, file);
        }
        if reply.get(4..8) == Some(&[0; 4]) {
            self.tell_kernel(req);
        }
        self.taken.fetch_add(1, Ordering::Relaxed);
        self.told.fetch_add(1, Ordering::Relaxed);
        if let Some(a) = lock(&self.announcer).clone() {
            let at_once = a.direct_job(
                d.at.id,
                DirectJob::Done {
                    queue: d.at.queue as usize,
                    slot: d.at.slot as usize,
                    pid: d.pid,
                    complete: d.flags & DONE_COMPLETE != 0,
                    req: req.to_vec(),
                    reply: reply.to_vec(),
                },
            );
            if at_once {
                self.at_once.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn reply(&self, msg: &[u8], passed: Option<OwnedFd>) {
        let Ok((h, _)) = abi::fuse_out_header::read_from_prefix(msg) else {
            return;
        };
        if let Some(w) = lock(&self.pending).remove(&h.unique) {
            w.give(Ok((msg.to_vec(), passed)));
        }
    }

    /// A notification the daemon sent the kernel: the ring clients drop
    /// what they cached of the node or name.
    fn notified(&self, msg: &[u8]) {
        let Some(a) = lock(&self.announcer).clone() else {
            return;
        };
        let Ok((h, body)) = abi::fuse_out_header::read_from_prefix(msg) else {
            return;
        };
        match h.error as u32 {
            abi::FUSE_NOTIFY_INVAL_INODE => {
                if let Ok((n, _)) = abi::fuse_notify_inval_inode_out::read_from_prefix(body) {
                    a.notify_all(Notice::Inode(n.ino));
                }
            }
            abi::FUSE_NOTIFY_STORE => {
                if let Ok((n, _)) = abi::fuse_notify_store_out::read_from_prefix(body) {
                    a.notify_all(Notice::Inode(n.nodeid));
                }
            }
            abi::FUSE_NOTIFY_INVAL_ENTRY => {
                if let Ok((n, name)) = abi::fuse_notify_inval_entry_out::read_from_prefix(body) {
                    if let Some(name) = name.get(..n.namelen as usize) {
                        a.notify_all(Notice::Entry { parent: n.parent, name });
                    }
                }
            }
            abi::FUSE_NOTIFY_DELETE => {
                if let Ok((n, name)) = abi::fuse_notify_delete_out::read_from_prefix(body) {
                    if let Some(name) = name.get(..n.namelen as usize) {
                        a.notify_all(Notice::Entry { parent: n.parent, name });
                        a.notify_all(Notice::Inode(n.child));
                    }
                }
            }
            _ => {}
        }
    }

    /// Tells the daemon's kernel mount what request `req` of a ring client
    /// changed, now that the daemon has done it: the kernel drops the names
    /// and attributes it cached (and the written file's pages), as the
    /// daemon itself would with INVAL_ENTRY and INVAL_INODE, so programs on
    /// the kernel mount see the change at once rather than when the
    /// daemon's timeouts run out. Nodes and names the kernel does not hold
    /// are nothing to drop (ENOENT, ignored).
    fn tell_kernel(&self, req: &[u8]) {
        use abi::Operation as O;
        let Ok(r) = abi::parse(req) else {
            return;
        };
        let kernel = lock(&self.kernel);
        let Some(fd) = kernel.as_ref() else {
            return;
        };
        let node = r.header.nodeid;
        let entry = |parent: u64, name: &std::ffi::OsStr| inval_entry(fd, parent, name.as_bytes());
        let inode = |ino: u64, off: i64, len: i64| inval_inode(fd, ino, off, len);
        match r.op {
            O::Create { name, .. }
            | O::Mknod { name, .. }
            | O::Mkdir { name, .. }
            | O::Symlink { name, .. }
            | O::Unlink { name }
            | O::Rmdir { name } => entry(node, name),
            O::Link { arg, name } => {
                entry(node, name);
                inode(arg.oldnodeid, -1, 0);
            }
            O::Rename { arg, name, new_name } => {
                entry(node, name);
                entry(arg.newdir, new_name);
            }
            O::Rename2 { arg, name, new_name } => {
                entry(node, name);
                entry(arg.newdir, new_name);
            }
            O::Write { arg, .. } => inode(node, arg.offset as i64, i64::from(arg.size)),
            O::Setattr { .. } | O::Fallocate { .. } => inode(node, 0, 0),
            O::CopyFileRange { arg } => inode(arg.nodeid_out, arg.off_out as i64, arg.len as i64),
            _ => {}
        }
    }

    /// A ring client's INIT, answered with what the daemon negotiated with
    /// the kernel, within what the client offers and the rings carry.
    fn init(&self, req: &[u8], unique: u64, reply: &mut Vec<u8>) -> Outcome {
        let Some(daemon) = *lock(&self.init) else {
            error(reply, unique, libc::ENOTCONN);
            return Outcome::Reply;
        };
        init_reply(&daemon, req, unique, self.max_io, self.readdirplus, reply);
        Outcome::Reply
    }

    /// Sends `req` as `id` on lane `lane` and waits there for its reply:
    /// a reply to another id (one the daemon answered twice) is skipped;
    /// the lane closing means the daemon went.
    fn call_on_lane(&self, lane: &mut Lane, req: &[u8], id: u64) -> Got {
        if self.send(req, id).is_err() {
            return Err(libc::ENOTCONN);
        }
        let want = self.max_io as usize + 2 * 4096;
        if lane.buf.len() < want {
            lane.buf.resize(want, 0);
        }
        loop {
            let (n, passed) = match sys::recv(lane.sock.as_fd(), &mut lane.buf) {
                Ok((0, _)) | Err(_) => return Err(libc::ENOTCONN),
                Ok(got) => got,
            };
            let Some(msg) = lane.buf.get(4..n) else {
                continue;
            };
            match abi::fuse_out_header::read_from_prefix(msg) {
                Ok((h, _)) if h.unique == id => return Ok((msg.to_vec(), passed)),
                _ => continue,
            }
        }
    }

    /// Sends `req` with the ring id `id` in place of its own.
    fn send(&self, req: &[u8], id: u64) -> io::Result<()> {
        let kind = MSG_REQUEST.to_ne_bytes();
        let id = id.to_ne_bytes();
        // fuse_in_header: len, opcode (8 bytes), then unique.
        let iov = [
            libc::iovec {
                iov_base: kind.as_ptr() as *mut libc::c_void,
                iov_len: 4,
            },
            libc::iovec {
                iov_base: req.as_ptr() as *mut libc::c_void,
                iov_len: 8,
            },
            libc::iovec {
                iov_base: id.as_ptr() as *mut libc::c_void,
                iov_len: 8,
            },
            libc::iovec {
                iov_base: req[16..].as_ptr() as *mut libc::c_void,
                iov_len: req.len() - 16,
            },
        ];
        sys::sendv(self.sock.as_fd(), &iov)
    }
}

/// How the ring clients' requests reached the daemon (`shortfuse stats`'
/// `daemon` group).
pub struct BridgeFigures(pub Arc<Bridge>);

impl shortfuse::stats::Figures for BridgeFigures {
    fn group(&self) -> &'static str {
        "daemon"
    }

    fn figures(&self) -> Vec<shortfuse::stats::Figure> {
        vec![
            shortfuse::stats::Figure {
                name: "relayed",
                value: self.0.relayed.load(Ordering::Relaxed),
                gauge: false,
                help: "Ring clients' requests that serve's threads passed to the daemon over its socket.",
            },
            shortfuse::stats::Figure {
                name: "taken",
                value: self.0.taken.load(Ordering::Relaxed),
                gauge: false,
                help: "Ring clients' requests the daemon's own threads took from the clients' queues.",
            },
            shortfuse::stats::Figure {
                name: "copied",
                value: self.0.copied.load(Ordering::Relaxed),
                gauge: false,
                help: "Bytes of the daemon's replies to those requests copied into a buffer on their way to the \
                       client (the replies serve is told of too; a READ's data goes straight to the client).",
            },
            shortfuse::stats::Figure {
                name: "told",
                value: self.0.told.load(Ordering::Relaxed),
                gauge: false,
                help: "Requests the daemon took whose answers it sent serve: lookups and opens, changes, flushes.",
            },
            shortfuse::stats::Figure {
                name: "heard",
                value: self.0.heard.load(Ordering::Relaxed),
                gauge: false,
                help: "Messages the daemon sent serve about the requests it took (answers told, requests handed \
                       over; several kept back and sent together count once): each wakes serve's reader.",
            },
            shortfuse::stats::Figure {
                name: "at_once",
                value: self.0.at_once.load(Ordering::Relaxed),
                gauge: false,
                help: "Answers of the daemon (changes, flushes) that serve noted, told and handed to the waiting \
                       client on the thread that read them, no other thread of serve woken.",
            },
            shortfuse::stats::Figure {
                name: "woken",
                value: self.0.woken.load(Ordering::Relaxed),
                gauge: false,
                help: "Times a ring client's request woke the daemon, no thread of which looked at the queues.",
            },
        ]
    }
}

/// The reply to a ring client's INIT `req` (id `unique`): what the daemon
/// negotiated with the kernel (`daemon`), within what the client offers
/// and the rings carry (`max_io`, READDIRPLUS only if `readdirplus`).
pub fn init_reply(
    daemon: &abi::fuse_init_out,
    req: &[u8],
    unique: u64,
    max_io: u32,
    readdirplus: bool,
    reply: &mut Vec<u8>,
) {
    let offered = req
        .get(std::mem::size_of::<abi::fuse_in_header>()..)
        .and_then(|b| abi::fuse_init_in::read_from_prefix(b).ok())
        .map_or(0, |(i, _)| u64::from(i.flags) | (u64::from(i.flags2) << 32));
    // What the clients implement and the daemon may have agreed to.
    let plus = if readdirplus { abi::FUSE_DO_READDIRPLUS } else { 0 };
    let known = abi::FUSE_ATOMIC_O_TRUNC | abi::FUSE_BIG_WRITES | abi::FUSE_MAX_PAGES | abi::FUSE_INIT_EXT | plus;
    let daemon_flags = u64::from(daemon.flags) | (u64::from(daemon.flags2) << 32);
    let flags = daemon_flags & offered & known;
    let max_write = daemon.max_write.clamp(4096, max_io);
    let out = abi::fuse_init_out {
        major: abi::FUSE_KERNEL_VERSION,
        minor: daemon.minor.min(abi::FUSE_KERNEL_MINOR_VERSION),
        max_readahead: daemon.max_readahead,
        flags: flags as u32,
        max_background: daemon.max_background,
        congestion_threshold: daemon.congestion_threshold,
        max_write,
        time_gran: daemon.time_gran,
        max_pages: (max_write / 4096).max(1) as u16,
        map_alignment: 0,
        flags2: (flags >> 32) as u32,
        ..abi::fuse_init_out::default()
    };
    reply.clear();
    let h = abi::fuse_out_header {
        len: (16 + std::mem::size_of::<abi::fuse_init_out>()) as u32,
        error: 0,
        unique,
    };
    reply.extend_from_slice(h.as_bytes());
    reply.extend_from_slice(out.as_bytes());
}

/// Writes notification `code` with `parts` to the kernel through `fd`.
fn notify_kernel(fd: &OwnedFd, code: u32, parts: &[&[u8]]) {
    let len = 16 + parts.iter().map(|p| p.len()).sum::<usize>();
    let h = abi::fuse_out_header {
        len: len as u32,
        error: code as i32,
        unique: 0,
    };
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(h.as_bytes());
    for p in parts {
        msg.extend_from_slice(p);
    }
    // The answer is nothing to act on: ENOENT when the kernel holds none of it.
    let _ = sys::write(fd.as_fd(), &msg);
}

fn inval_entry(fd: &OwnedFd, parent: u64, name: &[u8]) {
    let arg = abi::fuse_notify_inval_entry_out {
        parent,
        namelen: name.len() as u32,
        flags: 0,
    };
    notify_kernel(fd, abi::FUSE_NOTIFY_INVAL_ENTRY, &[arg.as_bytes(), name, &[0]]);
}

/// `off` < 0: the attributes only; `len` 0: to the end of the file.
fn inval_inode(fd: &OwnedFd, ino: u64, off: i64, len: i64) {
    let arg = abi::fuse_notify_inval_inode_out { ino, off, len };
    notify_kernel(fd, abi::FUSE_NOTIFY_INVAL_INODE, &[arg.as_bytes()]);
}

/// A daemon's init reply body (short ones, from older protocol minors,
/// are zero-extended).
pub fn init_out(b: &[u8]) -> Option<abi::fuse_init_out> {
    if b.len() < 8 {
        return None;
    }
    let mut out = abi::fuse_init_out::default();
    let n = b.len().min(std::mem::size_of::<abi::fuse_init_out>());
    out.as_mut_bytes()[..n].copy_from_slice(&b[..n]);
    Some(out)
}

/// Whether `msg` is a well-formed reply: its length as it says, an error
/// the kernel would accept, and nothing after an error.
fn well_formed(msg: &[u8]) -> bool {
    let Ok((h, _)) = abi::fuse_out_header::read_from_prefix(msg) else {
        return false;
    };
    h.len as usize == msg.len() && h.error <= 0 && h.error > -4096 && (h.error == 0 || msg.len() == 16)
}

impl Forward for Bridge {
    fn direct(&self, client: &DirectClient, memfd: std::os::fd::BorrowedFd<'_>) -> bool {
        if self.bell.get().is_none() || self.gone() {
            return false;
        }
        let mut c = *client;
        c.readdirplus = u32::from(self.readdirplus);
        let mut msg = MSG_CLIENT.to_ne_bytes().to_vec();
        msg.extend_from_slice(c.as_bytes());
        sys::send(self.sock.as_fd(), &msg, Some(memfd)).is_ok()
    }

    fn direct_gone(&self, id: u64) {
        let mut msg = MSG_CLIENT_GONE.to_ne_bytes().to_vec();
        msg.extend_from_slice(&id.to_ne_bytes());
        if sys::send(self.sock.as_fd(), &msg, None).is_err() {
            return;
        }
        // A daemon stuck in a call of this client's holds up only the
        // giving back of what the client held, and not for ever.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut acked = lock(&self.acked);
        while !acked.remove(&id) && !self.gone() {
            let now = std::time::Instant::now();
            if now >= deadline {
                tracing::warn!("the daemon still holds a request of a ring client that left");
                return;
            }
            acked = self.acked_seen.wait_timeout(acked, deadline - now).unpoison().0;
        }
    }

    fn daemon_gone(&self) -> bool {
        self.gone()
    }

    fn bell(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.bell.get().map(|b| b.as_fd())
    }

    fn rung(&self) {
        self.woken.fetch_add(1, Ordering::Relaxed);
    }

    fn backing(&self, node: u64, fh: u64) -> Option<BackingFile> {
        lock(&self.lent).get(&(node, fh)).cloned()
    }

    fn forward(&self, req: &[u8], reply: &mut Vec<u8>) -> Outcome {
        reply.clear();
        let Ok(h) = abi::parse_header(req) else {
            return Outcome::NoReply;
        };
        if h.opcode == abi::FUSE_INIT {
            return self.init(req, h.unique, reply);
        }
        if h.opcode == abi::FUSE_RELEASE {
            self.released(h.nodeid, req);
        }
        let replies = abi::op_info(h.opcode).is_none_or(|i| i.reply);
        if self.gone() || req.len() < std::mem::size_of::<abi::fuse_in_header>() {
            if replies {
                error(reply, h.unique, libc::ENOTCONN);
                return Outcome::Reply;
            }
            return Outcome::NoReply;
        }
        self.relayed.fetch_add(1, Ordering::Relaxed);
        let seq = self.next.fetch_add(1, Ordering::Relaxed) & ((1 << LANE_SHIFT) - 1);
        let lane = if replies { lock(&self.lanes).pop() } else { None };
        if let Some(mut lane) = lane {
            let id = RING_UNIQUE | ((lane.index as u64 + 1) << LANE_SHIFT) | seq;
            let got = self.call_on_lane(&mut lane, req, id);
            if !matches!(got, Err(libc::ENOTCONN)) {
                lock(&self.lanes).push(lane);
            }
            return self.answer(req, h, got, reply);
        }
        let id = RING_UNIQUE | seq;
        let waiter = replies.then(|| {
            let w = Arc::new(Waiter::default());
            lock(&self.pending).insert(id, w.clone());
            w
        });
        if self.send(req, id).is_err() {
            lock(&self.pending).remove(&id);
            if replies {
                error(reply, h.unique, libc::ENOTCONN);
                return Outcome::Reply;
            }
            return Outcome::NoReply;
        }
        // The reader may have failed everyone just before we were listed.
        if self.gone() {
            if let Some(w) = lock(&self.pending).remove(&id) {
                w.give(Err(libc::ENOTCONN));
            }
        }
        let Some(w) = waiter else {
            return Outcome::NoReply;
        };
        self.answer(req, h, w.wait(), reply)
    }
}

impl Bridge {
    /// The reply to ring request `req` (header `h`) from what the daemon
    /// answered: its reply under the request's own id, or an error.
    fn answer(&self, req: &[u8], h: abi::fuse_in_header, got: Got, reply: &mut Vec<u8>) -> Outcome {
        match got {
            Ok((msg, passed)) if well_formed(&msg) => {
                if let Some(file) = passed {
                    self.lend(h, &msg, file);
                }
                reply.extend_from_slice(&msg);
                reply[8..16].copy_from_slice(&h.unique.to_ne_bytes());
                if msg[4..8] == [0; 4] {
                    self.tell_kernel(req);
                }
            }
            Ok(_) => {
                tracing::warn!(
                    "the daemon's reply to {} is not a well-formed FUSE reply: that call fails with EIO",
                    abi::opcode_name(h.opcode)
                );
                error(reply, h.unique, libc::EIO);
            }
            Err(e) => error(reply, h.unique, e),
        }
        Outcome::Reply
    }
}

impl Bridge {
    /// Keeps `file`, which came with the daemon's reply `msg` to request
    /// `h`, for the handle the reply opens, when it is a successful OPEN
    /// or CREATE reply served by kernel passthrough (anything else was a
    /// reply that only looked like one to the shim, and the descriptor is
    /// dropped).
    fn lend(&self, h: abi::fuse_in_header, msg: &[u8], file: OwnedFd) {
        let body = msg.get(16..).unwrap_or(&[]);
        let (node, open) = match h.opcode {
            abi::FUSE_OPEN => (h.nodeid, body),
            abi::FUSE_CREATE => match abi::fuse_entry_out::read_from_prefix(body) {
                Ok((e, rest)) => (e.nodeid, rest),
                Err(_) => return,
            },
            _ => return,
        };
        let Ok((o, _)) = abi::fuse_open_out::read_from_prefix(open) else {
            return;
        };
        if o.open_flags & abi::FOPEN_PASSTHROUGH != 0 && node != 0 {
            lock(&self.lent).insert((node, o.fh), Arc::new(file));
        }
    }

    /// A RELEASE of `node`'s handle going to the daemon: its backing file
    /// is no longer lent (what a client already holds keeps its own copy).
    fn released(&self, node: u64, req: &[u8]) {
        let arg = req
            .get(std::mem::size_of::<abi::fuse_in_header>()..)
            .and_then(|b| abi::fuse_release_in::read_from_prefix(b).ok());
        if let Some((r, _)) = arg {
            lock(&self.lent).remove(&(node, r.fh));
        }
    }
}

/// The calls the server makes on its own (releases and forgets for clients
/// that went, and for descriptions that closed), as requests to a
/// [`Forward`].
pub(crate) struct ForwardFs(pub Arc<dyn Forward>);

impl ForwardFs {
    fn call(&self, opcode: u32, node: NodeId, arg: &[u8]) {
        let mut req = Vec::new();
        build(&mut req, opcode, 1, node.0, &[arg]);
        let mut reply = Vec::new();
        self.0.forward(&req, &mut reply);
    }
}

impl Filesystem for ForwardFs {
    fn map_file(&self, node: NodeId, fh: FileHandle) -> shortfuse::Result<BackingFile> {
        self.0.backing(node.0, fh.0).ok_or(Errno::ENODEV)
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        self.call(abi::FUSE_FORGET, node, abi::fuse_forget_in { nlookup }.as_bytes());
    }

    fn release(&self, _req: &Request, node: NodeId, fh: FileHandle, args: &ReleaseArgs) -> shortfuse::Result<()> {
        let arg = abi::fuse_release_in {
            fh: fh.0,
            flags: args.flags.bits() as u32,
            release_flags: if args.flock_release {
                abi::FUSE_RELEASE_FLOCK_UNLOCK
            } else {
                0
            },
            lock_owner: args.lock_owner.unwrap_or(0),
        };
        self.call(abi::FUSE_RELEASE, node, arg.as_bytes());
        Ok(())
    }

    fn releasedir(
        &self,
        _req: &Request,
        node: NodeId,
        fh: FileHandle,
        flags: shortfuse::OpenFlags,
    ) -> shortfuse::Result<()> {
        let arg = abi::fuse_release_in {
            fh: fh.0,
            flags: flags.bits() as u32,
            release_flags: 0,
            lock_owner: 0,
        };
        self.call(abi::FUSE_RELEASEDIR, node, arg.as_bytes());
        Ok(())
    }
}
