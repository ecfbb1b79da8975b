//! How the VFS opens a walked target: permission checks, O_CREAT, the
//! data-map cache and files the kernel keeps.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use shortfuse::{Attr, Errno, FileHandle, FileType, NodeId, SetAttr};
use shortfuse_abi as abi;

use super::{accmode, OpenFile};
use crate::vfs::{Target, Vfs};

impl Vfs {
    /// `open(2)`/`openat(2)` of a walked target. The walk must have
    /// followed a final symlink unless O_NOFOLLOW or O_CREAT|O_EXCL. Any
    /// error for an [`Target::unasked`] target only says that creating
    /// failed: walk again without [`crate::WalkFlags::create`] and open
    /// that.
    pub fn open(self: &Arc<Vfs>, t: &Target, flags: i32, mode: u32) -> Result<Arc<OpenFile>, Errno> {
        let creat = flags & libc::O_CREAT != 0;
        let excl = flags & libc::O_EXCL != 0;
        let path_only = flags & libc::O_PATH != 0;
        let want_dir = flags & libc::O_DIRECTORY != 0;
        let acc = accmode(flags);
        if acc == libc::O_ACCMODE && !path_only {
            return Err(Errno::EINVAL);
        }
        if flags & libc::O_TMPFILE == libc::O_TMPFILE {
            // TMPFILE is not in the trait: what the kernel answers for FUSE without it.
            return Err(Errno::EOPNOTSUPP);
        }
        let mut noflush = false;
        // FOPEN_PASSTHROUGH: the file system serves the open from one
        // backing file, as the kernel's passthrough.
        let mut passthrough = false;
        if let Some(f) = self.open_cached(t, flags) {
            return Ok(f);
        }
        let (node, attr, created_fh) = match t.node {
            Some((node, attr)) => {
                if creat && excl && !path_only {
                    return Err(Errno::EEXIST);
                }
                let writes = acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
                if writes && !path_only && attr.file_type() == FileType::Regular {
                    self.writable()?;
                }
                (node, attr, None)
            }
            None if creat && !path_only => {
                let name = match &t.last {
                    crate::vfs::Last::Name(n) => n.clone(),
                    _ => return Err(Errno::EISDIR),
                };
                if t.trailing_slash {
                    return Err(Errno::EISDIR);
                }
                self.writable()?;
                let parent = t.dir.node();
                let umask = self.umask();
                let fmode = self.create_mode(parent, libc::S_IFREG | (mode & 0o7777 & !umask))?;
                let mut open_flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY);
                if t.unasked {
                    // The name may exist: only create.
                    open_flags |= libc::O_EXCL;
                }
                match self
                    .client()
                    .create(parent, OsStr::from_bytes(&name), open_flags, fmode, umask)
                {
                    Ok((e, o)) => {
                        self.remember_created(parent, &name, &e);
                        noflush = o.open_flags & abi::FOPEN_NOFLUSH != 0;
                        passthrough = o.open_flags & abi::FOPEN_PASSTHROUGH != 0;
                        (e.node, e.attr, Some(o.fh))
                    }
                    Err(e) if e == Errno::ENOSYS => {
                        let e = self.client().mknod(parent, OsStr::from_bytes(&name), fmode, 0, umask)?;
                        self.remember_created(parent, &name, &e);
                        (e.node, e.attr, None)
                    }
                    // Another thread or process created it since the walk:
                    // without O_EXCL the open takes the file that is there,
                    // as the kernel's open retries its lookup.
                    Err(e) if e == Errno::EEXIST && !excl && !t.unasked => {
                        // The walk's answer (a cached negative entry, say) is stale.
                        self.drop_name_only(parent, &name);
                        match self.lookup(parent, &name)? {
                            Some((node, attr)) => (node, attr, None),
                            None => return Err(e),
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            None => return Err(Errno::ENOENT),
        };
        let kind = attr.file_type();
        if (want_dir || t.trailing_slash) && kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        if kind == FileType::Symlink && !path_only {
            return Err(Errno::ELOOP);
        }
        if kind == FileType::Directory && !path_only && (acc != libc::O_RDONLY || creat || flags & libc::O_TRUNC != 0) {
            return Err(Errno::EISDIR);
        }
        let loc = if kind == FileType::Directory {
            t.location()
        } else {
            None
        };
        let fh = if path_only {
            None
        } else if let Some(fh) = created_fh {
            Some(fh)
        } else {
            let is_dir = kind == FileType::Directory;
            // O_RDONLY|O_TRUNC truncates too (Linux; the open asked for
            // write permission).
            let trunc = flags & libc::O_TRUNC != 0 && kind == FileType::Regular;
            let mut oflags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY);
            if !self.atomic_o_trunc() {
                oflags &= !libc::O_TRUNC;
            }
            let o = self.client().open(node, oflags, is_dir)?;
            if trunc && !self.atomic_o_trunc() {
                let set = SetAttr {
                    size: Some(0),
                    fh: Some(FileHandle(o.fh)),
                    ..Default::default()
                };
                if let Err(e) = self.setattr(node, &set) {
                    let _ = self.client().release(node, o.fh, oflags, false);
                    return Err(e);
                }
            }
            if trunc {
                self.invalidate_attr(node);
            }
            noflush = o.open_flags & abi::FOPEN_NOFLUSH != 0;
            passthrough = o.open_flags & abi::FOPEN_PASSTHROUGH != 0;
            Some(o.fh)
        };
        let map = match (fh, self.maps()) {
            (Some(fh), Some(t)) if kind == FileType::Regular => t.take(node, fh),
            (Some(fh), None) if passthrough && kind == FileType::Regular => self.lent_map(node, fh),
            _ => None,
        };
        if let (Some(pc), Some(fh), None, FileType::Regular) = (self.page_cache(), fh, &map, kind) {
            // Close-to-open: what the file system holds now decides whether
            // the cached pages still stand.
            let now = match created_fh {
                Some(_) => attr,
                None => self.getattr_fresh(node, Some(fh)).inspect_err(|_| {
                    let _ = self.client().release(node, fh, flags, false);
                })?,
            };
            pc.opened(node, &now);
        }
        self.pin(node);
        if let Some(l) = &loc {
            self.pin_location(l);
        }
        Ok(Arc::new(
            OpenFile::new(self.clone(), node, fh, kind, flags, t.path()).with(|f| {
                f.loc = loc;
                f.noflush = noflush;
                f.path_only = path_only;
                f.map = map;
            }),
        ))
    }

    /// The map of an open a daemon serves by kernel passthrough: the
    /// backing file it lends (see [`crate::Backend::backing_file`]), so
    /// that reads and writes go to the file as they do on the kernel
    /// mount. None (the file system serves the I/O) when it lends none.
    fn lent_map(&self, node: NodeId, fh: u64) -> Option<crate::HeldMap> {
        let file = self.client().backing_file(node, fh, None).ok()?;
        Some(crate::HeldMap {
            map: Arc::new(shortfuse::DataMap::whole(Arc::new(file))),
            generation: 0,
        })
    }

    /// The M-Cache (DeFUSE): a re-open of a regular file whose map is
    /// cached and whose attributes are still valid skips the file system's
    /// `open`; the open file then does all its I/O through the map. Not for
    /// creating or truncating opens, O_PATH, or a caller the cached mode
    /// bits refuse (the check the skipped `open` would have made); writers
    /// only for 1-to-1 maps.
    fn open_cached(self: &Arc<Vfs>, t: &Target, flags: i32) -> Option<Arc<OpenFile>> {
        let (node, _) = t.node?;
        if flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_PATH | libc::O_DIRECTORY) != 0 || t.trailing_slash {
            return None;
        }
        let attr = self.cached_attr(node)?;
        if attr.file_type() != FileType::Regular {
            return None;
        }
        let acc = accmode(flags);
        if acc != libc::O_RDONLY && self.is_read_only() {
            return None;
        }
        if !permits(&attr, &self.client().caller(), acc) {
            return None;
        }
        let mut map = self.maps()?.cached(node)?;
        if let Some(b) = map.whole() {
            // The cache keeps an O_PATH descriptor: this open gets its own,
            // with its flags (the kernel checks permission here).
            let own = crate::maps::reopen(b, flags).ok()?;
            map.map = Arc::new(shortfuse::DataMap::whole(Arc::new(own)));
        } else if acc != libc::O_RDONLY {
            // A write past the end of a 1-to-M or M-to-1 map needs the file
            // system (it grows the file and hands out a new map): that
            // takes an open of its own.
            return None;
        }
        self.pin(node);
        Some(Arc::new(
            OpenFile::new(self.clone(), node, None, FileType::Regular, flags, t.path()).with(|f| {
                f.noflush = true;
                f.map = Some(map);
            }),
        ))
    }

    /// An open file description this image inherited (exec) from an image
    /// that opened it on a shared daemon: `node` and `fh` as that image got
    /// them, the handle anchored in the daemon (see
    /// [`crate::Backend::anchor`]), `description` the kernel file holding
    /// the offset (see [`OpenFile::share`]).
    pub fn adopt(
        self: &Arc<Vfs>,
        node: NodeId,
        fh: u64,
        flags: i32,
        path: Vec<u8>,
        description: File,
    ) -> Arc<OpenFile> {
        let f = OpenFile::new(self.clone(), node, Some(fh), FileType::Regular, flags, path).with(|f| {
            f.anchored = AtomicBool::new(true);
            f.pinned = false;
        });
        let _ = f.shared.set(description);
        Arc::new(f)
    }

    /// An open of a walked node whose descriptor the kernel serves alone,
    /// without the file system's `open`: a FIFO or device node opened as a
    /// kernel node (the file system has no I/O to give for them, and a
    /// FIFO's open must wait for its peer in the caller, never in a
    /// daemon), or a descriptor of a backing file that this image inherited
    /// across exec. The open file is [`OpenFile::kernel_backed`] and holds
    /// no handle; its node stays pinned while it is open, so `fstat` gives
    /// the mount's identity.
    pub fn open_in_kernel(self: &Arc<Vfs>, node: NodeId, kind: FileType, flags: i32, path: Vec<u8>) -> Arc<OpenFile> {
        self.pin(node);
        self.kernel_file(node, kind, flags, path, false)
    }

    /// A file the kernel opened beneath the mount's namespace map (see
    /// `shortfuse::namespace`): the program's descriptor is the backing
    /// file's own, and the file system never saw the open, so there is no
    /// node or handle. It is [`OpenFile::kernel_backed`]; what needs the
    /// file's identity in the mount ([`OpenFile::stat`], a walk from its
    /// descriptor) takes the path it was opened by. `kind`: `None` when
    /// the caller does not know yet what it opened (see
    /// [`OpenFile::kind_known`]).
    pub fn open_beneath_map(self: &Arc<Vfs>, kind: Option<FileType>, flags: i32, path: Vec<u8>) -> Arc<OpenFile> {
        let f = self.kernel_file(NodeId(0), kind.unwrap_or(FileType::Regular), flags, path, true);
        if kind.is_none() {
            f.forget_kind();
        }
        f
    }

    /// A kernel-backed open file without a handle: on a pinned `node`, or
    /// beneath the namespace map (no node).
    fn kernel_file(
        self: &Arc<Vfs>,
        node: NodeId,
        kind: FileType,
        flags: i32,
        path: Vec<u8>,
        beneath_map: bool,
    ) -> Arc<OpenFile> {
        Arc::new(OpenFile::new(self.clone(), node, None, kind, flags, path).with(|f| {
            f.noflush = true;
            f.kernel = AtomicBool::new(true);
            f.pinned = !beneath_map;
            f.beneath_map = beneath_map;
            // An O_PATH descriptor the kernel opened: no I/O, no locks.
            f.path_only = beneath_map && flags & libc::O_PATH != 0;
        }))
    }

    fn remember_created(&self, parent: NodeId, name: &[u8], e: &crate::client::EntryOut) {
        self.remember(parent, name, e);
    }
}

/// Whether `attr`'s owner, group and mode bits let `caller` open with
/// access mode `acc` (root may always).
fn permits(attr: &Attr, caller: &crate::client::Caller, acc: i32) -> bool {
    if caller.uid == 0 {
        return true;
    }
    let shift = if attr.uid == caller.uid {
        6
    } else if caller.in_group(attr.gid) {
        3
    } else {
        0
    };
    let bits = (attr.mode >> shift) & 0o7;
    let need = match acc {
        libc::O_RDONLY => 0o4,
        libc::O_WRONLY => 0o2,
        _ => 0o6,
    };
    bits & need == need
}
