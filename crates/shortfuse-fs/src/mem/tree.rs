//! Changing the tree: making and removing names, truncating, writing,
//! and freeing nodes nobody holds.

use shortfuse::sync::Unpoison;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use shortfuse::{
    Attr, Entry, Errno, FileHandle, FileType, NewNode, NodeId, OpenFlags, Request, Result, SetTime, Timestamp,
    WriteArgs,
};

use super::data::BLOCK;
use super::dir::Dir;

use crate::xattr::Xattrs;

use super::inode::{Content, Inode, NodeSpec, State, Table};
use super::{MemFs, FAST_SYMLINK_MAX, MAX_FILE_SIZE, NAME_MAX};
use shortfuse::abi::FUSE_WRITE_KILL_SUIDGID;

pub(super) fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if b.is_empty() || b.contains(&b'/') || b.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

pub(super) fn is_dot(name: &OsStr) -> bool {
    name == "." || name == ".."
}

pub(super) fn set_time(t: SetTime, now: Timestamp) -> Timestamp {
    match t {
        SetTime::Now => now,
        SetTime::At(t) => t,
    }
}

pub(super) fn read_guard(l: &RwLock<Table>) -> RwLockReadGuard<'_, Table> {
    l.read().unpoison()
}

pub(super) fn write_guard(l: &RwLock<Table>) -> RwLockWriteGuard<'_, Table> {
    l.write().unpoison()
}

pub(super) fn node_of(table: &Table, ino: u64) -> Result<Arc<Inode>> {
    table.get(&ino).cloned().ok_or(Errno::ESTALE)
}

impl MemFs {
    pub(super) fn get(&self, node: NodeId) -> Result<Arc<Inode>> {
        node_of(&read_guard(&self.table), node.0)
    }

    pub(super) fn attr(ino: u64, st: &State) -> Attr {
        let (size, blocks) = match &st.content {
            Content::File(f) => (st.size, f.block_count() * (BLOCK / 512)),
            // A removed directory is emptied to size 0 as ext4 does.
            Content::Dir(d) if st.nlink == 0 => (0, 0),
            Content::Dir(d) => (d.size, d.size / 512),
            Content::Symlink(t) if t.len() < FAST_SYMLINK_MAX => (t.len() as u64, 0),
            Content::Symlink(t) => (t.len() as u64, BLOCK / 512),
            Content::Special => (0, 0),
        };
        Attr {
            ino,
            size,
            blocks,
            atime: st.atime,
            mtime: st.mtime,
            ctime: st.ctime,
            mode: st.mode,
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            rdev: st.rdev,
            blksize: BLOCK as u32,
        }
    }

    pub(super) fn entry(&self, ino: u64, st: &State) -> Entry {
        Entry {
            node: NodeId(ino),
            generation: self.generation,
            attr: MemFs::attr(ino, st),
            ttl: None,
        }
    }

    /// Takes a lookup on `ino` and returns its entry.
    pub(super) fn take_lookup(&self, inode: &Inode) -> Entry {
        let mut st = inode.lock();
        st.lookups += 1;
        self.entry(inode.ino, &st)
    }

    /// Removes `ino` from the table if it is free. Takes the table write
    /// lock unless the caller holds it (`table`).
    pub(super) fn free_if_unused(&self, inode: &Arc<Inode>, table: Option<&mut Table>) {
        if inode.ino == NodeId::ROOT.0 || !inode.lock().is_free() {
            return;
        }
        let mut own;
        let table = match table {
            Some(t) => t,
            None => {
                own = write_guard(&self.table);
                &mut own
            }
        };
        // Checked again under the table lock: a lookup may have come in.
        if inode.lock().is_free() {
            table.remove(&inode.ino);
        }
    }

    /// Creates a new inode named `name` in `parent`; the body shared by
    /// mknod, mkdir, symlink and create.
    pub(super) fn make_node(&self, req: &Request, parent: NodeId, name: &OsStr, spec: NodeSpec) -> Result<Entry> {
        let NodeSpec {
            mode,
            rdev,
            content,
            opened,
        } = spec;
        check_name(name)?;
        let mut table = write_guard(&self.table);
        let dir_inode = node_of(&table, parent.0)?;
        let mut dir = dir_inode.lock();
        dir.dir()?;
        if dir.nlink == 0 {
            // Created in a removed directory (the VFS answers the same).
            return Err(Errno::ENOENT);
        }
        if is_dot(name) || dir.dir()?.get(name).is_some() {
            return Err(Errno::EEXIST);
        }
        dir.check(req, (libc::W_OK | libc::X_OK) as u32)?;
        let typ = FileType::from_mode(mode);
        let is_dir = typ == FileType::Directory;
        let mut mode = mode;
        let gid = if dir.mode & libc::S_ISGID != 0 {
            if is_dir {
                mode |= libc::S_ISGID;
            }
            dir.gid
        } else {
            req.gid
        };
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        let now = Timestamp::now();
        let content = match content {
            Content::Dir(_) => Content::Dir(Dir::new(parent.0)),
            c => c,
        };
        let st = State {
            mode,
            nlink: if is_dir { 2 } else { 1 },
            uid: req.uid,
            gid,
            rdev,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            lookups: 1,
            opens: u64::from(opened),
            xattrs: Xattrs::default(),
            content,
        };
        let entry = self.entry(ino, &st);
        let inode = Arc::new(Inode {
            ino,
            typ,
            usage: self.usage.clone(),
            state: Mutex::new(st),
        });
        dir.dir_mut()?.insert(name, ino, typ);
        if is_dir {
            dir.nlink += 1;
        }
        dir.touch_modified(now);
        drop(dir);
        table.insert(ino, inode);
        Ok(entry)
    }

    /// Applies a mode given by the caller of mknod/mkdir/create: the umask
    /// (idempotent when the kernel already applied it) and the type.
    pub(super) fn new_mode(new: &NewNode, typ_bits: u32) -> u32 {
        typ_bits | (new.mode & 0o7777 & !new.umask)
    }

    pub(super) fn truncate_locked(&self, st: &mut State, size: u64, now: Timestamp) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        match &mut st.content {
            Content::File(f) => {
                if size < st.size {
                    self.usage.add(f.truncate(size));
                } else {
                    f.grow(size)?;
                }
                st.size = size;
                // ext4 moves mtime and ctime at every truncation, to the
                // same size too.
                st.touch_modified(now);
                Ok(())
            }
            Content::Dir(_) => Err(Errno::EISDIR),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Walks up from `start` to the root; true when `ancestor` is met.
    pub(super) fn is_within(table: &Table, start: u64, ancestor: u64) -> bool {
        let mut cur = start;
        loop {
            if cur == ancestor {
                return true;
            }
            if cur == NodeId::ROOT.0 {
                return false;
            }
            let Some(inode) = table.get(&cur) else { return false };
            let next = match inode.lock().dir() {
                Ok(d) => d.parent,
                Err(_) => return false,
            };
            if next == cur {
                return false;
            }
            cur = next;
        }
    }

    pub(super) fn dir_entry_of(table: &Table, parent: u64, name: &OsStr) -> Result<(Arc<Inode>, Arc<Inode>)> {
        let dir = node_of(table, parent)?;
        let child = {
            let st = dir.lock();
            st.dir()?.get(name).map(|e| e.ino).ok_or(Errno::ENOENT)?
        };
        let child = node_of(table, child)?;
        Ok((dir, child))
    }

    pub(super) fn remove_name(&self, req: &Request, parent: NodeId, name: &OsStr, want_dir: bool) -> Result<()> {
        check_name(name)?;
        if want_dir && name == "." {
            return Err(Errno::EINVAL);
        }
        if want_dir && name == ".." {
            return Err(Errno::ENOTEMPTY);
        }
        let mut table = write_guard(&self.table);
        let (dir, child) = MemFs::dir_entry_of(&table, parent.0, name)?;
        // The VFS order: permission, then sticky bit, then type.
        let child_uid = child.lock().uid;
        {
            let d = dir.lock();
            d.check(req, (libc::W_OK | libc::X_OK) as u32)?;
            if !d.sticky_allows(req, child_uid) {
                return Err(Errno::EPERM);
            }
        }
        {
            let st = child.lock();
            match (want_dir, st.is_dir()) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !st.dir()?.is_empty() => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        let now = Timestamp::now();
        {
            let mut d = dir.lock();
            d.dir_mut()?.remove(name);
            if want_dir {
                d.nlink -= 1;
            }
            d.touch_modified(now);
        }
        {
            let mut st = child.lock();
            st.nlink = if want_dir { 0 } else { st.nlink.saturating_sub(1) };
            st.ctime = now;
        }
        self.free_if_unused(&child, Some(&mut table));
        Ok(())
    }

    pub(super) fn file_op<T>(&self, node: NodeId, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let inode = self.get(node)?;
        let mut st = inode.lock();
        f(&mut st)
    }

    /// Drops one open handle and frees the inode if that was the last use.
    pub(super) fn drop_open(&self, node: NodeId) {
        let Ok(inode) = self.get(node) else { return };
        {
            let mut st = inode.lock();
            st.opens = st.opens.saturating_sub(1);
        }
        self.free_if_unused(&inode, None);
    }

    pub(super) fn new_handle(&self) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    pub(super) fn write_locked(&self, req: &Request, st: &mut State, data: &[u8], args: &WriteArgs) -> Result<usize> {
        let Content::File(f) = &mut st.content else {
            return Err(Errno::EBADF);
        };
        let offset = if args.flags.contains(OpenFlags::APPEND) {
            st.size
        } else {
            args.offset
        };
        if data.is_empty() {
            return Ok(0);
        }
        if offset >= MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let len = (data.len() as u64).min(MAX_FILE_SIZE - offset) as usize;
        self.usage.add(f.write(offset, &data[..len])?);
        st.size = st.size.max(offset + len as u64);
        st.touch_modified(Timestamp::now());
        if args.write_flags & FUSE_WRITE_KILL_SUIDGID != 0 {
            st.kill_suidgid_for(req);
        }
        Ok(len)
    }
}
