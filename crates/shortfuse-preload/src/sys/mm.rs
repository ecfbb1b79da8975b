//! Memory-map calls (rustix's `mm` family). All are `unsafe`: a map, an
//! unmap or a change of protection can pull memory from under Rust code.
#![allow(unsafe_code)]

use super::raw;

/// mmap.
///
/// # Safety
///
/// `addr` with MAP_FIXED replaces whatever is mapped there: the caller
/// vouches that nothing of ours lives in the range (or that it is the
/// program's own request, handed on as it made it).
pub unsafe fn mmap(addr: i64, len: i64, prot: i64, flags: i64, fd: i64, off: i64) -> i64 {
    // SAFETY: see the function's contract.
    unsafe { raw(libc::SYS_mmap, addr, len, prot, flags, fd, off) }
}

/// munmap.
///
/// # Safety
///
/// The range is a mapping of the caller's that nothing uses any more.
pub unsafe fn munmap(addr: i64, len: i64) -> i64 {
    super::memory_moved();
    // SAFETY: see the function's contract.
    unsafe { raw(libc::SYS_munmap, addr, len, 0, 0, 0, 0) }
}

/// mprotect.
///
/// # Safety
///
/// The range is a mapping of the caller's, and nothing of ours reads or
/// writes it against the new protection.
pub unsafe fn mprotect(addr: i64, len: i64, prot: i64) -> i64 {
    super::memory_moved();
    // SAFETY: see the function's contract.
    unsafe { raw(libc::SYS_mprotect, addr, len, prot, 0, 0, 0) }
}
