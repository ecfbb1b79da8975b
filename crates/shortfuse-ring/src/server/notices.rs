//! Coherence: what each request changes, and the notices that tell the
//! other clients and the kernel mount about it.

use shortfuse::sync::lock;
use std::sync::atomic::Ordering;

use shortfuse::{NodeId, Notification, NotifySink};
use shortfuse_abi::{self as abi, Operation};

use crate::client::{encode_record, Notice};

use super::{Conn, NotifyTail, Shared};

impl Conn {
    /// Appends one notification to this client's ring; when the ring is
    /// full (or the message too long) counts an overflow instead, which
    /// makes the client forget its whole cache.
    pub(super) fn push_notice(&self, origin: u32, notice: Notice<'_>) {
        let g = &self.geo;
        let mut n = lock(&self.notify);
        let NotifyTail { tail, rec } = &mut *n;
        // The head is the client's: if it is garbage, so is its cache.
        let head = self.region.u32_at(g.notify_head_off()).load(Ordering::Acquire);
        if tail.wrapping_sub(head) >= g.records || !encode_record(rec, origin, notice) {
            self.region
                .u32_at(g.notify_overflow_off())
                .fetch_add(1, Ordering::AcqRel);
            return;
        }
        self.region.write(g.record_off(*tail), rec);
        *tail = tail.wrapping_add(1);
        self.region.u32_at(g.notify_tail_off()).store(*tail, Ordering::Release);
    }
}

impl Shared {
    /// Tells every client about a change made through connection `from` by
    /// process `pid`. The connection itself is told too, for the processes
    /// forked from its owner that share it: each skips its own changes.
    pub(super) fn announce(&self, from: u64, pid: u32, notice: Notice<'_>) {
        self.entries.invalidate(notice, std::time::Instant::now());
        for c in lock(&self.clients).iter() {
            c.push_notice(if c.id == from { pid } else { 0 }, notice);
        }
    }

    /// Tells the kernel mount of the same daemon, if any, that a client
    /// changed something, so that it drops what it cached. Errors are
    /// ignored: ENOENT means the kernel had nothing cached.
    pub(super) fn tell_kernel(&self, notice: Notice<'_>) {
        if !self.notifier.has_kernel() {
            return;
        }
        if let Some(n) = notification(notice) {
            let _ = self.notifier.send_to_kernel(&n);
        }
    }
}

/// A ring notice as a FUSE notification (`Notice::All` has none).
pub(super) fn notification(notice: Notice<'_>) -> Option<Notification<'_>> {
    use std::os::unix::ffi::OsStrExt;
    match notice {
        Notice::Inode(node) => Some(Notification::InvalInode {
            node: NodeId(node),
            offset: 0,
            len: 0,
        }),
        Notice::Entry { parent, name } => Some(Notification::InvalEntry {
            parent: NodeId(parent),
            name: std::ffi::OsStr::from_bytes(name),
        }),
        Notice::All => None,
    }
}

/// The clients of a server as a [`NotifySink`]: what the file system
/// notifies becomes records in every client's notification ring. Weak: the
/// notifier outlives neither the server nor its clients.
pub(super) struct ClientsSink(pub(super) std::sync::Weak<Shared>);

impl NotifySink for ClientsSink {
    fn notify(&self, n: &Notification<'_>) {
        use std::os::unix::ffi::OsStrExt;
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let notice = match *n {
            Notification::InvalInode { node, .. } | Notification::Store { node, .. } => Notice::Inode(node.0),
            Notification::InvalEntry { parent, name } | Notification::Delete { parent, name, .. } => Notice::Entry {
                parent: parent.0,
                name: name.as_bytes(),
            },
            // Only the kernel has pages to hand back or poll waiters.
            Notification::Retrieve { .. } | Notification::PollWakeup { .. } => return,
        };
        shared.entries.invalidate(notice, std::time::Instant::now());
        for c in lock(&shared.clients).iter() {
            c.push_notice(0, notice);
        }
    }
}

/// The invalidations a successful request calls for in other clients:
/// what each request changes, said once for the rings' requests (the
/// server's) and for a kernel mount's beside them ([`crate::Announcing`]).
pub fn changes(r: &abi::Request<'_>, mut f: impl FnMut(Notice<'_>)) {
    use std::os::unix::ffi::OsStrExt;
    let node = r.header.nodeid;
    match &r.op {
        Operation::Setattr { .. }
        | Operation::Write { .. }
        | Operation::Fallocate { .. }
        | Operation::Setxattr { .. }
        | Operation::Removexattr { .. } => f(Notice::Inode(node)),
        Operation::CopyFileRange { arg } => f(Notice::Inode(arg.nodeid_out)),
        // With `FUSE_ATOMIC_O_TRUNC` the open itself empties the file.
        Operation::Open { arg } if arg.flags as i32 & libc::O_TRUNC != 0 => f(Notice::Inode(node)),
        Operation::Create { name, .. }
        | Operation::Mknod { name, .. }
        | Operation::Mkdir { name, .. }
        | Operation::Symlink { name, .. }
        | Operation::Unlink { name }
        | Operation::Rmdir { name } => f(Notice::Entry {
            parent: node,
            name: name.as_bytes(),
        }),
        Operation::Link { arg, name } => {
            f(Notice::Inode(arg.oldnodeid));
            f(Notice::Entry {
                parent: node,
                name: name.as_bytes(),
            });
        }
        Operation::Rename {
            arg: abi::fuse_rename_in { newdir },
            name,
            new_name,
        }
        | Operation::Rename2 {
            arg: abi::fuse_rename2_in { newdir, .. },
            name,
            new_name,
        } => {
            f(Notice::Entry {
                parent: node,
                name: name.as_bytes(),
            });
            f(Notice::Entry {
                parent: *newdir,
                name: new_name.as_bytes(),
            });
        }
        _ => {}
    }
}
