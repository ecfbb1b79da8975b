//! The system calls the passthrough file system makes, wrapped so that the
//! rest of the module stays free of `unsafe`.
//!
//! Every wrapper takes borrowed descriptors and `&CStr` names, returns
//! `Result<_, Errno>` with the thread's `errno` on failure, and never follows
//! a symbolic link unless its doc says so (only the `/proc/self/fd/N` magic
//! links, which lead to the very inode the descriptor holds).

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

use shortfuse::{Errno, Result};

/// Turns a `-1`-on-error return into `Err(errno)`.
fn cvt<T: Copy + PartialEq + From<i8>>(ret: T) -> Result<T> {
    if ret == T::from(-1) {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

/// Retries a call interrupted by a signal.
fn retry<T: Copy + PartialEq + From<i8>>(mut f: impl FnMut() -> T) -> Result<T> {
    loop {
        match cvt(f()) {
            Err(e) if e == Errno::EINTR => continue,
            other => return other,
        }
    }
}

fn owned(fd: libc::c_int) -> Result<OwnedFd> {
    let fd = cvt(fd)?;
    // SAFETY: the kernel just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

const EMPTY: &CStr = c"";

/// `"/proc/self/fd/N"` built on the stack: the path through which an
/// `O_PATH` descriptor is reopened, or used where the kernel has no `*at`
/// form that accepts one (xattrs, `linkat` without `CAP_DAC_READ_SEARCH`).
pub struct ProcPath {
    buf: [u8; 32],
}

impl ProcPath {
    const PREFIX: &'static [u8] = b"/proc/self/fd/";

    pub fn new(fd: BorrowedFd<'_>) -> ProcPath {
        const PREFIX: &[u8] = ProcPath::PREFIX;
        let mut buf = [0u8; 32];
        buf[..PREFIX.len()].copy_from_slice(PREFIX);
        let mut digits = [0u8; 10];
        let mut n = fd.as_raw_fd() as u32;
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for i in 0..len {
            buf[PREFIX.len() + i] = digits[len - 1 - i];
        }
        ProcPath { buf }
    }

    pub fn as_cstr(&self) -> &CStr {
        // The buffer always ends in zeros: a 14-byte prefix and at most 10 digits.
        CStr::from_bytes_until_nul(&self.buf).unwrap_or(EMPTY)
    }

    /// The last component, `"N"`: the name in the `/proc/self/fd` directory.
    fn fd_name(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.buf[Self::PREFIX.len()..]).unwrap_or(EMPTY)
    }
}

/// This process's `/proc/self/fd` directory, opened once, as
/// `pid << 32 | descriptor` (0: not yet). `openat(dir, "N")` then skips
/// the walk through `/proc` and its `self` link that `open("/proc/self/fd/N")`
/// makes each time, which here is about as long as the rest of the open
/// (a C loop of open+close: 7.3 µs through the full path, 4.5-5 µs through
/// the directory, 3.2-3.5 µs for a plain path). Keyed by pid: a child forked
/// by a program that runs the file system in process (the preload shim)
/// inherits the descriptor, which names its parent's table, and opens its own.
static PROC_FD_DIR: AtomicU64 = AtomicU64::new(0);

/// Set once a passthrough is built in a program's own process: only there
/// may a child made without fork(3) (a raw clone) use the parent's
/// directory, so only there is the pid checked at each open. A daemon's
/// own forks (going to the background) reset the cache through
/// `pthread_atfork`, and its opens then make no getpid(2) call.
static CHILDREN_WITHOUT_FORK: AtomicBool = AtomicBool::new(false);

/// Called when a passthrough is built in a program's own process.
pub fn serve_in_process() {
    CHILDREN_WITHOUT_FORK.store(true, Ordering::Relaxed);
}

extern "C" fn forget_proc_fd_dir() {
    PROC_FD_DIR.store(0, Ordering::Relaxed);
}

fn proc_fd_dir() -> Option<RawFd> {
    if !CHILDREN_WITHOUT_FORK.load(Ordering::Relaxed) {
        let cached = PROC_FD_DIR.load(Ordering::Acquire);
        if cached != 0 {
            return Some(cached as u32 as RawFd);
        }
        // Not in a program's process, whose libc the shim leaves alone.
        static AT_FORK: Once = Once::new();
        AT_FORK.call_once(|| {
            // SAFETY: the handler only stores to an atomic, which is
            // async-signal-safe as a child handler must be.
            unsafe { libc::pthread_atfork(None, None, Some(forget_proc_fd_dir)) };
        });
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let cached = PROC_FD_DIR.load(Ordering::Acquire);
    if cached != 0 && (cached >> 32) as u32 == pid {
        return Some(cached as u32 as RawFd);
    }
    let dir = openat(libc::AT_FDCWD, c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY).ok()?;
    // Kept: in a program's own process, away from the numbers the program
    // uses (it may be opened before the shim serves anything and moves
    // what the file system opens).
    let floor = crate::registry::IN_PROCESS_FD_FLOOR;
    let dir = dup_at_least(dir.as_fd(), floor).unwrap_or(dir);
    let mine = (u64::from(pid) << 32) | u64::from(dir.as_raw_fd() as u32);
    match PROC_FD_DIR.compare_exchange(cached, mine, Ordering::AcqRel, Ordering::Acquire) {
        // Kept for the life of the process. A parent's inherited copy is
        // left open: its number may belong to the program by now.
        Ok(_) => Some(dir.into_raw_fd()),
        Err(won) if (won >> 32) as u32 == pid => Some(won as u32 as RawFd),
        Err(_) => None,
    }
}

/// `struct open_how` (libc's is non-exhaustive and cannot be built).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(dir, name, {flags, mode, resolve})`.
pub fn openat2(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32, resolve: u64) -> Result<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: mode as u64,
        resolve,
    };
    let fd = retry(|| {
        // SAFETY: `name` is NUL-terminated and `how` outlives the call; the
        // size passed is the size of the struct given.
        unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                name.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        }
    })?;
    owned(fd as libc::c_int)
}

/// `openat(dir, name, flags)` for names that are known to be safe to
/// resolve (".", or a path the caller controls).
pub fn openat(dir: RawFd, name: &CStr, flags: i32) -> Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; the returned fd is taken over by `owned`.
    let fd = retry(|| unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC) })?;
    owned(fd)
}

/// A readable descriptor for the directory an `O_PATH` descriptor names.
pub fn open_dir(dir: BorrowedFd<'_>) -> Result<OwnedFd> {
    // Through the magic link, not `openat(dir, ".")`: looking up "." needs
    // search permission on the directory, and a caller may list a
    // directory it can read but not search (mode 0600, as on ext4).
    reopen(dir, libc::O_RDONLY | libc::O_DIRECTORY)
}

/// Opens the inode behind `fd` again with `flags` through its
/// `/proc/self/fd` magic link. The caller must not pass a symbolic link:
/// the magic link would hand the symlink inode itself to `open`, which is
/// never what a FUSE `open` means.
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> Result<OwnedFd> {
    let path = ProcPath::new(fd);
    match proc_fd_dir() {
        Some(dir) => openat(dir, path.fd_name(), flags),
        None => openat(libc::AT_FDCWD, path.as_cstr(), flags),
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)` of one component `name`.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `name` is NUL-terminated and `st` is a valid out-pointer for
    // one `struct stat`.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded and filled the struct.
    Ok(unsafe { st.assume_init() })
}

/// `fstatat(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`: works on `O_PATH`
/// descriptors too.
pub fn fstat(fd: BorrowedFd<'_>) -> Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is a valid out-pointer for one `struct stat`.
    cvt(unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded and filled the struct.
    Ok(unsafe { st.assume_init() })
}

pub fn fstatvfs(fd: BorrowedFd<'_>) -> Result<libc::statvfs> {
    let mut st = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `st` is a valid out-pointer for one `struct statvfs`.
    retry(|| unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatvfs succeeded and filled the struct.
    Ok(unsafe { st.assume_init() })
}

/// Whether close(2) of a file on the file system holding `fd` can report
/// nothing that fsync(2) would not: the local file systems named here have
/// no `flush` of their own and report write errors at fsync. Network and
/// stacked ones (NFS, CIFS, FUSE, ...) may report deferred write errors at
/// close, and any file system not named here is taken to be one of them.
pub fn close_reports_nothing(fd: BorrowedFd<'_>) -> bool {
    let mut st = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `st` is a valid out-pointer for one `struct statfs`.
    if retry(|| unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) }).is_err() {
        return false;
    }
    // SAFETY: fstatfs succeeded and filled the struct.
    let kind = unsafe { st.assume_init() }.f_type;
    [
        libc::EXT4_SUPER_MAGIC,
        libc::XFS_SUPER_MAGIC,
        libc::BTRFS_SUPER_MAGIC,
        libc::TMPFS_MAGIC,
        libc::F2FS_SUPER_MAGIC,
    ]
    .contains(&kind)
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> Result<usize> {
    // SAFETY: the pointer and length describe `buf`, which is writable.
    let n = retry(|| unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), offset as i64) })?;
    Ok(n as usize)
}

pub fn pwrite(fd: BorrowedFd<'_>, data: &[u8], offset: u64) -> Result<usize> {
    // SAFETY: the pointer and length describe `data`.
    let n = retry(|| unsafe { libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), offset as i64) })?;
    Ok(n as usize)
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> Result<()> {
    // SAFETY: plain system calls on a borrowed descriptor.
    retry(|| unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })?;
    Ok(())
}

/// `close(dup(fd))`: reports the errors a file system gives at close time
/// (NFS, FUSE below us) without closing the handle the kernel still uses.
pub fn close_dup(fd: BorrowedFd<'_>) -> Result<()> {
    // SAFETY: dup of a borrowed descriptor; the copy is closed right away.
    let copy = cvt(unsafe { libc::dup(fd.as_raw_fd()) })?;
    // SAFETY: `copy` is ours; close is not retried on EINTR (the fd is gone).
    cvt(unsafe { libc::close(copy) })?;
    Ok(())
}

pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> Result<()> {
    // SAFETY: plain system call on a borrowed descriptor.
    retry(|| unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) })?;
    Ok(())
}

pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> Result<()> {
    // SAFETY: plain system call on a borrowed descriptor.
    retry(|| unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset as i64, len as i64) })?;
    Ok(())
}

pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> Result<u64> {
    // SAFETY: plain system call on a borrowed descriptor.
    let off = cvt(unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) })?;
    Ok(off as u64)
}

pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: usize,
    flags: u32,
) -> Result<usize> {
    let mut off_in = off_in as i64;
    let mut off_out = off_out as i64;
    // SAFETY: the offsets are valid in/out pointers for the call's duration.
    let n = retry(|| unsafe {
        libc::copy_file_range(
            fd_in.as_raw_fd(),
            &mut off_in,
            fd_out.as_raw_fd(),
            &mut off_out,
            len,
            flags,
        )
    })?;
    Ok(n as usize)
}

/// `getdents64(fd, buf)`: the number of bytes of `struct linux_dirent64`
/// records written, 0 at the end of the directory.
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize> {
    // SAFETY: the pointer and length describe `buf`, which is writable.
    let n = retry(|| unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()) })?;
    Ok(n as usize)
}

pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })?;
    Ok(())
}

pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, dev: libc::dev_t) -> Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) })?;
    Ok(())
}

pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    // SAFETY: both strings are NUL-terminated.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(())
}

pub fn renameat2(dir: BorrowedFd<'_>, name: &CStr, new_dir: BorrowedFd<'_>, new_name: &CStr, flags: u32) -> Result<()> {
    // SAFETY: both names are NUL-terminated.
    cvt(unsafe {
        libc::renameat2(
            dir.as_raw_fd(),
            name.as_ptr(),
            new_dir.as_raw_fd(),
            new_name.as_ptr(),
            flags,
        )
    })?;
    Ok(())
}

/// `linkat(AT_FDCWD, "/proc/self/fd/N", new_dir, new_name, AT_SYMLINK_FOLLOW)`:
/// following the magic link lands on the inode `fd` holds (a symlink
/// included, which is not followed further). Unlike `AT_EMPTY_PATH` it needs
/// no `CAP_DAC_READ_SEARCH`, so it works under a caller's fsuid.
pub fn link_proc(fd: BorrowedFd<'_>, new_dir: BorrowedFd<'_>, new_name: &CStr) -> Result<()> {
    let path = ProcPath::new(fd);
    // SAFETY: both names are NUL-terminated.
    cvt(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            path.as_cstr().as_ptr(),
            new_dir.as_raw_fd(),
            new_name.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })?;
    Ok(())
}

/// `readlinkat(fd, "", ...)` on an `O_PATH` symlink descriptor.
pub fn readlink_fd(fd: BorrowedFd<'_>) -> Result<Vec<u8>> {
    readlink_raw(fd.as_raw_fd(), EMPTY)
}

/// `readlink(path)` for a path the caller controls (a `/proc` link).
pub fn readlink_path(path: &CStr) -> Result<Vec<u8>> {
    readlink_raw(libc::AT_FDCWD, path)
}

fn readlink_raw(dir: RawFd, name: &CStr) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the pointer and length describe `buf`.
    let n = cvt(unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })? as usize;
    if n >= buf.len() {
        return Err(Errno::ENAMETOOLONG);
    }
    buf.truncate(n);
    Ok(buf)
}

/// `fchmodat2(fd, "", mode, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)` (Linux
/// 6.6+): chmod through an `O_PATH` descriptor without touching `/proc`.
pub fn fchmod_path(fd: BorrowedFd<'_>, mode: u32) -> Result<()> {
    // SAFETY: the empty name is NUL-terminated.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            mode,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> Result<()> {
    // SAFETY: plain system call on a borrowed descriptor.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
    Ok(())
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`;
/// `u32::MAX` leaves an id unchanged.
pub fn fchown_path(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> Result<()> {
    // SAFETY: the empty name is NUL-terminated.
    cvt(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// `utimensat(fd, "", times, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`.
pub fn utimens_path(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> Result<()> {
    // SAFETY: `times` points to two timespecs; the empty name is NUL-terminated.
    cvt(unsafe {
        libc::utimensat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            times.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

pub fn futimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> Result<()> {
    // SAFETY: `times` points to two timespecs.
    cvt(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) })?;
    Ok(())
}

/// `faccessat2(fd, "", mask, AT_EMPTY_PATH | AT_EACCESS | AT_SYMLINK_NOFOLLOW)`:
/// with `AT_EACCESS` the check uses the thread's fsuid/fsgid, which the
/// credential guard has set to the caller's.
pub fn faccess(fd: BorrowedFd<'_>, mask: i32) -> Result<()> {
    // SAFETY: the empty name is NUL-terminated.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            mask,
            libc::AT_EMPTY_PATH | libc::AT_EACCESS | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// `getxattr(path)`: follows `path` (a `/proc/self/fd` magic link) to the
/// inode. Two calls: size, then value; retried if the value grew between.
pub fn getxattr(path: &CStr, name: &CStr) -> Result<Vec<u8>> {
    loop {
        // SAFETY: a NULL buffer of size 0 asks for the size only.
        let size = cvt(unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) })? as usize;
        let mut buf = vec![0u8; size];
        // SAFETY: the pointer and length describe `buf`.
        match cvt(unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }) {
            Ok(n) => {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            Err(e) if e == Errno::ERANGE => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn listxattr(path: &CStr) -> Result<Vec<u8>> {
    loop {
        // SAFETY: a NULL buffer of size 0 asks for the size only.
        let size = cvt(unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0) })? as usize;
        let mut buf = vec![0u8; size];
        // SAFETY: the pointer and length describe `buf`.
        match cvt(unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }) {
            Ok(n) => {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            Err(e) if e == Errno::ERANGE => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: i32) -> Result<()> {
    // SAFETY: the pointer and length describe `value`; the strings are NUL-terminated.
    cvt(unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags) })?;
    Ok(())
}

pub fn removexattr(path: &CStr, name: &CStr) -> Result<()> {
    // SAFETY: the strings are NUL-terminated.
    cvt(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) })?;
    Ok(())
}

/// `setfsuid(2)`; returns the previous fsuid. The system call acts on the
/// calling thread only (glibc does not broadcast it to other threads).
pub fn setfsuid(uid: u32) -> u32 {
    // SAFETY: no memory is involved.
    unsafe { libc::setfsuid(uid) as u32 }
}

/// `setfsgid(2)`; returns the previous fsgid.
/// This thread's supplementary groups (the raw getgroups: per thread).
pub fn thread_groups() -> Result<Vec<u32>> {
    // SAFETY: a size of 0 asks only for the count; nothing is written.
    let count = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()) };
    if count < 0 {
        return Err(Errno::last());
    }
    let mut groups = vec![0u32; count as usize];
    // SAFETY: the buffer holds as many gid_t as the size passed says.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, groups.len() as libc::c_int, groups.as_mut_ptr()) };
    if n < 0 {
        return Err(Errno::last());
    }
    groups.truncate(n as usize);
    Ok(groups)
}

/// Sets this thread's supplementary groups alone (the raw setgroups; glibc's
/// wrapper sets every thread's).
pub fn set_thread_groups(groups: &[u32]) -> Result<()> {
    // SAFETY: the pointer and length describe `groups`, which the kernel only reads.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

pub fn setfsgid(gid: u32) -> u32 {
    // SAFETY: no memory is involved.
    unsafe { libc::setfsgid(gid) as u32 }
}

pub fn geteuid() -> u32 {
    // SAFETY: no memory is involved.
    unsafe { libc::geteuid() }
}

/// Gives the calling thread its own `fs_struct` (`unshare(CLONE_FS)`) and a
/// zero umask in it: the modes of new files are masked by the caller's
/// umask in [`super`], and the daemon's own umask must not mask them again,
/// without changing the umask of every other thread of the process.
pub fn private_zero_umask() -> Result<()> {
    // SAFETY: unshare(CLONE_FS) only affects the calling thread's cwd/root/umask.
    cvt(unsafe { libc::unshare(libc::CLONE_FS) })?;
    // SAFETY: no memory is involved.
    unsafe { libc::umask(0) };
    Ok(())
}

/// Raises `RLIMIT_NOFILE` as far as allowed: every inode the kernel knows
/// holds one descriptor, so the limit bounds how many files a workload may
/// keep in the kernel's caches (a typical hard limit of a few thousand runs
/// out in a create-heavy run). With CAP_SYS_RESOURCE both limits go up to
/// the system's ceiling (`fs.nr_open`); otherwise the soft limit goes up to
/// the hard one. Returns the new soft limit.
pub fn raise_nofile_limit() -> Result<u64> {
    let mut lim = MaybeUninit::<libc::rlimit>::uninit();
    // SAFETY: `lim` is a valid out-pointer.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, lim.as_mut_ptr()) })?;
    // SAFETY: getrlimit succeeded.
    let mut lim = unsafe { lim.assume_init() };
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(ceiling) = ceiling.filter(|&c| c > lim.rlim_max) {
        let wide = libc::rlimit {
            rlim_cur: ceiling,
            rlim_max: ceiling,
        };
        // SAFETY: `wide` is a valid in-pointer. Fails with EPERM without the capability.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wide) } == 0 {
            return Ok(ceiling);
        }
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid in-pointer.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    }
    Ok(lim.rlim_cur)
}

/// A close-on-exec duplicate of `fd` at the lowest free number at or
/// above `floor`.
pub fn dup_at_least(fd: BorrowedFd<'_>, floor: i32) -> Result<OwnedFd> {
    // SAFETY: no memory is passed.
    let d = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) })?;
    // SAFETY: the kernel just made `d`, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(d) })
}

/// The soft `RLIMIT_NOFILE`, as it is.
pub fn nofile_limit() -> Result<u64> {
    let mut lim = MaybeUninit::<libc::rlimit>::uninit();
    // SAFETY: `lim` is a valid out-pointer.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, lim.as_mut_ptr()) })?;
    // SAFETY: getrlimit succeeded.
    Ok(unsafe { lim.assume_init() }.rlim_cur)
}

/// `MAX_HANDLE_SZ` of `<linux/exportfs.h>`.
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
#[derive(Debug)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// A file handle: names an inode of one file system without a path.
#[derive(Debug)]
pub struct Handle(Box<RawHandle>);

/// `name_to_handle_at(fd, "", AT_EMPTY_PATH)`: the handle of the inode
/// behind `fd` (an `O_PATH` descriptor will do).
pub fn name_to_handle(fd: BorrowedFd<'_>) -> Result<Handle> {
    let mut h = Box::new(RawHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    });
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `h` is a file_handle with handle_bytes of room after its
    // header; `mount_id` is a valid out-pointer; the name is "".
    cvt(unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            &mut *h as *mut RawHandle,
            &mut mount_id as *mut libc::c_int,
            libc::AT_EMPTY_PATH,
        )
    })?;
    Ok(Handle(h))
}

/// `open_by_handle_at(mount, handle, flags)`; `mount` is any descriptor on
/// the handle's file system. Needs `CAP_DAC_READ_SEARCH`; `ESTALE` when the
/// inode no longer exists.
pub fn open_by_handle(mount: BorrowedFd<'_>, handle: &Handle, flags: i32) -> Result<OwnedFd> {
    // SAFETY: the handle was filled in by name_to_handle_at; the kernel only
    // reads handle_bytes of it.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd(),
            &*handle.0 as *const RawHandle,
            flags | libc::O_CLOEXEC,
        )
    })?;
    owned(fd as libc::c_int)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn first_byte(fd: BorrowedFd<'_>) -> u8 {
        let mut b = [0u8; 1];
        assert_eq!(pread(fd, &mut b, 0), Ok(1));
        b[0]
    }

    #[test]
    fn a_forked_child_reopens_its_own_descriptors() {
        let dir = std::env::temp_dir().join(format!("sf-reopen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), b"a").unwrap();
        std::fs::write(dir.join("b"), b"b").unwrap();
        let b_path = std::ffi::CString::new(dir.join("b").into_os_string().into_encoded_bytes()).unwrap();
        let a = std::fs::File::open(dir.join("a")).unwrap();
        // The parent's reopen caches its /proc/self/fd.
        assert_eq!(first_byte(reopen(a.as_fd(), libc::O_RDONLY).unwrap().as_fd()), b'a');
        // SAFETY: the child makes system calls only, then _exit()s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // The child gives a's number to b: a reopen through the
            // parent's table would find a again.
            let code = unsafe {
                libc::close(a.as_raw_fd());
                let b = libc::open(b_path.as_ptr(), libc::O_RDONLY);
                if b != a.as_raw_fd() {
                    2
                } else {
                    match reopen(BorrowedFd::borrow_raw(b), libc::O_RDONLY) {
                        Ok(fd) if first_byte_or_0(fd.as_raw_fd()) == b'b' => 0,
                        _ => 1,
                    }
                }
            };
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(libc::WIFEXITED(status), "child status {status}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "1: the child reopened its parent's file; 2: set-up"
        );
    }

    /// `first_byte` without the assertion (a child must not panic).
    fn first_byte_or_0(fd: RawFd) -> u8 {
        let mut b = [0u8; 1];
        // SAFETY: reads one byte into a live local.
        let n = unsafe { libc::pread(fd, b.as_mut_ptr().cast(), 1, 0) };
        if n == 1 {
            b[0]
        } else {
            0
        }
    }
}
