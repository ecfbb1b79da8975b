//! FSYNC and FSYNCDIR wait for the device; a transport that can answer
//! later (/dev/fuse, io_uring) gets `Deferred` for them at once and the
//! reply from a helper thread, so that one reader passes several programs'
//! fsyncs on to the device together instead of one after the other.

#[path = "dispatch_common.rs"]
mod common;

use std::sync::mpsc;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use common::*;
use shortfuse::abi;
use shortfuse::*;
use zerocopy::IntoBytes;

/// Programs syncing at once.
const CALLERS: usize = 4;

/// Each fsync waits until all [`CALLERS`] are in one (or gives up, so that
/// a dispatcher that serves them one by one fails instead of hanging).
#[derive(Default)]
struct Gate {
    inside: Mutex<usize>,
    all_in: Condvar,
}

impl Gate {
    fn enter(&self) -> Result<()> {
        let mut inside = self.inside.lock().unwrap();
        *inside += 1;
        self.all_in.notify_all();
        let (inside, _) = self
            .all_in
            .wait_timeout_while(inside, Duration::from_secs(10), |n| *n < CALLERS)
            .unwrap();
        if *inside < CALLERS {
            return Err(Errno::EIO);
        }
        Ok(())
    }
}

impl Filesystem for Gate {
    fn fsync(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        self.enter()
    }

    fn fsyncdir(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        self.enter()
    }
}

struct Channel(Mutex<mpsc::Sender<(u64, Vec<u8>)>>);

impl ReplySink for Channel {
    fn send(&self, unique: u64, reply: &[u8]) {
        let _ = self.0.lock().unwrap().send((unique, reply.to_vec()));
    }
}

#[test]
fn one_reader_has_every_waiting_fsync_in_the_file_system_at_once() {
    let d = Dispatcher::with_max_pages_limit(
        std::sync::Arc::new(Gate::default()),
        MountOptions::default(),
        std::sync::Arc::new(Stats::new()),
        256,
    );
    let mut buf = Vec::new();
    assert_eq!(
        d.handle(&init_msg(1, 45, KERNEL_FLAGS, 65536), &mut buf, Transport::Dev),
        Outcome::Reply
    );
    let (tx, rx) = mpsc::channel();
    let sink: std::sync::Arc<dyn ReplySink> = std::sync::Arc::new(Channel(Mutex::new(tx)));
    // One reader takes them in turn, as a /dev/fuse worker does.
    for i in 0..CALLERS as u64 {
        let opcode = if i % 2 == 0 {
            abi::FUSE_FSYNC
        } else {
            abi::FUSE_FSYNCDIR
        };
        let arg = abi::fuse_fsync_in {
            fh: i,
            fsync_flags: abi::FUSE_FSYNC_FDATASYNC,
            padding: 0,
        };
        let outcome = d.handle_with(
            &msg(opcode, 2 + i, 10 + i, arg.as_bytes()),
            &mut buf,
            Transport::Dev,
            Some(&sink),
        );
        assert_eq!(
            outcome,
            Outcome::Deferred,
            "request {i} was served by the reader itself"
        );
    }
    let mut answered: Vec<(u64, i32)> = (0..CALLERS)
        .map(|_| {
            let (unique, reply) = rx.recv_timeout(Duration::from_secs(30)).expect("every fsync answered");
            (unique, check_reply(&reply).error)
        })
        .collect();
    answered.sort();
    let want: Vec<(u64, i32)> = (0..CALLERS as u64).map(|i| (10 + i, 0)).collect();
    assert_eq!(answered, want, "all {CALLERS} were in an fsync together");
    d.finish();
}
