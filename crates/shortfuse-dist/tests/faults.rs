//! Faults, without a kernel: a client that cannot reach the manager writes
//! through after the soft timeout; a manager restart keeps every lease; a
//! client behind a real network partition (a TCP proxy that stops
//! forwarding) stops trusting its lease on its own clock before the lease
//! goes to another client, and its cached writes never land over the new
//! holder's data.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shortfuse::{Errno, Filesystem, NodeId};
use shortfuse_dist::client::{Consistency, DistFs};
use shortfuse_dist::proto::LeaseMode;
use shortfuse_dist::server::{DistServer, ServerConfig};
use support::{client, client_at, create, lookup, read, server, wait_for, write, FH, REQ};

/// What storage holds now, seen by a fresh client without leases (it
/// neither waits for nor revokes anybody's lease).
fn stored(addr: &str, name: &str) -> Vec<u8> {
    let o = client_at(addr, Consistency::Weak);
    let n = lookup(&o, name);
    read(&o, n, 0, 1 << 16)
}

#[test]
fn cut_off_client_writes_through_after_the_soft_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(3));
    let addr = s.addr().to_string();
    let a = client(&s);
    let node = create(&a, "f");
    write(&a, node, 0, b"cached");
    assert!(!a.writes_through());
    assert_eq!(
        stored(&addr, "f"),
        b"",
        "a lease holder in touch with the manager writes back later"
    );

    // The manager stops hearing from A; A still holds its lease.
    a.cut_off();
    wait_for("soft timeout", Duration::from_secs(5), || a.writes_through());
    let valid_until = a.leases_valid_until().unwrap();
    write(&a, node, 6, b"+through");
    assert!(
        Instant::now() < valid_until,
        "too slow to tell: the lease ran out before the write"
    );
    // Everything dirty went with that write, under the lease still held.
    assert_eq!(stored(&addr, "f"), b"cached+through");

    // Past its clock A starts over with a new session and has lost nothing.
    wait_for("lease expiry", Duration::from_secs(5), || Instant::now() > valid_until);
    let n = lookup(&a, "f");
    assert_eq!(read(&a, n, 0, 100), b"cached+through");
    a.flush(&REQ, node, FH, 0).unwrap();
}

#[test]
fn a_lease_that_lapsed_on_the_clients_clock_keeps_its_dirty_cache() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(2));
    let addr = s.addr().to_string();
    let a = client(&s);
    let node = create(&a, "f");
    write(&a, node, 0, b"cached");
    // Renewals go on, unconfirmed (an agent refusing them while etcd is
    // slow): the session lives, A's clock runs out.
    a.ignore_heartbeats();
    let valid_until = a.leases_valid_until().unwrap();
    wait_for("lease lapse", Duration::from_secs(10), || Instant::now() > valid_until);
    // A refused renewal is a missed one: A's next I/O renews and finds
    // its lease and its cache, dirty blocks too.
    assert_eq!(read(&a, node, 0, 100), b"cached");
    assert!(a.leases_valid_until().unwrap() > valid_until);
    assert_eq!(stored(&addr, "f"), b"", "written back, not kept");
    a.fsync(&REQ, node, FH, false).unwrap();
    assert_eq!(stored(&addr, "f"), b"cached");
}

#[test]
fn manager_restart_keeps_leases_and_dirty_caches() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(3));
    let addr = s.addr();
    let a = client(&s);
    let node = create(&a, "f");
    write(&a, node, 0, b"only in A's cache");
    let gfi = a.gfi(node).unwrap();
    let holder = a.client_id().unwrap();
    drop(s);

    let mut cfg = ServerConfig::new(dir.path().to_path_buf(), addr);
    cfg.block_size = 4096;
    cfg.lease_ttl = Duration::from_secs(3);
    let s = DistServer::start(cfg).unwrap();
    assert_eq!(
        s.holders(gfi).unwrap(),
        (Some(LeaseMode::Write), [holder].into()),
        "the restarted manager forgot the write lease"
    );
    // B's read revokes A's lease; A reconnects by itself, resumes its
    // session, writes back and releases: B sees what A had cached.
    let b = client(&s);
    let nb = lookup(&b, "f");
    assert_eq!(read(&b, nb, 0, 100), b"only in A's cache");
    assert_eq!(a.client_id(), Some(holder), "A's session was not resumed");
    a.fsync(&REQ, node, FH, false).unwrap();
    // And new ids do not repeat old ones (fencing stays exact).
    assert!(b.client_id().unwrap().0 > holder.0);
}

/// A TCP proxy whose traffic can be held up both ways, as a network
/// partition does (the connections stay open; bytes wait in the queues),
/// or whose connections can be severed on the client's side only.
struct Partition {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    live: Arc<Mutex<Vec<Proxied>>>,
    /// The server's ends of severed connections, left open.
    lingering: Mutex<Vec<TcpStream>>,
}

/// One proxied connection: the client's end, the server's end, and
/// whether it was severed.
type Proxied = (TcpStream, TcpStream, Arc<AtomicBool>);

impl Partition {
    fn new(upstream: SocketAddr) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Mutex::new(Vec::new()));
        let (c, l) = (cut.clone(), live.clone());
        std::thread::spawn(move || {
            for down in listener.incoming() {
                let Ok(down) = down else { return };
                let Ok(up) = TcpStream::connect(upstream) else { return };
                let severed = Arc::new(AtomicBool::new(false));
                let clone = |s: &TcpStream| s.try_clone().unwrap();
                l.lock().unwrap().push((clone(&down), clone(&up), severed.clone()));
                for (from, to) in [(clone(&down), clone(&up)), (up, down)] {
                    let (c, severed) = (c.clone(), severed.clone());
                    std::thread::spawn(move || pump(from, to, &c, &severed));
                }
            }
        });
        Partition {
            addr,
            cut,
            live,
            lingering: Mutex::new(Vec::new()),
        }
    }

    /// Ends the client's side of every connection made so far, with what
    /// they held in flight, and lets new ones through. The server's side
    /// stays open, as a half-open socket does until it is noticed.
    fn sever(&self) {
        for (down, up, severed) in self.live.lock().unwrap().drain(..) {
            severed.store(true, Ordering::Release);
            let _ = down.shutdown(std::net::Shutdown::Both);
            self.lingering.lock().unwrap().push(up);
        }
        self.cut.store(false, Ordering::Release);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool, severed: &AtomicBool) {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        while cut.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                while cut.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if severed.load(Ordering::Acquire) || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    if !severed.load(Ordering::Acquire) {
        let _ = to.shutdown(std::net::Shutdown::Both);
    }
}

/// A server, a writer `a` reaching it through a partition (not yet cut)
/// with "A synced" fsync'd to file "f" and "A cached" written over it but
/// held under its lease, and a second client `b` on the server directly.
fn writer_behind_a_partition(dir: &std::path::Path, ttl: Duration) -> (DistServer, Partition, DistFs, DistFs, NodeId) {
    let s = server(dir, ttl);
    let p = Partition::new(s.addr());
    let a: DistFs = client_at(&p.addr.to_string(), Consistency::Lease);
    let b = client(&s);
    let node = create(&a, "f");
    write(&a, node, 0, b"A synced");
    a.fsync(&REQ, node, FH, false).unwrap();
    write(&a, node, 0, b"A cached");
    (s, p, a, b, node)
}

#[test]
fn partitioned_writer_cannot_write_over_the_next_holder() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(1500);
    let (_s, p, a, b, node) = writer_behind_a_partition(dir.path(), ttl);

    p.cut.store(true, Ordering::Release);
    let cut_at = Instant::now();
    // B's write revokes A's lease; A hears nothing, so the manager waits
    // for A's session to run out.
    let nb = lookup(&b, "f");
    write(&b, nb, 0, b"B");
    let granted_by = Instant::now();
    assert!(
        granted_by - cut_at >= ttl / 2,
        "granted too early: {:?}",
        granted_by - cut_at
    );
    // A's own clock gave up the lease no later than the manager did.
    let a_until = a.leases_valid_until().unwrap();
    assert!(a_until <= granted_by, "A still trusted its lease when B got it");
    b.fsync(&REQ, nb, FH, false).unwrap();

    // The partition heals: A's write-back is fenced off and reported.
    p.cut.store(false, Ordering::Release);
    assert!(a.fsync(&REQ, node, FH, false).is_err(), "A's stale data was accepted");
    assert_eq!(read(&b, nb, 0, 100), b"B synced");
    let na = lookup(&a, "f");
    assert_eq!(na, NodeId(node.0));
    assert_eq!(read(&a, na, 0, 100), b"B synced");
}

#[test]
fn a_writer_that_reconnected_in_a_new_session_reports_its_lost_writes_at_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(1500);
    let (_s, p, a, b, node) = writer_behind_a_partition(dir.path(), ttl);
    let first = a.client_id().unwrap();

    // Cut off, A loses its session and its lease to B.
    p.cut.store(true, Ordering::Release);
    let nb = lookup(&b, "f");
    write(&b, nb, 0, b"B");
    b.fsync(&REQ, nb, FH, false).unwrap();
    // The partition heals with A's connection gone: A reconnects, too
    // late to resume, in a new session, before it fsyncs.
    p.sever();
    let deadline = Instant::now() + Duration::from_secs(60);
    while a.client_id().is_none_or(|c| c == first) {
        assert!(Instant::now() < deadline, "A never reconnected");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        a.fsync(&REQ, node, FH, false),
        Err(Errno::EIO),
        "A's cached write was lost and fsync did not say so"
    );
    assert_eq!(read(&b, nb, 0, 100), b"B synced");
}

#[test]
fn open_files_outlive_their_names_across_a_manager_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_secs(3);
    let s = server(dir.path(), ttl);
    let addr = s.addr();
    let (a, b) = (client(&s), client(&s));
    // Both held open by A (created so); "orphan" loses its name before
    // the restart, "named" after it.
    let orphan = create(&a, "orphan");
    let named = create(&a, "named");
    write(&a, orphan, 0, b"orphaned");
    write(&a, named, 0, b"named");
    a.fsync(&REQ, orphan, FH, false).unwrap();
    a.fsync(&REQ, named, FH, false).unwrap();
    b.unlink(&REQ, NodeId::ROOT, std::ffi::OsStr::new("orphan")).unwrap();
    drop(b);
    drop(s);

    let mut cfg = ServerConfig::new(dir.path().to_path_buf(), addr);
    cfg.block_size = 4096;
    cfg.lease_ttl = ttl;
    let s = DistServer::start(cfg).unwrap();
    // A reconnects (resuming its session) on its next request and tells
    // its open files again.
    assert_eq!(
        read(&a, orphan, 0, 100),
        b"orphaned",
        "the restart reaped an open orphan"
    );
    let b = client(&s);
    b.unlink(&REQ, NodeId::ROOT, std::ffi::OsStr::new("named")).unwrap();
    assert_eq!(read(&a, named, 0, 100), b"named", "an open file went with its name");
    let args = shortfuse::ReleaseArgs::default();
    a.release(&REQ, orphan, FH, &args).unwrap();
    a.release(&REQ, named, FH, &args).unwrap();
    let node_dir = |n: NodeId| {
        let g = a.gfi(n).unwrap();
        dir.path()
            .join("blocks")
            .join(g.node.to_string())
            .join(g.ino.to_string())
    };
    wait_for("orphans reaped at their last close", Duration::from_secs(10), || {
        !node_dir(orphan).join("0").exists() && !node_dir(named).join("0").exists()
    });
}

#[test]
fn a_lookup_in_flight_on_a_connection_that_dies_is_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(3));
    let p = Partition::new(s.addr());
    let a: DistFs = client_at(&p.addr.to_string(), Consistency::Lease);
    let node = create(&a, "f");
    write(&a, node, 0, b"kept");
    let session = a.client_id().unwrap();

    // The lookup goes out and its answer is held; then the connection
    // ends under it (as when a heartbeat finds the session expired).
    p.cut.store(true, Ordering::Release);
    let asked = std::thread::scope(|sc| {
        let asking = sc.spawn(|| a.lookup(&REQ, NodeId::ROOT, std::ffi::OsStr::new("f")));
        std::thread::sleep(Duration::from_millis(200));
        assert!(!asking.is_finished(), "the lookup was answered through the cut");
        p.sever();
        asking.join().unwrap()
    });
    assert_eq!(asked.expect("a lookup failed with its connection").node, node);
    // The server never saw the connection end, so the session was resumed:
    // the write lease and its cache are A's still.
    assert_eq!(a.client_id(), Some(session));
    assert_eq!(read(&a, node, 0, 100), b"kept");
    a.fsync(&REQ, node, FH, false).unwrap();
    assert_eq!(stored(&s.addr().to_string(), "f"), b"kept");
}
