//! The etcd metadata service against a real etcd: several agents on one
//! etcd see one name space, changes are atomic, orphans outlive agents.

#[path = "support/etcd.rs"]
mod etcd;

use std::time::{Duration, Instant};

use etcd::{runtime, TestEtcd};
use shortfuse::Errno;
use shortfuse_dist::meta::etcd::{self as etcdmeta, Creation, EtcdMeta, FsParams, DEFAULT_PREFIX};
use shortfuse_dist::meta::{Freed, ROOT_INO};
use shortfuse_dist::proto::{AttrChange, NewKind};

const TTL: Duration = Duration::from_secs(2);

/// A file named `name` in the root.
fn new(name: &[u8]) -> Creation<'_> {
    Creation {
        parent: ROOT_INO,
        name,
        kind: file(),
        mode: 0o644,
        uid: 0,
        gid: 0,
    }
}

async fn agent(etcd: &TestEtcd, node_id: u32) -> EtcdMeta {
    let client = etcdmeta::connect(&etcd.endpoints()).await.unwrap();
    let params = FsParams {
        node_id,
        block_size: 4096,
    };
    EtcdMeta::open(client, DEFAULT_PREFIX, params, TTL).await.unwrap()
}

fn file() -> NewKind {
    NewKind::Node { rdev: 0 }
}

fn names(entries: Vec<shortfuse_dist::proto::DirEntryInfo>) -> Vec<Vec<u8>> {
    entries.into_iter().map(|e| e.name).collect()
}

// Test set-up of the same shape recurs from test to test below: kept apart
// so each test reads on its own.
#[test]
fn two_agents_see_each_others_changes_at_once() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let a = agent(&etcd, 11).await;
        let b = agent(&etcd, 22).await;
        assert_eq!(b.params(), a.params(), "the first agent's parameters hold");
        let d = a.create(ROOT_INO, b"d", NewKind::Dir, 0o755, 1, 2).await.unwrap();
        assert_eq!(d.gfi.node, 11);
        let seen = b.lookup(ROOT_INO, b"d").await.unwrap();
        assert_eq!(seen, d);
        let f = b.create(d.gfi.ino, b"f", file(), 0o640, 3, 4).await.unwrap();
        assert_ne!(f.gfi.ino, d.gfi.ino);
        assert_eq!(names(a.readdir(d.gfi.ino).await.unwrap()), [&b"."[..], b"..", b"f"]);
        a.rename(d.gfi.ino, b"f", ROOT_INO, b"g", 0).await.unwrap();
        assert_eq!(b.lookup(d.gfi.ino, b"f").await.err(), Some(Errno::ENOENT));
        assert_eq!(b.lookup(ROOT_INO, b"g").await.unwrap().gfi, f.gfi);
        b.extend(f.gfi.ino, 5000, Some((7, 8))).await.unwrap();
        let change = AttrChange {
            mode: Some(0o600),
            ..AttrChange::default()
        };
        let (info, old) = a.setattr(f.gfi.ino, &change).await.unwrap();
        assert_eq!(
            (old, info.attr.size, info.attr.mode),
            (5000, 5000, libc::S_IFREG | 0o600)
        );
        assert_eq!(b.getattr(f.gfi.ino).await.unwrap().attr, info.attr);
        b.link(f.gfi.ino, d.gfi.ino, b"hard").await.unwrap();
        assert_eq!(a.getattr(f.gfi.ino).await.unwrap().attr.nlink, 2);
        let target = b"../g".to_vec();
        let s = a
            .create(
                d.gfi.ino,
                b"s",
                NewKind::Symlink { target: target.clone() },
                0o777,
                0,
                0,
            )
            .await
            .unwrap();
        assert_eq!(b.readlink(s.gfi.ino).await.unwrap(), target);
        assert_eq!(b.remove(ROOT_INO, b"d", true).await.err(), Some(Errno::ENOTEMPTY));
        assert_eq!(b.remove(ROOT_INO, b"g", true).await.err(), Some(Errno::ENOTDIR));
        assert_eq!(b.remove(ROOT_INO, b"d", false).await.err(), Some(Errno::EISDIR));
        assert_eq!(
            a.rename(ROOT_INO, b"d", d.gfi.ino, b"x", 0).await.err(),
            Some(Errno::EINVAL),
            "a directory cannot move below itself"
        );
        // The last name frees the inode, whichever agent removes it.
        assert_eq!(a.remove(ROOT_INO, b"g", false).await.unwrap(), Freed(vec![]));
        assert_eq!(
            b.remove(d.gfi.ino, b"hard", false).await.unwrap(),
            Freed(vec![f.gfi.ino])
        );
        assert_eq!(a.getattr(f.gfi.ino).await.err(), Some(Errno::ENOENT));
        b.remove(d.gfi.ino, b"s", false).await.unwrap();
        assert_eq!(a.getattr(ROOT_INO).await.unwrap().attr.nlink, 3);
        a.remove(ROOT_INO, b"d", true).await.unwrap();
        assert_eq!(b.getattr(ROOT_INO).await.unwrap().attr.nlink, 2);
        assert_eq!(names(b.readdir(ROOT_INO).await.unwrap()), [&b"."[..], b".."]);
        assert_eq!(a.count().await.unwrap(), 1, "only the root is left");
    });
}

#[test]
fn of_concurrent_creates_of_one_name_exactly_one_wins() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let agents = [agent(&etcd, 1).await, agent(&etcd, 2).await];
        for round in 0..5 {
            let name = format!("n{round}");
            let tries = (0..8).map(|i| agents[i % 2].create(ROOT_INO, name.as_bytes(), file(), 0o644, 0, 0));
            let results = futures::future::join_all(tries).await;
            let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
            assert_eq!(won.len(), 1, "{name}: {results:?}");
            for r in &results {
                assert!(matches!(r, Ok(_) | Err(Errno::EEXIST)), "{r:?}");
            }
            let seen = agents[round % 2].lookup(ROOT_INO, name.as_bytes()).await.unwrap();
            assert_eq!(seen.gfi, won[0].gfi);
        }
        let unique: Vec<String> = (0..20).map(|i| format!("u{i}")).collect();
        let inos: std::collections::HashSet<u64> = futures::future::join_all(
            unique
                .iter()
                .enumerate()
                .map(|(i, n)| agents[i % 2].create(ROOT_INO, n.as_bytes(), file(), 0o644, 0, 0)),
        )
        .await
        .into_iter()
        .map(|r| r.unwrap().gfi.ino)
        .collect();
        assert_eq!(inos.len(), 20, "inode numbers are unique across agents");
    });
}

#[test]
fn renames_are_atomic() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let a = agent(&etcd, 1).await;
        let b = agent(&etcd, 2).await;
        // Crossed moves of two directories into each other: one wins, the
        // other would make a loop.
        for round in 0..4 {
            let x = a
                .create(ROOT_INO, b"x", NewKind::Dir, 0o755, 0, 0)
                .await
                .unwrap()
                .gfi
                .ino;
            let y = a
                .create(ROOT_INO, b"y", NewKind::Dir, 0o755, 0, 0)
                .await
                .unwrap()
                .gfi
                .ino;
            let (rx, ry) = tokio::join!(
                a.rename(ROOT_INO, b"x", y, b"x", 0),
                b.rename(ROOT_INO, b"y", x, b"y", 0)
            );
            assert!(rx.is_ok() != ry.is_ok(), "round {round}: {rx:?} {ry:?}");
            let x_won = rx.is_ok();
            let lost = if x_won { ry } else { rx };
            assert!(matches!(lost, Err(Errno::EINVAL) | Err(Errno::ENOENT)), "{lost:?}");
            let (outer, inner, name) = if x_won { (y, x, b"x") } else { (x, y, b"y") };
            assert_eq!(b.lookup(outer, name).await.unwrap().gfi.ino, inner);
            assert_eq!(a.readdir(ROOT_INO).await.unwrap().len(), 3);
            assert_eq!(a.getattr(outer).await.unwrap().attr.nlink, 3);
            b.remove(outer, name, true).await.unwrap();
            let top = if x_won { b"y" } else { b"x" };
            a.remove(ROOT_INO, top, true).await.unwrap();
        }
        // A name moving back and forth on one agent: the other sees it
        // under exactly one of its names at every moment.
        let f = a.create(ROOT_INO, b"p", file(), 0o644, 0, 0).await.unwrap().gfi.ino;
        let mover = async {
            for i in 0..30 {
                let (from, to): (&[u8], &[u8]) = if i % 2 == 0 { (b"p", b"q") } else { (b"q", b"p") };
                a.rename(ROOT_INO, from, ROOT_INO, to, 0).await.unwrap();
            }
        };
        let watcher = async {
            for _ in 0..30 {
                let n = names(b.readdir(ROOT_INO).await.unwrap());
                let hits = n.iter().filter(|n| n[..] == b"p"[..] || n[..] == b"q"[..]).count();
                assert_eq!(hits, 1, "{n:?}");
            }
        };
        tokio::join!(mover, watcher);
        // An exchange swaps two names in one step; a replaced file is freed.
        let g = a.create(ROOT_INO, b"g", file(), 0o644, 0, 0).await.unwrap().gfi.ino;
        b.rename(ROOT_INO, b"g", ROOT_INO, b"p", libc::RENAME_EXCHANGE)
            .await
            .unwrap();
        assert_eq!(a.lookup(ROOT_INO, b"p").await.unwrap().gfi.ino, g);
        assert_eq!(a.lookup(ROOT_INO, b"g").await.unwrap().gfi.ino, f);
        assert_eq!(
            b.rename(ROOT_INO, b"g", ROOT_INO, b"p", libc::RENAME_NOREPLACE)
                .await
                .err(),
            Some(Errno::EEXIST)
        );
        assert_eq!(
            b.rename(ROOT_INO, b"g", ROOT_INO, b"p", 0).await.unwrap(),
            Freed(vec![g])
        );
        assert_eq!(a.getattr(g).await.err(), Some(Errno::ENOENT));
    });
}

#[test]
fn orphans_outlive_their_agent_and_go_with_its_lease() {
    let etcd = TestEtcd::start().unwrap();
    let rt = runtime();
    let (f, g) = rt.block_on(async {
        let a = agent(&etcd, 1).await;
        let b = agent(&etcd, 2).await;
        let f = a.create(ROOT_INO, b"f", file(), 0o644, 0, 0).await.unwrap().gfi.ino;
        let g = a.create(ROOT_INO, b"g", file(), 0o644, 0, 0).await.unwrap().gfi.ino;
        a.open_file(f).await.unwrap();
        a.open_file(g).await.unwrap();
        // Removed at another agent while open at `a`: kept, with no name.
        assert_eq!(b.remove(ROOT_INO, b"f", false).await.unwrap(), Freed(vec![]));
        b.create(ROOT_INO, b"h", file(), 0o644, 0, 0).await.unwrap();
        assert_eq!(
            b.rename(ROOT_INO, b"h", ROOT_INO, b"g", 0).await.unwrap(),
            Freed(vec![])
        );
        assert_eq!(b.getattr(f).await.unwrap().attr.nlink, 0);
        assert_eq!(b.link(f, ROOT_INO, b"back").await.err(), Some(Errno::ENOENT));
        b.extend(f, 10, Some((1, 0))).await.unwrap();
        // Not freed while `a` holds it, nor by `b`'s sweep.
        assert!(!a.reap(f, || true).await.unwrap());
        assert!(!b.reap(f, || false).await.unwrap());
        // `a`'s last opener of g closes: g goes.
        assert!(a.reap(g, || false).await.unwrap());
        assert_eq!(b.getattr(g).await.err(), Some(Errno::ENOENT));
        assert_eq!(a.open_file(g).await.err(), Some(Errno::ENOENT), "a freed file opened");
        // Created open: marked by the creating transaction, after the
        // opener's record.
        let mut recorded = None;
        let c = a
            .create_open(new(b"c"), |ino| {
                recorded = Some(ino);
                Ok(())
            })
            .await
            .unwrap()
            .gfi
            .ino;
        assert_eq!(recorded, Some(c));
        assert_eq!(b.remove(ROOT_INO, b"c", false).await.unwrap(), Freed(vec![]));
        assert!(a.reap(c, || false).await.unwrap(), "the orphan goes at its last close");
        let taken = a.create_open(new(b"g"), |_| Ok(())).await;
        assert_eq!(taken.err(), Some(Errno::EEXIST));
        // A named file's last close takes its mark: a removal then frees it.
        let k = a.create(ROOT_INO, b"k", file(), 0o644, 0, 0).await.unwrap().gfi.ino;
        a.open_file(k).await.unwrap();
        assert!(!a.reap(k, || false).await.unwrap());
        assert_eq!(b.remove(ROOT_INO, b"k", false).await.unwrap(), Freed(vec![k]));
        (f, g)
        // `a` stops here without closing f (a crash: its lease runs on).
    });
    rt.block_on(async {
        let a2 = agent(&etcd, 1).await;
        assert_eq!(a2.orphans().await.unwrap(), vec![f], "orphans survive a restart");
        assert_eq!(a2.getattr(f).await.unwrap().attr.size, 10);
        // The dead agent's mark goes with its etcd lease (two TTLs, 4 s, at most
        // a few more while etcd notices): then any agent's sweep frees f.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !a2.reap(f, || false).await.unwrap() {
            assert!(Instant::now() < deadline, "the orphan of a dead agent was never freed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(a2.getattr(f).await.err(), Some(Errno::ENOENT));
        assert_eq!(a2.getattr(g).await.err(), Some(Errno::ENOENT));
        assert!(a2.orphans().await.unwrap().is_empty());
    });
}

/// The fixture itself: a real etcd that serves, and is gone (process and
/// data) once dropped.
#[test]
fn a_test_etcd_serves_and_goes_away() {
    let etcd = TestEtcd::start().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect(etcd.endpoints(), None).await.unwrap();
        c.put("k", "v", None).await.unwrap();
        let got = c.get("k", None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"v");
    });
    let port: u16 = etcd.endpoint().rsplit(':').next().unwrap().parse().unwrap();
    let dir = etcd.dir().to_path_buf();
    drop(etcd);
    assert!(!etcd::healthy(port));
    assert!(!dir.exists());
}

/// How many requests of gRPC method `method` (`Txn`, `Range`) etcd has
/// answered, from its `/metrics`.
fn etcd_requests(etcd: &TestEtcd, method: &str) -> u64 {
    use std::io::{Read, Write};
    let url = etcd.endpoint();
    let host = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    let label = format!("grpc_method=\"{method}\"");
    body.lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn a_create_after_its_lookup_is_one_transaction_and_never_undoes_a_change_made_meanwhile() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let a = agent(&etcd, 1).await;
        let b = agent(&etcd, 2).await;
        let d = a
            .create(ROOT_INO, b"d", NewKind::Dir, 0o755, 0, 0)
            .await
            .unwrap()
            .gfi
            .ino;
        let new = |name: &'static [u8]| Creation { parent: d, ..new(name) };
        // What the kernel does: a lookup that misses, then the create.
        for name in [&b"f0"[..], b"f1", b"f2"] {
            assert_eq!(a.lookup(d, name).await.err(), Some(Errno::ENOENT));
            let before = etcd_requests(&etcd, "Txn") + etcd_requests(&etcd, "Range");
            a.create_new(new(name)).await.unwrap();
            let used = etcd_requests(&etcd, "Txn") + etcd_requests(&etcd, "Range") - before;
            assert_eq!(
                used,
                1,
                "{}: etcd requests of one create",
                String::from_utf8_lossy(name)
            );
        }
        // The directory changed at another agent after a's lookup: a's
        // create still lands, and keeps b's change.
        assert_eq!(a.lookup(d, b"g").await.err(), Some(Errno::ENOENT));
        let chmod = AttrChange {
            mode: Some(0o700),
            ..AttrChange::default()
        };
        b.setattr(d, &chmod).await.unwrap();
        b.create_new(new(b"h")).await.unwrap();
        a.create_new(new(b"g")).await.unwrap();
        assert_eq!(
            b.getattr(d).await.unwrap().attr.mode,
            libc::S_IFDIR | 0o700,
            "a's create undid b's chmod"
        );
        let listed = names(b.readdir(d).await.unwrap());
        for name in [&b"f0"[..], b"f1", b"f2", b"g", b"h"] {
            assert!(listed.iter().any(|n| n == name), "{listed:?}");
        }
        // ... or was removed: the create fails as on a fresh read.
        assert_eq!(a.lookup(ROOT_INO, b"e").await.err(), Some(Errno::ENOENT));
        let e = a
            .create(ROOT_INO, b"e", NewKind::Dir, 0o755, 0, 0)
            .await
            .unwrap()
            .gfi
            .ino;
        assert_eq!(a.lookup(e, b"x").await.err(), Some(Errno::ENOENT));
        b.remove(ROOT_INO, b"e", true).await.unwrap();
        let x = Creation { parent: e, ..new(b"x") };
        assert_eq!(a.create_new(x).await.err(), Some(Errno::ENOENT));
    });
}
