//! Mount options, spelled like mount(8)/fusermount3 (`-o ro,allow_other,...`).
//! One struct holds what goes to mount(2) and what INIT negotiates: the
//! mount helper parses it, the dispatcher reads the INIT fields.

use std::fmt;
use std::time::Duration;

use crate::stats::Transport;

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
    /// Read-only mount (`ro`).
    pub ro: bool,
    /// Users other than the mounting one may use the mount (`allow_other`).
    pub allow_other: bool,
    /// The kernel checks permissions from the modes (`default_permissions`).
    pub default_permissions: bool,
    /// Source shown in /proc/mounts.
    pub fsname: Option<String>,
    /// Type shown as `fuse.SUBTYPE`.
    pub subtype: Option<String>,
    /// Largest READ the kernel sends.
    pub max_read: Option<u32>,
    /// nosuid, nodev, noexec, noatime, ...: passed through as mount flags.
    pub nosuid: bool,
    /// Device files refused (`nodev`).
    pub nodev: bool,
    /// Programs may not be executed (`noexec`).
    pub noexec: bool,
    /// Access times not updated (`noatime`).
    pub noatime: bool,

    // --- negotiated in FUSE_INIT ---
    /// Largest WRITE payload; above 128 KiB this also sets `max_pages`
    /// (capped by the kernel's `fs.fuse.max_pages_limit`).
    pub max_write: u32,
    /// Largest read-ahead; `None`: the kernel's.
    pub max_readahead: Option<u32>,
    /// Background requests in flight; `None`: the kernel's default (12).
    pub max_background: Option<u16>,
    /// Background requests that mark the connection congested; `None`: the kernel's default.
    pub congestion_threshold: Option<u16>,
    /// The kernel caches writes and sends them later (`FUSE_WRITEBACK_CACHE`).
    pub writeback_cache: bool,
    /// Concurrent lookups and readdirs in one directory (`FUSE_PARALLEL_DIROPS`).
    pub parallel_dirops: bool,
    /// Several READs of one file in flight (`FUSE_ASYNC_READ`).
    pub async_read: bool,
    /// When the kernel uses READDIRPLUS.
    pub readdirplus: Readdirplus,
    /// Keep the page cache across opens (`FOPEN_KEEP_CACHE` on every open).
    pub keep_cache: bool,
    /// Bypass the page cache (`FOPEN_DIRECT_IO` on every open).
    pub direct_io: bool,
    /// How long the kernel caches attributes (an `Entry` or `Attr` may say otherwise).
    pub attr_timeout: Duration,
    /// How long the kernel caches names.
    pub entry_timeout: Duration,
    /// How long the kernel caches missing names (0: not at all).
    pub negative_timeout: Duration,
    /// Move READ data with splice(2) (`FUSE_SPLICE_READ`).
    pub splice_read: bool,
    /// Move WRITE data with splice(2) (`FUSE_SPLICE_WRITE`).
    pub splice_write: bool,
    /// Let splice move pages rather than copy them (`FUSE_SPLICE_MOVE`).
    pub splice_move: bool,
    /// Let the daemon clear suid/sgid bits (`FUSE_HANDLE_KILLPRIV_V2`),
    /// saving a getxattr round trip on every write.
    pub handle_killpriv_v2: bool,
    /// Kernel passthrough (`FUSE_PASSTHROUGH`): a file opened with a
    /// whole-file data map has its reads and writes sent by the kernel
    /// straight to the backing file.
    pub passthrough: bool,
    /// Under kernel passthrough, a read-only open of a file that no open
    /// passes through is served from the mount's own page cache instead,
    /// kept across opens while the file's size and times are unchanged:
    /// a read of cached data then costs one page-cache copy, as on a plain
    /// FUSE mount, where the passthrough read path adds a second file's
    /// read to each call. The first read of the data goes through the
    /// daemon.
    pub reader_cache: bool,
    /// The largest file (bytes) the reader cache takes; larger files are
    /// passed through to every reader. The mount's page cache holds a
    /// second copy of what the source's already holds, and on Linux 6.18
    /// it is built of single pages where ext4's has large folios, so a big
    /// read call copies several times slower from it (measured: 1 MiB
    /// reads of a cached 128 MiB file); small files, read in small calls,
    /// are what the reader cache is for.
    pub reader_cache_max: u64,

    // --- for the session ---
    /// Worker threads reading /dev/fuse, each on its own cloned fd: what a
    /// profile, `threads=N` or the CLI's `--threads` asks for (`base`: 1).
    /// `None`: one per CPU. Over [`Transport::Uring`] one reader is enough
    /// (it only sees INIT, FORGET and INTERRUPT) and `uring_workers` sets
    /// the ring workers instead.
    pub threads: Option<usize>,
    /// How the kernel sends requests (`--transport`): [`Transport::Dev`]
    /// (the default) reads and writes /dev/fuse; [`Transport::Uring`]
    /// accepts `FUSE_OVER_IO_URING` in INIT and serves over
    /// FUSE-over-io_uring rings, or over /dev/fuse with a warning when the
    /// kernel does not offer them. Once accepted, the kernel holds every
    /// request until each queue has an entry; it does not fall back. A
    /// kernel mount refuses the other two transports; the ring server and
    /// the in-process backend ignore this field.
    pub transport: Transport,
    /// Ring entries per uring worker (`uring_depth=N`, default 8).
    pub uring_depth: u32,
    /// uring workers per queue (CPU) (`uring_workers=N`, default 1).
    pub uring_workers: usize,
    /// How long a uring worker polls its completion queue before sleeping
    /// (`uring_spin=MICROSECONDS`; 0 always sleeps at once).
    pub uring_spin: Duration,
    /// How long a /dev/fuse reader polls for the next request before it
    /// sleeps in read(2) (`dev_spin=MICROSECONDS`; 0 always sleeps at once).
    pub dev_spin: Duration,
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
            reader_cache: false,
            reader_cache_max: READER_CACHE_MAX,
            threads: None,
            transport: Transport::Dev,
            uring_depth: 8,
            uring_workers: 1,
            uring_spin: crate::session::uring::DEFAULT_SPIN,
            dev_spin: crate::session::dev::DEFAULT_SPIN,
        }
    }
}

/// A `-o` option that could not be parsed. Displays as `-o OPTION: why`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionError {
    /// The option as written (`max_write=9M`).
    pub option: String,
    /// Why it was refused.
    pub message: String,
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "-o {}: {}", self.option, self.message)
    }
}

impl std::error::Error for OptionError {}

impl From<OptionError> for std::io::Error {
    fn from(e: OptionError) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())
    }
}

/// Options that no mount option claims, in order, for the file system to
/// interpret (`key` or `key=value`).
pub type FsOptions = Vec<(String, Option<String>)>;

/// Largest `max_write` the kernel accepts (256 pages with the default
/// `fs.fuse.max_pages_limit`).
pub const MAX_WRITE_LIMIT: u32 = 1024 * 1024;
/// Smallest `max_write`: the kernel raises anything lower to one page anyway.
pub const MAX_WRITE_MIN: u32 = 4096;

/// One line of help per `-o` option, in the order `--help` lists them.
pub const OPTION_HELP: &[(&str, &str)] = &[
    (
        "base",
        "StackfsBase of To FUSE or Not to FUSE (FAST '17): 1 worker thread, max_write=4096, no writeback cache, no splice",
    ),
    (
        "optimized",
        "StackfsOpt of To FUSE or Not to FUSE (FAST '17): writeback_cache, max_write=131072, one thread per CPU, splice",
    ),
    ("ro / rw", "read-only or read-write mount (default rw)"),
    (
        "allow_other",
        "let users other than the mounting user access the file system",
    ),
    (
        "default_permissions",
        "let the kernel check permissions from the file modes",
    ),
    (
        "fsname=NAME",
        "source shown in /proc/mounts (default: the file system's name)",
    ),
    ("subtype=NAME", "file system type shown as fuse.NAME"),
    ("max_read=N", "largest READ request the kernel sends"),
    ("nosuid / suid", "ignore (default) or honour set-user-id bits"),
    ("nodev / dev", "refuse (default) or allow device files"),
    ("noexec / exec", "refuse or allow (default) executing programs"),
    ("noatime", "do not update access times"),
    (
        "max_write=N[K|M]",
        "largest WRITE payload, 4096 to 1M bytes (default 128K); above 128K sets max_pages",
    ),
    ("max_readahead=N[K|M]", "largest read-ahead the kernel does"),
    ("max_background=N", "background requests in flight (kernel default 12)"),
    (
        "congestion_threshold=N",
        "background requests that mark the connection congested (kernel default 9)",
    ),
    (
        "writeback_cache / no_writeback_cache",
        "cache writes in the kernel page cache (default off)",
    ),
    (
        "parallel_dirops / no_parallel_dirops",
        "allow concurrent lookups and readdirs in a directory (default on)",
    ),
    (
        "async_read / sync_read",
        "allow several READs of one file in flight (default async)",
    ),
    (
        "readdirplus=yes|no|auto",
        "when the kernel uses READDIRPLUS (default auto)",
    ),
    (
        "keep_cache",
        "keep cached file data across opens (libfuse's kernel_cache, also accepted)",
    ),
    ("direct_io", "bypass the page cache for file data"),
    (
        "attr_timeout=SECONDS",
        "how long the kernel caches attributes (default 1.0)",
    ),
    (
        "entry_timeout=SECONDS",
        "how long the kernel caches names (default 1.0)",
    ),
    (
        "negative_timeout=SECONDS",
        "how long the kernel caches missing names (default 0)",
    ),
    (
        "splice_read / splice_write / splice_move",
        "move data with splice(2) on /dev/fuse (default off)",
    ),
    (
        "handle_killpriv_v2",
        "the daemon clears suid/sgid on write, saving a getxattr per write",
    ),
    (
        "passthrough / no_passthrough",
        "kernel passthrough of file data to backing files (default off; on for passthrough as root, below)",
    ),
    (
        "reader_cache / no_reader_cache",
        "with passthrough: read-only opens of a file no open passes through use the mount's page cache, kept while the file is unchanged (default off; on for passthrough, below)",
    ),
    (
        "reader_cache_max=N[K|M|G]",
        "the largest file the reader cache takes (default 1M); larger files are passed through to readers too",
    ),
    ("threads=N", "worker threads (like --threads; --threads wins)"),
    (
        "uring_depth=N",
        "--transport uring: ring entries per worker, 1 to 1024 (default 8)",
    ),
    (
        "uring_workers=N",
        "--transport uring: worker threads per CPU queue, 1 to 64 (default 1)",
    ),
    (
        "uring_spin=MICROSECONDS",
        "--transport uring: poll for the next request this long before sleeping, 0 to 10000 (default 20)",
    ),
    (
        "dev_spin=MICROSECONDS",
        "/dev/fuse readers: poll for the next request this long before sleeping, 0 to 10000 (default 25); spends a little CPU after each request to spare the wake-up of an idle CPU",
    ),
];

impl MountOptions {
    /// the "base" configuration of To FUSE or Not to FUSE (FAST '17), StackfsBase: what an unconfigured
    /// libfuse 2 daemon got.
    pub fn base() -> MountOptions {
        let mut o = MountOptions::default();
        o.set_base();
        o
    }

    /// the "optimized" configuration of To FUSE or Not to FUSE (FAST '17), StackfsOpt.
    pub fn optimized() -> MountOptions {
        let mut o = MountOptions::default();
        o.set_optimized();
        o
    }

    fn set_base(&mut self) {
        self.threads = Some(1);
        self.max_write = 4096;
        self.writeback_cache = false;
        self.splice_read = false;
        self.splice_write = false;
        self.splice_move = false;
    }

    fn set_optimized(&mut self) {
        self.threads = None;
        self.max_write = 128 * 1024;
        self.writeback_cache = true;
        self.splice_read = true;
        self.splice_write = true;
        self.splice_move = true;
    }

    /// Parses a comma-separated `-o` string on top of the defaults. Every
    /// option must be known.
    pub fn parse(s: &str) -> Result<MountOptions, OptionError> {
        let mut o = MountOptions::default();
        o.apply(s, None)?;
        Ok(o)
    }

    /// Like [`MountOptions::parse`], but hands back the options no mount
    /// option claims, for the file system to interpret (and refuse).
    pub fn parse_with_fs_options(s: &str) -> Result<(MountOptions, FsOptions), OptionError> {
        let mut o = MountOptions::default();
        let mut rest = FsOptions::new();
        o.apply(s, Some(&mut rest))?;
        Ok((o, rest))
    }

    /// Applies `s` on top of `self`, left to right: a later option wins, so
    /// `optimized,max_write=65536` keeps the profile but changes one value.
    /// Unknown options go to `leftover` when given, else they are errors.
    pub fn apply(&mut self, s: &str, mut leftover: Option<&mut FsOptions>) -> Result<(), OptionError> {
        for item in split_options(s) {
            if item.is_empty() {
                continue;
            }
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item.as_str(), None),
            };
            let err = |message: String| OptionError {
                option: item.clone(),
                message,
            };
            if !self.apply_one(key, value).map_err(err)? {
                match leftover.as_deref_mut() {
                    Some(rest) => rest.push((key.to_string(), value.map(str::to_string))),
                    None => {
                        return Err(OptionError {
                            option: item.clone(),
                            message: "unknown option (see `shortfuse mount --help`)".to_string(),
                        })
                    }
                }
            }
        }
        if self.passthrough && self.writeback_cache {
            // The kernel switches passthrough off under the write-back cache
            // and then fails every passthrough open with EIO.
            return Err(OptionError {
                option: "passthrough".to_string(),
                message: "cannot be combined with writeback_cache (the kernel allows only one of them per mount; \
                          `optimized` turns writeback_cache on, add no_writeback_cache after it)"
                    .to_string(),
            });
        }
        Ok(())
    }

    /// Returns `Ok(false)` when `key` is not a mount option.
    fn apply_one(&mut self, key: &str, value: Option<&str>) -> Result<bool, String> {
        let flag = |v: Option<&str>| match v {
            None => Ok(()),
            Some(_) => Err(format!("{key} takes no value")),
        };
        match key {
            "base" => flag(value).map(|_| self.set_base())?,
            "optimized" => flag(value).map(|_| self.set_optimized())?,
            "ro" => flag(value).map(|_| self.ro = true)?,
            "rw" => flag(value).map(|_| self.ro = false)?,
            "allow_other" => flag(value).map(|_| self.allow_other = true)?,
            "default_permissions" => flag(value).map(|_| self.default_permissions = true)?,
            "nosuid" => flag(value).map(|_| self.nosuid = true)?,
            "suid" => flag(value).map(|_| self.nosuid = false)?,
            "nodev" => flag(value).map(|_| self.nodev = true)?,
            "dev" => flag(value).map(|_| self.nodev = false)?,
            "noexec" => flag(value).map(|_| self.noexec = true)?,
            "exec" => flag(value).map(|_| self.noexec = false)?,
            "noatime" => flag(value).map(|_| self.noatime = true)?,
            "writeback_cache" => flag(value).map(|_| self.writeback_cache = true)?,
            "no_writeback_cache" => flag(value).map(|_| self.writeback_cache = false)?,
            "parallel_dirops" => flag(value).map(|_| self.parallel_dirops = true)?,
            "no_parallel_dirops" => flag(value).map(|_| self.parallel_dirops = false)?,
            "async_read" => flag(value).map(|_| self.async_read = true)?,
            "sync_read" => flag(value).map(|_| self.async_read = false)?,
            // kernel_cache: libfuse's name for it.
            "keep_cache" | "kernel_cache" => flag(value).map(|_| self.keep_cache = true)?,
            "direct_io" => flag(value).map(|_| self.direct_io = true)?,
            "splice_read" => flag(value).map(|_| self.splice_read = true)?,
            "splice_write" => flag(value).map(|_| self.splice_write = true)?,
            "splice_move" => flag(value).map(|_| self.splice_move = true)?,
            "handle_killpriv_v2" => flag(value).map(|_| self.handle_killpriv_v2 = true)?,
            "passthrough" => flag(value).map(|_| self.passthrough = true)?,
            "no_passthrough" => flag(value).map(|_| self.passthrough = false)?,
            "reader_cache" => flag(value).map(|_| self.reader_cache = true)?,
            "no_reader_cache" => flag(value).map(|_| self.reader_cache = false)?,
            "reader_cache_max" => self.reader_cache_max = size_value(key, value, 0, u64::MAX)?,
            "fsname" => self.fsname = Some(name_value(key, value)?),
            "subtype" => self.subtype = Some(name_value(key, value)?),
            "max_read" => self.max_read = Some(size_value(key, value, 1, u32::MAX as u64)? as u32),
            "max_write" => {
                self.max_write = size_value(key, value, MAX_WRITE_MIN as u64, MAX_WRITE_LIMIT as u64)? as u32
            }
            "max_readahead" => self.max_readahead = Some(size_value(key, value, 0, u32::MAX as u64)? as u32),
            "max_background" => self.max_background = Some(size_value(key, value, 1, u16::MAX as u64)? as u16),
            "congestion_threshold" => {
                self.congestion_threshold = Some(size_value(key, value, 1, u16::MAX as u64)? as u16)
            }
            "threads" => self.threads = Some(size_value(key, value, 1, 1024)? as usize),
            "uring_depth" => self.uring_depth = size_value(key, value, 1, 1024)? as u32,
            "uring_workers" => self.uring_workers = size_value(key, value, 1, 64)? as usize,
            "uring_spin" => self.uring_spin = micros_value(key, value, crate::session::uring::MAX_SPIN)?,
            "dev_spin" => self.dev_spin = micros_value(key, value, crate::session::dev::MAX_SPIN)?,
            "readdirplus" => {
                self.readdirplus = match value {
                    Some("yes") => Readdirplus::Yes,
                    Some("no") => Readdirplus::No,
                    Some("auto") => Readdirplus::Auto,
                    _ => return Err("expected readdirplus=yes, readdirplus=no or readdirplus=auto".to_string()),
                }
            }
            "attr_timeout" => self.attr_timeout = seconds_value(key, value)?,
            "entry_timeout" => self.entry_timeout = seconds_value(key, value)?,
            "negative_timeout" => self.negative_timeout = seconds_value(key, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The number of /dev/fuse reader threads a kernel session runs:
    /// [`MountOptions::threads`], else one per CPU; one over io_uring.
    pub fn worker_threads(&self) -> usize {
        match self.transport {
            Transport::Uring => 1,
            _ => self.threads.unwrap_or_else(crate::sys::available_cpus).max(1),
        }
    }

    /// The options fusermount3 understands, as one `-o` string.
    pub fn fusermount_options(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        parts.push(if self.ro { "ro" } else { "rw" }.to_string());
        for (on, name) in [
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
            (self.noatime, "noatime"),
            (self.allow_other, "allow_other"),
            (self.default_permissions, "default_permissions"),
        ] {
            if on {
                parts.push(name.to_string());
            }
        }
        if let Some(n) = &self.fsname {
            parts.push(format!("fsname={}", escape_commas(n)));
        }
        if let Some(n) = &self.subtype {
            parts.push(format!("subtype={}", escape_commas(n)));
        }
        if let Some(n) = self.max_read {
            parts.push(format!("max_read={n}"));
        }
        parts.join(",")
    }
}

fn escape_commas(s: &str) -> String {
    s.replace('\\', "\\\\").replace(',', "\\,")
}

/// Splits at commas; `\,` is a literal comma and `\\` a backslash, as in
/// libfuse, so that `fsname=a\,b` works.
fn split_options(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n) => cur.push(n),
                None => cur.push('\\'),
            },
            ',' => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

fn name_value(key: &str, value: Option<&str>) -> Result<String, String> {
    match value {
        Some(v) if !v.is_empty() => Ok(v.to_string()),
        _ => Err(format!("expected {key}=NAME")),
    }
}

/// Default of [`MountOptions::reader_cache_max`]: a build's headers and a
/// script's modules are well below it, a data set or an archive above.
pub const READER_CACHE_MAX: u64 = 1 << 20;

/// A byte count with an optional binary suffix (`K`, `M`, `G`, either case).
pub fn size_value(key: &str, value: Option<&str>, min: u64, max: u64) -> Result<u64, String> {
    let v = value.ok_or_else(|| format!("expected {key}=NUMBER"))?;
    let (digits, mult) = match v.as_bytes().last() {
        Some(b'k' | b'K') => (&v[..v.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&v[..v.len() - 1], 1u64 << 20),
        Some(b'g' | b'G') => (&v[..v.len() - 1], 1u64 << 30),
        _ => (v, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{v:?} is not a number (plain bytes or with a K/M/G suffix)"))?;
    let n = n.checked_mul(mult).ok_or_else(|| format!("{v} is too large"))?;
    if n < min || n > max {
        return Err(format!("{n} is out of range: {key} must be between {min} and {max}"));
    }
    Ok(n)
}

/// A whole number of microseconds, at most `max`.
fn micros_value(key: &str, value: Option<&str>, max: Duration) -> Result<Duration, String> {
    let v = value.ok_or_else(|| format!("expected {key}=MICROSECONDS"))?;
    let us: u64 = v
        .parse()
        .map_err(|_| format!("{v:?} is not a whole number of microseconds"))?;
    let d = Duration::from_micros(us);
    if d > max {
        return Err(format!(
            "{us} is out of range: {key} must be at most {}",
            max.as_micros()
        ));
    }
    Ok(d)
}

pub(crate) fn seconds_value(key: &str, value: Option<&str>) -> Result<Duration, String> {
    let v = value.ok_or_else(|| format!("expected {key}=SECONDS"))?;
    let secs: f64 = v.parse().map_err(|_| format!("{v:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{v} is not a non-negative number of seconds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_flags() {
        let o = MountOptions::parse("").unwrap();
        assert_eq!(o, MountOptions::default());
        let o = MountOptions::parse("ro,allow_other,default_permissions,suid,dev,noexec,noatime").unwrap();
        assert!(o.ro && o.allow_other && o.default_permissions && o.noexec && o.noatime);
        assert!(!o.nosuid && !o.nodev);
        let o = MountOptions::parse("ro,rw,exec,nosuid").unwrap();
        assert!(!o.ro && !o.noexec && o.nosuid);
    }

    #[test]
    fn values() {
        let o = MountOptions::parse(
            "fsname=src\\,x,subtype=mem,max_read=8192,max_write=1M,max_readahead=64k,max_background=20,\
             congestion_threshold=15,readdirplus=no,attr_timeout=2.5,entry_timeout=0,negative_timeout=0.001",
        )
        .unwrap();
        assert_eq!(o.fsname.as_deref(), Some("src,x"));
        assert_eq!(o.subtype.as_deref(), Some("mem"));
        assert_eq!(o.max_read, Some(8192));
        assert_eq!(o.max_write, 1 << 20);
        assert_eq!(o.max_readahead, Some(65536));
        assert_eq!(o.max_background, Some(20));
        assert_eq!(o.congestion_threshold, Some(15));
        assert_eq!(o.readdirplus, Readdirplus::No);
        assert_eq!(o.attr_timeout, Duration::from_millis(2500));
        assert_eq!(o.entry_timeout, Duration::ZERO);
        assert_eq!(o.negative_timeout, Duration::from_millis(1));
        assert_eq!(MountOptions::parse("max_write=65536").unwrap().max_write, 65536);
    }

    #[test]
    fn toggles() {
        let o = MountOptions::parse(
            "writeback_cache,no_parallel_dirops,sync_read,keep_cache,direct_io,splice_read,splice_write,\
             splice_move,handle_killpriv_v2",
        )
        .unwrap();
        assert!(o.writeback_cache && !o.parallel_dirops && !o.async_read && o.keep_cache && o.direct_io);
        assert!(o.splice_read && o.splice_write && o.splice_move && o.handle_killpriv_v2 && !o.passthrough);
        assert!(MountOptions::parse("passthrough").unwrap().passthrough);
        assert!(!MountOptions::parse("passthrough,no_passthrough").unwrap().passthrough);
        assert!(MountOptions::parse("passthrough,reader_cache").unwrap().reader_cache);
        assert!(
            !MountOptions::parse("reader_cache,no_reader_cache")
                .unwrap()
                .reader_cache
        );
        assert_eq!(MountOptions::parse("").unwrap().reader_cache_max, READER_CACHE_MAX);
        assert_eq!(
            MountOptions::parse("reader_cache_max=64M").unwrap().reader_cache_max,
            64 << 20
        );
        assert!(MountOptions::parse("reader_cache_max").is_err());
        assert!(
            MountOptions::parse("no_passthrough,writeback_cache")
                .unwrap()
                .writeback_cache
        );
        let e = MountOptions::parse("passthrough,writeback_cache").unwrap_err();
        assert!(e.to_string().contains("cannot be combined with writeback_cache"), "{e}");
        assert!(MountOptions::parse("optimized,passthrough").is_err());
        assert!(
            MountOptions::parse("optimized,no_writeback_cache,passthrough")
                .unwrap()
                .passthrough
        );
        let o = MountOptions::parse("writeback_cache,no_writeback_cache,parallel_dirops,async_read").unwrap();
        assert!(!o.writeback_cache && o.parallel_dirops && o.async_read);
    }

    #[test]
    fn profiles() {
        let b = MountOptions::parse("base").unwrap();
        assert_eq!(b, MountOptions::base());
        assert_eq!(
            (b.threads, b.max_write, b.writeback_cache, b.splice_read),
            (Some(1), 4096, false, false)
        );
        let o = MountOptions::parse("optimized").unwrap();
        assert_eq!(o, MountOptions::optimized());
        assert_eq!((o.threads, o.max_write, o.writeback_cache), (None, 131072, true));
        assert!(o.splice_read && o.splice_write && o.splice_move);
        // Later options win over the profile.
        let o = MountOptions::parse("optimized,max_write=65536,no_writeback_cache").unwrap();
        assert_eq!((o.max_write, o.writeback_cache, o.splice_move), (65536, false, true));
        assert_eq!(MountOptions::parse("base,threads=4").unwrap().threads, Some(4));
        let o = MountOptions::parse("uring_depth=16,uring_workers=2").unwrap();
        assert_eq!((o.uring_depth, o.uring_workers, o.transport), (16, 2, Transport::Dev));
        assert!(MountOptions::parse("uring_depth=0").is_err());
        assert!(MountOptions::parse("uring_workers=65").is_err());
    }

    #[test]
    fn spins() {
        type Field = fn(&MountOptions) -> Duration;
        let keys: [(&str, u64, Field); 2] = [("uring_spin", 20, |o| o.uring_spin), ("dev_spin", 25, |o| o.dev_spin)];
        for (key, default_us, field) in keys {
            let parse = |v: &str| MountOptions::parse(&format!("{key}{v}"));
            assert_eq!(
                field(&MountOptions::default()),
                Duration::from_micros(default_us),
                "{key}"
            );
            assert_eq!(field(&parse("=0").unwrap()), Duration::ZERO, "{key}");
            assert_eq!(field(&parse("=150").unwrap()), Duration::from_micros(150), "{key}");
            assert_eq!(field(&parse("=10000").unwrap()), Duration::from_millis(10), "{key}");
            for bad in ["", "=", "=10001", "=-1", "=2.5", "=1K"] {
                let e = parse(bad).unwrap_err();
                assert!(e.to_string().starts_with(&format!("-o {key}")), "{key}{bad}: {e}");
            }
        }
    }

    #[test]
    fn errors_name_the_option() {
        let e = MountOptions::parse("ro,bogus=1").unwrap_err();
        assert_eq!(e.option, "bogus=1");
        assert!(
            e.to_string().contains("bogus=1") && e.to_string().contains("unknown"),
            "{e}"
        );
        let e = MountOptions::parse("max_write=2M").unwrap_err();
        assert!(e.message.contains("1048576"), "{e}");
        assert!(MountOptions::parse("max_write=1025K").is_err());
        assert!(MountOptions::parse("max_write=100").is_err());
        assert!(MountOptions::parse("max_write=abc").is_err());
        assert!(MountOptions::parse("max_write").is_err());
        assert!(MountOptions::parse("max_write=99999999999999999999G").is_err());
        assert!(MountOptions::parse("ro=1").unwrap_err().message.contains("no value"));
        assert!(MountOptions::parse("readdirplus=maybe").is_err());
        assert!(MountOptions::parse("attr_timeout=-1").is_err());
        assert!(MountOptions::parse("attr_timeout=nan").is_err());
        assert!(MountOptions::parse("fsname=").is_err());
        assert!(MountOptions::parse("max_background=70000").is_err());
        let io: std::io::Error = MountOptions::parse("x").unwrap_err().into();
        assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
    }

    #[test]
    fn leftover_options_go_to_the_file_system() {
        let (o, rest) = MountOptions::parse_with_fs_options("ro,,xattr,cache=never,max_write=8192").unwrap();
        assert!(o.ro);
        assert_eq!(o.max_write, 8192);
        assert_eq!(
            rest,
            vec![
                ("xattr".to_string(), None),
                ("cache".to_string(), Some("never".to_string()))
            ]
        );
        // Malformed mount options stay errors even when leftovers are allowed.
        assert!(MountOptions::parse_with_fs_options("max_write=x,xattr").is_err());
    }

    #[test]
    fn fusermount_string() {
        let o = MountOptions::parse("ro,allow_other,fsname=a\\,b,subtype=mem,max_read=4096,noatime").unwrap();
        assert_eq!(
            o.fusermount_options(),
            "ro,nosuid,nodev,noatime,allow_other,fsname=a\\,b,subtype=mem,max_read=4096"
        );
    }
}
