//! Kernel passthrough bookkeeping (FUSE protocol 7.40, Linux 6.9+): which
//! inodes are open in passthrough mode and with which backing id.
//!
//! When a file system's `open`/`create` returns a whole-file 1-to-1
//! [`DataMap`] and the mount negotiated `FUSE_PASSTHROUGH`, the open reply
//! carries `FOPEN_PASSTHROUGH` and a backing id: the kernel then sends the
//! file's reads, writes, splices and mmaps straight to the backing file, and
//! the daemon never sees them.
//!
//! The kernel keeps per-inode rules that a file system should never have to
//! know about (see `notes/kernel-fuse.md`):
//! - once an inode is open in passthrough, every later open must be
//!   passthrough too, with the same backing file (EIO, EBUSY otherwise);
//! - an inode open in cached mode (a plain open) cannot be opened in
//!   passthrough (ETXTBSY).
//!
//! [`Passthrough`] keeps them: each inode with open files is in one mode,
//! decided by its first open, until its last release.
//! - First open with a whole map: the inode is in passthrough mode and every
//!   later open of it is answered with the same backing id, whether or not
//!   that open returned a map (the kernel reopens the backing file with each
//!   open's own flags, so the descriptor's mode does not matter).
//! - First open without a whole map (or when registering the backing file
//!   fails): the inode is in daemon mode and every later open of it is
//!   served by the daemon too, even one that returns a whole map.
//! - Last release: the mode is forgotten. The backing id is closed the
//!   first time, and kept from the second time on (see below).
//! - With the reader cache (`-o reader_cache`), a read-only first open puts
//!   the inode in daemon mode, where the kernel serves reads from the
//!   mount's own page cache: a cached read is then one page-cache copy,
//!   where the passthrough read path reads a second file under the first.
//!   A read-only open of an inode already in passthrough joins it. Such an
//!   open keeps the cached pages (`FOPEN_KEEP_CACHE`) only when the file's
//!   size and times are those the inode's previous cache-mode open saw and
//!   no open for writing came between ([`Passthrough::keeps_cache`]); the
//!   kernel's `AUTO_INVAL_DATA` drops pages whose mtime it sees change while
//!   files are open.
//!
//! A backing id stays valid until `FUSE_DEV_IOC_BACKING_CLOSE`, whatever
//! happens to the files opened with it: the kernel takes its own reference
//! to the registered file for each open and gives it back at release. So
//! an inode opened again after a last release keeps its second registration
//! for every later open until the kernel forgets the inode (FORGET),
//! instead of an ioctl pair around each open. A file opened only once
//! (created, written, closed, deleted) keeps nothing: its registration is
//! closed at release as it would be at FORGET, so the ioctl costs the same. The
//! registered descriptor is an `O_PATH` one of its own (the kernel uses only
//! its path), so a kept registration holds no read or write access to the
//! source file: executing or leasing it in the source is not refused, as it
//! would be while a writable descriptor is held. At most
//! [`IDLE_REGISTRATIONS`] inodes without open files keep theirs; beyond
//! that the longest idle ones are closed ([`BackingId`] closes on drop).
//!
use crate::sync::Unpoison;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use shortfuse_abi as abi;

use crate::datamap::DataMap;
use crate::types::{Attr, NodeId, Timestamp};

/// A backing id registered with `FUSE_DEV_IOC_BACKING_OPEN`, closed with
/// `FUSE_DEV_IOC_BACKING_CLOSE` when dropped.
#[derive(Debug)]
pub struct BackingId {
    id: i32,
    device: Arc<OwnedFd>,
}

impl BackingId {
    /// Registers `file` (any descriptor of a regular file, O_PATH included)
    /// with the FUSE connection of `device`. Needs CAP_SYS_ADMIN.
    pub fn open(device: &Arc<OwnedFd>, file: BorrowedFd<'_>) -> io::Result<BackingId> {
        let id = sys::backing_open(device.as_fd(), file)?;
        Ok(BackingId {
            id,
            device: device.clone(),
        })
    }

    /// The id as `fuse_open_out.backing_id` carries it.
    pub fn id(&self) -> i32 {
        self.id
    }
}

impl Drop for BackingId {
    fn drop(&mut self) {
        if let Err(e) = sys::backing_close(self.device.as_fd(), self.id) {
            tracing::warn!("FUSE_DEV_IOC_BACKING_CLOSE of backing id {}: {e}", self.id);
        }
    }
}

/// How many inodes without open files keep their backing id. Each holds
/// one `O_PATH` file in the kernel; the daemon already holds one descriptor
/// per inode the kernel knows, so this only bounds what an inode that is
/// never forgotten keeps besides.
pub const IDLE_REGISTRATIONS: usize = 1024;

/// What an open may do with the file, as [`Passthrough::open`] weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only, passed through like any other open.
    Read,
    /// Read-only, served from the page cache unless the inode is already in
    /// passthrough (the reader cache).
    CachedRead,
    /// May write.
    Write,
}

/// How the open files of one inode are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Kernel,
    Daemon,
}

/// One inode the table knows: open, or idle with a kept registration.
#[derive(Debug)]
struct Node {
    /// The inode's registration, kept across opens until FORGET or until
    /// it is the longest idle one beyond [`IDLE_REGISTRATIONS`].
    backing: Option<BackingId>,
    /// How the open files are served; meaningless while `opens` is 0.
    mode: Mode,
    opens: u64,
    /// The kernel forgot the inode while files were open: nothing is kept
    /// after the last release.
    forgotten: bool,
    /// The registration was kept after a last release before.
    kept: bool,
    /// When it last went idle, to tell a current entry of the idle queue
    /// from a stale one.
    idle_since: u64,
}

impl Node {
    fn open(backing: Option<BackingId>, mode: Mode) -> Node {
        Node {
            backing,
            mode,
            opens: 1,
            forgotten: false,
            kept: false,
            idle_since: 0,
        }
    }

    fn backing_id(&self) -> Option<i32> {
        match self.mode {
            Mode::Kernel => self.backing.as_ref().map(BackingId::id),
            Mode::Daemon => None,
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    nodes: HashMap<NodeId, Node>,
    /// Inodes that went idle with a registration, oldest first, with the
    /// `idle_since` they went idle at (entries whose inode was reopened,
    /// forgotten or evicted since are stale and skipped).
    idle: VecDeque<(NodeId, u64)>,
    /// Inodes that are idle with a registration now.
    idle_count: usize,
    clock: u64,
    /// Inodes whose registration was closed at their first last release,
    /// oldest first, at most [`IDLE_REGISTRATIONS`]: the next time such an
    /// inode is released its registration is kept. A file opened once
    /// (written, copied, then deleted) keeps nothing in the kernel and
    /// costs no ioctl at FORGET; a file opened again keeps its.
    released_once: HashSet<NodeId>,
    released_order: VecDeque<NodeId>,
    /// For each inode whose last cache-mode open saw it unchanged: what it
    /// saw. Dropped by an open for writing and by FORGET.
    cached: HashMap<NodeId, CacheKey>,
}

/// What tells a file's cached pages from stale ones: a write, a truncate
/// or any change of the inode moves ctime, and the others with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CacheKey {
    size: u64,
    mtime: Timestamp,
    ctime: Timestamp,
}

impl CacheKey {
    fn of(attr: &Attr) -> CacheKey {
        CacheKey {
            size: attr.size,
            mtime: attr.mtime,
            ctime: attr.ctime,
        }
    }
}

impl Table {
    fn remember_released(&mut self, node: NodeId) {
        if self.released_once.insert(node) {
            self.released_order.push_back(node);
        }
        if self.released_order.len() > IDLE_REGISTRATIONS {
            if let Some(old) = self.released_order.pop_front() {
                self.released_once.remove(&old);
            }
        }
    }

    /// Counts one more open of a node the table knows, and says how it is
    /// served (`None` when the node is unknown). The open of an idle node
    /// decides its mode again: through its kept registration when `passes`
    /// (the file system returned a whole map), else by the daemon.
    fn join(&mut self, node: NodeId, passes: bool) -> Option<Option<i32>> {
        let n = self.nodes.get_mut(&node)?;
        if n.opens == 0 {
            n.mode = if passes { Mode::Kernel } else { Mode::Daemon };
            if n.backing.is_some() {
                self.idle_count -= 1;
            }
        }
        n.opens += 1;
        Some(n.backing_id())
    }

    /// Closes the longest idle registrations beyond the limit; returns
    /// them so that the ioctls run outside the lock.
    fn evict(&mut self, closed: &mut Vec<BackingId>) {
        while self.idle_count > IDLE_REGISTRATIONS {
            let Some((node, since)) = self.idle.pop_front() else {
                break;
            };
            if let Some(n) = self.nodes.get(&node) {
                if n.opens == 0 && n.idle_since == since {
                    if let Some(n) = self.nodes.remove(&node) {
                        closed.extend(n.backing);
                    }
                    self.idle_count -= 1;
                }
            }
        }
        // Stale entries pile up when one inode is opened and closed in a
        // loop: drop them once they outnumber the live ones.
        if self.idle.len() > 2 * self.idle_count + 64 {
            let nodes = &self.nodes;
            self.idle
                .retain(|(node, since)| nodes.get(node).is_some_and(|n| n.opens == 0 && n.idle_since == *since));
        }
    }
}

/// The passthrough state of one connection, shared by its workers.
#[derive(Debug, Default)]
pub struct Passthrough {
    /// A descriptor of the session's /dev/fuse connection, given by the
    /// session before it serves requests.
    device: OnceLock<Arc<OwnedFd>>,
    /// Set once INIT negotiated `FUSE_PASSTHROUGH`.
    active: AtomicBool,
    table: Mutex<Table>,
    open_failure_logged: AtomicBool,
}

impl Passthrough {
    /// No backing files yet, and no device until a kernel session attaches one.
    pub fn new() -> Passthrough {
        Passthrough::default()
    }

    /// Gives the bookkeeping a descriptor of the session's connection (a
    /// duplicate of `dev` is kept). Only the first call counts.
    pub fn attach_device(&self, dev: BorrowedFd<'_>) -> io::Result<()> {
        if self.device.get().is_none() {
            let _ = self.device.set(Arc::new(dev.try_clone_to_owned()?));
        }
        Ok(())
    }

    /// Whether opens may be answered in passthrough: set at INIT when the
    /// kernel agreed to `FUSE_PASSTHROUGH`.
    pub fn set_active(&self, on: bool) {
        self.active.store(on, Ordering::Relaxed);
    }

    /// Whether a kernel session attached its device (passthrough can be used).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Records one successful OPEN/CREATE of a regular file on `node` whose
    /// file system returned `map`, and says how it is served: `Some(id)`
    /// for `FOPEN_PASSTHROUGH` with backing id `id`, `None` for the daemon.
    /// Every call that returns while active must be matched by one
    /// [`Passthrough::release`] of the same node.
    ///
    /// `access` says whether the open may write, and whether a read-only one
    /// may be served from the page cache instead (the reader cache).
    pub fn open(&self, node: NodeId, map: Option<&DataMap>, access: Access) -> Option<i32> {
        if !self.is_active() {
            return None;
        }
        let whole = map.and_then(DataMap::as_whole);
        let passes = whole.is_some() && access != Access::CachedRead;
        {
            let mut table = self.table.lock().unpoison();
            if access == Access::Write {
                // Whatever mode it gets, what it writes is not what the
                // page cache held at the last cache-mode open.
                table.cached.remove(&node);
            }
            if let Some(id) = table.join(node, passes) {
                return id;
            }
            if !passes {
                table.nodes.insert(node, Node::open(None, Mode::Daemon));
                return None;
            }
        }
        // The first open that passes through: register outside the lock
        // (an open of /proc and an ioctl), then publish, unless another
        // worker opened the inode meanwhile.
        let backing = whole.and_then(|file| self.register(file.as_fd()));
        let mut table = self.table.lock().unpoison();
        if let Some(id) = table.join(node, true) {
            drop(table);
            // The other worker's registration serves; ours is closed.
            drop(backing);
            return id;
        }
        let mode = if backing.is_some() { Mode::Kernel } else { Mode::Daemon };
        let n = Node::open(backing, mode);
        let id = n.backing_id();
        table.nodes.insert(node, n);
        id
    }

    /// Registers `file` through an `O_PATH` descriptor of its own (see the
    /// module's documentation); `None`, logged once, when that fails.
    fn register(&self, file: BorrowedFd<'_>) -> Option<BackingId> {
        let registered = match self.device.get() {
            Some(device) => sys::reopen_path(file).and_then(|path| BackingId::open(device, path.as_fd())),
            None => {
                if !self.open_failure_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!("passthrough negotiated but the session gave no /dev/fuse descriptor");
                }
                return None;
            }
        };
        match registered {
            Ok(id) => Some(id),
            Err(e) => {
                if !self.open_failure_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!("FUSE_DEV_IOC_BACKING_OPEN failed ({e}); such files are served by the daemon");
                }
                None
            }
        }
    }

    /// Records one RELEASE of `node`. After the last one the inode keeps
    /// its registration for later opens (see [`Passthrough::forget`]).
    pub fn release(&self, node: NodeId) {
        if !self.is_active() {
            return;
        }
        let mut closed = Vec::new();
        {
            let mut guard = self.table.lock().unpoison();
            let table = &mut *guard;
            table.clock += 1;
            let clock = table.clock;
            let Some(n) = table.nodes.get_mut(&node) else {
                // A release the table never saw (opened before INIT).
                return;
            };
            if n.opens > 1 {
                n.opens -= 1;
                return;
            }
            n.opens = 0;
            let keep = !n.forgotten && n.backing.is_some() && (n.kept || table.released_once.remove(&node));
            if !keep {
                if let Some(n) = table.nodes.remove(&node) {
                    let remember = !n.forgotten && n.backing.is_some();
                    closed.extend(n.backing);
                    if remember {
                        table.remember_released(node);
                    }
                }
            } else if let Some(n) = table.nodes.get_mut(&node) {
                n.kept = true;
                n.idle_since = clock;
                table.idle.push_back((node, clock));
                table.idle_count += 1;
                table.evict(&mut closed);
            }
        }
        // The ioctls run outside the lock.
        drop(closed);
    }

    /// Records a FORGET of `node`: the kernel has dropped its inode (or
    /// part of its lookups), so a kept registration is closed now, or at
    /// the last release of files still open. A file system may give the
    /// node's number to another file once it is forgotten.
    pub fn forget(&self, node: NodeId) {
        if !self.is_active() {
            return;
        }
        let closed = {
            let mut table = self.table.lock().unpoison();
            table.released_once.remove(&node);
            table.cached.remove(&node);
            match table.nodes.get_mut(&node) {
                Some(n) if n.opens > 0 => {
                    n.forgotten = true;
                    None
                }
                Some(_) => {
                    let n = table.nodes.remove(&node);
                    if n.as_ref().is_some_and(|n| n.backing.is_some()) {
                        table.idle_count -= 1;
                    }
                    n
                }
                None => None,
            }
        };
        drop(closed);
    }

    /// Inodes with open files, and how many of them are in passthrough.
    #[cfg(test)]
    pub fn open_inodes(&self) -> (usize, usize) {
        let table = self.table.lock().unpoison();
        let open = table.nodes.values().filter(|n| n.opens > 0);
        let kernel = open.clone().filter(|n| n.mode == Mode::Kernel).count();
        (open.count(), kernel)
    }

    /// Inodes without open files that keep a registration.
    #[cfg(test)]
    pub fn idle_registrations(&self) -> usize {
        let table = self.table.lock().unpoison();
        table
            .nodes
            .values()
            .filter(|n| n.opens == 0 && n.backing.is_some())
            .count()
    }

    /// Whether a read-only open of `node` served in daemon mode may keep the
    /// pages cached by earlier opens (`FOPEN_KEEP_CACHE`): yes when the file
    /// has `attr` (size, mtime, ctime) as at the previous such open and no
    /// open for writing came since. Records `attr` for the next one. Without
    /// the flag the kernel drops the inode's pages at the open.
    pub fn keeps_cache(&self, node: NodeId, attr: &Attr) -> bool {
        let key = CacheKey::of(attr);
        let mut table = self.table.lock().unpoison();
        table.cached.insert(node, key) == Some(key)
    }

    /// `fuse_open_out.open_flags` for a passthrough open: only the flags
    /// the kernel accepts together with `FOPEN_PASSTHROUGH` are kept
    /// (`FOPEN_KEEP_CACHE` would fail the open with EIO).
    pub fn open_flags(flags: u32) -> u32 {
        let allowed = abi::FOPEN_DIRECT_IO | abi::FOPEN_PARALLEL_DIRECT_WRITES | abi::FOPEN_NOFLUSH;
        (flags & allowed) | abi::FOPEN_PASSTHROUGH
    }
}

/// The /dev/fuse backing ioctls; every `unsafe` block of this module.
mod sys {
    use super::*;

    pub fn backing_open(device: BorrowedFd<'_>, file: BorrowedFd<'_>) -> io::Result<i32> {
        let map = abi::fuse_backing_map {
            fd: file.as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // SAFETY: both descriptors are open for the call; the kernel reads a
        // `struct fuse_backing_map` through the pointer, which points to a
        // live local of that layout.
        let ret = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                abi::FUSE_DEV_IOC_BACKING_OPEN as _,
                &map as *const abi::fuse_backing_map,
            )
        };
        if ret <= 0 {
            return Err(if ret == 0 {
                io::Error::other("backing id 0")
            } else {
                io::Error::last_os_error()
            });
        }
        Ok(ret)
    }

    /// An `O_PATH` descriptor of the file behind `fd`, through its
    /// `/proc/self/fd` link (the kernel offers no other way to drop a
    /// descriptor's access mode).
    pub fn reopen_path(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
        let path = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(io::Error::other)?;
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        let ret = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: open returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(ret) })
    }

    pub fn backing_close(device: BorrowedFd<'_>, id: i32) -> io::Result<()> {
        let id = id as u32;
        // SAFETY: the descriptor is open for the call; the kernel reads a u32
        // through the pointer, which points to a live local.
        let ret = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                abi::FUSE_DEV_IOC_BACKING_CLOSE as _,
                &id as *const u32,
            )
        };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn whole() -> DataMap {
        DataMap::whole(Arc::new(OwnedFd::from(File::open("/proc/self/exe").unwrap())))
    }

    #[test]
    fn inactive_records_nothing() {
        let p = Passthrough::new();
        assert_eq!(p.open(NodeId(2), Some(&whole()), Access::Read), None);
        p.release(NodeId(2));
        assert_eq!(p.open_inodes(), (0, 0));
    }

    #[test]
    fn first_open_decides_the_mode_until_the_last_release() {
        let p = Passthrough::new();
        p.set_active(true);
        // No device attached: a whole map cannot be registered, so the
        // inode is served by the daemon.
        assert_eq!(p.open(NodeId(2), None, Access::Read), None);
        assert_eq!(p.open(NodeId(2), Some(&whole()), Access::Read), None);
        assert_eq!(p.open_inodes(), (1, 0));
        p.release(NodeId(2));
        assert_eq!(p.open_inodes(), (1, 0));
        p.release(NodeId(2));
        assert_eq!(p.open_inodes(), (0, 0));
        // Without a registration nothing is kept after the last release.
        assert_eq!(p.idle_registrations(), 0);
        // A release the table never saw (opened before INIT) is ignored,
        // and so is a FORGET of a node never opened.
        p.release(NodeId(3));
        p.forget(NodeId(3));
        assert_eq!(p.open_inodes(), (0, 0));
    }

    #[test]
    fn a_forget_while_open_keeps_the_mode_until_the_last_release() {
        let p = Passthrough::new();
        p.set_active(true);
        assert_eq!(p.open(NodeId(2), None, Access::Read), None);
        p.forget(NodeId(2));
        assert_eq!(p.open_inodes(), (1, 0));
        assert_eq!(
            p.open(NodeId(2), Some(&whole()), Access::Read),
            None,
            "joins the daemon-mode open"
        );
        p.release(NodeId(2));
        p.release(NodeId(2));
        assert_eq!((p.open_inodes(), p.idle_registrations()), ((0, 0), 0));
    }

    #[test]
    fn passthrough_flags_drop_keep_cache() {
        let f = Passthrough::open_flags(abi::FOPEN_KEEP_CACHE | abi::FOPEN_DIRECT_IO | abi::FOPEN_NONSEEKABLE);
        assert_eq!(f, abi::FOPEN_DIRECT_IO | abi::FOPEN_PASSTHROUGH);
    }
}
