//! Notifications: telling the kernel (and every ring client) that something
//! changed behind its cache, the job of libfuse's `fuse_lowlevel_notify_*`.
//!
//! A [`Notifier`] is a cheap handle ([`Clone`], `Send`, `Sync`) that a file
//! system receives in [`crate::InitConfig::notifier`] and may keep and use
//! from any method or from any thread of its own. One notifier serves a
//! whole daemon: the kernel connection (over `/dev/fuse`, whichever
//! transport carries the requests: notifications always travel on the
//! device, as the kernel expects them there even under FUSE-over-io_uring)
//! and, in `shortfuse serve`, every ring client's cache.
//!
//! What each notification does in the kernel:
//! - [`Notifier::inval_inode`]: drops cached attributes, and the cached
//!   pages of a byte range (a negative offset: attributes only). The next
//!   `stat` asks GETATTR, the next read asks READ.
//! - [`Notifier::inval_entry`]: drops the cached name `parent/name`; the next
//!   walk asks LOOKUP (and sees the new file or ENOENT).
//! - [`Notifier::delete`]: as `inval_entry`, and also tells inotify watchers
//!   that `child` was deleted (the kernel checks that the name still points
//!   at `child`).
//! - [`Notifier::store`]: places data in the kernel's page cache (the kernel
//!   must know the node; the file grows if the data ends past its size).
//! - [`Notifier::retrieve`]: asks the kernel for what its page cache holds
//!   of a file; the answer arrives as a `FUSE_NOTIFY_REPLY` request that the
//!   dispatcher hands to the waiting [`Retrieval`].
//! - [`Notifier::poll_wakeup`]: wakes the `poll(2)`/`epoll` callers waiting
//!   on the handle [`crate::Filesystem::poll`] was given.
//!
//! Deadlocks to avoid (the same as libfuse's): the kernel takes the
//! directory's lock to drop a name, so calling `inval_entry` or `delete` from
//! inside a request on that same directory (its `lookup`, `unlink`,
//! `create`...) waits for a lock the kernel holds until the request
//! answers. Send those from another thread, or after replying. `retrieve`
//! needs a worker free to take the kernel's answer: never wait for it on
//! the only worker thread.
//!
//! The kernel answers `ENOENT` when it has nothing cached for the node or
//! the name: the `Result` says so, and callers usually ignore it.

use crate::sync::lock;
use crate::sync::Unpoison;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use std::ffi::OsStr;

use shortfuse_abi as abi;
use zerocopy::IntoBytes;

use crate::types::NodeId;

/// The handle the kernel gives with a POLL request, to wake its waiters
/// later with [`Notifier::poll_wakeup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PollHandle(pub u64);

/// One notification, as sent to every [`NotifySink`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notification<'a> {
    /// `FUSE_NOTIFY_INVAL_INODE`: drop the attributes and cached data.
    InvalInode {
        /// The node.
        node: NodeId,
        /// First byte of cached data to drop; negative: attributes only.
        offset: i64,
        /// Bytes to drop; 0: to the end of the file.
        len: i64,
    },
    /// `FUSE_NOTIFY_INVAL_ENTRY`: drop the name `parent/name`.
    InvalEntry {
        /// The directory.
        parent: NodeId,
        /// The name in it.
        name: &'a OsStr,
    },
    /// `FUSE_NOTIFY_DELETE`: `parent/name`, which pointed at `child`, is gone.
    Delete {
        /// The directory.
        parent: NodeId,
        /// The node the name pointed at.
        child: NodeId,
        /// The name.
        name: &'a OsStr,
    },
    /// `FUSE_NOTIFY_STORE`: put `data` in the page cache.
    Store {
        /// The file.
        node: NodeId,
        /// Where `data` starts in it.
        offset: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// `FUSE_NOTIFY_RETRIEVE`, answered by a `FUSE_NOTIFY_REPLY`.
    Retrieve {
        /// The id the kernel's answer carries.
        unique: u64,
        /// The file.
        node: NodeId,
        /// Where to start.
        offset: u64,
        /// Bytes asked for at most.
        size: u32,
    },
    /// `FUSE_NOTIFY_POLL`: wake the waiters on `handle`.
    PollWakeup {
        /// The handle the POLL request carried.
        handle: PollHandle,
    },
}

/// Somewhere notifications go besides the kernel: the ring server
/// registers one so that its clients' caches hear of every change. Sinks
/// ignore what does not concern them (a ring client has no poll waiters).
pub trait NotifySink: Send + Sync {
    /// Delivers one notification; must not block for long (it runs on the
    /// caller's thread, often a worker's).
    fn notify(&self, n: &Notification<'_>);
}

/// Sends notifications to the kernel and to every registered sink. See the
/// module docs.
#[derive(Clone, Default)]
pub struct Notifier {
    hub: Arc<Hub>,
}

#[derive(Default)]
struct Hub {
    /// The connection's /dev/fuse fd (a clone), once a kernel session has
    /// one.
    kernel: RwLock<Option<Arc<File>>>,
    sinks: RwLock<Vec<Arc<dyn NotifySink>>>,
    retrievals: Mutex<HashMap<u64, SyncSender<Retrieved>>>,
    next_unique: AtomicU64,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("kernel", &self.hub.kernel.read().map(|k| k.is_some()).unwrap_or(false))
            .field("sinks", &self.hub.sinks.read().map(|s| s.len()).unwrap_or(0))
            .finish()
    }
}

impl PartialEq for Notifier {
    /// Two handles are equal when they reach the same connections.
    fn eq(&self, other: &Notifier) -> bool {
        Arc::ptr_eq(&self.hub, &other.hub)
    }
}

impl Eq for Notifier {}

/// The data a [`Notifier::retrieve`] got back from the kernel's page cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retrieved {
    /// Where the data starts in the file.
    pub offset: u64,
    /// What the kernel had cached from `offset` on (possibly less than asked,
    /// or nothing).
    pub data: Vec<u8>,
}

/// A retrieve request sent to the kernel; [`Retrieval::wait`] takes the answer.
pub struct Retrieval {
    rx: Receiver<Retrieved>,
    unique: u64,
    hub: Arc<Hub>,
}

impl Retrieval {
    /// Waits up to `timeout` for the kernel's answer (`TimedOut` after).
    pub fn wait(self, timeout: Duration) -> io::Result<Retrieved> {
        self.rx.recv_timeout(timeout).map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the kernel did not answer FUSE_NOTIFY_RETRIEVE",
            )
        })
    }
}

impl Drop for Retrieval {
    fn drop(&mut self) {
        lock(&self.hub.retrievals).remove(&self.unique);
    }
}

fn not_connected() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "no kernel connection to notify")
}

impl Notifier {
    /// A notifier that reaches nothing until a session attaches to it.
    pub fn new() -> Notifier {
        Notifier::default()
    }

    /// The kernel connection to notify: a session calls this with (a clone
    /// of) its /dev/fuse fd before it serves requests.
    pub fn attach_kernel(&self, dev: File) {
        *self.hub.kernel.write().unpoison() = Some(Arc::new(dev));
    }

    /// Another place notifications go (the ring server's clients).
    pub fn add_sink(&self, sink: Arc<dyn NotifySink>) {
        self.hub.sinks.write().unpoison().push(sink);
    }

    /// Whether a kernel connection is attached.
    pub fn has_kernel(&self) -> bool {
        self.hub.kernel.read().is_ok_and(|k| k.is_some())
    }

    /// Sends `n` to every sink, then to the kernel; returns the kernel's
    /// answer (`NotConnected` without a kernel connection, `ENOENT` when
    /// the kernel had nothing cached).
    pub fn send(&self, n: &Notification<'_>) -> io::Result<()> {
        for s in self.hub.sinks.read().unpoison().iter() {
            s.notify(n);
        }
        self.send_to_kernel(n)
    }

    /// Sends `n` to the kernel alone: for a transport whose own clients
    /// already know of the change (the rings announce a client's changes to
    /// the others themselves).
    pub fn send_to_kernel(&self, n: &Notification<'_>) -> io::Result<()> {
        let dev = self.hub.kernel.read().unpoison().clone().ok_or_else(not_connected)?;
        let mut msg = Vec::with_capacity(64);
        encode(n, &mut msg)?;
        // One write(2) per message: the kernel takes a message per call.
        (&*dev).write(&msg).map(|_| ())
    }

    /// Drops the kernel's cached attributes of `node` and its cached data
    /// from `offset` for `len` bytes (`len` 0: to the end of the file;
    /// `offset` negative: attributes only).
    pub fn inval_inode(&self, node: NodeId, offset: i64, len: i64) -> io::Result<()> {
        self.send(&Notification::InvalInode { node, offset, len })
    }

    /// Drops the kernel's cached name `parent/name` (and the attributes of
    /// `parent`).
    pub fn inval_entry(&self, parent: NodeId, name: &OsStr) -> io::Result<()> {
        self.send(&Notification::InvalEntry { parent, name })
    }

    /// `parent/name`, which pointed at `child`, was deleted: drops the name
    /// and tells inotify watchers.
    pub fn delete(&self, parent: NodeId, child: NodeId, name: &OsStr) -> io::Result<()> {
        self.send(&Notification::Delete { parent, child, name })
    }

    /// Puts `data` at `offset` into the kernel's page cache of `node`.
    pub fn store(&self, node: NodeId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.send(&Notification::Store { node, offset, data })
    }

    /// Asks the kernel for up to `size` bytes of its page cache of `node`
    /// from `offset`; wait for the answer with [`Retrieval::wait`] (never
    /// on the only worker thread: a worker must be free to take it).
    pub fn retrieve(&self, node: NodeId, offset: u64, size: u32) -> io::Result<Retrieval> {
        // Never 0: a request whose unique is 0 is refused by the dispatcher.
        let unique = self.hub.next_unique.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = sync_channel(1);
        lock(&self.hub.retrievals).insert(unique, tx);
        let retrieval = Retrieval {
            rx,
            unique,
            hub: self.hub.clone(),
        };
        // Only the kernel holds pages to hand back.
        self.send_to_kernel(&Notification::Retrieve {
            unique,
            node,
            offset,
            size,
        })?;
        Ok(retrieval)
    }

    /// Wakes the `poll(2)` callers waiting on `handle`.
    pub fn poll_wakeup(&self, handle: PollHandle) -> io::Result<()> {
        self.send(&Notification::PollWakeup { handle })
    }

    /// The kernel's `FUSE_NOTIFY_REPLY` to a retrieve: hands it to the waiter.
    pub(crate) fn retrieved(&self, unique: u64, offset: u64, data: &[u8]) {
        if let Some(tx) = lock(&self.hub.retrievals).remove(&unique) {
            let _ = tx.try_send(Retrieved {
                offset,
                data: data.to_vec(),
            });
        }
    }
}

/// The wire form of `n`: a `fuse_out_header` with `unique` 0 and the code
/// in `error`, the struct, then the name (NUL-terminated) or the data.
pub fn encode(n: &Notification<'_>, out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    out.extend_from_slice(abi::fuse_out_header::default().as_bytes());
    let code = match *n {
        Notification::InvalInode { node, offset, len } => {
            let body = abi::fuse_notify_inval_inode_out {
                ino: node.0,
                off: offset,
                len,
            };
            out.extend_from_slice(body.as_bytes());
            abi::FUSE_NOTIFY_INVAL_INODE
        }
        Notification::InvalEntry { parent, name } => {
            let body = abi::fuse_notify_inval_entry_out {
                parent: parent.0,
                namelen: name_len(name)?,
                flags: 0,
            };
            push_named(out, body.as_bytes(), name);
            abi::FUSE_NOTIFY_INVAL_ENTRY
        }
        Notification::Delete { parent, child, name } => {
            let body = abi::fuse_notify_delete_out {
                parent: parent.0,
                child: child.0,
                namelen: name_len(name)?,
                padding: 0,
            };
            push_named(out, body.as_bytes(), name);
            abi::FUSE_NOTIFY_DELETE
        }
        Notification::Store { node, offset, data } => {
            let size = u32::try_from(data.len())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "store of more than 4 GiB"))?;
            let body = abi::fuse_notify_store_out {
                nodeid: node.0,
                offset,
                size,
                padding: 0,
            };
            out.extend_from_slice(body.as_bytes());
            out.extend_from_slice(data);
            abi::FUSE_NOTIFY_STORE
        }
        Notification::Retrieve {
            unique,
            node,
            offset,
            size,
        } => {
            let body = abi::fuse_notify_retrieve_out {
                notify_unique: unique,
                nodeid: node.0,
                offset,
                size,
                padding: 0,
            };
            out.extend_from_slice(body.as_bytes());
            abi::FUSE_NOTIFY_RETRIEVE
        }
        Notification::PollWakeup { handle } => {
            out.extend_from_slice(abi::fuse_notify_poll_wakeup_out { kh: handle.0 }.as_bytes());
            abi::FUSE_NOTIFY_POLL
        }
    };
    let len = u32::try_from(out.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too long"))?;
    out[..4].copy_from_slice(&len.to_ne_bytes());
    out[4..8].copy_from_slice(&(code as i32).to_ne_bytes());
    Ok(())
}

/// A notification body followed by its NUL-terminated name.
fn push_named(out: &mut Vec<u8>, body: &[u8], name: &OsStr) {
    out.extend_from_slice(body);
    out.extend_from_slice(name.as_bytes());
    out.push(0);
}

fn name_len(name: &OsStr) -> io::Result<u32> {
    match u32::try_from(name.len()) {
        Ok(n) if n > 0 && n <= 255 && !name.as_bytes().contains(&b'/') => Ok(n),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a file name"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_forms() {
        let mut out = Vec::new();
        encode(
            &Notification::InvalEntry {
                parent: NodeId(7),
                name: OsStr::new("ab"),
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 16 + 16 + 3);
        assert_eq!(u32::from_ne_bytes(out[0..4].try_into().unwrap()), 35);
        assert_eq!(i32::from_ne_bytes(out[4..8].try_into().unwrap()), 3);
        assert_eq!(u64::from_ne_bytes(out[8..16].try_into().unwrap()), 0);
        assert_eq!(u64::from_ne_bytes(out[16..24].try_into().unwrap()), 7);
        assert_eq!(u32::from_ne_bytes(out[24..28].try_into().unwrap()), 2);
        assert_eq!(&out[32..], b"ab\0");
        encode(
            &Notification::Store {
                node: NodeId(9),
                offset: 4096,
                data: b"xyz",
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 16 + 24 + 3);
        assert_eq!(i32::from_ne_bytes(out[4..8].try_into().unwrap()), 4);
        assert_eq!(&out[40..], b"xyz");
        let bad = Notification::InvalEntry {
            parent: NodeId(1),
            name: OsStr::new("a/b"),
        };
        assert!(encode(&bad, &mut out).is_err());
    }

    #[test]
    fn without_a_kernel_sinks_still_hear() {
        struct Count(Mutex<Vec<String>>);
        impl NotifySink for Count {
            fn notify(&self, n: &Notification<'_>) {
                lock(&self.0).push(format!("{n:?}"));
            }
        }
        let n = Notifier::new();
        let sink = Arc::new(Count(Mutex::new(Vec::new())));
        n.add_sink(sink.clone());
        let e = n.inval_inode(NodeId(3), 0, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotConnected);
        assert_eq!(lock(&sink.0).len(), 1);
        assert!(lock(&sink.0)[0].contains("InvalInode"));
        assert!(n.retrieve(NodeId(3), 0, 10).is_err());
        assert!(lock(&n.hub.retrievals).is_empty());
    }
}
