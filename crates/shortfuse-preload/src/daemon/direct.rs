//! The direct path: the daemon's reads take ring clients' requests from
//! their queues themselves, and its writes put the replies in the
//! clients' slots, so a request costs the rings' own hop plus the
//! daemon's work, without `shortfuse serve`'s thread and two sockets in
//! between (the kernel mount's path has the same two threads).
//!
//! `serve` passes each client's memfd (`MSG_CLIENT`), with the ids its
//! process connected with; it relays a client's doorbell to the daemon's
//! eventfd only while the daemon sleeps (it arms the bells first). What
//! `serve` keeps doing for these clients it is told of in order on the
//! socket, the reply to the client never waiting for it where nothing
//! else may see the change first:
//! - reads, stats, listings: answered here alone;
//! - lookups and opens: answered here, and `serve` told (`MSG_DONE`, kept
//!   back for the next message, see `later`) so that what a client that
//!   goes held is given back;
//! - changes (create, write, unlink...): `serve` hands the reply over,
//!   once it told the other clients, the kernel mount and the watches;
//!   so it does for READDIRPLUS, whose entries without a node it may fill
//!   in from the names it keeps across programs;
//! - FLUSH: `serve` hands the reply over once it let the caller's POSIX
//!   locks on the file go, whatever the answer; but while no client ever
//!   asked for a lock (`serve` says so in each region's header) there are
//!   none, and the daemon answers alone;
//! - a lookup, open, listing or change that failed: answered here alone,
//!   as it hands out and changes nothing;
//! - everything else (releases, locks, a caller whose ids are not those
//!   it connected with): handed to `serve` whole (`MSG_HANDOVER`), which
//!   checks and serves it as it serves any client.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use shortfuse::sync::lock;
use shortfuse_abi as abi;
use shortfuse_ring::foreign::{
    init_out, init_reply, DirectClient, DirectDone, DirectSlot, COUNT_COPIED, DAEMON_BELL_VAR, DIRECT_AWAKE,
    DIRECT_UNIQUE, DONE_COMPLETE, MSG_COUNTS, MSG_DONE, MSG_GONE_ACK, MSG_HANDOVER, RING_UNIQUE,
};
use shortfuse_ring::region::{entry_slot, header, slot, Region, SLOT_HEADER};
use shortfuse_ring::Geometry;
use zerocopy::{FromBytes, IntoBytes};

use crate::sys::{fs, raw};

/// Who answers a request of a direct client, and who hands the answer over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// The daemon; nobody else needs to know.
    Daemon,
    /// The daemon; `serve` is told first (what the client now holds).
    Settle,
    /// The daemon; `serve` hands the reply over (a change others must see).
    Serve,
    /// `serve`, whole.
    Handover,
}

/// Who answers a request with `opcode`.
fn route(opcode: u32) -> Route {
    match opcode {
        abi::FUSE_GETATTR
        | abi::FUSE_READ
        | abi::FUSE_READDIR
        | abi::FUSE_STATFS
        | abi::FUSE_ACCESS
        | abi::FUSE_GETXATTR
        | abi::FUSE_LISTXATTR
        | abi::FUSE_READLINK
        | abi::FUSE_LSEEK
        | abi::FUSE_FSYNC
        | abi::FUSE_FSYNCDIR => Route::Daemon,
        abi::FUSE_LOOKUP | abi::FUSE_OPEN | abi::FUSE_OPENDIR => Route::Settle,
        // `serve` may fill in the nodes of entries that came without one
        // from the names it keeps across programs.
        abi::FUSE_READDIRPLUS => Route::Serve,
        // FLUSH: `serve` lets the caller's POSIX locks go.
        abi::FUSE_FLUSH => Route::Serve,
        op if abi::changes_file_system(op) => Route::Serve,
        // Releases, and the forgets that may follow them: the client sends
        // a RELEASE without waiting, and the daemon must not see a FORGET
        // of a node before the release of its last handle (libfuse aborts).
        _ => Route::Handover,
    }
}

/// Whether client `c` may send request `h` without `serve`'s full check:
/// it claims the ids it connected with (or connected as root), and it is
/// the daemon's user or others are served, as `serve` decides.
fn plainly_allowed(c: &DirectClient, h: &abi::fuse_in_header) -> bool {
    let own = c.root != 0 || (h.uid == c.uid && h.gid == c.gid && h.total_extlen == 0);
    let letting_go = matches!(h.opcode, abi::FUSE_FORGET | abi::FUSE_BATCH_FORGET | abi::FUSE_FLUSH);
    own && (h.uid == c.owner || c.allow_other != 0 || letting_go)
}

/// A request taken and not answered yet.
#[derive(Clone, Default)]
struct Taken {
    /// The client's own `unique`.
    unique: u64,
    pid: u32,
    /// The request, for `serve` (Settle and Serve only).
    req: Vec<u8>,
    serve: bool,
}

/// One client whose queues we take from.
struct Client {
    info: DirectClient,
    region: Region,
    geo: Geometry,
    /// The next position to look at, per queue.
    heads: Vec<u32>,
    /// Per slot (queue-major).
    taken: Vec<Option<Taken>>,
    /// How many requests the daemon holds.
    held: usize,
    /// `serve` said it went: nothing more is taken, and once nothing is
    /// held it is told so and the client dropped.
    gone: bool,
}

static CLIENTS: Mutex<Vec<Client>> = Mutex::new(Vec::new());
/// What the daemon answered the kernel's INIT.
static INIT: Mutex<Option<abi::fuse_init_out>> = Mutex::new(None);
/// Our end of the eventfd `serve` writes for a rung bell; -1: no direct path.
static BELL: AtomicI32 = AtomicI32::new(-1);
/// Whether some client is registered (a read looks at the queues at all).
static ANY: AtomicU32 = AtomicU32::new(0);
/// Requests answered here alone, by opcode, not yet counted by `serve`.
static COUNTS: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];
/// A count that reaches this is sent at once (else when a reader sleeps).
const COUNT_BATCH: u32 = 1024;

/// Counts a request answered here alone.
fn count(opcode: u32) {
    if let Some(c) = COUNTS.get(opcode as usize) {
        if c.fetch_add(1, Ordering::Relaxed) + 1 >= COUNT_BATCH {
            flush_counts();
        }
    }
}

/// Tells `serve` what was answered here alone since the last time.
pub fn flush_counts() {
    let mut msg = Vec::new();
    for (op, c) in COUNTS.iter().enumerate() {
        let n = c.swap(0, Ordering::Relaxed);
        if n > 0 {
            msg.extend_from_slice(&(op as u32).to_ne_bytes());
            msg.extend_from_slice(&n.to_ne_bytes());
        }
    }
    let mut copied = COPIED.swap(0, Ordering::Relaxed);
    while copied > 0 {
        let n = copied.min(u64::from(u32::MAX)) as u32;
        msg.extend_from_slice(&COUNT_COPIED.to_ne_bytes());
        msg.extend_from_slice(&n.to_ne_bytes());
        copied -= u64::from(n);
    }
    if !msg.is_empty() {
        super::later::now(MSG_COUNTS, &[&msg], None);
    }
}

/// The largest READ/WRITE payload a ring carries (as `serve`'s default).
const MAX_IO: u32 = 1 << 20;
/// How long a reader polls the queues before it sleeps.
const SPIN: std::time::Duration = std::time::Duration::from_micros(shortfuse_ring::foreign::DEFAULT_DAEMON_SPIN_US);

/// At start-up: takes the eventfd [`DAEMON_BELL_VAR`] names.
pub fn setup(floor: i64) {
    let Some(fd) = std::env::var(DAEMON_BELL_VAR).ok().and_then(|v| v.parse::<i64>().ok()) else {
        return;
    };
    let high = fs::fcntl_int(fd as i32, libc::F_DUPFD_CLOEXEC, floor);
    fs::close(fd as i32);
    if high >= 0 {
        BELL.store(high as i32, Ordering::Relaxed);
    }
}

/// Our eventfd, if the direct path is on.
pub fn bell() -> Option<i32> {
    let b = BELL.load(Ordering::Relaxed);
    (b >= 0).then_some(b)
}

/// Whether a reader should look at client queues.
pub fn active() -> bool {
    ANY.load(Ordering::Relaxed) != 0
}

/// How long a reader polls before it sleeps.
pub fn spin() -> std::time::Duration {
    static US: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    US.get_or_init(|| {
        std::env::var(shortfuse_ring::foreign::DAEMON_SPIN_VAR)
            .ok()
            .and_then(|v| v.parse().ok())
    })
    .map_or(SPIN, std::time::Duration::from_micros)
}

/// A client `serve` hands us: `body` a [`DirectClient`], `fd` its memfd.
pub fn add(body: &[u8], fd: i32) {
    // SAFETY: a descriptor passed to us alone, owned from here.
    let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let Ok((info, _)) = DirectClient::read_from_prefix(body) else {
        return;
    };
    let geo = Geometry {
        queues: info.queues,
        slots: info.slots,
        slot_data: info.slot_data,
        records: info.records,
    };
    let Ok(region) = geo
        .check()
        .and_then(|_| Region::map(std::os::fd::AsFd::as_fd(&owned), geo.bytes()).map_err(|e| e.to_string()))
    else {
        return;
    };
    let start = if ELSEWHERE.load(Ordering::Relaxed) {
        1
    } else {
        DIRECT_AWAKE
    };
    for q in 0..geo.queues as usize {
        region.u32_at(geo.doorbell_off(q)).store(start, Ordering::SeqCst);
    }
    let mut all = lock(&CLIENTS);
    all.push(Client {
        info,
        region,
        geo,
        heads: vec![0; geo.queues as usize],
        taken: vec![None; geo.total_slots()],
        held: 0,
        gone: false,
    });
    ANY.store(1, Ordering::Relaxed);
}

/// Client `id` has gone: nothing more is taken from its queues; once the
/// daemon answered what it holds of it, `serve` is told.
pub fn remove(id: u64) {
    let mut all = lock(&CLIENTS);
    if let Some(c) = all.iter_mut().find(|c| c.info.id == id) {
        c.gone = true;
    }
    drop_gone(&mut all);
}

/// Drops the clients that went and whose requests were all answered,
/// telling `serve` (after every `MSG_DONE` of theirs).
fn drop_gone(all: &mut Vec<Client>) {
    all.retain(|c| {
        if c.gone && c.held == 0 {
            flush_counts();
            super::later::now(MSG_GONE_ACK, &[&c.info.id.to_ne_bytes()], None);
            return false;
        }
        true
    });
    ANY.store(u32::from(!all.is_empty()), Ordering::Relaxed);
}

/// The daemon's reply to the kernel's INIT (the whole message).
pub fn init_seen(msg: &[u8]) {
    if let Some(out) = msg.get(16..).and_then(init_out) {
        *lock(&INIT) = Some(out);
    }
}

fn unique_of(id: u64, q: usize, i: usize) -> u64 {
    RING_UNIQUE | DIRECT_UNIQUE | ((id & 0xf_ffff) << 40) | ((q as u64 & 0xf_ffff) << 20) | (i as u64 & 0xf_ffff)
}

fn decode(unique: u64) -> (u64, usize, usize) {
    (
        (unique >> 40) & 0xf_ffff,
        ((unique >> 20) & 0xf_ffff) as usize,
        (unique & 0xf_ffff) as usize,
    )
}

/// Whether `unique` is one of ours: a ring request's (which a daemon may
/// tell by that bit), taken from the queues here.
pub fn is_direct(unique: u64) -> bool {
    unique & (RING_UNIQUE | DIRECT_UNIQUE) == RING_UNIQUE | DIRECT_UNIQUE
}

/// Tells `serve` what the daemon answered to request `t` in slot `i` of
/// queue `q` of `c` (`reply` under the client's own id).
fn tell_done(c: &Client, q: usize, i: usize, t: &Taken, reply: &[u8], lent: Option<i32>) {
    let d = DirectDone {
        at: DirectSlot {
            id: c.info.id,
            queue: q as u32,
            slot: i as u32,
        },
        pid: t.pid,
        req_len: t.req.len() as u32,
        flags: if t.serve { DONE_COMPLETE } else { 0 },
        padding: 0,
    };
    let parts = [d.as_bytes(), &t.req[..], reply];
    if t.serve || lent.is_some() {
        super::later::now(MSG_DONE, &parts, lent);
    } else {
        // Nothing waits for `serve` here: the client has its answer.
        super::later::later(MSG_DONE, &parts);
    }
}

/// The next request of a direct client for the daemon, handed over by
/// `deliver` (which copies it into the daemon's buffer: its length, or
/// None when it does not fit). Requests the daemon must not see (INIT,
/// DESTROY) are answered here, and those `serve` answers handed to it.
pub fn take(mut deliver: impl FnMut(&[u8]) -> Option<i64>) -> Option<i64> {
    super::later::send(false);
    let mut all = lock(&CLIENTS);
    let mut req = Vec::new();
    for c in all.iter_mut().filter(|c| !c.gone) {
        for q in 0..c.geo.queues as usize {
            loop {
                let head = c.heads[q];
                let e = c.region.u32_at(c.geo.entry_off(q, head)).load(Ordering::Acquire);
                let Some(i) = entry_slot(head, e) else {
                    break;
                };
                c.heads[q] = head.wrapping_add(1);
                let i = i as usize;
                if i >= c.geo.slots as usize {
                    continue;
                }
                let off = c.geo.slot_off(q, i);
                let len = c.region.u32_at(off + 4).load(Ordering::Acquire) as usize;
                if !(std::mem::size_of::<abi::fuse_in_header>()..=c.geo.slot_data as usize).contains(&len) {
                    finish(c, q, i, &[]);
                    continue;
                }
                req.resize(len, 0);
                c.region.read(off + SLOT_HEADER, &mut req);
                let Ok(h) = abi::parse_header(&req) else {
                    finish(c, q, i, &[]);
                    continue;
                };
                let mut reply = Vec::new();
                match h.opcode {
                    abi::FUSE_INIT => {
                        count(h.opcode);
                        match *lock(&INIT) {
                            Some(d) => init_reply(
                                &d,
                                &req,
                                h.unique,
                                MAX_IO.min(c.geo.slot_data.saturating_sub(4096)),
                                c.info.readdirplus != 0,
                                &mut reply,
                            ),
                            None => error(&mut reply, h.unique, libc::ENOTCONN),
                        }
                        finish(c, q, i, &reply);
                        continue;
                    }
                    abi::FUSE_DESTROY => {
                        error(&mut reply, h.unique, libc::EPERM);
                        finish(c, q, i, &reply);
                        continue;
                    }
                    _ => {}
                }
                let way = if plainly_allowed(&c.info, &h) {
                    match route(h.opcode) {
                        // No lock was ever taken on the rings: a close lets
                        // none go, and `serve` has nothing to do for it.
                        Route::Serve
                            if h.opcode == abi::FUSE_FLUSH
                                && c.region.u32_at(header::LOCKS).load(Ordering::Acquire) == 0 =>
                        {
                            Route::Daemon
                        }
                        way => way,
                    }
                } else {
                    Route::Handover
                };
                if way == Route::Handover {
                    let at = DirectSlot {
                        id: c.info.id,
                        queue: q as u32,
                        slot: i as u32,
                    };
                    if super::later::now(MSG_HANDOVER, &[at.as_bytes()], None) < 0 {
                        error(&mut reply, h.unique, libc::ENOTCONN);
                        finish(c, q, i, &reply);
                    }
                    continue;
                }
                let pid = c.region.u32_at(off + 8).load(Ordering::Relaxed);
                // Where each side waits for the other (see `poll`, and the
                // client's wait).
                let me = shortfuse_ring::wait::cpu_mark();
                shortfuse_ring::wait::note_cpu(c.region.u32_at(header::TAKER_CPU), me);
                CALLER.set(c.region.u32_at(header::CALLER_CPU).load(Ordering::Relaxed));
                let replies = abi::op_info(h.opcode).is_none_or(|o| o.reply);
                let t = Taken {
                    unique: h.unique,
                    pid,
                    req: if way == Route::Daemon { Vec::new() } else { req.clone() },
                    serve: way == Route::Serve,
                };
                if !replies {
                    // FORGET: nothing comes back; `serve` counts it now.
                    if way != Route::Daemon {
                        tell_done(c, q, i, &t, &[], None);
                    }
                } else {
                    c.taken[q * c.geo.slots as usize + i] = Some(t);
                    c.held += 1;
                }
                req[8..16].copy_from_slice(&unique_of(c.info.id, q, i).to_ne_bytes());
                let Some(n) = deliver(&req) else {
                    if replies {
                        answer(c, q, i, None, None);
                    }
                    continue;
                };
                if !replies {
                    finish(c, q, i, &[]);
                }
                if way == Route::Daemon {
                    count(h.opcode);
                }
                return Some(n);
            }
        }
    }
    None
}

fn error(reply: &mut Vec<u8>, unique: u64, errno: i32) {
    reply.clear();
    reply.extend_from_slice(&16u32.to_ne_bytes());
    reply.extend_from_slice(&(-errno).to_ne_bytes());
    reply.extend_from_slice(&unique.to_ne_bytes());
}

/// Answers the request held in slot `i` of queue `q` of `c` with the
/// daemon's reply, the bytes of `parts` in order (None, or a malformed
/// reply: EIO for that call alone), by the request's route.
fn answer(c: &mut Client, q: usize, i: usize, parts: Option<&[&[u8]]>, lent: Option<i32>) {
    let Some(t) = c.taken.get_mut(q * c.geo.slots as usize + i).and_then(Option::take) else {
        return;
    };
    c.held -= 1;
    let mut refused = Vec::new();
    let parts = match parts {
        Some(p) if well_formed(p) && total(p) <= c.geo.slot_data as usize => p,
        _ => {
            error(&mut refused, t.unique, libc::EIO);
            &[&refused[..]][..]
        }
    };
    let opcode = abi::parse_header(&t.req).map_or(0, |h| h.opcode);
    if t.req.is_empty() || nothing_to_tell(opcode, parts) {
        if !t.req.is_empty() {
            count(opcode);
        }
        // `serve` sees nothing of it: from the daemon's buffers to the slot.
        if !c.gone {
            finish_parts(c, q, i, parts, Some(t.unique));
        }
        return;
    }
    // `serve` gets the reply too: gathered once, into a buffer of this
    // thread's that the next reply reuses.
    GATHERED.with(|g| {
        let mut reply = g.borrow_mut();
        reply.clear();
        for p in parts {
            reply.extend_from_slice(p);
        }
        reply[8..16].copy_from_slice(&t.unique.to_ne_bytes());
        COPIED.fetch_add(reply.len() as u64, Ordering::Relaxed);
        let by_handle = match lent {
            Some(_) => None,
            None => super::backing::lent_by_handle(&t.req, &mut reply),
        };
        tell_done(c, q, i, &t, &reply, lent.or(by_handle));
        if let Some(fd) = by_handle {
            fs::close(fd);
        }
        if !t.serve && !c.gone {
            finish(c, q, i, &reply);
        }
    });
}

thread_local! {
    /// Where a reply `serve` must see too is gathered (see `answer`).
    static GATHERED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Bytes of replies gathered into a buffer of ours before the client's
/// slot, not yet counted by `serve`.
static COPIED: AtomicU64 = AtomicU64::new(0);

fn total(parts: &[&[u8]]) -> usize {
    parts.iter().map(|p| p.len()).sum()
}

/// Whether `serve` has nothing to do for a request with `opcode` that the
/// daemon answered with `reply` (a well-formed reply, in parts): a lookup,
/// open or change that failed hands out nothing and changes nothing, so
/// `serve` would only count it (and hand the reply over); a FLUSH lets
/// the caller's POSIX locks go whatever its answer. Each such message
/// wakes two of `serve`'s threads, on a machine where the program and the
/// daemon want the CPUs.
fn nothing_to_tell(opcode: u32, reply: &[&[u8]]) -> bool {
    let mut head = [0u8; 8];
    for (d, s) in head.iter_mut().zip(reply.iter().flat_map(|p| p.iter())) {
        *d = *s;
    }
    opcode != abi::FUSE_FLUSH && head[4..8] != [0; 4]
}

/// Writes `reply` in slot `i` of queue `q` and hands it back to the client.
fn finish(c: &Client, q: usize, i: usize, reply: &[u8]) {
    finish_parts(c, q, i, &[reply], None);
}

/// Writes the bytes of `parts` in slot `i` of queue `q` (the header's
/// `unique` replaced by `unique`, if given) and hands them back to the
/// client.
fn finish_parts(c: &Client, q: usize, i: usize, parts: &[&[u8]], unique: Option<u64>) {
    let off = c.geo.slot_off(q, i);
    let state = c.region.u32_at(off);
    if state.load(Ordering::Acquire) == slot::DETACHED
        && state
            .compare_exchange(slot::DETACHED, slot::FREE, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        return;
    }
    let mut at = off + SLOT_HEADER;
    for p in parts {
        c.region.write(at, p);
        at += p.len();
    }
    if let Some(u) = unique {
        c.region.write(off + SLOT_HEADER + 8, &u.to_ne_bytes());
    }
    c.region
        .u32_at(off + 4)
        .store((at - off - SLOT_HEADER) as u32, Ordering::Relaxed);
    if state.swap(slot::DONE, Ordering::AcqRel) == slot::SLEEPING {
        futex_wake(state);
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: a live word of the shared mapping; FUTEX_WAKE only reads its address.
    unsafe {
        raw(
            libc::SYS_futex,
            word.as_ptr() as i64,
            i64::from(libc::FUTEX_WAKE),
            1,
            0,
            0,
            0,
        )
    };
}

/// The daemon's reply to direct request `unique`, the bytes of `parts` in
/// order (None: the daemon's buffers could not be read), with `lent`, the
/// backing file a passthrough OPEN names, which the caller closes.
pub fn complete(unique: u64, parts: Option<&[&[u8]]>, lent: Option<i32>) {
    let (id, q, i) = decode(unique);
    let mut all = lock(&CLIENTS);
    let Some(c) = all.iter_mut().find(|c| c.info.id & 0xf_ffff == id) else {
        return;
    };
    if q >= c.geo.queues as usize || i >= c.geo.slots as usize {
        return;
    }
    answer(c, q, i, parts, lent);
    if c.gone {
        drop_gone(&mut all);
    }
}

/// Whether the bytes of `parts` are one reply: a header whose length is
/// theirs, and an error with no payload or success.
fn well_formed(parts: &[&[u8]]) -> bool {
    let mut head = [0u8; 8];
    let mut got = 0;
    for p in parts {
        let n = p.len().min(8 - got);
        head[got..got + n].copy_from_slice(&p[..n]);
        got += n;
        if got == 8 {
            break;
        }
    }
    let all = total(parts);
    let len = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let error = i32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
    all >= 16 && len == all && error <= 0 && error > -4096 && (error == 0 || all == 16)
}

/// Whether some client has published a request not taken yet.
pub fn has_work() -> bool {
    let all = lock(&CLIENTS);
    all.iter().filter(|c| !c.gone).any(|c| {
        (0..c.geo.queues as usize).any(|q| {
            let head = c.heads[q];
            let e = c.region.u32_at(c.geo.entry_off(q, head)).load(Ordering::SeqCst);
            entry_slot(head, e).is_some()
        })
    })
}

thread_local! {
    static POLL: shortfuse_ring::wait::Poll = shortfuse_ring::wait::Poll::default();
    /// The CPU mark of the client thread whose request this reader took last.
    static CALLER: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Polls the clients' queues, and now and then `other` (the kernel's
/// descriptor and the socket), for the spin budget, yielding the CPU as
/// the rings' own workers do (a client on this CPU must get to run):
/// true when there is something to read.
pub fn poll(mut other: impl FnMut() -> bool) -> bool {
    let mut n = 0u32;
    // A client waiting on this CPU for its answer, or about to send its
    // next request, runs only when we yield.
    let caller = CALLER.get();
    let sharing = caller != 0 && caller == shortfuse_ring::wait::cpu_mark();
    POLL.with(|p| {
        p.until_sharing(spin(), sharing, || {
            n = n.wrapping_add(1);
            has_work() || (n.is_multiple_of(64) && other())
        })
    })
}

/// Before a reader sleeps: arms every queue's bell (the client then rings
/// `serve`'s relay, which writes our eventfd). True
/// when a request came meanwhile: then the reader does not sleep.
pub fn arm() -> bool {
    flush_counts();
    super::later::send(true);
    let all = lock(&CLIENTS);
    for c in all.iter() {
        for q in 0..c.geo.queues as usize {
            let bell = c.region.u32_at(c.geo.doorbell_off(q));
            // No wake: the relay sleeps on the word whatever it holds,
            // and only the client's ring needs to reach it.
            bell.store(1, Ordering::SeqCst);
        }
    }
    drop(all);
    has_work()
}

/// After a reader woke: the clients need not ring any more; the eventfd
/// is emptied.
pub fn disarm() {
    let all = lock(&CLIENTS);
    for c in all.iter().filter(|_| !ELSEWHERE.load(Ordering::Relaxed)) {
        for q in 0..c.geo.queues as usize {
            // Not 0, which is the client's ring: `serve`'s relay waits on
            // this value until the bell is armed again.
            c.region
                .u32_at(c.geo.doorbell_off(q))
                .store(DIRECT_AWAKE, Ordering::SeqCst);
        }
    }
    drop(all);
    drain();
}

/// Empties the eventfd (it is non-blocking).
pub fn drain() {
    if let Some(b) = bell() {
        let mut v = [0u8; 8];
        fs::read(b, &mut v);
    }
}

/// The daemon waits for its descriptor with poll, select or epoll (then
/// reads it without blocking): the bells stay armed, since no read of
/// ours sleeps and re-arms them, and the eventfd is in the wait.
static ELSEWHERE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Before a wait for the daemon's descriptor in poll, select or epoll:
/// true when a request is there already.
pub fn waits_elsewhere() -> bool {
    ELSEWHERE.store(true, Ordering::Relaxed);
    arm()
}
