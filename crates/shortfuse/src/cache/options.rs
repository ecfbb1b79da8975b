//! The cache's options, the same from `-o` and from a TOML file:
//!
//! ```toml
//! # -o config=/etc/shortfuse/cache.toml; -o options given beside it win.
//! cache = "auto"            # on | off | auto (true/false also accepted)
//! page_size = 131072        # bytes per page (a power of two >= 4096)
//! page_cache_size = "256M"  # bytes of cached data (a number or K/M/G)
//! meta_cache_size = 5000    # attributes and names cached
//! cache_policy = "clock"    # clock | lru
//! readahead = 8             # pages fetched by a sequential miss
//! meta_timeout = 1.0        # seconds a cached attribute or name is trusted
//! ```
//!
//! `auto` is the conclusion of the Prefuse-SSHFS caching thesis made automatic: on for network file
//! systems (their reads cost a round trip and nothing below caches them),
//! off where the kernel page cache already holds the data (local backing
//! files, 1-to-1 data maps), where a cache would only double it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::page::Policy;
use super::CacheConfig;
use crate::options::{seconds_value, size_value, FsOptions};

/// `-o cache=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheMode {
    /// Cache pages and metadata.
    On,
    /// No cache: every request goes to the file system.
    Off,
    /// On for network file systems, off otherwise.
    #[default]
    Auto,
}

impl CacheMode {
    /// The name `-o cache=` takes.
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::On => "on",
            CacheMode::Off => "off",
            CacheMode::Auto => "auto",
        }
    }
}

/// Every cache option of a mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheOptions {
    /// On, off, or on for network file systems only.
    pub mode: CacheMode,
    /// Bytes per cached page.
    pub page_size: usize,
    /// Bytes of page data at most.
    pub page_cache_size: usize,
    /// Cached attributes and names at most (each).
    pub meta_cache_size: usize,
    /// Which page to evict when the cache is full.
    pub policy: Policy,
    /// Pages fetched at once by a sequential miss (1: no read-ahead).
    pub readahead: usize,
    /// How long a cached attribute or name is trusted.
    pub meta_timeout: Duration,
    /// The TOML file the options came from, if any.
    pub config: Option<PathBuf>,
}

impl Default for CacheOptions {
    fn default() -> CacheOptions {
        let c = CacheConfig::default();
        CacheOptions {
            mode: CacheMode::Auto,
            page_size: c.page_size,
            page_cache_size: c.capacity,
            meta_cache_size: c.meta_entries,
            policy: c.policy,
            readahead: c.readahead,
            meta_timeout: c.meta_ttl,
            config: None,
        }
    }
}

/// One line of help per cache option.
pub const CACHE_OPTION_HELP: &[(&str, &str)] = &[
    (
        "cache=on|off|auto",
        "user-space page and metadata cache (default auto: on for network file systems such as sftp)",
    ),
    (
        "page_size=N[K|M]",
        "bytes per cached page, a power of two (default 128K)",
    ),
    (
        "page_cache_size=N[K|M|G]",
        "bytes of cached file data at most (default 64M)",
    ),
    (
        "meta_cache_size=N",
        "cached attributes and names at most (default 5000)",
    ),
    (
        "cache_policy=clock|lru",
        "which page leaves a full cache (default clock: second chance)",
    ),
    (
        "readahead=PAGES",
        "pages fetched by a sequential read miss (default 8; 1 turns it off)",
    ),
    (
        "meta_timeout=SECONDS",
        "how long cached attributes and names are trusted (default 1)",
    ),
    (
        "config=FILE",
        "a TOML file with the fields above (cache, page_size, ...); -o options win over it",
    ),
];

/// The keys [`CacheOptions`] takes.
pub const CACHE_KEYS: &[&str] = &[
    "cache",
    "page_size",
    "page_cache_size",
    "meta_cache_size",
    "cache_policy",
    "readahead",
    "meta_timeout",
    "config",
];

impl CacheOptions {
    /// Takes the cache options out of `rest` (the options no mount option
    /// claimed), leaving the file system's own. A `config=FILE` is read
    /// first wherever it stands; the other options then apply over it.
    pub fn take_from(rest: &mut FsOptions) -> Result<CacheOptions, String> {
        Self::take_with(rest, CacheOptions::load_file)
    }

    /// [`CacheOptions::take_from`] for options a command already expanded:
    /// `shortfuse run` reads a `config=FILE` once and hands every process
    /// the values it holds, so the preload shim, which every process under
    /// `run` loads and relocates whole before the program starts, is not
    /// linked with a TOML parser it would never call. A `config=` left in
    /// is refused rather than ignored.
    pub fn take_expanded(rest: &mut FsOptions) -> Result<CacheOptions, String> {
        Self::take_with(rest, |_, path| {
            Err(format!(
                "{}: a configuration file is read by the command that starts the program \
                 (shortfuse run), which passes on the values it holds",
                path.display()
            ))
        })
    }

    /// The two above, with `load` meeting each `config=FILE`: generic, so
    /// that a caller that never reads a file links no parser.
    fn take_with(
        rest: &mut FsOptions,
        load: impl Fn(&mut CacheOptions, &Path) -> Result<(), String>,
    ) -> Result<CacheOptions, String> {
        let mut o = CacheOptions::default();
        let mine: Vec<(String, Option<String>)> = rest
            .iter()
            .filter(|(k, _)| CACHE_KEYS.contains(&k.as_str()))
            .cloned()
            .collect();
        rest.retain(|(k, _)| !CACHE_KEYS.contains(&k.as_str()));
        for (k, v) in mine.iter().filter(|(k, _)| k == "config") {
            let path = v.as_deref().filter(|p| !p.is_empty()).ok_or("expected config=FILE")?;
            load(&mut o, Path::new(path)).map_err(|e| format!("-o {k}={path}: {e}"))?;
        }
        for (k, v) in mine.iter().filter(|(k, _)| k != "config") {
            o.apply(k, v.as_deref())
                .map_err(|e| format!("-o {k}{}: {e}", v.as_ref().map(|v| format!("={v}")).unwrap_or_default()))?;
        }
        Ok(o)
    }

    /// Applies one option; `Ok(false)` when `key` is not one it applies
    /// (`config=FILE` is a file of options, read by [`CacheOptions::take_from`]).
    pub fn apply(&mut self, key: &str, value: Option<&str>) -> Result<bool, String> {
        match key {
            "cache" => {
                self.mode = match value {
                    Some("on" | "true" | "yes") | None => CacheMode::On,
                    Some("off" | "false" | "no") => CacheMode::Off,
                    Some("auto") => CacheMode::Auto,
                    Some(v) => return Err(format!("{v:?}: expected cache=on, cache=off or cache=auto")),
                }
            }
            "page_size" => {
                let n = size_value(key, value, 4096, 64 << 20)?;
                if !n.is_power_of_two() {
                    return Err(format!("{n} is not a power of two"));
                }
                self.page_size = n as usize;
            }
            "page_cache_size" => self.page_cache_size = size_value(key, value, 4096, 1 << 46)? as usize,
            "meta_cache_size" => self.meta_cache_size = size_value(key, value, 1, 1 << 32)? as usize,
            "readahead" => self.readahead = size_value(key, value, 1, 1024)? as usize,
            "cache_policy" => {
                self.policy = match value {
                    Some("clock") => Policy::Clock,
                    Some("lru") => Policy::Lru,
                    _ => return Err("expected cache_policy=clock or cache_policy=lru".into()),
                }
            }
            "meta_timeout" => self.meta_timeout = seconds_value(key, value)?,
            // `config=FILE` is not one option but a file of them, met by
            // the caller that takes the options (`take_from`), so that
            // what applies options alone links no file parser.
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Reads a TOML file of cache options (module docs); unknown fields
    /// are refused, so a typo does not pass silently.
    pub fn load_file(&mut self, path: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        self.load_toml(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        self.config = Some(path.to_path_buf());
        Ok(())
    }

    /// [`CacheOptions::load_file`] on text.
    pub fn load_toml(&mut self, text: &str) -> Result<(), String> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.message().to_string())?;
        for (k, v) in &table {
            let value = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => (if *b { "on" } else { "off" }).to_string(),
                other => return Err(format!("{k}: unexpected {}", other.type_str())),
            };
            if k == "config" {
                return Err("config: a configuration file cannot name another".into());
            }
            match self.apply(k, Some(&value)) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(format!(
                        "{k}: unknown field (these are: {})",
                        CACHE_KEYS[..CACHE_KEYS.len() - 1].join(", ")
                    ))
                }
                Err(e) => return Err(format!("{k} = {value}: {e}")),
            }
        }
        Ok(())
    }

    /// On, off, or on for network file systems only.for a file system that is (or is not) a
    /// network file system.
    pub fn enabled(&self, network: bool) -> bool {
        match self.mode {
            CacheMode::On => true,
            CacheMode::Off => false,
            CacheMode::Auto => network,
        }
    }

    /// The page and metadata cache's configuration.
    pub fn config(&self) -> Result<CacheConfig, String> {
        if self.page_cache_size < self.page_size {
            return Err(format!(
                "page_cache_size {} holds no page of page_size {}",
                self.page_cache_size, self.page_size
            ));
        }
        Ok(CacheConfig {
            page_size: self.page_size,
            capacity: self.page_cache_size,
            policy: self.policy,
            readahead: self.readahead,
            meta_entries: self.meta_cache_size,
            meta_ttl: self.meta_timeout,
        })
    }

    /// One line saying what was chosen, for a mount whose cache is not
    /// what `auto` would pick for it silently (`None` then).
    pub fn describe(&self, fs: &str, network: bool) -> Option<String> {
        let on = self.enabled(network);
        let why = match self.mode {
            CacheMode::Auto => return None,
            CacheMode::On if !network => " (a local file system: the kernel page cache already holds its data)",
            CacheMode::Off if network => " (a network file system: every read is a round trip)",
            _ => "",
        };
        Some(if on {
            format!(
                "{fs}: user-space cache on: {} pages of {} KiB ({}), read-ahead {} pages, {} metadata entries{why}",
                self.page_cache_size / self.page_size,
                self.page_size >> 10,
                self.policy.name(),
                self.readahead,
                self.meta_cache_size
            )
        } else {
            format!("{fs}: user-space cache off{why}")
        })
    }

    /// The options as `-o` text (every field, so that a process handed
    /// them needs no file).
    pub fn to_options(&self) -> String {
        format!(
            "cache={},page_size={},page_cache_size={},meta_cache_size={},cache_policy={},readahead={},meta_timeout={}",
            self.mode.name(),
            self.page_size,
            self.page_cache_size,
            self.meta_cache_size,
            self.policy.name(),
            self.readahead,
            self.meta_timeout.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(s: &[(&str, Option<&str>)]) -> FsOptions {
        s.iter().map(|(k, v)| (k.to_string(), v.map(str::to_string))).collect()
    }

    #[test]
    fn options_leave_the_file_systems_own() {
        let mut rest = opts(&[
            ("port", Some("22")),
            ("cache", Some("on")),
            ("page_size", Some("64K")),
            ("cache_policy", Some("lru")),
            ("readahead", Some("4")),
        ]);
        let o = CacheOptions::take_from(&mut rest).unwrap();
        assert_eq!(rest, opts(&[("port", Some("22"))]));
        assert_eq!(
            (o.mode, o.page_size, o.policy, o.readahead),
            (CacheMode::On, 65536, Policy::Lru, 4)
        );
        assert!(o.enabled(false));
        for bad in [
            ("cache", Some("maybe")),
            ("page_size", Some("5000")),
            ("readahead", Some("0")),
            ("cache_policy", Some("fifo")),
            ("config", None),
        ] {
            assert!(CacheOptions::take_from(&mut opts(&[bad])).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn auto_follows_the_kind_of_file_system() {
        let o = CacheOptions::default();
        assert!(o.enabled(true) && !o.enabled(false));
        assert_eq!(o.describe("passthrough", false), None);
        let off = CacheOptions {
            mode: CacheMode::Off,
            ..o.clone()
        };
        assert!(off.describe("sftp", true).unwrap().contains("off"));
    }

    #[test]
    fn the_thesis_file_reads_and_options_win() {
        let dir = std::env::temp_dir().join(format!("sf-cache-opts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cache.toml");
        // Figure 6 of the Prefuse-SSHFS caching thesis, with sizes in bytes.
        std::fs::write(
            &file,
            "# thesis\ncache = true\npage_cache_size = 983040000\npage_size = 262144\nmeta_cache_size = 2500\n",
        )
        .unwrap();
        let f = file.to_str().unwrap();
        let mut rest = opts(&[("meta_cache_size", Some("7")), ("config", Some(f))]);
        let o = CacheOptions::take_from(&mut rest).unwrap();
        assert_eq!(o.mode, CacheMode::On);
        assert_eq!((o.page_size, o.page_cache_size), (262144, 983040000));
        assert_eq!(o.meta_cache_size, 7, "-o wins over the file");
        assert_eq!(o.config.as_deref(), Some(file.as_path()));
        let c = o.config().unwrap();
        assert_eq!(c.capacity / c.page_size, 3750);
        // Round trip through the -o form.
        let mut again = CacheOptions::default();
        for item in o.to_options().split(',') {
            let (k, v) = item.split_once('=').unwrap();
            assert!(again.apply(k, Some(v)).unwrap());
        }
        assert_eq!(again.config(), o.config());
        std::fs::write(&file, "cache = true\npage_sise = 4096\n").unwrap();
        let e = CacheOptions::take_from(&mut opts(&[("config", Some(f))])).unwrap_err();
        assert!(e.contains("page_sise") && e.contains("unknown field"), "{e}");
        std::fs::write(&file, "page_size = [1]\n").unwrap();
        assert!(CacheOptions::take_from(&mut opts(&[("config", Some(f))])).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
