//! Where a path argument leads: a mount's node, or the kernel (with the
//! path rewritten when a walk left a mount), and the descriptors of ours.
#![allow(unsafe_code)] // the program's memory, through `user`

use shortfuse::sync::Unpoison;
use std::sync::Arc;

use shortfuse::Errno;
use shortfuse_vfs::{OpenFile, Target, Vfs, Walk, WalkFlags};

use super::reply::err;
use super::spare;
use super::table::{Fd, PathAt, Regs};
use crate::state;
use crate::sys::fs;
use crate::user;

/// Where a path leads.
pub enum Resolved {
    /// Not ours: the kernel takes the call; `Some` is an absolute path to use
    /// instead of the original (a walk left a mount).
    Kernel(Option<Vec<u8>>),
    Ours(Arc<Vfs>, Target),
}

/// Finds the mount an absolute path enters: the remainder after the mount
/// point (a suffix of `abs`). `..` before the mount point is taken
/// lexically.
pub fn mount_of(abs: &[u8]) -> Option<(Arc<Vfs>, &[u8])> {
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

pub fn with_nul(mut p: Vec<u8>) -> Vec<u8> {
    p.push(0);
    p
}

/// Resolves `path` relative to `dirfd` (or the current directory).
pub fn resolve(dirfd: i32, path: &[u8], follow: bool) -> Result<Resolved, Errno> {
    resolve_for(
        dirfd,
        path,
        WalkFlags {
            attrs_only: false,
            follow,
            create: false,
        },
    )
}

/// [`resolve`], with the walk's every flag.
pub fn resolve_for(dirfd: i32, path: &[u8], flags: WalkFlags) -> Result<Resolved, Errno> {
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
        return if dirfd != libc::AT_FDCWD && st.fds.contains(dirfd) {
            Err(Errno::ENOENT)
        } else {
            Ok(Resolved::Kernel(None))
        };
    }
    if path.starts_with(b"/") {
        abs = path.into();
    } else if dirfd == libc::AT_FDCWD {
        if let Some((vfs, loc)) = super::cwd_location() {
            first = Some(walk(&vfs, &loc, path, 0).map(|w| (vfs, w))?);
            abs = Default::default();
        } else {
            let mut host = st.host_cwd.lock().unpoison().clone();
            host.push(b'/');
            host.extend_from_slice(path);
            abs = host.into();
        }
    } else if let Some(f) = st.fds.get(dirfd) {
        let loc = location_of(dirfd, &f).ok_or(Errno::ENOTDIR)?;
        first = Some(walk(f.vfs(), &loc, path, 0).map(|w| (f.vfs().clone(), w))?);
        abs = Default::default();
    } else {
        // A kernel directory descriptor: only its path tells whether the
        // walk enters a mount. (Not the spare's path: it is closed.)
        spare::flush();
        let link = with_nul(format!("/proc/self/fd/{dirfd}").into_bytes());
        let mut buf = [0u8; 4096];
        let n = fs::readlink(&link, &mut buf);
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
pub fn magic_link(path: &[u8]) -> Option<i32> {
    let n = [&b"/proc/self/fd/"[..], b"/proc/thread-self/fd/", b"/dev/fd/"]
        .iter()
        .find_map(|p| path.strip_prefix(*p))?;
    if n.is_empty() || n.len() > 10 || !n.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(n).ok()?.parse().ok()
}

/// The type of the file `fd` (a descriptor of `f`) is open on: a file
/// opened beneath a namespace map learns it from the kernel the first time
/// it is asked (see `OpenFile::kind_known`).
pub fn kind_of(fd: i32, f: &OpenFile) -> shortfuse::FileType {
    if !f.kind_known() {
        let mut k: libc::stat = crate::user::zeroed();
        if fs::fstat(fd, &mut k) == 0 {
            f.learn_kind(k.st_mode);
        }
    }
    f.file_type()
}

/// The directory descriptor `fd` of ours names, for a walk from it and
/// fchdir. One the kernel opened beneath a namespace map is where the
/// kernel finds it now, below the source (the program may have moved it
/// since it opened it): `None` when it is no directory of the mount.
pub fn location_of(fd: i32, f: &OpenFile) -> Option<shortfuse_vfs::Location> {
    if !f.beneath_map() || kind_of(fd, f) != shortfuse::FileType::Directory {
        return f.location().cloned();
    }
    let rel = below_source(f.vfs(), fd)?;
    let rel = &rel[..];
    let flags = WalkFlags {
        attrs_only: false,
        follow: false,
        create: false,
    };
    match f.vfs().walk(&shortfuse_vfs::Location::root(), rel, flags, 0).ok()? {
        Walk::Inside(t) => t.location(),
        Walk::Outside { .. } => None,
    }
}

/// Where the kernel finds the backing file or directory of descriptor
/// `fd` now, as a path below `vfs`'s source (empty for the source itself):
/// `None` when it is not below it (moved out of it, or no map's).
pub fn below_source(vfs: &Vfs, fd: i32) -> Option<Vec<u8>> {
    let src = vfs.source()?;
    let src = src.strip_suffix(b"/").unwrap_or(src);
    let link = with_nul(format!("/proc/self/fd/{fd}").into_bytes());
    let mut buf = [0u8; 4096];
    let n = fs::readlink(&link, &mut buf);
    let rest = buf[..n.max(0) as usize].strip_prefix(src)?;
    if !rest.is_empty() && !rest.starts_with(b"/") {
        return None;
    }
    Some(rest.strip_prefix(b"/").unwrap_or(rest).to_vec())
}

/// What a descriptor of ours names, as a walk would have found it.
pub fn target_of(f: &OpenFile) -> Result<Target, Errno> {
    if f.beneath_map() {
        // No node: what its path names now.
        return f.walk_path();
    }
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

/// Re-issues a path call on the kernel with `path` (absolute,
/// NUL-terminated) in place of its path argument `at`.
#[allow(unsafe_code)]
pub fn reissue(regs: Regs, at: PathAt, path: &[u8]) -> i64 {
    let r = regs.with_path(at, path);
    spare::before_kernel(r.nr);
    // SAFETY: the program's call, with a NUL-terminated path of ours (alive across the call) in
    // place of its path argument; the rest as it gave them.
    unsafe { crate::sys::raw6(r.nr, r.a) }
}

/// The mount node a path argument names, or how the call ends: `Err(None)`
/// sends it to the kernel unchanged, `Err(Some(r))` returns `r` (an error,
/// or the call re-issued with a path a walk found outside the mounts).
pub fn lookup(regs: Regs, at: PathAt, flags: WalkFlags) -> Result<(Arc<Vfs>, Target), Option<i64>> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = unsafe { user::cstr(at.path.0) }.map_err(|e| Some(err(e)))?;
    match resolve_for(at.dirfd, path, flags) {
        Err(e) => Err(Some(err(e))),
        Ok(Resolved::Kernel(None)) => Err(None),
        Ok(Resolved::Kernel(Some(p))) => Err(Some(reissue(regs, at, &p))),
        Ok(Resolved::Ours(vfs, t)) => Ok((vfs, t)),
    }
}

/// [`lookup`] with only `follow` to say.
pub fn lookup_follow(regs: Regs, at: PathAt, follow: bool) -> Result<(Arc<Vfs>, Target), Option<i64>> {
    lookup(
        regs,
        at,
        WalkFlags {
            attrs_only: false,
            follow,
            create: false,
        },
    )
}

/// [`lookup_follow`] for a call that only reads the attributes of what
/// it finds (stat, statx): names other programs of a shared daemon looked
/// up may come from its table (see [`WalkFlags::attrs_only`]).
pub fn lookup_attrs(regs: Regs, at: PathAt, follow: bool) -> Result<(Arc<Vfs>, Target), Option<i64>> {
    lookup(
        regs,
        at,
        WalkFlags {
            attrs_only: true,
            follow,
            create: false,
        },
    )
}

/// Returns from a handler what [`lookup`] says when the path is not ours.
macro_rules! ours {
    ($e:expr) => {
        match $e {
            Ok(x) => x,
            Err(r) => return r,
        }
    };
}
pub(crate) use ours;

/// The open file of ours a descriptor argument stands for.
pub fn file(fd: Fd) -> Option<Arc<OpenFile>> {
    state().fds.get(fd.0)
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
}
