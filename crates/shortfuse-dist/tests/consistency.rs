//! The consistency checker on three distfs clients (each its own
//! connection and lease session) of one embedded server, for each mode:
//! `lease` and `writethrough` pass, `weak` is caught serving stale data.

use std::ffi::OsStr;
use std::io;
use std::time::Duration;

use shortfuse::{FileHandle, Filesystem, NewNode, NodeId, Request, WriteArgs};
use shortfuse_dist::check::{self, Kind, Register, Seen, Workload};
use shortfuse_dist::client::{ClientConfig, Consistency, DistFs};
use shortfuse_dist::server::{DistServer, ServerConfig};

const REQ: Request = Request {
    unique: 0,
    uid: 0,
    gid: 0,
    pid: 0,
};

struct Client {
    fs: DistFs,
    nodes: Vec<NodeId>,
}

impl Register for Client {
    fn write(&self, file: usize, data: &[u8]) -> io::Result<()> {
        let args = WriteArgs::default();
        let n = self.fs.write(&REQ, self.nodes[file], FileHandle(0), data, &args)?;
        if n != data.len() {
            return Err(io::Error::other(format!("short write: {n} of {}", data.len())));
        }
        Ok(())
    }

    fn read(&self, file: usize, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.fs.read(&REQ, self.nodes[file], FileHandle(0), 0, buf)?)
    }
}

fn clients(s: &DistServer, mode: Consistency, n: usize, files: usize) -> Vec<Client> {
    let new = NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
    };
    (0..n)
        .map(|k| {
            let mut cfg = ClientConfig::new(s.addr().to_string());
            cfg.consistency = mode;
            let fs = DistFs::connect(cfg).unwrap();
            let nodes = (0..files)
                .map(|i| {
                    let name = format!("f{i}");
                    if k == 0 {
                        fs.create(&REQ, NodeId::ROOT, OsStr::new(&name), &new, libc::O_RDWR)
                            .unwrap()
                            .entry
                            .node
                    } else {
                        fs.lookup(&REQ, NodeId::ROOT, OsStr::new(&name)).unwrap().node
                    }
                })
                .collect();
            Client { fs, nodes }
        })
        .collect()
}

fn run(mode: Consistency, seed: u64) -> check::Outcome {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::new(dir.path().to_path_buf(), "127.0.0.1:0".parse().unwrap());
    cfg.block_size = 8192;
    cfg.lease_ttl = Duration::from_secs(10);
    let s = DistServer::start(cfg).unwrap();
    let w = Workload {
        files: 2,
        ops: 150,
        read_percent: 50,
        // Two blocks and a bit: a value spans blocks, so a torn write
        // would show.
        size: 2 * 8192 + 64,
        seed,
    };
    let cs = clients(&s, mode, 3, w.files);
    let regs: Vec<&dyn Register> = cs.iter().map(|c| c as &dyn Register).collect();
    let o = check::run(&regs, &w).unwrap();
    eprintln!("{}: {}", mode.name(), o.summary());
    o
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

#[test]
fn lease_is_strongly_consistent() {
    let o = run(Consistency::Lease, 1);
    assert!(o.violations.is_empty(), "{}", o.summary());
    assert!(o.reads() > 100 && cross_reads(&o) > 20, "{}", o.summary());
}

#[test]
fn writethrough_is_strongly_consistent() {
    let o = run(Consistency::WriteThrough, 2);
    assert!(o.violations.is_empty(), "{}", o.summary());
    assert!(o.reads() > 100 && cross_reads(&o) > 20, "{}", o.summary());
}

#[test]
fn weak_is_caught() {
    // Any violation is a proof; a run without one is possible in theory
    // (every read happening to follow a cache expiry), so up to three.
    let mut summaries = Vec::new();
    for seed in 3..6 {
        let o = run(Consistency::Weak, seed);
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
