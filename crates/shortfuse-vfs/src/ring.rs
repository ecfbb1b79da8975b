//! The ring backend: requests travel to a shared `shortfuse serve` daemon
//! over shared-memory rings (`shortfuse-ring`), instead of to a file
//! system built in this process. Every process then sees one file system
//! (one cache in the daemon, changes visible at once); the daemon's
//! notifications keep this client's dentry and attribute cache coherent.
//!
//! A mount made from what another process was told ([`Ring::lazy`])
//! connects at its first need: the first request, descriptions to hand to
//! the daemon or a descriptor to ask of it. A process that never needs the
//! daemon never connects (most short processes of a build, `/bin/true`:
//! no handshake, no region mapped, nothing for the daemon to set up or
//! clean after). Its INIT travels with the hello. Each process connects
//! for itself: a child forked before its parent connected has a connection
//! of its own, one forked after shares the parent's as before.
//!
//! Until it connects a process hears none of the daemon's notifications,
//! and needs none for its cache, which holds nothing of the daemon's yet;
//! directories it resolved beneath the namespace map are kept for the
//! entry timeout, as they are against changes the daemon never sees
//! (another process's beneath the map).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use std::sync::atomic::{AtomicBool, Ordering};

use shortfuse::{Errno, NodeId};
use shortfuse_ring::{Anchoring, Notice, RingClient, Told};

use crate::backend::{Anchor, Backend, Invalidation};
use crate::once::MadeOnce;

/// A connection to the daemon serving one mount point, made now or at the
/// first need.
pub struct Ring {
    /// The mount point, normalised.
    mp: Vec<u8>,
    /// For a lazy connection: what the mount was set up with, which the
    /// daemon met later must still say.
    told: Option<Told>,
    client: MadeOnce<RingClient>,
    /// Whether this process may connect now (see [`Backend::may_start`]).
    may_connect: fn() -> bool,
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
        let client = dial(&mp, early).map_err(|(_, e)| e)?;
        Ok(Ring {
            mp,
            told: None,
            client: MadeOnce::made(client),
            may_connect: always,
        })
    }

    /// A mount of the daemon serving `mountpoint` set up from what another
    /// process's welcome `told`, which connects at its first need (see the
    /// module doc), when `may_connect` says this process may.
    pub fn lazy(mountpoint: &[u8], told: Told, may_connect: fn() -> bool) -> Ring {
        Ring {
            mp: crate::normalize(mountpoint),
            told: Some(told),
            client: MadeOnce::new(),
            may_connect,
        }
    }

    /// The connection, when made (always, for [`Ring::connect`]'s).
    pub fn client(&self) -> Option<&RingClient> {
        self.client.get()
    }

    /// The daemon's namespace map, when it granted it to this client, and
    /// the only fsuid it serves (see [`crate::Namespace`]).
    pub fn namespace_map(&self) -> Option<(shortfuse::NamespaceMap, u32)> {
        self.client()?.namespace_map().cloned()
    }

    /// The connection, made now if it was not (`early`: the requests about
    /// to be sent first, which the daemon answers with its welcome when
    /// they are a process's INIT and the root's GETATTR).
    fn connected(&self, early: &[Vec<u8>]) -> Result<&RingClient, Errno> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        if !(self.may_connect)() {
            return Err(Errno::ENOTCONN);
        }
        self.client.get_or_try(|| {
            let client = dial(&self.mp, early).map_err(|(kind, e)| match kind {
                // The daemon turned us away (a program that left the
                // daemon's user before its first request, without
                // `allow_other`): EACCES, as from a kernel mount of
                // another user's.
                std::io::ErrorKind::InvalidData => Errno::EACCES,
                _ => self.refused(&e),
            })?;
            // The mount was set up with what another process was told: a
            // daemon that now says otherwise is not the one it was made for.
            let agrees = match (client.told(), &self.told) {
                (Some(now), Some(set_up)) => now.agrees_with(set_up),
                _ => false,
            };
            if !agrees {
                return Err(self.refused("the daemon serving it now is not the one the program started with"));
            }
            Ok(client)
        })
    }

    /// Says once per process why the connection failed, as the start of
    /// an image used to; the call gets ENOTCONN, as from a daemon gone.
    fn refused(&self, why: &str) -> Errno {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            eprintln!("shortfuse-preload: mount {}: {why}", String::from_utf8_lossy(&self.mp));
        }
        Errno::ENOTCONN
    }
}

fn always() -> bool {
    true
}

/// Connects to the daemon serving normalised mount point `mp` (at its
/// user's socket, else root's), handing it `early` requests; the error's
/// kind is InvalidData when a daemon answered and refused.
fn dial(mp: &[u8], early: &[Vec<u8>]) -> Result<RingClient, (std::io::ErrorKind, String)> {
    let paths = shortfuse_ring::socket_paths(Path::new(OsStr::from_bytes(mp)));
    let mut first = None;
    for path in &paths {
        match RingClient::connect_with(path, early) {
            Ok(client) => return Ok(client),
            // Nobody there: root's daemon may be.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                first.get_or_insert(e);
            }
            Err(e) => return Err((e.kind(), e.to_string())),
        }
    }
    let e = first.map_or_else(String::new, |e| e.to_string());
    let mp = String::from_utf8_lossy(mp);
    Err((
        std::io::ErrorKind::NotFound,
        format!("{e} (is `shortfuse serve FS {mp}` running?)"),
    ))
}

impl Backend for Ring {
    fn call(&self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), Errno> {
        self.connected(&[])?.call(request, reply)
    }

    fn send(&self, request: &[u8], _scratch: &mut Vec<u8>) -> Result<(), Errno> {
        self.connected(&[])?.send(request)
    }

    fn shared(&self) -> bool {
        true
    }

    fn deferred(&self) -> bool {
        self.client.get().is_none()
    }

    fn start(&self, first: &[Vec<u8>]) -> Result<(), Errno> {
        self.connected(first).map(drop)
    }

    fn may_start(&self) -> bool {
        self.client.get().is_some() || (self.may_connect)()
    }

    fn shared_entry(&self, parent: NodeId, name: &[u8], uid: u32) -> Option<(NodeId, shortfuse_abi::fuse_attr)> {
        self.client
            .get()?
            .shared_entry(parent.0, name, uid)
            .map(|(n, a)| (NodeId(n), a))
    }

    fn shared_listing(&self, dir: NodeId, uid: u32, out: &mut Vec<u8>) -> bool {
        self.client.get().is_some_and(|c| c.shared_listing(dir.0, uid, out))
    }

    fn has_shared_entries(&self) -> bool {
        self.client.get().is_some_and(RingClient::has_shared_entries)
    }

    fn anchor(&self, anchors: &[Anchor<'_>]) -> Result<(), Errno> {
        by_chunks(anchors, |b| self.connected(&[])?.anchor(b))
    }

    fn claim(&self, descriptions: &[Anchor<'_>]) -> Result<(), Errno> {
        by_chunks(descriptions, |b| self.connected(&[])?.claim_descriptions(b))
    }

    fn backing_file(
        &self,
        node: NodeId,
        fh: u64,
        description: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<std::os::fd::OwnedFd, Errno> {
        self.connected(&[])?.backing_file(node.0, fh, description)
    }

    fn kernel_node(&self, node: NodeId) -> Result<std::os::fd::OwnedFd, Errno> {
        self.connected(&[])?.kernel_node(node.0)
    }

    fn watch_node(&self, node: NodeId, parent: NodeId, name: &[u8]) -> Result<std::os::fd::OwnedFd, Errno> {
        self.connected(&[])?.watch_node(node.0, parent.0, name)
    }

    fn invalidations_pending(&self) -> bool {
        // Not connected yet: nothing was announced to this process.
        self.client.get().is_some_and(|c| c.notices_pending())
    }

    fn invalidations(&self, apply: &mut dyn FnMut(Invalidation<'_>)) {
        let Some(client) = self.client.get() else {
            return;
        };
        client.notices(|n| {
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
