//! Directory listings of an unmodified daemon, gathered from the
//! READDIRPLUS answers that pass through the server and shared with the
//! programs (see [`crate::listings`]), so that a program lists a directory
//! another listed a moment ago without a round trip.
//!
//! A program lists an open directory from offset 0, each READDIRPLUS
//! going on from the offset of the last entry it kept, until an empty
//! answer: the server follows each open handle's answers, and at the empty
//! one publishes the whole listing. A READDIRPLUS from an offset the
//! listing so far does not end an entry at (a seek) drops it; one from an
//! entry inside it (a buffer too small for the whole answer) goes on from
//! there.
//!
//! How long a listing is shared: as long as the daemon said the directory's
//! attributes stay valid (its modification time is the kernel's test of a
//! cached listing), and no longer than any name in it that the server
//! holds (the earliest entry deadline). Without the directory's
//! attributes (the root, never looked up), only a listing whose every
//! name the server holds is shared. A change to the directory through the rings, or an
//! invalidation of it or of a name in it from the daemon, takes the
//! listing out before anyone is told (see `entries`), and a listing whose
//! directory changed within the settling time before its first answer
//! reached the server is not shared (the daemon may have answered before
//! the change).

use shortfuse::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use shortfuse_abi as abi;
use zerocopy::FromBytes;

use crate::listings::{self, Record};

use super::Shared;

/// Listings being gathered at most; past that, those started longer than
/// [`STALE`] ago are dropped, then all.
const MAX_PARTS: usize = 256;
const STALE: Duration = Duration::from_secs(10);

/// The listings being gathered, by (directory, open handle); none when
/// [`listings::LISTINGS_VAR`] is `0`.
pub(super) struct Gathering {
    enabled: bool,
    parts: Mutex<HashMap<(u64, u64), Part>>,
}

impl Default for Gathering {
    fn default() -> Gathering {
        Gathering {
            enabled: std::env::var_os(listings::LISTINGS_VAR).is_none_or(|v| v != "0"),
            parts: Mutex::default(),
        }
    }
}

struct Part {
    /// When the first answer reached the server.
    started: Instant,
    /// Records so far (see [`listings::encode`]).
    data: Vec<u8>,
    /// Each record's offset of the next entry, and where it ends in `data`.
    ends: Vec<(u64, usize)>,
}

impl Gathering {
    /// Notes the answer `reply` to READDIRPLUS `arg` of directory `dir`;
    /// returns the whole listing once `reply` ends it.
    fn note(&self, dir: u64, arg: &abi::fuse_read_in, reply: &[u8], now: Instant) -> Option<Part> {
        const HEADER: usize = std::mem::size_of::<abi::fuse_out_header>();
        if !self.enabled {
            return None;
        }
        let key = (dir, arg.fh);
        let mut parts = lock(&self.parts);
        if !shortfuse::answered_ok(reply) {
            parts.remove(&key);
            return None;
        }
        if arg.offset == 0 {
            if parts.len() >= MAX_PARTS {
                parts.retain(|_, p| now.saturating_duration_since(p.started) < STALE);
                if parts.len() >= MAX_PARTS {
                    parts.clear();
                }
            }
            parts.insert(
                key,
                Part {
                    started: now,
                    data: Vec::new(),
                    ends: Vec::new(),
                },
            );
        }
        let part = parts.get_mut(&key)?;
        if arg.offset != 0 {
            let Some(i) = part.ends.iter().position(|&(off, _)| off == arg.offset) else {
                parts.remove(&key);
                return None;
            };
            part.data.truncate(part.ends[i].1);
            part.ends.truncate(i + 1);
        }
        let body = reply.get(HEADER..).unwrap_or(&[]);
        if body.is_empty() {
            return parts.remove(&key);
        }
        for (d, name) in abi::direntplus_entries(body) {
            listings::encode(
                &mut part.data,
                Record {
                    ino: d.dirent.ino,
                    off: d.dirent.off,
                    typ: d.dirent.typ,
                    name,
                },
            );
            part.ends.push((d.dirent.off, part.data.len()));
        }
        if part.data.len() > listings::ROOM {
            parts.remove(&key);
        }
        None
    }
}

impl Shared {
    /// Follows READDIRPLUS `req` answered `reply` (its nodes filled in)
    /// and shares the listing it ends, if it may be.
    pub(super) fn gather_listing(&self, req: &[u8], reply: &[u8]) {
        if !self.entries.shares() {
            return;
        }
        let Ok(h) = abi::parse_header(req) else {
            return;
        };
        if h.opcode != abi::FUSE_READDIRPLUS {
            return;
        }
        let Some(Ok((arg, _))) = req
            .get(std::mem::size_of::<abi::fuse_in_header>()..)
            .map(abi::fuse_read_in::read_from_prefix)
        else {
            return;
        };
        let now = Instant::now();
        if let Some(part) = self.listing_parts.note(h.nodeid, &arg, reply, now) {
            self.entries.share_listing(h.nodeid, &part.data, part.started, now);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    fn arg(fh: u64, offset: u64) -> abi::fuse_read_in {
        abi::fuse_read_in {
            fh,
            offset,
            ..Default::default()
        }
    }

    /// A READDIRPLUS answer listing `names` (with their `DT_*` types)
    /// without nodes, as sshfs does, the first at offset `first`.
    pub(in crate::server) fn typed_reply(names: &[(&[u8], u32)], first: u64) -> Vec<u8> {
        let mut body = Vec::new();
        for (i, (name, typ)) in names.iter().enumerate() {
            let d = abi::fuse_direntplus {
                entry_out: abi::fuse_entry_out::default(),
                dirent: abi::fuse_dirent {
                    ino: 50 + first + i as u64,
                    off: first + i as u64 + 1,
                    namelen: name.len() as u32,
                    typ: *typ,
                },
            };
            body.extend_from_slice(d.as_bytes());
            body.extend_from_slice(name);
            body.resize(abi::fuse_rec_align(body.len()), 0);
        }
        let h = abi::fuse_out_header {
            len: (16 + body.len()) as u32,
            error: 0,
            unique: 9,
        };
        let mut r = h.as_bytes().to_vec();
        r.extend_from_slice(&body);
        r
    }

    /// [`typed_reply`] of regular files.
    fn reply(names: &[&[u8]], first: u64) -> Vec<u8> {
        typed_reply(&names.iter().map(|n| (*n, 8)).collect::<Vec<_>>(), first)
    }

    fn names(p: &Part) -> Vec<(Vec<u8>, u64)> {
        listings::records(&p.data).map(|r| (r.name.to_vec(), r.off)).collect()
    }

    #[test]
    fn a_listing_read_in_pieces_is_whole_at_its_empty_answer() {
        let g = Gathering::default();
        let now = Instant::now();
        assert!(g.note(1, &arg(5, 0), &reply(&[b".", b"a", b"b"], 0), now).is_none());
        // The program kept only "a" of those (its buffer was full): it
        // goes on from a's offset.
        assert!(g.note(1, &arg(5, 2), &reply(&[b"b", b"c"], 2), now).is_none());
        let whole = g.note(1, &arg(5, 4), &reply(&[], 4), now).unwrap();
        assert_eq!(
            names(&whole),
            vec![
                (b".".to_vec(), 1),
                (b"a".to_vec(), 2),
                (b"b".to_vec(), 3),
                (b"c".to_vec(), 4)
            ]
        );
    }

    #[test]
    fn a_seek_an_error_or_another_handle_gives_no_listing() {
        let g = Gathering::default();
        let now = Instant::now();
        g.note(1, &arg(5, 0), &reply(&[b"a", b"b"], 0), now);
        assert!(g.note(1, &arg(5, 7), &reply(&[], 7), now).is_none(), "a seek");
        assert!(g.note(1, &arg(5, 2), &reply(&[], 2), now).is_none(), "dropped");
        g.note(1, &arg(5, 0), &reply(&[b"a"], 0), now);
        let mut failed = reply(&[], 1);
        failed[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
        assert!(g.note(1, &arg(5, 1), &failed, now).is_none());
        assert!(
            g.note(1, &arg(5, 1), &reply(&[], 1), now).is_none(),
            "dropped by the error"
        );
        assert!(g.note(2, &arg(6, 3), &reply(&[], 3), now).is_none(), "never started");
    }
}
