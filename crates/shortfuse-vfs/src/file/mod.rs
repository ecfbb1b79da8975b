//! Open file descriptions and the descriptor table.
//!
//! An [`OpenFile`] is what `open(2)` creates: node, file handle, status
//! flags and offset. Descriptors made by `dup`, `dup2`, `dup3` and
//! `fcntl(F_DUPFD*)` share one (`Arc`), so they share the offset and the
//! status flags; `FD_CLOEXEC` belongs to the descriptor. Every `close` of a
//! descriptor sends FLUSH (as the kernel does); the last reference going
//! away sends RELEASE.
//!
//! Here: the open file description; [`io`] its reads, writes and the
//! rest of what is done through it; [`open`] how the VFS makes one;
//! [`fds`] the descriptor table.

mod fds;
mod io;
mod listing;
mod open;

pub use fds::{FdTable, Held};

use shortfuse::sync::Unpoison;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use shortfuse::{Attr, Errno, FileType, NodeId};

use crate::maps::{io_errno, HeldMap};
use crate::vfs::{Location, Target, Vfs};

/// Status flags `fcntl(F_SETFL)` may change (the kernel's `SETFL_MASK`).
const SETFL_MASK: i32 = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME | libc::O_ASYNC;

/// Directory stream state.
#[derive(Debug, Default)]
struct DirPos {
    /// The READDIR cookie to continue from (0 = start).
    cookie: u64,
    /// The daemon's shared listing this stream reads, taken at its start
    /// (see [`listing`]).
    listing: Option<Vec<u8>>,
}

/// One open file description.
pub struct OpenFile {
    vfs: Arc<Vfs>,
    node: NodeId,
    /// `None` for O_PATH descriptors (no FUSE open).
    fh: Option<u64>,
    /// The `S_IF*` bits of the file's type; 0 while not known yet (a file
    /// the kernel opened beneath a namespace map: see
    /// [`OpenFile::learn_kind`]).
    kind: AtomicU32,
    flags: AtomicI32,
    /// File offset; for directories the READDIR cookie.
    pos: Mutex<DirPos>,
    /// The directory's location, for `*at` calls and `fchdir`.
    loc: Option<Location>,
    /// The location of a directory opened beneath a namespace map, found
    /// by a walk of its path the first time a call needs it (see
    /// [`OpenFile::location`]).
    found: OnceLock<Location>,
    /// The path below the mount point it was opened by (names may move
    /// later): what a descriptor handed over at exec reopens.
    path: Vec<u8>,
    /// The file system answered the open with FOPEN_NOFLUSH: no FLUSH at close.
    noflush: bool,
    /// An O_PATH descriptor (no FUSE open, no I/O).
    path_only: bool,
    /// Where the data lives (the file system's data map), when it said.
    map: Option<HeldMap>,
    /// The descriptor is a kernel descriptor of the 1-to-1 backing file
    /// (set by the preload shim): the kernel keeps its offset and flags.
    kernel: AtomicBool,
    /// A kernel descriptor whose locks are this description's (see
    /// [`OpenFile::lock_fd`]), and the node's lock file it was opened on.
    lock: OnceLock<(Arc<File>, File)>,
    /// A kernel file whose open file description stands for this one in
    /// every process (see [`OpenFile::share`]): its file offset is ours.
    shared: OnceLock<File>,
    /// The daemon owns the handle (see [`crate::Backend::anchor`]): no
    /// RELEASE from here.
    anchored: AtomicBool,
    /// The node is pinned in the cache (not for an adopted description,
    /// whose node this image never looked up).
    pinned: bool,
    /// Opened by the kernel beneath a namespace map (see
    /// [`Vfs::open_beneath_map`]): no node, no handle; the program's kernel
    /// descriptor is the whole open file.
    beneath_map: bool,
}

fn accmode(flags: i32) -> i32 {
    flags & libc::O_ACCMODE
}

impl OpenFile {
    /// A description of `node` with only what every open has: the open
    /// flags that stay after the open, at offset 0, no location or map,
    /// not kernel-backed, shared or anchored, its node pinned. Each way of
    /// opening sets what differs.
    fn new(vfs: Arc<Vfs>, node: NodeId, fh: Option<u64>, kind: FileType, flags: i32, path: Vec<u8>) -> OpenFile {
        OpenFile {
            vfs,
            node,
            fh,
            kind: AtomicU32::new(kind.mode_bits()),
            flags: AtomicI32::new(flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC)),
            pos: Mutex::new(DirPos::default()),
            loc: None,
            found: OnceLock::new(),
            path,
            noflush: false,
            path_only: false,
            map: None,
            kernel: AtomicBool::new(false),
            lock: OnceLock::new(),
            shared: OnceLock::new(),
            anchored: AtomicBool::new(false),
            pinned: true,
            beneath_map: false,
        }
    }

    /// This description with what one way of opening sets differently.
    fn with(mut self, set: impl FnOnce(&mut OpenFile)) -> OpenFile {
        set(&mut self);
        self
    }

    pub fn vfs(&self) -> &Arc<Vfs> {
        &self.vfs
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The file's type. One opened beneath a namespace map whose type is
    /// not known yet reads as a regular file: ask [`OpenFile::kind_known`]
    /// first where a directory must be told from the rest.
    pub fn file_type(&self) -> FileType {
        FileType::from_mode(self.kind.load(Ordering::Relaxed))
    }

    /// Whether [`OpenFile::file_type`] is the file's own. An open beneath a
    /// namespace map does not ask the kernel what it opened (most opens
    /// are of files read and closed, and never ask): the first call that
    /// needs to know stats the descriptor and tells [`OpenFile::learn_kind`].
    pub fn kind_known(&self) -> bool {
        self.kind.load(Ordering::Relaxed) != 0
    }

    /// Leaves the type to be learnt (see [`OpenFile::kind_known`]).
    pub(crate) fn forget_kind(&self) {
        self.kind.store(0, Ordering::Relaxed);
    }

    /// Records the type of the file in `mode` (from a stat of one of its
    /// descriptors), when not known yet.
    pub fn learn_kind(&self, mode: u32) {
        let bits = FileType::from_mode(mode).mode_bits();
        let _ = self
            .kind
            .compare_exchange(0, bits, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The `open(2)` flags, with `fcntl(F_SETFL)` changes.
    pub fn flags(&self) -> i32 {
        self.flags.load(Ordering::Relaxed)
    }

    /// `fcntl(F_SETFL)`: only the status flags the kernel lets change.
    pub fn set_flags(&self, flags: i32) {
        let old = self.flags();
        self.flags
            .store((old & !SETFL_MASK) | (flags & SETFL_MASK), Ordering::Relaxed);
    }

    /// The directory this descriptor names, for `*at` and `fchdir`. A
    /// directory the kernel opened beneath a namespace map has none until
    /// a call needs it: then a walk of the path it was opened by finds it
    /// (most calls from its descriptor are the kernel's and never ask).
    pub fn location(&self) -> Option<&Location> {
        if self.loc.is_some() || !self.beneath_map || self.file_type() != FileType::Directory {
            return self.loc.as_ref();
        }
        if let Some(l) = self.found.get() {
            return Some(l);
        }
        let l = self.walk_path().ok()?.location()?;
        self.vfs.pin_location(&l);
        if let Err(l) = self.found.set(l) {
            // Another thread found it first.
            self.vfs.unpin_location(&l);
        }
        self.found.get()
    }

    /// The path below the mount point (starting with '/') this file was
    /// opened by.
    pub fn path(&self) -> &[u8] {
        &self.path
    }

    /// The shared file offset (for directories, the READDIR cookie).
    pub fn offset(&self) -> u64 {
        let mut pos = self.pos();
        self.load(&mut pos)
    }

    /// Makes `description` (a kernel file of its own, whose descriptors
    /// are the program's descriptors of this open file in every process)
    /// hold this open file's offset from now on: the kernel shares it
    /// across fork, dup and exec as it shares any file offset. Only the
    /// first call counts.
    pub fn share(&self, description: File) {
        let mut pos = self.pos();
        let at = pos.cookie;
        if self.shared.set(description).is_ok() {
            self.store(&mut pos, at);
        }
    }

    /// The kernel file set by [`OpenFile::share`].
    pub fn shared(&self) -> Option<&File> {
        self.shared.get()
    }

    /// Whether the daemon owns the handle (see [`anchor_files`]).
    pub fn anchored(&self) -> bool {
        self.anchored.load(Ordering::Acquire)
    }

    /// Whether the handle is still this process's although the file has
    /// a shared description to give it to (see [`anchor_files`]).
    pub fn unanchored(&self) -> bool {
        self.anchoring().is_some()
    }

    /// What giving the handle to the shared description would send: `None`
    /// when there is nothing to give (no description, no handle, given).
    fn anchoring(&self) -> Option<crate::backend::Anchor<'_>> {
        use std::os::fd::AsFd;
        if self.anchored() {
            return None;
        }
        Some(crate::backend::Anchor {
            node: self.node,
            fh: self.fh?,
            dir: self.file_type() == FileType::Directory,
            description: self.shared.get()?.as_fd(),
        })
    }

    /// The handle of the file system's open (`None` for O_PATH and M-Cache opens).
    pub fn handle(&self) -> Option<u64> {
        self.fh
    }

    /// The offset, from the shared description when there is one.
    fn load(&self, pos: &mut DirPos) -> u64 {
        if let Some(f) = self.shared.get() {
            if let Ok(at) = std::io::Seek::stream_position(&mut &*f) {
                pos.cookie = at;
            }
        }
        pos.cookie
    }

    fn store(&self, pos: &mut DirPos, at: u64) {
        pos.cookie = at;
        if let Some(f) = self.shared.get() {
            let _ = std::io::Seek::seek(&mut &*f, std::io::SeekFrom::Start(at));
        }
    }

    /// The data map this open holds, if any.
    pub fn data_map(&self) -> Option<&HeldMap> {
        self.map.as_ref()
    }

    /// Whether the descriptor is a kernel descriptor of the backing file.
    pub fn kernel_backed(&self) -> bool {
        self.kernel.load(Ordering::Relaxed)
    }

    /// Marks the descriptor as a kernel descriptor of the backing file.
    pub fn set_kernel_backed(&self) {
        self.kernel.store(true, Ordering::Relaxed);
    }

    /// A kernel descriptor standing for this open file description in
    /// lock calls (flock, fcntl POSIX and OFD locks), made on first use.
    ///
    /// Each node with locked descriptors gets one anonymous kernel file (an
    /// O_TMPFILE in /dev/shm); each open file description a descriptor of
    /// its own on it, opened with its access mode. The kernel's lock rules
    /// then hold between our descriptors exactly as between real ones
    /// (OFD and flock locks per description, POSIX locks per process,
    /// F_SETLKW waits, deadlock detection), and a forked child inherits
    /// them. Files with a backing file use the backing file's own locks
    /// instead (kernel-backed descriptors).
    pub fn lock_fd(&self) -> Result<i32, Errno> {
        if self.path_only {
            return Err(Errno::EBADF);
        }
        if let Some((_, f)) = self.lock.get() {
            return Ok(f.as_raw_fd());
        }
        let inode = {
            let mut table = self.vfs.lock_inodes.lock().unpoison();
            table.retain(|_, w| w.strong_count() > 0);
            match table.get(&self.node).and_then(Weak::upgrade) {
                Some(f) => f,
                None => {
                    let f = Arc::new(
                        std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
                            .mode(0o600)
                            .open("/dev/shm")
                            .map_err(io_errno)?,
                    );
                    table.insert(self.node, Arc::downgrade(&f));
                    f
                }
            }
        };
        let (read, write) = match accmode(self.flags()) {
            libc::O_RDONLY => (true, false),
            libc::O_WRONLY => (false, true),
            _ => (true, true),
        };
        let own = std::fs::OpenOptions::new()
            .read(read)
            .write(write)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", inode.as_raw_fd()))
            .map_err(io_errno)?;
        let _ = self.lock.set((inode, own));
        Ok(self.lock.get().map_or(-1, |(_, f)| f.as_raw_fd()))
    }

    /// The node's anonymous lock file in this process, if a lock call made
    /// one (see [`OpenFile::lock_fd`]): unlocking through it drops the
    /// process's POSIX locks on the node.
    pub fn lock_inode_fd(&self) -> Option<i32> {
        let table = self.vfs.lock_inodes.lock().unpoison();
        table.get(&self.node).and_then(Weak::upgrade).map(|f| f.as_raw_fd())
    }

    /// Whether this open skipped the file system's `open` (an M-Cache hit).
    pub fn from_map_cache(&self) -> bool {
        self.fh.is_none() && !self.path_only
    }

    /// The map to do I/O through: held, and not replaced since.
    fn mapped(&self) -> Option<&HeldMap> {
        let m = self.map.as_ref()?;
        match self.vfs.maps() {
            Some(t) => t.current(self.node, m.generation).then_some(m),
            // A backing file the daemon lent for this open (kernel
            // passthrough): the file itself, for the open's life.
            None => Some(m),
        }
    }

    /// Whether closing a descriptor sends FLUSH (and so needs a lock owner).
    pub fn needs_flush(&self) -> bool {
        self.fh.is_some() && !self.noflush && self.file_type() != FileType::Directory && self.vfs.client().flushes()
    }

    /// Whether this is an O_PATH descriptor (no FUSE open).
    pub fn is_path_only(&self) -> bool {
        self.is_path()
    }

    fn is_path(&self) -> bool {
        self.path_only
    }

    fn pos(&self) -> MutexGuard<'_, DirPos> {
        self.pos.lock().unpoison()
    }

    /// The handle for a read (`None`: an M-Cache open, served by its map).
    fn readable(&self) -> Result<Option<u64>, Errno> {
        if self.path_only {
            return Err(Errno::EBADF);
        }
        if self.file_type() == FileType::Directory {
            return Err(Errno::EISDIR);
        }
        if accmode(self.flags()) == libc::O_WRONLY {
            return Err(Errno::EBADF);
        }
        Ok(self.fh)
    }

    fn writable(&self) -> Result<Option<u64>, Errno> {
        if self.path_only {
            return Err(Errno::EBADF);
        }
        if accmode(self.flags()) == libc::O_RDONLY {
            return Err(Errno::EBADF);
        }
        Ok(self.fh)
    }

    /// `fstat(2)`.
    pub fn stat(&self) -> Result<Attr, Errno> {
        if self.beneath_map {
            return self.vfs.stat(&self.walk_path()?);
        }
        self.vfs.getattr(self.node)
    }

    /// Whether the kernel opened this file beneath a namespace map (see
    /// [`Vfs::open_beneath_map`]): calls on it are the kernel's.
    pub fn beneath_map(&self) -> bool {
        self.beneath_map
    }

    /// What a walk finds now at the path this file was opened by (not
    /// following a last symbolic link).
    pub fn walk_path(&self) -> Result<Target, Errno> {
        let walk = crate::WalkFlags {
            attrs_only: false,
            follow: false,
            create: false,
        };
        let rel = self.path.strip_prefix(b"/").unwrap_or(&self.path);
        match self.vfs.walk(&Location::root(), rel, walk, 0)? {
            crate::Walk::Inside(t) => Ok(t),
            crate::Walk::Outside { .. } => Err(Errno::ENOENT),
        }
    }
}

/// How many anchors go in one message batch of [`anchor_files`].
const ANCHOR_BATCH: usize = 32;

/// Gives the handles of `files` to their shared descriptions (see
/// [`crate::Backend::anchor`]), one batch per mount; files without one, or
/// given already, are skipped. Returns once the daemons hold them, or the
/// first failure (the handles of that mount then stay this process's).
///
/// Allocates nothing: the preload shim calls it just before a fork, when
/// libc's fork holds the allocator's locks in a program with threads.
pub fn anchor_files<'a>(files: impl Iterator<Item = &'a OpenFile> + Clone) -> Result<(), Errno> {
    let files = || files.clone();
    // A description with several descriptors is listed once per descriptor.
    let first_of_its_own = |i: usize, f: &OpenFile| !files().take(i).any(|g| std::ptr::eq(g, f));
    let mut result = Ok(());
    for (i, lead) in files().enumerate() {
        let Some(a) = lead.anchoring() else { continue };
        // The first file of each mount gathers that mount's batch.
        if files()
            .take(i)
            .any(|g| Arc::ptr_eq(&g.vfs, &lead.vfs) && g.anchoring().is_some())
        {
            continue;
        }
        let mut batch = [a; ANCHOR_BATCH];
        let mut members: [Option<&OpenFile>; ANCHOR_BATCH] = [None; ANCHOR_BATCH];
        let mut n = 0;
        let mut flush =
            |batch: &[crate::backend::Anchor<'_>], members: &[Option<&OpenFile>]| match lead.vfs.client().anchor(batch)
            {
                Ok(()) => {
                    for f in members.iter().flatten() {
                        f.anchored.store(true, Ordering::Release);
                    }
                }
                Err(e) => result = result.and(Err(e)),
            };
        for (j, f) in files().enumerate().skip(i) {
            if !Arc::ptr_eq(&f.vfs, &lead.vfs) || !first_of_its_own(j, f) {
                continue;
            }
            let Some(a) = f.anchoring() else { continue };
            batch[n] = a;
            members[n] = Some(f);
            n += 1;
            if n == ANCHOR_BATCH {
                flush(&batch[..n], &members[..n]);
                n = 0;
            }
        }
        if n > 0 {
            flush(&batch[..n], &members[..n]);
        }
    }
    result
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if let (Some(fh), Some(pc)) = (self.fh, self.page_cache()) {
            // Our own writes changed the mtime: not a change made elsewhere
            // when the file is opened again.
            if pc.wrote_since_seen(self.node) {
                if let Ok(a) = self.vfs.getattr_fresh(self.node, Some(fh)) {
                    pc.seen(self.node, &a);
                }
            }
        }
        if let Some(fh) = self.fh.filter(|_| !self.anchored()) {
            // RELEASE errors are ignored, as the kernel ignores them.
            let _ = self
                .vfs
                .client()
                .release(self.node, fh, self.flags(), self.file_type() == FileType::Directory);
        }
        if let Some(loc) = self.loc.as_ref().or(self.found.get()) {
            self.vfs.unpin_location(loc);
        }
        if self.pinned {
            self.vfs.unpin(self.node);
        }
    }
}
