//! The consistency checker on three distfs clients (each its own
//! connection and lease session) of one embedded server, for each mode:
//! `lease` (which goes direct on the contended files) and `writethrough`
//! pass, and so does `lease` kept from going direct (its caching leases
//! move all the time); `weak` is caught serving stale data.

mod support;

use std::io;
use std::time::Duration;

use shortfuse::{Filesystem, NodeId, WriteArgs};
use shortfuse_dist::check::{self, Kind, Register, Seen, Workload};
use shortfuse_dist::client::{ClientConfig, Consistency, DistFs};
use shortfuse_dist::server::DistServer;
use support::{create, lookup, server, FH, REQ};

struct Client {
    fs: DistFs,
    nodes: Vec<NodeId>,
}

impl Register for Client {
    fn write(&self, file: usize, data: &[u8]) -> io::Result<()> {
        let args = WriteArgs::default();
        let n = self.fs.write(&REQ, self.nodes[file], FH, data, &args)?;
        if n != data.len() {
            return Err(io::Error::other(format!("short write: {n} of {}", data.len())));
        }
        Ok(())
    }

    fn read(&self, file: usize, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.fs.read(&REQ, self.nodes[file], FH, 0, buf)?)
    }
}

/// How the clients of a run are set up.
#[derive(Clone, Copy)]
struct Setup {
    mode: Consistency,
    /// [`ClientConfig::direct_spell`]: zero keeps `lease` clients caching.
    direct_spell: Duration,
}

impl Setup {
    fn of(mode: Consistency) -> Setup {
        Setup {
            mode,
            direct_spell: ClientConfig::new("").direct_spell,
        }
    }
}

fn clients(s: &DistServer, setup: Setup, n: usize, files: usize) -> Vec<Client> {
    (0..n)
        .map(|k| {
            let mut cfg = ClientConfig::new(s.addr().to_string());
            cfg.consistency = setup.mode;
            cfg.direct_spell = setup.direct_spell;
            let fs = DistFs::connect(cfg).unwrap();
            let nodes = (0..files)
                .map(|i| {
                    let name = format!("f{i}");
                    if k == 0 {
                        create(&fs, &name)
                    } else {
                        lookup(&fs, &name)
                    }
                })
                .collect();
            Client { fs, nodes }
        })
        .collect()
}

/// One checker run; also returns the direct leases its clients were granted.
fn run(setup: Setup, seed: u64) -> (check::Outcome, u64) {
    let mode = setup.mode;
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), Duration::from_secs(10));
    let w = Workload {
        files: 2,
        ops: 150,
        read_percent: 50,
        // Two blocks and a bit: a value spans blocks, so a torn write
        // would show.
        size: 2 * 4096 + 64,
        seed,
    };
    let cs = clients(&s, setup, 3, w.files);
    let regs: Vec<&dyn Register> = cs.iter().map(|c| c as &dyn Register).collect();
    let o = check::run(&regs, &w).unwrap();
    let direct = cs.iter().map(|c| c.fs.direct_grants()).sum();
    eprintln!("{}: {} ({direct} direct leases)", mode.name(), o.summary());
    (o, direct)
}

/// Reads that saw another client's write: the clients really shared.
fn cross_reads(o: &check::Outcome) -> usize {
    o.ops
        .iter()
        .filter(|r| match r.kind {
            Kind::Read(Seen::Value(v)) if v != 0 => (v >> 32) as usize != r.client + 1,
            _ => false,
        })
        .count()
}

/// Runs `setup` until its clients really shared (enough reads saw another
/// client's write; on a loaded machine one run may be mostly serial), and,
/// when `direct`, went direct; at most three runs, none of which may break
/// consistency. Returns the direct leases granted.
fn assert_strong(setup: Setup, seed: u64, direct: bool) -> u64 {
    let (mut reads, mut cross, mut granted) = (0, 0, 0);
    for run_seed in [seed, seed + 10, seed + 20] {
        let (o, d) = run(setup, run_seed);
        assert!(o.violations.is_empty(), "{}", o.summary());
        reads += o.reads();
        cross += cross_reads(&o);
        granted += d;
        if reads > 100 && cross > 20 && (granted > 0 || !direct) {
            return granted;
        }
    }
    panic!(
        "{}: three runs shared too little: {reads} reads, {cross} of another client's writes, {granted} direct leases",
        setup.mode.name()
    );
}

#[test]
fn lease_is_strongly_consistent() {
    assert_strong(Setup::of(Consistency::Lease), 1, true);
}

#[test]
fn lease_without_direct_leases_is_strongly_consistent() {
    let setup = Setup {
        direct_spell: Duration::ZERO,
        ..Setup::of(Consistency::Lease)
    };
    let (o, direct) = run(setup, 7);
    assert!(o.violations.is_empty(), "{}", o.summary());
    assert_eq!(direct, 0);
}

#[test]
fn writethrough_is_strongly_consistent() {
    let direct = assert_strong(Setup::of(Consistency::WriteThrough), 2, false);
    assert_eq!(direct, 0, "writethrough went direct");
}

#[test]
fn weak_is_caught() {
    // Any violation is a proof; a run without one is possible in theory
    // (every read happening to follow a cache expiry), so up to three.
    let mut summaries = Vec::new();
    for seed in 3..6 {
        let (o, _) = run(Setup::of(Consistency::Weak), seed);
        if !o.violations.is_empty() {
            assert!(
                o.violations
                    .iter()
                    .any(|v| v.why.starts_with("stale") || v.why.starts_with("initial")),
                "{}",
                o.summary()
            );
            return;
        }
        summaries.push(o.summary());
    }
    panic!("weak was never caught: {summaries:#?}");
}
