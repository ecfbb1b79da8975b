//! Inode bookkeeping: one [`Inode`] per source `(st_dev, st_ino)`.
//!
//! Lock order: the table lock ([`InodeTable`]'s `RwLock`) is the only lock
//! here, and it is never held while another lock of the file system is
//! taken or while a system call that may block runs (lookups open and stat
//! first, then take the lock to publish). Handle-table and directory-stream
//! locks (see `handles.rs`) are never held while taking the table lock
//! either, except that readdirplus holds its directory-stream lock while
//! interning entries: order is *dir stream → inode table*, never the
//! reverse. A sweep that gives descriptors up takes each inode's path-slot
//! lock under the table's read lock (without waiting); slot locks are
//! leaves (see `pathfd.rs`).
//!
//! Lookup counts change only under the write lock. `forget` decrements and,
//! at zero, removes the inode from both maps in the same critical section,
//! so a lookup racing with it either sees the inode before the removal (and
//! its increment keeps it alive) or finds no entry and publishes a new inode
//! with a new node id: a freed inode is never handed out again.

use shortfuse::sync::Unpoison;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use shortfuse::{Errno, FileType, NodeId, Result};

use super::pathfd::{Budget, PathFd, PathSlot};

/// Identity of a source inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InodeKey {
    pub dev: u64,
    pub ino: u64,
}

impl InodeKey {
    pub fn of(st: &libc::stat) -> InodeKey {
        InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// One source inode the kernel knows about.
#[derive(Debug)]
pub struct Inode {
    /// Our node id for it (a counter, never a pointer, never reused).
    pub node: NodeId,
    pub key: InodeKey,
    /// The type never changes for a given inode, so checks such as "is this
    /// a symlink" need no system call.
    pub kind: FileType,
    /// `O_PATH | O_NOFOLLOW`: names the inode without opening it (given
    /// up for a file handle when too many are open, see [`super::pathfd`]).
    path: PathSlot,
    /// References the kernel holds (lookups minus forgets). Written under
    /// the table's write lock only.
    nlookup: AtomicU64,
    /// Open handles on this inode (files and directories): an inode with
    /// open handles keeps its descriptor (an unlinked open file could not be
    /// found by handle again).
    pub nopen: AtomicU64,
}

impl Inode {
    /// The inode's `O_PATH` descriptor, open at least while the result lives.
    pub fn fd(&self) -> Result<PathFd> {
        self.path.get()
    }

    /// The shared read-only descriptor of a regular file (see
    /// [`PathSlot::reader`]), made by `open` from the `O_PATH` one.
    pub fn reader(&self, open: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd>) -> Result<Arc<OwnedFd>> {
        self.path.reader(open)
    }

    /// Whether the descriptor is open now (tests of the budget).
    pub fn has_fd(&self) -> bool {
        self.path.is_open()
    }

    pub fn lookups(&self) -> u64 {
        self.nlookup.load(Ordering::Relaxed)
    }
}

struct Maps {
    by_key: HashMap<InodeKey, Arc<Inode>>,
    /// Ordered, so that the shedding sweep is a clock: it goes on from
    /// where the last one stopped instead of from the same place each time.
    by_node: BTreeMap<u64, Arc<Inode>>,
    next_node: u64,
}

/// Both maps behind one lock, and the budget of open descriptors.
pub struct InodeTable {
    maps: RwLock<Maps>,
    budget: Arc<Budget>,
    /// The node the last sweep stopped at.
    hand: AtomicU64,
}

impl InodeTable {
    /// A table that holds the root (node 1), whose count never drops.
    pub fn new(root_fd: OwnedFd, root_st: &libc::stat, budget: Arc<Budget>) -> InodeTable {
        let root = Arc::new(Inode {
            node: NodeId::ROOT,
            key: InodeKey::of(root_st),
            kind: FileType::from_mode(root_st.st_mode),
            path: PathSlot::new(root_fd, root_st.st_dev, true, &budget),
            nlookup: AtomicU64::new(1),
            nopen: AtomicU64::new(0),
        });
        let mut maps = Maps {
            by_key: HashMap::new(),
            by_node: BTreeMap::new(),
            next_node: NodeId::ROOT.0 + 1,
        };
        maps.by_key.insert(root.key, root.clone());
        maps.by_node.insert(root.node.0, root);
        InodeTable {
            maps: RwLock::new(maps),
            budget,
            hand: AtomicU64::new(0),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Maps> {
        // A panic while holding the lock cannot leave the maps half-updated
        // (each update is a pair of inserts/removes that cannot panic), so a
        // poisoned lock is still consistent.
        self.maps.read().unpoison()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Maps> {
        self.maps.write().unpoison()
    }

    /// The inode for a node id the kernel sent. `ESTALE` for an id we never
    /// gave or already forgot (only a confused or malicious peer sends one).
    pub fn get(&self, node: NodeId) -> Result<Arc<Inode>> {
        // Reopens by handle happen after a get; the next get sheds them.
        self.shed();
        self.read().by_node.get(&node.0).cloned().ok_or(Errno::ESTALE)
    }

    /// Gives descriptors up while more than the budget are open: a clock
    /// sweep over the table, at most two passes (the first may only clear
    /// use marks).
    fn shed(&self) {
        let mut excess = self.budget.excess();
        if excess == 0 {
            return;
        }
        let maps = self.read();
        let hand = self.hand.load(Ordering::Relaxed);
        let round = maps.by_node.range(hand + 1..).chain(maps.by_node.range(..=hand));
        for (&node, inode) in round.clone().chain(round) {
            if inode.path.shed(inode.nopen.load(Ordering::Relaxed) > 0) {
                excess -= 1;
                if excess == 0 {
                    self.hand.store(node, Ordering::Relaxed);
                    return;
                }
            }
        }
    }

    /// The descriptor budget (tests, statistics).
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Publishes a looked-up inode and counts one lookup. `fd` is an
    /// `O_PATH` descriptor for the inode `st` describes; if the inode is
    /// already known, `fd` replaces a descriptor it gave up or is closed
    /// (after the lock is released), and the known inode is returned.
    pub fn intern(&self, fd: OwnedFd, st: &libc::stat) -> Arc<Inode> {
        let key = InodeKey::of(st);
        let mut maps = self.write();
        if let Some(inode) = maps.by_key.get(&key) {
            inode.nlookup.fetch_add(1, Ordering::Relaxed);
            let inode = inode.clone();
            drop(maps);
            inode.path.refill(fd);
            return inode;
        }
        let node = NodeId(maps.next_node);
        maps.next_node += 1;
        let inode = Arc::new(Inode {
            node,
            key,
            kind: FileType::from_mode(st.st_mode),
            path: PathSlot::new(fd, st.st_dev, false, &self.budget),
            nlookup: AtomicU64::new(1),
            nopen: AtomicU64::new(0),
        });
        maps.by_key.insert(key, inode.clone());
        maps.by_node.insert(node.0, inode.clone());
        drop(maps);
        self.shed();
        inode
    }

    /// Gives back `n` lookups; at zero the inode leaves the table and its
    /// descriptor closes once the last in-flight request drops its `Arc`.
    /// The root is never forgotten.
    /// Counts one more lookup of the inode `st` describes when the table
    /// holds it by an open descriptor, which pins the inode: its device and
    /// inode numbers cannot name a newer file meanwhile. `None` when the
    /// inode is unknown or gave its descriptor up.
    pub fn lookup_known(&self, st: &libc::stat) -> Option<Arc<Inode>> {
        let maps = self.read();
        let inode = maps.by_key.get(&InodeKey::of(st))?;
        if !inode.has_fd() || inode.kind != FileType::from_mode(st.st_mode) {
            return None;
        }
        // Under the read lock: FORGET takes the write lock to count down.
        inode.nlookup.fetch_add(1, Ordering::Relaxed);
        Some(inode.clone())
    }

    pub fn forget(&self, node: NodeId, n: u64) {
        self.forget_many(std::iter::once((node, n)));
    }

    /// `forget` for a batch, under one acquisition of the lock. The freed
    /// inodes (and their descriptors) are dropped after the lock is released.
    pub fn forget_many(&self, items: impl Iterator<Item = (NodeId, u64)>) {
        let mut freed = Vec::new();
        let mut maps = self.write();
        for (node, n) in items {
            if node == NodeId::ROOT {
                continue;
            }
            let Some(inode) = maps.by_node.get(&node.0) else {
                continue;
            };
            let left = inode.nlookup.load(Ordering::Relaxed).saturating_sub(n);
            inode.nlookup.store(left, Ordering::Relaxed);
            if left == 0 {
                let key = inode.key;
                freed.extend(maps.by_node.remove(&node.0));
                // Only remove the key entry if it still names this inode.
                if maps.by_key.get(&key).is_some_and(|i| i.node == node) {
                    maps.by_key.remove(&key);
                }
            }
        }
        drop(maps);
        drop(freed);
    }

    /// Number of inodes known, the root included.
    pub fn count(&self) -> usize {
        self.read().by_node.len()
    }
}
