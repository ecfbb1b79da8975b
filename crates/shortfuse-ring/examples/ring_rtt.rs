//! The ring's own round trip, without the shim: a `Server` over `NullFs`
//! in this process and one `RingClient`, timing empty GETATTRs of the root.
//!
//! `cargo run --release -p shortfuse-ring --example ring_rtt -- [CALLS] [SPIN_US] [QUEUES]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use shortfuse::{MountOptions, Stats};
use shortfuse_abi as abi;
use shortfuse_fs::null::NullFs;
use shortfuse_ring::{RingClient, Server, ServerConfig};
use zerocopy::IntoBytes;

fn request(opcode: u32, unique: u64, arg: &[u8]) -> Vec<u8> {
    let h = abi::fuse_in_header {
        len: (std::mem::size_of::<abi::fuse_in_header>() + arg.len()) as u32,
        opcode,
        unique,
        nodeid: 1,
        uid: 0,
        gid: 0,
        pid: 1,
        total_extlen: 0,
        padding: 0,
    };
    let mut r = h.as_bytes().to_vec();
    r.extend_from_slice(arg);
    r
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let calls: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let spin = Duration::from_micros(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20));
    let dir = std::env::temp_dir().join(format!("sf-ring-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join("ring.sock");
    let queues: Option<u32> = args.get(3).and_then(|s| s.parse().ok());
    let config = ServerConfig {
        queues: queues.unwrap_or_else(|| ServerConfig::default().queues),
        spin,
        client_spin: spin,
        ..ServerConfig::default()
    };
    let stats = Arc::new(Stats::new());
    let server =
        Server::start(&path, Arc::new(NullFs::new()), MountOptions::default(), stats, config).expect("ring server");
    let client = RingClient::connect(&path).expect("connect");
    let init = abi::fuse_init_in {
        major: abi::FUSE_KERNEL_VERSION,
        minor: abi::FUSE_KERNEL_MINOR_VERSION,
        max_readahead: 0,
        flags: 0,
        flags2: 0,
        unused: [0; 11],
    };
    let mut reply = Vec::new();
    client
        .call(&request(abi::FUSE_INIT, 1, init.as_bytes()), &mut reply)
        .expect("INIT");
    let getattr = request(abi::FUSE_GETATTR, 2, &[0; 16]);
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        client.call(&getattr, &mut reply).expect("GETATTR");
        times.push(t.elapsed().as_nanos() as u64);
    }
    times.sort_unstable();
    let mean = times.iter().sum::<u64>() as f64 / calls as f64;
    let pct = |p: f64| times[((calls as f64 * p) as usize).min(calls - 1)];
    println!(
        "{calls} empty GETATTRs over the ring (spin {} µs): mean {:.2} µs, p50 {:.2} µs, p99 {:.2} µs",
        spin.as_micros(),
        mean / 1000.0,
        pct(0.5) as f64 / 1000.0,
        pct(0.99) as f64 / 1000.0
    );
    drop(client);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
