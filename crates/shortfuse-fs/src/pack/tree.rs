//! The namespace of `pack` and `stripe`: every inode's attributes in
//! memory, kept on disk in an append-only journal that is rewritten as a
//! snapshot when it has grown to several times the live records.
//!
//! Journal lines (text, one record each, names and targets hex-encoded so
//! any byte is safe):
//! - `P ino parent name kind mode uid gid rdev size atime mtime ctime target payload…`
//!   (times as `sec.nsec`): the inode's whole state; the last one wins.
//! - `L ino parent name parent name…`: the names of a non-directory
//!   beyond the one in its `P` record (hard links);
//! - `X ino name value name value…`: its extended attributes, in order;
//! - `D ino`: the inode is gone.
//!
//! A record is one `P` line followed, when there is something to say, by
//! its `L` and `X` lines, written together: a `P` line starts the inode
//! afresh, so the last record wins whole. A torn last line (crash while
//! appending) is ignored on load.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use shortfuse::{Errno, FileType, Result, Timestamp};

use crate::xattr::Xattrs;

/// What a file system keeps per regular file about where its data lives.
pub trait Payload: Clone + Default + Send + 'static {
    /// Space-separated fields, without spaces inside.
    fn encode(&self) -> String;
    fn decode(fields: &[&str]) -> Option<Self>;
}

/// One inode.
#[derive(Clone, Debug)]
pub struct Node<P> {
    pub ino: u64,
    pub parent: u64,
    pub name: OsString,
    pub kind: FileType,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Symlink target.
    pub target: Vec<u8>,
    pub payload: P,
    /// Non-directories: the names beyond `(parent, name)`.
    pub links: Vec<(u64, OsString)>,
    pub xattrs: Xattrs,
    /// Directories: children by name (inode and readdir cookie), and names
    /// by cookie. A cookie is given when a name is added and stays while
    /// it exists, so a listing in progress neither repeats nor skips the
    /// names that stay. Rebuilt on load.
    pub children: BTreeMap<OsString, Child>,
    pub by_cookie: BTreeMap<u64, OsString>,
    next_cookie: u64,
    /// Directories: how many children are directories (each one's `..`
    /// is a link here), kept so that a stat does not count them.
    pub subdirs: u32,
    /// Kernel references (entries handed out minus forgets).
    pub lookups: u64,
    /// Open handles.
    pub opens: u64,
    /// Still has a name (false once unlinked while referenced).
    pub linked: bool,
}

impl<P: Payload> Node<P> {
    pub fn new(ino: u64, parent: u64, name: &OsStr, kind: FileType, mode: u32, uid: u32, gid: u32) -> Node<P> {
        let now = Timestamp::now();
        Node {
            ino,
            parent,
            name: name.to_os_string(),
            kind,
            mode: kind.mode_bits() | (mode & 0o7777),
            uid,
            gid,
            rdev: 0,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            target: Vec::new(),
            payload: P::default(),
            links: Vec::new(),
            xattrs: Xattrs::default(),
            children: BTreeMap::new(),
            by_cookie: BTreeMap::new(),
            next_cookie: FIRST_COOKIE,
            subdirs: 0,
            lookups: 0,
            opens: 0,
            linked: true,
        }
    }

    /// Its hard links: names beyond `(parent, name)` count one each.
    pub fn nlink(&self) -> u32 {
        match (self.kind, self.linked) {
            (FileType::Directory, _) => 2 + self.subdirs,
            (_, true) => 1 + self.links.len() as u32,
            (_, false) => 0,
        }
    }

    /// Whether `(parent, name)` is one of this inode's names.
    pub fn has_name(&self, parent: u64, name: &OsStr) -> bool {
        (self.parent == parent && self.name == name) || self.links.iter().any(|(p, n)| *p == parent && n == name)
    }

    /// Changes its name `from` into `to`, in the inode only.
    fn rename_link(&mut self, from: (u64, &OsStr), to: (u64, &OsStr)) {
        if self.parent == from.0 && self.name == from.1 {
            self.parent = to.0;
            self.name = to.1.to_os_string();
        } else if let Some(l) = self.links.iter_mut().find(|(p, n)| *p == from.0 && n == from.1) {
            *l = (to.0, to.1.to_os_string());
        }
    }

    fn record(&self) -> String {
        let mut out = self.main_record();
        if !self.links.is_empty() {
            out.push_str(&format!("L {}", self.ino));
            for (p, n) in &self.links {
                out.push_str(&format!(" {p} {}", hex(n.as_bytes())));
            }
            out.push('\n');
        }
        if !self.xattrs.is_empty() {
            out.push_str(&format!("X {}", self.ino));
            for (n, v) in &self.xattrs.0 {
                out.push_str(&format!(" {} {}", hex(n.as_bytes()), hex(v)));
            }
            out.push('\n');
        }
        out
    }

    fn main_record(&self) -> String {
        format!(
            "P {} {} {} {} {} {} {} {} {} {} {} {} {} {}\n",
            self.ino,
            self.parent,
            hex(self.name.as_bytes()),
            self.kind.mode_bits() >> 12,
            self.mode,
            self.uid,
            self.gid,
            self.rdev,
            self.size,
            time(self.atime),
            time(self.mtime),
            time(self.ctime),
            hex(&self.target),
            self.payload.encode()
        )
    }

    /// Lists child `ino` (of kind `kind`) under `name` in this directory.
    fn attach(&mut self, name: OsString, ino: u64, kind: FileType) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.by_cookie.insert(cookie, name.clone());
        self.children.insert(name, Child { ino, cookie });
        if kind == FileType::Directory {
            self.subdirs += 1;
        }
    }

    fn detach(&mut self, name: &OsStr, kind: FileType) {
        if let Some(c) = self.children.remove(name) {
            self.by_cookie.remove(&c.cookie);
            if kind == FileType::Directory {
                self.subdirs = self.subdirs.saturating_sub(1);
            }
        }
    }

    /// The `L` line's names.
    fn parse_links(fields: &[&str]) -> Option<Vec<(u64, OsString)>> {
        fields
            .chunks(2)
            .map(|c| match c {
                [p, n] => Some((p.parse().ok()?, OsString::from_vec(unhex(n)?))),
                _ => None,
            })
            .collect()
    }

    /// The `X` line's attributes.
    fn parse_xattrs(fields: &[&str]) -> Option<Xattrs> {
        fields
            .chunks(2)
            .map(|c| match c {
                [n, v] => Some((OsString::from_vec(unhex(n)?), unhex(v)?)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(Xattrs)
    }

    fn parse(fields: &[&str]) -> Option<Node<P>> {
        if fields.len() < 14 {
            return None;
        }
        let n = |i: usize| fields[i].parse::<u64>().ok();
        let n32 = |i: usize| fields[i].parse::<u32>().ok();
        let kind = FileType::from_mode(n32(4)? << 12);
        let mut node = Node::new(n(1)?, n(2)?, &OsString::from_vec(unhex(fields[3])?), kind, 0, 0, 0);
        node.mode = n32(5)?;
        node.uid = n32(6)?;
        node.gid = n32(7)?;
        node.rdev = n32(8)?;
        node.size = n(9)?;
        node.atime = untime(fields[10])?;
        node.mtime = untime(fields[11])?;
        node.ctime = untime(fields[12])?;
        node.target = unhex(fields[13])?;
        node.payload = P::decode(&fields[14..])?;
        Some(node)
    }
}

fn hex(b: &[u8]) -> String {
    if b.is_empty() {
        return "-".to_string();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s == "-" {
        return Some(Vec::new());
    }
    if s.len() & 1 == 1 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn time(t: Timestamp) -> String {
    format!("{}.{}", t.sec, t.nsec)
}

fn untime(s: &str) -> Option<Timestamp> {
    let (sec, nsec) = s.split_once('.')?;
    Some(Timestamp {
        sec: sec.parse().ok()?,
        nsec: nsec.parse().ok()?,
    })
}

/// The node an `L` or `X` line (`KIND ino fields…`) is about, and its
/// fields parsed; `None` for a line that is torn or names no node.
fn extra<'a, P, T>(
    nodes: &'a mut HashMap<u64, Node<P>>,
    fields: &[&str],
    parse: fn(&[&str]) -> Option<T>,
) -> Option<(&'a mut Node<P>, T)> {
    let ino: u64 = fields.get(1)?.parse().ok()?;
    let rest = fields.get(2..).filter(|r| !r.is_empty())?;
    let value = parse(rest)?;
    Some((nodes.get_mut(&ino)?, value))
}

/// An entry of a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Child {
    pub ino: u64,
    /// Its readdir cookie (`.` and `..` take 1 and 2).
    pub cookie: u64,
}

/// The first cookie of a directory's entries.
const FIRST_COOKIE: u64 = 3;

/// Root inode number (the kernel's `FUSE_ROOT_ID`).
pub const ROOT: u64 = 1;
/// The longest name an entry can have (statfs reports it as namemax).
pub const NAME_MAX: usize = 255;

/// The namespace and its journal.
pub struct Tree<P> {
    pub nodes: HashMap<u64, Node<P>>,
    next_ino: u64,
    path: PathBuf,
    journal: File,
    records: usize,
}

impl<P: Payload> Tree<P> {
    /// Loads the journal at `path` (creating an empty namespace if there is
    /// none) and rewrites it as a snapshot.
    pub fn open(path: &Path) -> io::Result<Tree<P>> {
        let mut nodes: HashMap<u64, Node<P>> = HashMap::new();
        match File::open(path) {
            Ok(f) => {
                for line in BufReader::new(f).split(b'\n') {
                    let line = line?;
                    let Ok(line) = std::str::from_utf8(&line) else { continue };
                    let fields: Vec<&str> = line.split(' ').collect();
                    match fields.first() {
                        Some(&"P") => {
                            if let Some(node) = Node::parse(&fields) {
                                nodes.insert(node.ino, node);
                            }
                        }
                        Some(&"L") => {
                            if let Some((n, links)) = extra(&mut nodes, &fields, Node::<P>::parse_links) {
                                n.links = links;
                            }
                        }
                        Some(&"X") => {
                            if let Some((n, xattrs)) = extra(&mut nodes, &fields, Node::<P>::parse_xattrs) {
                                n.xattrs = xattrs;
                            }
                        }
                        Some(&"D") => {
                            if let Some(ino) = fields.get(1).and_then(|s| s.parse().ok()) {
                                nodes.remove(&ino);
                            }
                        }
                        _ => {}
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        nodes
            .entry(ROOT)
            .or_insert_with(|| Node::new(ROOT, ROOT, OsStr::new(""), FileType::Directory, 0o755, 0, 0));
        // Drop nodes whose parent is gone (a crash between records), then
        // link children into their directories.
        let orphans: Vec<u64> = nodes
            .values()
            .filter(|n| n.ino != ROOT && nodes.get(&n.parent).is_none_or(|p| p.kind != FileType::Directory))
            .map(|n| n.ino)
            .collect();
        for ino in orphans {
            nodes.remove(&ino);
        }
        // Extra names in directories that are gone go too.
        let dirs: HashSet<u64> = nodes
            .values()
            .filter(|n| n.kind == FileType::Directory)
            .map(|n| n.ino)
            .collect();
        for n in nodes.values_mut() {
            n.links.retain(|(p, _)| dirs.contains(p));
        }
        let mut links: Vec<(u64, u64, OsString, FileType)> = nodes
            .values()
            .filter(|n| n.ino != ROOT)
            .flat_map(|n| {
                std::iter::once((n.parent, n.ino, n.name.clone(), n.kind))
                    .chain(n.links.iter().map(|(p, name)| (*p, n.ino, name.clone(), n.kind)))
            })
            .collect();
        // Cookies in inode order, as they were given.
        links.sort_by_key(|l| l.1);
        for (parent, ino, name, kind) in links {
            if let Some(p) = nodes.get_mut(&parent) {
                p.attach(name, ino, kind);
            }
        }
        let next_ino = nodes.keys().max().copied().unwrap_or(ROOT) + 1;
        let journal = OpenOptions::new().create(true).append(true).open(path)?;
        let mut tree = Tree {
            nodes,
            next_ino,
            path: path.to_path_buf(),
            journal,
            records: 0,
        };
        tree.snapshot()?;
        Ok(tree)
    }

    /// Rewrites the journal as one record per live inode (atomically:
    /// written beside it, then renamed over it).
    pub fn snapshot(&mut self) -> io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        let mut out = io::BufWriter::new(File::create(&tmp)?);
        let mut count = 0;
        for node in self.nodes.values().filter(|n| n.linked) {
            out.write_all(node.record().as_bytes())?;
            count += 1;
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        self.journal = OpenOptions::new().append(true).open(&self.path)?;
        self.records = count;
        Ok(())
    }

    fn append(&mut self, line: &str) -> Result<()> {
        self.journal.write_all(line.as_bytes()).map_err(Errno::from)?;
        self.records += 1;
        let live = self.nodes.len();
        if self.records > 4 * live + 1024 {
            self.snapshot().map_err(Errno::from)?;
        }
        Ok(())
    }

    /// Records the current state of `ino`.
    pub fn save(&mut self, ino: u64) -> Result<()> {
        let line = match self.nodes.get(&ino) {
            Some(n) if n.linked => n.record(),
            _ => return Ok(()),
        };
        self.append(&line)
    }

    pub fn get(&self, ino: u64) -> Result<&Node<P>> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    pub fn get_mut(&mut self, ino: u64) -> Result<&mut Node<P>> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    pub fn dir(&self, ino: u64) -> Result<&Node<P>> {
        let n = self.get(ino)?;
        if n.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        Ok(n)
    }

    pub fn child(&self, parent: u64, name: &OsStr) -> Result<u64> {
        let d = self.dir(parent)?;
        if name == "." {
            return Ok(parent);
        }
        if name == ".." {
            return Ok(d.parent);
        }
        // The kernel passes names up to 1024 bytes to lookup; one that no
        // entry can have must say so, as statfs's namemax promises, or a
        // later link/rename to it would get an unrelated error.
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        d.children.get(name).map(|c| c.ino).ok_or(Errno::ENOENT)
    }

    /// Adds `node` (its `ino` is assigned here) under its parent.
    pub fn insert(&mut self, mut node: Node<P>) -> Result<u64> {
        if node.name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let parent = self.dir(node.parent)?;
        if parent.children.contains_key(&node.name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        node.ino = ino;
        let (pino, name, kind) = (node.parent, node.name.clone(), node.kind);
        self.nodes.insert(ino, node);
        let p = self.get_mut(pino)?;
        p.attach(name, ino, kind);
        let now = Timestamp::now();
        p.mtime = now;
        p.ctime = now;
        self.save(ino)?;
        self.save(pino)?;
        Ok(ino)
    }

    /// Takes `ino`'s name `(parent, name)` away; when that was its last,
    /// and nothing references the inode any more, drops it and returns it,
    /// so its data may go.
    pub fn unlink(&mut self, ino: u64, parent: u64, name: &OsStr) -> Result<Option<Node<P>>> {
        let now = Timestamp::now();
        let (kind, last) = {
            let n = self.get_mut(ino)?;
            if !n.has_name(parent, name) {
                return Err(Errno::ENOENT);
            }
            n.ctime = now;
            if n.parent == parent && n.name == name {
                match n.links.pop() {
                    // Another name becomes the one in the `P` record.
                    Some((p, other)) => {
                        n.parent = p;
                        n.name = other;
                    }
                    None => n.linked = false,
                }
            } else {
                n.links.retain(|(p, other)| !(*p == parent && other == name));
            }
            (n.kind, !n.linked)
        };
        if let Ok(p) = self.get_mut(parent) {
            p.detach(name, kind);
            p.mtime = now;
            p.ctime = now;
        }
        if last {
            self.append(&format!("D {ino}\n"))?;
        } else {
            self.save(ino)?;
        }
        self.save(parent)?;
        Ok(self.reap(ino))
    }

    /// Gives the non-directory `ino` one more name, `(parent, name)`.
    pub fn link(&mut self, ino: u64, parent: u64, name: &OsStr) -> Result<()> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if self.dir(parent)?.children.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let now = Timestamp::now();
        let n = self.get_mut(ino)?;
        match n.kind {
            FileType::Directory => return Err(Errno::EPERM),
            // A file unlinked while open cannot get a name back (ext4).
            _ if !n.linked => return Err(Errno::ENOENT),
            kind => {
                n.links.push((parent, name.to_os_string()));
                n.ctime = now;
                let p = self.get_mut(parent)?;
                p.attach(name.to_os_string(), ino, kind);
                p.mtime = now;
                p.ctime = now;
            }
        }
        self.save(ino)?;
        self.save(parent)
    }

    /// Drops an unlinked inode with no references left; returns it.
    pub fn reap(&mut self, ino: u64) -> Option<Node<P>> {
        match self.nodes.get(&ino) {
            Some(n) if !n.linked && n.lookups == 0 && n.opens == 0 => self.nodes.remove(&ino),
            _ => None,
        }
    }

    /// Moves `ino`'s name `from` to `to`; the target name must be free.
    pub fn relink(&mut self, ino: u64, from: (u64, &OsStr), to: (u64, &OsStr)) -> Result<()> {
        let kind = self.get(ino)?.kind;
        let now = Timestamp::now();
        if let Ok(p) = self.get_mut(from.0) {
            p.detach(from.1, kind);
            p.mtime = now;
            p.ctime = now;
        }
        let p = self.get_mut(to.0)?;
        p.attach(to.1.to_os_string(), ino, kind);
        p.mtime = now;
        p.ctime = now;
        let n = self.get_mut(ino)?;
        n.rename_link(from, to);
        n.ctime = now;
        self.save(ino)?;
        self.save(from.0)?;
        if to.0 != from.0 {
            self.save(to.0)?;
        }
        Ok(())
    }

    /// `RENAME_EXCHANGE`: `a`, named `a_at`, and `b`, named `b_at`, swap
    /// names. The caller checked that neither directory would move below
    /// itself.
    pub fn exchange(&mut self, a: u64, a_at: (u64, &OsStr), b: u64, b_at: (u64, &OsStr)) -> Result<()> {
        let (a_kind, b_kind) = (self.get(a)?.kind, self.get(b)?.kind);
        let now = Timestamp::now();
        for (at, kind) in [(a_at, a_kind), (b_at, b_kind)] {
            let p = self.get_mut(at.0)?;
            p.detach(at.1, kind);
            p.mtime = now;
            p.ctime = now;
        }
        self.get_mut(b_at.0)?.attach(b_at.1.to_os_string(), a, a_kind);
        self.get_mut(a_at.0)?.attach(a_at.1.to_os_string(), b, b_kind);
        let n = self.get_mut(a)?;
        n.rename_link(a_at, b_at);
        n.ctime = now;
        let n = self.get_mut(b)?;
        n.rename_link(b_at, a_at);
        n.ctime = now;
        self.save(a)?;
        self.save(b)?;
        self.save(a_at.0)?;
        if b_at.0 != a_at.0 {
            self.save(b_at.0)?;
        }
        Ok(())
    }

    /// Whether `ino` is `ancestor` or lies below it.
    pub fn is_within(&self, mut ino: u64, ancestor: u64) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            match self.nodes.get(&ino) {
                Some(n) if n.ino != ROOT && n.linked => ino = n.parent,
                _ => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default, Debug, PartialEq)]
    struct P(u64);
    impl Payload for P {
        fn encode(&self) -> String {
            self.0.to_string()
        }
        fn decode(f: &[&str]) -> Option<P> {
            f.first()?.parse().ok().map(P)
        }
    }

    /// A fresh empty directory for one test.
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn journal_survives_reopen_and_torn_lines() {
        let dir = scratch("sf-tree");
        let path = dir.join("journal");
        {
            let mut t: Tree<P> = Tree::open(&path).unwrap();
            let d = t
                .insert(Node::new(
                    0,
                    ROOT,
                    OsStr::new("d i r"),
                    FileType::Directory,
                    0o700,
                    1,
                    2,
                ))
                .unwrap();
            let mut f = Node::new(0, d, OsStr::new("f\n"), FileType::Regular, 0o644, 3, 4);
            f.payload = P(42);
            f.size = 7;
            let f = t.insert(f).unwrap();
            let g = t
                .insert(Node::new(0, ROOT, OsStr::new("g"), FileType::Regular, 0o600, 0, 0))
                .unwrap();
            assert!(t.unlink(g, ROOT, OsStr::new("g")).unwrap().is_some());
            t.relink(f, (d, OsStr::new("f\n")), (ROOT, OsStr::new("moved")))
                .unwrap();
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"P 99 1 zz")
            .unwrap();
        let t: Tree<P> = Tree::open(&path).unwrap();
        let f = t.child(ROOT, OsStr::new("moved")).unwrap();
        let n = t.get(f).unwrap();
        assert_eq!(
            (n.size, n.payload.clone(), n.uid, n.mode),
            (7, P(42), 3, libc::S_IFREG | 0o644)
        );
        assert!(t.child(ROOT, OsStr::new("g")).is_err());
        let d = t.child(ROOT, OsStr::new("d i r")).unwrap();
        assert!(t.dir(d).unwrap().children.is_empty());
        assert_eq!(t.nodes.len(), 3);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn subdirectory_counts_follow_mkdir_rename_rmdir_and_reload() {
        let dir = scratch("sf-tree-subdirs");
        let path = dir.join("journal");
        let node = |parent, name: &str, kind| Node::new(0, parent, OsStr::new(name), kind, 0o755, 0, 0);
        let subdirs = |t: &Tree<P>, ino| t.get(ino).unwrap().subdirs;
        let (a, b);
        {
            let mut t: Tree<P> = Tree::open(&path).unwrap();
            a = t.insert(node(ROOT, "a", FileType::Directory)).unwrap();
            b = t.insert(node(ROOT, "b", FileType::Directory)).unwrap();
            let c = t.insert(node(a, "c", FileType::Directory)).unwrap();
            t.insert(node(a, "f", FileType::Regular)).unwrap();
            assert_eq!((subdirs(&t, ROOT), subdirs(&t, a), subdirs(&t, b)), (2, 1, 0));
            t.relink(c, (a, OsStr::new("c")), (b, OsStr::new("c2"))).unwrap();
            assert_eq!((subdirs(&t, a), subdirs(&t, b)), (0, 1));
            let e = t.insert(node(a, "e", FileType::Directory)).unwrap();
            t.unlink(e, a, OsStr::new("e")).unwrap();
            assert_eq!(subdirs(&t, a), 0);
        }
        let t: Tree<P> = Tree::open(&path).unwrap();
        assert_eq!((subdirs(&t, ROOT), subdirs(&t, a), subdirs(&t, b)), (2, 0, 1));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn hard_links_xattrs_and_exchanges_survive_reopen() {
        let dir = scratch("sf-tree-links");
        let path = dir.join("journal");
        let node = |parent, name: &str, kind| Node::new(0, parent, OsStr::new(name), kind, 0o644, 0, 0);
        let name = |s: &str| OsString::from(s);
        let (d, f, g);
        {
            let mut t: Tree<P> = Tree::open(&path).unwrap();
            d = t.insert(node(ROOT, "d", FileType::Directory)).unwrap();
            f = t.insert(node(ROOT, "f", FileType::Regular)).unwrap();
            g = t.insert(node(d, "g", FileType::Regular)).unwrap();
            t.link(f, d, OsStr::new("f2")).unwrap();
            t.link(f, ROOT, OsStr::new("f 3")).unwrap();
            assert_eq!(t.link(f, d, OsStr::new("g")), Err(Errno::EEXIST));
            assert_eq!(t.link(d, ROOT, OsStr::new("d2")), Err(Errno::EPERM));
            // The name in the `P` record goes; another takes its place.
            assert!(t.unlink(f, ROOT, OsStr::new("f")).unwrap().is_none());
            let n = t.get_mut(f).unwrap();
            n.xattrs
                .set(&name("user.k"), b"v v", shortfuse::XattrFlags::empty())
                .unwrap();
            n.xattrs
                .set(&name("user.empty"), b"", shortfuse::XattrFlags::empty())
                .unwrap();
            t.save(f).unwrap();
            t.exchange(f, (d, OsStr::new("f2")), g, (d, OsStr::new("g"))).unwrap();
            t.link(f, d, OsStr::new("f4")).unwrap();
            assert_eq!(t.get(f).unwrap().nlink(), 3);
        }
        let t: Tree<P> = Tree::open(&path).unwrap();
        assert_eq!(t.child(d, OsStr::new("g")), Ok(f));
        assert_eq!(t.child(d, OsStr::new("f2")), Ok(g));
        assert_eq!(t.child(ROOT, OsStr::new("f 3")), Ok(f));
        assert_eq!(t.child(ROOT, OsStr::new("f")), Err(Errno::ENOENT));
        let n = t.get(f).unwrap();
        assert_eq!(n.nlink(), 3);
        assert_eq!(n.xattrs.list(), b"user.k\0user.empty\0");
        assert_eq!(n.xattrs.get(&name("user.k")), Ok(b"v v".to_vec()));
        // Two names of one inode in one directory have cookies of their own.
        assert_eq!(t.child(d, OsStr::new("f4")), Ok(f));
        let cookies: Vec<u64> = t.dir(d).unwrap().by_cookie.keys().copied().collect();
        assert_eq!(cookies.len(), 3);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn names_longer_than_name_max_are_enametoolong() {
        let dir = scratch("sf-tree-long");
        let mut t: Tree<P> = Tree::open(&dir.join("journal")).unwrap();
        let ok = "a".repeat(NAME_MAX);
        let long = "a".repeat(NAME_MAX + 1);
        assert_eq!(t.child(ROOT, OsStr::new(&ok)), Err(Errno::ENOENT));
        assert_eq!(t.child(ROOT, OsStr::new(&long)), Err(Errno::ENAMETOOLONG));
        let long_node = Node::new(0, ROOT, OsStr::new(&long), FileType::Regular, 0o644, 0, 0);
        assert_eq!(t.insert(long_node), Err(Errno::ENAMETOOLONG));
        let f = t
            .insert(Node::new(0, ROOT, OsStr::new(&ok), FileType::Regular, 0o644, 0, 0))
            .unwrap();
        assert_eq!(t.child(ROOT, OsStr::new(&ok)), Ok(f));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
