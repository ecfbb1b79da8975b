//! The properties the fuzz targets in `fuzz/` check, one function per
//! target. cargo-fuzz (nightly, libFuzzer) calls them with generated
//! inputs; `tests/corpus.rs` calls them with every input checked in under
//! `fuzz/corpus/TARGET/` and every crash kept under `fuzz/artifacts/TARGET/`,
//! on stable Rust, in `make test`. Each panics when its property breaks.

use std::sync::{Arc, OnceLock};

use shortfuse::abi;
use shortfuse::{Dispatcher, MountOptions, Outcome, Stats, Transport};

/// A target's check: panics when its property breaks for this input.
pub type Check = fn(&[u8]);

/// The targets, as named in `fuzz/Cargo.toml`, with their functions.
pub const TARGETS: &[(&str, Check)] = &[
    ("parse", parse),
    ("dispatch", dispatch),
    ("ring", ring),
    ("paths", paths),
];

/// Any byte string: `parse` returns a view or an error, never panics.
pub fn parse(data: &[u8]) {
    for setxattr_ext in [false, true] {
        let _ = abi::parse_with(data, abi::ParseConfig { setxattr_ext });
    }
}

struct Fs;
impl shortfuse::Filesystem for Fs {}

/// A dispatcher after a valid INIT (protocol 7.45).
fn dispatcher() -> &'static Dispatcher {
    static D: OnceLock<Dispatcher> = OnceLock::new();
    D.get_or_init(|| {
        let d = Dispatcher::with_max_pages_limit(Arc::new(Fs), MountOptions::default(), Arc::new(Stats::new()), 256);
        let mut init = vec![0u8; 40 + 64];
        init[..4].copy_from_slice(&104u32.to_ne_bytes());
        init[4..8].copy_from_slice(&abi::FUSE_INIT.to_ne_bytes());
        init[8..16].copy_from_slice(&1u64.to_ne_bytes());
        init[40..44].copy_from_slice(&7u32.to_ne_bytes());
        init[44..48].copy_from_slice(&45u32.to_ne_bytes());
        let mut buf = Vec::new();
        assert_eq!(d.handle(&init, &mut buf, Transport::Dev), Outcome::Reply);
        d
    })
}

/// A reply is a FUSE reply: at least its header, whose length field is its
/// length and whose unique is the request's.
fn check_reply(request: &[u8], reply: &[u8]) {
    assert!(reply.len() >= 16, "a reply of {} bytes", reply.len());
    assert_eq!(u32::from_ne_bytes(reply[..4].try_into().unwrap()) as usize, reply.len());
    if let Some(unique) = request.get(8..16) {
        assert_eq!(&reply[8..16], unique, "the reply answers another request");
    }
}

/// Any byte string after a valid INIT, as it came from /dev/fuse:
/// `handle` never panics and every reply is well formed.
pub fn dispatch(data: &[u8]) {
    let mut buf = Vec::new();
    if dispatcher().handle(data, &mut buf, Transport::Dev) != Outcome::NoReply {
        check_reply(data, &buf);
    }
}

/// What a ring client and daemon decode from each other. The input's first
/// byte picks the message:
/// - a daemon's welcome (`decode_welcome`): refused, or a geometry whose
///   every queue, entry, slot and notification record lies inside the
///   region it declares;
/// - a request read from a slot, served by the dispatcher as the ring's
///   daemon serves it: never a panic, every reply well formed.
pub fn ring(data: &[u8]) {
    let Some((&pick, msg)) = data.split_first() else {
        return;
    };
    if pick & 1 == 0 {
        let Ok((geo, _spin)) = shortfuse_ring::decode_welcome(msg) else {
            return;
        };
        let end = geo.bytes();
        let (q, s) = (geo.queues as usize - 1, geo.slots as usize - 1);
        assert!(geo.queue_off(q) < end && geo.doorbell_off(q) < end && geo.tail_off(q) < end);
        assert!(geo.entry_off(q, geo.slots - 1) < end);
        assert!(geo.slot_off(q, s) + geo.slot_data as usize <= end, "{geo:?}");
        assert!(geo.record_off(geo.records - 1) < end, "{geo:?}");
        assert!(geo.notify_off() < end && geo.notify_overflow_off() < end);
        // A queue entry tags its slot with the position it was written
        // for: read at that position it gives the slot, at any other one
        // (a stale entry) nothing.
        if let Some(e) = msg.get(..12) {
            let word = |i: usize| u32::from_ne_bytes(e[i..i + 4].try_into().unwrap());
            let (pos, slot, other) = (word(0), word(4), word(8));
            let entry = shortfuse_ring::region::entry(pos, slot);
            assert_eq!(shortfuse_ring::region::entry_slot(pos, entry), Some(slot & 0xffff));
            if (pos ^ other) & 0xffff != 0 {
                assert_eq!(shortfuse_ring::region::entry_slot(other, entry), None);
            }
        }
    } else {
        let mut buf = Vec::new();
        if dispatcher().handle(msg, &mut buf, Transport::Ring) != Outcome::NoReply {
            check_reply(msg, &buf);
        }
    }
}

/// Paths as the preload shim takes them from a program (any bytes): the
/// lexical normalisation it matches mount points with gives an absolute
/// path without empty, `.` or `..` components, is idempotent, keeps a
/// trailing slash only when asked, and its parent is a prefix of it; a
/// `-m` mount spec is parsed or refused, never a panic.
pub fn paths(data: &[u8]) {
    let n = shortfuse_vfs::normalize(data);
    assert!(n.starts_with(b"/"), "{n:?}");
    assert!(n == b"/" || !n.ends_with(b"/"), "{n:?}");
    for c in n[1..].split(|&b| b == b'/') {
        assert!(
            n == b"/" || !matches!(c, b"" | b"." | b".."),
            "component {c:?} in {n:?}"
        );
    }
    assert_eq!(shortfuse_vfs::normalize(&n), n, "normalising twice changes {data:?}");
    let p = shortfuse_vfs::parent_of(&n);
    assert!(n.starts_with(&p), "parent {p:?} of {n:?}");
    let k = shortfuse_vfs::normalize_keep_slash(data);
    assert_eq!(k.strip_suffix(b"/").filter(|_| k != b"/").unwrap_or(&k), &n[..]);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = shortfuse_vfs::MountSpec::parse(s);
        let _ = shortfuse_vfs::spec::parse_mounts(s);
    }
}
