//! Golden-byte tests of the dispatcher, one group per opcode family, with
//! a fake transport feeding request bytes to `Dispatcher::handle`.

#[path = "dispatch_common.rs"]
mod common;

use std::time::Duration;

use common::*;
use shortfuse::abi;
use shortfuse::*;
use zerocopy::{FromBytes, IntoBytes};

fn init_out(payload: &[u8]) -> abi::fuse_init_out {
    assert_eq!(payload.len(), 64);
    abi::fuse_init_out::read_from_bytes(payload).unwrap()
}

#[test]
fn init_default_options_golden() {
    let mut h = Harness::new(TestFs::default(), MountOptions::default());
    let r = h.call_raw(&init_msg(1, 45, KERNEL_FLAGS, 128 * 1024));
    assert_eq!((r.error, r.unique), (0, 1));
    let want = abi::FUSE_ASYNC_READ
        | abi::FUSE_ATOMIC_O_TRUNC
        | abi::FUSE_BIG_WRITES
        | abi::FUSE_AUTO_INVAL_DATA
        | abi::FUSE_DO_READDIRPLUS
        | abi::FUSE_READDIRPLUS_AUTO
        | abi::FUSE_ASYNC_DIO
        | abi::FUSE_PARALLEL_DIROPS
        | abi::FUSE_MAX_PAGES;
    let expected = golden(&[
        F::U32(7),
        F::U32(45),
        F::U32(128 * 1024),
        F::U32(want as u32),
        F::U16(0),
        F::U16(0),
        F::U32(128 * 1024),
        F::U32(1),
        F::U16(32),
        F::U16(0),
        F::U32((want >> 32) as u32),
        F::U32(0),
        F::U16(0),
        F::Zero(22),
    ]);
    assert_eq!(r.payload, expected);
    let n = h.d.negotiated().unwrap();
    assert_eq!((n.minor, n.max_write, n.max_pages, n.flags), (45, 128 * 1024, 32, want));
    assert_eq!(h.d.buffer_size(), 128 * 1024 + 4096);
}

#[test]
fn init_follows_options_and_kernel_offer() {
    let opts = MountOptions {
        max_write: 1 << 20,
        writeback_cache: true,
        async_read: false,
        parallel_dirops: false,
        readdirplus: Readdirplus::No,
        handle_killpriv_v2: true,
        splice_read: true,
        max_readahead: Some(64 * 1024),
        max_background: Some(64),
        congestion_threshold: Some(48),
        ..MountOptions::default()
    };
    let fs = TestFs {
        init_add: abi::FUSE_FLOCK_LOCKS | abi::FUSE_POSIX_LOCKS | abi::FUSE_PASSTHROUGH,
        ..TestFs::default()
    };
    let mut h = Harness::new(fs, opts);
    // A kernel of minor 40 that offers neither splice read nor io_uring.
    let offered = KERNEL_FLAGS & !abi::FUSE_SPLICE_READ & !abi::FUSE_OVER_IO_URING;
    let r = h.call_raw(&init_msg(1, 40, offered, 512 * 1024));
    let out = init_out(&r.payload);
    let flags = abi::join_init_flags(out.flags, out.flags2);
    assert_eq!(out.minor, 40, "answer the kernel's lower minor");
    assert_eq!((out.max_write, out.max_pages), (1 << 20, 256));
    assert_eq!(out.max_readahead, 64 * 1024);
    assert_eq!(
        (out.max_background, out.congestion_threshold, out.time_gran),
        (64, 48, 1)
    );
    for on in [
        abi::FUSE_WRITEBACK_CACHE,
        abi::FUSE_HANDLE_KILLPRIV_V2,
        abi::FUSE_FLOCK_LOCKS,
        abi::FUSE_POSIX_LOCKS,
        abi::FUSE_MAX_PAGES,
    ] {
        assert_ne!(flags & on, 0, "{on:#x} missing");
    }
    for off in [
        abi::FUSE_ASYNC_READ,
        abi::FUSE_PARALLEL_DIROPS,
        abi::FUSE_DO_READDIRPLUS,
        abi::FUSE_AUTO_INVAL_DATA,
        abi::FUSE_SPLICE_READ,
        abi::FUSE_SPLICE_WRITE,
        abi::FUSE_OVER_IO_URING,
        abi::FUSE_PASSTHROUGH,
        abi::FUSE_DONT_MASK,
        abi::FUSE_EXPORT_SUPPORT,
        abi::FUSE_SETXATTR_EXT,
    ] {
        assert_eq!(flags & off, 0, "{off:#x} set");
    }
    assert_eq!(flags & !offered, 0, "only offered flags");
    assert_eq!(h.d.buffer_size(), (1 << 20) + 4096);
}

#[test]
fn init_clamps_max_write_to_the_page_limit() {
    let fs = std::sync::Arc::new(TestFs::default());
    let opts = MountOptions {
        max_write: 8 << 20,
        ..MountOptions::default()
    };
    let d = Dispatcher::with_max_pages_limit(fs, opts, std::sync::Arc::new(Stats::new()), 64);
    assert_eq!(d.buffer_size(), 64 * 4096 + 4096, "before INIT: the largest possible");
    let mut buf = Vec::new();
    d.handle(&init_msg(1, 45, KERNEL_FLAGS, 0), &mut buf, Transport::Dev);
    let out = init_out(&check_reply(&buf).payload);
    assert_eq!((out.max_write, out.max_pages), (64 * 4096, 64));
}

#[test]
fn requests_before_init_and_second_init_get_eio() {
    let mut h = Harness::new(TestFs::default(), MountOptions::default());
    assert_eq!(
        h.err(abi::FUSE_GETATTR, 1, abi::fuse_getattr_in::default().as_bytes()),
        libc::EIO
    );
    let r = h.call_raw(&init_msg(1, 45, KERNEL_FLAGS, 0));
    assert_eq!(r.error, 0);
    let r = h.call_raw(&init_msg(2, 45, KERNEL_FLAGS, 0));
    assert_eq!((r.error, r.unique), (-libc::EIO, 2));
}

#[test]
fn init_old_kernel_and_newer_major() {
    let mut h = Harness::new(TestFs::default(), MountOptions::default());
    let r = h.call_raw(&init_msg(1, 20, KERNEL_FLAGS, 0));
    assert_eq!(r.error, -libc::EPROTO);
    let mut m = init_msg(2, 0, 0, 0);
    m[40..44].copy_from_slice(&8u32.to_ne_bytes());
    let r = h.call_raw(&m);
    assert_eq!(r.error, 0);
    assert_eq!(&r.payload[..8], golden(&[F::U32(7), F::U32(45)]).as_slice());
    assert!(h.d.negotiated().is_none(), "wait for a new INIT");
}

#[test]
fn lookup_golden_and_ttl_override() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let p = h.ok(abi::FUSE_LOOKUP, 1, b"hello\0");
    let mut fields = vec![F::U64(HELLO), F::U64(9), F::U64(1), F::U64(1), F::U32(0), F::U32(0)];
    fields.extend(golden_attr(HELLO));
    assert_eq!(p, golden(&fields));
    let p = h.ok(abi::FUSE_LOOKUP, 1, b"dir\0");
    let e = abi::fuse_entry_out::read_from_bytes(&p).unwrap();
    assert_eq!((e.entry_valid, e.entry_valid_nsec), (1, 500_000_000));
    assert_eq!((e.attr_valid, e.attr_valid_nsec), (1, 500_000_000));
    assert_eq!(h.err(abi::FUSE_LOOKUP, 1, b"nope\0"), libc::ENOENT);
}

#[test]
fn negative_lookup_is_cached_when_asked() {
    let opts = MountOptions {
        negative_timeout: Duration::from_secs(7),
        ..MountOptions::default()
    };
    let mut h = Harness::ready(TestFs::default(), opts);
    let p = h.ok(abi::FUSE_LOOKUP, 1, b"nope\0");
    let e = abi::fuse_entry_out::read_from_bytes(&p).unwrap();
    assert_eq!((e.nodeid, e.entry_valid), (0, 7));
}

#[test]
fn getattr_golden_and_fh() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let arg = abi::fuse_getattr_in {
        getattr_flags: abi::FUSE_GETATTR_FH,
        dummy: 0,
        fh: 5,
    };
    let p = h.ok(abi::FUSE_GETATTR, HELLO, arg.as_bytes());
    let mut fields = vec![F::U64(1), F::U32(0), F::U32(0)];
    fields.extend(golden_attr(HELLO));
    assert_eq!(p, golden(&fields));
    h.ok(abi::FUSE_GETATTR, HELLO, abi::fuse_getattr_in::default().as_bytes());
    let calls = h.fs.calls.lock().unwrap().clone();
    assert_eq!(calls, ["getattr 2 Some(5)", "getattr 2 None"]);
}

#[test]
fn setattr_translates_fattr_bits() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let arg = abi::fuse_setattr_in {
        valid: abi::FATTR_MODE
            | abi::FATTR_SIZE
            | abi::FATTR_ATIME
            | abi::FATTR_ATIME_NOW
            | abi::FATTR_MTIME
            | abi::FATTR_FH
            | abi::FATTR_KILL_SUIDGID,
        fh: 8,
        size: 100,
        mtime: 33,
        mtimensec: 44,
        mode: 0o100600,
        uid: 99,
        ..Default::default()
    };
    let p = h.ok(abi::FUSE_SETATTR, HELLO, arg.as_bytes());
    assert_eq!(abi::fuse_attr_out::read_from_bytes(&p).unwrap().attr.mode, 0o100600);
    let set = h.fs.last_setattr.lock().unwrap().unwrap();
    assert_eq!(
        set,
        SetAttr {
            mode: Some(0o100600),
            uid: None,
            gid: None,
            size: Some(100),
            atime: Some(SetTime::Now),
            mtime: Some(SetTime::At(Timestamp { sec: 33, nsec: 44 })),
            ctime: None,
            fh: Some(FileHandle(8)),
            kill_suidgid: true,
        }
    );
}

#[test]
fn open_create_and_mount_fopen_bits() {
    let opts = MountOptions {
        keep_cache: true,
        ..MountOptions::default()
    };
    let mut h = Harness::ready(TestFs::default(), opts);
    let p = h.ok(
        abi::FUSE_OPEN,
        HELLO,
        abi::fuse_open_in {
            flags: 2,
            open_flags: 0,
        }
        .as_bytes(),
    );
    assert_eq!(p, golden(&[F::U64(77), F::U32(abi::FOPEN_KEEP_CACHE), F::U32(0)]));
    let p = h.ok(abi::FUSE_OPENDIR, 1, abi::fuse_open_in::default().as_bytes());
    assert_eq!(p, golden(&[F::U64(0), F::U32(0), F::U32(0)]), "keep_cache is for files");
    let arg = abi::fuse_create_in {
        flags: 0o101,
        mode: 0o100644,
        umask: 0o22,
        open_flags: 0,
    };
    let p = h.ok(abi::FUSE_CREATE, 1, &with_names(arg.as_bytes(), &[b"new"]));
    assert_eq!(p.len(), 128 + 16);
    let e = abi::fuse_entry_out::read_from_bytes(&p[..128]).unwrap();
    let o = abi::fuse_open_out::read_from_bytes(&p[128..]).unwrap();
    assert_eq!(e.nodeid, 51);
    assert_eq!((o.fh, o.open_flags), (78, abi::FOPEN_DIRECT_IO | abi::FOPEN_KEEP_CACHE));
    let arg = abi::fuse_mkdir_in {
        mode: 0o755,
        umask: 0o22,
    };
    h.ok(abi::FUSE_MKDIR, 1, &with_names(arg.as_bytes(), &[b"sub"]));
    let calls = h.fs.calls.lock().unwrap().clone();
    assert_eq!(calls, ["open 2 0x2", "create new 100644 0x41", "mkdir sub 40755 22"]);
}

#[test]
fn read_goes_into_the_reply_buffer() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let p = h.ok(abi::FUSE_READ, HELLO, read_in(77, 6, 4096).as_bytes());
    assert_eq!(p, b"world\n");
    let p = h.ok(abi::FUSE_READ, HELLO, read_in(77, 100, 4096).as_bytes());
    assert!(p.is_empty());
    assert_eq!(h.err(abi::FUSE_READ, DIR, read_in(0, 0, 10).as_bytes()), libc::EISDIR);
    // More than INIT allowed: refused instead of allocated.
    assert_eq!(
        h.err(abi::FUSE_READ, HELLO, read_in(0, 0, u32::MAX).as_bytes()),
        libc::EINVAL
    );
}

#[test]
fn write_passes_data_and_flags() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let arg = abi::fuse_write_in {
        fh: 77,
        offset: 5,
        size: 3,
        write_flags: abi::FUSE_WRITE_LOCKOWNER,
        lock_owner: 1234,
        flags: libc::O_APPEND as u32,
        padding: 0,
    };
    let mut body = arg.as_bytes().to_vec();
    body.extend_from_slice(b"abc");
    let p = h.ok(abi::FUSE_WRITE, HELLO, &body);
    assert_eq!(p, golden(&[F::U32(3), F::U32(0)]));
    let (node, data, args) = h.fs.last_write.lock().unwrap().clone().unwrap();
    assert_eq!((node, data.as_slice()), (HELLO, &b"abc"[..]));
    assert_eq!(args.lock_owner, Some(1234));
    assert_eq!(args.offset, 5);
    // Data shorter than `size`: EINVAL with the request's unique.
    body.pop();
    assert_eq!(h.err(abi::FUSE_WRITE, HELLO, &body), libc::EINVAL);
}

/// Walks a READDIR reply: (ino, off, type, name) per entry.
fn dirents(mut p: &[u8]) -> Vec<(u64, u64, u32, String)> {
    let mut v = Vec::new();
    while !p.is_empty() {
        let (d, rest) = abi::fuse_dirent::read_from_prefix(p).unwrap();
        let name = String::from_utf8(rest[..d.namelen as usize].to_vec()).unwrap();
        let size = abi::fuse_dirent_size(d.namelen as usize);
        assert!(p[abi::FUSE_NAME_OFFSET + d.namelen as usize..size]
            .iter()
            .all(|&b| b == 0));
        v.push((d.ino, d.off, d.typ, name));
        p = &p[size..];
    }
    v
}

fn direntplus(mut p: &[u8]) -> Vec<(abi::fuse_entry_out, u64, String)> {
    let mut v = Vec::new();
    while !p.is_empty() {
        let (d, rest) = abi::fuse_direntplus::read_from_prefix(p).unwrap();
        let name = String::from_utf8(rest[..d.dirent.namelen as usize].to_vec()).unwrap();
        v.push((d.entry_out, d.dirent.off, name));
        p = &p[abi::fuse_direntplus_size(d.dirent.namelen as usize)..];
    }
    v
}

#[test]
fn readdir_golden_and_paging() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let p = h.ok(abi::FUSE_READDIR, 1, read_in(0, 0, 4096).as_bytes());
    let expected = golden(&[
        F::U64(1001),
        F::U64(1),
        F::U32(1),
        F::U32(4),
        F::Bytes(b".\0\0\0\0\0\0\0"),
        F::U64(1001),
        F::U64(2),
        F::U32(2),
        F::U32(4),
        F::Bytes(b"..\0\0\0\0\0\0"),
        F::U64(1002),
        F::U64(3),
        F::U32(5),
        F::U32(8),
        F::Bytes(b"hello\0\0\0"),
        F::U64(1003),
        F::U64(4),
        F::U32(3),
        F::U32(4),
        F::Bytes(b"dir\0\0\0\0\0"),
    ]);
    assert_eq!(p, expected);
    // Page through 102 entries of 32 bytes with 100-byte replies (3 each).
    let mut names = Vec::new();
    let mut off = 0;
    loop {
        let p = h.ok(abi::FUSE_READDIR, DIR, read_in(0, off, 100).as_bytes());
        assert!(p.len() <= 100);
        let ents = dirents(&p);
        if ents.is_empty() {
            break;
        }
        assert_eq!(ents.len(), 3.min(DIR_FILES + 2 - names.len()));
        off = ents.last().unwrap().1;
        names.extend(ents.into_iter().map(|e| e.3));
    }
    assert_eq!(names.len(), DIR_FILES + 2);
    assert_eq!(names[2], "f000");
    assert_eq!(names[DIR_FILES + 1], child_name(DIR_FILES - 1));
}

fn readdirplus_pages(h: &mut Harness, size: u32) -> Vec<(abi::fuse_entry_out, u64, String)> {
    let mut all = Vec::new();
    let mut off = 0;
    loop {
        let p = h.ok(abi::FUSE_READDIRPLUS, DIR, read_in(0, off, size).as_bytes());
        assert!(p.len() <= size as usize);
        let ents = direntplus(&p);
        if ents.is_empty() {
            break;
        }
        off = ents.last().unwrap().1;
        all.extend(ents);
    }
    all
}

#[test]
fn readdirplus_emulated_from_readdir_and_lookup() {
    let opts = MountOptions {
        entry_timeout: Duration::from_secs(3),
        attr_timeout: Duration::from_secs(4),
        ..MountOptions::default()
    };
    let mut h = Harness::ready(TestFs::default(), opts);
    let all = readdirplus_pages(&mut h, 500);
    assert_eq!(all.len(), DIR_FILES + 2);
    assert_eq!((all[0].0.nodeid, all[0].2.as_str()), (0, "."), "no lookup for .");
    assert_eq!((all[1].0.nodeid, all[1].2.as_str()), (0, ".."));
    let (e, off, name) = &all[2];
    assert_eq!((e.nodeid, *off, name.as_str()), (FIRST_CHILD, 3, "f000"));
    assert_eq!((e.entry_valid, e.attr_valid, e.attr.ino), (3, 4, FIRST_CHILD + 1000));
    let lookups =
        h.fs.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.starts_with("lookup"))
            .count();
    assert_eq!(lookups, DIR_FILES, "one lookup per entry that was sent");
}

#[test]
fn readdirplus_native_sink() {
    let fs = TestFs {
        native_plus: true,
        ..TestFs::default()
    };
    let mut h = Harness::ready(fs, MountOptions::default());
    let all = readdirplus_pages(&mut h, 400);
    assert_eq!(all.len(), DIR_FILES);
    assert!(all.iter().all(|(e, _, _)| e.entry_valid == 1));
    assert_eq!(all[99].2, "f099");
}

#[test]
fn xattr_size_probe_erange_and_list() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let arg = [5u32.to_ne_bytes(), 0u32.to_ne_bytes()].concat();
    let mut body = with_names(&arg, &[b"user.k"]);
    body.extend_from_slice(b"value");
    h.ok(abi::FUSE_SETXATTR, HELLO, &body);
    let probe = abi::fuse_getxattr_in { size: 0, padding: 0 };
    let p = h.ok(abi::FUSE_GETXATTR, HELLO, &with_names(probe.as_bytes(), &[b"user.k"]));
    assert_eq!(p, golden(&[F::U32(5), F::U32(0)]));
    let small = abi::fuse_getxattr_in { size: 4, padding: 0 };
    assert_eq!(
        h.err(abi::FUSE_GETXATTR, HELLO, &with_names(small.as_bytes(), &[b"user.k"])),
        libc::ERANGE
    );
    let big = abi::fuse_getxattr_in { size: 64, padding: 0 };
    assert_eq!(
        h.ok(abi::FUSE_GETXATTR, HELLO, &with_names(big.as_bytes(), &[b"user.k"])),
        b"value"
    );
    assert_eq!(
        h.err(abi::FUSE_GETXATTR, HELLO, &with_names(big.as_bytes(), &[b"user.none"])),
        libc::ENODATA
    );
    assert_eq!(
        h.ok(abi::FUSE_LISTXATTR, HELLO, probe.as_bytes()),
        golden(&[F::U32(7), F::U32(0)])
    );
    assert_eq!(h.ok(abi::FUSE_LISTXATTR, HELLO, big.as_bytes()), b"user.k\0");
    assert_eq!(h.err(abi::FUSE_REMOVEXATTR, HELLO, b"user.k\0"), libc::ENOSYS);
}

#[test]
fn locks_flock_and_posix() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let mut arg = abi::fuse_lk_in {
        fh: 77,
        owner: 5,
        lk: abi::fuse_file_lock {
            start: 0,
            end: u64::MAX,
            typ: libc::F_WRLCK as u32,
            pid: 1,
        },
        lk_flags: abi::FUSE_LK_FLOCK,
        padding: 0,
    };
    h.ok(abi::FUSE_SETLK, HELLO, arg.as_bytes());
    h.ok(abi::FUSE_SETLKW, HELLO, arg.as_bytes());
    arg.lk_flags = 0;
    arg.lk.typ = libc::F_RDLCK as u32;
    h.ok(abi::FUSE_SETLKW, HELLO, arg.as_bytes());
    let calls = h.fs.calls.lock().unwrap().clone();
    let ex_nb = libc::LOCK_EX | libc::LOCK_NB;
    assert_eq!(
        calls,
        [
            format!("flock 2 77 5 {ex_nb}"),
            format!("flock 2 77 5 {}", libc::LOCK_EX),
            format!("setlk 2 0-{} {} true", u64::MAX, libc::F_RDLCK),
        ]
    );
    assert_eq!(h.err(abi::FUSE_GETLK, HELLO, arg.as_bytes()), libc::ENOSYS);
}

#[test]
fn small_replies_and_enosys_family() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let p = h.ok(abi::FUSE_STATFS, 1, &[]);
    assert_eq!(
        p,
        golden(&[
            F::U64(1),
            F::U64(2),
            F::U64(3),
            F::U64(4),
            F::U64(5),
            F::U32(512),
            F::U32(255),
            F::U32(1024),
            F::Zero(28)
        ])
    );
    assert_eq!(h.ok(abi::FUSE_READLINK, 5, &[]), b"target");
    let lseek = abi::fuse_lseek_in {
        fh: 1,
        offset: 10,
        whence: 3,
        padding: 0,
    };
    assert_eq!(h.ok(abi::FUSE_LSEEK, HELLO, lseek.as_bytes()), 13u64.to_le_bytes());
    let copy = abi::fuse_copy_file_range_in {
        len: 5 << 32,
        ..Default::default()
    };
    assert_eq!(
        h.ok(abi::FUSE_COPY_FILE_RANGE_64, HELLO, copy.as_bytes()),
        (5u64 << 32).to_le_bytes()
    );
    assert_eq!(
        h.ok(abi::FUSE_COPY_FILE_RANGE, HELLO, copy.as_bytes()),
        golden(&[F::U32(u32::MAX), F::U32(0)])
    );
    assert!(h
        .ok(abi::FUSE_RELEASE, HELLO, abi::fuse_release_in::default().as_bytes())
        .is_empty());
    assert_eq!(
        h.err(abi::FUSE_FLUSH, HELLO, abi::fuse_flush_in::default().as_bytes()),
        libc::ENOSYS
    );
    assert_eq!(
        h.err(abi::FUSE_ACCESS, HELLO, abi::fuse_access_in::default().as_bytes()),
        libc::ENOSYS
    );
    assert_eq!(
        h.err(abi::FUSE_STATX, HELLO, abi::fuse_statx_in::default().as_bytes()),
        libc::ENOSYS
    );
    assert_eq!(
        h.err(abi::FUSE_BMAP, HELLO, abi::fuse_bmap_in::default().as_bytes()),
        libc::ENOSYS
    );
    assert_eq!(
        h.err(abi::FUSE_SYNCFS, 1, abi::fuse_syncfs_in::default().as_bytes()),
        libc::ENOSYS
    );
    assert_eq!(h.err(abi::FUSE_UNLINK, 1, b"x\0"), libc::ENOSYS);
    let rename2 = abi::fuse_rename2_in {
        newdir: 1,
        flags: 1 << 20,
        padding: 0,
    };
    assert_eq!(
        h.err(abi::FUSE_RENAME2, 1, &with_names(rename2.as_bytes(), &[b"a", b"b"])),
        libc::EINVAL,
        "unknown rename flags"
    );
    assert_eq!(h.err(7, 1, &[]), libc::ENOSYS, "unknown opcode");
}

#[test]
fn no_reply_opcodes_forget_interrupt_destroy() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let mut buf = Vec::new();
    let m = msg(abi::FUSE_FORGET, 7, 300, abi::fuse_forget_in { nlookup: 3 }.as_bytes());
    assert_eq!(h.d.handle(&m, &mut buf, Transport::Dev), Outcome::NoReply);
    let mut body = abi::fuse_batch_forget_in { count: 130, dummy: 0 }.as_bytes().to_vec();
    for i in 0..130u64 {
        body.extend_from_slice(
            abi::fuse_forget_one {
                nodeid: 1000 + i,
                nlookup: i,
            }
            .as_bytes(),
        );
    }
    let m = msg(abi::FUSE_BATCH_FORGET, 0, 301, &body);
    assert_eq!(h.d.handle(&m, &mut buf, Transport::Dev), Outcome::NoReply);
    let forgets = h.fs.forgets.lock().unwrap().clone();
    assert_eq!(forgets.len(), 131);
    assert_eq!(
        forgets[0],
        Forget {
            node: NodeId(7),
            nlookup: 3
        }
    );
    assert_eq!(
        forgets[130],
        Forget {
            node: NodeId(1129),
            nlookup: 129
        }
    );
    let m = msg(
        abi::FUSE_INTERRUPT,
        0,
        302,
        abi::fuse_interrupt_in { unique: 5 }.as_bytes(),
    );
    assert_eq!(h.d.handle(&m, &mut buf, Transport::Dev), Outcome::NoReply);
    // A truncated FORGET is dropped, never answered.
    let m = msg(abi::FUSE_FORGET, 7, 303, &[1, 2]);
    assert_eq!(h.d.handle(&m, &mut buf, Transport::Dev), Outcome::NoReply);

    let m = msg(abi::FUSE_DESTROY, 0, 304, &[]);
    assert_eq!(h.d.handle(&m, &mut buf, Transport::Dev), Outcome::Destroy);
    let r = check_reply(&buf);
    assert_eq!((r.error, r.unique, r.payload.len()), (0, 304, 0));
    assert!(*h.fs.destroyed.lock().unwrap());
    assert_eq!(h.err(abi::FUSE_STATFS, 1, &[]), libc::EIO);
}

#[test]
fn malformed_requests() {
    let mut h = Harness::ready(TestFs::default(), MountOptions::default());
    let mut buf = Vec::new();
    // Header unreadable: dropped.
    assert_eq!(h.d.handle(&[1, 2, 3], &mut buf, Transport::Dev), Outcome::NoReply);
    // Length field disagrees: EINVAL to the unique.
    let mut m = msg(abi::FUSE_STATFS, 1, 400, &[]);
    m.extend_from_slice(&[0; 8]);
    assert_eq!(h.d.handle(&m, &mut buf, Transport::Dev), Outcome::Reply);
    let r = check_reply(&buf);
    assert_eq!((r.error, r.unique), (-libc::EINVAL, 400));
    // Name without NUL.
    assert_eq!(h.err(abi::FUSE_LOOKUP, 1, b"hello"), libc::EINVAL);
    // unique 0 would read as a notification: dropped.
    let m = msg(abi::FUSE_LOOKUP, 1, 0, b"hello");
    assert_eq!(h.d.handle(&m, &mut buf, Transport::Dev), Outcome::NoReply);
}

#[test]
fn a_file_attr_timeout_applies_to_regular_files_only() {
    // A file system that trusts the kernel with no attribute of a regular
    // file (distfs with the page cache) sets it at init; directories keep
    // the mount's timeout.
    let opts = MountOptions {
        entry_timeout: Duration::from_secs(3),
        attr_timeout: Duration::from_secs(4),
        ..MountOptions::default()
    };
    let fs = TestFs {
        file_attr_timeout: Some(Duration::ZERO),
        ..TestFs::default()
    };
    let mut h = Harness::ready(fs, opts);
    let getattr = |h: &mut Harness, node| {
        let p = h.ok(abi::FUSE_GETATTR, node, abi::fuse_getattr_in::default().as_bytes());
        let a = abi::fuse_attr_out::read_from_bytes(&p).unwrap();
        (a.attr_valid, a.attr_valid_nsec)
    };
    assert_eq!(getattr(&mut h, HELLO), (0, 0));
    assert_eq!(getattr(&mut h, DIR), (4, 0));
    let e = abi::fuse_entry_out::read_from_bytes(&h.ok(abi::FUSE_LOOKUP, 1, b"hello\0")).unwrap();
    assert_eq!((e.entry_valid, e.attr_valid, e.attr_valid_nsec), (3, 0, 0));
    let all = readdirplus_pages(&mut h, 500);
    let (e, _, name) = &all[2];
    assert_eq!((name.as_str(), e.entry_valid, e.attr_valid), ("f000", 3, 0));
}
