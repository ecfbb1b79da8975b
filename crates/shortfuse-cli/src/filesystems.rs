//! The file systems `shortfuse mount` knows, built from a name, an optional
//! SOURCE and the `-o` options the mount itself did not take.

use std::io;
use std::path::Path;
use std::sync::Arc;

use shortfuse::cache::{CacheOptions, CachedFs};
use shortfuse::options::FsOptions;
use shortfuse::{Filesystem, MountOptions};
pub use shortfuse_fs::registry::invalid;
use shortfuse_fs::registry::{bundled, FsKind, Host};

use crate::rights::DaemonRights;

/// Every file system the command line knows, in help order: the bundled
/// ones, then distfs.
pub fn all() -> impl Iterator<Item = &'static FsKind> {
    bundled().chain([&shortfuse_dist::KIND])
}

/// The file system called `name`.
pub fn find(name: &str) -> io::Result<&'static FsKind> {
    all().find(|k| k.name == name).ok_or_else(|| {
        let names: Vec<_> = all().map(|k| k.name).collect();
        invalid(format!("unknown file system {name:?}: choose {}", names.join(", ")))
    })
}

/// The file system called `name`, built for a daemon over `source` with
/// `rest`; also turns on what the mount must carry for it (`opts`, the
/// mount's options, already hold the user's).
pub fn build(
    name: &str,
    source: Option<&Path>,
    rest: &FsOptions,
    opts: &mut MountOptions,
) -> io::Result<Arc<dyn Filesystem>> {
    let kind = find(name)?;
    if crate::rights::kernel_checks(kind, opts.allow_other, DaemonRights::of_this_process()) {
        opts.default_permissions = true;
    }
    let (uid, gid) = crate::sys::effective_ids();
    kind.build(source, rest, Host::Daemon { uid, gid })
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
    let network = all().any(|k| k.name == name && k.network);
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
    for k in all() {
        let src = k
            .source
            .describe()
            .map(|s| format!(" SOURCE = {s};"))
            .unwrap_or_default();
        s.push_str(&format!("  {:<12}{src} {}\n", k.name, k.help()));
    }
    s
}
