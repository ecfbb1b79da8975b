//! The program's memory as the system calls hand it to us.
//!
//! The kernel never faults on a bad pointer a program passes: its
//! `copy_from_user` and `copy_to_user` turn the fault into EFAULT. We read
//! and write the program's memory directly, so every pointer is checked
//! first: an address in page 0 (our trampoline lives there, and the kernel
//! maps nothing of the program's below `vm.mmap_min_addr`) is EFAULT
//! outright, and every page a string, struct or small buffer covers is
//! probed with a futex operation that touches it from inside the kernel
//! (reading it, or adding 0 to a word of it for memory we write), which
//! reports a fault as EFAULT instead of delivering SIGSEGV. A probe costs
//! one system call per page (about 0.4 µs; `process_vm_readv` on
//! ourselves, the other way to copy without faulting, costs 1.5 µs).
//!
//! Most calls pass a path from the page the last few did (a buffer on the
//! stack, a string reused in a loop), so each thread remembers the last
//! [`crate::sys::PROBED`] pages found readable (or writable: the stat
//! struct a program's `fstat` fills), for as long as no call that
//! can unmap memory or take a protection away has run in the process
//! (munmap, mprotect, mremap, brk, madvise, mmap with MAP_FIXED, shmat,
//! shmdt, pkey_mprotect, and a fork, whose child lacks MADV_DONTFORK
//! pages): the entry moves a generation before each of them
//! (`Cfg::mem_gen`), and a remembered page is trusted only while the
//! generation is the one it was probed in. A mapped stat then makes one
//! system call, not two, and so does an `fstat` of a mapped file. Not seen: a file mapping whose file is truncated
//! (SIGBUS rather than EFAULT, as for a copy after a probe), and calls
//! made by code the shim does not intercept.
//!
//! Buffers over [`PROBED_PAGES`] pages are probed at both ends only: a hole
//! in their middle still faults, as it does for the kernel-backed
//! descriptors' reads and writes never (those reach the kernel itself).
//! A page unmapped by another thread between the probe and the copy
//! faults too, as it would have before the check.
//!
//! The contract of the functions that read or write the program's memory
//! (they are `unsafe fn`): the pointer is an argument of the system call
//! being served and points into the program's memory, never ours (nothing
//! of ours may hold a reference to it); a reference handed out is used
//! only while that call is served; and the program does not unmap, remap
//! or write that memory meanwhile. A program could break the last with
//! another thread: what it then reads or faults on is its own doing, as it
//! is natively, but Rust's rules for the reference would be broken, which
//! is why these functions are not safe to call on any address.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use shortfuse::Errno;

use crate::sys::raw;

const PAGE: usize = 4096;

/// Addresses below this are never the program's: page 0 holds the
/// trampoline, and nothing else may be mapped below `vm.mmap_min_addr`.
const LOWEST: usize = PAGE;

/// The longest path the kernel accepts, with its NUL (PATH_MAX).
const PATH_MAX: usize = 4096;

/// Buffers up to this many pages are probed page by page.
pub const PROBED_PAGES: usize = 64;

/// A word of our own, the futex operations' other address.
static OTHER: AtomicU32 = AtomicU32::new(0);

const FUTEX_PRIVATE: i64 = 128;
const FUTEX_WAKE_OP: i64 = 5;
const FUTEX_CMP_REQUEUE: i64 = 4;
/// `FUTEX_OP(FUTEX_OP_ADD, 0, FUTEX_OP_CMP_EQ, 0)`: `*uaddr2 += 0`.
const ADD_ZERO: i64 = 1 << 28;

fn other() -> i64 {
    OTHER.as_ptr() as i64
}

/// Whether the page holding `addr` can be read: remembered by this thread
/// (see the module docs), else probed.
fn readable_page(addr: usize) -> bool {
    remembered_or(addr, false, probe_readable)
}

/// Whether the page holding `addr` can be written: remembered by this
/// thread (see the module docs), else probed. Only a protection change
/// (mprotect, which moves the generation) takes writing away from a mapped
/// page; copy-on-write after a fork is the kernel's to resolve on the copy.
fn writable_page(addr: usize) -> bool {
    remembered_or(addr, true, probe_writable)
}

/// Marks a remembered page as found writable (pages are aligned, so the
/// low bit is free). A writable page is readable too (x86-64 has no
/// write-only pages).
const WRITABLE: u64 = 1;

/// Whether this thread remembers the page of `addr` as readable (as
/// writable with `write`) in the current generation, else `probe`'s answer,
/// remembered when yes.
fn remembered_or(addr: usize, write: bool, probe: fn(usize) -> bool) -> bool {
    let page = (addr & !(PAGE - 1)) as u64;
    let t = crate::sys::thread();
    let gen = crate::sys::cfg().mem_gen.load(Ordering::Acquire);
    if t.probed_gen.load(Ordering::Relaxed) == gen {
        let known = |p: u64| {
            if write {
                p == page | WRITABLE
            } else {
                p & !WRITABLE == page
            }
        };
        if t.probed.iter().any(|p| known(p.load(Ordering::Relaxed))) {
            return true;
        }
    } else {
        for p in &t.probed {
            p.store(0, Ordering::Relaxed);
        }
        t.probed_gen.store(gen, Ordering::Relaxed);
    }
    let ok = probe(addr);
    if ok {
        let i = t.probed_next.fetch_add(1, Ordering::Relaxed) as usize % t.probed.len();
        t.probed[i].store(if write { page | WRITABLE } else { page }, Ordering::Relaxed);
    }
    ok
}

/// The probe of [`readable_page`]: FUTEX_CMP_REQUEUE reads the word at
/// `addr` to compare it (then wakes and moves no waiter); only a fault
/// gives EFAULT.
fn probe_readable(addr: usize) -> bool {
    let word = (addr & !3) as i64;
    let op = FUTEX_CMP_REQUEUE | FUTEX_PRIVATE;
    // SAFETY: FUTEX_WAKE_OP on a word of ours and the probed word, which the kernel only checks
    // (adding 0).
    let r = unsafe { raw(libc::SYS_futex, word, op, 0, 0, other(), 0) };
    r != -i64::from(libc::EFAULT)
}

/// The probe of [`writable_page`]: FUTEX_WAKE_OP adds 0 to the word at
/// `addr` atomically (a concurrent writer loses nothing), then wakes no
/// waiter.
fn probe_writable(addr: usize) -> bool {
    let word = (addr & !3) as i64;
    let op = FUTEX_WAKE_OP | FUTEX_PRIVATE;
    // SAFETY: FUTEX_WAKE_OP on a word of ours and the probed word, which the kernel only checks
    // (adding 0).
    let r = unsafe { raw(libc::SYS_futex, other(), op, 0, 0, word, ADD_ZERO) };
    r != -i64::from(libc::EFAULT)
}

/// Checks `len` bytes at `p` with `probe` (see [`PROBED_PAGES`]).
fn check(p: i64, len: usize, probe: fn(usize) -> bool) -> Result<(), Errno> {
    let start = p as u64 as usize;
    let Some(end) = start.checked_add(len) else {
        return Err(Errno::EFAULT);
    };
    if start < LOWEST {
        return Err(Errno::EFAULT);
    }
    let first = start & !(PAGE - 1);
    let last = (end - 1) & !(PAGE - 1);
    let pages = (last - first) / PAGE + 1;
    let ok = if pages <= PROBED_PAGES {
        (0..pages).all(|i| probe(first + i * PAGE))
    } else {
        probe(start) && probe(end - 1)
    };
    if ok {
        Ok(())
    } else {
        Err(Errno::EFAULT)
    }
}

/// Whether a write-family call (write, pwrite64, writev, pwritev,
/// pwritev2) on a kernel descriptor would have the kernel read a buffer in
/// page 0: our trampoline, which the program did not give (EFAULT for it).
pub fn in_page_zero(nr: i64, a: [i64; 6]) -> bool {
    let low = |p: i64, len: usize| len > 0 && (p as u64 as usize) < LOWEST;
    match nr {
        libc::SYS_write | libc::SYS_pwrite64 => low(a[1], a[2] as usize),
        // The kernel refuses a count outside 0..=IOV_MAX (EINVAL) before it
        // reads the array, and a bad array (EFAULT).
        libc::SYS_writev | libc::SYS_pwritev | libc::SYS_pwritev2 if !(0..=1024).contains(&a[2]) => false,
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        libc::SYS_writev | libc::SYS_pwritev | libc::SYS_pwritev2 => match unsafe { iovecs(a[1], a[2]) } {
            Ok(v) => v.iter().any(|v| low(v.iov_base as i64, v.iov_len)),
            Err(_) => false,
        },
        _ => false,
    }
}

/// The NUL-terminated path at `p`, as the kernel's getname reads it:
/// EFAULT for a bad pointer (null among them), ENAMETOOLONG without a NUL
/// in PATH_MAX bytes.
///
/// # Safety
///
/// The module's contract: `p` is an argument of the call being served,
/// into the program's memory; the reference does not outlive the call.
pub unsafe fn cstr<'a>(p: i64) -> Result<&'a [u8], Errno> {
    cstr_max(p, PATH_MAX)
}

/// The NUL-terminated string at `p`, of at most `max - 1` bytes
/// (ENAMETOOLONG beyond).
///
/// # Safety
///
/// The module's contract: `p` is an argument of the call being served,
/// into the program's memory; the reference does not outlive the call.
pub unsafe fn cstr_max<'a>(p: i64, max: usize) -> Result<&'a [u8], Errno> {
    let start = p as u64 as usize;
    if start < LOWEST {
        return Err(Errno::EFAULT);
    }
    let mut from = start;
    loop {
        if !readable_page(from) {
            return Err(Errno::EFAULT);
        }
        let page_end = (from & !(PAGE - 1)) + PAGE;
        // SAFETY: [from, page_end) lies in one page just found readable.
        let bytes = unsafe { std::slice::from_raw_parts(from as *const u8, page_end - from) };
        if let Some(i) = bytes.iter().position(|&b| b == 0) {
            let len = from - start + i;
            if len >= max {
                return Err(Errno::ENAMETOOLONG);
            }
            // SAFETY: the bytes up to the NUL, in pages found readable.
            return Ok(unsafe { std::slice::from_raw_parts(start as *const u8, len) });
        }
        if page_end - start >= max {
            return Err(Errno::ENAMETOOLONG);
        }
        from = page_end;
    }
}

/// The `len` bytes at `p` that a call reads (write's buffer, say).
///
/// # Safety
///
/// The module's contract: `p` is an argument of the call being served,
/// into the program's memory; the reference does not outlive the call.
pub unsafe fn slice<'a>(p: i64, len: usize) -> Result<&'a [u8], Errno> {
    if len == 0 {
        return Ok(&[]);
    }
    check(p, len, readable_page)?;
    // SAFETY: a buffer argument of `len` bytes, found readable.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
}

/// The `len` bytes at `p` that a call fills (read's buffer, say).
///
/// # Safety
///
/// The module's contract: `p` is an argument of the call being served,
/// into the program's memory; the reference does not outlive the call.
pub unsafe fn slice_mut<'a>(p: i64, len: usize) -> Result<&'a mut [u8], Errno> {
    if len == 0 {
        return Ok(&mut []);
    }
    check(p, len, writable_page)?;
    // SAFETY: a buffer argument of `len` bytes, found writable.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
}

/// Copies `v` to the program's `p` (a stat, statx, statfs struct...).
///
/// # Safety
///
/// The module's contract: `p` is an argument of the call being served,
/// into the program's memory; any bit pattern is a valid `T`.
pub unsafe fn put<T: Copy>(p: i64, v: &T) -> Result<(), Errno> {
    check(p, std::mem::size_of::<T>(), writable_page)?;
    // SAFETY: `p` is the program's output struct of type T, found writable.
    unsafe { std::ptr::write_unaligned(p as *mut T, *v) };
    Ok(())
}

/// Lets `fix` change in place the program's `T` at `p` that the kernel
/// has just filled in for a call of ours (a stat struct): the kernel found
/// it mapped and writable, so it is not probed again.
pub fn amend<T: Copy>(p: i64, fix: impl FnOnce(&mut T)) {
    // SAFETY: `p` is the program's output struct of type T, which the
    // kernel has just written (a concurrent munmap faults, as after a probe).
    let mut v = unsafe { std::ptr::read_unaligned(p as *const T) };
    fix(&mut v);
    // SAFETY: as above.
    unsafe { std::ptr::write_unaligned(p as *mut T, v) };
}

/// Copies the program's `T` at `p` (a struct flock, say).
///
/// # Safety
///
/// The module's contract: `p` is an argument of the call being served,
/// into the program's memory; any bit pattern is a valid `T`.
pub unsafe fn get<T: Copy>(p: i64) -> Result<T, Errno> {
    check(p, std::mem::size_of::<T>(), readable_page)?;
    // SAFETY: `p` is the program's input struct of type T, found readable.
    Ok(unsafe { std::ptr::read_unaligned(p as *const T) })
}

/// The `struct iovec` array at `p` (its buffers are checked as each is taken).
///
/// # Safety
///
/// The module's contract: `p` is an argument of the call being served,
/// into the program's memory; the reference does not outlive the call.
pub unsafe fn iovecs<'a>(p: i64, n: i64) -> Result<&'a [libc::iovec], Errno> {
    if n <= 0 {
        return Ok(&[]);
    }
    let len = (n as usize).saturating_mul(std::mem::size_of::<libc::iovec>());
    check(p, len, readable_page)?;
    // SAFETY: an iovec array argument of `n` entries, found readable.
    Ok(unsafe { std::slice::from_raw_parts(p as *const libc::iovec, n as usize) })
}

/// Appends the descriptors `msg` passes (SCM_RIGHTS) to `fds`; a control
/// buffer that cannot be read passes none (the kernel then fails the call).
pub fn passed_fds(msg: &libc::msghdr, fds: &mut Vec<i32>) {
    if msg.msg_control.is_null() || msg.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return;
    }
    if check(msg.msg_control as i64, msg.msg_controllen, readable_page).is_err() {
        return;
    }
    // SAFETY: the program's control buffer of `msg_controllen` bytes, found
    // readable, which the kernel reads the same way; CMSG_NXTHDR stays
    // within it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let head = libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c).cast::<i32>();
                let end = msg.msg_control as usize + msg.msg_controllen;
                let n = ((*c).cmsg_len.saturating_sub(head)).min(end.saturating_sub(data as usize))
                    / std::mem::size_of::<i32>();
                for i in 0..n {
                    fds.push(std::ptr::read_unaligned(data.add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
}

/// A zeroed C struct (stat, statx, statfs).
pub fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for plain C structs of integers, for which all-zero
    // bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// The `i`th pointer of the NULL-terminated pointer array at `p` (argv, envp).
///
/// # Safety
///
/// The module's contract: `p` is an argument of the call being served,
/// into the program's memory.
pub unsafe fn pointer_at(p: i64, i: usize) -> Result<i64, Errno> {
    get::<i64>(p.wrapping_add((i * 8) as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pointers_are_efault() {
        // SAFETY: buffers of the test's that nothing else refers to meanwhile, and
        // addresses the functions refuse.
        unsafe {
            let s = c"/some/path";
            assert_eq!(cstr(s.as_ptr() as i64), Ok(&b"/some/path"[..]));
            for bad in [0i64, 8, 0xDEAD_C0DE, -1, 0x7fff_ffff_f000] {
                assert_eq!(cstr(bad), Err(Errno::EFAULT), "{bad:#x}");
                assert_eq!(get::<u64>(bad), Err(Errno::EFAULT), "{bad:#x}");
                assert_eq!(put(bad, &0u64), Err(Errno::EFAULT), "{bad:#x}");
                assert_eq!(slice(bad, 1).err(), Some(Errno::EFAULT), "{bad:#x}");
            }
            // Read-only memory reads, but is not written.
            let lit: &'static [u8; 8] = b"literal\0";
            assert_eq!(get::<u64>(lit.as_ptr() as i64), Ok(u64::from_ne_bytes(*lit)));
            assert_eq!(put(lit.as_ptr() as i64, &0u64), Err(Errno::EFAULT));
            let mut v = 7u64;
            assert_eq!(put(&mut v as *mut u64 as i64, &9u64), Ok(()));
            assert_eq!(v, 9);
            // Zero-length buffers are never touched, as in the kernel.
            assert_eq!(slice(0, 0), Ok(&[][..]));
        }
    }

    #[test]
    fn strings_end_within_path_max() {
        // SAFETY: buffers of the test's that nothing else refers to meanwhile, and
        // addresses the functions refuse.
        unsafe {
            let long = vec![b'a'; PATH_MAX + 10];
            assert_eq!(cstr(long.as_ptr() as i64), Err(Errno::ENAMETOOLONG));
            let mut ok = vec![b'a'; PATH_MAX - 1];
            ok.push(0);
            assert_eq!(cstr(ok.as_ptr() as i64).map(<[u8]>::len), Ok(PATH_MAX - 1));
            let mut too = vec![b'a'; PATH_MAX];
            too.push(0);
            assert_eq!(cstr(too.as_ptr() as i64), Err(Errno::ENAMETOOLONG));
        }
    }
}
