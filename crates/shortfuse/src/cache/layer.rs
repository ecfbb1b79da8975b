//! The requests, as the cache answers them.

use std::ffi::OsStr;
use std::sync::atomic::Ordering;

use super::ahead::Pending;
use super::io::dirty_len;
use super::meta::MetaCache;
use super::page::Page;
use super::seen::Seen;
use super::state::NodeState;
use super::{req0, CachedFs};
use crate::errno::{Errno, Result};
use crate::filesystem::Filesystem;
use crate::sync::Unpoison;
use crate::types::*;

/// Opens with `open`, a write-only open made readable as the kernel does
/// under its write-back cache: a write of part of a page the cache does
/// not hold must read the rest. A file the caller may write but not read
/// is opened as asked; true then, and its writes go straight through.
pub(super) fn readable<T>(flags: OpenFlags, open: impl Fn(OpenFlags) -> Result<T>) -> Result<(T, bool)> {
    if flags.access_mode() != OpenFlags::WRONLY {
        return open(flags).map(|o| (o, false));
    }
    match open(flags.with_access_mode(OpenFlags::RDWR)) {
        Err(e) if e == Errno::EACCES || e == Errno::EPERM => open(flags).map(|o| (o, true)),
        r => r.map(|o| (o, false)),
    }
}

/// The cache holds what a writer wrote until its FLUSH, so the close of an
/// open that may write must send one, whatever the inner file system said
/// (passthrough marks writers on a local source NOFLUSH: it has nothing to
/// report at close, but the cache has pages to write back).
fn flush_writes(flags: OpenFlags, opened: &mut Opened) {
    if flags.access_mode() != OpenFlags::RDONLY {
        opened.flags.noflush = false;
    }
}

/// Misses that fetch without the lock before one fetches holding it (a
/// file written all the time would otherwise keep its readers fetching).
const UNLOCKED_TRIES: u32 = 3;

impl<F: Filesystem + ?Sized> crate::layer::Layer for CachedFs<F> {
    type Inner = F;

    fn inner(&self) -> &F {
        &self.inner
    }

    fn destroy(&self) {
        let _ = self.flush_all();
        self.inner.destroy();
    }

    /// None: the cache may hold what the inner file system's backing
    /// directory does not show yet (dirty pages, sizes), so path calls must
    /// come here.
    fn namespace_map(&self) -> Option<crate::NamespaceMap> {
        None
    }

    /// ENODEV: the data must pass through the cache, which a map of the
    /// inner file system's bytes would go around (as `open` drops the
    /// data map).
    fn map_file(&self, _node: NodeId, _fh: FileHandle) -> Result<crate::BackingFile> {
        Err(crate::Errno::ENODEV)
    }

    fn lookup(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        let now = MetaCache::now();
        let cached = {
            let mut m = self.meta();
            match m.name(parent.0, name.as_encoded_bytes(), now) {
                Some((node, generation)) if m.alive(node) => m.attr(node.0, now).map(|attr| {
                    m.absorbed(node);
                    Entry {
                        node,
                        generation,
                        attr,
                        ttl: None,
                    }
                }),
                _ => None,
            }
        };
        let mut e = match cached {
            Some(e) => {
                self.stats.meta_hits.fetch_add(1, Ordering::Relaxed);
                e
            }
            None => {
                self.stats.meta_misses.fetch_add(1, Ordering::Relaxed);
                let e = self.inner.lookup(req, parent, name)?;
                let mut m = self.meta();
                m.counted(e.node);
                if let Some(exp) = self.expiry(e.ttl) {
                    m.set_name(parent.0, name.as_encoded_bytes(), e.node, e.generation, exp);
                    m.set_attr(e.node.0, e.attr, exp);
                }
                e
            }
        };
        self.with_dirty(e.node.0, &mut e.attr);
        Ok(e)
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        let rest = self.meta().forget(node, nlookup);
        if rest > 0 {
            self.inner.forget(node, rest)
        }
    }

    fn batch_forget(&self, forgets: &[Forget]) {
        let rest: Vec<Forget> = {
            let mut m = self.meta();
            forgets
                .iter()
                .filter_map(|f| {
                    let n = m.forget(f.node, f.nlookup);
                    (n > 0).then_some(Forget {
                        node: f.node,
                        nlookup: n,
                    })
                })
                .collect()
        };
        if !rest.is_empty() {
            self.inner.batch_forget(&rest)
        }
    }

    fn getattr(&self, req: &Request, node: NodeId, fh: Option<FileHandle>) -> Result<Attr> {
        let now = MetaCache::now();
        let cached = self.meta().attr(node.0, now);
        let mut a = match cached {
            Some(a) => {
                self.stats.meta_hits.fetch_add(1, Ordering::Relaxed);
                a
            }
            None => {
                self.stats.meta_misses.fetch_add(1, Ordering::Relaxed);
                let a = self.inner.getattr(req, node, fh)?;
                if let Some(exp) = self.expiry(None) {
                    self.meta().set_attr(node.0, a, exp);
                }
                a
            }
        };
        self.with_dirty(node.0, &mut a);
        Ok(a)
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        let mut st = self.lock();
        if set.size.is_some() || set.mtime.is_some() {
            // Written back later, the pages would move an mtime set now.
            self.flush_pages(&mut st, Some(node.0))?;
        }
        if let Some(size) = set.size {
            // Clean now: the pages from the one holding the lower of the old
            // and new end of file go (a short old last page would read as
            // the end of a file that grew; pages past a shrunk end are gone).
            st.bump(node.0);
            let old = st.nodes.get(&node.0).and_then(|n| n.size);
            let first = old.map_or(0, |o| o.min(size) / self.ps());
            if st.pages.drop_from(node.0, first) > 0 {
                self.stats.invalidations.fetch_add(1, Ordering::Relaxed);
            }
            st.nodes.entry(node.0).or_default().size = Some(size);
        }
        drop(st);
        self.meta().drop_attr(node.0);
        let mut a = self.inner.setattr(req, node, set)?;
        if set.size.is_some() || set.mtime.is_some() {
            if let Some(ns) = self.lock().nodes.get_mut(&node.0) {
                ns.seen = Some(Seen::now(&a));
                ns.wrote = false;
            }
        }
        if let Some(exp) = self.expiry(None) {
            self.meta().set_attr(node.0, a, exp);
        }
        self.with_dirty(node.0, &mut a);
        Ok(a)
    }

    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        let e = self.inner.symlink(req, parent, name, target)?;
        self.remember(parent, name, &e);
        Ok(e)
    }

    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        let e = self.inner.mknod(req, parent, name, new)?;
        self.remember(parent, name, &e);
        Ok(e)
    }

    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        let e = self.inner.mkdir(req, parent, name, new)?;
        self.remember(parent, name, &e);
        Ok(e)
    }

    fn unlink(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.forget_name(parent, name);
        self.inner.unlink(req, parent, name)
    }

    fn rmdir(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.forget_name(parent, name);
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
        self.forget_name(parent, name);
        self.forget_name(new_parent, new_name);
        let r = self.inner.rename(req, parent, name, new_parent, new_name, flags);
        // Whatever the outcome, nothing cached about these names may stand.
        self.forget_name(parent, name);
        self.forget_name(new_parent, new_name);
        r
    }

    fn link(&self, req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry> {
        self.meta().drop_attr(node.0);
        let e = self.inner.link(req, node, new_parent, new_name)?;
        self.remember(new_parent, new_name, &e);
        Ok(e)
    }

    fn open(&self, req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened> {
        if flags.contains(OpenFlags::TRUNC) {
            // A run written behind must not land after the truncation.
            self.collect_behind(&mut self.lock(), Some(node.0), true);
        }
        let (mut opened, write_only) = readable(flags, |f| self.inner.open(req, node, f))?;
        // The data must pass through the cache, not around it.
        opened.data_map = None;
        flush_writes(flags, &mut opened);
        let mut st = self.lock();
        if write_only {
            st.write_only.insert(opened.fh.0);
        }
        if flags.contains(OpenFlags::TRUNC) {
            self.drop_pages(&mut st, node.0);
            st.nodes.remove(&node.0);
            drop(st);
            self.meta().drop_attr(node.0);
        } else if !Self::has_dirty(&mut st, node.0) {
            // Close-to-open: the file changed elsewhere since we cached it.
            let now = self.inner.getattr(req, node, Some(opened.fh)).ok();
            let ns = st.nodes.entry(node.0).or_default();
            let seen = now.as_ref().map(Seen::now);
            let holds = matches!((&ns.seen, &seen), (Some(old), Some(new)) if old.still_holds(new));
            if !holds {
                ns.seen = seen;
                ns.size = seen.map(|n| n.size());
                ns.wrote = false;
                self.drop_pages(&mut st, node.0);
            }
            drop(st);
            if let (Some(a), Some(exp)) = (now, self.expiry(None)) {
                self.meta().set_attr(node.0, a, exp);
            }
        }
        Ok(opened)
    }

    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, flags: OpenFlags) -> Result<Created> {
        if flags.contains(OpenFlags::TRUNC) {
            // The name may be a file with runs written behind (which one
            // is known only after): none may land after the truncation.
            self.collect_behind(&mut self.lock(), None, true);
        }
        let (mut c, write_only) = readable(flags, |f| self.inner.create(req, parent, name, new, f))?;
        c.opened.data_map = None;
        flush_writes(flags, &mut c.opened);
        self.remember(parent, name, &c.entry);
        let mut st = self.lock();
        if write_only {
            st.write_only.insert(c.opened.fh.0);
        }
        self.drop_pages(&mut st, c.entry.node.0);
        st.nodes.insert(
            c.entry.node.0,
            NodeState {
                size: Some(c.entry.attr.size),
                next: 0,
                seen: Some(Seen::now(&c.entry.attr)),
                wrote: false,
                written: None,
                generation: 0,
                ..NodeState::default()
            },
        );
        Ok(c)
    }

    fn read(&self, _req: &Request, node: NodeId, fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let ps = self.ps();
        let mut st = self.lock();
        let sequential = st.nodes.get(&node.0).is_some_and(|n| n.next == offset && offset > 0);
        // Nothing is asked for past the end of file the cache knows.
        let size = st.nodes.get(&node.0).and_then(|n| n.size);
        let buf = match size {
            Some(size) if offset >= size => return Ok(0),
            Some(size) => {
                let n = buf.len().min((size - offset).try_into().unwrap_or(usize::MAX));
                &mut buf[..n]
            }
            None => buf,
        };
        let mut done = 0usize;
        let mut tries = 0;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (idx, within) = (pos / ps, (pos % ps) as usize);
            if st.pages.get((node.0, idx)).is_some() {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
            } else {
                if tries == 0 {
                    self.stats.misses.fetch_add(1, Ordering::Relaxed);
                }
                match self.pending(&mut st, node.0, idx) {
                    Pending::Collecting => {
                        st = self.landed.wait(st).unpoison();
                        continue;
                    }
                    Pending::Mine {
                        first,
                        count,
                        generation,
                        job,
                    } => {
                        // The reader reached the window read ahead: the
                        // next one goes out before it waits for this one.
                        self.read_ahead(&mut st, node, fh, first + count);
                        st = self.collect(st, node, first, count, generation, job)?;
                        continue;
                    }
                    Pending::None => {}
                }
                if Self::writing_behind(&st, node.0) {
                    // The page may have been written behind and evicted:
                    // what the inner file system holds is not it until
                    // its write landed.
                    self.collect_behind(&mut st, Some(node.0), true);
                }
                let wanted = (buf.len() - done).div_ceil(self.config.page_size) as u64;
                let count = if sequential || offset == 0 {
                    wanted.max(self.config.readahead as u64)
                } else {
                    wanted.max(1)
                };
                // Never more than half the cache in one fetch.
                let room = (self.config.pages() / 2).max(1) as u64;
                let before_eof = size.map_or(u64::MAX, |s| s.div_ceil(ps).saturating_sub(idx).max(1));
                let count = count.min(room).min(before_eof);
                let (data, end) = if tries < UNLOCKED_TRIES {
                    // Other files' reads and writes go on while this one is
                    // out (a network round trip); what it brings is kept
                    // only if nothing changed the node meanwhile.
                    let generation = st.generation(node.0);
                    drop(st);
                    let fetched = self.fetch(node, fh, idx, count);
                    st = self.lock();
                    let (data, got) = fetched?;
                    if !st.unchanged(node.0, generation) {
                        tries += 1;
                        continue;
                    }
                    let end = self.store(&mut st, node, idx, count, &data, got)?;
                    (data, end)
                } else {
                    self.fill(&mut st, node, fh, idx, count)?
                };
                tries = 0;
                if sequential || offset == 0 {
                    self.read_ahead(&mut st, node, fh, idx + count);
                }
                // The first page from what was fetched (it was not cached,
                // and storing the others may have evicted it already);
                // the next pages from the cache, where dirty ones are newer.
                let page_len = end.min(self.config.page_size);
                let n = page_len.saturating_sub(within).min(buf.len() - done);
                buf[done..done + n].copy_from_slice(&data[within..within + n]);
                done += n;
                if n == 0 || (page_len < self.config.page_size && within + n >= page_len) {
                    break;
                }
                continue;
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
        let mut st = self.lock();
        if args.flags.contains(OpenFlags::APPEND) || st.write_only.contains(&fh.0) {
            // The inner file system decides where appends land; a handle
            // that cannot read cannot fill the rest of a page.
            self.flush_pages(&mut st, Some(node.0))?;
            self.drop_pages(&mut st, node.0);
            st.nodes.remove(&node.0);
            drop(st);
            self.meta().drop_attr(node.0);
            return self.inner.write(&req0(), node, fh, data, args);
        }
        let ps = self.ps();
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
            let before = dirty_len(page);
            let was_clean = page.dirty.is_none();
            page.mark_dirty(within, within + n, fh);
            let after = dirty_len(page);
            self.dirty_delta(before, after);
            if was_clean {
                st.nodes.entry(node.0).or_default().dirty += 1;
            }
            done += n;
        }
        let ns = st.nodes.entry(node.0).or_default();
        ns.size = Some(size.max(end));
        ns.written = Some(Timestamp::now());
        st.bump(node.0);
        let wait = self.write_behind(&mut st, node, fh, args.offset, end);
        drop(st);
        self.meta().drop_attr(node.0);
        if let Some(oldest) = wait {
            // Too many runs of this file out: the writer waits for the
            // oldest, without the lock (other requests go on meanwhile).
            let _ = oldest.wait();
            self.collect_behind(&mut self.lock(), Some(node.0), false);
        }
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
        self.end_reads_ahead(node.0, fh.0);
        let mut st = self.lock();
        st.write_only.remove(&fh.0);
        let r = self.flush_pages(&mut st, Some(node.0));
        // What the inner file system now holds is what the cache wrote:
        // the next open must not take it for a change made elsewhere.
        if st.nodes.get(&node.0).is_some_and(|ns| ns.wrote) && r.is_ok() {
            let now = self.inner.getattr(req, node, Some(fh)).ok();
            if let Some(ns) = st.nodes.get_mut(&node.0) {
                ns.seen = now.as_ref().map(Seen::now);
                ns.wrote = false;
            }
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

    fn fallocate(
        &self,
        req: &Request,
        node: NodeId,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: FallocateFlags,
    ) -> Result<()> {
        let mut st = self.lock();
        self.flush_pages(&mut st, Some(node.0))?;
        self.drop_pages(&mut st, node.0);
        st.nodes.remove(&node.0);
        drop(st);
        self.meta().drop_attr(node.0);
        self.inner.fallocate(req, node, fh, offset, length, mode)
    }

    fn lseek(&self, req: &Request, node: NodeId, fh: FileHandle, offset: u64, whence: Whence) -> Result<u64> {
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
        self.meta().drop_attr(range.node_out.0);
        self.inner.copy_file_range(req, range)
    }
}
