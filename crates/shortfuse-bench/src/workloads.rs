//! The `workloads` suite: the rows of "To FUSE or Not to FUSE" (FAST '17,
//! Table 2), scaled: data rows with 4 KiB, 128 KiB and 1 MiB I/O on one
//! thread and N threads, small-file create/read/delete, and the three
//! filebench personalities. Read rows start with cold caches.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::io::{prealloc, IoRow, Pattern, SmallFiles};
use crate::personalities::{self, Persona};
use crate::report::Figure;
use crate::scale::Scale;
use crate::sys;

pub const SIZES: &[(usize, &str)] = &[(4 << 10, "4K"), (128 << 10, "128K"), (1 << 20, "1M")];

pub struct Sizes {
    /// Size of the shared big file; per-thread files are this over N.
    pub file: u64,
    pub row: Duration,
    pub small_files: usize,
    pub width: usize,
}

impl Sizes {
    pub fn of(scale: Scale) -> Sizes {
        Sizes {
            file: scale.pick(8 << 20, 16 << 20, 4 << 30),
            row: scale.pick(
                Duration::from_millis(15),
                Duration::from_millis(25),
                Duration::from_secs(10),
            ),
            small_files: scale.pick(100, 300, 200_000),
            width: scale.pick(20, 30, 1000),
        }
    }
}

pub fn describe(scale: Scale, n: usize) -> String {
    let s = Sizes::of(scale);
    format!(
        "Scale {}: the workloads of Table 2 of To FUSE or Not to FUSE (FAST '17); N = {n} threads (paper: 32); one {} MiB file or N files of {} MiB (paper: 60 GiB / 32 x 2 GiB); each data row runs for {:.2} s or until its files are covered, reads after dropping caches; up to {} small files in directories of {} (paper: 4 M in directories of 1000); personalities: {}. Values in MB/s and ops/s.",
        scale.name(),
        s.file >> 20,
        (s.file / n as u64) >> 20,
        s.row.as_secs_f64(),
        s.small_files,
        s.width,
        Persona::describe(scale, personalities::duration(scale)),
    )
}

/// Runs one data row per (pattern, threads, files) and I/O size.
pub fn data_rows(
    dir: &Path,
    sizes: &Sizes,
    rows: &[(Pattern, usize, bool, &str)],
    ios: &[(usize, &str)],
    progress: &mut dyn FnMut(&str),
) -> io::Result<Vec<Figure>> {
    let big = vec![dir.join("big")];
    let max_threads = rows.iter().map(|r| r.1).max().unwrap_or(1);
    let small: Vec<PathBuf> = (0..max_threads).map(|t| dir.join(format!("part{t}"))).collect();
    let per_thread = |n: usize| sizes.file / n as u64;
    progress("laying out files");
    prealloc(&big[0], sizes.file)?;
    for p in &small {
        prealloc(p, per_thread(max_threads))?;
    }
    let mut out = Vec::new();
    for &(pattern, threads, per_file, name) in rows {
        for &(bs, bs_name) in ios {
            let op = format!("{name}-{bs_name}");
            progress(&op);
            let fresh: Vec<PathBuf>;
            let (files, file_size): (&[PathBuf], u64) = match (pattern, per_file) {
                (Pattern::SeqWrite, true) => {
                    fresh = (0..threads).map(|t| dir.join(format!("new{t}"))).collect();
                    (&fresh, per_thread(threads))
                }
                (Pattern::SeqWrite, false) => {
                    fresh = vec![dir.join("new")];
                    (&fresh, sizes.file)
                }
                (_, true) => (&small[..threads], per_thread(max_threads)),
                (_, false) => (&big, sizes.file),
            };
            if matches!(pattern, Pattern::SeqRead | Pattern::RandRead) {
                sys::drop_caches()?;
            }
            out.push(
                IoRow {
                    pattern,
                    bs,
                    threads,
                    files,
                    file_size,
                    duration: sizes.row,
                    flags: 0,
                }
                .run(&op)?,
            );
            if pattern == Pattern::SeqWrite {
                for f in files {
                    std::fs::remove_file(f)?;
                }
            }
        }
    }
    std::fs::remove_file(&big[0])?;
    for p in &small {
        std::fs::remove_file(p)?;
    }
    Ok(out)
}

pub fn run(dir: &Path, scale: Scale, n: usize, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let sizes = Sizes::of(scale);
    let nth = |s: &str| s.replace('N', &n.to_string());
    let names: Vec<String> = [
        "seq-rd-1th-1f",
        "seq-rd-Nth-1f",
        "seq-rd-Nth-Nf",
        "rnd-rd-1th-1f",
        "rnd-rd-Nth-1f",
        "seq-wr-1th-1f",
        "seq-wr-Nth-Nf",
        "rnd-wr-1th-1f",
        "rnd-wr-Nth-1f",
    ]
    .iter()
    .map(|s| nth(s))
    .collect();
    let rows: Vec<(Pattern, usize, bool, &str)> = vec![
        (Pattern::SeqRead, 1, false, &names[0]),
        (Pattern::SeqRead, n, false, &names[1]),
        (Pattern::SeqRead, n, true, &names[2]),
        (Pattern::RandRead, 1, false, &names[3]),
        (Pattern::RandRead, n, false, &names[4]),
        (Pattern::SeqWrite, 1, false, &names[5]),
        (Pattern::SeqWrite, n, true, &names[6]),
        (Pattern::RandWrite, 1, false, &names[7]),
        (Pattern::RandWrite, n, false, &names[8]),
    ];
    let mut out = data_rows(dir, &sizes, &rows, SIZES, progress)?;
    for threads in [1, n] {
        let mut files = SmallFiles::new(dir.join(format!("small-{threads}")), sizes.width, threads);
        progress(&format!("files-cr-{threads}th"));
        out.push(files.create(&format!("files-cr-{threads}th"), sizes.small_files, sizes.row * 4)?);
        sys::drop_caches()?;
        progress(&format!("files-rd-{threads}th"));
        out.push(files.read(&format!("files-rd-{threads}th"), sizes.row * 4)?);
        progress(&format!("files-del-{threads}th"));
        out.push(files.delete(&format!("files-del-{threads}th"))?);
        std::fs::remove_dir_all(&files.root)?;
    }
    for p in Persona::all(scale) {
        progress(p.name());
        out.push(personalities::run(dir, p, personalities::duration(scale))?.ops);
    }
    Ok(out)
}
