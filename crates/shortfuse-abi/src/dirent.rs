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
}
