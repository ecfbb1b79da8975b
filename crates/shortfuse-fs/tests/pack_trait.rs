//! `pack` through the `Filesystem` trait, no kernel: data verification,
//! rename and delete, compaction, persistence across instances.

use std::ffi::OsStr;
use std::path::PathBuf;

use shortfuse::{Filesystem, NewNode, NodeId, OpenFlags, ReleaseArgs, RenameFlags, Request, SetAttr, WriteArgs};
use shortfuse_fs::pack::PackFs;
use shortfuse_fs::pattern::bytes;

const REQ: Request = Request {
    unique: 1,
    uid: 0,
    gid: 0,
    pid: 1,
};

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sf-pack-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn file_mode() -> NewNode {
    NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0o022,
        rdev: 0,
    }
}

/// Creates `name` in the root with `data` written in 128 KiB pieces.
// Test set-up of the same shape as put in stripe_trait.rs: kept apart so each
// test reads on its own.
fn put(fs: &PackFs, name: &str, data: &[u8]) -> NodeId {
    let c = fs
        .create(&REQ, NodeId::ROOT, OsStr::new(name), &file_mode(), OpenFlags::WRONLY)
        .unwrap();
    let node = c.entry.node;
    for (i, piece) in data.chunks(128 << 10).enumerate() {
        let args = WriteArgs {
            offset: (i * (128 << 10)) as u64,
            ..WriteArgs::default()
        };
        assert_eq!(fs.write(&REQ, node, c.opened.fh, piece, &args).unwrap(), piece.len());
    }
    fs.release(&REQ, node, c.opened.fh, &ReleaseArgs::default()).unwrap();
    // As the kernel would once the name leaves its cache.
    fs.forget(node, 1);
    node
}

fn get(fs: &PackFs, name: &str) -> Vec<u8> {
    let e = fs.lookup(&REQ, NodeId::ROOT, OsStr::new(name)).unwrap();
    let o = fs.open(&REQ, e.node, OpenFlags::RDONLY).unwrap();
    let map = o.data_map.as_ref().expect("pack returns a map");
    map.validate().unwrap();
    let size = e.attr.size as usize;
    let mut out = vec![0u8; size + 10];
    let mut at = 0;
    loop {
        let n = fs.read(&REQ, e.node, o.fh, at as u64, &mut out[at..]).unwrap();
        if n == 0 {
            break;
        }
        at += n;
    }
    out.truncate(at);
    // The map reads the same bytes as the daemon.
    let mut via_map = vec![0u8; size + 10];
    let n = map.read_at(0, &mut via_map).unwrap();
    assert_eq!(&via_map[..n], &out[..], "map and daemon disagree on {name}");
    fs.release(&REQ, e.node, o.fh, &ReleaseArgs::default()).unwrap();
    fs.forget(e.node, 1);
    out
}

const SIZES: [usize; 9] = [0, 1, 100, 4095, 4096, 5000, 70_000, 300_000, 1_500_000];

#[test]
fn data_survives_rename_delete_compaction_and_restart() {
    let dir = tempdir("all");
    {
        let fs = PackFs::new(&dir).unwrap();
        for (i, &size) in SIZES.iter().enumerate() {
            put(&fs, &format!("f{i}"), &bytes(i as u64, size));
        }
        for (i, &size) in SIZES.iter().enumerate() {
            assert_eq!(get(&fs, &format!("f{i}")), bytes(i as u64, size), "f{i}");
        }
        // Rename over an existing file, delete others.
        fs.rename(
            &REQ,
            NodeId::ROOT,
            OsStr::new("f8"),
            NodeId::ROOT,
            OsStr::new("f1"),
            RenameFlags::default(),
        )
        .unwrap();
        assert!(fs.lookup(&REQ, NodeId::ROOT, OsStr::new("f8")).is_err());
        for i in [2, 5, 7] {
            fs.unlink(&REQ, NodeId::ROOT, OsStr::new(&format!("f{i}"))).unwrap();
        }
        let (garbage, _) = fs.space();
        assert!(garbage > 300_000, "deleted data is garbage until compaction: {garbage}");
        let c = fs.compact().unwrap();
        assert!(c.bytes_reclaimed >= 300_000, "{c:?}");
        assert!(c.containers_removed >= 1, "{c:?}");
        // What is left is the padding that starts each slot of 4 KiB or
        // more on a block boundary (so that holes line up), under a block
        // per file.
        let left = fs.space().0;
        assert!(
            left < 4096 * SIZES.len() as u64,
            "garbage left after compaction: {left}"
        );
        assert_eq!(get(&fs, "f1"), bytes(8, SIZES[8]));
        assert_eq!(get(&fs, "f6"), bytes(6, SIZES[6]));
    }
    let fs = PackFs::new(&dir).unwrap();
    assert_eq!(get(&fs, "f1"), bytes(8, SIZES[8]));
    for i in [0, 3, 4, 6] {
        assert_eq!(
            get(&fs, &format!("f{i}")),
            bytes(i as u64, SIZES[i]),
            "f{i} after restart"
        );
    }
    for i in [2, 5, 7, 8] {
        assert!(fs.lookup(&REQ, NodeId::ROOT, OsStr::new(&format!("f{i}"))).is_err());
    }
    drop(fs);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn growth_holes_and_truncate_read_as_zeros() {
    let dir = tempdir("holes");
    let fs = PackFs::new(&dir).unwrap();
    // Two files interleaved, so growing one must move it.
    let a = put(&fs, "a", &bytes(1, 1000));
    put(&fs, "b", &bytes(2, 1000));
    let o = fs.open(&REQ, a, OpenFlags::RDWR).unwrap();
    let args = WriteArgs {
        offset: 5000,
        ..WriteArgs::default()
    };
    fs.write(&REQ, a, o.fh, b"tail", &args).unwrap();
    fs.release(&REQ, a, o.fh, &ReleaseArgs::default()).unwrap();
    let mut want = bytes(1, 1000);
    want.resize(5000, 0);
    want.extend_from_slice(b"tail");
    assert_eq!(get(&fs, "a"), want);
    assert_eq!(get(&fs, "b"), bytes(2, 1000), "b is untouched by a's move");
    // Shrink then grow: the dropped bytes must not come back.
    let shrink = SetAttr {
        size: Some(10),
        ..SetAttr::default()
    };
    fs.setattr(&REQ, a, &shrink).unwrap();
    let grow = SetAttr {
        size: Some(20),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&REQ, a, &grow).unwrap().size, 20);
    let mut want = bytes(1, 10);
    want.resize(20, 0);
    assert_eq!(get(&fs, "a"), want);
    drop(fs);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn directories_and_names() {
    let dir = tempdir("dirs");
    let fs = PackFs::new(&dir).unwrap();
    let dmode = NewNode {
        mode: libc::S_IFDIR | 0o755,
        umask: 0,
        rdev: 0,
    };
    let d = fs.mkdir(&REQ, NodeId::ROOT, OsStr::new("d"), &dmode).unwrap().node;
    let sub = fs.mkdir(&REQ, d, OsStr::new("sub"), &dmode).unwrap().node;
    assert_eq!(fs.getattr(&REQ, d, None).unwrap().nlink, 3);
    let c = fs
        .create(&REQ, sub, OsStr::new("x"), &file_mode(), OpenFlags::empty())
        .unwrap();
    fs.release(&REQ, c.entry.node, c.opened.fh, &ReleaseArgs::default())
        .unwrap();
    assert_eq!(
        fs.rmdir(&REQ, d, OsStr::new("sub")).unwrap_err(),
        shortfuse::Errno::ENOTEMPTY
    );
    assert_eq!(
        fs.rename(
            &REQ,
            NodeId::ROOT,
            OsStr::new("d"),
            sub,
            OsStr::new("loop"),
            RenameFlags::default()
        )
        .unwrap_err(),
        shortfuse::Errno::EINVAL,
        "a directory cannot move below itself"
    );
    fs.symlink(&REQ, d, OsStr::new("l"), OsStr::new("sub/x")).unwrap();
    fs.rename(
        &REQ,
        d,
        OsStr::new("sub"),
        NodeId::ROOT,
        OsStr::new("moved"),
        RenameFlags::default(),
    )
    .unwrap();
    drop(fs);
    let fs = PackFs::new(&dir).unwrap();
    let moved = fs.lookup(&REQ, NodeId::ROOT, OsStr::new("moved")).unwrap().node;
    fs.lookup(&REQ, moved, OsStr::new("x")).unwrap();
    let d = fs.lookup(&REQ, NodeId::ROOT, OsStr::new("d")).unwrap().node;
    let l = fs.lookup(&REQ, d, OsStr::new("l")).unwrap().node;
    assert_eq!(fs.readlink(&REQ, l).unwrap(), b"sub/x");
    drop(fs);
    std::fs::remove_dir_all(dir).unwrap();
}
