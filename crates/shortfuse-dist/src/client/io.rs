//! Reads and writes through the block cache: fetching, write-back,
//! direct I/O, truncation and fsync.

use shortfuse::sync::lock;
use shortfuse::sync::Unpoison;
use std::sync::Arc;

use shortfuse::{Errno, Result};

use super::cache::{Block, BATCH_BYTES, DIRTY_MAX, READAHEAD};
use super::config::Consistency;
use super::fs::{node_reply, partial};
use super::lease::{Slot, Then};
use super::{FileState, Inner};
use crate::conn::Conn;
use crate::proto::{AttrChange, ByteBuf, LeaseMode, NodeInfo, Reply, Request as Req, MAX_DIRECT, NO_LEASE};

/// Where a write lands.
#[derive(Clone, Copy)]
pub(super) enum At {
    Offset(u64),
    /// The end of the file (O_APPEND), as found in the same step as the
    /// write: under the write lease, or at the server for a direct one,
    /// so that no other client's write comes between.
    End,
}

impl At {
    pub(super) fn offset(self) -> Option<u64> {
        match self {
            At::Offset(o) => Some(o),
            At::End => None,
        }
    }
}

/// What one read of the cache or the server gave.
pub(super) struct ReadOut {
    pub(super) len: usize,
    /// The read reached the end of the file: nothing more to ask.
    pub(super) eof: bool,
}

impl Inner {
    /// Sends every dirty block and the size; with `sync`, makes them and
    /// every block written since the last fsync durable.
    pub(super) fn write_back(&self, f: &FileState, conn: &Conn, lease: u64, sync: bool) -> Result<()> {
        self.write_back_then(f, conn, lease, sync, Then::Keep).map(|_| ())
    }

    /// [`Inner::write_back`], and the last request gives the lease back or
    /// steps it down as `then` says; returns whether it did (not when
    /// there was nothing to write or the write failed).
    pub(super) fn write_back_then(
        &self,
        f: &FileState,
        conn: &Conn,
        lease: u64,
        sync: bool,
        then: Then,
    ) -> Result<bool> {
        let (dirty, size, mtime, unsynced) = {
            let mut c = lock(&f.cache);
            let mut dirty: Vec<(u64, ByteBuf)> = Vec::new();
            for (i, b) in c.blocks.iter_mut() {
                if b.dirty {
                    b.dirty = false;
                    dirty.push((*i, ByteBuf::from(b.data.clone())));
                }
            }
            if dirty.is_empty() && !c.meta_dirty && !sync {
                return Ok(false);
            }
            c.meta_dirty = false;
            dirty.sort_by_key(|(i, _)| *i);
            let unsynced: Vec<u64> = c.unsynced.iter().copied().collect();
            (dirty, c.size, c.mtime, unsynced)
        };
        let written: Vec<u64> = dirty.iter().map(|(i, _)| *i).collect();
        let mut batches: Vec<Vec<(u64, ByteBuf)>> = vec![Vec::new()];
        let mut bytes = 0;
        for b in dirty {
            if bytes + b.1.len() > BATCH_BYTES && !batches[batches.len() - 1].is_empty() {
                batches.push(Vec::new());
                bytes = 0;
            }
            bytes += b.1.len();
            let last = batches.len() - 1;
            batches[last].push(b);
        }
        let n = batches.len();
        let mut result = Ok(());
        let mut version = None;
        for (k, blocks) in batches.into_iter().enumerate() {
            // Only the last request syncs: it covers the earlier ones too.
            let last_sync = sync && k + 1 == n;
            let mut to_sync = Vec::new();
            if last_sync {
                to_sync = unsynced.clone();
                to_sync.extend(&written);
            }
            let r = conn.call(Req::WriteBlocks {
                gfi: f.gfi,
                lease,
                blocks,
                min_size: size,
                mtime,
                sync: last_sync.then_some(to_sync),
                release: then != Then::Keep && k + 1 == n,
                step_down: then == Then::StepDown,
            });
            match r {
                Ok(Reply::Written { version: v, .. }) => version = v,
                Ok(_) => {
                    result = Err(Errno::EPROTO);
                    break;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut c = lock(&f.cache);
        if result.is_ok() {
            // Nobody else wrote since the cache was last valid (this client
            // held the write lease): it is valid as of this write too.
            c.known = match (c.known, version) {
                (Some(k), Some(v)) if k.epoch == v.epoch => Some(if v.seq > k.seq { v } else { k }),
                _ => None,
            };
        }
        match result {
            Ok(()) if sync => c.unsynced.clear(),
            Ok(()) => c.unsynced.extend(written),
            Err(_) => {
                // Still dirty here; whether it can be retried depends on
                // the lease, which the caller knows.
                for i in written {
                    if let Some(b) = c.blocks.get_mut(&i) {
                        b.dirty = true;
                    }
                }
                c.meta_dirty = true;
            }
        }
        result.map(|()| then != Then::Keep)
    }

    pub(super) fn read(&self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<ReadOut> {
        let f = self.file(ino)?;
        let bs = self.bs();
        let want = (!buf.is_empty()).then(|| (offset / bs, (offset + buf.len() as u64 - 1) / bs));
        self.with_lease_fetch(&f, LeaseMode::Read, want, |conn, slot| {
            if slot.mode == Some(LeaseMode::Direct) {
                return self.read_direct(&f, conn, slot.id, offset, buf);
            }
            if self.caches_pages() {
                self.note_served(&f);
            }
            let size = lock(&f.cache).size;
            if offset >= size || buf.is_empty() {
                return Ok(ReadOut { len: 0, eof: true });
            }
            let end = size.min(offset + buf.len() as u64);
            let (first, last) = (offset / bs, (end - 1) / bs);
            let missing: Vec<u64> = {
                let c = lock(&f.cache);
                (first..=last).filter(|i| !c.blocks.contains_key(i)).collect()
            };
            if let (Some(&lo), Some(&hi)) = (missing.first(), missing.last()) {
                let file_blocks = size.div_ceil(bs);
                let sequential = lock(&f.cache).next_read == first;
                let ahead = if sequential { READAHEAD } else { 0 };
                let hi = (hi + ahead).min(file_blocks.saturating_sub(1)).max(hi);
                self.fetch(&f, conn, slot.id, lo, hi)?;
            }
            let mut c = lock(&f.cache);
            c.next_read = last + 1;
            let mut pos = offset;
            while pos < end {
                let i = pos / bs;
                let within = (pos % bs) as usize;
                let n = ((bs - pos % bs).min(end - pos)) as usize;
                let out = &mut buf[(pos - offset) as usize..][..n];
                match c.blocks.get(&i) {
                    Some(b) => {
                        // A block is kept only up to its last written byte:
                        // a read past that (a hole in the block) is zeros.
                        let have = b.data.len().saturating_sub(within).min(n);
                        if have > 0 {
                            out[..have].copy_from_slice(&b.data[within..within + have]);
                        }
                        out[have..].fill(0);
                    }
                    // Dropped between fetch and copy by the cache bound:
                    // rare; the caller retries the read.
                    None => {
                        return partial(pos - offset).map(|len| ReadOut { len, eof: false });
                    }
                }
                pos += n as u64;
            }
            Ok(ReadOut {
                len: (end - offset) as usize,
                eof: end == size,
            })
        })
    }

    /// A read under a direct lease: what the server holds now.
    pub(super) fn read_direct(
        &self,
        f: &FileState,
        conn: &Conn,
        lease: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<ReadOut> {
        // A larger read is several requests (the caller goes on).
        let len = buf.len().min(MAX_DIRECT as usize);
        let data = match conn.call(Req::ReadDirect {
            gfi: f.gfi,
            lease,
            offset,
            len: len as u32,
        })? {
            Reply::Bytes(b) if b.len() <= len => b,
            _ => return Err(Errno::EPROTO),
        };
        buf[..data.len()].copy_from_slice(&data);
        Ok(ReadOut {
            len: data.len(),
            // Cut at the size the server had: another round trip would
            // only find the end again.
            eof: data.len() < len,
        })
    }

    /// A write under a direct lease: on the server when answered (not yet
    /// durable: an fsync makes it so, [`Inner::sync_written`]). Returns
    /// where it landed (an append: where the server's end was) and how
    /// much it wrote.
    pub(super) fn write_direct(
        &self,
        f: &FileState,
        conn: &Conn,
        lease: u64,
        at: At,
        data: &[u8],
    ) -> Result<(u64, usize)> {
        // A larger write is several requests (the caller goes on).
        let data = &data[..data.len().min(MAX_DIRECT as usize)];
        let len = data.len() as u64;
        let info = match conn.call(Req::WriteDirect {
            gfi: f.gfi,
            lease,
            offset: at.offset().unwrap_or(0),
            append: at.offset().is_none(),
            data: ByteBuf::from(data.to_vec()),
            mtime: crate::meta::now(),
        })? {
            Reply::Written { info, .. } => info,
            _ => return Err(Errno::EPROTO),
        };
        // The server made the file end where an append ended.
        let offset = match at.offset() {
            Some(offset) => offset,
            None => info.attr.size.checked_sub(len).ok_or(Errno::EPROTO)?,
        };
        if len > 0 {
            let bs = self.bs();
            lock(&f.cache).unsynced.extend(offset / bs..=(offset + len - 1) / bs);
        }
        Ok((offset, data.len()))
    }

    /// An fsync (or unmount) without dirty blocks here: the blocks written to the
    /// server since the last one (directly, or written back under a lease
    /// since gone), and the metadata, made durable by a write request that
    /// writes nothing and, never shrinking a file, changes no size. Under
    /// no lease: a sync changes no data (and a direct lease may have moved
    /// on meanwhile). Nothing to send when nothing was written since.
    pub(super) fn sync_written(&self, f: &FileState, conn: &Conn) -> Result<()> {
        // Taken: blocks written meanwhile stay listed for the next fsync.
        let unsynced = std::mem::take(&mut lock(&f.cache).unsynced);
        if unsynced.is_empty() {
            return Ok(());
        }
        let r = conn.call(Req::WriteBlocks {
            gfi: f.gfi,
            lease: NO_LEASE,
            blocks: Vec::new(),
            min_size: 0,
            mtime: crate::meta::now(),
            sync: Some(unsynced.iter().copied().collect()),
            release: false,
            step_down: false,
        });
        match r {
            Ok(Reply::Written { .. }) => Ok(()),
            other => {
                lock(&f.cache).unsynced.extend(unsynced);
                Err(other.err().unwrap_or(Errno::EPROTO))
            }
        }
    }

    /// Fetches blocks `lo..=hi` in one request; keeps what this client
    /// wrote meanwhile.
    pub(super) fn fetch(&self, f: &FileState, conn: &Conn, lease: u64, lo: u64, hi: u64) -> Result<()> {
        let count = u32::try_from(hi - lo + 1).map_err(|_| Errno::EINVAL)?;
        let blocks = match conn.call(Req::ReadBlocks {
            gfi: f.gfi,
            lease,
            first: lo,
            count,
        })? {
            Reply::Blocks(b) if b.len() == count as usize => b,
            _ => return Err(Errno::EPROTO),
        };
        let mut c = lock(&f.cache);
        for (k, data) in blocks.into_iter().enumerate() {
            c.blocks.entry(lo + k as u64).or_insert(Block {
                data: data.map(ByteBuf::into_vec).unwrap_or_default(),
                dirty: false,
            });
        }
        c.evict_clean();
        Ok(())
    }

    /// Writes `data` at `at`; returns where it landed and how much of it
    /// was written (the caller goes on with the rest).
    pub(super) fn write(&self, ino: u64, at: At, data: &[u8]) -> Result<(u64, usize)> {
        let f = self.file(ino)?;
        let bs = self.bs();
        // Where an append lands is known only under the lease; the end
        // cached now is the guess of which blocks to fetch with it.
        let guess = at.offset().unwrap_or_else(|| lock(&f.cache).size);
        let end = guess.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        // The partly written end blocks are read first (below).
        let (first, last) = (guess / bs, end.saturating_sub(1) / bs);
        let head = !guess.is_multiple_of(bs) || end < (first + 1) * bs;
        let tail = !end.is_multiple_of(bs) && last != first;
        let want = match (head, tail) {
            _ if data.is_empty() => None,
            (true, true) => Some((first, last)),
            (true, false) => Some((first, first)),
            (false, true) => Some((last, last)),
            (false, false) => None,
        };
        self.with_lease_fetch(&f, LeaseMode::Write, want, |conn, slot| {
            if data.is_empty() {
                return Ok((guess, 0));
            }
            if slot.mode == Some(LeaseMode::Direct) {
                return self.write_direct(&f, conn, slot.id, at, data);
            }
            // The lease keeps every other client out until this returns:
            // the end found here is where the append lands.
            let offset = at.offset().unwrap_or_else(|| lock(&f.cache).size);
            let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
            {
                // Partly written blocks that exist on the server and are not
                // cached must be read first.
                let need: Vec<u64> = {
                    let c = lock(&f.cache);
                    let stored = c.size.div_ceil(bs);
                    let (first, last) = (offset / bs, (end - 1) / bs);
                    // The first and last block, once each (a write within
                    // one block fetched it twice).
                    [first, last][..if first == last { 1 } else { 2 }]
                        .iter()
                        .copied()
                        .filter(|&i| {
                            let covers = offset <= i * bs && end >= (i + 1) * bs;
                            !covers && i < stored && !c.blocks.contains_key(&i)
                        })
                        .collect()
                };
                for i in need {
                    self.fetch(&f, conn, slot.id, i, i)?;
                }
                let mut c = lock(&f.cache);
                let stored = c.size.div_ceil(bs);
                let mut pos = offset;
                let mut complete = true;
                while pos < end {
                    let i = pos / bs;
                    let within = (pos % bs) as usize;
                    let n = ((bs - pos % bs).min(end - pos)) as usize;
                    let covers = within == 0 && n as u64 == bs;
                    if !covers && i < stored && !c.blocks.contains_key(&i) {
                        complete = false;
                        break;
                    }
                    let b = c.blocks.entry(i).or_insert(Block {
                        data: Vec::new(),
                        dirty: false,
                    });
                    if b.data.len() < within + n {
                        b.data.resize(within + n, 0);
                    }
                    b.data[within..within + n].copy_from_slice(&data[(pos - offset) as usize..][..n]);
                    b.dirty = true;
                    pos += n as u64;
                }
                if pos > offset {
                    c.size = c.size.max(pos);
                    c.mtime = crate::meta::now();
                    c.meta_dirty = true;
                }
                if !complete {
                    // A needed block was dropped by the cache bound: the
                    // caller fetches the rest again (what is written stays).
                    return partial(pos - offset).map(|n| (offset, n));
                }
                let too_dirty = c.dirty_count() > DIRTY_MAX;
                drop(c);
                // Write-through by mode, or past the soft timeout: the
                // manager may be unreachable and the lease about to go.
                let through = self.cfg.consistency == Consistency::WriteThrough || conn.soft_expired();
                if too_dirty || through {
                    self.write_back(&f, conn, slot.id, false)?;
                }
                Ok((offset, data.len()))
            }
        })
    }

    pub(super) fn truncate(&self, f: &FileState, size: u64, change: AttrChange) -> Result<NodeInfo> {
        let bs = self.bs();
        self.with_lease(f, LeaseMode::Write, |conn, slot| {
            {
                let mut c = lock(&f.cache);
                c.blocks.retain(|i, _| i * bs < size);
                let tail = (size % bs) as usize;
                if let Some(b) = c.blocks.get_mut(&(size / bs)) {
                    if tail < b.data.len() {
                        b.data.truncate(tail);
                    }
                }
            }
            // Dirty data below the new size goes first, so that the size the
            // server records and the blocks it holds agree.
            self.write_back(f, conn, slot.id, false)?;
            let info = node_reply(conn.call(Req::SetAttr {
                ino: f.gfi.ino,
                change,
                lease: Some(slot.id),
            })?)?;
            let mut c = lock(&f.cache);
            c.size = size;
            c.mtime = info.attr.mtime;
            Ok(info)
        })
    }

    pub(super) fn fsync(&self, ino: u64) -> Result<()> {
        let f = self.file(ino)?;
        let conn = self.conn()?;
        let mut g = f.lease.read().unpoison();
        let mut lost = std::mem::take(&mut lock(&f.cache).lost);
        if g.mode.is_some() && g.id != NO_LEASE && g.session != conn.client.0 {
            // A lease of an earlier session: this client was cut off and
            // has reconnected since, in a new session. What is dirty under
            // it can never be written back (the manager may have given the
            // lease to another client meanwhile). Lost, and said so now,
            // whether or not the reconnection came before this fsync.
            let (id, session) = (g.id, g.session);
            drop(g);
            {
                let mut w = f.lease.write().unpoison();
                if w.id == id && w.session == session {
                    let mut c = lock(&f.cache);
                    c.clear();
                    lost |= std::mem::take(&mut c.lost);
                    *w = Slot::default();
                }
            }
            g = f.lease.read().unpoison();
        }
        if g.mode == Some(LeaseMode::Write) && (g.session == conn.client.0 || g.id == NO_LEASE) {
            match self.write_back(&f, &conn, g.id, true) {
                // The server fenced the lease off (gone, or its session
                // may have expired): what is dirty can never be written
                // under it. Lost, and said so now, once.
                Err(Errno::ESTALE) if g.id != NO_LEASE => {
                    let (id, session) = (g.id, g.session);
                    drop(g);
                    let mut g = f.lease.write().unpoison();
                    if g.id == id && g.session == session {
                        lock(&f.cache).clear();
                        *g = Slot::default();
                        self.drop_pages_soon(f.gfi.ino);
                    }
                    lock(&f.cache).lost = false;
                    return Err(Errno::EIO);
                }
                r => r?,
            }
        } else {
            // Written directly, or written back under a lease since gone.
            self.sync_written(&f, &conn)?;
        }
        if lost {
            return Err(Errno::EIO);
        }
        Ok(())
    }

    pub(super) fn shutdown(&self) -> Result<()> {
        let files: Vec<Arc<FileState>> = lock(&self.files).values().cloned().collect();
        let Some(conn) = lock(&self.conn).clone() else {
            return Ok(());
        };
        let mut result = Ok(());
        for f in files {
            let mut g = f.lease.write().unpoison();
            let held = g.mode.is_some() && (g.session == conn.client.0 || g.id == NO_LEASE);
            let synced = if held && g.mode == Some(LeaseMode::Write) {
                self.write_back(&f, &conn, g.id, true)
            } else {
                self.sync_written(&f, &conn)
            };
            if let Err(e) = synced {
                result = Err(e);
            }
            if !held {
                continue;
            }
            lock(&f.cache).clear();
            if g.id != NO_LEASE {
                let _ = conn.call(Req::Release {
                    gfi: f.gfi,
                    lease: g.id,
                });
            }
            *g = Slot::default();
        }
        result
    }
}
