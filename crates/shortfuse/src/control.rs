//! The daemon's control socket: a Unix socket per mount, found from the
//! mount point alone, so `shortfuse stats MOUNTPOINT` (and later transports
//! looking for the daemon) need nothing else.
//!
//! Protocol: the client sends one line, the daemon answers with text and
//! closes. Requests: `stats` (table), `stats json`, `stats prometheus`
//! (Prometheus text format), `reset` (zero the
//! counters), `ping` (answers `pong <pid>`), `info` (`KEY=VALUE` lines:
//! pid, mountpoint, fs, source, transport, log). An unknown request is answered
//! with a line starting with `error:`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::stats::Stats;
use crate::sys;

/// Where control sockets live: /run/shortfuse for root, the user's runtime
/// directory otherwise.
pub fn socket_dir() -> PathBuf {
    if sys::geteuid() == 0 {
        return PathBuf::from(ROOT_SOCKET_DIR);
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("shortfuse"),
        _ => PathBuf::from(format!("/tmp/shortfuse-{}", sys::geteuid())),
    }
}

/// [`socket_dir`], created if missing and checked, so that nobody else can
/// plant or swap files in it: a directory (not a symbolic link) owned by
/// this user, writable by nobody else; under /tmp (no `XDG_RUNTIME_DIR`),
/// where any user could have created it first, mode 0700 exactly. Refused
/// with an error that says why otherwise.
pub fn runtime_dir() -> io::Result<PathBuf> {
    let dir = socket_dir();
    let private = dir.starts_with("/tmp");
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", parent.display())))?;
    }
    // /run/shortfuse stays 0755 for root: other users' programs look up
    // root's daemons there. Only the owner ever writes.
    let mode = if private || sys::geteuid() != 0 { 0o700 } else { 0o755 };
    match std::fs::DirBuilder::new().mode(mode).create(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())));
        }
        _ => {}
    }
    check_private_dir(&dir, private)?;
    Ok(dir)
}

/// The checks of [`runtime_dir`] on an existing `dir`; `private`: no access
/// at all for group and others.
fn check_private_dir(dir: &Path, private: bool) -> io::Result<()> {
    let refuse = |why: String| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refusing the runtime directory {}: {why}; another user may have made it to \
                 read or redirect this daemon's files. Remove it, or set XDG_RUNTIME_DIR to a \
                 directory of your own",
                dir.display()
            ),
        )
    };
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.file_type().is_dir() {
        return Err(refuse("it is not a directory".to_string()));
    }
    let me = sys::geteuid();
    if meta.uid() != me {
        return Err(refuse(format!("it belongs to uid {}, not to uid {me}", meta.uid())));
    }
    let wider = meta.mode() & if private { 0o077 } else { 0o022 };
    if wider != 0 {
        return Err(refuse(format!(
            "its mode is {:04o}, {}",
            meta.mode() & 0o7777,
            if private { "not 0700" } else { "writable by others" }
        )));
    }
    Ok(())
}

/// The log of the background daemon serving `mount_point`: beside its
/// control socket, same name, `.log`. It holds what the daemon reports
/// after `shortfuse mount` returned (errors, SIGUSR1 statistics).
pub fn log_path(mount_point: &Path) -> PathBuf {
    socket_path(mount_point).with_extension("log")
}

/// A log found larger than this when a mount starts is kept as `.log.old`
/// (replacing the one before) and a new one begun, so each mount point
/// holds at most about twice this on disk across any number of mounts.
pub const LOG_KEEP_BYTES: u64 = 8 << 20;

/// Opens (appending, created 0600) the log of the daemon serving
/// `mount_point` in the checked [`runtime_dir`]; a symbolic link in its
/// place is refused (O_NOFOLLOW), never followed to a file it names. A log
/// larger than [`LOG_KEEP_BYTES`] is first moved aside.
pub fn open_log(mount_point: &Path) -> io::Result<std::fs::File> {
    runtime_dir()?;
    let path = log_path(mount_point);
    retire_large_log(&path, LOG_KEEP_BYTES)?;
    std::fs::File::options()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("opening the log {}: {e}", path.display())))
}

/// Moves `path` to `path.old` when it is larger than `limit` (only a
/// regular file: the runtime directory is the owner's alone, so nobody can
/// swap it between the check and the rename).
fn retire_large_log(path: &Path, limit: u64) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() && m.len() > limit => {
            let mut old = path.as_os_str().to_owned();
            old.push(".old");
            std::fs::rename(path, &old)
                .map_err(|e| io::Error::new(e.kind(), format!("moving the log {} aside: {e}", path.display())))
        }
        _ => Ok(()),
    }
}

/// 64-bit FNV-1a: stable across runs and builds, unlike std's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The control socket of the mount at `mount_point` (canonical): a readable
/// tail of the path plus a hash of all of it, short enough for sun_path.
pub fn socket_path(mount_point: &Path) -> PathBuf {
    socket_path_in(&socket_dir(), mount_point)
}

/// Where root's daemons put their sockets ([`socket_dir`] of root).
pub const ROOT_SOCKET_DIR: &str = "/run/shortfuse";

/// [`socket_path`] in directory `dir` (another user's [`socket_dir`]).
pub fn socket_path_in(dir: &Path, mount_point: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let bytes = mount_point.as_os_str().as_bytes();
    let name: String = mount_point
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".to_string())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(32)
        .collect();
    dir.join(format!("{name}-{:016x}.sock", fnv1a(bytes)))
}

/// Sends one request to the daemon serving `mount_point` and returns its
/// answer.
pub fn request(mount_point: &Path, line: &str) -> io::Result<String> {
    let mp = crate::mount::canonical_mountpoint(mount_point)?;
    let path = socket_path(&mp);
    let mut s = UnixStream::connect(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "no shortfuse daemon answers for {} ({}: {e})",
                mp.display(),
                path.display()
            ),
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    match out.strip_prefix("error: ") {
        Some(msg) => Err(io::Error::new(io::ErrorKind::InvalidInput, msg.trim().to_string())),
        None => Ok(out),
    }
}

/// What a daemon says of itself to `info` (`shortfuse list`).
#[derive(Clone, Debug, Default)]
pub struct About {
    /// The file system's name (`mem`, `sftp`...).
    pub fs: String,
    /// What it serves, as /proc/mounts shows it.
    pub source: String,
    /// How requests reach it: `dev`, `uring`, `rings`...
    pub transport: String,
}

impl About {
    fn answer(&self, mount_point: &Path) -> String {
        // Where this daemon's stderr goes: its log in the background, a
        // terminal or a pipe in the foreground.
        let log = std::fs::read_link("/proc/self/fd/2").map_or_else(|_| "-".to_string(), |p| p.display().to_string());
        format!(
            "pid={}\nmountpoint={}\nfs={}\nsource={}\ntransport={}\nlog={log}\n",
            std::process::id(),
            mount_point.display(),
            self.fs,
            self.source,
            self.transport
        )
    }
}

/// The listening side; stops and removes its socket when dropped.
pub struct ControlServer {
    path: PathBuf,
    /// Inode of our socket file, so that we never remove a successor's.
    ino: u64,
    /// The listening socket, shut down to end the accept loop.
    waker: UnixListener,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Binds the socket of `mount_point` (canonical) and answers requests on
    /// a thread of its own.
    pub fn start(mount_point: &Path, stats: Arc<Stats>) -> io::Result<ControlServer> {
        Self::start_described(mount_point, stats, About::default())
    }

    /// [`ControlServer::start`], with what the `info` request reports.
    pub fn start_described(mount_point: &Path, stats: Arc<Stats>, about: About) -> io::Result<ControlServer> {
        runtime_dir()?;
        let info = about.answer(mount_point);
        let mp = mount_point.display().to_string();
        let path = socket_path(mount_point);
        // A socket left here belongs to a killed daemon, or to one serving a
        // lazily detached mount that nobody can reach by this path any more:
        // either way the path now names the new mount.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("binding {}: {e}", path.display())))?;
        let ino = std::fs::symlink_metadata(&path)?.ino();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let waker = listener.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("shortfuse-control".to_string())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::Acquire) {
                        break;
                    }
                    match conn {
                        Ok(conn) => {
                            // A stuck client must not stall the others for long.
                            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                            let _ = serve_one(conn, &stats, &info, &mp);
                        }
                        // EMFILE and the like: do not spin.
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })?;
        Ok(ControlServer {
            path,
            ino,
            waker,
            stop,
            thread: Some(thread),
        })
    }

    /// Where the socket listens.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn serve_one(conn: UnixStream, stats: &Stats, info: &str, mount_point: &str) -> io::Result<()> {
    let mut line = String::new();
    BufReader::new(&conn).take(4096).read_line(&mut line)?;
    let answer = match line.trim() {
        "stats" => stats.snapshot().table(),
        "stats json" => stats.snapshot().json() + "\n",
        "stats prometheus" => stats.snapshot().prometheus(mount_point),
        "reset" => {
            stats.reset();
            "ok\n".to_string()
        }
        "ping" => format!("pong {}\n", std::process::id()),
        "info" => info.to_string(),
        other => format!("error: unknown request {other:?}\n"),
    };
    (&conn).write_all(answer.as_bytes())
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag. Not by connecting to the
        // path: a successor may own it by now.
        sys::shutdown_listener(self.waker.as_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Removes the control socket of `mount_point` if no daemon answers on it
/// (its daemon was killed). Returns whether it removed one.
pub fn remove_stale_socket(mount_point: &Path) -> bool {
    let Ok(mp) = crate::mount::canonical_mountpoint(mount_point) else {
        return false;
    };
    let path = socket_path(&mp);
    match UnixStream::connect(&path) {
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(&path).is_ok(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Transport;

    #[test]
    fn a_large_log_is_moved_aside_and_a_small_one_kept() {
        let dir = std::env::temp_dir().join(format!("shortfuse-log-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("m-1.log");
        std::fs::write(&log, vec![b'a'; 100]).unwrap();
        retire_large_log(&log, 100).unwrap();
        assert_eq!(std::fs::read(&log).unwrap().len(), 100, "a log at the limit stays");
        std::fs::write(&log, vec![b'b'; 101]).unwrap();
        retire_large_log(&log, 100).unwrap();
        assert!(!log.exists(), "a log over the limit is moved aside");
        assert_eq!(std::fs::read(dir.join("m-1.log.old")).unwrap(), vec![b'b'; 101]);
        // A second large log replaces the one kept before.
        std::fs::write(&log, vec![b'c'; 200]).unwrap();
        retire_large_log(&log, 100).unwrap();
        assert_eq!(std::fs::read(dir.join("m-1.log.old")).unwrap(), vec![b'c'; 200]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn socket_names_are_short_and_distinct() {
        let a = socket_path(Path::new("/mnt/a-b"));
        let b = socket_path(Path::new("/mnt/a/b"));
        assert_ne!(a, b);
        let long = socket_path(&Path::new("/x").join("y".repeat(300)));
        assert!(long.as_os_str().len() < 108, "{}", long.display());
        assert!(a.file_name().unwrap().to_str().unwrap().starts_with("a-b-"));
        assert!(socket_path(Path::new("/"))
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("root-"));
    }

    #[test]
    fn request_and_answer() {
        let dir = std::env::temp_dir().join(format!("shortfuse-ctl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mp = std::fs::canonicalize(&dir).unwrap();
        let stats = Arc::new(Stats::new());
        stats.record(1, Transport::Dev, 1000);
        // A successor takes the path over; the old server, dropped later,
        // leaves the successor's socket in place.
        let old = ControlServer::start(&mp, stats.clone()).unwrap();
        let server = ControlServer::start(&mp, stats.clone()).unwrap();
        drop(old);
        assert!(server.path().exists());
        let table = request(&mp, "stats").unwrap();
        assert!(table.contains("LOOKUP"), "{table}");
        assert!(request(&mp, "stats json").unwrap().contains("\"name\":\"LOOKUP\""));
        assert!(request(&mp, "ping").unwrap().starts_with("pong "));
        assert_eq!(request(&mp, "reset").unwrap(), "ok\n");
        assert!(stats.snapshot().ops.is_empty());
        let e = request(&mp, "bogus").unwrap_err();
        assert!(e.to_string().contains("unknown request"), "{e}");
        let path = server.path().to_path_buf();
        drop(server);
        assert!(!path.exists(), "the socket is removed");
        // A socket whose daemon died is stale and can be removed.
        let listener = UnixListener::bind(&path).unwrap();
        drop(listener);
        assert!(path.exists());
        assert!(remove_stale_socket(&mp));
        assert!(!path.exists());
        assert!(!remove_stale_socket(&mp), "nothing left to remove");
        let e = request(&mp, "stats").unwrap_err();
        assert!(e.to_string().contains("no shortfuse daemon"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
