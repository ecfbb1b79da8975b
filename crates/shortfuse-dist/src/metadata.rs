//! The metadata service as the server sees it: one type over the two
//! implementations, local files ([`Meta`], the embedded mode) and etcd
//! ([`EtcdMeta`], the agents of the scale-out mode).
//!
//! Every method is async: the etcd one waits for etcd; the local one
//! answers at once (a lock and an append), except [`Metadata::sync`], which
//! runs its `fdatasync` on the blocking pool.
//!
//! Open files: the local service asks the caller's `is_open` (the lease
//! manager of this one server) under its lock; the etcd service keeps its
//! own marks in etcd, published by [`Metadata::open_file`] for this agent's
//! openers and seen by every agent, so it does not ask.

use std::sync::Arc;

use shortfuse::{Errno, Result};

use crate::etcdmeta::{Creation, EtcdMeta};
use crate::meta::{Freed, Meta};
use crate::proto::{AttrChange, DirEntryInfo, NodeInfo};

pub enum Metadata {
    Local(Meta),
    // Boxed: the etcd client is a few KiB.
    Etcd(Box<EtcdMeta>),
}

impl Metadata {
    pub fn node_id(&self) -> u32 {
        match self {
            Metadata::Local(m) => m.node_id(),
            Metadata::Etcd(m) => m.node_id(),
        }
    }

    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<NodeInfo> {
        match self {
            Metadata::Local(m) => m.lookup(parent, name),
            Metadata::Etcd(m) => m.lookup(parent, name).await,
        }
    }

    pub async fn getattr(&self, ino: u64) -> Result<NodeInfo> {
        match self {
            Metadata::Local(m) => m.getattr(ino),
            Metadata::Etcd(m) => m.getattr(ino).await,
        }
    }

    /// Applies `change`; returns the new attributes and the old size.
    pub async fn setattr(&self, ino: u64, change: &AttrChange) -> Result<(NodeInfo, u64)> {
        match self {
            Metadata::Local(m) => m.setattr(ino, change),
            Metadata::Etcd(m) => m.setattr(ino, change).await,
        }
    }

    /// Records a write: see [`crate::meta::Meta::extend`].
    pub async fn extend(&self, ino: u64, min_size: u64, mtime: Option<(i64, u32)>) -> Result<NodeInfo> {
        match self {
            Metadata::Local(m) => m.extend(ino, min_size, mtime),
            Metadata::Etcd(m) => m.extend(ino, min_size, mtime).await,
        }
    }

    pub async fn create(&self, new: Creation<'_>) -> Result<NodeInfo> {
        match self {
            Metadata::Local(m) => m.create(new.parent, new.name, new.kind, new.mode, new.uid, new.gid),
            Metadata::Etcd(m) => m.create_new(new).await,
        }
    }

    /// Removes a name; a file that loses its last name while open stays
    /// as an orphan (local: `is_open(ino)` says so).
    pub async fn remove(
        &self,
        parent: u64,
        name: &[u8],
        dir: bool,
        is_open: impl Fn(u64) -> Result<bool>,
    ) -> Result<Freed> {
        match self {
            Metadata::Local(m) => m.remove(parent, name, dir, is_open),
            Metadata::Etcd(m) => m.remove(parent, name, dir).await,
        }
    }

    /// Renames; a replaced file that is open stays as an orphan.
    pub async fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
        is_open: impl Fn(u64) -> Result<bool>,
    ) -> Result<Freed> {
        match self {
            Metadata::Local(m) => m.rename(parent, name, new_parent, new_name, flags, is_open),
            Metadata::Etcd(m) => m.rename(parent, name, new_parent, new_name, flags).await,
        }
    }

    pub async fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<NodeInfo> {
        match self {
            Metadata::Local(m) => m.link(ino, new_parent, new_name),
            Metadata::Etcd(m) => m.link(ino, new_parent, new_name).await,
        }
    }

    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        match self {
            Metadata::Local(m) => m.readlink(ino),
            Metadata::Etcd(m) => m.readlink(ino).await,
        }
    }

    pub async fn readdir(&self, ino: u64) -> Result<Vec<DirEntryInfo>> {
        match self {
            Metadata::Local(m) => m.readdir(ino),
            Metadata::Etcd(m) => m.readdir(ino).await,
        }
    }

    /// Number of inodes.
    pub async fn count(&self) -> Result<u64> {
        match self {
            Metadata::Local(m) => Ok(m.count()),
            Metadata::Etcd(m) => m.count().await,
        }
    }

    /// Every orphan (of every agent, on etcd).
    pub async fn orphans(&self) -> Result<Vec<u64>> {
        match self {
            Metadata::Local(m) => Ok(m.orphans()),
            Metadata::Etcd(m) => m.orphans().await,
        }
    }

    /// Records, before the opener is answered and after the lease
    /// manager's record, that `ino` is open here; `ENOENT` when it is gone
    /// (checked with the record: a removal from then on sees it open).
    /// Local: the lease manager's record is enough, the check a lookup.
    pub async fn open_file(&self, ino: u64) -> Result<()> {
        match self {
            Metadata::Local(m) => m.getattr(ino).map(|_| ()),
            Metadata::Etcd(m) => m.open_file(ino).await,
        }
    }

    /// Frees `ino` if it is an orphan and nobody holds it open: `is_open()`
    /// for this server's clients, asked under the service's lock after the
    /// caller recorded a close. Returns whether it did.
    pub async fn reap(&self, ino: u64, is_open: impl FnOnce() -> bool) -> Result<bool> {
        match self {
            Metadata::Local(m) => m.reap(ino, is_open),
            Metadata::Etcd(m) => m.reap(ino, is_open).await,
        }
    }

    /// Makes every answered change durable.
    pub async fn sync(self: &Arc<Self>) -> Result<()> {
        match &**self {
            Metadata::Local(_) => {
                let me = self.clone();
                tokio::task::spawn_blocking(move || match &*me {
                    Metadata::Local(m) => m.sync(),
                    Metadata::Etcd(m) => m.sync(),
                })
                .await
                .map_err(|_| Errno::EIO)?
            }
            Metadata::Etcd(m) => m.sync(),
        }
    }
}
