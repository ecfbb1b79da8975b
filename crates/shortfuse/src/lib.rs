//! shortfuse: write a user-space file system once, against one trait, and
//! serve it over every transport (/dev/fuse, FUSE-over-io_uring, in-process
//! preload, shared-memory rings). [`cache`] puts a user-space page and
//! metadata cache in front of any file system (`-o cache=...`).
//!
//! Two ways to write one:
//! - the [`Filesystem`] trait, inode-based like libfuse's low-level API:
//!   the file system hands out node ids and counts the kernel's lookups
//!   (`examples/hello.rs` in the repository is a complete one);
//! - the node layer ([`node`]): implement [`Node`] for each kind of object,
//!   a directory's `lookup` returns the child, and [`NodeFs`] keeps node
//!   ids, lookup counts, FORGET, open handles and listing offsets
//!   (`examples/hello_nodes.rs`, `tarview.rs`, `procstats.rs`).
//!
//! A complete read-only file system with one file, on the node layer:
//!
//! ```no_run
//! use std::ffi::OsStr;
//! use std::sync::Arc;
//!
//! use shortfuse::{read_slice, serve, Attr, DirItem, Errno, FileType, MountOptions, Node, NodeFs, Request, SessionOptions};
//!
//! const TEXT: &[u8] = b"hello\n";
//!
//! struct Root(Arc<Hello>);
//! struct Hello;
//!
//! impl Node for Root {
//!     fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
//!         Ok(Attr::new(FileType::Directory, 0o755))
//!     }
//!     fn lookup(&self, _req: &Request, name: &OsStr) -> shortfuse::Result<Arc<dyn Node>> {
//!         if name == "hello" { Ok(self.0.clone()) } else { Err(Errno::ENOENT) }
//!     }
//!     fn readdir(&self, _req: &Request) -> shortfuse::Result<Vec<DirItem>> {
//!         Ok(vec![DirItem::new("hello", FileType::Regular)])
//!     }
//! }
//!
//! impl Node for Hello {
//!     fn getattr(&self, _req: &Request) -> shortfuse::Result<Attr> {
//!         Ok(Attr::new(FileType::Regular, 0o444).with_size(TEXT.len() as u64))
//!     }
//!     fn read(&self, _req: &Request, offset: u64, buf: &mut [u8]) -> shortfuse::Result<usize> {
//!         Ok(read_slice(TEXT, offset, buf))
//!     }
//! }
//!
//! fn main() -> std::io::Result<()> {
//!     let fs = NodeFs::new(Arc::new(Root(Arc::new(Hello))));
//!     let opts = MountOptions { ro: true, ..MountOptions::default() };
//!     // Serves until unmounted (umount, SIGINT or SIGTERM).
//!     serve(Arc::new(fs), "/mnt/hello".as_ref(), opts, SessionOptions::default())
//! }
//! ```
//!
//! Then `cat /mnt/hello/hello`. [`serve`] mounts over /dev/fuse; set
//! [`MountOptions::transport`] to [`Transport::Uring`] for
//! FUSE-over-io_uring, and [`MountOptions::threads`] for the number of
//! worker threads. [`DevSession`] splits mounting from serving. A file
//! system whose content changes behind the kernel's cache tells it through
//! the [`Notifier`] its `init` gets ([`notify`]).

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

mod backing;
pub mod cache;
// The CLI's daemons serve `shortfuse stats` and the log through it; no
// file system needs it.
#[doc(hidden)]
pub mod control;
pub mod datamap;
// The ring server and the VFS drive the dispatcher and encode replies
// with its encoder; an author meets only what the crate root re-exports.
#[doc(hidden)]
pub mod dispatch;
pub mod errno;
pub mod filesystem;
mod flags;
pub mod layer;
pub mod lookups;
pub mod mount;
pub mod namespace;
pub mod node;
pub mod notify;
pub mod options;
pub mod reply;
mod session;
pub mod stats;
pub mod sync;
mod sys;
mod types;

pub use shortfuse_abi as abi;

pub use datamap::{BackingFile, DataMap, Extent, InvalidMap};
pub use dispatch::{answered_ok, Dispatcher, MapTap, Negotiated, Observer, Outcome};
pub use errno::{Errno, Result};
pub use filesystem::{Filesystem, InitConfig};
pub use lookups::LookupCount;
pub use mount::{Mount, MountMethod};
pub use namespace::NamespaceMap;
pub use node::{read_slice, DirItem, Handle, Node, NodeFs, Open};
pub use notify::{Notification, Notifier, NotifySink, PollHandle, Retrieval, Retrieved};
pub use options::{MountOptions, Readdirplus};
pub use reply::{ReplyAttr, ReplyData, ReplyEntry, ReplySink, ReplyWrite};
pub use session::{serve, DevSession, SessionOptions};
pub use stats::{Stats, Transport};
pub use types::*;
