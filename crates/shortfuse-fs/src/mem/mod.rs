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
mod inode;
mod tree;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use shortfuse::{
    AccessMode, Attr, BackingFile, CopyRange, Created, DirPlusSink, DirSink, Entry, Errno, FallocateFlags, FileHandle,
    FileType, Filesystem, InitConfig, NewNode, NodeId, OpenFlags, Opened, RenameFlags, Request, Result, SetAttr,
    SetTime, Statfs, Timestamp, Whence, WriteArgs, XattrFlags,
};

use data::{FileData, BLOCK};
use dir::{Dir, DOTDOT_COOKIE, DOT_COOKIE};

use crate::xattr::{self, Xattrs};
use inode::{Content, Inode, NodeSpec, State, Table, Usage};
use tree::{check_name, is_dot, node_of, read_guard, set_time, write_guard};

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

use shortfuse::abi::{FUSE_ATOMIC_O_TRUNC, FUSE_FLOCK_LOCKS, FUSE_HANDLE_KILLPRIV_V2, FUSE_POSIX_LOCKS};

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
