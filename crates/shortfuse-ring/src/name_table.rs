//! The names and attributes `serve` keeps for an unmodified daemon,
//! published in shared memory that every program of the daemon's own user
//! maps read-only, so that a `stat` of a name another program looked up is
//! answered in the program, without waking anyone (as the kernel answers
//! from its dentries for every process of a mount).
//!
//! The region is a memfd of fixed size, sealed against resizing and
//! against new writable mappings (the server maps it before it seals), and
//! handed to a client with its welcome. It holds two open-addressed tables
//! of fixed-size slots: names ((parent, name) -> node, generation, entry
//! deadline) and nodes (node -> attributes, attribute deadline), then the
//! directory listings the server keeps (see [`crate::listings`]). Deadlines
//! are CLOCK_MONOTONIC nanoseconds, one clock for every process. The server
//! alone writes, under its own lock, each slot under a seqlock: the slot's
//! first word is odd while it is written, and a reader that sees it odd or
//! changed across its copy takes the slot as missing, never torn.
//!
//! Before a change is answered or announced, the server clears what it
//! changes here (see `server::entries`), so a program that sees a change
//! never finds the entry from before it. A full table drops: an insert
//! takes a free slot of its few probes, else the one that expires first.
//! A name longer than [`NAME_ROOM`] is not published.
//!
//! What a program finds here carries no lookup of its own: it may read
//! the attributes, and must never send the node id to the daemon (the
//! server may give its lookup back at any time); see `Vfs::walk`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};

use shortfuse_abi as abi;
use zerocopy::{FromBytes, IntoBytes};

use crate::listings::{self, Listings};
use crate::region::Region;
use crate::sys;

/// Words of a name slot: seq, parent, node, generation, deadline,
/// hash << 16 | name length, then the name.
const NAME_WORDS: usize = 32;
const NAME_HEAD: usize = 6;
/// The longest name published.
pub const NAME_ROOM: usize = (NAME_WORDS - NAME_HEAD) * 8;
/// Words of a node slot: seq, node, deadline, then the attributes.
const NODE_WORDS: usize = 16;
const NODE_HEAD: usize = 3;
const ATTR_WORDS: usize = std::mem::size_of::<abi::fuse_attr>() / 8;
const _: () = assert!(NODE_HEAD + ATTR_WORDS <= NODE_WORDS);
const _: () = assert!(std::mem::size_of::<abi::fuse_attr>() == ATTR_WORDS * 8);

/// Name slots (a power of two); as many node slots.
pub const SLOTS: usize = 1 << 14;
/// Slots an insert or a lookup looks at, from the key's own.
const PROBES: usize = 4;

const NAMES_OFF: usize = 0;
const NODES_OFF: usize = SLOTS * NAME_WORDS * 8;
/// Where the directory listings start (see [`crate::listings`]).
const LISTINGS_OFF: usize = NODES_OFF + SLOTS * NODE_WORDS * 8;
/// Bytes of the whole region.
pub const BYTES: usize = LISTINGS_OFF + listings::BYTES;

/// Now on the clock the deadlines are on.
pub fn now_ns() -> u64 {
    sys::monotonic_ns()
}

/// Copies a slot's words 1.. into `out` under the seqlock in its word 0:
/// false when the slot is empty, being written, or changed during the copy.
fn copy_whole<'a, const N: usize>(word: impl Fn(usize) -> &'a AtomicU64, out: &mut [u64; N]) -> bool {
    let seq = word(0).load(Ordering::Acquire);
    if seq == 0 || seq & 1 == 1 {
        return false;
    }
    for (w, o) in out.iter_mut().enumerate().skip(1) {
        *o = word(w).load(Ordering::Relaxed);
    }
    fence(Ordering::Acquire);
    word(0).load(Ordering::Relaxed) == seq
}

/// Writes a slot with `f` under the seqlock in its word `seq` (the
/// server's side; see [`copy_whole`] for the reader's).
pub(crate) fn seq_write(seq: &AtomicU64, f: impl FnOnce()) {
    let s = seq.load(Ordering::Relaxed);
    seq.store(s | 1, Ordering::Relaxed);
    fence(Ordering::Release);
    f();
    seq.store((s | 1) + 1, Ordering::Release);
}

/// The slot of `slots` to write a key in: the key's own (`mine`), else the
/// one that expires first (`until`; a past deadline counts as free).
pub(crate) fn pick_slot(
    slots: impl Iterator<Item = usize>,
    mine: impl Fn(usize) -> bool,
    until: impl Fn(usize) -> u64,
    now: u64,
) -> Option<usize> {
    let mut victim: Option<(usize, u64)> = None;
    for slot in slots {
        if mine(slot) {
            return Some(slot);
        }
        let live = until(slot);
        let expiry = if live <= now { 0 } else { live };
        if victim.is_none_or(|(_, e)| expiry < e) {
            victim = Some((slot, expiry));
        }
    }
    victim.map(|(s, _)| s)
}

fn hash(parent: u64, name: &[u8]) -> u64 {
    // FNV-1a: both sides compute it, so it must not depend on the process.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parent.to_le_bytes().iter().chain(name) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn node_hash(node: u64) -> u64 {
    node.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// What a name slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoundName {
    pub node: u64,
    pub generation: u64,
}

/// The region, on either side.
struct Table {
    region: Region,
}

impl Table {
    fn name_word(&self, slot: usize, w: usize) -> &AtomicU64 {
        self.region.u64_at(NAMES_OFF + (slot * NAME_WORDS + w) * 8)
    }

    fn node_word(&self, slot: usize, w: usize) -> &AtomicU64 {
        self.region.u64_at(NODES_OFF + (slot * NODE_WORDS + w) * 8)
    }

    fn name_slots(parent: u64, name: &[u8]) -> (u64, impl Iterator<Item = usize>) {
        let h = hash(parent, name);
        (h, (0..PROBES).map(move |i| (h as usize).wrapping_add(i) & (SLOTS - 1)))
    }

    fn node_slots(node: u64) -> impl Iterator<Item = usize> {
        let h = node_hash(node) >> 20;
        (0..PROBES).map(move |i| (h as usize).wrapping_add(i) & (SLOTS - 1))
    }

    /// Copies name slot `slot` under its seqlock: (parent, node,
    /// generation, deadline, tag, name) when it was whole.
    fn read_name(&self, slot: usize, out: &mut [u64; NAME_WORDS]) -> bool {
        copy_whole(|w| self.name_word(slot, w), out)
    }

    fn read_node(&self, slot: usize, out: &mut [u64; NODE_WORDS]) -> bool {
        copy_whole(|w| self.node_word(slot, w), out)
    }

    fn find_name(&self, parent: u64, name: &[u8], now: u64) -> Option<FoundName> {
        if name.len() > NAME_ROOM {
            return None;
        }
        let (h, slots) = Table::name_slots(parent, name);
        let tag = (h << 16) | name.len() as u64;
        let mut w = [0u64; NAME_WORDS];
        for slot in slots {
            if !self.read_name(slot, &mut w) || w[1] != parent || w[5] != tag || w[4] <= now {
                continue;
            }
            if &w[NAME_HEAD..].as_bytes()[..name.len()] == name {
                return Some(FoundName {
                    node: w[2],
                    generation: w[3],
                });
            }
        }
        None
    }

    fn listings(&self) -> Listings<'_> {
        Listings {
            region: &self.region,
            base: LISTINGS_OFF,
        }
    }

    fn find_attr(&self, node: u64, now: u64) -> Option<abi::fuse_attr> {
        let mut w = [0u64; NODE_WORDS];
        for slot in Table::node_slots(node) {
            if self.read_node(slot, &mut w) && w[1] == node && w[2] > now {
                return abi::fuse_attr::read_from_bytes(w[NODE_HEAD..NODE_HEAD + ATTR_WORDS].as_bytes()).ok();
            }
        }
        None
    }
}

/// The server's side: the only writer (callers serialise its calls).
pub struct NameTable {
    table: Table,
    memfd: OwnedFd,
}

impl NameTable {
    pub fn new() -> io::Result<NameTable> {
        let memfd = sys::memfd("shortfuse-names", BYTES)?;
        let region = Region::map(memfd.as_fd(), BYTES)?;
        // Clients may map it to read only (this mapping, made before, stays
        // writable), and nobody may resize it.
        sys::seal(memfd.as_fd(), libc::F_SEAL_FUTURE_WRITE)?;
        Ok(NameTable {
            table: Table { region },
            memfd,
        })
    }

    /// The descriptor handed to clients.
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// Publishes `name` in `parent` as `node` until `until` (ns).
    pub fn put_name(&self, parent: u64, name: &[u8], node: u64, generation: u64, until: u64) {
        if name.len() > NAME_ROOM {
            // Not publishable; nor may an older entry of it stay.
            return;
        }
        let t = &self.table;
        let (h, slots) = Table::name_slots(parent, name);
        let tag = (h << 16) | name.len() as u64;
        let now = now_ns();
        let mut victim: Option<(usize, u64)> = None;
        let mut chosen = None;
        for slot in slots {
            let live = t.name_word(slot, 4).load(Ordering::Relaxed);
            let same = t.name_word(slot, 1).load(Ordering::Relaxed) == parent
                && t.name_word(slot, 5).load(Ordering::Relaxed) == tag;
            if same {
                // Names of one tag differ in their bytes only by a hash
                // collision: one slot per (parent, hash, length) is enough.
                chosen = Some(slot);
                break;
            }
            let expiry = if live <= now { 0 } else { live };
            if victim.is_none_or(|(_, e)| expiry < e) {
                victim = Some((slot, expiry));
            }
        }
        let Some(slot) = chosen.or(victim.map(|(s, _)| s)) else {
            return;
        };
        let mut padded = [0u64; NAME_WORDS - NAME_HEAD];
        padded.as_mut_bytes()[..name.len()].copy_from_slice(name);
        seq_write(t.name_word(slot, 0), || {
            t.name_word(slot, 1).store(parent, Ordering::Relaxed);
            t.name_word(slot, 2).store(node, Ordering::Relaxed);
            t.name_word(slot, 3).store(generation, Ordering::Relaxed);
            t.name_word(slot, 4).store(until, Ordering::Relaxed);
            t.name_word(slot, 5).store(tag, Ordering::Relaxed);
            for (i, w) in padded.iter().enumerate() {
                t.name_word(slot, NAME_HEAD + i).store(*w, Ordering::Relaxed);
            }
        });
    }

    /// Publishes the attributes of `node` until `until` (ns).
    pub fn put_attr(&self, node: u64, attr: &abi::fuse_attr, until: u64) {
        let t = &self.table;
        let word = |slot, w| t.node_word(slot, w).load(Ordering::Relaxed);
        let Some(slot) = pick_slot(
            Table::node_slots(node),
            |s| word(s, 1) == node,
            |s| word(s, 2),
            now_ns(),
        ) else {
            return;
        };
        let mut words = [0u64; ATTR_WORDS];
        words.as_mut_bytes().copy_from_slice(attr.as_bytes());
        seq_write(t.node_word(slot, 0), || {
            t.node_word(slot, 1).store(node, Ordering::Relaxed);
            t.node_word(slot, 2).store(until, Ordering::Relaxed);
            for (i, w) in words.iter().enumerate() {
                t.node_word(slot, NODE_HEAD + i).store(*w, Ordering::Relaxed);
            }
        });
    }

    /// Takes `name` in `parent` out.
    pub fn clear_name(&self, parent: u64, name: &[u8]) {
        if name.len() > NAME_ROOM {
            return;
        }
        let t = &self.table;
        let (h, slots) = Table::name_slots(parent, name);
        let tag = (h << 16) | name.len() as u64;
        for slot in slots {
            if t.name_word(slot, 1).load(Ordering::Relaxed) == parent
                && t.name_word(slot, 5).load(Ordering::Relaxed) == tag
            {
                seq_write(t.name_word(slot, 0), || {
                    t.name_word(slot, 4).store(0, Ordering::Relaxed)
                });
            }
        }
    }

    /// Takes the attributes of `node` out.
    pub fn clear_attr(&self, node: u64) {
        let t = &self.table;
        for slot in Table::node_slots(node) {
            if t.node_word(slot, 1).load(Ordering::Relaxed) == node {
                seq_write(t.node_word(slot, 0), || {
                    t.node_word(slot, 2).store(0, Ordering::Relaxed)
                });
            }
        }
    }

    /// Publishes `records` (see [`listings::encode`]) as the listing of
    /// directory `dir` until `until` (ns).
    pub fn put_listing(&self, dir: u64, records: &[u8], until: u64) {
        self.table.listings().put(dir, records, until, now_ns());
    }

    /// Takes the listing of directory `dir` out.
    pub fn clear_listing(&self, dir: u64) {
        self.table.listings().clear(dir);
    }

    /// Takes everything out.
    pub fn clear(&self) {
        let t = &self.table;
        t.listings().clear_all();
        for slot in 0..SLOTS {
            if t.name_word(slot, 4).load(Ordering::Relaxed) != 0 {
                seq_write(t.name_word(slot, 0), || {
                    t.name_word(slot, 4).store(0, Ordering::Relaxed)
                });
            }
            if t.node_word(slot, 2).load(Ordering::Relaxed) != 0 {
                seq_write(t.node_word(slot, 0), || {
                    t.node_word(slot, 2).store(0, Ordering::Relaxed)
                });
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn view(&self) -> NameView {
        NameView::map(self.memfd.as_fd()).unwrap()
    }
}

/// A client's side: a read-only mapping of the server's table.
pub struct NameView {
    table: Table,
}

impl NameView {
    /// Maps the table the server passed (refusing one of another size).
    pub fn map(fd: BorrowedFd<'_>) -> io::Result<NameView> {
        if sys::file_size(fd)? != BYTES as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a name table of another size",
            ));
        }
        let region = Region::map_read_only(fd, BYTES)?;
        Ok(NameView {
            table: Table { region },
        })
    }

    /// The node `name` in `parent` names, while the server's entry is
    /// valid.
    pub fn name(&self, parent: u64, name: &[u8]) -> Option<FoundName> {
        self.table.find_name(parent, name, now_ns())
    }

    /// The attributes of `node`, while they are valid.
    pub fn attr(&self, node: u64) -> Option<abi::fuse_attr> {
        self.table.find_attr(node, now_ns())
    }

    /// Copies the listing of directory `dir` (records, see
    /// [`listings::records`]) into `out` while it is valid: false when
    /// there is none.
    pub fn listing(&self, dir: u64, out: &mut Vec<u8>) -> bool {
        self.table.listings().get(dir, now_ns(), out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ino: u64, mode: u32) -> abi::fuse_attr {
        abi::fuse_attr {
            ino,
            mode,
            size: ino * 10,
            ..Default::default()
        }
    }

    #[test]
    fn a_published_name_and_its_attributes_are_found_until_cleared_or_expired() {
        let t = NameTable::new().unwrap();
        let v = t.view();
        let later = now_ns() + 60_000_000_000;
        t.put_name(1, b"a", 7, 3, later);
        t.put_attr(7, &attr(7, 0o100644), later);
        assert_eq!(v.name(1, b"a"), Some(FoundName { node: 7, generation: 3 }));
        assert_eq!(v.attr(7).map(|a| (a.ino, a.size, a.mode)), Some((7, 70, 0o100644)));
        assert_eq!(v.name(1, b"b"), None);
        assert_eq!(v.name(2, b"a"), None);
        t.clear_attr(7);
        assert!(v.attr(7).is_none());
        t.clear_name(1, b"a");
        assert_eq!(v.name(1, b"a"), None);
        t.put_name(1, b"x", 8, 1, now_ns());
        assert_eq!(v.name(1, b"x"), None, "expired");
        t.put_name(1, b"y", 9, 1, later);
        t.put_attr(9, &attr(9, 0o40755), later);
        t.clear();
        assert_eq!((v.name(1, b"y"), v.attr(9).is_some()), (None, false));
    }

    #[test]
    fn a_full_table_drops_and_long_names_are_not_published() {
        let t = NameTable::new().unwrap();
        let v = t.view();
        let later = now_ns() + 60_000_000_000;
        for i in 0..(SLOTS as u64 * 2) {
            t.put_name(1, format!("f{i}").as_bytes(), i + 10, 0, later);
        }
        let found = (0..(SLOTS as u64 * 2))
            .filter(|i| v.name(1, format!("f{i}").as_bytes()).is_some_and(|f| f.node == i + 10))
            .count();
        assert!(found > SLOTS / 2 && found <= SLOTS, "{found}");
        let long = [b'n'; NAME_ROOM + 1];
        t.put_name(1, &long, 5, 0, later);
        assert_eq!(v.name(1, &long), None);
        let fits = [b'n'; NAME_ROOM];
        t.put_name(1, &fits, 5, 0, later);
        assert_eq!(v.name(1, &fits).map(|f| f.node), Some(5));
    }

    #[test]
    fn the_client_s_mapping_cannot_be_written() {
        let t = NameTable::new().unwrap();
        assert!(
            sys::map_shared(t.memfd(), BYTES).is_err(),
            "a writable mapping was allowed"
        );
    }

    #[test]
    fn a_reader_never_sees_a_torn_slot() {
        let t = std::sync::Arc::new(NameTable::new().unwrap());
        let v = t.view();
        let later = now_ns() + 60_000_000_000;
        let w = t.clone();
        let writer = std::thread::spawn(move || {
            for i in 0..200_000u64 {
                // Node and generation always equal: a torn copy mixes two.
                w.put_name(1, b"a", i, i, later);
            }
        });
        let mut seen = 0;
        while !writer.is_finished() {
            if let Some(f) = v.name(1, b"a") {
                assert_eq!(f.node, f.generation);
                seen += 1;
            }
        }
        writer.join().unwrap();
        assert!(seen > 0);
    }
}
