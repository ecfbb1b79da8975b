//! The `rings` suite: what the README promises of `shortfuse serve`'s
//! shared-memory rings when nothing is being served, measured rather than
//! asserted by the tests (a test can only bound them generously on a
//! shared machine).
//!
//! - `enotconn after kill -9`: a program's call waits on a daemon that is
//!   stopped (SIGSTOP), then the daemon is killed with -9; milliseconds
//!   from the kill until the call returns ENOTCONN (promised: within 50).
//! - `idle daemon CPU`: two programs make calls, then stop; the CPU time
//!   the daemon's threads take while nobody calls, in per cent of one core
//!   (promised: none, the workers sleep on a futex once their spin budget
//!   is spent).
//!
//! Each runs against its own `shortfuse serve mem` daemon, several times;
//! a figure is the median of the runs with their range.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shortfuse::abi;
use shortfuse::Errno;
use shortfuse_ring::RingClient;
use zerocopy::IntoBytes;

use crate::cleanup;
use crate::report::Figure;
use crate::scale::Scale;

fn runs(scale: Scale) -> usize {
    scale.pick(3, 5, 11)
}

fn idle_window(scale: Scale) -> Duration {
    Duration::from_millis(scale.pick(300, 1000, 2000))
}

pub fn describe(scale: Scale) -> String {
    format!(
        "Scale {}: a `shortfuse serve mem` daemon per run, called over its rings from this process; {} runs, a figure is the median with [min-max]. `enotconn after kill -9`: ms from kill -9 of a stopped daemon to the ENOTCONN of a call waiting on it (README: within 50 ms). `idle daemon CPU`: per cent of one core the daemon's threads use over {:.1} s without calls, after two clients made 500 calls each (README: idle rings use no CPU).",
        scale.name(),
        runs(scale),
        idle_window(scale).as_secs_f64()
    )
}

pub fn run(dir: &Path, scale: Scale, bin: &Path, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let n = runs(scale);
    let (mut dead, mut idle) = (Vec::new(), Vec::new());
    for i in 0..n {
        progress(&format!("enotconn after kill -9 (run {} of {n})", i + 1));
        dead.push(enotconn_after_kill(bin, &dir.join(format!("dead-{i}")))?);
        progress(&format!("idle daemon CPU (run {} of {n})", i + 1));
        idle.push(idle_cpu(bin, &dir.join(format!("idle-{i}")), idle_window(scale))?);
    }
    let mut out = Vec::new();
    for (op, unit, runs) in [
        ("enotconn after kill -9", "ms", dead),
        ("idle daemon CPU", "% core", idle),
    ] {
        out.push(Figure {
            lower_is_better: true,
            ..Figure::median_of(op, unit, runs)
        });
    }
    Ok(out)
}

/// A `shortfuse serve mem MOUNTPOINT` daemon (rings only) and one client of
/// it in this process; the daemon is killed when dropped.
struct Daemon {
    child: Child,
    mp: PathBuf,
}

impl Daemon {
    fn start(bin: &Path, mp: &Path) -> io::Result<Daemon> {
        std::fs::create_dir_all(mp)?;
        let child = cleanup::spawn(
            Command::new(bin)
                .args(["serve", "mem"])
                .arg(mp)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )?;
        Ok(Daemon {
            child,
            mp: mp.to_path_buf(),
        })
    }

    /// A new client once the daemon listens, INIT done.
    fn client(&mut self) -> io::Result<RingClient> {
        let path = shortfuse_ring::socket_path(&self.mp);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match RingClient::connect(&path) {
                Ok(c) => {
                    let init = abi::fuse_init_in {
                        major: abi::FUSE_KERNEL_VERSION,
                        minor: abi::FUSE_KERNEL_MINOR_VERSION,
                        ..Default::default()
                    };
                    call(&c, abi::FUSE_INIT, 0, init.as_bytes()).map_err(io::Error::from)?;
                    return Ok(c);
                }
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => {
                    if let Some(status) = self.child.try_wait()? {
                        return Err(io::Error::other(format!("`shortfuse serve mem` exited: {status}")));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signals our own child, which is not reaped before drop.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        cleanup::reap(&mut self.child);
        let _ = std::fs::remove_dir(&self.mp);
    }
}

fn call(c: &RingClient, opcode: u32, nodeid: u64, arg: &[u8]) -> Result<(), Errno> {
    let h = abi::fuse_in_header {
        len: (std::mem::size_of::<abi::fuse_in_header>() + arg.len()) as u32,
        opcode,
        unique: 1,
        nodeid,
        pid: std::process::id(),
        ..Default::default()
    };
    let mut req = h.as_bytes().to_vec();
    req.extend_from_slice(arg);
    c.call(&req, &mut Vec::new())
}

fn getattr_root(c: &RingClient) -> Result<(), Errno> {
    call(c, abi::FUSE_GETATTR, 1, abi::fuse_getattr_in::default().as_bytes())
}

/// Milliseconds from kill -9 of a stopped daemon to the ENOTCONN of the
/// call waiting on it.
fn enotconn_after_kill(bin: &Path, mp: &Path) -> io::Result<f64> {
    let mut d = Daemon::start(bin, mp)?;
    let c = d.client()?;
    d.signal(libc::SIGSTOP);
    // Every thread of it, a worker spinning on another CPU included, has
    // stopped before the call is made.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !all_stopped(d.child.id()) {
        if Instant::now() > deadline {
            return Err(io::Error::other("the daemon did not stop on SIGSTOP"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::scope(|s| {
        let waiting = s.spawn(|| getattr_root(&c));
        // Past every spin: the call sleeps, as one on an idle daemon would.
        std::thread::sleep(Duration::from_millis(200));
        if waiting.is_finished() {
            let got = waiting.join();
            return Err(io::Error::other(format!(
                "a call to a stopped daemon returned: {got:?}"
            )));
        }
        let t = Instant::now();
        d.signal(libc::SIGKILL);
        let got = waiting
            .join()
            .map_err(|_| io::Error::other("the calling thread panicked"))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match got {
            Err(Errno::ENOTCONN) => Ok(ms),
            other => Err(io::Error::other(format!(
                "a call to a killed daemon answered {other:?}, not ENOTCONN"
            ))),
        }
    })
}

/// Whether every thread of process `pid` is stopped (state `T`).
fn all_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the parenthesised name, which may hold anything.
        stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next()) == Some('T')
    })
}

/// Nanoseconds of CPU the threads of process `pid` have used
/// (/proc/PID/task/*/schedstat, finer than the clock ticks of `stat`).
fn cpu_ns(pid: u32) -> io::Result<u64> {
    let mut total = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        total += s
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

/// Per cent of one core the daemon's threads use over `window` without
/// calls, after two clients made 500 calls each.
fn idle_cpu(bin: &Path, mp: &Path, window: Duration) -> io::Result<f64> {
    let mut d = Daemon::start(bin, mp)?;
    let clients = [d.client()?, d.client()?];
    std::thread::scope(|s| {
        let busy: Vec<_> = clients
            .iter()
            .map(|c| s.spawn(move || (0..500).try_for_each(|_| getattr_root(c))))
            .collect();
        for b in busy {
            b.join()
                .map_err(|_| io::Error::other("a calling thread panicked"))?
                .map_err(io::Error::from)?;
        }
        Ok::<_, io::Error>(())
    })?;
    // Past every spin budget (tens of µs).
    std::thread::sleep(Duration::from_millis(100));
    let pid = d.child.id();
    let (t, before) = (Instant::now(), cpu_ns(pid)?);
    std::thread::sleep(window);
    let used = cpu_ns(pid)? - before;
    Ok(used as f64 / t.elapsed().as_nanos() as f64 * 100.0)
}
