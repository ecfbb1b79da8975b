//! Process and thread calls (rustix's `process` and `thread` families).
#![allow(unsafe_code)]

use super::raw;

pub fn getpid() -> i64 {
    // SAFETY: no arguments.
    unsafe { raw(libc::SYS_getpid, 0, 0, 0, 0, 0, 0) }
}

pub fn gettid() -> i64 {
    // SAFETY: no arguments.
    unsafe { raw(libc::SYS_gettid, 0, 0, 0, 0, 0, 0) }
}

pub fn sched_yield() {
    // SAFETY: no arguments.
    unsafe { raw(libc::SYS_sched_yield, 0, 0, 0, 0, 0, 0) };
}

/// rt_sigprocmask(SIG_SETMASK): the kernel's 8-byte mask `set` becomes the
/// thread's; the old one goes to `old`.
pub fn set_signal_mask(set: u64, old: Option<&mut u64>) -> i64 {
    let o = old.map_or(0, |o| o as *mut u64 as i64);
    let how = i64::from(libc::SIG_SETMASK);
    // SAFETY: both masks are 8 bytes of ours, as the size says.
    unsafe { raw(libc::SYS_rt_sigprocmask, how, &set as *const u64 as i64, o, 8, 0, 0) }
}
