//! The namespace of `pack` and `stripe`: every inode's attributes in
//! memory, kept on disk in an append-only journal that is rewritten as a
//! snapshot when it has grown to several times the live records.
//!
//! Journal lines (text, one record each, names and targets hex-encoded so
//! any byte is safe):
//! - `P ino parent name kind mode uid gid rdev size atime mtime ctime target payload…`
//!   (times as `sec.nsec`): the inode's whole state; the last one wins.
//! - `D ino`: the inode is gone.
//!
//! A torn last line (crash while appending) is ignored on load. Hard links
//! are not supported, so every inode but the root has exactly one name,
//! `(parent, name)`, stored in its record.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use shortfuse::{Errno, FileType, Result, Timestamp};

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
    /// Directories: children by name, and by inode for stable readdir
    /// cookies. Rebuilt on load.
    pub children: BTreeMap<OsString, u64>,
    pub by_ino: BTreeMap<u64, OsString>,
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
            children: BTreeMap::new(),
            by_ino: BTreeMap::new(),
            subdirs: 0,
            lookups: 0,
            opens: 0,
            linked: true,
        }
    }

    fn record(&self) -> String {
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
        self.children.insert(name.clone(), ino);
        self.by_ino.insert(ino, name);
        if kind == FileType::Directory {
            self.subdirs += 1;
        }
    }

    fn detach(&mut self, name: &OsStr, ino: u64, kind: FileType) {
        if self.children.remove(name).is_some() && kind == FileType::Directory {
            self.subdirs = self.subdirs.saturating_sub(1);
        }
        self.by_ino.remove(&ino);
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
        let links: Vec<(u64, u64, OsString, FileType)> = nodes
            .values()
            .filter(|n| n.ino != ROOT)
            .map(|n| (n.parent, n.ino, n.name.clone(), n.kind))
            .collect();
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
        d.children.get(name).copied().ok_or(Errno::ENOENT)
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

    /// Takes `ino`'s name away; returns true when nothing references the
    /// inode any more, so it has been dropped and its data may go.
    pub fn unlink(&mut self, ino: u64) -> Result<Option<Node<P>>> {
        let (parent, name, kind) = {
            let n = self.get_mut(ino)?;
            n.linked = false;
            n.ctime = Timestamp::now();
            (n.parent, n.name.clone(), n.kind)
        };
        if let Ok(p) = self.get_mut(parent) {
            p.detach(&name, ino, kind);
            let now = Timestamp::now();
            p.mtime = now;
            p.ctime = now;
        }
        self.append(&format!("D {ino}\n"))?;
        self.save(parent)?;
        Ok(self.reap(ino))
    }

    /// Drops an unlinked inode with no references left; returns it.
    pub fn reap(&mut self, ino: u64) -> Option<Node<P>> {
        match self.nodes.get(&ino) {
            Some(n) if !n.linked && n.lookups == 0 && n.opens == 0 => self.nodes.remove(&ino),
            _ => None,
        }
    }

    /// Moves `ino` to `(parent, name)`; the target name must be free.
    pub fn relink(&mut self, ino: u64, parent: u64, name: &OsStr) -> Result<()> {
        let (old_parent, old_name, kind) = {
            let n = self.get(ino)?;
            (n.parent, n.name.clone(), n.kind)
        };
        let now = Timestamp::now();
        if let Ok(p) = self.get_mut(old_parent) {
            p.detach(&old_name, ino, kind);
            p.mtime = now;
            p.ctime = now;
        }
        let p = self.get_mut(parent)?;
        p.attach(name.to_os_string(), ino, kind);
        p.mtime = now;
        p.ctime = now;
        let n = self.get_mut(ino)?;
        n.parent = parent;
        n.name = name.to_os_string();
        n.ctime = now;
        self.save(ino)?;
        self.save(old_parent)?;
        if parent != old_parent {
            self.save(parent)?;
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
            assert!(t.unlink(g).unwrap().is_some());
            t.relink(f, ROOT, OsStr::new("moved")).unwrap();
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
            t.relink(c, b, OsStr::new("c2")).unwrap();
            assert_eq!((subdirs(&t, a), subdirs(&t, b)), (0, 1));
            let e = t.insert(node(a, "e", FileType::Directory)).unwrap();
            t.unlink(e).unwrap();
            assert_eq!(subdirs(&t, a), 0);
        }
        let t: Tree<P> = Tree::open(&path).unwrap();
        assert_eq!((subdirs(&t, ROOT), subdirs(&t, a), subdirs(&t, b)), (2, 0, 1));
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
