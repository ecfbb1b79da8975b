//! The handshake over the daemon's Unix socket (SOCK_SEQPACKET, so each
//! message arrives whole): the client says hello, the daemon answers with
//! the geometry and passes the memfd of a region made for this client
//! alone, then sends a [`NamesMsg`] (with the backing directory of the
//! file system's namespace map, for a client it may have it), then an
//! [`EarlyMsg`] with its answers to the requests that came with the hello
//! (a new process's INIT and root GETATTR: one round trip for the whole
//! start instead of three, and none through queue workers that are only
//! being started). Afterwards
//! the socket carries only the client's [`AnchorMsg`]s, [`BackingMsg`]s and
//! [`NodeMsg`]s (and the daemon's answers to them); it stays open so that
//! each side sees the other go away (EOF), however it ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::region::{Geometry, MAGIC, VERSION};

#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Hello {
    pub magic: u64,
    pub version: u32,
    pub pid: u32,
}

#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Welcome {
    pub magic: u64,
    pub version: u32,
    pub queues: u32,
    pub slots: u32,
    pub slot_data: u32,
    pub records: u32,
    pub padding: u32,
    pub len: u64,
    /// How long a client spins for its reply before sleeping.
    pub spin_ns: u64,
}

/// Right after the [`Welcome`]: whether this client may serve path calls
/// itself beneath the file system's backing directory (see
/// `shortfuse::namespace`), passed with this message (SCM_RIGHTS) when
/// `granted`. Only a client of the daemon's own user gets it, and uses it
/// only while its calls are made as `uid`: anyone else could reach through
/// the descriptor what the daemon's permissions keep from them.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct NamesMsg {
    pub magic: u64,
    /// 1: the descriptor is passed; 0: path calls go to the daemon.
    pub granted: u32,
    /// 1: mount points below the directory are not part of the image.
    pub no_xdev: u32,
    /// The only fsuid the map serves.
    pub uid: u32,
    pub padding: u32,
}

/// `NamesMsg::magic`.
pub const NAMES_MAGIC: u64 = 0x5346_4e41_4d45_5331;

/// After the [`NamesMsg`]: the daemon's replies to the FUSE requests that
/// followed the client's [`Hello`] in its message, in their order, each
/// whole (its length in its header). A request the daemon did not serve
/// there gets no reply, and the client sends it over the rings. It may
/// carry the descriptor of the server's shared name table
/// (`name_table`), for the client to map read-only.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct EarlyMsg {
    pub magic: u64,
    pub count: u32,
    pub padding: u32,
}

/// The most bytes a hello with its requests, or an [`EarlyMsg`] with its
/// replies, may take.
pub const EARLY_ROOM: usize = 4096;

/// `EarlyMsg::magic`.
pub const EARLY_MAGIC: u64 = 0x5346_4541_524c_5931;

/// The FUSE messages (requests or replies) laid one after another in
/// `bytes`, each as long as the length its header gives; a truncated or
/// malformed tail ends the list.
pub fn fuse_messages(mut bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while bytes.len() >= 4 {
        let len = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        if len < 16 || len > bytes.len() {
            break;
        }
        out.push(&bytes[..len]);
        bytes = &bytes[len..];
    }
    out
}

/// After the handshake, the client's only message: "this open handle
/// now belongs to the open file description of the descriptor passed with
/// this message" (SCM_RIGHTS). The daemon watches that kernel file and
/// releases the handle when its last descriptor closes, in whatever process
/// (see `anchors`). Handles without one are the connection's and the
/// opening process's, released when either ends.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AnchorMsg {
    pub magic: u64,
    pub node: u64,
    pub fh: u64,
    /// 1 for a directory handle (RELEASEDIR), else 0.
    pub dir: u32,
    /// Non-zero: the daemon answers with an [`AnchorAck`] carrying it once
    /// it has taken this message and every earlier one (the client then
    /// knows that the handles no longer depend on its process).
    pub ack: u32,
}

/// The daemon's answer to an [`AnchorMsg`] that asked for one.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AnchorAck {
    pub magic: u64,
    pub ack: u32,
    pub padding: u32,
}

/// `AnchorMsg::magic` and `AnchorAck::magic`.
pub const ANCHOR_MAGIC: u64 = 0x5346_414e_4348_4f52;

/// `AnchorMsg::magic` of a claim: "this connection holds the open file
/// description of the descriptor passed with this message, which holds
/// handle `fh` on `node`" (a new image that inherited it at exec). The
/// daemon lets a client name a node that only a description holds (no
/// lookup of its own) when the client anchored or claimed that
/// description: with the descriptor, which the kernel vouches for, not
/// with the numbers alone, which any client could guess. Acknowledged as
/// an anchor is (`AnchorAck::magic` is [`ANCHOR_MAGIC`]).
pub const CLAIM_MAGIC: u64 = 0x5346_434c_4149_4d53;

/// The client's other message: "give me the backing file of open handle
/// `fh` on `node`", for a shared memory map of it. The daemon answers with
/// a [`BackingReply`] carrying the same `cookie`, with the descriptor
/// (SCM_RIGHTS) when `errno` is 0. The handle must be this connection's, or
/// belong to the open file description whose memfd comes with the message
/// (a description anchored by another process of the program).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct BackingMsg {
    pub magic: u64,
    pub node: u64,
    pub fh: u64,
    pub cookie: u32,
    pub padding: u32,
}

/// The daemon's answer to a [`BackingMsg`].
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct BackingReply {
    pub magic: u64,
    pub cookie: u32,
    /// 0 with a descriptor, else why there is none (ENODEV: the file has
    /// no single backing file; EPERM: the handle is not the asker's).
    pub errno: u32,
}

/// `BackingMsg::magic` and `BackingReply::magic`.
pub const BACKING_MAGIC: u64 = 0x5346_4241_434b_494e;

/// The client's third message: "give me the kernel node standing for
/// FIFO or device node `node`", which the program opens itself (the kernel
/// never sends a FUSE daemon the open of a FIFO or a device, see the
/// shim's `calls::special`). The daemon answers with a [`NodeReply`]
/// carrying the same `cookie`, with an O_PATH descriptor of the node
/// (SCM_RIGHTS) when `errno` is 0. `node` must be one the client may name
/// (one it looked up); the daemon makes the node in a directory of its
/// own, of the mount node's type and device number and, for a daemon
/// running as root (the one that serves other users), of its owner, group
/// and mode: reopening the descriptor, the kernel checks the caller's
/// credentials on those, as it would on the mount's node.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct NodeMsg {
    pub magic: u64,
    pub node: u64,
    pub cookie: u32,
    pub padding: u32,
}

/// The daemon's answer to a [`NodeMsg`]: laid out as a [`BackingReply`];
/// `errno` 0 with a descriptor, else why there is none (ESTALE: a node the
/// client was not given; EINVAL: not a FIFO or device node).
pub type NodeReply = BackingReply;

/// `NodeMsg::magic` and `NodeReply::magic`.
pub const NODE_MAGIC: u64 = 0x5346_4b4e_4f44_4553;

/// The client's fourth message: "give me a kernel object to watch for
/// node `node`" (inotify on a file system without a source directory). The
/// daemon keeps, for each node asked for, a mirror in its nodes directory:
/// a directory holding one empty entry per name of the node's (or an empty
/// file for a file), on which it replays every change made to the node
/// through the rings or the daemon's kernel mount (a creation creates the
/// name, a write truncates it, a chmod or utimes touches it, a rename
/// renames it...), so the kernel's own inotify produces the events, with
/// its masks, cookies, queue and descriptor semantics. The answer is a
/// [`NodeReply`] (magic [`WATCH_MAGIC`]) with an O_PATH descriptor of the
/// mirror. `parent` and the `len` name bytes that follow say where the
/// node is (0 and none for the root), so that its removal removes the
/// mirror (IN_DELETE_SELF, IN_IGNORED).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct WatchMsg {
    pub magic: u64,
    pub node: u64,
    pub parent: u64,
    pub cookie: u32,
    pub len: u32,
}

/// `WatchMsg::magic` and the magic of its [`NodeReply`].
pub const WATCH_MAGIC: u64 = 0x5346_5741_5443_4853;

/// Follows the [`Welcome`] when the file system mirrors a host directory
/// (passthrough): the directory, as the daemon names it, and its device and
/// inode. A client that finds that same directory at that path (same mount
/// namespace, a directory it may reach) uses it as the kernel's view of the
/// mount where a kernel path is needed: watches (inotify), sockets bound in
/// the mount, programs and libraries the dynamic loader opens.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SourceDir {
    pub magic: u64,
    pub dev: u64,
    pub ino: u64,
    /// Bytes of path that follow.
    pub len: u32,
    pub padding: u32,
}

/// `SourceDir::magic`.
pub const SOURCE_MAGIC: u64 = 0x5346_534f_5552_4345;

/// The source directory a [`Welcome`] message carries after it, if any:
/// (path, device, inode), unchecked.
pub fn decode_source(msg: &[u8]) -> Option<(&[u8], u64, u64)> {
    let rest = msg.get(std::mem::size_of::<Welcome>()..)?;
    let (s, path) = SourceDir::read_from_prefix(rest).ok()?;
    if s.magic != SOURCE_MAGIC {
        return None;
    }
    let path = path.get(..s.len as usize)?;
    (path.first() == Some(&b'/') && !path.contains(&0)).then_some((path, s.dev, s.ino))
}

impl Hello {
    pub fn new(pid: u32) -> Hello {
        Hello {
            magic: MAGIC,
            version: VERSION,
            pid,
        }
    }
}

impl Welcome {
    pub fn new(g: &Geometry, spin: Duration) -> Welcome {
        Welcome {
            magic: MAGIC,
            version: VERSION,
            queues: g.queues,
            slots: g.slots,
            slot_data: g.slot_data,
            records: g.records,
            padding: 0,
            len: g.bytes() as u64,
            spin_ns: u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    pub fn geometry(&self) -> Geometry {
        Geometry {
            queues: self.queues,
            slots: self.slots,
            slot_data: self.slot_data,
            records: self.records,
        }
    }
}

/// The ring socket of the daemon serving `mountpoint` (absolute,
/// normalised): beside the mount's control socket, with `.ring` for
/// `.sock`, so a program finds its daemon from the mount point alone.
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    shortfuse::control::socket_path(mountpoint).with_extension("ring")
}

/// Where a client looks for the daemon serving `mountpoint`: its own
/// user's daemon ([`socket_path`]), then root's (which serves other users
/// with `-o allow_other`, as a kernel mount does).
pub fn socket_paths(mountpoint: &Path) -> Vec<PathBuf> {
    let own = socket_path(mountpoint);
    let root = shortfuse::control::socket_path_in(Path::new(shortfuse::control::ROOT_SOCKET_DIR), mountpoint)
        .with_extension("ring");
    if root == own {
        vec![own]
    } else {
        vec![own, root]
    }
}

/// The name of the directory where the daemon listening on ring socket
/// `socket` makes the kernel nodes that stand for its FIFOs and device
/// nodes (see [`NodeMsg`]): the socket's name and inode, so that a daemon
/// started again on the mount gets a directory of its own. The daemon
/// removes it, beside its socket, when it stops.
pub(crate) fn nodes_dir_name(socket: &Path) -> std::io::Result<std::ffi::OsString> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(socket)?.ino();
    let mut name = socket.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".nodes-{ino:x}"));
    Ok(name)
}
