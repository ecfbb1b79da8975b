//! Open files and directories. The `fh` given to the kernel is a key into
//! this table, not a raw descriptor: a stale or forged handle can only miss
//! (`EBADF`), never reach a descriptor that was reused for something else,
//! and each handle remembers its node so a handle sent with the wrong node
//! is refused too.

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use shortfuse::{Errno, FileHandle, NodeId, Result};

/// Position of a directory stream between READDIR requests.
pub struct DirStream {
    /// Records from the last `getdents64`, consumed from `start` to `end`.
    pub buf: Vec<u8>,
    pub start: usize,
    pub end: usize,
    /// The offset cookie the next unread record follows (the `d_off` of
    /// the last record handed out, 0 at the start). A READDIR at this
    /// offset continues from the buffer; any other offset seeks.
    pub cookie: u64,
}

/// Size of the getdents64 buffer per directory handle.
const DIR_BUF: usize = 32 * 1024;

/// One open file or directory.
pub struct OpenFile {
    pub node: NodeId,
    /// Shared so that a `DataMap` can hand the same descriptor on.
    pub fd: Arc<OwnedFd>,
    /// Present for directories.
    dir: Option<Mutex<DirStream>>,
    /// Opened with `O_DIRECT`: data must pass through aligned memory.
    pub direct: bool,
}

impl OpenFile {
    pub fn file(node: NodeId, fd: Arc<OwnedFd>, flags: i32) -> OpenFile {
        OpenFile {
            node,
            fd,
            dir: None,
            direct: flags & libc::O_DIRECT != 0,
        }
    }

    pub fn dir(node: NodeId, fd: OwnedFd) -> OpenFile {
        OpenFile {
            node,
            fd: Arc::new(fd),
            dir: Some(Mutex::new(DirStream {
                buf: Vec::new(),
                start: 0,
                end: 0,
                cookie: 0,
            })),
            direct: false,
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The directory stream, `ENOTDIR` for a file handle. The kernel sends
    /// one READDIR at a time per open directory, so this lock is not
    /// contended; it only makes the state safe to share.
    pub fn dir_stream(&self) -> Result<MutexGuard<'_, DirStream>> {
        let dir = self.dir.as_ref().ok_or(Errno::ENOTDIR)?;
        let mut guard = dir.lock().unpoison();
        if guard.buf.is_empty() {
            guard.buf = vec![0u8; DIR_BUF];
        }
        Ok(guard)
    }
}

pub struct HandleTable {
    map: RwLock<HashMap<u64, Arc<OpenFile>>>,
    next: AtomicU64,
}

impl Default for HandleTable {
    fn default() -> HandleTable {
        HandleTable {
            map: RwLock::new(HashMap::new()),
            // 0 means "no handle" to the kernel-facing code: start at 1.
            next: AtomicU64::new(1),
        }
    }
}

impl HandleTable {
    pub fn insert(&self, file: OpenFile) -> FileHandle {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.map.write().unpoison().insert(fh, Arc::new(file));
        FileHandle(fh)
    }

    /// The open file behind `fh`, checked against the node it was opened on.
    pub fn get(&self, node: NodeId, fh: FileHandle) -> Result<Arc<OpenFile>> {
        let map = self.map.read().unpoison();
        match map.get(&fh.0) {
            Some(f) if f.node == node => Ok(f.clone()),
            _ => Err(Errno::EBADF),
        }
    }

    pub fn remove(&self, node: NodeId, fh: FileHandle) -> Result<Arc<OpenFile>> {
        let mut map = self.map.write().unpoison();
        match map.get(&fh.0) {
            Some(f) if f.node == node => Ok(map.remove(&fh.0).ok_or(Errno::EBADF)?),
            _ => Err(Errno::EBADF),
        }
    }

    pub fn count(&self) -> usize {
        self.map.read().unpoison().len()
    }
}
