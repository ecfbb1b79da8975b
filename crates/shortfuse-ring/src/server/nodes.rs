//! The kernel nodes standing for the file system's FIFOs and device nodes
//! (see [`crate::proto::NodeMsg`]).
//!
//! The kernel never sends a FUSE daemon the open of a FIFO or a device: it
//! opens its own pipe or the driver. A program under the shim does the
//! same with a kernel node of the mount node's type and device number, so
//! that the programs of every `shortfuse run` on this daemon meet in one
//! FIFO. The daemon makes those nodes, one per mount node, in a directory
//! beside its ring socket that only its own user can enter or write (mode
//! 0700, in the runtime directory whose checks `shortfuse serve` passed),
//! and hands each client an O_PATH descriptor of the node it asks for,
//! which the client reopens through `/proc/self/fd` with its own flags.
//! Reopening checks the caller's credentials on the node itself, never
//! the path to it: so other users reach the nodes through the daemon (and
//! only those whose mount node they looked up, after the file system
//! checked their way there), while nobody can plant or swap anything in
//! the directory.
//!
//! For those checks to be the mount's, a daemon running as root (the only
//! one that serves other users, see `-o allow_other`) gives each node the
//! mount node's owner, group and mode. A daemon of another user serves
//! that user alone, who could open anything in its directory anyway: its
//! nodes are mode 0666 and the shim's check against the mount's node
//! decides.

use shortfuse::sync::Unpoison;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use shortfuse_abi as abi;
use zerocopy::{FromBytes, IntoBytes};

use crate::proto::{NodeMsg, NodeReply, NODE_MAGIC};
use crate::sys;

pub(super) struct Nodes {
    /// None when the socket's inode could not be read (no node is made).
    dir: Option<PathBuf>,
    /// Whether nodes take the mount node's owner, group and mode.
    mirror: bool,
    /// One client at a time makes or changes a node.
    making: Mutex<()>,
}

impl Nodes {
    /// The nodes of the daemon listening at `socket`; `root`: it runs as
    /// root (see the module doc).
    pub fn new(socket: &Path, root: bool) -> Nodes {
        let dir = crate::proto::nodes_dir_name(socket)
            .ok()
            .map(|name| socket.with_file_name(name));
        Nodes {
            dir,
            mirror: root,
            making: Mutex::new(()),
        }
    }

    /// The directory the nodes are made in.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Removes the directory and every node in it (the daemon stops).
    pub fn remove(&self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// Parses a client message as a [`NodeMsg`]; `None` when it is not one.
    pub fn parse(msg: &[u8]) -> Option<NodeMsg> {
        NodeMsg::read_from_prefix(msg)
            .ok()
            .map(|(m, _)| m)
            .filter(|m| m.magic == NODE_MAGIC)
    }

    /// Answers `m` on `sock` with `node`'s descriptor or errno.
    pub fn answer(sock: BorrowedFd<'_>, m: &NodeMsg, node: Result<OwnedFd, i32>) {
        let reply = NodeReply {
            magic: NODE_MAGIC,
            cookie: m.cookie,
            errno: node.as_ref().err().map_or(0, |&e| e as u32),
        };
        if let Err(e) = sys::send(sock, reply.as_bytes(), node.as_ref().ok().map(|f| f.as_fd())) {
            tracing::debug!("shortfuse ring: answering a node request: {e}");
        }
    }

    /// An O_PATH descriptor of the kernel node standing for mount node
    /// `node`, whose attributes are `attr`: made (or brought up to date)
    /// now.
    pub fn open(&self, node: u64, attr: &abi::fuse_attr) -> Result<OwnedFd, i32> {
        let kind = attr.mode & libc::S_IFMT;
        if ![libc::S_IFIFO, libc::S_IFCHR, libc::S_IFBLK].contains(&kind) {
            return Err(libc::EINVAL);
        }
        let dir = self.dir.as_ref().ok_or(libc::EIO)?;
        let code = |e: io::Error| e.raw_os_error().unwrap_or(libc::EIO);
        let _making = self.making.lock().unpoison();
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(code(e)),
            _ => {}
        }
        let path = dir.join(node.to_string());
        let rdev = u64::from(attr.rdev);
        let same = |m: &std::fs::Metadata| {
            let t = m.file_type();
            let k = if t.is_fifo() {
                libc::S_IFIFO
            } else if t.is_char_device() {
                libc::S_IFCHR
            } else if t.is_block_device() {
                libc::S_IFBLK
            } else {
                0
            };
            k == kind && (kind == libc::S_IFIFO || m.rdev() == rdev)
        };
        match std::fs::symlink_metadata(&path) {
            Ok(m) if same(&m) => {}
            found => {
                // A node of a removed file whose number came back with
                // another type: the clients that hold it keep theirs.
                if found.is_ok() {
                    std::fs::remove_file(&path).map_err(code)?;
                }
                sys::mknod(&path, kind | 0o600, rdev).map_err(code)?;
            }
        }
        // Owner first: chown clears the set-id bits that chmod then sets.
        let mode = if self.mirror {
            std::os::unix::fs::lchown(&path, Some(attr.uid), Some(attr.gid)).map_err(code)?;
            attr.mode & 0o7777
        } else {
            0o666
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(code)?;
        let f = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(code)?;
        Ok(f.into())
    }
}
