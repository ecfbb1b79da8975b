//! Writes started behind a sequential writer: once a writer has filled a
//! run of [`WRITE_RUN`] whole pages, the run goes to the inner file system
//! on a thread of the cache, while the writer goes on filling the next
//! pages. A network file system so keeps its writes in flight all along
//! the copy (as sshfs sends each write without waiting for its reply),
//! instead of leaving the link idle until an eviction or the close writes
//! the pages back, each time holding the cache's lock.
//!
//! Only over a file system with threads of its own
//! ([`Filesystem::answers_later`]), as for reads ahead. The pages stay in
//! the cache, clean, while their write is out; the node counts as dirty
//! (its size and times come from the cache, close-to-open leaves it alone)
//! until the write is collected. At most [`CALLS_IN_FLIGHT`] runs of a node
//! are out at once: the writer that would start one more waits for the
//! oldest, without the cache's lock.
//!
//! Everything that must see the inner file system hold the data (flush,
//! fsync, release, truncation, reads that miss, the daemon stopping) first
//! waits for the node's writes out ([`CachedFs::drain`]). A run that failed
//! leaves the cache (reads then see what the inner file system holds) and
//! its error is kept for the node's next flush, fsync or close to report,
//! as sshfs reports the error of a write it did not wait for.

use std::sync::{Arc, Condvar, Mutex};

use super::io::{dirty_len, CALLS_IN_FLIGHT, WRITE_RUN};
use super::state::State;
use super::{req0, CachedFs};
use crate::errno::{Errno, Result};
use crate::filesystem::Filesystem;
use crate::sync::Unpoison;
use crate::types::*;

/// The outcome of one run's write, once its thread is done.
#[derive(Default)]
pub(super) struct Done {
    result: Mutex<Option<Result<()>>>,
    over: Condvar,
}

impl Done {
    fn set(&self, r: Result<()>) {
        *self.result.lock().unpoison() = Some(r);
        self.over.notify_all();
    }

    /// Waits for the write to end (its thread takes no lock of the cache).
    pub(super) fn wait(&self) -> Result<()> {
        let mut r = self.result.lock().unpoison();
        loop {
            if let Some(r) = *r {
                return r;
            }
            r = self.over.wait(r).unpoison();
        }
    }

    fn finished(&self) -> Option<Result<()>> {
        *self.result.lock().unpoison()
    }
}

/// A run of pages of one node whose write is out.
pub(super) struct Behind {
    pub(super) node: u64,
    first: u64,
    count: u64,
    done: Arc<Done>,
}

impl<F: Filesystem + ?Sized> CachedFs<F> {
    /// After a write of `node` over bytes `start..end`: when it completed
    /// an aligned run of whole dirty pages written through `fh` (the run
    /// ends where the write passed a multiple of [`WRITE_RUN`] pages, so
    /// writes of any size start runs), starts writing the run behind the
    /// writer. Returns what the writer must wait for (without the lock)
    /// when more runs of the node are out than [`CALLS_IN_FLIGHT`].
    pub(super) fn write_behind(
        &self,
        st: &mut State,
        node: NodeId,
        fh: FileHandle,
        start: u64,
        end: u64,
    ) -> Option<Arc<Done>> {
        if !self.inner.answers_later() {
            return None;
        }
        let ps = self.ps();
        let last = end / ps / WRITE_RUN * WRITE_RUN;
        if last == 0 || start >= last * ps {
            return None;
        }
        let first = last - WRITE_RUN;
        let out = |b: &Behind| b.node == node.0 && b.first < last && first < b.first + b.count;
        if st.behind.iter().any(out) {
            return None;
        }
        let whole = Some((0, self.config.page_size, fh));
        for idx in first..last {
            match st.pages.peek((node.0, idx)) {
                Some(p) if p.dirty == whole && p.data.len() == self.config.page_size => {}
                _ => return None,
            }
        }
        let mut data = Vec::with_capacity((WRITE_RUN * ps) as usize);
        for idx in first..last {
            if let Some(p) = st.pages.peek((node.0, idx)) {
                data.extend_from_slice(&p.data);
                self.dirty_delta(dirty_len(p), 0);
                p.dirty = None;
            }
        }
        let ns = st.nodes.entry(node.0).or_default();
        ns.dirty = ns.dirty.saturating_sub(WRITE_RUN as usize);
        ns.behind += 1;
        ns.wrote = true;
        let done = Arc::new(Done::default());
        let job = Job {
            inner: self.inner.clone(),
            stats: self.stats.clone(),
            node,
            fh,
            offset: first * ps,
            data,
            done: done.clone(),
        };
        let job = Arc::new(Mutex::new(Some(job)));
        let theirs = job.clone();
        let spawned = std::thread::Builder::new()
            .name("cache-behind".into())
            .spawn(move || Job::run(&theirs));
        if spawned.is_err() {
            // No thread to be had: the run is written here, as a write-back would.
            Job::run(&job);
        }
        st.behind.push(Behind {
            node: node.0,
            first,
            count: WRITE_RUN,
            done,
        });
        let mut mine = st.behind.iter().filter(|b| b.node == node.0);
        let oldest = mine.next().map(|b| b.done.clone());
        (mine.count() + 1 > CALLS_IN_FLIGHT).then_some(oldest).flatten()
    }

    /// Collects the writes out for `node` (every node for `None`) that have
    /// ended, waiting for them all with `wait` (their threads take no lock
    /// of the cache, so waiting with it held is safe).
    pub(super) fn collect_behind(&self, st: &mut State, node: Option<u64>, wait: bool) {
        let mut i = 0;
        while i < st.behind.len() {
            let b = &st.behind[i];
            if node.is_some_and(|n| n != b.node) {
                i += 1;
                continue;
            }
            let r = if wait { Some(b.done.wait()) } else { b.done.finished() };
            let Some(r) = r else {
                i += 1;
                continue;
            };
            let b = st.behind.remove(i);
            self.landed_behind(st, b, r);
        }
    }

    fn landed_behind(&self, st: &mut State, b: Behind, r: Result<()>) {
        if r.is_err() {
            // What the inner file system holds is what reads must see
            // now: the run's pages (those written since too) go.
            st.bump(b.node);
            for idx in b.first..b.first + b.count {
                if let Some(p) = st.pages.remove((b.node, idx)) {
                    if p.dirty.is_some() {
                        self.dirty_delta(dirty_len(&p), 0);
                        let ns = st.nodes.entry(b.node).or_default();
                        ns.dirty = ns.dirty.saturating_sub(1);
                    }
                }
            }
        }
        let ns = st.nodes.entry(b.node).or_default();
        ns.behind = ns.behind.saturating_sub(1);
        if let Err(e) = r {
            ns.failed.get_or_insert(e);
        }
    }

    /// Waits for every write out for `node` (every node for `None`); the
    /// error of a run that failed, if any (reported once).
    pub(super) fn drain(&self, st: &mut State, node: Option<u64>) -> Result<()> {
        self.collect_behind(st, node, true);
        let mut result = Ok(());
        for (n, ns) in st.nodes.iter_mut() {
            if node.is_none_or(|want| want == *n) {
                if let Some(e) = ns.failed.take() {
                    result = Err(e);
                }
            }
        }
        result
    }

    /// Whether writes of `node` are out.
    pub(super) fn writing_behind(st: &State, node: u64) -> bool {
        st.behind.iter().any(|b| b.node == node)
    }
}

/// One run's write, run on its thread (or in place).
struct Job<F: Filesystem + ?Sized> {
    inner: Arc<F>,
    stats: Arc<crate::stats::CacheStats>,
    node: NodeId,
    fh: FileHandle,
    offset: u64,
    data: Vec<u8>,
    done: Arc<Done>,
}

impl<F: Filesystem + ?Sized> Job<F> {
    fn run(slot: &Mutex<Option<Job<F>>>) {
        let Some(job) = slot.lock().unpoison().take() else {
            return;
        };
        let args = WriteArgs {
            offset: job.offset,
            ..WriteArgs::default()
        };
        let r = match job.inner.write(&req0(), job.node, job.fh, &job.data, &args) {
            Ok(n) if n == job.data.len() => Ok(()),
            Ok(_) => Err(Errno::EIO),
            Err(e) => Err(e),
        };
        if r.is_ok() {
            job.stats
                .bytes_out
                .fetch_add(job.data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        job.done.set(r);
    }
}
