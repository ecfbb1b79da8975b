//! Where an open file's data lives, so that data I/O can skip the daemon
//! (seed 004, DeFUSE). A map covers the file with up to
//! [`DataMap::MAX_EXTENTS`] extents, each a range of one backing file.
//! One whole-file extent is the 1-to-1 case that kernel passthrough serves.

use std::os::fd::OwnedFd;
use std::sync::Arc;

/// A backing file shared by the extents that point into it.
pub type BackingFile = Arc<OwnedFd>;

/// One range of the file mapped onto a range of a backing file.
#[derive(Clone, Debug)]
pub struct Extent {
    pub backing: BackingFile,
    pub file_offset: u64,
    pub backing_offset: u64,
    /// Length in bytes; `u64::MAX` for "to the end of the file, whatever
    /// its size" (the 1-to-1 case).
    pub len: u64,
}

/// A file-to-file data map.
#[derive(Clone, Debug, Default)]
pub struct DataMap {
    pub extents: Vec<Extent>,
}

impl DataMap {
    /// Most extents one map may carry.
    pub const MAX_EXTENTS: usize = 16;

    /// The 1-to-1 map: the whole file is the backing file.
    pub fn whole(backing: BackingFile) -> DataMap {
        DataMap {
            extents: vec![Extent {
                backing,
                file_offset: 0,
                backing_offset: 0,
                len: u64::MAX,
            }],
        }
    }

    /// The backing file when this map is the 1-to-1 case.
    pub fn as_whole(&self) -> Option<&BackingFile> {
        match self.extents.as_slice() {
            [e] if e.file_offset == 0 && e.backing_offset == 0 && e.len == u64::MAX => Some(&e.backing),
            _ => None,
        }
    }
}
