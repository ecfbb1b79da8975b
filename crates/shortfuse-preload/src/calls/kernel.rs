//! Descriptors whose data has a home in the kernel, and the calls on mount
//! descriptors that the kernel cannot serve on a placeholder (mmap, FIONREAD,
//! copy_file_range, sendfile, splice).
//!
//! # Kernel-backed descriptors (the design for fork, exec, locks and maps)
//!
//! When a file system answers an open with a 1-to-1 data map (passthrough
//! does for every regular file; `stripe` with one directory), the program's
//! descriptor is not a placeholder but a kernel descriptor of the backing
//! file: the map's descriptor duplicated when it has the program's status
//! flags (it belongs to this open alone), else reopened through
//! `/proc/self/fd` with the program's flags; each open has its own open
//! file description, as natively. The kernel then holds the open file description, so
//! everything POSIX ties to it holds across processes with no state of ours:
//!
//! - fork shares offsets and status flags between parent and child, exec
//!   keeps descriptors without FD_CLOEXEC and closes the others, whatever
//!   image runs next (with or without the shim, vfork/posix_spawn included);
//! - flock, POSIX and OFD locks are the kernel's locks on the backing file,
//!   consistent among every process of the tree (and with programs outside
//!   it);
//! - mmap (MAP_SHARED and MAP_PRIVATE), msync, mprotect, madvise, sendfile,
//!   splice, copy_file_range, FIONREAD, fexecve and the dynamic loader's
//!   maps of a library work as on the backing file.
//!
//! The shim still records the descriptor (the open's node, handle and path)
//! so that fstat reports the mount's device and inode, close sends FLUSH
//! and RELEASE, and attribute calls go to the file system. Reads, seeks and
//! the rest go to the kernel untouched; writes go to the kernel too and then
//! drop the node's cached attributes, and fstat takes size and times from
//! the backing file, so the program sees its own writes at once.
//!
//! The alternative, an open-file-description table in
//! shared memory handed over in the environment, would have to re-implement
//! all of the above (offset sharing, lock tables, the dynamic loader's maps)
//! and still could not follow a vfork child that the kernel execs. For files
//! without a backing file the same idea holds one step removed: a file of a
//! daemon gets a kernel open file description of its own (a memfd, see
//! `shared`), which the kernel shares, keeps and closes like any other, and
//! which carries what the description is open on; the daemon keeps its
//! locks. A `mem` mount served in process has nothing to share: each image
//! builds its own, so its descriptors are placeholders of one image.
#![allow(unsafe_code)]

use std::sync::Arc;

use shortfuse::{Errno, FileType};
use shortfuse_vfs::{FdTable, Location, OpenFile, Vfs, Walk, WalkFlags};

use super::metadata::{to_stat, to_statx};
use super::reply::{err, res};
use super::resolve::{file, with_nul};
use super::table::{Call, Direction, Fd, Regs};
use crate::sys::{fs, raw};
use crate::user;

/// The kernel's FIONREAD (`TIOCINQ`).
const FIONREAD: i64 = 0x541b;

/// Serves a call on a kernel-backed descriptor: `None` when the call is not
/// about one, `Some(None)` to let the kernel run it unchanged.
pub fn call(c: &Call, regs: Regs) -> Option<Option<i64>> {
    // The calls the kernel serves on the backing file's description; those
    // that change its size or times drop the cached attributes.
    let (fd, writes) = match *c {
        Call::Read { fd, .. }
        | Call::Pread { fd, .. }
        | Call::Lseek { fd, .. }
        | Call::Fsync { fd, .. }
        | Call::Advise { fd }
        | Call::Ioctl { fd }
        | Call::Fstat { fd, .. }
        | Call::Getdents { fd, .. }
        | Call::Fcntl { fd, .. }
        | Call::Flock { fd, .. }
        | Call::Mmap { fd, .. } => (fd, false),
        Call::Vectored { fd, dir, .. } => (fd, dir == Direction::Write),
        Call::Write { fd, .. } | Call::Pwrite { fd, .. } | Call::Ftruncate { fd, .. } | Call::Fallocate { fd, .. } => {
            (fd, true)
        }
        _ => return None,
    };
    let f = file(fd)?;
    if !f.kernel_backed() {
        return None;
    }
    if writes {
        if user::in_page_zero(regs.nr, regs.a) {
            return Some(Some(err(Errno::EFAULT)));
        }
        // SAFETY: the program's own call, its arguments as it gave them: the kernel checks them as
        // it would have.
        let r = unsafe { crate::sys::raw6(regs.nr, regs.a) };
        // The size and times changed under the cached attributes.
        f.vfs().invalidate_attr(f.node());
        return Some(Some(r));
    }
    Some(match *c {
        Call::Fstat { fd, out } => Some(res(
            // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
            fresh_stat(&f, fd).and_then(|st| unsafe { user::put(out.0, &st) }.map(|()| 0i64)),
        )),
        // Table bookkeeping (F_DUPFD*, F_SETFD) stays with the caller.
        Call::Fcntl {
            cmd: libc::F_DUPFD | libc::F_DUPFD_CLOEXEC | libc::F_SETFD,
            ..
        } => return None,
        _ => None,
    })
}

/// The attributes of a kernel-backed descriptor: the file system's, with
/// size, blocks and times from the backing file (written through the kernel).
pub fn fresh_stat(f: &Arc<OpenFile>, fd: Fd) -> Result<libc::stat, Errno> {
    let mut k: libc::stat = user::zeroed();
    if f.beneath_map() {
        // The backing file's attributes are the file system's (the map's
        // promise), with the mount's device number.
        let r = fs::fstat(fd.0, &mut k);
        if r < 0 {
            return Err(Errno::from_raw(-r as i32));
        }
        f.learn_kind(k.st_mode);
        return Ok(to_stat(&shortfuse::Attr::from_stat(&k), f.vfs().dev()));
    }
    let mut st = to_stat(&f.stat()?, f.vfs().dev());
    if fs::fstat(fd.0, &mut k) == 0 {
        st.st_size = k.st_size;
        st.st_blocks = k.st_blocks;
        st.st_atime = k.st_atime;
        st.st_atime_nsec = k.st_atime_nsec;
        st.st_mtime = k.st_mtime;
        st.st_mtime_nsec = k.st_mtime_nsec;
        st.st_ctime = k.st_ctime;
        st.st_ctime_nsec = k.st_ctime_nsec;
    }
    Ok(st)
}

/// statx of a kernel-backed descriptor (see [`fresh_stat`]).
pub fn fresh_statx(f: &Arc<OpenFile>, fd: Fd) -> Result<libc::statx, Errno> {
    let st = fresh_stat(f, fd)?;
    if f.beneath_map() {
        return Ok(to_statx(&shortfuse::Attr::from_stat(&st), f.vfs().dev()));
    }
    let mut attr = f.stat()?;
    attr.size = st.st_size as u64;
    attr.blocks = st.st_blocks as u64;
    attr.atime = shortfuse::Timestamp {
        sec: st.st_atime,
        nsec: st.st_atime_nsec as u32,
    };
    attr.mtime = shortfuse::Timestamp {
        sec: st.st_mtime,
        nsec: st.st_mtime_nsec as u32,
    };
    attr.ctime = shortfuse::Timestamp {
        sec: st.st_ctime,
        nsec: st.st_ctime_nsec as u32,
    };
    Ok(to_statx(&attr, f.vfs().dev()))
}

/// Status flags that make two open file descriptions behave alike.
const SAME_FLAGS: i32 = libc::O_ACCMODE | libc::O_APPEND | libc::O_DIRECT | libc::O_SYNC | libc::O_NOATIME;

/// A kernel descriptor of the 1-to-1 backing file of `f` for a program's
/// open with `flags`, or a negated errno (the caller then keeps a
/// placeholder). `cloexec` as the open asked.
pub fn backing_descriptor(f: &OpenFile, flags: i32, cloexec: bool) -> i64 {
    let Some(backing) = f.data_map().and_then(|m| m.whole()) else {
        return err(Errno::ENODEV);
    };
    let b = std::os::fd::AsRawFd::as_raw_fd(&**backing) as i64;
    // The map's descriptor belongs to this open alone (the M-Cache keeps
    // an O_PATH one of its own) and closes with it: when its flags are
    // the program's, its description can be the program's.
    let have = fs::fcntl_int(b as i32, libc::F_GETFL, 0);
    if have >= 0 && have as i32 & SAME_FLAGS == flags & SAME_FLAGS {
        let cmd = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
        // SAFETY: an integer command (F_DUPFD or F_DUPFD_CLOEXEC): nothing of memory.
        return unsafe { raw(libc::SYS_fcntl, b, i64::from(cmd), 0, 0, 0, 0) };
    }
    let link = with_nul(format!("/proc/self/fd/{b}").into_bytes());
    // Creation and truncation were done by the open; O_NOFOLLOW would
    // refuse the magic link itself.
    let keep = flags
        & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC)
        | if cloexec { libc::O_CLOEXEC } else { 0 };
    fs::openat(libc::AT_FDCWD, &link, keep, 0)
}

/// mmap of a placeholder descriptor (no kernel-backed one). A 1-to-1 map
/// maps its backing file, as does a daemon's file with one (`lent`);
/// otherwise MAP_PRIVATE gets a private copy of the
/// bytes (anonymous memory filled by reads, then given the asked
/// protection), and MAP_SHARED fails with ENODEV: there is no single file
/// the kernel could write the pages back to.
pub fn mmap(f: &OpenFile, a: [i64; 6]) -> i64 {
    let (addr, len, prot, flags, off) = (a[0], a[1], a[2], a[3] as i32, a[5]);
    if let Some(backing) = f.data_map().and_then(|m| m.whole()) {
        let b = std::os::fd::AsRawFd::as_raw_fd(&**backing) as i64;
        // SAFETY: the program's own map request, on the backing file's descriptor in place of its
        // own: it may replace memory only where the program asked.
        return unsafe { raw(libc::SYS_mmap, addr, len, prot, a[3], b, off) };
    }
    if let Some(r) = super::lent::mmap(f, a) {
        return r;
    }
    let kind = flags & (libc::MAP_SHARED | libc::MAP_PRIVATE | libc::MAP_SHARED_VALIDATE);
    if kind != libc::MAP_PRIVATE {
        return err(Errno::ENODEV);
    }
    if len <= 0 || off < 0 || off & 4095 != 0 {
        return err(Errno::EINVAL);
    }
    if libc::O_ACCMODE & f.flags() == libc::O_WRONLY {
        return err(Errno::EACCES);
    }
    let anon_flags = (flags & !(libc::MAP_DENYWRITE | libc::MAP_EXECUTABLE)) | libc::MAP_ANONYMOUS;
    let rw = i64::from(libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: an anonymous map the kernel places (or where the program asked), and changes of that
    // map only, before anything of ours uses it.
    let p = unsafe { raw(libc::SYS_mmap, addr, len, rw, i64::from(anon_flags), -1, 0) };
    if p < 0 {
        return p;
    }
    let size = f.stat().map(|at| at.size).unwrap_or(0);
    let want = (size.saturating_sub(off as u64)).min(len as u64) as usize;
    if want > 0 {
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        if let Err(e) = unsafe { user::slice_mut(p, want) }.and_then(|b| f.pread(b, off as u64)) {
            // SAFETY: an anonymous map the kernel places (or where the program asked), and changes
            // of that map only, before anything of ours uses it.
            unsafe { raw(libc::SYS_munmap, p, len, 0, 0, 0, 0) };
            return err(e);
        }
    }
    if prot != rw {
        // SAFETY: an anonymous map the kernel places (or where the program asked), and changes of
        // that map only, before anything of ours uses it.
        unsafe { raw(libc::SYS_mprotect, p, len, prot, 0, 0, 0) };
    }
    p
}

/// ioctl on a placeholder: FIONREAD says how many bytes lie past the
/// offset; the rest is what a file without ioctls answers.
pub fn ioctl(f: &OpenFile, a: [i64; 6]) -> i64 {
    if a[1] != FIONREAD {
        return err(Errno::from_raw(libc::ENOTTY));
    }
    if f.file_type() != shortfuse::FileType::Regular {
        return err(Errno::EINVAL);
    }
    match f.stat() {
        Ok(at) => {
            let n = at.size.saturating_sub(f.offset()).min(i32::MAX as u64) as i32;
            // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
            res(unsafe { user::put(a[2], &n) }.map(|()| 0i64))
        }
        Err(e) => err(e),
    }
}

/// One side of an emulated copy: a placeholder of ours or a kernel
/// descriptor, at an explicit offset (advanced in the caller's variable)
/// or at the descriptor's own.
struct Side {
    fd: i64,
    file: Option<Arc<OpenFile>>,
    off_ptr: i64,
}

impl Side {
    fn new(fd: i64, off_ptr: i64) -> Side {
        let file = file(Fd(fd as i32)).filter(|f| !f.kernel_backed());
        Side { fd, file, off_ptr }
    }

    fn offset(&self) -> Option<u64> {
        // Checked by `copy` before anything moves.
        // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
        (self.off_ptr != 0).then(|| unsafe { user::get::<u64>(self.off_ptr) }.unwrap_or(0))
    }

    fn advance(&self, n: usize) {
        if let Some(o) = self.offset() {
            // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
            let _ = unsafe { user::put(self.off_ptr, &(o + n as u64)) };
        }
    }

    fn read(&self, buf: &mut [u8]) -> i64 {
        match (&self.file, self.offset()) {
            (Some(f), Some(o)) => res(f.pread(buf, o).map(|n| n as i64)),
            (Some(f), None) => res(f.read(buf).map(|n| n as i64)),
            (None, Some(o)) => fs::pread(self.fd as i32, buf, o),
            (None, None) => fs::read(self.fd as i32, buf),
        }
    }

    /// Whether the side is a regular file (reads return less than asked
    /// only at its end).
    fn regular(&self) -> bool {
        if let Some(f) = &self.file {
            return f.file_type() == FileType::Regular;
        }
        let mut st: libc::stat = user::zeroed();
        let r = fs::fstat(self.fd as i32, &mut st);
        r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG
    }

    /// Moves the side's own offset `n` bytes back.
    fn seek_back(&self, n: i64) {
        match &self.file {
            Some(f) => {
                let _ = f.lseek(-n, libc::SEEK_CUR);
            }
            None => {
                fs::lseek(self.fd as i32, -n, libc::SEEK_CUR);
            }
        }
    }

    fn write(&self, data: &[u8]) -> i64 {
        let r = match (&self.file, self.offset()) {
            (Some(f), Some(o)) => res(f.pwrite(data, o).map(|n| n as i64)),
            (Some(f), None) => res(f.write(data).map(|n| n as i64)),
            (None, Some(o)) => fs::pwrite(self.fd as i32, data, o),
            (None, None) => fs::write(self.fd as i32, data),
        };
        if let Some(f) = file(Fd(self.fd as i32)).filter(|f| f.kernel_backed()) {
            f.vfs().invalidate_attr(f.node());
        }
        r
    }
}

/// The buffer an emulated copy moves its bytes through, a piece at a time.
const COPY_CHUNK: usize = 256 << 10;

/// copy_file_range, sendfile and splice with a placeholder on one side or
/// both: read into a buffer, write it out. Returns the bytes moved.
pub fn copy(nr: i64, a: [i64; 6]) -> Option<i64> {
    let (src, dst, len) = match nr {
        libc::SYS_copy_file_range => (Side::new(a[0], a[1]), Side::new(a[2], a[3]), a[4]),
        libc::SYS_sendfile => (Side::new(a[1], a[2]), Side::new(a[0], 0), a[3]),
        _ => (Side::new(a[0], a[1]), Side::new(a[2], a[3]), a[4]),
    };
    if src.file.is_none() && dst.file.is_none() {
        // Kernel descriptors only (kernel-backed ones included): the
        // kernel's call, then the attributes of a written mount file drop.
        // SAFETY: the program's own call, its arguments as it gave them: the kernel checks them as
        // it would have.
        let r = unsafe { raw(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
        if let Some(f) = file(Fd(dst.fd as i32)).filter(|f| f.kernel_backed()) {
            f.vfs().invalidate_attr(f.node());
        }
        return Some(r);
    }
    if nr == libc::SYS_copy_file_range && a[5] != 0 {
        return Some(err(Errno::EINVAL));
    }
    if len < 0 {
        return Some(err(Errno::EINVAL));
    }
    for side in [&src, &dst] {
        if side.off_ptr != 0 {
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            if let Err(e) = unsafe { user::slice_mut(side.off_ptr, 8) } {
                return Some(err(e));
            }
        }
    }
    let mut buf = vec![0u8; (len as usize).min(COPY_CHUNK)];
    // As the kernel's calls between files, the whole length in one call
    // (programs that copy a file with one sendfile do not loop); from
    // anything else (a pipe, a socket), what one read gives, so as never
    // to wait for more.
    let whole = src.regular();
    let mut total = 0i64;
    while total < len {
        let want = ((len - total) as usize).min(buf.len());
        let got = src.read(&mut buf[..want]);
        if got <= 0 {
            return Some(if total > 0 { total } else { got });
        }
        let put = dst.write(&buf[..got as usize]);
        let moved = put.max(0);
        src.advance(moved as usize);
        dst.advance(moved as usize);
        if moved < got && src.offset().is_none() {
            // The source's own offset moved past bytes not written: put it back.
            src.seek_back(got - moved);
        }
        if put < 0 {
            return Some(if total > 0 { total } else { put });
        }
        total += put;
        if put < got || (got as usize) < want || !whole {
            break;
        }
    }
    Some(total)
}

/// Takes in the descriptors of backing files this image inherited from the
/// one that exec'd it (a shell's `cmd >> /mnt/file`): a regular file or
/// FIFO under a passthrough mount's source, still at its name there,
/// becomes a kernel-backed descriptor of ours again, so that `fstat` gives
/// the mount's device and inode however the file was opened (`cat f >> f`
/// compares its input and output that way, and refuses to copy a file
/// onto itself) and /proc/self/fd names it in the mount. A file of the
/// source opened by its source path is taken for the mount's too: it is
/// the same file.
pub fn adopt(mounts: &[Arc<Vfs>], fds: &FdTable, inherited: &[(i32, Vec<u8>)]) {
    for (fd, link) in inherited {
        let (fd, link) = (*fd, link.as_slice());
        let Some((vfs, rest)) = mounts.iter().find_map(|m| {
            let src = m.source()?;
            let src = src.strip_suffix(b"/").unwrap_or(src);
            let rest = link.strip_prefix(src)?;
            (rest.first() == Some(&b'/')).then_some((m, rest))
        }) else {
            continue;
        };
        let mut st: libc::stat = user::zeroed();
        if fs::fstat(fd, &mut st) != 0 {
            continue;
        }
        let kind = FileType::from_mode(st.st_mode);
        if !matches!(kind, FileType::Regular | FileType::Fifo) {
            continue;
        }
        let flags = fs::fcntl_int(fd, libc::F_GETFL, 0);
        if flags < 0 || flags as i32 & libc::O_PATH != 0 {
            continue;
        }
        let walk = WalkFlags {
            attrs_only: false,
            follow: false,
            create: false,
        };
        let Ok(Walk::Inside(t)) = vfs.walk(&Location::root(), rest, walk, 0) else {
            continue;
        };
        // The name may lead elsewhere by now.
        let Some((node, attr)) = t.node.filter(|(_, a)| a.ino == st.st_ino) else {
            continue;
        };
        let fdflags = fs::fcntl_int(fd, libc::F_GETFD, 0);
        let cloexec = fdflags > 0 && fdflags & i64::from(libc::FD_CLOEXEC) != 0;
        let f = vfs.open_in_kernel(node, attr.file_type(), flags as i32, t.path());
        fds.insert(fd, f, cloexec);
    }
}
