//! Who asks: the calling thread's credentials now, as the kernel stamps a
//! FUSE request with them (fsuid, fsgid) and checks permissions with them
//! (and the supplementary groups).
//!
//! A program may change them at any time (a server that drops root, `su`,
//! a thread that calls setfsuid), and each thread has its own. Reading
//! them costs four system calls, so each thread keeps what it read, until
//! a call that changes credentials passes through the hook (setuid and
//! friends are marked for the hook; glibc makes every thread run the call
//! itself). Any such call moves one counter, and a thread reads its
//! credentials again when the counter moved since it last did: a thread
//! whose own credentials did not change reads the same values, and one
//! whose did has moved the counter itself before its call reached the
//! kernel, so its next file call sees the new ones.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use shortfuse_vfs::Caller;

use crate::sys::raw;

/// Moved before every credential call of the program.
static GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CACHE: RefCell<(u64, Option<Arc<Caller>>)> = const { RefCell::new((0, None)) };
}

/// The system calls that change a thread's credentials.
pub const CALLS: [i64; 9] = [
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_setgroups,
];

/// Before a call of the program reaches the kernel (not the file
/// system's own calls, whose credential changes it undoes itself).
pub fn before_call(nr: i64) {
    if CALLS.contains(&nr) {
        GENERATION.fetch_add(1, Ordering::SeqCst);
    }
}

/// The calling thread's credentials.
pub fn current() -> Arc<Caller> {
    let generation = GENERATION.load(Ordering::SeqCst);
    CACHE
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            match &c.1 {
                Some(a) if c.0 == generation => Some(a.clone()),
                _ => {
                    let a = Arc::new(read());
                    *c = (generation, Some(a.clone()));
                    Some(a)
                }
            }
        })
        .ok()
        .flatten()
        // A thread past its thread-local destructors.
        .unwrap_or_else(|| Arc::new(read()))
}

fn read() -> Caller {
    // An invalid id (-1) changes nothing and returns the current one.
    // SAFETY: -1 changes nothing and returns the current id.
    let uid = unsafe { raw(libc::SYS_setfsuid, -1, 0, 0, 0, 0, 0) } as u32;
    // SAFETY: -1 changes nothing and returns the current id.
    let gid = unsafe { raw(libc::SYS_setfsgid, -1, 0, 0, 0, 0, 0) } as u32;
    let mut groups = Vec::new();
    // SAFETY: a buffer of ours of `n` ids (none with 0).
    let n = unsafe { raw(libc::SYS_getgroups, 0, 0, 0, 0, 0, 0) };
    if n > 0 {
        groups.resize(n as usize, 0u32);
        // SAFETY: a buffer of ours of `n` ids (none with 0).
        let got = unsafe { raw(libc::SYS_getgroups, n, groups.as_mut_ptr() as i64, 0, 0, 0, 0) };
        groups.truncate(got.max(0) as usize);
    }
    Caller { uid, gid, groups }
}
