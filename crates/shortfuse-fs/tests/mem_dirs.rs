//! `mem` directories through the trait: readdir paging with a sink that
//! fills up, offsets that survive concurrent creates and deletes,
//! readdirplus lookup counting, and forget freeing inodes.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::sync::Arc;

use shortfuse::{
    DirPlusSink, DirSink, Entry, FileHandle, FileType, Filesystem, NewNode, NodeId, OpenFlags, ReleaseArgs, Request,
};
use shortfuse_fs::mem::MemFs;

const ROOT: Request = Request {
    unique: 1,
    uid: 0,
    gid: 0,
    pid: 1,
};

fn file_node() -> NewNode {
    NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
    }
}

/// Accepts at most `room` entries per call.
struct Pager {
    room: usize,
    got: Vec<(OsString, u64, u64)>,
}

impl DirSink for Pager {
    fn add(&mut self, ino: u64, next_offset: u64, _typ: FileType, name: &OsStr) -> bool {
        if self.got.len() == self.room {
            return false;
        }
        self.got.push((name.to_owned(), ino, next_offset));
        true
    }
}

struct PlusPager {
    room: usize,
    got: Vec<(OsString, Entry, u64)>,
}

impl DirPlusSink for PlusPager {
    fn add(&mut self, entry: &Entry, next_offset: u64, name: &OsStr) -> bool {
        if self.got.len() == self.room {
            return false;
        }
        self.got.push((name.to_owned(), *entry, next_offset));
        true
    }
}

/// Lists `dir` in pages of `room` entries; returns every name seen.
fn list(fs: &MemFs, dir: NodeId, room: usize) -> Vec<OsString> {
    let mut names = Vec::new();
    let mut offset = 0;
    loop {
        let mut sink = Pager { room, got: Vec::new() };
        fs.readdir(&ROOT, dir, FileHandle(0), offset, &mut sink).unwrap();
        let Some(last) = sink.got.last() else { return names };
        offset = last.2;
        names.extend(sink.got.into_iter().map(|(n, _, _)| n));
    }
}

// Test set-up of the same shape recurs from test to test below: kept apart
// so each test reads on its own.
#[test]
fn readdir_pages_with_full_sink() {
    let fs = MemFs::new();
    for i in 0..10_000 {
        fs.create(
            &ROOT,
            NodeId::ROOT,
            OsStr::new(&format!("f{i}")),
            &file_node(),
            OpenFlags::empty(),
        )
        .unwrap();
    }
    let names = list(&fs, NodeId::ROOT, 37);
    assert_eq!(names.len(), 10_002);
    assert_eq!(names[0], ".");
    assert_eq!(names[1], "..");
    let unique: HashSet<_> = names.iter().collect();
    assert_eq!(unique.len(), 10_002);
    // A sink with no room gets nothing and the listing can start over.
    let mut sink = Pager {
        room: 0,
        got: Vec::new(),
    };
    fs.readdir(&ROOT, NodeId::ROOT, FileHandle(0), 0, &mut sink).unwrap();
    assert!(sink.got.is_empty());
}

#[test]
fn offsets_survive_deletes_and_creates() {
    let fs = MemFs::new();
    for i in 0..100 {
        fs.create(
            &ROOT,
            NodeId::ROOT,
            OsStr::new(&format!("f{i}")),
            &file_node(),
            OpenFlags::empty(),
        )
        .unwrap();
    }
    let mut sink = Pager {
        room: 52,
        got: Vec::new(),
    };
    fs.readdir(&ROOT, NodeId::ROOT, FileHandle(0), 0, &mut sink).unwrap();
    let offset = sink.got.last().unwrap().2;
    // Remove what was already returned and the entry just returned, add new.
    for i in 0..50 {
        fs.unlink(&ROOT, NodeId::ROOT, OsStr::new(&format!("f{i}"))).unwrap();
    }
    fs.create(
        &ROOT,
        NodeId::ROOT,
        OsStr::new("late"),
        &file_node(),
        OpenFlags::empty(),
    )
    .unwrap();
    let mut rest = Vec::new();
    let mut off = offset;
    loop {
        let mut sink = Pager {
            room: 7,
            got: Vec::new(),
        };
        fs.readdir(&ROOT, NodeId::ROOT, FileHandle(0), off, &mut sink).unwrap();
        let Some(last) = sink.got.last() else { break };
        off = last.2;
        rest.extend(sink.got.into_iter().map(|(n, _, _)| n));
    }
    let expected: Vec<OsString> = (50..100)
        .map(|i| OsString::from(format!("f{i}")))
        .chain([OsString::from("late")])
        .collect();
    assert_eq!(rest, expected);
}

#[test]
fn readdir_while_others_create_and_delete() {
    let fs = Arc::new(MemFs::new());
    for i in 0..2000 {
        fs.create(
            &ROOT,
            NodeId::ROOT,
            OsStr::new(&format!("stable{i}")),
            &file_node(),
            OpenFlags::empty(),
        )
        .unwrap();
    }
    let writers: Vec<_> = (0..3)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                for i in 0..2000 {
                    let name = format!("t{t}-{i}");
                    fs.create(&ROOT, NodeId::ROOT, OsStr::new(&name), &file_node(), OpenFlags::empty())
                        .unwrap();
                    if i % 2 == 0 {
                        fs.unlink(&ROOT, NodeId::ROOT, OsStr::new(&name)).unwrap();
                    }
                }
            })
        })
        .collect();
    for _ in 0..5 {
        let names = list(&fs, NodeId::ROOT, 50);
        // Every entry present throughout appears exactly once.
        let stable: Vec<_> = names
            .iter()
            .filter(|n| n.to_str().is_some_and(|s| s.starts_with("stable")))
            .collect();
        assert_eq!(stable.len(), 2000);
        let unique: HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "a name came back twice");
    }
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(list(&fs, NodeId::ROOT, 1000).len(), 2 + 2000 + 3 * 1000);
}

#[test]
fn readdirplus_counts_only_accepted_entries() {
    let fs = MemFs::new();
    let d = fs
        .mkdir(
            &ROOT,
            NodeId::ROOT,
            OsStr::new("d"),
            &NewNode {
                mode: libc::S_IFDIR | 0o755,
                umask: 0,
                rdev: 0,
            },
        )
        .unwrap()
        .node;
    let mut nodes = Vec::new();
    for i in 0..5 {
        let c = fs
            .create(&ROOT, d, OsStr::new(&format!("f{i}")), &file_node(), OpenFlags::empty())
            .unwrap();
        fs.release(&ROOT, c.entry.node, c.opened.fh, &ReleaseArgs::default())
            .unwrap();
        // Give back the create's lookup: only readdirplus holds them now.
        fs.forget(c.entry.node, 1);
        nodes.push(c.entry.node);
    }
    let mut sink = PlusPager {
        room: 4,
        got: Vec::new(),
    };
    fs.readdirplus(&ROOT, d, FileHandle(0), 0, &mut sink).unwrap();
    assert_eq!(sink.got.len(), 4);
    assert_eq!(sink.got[0].0, ".");
    assert_eq!(sink.got[1].0, "..");
    assert_eq!(sink.got[1].1.node, NodeId::ROOT);
    assert_eq!(sink.got[2].1.node, nodes[0]);
    let off = sink.got[3].2;
    let mut rest = PlusPager {
        room: 100,
        got: Vec::new(),
    };
    fs.readdirplus(&ROOT, d, FileHandle(0), off, &mut rest).unwrap();
    assert_eq!(rest.got.len(), 3);
    // Unlink all; each inode lives exactly as long as its one lookup.
    for i in 0..5 {
        fs.unlink(&ROOT, d, OsStr::new(&format!("f{i}"))).unwrap();
    }
    let count = fs.inode_count();
    for node in &nodes {
        assert!(fs.getattr(&ROOT, *node, None).is_ok());
        fs.forget(*node, 1);
        assert!(fs.getattr(&ROOT, *node, None).is_err());
    }
    assert_eq!(fs.inode_count(), count - 5);
}

#[test]
fn forget_frees_only_unused_inodes() {
    let fs = MemFs::new();
    let base = fs.inode_count();
    let c = fs
        .create(&ROOT, NodeId::ROOT, OsStr::new("f"), &file_node(), OpenFlags::empty())
        .unwrap();
    let node = c.entry.node;
    // A second lookup, then the name goes away.
    fs.lookup(&ROOT, NodeId::ROOT, OsStr::new("f")).unwrap();
    fs.unlink(&ROOT, NodeId::ROOT, OsStr::new("f")).unwrap();
    fs.forget(node, 2);
    // Still open: data stays readable.
    assert_eq!(fs.inode_count(), base + 1);
    assert!(fs.getattr(&ROOT, node, None).is_ok());
    fs.release(&ROOT, node, c.opened.fh, &ReleaseArgs::default()).unwrap();
    assert_eq!(fs.inode_count(), base);
    // A named inode survives forget.
    let c = fs
        .create(&ROOT, NodeId::ROOT, OsStr::new("g"), &file_node(), OpenFlags::empty())
        .unwrap();
    fs.release(&ROOT, c.entry.node, c.opened.fh, &ReleaseArgs::default())
        .unwrap();
    fs.forget(c.entry.node, 1);
    assert_eq!(fs.inode_count(), base + 1);
    let again = fs.lookup(&ROOT, NodeId::ROOT, OsStr::new("g")).unwrap();
    assert_eq!(again.node, c.entry.node);
    // The root is never freed.
    fs.forget(NodeId::ROOT, 100);
    assert!(fs.getattr(&ROOT, NodeId::ROOT, None).is_ok());
}

#[test]
fn removed_directory_lists_nothing() {
    let fs = MemFs::new();
    let d = fs
        .mkdir(
            &ROOT,
            NodeId::ROOT,
            OsStr::new("d"),
            &NewNode {
                mode: libc::S_IFDIR | 0o755,
                umask: 0,
                rdev: 0,
            },
        )
        .unwrap()
        .node;
    fs.opendir(&ROOT, d, OpenFlags::empty()).unwrap();
    fs.rmdir(&ROOT, NodeId::ROOT, OsStr::new("d")).unwrap();
    assert!(list(&fs, d, 10).is_empty());
    assert_eq!(
        fs.create(&ROOT, d, OsStr::new("x"), &file_node(), OpenFlags::empty())
            .err(),
        Some(shortfuse::Errno::ENOENT)
    );
    let attr = fs.getattr(&ROOT, d, None).unwrap();
    assert_eq!((attr.nlink, attr.size), (0, 0));
}
