//! `shortfuse list`: the shortfuse mounts of this mount namespace (type
//! `fuse.shortfuse-NAME` in /proc/self/mountinfo) and the daemons that
//! answer on a control socket in this user's runtime directory (`serve`
//! daemons without a kernel mount included), one line each.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// One line of the listing.
#[derive(Debug, Default, Clone)]
struct Entry {
    fs: String,
    source: String,
    transport: String,
    pid: Option<u32>,
    log: String,
}

const TYPE_PREFIX: &str = "fuse.shortfuse-";

/// The `info` answer of a control socket, as key-value pairs.
fn info(socket: &Path) -> Option<BTreeMap<String, String>> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok()?;
    s.write_all(b"info\n").ok()?;
    s.shutdown(std::net::Shutdown::Write).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let map: BTreeMap<String, String> = out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    map.contains_key("pid").then_some(map)
}

fn collect() -> io::Result<BTreeMap<PathBuf, Entry>> {
    let mut out = BTreeMap::new();
    for m in shortfuse::mount::mounts()? {
        if let Some(fs) = m.fstype.strip_prefix(TYPE_PREFIX) {
            out.insert(
                m.mount_point.clone(),
                Entry {
                    fs: fs.to_string(),
                    source: m.source.clone(),
                    ..Entry::default()
                },
            );
        }
    }
    // Every mount's daemon, found by its mount point (the socket of a
    // daemon of another user is in that user's directory: not found).
    for (mp, e) in out.iter_mut() {
        if let Some(i) = info(&shortfuse::control::socket_path(mp)) {
            e.pid = i.get("pid").and_then(|p| p.parse().ok());
            e.transport = i.get("transport").cloned().unwrap_or_default();
            e.log = i.get("log").cloned().unwrap_or_default();
        }
    }
    // Daemons without a kernel mount (`serve` with rings alone).
    if let Ok(dir) = std::fs::read_dir(shortfuse::control::socket_dir()) {
        for d in dir.flatten() {
            let path = d.path();
            if path.extension().is_none_or(|x| x != "sock") {
                continue;
            }
            let Some(i) = info(&path) else { continue };
            let Some(mp) = i.get("mountpoint").map(PathBuf::from) else {
                continue;
            };
            out.entry(mp).or_insert_with(|| Entry {
                fs: i.get("fs").cloned().unwrap_or_default(),
                source: i.get("source").cloned().unwrap_or_default(),
                transport: i.get("transport").cloned().unwrap_or_default(),
                pid: i.get("pid").and_then(|p| p.parse().ok()),
                log: i.get("log").cloned().unwrap_or_default(),
            });
        }
    }
    // Rings beside a kernel mount (`serve --transport`).
    for (mp, e) in out.iter_mut() {
        let ring = shortfuse_ring::socket_path(mp);
        if e.transport != "rings" && std::os::unix::net::UnixStream::connect(&ring).is_ok() {
            e.transport.push_str("+rings");
        }
    }
    Ok(out)
}

/// Prints the table; `-` where nothing is known (a daemon that died, or
/// another user's).
pub fn main() -> io::Result<()> {
    let rows: Vec<[String; 6]> = collect()?
        .into_iter()
        .map(|(mp, e)| {
            let dash = |s: String| if s.is_empty() { "-".to_string() } else { s };
            [
                mp.display().to_string(),
                dash(e.fs),
                dash(e.source),
                dash(e.transport),
                e.pid.map_or("-".to_string(), |p| p.to_string()),
                dash(e.log),
            ]
        })
        .collect();
    let header = ["MOUNTPOINT", "FS", "SOURCE", "TRANSPORT", "PID", "LOG"];
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    for r in std::iter::once(header.map(str::to_string)).chain(rows) {
        let line: Vec<String> = r.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", line.join("  ").trim_end());
    }
    Ok(())
}

/// `shortfuse logs MOUNTPOINT`: the file the daemon's stderr goes to, as
/// the daemon says (`info`), else the background log's name; printed whole.
pub fn print_log(mount_point: &Path) -> io::Result<()> {
    let mp = shortfuse::mount::canonical_mountpoint(mount_point)?;
    let log = info(&shortfuse::control::socket_path(&mp))
        .and_then(|i| i.get("log").cloned())
        .map(PathBuf::from)
        .unwrap_or_else(|| shortfuse::control::log_path(&mp));
    if !log.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no log for {} ({} is not a file: the daemon runs in the foreground, or never ran)",
                mp.display(),
                log.display()
            ),
        ));
    }
    let mut f = std::fs::File::open(&log).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", log.display())))?;
    io::copy(&mut f, &mut io::stdout().lock()).map(drop)
}
