//! A loopback OpenSSH server for the network rows (`sftp`, `sshfs`): host
//! and client keys generated in a scratch directory, a free port,
//! `internal-sftp`, login by key only, serving the configuration's source
//! directory.
//!
//! The server runs as the first process of its own PID namespace (`unshare
//! --pid --fork --kill-child`), because its per-connection session processes
//! call setsid() and so escape any process group we could signal: when the
//! namespace's first process dies, the kernel kills every session with it.
//! The launcher is started through [`cleanup::spawn`], so Ctrl-C kills it,
//! and `--kill-child` takes the server along; dropping [`Sshd`] stops it too.

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cleanup;
use crate::config::run;

const SSHD: &str = "/usr/sbin/sshd";
const UNSHARE: &str = "/usr/bin/unshare";

/// A running server; dropped, it is killed with every session it forked.
pub struct Sshd {
    /// Keys, configuration, known_hosts and the server's log.
    pub dir: PathBuf,
    /// The directory clients mount (`user@127.0.0.1:data`).
    pub data: PathBuf,
    pub port: u16,
    pub user: String,
    launcher: Option<Child>,
    /// The server as seen from here (the launcher's only child).
    server: Option<u32>,
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free loopback port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// The user we log in as: ourselves (sshd without privileges only lets its
/// own user in; as root, root by key).
fn current_user() -> String {
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } == 0 {
        return "root".into();
    }
    std::env::var("USER").unwrap_or_else(|_| "root".into())
}

/// sshd_config takes double-quoted arguments, so paths with spaces work.
fn quoted(p: &Path) -> String {
    format!("\"{}\"", p.display())
}

impl Sshd {
    /// Generates keys in `dir` (made fresh) and starts a server for `data`;
    /// returns once it accepts connections. An error says why it cannot run.
    pub fn start(dir: &Path, data: &Path) -> Result<Sshd, String> {
        for (bin, pkg) in [(SSHD, "openssh-server"), (UNSHARE, "util-linux")] {
            if !Path::new(bin).exists() {
                return Err(format!("{bin} is missing (apt-get install {pkg})"));
            }
        }
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // sshd refuses to start without its privilege-separation directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        for key in ["host_key", "client_key"] {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", key, "-f"])
                .arg(dir.join(key)))?;
        }
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).map_err(|e| e.to_string())?;
        let config = format!(
            "HostKey {}\nListenAddress 127.0.0.1\nPidFile none\nAuthorizedKeysFile {}\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             UsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\nLogLevel ERROR\n",
            quoted(&dir.join("host_key")),
            quoted(&dir.join("authorized_keys")),
        );
        std::fs::write(dir.join("sshd_config"), config).map_err(|e| e.to_string())?;
        let mut s = Sshd {
            dir: dir.to_path_buf(),
            data: data.to_path_buf(),
            port: 0,
            user: current_user(),
            launcher: None,
            server: None,
        };
        // Another process may take the port between our probe and sshd's
        // bind: try a few.
        let mut last = String::new();
        for _ in 0..5 {
            s.port = free_port()?;
            match s.listen() {
                Ok(()) => return Ok(s),
                Err(e) => last = e,
            }
            if !last.contains("Address already in use") {
                break;
            }
        }
        Err(last)
    }

    /// Starts the launcher on `self.port` and waits until the server
    /// accepts; on failure the launcher is reaped and its log returned.
    fn listen(&mut self) -> Result<(), String> {
        let host_key = std::fs::read_to_string(self.dir.join("host_key.pub")).map_err(|e| e.to_string())?;
        let key: Vec<&str> = host_key.split_whitespace().take(2).collect();
        std::fs::write(
            self.known_hosts(),
            format!("[127.0.0.1]:{} {}\n", self.port, key.join(" ")),
        )
        .map_err(|e| e.to_string())?;
        let log_path = self.dir.join("sshd.log");
        let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let mut cmd = Command::new(UNSHARE);
        cmd.args(["--pid", "--fork", "--kill-child", SSHD, "-D", "-e", "-f"])
            .arg(self.dir.join("sshd_config"))
            .args(["-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of the new
        // process; it allocates nothing and is async-signal-safe. A bench
        // killed outright then takes the launcher (and so the server) along.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        };
        let mut launcher = cleanup::spawn(&mut cmd).map_err(|e| format!("{UNSHARE}: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if has_exited(launcher.id()) {
                cleanup::reap(&mut launcher);
                let status = launcher
                    .try_wait()
                    .ok()
                    .flatten()
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                let err = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(format!("{SSHD} exited with {status}: {}", err.trim()));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                cleanup::reap(&mut launcher);
                return Err(format!("{SSHD} did not listen on port {} within 15 s", self.port));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", launcher.id())).unwrap_or_default();
        self.server = children.split_whitespace().find_map(|p| p.parse().ok());
        self.launcher = Some(launcher);
        Ok(())
    }

    /// `user@127.0.0.1:DATA`, as both sshfs and `shortfuse mount sftp` take it.
    pub fn target(&self) -> String {
        format!("{}@127.0.0.1:{}", self.user, self.data.display())
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client_key")
    }

    /// Lists the server's key, so clients can check it strictly.
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.join("known_hosts")
    }

    /// Kills the server (and with it every session) and reaps the launcher.
    pub fn stop(&mut self) {
        let Some(mut launcher) = self.launcher.take() else {
            return;
        };
        // Killing the server first lets the launcher reap it: killing the
        // launcher first would leave the server a zombie of whoever adopts it.
        if let Some(pid) = self.server.take() {
            // SAFETY: plain kill(2) of the process our launcher forked; it
            // cannot have been reaped (and its pid reused) while the
            // launcher, its parent, is alive and unreaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        // Wait (without reaping, so its pid stays ours for reap's group
        // kill) until the launcher saw the server die and exited.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !has_exited(launcher.id()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        cleanup::reap(&mut launcher);
    }
}

/// Whether our child `pid` has exited, leaving it unreaped.
fn has_exited(pid: u32) -> bool {
    // SAFETY: an all-zero siginfo_t is a valid out-parameter; WNOWAIT
    // leaves the child waitable, so the Child handle still owns it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is valid for writes for the duration of the call.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: waitid filled `info` (si_pid stays 0 while the child runs).
    r != 0 || unsafe { info.si_pid() } != 0
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
