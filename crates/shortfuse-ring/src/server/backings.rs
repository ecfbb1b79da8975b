//! The backing files of the clients' open handles, for their shared memory
//! maps.
//!
//! The rings carry FUSE messages, and a FUSE open reply has no room for
//! the file system's data map, so a client's descriptor of a passthrough
//! file is not a kernel descriptor of the backing file (as in process) and
//! the kernel has nothing to map. A MAP_SHARED map instead asks the daemon
//! over the socket ([`crate::proto::BackingMsg`]) and gets the backing
//! file's descriptor, which it maps: every program of the daemon (and the
//! daemon's own reads and writes) then share the backing file's pages in
//! the kernel's page cache, so the maps are coherent with each other and
//! with read and write, as on the host.
//!
//! A file system without such a map may still keep a file's bytes in a
//! kernel file for maps ([`Filesystem::map_file`]: mem moves a mapped
//! file into a memfd); that file is lent the same way.
//!
//! The table keeps weak references: the file system's handle owns the
//! descriptor, and a released handle leaves a dead entry that the next
//! insert prunes (so the table stays the size of the open handles).

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

use shortfuse::{DataMap, Errno, FileHandle, Filesystem, MapTap, NodeId};
use zerocopy::{FromBytes, IntoBytes};

use crate::proto::{BackingMsg, BackingReply, BACKING_MAGIC};
use crate::sys;

#[derive(Default)]
pub(super) struct Backings {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    files: HashMap<(u64, u64), Weak<OwnedFd>>,
    /// Entries after the last prune: the next is due at twice as many.
    pruned_at: usize,
}

impl Backings {
    /// What the dispatchers call with each open's data map: 1-to-1 maps
    /// (passthrough) are kept; other shapes have no single file to map.
    pub fn tap(self: &Arc<Self>) -> MapTap {
        let me = Arc::downgrade(self);
        Arc::new(move |node: NodeId, fh: FileHandle, map: &DataMap| {
            let (Some(me), Some(file)) = (me.upgrade(), map.as_whole()) else {
                return;
            };
            let mut t = me.table.lock().unpoison();
            t.files.insert((node.0, fh.0), Arc::downgrade(file));
            if t.files.len() > 2 * t.pruned_at.max(32) {
                t.files.retain(|_, w| w.strong_count() > 0);
                t.pruned_at = t.files.len();
            }
        })
    }

    fn get(&self, node: u64, fh: u64) -> Option<Arc<OwnedFd>> {
        let t = self.table.lock().unpoison();
        t.files.get(&(node, fh)).and_then(Weak::upgrade)
    }

    /// Parses a client message as a [`BackingMsg`]; `None` when it is not
    /// one.
    pub fn parse(msg: &[u8]) -> Option<BackingMsg> {
        BackingMsg::read_from_prefix(msg)
            .ok()
            .map(|(m, _)| m)
            .filter(|m| m.magic == BACKING_MAGIC)
    }

    /// Answers `m` on `sock`: the backing file when `owns` says the handle
    /// is the asker's and the file has one: the open's 1-to-1 map, or else
    /// the kernel file `fs` keeps the bytes in for maps
    /// ([`Filesystem::map_file`], mem's memfd).
    pub fn answer(&self, sock: BorrowedFd<'_>, m: &BackingMsg, owns: bool, fs: &dyn Filesystem) {
        let file = if owns {
            match self.get(m.node, m.fh) {
                Some(f) => Ok(f),
                None => fs.map_file(NodeId(m.node), FileHandle(m.fh)),
            }
        } else {
            Err(Errno::EPERM)
        };
        let errno = match &file {
            Ok(_) => 0,
            Err(e) => e.raw(),
        };
        let reply = BackingReply {
            magic: BACKING_MAGIC,
            cookie: m.cookie,
            errno: errno as u32,
        };
        if let Err(e) = sys::send(sock, reply.as_bytes(), file.as_ref().ok().map(|f| f.as_fd())) {
            tracing::debug!("shortfuse ring: answering a backing file request: {e}");
        }
    }
}
