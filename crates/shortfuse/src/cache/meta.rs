//! The metadata cache (attributes and names) and the lookups it answers
//! for the inner file system.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::hash::BuildHasher;
use std::time::Duration;

use super::page::{FxBuild, Policy, Store};
use super::CachedFs;
use crate::filesystem::Filesystem;
use crate::lookups::LookupCount;
use crate::types::*;

/// A cached name: the node, its generation, the name itself (the key only
/// holds its hash) and when it expires.
struct Name {
    node: NodeId,
    generation: u64,
    name: Box<[u8]>,
    /// [`MetaCache::now`] past which the name is stale.
    expires: u64,
}

/// Lookups of one node: handed out by the inner file system and not yet
/// forgotten there, and answered from the cache (not yet forgotten). The
/// kernel's count of the node is the sum; a FORGET gives back the cache's
/// own first.
#[derive(Default)]
struct Counts {
    inner: LookupCount,
    absorbed: LookupCount,
    /// Cached names pointing at the node.
    names: u32,
}

/// The metadata cache: attributes by node, names by (parent, name hash).
pub struct MetaCache {
    attrs: Store<u64, (Attr, u64)>,
    names: Store<(u64, u64), Name>,
    counts: HashMap<u64, Counts, FxBuild>,
}

fn name_hash(name: &[u8]) -> u64 {
    FxBuild::default().hash_one(name)
}

impl MetaCache {
    /// An empty cache of at most `entries` attributes and names.
    pub fn new(policy: Policy, entries: usize) -> MetaCache {
        MetaCache {
            attrs: Store::new(policy, entries),
            names: Store::new(policy, entries),
            counts: HashMap::default(),
        }
    }

    /// The clock entries expire by: nanoseconds of CLOCK_MONOTONIC_COARSE
    /// (a few ms of resolution, a few ns to read).
    pub fn now() -> u64 {
        crate::sys::coarse_now_ns()
    }

    /// When an entry made now with `ttl` expires.
    pub fn expires_in(ttl: Duration) -> u64 {
        Self::now().saturating_add(ttl.as_nanos().try_into().unwrap_or(u64::MAX))
    }

    /// The attributes of `node` while they are valid.
    #[inline]
    pub fn attr(&mut self, node: u64, now: u64) -> Option<Attr> {
        match self.attrs.get(&node) {
            Some((a, exp)) if *exp > now => Some(*a),
            _ => None,
        }
    }

    /// Keeps `attr` for `node` until `expires` (the cache's clock).
    pub fn set_attr(&mut self, node: u64, attr: Attr, expires: u64) {
        self.attrs.insert(node, (attr, expires));
    }

    /// Forgets the attributes of `node`.
    pub fn drop_attr(&mut self, node: u64) {
        self.attrs.remove(&node);
    }

    /// The node `name` in `parent` names, while valid.
    #[inline]
    pub fn name(&mut self, parent: u64, name: &[u8], now: u64) -> Option<(NodeId, u64)> {
        match self.names.get(&(parent, name_hash(name))) {
            Some(n) if n.expires > now && *n.name == *name => Some((n.node, n.generation)),
            _ => None,
        }
    }

    /// Keeps `parent/name` -> `node` until `expires`.
    pub fn set_name(&mut self, parent: u64, name: &[u8], node: NodeId, generation: u64, expires: u64) {
        let value = Name {
            node,
            generation,
            name: Box::from(name),
            expires,
        };
        self.counts.entry(node.0).or_default().names += 1;
        if let Some((_, old)) = self.names.insert((parent, name_hash(name)), value) {
            self.unref_name(old.node);
        }
    }

    pub(super) fn unref_name(&mut self, node: NodeId) {
        if let Some(c) = self.counts.get_mut(&node.0) {
            c.names = c.names.saturating_sub(1);
            if !c.inner.held() && !c.absorbed.held() && c.names == 0 {
                self.counts.remove(&node.0);
            }
        }
    }

    /// Forgets `name` in `parent`; returns the node it named, if cached.
    pub fn drop_name(&mut self, parent: u64, name: &[u8]) -> Option<NodeId> {
        let key = (parent, name_hash(name));
        if self.names.peek(&key).is_some_and(|n| *n.name == *name) {
            let n = self.names.remove(&key)?;
            self.unref_name(n.node);
            return Some(n.node);
        }
        None
    }

    pub(super) fn drop_names_of(&mut self, node: NodeId) {
        let mut gone = 0;
        self.names.retain(|_, n| {
            let keep = n.node != node;
            gone += !keep as u32;
            keep
        });
        for _ in 0..gone {
            self.unref_name(node);
        }
    }

    /// Whether the inner file system still holds a lookup of `node`.
    pub(super) fn alive(&self, node: NodeId) -> bool {
        self.counts.get(&node.0).is_some_and(|c| c.inner.held())
    }

    /// One lookup of `node` handed out by the inner file system.
    pub(super) fn counted(&mut self, node: NodeId) {
        self.counts.entry(node.0).or_default().inner.add(1);
    }

    /// One lookup answered from the cache.
    pub(super) fn absorbed(&mut self, node: NodeId) {
        self.counts.entry(node.0).or_default().absorbed.add(1);
    }

    /// The part of a FORGET of `n` lookups that goes to the inner file
    /// system: the cache's own lookups are given back first.
    pub(super) fn forget(&mut self, node: NodeId, n: u64) -> u64 {
        let Some(c) = self.counts.get_mut(&node.0) else {
            return n;
        };
        let rest = n - c.absorbed.take(n);
        if c.inner.forget(rest) {
            // The inner file system may drop the node now: nothing cached
            // may name it any more.
            if c.names > 0 {
                self.drop_names_of(node);
            }
            self.attrs.remove(&node.0);
            if let Some(c) = self.counts.get(&node.0) {
                if !c.absorbed.held() && c.names == 0 {
                    self.counts.remove(&node.0);
                }
            }
        }
        rest
    }
}

impl<F: Filesystem + ?Sized> CachedFs<F> {
    /// Remembers an entry the inner file system handed out.
    pub(super) fn remember(&self, parent: NodeId, name: &OsStr, e: &Entry) {
        let mut m = self.meta();
        m.counted(e.node);
        m.drop_attr(parent.0);
        if let Some(exp) = self.expiry(e.ttl) {
            m.set_name(parent.0, name.as_encoded_bytes(), e.node, e.generation, exp);
            m.set_attr(e.node.0, e.attr, exp);
        }
    }

    /// Drops a cached name and what its removal makes stale.
    pub(super) fn forget_name(&self, parent: NodeId, name: &OsStr) {
        let mut m = self.meta();
        if let Some(node) = m.drop_name(parent.0, name.as_encoded_bytes()) {
            m.drop_attr(node.0);
        }
        m.drop_attr(parent.0);
    }
}
