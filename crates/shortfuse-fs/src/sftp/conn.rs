//! One SSH connection carrying one SFTP session, and how it is made.

use shortfuse::sync::Unpoison;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use russh::keys::{self, PrivateKeyWithHashAlg};
use russh::{cipher, client};
use russh_sftp::client::rawsession::{Limits, RawSftpSession};
use russh_sftp::client::Config as SftpConfig;

use super::config::{Config, HostKeyPolicy};

/// A live session. `generation` tells sessions apart so that a failure seen
/// on an old session does not tear down its successor, and so that open
/// handles know when they must be opened again.
pub struct Conn {
    pub generation: u64,
    pub sftp: RawSftpSession,
    pub ssh: client::Handle<HostKeys>,
    /// The TCP socket under `ssh` (owned by it), for [`hung_up`] and
    /// [`abandon`].
    pub fd: RawFd,
    /// Largest read and write per request, after the server's limits.
    pub read_len: u32,
    pub write_len: u32,
}

/// Checks the server key against `known_hosts` (see [`HostKeyPolicy`]) and
/// keeps the reason of a refusal for the error message.
pub struct HostKeys {
    host: String,
    port: u16,
    config: Arc<Config>,
    refused: Arc<Mutex<Option<String>>>,
    /// The cipher of the last key exchange, for the log.
    cipher: Arc<Mutex<String>>,
}

impl client::Handler for HostKeys {
    type Error = russh::Error;

    async fn kex_done(
        &mut self,
        _shared_secret: Option<&[u8]>,
        names: &russh::Names,
        _session: &mut client::Session,
    ) -> Result<(), Self::Error> {
        *self.cipher.lock().unpoison() = names.cipher.as_ref().to_owned();
        Ok(())
    }

    async fn check_server_key(&mut self, key: &russh::keys::PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let policy = self.config.host_key_policy;
        if policy == HostKeyPolicy::No {
            return Ok(true);
        }
        let russh::keys::PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            self.refuse("the server offered a certificate; only plain host keys are checked".into());
            return Ok(false);
        };
        let file = &self.config.known_hosts;
        match keys::check_known_hosts_path(&self.host, self.port, key, file) {
            Ok(true) => Ok(true),
            Ok(false) if policy == HostKeyPolicy::AcceptNew => {
                if let Err(e) = keys::known_hosts::learn_known_hosts_path(&self.host, self.port, key, file) {
                    self.refuse(format!("cannot record the host key in {}: {e}", file.display()));
                    return Ok(false);
                }
                // As ssh's "Permanently added ... to the list of known
                // hosts": the user should know a key was trusted unseen.
                tracing::warn!(
                    "sftp: added the host key of {}:{} ({} {}) to {} (StrictHostKeyChecking=accept-new)",
                    self.host,
                    self.port,
                    key.algorithm(),
                    key.fingerprint(Default::default()),
                    file.display()
                );
                Ok(true)
            }
            Ok(false) => {
                self.refuse(format!(
                    "host key of {}:{} is not in {} (StrictHostKeyChecking=yes)",
                    self.host,
                    self.port,
                    file.display()
                ));
                Ok(false)
            }
            Err(keys::Error::KeyChanged { line }) => {
                self.refuse(format!(
                    "HOST KEY OF {}:{} CHANGED (differs from {} line {line}); refusing to connect",
                    self.host,
                    self.port,
                    file.display()
                ));
                Ok(false)
            }
            Err(e) => {
                self.refuse(format!("cannot read {}: {e}", file.display()));
                Ok(false)
            }
        }
    }
}

impl HostKeys {
    fn refuse(&self, why: String) {
        *self.refused.lock().unpoison() = Some(why);
    }
}

/// The ciphers we offer, most wanted first. Where the processor has AES
/// and carry-less multiply instructions (AES-NI and PCLMULQDQ on x86-64,
/// the crypto extension on AArch64), AES-GCM costs both ends less per byte
/// than ChaCha20-Poly1305, which OpenSSH prefers for machines without
/// them; both are authenticated encryption with no separate MAC. A bulk
/// copy over SSH spends most of its processor time in the cipher, on our
/// side and on the server's, so it is chosen by what the hardware does
/// fast. The rest are russh's defaults, for servers that take neither.
fn ciphers() -> &'static [cipher::Name] {
    const AES_FIRST: &[cipher::Name] = &[
        cipher::AES_128_GCM,
        cipher::AES_256_GCM,
        cipher::CHACHA20_POLY1305,
        cipher::AES_256_CTR,
        cipher::AES_192_CTR,
        cipher::AES_128_CTR,
    ];
    const CHACHA_FIRST: &[cipher::Name] = &[
        cipher::CHACHA20_POLY1305,
        cipher::AES_128_GCM,
        cipher::AES_256_GCM,
        cipher::AES_256_CTR,
        cipher::AES_192_CTR,
        cipher::AES_128_CTR,
    ];
    if aes_in_hardware() {
        AES_FIRST
    } else {
        CHACHA_FIRST
    }
}

fn aes_in_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes") && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

fn err(kind: std::io::ErrorKind, msg: String) -> std::io::Error {
    std::io::Error::new(kind, msg)
}

/// Connects, authenticates with the first identity the server takes, and
/// starts the SFTP subsystem. Bounded by `connect_timeout`.
pub async fn connect(config: Arc<Config>, generation: u64) -> std::io::Result<Conn> {
    let timeout = config.connect_timeout;
    match tokio::time::timeout(timeout, connect_inner(config.clone(), generation)).await {
        Ok(r) => r,
        Err(_) => Err(err(
            std::io::ErrorKind::TimedOut,
            format!("sftp: {}:{}: no session within {timeout:?}", config.host, config.port),
        )),
    }
}

async fn connect_inner(config: Arc<Config>, generation: u64) -> std::io::Result<Conn> {
    use std::io::ErrorKind::*;
    let at = format!("{}@{}:{}", config.user, config.host, config.port);
    let agent_sock = std::env::var_os("SSH_AUTH_SOCK").filter(|s| !s.is_empty());
    if config.identities.is_empty() && agent_sock.is_none() {
        return Err(err(
            NotFound,
            format!(
                "sftp: no identity for {at}: give -o identity=FILE (none of ~/.ssh/id_ed25519, id_ecdsa, id_rsa \
                 exists, and no ssh-agent: SSH_AUTH_SOCK is unset)"
            ),
        ));
    }
    let ssh_config = Arc::new(client::Config {
        keepalive_interval: config.keepalive,
        keepalive_max: 3,
        nodelay: true,
        // A wide window keeps many pipelined reads in flight.
        window_size: 8 << 20,
        preferred: russh::Preferred {
            cipher: std::borrow::Cow::Borrowed(ciphers()),
            ..russh::Preferred::default()
        },
        ..client::Config::default()
    });
    let refused = Arc::new(Mutex::new(None));
    let cipher = Arc::new(Mutex::new(String::new()));
    let handler = HostKeys {
        host: config.host.clone(),
        port: config.port,
        config: config.clone(),
        refused: refused.clone(),
        cipher: cipher.clone(),
    };
    let socket = tokio::net::TcpStream::connect((config.host.as_str(), config.port))
        .await
        .map_err(|e| err(e.kind(), format!("sftp: cannot connect to {at}: {e}")))?;
    let _ = socket.set_nodelay(true);
    let fd = socket.as_raw_fd();
    let mut ssh = match client::connect_stream(ssh_config, socket, handler).await {
        Ok(h) => h,
        Err(e) => {
            let why = refused.lock().unpoison().take();
            return Err(match why {
                Some(why) => err(PermissionDenied, format!("sftp: {at}: {why}")),
                None => err(ConnectionAborted, format!("sftp: {at}: SSH handshake: {e}")),
            });
        }
    };
    let mut reasons = Vec::new();
    // The agent's keys first, as ssh does.
    let mut authenticated = match &agent_sock {
        Some(sock) => by_agent(&mut ssh, &config.user, std::path::Path::new(sock), &mut reasons)
            .await
            .map_err(|e| err(ConnectionAborted, format!("sftp: {at}: {e}")))?,
        None => false,
    };
    for path in config.identities.iter().filter(|_| !authenticated) {
        let key = match keys::load_secret_key(path, None) {
            Ok(k) => k,
            Err(e) => {
                reasons.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let hash = ssh
            .best_supported_rsa_hash()
            .await
            .map_err(|e| err(ConnectionAborted, format!("sftp: {at}: {e}")))?
            .flatten();
        let res = ssh
            .authenticate_publickey(config.user.clone(), PrivateKeyWithHashAlg::new(Arc::new(key), hash))
            .await
            .map_err(|e| err(ConnectionAborted, format!("sftp: {at}: {e}")))?;
        if res.success() {
            authenticated = true;
            break;
        }
        reasons.push(format!("{}: refused by the server", path.display()));
    }
    if !authenticated {
        return Err(err(
            PermissionDenied,
            format!("sftp: {at}: public-key authentication failed ({})", reasons.join("; ")),
        ));
    }
    let channel = ssh
        .channel_open_session()
        .await
        .map_err(|e| err(ConnectionAborted, format!("sftp: {at}: session channel: {e}")))?;
    channel
        .request_subsystem(true, "sftp")
        .await
        .map_err(|e| err(ConnectionAborted, format!("sftp: {at}: sftp subsystem: {e}")))?;
    let sftp_config = SftpConfig {
        request_timeout_secs: config.request_timeout.as_secs(),
        ..SftpConfig::default()
    };
    let mut sftp = RawSftpSession::new_with_config(channel.into_stream(), sftp_config);
    sftp.init()
        .await
        .map_err(|e| err(ConnectionAborted, format!("sftp: {at}: SFTP init: {e}")))?;
    let mut read_len = config.chunk;
    let mut write_len = config.chunk;
    // limits@openssh.com: requests past the server's maximum would fail.
    if let Ok(l) = sftp.limits().await {
        let limits = Limits::from(l);
        if let Some(r) = limits.read_len {
            read_len = read_len.min(r.min(u32::MAX as u64) as u32);
        }
        if let Some(w) = limits.write_len {
            write_len = write_len.min(w.min(u32::MAX as u64) as u32);
        }
        sftp.set_limits(limits);
    } else {
        // RFC-era servers: 32 KiB is the size every server must take.
        read_len = read_len.min(32 * 1024);
        write_len = write_len.min(32 * 1024);
    }
    // Not for the check made at mount time (session 0), which would print
    // it on the terminal of `shortfuse mount`.
    if generation > 0 {
        tracing::info!(
            "sftp: session {generation} to {at}: cipher {}",
            cipher.lock().unpoison()
        );
    }
    Ok(Conn {
        generation,
        sftp,
        ssh,
        fd,
        read_len,
        write_len,
    })
}

/// Tries every key the ssh-agent at `sock` holds; a failure to reach the
/// agent only adds to `reasons` (the key files come next).
async fn by_agent(
    ssh: &mut client::Handle<HostKeys>,
    user: &str,
    sock: &std::path::Path,
    reasons: &mut Vec<String>,
) -> Result<bool, russh::Error> {
    let mut agent = match keys::agent::client::AgentClient::connect_uds(sock).await {
        Ok(a) => a,
        Err(e) => {
            reasons.push(format!("ssh-agent at {}: {e}", sock.display()));
            return Ok(false);
        }
    };
    let ids = match agent.request_identities().await {
        Ok(ids) => ids,
        Err(e) => {
            reasons.push(format!("ssh-agent at {}: {e}", sock.display()));
            return Ok(false);
        }
    };
    if ids.is_empty() {
        reasons.push(format!("ssh-agent at {}: no keys", sock.display()));
    }
    for id in ids {
        let key = id.public_key().into_owned();
        let hash = ssh.best_supported_rsa_hash().await?.flatten();
        match ssh
            .authenticate_publickey_with(user, key.clone(), hash, &mut agent)
            .await
        {
            Ok(r) if r.success() => return Ok(true),
            Ok(_) => reasons.push(format!(
                "agent key {}: refused by the server",
                key.fingerprint(Default::default())
            )),
            Err(e) => reasons.push(format!("agent key {}: {e}", key.fingerprint(Default::default()))),
        }
    }
    Ok(false)
}

/// True when the peer closed the connection or it failed (a killed
/// server): POLLRDHUP/POLLHUP/POLLERR without waiting.
pub fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait; `fd` is the session's live socket.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Gives up a session inherited over fork: it belongs to the parent, whose
/// runtime drives it (see `Io` in the module above). The socket is closed
/// here, the rest leaked: dropping it would shut the parent's session down
/// from our side.
pub fn abandon(conn: Arc<Conn>) {
    // SAFETY: closes our copy of the parent's socket; the leaked session
    // that still names this number is never used or dropped.
    unsafe { libc::close(conn.fd) };
    std::mem::forget(conn);
}
