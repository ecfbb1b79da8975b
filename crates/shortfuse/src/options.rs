//! Mount options, spelled like mount(8)/fusermount3 (`-o ro,allow_other,...`).
//! One struct holds what goes to mount(2) and what INIT negotiates.
//! OWNER: session/mount helper (parsing); dispatch reads the INIT fields.

use std::time::Duration;

/// When the kernel should use READDIRPLUS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Readdirplus {
    /// Never (plain READDIR).
    No,
    /// Always (`FUSE_DO_READDIRPLUS`).
    Yes,
    /// Let the kernel decide (`FUSE_DO_READDIRPLUS | FUSE_READDIRPLUS_AUTO`).
    #[default]
    Auto,
}

/// Every option a mount accepts.
#[derive(Clone, Debug, PartialEq)]
pub struct MountOptions {
    // --- given to mount(2) ---
    pub ro: bool,
    pub allow_other: bool,
    pub default_permissions: bool,
    pub fsname: Option<String>,
    pub subtype: Option<String>,
    pub max_read: Option<u32>,
    /// nosuid, nodev, noexec, noatime, ...: passed through as mount flags.
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    pub noatime: bool,

    // --- negotiated in FUSE_INIT ---
    /// Largest WRITE payload; above 128 KiB this also sets `max_pages`
    /// (capped by the kernel's `fs.fuse.max_pages_limit`).
    pub max_write: u32,
    pub max_readahead: Option<u32>,
    pub max_background: Option<u16>,
    pub congestion_threshold: Option<u16>,
    pub writeback_cache: bool,
    pub parallel_dirops: bool,
    pub async_read: bool,
    pub readdirplus: Readdirplus,
    /// Keep the page cache across opens (`FOPEN_KEEP_CACHE` on every open).
    pub keep_cache: bool,
    /// Bypass the page cache (`FOPEN_DIRECT_IO` on every open).
    pub direct_io: bool,
    pub attr_timeout: Duration,
    pub entry_timeout: Duration,
    pub negative_timeout: Duration,
    pub splice_read: bool,
    pub splice_write: bool,
    pub splice_move: bool,
    /// Let the daemon clear suid/sgid bits (`FUSE_HANDLE_KILLPRIV_V2`),
    /// saving a getxattr round trip on every write.
    pub handle_killpriv_v2: bool,
    /// Kernel passthrough for whole-file data maps (later issue).
    pub passthrough: bool,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            ro: false,
            allow_other: false,
            default_permissions: false,
            fsname: None,
            subtype: None,
            max_read: None,
            nosuid: true,
            nodev: true,
            noexec: false,
            noatime: false,
            max_write: 128 * 1024,
            max_readahead: None,
            max_background: None,
            congestion_threshold: None,
            writeback_cache: false,
            parallel_dirops: true,
            async_read: true,
            readdirplus: Readdirplus::Auto,
            keep_cache: false,
            direct_io: false,
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            negative_timeout: Duration::ZERO,
            splice_read: false,
            splice_write: false,
            splice_move: false,
            handle_killpriv_v2: false,
            passthrough: false,
        }
    }
}
