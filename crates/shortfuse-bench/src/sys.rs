//! The few raw calls the workloads time, with paths prepared ahead so that
//! the timed loop measures the file system, not string handling.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A path as a C string.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("paths made by the benchmark hold no NUL")
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn stat(p: &CString) -> io::Result<()> {
    // SAFETY: `p` is a valid C string and `st` a writable stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::stat(p.as_ptr(), &mut st) }).map(|_| ())
}

pub fn open(p: &CString, flags: i32, mode: u32) -> io::Result<i32> {
    // SAFETY: `p` is a valid C string.
    check(unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, mode) })
}

pub fn close(fd: i32) -> io::Result<()> {
    // SAFETY: closing a descriptor this module opened.
    check(unsafe { libc::close(fd) }).map(|_| ())
}

pub fn unlink(p: &CString) -> io::Result<()> {
    // SAFETY: `p` is a valid C string.
    check(unsafe { libc::unlink(p.as_ptr()) }).map(|_| ())
}

pub fn pread(fd: i32, buf: &mut [u8], off: u64) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` writable bytes.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off as libc::off_t) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

pub fn pwrite(fd: i32, buf: &[u8], off: u64) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` readable bytes.
    let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off as libc::off_t) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

pub fn read(fd: i32, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` writable bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

pub fn fsync(fd: i32) -> io::Result<()> {
    // SAFETY: plain system call on a descriptor this module opened.
    check(unsafe { libc::fsync(fd) }).map(|_| ())
}

pub fn rename(from: &CString, to: &CString) -> io::Result<()> {
    // SAFETY: both are valid C strings.
    check(unsafe { libc::rename(from.as_ptr(), to.as_ptr()) }).map(|_| ())
}

/// Writes back dirty pages and drops the page, dentry and inode caches of
/// every file system, so the next read comes from the device or the FUSE
/// daemon. Needs root.
pub fn drop_caches() -> io::Result<()> {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| io::Error::new(e.kind(), format!("dropping caches (needs root): {e}")))
}

/// A buffer of `len` bytes aligned to 4096, as O_DIRECT asks of user memory.
pub struct Aligned {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    pub fn new(len: usize) -> Aligned {
        let storage = vec![0u8; len + 4096];
        let start = storage.as_ptr().align_offset(4096);
        Aligned { storage, start, len }
    }

    pub fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

pub fn write(fd: i32, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` readable bytes.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
