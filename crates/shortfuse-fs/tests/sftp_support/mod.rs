//! A real OpenSSH server on loopback for the `sftp` tests: generated host
//! and client keys, a free port, `internal-sftp`, root login by key. The
//! server (and every session process it forked) is killed on drop.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

pub struct Sshd {
    pub dir: PathBuf,
    /// The directory the tests serve (a subdirectory of `dir`).
    pub data: PathBuf,
    pub port: u16,
    child: Option<Child>,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether process `pid` holds a socket listening on TCP `port` of
/// 127.0.0.1 (from /proc/net/tcp and its descriptors).
fn listening(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let sockets: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            let p = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            // 0A: TCP_LISTEN.
            (p == port && *state == "0A").then(|| format!("socket:[{inode}]"))
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| sockets.iter().any(|s| l.as_os_str() == s.as_str())))
}

/// Every descendant of `pid`, deepest last.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            out.push(c);
            out.extend(descendants(c));
        }
    }
    out
}

impl Sshd {
    /// Starts a server; panics with a clear message when sshd is missing.
    pub fn start() -> Sshd {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: the sftp tests need a real OpenSSH server (apt-get install openssh-server)"
        );
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "shortfuse-sftp-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).unwrap();
        // sshd refuses to start without its privilege-separation directory.
        std::fs::create_dir_all("/run/sshd").unwrap();
        for key in ["host_key", "client_key"] {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", key, "-f"])
                .arg(dir.join(key)));
        }
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).unwrap();
        let config = format!(
            "HostKey {d}/host_key\nListenAddress 127.0.0.1\nPidFile none\nAuthorizedKeysFile {d}/authorized_keys\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             UsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\nLogLevel ERROR\n",
            d = dir.display()
        );
        std::fs::write(dir.join("sshd_config"), config).unwrap();
        let data = dir.join("data");
        let mut s = Sshd {
            dir,
            data,
            port: free_port(),
            child: None,
        };
        s.listen(true);
        s
    }

    /// (Re)starts the listener on the same port and waits until it accepts.
    pub fn restart(&mut self) {
        self.listen(false);
    }

    /// Starts the listener and waits until it listens; on a port another
    /// listener took meanwhile (tests run side by side, each picking a free
    /// port), on another port if `may_move`, else on the same one once the
    /// port is free.
    // Every path stores the child, reaps it through `try_wait`, or kills
    // and waits for it; clippy cannot follow the retry loop.
    #[allow(clippy::zombie_processes)]
    fn listen(&mut self, may_move: bool) {
        assert!(self.child.is_none(), "sshd already running");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut child = Command::new(SSHD)
                .args(["-D", "-e", "-f"])
                .arg(self.dir.join("sshd_config"))
                .args(["-p", &self.port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {SSHD}: {e}"));
            while Instant::now() < deadline {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    // The old listener's port may linger for a moment.
                    if err.contains("Address already in use") && Instant::now() < deadline {
                        if may_move {
                            self.port = free_port();
                        } else {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        break;
                    }
                    panic!("{SSHD} exited with {status}: {err}");
                }
                // Ours: a connection to the port could reach another
                // test's server that took the same free port first (a key
                // refused by the server, seen once in CI).
                if listening(child.id(), self.port) {
                    self.child = Some(child);
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if self.child.is_none() && Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{SSHD} did not listen on port {} within 15 s", self.port);
            }
        }
    }

    /// Kills the listener and every session it forked (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pids = descendants(child.id());
            let _ = child.kill();
            let _ = child.wait();
            for pid in pids {
                // SAFETY: plain kill(2) of a process this test started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }

    pub fn target(&self) -> String {
        format!("root@127.0.0.1:{}", self.data.display())
    }

    /// port, identity, a private known_hosts, and a short request timeout.
    pub fn options(&self, extra: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
        let mut v: Vec<(String, Option<String>)> = vec![
            ("port".into(), Some(self.port.to_string())),
            (
                "identity".into(),
                Some(self.dir.join("client_key").display().to_string()),
            ),
            (
                "UserKnownHostsFile".into(),
                Some(self.dir.join("known_hosts").display().to_string()),
            ),
            ("timeout".into(), Some("5".into())),
            ("ConnectTimeout".into(), Some("5".into())),
        ];
        v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.map(str::to_string))));
        v
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
