//! A user-space page cache in front of any [`Filesystem`]: [`CachedFs`].
//!
//! Meant for file systems whose reads are expensive (network, like `sftp`)
//! and whose data the kernel page cache does not already keep (transports
//! that bypass it, or `direct_io`); over a local passthrough it only
//! doubles the caching (seed 000).
//!
//! - Reads are served from pages of `page_size` bytes; a miss that
//!   continues the previous read of the same node fetches `readahead` pages
//!   in one call to the inner file system.
//! - Writes are write-back: they change cached pages and return; dirty
//!   pages go to the inner file system on `flush` (every `close(2)`),
//!   `fsync`, `release`, truncation, eviction and `destroy`.
//! - Close-to-open: `open` compares the inner size and mtime with what the
//!   cache last saw and drops the node's pages when they differ, so a change
//!   made elsewhere shows after reopening.
//!
//! One mutex covers the store and the per-node state, and write-backs run
//! under it: simple and correct first; the statistics tell whether it needs
//! splitting.

pub mod page;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::errno::{Errno, Result};
use crate::filesystem::{Filesystem, InitConfig};
use crate::types::*;

pub use page::Policy;
use page::{Page, PageStore};

/// How the cache is sized and behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Bytes per page (a power of two, at least 4 KiB).
    pub page_size: usize,
    /// Bytes of cached data at most.
    pub capacity: usize,
    pub policy: Policy,
    /// Pages fetched at once by a sequential miss (1 turns read-ahead off).
    pub readahead: usize,
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        CacheConfig {
            page_size: 128 * 1024,
            capacity: 256 << 20,
            policy: Policy::Clock,
            readahead: 8,
        }
    }
}

/// Counters for `shortfuse stats`.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub invalidations: AtomicU64,
    /// Bytes read from and written to the inner file system.
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

#[derive(Default)]
struct NodeState {
    /// The file's size as the cache knows it (including dirty data), once known.
    size: Option<u64>,
    /// Where the next sequential read would start.
    next: u64,
    /// Size and mtime the inner file system last reported.
    seen: Option<(u64, Timestamp)>,
}

struct State {
    pages: PageStore,
    nodes: HashMap<u64, NodeState>,
}

/// A [`Filesystem`] with a page cache in front of `F`. See the module docs.
pub struct CachedFs<F: Filesystem> {
    inner: F,
    config: CacheConfig,
    state: Mutex<State>,
    pub stats: CacheStats,
}

fn req0() -> Request {
    Request {
        unique: 0,
        uid: 0,
        gid: 0,
        pid: 0,
    }
}

impl<F: Filesystem> CachedFs<F> {
    pub fn new(inner: F, config: CacheConfig) -> std::result::Result<CachedFs<F>, String> {
        if !config.page_size.is_power_of_two() || config.page_size < 4096 {
            return Err(format!("page_size {} is not a power of two >= 4096", config.page_size));
        }
        if config.capacity < config.page_size || config.readahead == 0 {
            return Err("capacity must hold one page and readahead be at least 1".into());
        }
        let pages = PageStore::new(config.policy, config.capacity / config.page_size);
        Ok(CachedFs {
            inner,
            config,
            state: Mutex::new(State {
                pages,
                nodes: HashMap::new(),
            }),
            stats: CacheStats::default(),
        })
    }

    pub fn inner(&self) -> &F {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ps(&self) -> u64 {
        self.config.page_size as u64
    }

    fn write_back(&self, page: &mut Page) -> Result<()> {
        let Some((start, end, fh)) = page.dirty else {
            return Ok(());
        };
        let end = end.min(page.data.len());
        if start < end {
            let args = WriteArgs {
                offset: page.key.1 * self.ps() + start as u64,
                ..WriteArgs::default()
            };
            let n = self
                .inner
                .write(&req0(), NodeId(page.key.0), fh, &page.data[start..end], &args)?;
            if n != end - start {
                return Err(Errno::EIO);
            }
            self.stats.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        }
        page.dirty = None;
        Ok(())
    }

    fn insert(&self, st: &mut State, page: Page) -> Result<()> {
        if let Some(mut old) = st.pages.insert(page) {
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            self.write_back(&mut old)?;
        }
        Ok(())
    }

    /// Writes back every dirty page of `node` (of all nodes for `None`).
    fn flush_pages(&self, st: &mut State, node: Option<u64>) -> Result<()> {
        let keys = match node {
            Some(n) => st.pages.keys_of(n),
            None => st.pages.keys(),
        };
        let mut result = Ok(());
        for k in keys {
            if let Some(p) = st.pages.peek(k) {
                if let Err(e) = self.write_back(p) {
                    result = Err(e);
                }
            }
        }
        result
    }

    fn drop_pages(&self, st: &mut State, node: u64) {
        let keys = st.pages.keys_of(node);
        if !keys.is_empty() {
            self.stats.invalidations.fetch_add(1, Ordering::Relaxed);
        }
        for k in keys {
            st.pages.remove(k);
        }
    }

    fn has_dirty(st: &mut State, node: u64) -> bool {
        st.pages
            .keys_of(node)
            .into_iter()
            .any(|k| st.pages.peek(k).is_some_and(|p| p.dirty.is_some()))
    }

    /// Fills pages `first..first+count` of `node` from the inner file system.
    fn fill(&self, st: &mut State, node: NodeId, fh: FileHandle, first: u64, count: u64) -> Result<()> {
        let ps = self.ps();
        let mut buf = vec![0u8; (count * ps) as usize];
        let got = self.inner.read(&req0(), node, fh, first * ps, &mut buf)?;
        self.stats.bytes_in.fetch_add(got as u64, Ordering::Relaxed);
        let known = st.nodes.get(&node.0).and_then(|n| n.size);
        // Written-back-later data beyond the inner EOF reads as zeros.
        let end = match known {
            Some(size) => (got as u64).max(size.saturating_sub(first * ps).min(count * ps)),
            None => got as u64,
        };
        if known.is_none() && (got as u64) < count * ps {
            st.nodes.entry(node.0).or_default().size = Some(first * ps + got as u64);
        }
        for i in 0..count {
            let key = (node.0, first + i);
            if st.pages.peek(key).is_some() {
                continue;
            }
            let from = (i * ps).min(end);
            let to = ((i + 1) * ps).min(end);
            if from == to && i > 0 {
                break;
            }
            self.insert(st, Page::new(key, buf[from as usize..to as usize].to_vec()))?;
        }
        Ok(())
    }
}

impl<F: Filesystem> Filesystem for CachedFs<F> {
    fn init(&self, config: &mut InitConfig) -> Result<()> {
        self.inner.init(config)
    }

    fn destroy(&self) {
        let mut st = self.lock();
        let _ = self.flush_pages(&mut st, None);
        drop(st);
        self.inner.destroy();
    }

    fn lookup(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        let mut e = self.inner.lookup(req, parent, name)?;
        let mut st = self.lock();
        if Self::has_dirty(&mut st, e.node.0) {
            if let Some(size) = st.nodes.get(&e.node.0).and_then(|n| n.size) {
                e.attr.size = size;
            }
        }
        Ok(e)
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        self.inner.forget(node, nlookup)
    }

    fn batch_forget(&self, forgets: &[Forget]) {
        self.inner.batch_forget(forgets)
    }

    fn getattr(&self, req: &Request, node: NodeId, fh: Option<FileHandle>) -> Result<Attr> {
        let mut a = self.inner.getattr(req, node, fh)?;
        let mut st = self.lock();
        if Self::has_dirty(&mut st, node.0) {
            if let Some(size) = st.nodes.get(&node.0).and_then(|n| n.size) {
                a.size = size;
                a.blocks = size.div_ceil(512);
            }
        }
        Ok(a)
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        let mut st = self.lock();
        if set.size.is_some() {
            self.flush_pages(&mut st, Some(node.0))?;
            self.drop_pages(&mut st, node.0);
            st.nodes.remove(&node.0);
        }
        drop(st);
        self.inner.setattr(req, node, set)
    }

    fn readlink(&self, req: &Request, node: NodeId) -> Result<Vec<u8>> {
        self.inner.readlink(req, node)
    }

    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        self.inner.symlink(req, parent, name, target)
    }

    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        self.inner.mknod(req, parent, name, new)
    }

    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        self.inner.mkdir(req, parent, name, new)
    }

    fn unlink(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.inner.unlink(req, parent, name)
    }

    fn rmdir(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.inner.rmdir(req, parent, name)
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
        self.inner.rename(req, parent, name, new_parent, new_name, flags)
    }

    fn link(&self, req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry> {
        self.inner.link(req, node, new_parent, new_name)
    }

    fn open(&self, req: &Request, node: NodeId, flags: i32) -> Result<Opened> {
        let opened = self.inner.open(req, node, flags)?;
        let mut st = self.lock();
        if flags & libc::O_TRUNC != 0 {
            self.drop_pages(&mut st, node.0);
            st.nodes.remove(&node.0);
        } else if !Self::has_dirty(&mut st, node.0) {
            // Close-to-open: the file changed elsewhere since we cached it.
            let now = self
                .inner
                .getattr(req, node, Some(opened.fh))
                .map(|a| (a.size, a.mtime))
                .ok();
            let ns = st.nodes.entry(node.0).or_default();
            if now.is_none() || ns.seen != now {
                ns.seen = now;
                ns.size = now.map(|n| n.0);
                self.drop_pages(&mut st, node.0);
            }
        }
        Ok(opened)
    }

    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, flags: i32) -> Result<Created> {
        let c = self.inner.create(req, parent, name, new, flags)?;
        let mut st = self.lock();
        self.drop_pages(&mut st, c.entry.node.0);
        st.nodes.insert(
            c.entry.node.0,
            NodeState {
                size: Some(c.entry.attr.size),
                next: 0,
                seen: Some((c.entry.attr.size, c.entry.attr.mtime)),
            },
        );
        Ok(c)
    }

    fn read(&self, _req: &Request, node: NodeId, fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let ps = self.ps();
        let mut st = self.lock();
        let sequential = st.nodes.get(&node.0).is_some_and(|n| n.next == offset && offset > 0);
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (idx, within) = (pos / ps, (pos % ps) as usize);
            if st.pages.get((node.0, idx)).is_some() {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                let wanted = (buf.len() - done).div_ceil(self.config.page_size) as u64;
                let count = if sequential || offset == 0 {
                    wanted.max(self.config.readahead as u64)
                } else {
                    wanted.max(1)
                };
                // Never more than half the cache: the pages must survive
                // until copied out.
                let room = (self.config.capacity / self.config.page_size / 2).max(1) as u64;
                self.fill(&mut st, node, fh, idx, count.min(room))?;
            }
            let Some(page) = st.pages.get((node.0, idx)) else {
                break;
            };
            if within >= page.data.len() {
                break;
            }
            let n = (page.data.len() - within).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&page.data[within..within + n]);
            let short = page.data.len() < self.config.page_size;
            done += n;
            if short && within + n >= page.data.len() {
                break;
            }
        }
        st.nodes.entry(node.0).or_default().next = offset + done as u64;
        Ok(done)
    }

    fn write(&self, _req: &Request, node: NodeId, fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        if args.flags & libc::O_APPEND as u32 != 0 {
            // The inner file system decides where appends land.
            let mut st = self.lock();
            self.flush_pages(&mut st, Some(node.0))?;
            self.drop_pages(&mut st, node.0);
            st.nodes.remove(&node.0);
            drop(st);
            return self.inner.write(&req0(), node, fh, data, args);
        }
        let ps = self.ps();
        let mut st = self.lock();
        let size = match st.nodes.get(&node.0).and_then(|n| n.size) {
            Some(s) => s,
            None => {
                let s = self.inner.getattr(&req0(), node, Some(fh))?.size;
                st.nodes.entry(node.0).or_default().size = Some(s);
                s
            }
        };
        let end = args.offset + data.len() as u64;
        // The old last page grows to the page size (zeros) when the file
        // grows past it.
        if end > size && size % ps != 0 {
            if let Some(p) = st.pages.peek((node.0, size / ps)) {
                let upto = if end / ps > size / ps {
                    ps as usize
                } else {
                    (args.offset % ps) as usize
                };
                if p.data.len() < upto {
                    p.data.resize(upto, 0);
                }
            }
        }
        let mut done = 0usize;
        while done < data.len() {
            let pos = args.offset + done as u64;
            let (idx, within) = (pos / ps, (pos % ps) as usize);
            let n = (self.config.page_size - within).min(data.len() - done);
            if st.pages.peek((node.0, idx)).is_none() {
                let page_start = idx * ps;
                let whole = within == 0 && n == self.config.page_size;
                if whole || page_start >= size {
                    self.insert(&mut st, Page::new((node.0, idx), Vec::new()))?;
                } else {
                    self.fill(&mut st, node, fh, idx, 1)?;
                    if st.pages.peek((node.0, idx)).is_none() {
                        self.insert(&mut st, Page::new((node.0, idx), Vec::new()))?;
                    }
                }
            }
            let page = st.pages.get((node.0, idx)).ok_or(Errno::EIO)?;
            if page.data.len() < within + n {
                page.data.resize(within + n, 0);
            }
            page.data[within..within + n].copy_from_slice(&data[done..done + n]);
            page.mark_dirty(within, within + n, fh);
            done += n;
        }
        let ns = st.nodes.entry(node.0).or_default();
        ns.size = Some(size.max(end));
        Ok(data.len())
    }

    fn flush(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64) -> Result<()> {
        let mut st = self.lock();
        self.flush_pages(&mut st, Some(node.0))?;
        drop(st);
        match self.inner.flush(req, node, fh, lock_owner) {
            Err(e) if e == Errno::ENOSYS => Ok(()),
            r => r,
        }
    }

    fn release(&self, req: &Request, node: NodeId, fh: FileHandle, args: &ReleaseArgs) -> Result<()> {
        let mut st = self.lock();
        let r = self.flush_pages(&mut st, Some(node.0));
        // What the inner file system now holds is what the cache saw.
        if let Some(ns) = st.nodes.get_mut(&node.0) {
            ns.seen = None;
        }
        drop(st);
        let inner = self.inner.release(req, node, fh, args);
        r.and(inner)
    }

    fn fsync(&self, req: &Request, node: NodeId, fh: FileHandle, datasync: bool) -> Result<()> {
        let mut st = self.lock();
        self.flush_pages(&mut st, Some(node.0))?;
        drop(st);
        match self.inner.fsync(req, node, fh, datasync) {
            Err(e) if e == Errno::ENOSYS => Ok(()),
            r => r,
        }
    }

    fn opendir(&self, req: &Request, node: NodeId, flags: i32) -> Result<Opened> {
        self.inner.opendir(req, node, flags)
    }

    fn readdir(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, sink: &mut dyn DirSink) -> Result<()> {
        self.inner.readdir(req, node, fh, offset, sink)
    }

    fn readdirplus(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> Result<()> {
        self.inner.readdirplus(req, node, fh, offset, sink)
    }

    fn releasedir(&self, req: &Request, node: NodeId, fh: FileHandle, flags: u32) -> Result<()> {
        self.inner.releasedir(req, node, fh, flags)
    }

    fn fsyncdir(&self, req: &Request, node: NodeId, fh: FileHandle, datasync: bool) -> Result<()> {
        self.inner.fsyncdir(req, node, fh, datasync)
    }

    fn statfs(&self, req: &Request, node: NodeId) -> Result<Statfs> {
        self.inner.statfs(req, node)
    }

    fn setxattr(&self, req: &Request, node: NodeId, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.inner.setxattr(req, node, name, value, flags)
    }

    fn getxattr(&self, req: &Request, node: NodeId, name: &OsStr) -> Result<Vec<u8>> {
        self.inner.getxattr(req, node, name)
    }

    fn listxattr(&self, req: &Request, node: NodeId) -> Result<Vec<u8>> {
        self.inner.listxattr(req, node)
    }

    fn removexattr(&self, req: &Request, node: NodeId, name: &OsStr) -> Result<()> {
        self.inner.removexattr(req, node, name)
    }

    fn access(&self, req: &Request, node: NodeId, mask: i32) -> Result<()> {
        self.inner.access(req, node, mask)
    }

    fn getlk(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, lock: &Lock) -> Result<Lock> {
        self.inner.getlk(req, node, fh, lock_owner, lock)
    }

    fn setlk(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        lock_owner: u64,
        lock: &Lock,
        sleep: bool,
    ) -> Result<()> {
        self.inner.setlk(req, node, fh, lock_owner, lock, sleep)
    }

    fn flock(&self, req: &Request, node: NodeId, fh: FileHandle, lock_owner: u64, op: i32) -> Result<()> {
        self.inner.flock(req, node, fh, lock_owner, op)
    }

    fn fallocate(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<()> {
        let mut st = self.lock();
        self.flush_pages(&mut st, Some(node.0))?;
        self.drop_pages(&mut st, node.0);
        st.nodes.remove(&node.0);
        drop(st);
        self.inner.fallocate(req, node, fh, offset, length, mode)
    }

    fn lseek(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, whence: i32) -> Result<u64> {
        let mut st = self.lock();
        self.flush_pages(&mut st, Some(node.0))?;
        drop(st);
        self.inner.lseek(req, node, fh, offset, whence)
    }

    fn copy_file_range(&self, req: &Request, range: &CopyRange) -> Result<usize> {
        let mut st = self.lock();
        self.flush_pages(&mut st, Some(range.node_in.0))?;
        self.flush_pages(&mut st, Some(range.node_out.0))?;
        self.drop_pages(&mut st, range.node_out.0);
        st.nodes.remove(&range.node_out.0);
        drop(st);
        self.inner.copy_file_range(req, range)
    }
}

#[cfg(test)]
mod tests;
