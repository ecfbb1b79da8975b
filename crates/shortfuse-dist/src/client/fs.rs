//! The distfs client as a [`Filesystem`]: each request turned into the
//! server's, through the leases and the block cache.

use shortfuse::sync::lock;
use shortfuse::sync::Unpoison;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use shortfuse::{
    Attr, Created, DirSink, Entry, Errno, FileHandle, FileType, Filesystem, FopenFlags, InitConfig, NewNode, NodeId,
    OpenFlags, Opened, ReleaseArgs, RenameFlags, ReplyAttr, ReplyWrite, Request, Result, SetAttr, SetTime, Statfs,
    Timestamp, WriteArgs,
};

use super::config::Consistency;
use super::io::At;
use super::{DistFs, FileState};
use crate::proto::{AttrChange, LeaseMode, NewKind, NodeAttr, NodeInfo, Reply, Request as Req, WireTime, NO_LEASE};

pub(super) fn to_ts((sec, nsec): (i64, u32)) -> Timestamp {
    Timestamp { sec, nsec }
}

pub(super) fn to_attr(ino: u64, a: &NodeAttr, block_size: u32) -> Attr {
    Attr {
        ino,
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: to_ts(a.atime),
        mtime: to_ts(a.mtime),
        ctime: to_ts(a.ctime),
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: block_size,
    }
}

pub(super) fn node_reply(r: Reply) -> Result<NodeInfo> {
    match r {
        Reply::Node(n) => Ok(n),
        _ => Err(Errno::EPROTO),
    }
}

/// A short count, or `EAGAIN` when nothing was done: the caller goes on.
/// A name as the server takes it; longer than a directory entry can be is
/// ENAMETOOLONG, as on a local file system (not ENOENT from the server).
pub(super) fn name_bytes(name: &OsStr) -> Result<Vec<u8>> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(name.as_bytes().to_vec())
}

pub(super) const NAME_MAX: usize = 255;

pub(super) fn partial(done: u64) -> Result<usize> {
    if done == 0 {
        Err(Errno::EAGAIN)
    } else {
        Ok(done as usize)
    }
}

pub(super) fn wire_time(t: SetTime) -> WireTime {
    match t {
        SetTime::Now => WireTime::Now,
        SetTime::At(t) => WireTime::At(t.sec, t.nsec),
    }
}

impl super::Inner {
    /// Clears set-user-ID and set-group-ID as a native write by a user
    /// without CAP_FSETID does ([`Request::setid_bits_to_clear`]): the kernel asks for
    /// it on such writes (`FUSE_WRITE_KILL_SUIDGID`, always set for direct
    /// I/O, which distfs uses). Costs a round trip to the server per such
    /// write; root's writes do not ask.
    fn kill_suidgid(&self, req: &Request, node: NodeId) -> Result<()> {
        let attr = node_reply(self.call(Req::GetAttr { ino: node.0 })?)?.attr;
        let mode = attr.mode;
        let kill = req.setid_bits_to_clear(mode, attr.gid);
        if mode & libc::S_IFMT != libc::S_IFREG || kill == 0 {
            return Ok(());
        }
        let change = AttrChange {
            mode: Some(mode & 0o7777 & !kill),
            ..AttrChange::default()
        };
        node_reply(self.call(Req::SetAttr {
            ino: node.0,
            change,
            lease: None,
        })?)
        .map(|_| ())
    }

    /// Where a write of `args` starts, set-id bits cleared first if the
    /// kernel asks.
    pub(super) fn write_start(&self, req: &Request, node: NodeId, args: &WriteArgs) -> Result<At> {
        if args.write_flags & shortfuse::abi::FUSE_WRITE_KILL_SUIDGID != 0 {
            self.kill_suidgid(req, node)?;
        }
        // An append goes where the file ends when it is written, which
        // others may change meanwhile (the kernel's idea of the end is
        // stale with direct I/O); the rest of a long one follows it.
        Ok(if args.flags.contains(OpenFlags::APPEND) {
            At::End
        } else {
            At::Offset(args.offset)
        })
    }

    /// Writes `data[*done..]` from `at`, moving both on as it goes.
    pub(super) fn write_all(&self, ino: u64, at: &mut At, data: &[u8], done: &mut usize) -> Result<()> {
        while *done < data.len() {
            match self.write(ino, *at, &data[*done..]) {
                Ok((offset, n)) => {
                    *done += n;
                    *at = At::Offset(offset + n as u64);
                }
                Err(Errno::EAGAIN) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// SETATTR (see [`super::later`] for why it is here).
    pub(super) fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        let inner = self;
        let f = inner.file(node.0)?;
        let chown = set.uid.is_some() || set.gid.is_some() || set.is_empty();
        let mut mode = set.mode;
        if mode.is_none() && (set.kill_suidgid || chown) {
            let attr = node_reply(inner.call(Req::GetAttr { ino: node.0 })?)?.attr;
            let bits = attr.mode & 0o7777;
            let kill = if attr.mode & libc::S_IFMT == libc::S_IFDIR {
                0
            } else if chown {
                // chown, even by root and to the same owner: set-user-ID,
                // and set-group-ID when group-executable.
                bits & (libc::S_ISUID | if bits & libc::S_IXGRP != 0 { libc::S_ISGID } else { 0 })
            } else {
                req.setid_bits_to_clear(bits, attr.gid)
            };
            if kill != 0 {
                mode = Some(bits & !kill);
            }
        }
        let mut change = AttrChange {
            mode,
            uid: set.uid,
            gid: set.gid,
            size: set.size,
            atime: set.atime.map(wire_time),
            mtime: set.mtime.map(wire_time),
        };
        let info = match set.size {
            Some(size) => inner.truncate(&f, size, change)?,
            None => {
                if change.mtime.is_some() {
                    // An explicit mtime must not be overwritten by a later
                    // write-back of an older one.
                    let written = inner.with_lease(&f, LeaseMode::Write, |conn, slot| {
                        inner.write_back(&f, conn, slot.id, false)
                    });
                    // Not done on a worker: done again on another thread.
                    if let Err(e @ super::later::MUST_WAIT) = written {
                        return Err(e);
                    }
                }
                change.size = None;
                node_reply(inner.call(Req::SetAttr {
                    ino: node.0,
                    change,
                    lease: None,
                })?)?
            }
        };
        let mut attr = info.attr;
        inner.overlay(&f, &mut attr);
        Ok(to_attr(node.0, &attr, inner.bs() as u32))
    }
}

impl Filesystem for DistFs {
    fn init(&self, config: &mut InitConfig) -> Result<()> {
        // Direct I/O keeps reads and writes under the leases; mmap still
        // works through the kernel's pages (coherent across clients only
        // as far as close-to-open, as on NFS).
        if self.inner.cfg.caches_pages() {
            // Read-only opens read through the page cache, emptied before
            // a lease goes (see the module docs, "Kernel page cache"): no
            // attribute of a regular file is trusted outside a lease, no
            // read asks for attributes while within the size, and no
            // shared writable mapping makes dirty pages.
            config.file_attr_timeout = Some(std::time::Duration::ZERO);
            config.want &= !shortfuse::abi::FUSE_AUTO_INVAL_DATA;
            // Read-ahead READs in the background would still hold pages
            // locked after the read that started them returned; a
            // notification sent while this client's next request is served
            // (an upgrade, see `lock_dropping_pages`) would wait for them.
            config.want &= !shortfuse::abi::FUSE_ASYNC_READ;
            // A truncation at open comes as SETATTR, which a worker may
            // hand on (see `super::later`); OPEN may not.
            config.want &= !shortfuse::abi::FUSE_ATOMIC_O_TRUNC;
            if self.inner.notifier.set(config.notifier.clone()).is_ok() {
                let inner = Arc::downgrade(&self.inner);
                std::thread::Builder::new()
                    .name("distfs-pages".into())
                    .spawn(move || super::Inner::watch_leases(inner))
                    .map_err(Errno::from)?;
            }
        } else {
            config.want |= config.kernel_flags & shortfuse::abi::flags::FUSE_DIRECT_IO_ALLOW_MMAP;
        }
        // Set-id bits are cleared here (setattr and write): the kernel's
        // own clearing for file systems without HANDLE_KILLPRIV_V2 keeps a
        // set-group-ID bit without group execution, which ext4 clears when
        // the truncating caller is not in the file's group.
        config.want |= config.kernel_flags & shortfuse::abi::FUSE_HANDLE_KILLPRIV_V2;
        self.inner.conn().map(|_| ())
    }

    fn destroy(&self) {
        let _ = self.inner.shutdown();
    }

    fn figures(&self) -> Option<Arc<dyn shortfuse::stats::Figures>> {
        Some(self.inner.figures.clone())
    }

    fn lookup(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        let info = node_reply(self.inner.call(Req::Lookup {
            parent: parent.0,
            name: name_bytes(name)?,
        })?)?;
        Ok(self.inner.entry(&info))
    }

    fn getattr(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>) -> Result<Attr> {
        let inner = &self.inner;
        let f = inner.file(node.0)?;
        let attr = if f.kind == libc::S_IFREG {
            // Size and mtime are data: under a read lease nobody else has
            // unwritten changes; under our write lease ours are newest.
            inner.with_lease(&f, LeaseMode::Read, |conn, _| {
                let mut attr = node_reply(conn.call(Req::GetAttr { ino: node.0 })?)?.attr;
                let c = lock(&f.cache);
                if c.meta_dirty {
                    attr.size = c.size;
                    attr.mtime = c.mtime;
                    attr.ctime = attr.ctime.max(c.mtime);
                }
                Ok(attr)
            })?
        } else {
            node_reply(inner.call(Req::GetAttr { ino: node.0 })?)?.attr
        };
        Ok(to_attr(node.0, &attr, inner.bs() as u32))
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        self.inner.setattr(req, node, set)
    }

    fn setattr_deferred(&self, req: &Request, node: NodeId, set: &SetAttr, reply: ReplyAttr) {
        self.setattr_later(req, node, set, reply)
    }

    fn readlink(&self, _req: &Request, node: NodeId) -> Result<Vec<u8>> {
        match self.inner.call(Req::Readlink { ino: node.0 })? {
            Reply::Data(d) => Ok(d),
            _ => Err(Errno::EPROTO),
        }
    }

    fn symlink(&self, req: &Request, parent: NodeId, name: &OsStr, target: &OsStr) -> Result<Entry> {
        self.create_node(
            req,
            parent,
            name,
            NewKind::Symlink {
                target: target.as_bytes().to_vec(),
            },
            libc::S_IFLNK | 0o777,
            false,
        )
    }

    fn mknod(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        self.create_node(req, parent, name, NewKind::Node { rdev: new.rdev }, new.mode, false)
    }

    fn mkdir(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        self.create_node(
            req,
            parent,
            name,
            NewKind::Dir,
            libc::S_IFDIR | (new.mode & 0o7777),
            false,
        )
    }

    fn unlink(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.inner
            .call(Req::Unlink {
                parent: parent.0,
                name: name_bytes(name)?,
            })
            .map(|_| ())
    }

    fn rmdir(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        self.inner
            .call(Req::Rmdir {
                parent: parent.0,
                name: name_bytes(name)?,
            })
            .map(|_| ())
    }

    fn rename(
        &self,
        _req: &Request,
        parent: NodeId,
        name: &OsStr,
        new_parent: NodeId,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.whiteout {
            return Err(Errno::EINVAL);
        }
        self.inner
            .call(Req::Rename {
                parent: parent.0,
                name: name_bytes(name)?,
                new_parent: new_parent.0,
                new_name: name_bytes(new_name)?,
                flags: flags.raw(),
            })
            .map(|_| ())
    }

    fn link(&self, _req: &Request, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Entry> {
        let info = node_reply(self.inner.call(Req::Link {
            ino: node.0,
            new_parent: new_parent.0,
            new_name: name_bytes(new_name)?,
        })?)?;
        Ok(self.inner.entry(&info))
    }

    fn open(&self, _req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened> {
        let f = self.inner.file(node.0)?;
        {
            // The connection first: `Inner::conn` takes `opens` under its
            // own lock when it starts a new session.
            let conn = self.inner.conn()?;
            let mut opens = lock(&f.opens);
            if *opens == 0 {
                conn.call(Req::Open { ino: node.0 })?;
            }
            *opens += 1;
        }
        if flags.contains(OpenFlags::TRUNC) {
            // The kernel sends O_TRUNC here only with atomic_o_trunc (asked
            // for unless -o page_cache); a SETATTR does it otherwise.
            let r = self.inner.truncate(
                &f,
                0,
                AttrChange {
                    size: Some(0),
                    ..AttrChange::default()
                },
            );
            if let Err(e) = r {
                // No handle: the kernel sends no release for it.
                self.close(&f);
                return Err(e);
            }
        }
        let mut opened = self.opened();
        if self.inner.caches_pages() && f.kind == libc::S_IFREG && flags.access_mode() == OpenFlags::RDONLY {
            // Pages kept from an earlier open were read under a lease held
            // since: each lease empties them before it goes.
            opened.flags.direct_io = false;
            opened.flags.keep_cache = true;
        }
        Ok(opened)
    }

    fn create(&self, req: &Request, parent: NodeId, name: &OsStr, new: &NewNode, _flags: OpenFlags) -> Result<Created> {
        let entry = self.create_node(req, parent, name, NewKind::Node { rdev: 0 }, new.mode, true)?;
        *lock(&self.inner.file(entry.node.0)?.opens) += 1;
        Ok(Created {
            entry,
            opened: self.opened(),
        })
    }

    fn read(&self, _req: &Request, node: NodeId, _fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        // A short count that is not end of file happens only when the cache
        // bound dropped a block mid-copy: finish the request.
        let mut done = 0;
        while done < buf.len() {
            match self.inner.read(node.0, offset + done as u64, &mut buf[done..]) {
                Ok(r) => {
                    done += r.len;
                    if r.eof || r.len == 0 {
                        break;
                    }
                }
                Err(Errno::EAGAIN) => continue,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    fn write(&self, req: &Request, node: NodeId, _fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        let mut at = self.inner.write_start(req, node, args)?;
        let mut done = 0;
        let r = self.inner.write_all(node.0, &mut at, data, &mut done);
        super::later::written(done, r)
    }

    fn write_deferred(
        &self,
        req: &Request,
        node: NodeId,
        _fh: FileHandle,
        data: &[u8],
        args: &WriteArgs,
        reply: ReplyWrite,
    ) {
        self.write_later(req, node, data, args, reply)
    }

    fn answers_later(&self) -> bool {
        // Only changes that must wait for the kernel go to another thread
        // (see [`super::later`]).
        self.inner.cfg.caches_pages()
    }

    fn flush(&self, _req: &Request, node: NodeId, _fh: FileHandle, _lock_owner: u64) -> Result<()> {
        // Data stays cached under the lease; only a loss is reported.
        // Without leases, close is when others may see the data (as in
        // NFS's and JuiceFS's close-to-open).
        let f = self.inner.file(node.0)?;
        if self.inner.cfg.consistency == Consistency::Weak {
            let conn = self.inner.conn()?;
            let g = f.lease.read().unpoison();
            if g.mode.is_some() {
                self.inner.write_back(&f, &conn, NO_LEASE, false)?;
            }
        }
        if std::mem::take(&mut lock(&f.cache).lost) {
            return Err(Errno::EIO);
        }
        Ok(())
    }

    fn release(&self, _req: &Request, node: NodeId, _fh: FileHandle, _args: &ReleaseArgs) -> Result<()> {
        // The table's guard goes before `close` asks for the connection:
        // a new session holds the connection's slot while it reads the
        // table (see "Lock order" in the module docs).
        let f = lock(&self.inner.files).get(&node.0).cloned();
        if let Some(f) = f {
            self.close(&f);
        }
        Ok(())
    }

    fn fsync(&self, _req: &Request, node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        self.inner.fsync(node.0)
    }

    fn readdir(&self, _req: &Request, node: NodeId, fh: FileHandle, offset: u64, sink: &mut dyn DirSink) -> Result<()> {
        let taken = lock(&self.listings).get(&fh.0).cloned();
        let entries = match taken {
            Some(e) if offset != 0 => e,
            _ => {
                let e = match self.inner.call(Req::ReadDir { ino: node.0 })? {
                    Reply::Entries(e) => Arc::new(e),
                    _ => return Err(Errno::EPROTO),
                };
                if fh.0 != 0 {
                    lock(&self.listings).insert(fh.0, e.clone());
                }
                e
            }
        };
        for (k, e) in entries.iter().enumerate().skip(offset as usize) {
            let typ = FileType::from_mode(e.kind);
            if !sink.add(e.ino, k as u64 + 1, typ, OsStr::from_bytes(&e.name)) {
                break;
            }
        }
        Ok(())
    }

    fn opendir(&self, _req: &Request, _node: NodeId, _flags: OpenFlags) -> Result<Opened> {
        Ok(Opened::handle(self.next_dir.fetch_add(1, Ordering::Relaxed)))
    }

    fn releasedir(&self, _req: &Request, _node: NodeId, fh: FileHandle, _flags: OpenFlags) -> Result<()> {
        lock(&self.listings).remove(&fh.0);
        Ok(())
    }

    fn fsyncdir(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        // Every name-space change is already on the server when answered.
        Ok(())
    }

    fn statfs(&self, _req: &Request, _node: NodeId) -> Result<Statfs> {
        match self.inner.call(Req::Statfs)? {
            Reply::Statfs {
                blocks,
                bfree,
                files,
                ffree,
                bsize,
            } => Ok(Statfs {
                blocks,
                bfree,
                bavail: bfree,
                files,
                ffree,
                bsize,
                namelen: NAME_MAX as u32,
                frsize: bsize,
            }),
            _ => Err(Errno::EPROTO),
        }
    }
}

impl DistFs {
    fn opened(&self) -> Opened {
        Opened {
            flags: FopenFlags {
                direct_io: self.inner.cfg.direct_io,
                ..FopenFlags::default()
            },
            ..Opened::default()
        }
    }

    /// Drops one open of `f`; the last tells the server, without waiting
    /// (the server takes opens and closes in order). A failure to tell it
    /// (connection lost) is harmless: the session's end closes.
    fn close(&self, f: &FileState) {
        let conn = self.inner.conn();
        let mut opens = lock(&f.opens);
        *opens = opens.saturating_sub(1);
        if let (0, Ok(conn)) = (*opens, conn) {
            let _ = conn.send(Req::Close { ino: f.gfi.ino });
        }
    }

    fn create_node(
        &self,
        req: &Request,
        parent: NodeId,
        name: &OsStr,
        kind: NewKind,
        mode: u32,
        open: bool,
    ) -> Result<Entry> {
        let info = node_reply(self.inner.call(Req::Create {
            parent: parent.0,
            name: name_bytes(name)?,
            kind,
            mode,
            uid: req.uid,
            gid: req.gid,
            open,
        })?)?;
        Ok(self.inner.entry(&info))
    }
}
