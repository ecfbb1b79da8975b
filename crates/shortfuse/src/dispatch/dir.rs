//! READDIR and READDIRPLUS: [`DirSink`]/[`DirPlusSink`] implementations
//! that encode `fuse_dirent`/`fuse_direntplus` records straight into the
//! reply buffer, and READDIRPLUS served from `readdir` + `lookup` for file
//! systems that do not implement `readdirplus`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use shortfuse_abi as abi;
use zerocopy::{FromBytes, IntoBytes};

use super::encode;
use crate::errno::{Errno, Result};
use crate::filesystem::Filesystem;
use crate::types::{DirPlusSink, DirSink, Entry, FileHandle, FileType, NodeId, Request};

/// Longest name the kernel accepts in a directory entry (`FUSE_NAME_MAX`);
/// one longer fails the whole READDIR with EIO in the kernel.
const NAME_MAX: usize = 1024;

fn name_ok(name: &[u8]) -> bool {
    if name.is_empty() || name.len() > NAME_MAX || name.contains(&b'/') || name.contains(&0) {
        tracing::warn!(
            "readdir: skipping invalid entry name {:?} (empty, too long, or holds '/' or NUL)",
            String::from_utf8_lossy(name)
        );
        return false;
    }
    true
}

fn push_name(buf: &mut Vec<u8>, name: &[u8], record: usize, start: usize) {
    buf.extend_from_slice(name);
    buf.resize(start + record, 0);
}

/// Encodes `fuse_dirent` records into `buf` until `limit` (absolute length).
pub(crate) struct DirBuf<'a> {
    pub buf: &'a mut Vec<u8>,
    pub limit: usize,
}

impl DirSink for DirBuf<'_> {
    fn add(&mut self, ino: u64, next_offset: u64, typ: FileType, name: &OsStr) -> bool {
        let name = name.as_bytes();
        if !name_ok(name) {
            // Skipping keeps the listing going; stopping would end it here.
            return true;
        }
        let record = abi::fuse_dirent_size(name.len());
        let start = self.buf.len();
        if start + record > self.limit {
            return false;
        }
        let d = abi::fuse_dirent {
            ino,
            off: next_offset,
            namelen: name.len() as u32,
            typ: typ.dirent_type(),
        };
        self.buf.extend_from_slice(d.as_bytes());
        push_name(self.buf, name, record, start);
        true
    }
}

/// Encodes `fuse_direntplus` records into `buf` until `limit`.
pub(crate) struct DirPlusBuf<'a> {
    pub buf: &'a mut Vec<u8>,
    pub limit: usize,
    pub entry_ttl: Duration,
    pub attr_ttl: Duration,
    /// The attribute timeout of regular files, when the file system set one.
    pub file_attr_ttl: Option<Duration>,
}

impl DirPlusBuf<'_> {
    fn fits(&self, namelen: usize) -> bool {
        self.buf.len() + abi::fuse_direntplus_size(namelen) <= self.limit
    }

    fn push(&mut self, entry_out: abi::fuse_entry_out, ino: u64, next_offset: u64, typ: u32, name: &[u8]) {
        let record = abi::fuse_direntplus_size(name.len());
        let start = self.buf.len();
        let d = abi::fuse_direntplus {
            entry_out,
            dirent: abi::fuse_dirent {
                ino,
                off: next_offset,
                namelen: name.len() as u32,
                typ,
            },
        };
        self.buf.extend_from_slice(d.as_bytes());
        push_name(self.buf, name, record, start);
    }
}

impl DirPlusSink for DirPlusBuf<'_> {
    fn add(&mut self, entry: &Entry, next_offset: u64, name: &OsStr) -> bool {
        let name = name.as_bytes();
        if !name_ok(name) {
            return true;
        }
        if !self.fits(name.len()) {
            return false;
        }
        let attr_ttl = match self.file_attr_ttl {
            Some(t) if entry.attr.file_type() == FileType::Regular => t,
            _ => self.attr_ttl,
        };
        let out = encode::entry_out(entry, self.entry_ttl, attr_ttl);
        self.push(
            out,
            entry.attr.ino,
            next_offset,
            entry.attr.file_type().dirent_type(),
            name,
        );
        true
    }
}

fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// READDIRPLUS from `readdir` + `lookup`. The listing goes to a scratch
/// buffer first: calling `lookup` from inside the file system's `readdir`
/// callback could deadlock a file system that holds a directory lock while
/// it lists. "." and ".." get no lookup: a zero node id tells the kernel to
/// take no reference for them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emulate_readdirplus(
    fs: &dyn Filesystem,
    req: &Request,
    node: NodeId,
    fh: FileHandle,
    offset: u64,
    sink: &mut DirPlusBuf<'_>,
    size: usize,
) -> Result<()> {
    let mut scratch = Vec::with_capacity(size);
    fs.readdir(
        req,
        node,
        fh,
        offset,
        &mut DirBuf {
            buf: &mut scratch,
            limit: size,
        },
    )?;
    let mut rest = &scratch[..];
    let mut added = 0usize;
    while let Ok((d, tail)) = abi::fuse_dirent::read_from_prefix(rest) {
        let namelen = d.namelen as usize;
        let record = abi::fuse_dirent_size(namelen) - abi::FUSE_NAME_OFFSET;
        let Some(name) = tail.get(..namelen) else { break };
        rest = tail.get(record..).unwrap_or(&[]);
        if !sink.fits(namelen) {
            break;
        }
        if is_dot_or_dotdot(name) {
            sink.push(abi::fuse_entry_out::default(), d.ino, d.off, d.typ, name);
            added += 1;
            continue;
        }
        match fs.lookup(req, node, OsStr::from_bytes(name)) {
            Ok(entry) => {
                DirPlusSink::add(sink, &entry, d.off, OsStr::from_bytes(name));
                added += 1;
            }
            // Removed between readdir and lookup: leave it out.
            Err(e) if e == Errno::ENOENT => {}
            Err(e) if added == 0 => return Err(e),
            // Later entries come with the next READDIRPLUS from this offset.
            Err(_) => break,
        }
    }
    Ok(())
}
