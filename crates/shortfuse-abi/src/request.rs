//! Request structs: the header and the fixed argument of each opcode, as
//! the kernel lays them out (`struct fuse_*_in`).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Derives shared by every wire struct.
macro_rules! wire {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
    };
}
pub(crate) use wire;

wire! {
    /// Precedes every request.
    pub struct fuse_in_header {
        /// Whole message length, header included.
        pub len: u32,
        /// `FUSE_*` opcode.
        pub opcode: u32,
        /// Request id; the reply carries it back.
        pub unique: u64,
        /// The node the request is about (1: the root).
        pub nodeid: u64,
        /// Caller's file system user id.
        pub uid: u32,
        /// Caller's file system group id.
        pub gid: u32,
        /// Caller's thread id, as the mount's pid namespace numbers it (0
        /// when the caller is outside that namespace).
        pub pid: u32,
        /// Length of request extensions at the end, in 8-byte units.
        pub total_extlen: u16,
        /// Zero.
        pub padding: u16,
    }
}

wire! {
    /// A POSIX byte-range lock (GETLK, SETLK, SETLKW).
    pub struct fuse_file_lock {
        /// First byte of the range.
        pub start: u64,
        /// Last byte of the range, included; `u64::MAX`: to the end of the file.
        pub end: u64,
        /// `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
        pub typ: u32,
        /// tgid of the lock holder.
        pub pid: u32,
    }
}

wire! {
    /// FORGET (no reply).
    pub struct fuse_forget_in {
        /// Lookups of the node the kernel drops.
        pub nlookup: u64,
    }
}
wire! {
    /// One node of BATCH_FORGET.
    pub struct fuse_forget_one {
        /// The node.
        pub nodeid: u64,
        /// Lookups of it the kernel drops.
        pub nlookup: u64,
    }
}
wire! {
    /// BATCH_FORGET: followed by `count` `fuse_forget_one` (no reply).
    pub struct fuse_batch_forget_in {
        /// Entries that follow.
        pub count: u32,
        /// Zero.
        pub dummy: u32,
    }
}
wire! {
    /// GETATTR.
    pub struct fuse_getattr_in {
        /// `FUSE_GETATTR_FH` when `fh` is set (an `fstat` on an open file).
        pub getattr_flags: u32,
        /// Zero.
        pub dummy: u32,
        /// The open file's handle, with `FUSE_GETATTR_FH`.
        pub fh: u64,
    }
}

/// Short form of `fuse_mknod_in` used before 7.12.
pub const FUSE_COMPAT_MKNOD_IN_SIZE: usize = 8;
wire! {
    /// MKNOD; the name follows.
    pub struct fuse_mknod_in {
        /// File type and permission bits.
        pub mode: u32,
        /// Device number of a device file.
        pub rdev: u32,
        /// The caller's umask; already applied to `mode` unless the
        /// daemon asked for `FUSE_DONT_MASK`.
        pub umask: u32,
        /// Zero.
        pub padding: u32,
    }
}
wire! {
    /// MKDIR; the name follows.
    pub struct fuse_mkdir_in {
        /// Permission bits.
        pub mode: u32,
        /// The caller's umask (see `fuse_mknod_in::umask`).
        pub umask: u32,
    }
}
wire! {
    /// RENAME; the old and the new name follow.
    pub struct fuse_rename_in {
        /// The new parent directory.
        pub newdir: u64,
    }
}
wire! {
    /// RENAME2; the old and the new name follow.
    pub struct fuse_rename2_in {
        /// The new parent directory.
        pub newdir: u64,
        /// `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, `RENAME_WHITEOUT`.
        pub flags: u32,
        /// Zero.
        pub padding: u32,
    }
}
wire! {
    /// LINK; the new name follows, in the header's directory node.
    pub struct fuse_link_in {
        /// The node linked to.
        pub oldnodeid: u64,
    }
}

wire! {
    /// SETATTR: only the fields `valid` names are set.
    pub struct fuse_setattr_in {
        /// `FATTR_*` bits saying which fields are set.
        pub valid: u32,
        /// Zero.
        pub padding: u32,
        /// With `FATTR_FH`: the open file's handle (`ftruncate`, `futimens`...).
        pub fh: u64,
        /// With `FATTR_SIZE`: the new size.
        pub size: u64,
        /// With `FATTR_LOCKOWNER`: the caller's lock owner.
        pub lock_owner: u64,
        /// With `FATTR_ATIME`: access time, seconds.
        pub atime: u64,
        /// With `FATTR_MTIME`: modification time, seconds.
        pub mtime: u64,
        /// With `FATTR_CTIME`: status change time, seconds.
        pub ctime: u64,
        /// Nanoseconds of `atime`.
        pub atimensec: u32,
        /// Nanoseconds of `mtime`.
        pub mtimensec: u32,
        /// Nanoseconds of `ctime`.
        pub ctimensec: u32,
        /// With `FATTR_MODE`: the new mode.
        pub mode: u32,
        /// Zero.
        pub unused4: u32,
        /// With `FATTR_UID`: the new owner.
        pub uid: u32,
        /// With `FATTR_GID`: the new group.
        pub gid: u32,
        /// Zero.
        pub unused5: u32,
    }
}

wire! {
    /// OPEN and OPENDIR.
    pub struct fuse_open_in {
        /// The `open(2)` flags, without `O_CREAT`, `O_EXCL` and `O_NOCTTY`
        /// (and `O_TRUNC` unless `FUSE_ATOMIC_O_TRUNC` was negotiated).
        pub flags: u32,
        /// `FUSE_OPEN_KILL_SUIDGID`.
        pub open_flags: u32,
    }
}
wire! {
    /// CREATE; the name follows.
    pub struct fuse_create_in {
        /// The `open(2)` flags.
        pub flags: u32,
        /// File type and permission bits of the new file.
        pub mode: u32,
        /// The caller's umask (see `fuse_mknod_in::umask`).
        pub umask: u32,
        /// `FUSE_OPEN_KILL_SUIDGID`.
        pub open_flags: u32,
    }
}
wire! {
    /// RELEASE and RELEASEDIR: the last close of an open.
    pub struct fuse_release_in {
        /// The handle OPEN gave.
        pub fh: u64,
        /// The open's flags.
        pub flags: u32,
        /// `FUSE_RELEASE_FLUSH`, `FUSE_RELEASE_FLOCK_UNLOCK`.
        pub release_flags: u32,
        /// The closer's lock owner.
        pub lock_owner: u64,
    }
}
wire! {
    /// FLUSH: a `close(2)` of one descriptor of an open.
    pub struct fuse_flush_in {
        /// The handle OPEN gave.
        pub fh: u64,
        /// Zero.
        pub unused: u32,
        /// Zero.
        pub padding: u32,
        /// The closer's lock owner, whose POSIX locks go.
        pub lock_owner: u64,
    }
}

wire! {
    /// READ, READDIR and READDIRPLUS.
    pub struct fuse_read_in {
        /// The handle OPEN or OPENDIR gave.
        pub fh: u64,
        /// Byte offset (READ), or the `off` of the last entry returned
        /// (READDIR, READDIRPLUS; 0 at the start).
        pub offset: u64,
        /// Most bytes to return.
        pub size: u32,
        /// `FUSE_READ_LOCKOWNER` when `lock_owner` is set.
        pub read_flags: u32,
        /// The reader's lock owner.
        pub lock_owner: u64,
        /// The open's flags.
        pub flags: u32,
        /// Zero.
        pub padding: u32,
    }
}

/// Short form of `fuse_write_in` used before 7.9.
pub const FUSE_COMPAT_WRITE_IN_SIZE: usize = 24;
wire! {
    /// Followed by `size` bytes of data.
    pub struct fuse_write_in {
        /// The handle OPEN gave.
        pub fh: u64,
        /// Byte offset.
        pub offset: u64,
        /// Bytes of data that follow.
        pub size: u32,
        /// `FUSE_WRITE_CACHE` (a write-back of cached pages),
        /// `FUSE_WRITE_LOCKOWNER`, `FUSE_WRITE_KILL_SUIDGID`.
        pub write_flags: u32,
        /// With `FUSE_WRITE_LOCKOWNER`: the writer's lock owner.
        pub lock_owner: u64,
        /// The open's flags.
        pub flags: u32,
        /// Zero.
        pub padding: u32,
    }
}

wire! {
    /// FSYNC and FSYNCDIR.
    pub struct fuse_fsync_in {
        /// The handle OPEN or OPENDIR gave.
        pub fh: u64,
        /// `FUSE_FSYNC_FDATASYNC`: data only (`fdatasync(2)`).
        pub fsync_flags: u32,
        /// Zero.
        pub padding: u32,
    }
}

/// Size of `fuse_setxattr_in` unless `FUSE_SETXATTR_EXT` was negotiated.
pub const FUSE_COMPAT_SETXATTR_IN_SIZE: usize = 8;
wire! {
    /// The 16-byte form (with `FUSE_SETXATTR_EXT`); without it only `size`
    /// and `flags` travel. The name and the value follow.
    pub struct fuse_setxattr_in {
        /// Bytes of the value.
        pub size: u32,
        /// `XATTR_CREATE`, `XATTR_REPLACE`.
        pub flags: u32,
        /// `FUSE_SETXATTR_ACL_KILL_SGID`.
        pub setxattr_flags: u32,
        /// Zero.
        pub padding: u32,
    }
}
wire! {
    /// GETXATTR (the name follows) and LISTXATTR.
    pub struct fuse_getxattr_in {
        /// Room in the caller's buffer; 0 asks for the size only.
        pub size: u32,
        /// Zero.
        pub padding: u32,
    }
}

wire! {
    /// GETLK, SETLK and SETLKW.
    pub struct fuse_lk_in {
        /// The handle OPEN gave.
        pub fh: u64,
        /// The lock owner asking.
        pub owner: u64,
        /// The lock asked for, or asked about.
        pub lk: fuse_file_lock,
        /// `FUSE_LK_FLOCK`: a `flock(2)` lock rather than a POSIX one.
        pub lk_flags: u32,
        /// Zero.
        pub padding: u32,
    }
}

wire! {
    /// ACCESS.
    pub struct fuse_access_in {
        /// `R_OK`, `W_OK`, `X_OK` bits, or 0 (`F_OK`).
        pub mask: u32,
        /// Zero.
        pub padding: u32,
    }
}

/// Size of `fuse_init_in` before 7.36 (no `flags2`).
pub const FUSE_COMPAT_INIT_IN_SIZE: usize = 16;
wire! {
    /// INIT: what the kernel offers.
    pub struct fuse_init_in {
        /// Protocol major version (7).
        pub major: u32,
        /// Protocol minor version of the kernel.
        pub minor: u32,
        /// Largest read-ahead the kernel would do, bytes.
        pub max_readahead: u32,
        /// `FUSE_*` capability bits offered (the low 32).
        pub flags: u32,
        /// `FUSE_*` capability bits offered, the high 32 (with `FUSE_INIT_EXT`).
        pub flags2: u32,
        /// Zero.
        pub unused: [u32; 11],
    }
}

wire! {
    /// CUSE_INIT.
    pub struct cuse_init_in {
        /// Protocol major version (7).
        pub major: u32,
        /// Protocol minor version of the kernel.
        pub minor: u32,
        /// Zero.
        pub unused: u32,
        /// `CUSE_*` bits offered.
        pub flags: u32,
    }
}
wire! {
    /// INTERRUPT (no reply of its own).
    pub struct fuse_interrupt_in {
        /// The `unique` of the request the caller gave up on.
        pub unique: u64,
    }
}
wire! {
    /// BMAP.
    pub struct fuse_bmap_in {
        /// Block of the file, in `blocksize` units.
        pub block: u64,
        /// Block size, bytes.
        pub blocksize: u32,
        /// Zero.
        pub padding: u32,
    }
}

wire! {
    /// IOCTL; `in_size` bytes of input follow.
    pub struct fuse_ioctl_in {
        /// The handle OPEN gave.
        pub fh: u64,
        /// `FUSE_IOCTL_*` bits.
        pub flags: u32,
        /// The ioctl command.
        pub cmd: u32,
        /// The ioctl argument (a pointer in the caller).
        pub arg: u64,
        /// Bytes of input data.
        pub in_size: u32,
        /// Most bytes of output data.
        pub out_size: u32,
    }
}
wire! {
    /// One buffer of the caller an IOCTL reply asks for.
    pub struct fuse_ioctl_iovec {
        /// Address in the caller.
        pub base: u64,
        /// Bytes.
        pub len: u64,
    }
}

wire! {
    /// POLL.
    pub struct fuse_poll_in {
        /// The handle OPEN gave.
        pub fh: u64,
        /// With `FUSE_POLL_SCHEDULE_NOTIFY`: the handle to name in
        /// `FUSE_NOTIFY_POLL` when the file becomes ready.
        pub kh: u64,
        /// `FUSE_POLL_SCHEDULE_NOTIFY`: the caller will wait.
        pub flags: u32,
        /// Events asked about (`POLL*` bits).
        pub events: u32,
    }
}

wire! {
    /// FALLOCATE.
    pub struct fuse_fallocate_in {
        /// The handle OPEN gave.
        pub fh: u64,
        /// First byte of the range.
        pub offset: u64,
        /// Bytes in the range.
        pub length: u64,
        /// `FALLOC_FL_*` bits.
        pub mode: u32,
        /// Zero.
        pub padding: u32,
    }
}

wire! {
    /// LSEEK.
    pub struct fuse_lseek_in {
        /// The handle OPEN gave.
        pub fh: u64,
        /// Where to start looking.
        pub offset: u64,
        /// `SEEK_DATA` or `SEEK_HOLE`.
        pub whence: u32,
        /// Zero.
        pub padding: u32,
    }
}

wire! {
    /// COPY_FILE_RANGE and COPY_FILE_RANGE_64; the source node is the
    /// header's `nodeid`.
    pub struct fuse_copy_file_range_in {
        /// The source's handle.
        pub fh_in: u64,
        /// Offset in the source.
        pub off_in: u64,
        /// The destination node.
        pub nodeid_out: u64,
        /// The destination's handle.
        pub fh_out: u64,
        /// Offset in the destination.
        pub off_out: u64,
        /// Bytes to copy.
        pub len: u64,
        /// `copy_file_range(2)`'s flags.
        pub flags: u64,
    }
}

wire! {
    /// SETUPMAPPING (virtio-fs DAX): map part of a file into the DAX window.
    pub struct fuse_setupmapping_in {
        /// The handle OPEN gave.
        pub fh: u64,
        /// Offset in the file.
        pub foffset: u64,
        /// Bytes to map.
        pub len: u64,
        /// `FUSE_SETUPMAPPING_FLAG_*` (read, write).
        pub flags: u64,
        /// Offset in the DAX window.
        pub moffset: u64,
    }
}
wire! {
    /// REMOVEMAPPING: followed by `count` `fuse_removemapping_one`.
    pub struct fuse_removemapping_in {
        /// Entries that follow.
        pub count: u32,
    }
}
wire! {
    /// One range of REMOVEMAPPING.
    pub struct fuse_removemapping_one {
        /// Offset in the DAX window.
        pub moffset: u64,
        /// Bytes.
        pub len: u64,
    }
}
/// Most `fuse_removemapping_one` entries in one request (one 4 KiB page).
pub const FUSE_REMOVEMAPPING_MAX_ENTRY: usize = 4096 / core::mem::size_of::<fuse_removemapping_one>();

wire! {
    /// SYNCFS.
    pub struct fuse_syncfs_in {
        /// Zero.
        pub padding: u64,
    }
}

wire! {
    /// STATX.
    pub struct fuse_statx_in {
        /// `FUSE_GETATTR_FH` when `fh` is set.
        pub getattr_flags: u32,
        /// Zero.
        pub reserved: u32,
        /// The open file's handle, with `FUSE_GETATTR_FH`.
        pub fh: u64,
        /// `statx(2)`'s `AT_STATX_*` sync flags.
        pub sx_flags: u32,
        /// `STATX_*` fields wanted.
        pub sx_mask: u32,
    }
}

// --- request extensions (after the arguments, `total_extlen * 8` bytes) ---
wire! {
    /// Starts each request extension.
    pub struct fuse_ext_header {
        /// Bytes of the extension, header included, a multiple of 8.
        pub size: u32,
        /// `FUSE_EXT_GROUPS`; types up to `FUSE_MAX_NR_SECCTX` are security contexts.
        pub typ: u32,
    }
}
wire! {
    /// One security context of CREATE, MKDIR, MKNOD or SYMLINK
    /// (`FUSE_SECURITY_CTX`); the name and the context follow.
    pub struct fuse_secctx {
        /// Bytes of the context.
        pub size: u32,
        /// Zero.
        pub padding: u32,
    }
}
wire! {
    /// Precedes the security contexts.
    pub struct fuse_secctx_header {
        /// Bytes of every context, this header included.
        pub size: u32,
        /// Contexts that follow.
        pub nr_secctx: u32,
    }
}
wire! {
    /// `FUSE_EXT_GROUPS`: the caller's supplementary groups, `nr_groups`
    /// u32s that follow (with `FUSE_CREATE_SUPP_GROUP`).
    pub struct fuse_supp_groups {
        /// Group ids that follow.
        pub nr_groups: u32,
    }
}

/// The supplementary group ids a request's extensions carry (the
/// FUSE_EXT_GROUPS extension; native-endian u32s, empty without it), or
/// None when the extensions are malformed.
pub fn supp_groups(mut extensions: &[u8]) -> Option<&[u8]> {
    let mut groups: &[u8] = &[];
    while !extensions.is_empty() {
        let (e, _) = fuse_ext_header::read_from_prefix(extensions).ok()?;
        let size = e.size as usize;
        if size < core::mem::size_of::<fuse_ext_header>() || size > extensions.len() {
            return None;
        }
        if e.typ == crate::FUSE_EXT_GROUPS {
            let body = &extensions[8..size];
            let (g, rest) = fuse_supp_groups::read_from_prefix(body).ok()?;
            groups = rest.get(..(g.nr_groups as usize).checked_mul(4)?)?;
        }
        extensions = &extensions[size..];
    }
    Some(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn sizes_match_the_kernel() {
        assert_eq!(size_of::<fuse_in_header>(), 40);
        assert_eq!(size_of::<fuse_file_lock>(), 24);
        assert_eq!(size_of::<fuse_forget_in>(), 8);
        assert_eq!(size_of::<fuse_forget_one>(), 16);
        assert_eq!(size_of::<fuse_batch_forget_in>(), 8);
        assert_eq!(size_of::<fuse_getattr_in>(), 16);
        assert_eq!(size_of::<fuse_mknod_in>(), 16);
        assert_eq!(size_of::<fuse_mkdir_in>(), 8);
        assert_eq!(size_of::<fuse_rename_in>(), 8);
        assert_eq!(size_of::<fuse_rename2_in>(), 16);
        assert_eq!(size_of::<fuse_link_in>(), 8);
        assert_eq!(size_of::<fuse_setattr_in>(), 88);
        assert_eq!(size_of::<fuse_open_in>(), 8);
        assert_eq!(size_of::<fuse_create_in>(), 16);
        assert_eq!(size_of::<fuse_release_in>(), 24);
        assert_eq!(size_of::<fuse_flush_in>(), 24);
        assert_eq!(size_of::<fuse_read_in>(), 40);
        assert_eq!(size_of::<fuse_write_in>(), 40);
        assert_eq!(size_of::<fuse_fsync_in>(), 16);
        assert_eq!(size_of::<fuse_setxattr_in>(), 16);
        assert_eq!(size_of::<fuse_getxattr_in>(), 8);
        assert_eq!(size_of::<fuse_lk_in>(), 48);
        assert_eq!(size_of::<fuse_access_in>(), 8);
        assert_eq!(size_of::<fuse_init_in>(), 64);
        assert_eq!(size_of::<cuse_init_in>(), 16);
        assert_eq!(size_of::<fuse_interrupt_in>(), 8);
        assert_eq!(size_of::<fuse_bmap_in>(), 16);
        assert_eq!(size_of::<fuse_ioctl_in>(), 32);
        assert_eq!(size_of::<fuse_ioctl_iovec>(), 16);
        assert_eq!(size_of::<fuse_poll_in>(), 24);
        assert_eq!(size_of::<fuse_fallocate_in>(), 32);
        assert_eq!(size_of::<fuse_lseek_in>(), 24);
        assert_eq!(size_of::<fuse_copy_file_range_in>(), 56);
        assert_eq!(size_of::<fuse_setupmapping_in>(), 40);
        assert_eq!(size_of::<fuse_removemapping_in>(), 4);
        assert_eq!(size_of::<fuse_removemapping_one>(), 16);
        assert_eq!(FUSE_REMOVEMAPPING_MAX_ENTRY, 256);
        assert_eq!(size_of::<fuse_syncfs_in>(), 8);
        assert_eq!(size_of::<fuse_statx_in>(), 24);
        assert_eq!(size_of::<fuse_ext_header>(), 8);
        assert_eq!(size_of::<fuse_secctx>(), 8);
        assert_eq!(size_of::<fuse_secctx_header>(), 8);
        assert_eq!(size_of::<fuse_supp_groups>(), 4);
    }

    #[test]
    fn offsets_match_the_kernel() {
        assert_eq!(offset_of!(fuse_in_header, opcode), 4);
        assert_eq!(offset_of!(fuse_in_header, unique), 8);
        assert_eq!(offset_of!(fuse_in_header, nodeid), 16);
        assert_eq!(offset_of!(fuse_in_header, uid), 24);
        assert_eq!(offset_of!(fuse_in_header, gid), 28);
        assert_eq!(offset_of!(fuse_in_header, pid), 32);
        assert_eq!(offset_of!(fuse_in_header, total_extlen), 36);
        assert_eq!(offset_of!(fuse_in_header, padding), 38);
        assert_eq!(offset_of!(fuse_file_lock, typ), 16);
        assert_eq!(offset_of!(fuse_file_lock, pid), 20);
        assert_eq!(offset_of!(fuse_getattr_in, fh), 8);
        assert_eq!(offset_of!(fuse_mknod_in, umask), 8);
        assert_eq!(offset_of!(fuse_rename2_in, flags), 8);
        assert_eq!(offset_of!(fuse_setattr_in, fh), 8);
        assert_eq!(offset_of!(fuse_setattr_in, size), 16);
        assert_eq!(offset_of!(fuse_setattr_in, lock_owner), 24);
        assert_eq!(offset_of!(fuse_setattr_in, atime), 32);
        assert_eq!(offset_of!(fuse_setattr_in, mtime), 40);
        assert_eq!(offset_of!(fuse_setattr_in, ctime), 48);
        assert_eq!(offset_of!(fuse_setattr_in, atimensec), 56);
        assert_eq!(offset_of!(fuse_setattr_in, mtimensec), 60);
        assert_eq!(offset_of!(fuse_setattr_in, ctimensec), 64);
        assert_eq!(offset_of!(fuse_setattr_in, mode), 68);
        assert_eq!(offset_of!(fuse_setattr_in, uid), 76);
        assert_eq!(offset_of!(fuse_setattr_in, gid), 80);
        assert_eq!(offset_of!(fuse_create_in, umask), 8);
        assert_eq!(offset_of!(fuse_create_in, open_flags), 12);
        assert_eq!(offset_of!(fuse_release_in, release_flags), 12);
        assert_eq!(offset_of!(fuse_release_in, lock_owner), 16);
        assert_eq!(offset_of!(fuse_flush_in, lock_owner), 16);
        assert_eq!(offset_of!(fuse_read_in, offset), 8);
        assert_eq!(offset_of!(fuse_read_in, size), 16);
        assert_eq!(offset_of!(fuse_read_in, read_flags), 20);
        assert_eq!(offset_of!(fuse_read_in, lock_owner), 24);
        assert_eq!(offset_of!(fuse_read_in, flags), 32);
        assert_eq!(offset_of!(fuse_write_in, write_flags), 20);
        assert_eq!(offset_of!(fuse_write_in, flags), 32);
        assert_eq!(offset_of!(fuse_fsync_in, fsync_flags), 8);
        assert_eq!(offset_of!(fuse_setxattr_in, setxattr_flags), 8);
        assert_eq!(offset_of!(fuse_lk_in, owner), 8);
        assert_eq!(offset_of!(fuse_lk_in, lk), 16);
        assert_eq!(offset_of!(fuse_lk_in, lk_flags), 40);
        assert_eq!(offset_of!(fuse_init_in, max_readahead), 8);
        assert_eq!(offset_of!(fuse_init_in, flags), 12);
        assert_eq!(offset_of!(fuse_init_in, flags2), 16);
        assert_eq!(offset_of!(fuse_init_in, unused), 20);
        assert_eq!(offset_of!(cuse_init_in, flags), 12);
        assert_eq!(offset_of!(fuse_bmap_in, blocksize), 8);
        assert_eq!(offset_of!(fuse_ioctl_in, cmd), 12);
        assert_eq!(offset_of!(fuse_ioctl_in, arg), 16);
        assert_eq!(offset_of!(fuse_ioctl_in, in_size), 24);
        assert_eq!(offset_of!(fuse_ioctl_in, out_size), 28);
        assert_eq!(offset_of!(fuse_poll_in, kh), 8);
        assert_eq!(offset_of!(fuse_poll_in, events), 20);
        assert_eq!(offset_of!(fuse_fallocate_in, length), 16);
        assert_eq!(offset_of!(fuse_fallocate_in, mode), 24);
        assert_eq!(offset_of!(fuse_lseek_in, whence), 16);
        assert_eq!(offset_of!(fuse_copy_file_range_in, nodeid_out), 16);
        assert_eq!(offset_of!(fuse_copy_file_range_in, off_out), 32);
        assert_eq!(offset_of!(fuse_copy_file_range_in, len), 40);
        assert_eq!(offset_of!(fuse_copy_file_range_in, flags), 48);
        assert_eq!(offset_of!(fuse_setupmapping_in, moffset), 32);
        assert_eq!(offset_of!(fuse_statx_in, fh), 8);
        assert_eq!(offset_of!(fuse_statx_in, sx_flags), 16);
        assert_eq!(offset_of!(fuse_statx_in, sx_mask), 20);
    }
}
