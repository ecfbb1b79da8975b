//! Reads started ahead of a sequential reader: while the program consumes
//! one window of `readahead` pages from the cache, the next window is
//! already on its way from the inner file system (as sshfs keeps several
//! READs in flight), so a network file system's link does not sit idle
//! between windows.
//!
//! Only over a file system with threads of its own
//! ([`Filesystem::answers_later`]): the read ahead runs on a thread of the
//! cache, which a program that hosts the file system in its own process
//! (and may fork, or expects no threads of ours) must not get.
//!
//! What a read ahead brings is kept only if the node's generation did not
//! move meanwhile (a write, truncation or change seen at open bumps it),
//! as for any read that fetches without the lock.

use std::thread::JoinHandle;

use super::state::State;
use super::{req0, CachedFs};
use crate::errno::Result;
use crate::filesystem::Filesystem;
use crate::types::*;

/// The bytes of a window and how many of them the file holds.
type Fetched = Result<(Vec<u8>, usize)>;

/// A window of pages being read ahead for one node.
pub(super) struct Ahead {
    pub(super) node: u64,
    pub(super) fh: u64,
    pub(super) first: u64,
    pub(super) count: u64,
    pub(super) generation: u64,
    /// `None` once a reader took it to wait for it (others covering the
    /// same pages wait for that reader to store them).
    pub(super) job: Option<JoinHandle<Fetched>>,
}

impl Ahead {
    fn covers(&self, node: u64, idx: u64) -> bool {
        self.node == node && (self.first..self.first + self.count).contains(&idx)
    }
}

/// What a reader that missed page `idx` should do about reads ahead.
pub(super) enum Pending {
    /// No read ahead covers the page: fetch it.
    None,
    /// Another reader is collecting the window: wait, then look again.
    Collecting,
    /// This reader collects the window (and must call [`CachedFs::landed`]).
    Mine {
        first: u64,
        count: u64,
        generation: u64,
        job: JoinHandle<Fetched>,
    },
}

impl<F: Filesystem + ?Sized> CachedFs<F> {
    /// True when sequential misses start the next window on a thread.
    fn reads_ahead(&self) -> bool {
        self.config.readahead > 1 && self.inner.answers_later()
    }

    /// Starts reading the window at page `from` of `node` ahead of the
    /// reader, unless reads ahead are off, one for the node is already
    /// out, the window lies past the end of file the cache knows, or its
    /// first page is cached.
    pub(super) fn read_ahead(&self, st: &mut State, node: NodeId, fh: FileHandle, from: u64) {
        if !self.reads_ahead() || st.ahead.iter().any(|a| a.node == node.0 && a.job.is_some()) {
            return;
        }
        let ps = self.ps();
        let count = match st.nodes.get(&node.0).and_then(|n| n.size) {
            Some(size) if from * ps >= size => return,
            Some(size) => (self.config.readahead as u64).min(size.div_ceil(ps) - from),
            None => self.config.readahead as u64,
        };
        // Never more than half the cache in one fetch.
        let count = count.min((self.config.pages() / 2).max(1) as u64);
        if st.pages.peek((node.0, from)).is_some() {
            return;
        }
        let generation = st.generation(node.0);
        let inner = self.inner.clone();
        let job = std::thread::Builder::new().name("cache-ahead".into()).spawn(move || {
            let mut buf = vec![0u8; (count * ps) as usize];
            let got = inner.read(&req0(), node, fh, from * ps, &mut buf)?;
            Ok((buf, got))
        });
        // No thread to be had: the reader fetches when it gets there.
        if let Ok(job) = job {
            st.ahead.push(Ahead {
                node: node.0,
                fh: fh.0,
                first: from,
                count,
                generation,
                job: Some(job),
            });
        }
    }

    /// Whether a read ahead covers page `idx` of `node`, taking it when
    /// nobody is collecting it yet.
    pub(super) fn pending(&self, st: &mut State, node: u64, idx: u64) -> Pending {
        let Some(a) = st.ahead.iter_mut().find(|a| a.covers(node, idx)) else {
            return Pending::None;
        };
        match a.job.take() {
            None => Pending::Collecting,
            Some(job) => Pending::Mine {
                first: a.first,
                count: a.count,
                generation: a.generation,
                job,
            },
        }
    }

    /// Waits for a taken window (without `st` held), keeps its pages if
    /// the node did not change, and wakes the readers waiting on it.
    pub(super) fn collect<'a>(
        &'a self,
        mut st: std::sync::MutexGuard<'a, State>,
        node: NodeId,
        first: u64,
        count: u64,
        generation: u64,
        job: JoinHandle<Fetched>,
    ) -> Result<std::sync::MutexGuard<'a, State>> {
        drop(st);
        let fetched = job.join();
        st = self.lock();
        st.ahead
            .retain(|a| !(a.node == node.0 && a.first == first && a.job.is_none()));
        self.landed.notify_all();
        // A failed read ahead is the reader's to repeat: it fetches itself.
        if let Ok(Ok((data, got))) = fetched {
            self.stats
                .bytes_in
                .fetch_add(got as u64, std::sync::atomic::Ordering::Relaxed);
            if st.unchanged(node.0, generation) {
                self.store(&mut st, node, first, count, &data, got)?;
            }
        }
        Ok(st)
    }

    /// Ends the reads ahead made through handle `fh` of `node` before the
    /// inner file system closes it (a handle number it reuses must not
    /// receive an old read). Waits without the lock: other files' requests
    /// go on meanwhile.
    pub(super) fn end_reads_ahead(&self, node: u64, fh: u64) {
        let mut ended = Vec::new();
        self.lock().ahead.retain_mut(|a| {
            if a.node == node && a.fh == fh {
                ended.extend(a.job.take());
                // A reader collecting it removes it itself.
                return false;
            }
            true
        });
        for job in ended {
            let _ = job.join();
        }
    }
}
