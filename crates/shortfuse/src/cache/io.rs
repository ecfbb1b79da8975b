//! Pages between the cache and the inner file system: fetching, keeping,
//! writing back and dropping them.

use std::sync::atomic::Ordering;

use super::page::Page;
use super::state::State;
use super::{req0, CachedFs};
use crate::errno::{Errno, Result};
use crate::filesystem::Filesystem;
use crate::types::*;

/// Pages one write call to the inner file system carries at most.
pub(super) const WRITE_RUN: u64 = 8;

/// Write calls one write-back makes at once, where the file system has
/// threads of its own: as sshfs keeps its writes in flight, the link is not
/// left idle while each call waits for its last reply.
pub(super) const CALLS_IN_FLIGHT: usize = 4;

impl<F: Filesystem + ?Sized> CachedFs<F> {
    pub(super) fn dirty_delta(&self, before: usize, after: usize) {
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

    pub(super) fn write_back(&self, st: &mut State, page: &mut Page) -> Result<()> {
        let Some((start, end, fh)) = page.dirty else {
            return Ok(());
        };
        if Self::writing_behind(st, page.key.0) {
            // This page or those it takes along may have an earlier write out.
            self.collect_behind(st, Some(page.key.0), true);
        }
        let end = end.min(page.data.len());
        let mut result = Ok(());
        if start < end {
            // The dirty pages that continue this one go along, so that a
            // network file system keeps its writes in flight instead of
            // waiting on each page: in calls of up to WRITE_RUN pages,
            // several calls at once where the file system has threads.
            let follow = if end == self.config.page_size {
                self.dirty_run(st, page.key, fh, self.pages_per_write_back() - 1)
            } else {
                Vec::new()
            };
            // The first call: this page and the run that continues it. A
            // page alone is written from where it lies; only a run is
            // gathered into one buffer.
            let head = (WRITE_RUN as usize - 1).min(follow.len());
            let mut first = std::borrow::Cow::Borrowed(&page.data[start..end]);
            if head > 0 {
                self.gather(st, page.key.0, &follow[..head], first.to_mut());
            }
            let mut calls = vec![(page.key.1 * self.ps() + start as u64, first)];
            let mut carried = vec![&follow[..head]];
            for run in follow[head..].chunks(WRITE_RUN as usize) {
                let mut data = Vec::new();
                self.gather(st, page.key.0, run, &mut data);
                calls.push((run[0].0 * self.ps(), std::borrow::Cow::Owned(data)));
                carried.push(run);
            }
            let done = self.write_calls(NodeId(page.key.0), fh, &calls);
            // A page is clean once the call that carried it succeeded.
            for (i, r) in done.into_iter().enumerate() {
                if let Err(e) = r {
                    if i == 0 {
                        return Err(e);
                    }
                    result = result.and(Err(e));
                    continue;
                }
                self.stats
                    .bytes_out
                    .fetch_add(calls[i].1.len() as u64, Ordering::Relaxed);
                for &(idx, _) in carried[i] {
                    if let Some(p) = st.pages.peek((page.key.0, idx)) {
                        self.dirty_delta(dirty_len(p), 0);
                        p.dirty = None;
                        let ns = st.nodes.entry(page.key.0).or_default();
                        ns.dirty = ns.dirty.saturating_sub(1);
                    }
                }
            }
        }
        self.dirty_delta(dirty_len(page), 0);
        page.dirty = None;
        let ns = st.nodes.entry(page.key.0).or_default();
        ns.wrote = true;
        ns.dirty = ns.dirty.saturating_sub(1);
        self.meta().drop_attr(page.key.0);
        result
    }

    /// Pages one write-back takes along at most: [`WRITE_RUN`] per call,
    /// and [`CALLS_IN_FLIGHT`] calls where the file system has threads of
    /// its own ([`Filesystem::answers_later`]; a program hosting it in its
    /// own process gets no threads of ours).
    fn pages_per_write_back(&self) -> u64 {
        if self.inner.answers_later() {
            WRITE_RUN * CALLS_IN_FLIGHT as u64
        } else {
            WRITE_RUN
        }
    }

    /// Appends the dirty bytes of `run`'s pages of `node` to `out`.
    fn gather(&self, st: &mut State, node: u64, run: &[(u64, usize)], out: &mut Vec<u8>) {
        for &(idx, len) in run {
            if let Some(p) = st.pages.peek((node, idx)) {
                out.extend_from_slice(&p.data[..len]);
            }
        }
    }

    /// Makes each (offset, data) one write call of the inner file system,
    /// all at once (the first on this thread); the result of each.
    fn write_calls(
        &self,
        node: NodeId,
        fh: FileHandle,
        calls: &[(u64, std::borrow::Cow<'_, [u8]>)],
    ) -> Vec<Result<()>> {
        let one = |(offset, data): &(u64, std::borrow::Cow<'_, [u8]>)| -> Result<()> {
            let args = WriteArgs {
                offset: *offset,
                ..WriteArgs::default()
            };
            match self.inner.write(&req0(), node, fh, data, &args)? {
                n if n == data.len() => Ok(()),
                _ => Err(Errno::EIO),
            }
        };
        if calls.len() == 1 {
            return vec![one(&calls[0])];
        }
        std::thread::scope(|s| {
            let others: Vec<_> = calls[1..].iter().map(|c| s.spawn(move || one(c))).collect();
            let mut done = vec![one(&calls[0])];
            done.extend(others.into_iter().map(|t| t.join().unwrap_or(Err(Errno::EIO))));
            done
        })
    }

    /// The cached pages after `key` dirty from their first byte through
    /// `fh`, each but the last dirty to its end: (index, dirty bytes), at
    /// most `most` of them.
    fn dirty_run(&self, st: &mut State, key: (u64, u64), fh: FileHandle, most: u64) -> Vec<(u64, usize)> {
        let mut run = Vec::new();
        for idx in key.1 + 1..=key.1 + most {
            let Some(p) = st.pages.peek((key.0, idx)) else { break };
            let Some((0, end, h)) = p.dirty else { break };
            if h != fh {
                break;
            }
            let end = end.min(p.data.len());
            run.push((idx, end));
            if end < self.config.page_size {
                break;
            }
        }
        run
    }

    pub(super) fn insert(&self, st: &mut State, page: Page) -> Result<()> {
        if let Some(mut old) = st.pages.insert(page) {
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            self.write_back(st, &mut old)?;
        }
        Ok(())
    }

    /// Writes back every dirty page of `node` (of all nodes for `None`).
    pub(super) fn flush_pages(&self, st: &mut State, node: Option<u64>) -> Result<()> {
        let mut keys = match node {
            Some(n) if !Self::has_dirty(st, n) => return Ok(()),
            Some(n) => st.pages.keys_of(n),
            None => st.pages.keys(),
        };
        // The runs written behind land first: a write-back of a page
        // written again since must not overtake its earlier write.
        let mut result = self.drain(st, node);
        // In file order, so that each write-back takes the dirty pages
        // after it along (`write_back`).
        keys.sort_unstable();
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

    pub(super) fn drop_pages(&self, st: &mut State, node: u64) {
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

    /// Whether the cache holds data of `node` the inner file system may
    /// not have yet: dirty pages, runs being written behind, or a failed
    /// run not reported yet.
    pub(super) fn has_dirty(st: &mut State, node: u64) -> bool {
        st.nodes
            .get(&node)
            .is_some_and(|n| n.dirty > 0 || n.behind > 0 || n.failed.is_some())
    }

    /// Fills pages `first..first+count` of `node` from the inner file system.
    /// Returns the bytes fetched and how many of them the file holds.
    pub(super) fn fill(
        &self,
        st: &mut State,
        node: NodeId,
        fh: FileHandle,
        first: u64,
        count: u64,
    ) -> Result<(Vec<u8>, usize)> {
        // A page written behind and evicted since must not be read back
        // from before its write landed.
        self.collect_behind(st, Some(node.0), true);
        let (buf, got) = self.fetch(node, fh, first, count)?;
        let end = self.store(st, node, first, count, &buf, got)?;
        Ok((buf, end))
    }

    /// Reads pages `first..first+count` of `node` from the inner file
    /// system (no lock needed): the bytes and how many are valid.
    pub(super) fn fetch(&self, node: NodeId, fh: FileHandle, first: u64, count: u64) -> Result<(Vec<u8>, usize)> {
        let ps = self.ps();
        let mut buf = vec![0u8; (count * ps) as usize];
        let got = self.inner.read(&req0(), node, fh, first * ps, &mut buf)?;
        self.stats.bytes_in.fetch_add(got as u64, Ordering::Relaxed);
        Ok((buf, got))
    }

    /// Keeps fetched pages the cache does not hold yet; returns how many
    /// of the fetched bytes the file holds.
    pub(super) fn store(
        &self,
        st: &mut State,
        node: NodeId,
        first: u64,
        count: u64,
        buf: &[u8],
        got: usize,
    ) -> Result<usize> {
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
    pub(super) fn with_dirty(&self, node: u64, attr: &mut Attr) {
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

pub(super) fn dirty_len(p: &Page) -> usize {
    p.dirty.map_or(0, |(s, e, _)| e.saturating_sub(s))
}
