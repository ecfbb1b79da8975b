//! Wrapping a file system: a [`Layer`] is a [`Filesystem`] in front of
//! another that changes a few calls and passes every other one on.
//!
//! A wrapper implements [`Layer`]: it names its inner file system
//! ([`Layer::inner`]) and overrides only the calls it changes; every
//! method it leaves alone goes to the inner file system, and every
//! `Layer` is a `Filesystem` (a blanket impl). Written by hand, a wrapper
//! that forgets one of the trait's methods answers `ENOSYS` to it without
//! a word; here a forgotten method is forwarded, and a test checks that
//! this list holds every method of [`Filesystem`].
//!
//! A layer answers every request at once: the methods of answering later
//! ([`Filesystem::answers_later`] and the `*_deferred` ones) are not
//! forwarded, so a layer answers later never, and a file system below it
//! that does is called through its synchronous methods. Forwarding them
//! would let LOOKUP, GETATTR, READ, WRITE and SETATTR slip past a layer that
//! changes those calls (the cache keeps what it reads), and a layer that
//! changes none of them gains nothing from seeing the others.
//!
//! The daemon's cache ([`crate::cache::CachedFs`]), the ring server's
//! announcer of the kernel mount's changes and the VFS's map tap are
//! layers.

use std::ffi::OsStr;
use std::sync::Arc;

use crate::errno::Result;
use crate::filesystem::{Filesystem, InitConfig};
use crate::notify::PollHandle;
use crate::stats::Figures;
use crate::types::*;

/// Declares [`Layer`] with one forwarding default per method, the
/// [`Filesystem`] impl of every layer, and (for the test) their names.
macro_rules! layer {
    ($( fn $name:ident(&self $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)?; )*) => {
        /// A [`Filesystem`] in front of [`Layer::inner`]: every method
        /// defaults to the inner file system's (see the module docs).
        pub trait Layer: Send + Sync + 'static {
            /// The type of the file system below.
            type Inner: Filesystem + ?Sized;

            /// The file system the calls a layer does not change go to.
            fn inner(&self) -> &Self::Inner;

            $(
                #[doc = concat!("[`Filesystem::", stringify!($name), "`], by default the inner file system's.")]
                fn $name(&self $(, $arg: $ty)*) $(-> $ret)? {
                    Filesystem::$name(self.inner() $(, $arg)*)
                }
            )*
        }

        impl<L: Layer> Filesystem for L {
            $(
                fn $name(&self $(, $arg: $ty)*) $(-> $ret)? {
                    Layer::$name(self $(, $arg)*)
                }
            )*
        }

        #[cfg(test)]
        const METHODS: &[&str] = &[$(stringify!($name)),*];

        /// The methods of [`Filesystem`] a layer answers itself (see the
        /// module docs): its default, not the inner file system's.
        #[cfg(test)]
        const ANSWERED_HERE: &[&str] =
            &["answers_later", "lookup_deferred", "getattr_deferred", "read_deferred", "write_deferred", "setattr_deferred"];
    };
}

layer! {
    fn init(&self, config: &mut InitConfig) -> Result<()>;
    fn destroy(&self);
    fn figures(&self) -> Option<Arc<dyn Figures>>;
    fn namespace_map(&self) -> Option<crate::NamespaceMap>;
    fn lookup(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry>;
    fn forget(&self, node: NodeId, nlookup: u64);
    fn batch_forget(&self, forgets: &[Forget]);
    fn getattr(&self, req: &Request, node: NodeId, fh: Option<FileHandle>) -> Result<Attr>;
    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr>;
    fn readlink(&self, req: &Request, node: NodeId) -> Result<Vec<u8>>;
    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry>;
    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry>;
    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry>;
    fn unlink(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()>;
    fn rmdir(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()>;
    fn rename(&self, req: &Request, parent: NodeId, name: &OsStr, new_parent: NodeId, new_name: &OsStr, flags: RenameFlags) -> Result<()>;
    fn link(&self, req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry>;
    fn open(&self, req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened>;
    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, flags: OpenFlags) -> Result<Created>;
    fn read(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize>;
    fn write(&self, req: &Request, node: NodeId, fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize>;
    fn flush(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64) -> Result<()>;
    fn release(&self, req: &Request, node: NodeId, fh: FileHandle, args: &ReleaseArgs) -> Result<()>;
    fn fsync(&self, req: &Request, node: NodeId, fh: FileHandle, datasync: bool) -> Result<()>;
    fn opendir(&self, req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened>;
    fn readdir(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, sink: &mut dyn DirSink) -> Result<()>;
    fn readdirplus(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, sink: &mut dyn DirPlusSink) -> Result<()>;
    fn releasedir(&self, req: &Request, node: NodeId, fh: FileHandle, flags: OpenFlags) -> Result<()>;
    fn fsyncdir(&self, req: &Request, node: NodeId, fh: FileHandle, datasync: bool) -> Result<()>;
    fn statfs(&self, req: &Request, node: NodeId) -> Result<Statfs>;
    fn setxattr(&self, req: &Request, node: NodeId, name: &OsStr, value: &[u8], flags: XattrFlags) -> Result<()>;
    fn getxattr(&self, req: &Request, node: NodeId, name: &OsStr) -> Result<Vec<u8>>;
    fn listxattr(&self, req: &Request, node: NodeId) -> Result<Vec<u8>>;
    fn removexattr(&self, req: &Request, node: NodeId, name: &OsStr) -> Result<()>;
    fn access(&self, req: &Request, node: NodeId, mask: AccessMode) -> Result<()>;
    fn getlk(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, lock: &Lock) -> Result<Lock>;
    fn setlk(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, lock: &Lock, sleep: bool) -> Result<()>;
    fn flock(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, op: FlockOp) -> Result<()>;
    fn fallocate(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, length: u64, mode: FallocateFlags) -> Result<()>;
    fn lseek(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, whence: Whence) -> Result<u64>;
    fn poll(&self, req: &Request, node: NodeId, fh: FileHandle, handle: Option<PollHandle>, events: PollEvents) -> Result<PollEvents>;
    fn copy_file_range(&self, req: &Request, range: &CopyRange) -> Result<usize>;
    fn map_file(&self, node: NodeId, fh: FileHandle) -> Result<crate::BackingFile>;
}

#[cfg(test)]
mod tests;
