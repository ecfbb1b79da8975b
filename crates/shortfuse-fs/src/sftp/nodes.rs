//! Node ids for a path-based protocol.
//!
//! SFTP names files by path only, so every node id the kernel holds stands
//! for a path. The table maps both ways and counts the kernel's lookups; a
//! node is freed when `forget` brings its count to zero. A rename rewrites
//! the paths of the moved node and of everything under it (one scan over
//! the table: renames of directories are rare next to lookups). A node whose
//! name went away (unlink, or replaced by a rename) keeps its id until
//! forgotten but has no path: calls through it fail with `ENOENT` (what POSIX
//! says of a removed directory used as the current one), while its
//! open handles keep working on the server.
//!
//! Each node also remembers the size and modification time the kernel was
//! last given for it ([`Shown`]): the kernel trusts attributes for the
//! mount's `attr_timeout`, so an open that finds them changed on the
//! server has to tell it (close-to-open).

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::sync::Mutex;

use shortfuse::{Errno, NodeId, Result};

struct Node {
    /// `None` once the name was removed or replaced.
    path: Option<String>,
    lookups: u64,
    shown: Option<Shown>,
}

/// What of a node's attributes says its data changed: size and
/// modification time, as the kernel was last given them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shown {
    pub size: u64,
    /// Whole seconds (SFTP v3 has no finer times).
    pub mtime: i64,
}

struct Inner {
    by_id: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
    next: u64,
}

pub struct Nodes {
    inner: Mutex<Inner>,
}

/// `parent/name` for server paths (`/` has no trailing slash to repeat).
pub fn join(parent: &str, name: &str) -> String {
    if parent.ends_with('/') {
        format!("{parent}{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// An absolute server path without repeated or trailing slashes.
pub fn normalize(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

impl Nodes {
    /// A table whose root node stands for `root`.
    pub fn new(root: String) -> Nodes {
        let mut by_id = HashMap::new();
        let mut by_path = HashMap::new();
        by_id.insert(
            NodeId::ROOT.0,
            Node {
                path: Some(root.clone()),
                lookups: 1,
                shown: None,
            },
        );
        by_path.insert(root, NodeId::ROOT.0);
        Nodes {
            inner: Mutex::new(Inner {
                by_id,
                by_path,
                next: NodeId::ROOT.0 + 1,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unpoison()
    }

    /// The server path of `node`.
    pub fn path(&self, node: NodeId) -> Result<String> {
        match self.lock().by_id.get(&node.0) {
            Some(Node { path: Some(p), .. }) => Ok(p.clone()),
            Some(Node { path: None, .. }) => Err(Errno::ENOENT),
            None => Err(Errno::ENOENT),
        }
    }

    /// The node standing for `path`, if the kernel holds one.
    pub fn find(&self, path: &str) -> Option<NodeId> {
        self.lock().by_path.get(path).map(|&id| NodeId(id))
    }

    /// The node for `path` with one more lookup (made if new).
    pub fn lookup(&self, path: &str) -> NodeId {
        let mut inner = self.lock();
        if let Some(&id) = inner.by_path.get(path) {
            if let Some(n) = inner.by_id.get_mut(&id) {
                n.lookups += 1;
                return NodeId(id);
            }
        }
        let id = inner.next;
        inner.next += 1;
        inner.by_id.insert(
            id,
            Node {
                path: Some(path.to_owned()),
                lookups: 1,
                shown: None,
            },
        );
        inner.by_path.insert(path.to_owned(), id);
        NodeId(id)
    }

    /// Gives back `n` lookups; the root is never freed.
    pub fn forget(&self, node: NodeId, n: u64) {
        if node == NodeId::ROOT {
            return;
        }
        let mut inner = self.lock();
        let Some(entry) = inner.by_id.get_mut(&node.0) else {
            return;
        };
        entry.lookups = entry.lookups.saturating_sub(n);
        if entry.lookups == 0 {
            let path = entry.path.take();
            inner.by_id.remove(&node.0);
            if let Some(p) = path {
                if inner.by_path.get(&p) == Some(&node.0) {
                    inner.by_path.remove(&p);
                }
            }
        }
    }

    /// `path` no longer names anything (unlink, rmdir).
    pub fn remove(&self, path: &str) {
        let mut inner = self.lock();
        if let Some(id) = inner.by_path.remove(path) {
            if let Some(n) = inner.by_id.get_mut(&id) {
                n.path = None;
            }
        }
    }

    /// `from` was renamed to `to`: whatever `to` named is gone, and `from`
    /// with everything below it moves.
    pub fn rename(&self, from: &str, to: &str) {
        let mut inner = self.lock();
        if let Some(id) = inner.by_path.remove(to) {
            if let Some(n) = inner.by_id.get_mut(&id) {
                n.path = None;
            }
        }
        let prefix = format!("{}/", from.trim_end_matches('/'));
        let moved: Vec<(String, u64)> = inner
            .by_path
            .iter()
            .filter(|(p, _)| p.as_str() == from || p.starts_with(&prefix))
            .map(|(p, &id)| (p.clone(), id))
            .collect();
        for (old, id) in moved {
            inner.by_path.remove(&old);
            let new = format!("{to}{}", &old[from.len()..]);
            if let Some(n) = inner.by_id.get_mut(&id) {
                n.path = Some(new.clone());
            }
            inner.by_path.insert(new, id);
        }
    }

    /// Notes that the kernel was given `shown` for `node`.
    pub fn show(&self, node: NodeId, shown: Shown) {
        if let Some(n) = self.lock().by_id.get_mut(&node.0) {
            n.shown = Some(shown);
        }
    }

    /// Whether the kernel may hold other attributes of `node` than `now`
    /// (it was given others, or the table does not know what it was given),
    /// noting `now` as given.
    pub fn differs_from_shown(&self, node: NodeId, now: Shown) -> bool {
        match self.lock().by_id.get_mut(&node.0) {
            Some(n) => n.shown.replace(now) != Some(now),
            None => true,
        }
    }

    /// How many nodes the table holds (the root included).
    pub fn count(&self) -> usize {
        self.lock().by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_forget_and_rename() {
        let t = Nodes::new("/srv".into());
        assert_eq!(t.path(NodeId::ROOT).unwrap(), "/srv");
        let d = t.lookup("/srv/d");
        let f = t.lookup("/srv/d/f");
        assert_eq!(t.lookup("/srv/d"), d);
        let other = t.lookup("/srv/e");
        t.rename("/srv/d", "/srv/e");
        assert_eq!(t.path(d).unwrap(), "/srv/e");
        assert_eq!(t.path(f).unwrap(), "/srv/e/f");
        assert_eq!(t.path(other), Err(Errno::ENOENT));
        assert_eq!(t.find("/srv/e/f"), Some(f));
        // "/srv/dx" is not below "/srv/d".
        let dx = t.lookup("/srv/dx");
        t.rename("/srv/e", "/srv/g");
        assert_eq!(t.path(dx).unwrap(), "/srv/dx");
        t.forget(d, 1);
        assert_eq!(t.path(d).unwrap(), "/srv/g");
        t.forget(d, 1);
        assert_eq!(t.path(d), Err(Errno::ENOENT));
        t.remove("/srv/g/f");
        assert_eq!(t.path(f), Err(Errno::ENOENT));
        t.forget(f, 1);
        t.forget(other, 1);
        t.forget(dx, 1);
        assert_eq!(t.count(), 1);
        t.forget(NodeId::ROOT, 5);
        assert_eq!(t.path(NodeId::ROOT).unwrap(), "/srv");
    }

    #[test]
    fn shown_attributes_are_compared_and_freed_with_the_node() {
        let t = Nodes::new("/srv".into());
        let f = t.lookup("/srv/f");
        let old = Shown { size: 5, mtime: 100 };
        let grown = Shown { size: 9, mtime: 100 };
        assert!(t.differs_from_shown(f, old), "nothing was shown yet");
        assert!(!t.differs_from_shown(f, old));
        assert!(t.differs_from_shown(f, grown));
        t.show(f, old);
        assert!(t.differs_from_shown(f, grown));
        t.forget(f, 1);
        assert!(t.differs_from_shown(f, grown), "a forgotten node holds nothing");
        let again = t.lookup("/srv/f");
        assert!(
            t.differs_from_shown(again, grown),
            "a new node starts with nothing shown"
        );
    }

    #[test]
    fn join_paths() {
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }
}
