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
//! - First open with a whole map: `FUSE_DEV_IOC_BACKING_OPEN` on the
//!   session's /dev/fuse fd; the inode is in passthrough mode and every later
//!   open of it is answered with the same backing id, whether or not that
//!   open returned a map (the kernel reopens the backing file with each
//!   open's own flags, so the descriptor's mode does not matter).
//! - First open without a whole map (or when registering the backing file
//!   fails): the inode is in daemon mode and every later open of it is
//!   served by the daemon too, even one that returns a whole map.
//! - Last release: the mode is forgotten and the backing id closed
//!   ([`BackingId`] closes it on drop). The kernel holds its own reference
//!   to the backing file for files still open, so closing the id early is
//!   safe.
//!
//! The cost is one mutex-protected hash lookup per OPEN, CREATE and RELEASE,
//! and none at all when passthrough was not negotiated.

use crate::sync::Unpoison;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use shortfuse_abi as abi;

use crate::datamap::DataMap;
use crate::types::NodeId;

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

/// How the open files of one inode are served.
#[derive(Debug)]
enum Mode {
    Kernel(BackingId),
    Daemon,
}

#[derive(Debug)]
struct OpenInode {
    mode: Mode,
    opens: u64,
}

/// The passthrough state of one connection, shared by its workers.
#[derive(Debug, Default)]
pub struct Passthrough {
    /// A descriptor of the session's /dev/fuse connection, given by the
    /// session before it serves requests.
    device: OnceLock<Arc<OwnedFd>>,
    /// Set once INIT negotiated `FUSE_PASSTHROUGH`.
    active: AtomicBool,
    nodes: Mutex<HashMap<NodeId, OpenInode>>,
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
    pub fn open(&self, node: NodeId, map: Option<&DataMap>) -> Option<i32> {
        if !self.is_active() {
            return None;
        }
        let mut nodes = self.nodes.lock().unpoison();
        if let Some(open) = nodes.get_mut(&node) {
            open.opens += 1;
            return match &open.mode {
                Mode::Kernel(id) => Some(id.id()),
                Mode::Daemon => None,
            };
        }
        let mode = match (map.and_then(DataMap::as_whole), self.device.get()) {
            (Some(file), Some(device)) => match BackingId::open(device, file.as_fd()) {
                Ok(id) => Mode::Kernel(id),
                Err(e) => {
                    if !self.open_failure_logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!("FUSE_DEV_IOC_BACKING_OPEN failed ({e}); such files are served by the daemon");
                    }
                    Mode::Daemon
                }
            },
            (Some(_), None) => {
                if !self.open_failure_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!("passthrough negotiated but the session gave no /dev/fuse descriptor");
                }
                Mode::Daemon
            }
            (None, _) => Mode::Daemon,
        };
        let id = match &mode {
            Mode::Kernel(id) => Some(id.id()),
            Mode::Daemon => None,
        };
        nodes.insert(node, OpenInode { mode, opens: 1 });
        id
    }

    /// Records one RELEASE of `node`; the last one forgets the inode's mode
    /// and closes its backing id.
    pub fn release(&self, node: NodeId) {
        if !self.is_active() {
            return;
        }
        let closed = {
            let mut nodes = self.nodes.lock().unpoison();
            match nodes.get_mut(&node) {
                Some(open) if open.opens > 1 => {
                    open.opens -= 1;
                    None
                }
                Some(_) => nodes.remove(&node),
                None => None,
            }
        };
        // The ioctl runs outside the lock.
        drop(closed);
    }

    /// Inodes with open files, and how many of them are in passthrough.
    #[cfg(test)]
    pub fn open_inodes(&self) -> (usize, usize) {
        let nodes = self.nodes.lock().unpoison();
        let kernel = nodes.values().filter(|o| matches!(o.mode, Mode::Kernel(_))).count();
        (nodes.len(), kernel)
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
        assert_eq!(p.open(NodeId(2), Some(&whole())), None);
        p.release(NodeId(2));
        assert_eq!(p.open_inodes(), (0, 0));
    }

    #[test]
    fn first_open_decides_the_mode_until_the_last_release() {
        let p = Passthrough::new();
        p.set_active(true);
        // No device attached: a whole map cannot be registered, so the
        // inode is served by the daemon.
        assert_eq!(p.open(NodeId(2), None), None);
        assert_eq!(p.open(NodeId(2), Some(&whole())), None);
        assert_eq!(p.open_inodes(), (1, 0));
        p.release(NodeId(2));
        assert_eq!(p.open_inodes(), (1, 0));
        p.release(NodeId(2));
        assert_eq!(p.open_inodes(), (0, 0));
        // A release the table never saw (opened before INIT) is ignored.
        p.release(NodeId(3));
        assert_eq!(p.open_inodes(), (0, 0));
    }

    #[test]
    fn passthrough_flags_drop_keep_cache() {
        let f = Passthrough::open_flags(abi::FOPEN_KEEP_CACHE | abi::FOPEN_DIRECT_IO | abi::FOPEN_NONSEEKABLE);
        assert_eq!(f, abi::FOPEN_DIRECT_IO | abi::FOPEN_PASSTHROUGH);
    }
}
