//! The spare placeholder: the descriptor a close of ours gave back, kept
//! open in the kernel for the next open of ours to take.
//!
//! An open of a file system's file gives the program a placeholder (an
//! F_DUPFD of one O_PATH descriptor, so that the number is the lowest free
//! one, as POSIX wants), and its close closes it: two system calls of the
//! five an in-process open+close makes, 0.7 µs of its 2.3 here. A program
//! that closes a file and opens the next (a build, a `git status`, a
//! server answering requests) gets the same number back, so the close
//! parks it instead and the open takes it.
//!
//! The program must not be able to tell. While a number is parked:
//!
//! - it is the lowest free one. It is parked only when it was the lowest
//!   when it was handed out (F_DUPFD from 0, or taken from here) and no
//!   descriptor has been freed since: [`FREES`] counts every close the
//!   shim sees (a close, close_range, a flush of the spare) and [`LAST`]
//!   holds the newest placeholder handed out with the count at that time.
//!   A free after parking flushes the spare;
//! - the kernel never sees it: every system call flushes it before it
//!   reaches the kernel (the assembly's fast path too, through
//!   `Cfg::spare`), so a kernel open, socket or pipe gets the number, and
//!   fcntl, dup2 or /proc/self/fd on it find it closed. Opens, closes and
//!   the calls the shim serves in user space ([`keeps`]) leave it while
//!   they are ours;
//! - its FD_CLOEXEC is kept with it and set as the next open asks.
//!
//! Only a placeholder is parked: not a kernel-backed descriptor, nor one
//! swapped for a shared description (see `shared`), whose close the kernel
//! must see at once. The file system's own calls inside a served one
//! (`nested`) do not flush: what they open moves above the program's
//! numbers. Not seen: descriptors an io_uring closes in the kernel (a
//! close there, then a close of ours, can park a number above a free one).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use crate::sys::{self, fs, raw};

/// Descriptor numbers freed so far (a generation, see the module docs).
static FREES: AtomicU64 = AtomicU64::new(0);

/// The newest placeholder handed out and [`FREES`] before it was: only it
/// may be parked, and only while the count is unchanged. `u64::MAX`: none.
static LAST: AtomicU64 = AtomicU64::new(u64::MAX);

/// Bits of a descriptor number in [`LAST`] (the kernel's limit on
/// descriptors, `fs.nr_open`, is 2^20 by default).
const FD_BITS: u32 = 24;

const CLOEXEC: u64 = 1 << 32;

fn last(fd: i32, frees: u64) -> u64 {
    if !(0..1 << FD_BITS).contains(&fd) {
        return u64::MAX;
    }
    frees << FD_BITS | fd as u64
}

fn parked() -> &'static AtomicU64 {
    &sys::cfg().spare
}

/// A placeholder for an open with `cloexec`: the spare, or a new one.
pub fn placeholder(source: i64, cloexec: bool) -> i64 {
    let frees = FREES.load(Ordering::SeqCst);
    let spare = if parked().load(Ordering::Relaxed) == 0 {
        0
    } else {
        parked().swap(0, Ordering::SeqCst)
    };
    let fd = if spare != 0 {
        let fd = (spare as u32 - 1) as i64;
        if (spare & CLOEXEC != 0) != cloexec {
            let flag = if cloexec { libc::FD_CLOEXEC } else { 0 };
            fs::fcntl_int(fd as i32, libc::F_SETFD, i64::from(flag));
        }
        fd
    } else {
        let cmd = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
        // SAFETY: an integer command (F_DUPFD or F_DUPFD_CLOEXEC): nothing of memory.
        unsafe { raw(libc::SYS_fcntl, source, i64::from(cmd), 0, 0, 0, 0) }
    };
    if fd < 0 {
        return fd;
    }
    LAST.store(last(fd as i32, frees), Ordering::SeqCst);
    fd
}

/// The program closed descriptor `fd` of ours (already out of the table):
/// parks it when it is a bare placeholder and that keeps the numbering
/// exact, closes it otherwise.
pub fn close(fd: i32, placeholder: bool, cloexec: bool) {
    if !(placeholder && park(fd, cloexec)) {
        before_kernel(libc::SYS_close);
        fs::close(fd);
    }
}

fn park(fd: i32, cloexec: bool) -> bool {
    let frees = FREES.load(Ordering::SeqCst);
    if LAST.load(Ordering::SeqCst) != last(fd, frees) {
        return false;
    }
    let v = (fd as u64 + 1) | if cloexec { CLOEXEC } else { 0 };
    if parked()
        .compare_exchange(0, v, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return false;
    }
    // A close that counted after our look may have freed a lower number:
    // it flushed before we parked, so flush now.
    if FREES.load(Ordering::SeqCst) != frees {
        flush();
    }
    true
}

/// A descriptor number is being freed (a close, close_range), or a
/// placeholder is being replaced by another kernel file (exec's hand-over):
/// the spare may no longer be the lowest free number, nor may a
/// placeholder handed out before be parked.
pub fn freed() {
    FREES.fetch_add(1, Ordering::SeqCst);
}

/// Closes the spare, if any, so that the kernel sees what the program does.
pub fn flush() {
    // A vfork child shares our memory but not our descriptors.
    if parked().load(Ordering::Relaxed) == 0 || sys::thread().vforked.load(Ordering::Relaxed) != 0 {
        return;
    }
    let v = parked().swap(0, Ordering::SeqCst);
    if v != 0 {
        freed();
        fs::close((i64::from(v as u32) - 1) as i32);
    }
}

/// Before system call `nr` reaches the kernel for the program.
pub fn before_kernel(nr: i64) {
    if matches!(nr, libc::SYS_close | libc::SYS_close_range) {
        freed();
    }
    flush();
}

/// Whether call `nr` may find the spare where it is: opens and closes,
/// which take it, park it, or flush it themselves; and the calls that a
/// mount's path or descriptor has served in user space (stat, read,
/// getdents...), so that `close(a); stat(b); open(c)` keeps it too. Each
/// flushes it where it reaches the kernel: when `dispatch` hands it back
/// (the hook flushes), or when it is issued again with a resolved path
/// (`reissue`).
pub fn keeps(nr: i64) -> bool {
    matches!(
        nr,
        libc::SYS_open
            | libc::SYS_openat
            | libc::SYS_openat2
            | libc::SYS_creat
            | libc::SYS_close
            | libc::SYS_stat
            | libc::SYS_lstat
            | libc::SYS_newfstatat
            | libc::SYS_statx
            | libc::SYS_access
            | libc::SYS_faccessat
            | libc::SYS_faccessat2
            | libc::SYS_readlink
            | libc::SYS_readlinkat
            | libc::SYS_fstat
            | libc::SYS_lseek
            | libc::SYS_read
            | libc::SYS_write
            | libc::SYS_pread64
            | libc::SYS_pwrite64
            | libc::SYS_readv
            | libc::SYS_writev
            | libc::SYS_getdents64
    )
}
