//! Fixtures for the tests of the scale-out mode (a test-only module: its
//! dependencies, `tempfile` among them, are dev-dependencies).
//!
//! [`TestEtcd`] is a real, single-member etcd (Debian's `etcd-server`,
//! installed by `scripts/setup.sh`) on free loopback ports, with its data in
//! a temporary directory:
//!
//! ```text
//! let etcd = TestEtcd::start().unwrap();
//! // "http://127.0.0.1:PORT": give it to `ServerConfig::agent`, to
//! // `etcd_client::Client::connect`, or to `shortfuse dist up --etcd`.
//! let url = etcd.endpoint();
//! drop(etcd); // killed, its data removed
//! ```
//!
//! Each fixture is its own etcd, so tests need no key prefixes to stay
//! apart. The binary is `$SHORTFUSE_ETCD` if set, else `etcd` on `PATH`;
//! a missing binary is an error that says how to install it (tests fail,
//! they do not skip).

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started etcd may take to answer its health check (it takes
/// about a second; a loaded CI machine, several).
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Attempts with fresh ports: a port picked free may be taken before etcd
/// binds it.
const ATTEMPTS: usize = 3;

/// A running throwaway etcd; dropping it kills it and removes its data.
pub struct TestEtcd {
    child: Child,
    endpoint: String,
    dir: tempfile::TempDir,
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// Whether etcd at `port` says it is healthy (`GET /health`).
pub fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

fn log_tail(path: &Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

impl TestEtcd {
    /// Starts etcd and waits until it serves (bounded: an error after
    /// [`READY_WITHIN`], with the end of its log).
    pub fn start() -> io::Result<TestEtcd> {
        let mut last = None;
        for _ in 0..ATTEMPTS {
            match Self::try_start() {
                Ok(e) => return Ok(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("etcd did not start")))
    }

    fn try_start() -> io::Result<TestEtcd> {
        let dir = tempfile::Builder::new().prefix("shortfuse-etcd-").tempdir()?;
        let (client, peer) = (free_port()?, free_port()?);
        let bin = std::env::var_os("SHORTFUSE_ETCD").unwrap_or_else(|| "etcd".into());
        let log_path = dir.path().join("etcd.log");
        let log = std::fs::File::create(&log_path)?;
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(&bin)
            .arg("--name=test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "starting {}: {e} (install it with scripts/setup.sh: Debian package etcd-server)",
                        Path::new(&bin).display()
                    ),
                )
            })?;
        let mut etcd = TestEtcd {
            child,
            endpoint: client_url,
            dir,
        };
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if healthy(client) {
                return Ok(etcd);
            }
            if let Some(status) = etcd.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "etcd exited ({status}) before serving:\n{}",
                    log_tail(&log_path)
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("etcd not healthy after {READY_WITHIN:?}:\n{}", log_tail(&log_path)),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The endpoint as the list `ServerConfig::etcd` and
    /// `etcd_client::Client::connect` take.
    pub fn endpoints(&self) -> Vec<String> {
        vec![self.endpoint.clone()]
    }

    /// Stops etcd (SIGSTOP) as a stalled disk or a long pause would: its
    /// connections stay open, nothing is answered until [`TestEtcd::thaw`].
    pub fn freeze(&self) -> io::Result<()> {
        self.signal("STOP")
    }

    pub fn thaw(&self) -> io::Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, name: &str) -> io::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()?;
        if !status.success() {
            return Err(io::Error::other(format!("kill -{name} {}: {status}", self.child.id())));
        }
        Ok(())
    }

    /// The temporary directory (etcd's data and log, `etcd.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The runtime the etcd tests drive their managers on: two workers, as a
/// server runs, so that a watch and the call waiting for it both progress.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}
