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
        pub opcode: u32,
        pub unique: u64,
        pub nodeid: u64,
        pub uid: u32,
        pub gid: u32,
        pub pid: u32,
        /// Length of request extensions at the end, in 8-byte units.
        pub total_extlen: u16,
        pub padding: u16,
    }
}

wire! {
    pub struct fuse_file_lock {
        pub start: u64,
        pub end: u64,
        pub typ: u32,
        /// tgid of the lock holder.
        pub pid: u32,
    }
}

wire! { pub struct fuse_forget_in { pub nlookup: u64 } }
wire! { pub struct fuse_forget_one { pub nodeid: u64, pub nlookup: u64 } }
wire! { pub struct fuse_batch_forget_in { pub count: u32, pub dummy: u32 } }
wire! { pub struct fuse_getattr_in { pub getattr_flags: u32, pub dummy: u32, pub fh: u64 } }

/// Short form of `fuse_mknod_in` used before 7.12.
pub const FUSE_COMPAT_MKNOD_IN_SIZE: usize = 8;
wire! { pub struct fuse_mknod_in { pub mode: u32, pub rdev: u32, pub umask: u32, pub padding: u32 } }
wire! { pub struct fuse_mkdir_in { pub mode: u32, pub umask: u32 } }
wire! { pub struct fuse_rename_in { pub newdir: u64 } }
wire! { pub struct fuse_rename2_in { pub newdir: u64, pub flags: u32, pub padding: u32 } }
wire! { pub struct fuse_link_in { pub oldnodeid: u64 } }

wire! {
    pub struct fuse_setattr_in {
        /// `FATTR_*` bits saying which fields are set.
        pub valid: u32,
        pub padding: u32,
        pub fh: u64,
        pub size: u64,
        pub lock_owner: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub unused4: u32,
        pub uid: u32,
        pub gid: u32,
        pub unused5: u32,
    }
}

wire! { pub struct fuse_open_in { pub flags: u32, pub open_flags: u32 } }
wire! { pub struct fuse_create_in { pub flags: u32, pub mode: u32, pub umask: u32, pub open_flags: u32 } }
wire! { pub struct fuse_release_in { pub fh: u64, pub flags: u32, pub release_flags: u32, pub lock_owner: u64 } }
wire! { pub struct fuse_flush_in { pub fh: u64, pub unused: u32, pub padding: u32, pub lock_owner: u64 } }

wire! {
    /// READ, READDIR and READDIRPLUS.
    pub struct fuse_read_in {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub read_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }
}

/// Short form of `fuse_write_in` used before 7.9.
pub const FUSE_COMPAT_WRITE_IN_SIZE: usize = 24;
wire! {
    /// Followed by `size` bytes of data.
    pub struct fuse_write_in {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub write_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }
}

wire! { pub struct fuse_fsync_in { pub fh: u64, pub fsync_flags: u32, pub padding: u32 } }

/// Size of `fuse_setxattr_in` unless `FUSE_SETXATTR_EXT` was negotiated.
pub const FUSE_COMPAT_SETXATTR_IN_SIZE: usize = 8;
wire! {
    /// The 16-byte form (with `FUSE_SETXATTR_EXT`); without it only `size`
    /// and `flags` travel.
    pub struct fuse_setxattr_in { pub size: u32, pub flags: u32, pub setxattr_flags: u32, pub padding: u32 }
}
wire! { pub struct fuse_getxattr_in { pub size: u32, pub padding: u32 } }

wire! {
    pub struct fuse_lk_in {
        pub fh: u64,
        pub owner: u64,
        pub lk: fuse_file_lock,
        pub lk_flags: u32,
        pub padding: u32,
    }
}

wire! { pub struct fuse_access_in { pub mask: u32, pub padding: u32 } }

/// Size of `fuse_init_in` before 7.36 (no `flags2`).
pub const FUSE_COMPAT_INIT_IN_SIZE: usize = 16;
wire! {
    pub struct fuse_init_in {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub flags2: u32,
        pub unused: [u32; 11],
    }
}

wire! { pub struct cuse_init_in { pub major: u32, pub minor: u32, pub unused: u32, pub flags: u32 } }
wire! { pub struct fuse_interrupt_in { pub unique: u64 } }
wire! { pub struct fuse_bmap_in { pub block: u64, pub blocksize: u32, pub padding: u32 } }

wire! {
    pub struct fuse_ioctl_in {
        pub fh: u64,
        pub flags: u32,
        pub cmd: u32,
        pub arg: u64,
        pub in_size: u32,
        pub out_size: u32,
    }
}
wire! { pub struct fuse_ioctl_iovec { pub base: u64, pub len: u64 } }

wire! { pub struct fuse_poll_in { pub fh: u64, pub kh: u64, pub flags: u32, pub events: u32 } }

wire! {
    pub struct fuse_fallocate_in { pub fh: u64, pub offset: u64, pub length: u64, pub mode: u32, pub padding: u32 }
}

wire! { pub struct fuse_lseek_in { pub fh: u64, pub offset: u64, pub whence: u32, pub padding: u32 } }

wire! {
    /// COPY_FILE_RANGE and COPY_FILE_RANGE_64; the source node is the
    /// header's `nodeid`.
    pub struct fuse_copy_file_range_in {
        pub fh_in: u64,
        pub off_in: u64,
        pub nodeid_out: u64,
        pub fh_out: u64,
        pub off_out: u64,
        pub len: u64,
        pub flags: u64,
    }
}

wire! {
    pub struct fuse_setupmapping_in { pub fh: u64, pub foffset: u64, pub len: u64, pub flags: u64, pub moffset: u64 }
}
wire! { pub struct fuse_removemapping_in { pub count: u32 } }
wire! { pub struct fuse_removemapping_one { pub moffset: u64, pub len: u64 } }
/// Most `fuse_removemapping_one` entries in one request (one 4 KiB page).
pub const FUSE_REMOVEMAPPING_MAX_ENTRY: usize = 4096 / core::mem::size_of::<fuse_removemapping_one>();

wire! { pub struct fuse_syncfs_in { pub padding: u64 } }

wire! {
    pub struct fuse_statx_in { pub getattr_flags: u32, pub reserved: u32, pub fh: u64, pub sx_flags: u32, pub sx_mask: u32 }
}

// --- request extensions (after the arguments, `total_extlen * 8` bytes) ---
wire! { pub struct fuse_ext_header { pub size: u32, pub typ: u32 } }
wire! { pub struct fuse_secctx { pub size: u32, pub padding: u32 } }
wire! { pub struct fuse_secctx_header { pub size: u32, pub nr_secctx: u32 } }
wire! { pub struct fuse_supp_groups { pub nr_groups: u32 } }

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
