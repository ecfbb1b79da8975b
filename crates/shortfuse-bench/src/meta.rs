//! The `meta` suite: fxmark's metadata workloads (RFUSE Figure 11). Workers
//! start together, run for a fixed time, and count operations. Workloads
//! that consume pre-created files (unlink, move) also stop when they run out.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::io::together;
use crate::report::Figure;
use crate::samples::Rng;
use crate::scale::Scale;
use crate::sys;

pub const WORKLOADS: &[&str] = &[
    "MWCL", "MWCM", "MRDL", "MRDM", "MWUL", "MWUM", "MRPL", "MRPM", "MRPH", "MWRL", "MWRM",
];

struct Sizes {
    duration: Duration,
    /// Files each worker pre-creates for the consuming workloads.
    stock: usize,
    /// Entries in each enumerated directory.
    dir_entries: usize,
    /// Depth of the shared 8-ary tree of MRPM (fxmark: 5).
    tree_depth: u32,
}

fn sizes(scale: Scale) -> Sizes {
    Sizes {
        duration: scale.pick(
            Duration::from_millis(60),
            Duration::from_millis(60),
            Duration::from_secs(5),
        ),
        stock: scale.pick(200, 200, 50_000),
        dir_entries: scale.pick(20, 30, 1000),
        tree_depth: scale.pick(2, 2, 5),
    }
}

pub fn describe(scale: Scale, workers: usize) -> String {
    let s = sizes(scale);
    format!(
        "Scale {}: {workers} workers, {:.2} s per workload; {} pre-created files per worker for unlink/move, {} entries per enumerated directory, shared tree 8-ary of depth {} (fxmark: 5). Values in ops/s.",
        scale.name(),
        s.duration.as_secs_f64(),
        s.stock,
        s.dir_entries,
        s.tree_depth
    )
}

fn touch(p: &Path) -> io::Result<()> {
    sys::close(sys::open(&sys::cpath(p), libc::O_CREAT | libc::O_WRONLY, 0o644)?)
}

/// `levels` nested directories under `base`; returns the deepest file path.
fn deep_path(base: &Path, levels: usize) -> io::Result<PathBuf> {
    let mut p = base.to_path_buf();
    for l in 0..levels {
        p.push(format!("l{l}"));
    }
    std::fs::create_dir_all(&p)?;
    p.push("leaf");
    touch(&p)?;
    Ok(p)
}

fn tree(base: &Path, depth: u32) -> io::Result<()> {
    if depth == 0 {
        return touch(&base.join("leaf"));
    }
    for i in 0..8 {
        let d = base.join(format!("{i}"));
        std::fs::create_dir_all(&d)?;
        tree(&d, depth - 1)?;
    }
    Ok(())
}

fn fill(dir: &Path, prefix: &str, n: usize) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    (0..n)
        .map(|i| {
            let p = dir.join(format!("{prefix}{i}"));
            touch(&p).map(|_| p)
        })
        .collect()
}

fn enumerate(dir: &Path) -> io::Result<u64> {
    let n = std::fs::read_dir(dir)?.count();
    if n == 0 {
        return Err(io::Error::other(format!("{}: empty listing", dir.display())));
    }
    Ok(1)
}

/// Runs one workload in `root` (fresh, removed afterwards) with `workers`.
fn workload(name: &str, root: &Path, workers: usize, s: &Sizes) -> io::Result<Figure> {
    std::fs::create_dir_all(root)?;
    let shared = root.join("shared");
    std::fs::create_dir_all(&shared)?;
    let private: Vec<PathBuf> = (0..workers).map(|w| root.join(format!("p{w}"))).collect();
    for p in &private {
        std::fs::create_dir_all(p)?;
    }
    // Setup: the files and trees each workload consumes or walks.
    let mut stock: Vec<Vec<PathBuf>> = vec![Vec::new(); workers];
    let mut deep: Vec<PathBuf> = Vec::new();
    match name {
        "MRDL" => {
            for p in &private {
                fill(p, "e", s.dir_entries)?;
            }
        }
        "MRDM" => {
            fill(&shared, "e", s.dir_entries)?;
        }
        "MWUL" | "MWRM" => {
            for (w, p) in private.iter().enumerate() {
                stock[w] = fill(p, &format!("w{w}-"), s.stock)?;
            }
        }
        "MWUM" => {
            for (w, st) in stock.iter_mut().enumerate() {
                *st = fill(&shared, &format!("w{w}-"), s.stock)?;
            }
        }
        "MRPL" => {
            for p in &private {
                deep.push(deep_path(p, 5)?);
            }
        }
        "MRPM" => tree(&shared, s.tree_depth)?,
        "MRPH" => deep.push(deep_path(&shared, 5)?),
        "MWRL" => {
            for p in &private {
                touch(&p.join("a"))?;
            }
        }
        _ => {}
    }
    let stock: Vec<Vec<std::ffi::CString>> = stock
        .iter()
        .map(|v| v.iter().map(|p| sys::cpath(p)).collect())
        .collect();
    let deadline_after = s.duration;
    let (ops, elapsed) = together(workers, |w| {
        let deadline = Instant::now() + deadline_after;
        let mut n = 0u64;
        let mut rng = Rng::new(w as u64 + 17);
        let page = [0x21u8; 4096];
        let mine = &private[w];
        let live = || Instant::now() < deadline;
        match name {
            "MWCL" | "MWCM" => {
                let dir = if name == "MWCL" { mine } else { &shared };
                while live() {
                    let p = sys::cpath(&dir.join(format!("c{w}-{n}")));
                    let fd = sys::open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644)?;
                    if name == "MWCM" {
                        sys::pwrite(fd, &page, 0)?;
                    }
                    sys::close(fd)?;
                    n += 1;
                }
            }
            "MRDL" | "MRDM" => {
                let dir = if name == "MRDL" { mine } else { &shared };
                while live() {
                    n += enumerate(dir)?;
                }
            }
            "MWUL" | "MWUM" => {
                for p in &stock[w] {
                    if !live() {
                        break;
                    }
                    sys::unlink(p)?;
                    n += 1;
                }
            }
            "MRPL" | "MRPH" => {
                let p = sys::cpath(&deep[if name == "MRPL" { w } else { 0 }]);
                while live() {
                    sys::stat(&p)?;
                    n += 1;
                }
            }
            "MRPM" => {
                let paths: Vec<_> = (0..256)
                    .map(|_| {
                        let mut p = shared.clone();
                        for _ in 0..s.tree_depth {
                            p.push(format!("{}", rng.below(8)));
                        }
                        sys::cpath(&p.join("leaf"))
                    })
                    .collect();
                while live() {
                    sys::stat(&paths[n as usize % paths.len()])?;
                    n += 1;
                }
            }
            "MWRL" => {
                let a = sys::cpath(&mine.join("a"));
                let b = sys::cpath(&mine.join("b"));
                while live() {
                    let (from, to) = if n & 1 == 0 { (&a, &b) } else { (&b, &a) };
                    sys::rename(from, to)?;
                    n += 1;
                }
            }
            "MWRM" => {
                for (i, p) in stock[w].iter().enumerate() {
                    if !live() {
                        break;
                    }
                    sys::rename(p, &sys::cpath(&shared.join(format!("m{w}-{i}"))))?;
                    n += 1;
                }
            }
            other => return Err(io::Error::other(format!("unknown fxmark workload {other}"))),
        }
        Ok(n)
    })?;
    std::fs::remove_dir_all(root)?;
    if ops == 0 {
        return Err(io::Error::other(format!("{name}: no operation finished")));
    }
    Ok(Figure::rate(name, "ops/s", ops as f64 / elapsed.as_secs_f64(), ops))
}

pub fn run(dir: &Path, scale: Scale, workers: usize, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let s = sizes(scale);
    let mut out = Vec::new();
    for name in WORKLOADS {
        progress(name);
        out.push(
            workload(name, &dir.join(name), workers, &s)
                .map_err(|e| io::Error::new(e.kind(), format!("{name}: {e}")))?,
        );
    }
    Ok(out)
}
