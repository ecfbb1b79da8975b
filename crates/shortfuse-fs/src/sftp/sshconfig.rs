//! What `~/.ssh/config` says of one host, as OpenSSH reads it: `Host`
//! blocks whose patterns (`*`, `?`, `!negated`) match the name as typed,
//! lines before the first `Host` for every host, the first value of a
//! keyword winning (`IdentityFile` adds up). Read: `HostName` (`%h` is the
//! name typed), `User`, `Port`, `IdentityFile`, `UserKnownHostsFile`.
//! `Match` blocks are skipped; `Include` and `ProxyJump` are not supported
//! and said so when they would apply.

/// The settings for one host; `None` where the file says nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostConfig {
    pub hostname: Option<String>,
    pub user: Option<String>,
    pub port: Option<String>,
    pub identity_files: Vec<String>,
    pub known_hosts: Option<String>,
    /// Keywords that apply to the host and that we do not honour.
    pub unsupported: Vec<String>,
}

/// `*` and `?` globbing, as ssh_config(5) patterns.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&pattern[1..], name) || (!name.is_empty() && glob(pattern, &name[1..])),
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p.eq_ignore_ascii_case(n) => glob(&pattern[1..], &name[1..]),
        _ => false,
    }
}

/// Whether a `Host` line's patterns take `host`: one positive pattern
/// matches and no negated one does.
fn host_matches(patterns: &[&str], host: &str) -> bool {
    let mut matched = false;
    for p in patterns {
        match p.strip_prefix('!') {
            Some(neg) if glob(neg.as_bytes(), host.as_bytes()) => return false,
            Some(_) => {}
            None => matched |= glob(p.as_bytes(), host.as_bytes()),
        }
    }
    matched
}

/// The settings `text` (an ssh_config file) gives `host`.
pub fn lookup(text: &str, host: &str) -> HostConfig {
    let mut c = HostConfig::default();
    let mut applies = true;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `Keyword value` or `Keyword=value`.
        let (key, rest) = match line.find(|ch: char| ch.is_whitespace() || ch == '=') {
            Some(i) => (
                &line[..i],
                line[i..].trim_start_matches(|ch: char| ch.is_whitespace() || ch == '='),
            ),
            None => (line, ""),
        };
        let value = rest.trim().trim_matches('"').to_string();
        match key.to_ascii_lowercase().as_str() {
            "host" => applies = host_matches(&rest.split_whitespace().collect::<Vec<_>>(), host),
            "match" => applies = false,
            _ if !applies => {}
            "hostname" => {
                c.hostname.get_or_insert_with(|| value.replace("%h", host));
            }
            "user" => {
                c.user.get_or_insert(value);
            }
            "port" => {
                c.port.get_or_insert(value);
            }
            "identityfile" => c.identity_files.push(value),
            "userknownhostsfile" => {
                c.known_hosts
                    .get_or_insert_with(|| value.split_whitespace().next().unwrap_or("").to_string());
            }
            k @ ("proxyjump" | "proxycommand" | "include") => c.unsupported.push(k.to_string()),
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openssh_rules() {
        let text = "\
# global defaults come first
User everyone-default-is-overridden-by-first
Host myhost other
    HostName 127.0.0.1
    Port=2222
    IdentityFile ~/.ssh/k1
Host *.example.com !bad.example.com
    User web
    HostName %h.internal
Match host x
    User never
Host *
    User fallback
    IdentityFile ~/.ssh/k2
    Port 22
    ProxyJump j
";
        let c = lookup(text, "myhost");
        assert_eq!(c.hostname.as_deref(), Some("127.0.0.1"));
        assert_eq!(c.port.as_deref(), Some("2222"), "the first value wins");
        assert_eq!(c.user.as_deref(), Some("everyone-default-is-overridden-by-first"));
        assert_eq!(c.identity_files, ["~/.ssh/k1", "~/.ssh/k2"]);
        assert_eq!(c.unsupported, ["proxyjump"]);
        let w = lookup(text, "a.example.com");
        assert_eq!(w.hostname.as_deref(), Some("a.example.com.internal"));
        let bad = lookup(text, "bad.example.com");
        assert_eq!(bad.hostname, None, "a negated pattern excludes");
        assert_eq!(lookup("", "h"), HostConfig::default());
    }
}
