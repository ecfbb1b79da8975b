//! Data versions: which blocks of which file changed when, so that a
//! client whose lease moved away and back keeps the cached blocks nobody
//! wrote meanwhile (see [`crate::proto::Request::Acquire`]'s `since`).
//!
//! One counter for the whole server, bumped by every change of file data
//! (a write-back, a truncation, a removal); each file remembers the
//! version at which each of its blocks last changed. A client's cache is
//! valid as of the version its grant or its last write-back returned (it
//! held the lease from then on, so nobody else wrote); at its next grant,
//! the blocks changed after that version are the ones it must drop.
//!
//! The record lives in the server's memory only. [`DataVersion::epoch`]
//! names one run of one server, so a version from before a restart (the
//! record is gone) invalidates the whole cache. The record is bounded:
//! past [`MAX_BLOCKS`] changed blocks in a file, or [`MAX_FILES`] files,
//! it is forgotten and replaced by a floor below which every version means
//! "everything may have changed".
//!
//! Only a server that sees every change of the data keeps versions: the
//! embedded one. Agents of the scale-out mode share their blocks with
//! other agents, whose writes they never see, so their grants always say
//! that everything changed (the caches are dropped as before).

use std::collections::HashMap;

use crate::proto::{DataVersion, Gfi};

/// Changed blocks a file remembers before it is marked changed as a whole.
pub const MAX_BLOCKS: usize = 4096;
/// Files remembered before the whole record is forgotten.
pub const MAX_FILES: usize = 65536;
/// Changed blocks one grant lists at most; past that, everything changed.
pub const MAX_LISTED: usize = 1024;

#[derive(Default)]
struct FileChanges {
    /// Every block changed at this version (truncation, removal, or a
    /// record that grew too large).
    all: u64,
    blocks: HashMap<u64, u64>,
}

/// The record of one server run.
pub struct DataVersions {
    epoch: u64,
    /// The version of the last change.
    seq: u64,
    /// Versions below this one know nothing (the record was forgotten).
    floor: u64,
    files: HashMap<Gfi, FileChanges>,
}

/// Which cached blocks a grant invalidates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    /// Every block may have changed.
    All,
    /// These blocks changed; the rest did not.
    Blocks(Vec<u64>),
}

impl Changed {
    pub fn contains(&self, block: u64) -> bool {
        match self {
            Changed::All => true,
            Changed::Blocks(b) => b.contains(&block),
        }
    }
}

impl DataVersions {
    /// A record for a server run named `epoch` (different for every run).
    pub fn new(epoch: u64) -> DataVersions {
        DataVersions {
            epoch,
            seq: 1,
            floor: 1,
            files: HashMap::new(),
        }
    }

    /// The version now: a cache filled now is valid as of it.
    pub fn now(&self) -> DataVersion {
        DataVersion {
            epoch: self.epoch,
            seq: self.seq,
        }
    }

    fn bump(&mut self, gfi: Gfi) -> (u64, &mut FileChanges) {
        if !self.files.contains_key(&gfi) && self.files.len() >= MAX_FILES {
            self.files.clear();
            self.floor = self.seq + 1;
        }
        self.seq += 1;
        (self.seq, self.files.entry(gfi).or_default())
    }

    /// Blocks `blocks` of `gfi` changed; returns the new version.
    pub fn wrote(&mut self, gfi: Gfi, blocks: impl IntoIterator<Item = u64>) -> DataVersion {
        let (seq, f) = self.bump(gfi);
        for b in blocks {
            f.blocks.insert(b, seq);
        }
        if f.blocks.len() > MAX_BLOCKS {
            f.blocks.clear();
            f.all = seq;
        }
        self.now()
    }

    /// Any block of `gfi` may have changed (truncated or removed).
    pub fn wrote_all(&mut self, gfi: Gfi) -> DataVersion {
        let (seq, f) = self.bump(gfi);
        f.blocks.clear();
        f.all = seq;
        self.now()
    }

    /// The blocks of `gfi` changed after `since`.
    pub fn changed_since(&self, gfi: Gfi, since: Option<DataVersion>) -> Changed {
        let Some(since) = since.filter(|s| s.epoch == self.epoch && s.seq >= self.floor && s.seq <= self.seq) else {
            return Changed::All;
        };
        let Some(f) = self.files.get(&gfi) else {
            return Changed::Blocks(Vec::new());
        };
        if f.all > since.seq {
            return Changed::All;
        }
        let mut changed: Vec<u64> = f
            .blocks
            .iter()
            .filter(|(_, v)| **v > since.seq)
            .map(|(b, _)| *b)
            .collect();
        if changed.len() > MAX_LISTED {
            return Changed::All;
        }
        changed.sort_unstable();
        Changed::Blocks(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Gfi = Gfi { node: 1, ino: 5 };
    const G: Gfi = Gfi { node: 1, ino: 6 };

    #[test]
    fn only_blocks_written_since_are_changed() {
        let mut v = DataVersions::new(7);
        let start = v.now();
        // Nothing written to F: every cached block stays.
        assert_eq!(v.changed_since(F, Some(start)), Changed::Blocks(vec![]));
        let after_g = v.wrote(G, [0, 1]);
        assert_eq!(v.changed_since(F, Some(start)), Changed::Blocks(vec![]));
        let w1 = v.wrote(F, [3, 1]);
        assert_eq!(v.changed_since(F, Some(start)), Changed::Blocks(vec![1, 3]));
        assert_eq!(v.changed_since(F, Some(after_g)), Changed::Blocks(vec![1, 3]));
        // A cache valid as of the write keeps everything.
        assert_eq!(v.changed_since(F, Some(w1)), Changed::Blocks(vec![]));
        v.wrote(F, [4]);
        assert_eq!(v.changed_since(F, Some(w1)), Changed::Blocks(vec![4]));
        // A truncation changes every block.
        let t = v.wrote_all(F);
        assert_eq!(v.changed_since(F, Some(w1)), Changed::All);
        assert_eq!(v.changed_since(F, Some(t)), Changed::Blocks(vec![]));
        v.wrote(F, [9]);
        assert_eq!(v.changed_since(F, Some(t)), Changed::Blocks(vec![9]));
    }

    #[test]
    fn unknown_versions_change_everything() {
        let mut v = DataVersions::new(7);
        let now = v.now();
        assert_eq!(v.changed_since(F, None), Changed::All);
        // Another run of the server (a restart): its record is gone.
        let other = DataVersion { epoch: 8, ..now };
        assert_eq!(v.changed_since(F, Some(other)), Changed::All);
        // A version this run never gave out.
        let future = DataVersion {
            seq: now.seq + 10,
            ..now
        };
        assert_eq!(v.changed_since(F, Some(future)), Changed::All);
        // A file with too many changed blocks is changed as a whole.
        v.wrote(F, 0..=MAX_BLOCKS as u64);
        assert_eq!(v.changed_since(F, Some(now)), Changed::All);
    }

    #[test]
    fn a_forgotten_record_changes_everything_before_it() {
        let mut v = DataVersions::new(7);
        let before = v.now();
        for ino in 0..MAX_FILES as u64 {
            v.wrote(Gfi { node: 2, ino }, [0]);
        }
        let full = v.now();
        assert_eq!(v.changed_since(F, Some(before)), Changed::Blocks(vec![]));
        // One file more: the record is forgotten.
        v.wrote(G, [0]);
        assert_eq!(v.changed_since(F, Some(before)), Changed::All);
        assert_eq!(v.changed_since(F, Some(full)), Changed::All);
        let after = v.now();
        assert_eq!(v.changed_since(F, Some(after)), Changed::Blocks(vec![]));
        assert_eq!(v.changed_since(G, Some(after)), Changed::Blocks(vec![]));
    }
}
