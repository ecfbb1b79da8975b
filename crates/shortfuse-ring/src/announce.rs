//! A [`Filesystem`] wrapper for the kernel mount of a daemon that also
//! serves rings: every change the kernel's requests make is announced to
//! the ring clients (the same INVAL_ENTRY / INVAL_INODE notifications that
//! ring clients send each other, chosen by the same [`crate::changes`]
//! from the mount's dispatcher), so programs under the shim see at once
//! what programs without it did; the kernel's locks go to the daemon's lock
//! table (see `crate::locks`), shared with the ring clients. Everything
//! else is passed through (a [`shortfuse::layer::Layer`]).

use std::sync::{Arc, OnceLock};

use shortfuse::{
    Dispatcher, Errno, FileHandle, Filesystem, FlockOp, InitConfig, Lock, NodeId, ReleaseArgs, Request, Result,
};

use shortfuse_abi as abi;

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

    /// Names the server, and has `kernel` (the dispatcher of the mount
    /// this layer serves) hand it each request that changed something: what
    /// each request changes is the server's [`crate::changes`], the same
    /// for the kernel's requests as for the rings'.
    pub fn attach(&self, to: Announcer, kernel: &Dispatcher) {
        let announce = to.clone();
        kernel.observe(Box::new(move |r, reply| {
            crate::changes(r, |n| announce.notify_all(n));
            announce.mirror(r, reply);
        }));
        let _ = self.to.set(to);
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

    fn flush(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64) -> Result<()> {
        if let Some(to) = self.to.get() {
            to.locks().release_on(node.0, lock_owner);
            // The kernel must keep sending FLUSH, which drops the closer's
            // locks here, even where the file system has no use for it.
            return match self.inner.flush(req, node, fh, lock_owner) {
                Err(e) if e == Errno::ENOSYS => Ok(()),
                r => r,
            };
        }
        self.inner.flush(req, node, fh, lock_owner)
    }

    fn release(&self, req: &Request, node: NodeId, fh: FileHandle, args: &ReleaseArgs) -> Result<()> {
        if let (Some(to), true, Some(owner)) = (self.to.get(), args.flock_release, args.lock_owner) {
            to.locks().release_owner(owner);
        }
        self.inner.release(req, node, fh, args)
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

    fn flock(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, op: FlockOp) -> Result<()> {
        match self.to.get() {
            Some(to) if !op.wait => to.locks().flock(node.0, lock_owner, op.raw()),
            Some(to) => to.locks().flock_wait(node.0, lock_owner, op.raw()),
            None => self.inner.flock(req, node, fh, lock_owner, op),
        }
    }
}
