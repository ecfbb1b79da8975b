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
    pub struct fuse_attr {
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub rdev: u32,
        pub blksize: u32,
        /// `FUSE_ATTR_*`.
        pub flags: u32,
    }
}

wire! {
    /// Same layout as `statx(2)`'s `struct statx_timestamp`.
    pub struct fuse_sx_time { pub tv_sec: i64, pub tv_nsec: u32, pub reserved: i32 }
}

wire! {
    /// Same layout as `statx(2)`'s `struct statx`.
    pub struct fuse_statx {
        pub mask: u32,
        pub blksize: u32,
        pub attributes: u64,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub mode: u16,
        pub spare0: [u16; 1],
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub attributes_mask: u64,
        pub atime: fuse_sx_time,
        pub btime: fuse_sx_time,
        pub ctime: fuse_sx_time,
        pub mtime: fuse_sx_time,
        pub rdev_major: u32,
        pub rdev_minor: u32,
        pub dev_major: u32,
        pub dev_minor: u32,
        pub spare2: [u64; 14],
    }
}

wire! {
    pub struct fuse_kstatfs {
        pub blocks: u64,
        pub bfree: u64,
        pub bavail: u64,
        pub files: u64,
        pub ffree: u64,
        pub bsize: u32,
        pub namelen: u32,
        pub frsize: u32,
        pub padding: u32,
        pub spare: [u32; 6],
    }
}

/// `fuse_entry_out` size before 7.9.
pub const FUSE_COMPAT_ENTRY_OUT_SIZE: usize = 120;
wire! {
    /// LOOKUP, MKNOD, MKDIR, SYMLINK, LINK, and the first half of CREATE.
    pub struct fuse_entry_out {
        pub nodeid: u64,
        /// nodeid:generation must be unique for the file system's lifetime.
        pub generation: u64,
        /// Cache timeout of the name (seconds + `entry_valid_nsec`).
        pub entry_valid: u64,
        /// Cache timeout of the attributes.
        pub attr_valid: u64,
        pub entry_valid_nsec: u32,
        pub attr_valid_nsec: u32,
        pub attr: fuse_attr,
    }
}

/// `fuse_attr_out` size before 7.9.
pub const FUSE_COMPAT_ATTR_OUT_SIZE: usize = 96;
wire! {
    pub struct fuse_attr_out { pub attr_valid: u64, pub attr_valid_nsec: u32, pub dummy: u32, pub attr: fuse_attr }
}

wire! {
    pub struct fuse_statx_out {
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub flags: u32,
        pub spare: [u64; 2],
        pub stat: fuse_statx,
    }
}

wire! {
    /// OPEN, OPENDIR, and the second half of CREATE.
    pub struct fuse_open_out {
        pub fh: u64,
        /// `FOPEN_*`.
        pub open_flags: u32,
        /// With `FOPEN_PASSTHROUGH`: the id from `FUSE_DEV_IOC_BACKING_OPEN`.
        pub backing_id: i32,
    }
}

wire! { pub struct fuse_write_out { pub size: u32, pub padding: u32 } }

/// `fuse_statfs_out` size before 7.4.
pub const FUSE_COMPAT_STATFS_SIZE: usize = 48;
wire! { pub struct fuse_statfs_out { pub st: fuse_kstatfs } }

wire! { pub struct fuse_getxattr_out { pub size: u32, pub padding: u32 } }
wire! { pub struct fuse_lk_out { pub lk: fuse_file_lock } }

/// `fuse_init_out` size before 7.5.
pub const FUSE_COMPAT_INIT_OUT_SIZE: usize = 8;
/// `fuse_init_out` size before 7.23.
pub const FUSE_COMPAT_22_INIT_OUT_SIZE: usize = 24;
wire! {
    pub struct fuse_init_out {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub max_background: u16,
        pub congestion_threshold: u16,
        pub max_write: u32,
        /// Timestamp granularity in nanoseconds.
        pub time_gran: u32,
        /// With `FUSE_MAX_PAGES`: most pages in one request.
        pub max_pages: u16,
        pub map_alignment: u16,
        pub flags2: u32,
        /// With `FUSE_PASSTHROUGH`: stacking depth of backing files (1 or 2).
        pub max_stack_depth: u32,
        /// With `FUSE_REQUEST_TIMEOUT`: seconds before the kernel aborts.
        pub request_timeout: u16,
        pub unused: [u16; 11],
    }
}

wire! {
    pub struct cuse_init_out {
        pub major: u32,
        pub minor: u32,
        pub unused: u32,
        pub flags: u32,
        pub max_read: u32,
        pub max_write: u32,
        pub dev_major: u32,
        pub dev_minor: u32,
        pub spare: [u32; 10],
    }
}

wire! { pub struct fuse_bmap_out { pub block: u64 } }
wire! { pub struct fuse_ioctl_out { pub result: i32, pub flags: u32, pub in_iovs: u32, pub out_iovs: u32 } }
wire! { pub struct fuse_poll_out { pub revents: u32, pub padding: u32 } }
wire! { pub struct fuse_lseek_out { pub offset: u64 } }
wire! { pub struct fuse_copy_file_range_out { pub bytes_copied: u64 } }

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
