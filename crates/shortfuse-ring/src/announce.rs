//! A [`Filesystem`] wrapper for the kernel mount of a daemon that also
//! serves rings: every change the kernel's requests make is announced to
//! the ring clients (the same INVAL_ENTRY / INVAL_INODE notifications that
//! ring clients send each other), so programs under the shim see at once
//! what programs without it did; the kernel's locks go to the daemon's lock
//! table (see `crate::locks`), shared with the ring clients. Everything
//! else is passed through (a [`shortfuse::layer::Layer`]).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, OnceLock};

use shortfuse::{
    Attr, CopyRange, Created, Entry, FileHandle, Filesystem, InitConfig, Lock, NewNode, NodeId, Opened, ReleaseArgs,
    RenameFlags, Request, Result, SetAttr, WriteArgs,
};

use shortfuse_abi as abi;

use crate::client::Notice;
use crate::server::Announcer;

/// `inner`, announcing its changes to the clients of a ring server.
pub struct Announcing {
    inner: Arc<dyn Filesystem>,
    to: OnceLock<Announcer>,
}

impl Announcing {
    /// Announces nothing until [`Announcing::attach`] names the server (the
    /// kernel session is made first, the server shares its statistics).
    pub fn new(inner: Arc<dyn Filesystem>) -> Announcing {
        Announcing {
            inner,
            to: OnceLock::new(),
        }
    }

    pub fn attach(&self, to: Announcer) {
        let _ = self.to.set(to);
    }

    fn inode<T>(&self, node: NodeId, r: Result<T>) -> Result<T> {
        if let (Ok(_), Some(to)) = (&r, self.to.get()) {
            to.notify_all(Notice::Inode(node.0));
        }
        r
    }

    fn entry<T>(&self, parent: NodeId, name: &OsStr, r: Result<T>) -> Result<T> {
        if let (Ok(_), Some(to)) = (&r, self.to.get()) {
            to.notify_all(Notice::Entry {
                parent: parent.0,
                name: name.as_bytes(),
            });
        }
        r
    }
}

impl shortfuse::layer::Layer for Announcing {
    type Inner = dyn Filesystem;

    fn inner(&self) -> &dyn Filesystem {
        &*self.inner
    }
    fn init(&self, config: &mut InitConfig) -> Result<()> {
        self.inner.init(config)?;
        // The daemon's lock table serves the kernel's locks too, so that
        // programs on the mount and on the rings agree (see `crate::locks`).
        config.want |= (abi::FUSE_POSIX_LOCKS | abi::FUSE_FLOCK_LOCKS) & config.kernel_flags;
        Ok(())
    }

    /// Nothing: the kernel mount is one client of the daemon, whose end
    /// (or DESTROY) leaves the rings' clients going; the daemon destroys
    /// the file system once both have stopped.
    fn destroy(&self) {}

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        self.inode(node, self.inner.setattr(req, node, set))
    }

    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        self.entry(parent, name, self.inner.symlink(req, parent, name, target))
    }

    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        self.entry(parent, name, self.inner.mknod(req, parent, name, new))
    }

    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        self.entry(parent, name, self.inner.mkdir(req, parent, name, new))
    }

    fn unlink(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.entry(parent, name, self.inner.unlink(req, parent, name))
    }

    fn rmdir(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.entry(parent, name, self.inner.rmdir(req, parent, name))
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
        let r = self.inner.rename(req, parent, name, new_parent, new_name, flags);
        let r = self.entry(parent, name, r);
        self.entry(new_parent, new_name, r)
    }

    fn link(&self, req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry> {
        let r = self.inner.link(req, node, new_parent, new_name);
        let r = self.inode(node, r);
        self.entry(new_parent, new_name, r)
    }

    fn open(&self, req: &Request, node: NodeId, flags: i32) -> Result<Opened> {
        let r = self.inner.open(req, node, flags);
        if flags & libc::O_TRUNC != 0 {
            return self.inode(node, r);
        }
        r
    }

    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, flags: i32) -> Result<Created> {
        self.entry(parent, name, self.inner.create(req, parent, name, new, flags))
    }

    fn write(&self, req: &Request, node: NodeId, fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        self.inode(node, self.inner.write(req, node, fh, data, args))
    }

    fn flush(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64) -> Result<()> {
        if let Some(to) = self.to.get() {
            to.locks().release_on(node.0, lock_owner);
        }
        self.inner.flush(req, node, fh, lock_owner)
    }

    fn release(&self, req: &Request, node: NodeId, fh: FileHandle, args: &ReleaseArgs) -> Result<()> {
        if let (Some(to), true, Some(owner)) = (self.to.get(), args.flock_release, args.lock_owner) {
            to.locks().release_owner(owner);
        }
        self.inner.release(req, node, fh, args)
    }

    fn setxattr(&self, req: &Request, node: NodeId, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.inode(node, self.inner.setxattr(req, node, name, value, flags))
    }

    fn removexattr(&self, req: &Request, node: NodeId, name: &OsStr) -> Result<()> {
        self.inode(node, self.inner.removexattr(req, node, name))
    }

    fn getlk(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, lock: &Lock) -> Result<Lock> {
        match self.to.get() {
            Some(to) => Ok(to.locks().test(node.0, lock_owner, lock)),
            None => self.inner.getlk(req, node, fh, lock_owner, lock),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        lock_owner: u64,
        lock: &Lock,
        sleep: bool,
    ) -> Result<()> {
        match self.to.get() {
            Some(to) if sleep => to.locks().set_wait(node.0, lock_owner, lock),
            Some(to) => to.locks().set(node.0, lock_owner, lock),
            None => self.inner.setlk(req, node, fh, lock_owner, lock, sleep),
        }
    }

    fn flock(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, op: i32) -> Result<()> {
        match self.to.get() {
            Some(to) if op & libc::LOCK_NB != 0 => to.locks().flock(node.0, lock_owner, op),
            Some(to) => to.locks().flock_wait(node.0, lock_owner, op),
            None => self.inner.flock(req, node, fh, lock_owner, op),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<()> {
        self.inode(node, self.inner.fallocate(req, node, fh, offset, length, mode))
    }

    fn copy_file_range(&self, req: &Request, range: &CopyRange) -> Result<usize> {
        self.inode(range.node_out, self.inner.copy_file_range(req, range))
    }
}
