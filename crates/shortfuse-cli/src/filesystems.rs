//! The file systems `shortfuse mount` knows, built from a name, an optional
//! SOURCE and the `-o` options the mount itself did not take.

use std::io;
use std::path::Path;
use std::sync::Arc;

use shortfuse::cache::{CacheOptions, CachedFs};
use shortfuse::options::FsOptions;
use shortfuse::{Filesystem, MountOptions};

/// Builds a file system from SOURCE and its own `-o` options.
type Builder = fn(Option<&Path>, &FsOptions) -> io::Result<Arc<dyn Filesystem>>;

/// One bundled file system.
pub struct FsKind {
    pub name: &'static str,
    /// What SOURCE means, or `None` when it takes none.
    pub source: Option<&'static str>,
    pub about: &'static str,
    /// The daemon does not check permissions itself (it relies on the
    /// kernel's `default_permissions`), so the mount always asks for them.
    pub kernel_permissions: bool,
    /// Reads cost a round trip and nothing below caches them: `-o
    /// cache=auto` puts the user-space cache in front (the Prefuse-SSHFS caching thesis).
    pub network: bool,
    build: Builder,
}

/// Every file system, in help order.
pub const ALL: &[FsKind] = &[
    FsKind {
        name: "null",
        source: None,
        about: "NullFS from RFUSE (FAST '24): lookups fail, create succeeds, nothing is kept",
        kernel_permissions: false,
        network: false,
        build: |_, rest| {
            no_options("null", rest)?;
            Ok(Arc::new(shortfuse_fs::null::NullFs::new()))
        },
    },
    FsKind {
        name: "mem",
        source: None,
        about: "in-memory POSIX file system",
        kernel_permissions: false,
        network: false,
        build: |_, rest| {
            no_options("mem", rest)?;
            let (uid, gid) = crate::sys::effective_ids();
            Ok(Arc::new(shortfuse_fs::mem::MemFs::with_root_owner(uid, gid)))
        },
    },
    FsKind {
        name: "passthrough",
        source: Some("the directory to mirror"),
        about: "mirrors SOURCE (-o symlinks=raw|beneath, one_file_system, path_fds=N)",
        kernel_permissions: true,
        network: false,
        build: |src, rest| {
            let src = existing_dir(src)?;
            let fs = shortfuse_fs::passthrough::PassthroughFs::with_options(src, rest)
                .map_err(|e| io::Error::new(e.kind(), format!("passthrough {}: {e}", src.display())))?;
            Ok(Arc::new(fs))
        },
    },
    FsKind {
        name: "stripe",
        source: Some("DIR1,DIR2,... (1 to 16 directories)"),
        about: "each file split over the SOURCE directories, one chunk each (-o stripe_size=N, default 1M)",
        kernel_permissions: true,
        network: false,
        build: |src, rest| {
            let src = src.ok_or_else(|| invalid("stripe needs SOURCE: DIR1,DIR2,...".into()))?;
            if let Some((k, v)) = rest.iter().find(|(k, _)| k != "stripe_size") {
                return Err(unknown("stripe", k, v));
            }
            Ok(Arc::new(shortfuse_fs::stripe::StripeFs::with_options(&src.to_string_lossy(), rest)?))
        },
    },
    FsKind {
        name: "pack",
        source: Some("the directory holding containers and index"),
        about: "small files packed into container files with an index",
        kernel_permissions: true,
        network: false,
        build: |src, rest| {
            no_options("pack", rest)?;
            let src = existing_dir(src)?;
            Ok(Arc::new(shortfuse_fs::pack::PackFs::new(src)?))
        },
    },
    FsKind {
        name: "sftp",
        source: Some("[user@]host:[path] on an SSH server"),
        about: "a remote directory over SFTP, like sshfs (-o port=,identity=,reconnect,StrictHostKeyChecking=,...)",
        kernel_permissions: false,
        network: true,
        build: |src, rest| {
            let target = src.ok_or_else(|| invalid("sftp needs SOURCE: [user@]host:[path]".into()))?;
            Ok(Arc::new(shortfuse_fs::sftp::SftpFs::connect(
                &target.to_string_lossy(),
                rest,
            )?))
        },
    },
    FsKind {
        name: "dist",
        source: Some("ADDR (host:port) of a `shortfuse dist up` server"),
        about: "distfs client: write-back cache kept strongly consistent by per-file leases (-o consistency=lease|writethrough|weak)",
        // Not `network` for the cache: distfs caches in its client under
        // leases; pages kept in front of it would outlive a revoked lease.
        kernel_permissions: true,
        network: false,
        build: |src, rest| {
            let addr = src.ok_or_else(|| invalid("dist needs SOURCE: ADDR".into()))?;
            let cfg = shortfuse_dist::client::ClientConfig::from_options(addr.to_string_lossy(), rest)?;
            let fs = shortfuse_dist::client::DistFs::new(cfg)
                .map_err(|e| io::Error::new(e.kind(), format!("dist {}: {e}", addr.display())))?;
            Ok(Arc::new(fs))
        },
    },
];

/// The file system called `name`, built over `source` with `rest`; also
/// turns on what the mount must carry for it.
pub fn build(
    name: &str,
    source: Option<&Path>,
    rest: &FsOptions,
    opts: &mut MountOptions,
) -> io::Result<Arc<dyn Filesystem>> {
    let kind = ALL.iter().find(|k| k.name == name).ok_or_else(|| {
        let names: Vec<_> = ALL.iter().map(|k| k.name).collect();
        invalid(format!("unknown file system {name:?}: choose {}", names.join(", ")))
    })?;
    match (kind.source, source) {
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
    if kind.kernel_permissions {
        opts.default_permissions = true;
    }
    (kind.build)(source, rest)
}

/// The cache tier of a daemon, over whichever file system it serves.
pub type DaemonCache = CachedFs<dyn Filesystem>;

/// What [`with_cache`] made: the file system to serve, and its cache when on.
pub struct Cached {
    pub fs: Arc<dyn Filesystem>,
    pub cache: Option<Arc<DaemonCache>>,
}

/// The daemon's cache tier: `fs` behind a [`CachedFs`] when the cache
/// options turn it on for this kind of file system (one tier for every
/// client of the daemon). Says what it chose on stderr unless that is the
/// default's silent choice.
pub fn with_cache(name: &str, fs: Arc<dyn Filesystem>, cache: &CacheOptions) -> io::Result<Cached> {
    let network = ALL.iter().any(|k| k.name == name && k.network);
    if let Some(line) = cache.describe(name, network) {
        eprintln!("shortfuse: {line}");
    }
    if !cache.enabled(network) {
        return Ok(Cached { fs, cache: None });
    }
    let config = cache.config().map_err(invalid)?;
    let cached = Arc::new(CachedFs::new(fs, config).map_err(invalid)?);
    Ok(Cached {
        fs: cached.clone(),
        cache: Some(cached),
    })
}

/// One line per file system, for `--help`.
pub fn help() -> String {
    let mut s = String::from("File systems:\n");
    for k in ALL {
        let src = k.source.map(|s| format!(" SOURCE = {s};")).unwrap_or_default();
        s.push_str(&format!("  {:<12}{src} {}\n", k.name, k.about));
    }
    s
}

fn existing_dir(src: Option<&Path>) -> io::Result<&Path> {
    let src = src.ok_or_else(|| invalid("SOURCE is missing".into()))?;
    match std::fs::metadata(src) {
        Ok(md) if md.is_dir() => Ok(src),
        Ok(_) => Err(invalid(format!("source {} is not a directory", src.display()))),
        Err(e) => Err(io::Error::new(e.kind(), format!("source {}: {e}", src.display()))),
    }
}

fn no_options(name: &str, rest: &FsOptions) -> io::Result<()> {
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

pub fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}
