//! The kernel's page cache under leases (`-o page_cache`): read-only opens
//! read through it, and it is emptied before a lease it was filled under
//! goes (see the module docs of [`super`], "Kernel page cache").

use shortfuse::sync::{lock, Unpoison};
use std::sync::atomic::Ordering;
use std::sync::{RwLockWriteGuard, Weak};
use std::time::Duration;

use shortfuse::{NodeId, Notifier, Result};

use super::lease::Slot;
use super::{later, FileState, Inner};
use crate::conn::Conn;

impl Inner {
    /// Whether the kernel may hold pages of files here.
    pub(super) fn caches_pages(&self) -> bool {
        self.cfg.caches_pages() && self.notifier.get().is_some()
    }

    /// Counts a READ served under the lease held now (the caller holds
    /// the slot shared): its pages may reach the kernel's cache.
    pub(super) fn note_served(&self, f: &FileState) {
        f.served.fetch_add(1, Ordering::AcqRel);
    }

    /// The slot of `f` held exclusive, with the kernel's pages of `f`
    /// emptied when `releases` says the lease held now is about to go.
    ///
    /// The kernel is told (FUSE_NOTIFY_INVAL_INODE) without the slot held:
    /// the kernel waits for every READ in flight on the pages it drops,
    /// and such a READ may wait for the slot. A READ served during the
    /// notification may have filled pages behind it, so it is sent again
    /// until none was; then the slot is taken before another can be.
    /// (The kernel ignores an attribute reply to a request sent before the
    /// notification: `fuse_reverse_inval_inode` moves the inode's
    /// `attr_version` on, which `fuse_change_attributes` checks.)
    ///
    /// On a worker ([`later::on_worker`]) nothing is sent: the READs the
    /// kernel would wait for may be queued for this very thread. Fails with
    /// [`later::MUST_WAIT`] instead, before anything was changed, for the
    /// caller to go on from another thread.
    pub(super) fn lock_dropping_pages<'f>(
        &self,
        f: &'f FileState,
        conn: &Conn,
        releases: impl Fn(&Slot) -> bool,
    ) -> Result<RwLockWriteGuard<'f, Slot>> {
        // Not `self.caches_pages()` alone: tests build clients without a
        // kernel; a client with a kernel always has its notifier.
        let Some(notifier) = self.notifier.get().filter(|_| self.cfg.caches_pages()) else {
            return Ok(f.lease.write().unpoison());
        };
        loop {
            if !releases(&f.lease.read().unpoison()) {
                let g = f.lease.write().unpoison();
                if !releases(&g) {
                    return Ok(g);
                }
                continue;
            }
            if later::on_worker() {
                return Err(later::MUST_WAIT);
            }
            let served = f.served.load(Ordering::Acquire);
            self.push_size(f, conn, notifier, &releases);
            if let Err(e) = notifier.inval_inode(NodeId(f.gfi.ino), 0, 0) {
                // ENOENT: the kernel holds no inode of it, hence no pages.
                if e.raw_os_error() != Some(libc::ENOENT) {
                    tracing::warn!("distfs: telling the kernel to drop the pages of {:?}: {e}", f.gfi);
                }
            }
            let g = f.lease.write().unpoison();
            if !releases(&g) || f.served.load(Ordering::Acquire) == served {
                return Ok(g);
            }
        }
    }

    /// Makes the kernel's size of `f` at least the size under the lease
    /// held now, by storing the file's last byte into its page cache
    /// (FUSE_NOTIFY_STORE grows the size to cover what it stores and is
    /// never ignored).
    ///
    /// Why: the notification that follows moves the inode's
    /// `attr_version` on, so the kernel ignores the answer to a GETATTR in
    /// flight then (`fuse_change_attributes`), and the read that asked for
    /// it (a read past the size the kernel knows, `fuse_cache_read_iter`)
    /// goes on with the size the kernel had before: one from before
    /// writes elsewhere that this lease has seen. After this store that
    /// size is the lease's, which held while that read ran.
    fn push_size(&self, f: &FileState, conn: &Conn, notifier: &Notifier, releases: &impl Fn(&Slot) -> bool) {
        let g = f.lease.read().unpoison();
        if !releases(&g) {
            return;
        }
        let bs = self.bs();
        let size = lock(&f.cache).size;
        let Some(last) = size.checked_sub(1) else {
            return;
        };
        let (i, within) = (last / bs, (last % bs) as usize);
        let cached = |c: &super::cache::Cache| c.blocks.get(&i).map(|b| b.data.get(within).copied().unwrap_or(0));
        let mut byte = cached(&lock(&f.cache));
        if byte.is_none() && self.fetch(f, conn, g.id, i, i).is_ok() {
            byte = cached(&lock(&f.cache));
        }
        // Not held while the kernel stores: it waits for a READ in flight
        // on that page, which may wait behind a thread asking for the
        // slot exclusive (a revocation of another lease of this file).
        drop(g);
        // Without the byte, nothing is stored: a wrong one could be read
        // before the pages go.
        if let Some(byte) = byte {
            if let Err(e) = notifier.store(NodeId(f.gfi.ino), last, &[byte]) {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    tracing::warn!("distfs: telling the kernel the size of {:?}: {e}", f.gfi);
                }
            }
        }
    }

    /// Runs while `inner` lives (`-o page_cache`): once this client's
    /// clock no longer vouches for its leases (no renewal confirmed, or
    /// the connection lost), the kernel drops the pages of every file,
    /// which no lease covers any more; this client serves nothing under
    /// those leases meanwhile ([`Inner::suffices`]). Looks a fortieth of
    /// the TTL apart, well within the tenth of it by which this client's
    /// clock stops trusting a lease before the manager's does.
    pub(super) fn watch_leases(inner: Weak<Inner>) {
        let mut dropped = false;
        loop {
            let Some(me) = inner.upgrade() else { return };
            let conn = lock(&me.conn).clone();
            let pause = conn.as_ref().map_or(Duration::from_millis(50), |c| c.ttl / 40);
            match conn {
                Some(c) if !c.leases_valid() => {
                    if !dropped {
                        let files: Vec<u64> = lock(&me.files).keys().copied().collect();
                        if let Some(notifier) = me.notifier.get() {
                            for ino in files {
                                let _ = notifier.inval_inode(NodeId(ino), 0, 0);
                            }
                        }
                        dropped = true;
                    }
                }
                _ => dropped = false,
            }
            drop(me);
            std::thread::sleep(pause);
        }
    }

    /// After a lease was lost rather than given back (its session ended):
    /// the kernel's pages of `f` go as soon as possible, from another
    /// thread (the caller may be serving a READ whose pages the kernel
    /// holds locked, which the notification would wait for).
    pub(super) fn drop_pages_soon(&self, ino: u64) {
        let Some(notifier) = self.notifier.get().filter(|_| self.cfg.caches_pages()).cloned() else {
            return;
        };
        let _ = self.revokers.run(Box::new(move || {
            let _ = notifier.inval_inode(NodeId(ino), 0, 0);
        }));
    }
}
