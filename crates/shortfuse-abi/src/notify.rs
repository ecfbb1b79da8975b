//! Notifications: messages the daemon sends unasked. They start with a
//! `fuse_out_header` whose `unique` is 0 and whose `error` is the code.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::request::wire;

/// Wake the callers polling a file: it may be ready now.
pub const FUSE_NOTIFY_POLL: u32 = 1;
/// Drop cached attributes and a range of cached pages of a node.
pub const FUSE_NOTIFY_INVAL_INODE: u32 = 2;
/// Drop a cached name (and, with `FUSE_EXPIRE_ONLY`, only expire it).
pub const FUSE_NOTIFY_INVAL_ENTRY: u32 = 3;
/// Place data in a node's page cache.
pub const FUSE_NOTIFY_STORE: u32 = 4;
/// Ask for data from a node's page cache; the kernel answers with
/// `FUSE_NOTIFY_REPLY`.
pub const FUSE_NOTIFY_RETRIEVE: u32 = 5;
/// A name was deleted: drop it and tell `inotify` watchers.
pub const FUSE_NOTIFY_DELETE: u32 = 6;
/// Ask the kernel to resend every pending request (no payload).
pub const FUSE_NOTIFY_RESEND: u32 = 7;
/// Bump the connection epoch: dentries from older epochs are invalid (no payload).
pub const FUSE_NOTIFY_INC_EPOCH: u32 = 8;

wire! {
    /// `FUSE_NOTIFY_POLL`.
    pub struct fuse_notify_poll_wakeup_out {
        /// The `kh` of the POLL request that asked to be woken.
        pub kh: u64,
    }
}

wire! {
    /// `FUSE_NOTIFY_INVAL_INODE`. Negative `off`: attributes only; `len`
    /// 0: to the end of the file.
    pub struct fuse_notify_inval_inode_out {
        /// The node.
        pub ino: u64,
        /// First byte of the cached pages to drop.
        pub off: i64,
        /// Bytes to drop.
        pub len: i64,
    }
}

wire! {
    /// `FUSE_NOTIFY_INVAL_ENTRY`: followed by the name and a NUL byte.
    pub struct fuse_notify_inval_entry_out {
        /// The directory.
        pub parent: u64,
        /// Bytes of the name, NUL excluded.
        pub namelen: u32,
        /// `FUSE_EXPIRE_ONLY`: mark the entry stale rather than drop it.
        pub flags: u32,
    }
}

wire! {
    /// `FUSE_NOTIFY_DELETE`: followed by the name and a NUL byte.
    pub struct fuse_notify_delete_out {
        /// The directory.
        pub parent: u64,
        /// The node the name led to.
        pub child: u64,
        /// Bytes of the name, NUL excluded.
        pub namelen: u32,
        /// Zero.
        pub padding: u32,
    }
}

wire! {
    /// `FUSE_NOTIFY_STORE`: followed by `size` bytes of data to place in
    /// the page cache.
    pub struct fuse_notify_store_out {
        /// The node.
        pub nodeid: u64,
        /// Where the data goes in the file.
        pub offset: u64,
        /// Bytes that follow.
        pub size: u32,
        /// Zero.
        pub padding: u32,
    }
}

wire! {
    /// `FUSE_NOTIFY_RETRIEVE`.
    pub struct fuse_notify_retrieve_out {
        /// Chosen by the daemon; the `unique` of the kernel's
        /// `FUSE_NOTIFY_REPLY`.
        pub notify_unique: u64,
        /// The node.
        pub nodeid: u64,
        /// First byte wanted.
        pub offset: u64,
        /// Bytes wanted.
        pub size: u32,
        /// Zero.
        pub padding: u32,
    }
}

wire! {
    /// The argument of `FUSE_NOTIFY_REPLY`, followed by the data. Matches
    /// the size of `fuse_write_in` so the kernel can reuse its paths.
    pub struct fuse_notify_retrieve_in {
        /// Unused.
        pub dummy1: u64,
        /// Where the data starts in the file.
        pub offset: u64,
        /// Bytes of data that follow (only what was cached).
        pub size: u32,
        /// Unused.
        pub dummy2: u32,
        /// Unused.
        pub dummy3: u64,
        /// Unused.
        pub dummy4: u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(size_of::<fuse_notify_poll_wakeup_out>(), 8);
        assert_eq!(size_of::<fuse_notify_inval_inode_out>(), 24);
        assert_eq!(size_of::<fuse_notify_inval_entry_out>(), 16);
        assert_eq!(size_of::<fuse_notify_delete_out>(), 24);
        assert_eq!(size_of::<fuse_notify_store_out>(), 24);
        assert_eq!(size_of::<fuse_notify_retrieve_out>(), 32);
        assert_eq!(size_of::<fuse_notify_retrieve_in>(), 40);
        assert_eq!(offset_of!(fuse_notify_inval_inode_out, off), 8);
        assert_eq!(offset_of!(fuse_notify_inval_inode_out, len), 16);
        assert_eq!(offset_of!(fuse_notify_inval_entry_out, namelen), 8);
        assert_eq!(offset_of!(fuse_notify_inval_entry_out, flags), 12);
        assert_eq!(offset_of!(fuse_notify_delete_out, child), 8);
        assert_eq!(offset_of!(fuse_notify_delete_out, namelen), 16);
        assert_eq!(offset_of!(fuse_notify_store_out, size), 16);
        assert_eq!(offset_of!(fuse_notify_retrieve_out, offset), 16);
        assert_eq!(offset_of!(fuse_notify_retrieve_out, size), 24);
        assert_eq!(offset_of!(fuse_notify_retrieve_in, size), 16);
        assert_eq!(offset_of!(fuse_notify_retrieve_in, dummy3), 24);
    }
}
