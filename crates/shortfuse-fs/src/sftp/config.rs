//! `[user@]host:[path]` and the `-o` options of the `sftp` file system.

use std::path::PathBuf;
use std::time::Duration;

/// What to do with a server key that `known_hosts` does not list
/// (OpenSSH's `StrictHostKeyChecking`). A key that differs from a listed one
/// is refused under `Yes` and `AcceptNew`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKeyPolicy {
    /// Only keys already listed are accepted.
    Yes,
    /// Unlisted keys are accepted and appended to the file (the default:
    /// a daemon has no terminal to ask on).
    AcceptNew,
    /// Every key is accepted and nothing is written (tests, trusted nets).
    No,
}

/// Everything needed to (re)connect.
#[derive(Clone, Debug)]
pub struct Config {
    pub user: String,
    pub host: String,
    pub port: u16,
    /// The remote directory to serve; empty means the login directory.
    pub path: String,
    /// Private keys to try in order.
    pub identities: Vec<PathBuf>,
    pub known_hosts: PathBuf,
    pub host_key_policy: HostKeyPolicy,
    /// Reconnect on the next call after the connection dropped.
    pub reconnect: bool,
    pub connect_timeout: Duration,
    /// Longest wait for one SFTP reply before the connection counts as dead.
    pub request_timeout: Duration,
    /// SSH keepalives, so a silent peer is noticed while idle.
    pub keepalive: Option<Duration>,
    /// Largest read or write in one request (capped by the server's limits).
    pub chunk: u32,
    /// Requests in flight at once for one large read or write.
    pub max_requests: usize,
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// `~` and `~/...` are the home directory, as in a shell or ssh_config.
fn expand_tilde(path: &str) -> PathBuf {
    match path.strip_prefix('~') {
        Some("") => home(),
        Some(rest) if rest.starts_with('/') => home().join(&rest[1..]),
        _ => PathBuf::from(path),
    }
}

fn login_name() -> String {
    if let Ok(u) = std::env::var("USER") {
        if !u.is_empty() {
            return u;
        }
    }
    // SAFETY: getuid cannot fail; getpwuid returns a pointer into static
    // storage or null, read at once before any other passwd call.
    unsafe {
        let pw = libc::getpwuid(libc::getuid());
        if !pw.is_null() && !(*pw).pw_name.is_null() {
            if let Ok(s) = std::ffi::CStr::from_ptr((*pw).pw_name).to_str() {
                return s.to_owned();
            }
        }
    }
    "root".into()
}

fn bad(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, msg)
}

fn secs(key: &str, v: Option<&str>) -> std::io::Result<Duration> {
    let v = v.ok_or_else(|| bad(format!("sftp: -o {key} needs a number of seconds")))?;
    let n: u64 = v
        .parse()
        .map_err(|_| bad(format!("sftp: -o {key}={v}: not a number of seconds")))?;
    Ok(Duration::from_secs(n))
}

/// `[user@]host` and `path` of `[user@]host:[path]`. A bracketed IPv6
/// address holds colons; otherwise the first colon ends the host.
fn split_target(target: &str) -> Option<(&str, &str)> {
    let split = match target.find("]:") {
        Some(i) => Some((&target[..i + 1], &target[i + 2..])),
        None => target.split_once(':'),
    };
    split.filter(|(h, _)| !h.is_empty())
}

/// `target` with its remote path replaced by `path` (`shortfuse run`
/// hands the shim the absolute path it resolved).
pub fn with_remote_path(target: &str, path: &str) -> Option<String> {
    split_target(target).map(|(userhost, _)| format!("{userhost}:{path}"))
}

impl Config {
    /// Parses `[user@]host:[path]` and the options. Options (sshfs and
    /// OpenSSH names): `port=N`, `identity=FILE` (also `IdentityFile=`,
    /// repeatable), `reconnect`, `StrictHostKeyChecking=yes|accept-new|no`,
    /// `UserKnownHostsFile=FILE`, `ConnectTimeout=S`, `timeout=S` (per
    /// request), `ServerAliveInterval=S`, `max_read=BYTES`/`chunk=BYTES`,
    /// `max_requests=N`, `user=NAME`.
    ///
    /// `~/.ssh/config` fills in what neither gives (see
    /// [`super::sshconfig`]): a host alias's `HostName`, `User`, `Port`,
    /// `IdentityFile` and `UserKnownHostsFile`. A leading `~/` in file names
    /// is the home directory.
    pub fn parse(target: &str, opts: &[(String, Option<String>)]) -> std::io::Result<Config> {
        let file = home().join(".ssh/config");
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(std::io::Error::new(e.kind(), format!("sftp: {}: {e}", file.display()))),
        };
        Self::parse_with(target, opts, &text)
    }

    /// [`Config::parse`] with `ssh_config` as the text of `~/.ssh/config`.
    pub fn parse_with(target: &str, opts: &[(String, Option<String>)], ssh_config: &str) -> std::io::Result<Config> {
        let (userhost, path) =
            split_target(target).ok_or_else(|| bad(format!("sftp: {target:?} is not [user@]host:[path]")))?;
        let (user, alias) = match userhost.rsplit_once('@') {
            Some((u, h)) if !u.is_empty() => (Some(u.to_owned()), h),
            Some(_) => return Err(bad(format!("sftp: empty user name in {target:?}"))),
            None => (None, userhost),
        };
        let alias = alias.trim_start_matches('[').trim_end_matches(']');
        if alias.is_empty() {
            return Err(bad(format!("sftp: no host in {target:?}")));
        }
        let from_file = super::sshconfig::lookup(ssh_config, alias);
        if !from_file.unsupported.is_empty() {
            return Err(bad(format!(
                "sftp: ~/.ssh/config gives {alias} {}, which shortfuse does not support",
                from_file.unsupported.join(", ")
            )));
        }
        let ssh_dir = home().join(".ssh");
        let port = match &from_file.port {
            Some(p) => p
                .parse()
                .ok()
                .filter(|&p: &u16| p != 0)
                .ok_or_else(|| bad(format!("sftp: ~/.ssh/config: Port {p} for {alias}: not a port number")))?,
            None => 22,
        };
        let mut c = Config {
            user: user.or(from_file.user).unwrap_or_else(login_name),
            host: from_file.hostname.unwrap_or_else(|| alias.to_owned()),
            port,
            path: path.to_owned(),
            identities: Vec::new(),
            known_hosts: from_file
                .known_hosts
                .map_or_else(|| ssh_dir.join("known_hosts"), |f| expand_tilde(&f)),
            host_key_policy: HostKeyPolicy::AcceptNew,
            reconnect: false,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            keepalive: Some(Duration::from_secs(15)),
            chunk: 64 * 1024,
            max_requests: 16,
        };
        for (k, v) in opts {
            let v = v.as_deref();
            match k.as_str() {
                "port" | "Port" => {
                    c.port = v
                        .and_then(|v| v.parse().ok())
                        .filter(|&p| p != 0)
                        .ok_or_else(|| bad(format!("sftp: -o port={}: not a port number", v.unwrap_or(""))))?
                }
                "identity" | "IdentityFile" => c.identities.push(expand_tilde(
                    v.ok_or_else(|| bad("sftp: -o identity needs a key file".into()))?,
                )),
                "user" | "User" => c.user = v.ok_or_else(|| bad("sftp: -o user needs a name".into()))?.to_owned(),
                "reconnect" => c.reconnect = v.is_none_or(|v| v != "no" && v != "0"),
                "StrictHostKeyChecking" => {
                    c.host_key_policy = match v {
                        Some("yes") => HostKeyPolicy::Yes,
                        Some("accept-new") => HostKeyPolicy::AcceptNew,
                        Some("no" | "off") => HostKeyPolicy::No,
                        _ => {
                            return Err(bad(format!(
                                "sftp: -o StrictHostKeyChecking={}: choose yes, accept-new or no",
                                v.unwrap_or("")
                            )))
                        }
                    }
                }
                "UserKnownHostsFile" => {
                    c.known_hosts =
                        expand_tilde(v.ok_or_else(|| bad("sftp: -o UserKnownHostsFile needs a file".into()))?)
                }
                "ConnectTimeout" | "connect_timeout" => c.connect_timeout = secs(k, v)?,
                "timeout" => c.request_timeout = secs(k, v)?,
                "ServerAliveInterval" => {
                    let d = secs(k, v)?;
                    c.keepalive = (!d.is_zero()).then_some(d);
                }
                "max_read" | "max_write" | "chunk" => {
                    c.chunk = shortfuse::options::size_value(k, v, 512, 255 * 1024)
                        .map_err(|e| bad(format!("sftp: -o {k}: {e}")))? as u32
                }
                "max_requests" => {
                    c.max_requests = v
                        .and_then(|v| v.parse().ok())
                        .filter(|&n: &usize| (1..=256).contains(&n))
                        .ok_or_else(|| bad(format!("sftp: -o max_requests={}: 1 to 256", v.unwrap_or(""))))?
                }
                _ => {
                    return Err(bad(format!(
                        "sftp: unknown option {k}: known are port, identity, user, reconnect, \
                         StrictHostKeyChecking, UserKnownHostsFile, ConnectTimeout, timeout, \
                         ServerAliveInterval, max_read, max_requests"
                    )))
                }
            }
        }
        if c.request_timeout.is_zero() || c.connect_timeout.is_zero() {
            return Err(bad("sftp: timeouts must be at least one second".into()));
        }
        if c.identities.is_empty() {
            c.identities = from_file.identity_files.iter().map(|f| expand_tilde(f)).collect();
        }
        if c.identities.is_empty() {
            c.identities = ["id_ed25519", "id_ecdsa", "id_rsa"]
                .iter()
                .map(|n| ssh_dir.join(n))
                .filter(|p| p.exists())
                .collect();
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(k: &str, v: Option<&str>) -> (String, Option<String>) {
        (k.into(), v.map(Into::into))
    }

    #[test]
    fn targets() {
        let c = Config::parse("bob@example.org:/srv/data", &[]).unwrap();
        assert_eq!(
            (c.user.as_str(), c.host.as_str(), c.path.as_str()),
            ("bob", "example.org", "/srv/data")
        );
        assert_eq!(c.port, 22);
        let c = Config::parse("host:", &[o("port", Some("2222")), o("reconnect", None)]).unwrap();
        assert_eq!(
            (c.host.as_str(), c.path.as_str(), c.port, c.reconnect),
            ("host", "", 2222, true)
        );
        let c = Config::parse("[::1]:dir", &[]).unwrap();
        assert_eq!((c.host.as_str(), c.path.as_str()), ("::1", "dir"));
        assert!(Config::parse("nohost", &[]).is_err());
        assert!(Config::parse(":path", &[]).is_err());
        assert!(Config::parse("@h:p", &[]).is_err());
        assert_eq!(with_remote_path("u@h:rel", "/abs/x").as_deref(), Some("u@h:/abs/x"));
        assert_eq!(with_remote_path("[::1]:", "/r").as_deref(), Some("[::1]:/r"));
        assert_eq!(with_remote_path("nohost", "/r"), None);
    }

    #[test]
    fn ssh_config_fills_in_what_the_command_line_does_not_say() {
        let text = "Host myhost\n  HostName 127.0.0.1\n  User alice\n  Port 2222\n  IdentityFile ~/.ssh/k\n";
        let c = Config::parse_with("myhost:/d", &[], text).unwrap();
        assert_eq!((c.host.as_str(), c.user.as_str(), c.port), ("127.0.0.1", "alice", 2222));
        assert_eq!(c.identities, vec![home().join(".ssh/k")]);
        let c = Config::parse_with(
            "bob@myhost:",
            &[o("Port", Some("22")), o("IdentityFile", Some("~/x"))],
            text,
        )
        .unwrap();
        assert_eq!((c.user.as_str(), c.port), ("bob", 22));
        assert_eq!(c.identities, vec![home().join("x")]);
        let e = Config::parse_with("j:", &[], "Host j\n ProxyJump k\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("proxyjump"), "{e}");
    }

    #[test]
    fn options() {
        let c = Config::parse(
            "h:",
            &[
                o("identity", Some("/k")),
                o("StrictHostKeyChecking", Some("yes")),
                o("UserKnownHostsFile", Some("/kh")),
                o("timeout", Some("3")),
                o("max_read", Some("128k")),
            ],
        )
        .unwrap();
        assert_eq!(c.identities, vec![PathBuf::from("/k")]);
        assert_eq!(c.host_key_policy, HostKeyPolicy::Yes);
        assert_eq!(c.known_hosts, PathBuf::from("/kh"));
        assert_eq!(c.request_timeout, Duration::from_secs(3));
        assert_eq!(c.chunk, 128 * 1024);
        let e = Config::parse("h:", &[o("bogus", None)]).unwrap_err().to_string();
        assert!(e.contains("unknown option bogus"), "{e}");
        assert!(Config::parse("h:", &[o("port", Some("x"))]).is_err());
        assert!(Config::parse("h:", &[o("StrictHostKeyChecking", Some("ask"))]).is_err());
        assert!(Config::parse("h:", &[o("timeout", Some("0"))]).is_err());
    }
}
