//! Mirrors of watched nodes, for inotify on a file system without a
//! source directory (see [`crate::proto::WatchMsg`]).
//!
//! inotify is the kernel's: its descriptor is read, polled, shared across
//! fork and exec, and its masks, cookies, coalescing, IN_ONESHOT,
//! IN_MASK_ADD, IN_IGNORED and FIONREAD all have kernel semantics. Rather
//! than imitating all of that in each program, the daemon keeps a kernel
//! object per watched node (a directory with one empty entry per name, or
//! an empty file) and replays on it, as the request is answered, each
//! change made to the node: the kernel then tells every watcher, in every
//! program, with its own rules. A mirror is made on the first watch of its
//! node and kept until the node is removed or the daemon stops.
//!
//! The replay, by request: a creation (CREATE, MKNOD, MKDIR, SYMLINK, LINK)
//! creates the name (a directory for MKDIR, else an empty file: IN_CREATE,
//! with IN_ISDIR as the kernel sets it); UNLINK and RMDIR remove it
//! (IN_DELETE); RENAME renames it, or moves it in or out through the
//! mirrors' own directory when one side is not mirrored (IN_MOVED_FROM and
//! IN_MOVED_TO with one cookie); WRITE, FALLOCATE, COPY_FILE_RANGE, a size
//! change and an open with O_TRUNC truncate the entry (IN_MODIFY); a mode,
//! owner, times or extended attribute change sets the entry's times
//! (IN_ATTRIB). Opens, reads and closes are not replayed (the daemon does
//! not see every one of them).

use shortfuse::sync::Unpoison;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use shortfuse_abi::{self as abi, Operation};
use zerocopy::{FromBytes, IntoBytes};

use crate::proto::{NodeReply, WatchMsg, WATCH_MAGIC};
use crate::sys;

/// One watched node's mirror.
struct Mirror {
    /// The kernel object: a directory or an empty file.
    path: PathBuf,
    dir: bool,
    /// Where the node is (parent, name); None for the root.
    at: Option<(u64, Vec<u8>)>,
    /// The node of each name of a directory (0 where the file system did
    /// not say).
    names: HashMap<Vec<u8>, u64>,
}

pub(super) struct Watches {
    /// The nodes directory of the daemon (see `nodes`); None when it has none.
    root: Option<PathBuf>,
    mirrors: Mutex<HashMap<u64, Mirror>>,
    /// Some mirror exists: until then a request costs one load here.
    any: AtomicBool,
    /// Names for entries passing through `root` (moves in or out).
    seq: AtomicU64,
}

/// The node a creation made, from its reply (CREATE's starts with the
/// same entry).
fn entry_node(reply: &[u8]) -> u64 {
    reply
        .get(std::mem::size_of::<abi::fuse_out_header>()..)
        .and_then(|b| abi::fuse_entry_out::read_from_prefix(b).ok())
        .map_or(0, |(e, _)| e.nodeid)
}

fn code(e: io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl Watches {
    /// The mirrors of the daemon whose nodes directory is `nodes_dir`.
    pub fn new(nodes_dir: Option<PathBuf>) -> Watches {
        Watches {
            root: nodes_dir,
            mirrors: Mutex::new(HashMap::new()),
            any: AtomicBool::new(false),
            seq: AtomicU64::new(0),
        }
    }

    /// Parses a client message as a [`WatchMsg`] and the name after it.
    pub fn parse(msg: &[u8]) -> Option<(WatchMsg, &[u8])> {
        let (m, rest) = WatchMsg::read_from_prefix(msg).ok()?;
        if m.magic != WATCH_MAGIC {
            return None;
        }
        Some((m, rest.get(..m.len as usize)?))
    }

    /// Answers `m` on `sock` with the mirror's descriptor or errno.
    pub fn answer(sock: BorrowedFd<'_>, m: &WatchMsg, mirror: Result<OwnedFd, i32>) {
        let reply = NodeReply {
            magic: WATCH_MAGIC,
            cookie: m.cookie,
            errno: mirror.as_ref().err().map_or(0, |&e| e as u32),
        };
        if let Err(e) = sys::send(sock, reply.as_bytes(), mirror.as_ref().ok().map(|f| f.as_fd())) {
            tracing::debug!("shortfuse ring: answering a watch request: {e}");
        }
    }

    /// An O_PATH descriptor of `node`'s mirror, made now if there is none:
    /// `dir` says whether the node is a directory, `list` gives its names
    /// with their nodes and `DT_*` types (called only to make the mirror).
    pub fn open(
        &self,
        node: u64,
        dir: bool,
        at: Option<(u64, Vec<u8>)>,
        list: impl FnOnce() -> Result<Vec<(Vec<u8>, u64, u32)>, i32>,
    ) -> Result<OwnedFd, i32> {
        let mut mirrors = self.mirrors.lock().unpoison();
        let path = match mirrors.entry(node) {
            Entry::Occupied(o) => o.get().path.clone(),
            Entry::Vacant(v) => {
                let (path, names) = self.make(node, dir, list)?;
                v.insert(Mirror {
                    path: path.clone(),
                    dir,
                    at,
                    names,
                });
                self.any.store(true, Ordering::Release);
                path
            }
        };
        let f = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(code)?;
        Ok(f.into())
    }

    /// Makes the mirror of `node`: its path and, for a directory, the
    /// node of each of its names.
    fn make(
        &self,
        node: u64,
        dir: bool,
        list: impl FnOnce() -> Result<Vec<(Vec<u8>, u64, u32)>, i32>,
    ) -> Result<(PathBuf, HashMap<Vec<u8>, u64>), i32> {
        let root = self.root.as_ref().ok_or(libc::EIO)?;
        match std::fs::DirBuilder::new().mode(0o700).create(root) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(code(e)),
            _ => {}
        }
        let path = root.join(format!("w{node}-{}", self.seq.fetch_add(1, Ordering::Relaxed)));
        let mut names = HashMap::new();
        if !dir {
            make_file(&path).map_err(code)?;
            return Ok((path, names));
        }
        std::fs::DirBuilder::new().mode(0o755).create(&path).map_err(code)?;
        for (name, child, typ) in list()? {
            let p = path.join(OsStr::from_bytes(&name));
            let made = if typ == u32::from(libc::DT_DIR) {
                std::fs::DirBuilder::new().mode(0o755).create(&p)
            } else {
                make_file(&p)
            };
            made.map_err(code)?;
            names.insert(name, child);
        }
        Ok((path, names))
    }

    /// Replays request `r`, answered without an error by `reply`, on the
    /// mirrors it touches. Errors are ignored: a mirror that went wrong
    /// misses events, the file system is not affected.
    pub fn apply(&self, r: &abi::Request<'_>, reply: &[u8]) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let node = r.header.nodeid;
        let mut mirrors = self.mirrors.lock().unpoison();
        let m = &mut *mirrors;
        match &r.op {
            Operation::Write { .. } | Operation::Fallocate { .. } => modify(m, node),
            Operation::CopyFileRange { arg } => modify(m, arg.nodeid_out),
            Operation::Open { arg } if arg.flags as i32 & libc::O_TRUNC != 0 => modify(m, node),
            Operation::Setattr { arg } => {
                let v = arg.valid;
                let times = abi::FATTR_ATIME | abi::FATTR_MTIME;
                if v & abi::FATTR_SIZE != 0 || v & times == abi::FATTR_MTIME {
                    modify(m, node);
                }
                if v & (abi::FATTR_MODE | abi::FATTR_UID | abi::FATTR_GID) != 0 || v & times == times {
                    attrib(m, node);
                }
            }
            Operation::Setxattr { .. } | Operation::Removexattr { .. } => attrib(m, node),
            Operation::Create { name, .. } | Operation::Mknod { name, .. } | Operation::Symlink { name, .. } => {
                create(m, node, name.as_bytes(), entry_node(reply), false)
            }
            Operation::Mkdir { name, .. } => create(m, node, name.as_bytes(), entry_node(reply), true),
            Operation::Link { arg, name } => {
                attrib(m, arg.oldnodeid);
                create(m, node, name.as_bytes(), arg.oldnodeid, false);
            }
            Operation::Unlink { name } | Operation::Rmdir { name } => remove(m, node, name.as_bytes()),
            Operation::Rename {
                arg: abi::fuse_rename_in { newdir },
                name,
                new_name,
            } => self.rename(m, (node, name.as_bytes()), (*newdir, new_name.as_bytes()), 0),
            Operation::Rename2 {
                arg: abi::fuse_rename2_in { newdir, flags, .. },
                name,
                new_name,
            } => self.rename(m, (node, name.as_bytes()), (*newdir, new_name.as_bytes()), *flags),
            _ => {}
        }
    }

    fn rename(&self, m: &mut HashMap<u64, Mirror>, from: (u64, &[u8]), to: (u64, &[u8]), flags: u32) {
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        // The target's node goes (unless exchanged): its own mirror too.
        if !exchange {
            gone(m, to.0, to.1);
        }
        let entry = |m: &HashMap<u64, Mirror>, (dir, name): (u64, &[u8])| {
            m.get(&dir)
                .filter(|d| d.dir)
                .map(|d| d.path.join(OsStr::from_bytes(name)))
        };
        let (src, dst) = (entry(m, from), entry(m, to));
        let moved = m.get(&from.0).and_then(|d| d.names.get(from.1)).copied();
        match (&src, &dst) {
            (Some(s), Some(d)) => {
                let _ = sys::rename2(s, d, flags & libc::RENAME_EXCHANGE);
            }
            // Out of the mirrors: through the unwatched root (IN_MOVED_FROM).
            (Some(s), None) => {
                if let Some(t) = self.spare() {
                    if std::fs::rename(s, &t).is_ok() {
                        let _ = remove_any(&t);
                    }
                }
            }
            // Into them: made in the root, then moved in (IN_MOVED_TO).
            (None, Some(d)) => {
                if let Some(t) = self.spare() {
                    if make_file(&t).is_ok() && std::fs::rename(&t, d).is_err() {
                        let _ = remove_any(&t);
                    }
                }
            }
            (None, None) => {}
        }
        let back = if exchange {
            m.get(&to.0).and_then(|d| d.names.get(to.1)).copied()
        } else {
            None
        };
        if let Some(d) = m.get_mut(&from.0) {
            d.names.remove(from.1);
            if let Some(b) = back {
                d.names.insert(from.1.to_vec(), b);
            }
        }
        if let Some(d) = m.get_mut(&to.0) {
            d.names.insert(to.1.to_vec(), moved.unwrap_or(0));
        }
        for mirror in m.values_mut() {
            if mirror.at.as_ref().is_some_and(|(p, n)| *p == from.0 && n == from.1) {
                mirror.at = Some((to.0, to.1.to_vec()));
            }
        }
    }

    /// A free name in the mirrors' directory.
    fn spare(&self) -> Option<PathBuf> {
        let root = self.root.as_ref()?;
        Some(root.join(format!("t{}", self.seq.fetch_add(1, Ordering::Relaxed))))
    }
}

fn make_file(p: &Path) -> io::Result<()> {
    std::fs::File::options()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(p)
        .map(drop)
}

fn remove_any(p: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(p)?.is_dir() {
        true => std::fs::remove_dir_all(p),
        false => std::fs::remove_file(p),
    }
}

/// The kernel objects standing for `node`: its own mirror and its entries
/// in mirrored directories.
fn objects(m: &HashMap<u64, Mirror>, node: u64) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = m.get(&node).map(|o| o.path.clone()).into_iter().collect();
    for d in m.values().filter(|d| d.dir) {
        for (name, _) in d.names.iter().filter(|(_, &n)| n == node && node != 0) {
            v.push(d.path.join(OsStr::from_bytes(name)));
        }
    }
    v
}

/// IN_MODIFY on each: truncating by path opens nothing (no IN_OPEN).
fn modify(m: &HashMap<u64, Mirror>, node: u64) {
    for p in objects(m, node) {
        if !p.is_dir() {
            let _ = sys::truncate(&p, 0);
        }
    }
}

/// IN_ATTRIB on each: both times set, as utimes(2) does.
fn attrib(m: &HashMap<u64, Mirror>, node: u64) {
    for p in objects(m, node) {
        let _ = sys::touch(&p);
    }
}

fn create(m: &mut HashMap<u64, Mirror>, parent: u64, name: &[u8], node: u64, dir: bool) {
    let Some(d) = m.get_mut(&parent).filter(|d| d.dir) else {
        return;
    };
    let p = d.path.join(OsStr::from_bytes(name));
    let _ = if dir {
        std::fs::DirBuilder::new().mode(0o755).create(&p)
    } else {
        make_file(&p)
    };
    d.names.insert(name.to_vec(), node);
}

/// The node at (`parent`, `name`) is gone: its mirror goes, which tells
/// its watchers (IN_DELETE_SELF, IN_IGNORED).
fn gone(m: &mut HashMap<u64, Mirror>, parent: u64, name: &[u8]) {
    let dead: Vec<u64> = m
        .iter()
        .filter(|(_, o)| o.at.as_ref().is_some_and(|(p, n)| *p == parent && n == name))
        .map(|(&k, _)| k)
        .collect();
    for k in dead {
        if let Some(o) = m.remove(&k) {
            let _ = remove_any(&o.path);
        }
    }
}

/// As the kernel orders them: the node's own IN_DELETE_SELF, then its
/// directory's IN_DELETE.
fn remove(m: &mut HashMap<u64, Mirror>, parent: u64, name: &[u8]) {
    gone(m, parent, name);
    if let Some(d) = m.get_mut(&parent).filter(|d| d.dir) {
        let _ = remove_any(&d.path.join(OsStr::from_bytes(name)));
        d.names.remove(name);
    }
}

impl Watches {
    /// Removes every mirror (the daemon stops; the nodes directory goes
    /// with them).
    pub fn clear(&self) {
        self.mirrors.lock().unpoison().clear();
    }
}
