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
//!   `readahead` pages in one call to the inner file system, and starts
//!   the next `readahead` pages on a thread so they arrive while the
//!   program reads these (`ahead.rs`; over file systems with threads of
//!   their own only). Reads are
//!   clipped at the end of file the cache knows (the metadata-cache
//!   trick of the Prefuse-SSHFS caching thesis): nothing is asked for past it.
//! - Writes are write-back: they change cached pages and return; dirty
//!   pages go to the inner file system on `flush` (every `close(2)`),
//!   `fsync`, `release`, truncation, eviction, `destroy` and
//!   [`CachedFs::flush_all`] (the daemon calls it when it stops). Over
//!   file systems with threads of their own, each run of 8 whole pages a
//!   writer fills goes out at once on a thread, behind the writer
//!   (`behind.rs`); `flush`, `fsync` and `release` wait for those and
//!   report their errors.
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
//! last saw, or when the mtime was too recent to tell (`seen.rs`), so a
//! change made elsewhere (on the server) shows after reopening; within an open, the cache's pages and size are what reads
//! see. Attributes and names changed elsewhere show after `meta_ttl`.
//!
//! Lock order: `state` (pages, per-node state), then `meta`; write-backs
//! run under `state` (writes behind the writer run on their own threads,
//! which take neither lock), nothing runs under `meta`. A read miss fetches
//! without `state` held (other files' requests go on meanwhile) and keeps
//! the pages only if the node's generation did not move.

mod ahead;
mod behind;
mod io;
mod layer;
mod meta;
pub mod options;
// The VFS's page cache and the benchmarks build on the page store and the
// mtime rule; an author configures the cache through `CacheOptions`.
#[doc(hidden)]
pub mod page;
#[doc(hidden)]
pub mod seen;
mod state;

use crate::sync::Unpoison;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::errno::Result;
use crate::filesystem::Filesystem;
pub use crate::stats::{CacheCounters, CacheStats};
use crate::types::*;

pub use meta::MetaCache;
pub use options::{CacheMode, CacheOptions, CACHE_KEYS, CACHE_OPTION_HELP};
use page::PageStore;
pub use page::Policy;
#[doc(hidden)]
pub use seen::Seen;
use state::State;

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

/// A [`Filesystem`] with a page cache in front of `F`. See the module docs.
pub struct CachedFs<F: Filesystem + ?Sized> {
    inner: Arc<F>,
    config: CacheConfig,
    state: Mutex<State>,
    /// Signalled when a window read ahead was collected (see `ahead.rs`).
    landed: Condvar,
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
                ahead: Vec::new(),
                behind: Vec::new(),
            }),
            landed: Condvar::new(),
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
}

#[cfg(test)]
mod tests;
