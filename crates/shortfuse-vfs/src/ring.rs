//! The ring backend: requests travel to a shared `shortfuse serve` daemon
//! over shared-memory rings (`shortfuse-ring`), instead of to a file
//! system built in this process. Every process then sees one file system
//! (one cache in the daemon, changes visible at once); the daemon's
//! notifications keep this client's dentry and attribute cache coherent.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use shortfuse::{Errno, NodeId};
use shortfuse_ring::{Anchoring, Notice, RingClient};

use crate::backend::{Anchor, Backend, Invalidation};

/// A connection to the daemon serving one mount point.
pub struct Ring {
    client: RingClient,
}

impl Ring {
    /// Connects to the daemon that serves `mountpoint` (normalised here).
    pub fn connect(mountpoint: &[u8]) -> Result<Ring, String> {
        Ring::connect_with(mountpoint, &[])
    }

    /// [`Ring::connect`], the daemon answering `early` requests (the
    /// [`crate::Vfs::opening_requests`] of the mount about to be made) with
    /// its welcome: a process's whole set-up of the mount is then one round
    /// trip (see [`RingClient::connect_with`]).
    pub fn connect_with(mountpoint: &[u8], early: &[Vec<u8>]) -> Result<Ring, String> {
        let mp = crate::normalize(mountpoint);
        let paths = shortfuse_ring::socket_paths(Path::new(OsStr::from_bytes(&mp)));
        let mut first = None;
        for path in &paths {
            match RingClient::connect_with(path, early) {
                Ok(client) => return Ok(Ring { client }),
                // Nobody there: root's daemon may be.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    first.get_or_insert(e);
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        let e = first.map_or_else(String::new, |e| e.to_string());
        Err(format!(
            "{e} (is `shortfuse serve FS {}` running?)",
            String::from_utf8_lossy(&mp)
        ))
    }

    pub fn client(&self) -> &RingClient {
        &self.client
    }

    /// The daemon's namespace map, when it granted it to this client, and
    /// the only fsuid it serves (see [`crate::Namespace`]).
    pub fn namespace_map(&self) -> Option<(shortfuse::NamespaceMap, u32)> {
        self.client.namespace_map().cloned()
    }
}

impl Backend for Ring {
    fn call(&self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), Errno> {
        self.client.call(request, reply)
    }

    fn send(&self, request: &[u8], _scratch: &mut Vec<u8>) -> Result<(), Errno> {
        self.client.send(request)
    }

    fn shared(&self) -> bool {
        true
    }

    fn anchor(&self, anchors: &[Anchor<'_>]) -> Result<(), Errno> {
        by_chunks(anchors, |b| self.client.anchor(b))
    }

    fn claim(&self, descriptions: &[Anchor<'_>]) -> Result<(), Errno> {
        by_chunks(descriptions, |b| self.client.claim_descriptions(b))
    }

    fn backing_file(
        &self,
        node: NodeId,
        fh: u64,
        description: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<std::os::fd::OwnedFd, Errno> {
        self.client.backing_file(node.0, fh, description)
    }

    fn kernel_node(&self, node: NodeId) -> Result<std::os::fd::OwnedFd, Errno> {
        self.client.kernel_node(node.0)
    }

    fn watch_node(&self, node: NodeId, parent: NodeId, name: &[u8]) -> Result<std::os::fd::OwnedFd, Errno> {
        self.client.watch_node(node.0, parent.0, name)
    }

    fn invalidations(&self, apply: &mut dyn FnMut(Invalidation<'_>)) {
        self.client.notices(|n| {
            apply(match n {
                Notice::Inode(node) => Invalidation::Inode(NodeId(node)),
                Notice::Entry { parent, name } => Invalidation::Entry {
                    parent: NodeId(parent),
                    name,
                },
                Notice::All => Invalidation::All,
            })
        });
    }
}

/// Hands `anchors` to `send` as the ring's [`Anchoring`]s, a chunk at a
/// time. On the stack: the shim anchors just before a fork, when libc's
/// fork holds the allocator's locks (see `crate::anchor_files`).
fn by_chunks(anchors: &[Anchor<'_>], mut send: impl FnMut(&[Anchoring<'_>]) -> Result<(), Errno>) -> Result<(), Errno> {
    const CHUNK: usize = 32;
    for chunk in anchors.chunks(CHUNK) {
        fn to<'a>(a: &Anchor<'a>) -> Anchoring<'a> {
            Anchoring {
                node: a.node.0,
                fh: a.fh,
                dir: a.dir,
                description: a.description,
            }
        }
        let mut batch = [to(&chunk[0]); CHUNK];
        for (b, a) in batch.iter_mut().zip(chunk) {
            *b = to(a);
        }
        send(&batch[..chunk.len()])?;
    }
    Ok(())
}
