//! Directory listings `serve` keeps for an unmodified daemon, published in
//! the memory of its shared name table (see [`crate::name_table`]), so that
//! a program's `getdents64` of a directory another program (or itself)
//! listed a moment ago is answered in the program, without a round trip:
//! the kernel answers a second `ls` of a mount from its caches too.
//!
//! A listing is the daemon's READDIRPLUS answers for one directory from
//! offset 0 to its end, as records of (inode number, offset of the next
//! entry, type, name), in the daemon's order and with the daemon's offsets,
//! so that a program that goes on past a listing (a seek to an offset the
//! listing does not hold, or a listing taken out meanwhile) asks the daemon
//! from the same offset, as the kernel does after its cached listing. It is
//! kept until its deadline: the earliest time the daemon's answers let its
//! names be trusted (see `server::listings`). Entries carry no node: a
//! listing hands out no lookup.
//!
//! The area is [`DIRS`] slots of [`DIR_BYTES`] each, one listing a slot
//! (a larger one is not published), chosen by the directory's node among
//! [`PROBES`] slots. The server alone writes, under its table lock, each
//! slot under a seqlock (its first word odd while written); a reader that
//! sees it odd or changed across its copy takes the listing as missing,
//! never torn.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::region::Region;

/// `0` in `serve`'s environment: no listing is shared (each program's
/// listing then goes to the daemon, as before they were; for comparisons).
pub const LISTINGS_VAR: &str = "SHORTFUSE_RING_LISTINGS";

/// Listing slots (a power of two).
pub const DIRS: usize = 512;
/// Bytes of a slot, its head included.
pub const DIR_BYTES: usize = 64 << 10;
/// Bytes of a slot's head: seq, directory node, deadline, length of the
/// records.
const HEAD: usize = 64;
/// The most bytes of records one listing may have.
pub const ROOM: usize = DIR_BYTES - HEAD;
/// Bytes of the whole area.
pub const BYTES: usize = DIRS * DIR_BYTES;
/// Slots a put or a find looks at.
const PROBES: usize = 4;
/// Bytes of a record before its name.
const RECORD_HEAD: usize = 24;

/// One entry of a listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub ino: u64,
    /// The daemon's offset of the entry after this one.
    pub off: u64,
    /// The `DT_*` type.
    pub typ: u32,
    pub name: &'a [u8],
}

/// Appends `r` to `out` in the area's record format.
pub fn encode(out: &mut Vec<u8>, r: Record<'_>) {
    out.extend_from_slice(&r.ino.to_ne_bytes());
    out.extend_from_slice(&r.off.to_ne_bytes());
    out.extend_from_slice(&r.typ.to_ne_bytes());
    out.extend_from_slice(&(r.name.len() as u32).to_ne_bytes());
    out.extend_from_slice(r.name);
    out.resize(out.len().next_multiple_of(8), 0);
}

/// The records of `data`; stops at the first one that does not fit.
pub fn records(data: &[u8]) -> impl Iterator<Item = Record<'_>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let head = data.get(at..at + RECORD_HEAD)?;
        let word = |i: usize| u64::from_ne_bytes(head[i..i + 8].try_into().unwrap_or_default());
        let half = |i: usize| u32::from_ne_bytes(head[i..i + 4].try_into().unwrap_or_default());
        let len = half(20) as usize;
        let name = data.get(at + RECORD_HEAD..at + RECORD_HEAD + len)?;
        at = (at + RECORD_HEAD + len).next_multiple_of(8);
        Some(Record {
            ino: word(0),
            off: word(8),
            typ: half(16),
            name,
        })
    })
}

fn slots(dir: u64) -> impl Iterator<Item = usize> {
    let h = (dir.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 24) as usize;
    (0..PROBES).map(move |i| h.wrapping_add(i) & (DIRS - 1))
}

/// The listing area of a mapped table, `base` bytes into it.
pub(crate) struct Listings<'a> {
    pub region: &'a Region,
    pub base: usize,
}

impl Listings<'_> {
    fn word(&self, slot: usize, w: usize) -> &AtomicU64 {
        self.region.u64_at(self.base + slot * DIR_BYTES + w * 8)
    }

    fn data_off(&self, slot: usize) -> usize {
        self.base + slot * DIR_BYTES + HEAD
    }

    /// Writes slot `slot` with `f` under its seqlock (the server's side).
    fn write(&self, slot: usize, f: impl FnOnce()) {
        crate::name_table::seq_write(self.word(slot, 0), f);
    }

    /// Publishes `data` (records) as the listing of `dir` until `until`
    /// (CLOCK_MONOTONIC ns). Too large a listing is not published, and no
    /// older one of the directory stays.
    pub fn put(&self, dir: u64, data: &[u8], until: u64, now: u64) {
        if data.len() > ROOM {
            self.clear(dir);
            return;
        }
        let word = |slot, w| self.word(slot, w).load(Ordering::Relaxed);
        let Some(slot) = crate::name_table::pick_slot(slots(dir), |s| word(s, 1) == dir, |s| word(s, 2), now) else {
            return;
        };
        self.write(slot, || {
            self.word(slot, 1).store(dir, Ordering::Relaxed);
            self.word(slot, 2).store(until, Ordering::Relaxed);
            self.word(slot, 3).store(data.len() as u64, Ordering::Relaxed);
            self.region.write(self.data_off(slot), data);
        });
    }

    /// Takes the listing of `dir` out.
    pub fn clear(&self, dir: u64) {
        for slot in slots(dir) {
            if self.word(slot, 1).load(Ordering::Relaxed) == dir && self.word(slot, 2).load(Ordering::Relaxed) != 0 {
                self.write(slot, || self.word(slot, 2).store(0, Ordering::Relaxed));
            }
        }
    }

    /// Takes every listing out.
    pub fn clear_all(&self) {
        for slot in 0..DIRS {
            if self.word(slot, 2).load(Ordering::Relaxed) != 0 {
                self.write(slot, || self.word(slot, 2).store(0, Ordering::Relaxed));
            }
        }
    }

    /// Copies the listing of `dir` into `out` while it is valid at `now`:
    /// false when there is none, or it was being written or changed during
    /// the copy.
    pub fn get(&self, dir: u64, now: u64, out: &mut Vec<u8>) -> bool {
        for slot in slots(dir) {
            let seq = self.word(slot, 0).load(Ordering::Acquire);
            if seq == 0 || seq & 1 == 1 || self.word(slot, 1).load(Ordering::Relaxed) != dir {
                continue;
            }
            let until = self.word(slot, 2).load(Ordering::Relaxed);
            let len = self.word(slot, 3).load(Ordering::Relaxed) as usize;
            if until <= now || len > ROOM {
                continue;
            }
            out.resize(len, 0);
            self.region.read(self.data_off(slot), out);
            fence(Ordering::Acquire);
            if self.word(slot, 0).load(Ordering::Relaxed) == seq {
                return true;
            }
        }
        out.clear();
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(names: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, n) in names.iter().enumerate() {
            encode(
                &mut out,
                Record {
                    ino: 100 + i as u64,
                    off: i as u64 + 1,
                    typ: 8,
                    name: n,
                },
            );
        }
        out
    }

    fn area() -> (Region, std::os::fd::OwnedFd) {
        let fd = crate::sys::memfd("test-listings", BYTES).unwrap();
        (Region::map(std::os::fd::AsFd::as_fd(&fd), BYTES).unwrap(), fd)
    }

    #[test]
    fn records_come_back_as_encoded() {
        let data = listing(&[b".", b"..", b"a-longer-name"]);
        let back: Vec<_> = records(&data).map(|r| (r.ino, r.off, r.typ, r.name.to_vec())).collect();
        assert_eq!(
            back,
            vec![
                (100, 1, 8, b".".to_vec()),
                (101, 2, 8, b"..".to_vec()),
                (102, 3, 8, b"a-longer-name".to_vec())
            ]
        );
        // A cut record ends the records, never panics.
        assert_eq!(records(&data[..data.len() - 10]).count(), 2);
    }

    #[test]
    fn a_listing_is_found_until_cleared_or_expired_and_a_large_one_is_not_kept() {
        let (region, _fd) = area();
        let l = Listings {
            region: &region,
            base: 0,
        };
        let now = crate::sys::monotonic_ns();
        let later = now + 60_000_000_000;
        let data = listing(&[b"a", b"b"]);
        let mut out = Vec::new();
        l.put(7, &data, later, now);
        assert!(l.get(7, now, &mut out));
        assert_eq!(out, data);
        assert!(!l.get(8, now, &mut out));
        assert!(!l.get(7, later, &mut out), "expired");
        l.clear(7);
        assert!(!l.get(7, now, &mut out));
        l.put(7, &data, later, now);
        l.put(9, &data, later, now);
        l.clear_all();
        assert!(!l.get(7, now, &mut out) && !l.get(9, now, &mut out));
        l.put(7, &data, later, now);
        l.put(7, &vec![0; ROOM + 8], later, now);
        assert!(!l.get(7, now, &mut out), "too large: the older listing went too");
    }

    #[test]
    fn a_reader_never_sees_a_torn_listing() {
        let (region, _fd) = area();
        let region = std::sync::Arc::new(region);
        let now = crate::sys::monotonic_ns();
        let later = now + 60_000_000_000;
        let w = region.clone();
        let writer = std::thread::spawn(move || {
            let l = Listings { region: &w, base: 0 };
            for i in 0..20_000u64 {
                // Every record of one listing has the same inode number.
                let mut data = Vec::new();
                for j in 0..(i % 50 + 1) {
                    encode(
                        &mut data,
                        Record {
                            ino: i,
                            off: j + 1,
                            typ: 8,
                            name: b"name",
                        },
                    );
                }
                l.put(3, &data, later, now);
            }
        });
        let l = Listings {
            region: &region,
            base: 0,
        };
        let (mut out, mut seen) = (Vec::new(), 0);
        while !writer.is_finished() {
            if l.get(3, now, &mut out) {
                let inos: Vec<u64> = records(&out).map(|r| r.ino).collect();
                assert!(inos.windows(2).all(|w| w[0] == w[1]), "{inos:?}");
                seen += 1;
            }
        }
        writer.join().unwrap();
        assert!(seen > 0);
    }
}
