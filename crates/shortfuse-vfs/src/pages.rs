//! The in-process page cache (Prefuse's cache, from the Prefuse-SSHFS caching thesis, done again): file
//! pages kept in the program's own memory, so that a read the cache holds
//! costs no request at all. The pages live in `shortfuse`'s [`PageStore`],
//! the store the daemon's cache tier uses too.
//!
//! - Write-through: a write goes to the file system first, then updates
//!   the pages the cache holds (whole pages written are added), so nothing
//!   waits in the process when it exits.
//! - Read-ahead: a miss that continues the previous read of the node (or
//!   starts at 0) fetches `readahead` pages in one request.
//! - Reads are clipped at the end of file the cache knows (the size seen at
//!   open, then moved by this process's writes and truncations): nothing is
//!   asked for past it (the metadata-cache trick of the Prefuse-SSHFS caching thesis: the last read of
//!   a file is as short as the file, and a read at EOF costs nothing).
//! - Close-to-open: at open, the size and mtime the file system reports are
//!   compared with what the cache last saw; pages of a file changed
//!   elsewhere, or changed too recently to tell (`shortfuse::cache::seen`),
//!   are dropped. Within an open, this process's view is its
//!   pages.
//!
//! Files opened with a data map never come here: their data is in backing
//! files the kernel page cache already holds (the mount turns its maps off
//! when the cache is on). The lock is never held across a request: a fetch
//! records the node's generation, and its pages are kept only when no
//! write, truncation or invalidation of the node came in between.

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};

use shortfuse::cache::page::{Page, PageStore};
use shortfuse::cache::{CacheConfig, CacheStats, Seen};
use shortfuse::{Attr, Errno, NodeId};

#[derive(Default)]
struct NodeInfo {
    /// The file's size as this process knows it, once known.
    size: Option<u64>,
    /// Size and mtime last seen from the file system, and when.
    seen: Option<Seen>,
    /// Where the next sequential read would start.
    next: u64,
    /// Bumped by every change to the node's pages.
    generation: u64,
    /// This process wrote since `seen` was taken.
    wrote: bool,
    /// Pages of the node in the store (a node without any costs no scan).
    pages: usize,
}

struct Inner {
    pages: PageStore,
    nodes: HashMap<u64, NodeInfo>,
}

/// One mount's page cache. See the module docs.
pub struct PageCache {
    config: CacheConfig,
    inner: Mutex<Inner>,
    stats: Arc<CacheStats>,
}

impl PageCache {
    pub fn new(config: CacheConfig) -> Result<PageCache, String> {
        config.check()?;
        Ok(PageCache {
            config,
            inner: Mutex::new(Inner {
                pages: PageStore::new(config.policy, config.pages()),
                nodes: HashMap::new(),
            }),
            stats: Arc::new(CacheStats::default()),
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn stats(&self) -> &Arc<CacheStats> {
        &self.stats
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unpoison()
    }

    fn ps(&self) -> u64 {
        self.config.page_size as u64
    }

    fn drop_node(&self, inner: &mut Inner, node: u64) {
        self.drop_from(inner, node, 0);
    }

    /// Drops the pages of `node` from page `first` on.
    fn drop_from(&self, inner: &mut Inner, node: u64, first: u64) {
        if inner.nodes.get(&node).is_some_and(|i| i.pages == 0) {
            return;
        }
        let n = inner.pages.drop_from(node, first);
        if n > 0 {
            self.stats.invalidations.fetch_add(1, Relaxed);
            if let Some(i) = inner.nodes.get_mut(&node) {
                i.pages = i.pages.saturating_sub(n);
            }
        }
    }

    /// An open of `node` whose attributes the file system just reported:
    /// drops its pages when the file changed since the cache saw it.
    pub fn opened(&self, node: NodeId, attr: &Attr) {
        let mut inner = self.lock();
        let now = Seen::now(attr);
        let info = inner.nodes.entry(node.0).or_default();
        let changed = !info.seen.is_some_and(|old| old.still_holds(&now));
        info.seen = Some(now);
        info.size = Some(attr.size);
        info.wrote = false;
        if changed {
            info.generation += 1;
            self.drop_node(&mut inner, node.0);
        }
    }

    /// Whether this process wrote `node` since it last saw its attributes
    /// (then [`PageCache::seen`] should record them at close).
    pub fn wrote_since_seen(&self, node: NodeId) -> bool {
        self.lock().nodes.get(&node.0).is_some_and(|i| i.wrote)
    }

    /// The attributes after this process's own changes: not a change
    /// made elsewhere at the next open.
    pub fn seen(&self, node: NodeId, attr: &Attr) {
        if let Some(i) = self.lock().nodes.get_mut(&node.0) {
            i.seen = Some(Seen::now(attr));
            i.wrote = false;
        }
    }

    /// Drops everything known about `node` (a change the cache cannot
    /// follow: fallocate, a failed write).
    pub fn invalidate(&self, node: NodeId) {
        let mut inner = self.lock();
        self.drop_node(&mut inner, node.0);
        let info = inner.nodes.entry(node.0).or_default();
        info.generation += 1;
        info.size = None;
        info.seen = None;
    }

    /// `node` was forgotten by the file system: its number may name
    /// another file later.
    pub fn forget(&self, node: NodeId) {
        let mut inner = self.lock();
        if inner.nodes.contains_key(&node.0) {
            self.drop_node(&mut inner, node.0);
            inner.nodes.remove(&node.0);
        }
    }

    /// Reads `buf.len()` bytes at `offset` through the cache; `fetch`
    /// reads from the file system (until its buffer is full or end of
    /// file). Returns the bytes read, short only at end of file.
    pub fn read(
        &self,
        node: NodeId,
        offset: u64,
        buf: &mut [u8],
        mut fetch: impl FnMut(u64, &mut [u8]) -> Result<usize, Errno>,
    ) -> Result<usize, Errno> {
        let ps = self.ps();
        let mut done = 0usize;
        let sequential;
        let len = {
            let inner = self.lock();
            let info = inner.nodes.get(&node.0);
            sequential = info.is_some_and(|i| i.next == offset && offset > 0) || offset == 0;
            match info.and_then(|i| i.size) {
                Some(size) if offset >= size => 0,
                Some(size) => buf.len().min((size - offset).try_into().unwrap_or(usize::MAX)),
                None => buf.len(),
            }
        };
        let buf = &mut buf[..len];
        let mut eof = false;
        while done < buf.len() && !eof {
            let pos = offset + done as u64;
            let (idx, within) = (pos / ps, (pos % ps) as usize);
            let (count, generation) = {
                let mut inner = self.lock();
                if let Some(page) = inner.pages.get((node.0, idx)) {
                    self.stats.hits.fetch_add(1, Relaxed);
                    let n = page.data.len().saturating_sub(within).min(buf.len() - done);
                    buf[done..done + n].copy_from_slice(&page.data[within..within + n]);
                    done += n;
                    // A short page holds the end of the file.
                    eof = n == 0 || (page.data.len() < self.config.page_size && within + n >= page.data.len());
                    continue;
                }
                self.stats.misses.fetch_add(1, Relaxed);
                let info = inner.nodes.entry(node.0).or_default();
                let wanted = (buf.len() - done + within).div_ceil(self.config.page_size) as u64;
                let mut count = if sequential {
                    wanted.max(self.config.readahead as u64)
                } else {
                    wanted
                };
                if let Some(size) = info.size {
                    count = count.min(size.div_ceil(ps).saturating_sub(idx).max(1));
                }
                // Half the cache at most: a fetch must not evict itself.
                (count.min((self.config.pages() / 2).max(1) as u64), info.generation)
            };
            let mut tmp = vec![0u8; (count * ps) as usize];
            let got = fetch(idx * ps, &mut tmp)?;
            self.stats.bytes_in.fetch_add(got as u64, Relaxed);
            let n = got.saturating_sub(within).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&tmp[within.min(got)..within.min(got) + n]);
            done += n;
            eof = got < tmp.len() && within + n >= got;
            let mut inner = self.lock();
            let current = inner.nodes.get(&node.0).is_some_and(|i| i.generation == generation);
            if !current {
                continue;
            }
            if got < tmp.len() {
                if let Some(info) = inner.nodes.get_mut(&node.0) {
                    info.size.get_or_insert(idx * ps + got as u64);
                }
            }
            for i in 0..count {
                let from = ((i * ps) as usize).min(got);
                let to = (((i + 1) * ps) as usize).min(got);
                if from == to && i > 0 {
                    break;
                }
                if inner.pages.peek((node.0, idx + i)).is_none() {
                    self.insert(&mut inner, Page::new((node.0, idx + i), tmp[from..to].to_vec()));
                }
            }
        }
        if let Some(info) = self.lock().nodes.get_mut(&node.0) {
            info.next = offset + done as u64;
        }
        Ok(done)
    }

    fn insert(&self, inner: &mut Inner, page: Page) {
        inner.nodes.entry(page.key.0).or_default().pages += 1;
        if let Some(old) = inner.pages.insert(page) {
            self.stats.evictions.fetch_add(1, Relaxed);
            if let Some(i) = inner.nodes.get_mut(&old.key.0) {
                i.pages = i.pages.saturating_sub(1);
            }
        }
    }

    /// `data` reached the file system at `offset` (write-through): the
    /// cached pages take it too, and whole pages are added.
    pub fn wrote(&self, node: NodeId, offset: u64, data: &[u8]) {
        let ps = self.ps();
        self.stats.bytes_out.fetch_add(data.len() as u64, Relaxed);
        let mut inner = self.lock();
        let info = inner.nodes.entry(node.0).or_default();
        info.generation += 1;
        info.wrote = true;
        let end = offset + data.len() as u64;
        let Some(size) = info.size else {
            // Where the file ended is unknown, so is what a gap holds.
            self.drop_node(&mut inner, node.0);
            return;
        };
        info.size = Some(size.max(end));
        // The old last page grows with zeros when the file grows past it.
        if end > size && size % ps != 0 {
            if let Some(p) = inner.pages.peek((node.0, size / ps)) {
                let upto = if offset / ps > size / ps {
                    ps as usize
                } else {
                    (offset % ps) as usize
                };
                if p.data.len() < upto {
                    p.data.resize(upto, 0);
                }
            }
        }
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let (idx, within) = (pos / ps, (pos % ps) as usize);
            let n = (self.config.page_size - within).min(data.len() - done);
            let chunk = &data[done..done + n];
            match inner.pages.peek((node.0, idx)) {
                Some(p) if p.data.len() >= within => {
                    if p.data.len() < within + n {
                        p.data.resize(within + n, 0);
                    }
                    p.data[within..within + n].copy_from_slice(chunk);
                }
                Some(_) => {
                    inner.pages.remove((node.0, idx));
                    if let Some(i) = inner.nodes.get_mut(&node.0) {
                        i.pages = i.pages.saturating_sub(1);
                    }
                }
                None if within == 0 && (n == self.config.page_size || pos + n as u64 >= size.max(end)) => {
                    self.insert(&mut inner, Page::new((node.0, idx), chunk.to_vec()));
                }
                None => {}
            }
            done += n;
        }
    }

    /// The file was truncated (or extended) to `size`.
    pub fn truncated(&self, node: NodeId, size: u64) {
        let ps = self.ps();
        let mut inner = self.lock();
        let info = inner.nodes.entry(node.0).or_default();
        info.generation += 1;
        info.wrote = true;
        let old = info.size.replace(size);
        self.drop_from(&mut inner, node.0, size.div_ceil(ps));
        let last = (node.0, size / ps);
        let within = (size % ps) as usize;
        match old {
            // Growing: the old last page reads zeros up to the new end.
            Some(old) if size > old => {
                if let Some(p) = inner.pages.peek((node.0, old / ps)) {
                    let upto = if size / ps > old / ps { ps as usize } else { within };
                    if p.data.len() < upto {
                        p.data.resize(upto, 0);
                    }
                }
            }
            Some(_) => {
                if let Some(p) = inner.pages.peek(last) {
                    p.data.truncate(within);
                }
            }
            None => self.drop_node(&mut inner, node.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shortfuse::Timestamp;
    use std::cell::RefCell;

    const PS: usize = 4096;

    fn cache(pages: usize, readahead: usize) -> PageCache {
        PageCache::new(CacheConfig {
            page_size: PS,
            capacity: pages * PS,
            readahead,
            ..CacheConfig::default()
        })
        .unwrap()
    }

    /// A file in memory, counting the fetches that reach it.
    struct File {
        data: RefCell<Vec<u8>>,
        fetches: RefCell<Vec<(u64, usize)>>,
    }

    impl File {
        fn new(data: Vec<u8>) -> File {
            File {
                data: RefCell::new(data),
                fetches: RefCell::new(Vec::new()),
            }
        }

        fn attr(&self, mtime: i64) -> Attr {
            Attr {
                size: self.data.borrow().len() as u64,
                mtime: Timestamp { sec: mtime, nsec: 0 },
                ..Attr::default()
            }
        }

        fn read(&self, c: &PageCache, off: u64, len: usize) -> Vec<u8> {
            let mut buf = vec![0u8; len];
            let n = c
                .read(NodeId(5), off, &mut buf, |o, b| {
                    self.fetches.borrow_mut().push((o, b.len()));
                    let d = self.data.borrow();
                    let s = (o as usize).min(d.len());
                    let n = (d.len() - s).min(b.len());
                    b[..n].copy_from_slice(&d[s..s + n]);
                    Ok(n)
                })
                .unwrap();
            buf.truncate(n);
            buf
        }

        fn write(&self, c: &PageCache, off: usize, data: &[u8]) {
            let mut d = self.data.borrow_mut();
            if d.len() < off + data.len() {
                d.resize(off + data.len(), 0);
            }
            d[off..off + data.len()].copy_from_slice(data);
            drop(d);
            c.wrote(NodeId(5), off as u64, data);
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 13 + i / PS) as u8).collect()
    }

    #[test]
    fn reads_hit_read_ahead_and_stop_at_the_known_end() {
        let f = File::new(pattern(10 * PS + 10));
        let c = cache(64, 4);
        c.opened(NodeId(5), &f.attr(1));
        let mut all = Vec::new();
        for i in 0..11 {
            all.extend(f.read(&c, (i * PS) as u64, PS));
        }
        assert!(all == *f.data.borrow());
        // 4 pages, 4 pages, then the 3 that are left (clipped at EOF).
        assert_eq!(
            *f.fetches.borrow(),
            vec![(0, 4 * PS), (4 * PS as u64, 4 * PS), (8 * PS as u64, 3 * PS)]
        );
        f.fetches.borrow_mut().clear();
        assert_eq!(f.read(&c, 5, 100), f.data.borrow()[5..105]);
        assert_eq!(f.read(&c, 10 * PS as u64 + 10, PS), b"", "at EOF: nothing asked");
        assert!(f.fetches.borrow().is_empty(), "{:?}", f.fetches.borrow());
        assert_eq!((c.stats().hits.load(Relaxed), c.stats().misses.load(Relaxed)), (9, 3));
    }

    #[test]
    fn writes_go_through_and_truncation_cuts() {
        let f = File::new(pattern(3 * PS));
        let c = cache(64, 1);
        c.opened(NodeId(5), &f.attr(1));
        assert_eq!(f.read(&c, 0, 3 * PS), *f.data.borrow());
        f.write(&c, 100, b"overwrite");
        // Past the end, leaving a gap of zeros; a whole new page is kept.
        f.write(&c, 5 * PS, &[7u8; PS]);
        let before = f.fetches.borrow().len();
        assert!(f.read(&c, 0, 6 * PS) == *f.data.borrow());
        assert_eq!(f.fetches.borrow().len(), before + 1, "only the gap page is fetched");
        c.truncated(NodeId(5), PS as u64 + 1);
        f.data.borrow_mut().truncate(PS + 1);
        assert!(f.read(&c, 0, 6 * PS) == *f.data.borrow());
        c.truncated(NodeId(5), 2 * PS as u64);
        f.data.borrow_mut().resize(2 * PS, 0);
        assert!(f.read(&c, 0, 6 * PS) == *f.data.borrow(), "grown: zeros");
    }

    #[test]
    fn a_change_elsewhere_shows_after_reopen_and_eviction_bounds() {
        let f = File::new(pattern(2 * PS));
        let c = cache(4, 1);
        c.opened(NodeId(5), &f.attr(1));
        assert_eq!(f.read(&c, 0, 2 * PS), *f.data.borrow());
        f.data.borrow_mut()[..17].copy_from_slice(b"changed elsewhere");
        c.opened(NodeId(5), &f.attr(1));
        assert_ne!(f.read(&c, 0, 17), b"changed elsewhere", "same size and mtime: kept");
        c.opened(NodeId(5), &f.attr(2));
        assert_eq!(f.read(&c, 0, 17), b"changed elsewhere");
        assert!(c.stats().invalidations.load(Relaxed) > 0);
        let big = File::new(pattern(32 * PS));
        c.opened(NodeId(5), &big.attr(3));
        for i in [0u64, 9, 20, 31, 2] {
            assert_eq!(
                big.read(&c, i * PS as u64, 10),
                big.data.borrow()[i as usize * PS..][..10]
            );
        }
        assert!(c.stats().evictions.load(Relaxed) >= 1);
        assert!(c.lock().pages.len() <= 4);
    }

    #[test]
    fn a_write_during_a_fetch_keeps_its_pages_out() {
        let f = File::new(pattern(2 * PS));
        let c = cache(8, 1);
        c.opened(NodeId(5), &f.attr(1));
        let mut buf = vec![0u8; PS];
        c.read(NodeId(5), 0, &mut buf, |_, b| {
            // Another thread writes while this fetch is out.
            c.wrote(NodeId(5), 0, b"new");
            b.fill(1);
            Ok(b.len())
        })
        .unwrap();
        assert!(c.lock().pages.peek((5, 0)).is_none(), "a stale page was kept");
    }
}
