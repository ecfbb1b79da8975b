//! Typed flags of the [`Filesystem`](crate::Filesystem) and
//! [`Node`](crate::Node) methods: what `open(2)`, `access(2)`,
//! `flock(2)`, `fcntl(2)` locks, `lseek(2)`, `setxattr(2)`,
//! `fallocate(2)` and `poll(2)` were called with, so that an author needs
//! neither `libc` nor the kernel's numbers.
//!
//! The bit sets are [`bitflags`] types: `flags.contains(OpenFlags::APPEND)`,
//! `flags.bits()` for the raw value to hand to a system call. Bits the
//! kernel sends that have no name here are kept (`bits()` returns them).

use bitflags::bitflags;

bitflags! {
    /// The flags an `open(2)` or `creat(2)` was called with, as the kernel
    /// passes them to OPEN, CREATE and OPENDIR and recalls them at WRITE
    /// and RELEASE. The kernel handles `O_CREAT`, `O_EXCL` (except at
    /// CREATE) and `O_NOCTTY` itself; `O_TRUNC` reaches OPEN only when the
    /// file system asked for `FUSE_ATOMIC_O_TRUNC`.
    ///
    /// The access mode is not a bit set: [`OpenFlags::readable`] and
    /// [`OpenFlags::writable`] read it (`O_RDONLY` is 0).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct OpenFlags: i32 {
        /// `O_WRONLY`: open for writing only.
        const WRONLY = libc::O_WRONLY;
        /// `O_RDWR`: open for reading and writing.
        const RDWR = libc::O_RDWR;
        /// `O_CREAT`: create the file if it does not exist.
        const CREAT = libc::O_CREAT;
        /// `O_EXCL`: with `O_CREAT`, fail with `EEXIST` if the name exists.
        const EXCL = libc::O_EXCL;
        /// `O_NOCTTY`.
        const NOCTTY = libc::O_NOCTTY;
        /// `O_TRUNC`: truncate the file to 0 bytes.
        const TRUNC = libc::O_TRUNC;
        /// `O_APPEND`: every write goes to the end of the file.
        const APPEND = libc::O_APPEND;
        /// `O_NONBLOCK`.
        const NONBLOCK = libc::O_NONBLOCK;
        /// `O_DSYNC`: each write reaches storage with the data.
        const DSYNC = libc::O_DSYNC;
        /// `O_SYNC`: each write reaches storage with data and metadata
        /// (includes the `O_DSYNC` bit).
        const SYNC = libc::O_SYNC;
        /// `O_DIRECT`: the caller asks to bypass caches.
        const DIRECT = libc::O_DIRECT;
        /// `O_DIRECTORY`.
        const DIRECTORY = libc::O_DIRECTORY;
        /// `O_NOFOLLOW`.
        const NOFOLLOW = libc::O_NOFOLLOW;
        /// `O_NOATIME`: do not update the access time.
        const NOATIME = libc::O_NOATIME;
        /// `O_CLOEXEC`.
        const CLOEXEC = libc::O_CLOEXEC;
        /// `O_PATH`.
        const PATH = libc::O_PATH;
        /// `O_TMPFILE` (includes the `O_DIRECTORY` bit).
        const TMPFILE = libc::O_TMPFILE;
        // Bits without a name here (O_LARGEFILE, O_ASYNC...) are kept.
        const _ = !0;
    }
}

impl OpenFlags {
    /// `O_RDONLY`: the access mode of a read-only open (no bit set).
    pub const RDONLY: OpenFlags = OpenFlags::empty();

    /// Flags from the raw `O_*` value, every bit kept.
    pub const fn from_raw(raw: i32) -> OpenFlags {
        OpenFlags::from_bits_retain(raw)
    }

    /// The access mode bits (`flags & O_ACCMODE`): [`OpenFlags::RDONLY`],
    /// [`OpenFlags::WRONLY`] or [`OpenFlags::RDWR`].
    pub const fn access_mode(self) -> OpenFlags {
        OpenFlags::from_bits_retain(self.bits() & libc::O_ACCMODE)
    }

    /// The same flags with access mode `mode` instead of theirs.
    pub const fn with_access_mode(self, mode: OpenFlags) -> OpenFlags {
        OpenFlags::from_bits_retain((self.bits() & !libc::O_ACCMODE) | (mode.bits() & libc::O_ACCMODE))
    }

    /// Opened for reading (`O_RDONLY` or `O_RDWR`).
    pub const fn readable(self) -> bool {
        let mode = self.bits() & libc::O_ACCMODE;
        mode == libc::O_RDONLY || mode == libc::O_RDWR
    }

    /// Opened for writing (`O_WRONLY` or `O_RDWR`).
    pub const fn writable(self) -> bool {
        let mode = self.bits() & libc::O_ACCMODE;
        mode == libc::O_WRONLY || mode == libc::O_RDWR
    }
}

bitflags! {
    /// What `access(2)` asks about a node. The empty set is `F_OK` (does
    /// the node exist).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AccessMode: i32 {
        /// `R_OK`: may the caller read it.
        const READ = libc::R_OK;
        /// `W_OK`: may the caller write it.
        const WRITE = libc::W_OK;
        /// `X_OK`: may the caller execute it (search it, for a directory).
        const EXECUTE = libc::X_OK;
    }
}

impl AccessMode {
    /// `F_OK`: only whether the node exists.
    pub const EXISTS: AccessMode = AccessMode::empty();

    /// The mask from the raw `R_OK`/`W_OK`/`X_OK` value, every bit kept.
    pub const fn from_raw(raw: i32) -> AccessMode {
        AccessMode::from_bits_retain(raw)
    }
}

bitflags! {
    /// How `setxattr(2)` treats an existing attribute. Empty: create or
    /// replace.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct XattrFlags: i32 {
        /// `XATTR_CREATE`: fail with `EEXIST` when the attribute exists.
        const CREATE = libc::XATTR_CREATE;
        /// `XATTR_REPLACE`: fail with `ENODATA` when it does not.
        const REPLACE = libc::XATTR_REPLACE;
    }
}

impl XattrFlags {
    /// The flags from the raw `XATTR_*` value, every bit kept.
    pub const fn from_raw(raw: i32) -> XattrFlags {
        XattrFlags::from_bits_retain(raw)
    }
}

bitflags! {
    /// The mode of `fallocate(2)`. Empty: allocate the range, growing the
    /// file when it ends beyond the size.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct FallocateFlags: i32 {
        /// `FALLOC_FL_KEEP_SIZE`: the size never grows.
        const KEEP_SIZE = libc::FALLOC_FL_KEEP_SIZE;
        /// `FALLOC_FL_PUNCH_HOLE` (with `KEEP_SIZE`): the range becomes a
        /// hole that reads as zeros.
        const PUNCH_HOLE = libc::FALLOC_FL_PUNCH_HOLE;
        /// `FALLOC_FL_COLLAPSE_RANGE`: the range is removed, the rest moves down.
        const COLLAPSE_RANGE = libc::FALLOC_FL_COLLAPSE_RANGE;
        /// `FALLOC_FL_ZERO_RANGE`: the range reads as zeros.
        const ZERO_RANGE = libc::FALLOC_FL_ZERO_RANGE;
        /// `FALLOC_FL_INSERT_RANGE`: a hole is inserted, the rest moves up.
        const INSERT_RANGE = libc::FALLOC_FL_INSERT_RANGE;
        /// `FALLOC_FL_UNSHARE_RANGE`: shared extents become private.
        const UNSHARE_RANGE = libc::FALLOC_FL_UNSHARE_RANGE;
    }
}

impl FallocateFlags {
    /// The mode from the raw `FALLOC_FL_*` value, every bit kept.
    pub const fn from_raw(raw: i32) -> FallocateFlags {
        FallocateFlags::from_bits_retain(raw)
    }
}

/// The lock a `flock(2)` call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlockKind {
    /// `LOCK_SH`: a shared lock (many holders).
    Shared,
    /// `LOCK_EX`: an exclusive lock (one holder).
    Exclusive,
    /// `LOCK_UN`: release the lock held.
    Unlock,
}

/// A `flock(2)` operation: the lock asked for, and whether the caller
/// waits for a conflicting lock to go (no `LOCK_NB`) or fails at once with
/// `EWOULDBLOCK`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlockOp {
    /// The lock asked for.
    pub kind: FlockKind,
    /// Without `LOCK_NB`: wait for conflicting locks to go.
    pub wait: bool,
}

impl FlockOp {
    /// Decodes `LOCK_SH`/`LOCK_EX`/`LOCK_UN`, possibly with `LOCK_NB`;
    /// `None` for anything else.
    pub fn from_raw(op: i32) -> Option<FlockOp> {
        let kind = match op & !libc::LOCK_NB {
            libc::LOCK_SH => FlockKind::Shared,
            libc::LOCK_EX => FlockKind::Exclusive,
            libc::LOCK_UN => FlockKind::Unlock,
            _ => return None,
        };
        Some(FlockOp {
            kind,
            wait: op & libc::LOCK_NB == 0,
        })
    }

    /// The `LOCK_*` value for `flock(2)`.
    pub fn raw(self) -> i32 {
        let op = match self.kind {
            FlockKind::Shared => libc::LOCK_SH,
            FlockKind::Exclusive => libc::LOCK_EX,
            FlockKind::Unlock => libc::LOCK_UN,
        };
        if self.wait {
            op
        } else {
            op | libc::LOCK_NB
        }
    }
}

/// The type of a POSIX byte-range lock (`fcntl(2)`'s `l_type`), in
/// [`Lock::typ`](crate::Lock::typ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum LockType {
    /// `F_RDLCK`: a shared lock; other read locks may overlap it.
    Read,
    /// `F_WRLCK`: an exclusive lock; no other lock may overlap it.
    Write,
    /// `F_UNLCK`: at SETLK, release the range; in GETLK's answer, no lock
    /// conflicts.
    #[default]
    Unlock,
}

impl LockType {
    /// Decodes `F_RDLCK`, `F_WRLCK` or `F_UNLCK`; `None` for anything else.
    pub fn from_raw(typ: i32) -> Option<LockType> {
        Some(match typ {
            libc::F_RDLCK => LockType::Read,
            libc::F_WRLCK => LockType::Write,
            libc::F_UNLCK => LockType::Unlock,
            _ => return None,
        })
    }

    /// The `F_*LCK` value for `fcntl(2)`.
    pub fn raw(self) -> i32 {
        match self {
            LockType::Read => libc::F_RDLCK,
            LockType::Write => libc::F_WRLCK,
            LockType::Unlock => libc::F_UNLCK,
        }
    }
}

bitflags! {
    /// The events of `poll(2)`, `select(2)` and `epoll` that POLL asks
    /// about and its answer reports (the kernel's `__poll_t`, whose bits
    /// are the `POLL*` values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct PollEvents: u32 {
        /// `POLLIN`: there is data to read.
        const IN = libc::POLLIN as u32;
        /// `POLLPRI`: there is urgent data to read.
        const PRI = libc::POLLPRI as u32;
        /// `POLLOUT`: a write would not block.
        const OUT = libc::POLLOUT as u32;
        /// `POLLERR`: an error condition (reported whether asked or not).
        const ERR = libc::POLLERR as u32;
        /// `POLLHUP`: hung up (reported whether asked or not).
        const HUP = libc::POLLHUP as u32;
        /// `POLLNVAL`: the descriptor is not open.
        const NVAL = libc::POLLNVAL as u32;
        /// `POLLRDNORM`: normal data to read.
        const RDNORM = libc::POLLRDNORM as u32;
        /// `POLLRDBAND`: priority-band data to read.
        const RDBAND = libc::POLLRDBAND as u32;
        /// `POLLWRNORM`: normal data may be written.
        const WRNORM = libc::POLLWRNORM as u32;
        /// `POLLWRBAND`: priority-band data may be written.
        const WRBAND = libc::POLLWRBAND as u32;
        /// `POLLRDHUP`: the peer closed its writing end.
        const RDHUP = libc::POLLRDHUP as u32;
        // Bits without a name here (EPOLLEXCLUSIVE...) are kept.
        const _ = !0;
    }
}

impl PollEvents {
    /// The events from the raw `POLL*` value, every bit kept.
    pub const fn from_raw(raw: u32) -> PollEvents {
        PollEvents::from_bits_retain(raw)
    }
}

/// Where an `lseek(2)` offset counts from. The kernel sends only
/// [`Whence::Data`] and [`Whence::Hole`] to a file system (it handles the
/// others itself); the preload shim may send any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Whence {
    /// `SEEK_SET`: from the start of the file.
    Set,
    /// `SEEK_CUR`: from the current position.
    Cur,
    /// `SEEK_END`: from the end of the file.
    End,
    /// `SEEK_DATA`: the first byte of data at or after the offset
    /// (`ENXIO` at or past the end).
    Data,
    /// `SEEK_HOLE`: the first byte of a hole at or after the offset (the
    /// end of the file counts as a hole; `ENXIO` past it).
    Hole,
}

impl Whence {
    /// Decodes a `SEEK_*` value; `None` for anything else.
    pub fn from_raw(whence: i32) -> Option<Whence> {
        Some(match whence {
            libc::SEEK_SET => Whence::Set,
            libc::SEEK_CUR => Whence::Cur,
            libc::SEEK_END => Whence::End,
            libc::SEEK_DATA => Whence::Data,
            libc::SEEK_HOLE => Whence::Hole,
            _ => return None,
        })
    }

    /// The `SEEK_*` value for `lseek(2)`.
    pub fn raw(self) -> i32 {
        match self {
            Whence::Set => libc::SEEK_SET,
            Whence::Cur => libc::SEEK_CUR,
            Whence::End => libc::SEEK_END,
            Whence::Data => libc::SEEK_DATA,
            Whence::Hole => libc::SEEK_HOLE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_flags_read_the_access_mode_and_keep_unnamed_bits() {
        let f = OpenFlags::from_raw(libc::O_WRONLY | libc::O_APPEND | 0o100000);
        assert!(f.writable() && !f.readable());
        assert!(f.contains(OpenFlags::APPEND) && !f.contains(OpenFlags::TRUNC));
        assert_eq!(f.bits(), libc::O_WRONLY | libc::O_APPEND | 0o100000);
        assert_eq!(f.access_mode(), OpenFlags::WRONLY);
        let rw = f.with_access_mode(OpenFlags::RDWR);
        assert!(rw.readable() && rw.writable());
        assert_eq!(rw.bits(), libc::O_RDWR | libc::O_APPEND | 0o100000);
        assert!(OpenFlags::RDONLY.readable() && !OpenFlags::RDONLY.writable());
    }

    #[test]
    fn flock_and_whence_round_trip_and_refuse_unknown_values() {
        for raw in [libc::LOCK_SH, libc::LOCK_EX | libc::LOCK_NB, libc::LOCK_UN] {
            assert_eq!(FlockOp::from_raw(raw).map(FlockOp::raw), Some(raw));
        }
        assert_eq!(
            FlockOp::from_raw(libc::LOCK_EX | libc::LOCK_NB),
            Some(FlockOp {
                kind: FlockKind::Exclusive,
                wait: false
            })
        );
        assert_eq!(FlockOp::from_raw(libc::LOCK_NB), None);
        for raw in [
            libc::SEEK_SET,
            libc::SEEK_CUR,
            libc::SEEK_END,
            libc::SEEK_DATA,
            libc::SEEK_HOLE,
        ] {
            assert_eq!(Whence::from_raw(raw).map(Whence::raw), Some(raw));
        }
        assert_eq!(Whence::from_raw(9), None);
        for raw in [libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK] {
            assert_eq!(LockType::from_raw(raw).map(LockType::raw), Some(raw));
        }
        assert_eq!(LockType::from_raw(7), None);
    }

    #[test]
    fn poll_events_keep_unnamed_bits() {
        let e = PollEvents::from_raw(libc::POLLIN as u32 | 1 << 28);
        assert!(e.contains(PollEvents::IN) && !e.contains(PollEvents::OUT));
        assert_eq!(e.bits(), libc::POLLIN as u32 | 1 << 28);
    }
}
