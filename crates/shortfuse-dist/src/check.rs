//! The consistency checker: several clients read and write shared files at
//! once, every operation is recorded with its start and end time, and the
//! history is checked against the rule strong consistency promises here:
//! a read returns the value of the latest write that completed before the
//! read began, or of a write concurrent with the read.
//!
//! Each write stores a value never written before (client and sequence
//! number) over the whole file, `size` bytes of it repeated; a read must
//! see one such value whole. So a read is wrong when it sees
//! - bytes of two writes (torn), a short file, or a value nobody wrote;
//! - a value whose write began after the read ended (from the future);
//! - a value overwritten before the read began: some write started after
//!   its write ended and itself ended before the read began (stale);
//! - the initial empty file after some write had ended before it began.
//!
//! Times are taken from one monotonic clock in one process, around each
//! call: clients are separate [`Register`]s (separate connections, or
//! separate mounts served by separate daemon processes) driven by threads
//! here. The check is exact for what it sees: a pass says no violation
//! happened in this run, a violation is a proof.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shortfuse_fs::pattern::Xorshift;

/// One client's access to the shared files `0..files`.
pub trait Register: Send + Sync {
    /// Replaces file `file`'s contents with `data` (from offset 0).
    fn write(&self, file: usize, data: &[u8]) -> io::Result<()>;
    /// Reads file `file` from offset 0 into `buf`; returns the bytes read.
    fn read(&self, file: usize, buf: &mut [u8]) -> io::Result<usize>;
}

/// What each client does.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Shared files.
    pub files: usize,
    /// Operations per client.
    pub ops: usize,
    /// Share of reads, 0..=100.
    pub read_percent: u32,
    /// Bytes per value (a multiple of 8).
    pub size: usize,
    pub seed: u64,
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            files: 2,
            ops: 200,
            read_percent: 50,
            size: 4096,
            seed: 1,
        }
    }
}

/// What a read saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A whole value (0: the initial empty or zero file).
    Value(u64),
    /// Bytes of more than one value.
    Torn,
    /// Fewer bytes than a value holds, but some.
    Short(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Write(u64),
    Read(Seen),
}

/// One recorded operation; times are from the start of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    pub client: usize,
    pub file: usize,
    pub start: Duration,
    pub end: Duration,
    pub kind: Kind,
}

/// A read that broke the rule, and why.
#[derive(Clone, Debug)]
pub struct Violation {
    pub read: Op,
    pub why: String,
}

/// A value as people read it: whose write it was.
fn describe(v: u64) -> String {
    match (v, (v >> 32).checked_sub(1)) {
        (0, _) => "the initial empty file".to_string(),
        (v, Some(client)) => format!("write #{} of client {client}", v & 0xffff_ffff),
        // Not of the form `value` makes (hand-written histories).
        (v, None) => format!("value {v:#x}"),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.read;
        let saw = match r.kind {
            Kind::Read(Seen::Value(v)) => describe(v),
            Kind::Read(Seen::Torn) => "a mix of writes".to_string(),
            Kind::Read(Seen::Short(n)) => format!("{n} bytes"),
            Kind::Write(v) => format!("(a write: {})", describe(v)),
        };
        write!(
            f,
            "client {} read file {} from {} to {} and saw {saw}: {}",
            r.client,
            r.file,
            ms(r.start),
            ms(r.end),
            self.why
        )
    }
}

/// The outcome of [`run`]: the history and what is wrong with it.
#[derive(Debug)]
pub struct Outcome {
    pub ops: Vec<Op>,
    pub violations: Vec<Violation>,
    pub elapsed: Duration,
}

impl Outcome {
    pub fn reads(&self) -> usize {
        self.ops.iter().filter(|o| matches!(o.kind, Kind::Read(_))).count()
    }

    /// One line for people: counts, and the first violations.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} operations ({} reads) in {:.2}s: ",
            self.ops.len(),
            self.reads(),
            self.elapsed.as_secs_f64(),
        );
        match self.violations.len() {
            0 => s.push_str("no violation"),
            n => s.push_str(&format!(
                "{n} read{} broke the rule (a read returns the latest write completed before it began, or a \
                 write concurrent with it){}",
                if n == 1 { "" } else { "s" },
                if n > 5 { "; the first 5:" } else { ":" }
            )),
        }
        for v in self.violations.iter().take(5) {
            s.push_str(&format!("\n  {v}"));
        }
        s
    }
}

/// The value written by `client` as its `seq`-th write; never 0.
fn value(client: usize, seq: usize) -> u64 {
    ((client as u64 + 1) << 32) | (seq as u64 + 1)
}

fn fill(v: u64, size: usize) -> Vec<u8> {
    v.to_le_bytes().iter().copied().cycle().take(size).collect()
}

fn decode(buf: &[u8], n: usize, size: usize) -> Seen {
    if n == 0 {
        return Seen::Value(0);
    }
    if n < size {
        return Seen::Short(n);
    }
    let first = &buf[..8];
    if buf[..size].chunks(8).all(|c| c == first) {
        Seen::Value(u64::from_le_bytes(first.try_into().unwrap_or([0; 8])))
    } else {
        Seen::Torn
    }
}

/// Runs `w` with one thread per client and checks the history.
pub fn run(clients: &[&dyn Register], w: &Workload) -> io::Result<Outcome> {
    if w.size < 8 || !w.size.is_multiple_of(8) || w.files == 0 || w.read_percent > 100 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad workload {w:?}: size a non-zero multiple of 8, at least one file, reads 0..=100%"),
        ));
    }
    let t0 = Instant::now();
    let per_client: Vec<io::Result<Vec<Op>>> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(client, reg)| {
                s.spawn(move || {
                    let mut rng = Xorshift::seeded(w.seed.wrapping_add(client as u64 + 1));
                    let mut ops = Vec::with_capacity(w.ops);
                    let mut buf = vec![0u8; w.size];
                    let mut seq = 0;
                    for _ in 0..w.ops {
                        let file = (rng.next_u64() % w.files as u64) as usize;
                        let is_read = rng.next_u64() % 100 < u64::from(w.read_percent);
                        let (start, kind);
                        if is_read {
                            start = t0.elapsed();
                            let n = reg.read(file, &mut buf)?;
                            kind = Kind::Read(decode(&buf, n, w.size));
                        } else {
                            let v = value(client, seq);
                            seq += 1;
                            let data = fill(v, w.size);
                            start = t0.elapsed();
                            reg.write(file, &data)?;
                            kind = Kind::Write(v);
                        }
                        let end = t0.elapsed();
                        ops.push(Op {
                            client,
                            file,
                            start,
                            end,
                            kind,
                        });
                    }
                    Ok(ops)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("a client thread panicked")))
            })
            .collect()
    });
    let elapsed = t0.elapsed();
    let mut ops = Vec::new();
    for r in per_client {
        ops.extend(r?);
    }
    ops.sort_by_key(|o| o.start);
    let violations = check(&ops);
    Ok(Outcome {
        ops,
        violations,
        elapsed,
    })
}

/// The reads of `ops` that break the rule (see the module docs).
pub fn check(ops: &[Op]) -> Vec<Violation> {
    let mut out = Vec::new();
    for r in ops {
        let Kind::Read(seen) = r.kind else { continue };
        let writes = || {
            ops.iter().filter_map(move |o| match o.kind {
                Kind::Write(v) if o.file == r.file => Some((o, v)),
                _ => None,
            })
        };
        let superseded_before_read =
            |after: Option<Duration>| writes().find(|(w, _)| after.is_none_or(|a| w.start > a) && w.end < r.start);
        let why = match seen {
            Seen::Torn => Some("bytes of more than one write".to_string()),
            Seen::Short(n) => Some(format!("{n} bytes: a partial write")),
            Seen::Value(0) => {
                superseded_before_read(None).map(|(w, v)| format!("stale: {} had ended at {}", describe(v), ms(w.end)))
            }
            Seen::Value(v) => match writes().find(|(_, wv)| *wv == v) {
                None => Some("a value nobody wrote".to_string()),
                Some((w, _)) if w.start > r.end => Some(format!("that write began later, at {}", ms(w.start))),
                Some((w, _)) => superseded_before_read(Some(w.end)).map(|(w2, v2)| {
                    format!(
                        "stale: {} overwrote it from {} to {}, before the read began",
                        describe(v2),
                        ms(w2.start),
                        ms(w2.end)
                    )
                }),
            },
        };
        if let Some(why) = why {
            out.push(Violation { read: *r, why });
        }
    }
    out
}

/// A client that is a directory of a mount: files `DIR/check-N`, kept
/// open twice: read-write for the writes, read-only for the reads (a mount
/// may cache the pages of read-only opens, which the check then covers).
pub struct MountClient {
    files: Vec<File>,
    readers: Vec<File>,
}

impl MountClient {
    /// Opens the `files` files of `dir`, which another mount may have just
    /// made: a name not yet seen there is looked up again for a while.
    pub fn open(dir: &Path, files: usize) -> io::Result<MountClient> {
        let files = (0..files)
            .map(|i| {
                let p = check_file(dir, i);
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match OpenOptions::new().read(true).write(true).open(&p) {
                        Err(e) if e.kind() == io::ErrorKind::NotFound && Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        r => break r.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display()))),
                    }
                }
            })
            .collect::<io::Result<Vec<File>>>()?;
        let readers = (0..files.len())
            .map(|i| File::open(check_file(dir, i)))
            .collect::<io::Result<Vec<File>>>()?;
        Ok(MountClient { files, readers })
    }
}

fn check_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("check-{i}"))
}

impl Register for MountClient {
    fn write(&self, file: usize, data: &[u8]) -> io::Result<()> {
        self.files[file].write_all_at(data, 0)
    }

    fn read(&self, file: usize, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.readers[file].read_at(&mut buf[done..], done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        Ok(done)
    }
}

/// The checker's own directory, made new in the first mount (never an
/// existing one), and removed with what it holds when dropped.
struct Workdir {
    /// The directory in the first mount.
    path: PathBuf,
    files: usize,
}

impl Workdir {
    fn create(mount: &Path, files: usize) -> io::Result<Workdir> {
        let mut attempt = 0u32;
        loop {
            let path = mount.join(format!(".shortfuse-check-{}-{attempt}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => break Ok(Workdir { path, files }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
                Err(e) => break Err(io::Error::new(e.kind(), format!("creating {}: {e}", path.display()))),
            }
        }
    }

    fn name(&self) -> &std::ffi::OsStr {
        self.path.file_name().unwrap_or_default()
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        // Only the names the checker made, then the directory (empty unless
        // someone else put a file there: then it stays, with theirs).
        for i in 0..self.files {
            let _ = std::fs::remove_file(check_file(&self.path, i));
        }
        if let Err(e) = std::fs::remove_dir(&self.path) {
            tracing::warn!("shortfuse dist check: removing {}: {e}", self.path.display());
        }
    }
}

/// Refuses a directory that is not in a distfs mount: the checker's rule
/// holds for distfs's strong modes only, and on anything else its result
/// means nothing.
fn check_is_distfs(dir: &Path) -> io::Result<()> {
    let canonical =
        std::fs::canonicalize(dir).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    let m = shortfuse::mount::mount_holding(&canonical)?;
    let fstype = m.as_ref().map_or("none", |m| m.fstype.as_str());
    if fstype == "fuse.shortfuse-dist" {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is not in a distfs mount (its file system is {fstype}); the checker is for mounts of \
             one distfs server (shortfuse mount dist ADDR MOUNTPOINT); --force runs it anyway",
            dir.display()
        ),
    ))
}

/// One client per mount point (mounts of one server), each working in the
/// same fresh directory (made through the first mount, removed at the end)
/// on files it creates: nothing that existed is touched. Unless `force`,
/// every mount must be distfs.
pub fn check_mounts(mounts: &[PathBuf], w: &Workload, force: bool) -> io::Result<Outcome> {
    if mounts.len() < 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the checker needs at least two mounts of one server",
        ));
    }
    if !force {
        for m in mounts {
            check_is_distfs(m)?;
        }
    }
    let dir = Workdir::create(&mounts[0], w.files)?;
    for i in 0..w.files {
        // Created empty through the first mount; the others see them under
        // leases (and a weak mount after its cache expires, which the
        // checker then catches as it should).
        let p = check_file(&dir.path, i);
        File::create_new(&p).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
    }
    let clients = mounts
        .iter()
        .map(|m| MountClient::open(&m.join(dir.name()), w.files))
        .collect::<io::Result<Vec<_>>>()?;
    let regs: Vec<&dyn Register> = clients.iter().map(|c| c as &dyn Register).collect();
    let outcome = run(&regs, w);
    // Closed before the directory goes.
    drop(clients);
    outcome
}

/// `shortfuse dist check`: runs [`check_mounts`], prints the summary;
/// an error when a read broke the rule.
pub fn cli(mounts: &[PathBuf], w: &Workload, force: bool) -> io::Result<()> {
    let o = check_mounts(mounts, w, force)?;
    println!("{}", o.summary());
    if o.violations.is_empty() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "consistency violated: {} read(s) broke the rule",
            o.violations.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: usize, start: u64, end: u64, kind: Kind) -> Op {
        Op {
            client,
            file: 0,
            start: Duration::from_millis(start),
            end: Duration::from_millis(end),
            kind,
        }
    }

    fn read(start: u64, end: u64, v: u64) -> Op {
        op(1, start, end, Kind::Read(Seen::Value(v)))
    }

    #[test]
    fn the_rule() {
        let w1 = op(0, 0, 10, Kind::Write(1));
        let w2 = op(0, 20, 30, Kind::Write(2));
        let ok = [
            read(11, 12, 1), // latest completed
            read(25, 40, 1), // w2 concurrent: either
            read(25, 40, 2), // the concurrent one
            read(5, 8, 0),   // w1 still running
            read(5, 8, 1),   // or its value
            read(31, 32, 2), // latest completed
            read(15, 21, 2), // w2 began before the read ended
        ];
        for r in ok {
            assert!(check(&[w1, w2, r]).is_empty(), "{r:?}");
        }
        let bad = [
            read(31, 32, 1),                       // stale
            read(11, 12, 0),                       // initial after a write
            read(11, 12, 2),                       // from the future
            read(11, 12, 7),                       // nobody wrote it
            op(1, 11, 12, Kind::Read(Seen::Torn)), // torn
            op(1, 11, 12, Kind::Read(Seen::Short(3))),
        ];
        for r in bad {
            assert_eq!(check(&[w1, w2, r]).len(), 1, "{r:?}");
        }
        // Overlapping writes: once both ended, either may be the latest.
        let a = op(0, 0, 10, Kind::Write(1));
        let b = op(2, 5, 15, Kind::Write(2));
        assert!(check(&[a, b, read(20, 21, 1)]).is_empty());
        assert!(check(&[a, b, read(20, 21, 2)]).is_empty());
    }

    #[test]
    fn values_decode() {
        assert_eq!(decode(&fill(7, 64), 64, 64), Seen::Value(7));
        assert_eq!(decode(&[0; 64], 0, 64), Seen::Value(0));
        assert_eq!(decode(&fill(7, 64), 16, 64), Seen::Short(16));
        let mut torn = fill(7, 64);
        torn[40..].copy_from_slice(&fill(9, 24));
        assert_eq!(decode(&torn, 64, 64), Seen::Torn);
    }
}
