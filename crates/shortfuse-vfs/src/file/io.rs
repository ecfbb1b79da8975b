//! Reads, writes, seeks, directory streams and the other calls made
//! through an open file.

use std::sync::Arc;

use shortfuse::{Attr, Errno, FileHandle, FileType, SetAttr};

use super::listing::put_dirent;
use super::{accmode, OpenFile};
use crate::maps::io_errno;

impl OpenFile {
    /// `pread(2)`: reads until `buf` is full or end of file.
    pub fn pread(&self, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
        let fh = self.readable()?;
        self.read_at(fh, buf, offset)
    }

    fn read_at(&self, fh: Option<u64>, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
        if let Some(m) = self.mapped() {
            // DataMap fast path: the backing files, not the file system.
            return m.map.read_at(offset, buf).map_err(io_errno);
        }
        let fh = fh.ok_or(Errno::EBADF)?;
        match self.page_cache() {
            // O_DIRECT reads ask the file system (writes keep the pages right).
            Some(pc) if self.flags() & libc::O_DIRECT == 0 => {
                pc.read(self.node, offset, buf, |off, b| self.read_direct(fh, b, off))
            }
            _ => self.read_direct(fh, buf, offset),
        }
    }

    /// The page cache for this file's data: a regular file without a data map.
    pub(super) fn page_cache(&self) -> Option<&crate::PageCache> {
        self.vfs
            .page_cache()
            .filter(|_| self.file_type() == FileType::Regular && self.map.is_none())
    }

    /// READs (of at most `max_io` each) until `buf` is full or end of file.
    fn read_direct(&self, fh: u64, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
        let max = self.vfs.max_io();
        let mut done = 0;
        while done < buf.len() {
            let end = buf.len().min(done + max);
            let n = self
                .vfs
                .client()
                .read(self.node, fh, offset + done as u64, &mut buf[done..end], self.flags())?;
            done += n;
            if n < end - (done - n) {
                break;
            }
        }
        Ok(done)
    }

    /// `read(2)` at the shared offset.
    pub fn read(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        let fh = self.readable()?;
        let mut pos = self.pos();
        let at = self.load(&mut pos);
        let n = self.read_at(fh, buf, at)?;
        self.store(&mut pos, at + n as u64);
        Ok(n)
    }

    /// `pwrite(2)`. As on Linux, O_APPEND appends whatever the offset.
    pub fn pwrite(&self, data: &[u8], offset: u64) -> Result<usize, Errno> {
        let fh = self.writable()?;
        let offset = if self.flags() & libc::O_APPEND != 0 {
            self.size()?
        } else {
            offset
        };
        self.write_at(fh, data, offset)
    }

    fn size(&self) -> Result<u64, Errno> {
        Ok(self.vfs.getattr_fresh(self.node, self.fh)?.size)
    }

    fn write_at(&self, fh: Option<u64>, data: &[u8], offset: u64) -> Result<usize, Errno> {
        if let Some(m) = self.mapped() {
            match m.map.write_at(offset, data) {
                Ok(n) => {
                    self.vfs.invalidate_attr(self.node);
                    return Ok(n);
                }
                // Past what the map covers (EFBIG) or a backing file not
                // open for writing: the file system grows or writes it.
                Err(_) if fh.is_some() => {}
                Err(e) => return Err(io_errno(e)),
            }
        }
        let fh = fh.ok_or(Errno::EBADF)?;
        let max = self.vfs.max_io();
        let mut done = 0;
        let result = loop {
            if done == data.len() {
                break Ok(done);
            }
            let end = data.len().min(done + max);
            match self
                .vfs
                .client()
                .write(self.node, fh, offset + done as u64, &data[done..end], self.flags())
            {
                Ok(0) => break Ok(done),
                Ok(n) => done += n,
                Err(e) if done > 0 => {
                    let _ = e;
                    break Ok(done);
                }
                Err(e) => break Err(e),
            }
        };
        self.vfs.invalidate_attr(self.node);
        if let (Some(pc), Ok(n)) = (self.page_cache(), &result) {
            // Write-through: the file system has it, the pages follow.
            pc.wrote(self.node, offset, &data[..*n]);
        }
        result
    }

    /// `write(2)` at the shared offset, or at the end with O_APPEND.
    pub fn write(&self, data: &[u8]) -> Result<usize, Errno> {
        let fh = self.writable()?;
        let mut pos = self.pos();
        let at = if self.flags() & libc::O_APPEND != 0 {
            self.size()?
        } else {
            self.load(&mut pos)
        };
        let n = self.write_at(fh, data, at)?;
        self.store(&mut pos, at + n as u64);
        Ok(n)
    }

    /// `lseek(2)`.
    pub fn lseek(&self, offset: i64, whence: i32) -> Result<u64, Errno> {
        if self.is_path() {
            return Err(Errno::EBADF);
        }
        let mut pos = self.pos();
        let cur = self.load(&mut pos);
        let new = match whence {
            libc::SEEK_SET => offset,
            libc::SEEK_CUR => (cur as i64).checked_add(offset).ok_or(Errno::EOVERFLOW)?,
            libc::SEEK_END if self.file_type() != FileType::Directory => {
                (self.size()? as i64).checked_add(offset).ok_or(Errno::EOVERFLOW)?
            }
            libc::SEEK_DATA | libc::SEEK_HOLE if self.file_type() == FileType::Regular => {
                if offset < 0 {
                    return Err(Errno::ENXIO);
                }
                let asked = match self.fh {
                    Some(fh) => self.vfs.client().lseek(self.node, fh, offset as u64, whence),
                    None => Err(Errno::ENOSYS),
                };
                match asked {
                    Ok(o) => o as i64,
                    Err(e) if e == Errno::ENOSYS => {
                        // The kernel's generic answer: all data, a hole at the end.
                        let size = self.size()?;
                        if offset as u64 >= size {
                            return Err(Errno::ENXIO);
                        }
                        if whence == libc::SEEK_DATA {
                            offset
                        } else {
                            size as i64
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            _ => return Err(Errno::EINVAL),
        };
        if new < 0 {
            return Err(Errno::EINVAL);
        }
        self.store(&mut pos, new as u64);
        Ok(new as u64)
    }

    /// `getdents64(2)`: fills `buf` with `struct linux_dirent64` records.
    /// Returns 0 at the end of the directory.
    pub fn getdents64(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        let fh = self.fh.ok_or(Errno::EBADF)?;
        if self.file_type() != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let mut pos = self.pos();
        if let Some(listed) = self.getdents_listed(&mut pos, buf) {
            return listed;
        }
        // At least a page: a READDIR too small for one entry would read as
        // the end of the directory; entries that do not fit are left for
        // the next call.
        let room = buf.len();
        let mut used = 0;
        let mut cookie = pos.cookie;
        let mut too_small = false;
        let mut put = |ino: u64, off: u64, typ: u32, name: &[u8]| {
            if too_small || !put_dirent(buf, &mut used, ino, off, typ, name) {
                too_small = true;
                return;
            }
            cookie = off;
        };
        let client = self.vfs.client();
        if self.vfs.readdirplus() {
            // A READDIRPLUS entry takes about five times a dirent64's room
            // (152 bytes before its name): ask for four times the buffer,
            // so that one round trip still fills it for short names.
            let size = room.saturating_mul(4).clamp(4096, self.vfs.max_io()) as u32;
            let mut entries = Vec::new();
            let got = client.readdirplus(self.node, fh, pos.cookie, size, |entry, ino, off, typ, name| {
                // Every entry the file system counted is recorded, the
                // ones that did not fit in `buf` too: they come again with
                // the next call, counted again.
                if let Some(e) = entry {
                    entries.push((name.to_vec(), e));
                }
                put(ino, off, typ, name);
            });
            for (name, e) in &entries {
                self.vfs.remember_lookup(self.node, name, e);
            }
            got?;
        } else {
            let size = room.clamp(4096, self.vfs.max_io()) as u32;
            client.readdir(self.node, fh, pos.cookie, size, &mut put)?;
        }
        if used == 0 && too_small {
            return Err(Errno::EINVAL);
        }
        pos.cookie = cookie;
        Ok(used)
    }

    /// `ftruncate(2)`.
    pub fn truncate(&self, size: u64) -> Result<(), Errno> {
        if self.path_only {
            return Err(Errno::EBADF);
        }
        let fh = self.fh;
        if self.file_type() != FileType::Regular || accmode(self.flags()) == libc::O_RDONLY {
            return Err(Errno::EINVAL);
        }
        self.vfs.setattr(
            self.node,
            &SetAttr {
                size: Some(size),
                fh: fh.map(FileHandle),
                ..Default::default()
            },
        )?;
        Ok(())
    }

    /// `fsync(2)`/`fdatasync(2)`. ENOSYS from the file system counts as done.
    pub fn fsync(&self, datasync: bool) -> Result<(), Errno> {
        if self.path_only {
            return Err(Errno::EBADF);
        }
        let Some(fh) = self.fh else {
            // An M-Cache open: the data is in the backing files.
            return self.map.as_ref().map_or(Ok(()), |m| sync_backing(&m.map, datasync));
        };
        match self
            .vfs
            .client()
            .fsync(self.node, fh, datasync, self.file_type() == FileType::Directory)
        {
            Err(e) if e == Errno::ENOSYS => Ok(()),
            r => r,
        }
    }

    /// `fallocate(2)`.
    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<(), Errno> {
        let fh = self.writable()?.ok_or(Errno::EOPNOTSUPP)?;
        if self.file_type() != FileType::Regular {
            return Err(Errno::ENODEV);
        }
        let r = match self.vfs.client().fallocate(self.node, fh, offset, len, mode) {
            Err(e) if e == Errno::ENOSYS => Err(Errno::EOPNOTSUPP),
            r => r,
        };
        self.vfs.invalidate_attr(self.node);
        if let Some(pc) = self.page_cache() {
            pc.invalidate(self.node);
        }
        r
    }

    /// SETATTR through this descriptor (fchmod, fchown, futimens).
    ///
    /// The handle goes with it for a file's open only: a directory's is
    /// OPENDIR's, which FATTR_FH does not mean, and the kernel's FUSE
    /// client never sends one. A libfuse 2 daemon (bindfs) would take it
    /// for a file's and answer with the fgetattr of that, EBADF: rsync's
    /// fchmod of each directory it copies failed so.
    pub fn setattr(&self, set: &SetAttr) -> Result<Attr, Errno> {
        let mut set = *set;
        set.fh = self
            .fh
            .filter(|_| self.file_type() != FileType::Directory)
            .map(FileHandle);
        self.vfs.setattr(self.node, &set)
    }

    /// FLUSH: sent on every close of a descriptor. ENOSYS counts as success.
    pub fn flush(&self, lock_owner: u64) -> Result<(), Errno> {
        let Some(fh) = self.fh else { return Ok(()) };
        if !self.needs_flush() {
            return Ok(());
        }
        match self.vfs.client().flush(self.node, fh, lock_owner) {
            Err(e) if e == Errno::ENOSYS => Ok(()),
            r => r,
        }
    }
}

/// fsync/fdatasync of every backing file of a map.
fn sync_backing(map: &shortfuse::DataMap, datasync: bool) -> Result<(), Errno> {
    let mut seen: Vec<&shortfuse::BackingFile> = Vec::new();
    for e in &map.extents {
        if seen.iter().any(|b| Arc::ptr_eq(b, &e.backing)) {
            continue;
        }
        seen.push(&e.backing);
        let f = std::fs::File::from(e.backing.try_clone().map_err(io_errno)?);
        if datasync { f.sync_data() } else { f.sync_all() }.map_err(io_errno)?;
    }
    Ok(())
}
