//! Where requests go: a [`Backend`] carries one encoded FUSE request to a
//! dispatcher and brings its reply back.
//!
//! The VFS speaks the FUSE wire protocol to every backend, as the kernel
//! does: the in-process backend hands the bytes to the same
//! [`Dispatcher`] that serves /dev/fuse and io_uring, so one decoder, one set
//! of statistics and one INIT negotiation serve every transport, and a
//! shared-memory ring backend only has to move bytes. Encoding costs a
//! header and a fixed struct per call (tens of nanoseconds against the
//! microseconds a kernel round trip costs); the dispatcher's decoding is
//! zero-copy.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use shortfuse::{Dispatcher, Errno, Filesystem, MountOptions, NodeId, Stats, Transport};

/// Carries FUSE requests to a file system.
pub trait Backend: Send + Sync {
    /// Sends one request (`fuse_in_header` + arguments). For requests that
    /// take a reply, `reply` is filled with the whole reply
    /// (`fuse_out_header` + payload); for FORGET and BATCH_FORGET it is left
    /// empty. `Err` means the transport failed, not the operation: the
    /// operation's own error travels in `fuse_out_header.error`.
    fn call(&self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), Errno>;

    /// Sends a request whose reply nobody waits for (RELEASE and
    /// RELEASEDIR, which the kernel too sends in the background and whose
    /// errors it ignores, and FORGET, which has no reply). `scratch` may
    /// receive a reply. By default, a [`Backend::call`].
    fn send(&self, request: &[u8], scratch: &mut Vec<u8>) -> Result<(), Errno> {
        self.call(request, scratch)
    }

    /// Hands `apply` every invalidation the file system announced since the
    /// last time (the kernel's FUSE_NOTIFY_INVAL_*): a shared daemon tells
    /// each client what other clients changed. The VFS drains them before
    /// it looks at its cache. In process there is nobody else: nothing.
    fn invalidations(&self, apply: &mut dyn FnMut(Invalidation<'_>)) {
        let _ = apply;
    }

    /// Whether [`Backend::invalidations`] may have something to hand over,
    /// found without a read-modify-write of anything shared: `false` lets
    /// the VFS skip the drain and the cache lock it takes. `true` by
    /// default (a backend that cannot tell is always drained).
    fn invalidations_pending(&self) -> bool {
        true
    }

    /// Whether the transport is set up at the first request rather than
    /// when the mount is made (a daemon connected to lazily, see
    /// [`crate::Ring::lazy`]): the VFS then sends INIT just before that
    /// request, and nothing while the mount is made.
    fn deferred(&self) -> bool {
        false
    }

    /// Sets a deferred transport up now (nothing when it is), handing it
    /// the requests about to be sent first, which it may carry with its
    /// own set-up (see [`crate::Ring::lazy`]).
    fn start(&self, first: &[Vec<u8>]) -> Result<(), Errno> {
        let _ = first;
        Ok(())
    }

    /// Whether this process may set a deferred transport up now: a vfork
    /// child, which shares the parent's memory but not its descriptors,
    /// must not (a connection it made would be left to the parent without
    /// its socket).
    fn may_start(&self) -> bool {
        true
    }

    /// The node `name` in `parent` names and its attributes, as a daemon
    /// shared by other programs keeps them for all (see
    /// `shortfuse_ring::RingClient::shared_entry`), while valid. The node
    /// is not looked up by this process: its attributes may be read, and
    /// its id never sent. For a call made as `uid`. In process there is no
    /// such table: `None`.
    fn shared_entry(&self, parent: NodeId, name: &[u8], uid: u32) -> Option<(NodeId, shortfuse_abi::fuse_attr)> {
        let _ = (parent, name, uid);
        None
    }

    /// The listing of directory `dir` a daemon shared by other programs
    /// keeps for all (see `shortfuse_ring::RingClient::shared_listing`),
    /// copied into `out` while valid: records of `shortfuse_ring::listings`,
    /// with no node. For a call made as `uid`. In process there is none.
    fn shared_listing(&self, dir: NodeId, uid: u32, out: &mut Vec<u8>) -> bool {
        let _ = (dir, uid, out);
        false
    }

    /// Whether [`Backend::shared_entry`] may find anything.
    fn has_shared_entries(&self) -> bool {
        false
    }

    /// Whether other processes reach the same file system (a shared daemon):
    /// open file descriptions and locks are then kept so that every process
    /// sees them (see [`Anchor`]).
    fn shared(&self) -> bool {
        false
    }

    /// Hands the daemon the ownership of open handles: from now on each
    /// belongs to the open file description that its `description` (a
    /// kernel file shared by every descriptor of it, in every process)
    /// stands for, and the daemon releases it when the kernel closes the
    /// last of them. Until then a handle is this process's: the daemon
    /// releases it when the process ends. Returns once the daemon holds
    /// them all. ENOSYS where there is no daemon.
    fn anchor(&self, anchors: &[Anchor<'_>]) -> Result<(), Errno> {
        let _ = anchors;
        Err(Errno::ENOSYS)
    }

    /// Tells the daemon that this process holds the open file descriptions
    /// of `descriptions` (inherited at exec from an image that anchored
    /// them), so that it may name their nodes without a lookup of its own.
    /// Nothing to tell where there is no daemon.
    fn claim(&self, descriptions: &[Anchor<'_>]) -> Result<(), Errno> {
        let _ = descriptions;
        Ok(())
    }

    /// A descriptor of the backing file of open handle `fh` on `node`, for
    /// a shared memory map (`description`: the kernel file of the open
    /// file description holding the handle, if it has one). In process the
    /// open's data map already gives it: ENODEV.
    fn backing_file(&self, node: NodeId, fh: u64, description: Option<BorrowedFd<'_>>) -> Result<OwnedFd, Errno> {
        let _ = (node, fh, description);
        Err(Errno::ENODEV)
    }

    /// An O_PATH descriptor of a kernel node standing for FIFO or device
    /// node `node`, made by the daemon for every program it serves (see
    /// `shortfuse_ring`'s `NodeMsg`). ENOSYS where there is no daemon.
    fn kernel_node(&self, node: NodeId) -> Result<OwnedFd, Errno> {
        let _ = node;
        Err(Errno::ENOSYS)
    }

    /// An O_PATH descriptor of a kernel object on which the daemon replays
    /// every change to node `node` (named `name` in `parent`), for inotify
    /// watches (see `shortfuse_ring`'s `WatchMsg`). ENOSYS where there is
    /// no daemon.
    fn watch_node(&self, node: NodeId, parent: NodeId, name: &[u8]) -> Result<OwnedFd, Errno> {
        let _ = (node, parent, name);
        Err(Errno::ENOSYS)
    }
}

/// An open handle given to an open file description (see [`Backend::anchor`]).
#[derive(Clone, Copy, Debug)]
pub struct Anchor<'a> {
    pub node: NodeId,
    pub fh: u64,
    pub dir: bool,
    pub description: BorrowedFd<'a>,
}

/// What a client must stop believing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalidation<'a> {
    /// The node's attributes changed.
    Inode(NodeId),
    /// The name in the directory changed (and so did the directory).
    Entry { parent: NodeId, name: &'a [u8] },
    /// Announcements were lost: forget every name and attribute.
    All,
}

/// Calls a [`Filesystem`] in the same process through a [`Dispatcher`].
pub struct InProcess {
    dispatcher: Dispatcher,
}

/// Pages per request the in-process transport allows (1 MiB, the
/// dispatcher's cap): there is no kernel sysctl to respect.
const IN_PROCESS_MAX_PAGES: u32 = 256;

impl InProcess {
    pub fn new(fs: Arc<dyn Filesystem>, opts: MountOptions, stats: Arc<Stats>) -> InProcess {
        InProcess {
            dispatcher: Dispatcher::with_max_pages_limit(fs, opts, stats, IN_PROCESS_MAX_PAGES),
        }
    }

    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }
}

impl Backend for InProcess {
    fn call(&self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), Errno> {
        self.dispatcher.handle(request, reply, Transport::InProcess);
        Ok(())
    }
}
