//! The `dist` suite: DistFUSE's evaluation (Figures 6 to 8)
//! scaled to this machine, on distfs in its three consistency modes.
//!
//! One embedded server (`shortfuse dist up`) and, per mode, up to
//! [`MAX_CLIENTS`] client mounts (`shortfuse mount dist -o consistency=`),
//! each its own daemon process with its own lease session. Each client
//! runs one thread of fio-like I/O (psync, iodepth 1: `pread`/`pwrite` on
//! files it keeps open) over its working set for a fixed time: opening
//! (lease moves under contention) and closing (a `weak` client writes back
//! on close) are counted in the time. No
//! fsync, as in fio's default and DistFUSE's runs: what write-back leaves
//! dirty is written back when another client wants the file (its cost
//! shows in the contention rows) or at unmount. A working set
//! is [`FILES`] files; at contention c% that many of them are shared by
//! every client and the rest are the client's own (DistFUSE, 6.3).
//!
//! Rows, as in the seed: random (4 KiB) and sequential (128 KiB) I/O at
//! read:write 100:0, 75:25, 50:50, 25:75, 0:100, four clients, no
//! contention (Figure 6); contention 0 to 100% at 50:50 random (Figure 7);
//! 2, 4 and 8 clients at 50:50 random and 50% contention (Figure 8). Each
//! row runs for `lease`, `writethrough` (DistFUSE's baseline) and `weak`,
//! and `lease / writethrough` follows as a ratio. Values are MB/s summed
//! over the clients. After the rows, the consistency checker runs on the
//! `lease` and `writethrough` mounts and the suite fails if it finds a
//! violation.
//!
//! The test's tiny scale runs only the rows the write-back goal is judged on,
//! so that it takes seconds: write-only random I/O without contention on
//! four clients, and 50:50 random I/O at 50% contention on two and four
//! clients; every mode and the checker still run. `--quick` and the full
//! scale run the whole matrix (quick: small files, short rows).

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cleanup;
use crate::config;
use crate::report::Figure;
use crate::samples::Rng;
use crate::scale::Scale;

pub const MODES: &[&str] = &["lease", "writethrough", "weak"];
/// Files in each client's working set (paper: 100).
pub const FILES: usize = 8;
/// Most clients in one row at full scale (paper: 16 nodes, 4 threads each).
pub const MAX_CLIENTS: usize = 8;
pub const READ_PERCENTS: &[u32] = &[100, 75, 50, 25, 0];
pub const CONTENTIONS: &[u32] = &[0, 25, 50, 75, 100];
pub const CLIENTS: &[usize] = &[2, 4, 8];
/// The client curve of the tiny scale.
pub const QUICK_CLIENTS: &[usize] = &[2, 4];
/// Clients of the read:write and contention rows (paper: 4 nodes).
const BASE_CLIENTS: usize = 4;
const RANDOM_BS: usize = 4 << 10;
const SEQ_BS: usize = 128 << 10;

struct Sizes {
    /// Bytes per file (paper: 16 MiB).
    file: u64,
    /// Timed run per row.
    row: Duration,
    /// Timed run per row with contention: a lease move costs milliseconds
    /// on this machine, so a short row holds too few of them to compare.
    contended_row: Duration,
    /// Runs of each row per mode, the modes interleaved (see [`run`]).
    runs: usize,
}

fn sizes(scale: Scale) -> Sizes {
    Sizes {
        file: scale.pick(128 << 10, 256 << 10, 4 << 20),
        row: scale.pick(
            Duration::from_millis(60),
            Duration::from_millis(250),
            Duration::from_secs(2),
        ),
        contended_row: scale.pick(
            Duration::from_millis(60),
            Duration::from_secs(1),
            Duration::from_secs(2),
        ),
        runs: scale.pick(2, 3, 5),
    }
}

/// Client mounts per mode: as many as the largest row has.
pub fn max_clients(scale: Scale) -> usize {
    rows(scale).iter().map(|(r, _)| r.clients).max().unwrap_or(1)
}

/// How many times `scale` runs each row per mode.
pub fn runs(scale: Scale) -> usize {
    sizes(scale).runs
}

/// How many rows `scale` runs (each gives one figure per mode and a ratio).
pub fn row_count(scale: Scale) -> usize {
    rows(scale).len()
}

pub fn describe(scale: Scale) -> String {
    let s = sizes(scale);
    let rows = if scale != Scale::Tiny {
        format!("random 4 KiB and sequential 128 KiB; read:write {READ_PERCENTS:?} (% reads) with {BASE_CLIENTS} clients and no contention; contention {CONTENTIONS:?}% at 50:50 random; {CLIENTS:?} clients at 50:50 random, 50% contention")
    } else {
        format!("random 4 KiB only: write-only with {BASE_CLIENTS} clients and no contention; {QUICK_CLIENTS:?} clients at 50:50, 50% contention (quick and full run DistFUSE's whole matrix)")
    };
    format!(
        "Scale {}: one embedded server, client mounts as separate daemons; {FILES} files of {} KiB per working set (paper: 100 x 16 MiB), one I/O thread per client (paper: 4), {:.2} s per row ({:.2} s with contention) plus closing the files (no fsync); {rows}. Each row runs {} times per mode, the modes taking turns (which goes first rotates), so that a slow spell of this shared machine hits every mode alike: a figure is the median of its runs with [min-max]. MB/s over all clients; `lease/writethrough` rows are the median and range of the ratios of each run's pair. The consistency checker passes on lease and writethrough after the rows.",
        scale.name(),
        s.file >> 10,
        s.row.as_secs_f64(),
        s.contended_row.as_secs_f64(),
        s.runs
    )
}

/// One row of the matrix.
#[derive(Clone, Copy, Debug)]
struct Row {
    random: bool,
    read_percent: u32,
    contention: u32,
    clients: usize,
}

impl Row {
    fn name(&self, series: Option<&str>) -> String {
        format!(
            "{}{} r{}w{} c{} n{}",
            series.map(|s| format!("{s}: ")).unwrap_or_default(),
            if self.random { "rnd" } else { "seq" },
            self.read_percent,
            100 - self.read_percent,
            self.contention,
            self.clients
        )
    }

    fn shared(&self) -> usize {
        (FILES * self.contention as usize + 50) / 100
    }
}

fn rows(scale: Scale) -> Vec<(Row, Option<&'static str>)> {
    let mut out = Vec::new();
    if scale == Scale::Tiny {
        let r = Row {
            random: true,
            read_percent: 0,
            contention: 0,
            clients: BASE_CLIENTS,
        };
        out.push((r, None));
        for &clients in QUICK_CLIENTS {
            let r = Row {
                random: true,
                read_percent: 50,
                contention: 50,
                clients,
            };
            out.push((r, Some("clients")));
        }
        return out;
    }
    for random in [true, false] {
        for &read_percent in READ_PERCENTS {
            let r = Row {
                random,
                read_percent,
                contention: 0,
                clients: BASE_CLIENTS,
            };
            out.push((r, None));
        }
    }
    for &contention in CONTENTIONS.iter().filter(|&&c| c != 0) {
        let r = Row {
            random: true,
            read_percent: 50,
            contention,
            clients: BASE_CLIENTS,
        };
        out.push((r, None));
    }
    for &clients in CLIENTS {
        let r = Row {
            random: true,
            read_percent: 50,
            contention: 50,
            clients,
        };
        out.push((r, Some("clients")));
    }
    out
}

/// `shortfuse dist up` on a free loopback port, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(bin: &Path, data: &Path) -> io::Result<Server> {
        let mut cmd = Command::new(bin);
        cmd.args(["dist", "up", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cleanup::spawn(&mut cmd)?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut line)?;
        }
        match line.rsplit_once(" on ") {
            Some((_, addr)) => Ok(Server {
                child,
                addr: addr.trim().to_string(),
            }),
            None => {
                cleanup::reap(&mut child);
                Err(io::Error::other(format!("`shortfuse dist up` did not start: {line:?}")))
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        cleanup::reap(&mut self.child);
    }
}

/// Client mounts, unmounted when dropped (before the server goes).
struct Mounts(Vec<PathBuf>);

impl Mounts {
    fn mount(&mut self, bin: &Path, addr: &str, mp: &Path, mode: &str) -> io::Result<()> {
        std::fs::create_dir_all(mp)?;
        cleanup::remember(mp);
        self.0.push(mp.to_path_buf());
        config::run(
            Command::new(bin)
                .args(["mount", "dist", addr])
                .arg(mp)
                .arg("-o")
                .arg(format!("consistency={mode}")),
        )
        .map_err(io::Error::other)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !config::is_mounted(mp) {
            if Instant::now() > deadline {
                return Err(io::Error::other(format!("{} never mounted", mp.display())));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for mp in &self.0 {
            config::unmount(mp);
            cleanup::forget(mp);
        }
    }
}

fn shared_file(mp: &Path, i: usize) -> PathBuf {
    mp.join(format!("s{i}"))
}

fn private_file(mp: &Path, client: usize, i: usize) -> PathBuf {
    mp.join(format!("p{client}-{i}"))
}

fn open(p: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
}

/// Lays out every file a row may use, through the first client, and
/// fsyncs each: what a `lease` client leaves dirty would otherwise be
/// written back when another client first wants the file, inside the
/// first timed run of that file (megabytes on a lease move that moves a
/// block or two in steady state).
fn lay_out(mp: &Path, file: u64, clients: usize) -> io::Result<()> {
    let data = vec![0x5au8; 1 << 20];
    let paths = (0..FILES)
        .map(|i| shared_file(mp, i))
        .chain((0..clients).flat_map(|c| (0..FILES).map(move |i| private_file(mp, c, i))));
    for p in paths {
        let f = File::create(&p).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
        let mut off = 0;
        while off < file {
            let n = (file - off).min(data.len() as u64) as usize;
            f.write_all_at(&data[..n], off)?;
            off += n as u64;
        }
        f.sync_all()?;
    }
    Ok(())
}

/// Each client reads its own files and the shared ones once, so that the
/// first row does not pay for moving them away from the client that laid
/// them out.
fn warm_up(mounts: &[PathBuf]) -> io::Result<()> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = mounts
            .iter()
            .enumerate()
            .map(|(c, mp)| {
                scope.spawn(move || {
                    let mut b = [0u8; 1];
                    (0..FILES).try_for_each(|i| {
                        open(&private_file(mp, c, i))?.read_exact_at(&mut b, 0)?;
                        open(&shared_file(mp, i))?.read_exact_at(&mut b, 0)
                    })
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(io::Error::other("warm-up thread panicked")))
        })
    })
}

/// One client's thread: opens its working set, does I/O for `time` (one
/// operation at least) and closes. Returns the bytes moved.
fn client_io(mp: &Path, client: usize, row: Row, file: u64, time: Duration) -> io::Result<u64> {
    let t0 = Instant::now();
    let shared = row.shared();
    let files = (0..shared)
        .map(|i| open(&shared_file(mp, i)))
        .chain((shared..FILES).map(|i| open(&private_file(mp, client, i))))
        .collect::<io::Result<Vec<File>>>()?;
    let bs = if row.random { RANDOM_BS } else { SEQ_BS };
    let mut buf = vec![0xa5u8; bs];
    let mut cursor = [0u64; FILES];
    let mut rng = Rng::new(client as u64 + 1);
    let blocks = (file / bs as u64).max(1);
    let mut bytes = 0u64;
    while bytes == 0 || t0.elapsed() < time {
        let k = rng.below(FILES as u64) as usize;
        let off = if row.random {
            rng.below(blocks) * bs as u64
        } else {
            let o = cursor[k];
            cursor[k] = (o + bs as u64) % (blocks * bs as u64);
            o
        };
        if rng.below(100) < u64::from(row.read_percent) {
            files[k].read_exact_at(&mut buf, off)?;
        } else {
            files[k].write_all_at(&buf, off)?;
        }
        bytes += bs as u64;
    }
    drop(files);
    Ok(bytes)
}

/// The modes (indices into [`MODES`]) in the order run `run` takes them:
/// each run starts with the next mode, so that none always runs first
/// (after a row's start) or right after the same other mode.
fn run_order(run: usize) -> impl Iterator<Item = usize> {
    (0..MODES.len()).map(move |k| (run + k) % MODES.len())
}

/// MB/s of `row` on the first `row.clients` mounts, the clients released
/// together.
fn run_row(mounts: &[PathBuf], row: Row, s: &Sizes) -> io::Result<f64> {
    let time = if row.contention > 0 { s.contended_row } else { s.row };
    let (bytes, elapsed) = crate::io::together(row.clients, |c| client_io(&mounts[c], c, row, s.file, time))?;
    Ok(bytes as f64 / elapsed.as_secs_f64() / 1e6)
}

pub fn run(dir: &Path, scale: Scale, bin: &Path, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let s = sizes(scale);
    let clients = max_clients(scale);
    progress("starting the server");
    let server = Server::start(bin, &dir.join("data"))?;
    let mut mounts = Mounts(Vec::new());
    let mut per_mode: Vec<Vec<PathBuf>> = Vec::new();
    for mode in MODES {
        progress(&format!("mounting {clients} {mode} clients"));
        let mps: Vec<PathBuf> = (0..clients).map(|c| dir.join(format!("{mode}-{c}"))).collect();
        for mp in &mps {
            mounts.mount(bin, &server.addr, mp, mode)?;
        }
        // Each mode on its own files: one mode's unleased writes must not
        // meet another's leases.
        let sub: Vec<PathBuf> = mps.iter().map(|m| m.join(mode)).collect();
        std::fs::create_dir(&sub[0])?;
        progress(&format!("laying out {mode} files"));
        lay_out(&sub[0], s.file, clients)?;
        warm_up(&sub)?;
        per_mode.push(sub);
    }
    let mut out = Vec::new();
    for (row, series) in rows(scale) {
        let name = row.name(series);
        let mut by_mode: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
        for run in 0..s.runs {
            for m in run_order(run) {
                progress(&format!("{name} {} (run {} of {})", MODES[m], run + 1, s.runs));
                by_mode[m].push(run_row(&per_mode[m], row, &s)?);
            }
        }
        // Each run's pair was measured minutes apart at most, the whole
        // row's runs maybe much longer: the ratio is taken per run.
        let ratios = by_mode[0].iter().zip(&by_mode[1]).map(|(l, w)| l / w).collect();
        for (mode, runs) in MODES.iter().zip(by_mode) {
            let mut f = Figure::median_of(format!("{name} {mode}"), "MB/s", runs);
            if let Some(series) = series {
                f = f.at(&format!("{series}-{mode}"), row.clients);
            }
            out.push(f);
        }
        out.push(Figure::median_of(format!("{name} lease/writethrough"), "x", ratios));
    }
    for (mode, mps) in MODES.iter().zip(&per_mode).take(2) {
        progress(&format!("consistency check on {mode}"));
        let checker = Command::new(bin)
            .args(["dist", "check", "--ops", "100"])
            .args(&mps[..3])
            .stdin(Stdio::null())
            .output()?;
        if !checker.status.success() {
            return Err(io::Error::other(format!(
                "the consistency checker failed on {mode}: {}{}",
                String::from_utf8_lossy(&checker.stdout),
                String::from_utf8_lossy(&checker.stderr)
            )));
        }
    }
    drop(mounts);
    drop(server);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix() {
        let r = rows(Scale::Full);
        assert_eq!(r.len(), 2 * READ_PERCENTS.len() + CONTENTIONS.len() - 1 + CLIENTS.len());
        let names: std::collections::HashSet<String> = r.iter().map(|(r, s)| r.name(*s)).collect();
        // The contention-0 row of Figure 7 is Figure 6's 50:50 row, run
        // once; the client curve runs its own rows.
        assert_eq!(names.len(), r.len());
        let shared: Vec<usize> = CONTENTIONS
            .iter()
            .map(|&c| {
                Row {
                    random: true,
                    read_percent: 50,
                    contention: c,
                    clients: 4,
                }
                .shared()
            })
            .collect();
        assert_eq!(shared, [0, 2, 4, 6, 8]);
        assert_eq!(max_clients(Scale::Full), MAX_CLIENTS);
        assert_eq!(rows(Scale::Quick).len(), r.len(), "quick runs the whole matrix too");
    }

    #[test]
    fn every_run_takes_every_mode_once_and_the_first_rotates() {
        for run in 0..2 * MODES.len() {
            let mut order: Vec<usize> = run_order(run).collect();
            assert_eq!(order[0], run % MODES.len());
            order.sort();
            assert_eq!(order, (0..MODES.len()).collect::<Vec<_>>());
        }
        for scale in [Scale::Tiny, Scale::Quick, Scale::Full] {
            assert!(sizes(scale).runs >= 2, "a range needs two runs");
        }
    }

    #[test]
    fn the_quick_rows_keep_what_the_goal_is_judged_on() {
        for scale in [Scale::Tiny, Scale::Quick] {
            let r = rows(scale);
            assert!(r
                .iter()
                .any(|(r, _)| r.random && r.read_percent == 0 && r.contention == 0 && r.clients >= 2));
            assert!(r.iter().any(|(r, _)| r.contention > 0));
            assert!(r.iter().any(|(r, _)| r.clients == 2));
            assert!(max_clients(scale) > 2 && max_clients(scale) <= MAX_CLIENTS);
        }
    }
}
