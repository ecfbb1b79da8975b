//! The wire protocol between clients and the server.
//!
//! One TCP connection per client carries length-prefixed frames: a
//! big-endian `u32` length, then a message encoded with bincode (serde).
//! bincode because the message enums below are then the whole schema (no
//! separate IDL to keep in step), encoding is a memcpy-like walk with no
//! field names or tags beyond enum indexes, and block data travels as raw
//! bytes; decoding is bounded by [`MAX_FRAME`] so a bad peer cannot make
//! either side allocate without limit. Both sides are this crate, so the
//! lack of schema evolution is no loss; a version number in [`Request::Hello`]
//! refuses mismatched peers.
//!
//! The client sends [`ClientMsg`] (a request with an id); the server sends
//! [`ServerMsg`]: a reply carrying the request's id, or a lease revocation,
//! which may arrive at any time. Requests are answered out of order: a lease
//! request may wait for other clients while later requests are served.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
/// Block data: serialized as one byte string (a copy), not as a sequence
/// of `u8` walked one element at a time.
pub use serde_bytes::ByteBuf;

/// Bumped on any change of the messages below.
pub const PROTOCOL_VERSION: u32 = 11;

/// Most blocks sent with a grant.
pub const MAX_GRANT_BLOCKS: u32 = 8;

/// Largest frame either side accepts (a batch of blocks plus headers).
pub const MAX_FRAME: u32 = 64 << 20;

/// Most bytes one [`Request::ReadDirect`] asks for or one
/// [`Request::WriteDirect`] carries: a larger read or write is several
/// (the kernel sends at most 1 MiB at a time; this keeps any caller's
/// requests well inside [`MAX_FRAME`]).
pub const MAX_DIRECT: u32 = 8 << 20;

/// Global file identifier (DistFUSE, 4.1.4): the storage node that holds
/// the file and the inode number there. Every client names the same file
/// with the same `Gfi`, whatever node id its kernel gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Gfi {
    pub node: u32,
    pub ino: u64,
}

/// When a client's cached blocks of a file were known valid: a point in
/// the server's record of data changes ([`crate::versions`]). `epoch`
/// names one run of one server; `seq` grows with every change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DataVersion {
    pub epoch: u64,
    pub seq: u64,
}

/// A client's session with the lease manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClientId(pub u64);

/// The lease id of unleased I/O (`weak` clients): the block service then
/// neither checks nor registers a lease. Granted leases start at 1.
pub const NO_LEASE: u64 = 0;

/// Which lease a client asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LeaseMode {
    /// Shared: any number of readers cache the file.
    Read,
    /// Exclusive: one writer caches reads and writes.
    Write,
    /// Shared, caching nothing: every read and write of its holders goes
    /// to the server as it happens ([`Request::ReadDirect`],
    /// [`Request::WriteDirect`]), which serializes them. What a client asks
    /// for when a caching lease would only move back and forth between
    /// clients (see [`crate::client`], "Contention"); it conflicts with the
    /// caching leases, whose holders trust their copies.
    Direct,
}

impl LeaseMode {
    /// Whether holders of `self` and `other` may hold leases on one file
    /// at once: readers share, direct holders share (nobody caches); every
    /// other pair conflicts. The one rule both lease managers apply.
    pub fn compatible(self, other: LeaseMode) -> bool {
        matches!(
            (self, other),
            (LeaseMode::Read, LeaseMode::Read) | (LeaseMode::Direct, LeaseMode::Direct)
        )
    }

    /// Whether a lease held in mode `self` serves I/O that asked for
    /// `wanted`: the exclusive write lease serves anything, the others
    /// only themselves.
    pub fn covers(self, wanted: LeaseMode) -> bool {
        self == wanted || self == LeaseMode::Write
    }

    /// Whether data may be written under this lease.
    pub fn writes(self) -> bool {
        matches!(self, LeaseMode::Write | LeaseMode::Direct)
    }
}

/// Attributes as the metadata service keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeAttr {
    pub size: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    /// Type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
}

/// An inode as clients see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub gfi: Gfi,
    pub attr: NodeAttr,
}

/// A time to set (`utimensat`'s `UTIME_NOW` is resolved by the server).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireTime {
    Now,
    At(i64, u32),
}

/// The changes of a `setattr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AttrChange {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<WireTime>,
    pub mtime: Option<WireTime>,
}

/// What a new name points at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NewKind {
    /// Regular file, device, fifo or socket: the type is in `mode`.
    Node {
        rdev: u32,
    },
    Dir,
    Symlink {
        target: Vec<u8>,
    },
}

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntryInfo {
    pub name: Vec<u8>,
    pub ino: u64,
    /// `S_IF*` bits.
    pub kind: u32,
}

/// Requests a client makes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First message on a connection: opens a lease session, or takes
    /// back session `resume` (a reconnect after the connection or the
    /// server went away) with every lease it still holds.
    Hello {
        version: u32,
        name: String,
        resume: Option<ClientId>,
    },
    /// Renews the session (and so every lease it holds).
    Heartbeat,
    Lookup {
        parent: u64,
        name: Vec<u8>,
    },
    GetAttr {
        ino: u64,
    },
    /// A size change needs the caller's write lease (`lease`).
    SetAttr {
        ino: u64,
        change: AttrChange,
        lease: Option<u64>,
    },
    Create {
        parent: u64,
        name: Vec<u8>,
        kind: NewKind,
        mode: u32,
        uid: u32,
        gid: u32,
        /// Holds the new file open too (see [`Request::Open`]).
        open: bool,
    },
    Unlink {
        parent: u64,
        name: Vec<u8>,
    },
    Rmdir {
        parent: u64,
        name: Vec<u8>,
    },
    Rename {
        parent: u64,
        name: Vec<u8>,
        new_parent: u64,
        new_name: Vec<u8>,
        flags: u32,
    },
    Link {
        ino: u64,
        new_parent: u64,
        new_name: Vec<u8>,
    },
    Readlink {
        ino: u64,
    },
    ReadDir {
        ino: u64,
    },
    Statfs,
    /// This client holds `ino` open (sent at its first open here): a file
    /// open somewhere outlives its last name until [`Request::Close`].
    Open {
        ino: u64,
    },
    /// This client's last open of `ino` was closed.
    Close {
        ino: u64,
    },
    /// Algorithm 2's GrantLease: answered once the lease is granted, after
    /// conflicting holders were revoked (or expired).
    /// `release`: this client's read lease, given back first (an
    /// upgrade, Algorithm 1's release-then-acquire in one round trip).
    Acquire {
        gfi: Gfi,
        mode: LeaseMode,
        release: Option<u64>,
        /// Blocks `(first, count)` to send with the grant: the I/O that
        /// asked for the lease needs them (one round trip less per lease
        /// that moved). At most [`MAX_GRANT_BLOCKS`].
        fetch: Option<(u64, u32)>,
        /// Which of the `fetch` blocks this client has cached (bit `k` for
        /// block `first + k`): those are sent only if they changed.
        have: u32,
        /// The version this client's cached blocks of the file are valid
        /// as of (from its last grant or write-back): the grant lists the
        /// blocks changed since, the rest of the cache stays valid.
        since: Option<DataVersion>,
    },
    /// Gives lease `lease` back (after a revocation, or voluntarily).
    Release {
        gfi: Gfi,
        lease: u64,
    },
    /// Reads `count` blocks from `first`, under lease `lease`.
    ReadBlocks {
        gfi: Gfi,
        lease: u64,
        first: u64,
        count: u32,
    },
    /// Writes blocks (each at most one block long), then makes the file at
    /// least `min_size` long, under write lease `lease`. A write never
    /// shrinks a file (truncation is [`Request::SetAttr`]): a size from a
    /// stale view cannot undo another client's extension. `mtime` is set
    /// when blocks were written or the size grew. `sync: Some(earlier)`
    /// (an fsync) makes these blocks, the `earlier` ones and the metadata
    /// durable first.
    WriteBlocks {
        gfi: Gfi,
        lease: u64,
        blocks: Vec<(u64, ByteBuf)>,
        min_size: u64,
        mtime: (i64, u32),
        sync: Option<Vec<u64>>,
        /// Then gives the lease back (a revocation's write-back and
        /// release in one round trip).
        release: bool,
        /// With `release`: keeps a read lease under the same id instead
        /// (the answer to [`ServerMsg::StepDown`]).
        step_down: bool,
    },
    /// Turns write lease `lease` into a read lease with the same id (the
    /// answer to [`ServerMsg::StepDown`] when nothing was dirty).
    StepDown {
        gfi: Gfi,
        lease: u64,
    },
    /// Reads `len` bytes from `offset` as the server has them now, cut at
    /// the file's size (answered with [`Reply::Bytes`]), under lease
    /// `lease` ([`LeaseMode::Direct`] reads go here; no block is cached).
    ReadDirect {
        gfi: Gfi,
        lease: u64,
        offset: u64,
        len: u32,
    },
    /// Writes `data` at `offset` and extends the file to its end if it is
    /// shorter, as one step with respect to other direct reads and writes
    /// of the file (the server merges partly written blocks itself, so
    /// that writers of different bytes of one block lose nothing),
    /// under a lease that allows writes. `append` (O_APPEND): at the end
    /// of the file as the server has it in that step, not at `offset`, so
    /// that appends of several direct holders never land on one another.
    /// Answered with [`Reply::Written`] (whose size, for an append, ends
    /// where this write did).
    WriteDirect {
        gfi: Gfi,
        lease: u64,
        offset: u64,
        append: bool,
        data: ByteBuf,
        mtime: (i64, u32),
    },
}

impl Request {
    /// Only reads the namespace: sent again on a new connection when the
    /// one it went out on died, it answers as the lost one would have.
    pub fn reads_namespace(&self) -> bool {
        matches!(
            self,
            Request::Lookup { .. }
                | Request::GetAttr { .. }
                | Request::Readlink { .. }
                | Request::ReadDir { .. }
                | Request::Statfs
        )
    }
}

/// Answers to [`Request`]s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    Err(i32),
    Welcome {
        client: ClientId,
        node: u32,
        block_size: u32,
        lease_ttl_ms: u64,
    },
    Node(NodeInfo),
    Data(Vec<u8>),
    Entries(Vec<DirEntryInfo>),
    Statfs {
        blocks: u64,
        bfree: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
    },
    /// With the attributes as of the grant (the previous holders have
    /// written back by then): one round trip less per lease.
    Granted {
        lease: u64,
        attr: NodeAttr,
        /// The data version as of the grant; `None` when this server keeps
        /// no versions (a scale-out agent): nothing cached stays valid.
        version: Option<DataVersion>,
        /// The blocks changed since the request's `since`, which the
        /// client drops; `None`: every block may have changed.
        changed: Option<Vec<u64>>,
        /// Those of the blocks asked for that the client lacks or that
        /// changed, by index; `None` is a hole.
        blocks: Vec<(u64, Option<ByteBuf>)>,
    },
    /// The answer to [`Request::WriteBlocks`]: the attributes after the
    /// write and the data version it made (`None` as in
    /// [`Reply::Granted`]).
    Written {
        info: NodeInfo,
        version: Option<DataVersion>,
    },
    /// One entry per block asked; `None` is a block never written (a hole).
    Blocks(Vec<Option<ByteBuf>>),
    /// File data ([`Request::ReadDirect`]); shorter than asked at the end
    /// of the file.
    Bytes(ByteBuf),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientMsg {
    pub id: u64,
    pub req: Request,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMsg {
    Reply {
        id: u64,
        reply: Reply,
    },
    /// The manager wants `lease` on `gfi` back (Algorithm 2, ReleaseLease).
    Revoke {
        gfi: Gfi,
        lease: u64,
    },
    /// The manager wants write lease `lease` on `gfi` back for a reader:
    /// the holder may write back and keep a read lease
    /// ([`Request::StepDown`], or [`Request::WriteBlocks`] with
    /// `step_down`), so that its cache stays valid, or release as for a
    /// [`ServerMsg::Revoke`].
    StepDown {
        gfi: Gfi,
        lease: u64,
    },
}

fn options() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new().with_limit(u64::from(MAX_FRAME))
}

/// Encodes `msg` as one frame (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    use bincode::Options;
    let len = options()
        .serialized_size(msg)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("encode: {e}")))?;
    let mut buf = Vec::with_capacity(4 + len as usize);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    options()
        .serialize_into(&mut buf, msg)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("encode: {e}")))?;
    Ok(buf)
}

/// Decodes one frame body (without its length prefix).
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> io::Result<T> {
    use bincode::Options;
    options()
        .deserialize(body)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad frame: {e}")))
}

/// Checks a frame length read from the wire.
pub fn frame_len(prefix: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_be_bytes(prefix);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the {MAX_FRAME}-byte limit"),
        ));
    }
    Ok(len as usize)
}

/// Blocking read of one frame.
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> io::Result<T> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix)?;
    let mut body = vec![0u8; frame_len(prefix)?];
    r.read_exact(&mut body)?;
    decode(&body)
}

/// Blocking write of one frame.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    w.write_all(&encode(msg)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_readers_and_direct_holders_share() {
        use LeaseMode::*;
        let all = [Read, Write, Direct];
        for a in all {
            for b in all {
                let shared = (a == Read && b == Read) || (a == Direct && b == Direct);
                assert_eq!(a.compatible(b), shared, "{a:?} with {b:?}");
                assert_eq!(a.compatible(b), b.compatible(a));
            }
        }
        // The write lease serves every kind of I/O; the others serve their own.
        assert!(Write.covers(Read) && Write.covers(Direct) && Write.covers(Write));
        assert!(Read.covers(Read) && !Read.covers(Write) && !Read.covers(Direct));
        assert!(Direct.covers(Direct) && !Direct.covers(Read) && !Direct.covers(Write));
        assert!(Write.writes() && Direct.writes() && !Read.writes());
    }

    #[test]
    fn round_trip_and_limits() {
        let msg = ClientMsg {
            id: 7,
            req: Request::WriteBlocks {
                gfi: Gfi { node: 3, ino: 9 },
                lease: 4,
                blocks: vec![(2, ByteBuf::from(vec![1, 2, 3]))],
                min_size: 10,
                mtime: (5, 6),
                sync: Some(vec![1]),
                release: false,
                step_down: false,
            },
        };
        let frame = encode(&msg).unwrap();
        let back: ClientMsg = read_frame(&mut &frame[..]).unwrap();
        assert_eq!(back, msg);
        // A length over the limit is refused before any allocation.
        let mut bad = (MAX_FRAME + 1).to_be_bytes().to_vec();
        bad.extend_from_slice(&[0; 8]);
        assert!(read_frame::<ClientMsg>(&mut &bad[..]).is_err());
        // Garbage is an error, not a panic.
        let junk = [0u8, 0, 0, 3, 0xff, 0xff, 0xff];
        assert!(read_frame::<ClientMsg>(&mut &junk[..]).is_err());
    }
}
