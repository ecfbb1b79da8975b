//! The `programs` suite: real programs on the file system.
//! `git status` in a repository of small files, and sqlite3 inserting rows
//! in transactions. On a `preload` configuration every program runs under
//! `shortfuse run`, so its figure includes what the shim costs a process at
//! start (rewriting its code), as a user would pay it.
//!
//! Times come from bash's `$EPOCHREALTIME` around the loop, inside the
//! measured shell, so that neither `shortfuse run` nor bash's own start-up is
//! counted.

use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::cleanup;
use crate::config::{preload_worker, PreloadWorker};
use crate::report::Figure;
use crate::scale::Scale;

struct Sizes {
    /// Directories x files per directory in the repository.
    dirs: usize,
    files: usize,
    /// `git status` runs timed.
    statuses: usize,
    /// sqlite transactions x rows per transaction.
    transactions: usize,
    rows: usize,
}

fn sizes(scale: Scale) -> Sizes {
    Sizes {
        dirs: scale.pick(2, 10, 50),
        files: scale.pick(5, 20, 40),
        statuses: scale.pick(2, 5, 20),
        transactions: scale.pick(2, 20, 100),
        rows: scale.pick(10, 100, 100),
    }
}

pub fn describe(scale: Scale) -> String {
    let s = sizes(scale);
    format!(
        "Scale {}: `git status` {} times in a repository of {} files in {} directories (one file changed); sqlite3 inserting {} rows in {} transactions (default journal) in a new database. Values in ms per `git status` (process start included) and µs per inserted row.",
        scale.name(),
        s.statuses,
        s.dirs * s.files,
        s.dirs,
        s.transactions * s.rows,
        s.transactions,
    )
}

pub fn run(dir: &Path, scale: Scale, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let s = sizes(scale);
    let worker = preload_worker(dir);
    let d = quote(dir);

    progress("git: laying out the repository");
    let dirs: Vec<String> = (1..=s.dirs).map(|i| format!("d{i}")).collect();
    let setup = format!(
        "set -e; cd {d}; git init -q repo; cd repo; git config user.email bench@shortfuse; git config user.name bench; \
         mkdir {dirs}; for d in {dirs}; do for ((f = 1; f <= {files}; f++)); do echo \"$d $f\" > $d/f$f.txt; done; done; \
         git add -A; git commit -qm init; echo changed >> d1/f1.txt",
        dirs = dirs.join(" "),
        files = s.files,
    );
    bash(worker.as_ref(), &setup, "")?;
    progress("git status");
    let git = timed(
        worker.as_ref(),
        &format!("cd {d}/repo"),
        &format!(
            "for ((i = 0; i < {}; i++)); do git status --porcelain > /dev/null || exit 1; done",
            s.statuses
        ),
        "",
    )?;

    progress("sqlite3 inserts");
    let mut sql = String::from("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);\n");
    for t in 0..s.transactions {
        sql += "BEGIN;\n";
        for r in 0..s.rows {
            sql += &format!("INSERT INTO t (v) VALUES ('row {t} {r} {}');\n", "x".repeat(64));
        }
        sql += "COMMIT;\n";
    }
    sql += "SELECT count(*) FROM t;\n";
    let sqlite = timed(
        worker.as_ref(),
        &format!("cd {d}; rm -f bench.db"),
        "sqlite3 -bail bench.db > count.txt || exit 1",
        &sql,
    )?;
    let count = bash(worker.as_ref(), &format!("cat {d}/count.txt"), "")?;
    let rows = s.transactions * s.rows;
    if count.trim() != rows.to_string() {
        return Err(io::Error::other(format!(
            "sqlite3 counted {:?} rows, {rows} were inserted",
            count.trim()
        )));
    }
    Ok(vec![
        latency("git-status", git * 1e3 / s.statuses as f64, "ms", s.statuses),
        latency("sqlite-insert", sqlite * 1e6 / rows as f64, "us", rows),
    ])
}

fn latency(op: &str, value: f64, unit: &str, samples: usize) -> Figure {
    Figure {
        op: op.into(),
        unit: unit.into(),
        value,
        samples: samples as u64,
        lower_is_better: true,
        ..Figure::default()
    }
}

/// Seconds that `body` took in a bash that first ran `prepare` (both on
/// the configuration), with `stdin` fed to it.
fn timed(worker: Option<&PreloadWorker>, prepare: &str, body: &str, stdin: &str) -> io::Result<f64> {
    let script = format!("set -e; {prepare}; s=$EPOCHREALTIME; {body}; e=$EPOCHREALTIME; echo \"$s $e\"");
    let out = bash(worker, &script, stdin)?;
    let times: Vec<f64> = out
        .split_whitespace()
        .rev()
        .take(2)
        .filter_map(|t| t.parse().ok())
        .collect();
    match times[..] {
        [end, start] if end >= start => Ok(end - start),
        _ => Err(io::Error::other(format!("no timing from the script: {out:?}"))),
    }
}

/// Runs `script` with bash, under the preload shim when `worker` says so;
/// returns its standard output.
fn bash(worker: Option<&PreloadWorker>, script: &str, stdin: &str) -> io::Result<String> {
    let mut cmd = match worker {
        Some(w) => {
            let mut c = w.command();
            c.args(["bash", "-c", script]);
            c
        }
        None => {
            let mut c = Command::new("bash");
            c.args(["-c", script]);
            c
        }
    };
    cmd.env("LC_ALL", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Through cleanup, so that Ctrl-C stops the programs before the unmounts.
    let mut child = cleanup::spawn(&mut cmd).map_err(|e| io::Error::new(e.kind(), format!("bash: {e}")))?;
    let mut input = child.stdin.take();
    let feed = stdin.to_string();
    // Fed from a thread: sqlite3 answers while it reads, and a full pipe
    // either way must not block both sides.
    let feeder = std::thread::spawn(move || {
        if let Some(i) = input.as_mut() {
            let _ = i.write_all(feed.as_bytes());
        }
    });
    let mut stderr = child.stderr.take();
    let errors = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(e) = stderr.as_mut() {
            let _ = io::Read::read_to_end(e, &mut v);
        }
        v
    });
    let mut stdout = Vec::new();
    if let Some(o) = child.stdout.as_mut() {
        io::Read::read_to_end(o, &mut stdout)?;
    }
    let status = child.wait();
    cleanup::reap(&mut child);
    let _ = feeder.join();
    let out = std::process::Output {
        status: status?,
        stdout,
        stderr: errors.join().unwrap_or_default(),
    };
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{} ({}): {}",
            script
                .split(';')
                .find(|p| !p.trim().starts_with("set "))
                .unwrap_or(script)
                .trim(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `p` quoted for bash.
fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_paths_for_bash() {
        assert_eq!(quote(Path::new("/a b/c")), "'/a b/c'");
        assert_eq!(quote(Path::new("/it's")), r"'/it'\''s'");
    }

    #[test]
    fn times_a_script_and_reports_its_failure() {
        let t = timed(None, "true", "sleep 0.05", "").unwrap();
        assert!((0.04..5.0).contains(&t), "{t}");
        let e = timed(None, "true", "false", "").unwrap_err().to_string();
        assert!(e.contains("exit status"), "{e}");
        assert!(bash(None, "cat", "fed").unwrap() == "fed");
    }
}
