//! The bundled file systems by name: what each takes and how it is built.
//!
//! Every front end reads this one table: `shortfuse mount`, `serve` and
//! mount(8)'s helpers build a daemon's file system from it
//! ([`Host::Daemon`]), `shortfuse run` and the preload shim build one in
//! the program's own process ([`Host::InProcess`], only where
//! [`FsKind::in_process`] says so), and the caches ask it whether reads
//! cost a round trip ([`FsKind::network`]). What sets one file system apart
//! from another (a local directory mirrored name for name, a list of
//! directories, a remote host) is a property here, never a comparison of
//! its name elsewhere.
//!
//! The table is split by what a file system links: [`LOCAL`] holds those
//! built on the local machine's own calls, [`SFTP`] the one that brings an
//! SSH client and an async runtime with it. Every process started under
//! `shortfuse run` loads the preload shim, and the dynamic loader relocates
//! all of it before the program's first instruction; the shim every
//! process loads therefore links [`LOCAL`] alone (naming [`SFTP`], or
//! [`bundled`] and [`FsKind::find`] that name it, would link the SSH stack
//! into it), and a second build of the shim, which `run` picks only for an
//! sftp mount, links both.
//!
//! Adding a file system: its module in this crate and one [`LOCAL`] line
//! (or a static of its own beside [`SFTP`], when it links a stack of that
//! weight). A file system of another crate (distfs) declares its [`FsKind`]
//! there; the command line lists it after these.

use std::io;
use std::path::Path;
use std::sync::Arc;

use shortfuse::options::FsOptions;
use shortfuse::Filesystem;

/// What a file system's SOURCE is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// It takes none.
    None,
    /// A directory of the local file system (made absolute by `run`).
    Dir(&'static str),
    /// Comma-separated local directories (each made absolute by `run`).
    Dirs(&'static str),
    /// `[user@]host:[path]` on an SSH server (`run` resolves the path on
    /// the server before the program starts).
    Remote(&'static str),
    /// The network address of a server.
    Address(&'static str),
}

impl Source {
    /// What SOURCE means, for help and errors; `None` when it takes none.
    pub fn describe(self) -> Option<&'static str> {
        match self {
            Source::None => None,
            Source::Dir(s) | Source::Dirs(s) | Source::Remote(s) | Source::Address(s) => Some(s),
        }
    }
}

/// Where the file system is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    /// A daemon (`shortfuse mount`, `serve`) running with these effective
    /// ids: they own the root of a file system that starts empty.
    Daemon { uid: u32, gid: u32 },
    /// The program's own process (the preload shim): no threads of the
    /// file system's own, no connection before first use.
    InProcess,
}

/// Where a file system built in the program's own process keeps its
/// descriptors (those that are not the program's files): at this number or
/// above. The low numbers are the program's (a shell's `exec 3> f` is
/// `dup2(fd, 3)`), and the shim moves every descriptor its file systems
/// open while they serve a call above it.
pub const IN_PROCESS_FD_FLOOR: i32 = 100;

/// What a builder gets.
pub struct Build<'a> {
    /// Present exactly when the kind takes one (checked by [`FsKind::build`]).
    pub source: Option<&'a Path>,
    /// The `-o` options no mount option claimed, for the file system.
    pub options: &'a FsOptions,
    pub host: Host,
}

/// One file system a front end can build by name.
pub struct FsKind {
    pub name: &'static str,
    pub source: Source,
    /// One line for `--help`.
    pub about: &'static str,
    /// Its own `-o` options, for `--help` (empty: none).
    pub options: &'static str,
    /// The daemon does not check permissions itself (it relies on the
    /// kernel's `default_permissions`), so the mount asks for them; a
    /// `mirror`'s source checks the daemon's own rights, so its mount asks
    /// only where a caller's rights can differ from the daemon's (see
    /// `shortfuse mount --help`).
    pub kernel_permissions: bool,
    /// Reads cost a round trip and nothing below caches them: `-o
    /// cache=auto` puts the user-space cache in front (the Prefuse-SSHFS
    /// caching thesis).
    pub network: bool,
    /// SOURCE is a local directory mirrored name for name: other processes
    /// change it behind the mount (the shim caches no attributes of it),
    /// every call is the same call on it with the daemon's rights (a
    /// daemon running as root takes on each caller's credentials where it
    /// can), and the shim can hand out descriptors of its backing files.
    pub mirror: bool,
    /// The preload shim can build it inside the program (`shortfuse run`).
    pub in_process: bool,
    /// Built in process, it keeps no descriptor below [`IN_PROCESS_FD_FLOOR`]
    /// (it opens none, or places its own above): the shim need not hold
    /// the program's low numbers while it is built.
    pub low_fds_free: bool,
    /// Mount options `shortfuse mount` applies before the user's own (which
    /// win), with what each trades, for `--help`: `(option, why)`.
    pub mount_defaults: &'static [(&'static str, &'static str)],
    /// Makes it; called through [`FsKind::build`], which checks SOURCE.
    pub build: fn(&Build<'_>) -> io::Result<Arc<dyn Filesystem>>,
}

/// `passthrough`'s mount defaults.
///
/// Missing names are cached as long as names are (`entry_timeout`, 1 s by
/// default): a failing lookup (a shell's `$PATH` search, a compiler's
/// include path) is then answered by the kernel instead of a round trip to
/// the daemon. A name created through the mount replaces the cached miss at
/// once (the kernel fills the negative dentry it made the file in); one
/// created in the source behind the mount shows up within the timeout, as a
/// removed one already disappears only then.
///
/// Kernel passthrough: the kernel reads and writes each open file's source
/// file itself, at the source's own speed (the page cache of the source is
/// the only one, so a change made behind the mount shows at once). The
/// mount leaves it out where it cannot work: for a user other than root
/// (registering a backing file needs CAP_SYS_ADMIN) and beside the user's
/// `writeback_cache` (or `optimized`), which the kernel does not combine with
/// it; a kernel older than 6.9 does not offer it and the daemon serves the
/// data.
///
/// The reader cache: a read-only open of a file that no open passes through
/// is served from the mount's own page cache instead, kept across opens
/// while the file's size and times stay as they were. A read of cached data
/// then costs what it costs on a plain FUSE mount (bindfs), where the
/// passthrough read path reads a second file beneath the first; the first
/// read of the data goes through the daemon, and the data is cached twice
/// (in the source's page cache and the mount's). It takes files of up to
/// 1 MiB (`reader_cache_max`): a large cached file read sequentially in big
/// calls is several times slower from the mount's page cache (single pages)
/// than through passthrough from the source's (ext4's large folios;
/// measured with 1 MiB reads), so larger files are passed through to
/// readers too. A change made in SOURCE
/// behind the mount shows at the next open, or within `attr_timeout` to a
/// file kept open. The write-back cache is no default: with it the kernel keeps a
/// file's size and times itself, so a change made in SOURCE behind the mount
/// could be overwritten or hidden.
pub const PASSTHROUGH_DEFAULTS: &[(&str, &str)] = &[
    (
        "negative_timeout=1",
        "missing names cached as long as names (1 s): a name created in SOURCE behind the mount shows after at most 1 s; negative_timeout=0 asks the source every time",
    ),
    (
        "passthrough",
        "as root, on Linux 6.9+: the kernel reads, writes and maps each open file's source file itself, at the source's speed; the daemon sees no READ or WRITE (not in `shortfuse stats`, and the cache= tier then serves no file data); left out for other users and beside writeback_cache or optimized; no_passthrough serves file data in the daemon. (writeback_cache is no default: the kernel would keep sizes and times itself, and a change made in SOURCE behind the mount could be lost; where nothing but the mount changes SOURCE, -o writeback_cache lets a small write land in the mount's page cache, faster than a passthrough write into the source, and turns passthrough off)",
    ),
    (
        "reader_cache",
        "with passthrough: a read-only open of a file of up to 1 MiB (reader_cache_max) that no open passes through reads from the mount's page cache, kept across opens while the file's size and times are unchanged, so a cached read costs one copy, as on bindfs, instead of the passthrough path's read of a second file; the first read of the data goes through the daemon and the data is cached twice (source and mount); a change made in SOURCE behind the mount shows at the next open; a default because small cached reads (a build's headers, a script's modules) are the common case; a larger file is passed through to readers too, since the mount's page cache is built of single pages where ext4's has large folios, so a big read call copies several times slower from it (and the second copy costs memory); no_reader_cache passes every reader through, reader_cache_max=SIZE moves the bound",
    ),
];

/// `sftp`'s mount defaults: the kernel trusts names, attributes and
/// directory listings as long as sshfs's own caches do (its
/// `dcache_timeout`, 20 s), so a second walk of a tree (`ls -lR`, `find`, a
/// build's stat of every file) is answered by the kernel without a round
/// trip to the daemon or the server, even when the first walk took longer
/// than a second. What another client changes on the server shows within
/// that time, and a file's new size or contents at its next open (the
/// daemon checks at each open); what is changed through the mount shows at
/// once.
pub const SFTP_DEFAULTS: &[(&str, &str)] = &[
    (
        "entry_timeout=20",
        "names and directory listings trusted for 20 s, as sshfs's directory cache: a second `ls -lR` costs no round trip; a name another client adds or removes on the server shows within 20 s (through the mount at once); entry_timeout=1 for 1 s",
    ),
    (
        "attr_timeout=20",
        "attributes trusted for 20 s, as sshfs's: a size, mode or time another client changes on the server shows to `stat` within 20 s, and a file's size and contents at its next open; attr_timeout=1 for 1 s",
    ),
];

/// Whether a file system's mount default `option` can work for a daemon
/// running with effective user id `euid`: kernel passthrough needs
/// CAP_SYS_ADMIN to register backing files, which only root has here.
pub fn default_applies(option: &str, euid: u32) -> bool {
    option != "passthrough" || euid == 0
}

/// Every file system of this crate, in help order.
pub fn bundled() -> impl Iterator<Item = &'static FsKind> + Clone {
    LOCAL.iter().chain([&SFTP])
}

/// The file systems of this crate that link no network stack, in help
/// order: all that the preload shim every process loads can build (see the
/// module's documentation).
pub static LOCAL: &[FsKind] = &[
    FsKind {
        name: "null",
        source: Source::None,
        about: "NullFS from RFUSE (FAST '24): lookups fail, create succeeds, nothing is kept",
        options: "",
        kernel_permissions: false,
        network: false,
        mirror: false,
        in_process: true,
        low_fds_free: true,
        mount_defaults: &[],
        build: |b| {
            no_options("null", b.options)?;
            Ok(Arc::new(crate::null::NullFs::new()))
        },
    },
    FsKind {
        name: "mem",
        source: Source::None,
        about: "in-memory POSIX file system",
        options: "",
        // mem checks permissions itself (for the preload paths), but a
        // kernel mount asks it nothing about names it has cached: the
        // search permission of the directories on a path, the
        // protected_hardlinks rule and the other checks of the kernel's VFS
        // come only from default_permissions.
        kernel_permissions: true,
        network: false,
        mirror: false,
        in_process: true,
        low_fds_free: true,
        mount_defaults: &[],
        build: |b| {
            no_options("mem", b.options)?;
            Ok(Arc::new(match b.host {
                Host::Daemon { uid, gid } => crate::mem::MemFs::with_root_owner(uid, gid),
                Host::InProcess => crate::mem::MemFs::new(),
            }))
        },
    },
    FsKind {
        name: "passthrough",
        source: Source::Dir("the directory to mirror"),
        about: "mirrors SOURCE",
        options: "symlinks=raw|beneath, one_file_system, path_fds=N",
        kernel_permissions: true,
        network: false,
        mirror: true,
        in_process: true,
        low_fds_free: true,
        mount_defaults: PASSTHROUGH_DEFAULTS,
        build: |b| {
            let src = source_dir(b)?;
            let fs = match b.host {
                Host::Daemon { .. } => crate::passthrough::PassthroughFs::with_options(src, b.options),
                Host::InProcess => crate::passthrough::PassthroughFs::in_process(src, b.options),
            };
            Ok(Arc::new(naming("passthrough", src, fs)?))
        },
    },
    FsKind {
        name: "stripe",
        // The 1-to-M map of DeFUSE, served by the shim's fast path.
        source: Source::Dirs("DIR1,DIR2,... (1 to 16 directories)"),
        about: "each file split over the SOURCE directories, one chunk each",
        options: "stripe_size=N, default 1M",
        kernel_permissions: true,
        network: false,
        mirror: false,
        in_process: true,
        low_fds_free: false,
        mount_defaults: &[],
        build: |b| {
            if let Some((k, v)) = b.options.iter().find(|(k, _)| k != "stripe_size") {
                return Err(unknown("stripe", k, v));
            }
            let src = source(b)?;
            Ok(Arc::new(crate::stripe::StripeFs::with_options(
                &src.to_string_lossy(),
                b.options,
            )?))
        },
    },
    FsKind {
        name: "pack",
        // The M-to-1 map of DeFUSE.
        source: Source::Dir("the directory holding containers and index"),
        about: "small files packed into container files with an index",
        options: "",
        kernel_permissions: true,
        network: false,
        mirror: false,
        in_process: true,
        low_fds_free: false,
        mount_defaults: &[],
        build: |b| {
            no_options("pack", b.options)?;
            let src = source_dir(b)?;
            Ok(Arc::new(naming("pack", src, crate::pack::PackFs::new(src))?))
        },
    },
];

/// sftp: a remote directory over SSH (russh, tokio and their crypto), kept
/// out of [`LOCAL`] so that a process with no sftp mount does not load them.
pub static SFTP: FsKind = FsKind {
    name: "sftp",
    source: Source::Remote("[user@]host:[path] on an SSH server"),
    about: "a remote directory over SFTP, like sshfs",
    options: "port=,identity=,reconnect,StrictHostKeyChecking=,...",
    kernel_permissions: false,
    network: true,
    mirror: false,
    in_process: true,
    low_fds_free: false,
    mount_defaults: SFTP_DEFAULTS,
    build: |b| {
        let target = source(b)?.to_string_lossy();
        Ok(Arc::new(match b.host {
            Host::Daemon { .. } => crate::sftp::SftpFs::connect(&target, b.options)?,
            // No threads of its own, connects on first use, reconnects
            // in a forked child.
            Host::InProcess => crate::sftp::SftpFs::in_process(&target, b.options)?,
        }))
    },
};

impl FsKind {
    /// The bundled file system called `name`.
    pub fn find(name: &str) -> Option<&'static FsKind> {
        bundled().find(|k| k.name == name)
    }

    /// Builds it over `source` with `options` for `host`, after checking
    /// that SOURCE is given exactly when it takes one.
    pub fn build(&self, source: Option<&Path>, options: &FsOptions, host: Host) -> io::Result<Arc<dyn Filesystem>> {
        let name = self.name;
        match (self.source.describe(), source) {
            (Some(what), None) => {
                return Err(invalid(format!(
                    "{name} needs a SOURCE ({what}): shortfuse mount {name} SOURCE MOUNTPOINT"
                )))
            }
            (None, Some(s)) => {
                return Err(invalid(format!(
                    "{name} takes no SOURCE (got {}): shortfuse mount {name} MOUNTPOINT",
                    s.display()
                )))
            }
            _ => {}
        }
        (self.build)(&Build { source, options, host })
    }

    /// `about` with the options, for `--help`.
    pub fn help(&self) -> String {
        if self.options.is_empty() {
            self.about.to_string()
        } else {
            format!("{} (-o {})", self.about, self.options)
        }
    }
}

fn source<'a>(b: &Build<'a>) -> io::Result<&'a Path> {
    b.source.ok_or_else(|| invalid("SOURCE is missing".into()))
}

/// The SOURCE directory. In process the shim reports what the file system
/// says; a daemon checks first, for a message naming the source.
fn source_dir<'a>(b: &Build<'a>) -> io::Result<&'a Path> {
    let src = source(b)?;
    if matches!(b.host, Host::Daemon { .. }) {
        existing_dir(src)?;
    }
    Ok(src)
}

/// `r`'s error, prefixed with the file system's name and source.
fn naming<T>(name: &str, src: &Path, r: io::Result<T>) -> io::Result<T> {
    r.map_err(|e| io::Error::new(e.kind(), format!("{name} {}: {e}", src.display())))
}

fn existing_dir(src: &Path) -> io::Result<()> {
    match std::fs::metadata(src) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(invalid(format!("source {} is not a directory", src.display()))),
        Err(e) => Err(io::Error::new(e.kind(), format!("source {}: {e}", src.display()))),
    }
}

/// Refuses any option: the file system called `name` takes none.
pub fn no_options(name: &str, rest: &FsOptions) -> io::Result<()> {
    match rest.first() {
        None => Ok(()),
        Some((k, v)) => Err(unknown(name, k, v)),
    }
}

fn unknown(name: &str, k: &str, v: &Option<String>) -> io::Error {
    invalid(format!(
        "-o {k}{}: unknown option (neither a mount option nor one of the {name} file system)",
        v.as_ref().map(|v| format!("={v}")).unwrap_or_default()
    ))
}

/// An `InvalidInput` error saying `msg`.
pub fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_sources_are_checked() {
        let all: Vec<&FsKind> = bundled().collect();
        for (i, k) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|o| o.name != k.name), "{} twice", k.name);
            assert_eq!(FsKind::find(k.name).map(|f| f.name), Some(k.name));
            let opts = FsOptions::new();
            let wrong = match k.source {
                Source::None => Some(Path::new("/tmp")),
                _ => None,
            };
            let e = k.build(wrong, &opts, Host::InProcess).err().unwrap();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{}: {e}", k.name);
        }
        assert!(FsKind::find("ext9").is_none());
    }
}
