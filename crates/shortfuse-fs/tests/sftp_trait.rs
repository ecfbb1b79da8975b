//! `sftp` through the `Filesystem` trait (no kernel) against a real sshd.

mod sftp_support;

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use sftp_support::Sshd;
use shortfuse::{
    DirPlusSink, DirSink, Entry, Errno, FileType, Filesystem, NewNode, NodeId, OpenFlags, RenameFlags, Request,
    SetAttr, SetTime, Timestamp, WriteArgs,
};
use shortfuse_fs::pattern::bytes;
use shortfuse_fs::sftp::SftpFs;

const REQ: Request = Request {
    unique: 1,
    uid: 0,
    gid: 0,
    pid: 1,
};

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn file_mode(mode: u32) -> NewNode {
    NewNode {
        mode: libc::S_IFREG | mode,
        umask: 0,
        rdev: 0,
    }
}

fn dir_mode() -> NewNode {
    NewNode {
        mode: libc::S_IFDIR | 0o755,
        umask: 0o022,
        rdev: 0,
    }
}

fn connect(s: &Sshd, extra: &[(&str, Option<&str>)]) -> SftpFs {
    SftpFs::connect(&s.target(), &s.options(extra)).unwrap_or_else(|e| panic!("connect: {e}"))
}

#[derive(Default)]
struct Names(Vec<(OsString, FileType)>);

impl DirSink for Names {
    fn add(&mut self, _ino: u64, _next: u64, typ: FileType, name: &OsStr) -> bool {
        self.0.push((name.to_owned(), typ));
        true
    }
}

#[derive(Default)]
struct Plus(Vec<(OsString, Entry)>);

impl DirPlusSink for Plus {
    fn add(&mut self, entry: &Entry, _next: u64, name: &OsStr) -> bool {
        self.0.push((name.to_owned(), *entry));
        true
    }
}

#[test]
fn large_file_round_trip() {
    let s = Sshd::start();
    let fs = connect(&s, &[]);
    let c = fs
        .create(&REQ, NodeId::ROOT, n("big"), &file_mode(0o644), OpenFlags::RDWR)
        .unwrap();
    let (node, fh) = (c.entry.node, c.opened.fh);
    let data = bytes(7, 6 << 20);
    // 1 MiB writes, each pipelined over many requests.
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        let args = WriteArgs {
            offset: (i << 20) as u64,
            ..WriteArgs::default()
        };
        assert_eq!(fs.write(&REQ, node, fh, piece, &args).unwrap(), piece.len());
    }
    fs.fsync(&REQ, node, fh, false).unwrap();
    assert_eq!(std::fs::read(s.data.join("big")).unwrap(), data, "server copy differs");
    // Read back in odd-sized pieces and across the end of the file.
    let mut back = Vec::new();
    let mut buf = vec![0u8; 1_000_003];
    loop {
        let got = fs.read(&REQ, node, fh, back.len() as u64, &mut buf).unwrap();
        back.extend_from_slice(&buf[..got]);
        if got < buf.len() {
            break;
        }
    }
    assert_eq!(back.len(), data.len());
    assert!(back == data, "read back differs");
    assert_eq!(fs.read(&REQ, node, fh, data.len() as u64 + 10, &mut buf).unwrap(), 0);
    assert_eq!(fs.getattr(&REQ, node, Some(fh)).unwrap().size, data.len() as u64);
    fs.release(&REQ, node, fh, &Default::default()).unwrap();
    // A second open reads what the first wrote.
    let o = fs.open(&REQ, node, OpenFlags::RDONLY).unwrap();
    let mut head = vec![0u8; 300_000];
    assert_eq!(fs.read(&REQ, node, o.fh, 12345, &mut head).unwrap(), head.len());
    assert_eq!(head, data[12345..12345 + head.len()]);
    fs.release(&REQ, node, o.fh, &Default::default()).unwrap();
}

#[test]
fn directories() {
    let s = Sshd::start();
    let fs = connect(&s, &[]);
    let d = fs.mkdir(&REQ, NodeId::ROOT, n("d"), &dir_mode()).unwrap();
    assert_eq!(d.attr.file_type(), FileType::Directory);
    assert_eq!(
        std::fs::metadata(s.data.join("d")).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        fs.mkdir(&REQ, NodeId::ROOT, n("d"), &dir_mode()).unwrap_err(),
        Errno::EEXIST
    );
    for name in ["a", "b", "c"] {
        let c = fs
            .create(&REQ, d.node, n(name), &file_mode(0o600), OpenFlags::WRONLY)
            .unwrap();
        fs.release(&REQ, c.entry.node, c.opened.fh, &Default::default())
            .unwrap();
    }
    fs.mkdir(&REQ, d.node, n("sub"), &dir_mode()).unwrap();
    let o = fs.opendir(&REQ, d.node, OpenFlags::empty()).unwrap();
    let mut names = Names::default();
    fs.readdir(&REQ, d.node, o.fh, 0, &mut names).unwrap();
    let mut got: Vec<_> = names
        .0
        .iter()
        .map(|(n, t)| (n.to_str().unwrap().to_owned(), *t))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    let want = [
        (".", FileType::Directory),
        ("..", FileType::Directory),
        ("a", FileType::Regular),
        ("b", FileType::Regular),
        ("c", FileType::Regular),
        ("sub", FileType::Directory),
    ];
    assert_eq!(got, want.map(|(n, t)| (n.to_owned(), t)));
    // Resuming from an offset skips what was already listed.
    let mut rest = Names::default();
    fs.readdir(&REQ, d.node, o.fh, 4, &mut rest).unwrap();
    assert_eq!(rest.0.len(), 2);
    let mut plus = Plus::default();
    fs.readdirplus(&REQ, d.node, o.fh, 0, &mut plus).unwrap();
    fs.releasedir(&REQ, d.node, o.fh, OpenFlags::empty()).unwrap();
    let (_, a) = plus.0.iter().find(|(name, _)| name == "a").unwrap();
    assert_eq!(a.attr.mode & 0o777, 0o600);
    assert_eq!(
        fs.lookup(&REQ, d.node, n("a")).unwrap().node,
        a.node,
        "readdirplus and lookup disagree"
    );
    assert_eq!(fs.rmdir(&REQ, NodeId::ROOT, n("d")).unwrap_err(), Errno::ENOTEMPTY);
    assert_eq!(fs.lookup(&REQ, d.node, n("nope")).unwrap_err(), Errno::ENOENT);
    for name in ["a", "b", "c"] {
        fs.unlink(&REQ, d.node, n(name)).unwrap();
    }
    assert_eq!(fs.unlink(&REQ, d.node, n("a")).unwrap_err(), Errno::ENOENT);
    fs.rmdir(&REQ, d.node, n("sub")).unwrap();
    fs.rmdir(&REQ, NodeId::ROOT, n("d")).unwrap();
    assert!(!s.data.join("d").exists());
    let st = fs.statfs(&REQ, NodeId::ROOT).unwrap();
    assert!(st.blocks > 0 && st.bsize > 0, "{st:?}");
}

#[test]
fn rename_keeps_nodes_and_handles() {
    let s = Sshd::start();
    let fs = connect(&s, &[]);
    let d = fs.mkdir(&REQ, NodeId::ROOT, n("d"), &dir_mode()).unwrap();
    let f = fs
        .create(&REQ, d.node, n("f"), &file_mode(0o644), OpenFlags::RDWR)
        .unwrap();
    fs.write(&REQ, f.entry.node, f.opened.fh, b"hello", &WriteArgs::default())
        .unwrap();
    fs.release(&REQ, f.entry.node, f.opened.fh, &Default::default())
        .unwrap();
    // Moving the directory moves the node below it.
    fs.rename(&REQ, NodeId::ROOT, n("d"), NodeId::ROOT, n("e"), RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(&REQ, f.entry.node, None).unwrap().size, 5);
    let o = fs.open(&REQ, f.entry.node, OpenFlags::RDONLY).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(fs.read(&REQ, f.entry.node, o.fh, 0, &mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    // Replacing an existing name; the replaced node goes stale.
    let g = fs
        .create(&REQ, NodeId::ROOT, n("g"), &file_mode(0o644), OpenFlags::WRONLY)
        .unwrap();
    fs.release(&REQ, g.entry.node, g.opened.fh, &Default::default())
        .unwrap();
    assert_eq!(
        fs.rename(
            &REQ,
            d.node,
            n("f"),
            NodeId::ROOT,
            n("g"),
            RenameFlags {
                noreplace: true,
                ..Default::default()
            }
        )
        .unwrap_err(),
        Errno::EEXIST
    );
    fs.rename(&REQ, d.node, n("f"), NodeId::ROOT, n("g"), RenameFlags::default())
        .unwrap();
    assert_eq!(std::fs::read(s.data.join("g")).unwrap(), b"hello");
    assert!(!s.data.join("e/f").exists());
    assert_eq!(fs.getattr(&REQ, g.entry.node, None).unwrap_err(), Errno::ENOENT);
    assert_eq!(fs.getattr(&REQ, f.entry.node, None).unwrap().size, 5);
    // The handle opened before the rename still reads.
    assert_eq!(fs.read(&REQ, f.entry.node, o.fh, 1, &mut buf).unwrap(), 4);
    fs.release(&REQ, f.entry.node, o.fh, &Default::default()).unwrap();
    assert_eq!(
        fs.rename(
            &REQ,
            NodeId::ROOT,
            n("g"),
            NodeId::ROOT,
            n("x"),
            RenameFlags {
                exchange: true,
                ..Default::default()
            }
        )
        .unwrap_err(),
        Errno::EINVAL
    );
}

#[test]
fn links_and_attributes() {
    let s = Sshd::start();
    let fs = connect(&s, &[]);
    let f = fs
        .create(&REQ, NodeId::ROOT, n("f"), &file_mode(0o644), OpenFlags::RDWR)
        .unwrap();
    let node = f.entry.node;
    fs.write(&REQ, node, f.opened.fh, &[7u8; 10000], &WriteArgs::default())
        .unwrap();
    let l = fs.symlink(&REQ, NodeId::ROOT, n("l"), n("f")).unwrap();
    assert_eq!(l.attr.file_type(), FileType::Symlink);
    assert_eq!(fs.readlink(&REQ, l.node).unwrap(), b"f");
    assert_eq!(std::fs::read_link(s.data.join("l")).unwrap(), std::path::Path::new("f"));
    assert_eq!(
        fs.symlink(&REQ, NodeId::ROOT, n("l"), n("g")).unwrap_err(),
        Errno::EEXIST
    );
    let h = fs.link(&REQ, node, NodeId::ROOT, n("h")).unwrap();
    assert_eq!(h.attr.size, 10000);
    assert_eq!(std::fs::metadata(s.data.join("h")).unwrap().nlink(), 2);
    // truncate through the handle, chmod and times by path.
    let set = SetAttr {
        size: Some(100),
        fh: Some(f.opened.fh),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&REQ, node, &set).unwrap().size, 100);
    let set = SetAttr {
        mode: Some(0o640),
        mtime: Some(SetTime::At(Timestamp {
            sec: 1_000_000,
            nsec: 0,
        })),
        ..SetAttr::default()
    };
    let a = fs.setattr(&REQ, node, &set).unwrap();
    assert_eq!((a.mode & 0o7777, a.mtime.sec), (0o640, 1_000_000));
    let m = std::fs::metadata(s.data.join("f")).unwrap();
    assert_eq!((m.len(), m.mode() & 0o7777, m.mtime()), (100, 0o640, 1_000_000));
    let before = m.atime();
    let a = fs
        .setattr(
            &REQ,
            node,
            &SetAttr {
                atime: Some(SetTime::At(Timestamp { sec: 5, nsec: 0 })),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!(
        (a.atime.sec, a.mtime.sec),
        (5, 1_000_000),
        "setting atime alone kept mtime (atime was {before})"
    );
    fs.release(&REQ, node, f.opened.fh, &Default::default()).unwrap();
    assert_eq!(
        fs.mknod(
            &REQ,
            NodeId::ROOT,
            n("fifo"),
            &NewNode {
                mode: libc::S_IFIFO | 0o644,
                umask: 0,
                rdev: 0
            }
        )
        .unwrap_err(),
        Errno::EPERM
    );
    let m = fs.mknod(&REQ, NodeId::ROOT, n("plain"), &file_mode(0o600)).unwrap();
    assert_eq!(m.attr.size, 0);
    // Lookups are counted: forgetting everything leaves only the root.
    let before = fs.node_count();
    let again = fs.lookup(&REQ, NodeId::ROOT, n("f")).unwrap();
    assert_eq!(again.node, node);
    assert_eq!(fs.node_count(), before);
    for (e, count) in [(node, 2), (l.node, 1), (h.node, 1), (m.node, 1)] {
        fs.forget(e, count);
    }
    assert_eq!(fs.node_count(), 1);
}

#[test]
fn host_keys() {
    let s = Sshd::start();
    let kh = s.dir.join("known_hosts");
    let e = SftpFs::connect(&s.target(), &s.options(&[("StrictHostKeyChecking", Some("yes"))]))
        .err()
        .expect("an unknown host key was accepted under StrictHostKeyChecking=yes");
    assert!(e.to_string().contains("not in"), "{e}");
    assert!(!kh.exists());
    // accept-new (the default) records the key, and then "yes" accepts it.
    drop(connect(&s, &[]));
    assert!(std::fs::read_to_string(&kh)
        .unwrap()
        .contains(&format!("[127.0.0.1]:{}", s.port)));
    drop(connect(&s, &[("StrictHostKeyChecking", Some("yes"))]));
    // A different key for the same host is refused.
    let other = std::fs::read_to_string(s.dir.join("client_key.pub")).unwrap();
    let key = other.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    std::fs::write(&kh, format!("[127.0.0.1]:{} {key}\n", s.port)).unwrap();
    let e = SftpFs::connect(&s.target(), &s.options(&[]))
        .err()
        .expect("a changed host key was accepted");
    assert!(e.to_string().contains("CHANGED"), "{e}");
    // A wrong client key is refused with a clear message.
    let mut opts = s.options(&[
        ("StrictHostKeyChecking", Some("no")),
        ("identity", Some(s.dir.join("host_key").to_str().unwrap())),
    ]);
    opts.retain(|(k, v)| k != "identity" || v.as_deref() != Some(s.dir.join("client_key").to_str().unwrap()));
    let e = SftpFs::connect(&s.target(), &opts)
        .err()
        .expect("a key the server does not list was accepted");
    assert!(e.to_string().contains("authentication failed"), "{e}");
}

#[test]
fn reconnect_after_server_loss() {
    let mut s = Sshd::start();
    let fs = connect(&s, &[("reconnect", None)]);
    let c = fs
        .create(&REQ, NodeId::ROOT, n("f"), &file_mode(0o644), OpenFlags::RDWR)
        .unwrap();
    let (node, fh) = (c.entry.node, c.opened.fh);
    fs.write(&REQ, node, fh, b"before", &WriteArgs::default()).unwrap();
    s.kill();
    let t = Instant::now();
    let e = fs.getattr(&REQ, node, None).unwrap_err();
    assert!(e == Errno::EIO || e == Errno::ENOTCONN, "{e:?}");
    let e = fs.write(&REQ, node, fh, b"lost", &WriteArgs::default()).unwrap_err();
    assert!(e == Errno::EIO || e == Errno::ENOTCONN, "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(15), "failing took {:?}", t.elapsed());
    s.restart();
    assert_eq!(fs.getattr(&REQ, node, None).unwrap().size, 6);
    // The open file is opened again on the new session.
    let mut buf = [0u8; 16];
    assert_eq!(fs.read(&REQ, node, fh, 0, &mut buf).unwrap(), 6);
    assert_eq!(&buf[..6], b"before");
    fs.write(
        &REQ,
        node,
        fh,
        b"after",
        &WriteArgs {
            offset: 6,
            ..Default::default()
        },
    )
    .unwrap();
    fs.release(&REQ, node, fh, &Default::default()).unwrap();
    assert_eq!(std::fs::read(s.data.join("f")).unwrap(), b"beforeafter");
}

#[test]
fn in_flight_reads_fail_when_the_server_dies() {
    let mut s = Sshd::start();
    std::fs::write(s.data.join("big"), bytes(3, 8 << 20)).unwrap();
    let fs = std::sync::Arc::new(connect(&s, &[("reconnect", None)]));
    let e = fs.lookup(&REQ, NodeId::ROOT, n("big")).unwrap();
    let o = fs.open(&REQ, e.node, OpenFlags::RDONLY).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = {
        let (fs, done) = (fs.clone(), done.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4 << 20];
            let mut reads = 0u64;
            loop {
                match fs.read(&REQ, e.node, o.fh, (reads % 2) * (4 << 20), &mut buf) {
                    Ok(got) => assert_eq!(got, buf.len()),
                    Err(err) => return (reads, err, Instant::now()),
                }
                reads += 1;
                done.store(reads, std::sync::atomic::Ordering::Release);
            }
        })
    };
    // Kill while reads are running: after the first one finished (a loaded
    // machine may take seconds for it), and a moment into the next.
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.load(std::sync::atomic::Ordering::Acquire) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(20));
    let killed = Instant::now();
    s.kill();
    let (reads, err, failed) = reader.join().unwrap();
    assert!(reads > 0, "no read finished before the kill");
    assert!(err == Errno::EIO || err == Errno::ENOTCONN, "{err:?}");
    assert!(
        failed.duration_since(killed) < Duration::from_secs(10),
        "took {:?}",
        failed - killed
    );
    s.restart();
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(fs.read(&REQ, e.node, o.fh, 0, &mut buf).unwrap(), buf.len());
    assert_eq!(buf, bytes(3, 8 << 20)[..1 << 20]);
}

#[test]
fn without_reconnect_calls_fail_for_good() {
    let mut s = Sshd::start();
    let fs = connect(&s, &[]);
    let f = fs
        .lookup(&REQ, NodeId::ROOT, n("."))
        .map(|e| e.node)
        .unwrap_or(NodeId::ROOT);
    fs.getattr(&REQ, f, None).unwrap();
    s.kill();
    assert!(fs.getattr(&REQ, NodeId::ROOT, None).is_err());
    s.restart();
    assert_eq!(fs.getattr(&REQ, NodeId::ROOT, None).unwrap_err(), Errno::ENOTCONN);
}
