//! Values that cross the `Filesystem` trait: ids, attributes, entries,
//! open results and the small argument structs.

use std::ffi::OsStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::datamap::DataMap;
pub use crate::flags::{
    AccessMode, FallocateFlags, FlockKind, FlockOp, LockType, OpenFlags, PollEvents, Whence, XattrFlags,
};

/// The kernel's node id for an inode (`fuse_in_header.nodeid`). Distinct from
/// the `st_ino` a file system reports in [`Attr::ino`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u64);

impl NodeId {
    /// The root directory of every mount (`FUSE_ROOT_ID`).
    pub const ROOT: NodeId = NodeId(1);
}

/// An open-file or open-directory handle chosen by the file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FileHandle(pub u64);

/// Who asks: the caller's credentials as the kernel reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The request's id on the connection (0 for calls the daemon makes itself).
    pub unique: u64,
    /// The caller's file-system user id.
    pub uid: u32,
    /// The caller's file-system group id.
    pub gid: u32,
    /// The caller: over /dev/fuse and io_uring the calling thread's id in
    /// the mount's pid namespace (0 when it has none there); over the rings
    /// and in process, the calling process's id.
    pub pid: u32,
}

thread_local! {
    /// The supplementary groups the request this thread serves carried
    /// (see [`Request::in_group`]): `None` when it carried none.
    static CARRIED: std::cell::RefCell<Option<Vec<u32>>> = const { std::cell::RefCell::new(None) };
}

impl Request {
    /// Whether the caller is in group `gid`: its gid, or one of its
    /// supplementary groups (the kernel's in_group_p). The preload shim
    /// sends each request with the calling thread's current supplementary
    /// groups (the FUSE_EXT_GROUPS extension), which count while the
    /// dispatcher serves it, on its thread; the kernel sends none, so they
    /// are read from `/proc/PID/status` then (as libfuse's
    /// `fuse_req_getgroups`), and only when the gid does not already
    /// answer. A caller gone meanwhile holds its gid alone.
    pub fn in_group(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        let carried = CARRIED
            .try_with(|c| c.try_borrow().ok().and_then(|c| c.as_ref().map(|g| g.contains(&gid))))
            .ok()
            .flatten();
        carried.unwrap_or_else(|| self.pid != 0 && supplementary_groups(self.pid).contains(&gid))
    }

    /// The caller's supplementary groups: those the request carried
    /// (FUSE_EXT_GROUPS, from the preload shim), else, as [`Request::in_group`]
    /// reads them, from `/proc/PID/status` (the kernel sends none).
    pub fn groups(&self) -> Vec<u32> {
        let carried = CARRIED
            .try_with(|c| c.try_borrow().ok().and_then(|c| c.clone()))
            .ok()
            .flatten();
        carried.unwrap_or_else(|| {
            if self.pid != 0 {
                supplementary_groups(self.pid)
            } else {
                Vec::new()
            }
        })
    }

    /// The set-id bits that a write or truncation by this caller, who
    /// lacks CAP_FSETID (the kernel's `FUSE_WRITE_KILL_SUIDGID` and
    /// `FATTR_KILL_SUIDGID` say so), clears in a regular file of `mode`
    /// and group `gid`, as the kernel's `setattr_should_drop_suidgid`:
    /// set-user-ID always; set-group-ID when group-executable, and without
    /// group execution too unless the caller is in the file's group.
    pub fn setid_bits_to_clear(&self, mode: u32, gid: u32) -> u32 {
        let mut kill = mode & libc::S_ISUID;
        if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !self.in_group(gid)) {
            kill |= libc::S_ISGID;
        }
        kill
    }
}

/// While alive, [`Request::in_group`] on this thread sees the groups a
/// request carried (FUSE_EXT_GROUPS ids, native-endian u32s; `None`: it
/// carried none).
pub(crate) struct ServingGroups(());

impl ServingGroups {
    pub(crate) fn set(groups: Option<&[u8]>) -> ServingGroups {
        let _ = CARRIED.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                *c = groups.map(|g| {
                    g.chunks_exact(4)
                        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                        .collect()
                });
            }
        });
        ServingGroups(())
    }
}

impl Drop for ServingGroups {
    fn drop(&mut self) {
        let _ = CARRIED.try_with(|c| c.try_borrow_mut().map(|mut c| *c = None));
    }
}

/// The `Groups:` line of `/proc/PID/status` (empty when unreadable).
fn supplementary_groups(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default()
}

/// Seconds and nanoseconds since the epoch, as the kernel carries them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Timestamp {
    /// Seconds since the epoch (negative before 1970).
    pub sec: i64,
    /// Nanoseconds within the second, below 1 000 000 000.
    pub nsec: u32,
}

impl Timestamp {
    /// The current time.
    pub fn now() -> Timestamp {
        Timestamp::from(SystemTime::now())
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Timestamp {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                if d.subsec_nanos() == 0 {
                    Timestamp {
                        sec: -(d.as_secs() as i64),
                        nsec: 0,
                    }
                } else {
                    Timestamp {
                        sec: -(d.as_secs() as i64) - 1,
                        nsec: 1_000_000_000 - d.subsec_nanos(),
                    }
                }
            }
        }
    }
}

/// The type bits of a mode (`S_IFMT`), as a Rust enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    /// A regular file (`S_IFREG`).
    Regular,
    /// A directory (`S_IFDIR`).
    Directory,
    /// A symbolic link (`S_IFLNK`).
    Symlink,
    /// A character device (`S_IFCHR`).
    CharDevice,
    /// A block device (`S_IFBLK`).
    BlockDevice,
    /// A named pipe (`S_IFIFO`).
    Fifo,
    /// A Unix socket (`S_IFSOCK`).
    Socket,
}

impl FileType {
    /// The type encoded in `mode`; unknown types read as `Regular`.
    pub fn from_mode(mode: u32) -> FileType {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            _ => FileType::Regular,
        }
    }

    /// The `S_IF*` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::Fifo => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
        }
    }

    /// The `DT_*` value used in directory entries.
    pub fn dirent_type(self) -> u32 {
        self.mode_bits() >> 12
    }
}

/// Attributes of an inode (`struct fuse_attr`). `mode` holds type and
/// permission bits.
///
/// `Attr::default()` is a regular file, mode 0644, owned by the daemon's
/// user and group, one link, every timestamp the moment the daemon made its
/// first `Attr` (about when it started: the same at every call, so that the
/// kernel does not take each `getattr` for a change and drop its cached
/// pages): fill in what differs (`Attr { size, ..Attr::default() }`), or
/// start from [`Attr::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// `st_ino` as the file system reports it.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Last access.
    pub atime: Timestamp,
    /// Last change of the content.
    pub mtime: Timestamp,
    /// Last change of the inode (attributes or content).
    pub ctime: Timestamp,
    /// Type and permission bits (`S_IFREG | 0o644`); see [`FileType::mode_bits`].
    pub mode: u32,
    /// Hard links (2 and up for a directory).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device file.
    pub rdev: u32,
    /// Preferred I/O size (`st_blksize`).
    pub blksize: u32,
}

impl Default for Attr {
    fn default() -> Attr {
        static STARTED: std::sync::OnceLock<Timestamp> = std::sync::OnceLock::new();
        let now = *STARTED.get_or_init(Timestamp::now);
        Attr {
            ino: 0,
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            uid: crate::sys::geteuid(),
            gid: crate::sys::getegid(),
            rdev: 0,
            blksize: 4096,
        }
    }
}

impl Attr {
    /// An inode of type `kind` with permission bits `perm` (`0o755`): two
    /// links for a directory, one otherwise; the rest as
    /// [`Attr::default`].
    pub fn new(kind: FileType, perm: u32) -> Attr {
        Attr {
            mode: kind.mode_bits() | (perm & 0o7777),
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            ..Attr::default()
        }
    }

    /// The same attributes with `size` bytes (and the 512-byte blocks they
    /// fill).
    pub fn with_size(self, size: u64) -> Attr {
        Attr {
            size,
            blocks: size.div_ceil(512),
            ..self
        }
    }

    /// The type bits of `mode`.
    pub fn file_type(&self) -> FileType {
        FileType::from_mode(self.mode)
    }
}

/// A looked-up name: the kernel's node id and the inode's attributes.
/// Every `Entry` returned (lookup, create, mkdir, mknod, symlink, link,
/// readdirplus) counts as one lookup that a later `forget` gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The kernel's id for the inode: the same inode must keep the same id as long as the kernel holds a lookup of it.
    pub node: NodeId,
    /// Distinguishes inodes that reuse a node id over the life of the file system (for NFS export).
    pub generation: u64,
    /// The inode's attributes.
    pub attr: Attr,
    /// How long the kernel may trust the name and attributes; `None` uses
    /// the mount's `entry_timeout`/`attr_timeout`.
    pub ttl: Option<Duration>,
}

impl Entry {
    /// An entry for `node` with `attr`, generation 0 and the mount's timeouts.
    pub fn new(node: NodeId, attr: Attr) -> Entry {
        Entry {
            node,
            generation: 0,
            attr,
            ttl: None,
        }
    }
}

/// `FOPEN_*` flags a file system may set in its open reply (not to be
/// confused with the [`OpenFlags`] the caller opened with).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FopenFlags {
    /// Bypass the page cache for this open file (`FOPEN_DIRECT_IO`).
    pub direct_io: bool,
    /// Keep cached pages from earlier opens (`FOPEN_KEEP_CACHE`).
    pub keep_cache: bool,
    /// The file is not seekable (`FOPEN_NONSEEKABLE`).
    pub nonseekable: bool,
    /// Cache directory contents (`FOPEN_CACHE_DIR`, opendir only).
    pub cache_dir: bool,
    /// Do not send FLUSH on close (`FOPEN_NOFLUSH`).
    pub noflush: bool,
    /// Allow parallel direct writes (`FOPEN_PARALLEL_DIRECT_WRITES`).
    pub parallel_direct_writes: bool,
}

/// What `open`, `opendir` and `create` return.
#[derive(Debug, Default)]
pub struct Opened {
    /// The handle the kernel passes back on each request of this open (0 for none).
    pub fh: FileHandle,
    /// How the kernel treats the open file.
    pub flags: FopenFlags,
    /// Where the file's data lives, when data I/O may skip the daemon.
    pub data_map: Option<DataMap>,
}

impl Opened {
    /// An open with handle `fh` and no flags.
    pub fn handle(fh: u64) -> Opened {
        Opened {
            fh: FileHandle(fh),
            ..Opened::default()
        }
    }
}

/// What `create` returns: the new name and its open handle.
#[derive(Debug)]
pub struct Created {
    /// The new name, counted as one lookup.
    pub entry: Entry,
    /// The open file.
    pub opened: Opened,
}

/// A time to set in `setattr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    /// The time of the request.
    Now,
    /// This time.
    At(Timestamp),
}

/// The changes asked by `setattr` (chmod, chown, truncate, utimensat).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// New permission bits (chmod).
    pub mode: Option<u32>,
    /// New owner (chown).
    pub uid: Option<u32>,
    /// New group (chown).
    pub gid: Option<u32>,
    /// New size (truncate).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
    /// New change time.
    pub ctime: Option<Timestamp>,
    /// The open file this change comes through (ftruncate, fchmod), if any.
    pub fh: Option<FileHandle>,
    /// The kernel asks the file system to clear suid/sgid (`FATTR_KILL_SUIDGID`).
    pub kill_suidgid: bool,
}

impl SetAttr {
    /// Whether nothing is asked: what the kernel sends for `chown(f, -1,
    /// -1)` and for the removal of set-id bits before a change it does
    /// itself (both clear set-user-ID, and set-group-ID when
    /// group-executable, and move ctime, on ext4).
    pub fn is_empty(&self) -> bool {
        *self
            == SetAttr {
                fh: self.fh,
                ..SetAttr::default()
            }
    }
}

/// Flags of `rename` (`renameat2(2)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RenameFlags {
    /// `RENAME_NOREPLACE`: fail with EEXIST when the target exists.
    pub noreplace: bool,
    /// `RENAME_EXCHANGE`: swap the two names atomically.
    pub exchange: bool,
    /// `RENAME_WHITEOUT`.
    pub whiteout: bool,
}

impl RenameFlags {
    /// Decodes `RENAME_*` bits.
    pub fn from_raw(flags: u32) -> RenameFlags {
        RenameFlags {
            noreplace: flags & libc::RENAME_NOREPLACE != 0,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
            whiteout: flags & libc::RENAME_WHITEOUT != 0,
        }
    }

    /// The `RENAME_*` bits.
    pub fn raw(self) -> u32 {
        (if self.noreplace { libc::RENAME_NOREPLACE } else { 0 })
            | (if self.exchange { libc::RENAME_EXCHANGE } else { 0 })
            | (if self.whiteout { libc::RENAME_WHITEOUT } else { 0 })
    }
}

/// Arguments of `mknod`, `mkdir` and `create` that describe the new inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewNode {
    /// Type and permission bits as the caller asked (before umask).
    pub mode: u32,
    /// The caller's umask; the kernel leaves applying it to the file system
    /// when `FUSE_DONT_MASK` was negotiated, otherwise it is already applied.
    pub umask: u32,
    /// Device number for `mknod`.
    pub rdev: u32,
}

/// Arguments of `write`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WriteArgs {
    /// Where the data goes in the file.
    pub offset: u64,
    /// `FUSE_WRITE_*` flags (cache write, lock owner valid, kill suid/sgid).
    pub write_flags: u32,
    /// The open flags of the file (`O_APPEND`, ...).
    pub flags: OpenFlags,
    /// The lock owner of the writer, when the kernel gives it.
    pub lock_owner: Option<u64>,
}

/// Arguments of `release`/`releasedir`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReleaseArgs {
    /// The open flags of the file.
    pub flags: OpenFlags,
    /// Set when the kernel asks to flush as part of release.
    pub flush: bool,
    /// Set when the kernel asks to drop flock locks held by `lock_owner`.
    pub flock_release: bool,
    /// The lock owner of the closer, when the kernel gives it.
    pub lock_owner: Option<u64>,
}

/// A byte-range lock (`struct fuse_file_lock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Lock {
    /// First byte locked.
    pub start: u64,
    /// Last byte included; `u64::MAX` means to end of file.
    pub end: u64,
    /// Read, write or none (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`).
    pub typ: LockType,
    /// The process holding the lock (`F_GETLK`'s answer).
    pub pid: u32,
}

/// `EINVAL` for a lock type other than `F_RDLCK`, `F_WRLCK` and `F_UNLCK`.
impl TryFrom<&shortfuse_abi::fuse_file_lock> for Lock {
    type Error = crate::Errno;

    fn try_from(lk: &shortfuse_abi::fuse_file_lock) -> crate::Result<Lock> {
        Ok(Lock {
            start: lk.start,
            end: lk.end,
            typ: LockType::from_raw(lk.typ as i32).ok_or(crate::Errno::EINVAL)?,
            pid: lk.pid,
        })
    }
}

impl From<Lock> for shortfuse_abi::fuse_lk_out {
    fn from(l: Lock) -> shortfuse_abi::fuse_lk_out {
        shortfuse_abi::fuse_lk_out {
            lk: shortfuse_abi::fuse_file_lock {
                start: l.start,
                end: l.end,
                typ: l.typ.raw() as u32,
                pid: l.pid,
            },
        }
    }
}

/// Arguments of `copy_file_range`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyRange {
    /// The source file.
    pub node_in: NodeId,
    /// The source's open handle.
    pub fh_in: FileHandle,
    /// Where reading starts in the source.
    pub off_in: u64,
    /// The destination file.
    pub node_out: NodeId,
    /// The destination's open handle.
    pub fh_out: FileHandle,
    /// Where writing starts in the destination.
    pub off_out: u64,
    /// Bytes to copy at most.
    pub len: u64,
    /// `copy_file_range(2)`'s flags (0 today).
    pub flags: u64,
}

/// `struct statvfs` as FUSE carries it (`struct fuse_kstatfs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Statfs {
    /// Size of the file system in `frsize` units.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Preferred block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
    /// Fragment size (the unit of `blocks`).
    pub frsize: u32,
}

/// One batch-forget item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forget {
    /// The node forgotten.
    pub node: NodeId,
    /// Lookups given back.
    pub nlookup: u64,
}

/// Sink for `readdir`: the dispatcher encodes entries straight into the
/// reply buffer.
pub trait DirSink {
    /// Adds one entry; `next_offset` is the offset a later `readdir` resumes
    /// from. Returns `false` when the reply is full: the entry was not added
    /// and the file system should stop.
    fn add(&mut self, ino: u64, next_offset: u64, typ: FileType, name: &OsStr) -> bool;
}

/// Sink for `readdirplus`: like [`DirSink`] but each entry carries a full
/// [`Entry`] (which counts as a lookup, except for "." and "..").
pub trait DirPlusSink {
    /// Adds one entry. Returns `false` when the reply is full: the entry was
    /// not added, its lookup does not count, and the file system should stop.
    fn add(&mut self, entry: &Entry, next_offset: u64, name: &OsStr) -> bool;
}
