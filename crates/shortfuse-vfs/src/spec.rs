//! The mounts a process serves in process, as `shortfuse run` hands them to
//! the preload shim in the `SHORTFUSE_MOUNTS` environment variable (and as
//! every child inherits them).
//!
//! Format: mounts separated by `;`, each `MOUNTPOINT=FS[:SOURCE][#OPTIONS]`
//! (a file system built in process) or `MOUNTPOINT[#OPTIONS]` (the
//! `shortfuse serve` daemon of that mount point, over shared-memory rings),
//! OPTIONS comma-separated as for `-o`. The separators `;` and `#` may not
//! appear in a mount point or a source; the mount point is absolute.
//!
//! Only the mount options that mean something without a kernel mount are
//! accepted ([`RUN_MOUNT_OPTIONS`]); anything that is not a mount option is
//! the file system's, which refuses what it does not know.

use std::time::Duration;

use shortfuse::cache::{CacheOptions, CACHE_KEYS};
use shortfuse::options::FsOptions;
use shortfuse::MountOptions;

/// Mount options a preloaded mount honours: `ro` (EROFS from every call
/// that would change the mount) and the cache timeouts the in-process
/// dispatcher hands to the shim's dentry and attribute cache.
pub const RUN_MOUNT_OPTIONS: &[(&str, &str)] = &[
    (
        "ro / rw",
        "read-only (calls that would change the mount fail with EROFS) or read-write (default)",
    ),
    (
        "attr_timeout=SECONDS",
        "how long the shim caches attributes (default 1)",
    ),
    ("entry_timeout=SECONDS", "how long the shim caches names (default 1)"),
    (
        "negative_timeout=SECONDS",
        "how long the shim caches missing names (default 0)",
    ),
    (
        "cache=on|off|auto",
        "the shim's page cache (write-through, read-ahead, reads clipped at EOF); auto: on for network file \
         systems (on a daemon's mount: on when its kernel mount is remote, sshfs's for one); on turns the mount's data maps off (its data must pass \
         through the cache)",
    ),
    (
        "page_size=N, ...",
        "the cache's sizes and policy (page_cache_size=, meta_cache_size=, cache_policy=, readahead=, \
         meta_timeout=, config=FILE), as for `shortfuse mount`",
    ),
];

const ALLOWED_KEYS: &[&str] = &["ro", "rw", "attr_timeout", "entry_timeout", "negative_timeout"];
// Cache options (CACHE_KEYS) are taken apart before these are checked.

/// One mount: where, which file system, over what, with which options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountSpec {
    /// Absolute, as given (normalised by the VFS).
    pub mountpoint: String,
    /// Empty: the daemon serving the mount point ([`MountSpec::is_daemon`]).
    pub fs: String,
    pub source: Option<String>,
    /// Comma-separated, as for `-o` (may be empty).
    pub options: String,
}

/// What a spec's options come to.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub ro: bool,
    pub attr_timeout: Option<Duration>,
    pub entry_timeout: Option<Duration>,
    pub negative_timeout: Option<Duration>,
    /// Options for the file system itself.
    pub fs: FsOptions,
    /// The in-process page and metadata cache (`-o cache=...`).
    pub cache: CacheOptions,
}

impl RunOptions {
    /// The dispatcher's options with these applied.
    pub fn mount_options(&self) -> MountOptions {
        let mut o = MountOptions {
            ro: self.ro,
            ..MountOptions::default()
        };
        if let Some(t) = self.attr_timeout {
            o.attr_timeout = t;
        }
        if let Some(t) = self.entry_timeout {
            o.entry_timeout = t;
        }
        if let Some(t) = self.negative_timeout {
            o.negative_timeout = t;
        }
        o
    }
}

fn forbidden(s: &str) -> Option<char> {
    s.chars().find(|c| matches!(c, ';' | '#' | '\0'))
}

impl MountSpec {
    /// A mount served by the `shortfuse serve` daemon of `mountpoint`.
    pub fn daemon(mountpoint: String, options: String) -> MountSpec {
        MountSpec {
            mountpoint,
            fs: String::new(),
            source: None,
            options,
        }
    }

    /// True for a mount whose requests go to a daemon over rings.
    pub fn is_daemon(&self) -> bool {
        self.fs.is_empty()
    }

    /// Parses `MOUNTPOINT=FS[:SOURCE][#OPTIONS]` or `MOUNTPOINT[#OPTIONS]`.
    pub fn parse(s: &str) -> Result<MountSpec, String> {
        let (rest, options) = match s.split_once('#') {
            Some((r, o)) => (r, o.to_string()),
            None => (s, String::new()),
        };
        let Some((mp, fs)) = rest.split_once('=') else {
            let spec = MountSpec::daemon(rest.to_string(), options);
            spec.check_syntax()?;
            return Ok(spec);
        };
        if fs.is_empty() || fs.starts_with(':') {
            return Err(format!("mount {s:?}: no file system named after '='"));
        }
        let (fs, source) = match fs.split_once(':') {
            Some((f, src)) => (f, Some(src.to_string())),
            None => (fs, None),
        };
        let spec = MountSpec {
            mountpoint: mp.to_string(),
            fs: fs.to_string(),
            source,
            options,
        };
        spec.check_syntax()?;
        Ok(spec)
    }

    /// The checks that do not look at the file system: an absolute mount
    /// point, a file system name, no separator inside a field, options that
    /// a preloaded mount honours.
    pub fn check_syntax(&self) -> Result<(), String> {
        if !self.mountpoint.starts_with('/') {
            return Err(format!("mount point {:?} is not an absolute path", self.mountpoint));
        }
        if crate::normalize(self.mountpoint.as_bytes()) == b"/" {
            return Err("mount point / would hide every file of the system".into());
        }
        if self.fs.is_empty() && self.source.is_some() {
            return Err(format!("mount {}: a SOURCE but no file system named", self.mountpoint));
        }
        for (what, v) in [
            ("mount point", Some(&self.mountpoint)),
            ("source", self.source.as_ref()),
        ] {
            if let Some(c) = v.and_then(|v| forbidden(v)) {
                return Err(format!(
                    "{what} {:?}: may not contain {c:?}",
                    v.map_or("", |v| v.as_str())
                ));
            }
        }
        if let Some(src) = &self.source {
            if src.is_empty() {
                return Err(format!("mount {}: empty SOURCE after '{}:'", self.mountpoint, self.fs));
            }
        }
        let run = self.run_options()?;
        if self.is_daemon() {
            let timeouts = [
                ("attr_timeout", run.attr_timeout),
                ("entry_timeout", run.entry_timeout),
                ("negative_timeout", run.negative_timeout),
            ];
            if let Some((k, _)) = timeouts.iter().find(|(_, t)| t.is_some()) {
                return Err(format!(
                    "mount {}: -o {k} is the daemon's: give it to `shortfuse serve`",
                    self.mountpoint
                ));
            }
            // The cache options are the program's own page cache in front
            // of the daemon (off unless `cache=on`: a daemon does not say
            // whether it is remote).
            if let Some((k, _)) = run.fs.first() {
                return Err(format!(
                    "mount {}: -o {k} is the file system's: give it to `shortfuse serve`",
                    self.mountpoint
                ));
            }
        }
        Ok(())
    }

    /// Splits the options into the ones a preloaded mount honours and the
    /// file system's; refuses kernel mount options that mean nothing here.
    pub fn run_options(&self) -> Result<RunOptions, String> {
        if let Some(c) = forbidden(&self.options) {
            return Err(format!("options {:?}: may not contain {c:?}", self.options));
        }
        let mut out = RunOptions::default();
        let mut cache = FsOptions::new();
        for item in self.options.split(',').filter(|i| !i.is_empty()) {
            let (key, value) = item.split_once('=').map_or((item, None), |(k, v)| (k, Some(v)));
            if CACHE_KEYS.contains(&key) {
                cache.push((key.to_string(), value.map(str::to_string)));
                continue;
            }
            let mut scratch = MountOptions::default();
            let mut rest = FsOptions::new();
            scratch.apply(item, Some(&mut rest)).map_err(|e| e.to_string())?;
            if !rest.is_empty() {
                out.fs.extend(rest);
                continue;
            }
            let key = item.split_once('=').map_or(item, |(k, _)| k);
            if !ALLOWED_KEYS.contains(&key) {
                return Err(format!(
                    "-o {item}: a kernel mount option, meaningless for a preloaded mount (these work: {})",
                    ALLOWED_KEYS.join(", ")
                ));
            }
            match key {
                "ro" => out.ro = true,
                "rw" => out.ro = false,
                "attr_timeout" => out.attr_timeout = Some(scratch.attr_timeout),
                "entry_timeout" => out.entry_timeout = Some(scratch.entry_timeout),
                "negative_timeout" => out.negative_timeout = Some(scratch.negative_timeout),
                _ => {}
            }
        }
        // `run` has already read a config=FILE into the values it holds.
        out.cache = CacheOptions::take_expanded(&mut cache)?;
        out.cache.config()?;
        Ok(out)
    }

    /// The spec in `SHORTFUSE_MOUNTS` form.
    pub fn to_env(&self) -> String {
        let mut s = if self.is_daemon() {
            self.mountpoint.clone()
        } else {
            format!("{}={}", self.mountpoint, self.fs)
        };
        if let Some(src) = &self.source {
            s.push(':');
            s.push_str(src);
        }
        if !self.options.is_empty() {
            s.push('#');
            s.push_str(&self.options);
        }
        s
    }
}

/// Parses a whole `SHORTFUSE_MOUNTS` value; two mounts at one mount point
/// are refused.
pub fn parse_mounts(s: &str) -> Result<Vec<MountSpec>, String> {
    let specs: Vec<MountSpec> = s
        .split(';')
        .filter(|m| !m.is_empty())
        .map(MountSpec::parse)
        .collect::<Result<_, _>>()?;
    check_distinct(&specs)?;
    Ok(specs)
}

/// Refuses two mounts at one (normalised) mount point.
pub fn check_distinct(specs: &[MountSpec]) -> Result<(), String> {
    for (i, a) in specs.iter().enumerate() {
        for b in &specs[..i] {
            if crate::normalize(a.mountpoint.as_bytes()) == crate::normalize(b.mountpoint.as_bytes()) {
                return Err(format!("two mounts at {}", a.mountpoint));
            }
        }
    }
    Ok(())
}

/// The `SHORTFUSE_MOUNTS` value for `specs`.
pub fn format_mounts(specs: &[MountSpec]) -> String {
    specs.iter().map(MountSpec::to_env).collect::<Vec<_>>().join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_environment_form() {
        let s = "/mnt/a=mem;/mnt/b=passthrough:/srv/x#ro,attr_timeout=5,symlinks=beneath";
        let specs = parse_mounts(s).unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[1].source.as_deref(), Some("/srv/x"));
        assert_eq!(format_mounts(&specs), s);
        let o = specs[1].run_options().unwrap();
        assert!(o.ro);
        assert_eq!(o.attr_timeout, Some(Duration::from_secs(5)));
        assert_eq!(o.fs, vec![("symlinks".to_string(), Some("beneath".to_string()))]);
        assert_eq!(o.mount_options().attr_timeout, Duration::from_secs(5));
        assert!(
            !o.cache.enabled(false) && o.cache.enabled(true),
            "auto: on for a network file system"
        );
        let c = MountSpec::parse("/m=passthrough:/x#cache=on,page_size=64K,symlinks=raw")
            .unwrap()
            .run_options()
            .unwrap();
        assert!(c.cache.enabled(false));
        assert_eq!(c.cache.page_size, 65536);
        assert_eq!(c.fs.len(), 1, "the cache's options are not the file system's");
        assert!(MountSpec::parse("/m=mem#page_size=3").is_err());
        // A source may hold ':' (only the first one splits).
        let c = MountSpec::parse("/m=passthrough:/a:b").unwrap();
        assert_eq!(c.source.as_deref(), Some("/a:b"));
    }

    #[test]
    fn a_mount_point_alone_names_its_daemon() {
        let specs = parse_mounts("/mnt/d#ro;/mnt/m=mem").unwrap();
        assert!(specs[0].is_daemon() && !specs[1].is_daemon());
        assert_eq!(specs[0].mountpoint, "/mnt/d");
        assert!(specs[0].run_options().unwrap().ro);
        assert_eq!(format_mounts(&specs), "/mnt/d#ro;/mnt/m=mem");
        let err = parse_mounts("/mnt/d#symlinks=raw").unwrap_err();
        assert!(err.contains("shortfuse serve"), "{err}");
        let on = parse_mounts("/mnt/d#cache=on,page_size=64K").unwrap();
        assert!(on[0].run_options().unwrap().cache.enabled(false));
        assert!(!parse_mounts("/mnt/d").unwrap()[0]
            .run_options()
            .unwrap()
            .cache
            .enabled(false));
    }

    #[test]
    fn refuses_what_it_cannot_serve() {
        for bad in [
            "mnt=mem",
            "mnt",
            "/=mem",
            "/mnt/a=",
            "/mnt/a=passthrough:",
            "/mnt/a=mem#allow_other",
            "/mnt/a=mem#writeback_cache",
            "/mnt/a=mem#attr_timeout=x",
        ] {
            assert!(parse_mounts(bad).is_err(), "{bad}");
        }
        assert!(parse_mounts("/m=mem;/m/=mem").unwrap_err().contains("two mounts"));
        let spec = MountSpec {
            mountpoint: "/m".into(),
            fs: "passthrough".into(),
            source: Some("/a;b".into()),
            options: String::new(),
        };
        assert!(spec.check_syntax().unwrap_err().contains("may not contain"));
    }
}
