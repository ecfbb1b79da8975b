//! Opcodes (`enum fuse_opcode`) and the one table that describes each of
//! them: name, fixed argument size, trailing names, reply or not. Parsing,
//! logging and statistics all read [`op_info`].

use core::mem::size_of;

use crate::request::*;

/// Look up a name in a directory; counts one lookup of the node found.
pub const FUSE_LOOKUP: u32 = 1;
/// The kernel drops lookups of a node. No reply.
pub const FUSE_FORGET: u32 = 2;
/// Attributes of a node.
pub const FUSE_GETATTR: u32 = 3;
/// Change attributes (chmod, chown, truncate, utimens).
pub const FUSE_SETATTR: u32 = 4;
/// Target of a symbolic link.
pub const FUSE_READLINK: u32 = 5;
/// Create a symbolic link.
pub const FUSE_SYMLINK: u32 = 6;
/// Create a regular, device, FIFO or socket node.
pub const FUSE_MKNOD: u32 = 8;
/// Create a directory.
pub const FUSE_MKDIR: u32 = 9;
/// Remove a name (not a directory).
pub const FUSE_UNLINK: u32 = 10;
/// Remove an empty directory.
pub const FUSE_RMDIR: u32 = 11;
/// Move a name.
pub const FUSE_RENAME: u32 = 12;
/// Create a hard link.
pub const FUSE_LINK: u32 = 13;
/// Open a file.
pub const FUSE_OPEN: u32 = 14;
/// Read from an open file.
pub const FUSE_READ: u32 = 15;
/// Write to an open file.
pub const FUSE_WRITE: u32 = 16;
/// File system figures (`statfs(2)`).
pub const FUSE_STATFS: u32 = 17;
/// Last close of an open file.
pub const FUSE_RELEASE: u32 = 18;
/// Sync an open file to storage.
pub const FUSE_FSYNC: u32 = 20;
/// Set an extended attribute.
pub const FUSE_SETXATTR: u32 = 21;
/// Get an extended attribute.
pub const FUSE_GETXATTR: u32 = 22;
/// List extended attribute names.
pub const FUSE_LISTXATTR: u32 = 23;
/// Remove an extended attribute.
pub const FUSE_REMOVEXATTR: u32 = 24;
/// A `close(2)` of one descriptor of an open file.
pub const FUSE_FLUSH: u32 = 25;
/// First request of a connection: negotiates version and capabilities.
pub const FUSE_INIT: u32 = 26;
/// Open a directory.
pub const FUSE_OPENDIR: u32 = 27;
/// List a directory.
pub const FUSE_READDIR: u32 = 28;
/// Last close of an open directory.
pub const FUSE_RELEASEDIR: u32 = 29;
/// Sync an open directory.
pub const FUSE_FSYNCDIR: u32 = 30;
/// Test for a conflicting POSIX lock (`F_GETLK`).
pub const FUSE_GETLK: u32 = 31;
/// Take or drop a lock without waiting (`F_SETLK`, `flock` with `LOCK_NB`).
pub const FUSE_SETLK: u32 = 32;
/// Take a lock, waiting for conflicting ones to go (`F_SETLKW`, `flock`).
pub const FUSE_SETLKW: u32 = 33;
/// Permission check (`access(2)`, `chdir`), without `default_permissions`.
pub const FUSE_ACCESS: u32 = 34;
/// Create and open a file.
pub const FUSE_CREATE: u32 = 35;
/// The caller gave up on an earlier request (a signal). No reply of its own.
pub const FUSE_INTERRUPT: u32 = 36;
/// Map a file block to a device block (`fuseblk` mounts).
pub const FUSE_BMAP: u32 = 37;
/// The connection ends (sent to `fuseblk` mounts only).
pub const FUSE_DESTROY: u32 = 38;
/// An ioctl on an open file.
pub const FUSE_IOCTL: u32 = 39;
/// Poll an open file for readiness.
pub const FUSE_POLL: u32 = 40;
/// The kernel's answer to `FUSE_NOTIFY_RETRIEVE`, with the data; no reply.
pub const FUSE_NOTIFY_REPLY: u32 = 41;
/// FORGET of several nodes. No reply.
pub const FUSE_BATCH_FORGET: u32 = 42;
/// Allocate, punch or zero a range of a file.
pub const FUSE_FALLOCATE: u32 = 43;
/// List a directory with each entry's attributes.
pub const FUSE_READDIRPLUS: u32 = 44;
/// Move a name, with `renameat2(2)` flags.
pub const FUSE_RENAME2: u32 = 45;
/// Find data or a hole (`SEEK_DATA`, `SEEK_HOLE`).
pub const FUSE_LSEEK: u32 = 46;
/// Copy a range between open files in the file system.
pub const FUSE_COPY_FILE_RANGE: u32 = 47;
/// Map part of a file into the DAX window (virtio-fs).
pub const FUSE_SETUPMAPPING: u32 = 48;
/// Remove DAX mappings (virtio-fs).
pub const FUSE_REMOVEMAPPING: u32 = 49;
/// Sync the whole file system (`syncfs(2)`).
pub const FUSE_SYNCFS: u32 = 50;
/// Create an unnamed file (`O_TMPFILE`).
pub const FUSE_TMPFILE: u32 = 51;
/// Extended attributes of a node (`statx(2)`).
pub const FUSE_STATX: u32 = 52;
/// 7.45: like `FUSE_COPY_FILE_RANGE` with a 64-bit byte count in the reply.
pub const FUSE_COPY_FILE_RANGE_64: u32 = 53;
/// First request of a CUSE (character device) connection.
pub const CUSE_INIT: u32 = 4096;
/// Byte-swapped `CUSE_INIT`: reserved to detect a peer of the other endianness.
pub const CUSE_INIT_BSWAP_RESERVED: u32 = 1_048_576;
/// Byte-swapped `FUSE_INIT`: reserved to detect a peer of the other endianness.
pub const FUSE_INIT_BSWAP_RESERVED: u32 = 436_207_616;

/// What the protocol says about one opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// The `FUSE_*` number.
    pub opcode: u32,
    /// The kernel's name without the `FUSE_` prefix (`"LOOKUP"`).
    pub name: &'static str,
    /// Size of the fixed argument struct at the start of the body (the
    /// smallest accepted size when the protocol has compatible short forms).
    pub arg_size: usize,
    /// NUL-terminated names after the fixed argument.
    pub names: u8,
    /// Whether the daemon answers (false for FORGET, BATCH_FORGET,
    /// INTERRUPT, NOTIFY_REPLY).
    pub reply: bool,
}

const fn op(opcode: u32, name: &'static str, arg_size: usize, names: u8, reply: bool) -> OpInfo {
    OpInfo {
        opcode,
        name,
        arg_size,
        names,
        reply,
    }
}

/// Every opcode of protocol 7.45, in opcode order.
pub static OPCODES: &[OpInfo] = &[
    op(FUSE_LOOKUP, "LOOKUP", 0, 1, true),
    op(FUSE_FORGET, "FORGET", size_of::<fuse_forget_in>(), 0, false),
    op(FUSE_GETATTR, "GETATTR", size_of::<fuse_getattr_in>(), 0, true),
    op(FUSE_SETATTR, "SETATTR", size_of::<fuse_setattr_in>(), 0, true),
    op(FUSE_READLINK, "READLINK", 0, 0, true),
    op(FUSE_SYMLINK, "SYMLINK", 0, 2, true),
    op(FUSE_MKNOD, "MKNOD", size_of::<fuse_mknod_in>(), 1, true),
    op(FUSE_MKDIR, "MKDIR", size_of::<fuse_mkdir_in>(), 1, true),
    op(FUSE_UNLINK, "UNLINK", 0, 1, true),
    op(FUSE_RMDIR, "RMDIR", 0, 1, true),
    op(FUSE_RENAME, "RENAME", size_of::<fuse_rename_in>(), 2, true),
    op(FUSE_LINK, "LINK", size_of::<fuse_link_in>(), 1, true),
    op(FUSE_OPEN, "OPEN", size_of::<fuse_open_in>(), 0, true),
    op(FUSE_READ, "READ", size_of::<fuse_read_in>(), 0, true),
    op(FUSE_WRITE, "WRITE", size_of::<fuse_write_in>(), 0, true),
    op(FUSE_STATFS, "STATFS", 0, 0, true),
    op(FUSE_RELEASE, "RELEASE", size_of::<fuse_release_in>(), 0, true),
    op(FUSE_FSYNC, "FSYNC", size_of::<fuse_fsync_in>(), 0, true),
    op(FUSE_SETXATTR, "SETXATTR", FUSE_COMPAT_SETXATTR_IN_SIZE, 1, true),
    op(FUSE_GETXATTR, "GETXATTR", size_of::<fuse_getxattr_in>(), 1, true),
    op(FUSE_LISTXATTR, "LISTXATTR", size_of::<fuse_getxattr_in>(), 0, true),
    op(FUSE_REMOVEXATTR, "REMOVEXATTR", 0, 1, true),
    op(FUSE_FLUSH, "FLUSH", size_of::<fuse_flush_in>(), 0, true),
    op(FUSE_INIT, "INIT", FUSE_COMPAT_INIT_IN_SIZE, 0, true),
    op(FUSE_OPENDIR, "OPENDIR", size_of::<fuse_open_in>(), 0, true),
    op(FUSE_READDIR, "READDIR", size_of::<fuse_read_in>(), 0, true),
    op(FUSE_RELEASEDIR, "RELEASEDIR", size_of::<fuse_release_in>(), 0, true),
    op(FUSE_FSYNCDIR, "FSYNCDIR", size_of::<fuse_fsync_in>(), 0, true),
    op(FUSE_GETLK, "GETLK", size_of::<fuse_lk_in>(), 0, true),
    op(FUSE_SETLK, "SETLK", size_of::<fuse_lk_in>(), 0, true),
    op(FUSE_SETLKW, "SETLKW", size_of::<fuse_lk_in>(), 0, true),
    op(FUSE_ACCESS, "ACCESS", size_of::<fuse_access_in>(), 0, true),
    op(FUSE_CREATE, "CREATE", size_of::<fuse_create_in>(), 1, true),
    op(FUSE_INTERRUPT, "INTERRUPT", size_of::<fuse_interrupt_in>(), 0, false),
    op(FUSE_BMAP, "BMAP", size_of::<fuse_bmap_in>(), 0, true),
    op(FUSE_DESTROY, "DESTROY", 0, 0, true),
    op(FUSE_IOCTL, "IOCTL", size_of::<fuse_ioctl_in>(), 0, true),
    op(FUSE_POLL, "POLL", size_of::<fuse_poll_in>(), 0, true),
    op(
        FUSE_NOTIFY_REPLY,
        "NOTIFY_REPLY",
        size_of::<crate::notify::fuse_notify_retrieve_in>(),
        0,
        false,
    ),
    op(
        FUSE_BATCH_FORGET,
        "BATCH_FORGET",
        size_of::<fuse_batch_forget_in>(),
        0,
        false,
    ),
    op(FUSE_FALLOCATE, "FALLOCATE", size_of::<fuse_fallocate_in>(), 0, true),
    op(FUSE_READDIRPLUS, "READDIRPLUS", size_of::<fuse_read_in>(), 0, true),
    op(FUSE_RENAME2, "RENAME2", size_of::<fuse_rename2_in>(), 2, true),
    op(FUSE_LSEEK, "LSEEK", size_of::<fuse_lseek_in>(), 0, true),
    op(
        FUSE_COPY_FILE_RANGE,
        "COPY_FILE_RANGE",
        size_of::<fuse_copy_file_range_in>(),
        0,
        true,
    ),
    op(
        FUSE_SETUPMAPPING,
        "SETUPMAPPING",
        size_of::<fuse_setupmapping_in>(),
        0,
        true,
    ),
    op(
        FUSE_REMOVEMAPPING,
        "REMOVEMAPPING",
        size_of::<fuse_removemapping_in>(),
        0,
        true,
    ),
    op(FUSE_SYNCFS, "SYNCFS", size_of::<fuse_syncfs_in>(), 0, true),
    op(FUSE_TMPFILE, "TMPFILE", size_of::<fuse_create_in>(), 1, true),
    op(FUSE_STATX, "STATX", size_of::<fuse_statx_in>(), 0, true),
    op(
        FUSE_COPY_FILE_RANGE_64,
        "COPY_FILE_RANGE_64",
        size_of::<fuse_copy_file_range_in>(),
        0,
        true,
    ),
    op(CUSE_INIT, "CUSE_INIT", size_of::<cuse_init_in>(), 0, true),
];

/// Whether a request with `opcode` changes the file system (a name, a
/// node's attributes or its data): what other holders of names and
/// attributes must be told of once it is done.
pub fn changes_file_system(opcode: u32) -> bool {
    matches!(
        opcode,
        FUSE_CREATE
            | FUSE_MKNOD
            | FUSE_MKDIR
            | FUSE_SYMLINK
            | FUSE_LINK
            | FUSE_UNLINK
            | FUSE_RMDIR
            | FUSE_RENAME
            | FUSE_RENAME2
            | FUSE_SETATTR
            | FUSE_WRITE
            | FUSE_FALLOCATE
            | FUSE_SETXATTR
            | FUSE_REMOVEXATTR
            | FUSE_COPY_FILE_RANGE
    )
}

/// The description of `opcode`, or `None` for an opcode this protocol does
/// not know.
pub fn op_info(opcode: u32) -> Option<&'static OpInfo> {
    match opcode {
        CUSE_INIT => OPCODES.last(),
        // Every request looks here (twice in the preload shim): one load.
        _ => match OPCODE_INDEX.get(opcode as usize) {
            Some(&i) if i != NO_OPCODE => Some(&OPCODES[i as usize]),
            _ => None,
        },
    }
}

/// Opcodes below this are found through [`OPCODE_INDEX`].
const INDEXED: usize = 64;
const NO_OPCODE: u8 = u8::MAX;

/// Position in [`OPCODES`] of each opcode below [`INDEXED`] (they are
/// dense from 1, with holes), built at compile time.
static OPCODE_INDEX: [u8; INDEXED] = {
    let mut index = [NO_OPCODE; INDEXED];
    let mut i = 0;
    while i < OPCODES.len() {
        let op = OPCODES[i].opcode as usize;
        assert!(op == CUSE_INIT as usize || op < INDEXED, "an opcode past the index");
        if op < INDEXED {
            index[op] = i as u8;
        }
        i += 1;
    }
    index
};

/// The kernel's name of `opcode` (`"LOOKUP"`), `"UNKNOWN"` otherwise.
pub fn opcode_name(opcode: u32) -> &'static str {
    op_info(opcode).map_or("UNKNOWN", |o| o.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_complete() {
        for w in OPCODES.windows(2) {
            assert!(w[0].opcode < w[1].opcode, "{} before {}", w[0].name, w[1].name);
        }
        for code in 1..=53u32 {
            let known = op_info(code).is_some();
            assert_eq!(known, code != 7 && code != 19, "opcode {code}");
        }
        assert_eq!(opcode_name(FUSE_LOOKUP), "LOOKUP");
        assert_eq!(opcode_name(FUSE_COPY_FILE_RANGE_64), "COPY_FILE_RANGE_64");
        assert_eq!(opcode_name(CUSE_INIT), "CUSE_INIT");
        assert_eq!(opcode_name(7), "UNKNOWN");
        assert_eq!(opcode_name(FUSE_INIT_BSWAP_RESERVED), "UNKNOWN");
        let no_reply: Vec<_> = OPCODES.iter().filter(|o| !o.reply).map(|o| o.opcode).collect();
        assert_eq!(
            no_reply,
            [FUSE_FORGET, FUSE_INTERRUPT, FUSE_NOTIFY_REPLY, FUSE_BATCH_FORGET]
        );
    }
}
