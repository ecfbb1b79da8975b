//! Leases on etcd: two agents' lease managers ([`EtcdLeases`]) on one real
//! etcd, as two `shortfuse dist up --etcd` agents would have them.

#[path = "support/etcd.rs"]
mod etcd;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd::{runtime, TestEtcd};
use shortfuse::Errno;
use shortfuse_dist::lease::etcd::EtcdLeases;
use shortfuse_dist::proto::{ClientId, Gfi, LeaseMode, ServerMsg};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::task::JoinHandle;

const F: Gfi = Gfi { node: 1, ino: 5 };
const G: Gfi = Gfi { node: 1, ino: 6 };
/// Longest wait for anything that should happen (a grant after an etcd
/// lease expiry, say): far beyond the TTLs below, so only a hang fails.
const BOUND: Duration = Duration::from_secs(60);

async fn manager(endpoints: &[String], ttl: Duration) -> Arc<EtcdLeases> {
    EtcdLeases::connect(endpoints, "/test/lease/", ttl).await.unwrap()
}

/// Two agents' managers on `etcd`, their clients given `ttl`.
async fn two_agents(etcd: &TestEtcd, ttl: Duration) -> (Arc<EtcdLeases>, Arc<EtcdLeases>) {
    (
        manager(&etcd.endpoints(), ttl).await,
        manager(&etcd.endpoints(), ttl).await,
    )
}

async fn session(m: &EtcdLeases) -> (ClientId, UnboundedReceiver<ServerMsg>) {
    let (tx, rx) = unbounded_channel();
    (m.open_session(tx).await.unwrap(), rx)
}

async fn next_revoke(rx: &mut UnboundedReceiver<ServerMsg>) -> ServerMsg {
    tokio::time::timeout(BOUND, rx.recv()).await.unwrap().unwrap()
}

/// What the server does for a manager every half second.
fn sweeper(m: &Arc<EtcdLeases>) -> JoinHandle<()> {
    let m = m.clone();
    tokio::spawn(async move {
        loop {
            m.sweep().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// A client that keeps renewing its session, as its heartbeat thread does.
fn renewer(m: &Arc<EtcdLeases>, c: ClientId) -> JoinHandle<()> {
    let m = m.clone();
    tokio::spawn(async move {
        loop {
            let _ = m.renew(c).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[test]
fn a_conflicting_acquire_revokes_the_holder_of_another_agent() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let (m1, m2) = two_agents(&etcd, Duration::from_secs(30)).await;
        let (a, mut ra) = session(&m1).await;
        let (b, mut rb) = session(&m2).await;
        let (c, mut rc) = session(&m2).await;

        // Readers share across agents.
        let la = m1.acquire(a, F, LeaseMode::Read).await.unwrap();
        let lb = m2.acquire(b, F, LeaseMode::Read).await.unwrap();
        assert_ne!(la, lb);
        assert_eq!(m1.holders(F).await.unwrap(), (Some(LeaseMode::Read), [a, b].into()));
        // Asking again for what one holds: the same lease.
        assert_eq!(m1.acquire(a, F, LeaseMode::Read).await.unwrap(), la);

        // C (on m2) wants to write: A (on m1) and B (on m2) are revoked.
        let m = m2.clone();
        let writer = tokio::spawn(async move { m.acquire(c, F, LeaseMode::Write).await });
        assert_eq!(next_revoke(&mut ra).await, ServerMsg::Revoke { gfi: F, lease: la });
        assert_eq!(next_revoke(&mut rb).await, ServerMsg::Revoke { gfi: F, lease: lb });
        m2.release(b, F, lb).await;
        // A's flush is still running when it releases: its key stays
        // until that I/O is done, and C waits.
        let io = m1.begin_io(a, F, la, false).await.unwrap();
        m1.release(a, F, la).await;
        assert_eq!(m1.begin_io(a, F, la, false).await.err(), Some(Errno::ESTALE));
        assert_eq!(m2.holders(F).await.unwrap().1, [a].into());
        assert!(!writer.is_finished());
        // A stale release changes nothing.
        m2.release(b, F, lb + 1000).await;
        drop(io);
        let lc = tokio::time::timeout(BOUND, writer).await.unwrap().unwrap().unwrap();
        assert!(lc > la && lc > lb, "lease ids are etcd revisions: {la} {lb} {lc}");
        assert_eq!(m1.holders(F).await.unwrap(), (Some(LeaseMode::Write), [c].into()));

        // Fencing: the old readers' leases allow no I/O, the writer's does.
        assert_eq!(m2.begin_io(b, F, lb, false).await.err(), Some(Errno::ESTALE));
        drop(m2.begin_io(c, F, lc, true).await.unwrap());

        // A reader on m1 revokes the writer on m2.
        let m = m1.clone();
        let reader = tokio::spawn(async move { m.acquire(a, F, LeaseMode::Read).await });
        assert_eq!(next_revoke(&mut rc).await, ServerMsg::Revoke { gfi: F, lease: lc });
        m2.release(c, F, lc).await;
        let la2 = tokio::time::timeout(BOUND, reader).await.unwrap().unwrap().unwrap();
        assert!(la2 > lc);

        // A connection that closes ends its session: its leases go at once.
        let m = m2.clone();
        let writer = tokio::spawn(async move { m.acquire(b, F, LeaseMode::Write).await });
        assert_eq!(next_revoke(&mut ra).await, ServerMsg::Revoke { gfi: F, lease: la2 });
        m1.end_session(a).await;
        tokio::time::timeout(BOUND, writer).await.unwrap().unwrap().unwrap();
        assert_eq!(m1.renew(a).await, Err(Errno::ESTALE));
        assert_eq!(m1.acquire(a, G, LeaseMode::Read).await, Err(Errno::ESTALE));

        // Open files are each agent's (across agents, the metadata
        // service's open marks): the last close or session end here closes.
        let (d, _rd) = session(&m2).await;
        m2.open_file(b, G).unwrap();
        m2.open_file(d, G).unwrap();
        assert!(!m1.is_open(G));
        assert!(!m2.close_file(d, G));
        assert!(m2.is_open(G));
        m2.end_session(b).await;
        assert!(!m2.is_open(G));
        assert_eq!(m2.take_closed(), vec![G]);
        assert!(!m2.close_file(b, G), "closed twice");
        assert_eq!(m2.open_file(b, G), Err(Errno::ESTALE));
    });
}

#[test]
fn direct_holders_share_on_one_agent_and_conflict_across_agents() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let (m1, m2) = two_agents(&etcd, Duration::from_secs(30)).await;
        let (a, mut ra) = session(&m1).await;
        let (b, mut rb) = session(&m1).await;
        let (c, mut rc) = session(&m2).await;
        let (d, _rd) = session(&m2).await;

        // Clients of one agent share a direct lease, and write under it.
        let la = m1.acquire(a, F, LeaseMode::Direct).await.unwrap();
        let lb = m1.acquire(b, F, LeaseMode::Direct).await.unwrap();
        assert_eq!(m2.holders(F).await.unwrap(), (Some(LeaseMode::Direct), [a, b].into()));
        drop(m1.begin_io(a, F, la, true).await.unwrap());
        drop(m1.begin_io(b, F, lb, false).await.unwrap());

        // A direct request from another agent conflicts: that agent's
        // direct writes are not serialized with these.
        let m = m2.clone();
        let other = tokio::spawn(async move { m.acquire(c, F, LeaseMode::Direct).await });
        assert_eq!(next_revoke(&mut ra).await, ServerMsg::Revoke { gfi: F, lease: la });
        assert_eq!(next_revoke(&mut rb).await, ServerMsg::Revoke { gfi: F, lease: lb });
        m1.release(a, F, la).await;
        m1.release(b, F, lb).await;
        let lc = tokio::time::timeout(BOUND, other).await.unwrap().unwrap().unwrap();
        assert_eq!(m1.holders(F).await.unwrap(), (Some(LeaseMode::Direct), [c].into()));
        assert_eq!(m1.begin_io(a, F, la, false).await.err(), Some(Errno::ESTALE));

        // A writer revokes the direct holder; while it waits, no direct
        // request joins the one it waits for.
        let m = m1.clone();
        let writer = tokio::spawn(async move { m.acquire(a, F, LeaseMode::Write).await });
        assert_eq!(next_revoke(&mut rc).await, ServerMsg::Revoke { gfi: F, lease: lc });
        let m = m2.clone();
        let joiner = tokio::spawn(async move { m.acquire(d, F, LeaseMode::Direct).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!joiner.is_finished(), "joined a direct lease past a waiting writer");
        m2.release(c, F, lc).await;
        let lw = tokio::time::timeout(BOUND, writer).await.unwrap().unwrap().unwrap();
        assert_eq!(m2.holders(F).await.unwrap(), (Some(LeaseMode::Write), [a].into()));
        // Then the direct request revokes the writer in its turn.
        assert_eq!(next_revoke(&mut ra).await, ServerMsg::Revoke { gfi: F, lease: lw });
        m1.release(a, F, lw).await;
        tokio::time::timeout(BOUND, joiner).await.unwrap().unwrap().unwrap();
        assert_eq!(m1.holders(F).await.unwrap(), (Some(LeaseMode::Direct), [d].into()));
    });
}

#[test]
fn direct_requests_of_two_agents_waiting_together_go_in_order_of_arrival() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let (m1, m2) = two_agents(&etcd, Duration::from_secs(30)).await;
        let (a, mut ra) = session(&m1).await;
        let (b, mut rb) = session(&m1).await;
        let (c, _rc) = session(&m2).await;
        let la = m1.acquire(a, F, LeaseMode::Write).await.unwrap();
        // B, then C (direct holders of two agents conflict) wait for A;
        // each request holds back the other's while it is the older one,
        // so neither may wait for the other for ever.
        let m = m1.clone();
        let first = tokio::spawn(async move { m.acquire(b, F, LeaseMode::Direct).await });
        assert_eq!(next_revoke(&mut ra).await, ServerMsg::Revoke { gfi: F, lease: la });
        let m = m2.clone();
        let second = tokio::spawn(async move { m.acquire(c, F, LeaseMode::Direct).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        m1.release(a, F, la).await;
        // B asked first: granted first (C never gives a lease back here).
        let lb = tokio::time::timeout(BOUND, first).await.unwrap().unwrap().unwrap();
        assert_eq!(next_revoke(&mut rb).await, ServerMsg::Revoke { gfi: F, lease: lb });
        assert!(!second.is_finished(), "granted beside another agent's direct holder");
        m1.release(b, F, lb).await;
        tokio::time::timeout(BOUND, second).await.unwrap().unwrap().unwrap();
        assert_eq!(m1.holders(F).await.unwrap(), (Some(LeaseMode::Direct), [c].into()));
    });
}

#[test]
fn a_holder_granted_after_a_request_is_revoked_too() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let (m1, m2) = two_agents(&etcd, Duration::from_secs(30)).await;
        let (a, mut ra) = session(&m1).await;
        let (b, _rb) = session(&m2).await;
        let (c, mut rc) = session(&m1).await;
        let la = m1.acquire(a, F, LeaseMode::Read).await.unwrap();
        let m = m2.clone();
        let writer = tokio::spawn(async move { m.acquire(b, F, LeaseMode::Write).await });
        assert_eq!(next_revoke(&mut ra).await, ServerMsg::Revoke { gfi: F, lease: la });
        // A reader joins after the writer asked (readers share, so it is
        // granted), then A goes: the writer must ask again, for C.
        let lc = m1.acquire(c, F, LeaseMode::Read).await.unwrap();
        m1.release(a, F, la).await;
        assert_eq!(next_revoke(&mut rc).await, ServerMsg::Revoke { gfi: F, lease: lc });
        m1.release(c, F, lc).await;
        let lb = tokio::time::timeout(BOUND, writer).await.unwrap().unwrap().unwrap();
        assert!(lb > lc);
        assert_eq!(m1.holders(F).await.unwrap(), (Some(LeaseMode::Write), [b].into()));
    });
}

#[test]
fn a_request_that_arrives_before_the_grant_it_conflicts_with_is_recorded_still_revokes_it() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let (m1, m2) = two_agents(&etcd, Duration::from_secs(30)).await;
        let (a, mut ra) = session(&m1).await;
        let (b, _rb) = session(&m2).await;
        let lg = m1.acquire(a, G, LeaseMode::Write).await.unwrap();
        // A's grant on F is in etcd (the other agent sees it) but not yet
        // recorded by its agent, as on a busy agent.
        m1.pause_grants(true);
        let m = m1.clone();
        let granting = tokio::spawn(async move { m.acquire(a, F, LeaseMode::Write).await });
        let deadline = Instant::now() + BOUND;
        while m2.holders(F).await.unwrap() != (Some(LeaseMode::Write), [a].into()) {
            assert!(Instant::now() < deadline, "the grant never reached etcd");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // B asks for F; once its request is in etcd, for G too.
        let m = m2.clone();
        let writer_f = tokio::spawn(async move { m.acquire(b, F, LeaseMode::Write).await });
        let mut kv = etcd_client::Client::connect(etcd.endpoints(), None).await.unwrap();
        let requests = etcd_client::GetOptions::new().with_prefix().with_count_only();
        while kv.get("/test/lease/r/", Some(requests.clone())).await.unwrap().count() == 0 {
            assert!(Instant::now() < deadline, "the request for F never reached etcd");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let m = m2.clone();
        let writer_g = tokio::spawn(async move { m.acquire(b, G, LeaseMode::Write).await });
        // The watch brings events in order: A revoked for G means its
        // agent has seen the request for F, while it held no F lease.
        assert_eq!(next_revoke(&mut ra).await, ServerMsg::Revoke { gfi: G, lease: lg });
        m1.pause_grants(false);
        let lf = tokio::time::timeout(BOUND, granting).await.unwrap().unwrap().unwrap();
        // Recorded, the grant is revoked for the request that came first.
        assert_eq!(next_revoke(&mut ra).await, ServerMsg::Revoke { gfi: F, lease: lf });
        m1.release(a, F, lf).await;
        m1.release(a, G, lg).await;
        for w in [writer_f, writer_g] {
            tokio::time::timeout(BOUND, w).await.unwrap().unwrap().unwrap();
        }
        assert_eq!(m2.holders(F).await.unwrap(), (Some(LeaseMode::Write), [b].into()));
    });
}

#[test]
fn a_client_that_stops_renewing_loses_its_leases_after_the_ttl() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let ttl = Duration::from_secs(1);
        let (m1, m2) = two_agents(&etcd, ttl).await;
        let _sweep = sweeper(&m1);
        // A neither renews nor answers its revocation; B renews.
        let (a, _ra) = session(&m1).await;
        let (b, _rb) = session(&m2).await;
        let _keep = renewer(&m2, b);
        let la = m1.acquire(a, F, LeaseMode::Write).await.unwrap();
        let t = Instant::now();
        let lb = tokio::time::timeout(BOUND, m2.acquire(b, F, LeaseMode::Write))
            .await
            .unwrap()
            .unwrap();
        assert!(t.elapsed() >= ttl / 2, "granted after {:?}", t.elapsed());
        assert_eq!(m1.renew(a).await, Err(Errno::ESTALE));
        assert_eq!(m1.begin_io(a, F, la, true).await.err(), Some(Errno::ESTALE));
        drop(m2.begin_io(b, F, lb, true).await.unwrap());
    });
}

#[test]
fn the_sessions_of_a_dead_agent_expire_with_their_etcd_lease() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let ttl = Duration::from_secs(1);
        let (m1, m2) = two_agents(&etcd, ttl).await;
        let (a, _ra) = session(&m1).await;
        let (b, _rb) = session(&m2).await;
        let _keep = renewer(&m2, b);
        m1.acquire(a, F, LeaseMode::Write).await.unwrap();
        // The agent dies: nobody ends A's session, nobody keeps it alive.
        m1.freeze();
        drop(m1);
        let t = Instant::now();
        tokio::time::timeout(BOUND, m2.acquire(b, F, LeaseMode::Write))
            .await
            .unwrap()
            .unwrap();
        assert!(t.elapsed() >= ttl, "granted after {:?}", t.elapsed());
    });
}

#[test]
fn a_restarted_agent_keeps_the_leases() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let ttl = Duration::from_secs(10);
        let (m1, m2) = two_agents(&etcd, ttl).await;
        let (a, _ra) = session(&m1).await;
        let (c, _rc) = session(&m1).await;
        let (b, mut rb) = session(&m2).await;
        let la = m1.acquire(a, F, LeaseMode::Write).await.unwrap();
        let lc = m1.acquire(c, G, LeaseMode::Read).await.unwrap();
        m1.freeze();
        drop(m1);
        // While the agent is away, B asks for G: C's revocation waits.
        let m = m2.clone();
        let writer = tokio::spawn(async move { m.acquire(b, G, LeaseMode::Write).await });

        let m1 = manager(&etcd.endpoints(), ttl).await;
        // The clients come back: same sessions, same leases.
        let (tx, mut ra) = unbounded_channel();
        assert_eq!(m1.resume(a, tx).await.unwrap(), a);
        let (tx, mut rc) = unbounded_channel();
        assert_eq!(m1.resume(c, tx).await.unwrap(), c);
        m1.resend_revocations(a);
        m1.resend_revocations(c);
        assert_eq!(next_revoke(&mut rc).await, ServerMsg::Revoke { gfi: G, lease: lc });
        assert!(m1.begin_io(a, F, la, true).await.is_ok());
        assert!(!writer.is_finished());
        m1.release(c, G, lc).await;
        tokio::time::timeout(BOUND, writer).await.unwrap().unwrap().unwrap();

        // A's write lease is still A's: B's read revokes it through the
        // new agent.
        let m = m2.clone();
        let reader = tokio::spawn(async move { m.acquire(b, F, LeaseMode::Read).await });
        assert_eq!(next_revoke(&mut ra).await, ServerMsg::Revoke { gfi: F, lease: la });
        m1.release(a, F, la).await;
        tokio::time::timeout(BOUND, reader).await.unwrap().unwrap().unwrap();
        // B's lease on G was never touched by the restart.
        assert!(rb.try_recv().is_err());
        // A session that is gone is not resumed: a new one starts.
        m1.end_session(a).await;
        let (tx, _rx) = unbounded_channel();
        assert_ne!(m2.resume(a, tx).await.unwrap(), a);
    });
}

#[test]
fn a_stalled_etcd_delays_renewals_but_ends_no_session() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        // Renewals are refused once the etcd lease (two TTLs) has less
        // than a TTL left: the stall is thawed right then, with seconds to
        // spare before etcd could expire the session.
        let ttl = Duration::from_secs(5);
        let m1 = manager(&etcd.endpoints(), ttl).await;
        let (a, _ra) = session(&m1).await;
        let la = m1.acquire(a, F, LeaseMode::Write).await.unwrap();
        m1.renew(a).await.unwrap();
        etcd.freeze().unwrap();
        // Once its etcd lease may not outlive another TTL, renewals are
        // refused (a missed renewal: the session stays)...
        let stalled = Instant::now();
        let refused = loop {
            match m1.renew(a).await {
                Ok(()) => assert!(stalled.elapsed() < BOUND, "renewals confirmed with etcd stopped"),
                Err(e) => break e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(refused, Errno::ETIMEDOUT);
        // ...while I/O under its leases goes on (the etcd lease lives).
        drop(m1.begin_io(a, F, la, true).await.unwrap());
        etcd.thaw().unwrap();
        // etcd answers again: so are renewals, and the lease is intact.
        tokio::time::timeout(BOUND, async {
            while m1.renew(a).await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(m1.holders(F).await.unwrap(), (Some(LeaseMode::Write), [a].into()));
        drop(m1.begin_io(a, F, la, true).await.unwrap());
    });
}

/// A TCP relay to etcd that can be cut like a network partition: after
/// [`Relay::cut`], nothing more passes either way, and new connections are
/// taken but never answered.
struct Relay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Relay {
    async fn start(target: &str) -> Relay {
        let target: SocketAddr = target.trim_start_matches("http://").parse().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((inbound, _)) = listener.accept().await {
                if flag.load(Ordering::Acquire) {
                    held.push(inbound);
                    continue;
                }
                let flag = flag.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut ri, mut wi) = inbound.into_split();
                    let (mut ro, mut wo) = outbound.into_split();
                    let pass = |flag: Arc<AtomicBool>| async move {
                        while !flag.load(Ordering::Acquire) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    };
                    tokio::select! {
                        _ = tokio::io::copy(&mut ri, &mut wo) => {}
                        _ = tokio::io::copy(&mut ro, &mut wi) => {}
                        _ = pass(flag) => {
                            // Partitioned: hold both ends, pass nothing.
                            std::future::pending::<()>().await;
                        }
                    }
                });
            }
        });
        Relay { addr, cut, task }
    }

    fn endpoint(&self) -> Vec<String> {
        vec![format!("http://{}", self.addr)]
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::Release);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[test]
fn an_agent_cut_off_from_etcd_stops_confirming_renewals_before_the_ttl() {
    let etcd = TestEtcd::start().unwrap();
    runtime().block_on(async {
        let ttl = Duration::from_secs(2);
        let relay = Relay::start(etcd.endpoint()).await;
        let m1 = manager(&relay.endpoint(), ttl).await;
        let m2 = manager(&etcd.endpoints(), ttl).await;
        let (a, _ra) = session(&m1).await;
        let (b, _rb) = session(&m2).await;
        let _keep = renewer(&m2, b);
        let la = m1.acquire(a, F, LeaseMode::Write).await.unwrap();
        // A renews as its client does, and trusts its lease for one TTL
        // from when it sent the last renewal that was confirmed.
        let confirmed = Arc::new(std::sync::Mutex::new(Instant::now()));
        let refused = Arc::new(AtomicBool::new(false));
        let renewals = {
            let (m, confirmed, refused) = (m1.clone(), confirmed.clone(), refused.clone());
            tokio::spawn(async move {
                loop {
                    let sent = Instant::now();
                    match m.renew(a).await {
                        Ok(()) => *confirmed.lock().unwrap() = sent,
                        Err(_) => refused.store(true, Ordering::Release),
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        // Renewals are confirmed while etcd is there.
        tokio::time::sleep(ttl).await;
        assert!(!refused.load(Ordering::Acquire));
        relay.cut();
        // B's request is seen by nobody on m1: A's lease goes only when
        // its etcd lease expires.
        let lb = tokio::time::timeout(BOUND, m2.acquire(b, F, LeaseMode::Write))
            .await
            .unwrap()
            .unwrap();
        let granted = Instant::now();
        renewals.abort();
        let last = *confirmed.lock().unwrap();
        assert!(refused.load(Ordering::Acquire), "renewals were never refused");
        assert!(
            last + ttl <= granted,
            "A's client trusted its lease until {:?} after B got it",
            (last + ttl) - granted
        );
        // Nor does m1 let A's client write under it any more.
        assert_eq!(m1.begin_io(a, F, la, true).await.err(), Some(Errno::ESTALE));
        drop(m2.begin_io(b, F, lb, true).await.unwrap());
    });
}
