//! The system calls served on mounts. Each handler returns `None` to let
//! the original call reach the kernel unchanged, or `Some(result)`
//! (a value or a negated errno) when it served the call or re-issued it
//! with a resolved path.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use shortfuse::{Attr, Errno};
use shortfuse_vfs::{OpenFile, SetAttrIn, Target, Vfs, Walk, WalkFlags};

use crate::state;
use crate::sys::raw;
use crate::user;

mod exec;
pub mod kernel;
mod lent;
pub mod libpath;
mod locks;
pub mod shared;
mod sockets;
pub mod spare;
pub mod spawn;
pub mod special;
mod unserved;
mod xattr;

const AT_FDCWD: i64 = libc::AT_FDCWD as i64;

/// The numbers `dispatch` looks at; the rest never leave the fast path.
pub fn is_file_call(nr: i64) -> bool {
    matches!(
        nr,
        libc::SYS_read
            | libc::SYS_write
            | libc::SYS_open
            | libc::SYS_close
            | libc::SYS_stat
            | libc::SYS_fstat
            | libc::SYS_lstat
            | libc::SYS_lseek
            | libc::SYS_pread64
            | libc::SYS_pwrite64
            | libc::SYS_readv
            | libc::SYS_writev
            | libc::SYS_access
            | libc::SYS_dup
            | libc::SYS_dup2
            | libc::SYS_dup3
            | libc::SYS_fcntl
            | libc::SYS_fsync
            | libc::SYS_fdatasync
            | libc::SYS_truncate
            | libc::SYS_ftruncate
            | libc::SYS_getdents64
            | libc::SYS_getcwd
            | libc::SYS_chdir
            | libc::SYS_fchdir
            | libc::SYS_rename
            | libc::SYS_mkdir
            | libc::SYS_rmdir
            | libc::SYS_creat
            | libc::SYS_unlink
            | libc::SYS_readlink
            | libc::SYS_openat
            | libc::SYS_openat2
            | libc::SYS_mkdirat
            | libc::SYS_newfstatat
            | libc::SYS_unlinkat
            | libc::SYS_renameat
            | libc::SYS_renameat2
            | libc::SYS_readlinkat
            | libc::SYS_faccessat
            | libc::SYS_faccessat2
            | libc::SYS_statx
            | libc::SYS_close_range
            | libc::SYS_umask
            | libc::SYS_utimensat
            | libc::SYS_fchmod
            | libc::SYS_fchmodat
            | libc::SYS_getxattr
            | libc::SYS_lgetxattr
            | libc::SYS_fgetxattr
            | libc::SYS_listxattr
            | libc::SYS_llistxattr
            | libc::SYS_flistxattr
            | libc::SYS_setxattr
            | libc::SYS_lsetxattr
            | libc::SYS_fsetxattr
            | libc::SYS_removexattr
            | libc::SYS_lremovexattr
            | libc::SYS_fremovexattr
            | libc::SYS_symlink
            | libc::SYS_symlinkat
            | libc::SYS_link
            | libc::SYS_linkat
            | libc::SYS_mknod
            | libc::SYS_mknodat
            | libc::SYS_chmod
            | libc::SYS_fchmodat2
            | libc::SYS_chown
            | libc::SYS_fchown
            | libc::SYS_lchown
            | libc::SYS_fchownat
            | libc::SYS_statfs
            | libc::SYS_fstatfs
            | libc::SYS_fallocate
            | libc::SYS_preadv
            | libc::SYS_pwritev
            | libc::SYS_preadv2
            | libc::SYS_pwritev2
            | libc::SYS_copy_file_range
            | libc::SYS_sendfile
            | libc::SYS_splice
            | libc::SYS_fadvise64
            | libc::SYS_sync_file_range
            | libc::SYS_ioctl
            | libc::SYS_mmap
            | libc::SYS_execve
            | libc::SYS_execveat
            | libc::SYS_flock
            | libc::SYS_inotify_add_watch
            | libc::SYS_bind
            | libc::SYS_connect
            | libc::SYS_sendmsg
            | libc::SYS_sendmmsg
    )
}

fn err(e: Errno) -> i64 {
    -(e.raw() as i64)
}

fn res<T: Into<i64>>(r: Result<T, Errno>) -> i64 {
    match r {
        Ok(v) => v.into(),
        Err(e) => err(e),
    }
}

/// Where a path leads.
enum Resolved {
    /// Not ours: the kernel takes the call; `Some` is an absolute path to use
    /// instead of the original (a walk left a mount).
    Kernel(Option<Vec<u8>>),
    Ours(Arc<Vfs>, Target),
}

/// Finds the mount an absolute path enters: the remainder after the mount
/// point (a suffix of `abs`). `..` before the mount point is taken
/// lexically.
pub(crate) fn mount_of(abs: &[u8]) -> Option<(Arc<Vfs>, &[u8])> {
    let st = state();
    // Fast answer for the common path that needs no normalising (no "//",
    // "." or ".." components) and names no mount: every kernel path call
    // of the program comes through here.
    let plain = !abs
        .iter()
        .zip(abs.iter().skip(1))
        .any(|(&a, &b)| a == b'/' && (b == b'/' || b == b'.'));
    if plain {
        let inside = |mp: &[u8]| abs.starts_with(mp) && (abs.len() == mp.len() || abs[mp.len()] == b'/');
        // As the walk below: the outermost mount takes the path.
        let m = st
            .mounts
            .iter()
            .filter(|m| inside(m.mountpoint()))
            .min_by_key(|m| m.mountpoint().len())?;
        return Some((m.clone(), &abs[m.mountpoint().len()..]));
    }
    let mut prefix: Vec<u8> = Vec::new();
    let mut rest = abs;
    loop {
        let p: &[u8] = if prefix.is_empty() { b"/" } else { &prefix };
        for m in &st.mounts {
            if m.mountpoint() == p {
                return Some((m.clone(), rest));
            }
        }
        let trimmed = rest
            .iter()
            .position(|&b| b != b'/')
            .map_or(&rest[rest.len()..], |i| &rest[i..]);
        if trimmed.is_empty() {
            return None;
        }
        let end = trimmed.iter().position(|&b| b == b'/').unwrap_or(trimmed.len());
        let comp = &trimmed[..end];
        rest = &trimmed[end..];
        match comp {
            b"." => {}
            b".." => {
                let cut = prefix.iter().rposition(|&b| b == b'/').unwrap_or(0);
                prefix.truncate(cut);
            }
            c => {
                prefix.push(b'/');
                prefix.extend_from_slice(c);
            }
        }
    }
}

fn with_nul(mut p: Vec<u8>) -> Vec<u8> {
    p.push(0);
    p
}

/// Resolves `path` relative to `dirfd` (or the current directory).
fn resolve(dirfd: i64, path: &[u8], follow: bool) -> Result<Resolved, Errno> {
    resolve_for(dirfd, path, WalkFlags { follow, create: false })
}

/// [`resolve`], with the walk's every flag.
fn resolve_for(dirfd: i64, path: &[u8], flags: WalkFlags) -> Result<Resolved, Errno> {
    // An `int` argument: the kernel reads the low 32 bits of the register.
    let dirfd = dirfd as i32 as i64;
    let st = state();
    let walk = |vfs: &Arc<Vfs>, start: &shortfuse_vfs::Location, p: &[u8], links: u32| vfs.walk(start, p, flags, links);
    let mut first = None;
    // Borrowed from the program for an absolute path: most calls never
    // need a copy.
    let mut abs: std::borrow::Cow<'_, [u8]>;
    let mut links = 0;
    let mut rewritten = false;
    if let Some(f) = magic_link(path).and_then(|fd| st.fds.get(fd)) {
        return Ok(Resolved::Ours(f.vfs().clone(), target_of(&f)?));
    }
    if path.is_empty() {
        return if dirfd != AT_FDCWD && st.fds.contains(dirfd as i32) {
            Err(Errno::ENOENT)
        } else {
            Ok(Resolved::Kernel(None))
        };
    }
    if path.starts_with(b"/") {
        abs = path.into();
    } else if dirfd == AT_FDCWD {
        let cwd = st.cwd.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((vfs, loc)) = cwd {
            first = Some(walk(&vfs, &loc, path, 0).map(|w| (vfs, w))?);
            abs = Default::default();
        } else {
            let mut host = st.host_cwd.lock().unwrap_or_else(|e| e.into_inner()).clone();
            host.push(b'/');
            host.extend_from_slice(path);
            abs = host.into();
        }
    } else if let Some(f) = st.fds.get(dirfd as i32) {
        let loc = f.location().ok_or(Errno::ENOTDIR)?;
        first = Some(walk(f.vfs(), loc, path, 0).map(|w| (f.vfs().clone(), w))?);
        abs = Default::default();
    } else {
        // A kernel directory descriptor: only its path tells whether the
        // walk enters a mount. (Not the spare's path: it is closed.)
        spare::flush();
        let link = with_nul(format!("/proc/self/fd/{dirfd}").into_bytes());
        let mut buf = [0u8; 4096];
        let n = raw(
            libc::SYS_readlink,
            link.as_ptr() as i64,
            buf.as_mut_ptr() as i64,
            buf.len() as i64,
            0,
            0,
            0,
        );
        if n <= 0 || buf[0] != b'/' {
            return Ok(Resolved::Kernel(None));
        }
        let mut p = buf[..n as usize].to_vec();
        p.push(b'/');
        p.extend_from_slice(path);
        abs = p.into();
        if mount_of(&abs).is_none() {
            return Ok(Resolved::Kernel(None));
        }
    }
    loop {
        let (vfs, w) = match first.take() {
            Some(x) => x,
            None => match mount_of(&abs) {
                Some((vfs, rest)) => {
                    let w = vfs.walk(&shortfuse_vfs::Location::root(), rest, flags, links)?;
                    (vfs, w)
                }
                None => {
                    return Ok(Resolved::Kernel(if rewritten {
                        Some(with_nul(abs.into_owned()))
                    } else {
                        None
                    }))
                }
            },
        };
        match w {
            Walk::Inside(t) => return Ok(Resolved::Ours(vfs, t)),
            Walk::Outside { path, links: l } => {
                abs = path.into();
                links = l;
                rewritten = true;
            }
        }
    }
}

/// The descriptor number of `/proc/self/fd/N`, `/proc/thread-self/fd/N`
/// or `/dev/fd/N`: the kernel's magic links to an open file. glibc reaches
/// O_PATH descriptors that way (fchmod, fchmodat with AT_EMPTY_PATH); for a
/// descriptor of ours the kernel would act on the placeholder instead.
fn magic_link(path: &[u8]) -> Option<i32> {
    let n = [&b"/proc/self/fd/"[..], b"/proc/thread-self/fd/", b"/dev/fd/"]
        .iter()
        .find_map(|p| path.strip_prefix(*p))?;
    if n.is_empty() || n.len() > 10 || !n.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(n).ok()?.parse().ok()
}

/// What a descriptor of ours names, as a walk would have found it.
fn target_of(f: &OpenFile) -> Result<Target, Errno> {
    let attr = f.stat()?;
    Ok(Target {
        dir: f.location().cloned().unwrap_or_default(),
        last: shortfuse_vfs::Last::Dir,
        node: Some((f.node(), attr)),
        trailing_slash: false,
        links: 0,
        unasked: false,
    })
}

/// Re-issues a path call on the kernel with `path` (absolute) in place of
/// the original path argument at index `i`, the dirfd (if any) at `i - 1`.
fn reissue(nr: i64, mut a: [i64; 6], i: usize, has_dirfd: bool, path: &[u8]) -> i64 {
    a[i] = path.as_ptr() as i64;
    if has_dirfd {
        a[i - 1] = AT_FDCWD;
    }
    spare::before_kernel(nr);
    raw(nr, a[0], a[1], a[2], a[3], a[4], a[5])
}

macro_rules! resolve_or_pass {
    ($nr:expr, $a:expr, $dirfd:expr, $idx:expr, $has_dirfd:expr, $follow:expr) => {{
        resolve_or_pass!($nr, $a, $dirfd, $idx, $has_dirfd, flags WalkFlags { follow: $follow, create: false })
    }};
    ($nr:expr, $a:expr, $dirfd:expr, $idx:expr, $has_dirfd:expr, flags $flags:expr) => {{
        let path = match user::cstr($a[$idx]) {
            Ok(p) => p,
            Err(e) => return Some(err(e)),
        };
        match resolve_for($dirfd, path, $flags) {
            Err(e) => return Some(err(e)),
            Ok(Resolved::Kernel(None)) => return None,
            Ok(Resolved::Kernel(Some(p))) => return Some(reissue($nr, $a, $idx, $has_dirfd, &p)),
            Ok(Resolved::Ours(vfs, t)) => (vfs, t),
        }
    }};
}

fn file(fd: i64) -> Option<Arc<OpenFile>> {
    // The kernel reads descriptors as 32-bit ints.
    let fd = fd as i32;
    state().fds.get(fd)
}

/// execve/execveat in a vfork child (posix_spawn, `system`, python's
/// subprocess): the child runs on a small stack of its own (posix_spawn's is
/// about 32 KiB, too little for the file system's code), may have closed the
/// file system's descriptors or moved others, and shares our memory and
/// thread state. So a path on a passthrough mount is exec'd from its source
/// (found lexically; the kernel follows symbolic links there), a program on
/// a mount without a source (mem, a daemon's) is copied to a memfd by code
/// running on a stack of its own (`sys::on_own_stack`), and descriptors are
/// not handed over (those of a daemon's files travel by themselves; see
/// `shared`).
pub fn vfork_exec(nr: i64, a: [i64; 6]) -> Option<i64> {
    exec::vfork_exec(nr, a)
}

/// The other file calls of a vfork child: see `spawn`.
pub fn vfork_call(nr: i64, a: [i64; 6]) -> Option<i64> {
    spawn::call(nr, a)
}

pub fn dispatch(nr: i64, a: [i64; 6]) -> Option<i64> {
    if crate::daemon::on() {
        if let Some(r) = crate::daemon::call(nr, a) {
            return Some(r);
        }
    }
    // Where a daemon's descriptions may reach another process (see `shared`).
    match nr {
        libc::SYS_clone | libc::SYS_fork | libc::SYS_vfork => {
            shared::before_clone(nr, a[0]);
            return Some(0);
        }
        libc::SYS_sendmsg | libc::SYS_sendmmsg => {
            shared::sent(nr, a);
            return None;
        }
        libc::SYS_execve | libc::SYS_execveat => shared::anchor_all(),
        libc::SYS_bind | libc::SYS_connect => return sockets::call(nr, a),
        _ => {}
    }
    if let Some(r) = crate::nsmap::call(nr, a) {
        return Some(r);
    }
    let st = state();
    if let Some(r) = kernel::call(nr, a) {
        return r;
    }
    match nr {
        libc::SYS_read => {
            let f = file(a[0])?;
            Some(res(user::slice_mut(a[1], a[2] as usize)
                .and_then(|b| f.read(b))
                .map(|n| n as i64)))
        }
        libc::SYS_write => {
            let f = file(a[0])?;
            Some(res(user::slice(a[1], a[2] as usize)
                .and_then(|b| f.write(b))
                .map(|n| n as i64)))
        }
        libc::SYS_pread64 => {
            let f = file(a[0])?;
            if a[3] < 0 {
                return Some(err(Errno::EINVAL));
            }
            Some(res(user::slice_mut(a[1], a[2] as usize)
                .and_then(|b| f.pread(b, a[3] as u64))
                .map(|n| n as i64)))
        }
        libc::SYS_pwrite64 => {
            let f = file(a[0])?;
            if a[3] < 0 {
                return Some(err(Errno::EINVAL));
            }
            Some(res(user::slice(a[1], a[2] as usize)
                .and_then(|b| f.pwrite(b, a[3] as u64))
                .map(|n| n as i64)))
        }
        libc::SYS_readv | libc::SYS_writev => {
            let f = file(a[0])?;
            let mut total = 0i64;
            let iov = match user::iovecs(a[1], a[2]) {
                Ok(v) => v,
                Err(e) => return Some(err(e)),
            };
            for v in iov {
                let r = if nr == libc::SYS_readv {
                    user::slice_mut(v.iov_base as i64, v.iov_len).and_then(|b| f.read(b))
                } else {
                    user::slice(v.iov_base as i64, v.iov_len).and_then(|b| f.write(b))
                };
                match r {
                    Ok(n) => {
                        total += n as i64;
                        if n < v.iov_len {
                            break;
                        }
                    }
                    Err(e) if total == 0 => return Some(err(e)),
                    Err(_) => break,
                }
            }
            Some(total)
        }
        libc::SYS_lseek => {
            let f = file(a[0])?;
            Some(res(f.lseek(a[1], a[2] as i32).map(|n| n as i64)))
        }
        libc::SYS_getdents64 => {
            let f = file(a[0])?;
            Some(res(user::slice_mut(a[1], a[2] as usize)
                .and_then(|b| f.getdents64(b))
                .map(|n| n as i64)))
        }
        libc::SYS_fstat => {
            let f = file(a[0])?;
            Some(res(f.stat().and_then(|at| {
                user::put(a[1], &to_stat(&at, f.vfs().dev())).map(|()| 0i64)
            })))
        }
        libc::SYS_ftruncate => {
            let f = file(a[0])?;
            if a[1] < 0 {
                return Some(err(Errno::EINVAL));
            }
            Some(res(f.truncate(a[1] as u64).map(|_| 0i64)))
        }
        libc::SYS_fsync | libc::SYS_fdatasync => {
            let f = file(a[0])?;
            Some(res(f.fsync(nr == libc::SYS_fdatasync).map(|_| 0i64)))
        }
        libc::SYS_fchmod => {
            let f = file(a[0])?;
            let set = SetAttrIn {
                mode: Some(a[1] as u32 & 0o7777),
                ..Default::default()
            };
            Some(res(f.setattr(&set).map(|_| 0i64)))
        }
        libc::SYS_close => {
            let fd = a[0] as i32;
            let f = file(a[0])?;
            let lock_owner = if f.needs_flush() { owner() } else { 0 };
            locks::closed(&f);
            // A kernel-backed or shared description's close must reach
            // the kernel now; a bare placeholder may wait for the next open.
            let placeholder = !f.kernel_backed() && f.shared().is_none();
            drop(f);
            let (r, cloexec) = st.fds.close_with_cloexec(fd, lock_owner)?;
            spare::close(fd, placeholder, cloexec);
            Some(res(r.map(|_| 0i64)))
        }
        libc::SYS_close_range => {
            let (lo, hi) = (a[0] as u32, a[1] as u32);
            let _swaps = shared::descriptors();
            let r = raw(libc::SYS_close_range, a[0], a[1], a[2], 0, 0, 0);
            if r == 0 && a[2] as u32 & libc::CLOSE_RANGE_CLOEXEC == 0 {
                for (fd, _) in st.fds.fds() {
                    if (lo..=hi).contains(&(fd as u32)) {
                        if let Some(f) = st.fds.get(fd) {
                            locks::closed(&f);
                        }
                    }
                }
                st.fds.close_range(lo, hi, owner());
            } else if r == 0 {
                for (fd, _) in st.fds.fds() {
                    if fd as u32 >= lo && fd as u32 <= hi {
                        let _ = st.fds.set_cloexec(fd, true);
                    }
                }
            }
            Some(r)
        }
        libc::SYS_dup => {
            file(a[0])?;
            let _swaps = shared::descriptors();
            let new = raw(libc::SYS_dup, a[0], 0, 0, 0, 0, 0);
            if new >= 0 {
                let _ = st.fds.dup(a[0] as i32, new as i32, false);
            }
            Some(new)
        }
        libc::SYS_dup2 | libc::SYS_dup3 => {
            let ours_old = file(a[0]).is_some();
            let ours_new = file(a[1]).is_some();
            if !ours_old && !ours_new {
                return None;
            }
            // dup2 has two arguments: the third register is whatever the caller left there.
            let flags = if nr == libc::SYS_dup3 { a[2] } else { 0 };
            let _swaps = shared::descriptors();
            let r = raw(nr, a[0], a[1], flags, 0, 0, 0);
            if r >= 0 && a[0] != a[1] {
                if let Some(f) = file(a[1]).filter(|_| ours_new) {
                    locks::closed(&f);
                }
                if ours_new && !ours_old {
                    st.fds.close(a[1] as i32, owner());
                } else if let Ok(Some(old)) = st
                    .fds
                    .dup(a[0] as i32, a[1] as i32, flags as i32 & libc::O_CLOEXEC != 0)
                {
                    let _ = old.flush(owner());
                }
            }
            Some(r)
        }
        libc::SYS_fcntl => {
            let f = file(a[0])?;
            match a[1] as i32 {
                libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
                    let _swaps = shared::descriptors();
                    let new = raw(libc::SYS_fcntl, a[0], a[1], a[2], 0, 0, 0);
                    if new >= 0 {
                        let _ = st
                            .fds
                            .dup(a[0] as i32, new as i32, a[1] as i32 == libc::F_DUPFD_CLOEXEC);
                    }
                    Some(new)
                }
                // The kernel forces O_LARGEFILE on every open of a 64-bit process.
                libc::F_GETFL => Some(i64::from((f.flags() & !libc::O_CLOEXEC) | libc::O_LARGEFILE)),
                libc::F_SETFL => {
                    f.set_flags(a[2] as i32);
                    Some(0)
                }
                libc::F_SETFD => {
                    let _swaps = shared::descriptors();
                    let r = raw(libc::SYS_fcntl, a[0], a[1], a[2], 0, 0, 0);
                    if r == 0 {
                        let _ = st.fds.set_cloexec(a[0] as i32, a[2] as i32 & libc::FD_CLOEXEC != 0);
                    }
                    Some(r)
                }
                libc::F_GETFD => None,
                libc::F_GETLK
                | libc::F_SETLK
                | libc::F_SETLKW
                | libc::F_OFD_GETLK
                | libc::F_OFD_SETLK
                | libc::F_OFD_SETLKW
                    if locks::remote(&f) =>
                {
                    Some(locks::fcntl(&f, a[1] as i32, a[2]))
                }
                libc::F_GETLK
                | libc::F_SETLK
                | libc::F_SETLKW
                | libc::F_OFD_GETLK
                | libc::F_OFD_SETLK
                | libc::F_OFD_SETLKW => Some(match f.lock_fd() {
                    Ok(l) => raw(libc::SYS_fcntl, i64::from(l), a[1], a[2], 0, 0, 0),
                    Err(e) => err(e),
                }),
                // Leases, notifications, pipe sizes, seals: not for a
                // placeholder to answer for a file it does not stand for.
                _ => Some(err(Errno::EINVAL)),
            }
        }
        libc::SYS_inotify_add_watch => {
            let follow = a[2] as u32 & libc::IN_DONT_FOLLOW == 0;
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 1, false, follow);
            if t.node.is_none() {
                return Some(err(Errno::ENOENT));
            }
            // Watching the source directory gives the events of a
            // passthrough mount (names are relative to the watched
            // directory); a mount without one has no kernel object to watch.
            let Some(src) = vfs.source() else {
                return Some(err(Errno::ENOSYS));
            };
            let path = exec::backing_path(src, &t.path());
            Some(raw(nr, a[0], path.as_ptr() as i64, a[2], 0, 0, 0))
        }
        libc::SYS_flock => {
            let f = file(a[0])?;
            if locks::remote(&f) {
                return Some(locks::flock(&f, a[1] as i32));
            }
            Some(match f.lock_fd() {
                Ok(l) => raw(libc::SYS_flock, i64::from(l), a[1], 0, 0, 0, 0),
                Err(e) => err(e),
            })
        }
        libc::SYS_fchdir => {
            let Some(f) = file(a[0]) else {
                let r = raw(nr, a[0], 0, 0, 0, 0, 0);
                if r == 0 {
                    follow_kernel_cwd();
                }
                return Some(r);
            };
            let Some(loc) = f.location() else {
                return Some(err(Errno::ENOTDIR));
            };
            set_cwd(Some((f.vfs().clone(), loc.clone())));
            Some(0)
        }
        libc::SYS_getcwd => {
            let cwd = st.cwd.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let (vfs, loc) = cwd?;
            // As the kernel: a removed current directory has no path.
            match vfs.getattr_fresh(loc.node(), None) {
                Ok(a) if a.nlink == 0 => return Some(err(Errno::ENOENT)),
                Err(e) => return Some(err(e)),
                Ok(_) => {}
            }
            let p = vfs.host_path(&loc);
            let buf = match user::slice_mut(a[0], a[1] as usize) {
                Ok(b) => b,
                Err(e) => return Some(err(e)),
            };
            if buf.len() < p.len() + 1 {
                return Some(err(Errno::ERANGE));
            }
            buf[..p.len()].copy_from_slice(&p);
            buf[p.len()] = 0;
            Some(p.len() as i64 + 1)
        }
        libc::SYS_chdir => Some(chdir(a)),
        libc::SYS_umask => {
            let r = raw(nr, a[0], 0, 0, 0, 0, 0);
            for m in &st.mounts {
                m.set_umask(a[0] as u32);
            }
            Some(r)
        }
        libc::SYS_open => open(nr, a, AT_FDCWD, 0, a[1] as i32, a[2] as u32),
        libc::SYS_creat => open(
            nr,
            a,
            AT_FDCWD,
            0,
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            a[1] as u32,
        ),
        libc::SYS_openat => open(nr, a, a[0], 1, a[2] as i32, a[3] as u32),
        libc::SYS_openat2 => {
            let how = match user::slice(a[2], (a[3] as usize).min(24)) {
                Ok(h) => h,
                Err(e) => return Some(err(e)),
            };
            if how.len() < 24 {
                return None;
            }
            let flags = i64::from_ne_bytes(how[0..8].try_into().ok()?) as i32;
            let mode = u64::from_ne_bytes(how[8..16].try_into().ok()?) as u32;
            open(nr, a, a[0], 1, flags, mode)
        }
        libc::SYS_stat => stat(nr, a, AT_FDCWD, 0, true, a[1]),
        libc::SYS_lstat => stat(nr, a, AT_FDCWD, 0, false, a[1]),
        libc::SYS_newfstatat => {
            let flags = a[3] as i32;
            if empty_path(a[1], flags) {
                let f = file(a[0])?;
                if f.kernel_backed() {
                    return Some(res(
                        kernel::fresh_stat(&f, a[0]).and_then(|s| user::put(a[2], &s).map(|()| 0i64))
                    ));
                }
                return Some(res(f
                    .stat()
                    .and_then(|at| user::put(a[2], &to_stat(&at, f.vfs().dev())).map(|()| 0i64))));
            }
            stat(nr, a, a[0], 1, flags & libc::AT_SYMLINK_NOFOLLOW == 0, a[2])
        }
        libc::SYS_statx => {
            let flags = a[2] as i32;
            let attr = if empty_path(a[1], flags) {
                let f = file(a[0])?;
                if f.kernel_backed() {
                    return Some(res(
                        kernel::fresh_statx(&f, a[0]).and_then(|s| user::put(a[4], &s).map(|()| 0i64))
                    ));
                }
                f.stat().map(|at| (at, f.vfs().dev()))
            } else {
                let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, flags & libc::AT_SYMLINK_NOFOLLOW == 0);
                vfs.stat(&t).map(|at| (at, vfs.dev()))
            };
            Some(res(attr.and_then(|(at, dev)| {
                user::put(a[4], &to_statx(&at, dev)).map(|()| 0i64)
            })))
        }
        libc::SYS_access => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, true);
            Some(res(vfs.access(&t, a[1] as i32).map(|_| 0i64)))
        }
        libc::SYS_faccessat | libc::SYS_faccessat2 => {
            let flags = if nr == libc::SYS_faccessat2 { a[3] as i32 } else { 0 };
            let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, flags & libc::AT_SYMLINK_NOFOLLOW == 0);
            Some(res(vfs.access(&t, a[2] as i32).map(|_| 0i64)))
        }
        libc::SYS_mkdir => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, false);
            Some(creating(&vfs, || vfs.mkdir(&t, a[1] as u32)))
        }
        libc::SYS_mkdirat => {
            let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, false);
            Some(creating(&vfs, || vfs.mkdir(&t, a[2] as u32)))
        }
        libc::SYS_unlink => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, false);
            Some(res(vfs.unlink(&t).map(|_| 0i64)))
        }
        libc::SYS_rmdir => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, false);
            Some(res(vfs.rmdir(&t).map(|_| 0i64)))
        }
        libc::SYS_unlinkat => {
            let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, false);
            let r = if a[2] as i32 & libc::AT_REMOVEDIR != 0 {
                vfs.rmdir(&t)
            } else {
                vfs.unlink(&t)
            };
            Some(res(r.map(|_| 0i64)))
        }
        libc::SYS_readlink => {
            if let Some(r) = proc_link(a[0], a[1], a[2]) {
                return Some(r);
            }
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, false);
            Some(readlink_out(&vfs, &t, a[1], a[2]))
        }
        libc::SYS_readlinkat => {
            if let Some(r) = proc_link(a[1], a[2], a[3]) {
                return Some(r);
            }
            let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, false);
            Some(readlink_out(&vfs, &t, a[2], a[3]))
        }
        libc::SYS_truncate => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, true);
            if a[1] < 0 {
                return Some(err(Errno::EINVAL));
            }
            Some(res(vfs.truncate(&t, a[1] as u64).map(|_| 0i64)))
        }
        libc::SYS_fchmodat => {
            let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, true);
            let Some((node, _)) = t.node else {
                return Some(err(Errno::ENOENT));
            };
            let set = SetAttrIn {
                mode: Some(a[2] as u32 & 0o7777),
                ..Default::default()
            };
            Some(res(vfs.setattr(node, &set).map(|_| 0i64)))
        }
        libc::SYS_utimensat => utimensat(nr, a),
        libc::SYS_getxattr
        | libc::SYS_lgetxattr
        | libc::SYS_fgetxattr
        | libc::SYS_listxattr
        | libc::SYS_llistxattr
        | libc::SYS_flistxattr
        | libc::SYS_setxattr
        | libc::SYS_lsetxattr
        | libc::SYS_fsetxattr
        | libc::SYS_removexattr
        | libc::SYS_lremovexattr
        | libc::SYS_fremovexattr => xattr::call(nr, a),
        libc::SYS_rename => rename(nr, a, AT_FDCWD, 0, AT_FDCWD, 1, 0),
        libc::SYS_renameat => rename(nr, a, a[0], 1, a[2], 3, 0),
        libc::SYS_renameat2 => rename(nr, a, a[0], 1, a[2], 3, a[4] as u32),
        libc::SYS_symlink => symlink(nr, a, a[0], AT_FDCWD, 1),
        libc::SYS_symlinkat => symlink(nr, a, a[0], a[1], 2),
        libc::SYS_link => link(nr, a, AT_FDCWD, 0, AT_FDCWD, 1, 0),
        libc::SYS_linkat => link(nr, a, a[0], 1, a[2], 3, a[4] as i32),
        libc::SYS_mknod => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, false);
            Some(creating(&vfs, || vfs.mknod(&t, a[1] as u32, a[2] as u32)))
        }
        libc::SYS_mknodat => {
            let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, false);
            Some(creating(&vfs, || vfs.mknod(&t, a[2] as u32, a[3] as u32)))
        }
        libc::SYS_chmod => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, true);
            Some(set_on(&vfs, &t, &mode_set(a[1])))
        }
        libc::SYS_fchmodat2 => {
            let flags = a[3] as i32;
            if empty_path(a[1], flags) {
                let f = file(a[0])?;
                return Some(res(f.setattr(&mode_set(a[2])).map(|_| 0i64)));
            }
            let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, flags & libc::AT_SYMLINK_NOFOLLOW == 0);
            if flags & libc::AT_SYMLINK_NOFOLLOW != 0
                && t.node
                    .is_some_and(|(_, at)| at.file_type() == shortfuse::FileType::Symlink)
            {
                // As the kernel: a symbolic link's mode cannot change.
                return Some(err(Errno::EOPNOTSUPP));
            }
            Some(set_on(&vfs, &t, &mode_set(a[2])))
        }
        libc::SYS_chown => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, true);
            Some(set_on(&vfs, &t, &owner_set(a[1], a[2])))
        }
        libc::SYS_lchown => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, false);
            Some(set_on(&vfs, &t, &owner_set(a[1], a[2])))
        }
        libc::SYS_fchown => {
            let f = file(a[0])?;
            Some(res(f.setattr(&owner_set(a[1], a[2])).map(|_| 0i64)))
        }
        libc::SYS_fchownat => {
            let flags = a[4] as i32;
            if empty_path(a[1], flags) {
                let f = file(a[0])?;
                return Some(res(f.setattr(&owner_set(a[2], a[3])).map(|_| 0i64)));
            }
            let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, flags & libc::AT_SYMLINK_NOFOLLOW == 0);
            Some(set_on(&vfs, &t, &owner_set(a[2], a[3])))
        }
        libc::SYS_statfs => {
            let (vfs, t) = resolve_or_pass!(nr, a, AT_FDCWD, 0, false, true);
            let Some((node, _)) = t.node else {
                return Some(err(Errno::ENOENT));
            };
            Some(res(vfs
                .statfs(node)
                .and_then(|s| user::put(a[1], &to_statfs(&s, &vfs)).map(|()| 0i64))))
        }
        libc::SYS_fstatfs => {
            let f = file(a[0])?;
            Some(res(f
                .vfs()
                .statfs(f.node())
                .and_then(|s| user::put(a[1], &to_statfs(&s, f.vfs())).map(|()| 0i64))))
        }
        libc::SYS_fallocate => {
            let f = file(a[0])?;
            if a[2] < 0 || a[3] <= 0 {
                return Some(err(Errno::EINVAL));
            }
            Some(res(f.fallocate(a[1] as i32, a[2] as u64, a[3] as u64).map(|_| 0i64)))
        }
        libc::SYS_preadv | libc::SYS_pwritev | libc::SYS_preadv2 | libc::SYS_pwritev2 => {
            let f = file(a[0])?;
            let read = nr == libc::SYS_preadv || nr == libc::SYS_preadv2;
            // preadv2/pwritev2 with offset -1 use (and move) the file offset.
            let at = if a[3] == -1 && (nr == libc::SYS_preadv2 || nr == libc::SYS_pwritev2) {
                None
            } else if a[3] < 0 {
                return Some(err(Errno::EINVAL));
            } else {
                Some(a[3] as u64)
            };
            Some(vectored(&f, a[1], a[2], read, at))
        }
        libc::SYS_copy_file_range | libc::SYS_sendfile | libc::SYS_splice => {
            let (out, inp) = if nr == libc::SYS_sendfile {
                (a[0], a[1])
            } else {
                (a[2], a[0])
            };
            if file(out).is_none() && file(inp).is_none() {
                return None;
            }
            kernel::copy(nr, a)
        }
        libc::SYS_fadvise64 | libc::SYS_sync_file_range => {
            file(a[0])?;
            Some(0)
        }
        libc::SYS_ioctl => {
            let f = file(a[0])?;
            // FIONREAD; no other ioctl is served on a mount file (FICLONE,
            // FS_IOC_*, TCGETS): the answer of a file without them.
            Some(kernel::ioctl(&f, a))
        }
        libc::SYS_mmap => {
            let f = file(a[4])?;
            if a[3] as i32 & libc::MAP_ANONYMOUS != 0 {
                return None;
            }
            Some(kernel::mmap(&f, a))
        }
        libc::SYS_execve => exec::execve(a),
        libc::SYS_execveat => exec::execveat(a),
        _ => None,
    }
}

/// Whether a `*at` call with `flags` names its descriptor itself
/// (AT_EMPTY_PATH and an empty path; since Linux 6.11 also a null one).
fn empty_path(path: i64, flags: i32) -> bool {
    flags & libc::AT_EMPTY_PATH != 0 && (path == 0 || user::cstr(path).is_ok_and(<[u8]>::is_empty))
}

/// Runs an operation that may create a node (see [`restore_umask`]).
fn creating<T>(vfs: &Vfs, f: impl FnOnce() -> Result<T, Errno>) -> i64 {
    let r = f();
    restore_umask(vfs);
    res(r.map(|_| 0i64))
}

/// After an operation that may create a node: the in-process passthrough
/// zeroes the calling thread's umask for its own work (it applies the
/// caller's umask itself); give the program its umask back. A daemon's
/// file system runs in the daemon and leaves ours alone.
fn restore_umask(vfs: &Vfs) {
    if !vfs.client().shared() {
        raw(libc::SYS_umask, i64::from(vfs.umask()), 0, 0, 0, 0, 0);
    }
}

fn mode_set(mode: i64) -> SetAttrIn {
    SetAttrIn {
        mode: Some(mode as u32 & 0o7777),
        ..Default::default()
    }
}

/// chown's (uid, gid): -1 (as a 32-bit value) leaves one unchanged.
fn owner_set(uid: i64, gid: i64) -> SetAttrIn {
    let id = |v: i64| (v as u32 != u32::MAX).then_some(v as u32);
    SetAttrIn {
        uid: id(uid),
        gid: id(gid),
        ..Default::default()
    }
}

fn set_on(vfs: &Vfs, t: &Target, set: &SetAttrIn) -> i64 {
    let Some((node, _)) = t.node else {
        return err(Errno::ENOENT);
    };
    if t.trailing_slash
        && t.node
            .is_some_and(|(_, a)| a.file_type() != shortfuse::FileType::Directory)
    {
        return err(Errno::ENOTDIR);
    }
    // chown(-1, -1) goes too: on ext4 it moves ctime and clears set-id
    // bits, which the file system does on an empty SETATTR.
    res(vfs.setattr(node, set).map(|_| 0i64))
}

/// readv/writev/preadv/pwritev: one request per buffer, stopping at the
/// first short transfer; an error after some bytes moved reports the bytes.
fn vectored(f: &OpenFile, iov: i64, n: i64, read: bool, at: Option<u64>) -> i64 {
    if !(0..=1024).contains(&n) {
        return err(Errno::EINVAL);
    }
    let mut total = 0i64;
    let iov = match user::iovecs(iov, n) {
        Ok(v) => v,
        Err(e) => return err(e),
    };
    for v in iov {
        let (base, len) = (v.iov_base as i64, v.iov_len);
        let r = match (read, at) {
            (true, None) => user::slice_mut(base, len).and_then(|b| f.read(b)),
            (false, None) => user::slice(base, len).and_then(|b| f.write(b)),
            (true, Some(off)) => user::slice_mut(base, len).and_then(|b| f.pread(b, off + total as u64)),
            (false, Some(off)) => user::slice(base, len).and_then(|b| f.pwrite(b, off + total as u64)),
        };
        match r {
            Ok(got) => {
                total += got as i64;
                if got < v.iov_len {
                    break;
                }
            }
            Err(e) if total == 0 => return err(e),
            Err(_) => break,
        }
    }
    total
}

fn symlink(nr: i64, a: [i64; 6], target: i64, dirfd: i64, idx: usize) -> Option<i64> {
    let target = match user::cstr(target) {
        Ok(t) => t.to_vec(),
        Err(e) => return Some(err(e)),
    };
    let (vfs, t) = resolve_or_pass!(nr, a, dirfd, idx, idx == 2, false);
    Some(creating(&vfs, || vfs.symlink(&target, &t)))
}

fn link(nr: i64, a: [i64; 6], d1: i64, i1: usize, d2: i64, i2: usize, flags: i32) -> Option<i64> {
    let (p1, p2) = match (user::cstr(a[i1]), user::cstr(a[i2])) {
        (Ok(p1), Ok(p2)) => (p1, p2),
        (Err(e), _) | (_, Err(e)) => return Some(err(e)),
    };
    let old = if flags & libc::AT_EMPTY_PATH != 0 && p1.is_empty() {
        match file(d1) {
            Some(f) => match target_of(&f) {
                Ok(t) => Resolved::Ours(f.vfs().clone(), t),
                Err(e) => return Some(err(e)),
            },
            None => Resolved::Kernel(None),
        }
    } else {
        match resolve(d1, p1, flags & libc::AT_SYMLINK_FOLLOW != 0) {
            Ok(r) => r,
            Err(e) => return Some(err(e)),
        }
    };
    let new = match resolve(d2, p2, false) {
        Ok(r) => r,
        Err(e) => return Some(err(e)),
    };
    match (old, new) {
        (Resolved::Kernel(None), Resolved::Kernel(None)) => None,
        (Resolved::Kernel(x), Resolved::Kernel(y)) => {
            let old = x.unwrap_or_else(|| p1.iter().copied().chain([0]).collect());
            let new = y.unwrap_or_else(|| p2.iter().copied().chain([0]).collect());
            let od = if old[0] == b'/' { AT_FDCWD } else { d1 };
            let nd = if new[0] == b'/' { AT_FDCWD } else { d2 };
            let _ = nr;
            Some(raw(
                libc::SYS_linkat,
                od,
                old.as_ptr() as i64,
                nd,
                new.as_ptr() as i64,
                i64::from(flags),
                0,
            ))
        }
        (Resolved::Ours(v1, t1), Resolved::Ours(v2, t2)) if Arc::ptr_eq(&v1, &v2) => {
            Some(res(v1.link(&t1, &t2).map(|_| 0i64)))
        }
        // A kernel descriptor (an O_TMPFILE of a passthrough mount, see
        // `tmpfile_open`) given a name in a mount with a source: the
        // kernel links it in the backing directory, or says EXDEV.
        (Resolved::Kernel(None), Resolved::Ours(v2, t2))
            if v2.source().is_some() && (p1.is_empty() || magic_link(p1).is_some()) =>
        {
            let new = exec::backing_path(v2.source().unwrap_or_default(), &t2.path());
            Some(raw(
                libc::SYS_linkat,
                d1,
                a[i1],
                AT_FDCWD,
                new.as_ptr() as i64,
                i64::from(flags),
                0,
            ))
        }
        _ => Some(err(Errno::EXDEV)),
    }
}

/// The kernel's `struct statfs` (x86_64): f_type, f_bsize, f_blocks,
/// f_bfree, f_bavail, f_files, f_ffree, f_fsid, f_namelen, f_frsize,
/// f_flags, f_spare[4]. Written as words: libc's struct hides f_flags.
fn to_statfs(s: &shortfuse::Statfs, vfs: &Vfs) -> [i64; 15] {
    let mut out = [0i64; 15];
    // FUSE_SUPER_MAGIC, as statfs(2) reports for a FUSE mount.
    out[0] = 0x6573_5546;
    out[1] = i64::from(s.bsize);
    out[2] = s.blocks as i64;
    out[3] = s.bfree as i64;
    out[4] = s.bavail as i64;
    out[5] = s.files as i64;
    out[6] = s.ffree as i64;
    // f_fsid stays zero, as for every FUSE mount.
    out[8] = i64::from(s.namelen);
    out[9] = i64::from(if s.frsize == 0 { s.bsize } else { s.frsize });
    // ST_VALID says f_flags is filled in.
    out[10] = 0x20 | if vfs.is_read_only() { libc::ST_RDONLY as i64 } else { 0 };
    out
}

/// This process's lock owner (FLUSH and POSIX locks): what a shared
/// daemon's lock table knows it by (see `locks`).
fn owner() -> u64 {
    shortfuse_ring::POSIX_OWNER | u64::from(shortfuse_ring::pid())
}

fn set_cwd(new: Option<(Arc<Vfs>, shortfuse_vfs::Location)>) {
    let st = state();
    if let Some((vfs, loc)) = &new {
        vfs.pin_location(loc);
        kernel_cwd_inside(vfs, loc);
    }
    let old = std::mem::replace(&mut *st.cwd.lock().unwrap_or_else(|e| e.into_inner()), new);
    if let Some((vfs, loc)) = old {
        vfs.unpin_location(&loc);
    }
}

/// Points the kernel's current directory, which relative paths of calls we
/// do not serve start at (a program the shim does not reach, a statically
/// linked one, all of its calls), at a safe place while ours is `loc` in
/// `vfs`: the backing directory of a mount that has one (a static program
/// then works in the mount's source), the directory itself where a
/// daemon's mount point is mounted in the kernel too, else an empty
/// directory where nothing can be created ([`enter_dead_directory`]). Never the directory
/// the program left to enter the mount.
pub(crate) fn kernel_cwd_inside(vfs: &Vfs, loc: &shortfuse_vfs::Location) {
    if let Some(src) = vfs.source() {
        let rest = if loc.is_root() {
            b"/".to_vec()
        } else {
            loc.path().to_vec()
        };
        let p = exec::backing_path(src, &rest);
        if raw(libc::SYS_chdir, p.as_ptr() as i64, 0, 0, 0, 0, 0) == 0 {
            return;
        }
    } else if unserved::kernel_mounted(vfs) {
        // A daemon's mount in the kernel: the very directory.
        let p = with_nul(vfs.host_path(loc));
        if raw(libc::SYS_chdir, p.as_ptr() as i64, 0, 0, 0, 0, 0) == 0 {
            return;
        }
    }
    enter_dead_directory();
}

/// Makes the kernel's current directory an empty directory that has been
/// removed, below two more removed ones: creating anything there, or one
/// or two levels up, fails (ENOENT, for root too), and it lists empty.
/// Raw system calls and a stack buffer only (a vfork child calls it).
pub(crate) fn enter_dead_directory() {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut buf = [0u8; 96];
    let mut len = 0;
    fn put(buf: &mut [u8], len: &mut usize, b: &[u8]) {
        buf[*len..*len + b.len()].copy_from_slice(b);
        *len += b.len();
    }
    put(&mut buf, &mut len, b"/tmp/.shortfuse-cwd-");
    let pid = raw(libc::SYS_getpid, 0, 0, 0, 0, 0, 0) as u64;
    for (i, n) in [pid, NEXT.fetch_add(1, Ordering::Relaxed)].into_iter().enumerate() {
        if i > 0 {
            put(&mut buf, &mut len, b"-");
        }
        let mut digits = [0u8; 20];
        let mut k = digits.len();
        let mut n = n;
        loop {
            k -= 1;
            digits[k] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        put(&mut buf, &mut len, &digits[k..]);
    }
    let mut ends = [0usize; 3];
    for (level, end) in ends.iter_mut().enumerate() {
        if level > 0 {
            put(&mut buf, &mut len, b"/d");
        }
        *end = len;
        buf[len] = 0;
        if raw(libc::SYS_mkdir, buf.as_ptr() as i64, 0o500, 0, 0, 0, 0) < 0 {
            // Nothing to stand in (no /tmp): take back what was made.
            for &e in ends[..level].iter().rev() {
                buf[e] = 0;
                raw(libc::SYS_rmdir, buf.as_ptr() as i64, 0, 0, 0, 0, 0);
            }
            return;
        }
    }
    raw(libc::SYS_chdir, buf.as_ptr() as i64, 0, 0, 0, 0, 0);
    for &e in ends.iter().rev() {
        buf[e] = 0;
        raw(libc::SYS_rmdir, buf.as_ptr() as i64, 0, 0, 0, 0, 0);
    }
}

/// The kernel's current directory changed: remember it, leave the mount's.
fn follow_kernel_cwd() {
    let mut buf = vec![0u8; 4096];
    let n = raw(libc::SYS_getcwd, buf.as_mut_ptr() as i64, buf.len() as i64, 0, 0, 0, 0);
    if n > 0 {
        buf.truncate(n as usize - 1);
        *state().host_cwd.lock().unwrap_or_else(|e| e.into_inner()) = buf;
    }
    set_cwd(None);
}

/// chdir: ours, or the kernel's (then our idea of the cwd follows it).
fn chdir(a: [i64; 6]) -> i64 {
    let path = match user::cstr(a[0]) {
        Ok(p) => p,
        Err(e) => return err(e),
    };
    let kernel = |p: Option<Vec<u8>>| {
        let ptr = p.as_ref().map_or(a[0], |p| p.as_ptr() as i64);
        let r = raw(libc::SYS_chdir, ptr, 0, 0, 0, 0, 0);
        if r == 0 {
            follow_kernel_cwd();
        }
        r
    };
    match resolve(AT_FDCWD, path, true) {
        Err(e) => err(e),
        Ok(Resolved::Kernel(p)) => kernel(p),
        Ok(Resolved::Ours(vfs, t)) => res(vfs.chdir(&t).map(|loc| {
            set_cwd(Some((vfs.clone(), loc)));
            0i64
        })),
    }
}

fn open(nr: i64, a: [i64; 6], dirfd: i64, idx: usize, flags: i32, mode: u32) -> Option<i64> {
    let follow =
        flags & libc::O_NOFOLLOW == 0 && flags & (libc::O_CREAT | libc::O_EXCL) != libc::O_CREAT | libc::O_EXCL;
    // An O_CREAT open of a name the cache does not know first tries to
    // create it, without a LOOKUP; when that fails (the name may exist), it
    // takes the usual way.
    let create = flags & (libc::O_CREAT | libc::O_PATH) == libc::O_CREAT;
    let (mut vfs, t) = resolve_or_pass!(nr, a, dirfd, idx, idx == 1, flags WalkFlags { follow, create });
    if let Some(fd) = open_special(&vfs, &t, flags) {
        return Some(fd);
    }
    let tmpfile = flags & libc::O_TMPFILE == libc::O_TMPFILE;
    let mut opened = if tmpfile {
        match tmpfile_open(&vfs, &t, flags, mode) {
            Tmpfile::Kernel(fd) => return Some(fd),
            Tmpfile::Ours(r) => r,
        }
    } else {
        vfs.open(&t, flags, mode)
    };
    if t.unasked && opened.is_err() && !tmpfile {
        let (v, t) = resolve_or_pass!(nr, a, dirfd, idx, idx == 1, follow);
        if let Some(fd) = open_special(&v, &t, flags) {
            return Some(fd);
        }
        opened = v.open(&t, flags, mode);
        vfs = v;
    }
    if flags & libc::O_CREAT != 0 {
        restore_umask(&vfs);
    }
    let f = match opened {
        Ok(f) => f,
        Err(e) => return Some(err(e)),
    };
    let cloexec = flags & libc::O_CLOEXEC != 0;
    if flags & libc::O_PATH == 0 && f.data_map().is_some_and(|m| m.whole().is_some()) {
        // See `kernel`: the kernel keeps this open file description.
        spare::flush();
        let fd = kernel::backing_descriptor(&f, flags, cloexec);
        if fd >= 0 {
            f.set_kernel_backed();
            state().fds.insert(fd as i32, f, cloexec);
            return Some(fd);
        }
    }
    // A daemon's file gets its shared description only when it may reach
    // another process (see `shared`).
    let clock = shared::clock();
    let fd = spare::placeholder(placeholder_source(), cloexec);
    if fd < 0 {
        return Some(fd);
    }
    state().fds.insert(fd as i32, f.clone(), cloexec);
    if shared::pending(&f) {
        shared::opened();
        shared::settle(&f, clock);
    }
    Some(fd)
}

/// What an O_TMPFILE open made.
enum Tmpfile {
    /// A kernel descriptor (or a negated errno).
    Kernel(i64),
    /// An open file of ours.
    Ours(Result<Arc<OpenFile>, Errno>),
}

/// open(O_TMPFILE) in directory `t`: an unnamed file that linkat may give
/// a name later. On a mount with a source directory the kernel makes it in
/// the backing directory (and linkat of its descriptor into the mount
/// links it there, see [`link`]); elsewhere (the trait has no TMPFILE) a
/// file created under a name of its own and removed at once, which the
/// open keeps: linkat of its descriptor gives it a name again.
fn tmpfile_open(vfs: &Arc<Vfs>, t: &Target, flags: i32, mode: u32) -> Tmpfile {
    match t.node {
        Some((_, a)) if a.file_type() == shortfuse::FileType::Directory => {}
        Some(_) => return Tmpfile::Kernel(err(Errno::ENOTDIR)),
        None => return Tmpfile::Kernel(err(Errno::ENOENT)),
    }
    if flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Tmpfile::Kernel(err(Errno::EINVAL));
    }
    if let Some(src) = vfs.source() {
        let dir = exec::backing_path(src, &t.path());
        spare::flush();
        let fd = raw(
            libc::SYS_openat,
            AT_FDCWD,
            dir.as_ptr() as i64,
            i64::from(flags),
            i64::from(mode),
            0,
            0,
        );
        return Tmpfile::Kernel(fd);
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!(
        ".sftmp.{}.{}",
        raw(libc::SYS_getpid, 0, 0, 0, 0, 0, 0),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let walk = WalkFlags {
        follow: false,
        create: false,
    };
    let dir = t.location().unwrap_or_default();
    let named = match vfs.walk(&dir, name.as_bytes(), walk, 0) {
        Ok(Walk::Inside(n)) => n,
        Ok(Walk::Outside { .. }) => return Tmpfile::Kernel(err(Errno::EXDEV)),
        Err(e) => return Tmpfile::Kernel(err(e)),
    };
    let create = (flags & !libc::O_TMPFILE) | libc::O_CREAT | libc::O_EXCL;
    let f = vfs.open(&named, create, mode);
    restore_umask(vfs);
    if f.is_ok() {
        if let Ok(Walk::Inside(n)) = vfs.walk(&dir, name.as_bytes(), walk, 0) {
            let _ = vfs.unlink(&n);
        }
    }
    Tmpfile::Ours(f)
}

/// An open of an existing FIFO, socket or device node: the kernel's (see
/// `special`). `None` for other files, and for opens the file system
/// answers alike for every type (O_PATH, O_CREAT|O_EXCL, O_DIRECTORY).
fn open_special(vfs: &Arc<Vfs>, t: &Target, flags: i32) -> Option<i64> {
    let (node, attr) = t.node?;
    let excl = libc::O_CREAT | libc::O_EXCL;
    if !special::is_special(attr.file_type())
        || flags & (libc::O_PATH | libc::O_DIRECTORY) != 0
        || flags & excl == excl
        || t.trailing_slash
    {
        return None;
    }
    Some(special::open(vfs, t, node, &attr, flags))
}

/// The descriptor placeholders are duplicated from: an O_PATH descriptor of
/// a memfd of our own, above [`OWN_FD_FLOOR`]. A kernel call that still
/// reaches a placeholder then touches nothing anybody else uses (a chmod
/// of `/proc/self/fd/N` by glibc, say, which we serve ourselves anyway).
fn placeholder_source() -> i64 {
    static SOURCE: AtomicI64 = AtomicI64::new(-1);
    let have = SOURCE.load(Ordering::Acquire);
    if have >= 0 {
        return have;
    }
    let memfd = raw(
        libc::SYS_memfd_create,
        c"shortfuse-placeholder".as_ptr() as i64,
        i64::from(libc::MFD_CLOEXEC),
        0,
        0,
        0,
        0,
    );
    let made = if memfd >= 0 {
        let link = with_nul(format!("/proc/self/fd/{memfd}").into_bytes());
        let flags = i64::from(libc::O_PATH | libc::O_CLOEXEC);
        let p = raw(libc::SYS_openat, AT_FDCWD, link.as_ptr() as i64, flags, 0, 0, 0);
        raw(libc::SYS_close, memfd, 0, 0, 0, 0, 0);
        p
    } else {
        let flags = i64::from(libc::O_PATH | libc::O_CLOEXEC);
        raw(libc::SYS_openat, AT_FDCWD, c"/dev/null".as_ptr() as i64, flags, 0, 0, 0)
    };
    if made < 0 {
        return made;
    }
    let high = raw(
        libc::SYS_fcntl,
        made,
        i64::from(libc::F_DUPFD_CLOEXEC),
        OWN_FD_FLOOR,
        0,
        0,
        0,
    );
    let fd = if high >= 0 {
        raw(libc::SYS_close, made, 0, 0, 0, 0, 0);
        high
    } else {
        made
    };
    match SOURCE.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => fd,
        Err(other) => {
            raw(libc::SYS_close, fd, 0, 0, 0, 0, 0);
            other
        }
    }
}

fn stat(nr: i64, a: [i64; 6], dirfd: i64, idx: usize, follow: bool, out: i64) -> Option<i64> {
    let (vfs, t) = resolve_or_pass!(nr, a, dirfd, idx, idx == 1, follow);
    Some(res(vfs
        .stat(&t)
        .and_then(|at| user::put(out, &to_stat(&at, vfs.dev())).map(|()| 0i64))))
}

/// readlink of the kernel's links to a descriptor of ours
/// (`/proc/self/fd/N`, `/dev/fd/N`) or to the current directory inside a
/// mount (`/proc/self/cwd`): the path in the mount, as the kernel gives it
/// for a file of a kernel mount (" (deleted)" after a removed file's). The
/// kernel would name a placeholder, a backing file or a directory outside
/// the mount. `None` for any other path (an absolute path only: a path
/// relative to a descriptor of /proc is the kernel's).
fn proc_link(path: i64, buf: i64, len: i64) -> Option<i64> {
    let path = user::cstr(path).ok()?;
    if !path.starts_with(b"/") {
        return None;
    }
    let name = if let Some(f) = magic_link(path).and_then(|fd| state().fds.get(fd)) {
        let mut p = match f.location() {
            Some(loc) => f.vfs().host_path(loc),
            None => {
                let mut p = f.vfs().mountpoint().to_vec();
                if p.ends_with(b"/") {
                    p.pop();
                }
                p.extend_from_slice(f.path());
                p
            }
        };
        if f.stat().is_ok_and(|a| a.nlink == 0) {
            p.extend_from_slice(b" (deleted)");
        }
        p
    } else if is_cwd_link(path) {
        let cwd = state().cwd.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (vfs, loc) = cwd?;
        vfs.host_path(&loc)
    } else {
        return None;
    };
    Some(link_out(&name, buf, len))
}

/// `/proc/self/cwd`, `/proc/thread-self/cwd` or `/proc/PID/cwd` with our pid.
fn is_cwd_link(path: &[u8]) -> bool {
    let Some(who) = path.strip_prefix(b"/proc/").and_then(|p| p.strip_suffix(b"/cwd")) else {
        return false;
    };
    who == b"self"
        || who == b"thread-self"
        || std::str::from_utf8(who)
            .ok()
            .and_then(|w| w.parse::<i64>().ok())
            .is_some_and(|pid| pid == raw(libc::SYS_getpid, 0, 0, 0, 0, 0, 0))
}

fn readlink_out(vfs: &Vfs, t: &Target, buf: i64, len: i64) -> i64 {
    match vfs.readlink(t) {
        Ok(target) => link_out(&target, buf, len),
        Err(e) => err(e),
    }
}

/// Copies a link's `target` to the program's buffer, as readlink does
/// (truncated, no NUL).
fn link_out(target: &[u8], buf: i64, len: i64) -> i64 {
    if len <= 0 {
        return err(Errno::EINVAL);
    }
    let n = target.len().min(len as usize);
    match user::slice_mut(buf, n) {
        Ok(out) => {
            out.copy_from_slice(&target[..n]);
            n as i64
        }
        Err(e) => err(e),
    }
}

fn utimensat(nr: i64, a: [i64; 6]) -> Option<i64> {
    let flags = a[3] as i32;
    // Both times UTIME_OMIT: the kernel returns 0 before it looks at the
    // path (nothing changes, ctime included).
    if a[2] != 0 && user::get::<[i64; 4]>(a[2]).is_ok_and(|t| t[1] == libc::UTIME_OMIT && t[3] == libc::UTIME_OMIT) {
        return Some(0);
    }
    // A null path is futimens(2): the descriptor itself.
    let path = if a[1] == 0 {
        None
    } else {
        match user::cstr(a[1]) {
            Ok(p) => Some(p),
            Err(e) => return Some(err(e)),
        }
    };
    let (vfs, node) = match path {
        None => {
            let f = file(a[0])?;
            (f.vfs().clone(), f.node())
        }
        Some(_) => {
            let (vfs, t) = resolve_or_pass!(nr, a, a[0], 1, true, flags & libc::AT_SYMLINK_NOFOLLOW == 0);
            let Some((node, _)) = t.node else {
                return Some(err(Errno::ENOENT));
            };
            (vfs, node)
        }
    };
    // Two struct timespec, or null for "both now".
    let times = if a[2] == 0 {
        None
    } else {
        match user::get::<[i64; 4]>(a[2]) {
            Ok(t) => Some(t),
            Err(e) => return Some(err(e)),
        }
    };
    let time = |i: usize| -> Option<Option<shortfuse::Timestamp>> {
        let Some(ts) = times else {
            return Some(None);
        };
        let (sec, nsec) = (ts[2 * i], ts[2 * i + 1]);
        match nsec {
            n if n == libc::UTIME_OMIT => None,
            n if n == libc::UTIME_NOW => Some(None),
            n => Some(Some(shortfuse::Timestamp { sec, nsec: n as u32 })),
        }
    };
    let set = SetAttrIn {
        atime: time(0),
        mtime: time(1),
        ..Default::default()
    };
    Some(res(vfs.setattr(node, &set).map(|_| 0i64)))
}

fn rename(nr: i64, a: [i64; 6], d1: i64, i1: usize, d2: i64, i2: usize, flags: u32) -> Option<i64> {
    let (p1, p2) = match (user::cstr(a[i1]), user::cstr(a[i2])) {
        (Ok(p1), Ok(p2)) => (p1, p2),
        (Err(e), _) | (_, Err(e)) => return Some(err(e)),
    };
    let r1 = match resolve(d1, p1, false) {
        Ok(r) => r,
        Err(e) => return Some(err(e)),
    };
    let r2 = match resolve(d2, p2, false) {
        Ok(r) => r,
        Err(e) => return Some(err(e)),
    };
    match (r1, r2) {
        (Resolved::Kernel(None), Resolved::Kernel(None)) => None,
        (Resolved::Kernel(x), Resolved::Kernel(y)) => {
            let old = x.unwrap_or_else(|| p1.iter().copied().chain([0]).collect());
            let new = y.unwrap_or_else(|| p2.iter().copied().chain([0]).collect());
            let (od, nd) = (
                if old[0] == b'/' { AT_FDCWD } else { d1 },
                if new[0] == b'/' { AT_FDCWD } else { d2 },
            );
            Some(raw(
                libc::SYS_renameat2,
                od,
                old.as_ptr() as i64,
                nd,
                new.as_ptr() as i64,
                flags as i64,
                0,
            ))
        }
        (Resolved::Ours(v1, t1), Resolved::Ours(v2, t2)) if Arc::ptr_eq(&v1, &v2) => {
            let _ = nr;
            Some(res(v1.rename(&t1, &t2, flags).map(|_| 0i64)))
        }
        _ => Some(err(Errno::EXDEV)),
    }
}

pub fn to_stat(a: &Attr, dev: u64) -> libc::stat {
    let mut s: libc::stat = user::zeroed();
    s.st_dev = dev;
    s.st_ino = a.ino;
    s.st_nlink = u64::from(a.nlink);
    s.st_mode = a.mode;
    s.st_uid = a.uid;
    s.st_gid = a.gid;
    s.st_rdev = u64::from(a.rdev);
    s.st_size = a.size as i64;
    s.st_blksize = if a.blksize == 0 { 4096 } else { i64::from(a.blksize) };
    s.st_blocks = a.blocks as i64;
    s.st_atime = a.atime.sec;
    s.st_atime_nsec = i64::from(a.atime.nsec);
    s.st_mtime = a.mtime.sec;
    s.st_mtime_nsec = i64::from(a.mtime.nsec);
    s.st_ctime = a.ctime.sec;
    s.st_ctime_nsec = i64::from(a.ctime.nsec);
    s
}

pub fn to_statx(a: &Attr, dev: u64) -> libc::statx {
    let mut s: libc::statx = user::zeroed();
    s.stx_mask = libc::STATX_BASIC_STATS;
    s.stx_blksize = if a.blksize == 0 { 4096 } else { a.blksize };
    s.stx_nlink = a.nlink;
    s.stx_uid = a.uid;
    s.stx_gid = a.gid;
    s.stx_mode = a.mode as u16;
    s.stx_ino = a.ino;
    s.stx_size = a.size;
    s.stx_blocks = a.blocks;
    let ts = |t: shortfuse::Timestamp| {
        let mut x: libc::statx_timestamp = user::zeroed();
        x.tv_sec = t.sec;
        x.tv_nsec = t.nsec;
        x
    };
    s.stx_atime = ts(a.atime);
    s.stx_mtime = ts(a.mtime);
    s.stx_ctime = ts(a.ctime);
    s.stx_rdev_major = libc::major(u64::from(a.rdev));
    s.stx_rdev_minor = libc::minor(u64::from(a.rdev));
    s.stx_dev_major = libc::major(dev);
    s.stx_dev_minor = libc::minor(dev);
    s
}

/// Where descriptors of our own code go (see [`nested`]): above the small
/// numbers programs pick themselves (shells use 3 to 9 for `exec N>`, and
/// save descriptors at 10 and up with F_DUPFD, which finds free ones).
pub const OWN_FD_FLOOR: i64 = 100;

/// A system call made by our own code (the in-process file system, the
/// allocator) while it serves one of the program's. Runs it, and moves a
/// descriptor it creates above [`OWN_FD_FLOOR`]: the file system's
/// descriptors live in the program's table, and a program picks some
/// numbers itself (`exec 3> f` in a shell is `dup2(fd, 3)`, after probing 3
/// with `fcntl(F_GETFD)`; `closefrom(3)`), which must never be ours.
///
/// The hook in lib.rs calls it for every call it passes on while a call
/// is served (with the zpoline entry; under Syscall User Dispatch alone the
/// selector lets such calls reach the kernel directly, and their
/// descriptors stay where the kernel put them). `mounts::Fence` keeps the
/// descriptors opened while the mounts are built high.
pub fn nested(nr: i64, a: [i64; 6]) -> i64 {
    let r = raw(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
    let creates = match nr {
        libc::SYS_open | libc::SYS_openat | libc::SYS_openat2 | libc::SYS_creat | libc::SYS_dup => true,
        libc::SYS_fcntl => matches!(a[1] as i32, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC),
        libc::SYS_socket | libc::SYS_memfd_create | libc::SYS_eventfd2 | libc::SYS_epoll_create1 => true,
        _ => false,
    };
    if !creates || r < 0 {
        return r;
    }
    let floor = OWN_FD_FLOOR;
    if r >= floor {
        return r;
    }
    let cloexec = raw(libc::SYS_fcntl, r, i64::from(libc::F_GETFD), 0, 0, 0, 0);
    let cmd = if cloexec > 0 && cloexec & i64::from(libc::FD_CLOEXEC) != 0 {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    let high = raw(libc::SYS_fcntl, r, i64::from(cmd), floor, 0, 0, 0);
    if high < 0 {
        // No room up there (a tiny limit): keep the low number.
        return r;
    }
    raw(libc::SYS_close, r, 0, 0, 0, 0, 0);
    high
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_links_name_descriptors() {
        assert_eq!(magic_link(b"/proc/self/fd/3"), Some(3));
        assert_eq!(magic_link(b"/dev/fd/12"), Some(12));
        assert_eq!(magic_link(b"/proc/thread-self/fd/7"), Some(7));
        for other in [
            &b"/proc/self/fd/"[..],
            b"/proc/self/fd/3/x",
            b"/proc/self/fdinfo/3",
            b"/dev/fd/x",
            b"/tmp/3",
        ] {
            assert_eq!(magic_link(other), None, "{}", String::from_utf8_lossy(other));
        }
        assert_eq!(magic_link(b"/proc/self/fd/99999999999"), None);
    }

    #[test]
    fn nested_descriptors_move_above_the_programs_numbers() {
        let flags = i64::from(libc::O_RDONLY | libc::O_CLOEXEC);
        let fd = nested(
            libc::SYS_openat,
            [AT_FDCWD, c"/dev/null".as_ptr() as i64, flags, 0, 0, 0],
        );
        let floor = OWN_FD_FLOOR;
        assert!(fd >= floor, "fd {fd} below {floor}");
        let fdflags = raw(libc::SYS_fcntl, fd, i64::from(libc::F_GETFD), 0, 0, 0, 0);
        assert_eq!(fdflags & i64::from(libc::FD_CLOEXEC), i64::from(libc::FD_CLOEXEC));
        let dup = nested(libc::SYS_dup, [fd, 0, 0, 0, 0, 0]);
        assert!(dup >= floor && dup != fd);
        // Failures pass through.
        let bad = nested(
            libc::SYS_openat,
            [AT_FDCWD, c"/nonexistent/x".as_ptr() as i64, flags, 0, 0, 0],
        );
        assert_eq!(bad, -i64::from(libc::ENOENT));
        raw(libc::SYS_close, fd, 0, 0, 0, 0, 0);
        raw(libc::SYS_close, dup, 0, 0, 0, 0, 0);
    }
}
