//! Path calls served by the kernel beneath a mount's backing directory,
//! for mounts whose file system declared a namespace map (see
//! `shortfuse::namespace`; passthrough does).
//!
//! stat, lstat, fstatat, statx, access, faccessat, readlink, open, openat,
//! creat, unlink, unlinkat, rmdir, mkdir, mkdirat and the renames of a path
//! beneath such a mount (and the calls of [`changes`]: links, symbolic
//! links, mknod, truncate, utimensat, chmod, chown, extended attributes)
//! become one `*at` call on the directory that holds
//! the last name, with the program's own credentials (so the kernel checks
//! every permission), presented as the file system presents them (the
//! mount's device number, the backing inode's attributes and number). The
//! directory is the backing root for a name at the top, else one found by
//! `openat2(RESOLVE_BENEATH)` and kept for the entry timeout
//! ([`shortfuse_vfs::Namespace`]). The file system sees none of it.
//!
//! An open hands the program the kernel's descriptor of the backing file
//! or directory, recorded in the descriptor table as the mount's
//! (`Vfs::open_beneath_map`): the kernel serves it like the kernel-backed
//! descriptors of data maps (see `calls::kernel`; a directory's listing
//! too), and what needs the mount's view (fstat, /proc/self/fd, fchdir)
//! takes the mount's device number and the path it was opened by. A path
//! relative to such a directory starts at the program's descriptor itself. A call that creates, removes or renames a
//! name drops what this image's name cache held of it, since the file
//! system never hears of the change.
//!
//! Whatever the kernel cannot decide beneath the backing directory the
//! same way the walk would goes the usual way (`None`): a symbolic link to
//! follow as the last name, a directory path that leaves the backing
//! directory through a symbolic link (`EXDEV` from `RESOLVE_BENEATH`), `.`
//! or `..` components, the mount's root itself, a mount inside the mount,
//! a relative path from a kernel descriptor; and O_PATH and O_TMPFILE
//! opens, whose descriptors the shim answers for with a location in the
//! mount.
#![allow(unsafe_code)]

mod changes;

use shortfuse::sync::Unpoison;
use std::borrow::Cow;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use shortfuse::{Attr, Errno};
use shortfuse_vfs::{Namespace, Vfs};

use crate::calls::table::{Call, PathAt, XattrOn, XattrOp};
use crate::calls::{mount_of, nested, to_stat, to_statx, Here};
use crate::state;
use crate::sys::raw;
use crate::user;

const AT_FDCWD: i64 = libc::AT_FDCWD as i64;

/// Calls that can move a directory or change who may search one: every
/// kept directory is forgotten before they run, wherever their path leads.
fn moves_or_guards_directories(c: &Call) -> bool {
    match *c {
        Call::Rename { .. } | Call::Chmod { .. } | Call::Chown { .. } => true,
        // Not of a descriptor that cannot be a directory's: `tar xf` sets
        // the owner and mode of every file it writes, which forgot every
        // kept directory, so that the next file's directory was opened
        // again (an openat2, its descriptor moved above the program's
        // numbers, closed: five calls more per file).
        Call::Fchmod { fd, .. } | Call::Fchown { fd, .. } => !never_a_directory(fd.0),
        Call::Xattr {
            op: XattrOp::Set { .. } | XattrOp::Remove { .. },
            ..
        } => true,
        // rmdir, and unlinkat of a directory.
        Call::Unlink { flags, .. } => flags & libc::AT_REMOVEDIR != 0,
        _ => false,
    }
}

/// Whether the program's descriptor `fd` is of a file of a mount that is
/// no directory: its type is known, or it was opened for writing or made
/// by its open (a directory's open says EISDIR to both; an `O_PATH` open
/// ignores the access mode).
fn never_a_directory(fd: i32) -> bool {
    let Some(f) = state().fds.get(fd) else {
        return false;
    };
    let flags = f.flags();
    (f.kind_known() && f.file_type() != shortfuse::FileType::Directory)
        || (flags & libc::O_PATH == 0 && (flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_CREAT != 0))
}

/// A call that would close or replace descriptor numbers, among them
/// perhaps a kept directory's (a program that closes every descriptor, a
/// `dup2` onto a high number): the directories are forgotten (closed)
/// before it runs, so that no number of the program's is taken for one.
fn takes_numbers(c: &Call, st: &crate::State) -> bool {
    let fd = match *c {
        Call::CloseRange { .. } => return true,
        Call::Close { fd } | Call::Dup3 { new: fd, .. } => fd.0,
        _ => return false,
    };
    fd >= crate::calls::OWN_FD_FLOOR as i32 && st.mounts.iter().any(|m| m.namespace().is_some_and(|ns| ns.holds(fd)))
}

/// Forgets every mount's kept directories.
fn forget_all_dirs(st: &crate::State) {
    for m in &st.mounts {
        if let Some(ns) = m.namespace() {
            ns.forget_dirs();
        }
    }
}

/// Serves call `c` through a namespace map, or `None` for the usual way.
pub fn call(c: &Call) -> Option<i64> {
    let st = state();
    if moves_or_guards_directories(c) || takes_numbers(c, st) {
        forget_all_dirs(st);
        // Renames and removals beneath a map are the kernel's too; the
        // directories they may move are forgotten again once they ran.
        let r = match *c {
            Call::Rename { old, new, flags } => rename(old, new, flags),
            Call::Unlink { at, flags } if flags == libc::AT_REMOVEDIR => one(at, Op::Unlink(flags)),
            Call::Chmod { at, mode, flags } => changes::chmod(at, mode, flags),
            Call::Chown { at, uid, gid, flags } => changes::chown(at, uid, gid, flags),
            Call::Xattr {
                on: XattrOn::Path { at, follow },
                op,
            } => changes::xattr(at, follow, op),
            _ => return None,
        };
        if r.is_some() {
            forget_all_dirs(st);
        }
        return r;
    }
    let mut statx_flags = 0;
    // (where the path is, follow the last name, what to do)
    let (at, follow, op) = match *c {
        Call::Stat { at, out, flags } => {
            if flags.0 & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT) != 0 {
                return None;
            }
            (at, flags.follow(), Op::Stat(out.0))
        }
        Call::Statx { at, flags, out } => {
            statx_flags = flags.0;
            let known = libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT | libc::AT_STATX_SYNC_TYPE;
            if flags.0 & !known != 0 {
                return None;
            }
            (at, flags.follow(), Op::Statx(out.0))
        }
        Call::Access { at, mode, flags } => {
            if flags.0 & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_EACCESS) != 0 {
                return None;
            }
            (at, flags.follow(), Op::Access(mode, flags.0 & libc::AT_EACCESS))
        }
        Call::Readlink { at, buf, len } => (at, false, Op::Readlink(buf.0, i64::from(len))),
        Call::Open { at, flags, mode } => return one(at, Op::Open(flags, mode)),
        Call::Chdir { at } => return chdir(at),
        // (With AT_REMOVEDIR it was taken above.)
        Call::Unlink { at, flags: 0 } => return one(at, Op::Unlink(0)),
        Call::Mkdir { at, mode } => return one(at, Op::Mkdir(mode)),
        Call::Link { old, new, flags } => return changes::link(old, new, flags),
        Call::Symlink { target, at } => return changes::symlink(target, at),
        Call::Mknod { at, mode, dev } => return changes::mknod(at, mode, dev),
        Call::Truncate { at, len } => return changes::truncate(at, len),
        Call::Utimensat { at, times, flags } => return changes::utimens(at, times, flags),
        Call::Xattr {
            on: XattrOn::Path { at, follow },
            op,
        } => return changes::xattr(at, follow, op),
        _ => return None,
    };
    let (dirfd, path) = (i64::from(at.dirfd), at.path.0);
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = unsafe { user::cstr(path) }.ok()?;
    // The kernel's links to descriptors are the usual way's to answer.
    if matches!(op, Op::Readlink(..)) && (path.starts_with(b"/proc/") || path.starts_with(b"/dev/fd/")) {
        return None;
    }
    // The link itself, by the program's O_PATH descriptor of it: the
    // kernel's descriptor of the backing link.
    if let (&Op::Readlink(buf, len), b"") = (&op, path) {
        let f = state().fds.get(dirfd as i32)?;
        if !f.beneath_map() {
            return None;
        }
        // SAFETY: an empty name of ours, and the program's own buffer and
        // size handed on: the kernel checks and fills it.
        return Some(unsafe { raw(libc::SYS_readlinkat, dirfd, c"".as_ptr() as i64, buf, len, 0, 0) });
    }
    // `.` too (a shell checks its $PWD against it at start-up), though
    // not the mount's root, whose attributes are the file system's.
    let (vfs, rel, from) = beneath(dirfd, path, true)?;
    if rel.is_empty() {
        return None;
    }
    let ns = vfs.namespace_current()?;
    if let Op::Access(mode, _) = op {
        if mode & libc::W_OK != 0 && vfs.is_read_only() {
            return None;
        }
    }
    let caller = crate::creds::current();
    if !ns.serves(&caller) {
        return None;
    }
    let place = match Place::of(ns, &caller, &rel, from) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let (dirfd, cname) = (place.dirfd(), place.name());
    let lstat = || -> Result<libc::stat, Errno> {
        let mut k: libc::stat = user::zeroed();
        let nofollow = i64::from(libc::AT_SYMLINK_NOFOLLOW);
        // SAFETY: a NUL-terminated name of ours and a stat struct of ours.
        let r = unsafe {
            raw(
                libc::SYS_newfstatat,
                dirfd,
                cname,
                &mut k as *mut libc::stat as i64,
                nofollow,
                0,
                0,
            )
        };
        if r < 0 {
            return Err(Errno::from_raw(-r as i32));
        }
        Ok(k)
    };
    let is_link = |k: &libc::stat| k.st_mode & libc::S_IFMT == libc::S_IFLNK;
    let dev = vfs.dev();
    // What a last name that is a symbolic link leads to (see `Place::follow`).
    let followed = || place.followed(ns, &rel);
    let empty = c"".as_ptr() as i64;
    let at_empty = i64::from(libc::AT_EMPTY_PATH);
    Some(match op {
        // The kernel fills the program's struct (and says EFAULT for a bad
        // one); then it is made what the file system would have reported.
        Op::Stat(out) => {
            let nofollow = i64::from(libc::AT_SYMLINK_NOFOLLOW);
            // SAFETY: a NUL-terminated name of ours, and the program's own
            // output struct handed on: the kernel checks and fills it as it
            // would have.
            let mut r = unsafe { raw(libc::SYS_newfstatat, dirfd, cname, out, nofollow, 0, 0) };
            if r < 0 {
                return Some(r);
            }
            let mut link = false;
            user::amend::<libc::stat>(out, |s| link = follow && is_link(s));
            if link {
                let fd = match followed() {
                    Ok(fd) => fd,
                    Err(r) => return r,
                };
                let fd = i64::from(fd.as_raw_fd());
                // SAFETY: our descriptor and an empty name of ours, and the
                // program's output struct, which the kernel filled above.
                r = unsafe { raw(libc::SYS_newfstatat, fd, empty, out, at_empty, 0, 0) };
                if r < 0 {
                    return Some(r);
                }
            }
            user::amend::<libc::stat>(out, |s| *s = to_stat(&Attr::from_stat(s), dev));
            0
        }
        Op::Statx(out) => {
            let flags = i64::from(libc::AT_SYMLINK_NOFOLLOW | (statx_flags & libc::AT_STATX_SYNC_TYPE));
            let mask = i64::from(libc::STATX_BASIC_STATS);
            // SAFETY: as for stat above.
            let mut r = unsafe { raw(libc::SYS_statx, dirfd, cname, flags, mask, out, 0) };
            if r < 0 {
                return Some(r);
            }
            let mut link = false;
            user::amend::<libc::statx>(out, |s| {
                link = follow && u32::from(s.stx_mode) & libc::S_IFMT == libc::S_IFLNK;
            });
            if link {
                let fd = match followed() {
                    Ok(fd) => fd,
                    Err(r) => return r,
                };
                let fd = i64::from(fd.as_raw_fd());
                let flags = flags | at_empty;
                // SAFETY: as for stat above.
                r = unsafe { raw(libc::SYS_statx, fd, empty, flags, mask, out, 0) };
                if r < 0 {
                    return Some(r);
                }
            }
            user::amend::<libc::statx>(out, |s| *s = to_statx(&Attr::from_statx(s), dev));
            0
        }
        Op::Access(mode, eaccess) => match lstat() {
            Ok(k) if follow && is_link(&k) => match followed() {
                // SAFETY: our descriptor and an empty name of ours; no other memory.
                Ok(fd) => match unsafe {
                    raw(
                        libc::SYS_faccessat2,
                        i64::from(fd.as_raw_fd()),
                        empty,
                        i64::from(mode),
                        i64::from(eaccess) | at_empty,
                        0,
                        0,
                    )
                } {
                    // A kernel without AT_EMPTY_PATH for faccessat2.
                    r if r == err(Errno::EINVAL) => return None,
                    r => r,
                },
                Err(r) => return r,
            },
            // SAFETY: a NUL-terminated name of ours; no other memory.
            Ok(_) => unsafe {
                raw(
                    libc::SYS_faccessat2,
                    dirfd,
                    cname,
                    i64::from(mode),
                    i64::from(eaccess | libc::AT_SYMLINK_NOFOLLOW),
                    0,
                    0,
                )
            },
            Err(e) => err(e),
        },
        // The kernel writes the program's buffer itself.
        // SAFETY: a NUL-terminated name of ours, and the program's own
        // buffer and size handed on: the kernel checks and fills it as it
        // would have.
        Op::Readlink(buf, len) => unsafe { raw(libc::SYS_readlinkat, dirfd, cname, buf, len, 0, 0) },
        Op::Open(..) | Op::Unlink(_) | Op::Mkdir(_) => return None,
    })
}

/// Where a name beneath a map is, for one `*at` call: the directory that
/// holds it (the backing root, or a kept directory) and the name,
/// NUL-terminated.
struct Place {
    held: Option<Arc<OwnedFd>>,
    /// The directory a path with `..` starts at, kept while it is used.
    _start: Option<Arc<OwnedFd>>,
    /// The backing root, or the program's descriptor the path starts at.
    root: i64,
    /// Where in the path below the mount's root the path from `root` starts.
    skip: usize,
    name: [u8; 256],
}

impl Place {
    /// The place of `rel` (see [`beneath`]) as `caller` reaches it from
    /// `from`; `Err` holds the answer when the kernel decided the walk to
    /// its directory (`Some`), or `None` for the usual way.
    fn of(ns: &Namespace, caller: &Arc<shortfuse_vfs::Caller>, rel: &[u8], from: From) -> Result<Place, Option<i64>> {
        let (base, skip, start) = match from {
            From::Root => (None, 0, None),
            From::Dir(fd, at, start) => (Some(fd), at, start),
        };
        let sub = rel.get(skip..).unwrap_or_default();
        let (dir, name) = match sub.iter().rposition(|&b| b == b'/') {
            Some(i) => (&sub[..i], &sub[i + 1..]),
            None => (&sub[..0], sub),
        };
        let root = i64::from(ns.root().as_raw_fd());
        let held = if dir.is_empty() {
            None
        } else {
            // From the program's own directory descriptor the kernel
            // follows the directory wherever it moved: nothing to keep.
            // From the current directory (the kernel's, entered beneath
            // the map), what is found is kept until it changes: a program
            // at work in a directory of the mount opens `sub/file` after
            // `sub/file` (grep, a compiler).
            let found = match base {
                Some(AT_FDCWD) => ns.dir_from_cwd(dir, caller, || open_dir(ns, AT_FDCWD, dir)),
                Some(fd) => open_dir(ns, fd, dir).map(Arc::new),
                None => ns.dir(dir, caller, || open_dir(ns, root, dir)),
            };
            match found {
                Ok(fd) => Some(fd),
                // Decided beneath the backing directory as the walk decides.
                Err(e @ (Errno::ENOENT | Errno::ENOTDIR | Errno::EACCES | Errno::ENAMETOOLONG)) => {
                    return Err(Some(err(e)))
                }
                // A symbolic link out of it, a mount point, anything else.
                Err(_) => return Err(None),
            }
        };
        // The directory the path starts at itself (see `beneath`).
        let name = if name.is_empty() { &b"."[..] } else { name };
        let mut cname = [0u8; 256];
        if name.len() >= cname.len() {
            return Err(Some(err(Errno::ENAMETOOLONG)));
        }
        cname[..name.len()].copy_from_slice(name);
        Ok(Place {
            held,
            _start: start,
            root: base.unwrap_or(root),
            skip,
            name: cname,
        })
    }

    /// The kernel's open of `rel` (the path below the mount's root this
    /// place was found for) as a whole from where it starts, following
    /// symbolic links as long as they stay beneath it, the last name's
    /// too: such a link leads where it leads through the mount, the map
    /// being a 1-to-1 image (an O_CREAT open makes the file a dangling
    /// link names, with `mode`). `ours`: a descriptor above the program's
    /// numbers, else the lowest free one, the program's. `Err` holds the
    /// answer when the kernel decided it (`Some`), or `None` for the usual
    /// way: a link out of it (absolute, or `..` above where the path
    /// starts), through a mount inside, or too many of them.
    fn follow(&self, ns: &Namespace, rel: &[u8], flags: i32, mode: u32, ours: bool) -> Result<i64, Option<i64>> {
        let sub = rel.get(self.skip..).unwrap_or_default();
        let sub = if sub.is_empty() { &b"."[..] } else { sub };
        let mut c = Vec::with_capacity(sub.len() + 1);
        c.extend_from_slice(sub);
        c.push(0);
        // (openat2 refuses a mode without O_CREAT or O_TMPFILE.)
        let makes = flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE;
        let mode = if makes { u64::from(mode & 0o7777) } else { 0 };
        let how: [u64; 3] = [u64::from(flags as u32), mode, ns.resolve()];
        let args = [
            self.root,
            c.as_ptr() as i64,
            how.as_ptr() as i64,
            std::mem::size_of_val(&how) as i64,
            0,
            0,
        ];
        let fd = if ours {
            // SAFETY: our own openat2 of a NUL-terminated path of ours with
            // an open_how of ours, its size given.
            unsafe { nested(libc::SYS_openat2, args) }
        } else {
            // SAFETY: as above; the descriptor is the program's.
            unsafe { raw(libc::SYS_openat2, args[0], args[1], args[2], args[3], 0, 0) }
        };
        if fd >= 0 {
            return Ok(fd);
        }
        Err(match Errno::from_raw(-fd as i32) {
            Errno::EXDEV | Errno::ELOOP | Errno::EINVAL | Errno::EAGAIN => None,
            _ => Some(fd),
        })
    }

    /// What the last name, a symbolic link, leads to beneath the map, as
    /// an `O_PATH` descriptor of ours (see [`Place::follow`]).
    fn followed(&self, ns: &Namespace, rel: &[u8]) -> Result<OwnedFd, Option<i64>> {
        let fd = self.follow(ns, rel, libc::O_PATH | libc::O_CLOEXEC, 0, true)?;
        Ok(OwnedFd::from(crate::sys::owned_file(fd)))
    }

    fn dirfd(&self) -> i64 {
        self.held.as_ref().map_or(self.root, |d| i64::from(d.as_raw_fd()))
    }

    /// The name's address, for a system call.
    fn name(&self) -> i64 {
        self.name.as_ptr() as i64
    }
}

/// The mount `path` (from `dirfd`) leads into beneath a map this caller may
/// use, with the path below its root and the caller's credentials; `None`
/// for the usual way (for a call that `writes`, a read-only mount too: it
/// says EROFS itself). With `dir_only` (the call wants a directory whatever
/// the path says), trailing slashes are dropped first: `opendir("sub/")`,
/// as git and others spell it, names the directory `sub` does.
fn mapped(at: PathAt, whole: bool, writes: bool, dir_only: bool) -> Option<Mapped> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = unsafe { user::cstr(at.path.0) }.ok()?;
    let path = if dir_only { without_trailing_slashes(path) } else { path };
    let (vfs, rel, from) = beneath(i64::from(at.dirfd), path, whole)?;
    let ns = vfs.namespace_current()?;
    if writes && vfs.is_read_only() {
        return None;
    }
    let caller = crate::creds::current();
    if !ns.serves(&caller) {
        return None;
    }
    let rel = rel.into_owned();
    Some((vfs, rel, from, caller))
}

/// What [`mapped`] finds: the mount, the path below its root, where the
/// kernel starts it, and the caller.
type Mapped = (Arc<Vfs>, Vec<u8>, From, Arc<shortfuse_vfs::Caller>);

/// open, creat, unlink, rmdir and mkdir of a name beneath a map: one `*at`
/// call on the directory holding it. The names the call may have changed
/// leave this image's cache, which the file system does not hear of.
fn one(at: PathAt, op: Op) -> Option<i64> {
    // (O_TMPFILE holds O_DIRECTORY's bit.)
    let tmpfile = matches!(op, Op::Open(flags, _) if flags & libc::O_TMPFILE == libc::O_TMPFILE);
    if let Op::Open(flags, mode) = op {
        if let Some(r) = reopen(at, flags, mode) {
            return Some(r);
        }
        // An access mode of 3 is the usual way's to refuse (O_PATH
        // ignores it).
        if flags & libc::O_ACCMODE == libc::O_ACCMODE && flags & libc::O_PATH == 0 {
            return None;
        }
    }
    // Only a read-only open may name where the path starts (`.`, the
    // root): a directory, which it changes nothing of; and O_TMPFILE,
    // which names the directory its unnamed file is made in.
    let whole = tmpfile
        || matches!(op, Op::Open(flags, _)
        if flags & libc::O_PATH != 0 || flags & (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC) == libc::O_RDONLY);
    // A trailing slash asks for a directory, which O_DIRECTORY asks for
    // already; without O_DIRECTORY it would also follow a symbolic link
    // as the last name, which this open leaves to the walk.
    let dir_only = !tmpfile
        && matches!(op, Op::Open(flags, _) if flags & (libc::O_DIRECTORY | libc::O_CREAT) == libc::O_DIRECTORY);
    let (vfs, rel, from, caller) = mapped(at, whole, true, dir_only)?;
    // Whether the program's path itself ended in `/` (dropped above): only
    // then may a symbolic link as the last name be followed despite
    // O_NOFOLLOW. An O_DIRECTORY|O_NOFOLLOW open of a plain name that is
    // a file (rsync opens every file so first, to tell it from a
    // directory) is the kernel's ENOTDIR, as natively, with no walk.
    // SAFETY: as in `mapped`: the program's path, read during the call.
    let slash = dir_only && unsafe { user::cstr(at.path.0) }.is_ok_and(|p| p.ends_with(b"/"));
    if let Op::Open(flags, _) = op {
        // An O_PATH open of a path this image's cache holds whole (over
        // the rings the daemon's notifications keep entries long) is the
        // usual way's: a walk of the cache and a spare placeholder, no
        // request and no system call, where the kernel's takes an
        // openat2, an fstat and a close. A path with a symbolic link is
        // never answered from the cache, so links out of the tree stay
        // the walk's, and a link's own descriptor the kernel's.
        if flags & libc::O_PATH != 0 && matches!(from, From::Root) && vfs.walks_from_cache(&rel) {
            return None;
        }
    }
    let ns = vfs.namespace()?;
    let place = match Place::of(ns, &caller, &rel, from) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let (dirfd, cname) = (place.dirfd(), place.name());
    let r = match op {
        Op::Open(flags, mode) if tmpfile => return unnamed(&vfs, ns, &place, &rel, flags, mode),
        Op::Open(flags, mode) => return open(&vfs, ns, &place, &rel, flags, mode, slash),
        // SAFETY: a NUL-terminated name of ours; no other memory.
        Op::Unlink(flags) => unsafe { raw(libc::SYS_unlinkat, dirfd, cname, i64::from(flags), 0, 0, 0) },
        // SAFETY: as above.
        Op::Mkdir(mode) => unsafe { raw(libc::SYS_mkdirat, dirfd, cname, i64::from(mode), 0, 0, 0) },
        _ => return None,
    };
    if r == 0 {
        vfs.drop_cached_path(&rel);
    }
    Some(r)
}

/// An open of `/proc/self/fd/N` (or `/dev/fd/N`) where N is a descriptor
/// the kernel opened beneath a map: the kernel's magic link leads to the
/// backing file itself, so the kernel opens it as the program asked,
/// checking the program's credentials. A new open of the file is recorded
/// as the mount's by the same path; an O_PATH|O_NOFOLLOW one is of /proc's
/// link itself (glibc's fchmodat with AT_SYMLINK_NOFOLLOW opens it so), as
/// natively. `None`: no such path.
fn reopen(at: PathAt, flags: i32, mode: u32) -> Option<i64> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    let path = unsafe { user::cstr(at.path.0) }.ok()?;
    let f = state().fds.get(crate::calls::magic_link(path)?)?;
    if !f.beneath_map() {
        return None;
    }
    // The kernel picks the number: it must be the lowest free one.
    crate::calls::spare::flush();
    let (dirfd, flags64, mode) = (i64::from(at.dirfd), i64::from(flags), i64::from(mode));
    // SAFETY: the program's own path argument, handed on as it gave it.
    let fd = unsafe { raw(libc::SYS_openat, dirfd, at.path.0, flags64, mode, 0, 0) };
    if fd < 0 {
        return Some(fd);
    }
    let mut k: libc::stat = user::zeroed();
    if crate::sys::fs::fstat(fd as i32, &mut k) == 0 && k.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Some(fd);
    }
    Some(opened(f.vfs(), fd, flags, f.path().to_vec()))
}

/// The open of a name beneath a map: the program gets the kernel's
/// descriptor of the backing file, recorded as the mount's (see
/// `shortfuse_vfs::Vfs::open_beneath_map`); an `O_PATH` open too (of a
/// symbolic link itself with `O_NOFOLLOW`), whose descriptor the kernel
/// answers for as it would for the mount's.
/// `slash`: the program's path ended in `/`, which follows a symbolic link
/// as the last name even with O_NOFOLLOW.
fn open(vfs: &Arc<Vfs>, ns: &Namespace, place: &Place, rel: &[u8], flags: i32, mode: u32, slash: bool) -> Option<i64> {
    // The last name is first opened without following it (RESOLVE_NO_SYMLINKS
    // rather than O_NOFOLLOW, which F_GETFL would show): most names are
    // none, and a symbolic link is followed whole below.
    let nofollow = flags & libc::O_NOFOLLOW != 0 && !slash;
    let creates = flags & libc::O_CREAT != 0;
    let how: [u64; 3] = [
        u64::from(flags as u32),
        if creates { u64::from(mode & 0o7777) } else { 0 },
        ns.resolve() | libc::RESOLVE_NO_SYMLINKS,
    ];
    // The kernel picks the number: it must be the lowest free one.
    crate::calls::spare::flush();
    // SAFETY: an open_how of ours, its size given, and a NUL-terminated
    // name of ours.
    let fd = unsafe {
        raw(
            libc::SYS_openat2,
            place.dirfd(),
            place.name(),
            how.as_ptr() as i64,
            std::mem::size_of_val(&how) as i64,
            0,
            0,
        )
    };
    if creates {
        // Made, or perhaps made: what the cache said of the name is stale.
        vfs.drop_cached_path(rel);
    }
    if fd < 0 {
        return match Errno::from_raw(-fd as i32) {
            // A symbolic link to follow, where it stays beneath the map
            // (with O_CREAT it makes the file a dangling one names).
            Errno::ELOOP if !nofollow => followed(vfs, ns, place, rel, flags, mode),
            // With a trailing slash and O_NOFOLLOW the kernel says ENOTDIR
            // of a symbolic link, which the slash would have followed: the
            // walk tells a link from a file.
            Errno::ENOTDIR if slash && flags & libc::O_NOFOLLOW != 0 => None,
            Errno::EXDEV | Errno::EINVAL => None,
            _ => Some(fd),
        };
    }
    // A directory too (only a read-only open without O_CREAT gets one):
    // its listing is the kernel's (the map's promise: the same names, the
    // same inode numbers), and so are the `*at` calls from it (see
    // [`beneath`]); what needs its place in the mount (fchdir, `..`) finds
    // it by its path when asked (`OpenFile::location`).
    Some(opened(vfs, fd, flags, in_mount(rel)))
}

/// The program's open of a path whose last name is a symbolic link: the
/// kernel follows it beneath the map (see [`Place::follow`]), and the
/// descriptor is recorded by the path the target has in the mount, as
/// the mount's /proc/self/fd shows it.
fn followed(vfs: &Arc<Vfs>, ns: &Namespace, place: &Place, rel: &[u8], flags: i32, mode: u32) -> Option<i64> {
    let (fd, target) = match opened_whole(vfs, ns, place, rel, flags, mode) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if flags & libc::O_CREAT != 0 {
        // Made, or perhaps made, where the link leads: what the cache
        // said of that name is stale too.
        vfs.drop_cached_path(&target);
    }
    Some(opened(vfs, fd, flags, in_mount(&target)))
}

/// An O_TMPFILE open in a directory beneath the map: the kernel makes the
/// unnamed file in the backing directory (following links as long as they
/// stay beneath it), and the descriptor is recorded as the mount's, by the
/// name the kernel shows for it below the directory (`#inode`), so that
/// fstat and /proc/self/fd show the mount's; linkat gives it a name in the
/// mount (see `changes::link`).
fn unnamed(vfs: &Arc<Vfs>, ns: &Namespace, place: &Place, rel: &[u8], flags: i32, mode: u32) -> Option<i64> {
    // An unnamed file is for writing, as open(2) says before it looks at
    // the path (openat2's EINVAL would send it the usual way).
    if flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Some(err(Errno::EINVAL));
    }
    // The kernel picks the number: it must be the lowest free one.
    crate::calls::spare::flush();
    let (fd, name) = match opened_whole(vfs, ns, place, rel, flags, mode) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let name = name.strip_suffix(b" (deleted)").unwrap_or(&name);
    Some(opened(vfs, fd, flags & !libc::O_TMPFILE, in_mount(name)))
}

/// The program's descriptor of `rel` opened whole by the kernel (see
/// [`Place::follow`]), and where the kernel found it below the source.
/// `Err` as for [`Place::follow`]; `Err(None)` too when it is not below
/// the source now (moved out of it meanwhile: the walk's).
fn opened_whole(
    vfs: &Vfs,
    ns: &Namespace,
    place: &Place,
    rel: &[u8],
    flags: i32,
    mode: u32,
) -> Result<(i64, Vec<u8>), Option<i64>> {
    let fd = place.follow(ns, rel, flags, mode, false)?;
    match crate::calls::below_source(vfs, fd as i32) {
        Some(below) => Ok((fd, below)),
        None => {
            // SAFETY: the descriptor the kernel just gave, not yet the program's.
            unsafe { raw(libc::SYS_close, fd, 0, 0, 0, 0, 0) };
            Err(None)
        }
    }
}

/// The path in the mount (starting with '/') of `rel`, below its root.
fn in_mount(rel: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(rel.len() + 1);
    path.push(b'/');
    path.extend_from_slice(rel);
    path
}

/// Records the kernel's descriptor `fd` of the backing file at `path` (in
/// the mount) as the mount's, and gives it to the program.
fn opened(vfs: &Arc<Vfs>, fd: i64, flags: i32, path: Vec<u8>) -> i64 {
    // The kernel opened a directory if asked for one; otherwise the type
    // is learnt when a call needs it (most opens read a file and close it).
    let kind = (flags & libc::O_DIRECTORY != 0).then_some(shortfuse::FileType::Directory);
    let f = vfs.open_beneath_map(kind, flags, path);
    state().fds.insert(fd as i32, f, flags & libc::O_CLOEXEC != 0);
    fd
}

/// chdir to a directory beneath a map: the kernel enters the backing
/// directory (checking search permission as it would), and the current
/// directory becomes a mapped one (see `Here::Mapped`), as fchdir to a
/// descriptor opened beneath the map makes it. The file system is asked
/// nothing: a shell's `cd` before each command of a build costs no lookup,
/// no permission request and no node to forget, and the images it starts
/// there take the directory up without asking either (see
/// `calls::inherited_mapped`).
fn chdir(at: PathAt) -> Option<i64> {
    let (vfs, rel, from, caller) = mapped(at, true, false, true)?;
    let ns = vfs.namespace()?;
    let place = match Place::of(ns, &caller, &rel, from) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    let fd = match place.follow(ns, &rel, flags, 0, true) {
        Ok(fd) => OwnedFd::from(crate::sys::owned_file(fd)),
        Err(r) => return r,
    };
    // Where the kernel found it (a symbolic link beneath the map leads
    // elsewhere in it), as getcwd will say.
    let below = crate::calls::below_source(&vfs, fd.as_raw_fd())?;
    let r = crate::sys::fs::fchdir(fd.as_raw_fd());
    if r == 0 {
        crate::calls::entered_mapped(vfs, in_mount(&below));
    }
    Some(r)
}

/// rename, renameat and renameat2 of two names beneath one map: one
/// renameat2 between the directories holding them.
fn rename(old: PathAt, new: PathAt, flags: u32) -> Option<i64> {
    let (vfs, from, start, caller) = mapped(old, false, true, false)?;
    let (other, to, end, _) = mapped(new, false, true, false)?;
    if !Arc::ptr_eq(&vfs, &other) {
        return None;
    }
    let ns = vfs.namespace()?;
    let (a, b) = match (Place::of(ns, &caller, &from, start), Place::of(ns, &caller, &to, end)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    // SAFETY: two NUL-terminated names of ours; no other memory.
    let r = unsafe {
        raw(
            libc::SYS_renameat2,
            a.dirfd(),
            a.name(),
            b.dirfd(),
            b.name(),
            i64::from(flags),
            0,
        )
    };
    if r == 0 {
        vfs.drop_cached_path(&from);
        vfs.drop_cached_path(&to);
    }
    Some(r)
}

enum Op {
    /// stat/lstat/fstatat into a `struct stat` at this address.
    Stat(i64),
    /// statx into a `struct statx` at this address.
    Statx(i64),
    /// access(mode) with `AT_EACCESS` or 0.
    Access(i32, i32),
    /// readlink into (buffer, length).
    Readlink(i64, i64),
    /// open with (flags, mode).
    Open(i32, u32),
    /// unlinkat with these flags (0 or AT_REMOVEDIR).
    Unlink(i32),
    /// mkdir with this mode.
    Mkdir(u32),
}

fn err(e: Errno) -> i64 {
    -(e.raw() as i64)
}

/// Where a path beneath a map starts.
enum From {
    /// The backing directory (the path below the mount's root).
    Root,
    /// A directory the kernel opened beneath the map for the program (or
    /// one above it, for a path that starts with `..`): its descriptor,
    /// where in the path below the mount's root the path from it starts,
    /// and the descriptor when it is ours.
    Dir(i64, usize, Option<Arc<OwnedFd>>),
}

/// The mount `path` (from `dirfd`) leads into, the path below its root and
/// where the kernel starts it, when that mount has a namespace map and the
/// path is one the kernel can follow beneath the backing directory: no
/// `.`, `..` or empty components, not the root itself, no other mount
/// inside. With `whole`, the path may also name the directory it starts at
/// (`.`, the mount point; the path below the root is then empty for the
/// root).
fn beneath(dirfd: i64, path: &[u8], whole: bool) -> Option<(Arc<Vfs>, Cow<'_, [u8]>, From)> {
    let st = state();
    let dirfd = dirfd as i32 as i64;
    if path.is_empty() {
        return None;
    }
    // A relative path starts at a directory: `./` before it changes nothing.
    let mut path = path;
    if !path.starts_with(b"/") {
        while let Some(p) = path.strip_prefix(b"./") {
            path = p;
        }
        if path == b"." {
            path = b"";
        }
        if path.is_empty() && !whole {
            return None;
        }
    }
    let mut from = From::Root;
    let (vfs, rel): (Arc<Vfs>, Cow<'_, [u8]>) = if path.starts_with(b"/") {
        let (vfs, rest) = mount_of(path)?;
        vfs.namespace()?;
        (vfs, Cow::Borrowed(rest.strip_prefix(b"/").unwrap_or(rest)))
    } else if dirfd == AT_FDCWD {
        // (Both halves shared: no copy of the current directory's path.)
        let cwd = st.cwd.lock().unpoison().clone();
        match cwd {
            // Entered by fchdir of the program's descriptor: the
            // kernel's current directory is the backing directory
            // itself, and the path starts there.
            Some((vfs, Here::Mapped(at))) => {
                let (start, f) = from_kernel_dir(vfs.namespace()?, AT_FDCWD, &at, &mut path, whole)?;
                from = f;
                let rel = below_root(&at[..start], path);
                (vfs, Cow::Owned(rel))
            }
            Some((vfs, here)) => {
                vfs.namespace()?;
                let rel = below_root(&here.path(), path);
                (vfs, Cow::Owned(rel))
            }
            None => {
                let host = st.host_cwd.lock().unpoison();
                let mut abs = host.clone();
                drop(host);
                abs.push(b'/');
                abs.extend_from_slice(path);
                let (vfs, rest) = mount_of(&abs)?;
                vfs.namespace()?;
                let rest = rest.strip_prefix(b"/").unwrap_or(rest).to_vec();
                return plain(&rest).then_some((vfs, Cow::Owned(rest), From::Root));
            }
        }
    } else {
        let f = st.fds.get(dirfd as i32)?;
        f.vfs().namespace()?;
        let rel = if f.beneath_map() {
            // The program's descriptor is the kernel's, of the backing
            // directory: the path starts there (a file's: the walk
            // says ENOTDIR).
            if crate::calls::kind_of(dirfd as i32, &f) != shortfuse::FileType::Directory {
                return None;
            }
            let (start, f2) = from_kernel_dir(f.vfs().namespace()?, dirfd, f.path(), &mut path, whole)?;
            from = f2;
            below_root(&f.path()[..start], path)
        } else {
            below_root(&f.location()?.path(), path)
        };
        (f.vfs().clone(), Cow::Owned(rel))
    };
    if !(plain(&rel) || whole && rel.is_empty()) {
        return None;
    }
    // A mount inside this one takes its paths: the walk knows where.
    let mp = vfs.mountpoint();
    let inner = st.mounts.iter().any(|m| {
        let p = m.mountpoint();
        p.len() > mp.len() && p.starts_with(mp) && (mp == b"/" || p[mp.len()] == b'/')
    });
    (!inner).then_some((vfs, rel, from))
}

/// Where a path relative to `dirfd`, a kernel descriptor of a directory
/// beneath the map (the program's, or its current directory, `AT_FDCWD`)
/// at `at` below the mount's root, starts: how long the part of `at` is
/// that names the directory it starts at (its path below the root), and
/// how the kernel reaches it. Leading `..` components (fts climbs back up
/// so) are taken off `path` and lead to the directory above, when it is
/// the one the path names.
fn from_kernel_dir(ns: &Namespace, dirfd: i64, at: &[u8], path: &mut &[u8], whole: bool) -> Option<(usize, From)> {
    let mut up = 0;
    while *path == b".." || path.starts_with(b"../") {
        *path = path.get(3..).unwrap_or_default();
        up += 1;
    }
    if path.is_empty() && !whole {
        return None;
    }
    let mut start = at;
    for _ in 0..up {
        // Above the root: out of the mount, the walk's.
        let cut = start.iter().rposition(|&b| b == b'/').filter(|_| start != b"/")?;
        start = &start[..cut.max(1)];
    }
    let skip = if start == b"/" { 0 } else { start.len() };
    let from = if up == 0 {
        From::Dir(dirfd, skip, None)
    } else {
        let (fd, own) = above(ns, dirfd, start, up)?;
        From::Dir(fd, skip, own)
    };
    Some((start.len(), from))
}

/// The path below the mount's root of `path`, relative to the directory at
/// `start` (below the root, starting with '/'), made in one allocation.
fn below_root(start: &[u8], path: &[u8]) -> Vec<u8> {
    let start = start.strip_prefix(b"/").unwrap_or(start);
    let mut rel = Vec::with_capacity(start.len() + 1 + path.len());
    rel.extend_from_slice(start);
    if !start.is_empty() && !path.is_empty() {
        rel.push(b'/');
    }
    rel.extend_from_slice(path);
    rel
}

/// The directory `up` levels above the program's directory `dirfd`, when
/// it is the one `start` (its path below the mount's root) names beneath
/// the backing directory: the program's directory may have moved since it
/// was opened, even out of the source, and `..` is the kernel's. Its
/// descriptor, and the descriptor again when it is ours to close.
fn above(ns: &Namespace, dirfd: i64, start: &[u8], up: usize) -> Option<(i64, Option<Arc<OwnedFd>>)> {
    let mut dots = Vec::with_capacity(3 * up);
    for i in 0..up {
        if i > 0 {
            dots.push(b'/');
        }
        dots.extend_from_slice(b"..");
    }
    dots.push(0);
    let mut real: libc::stat = user::zeroed();
    let nofollow = i64::from(libc::AT_SYMLINK_NOFOLLOW);
    // SAFETY: a NUL-terminated path of ours and a stat struct of ours.
    let r = unsafe {
        raw(
            libc::SYS_newfstatat,
            dirfd,
            dots.as_ptr() as i64,
            &mut real as *mut libc::stat as i64,
            nofollow,
            0,
            0,
        )
    };
    if r < 0 {
        return None;
    }
    let rel = start.strip_prefix(b"/").unwrap_or(start);
    let (fd, own) = if rel.is_empty() {
        (i64::from(ns.root().as_raw_fd()), None)
    } else {
        let o = Arc::new(open_dir(ns, i64::from(ns.root().as_raw_fd()), rel).ok()?);
        (i64::from(o.as_raw_fd()), Some(o))
    };
    let mut named: libc::stat = user::zeroed();
    let same =
        crate::sys::fs::fstat(fd as i32, &mut named) == 0 && named.st_dev == real.st_dev && named.st_ino == real.st_ino;
    same.then_some((fd, own))
}

/// `path` without its trailing slashes, unless it is made of slashes alone
/// (the root stays the root).
fn without_trailing_slashes(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b != b'/') {
        Some(last) => &path[..=last],
        None => path,
    }
}

/// A relative path of names alone: no empty, `.` or `..` component (so no
/// leading, doubled or trailing slash).
fn plain(rel: &[u8]) -> bool {
    !rel.is_empty()
        && rel
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// `openat2(base, dir, O_PATH | O_DIRECTORY, RESOLVE_BENEATH ...)`, the
/// descriptor kept above the program's numbers.
fn open_dir(ns: &Namespace, base: i64, dir: &[u8]) -> Result<OwnedFd, Errno> {
    let mut c = Vec::with_capacity(dir.len() + 1);
    c.extend_from_slice(dir);
    c.push(0);
    // struct open_how: flags, mode, resolve.
    let how: [u64; 3] = [
        (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        0,
        ns.resolve(),
    ];
    // SAFETY: our own openat2 of a NUL-terminated path of ours with an
    // open_how of ours, its size given.
    let fd = unsafe {
        nested(
            libc::SYS_openat2,
            [
                base,
                c.as_ptr() as i64,
                how.as_ptr() as i64,
                std::mem::size_of_val(&how) as i64,
                0,
                0,
            ],
        )
    };
    if fd < 0 {
        return Err(Errno::from_raw(-fd as i32));
    }
    Ok(OwnedFd::from(crate::sys::owned_file(fd)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_slashes_go_but_the_root_stays() {
        assert_eq!(without_trailing_slashes(b"d000/"), b"d000");
        assert_eq!(without_trailing_slashes(b"a/b//"), b"a/b");
        assert_eq!(without_trailing_slashes(b"a/b"), b"a/b");
        assert_eq!(without_trailing_slashes(b"./"), b".");
        assert_eq!(without_trailing_slashes(b"/"), b"/");
        assert_eq!(without_trailing_slashes(b"//"), b"//");
    }

    #[test]
    fn only_names_are_plain() {
        for ok in [&b"a"[..], b"a/b", b".hidden/x", b"a/..b", b"a/b.c"] {
            assert!(plain(ok), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [&b""[..], b"/a", b"a/", b"a//b", b"./a", b"a/.", b"a/../b", b".."] {
            assert!(!plain(bad), "{}", String::from_utf8_lossy(bad));
        }
    }
}
