//! The program's side: one connection to a daemon, shared by every thread
//! of the process. A call claims a free slot of the queue of the CPU it
//! runs on (any other queue's when those are busy), writes the request
//! there, publishes the slot's index in the queue, rings the doorbell if
//! the daemon's worker sleeps, then polls the slot's state for the reply
//! and sleeps on it once the spin budget is spent.
//!
//! The slot's state word is its completion flag (RFUSE's header-buffer
//! completion): a synchronous caller waits for its own reply, so a shared
//! completion queue would only add a hand-off between the thread that
//! reaps it and the thread that waits.
//!
//! A daemon that dies never answers: a sleeping caller wakes every
//! [`LIVENESS_PERIOD`] and asks the socket whether the daemon is still
//! there; when it is not, that call and every later one fail with
//! ENOTCONN.
//!
//! Nothing here takes a lock or allocates on the call path (beyond the
//! reply vector the caller passes): the preload shim calls it from inside
//! the system call it serves.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use shortfuse::Errno;
use shortfuse_abi as abi;
use zerocopy::{FromBytes, IntoBytes};

use crate::name_table::NameView;
use crate::proto::{
    AnchorAck, AnchorMsg, BackingMsg, BackingReply, EarlyMsg, Hello, NamesMsg, NodeMsg, WatchMsg, Welcome,
    ANCHOR_MAGIC, BACKING_MAGIC, CLAIM_MAGIC, EARLY_MAGIC, NAMES_MAGIC, NODE_MAGIC, WATCH_MAGIC,
};
use crate::region::{self, header, slot, Geometry, Region, DAEMON_GONE, MAGIC, RECORD, SLOT_HEADER, VERSION};
use crate::told::Told;
use crate::{sys, wait};

/// How often a caller sleeping for its reply checks that the daemon lives:
/// the bound on how long a call hangs after the daemon died.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(50);

/// What the daemon asks a client to forget (FUSE notifications).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice<'a> {
    /// FUSE_NOTIFY_INVAL_INODE: the node's attributes (and data) changed.
    Inode(u64),
    /// FUSE_NOTIFY_INVAL_ENTRY: the name in the directory changed.
    Entry { parent: u64, name: &'a [u8] },
    /// Notifications were lost (the ring overflowed): forget everything.
    All,
}

/// This process's id, stamped on every request so that a process forked
/// from a client (sharing its connection) hears of the other's changes:
/// refreshed in the child by a `pthread_atfork` handler, read without a
/// system call on the request path.
static PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn refresh_pid() {
    let pid = sys::getpid();
    PID.store(pid, Ordering::Relaxed);
    // Cookies of its own, unlike the parent's: an answer the parent gave
    // up waiting for is never taken for the child's.
    COOKIE.store(pid.wrapping_mul(0x9E37_79B1), Ordering::Relaxed);
    ANCHORING.store(false, Ordering::Relaxed);
}

/// This process's id, without a system call once known; kept right in
/// forked children as [`PID`] is.
pub fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            watch_forks();
            PID.load(Ordering::Relaxed)
        }
        pid => pid,
    }
}

/// Fills [`PID`] and has forked children refresh it.
fn watch_forks() {
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| sys::at_fork_child(refresh_pid));
    PID.store(sys::getpid(), Ordering::Relaxed);
}

/// Tells the ring that this process is a new one: for children made
/// without libc's fork (a raw clone system call), which skip the
/// `pthread_atfork` handler. Async-signal-safe.
pub fn after_fork() {
    refresh_pid();
}

/// The lowest number a descriptor the client keeps (its socket, the
/// namespace map's root) may take; 0: any. See [`keep_descriptors_from`].
static DESCRIPTOR_FLOOR: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Has every descriptor a later [`RingClient::connect_with`] keeps placed at
/// `floor` or above. The preload shim connects before the program runs,
/// when whatever the program opens next, and a shell's `exec 3<file`,
/// expects the low numbers free; with its descriptors moved out of their
/// way here it needs no fence of the low numbers while it connects (about
/// a hundred descriptors passed over a socket pair and closed again in
/// every new process).
pub fn keep_descriptors_from(floor: i32) {
    DESCRIPTOR_FLOOR.store(floor, Ordering::Relaxed);
}

/// `fd`, moved to the floor of [`keep_descriptors_from`] or above (as it
/// is when there is no floor, it already is above, or the move fails).
pub(crate) fn kept(fd: OwnedFd) -> OwnedFd {
    let floor = DESCRIPTOR_FLOOR.load(Ordering::Relaxed);
    if fd.as_raw_fd() >= floor {
        return fd;
    }
    sys::dup_from(fd.as_fd(), floor).unwrap_or(fd)
}

/// Set while a thread of this process sends anchors and waits for their
/// acknowledgement (cleared in a forked child, whose other threads are gone).
static ANCHORING: AtomicBool = AtomicBool::new(false);

/// The acknowledgement each batch of anchors asks for.
static COOKIE: AtomicU32 = AtomicU32::new(1);

/// How long [`RingClient::anchor`] waits for the daemon's answer.
const ANCHOR_WAIT: Duration = Duration::from_secs(5);

/// An open handle to give to the open file description of `description`
/// (see [`RingClient::anchor`]).
#[derive(Clone, Copy, Debug)]
pub struct Anchoring<'a> {
    pub node: u64,
    pub fh: u64,
    pub dir: bool,
    pub description: BorrowedFd<'a>,
}

/// A connection to a daemon's rings.
pub struct RingClient {
    region: Region,
    geo: Geometry,
    sock: OwnedFd,
    spin: Duration,
    dead: AtomicBool,
    /// Next notification record to read, and overflows seen (see `notices`).
    notify_head: AtomicU32,
    overflows: AtomicU32,
    /// The host directory the daemon's file system mirrors, when the
    /// daemon named one and we find it at that path (see
    /// [`crate::proto::SourceDir`]), with its device and inode numbers.
    source: Option<(Vec<u8>, u64, u64)>,
    /// The daemon's namespace map, if it granted it, and the only fsuid
    /// it serves (see [`NamesMsg`]).
    names: Option<(shortfuse::NamespaceMap, u32)>,
    /// The names and attributes the server keeps, when it shares them
    /// with this client (see [`crate::name_table`]), and the daemon's user.
    table: Option<(NameView, u32)>,
    /// Requests sent with the hello and the daemon's replies to them, each
    /// given once to the first [`RingClient::call`] of exactly that request
    /// (see [`crate::proto::EarlyMsg`]).
    early: std::sync::Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
    /// Whether `early` may hold a reply (a lock spared once it is empty).
    early_left: AtomicBool,
    /// Requests published in the queues, for tests of what reaches them.
    published: std::sync::atomic::AtomicU64,
}

fn errno(e: io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The daemon's answer to our hello: the region's shape, checked (every
/// offset the client computes from it lies inside the region), and the
/// daemon's spin budget in nanoseconds. Anything else is the daemon's
/// refusal, whose text is passed on.
pub fn decode_welcome(msg: &[u8]) -> io::Result<(Geometry, u64)> {
    let w = match Welcome::read_from_prefix(msg) {
        Ok((w, _)) if w.magic == MAGIC => w,
        _ => {
            return Err(invalid(format!(
                "the daemon refused the connection: {}",
                String::from_utf8_lossy(msg).trim()
            )))
        }
    };
    if w.version != VERSION {
        return Err(invalid(format!("ring protocol {} (we speak {VERSION})", w.version)));
    }
    let geo = w.geometry();
    geo.check().map_err(invalid)?;
    if w.len != geo.bytes() as u64 {
        return Err(invalid(format!("ring memory of {} bytes for geometry {geo:?}", w.len)));
    }
    Ok((geo, w.spin_ns))
}

impl RingClient {
    /// Connects to the daemon listening at `path` (see
    /// [`crate::socket_path`]) and maps the region it made for us.
    /// `SHORTFUSE_RING_SPIN_US`, when set, overrides the daemon's spin
    /// budget for this client.
    pub fn connect(path: &Path) -> io::Result<RingClient> {
        RingClient::connect_with(path, &[])
    }

    /// [`RingClient::connect`], handing the daemon `early` requests with the
    /// hello: those it answers there (a new process's INIT and root
    /// GETATTR) are answered again, without a round trip, to the first
    /// [`RingClient::call`] of the same bytes. `early` must be what this
    /// client's first calls will send, unique numbers included; anything
    /// else goes over the rings as usual.
    pub fn connect_with(path: &Path, early: &[Vec<u8>]) -> io::Result<RingClient> {
        let sock = sys::connect(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("no shortfuse daemon serves rings at {} ({e})", path.display()),
            )
        })?;
        let sock = kept(sock);
        watch_forks();
        let pid = std::process::id();
        let mut hello = Hello::new(pid).as_bytes().to_vec();
        for req in early {
            if hello.len() + req.len() > crate::proto::EARLY_ROOM {
                break;
            }
            hello.extend_from_slice(req);
        }
        sys::send(sock.as_fd(), &hello, None)?;
        let mut buf = vec![0u8; 512 + libc::PATH_MAX as usize];
        let (n, fd) = sys::recv(sock.as_fd(), &mut buf)?;
        let (geo, spin_ns) = decode_welcome(&buf[..n])?;
        let source = crate::proto::decode_source(&buf[..n])
            .filter(|&(path, dev, ino)| sys::same_dir(path, dev, ino))
            .map(|(path, dev, ino)| (path.to_vec(), dev, ino));
        let fd = fd.ok_or_else(|| invalid("the daemon passed no ring memory".into()))?;
        let region = Region::map(fd.as_fd(), geo.bytes())?;
        drop(fd);
        if region.u64_at(header::MAGIC).load(Ordering::Relaxed) != MAGIC {
            return Err(invalid("ring memory without the ring header".into()));
        }
        let (n, root) = sys::recv(sock.as_fd(), &mut buf)?;
        let owner = NamesMsg::read_from_prefix(&buf[..n]).map_or(u32::MAX, |(m, _)| m.uid);
        let names = match NamesMsg::read_from_prefix(&buf[..n]) {
            Ok((m, _)) if m.magic == NAMES_MAGIC => match (m.granted, root) {
                (1, Some(root)) => Some((
                    shortfuse::NamespaceMap {
                        root: std::sync::Arc::new(kept(root)),
                        no_xdev: m.no_xdev != 0,
                    },
                    m.uid,
                )),
                _ => None,
            },
            _ => return Err(invalid("the daemon sent no namespace answer".into())),
        };
        let (n, table) = sys::recv(sock.as_fd(), &mut buf)?;
        // A table we cannot map is only a cache we go without.
        let table = table.and_then(|fd| NameView::map(fd.as_fd()).ok()).map(|t| (t, owner));
        let answered = match EarlyMsg::read_from_prefix(&buf[..n]) {
            Ok((m, replies)) if m.magic == EARLY_MAGIC => crate::proto::fuse_messages(replies)
                .into_iter()
                .take(m.count as usize)
                .zip(early)
                .map(|(reply, req)| (req.clone(), reply.to_vec()))
                .collect::<Vec<_>>(),
            _ => return Err(invalid("the daemon sent no answer to the early requests".into())),
        };
        let spin = std::env::var("SHORTFUSE_RING_SPIN_US")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map_or(Duration::from_nanos(spin_ns), Duration::from_micros);
        Ok(RingClient {
            region,
            geo,
            sock,
            spin,
            dead: AtomicBool::new(false),
            notify_head: AtomicU32::new(0),
            overflows: AtomicU32::new(0),
            source,
            names,
            table,
            early_left: AtomicBool::new(!answered.is_empty()),
            early: std::sync::Mutex::new(answered),
            published: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The host directory the daemon's file system mirrors, as this
    /// process finds it (passthrough), if any.
    pub fn source(&self) -> Option<&[u8]> {
        self.source.as_ref().map(|(path, _, _)| path.as_slice())
    }

    /// What the welcome told that a process needs before its first request
    /// (see [`Told`]); `None` when the namespace map's root is not the
    /// source directory, which an image could then not open by itself.
    pub fn told(&self) -> Option<Told> {
        let names = match &self.names {
            None => None,
            Some((map, uid)) => {
                let (_, dev, ino) = self.source.as_ref()?;
                if sys::dir_id(map.root.as_fd()) != Some((*dev, *ino)) {
                    return None;
                }
                Some((map.no_xdev, *uid))
            }
        };
        Some(Told {
            source: self.source.clone(),
            names,
        })
    }

    /// The namespace map the daemon granted this client, with the only
    /// fsuid it may serve calls for.
    pub fn namespace_map(&self) -> Option<&(shortfuse::NamespaceMap, u32)> {
        self.names.as_ref()
    }

    /// The node `name` in `parent` names and its attributes, from the
    /// server's shared table, while both are valid there (the server
    /// takes an entry out before it tells anyone of a change to it). The
    /// node comes with no lookup of this client's: its id must never be
    /// sent to the daemon. Only for calls made as the daemon's user or
    /// root (`uid`): the server serves no other user this table is open to.
    pub fn shared_entry(&self, parent: u64, name: &[u8], uid: u32) -> Option<(u64, abi::fuse_attr)> {
        let (table, owner) = self.table.as_ref()?;
        if uid != *owner && uid != 0 {
            return None;
        }
        let found = table.name(parent, name)?;
        let attr = table.attr(found.node)?;
        Some((found.node, attr))
    }

    /// The listing of directory `dir` the server shares (records, see
    /// [`crate::listings::records`]), copied into `out`, while valid there
    /// (the server takes it out before it tells anyone of a change to the
    /// directory). Its entries carry no node. Only for calls made as the
    /// daemon's user or root (`uid`), as [`RingClient::shared_entry`].
    pub fn shared_listing(&self, dir: u64, uid: u32, out: &mut Vec<u8>) -> bool {
        match &self.table {
            Some((table, owner)) if uid == *owner || uid == 0 => table.listing(dir, out),
            _ => false,
        }
    }

    /// Whether the server shares its table of names with this client.
    pub fn has_shared_entries(&self) -> bool {
        self.table.is_some()
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// The largest request (or reply) one slot holds.
    pub fn max_message(&self) -> usize {
        self.geo.slot_data as usize
    }

    /// True once the daemon is known to be gone.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Asks the shared header and the socket whether the daemon lives.
    fn check_dead(&self) -> bool {
        if self.is_dead() {
            return true;
        }
        let gone = self.region.u32_at(header::DAEMON).load(Ordering::Acquire) == DAEMON_GONE
            || sys::peer_gone(self.sock.as_raw_fd());
        if gone {
            self.dead.store(true, Ordering::Relaxed);
        }
        gone
    }

    /// Claims a free slot, preferring the queue of this CPU.
    fn claim(&self) -> Result<(usize, usize), Errno> {
        let queues = self.geo.queues as usize;
        let first = sys::current_cpu() % queues;
        let mut rounds = 0u32;
        loop {
            for dq in 0..queues {
                let q = (first + dq) % queues;
                for i in 0..self.geo.slots as usize {
                    let st = self.region.u32_at(self.geo.slot_off(q, i));
                    if st.load(Ordering::Relaxed) == slot::FREE
                        && st
                            .compare_exchange(slot::FREE, slot::BUSY, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                    {
                        return Ok((q, i));
                    }
                }
            }
            rounds += 1;
            if rounds.is_multiple_of(1024) && self.check_dead() {
                return Err(Errno::ENOTCONN);
            }
            sys::sched_yield();
        }
    }

    /// Sends one FUSE request and waits for its reply, which replaces the
    /// contents of `reply` (left empty for requests without one). `Err`:
    /// the transport failed (ENOTCONN once the daemon is gone, E2BIG for a
    /// request larger than a slot, EIO for a reply that does not fit).
    pub fn call(&self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), Errno> {
        reply.clear();
        if self.early_left.load(Ordering::Relaxed) && self.early_reply(request, reply) {
            return Ok(());
        }
        let (q, i) = self.submit(request, slot::SUBMITTED)?;
        let off = self.geo.slot_off(q, i);
        let state = self.region.u32_at(off);
        let len = self.region.u32_at(off + 4);
        self.wait(state)?;
        let n = len.load(Ordering::Relaxed) as usize;
        let r = if n > self.geo.slot_data as usize {
            Err(Errno::EIO)
        } else {
            self.region.read_into(off + SLOT_HEADER, n, reply);
            Ok(())
        };
        state.store(slot::FREE, Ordering::Release);
        r
    }

    /// The reply the daemon gave with its welcome to exactly `request`,
    /// taken (each is given once).
    fn early_reply(&self, request: &[u8], reply: &mut Vec<u8>) -> bool {
        let mut early = self.early.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let found = early.iter().position(|(req, _)| req == request);
        if let Some(i) = found {
            *reply = early.swap_remove(i).1;
        }
        if early.is_empty() {
            self.early_left.store(false, Ordering::Relaxed);
        }
        found.is_some()
    }

    /// How many requests this client has published in its queues (those
    /// answered with the welcome are not).
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Sends one request without waiting for its reply, as the kernel
    /// sends RELEASE in the background: the daemon frees the slot once it
    /// has served it. Requests of one thread are served in the order they
    /// were sent only within a queue, so this suits requests that nothing
    /// later depends on. `Err`: as for [`RingClient::call`].
    pub fn send(&self, request: &[u8]) -> Result<(), Errno> {
        self.submit(request, slot::DETACHED).map(|_| ())
    }

    /// Claims a slot, writes `request` there with state `state` and
    /// publishes it in the slot's queue: (queue, slot).
    fn submit(&self, request: &[u8], state: u32) -> Result<(usize, usize), Errno> {
        if self.is_dead() || self.region.u32_at(header::DAEMON).load(Ordering::Relaxed) == DAEMON_GONE {
            self.dead.store(true, Ordering::Relaxed);
            return Err(Errno::ENOTCONN);
        }
        if request.len() > self.geo.slot_data as usize {
            return Err(Errno::E2BIG);
        }
        let (q, i) = self.claim()?;
        let off = self.geo.slot_off(q, i);
        self.region.write(off + SLOT_HEADER, request);
        self.region
            .u32_at(off + 4)
            .store(request.len() as u32, Ordering::Relaxed);
        self.region
            .u32_at(off + 8)
            .store(PID.load(Ordering::Relaxed), Ordering::Relaxed);
        self.region.u32_at(off).store(state, Ordering::Relaxed);
        self.published.fetch_add(1, Ordering::Relaxed);
        wait::note_cpu(self.region.u32_at(header::CALLER_CPU), wait::cpu_mark());
        let pos = self.region.u32_at(self.geo.tail_off(q)).fetch_add(1, Ordering::Relaxed);
        self.region
            .u32_at(self.geo.entry_off(q, pos))
            .store(region::entry(pos, i as u32), Ordering::Release);
        // Pairs with the worker's SeqCst store of 1 before its last look at
        // the queue: either it sees our entry or we see it asleep.
        fence(Ordering::SeqCst);
        let bell = self.region.u32_at(self.geo.doorbell_off(q));
        if bell.load(Ordering::Relaxed) == 1 && bell.swap(0, Ordering::SeqCst) == 1 {
            sys::futex_wake(bell, 1);
        }
        Ok((q, i))
    }

    /// Waits for DONE in the slot's state: spin, then sleep with a timeout
    /// that lets us notice a dead daemon.
    fn wait(&self, state: &std::sync::atomic::AtomicU32) -> Result<(), Errno> {
        // The thread that takes our requests on this CPU cannot answer
        // while we keep it.
        let taker = self.region.u32_at(header::TAKER_CPU).load(Ordering::Relaxed);
        let sharing = taker != 0 && taker == wait::cpu_mark();
        if wait::spin_until_sharing(self.spin, sharing, || state.load(Ordering::Acquire) == slot::DONE) {
            return Ok(());
        }
        loop {
            match state.compare_exchange(slot::SUBMITTED, slot::SLEEPING, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) | Err(slot::SLEEPING) => {}
                Err(slot::DONE) => return Ok(()),
                // Only the daemon writes the state meanwhile, and only DONE.
                Err(_) => {
                    self.dead.store(true, Ordering::Relaxed);
                    return Err(Errno::EIO);
                }
            }
            sys::futex_wait(state, slot::SLEEPING, Some(LIVENESS_PERIOD));
            if state.load(Ordering::Acquire) == slot::DONE {
                return Ok(());
            }
            if self.check_dead() {
                // The slot stays claimed: the region is useless now.
                return Err(Errno::ENOTCONN);
            }
        }
    }

    /// Gives open handles to the open file descriptions of their
    /// descriptors (an `AnchorMsg` each on the socket): the daemon then
    /// releases each when the kernel closes its description, in whichever
    /// process holds it last; the caller sends no RELEASE for them. Returns
    /// once the daemon has taken them all, so that the process may then end
    /// (or hand the descriptions on) without the handles going with it.
    pub fn anchor(&self, batch: &[Anchoring<'_>]) -> Result<(), Errno> {
        self.anchor_messages(batch, ANCHOR_MAGIC)
    }

    /// Tells the daemon that this connection holds the open file
    /// descriptions of `batch` (inherited at exec, anchored by another
    /// image), so that it may name their nodes (see
    /// [`crate::proto::CLAIM_MAGIC`]). Returns once the daemon has taken
    /// them all; a description it does not know is ignored.
    pub fn claim_descriptions(&self, batch: &[Anchoring<'_>]) -> Result<(), Errno> {
        self.anchor_messages(batch, CLAIM_MAGIC)
    }

    /// Sends `batch` as [`AnchorMsg`]s of `magic`, then waits for the
    /// acknowledgement of the last.
    fn anchor_messages(&self, batch: &[Anchoring<'_>], magic: u64) -> Result<(), Errno> {
        if batch.is_empty() {
            return Ok(());
        }
        self.on_socket(|cookie| {
            for (n, a) in batch.iter().enumerate() {
                let msg = AnchorMsg {
                    magic,
                    node: a.node,
                    fh: a.fh,
                    dir: u32::from(a.dir),
                    ack: if n + 1 == batch.len() { cookie } else { 0 },
                };
                sys::send(self.sock.as_fd(), msg.as_bytes(), Some(a.description)).map_err(errno)?;
            }
            self.answer(|msg, _| match AnchorAck::read_from_prefix(msg) {
                Ok((a, _)) if a.magic == ANCHOR_MAGIC && a.ack == cookie => Some(Ok(())),
                _ => None,
            })
        })
    }

    /// The daemon's descriptor of the backing file of open handle `fh` on
    /// `node` (see [`crate::proto::BackingMsg`]), for a shared memory map;
    /// `description`: the memfd of the open file description holding the
    /// handle, when it was given one. ENODEV when the file has no single
    /// backing file (a file system without one, or a cache in the daemon).
    pub fn backing_file(&self, node: u64, fh: u64, description: Option<BorrowedFd<'_>>) -> Result<OwnedFd, Errno> {
        self.on_socket(|cookie| {
            let msg = BackingMsg {
                magic: BACKING_MAGIC,
                node,
                fh,
                cookie,
                padding: 0,
            };
            sys::send(self.sock.as_fd(), msg.as_bytes(), description).map_err(errno)?;
            self.descriptor_answer(BACKING_MAGIC, cookie)
        })
    }

    /// An O_PATH descriptor of the kernel node standing for FIFO or device
    /// node `node` (see [`crate::proto::NodeMsg`]), which the program opens
    /// through `/proc/self/fd` with its own flags and credentials.
    pub fn kernel_node(&self, node: u64) -> Result<OwnedFd, Errno> {
        self.on_socket(|cookie| {
            let msg = NodeMsg {
                magic: NODE_MAGIC,
                node,
                cookie,
                padding: 0,
            };
            sys::send(self.sock.as_fd(), msg.as_bytes(), None).map_err(errno)?;
            self.descriptor_answer(NODE_MAGIC, cookie)
        })
    }

    /// An O_PATH descriptor of the daemon's mirror of node `node`, named
    /// `name` in directory `parent` (see [`crate::proto::WatchMsg`]), on
    /// which the program puts its inotify watch.
    pub fn watch_node(&self, node: u64, parent: u64, name: &[u8]) -> Result<OwnedFd, Errno> {
        self.on_socket(|cookie| {
            let msg = WatchMsg {
                magic: WATCH_MAGIC,
                node,
                parent,
                cookie,
                len: name.len() as u32,
            };
            let mut bytes = msg.as_bytes().to_vec();
            bytes.extend_from_slice(name);
            sys::send(self.sock.as_fd(), &bytes, None).map_err(errno)?;
            self.descriptor_answer(WATCH_MAGIC, cookie)
        })
    }

    /// The daemon's answer carrying `magic` and `cookie` (a
    /// [`BackingReply`] or [`crate::proto::NodeReply`]): its descriptor,
    /// or the errno it gives.
    fn descriptor_answer(&self, magic: u64, cookie: u32) -> Result<OwnedFd, Errno> {
        self.answer(|msg, fd| match BackingReply::read_from_prefix(msg) {
            Ok((r, _)) if r.magic == magic && r.cookie == cookie => Some(match (r.errno, fd) {
                (0, Some(fd)) => Ok(fd),
                (0, None) => Err(Errno::EIO),
                (e, _) => Err(Errno::from_raw(e as i32)),
            }),
            _ => None,
        })
    }

    /// Runs one exchange on the socket, alone (the answer read is ours),
    /// with a fresh non-zero cookie.
    fn on_socket<T>(&self, exchange: impl FnOnce(u32) -> Result<T, Errno>) -> Result<T, Errno> {
        if self.is_dead() {
            return Err(Errno::ENOTCONN);
        }
        while ANCHORING.swap(true, Ordering::Acquire) {
            sys::sched_yield();
        }
        // A forked child shares the socket: the lock keeps the other
        // processes' exchanges out of ours, or each would read (and skip)
        // the other's answers.
        sys::lock_file(self.sock.as_fd(), true);
        let cookie = loop {
            let c = COOKIE.fetch_add(1, Ordering::Relaxed);
            if c != 0 {
                break c;
            }
        };
        let r = exchange(cookie);
        sys::lock_file(self.sock.as_fd(), false);
        ANCHORING.store(false, Ordering::Release);
        r
    }

    /// Reads the daemon's messages until `take` recognises its answer
    /// (earlier answers that their callers gave up waiting for are
    /// skipped), for at most [`ANCHOR_WAIT`].
    fn answer<T>(&self, mut take: impl FnMut(&[u8], Option<OwnedFd>) -> Option<Result<T, Errno>>) -> Result<T, Errno> {
        let deadline = std::time::Instant::now() + ANCHOR_WAIT;
        let mut buf = [0u8; 64];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Errno::ETIMEDOUT);
            }
            if !sys::readable(self.sock.as_fd(), left.min(LIVENESS_PERIOD)) {
                if self.check_dead() {
                    return Err(Errno::ENOTCONN);
                }
                continue;
            }
            let (n, fd) = sys::recv(self.sock.as_fd(), &mut buf).map_err(errno)?;
            if n == 0 {
                self.dead.store(true, Ordering::Relaxed);
                return Err(Errno::ENOTCONN);
            }
            if let Some(r) = take(&buf[..n], fd) {
                return r;
            }
        }
    }

    /// Whether [`RingClient::notices`] would hand anything over: plain
    /// loads, no read-modify-write, so that a caller can leave a lock of
    /// its own untaken when nothing changed (every path call beneath a
    /// namespace map asks).
    pub fn notices_pending(&self) -> bool {
        let g = &self.geo;
        self.is_dead()
            || self.notify_head.load(Ordering::Relaxed)
                != self.region.u32_at(g.notify_tail_off()).load(Ordering::Acquire)
            || self.overflows.load(Ordering::Relaxed)
                != self.region.u32_at(g.notify_overflow_off()).load(Ordering::Acquire)
    }

    /// Hands every pending notification to `f`, oldest first (or
    /// [`Notice::All`] once the daemon is gone). Costs three loads when
    /// there is none. Invalidations are idempotent, so two
    /// threads draining at once at worst apply one twice.
    pub fn notices(&self, mut f: impl FnMut(Notice<'_>)) {
        // Nothing cached may be believed once the daemon is gone: the next
        // look at the cache asks it, and fails with ENOTCONN as it should.
        if self.is_dead() {
            f(Notice::All);
            return;
        }
        let g = &self.geo;
        let tail_word = self.region.u32_at(g.notify_tail_off());
        let tail = tail_word.load(Ordering::Acquire);
        let overflows = self.region.u32_at(g.notify_overflow_off()).load(Ordering::Acquire);
        // Every look at the cache comes here: plain loads when nothing is
        // new, no read-modify-write.
        if self.notify_head.load(Ordering::Relaxed) == tail && self.overflows.load(Ordering::Relaxed) == overflows {
            return;
        }
        // Our position is this process's (a forked child starts from its
        // parent's): processes sharing the connection each read every record.
        let head = self.notify_head.swap(tail, Ordering::Relaxed);
        let seen = self.overflows.swap(overflows, Ordering::Relaxed);
        if head == tail && overflows == seen {
            return;
        }
        let head_word = self.region.u32_at(g.notify_head_off());
        if overflows != seen || tail.wrapping_sub(head) > g.records {
            f(Notice::All);
            head_word.store(tail, Ordering::Release);
            return;
        }
        let mut rec = [0u8; RECORD];
        let me = PID.load(Ordering::Relaxed);
        let mut pos = head;
        while pos != tail {
            self.region.read(g.record_off(pos), &mut rec);
            match parse_record(&rec) {
                // Our own change: the VFS made its cache right already.
                Some((origin, _)) if origin == me => {}
                Some((_, n)) => f(n),
                None => f(Notice::All),
            }
            pos = pos.wrapping_add(1);
        }
        // The daemon paces itself on the head we publish; another process
        // of this connection may be behind us, and what the daemon wrote over
        // while it read is lost to it: then it forgets everything.
        if tail_word.load(Ordering::Acquire).wrapping_sub(head) > g.records {
            f(Notice::All);
        }
        head_word.store(tail, Ordering::Release);
    }
}

/// Decodes one notification record: `u32` length, `u32` pid of the process
/// whose request made the change (0: another connection's or the kernel's),
/// then the FUSE message. `None` for anything malformed.
pub(crate) fn parse_record(rec: &[u8]) -> Option<(u32, Notice<'_>)> {
    let len = u32::from_ne_bytes(rec.get(..4)?.try_into().ok()?) as usize;
    let origin = u32::from_ne_bytes(rec.get(4..8)?.try_into().ok()?);
    let msg = rec.get(8..8usize.checked_add(len)?)?;
    let (h, body) = abi::fuse_out_header::read_from_prefix(msg).ok()?;
    if h.unique != 0 || h.len as usize != msg.len() {
        return None;
    }
    match h.error as u32 {
        abi::FUSE_NOTIFY_INVAL_INODE => {
            let (n, _) = abi::fuse_notify_inval_inode_out::read_from_prefix(body).ok()?;
            Some((origin, Notice::Inode(n.ino)))
        }
        abi::FUSE_NOTIFY_INVAL_ENTRY => {
            let (n, rest) = abi::fuse_notify_inval_entry_out::read_from_prefix(body).ok()?;
            let name = rest.get(..n.namelen as usize)?;
            Some((origin, Notice::Entry { parent: n.parent, name }))
        }
        _ => None,
    }
}

/// Encodes a notification record into `rec` (cleared first); false when
/// the message does not fit a record (a name longer than NAME_MAX).
pub(crate) fn encode_record(rec: &mut Vec<u8>, origin: u32, notice: Notice<'_>) -> bool {
    rec.clear();
    rec.extend_from_slice(&[0; 8]);
    let hdr = std::mem::size_of::<abi::fuse_out_header>();
    let mut h = abi::fuse_out_header {
        len: 0,
        error: 0,
        unique: 0,
    };
    rec.extend_from_slice(h.as_bytes());
    match notice {
        Notice::Inode(ino) => {
            h.error = abi::FUSE_NOTIFY_INVAL_INODE as i32;
            let body = abi::fuse_notify_inval_inode_out { ino, off: 0, len: 0 };
            rec.extend_from_slice(body.as_bytes());
        }
        Notice::Entry { parent, name } => {
            h.error = abi::FUSE_NOTIFY_INVAL_ENTRY as i32;
            let body = abi::fuse_notify_inval_entry_out {
                parent,
                namelen: name.len() as u32,
                flags: 0,
            };
            rec.extend_from_slice(body.as_bytes());
            rec.extend_from_slice(name);
            rec.push(0);
        }
        Notice::All => return false,
    }
    if rec.len() > RECORD {
        return false;
    }
    let msg_len = rec.len() - 8;
    h.len = msg_len as u32;
    rec[8..8 + hdr].copy_from_slice(h.as_bytes());
    rec[..4].copy_from_slice(&(msg_len as u32).to_ne_bytes());
    rec[4..8].copy_from_slice(&origin.to_ne_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let mut rec = Vec::new();
        assert!(encode_record(&mut rec, 42, Notice::Inode(7)));
        rec.resize(RECORD, 0);
        assert_eq!(parse_record(&rec), Some((42, Notice::Inode(7))));
        assert!(encode_record(
            &mut rec,
            0,
            Notice::Entry {
                parent: 1,
                name: b"abc"
            }
        ));
        rec.resize(RECORD, 0);
        assert_eq!(
            parse_record(&rec),
            Some((
                0,
                Notice::Entry {
                    parent: 1,
                    name: b"abc"
                }
            ))
        );
        assert!(!encode_record(
            &mut rec,
            0,
            Notice::Entry {
                parent: 1,
                name: &[b'x'; 600]
            }
        ));
        let mut bad = [0xffu8; RECORD];
        assert_eq!(parse_record(&bad), None);
        bad[..4].copy_from_slice(&40u32.to_ne_bytes());
        assert_eq!(parse_record(&bad), None);
    }
}
