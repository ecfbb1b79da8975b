//! `mem`: a complete in-memory POSIX file system.
//!
//! Answers (results, errno values, timestamps, `st_blocks`, holes) follow
//! ext4 with 4 KiB blocks, so that a POSIX comparison suite run against ext4
//! sees the same thing here.
//!
//! # Inodes and node ids
//!
//! The kernel's node id is the inode number (`st_ino`). Ids are never reused
//! within one [`MemFs`], so the generation number only has to tell two
//! instances apart: it is taken from the clock when the file system is made.
//! An inode is freed once it has no name (`nlink == 0`), the kernel holds no
//! lookup on it (every [`Entry`] handed out counts one, `forget` gives them
//! back) and no handle is open on it.
//!
//! # Locking
//!
//! Two levels, always taken in this order:
//!
//! 1. `table`: an `RwLock` over the map from node id to inode. Held for
//!    writing by every change of the name space (create, link, unlink,
//!    rename, freeing an inode); held for reading while resolving a name to
//!    an inode and taking a lookup on it (lookup, readdirplus).
//! 2. `Inode::state`: one `Mutex` per inode over its attributes and contents
//!    (file blocks, directory entries, link target, xattrs).
//!
//! A thread holds at most one inode lock at a time, except under the table
//! write lock, where nobody else can hold more than one: so inode locks never
//! form a cycle. Data calls (read, write, setattr, ...) take the table read
//! lock only long enough to clone the inode's `Arc`.
//!
//! Freeing follows passthrough_hp: `forget` and `release` drop their count
//! under the inode lock alone, and only when the inode looks free take the
//! table write lock and check again, so a racing lookup cannot bring back a
//! freed inode.

mod data;
mod dir;

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use shortfuse::{
    AccessMode, Attr, BackingFile, CopyRange, Created, DirPlusSink, DirSink, Entry, Errno, FallocateFlags, FileHandle,
    FileType, Filesystem, InitConfig, NewNode, NodeId, OpenFlags, Opened, RenameFlags, Request, Result, SetAttr,
    SetTime, Statfs, Timestamp, Whence, WriteArgs, XattrFlags,
};

use data::{FileData, BLOCK};
use dir::{Dir, DOTDOT_COOKIE, DOT_COOKIE};

use crate::xattr::{self, Xattrs};

/// Longest name in a directory (ext4's `EXT4_NAME_LEN`).
const NAME_MAX: usize = 255;
/// Longest symbolic link target ext4 accepts with 4 KiB blocks.
const SYMLINK_MAX: usize = 4095;
/// ext4's largest file with 4 KiB blocks (2^32 - 1 blocks).
pub const MAX_FILE_SIZE: u64 = (1u64 << 32) * BLOCK - BLOCK;
/// ext4's hard-link limit (`EXT4_LINK_MAX`).
const LINK_MAX: u32 = 65000;
/// ext4 keeps symlink targets shorter than this in the inode (no block).
const FAST_SYMLINK_MAX: usize = 60;
/// How many directory entries readdirplus copies out per dir-lock hold.
const READDIR_BATCH: usize = 64;

use shortfuse::abi::{
    FUSE_ATOMIC_O_TRUNC, FUSE_FLOCK_LOCKS, FUSE_HANDLE_KILLPRIV_V2, FUSE_POSIX_LOCKS, FUSE_WRITE_KILL_SUIDGID,
};

/// Bytes and inodes in use, shared with every inode so that dropping one
/// gives its blocks back.
#[derive(Default)]
struct Usage {
    blocks: AtomicU64,
}

impl Usage {
    fn add(&self, delta: i64) {
        if delta >= 0 {
            self.blocks.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.blocks.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }
}

enum Content {
    File(FileData),
    Dir(Dir),
    Symlink(Vec<u8>),
    /// Fifos, sockets and device nodes: attributes only.
    Special,
}

struct State {
    /// Type and permission bits.
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
    /// Bytes of a regular file (directories and symlinks compute theirs).
    size: u64,
    atime: Timestamp,
    mtime: Timestamp,
    ctime: Timestamp,
    lookups: u64,
    opens: u64,
    xattrs: Xattrs,
    content: Content,
}

impl State {
    fn dir(&self) -> Result<&Dir> {
        match &self.content {
            Content::Dir(d) => Ok(d),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn dir_mut(&mut self) -> Result<&mut Dir> {
        match &mut self.content {
            Content::Dir(d) => Ok(d),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn is_dir(&self) -> bool {
        matches!(self.content, Content::Dir(_))
    }

    fn is_free(&self) -> bool {
        self.nlink == 0 && self.lookups == 0 && self.opens == 0
    }

    fn touch_modified(&mut self, now: Timestamp) {
        self.mtime = now;
        self.ctime = now;
    }

    /// `relatime`, the default mount option: update atime only when it is
    /// not newer than mtime or ctime, or a day old.
    fn touch_accessed(&mut self) {
        let now = Timestamp::now();
        if self.atime <= self.mtime || self.atime <= self.ctime || now.sec - self.atime.sec >= 24 * 3600 {
            self.atime = now;
        }
    }

    /// Clears set-user-id, and set-group-id when group execution is on (a
    /// set-group-id bit without it marks mandatory locking), as the kernel
    /// does on chown.
    fn kill_suidgid(&mut self) {
        self.mode &= !libc::S_ISUID;
        if self.mode & (libc::S_ISGID | libc::S_IXGRP) == (libc::S_ISGID | libc::S_IXGRP) {
            self.mode &= !libc::S_ISGID;
        }
    }

    /// What a write by an unprivileged user, or `FATTR_KILL_SUIDGID`,
    /// clears ([`Request::setid_bits_to_clear`]).
    fn kill_suidgid_for(&mut self, req: &Request) {
        self.mode &= !req.setid_bits_to_clear(self.mode, self.gid);
    }

    /// Would `req` get `mask` (R_OK/W_OK/X_OK bits) on this inode?
    fn permits(&self, req: &Request, mask: u32) -> bool {
        if req.uid == 0 {
            // Root needs one execute bit anywhere to execute a non-directory.
            return mask & libc::X_OK as u32 == 0 || self.is_dir() || self.mode & 0o111 != 0;
        }
        let bits = if req.uid == self.uid {
            self.mode >> 6
        } else if req.in_group(self.gid) {
            self.mode >> 3
        } else {
            self.mode
        };
        bits & mask & 7 == mask & 7
    }

    fn check(&self, req: &Request, mask: u32) -> Result<()> {
        if self.permits(req, mask) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// The sticky-bit rule for removing or replacing `child` from this
    /// directory.
    fn sticky_allows(&self, req: &Request, child_uid: u32) -> bool {
        self.mode & libc::S_ISVTX == 0 || req.uid == 0 || req.uid == self.uid || req.uid == child_uid
    }
}

/// What `make_node` creates.
struct NodeSpec {
    mode: u32,
    rdev: u32,
    content: Content,
    /// `create`: the new inode starts with one open handle.
    opened: bool,
}

struct Inode {
    ino: u64,
    typ: FileType,
    usage: Arc<Usage>,
    state: Mutex<State>,
}

impl Inode {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every
        // change is a few assignments), so keep serving.
        self.state.lock().unpoison()
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        let st = self.state.get_mut().unpoison();
        if let Content::File(f) = &st.content {
            self.usage.add(-(f.block_count() as i64));
        }
    }
}

type Table = HashMap<u64, Arc<Inode>>;

/// The in-memory file system.
pub struct MemFs {
    table: RwLock<Table>,
    next_ino: AtomicU64,
    next_fh: AtomicU64,
    generation: u64,
    usage: Arc<Usage>,
    /// Blocks reported as the file system's size (the machine's memory).
    capacity_blocks: u64,
}

impl Default for MemFs {
    fn default() -> MemFs {
        MemFs::new()
    }
}

/// Total memory from /proc/meminfo, or 8 GiB when it cannot be read.
fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(8 << 30)
}

fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if b.is_empty() || b.contains(&b'/') || b.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

fn is_dot(name: &OsStr) -> bool {
    name == "." || name == ".."
}

fn set_time(t: SetTime, now: Timestamp) -> Timestamp {
    match t {
        SetTime::Now => now,
        SetTime::At(t) => t,
    }
}

fn read_guard(l: &RwLock<Table>) -> RwLockReadGuard<'_, Table> {
    l.read().unpoison()
}

fn write_guard(l: &RwLock<Table>) -> RwLockWriteGuard<'_, Table> {
    l.write().unpoison()
}

fn node_of(table: &Table, ino: u64) -> Result<Arc<Inode>> {
    table.get(&ino).cloned().ok_or(Errno::ESTALE)
}

impl MemFs {
    /// An empty file system: a root directory owned by root, mode 0755.
    pub fn new() -> MemFs {
        MemFs::with_root_owner(0, 0)
    }

    /// An empty file system whose root directory (mode 0755) belongs to
    /// `uid`/`gid`: the user who mounts it, as a tmpfs mounted by a user
    /// would, so that an unprivileged mount can be written by its owner.
    pub fn with_root_owner(uid: u32, gid: u32) -> MemFs {
        let now = Timestamp::now();
        let usage = Arc::new(Usage::default());
        let root = Inode {
            ino: NodeId::ROOT.0,
            typ: FileType::Directory,
            usage: usage.clone(),
            state: Mutex::new(State {
                mode: libc::S_IFDIR | 0o755,
                nlink: 2,
                uid,
                gid,
                rdev: 0,
                size: 0,
                atime: now,
                mtime: now,
                ctime: now,
                // The kernel never forgets the root.
                lookups: 1,
                opens: 0,
                xattrs: Xattrs::default(),
                content: Content::Dir(Dir::new(NodeId::ROOT.0)),
            }),
        };
        let mut table = HashMap::new();
        table.insert(NodeId::ROOT.0, Arc::new(root));
        MemFs {
            table: RwLock::new(table),
            next_ino: AtomicU64::new(NodeId::ROOT.0 + 1),
            next_fh: AtomicU64::new(1),
            generation: (now.sec as u64) << 20 | u64::from(now.nsec >> 10),
            usage,
            capacity_blocks: memory_bytes() / BLOCK,
        }
    }

    /// Number of live inodes, the root included.
    pub fn inode_count(&self) -> usize {
        read_guard(&self.table).len()
    }

    fn get(&self, node: NodeId) -> Result<Arc<Inode>> {
        node_of(&read_guard(&self.table), node.0)
    }

    fn attr(ino: u64, st: &State) -> Attr {
        let (size, blocks) = match &st.content {
            Content::File(f) => (st.size, f.block_count() * (BLOCK / 512)),
            // A removed directory is emptied to size 0 as ext4 does.
            Content::Dir(d) if st.nlink == 0 => (0, 0),
            Content::Dir(d) => (d.size, d.size / 512),
            Content::Symlink(t) if t.len() < FAST_SYMLINK_MAX => (t.len() as u64, 0),
            Content::Symlink(t) => (t.len() as u64, BLOCK / 512),
            Content::Special => (0, 0),
        };
        Attr {
            ino,
            size,
            blocks,
            atime: st.atime,
            mtime: st.mtime,
            ctime: st.ctime,
            mode: st.mode,
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            rdev: st.rdev,
            blksize: BLOCK as u32,
        }
    }

    fn entry(&self, ino: u64, st: &State) -> Entry {
        Entry {
            node: NodeId(ino),
            generation: self.generation,
            attr: MemFs::attr(ino, st),
            ttl: None,
        }
    }

    /// Takes a lookup on `ino` and returns its entry.
    fn take_lookup(&self, inode: &Inode) -> Entry {
        let mut st = inode.lock();
        st.lookups += 1;
        self.entry(inode.ino, &st)
    }

    /// Removes `ino` from the table if it is free. Takes the table write
    /// lock unless the caller holds it (`table`).
    fn free_if_unused(&self, inode: &Arc<Inode>, table: Option<&mut Table>) {
        if inode.ino == NodeId::ROOT.0 || !inode.lock().is_free() {
            return;
        }
        let mut own;
        let table = match table {
            Some(t) => t,
            None => {
                own = write_guard(&self.table);
                &mut own
            }
        };
        // Checked again under the table lock: a lookup may have come in.
        if inode.lock().is_free() {
            table.remove(&inode.ino);
        }
    }

    /// Creates a new inode named `name` in `parent`; the body shared by
    /// mknod, mkdir, symlink and create.
    fn make_node(&self, req: &Request, parent: NodeId, name: &OsStr, spec: NodeSpec) -> Result<Entry> {
        let NodeSpec {
            mode,
            rdev,
            content,
            opened,
        } = spec;
        check_name(name)?;
        let mut table = write_guard(&self.table);
        let dir_inode = node_of(&table, parent.0)?;
        let mut dir = dir_inode.lock();
        dir.dir()?;
        if dir.nlink == 0 {
            // Created in a removed directory (the VFS answers the same).
            return Err(Errno::ENOENT);
        }
        if is_dot(name) || dir.dir()?.get(name).is_some() {
            return Err(Errno::EEXIST);
        }
        dir.check(req, (libc::W_OK | libc::X_OK) as u32)?;
        let typ = FileType::from_mode(mode);
        let is_dir = typ == FileType::Directory;
        let mut mode = mode;
        let gid = if dir.mode & libc::S_ISGID != 0 {
            if is_dir {
                mode |= libc::S_ISGID;
            }
            dir.gid
        } else {
            req.gid
        };
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        let now = Timestamp::now();
        let content = match content {
            Content::Dir(_) => Content::Dir(Dir::new(parent.0)),
            c => c,
        };
        let st = State {
            mode,
            nlink: if is_dir { 2 } else { 1 },
            uid: req.uid,
            gid,
            rdev,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            lookups: 1,
            opens: u64::from(opened),
            xattrs: Xattrs::default(),
            content,
        };
        let entry = self.entry(ino, &st);
        let inode = Arc::new(Inode {
            ino,
            typ,
            usage: self.usage.clone(),
            state: Mutex::new(st),
        });
        dir.dir_mut()?.insert(name, ino, typ);
        if is_dir {
            dir.nlink += 1;
        }
        dir.touch_modified(now);
        drop(dir);
        table.insert(ino, inode);
        Ok(entry)
    }

    /// Applies a mode given by the caller of mknod/mkdir/create: the umask
    /// (idempotent when the kernel already applied it) and the type.
    fn new_mode(new: &NewNode, typ_bits: u32) -> u32 {
        typ_bits | (new.mode & 0o7777 & !new.umask)
    }

    fn truncate_locked(&self, st: &mut State, size: u64, now: Timestamp) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        match &mut st.content {
            Content::File(f) => {
                if size < st.size {
                    self.usage.add(f.truncate(size));
                } else {
                    f.grow(size)?;
                }
                st.size = size;
                // ext4 moves mtime and ctime at every truncation, to the
                // same size too.
                st.touch_modified(now);
                Ok(())
            }
            Content::Dir(_) => Err(Errno::EISDIR),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Walks up from `start` to the root; true when `ancestor` is met.
    fn is_within(table: &Table, start: u64, ancestor: u64) -> bool {
        let mut cur = start;
        loop {
            if cur == ancestor {
                return true;
            }
            if cur == NodeId::ROOT.0 {
                return false;
            }
            let Some(inode) = table.get(&cur) else { return false };
            let next = match inode.lock().dir() {
                Ok(d) => d.parent,
                Err(_) => return false,
            };
            if next == cur {
                return false;
            }
            cur = next;
        }
    }

    fn dir_entry_of(table: &Table, parent: u64, name: &OsStr) -> Result<(Arc<Inode>, Arc<Inode>)> {
        let dir = node_of(table, parent)?;
        let child = {
            let st = dir.lock();
            st.dir()?.get(name).map(|e| e.ino).ok_or(Errno::ENOENT)?
        };
        let child = node_of(table, child)?;
        Ok((dir, child))
    }

    fn remove_name(&self, req: &Request, parent: NodeId, name: &OsStr, want_dir: bool) -> Result<()> {
        check_name(name)?;
        if want_dir && name == "." {
            return Err(Errno::EINVAL);
        }
        if want_dir && name == ".." {
            return Err(Errno::ENOTEMPTY);
        }
        let mut table = write_guard(&self.table);
        let (dir, child) = MemFs::dir_entry_of(&table, parent.0, name)?;
        // The VFS order: permission, then sticky bit, then type.
        let child_uid = child.lock().uid;
        {
            let d = dir.lock();
            d.check(req, (libc::W_OK | libc::X_OK) as u32)?;
            if !d.sticky_allows(req, child_uid) {
                return Err(Errno::EPERM);
            }
        }
        {
            let st = child.lock();
            match (want_dir, st.is_dir()) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !st.dir()?.is_empty() => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        let now = Timestamp::now();
        {
            let mut d = dir.lock();
            d.dir_mut()?.remove(name);
            if want_dir {
                d.nlink -= 1;
            }
            d.touch_modified(now);
        }
        {
            let mut st = child.lock();
            st.nlink = if want_dir { 0 } else { st.nlink.saturating_sub(1) };
            st.ctime = now;
        }
        self.free_if_unused(&child, Some(&mut table));
        Ok(())
    }

    fn file_op<T>(&self, node: NodeId, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let inode = self.get(node)?;
        let mut st = inode.lock();
        f(&mut st)
    }

    /// Drops one open handle and frees the inode if that was the last use.
    fn drop_open(&self, node: NodeId) {
        let Ok(inode) = self.get(node) else { return };
        {
            let mut st = inode.lock();
            st.opens = st.opens.saturating_sub(1);
        }
        self.free_if_unused(&inode, None);
    }

    fn new_handle(&self) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    fn write_locked(&self, req: &Request, st: &mut State, data: &[u8], args: &WriteArgs) -> Result<usize> {
        let Content::File(f) = &mut st.content else {
            return Err(Errno::EBADF);
        };
        let offset = if args.flags.contains(OpenFlags::APPEND) {
            st.size
        } else {
            args.offset
        };
        if data.is_empty() {
            return Ok(0);
        }
        if offset >= MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let len = (data.len() as u64).min(MAX_FILE_SIZE - offset) as usize;
        self.usage.add(f.write(offset, &data[..len])?);
        st.size = st.size.max(offset + len as u64);
        st.touch_modified(Timestamp::now());
        if args.write_flags & FUSE_WRITE_KILL_SUIDGID != 0 {
            st.kill_suidgid_for(req);
        }
        Ok(len)
    }
}

impl Filesystem for MemFs {
    fn init(&self, config: &mut InitConfig) -> Result<()> {
        // The kernel keeps POSIX and flock locks itself (local semantics
        // are all a single-machine file system needs).
        config.want &= !(FUSE_POSIX_LOCKS | FUSE_FLOCK_LOCKS);
        // `open` truncates on O_TRUNC itself: saves a SETATTR round trip.
        config.want |= config.kernel_flags & FUSE_ATOMIC_O_TRUNC;
        // We clear set-id bits ourselves (`kill_suidgid` on setattr and
        // write). Without this the kernel does it for chown by sending a
        // mode that also loses the sticky bit, and asks for
        // security.capability before every write.
        config.want |= config.kernel_flags & FUSE_HANDLE_KILLPRIV_V2;
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let table = read_guard(&self.table);
        let dir = node_of(&table, parent.0)?;
        let ino = {
            let st = dir.lock();
            let d = st.dir()?;
            st.check(req, libc::X_OK as u32)?;
            if name == "." {
                parent.0
            } else if name == ".." {
                d.parent
            } else {
                d.get(name).map(|e| e.ino).ok_or(Errno::ENOENT)?
            }
        };
        let child = node_of(&table, ino)?;
        Ok(self.take_lookup(&child))
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        let Ok(inode) = self.get(node) else { return };
        {
            let mut st = inode.lock();
            st.lookups = st.lookups.saturating_sub(nlookup);
        }
        self.free_if_unused(&inode, None);
    }

    fn getattr(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>) -> Result<Attr> {
        let inode = self.get(node)?;
        let st = inode.lock();
        Ok(MemFs::attr(inode.ino, &st))
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        let inode = self.get(node)?;
        let mut st = inode.lock();
        let root = req.uid == 0;
        let owner = root || req.uid == st.uid;
        // Check everything before changing anything.
        if set.mode.is_some() && !owner {
            return Err(Errno::EPERM);
        }
        if let Some(uid) = set.uid {
            if !root && uid != st.uid {
                return Err(Errno::EPERM);
            }
        }
        if let Some(gid) = set.gid {
            if !root && (req.uid != st.uid || (gid != st.gid && !req.in_group(gid))) {
                return Err(Errno::EPERM);
            }
        }
        if set.size.is_some() {
            match st.content {
                // ftruncate(2) was checked when the file was opened.
                Content::File(_) if set.fh.is_none() => st.check(req, libc::W_OK as u32)?,
                Content::File(_) => {}
                Content::Dir(_) => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
        }
        // utimensat(2): setting both times to now (or NULL times) needs
        // write permission; anything else (a time given, or one of them
        // left alone) needs ownership, as the kernel's ATTR_TIMES_SET.
        if (set.atime.is_some() || set.mtime.is_some()) && !owner {
            let touch = matches!((set.atime, set.mtime), (Some(SetTime::Now), Some(SetTime::Now)));
            if !touch {
                return Err(Errno::EPERM);
            }
            if !st.permits(req, libc::W_OK as u32) {
                return Err(Errno::EACCES);
            }
        }
        let now = Timestamp::now();
        if let Some(size) = set.size {
            self.truncate_locked(&mut st, size, now)?;
        }
        if let Some(mode) = set.mode {
            let mut mode = mode & 0o7777;
            if !root && !req.in_group(st.gid) {
                mode &= !libc::S_ISGID;
            }
            st.mode = (st.mode & libc::S_IFMT) | mode;
        }
        if set.uid.is_some() || set.gid.is_some() {
            st.uid = set.uid.unwrap_or(st.uid);
            st.gid = set.gid.unwrap_or(st.gid);
            // chown(2) clears set-id bits of non-directories even for root.
            if !st.is_dir() {
                st.kill_suidgid();
            }
        }
        if set.kill_suidgid && !st.is_dir() {
            st.kill_suidgid_for(req);
        }
        if set.is_empty() && !st.is_dir() {
            // chown(-1, -1), or the kernel removing set-id bits.
            st.kill_suidgid();
        }
        if let Some(t) = set.atime {
            st.atime = set_time(t, now);
        }
        if let Some(t) = set.mtime {
            st.mtime = set_time(t, now);
        }
        // Any change moves ctime (a truncation did it in truncate_locked).
        let meta = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some()
            || set.kill_suidgid
            || set.is_empty();
        if meta {
            st.ctime = now;
        }
        if let Some(t) = set.ctime {
            st.ctime = t;
        }
        Ok(MemFs::attr(inode.ino, &st))
    }

    fn readlink(&self, _req: &Request, node: NodeId) -> Result<Vec<u8>> {
        self.file_op(node, |st| match &st.content {
            Content::Symlink(t) => {
                let t = t.clone();
                st.touch_accessed();
                Ok(t)
            }
            _ => Err(Errno::EINVAL),
        })
    }

    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        let t = target.as_bytes();
        if t.is_empty() {
            return Err(Errno::ENOENT);
        }
        if t.len() > SYMLINK_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let spec = NodeSpec {
            mode: libc::S_IFLNK | 0o777,
            rdev: 0,
            content: Content::Symlink(t.to_vec()),
            opened: false,
        };
        self.make_node(req, parent, name, spec)
    }

    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        let (bits, content, rdev) = match new.mode & libc::S_IFMT {
            0 | libc::S_IFREG => (libc::S_IFREG, Content::File(FileData::default()), 0),
            libc::S_IFCHR | libc::S_IFBLK => (new.mode & libc::S_IFMT, Content::Special, new.rdev),
            libc::S_IFIFO | libc::S_IFSOCK => (new.mode & libc::S_IFMT, Content::Special, 0),
            libc::S_IFDIR => return Err(Errno::EPERM),
            _ => return Err(Errno::EINVAL),
        };
        let spec = NodeSpec {
            mode: MemFs::new_mode(new, bits),
            rdev,
            content,
            opened: false,
        };
        self.make_node(req, parent, name, spec)
    }

    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        let mode = MemFs::new_mode(new, libc::S_IFDIR);
        let spec = NodeSpec {
            mode,
            rdev: 0,
            content: Content::Dir(Dir::new(parent.0)),
            opened: false,
        };
        self.make_node(req, parent, name, spec)
    }

    fn unlink(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.remove_name(req, parent, name, false)
    }

    fn rmdir(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.remove_name(req, parent, name, true)
    }

    fn rename(
        &self,
        req: &Request,
        parent: NodeId,
        name: &OsStr,
        new_parent: NodeId,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.whiteout || (flags.exchange && flags.noreplace) {
            return Err(Errno::EINVAL);
        }
        check_name(name)?;
        check_name(new_name)?;
        if is_dot(name) || is_dot(new_name) {
            return Err(Errno::EBUSY);
        }
        let mut table = write_guard(&self.table);
        let (src_dir, src) = MemFs::dir_entry_of(&table, parent.0, name)?;
        let dst_dir = node_of(&table, new_parent.0)?;
        let dst = {
            let st = dst_dir.lock();
            let d = st.dir()?;
            if st.nlink == 0 {
                return Err(Errno::ENOENT);
            }
            d.get(new_name).map(|e| e.ino)
        };
        let dst = dst.map(|ino| node_of(&table, ino)).transpose()?;
        if flags.exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        if flags.noreplace && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        let src_is_dir = src.typ == FileType::Directory;
        let dst_is_dir = dst.as_ref().is_some_and(|d| d.typ == FileType::Directory);
        let cross = parent != new_parent;
        if dst.as_ref().is_some_and(|d| Arc::ptr_eq(d, &src)) {
            // Two names of one inode: rename(2) does nothing.
            return Ok(());
        }
        // No directory may move below itself.
        if src_is_dir && cross && MemFs::is_within(&table, new_parent.0, src.ino) {
            return Err(Errno::EINVAL);
        }
        if flags.exchange
            && dst_is_dir
            && cross
            && MemFs::is_within(&table, parent.0, dst.as_ref().map_or(0, |d| d.ino))
        {
            return Err(Errno::EINVAL);
        }
        // The VFS order: permission and sticky bit, then types.
        if req.uid != 0 {
            let src_uid = src.lock().uid;
            let dst_uid = dst.as_ref().map(|d| d.lock().uid);
            {
                let sd = src_dir.lock();
                sd.check(req, (libc::W_OK | libc::X_OK) as u32)?;
                if !sd.sticky_allows(req, src_uid) {
                    return Err(Errno::EPERM);
                }
            }
            {
                let dd = dst_dir.lock();
                dd.check(req, (libc::W_OK | libc::X_OK) as u32)?;
                if let Some(uid) = dst_uid {
                    if !dd.sticky_allows(req, uid) {
                        return Err(Errno::EPERM);
                    }
                }
            }
            // Moving a directory rewrites its "..": needs write access to it.
            if cross && src_is_dir {
                src.lock().check(req, libc::W_OK as u32)?;
            }
            if cross && flags.exchange && dst_is_dir {
                if let Some(d) = &dst {
                    d.lock().check(req, libc::W_OK as u32)?;
                }
            }
        }

        if let Some(dst) = &dst {
            if !flags.exchange {
                if src_is_dir && !dst_is_dir {
                    return Err(Errno::ENOTDIR);
                }
                if !src_is_dir && dst_is_dir {
                    return Err(Errno::EISDIR);
                }
            }
            if !flags.exchange && dst_is_dir && !dst.lock().dir()?.is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
        }
        let now = Timestamp::now();
        if flags.exchange {
            let dst = dst.as_ref().ok_or(Errno::ENOENT)?;
            src_dir.lock().dir_mut()?.replace(name, dst.ino, dst.typ);
            dst_dir.lock().dir_mut()?.replace(new_name, src.ino, src.typ);
            if cross {
                if src_is_dir {
                    src_dir.lock().nlink -= 1;
                    dst_dir.lock().nlink += 1;
                    src.lock().dir_mut()?.parent = new_parent.0;
                }
                if dst_is_dir {
                    dst_dir.lock().nlink -= 1;
                    src_dir.lock().nlink += 1;
                    dst.lock().dir_mut()?.parent = parent.0;
                }
            }
            dst.lock().ctime = now;
        } else {
            src_dir.lock().dir_mut()?.remove(name);
            if let Some(dst) = &dst {
                dst_dir.lock().dir_mut()?.remove(new_name);
                let mut st = dst.lock();
                st.nlink = if dst_is_dir { 0 } else { st.nlink.saturating_sub(1) };
                st.ctime = now;
                drop(st);
                if dst_is_dir {
                    dst_dir.lock().nlink -= 1;
                }
            }
            dst_dir.lock().dir_mut()?.insert(new_name, src.ino, src.typ);
            if src_is_dir && cross {
                src_dir.lock().nlink -= 1;
                dst_dir.lock().nlink += 1;
                src.lock().dir_mut()?.parent = new_parent.0;
            }
        }
        src.lock().ctime = now;
        src_dir.lock().touch_modified(now);
        dst_dir.lock().touch_modified(now);
        if let Some(dst) = &dst {
            if !flags.exchange {
                self.free_if_unused(dst, Some(&mut table));
            }
        }
        Ok(())
    }

    fn link(&self, req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry> {
        check_name(new_name)?;
        let table = write_guard(&self.table);
        let inode = node_of(&table, node.0)?;
        let dir = node_of(&table, new_parent.0)?;
        {
            let st = inode.lock();
            if st.is_dir() {
                return Err(Errno::EPERM);
            }
            if st.nlink == 0 {
                return Err(Errno::ENOENT);
            }
            if st.nlink >= LINK_MAX {
                return Err(Errno::EMLINK);
            }
        }
        let now = Timestamp::now();
        {
            let mut d = dir.lock();
            if d.dir()?.get(new_name).is_some() || is_dot(new_name) {
                return Err(Errno::EEXIST);
            }
            if d.nlink == 0 {
                return Err(Errno::ENOENT);
            }
            d.check(req, (libc::W_OK | libc::X_OK) as u32)?;
            d.dir_mut()?.insert(new_name, inode.ino, inode.typ);
            d.touch_modified(now);
        }
        let mut st = inode.lock();
        st.nlink += 1;
        st.ctime = now;
        st.lookups += 1;
        Ok(self.entry(inode.ino, &st))
    }

    fn open(&self, req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened> {
        let inode = self.get(node)?;
        let mut st = inode.lock();
        let mut mask = match flags.access_mode() {
            OpenFlags::RDONLY => AccessMode::READ,
            OpenFlags::WRONLY => AccessMode::WRITE,
            _ => AccessMode::READ | AccessMode::WRITE,
        };
        if flags.contains(OpenFlags::TRUNC) {
            mask |= AccessMode::WRITE;
        }
        st.check(req, mask.bits() as u32)?;
        if flags.contains(OpenFlags::TRUNC) {
            if let Content::File(f) = &mut st.content {
                // O_TRUNC updates the times even on an empty file.
                self.usage.add(f.truncate(0));
                st.size = 0;
                st.touch_modified(Timestamp::now());
            }
        }
        st.opens += 1;
        Ok(Opened::handle(self.new_handle().0))
    }

    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, _flags: OpenFlags) -> Result<Created> {
        let mode = MemFs::new_mode(new, libc::S_IFREG);
        let spec = NodeSpec {
            mode,
            rdev: 0,
            content: Content::File(FileData::default()),
            opened: true,
        };
        let entry = self.make_node(req, parent, name, spec)?;
        Ok(Created {
            entry,
            opened: Opened::handle(self.new_handle().0),
        })
    }

    fn read(&self, _req: &Request, node: NodeId, _fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.file_op(node, |st| {
            let n = match &st.content {
                Content::File(f) => f.read(st.size, offset, buf),
                Content::Dir(_) => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            };
            st.touch_accessed();
            Ok(n)
        })
    }

    fn write(&self, req: &Request, node: NodeId, _fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        self.file_op(node, |st| self.write_locked(req, st, data, args))
    }

    fn flush(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _lock_owner: u64) -> Result<()> {
        Ok(())
    }

    fn release(&self, _req: &Request, node: NodeId, _fh: FileHandle, _args: &shortfuse::ReleaseArgs) -> Result<()> {
        self.drop_open(node);
        Ok(())
    }

    fn fsync(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        Ok(())
    }

    fn opendir(&self, req: &Request, node: NodeId, _flags: OpenFlags) -> Result<Opened> {
        let inode = self.get(node)?;
        let mut st = inode.lock();
        st.dir()?;
        st.check(req, libc::R_OK as u32)?;
        st.opens += 1;
        Ok(Opened::handle(self.new_handle().0))
    }

    fn readdir(
        &self,
        _req: &Request,
        node: NodeId,
        _fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> Result<()> {
        let inode = self.get(node)?;
        let mut st = inode.lock();
        if st.nlink == 0 {
            return Ok(());
        }
        let d = st.dir()?;
        let mut full = false;
        if offset < DOT_COOKIE {
            full = !sink.add(inode.ino, DOT_COOKIE, FileType::Directory, OsStr::new("."));
        }
        if !full && offset < DOTDOT_COOKIE {
            full = !sink.add(d.parent, DOTDOT_COOKIE, FileType::Directory, OsStr::new(".."));
        }
        if !full {
            d.for_each_after(offset, |cookie, e| sink.add(e.ino, cookie, e.typ, &e.name));
        }
        st.touch_accessed();
        Ok(())
    }

    fn readdirplus(
        &self,
        _req: &Request,
        node: NodeId,
        _fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> Result<()> {
        let table = read_guard(&self.table);
        let inode = node_of(&table, node.0)?;
        let (parent, entry) = {
            let mut st = inode.lock();
            if st.nlink == 0 {
                return Ok(());
            }
            let parent = st.dir()?.parent;
            st.touch_accessed();
            (parent, self.entry(inode.ino, &st))
        };
        if offset < DOT_COOKIE && !sink.add(&entry, DOT_COOKIE, OsStr::new(".")) {
            return Ok(());
        }
        if offset < DOTDOT_COOKIE {
            let parent = node_of(&table, parent)?;
            let entry = self.entry(parent.ino, &parent.lock());
            if !sink.add(&entry, DOTDOT_COOKIE, OsStr::new("..")) {
                return Ok(());
            }
        }
        let mut after = offset;
        loop {
            // Copied out so that no child is locked while the directory is.
            let batch = inode.lock().dir()?.batch(after, READDIR_BATCH);
            if batch.is_empty() {
                return Ok(());
            }
            for (cookie, e) in batch {
                let child = node_of(&table, e.ino)?;
                let mut st = child.lock();
                if !sink.add(&self.entry(child.ino, &st), cookie, &e.name) {
                    return Ok(());
                }
                st.lookups += 1;
                after = cookie;
            }
        }
    }

    fn releasedir(&self, _req: &Request, node: NodeId, _fh: FileHandle, _flags: OpenFlags) -> Result<()> {
        self.drop_open(node);
        Ok(())
    }

    fn fsyncdir(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        Ok(())
    }

    fn statfs(&self, _req: &Request, _node: NodeId) -> Result<Statfs> {
        let used = self.usage.blocks.load(Ordering::Relaxed);
        let blocks = self.capacity_blocks.max(used);
        let files = blocks.max(1 << 20);
        let inodes = self.inode_count() as u64;
        Ok(Statfs {
            blocks,
            bfree: blocks - used,
            bavail: blocks - used,
            files,
            ffree: files.saturating_sub(inodes),
            bsize: BLOCK as u32,
            namelen: NAME_MAX as u32,
            frsize: BLOCK as u32,
        })
    }

    fn setxattr(&self, req: &Request, node: NodeId, name: &OsStr, value: &[u8], flags: XattrFlags) -> Result<()> {
        xattr::check_name(name)?;
        self.file_op(node, |st| {
            if xattr::is_user(name) {
                st.check(req, libc::W_OK as u32)?;
            }
            st.xattrs.set(name, value, flags)?;
            st.ctime = Timestamp::now();
            Ok(())
        })
    }

    fn getxattr(&self, req: &Request, node: NodeId, name: &OsStr) -> Result<Vec<u8>> {
        xattr::check_name(name)?;
        self.file_op(node, |st| {
            if xattr::is_user(name) {
                st.check(req, libc::R_OK as u32)?;
            }
            st.xattrs.get(name)
        })
    }

    fn listxattr(&self, _req: &Request, node: NodeId) -> Result<Vec<u8>> {
        self.file_op(node, |st| Ok(st.xattrs.list()))
    }

    fn removexattr(&self, req: &Request, node: NodeId, name: &OsStr) -> Result<()> {
        xattr::check_name(name)?;
        self.file_op(node, |st| {
            if xattr::is_user(name) {
                st.check(req, libc::W_OK as u32)?;
            }
            st.xattrs.remove(name)?;
            st.ctime = Timestamp::now();
            Ok(())
        })
    }

    fn access(&self, req: &Request, node: NodeId, mask: AccessMode) -> Result<()> {
        let inode = self.get(node)?;
        let st = inode.lock();
        if mask == AccessMode::EXISTS {
            return Ok(());
        }
        st.check(req, (mask & AccessMode::all()).bits() as u32)
    }

    fn fallocate(
        &self,
        _req: &Request,
        node: NodeId,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: FallocateFlags,
    ) -> Result<()> {
        let crate::falloc::Falloc {
            punch,
            zero,
            keep_size,
            end,
        } = crate::falloc::Falloc::parse(offset, length, mode)?;
        self.file_op(node, |st| {
            let size = st.size;
            let Content::File(f) = &mut st.content else {
                return Err(if st.is_dir() { Errno::EISDIR } else { Errno::ENODEV });
            };
            if end > MAX_FILE_SIZE && !punch {
                return Err(Errno::EFBIG);
            }
            let delta = if punch {
                // ext4 punches up to the end of the block holding EOF.
                let stop = end.min(size.div_ceil(BLOCK) * BLOCK);
                if offset >= stop {
                    0
                } else {
                    f.punch(offset, stop)
                }
            } else if zero {
                f.zero_range(offset, end)?
            } else {
                f.allocate(offset, end)?
            };
            self.usage.add(delta);
            if !keep_size && end > size {
                f.grow(end)?;
                st.size = end;
            }
            st.touch_modified(Timestamp::now());
            Ok(())
        })
    }

    fn lseek(&self, _req: &Request, node: NodeId, _fh: FileHandle, offset: u64, whence: Whence) -> Result<u64> {
        self.file_op(node, |st| {
            let Content::File(f) = &st.content else {
                return Err(Errno::EINVAL);
            };
            match whence {
                Whence::Data => f.seek_data(st.size, offset).ok_or(Errno::ENXIO),
                Whence::Hole => f.seek_hole(st.size, offset).ok_or(Errno::ENXIO),
                _ => Err(Errno::EINVAL),
            }
        })
    }

    /// The file's bytes move into a memfd (see `data`), which the daemon
    /// lends to the programs that map the file.
    fn map_file(&self, node: NodeId, _fh: FileHandle) -> Result<BackingFile> {
        self.file_op(node, |st| {
            let size = st.size;
            let Content::File(f) = &mut st.content else {
                return Err(Errno::ENODEV);
            };
            let (file, delta) = f.kernel_file(size)?;
            self.usage.add(delta);
            Ok(file)
        })
    }

    fn copy_file_range(&self, req: &Request, range: &CopyRange) -> Result<usize> {
        if range.flags != 0 {
            return Err(Errno::EINVAL);
        }
        let src = self.get(range.node_in)?;
        let dst = self.get(range.node_out)?;
        if src.typ != FileType::Regular || dst.typ != FileType::Regular {
            return Err(Errno::EINVAL);
        }
        // Copied through a bounded buffer, one inode locked at a time.
        const STEP: u64 = 1 << 20;
        let mut buf = Vec::new();
        let mut done = 0u64;
        while done < range.len {
            let want = (range.len - done).min(STEP) as usize;
            buf.resize(want, 0);
            let n = {
                let st = src.lock();
                match &st.content {
                    Content::File(f) => f.read(st.size, range.off_in + done, &mut buf),
                    _ => return Err(Errno::EINVAL),
                }
            };
            if n == 0 {
                break;
            }
            let args = WriteArgs {
                offset: range.off_out + done,
                ..WriteArgs::default()
            };
            let written = self.write_locked(req, &mut dst.lock(), &buf[..n], &args)?;
            done += written as u64;
            if written < n {
                break;
            }
        }
        Ok(done as usize)
    }
}
