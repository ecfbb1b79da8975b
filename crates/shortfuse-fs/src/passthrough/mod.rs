//! `passthrough`: the Stackfs of To FUSE or Not to FUSE (FAST '17), done in the manner of libfuse's
//! `passthrough_hp`. Every request is served by the same operation on a
//! source directory, through descriptors, never through paths.
//!
//! # Inodes
//!
//! The kernel's node ids are ours: a counter, never a pointer and never the
//! source's `st_ino` (which [`Attr::ino`] reports unchanged). Each node is
//! one source inode, identified by `(st_dev, st_ino)` and held by an
//! `O_PATH | O_NOFOLLOW` descriptor, so renames in the source do not
//! confuse it and hard links share one node. See [`inodes`] for the lookup
//! count and the lock order:
//!
//! > directory stream (per open directory) → inode table → (nothing)
//!
//! The handle table's lock is a leaf: it is never held while another lock
//! is taken.
//!
//! # Staying inside the source
//!
//! The daemon usually runs as root, so it must never let a request reach
//! outside the source or follow a symbolic link on anyone's behalf:
//!
//! - Names are single components: empty names, names with `/`, `.` and
//!   `..` are refused (`EINVAL`) before any system call (the kernel never
//!   sends them, a malformed or hostile request can).
//! - Lookups use `openat2(parent, name, O_PATH | O_NOFOLLOW,
//!   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`: a
//!   symlink is opened as itself, and even a name that slipped through the
//!   checks above cannot climb out of its parent.
//! - A parent must be a directory: a symlink's node used as a parent gives
//!   `ENOTDIR` (the `O_PATH` descriptor of a symlink is not a directory, so
//!   the kernel refuses too).
//! - Every `*at` call uses `AT_SYMLINK_NOFOLLOW`/`AT_EMPTY_PATH` or acts on
//!   the final component without following it (`mkdirat`, `unlinkat`,
//!   `renameat2`, `symlinkat`, `mknodat`); `create` adds `O_NOFOLLOW`.
//! - `open` reopens the node's `O_PATH` descriptor through
//!   `/proc/self/fd/N`, which leads to that very inode; symlink nodes are
//!   refused with `ELOOP` before that (never reopened through `/proc`).
//!
//! Mount points inside the source are crossed (no `RESOLVE_NO_XDEV`): they
//! are part of the tree the administrator put under the source, the `(dev,
//! ino)` key keeps their inodes apart, and hiding them would surprise more
//! than it protects. Note that the mount shows one `st_dev`, so two files on
//! different source devices may show the same `st_ino`; `-o
//! one_file_system` adds `RESOLVE_NO_XDEV` and makes such mount points
//! unreachable (`EXDEV`) instead.
//!
//! # Symbolic links: `-o symlinks=raw|beneath`
//!
//! - `raw` (default, POSIX-faithful): READLINK returns the stored target.
//!   The kernel follows it with the caller's own rights, wherever it leads,
//!   as on any file system; the daemon never follows it.
//! - `beneath`: READLINK rewrites targets so that they resolve inside the
//!   mount, as if its root were `/` (like `chroot`): absolute targets become
//!   relative paths of the right depth (`/etc/passwd` from a link in `a/b/`
//!   reads `../../etc/passwd`), relative targets that climb above the root
//!   are clamped at the root. The depth comes from the link's current path
//!   in the source (`/proc/self/fd/N`); a link renamed between the lookup
//!   and the readlink, or a symlink with hard links in directories of
//!   different depths, can get a target of the wrong depth, which still
//!   cannot leave the mount. See [`symlinks::beneath`].
//!
//! # Credentials and permissions
//!
//! `create`, `mkdir`, `mknod`, `symlink`, `link` and `access` run with the
//! caller's fsuid/fsgid (see [`creds`]), so the creating user owns new
//! files. Other operations run with the daemon's rights: a root daemon should
//! be mounted with `default_permissions` (as `passthrough_hp` does) so that
//! the kernel checks permissions against the attributes we report.
//! `shortfuse mount` asks for it except where the daemon's rights are every
//! caller's (an unprivileged user's own daemon, without `allow_other`):
//! there the source's checks of the daemon's rights are the callers'.
//! Supplementary groups are not known (FUSE does not send them).
//!
//! Modes of new files are masked with the caller's umask here; each worker
//! thread gets its own zero umask (`unshare(CLONE_FS)`) so the daemon's umask
//! does not mask them again.
//!
//! # Data
//!
//! `read`/`write` are `pread`/`pwrite` on the descriptor opened for the
//! handle (with the caller's `O_APPEND`, `O_DIRECT`, `O_SYNC`, ...). `open`
//! also returns a 1-to-1 [`DataMap`] of that descriptor, for transports that
//! can skip the daemon (kernel passthrough, the preload shim). POSIX and
//! `flock` locks are left to the kernel: `init` does not ask for
//! `FUSE_POSIX_LOCKS` or `FUSE_FLOCK_LOCKS`, which are then local to this
//! mount (not shared with processes using the source directly).
//!
//! # Directories
//!
//! One `getdents64` stream per open directory; READDIR offsets are the
//! source file system's `d_off` cookies, so paging is `seekdir`-exact even
//! while entries are created or removed, and a directory of any size costs
//! one 32 KiB buffer. READDIRPLUS looks every entry up.

#![deny(unsafe_code)]

mod creds;
mod flushing;
mod handles;
pub mod inodes;
mod pathfd;
pub mod symlinks;
pub(crate) mod sys;

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use shortfuse::abi::{
    FUSE_FLOCK_LOCKS, FUSE_HANDLE_KILLPRIV_V2, FUSE_POSIX_LOCKS, FUSE_WRITEBACK_CACHE, FUSE_WRITE_KILL_SUIDGID,
};
use shortfuse::{
    AccessMode, Attr, CopyRange, Created, DataMap, DirPlusSink, DirSink, Entry, Errno, FallocateFlags, FileHandle,
    FileType, Filesystem, FopenFlags, Forget, InitConfig, NewNode, NodeId, OpenFlags, Opened, ReleaseArgs, RenameFlags,
    Request, Result, SetAttr, SetTime, Statfs, Whence, WriteArgs, XattrFlags,
};

use creds::CredGuard;
use handles::{HandleTable, OpenFile};
use inodes::{Inode, InodeTable};
use pathfd::Budget;

use crate::registry::IN_PROCESS_FD_FLOOR;

/// The kernel's `O_LARGEFILE`, which it sets on every open of a 64-bit
/// process and sends in OPEN's flags (`libc::O_LARGEFILE` is 0 here, as in
/// glibc's headers for 64-bit programs).
const KERNEL_O_LARGEFILE: i32 = 0o100000;

/// How READLINK presents symbolic links (`-o symlinks=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SymlinkMode {
    /// The stored target, unchanged.
    #[default]
    Raw,
    /// Targets rewritten to resolve inside the mount.
    Beneath,
}

/// The passthrough file system's own `-o` options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassthroughOptions {
    pub symlinks: SymlinkMode,
    /// Do not cross mount points inside the source (`RESOLVE_NO_XDEV`).
    pub one_file_system: bool,
    /// At most this many inode descriptors open at once (`-o path_fds=N`);
    /// default half of `RLIMIT_NOFILE`. See [`pathfd`].
    pub path_fds: Option<usize>,
}

impl PassthroughOptions {
    /// Parses `-o` items left over by the mount-option parser.
    pub fn parse(opts: &[(String, Option<String>)]) -> io::Result<PassthroughOptions> {
        let mut out = PassthroughOptions::default();
        for (key, value) in opts {
            match (key.as_str(), value.as_deref()) {
                ("symlinks", Some("raw")) => out.symlinks = SymlinkMode::Raw,
                ("symlinks", Some("beneath")) => out.symlinks = SymlinkMode::Beneath,
                ("symlinks", other) => {
                    return Err(invalid(format!(
                        "passthrough: option symlinks={} is not valid: use symlinks=raw or symlinks=beneath",
                        other.unwrap_or("")
                    )))
                }
                ("one_file_system", None) => out.one_file_system = true,
                ("path_fds", Some(v)) => match v.parse::<usize>() {
                    Ok(n) if n > 0 => out.path_fds = Some(n),
                    _ => {
                        return Err(invalid(format!(
                            "passthrough: option path_fds={v} is not valid: a positive number of descriptors"
                        )))
                    }
                },
                ("one_file_system", Some(v)) => {
                    return Err(invalid(format!(
                        "passthrough: option one_file_system takes no value (got one_file_system={v})"
                    )))
                }
                (other, _) => {
                    return Err(invalid(format!(
                    "passthrough: unknown option '{other}' (known: symlinks=raw|beneath, one_file_system, path_fds=N)"
                )))
                }
            }
        }
        Ok(out)
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Where the file system runs, for what it does with the process's
/// descriptors as it starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A daemon: `RLIMIT_NOFILE` is raised as far as allowed (see
    /// [`sys::raise_nofile_limit`]).
    Daemon,
    /// The program's own process: the limit is left as it is, and the
    /// descriptors kept go at [`IN_PROCESS_FD_FLOOR`] or above.
    InProcess,
}

/// The passthrough file system over one source directory.
pub struct PassthroughFs {
    inodes: InodeTable,
    handles: HandleTable,
    opts: PassthroughOptions,
    /// `openat2` resolve flags for lookups.
    resolve: u64,
    /// The source root as `/proc` shows it, for `symlinks=beneath` (empty,
    /// and not asked for, otherwise).
    root_path: Vec<u8>,
    /// Switch to the caller's fsuid/fsgid (only a root daemon can).
    switch_creds: bool,
    /// Writeback cache negotiated: the kernel may read a file opened
    /// write-only and handles `O_APPEND` itself.
    writeback: AtomicBool,
    /// Under write-back, FLUSH has nothing to do on any file of the mount
    /// and is answered ENOSYS, so that the kernel stops sending it (see
    /// `flushing`).
    no_flush: AtomicBool,
    /// The source root again, for the namespace map.
    map_root: Arc<OwnedFd>,
    /// Plain read-only opens share one descriptor per inode (a daemon
    /// only, see `open`).
    share_readers: bool,
}

impl PassthroughFs {
    /// Serves `source` with the default options.
    pub fn new(source: &Path) -> io::Result<PassthroughFs> {
        PassthroughFs::with_options(source, &[])
    }

    /// Serves `source` with file-system-specific `-o` options
    /// (`symlinks=raw|beneath`, `one_file_system`). Fails with a message
    /// naming the source if it is missing or not a directory, or naming the
    /// option that is not known.
    pub fn with_options(source: &Path, opts: &[(String, Option<String>)]) -> io::Result<PassthroughFs> {
        PassthroughFs::open(source, opts, Role::Daemon)
    }

    /// [`PassthroughFs::with_options`] for the program's own process
    /// (`shortfuse run`): the descriptor limit is the program's, left as it
    /// is (a daemon raises it), and read only when `path_fds` is not given;
    /// the descriptors of the source it keeps go at [`IN_PROCESS_FD_FLOOR`]
    /// or above, so that the shim need not hold the low numbers meanwhile.
    /// Every process the program starts builds its mounts again, so what a
    /// short process does not need is not asked of the kernel.
    pub fn in_process(source: &Path, opts: &[(String, Option<String>)]) -> io::Result<PassthroughFs> {
        sys::serve_in_process();
        PassthroughFs::open(source, opts, Role::InProcess)
    }

    fn open(source: &Path, opts: &[(String, Option<String>)], role: Role) -> io::Result<PassthroughFs> {
        let opts = PassthroughOptions::parse(opts)?;
        let context = |e: io::Error| io::Error::new(e.kind(), format!("passthrough source {}: {e}", source.display()));
        let csource = CString::new(source.as_os_str().as_bytes()).map_err(|_| {
            invalid(format!(
                "passthrough source {}: path contains a NUL byte",
                source.display()
            ))
        })?;
        // The source path itself is the administrator's choice: following
        // symlinks in it is fine; everything below is served by descriptor.
        let root =
            sys::openat(libc::AT_FDCWD, &csource, libc::O_PATH | libc::O_DIRECTORY).map_err(|e| context(e.into()))?;
        let st = sys::fstat(root.as_fd()).map_err(|e| context(e.into()))?;
        let (root, floor) = match role {
            Role::Daemon => (root, 0),
            // Above the floor where the limit lets it (the low one is
            // closed); where it does not, the program could not open that
            // many anyway.
            Role::InProcess => (
                sys::dup_at_least(root.as_fd(), IN_PROCESS_FD_FLOOR).unwrap_or(root),
                IN_PROCESS_FD_FLOOR,
            ),
        };
        let map_root = Arc::new(sys::dup_at_least(root.as_fd(), floor).map_err(|e| context(e.into()))?);
        let root_path = if opts.symlinks == SymlinkMode::Beneath {
            sys::readlink_path(sys::ProcPath::new(root.as_fd()).as_cstr()).map_err(|e| context(e.into()))?
        } else {
            Vec::new()
        };
        // Not fatal: the limit only bounds how many inodes keep a descriptor.
        let raised = (role == Role::Daemon).then(|| sys::raise_nofile_limit().unwrap_or(1024));
        let limit = opts.path_fds.unwrap_or_else(|| {
            let nofile = raised.unwrap_or_else(|| sys::nofile_limit().unwrap_or(1024));
            (nofile / 2) as usize
        });
        let budget = Budget::new(map_root.clone(), st.st_dev, limit, floor);
        let mut resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        if opts.one_file_system {
            resolve |= libc::RESOLVE_NO_XDEV;
        }
        Ok(PassthroughFs {
            inodes: InodeTable::new(root, &st, Arc::new(budget)),
            handles: HandleTable::default(),
            opts,
            resolve,
            root_path,
            switch_creds: sys::geteuid() == 0,
            writeback: AtomicBool::new(false),
            no_flush: AtomicBool::new(false),
            map_root,
            share_readers: role == Role::Daemon,
        })
    }

    /// The options in effect.
    pub fn options(&self) -> &PassthroughOptions {
        &self.opts
    }

    /// Inodes the kernel holds references to, the root included.
    pub fn inode_count(&self) -> usize {
        self.inodes.count()
    }

    /// Inode descriptors open now, and the budget they are kept within
    /// (None: file handles do not work on the source, every inode keeps one).
    pub fn path_fds(&self) -> (usize, Option<usize>) {
        let budget = self.inodes.budget();
        (budget.open(), budget.limit())
    }

    /// Whether the inode behind `node` holds its descriptor now.
    pub fn holds_path_fd(&self, node: NodeId) -> Result<bool> {
        Ok(self.inodes.get(node)?.has_fd())
    }

    /// Open file and directory handles.
    pub fn handle_count(&self) -> usize {
        self.handles.count()
    }

    fn dir(&self, node: NodeId) -> Result<Arc<Inode>> {
        let inode = self.inodes.get(node)?;
        if inode.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        Ok(inode)
    }

    /// Looks `name` up below the directory descriptor `dir` and counts one
    /// lookup.
    fn lookup_at(&self, dir: std::os::fd::BorrowedFd<'_>, name: &std::ffi::CStr) -> Result<Entry> {
        let fd = sys::openat2(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0, self.resolve)?;
        let st = sys::fstat(fd.as_fd())?;
        let inode = self.inodes.intern(fd, &st);
        Ok(Entry::new(inode.node, attr_of(&st)))
    }

    /// Publishes the inode behind an open descriptor (create): an `O_PATH`
    /// descriptor of the same inode, taken without a second name lookup.
    /// The magic link must be followed here (no `O_NOFOLLOW`): with it,
    /// `O_PATH` would name the `/proc` link itself, not the file.
    fn intern_open(&self, fd: &OwnedFd) -> Result<Entry> {
        let st = sys::fstat(fd.as_fd())?;
        let path_fd = sys::reopen(fd.as_fd(), libc::O_PATH)?;
        // Belt and braces: the descriptor must name the inode we created.
        if inodes::InodeKey::of(&sys::fstat(path_fd.as_fd())?) != inodes::InodeKey::of(&st) {
            return Err(Errno::EIO);
        }
        let inode = self.inodes.intern(path_fd, &st);
        Ok(Entry::new(inode.node, attr_of(&st)))
    }

    fn file(&self, node: NodeId, fh: FileHandle) -> Result<Arc<OpenFile>> {
        self.handles.get(node, fh)
    }

    /// Flags for the descriptor behind an open handle.
    fn open_flags(&self, flags: i32) -> i32 {
        let mut flags = flags & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY);
        if self.writeback.load(Ordering::Relaxed) {
            // With writeback caching the kernel reads pages to fill partial
            // writes (even on write-only files) and keeps the file size
            // itself, so an O_APPEND descriptor would write at the wrong place.
            if flags & libc::O_ACCMODE == libc::O_WRONLY {
                flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            flags &= !libc::O_APPEND;
        }
        flags
    }

    /// Clears set-user-id and set-group-id as the kernel does for
    /// unprivileged writers ([`Request::setid_bits_to_clear`]); a root
    /// daemon's own writes and truncates would not.
    fn kill_suidgid(&self, req: &Request, fd: std::os::fd::BorrowedFd<'_>, st: &libc::stat, open: bool) -> Result<()> {
        let mode = st.st_mode & 0o7777;
        let kill = req.setid_bits_to_clear(mode, st.st_gid);
        // A thread acting as the caller (the ring server's workers, or the
        // caller's own thread in process) has no CAP_FSETID: the source
        // clears the bits itself at the write or truncation, and the
        // caller, often not the owner, could not chmod.
        if kill == 0 || sys::setfsuid(u32::MAX) != 0 {
            return Ok(());
        }
        if open {
            sys::fchmod(fd, mode & !kill)
        } else {
            sys::fchmod_path(fd, mode & !kill)
        }
    }

    fn readlink_beneath(&self, inode: &Inode, target: Vec<u8>) -> Result<Vec<u8>> {
        let path = sys::readlink_path(sys::ProcPath::new(inode.fd()?.as_fd()).as_cstr())?;
        // A link no longer below the root (moved out of the source) has no
        // depth to clamp at: refuse rather than guess.
        let dir = symlinks::link_dir(&self.root_path, &path).ok_or(Errno::ENOENT)?;
        Ok(symlinks::beneath(&dir, &target))
    }
}

/// A single path component, as every name from a request must be.
fn component(name: &OsStr) -> Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    if bytes.len() > 255 {
        return Err(Errno::ENAMETOOLONG);
    }
    CString::new(bytes).map_err(|_| Errno::EINVAL)
}

fn attr_of(st: &libc::stat) -> Attr {
    Attr::from_stat(st)
}

/// The `dev_t` of a FUSE `rdev` (new_encode_dev format).
fn dev_of(rdev: u32) -> libc::dev_t {
    let major = (rdev & 0xfff00) >> 8;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    libc::makedev(major, minor)
}

fn timespec(t: Option<SetTime>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(SetTime::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(SetTime::At(t)) => libc::timespec {
            tv_sec: t.sec,
            tv_nsec: t.nsec as i64,
        },
    }
}

/// Alignment that `O_DIRECT` asks of memory on every Linux file system
/// (the logical block size is at most a page).
const DIRECT_ALIGN: usize = 4096;

fn aligned(p: *const u8) -> bool {
    (p as usize) & (DIRECT_ALIGN - 1) == 0
}

thread_local! {
    /// Per-worker bounce buffer for `O_DIRECT` data that the transport
    /// placed at an unaligned address (after the request headers).
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` bytes of page-aligned memory, reused per thread.
fn with_aligned<T>(len: usize, f: impl FnOnce(&mut [u8]) -> Result<T>) -> Result<T> {
    BOUNCE.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < len + DIRECT_ALIGN {
            b.resize(len + DIRECT_ALIGN, 0);
        }
        let start = b.as_ptr().align_offset(DIRECT_ALIGN);
        f(&mut b[start..start + len])
    })
}

/// `pread` until `buf` is full or the file ends, so a short read always
/// means end of file (the kernel relies on that for cached files). An
/// `O_DIRECT` read is tried once: the rest would start at an unaligned
/// offset (`EINVAL`), and direct reads may be short anyway.
fn read_full(file: &OpenFile, buf: &mut [u8], offset: u64) -> Result<usize> {
    if file.direct {
        return sys::pread(file.fd(), buf, offset);
    }
    let mut done = 0;
    while done < buf.len() {
        let n = sys::pread(file.fd(), &mut buf[done..], offset + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

/// One `struct linux_dirent64` record.
struct RawDirent<'a> {
    ino: u64,
    off: u64,
    reclen: usize,
    typ: u8,
    name: &'a [u8],
}

fn parse_dirent(buf: &[u8]) -> Result<RawDirent<'_>> {
    // d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name[] NUL-terminated.
    const HEAD: usize = 19;
    if buf.len() < HEAD {
        return Err(Errno::EIO);
    }
    let ino = u64::from_ne_bytes(buf[0..8].try_into().map_err(|_| Errno::EIO)?);
    let off = u64::from_ne_bytes(buf[8..16].try_into().map_err(|_| Errno::EIO)?);
    let reclen = u16::from_ne_bytes(buf[16..18].try_into().map_err(|_| Errno::EIO)?) as usize;
    if reclen < HEAD || reclen > buf.len() {
        return Err(Errno::EIO);
    }
    let raw = &buf[HEAD..reclen];
    let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    Ok(RawDirent {
        ino,
        off,
        reclen,
        typ: buf[18],
        name: &raw[..len],
    })
}

fn dirent_type(d_type: u8) -> FileType {
    match d_type {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        libc::DT_FIFO => FileType::Fifo,
        libc::DT_SOCK => FileType::Socket,
        _ => FileType::Regular,
    }
}

/// What the per-entry callback of [`PassthroughFs::walk_dir`] did.
enum Step {
    /// Added to the reply: move past it.
    Added,
    /// Not shown (vanished since getdents): move past it.
    Skipped,
    /// The reply is full: stop before it.
    Full,
}

impl PassthroughFs {
    /// Feeds the entries of an open directory from `offset` to `each` until
    /// it reports a full reply or the directory ends. Errors after the
    /// first entry end the reply early instead (the kernel asks again from
    /// the last offset and then gets the error).
    fn walk_dir(
        &self,
        dir: &OpenFile,
        offset: u64,
        mut each: impl FnMut(&RawDirent<'_>) -> Result<Step>,
    ) -> Result<()> {
        let mut st = dir.dir_stream()?;
        if offset != st.cookie {
            sys::lseek(dir.fd(), offset as i64, libc::SEEK_SET)?;
            st.start = 0;
            st.end = 0;
            st.cookie = offset;
        }
        let mut added = false;
        let fail = |e: Errno, added: bool| if added { Ok(()) } else { Err(e) };
        loop {
            if st.start >= st.end {
                let ds = &mut *st;
                match sys::getdents64(dir.fd(), &mut ds.buf) {
                    Ok(0) => return Ok(()),
                    Ok(n) => {
                        ds.start = 0;
                        ds.end = n;
                    }
                    Err(e) => return fail(e, added),
                }
            }
            let (reclen, off, step) = {
                let ent = match parse_dirent(&st.buf[st.start..st.end]) {
                    Ok(ent) => ent,
                    Err(e) => return fail(e, added),
                };
                let step = match each(&ent) {
                    Ok(step) => step,
                    Err(e) => return fail(e, added),
                };
                (ent.reclen, ent.off, step)
            };
            match step {
                Step::Full => return Ok(()),
                Step::Added => added = true,
                Step::Skipped => {}
            }
            st.start += reclen;
            st.cookie = off;
        }
    }
}

impl Filesystem for PassthroughFs {
    fn init(&self, config: &mut InitConfig) -> Result<()> {
        // Locks stay in the kernel: asking for them would make us implement
        // getlk/setlk/flock, and the source file system's own locks would
        // then be taken by the daemon, not by the caller's process.
        config.want &= !(FUSE_POSIX_LOCKS | FUSE_FLOCK_LOCKS);
        // We clear set-id bits ourselves (`kill_suidgid`): the daemon runs
        // with CAP_FSETID, so the source would not do it on write; and the
        // kernel's own chown path sends a mode that loses the sticky bit.
        config.want |= config.kernel_flags & FUSE_HANDLE_KILLPRIV_V2;
        let writeback = config.want & FUSE_WRITEBACK_CACHE != 0;
        self.writeback.store(writeback, Ordering::Relaxed);
        self.no_flush.store(
            writeback && flushing::close_reports_nothing_beneath(self.map_root.as_fd(), self.opts.one_file_system),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// The tree is the source's, name for name and attribute for
    /// attribute, and nothing is kept here that the source does not show
    /// at once. Not with `symlinks=beneath`, whose READLINK rewrites
    /// targets (the kernel would follow the stored ones).
    fn namespace_map(&self) -> Option<shortfuse::NamespaceMap> {
        (self.opts.symlinks == SymlinkMode::Raw).then(|| shortfuse::NamespaceMap {
            root: self.map_root.clone(),
            no_xdev: self.opts.one_file_system,
        })
    }

    fn lookup(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        let name = component(name)?;
        let parent = self.dir(parent)?;
        let dir = parent.fd()?;
        // A name whose inode is known already (the kernel looks a file up
        // again after dropping its dentry, or before an unlink) costs one
        // stat, not an open, a stat and a close of the copy. Not with
        // one_file_system, where only the open refuses a mount point.
        if !self.opts.one_file_system {
            match sys::stat_at(dir.as_fd(), &name) {
                Ok(st) => {
                    if let Some(inode) = self.inodes.lookup_known(&st) {
                        return Ok(Entry::new(inode.node, attr_of(&st)));
                    }
                }
                Err(Errno::ENOENT) => return Err(Errno::ENOENT),
                Err(_) => {}
            }
        }
        self.lookup_at(dir.as_fd(), &name)
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        self.inodes.forget(node, nlookup);
    }

    fn batch_forget(&self, forgets: &[Forget]) {
        self.inodes.forget_many(forgets.iter().map(|f| (f.node, f.nlookup)));
    }

    fn getattr(&self, _req: &Request, node: NodeId, fh: Option<FileHandle>) -> Result<Attr> {
        let st = match fh {
            Some(fh) if fh.0 != 0 => sys::fstat(self.file(node, fh)?.fd())?,
            _ => sys::fstat(self.inodes.get(node)?.fd()?.as_fd())?,
        };
        Ok(attr_of(&st))
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        let inode = self.inodes.get(node)?;
        let file = match set.fh {
            Some(fh) if fh.0 != 0 => Some(self.file(node, fh)?),
            _ => None,
        };
        if let Some(mode) = set.mode {
            match &file {
                Some(f) => sys::fchmod(f.fd(), mode & 0o7777)?,
                None => sys::fchmod_path(inode.fd()?.as_fd(), mode & 0o7777)?,
            }
        }
        // chown(-1, -1) on the source does what it does on ext4.
        if set.uid.is_some() || set.gid.is_some() || set.is_empty() {
            sys::fchown_path(
                inode.fd()?.as_fd(),
                set.uid.unwrap_or(u32::MAX),
                set.gid.unwrap_or(u32::MAX),
            )?;
        }
        if let Some(size) = set.size {
            match &file {
                Some(f) => sys::ftruncate(f.fd(), size)?,
                None => {
                    if inode.kind != FileType::Regular {
                        return Err(if inode.kind == FileType::Directory {
                            Errno::EISDIR
                        } else {
                            Errno::EINVAL
                        });
                    }
                    let fd = sys::reopen(inode.fd()?.as_fd(), libc::O_WRONLY)?;
                    sys::ftruncate(fd.as_fd(), size)?;
                }
            }
        }
        if set.kill_suidgid && set.mode.is_none() {
            let st = sys::fstat(inode.fd()?.as_fd())?;
            self.kill_suidgid(req, inode.fd()?.as_fd(), &st, false)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = [timespec(set.atime), timespec(set.mtime)];
            match &file {
                Some(f) => sys::futimens(f.fd(), &times)?,
                None => sys::utimens_path(inode.fd()?.as_fd(), &times)?,
            }
        }
        // ctime cannot be set on Linux; it moved with the changes above.
        Ok(attr_of(&sys::fstat(inode.fd()?.as_fd())?))
    }

    fn readlink(&self, _req: &Request, node: NodeId) -> Result<Vec<u8>> {
        let inode = self.inodes.get(node)?;
        if inode.kind != FileType::Symlink {
            return Err(Errno::EINVAL);
        }
        let target = sys::readlink_fd(inode.fd()?.as_fd())?;
        match self.opts.symlinks {
            SymlinkMode::Raw => Ok(target),
            SymlinkMode::Beneath => self.readlink_beneath(&inode, target),
        }
    }

    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        let name = component(name)?;
        let target = CString::new(target.as_bytes()).map_err(|_| Errno::EINVAL)?;
        let parent = self.dir(parent)?;
        {
            let _creds = CredGuard::switch(req, self.switch_creds)?;
            sys::symlinkat(&target, parent.fd()?.as_fd(), &name)?;
        }
        self.lookup_at(parent.fd()?.as_fd(), &name)
    }

    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        let name = component(name)?;
        let parent = self.dir(parent)?;
        creds::ensure_zero_umask()?;
        let mode = (new.mode & libc::S_IFMT) | (new.mode & 0o7777 & !new.umask);
        {
            let _creds = CredGuard::switch(req, self.switch_creds)?;
            sys::mknodat(parent.fd()?.as_fd(), &name, mode, dev_of(new.rdev))?;
        }
        self.lookup_at(parent.fd()?.as_fd(), &name)
    }

    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        let name = component(name)?;
        let parent = self.dir(parent)?;
        creds::ensure_zero_umask()?;
        {
            let _creds = CredGuard::switch(req, self.switch_creds)?;
            sys::mkdirat(parent.fd()?.as_fd(), &name, new.mode & 0o7777 & !new.umask)?;
        }
        self.lookup_at(parent.fd()?.as_fd(), &name)
    }

    fn unlink(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        let name = component(name)?;
        sys::unlinkat(self.dir(parent)?.fd()?.as_fd(), &name, 0)
    }

    fn rmdir(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        let name = component(name)?;
        sys::unlinkat(self.dir(parent)?.fd()?.as_fd(), &name, libc::AT_REMOVEDIR)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: NodeId,
        name: &OsStr,
        new_parent: NodeId,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        let name = component(name)?;
        let new_name = component(new_name)?;
        let parent = self.dir(parent)?;
        let new_parent = self.dir(new_parent)?;
        sys::renameat2(
            parent.fd()?.as_fd(),
            &name,
            new_parent.fd()?.as_fd(),
            &new_name,
            flags.raw(),
        )
    }

    fn link(&self, req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry> {
        let new_name = component(new_name)?;
        let inode = self.inodes.get(node)?;
        let new_parent = self.dir(new_parent)?;
        {
            let _creds = CredGuard::switch(req, self.switch_creds)?;
            sys::link_proc(inode.fd()?.as_fd(), new_parent.fd()?.as_fd(), &new_name)?;
        }
        // The same inode: count a lookup on it through a copy of its descriptor.
        let fd = inode.fd()?.as_fd().try_clone_to_owned().map_err(Errno::from)?;
        let st = sys::fstat(fd.as_fd())?;
        let inode = self.inodes.intern(fd, &st);
        Ok(Entry::new(inode.node, attr_of(&st)))
    }

    fn open(&self, _req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened> {
        let inode = self.inodes.get(node)?;
        match inode.kind {
            // The /proc magic link would hand the symlink inode to open().
            FileType::Symlink => return Err(Errno::ELOOP),
            FileType::Directory if flags.access_mode() != OpenFlags::RDONLY => return Err(Errno::EISDIR),
            _ => {}
        }
        let mut flags = self.open_flags(flags.bits());
        if inode.kind == FileType::Fifo {
            // Never wait in a daemon thread for the FIFO's other end (the
            // kernel opens FIFOs itself, the preload shim too; only a
            // client of our own making sends OPEN for one).
            flags |= libc::O_NONBLOCK;
        }
        // A plain read-only open shares the inode's reader descriptor in a
        // daemon (see `Inode::reader`); in a program's own process the shim
        // may hand the descriptor's description to the program, whose
        // read(2) moves its offset, so each open keeps its own there.
        let fd =
            if self.share_readers && inode.kind == FileType::Regular && flags & !KERNEL_O_LARGEFILE == libc::O_RDONLY {
                // The shared descriptor was opened with another caller's
                // credentials, or before a chmod: this open's permission
                // check is made here, with the credentials the request is
                // served with (the caller's where the daemon takes them on).
                sys::faccess(inode.fd()?.as_fd(), libc::R_OK)?;
                inode.reader(|path| sys::reopen(path, flags))?
            } else {
                Arc::new(sys::reopen(inode.fd()?.as_fd(), flags)?)
            };
        // FLUSH is a close of a duplicate, which reports a writer's
        // deferred errors (NFS sources); a reader has none, nor has a
        // writer on a local source, and without FUSE_POSIX_LOCKS there are
        // no locks of ours to drop, so their close saves the round trip
        // (the kernel still flushes its own cache first under
        // writeback_cache, where it ignores the flag).
        let noflush = flags & libc::O_ACCMODE == libc::O_RDONLY || sys::close_reports_nothing(fd.as_fd());
        let file = OpenFile::file(node, fd, flags);
        let data_map = (inode.kind == FileType::Regular).then(|| DataMap::whole(file.fd.clone()));
        let fh = self.handles.insert(file);
        inode.nopen.fetch_add(1, Ordering::Relaxed);
        Ok(Opened {
            fh,
            flags: FopenFlags {
                noflush,
                ..FopenFlags::default()
            },
            data_map,
        })
    }

    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, flags: OpenFlags) -> Result<Created> {
        let name = component(name)?;
        let parent = self.dir(parent)?;
        creds::ensure_zero_umask()?;
        let flags = self.open_flags(flags.bits()) | libc::O_CREAT | (flags.bits() & libc::O_EXCL) | libc::O_NOFOLLOW;
        let mode = new.mode & 0o7777 & !new.umask;
        let fd = {
            let _creds = CredGuard::switch(req, self.switch_creds)?;
            sys::openat2(parent.fd()?.as_fd(), &name, flags, mode, self.resolve)?
        };
        let entry = self.intern_open(&fd)?;
        // No FLUSH at close where it has nothing to report (see `open`).
        let noflush = sys::close_reports_nothing(fd.as_fd());
        let file = OpenFile::file(entry.node, Arc::new(fd), flags);
        let data_map = Some(DataMap::whole(file.fd.clone()));
        let fh = self.handles.insert(file);
        if let Ok(inode) = self.inodes.get(entry.node) {
            inode.nopen.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Created {
            entry,
            opened: Opened {
                fh,
                flags: FopenFlags {
                    noflush,
                    ..FopenFlags::default()
                },
                data_map,
            },
        })
    }

    fn read(&self, _req: &Request, node: NodeId, fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let file = self.file(node, fh)?;
        if file.direct && !aligned(buf.as_ptr()) {
            return with_aligned(buf.len(), |bounce| {
                let n = read_full(&file, bounce, offset)?;
                buf[..n].copy_from_slice(&bounce[..n]);
                Ok(n)
            });
        }
        read_full(&file, buf, offset)
    }

    fn write(&self, req: &Request, node: NodeId, fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        let file = self.file(node, fh)?;
        if args.write_flags & FUSE_WRITE_KILL_SUIDGID != 0 {
            let st = sys::fstat(file.fd())?;
            self.kill_suidgid(req, file.fd(), &st, true)?;
        }
        if file.direct && !aligned(data.as_ptr()) {
            return with_aligned(data.len(), |bounce| {
                bounce.copy_from_slice(data);
                sys::pwrite(file.fd(), bounce, args.offset)
            });
        }
        sys::pwrite(file.fd(), data, args.offset)
    }

    /// Sent for writers on sources that may defer write errors only (see
    /// `open`): closing a duplicate makes the source report them at
    /// `close(2)`, as it would natively. Under write-back the kernel sends
    /// it on every close; where no file can report anything, ENOSYS ends
    /// that round trip for the rest of the mount.
    fn flush(&self, _req: &Request, node: NodeId, fh: FileHandle, _lock_owner: u64) -> Result<()> {
        if self.no_flush.load(Ordering::Relaxed) {
            return Err(Errno::ENOSYS);
        }
        sys::close_dup(self.file(node, fh)?.fd())
    }

    fn release(&self, _req: &Request, node: NodeId, fh: FileHandle, _args: &ReleaseArgs) -> Result<()> {
        self.handles.remove(node, fh)?;
        if let Ok(inode) = self.inodes.get(node) {
            inode.nopen.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn fsync(&self, _req: &Request, node: NodeId, fh: FileHandle, datasync: bool) -> Result<()> {
        sys::fsync(self.file(node, fh)?.fd(), datasync)
    }

    fn opendir(&self, _req: &Request, node: NodeId, _flags: OpenFlags) -> Result<Opened> {
        let inode = self.dir(node)?;
        let fd = sys::open_dir(inode.fd()?.as_fd())?;
        let fh = self.handles.insert(OpenFile::dir(node, fd));
        inode.nopen.fetch_add(1, Ordering::Relaxed);
        Ok(Opened::handle(fh.0))
    }

    fn readdir(&self, _req: &Request, node: NodeId, fh: FileHandle, offset: u64, sink: &mut dyn DirSink) -> Result<()> {
        let dir = self.file(node, fh)?;
        self.walk_dir(&dir, offset, |ent| {
            if sink.add(ent.ino, ent.off, dirent_type(ent.typ), OsStr::from_bytes(ent.name)) {
                Ok(Step::Added)
            } else {
                Ok(Step::Full)
            }
        })
    }

    fn readdirplus(
        &self,
        _req: &Request,
        node: NodeId,
        fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> Result<()> {
        let dir = self.file(node, fh)?;
        let dir_fd = dir.fd.clone();
        self.walk_dir(&dir, offset, |ent| {
            let name = OsStr::from_bytes(ent.name);
            if ent.name == b"." || ent.name == b".." {
                // No node id: the kernel does not instantiate these and
                // they count no lookup.
                let attr = Attr {
                    ino: ent.ino,
                    mode: dirent_type(ent.typ).mode_bits(),
                    ..Attr::default()
                };
                let entry = Entry::new(NodeId(0), attr);
                return Ok(if sink.add(&entry, ent.off, name) {
                    Step::Added
                } else {
                    Step::Full
                });
            }
            let cname = CString::new(ent.name).map_err(|_| Errno::EIO)?;
            let entry = match self.lookup_at(dir_fd.as_fd(), &cname) {
                Ok(entry) => entry,
                // Removed since getdents: it is simply not there any more.
                Err(e) if e == Errno::ENOENT => return Ok(Step::Skipped),
                Err(e) => return Err(e),
            };
            if sink.add(&entry, ent.off, name) {
                Ok(Step::Added)
            } else {
                // Not sent: the lookup must not count.
                self.inodes.forget(entry.node, 1);
                Ok(Step::Full)
            }
        })
    }

    fn releasedir(&self, _req: &Request, node: NodeId, fh: FileHandle, _flags: OpenFlags) -> Result<()> {
        self.handles.remove(node, fh)?;
        if let Ok(inode) = self.inodes.get(node) {
            inode.nopen.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn fsyncdir(&self, _req: &Request, node: NodeId, fh: FileHandle, datasync: bool) -> Result<()> {
        sys::fsync(self.file(node, fh)?.fd(), datasync)
    }

    fn statfs(&self, _req: &Request, node: NodeId) -> Result<Statfs> {
        let st = sys::fstatvfs(self.inodes.get(node)?.fd()?.as_fd())?;
        Ok(Statfs {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namemax as u32,
            frsize: st.f_frsize as u32,
        })
    }

    fn setxattr(&self, _req: &Request, node: NodeId, name: &OsStr, value: &[u8], flags: XattrFlags) -> Result<()> {
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        let inode = self.inodes.get(node)?;
        sys::setxattr(
            sys::ProcPath::new(inode.fd()?.as_fd()).as_cstr(),
            &name,
            value,
            flags.bits(),
        )
    }

    fn getxattr(&self, _req: &Request, node: NodeId, name: &OsStr) -> Result<Vec<u8>> {
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        let inode = self.inodes.get(node)?;
        sys::getxattr(sys::ProcPath::new(inode.fd()?.as_fd()).as_cstr(), &name)
    }

    fn listxattr(&self, _req: &Request, node: NodeId) -> Result<Vec<u8>> {
        let inode = self.inodes.get(node)?;
        sys::listxattr(sys::ProcPath::new(inode.fd()?.as_fd()).as_cstr())
    }

    fn removexattr(&self, _req: &Request, node: NodeId, name: &OsStr) -> Result<()> {
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        let inode = self.inodes.get(node)?;
        sys::removexattr(sys::ProcPath::new(inode.fd()?.as_fd()).as_cstr(), &name)
    }

    fn access(&self, req: &Request, node: NodeId, mask: AccessMode) -> Result<()> {
        let inode = self.inodes.get(node)?;
        let _creds = CredGuard::switch(req, self.switch_creds)?;
        sys::faccess(inode.fd()?.as_fd(), mask.bits())
    }

    fn fallocate(
        &self,
        _req: &Request,
        node: NodeId,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: FallocateFlags,
    ) -> Result<()> {
        sys::fallocate(self.file(node, fh)?.fd(), mode.bits(), offset, length)
    }

    fn lseek(&self, _req: &Request, node: NodeId, fh: FileHandle, offset: u64, whence: Whence) -> Result<u64> {
        if !matches!(whence, Whence::Data | Whence::Hole) {
            return Err(Errno::EINVAL);
        }
        sys::lseek(self.file(node, fh)?.fd(), offset as i64, whence.raw())
    }

    fn copy_file_range(&self, _req: &Request, range: &CopyRange) -> Result<usize> {
        let fin = self.file(range.node_in, range.fh_in)?;
        let fout = self.file(range.node_out, range.fh_out)?;
        let len = range.len.min(isize::MAX as u64) as usize;
        sys::copy_file_range(
            fin.fd(),
            range.off_in,
            fout.fd(),
            range.off_out,
            len,
            range.flags as u32,
        )
    }
}
