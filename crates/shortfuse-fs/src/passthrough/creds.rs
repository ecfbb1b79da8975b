//! Per-request credentials: the calling user owns what it creates.
//!
//! `setfsuid`/`setfsgid` change the calling *thread's* file-system ids (the
//! raw system calls are per thread; glibc does not broadcast them the way
//! it broadcasts `setuid`). While the fsuid is not 0 the kernel also drops
//! the file-system capabilities (`CAP_DAC_OVERRIDE`, `CAP_FOWNER`, ...) from
//! the thread, so permission checks are the caller's; they come back when
//! the guard restores fsuid 0.
//!
//! Limitation: the kernel tells us the caller's uid and gid, not its
//! supplementary groups, and the thread keeps the daemon's own group list.
//! An operation that the caller may do only through a supplementary group
//! (creating a file in a directory writable by a secondary group) fails
//! with `EACCES` here even when the kernel's `default_permissions` check
//! let it through. (Requests of the preload shim carry the groups: a ring
//! daemon's worker thread takes all of the caller's credentials before
//! this runs.)

use std::cell::Cell;

use shortfuse::{Errno, Request, Result};

use super::sys;

thread_local! {
    /// Whether this thread already has its own zero umask (see
    /// [`sys::private_zero_umask`]).
    static ZERO_UMASK: Cell<bool> = const { Cell::new(false) };
}

/// Makes sure the daemon's umask does not mask modes a second time on this
/// thread. Done lazily, once per worker thread.
pub fn ensure_zero_umask() -> Result<()> {
    if ZERO_UMASK.with(|z| z.get()) {
        return Ok(());
    }
    sys::private_zero_umask()?;
    ZERO_UMASK.with(|z| z.set(true));
    Ok(())
}

/// While alive, the thread acts with the request's uid/gid; restores the
/// previous ids on drop.
pub struct CredGuard {
    old: Option<(u32, u32)>,
    /// The thread's supplementary groups before the switch, when it
    /// changed them.
    old_groups: Option<Vec<u32>>,
}

impl CredGuard {
    /// Switches to `req`'s ids when `enabled` (the daemon runs as root) and
    /// the caller is not root already.
    pub fn switch(req: &Request, enabled: bool) -> Result<CredGuard> {
        if !enabled || (req.uid == 0 && req.gid == 0) {
            return Ok(CredGuard {
                old: None,
                old_groups: None,
            });
        }
        // The caller's supplementary groups count in the source's checks
        // (a directory writable by one of them) and decide whether a file
        // made in a set-group-ID directory keeps its set-group-ID bit.
        // Set on this thread only (the raw call: glibc's setgroups changes
        // every thread of the daemon); before setfsuid, while the thread
        // still holds CAP_SETGID for certain.
        // In process (the preload shim's passthrough) the thread is the
        // caller's own and already holds its groups: nothing to change, and
        // a program that dropped root could not.
        let old_groups = if req.uid != 0 {
            let old = sys::thread_groups()?;
            let mut want = req.groups();
            let mut have = old.clone();
            want.sort_unstable();
            have.sort_unstable();
            if want != have {
                sys::set_thread_groups(&want)?;
                Some(old)
            } else {
                None
            }
        } else {
            None
        };
        // gid first: setfsgid needs CAP_SETGID, which the thread keeps
        // after setfsuid (it is not a file-system capability), but doing it
        // first keeps the order the exact reverse of the restore.
        let old_gid = sys::setfsgid(req.gid);
        let old_uid = sys::setfsuid(req.uid);
        let guard = CredGuard {
            old: Some((old_uid, old_gid)),
            old_groups,
        };
        // The calls report the previous id, never an error: ask again with
        // an invalid id (-1 changes nothing) to check that they took.
        if sys::setfsuid(u32::MAX) != req.uid || sys::setfsgid(u32::MAX) != req.gid {
            return Err(Errno::EPERM);
        }
        Ok(guard)
    }
}

impl Drop for CredGuard {
    fn drop(&mut self) {
        if let Some((uid, gid)) = self.old.take() {
            sys::setfsuid(uid);
            sys::setfsgid(gid);
        }
        if let Some(groups) = self.old_groups.take() {
            // The daemon's own groups, which it could set a moment ago.
            let _ = sys::set_thread_groups(&groups);
        }
    }
}
