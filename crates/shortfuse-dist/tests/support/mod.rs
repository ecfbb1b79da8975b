//! Helpers shared by the tests that drive distfs clients without a kernel.

// Each test binary uses a part of them.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use shortfuse::{FileHandle, Filesystem, NewNode, NodeId, OpenFlags, Request, WriteArgs};
use shortfuse_dist::client::{ClientConfig, Consistency, DistFs};
use shortfuse_dist::server::{DistServer, ServerConfig};

pub const REQ: Request = Request {
    unique: 0,
    uid: 0,
    gid: 0,
    pid: 0,
};
pub const FH: FileHandle = FileHandle(0);

pub fn server(data: &Path, ttl: Duration) -> DistServer {
    let mut cfg = ServerConfig::new(data.to_path_buf(), "127.0.0.1:0".parse().unwrap());
    cfg.block_size = 4096;
    cfg.lease_ttl = ttl;
    DistServer::start(cfg).unwrap()
}

pub fn client(s: &DistServer) -> DistFs {
    client_at(&s.addr().to_string(), Consistency::Lease)
}

/// A `lease` client that never takes direct leases: for tests of how the
/// cache lives across lease moves, which direct leases would skip (clients
/// that take turns this fast would be found contended).
pub fn caching_client(s: &DistServer) -> DistFs {
    let mut cfg = ClientConfig::new(s.addr().to_string());
    cfg.direct_spell = Duration::ZERO;
    DistFs::connect(cfg).unwrap()
}

pub fn client_at(addr: &str, consistency: Consistency) -> DistFs {
    let mut cfg = ClientConfig::new(addr);
    cfg.consistency = consistency;
    DistFs::connect(cfg).unwrap()
}

pub fn create(fs: &DistFs, name: &str) -> NodeId {
    let new = NewNode {
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
    };
    fs.create(&REQ, NodeId::ROOT, OsStr::new(name), &new, OpenFlags::RDWR)
        .unwrap()
        .entry
        .node
}

pub fn lookup(fs: &DistFs, name: &str) -> NodeId {
    fs.lookup(&REQ, NodeId::ROOT, OsStr::new(name)).unwrap().node
}

pub fn write(fs: &DistFs, node: NodeId, offset: u64, data: &[u8]) {
    let args = WriteArgs {
        offset,
        ..WriteArgs::default()
    };
    assert_eq!(fs.write(&REQ, node, FH, data, &args).unwrap(), data.len());
}

pub fn read(fs: &DistFs, node: NodeId, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let n = fs.read(&REQ, node, FH, offset, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i * 7 % 251) as u8)).collect()
}

/// Until `cond` holds; fails the test after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
