//! A user-space page and metadata cache in front of any [`Filesystem`]:
//! [`CachedFs`]. One instance serves every client of a daemon (the kernel
//! mount and the ring clients of `shortfuse serve` alike), so they share
//! one cache.
//!
//! Meant for file systems whose reads are expensive (network, like `sftp`)
//! and whose data the kernel page cache does not already keep (transports
//! that bypass it, or `direct_io`); over a local passthrough it only
//! doubles the caching (the Prefuse-SSHFS caching thesis). [`CacheOptions`] says when it is on.
//!
//! Pages:
//! - Reads are served from pages of `page_size` bytes; a miss that
//!   continues the previous read of the same node (or starts at 0) fetches
//!   `readahead` pages in one call to the inner file system. Reads are
//!   clipped at the end of file the cache knows (the metadata-cache
//!   trick of the Prefuse-SSHFS caching thesis): nothing is asked for past it.
//! - Writes are write-back: they change cached pages and return; dirty
//!   pages go to the inner file system on `flush` (every `close(2)`),
//!   `fsync`, `release`, truncation, eviction, `destroy` and
//!   [`CachedFs::flush_all`] (the daemon calls it when it stops).
//! - Open files' data maps are withheld (their data must pass here).
//!
//! Metadata: attributes by node and names by (parent, name), each bounded
//! by `meta_entries` and trusted for `meta_ttl` (or the file system's
//! shorter TTL). Every change made through the cache drops what it makes
//! stale (the node's and the parent's attributes, the names involved). A
//! lookup answered from the cache counts as a lookup the inner file system
//! never saw: those are kept apart and absorbed by the kernel's FORGETs
//! before any reaches the inner file system, and a node the inner file
//! system may have forgotten is never answered from the cache.
//!
//! Close-to-open: `open` asks the inner file system for the size and
//! mtime, and drops the node's pages when they differ from what the cache
//! last saw, or when the mtime was too recent to tell ([`seen`]), so a
//! change made elsewhere (on the server) shows after reopening; within an open, the cache's pages and size are what reads
//! see. Attributes and names changed elsewhere show after `meta_ttl`.
//!
//! Lock order: `state` (pages, per-node state), then `meta`; write-backs
//! run under `state`, nothing runs under `meta`. A read miss fetches
//! without `state` held (other files' requests go on meanwhile) and keeps
//! the pages only if the node's generation did not move.

pub mod options;
pub mod page;
pub mod seen;

use crate::sync::Unpoison;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::errno::{Errno, Result};
use crate::filesystem::Filesystem;
pub use crate::stats::{CacheCounters, CacheStats};
use crate::types::*;

pub use options::{CacheMode, CacheOptions, CACHE_KEYS, CACHE_OPTION_HELP};
use page::{FxBuild, Page, PageStore, Store};
pub use page::{FxHasher, Policy};
pub use seen::Seen;

/// How the cache is sized and behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Bytes per page (a power of two, at least 4 KiB).
    pub page_size: usize,
    /// Bytes of cached data at most.
    pub capacity: usize,
    /// Which entry to evict when the cache is full.
    pub policy: Policy,
    /// Pages fetched at once by a sequential miss (1 turns read-ahead off).
    pub readahead: usize,
    /// Cached attributes (and, apart, names) at most.
    pub meta_entries: usize,
    /// How long a cached attribute or name is trusted.
    pub meta_ttl: Duration,
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        CacheConfig {
            page_size: 128 * 1024,
            capacity: 64 << 20,
            policy: Policy::Clock,
            readahead: 8,
            meta_entries: 5000,
            meta_ttl: Duration::from_secs(1),
        }
    }
}

impl CacheConfig {
    /// Refuses sizes the cache cannot work with.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !self.page_size.is_power_of_two() || self.page_size < 4096 {
            return Err(format!("page_size {} is not a power of two >= 4096", self.page_size));
        }
        if self.capacity < self.page_size || self.readahead == 0 || self.meta_entries == 0 {
            return Err("capacity must hold one page, readahead and meta_entries be at least 1".into());
        }
        Ok(())
    }

    /// Pages the capacity holds.
    pub fn pages(&self) -> usize {
        self.capacity / self.page_size
    }
}

#[derive(Default)]
struct NodeState {
    /// The file's size as the cache knows it (including dirty data), once known.
    size: Option<u64>,
    /// Where the next sequential read would start.
    next: u64,
    /// Size and mtime the inner file system last reported, and when.
    seen: Option<Seen>,
    /// Dirty data went to the inner file system since `seen` was taken.
    wrote: bool,
    /// Dirty pages of the node in the cache (so that a clean node's
    /// flush and size check look at no page).
    dirty: usize,
    /// When the last write the cache holds came: the file's mtime and
    /// ctime while its data waits here.
    written: Option<Timestamp>,
    /// Changed (from [`State::counter`]) by every change to the node's
    /// data; 0 until a read needs it.
    generation: u64,
}

struct State {
    pages: PageStore,
    nodes: HashMap<u64, NodeState>,
    /// Source of generations: never repeats, so a node dropped and
    /// recreated does not pass for unchanged.
    counter: u64,
    /// Handles the inner file system opened write-only (see [`readable`]).
    write_only: HashSet<u64>,
}

/// Opens with `open`, a write-only open made readable as the kernel does
/// under its write-back cache: a write of part of a page the cache does
/// not hold must read the rest. A file the caller may write but not read
/// is opened as asked; true then, and its writes go straight through.
fn readable<T>(flags: OpenFlags, open: impl Fn(OpenFlags) -> Result<T>) -> Result<(T, bool)> {
    if flags.access_mode() != OpenFlags::WRONLY {
        return open(flags).map(|o| (o, false));
    }
    match open(flags.with_access_mode(OpenFlags::RDWR)) {
        Err(e) if e == Errno::EACCES || e == Errno::EPERM => open(flags).map(|o| (o, true)),
        r => r.map(|o| (o, false)),
    }
}

impl State {
    /// Marks `node`'s data changed: a read fetching meanwhile keeps
    /// nothing it fetched.
    fn bump(&mut self, node: u64) -> u64 {
        self.counter += 1;
        let c = self.counter;
        self.nodes.entry(node).or_default().generation = c;
        c
    }

    /// The generation a fetch compares with when it comes back.
    fn generation(&mut self, node: u64) -> u64 {
        match self.nodes.get(&node).map(|n| n.generation) {
            Some(g) if g != 0 => g,
            _ => self.bump(node),
        }
    }

    fn unchanged(&self, node: u64, generation: u64) -> bool {
        self.nodes.get(&node).is_some_and(|n| n.generation == generation)
    }
}

/// Misses that fetch without the lock before one fetches holding it (a
/// file written all the time would otherwise keep its readers fetching).
const UNLOCKED_TRIES: u32 = 3;

/// A cached name: the node, its generation, the name itself (the key only
/// holds its hash) and when it expires.
struct Name {
    node: NodeId,
    generation: u64,
    name: Box<[u8]>,
    /// [`MetaCache::now`] past which the name is stale.
    expires: u64,
}

/// Lookups of one node: handed out by the inner file system and not yet
/// forgotten there, and answered from the cache (not yet forgotten).
#[derive(Default)]
struct Counts {
    inner: u64,
    absorbed: u64,
    /// Cached names pointing at the node.
    names: u32,
}

/// The metadata cache: attributes by node, names by (parent, name hash).
pub struct MetaCache {
    attrs: Store<u64, (Attr, u64)>,
    names: Store<(u64, u64), Name>,
    counts: HashMap<u64, Counts, FxBuild>,
}

fn name_hash(name: &[u8]) -> u64 {
    FxBuild::default().hash_one(name)
}

impl MetaCache {
    /// An empty cache of at most `entries` attributes and names.
    pub fn new(policy: Policy, entries: usize) -> MetaCache {
        MetaCache {
            attrs: Store::new(policy, entries),
            names: Store::new(policy, entries),
            counts: HashMap::default(),
        }
    }

    /// The clock entries expire by: nanoseconds of CLOCK_MONOTONIC_COARSE
    /// (a few ms of resolution, a few ns to read).
    pub fn now() -> u64 {
        crate::sys::coarse_now_ns()
    }

    /// When an entry made now with `ttl` expires.
    pub fn expires_in(ttl: Duration) -> u64 {
        Self::now().saturating_add(ttl.as_nanos().try_into().unwrap_or(u64::MAX))
    }

    /// The attributes of `node` while they are valid.
    #[inline]
    pub fn attr(&mut self, node: u64, now: u64) -> Option<Attr> {
        match self.attrs.get(&node) {
            Some((a, exp)) if *exp > now => Some(*a),
            _ => None,
        }
    }

    /// Keeps `attr` for `node` until `expires` (the cache's clock).
    pub fn set_attr(&mut self, node: u64, attr: Attr, expires: u64) {
        self.attrs.insert(node, (attr, expires));
    }

    /// Forgets the attributes of `node`.
    pub fn drop_attr(&mut self, node: u64) {
        self.attrs.remove(&node);
    }

    /// The node `name` in `parent` names, while valid.
    #[inline]
    pub fn name(&mut self, parent: u64, name: &[u8], now: u64) -> Option<(NodeId, u64)> {
        match self.names.get(&(parent, name_hash(name))) {
            Some(n) if n.expires > now && *n.name == *name => Some((n.node, n.generation)),
            _ => None,
        }
    }

    /// Keeps `parent/name` -> `node` until `expires`.
    pub fn set_name(&mut self, parent: u64, name: &[u8], node: NodeId, generation: u64, expires: u64) {
        let value = Name {
            node,
            generation,
            name: Box::from(name),
            expires,
        };
        self.counts.entry(node.0).or_default().names += 1;
        if let Some((_, old)) = self.names.insert((parent, name_hash(name)), value) {
            self.unref_name(old.node);
        }
    }

    fn unref_name(&mut self, node: NodeId) {
        if let Some(c) = self.counts.get_mut(&node.0) {
            c.names = c.names.saturating_sub(1);
            if c.inner == 0 && c.absorbed == 0 && c.names == 0 {
                self.counts.remove(&node.0);
            }
        }
    }

    /// Forgets `name` in `parent`; returns the node it named, if cached.
    pub fn drop_name(&mut self, parent: u64, name: &[u8]) -> Option<NodeId> {
        let key = (parent, name_hash(name));
        if self.names.peek(&key).is_some_and(|n| *n.name == *name) {
            let n = self.names.remove(&key)?;
            self.unref_name(n.node);
            return Some(n.node);
        }
        None
    }

    fn drop_names_of(&mut self, node: NodeId) {
        let mut gone = 0;
        self.names.retain(|_, n| {
            let keep = n.node != node;
            gone += !keep as u32;
            keep
        });
        for _ in 0..gone {
            self.unref_name(node);
        }
    }

    /// Whether the inner file system still holds a lookup of `node`.
    fn alive(&self, node: NodeId) -> bool {
        self.counts.get(&node.0).is_some_and(|c| c.inner > 0)
    }

    /// One lookup of `node` handed out by the inner file system.
    fn counted(&mut self, node: NodeId) {
        self.counts.entry(node.0).or_default().inner += 1;
    }

    /// One lookup answered from the cache.
    fn absorbed(&mut self, node: NodeId) {
        self.counts.entry(node.0).or_default().absorbed += 1;
    }

    /// The part of a FORGET of `n` lookups that goes to the inner file
    /// system: the cache's own lookups are given back first.
    fn forget(&mut self, node: NodeId, n: u64) -> u64 {
        let Some(c) = self.counts.get_mut(&node.0) else {
            return n;
        };
        let mine = c.absorbed.min(n);
        c.absorbed -= mine;
        let rest = n - mine;
        c.inner = c.inner.saturating_sub(rest);
        if c.inner == 0 {
            // The inner file system may drop the node now: nothing cached
            // may name it any more.
            if c.names > 0 {
                self.drop_names_of(node);
            }
            self.attrs.remove(&node.0);
            if let Some(c) = self.counts.get(&node.0) {
                if c.absorbed == 0 && c.names == 0 {
                    self.counts.remove(&node.0);
                }
            }
        }
        rest
    }
}

/// A [`Filesystem`] with a page cache in front of `F`. See the module docs.
pub struct CachedFs<F: Filesystem + ?Sized> {
    inner: Arc<F>,
    config: CacheConfig,
    state: Mutex<State>,
    meta: Mutex<MetaCache>,
    stats: Arc<CacheStats>,
}

fn req0() -> Request {
    Request {
        unique: 0,
        uid: 0,
        gid: 0,
        pid: 0,
    }
}

impl<F: Filesystem + ?Sized> CachedFs<F> {
    /// Puts a cache configured by `config` in front of `inner`; an error says what in `config` is wrong.
    pub fn new(inner: Arc<F>, config: CacheConfig) -> std::result::Result<CachedFs<F>, String> {
        config.check()?;
        let pages = PageStore::new(config.policy, config.pages());
        Ok(CachedFs {
            inner,
            config,
            state: Mutex::new(State {
                pages,
                nodes: HashMap::new(),
                counter: 0,
                write_only: HashSet::new(),
            }),
            meta: Mutex::new(MetaCache::new(config.policy, config.meta_entries)),
            stats: Arc::new(CacheStats::default()),
        })
    }

    /// The file system behind the cache.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// The configuration the cache runs with.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The counters, to show in `shortfuse stats` ([`crate::Stats::attach_cache`]).
    pub fn stats(&self) -> &Arc<CacheStats> {
        &self.stats
    }

    /// Writes every dirty page back (the daemon calls it when it stops,
    /// after its sessions ended).
    pub fn flush_all(&self) -> Result<()> {
        let mut st = self.lock();
        self.flush_pages(&mut st, None)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unpoison()
    }

    fn meta(&self) -> MutexGuard<'_, MetaCache> {
        self.meta.lock().unpoison()
    }

    fn ps(&self) -> u64 {
        self.config.page_size as u64
    }

    fn expiry(&self, ttl: Option<Duration>) -> Option<u64> {
        let ttl = ttl.map_or(self.config.meta_ttl, |t| t.min(self.config.meta_ttl));
        (!ttl.is_zero()).then(|| MetaCache::expires_in(ttl))
    }

    /// Remembers an entry the inner file system handed out.
    fn remember(&self, parent: NodeId, name: &OsStr, e: &Entry) {
        let mut m = self.meta();
        m.counted(e.node);
        m.drop_attr(parent.0);
        if let Some(exp) = self.expiry(e.ttl) {
            m.set_name(parent.0, name.as_encoded_bytes(), e.node, e.generation, exp);
            m.set_attr(e.node.0, e.attr, exp);
        }
    }

    fn dirty_delta(&self, before: usize, after: usize) {
        if after > before {
            self.stats
                .dirty_bytes
                .fetch_add((after - before) as u64, Ordering::Relaxed);
        } else if before > after {
            self.stats
                .dirty_bytes
                .fetch_sub((before - after) as u64, Ordering::Relaxed);
        }
    }

    fn write_back(&self, st: &mut State, page: &mut Page) -> Result<()> {
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
        self.dirty_delta(dirty_len(page), 0);
        page.dirty = None;
        let ns = st.nodes.entry(page.key.0).or_default();
        ns.wrote = true;
        ns.dirty = ns.dirty.saturating_sub(1);
        self.meta().drop_attr(page.key.0);
        Ok(())
    }

    fn insert(&self, st: &mut State, page: Page) -> Result<()> {
        if let Some(mut old) = st.pages.insert(page) {
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            self.write_back(st, &mut old)?;
        }
        Ok(())
    }

    /// Writes back every dirty page of `node` (of all nodes for `None`).
    fn flush_pages(&self, st: &mut State, node: Option<u64>) -> Result<()> {
        let keys = match node {
            Some(n) if !Self::has_dirty(st, n) => return Ok(()),
            Some(n) => st.pages.keys_of(n),
            None => st.pages.keys(),
        };
        let mut result = Ok(());
        for k in keys {
            // Taken out while written back (write_back needs the state too).
            let Some(mut p) = st.pages.remove(k) else { continue };
            if let Err(e) = self.write_back(st, &mut p) {
                result = Err(e);
            }
            st.pages.insert(p);
        }
        result
    }

    fn drop_pages(&self, st: &mut State, node: u64) {
        st.bump(node);
        let keys = st.pages.keys_of(node);
        if !keys.is_empty() {
            self.stats.invalidations.fetch_add(1, Ordering::Relaxed);
        }
        for k in keys {
            if let Some(p) = st.pages.remove(k) {
                self.dirty_delta(dirty_len(&p), 0);
            }
        }
        if let Some(ns) = st.nodes.get_mut(&node) {
            ns.dirty = 0;
        }
    }

    fn has_dirty(st: &mut State, node: u64) -> bool {
        st.nodes.get(&node).is_some_and(|n| n.dirty > 0)
    }

    /// Fills pages `first..first+count` of `node` from the inner file system.
    /// Returns the bytes fetched and how many of them the file holds.
    fn fill(&self, st: &mut State, node: NodeId, fh: FileHandle, first: u64, count: u64) -> Result<(Vec<u8>, usize)> {
        let (buf, got) = self.fetch(node, fh, first, count)?;
        let end = self.store(st, node, first, count, &buf, got)?;
        Ok((buf, end))
    }

    /// Reads pages `first..first+count` of `node` from the inner file
    /// system (no lock needed): the bytes and how many are valid.
    fn fetch(&self, node: NodeId, fh: FileHandle, first: u64, count: u64) -> Result<(Vec<u8>, usize)> {
        let ps = self.ps();
        let mut buf = vec![0u8; (count * ps) as usize];
        let got = self.inner.read(&req0(), node, fh, first * ps, &mut buf)?;
        self.stats.bytes_in.fetch_add(got as u64, Ordering::Relaxed);
        Ok((buf, got))
    }

    /// Keeps fetched pages the cache does not hold yet; returns how many
    /// of the fetched bytes the file holds.
    fn store(&self, st: &mut State, node: NodeId, first: u64, count: u64, buf: &[u8], got: usize) -> Result<usize> {
        let ps = self.ps();
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
        Ok(end as usize)
    }

    /// `attr` of `node` as the cache's dirty data makes it: the size it
    /// reaches and the time of the last write held.
    fn with_dirty(&self, node: u64, attr: &mut Attr) {
        let mut st = self.lock();
        if !Self::has_dirty(&mut st, node) {
            return;
        }
        let Some(ns) = st.nodes.get(&node) else { return };
        if let Some(size) = ns.size {
            attr.size = size;
            attr.blocks = size.div_ceil(512);
        }
        if let Some(t) = ns.written {
            attr.mtime = attr.mtime.max(t);
            attr.ctime = attr.ctime.max(t);
        }
    }
}

impl<F: Filesystem + ?Sized> CachedFs<F> {
    /// Drops a cached name and what its removal makes stale.
    fn forget_name(&self, parent: NodeId, name: &OsStr) {
        let mut m = self.meta();
        if let Some(node) = m.drop_name(parent.0, name.as_encoded_bytes()) {
            m.drop_attr(node.0);
        }
        m.drop_attr(parent.0);
    }
}

fn dirty_len(p: &Page) -> usize {
    p.dirty.map_or(0, |(s, e, _)| e.saturating_sub(s))
}

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
        let (mut opened, write_only) = readable(flags, |f| self.inner.open(req, node, f))?;
        // The data must pass through the cache, not around it.
        opened.data_map = None;
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
        let (mut c, write_only) = readable(flags, |f| self.inner.create(req, parent, name, new, f))?;
        c.opened.data_map = None;
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
                dirty: 0,
                written: None,
                generation: 0,
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
        self.meta().drop_attr(node.0);
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

#[cfg(test)]
mod tests;
