//! Directory contents with stable `readdir` offsets.
//!
//! Each entry gets a cookie from a per-directory counter that only grows.
//! `readdir` from offset `o` resumes with the first cookie above `o`, so an
//! offset stays valid whatever is created or removed meanwhile: an entry
//! present for the whole listing is returned exactly once. Offsets 1 and 2
//! are "." and "..", real entries start at 3.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use shortfuse::FileType;

/// The cookie after ".".
pub const DOT_COOKIE: u64 = 1;
/// The cookie after "..".
pub const DOTDOT_COOKIE: u64 = 2;

/// One name in a directory.
#[derive(Clone, Debug)]
pub struct DirEnt {
    pub name: OsString,
    pub ino: u64,
    pub typ: FileType,
}

pub struct Dir {
    /// Node id of the parent (the root is its own parent).
    pub parent: u64,
    by_cookie: BTreeMap<u64, DirEnt>,
    by_name: HashMap<OsString, u64>,
    next_cookie: u64,
    /// Bytes an ext4 linear directory would use for these names.
    used: u64,
    /// `st_size`: grows by 4 KiB blocks like ext4 and never shrinks.
    pub size: u64,
}

/// Bytes of one ext4 `dirent` record for `name`.
fn record_len(name: &OsStr) -> u64 {
    (8 + name.as_bytes().len() as u64).div_ceil(4) * 4
}

impl Dir {
    pub fn new(parent: u64) -> Dir {
        Dir {
            parent,
            by_cookie: BTreeMap::new(),
            by_name: HashMap::new(),
            next_cookie: DOTDOT_COOKIE + 1,
            used: 24,
            size: 4096,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn get(&self, name: &OsStr) -> Option<&DirEnt> {
        self.by_name.get(name).and_then(|c| self.by_cookie.get(c))
    }

    /// Adds `name`; the caller has checked that it is absent.
    pub fn insert(&mut self, name: &OsStr, ino: u64, typ: FileType) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.used += record_len(name);
        self.size = self.size.max(self.used.div_ceil(4096) * 4096);
        self.by_name.insert(name.to_owned(), cookie);
        self.by_cookie.insert(
            cookie,
            DirEnt {
                name: name.to_owned(),
                ino,
                typ,
            },
        );
    }

    pub fn remove(&mut self, name: &OsStr) -> Option<DirEnt> {
        let cookie = self.by_name.remove(name)?;
        self.used -= record_len(name);
        self.by_cookie.remove(&cookie)
    }

    /// Points an existing name at another inode (`RENAME_EXCHANGE`),
    /// keeping its cookie.
    pub fn replace(&mut self, name: &OsStr, ino: u64, typ: FileType) -> bool {
        match self.by_name.get(name).and_then(|c| self.by_cookie.get_mut(c)) {
            Some(ent) => {
                ent.ino = ino;
                ent.typ = typ;
                true
            }
            None => false,
        }
    }

    /// Up to `max` entries with a cookie above `after`, in cookie order.
    pub fn batch(&self, after: u64, max: usize) -> Vec<(u64, DirEnt)> {
        self.by_cookie
            .range(after.saturating_add(1).max(DOTDOT_COOKIE + 1)..)
            .take(max)
            .map(|(c, e)| (*c, e.clone()))
            .collect()
    }

    /// Calls `f` for each entry after `after` until it returns `false`.
    pub fn for_each_after(&self, after: u64, mut f: impl FnMut(u64, &DirEnt) -> bool) {
        for (c, e) in self.by_cookie.range(after.saturating_add(1).max(DOTDOT_COOKIE + 1)..) {
            if !f(*c, e) {
                break;
            }
        }
    }
}
