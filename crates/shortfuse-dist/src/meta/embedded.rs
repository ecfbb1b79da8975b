//! The metadata service: name space and attributes, strongly consistent.
//!
//! One lock serializes every change, so each request sees the effects of
//! every request answered before it. Changes are operations ([`Op`]) that
//! carry every value they need (inode numbers, times), so applying them is
//! deterministic: a change is applied, then appended to `meta.log` under the
//! data directory; at start the snapshot (`meta.snap`) is loaded, the log
//! replayed, and a new snapshot written before the log is emptied. Appends
//! are written at once (a crashed server process loses nothing) and made
//! durable with `fdatasync` when a client's fsync asks for it ([`Meta::sync`]).
//! A torn record at the end of the log (a crash mid-append) is dropped.
//!
//! # Orphans
//!
//! A file whose last name is removed while some client holds it open
//! (the caller says so: the lease manager knows who holds what open) is
//! kept with no name and `nlink` 0, an orphan, so that its openers go on
//! reading and writing it as POSIX wants; [`Meta::reap`] frees it once the
//! last opener closed it or its session ended. Orphans are ordinary nodes
//! in the snapshot and the log, so they survive a restart, and the server
//! reaps at start those nobody holds open any more ([`Meta::orphans`]).
//!
//! Seam for the scale-out step: the server only calls the public methods;
//! an etcd-backed service keeps inodes and directory entries as keys and
//! applies the same operations in transactions.

use shortfuse::sync::Unpoison;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use shortfuse::{Errno, Result};

use super::{apply_change, check_name, extend_attr, in_dir, new_attr, now, Freed, ROOT_INO};
use crate::proto::{self, AttrChange, DirEntryInfo, Gfi, NewKind, NodeAttr, NodeInfo};

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Body {
    File,
    Dir {
        parent: u64,
        entries: BTreeMap<Vec<u8>, u64>,
    },
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Node {
    attr: NodeAttr,
    body: Body,
}

#[derive(Default, Serialize, Deserialize)]
struct Tree {
    node_id: u32,
    next_ino: u64,
    nodes: HashMap<u64, Node>,
}

/// A logged change.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Op {
    Create {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
        attr: NodeAttr,
        kind: NewKind,
    },
    Remove {
        parent: u64,
        name: Vec<u8>,
        dir: bool,
        now: (i64, u32),
        /// The file is open somewhere: an orphan at its last link.
        keep: bool,
    },
    Rename {
        parent: u64,
        name: Vec<u8>,
        new_parent: u64,
        new_name: Vec<u8>,
        flags: u32,
        now: (i64, u32),
        /// The replaced file is open somewhere.
        keep: bool,
    },
    Link {
        ino: u64,
        new_parent: u64,
        new_name: Vec<u8>,
        now: (i64, u32),
    },
    SetAttr {
        ino: u64,
        attr: NodeAttr,
    },
    /// Frees an orphan.
    Reap {
        ino: u64,
    },
}

impl Tree {
    fn fresh(node_id: u32) -> Tree {
        let root = Node {
            attr: new_attr(&NewKind::Dir, 0o755, 0, 0),
            body: Body::Dir {
                parent: ROOT_INO,
                entries: BTreeMap::new(),
            },
        };
        Tree {
            node_id,
            next_ino: ROOT_INO + 1,
            nodes: [(ROOT_INO, root)].into(),
        }
    }

    fn node(&self, ino: u64) -> Result<&Node> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<Vec<u8>, u64>> {
        match &self.node(dir)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<Vec<u8>, u64>> {
        match &mut self.node_mut(dir)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// Whether node `ino` may go for a name that is (`dir`) or is not a
    /// directory: rmdir's and rename's rule (an empty directory for a
    /// directory, a non-directory for a non-directory).
    fn may_replace(&self, ino: u64, dir: bool) -> Result<()> {
        match (&self.node(ino)?.body, dir) {
            (Body::Dir { entries, .. }, true) if !entries.is_empty() => Err(Errno::ENOTEMPTY),
            (Body::Dir { .. }, false) => Err(Errno::EISDIR),
            (Body::Dir { .. }, true) | (_, false) => Ok(()),
            (_, true) => Err(Errno::ENOTDIR),
        }
    }

    fn is_dir(&self, ino: u64) -> bool {
        matches!(self.nodes.get(&ino).map(|n| &n.body), Some(Body::Dir { .. }))
    }

    fn touch_dir(&mut self, dir: u64, t: (i64, u32), nlink_delta: i32) {
        if let Some(n) = self.nodes.get_mut(&dir) {
            n.attr.mtime = t;
            n.attr.ctime = t;
            n.attr.nlink = n.attr.nlink.saturating_add_signed(nlink_delta);
        }
    }

    /// Drops one link of `ino`; frees it at zero unless `keep` (an
    /// orphan: it is open somewhere).
    fn unlink_node(&mut self, ino: u64, t: (i64, u32), keep: bool, freed: &mut Freed) {
        let Some(n) = self.nodes.get_mut(&ino) else { return };
        let gone = match n.body {
            Body::Dir { .. } => true,
            _ => {
                n.attr.nlink = n.attr.nlink.saturating_sub(1);
                n.attr.ctime = t;
                n.attr.nlink == 0 && !keep
            }
        };
        if gone {
            self.nodes.remove(&ino);
            freed.0.push(ino);
        }
    }

    /// Is `ino` `ancestor` or below it?
    fn is_below(&self, mut ino: u64, ancestor: u64) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            match self.nodes.get(&ino).map(|n| &n.body) {
                Some(Body::Dir { parent, .. }) if *parent != ino => ino = *parent,
                _ => return false,
            }
        }
    }

    /// Applies `op`, checking everything first: an `Err` leaves the tree
    /// unchanged.
    fn apply(&mut self, op: &Op) -> Result<Freed> {
        let mut freed = Freed::default();
        match op {
            Op::Create {
                parent,
                name,
                ino,
                attr,
                kind,
            } => {
                check_name(name)?;
                if self.entries(*parent)?.contains_key(name) {
                    return Err(Errno::EEXIST);
                }
                if self.nodes.contains_key(ino) {
                    return Err(Errno::EIO);
                }
                let body = match kind {
                    NewKind::Node { .. } => Body::File,
                    NewKind::Dir => Body::Dir {
                        parent: *parent,
                        entries: BTreeMap::new(),
                    },
                    NewKind::Symlink { target } => Body::Symlink(target.clone()),
                };
                let dir = matches!(kind, NewKind::Dir);
                self.entries_mut(*parent)?.insert(name.clone(), *ino);
                self.nodes.insert(*ino, Node { attr: *attr, body });
                self.touch_dir(*parent, attr.ctime, if dir { 1 } else { 0 });
                self.next_ino = self.next_ino.max(ino + 1);
            }
            Op::Remove {
                parent,
                name,
                dir,
                now,
                keep,
            } => {
                let ino = *self.entries(*parent)?.get(name).ok_or(Errno::ENOENT)?;
                self.may_replace(ino, *dir)?;
                self.entries_mut(*parent)?.remove(name);
                self.touch_dir(*parent, *now, if *dir { -1 } else { 0 });
                self.unlink_node(ino, *now, *keep, &mut freed);
            }
            Op::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
                now,
                keep,
            } => {
                check_name(new_name)?;
                let src = *self.entries(*parent)?.get(name).ok_or(Errno::ENOENT)?;
                let dst = self.entries(*new_parent)?.get(new_name).copied();
                let exchange = flags & libc::RENAME_EXCHANGE != 0;
                if flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 {
                    return Err(Errno::EINVAL);
                }
                if flags & libc::RENAME_NOREPLACE != 0 && dst.is_some() {
                    return Err(Errno::EEXIST);
                }
                let src_dir = self.is_dir(src);
                if src_dir && self.is_below(*new_parent, src) {
                    return Err(Errno::EINVAL);
                }
                if exchange {
                    let dst = dst.ok_or(Errno::ENOENT)?;
                    if self.is_dir(dst) && self.is_below(*parent, dst) {
                        return Err(Errno::EINVAL);
                    }
                    self.entries_mut(*parent)?.insert(name.clone(), dst);
                    self.entries_mut(*new_parent)?.insert(new_name.clone(), src);
                    for (ino, p) in [(src, *new_parent), (dst, *parent)] {
                        if let Some(Node {
                            body: Body::Dir { parent, .. },
                            ..
                        }) = self.nodes.get_mut(&ino)
                        {
                            *parent = p;
                        }
                    }
                    let (sd, dd) = (src_dir as i32, self.is_dir(dst) as i32);
                    self.touch_dir(*parent, *now, dd - sd);
                    self.touch_dir(*new_parent, *now, sd - dd);
                    return Ok(freed);
                }
                if dst == Some(src) {
                    return Ok(freed);
                }
                if let Some(d) = dst {
                    self.may_replace(d, src_dir)?;
                }
                self.entries_mut(*parent)?.remove(name);
                self.entries_mut(*new_parent)?.insert(new_name.clone(), src);
                let replaced_dir = dst.is_some_and(|d| self.is_dir(d));
                if let Some(d) = dst {
                    self.unlink_node(d, *now, *keep, &mut freed);
                }
                if let Some(Node {
                    body: Body::Dir { parent: p, .. },
                    ..
                }) = self.nodes.get_mut(&src)
                {
                    *p = *new_parent;
                }
                if let Some(n) = self.nodes.get_mut(&src) {
                    n.attr.ctime = *now;
                }
                let sd = src_dir as i32;
                self.touch_dir(*parent, *now, -sd);
                self.touch_dir(*new_parent, *now, sd - replaced_dir as i32);
            }
            Op::Link {
                ino,
                new_parent,
                new_name,
                now,
            } => {
                check_name(new_name)?;
                if self.is_dir(*ino) {
                    return Err(Errno::EPERM);
                }
                // An orphan gets no name back (linkat(2) of an unlinked
                // file fails so, O_TMPFILE aside).
                if self.node(*ino)?.attr.nlink == 0 {
                    return Err(Errno::ENOENT);
                }
                if self.entries(*new_parent)?.contains_key(new_name) {
                    return Err(Errno::EEXIST);
                }
                self.entries_mut(*new_parent)?.insert(new_name.clone(), *ino);
                let n = self.node_mut(*ino)?;
                n.attr.nlink += 1;
                n.attr.ctime = *now;
                self.touch_dir(*new_parent, *now, 0);
            }
            Op::SetAttr { ino, attr } => {
                self.node_mut(*ino)?.attr = *attr;
            }
            Op::Reap { ino } => {
                let n = self.node(*ino)?;
                if matches!(n.body, Body::Dir { .. }) || n.attr.nlink != 0 {
                    return Err(Errno::EINVAL);
                }
                self.nodes.remove(ino);
                freed.0.push(*ino);
            }
        }
        Ok(freed)
    }
}

struct Inner {
    tree: Tree,
    log: File,
    /// A failed append left memory ahead of the disk: refuse changes.
    broken: bool,
}

/// The metadata service over one data directory.
pub struct Meta {
    inner: Mutex<Inner>,
    dir: PathBuf,
}

fn read_log(path: &Path, tree: &mut Tree) -> io::Result<()> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut r = BufReader::new(file);
    loop {
        let mut prefix = [0u8; 4];
        match r.read_exact(&mut prefix) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut body = vec![0u8; proto::frame_len(prefix)?];
        match r.read_exact(&mut body) {
            Ok(()) => {}
            // A torn last record: the append it belongs to never finished.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let op: Op = proto::decode(&body)?;
        tree.apply(&op).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: replaying {op:?}: {e}", path.display()),
            )
        })?;
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Meta {
    /// Opens (or creates) the metadata under `dir`. A new data directory
    /// gets the storage node id `node_id`; an existing one keeps its own.
    pub fn open(dir: &Path, node_id: u32) -> io::Result<Meta> {
        std::fs::create_dir_all(dir)?;
        let snap = dir.join("meta.snap");
        let log_path = dir.join("meta.log");
        let mut tree = match std::fs::read(&snap) {
            Ok(bytes) => proto::decode::<Tree>(&bytes)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", snap.display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Tree::fresh(node_id),
            Err(e) => return Err(e),
        };
        read_log(&log_path, &mut tree)?;
        // Compact: the snapshot takes the log's place.
        let tmp = dir.join("meta.snap.tmp");
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&bincode_plain(&tree)?)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &snap)?;
        sync_dir(dir)?;
        let log = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&log_path)?;
        log.sync_all()?;
        Ok(Meta {
            inner: Mutex::new(Inner {
                tree,
                log,
                broken: false,
            }),
            dir: dir.to_path_buf(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unpoison()
    }

    pub fn node_id(&self) -> u32 {
        self.lock().tree.node_id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn info(tree: &Tree, ino: u64) -> Result<NodeInfo> {
        Ok(NodeInfo {
            gfi: Gfi {
                node: tree.node_id,
                ino,
            },
            attr: tree.node(ino)?.attr,
        })
    }

    /// Applies `op` and logs it.
    fn change(inner: &mut Inner, op: Op) -> Result<Freed> {
        if inner.broken {
            return Err(Errno::EIO);
        }
        let freed = inner.tree.apply(&op)?;
        let frame = proto::encode(&op).map_err(|_| Errno::EIO);
        let ok = frame.and_then(|f| inner.log.write_all(&f).map_err(Errno::from));
        if let Err(e) = ok {
            inner.broken = true;
            return Err(e);
        }
        Ok(freed)
    }

    /// Makes every logged change durable.
    pub fn sync(&self) -> Result<()> {
        let inner = self.lock();
        inner.log.sync_data().map_err(Errno::from)
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<NodeInfo> {
        let inner = self.lock();
        let ino = *inner.tree.entries(parent)?.get(name).ok_or(Errno::ENOENT)?;
        Self::info(&inner.tree, ino)
    }

    pub fn getattr(&self, ino: u64) -> Result<NodeInfo> {
        Self::info(&self.lock().tree, ino)
    }

    /// Applies `change`; returns the new attributes and the old size.
    pub fn setattr(&self, ino: u64, change: &AttrChange) -> Result<(NodeInfo, u64)> {
        let mut inner = self.lock();
        let node = inner.tree.node(ino)?;
        let old_size = node.attr.size;
        if change.size.is_some() && !matches!(node.body, Body::File) {
            return Err(if matches!(node.body, Body::Dir { .. }) {
                Errno::EISDIR
            } else {
                Errno::EINVAL
            });
        }
        let mut attr = node.attr;
        apply_change(&mut attr, change);
        Self::change(&mut inner, Op::SetAttr { ino, attr })?;
        Ok((Self::info(&inner.tree, ino)?, old_size))
    }

    /// Records a write (after its blocks were stored): the file is at
    /// least `min_size` long, and its mtime is `mtime` if given (data
    /// changed). Never shrinks it: writers that share a file directly each
    /// know only their own end (truncation is [`Meta::setattr`]).
    pub fn extend(&self, ino: u64, min_size: u64, mtime: Option<(i64, u32)>) -> Result<NodeInfo> {
        let mut inner = self.lock();
        let mut attr = inner.tree.node(ino)?.attr;
        if !extend_attr(&mut attr, min_size, mtime) {
            return Self::info(&inner.tree, ino);
        }
        Self::change(&mut inner, Op::SetAttr { ino, attr })?;
        Self::info(&inner.tree, ino)
    }

    pub fn create(&self, parent: u64, name: &[u8], kind: NewKind, mode: u32, uid: u32, gid: u32) -> Result<NodeInfo> {
        let mut inner = self.lock();
        let ino = inner.tree.next_ino;
        let attr = in_dir(new_attr(&kind, mode, uid, gid), &inner.tree.node(parent)?.attr);
        Self::change(
            &mut inner,
            Op::Create {
                parent,
                name: name.to_vec(),
                ino,
                attr,
                kind,
            },
        )?;
        Self::info(&inner.tree, ino)
    }

    /// Whether the file named `name` in `parent` is open somewhere, asked
    /// under the lock, so that an opener's close cannot slip between the
    /// question and the removal (see [`Meta::reap`]).
    fn named_open(inner: &Inner, parent: u64, name: &[u8], is_open: impl Fn(u64) -> Result<bool>) -> Result<bool> {
        match inner.tree.entries(parent).ok().and_then(|e| e.get(name).copied()) {
            Some(ino) if !inner.tree.is_dir(ino) => is_open(ino),
            _ => Ok(false),
        }
    }

    /// Removes a name; `is_open(ino)` tells whether a file that loses its
    /// last name must stay as an orphan.
    pub fn remove(&self, parent: u64, name: &[u8], dir: bool, is_open: impl Fn(u64) -> Result<bool>) -> Result<Freed> {
        let mut inner = self.lock();
        let keep = !dir && Self::named_open(&inner, parent, name, is_open)?;
        let op = Op::Remove {
            parent,
            name: name.to_vec(),
            dir,
            now: now(),
            keep,
        };
        Self::change(&mut inner, op)
    }

    /// Renames; a replaced file is an orphan when `is_open` says so.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
        is_open: impl Fn(u64) -> Result<bool>,
    ) -> Result<Freed> {
        let mut inner = self.lock();
        let keep = Self::named_open(&inner, new_parent, new_name, is_open)?;
        let op = Op::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
            now: now(),
            keep,
        };
        Self::change(&mut inner, op)
    }

    /// Frees `ino` if it is an orphan and `is_open()` (asked under the
    /// lock, after the caller recorded a close) says nobody holds it open
    /// any more. Returns whether it did: the caller removes the data.
    pub fn reap(&self, ino: u64, is_open: impl FnOnce() -> bool) -> Result<bool> {
        let mut inner = self.lock();
        let orphan = inner
            .tree
            .nodes
            .get(&ino)
            .is_some_and(|n| n.attr.nlink == 0 && !matches!(n.body, Body::Dir { .. }));
        if !orphan || is_open() {
            return Ok(false);
        }
        Self::change(&mut inner, Op::Reap { ino })?;
        Ok(true)
    }

    /// Every orphan (files kept with no name).
    pub fn orphans(&self) -> Vec<u64> {
        let inner = self.lock();
        let mut v: Vec<u64> = inner
            .tree
            .nodes
            .iter()
            .filter(|(_, n)| n.attr.nlink == 0 && !matches!(n.body, Body::Dir { .. }))
            .map(|(i, _)| *i)
            .collect();
        v.sort_unstable();
        v
    }

    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<NodeInfo> {
        let mut inner = self.lock();
        let op = Op::Link {
            ino,
            new_parent,
            new_name: new_name.to_vec(),
            now: now(),
        };
        Self::change(&mut inner, op)?;
        Self::info(&inner.tree, ino)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        match &self.lock().tree.node(ino)?.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Every entry of directory `ino`, "." and ".." first.
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntryInfo>> {
        let inner = self.lock();
        let tree = &inner.tree;
        let Body::Dir { parent, entries } = &tree.node(ino)?.body else {
            return Err(Errno::ENOTDIR);
        };
        let mut out = vec![
            DirEntryInfo {
                name: b".".to_vec(),
                ino,
                kind: libc::S_IFDIR,
            },
            DirEntryInfo {
                name: b"..".to_vec(),
                ino: *parent,
                kind: libc::S_IFDIR,
            },
        ];
        for (name, child) in entries {
            let kind = tree
                .nodes
                .get(child)
                .map_or(libc::S_IFREG, |n| n.attr.mode & libc::S_IFMT);
            out.push(DirEntryInfo {
                name: name.clone(),
                ino: *child,
                kind,
            });
        }
        Ok(out)
    }

    /// Number of inodes.
    pub fn count(&self) -> u64 {
        self.lock().tree.nodes.len() as u64
    }
}

fn bincode_plain<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    // The snapshot is one value, not a frame: strip the length prefix.
    let mut f = proto::encode(v)?;
    f.drain(..4);
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> NewKind {
        NewKind::Node { rdev: 0 }
    }

    #[test]
    fn namespace_survives_reopen_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let m = Meta::open(dir.path(), 42).unwrap();
        let d = m.create(ROOT_INO, b"d", NewKind::Dir, 0o755, 0, 0).unwrap();
        let f = m.create(d.gfi.ino, b"f", file(), 0o644, 1, 2).unwrap();
        assert_eq!(f.gfi.node, 42);
        m.extend(f.gfi.ino, 1234, Some((5, 0))).unwrap();
        // A write never shrinks the file; without data it keeps the mtime.
        assert_eq!(m.extend(f.gfi.ino, 10, None).unwrap().attr.size, 1234);
        let attr = m.extend(f.gfi.ino, 10, Some((6, 0))).unwrap().attr;
        assert_eq!((attr.size, attr.mtime), (1234, (6, 0)));
        m.extend(f.gfi.ino, 1234, Some((5, 0))).unwrap();
        m.link(f.gfi.ino, ROOT_INO, b"hard").unwrap();
        m.rename(d.gfi.ino, b"f", ROOT_INO, b"g", 0, |_| Ok(false)).unwrap();
        m.create(ROOT_INO, b"s", NewKind::Symlink { target: b"g".to_vec() }, 0o777, 0, 0)
            .unwrap();
        assert_eq!(m.create(ROOT_INO, b"g", file(), 0o644, 0, 0).err(), Some(Errno::EEXIST));
        assert_eq!(
            m.remove(ROOT_INO, b"d", false, |_| Ok(false)).err(),
            Some(Errno::EISDIR)
        );
        assert_eq!(
            m.rename(ROOT_INO, b"d", d.gfi.ino, b"x", 0, |_| Ok(false)).err(),
            Some(Errno::EINVAL)
        );
        drop(m);
        // A torn record at the end is dropped, not an error.
        let mut log = OpenOptions::new()
            .append(true)
            .open(dir.path().join("meta.log"))
            .unwrap();
        log.write_all(&[0, 0, 0, 50, 1, 2]).unwrap();
        drop(log);

        let m = Meta::open(dir.path(), 7).unwrap();
        assert_eq!(m.node_id(), 42, "the node id belongs to the data directory");
        let g = m.lookup(ROOT_INO, b"g").unwrap();
        assert_eq!(g.gfi, f.gfi);
        assert_eq!((g.attr.size, g.attr.nlink, g.attr.uid), (1234, 2, 1));
        assert_eq!(m.readlink(m.lookup(ROOT_INO, b"s").unwrap().gfi.ino).unwrap(), b"g");
        assert_eq!(m.lookup(d.gfi.ino, b"f").err(), Some(Errno::ENOENT));
        let names: Vec<_> = m.readdir(ROOT_INO).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, [&b"."[..], b"..", b"d", b"g", b"hard", b"s"]);
        // The last link frees the inode.
        assert_eq!(m.remove(ROOT_INO, b"g", false, |_| Ok(false)).unwrap(), Freed(vec![]));
        assert_eq!(
            m.remove(ROOT_INO, b"hard", false, |_| Ok(false)).unwrap(),
            Freed(vec![g.gfi.ino])
        );
        m.create(d.gfi.ino, b"x", file(), 0o644, 0, 0).unwrap();
        assert_eq!(
            m.remove(ROOT_INO, b"d", true, |_| Ok(false)).err(),
            Some(Errno::ENOTEMPTY)
        );
        // Inode numbers are never reused after a restart.
        drop(m);
        let m = Meta::open(dir.path(), 7).unwrap();
        let n = m.create(ROOT_INO, b"new", file(), 0o644, 0, 0).unwrap();
        assert!(n.gfi.ino > g.gfi.ino);
        assert_eq!(m.getattr(ROOT_INO).unwrap().attr.nlink, 3);
    }

    #[test]
    fn an_open_file_outlives_its_last_name_until_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let m = Meta::open(dir.path(), 1).unwrap();
        let f = m.create(ROOT_INO, b"f", file(), 0o644, 0, 0).unwrap().gfi.ino;
        let g = m.create(ROOT_INO, b"g", file(), 0o644, 0, 0).unwrap().gfi.ino;
        let open = |ino| Ok(ino == f || ino == g);
        assert_eq!(m.remove(ROOT_INO, b"f", false, open).unwrap(), Freed(vec![]));
        // Replaced by a rename while open: an orphan too.
        m.create(ROOT_INO, b"h", file(), 0o644, 0, 0).unwrap();
        assert_eq!(
            m.rename(ROOT_INO, b"h", ROOT_INO, b"g", 0, open).unwrap(),
            Freed(vec![])
        );
        assert_eq!(m.getattr(f).unwrap().attr.nlink, 0);
        assert_eq!(m.lookup(ROOT_INO, b"f").err(), Some(Errno::ENOENT));
        assert_eq!(m.link(f, ROOT_INO, b"back").err(), Some(Errno::ENOENT));
        m.extend(f, 10, Some((1, 0))).unwrap();
        // Still open: not reaped; a named file is never reaped.
        assert!(!m.reap(f, || true).unwrap());
        let h = m.lookup(ROOT_INO, b"g").unwrap().gfi.ino;
        assert!(!m.reap(h, || false).unwrap());
        drop(m);
        let m = Meta::open(dir.path(), 1).unwrap();
        assert_eq!(m.orphans(), vec![f, g], "orphans survive a restart");
        assert!(m.reap(f, || false).unwrap());
        assert_eq!(m.getattr(f).err(), Some(Errno::ENOENT));
        drop(m);
        let m = Meta::open(dir.path(), 1).unwrap();
        assert_eq!(m.orphans(), vec![g], "a reap is logged");
    }
}
