//! One node of the tree: its content, attributes and permission checks.

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use shortfuse::{Errno, FileType, Request, Result, Timestamp};

use super::data::FileData;
use super::dir::Dir;

use crate::xattr::Xattrs;

/// Bytes and inodes in use, shared with every inode so that dropping one
/// gives its blocks back.
#[derive(Default)]
pub(super) struct Usage {
    pub(super) blocks: AtomicU64,
}

impl Usage {
    pub(super) fn add(&self, delta: i64) {
        if delta >= 0 {
            self.blocks.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.blocks.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }
}

pub(super) enum Content {
    File(FileData),
    Dir(Dir),
    Symlink(Vec<u8>),
    /// Fifos, sockets and device nodes: attributes only.
    Special,
}

pub(super) struct State {
    /// Type and permission bits.
    pub(super) mode: u32,
    pub(super) nlink: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) rdev: u32,
    /// Bytes of a regular file (directories and symlinks compute theirs).
    pub(super) size: u64,
    pub(super) atime: Timestamp,
    pub(super) mtime: Timestamp,
    pub(super) ctime: Timestamp,
    pub(super) lookups: u64,
    pub(super) opens: u64,
    pub(super) xattrs: Xattrs,
    pub(super) content: Content,
}

impl State {
    pub(super) fn dir(&self) -> Result<&Dir> {
        match &self.content {
            Content::Dir(d) => Ok(d),
            _ => Err(Errno::ENOTDIR),
        }
    }

    pub(super) fn dir_mut(&mut self) -> Result<&mut Dir> {
        match &mut self.content {
            Content::Dir(d) => Ok(d),
            _ => Err(Errno::ENOTDIR),
        }
    }

    pub(super) fn is_dir(&self) -> bool {
        matches!(self.content, Content::Dir(_))
    }

    pub(super) fn is_free(&self) -> bool {
        self.nlink == 0 && self.lookups == 0 && self.opens == 0
    }

    pub(super) fn touch_modified(&mut self, now: Timestamp) {
        self.mtime = now;
        self.ctime = now;
    }

    /// `relatime`, the default mount option: update atime only when it is
    /// not newer than mtime or ctime, or a day old.
    pub(super) fn touch_accessed(&mut self) {
        let now = Timestamp::now();
        if self.atime <= self.mtime || self.atime <= self.ctime || now.sec - self.atime.sec >= 24 * 3600 {
            self.atime = now;
        }
    }

    /// Clears set-user-id, and set-group-id when group execution is on (a
    /// set-group-id bit without it marks mandatory locking), as the kernel
    /// does on chown.
    pub(super) fn kill_suidgid(&mut self) {
        self.mode &= !libc::S_ISUID;
        if self.mode & (libc::S_ISGID | libc::S_IXGRP) == (libc::S_ISGID | libc::S_IXGRP) {
            self.mode &= !libc::S_ISGID;
        }
    }

    /// What a write by an unprivileged user, or `FATTR_KILL_SUIDGID`,
    /// clears ([`Request::setid_bits_to_clear`]).
    pub(super) fn kill_suidgid_for(&mut self, req: &Request) {
        self.mode &= !req.setid_bits_to_clear(self.mode, self.gid);
    }

    /// Would `req` get `mask` (R_OK/W_OK/X_OK bits) on this inode?
    pub(super) fn permits(&self, req: &Request, mask: u32) -> bool {
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

    pub(super) fn check(&self, req: &Request, mask: u32) -> Result<()> {
        if self.permits(req, mask) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// The sticky-bit rule for removing or replacing `child` from this
    /// directory.
    pub(super) fn sticky_allows(&self, req: &Request, child_uid: u32) -> bool {
        self.mode & libc::S_ISVTX == 0 || req.uid == 0 || req.uid == self.uid || req.uid == child_uid
    }
}

/// What `make_node` creates.
pub(super) struct NodeSpec {
    pub(super) mode: u32,
    pub(super) rdev: u32,
    pub(super) content: Content,
    /// `create`: the new inode starts with one open handle.
    pub(super) opened: bool,
}

pub(super) struct Inode {
    pub(super) ino: u64,
    pub(super) typ: FileType,
    pub(super) usage: Arc<Usage>,
    pub(super) state: Mutex<State>,
}

impl Inode {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
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

pub(super) type Table = HashMap<u64, Arc<Inode>>;
