//! `stripe` through the `Filesystem` trait, no kernel: data verification,
//! chunk placement, holes, truncate, rename and delete, persistence, and
//! descriptors held only while files are open.

use std::ffi::OsStr;
use std::path::PathBuf;

use shortfuse::{Filesystem, NewNode, NodeId, OpenFlags, ReleaseArgs, RenameFlags, Request, SetAttr, WriteArgs};
use shortfuse_fs::pattern::bytes;
use shortfuse_fs::stripe::StripeFs;

const REQ: Request = Request {
    unique: 1,
    uid: 0,
    gid: 0,
    pid: 1,
};
const STRIPE: u64 = 64 << 10;

fn dirs(tag: &str) -> (PathBuf, Vec<PathBuf>) {
    let base = std::env::temp_dir().join(format!("sf-stripe-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dirs = (0..3).map(|i| base.join(format!("d{i}"))).collect();
    (base, dirs)
}

// Test set-up of the same shape as put in pack_trait.rs: kept apart so each
// test reads on its own.
fn put(fs: &StripeFs, name: &str, data: &[u8]) -> NodeId {
    let mode = NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
    };
    let c = fs
        .create(&REQ, NodeId::ROOT, OsStr::new(name), &mode, OpenFlags::WRONLY)
        .unwrap();
    let node = c.entry.node;
    // 100000-byte pieces: writes cross chunk boundaries.
    for (i, piece) in data.chunks(100_000).enumerate() {
        let args = WriteArgs {
            offset: (i * 100_000) as u64,
            ..WriteArgs::default()
        };
        fs.write(&REQ, node, c.opened.fh, piece, &args).unwrap();
    }
    fs.release(&REQ, node, c.opened.fh, &ReleaseArgs::default()).unwrap();
    fs.forget(node, 1);
    node
}

fn get(fs: &StripeFs, name: &str) -> Vec<u8> {
    let e = fs.lookup(&REQ, NodeId::ROOT, OsStr::new(name)).unwrap();
    let o = fs.open(&REQ, e.node, OpenFlags::RDONLY).unwrap();
    let map = o.data_map.as_ref().unwrap();
    map.validate().unwrap();
    assert_eq!(map.extents.len(), 3);
    let mut out = vec![0u8; e.attr.size as usize + 7];
    let n = fs.read(&REQ, e.node, o.fh, 0, &mut out).unwrap();
    out.truncate(n);
    let mut via_map = vec![0u8; e.attr.size as usize + 7];
    let m = map.read_at(0, &mut via_map).unwrap();
    assert_eq!(&via_map[..m], &out[..], "map and daemon disagree on {name}");
    fs.release(&REQ, e.node, o.fh, &ReleaseArgs::default()).unwrap();
    fs.forget(e.node, 1);
    out
}

fn chunk_sizes(fs: &StripeFs, ino: NodeId) -> Vec<u64> {
    (0..3)
        .map(|i| std::fs::metadata(fs.chunk_path(i, ino.0).unwrap()).map_or(u64::MAX, |m| m.len()))
        .collect()
}

#[test]
fn files_spread_over_chunks_and_survive_restart() {
    let (base, dirs) = dirs("data");
    let sizes = [0usize, 1, 4096, 65_536, 65_537, 200_000, 1_000_000];
    {
        let fs = StripeFs::new(dirs.clone(), STRIPE).unwrap();
        let mut nodes = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            nodes.push(put(&fs, &format!("f{i}"), &bytes(i as u64, size)));
        }
        for (i, &size) in sizes.iter().enumerate() {
            assert_eq!(get(&fs, &format!("f{i}")), bytes(i as u64, size), "f{i}");
        }
        assert_eq!(chunk_sizes(&fs, nodes[5]), vec![STRIPE, STRIPE, 200_000 - 2 * STRIPE]);
        assert_eq!(chunk_sizes(&fs, nodes[2]), vec![4096, 0, 0]);
        fs.rename(
            &REQ,
            NodeId::ROOT,
            OsStr::new("f6"),
            NodeId::ROOT,
            OsStr::new("f1"),
            RenameFlags::default(),
        )
        .unwrap();
        assert_eq!(
            chunk_sizes(&fs, nodes[1]),
            vec![u64::MAX; 3],
            "replaced file's chunks are gone"
        );
        fs.unlink(&REQ, NodeId::ROOT, OsStr::new("f4")).unwrap();
        assert_eq!(chunk_sizes(&fs, nodes[4]), vec![u64::MAX; 3]);
    }
    let fs = StripeFs::new(dirs, STRIPE).unwrap();
    assert_eq!(get(&fs, "f1"), bytes(6, 1_000_000));
    assert_eq!(get(&fs, "f5"), bytes(5, 200_000));
    assert!(fs.lookup(&REQ, NodeId::ROOT, OsStr::new("f4")).is_err());
    drop(fs);
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn far_writes_and_truncate_keep_zeros() {
    let (base, dirs) = dirs("holes");
    let fs = StripeFs::new(dirs, STRIPE).unwrap();
    let a = put(&fs, "a", b"head");
    let o = fs.open(&REQ, a, OpenFlags::RDWR).unwrap();
    let far = 3 * STRIPE + 10;
    let args = WriteArgs {
        offset: far,
        ..WriteArgs::default()
    };
    fs.write(&REQ, a, o.fh, b"tail", &args).unwrap();
    fs.release(&REQ, a, o.fh, &ReleaseArgs::default()).unwrap();
    let mut want = b"head".to_vec();
    want.resize(far as usize, 0);
    want.extend_from_slice(b"tail");
    assert_eq!(get(&fs, "a"), want);
    assert_eq!(fs.getattr(&REQ, a, None).unwrap().size, far + 4);
    let set = |size| SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    fs.setattr(&REQ, a, &set(STRIPE + 5)).unwrap();
    assert_eq!(chunk_sizes(&fs, a), vec![STRIPE, 5, 0]);
    fs.setattr(&REQ, a, &set(2)).unwrap();
    fs.setattr(&REQ, a, &set(STRIPE * 2 + 1)).unwrap();
    let mut want = b"he".to_vec();
    want.resize((STRIPE * 2 + 1) as usize, 0);
    assert_eq!(get(&fs, "a"), want);
    drop(fs);
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn bad_arguments_are_refused() {
    let (base, dirs) = dirs("bad");
    assert!(StripeFs::new(Vec::new(), STRIPE).is_err());
    assert!(StripeFs::new(dirs.clone(), 0).is_err());
    let many: Vec<PathBuf> = (0..17).map(|i| base.join(format!("m{i}"))).collect();
    assert!(StripeFs::new(many, STRIPE).is_err());
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn chunk_files_stay_open_only_while_their_file_is() {
    let (base, dirs) = dirs("held");
    let fs = StripeFs::new(dirs, STRIPE).unwrap();
    let names: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
    for n in &names {
        put(&fs, n, b"x");
    }
    // Looking files up and stating them holds nothing open.
    for n in &names {
        let e = fs.lookup(&REQ, NodeId::ROOT, OsStr::new(n)).unwrap();
        assert_eq!(fs.getattr(&REQ, e.node, None).unwrap().size, 1);
    }
    assert_eq!(fs.files_held(), 0);
    // An open file keeps its chunks until its last close.
    let e = fs.lookup(&REQ, NodeId::ROOT, OsStr::new("f0")).unwrap();
    let first = fs.open(&REQ, e.node, OpenFlags::RDWR).unwrap();
    let second = fs.open(&REQ, e.node, OpenFlags::RDONLY).unwrap();
    assert_eq!(fs.files_held(), 1);
    fs.release(&REQ, e.node, first.fh, &ReleaseArgs::default()).unwrap();
    assert_eq!(fs.files_held(), 1);
    assert_eq!(get(&fs, "f0"), b"x");
    fs.release(&REQ, e.node, second.fh, &ReleaseArgs::default()).unwrap();
    assert_eq!(fs.files_held(), 0);
    drop(fs);
    std::fs::remove_dir_all(base).unwrap();
}
