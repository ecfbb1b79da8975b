//! The `Filesystem` trait: what a file-system author implements.
//!
//! Inode-based like libfuse's low-level API. Methods take `&self` (one
//! instance serves many worker threads at once) and return values. Every
//! method has a default; `ENOSYS` defaults are remembered by the kernel for
//! some calls (e.g. `access`, `flush`, `fsync`, xattrs: the kernel stops
//! asking and treats the call as succeeded or unsupported for the rest of the
//! connection), so a file system that does not implement them costs nothing.
//! For a tree of objects without this bookkeeping, see [`crate::node`].
//!
//! What to implement:
//! - **read-only**: [`Filesystem::lookup`], [`Filesystem::getattr`],
//!   [`Filesystem::readdir`] and [`Filesystem::read`] (and
//!   [`Filesystem::readlink`] for symbolic links, [`Filesystem::forget`]
//!   when nodes come and go). `open` and `opendir` succeed by default with
//!   handle 0, `statfs` describes an empty file system.
//! - **writable**: also [`Filesystem::setattr`] (truncate, chmod, chown,
//!   utimes: `touch` of an existing file needs it), [`Filesystem::create`]
//!   (`touch` of a new name, `>`), [`Filesystem::write`],
//!   [`Filesystem::mkdir`], [`Filesystem::unlink`], [`Filesystem::rmdir`],
//!   [`Filesystem::rename`], and as supported [`Filesystem::symlink`],
//!   [`Filesystem::link`], [`Filesystem::mknod`], the xattr calls,
//!   [`Filesystem::fsync`]. Their `ENOSYS` default reaches programs as
//!   "Function not implemented".
//!
//! Lookup counting: every [`Entry`] handed back (lookup, create, mkdir,
//! mknod, symlink, link, and each readdirplus entry other than "." and "..")
//! counts as one reference the kernel holds on the node; `forget` returns
//! `nlookup` of them. A node may be freed when its count reaches zero.

use std::ffi::OsStr;

use crate::datamap::BackingFile;
use crate::errno::{Errno, Result};
use crate::notify::{Notifier, PollHandle};
use crate::reply::{ReplyAttr, ReplyData, ReplyEntry, ReplyWrite};
use crate::types::*;

/// What the file system may adjust while the connection is set up
/// (`FUSE_INIT`). Fields start from the mount options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitConfig {
    /// Protocol version the kernel speaks.
    pub kernel_major: u32,
    /// Minor protocol version the kernel speaks.
    pub kernel_minor: u32,
    /// Every `FUSE_*` INIT flag the kernel offers (flags | flags2 << 32).
    pub kernel_flags: u64,
    /// The INIT flags the daemon will ask for; the file system may add or
    /// remove flags the kernel offers (e.g. `FUSE_POSIX_LOCKS` when it
    /// implements `getlk`/`setlk` itself).
    pub want: u64,
    /// Largest WRITE payload the daemon accepts (capped by the kernel's page limit).
    pub max_write: u32,
    /// Largest read-ahead the kernel may do.
    pub max_readahead: u32,
    /// Background requests the kernel keeps in flight (0: its default).
    pub max_background: u16,
    /// Background requests that mark the connection congested (0: its default).
    pub congestion_threshold: u16,
    /// Granularity of timestamps in nanoseconds (1 = full precision).
    pub time_gran: u32,
    /// Tells the kernel (and every ring client) that something changed
    /// behind its cache; keep a clone to use from any method or thread.
    /// See [`crate::notify`].
    pub notifier: Notifier,
    /// How long the kernel may trust the attributes of regular files,
    /// when that should differ from the mount's `attr_timeout`: a file
    /// system whose files change behind the kernel and that tells the
    /// kernel of changes only while it holds a lease on them sets it to
    /// zero, so that a size or time the kernel was given outside a lease
    /// is asked again before use. `None`: the mount's `attr_timeout`.
    pub file_attr_timeout: Option<std::time::Duration>,
    /// How long the kernel trusts a name it was given (the mount's
    /// `entry_timeout`), for a file system whose own caches should last
    /// as long (a directory listing the kernel may keep, for one). Changing
    /// it here changes nothing.
    pub entry_timeout: std::time::Duration,
}

/// A user-space file system. See the module docs for the contract.
#[allow(unused_variables)]
pub trait Filesystem: Send + Sync + 'static {
    /// Called once when the kernel connects, before any other call.
    fn init(&self, config: &mut InitConfig) -> Result<()> {
        Ok(())
    }

    /// Called once when the connection ends (unmount or shutdown).
    fn destroy(&self) {}

    /// Figures of the file system's own work that `shortfuse stats` and
    /// `-o metrics` show beside the requests (see
    /// [`crate::stats::Figures`]); none by default.
    fn figures(&self) -> Option<std::sync::Arc<dyn crate::stats::Figures>> {
        None
    }

    /// Declares the whole tree a 1-to-1 image of a backing directory (see
    /// [`crate::namespace`]): every name beneath the root is the same name
    /// beneath `root`, every node reports the attributes the kernel reports
    /// for the backing inode ([`crate::Attr::from_stat`], `st_ino`
    /// unchanged), READLINK returns the stored target, and the file system
    /// does not need to see path calls that only read (lookups, GETATTR,
    /// ACCESS, READLINK). Transports next to the caller then serve those in
    /// the kernel, beneath `root`, with the caller's credentials. `None`
    /// (the default): every call reaches the file system.
    fn namespace_map(&self) -> Option<crate::NamespaceMap> {
        None
    }

    /// Looks up `name` in directory `parent`. `ENOENT` becomes a negative
    /// entry cached by the kernel for the entry timeout.
    fn lookup(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        Err(Errno::ENOSYS)
    }

    /// The kernel drops `nlookup` references to `node`. No reply is sent.
    fn forget(&self, node: NodeId, nlookup: u64) {}

    /// `FUSE_BATCH_FORGET`: by default one `forget` per item.
    fn batch_forget(&self, forgets: &[Forget]) {
        for f in forgets {
            self.forget(f.node, f.nlookup);
        }
    }

    /// `stat(2)` and the kernel's checks of size and times: the node's
    /// attributes, cached by the kernel for the attribute timeout. `fh` is
    /// the open file when the caller has one (`fstat`).
    fn getattr(&self, req: &Request, node: NodeId, fh: Option<FileHandle>) -> Result<Attr> {
        Err(Errno::ENOSYS)
    }

    /// chmod, chown, truncate, utimensat: applies what `set` holds and
    /// returns the attributes after the change. Needed by a writable file
    /// system (`touch`, `O_TRUNC` opens and `truncate` come here).
    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        Err(Errno::ENOSYS)
    }

    /// The target of a symbolic link.
    fn readlink(&self, req: &Request, node: NodeId) -> Result<Vec<u8>> {
        Err(Errno::ENOSYS)
    }

    /// Makes the symbolic link `parent/name` pointing at `target`; the
    /// entry counts as a lookup. `EEXIST` when the name exists.
    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        Err(Errno::ENOSYS)
    }

    /// Makes a regular file, device, FIFO or socket `parent/name` (type in
    /// `new.mode`); the entry counts as a lookup. The kernel also uses it
    /// for files when `create` answered `ENOSYS`.
    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        Err(Errno::ENOSYS)
    }

    /// Makes the directory `parent/name`; the entry counts as a lookup.
    /// `EEXIST` when the name exists.
    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        Err(Errno::ENOSYS)
    }

    /// Removes the name `parent/name` of a non-directory. The node lives on
    /// while the kernel holds lookups of it or it is open (wait for
    /// `forget` and `release` before freeing it).
    fn unlink(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// Removes the empty directory `parent/name` (`ENOTEMPTY` otherwise).
    fn rmdir(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// `renameat2(2)`, including `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
    fn rename(
        &self,
        req: &Request,
        parent: NodeId,
        name: &OsStr,
        new_parent: NodeId,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// A new hard link `new_parent/new_name` to `node`.
    fn link(&self, req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry> {
        Err(Errno::ENOSYS)
    }

    /// Opens a file. `flags` are the `open(2)` flags (without O_CREAT,
    /// O_EXCL, O_NOCTTY, which the kernel handles). The default succeeds
    /// with handle 0: a stateless file system needs no handles.
    fn open(&self, req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened> {
        Ok(Opened::default())
    }

    /// Creates and opens `parent/name`. `ENOSYS` makes the kernel fall back to
    /// `mknod` + `open` for the rest of the connection. `flags` hold O_EXCL
    /// when the name must not exist: the kernel passes the caller's, and the
    /// preload shim adds it when it creates a name it has not looked up.
    /// The name may exist even without it (another client made it): open
    /// that file or fail with EEXIST, never replace it.
    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, flags: OpenFlags) -> Result<Created> {
        Err(Errno::ENOSYS)
    }

    /// Reads up to `buf.len()` bytes at `offset` into `buf`; returns the
    /// number read (short only at end of file, unless the file is direct-io).
    fn read(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        Err(Errno::ENOSYS)
    }

    /// Writes `data`; returns the number of bytes written.
    fn write(&self, req: &Request, node: NodeId, fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        Err(Errno::ENOSYS)
    }

    /// Called on every `close(2)` of a descriptor. `ENOSYS` is taken as
    /// success and never sent again.
    fn flush(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// The last descriptor of an open file went away. Errors are ignored by
    /// the kernel.
    fn release(&self, req: &Request, node: NodeId, fh: FileHandle, args: &ReleaseArgs) -> Result<()> {
        Ok(())
    }

    /// `ENOSYS` is taken as success and never sent again.
    fn fsync(&self, req: &Request, node: NodeId, fh: FileHandle, datasync: bool) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// Opens a directory for listing. The default succeeds with handle 0;
    /// return a handle to keep a snapshot of the listing per open.
    fn opendir(&self, req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened> {
        Ok(Opened::default())
    }

    /// Lists entries from `offset` (0 = start, otherwise a `next_offset`
    /// given earlier) into `sink` until it is full or the directory ends.
    fn readdir(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, sink: &mut dyn DirSink) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// `readdir` with attributes. `ENOSYS` makes the dispatcher serve it
    /// from `readdir` + `lookup`.
    fn readdirplus(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// The last descriptor of an open directory went away: free what
    /// `opendir` set up for `fh`.
    fn releasedir(&self, req: &Request, node: NodeId, fh: FileHandle, flags: OpenFlags) -> Result<()> {
        Ok(())
    }

    /// `ENOSYS` is taken as success and never sent again.
    fn fsyncdir(&self, req: &Request, node: NodeId, fh: FileHandle, datasync: bool) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// The default describes an empty file system with 255-byte names.
    fn statfs(&self, req: &Request, node: NodeId) -> Result<Statfs> {
        Ok(Statfs {
            bsize: 4096,
            frsize: 4096,
            namelen: 255,
            ..Statfs::default()
        })
    }

    /// `flags` are `XATTR_CREATE`/`XATTR_REPLACE`. `ENOSYS` is permanent
    /// (every later setxattr fails with EOPNOTSUPP).
    fn setxattr(&self, req: &Request, node: NodeId, name: &OsStr, value: &[u8], flags: XattrFlags) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// The whole value; the dispatcher answers size probes and `ERANGE`.
    fn getxattr(&self, req: &Request, node: NodeId, name: &OsStr) -> Result<Vec<u8>> {
        Err(Errno::ENOSYS)
    }

    /// Every name, each followed by a NUL byte.
    fn listxattr(&self, req: &Request, node: NodeId) -> Result<Vec<u8>> {
        Err(Errno::ENOSYS)
    }

    /// Removes the extended attribute `name` (`ENODATA` when absent).
    /// `ENOSYS` is permanent (EOPNOTSUPP afterwards).
    fn removexattr(&self, req: &Request, node: NodeId, name: &OsStr) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// `access(2)` with `mask` of R_OK/W_OK/X_OK/F_OK. `ENOSYS` is taken as
    /// success and never sent again (use `default_permissions` for checks in
    /// the kernel).
    fn access(&self, req: &Request, node: NodeId, mask: AccessMode) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// Only called when the file system asked for `FUSE_POSIX_LOCKS` in
    /// `init`; otherwise the kernel keeps POSIX locks itself.
    fn getlk(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, lock: &Lock) -> Result<Lock> {
        Err(Errno::ENOSYS)
    }

    /// See [`Filesystem::getlk`]; `sleep` is set for `F_SETLKW`.
    fn setlk(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        lock_owner: u64,
        lock: &Lock,
        sleep: bool,
    ) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// `flock(2)`; only called when the file system asked for
    /// `FUSE_FLOCK_LOCKS` in `init`. `op` is `LOCK_SH`/`LOCK_EX`/`LOCK_UN`,
    /// possibly with `LOCK_NB`.
    fn flock(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, op: FlockOp) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// `fallocate(2)`; `ENOSYS` is permanent (EOPNOTSUPP afterwards).
    fn fallocate(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: FallocateFlags,
    ) -> Result<()> {
        Err(Errno::ENOSYS)
    }

    /// `lseek(2)` for `SEEK_DATA`/`SEEK_HOLE` (the kernel handles the rest).
    /// `ENOSYS` makes the kernel use its generic answer (all data).
    fn lseek(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, whence: Whence) -> Result<u64> {
        Err(Errno::ENOSYS)
    }

    /// `poll(2)`, `select(2)` and `epoll` on an open file: returns the
    /// ready events among `events` ([`PollEvents::IN`], [`PollEvents::OUT`]...). When `handle` is
    /// given the caller will wait: keep it and call
    /// [`Notifier::poll_wakeup`] once the file becomes ready (the kernel then
    /// asks again). `ENOSYS` is permanent: the kernel takes every file as
    /// always readable and writable for the rest of the connection.
    fn poll(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        handle: Option<PollHandle>,
        events: PollEvents,
    ) -> Result<PollEvents> {
        Err(Errno::ENOSYS)
    }

    /// `copy_file_range(2)`; `ENOSYS` makes the kernel copy through
    /// read/write for the rest of the connection.
    fn copy_file_range(&self, req: &Request, range: &CopyRange) -> Result<usize> {
        Err(Errno::ENOSYS)
    }

    /// A kernel file holding the bytes of regular file `node` (open as
    /// `fh`), for a program that maps it where no kernel mount does the
    /// mapping: a program of a `shortfuse serve` daemon, reached over the
    /// shared-memory rings, gets its descriptor from the daemon and maps it
    /// (`MAP_SHARED` and `MAP_PRIVATE`). Every such map of the file then
    /// shares that file's pages, so from the first call on the file
    /// system's own `read`, `write`, truncation and `fallocate` of the file
    /// must go through that same kernel file (a memfd does), or the
    /// programs' stores and the file system's bytes part. The size stays
    /// the file system's to keep: a map cannot change it. Called after the
    /// caller's access to `fh` was checked; the program's own access mode
    /// limits what it may map. `ENODEV` (the default): the file cannot be
    /// mapped so. A file system whose `open` returns a 1-to-1 [`DataMap`](crate::DataMap)
    /// needs none: the daemon lends that backing file.
    fn map_file(&self, node: NodeId, fh: FileHandle) -> Result<BackingFile> {
        Err(Errno::ENODEV)
    }

    /// True when the file system answers LOOKUP, GETATTR, READ, WRITE and
    /// SETATTR through the `*_deferred` methods below, possibly later and from
    /// another thread (see [`crate::reply`]). Asked for every request, so
    /// return a constant. `false` (the default): those go to the
    /// synchronous methods.
    fn answers_later(&self) -> bool {
        false
    }

    /// LOOKUP answered through `reply`, now or later from any thread (only
    /// when [`Filesystem::answers_later`]). By default [`Filesystem::lookup`]
    /// answers at once.
    fn lookup_deferred(&self, req: &Request, parent: NodeId, name: &OsStr, reply: ReplyEntry) {
        match self.lookup(req, parent, name) {
            Ok(e) => reply.entry(&e),
            Err(e) => reply.error(e),
        }
    }

    /// GETATTR answered through `reply` (see
    /// [`Filesystem::lookup_deferred`]). By default [`Filesystem::getattr`].
    fn getattr_deferred(&self, req: &Request, node: NodeId, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.getattr(req, node, fh) {
            Ok(a) => reply.attr(&a),
            Err(e) => reply.error(e),
        }
    }

    /// READ of up to `size` bytes at `offset`, answered through `reply`
    /// (see [`Filesystem::lookup_deferred`]). By default
    /// [`Filesystem::read`] into a buffer of `size` bytes.
    fn read_deferred(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, size: usize, reply: ReplyData) {
        let mut buf = vec![0; size];
        match self.read(req, node, fh, offset, &mut buf) {
            Ok(n) => reply.data(&buf[..n.min(size)]),
            Err(e) => reply.error(e),
        }
    }

    /// WRITE answered through `reply` (see
    /// [`Filesystem::lookup_deferred`]). `data` lives only as long as the
    /// call: copy what is written later. By default [`Filesystem::write`].
    fn write_deferred(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        data: &[u8],
        args: &WriteArgs,
        reply: ReplyWrite,
    ) {
        match self.write(req, node, fh, data, args) {
            Ok(n) => reply.written(n.min(data.len())),
            Err(e) => reply.error(e),
        }
    }

    /// SETATTR answered through `reply` with the attributes after the
    /// change (see [`Filesystem::lookup_deferred`]). By default
    /// [`Filesystem::setattr`]. A file system that must wait for the kernel
    /// before it can change a file (a notification that drops cached pages
    /// waits for the READs in flight on them, which a worker must serve)
    /// answers from another thread, so the worker is free to serve them.
    fn setattr_deferred(&self, req: &Request, node: NodeId, set: &SetAttr, reply: ReplyAttr) {
        match self.setattr(req, node, set) {
            Ok(a) => reply.attr(&a),
            Err(e) => reply.error(e),
        }
    }
}
