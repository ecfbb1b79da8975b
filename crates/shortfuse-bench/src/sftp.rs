//! The `sftp` suite: what a user of a remote directory does most, timed as
//! the user runs it. `cp` of one large file from the mount to a local
//! directory (`cp-down`) and back (`cp-up`), and `ls -lR` of a tree of small
//! files, first on a fresh mount (`ls-lR-cold`: every name and attribute
//! comes from the server) and at once again (`ls-lR-warm`: what the
//! client's caches save). Its defaults put shortfuse's SFTP client
//! (`sftp`) beside Debian's sshfs (`sshfs`), each against its own loopback
//! sshd of the same build and configuration, and native for scale.
//!
//! The file to copy down and the tree are written into the served directory
//! itself, behind the fresh mount, so nothing of them is in the client's
//! caches when the first row starts (the server's page cache holds them,
//! alike for every configuration). Every row checks what the program did:
//! the copies' sizes and contents, and the number of lines `ls` printed.

use std::io;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::config::PreloadWorker;
use crate::report::Figure;
use crate::scale::Scale;
use shortfuse_fs::pattern::bytes;

/// The rows, in report order.
pub const ROWS: &[&str] = &["cp-down", "cp-up", "ls-lR-cold", "ls-lR-warm"];

struct Sizes {
    /// Bytes of the file copied each way.
    file: u64,
    /// Directories in the tree, and files in each.
    dirs: usize,
    per_dir: usize,
}

fn sizes(scale: Scale) -> Sizes {
    Sizes {
        file: scale.pick(4 << 20, 100 << 20, 200 << 20),
        dirs: scale.pick(4, 20, 20),
        per_dir: scale.pick(50, 100, 100),
    }
}

pub fn describe(scale: Scale) -> String {
    let s = sizes(scale);
    format!(
        "Scale {}: `cp` of a {} MiB file from the mount to local ext4 (`cp-down`) and from local ext4 to the mount (`cp-up`); `ls -lR` of {} files in {} directories on a fresh mount (`ls-lR-cold`) and right after (`ls-lR-warm`). The file and the tree are written into the served directory behind the mount, so the client starts with nothing cached. Wall time of each program in ms; each run on a fresh mount and, for the network configurations, a fresh loopback sshd. On the configurations under `shortfuse run` each program is started by it, a new process image: its warm run finds warm only what the file system keeps between programs.",
        scale.name(),
        s.file >> 20,
        s.dirs * s.per_dir,
        s.dirs,
    )
}

/// Writes `size` bytes of blocks of [`bytes`] to `path`.
fn lay_out_file(path: &Path, size: u64) -> io::Result<()> {
    use std::io::Write;
    let block = bytes(7, 1 << 20);
    let mut f = std::fs::File::create(path)?;
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.sync_all()
}

/// Whether `path` holds what [`lay_out_file`] wrote.
fn check_file(path: &Path, size: u64) -> io::Result<()> {
    let got = std::fs::read(path)?;
    if got.len() as u64 != size {
        return Err(io::Error::other(format!(
            "{}: {} bytes, expected {size}",
            path.display(),
            got.len()
        )));
    }
    let block = bytes(7, 1 << 20);
    for (i, piece) in got.chunks(block.len()).enumerate() {
        if piece != &block[..piece.len()] {
            return Err(io::Error::other(format!(
                "{}: MiB {i} differs from what was written",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Runs `cmd` with its output to `out` (or discarded) and times it.
fn timed(cmd: &mut Command) -> io::Result<(f64, Vec<u8>)> {
    let t = Instant::now();
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::piped()).output()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok((ms, out.stdout))
}

/// One row's figure, or the row with why it failed.
fn row(name: &str, r: io::Result<f64>) -> Figure {
    match r {
        Ok(ms) => Figure {
            lower_is_better: true,
            ..Figure::rate(name, "ms", ms, 1)
        },
        Err(e) => Figure {
            error: Some(e.to_string()),
            lower_is_better: true,
            ..Figure::rate(name, "ms", f64::NAN, 0)
        },
    }
}

/// `dir` is where the workload runs (the mount), `source` the directory it
/// serves (the same as `dir` on native), `local` a scratch directory on
/// local ext4 (made and removed here). `shim`: the mount exists only for
/// programs under `shortfuse run`, so each program is started by it (a
/// fresh process image, so `ls-lR-warm` finds warm only what the file
/// system keeps between programs, not the program's own caches).
pub fn run(
    dir: &Path,
    source: &Path,
    local: &Path,
    scale: Scale,
    shim: Option<&PreloadWorker>,
    progress: &mut dyn FnMut(&str),
) -> io::Result<Vec<Figure>> {
    let program = |name: &str| match shim {
        Some(w) => {
            let mut c = w.command();
            c.arg(name);
            c
        }
        None => Command::new(name),
    };
    let s = sizes(scale);
    progress("laying out");
    let _ = std::fs::remove_dir_all(local);
    std::fs::create_dir_all(local)?;
    lay_out_file(&source.join("down"), s.file)?;
    lay_out_file(&local.join("up"), s.file)?;
    let tree = source.join("tree");
    for d in 0..s.dirs {
        let sub = tree.join(format!("d{d:03}"));
        std::fs::create_dir_all(&sub)?;
        for f in 0..s.per_dir {
            std::fs::write(sub.join(format!("f{f:04}")), b"x")?;
        }
    }
    // Lines of `ls -lR`: per directory a heading, a "total" line, its
    // entries and a blank line between listings; the top lists the dirs.
    let lines = |out: &[u8]| out.iter().filter(|&&b| b == b'\n').count();
    let expected = (1 + 1 + s.dirs) + s.dirs * (1 + 1 + 1 + s.per_dir);

    let mut out = Vec::new();
    progress("cp-down");
    let r = timed(program("cp").arg(dir.join("down")).arg(local.join("down")))
        .and_then(|(ms, _)| check_file(&local.join("down"), s.file).map(|()| ms));
    out.push(row("cp-down", r));

    progress("cp-up");
    let r = timed(program("cp").arg(local.join("up")).arg(dir.join("up")))
        .and_then(|(ms, _)| check_file(&source.join("up"), s.file).map(|()| ms));
    out.push(row("cp-up", r));

    for name in ["ls-lR-cold", "ls-lR-warm"] {
        progress(name);
        let r = timed(program("ls").arg("-lR").arg(dir.join("tree"))).and_then(|(ms, text)| {
            if lines(&text) == expected {
                Ok(ms)
            } else {
                Err(io::Error::other(format!(
                    "ls -lR printed {} lines, expected {expected}",
                    lines(&text)
                )))
            }
        });
        out.push(row(name, r));
    }
    let _ = std::fs::remove_dir_all(local);
    Ok(out)
}
