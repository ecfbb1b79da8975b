//! Several distfs clients in one process against one embedded server, no
//! kernel: lease revocation, strong consistency, serialized writers,
//! durability across a server restart, dead and cut-off clients.

mod support;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use shortfuse::{Errno, Filesystem, NewNode, NodeId, OpenFlags, SetAttr};
use shortfuse_dist::client::DistFs;
use shortfuse_dist::proto::LeaseMode;
use shortfuse_dist::server::{DistServer, ServerConfig};
use support::{caching_client, client, create, lookup, pattern, read, server, wait_for, write, FH, REQ};

#[test]
fn reader_revokes_writer_and_sees_its_cached_data() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let (a, b) = (caching_client(&s), caching_client(&s));
    let node = create(&a, "f");
    // 2.5 blocks, unaligned, into A's cache only.
    let data = pattern(1, 10_000);
    write(&a, node, 100, &data);
    let gfi = a.gfi(node).unwrap();
    assert_eq!(
        s.holders(gfi).unwrap(),
        (Some(LeaseMode::Write), [a.client_id().unwrap()].into())
    );
    // Nothing reached storage yet: the server still has an empty file.
    let nb = lookup(&b, "f");
    assert_eq!(b.gfi(nb).unwrap(), gfi, "both clients name the file by the same GFI");
    assert_eq!(b.lookup(&REQ, NodeId::ROOT, OsStr::new("f")).unwrap().attr.size, 0);

    // B reads: A's write lease is revoked, A writes back and steps down
    // to a read lease, B sees A's bytes.
    let got = read(&b, nb, 0, 20_000);
    let mut want = vec![0u8; 100];
    want.extend_from_slice(&data);
    assert_eq!(got, want);
    assert_eq!(b.getattr(&REQ, nb, None).unwrap().size, 10_100);
    let both = [a.client_id().unwrap(), b.client_id().unwrap()].into();
    assert_eq!(s.holders(gfi).unwrap(), (Some(LeaseMode::Read), both));

    // A reads from the cache it kept; readers share.
    assert_eq!(read(&a, node, 100, 5), &data[..5]);
    assert_eq!(read(&a, node, 9_000, 1_100), &data[8_900..]);
    assert_eq!(s.holders(gfi).unwrap().1.len(), 2);

    // A writes again: B's read lease goes, and B's next read sees the change.
    write(&a, node, 4096, b"XYZ");
    assert_eq!(s.holders(gfi).unwrap().1, [a.client_id().unwrap()].into());
    assert_eq!(read(&b, nb, 4096, 3), b"XYZ");

    // Truncation goes through the lease as well.
    let set = SetAttr {
        size: Some(50),
        ..SetAttr::default()
    };
    assert_eq!(a.setattr(&REQ, node, &set).unwrap().size, 50);
    assert_eq!(read(&b, nb, 0, 1000), vec![0u8; 50]);
    write(&a, node, 8000, b"end");
    let got = read(&b, nb, 0, 10_000);
    assert_eq!(got.len(), 8003);
    assert!(got[..8000].iter().all(|&x| x == 0), "truncated data came back");
}

#[test]
fn concurrent_writers_serialize() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let clients: Vec<DistFs> = (0..3).map(|_| client(&s)).collect();
    let node = create(&clients[0], "shared");
    let nodes: Vec<NodeId> = clients.iter().map(|c| lookup(c, "shared")).collect();
    const ROUNDS: usize = 40;
    const WHOLE: usize = 3 * 4096 + 17;
    std::thread::scope(|scope| {
        for (k, (c, &n)) in clients.iter().zip(&nodes).enumerate() {
            scope.spawn(move || {
                for r in 0..ROUNDS {
                    // Every client owns a few bytes inside the same blocks
                    // (a lost update would show) and overwrites a shared
                    // region whole (a torn write would show).
                    let off = (r * 3 + k) as u64 * 97;
                    write(c, n, off % 12_000, &[k as u8 + 1; 3]);
                    write(c, n, 20_000, &vec![k as u8 + 1; WHOLE]);
                    let seen = read(c, n, 20_000, WHOLE);
                    assert!(seen.windows(2).all(|w| w[0] == w[1]), "torn write seen by client {k}");
                }
            });
        }
    });
    let last = read(&clients[0], node, 0, 40_000);
    // The small writes never overlap (offsets 97 apart): every one of them
    // must be there, whichever order the clients ran in.
    let mut owner = vec![0u8; 12_000];
    for r in 0..ROUNDS {
        for k in 0..3 {
            let off = (r * 3 + k) * 97 % 12_000;
            owner[off..off + 3].fill(k as u8 + 1);
        }
    }
    assert_eq!(&last[..12_000], &owner[..], "updates lost or reordered");
    let whole = &last[20_000..20_000 + WHOLE];
    assert!(whole.windows(2).all(|w| w[0] == w[1]), "final shared region is torn");
}

#[test]
fn fsynced_data_survives_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let a = client(&s);
    let node = create(&a, "durable");
    let data = pattern(9, 50_000);
    write(&a, node, 0, &data);
    a.fsync(&REQ, node, FH, false).unwrap();
    let gfi = a.gfi(node).unwrap();
    let addr = s.addr();
    drop(s);
    // The client's connection died with the server; its leases are gone.
    // Same port, so that the old client finds the new server.
    let mut cfg = ServerConfig::new(dir.path().to_path_buf(), addr);
    cfg.block_size = 4096;
    let s = DistServer::start(cfg).unwrap();
    let b = client(&s);
    let nb = lookup(&b, "durable");
    assert_eq!(b.gfi(nb).unwrap(), gfi, "the GFI outlives the server process");
    assert_eq!(read(&b, nb, 0, 60_000), data);
    // The old client reconnects on its next call with a new session.
    let na = lookup(&a, "durable");
    assert_eq!(read(&a, na, 49_990, 100), &data[49_990..]);
}

/// Overwrites block `index` of `node` in the embedded server's storage
/// behind the server's back: a client that fetches the block again sees
/// `byte`s, one that serves it from its cache does not.
fn change_behind_the_server(data: &std::path::Path, fs: &DistFs, node: NodeId, index: u64, byte: u8) {
    let gfi = fs.gfi(node).unwrap();
    let obj = data.join(format!("blocks/{}/{}/{index}", gfi.node, gfi.ino));
    assert!(obj.exists(), "{} not in storage", obj.display());
    std::fs::write(obj, [byte; 4096]).unwrap();
}

#[test]
fn a_cache_outlives_a_lease_move_but_not_what_others_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let (a, b) = (caching_client(&s), caching_client(&s));
    let node = create(&a, "kept");
    write(&a, node, 0, &[1u8; 3 * 4096]);
    // B writes block 2: A writes back and releases, keeping its blocks.
    let nb = lookup(&b, "kept");
    write(&b, nb, 2 * 4096, &[2u8; 4096]);
    assert_eq!(
        s.holders(a.gfi(node).unwrap()).unwrap().1,
        [b.client_id().unwrap()].into()
    );
    change_behind_the_server(dir.path(), &a, node, 0, 9);
    // A reads again under a new lease: block 0, which nobody wrote, comes
    // from its kept cache; block 2, which B wrote, is never served stale.
    let got = read(&a, node, 0, 3 * 4096);
    assert_eq!(
        &got[..2 * 4096],
        &[1u8; 2 * 4096][..],
        "an unchanged block was not kept"
    );
    assert_eq!(&got[2 * 4096..], &[2u8; 4096][..], "a block B wrote was served stale");
    // Upgrading to write keeps the cache too.
    write(&a, node, 4096, &[3u8; 10]);
    assert_eq!(read(&a, node, 0, 4096), [1u8; 4096]);

    // B truncates and writes: every block of A's cache may have changed.
    let nb = lookup(&b, "kept");
    let set = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    b.setattr(&REQ, nb, &set).unwrap();
    write(&b, nb, 4096, &[4u8; 4096]);
    let got = read(&a, node, 0, 3 * 4096);
    assert_eq!(got.len(), 2 * 4096);
    assert_eq!(
        &got[..4096],
        &[0u8; 4096][..],
        "truncated data came back from a kept cache"
    );
    assert_eq!(&got[4096..], &[4u8; 4096][..]);
}

#[test]
fn an_fsync_after_the_lease_moved_still_makes_the_written_back_blocks_durable() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(5));
    let (a, b) = (caching_client(&s), caching_client(&s));
    let node = create(&a, "f");
    write(&a, node, 0, &pattern(1, 3 * 4096));
    // B's read takes the lease: A writes its blocks back, not durably.
    let nb = lookup(&b, "f");
    assert_eq!(read(&b, nb, 0, 3 * 4096), pattern(1, 3 * 4096));
    // (B may read before A's revocation hears that its write-back landed.)
    wait_for("the write-back listed as unsynced", Duration::from_secs(10), || {
        a.unsynced_blocks(node).unwrap() == 3
    });
    // A's fsync, holding no lease now, has the server sync them.
    a.fsync(&REQ, node, FH, false).unwrap();
    assert_eq!(a.unsynced_blocks(node).unwrap(), 0);
    assert_eq!(read(&b, nb, 0, 3 * 4096), pattern(1, 3 * 4096));
}

#[test]
fn dead_client_loses_only_unsynced_data() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(30));
    let (a, b) = (client(&s), client(&s));
    let node = create(&a, "f");
    write(&a, node, 0, b"synced");
    a.fsync(&REQ, node, FH, false).unwrap();
    write(&a, node, 6, b" and cached");
    // The process dies: the connection closes, nothing is written back.
    drop(a);
    let nb = lookup(&b, "f");
    // The dead client's session ended with its connection: B does not wait
    // for the 30-second TTL.
    let t = Instant::now();
    assert_eq!(read(&b, nb, 0, 100), b"synced");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    write(&b, nb, 6, b"!");
    assert_eq!(read(&b, nb, 0, 100), b"synced!");
}

#[test]
fn cut_off_client_leases_expire_and_it_cannot_write_back() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(600);
    let s = server(dir.path(), ttl);
    let (a, b) = (client(&s), client(&s));
    let node = create(&a, "f");
    write(&a, node, 0, b"before");
    a.fsync(&REQ, node, FH, false).unwrap();
    write(&a, node, 0, b"AFTER!");
    // A keeps its connection but neither renews nor answers revocations.
    a.cut_off();
    let nb = lookup(&b, "f");
    let t = Instant::now();
    assert_eq!(read(&b, nb, 0, 100), b"before");
    assert!(
        t.elapsed() >= ttl / 2,
        "granted before A's lease could expire: {:?}",
        t.elapsed()
    );
    write(&b, nb, 0, b"B wins");
    // A's cached data can no longer reach storage: its fsync fails and B's
    // data stands.
    assert!(a.fsync(&REQ, node, FH, false).is_err());
    assert_eq!(read(&b, nb, 0, 100), b"B wins");
    // A's later reads go through a new session and see B's data.
    let na = lookup(&a, "f");
    assert_eq!(read(&a, na, 0, 100), b"B wins");
}

#[test]
fn namespace_operations() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let (a, b) = (client(&s), client(&s));
    let dnew = NewNode {
        mode: 0o755,
        umask: 0,
        rdev: 0,
    };
    let d = a.mkdir(&REQ, NodeId::ROOT, OsStr::new("d"), &dnew).unwrap().node;
    let f = create(&a, "f");
    write(&a, f, 0, b"hello");
    a.rename(
        &REQ,
        NodeId::ROOT,
        OsStr::new("f"),
        d,
        OsStr::new("g"),
        Default::default(),
    )
    .unwrap();
    let g = b.lookup(&REQ, d, OsStr::new("g")).unwrap().node;
    assert_eq!(read(&b, g, 0, 10), b"hello");
    b.symlink(&REQ, d, OsStr::new("s"), OsStr::new("g")).unwrap();
    assert_eq!(a.readlink(&REQ, lookup_in(&a, d, "s")).unwrap(), b"g");
    assert_eq!(a.rmdir(&REQ, NodeId::ROOT, OsStr::new("d")), Err(Errno::ENOTEMPTY));
    a.unlink(&REQ, d, OsStr::new("g")).unwrap();
    assert_eq!(b.lookup(&REQ, d, OsStr::new("g")).err(), Some(Errno::ENOENT));
    assert!(b.statfs(&REQ, NodeId::ROOT).unwrap().files >= 3);
}

fn lookup_in(fs: &DistFs, dir: NodeId, name: &str) -> NodeId {
    fs.lookup(&REQ, dir, OsStr::new(name)).unwrap().node
}

#[test]
fn read_of_a_hole_after_the_written_part_of_a_cached_block_is_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let a = client(&s);
    let node = create(&a, "holes");
    // The block holding 200_000 is cached up to its last written byte
    // only; the file goes on past it.
    write(&a, node, 0, b"head");
    write(&a, node, 200_000, b"mid");
    write(&a, node, 300_001, b"far");
    let got = read(&a, node, 200_003 + 1000, 32);
    assert_eq!(got, vec![0u8; 32]);
    let got = read(&a, node, 299_995, 9);
    assert_eq!(got, b"\0\0\0\0\0\0far");
}

fn released(fs: &DistFs, node: NodeId) {
    fs.release(&REQ, node, FH, &shortfuse::ReleaseArgs::default()).unwrap();
}

#[test]
fn an_open_file_outlives_its_last_name_across_clients() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(600);
    let s = server(dir.path(), ttl);
    let (a, b) = (client(&s), client(&s));
    let block0 = |node: NodeId, fs: &DistFs| {
        let gfi = fs.gfi(node).unwrap();
        let p = dir.path().join("blocks").join(gfi.node.to_string());
        p.join(gfi.ino.to_string()).join("0")
    };
    // Created (and so held open) by A, removed by B.
    let node = create(&a, "f");
    write(&a, node, 0, b"kept");
    a.fsync(&REQ, node, FH, false).unwrap();
    let stored = block0(node, &a);
    assert!(stored.exists());
    b.unlink(&REQ, NodeId::ROOT, OsStr::new("f")).unwrap();
    assert_eq!(b.lookup(&REQ, NodeId::ROOT, OsStr::new("f")).err(), Some(Errno::ENOENT));
    assert_eq!(read(&a, node, 0, 10), b"kept");
    write(&a, node, 4, b" still");
    assert_eq!(read(&a, node, 0, 20), b"kept still");
    assert_eq!(a.getattr(&REQ, node, None).unwrap().nlink, 0);
    assert!(stored.exists(), "the data went while the file was open");
    // The last close frees it (told without waiting: soon after).
    released(&a, node);
    let t = Instant::now();
    while stored.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the orphan's data outlived its last close"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // Opened twice by A (one round trip), once by B; removed by A.
    let node = create(&a, "g");
    write(&a, node, 0, b"g data");
    a.fsync(&REQ, node, FH, false).unwrap();
    a.open(&REQ, node, OpenFlags::RDONLY).unwrap();
    let nb = lookup(&b, "g");
    b.open(&REQ, nb, OpenFlags::RDONLY).unwrap();
    a.unlink(&REQ, NodeId::ROOT, OsStr::new("g")).unwrap();
    released(&a, node);
    released(&a, node);
    let stored = block0(node, &a);
    assert_eq!(read(&b, nb, 0, 10), b"g data", "B's open did not keep the file");
    // B dies without closing: its session's expiry frees the orphan.
    b.cut_off();
    let t = Instant::now();
    while stored.exists() {
        assert!(t.elapsed() < ttl * 20, "a dead opener's orphan was never reaped");
        std::thread::sleep(ttl / 10);
    }
    assert!(t.elapsed() >= ttl / 2, "reaped before B's session could expire");
}
