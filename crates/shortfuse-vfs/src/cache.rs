//! The dentry and attribute cache, and lookup counting.
//!
//! One mutex guards the whole table; it is never held across a request, so
//! a file system running in the same process may call anything while it
//! serves us. Node states:
//! - `nlookup`: how many entries (LOOKUP, MKDIR, CREATE, ...) the file
//!   system has handed out for the node and not yet been told to forget.
//! - `refs`: what keeps the node in the table: positive dentries naming it,
//!   open files and pinned locations (cwd, directory descriptors). When it
//!   reaches zero the node leaves the table and one FORGET gives all of its
//!   `nlookup` back.
//!
//! The root (node 1) is never forgotten, as in the kernel.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use shortfuse::{Attr, NodeId};

use crate::backend::Invalidation;

/// A cached name.
struct Dentry {
    /// `None`: a negative entry (the name is known not to exist).
    node: Option<NodeId>,
    expires: Instant,
}

struct NodeState {
    nlookup: u64,
    refs: u64,
    attr: Attr,
    /// `None`: the attributes must be asked for again.
    attr_expires: Option<Instant>,
}

/// Past this many cached names, expired ones are swept before inserting.
const SWEEP_AT: usize = 1 << 16;

/// What a cached lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cached {
    /// Not cached, or expired: ask the file system.
    Miss,
    /// Known not to exist.
    Negative,
    /// Known node; the attributes when they are still valid.
    Node(NodeId, Option<Attr>),
}

pub struct Cache {
    /// Keyed by [`key`]: the parent's id and the name in one byte string,
    /// so that a look-up borrows its key instead of allocating one.
    dentries: HashMap<Box<[u8]>, Dentry>,
    nodes: HashMap<u64, NodeState>,
}

/// Nodes to forget once the cache lock is released: (node, nlookup).
pub type Forgets = Vec<(NodeId, u64)>;

/// Room for the key of any name a walk looks up (NAME_MAX bytes).
const KEY_INLINE: usize = 8 + 255;

/// The dentry key of `parent/name`, on the stack when the name fits.
// Large on purpose: it lives on the stack for one look-up.
#[allow(clippy::large_enum_variant)]
enum Key {
    Inline([u8; KEY_INLINE], usize),
    Heap(Vec<u8>),
}

impl Key {
    fn new(parent: NodeId, name: &[u8]) -> Key {
        let id = parent.0.to_ne_bytes();
        if name.len() <= KEY_INLINE - 8 {
            let mut b = [0u8; KEY_INLINE];
            b[..8].copy_from_slice(&id);
            b[8..8 + name.len()].copy_from_slice(name);
            Key::Inline(b, 8 + name.len())
        } else {
            let mut v = Vec::with_capacity(8 + name.len());
            v.extend_from_slice(&id);
            v.extend_from_slice(name);
            Key::Heap(v)
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Key::Inline(b, n) => &b[..*n],
            Key::Heap(v) => v,
        }
    }
}

impl Cache {
    pub fn new(root_attr: Attr) -> Cache {
        let mut nodes = HashMap::new();
        nodes.insert(
            NodeId::ROOT.0,
            NodeState {
                nlookup: 0,
                refs: 1,
                attr: root_attr,
                attr_expires: None,
            },
        );
        Cache {
            dentries: HashMap::new(),
            nodes,
        }
    }

    pub fn lookup(&self, parent: NodeId, name: &[u8], now: Instant) -> Cached {
        let Some(d) = self.dentries.get(Key::new(parent, name).bytes()) else {
            return Cached::Miss;
        };
        if d.expires <= now {
            return Cached::Miss;
        }
        match d.node {
            None => Cached::Negative,
            Some(n) => Cached::Node(n, self.attr(n, now)),
        }
    }

    /// The cached attributes of `node` while they are valid.
    pub fn attr(&self, node: NodeId, now: Instant) -> Option<Attr> {
        self.nodes
            .get(&node.0)
            .filter(|s| s.attr_expires.is_some_and(|e| e > now))
            .map(|s| s.attr)
    }

    /// Records one entry handed out by the file system (one lookup to give
    /// back later) and its attributes.
    pub fn add_lookup(&mut self, node: NodeId, attr: Attr, attr_ttl: Duration, now: Instant) {
        let s = self.nodes.entry(node.0).or_insert(NodeState {
            nlookup: 0,
            refs: 0,
            attr,
            attr_expires: None,
        });
        if node != NodeId::ROOT {
            s.nlookup += 1;
        }
        s.attr = attr;
        s.attr_expires = Some(now + attr_ttl);
    }

    /// Fresh attributes from GETATTR or SETATTR.
    pub fn set_attr(&mut self, node: NodeId, attr: Attr, ttl: Duration, now: Instant) {
        if let Some(s) = self.nodes.get_mut(&node.0) {
            s.attr = attr;
            s.attr_expires = Some(now + ttl);
        }
    }

    pub fn invalidate_attr(&mut self, node: NodeId) {
        if let Some(s) = self.nodes.get_mut(&node.0) {
            s.attr_expires = None;
        }
    }

    /// Applies a change the file system announced (a notification from the
    /// daemon of a ring backend): the name or the attributes must be asked
    /// for again. Entries are expired rather than removed, so no lookup
    /// count changes hands here: the next lookup replaces them.
    pub fn invalidate(&mut self, inv: Invalidation<'_>, now: Instant) {
        // A walker may have read the clock just before it took the lock that
        // drained this: expire the entry before any such reading.
        let past = now.checked_sub(Duration::from_secs(1)).unwrap_or(now);
        match inv {
            Invalidation::Inode(node) => self.invalidate_attr(node),
            Invalidation::Entry { parent, name } => {
                if let Some(d) = self.dentries.get_mut(Key::new(parent, name).bytes()) {
                    d.expires = past;
                }
                self.invalidate_attr(parent);
            }
            Invalidation::All => {
                for d in self.dentries.values_mut() {
                    d.expires = past;
                }
                for s in self.nodes.values_mut() {
                    s.attr_expires = None;
                }
            }
        }
    }

    /// Caches `parent/name` -> `node` (or a negative entry) until `ttl`
    /// runs out. A zero `ttl` caches nothing but still drops the old entry.
    pub fn set_dentry(
        &mut self,
        parent: NodeId,
        name: &[u8],
        node: Option<NodeId>,
        ttl: Duration,
        now: Instant,
        forgets: &mut Forgets,
    ) {
        // Pin the new node before the old entry lets go: when both name
        // the same node (an expired entry looked up again), unpinning first
        // would drop the node, and forget the lookup just counted, while
        // the new entry still names it.
        if ttl.is_zero() {
            self.remove_dentry(parent, name, forgets);
            return;
        }
        if let Some(n) = node {
            self.pin(n);
        }
        self.remove_dentry(parent, name, forgets);
        if self.dentries.len() >= SWEEP_AT || self.nodes.len() >= SWEEP_AT {
            self.sweep(now, forgets);
        }
        self.dentries.insert(
            Box::from(Key::new(parent, name).bytes()),
            Dentry {
                node,
                expires: now + ttl,
            },
        );
    }

    pub fn remove_dentry(&mut self, parent: NodeId, name: &[u8], forgets: &mut Forgets) {
        if let Some(d) = self.dentries.remove(Key::new(parent, name).bytes()) {
            if let Some(n) = d.node {
                self.unpin(n, forgets);
            }
        }
    }

    fn sweep(&mut self, now: Instant, forgets: &mut Forgets) {
        let mut dropped = Vec::new();
        self.dentries.retain(|_, d| {
            let keep = d.expires > now;
            if !keep {
                if let Some(n) = d.node {
                    dropped.push(n);
                }
            }
            keep
        });
        for n in dropped {
            self.unpin(n, forgets);
        }
        self.forget_unused(forgets);
    }

    /// Forgets nodes that nothing uses any more: looked up with a zero
    /// entry timeout, so no dentry holds them. They are kept until a sweep
    /// rather than dropped at once because a path walk in progress may still
    /// be using one as the parent of its next lookup.
    pub fn forget_unused(&mut self, forgets: &mut Forgets) {
        self.nodes.retain(|&id, s| {
            let keep = s.refs > 0 || id == NodeId::ROOT.0;
            if !keep && s.nlookup > 0 {
                forgets.push((NodeId(id), s.nlookup));
            }
            keep
        });
    }

    /// Drops every cached name; nodes still in use stay.
    pub fn clear(&mut self, forgets: &mut Forgets) {
        let dropped: Vec<NodeId> = self.dentries.drain().filter_map(|(_, d)| d.node).collect();
        for n in dropped {
            self.unpin(n, forgets);
        }
        self.forget_unused(forgets);
    }

    /// One more reason to keep `node`: an open file, a pinned location.
    pub fn pin(&mut self, node: NodeId) {
        if let Some(s) = self.nodes.get_mut(&node.0) {
            s.refs += 1;
        }
    }

    pub fn unpin(&mut self, node: NodeId, forgets: &mut Forgets) {
        if node == NodeId::ROOT {
            return;
        }
        if let Some(s) = self.nodes.get_mut(&node.0) {
            s.refs = s.refs.saturating_sub(1);
            if s.refs == 0 {
                let n = s.nlookup;
                self.nodes.remove(&node.0);
                if n > 0 {
                    forgets.push((node, n));
                }
            }
        }
    }

    pub fn dentry_count(&self) -> usize {
        self.dentries.len()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn nlookup(&self, node: NodeId) -> Option<u64> {
        self.nodes.get(&node.0).map(|s| s.nlookup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Attr {
        Attr {
            ino: 5,
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            ..Attr::default()
        }
    }

    #[test]
    fn an_expired_entry_looked_up_again_keeps_its_node() {
        let mut c = Cache::new(Attr::default());
        let (node, sec) = (NodeId(5), Duration::from_secs(1));
        let now = Instant::now();
        let mut forgets = Forgets::new();
        c.add_lookup(node, file(), sec, now);
        c.set_dentry(NodeId::ROOT, b"a", Some(node), sec, now, &mut forgets);
        let later = now + 2 * sec;
        assert_eq!(c.lookup(NodeId::ROOT, b"a", later), Cached::Miss);
        // The file system answers the new LOOKUP with the same node.
        c.add_lookup(node, file(), sec, later);
        c.set_dentry(NodeId::ROOT, b"a", Some(node), sec, later, &mut forgets);
        assert!(forgets.is_empty(), "forgot {forgets:?} while a name still holds it");
        assert_eq!(c.nlookup(node), Some(2));
        assert_eq!(c.lookup(NodeId::ROOT, b"a", later), Cached::Node(node, Some(file())));
        // Dropping the name gives both lookups back at once.
        c.remove_dentry(NodeId::ROOT, b"a", &mut forgets);
        assert_eq!(forgets, vec![(node, 2)]);
    }

    #[test]
    fn a_zero_timeout_entry_is_not_cached_and_its_node_waits_for_a_sweep() {
        let mut c = Cache::new(Attr::default());
        let node = NodeId(5);
        let now = Instant::now();
        let mut forgets = Forgets::new();
        c.add_lookup(node, file(), Duration::ZERO, now);
        c.set_dentry(NodeId::ROOT, b"a", Some(node), Duration::ZERO, now, &mut forgets);
        assert_eq!(c.lookup(NodeId::ROOT, b"a", now), Cached::Miss);
        // A walk in progress may still use it as the parent of its next lookup.
        assert!(forgets.is_empty());
        assert_eq!(c.nlookup(node), Some(1));
        c.forget_unused(&mut forgets);
        assert_eq!(forgets, vec![(node, 1)]);
    }
}
