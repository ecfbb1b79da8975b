//! The node layer: write a file system as a tree of objects, and let the
//! library keep the kernel's bookkeeping (the job of go-fuse's `fs`
//! package).
//!
//! An author implements [`Node`] for each kind of object: a directory's
//! [`Node::lookup`] returns the child as an `Arc<dyn Node>`, its
//! [`Node::readdir`] lists names; a file answers [`Node::getattr`] and
//! [`Node::read`] (or hands out a [`Handle`] per open from [`Node::open`]).
//! Writable trees add [`Node::write`], [`Node::setattr`], [`Node::create`],
//! [`Node::mkdir`], [`Node::unlink`], [`Node::rmdir`], [`Node::rename`]; the
//! defaults refuse with `EROFS`. [`NodeFs`] wraps the root and implements
//! [`Filesystem`], so it runs on every transport (`dev`, `uring`, the
//! preload shim, the rings).
//!
//! What the library keeps for the author:
//! - node ids: a node gets one the first time the kernel learns of it, and
//!   the same one as long as the kernel remembers it. Identity is the `Arc`:
//!   return the same `Arc` (a hard link, a node kept in a map) and the
//!   kernel sees one inode; return a fresh `Arc` on each lookup and each is
//!   an inode of its own until forgotten.
//! - lookup counts and FORGET: each entry handed to the kernel counts; when
//!   the kernel forgets the last one, the library drops its `Arc`.
//! - `st_ino`: an `Attr::ino` of 0 is filled with the node id.
//! - open handles: a [`Handle`] from [`Node::open`] serves that open's
//!   reads and writes and is dropped at release.
//! - directory listings: a directory is listed once per `opendir`, with
//!   `.` and `..`, and served in pieces from that snapshot, so that a
//!   listing stays consistent while the directory changes.
//! - notifications: [`NodeFs::notify_content`] and
//!   [`NodeFs::notify_entry`] find the node ids of the nodes they are given.
//!
//! Locking: one mutex guards the table (ids, counts, handles); it is never
//! held while a [`Node`] method runs, so nodes may take their own locks in
//! any order and may call back into [`NodeFs`].

use crate::sync::Unpoison;
use std::any::Any;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::errno::{Errno, Result};
use crate::filesystem::{Filesystem, InitConfig};
use crate::lookups::LookupCount;
use crate::notify::Notifier;
use crate::types::*;

/// One object of the tree: a directory, a file, a symbolic link.
///
/// Only [`Node::getattr`] is required. A read-only tree implements
/// `lookup` and `readdir` on directories and `read` on files; a writable
/// one adds the methods that change the tree.
#[allow(unused_variables)]
pub trait Node: Any + Send + Sync {
    /// The node's attributes (`stat(2)`). Leave `ino` 0 to report the node
    /// id as `st_ino`.
    fn getattr(&self, req: &Request) -> Result<Attr>;

    /// The child `name` of this directory; `ENOENT` when there is none.
    fn lookup(&self, req: &Request, name: &OsStr) -> Result<Arc<dyn Node>> {
        Err(Errno::ENOENT)
    }

    /// Every name in this directory (without `.` and `..`), listed once per
    /// `opendir`.
    fn readdir(&self, req: &Request) -> Result<Vec<DirItem>> {
        Err(Errno::ENOTDIR)
    }

    /// Opens the file. The default opens with no handle: reads and writes
    /// go to [`Node::read`] and [`Node::write`]. Return a [`Handle`] to
    /// serve one open by itself (a snapshot of generated content, a
    /// connection), and `direct_io` for content whose size `getattr` cannot
    /// tell in advance. An open for writing with `O_TRUNC` (`> file`)
    /// first empties the file through [`Node::setattr`] (size 0).
    fn open(&self, req: &Request, flags: OpenFlags) -> Result<Open> {
        Ok(Open::default())
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns the count (short
    /// only at the end of the file). [`read_slice`] serves a byte slice.
    fn read(&self, req: &Request, offset: u64, buf: &mut [u8]) -> Result<usize> {
        Err(Errno::EINVAL)
    }

    /// Writes `data` at `offset`; returns the count written.
    fn write(&self, req: &Request, offset: u64, data: &[u8]) -> Result<usize> {
        Err(Errno::EROFS)
    }

    /// The target of a symbolic link.
    fn readlink(&self, req: &Request) -> Result<Vec<u8>> {
        Err(Errno::EINVAL)
    }

    /// chmod, chown, truncate, utimensat: applies `set` and returns the new
    /// attributes.
    fn setattr(&self, req: &Request, set: &SetAttr) -> Result<Attr> {
        Err(Errno::EROFS)
    }

    /// Makes the file `name` in this directory (then opened by its
    /// [`Node::open`]). Must fail with `EEXIST` when the name exists.
    fn create(&self, req: &Request, name: &OsStr, new: &NewNode) -> Result<Arc<dyn Node>> {
        Err(Errno::EROFS)
    }

    /// Makes the directory `name` in this directory.
    fn mkdir(&self, req: &Request, name: &OsStr, new: &NewNode) -> Result<Arc<dyn Node>> {
        Err(Errno::EROFS)
    }

    /// Makes the symbolic link `name` to `target` in this directory.
    fn symlink(&self, req: &Request, name: &OsStr, target: &OsStr) -> Result<Arc<dyn Node>> {
        Err(Errno::EROFS)
    }

    /// Removes the non-directory `name` from this directory.
    fn unlink(&self, req: &Request, name: &OsStr) -> Result<()> {
        Err(Errno::EROFS)
    }

    /// Removes the empty directory `name` from this directory.
    fn rmdir(&self, req: &Request, name: &OsStr) -> Result<()> {
        Err(Errno::EROFS)
    }

    /// Moves `name` of this directory to `new_name` in `new_parent` (which
    /// may be this directory; downcast it with `(&**new_parent as &dyn
    /// Any).downcast_ref::<MyDir>()`).
    fn rename(
        &self,
        req: &Request,
        name: &OsStr,
        new_parent: &Arc<dyn Node>,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        Err(Errno::EROFS)
    }
}

/// One open of a file, when [`Node::open`] wants one of its own.
#[allow(unused_variables)]
pub trait Handle: Send + Sync {
    /// As [`Node::read`], for this open.
    fn read(&self, req: &Request, offset: u64, buf: &mut [u8]) -> Result<usize>;

    /// As [`Node::write`], for this open.
    fn write(&self, req: &Request, offset: u64, data: &[u8]) -> Result<usize> {
        Err(Errno::EBADF)
    }
}

/// What [`Node::open`] returns.
#[derive(Default)]
pub struct Open {
    /// Serves this open's reads and writes instead of the node; dropped at
    /// release (the last close).
    pub handle: Option<Box<dyn Handle>>,
    /// `FOPEN_*` flags for the kernel (direct I/O, keep cache...).
    pub flags: FopenFlags,
}

/// A name in a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirItem {
    /// The name (no `/`, not `.` or `..`).
    pub name: OsString,
    /// The child's type.
    pub kind: FileType,
    /// The child's `st_ino`; 0 lets the library report the child's node id
    /// when the kernel knows the child, else a stand-in.
    pub ino: u64,
}

impl DirItem {
    /// A name of type `kind`, its `st_ino` left to the library.
    pub fn new(name: impl Into<OsString>, kind: FileType) -> DirItem {
        DirItem {
            name: name.into(),
            kind,
            ino: 0,
        }
    }
}

/// Copies what `data` holds from `offset` into `buf`; returns the count.
/// The whole of a [`Node::read`] over bytes in memory.
pub fn read_slice(data: &[u8], offset: u64, buf: &mut [u8]) -> usize {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
    let n = (data.len() - start).min(buf.len());
    buf[..n].copy_from_slice(&data[start..start + n]);
    n
}

/// A tree of [`Node`]s served as a [`Filesystem`]. See the module docs.
pub struct NodeFs {
    table: Mutex<Table>,
    notifier: OnceLock<Notifier>,
}

struct Known {
    node: Arc<dyn Node>,
    /// Entries the kernel holds (the root's is never counted down).
    lookups: LookupCount,
    /// Names it was looked up by, to forget them with it.
    names: Vec<(u64, OsString)>,
}

struct Table {
    by_id: HashMap<u64, Known>,
    by_ptr: HashMap<usize, u64>,
    /// (parent id, name) -> child id, for listings' `d_ino`.
    children: HashMap<(u64, OsString), u64>,
    handles: HashMap<u64, Arc<dyn Handle>>,
    listings: HashMap<u64, Arc<Vec<DirItem>>>,
    next_id: u64,
    next_fh: u64,
}

fn ptr(node: &Arc<dyn Node>) -> usize {
    Arc::as_ptr(node) as *const () as usize
}

impl NodeFs {
    /// Serves the tree under `root`.
    pub fn new(root: Arc<dyn Node>) -> NodeFs {
        let mut by_id = HashMap::new();
        let mut by_ptr = HashMap::new();
        by_ptr.insert(ptr(&root), NodeId::ROOT.0);
        by_id.insert(
            NodeId::ROOT.0,
            Known {
                node: root,
                lookups: LookupCount::new(1),
                names: Vec::new(),
            },
        );
        NodeFs {
            table: Mutex::new(Table {
                by_id,
                by_ptr,
                children: HashMap::new(),
                handles: HashMap::new(),
                listings: HashMap::new(),
                next_id: NodeId::ROOT.0 + 1,
                next_fh: 1,
            }),
            notifier: OnceLock::new(),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unpoison()
    }

    fn node(&self, id: NodeId) -> Result<Arc<dyn Node>> {
        // ESTALE: the kernel named a node it had forgotten.
        self.table()
            .by_id
            .get(&id.0)
            .map(|k| k.node.clone())
            .ok_or(Errno::ESTALE)
    }

    /// The node id the kernel knows `node` by, if it knows it.
    pub fn node_id(&self, node: &Arc<dyn Node>) -> Option<NodeId> {
        self.table().by_ptr.get(&ptr(node)).map(|&id| NodeId(id))
    }

    /// Nodes the kernel holds now, the root included: each lookup adds its
    /// node until the kernel forgets it.
    pub fn known(&self) -> usize {
        self.table().by_id.len()
    }

    /// The notifier the kernel connection gave (after `init`).
    pub fn notifier(&self) -> Option<&Notifier> {
        self.notifier.get()
    }

    /// Tells the kernel (and ring clients) that `node`'s attributes and
    /// content changed. Nothing to do when the kernel does not know it.
    pub fn notify_content(&self, node: &Arc<dyn Node>) -> io::Result<()> {
        match (self.node_id(node), self.notifier.get()) {
            (Some(id), Some(n)) => ignore_enoent(n.inval_inode(id, 0, 0)),
            _ => Ok(()),
        }
    }

    /// Tells the kernel (and ring clients) that `name` in directory
    /// `parent` changed (appeared, went, points elsewhere). Not from inside
    /// a request on `parent` (see [`crate::notify`]).
    pub fn notify_entry(&self, parent: &Arc<dyn Node>, name: &OsStr) -> io::Result<()> {
        match (self.node_id(parent), self.notifier.get()) {
            (Some(id), Some(n)) => ignore_enoent(n.inval_entry(id, name)),
            _ => Ok(()),
        }
    }

    /// Counts one more kernel reference to `child`, found as `name` in
    /// `parent`, and builds its entry.
    fn remember(&self, parent: NodeId, name: &OsStr, child: Arc<dyn Node>, mut attr: Attr) -> Entry {
        let mut t = self.table();
        let key = ptr(&child);
        let id = match t.by_ptr.get(&key) {
            Some(&id) => id,
            None => {
                let id = t.next_id;
                t.next_id += 1;
                t.by_ptr.insert(key, id);
                t.by_id.insert(
                    id,
                    Known {
                        node: child,
                        lookups: LookupCount::default(),
                        names: Vec::new(),
                    },
                );
                id
            }
        };
        let link = (parent.0, name.to_os_string());
        let known = t.by_id.get_mut(&id).expect("inserted above");
        known.lookups.add(1);
        if !known.names.contains(&link) {
            known.names.push(link.clone());
        }
        t.children.insert(link, id);
        if attr.ino == 0 {
            attr.ino = id;
        }
        Entry::new(NodeId(id), attr)
    }

    fn entry(&self, req: &Request, parent: NodeId, name: &OsStr, child: Arc<dyn Node>) -> Result<Entry> {
        let attr = child.getattr(req)?;
        Ok(self.remember(parent, name, child, attr))
    }

    fn attr(&self, id: NodeId, mut attr: Attr) -> Attr {
        if attr.ino == 0 {
            attr.ino = id.0;
        }
        attr
    }

    fn unlinked(&self, parent: NodeId, name: &OsStr) {
        let mut t = self.table();
        if let Some(id) = t.children.remove(&(parent.0, name.to_os_string())) {
            if let Some(k) = t.by_id.get_mut(&id) {
                k.names.retain(|(p, n)| !(*p == parent.0 && n == name));
            }
        }
    }

    fn handle(&self, fh: FileHandle) -> Option<Arc<dyn Handle>> {
        self.table().handles.get(&fh.0).cloned()
    }
}

fn ignore_enoent(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

impl Filesystem for NodeFs {
    fn init(&self, config: &mut InitConfig) -> Result<()> {
        let _ = self.notifier.set(config.notifier.clone());
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        let child = self.node(parent)?.lookup(req, name)?;
        self.entry(req, parent, name, child)
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        if node == NodeId::ROOT {
            return;
        }
        let mut t = self.table();
        let Some(k) = t.by_id.get_mut(&node.0) else {
            return;
        };
        if !k.lookups.forget(nlookup) {
            return;
        }
        let k = t.by_id.remove(&node.0).expect("found above");
        t.by_ptr.remove(&ptr(&k.node));
        for link in k.names {
            if t.children.get(&link) == Some(&node.0) {
                t.children.remove(&link);
            }
        }
        // The node itself drops here, after the lock: a node's Drop may
        // be slow or take locks of its own.
        drop(t);
        drop(k.node);
    }

    fn getattr(&self, req: &Request, node: NodeId, _fh: Option<FileHandle>) -> Result<Attr> {
        let attr = self.node(node)?.getattr(req)?;
        Ok(self.attr(node, attr))
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        let attr = self.node(node)?.setattr(req, set)?;
        Ok(self.attr(node, attr))
    }

    fn readlink(&self, req: &Request, node: NodeId) -> Result<Vec<u8>> {
        self.node(node)?.readlink(req)
    }

    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        let child = self.node(parent)?.symlink(req, name, target)?;
        self.entry(req, parent, name, child)
    }

    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        let child = self.node(parent)?.mkdir(req, name, new)?;
        self.entry(req, parent, name, child)
    }

    fn unlink(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.node(parent)?.unlink(req, name)?;
        self.unlinked(parent, name);
        Ok(())
    }

    fn rmdir(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.node(parent)?.rmdir(req, name)?;
        self.unlinked(parent, name);
        Ok(())
    }

    fn rename(
        &self,
        req: &Request,
        parent: NodeId,
        name: &OsStr,
        new_parent: NodeId,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        let to = self.node(new_parent)?;
        self.node(parent)?.rename(req, name, &to, new_name, flags)?;
        self.unlinked(parent, name);
        self.unlinked(new_parent, new_name);
        Ok(())
    }

    fn open(&self, req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened> {
        let n = self.node(node)?;
        // The dispatcher asks for FUSE_ATOMIC_O_TRUNC, so `> file` reaches
        // OPEN with O_TRUNC and no SETATTR: the node sees the truncation
        // as the setattr it would have had without it.
        if flags.contains(OpenFlags::TRUNC) && flags.writable() {
            let set = SetAttr {
                size: Some(0),
                ..SetAttr::default()
            };
            n.setattr(req, &set)?;
        }
        let open = n.open(req, flags)?;
        Ok(self.opened(open))
    }

    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, flags: OpenFlags) -> Result<Created> {
        let child = self.node(parent)?.create(req, name, new)?;
        let open = child.open(req, flags)?;
        let entry = self.entry(req, parent, name, child)?;
        Ok(Created {
            entry,
            opened: self.opened(open),
        })
    }

    fn read(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if let Some(h) = self.handle(fh) {
            return h.read(req, offset, buf);
        }
        self.node(node)?.read(req, offset, buf)
    }

    fn write(&self, req: &Request, node: NodeId, fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        if let Some(h) = self.handle(fh) {
            return h.write(req, args.offset, data);
        }
        self.node(node)?.write(req, args.offset, data)
    }

    fn release(&self, _req: &Request, _node: NodeId, fh: FileHandle, _args: &ReleaseArgs) -> Result<()> {
        let handle = self.table().handles.remove(&fh.0);
        drop(handle);
        Ok(())
    }

    fn opendir(&self, req: &Request, node: NodeId, _flags: OpenFlags) -> Result<Opened> {
        let items = self.node(node)?.readdir(req)?;
        let mut listing = Vec::with_capacity(items.len() + 2);
        listing.push(DirItem::new(".", FileType::Directory));
        listing.push(DirItem::new("..", FileType::Directory));
        listing.extend(items);
        let mut t = self.table();
        let fh = t.next_fh;
        t.next_fh += 1;
        t.listings.insert(fh, Arc::new(listing));
        Ok(Opened::handle(fh))
    }

    fn readdir(&self, _req: &Request, node: NodeId, fh: FileHandle, offset: u64, sink: &mut dyn DirSink) -> Result<()> {
        let listing = self.table().listings.get(&fh.0).cloned().ok_or(Errno::EBADF)?;
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, item) in listing.iter().enumerate().skip(skip) {
            let ino = match (item.ino, i) {
                (0, 0 | 1) => node.0,
                (0, _) => {
                    let t = self.table();
                    // A stand-in for a child the kernel does not know:
                    // unique within the listing, never 0.
                    t.children
                        .get(&(node.0, item.name.clone()))
                        .copied()
                        .unwrap_or(u64::MAX - i as u64)
                }
                (ino, _) => ino,
            };
            if !sink.add(ino, i as u64 + 1, item.kind, &item.name) {
                break;
            }
        }
        Ok(())
    }

    fn releasedir(&self, _req: &Request, _node: NodeId, fh: FileHandle, _flags: OpenFlags) -> Result<()> {
        self.table().listings.remove(&fh.0);
        Ok(())
    }
}

impl NodeFs {
    fn opened(&self, open: Open) -> Opened {
        let fh = match open.handle {
            Some(h) => {
                let mut t = self.table();
                let fh = t.next_fh;
                t.next_fh += 1;
                t.handles.insert(fh, Arc::from(h));
                fh
            }
            None => 0,
        };
        Opened {
            fh: FileHandle(fh),
            flags: open.flags,
            data_map: None,
        }
    }
}
