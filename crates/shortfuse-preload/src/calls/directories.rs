//! The current directory (chdir, fchdir, getcwd: ours when it is inside a
//! mount, with the kernel's kept somewhere safe) and directory listings.
#![allow(unsafe_code)] // the program's memory, through `user`

use shortfuse::sync::Unpoison;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use shortfuse::Errno;
use shortfuse_vfs::{Location, Vfs};

use super::exec;
use super::reply::{err, res};
use super::resolve::{file, resolve, with_nul, Resolved};
use super::table::{Fd, Ptr};
use super::unserved;
use crate::state;
use crate::sys::{fs, process};
use crate::user;

pub fn getdents(fd: Fd, buf: Ptr, len: usize) -> Option<i64> {
    let f = file(fd)?;
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    Some(res(unsafe { user::slice_mut(buf.0, len) }
        .and_then(|b| f.getdents64(b))
        .map(|n| n as i64)))
}

/// Where the current directory is, inside a mount.
#[derive(Clone, Debug)]
pub(crate) enum Here {
    /// Where a walk found it; its nodes are pinned while it is current.
    Walked(Location),
    /// A directory the kernel opened beneath the mount's namespace map,
    /// entered by fchdir of its descriptor: its path below the mount's
    /// root then (`/` for the root). The kernel's own current directory is
    /// that backing directory, so entering it asked the file system
    /// nothing; a call that needs its place in the mount walks to it then
    /// ([`cwd_location`]), and most never do (paths beneath the map are
    /// the kernel's, and so is getcwd).
    /// Shared, so that a relative path's call takes the current directory
    /// with no copy.
    Mapped(Arc<[u8]>),
}

impl Here {
    /// The path below the mount's root, starting with '/'.
    pub fn path(&self) -> Vec<u8> {
        match self {
            Here::Walked(loc) => loc.path(),
            Here::Mapped(p) => p.to_vec(),
        }
    }

    /// The path on the host (the mount point's and below it).
    pub fn host_path(&self, vfs: &Vfs) -> Vec<u8> {
        match self {
            Here::Walked(loc) => vfs.host_path(loc),
            Here::Mapped(p) => host_path_of(vfs, p),
        }
    }
}

/// The host path of `rel`, a path below the mount's root starting with '/'.
fn host_path_of(vfs: &Vfs, rel: &[u8]) -> Vec<u8> {
    let mp = vfs.mountpoint();
    if rel == b"/" {
        return mp.to_vec();
    }
    let mut p = if mp == b"/" { Vec::new() } else { mp.to_vec() };
    p.extend_from_slice(rel);
    p
}

/// The current directory inside a mount as a walk finds it (for a walk
/// from it): a [`Here::Mapped`] one is walked to now, and kept so.
pub(crate) fn cwd_location() -> Option<(Arc<Vfs>, Location)> {
    let (vfs, here) = state().cwd.lock().unpoison().clone()?;
    let path = match here {
        Here::Walked(loc) => return Some((vfs, loc)),
        Here::Mapped(p) => p,
    };
    let flags = shortfuse_vfs::WalkFlags {
        attrs_only: false,
        follow: false,
        create: false,
    };
    let rel = path.strip_prefix(b"/").unwrap_or(&path);
    let loc = match vfs.walk(&Location::root(), rel, flags, 0).ok()? {
        shortfuse_vfs::Walk::Inside(t) => t.location()?,
        shortfuse_vfs::Walk::Outside { .. } => return None,
    };
    vfs.pin_location(&loc);
    let mut cwd = state().cwd.lock().unpoison();
    match &*cwd {
        Some((v, Here::Mapped(p))) if Arc::ptr_eq(v, &vfs) && *p == path => {
            *cwd = Some((vfs.clone(), Here::Walked(loc.clone())));
        }
        // Changed meanwhile: this walk's location is not kept.
        _ => vfs.unpin_location(&loc),
    }
    Some((vfs, loc))
}

pub fn fchdir(fd: Fd) -> Option<i64> {
    let Some(f) = file(fd) else {
        let r = fs::fchdir(fd.0);
        if r == 0 {
            follow_kernel_cwd();
        }
        return Some(r);
    };
    if f.beneath_map() && super::kind_of(fd.0, &f) == shortfuse::FileType::Directory {
        // The program's descriptor is the kernel's, of the backing
        // directory: the kernel enters it (and checks search permission
        // as it would have), and no walk finds it in the mount.
        let Some(rel) = super::below_source(f.vfs(), fd.0) else {
            return Some(err(Errno::ENOTDIR));
        };
        let r = fs::fchdir(fd.0);
        if r < 0 {
            return Some(r);
        }
        let mut path = Vec::with_capacity(rel.len() + 1);
        path.push(b'/');
        path.extend_from_slice(&rel);
        set_cwd(Some((f.vfs().clone(), Here::Mapped(path.into()))));
        return Some(0);
    }
    let Some(loc) = super::resolve::location_of(fd.0, &f) else {
        return Some(err(Errno::ENOTDIR));
    };
    set_cwd(Some((f.vfs().clone(), Here::Walked(loc))));
    Some(0)
}

pub fn getcwd(buf: Ptr, len: usize) -> Option<i64> {
    let cwd = state().cwd.lock().unpoison().clone();
    let (vfs, here) = cwd?;
    let p = match here {
        Here::Walked(loc) => {
            // As the kernel: a removed current directory has no path.
            match vfs.getattr_fresh(loc.node(), None) {
                Ok(a) if a.nlink == 0 => return Some(err(Errno::ENOENT)),
                Err(e) => return Some(err(e)),
                Ok(_) => {}
            }
            vfs.host_path(&loc)
        }
        Here::Mapped(path) => match mapped_cwd(&vfs) {
            Ok(Some(rel)) => host_path_of(&vfs, &rel),
            // Moved out of the source: where it was entered.
            Ok(None) => host_path_of(&vfs, &path),
            Err(e) => return Some(err(e)),
        },
    };
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let buf = match unsafe { user::slice_mut(buf.0, len) } {
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

/// Where the kernel's current directory, the backing directory of a
/// [`Here::Mapped`] one, is below the mount's source now (the kernel's
/// getcwd follows renames, and says ENOENT once it is removed, as a
/// mount's getcwd does): `None` when it is not below it.
fn mapped_cwd(vfs: &Vfs) -> Result<Option<Vec<u8>>, Errno> {
    let Some(src) = vfs.source() else {
        return Ok(None);
    };
    let src = src.strip_suffix(b"/").unwrap_or(src);
    let mut buf = vec![0u8; 4096];
    let n = fs::getcwd(&mut buf);
    if n < 0 {
        return Err(Errno::from_raw(-n as i32));
    }
    buf.truncate((n as usize).saturating_sub(1));
    match buf.strip_prefix(src) {
        Some(b"") => Ok(Some(b"/".to_vec())),
        Some(rest) if rest.starts_with(b"/") => Ok(Some(rest.to_vec())),
        _ => Ok(None),
    }
}

/// The current directory a new image inherits at `rel` below the root of
/// `vfs` (empty for the root), found without asking the file system: the
/// image that exec'd left the kernel's current directory in that
/// directory beneath the mount's backing directory (see
/// [`kernel_cwd_inside`]), and exec kept it there. Where the mount has a
/// namespace map this caller may use and the kernel's current directory is
/// indeed that one, it is a [`Here::Mapped`] one, as fchdir to a
/// descriptor opened beneath the map makes: no lookup, no permission
/// check (the program is in the directory already, as natively after
/// exec) and no node to forget at exit. `None`: the usual walk.
pub(crate) fn inherited_mapped(vfs: &Vfs, rel: &[u8]) -> Option<Here> {
    if !vfs.namespace()?.serves(&crate::creds::current()) {
        return None;
    }
    let mut path = Vec::with_capacity(rel.len() + 1);
    path.push(b'/');
    path.extend_from_slice(rel);
    (mapped_cwd(vfs).ok()?? == path).then_some(Here::Mapped(path.into()))
}

/// Makes `path` (below the mount's root, starting with '/') in `vfs` the
/// current directory, the kernel's being its backing directory already
/// (see [`Here::Mapped`]).
pub(crate) fn entered_mapped(vfs: Arc<Vfs>, path: Vec<u8>) {
    set_cwd(Some((vfs, Here::Mapped(path.into()))));
}

fn set_cwd(new: Option<(Arc<Vfs>, Here)>) {
    let st = state();
    // The kernel's current directory changes (or may): what was found
    // from it leads elsewhere.
    for m in &st.mounts {
        if let Some(ns) = m.namespace() {
            ns.forget_cwd_dirs();
        }
    }
    if let Some((vfs, Here::Walked(loc))) = &new {
        vfs.pin_location(loc);
        kernel_cwd_inside(vfs, loc);
    }
    let old = std::mem::replace(&mut *st.cwd.lock().unpoison(), new);
    if let Some((vfs, Here::Walked(loc))) = old {
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
        if fs::chdir(&p) == 0 {
            return;
        }
    } else if unserved::kernel_mounted(vfs) {
        // A daemon's mount in the kernel: the very directory.
        let p = with_nul(vfs.host_path(loc));
        if fs::chdir(&p) == 0 {
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
    let pid = process::getpid() as u64;
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
        if fs::mkdir(&buf[..=len], 0o500) < 0 {
            // Nothing to stand in (no /tmp): take back what was made.
            for &e in ends[..level].iter().rev() {
                buf[e] = 0;
                fs::rmdir(&buf[..=e]);
            }
            return;
        }
    }
    fs::chdir(&buf[..=len]);
    for &e in ends.iter().rev() {
        buf[e] = 0;
        fs::rmdir(&buf[..=e]);
    }
}

/// The kernel's current directory changed: remember it, leave the mount's.
fn follow_kernel_cwd() {
    let mut buf = vec![0u8; 4096];
    let n = fs::getcwd(&mut buf);
    if n > 0 {
        buf.truncate(n as usize - 1);
        *state().host_cwd.lock().unpoison() = buf;
    }
    set_cwd(None);
}

/// chdir: ours, or the kernel's (then our idea of the cwd follows it).
pub fn chdir(path: Ptr) -> Option<i64> {
    Some(chdir_to(path))
}

fn chdir_to(arg: Ptr) -> i64 {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = match unsafe { user::cstr(arg.0) } {
        Ok(p) => p,
        Err(e) => return err(e),
    };
    let kernel = |p: Option<Vec<u8>>| {
        let r = fs::chdir(&p.unwrap_or_else(|| with_nul(path.to_vec())));
        if r == 0 {
            follow_kernel_cwd();
        }
        r
    };
    match resolve(libc::AT_FDCWD, path, true) {
        Err(e) => err(e),
        Ok(Resolved::Kernel(p)) => kernel(p),
        Ok(Resolved::Ours(vfs, t)) => res(vfs.chdir(&t).map(|loc| {
            set_cwd(Some((vfs.clone(), Here::Walked(loc))));
            0i64
        })),
    }
}
