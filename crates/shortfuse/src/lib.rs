//! shortfuse: write a user-space file system once, against one trait, and
//! serve it over every transport (/dev/fuse, FUSE-over-io_uring, in-process
//! preload, shared-memory rings). [`cache`] puts a user-space page and
//! metadata cache in front of any file system (`-o cache=...`).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod backing;
pub mod cache;
pub mod control;
pub mod datamap;
pub mod dispatch;
pub mod errno;
pub mod filesystem;
pub mod mount;
pub mod node;
pub mod notify;
pub mod options;
pub mod session;
pub mod stats;
mod sys;
pub mod types;

pub use shortfuse_abi as abi;

pub use datamap::{BackingFile, DataMap, Extent, InvalidMap};
pub use dispatch::{Dispatcher, Negotiated, Outcome};
pub use errno::{Errno, Result};
pub use filesystem::{Filesystem, InitConfig};
pub use mount::{Mount, MountMethod};
pub use node::{read_slice, DirItem, Handle, Node, NodeFs, Open};
pub use notify::{Notification, Notifier, NotifySink, PollHandle, Retrieval, Retrieved};
pub use options::{MountOptions, Readdirplus};
pub use session::{serve, DevSession, SessionOptions};
pub use stats::{Stats, Transport};
pub use types::*;
