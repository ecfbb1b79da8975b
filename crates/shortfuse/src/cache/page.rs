//! A fixed-capacity store of file pages keyed by (node, page index), with a
//! choice of eviction policy.
//!
//! `Clock` (second chance) is the default: a hit only sets a bit, so the
//! hit path (the common one) changes no shared order, and eviction
//! approximates LRU by sweeping a hand that spares pages used since its last
//! pass. `Lru` is kept for comparison: exact recency, at the cost of an
//! ordered-map update on every hit.

use std::collections::{BTreeMap, HashMap};

use crate::types::FileHandle;

/// Which page leaves when the cache is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Clock,
    Lru,
}

/// (node id, page index).
pub type Key = (u64, u64);

/// One cached page. `data` is shorter than the page size only for the last
/// page of a file.
pub struct Page {
    pub key: Key,
    pub data: Vec<u8>,
    /// Bytes changed since the page was last written back, and the open
    /// file to write them through.
    pub dirty: Option<(usize, usize, FileHandle)>,
    referenced: bool,
    tick: u64,
}

impl Page {
    pub fn new(key: Key, data: Vec<u8>) -> Page {
        Page {
            key,
            data,
            dirty: None,
            referenced: false,
            tick: 0,
        }
    }

    /// Marks `start..end` changed, to be written through `fh`.
    pub fn mark_dirty(&mut self, start: usize, end: usize, fh: FileHandle) {
        self.dirty = Some(match self.dirty {
            Some((s, e, _)) => (s.min(start), e.max(end), fh),
            None => (start, end, fh),
        });
    }
}

pub struct PageStore {
    policy: Policy,
    capacity: usize,
    map: HashMap<Key, usize>,
    slots: Vec<Option<Page>>,
    free: Vec<usize>,
    hand: usize,
    lru: BTreeMap<u64, usize>,
    tick: u64,
}

impl PageStore {
    /// A store for at most `capacity` pages (at least one).
    pub fn new(policy: Policy, capacity: usize) -> PageStore {
        PageStore {
            policy,
            capacity: capacity.max(1),
            map: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
            lru: BTreeMap::new(),
            tick: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn touch(&mut self, slot: usize) {
        let Some(page) = self.slots[slot].as_mut() else {
            return;
        };
        match self.policy {
            Policy::Clock => page.referenced = true,
            Policy::Lru => {
                self.lru.remove(&page.tick);
                self.tick += 1;
                page.tick = self.tick;
                self.lru.insert(self.tick, slot);
            }
        }
    }

    /// The page for `key`, counted as a use.
    pub fn get(&mut self, key: Key) -> Option<&mut Page> {
        let slot = *self.map.get(&key)?;
        self.touch(slot);
        self.slots[slot].as_mut()
    }

    /// The page for `key` without counting a use.
    pub fn peek(&mut self, key: Key) -> Option<&mut Page> {
        let slot = *self.map.get(&key)?;
        self.slots[slot].as_mut()
    }

    /// Adds (or replaces) a page; returns the page evicted to make room,
    /// which the caller must write back if dirty.
    pub fn insert(&mut self, page: Page) -> Option<Page> {
        if let Some(&slot) = self.map.get(&page.key) {
            let old = self.slots[slot]
                .as_mut()
                .map(|p| std::mem::replace(&mut p.data, page.data));
            if let Some(p) = self.slots[slot].as_mut() {
                if page.dirty.is_some() {
                    p.dirty = page.dirty;
                }
            }
            drop(old);
            self.touch(slot);
            return None;
        }
        let evicted = if self.map.len() >= self.capacity {
            self.evict()
        } else {
            None
        };
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.map.insert(page.key, slot);
        self.slots[slot] = Some(page);
        self.touch(slot);
        // A new page starts unreferenced under Clock: it must be used again
        // to earn its second chance.
        if let (Policy::Clock, Some(p)) = (self.policy, self.slots[slot].as_mut()) {
            p.referenced = false;
        }
        evicted
    }

    fn victim(&mut self) -> Option<usize> {
        match self.policy {
            Policy::Lru => self.lru.first_key_value().map(|(_, &s)| s),
            Policy::Clock => {
                if self.map.is_empty() {
                    return None;
                }
                loop {
                    self.hand = (self.hand + 1) % self.slots.len();
                    if let Some(p) = self.slots[self.hand].as_mut() {
                        if !p.referenced {
                            return Some(self.hand);
                        }
                        p.referenced = false;
                    }
                }
            }
        }
    }

    fn take(&mut self, slot: usize) -> Option<Page> {
        let page = self.slots[slot].take()?;
        self.map.remove(&page.key);
        if self.policy == Policy::Lru {
            self.lru.remove(&page.tick);
        }
        self.free.push(slot);
        Some(page)
    }

    fn evict(&mut self) -> Option<Page> {
        let slot = self.victim()?;
        self.take(slot)
    }

    /// Removes one page.
    pub fn remove(&mut self, key: Key) -> Option<Page> {
        let slot = *self.map.get(&key)?;
        self.take(slot)
    }

    /// The keys of every page of `node`, in page order.
    pub fn keys_of(&self, node: u64) -> Vec<Key> {
        let mut keys: Vec<Key> = self.map.keys().filter(|k| k.0 == node).copied().collect();
        keys.sort_unstable();
        keys
    }

    /// Every key, for flushing all.
    pub fn keys(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self.map.keys().copied().collect();
        keys.sort_unstable();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(s: &mut PageStore, keys: impl IntoIterator<Item = u64>) -> Vec<u64> {
        keys.into_iter()
            .filter_map(|k| s.insert(Page::new((1, k), vec![k as u8])))
            .map(|p| p.key.1)
            .collect()
    }

    #[test]
    fn lru_evicts_least_recent() {
        let mut s = PageStore::new(Policy::Lru, 3);
        assert!(fill(&mut s, 0..3).is_empty());
        s.get((1, 0));
        assert_eq!(fill(&mut s, [3]), vec![1]);
        assert_eq!(fill(&mut s, [4]), vec![2]);
        assert_eq!(fill(&mut s, [5]), vec![0]);
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn clock_gives_used_pages_a_second_chance() {
        let mut s = PageStore::new(Policy::Clock, 3);
        fill(&mut s, 0..3);
        s.get((1, 1));
        let out = fill(&mut s, [3]);
        assert_eq!(out.len(), 1);
        assert_ne!(out[0], 1, "the referenced page was evicted first");
        assert!(s.peek((1, 1)).is_some());
    }

    #[test]
    fn dirty_ranges_merge() {
        let mut p = Page::new((1, 0), vec![0; 10]);
        p.mark_dirty(4, 6, FileHandle(1));
        p.mark_dirty(1, 2, FileHandle(2));
        assert_eq!(p.dirty, Some((1, 6, FileHandle(2))));
    }
}
