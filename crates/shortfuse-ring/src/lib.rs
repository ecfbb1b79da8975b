//! shortfuse-ring: shared-memory request rings between programs running
//! under the preload shim and one shortfuse daemon (RFUSE, in user space).
//!
//! A client connects to the daemon's Unix socket ([`socket_path`], found
//! from the mount point alone) and receives a memfd: a region made for it
//! alone, holding one submission queue per CPU, request slots large enough
//! for `max_write`, and a notification ring. Requests and replies are FUSE
//! messages, so the daemon serves them with the same `Dispatcher` as the
//! /dev/fuse and io_uring sessions. Both sides poll a bounded time, then
//! sleep on a futex in the shared memory, the worker of a queue on another
//! CPU than the clients submitting there ([`wait`], with the measurements
//! behind the parameters: an empty round trip takes about 1.1 µs, a stat
//! of a missing name through the shim about 2 µs, 5 times less than over
//! /dev/fuse on the same loaded machine).
//!
//! - [`RingClient`]: the program's side (used by `shortfuse-vfs`'s ring
//!   backend inside the preload shim).
//! - [`Server`]: the daemon's side (`shortfuse serve`); [`Announcing`]
//!   wraps the file system of a kernel mount of the same daemon so that
//!   ring clients hear of the kernel's changes too.
//! - [`region`]: the layout of the shared memory.

#![deny(unsafe_code)]

mod anchors;
mod announce;
mod client;
pub mod foreign;
pub mod listings;
pub mod locks;
mod name_table;
mod proto;
pub mod region;
mod server;
mod sys;
mod told;
pub mod wait;

pub use anchors::DESCRIPTION_OWNER;
pub use announce::Announcing;
pub use client::{
    after_fork, decode_welcome, keep_descriptors_from, pid, Anchoring, Notice, RingClient, LIVENESS_PERIOD,
};
pub use locks::{Locks, POSIX_OWNER};
pub use proto::{socket_path, socket_paths};
pub use region::Geometry;
pub use server::{changes, Announcer, Server, ServerConfig, DEFAULT_SPIN_US};
/// The raw system call the preload shim shares with the rings (one copy of
/// the `syscall` instruction's wrapper); not for file-system authors.
#[doc(hidden)]
pub use sys::raw as raw_syscall;
pub use told::{decode_for as told_for, encode as encode_told, Told, TOLD_VAR};
