//! The [`Filesystem`] that `pack` and `stripe` share: the namespace and
//! attributes live in a [`Tree`]; where a regular file's bytes live is up to
//! a [`Storage`]. Node ids are the tree's inode numbers.
//!
//! One mutex guards the tree and the storage; these file systems show data
//! maps (whose reads and writes are meant to skip the daemon), not a
//! scalable daemon-side data path.
//!
//! Hard links, `RENAME_EXCHANGE` and extended attributes (in the tree's
//! journal, with the inode) are kept as ext4 keeps them; `SEEK_DATA` and
//! `SEEK_HOLE` ask the backing files, whose holes are the file's.
//! Not supported, with the answer given: `RENAME_WHITEOUT` (`EINVAL`),
//! `fallocate` (`ENOSYS`, which the kernel turns into `EOPNOTSUPP`).
//! Permissions are not checked by the daemon: mount with `-o
//! default_permissions` to have the kernel check them. Access times are
//! not updated by reads.

use shortfuse::sync::Unpoison;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::sync::{Mutex, MutexGuard};

use shortfuse::{
    Attr, Created, DataMap, DirSink, Entry, Errno, FallocateFlags, FileHandle, FileType, Filesystem, NewNode, NodeId,
    OpenFlags, Opened, ReleaseArgs, RenameFlags, Request, Result, SetAttr, SetTime, Statfs, Timestamp, Whence,
    WriteArgs, XattrFlags,
};

use super::tree::{Node, Payload, Tree, ROOT};

/// Where regular files' bytes live. Offsets and lengths handed in are
/// already clipped to the file (`off < size` for reads).
pub trait Storage: Send + 'static {
    type Payload: Payload;

    /// Storage of a new, empty file with inode number `ino`.
    fn create(&mut self, ino: u64) -> Result<Self::Payload>;
    fn read(&mut self, p: &Self::Payload, size: u64, off: u64, buf: &mut [u8]) -> Result<usize>;
    /// Writes `data` at `off`; bytes between `size` and `off` must read as
    /// zeros afterwards. May move the file (`p` is saved afterwards).
    fn write(&mut self, p: &mut Self::Payload, size: u64, off: u64, data: &[u8]) -> Result<()>;
    /// Changes the size from `size` to `new`; new bytes read as zeros.
    fn truncate(&mut self, p: &mut Self::Payload, size: u64, new: u64) -> Result<()>;
    /// Makes `[off, off + len)`, within `size`, read as zeros: a hole in
    /// the backing files (`fallocate` PUNCH_HOLE and ZERO_RANGE).
    fn punch(&mut self, p: &Self::Payload, size: u64, off: u64, len: u64) -> Result<()>;
    /// The file is gone: free its space.
    fn remove(&mut self, p: &Self::Payload);
    /// The map handed out at open.
    fn map(&mut self, p: &Self::Payload, size: u64) -> Result<DataMap>;
    /// `SEEK_DATA` or `SEEK_HOLE` (`whence`) from `off < size`: where the
    /// backing files have data, or a hole (the end of the file is one).
    fn seek(&mut self, p: &Self::Payload, size: u64, off: u64, whence: i32) -> Result<u64>;
    /// The file's size when the backing files know better than the tree
    /// (data written through a map, past the daemon).
    fn size(&mut self, p: &Self::Payload) -> Option<u64>;
    fn sync(&mut self, p: &Self::Payload) -> Result<()>;
    /// The file's last open handle was released (it still has a name).
    fn closed(&mut self, _p: &Self::Payload) {}
    /// Called after a release, with the whole tree, for housekeeping such
    /// as compaction. It runs on every close: it must cost nothing when
    /// there is nothing to do.
    fn maintain(&mut self, tree: &mut Tree<Self::Payload>) -> Result<()>;
}

struct Inner<S: Storage> {
    tree: Tree<S::Payload>,
    store: S,
    /// Files written since their record was last saved.
    dirty: HashSet<u64>,
}

/// A file system made of a [`Tree`] and a [`Storage`].
pub struct MetaFs<S: Storage> {
    inner: Mutex<Inner<S>>,
}

impl<S: Storage> MetaFs<S> {
    pub(crate) fn from_parts(tree: Tree<S::Payload>, store: S) -> MetaFs<S> {
        MetaFs {
            inner: Mutex::new(Inner {
                tree,
                store,
                dirty: HashSet::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<S>> {
        self.inner.lock().unpoison()
    }

    /// Runs `f` on the storage and the tree (for file-system specific
    /// operations such as compaction).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut S, &mut Tree<S::Payload>) -> T) -> T {
        let mut g = self.lock();
        let Inner { tree, store, .. } = &mut *g;
        f(store, tree)
    }

    /// Saves every file written since its last save (attributes and size).
    pub fn flush_all(&self) -> Result<()> {
        let mut g = self.lock();
        let dirty: Vec<u64> = g.dirty.drain().collect();
        for ino in dirty {
            g.tree.save(ino)?;
        }
        Ok(())
    }
}

impl<S: Storage> Drop for MetaFs<S> {
    fn drop(&mut self) {
        if let Err(e) = self.flush_all() {
            tracing::warn!("saving file sizes at shutdown: {e}");
        }
    }
}

impl<S: Storage> Inner<S> {
    fn attr(&mut self, ino: u64) -> Result<Attr> {
        let n = self.tree.get(ino)?;
        let mut size = n.size;
        if n.kind == FileType::Regular {
            let p = n.payload.clone();
            if let Some(s) = self.store.size(&p) {
                size = s;
            }
        }
        let n = self.tree.get(ino)?;
        let nlink = n.nlink();
        Ok(Attr {
            ino,
            size: if n.kind == FileType::Symlink {
                n.target.len() as u64
            } else {
                size
            },
            blocks: size.div_ceil(512),
            atime: n.atime,
            mtime: n.mtime,
            ctime: n.ctime,
            mode: n.mode,
            nlink,
            uid: n.uid,
            gid: n.gid,
            rdev: n.rdev,
            blksize: 4096,
        })
    }

    fn entry(&mut self, ino: u64) -> Result<Entry> {
        let attr = self.attr(ino)?;
        self.tree.get_mut(ino)?.lookups += 1;
        Ok(Entry::new(NodeId(ino), attr))
    }

    fn regular(&self, ino: u64) -> Result<&Node<S::Payload>> {
        let n = self.tree.get(ino)?;
        match n.kind {
            FileType::Regular => Ok(n),
            FileType::Directory => Err(Errno::EISDIR),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Drops `ino` if nothing references it any more, freeing its data.
    fn reap(&mut self, ino: u64) {
        if let Some(n) = self.tree.reap(ino) {
            self.dirty.remove(&ino);
            if n.kind == FileType::Regular {
                self.store.remove(&n.payload);
            }
        }
    }

    /// Takes the name `(parent, name)` of `ino` away, and its data with
    /// its last name once nothing references it.
    fn unlink_node(&mut self, ino: u64, parent: u64, name: &OsStr) -> Result<()> {
        if let Some(n) = self.tree.unlink(ino, parent, name)? {
            self.dirty.remove(&ino);
            if n.kind == FileType::Regular {
                self.store.remove(&n.payload);
            }
        }
        Ok(())
    }

    fn truncate(&mut self, ino: u64, new: u64) -> Result<()> {
        let n = self.regular(ino)?;
        let (mut p, size) = (n.payload.clone(), n.size);
        let size = self.store.size(&p).unwrap_or(size);
        if new != size {
            self.store.truncate(&mut p, size, new)?;
        }
        let n = self.tree.get_mut(ino)?;
        n.payload = p;
        n.size = new;
        let now = Timestamp::now();
        n.mtime = now;
        n.ctime = now;
        self.dirty.remove(&ino);
        self.tree.save(ino)
    }

    fn new_node(&mut self, req: &Request, parent: u64, name: &OsStr, kind: FileType, new: &NewNode) -> Result<u64> {
        let mut node = Node::new(0, parent, name, kind, new.mode & !new.umask, req.uid, req.gid);
        node.rdev = new.rdev;
        self.tree.insert(node)
    }

    fn open_map(&mut self, ino: u64) -> Result<Opened> {
        let n = self.tree.get(ino)?;
        let (p, size) = (n.payload.clone(), n.size);
        let map = self.store.map(&p, size)?;
        self.tree.get_mut(ino)?.opens += 1;
        Ok(Opened {
            fh: FileHandle(ino),
            data_map: Some(map),
            ..Opened::default()
        })
    }
}

fn set_time(t: SetTime) -> Timestamp {
    match t {
        SetTime::Now => Timestamp::now(),
        SetTime::At(t) => t,
    }
}

impl<S: Storage> Filesystem for MetaFs<S> {
    fn destroy(&self) {
        if let Err(e) = self.flush_all() {
            tracing::warn!("saving file sizes at unmount: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        let mut g = self.lock();
        let ino = g.tree.child(parent.0, name)?;
        g.entry(ino)
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        let mut g = self.lock();
        if let Ok(n) = g.tree.get_mut(node.0) {
            n.lookups = n.lookups.saturating_sub(nlookup);
            g.reap(node.0);
        }
    }

    fn getattr(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>) -> Result<Attr> {
        self.lock().attr(node.0)
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        let mut g = self.lock();
        let ino = node.0;
        if let Some(size) = set.size {
            g.truncate(ino, size)?;
        }
        let n = g.tree.get_mut(ino)?;
        if let Some(mode) = set.mode {
            n.mode = (n.mode & libc::S_IFMT) | (mode & 0o7777);
        }
        if let Some(uid) = set.uid {
            n.uid = uid;
        }
        if let Some(gid) = set.gid {
            n.gid = gid;
        }
        if set.kill_suidgid {
            n.mode &= !req.setid_bits_to_clear(n.mode, n.gid);
        }
        if let Some(t) = set.atime {
            n.atime = set_time(t);
        }
        if let Some(t) = set.mtime {
            n.mtime = set_time(t);
        }
        n.ctime = set.ctime.unwrap_or_else(Timestamp::now);
        g.dirty.remove(&ino);
        g.tree.save(ino)?;
        g.attr(ino)
    }

    fn readlink(&self, _req: &Request, node: NodeId) -> Result<Vec<u8>> {
        let g = self.lock();
        let n = g.tree.get(node.0)?;
        if n.kind != FileType::Symlink {
            return Err(Errno::EINVAL);
        }
        Ok(n.target.clone())
    }

    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        let mut g = self.lock();
        let mut node = Node::new(0, parent.0, name, FileType::Symlink, 0o777, req.uid, req.gid);
        node.target = std::os::unix::ffi::OsStrExt::as_bytes(target).to_vec();
        let ino = g.tree.insert(node)?;
        g.entry(ino)
    }

    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        let mut g = self.lock();
        let kind = FileType::from_mode(new.mode);
        let ino = g.new_node(req, parent.0, name, kind, new)?;
        if kind == FileType::Regular {
            let p = g.store.create(ino)?;
            g.tree.get_mut(ino)?.payload = p;
            g.tree.save(ino)?;
        }
        g.entry(ino)
    }

    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        let mut g = self.lock();
        let ino = g.new_node(req, parent.0, name, FileType::Directory, new)?;
        g.entry(ino)
    }

    fn unlink(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        let mut g = self.lock();
        let ino = g.tree.child(parent.0, name)?;
        if g.tree.get(ino)?.kind == FileType::Directory {
            return Err(Errno::EISDIR);
        }
        g.unlink_node(ino, parent.0, name)
    }

    fn rmdir(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        if name == "." {
            return Err(Errno::EINVAL);
        }
        if name == ".." {
            return Err(Errno::ENOTEMPTY);
        }
        let mut g = self.lock();
        let ino = g.tree.child(parent.0, name)?;
        if !g.tree.dir(ino)?.children.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        g.unlink_node(ino, parent.0, name)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: NodeId,
        name: &OsStr,
        new_parent: NodeId,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.whiteout || (flags.exchange && flags.noreplace) {
            return Err(Errno::EINVAL);
        }
        if new_name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut g = self.lock();
        let src = g.tree.child(parent.0, name)?;
        g.tree.dir(new_parent.0)?;
        let src_dir = g.tree.get(src)?.kind == FileType::Directory;
        if src_dir && g.tree.is_within(new_parent.0, src) {
            return Err(Errno::EINVAL);
        }
        if flags.exchange {
            let dst = g.tree.child(new_parent.0, new_name)?;
            if dst == src {
                return Ok(());
            }
            if g.tree.get(dst)?.kind == FileType::Directory && g.tree.is_within(parent.0, dst) {
                return Err(Errno::EINVAL);
            }
            return g.tree.exchange(src, (parent.0, name), dst, (new_parent.0, new_name));
        }
        match g.tree.child(new_parent.0, new_name) {
            Ok(dst) if dst == src => return Ok(()),
            Ok(_) if flags.noreplace => return Err(Errno::EEXIST),
            Ok(dst) => {
                let d = g.tree.get(dst)?;
                match (src_dir, d.kind == FileType::Directory) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) if !d.children.is_empty() => return Err(Errno::ENOTEMPTY),
                    _ => {}
                }
                g.unlink_node(dst, new_parent.0, new_name)?;
            }
            Err(e) if e == Errno::ENOENT => {}
            Err(e) => return Err(e),
        }
        g.tree.relink(src, (parent.0, name), (new_parent.0, new_name))
    }

    fn link(&self, _req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry> {
        let mut g = self.lock();
        g.tree.link(node.0, new_parent.0, new_name)?;
        g.entry(node.0)
    }

    fn open(&self, _req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened> {
        let mut g = self.lock();
        g.regular(node.0)?;
        if flags.contains(OpenFlags::TRUNC) && flags.access_mode() != OpenFlags::RDONLY {
            g.truncate(node.0, 0)?;
        }
        g.open_map(node.0)
    }

    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, _flags: OpenFlags) -> Result<Created> {
        let mut g = self.lock();
        let ino = g.new_node(req, parent.0, name, FileType::Regular, new)?;
        match g.store.create(ino) {
            Ok(p) => g.tree.get_mut(ino)?.payload = p,
            Err(e) => {
                g.unlink_node(ino, parent.0, name)?;
                return Err(e);
            }
        }
        g.tree.save(ino)?;
        let entry = g.entry(ino)?;
        let opened = g.open_map(ino)?;
        Ok(Created { entry, opened })
    }

    fn read(&self, _req: &Request, node: NodeId, _fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut g = self.lock();
        let n = g.regular(node.0)?;
        let (p, size) = (n.payload.clone(), n.size);
        let size = g.store.size(&p).unwrap_or(size);
        if offset >= size {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        let got = g.store.read(&p, size, offset, &mut buf[..want])?;
        // A backing file shorter than the file (never expected) reads as a hole.
        buf[got..want].fill(0);
        Ok(want)
    }

    fn write(&self, req: &Request, node: NodeId, _fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        let mut g = self.lock();
        let n = g.regular(node.0)?;
        let (mut p, size) = (n.payload.clone(), n.size);
        let size = g.store.size(&p).unwrap_or(size);
        let end = args.offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > i64::MAX as u64 {
            return Err(Errno::EFBIG);
        }
        g.store.write(&mut p, size, args.offset, data)?;
        let n = g.tree.get_mut(node.0)?;
        n.payload = p;
        n.size = size.max(end);
        let now = Timestamp::now();
        n.mtime = now;
        n.ctime = now;
        if args.write_flags & shortfuse::abi::FUSE_WRITE_KILL_SUIDGID != 0 {
            n.mode &= !req.setid_bits_to_clear(n.mode, n.gid);
        }
        g.dirty.insert(node.0);
        Ok(data.len())
    }

    fn flush(&self, _req: &Request, node: NodeId, _fh: FileHandle, _lock_owner: u64) -> Result<()> {
        let mut g = self.lock();
        if g.dirty.remove(&node.0) {
            g.tree.save(node.0)?;
        }
        Ok(())
    }

    fn release(&self, _req: &Request, node: NodeId, _fh: FileHandle, _args: &ReleaseArgs) -> Result<()> {
        let mut g = self.lock();
        if g.dirty.remove(&node.0) {
            g.tree.save(node.0)?;
        }
        if let Ok(n) = g.tree.get_mut(node.0) {
            n.opens = n.opens.saturating_sub(1);
            if n.opens == 0 && n.linked && n.kind == FileType::Regular {
                let p = n.payload.clone();
                g.store.closed(&p);
            }
        }
        g.reap(node.0);
        let Inner { tree, store, .. } = &mut *g;
        store.maintain(tree)
    }

    fn fsync(&self, _req: &Request, node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        let mut g = self.lock();
        if g.dirty.remove(&node.0) {
            g.tree.save(node.0)?;
        }
        let p = g.regular(node.0)?.payload.clone();
        g.store.sync(&p)
    }

    fn opendir(&self, _req: &Request, node: NodeId, _flags: OpenFlags) -> Result<Opened> {
        self.lock().tree.dir(node.0)?;
        Ok(Opened::handle(node.0))
    }

    fn readdir(
        &self,
        _req: &Request,
        node: NodeId,
        _fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> Result<()> {
        // Cookies: 1 for ".", 2 for "..", then the one each name got when
        // it was added (stable whatever is added or removed meanwhile).
        let g = self.lock();
        let d = g.tree.dir(node.0)?;
        if !d.linked && d.ino != ROOT {
            return Ok(());
        }
        if offset < 1 && !sink.add(d.ino, 1, FileType::Directory, OsStr::new(".")) {
            return Ok(());
        }
        if offset < 2 && !sink.add(d.parent, 2, FileType::Directory, OsStr::new("..")) {
            return Ok(());
        }
        for (&cookie, name) in d.by_cookie.range(offset.max(2) + 1..) {
            let Some(child) = d.children.get(name) else { continue };
            let kind = g.tree.nodes.get(&child.ino).map_or(FileType::Regular, |c| c.kind);
            if !sink.add(child.ino, cookie, kind, name) {
                break;
            }
        }
        Ok(())
    }

    fn fsyncdir(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        Ok(())
    }

    /// `fallocate(2)` as on ext4 for what a caller sees: the default mode
    /// and ZERO_RANGE grow the file (unless KEEP_SIZE), PUNCH_HOLE (with
    /// KEEP_SIZE, the VFS rule) and ZERO_RANGE make the range read as
    /// zeros, with holes in the backing files; every success moves mtime
    /// and ctime (ext4's file_modified). Space is not reserved ahead: the
    /// backing files get it when written. COLLAPSE_RANGE, INSERT_RANGE and
    /// UNSHARE_RANGE are refused (EOPNOTSUPP).
    fn fallocate(
        &self,
        _req: &Request,
        node: NodeId,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: FallocateFlags,
    ) -> Result<()> {
        let crate::falloc::Falloc {
            punch,
            zero,
            keep_size: keep,
            end,
        } = crate::falloc::Falloc::parse(offset, length, mode)?;
        if end > i64::MAX as u64 {
            return Err(Errno::EFBIG);
        }
        let mut g = self.lock();
        let n = g.regular(node.0)?;
        let (mut p, size) = (n.payload.clone(), n.size);
        let size = g.store.size(&p).unwrap_or(size);
        if (punch || zero) && offset < size {
            g.store.punch(&p, size, offset, end.min(size) - offset)?;
        }
        let new = if keep { size } else { size.max(end) };
        if new > size {
            g.store.truncate(&mut p, size, new)?;
        }
        let n = g.tree.get_mut(node.0)?;
        n.payload = p;
        n.size = new;
        let now = Timestamp::now();
        n.mtime = now;
        n.ctime = now;
        g.dirty.remove(&node.0);
        g.tree.save(node.0)
    }

    fn lseek(&self, _req: &Request, node: NodeId, _fh: FileHandle, offset: u64, whence: Whence) -> Result<u64> {
        if !matches!(whence, Whence::Data | Whence::Hole) {
            return Err(Errno::EINVAL);
        }
        let mut g = self.lock();
        let n = g.regular(node.0)?;
        let (p, size) = (n.payload.clone(), n.size);
        let size = g.store.size(&p).unwrap_or(size);
        if offset >= size {
            return Err(Errno::ENXIO);
        }
        g.store.seek(&p, size, offset, whence.raw())
    }

    // Extended attributes: the daemon checks no permission (see the module
    // docs), as for the rest; the VFS keeps `user.*` to files and
    // directories.
    fn setxattr(&self, _req: &Request, node: NodeId, name: &OsStr, value: &[u8], flags: XattrFlags) -> Result<()> {
        let mut g = self.lock();
        let n = g.tree.get_mut(node.0)?;
        n.xattrs.set(name, value, flags)?;
        n.ctime = Timestamp::now();
        g.tree.save(node.0)
    }

    fn getxattr(&self, _req: &Request, node: NodeId, name: &OsStr) -> Result<Vec<u8>> {
        self.lock().tree.get(node.0)?.xattrs.get(name)
    }

    fn listxattr(&self, _req: &Request, node: NodeId) -> Result<Vec<u8>> {
        Ok(self.lock().tree.get(node.0)?.xattrs.list())
    }

    fn removexattr(&self, _req: &Request, node: NodeId, name: &OsStr) -> Result<()> {
        let mut g = self.lock();
        let n = g.tree.get_mut(node.0)?;
        n.xattrs.remove(name)?;
        n.ctime = Timestamp::now();
        g.tree.save(node.0)
    }

    fn statfs(&self, _req: &Request, _node: NodeId) -> Result<Statfs> {
        let g = self.lock();
        let used: u64 = g.tree.nodes.values().map(|n| n.size.div_ceil(4096)).sum();
        Ok(Statfs {
            blocks: used,
            files: g.tree.nodes.len() as u64,
            bsize: 4096,
            frsize: 4096,
            namelen: 255,
            ..Statfs::default()
        })
    }
}
