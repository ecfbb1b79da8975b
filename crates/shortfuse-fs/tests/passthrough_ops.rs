//! The passthrough file system through its trait, without a kernel: every
//! operation against a temporary source directory, checked against what
//! the source shows.

mod passthrough_support;

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::sync::Arc;

use passthrough_support::{root_req, user_req, Names, Plus, TempDir};
use shortfuse::{
    AccessMode, CopyRange, Errno, FallocateFlags, FileHandle, FileType, Filesystem, NewNode, NodeId, OpenFlags,
    ReleaseArgs, RenameFlags, SetAttr, SetTime, Timestamp, Whence, WriteArgs, XattrFlags,
};
use shortfuse_fs::passthrough::{PassthroughFs, SymlinkMode};

fn new_node(mode: u32) -> NewNode {
    NewNode {
        mode,
        umask: 0,
        rdev: 0,
    }
}

fn opts(items: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
    items
        .iter()
        .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
        .collect()
}

fn release(fs: &PassthroughFs, node: NodeId, fh: FileHandle) {
    fs.release(&root_req(), node, fh, &ReleaseArgs::default()).unwrap();
}

// Test set-up of the same shape recurs from test to test below: kept apart
// so each test reads on its own.
#[test]
fn construction_errors_are_clear() {
    let tmp = TempDir::new("ctor");
    let missing = tmp.path().join("missing");
    let err = PassthroughFs::new(&missing).err().expect("missing source must fail");
    assert!(err.to_string().contains("missing"), "{err}");
    let file = tmp.path().join("file");
    fs::write(&file, b"x").unwrap();
    let err = PassthroughFs::new(&file).err().expect("a file is not a source");
    assert_eq!(err.kind(), std::io::ErrorKind::NotADirectory, "{err}");
    assert!(err.to_string().contains("file"), "{err}");

    let err = PassthroughFs::with_options(tmp.path(), &opts(&[("frobnicate", Some("1"))]))
        .err()
        .unwrap();
    assert!(err.to_string().contains("frobnicate"), "{err}");
    let err = PassthroughFs::with_options(tmp.path(), &opts(&[("symlinks", Some("maybe"))]))
        .err()
        .unwrap();
    assert!(err.to_string().contains("symlinks=maybe"), "{err}");
    let fs = PassthroughFs::with_options(tmp.path(), &opts(&[("symlinks", Some("beneath"))])).unwrap();
    assert_eq!(fs.options().symlinks, SymlinkMode::Beneath);
}

#[test]
fn create_write_read_and_attributes() {
    let tmp = TempDir::new("data");
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let created = fs
        .create(
            &req,
            NodeId::ROOT,
            OsStr::new("f"),
            &new_node(libc::S_IFREG | 0o640),
            OpenFlags::RDWR,
        )
        .unwrap();
    let node = created.entry.node;
    let fh = created.opened.fh;
    assert!(created.opened.data_map.is_some());
    let real = fs::metadata(tmp.path().join("f")).unwrap();
    assert_eq!(created.entry.attr.ino, real.ino(), "st_ino is the source's");
    assert_eq!(real.mode() & 0o7777, 0o640);

    let args = WriteArgs {
        offset: 0,
        ..WriteArgs::default()
    };
    assert_eq!(fs.write(&req, node, fh, b"hello world", &args).unwrap(), 11);
    let args = WriteArgs {
        offset: 6,
        ..WriteArgs::default()
    };
    assert_eq!(fs.write(&req, node, fh, b"there", &args).unwrap(), 5);
    let mut buf = [0u8; 64];
    let n = fs.read(&req, node, fh, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello there");
    assert_eq!(fs.read(&req, node, fh, 100, &mut buf).unwrap(), 0);
    assert_eq!(fs::read(tmp.path().join("f")).unwrap(), b"hello there");
    assert_eq!(fs.getattr(&req, node, Some(fh)).unwrap().size, 11);
    fs.flush(&req, node, fh, 0).unwrap();
    fs.fsync(&req, node, fh, true).unwrap();
    release(&fs, node, fh);
    assert_eq!(fs.handle_count(), 0);
    // A released handle is gone; a handle of another node is refused.
    assert_eq!(fs.read(&req, node, fh, 0, &mut buf).unwrap_err(), Errno::EBADF);

    // O_EXCL on an existing name.
    let err = fs
        .create(
            &req,
            NodeId::ROOT,
            OsStr::new("f"),
            &new_node(0o644),
            OpenFlags::RDWR | OpenFlags::EXCL,
        )
        .unwrap_err();
    assert_eq!(err, Errno::EEXIST);

    // O_APPEND is honoured by the real descriptor whatever the offset.
    let opened = fs.open(&req, node, OpenFlags::WRONLY | OpenFlags::APPEND).unwrap();
    let args = WriteArgs {
        offset: 0,
        ..WriteArgs::default()
    };
    fs.write(&req, node, opened.fh, b"!", &args).unwrap();
    release(&fs, node, opened.fh);
    assert_eq!(fs::read(tmp.path().join("f")).unwrap(), b"hello there!");

    // Lookup of the same file gives the same node.
    let again = fs.lookup(&req, NodeId::ROOT, OsStr::new("f")).unwrap();
    assert_eq!(again.node, node);
}

#[test]
fn setattr_chmod_truncate_times_chown() {
    let tmp = TempDir::new("setattr");
    fs::write(tmp.path().join("f"), b"0123456789").unwrap();
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let node = fs.lookup(&req, NodeId::ROOT, OsStr::new("f")).unwrap().node;
    let set = SetAttr {
        mode: Some(0o600),
        size: Some(4),
        mtime: Some(SetTime::At(Timestamp {
            sec: 1_000_000,
            nsec: 5,
        })),
        uid: Some(1234),
        gid: Some(4321),
        ..SetAttr::default()
    };
    let attr = fs.setattr(&req, node, &set).unwrap();
    assert_eq!(attr.mode & 0o7777, 0o600);
    assert_eq!(attr.size, 4);
    assert_eq!(
        attr.mtime,
        Timestamp {
            sec: 1_000_000,
            nsec: 5
        }
    );
    let real = fs::metadata(tmp.path().join("f")).unwrap();
    assert_eq!(
        (real.uid(), real.gid(), real.len(), real.mtime()),
        (1234, 4321, 4, 1_000_000)
    );

    // Through an open handle: ftruncate on it.
    let opened = fs.open(&req, node, OpenFlags::RDWR).unwrap();
    let set = SetAttr {
        size: Some(1),
        fh: Some(opened.fh),
        atime: Some(SetTime::Now),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&req, node, &set).unwrap().size, 1);
    release(&fs, node, opened.fh);

    // kill_suidgid clears set-user-id.
    fs::set_permissions(tmp.path().join("f"), fs::Permissions::from_mode(0o4755)).unwrap();
    let set = SetAttr {
        size: Some(0),
        kill_suidgid: true,
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&req, node, &set).unwrap().mode & 0o7777, 0o755);
}

#[test]
fn directories_rename_unlink_rmdir() {
    let tmp = TempDir::new("dirs");
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let d = fs.mkdir(&req, NodeId::ROOT, OsStr::new("d"), &new_node(0o755)).unwrap();
    assert_eq!(d.attr.file_type(), FileType::Directory);
    let a = fs
        .create(&req, d.node, OsStr::new("a"), &new_node(0o644), OpenFlags::WRONLY)
        .unwrap();
    release(&fs, a.entry.node, a.opened.fh);
    fs::write(tmp.path().join("b"), b"b").unwrap();

    fs.rename(
        &req,
        d.node,
        OsStr::new("a"),
        NodeId::ROOT,
        OsStr::new("a2"),
        RenameFlags::default(),
    )
    .unwrap();
    assert!(tmp.path().join("a2").exists() && !tmp.path().join("d/a").exists());
    let noreplace = RenameFlags {
        noreplace: true,
        ..RenameFlags::default()
    };
    let err = fs
        .rename(
            &req,
            NodeId::ROOT,
            OsStr::new("a2"),
            NodeId::ROOT,
            OsStr::new("b"),
            noreplace,
        )
        .unwrap_err();
    assert_eq!(err, Errno::EEXIST);
    let exchange = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    fs.rename(
        &req,
        NodeId::ROOT,
        OsStr::new("a2"),
        NodeId::ROOT,
        OsStr::new("b"),
        exchange,
    )
    .unwrap();
    assert_eq!(fs::read(tmp.path().join("a2")).unwrap(), b"b");
    // The node follows the inode, not the name.
    let a2 = fs.lookup(&req, NodeId::ROOT, OsStr::new("b")).unwrap();
    assert_eq!(a2.node, a.entry.node);

    assert_eq!(
        fs.rmdir(&req, NodeId::ROOT, OsStr::new("a2")).unwrap_err(),
        Errno::ENOTDIR
    );
    fs.unlink(&req, NodeId::ROOT, OsStr::new("a2")).unwrap();
    fs::write(tmp.path().join("d/x"), b"").unwrap();
    assert_eq!(
        fs.rmdir(&req, NodeId::ROOT, OsStr::new("d")).unwrap_err(),
        Errno::ENOTEMPTY
    );
    fs.unlink(&req, d.node, OsStr::new("x")).unwrap();
    fs.rmdir(&req, NodeId::ROOT, OsStr::new("d")).unwrap();
    assert_eq!(
        fs.lookup(&req, NodeId::ROOT, OsStr::new("d")).unwrap_err(),
        Errno::ENOENT
    );
    // A directory node is not a file parent's target for lookups of files.
    assert_eq!(
        fs.lookup(&req, a.entry.node, OsStr::new("x")).unwrap_err(),
        Errno::ENOTDIR
    );
}

#[test]
fn hard_links_share_a_node_and_symlinks_read_back_raw() {
    let tmp = TempDir::new("links");
    fs::write(tmp.path().join("f"), b"data").unwrap();
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let f = fs.lookup(&req, NodeId::ROOT, OsStr::new("f")).unwrap();
    let l = fs.link(&req, f.node, NodeId::ROOT, OsStr::new("g")).unwrap();
    assert_eq!(l.node, f.node);
    assert_eq!(l.attr.nlink, 2);
    assert_eq!(fs::read(tmp.path().join("g")).unwrap(), b"data");

    let s = fs
        .symlink(&req, NodeId::ROOT, OsStr::new("s"), OsStr::new("/etc/../nowhere"))
        .unwrap();
    assert_eq!(s.attr.file_type(), FileType::Symlink);
    assert_eq!(fs.readlink(&req, s.node).unwrap(), b"/etc/../nowhere");
    assert_eq!(fs.readlink(&req, f.node).unwrap_err(), Errno::EINVAL);
    // A hard link to a symlink links the symlink itself.
    let sl = fs.link(&req, s.node, NodeId::ROOT, OsStr::new("s2")).unwrap();
    assert_eq!(sl.node, s.node);
    assert_eq!(
        fs::read_link(tmp.path().join("s2")).unwrap().as_os_str(),
        "/etc/../nowhere"
    );

    // mknod: a FIFO.
    let p = fs
        .mknod(&req, NodeId::ROOT, OsStr::new("p"), &new_node(libc::S_IFIFO | 0o600))
        .unwrap();
    assert_eq!(p.attr.file_type(), FileType::Fifo);

    // Forgetting every lookup frees the nodes; a later lookup gets a new id.
    let before = fs.inode_count();
    fs.forget(f.node, 2);
    fs.forget(s.node, 2);
    fs.forget(p.node, 1);
    assert_eq!(fs.inode_count(), before - 3);
    assert_eq!(fs.getattr(&req, f.node, None).unwrap_err(), Errno::ESTALE);
    let f2 = fs.lookup(&req, NodeId::ROOT, OsStr::new("f")).unwrap();
    assert_ne!(f2.node, f.node);
    assert_eq!(f2.attr.ino, f.attr.ino);
}

fn setfattr(args: &[&str]) {
    let status = Command::new("setfattr")
        .args(args)
        .status()
        .expect("setfattr (package attr) must be installed");
    assert!(status.success(), "setfattr {args:?}");
}

#[test]
fn xattrs_on_files_and_on_symlinks_themselves() {
    let tmp = TempDir::new("xattr");
    fs::write(tmp.path().join("f"), b"").unwrap();
    std::os::unix::fs::symlink("f", tmp.path().join("s")).unwrap();
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let f = fs.lookup(&req, NodeId::ROOT, OsStr::new("f")).unwrap().node;
    fs.setxattr(&req, f, OsStr::new("user.k"), b"v1", XattrFlags::empty())
        .unwrap();
    assert_eq!(fs.getxattr(&req, f, OsStr::new("user.k")).unwrap(), b"v1");
    assert_eq!(
        fs.setxattr(&req, f, OsStr::new("user.k"), b"v2", XattrFlags::CREATE)
            .unwrap_err(),
        Errno::EEXIST
    );
    assert!(fs
        .listxattr(&req, f)
        .unwrap()
        .split(|&b| b == 0)
        .any(|n| n == b"user.k"));
    fs.removexattr(&req, f, OsStr::new("user.k")).unwrap();
    assert_eq!(fs.getxattr(&req, f, OsStr::new("user.k")).unwrap_err(), Errno::ENODATA);

    // The /proc/self/fd magic link of a symlink's O_PATH descriptor leads to
    // the symlink itself, not to its target: trusted.* may sit on both.
    setfattr(&[
        "-n",
        "trusted.which",
        "-v",
        "target",
        tmp.path().join("f").to_str().unwrap(),
    ]);
    setfattr(&[
        "-h",
        "-n",
        "trusted.which",
        "-v",
        "link",
        tmp.path().join("s").to_str().unwrap(),
    ]);
    let s = fs.lookup(&req, NodeId::ROOT, OsStr::new("s")).unwrap().node;
    assert_eq!(fs.getxattr(&req, s, OsStr::new("trusted.which")).unwrap(), b"link");
    assert_eq!(fs.getxattr(&req, f, OsStr::new("trusted.which")).unwrap(), b"target");
    fs.setxattr(&req, s, OsStr::new("trusted.which"), b"link2", XattrFlags::empty())
        .unwrap();
    assert_eq!(fs.getxattr(&req, f, OsStr::new("trusted.which")).unwrap(), b"target");
}

#[test]
fn data_ops_fallocate_lseek_copy_file_range_statfs() {
    let tmp = TempDir::new("dataops");
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let a = fs
        .create(&req, NodeId::ROOT, OsStr::new("a"), &new_node(0o644), OpenFlags::RDWR)
        .unwrap();
    let b = fs
        .create(&req, NodeId::ROOT, OsStr::new("b"), &new_node(0o644), OpenFlags::RDWR)
        .unwrap();
    let (an, af, bn, bf) = (a.entry.node, a.opened.fh, b.entry.node, b.opened.fh);
    let args = WriteArgs {
        offset: 1 << 20,
        ..WriteArgs::default()
    };
    fs.write(&req, an, af, &[7u8; 4096], &args).unwrap();
    // A hole before the data.
    assert_eq!(fs.lseek(&req, an, af, 0, Whence::Data).unwrap(), 1 << 20);
    assert_eq!(fs.lseek(&req, an, af, 0, Whence::Hole).unwrap(), 0);
    fs.fallocate(&req, an, af, 0, 2 << 20, FallocateFlags::empty()).unwrap();
    assert_eq!(fs.getattr(&req, an, Some(af)).unwrap().size, 2 << 20);

    let range = CopyRange {
        node_in: an,
        fh_in: af,
        off_in: 1 << 20,
        node_out: bn,
        fh_out: bf,
        off_out: 10,
        len: 4096,
        flags: 0,
    };
    assert_eq!(fs.copy_file_range(&req, &range).unwrap(), 4096);
    let mut buf = vec![0u8; 4106];
    assert_eq!(fs.read(&req, bn, bf, 0, &mut buf).unwrap(), 4106);
    assert!(buf[..10].iter().all(|&x| x == 0) && buf[10..].iter().all(|&x| x == 7));

    let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    fs.fallocate(&req, an, af, 1 << 20, 4096, punch).unwrap();
    assert_eq!(fs.lseek(&req, an, af, 0, Whence::Data).unwrap_err(), Errno::ENXIO);

    let st = fs.statfs(&req, NodeId::ROOT).unwrap();
    assert!(st.blocks > 0 && st.bsize > 0 && st.namelen >= 255);
    release(&fs, an, af);
    release(&fs, bn, bf);
}

#[test]
fn readdir_pages_through_ten_thousand_entries() {
    let tmp = TempDir::new("readdir");
    for i in 0..10_000 {
        fs::write(tmp.path().join(format!("e{i:05}")), b"").unwrap();
    }
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let dir = fs.opendir(&req, NodeId::ROOT, OpenFlags::RDONLY).unwrap().fh;
    let mut seen = HashSet::new();
    let mut offset = 0;
    loop {
        let mut sink = Names::new(97);
        fs.readdir(&req, NodeId::ROOT, dir, offset, &mut sink).unwrap();
        if sink.got.is_empty() {
            break;
        }
        for (name, _, _, _) in &sink.got {
            assert!(seen.insert(name.clone()), "{name:?} listed twice");
        }
        offset = sink.got.last().unwrap().1;
    }
    assert_eq!(seen.len(), 10_002);
    assert!(seen.contains(OsStr::new(".")) && seen.contains(OsStr::new("..")));

    // Seeking back to a cookie given earlier resumes at the same entry.
    let mut first = Names::new(10);
    fs.readdir(&req, NodeId::ROOT, dir, 0, &mut first).unwrap();
    let mut again = Names::new(3);
    fs.readdir(&req, NodeId::ROOT, dir, first.got[4].1, &mut again).unwrap();
    assert_eq!(again.got[0].0, first.got[5].0);
    fs.releasedir(&req, NodeId::ROOT, dir, OpenFlags::empty()).unwrap();
    assert_eq!(fs.handle_count(), 0);
}

#[test]
fn readdir_stays_exact_under_concurrent_creates() {
    let tmp = TempDir::new("readdir-conc");
    for i in 0..3000 {
        fs::write(tmp.path().join(format!("old{i}")), b"").unwrap();
    }
    let fs = Arc::new(PassthroughFs::new(tmp.path()).unwrap());
    let req = root_req();
    let creator = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            for i in 0..3000 {
                let name = OsString::from(format!("new{i}"));
                let c = fs
                    .create(&req, NodeId::ROOT, &name, &new_node(0o644), OpenFlags::WRONLY)
                    .unwrap();
                fs.release(&req, c.entry.node, c.opened.fh, &ReleaseArgs::default())
                    .unwrap();
            }
        })
    };
    let dir = fs.opendir(&req, NodeId::ROOT, OpenFlags::RDONLY).unwrap().fh;
    let mut seen = HashSet::new();
    let mut offset = 0;
    loop {
        let mut sink = Names::new(50);
        fs.readdir(&req, NodeId::ROOT, dir, offset, &mut sink).unwrap();
        if sink.got.is_empty() {
            break;
        }
        for (name, _, _, _) in &sink.got {
            assert!(seen.insert(name.clone()), "{name:?} listed twice");
        }
        offset = sink.got.last().unwrap().1;
    }
    creator.join().unwrap();
    for i in 0..3000 {
        assert!(seen.contains(&OsString::from(format!("old{i}"))), "old{i} missing");
    }
    fs.releasedir(&req, NodeId::ROOT, dir, OpenFlags::empty()).unwrap();
}

#[test]
fn readdirplus_counts_only_the_entries_it_sends() {
    let tmp = TempDir::new("plus");
    for name in ["a", "b", "c", "d"] {
        fs::write(tmp.path().join(name), name).unwrap();
    }
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let dir = fs.opendir(&req, NodeId::ROOT, OpenFlags::RDONLY).unwrap().fh;
    let mut all = Vec::new();
    let mut offset = 0;
    loop {
        let mut sink = Plus::new(2);
        fs.readdirplus(&req, NodeId::ROOT, dir, offset, &mut sink).unwrap();
        if sink.got.is_empty() {
            break;
        }
        offset = sink.got.last().unwrap().1;
        all.extend(sink.got);
    }
    assert_eq!(all.len(), 6);
    let mut files = 0;
    for (name, _, entry) in &all {
        if name == "." || name == ".." {
            assert_eq!(entry.node, NodeId(0));
            continue;
        }
        files += 1;
        let real = fs::metadata(tmp.path().join(name)).unwrap();
        assert_eq!(entry.attr.ino, real.ino());
        assert_eq!(entry.attr.size, 1);
    }
    assert_eq!(files, 4);
    // Root + 4 files, each looked up once although the sinks refused some.
    assert_eq!(fs.inode_count(), 5);
    for (name, _, entry) in &all {
        if entry.node != NodeId(0) {
            fs.forget(entry.node, 1);
            assert_eq!(
                fs.getattr(&req, entry.node, None).unwrap_err(),
                Errno::ESTALE,
                "{name:?}"
            );
        }
    }
    assert_eq!(fs.inode_count(), 1);
    fs.releasedir(&req, NodeId::ROOT, dir, OpenFlags::empty()).unwrap();
}

#[test]
fn new_files_belong_to_the_caller() {
    let tmp = TempDir::new("creds");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o777)).unwrap();
    fs::create_dir(tmp.path().join("closed")).unwrap();
    fs::set_permissions(tmp.path().join("closed"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(tmp.path().join("secret"), b"").unwrap();
    fs::set_permissions(tmp.path().join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let user = user_req(1000, 1001);
    let masked = NewNode {
        mode: libc::S_IFREG | 0o666,
        umask: 0o027,
        rdev: 0,
    };
    let c = fs
        .create(&user, NodeId::ROOT, OsStr::new("mine"), &masked, OpenFlags::WRONLY)
        .unwrap();
    fs.release(&user, c.entry.node, c.opened.fh, &ReleaseArgs::default())
        .unwrap();
    let real = fs::metadata(tmp.path().join("mine")).unwrap();
    assert_eq!((real.uid(), real.gid(), real.mode() & 0o777), (1000, 1001, 0o640));
    let d = fs
        .mkdir(&user, NodeId::ROOT, OsStr::new("dir"), &new_node(0o755))
        .unwrap();
    assert_eq!((d.attr.uid, d.attr.gid), (1000, 1001));
    let s = fs
        .symlink(&user, NodeId::ROOT, OsStr::new("sym"), OsStr::new("mine"))
        .unwrap();
    assert_eq!(s.attr.uid, 1000);

    // The caller's rights, not root's, decide.
    let closed = fs.lookup(&user, NodeId::ROOT, OsStr::new("closed")).unwrap().node;
    let err = fs
        .create(&user, closed, OsStr::new("x"), &new_node(0o644), OpenFlags::WRONLY)
        .unwrap_err();
    assert_eq!(err, Errno::EACCES);
    assert_eq!(
        fs.mkdir(&user, closed, OsStr::new("x"), &new_node(0o755)).unwrap_err(),
        Errno::EACCES
    );
    let secret = fs.lookup(&user, NodeId::ROOT, OsStr::new("secret")).unwrap().node;
    assert_eq!(fs.access(&user, secret, AccessMode::READ).unwrap_err(), Errno::EACCES);
    fs.access(&root_req(), secret, AccessMode::READ | AccessMode::WRITE)
        .unwrap();

    // The guard gave the thread its root fsuid back: root may create in `closed`.
    let c = fs
        .create(
            &root_req(),
            closed,
            OsStr::new("x"),
            &new_node(0o644),
            OpenFlags::WRONLY,
        )
        .unwrap();
    assert_eq!(c.entry.attr.uid, 0);
}

#[test]
fn open_refuses_symlinks_and_writable_directories() {
    let tmp = TempDir::new("open");
    std::os::unix::fs::symlink("f", tmp.path().join("s")).unwrap();
    fs::write(tmp.path().join("f"), b"").unwrap();
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let s = fs.lookup(&req, NodeId::ROOT, OsStr::new("s")).unwrap().node;
    assert_eq!(fs.open(&req, s, OpenFlags::RDONLY).unwrap_err(), Errno::ELOOP);
    assert_eq!(
        fs.open(&req, NodeId::ROOT, OpenFlags::WRONLY).unwrap_err(),
        Errno::EISDIR
    );
    let f = fs.lookup(&req, NodeId::ROOT, OsStr::new("f")).unwrap().node;
    assert_eq!(fs.opendir(&req, f, OpenFlags::RDONLY).unwrap_err(), Errno::ENOTDIR);
}

#[test]
fn o_direct_works_with_unaligned_transport_buffers() {
    let tmp = TempDir::new("direct");
    let fs = PassthroughFs::new(tmp.path()).unwrap();
    let req = root_req();
    let flags = OpenFlags::RDWR | OpenFlags::DIRECT;
    let c = fs
        .create(&req, NodeId::ROOT, OsStr::new("d"), &new_node(0o644), flags)
        .unwrap();
    let (node, fh) = (c.entry.node, c.opened.fh);
    // Data after a request header is never page-aligned.
    let mut storage = vec![0u8; 8192 + 80];
    for (i, b) in storage.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let start = 80 + (storage.as_ptr() as usize + 80) % 2;
    let data = &storage[start..start + 8192];
    let args = WriteArgs {
        offset: 4096,
        ..WriteArgs::default()
    };
    assert_eq!(fs.write(&req, node, fh, data, &args).unwrap(), 8192);
    let mut out = vec![0u8; 8192 + 17];
    let n = fs.read(&req, node, fh, 4096, &mut out[17..]).unwrap();
    assert_eq!(n, 8192);
    assert_eq!(&out[17..], data);
    // A read past the end of the file is short, not an error.
    assert_eq!(fs.read(&req, node, fh, 8192, &mut out[1..8193]).unwrap(), 4096);
    release(&fs, node, fh);
}

#[test]
fn racing_lookups_and_forgets_never_resurrect_a_freed_inode() {
    let tmp = TempDir::new("race");
    fs::write(tmp.path().join("f"), b"x").unwrap();
    let fs = Arc::new(PassthroughFs::new(tmp.path()).unwrap());
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let req = root_req();
                for _ in 0..3000 {
                    let e = fs.lookup(&req, NodeId::ROOT, OsStr::new("f")).unwrap();
                    // While we hold a lookup, the node must stay valid.
                    assert_eq!(fs.getattr(&req, e.node, None).unwrap().size, 1);
                    fs.forget(e.node, 1);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(fs.inode_count(), 1, "only the root is left");

    // batch_forget gives back several counts at once.
    let req = root_req();
    let a = fs.lookup(&req, NodeId::ROOT, OsStr::new("f")).unwrap().node;
    fs.lookup(&req, NodeId::ROOT, OsStr::new("f")).unwrap();
    fs.batch_forget(&[
        shortfuse::Forget { node: a, nlookup: 1 },
        shortfuse::Forget { node: a, nlookup: 1 },
        shortfuse::Forget {
            node: NodeId::ROOT,
            nlookup: 1,
        },
    ]);
    assert_eq!(fs.inode_count(), 1);
    fs.getattr(&req, NodeId::ROOT, None).unwrap();
}
