//! Walks whose caller reads attributes alone, against a daemon that shares
//! the names it keeps (`Backend::shared_entry`): the names come from the
//! table without a request, and a node found there is never sent to the
//! file system, which holds no lookup of it for this process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use shortfuse::{Attr, Errno, MountOptions, NodeId, Stats};
use shortfuse_abi as abi;
use shortfuse_fs::mem::MemFs;
use shortfuse_vfs::*;

const MP: &[u8] = b"/mnt/x";

/// The (opcode, node) of every request a backend carried.
type Sent = Arc<Mutex<Vec<(u32, u64)>>>;

/// An in-process backend with a shared table of names, noting what it
/// carries.
struct Sharing {
    inner: InProcess,
    table: HashMap<(u64, Vec<u8>), (NodeId, abi::fuse_attr)>,
    sent: Sent,
}

impl Backend for Sharing {
    fn call(&self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), Errno> {
        let h = abi::parse_header(request).expect("a request");
        self.sent.lock().unwrap().push((h.opcode, h.nodeid));
        self.inner.call(request, reply)
    }

    fn shared_entry(&self, parent: NodeId, name: &[u8], _uid: u32) -> Option<(NodeId, abi::fuse_attr)> {
        self.table.get(&(parent.0, name.to_vec())).copied()
    }

    fn has_shared_entries(&self) -> bool {
        true
    }
}

fn fuse_attr(a: &Attr) -> abi::fuse_attr {
    abi::fuse_attr {
        ino: a.ino,
        size: a.size,
        mode: a.mode,
        nlink: a.nlink,
        ..Default::default()
    }
}

fn flags(follow: bool, attrs_only: bool) -> WalkFlags {
    WalkFlags {
        follow,
        create: false,
        attrs_only,
    }
}

fn target(vfs: &Vfs, path: &str, f: WalkFlags) -> Result<Target, Errno> {
    match vfs.walk(&Location::root(), path.as_bytes(), f, 0)? {
        Walk::Inside(t) => Ok(t),
        Walk::Outside { path, .. } => panic!("{path:?} left the mount"),
    }
}

/// A file system with `d/file` and `d/link` -> `file`, made by another
/// process; and a program's VFS whose shared table holds `d` and `d/link`
/// (not `d/file`), with what it sends.
fn setup() -> (Vfs, Sent, NodeId, NodeId) {
    let mem = Arc::new(MemFs::new());
    let other = Vfs::new(
        Box::new(InProcess::new(
            mem.clone(),
            MountOptions::default(),
            Arc::new(Stats::new()),
        )),
        MP,
        1,
        Creds::default(),
    )
    .unwrap();
    other
        .mkdir(&target(&other, "d", flags(false, false)).unwrap(), 0o755)
        .unwrap();
    let file = target(&other, "d/file", flags(false, false)).unwrap();
    let file = Arc::new(other).open(&file, libc::O_CREAT | libc::O_WRONLY, 0o644);
    let other = file.as_ref().map(|f| f.vfs().clone()).unwrap();
    drop(file);
    other
        .symlink(b"file", &target(&other, "d/link", flags(false, false)).unwrap())
        .unwrap();
    let found = |p: &str| target(&other, p, flags(false, false)).unwrap().node.unwrap();
    let (d, link) = (found("d"), found("d/link"));
    let mut table = HashMap::new();
    table.insert((1, b"d".to_vec()), (d.0, fuse_attr(&d.1)));
    table.insert((d.0 .0, b"link".to_vec()), (link.0, fuse_attr(&link.1)));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let backend = Sharing {
        inner: InProcess::new(mem, MountOptions::default(), Arc::new(Stats::new())),
        table,
        sent: sent.clone(),
    };
    let vfs = Vfs::new(Box::new(backend), MP, 1, Creds::default()).unwrap();
    sent.lock().unwrap().clear();
    (vfs, sent, d.0, link.0)
}

#[test]
fn names_in_the_shared_table_are_found_without_a_request() {
    let (vfs, sent, _, link) = setup();
    let t = target(&vfs, "d/link", flags(false, true)).unwrap();
    assert_eq!(
        t.node.map(|(n, a)| (n, a.mode & libc::S_IFMT)),
        Some((link, libc::S_IFLNK))
    );
    assert_eq!(*sent.lock().unwrap(), vec![]);
    // A walk that may hand the node on does not use the table.
    target(&vfs, "d/link", flags(false, false)).unwrap();
    assert_eq!(sent.lock().unwrap().len(), 2, "{:?}", sent.lock().unwrap());
}

#[test]
fn a_walk_that_would_send_a_node_of_the_table_starts_again_without_it() {
    let (vfs, sent, d, _) = setup();
    // d/file is not in the table: looking it up in d would name d, which
    // this process never looked up. It looks d up first.
    let t = target(&vfs, "d/file", flags(false, true)).unwrap();
    assert_eq!(t.node.map(|(_, a)| a.mode & libc::S_IFMT), Some(libc::S_IFREG));
    assert_eq!(
        *sent.lock().unwrap(),
        vec![(abi::FUSE_LOOKUP, 1), (abi::FUSE_LOOKUP, d.0)]
    );
}

#[test]
fn a_link_of_the_table_is_not_read_through_its_node() {
    let (vfs, sent, d, _) = setup();
    let t = target(&vfs, "d/link", flags(true, true)).unwrap();
    assert_eq!(t.node.map(|(_, a)| a.mode & libc::S_IFMT), Some(libc::S_IFREG));
    let sent = sent.lock().unwrap();
    assert_eq!(sent.first(), Some(&(abi::FUSE_LOOKUP, 1)), "{sent:?}");
    assert!(sent.contains(&(abi::FUSE_LOOKUP, d.0)), "{sent:?}");
}
