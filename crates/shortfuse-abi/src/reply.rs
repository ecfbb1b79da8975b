//! Reply structs (`struct fuse_*_out`) that follow `fuse_out_header`.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::request::{fuse_file_lock, wire};

wire! {
    /// Precedes every reply and notification.
    pub struct fuse_out_header {
        /// Whole message length, header included.
        pub len: u32,
        /// 0 or a negated errno; a notification code for notifications.
        pub error: i32,
        /// The request's `unique`; 0 for notifications.
        pub unique: u64,
    }
}

wire! {
    /// A node's attributes, as `stat(2)` reports them.
    pub struct fuse_attr {
        /// Inode number shown as `st_ino` (not necessarily the node id).
        pub ino: u64,
        /// Size in bytes.
        pub size: u64,
        /// 512-byte blocks allocated.
        pub blocks: u64,
        /// Last access, seconds since the epoch.
        pub atime: u64,
        /// Last data change, seconds since the epoch.
        pub mtime: u64,
        /// Last status change, seconds since the epoch.
        pub ctime: u64,
        /// Nanoseconds of `atime`.
        pub atimensec: u32,
        /// Nanoseconds of `mtime`.
        pub mtimensec: u32,
        /// Nanoseconds of `ctime`.
        pub ctimensec: u32,
        /// File type and permission bits (`st_mode`).
        pub mode: u32,
        /// Hard links.
        pub nlink: u32,
        /// Owner's user id.
        pub uid: u32,
        /// Owner's group id.
        pub gid: u32,
        /// Device number of a device file.
        pub rdev: u32,
        /// Preferred I/O size (`st_blksize`); 0 lets the kernel pick.
        pub blksize: u32,
        /// `FUSE_ATTR_*`.
        pub flags: u32,
    }
}

wire! {
    /// Same layout as `statx(2)`'s `struct statx_timestamp`.
    pub struct fuse_sx_time {
        /// Seconds since the epoch.
        pub tv_sec: i64,
        /// Nanoseconds.
        pub tv_nsec: u32,
        /// Zero.
        pub reserved: i32,
    }
}

wire! {
    /// Same layout as `statx(2)`'s `struct statx`.
    pub struct fuse_statx {
        /// `STATX_*` bits of the fields filled in.
        pub mask: u32,
        /// Preferred I/O size.
        pub blksize: u32,
        /// `STATX_ATTR_*` flags.
        pub attributes: u64,
        /// Hard links.
        pub nlink: u32,
        /// Owner's user id.
        pub uid: u32,
        /// Owner's group id.
        pub gid: u32,
        /// File type and permission bits.
        pub mode: u16,
        /// Zero.
        pub spare0: [u16; 1],
        /// Inode number shown to programs.
        pub ino: u64,
        /// Size in bytes.
        pub size: u64,
        /// 512-byte blocks allocated.
        pub blocks: u64,
        /// The `STATX_ATTR_*` bits `attributes` can report.
        pub attributes_mask: u64,
        /// Last access.
        pub atime: fuse_sx_time,
        /// Creation (birth).
        pub btime: fuse_sx_time,
        /// Last status change.
        pub ctime: fuse_sx_time,
        /// Last data change.
        pub mtime: fuse_sx_time,
        /// Major device number of a device file.
        pub rdev_major: u32,
        /// Minor device number of a device file.
        pub rdev_minor: u32,
        /// Major number of the device the file lives on.
        pub dev_major: u32,
        /// Minor number of the device the file lives on.
        pub dev_minor: u32,
        /// Zero.
        pub spare2: [u64; 14],
    }
}

wire! {
    /// The file system's figures, as `statfs(2)` reports them.
    pub struct fuse_kstatfs {
        /// Total blocks of `frsize` bytes.
        pub blocks: u64,
        /// Free blocks.
        pub bfree: u64,
        /// Free blocks unprivileged users may use.
        pub bavail: u64,
        /// Total inodes.
        pub files: u64,
        /// Free inodes.
        pub ffree: u64,
        /// Preferred I/O block size.
        pub bsize: u32,
        /// Longest file name.
        pub namelen: u32,
        /// Fragment size: the unit of `blocks`.
        pub frsize: u32,
        /// Zero.
        pub padding: u32,
        /// Zero.
        pub spare: [u32; 6],
    }
}

/// `fuse_entry_out` size before 7.9.
pub const FUSE_COMPAT_ENTRY_OUT_SIZE: usize = 120;
wire! {
    /// LOOKUP, MKNOD, MKDIR, SYMLINK, LINK, and the first half of CREATE.
    pub struct fuse_entry_out {
        /// The node's id in later requests; 0 in a LOOKUP reply caches a
        /// negative entry for `entry_valid`.
        pub nodeid: u64,
        /// nodeid:generation must be unique for the file system's lifetime.
        pub generation: u64,
        /// Cache timeout of the name (seconds + `entry_valid_nsec`).
        pub entry_valid: u64,
        /// Cache timeout of the attributes.
        pub attr_valid: u64,
        /// Nanoseconds of `entry_valid`.
        pub entry_valid_nsec: u32,
        /// Nanoseconds of `attr_valid`.
        pub attr_valid_nsec: u32,
        /// The node's attributes.
        pub attr: fuse_attr,
    }
}

/// `fuse_attr_out` size before 7.9.
pub const FUSE_COMPAT_ATTR_OUT_SIZE: usize = 96;
wire! {
    /// GETATTR and SETATTR.
    pub struct fuse_attr_out {
        /// Cache timeout of the attributes, seconds.
        pub attr_valid: u64,
        /// Nanoseconds of `attr_valid`.
        pub attr_valid_nsec: u32,
        /// Zero.
        pub dummy: u32,
        /// The node's attributes.
        pub attr: fuse_attr,
    }
}

wire! {
    /// STATX.
    pub struct fuse_statx_out {
        /// Cache timeout of the attributes, seconds.
        pub attr_valid: u64,
        /// Nanoseconds of `attr_valid`.
        pub attr_valid_nsec: u32,
        /// Zero (no flags defined yet).
        pub flags: u32,
        /// Zero.
        pub spare: [u64; 2],
        /// The node's attributes.
        pub stat: fuse_statx,
    }
}

wire! {
    /// OPEN, OPENDIR, and the second half of CREATE.
    pub struct fuse_open_out {
        /// File handle the kernel passes back with every request on this open.
        pub fh: u64,
        /// `FOPEN_*`.
        pub open_flags: u32,
        /// With `FOPEN_PASSTHROUGH`: the id from `FUSE_DEV_IOC_BACKING_OPEN`.
        pub backing_id: i32,
    }
}

wire! {
    /// WRITE.
    pub struct fuse_write_out {
        /// Bytes written.
        pub size: u32,
        /// Zero.
        pub padding: u32,
    }
}

/// `fuse_statfs_out` size before 7.4.
pub const FUSE_COMPAT_STATFS_SIZE: usize = 48;
wire! {
    /// STATFS.
    pub struct fuse_statfs_out {
        /// The figures.
        pub st: fuse_kstatfs,
    }
}

wire! {
    /// GETXATTR and LISTXATTR asked with size 0.
    pub struct fuse_getxattr_out {
        /// Bytes the value (or the list of names) takes.
        pub size: u32,
        /// Zero.
        pub padding: u32,
    }
}
wire! {
    /// GETLK.
    pub struct fuse_lk_out {
        /// A lock that conflicts with the one asked about, or that one
        /// with type `F_UNLCK` when none does.
        pub lk: fuse_file_lock,
    }
}

/// `fuse_init_out` size before 7.5.
pub const FUSE_COMPAT_INIT_OUT_SIZE: usize = 8;
/// `fuse_init_out` size before 7.23.
pub const FUSE_COMPAT_22_INIT_OUT_SIZE: usize = 24;
wire! {
    /// INIT: what the daemon accepts of the kernel's offer.
    pub struct fuse_init_out {
        /// Protocol major version (7).
        pub major: u32,
        /// Protocol minor version the daemon speaks.
        pub minor: u32,
        /// Largest read-ahead, bytes.
        pub max_readahead: u32,
        /// `FUSE_*` capability bits accepted (the low 32).
        pub flags: u32,
        /// Most background requests (read-ahead, write-back) in flight.
        pub max_background: u16,
        /// Background requests in flight at which the connection counts
        /// as congested.
        pub congestion_threshold: u16,
        /// Largest WRITE payload, bytes.
        pub max_write: u32,
        /// Timestamp granularity in nanoseconds.
        pub time_gran: u32,
        /// With `FUSE_MAX_PAGES`: most pages in one request.
        pub max_pages: u16,
        /// With `FUSE_MAP_ALIGNMENT`: log2 of the DAX mapping alignment.
        pub map_alignment: u16,
        /// `FUSE_*` capability bits accepted, the high 32 (with `FUSE_INIT_EXT`).
        pub flags2: u32,
        /// With `FUSE_PASSTHROUGH`: stacking depth of backing files (1 or 2).
        pub max_stack_depth: u32,
        /// With `FUSE_REQUEST_TIMEOUT`: seconds before the kernel aborts.
        pub request_timeout: u16,
        /// Zero.
        pub unused: [u16; 11],
    }
}

wire! {
    /// CUSE_INIT: a character device served from user space.
    pub struct cuse_init_out {
        /// Protocol major version (7).
        pub major: u32,
        /// Protocol minor version.
        pub minor: u32,
        /// Zero.
        pub unused: u32,
        /// `CUSE_*` bits.
        pub flags: u32,
        /// Largest READ, bytes.
        pub max_read: u32,
        /// Largest WRITE, bytes.
        pub max_write: u32,
        /// Major number of the device to create.
        pub dev_major: u32,
        /// Minor number of the device to create.
        pub dev_minor: u32,
        /// Zero.
        pub spare: [u32; 10],
    }
}

wire! {
    /// BMAP.
    pub struct fuse_bmap_out {
        /// The device block that holds the file's block.
        pub block: u64,
    }
}
wire! {
    /// IOCTL.
    pub struct fuse_ioctl_out {
        /// The ioctl's return value.
        pub result: i32,
        /// `FUSE_IOCTL_RETRY` to have the kernel retry with the iovecs that follow.
        pub flags: u32,
        /// With `FUSE_IOCTL_RETRY`: input iovecs that follow.
        pub in_iovs: u32,
        /// With `FUSE_IOCTL_RETRY`: output iovecs that follow the input ones.
        pub out_iovs: u32,
    }
}
wire! {
    /// POLL.
    pub struct fuse_poll_out {
        /// Ready events (`POLL*` bits).
        pub revents: u32,
        /// Zero.
        pub padding: u32,
    }
}
wire! {
    /// LSEEK.
    pub struct fuse_lseek_out {
        /// The offset found.
        pub offset: u64,
    }
}
wire! {
    /// COPY_FILE_RANGE_64.
    pub struct fuse_copy_file_range_out {
        /// Bytes copied.
        pub bytes_copied: u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn sizes_match_the_kernel() {
        assert_eq!(size_of::<fuse_out_header>(), 16);
        assert_eq!(size_of::<fuse_attr>(), 88);
        assert_eq!(size_of::<fuse_sx_time>(), 16);
        assert_eq!(size_of::<fuse_statx>(), 256);
        assert_eq!(size_of::<fuse_kstatfs>(), 80);
        assert_eq!(size_of::<fuse_entry_out>(), 128);
        assert_eq!(size_of::<fuse_attr_out>(), 104);
        assert_eq!(size_of::<fuse_statx_out>(), 288);
        assert_eq!(size_of::<fuse_open_out>(), 16);
        assert_eq!(size_of::<fuse_write_out>(), 8);
        assert_eq!(size_of::<fuse_statfs_out>(), 80);
        assert_eq!(size_of::<fuse_getxattr_out>(), 8);
        assert_eq!(size_of::<fuse_lk_out>(), 24);
        assert_eq!(size_of::<fuse_init_out>(), 64);
        assert_eq!(size_of::<cuse_init_out>(), 72);
        assert_eq!(size_of::<fuse_bmap_out>(), 8);
        assert_eq!(size_of::<fuse_ioctl_out>(), 16);
        assert_eq!(size_of::<fuse_poll_out>(), 8);
        assert_eq!(size_of::<fuse_lseek_out>(), 8);
        assert_eq!(size_of::<fuse_copy_file_range_out>(), 8);
    }

    #[test]
    fn offsets_match_the_kernel() {
        assert_eq!(offset_of!(fuse_out_header, error), 4);
        assert_eq!(offset_of!(fuse_out_header, unique), 8);
        assert_eq!(offset_of!(fuse_attr, blocks), 16);
        assert_eq!(offset_of!(fuse_attr, atime), 24);
        assert_eq!(offset_of!(fuse_attr, ctime), 40);
        assert_eq!(offset_of!(fuse_attr, atimensec), 48);
        assert_eq!(offset_of!(fuse_attr, mode), 60);
        assert_eq!(offset_of!(fuse_attr, nlink), 64);
        assert_eq!(offset_of!(fuse_attr, uid), 68);
        assert_eq!(offset_of!(fuse_attr, gid), 72);
        assert_eq!(offset_of!(fuse_attr, rdev), 76);
        assert_eq!(offset_of!(fuse_attr, blksize), 80);
        assert_eq!(offset_of!(fuse_attr, flags), 84);
        assert_eq!(offset_of!(fuse_statx, attributes), 8);
        assert_eq!(offset_of!(fuse_statx, nlink), 16);
        assert_eq!(offset_of!(fuse_statx, mode), 28);
        assert_eq!(offset_of!(fuse_statx, ino), 32);
        assert_eq!(offset_of!(fuse_statx, attributes_mask), 56);
        assert_eq!(offset_of!(fuse_statx, atime), 64);
        assert_eq!(offset_of!(fuse_statx, mtime), 112);
        assert_eq!(offset_of!(fuse_statx, rdev_major), 128);
        assert_eq!(offset_of!(fuse_statx, spare2), 144);
        assert_eq!(offset_of!(fuse_kstatfs, bsize), 40);
        assert_eq!(offset_of!(fuse_kstatfs, namelen), 44);
        assert_eq!(offset_of!(fuse_kstatfs, frsize), 48);
        assert_eq!(offset_of!(fuse_kstatfs, spare), 56);
        assert_eq!(offset_of!(fuse_entry_out, entry_valid), 16);
        assert_eq!(offset_of!(fuse_entry_out, attr_valid), 24);
        assert_eq!(offset_of!(fuse_entry_out, entry_valid_nsec), 32);
        assert_eq!(offset_of!(fuse_entry_out, attr_valid_nsec), 36);
        assert_eq!(offset_of!(fuse_entry_out, attr), 40);
        assert_eq!(offset_of!(fuse_attr_out, attr_valid_nsec), 8);
        assert_eq!(offset_of!(fuse_attr_out, attr), 16);
        assert_eq!(offset_of!(fuse_statx_out, flags), 12);
        assert_eq!(offset_of!(fuse_statx_out, stat), 32);
        assert_eq!(offset_of!(fuse_open_out, open_flags), 8);
        assert_eq!(offset_of!(fuse_open_out, backing_id), 12);
        assert_eq!(offset_of!(fuse_init_out, max_background), 16);
        assert_eq!(offset_of!(fuse_init_out, congestion_threshold), 18);
        assert_eq!(offset_of!(fuse_init_out, max_write), 20);
        assert_eq!(offset_of!(fuse_init_out, time_gran), 24);
        assert_eq!(offset_of!(fuse_init_out, max_pages), 28);
        assert_eq!(offset_of!(fuse_init_out, map_alignment), 30);
        assert_eq!(offset_of!(fuse_init_out, flags2), 32);
        assert_eq!(offset_of!(fuse_init_out, max_stack_depth), 36);
        assert_eq!(offset_of!(fuse_init_out, request_timeout), 40);
        assert_eq!(offset_of!(fuse_init_out, unused), 42);
        assert_eq!(offset_of!(cuse_init_out, max_read), 16);
        assert_eq!(offset_of!(cuse_init_out, dev_minor), 28);
        assert_eq!(offset_of!(fuse_ioctl_out, in_iovs), 8);
    }
}
