//! A directory stream read from the listing the daemon's server shares
//! (see `shortfuse_ring::listings`): a program lists a directory another
//! program listed a moment ago without a round trip, as the kernel lists
//! from its cache.
//!
//! The listing is taken whole when the stream starts (offset 0: the first
//! `getdents64` after the open or a rewind), and read from while the
//! stream's offset is one of its entries'. Its offsets are the daemon's,
//! so a stream past it (a seek to an offset it does not hold) goes on
//! with the daemon from there. Its entries carry no node and so no lookup:
//! nothing is cached from them, and the `stat` of a listed name finds it
//! in the shared table or looks it up.

use shortfuse::Errno;

use super::{DirPos, OpenFile};

/// Writes one `struct linux_dirent64` at `*used` of `buf`: false when it
/// does not fit.
pub(super) fn put_dirent(buf: &mut [u8], used: &mut usize, ino: u64, off: u64, typ: u32, name: &[u8]) -> bool {
    let reclen = (19 + name.len() + 1 + 7) & !7;
    if *used + reclen > buf.len() {
        return false;
    }
    let rec = &mut buf[*used..*used + reclen];
    rec[0..8].copy_from_slice(&ino.to_ne_bytes());
    rec[8..16].copy_from_slice(&off.to_ne_bytes());
    rec[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
    rec[18] = typ as u8;
    rec[19..19 + name.len()].copy_from_slice(name);
    rec[19 + name.len()..].fill(0);
    *used += reclen;
    true
}

impl OpenFile {
    /// `getdents64` from the shared listing, when the stream reads one
    /// (taken at its start) and its offset is in it; `None`: ask the
    /// daemon.
    pub(super) fn getdents_listed(&self, pos: &mut DirPos, buf: &mut [u8]) -> Option<Result<usize, Errno>> {
        if pos.cookie == 0 {
            pos.listing = if self.vfs.readdirplus() {
                self.vfs.client().shared_listing(self.node)
            } else {
                None
            };
        }
        // Taken out while read; put back unless the stream left it.
        let listing = pos.listing.take()?;
        let mut records = shortfuse_ring::listings::records(&listing);
        let at = pos.cookie;
        // Past the entry whose next offset the stream is at.
        if at != 0 && !records.any(|r| r.off == at) {
            return None;
        }
        let (mut used, mut cookie, mut full) = (0, at, false);
        for r in records {
            if !put_dirent(buf, &mut used, r.ino, r.off, r.typ, r.name) {
                full = true;
                break;
            }
            cookie = r.off;
        }
        pos.listing = Some(listing);
        if used == 0 && full {
            // Not even one entry fits, as the kernel answers.
            return Some(Err(Errno::EINVAL));
        }
        pos.cookie = cookie;
        Some(Ok(used))
    }
}
