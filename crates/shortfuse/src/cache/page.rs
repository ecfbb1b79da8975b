//! Bounded stores with a choice of eviction policy: [`Store`] for any key
//! and value (the metadata cache's attributes and names), [`PageStore`]
//! for file pages keyed by (node, page index). The daemon's [`CachedFs`]
//! and the preload shim's in-process cache (`shortfuse-vfs`) both keep
//! their pages here.
//!
//! `Clock` (second chance) is the default: a hit only sets a bit, so the
//! hit path (the common one) changes no shared order, and eviction
//! approximates LRU by sweeping a hand that spares entries used since its
//! last pass. `Lru` is exact recency on an intrusive doubly linked list
//! (O(1), but every hit relinks two neighbours). `shortfuse bench cache`
//! measures both against each other and against `moka`.
//!
//! [`CachedFs`]: super::CachedFs

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use crate::types::FileHandle;

/// Which entry leaves when the store is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// CLOCK (second chance): a hit only sets a bit.
    Clock,
    /// Least recently used: a hit moves the entry to the front.
    Lru,
}

impl Policy {
    /// The name `-o cache_policy=` takes.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Clock => "clock",
            Policy::Lru => "lru",
        }
    }
}

/// FxHash (rustc's): keys here are node numbers and short names, not
/// attacker-chosen flood material worth SipHash's cost on every lookup.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        let mut tail = [0u8; 8];
        let rest = chunks.remainder();
        tail[..rest.len()].copy_from_slice(rest);
        self.add(u64::from_le_bytes(tail) ^ rest.len() as u64);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The hasher of the cache's maps (fast, not DoS-resistant: keys are node ids and offsets).
pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;

const NIL: usize = usize::MAX;

struct Slot<K, V> {
    key: K,
    value: V,
    /// Clock: used since the hand last passed.
    referenced: bool,
    /// Lru: neighbours towards the most and the least recent.
    newer: usize,
    older: usize,
}

/// A map of at most `capacity` entries that evicts by [`Policy`].
pub struct Store<K, V> {
    policy: Policy,
    capacity: usize,
    map: HashMap<K, usize, FxBuild>,
    slots: Vec<Option<Slot<K, V>>>,
    free: Vec<usize>,
    hand: usize,
    /// Lru: most and least recently used slots.
    newest: usize,
    oldest: usize,
}

impl<K: Hash + Eq + Clone, V> Store<K, V> {
    /// A store for at most `capacity` entries (at least one).
    pub fn new(policy: Policy, capacity: usize) -> Store<K, V> {
        let capacity = capacity.max(1);
        Store {
            policy,
            capacity,
            map: HashMap::with_capacity_and_hasher(capacity.min(1 << 16), FxBuild::default()),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
            newest: NIL,
            oldest: NIL,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Most entries held at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The eviction policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    fn slot(&mut self, i: usize) -> &mut Slot<K, V> {
        self.slots[i].as_mut().expect("a mapped slot holds an entry")
    }

    fn unlink(&mut self, i: usize) {
        let (newer, older) = {
            let s = self.slot(i);
            (s.newer, s.older)
        };
        match newer {
            NIL => self.newest = older,
            n => self.slot(n).older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.slot(o).newer = newer,
        }
    }

    fn push_newest(&mut self, i: usize) {
        let old_newest = self.newest;
        {
            let s = self.slot(i);
            s.newer = NIL;
            s.older = old_newest;
        }
        match old_newest {
            NIL => self.oldest = i,
            n => self.slot(n).newer = i,
        }
        self.newest = i;
    }

    #[inline]
    fn touch(&mut self, i: usize) {
        match self.policy {
            Policy::Clock => self.slot(i).referenced = true,
            Policy::Lru => {
                if self.newest != i {
                    self.unlink(i);
                    self.push_newest(i);
                }
            }
        }
    }

    /// The value for `key`, counted as a use.
    #[inline]
    pub fn get(&mut self, key: &K) -> Option<&mut V> {
        let i = *self.map.get(key)?;
        self.touch(i);
        Some(&mut self.slot(i).value)
    }

    /// The value for `key` without counting a use.
    #[inline]
    pub fn peek(&mut self, key: &K) -> Option<&mut V> {
        let i = *self.map.get(key)?;
        Some(&mut self.slot(i).value)
    }

    /// Whether `key` is held (not counted as a use).
    pub fn contains(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    /// Adds `value` at `key`. Returns what it displaced: the old value of
    /// `key`, or the entry evicted to make room (the caller writes back a
    /// dirty page).
    pub fn insert(&mut self, key: K, value: V) -> Option<(K, V)> {
        if let Some(&i) = self.map.get(&key) {
            let old = std::mem::replace(&mut self.slot(i).value, value);
            self.touch(i);
            return Some((key, old));
        }
        let evicted = if self.map.len() >= self.capacity {
            self.evict()
        } else {
            None
        };
        let slot = Slot {
            key: key.clone(),
            value,
            // A new entry must be used again to earn its second chance.
            referenced: false,
            newer: NIL,
            older: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.map.insert(key, i);
        if self.policy == Policy::Lru {
            self.push_newest(i);
        }
        evicted
    }

    fn victim(&mut self) -> Option<usize> {
        if self.map.is_empty() {
            return None;
        }
        match self.policy {
            Policy::Lru => Some(self.oldest),
            Policy::Clock => loop {
                self.hand = (self.hand + 1) % self.slots.len();
                if let Some(s) = self.slots[self.hand].as_mut() {
                    if !s.referenced {
                        return Some(self.hand);
                    }
                    s.referenced = false;
                }
            },
        }
    }

    fn take(&mut self, i: usize) -> Option<(K, V)> {
        if self.policy == Policy::Lru {
            self.unlink(i);
        }
        let s = self.slots[i].take()?;
        self.map.remove(&s.key);
        self.free.push(i);
        Some((s.key, s.value))
    }

    /// Evicts one entry by the policy.
    pub fn evict(&mut self) -> Option<(K, V)> {
        let i = self.victim()?;
        self.take(i)
    }

    /// Takes `key` out, returning its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let i = *self.map.get(key)?;
        self.take(i).map(|(_, v)| v)
    }

    /// Every key (in no order).
    pub fn keys(&self) -> Vec<K> {
        self.map.keys().cloned().collect()
    }

    /// Removes every entry whose key and value fail `keep`.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let mut gone = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(s) = s {
                if !keep(&s.key, &mut s.value) {
                    gone.push(i);
                }
            }
        }
        for i in gone {
            self.take(i);
        }
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.map.clear();
        self.slots.clear();
        self.free.clear();
        self.hand = 0;
        self.newest = NIL;
        self.oldest = NIL;
    }
}

/// (node id, page index).
pub type Key = (u64, u64);

/// One cached page. `data` is shorter than the page size only for the last
/// page of a file.
pub struct Page {
    /// Which file and page this is.
    pub key: Key,
    /// The page's bytes (shorter than a page at the end of a file).
    pub data: Vec<u8>,
    /// Bytes changed since the page was last written back, and the open
    /// file to write them through.
    pub dirty: Option<(usize, usize, FileHandle)>,
}

impl Page {
    /// A page of `data` at `key`.
    pub fn new(key: Key, data: Vec<u8>) -> Page {
        Page { key, data, dirty: None }
    }

    /// Marks `start..end` changed, to be written through `fh`.
    pub fn mark_dirty(&mut self, start: usize, end: usize, fh: FileHandle) {
        self.dirty = Some(match self.dirty {
            Some((s, e, _)) => (s.min(start), e.max(end), fh),
            None => (start, end, fh),
        });
    }
}

/// File pages: a [`Store`] keyed by (node, page index).
pub struct PageStore(Store<Key, Page>);

impl PageStore {
    /// A store for at most `capacity` pages (at least one).
    pub fn new(policy: Policy, capacity: usize) -> PageStore {
        PageStore(Store::new(policy, capacity))
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no page is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Most pages held at once.
    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }

    /// The page for `key`, counted as a use.
    #[inline]
    pub fn get(&mut self, key: Key) -> Option<&mut Page> {
        self.0.get(&key)
    }

    /// The page for `key` without counting a use.
    #[inline]
    pub fn peek(&mut self, key: Key) -> Option<&mut Page> {
        self.0.peek(&key)
    }

    /// Adds a page; returns the page it displaced (evicted, or an older
    /// copy of the same page), which the caller must write back if dirty.
    pub fn insert(&mut self, page: Page) -> Option<Page> {
        self.0.insert(page.key, page).map(|(_, p)| p)
    }

    /// Removes one page.
    pub fn remove(&mut self, key: Key) -> Option<Page> {
        self.0.remove(&key)
    }

    /// The keys of every page of `node`, in page order.
    pub fn keys_of(&self, node: u64) -> Vec<Key> {
        let mut keys: Vec<Key> = self.0.map.keys().filter(|k| k.0 == node).copied().collect();
        keys.sort_unstable();
        keys
    }

    /// Every key, in (node, page) order.
    pub fn keys(&self) -> Vec<Key> {
        let mut keys = self.0.keys();
        keys.sort_unstable();
        keys
    }

    /// Drops the pages of `node` from page `first` on; returns how many.
    pub fn drop_from(&mut self, node: u64, first: u64) -> usize {
        let mut n = 0;
        self.0.retain(|k, _| {
            let gone = k.0 == node && k.1 >= first;
            n += gone as usize;
            !gone
        });
        n
    }

    /// Drops every page.
    pub fn clear(&mut self) {
        self.0.clear()
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
        // Removing from the middle keeps the order of the rest.
        s.get((1, 3));
        assert!(s.remove((1, 4)).is_some());
        assert_eq!(fill(&mut s, [6, 7]), vec![5]);
        assert_eq!(fill(&mut s, [8]), vec![3]);
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
    fn stores_stay_bounded_and_drop_ranges() {
        for policy in [Policy::Clock, Policy::Lru] {
            let mut s = PageStore::new(policy, 8);
            let evicted = fill(&mut s, 0..100);
            assert_eq!((s.len(), evicted.len()), (8, 92), "{policy:?}");
            assert_eq!(s.drop_from(1, 96), 4);
            assert_eq!(s.keys(), (92..96).map(|i| (1, i)).collect::<Vec<_>>());
            let mut m: Store<Box<[u8]>, u32> = Store::new(policy, 2);
            m.insert(Box::from(&b"a"[..]), 1);
            m.insert(Box::from(&b"b"[..]), 2);
            assert_eq!(m.insert(Box::from(&b"a"[..]), 3).map(|(_, v)| v), Some(1), "replaced");
            assert!(m.insert(Box::from(&b"c"[..]), 4).is_some(), "evicted");
            assert_eq!(m.len(), 2);
        }
    }

    #[test]
    fn dirty_ranges_merge() {
        let mut p = Page::new((1, 0), vec![0; 10]);
        p.mark_dirty(4, 6, FileHandle(1));
        p.mark_dirty(1, 2, FileHandle(2));
        assert_eq!(p.dirty, Some((1, 6, FileHandle(2))));
    }
}
