//! shortfuse-vfs: the kernel's half of FUSE, in user space.
//!
//! The preload shim serves a program's file system calls with this crate as
//! the kernel would: it walks paths over a dentry and attribute cache
//! ([`Vfs::walk`]), honours the entry and attribute timeouts the file system
//! returns, caches negative entries, counts lookups and sends FORGET when a
//! node leaves the cache, and keeps open file descriptions ([`OpenFile`])
//! with offsets and status flags shared by duplicated descriptors
//! ([`FdTable`]). Requests travel as FUSE messages through a [`Backend`];
//! [`InProcess`] hands them to a `shortfuse::Dispatcher` in the same
//! process; [`Ring`] sends them over shared-memory rings to a
//! `shortfuse serve` daemon shared by every process.
//!
//! Data maps ([`MapTap`], [`MapTable`]): an in-process file system's maps
//! reach the open files, whose reads and writes then go straight to the
//! backing files, and a bounded per-node cache of them (DeFUSE's M-Cache)
//! lets a re-open skip the file system's `open` while the attributes are
//! valid. Byte-range and flock locks of open files without a backing file
//! live on a per-node anonymous kernel file ([`OpenFile::lock_fd`]).
//!
//! Namespace maps ([`Namespace`]): a file system whose tree is a 1-to-1
//! image of a backing directory lets the shim serve path calls beneath the
//! mount in the kernel, beneath that directory.
//!
//! Page cache ([`PageCache`], `-o cache=on`, on by default for network
//! file systems): pages of files without a data map kept in process,
//! write-through, with read-ahead and reads clipped at the end of file;
//! its pages live in the store the daemon's cache tier uses
//! (`shortfuse::cache::page`).

#![deny(unsafe_code)]

mod backend;
mod cache;
mod client;
pub mod elf;
mod file;
mod maps;
pub mod names;
mod once;
mod pages;
mod ring;
pub mod spec;
mod vfs;

pub use backend::{Anchor, Backend, InProcess, Invalidation};
pub use client::{Caller, Client, Creds, EntryOut, InitOut, Lookup, OpenOut, XattrOut};
pub use file::{anchor_files, FdTable, Held, OpenFile};
pub use maps::{HeldMap, MapTable, MapTap, MCACHE_NODES};
pub use names::Namespace;
pub use pages::PageCache;
pub use ring::Ring;
pub use spec::{MountSpec, RunOptions};
pub use vfs::{Last, Location, Target, Vfs, Walk, WalkFlags, MAXSYMLINKS, PATH_MAX};

/// Normalises an absolute path lexically: collapses slashes, drops `.`,
/// resolves `..` against the previous component (never above '/'). No
/// trailing slash except for "/" itself.
pub fn normalize(path: &[u8]) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for p in parts {
        out.push(b'/');
        out.extend_from_slice(p);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

/// [`normalize`] that keeps one trailing slash when `path` had one (it
/// says "must be a directory").
pub fn normalize_keep_slash(path: &[u8]) -> Vec<u8> {
    let mut out = normalize(path);
    if path.ends_with(b"/") && !out.ends_with(b"/") {
        out.push(b'/');
    }
    out
}

/// The parent of a normalised absolute path ("/" for "/").
pub fn parent_of(path: &[u8]) -> Vec<u8> {
    match path.iter().rposition(|&b| b == b'/') {
        Some(0) | None => b"/".to_vec(),
        Some(i) => path[..i].to_vec(),
    }
}
