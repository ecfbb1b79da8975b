//! How a client is set up: its consistency mode and the `-o` options of
//! `shortfuse mount dist`, and the timings they default to.

use std::time::Duration;

/// See [`ClientConfig::lease_hold`].
pub const DEFAULT_LEASE_HOLD: Duration = Duration::from_millis(2);

/// See [`ClientConfig::direct_spell`]: long enough that the probes that
/// end a spell (a caching lease asked again, which costs a lease move or
/// two while the file is still contended) are rare, short enough that a
/// file whose contention ended is cached again soon.
pub const DEFAULT_DIRECT_SPELL: Duration = Duration::from_millis(500);

/// A lease revoked sooner than this after its grant did not pay for its
/// move (see the module docs, "Contention"): a move costs one to two
/// milliseconds here (revocation, write-back, grant), a direct I/O one
/// round trip (about a tenth of that), so a lease must serve many cached
/// I/Os to be worth its move, which takes longer than this once moves
/// come this close together. Well above [`DEFAULT_LEASE_HOLD`], which
/// bounds how long a contended lease stays.
pub const CONTENDED_WITHIN: Duration = Duration::from_millis(20);

/// Longest `-o direct_spell=MS`.
const DIRECT_SPELL_MAX_MS: f64 = 60_000.0;

/// How long a `weak` client trusts a file's cache (JuiceFS's default).
pub const WEAK_CACHE_TTL: Duration = Duration::from_secs(1);

/// What a client promises about what others read (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Consistency {
    #[default]
    Lease,
    WriteThrough,
    Weak,
}

impl Consistency {
    pub const ALL: [Consistency; 3] = [Consistency::Lease, Consistency::WriteThrough, Consistency::Weak];

    pub fn name(self) -> &'static str {
        match self {
            Consistency::Lease => "lease",
            Consistency::WriteThrough => "writethrough",
            Consistency::Weak => "weak",
        }
    }
}

impl std::str::FromStr for Consistency {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Consistency, String> {
        Consistency::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("consistency {s:?}: choose lease, writethrough or weak"))
    }
}

/// How long a call waits for an unreachable server (down, restarting)
/// before it fails with `ENOTCONN`.
pub const RECONNECT_WAIT: Duration = Duration::from_secs(10);

/// How a client is set up.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port` of the server.
    pub addr: String,
    /// Shown in the server's diagnostics.
    pub name: String,
    /// Open files with `FOPEN_DIRECT_IO` (see the module docs).
    pub direct_io: bool,
    /// `lease` and `writethrough`: read-only opens read through the
    /// kernel's page cache, which is emptied before each lease this
    /// client holds on the file goes (see the module docs, "Kernel page
    /// cache"); `-o page_cache`.
    pub page_cache: bool,
    pub consistency: Consistency,
    /// A revoked lease that is in use here is given back no later than
    /// this after it was granted (see the module docs, "Contention").
    pub lease_hold: Duration,
    /// `lease` mode: how long a file found contended is accessed under
    /// direct leases before a caching lease is tried again (see the module
    /// docs, "Contention"); zero: never direct.
    pub direct_spell: Duration,
}

impl ClientConfig {
    pub fn new(addr: impl Into<String>) -> ClientConfig {
        ClientConfig {
            addr: addr.into(),
            name: format!("pid {}", std::process::id()),
            direct_io: true,
            page_cache: false,
            consistency: Consistency::Lease,
            lease_hold: DEFAULT_LEASE_HOLD,
            direct_spell: DEFAULT_DIRECT_SPELL,
        }
    }

    /// A client of `addr` set up by `shortfuse mount dist`'s own `-o`
    /// options: `consistency=lease|writethrough|weak`, `lease_hold=MS`,
    /// `direct_spell=MS`, `page_cache`.
    pub fn from_options(addr: impl Into<String>, opts: &[(String, Option<String>)]) -> std::io::Result<ClientConfig> {
        let mut cfg = ClientConfig::new(addr);
        for (k, v) in opts {
            let bad = |msg: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, msg);
            match (k.as_str(), v) {
                ("page_cache", None) => cfg.page_cache = true,
                ("consistency", Some(v)) => cfg.consistency = v.parse().map_err(|e| bad(format!("-o {e}")))?,
                ("lease_hold", Some(v)) => {
                    let ms: f64 = v
                        .parse()
                        .ok()
                        .filter(|ms: &f64| (0.0..=1000.0).contains(ms))
                        .ok_or_else(|| bad(format!("-o lease_hold={v}: milliseconds from 0 to 1000")))?;
                    cfg.lease_hold = Duration::from_secs_f64(ms / 1000.0);
                }
                ("direct_spell", Some(v)) => {
                    let ms: f64 = v
                        .parse()
                        .ok()
                        .filter(|ms: &f64| (0.0..=DIRECT_SPELL_MAX_MS).contains(ms))
                        .ok_or_else(|| {
                            bad(format!(
                                "-o direct_spell={v}: milliseconds from 0 (never direct) to {DIRECT_SPELL_MAX_MS}"
                            ))
                        })?;
                    cfg.direct_spell = Duration::from_secs_f64(ms / 1000.0);
                }
                _ => {
                    return Err(bad(format!(
                    "-o {k}{}: unknown option (neither a mount option nor dist's consistency=lease|writethrough|weak, lease_hold=MS, direct_spell=MS or page_cache)",
                    v.as_ref().map(|v| format!("={v}")).unwrap_or_default()
                )))
                }
            }
        }
        if cfg.page_cache && cfg.consistency == Consistency::Weak {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "-o page_cache needs leases: consistency=lease or writethrough",
            ));
        }
        Ok(cfg)
    }

    /// Whether read-only opens use the kernel's page cache.
    pub fn caches_pages(&self) -> bool {
        self.page_cache && self.consistency != Consistency::Weak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_spell_is_a_mount_option() {
        let opt = |v: &str| vec![("direct_spell".to_string(), Some(v.to_string()))];
        assert_eq!(ClientConfig::new("a").direct_spell, DEFAULT_DIRECT_SPELL);
        let cfg = ClientConfig::from_options("a", &opt("250")).unwrap();
        assert_eq!(cfg.direct_spell, Duration::from_millis(250));
        let cfg = ClientConfig::from_options("a", &opt("0")).unwrap();
        assert_eq!(cfg.direct_spell, Duration::ZERO, "0 turns direct leases off");
        for bad in ["-1", "x", "1e9"] {
            let e = ClientConfig::from_options("a", &opt(bad)).err().unwrap();
            assert!(e.to_string().contains("direct_spell"), "{e}");
        }
    }
}
