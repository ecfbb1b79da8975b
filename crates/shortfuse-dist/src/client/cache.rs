//! The block cache of one file: what this client holds of its data and
//! size, dirty or clean, and the version its clean blocks are valid as of.

use std::collections::{BTreeSet, HashMap};

use crate::proto::DataVersion;

/// Blocks fetched past a read miss that continues the previous read, when
/// the file has them (random reads fetch what they need only: after a
/// lease moves, a large read-ahead would cost every contended access).
pub(super) const READAHEAD: u64 = 8;
/// Dirty blocks per file before a write writes back.
pub(super) const DIRTY_MAX: usize = 256;
/// Cached blocks per file before clean ones are dropped.
pub(super) const CACHED_MAX: usize = 1024;
/// Bytes of block data per write-back request.
pub(super) const BATCH_BYTES: usize = 8 << 20;

pub(super) struct Block {
    /// The block's bytes up to its last written one; the rest reads as zeros.
    pub(super) data: Vec<u8>,
    pub(super) dirty: bool,
}

#[derive(Default)]
pub(super) struct Cache {
    pub(super) blocks: HashMap<u64, Block>,
    /// Valid under a lease: the server's size at grant, then this client's.
    pub(super) size: u64,
    pub(super) mtime: (i64, u32),
    /// Size or mtime changed here and not yet on the server.
    pub(super) meta_dirty: bool,
    /// Blocks written to the server since the last fsync, under this
    /// lease or an earlier one.
    pub(super) unsynced: BTreeSet<u64>,
    /// Dirty data was lost (lease lost or write-back failed); the next
    /// flush/fsync reports EIO once.
    pub(super) lost: bool,
    /// The block after the last one read: a read starting there is
    /// sequential.
    pub(super) next_read: u64,
    /// The data version the clean blocks are valid as of (see
    /// [`crate::versions`]): they stay cached when the lease goes, and
    /// the next grant says which of them changed meanwhile. `None`: the
    /// next grant drops them all.
    pub(super) known: Option<DataVersion>,
}

impl Cache {
    pub(super) fn dirty_count(&self) -> usize {
        self.blocks.values().filter(|b| b.dirty).count()
    }

    pub(super) fn clear(&mut self) {
        if self.meta_dirty || self.blocks.values().any(|b| b.dirty) {
            self.lost = true;
        }
        self.blocks.clear();
        self.meta_dirty = false;
        self.known = None;
    }

    /// After the lease went with everything written back: the blocks
    /// stay, clean, for the next grant to validate. (`unsynced` stays
    /// too: the next fsync must make them durable, lease or not.)
    pub(super) fn keep(&mut self) {
        debug_assert!(!self.meta_dirty && self.blocks.values().all(|b| !b.dirty));
    }

    pub(super) fn evict_clean(&mut self) {
        if self.blocks.len() > CACHED_MAX {
            let excess = self.blocks.len() - CACHED_MAX / 2;
            let clean: Vec<u64> = self
                .blocks
                .iter()
                .filter(|(_, b)| !b.dirty)
                .map(|(i, _)| *i)
                .take(excess)
                .collect();
            for i in clean {
                self.blocks.remove(&i);
            }
        }
    }
}
