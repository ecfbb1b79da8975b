//! `mem` through the trait, without a kernel: file data, holes, links,
//! rename rules, attributes and xattrs.

use std::ffi::OsStr;

use shortfuse::{
    AccessMode, CopyRange, Errno, FallocateFlags, FileHandle, FileType, Filesystem, NewNode, NodeId, OpenFlags,
    RenameFlags, Request, SetAttr, SetTime, Timestamp, Whence, WriteArgs, XattrFlags,
};
use shortfuse_fs::mem::MemFs;

const ROOT: Request = Request {
    unique: 1,
    uid: 0,
    gid: 0,
    pid: 1,
};
const USER: Request = Request {
    unique: 2,
    uid: 1000,
    gid: 1000,
    pid: 2,
};

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn file(fs: &MemFs, parent: NodeId, name: &str) -> NodeId {
    let new = NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0o022,
        rdev: 0,
    };
    fs.create(&ROOT, parent, n(name), &new, OpenFlags::RDWR)
        .unwrap()
        .entry
        .node
}

fn dir(fs: &MemFs, parent: NodeId, name: &str) -> NodeId {
    let new = NewNode {
        mode: libc::S_IFDIR | 0o755,
        umask: 0o022,
        rdev: 0,
    };
    fs.mkdir(&ROOT, parent, n(name), &new).unwrap().node
}

fn write(fs: &MemFs, node: NodeId, off: u64, data: &[u8]) -> usize {
    let args = WriteArgs {
        offset: off,
        ..WriteArgs::default()
    };
    fs.write(&ROOT, node, FileHandle(0), data, &args).unwrap()
}

fn read(fs: &MemFs, node: NodeId, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xaa; len];
    let got = fs.read(&ROOT, node, FileHandle(0), off, &mut buf).unwrap();
    buf.truncate(got);
    buf
}

fn size(fs: &MemFs, node: NodeId) -> u64 {
    fs.getattr(&ROOT, node, None).unwrap().size
}

fn blocks(fs: &MemFs, node: NodeId) -> u64 {
    fs.getattr(&ROOT, node, None).unwrap().blocks
}

fn seek(fs: &MemFs, node: NodeId, off: u64, whence: i32) -> Result<u64, Errno> {
    fs.lseek(&ROOT, node, FileHandle(0), off, Whence::from_raw(whence).unwrap())
}

fn falloc(fs: &MemFs, node: NodeId, off: u64, len: u64, mode: i32) -> Result<(), Errno> {
    fs.fallocate(&ROOT, node, FileHandle(0), off, len, FallocateFlags::from_raw(mode))
}

fn rename(fs: &MemFs, p: NodeId, a: &str, q: NodeId, b: &str, flags: u32) -> Result<(), Errno> {
    fs.rename(&ROOT, p, n(a), q, n(b), RenameFlags::from_raw(flags))
}

fn nlink(fs: &MemFs, node: NodeId) -> u32 {
    fs.getattr(&ROOT, node, None).unwrap().nlink
}

#[test]
fn write_read_sparse_and_truncate() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    assert_eq!(write(&fs, f, 0, b"hello"), 5);
    assert_eq!(read(&fs, f, 0, 100), b"hello");
    assert_eq!(write(&fs, f, 1 << 20, b"tail"), 4);
    assert_eq!(size(&fs, f), (1 << 20) + 4);
    // Two 4 KiB blocks stored, in 512-byte units.
    assert_eq!(blocks(&fs, f), 16);
    assert_eq!(read(&fs, f, 4096, 8), vec![0; 8]);
    assert_eq!(read(&fs, f, (1 << 20) + 2, 100), b"il");
    // Truncate down then up: the cut bytes read back as zeros.
    let set = SetAttr {
        size: Some(3),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&ROOT, f, &set).unwrap().blocks, 8);
    let set = SetAttr {
        size: Some(10),
        ..SetAttr::default()
    };
    fs.setattr(&ROOT, f, &set).unwrap();
    assert_eq!(read(&fs, f, 0, 100), b"hel\0\0\0\0\0\0\0");
    // Truncating a directory.
    assert_eq!(fs.setattr(&ROOT, NodeId::ROOT, &set), Err(Errno::EISDIR));
}

#[test]
fn append_uses_current_size() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    write(&fs, f, 0, b"abc");
    let args = WriteArgs {
        offset: 0,
        flags: OpenFlags::APPEND,
        ..WriteArgs::default()
    };
    fs.write(&ROOT, f, FileHandle(0), b"def", &args).unwrap();
    assert_eq!(read(&fs, f, 0, 10), b"abcdef");
}

#[test]
fn seek_data_and_hole() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    write(&fs, f, 8192, b"x");
    write(&fs, f, 5 * 4096 + 10, b"y");
    let sz = size(&fs, f);
    assert_eq!(seek(&fs, f, 0, libc::SEEK_DATA), Ok(8192));
    assert_eq!(seek(&fs, f, 8200, libc::SEEK_DATA), Ok(8200));
    assert_eq!(seek(&fs, f, 8200, libc::SEEK_HOLE), Ok(12288));
    assert_eq!(seek(&fs, f, 12288, libc::SEEK_DATA), Ok(5 * 4096));
    assert_eq!(seek(&fs, f, 5 * 4096, libc::SEEK_HOLE), Ok(sz));
    assert_eq!(seek(&fs, f, 0, libc::SEEK_HOLE), Ok(0));
    assert_eq!(seek(&fs, f, sz, libc::SEEK_DATA), Err(Errno::ENXIO));
    assert_eq!(seek(&fs, f, sz, libc::SEEK_HOLE), Err(Errno::ENXIO));
    // A file that ends in a hole.
    let set = SetAttr {
        size: Some(1 << 20),
        ..SetAttr::default()
    };
    fs.setattr(&ROOT, f, &set).unwrap();
    assert_eq!(seek(&fs, f, 6 * 4096, libc::SEEK_DATA), Err(Errno::ENXIO));
    assert_eq!(seek(&fs, f, 6 * 4096, libc::SEEK_HOLE), Ok(6 * 4096));
}

#[test]
fn fallocate_modes() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    // Mode 0 grows the file; unwritten blocks count but are holes.
    falloc(&fs, f, 0, 16384, 0).unwrap();
    assert_eq!(size(&fs, f), 16384);
    assert_eq!(blocks(&fs, f), 32);
    assert_eq!(seek(&fs, f, 0, libc::SEEK_DATA), Err(Errno::ENXIO));
    // KEEP_SIZE allocates past the end without growing it.
    falloc(&fs, f, 16384, 4096, libc::FALLOC_FL_KEEP_SIZE).unwrap();
    assert_eq!(size(&fs, f), 16384);
    assert_eq!(blocks(&fs, f), 40);
    // Punch a hole in written data: whole blocks go, edges are zeroed.
    write(&fs, f, 0, &[1u8; 16384]);
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    falloc(&fs, f, 2048, 8192, punch).unwrap();
    assert_eq!(read(&fs, f, 2040, 16), [&[1u8; 8][..], &[0u8; 8][..]].concat());
    assert_eq!(read(&fs, f, 10232, 16), [&[0u8; 8][..], &[1u8; 8][..]].concat());
    assert_eq!(seek(&fs, f, 0, libc::SEEK_HOLE), Ok(4096));
    assert_eq!(seek(&fs, f, 4096, libc::SEEK_DATA), Ok(8192));
    assert_eq!(size(&fs, f), 16384);
    // Punch without KEEP_SIZE is refused, as is an unknown mode.
    assert_eq!(
        falloc(&fs, f, 0, 10, libc::FALLOC_FL_PUNCH_HOLE),
        Err(Errno::EOPNOTSUPP)
    );
    assert_eq!(
        falloc(&fs, f, 0, 10, libc::FALLOC_FL_COLLAPSE_RANGE),
        Err(Errno::EOPNOTSUPP)
    );
    assert_eq!(falloc(&fs, f, 0, 0, 0), Err(Errno::EINVAL));
    // Zero range: whole blocks become holes, data reads as zeros.
    write(&fs, f, 0, &[2u8; 16384]);
    falloc(&fs, f, 100, 12000, libc::FALLOC_FL_ZERO_RANGE).unwrap();
    assert_eq!(read(&fs, f, 96, 8), [2, 2, 2, 2, 0, 0, 0, 0]);
    assert_eq!(read(&fs, f, 12096, 8), [0, 0, 0, 0, 2, 2, 2, 2]);
    assert_eq!(seek(&fs, f, 0, libc::SEEK_HOLE), Ok(4096));
    assert_eq!(seek(&fs, f, 4096, libc::SEEK_DATA), Ok(8192));
    // Zero range past the end grows the file.
    falloc(&fs, f, 16384, 100, libc::FALLOC_FL_ZERO_RANGE).unwrap();
    assert_eq!(size(&fs, f), 16484);
}

#[test]
fn copy_file_range_copies() {
    let fs = MemFs::new();
    let a = file(&fs, NodeId::ROOT, "a");
    let b = file(&fs, NodeId::ROOT, "b");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    write(&fs, a, 0, &data);
    let range = CopyRange {
        node_in: a,
        fh_in: FileHandle(0),
        off_in: 10,
        node_out: b,
        fh_out: FileHandle(0),
        off_out: 5,
        len: 1 << 40,
        flags: 0,
    };
    assert_eq!(fs.copy_file_range(&ROOT, &range).unwrap(), data.len() - 10);
    assert_eq!(size(&fs, b), data.len() as u64 - 5);
    assert_eq!(read(&fs, b, 5, 100), &data[10..110]);
}

#[test]
fn open_truncates_and_times_move() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    write(&fs, f, 0, b"data");
    let old = Timestamp { sec: 1000, nsec: 5 };
    let set = SetAttr {
        atime: Some(SetTime::At(old)),
        mtime: Some(SetTime::At(old)),
        ..SetAttr::default()
    };
    let attr = fs.setattr(&ROOT, f, &set).unwrap();
    assert_eq!((attr.atime, attr.mtime), (old, old));
    assert!(attr.ctime > old);
    fs.open(&ROOT, f, OpenFlags::WRONLY | OpenFlags::TRUNC).unwrap();
    let attr = fs.getattr(&ROOT, f, None).unwrap();
    assert_eq!(attr.size, 0);
    assert!(attr.mtime > old);
    // Parent times move on create.
    let before = fs.getattr(&ROOT, NodeId::ROOT, None).unwrap().mtime;
    std::thread::sleep(std::time::Duration::from_millis(2));
    file(&fs, NodeId::ROOT, "g");
    assert!(fs.getattr(&ROOT, NodeId::ROOT, None).unwrap().mtime > before);
}

#[test]
fn names_and_lookups() {
    let fs = MemFs::new();
    let long = "x".repeat(256);
    let new = NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
    };
    assert_eq!(
        fs.create(&ROOT, NodeId::ROOT, n(&long), &new, OpenFlags::empty()).err(),
        Some(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        fs.lookup(&ROOT, NodeId::ROOT, n(&long)).err(),
        Some(Errno::ENAMETOOLONG)
    );
    file(&fs, NodeId::ROOT, &"y".repeat(255));
    assert_eq!(fs.lookup(&ROOT, NodeId::ROOT, n("nope")).err(), Some(Errno::ENOENT));
    file(&fs, NodeId::ROOT, "f");
    assert_eq!(
        fs.create(&ROOT, NodeId::ROOT, n("f"), &new, OpenFlags::empty()).err(),
        Some(Errno::EEXIST)
    );
    let f = fs.lookup(&ROOT, NodeId::ROOT, n("f")).unwrap().node;
    assert_eq!(fs.lookup(&ROOT, f, n("x")).err(), Some(Errno::ENOTDIR));
    // umask applied, ownership from the request.
    let d = dir(&fs, NodeId::ROOT, "pub");
    fs.setattr(
        &ROOT,
        d,
        &SetAttr {
            mode: Some(0o777),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let new = NewNode {
        mode: libc::S_IFREG | 0o666,
        umask: 0o022,
        rdev: 0,
    };
    let e = fs.create(&USER, d, n("mine"), &new, OpenFlags::empty()).unwrap().entry;
    assert_eq!(e.attr.mode, libc::S_IFREG | 0o644);
    assert_eq!((e.attr.uid, e.attr.gid), (1000, 1000));
}

#[test]
fn sgid_directory_inheritance() {
    let fs = MemFs::new();
    let d = dir(&fs, NodeId::ROOT, "d");
    let set = SetAttr {
        mode: Some(0o2777),
        gid: Some(50),
        ..SetAttr::default()
    };
    fs.setattr(&ROOT, d, &set).unwrap();
    let new = NewNode {
        mode: libc::S_IFDIR | 0o755,
        umask: 0,
        rdev: 0,
    };
    let sub = fs.mkdir(&USER, d, n("sub"), &new).unwrap();
    assert_eq!(sub.attr.gid, 50);
    assert_eq!(sub.attr.mode & libc::S_ISGID, libc::S_ISGID);
    let f = fs
        .create(
            &USER,
            d,
            n("f"),
            &NewNode {
                mode: libc::S_IFREG | 0o644,
                umask: 0,
                rdev: 0,
            },
            OpenFlags::empty(),
        )
        .unwrap();
    assert_eq!(f.entry.attr.gid, 50);
    assert_eq!(f.entry.attr.mode & libc::S_ISGID, 0);
}

#[test]
fn chown_clears_setid_bits() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    let set = SetAttr {
        mode: Some(0o6755),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&ROOT, f, &set).unwrap().mode & 0o7777, 0o6755);
    let set = SetAttr {
        uid: Some(7),
        ..SetAttr::default()
    };
    let attr = fs.setattr(&ROOT, f, &set).unwrap();
    assert_eq!(attr.mode & 0o7777, 0o755);
    assert_eq!(attr.uid, 7);
    // Set-group-id without group execute (mandatory locking) survives.
    fs.setattr(
        &ROOT,
        f,
        &SetAttr {
            mode: Some(0o2644),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let attr = fs
        .setattr(
            &ROOT,
            f,
            &SetAttr {
                gid: Some(9),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!(attr.mode & 0o7777, 0o2644);
    // kill_suidgid on write.
    fs.setattr(
        &ROOT,
        f,
        &SetAttr {
            mode: Some(0o4755),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let args = WriteArgs {
        write_flags: 1 << 2,
        ..WriteArgs::default()
    };
    fs.write(&ROOT, f, FileHandle(0), b"x", &args).unwrap();
    assert_eq!(fs.getattr(&ROOT, f, None).unwrap().mode & 0o7777, 0o755);
    // Non-owners may not chmod or chown.
    let set = SetAttr {
        mode: Some(0o777),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&USER, f, &set), Err(Errno::EPERM));
}

#[test]
fn hard_links_and_nlink() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    let d = dir(&fs, NodeId::ROOT, "d");
    assert_eq!(nlink(&fs, NodeId::ROOT), 3);
    assert_eq!(nlink(&fs, d), 2);
    let e = fs.link(&ROOT, f, d, n("g")).unwrap();
    assert_eq!(e.node, f);
    assert_eq!(e.attr.nlink, 2);
    assert_eq!(fs.link(&ROOT, f, d, n("g")).err(), Some(Errno::EEXIST));
    assert_eq!(fs.link(&ROOT, d, NodeId::ROOT, n("d2")).err(), Some(Errno::EPERM));
    fs.unlink(&ROOT, NodeId::ROOT, n("f")).unwrap();
    assert_eq!(nlink(&fs, f), 1);
    assert_eq!(fs.unlink(&ROOT, NodeId::ROOT, n("d")), Err(Errno::EISDIR));
    assert_eq!(fs.rmdir(&ROOT, d, n("g")), Err(Errno::ENOTDIR));
    assert_eq!(fs.rmdir(&ROOT, NodeId::ROOT, n("d")), Err(Errno::ENOTEMPTY));
    fs.unlink(&ROOT, d, n("g")).unwrap();
    fs.rmdir(&ROOT, NodeId::ROOT, n("d")).unwrap();
    assert_eq!(nlink(&fs, NodeId::ROOT), 2);
    // Symlinks, special files.
    let s = fs.symlink(&ROOT, NodeId::ROOT, n("s"), n("target/path")).unwrap();
    assert_eq!(s.attr.size, 11);
    assert_eq!(fs.readlink(&ROOT, s.node).unwrap(), b"target/path");
    assert_eq!(fs.readlink(&ROOT, NodeId::ROOT), Err(Errno::EINVAL));
    let new = NewNode {
        mode: libc::S_IFCHR | 0o600,
        umask: 0,
        rdev: 0x0103,
    };
    let c = fs.mknod(&ROOT, NodeId::ROOT, n("null"), &new).unwrap();
    assert_eq!(c.attr.file_type(), FileType::CharDevice);
    assert_eq!(c.attr.rdev, 0x0103);
    let new = NewNode {
        mode: libc::S_IFIFO | 0o600,
        umask: 0,
        rdev: 0,
    };
    assert_eq!(
        fs.mknod(&ROOT, NodeId::ROOT, n("fifo"), &new).unwrap().attr.file_type(),
        FileType::Fifo
    );
}

#[test]
fn rename_matrix() {
    let fs = MemFs::new();
    let r = NodeId::ROOT;
    let f1 = file(&fs, r, "f1");
    let f2 = file(&fs, r, "f2");
    let d1 = dir(&fs, r, "d1");
    let d2 = dir(&fs, r, "d2");
    let full = dir(&fs, r, "full");
    file(&fs, full, "x");
    let sub = dir(&fs, d1, "sub");

    // File over file: target replaced.
    rename(&fs, r, "f2", r, "f1", 0).unwrap();
    assert_eq!(fs.lookup(&ROOT, r, n("f2")).err(), Some(Errno::ENOENT));
    assert_eq!(nlink(&fs, f1), 0);
    assert_eq!(fs.lookup(&ROOT, r, n("f1")).unwrap().node, f2);
    let f1 = f2;
    // File over dir, dir over file, dir over non-empty dir.
    assert_eq!(rename(&fs, r, "f1", r, "d2", 0), Err(Errno::EISDIR));
    assert_eq!(rename(&fs, r, "d2", r, "f1", 0), Err(Errno::ENOTDIR));
    assert_eq!(rename(&fs, r, "d2", r, "full", 0), Err(Errno::ENOTEMPTY));
    // Into its own subdirectory, or itself.
    assert_eq!(rename(&fs, r, "d1", sub, "x", 0), Err(Errno::EINVAL));
    assert_eq!(rename(&fs, r, "d1", d1, "x", 0), Err(Errno::EINVAL));
    // Missing source, NOREPLACE, EXCHANGE without target.
    assert_eq!(rename(&fs, r, "nope", r, "x", 0), Err(Errno::ENOENT));
    assert_eq!(
        rename(&fs, r, "f1", r, "d2", libc::RENAME_NOREPLACE),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        rename(&fs, r, "f1", r, "nope", libc::RENAME_EXCHANGE),
        Err(Errno::ENOENT)
    );
    // Dir over empty dir across parents: nlinks follow.
    assert_eq!(nlink(&fs, r), 5);
    rename(&fs, d1, "sub", r, "d2", 0).unwrap();
    assert_eq!(nlink(&fs, d1), 2);
    assert_eq!(nlink(&fs, r), 5);
    assert_eq!(fs.lookup(&ROOT, r, n("d2")).unwrap().node, sub);
    assert_eq!(fs.lookup(&ROOT, sub, n("..")).unwrap().node, r);
    assert_eq!(fs.getattr(&ROOT, d2, None).err(), None);
    assert_eq!(nlink(&fs, d2), 0);
    // Exchange a file and a directory across parents.
    rename(&fs, r, "f1", d1, "moved", 0).unwrap();
    rename(&fs, d1, "moved", r, "full", libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs.lookup(&ROOT, r, n("full")).unwrap().node, f1);
    assert_eq!(fs.lookup(&ROOT, d1, n("moved")).unwrap().node, full);
    assert_eq!(nlink(&fs, d1), 3);
    assert_eq!(nlink(&fs, r), 4);
    assert_eq!(fs.lookup(&ROOT, full, n("..")).unwrap().node, d1);
    // Two names of one inode: nothing happens.
    fs.link(&ROOT, f1, r, n("hl")).unwrap();
    rename(&fs, r, "hl", r, "full", 0).unwrap();
    assert_eq!(fs.lookup(&ROOT, r, n("hl")).unwrap().node, f1);
    assert_eq!(nlink(&fs, f1), 2);
    // Invalid flag combinations.
    assert_eq!(
        rename(&fs, r, "hl", r, "x", libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE),
        Err(Errno::EINVAL)
    );
}

#[test]
fn xattrs() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    let set = |name: &str, v: &[u8], flags| fs.setxattr(&ROOT, f, n(name), v, flags);
    assert_eq!(fs.getxattr(&ROOT, f, n("user.a")), Err(Errno::ENODATA));
    assert_eq!(set("user.a", b"1", XattrFlags::REPLACE), Err(Errno::ENODATA));
    set("user.a", b"1", XattrFlags::CREATE).unwrap();
    assert_eq!(set("user.a", b"2", XattrFlags::CREATE), Err(Errno::EEXIST));
    set("user.a", b"2", XattrFlags::REPLACE).unwrap();
    set("trusted.b", b"", XattrFlags::empty()).unwrap();
    assert_eq!(fs.getxattr(&ROOT, f, n("user.a")).unwrap(), b"2");
    assert_eq!(fs.listxattr(&ROOT, f).unwrap(), b"user.a\0trusted.b\0");
    assert_eq!(set("user.big", &vec![0; 65537], XattrFlags::empty()), Err(Errno::E2BIG));
    set("user.big", &vec![0; 65536], XattrFlags::empty()).unwrap();
    assert_eq!(
        set(&format!("user.{}", "n".repeat(251)), b"", XattrFlags::empty()),
        Err(Errno::ERANGE)
    );
    assert_eq!(set("bogus.a", b"", XattrFlags::empty()), Err(Errno::EOPNOTSUPP));
    fs.removexattr(&ROOT, f, n("user.a")).unwrap();
    assert_eq!(fs.removexattr(&ROOT, f, n("user.a")), Err(Errno::ENODATA));
    assert_eq!(fs.listxattr(&ROOT, f).unwrap(), b"trusted.b\0user.big\0");
}

#[test]
fn access_rules() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    fs.access(&ROOT, f, AccessMode::READ | AccessMode::WRITE).unwrap();
    assert_eq!(fs.access(&ROOT, f, AccessMode::EXECUTE), Err(Errno::EACCES));
    fs.access(&ROOT, NodeId::ROOT, AccessMode::EXECUTE).unwrap();
    fs.access(&USER, f, AccessMode::READ).unwrap();
    assert_eq!(fs.access(&USER, f, AccessMode::WRITE), Err(Errno::EACCES));
    assert_eq!(fs.open(&USER, f, OpenFlags::RDWR).err(), Some(Errno::EACCES));
    let new = NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
    };
    assert_eq!(
        fs.create(&USER, NodeId::ROOT, n("x"), &new, OpenFlags::empty()).err(),
        Some(Errno::EACCES)
    );
}

#[test]
fn statfs_reports_usage() {
    let fs = MemFs::new();
    let before = fs.statfs(&ROOT, NodeId::ROOT).unwrap();
    let f = file(&fs, NodeId::ROOT, "f");
    write(&fs, f, 0, &[1u8; 40960]);
    let after = fs.statfs(&ROOT, NodeId::ROOT).unwrap();
    assert_eq!(before.bfree - after.bfree, 10);
    assert_eq!(before.ffree - after.ffree, 1);
    assert_eq!(after.namelen, 255);
}

#[test]
fn sticky_directory_protects_others_files() {
    let fs = MemFs::new();
    let d = dir(&fs, NodeId::ROOT, "tmp");
    let set = SetAttr {
        mode: Some(0o1777),
        ..SetAttr::default()
    };
    fs.setattr(&ROOT, d, &set).unwrap();
    file(&fs, d, "roots");
    let other = Request {
        uid: 2000,
        gid: 2000,
        ..USER
    };
    let new = NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
    };
    fs.create(&USER, d, n("users"), &new, OpenFlags::empty()).unwrap();
    assert_eq!(fs.unlink(&USER, d, n("roots")), Err(Errno::EPERM));
    assert_eq!(
        fs.rename(&other, d, n("users"), d, n("mine"), RenameFlags::default()),
        Err(Errno::EPERM)
    );
    fs.rename(&USER, d, n("users"), d, n("mine"), RenameFlags::default())
        .unwrap();
    // Permission comes before the type check, as in the VFS.
    let sub = dir(&fs, d, "sub");
    fs.setattr(
        &ROOT,
        sub,
        &SetAttr {
            mode: Some(0o755),
            ..SetAttr::default()
        },
    )
    .unwrap();
    file(&fs, sub, "f");
    assert_eq!(fs.rmdir(&USER, sub, n("f")), Err(Errno::EACCES));
    fs.unlink(&USER, d, n("mine")).unwrap();
}

/// ext4 moves mtime and ctime at every truncation, to the same size too
/// (ext4_setattr touches both whenever the file does not shrink).
#[test]
fn truncate_to_same_size_moves_times() {
    let fs = MemFs::new();
    let f = file(&fs, NodeId::ROOT, "f");
    write(&fs, f, 0, b"abc");
    let old = Timestamp { sec: 1000, nsec: 0 };
    let set = SetAttr {
        mtime: Some(SetTime::At(old)),
        ctime: Some(old),
        ..SetAttr::default()
    };
    fs.setattr(&ROOT, f, &set).unwrap();
    let same = SetAttr {
        size: Some(3),
        ..SetAttr::default()
    };
    let attr = fs.setattr(&ROOT, f, &same).unwrap();
    assert!(attr.mtime > old && attr.ctime > old);
    fs.setattr(&ROOT, f, &set).unwrap();
    let grow = SetAttr {
        size: Some(4),
        ..SetAttr::default()
    };
    let attr = fs.setattr(&ROOT, f, &grow).unwrap();
    assert!(attr.mtime > old && attr.ctime > old);
}
