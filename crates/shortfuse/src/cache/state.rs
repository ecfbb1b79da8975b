//! What the cache knows of each node's data (size, dirty pages, what the
//! inner file system last reported, generations), beside the pages.

use std::collections::{HashMap, HashSet};

use super::ahead::Ahead;
use super::behind::Behind;
use super::page::PageStore;
use super::seen::Seen;
use crate::errno::Errno;
use crate::types::*;

#[derive(Default)]
pub(super) struct NodeState {
    /// The file's size as the cache knows it (including dirty data), once known.
    pub(super) size: Option<u64>,
    /// Where the next sequential read would start.
    pub(super) next: u64,
    /// Size and mtime the inner file system last reported, and when.
    pub(super) seen: Option<Seen>,
    /// Dirty data went to the inner file system since `seen` was taken.
    pub(super) wrote: bool,
    /// Dirty pages of the node in the cache (so that a clean node's
    /// flush and size check look at no page).
    pub(super) dirty: usize,
    /// Runs of the node being written behind its writer (`behind.rs`).
    pub(super) behind: usize,
    /// Why a run written behind failed where its pages were no longer
    /// cached to write again: for the next flush, fsync or close.
    pub(super) failed: Option<Errno>,
    /// When the last write the cache holds came: the file's mtime and
    /// ctime while its data waits here.
    pub(super) written: Option<Timestamp>,
    /// Changed (from [`State::counter`]) by every change to the node's
    /// data; 0 until a read needs it.
    pub(super) generation: u64,
}

pub(super) struct State {
    pub(super) pages: PageStore,
    pub(super) nodes: HashMap<u64, NodeState>,
    /// Source of generations: never repeats, so a node dropped and
    /// recreated does not pass for unchanged.
    pub(super) counter: u64,
    /// Handles the inner file system opened write-only (see `layer::readable`).
    pub(super) write_only: HashSet<u64>,
    /// Windows being read ahead of sequential readers (few: one per file
    /// being read sequentially, and one more while a reader collects).
    pub(super) ahead: Vec<Ahead>,
    /// Runs of pages being written behind their writers, oldest first.
    pub(super) behind: Vec<Behind>,
}

impl State {
    /// Marks `node`'s data changed: a read fetching meanwhile keeps
    /// nothing it fetched.
    pub(super) fn bump(&mut self, node: u64) -> u64 {
        self.counter += 1;
        let c = self.counter;
        self.nodes.entry(node).or_default().generation = c;
        c
    }

    /// The generation a fetch compares with when it comes back.
    pub(super) fn generation(&mut self, node: u64) -> u64 {
        match self.nodes.get(&node).map(|n| n.generation) {
            Some(g) if g != 0 => g,
            _ => self.bump(node),
        }
    }

    pub(super) fn unchanged(&self, node: u64, generation: u64) -> bool {
        self.nodes.get(&node).is_some_and(|n| n.generation == generation)
    }
}
