//! FUSE_INIT: what the daemon asks for, driven by [`MountOptions`], then
//! adjusted by the file system's `init`.
//!
//! Choices (each only when the kernel offers the flag):
//! - `ASYNC_READ`, `PARALLEL_DIROPS`, `WRITEBACK_CACHE`, `HANDLE_KILLPRIV_V2`,
//!   `SPLICE_*`: as the options say (splice off by default: the dispatcher
//!   works on plain buffers).
//! - `DO_READDIRPLUS` (+ `READDIRPLUS_AUTO` for `Auto`) per `readdirplus`.
//! - `ATOMIC_O_TRUNC`: O_TRUNC comes with OPEN instead of a separate SETATTR.
//! - `BIG_WRITES`, `MAX_PAGES`: writes up to `max_write`
//!   (1 MiB at most, capped by `fs.fuse.max_pages_limit`).
//! - `ASYNC_DIO`: direct I/O requests of one call are sent in parallel.
//! - `AUTO_INVAL_DATA`: the kernel drops cached pages when it sees mtime or
//!   size change, so files changed behind the daemon's back are re-read.
//!   Off with `writeback_cache`, where the kernel owns mtime and size and
//!   would otherwise throw away pages on its own attribute refreshes.
//! - `INIT_EXT`: needed to send any flag of the second word.
//! - `OVER_IO_URING`: only with `Transport::Uring` in `MountOptions::transport` (the uring session).
//!   Once accepted, the kernel holds every request (in `fuse_get_req`) until
//!   every queue has a registered ring entry; nothing falls back to
//!   /dev/fuse, so a /dev/fuse-only session that accepted it would hang.
//! - Off: `DONT_MASK` (the kernel applies the umask), `EXPORT_SUPPORT` (no
//!   lookups of "." and ".."), `POSIX_LOCKS`/`FLOCK_LOCKS` (the kernel keeps
//!   locks unless the file system adds them in `init`), `SETXATTR_EXT`
//!   (parsed if a file system adds it).
//! - `PASSTHROUGH` with `max_stack_depth` 1 (backing files on a plain file
//!   system, not on another stacked one) with `-o passthrough`. The kernel
//!   silently ignores it beside `WRITEBACK_CACHE`, after which every
//!   passthrough open would fail with EIO; the options refuse the pair, and
//!   if a file system's `init` still asks for both, passthrough is dropped
//!   with a line on stderr.

use shortfuse_abi as abi;

use crate::filesystem::InitConfig;
use crate::notify::Notifier;
use crate::options::{MountOptions, Readdirplus};
use crate::stats::Transport;

/// Page size the kernel counts `max_pages` in.
pub(crate) const PAGE: usize = 4096;
/// Largest `max_write` shortfuse asks for.
pub(crate) const MAX_WRITE_CAP: u32 = 1 << 20;
/// Oldest protocol minor served: 7.31 (Linux 5.9) has every struct at its
/// current size except the ones parsed with zero-filled prefixes.
pub(crate) const MIN_MINOR: u32 = 31;
/// `fs.fuse.max_pages_limit` default when the sysctl cannot be read.
pub(crate) const DEFAULT_MAX_PAGES_LIMIT: u32 = 256;

/// What FUSE_INIT agreed on, readable by sessions after INIT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Protocol version in use (`7.min(kernel, 45)`).
    pub major: u32,
    /// Minor protocol version in use.
    pub minor: u32,
    /// Every flag the kernel offered.
    pub kernel_flags: u64,
    /// The flags in effect (asked for and offered).
    pub flags: u64,
    /// Largest WRITE payload.
    pub max_write: u32,
    /// Pages per request (`FUSE_MAX_PAGES`).
    pub max_pages: u16,
    /// Largest read-ahead the kernel does.
    pub max_readahead: u32,
    /// Background requests the kernel keeps in flight (0: the kernel's default).
    pub max_background: u16,
    /// Background requests that mark the connection congested (0: the kernel's default).
    pub congestion_threshold: u16,
    /// Granularity of timestamps in nanoseconds.
    pub time_gran: u32,
}

impl Negotiated {
    /// Whether `flag` (a `FUSE_*` INIT flag) is in effect.
    pub fn has(&self, flag: u64) -> bool {
        self.flags & flag != 0
    }

    /// Bytes a /dev/fuse read buffer must hold: the largest WRITE payload
    /// plus one page for headers, and never less than `FUSE_MIN_READ_BUFFER`.
    pub fn buffer_size(&self) -> usize {
        buffer_size_for(self.max_write.max(u32::from(self.max_pages) * PAGE as u32))
    }

    /// Largest READ/READDIR size honoured.
    pub(crate) fn max_io(&self) -> usize {
        (self.max_write as usize).max(usize::from(self.max_pages) * PAGE)
    }
}

pub(crate) fn buffer_size_for(max_write: u32) -> usize {
    (max_write as usize + PAGE).max(abi::FUSE_MIN_READ_BUFFER)
}

/// Reads `/proc/sys/fs/fuse/max_pages_limit`.
pub(crate) fn read_max_pages_limit() -> u32 {
    std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_MAX_PAGES_LIMIT)
}

/// Largest `max_write` allowed by the cap and the kernel's page limit.
pub(crate) fn max_write_limit(max_pages_limit: u32) -> u32 {
    MAX_WRITE_CAP
        .min(max_pages_limit.saturating_mul(PAGE as u32))
        .max(PAGE as u32)
}

/// Clamps a wanted `max_write` into `[4096, limit]`, saying when it moved.
pub(crate) fn clamp_max_write(want: u32, max_pages_limit: u32) -> u32 {
    let limit = max_write_limit(max_pages_limit);
    let got = want.clamp(PAGE as u32, limit);
    if got != want {
        tracing::warn!("max_write {want} clamped to {got} (1 MiB cap, fs.fuse.max_pages_limit = {max_pages_limit})");
    }
    got
}

/// The flags and limits asked for before the file system's `init`.
pub(crate) fn initial_config(
    opts: &MountOptions,
    arg: &abi::fuse_init_in,
    kernel_flags: u64,
    max_pages_limit: u32,
) -> InitConfig {
    let mut want = abi::FUSE_ATOMIC_O_TRUNC | abi::FUSE_BIG_WRITES | abi::FUSE_MAX_PAGES | abi::FUSE_ASYNC_DIO;
    let mut set = |on: bool, flag: u64| {
        if on {
            want |= flag;
        }
    };
    set(opts.async_read, abi::FUSE_ASYNC_READ);
    set(opts.parallel_dirops, abi::FUSE_PARALLEL_DIROPS);
    set(opts.writeback_cache, abi::FUSE_WRITEBACK_CACHE);
    set(!opts.writeback_cache, abi::FUSE_AUTO_INVAL_DATA);
    set(opts.handle_killpriv_v2, abi::FUSE_HANDLE_KILLPRIV_V2);
    set(opts.splice_read, abi::FUSE_SPLICE_READ);
    set(opts.splice_write, abi::FUSE_SPLICE_WRITE);
    set(opts.splice_move, abi::FUSE_SPLICE_MOVE);
    set(opts.transport == Transport::Uring, abi::FUSE_OVER_IO_URING);
    set(opts.passthrough, abi::FUSE_PASSTHROUGH);
    match opts.readdirplus {
        Readdirplus::No => {}
        Readdirplus::Yes => want |= abi::FUSE_DO_READDIRPLUS,
        Readdirplus::Auto => want |= abi::FUSE_DO_READDIRPLUS | abi::FUSE_READDIRPLUS_AUTO,
    }
    let max_readahead = opts
        .max_readahead
        .map_or(arg.max_readahead, |r| r.min(arg.max_readahead));
    InitConfig {
        kernel_major: arg.major,
        kernel_minor: arg.minor,
        kernel_flags,
        want: want & kernel_flags,
        max_write: clamp_max_write(opts.max_write, max_pages_limit),
        max_readahead,
        max_background: opts.max_background.unwrap_or(0),
        congestion_threshold: opts.congestion_threshold.unwrap_or(0),
        time_gran: 1,
        notifier: Notifier::new(),
        file_attr_timeout: None,
        entry_timeout: opts.entry_timeout,
    }
}

/// Turns the file system's adjusted config into what is agreed and the
/// `fuse_init_out` that says so.
pub(crate) fn finish(
    cfg: &InitConfig,
    arg: &abi::fuse_init_in,
    kernel_flags: u64,
    max_pages_limit: u32,
) -> (Negotiated, abi::fuse_init_out) {
    let mut flags = cfg.want & kernel_flags;
    if cfg.want & !kernel_flags != 0 {
        tracing::warn!(
            "INIT: the kernel does not offer flags {:#x}; not asked for",
            cfg.want & !kernel_flags
        );
    }
    if flags & abi::FUSE_PASSTHROUGH != 0 && flags & abi::FUSE_WRITEBACK_CACHE != 0 {
        tracing::warn!("INIT: FUSE_PASSTHROUGH cannot go with FUSE_WRITEBACK_CACHE; passthrough not asked for");
        flags &= !abi::FUSE_PASSTHROUGH;
    }
    if flags >> 32 != 0 {
        flags |= abi::FUSE_INIT_EXT & kernel_flags;
        if flags & abi::FUSE_INIT_EXT == 0 {
            flags &= u64::from(u32::MAX);
        }
    }
    let max_write = clamp_max_write(cfg.max_write, max_pages_limit);
    let max_pages = max_write.div_ceil(PAGE as u32).min(u32::from(u16::MAX)) as u16;
    let minor = arg.minor.min(abi::FUSE_KERNEL_MINOR_VERSION);
    let negotiated = Negotiated {
        major: abi::FUSE_KERNEL_VERSION,
        minor,
        kernel_flags,
        flags,
        max_write,
        max_pages: if flags & abi::FUSE_MAX_PAGES != 0 {
            max_pages
        } else {
            32
        },
        max_readahead: cfg.max_readahead.min(arg.max_readahead),
        max_background: cfg.max_background,
        congestion_threshold: cfg.congestion_threshold,
        time_gran: cfg.time_gran.max(1),
    };
    let (flags1, flags2) = abi::split_init_flags(flags);
    let out = abi::fuse_init_out {
        major: abi::FUSE_KERNEL_VERSION,
        minor,
        max_readahead: negotiated.max_readahead,
        flags: flags1,
        max_background: negotiated.max_background,
        congestion_threshold: negotiated.congestion_threshold,
        max_write,
        time_gran: negotiated.time_gran,
        max_pages: negotiated.max_pages,
        map_alignment: 0,
        flags2,
        max_stack_depth: if flags & abi::FUSE_PASSTHROUGH != 0 { 1 } else { 0 },
        request_timeout: 0,
        unused: [0; 11],
    };
    (negotiated, out)
}
