//! Reply encoding into the reused reply buffer: a `fuse_out_header` whose
//! `len` is patched when the payload is complete.

use std::time::Duration;

use shortfuse_abi as abi;
use zerocopy::IntoBytes;

use crate::errno::Errno;
use crate::types::{Attr, Entry, Statfs};

pub(crate) const OUT_HEADER: usize = core::mem::size_of::<abi::fuse_out_header>();

/// Starts a successful reply to `unique`: clears `buf` and writes a header
/// whose length [`finish`] fills in.
pub(crate) fn begin(buf: &mut Vec<u8>, unique: u64) {
    buf.clear();
    let h = abi::fuse_out_header {
        len: 0,
        error: 0,
        unique,
    };
    buf.extend_from_slice(h.as_bytes());
}

/// Patches the header's `len` to the buffer's length.
pub(crate) fn finish(buf: &mut [u8]) {
    let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
    buf[..4].copy_from_slice(&len.to_ne_bytes());
}

/// A whole reply carrying one struct.
pub fn reply_struct<T: IntoBytes + zerocopy::Immutable>(buf: &mut Vec<u8>, unique: u64, value: &T) {
    begin(buf, unique);
    buf.extend_from_slice(value.as_bytes());
    finish(buf);
}

/// A whole reply carrying raw bytes.
pub(crate) fn reply_bytes(buf: &mut Vec<u8>, unique: u64, data: &[u8]) {
    begin(buf, unique);
    buf.extend_from_slice(data);
    finish(buf);
}

/// An empty successful reply.
pub(crate) fn reply_ok(buf: &mut Vec<u8>, unique: u64) {
    begin(buf, unique);
    finish(buf);
}

/// An error reply: only the header, with `error = -errno`.
pub(crate) fn reply_error(buf: &mut Vec<u8>, unique: u64, err: Errno) {
    buf.clear();
    let h = abi::fuse_out_header {
        len: OUT_HEADER as u32,
        error: -err.raw(),
        unique,
    };
    buf.extend_from_slice(h.as_bytes());
}

/// Seconds and nanoseconds of a timeout, as `*_valid`/`*_valid_nsec`.
pub(crate) fn split_duration(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

pub(crate) fn attr(a: &Attr) -> abi::fuse_attr {
    abi::fuse_attr {
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        atime: a.atime.sec as u64,
        mtime: a.mtime.sec as u64,
        ctime: a.ctime.sec as u64,
        atimensec: a.atime.nsec,
        mtimensec: a.mtime.nsec,
        ctimensec: a.ctime.nsec,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

pub(crate) fn attr_out(a: &Attr, ttl: Duration) -> abi::fuse_attr_out {
    let (attr_valid, attr_valid_nsec) = split_duration(ttl);
    abi::fuse_attr_out {
        attr_valid,
        attr_valid_nsec,
        dummy: 0,
        attr: attr(a),
    }
}

/// `fuse_entry_out` of `e`; `Entry::ttl` overrides both mount timeouts.
pub(crate) fn entry_out(e: &Entry, entry_ttl: Duration, attr_ttl: Duration) -> abi::fuse_entry_out {
    let (entry_valid, entry_valid_nsec) = split_duration(e.ttl.unwrap_or(entry_ttl));
    let (attr_valid, attr_valid_nsec) = split_duration(e.ttl.unwrap_or(attr_ttl));
    abi::fuse_entry_out {
        nodeid: e.node.0,
        generation: e.generation,
        entry_valid,
        attr_valid,
        entry_valid_nsec,
        attr_valid_nsec,
        attr: attr(&e.attr),
    }
}

pub(crate) fn statfs_out(s: &Statfs) -> abi::fuse_statfs_out {
    abi::fuse_statfs_out {
        st: abi::fuse_kstatfs {
            blocks: s.blocks,
            bfree: s.bfree,
            bavail: s.bavail,
            files: s.files,
            ffree: s.ffree,
            bsize: s.bsize,
            namelen: s.namelen,
            frsize: s.frsize,
            padding: 0,
            spare: [0; 6],
        },
    }
}
