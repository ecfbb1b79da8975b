//! Directory entries of READDIR (`fuse_dirent`) and READDIRPLUS
//! (`fuse_direntplus`): a fixed part, the name without NUL, then zero
//! padding to the next multiple of 8 bytes.

use core::mem::size_of;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::reply::fuse_entry_out;
use crate::request::wire;

wire! {
    /// The fixed part of one READDIR entry; `namelen` name bytes follow.
    pub struct fuse_dirent {
        /// Inode number shown as `d_ino`.
        pub ino: u64,
        /// Offset of the next entry (what a later READDIR resumes from).
        pub off: u64,
        /// Bytes of the name.
        pub namelen: u32,
        /// `DT_*` (mode >> 12).
        pub typ: u32,
    }
}

wire! {
    /// The fixed part of one READDIRPLUS entry; `dirent.namelen` name bytes follow.
    pub struct fuse_direntplus {
        /// What LOOKUP of the name would answer; counts as a lookup
        /// unless `nodeid` is 0 or the name is `.` or `..`.
        pub entry_out: fuse_entry_out,
        /// The entry.
        pub dirent: fuse_dirent,
    }
}

/// Rounds `x` up to the 8-byte record alignment (`FUSE_REC_ALIGN`).
pub const fn fuse_rec_align(x: usize) -> usize {
    (x + size_of::<u64>() - 1) & !(size_of::<u64>() - 1)
}

/// Offset of the name in `fuse_dirent` (`FUSE_NAME_OFFSET`).
pub const FUSE_NAME_OFFSET: usize = size_of::<fuse_dirent>();
/// Offset of the name in `fuse_direntplus` (`FUSE_NAME_OFFSET_DIRENTPLUS`).
pub const FUSE_NAME_OFFSET_DIRENTPLUS: usize = size_of::<fuse_direntplus>();

/// Bytes one READDIR entry with a `namelen`-byte name takes (`FUSE_DIRENT_SIZE`).
pub const fn fuse_dirent_size(namelen: usize) -> usize {
    fuse_rec_align(FUSE_NAME_OFFSET + namelen)
}

/// Bytes one READDIRPLUS entry takes (`FUSE_DIRENTPLUS_SIZE`).
pub const fn fuse_direntplus_size(namelen: usize) -> usize {
    fuse_rec_align(FUSE_NAME_OFFSET_DIRENTPLUS + namelen)
}

/// The entries of a READDIRPLUS reply body, each with its name. An entry
/// cut short at the end is left out (the kernel stops there too).
pub fn direntplus_entries(mut body: &[u8]) -> impl Iterator<Item = (fuse_direntplus, &[u8])> {
    core::iter::from_fn(move || {
        let (d, _) = fuse_direntplus::read_from_prefix(body).ok()?;
        let end = FUSE_NAME_OFFSET_DIRENTPLUS + d.dirent.namelen as usize;
        let name = body.get(FUSE_NAME_OFFSET_DIRENTPLUS..end)?;
        body = body
            .get(fuse_direntplus_size(d.dirent.namelen as usize).min(body.len())..)
            .unwrap_or(&[]);
        Some((d, name))
    })
}

impl fuse_direntplus {
    /// Whether the daemon counted this entry as a lookup, to be given back
    /// with FORGET: a node (not 0) under a name other than `.` and `..`
    /// (as the kernel's fuse_direntplus_link, which skips those).
    pub fn counts_as_lookup(&self, name: &[u8]) -> bool {
        self.entry_out.nodeid != 0 && name != b"." && name != b".."
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(FUSE_NAME_OFFSET, 24);
        assert_eq!(FUSE_NAME_OFFSET_DIRENTPLUS, 152);
        assert_eq!(offset_of!(fuse_dirent, off), 8);
        assert_eq!(offset_of!(fuse_dirent, namelen), 16);
        assert_eq!(offset_of!(fuse_dirent, typ), 20);
        assert_eq!(offset_of!(fuse_direntplus, dirent), 128);
        assert_eq!(fuse_dirent_size(1), 32);
        assert_eq!(fuse_dirent_size(8), 32);
        assert_eq!(fuse_dirent_size(9), 40);
        assert_eq!(fuse_direntplus_size(0), 152);
        assert_eq!(fuse_direntplus_size(1), 160);
        assert_eq!(fuse_rec_align(0), 0);
        assert_eq!(fuse_rec_align(7), 8);
    }

    #[test]
    fn direntplus_entries_walk_a_reply_and_leave_out_a_cut_entry() {
        let mut body = Vec::new();
        for (node, name) in [(0u64, &b"."[..]), (7, b"file-with-a-long-name")] {
            let mut d = fuse_direntplus::default();
            d.entry_out.nodeid = node;
            d.dirent.namelen = name.len() as u32;
            body.extend_from_slice(d.as_bytes());
            body.extend_from_slice(name);
            body.resize(fuse_rec_align(body.len()), 0);
        }
        let got: Vec<(u64, Vec<u8>, bool)> = direntplus_entries(&body)
            .map(|(d, n)| (d.entry_out.nodeid, n.to_vec(), d.counts_as_lookup(n)))
            .collect();
        assert_eq!(
            got,
            vec![(0, b".".to_vec(), false), (7, b"file-with-a-long-name".to_vec(), true)]
        );
        assert_eq!(direntplus_entries(&body[..body.len() - 8]).count(), 1);
    }
}
