//! Flag families of the protocol. INIT flags are `u64`: bits 0..31 travel
//! in `flags`, bits 32..63 in `flags2` (only when `FUSE_INIT_EXT` is set).

// --- INIT flags (fuse_init_in.flags/flags2, fuse_init_out.flags/flags2) ---

/// Asynchronous read requests (read-ahead in parallel).
pub const FUSE_ASYNC_READ: u64 = 1 << 0;
/// The daemon implements POSIX locks (GETLK/SETLK).
pub const FUSE_POSIX_LOCKS: u64 = 1 << 1;
/// Reserved (never implemented by the kernel).
pub const FUSE_FILE_OPS: u64 = 1 << 2;
/// The daemon handles `O_TRUNC` in OPEN.
pub const FUSE_ATOMIC_O_TRUNC: u64 = 1 << 3;
/// The daemon answers lookups of "." and ".." (NFS export).
pub const FUSE_EXPORT_SUPPORT: u64 = 1 << 4;
/// Writes larger than 4 KiB.
pub const FUSE_BIG_WRITES: u64 = 1 << 5;
/// The kernel does not apply the umask on create; the daemon does.
pub const FUSE_DONT_MASK: u64 = 1 << 6;
/// The kernel may send WRITE data with splice(2) (the daemon reads /dev/fuse with splice).
pub const FUSE_SPLICE_WRITE: u64 = 1 << 7;
/// Pages may be moved, not copied, when the daemon writes replies with splice(2).
pub const FUSE_SPLICE_MOVE: u64 = 1 << 8;
/// The daemon may write READ replies to /dev/fuse with splice(2).
pub const FUSE_SPLICE_READ: u64 = 1 << 9;
/// The daemon implements `flock(2)` locks (SETLK with `FUSE_LK_FLOCK`).
pub const FUSE_FLOCK_LOCKS: u64 = 1 << 10;
/// IOCTL on directories.
pub const FUSE_HAS_IOCTL_DIR: u64 = 1 << 11;
/// Invalidate cached pages when mtime or size change.
pub const FUSE_AUTO_INVAL_DATA: u64 = 1 << 12;
/// READDIRPLUS: directory listings carry each entry's attributes.
pub const FUSE_DO_READDIRPLUS: u64 = 1 << 13;
/// With `FUSE_DO_READDIRPLUS`: the kernel chooses between READDIR and
/// READDIRPLUS by how the listing is used.
pub const FUSE_READDIRPLUS_AUTO: u64 = 1 << 14;
/// Direct I/O requests of one call may be in flight together.
pub const FUSE_ASYNC_DIO: u64 = 1 << 15;
/// Write-back cache: writes go to the page cache and reach the daemon
/// later; the kernel keeps `mtime` and the size.
pub const FUSE_WRITEBACK_CACHE: u64 = 1 << 16;
/// Kernel offer: an OPEN answered with ENOSYS means "no open needed".
pub const FUSE_NO_OPEN_SUPPORT: u64 = 1 << 17;
/// LOOKUP and READDIR of one directory may run in parallel.
pub const FUSE_PARALLEL_DIROPS: u64 = 1 << 18;
/// The daemon clears suid/sgid and capabilities on write, truncate and
/// chown.
pub const FUSE_HANDLE_KILLPRIV: u64 = 1 << 19;
/// The kernel enforces POSIX ACLs kept as `system.posix_acl_*` xattrs.
pub const FUSE_POSIX_ACL: u64 = 1 << 20;
/// Requests on an aborted connection fail with ECONNABORTED, not ENOTCONN.
pub const FUSE_ABORT_ERROR: u64 = 1 << 21;
/// `fuse_init_out.max_pages` is valid.
pub const FUSE_MAX_PAGES: u64 = 1 << 22;
/// The kernel caches READLINK answers in the page cache.
pub const FUSE_CACHE_SYMLINKS: u64 = 1 << 23;
/// Kernel offer: an OPENDIR answered with ENOSYS means "no opendir needed".
pub const FUSE_NO_OPENDIR_SUPPORT: u64 = 1 << 24;
/// Cached pages are dropped only when the daemon invalidates them
/// (not on a changed mtime or size).
pub const FUSE_EXPLICIT_INVAL_DATA: u64 = 1 << 25;
/// `fuse_init_out.map_alignment` is valid (DAX).
pub const FUSE_MAP_ALIGNMENT: u64 = 1 << 26;
/// Nodes with `FUSE_ATTR_SUBMOUNT` become automounted submounts (virtio-fs).
pub const FUSE_SUBMOUNTS: u64 = 1 << 27;
/// The daemon clears suid/sgid on write/chown/truncate (saves the
/// `security.capability` getxattr on every write).
pub const FUSE_HANDLE_KILLPRIV_V2: u64 = 1 << 28;
/// SETXATTR carries the 16-byte `fuse_setxattr_in`.
pub const FUSE_SETXATTR_EXT: u64 = 1 << 29;
/// `fuse_init_in`/`fuse_init_out` carry `flags2`.
pub const FUSE_INIT_EXT: u64 = 1 << 30;
/// Reserved, never set.
pub const FUSE_INIT_RESERVED: u64 = 1 << 31;
/// Creating requests carry the new node's security context as an extension.
pub const FUSE_SECURITY_CTX: u64 = 1 << 32;
/// DAX per inode (`FUSE_ATTR_DAX`).
pub const FUSE_HAS_INODE_DAX: u64 = 1 << 33;
/// Creating requests carry the caller's supplementary group as an
/// extension (`FUSE_EXT_GROUPS`), for set-group-id directories.
pub const FUSE_CREATE_SUPP_GROUP: u64 = 1 << 34;
/// Kernel offer: `FUSE_NOTIFY_INVAL_ENTRY` understands `FUSE_EXPIRE_ONLY`.
pub const FUSE_HAS_EXPIRE_ONLY: u64 = 1 << 35;
/// Shared `mmap` of files opened with `FOPEN_DIRECT_IO`.
pub const FUSE_DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
/// Obsolete alias of [`FUSE_DIRECT_IO_ALLOW_MMAP`].
pub const FUSE_DIRECT_IO_RELAX: u64 = FUSE_DIRECT_IO_ALLOW_MMAP;
/// Kernel passthrough of file data to backing files (7.40).
pub const FUSE_PASSTHROUGH: u64 = 1 << 37;
/// The file system cannot be exported over NFS (no file handles).
pub const FUSE_NO_EXPORT_SUPPORT: u64 = 1 << 38;
/// The kernel can resend pending requests (`FUSE_NOTIFY_RESEND`).
pub const FUSE_HAS_RESEND: u64 = 1 << 39;
/// Idmapped mounts.
pub const FUSE_ALLOW_IDMAP: u64 = 1 << 40;
/// FUSE over io_uring is available (informational).
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;
/// `fuse_init_out.request_timeout` is valid.
pub const FUSE_REQUEST_TIMEOUT: u64 = 1 << 42;

/// Kernel protocol version this crate speaks.
pub const FUSE_KERNEL_VERSION: u32 = 7;
/// Kernel protocol minor version this crate speaks.
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 45;
/// Node id of the root directory.
pub const FUSE_ROOT_ID: u64 = 1;
/// The smallest buffer a /dev/fuse read may be given.
pub const FUSE_MIN_READ_BUFFER: usize = 8192;
/// uid/gid the kernel sends when the caller's id has no mapping.
pub const FUSE_INVALID_UIDGID: u32 = u32::MAX;
/// Set in `fuse_in_header.unique` of a request the kernel resends.
pub const FUSE_UNIQUE_RESEND: u64 = 1 << 63;

/// CUSE INIT flag: unrestricted ioctls.
pub const CUSE_UNRESTRICTED_IOCTL: u32 = 1 << 0;

// --- fuse_setattr_in.valid ---
/// `mode` is set (chmod).
pub const FATTR_MODE: u32 = 1 << 0;
/// `uid` is set (chown).
pub const FATTR_UID: u32 = 1 << 1;
/// `gid` is set (chown, chgrp).
pub const FATTR_GID: u32 = 1 << 2;
/// `size` is set (truncate).
pub const FATTR_SIZE: u32 = 1 << 3;
/// `atime` is set.
pub const FATTR_ATIME: u32 = 1 << 4;
/// `mtime` is set.
pub const FATTR_MTIME: u32 = 1 << 5;
/// `fh` is set: the change came through an open file.
pub const FATTR_FH: u32 = 1 << 6;
/// Set `atime` to the current time.
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
/// Set `mtime` to the current time.
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
/// `lock_owner` is set.
pub const FATTR_LOCKOWNER: u32 = 1 << 9;
/// `ctime` is set.
pub const FATTR_CTIME: u32 = 1 << 10;
/// Clear suid and sgid too (with `FUSE_HANDLE_KILLPRIV_V2`).
pub const FATTR_KILL_SUIDGID: u32 = 1 << 11;

// --- fuse_open_out.open_flags ---
/// Bypass the page cache for this open.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// Keep the cached pages of the file at this open.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// The file is not seekable.
pub const FOPEN_NONSEEKABLE: u32 = 1 << 2;
/// The kernel may cache this directory's listing.
pub const FOPEN_CACHE_DIR: u32 = 1 << 3;
/// A stream: no file position, reads and writes ignore offsets.
pub const FOPEN_STREAM: u32 = 1 << 4;
/// No FLUSH at close of this open.
pub const FOPEN_NOFLUSH: u32 = 1 << 5;
/// Direct writes to this file may run in parallel (the inode lock is
/// not taken for them).
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
/// Data I/O goes to the backing file named by `fuse_open_out.backing_id`.
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;

// --- fuse_open_in.open_flags / fuse_create_in.open_flags ---
/// Clear suid and sgid at this open, which truncates (with
/// `FUSE_HANDLE_KILLPRIV_V2`).
pub const FUSE_OPEN_KILL_SUIDGID: u32 = 1 << 0;

// --- fuse_release_in.release_flags ---
/// Flush as part of this release.
pub const FUSE_RELEASE_FLUSH: u32 = 1 << 0;
/// Drop the `flock(2)` locks of `lock_owner`.
pub const FUSE_RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;

// --- fuse_getattr_in.getattr_flags ---
/// `fh` is set: an `fstat` on an open file.
pub const FUSE_GETATTR_FH: u32 = 1 << 0;

// --- fuse_lk_in.lk_flags ---
/// The lock request is `flock(2)`, not `fcntl(2)`.
pub const FUSE_LK_FLOCK: u32 = 1 << 0;

// --- fuse_write_in.write_flags ---
/// Delayed write from the page cache; the file handle is a guess.
pub const FUSE_WRITE_CACHE: u32 = 1 << 0;
/// `lock_owner` is set.
pub const FUSE_WRITE_LOCKOWNER: u32 = 1 << 1;
/// Clear suid and sgid (with `FUSE_HANDLE_KILLPRIV_V2`).
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// Obsolete alias of [`FUSE_WRITE_KILL_SUIDGID`].
pub const FUSE_WRITE_KILL_PRIV: u32 = FUSE_WRITE_KILL_SUIDGID;

// --- fuse_read_in.read_flags ---
/// `lock_owner` is set.
pub const FUSE_READ_LOCKOWNER: u32 = 1 << 1;

// --- fuse_ioctl_in.flags ---
/// A 32-bit compat ioctl on a 64-bit kernel.
pub const FUSE_IOCTL_COMPAT: u32 = 1 << 0;
/// Unrestricted: the daemon may ask for any buffers (CUSE only).
pub const FUSE_IOCTL_UNRESTRICTED: u32 = 1 << 1;
/// In the reply: retry with the buffers listed after it.
pub const FUSE_IOCTL_RETRY: u32 = 1 << 2;
/// The caller is a 32-bit process.
pub const FUSE_IOCTL_32BIT: u32 = 1 << 3;
/// The ioctl is on a directory.
pub const FUSE_IOCTL_DIR: u32 = 1 << 4;
/// The caller is an x32 process.
pub const FUSE_IOCTL_COMPAT_X32: u32 = 1 << 5;
/// Most buffers a retried ioctl may list.
pub const FUSE_IOCTL_MAX_IOV: u32 = 256;

// --- fuse_poll_in.flags ---
/// The caller will wait: send `FUSE_NOTIFY_POLL` with `kh` when the
/// file becomes ready.
pub const FUSE_POLL_SCHEDULE_NOTIFY: u32 = 1 << 0;

// --- fuse_fsync_in.fsync_flags ---
/// Sync the data only (`fdatasync(2)`).
pub const FUSE_FSYNC_FDATASYNC: u32 = 1 << 0;

// --- fuse_attr.flags ---
/// The node is the root of a submount.
pub const FUSE_ATTR_SUBMOUNT: u32 = 1 << 0;
/// Access the file through DAX.
pub const FUSE_ATTR_DAX: u32 = 1 << 1;

// --- fuse_setxattr_in.setxattr_flags ---
/// Clear sgid when a POSIX ACL is set.
pub const FUSE_SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

// --- fuse_notify_inval_entry_out.flags ---
/// Expire the entry instead of dropping it.
pub const FUSE_EXPIRE_ONLY: u32 = 1 << 0;

// --- fuse_setupmapping_in.flags ---
/// Map for writing.
pub const FUSE_SETUPMAPPING_FLAG_WRITE: u64 = 1 << 0;
/// Map for reading.
pub const FUSE_SETUPMAPPING_FLAG_READ: u64 = 1 << 1;

// --- request extensions (fuse_ext_header.type) ---
/// Types 0..=31 are security contexts (`fuse_secctx_header`).
pub const FUSE_MAX_NR_SECCTX: u32 = 31;
/// `fuse_supp_groups` extension.
pub const FUSE_EXT_GROUPS: u32 = 32;

/// Splits a 64-bit INIT flag set into the `flags` and `flags2` words.
pub const fn split_init_flags(flags: u64) -> (u32, u32) {
    (flags as u32, (flags >> 32) as u32)
}

/// Joins the `flags` and `flags2` words of an INIT message.
pub const fn join_init_flags(flags: u32, flags2: u32) -> u64 {
    (flags as u64) | ((flags2 as u64) << 32)
}

/// Names of the INIT flags, for logging negotiated sets.
pub static INIT_FLAG_NAMES: &[(u64, &str)] = &[
    (FUSE_ASYNC_READ, "ASYNC_READ"),
    (FUSE_POSIX_LOCKS, "POSIX_LOCKS"),
    (FUSE_FILE_OPS, "FILE_OPS"),
    (FUSE_ATOMIC_O_TRUNC, "ATOMIC_O_TRUNC"),
    (FUSE_EXPORT_SUPPORT, "EXPORT_SUPPORT"),
    (FUSE_BIG_WRITES, "BIG_WRITES"),
    (FUSE_DONT_MASK, "DONT_MASK"),
    (FUSE_SPLICE_WRITE, "SPLICE_WRITE"),
    (FUSE_SPLICE_MOVE, "SPLICE_MOVE"),
    (FUSE_SPLICE_READ, "SPLICE_READ"),
    (FUSE_FLOCK_LOCKS, "FLOCK_LOCKS"),
    (FUSE_HAS_IOCTL_DIR, "HAS_IOCTL_DIR"),
    (FUSE_AUTO_INVAL_DATA, "AUTO_INVAL_DATA"),
    (FUSE_DO_READDIRPLUS, "DO_READDIRPLUS"),
    (FUSE_READDIRPLUS_AUTO, "READDIRPLUS_AUTO"),
    (FUSE_ASYNC_DIO, "ASYNC_DIO"),
    (FUSE_WRITEBACK_CACHE, "WRITEBACK_CACHE"),
    (FUSE_NO_OPEN_SUPPORT, "NO_OPEN_SUPPORT"),
    (FUSE_PARALLEL_DIROPS, "PARALLEL_DIROPS"),
    (FUSE_HANDLE_KILLPRIV, "HANDLE_KILLPRIV"),
    (FUSE_POSIX_ACL, "POSIX_ACL"),
    (FUSE_ABORT_ERROR, "ABORT_ERROR"),
    (FUSE_MAX_PAGES, "MAX_PAGES"),
    (FUSE_CACHE_SYMLINKS, "CACHE_SYMLINKS"),
    (FUSE_NO_OPENDIR_SUPPORT, "NO_OPENDIR_SUPPORT"),
    (FUSE_EXPLICIT_INVAL_DATA, "EXPLICIT_INVAL_DATA"),
    (FUSE_MAP_ALIGNMENT, "MAP_ALIGNMENT"),
    (FUSE_SUBMOUNTS, "SUBMOUNTS"),
    (FUSE_HANDLE_KILLPRIV_V2, "HANDLE_KILLPRIV_V2"),
    (FUSE_SETXATTR_EXT, "SETXATTR_EXT"),
    (FUSE_INIT_EXT, "INIT_EXT"),
    (FUSE_INIT_RESERVED, "INIT_RESERVED"),
    (FUSE_SECURITY_CTX, "SECURITY_CTX"),
    (FUSE_HAS_INODE_DAX, "HAS_INODE_DAX"),
    (FUSE_CREATE_SUPP_GROUP, "CREATE_SUPP_GROUP"),
    (FUSE_HAS_EXPIRE_ONLY, "HAS_EXPIRE_ONLY"),
    (FUSE_DIRECT_IO_ALLOW_MMAP, "DIRECT_IO_ALLOW_MMAP"),
    (FUSE_PASSTHROUGH, "PASSTHROUGH"),
    (FUSE_NO_EXPORT_SUPPORT, "NO_EXPORT_SUPPORT"),
    (FUSE_HAS_RESEND, "HAS_RESEND"),
    (FUSE_ALLOW_IDMAP, "ALLOW_IDMAP"),
    (FUSE_OVER_IO_URING, "OVER_IO_URING"),
    (FUSE_REQUEST_TIMEOUT, "REQUEST_TIMEOUT"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_flags_split_and_join() {
        assert_eq!(FUSE_OVER_IO_URING, 1 << 41);
        assert_eq!(split_init_flags(FUSE_OVER_IO_URING | FUSE_ASYNC_READ), (1, 1 << 9));
        assert_eq!(join_init_flags(1, 1 << 5), FUSE_ASYNC_READ | FUSE_PASSTHROUGH);
        let mut seen = 0u64;
        for &(bit, name) in INIT_FLAG_NAMES {
            assert_eq!(bit.count_ones(), 1, "{name}");
            assert_eq!(seen & bit, 0, "{name} listed twice");
            seen |= bit;
        }
    }
}
