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

pub mod embedded;
pub mod etcd;

use std::sync::Arc;

use shortfuse::{Errno, Result};

use crate::proto::{AttrChange, DirEntryInfo, NewKind, NodeAttr, NodeInfo, WireTime};
use embedded::Meta;
use etcd::{Creation, EtcdMeta};

/// The root directory's inode number (the kernel's `FUSE_ROOT_ID`).
pub const ROOT_INO: u64 = 1;

const NAME_MAX: usize = 255;

/// What a removal or rename freed: inodes whose data can go.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Freed(pub Vec<u64>);

pub fn now() -> (i64, u32) {
    let t = shortfuse::Timestamp::now();
    (t.sec, t.nsec)
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(())
}

/// The attributes of a node `create` makes now.
pub(crate) fn new_attr(kind: &NewKind, mode: u32, uid: u32, gid: u32) -> NodeAttr {
    let t = now();
    let (typ, size, rdev) = match kind {
        NewKind::Dir => (libc::S_IFDIR, 0, 0),
        NewKind::Symlink { target } => (libc::S_IFLNK, target.len() as u64, 0),
        NewKind::Node { rdev } => {
            let typ = mode & libc::S_IFMT;
            (if typ == 0 { libc::S_IFREG } else { typ }, 0, *rdev)
        }
    };
    NodeAttr {
        size,
        atime: t,
        mtime: t,
        ctime: t,
        mode: typ | (mode & 0o7777),
        nlink: if typ == libc::S_IFDIR { 2 } else { 1 },
        uid,
        gid,
        rdev,
    }
}

/// The attributes of a node made in a directory of `parent`'s: in a
/// set-group-ID directory it takes the directory's group, and a directory
/// the set-group-ID bit too (as ext4's inode_init_owner; the kernel has
/// already dropped a set-group-ID bit the creator may not keep).
pub(crate) fn in_dir(mut attr: NodeAttr, parent: &NodeAttr) -> NodeAttr {
    if parent.mode & libc::S_ISGID != 0 {
        attr.gid = parent.gid;
        if attr.mode & libc::S_IFMT == libc::S_IFDIR {
            attr.mode |= libc::S_ISGID;
        }
    }
    attr
}

/// [`Meta::extend`] on attributes (both metadata services apply it);
/// returns whether they changed.
pub(crate) fn extend_attr(attr: &mut NodeAttr, min_size: u64, mtime: Option<(i64, u32)>) -> bool {
    let before = *attr;
    attr.size = attr.size.max(min_size);
    if let Some(mtime) = mtime {
        attr.mtime = mtime;
        // A write changes the inode too.
        attr.ctime = mtime.max(attr.ctime);
    }
    *attr != before
}

/// Applies a `setattr` to `attr` (the caller checked that a size change
/// is for a regular file).
pub(crate) fn apply_change(attr: &mut NodeAttr, change: &AttrChange) {
    let t = now();
    let resolve = |w: WireTime| match w {
        WireTime::Now => t,
        WireTime::At(s, n) => (s, n),
    };
    if let Some(m) = change.mode {
        attr.mode = (attr.mode & libc::S_IFMT) | (m & 0o7777);
    }
    if let Some(u) = change.uid {
        attr.uid = u;
    }
    if let Some(g) = change.gid {
        attr.gid = g;
    }
    if let Some(s) = change.size {
        attr.size = s;
        attr.mtime = t;
    }
    if let Some(a) = change.atime {
        attr.atime = resolve(a);
    }
    if let Some(m) = change.mtime {
        attr.mtime = resolve(m);
    }
    attr.ctime = t;
}

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

    /// Records a write: see [`crate::meta::embedded::Meta::extend`].
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
