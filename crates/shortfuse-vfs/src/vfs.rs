//! One mounted file system as a process sees it: the path walk over the
//! dentry cache and the operations on what a walk found.
//!
//! Paths are byte strings. A walk starts from a [`Location`] (the mount's
//! root for an absolute path below the mount point, the current directory
//! or a directory descriptor otherwise) and ends either inside the mount
//! ([`Walk::Inside`]) or with a host path the caller resolves itself
//! ([`Walk::Outside`]): `..` above the mount's root, or a symbolic link to an
//! absolute path outside the mount point. Symbolic links count towards
//! `MAXSYMLINKS` (40) across such hand-overs.

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

use shortfuse::{Attr, Errno, FileType, NodeId, SetAttr, Statfs};
use shortfuse_abi as abi;

use crate::backend::{Backend, Invalidation};
use crate::cache::{Cache, Cached, Forgets};
use crate::client::{Client, Creds, EntryOut, InitOut, Lookup};
use crate::maps::MapTable;
use crate::names::Namespace;
use crate::pages::PageCache;

/// Symbolic links followed in one resolution before `ELOOP` (the kernel's
/// `MAXSYMLINKS`).
pub const MAXSYMLINKS: u32 = 40;
/// Longest path accepted, NUL included (`PATH_MAX`).
pub const PATH_MAX: usize = 4096;

/// A directory inside the mount: the chain of (node, name) from the root
/// (the root itself is the empty chain). `..` pops the chain, as the
/// kernel's dentry tree does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location {
    chain: Vec<(NodeId, Box<[u8]>)>,
}

impl Location {
    pub fn root() -> Location {
        Location::default()
    }

    pub fn node(&self) -> NodeId {
        self.chain.last().map_or(NodeId::ROOT, |c| c.0)
    }

    pub fn is_root(&self) -> bool {
        self.chain.is_empty()
    }

    /// The path below the mount point, starting with '/' ("/" for the root).
    pub fn path(&self) -> Vec<u8> {
        if self.chain.is_empty() {
            return b"/".to_vec();
        }
        let mut p = Vec::new();
        for (_, name) in &self.chain {
            p.push(b'/');
            p.extend_from_slice(name);
        }
        p
    }

    fn push(&mut self, node: NodeId, name: &[u8]) {
        self.chain.push((node, Box::from(name)));
    }

    fn pop(&mut self) {
        self.chain.pop();
    }

    fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.chain.iter().map(|c| c.0)
    }
}

/// How the last component of a path is spelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Last {
    /// A plain name in `Target::dir`.
    Name(Box<[u8]>),
    /// The path ended at a directory without naming an entry in it: the
    /// mount's root, `.`, `..` or nothing (`"dir/"` stays a `Name`).
    Dir,
    /// `.` as the last component (rmdir gives EINVAL).
    Dot,
    /// `..` as the last component (rmdir gives ENOTEMPTY).
    DotDot,
}

/// What a walk found inside the mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The directory holding `last` (for `Last::Dir`/`Dot`/`DotDot`: the
    /// directory the path names).
    pub dir: Location,
    pub last: Last,
    /// The object named, when it exists (for `Last::Name` after following a
    /// final symlink if asked to).
    pub node: Option<(NodeId, Attr)>,
    /// The path ended in '/': the object must be a directory.
    pub trailing_slash: bool,
    /// Symbolic links followed so far.
    pub links: u32,
    /// `node` is None because nobody asked: the walk was told the name is
    /// about to be created ([`WalkFlags::create`]) and the cache did not
    /// know it. [`Vfs::open`] then creates it exclusively; if that fails,
    /// the caller walks again without the flag (the name may exist).
    pub unasked: bool,
}

impl Target {
    /// The location of the object, when it is a directory that exists.
    pub fn location(&self) -> Option<Location> {
        let (node, attr) = self.node?;
        if attr.file_type() != FileType::Directory {
            return None;
        }
        let mut loc = self.dir.clone();
        if let Last::Name(n) = &self.last {
            loc.push(node, n);
        }
        Some(loc)
    }

    /// Where the object is: its directory's node and its name (None for
    /// the root).
    pub fn place(&self) -> Option<(NodeId, &[u8])> {
        if let Last::Name(n) = &self.last {
            return Some((self.dir.node(), n));
        }
        let (last, up) = self.dir.chain.split_last()?;
        Some((up.last().map_or(NodeId::ROOT, |c| c.0), &last.1))
    }

    /// The path of the object below the mount point ("/" for the root).
    pub fn path(&self) -> Vec<u8> {
        let mut p = self.dir.path();
        if let Last::Name(n) = &self.last {
            if !p.ends_with(b"/") {
                p.push(b'/');
            }
            p.extend_from_slice(n);
        }
        p
    }

    /// The name in `dir`, or the error a name-space change gets without one.
    fn name(&self, not_a_name: Errno) -> Result<&[u8], Errno> {
        match &self.last {
            Last::Name(n) => Ok(n),
            _ => Err(not_a_name),
        }
    }

    /// The name a call is to make: EEXIST where the name is taken, and
    /// ENOENT for a trailing '/' unless the call makes a directory.
    fn new_name(&self, directory: bool) -> Result<&[u8], Errno> {
        let name = self.name(Errno::EEXIST)?;
        if self.node.is_some() {
            return Err(Errno::EEXIST);
        }
        if self.trailing_slash && !directory {
            return Err(Errno::ENOENT);
        }
        Ok(name)
    }
}

/// Where a walk ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Walk {
    Inside(Target),
    /// Resolve this absolute host path instead; `links` symbolic links have
    /// been followed already.
    Outside {
        path: Vec<u8>,
        links: u32,
    },
}

/// How to treat the last component.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkFlags {
    /// Follow a symbolic link in the last component (not for lstat,
    /// O_NOFOLLOW, O_CREAT|O_EXCL, unlink, rename, ...).
    pub follow: bool,
    /// The last component is about to be created (an O_CREAT open): a name
    /// the cache does not know is not looked up, so that a new file costs
    /// one request (CREATE), not two (LOOKUP, CREATE) as in the kernel.
    pub create: bool,
    /// The caller only reads the attributes of what the walk finds (stat,
    /// statx): names this process has not looked up may be found in the
    /// daemon's shared table ([`crate::Backend::shared_entry`]), whose
    /// nodes the walk never sends to the daemon. Where it would, the walk
    /// starts again without the table.
    pub attrs_only: bool,
}

/// Why a walk stopped short.
enum Stop {
    Failed(Errno),
    /// It would have sent a node found in the shared table.
    Asks,
}

impl From<Errno> for Stop {
    fn from(e: Errno) -> Stop {
        Stop::Failed(e)
    }
}

/// The nodes an attributes-only walk found in the shared table, with
/// their attributes: never to be sent to the daemon.
#[derive(Default)]
struct Borrowed(Vec<(NodeId, Attr)>);

impl Borrowed {
    fn attr(&self, node: NodeId) -> Option<Attr> {
        self.0.iter().find(|(n, _)| *n == node).map(|(_, a)| *a)
    }
}

/// Splits `p` at its first '/': (component, rest after the slashes).
fn split_first(p: &[u8]) -> (&[u8], &[u8]) {
    match p.iter().position(|&b| b == b'/') {
        Some(i) => {
            let rest = &p[i..];
            let skip = rest.iter().take_while(|&&b| b == b'/').count();
            (&p[..i], &rest[skip..])
        }
        None => (p, &[]),
    }
}

/// Joins `dir` (absolute) and `rest` into one absolute path.
fn join(dir: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if rest.is_empty() {
        return p;
    }
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(rest);
    p
}

/// The root's attributes before anyone asked for them: a placeholder the
/// cache never takes as valid.
fn unknown_root() -> Attr {
    let never = shortfuse::Timestamp { sec: 0, nsec: 0 };
    Attr {
        ino: NodeId::ROOT.0,
        size: 0,
        blocks: 0,
        atime: never,
        mtime: never,
        ctime: never,
        mode: libc::S_IFDIR | 0o755,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
    }
}

/// A mounted file system in this process.
pub struct Vfs {
    client: Client,
    /// Absolute, normalised, without a trailing slash.
    mountpoint: Vec<u8>,
    /// `st_dev` reported for every file of the mount.
    dev: u64,
    cache: Mutex<Cache>,
    umask: AtomicU32,
    /// `ro`: every call that would change the mount fails with EROFS.
    read_only: AtomicBool,
    /// The host directory the file system mirrors, when it mirrors one
    /// (passthrough): what a descriptor can be handed over to at exec.
    source: OnceLock<Vec<u8>>,
    /// The data maps of an in-process file system (see [`crate::maps`]).
    maps: OnceLock<Arc<MapTable>>,
    /// Per node, the anonymous kernel file whose locks stand for the
    /// node's (see `OpenFile::lock_fd`).
    pub(crate) lock_inodes: Mutex<HashMap<NodeId, Weak<std::fs::File>>>,
    /// The in-process page cache, when the mount has one.
    pages: OnceLock<PageCache>,
    /// The file system's namespace map, when it declared one and the
    /// transport may use it (see [`crate::names`]).
    names: OnceLock<Namespace>,
}

impl Vfs {
    /// Connects to the file system behind `backend` (FUSE_INIT, then a
    /// GETATTR of the root) and mounts it at `mountpoint`. A
    /// [`Backend::deferred`] one is asked nothing yet: INIT goes with the
    /// first request the process makes, and the root's attributes are
    /// fetched when first needed.
    pub fn new(backend: Box<dyn Backend>, mountpoint: &[u8], dev: u64, creds: Creds) -> Result<Vfs, Errno> {
        if !mountpoint.starts_with(b"/") {
            return Err(Errno::EINVAL);
        }
        let deferred = backend.deferred();
        let client = Client::new(backend, creds);
        let cache = if deferred {
            // Never valid: the first look at the root asks for it.
            Cache::new(unknown_root())
        } else {
            client.init()?;
            let (root, ttl) = client.getattr(NodeId::ROOT, None)?;
            if root.file_type() != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            let mut cache = Cache::new(root);
            cache.set_attr(NodeId::ROOT, root, ttl, Instant::now());
            cache
        };
        let mut mp = crate::normalize(mountpoint);
        if mp.len() > 1 && mp.ends_with(b"/") {
            mp.pop();
        }
        Ok(Vfs {
            client,
            mountpoint: mp,
            dev,
            cache: Mutex::new(cache),
            umask: AtomicU32::new(0o022),
            read_only: AtomicBool::new(false),
            source: OnceLock::new(),
            maps: OnceLock::new(),
            lock_inodes: Mutex::new(HashMap::new()),
            pages: OnceLock::new(),
            names: OnceLock::new(),
        })
    }

    /// The requests [`Vfs::new`] sends first (INIT, the root's GETATTR), byte
    /// for byte, for a backend that is `shared` or not and these `creds`: a
    /// transport can carry them ahead, with its own set-up (see
    /// [`crate::Ring::connect_with`]).
    pub fn opening_requests(shared: bool, creds: Creds) -> Vec<Vec<u8>> {
        /// Keeps what it is asked to send and answers nothing.
        struct Recorder {
            shared: bool,
            sent: Arc<Mutex<Vec<Vec<u8>>>>,
        }
        impl Backend for Recorder {
            fn call(&self, request: &[u8], _reply: &mut Vec<u8>) -> Result<(), Errno> {
                self.sent.lock().unpoison().push(request.to_vec());
                Err(Errno::ENOTCONN)
            }
            fn shared(&self) -> bool {
                self.shared
            }
        }
        let sent = Arc::new(Mutex::new(Vec::new()));
        let client = Client::new(
            Box::new(Recorder {
                shared,
                sent: sent.clone(),
            }),
            creds,
        );
        // As `new` asks them, each failing here.
        let _ = client.init();
        let _ = client.getattr(NodeId::ROOT, None);
        drop(client);
        let requests = std::mem::take(&mut *sent.lock().unpoison());
        requests
    }

    pub fn mountpoint(&self) -> &[u8] {
        &self.mountpoint
    }

    pub fn dev(&self) -> u64 {
        self.dev
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// What INIT agreed on (sent first, when the backend is deferred and
    /// no request was made yet; the defaults when that fails, and so will
    /// the request that needed them).
    pub fn init_out(&self) -> InitOut {
        self.client.init_out().unwrap_or_default()
    }

    pub fn set_umask(&self, umask: u32) {
        self.umask.store(umask & 0o777, Ordering::Relaxed);
    }

    pub fn umask(&self) -> u32 {
        self.umask.load(Ordering::Relaxed)
    }

    /// Makes the mount read-only (`-o ro`): calls that would change it fail
    /// with EROFS, after the checks the kernel makes first (ENOENT, EEXIST).
    pub fn set_read_only(&self, ro: bool) {
        self.read_only.store(ro, Ordering::Relaxed);
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Relaxed)
    }

    /// EROFS on a read-only mount.
    pub(crate) fn writable(&self) -> Result<(), Errno> {
        if self.is_read_only() {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

    /// Records the host directory this mount mirrors (once).
    pub fn set_source(&self, dir: &[u8]) {
        let _ = self.source.set(crate::normalize(dir));
    }

    /// Connects the data maps the file system returns (its
    /// [`crate::MapTap`]):
    /// opens then use them and the M-Cache. Only the first call counts.
    pub fn set_maps(&self, table: Arc<MapTable>) {
        let _ = self.maps.set(table);
    }

    pub fn maps(&self) -> Option<&Arc<MapTable>> {
        self.maps.get()
    }

    /// Gives the mount a page cache for the files it opens without a data
    /// map (only the first call counts).
    pub fn set_page_cache(&self, cache: PageCache) {
        let _ = self.pages.set(cache);
    }

    pub fn page_cache(&self) -> Option<&PageCache> {
        self.pages.get()
    }

    /// Lets path calls beneath the mount go to the kernel beneath the
    /// file system's backing directory (only the first call counts).
    pub fn set_namespace(&self, names: Namespace) {
        let _ = self.names.set(names);
    }

    pub fn namespace(&self) -> Option<&Namespace> {
        self.names.get()
    }

    /// [`Vfs::namespace`], after taking in what other clients of a shared
    /// daemon changed (which may forget kept directories). The cache lock
    /// is taken only when the daemon announced something: every path call
    /// beneath the map of every thread comes here, and a lock taken each
    /// time would make them all write one cache line.
    pub fn namespace_current(&self) -> Option<&Namespace> {
        let names = self.names.get()?;
        if names.shared() && self.client.invalidations_pending() {
            drop(self.lock());
        }
        Some(names)
    }

    /// The cached attributes of `node`, when still valid (no request).
    pub fn cached_attr(&self, node: NodeId) -> Option<Attr> {
        self.lock().attr(node, Instant::now())
    }

    /// The host directory this mount mirrors, if any.
    pub fn source(&self) -> Option<&[u8]> {
        self.source.get().map(Vec::as_slice)
    }

    /// The part of absolute `path` below the mount point ("" for the mount
    /// point itself), or `None` when `path` is not inside the mount.
    /// Compared lexically, component by component.
    pub fn strip<'a>(&self, path: &'a [u8]) -> Option<&'a [u8]> {
        let mp = &self.mountpoint;
        if mp.as_slice() == b"/" {
            return Some(path.strip_prefix(b"/").unwrap_or(path));
        }
        let rest = path.strip_prefix(mp.as_slice())?;
        match rest.first() {
            None => Some(rest),
            Some(b'/') => Some(&rest[1..]),
            Some(_) => None,
        }
    }

    /// The host path of a location.
    pub fn host_path(&self, loc: &Location) -> Vec<u8> {
        if loc.is_root() {
            return self.mountpoint.clone();
        }
        let base = if self.mountpoint.as_slice() == b"/" {
            &b""[..]
        } else {
            &self.mountpoint
        };
        let mut p = base.to_vec();
        p.extend_from_slice(&loc.path());
        p
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        let mut c = self.cache.lock().unpoison();
        // What other clients of a shared daemon changed, before we trust the cache.
        let names = self.names.get();
        self.client.invalidations(&mut |inv| {
            // A name changed through the daemon: a kept directory may be gone.
            if let (Some(n), Invalidation::Entry { .. } | Invalidation::All) = (names, inv) {
                n.forget_dirs();
            }
            // A file changed through the daemon: its pages here are stale.
            if let (Some(pc), Invalidation::Inode(node)) = (self.pages.get(), &inv) {
                pc.invalidate(*node);
            }
            c.invalidate(inv, Instant::now())
        });
        // The root's attributes, fetched as a deferred backend connected.
        if let Some((root, ttl)) = self.client.take_root() {
            c.set_attr(NodeId::ROOT, root, ttl, Instant::now());
        }
        c
    }

    /// Sends the FORGETs collected under the cache lock.
    fn forget(&self, forgets: Forgets) {
        for (node, n) in forgets {
            if let Some(pc) = self.page_cache() {
                pc.forget(node);
            }
            self.client.forget(node, n);
        }
    }

    /// Records an entry the file system handed out and caches its name.
    pub(crate) fn remember(&self, parent: NodeId, name: &[u8], e: &EntryOut) {
        self.cache_entry(parent, name, e, true);
    }

    /// Records an entry and caches its name; `parent_changed` (the entry
    /// was made, not looked up) drops the parent's attributes too.
    fn cache_entry(&self, parent: NodeId, name: &[u8], e: &EntryOut, parent_changed: bool) {
        let now = Instant::now();
        let mut forgets = Forgets::new();
        {
            let mut c = self.lock();
            c.add_lookup(e.node, e.attr, e.attr_ttl, now);
            c.set_dentry(parent, name, Some(e.node), e.entry_ttl, now, &mut forgets);
            if parent_changed {
                c.invalidate_attr(parent);
            }
        }
        self.forget(forgets);
    }

    /// Drops a cached name (after unlink, rmdir, rename) and the
    /// attributes that the change made stale.
    fn drop_name(&self, parent: NodeId, name: &[u8], node: Option<NodeId>) {
        let mut forgets = Forgets::new();
        {
            let mut c = self.lock();
            if let Some(n) = node {
                c.invalidate_attr(n);
            }
            c.invalidate_attr(parent);
            c.remove_dentry(parent, name, &mut forgets);
        }
        self.forget(forgets);
    }

    /// Looks `name` up in `parent`, from the cache when it is valid.
    pub fn lookup(&self, parent: NodeId, name: &[u8]) -> Result<Option<(NodeId, Attr)>, Errno> {
        let cached = self.cached(parent, name)?;
        self.lookup_past(parent, name, cached)
    }

    /// What the cache says of `name` in `parent`.
    fn cached(&self, parent: NodeId, name: &[u8]) -> Result<Cached, Errno> {
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(self.lock().lookup(parent, name, Instant::now()))
    }

    /// [`Vfs::lookup`] once the cache said `cached`.
    fn lookup_past(&self, parent: NodeId, name: &[u8], cached: Cached) -> Result<Option<(NodeId, Attr)>, Errno> {
        match cached {
            Cached::Negative => return Ok(None),
            Cached::Node(n, Some(a)) => return Ok(Some((n, a))),
            Cached::Node(n, None) => match self.getattr(n) {
                // No name leads to an inode with no names left: another
                // process removed or replaced this one (assemblers and
                // linkers unlink their output and write a new file), and
                // make would take the old file's times for the new one's.
                Ok(a) if a.nlink == 0 => {}
                Ok(a) => return Ok(Some((n, a))),
                // Gone behind our back: ask for the name again.
                Err(e) if e == Errno::ENOENT || e == Errno::ESTALE => {}
                Err(e) => return Err(e),
            },
            Cached::Miss => {}
        }
        match self.client.lookup(parent, OsStr::from_bytes(name)) {
            Ok(Lookup::Found(e)) => {
                self.remember_lookup(parent, name, &e);
                Ok(Some((e.node, e.attr)))
            }
            Ok(Lookup::Negative(ttl)) => {
                let mut forgets = Forgets::new();
                self.lock()
                    .set_dentry(parent, name, None, ttl, Instant::now(), &mut forgets);
                self.forget(forgets);
                Ok(None)
            }
            Err(e) if e == Errno::ENOENT => {
                self.drop_name_only(parent, name);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether a walk of `rel` (names alone, below the root) would be
    /// answered by the cache alone, with no request: every directory on
    /// the way has valid attributes (for the search check), every name a
    /// valid entry with valid attributes, and none is a symbolic link:
    /// following one asks the file system for its target, and callers
    /// leave a descriptor of the link itself to the kernel.
    pub fn walks_from_cache(&self, rel: &[u8]) -> bool {
        let c = self.lock();
        let now = Instant::now();
        let mut dir = NodeId::ROOT;
        let mut names = rel.split(|&b| b == b'/').peekable();
        while let Some(name) = names.next() {
            if name.is_empty() || name == b"." || name == b".." || c.attr(dir, now).is_none() {
                return false;
            }
            let Cached::Node(node, Some(attr)) = c.lookup(dir, name, now) else {
                return false;
            };
            let last = names.peek().is_none();
            match attr.file_type() {
                FileType::Directory => {}
                FileType::Symlink => return false,
                _ if !last => return false,
                _ => {}
            }
            dir = node;
        }
        true
    }

    /// Records an entry LOOKUP, or a READDIRPLUS of `parent`, brought (a
    /// lookup to give back), and caches its name: the `stat` after a
    /// listing finds it.
    pub(crate) fn remember_lookup(&self, parent: NodeId, name: &[u8], e: &EntryOut) {
        self.cache_entry(parent, name, e, false);
    }

    /// Whether listings are READDIRPLUS (the file system agreed to it).
    pub(crate) fn readdirplus(&self) -> bool {
        self.init_out().flags & abi::FUSE_DO_READDIRPLUS != 0
    }

    /// Drops what the cache says of the name at `rel` (a path below the
    /// root, no `.` or `..` components), and the attributes of the
    /// directory holding it, with no request: the kernel changed that name
    /// beneath the mount's namespace map, so the file system never told
    /// the cache. A path whose directories the cache does not hold has
    /// nothing cached to drop.
    pub fn drop_cached_path(&self, rel: &[u8]) {
        let mut forgets = Forgets::new();
        {
            let mut c = self.lock();
            let now = Instant::now();
            let mut parent = NodeId::ROOT;
            let mut names = rel.split(|&b| b == b'/').peekable();
            while let Some(name) = names.next() {
                if names.peek().is_none() {
                    // The node's attributes may have changed too (a
                    // truncating open, a write through the kernel).
                    if let Cached::Node(n, _) = c.lookup(parent, name, now) {
                        c.invalidate_attr(n);
                    }
                    c.invalidate_attr(parent);
                    c.remove_dentry(parent, name, &mut forgets);
                    break;
                }
                match c.lookup(parent, name, now) {
                    Cached::Node(n, _) => parent = n,
                    _ => break,
                }
            }
        }
        self.forget(forgets);
    }

    pub(crate) fn drop_name_only(&self, parent: NodeId, name: &[u8]) {
        let mut forgets = Forgets::new();
        self.lock().remove_dentry(parent, name, &mut forgets);
        self.forget(forgets);
    }

    /// The attributes of `node`, from the cache when they are valid.
    pub fn getattr(&self, node: NodeId) -> Result<Attr, Errno> {
        if let Some(a) = self.lock().attr(node, Instant::now()) {
            return Ok(a);
        }
        self.getattr_fresh(node, None)
    }

    /// Whether the caller may search directory `dir` (look a name up in
    /// it): its execute bit for the caller's class, as the kernel's
    /// generic_permission sees it (the supplementary groups count; root
    /// may always). Checked on every walk, cached names included: the file
    /// system's LOOKUP, which may check too, is not asked for those.
    pub fn may_search(&self, dir: NodeId) -> Result<(), Errno> {
        self.may_search_in(dir, None)
    }

    /// [`Vfs::may_search`] in a walk that found the nodes of `borrowed` in
    /// the shared table. Root may search anything: no attributes asked.
    fn may_search_in(&self, dir: NodeId, borrowed: Option<&Borrowed>) -> Result<(), Errno> {
        let caller = self.client.caller();
        if caller.uid == 0 || permits(&caller, &self.walk_attr(dir, borrowed)?, 0o1) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// The attributes of `node` for a walk: those the shared table gave
    /// with it when it is `borrowed`, else [`Vfs::getattr`].
    fn walk_attr(&self, node: NodeId, borrowed: Option<&Borrowed>) -> Result<Attr, Errno> {
        match borrowed.and_then(|b| b.attr(node)) {
            Some(a) => Ok(a),
            None => self.getattr(node),
        }
    }

    /// `name` in `parent` for a walk, once the cache said `cached`: from
    /// the shared table for an attributes-only walk (`borrowed`), where
    /// this process holds no valid entry; [`Stop::Asks`] where a request
    /// would name a node found there.
    fn walk_lookup(
        &self,
        parent: NodeId,
        name: &[u8],
        cached: Cached,
        borrowed: Option<&mut Borrowed>,
    ) -> Result<Option<(NodeId, Attr)>, Stop> {
        if let Some(b) = borrowed {
            if matches!(cached, Cached::Miss | Cached::Node(_, None)) {
                if let Some((n, a)) = self.client.shared_entry(parent, name) {
                    b.0.push((n, a));
                    return Ok(Some((n, a)));
                }
                if b.attr(parent).is_some() {
                    return Err(Stop::Asks);
                }
            }
        }
        Ok(self.lookup_past(parent, name, cached)?)
    }

    /// The set-group-ID bit a new non-directory of `mode` made in `parent`
    /// keeps, as the kernel's mode_strip_sgid: it is dropped when the
    /// file would inherit the directory's group (a set-group-ID directory)
    /// and the caller is neither in that group nor root.
    fn strip_sgid(&self, parent: NodeId, mode: u32) -> Result<u32, Errno> {
        if mode & (libc::S_ISGID | libc::S_IXGRP) != (libc::S_ISGID | libc::S_IXGRP)
            || mode & libc::S_IFMT == libc::S_IFDIR
        {
            return Ok(mode);
        }
        let dir = self.getattr(parent)?;
        let caller = self.client.caller();
        if dir.mode & libc::S_ISGID == 0 || caller.uid == 0 || caller.in_group(dir.gid) {
            return Ok(mode);
        }
        Ok(mode & !libc::S_ISGID)
    }

    /// [`Vfs::strip_sgid`] for a file that `open(2)` creates in `parent`.
    pub(crate) fn create_mode(&self, parent: NodeId, mode: u32) -> Result<u32, Errno> {
        self.strip_sgid(parent, mode)
    }

    /// GETATTR, bypassing the cache (and refreshing it).
    pub fn getattr_fresh(&self, node: NodeId, fh: Option<u64>) -> Result<Attr, Errno> {
        let (a, ttl) = self.client.getattr(node, fh)?;
        self.lock().set_attr(node, a, ttl, Instant::now());
        Ok(a)
    }

    pub fn invalidate_attr(&self, node: NodeId) {
        self.lock().invalidate_attr(node);
    }

    /// Keeps the nodes of `loc` in the table (a current directory or a
    /// directory descriptor holds them).
    pub fn pin_location(&self, loc: &Location) {
        let mut c = self.lock();
        for n in loc.nodes() {
            c.pin(n);
        }
    }

    pub fn unpin_location(&self, loc: &Location) {
        let mut forgets = Forgets::new();
        {
            let mut c = self.lock();
            for n in loc.nodes() {
                c.unpin(n, &mut forgets);
            }
        }
        self.forget(forgets);
    }

    pub(crate) fn pin(&self, node: NodeId) {
        self.lock().pin(node);
    }

    pub(crate) fn unpin(&self, node: NodeId) {
        let mut forgets = Forgets::new();
        self.lock().unpin(node, &mut forgets);
        self.forget(forgets);
    }

    /// Drops every cached name and forgets every node nothing uses.
    pub fn drop_caches(&self) {
        let mut forgets = Forgets::new();
        self.lock().clear(&mut forgets);
        self.forget(forgets);
    }

    /// (cached names, nodes in the table, root included).
    pub fn cache_counts(&self) -> (usize, usize) {
        let c = self.lock();
        (c.dentry_count(), c.node_count())
    }

    /// Lookups held on `node` and not yet forgotten.
    pub fn nlookup(&self, node: NodeId) -> Option<u64> {
        self.lock().nlookup(node)
    }

    /// A walk's end at the directory `loc` itself (a path with nothing
    /// left to walk, or a link to the mount's root).
    fn dir_itself(&self, loc: Location, attr: Attr, trailing_slash: bool, links: u32) -> Result<Walk, Errno> {
        let node = loc.node();
        Ok(Walk::Inside(Target {
            dir: loc,
            last: Last::Dir,
            node: Some((node, attr)),
            trailing_slash,
            links,
            unasked: false,
        }))
    }

    /// Resolves `path` from `start`. A leading '/' starts from the mount's
    /// root (callers strip the mount point from absolute paths first).
    /// `links` counts symbolic links already followed.
    pub fn walk(&self, start: &Location, path: &[u8], flags: WalkFlags, links: u32) -> Result<Walk, Errno> {
        if flags.attrs_only && self.client.has_shared_entries() {
            let mut borrowed = Borrowed::default();
            match self.walk_with(start, path, flags, links, Some(&mut borrowed)) {
                Ok(w) => return Ok(w),
                Err(Stop::Failed(e)) => return Err(e),
                Err(Stop::Asks) => {}
            }
        }
        match self.walk_with(start, path, flags, links, None) {
            Ok(w) => Ok(w),
            Err(Stop::Failed(e)) => Err(e),
            // Only a walk with the table asks to start again.
            Err(Stop::Asks) => Err(Errno::EIO),
        }
    }

    /// [`Vfs::walk`], looking names up in the shared table too when given
    /// `borrowed` (the nodes found there).
    fn walk_with(
        &self,
        start: &Location,
        path: &[u8],
        flags: WalkFlags,
        links: u32,
        mut borrowed: Option<&mut Borrowed>,
    ) -> Result<Walk, Stop> {
        if path.len() >= PATH_MAX {
            return Err(Errno::ENAMETOOLONG.into());
        }
        let mut links = links;
        let mut loc = if path.starts_with(b"/") {
            Location::root()
        } else {
            start.clone()
        };
        // The path still to walk; replaced when a symbolic link expands.
        let mut buf: std::borrow::Cow<'_, [u8]> = std::borrow::Cow::Borrowed(path);
        let mut pos = buf.iter().take_while(|&&b| b == b'/').count();
        loop {
            let (comp, rest) = split_first(&buf[pos..]);
            let comp_len = comp.len();
            let rest_at = buf.len() - rest.len();
            let is_last = rest.is_empty();
            let trailing = is_last && buf[pos + comp_len..].contains(&b'/');
            if comp.is_empty() {
                // Nothing (left) to walk: the path names the directory itself.
                let attr = self.walk_attr(loc.node(), borrowed.as_deref())?;
                return Ok(self.dir_itself(loc, attr, true, links)?);
            }
            // As the kernel's may_lookup: every name, dots included, is
            // looked up in a directory the caller may search.
            self.may_search_in(loc.node(), borrowed.as_deref())?;
            if comp == b"." || comp == b".." {
                if comp == b".." {
                    if loc.is_root() {
                        let up = crate::parent_of(&self.mountpoint);
                        let mut rest = buf[rest_at..].to_vec();
                        if is_last && trailing {
                            rest.push(b'/');
                        }
                        return Ok(Walk::Outside {
                            path: join(&up, &rest),
                            links,
                        });
                    }
                    loc.pop();
                }
                if is_last {
                    let node = loc.node();
                    let attr = self.walk_attr(node, borrowed.as_deref())?;
                    return Ok(Walk::Inside(Target {
                        dir: loc,
                        last: if comp == b"." { Last::Dot } else { Last::DotDot },
                        node: Some((node, attr)),
                        trailing_slash: trailing,
                        links,
                        unasked: false,
                    }));
                }
                pos = rest_at;
                continue;
            }
            let parent = loc.node();
            let cached = self.cached(parent, comp)?;
            let unasked = is_last && flags.create && !trailing && matches!(cached, Cached::Miss);
            let found = if unasked {
                None
            } else {
                self.walk_lookup(parent, comp, cached, borrowed.as_deref_mut())?
            };
            let Some((node, attr)) = found else {
                if is_last {
                    return Ok(Walk::Inside(Target {
                        dir: loc,
                        last: Last::Name(comp.into()),
                        node: None,
                        trailing_slash: trailing,
                        links,
                        unasked,
                    }));
                }
                return Err(Errno::ENOENT.into());
            };
            let typ = attr.file_type();
            if typ == FileType::Symlink && (!is_last || flags.follow || trailing) {
                links += 1;
                if links > MAXSYMLINKS {
                    return Err(Errno::ELOOP.into());
                }
                if borrowed.as_deref().is_some_and(|b| b.attr(node).is_some()) {
                    return Err(Stop::Asks);
                }
                let target = self.client.readlink(node)?;
                if target.is_empty() {
                    return Err(Errno::ENOENT.into());
                }
                let mut rest = buf[pos + comp_len..].to_vec();
                // Keep the slashes: "link/" must still name a directory.
                if target.starts_with(b"/") {
                    let Some(inside) = self.strip(&target) else {
                        let mut out = target.clone();
                        if !rest.is_empty() {
                            out.append(&mut rest);
                        }
                        return Ok(Walk::Outside { path: out, links });
                    };
                    loc = Location::root();
                    let mut nb = inside.to_vec();
                    nb.append(&mut rest);
                    buf = nb.into();
                } else {
                    let mut nb = target;
                    nb.append(&mut rest);
                    buf = nb.into();
                }
                if buf.len() >= PATH_MAX {
                    return Err(Errno::ENAMETOOLONG.into());
                }
                pos = buf.iter().take_while(|&&b| b == b'/').count();
                if buf[pos..].is_empty() {
                    // "link" -> "/mnt/x": the mount's root itself.
                    let attr = self.walk_attr(loc.node(), borrowed.as_deref())?;
                    return Ok(self.dir_itself(loc, attr, trailing, links)?);
                }
                continue;
            }
            if is_last {
                if trailing && typ != FileType::Directory && typ != FileType::Symlink {
                    return Err(Errno::ENOTDIR.into());
                }
                return Ok(Walk::Inside(Target {
                    dir: loc,
                    last: Last::Name(comp.into()),
                    node: Some((node, attr)),
                    trailing_slash: trailing,
                    links,
                    unasked: false,
                }));
            }
            if typ != FileType::Directory {
                return Err(Errno::ENOTDIR.into());
            }
            loc.push(node, comp);
            pos = rest_at;
        }
    }

    // ----- operations on what a walk found -----

    /// `stat(2)` of a target (the walk decided whether links were followed).
    pub fn stat(&self, t: &Target) -> Result<Attr, Errno> {
        t.node.map(|(_, a)| a).ok_or(Errno::ENOENT)
    }

    pub fn mkdir(&self, t: &Target, mode: u32) -> Result<Attr, Errno> {
        let name = t.new_name(true)?;
        self.writable()?;
        let parent = t.dir.node();
        let umask = self.umask();
        let e = self
            .client
            // As vfs_mkdir: only the permission bits and the sticky bit.
            .mkdir(
                parent,
                OsStr::from_bytes(name),
                mode & (0o777 | libc::S_ISVTX) & !umask,
                umask,
            )?;
        self.remember(parent, name, &e);
        Ok(e.attr)
    }

    /// `mknod(2)` for regular files, FIFOs, sockets and devices.
    pub fn mknod(&self, t: &Target, mode: u32, rdev: u32) -> Result<Attr, Errno> {
        let name = t.new_name(false)?;
        self.writable()?;
        let parent = t.dir.node();
        let umask = self.umask();
        let mode = if mode & libc::S_IFMT == 0 {
            mode | libc::S_IFREG
        } else {
            mode
        };
        if matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK) && self.client.caller().uid != 0 {
            // Devices need CAP_MKNOD (vfs_mknod), asked after the
            // permission to create in the directory.
            let caller = self.client.caller();
            if !permits(&caller, &self.getattr(parent)?, 0o3) {
                return Err(Errno::EACCES);
            }
            return Err(Errno::EPERM);
        }
        let mode = self.strip_sgid(parent, mode & (libc::S_IFMT | (0o7777 & !umask)))?;
        let e = self.client.mknod(parent, OsStr::from_bytes(name), mode, rdev, umask)?;
        self.remember(parent, name, &e);
        Ok(e.attr)
    }

    pub fn symlink(&self, target: &[u8], t: &Target) -> Result<Attr, Errno> {
        let name = t.new_name(false)?;
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        self.writable()?;
        let parent = t.dir.node();
        let e = self.client.symlink(parent, OsStr::from_bytes(name), target)?;
        self.remember(parent, name, &e);
        Ok(e.attr)
    }

    /// `link(2)`: `old` is the existing object (links not followed unless
    /// AT_SYMLINK_FOLLOW), `new` the new name in the same mount.
    pub fn link(&self, old: &Target, new: &Target) -> Result<Attr, Errno> {
        let (node, attr) = old.node.ok_or(Errno::ENOENT)?;
        if attr.file_type() == FileType::Directory {
            return Err(Errno::EPERM);
        }
        if old.trailing_slash {
            return Err(Errno::ENOTDIR);
        }
        let name = new.new_name(false)?;
        self.writable()?;
        self.may_link(&attr)?;
        let parent = new.dir.node();
        let e = self.client.link(node, parent, OsStr::from_bytes(name))?;
        self.remember(parent, name, &e);
        self.invalidate_attr(node);
        Ok(e.attr)
    }

    /// The kernel's may_linkat under `fs.protected_hardlinks` (on in
    /// every common distribution): a caller who neither owns the file nor
    /// is root may link only a regular file it may read and write that is
    /// not set-user-ID or executable set-group-ID; EPERM otherwise.
    fn may_link(&self, attr: &Attr) -> Result<(), Errno> {
        static PROTECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let protected = *PROTECTED
            .get_or_init(|| std::fs::read_to_string("/proc/sys/fs/protected_hardlinks").is_ok_and(|v| v.trim() != "0"));
        let caller = self.client.caller();
        if !protected || caller.uid == 0 || caller.uid == attr.uid {
            return Ok(());
        }
        let safe = attr.file_type() == FileType::Regular
            && attr.mode & libc::S_ISUID == 0
            && attr.mode & (libc::S_ISGID | libc::S_IXGRP) != (libc::S_ISGID | libc::S_IXGRP)
            && permits(&caller, attr, 0o6);
        if safe {
            Ok(())
        } else {
            Err(Errno::EPERM)
        }
    }

    pub fn readlink(&self, t: &Target) -> Result<Vec<u8>, Errno> {
        let (node, attr) = t.node.ok_or(Errno::ENOENT)?;
        if attr.file_type() != FileType::Symlink {
            return Err(Errno::EINVAL);
        }
        self.client.readlink(node)
    }

    pub fn unlink(&self, t: &Target) -> Result<(), Errno> {
        let name = t.name(Errno::EISDIR)?;
        let (node, attr) = t.node.ok_or(Errno::ENOENT)?;
        if attr.file_type() == FileType::Directory {
            return Err(Errno::EISDIR);
        }
        if t.trailing_slash {
            return Err(Errno::ENOTDIR);
        }
        self.writable()?;
        let parent = t.dir.node();
        let r = self.client.unlink(parent, OsStr::from_bytes(name));
        self.drop_name(parent, name, Some(node));
        r
    }

    pub fn rmdir(&self, t: &Target) -> Result<(), Errno> {
        let name = match &t.last {
            Last::Name(n) => n,
            Last::Dot => return Err(Errno::EINVAL),
            Last::DotDot => return Err(Errno::ENOTEMPTY),
            Last::Dir => return Err(Errno::EBUSY),
        };
        let (node, attr) = t.node.ok_or(Errno::ENOENT)?;
        if attr.file_type() != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        self.writable()?;
        let parent = t.dir.node();
        let r = self.client.rmdir(parent, OsStr::from_bytes(name));
        self.drop_name(parent, name, Some(node));
        r
    }

    /// `renameat2(2)`; both targets from this mount (EXDEV is the caller's).
    pub fn rename(&self, old: &Target, new: &Target, flags: u32) -> Result<(), Errno> {
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if flags & !known != 0
            || (flags & libc::RENAME_EXCHANGE != 0 && flags & (libc::RENAME_NOREPLACE | libc::RENAME_WHITEOUT) != 0)
        {
            return Err(Errno::EINVAL);
        }
        let old_name = old.name(Errno::EBUSY)?;
        let new_name = new.name(Errno::EBUSY)?;
        let (node, attr) = old.node.ok_or(Errno::ENOENT)?;
        self.writable()?;
        let is_dir = attr.file_type() == FileType::Directory;
        if !is_dir && (old.trailing_slash || new.trailing_slash) {
            return Err(Errno::ENOTDIR);
        }
        if flags & libc::RENAME_EXCHANGE != 0 && new.node.is_none() {
            return Err(Errno::ENOENT);
        }
        if flags & libc::RENAME_NOREPLACE != 0 && new.node.is_some() {
            return Err(Errno::EEXIST);
        }
        if let Some((_, na)) = new.node {
            let new_dir = na.file_type() == FileType::Directory;
            if flags & libc::RENAME_EXCHANGE == 0 {
                if is_dir && !new_dir {
                    return Err(Errno::ENOTDIR);
                }
                if !is_dir && new_dir {
                    return Err(Errno::EISDIR);
                }
            }
        }
        // A directory may not move below itself.
        if is_dir && (new.dir.nodes().any(|n| n == node)) {
            return Err(Errno::EINVAL);
        }
        if let (Some((n1, _)), Some((n2, _))) = (old.node, new.node) {
            if n1 == n2 && flags & libc::RENAME_EXCHANGE == 0 {
                // Two names of one inode: POSIX says do nothing.
                return Ok(());
            }
        }
        let (p1, p2) = (old.dir.node(), new.dir.node());
        let r = self
            .client
            .rename(p1, OsStr::from_bytes(old_name), p2, OsStr::from_bytes(new_name), flags);
        self.drop_name(p1, old_name, Some(node));
        self.drop_name(p2, new_name, new.node.map(|n| n.0));
        r
    }

    /// SETATTR on a target or an open file's node.
    pub fn setattr(&self, node: NodeId, set: &SetAttr) -> Result<Attr, Errno> {
        self.writable()?;
        match self.client.setattr(node, set) {
            Ok((a, ttl)) => {
                self.lock().set_attr(node, a, ttl, Instant::now());
                if let (Some(pc), Some(size)) = (self.page_cache(), set.size) {
                    pc.truncated(node, size);
                }
                Ok(a)
            }
            Err(e) => {
                self.invalidate_attr(node);
                if let (Some(pc), Some(_)) = (self.page_cache(), set.size) {
                    pc.invalidate(node);
                }
                Err(e)
            }
        }
    }

    /// `truncate(2)`.
    pub fn truncate(&self, t: &Target, size: u64) -> Result<(), Errno> {
        let (node, attr) = t.node.ok_or(Errno::ENOENT)?;
        match attr.file_type() {
            FileType::Directory => return Err(Errno::EISDIR),
            FileType::Regular => {}
            _ => return Err(Errno::EINVAL),
        }
        self.client
            .access(node, libc::W_OK)
            .or_else(|e| if e == Errno::ENOSYS { Ok(()) } else { Err(e) })?;
        self.setattr(
            node,
            &SetAttr {
                size: Some(size),
                ..Default::default()
            },
        )?;
        Ok(())
    }

    /// `access(2)`/`faccessat(2)` (`mode` of R_OK, W_OK, X_OK or F_OK).
    pub fn access(&self, t: &Target, mode: i32) -> Result<(), Errno> {
        let (node, _) = t.node.ok_or(Errno::ENOENT)?;
        if mode & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
            return Err(Errno::EINVAL);
        }
        if mode == libc::F_OK {
            return Ok(());
        }
        if mode & libc::W_OK != 0 && self.is_read_only() {
            return Err(Errno::EROFS);
        }
        match self.client.access(node, mode) {
            Err(e) if e == Errno::ENOSYS => Ok(()),
            r => r,
        }
    }

    pub fn statfs(&self, node: NodeId) -> Result<Statfs, Errno> {
        self.client.statfs(node)
    }

    /// Checks that `t` may become the current directory.
    pub fn chdir(&self, t: &Target) -> Result<Location, Errno> {
        let (node, attr) = t.node.ok_or(Errno::ENOENT)?;
        if attr.file_type() != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        match self.client.access(node, libc::X_OK) {
            Err(e) if e != Errno::ENOSYS => return Err(e),
            _ => {}
        }
        t.location().ok_or(Errno::ENOTDIR)
    }

    pub(crate) fn atomic_o_trunc(&self) -> bool {
        self.init_out().flags & abi::FUSE_ATOMIC_O_TRUNC != 0
    }

    pub(crate) fn max_io(&self) -> usize {
        self.init_out().max_io as usize
    }
}

/// Whether `caller` (not root) has all of `mask`'s permission bits
/// (0o4 read, 0o2 write, 0o1 execute) on an inode of `attr`: the owner's,
/// the group's (its supplementary groups count) or the others' class, as
/// the kernel's generic_permission picks one.
fn permits(caller: &crate::client::Caller, attr: &Attr, mask: u32) -> bool {
    let shift = if attr.uid == caller.uid {
        6
    } else if caller.in_group(attr.gid) {
        3
    } else {
        0
    };
    (attr.mode >> shift) & mask == mask
}
