//! `-o metrics=ADDR:PORT`: the daemon answers `GET /metrics` on ADDR:PORT
//! with its statistics in the Prometheus text format, for a Prometheus
//! server to scrape (as JuiceFS and rclone do).

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use shortfuse::options::FsOptions;
use shortfuse::stats::Stats;

/// Takes `metrics=ADDR:PORT` out of the file system's options and binds
/// it (before the daemon forks, so that a taken port is reported at once).
pub fn take_from(rest: &mut FsOptions) -> io::Result<Option<TcpListener>> {
    let Some(pos) = rest.iter().position(|(k, _)| k == "metrics") else {
        return Ok(None);
    };
    let (_, value) = rest.remove(pos);
    let addr: SocketAddr =
        value.as_deref().unwrap_or_default().parse().map_err(|e| {
            crate::filesystems::invalid(format!("metrics={}: {e} (ADDR:PORT)", value.unwrap_or_default()))
        })?;
    TcpListener::bind(addr)
        .map(Some)
        .map_err(|e| io::Error::new(e.kind(), format!("metrics={addr}: {e}")))
}

/// Answers scrapes on a thread of its own for the life of the process.
pub fn serve(listener: TcpListener, stats: Arc<Stats>, mount_point: PathBuf) -> io::Result<()> {
    std::thread::Builder::new()
        .name("shortfuse-metrics".to_string())
        .spawn(move || {
            let mp = mount_point.display().to_string();
            for conn in listener.incoming().flatten() {
                let _ = answer(conn, &stats, &mp);
            }
        })
        .map(drop)
}

fn answer(conn: TcpStream, stats: &Stats, mount_point: &str) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut reader = BufReader::new(&conn);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The headers, up to the blank line; none of them matters here.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let (status, kind, body) = match request.split_whitespace().nth(1) {
        Some("/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            stats.snapshot().prometheus(mount_point),
        ),
        _ => (
            "404 Not Found",
            "text/plain",
            "only /metrics is served here\n".to_string(),
        ),
    };
    write!(
        &conn,
        "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
