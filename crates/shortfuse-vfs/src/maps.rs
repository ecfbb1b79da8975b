//! Data maps in the client (DeFUSE, IEEE Access 2019): where an open file's bytes
//! live, so that its reads and writes skip the file system.
//!
//! The FUSE wire protocol carries no [`DataMap`] (the kernel gets only a
//! backing id for the 1-to-1 case), so an in-process mount wraps its file
//! system in a [`MapTap`]: every `open`/`create` that returns a map leaves
//! it in the shared [`MapTable`] under (node, file handle), where the VFS
//! picks it up as the OPEN reply comes back.
//!
//! The table also is the M-Cache of DeFUSE: the last map of each node,
//! bounded (least recently used out first). A re-open of a node whose map
//! is cached and whose attributes are still valid skips the file system's
//! `open` altogether (see `Vfs::open`). A map is dropped when the node is
//! forgotten, and a non-1-to-1 map as soon as the file system changes the
//! file's size or data through another path (write, truncate, fallocate,
//! copy_file_range: an M-to-1 file system may move the file meanwhile);
//! every map carries a generation so that descriptors still holding an old
//! one notice. A 1-to-1 map stays valid for the node's life: the backing
//! file is the file.
//!
//! Maps of other processes' changes are not seen before the attributes
//! expire (as the kernel's own attribute cache, nothing more is promised
//! without a daemon that notifies).

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use shortfuse::{
    Attr, CopyRange, Created, DataMap, Errno, FallocateFlags, FileHandle, Filesystem, Forget, NewNode, NodeId,
    OpenFlags, Opened, ReleaseArgs, Request, SetAttr, WriteArgs,
};

/// Default number of nodes whose maps the M-Cache keeps (each holds its
/// backing descriptors open).
pub const MCACHE_NODES: usize = 128;

/// A map as the client holds it: the map and the generation it was valid in.
#[derive(Clone, Debug)]
pub struct HeldMap {
    pub map: Arc<DataMap>,
    pub generation: u64,
}

impl HeldMap {
    /// The backing file when the map is 1-to-1.
    pub fn whole(&self) -> Option<&shortfuse::BackingFile> {
        self.map.as_whole()
    }
}

#[derive(Default)]
struct Inner {
    /// Maps of opens the VFS has not collected yet.
    pending: HashMap<(NodeId, u64), Arc<DataMap>>,
    /// The M-Cache: node -> (map, last use).
    cached: HashMap<NodeId, (Arc<DataMap>, u64)>,
    /// Generation per node with a map: bumped when a map is dropped.
    generations: HashMap<NodeId, u64>,
    tick: u64,
}

/// Maps handed out by a file system, shared by its [`MapTap`] and the VFS.
pub struct MapTable {
    inner: Mutex<Inner>,
    capacity: usize,
    hits: AtomicU64,
}

impl MapTable {
    pub fn new(capacity: usize) -> MapTable {
        MapTable {
            inner: Mutex::new(Inner::default()),
            capacity: capacity.max(1),
            hits: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unpoison()
    }

    fn leave(&self, node: NodeId, fh: u64, map: DataMap) {
        self.lock().pending.insert((node, fh), Arc::new(map));
    }

    /// Collects the map the file system returned for the open `(node, fh)`
    /// and keeps it in the M-Cache.
    pub fn take(&self, node: NodeId, fh: u64) -> Option<HeldMap> {
        let mut g = self.lock();
        let map = g.pending.remove(&(node, fh))?;
        g.tick += 1;
        let tick = g.tick;
        if !g.cached.contains_key(&node) && g.cached.len() >= self.capacity {
            if let Some(old) = g.cached.iter().min_by_key(|(_, (_, t))| *t).map(|(n, _)| *n) {
                g.cached.remove(&old);
            }
        }
        // A 1-to-1 map is kept as an O_PATH descriptor: the file system's
        // own (perhaps writable) one must close with the open (a writer
        // left open makes exec of the file fail with ETXTBSY, and keeps
        // the description's flock alive).
        let keep = match map.as_whole() {
            Some(b) => match path_only(b) {
                Some(p) => Arc::new(DataMap::whole(Arc::new(p))),
                None => {
                    let generation = *g.generations.entry(node).or_insert(0);
                    return Some(HeldMap { map, generation });
                }
            },
            None => map.clone(),
        };
        g.cached.insert(node, (keep, tick));
        let generation = *g.generations.entry(node).or_insert(0);
        Some(HeldMap { map, generation })
    }

    /// The cached map of `node` (an M-Cache hit), marked as just used.
    pub fn cached(&self, node: NodeId) -> Option<HeldMap> {
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        let generation = g.generations.get(&node).copied().unwrap_or(0);
        let (map, used) = g.cached.get_mut(&node)?;
        *used = tick;
        let map = map.clone();
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(HeldMap { map, generation })
    }

    /// Whether a map held since `generation` still describes `node`.
    pub fn current(&self, node: NodeId, generation: u64) -> bool {
        self.lock().generations.get(&node).copied().unwrap_or(0) == generation
    }

    /// The file system changed `node` another way: its non-1-to-1 map may
    /// be wrong now.
    fn changed(&self, node: NodeId) {
        let mut g = self.lock();
        let whole = g.cached.get(&node).is_some_and(|(m, _)| m.as_whole().is_some());
        if whole {
            return;
        }
        g.cached.remove(&node);
        *g.generations.entry(node).or_insert(0) += 1;
    }

    /// The node is gone (forgotten): its number may name another file later.
    fn forgotten(&self, node: NodeId) {
        let mut g = self.lock();
        g.cached.remove(&node);
        if let Some(gen) = g.generations.get_mut(&node) {
            *gen += 1;
        }
    }

    fn released(&self, node: NodeId, fh: FileHandle) {
        self.lock().pending.remove(&(node, fh.0));
    }

    /// (nodes in the M-Cache, opens served from it so far).
    pub fn counts(&self) -> (usize, u64) {
        (self.lock().cached.len(), self.hits.load(Ordering::Relaxed))
    }
}

/// A file system wrapped so that the maps it returns reach a [`MapTable`].
/// Every other call is passed on unchanged (a [`shortfuse::layer::Layer`]).
pub struct MapTap {
    fs: Arc<dyn Filesystem>,
    table: Arc<MapTable>,
}

impl MapTap {
    /// Wraps `fs`; the table is for [`crate::Vfs::set_maps`].
    pub fn wrap(fs: Arc<dyn Filesystem>, capacity: usize) -> (Arc<dyn Filesystem>, Arc<MapTable>) {
        let table = Arc::new(MapTable::new(capacity));
        let tap = MapTap {
            fs,
            table: table.clone(),
        };
        (Arc::new(tap), table)
    }
}

impl shortfuse::layer::Layer for MapTap {
    type Inner = dyn Filesystem;

    fn inner(&self) -> &dyn Filesystem {
        &*self.fs
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        self.table.forgotten(node);
        self.fs.forget(node, nlookup)
    }

    fn batch_forget(&self, forgets: &[Forget]) {
        for f in forgets {
            self.table.forgotten(f.node);
        }
        self.fs.batch_forget(forgets)
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> shortfuse::Result<Attr> {
        if set.size.is_some() {
            self.table.changed(node);
        }
        self.fs.setattr(req, node, set)
    }

    fn open(&self, req: &Request, node: NodeId, flags: OpenFlags) -> shortfuse::Result<Opened> {
        let opened = self.fs.open(req, node, flags)?;
        if let Some(map) = &opened.data_map {
            self.table.leave(node, opened.fh.0, map.clone());
        }
        Ok(opened)
    }

    fn create(
        &self,
        req: &Request,
        parent: NodeId,
        name: &OsStr,
        new: &NewNode,
        flags: OpenFlags,
    ) -> shortfuse::Result<Created> {
        let created = self.fs.create(req, parent, name, new, flags)?;
        if let Some(map) = &created.opened.data_map {
            self.table.leave(created.entry.node, created.opened.fh.0, map.clone());
        }
        Ok(created)
    }

    fn write(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        data: &[u8],
        args: &WriteArgs,
    ) -> shortfuse::Result<usize> {
        self.table.changed(node);
        self.fs.write(req, node, fh, data, args)
    }

    fn release(&self, req: &Request, node: NodeId, fh: FileHandle, args: &ReleaseArgs) -> shortfuse::Result<()> {
        self.table.released(node, fh);
        self.fs.release(req, node, fh, args)
    }

    fn fallocate(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: FallocateFlags,
    ) -> shortfuse::Result<()> {
        self.table.changed(node);
        self.fs.fallocate(req, node, fh, offset, length, mode)
    }

    fn copy_file_range(&self, req: &Request, range: &CopyRange) -> shortfuse::Result<usize> {
        self.table.changed(range.node_out);
        self.fs.copy_file_range(req, range)
    }
}

/// An O_PATH descriptor of the same file.
fn path_only(fd: &OwnedFd) -> Option<OwnedFd> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .ok()
        .map(OwnedFd::from)
}

/// A descriptor of the file behind O_PATH descriptor `fd`, opened with the
/// access mode and status flags of `flags` (the kernel checks permission).
pub(crate) fn reopen(fd: &OwnedFd, flags: i32) -> Result<OwnedFd, Errno> {
    let acc = flags & libc::O_ACCMODE;
    let keep = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME;
    std::fs::OpenOptions::new()
        .read(acc != libc::O_WRONLY)
        .write(acc != libc::O_RDONLY)
        .custom_flags(flags & keep | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(OwnedFd::from)
        .map_err(io_errno)
}

/// What `Errno` a map I/O error becomes.
pub(crate) fn io_errno(e: std::io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole() -> DataMap {
        DataMap::whole(Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap())))
    }

    fn split() -> DataMap {
        let b = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        DataMap {
            extents: vec![shortfuse::Extent {
                backing: b,
                file_offset: 0,
                backing_offset: 4096,
                len: 100,
            }],
        }
    }

    #[test]
    fn maps_are_collected_once_and_cached() {
        let t = MapTable::new(4);
        assert!(t.take(NodeId(2), 7).is_none());
        t.leave(NodeId(2), 7, whole());
        let held = t.take(NodeId(2), 7).unwrap();
        assert!(held.whole().is_some());
        assert!(t.take(NodeId(2), 7).is_none(), "collected twice");
        assert!(t.cached(NodeId(2)).is_some());
        assert_eq!(t.counts(), (1, 1));
        // A release of an open nobody collected drops its map.
        t.leave(NodeId(3), 8, whole());
        t.released(NodeId(3), FileHandle(8));
        assert!(t.take(NodeId(3), 8).is_none());
    }

    #[test]
    fn the_least_recently_used_node_leaves_first() {
        let t = MapTable::new(2);
        for n in 1..=2 {
            t.leave(NodeId(n), 1, whole());
            t.take(NodeId(n), 1);
        }
        // Node 1 used again: node 2 is the oldest now.
        assert!(t.cached(NodeId(1)).is_some());
        t.leave(NodeId(3), 1, whole());
        t.take(NodeId(3), 1);
        assert!(t.cached(NodeId(2)).is_none());
        assert!(t.cached(NodeId(1)).is_some() && t.cached(NodeId(3)).is_some());
        assert_eq!(t.counts().0, 2);
    }

    #[test]
    fn changes_retire_split_maps_but_not_whole_ones() {
        let t = MapTable::new(8);
        t.leave(NodeId(5), 1, split());
        let held = t.take(NodeId(5), 1).unwrap();
        assert!(t.current(NodeId(5), held.generation));
        t.changed(NodeId(5));
        assert!(!t.current(NodeId(5), held.generation));
        assert!(t.cached(NodeId(5)).is_none());
        t.leave(NodeId(6), 1, whole());
        let w = t.take(NodeId(6), 1).unwrap();
        t.changed(NodeId(6));
        assert!(t.current(NodeId(6), w.generation) && t.cached(NodeId(6)).is_some());
        // A forgotten node's number may come back as another file.
        t.forgotten(NodeId(6));
        assert!(!t.current(NodeId(6), w.generation) && t.cached(NodeId(6)).is_none());
    }
}
