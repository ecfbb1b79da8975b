//! The direct path (experimental, `SHORTFUSE_RING_DIRECT` in `serve`'s
//! environment): the daemon's reads take ring clients' requests from their
//! queues themselves, and its writes put the replies in the clients'
//! slots, so a request costs the rings' own hop plus the daemon's work,
//! without `shortfuse serve`'s thread and two sockets in between.
//!
//! `serve` passes each client's memfd (`MSG_CLIENT`); it relays a client's
//! doorbell to the daemon's eventfd only while the daemon sleeps (it arms
//! the bells first). Not done here yet, and done by `serve` on its own
//! path: credential checks, the node and handle bookkeeping that forgets
//! and releases for a client that exits, telling other clients and the
//! kernel mount of changes, locks that wait.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Mutex;

use shortfuse::sync::lock;
use shortfuse_abi as abi;
use shortfuse_ring::foreign::{init_out, init_reply, DirectClient, DAEMON_BELL_VAR, DIRECT_AWAKE, DIRECT_UNIQUE};
use shortfuse_ring::region::{entry_slot, slot, Region, SLOT_HEADER};
use shortfuse_ring::Geometry;

use crate::sys::{fs, raw};

/// One client whose queues we take from.
struct Client {
    id: u64,
    region: Region,
    geo: Geometry,
    /// The next position to look at, per queue.
    heads: Vec<u32>,
    /// The request's own `unique`, per slot (queue-major).
    uniques: Vec<u64>,
}

static CLIENTS: Mutex<Vec<Client>> = Mutex::new(Vec::new());
/// What the daemon answered the kernel's INIT.
static INIT: Mutex<Option<abi::fuse_init_out>> = Mutex::new(None);
/// Our end of the eventfd `serve` writes for a rung bell; -1: no direct path.
static BELL: AtomicI32 = AtomicI32::new(-1);
/// Whether some client is registered (a read looks at the queues at all).
static ANY: AtomicU32 = AtomicU32::new(0);

/// The largest READ/WRITE payload a ring carries (as `serve`'s default).
const MAX_IO: u32 = 1 << 20;
/// How long a reader polls the queues before it sleeps.
const SPIN: std::time::Duration = std::time::Duration::from_micros(20);

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
        std::env::var("SHORTFUSE_DIRECT_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
    })
    .map_or(SPIN, std::time::Duration::from_micros)
}

/// A client `serve` hands us: `body` a [`DirectClient`], `fd` its memfd.
pub fn add(body: &[u8], fd: i32) {
    let u32_at = |at: usize| {
        body.get(at..at + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let (Some(id), Some(queues), Some(slots), Some(slot_data), Some(records)) = (
        body.get(..8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))),
        u32_at(8),
        u32_at(12),
        u32_at(16),
        u32_at(20),
    ) else {
        fs::close(fd);
        return;
    };
    let c = DirectClient {
        id,
        queues,
        slots,
        slot_data,
        records,
    };
    let geo = Geometry {
        queues: c.queues,
        slots: c.slots,
        slot_data: c.slot_data,
        records: c.records,
    };
    // SAFETY: a descriptor passed to us alone, owned from here.
    let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let Ok(region) = geo
        .check()
        .and_then(|_| Region::map(std::os::fd::AsFd::as_fd(&owned), geo.bytes()).map_err(|e| e.to_string()))
    else {
        return;
    };
    for q in 0..geo.queues as usize {
        region.u32_at(geo.doorbell_off(q)).store(DIRECT_AWAKE, Ordering::SeqCst);
    }
    let mut all = lock(&CLIENTS);
    all.push(Client {
        id: c.id,
        region,
        geo,
        heads: vec![0; geo.queues as usize],
        uniques: vec![0; geo.total_slots()],
    });
    ANY.store(1, Ordering::Relaxed);
}

/// Client `id` has gone: nothing more is taken from its queues, and
/// replies to it are dropped.
pub fn remove(id: u64) {
    let mut all = lock(&CLIENTS);
    all.retain(|c| c.id != id);
    ANY.store(u32::from(!all.is_empty()), Ordering::Relaxed);
}

/// The daemon's reply to the kernel's INIT (the whole message).
pub fn init_seen(msg: &[u8]) {
    if let Some(out) = msg.get(16..).and_then(init_out) {
        *lock(&INIT) = Some(out);
    }
}

fn unique_of(id: u64, q: usize, i: usize) -> u64 {
    DIRECT_UNIQUE | ((id & 0xf_ffff) << 40) | ((q as u64 & 0xf_ffff) << 20) | (i as u64 & 0xf_ffff)
}

fn decode(unique: u64) -> (u64, usize, usize) {
    (
        (unique >> 40) & 0xf_ffff,
        ((unique >> 20) & 0xf_ffff) as usize,
        (unique & 0xf_ffff) as usize,
    )
}

/// Whether `unique` is one of ours.
pub fn is_direct(unique: u64) -> bool {
    unique & DIRECT_UNIQUE != 0 && unique & shortfuse_ring::foreign::RING_UNIQUE == 0
}

/// The next request of a direct client for the daemon, handed over by
/// `deliver` (which copies it into the daemon's buffer: its length, or
/// None when it does not fit). Requests the daemon must not see (INIT,
/// DESTROY) are answered here.
pub fn take(mut deliver: impl FnMut(&[u8]) -> Option<i64>) -> Option<i64> {
    let mut all = lock(&CLIENTS);
    let mut req = Vec::new();
    for c in all.iter_mut() {
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
                        match *lock(&INIT) {
                            Some(d) => init_reply(
                                &d,
                                &req,
                                h.unique,
                                MAX_IO.min(c.geo.slot_data.saturating_sub(4096)),
                                true,
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
                let replies = abi::op_info(h.opcode).is_none_or(|o| o.reply);
                c.uniques[q * c.geo.slots as usize + i] = h.unique;
                req[8..16].copy_from_slice(&unique_of(c.id, q, i).to_ne_bytes());
                let Some(n) = deliver(&req) else {
                    error(&mut reply, h.unique, libc::EIO);
                    finish(c, q, i, &reply);
                    continue;
                };
                if !replies {
                    finish(c, q, i, &[]);
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

/// Writes `reply` in slot `i` of queue `q` and hands it back to the client.
fn finish(c: &Client, q: usize, i: usize, reply: &[u8]) {
    let off = c.geo.slot_off(q, i);
    let state = c.region.u32_at(off);
    if state.load(Ordering::Acquire) == slot::DETACHED
        && state
            .compare_exchange(slot::DETACHED, slot::FREE, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        return;
    }
    c.region.write(off + SLOT_HEADER, reply);
    c.region.u32_at(off + 4).store(reply.len() as u32, Ordering::Relaxed);
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

/// The daemon's reply `msg` to direct request `unique`: into its slot, with
/// the request's own id; a malformed one fails that call with EIO.
pub fn complete(unique: u64, msg: &[u8]) {
    let (id, q, i) = decode(unique);
    let all = lock(&CLIENTS);
    let Some(c) = all.iter().find(|c| c.id & 0xf_ffff == id) else {
        return;
    };
    if q >= c.geo.queues as usize || i >= c.geo.slots as usize {
        return;
    }
    let own = c.uniques[q * c.geo.slots as usize + i];
    let mut reply = msg.to_vec();
    if !well_formed(&reply) || reply.len() > c.geo.slot_data as usize {
        error(&mut reply, own, libc::EIO);
    }
    reply[8..16].copy_from_slice(&own.to_ne_bytes());
    finish(c, q, i, &reply);
}

fn well_formed(msg: &[u8]) -> bool {
    let Some(head) = msg.get(..8) else {
        return false;
    };
    let len = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let error = i32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
    msg.len() >= 16 && len == msg.len() && error <= 0 && error > -4096 && (error == 0 || msg.len() == 16)
}

/// Whether some client has published a request not taken yet.
pub fn has_work() -> bool {
    let all = lock(&CLIENTS);
    all.iter().any(|c| {
        (0..c.geo.queues as usize).any(|q| {
            let head = c.heads[q];
            let e = c.region.u32_at(c.geo.entry_off(q, head)).load(Ordering::SeqCst);
            entry_slot(head, e).is_some()
        })
    })
}

thread_local! {
    static POLL: shortfuse_ring::wait::Poll = shortfuse_ring::wait::Poll::default();
}

/// Polls the clients' queues, and now and then `other` (the kernel's
/// descriptor and the socket), for the spin budget, yielding the CPU as
/// the rings' own workers do (a client on this CPU must get to run):
/// true when there is something to read.
pub fn poll(mut other: impl FnMut() -> bool) -> bool {
    let mut n = 0u32;
    POLL.with(|p| {
        p.until(spin(), || {
            n = n.wrapping_add(1);
            has_work() || (n.is_multiple_of(64) && other())
        })
    })
}

/// Before a reader sleeps: arms every queue's bell (the client then rings
/// `serve`'s relay, which writes our eventfd). True
/// when a request came meanwhile: then the reader does not sleep.
pub fn arm() -> bool {
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
    for c in all.iter() {
        for q in 0..c.geo.queues as usize {
            // Not 0, which is the client's ring: `serve`'s relay waits on
            // this value until the bell is armed again.
            c.region
                .u32_at(c.geo.doorbell_off(q))
                .store(DIRECT_AWAKE, Ordering::SeqCst);
        }
    }
    if let Some(b) = bell() {
        let mut v = [0u8; 8];
        fs::read(b, &mut v);
    }
}
