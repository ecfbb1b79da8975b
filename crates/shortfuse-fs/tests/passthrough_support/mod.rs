//! Helpers shared by the passthrough tests: temporary directories and
//! collecting directory sinks.

#![allow(dead_code)]

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use shortfuse::{DirPlusSink, DirSink, Entry, FileType, Request};

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "shortfuse-pt-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn root_req() -> Request {
    Request {
        unique: 1,
        uid: 0,
        gid: 0,
        pid: std::process::id(),
    }
}

pub fn user_req(uid: u32, gid: u32) -> Request {
    Request {
        unique: 2,
        uid,
        gid,
        pid: std::process::id(),
    }
}

/// Takes at most `room` entries, like a reply buffer that fills up.
pub struct Names {
    pub room: usize,
    pub got: Vec<(OsString, u64, FileType, u64)>,
}

impl Names {
    pub fn new(room: usize) -> Names {
        Names { room, got: Vec::new() }
    }
}

impl DirSink for Names {
    fn add(&mut self, ino: u64, next_offset: u64, typ: FileType, name: &OsStr) -> bool {
        if self.got.len() >= self.room {
            return false;
        }
        self.got.push((name.to_owned(), next_offset, typ, ino));
        true
    }
}

/// Readdirplus sink taking at most `room` entries.
pub struct Plus {
    pub room: usize,
    pub got: Vec<(OsString, u64, Entry)>,
}

impl Plus {
    pub fn new(room: usize) -> Plus {
        Plus { room, got: Vec::new() }
    }
}

impl DirPlusSink for Plus {
    fn add(&mut self, entry: &Entry, next_offset: u64, name: &OsStr) -> bool {
        if self.got.len() >= self.room {
            return false;
        }
        self.got.push((name.to_owned(), next_offset, *entry));
        true
    }
}
