//! Notifications: messages the daemon sends unasked. They start with a
//! `fuse_out_header` whose `unique` is 0 and whose `error` is the code.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::request::wire;

pub const FUSE_NOTIFY_POLL: u32 = 1;
pub const FUSE_NOTIFY_INVAL_INODE: u32 = 2;
pub const FUSE_NOTIFY_INVAL_ENTRY: u32 = 3;
pub const FUSE_NOTIFY_STORE: u32 = 4;
pub const FUSE_NOTIFY_RETRIEVE: u32 = 5;
pub const FUSE_NOTIFY_DELETE: u32 = 6;
/// Ask the kernel to resend every pending request (no payload).
pub const FUSE_NOTIFY_RESEND: u32 = 7;
/// Bump the connection epoch: dentries from older epochs are invalid (no payload).
pub const FUSE_NOTIFY_INC_EPOCH: u32 = 8;

wire! { pub struct fuse_notify_poll_wakeup_out { pub kh: u64 } }

wire! {
    /// Negative `off`: attributes only; `len` 0: to the end of the file.
    pub struct fuse_notify_inval_inode_out { pub ino: u64, pub off: i64, pub len: i64 }
}

wire! {
    /// Followed by the name and a NUL byte.
    pub struct fuse_notify_inval_entry_out { pub parent: u64, pub namelen: u32, pub flags: u32 }
}

wire! {
    /// Followed by the name and a NUL byte.
    pub struct fuse_notify_delete_out { pub parent: u64, pub child: u64, pub namelen: u32, pub padding: u32 }
}

wire! {
    /// Followed by `size` bytes of data to place in the page cache.
    pub struct fuse_notify_store_out { pub nodeid: u64, pub offset: u64, pub size: u32, pub padding: u32 }
}

wire! {
    pub struct fuse_notify_retrieve_out {
        pub notify_unique: u64,
        pub nodeid: u64,
        pub offset: u64,
        pub size: u32,
        pub padding: u32,
    }
}

wire! {
    /// The argument of `FUSE_NOTIFY_REPLY`, followed by the data. Matches
    /// the size of `fuse_write_in` so the kernel can reuse its paths.
    pub struct fuse_notify_retrieve_in {
        pub dummy1: u64,
        pub offset: u64,
        pub size: u32,
        pub dummy2: u32,
        pub dummy3: u64,
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
