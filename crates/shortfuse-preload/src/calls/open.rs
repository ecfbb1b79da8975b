//! open, creat, openat and openat2: a mount file opened by its file
//! system, with a kernel descriptor standing for it in the program.
#![allow(unsafe_code)] // the program's memory, through `user`

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use shortfuse::Errno;
use shortfuse_vfs::{OpenFile, Target, Vfs, Walk, WalkFlags};

use super::descriptors::OWN_FD_FLOOR;
use super::exec;
use super::kernel;
use super::paths::restore_umask;
use super::reply::err;
use super::resolve::{self, ours, with_nul};
use super::shared;
use super::spare;
use super::special;
use super::table::{PathAt, Ptr, Regs};
use crate::state;
use crate::sys::{fs, process};
use crate::user;

/// openat2: its flags and mode come in a `struct open_how`.
pub fn openat2(regs: Regs, at: PathAt, how: Ptr, size: usize) -> Option<i64> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let how = match unsafe { user::slice(how.0, size.min(24)) } {
        Ok(h) => h,
        Err(e) => return Some(err(e)),
    };
    if how.len() < 24 {
        return None;
    }
    let flags = i64::from_ne_bytes(how[0..8].try_into().ok()?) as i32;
    let mode = u64::from_ne_bytes(how[8..16].try_into().ok()?) as u32;
    open(regs, at, flags, mode)
}

/// open, creat, openat (and openat2, decoded by [`openat2`]).
pub fn open(regs: Regs, at: PathAt, flags: i32, mode: u32) -> Option<i64> {
    let follow =
        flags & libc::O_NOFOLLOW == 0 && flags & (libc::O_CREAT | libc::O_EXCL) != libc::O_CREAT | libc::O_EXCL;
    // An O_CREAT open of a name the cache does not know first tries to
    // create it, without a LOOKUP; when that fails (the name may exist), it
    // takes the usual way.
    let create = flags & (libc::O_CREAT | libc::O_PATH) == libc::O_CREAT;
    let (mut vfs, t) = ours!(resolve::lookup(
        regs,
        at,
        WalkFlags {
            attrs_only: false,
            follow,
            create
        }
    ));
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
        let (v, t) = ours!(resolve::lookup_follow(regs, at, follow));
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
/// links it there, see `paths::link`); elsewhere (the trait has no TMPFILE) a
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
        let fd = fs::openat(libc::AT_FDCWD, &dir, flags, mode);
        return Tmpfile::Kernel(fd);
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!(".sftmp.{}.{}", process::getpid(), NEXT.fetch_add(1, Ordering::Relaxed));
    let walk = WalkFlags {
        attrs_only: false,
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
    let memfd = fs::memfd_create(c"shortfuse-placeholder", libc::MFD_CLOEXEC);
    let flags = libc::O_PATH | libc::O_CLOEXEC;
    let made = if memfd >= 0 {
        let link = with_nul(format!("/proc/self/fd/{memfd}").into_bytes());
        let p = fs::openat(libc::AT_FDCWD, &link, flags, 0);
        fs::close(memfd as i32);
        p
    } else {
        fs::openat(libc::AT_FDCWD, c"/dev/null".to_bytes_with_nul(), flags, 0)
    };
    if made < 0 {
        return made;
    }
    let high = fs::fcntl_int(made as i32, libc::F_DUPFD_CLOEXEC, OWN_FD_FLOOR);
    let fd = if high >= 0 {
        fs::close(made as i32);
        high
    } else {
        made
    };
    match SOURCE.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => fd,
        Err(other) => {
            fs::close(fd as i32);
            other
        }
    }
}
