//! Open file descriptions and the descriptor table.
//!
//! An [`OpenFile`] is what `open(2)` creates: node, file handle, status
//! flags and offset. Descriptors made by `dup`, `dup2`, `dup3` and
//! `fcntl(F_DUPFD*)` share one (`Arc`), so they share the offset and the
//! status flags; `FD_CLOEXEC` belongs to the descriptor. Every `close` of a
//! descriptor sends FLUSH (as the kernel does); the last reference going
//! away sends RELEASE.

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use shortfuse::{Attr, Errno, FileHandle, FileType, NodeId, SetAttr};
use shortfuse_abi as abi;

use crate::maps::{io_errno, HeldMap};
use crate::vfs::{Location, Target, Vfs};

/// Status flags `fcntl(F_SETFL)` may change (the kernel's `SETFL_MASK`).
const SETFL_MASK: i32 = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME | libc::O_ASYNC;

/// Directory stream state.
#[derive(Debug, Default)]
struct DirPos {
    /// The READDIR cookie to continue from (0 = start).
    cookie: u64,
}

/// One open file description.
pub struct OpenFile {
    vfs: Arc<Vfs>,
    node: NodeId,
    /// `None` for O_PATH descriptors (no FUSE open).
    fh: Option<u64>,
    kind: FileType,
    flags: AtomicI32,
    /// File offset; for directories the READDIR cookie.
    pos: Mutex<DirPos>,
    /// The directory's location, for `*at` calls and `fchdir`.
    loc: Option<Location>,
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
    pub fn vfs(&self) -> &Arc<Vfs> {
        &self.vfs
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    pub fn file_type(&self) -> FileType {
        self.kind
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

    /// The directory this descriptor names, for `*at` and `fchdir`.
    pub fn location(&self) -> Option<&Location> {
        self.loc.as_ref()
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
            dir: self.kind == FileType::Directory,
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
        self.vfs
            .maps()
            .is_some_and(|t| t.current(self.node, m.generation))
            .then_some(m)
    }

    /// Whether closing a descriptor sends FLUSH (and so needs a lock owner).
    pub fn needs_flush(&self) -> bool {
        self.fh.is_some() && !self.noflush && self.kind != FileType::Directory && self.vfs.client().flushes()
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
        if self.kind == FileType::Directory {
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
            follow: false,
            create: false,
        };
        let rel = self.path.strip_prefix(b"/").unwrap_or(&self.path);
        match self.vfs.walk(&Location::root(), rel, walk, 0)? {
            crate::Walk::Inside(t) => Ok(t),
            crate::Walk::Outside { .. } => Err(Errno::ENOENT),
        }
    }

    /// `pread(2)`: reads until `buf` is full or end of file.
    pub fn pread(&self, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
        let fh = self.readable()?;
        self.read_at(fh, buf, offset)
    }

    fn read_at(&self, fh: Option<u64>, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
        if let Some(m) = self.mapped() {
            // DataMap fast path: the backing files, not the file system.
            return m.map.read_at(offset, buf).map_err(io_errno);
        }
        let fh = fh.ok_or(Errno::EBADF)?;
        match self.page_cache() {
            // O_DIRECT reads ask the file system (writes keep the pages right).
            Some(pc) if self.flags() & libc::O_DIRECT == 0 => {
                pc.read(self.node, offset, buf, |off, b| self.read_direct(fh, b, off))
            }
            _ => self.read_direct(fh, buf, offset),
        }
    }

    /// The page cache for this file's data: a regular file without a data map.
    fn page_cache(&self) -> Option<&crate::PageCache> {
        self.vfs
            .page_cache()
            .filter(|_| self.kind == FileType::Regular && self.map.is_none())
    }

    /// READs (of at most `max_io` each) until `buf` is full or end of file.
    fn read_direct(&self, fh: u64, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
        let max = self.vfs.max_io();
        let mut done = 0;
        while done < buf.len() {
            let end = buf.len().min(done + max);
            let n = self
                .vfs
                .client()
                .read(self.node, fh, offset + done as u64, &mut buf[done..end], self.flags())?;
            done += n;
            if n < end - (done - n) {
                break;
            }
        }
        Ok(done)
    }

    /// `read(2)` at the shared offset.
    pub fn read(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        let fh = self.readable()?;
        let mut pos = self.pos();
        let at = self.load(&mut pos);
        let n = self.read_at(fh, buf, at)?;
        self.store(&mut pos, at + n as u64);
        Ok(n)
    }

    /// `pwrite(2)`. As on Linux, O_APPEND appends whatever the offset.
    pub fn pwrite(&self, data: &[u8], offset: u64) -> Result<usize, Errno> {
        let fh = self.writable()?;
        let offset = if self.flags() & libc::O_APPEND != 0 {
            self.size()?
        } else {
            offset
        };
        self.write_at(fh, data, offset)
    }

    fn size(&self) -> Result<u64, Errno> {
        Ok(self.vfs.getattr_fresh(self.node, self.fh)?.size)
    }

    fn write_at(&self, fh: Option<u64>, data: &[u8], offset: u64) -> Result<usize, Errno> {
        if let Some(m) = self.mapped() {
            match m.map.write_at(offset, data) {
                Ok(n) => {
                    self.vfs.invalidate_attr(self.node);
                    return Ok(n);
                }
                // Past what the map covers (EFBIG) or a backing file not
                // open for writing: the file system grows or writes it.
                Err(_) if fh.is_some() => {}
                Err(e) => return Err(io_errno(e)),
            }
        }
        let fh = fh.ok_or(Errno::EBADF)?;
        let max = self.vfs.max_io();
        let mut done = 0;
        let result = loop {
            if done == data.len() {
                break Ok(done);
            }
            let end = data.len().min(done + max);
            match self
                .vfs
                .client()
                .write(self.node, fh, offset + done as u64, &data[done..end], self.flags())
            {
                Ok(0) => break Ok(done),
                Ok(n) => done += n,
                Err(e) if done > 0 => {
                    let _ = e;
                    break Ok(done);
                }
                Err(e) => break Err(e),
            }
        };
        self.vfs.invalidate_attr(self.node);
        if let (Some(pc), Ok(n)) = (self.page_cache(), &result) {
            // Write-through: the file system has it, the pages follow.
            pc.wrote(self.node, offset, &data[..*n]);
        }
        result
    }

    /// `write(2)` at the shared offset, or at the end with O_APPEND.
    pub fn write(&self, data: &[u8]) -> Result<usize, Errno> {
        let fh = self.writable()?;
        let mut pos = self.pos();
        let at = if self.flags() & libc::O_APPEND != 0 {
            self.size()?
        } else {
            self.load(&mut pos)
        };
        let n = self.write_at(fh, data, at)?;
        self.store(&mut pos, at + n as u64);
        Ok(n)
    }

    /// `lseek(2)`.
    pub fn lseek(&self, offset: i64, whence: i32) -> Result<u64, Errno> {
        if self.is_path() {
            return Err(Errno::EBADF);
        }
        let mut pos = self.pos();
        let cur = self.load(&mut pos);
        let new = match whence {
            libc::SEEK_SET => offset,
            libc::SEEK_CUR => (cur as i64).checked_add(offset).ok_or(Errno::EOVERFLOW)?,
            libc::SEEK_END if self.kind != FileType::Directory => {
                (self.size()? as i64).checked_add(offset).ok_or(Errno::EOVERFLOW)?
            }
            libc::SEEK_DATA | libc::SEEK_HOLE if self.kind == FileType::Regular => {
                if offset < 0 {
                    return Err(Errno::ENXIO);
                }
                let asked = match self.fh {
                    Some(fh) => self.vfs.client().lseek(self.node, fh, offset as u64, whence),
                    None => Err(Errno::ENOSYS),
                };
                match asked {
                    Ok(o) => o as i64,
                    Err(e) if e == Errno::ENOSYS => {
                        // The kernel's generic answer: all data, a hole at the end.
                        let size = self.size()?;
                        if offset as u64 >= size {
                            return Err(Errno::ENXIO);
                        }
                        if whence == libc::SEEK_DATA {
                            offset
                        } else {
                            size as i64
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            _ => return Err(Errno::EINVAL),
        };
        if new < 0 {
            return Err(Errno::EINVAL);
        }
        self.store(&mut pos, new as u64);
        Ok(new as u64)
    }

    /// `getdents64(2)`: fills `buf` with `struct linux_dirent64` records.
    /// Returns 0 at the end of the directory.
    pub fn getdents64(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        let fh = self.fh.ok_or(Errno::EBADF)?;
        if self.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let mut pos = self.pos();
        // At least a page: a READDIR too small for one entry would read as
        // the end of the directory; entries that do not fit are left for
        // the next call.
        let size = buf.len().clamp(4096, self.vfs.max_io()) as u32;
        let mut used = 0;
        let mut cookie = pos.cookie;
        let mut too_small = false;
        self.vfs
            .client()
            .readdir(self.node, fh, pos.cookie, size, |ino, off, typ, name| {
                let reclen = (19 + name.len() + 1 + 7) & !7;
                if too_small || used + reclen > buf.len() {
                    too_small = true;
                    return;
                }
                let rec = &mut buf[used..used + reclen];
                rec[0..8].copy_from_slice(&ino.to_ne_bytes());
                rec[8..16].copy_from_slice(&off.to_ne_bytes());
                rec[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
                rec[18] = typ as u8;
                rec[19..19 + name.len()].copy_from_slice(name);
                rec[19 + name.len()..].fill(0);
                used += reclen;
                cookie = off;
            })?;
        if used == 0 && too_small {
            return Err(Errno::EINVAL);
        }
        pos.cookie = cookie;
        Ok(used)
    }

    /// `ftruncate(2)`.
    pub fn truncate(&self, size: u64) -> Result<(), Errno> {
        if self.path_only {
            return Err(Errno::EBADF);
        }
        let fh = self.fh;
        if self.kind != FileType::Regular || accmode(self.flags()) == libc::O_RDONLY {
            return Err(Errno::EINVAL);
        }
        self.vfs.setattr(
            self.node,
            &SetAttr {
                size: Some(size),
                fh: fh.map(FileHandle),
                ..Default::default()
            },
        )?;
        Ok(())
    }

    /// `fsync(2)`/`fdatasync(2)`. ENOSYS from the file system counts as done.
    pub fn fsync(&self, datasync: bool) -> Result<(), Errno> {
        if self.path_only {
            return Err(Errno::EBADF);
        }
        let Some(fh) = self.fh else {
            // An M-Cache open: the data is in the backing files.
            return self.map.as_ref().map_or(Ok(()), |m| sync_backing(&m.map, datasync));
        };
        match self
            .vfs
            .client()
            .fsync(self.node, fh, datasync, self.kind == FileType::Directory)
        {
            Err(e) if e == Errno::ENOSYS => Ok(()),
            r => r,
        }
    }

    /// `fallocate(2)`.
    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<(), Errno> {
        let fh = self.writable()?.ok_or(Errno::EOPNOTSUPP)?;
        if self.kind != FileType::Regular {
            return Err(Errno::ENODEV);
        }
        let r = match self.vfs.client().fallocate(self.node, fh, offset, len, mode) {
            Err(e) if e == Errno::ENOSYS => Err(Errno::EOPNOTSUPP),
            r => r,
        };
        self.vfs.invalidate_attr(self.node);
        if let Some(pc) = self.page_cache() {
            pc.invalidate(self.node);
        }
        r
    }

    /// SETATTR through this descriptor (fchmod, fchown, futimens).
    pub fn setattr(&self, set: &SetAttr) -> Result<Attr, Errno> {
        let mut set = *set;
        set.fh = self.fh.map(FileHandle);
        self.vfs.setattr(self.node, &set)
    }

    /// FLUSH: sent on every close of a descriptor. ENOSYS counts as success.
    pub fn flush(&self, lock_owner: u64) -> Result<(), Errno> {
        let Some(fh) = self.fh else { return Ok(()) };
        if !self.needs_flush() {
            return Ok(());
        }
        match self.vfs.client().flush(self.node, fh, lock_owner) {
            Err(e) if e == Errno::ENOSYS => Ok(()),
            r => r,
        }
    }
}

/// fsync/fdatasync of every backing file of a map.
fn sync_backing(map: &shortfuse::DataMap, datasync: bool) -> Result<(), Errno> {
    let mut seen: Vec<&shortfuse::BackingFile> = Vec::new();
    for e in &map.extents {
        if seen.iter().any(|b| Arc::ptr_eq(b, &e.backing)) {
            continue;
        }
        seen.push(&e.backing);
        let f = std::fs::File::from(e.backing.try_clone().map_err(io_errno)?);
        if datasync { f.sync_data() } else { f.sync_all() }.map_err(io_errno)?;
    }
    Ok(())
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
                .release(self.node, fh, self.flags(), self.kind == FileType::Directory);
        }
        if let Some(loc) = &self.loc {
            self.vfs.unpin_location(loc);
        }
        if self.pinned {
            self.vfs.unpin(self.node);
        }
    }
}

impl Vfs {
    /// `open(2)`/`openat(2)` of a walked target. The walk must have
    /// followed a final symlink unless O_NOFOLLOW or O_CREAT|O_EXCL. Any
    /// error for an [`Target::unasked`] target only says that creating
    /// failed: walk again without [`crate::WalkFlags::create`] and open
    /// that.
    pub fn open(self: &Arc<Vfs>, t: &Target, flags: i32, mode: u32) -> Result<Arc<OpenFile>, Errno> {
        let creat = flags & libc::O_CREAT != 0;
        let excl = flags & libc::O_EXCL != 0;
        let path_only = flags & libc::O_PATH != 0;
        let want_dir = flags & libc::O_DIRECTORY != 0;
        let acc = accmode(flags);
        if acc == libc::O_ACCMODE && !path_only {
            return Err(Errno::EINVAL);
        }
        if flags & libc::O_TMPFILE == libc::O_TMPFILE {
            // TMPFILE is not in the trait: what the kernel answers for FUSE without it.
            return Err(Errno::EOPNOTSUPP);
        }
        let mut noflush = false;
        if let Some(f) = self.open_cached(t, flags) {
            return Ok(f);
        }
        let (node, attr, created_fh) = match t.node {
            Some((node, attr)) => {
                if creat && excl && !path_only {
                    return Err(Errno::EEXIST);
                }
                let writes = acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
                if writes && !path_only && attr.file_type() == FileType::Regular {
                    self.writable()?;
                }
                (node, attr, None)
            }
            None if creat && !path_only => {
                let name = match &t.last {
                    crate::vfs::Last::Name(n) => n.clone(),
                    _ => return Err(Errno::EISDIR),
                };
                if t.trailing_slash {
                    return Err(Errno::EISDIR);
                }
                self.writable()?;
                let parent = t.dir.node();
                let umask = self.umask();
                let fmode = self.create_mode(parent, libc::S_IFREG | (mode & 0o7777 & !umask))?;
                let mut open_flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY);
                if t.unasked {
                    // The name may exist: only create.
                    open_flags |= libc::O_EXCL;
                }
                match self
                    .client()
                    .create(parent, OsStr::from_bytes(&name), open_flags, fmode, umask)
                {
                    Ok((e, o)) => {
                        self.remember_created(parent, &name, &e);
                        noflush = o.open_flags & abi::FOPEN_NOFLUSH != 0;
                        (e.node, e.attr, Some(o.fh))
                    }
                    Err(e) if e == Errno::ENOSYS => {
                        let e = self.client().mknod(parent, OsStr::from_bytes(&name), fmode, 0, umask)?;
                        self.remember_created(parent, &name, &e);
                        (e.node, e.attr, None)
                    }
                    // Another thread or process created it since the walk:
                    // without O_EXCL the open takes the file that is there,
                    // as the kernel's open retries its lookup.
                    Err(e) if e == Errno::EEXIST && !excl && !t.unasked => {
                        // The walk's answer (a cached negative entry, say) is stale.
                        self.drop_name_only(parent, &name);
                        match self.lookup(parent, &name)? {
                            Some((node, attr)) => (node, attr, None),
                            None => return Err(e),
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            None => return Err(Errno::ENOENT),
        };
        let kind = attr.file_type();
        if (want_dir || t.trailing_slash) && kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        if kind == FileType::Symlink && !path_only {
            return Err(Errno::ELOOP);
        }
        if kind == FileType::Directory && !path_only && (acc != libc::O_RDONLY || creat || flags & libc::O_TRUNC != 0) {
            return Err(Errno::EISDIR);
        }
        let loc = if kind == FileType::Directory {
            t.location()
        } else {
            None
        };
        let fh = if path_only {
            None
        } else if let Some(fh) = created_fh {
            Some(fh)
        } else {
            let is_dir = kind == FileType::Directory;
            // O_RDONLY|O_TRUNC truncates too (Linux; the open asked for
            // write permission).
            let trunc = flags & libc::O_TRUNC != 0 && kind == FileType::Regular;
            let mut oflags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY);
            if !self.atomic_o_trunc() {
                oflags &= !libc::O_TRUNC;
            }
            let o = self.client().open(node, oflags, is_dir)?;
            if trunc && !self.atomic_o_trunc() {
                let set = SetAttr {
                    size: Some(0),
                    fh: Some(FileHandle(o.fh)),
                    ..Default::default()
                };
                if let Err(e) = self.setattr(node, &set) {
                    let _ = self.client().release(node, o.fh, oflags, false);
                    return Err(e);
                }
            }
            if trunc {
                self.invalidate_attr(node);
            }
            noflush = o.open_flags & abi::FOPEN_NOFLUSH != 0;
            Some(o.fh)
        };
        let map = match (fh, self.maps()) {
            (Some(fh), Some(t)) if kind == FileType::Regular => t.take(node, fh),
            _ => None,
        };
        if let (Some(pc), Some(fh), None, FileType::Regular) = (self.page_cache(), fh, &map, kind) {
            // Close-to-open: what the file system holds now decides whether
            // the cached pages still stand.
            let now = match created_fh {
                Some(_) => attr,
                None => self.getattr_fresh(node, Some(fh)).inspect_err(|_| {
                    let _ = self.client().release(node, fh, flags, false);
                })?,
            };
            pc.opened(node, &now);
        }
        self.pin(node);
        if let Some(l) = &loc {
            self.pin_location(l);
        }
        Ok(Arc::new(OpenFile {
            vfs: self.clone(),
            node,
            fh,
            kind,
            flags: AtomicI32::new(flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC)),
            pos: Mutex::new(DirPos::default()),
            loc,
            path: t.path(),
            noflush,
            path_only,
            map,
            kernel: AtomicBool::new(false),
            lock: OnceLock::new(),
            shared: OnceLock::new(),
            anchored: AtomicBool::new(false),
            pinned: true,
            beneath_map: false,
        }))
    }

    /// The M-Cache (DeFUSE): a re-open of a regular file whose map is
    /// cached and whose attributes are still valid skips the file system's
    /// `open`; the open file then does all its I/O through the map. Not for
    /// creating or truncating opens, O_PATH, or a caller the cached mode
    /// bits refuse (the check the skipped `open` would have made); writers
    /// only for 1-to-1 maps.
    fn open_cached(self: &Arc<Vfs>, t: &Target, flags: i32) -> Option<Arc<OpenFile>> {
        let (node, _) = t.node?;
        if flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_PATH | libc::O_DIRECTORY) != 0 || t.trailing_slash {
            return None;
        }
        let attr = self.cached_attr(node)?;
        if attr.file_type() != FileType::Regular {
            return None;
        }
        let acc = accmode(flags);
        if acc != libc::O_RDONLY && self.is_read_only() {
            return None;
        }
        if !permits(&attr, &self.client().caller(), acc) {
            return None;
        }
        let mut map = self.maps()?.cached(node)?;
        if let Some(b) = map.whole() {
            // The cache keeps an O_PATH descriptor: this open gets its own,
            // with its flags (the kernel checks permission here).
            let own = crate::maps::reopen(b, flags).ok()?;
            map.map = Arc::new(shortfuse::DataMap::whole(Arc::new(own)));
        } else if acc != libc::O_RDONLY {
            // A write past the end of a 1-to-M or M-to-1 map needs the file
            // system (it grows the file and hands out a new map): that
            // takes an open of its own.
            return None;
        }
        self.pin(node);
        Some(Arc::new(OpenFile {
            vfs: self.clone(),
            node,
            fh: None,
            kind: FileType::Regular,
            flags: AtomicI32::new(flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC)),
            pos: Mutex::new(DirPos::default()),
            loc: None,
            path: t.path(),
            noflush: true,
            path_only: false,
            map: Some(map),
            kernel: AtomicBool::new(false),
            lock: OnceLock::new(),
            shared: OnceLock::new(),
            anchored: AtomicBool::new(false),
            pinned: true,
            beneath_map: false,
        }))
    }

    /// An open file description this image inherited (exec) from an image
    /// that opened it on a shared daemon: `node` and `fh` as that image got
    /// them, the handle anchored in the daemon (see
    /// [`crate::Backend::anchor`]), `description` the kernel file holding
    /// the offset (see [`OpenFile::share`]).
    pub fn adopt(
        self: &Arc<Vfs>,
        node: NodeId,
        fh: u64,
        flags: i32,
        path: Vec<u8>,
        description: File,
    ) -> Arc<OpenFile> {
        let f = OpenFile {
            vfs: self.clone(),
            node,
            fh: Some(fh),
            kind: FileType::Regular,
            flags: AtomicI32::new(flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC)),
            pos: Mutex::new(DirPos::default()),
            loc: None,
            path,
            noflush: false,
            path_only: false,
            map: None,
            kernel: AtomicBool::new(false),
            lock: OnceLock::new(),
            shared: OnceLock::new(),
            anchored: AtomicBool::new(true),
            pinned: false,
            beneath_map: false,
        };
        let _ = f.shared.set(description);
        Arc::new(f)
    }

    /// An open of a walked node whose descriptor the kernel serves alone,
    /// without the file system's `open`: a FIFO or device node opened as a
    /// kernel node (the file system has no I/O to give for them, and a
    /// FIFO's open must wait for its peer in the caller, never in a
    /// daemon), or a descriptor of a backing file that this image inherited
    /// across exec. The open file is [`OpenFile::kernel_backed`] and holds
    /// no handle; its node stays pinned while it is open, so `fstat` gives
    /// the mount's identity.
    pub fn open_in_kernel(self: &Arc<Vfs>, node: NodeId, kind: FileType, flags: i32, path: Vec<u8>) -> Arc<OpenFile> {
        self.pin(node);
        self.kernel_file(node, kind, flags, path, false)
    }

    /// A file the kernel opened beneath the mount's namespace map (see
    /// `shortfuse::namespace`): the program's descriptor is the backing
    /// file's own, and the file system never saw the open, so there is no
    /// node or handle. It is [`OpenFile::kernel_backed`]; what needs the
    /// file's identity in the mount ([`OpenFile::stat`], a walk from its
    /// descriptor) takes the path it was opened by.
    pub fn open_beneath_map(self: &Arc<Vfs>, kind: FileType, flags: i32, path: Vec<u8>) -> Arc<OpenFile> {
        self.kernel_file(NodeId(0), kind, flags, path, true)
    }

    /// A kernel-backed open file without a handle: on a pinned `node`, or
    /// beneath the namespace map (no node).
    fn kernel_file(
        self: &Arc<Vfs>,
        node: NodeId,
        kind: FileType,
        flags: i32,
        path: Vec<u8>,
        beneath_map: bool,
    ) -> Arc<OpenFile> {
        Arc::new(OpenFile {
            vfs: self.clone(),
            node,
            fh: None,
            kind,
            flags: AtomicI32::new(flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC)),
            pos: Mutex::new(DirPos::default()),
            loc: None,
            path,
            noflush: true,
            path_only: false,
            map: None,
            kernel: AtomicBool::new(true),
            lock: OnceLock::new(),
            shared: OnceLock::new(),
            anchored: AtomicBool::new(false),
            pinned: !beneath_map,
            beneath_map,
        })
    }

    fn remember_created(&self, parent: NodeId, name: &[u8], e: &crate::client::EntryOut) {
        self.remember(parent, name, e);
    }
}

/// Whether `attr`'s owner, group and mode bits let `caller` open with
/// access mode `acc` (root may always).
fn permits(attr: &Attr, caller: &crate::client::Caller, acc: i32) -> bool {
    if caller.uid == 0 {
        return true;
    }
    let shift = if attr.uid == caller.uid {
        6
    } else if caller.in_group(attr.gid) {
        3
    } else {
        0
    };
    let bits = (attr.mode >> shift) & 0o7;
    let need = match acc {
        libc::O_RDONLY => 0o4,
        libc::O_WRONLY => 0o2,
        _ => 0o6,
    };
    bits & need == need
}

/// One descriptor: its open file description and its own flag.
#[derive(Clone)]
struct Slot {
    file: Arc<OpenFile>,
    cloexec: bool,
}

/// Descriptors below this are looked up in a lock-free bitmap first.
const FAST_FDS: usize = 1 << 16;

/// Hashes descriptor numbers for the table: they are small, dense and
/// chosen by the kernel, not by an adversary, so a multiply spreads them
/// well enough and costs a fraction of SipHash (every served call on a
/// descriptor looks one up).
#[derive(Default)]
struct FdHasher(u64);

impl std::hash::Hasher for FdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_i32(&mut self, v: i32) {
        self.0 = u64::from(v as u32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type FdHash = std::hash::BuildHasherDefault<FdHasher>;

/// The descriptor table: descriptor numbers (chosen by the caller, e.g. the
/// kernel numbers of placeholders) to open files.
pub struct FdTable {
    slots: Mutex<HashMap<i32, Slot, FdHash>>,
    /// One bit per descriptor below `FAST_FDS`: is it ours?
    bits: Box<[AtomicU64]>,
}

impl Default for FdTable {
    fn default() -> FdTable {
        FdTable::new()
    }
}

impl FdTable {
    pub fn new() -> FdTable {
        FdTable {
            slots: Mutex::new(HashMap::default()),
            bits: (0..FAST_FDS / 64).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<i32, Slot, FdHash>> {
        self.slots.lock().unpoison()
    }

    fn mark(&self, fd: i32, on: bool) {
        if let Ok(i) = usize::try_from(fd) {
            if i < FAST_FDS {
                let bit = 1u64 << (i % 64);
                if on {
                    self.bits[i / 64].fetch_or(bit, Ordering::Release);
                } else {
                    self.bits[i / 64].fetch_and(!bit, Ordering::Release);
                }
            }
        }
    }

    /// Whether `fd` is one of ours: lock-free for descriptors below 65536.
    pub fn contains(&self, fd: i32) -> bool {
        match usize::try_from(fd) {
            Ok(i) if i < FAST_FDS => self.bits[i / 64].load(Ordering::Acquire) & (1u64 << (i % 64)) != 0,
            Ok(_) => self.lock().contains_key(&fd),
            Err(_) => false,
        }
    }

    pub fn get(&self, fd: i32) -> Option<Arc<OpenFile>> {
        if !self.contains(fd) {
            return None;
        }
        self.lock().get(&fd).map(|s| s.file.clone())
    }

    /// Installs `file` at `fd`; returns what was there (to be closed by
    /// the caller outside any lock of ours).
    pub fn insert(&self, fd: i32, file: Arc<OpenFile>, cloexec: bool) -> Option<Arc<OpenFile>> {
        let old = self.lock().insert(fd, Slot { file, cloexec });
        self.mark(fd, true);
        old.map(|s| s.file)
    }

    /// Removes `fd`: FLUSH now, RELEASE when it was the last descriptor of
    /// the open file. `None` when `fd` is not ours.
    pub fn close(&self, fd: i32, lock_owner: u64) -> Option<Result<(), Errno>> {
        self.close_with_cloexec(fd, lock_owner).map(|(r, _)| r)
    }

    /// [`FdTable::close`], and whether `fd` had FD_CLOEXEC.
    pub fn close_with_cloexec(&self, fd: i32, lock_owner: u64) -> Option<(Result<(), Errno>, bool)> {
        let slot = {
            let mut slots = self.lock();
            let s = slots.remove(&fd);
            if s.is_some() {
                self.mark(fd, false);
            }
            s
        }?;
        let r = slot.file.flush(lock_owner);
        let cloexec = slot.cloexec;
        drop(slot);
        Some((r, cloexec))
    }

    /// `dup2`/`dup3`/`F_DUPFD`: `new` shares `old`'s open file. Returns the
    /// file that `new` held before, if it was ours (already removed).
    pub fn dup(&self, old: i32, new: i32, cloexec: bool) -> Result<Option<Arc<OpenFile>>, Errno> {
        let file = self.get(old).ok_or(Errno::EBADF)?;
        Ok(self.insert(new, file, cloexec))
    }

    pub fn cloexec(&self, fd: i32) -> Option<bool> {
        self.lock().get(&fd).map(|s| s.cloexec)
    }

    pub fn set_cloexec(&self, fd: i32, on: bool) -> Result<(), Errno> {
        let mut slots = self.lock();
        let s = slots.get_mut(&fd).ok_or(Errno::EBADF)?;
        s.cloexec = on;
        Ok(())
    }

    /// Every descriptor in `lo..=hi` that is ours, removed (close_range).
    pub fn close_range(&self, lo: u32, hi: u32, lock_owner: u64) {
        let fds: Vec<i32> = self
            .lock()
            .keys()
            .copied()
            .filter(|&fd| fd >= 0 && (fd as u32) >= lo && (fd as u32) <= hi)
            .collect();
        for fd in fds {
            self.close(fd, lock_owner);
        }
    }

    /// Descriptors with FD_CLOEXEC (dropped at exec).
    pub fn cloexec_fds(&self) -> Vec<i32> {
        self.lock()
            .iter()
            .filter(|(_, s)| s.cloexec)
            .map(|(&fd, _)| fd)
            .collect()
    }

    /// Fills `out` with open files for which `pick` holds, each once
    /// however many descriptors share it, as many as fit: returns how many.
    /// Allocates nothing (see [`anchor_files`]).
    pub fn files_where(&self, pick: impl Fn(&OpenFile) -> bool, out: &mut [Option<Arc<OpenFile>>]) -> usize {
        let mut n = 0;
        for s in self.lock().values() {
            if n == out.len() {
                break;
            }
            if pick(&s.file) && !out[..n].iter().flatten().any(|f| Arc::ptr_eq(f, &s.file)) {
                out[n] = Some(s.file.clone());
                n += 1;
            }
        }
        n
    }

    /// Runs `each` on every descriptor of `file` (number, FD_CLOEXEC)
    /// with the table locked: a descriptor this table lists is the
    /// program's meanwhile, since `close` takes it out of the table before
    /// the kernel closes the number (so `each` may replace the kernel's
    /// descriptor at that number, and nobody else's).
    pub fn each_descriptor_of(&self, file: &Arc<OpenFile>, mut each: impl FnMut(i32, bool)) {
        let slots = self.lock();
        for (&fd, s) in slots.iter() {
            if Arc::ptr_eq(&s.file, file) {
                each(fd, s.cloexec);
            }
        }
    }

    /// Every descriptor of ours with its flag.
    pub fn fds(&self) -> Vec<(i32, bool)> {
        let mut v: Vec<(i32, bool)> = self.lock().iter().map(|(&fd, s)| (fd, s.cloexec)).collect();
        v.sort_unstable();
        v
    }
}
