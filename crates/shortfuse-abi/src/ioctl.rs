//! ioctls on /dev/fuse: cloning a session fd and kernel passthrough backing
//! files (7.40, Linux 6.9+).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::request::wire;

wire! {
    /// Argument of `FUSE_DEV_IOC_BACKING_OPEN`; `flags` and `padding` must be 0.
    pub struct fuse_backing_map {
        /// The backing file's descriptor in the daemon.
        pub fd: i32,
        /// Zero.
        pub flags: u32,
        /// Zero.
        pub padding: u64,
    }
}

/// ioctl type byte of /dev/fuse.
pub const FUSE_DEV_IOC_MAGIC: u32 = 229;

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// Linux `_IOC(dir, type, nr, size)` on x86, arm and riscv (asm-generic).
const fn ioc(dir: u32, typ: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (typ << 8) | nr
}

/// `_IOR(229, 0, uint32_t)`: attach a fresh /dev/fuse fd to the session of
/// the fd whose number is passed; each worker reads its own clone.
pub const FUSE_DEV_IOC_CLONE: u32 = ioc(IOC_READ, FUSE_DEV_IOC_MAGIC, 0, 4);
/// `_IOW(229, 1, struct fuse_backing_map)`: returns a backing id > 0.
pub const FUSE_DEV_IOC_BACKING_OPEN: u32 = ioc(
    IOC_WRITE,
    FUSE_DEV_IOC_MAGIC,
    1,
    core::mem::size_of::<fuse_backing_map>(),
);
/// `_IOW(229, 2, uint32_t)`: drops a backing id.
pub const FUSE_DEV_IOC_BACKING_CLOSE: u32 = ioc(IOC_WRITE, FUSE_DEV_IOC_MAGIC, 2, 4);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_the_kernel() {
        assert_eq!(core::mem::size_of::<fuse_backing_map>(), 16);
        assert_eq!(core::mem::offset_of!(fuse_backing_map, padding), 8);
        assert_eq!(FUSE_DEV_IOC_CLONE, 0x8004_e500);
        assert_eq!(FUSE_DEV_IOC_BACKING_OPEN, 0x4010_e501);
        assert_eq!(FUSE_DEV_IOC_BACKING_CLOSE, 0x4004_e502);
    }
}
