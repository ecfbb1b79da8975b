//! What the direct path tells `serve` without anybody waiting for it (the
//! lookups and opens a client now holds, see `direct`), kept back and
//! sent in one message (`MSG_BATCH`) with the next one somebody does wait
//! for, or when the daemon's reader goes to sleep, or after
//! [`HOLD`]. Each message wakes `serve`'s reader and a job thread: on two
//! CPUs that the program and the daemon want, an open and close sent
//! three of them, now one.
//!
//! Every message to `serve` from the direct path goes through here, in
//! order: a message sent now carries what was kept back in front of it,
//! so `serve` still learns of an open before it is handed its release,
//! and of everything a client held before the client's `MSG_GONE_ACK`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use shortfuse::sync::lock;
use shortfuse_ring::foreign::MSG_BATCH;

/// The longest a message is kept back while the daemon's threads stay
/// busy (a sleeping reader sends it at once). `serve` waits up to two
/// seconds for a handle it is told of when a program gives it to a
/// description; this is far below.
const HOLD: Duration = Duration::from_millis(1);
/// Kept-back messages are sent once this many wait.
const MOST: usize = 32;
/// A message sent now longer than this goes on its own, after the batch.
const ALONE: usize = 16 << 10;

struct Kept {
    /// `[u32 kind][u32 length][message]`, one after another.
    bytes: Vec<u8>,
    count: usize,
    since: Option<Instant>,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    bytes: Vec::new(),
    count: 0,
    since: None,
});
/// Whether something is kept back (looked at without the lock).
static ANY: AtomicBool = AtomicBool::new(false);

fn append(k: &mut Kept, kind: u32, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    k.bytes.extend_from_slice(&kind.to_ne_bytes());
    k.bytes.extend_from_slice(&(len as u32).to_ne_bytes());
    for p in parts {
        k.bytes.extend_from_slice(p);
    }
    k.count += 1;
}

/// Sends what is kept back, with `last` (kind and parts) after it if
/// given, as one message; 0 or the send's error.
fn send_kept(k: &mut Kept, last: Option<(u32, &[&[u8]])>) -> i64 {
    if let Some((kind, parts)) = last {
        append(k, kind, parts);
    }
    ANY.store(false, Ordering::Relaxed);
    k.since = None;
    if k.count == 0 {
        return 0;
    }
    let r = super::send_parts(MSG_BATCH, &[&k.bytes], None);
    k.bytes.clear();
    k.count = 0;
    r.min(0)
}

/// Sends `kind` with `parts` (and descriptor `pass`) to `serve` now,
/// after what was kept back.
pub fn now(kind: u32, parts: &[&[u8]], pass: Option<i32>) -> i64 {
    let mut k = lock(&KEPT);
    if k.count == 0 {
        return super::send_parts(kind, parts, pass);
    }
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if pass.is_some() || len > ALONE {
        // A descriptor goes with its own message; so does a large one
        // (a write's data), which the batch must not push past what
        // `serve` reads at once.
        let r = send_kept(&mut k, None);
        if r < 0 {
            return r;
        }
        return super::send_parts(kind, parts, pass);
    }
    send_kept(&mut k, Some((kind, parts)))
}

/// Keeps `kind` with `parts` back for the next message to `serve`.
pub fn later(kind: u32, parts: &[&[u8]]) {
    let mut k = lock(&KEPT);
    append(&mut k, kind, parts);
    k.since.get_or_insert_with(Instant::now);
    ANY.store(true, Ordering::Relaxed);
    if k.count >= MOST {
        send_kept(&mut k, None);
    }
}

/// Sends what is kept back: all of it (`all`, before a reader sleeps),
/// or only what waited [`HOLD`].
pub fn send(all: bool) {
    if !ANY.load(Ordering::Relaxed) {
        return;
    }
    let mut k = lock(&KEPT);
    if all || k.since.is_some_and(|s| s.elapsed() >= HOLD) {
        send_kept(&mut k, None);
    }
}
