//! Bytes in, trait call, bytes out: decode one FUSE request, call the
//! `Filesystem`, encode the reply. The same code serves every transport.
//! OWNER: abi/dispatch helper.

use std::sync::Arc;

use crate::filesystem::Filesystem;
use crate::options::MountOptions;
use crate::stats::{Stats, Transport};

/// What the transport does after `handle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Write the reply buffer (fuse_out_header + payload) back.
    Reply,
    /// Nothing to send (FORGET, BATCH_FORGET, INTERRUPT, dropped request).
    NoReply,
    /// FUSE_DESTROY was served (reply in the buffer): the session ends.
    Destroy,
}

/// One connection's dispatcher, shared by all worker threads.
pub struct Dispatcher {
    fs: Arc<dyn Filesystem>,
    opts: MountOptions,
    stats: Arc<Stats>,
}

impl Dispatcher {
    pub fn new(fs: Arc<dyn Filesystem>, opts: MountOptions, stats: Arc<Stats>) -> Dispatcher {
        Dispatcher { fs, opts, stats }
    }

    /// Serves one request. `reply` is cleared and, for `Outcome::Reply` and
    /// `Outcome::Destroy`, holds the whole reply message.
    pub fn handle(&self, request: &[u8], reply: &mut Vec<u8>, transport: Transport) -> Outcome {
        let _ = (&self.fs, &self.opts, &self.stats, request, transport);
        reply.clear();
        Outcome::NoReply
    }
}
