//! A mount's namespace map in the client (see `shortfuse::namespace`): the
//! backing directory its tree is an image of, and the directories the
//! client resolved beneath it.
//!
//! A path call beneath such a mount goes to the kernel as one `*at` call
//! on the directory that holds the last name. That directory is found by
//! `openat2(RESOLVE_BENEATH)` from the backing root and kept (an `O_PATH`
//! descriptor per directory path, [`NAMED_DIRS`] at most) for the entry
//! timeout, as the kernel keeps a FUSE mount's names: a directory renamed
//! or removed by another process is seen after it, one renamed by this
//! process at once (the shim calls [`Namespace::forget_dirs`] for every
//! call that can move a directory or change who may search it). The
//! directories are kept for one set of credentials, since the kernel
//! checked search permission on the way to them for those alone.

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shortfuse::cache::page::FxHasher;
use shortfuse::{Errno, NamespaceMap};

use crate::Caller;

/// Directories a mount keeps descriptors of at most.
pub const NAMED_DIRS: usize = 64;

/// A mount's namespace map as the client uses it.
pub struct Namespace {
    map: NamespaceMap,
    /// How long a resolved directory is trusted (the entry timeout).
    valid_for: Duration,
    /// Over the rings: the only fsuid the map serves (the daemon's user);
    /// other callers go to the daemon, which decides for them. `None` in
    /// process.
    only_uid: Option<u32>,
    dirs: Mutex<Dirs>,
}

/// A kept directory and when it was found.
type Kept = (Arc<OwnedFd>, Instant);

/// Kept directories by path. Looked up on every path call beneath the
/// map, with keys of the program's own making and at most [`NAMED_DIRS`]
/// of them: FxHash, a few cycles a word, in place of SipHash, which
/// resists flooding that a table this small cannot suffer.
type ByPath = HashMap<Box<[u8]>, Kept, BuildHasherDefault<FxHasher>>;

#[derive(Default)]
struct Dirs {
    /// Whose search permissions the kept directories were reached with.
    caller: Option<Arc<Caller>>,
    /// By their path below the root.
    by_path: ByPath,
    /// By their path below the current directory: a table apart, so that
    /// a lookup takes the program's path as it is, with no key to build.
    from_cwd: ByPath,
}

/// Which of a mount's tables a directory is kept in.
#[derive(Clone, Copy)]
enum Below {
    Root,
    Cwd,
}

impl Dirs {
    fn table(&mut self, below: Below) -> &mut ByPath {
        match below {
            Below::Root => &mut self.by_path,
            Below::Cwd => &mut self.from_cwd,
        }
    }

    fn len(&self) -> usize {
        self.by_path.len() + self.from_cwd.len()
    }

    /// Makes room for one more: the oldest goes (a linear scan of small
    /// tables).
    fn make_room(&mut self) {
        let oldest = |t: &ByPath| t.iter().map(|(k, (_, at))| (*at, k.clone())).min();
        let old = match (oldest(&self.by_path), oldest(&self.from_cwd)) {
            (Some(a), Some(b)) if b < a => Some((Below::Cwd, b.1)),
            (Some(a), _) => Some((Below::Root, a.1)),
            (None, Some(b)) => Some((Below::Cwd, b.1)),
            (None, None) => None,
        };
        if let Some((below, key)) = old {
            self.table(below).remove(&key);
        }
    }
}

impl Namespace {
    pub fn new(map: NamespaceMap, valid_for: Duration, only_uid: Option<u32>) -> Namespace {
        Namespace {
            map,
            valid_for,
            only_uid,
            dirs: Mutex::new(Dirs::default()),
        }
    }

    /// The backing directory (the mount's root).
    pub fn root(&self) -> &Arc<OwnedFd> {
        &self.map.root
    }

    /// The `openat2` resolve flags that keep a walk beneath the root and
    /// within what the file system serves.
    pub fn resolve(&self) -> u64 {
        let mut r = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        if self.map.no_xdev {
            r |= libc::RESOLVE_NO_XDEV;
        }
        r
    }

    /// Whether the map came from a shared daemon (whose notifications the
    /// client must take in before it trusts kept directories).
    pub fn shared(&self) -> bool {
        self.only_uid.is_some()
    }

    /// Whether calls of `caller` may use the map.
    pub fn serves(&self, caller: &Caller) -> bool {
        self.only_uid.is_none_or(|u| u == caller.uid)
    }

    fn lock(&self) -> MutexGuard<'_, Dirs> {
        self.dirs.lock().unpoison()
    }

    /// The directory at `path` (relative to the root, no `.` or `..`
    /// components) as `caller` reaches it: a kept one while valid, else
    /// `open` finds it (and it is kept).
    pub fn dir(
        &self,
        path: &[u8],
        caller: &Arc<Caller>,
        open: impl FnOnce() -> Result<OwnedFd, Errno>,
    ) -> Result<Arc<OwnedFd>, Errno> {
        self.kept(Below::Root, path, caller, open)
    }

    /// The directory at `path` relative to the process's current directory,
    /// a kernel one beneath the root (a shim's current directory entered
    /// beneath the map), as `caller` reaches it: kept as [`Namespace::dir`]
    /// keeps those below the root, apart from them, until the current
    /// directory changes ([`Namespace::forget_cwd_dirs`]). Relative paths
    /// of a program that works in a directory of the mount (`grep -r`, a
    /// compiler's `dir/file.c`, git's lstat of every tracked file) then
    /// cost one `*at` call each, as those from the root do.
    pub fn dir_from_cwd(
        &self,
        path: &[u8],
        caller: &Arc<Caller>,
        open: impl FnOnce() -> Result<OwnedFd, Errno>,
    ) -> Result<Arc<OwnedFd>, Errno> {
        self.kept(Below::Cwd, path, caller, open)
    }

    fn kept(
        &self,
        below: Below,
        path: &[u8],
        caller: &Arc<Caller>,
        open: impl FnOnce() -> Result<OwnedFd, Errno>,
    ) -> Result<Arc<OwnedFd>, Errno> {
        let now = Instant::now();
        {
            let mut d = self.lock();
            let same = d
                .caller
                .as_ref()
                .is_some_and(|c| Arc::ptr_eq(c, caller) || **c == **caller);
            if !same {
                d.by_path.clear();
                d.from_cwd.clear();
                d.caller = Some(caller.clone());
            }
            if let Some((fd, at)) = d.table(below).get(path) {
                if now.duration_since(*at) < self.valid_for {
                    return Ok(fd.clone());
                }
            }
        }
        let fd = Arc::new(open()?);
        if self.valid_for.is_zero() {
            return Ok(fd);
        }
        let mut d = self.lock();
        if d.caller.as_deref() == Some(&**caller) {
            if d.len() >= NAMED_DIRS && !d.table(below).contains_key(path) {
                d.make_room();
            }
            d.table(below).insert(path.into(), (fd.clone(), now));
        }
        Ok(fd)
    }

    /// Drops the directories kept relative to the current directory (see
    /// [`Namespace::dir_from_cwd`]): it changed.
    pub fn forget_cwd_dirs(&self) {
        self.lock().from_cwd.clear();
    }

    /// Drops every kept directory: something may have moved one, or
    /// changed who may search it.
    pub fn forget_dirs(&self) {
        let mut d = self.lock();
        d.by_path.clear();
        d.from_cwd.clear();
    }

    /// Whether `fd` is the number of a kept directory.
    pub fn holds(&self, fd: std::os::fd::RawFd) -> bool {
        use std::os::fd::AsRawFd;
        let d = self.lock();
        d.by_path
            .values()
            .chain(d.from_cwd.values())
            .any(|(d, _)| d.as_raw_fd() == fd)
    }

    /// How many directories are kept now.
    pub fn kept_dirs(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> Result<OwnedFd, Errno> {
        Ok(OwnedFd::from(std::fs::File::open("/").map_err(Errno::from)?))
    }

    fn ns(valid_for: Duration) -> Namespace {
        let map = NamespaceMap {
            root: Arc::new(dir().unwrap()),
            no_xdev: false,
        };
        Namespace::new(map, valid_for, None)
    }

    fn caller(uid: u32) -> Arc<Caller> {
        Arc::new(Caller {
            uid,
            gid: uid,
            groups: Vec::new(),
        })
    }

    #[test]
    fn directories_are_kept_for_one_caller_until_forgotten() {
        let n = ns(Duration::from_secs(60));
        let root = caller(0);
        let opens = std::cell::Cell::new(0);
        let open = || {
            opens.set(opens.get() + 1);
            dir()
        };
        let a = n.dir(b"a/b", &root, open).unwrap();
        let again = n.dir(b"a/b", &root, open).unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!(opens.get(), 1);
        // Another caller's search permissions were never checked on the way.
        n.dir(b"a/b", &caller(65534), open).unwrap();
        assert_eq!(opens.get(), 2);
        n.forget_dirs();
        assert_eq!(n.kept_dirs(), 0);
        n.dir(b"a/b", &caller(65534), open).unwrap();
        assert_eq!(opens.get(), 3);
        // Those below the current directory are apart, and go with it.
        let from_cwd = n.dir_from_cwd(b"a/b", &root, open).unwrap();
        assert!(!Arc::ptr_eq(&a, &from_cwd));
        n.dir_from_cwd(b"a/b", &root, open).unwrap();
        assert_eq!(opens.get(), 4);
        n.dir(b"c", &root, open).unwrap();
        n.forget_cwd_dirs();
        assert_eq!(n.kept_dirs(), 1);
        // Errors are not kept.
        assert_eq!(n.dir(b"x", &root, || Err(Errno::ENOENT)).unwrap_err(), Errno::ENOENT);
    }

    #[test]
    fn kept_directories_expire_and_are_bounded() {
        let n = ns(Duration::ZERO);
        n.dir(b"a", &caller(0), dir).unwrap();
        assert_eq!(n.kept_dirs(), 0);
        let n = ns(Duration::from_secs(60));
        for i in 0..NAMED_DIRS + 10 {
            n.dir(format!("d{i}").as_bytes(), &caller(0), dir).unwrap();
        }
        assert_eq!(n.kept_dirs(), NAMED_DIRS);
    }
}
