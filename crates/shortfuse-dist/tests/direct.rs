//! Direct leases: clients that take turns on a file go from caching leases
//! that move back and forth to shared direct leases (every read and write
//! at the server), stay consistent meanwhile, and a client alone on its
//! file keeps caching.

mod support;

use std::time::Duration;

use shortfuse::{Filesystem, NodeId, OpenFlags};
use shortfuse_dist::client::{ClientConfig, DistFs};
use shortfuse_dist::proto::{LeaseMode, MAX_DIRECT};
use shortfuse_dist::server::DistServer;
use support::{caching_client, create, lookup, pattern, read, server, write, FH, REQ};

/// Turns that two clients taking turns may need to find the file
/// contended: the first few moves may each take longer than the client's
/// contention window on a loaded machine.
const TURNS_MAX: usize = 200;

/// A `lease` client whose direct spells outlast the test, so that no
/// probe for a caching lease comes in the middle of it.
fn client(s: &DistServer) -> DistFs {
    let mut cfg = ClientConfig::new(s.addr().to_string());
    cfg.direct_spell = Duration::from_secs(60);
    DistFs::connect(cfg).unwrap()
}

/// Two clients of one server that took turns on file `f` until both held
/// direct leases (in `turns` turns).
struct Contended {
    dir: tempfile::TempDir,
    s: DistServer,
    a: DistFs,
    b: DistFs,
    na: NodeId,
    nb: NodeId,
    turns: usize,
}

fn contended() -> Contended {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let (a, b) = (client(&s), client(&s));
    let na = create(&a, "f");
    let nb = lookup(&b, "f");
    let turns = take_turns(&s, &a, na, &b, nb);
    Contended {
        dir,
        s,
        a,
        b,
        na,
        nb,
        turns,
    }
}

/// A and B write `f` in turns, each reading the other's last write first,
/// until both hold direct leases; returns the turns taken.
fn take_turns(s: &DistServer, a: &DistFs, na: NodeId, b: &DistFs, nb: NodeId) -> usize {
    let gfi = a.gfi(na).unwrap();
    let both: std::collections::HashSet<_> = [a.client_id().unwrap(), b.client_id().unwrap()].into();
    for turn in 0..TURNS_MAX {
        let (me, mine, other, theirs) = if turn % 2 == 0 { (a, na, b, nb) } else { (b, nb, a, na) };
        // Over two blocks, unaligned: a torn or stale read would show.
        let data = pattern(turn as u8, 5000);
        write(me, mine, 300, &data);
        assert_eq!(read(other, theirs, 300, 5000), data, "turn {turn}: stale read");
        assert_eq!(other.getattr(&REQ, theirs, None).unwrap().size, 5300);
        if s.holders(gfi).unwrap() == (Some(LeaseMode::Direct), both.clone()) {
            return turn;
        }
    }
    panic!("still not direct after {TURNS_MAX} turns: {:?}", s.holders(gfi));
}

#[test]
fn clients_taking_turns_go_direct_and_see_each_others_writes() {
    let Contended {
        dir: _dir,
        s,
        a,
        b,
        na,
        nb,
        turns,
    } = contended();
    eprintln!("direct after {turns} turns");
    assert!(a.direct_grants() > 0 && b.direct_grants() > 0);
    // Under direct leases every read sees the other's last write at once,
    // the size included, and nobody's lease moves.
    let gfi = a.gfi(na).unwrap();
    for turn in 0..20u8 {
        let (me, mine, other, theirs) = if turn % 2 == 0 {
            (&a, na, &b, nb)
        } else {
            (&b, nb, &a, na)
        };
        let data = pattern(100 + turn, 777);
        let at = 4096 - 100 + u64::from(turn) * 1000;
        write(me, mine, at, &data);
        assert_eq!(read(other, theirs, at, 777), data);
        assert_eq!(other.getattr(&REQ, theirs, None).unwrap().size, 5300.max(at + 777));
        assert_eq!(s.holders(gfi).unwrap().0, Some(LeaseMode::Direct));
    }
    // A read past the end is cut at the server's size.
    let size = a.getattr(&REQ, na, None).unwrap().size;
    assert_eq!(read(&b, nb, size - 10, 100).len(), 10);
    assert!(read(&b, nb, size + 10, 100).is_empty());
    // Reads and writes larger than one request carries take several.
    let big = pattern(9, MAX_DIRECT as usize + 5000);
    write(&a, na, 1, &big);
    assert_eq!(read(&b, nb, 1, big.len()), big);
    assert_eq!(s.holders(gfi).unwrap().0, Some(LeaseMode::Direct));
}

#[test]
fn a_client_alone_on_its_file_keeps_its_write_lease() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let a = client(&s);
    let node = create(&a, "f");
    let gfi = a.gfi(node).unwrap();
    for k in 0..100u64 {
        let data = pattern(k as u8, 1000);
        write(&a, node, k * 900, &data);
        assert_eq!(read(&a, node, k * 900, 1000), data);
    }
    assert_eq!(
        s.holders(gfi).unwrap(),
        (Some(LeaseMode::Write), [a.client_id().unwrap()].into())
    );
    assert_eq!(a.direct_grants(), 0, "direct without contention");
}

#[test]
fn direct_writers_of_one_block_lose_nothing_and_never_shrink_the_file() {
    let Contended {
        dir: _dir,
        s,
        a,
        b,
        na,
        nb,
        ..
    } = contended();
    let set = shortfuse::SetAttr {
        size: Some(0),
        ..shortfuse::SetAttr::default()
    };
    // Truncation is allowed under a direct lease.
    assert_eq!(a.setattr(&REQ, na, &set).unwrap().size, 0);
    assert_eq!(b.getattr(&REQ, nb, None).unwrap().size, 0);
    // Slots of 100 bytes, A the even ones and B the odd ones, at once:
    // several in each 4 KiB block, each write extending the file.
    const SLOT: u64 = 100;
    const SLOTS: u64 = 120;
    std::thread::scope(|sc| {
        for (fs, node, parity) in [(&a, na, 0), (&b, nb, 1)] {
            sc.spawn(move || {
                for k in (parity..SLOTS).step_by(2) {
                    write(fs, node, k * SLOT, &pattern(k as u8, SLOT as usize));
                    // What this client wrote is there: no other's write
                    // shrank the file below it.
                    let size = fs.getattr(&REQ, node, None).unwrap().size;
                    assert!(size >= (k + 1) * SLOT, "size {size} after writing slot {k}");
                }
            });
        }
    });
    let gfi = a.gfi(na).unwrap();
    assert_eq!(s.holders(gfi).unwrap().0, Some(LeaseMode::Direct));
    assert_eq!(a.getattr(&REQ, na, None).unwrap().size, SLOTS * SLOT);
    let all = read(&b, nb, 0, (SLOTS * SLOT) as usize);
    for k in 0..SLOTS {
        let at = (k * SLOT) as usize;
        assert_eq!(
            &all[at..at + SLOT as usize],
            &pattern(k as u8, SLOT as usize)[..],
            "slot {k}"
        );
    }
}

#[test]
fn a_writer_revokes_direct_holders_and_then_caches() {
    // B stays connected: a direct holder that C's request revokes.
    let Contended {
        dir: _dir,
        s,
        a,
        b: _b,
        na,
        ..
    } = contended();
    let gfi = a.gfi(na).unwrap();
    // C never saw the file contended: it asks for a write lease, the
    // direct holders give theirs back, and C caches its writes.
    let c = client(&s);
    let nc = lookup(&c, "f");
    let data = pattern(7, 3000);
    write(&c, nc, 1000, &data);
    write(&c, nc, 9000, &data);
    assert_eq!(
        s.holders(gfi).unwrap(),
        (Some(LeaseMode::Write), [c.client_id().unwrap()].into())
    );
    assert_eq!(c.direct_grants(), 0);
    assert_eq!(read(&c, nc, 9000, 3000), data);
    // A direct holder asks again and sees what C cached.
    assert_eq!(read(&a, na, 1000, 3000), data);
    assert_eq!(read(&a, na, 9000, 3000), data);
    assert_eq!(a.getattr(&REQ, na, None).unwrap().size, 12_000);
}

/// A and B append 60 records each, at once, with O_APPEND and a stale
/// offset (as the kernel passes with direct I/O): every record must land
/// once, whole, none over another.
fn appends_land_once(a: &DistFs, na: NodeId, b: &DistFs, nb: NodeId) {
    const LEN: usize = 50;
    const EACH: u8 = 60;
    let record = |client: u8, k: u8| [client, k].repeat(LEN / 2);
    let start = a.getattr(&REQ, na, None).unwrap().size;
    std::thread::scope(|sc| {
        for (fs, node, client) in [(a, na, 1u8), (b, nb, 2u8)] {
            sc.spawn(move || {
                let args = shortfuse::WriteArgs {
                    offset: 0,
                    flags: OpenFlags::APPEND,
                    ..shortfuse::WriteArgs::default()
                };
                for k in 0..EACH {
                    assert_eq!(fs.write(&REQ, node, FH, &record(client, k), &args).unwrap(), LEN);
                }
            });
        }
    });
    let total = 2 * usize::from(EACH) * LEN;
    assert_eq!(b.getattr(&REQ, nb, None).unwrap().size, start + total as u64);
    let all = read(a, na, start, total);
    let mut seen: Vec<(u8, u8)> = all
        .chunks(LEN)
        .map(|r| {
            assert_eq!(r, &record(r[0], r[1])[..], "a torn or overwritten record");
            (r[0], r[1])
        })
        .collect();
    seen.sort();
    let want: Vec<(u8, u8)> = [1u8, 2].iter().flat_map(|&c| (0..EACH).map(move |k| (c, k))).collect();
    assert_eq!(seen, want);
}

#[test]
fn appends_of_direct_holders_never_land_on_one_another() {
    let Contended {
        dir: _dir,
        s,
        a,
        b,
        na,
        nb,
        ..
    } = contended();
    appends_land_once(&a, na, &b, nb);
    assert_eq!(s.holders(a.gfi(na).unwrap()).unwrap().0, Some(LeaseMode::Direct));
}

#[test]
fn appends_under_moving_caching_leases_never_land_on_one_another() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let (a, b) = (caching_client(&s), caching_client(&s));
    let na = create(&a, "log");
    let nb = lookup(&b, "log");
    appends_land_once(&a, na, &b, nb);
    assert_eq!(a.direct_grants() + b.direct_grants(), 0);
}
