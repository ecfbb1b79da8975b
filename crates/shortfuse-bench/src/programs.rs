//! The `programs` suite: real programs on the file system, each row one
//! program as people run it: `git add` + `git commit` of a repository of
//! small files and `git status` in it, a clean `make -j2` of a C project,
//! `tar xf` and `tar cf` of a tree of small files, `find | xargs grep` over
//! it, `rsync -a` of it, python3 importing a package tree, and sqlite3
//! inserting rows in transactions, and `/bin/true` started again and again
//! (what a process start costs). On a `preload` or `ring` configuration
//! every program runs under `shortfuse run`, so its figure includes what the
//! shim costs a process at start (rewriting its code), as a user would pay
//! it.
//!
//! Times come from bash's `$EPOCHREALTIME` around the program, inside the
//! measured shell, so that neither `shortfuse run` nor bash's own start-up is
//! counted. Every row checks what the program did (files committed,
//! extracted, archived, found, copied, the built program's output, the
//! modules imported, the rows counted), so a fast wrong answer fails the row.
//! A row that fails is reported with why; the other rows still run.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cleanup;
use crate::config::{preload_worker, PreloadWorker};
use crate::report::Figure;
use crate::scale::Scale;

/// The rows, in report order.
pub const ROWS: &[&str] = &[
    "git-add+commit",
    "git-status",
    "make-j2",
    "tar-xf",
    "tar-cf",
    "find+xargs-grep",
    "rsync-a",
    "python-import",
    "sqlite-insert",
    "true-start",
];

#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Files in the repository (in directories of `per_dir`).
    pub repo_files: usize,
    /// `git status` runs timed.
    pub statuses: usize,
    /// C files compiled by `make -j2` (and one main.c).
    pub c_files: usize,
    /// Files in the tree archived, searched and copied.
    pub tree_files: usize,
    /// Subpackages x modules per subpackage python3 imports.
    pub py_packages: usize,
    pub py_modules: usize,
    /// python3 imports timed.
    pub imports: usize,
    /// sqlite transactions x rows per transaction.
    pub transactions: usize,
    pub rows: usize,
    /// `/bin/true` processes started.
    pub trues: usize,
}

impl Sizes {
    /// The sizes the issue behind this suite names at `quick` (`make demo`)
    /// and `full` (which times more repetitions of the short rows); a few
    /// files each at `tiny`, for the tests.
    pub fn of(scale: Scale) -> Sizes {
        Sizes {
            repo_files: scale.pick(20, 1_000, 1_000),
            statuses: scale.pick(2, 5, 20),
            c_files: scale.pick(3, 50, 50),
            tree_files: scale.pick(40, 5_000, 5_000),
            py_packages: scale.pick(2, 10, 10),
            py_modules: scale.pick(2, 20, 20),
            imports: scale.pick(2, 5, 20),
            transactions: scale.pick(2, 20, 100),
            rows: scale.pick(10, 100, 100),
            trues: scale.pick(20, 200, 1_000),
        }
    }
}

/// Files per directory in the repository and in the tree.
const PER_DIR: usize = 100;
/// One file in this many of the tree holds the word grep looks for.
const NEEDLE_EVERY: usize = 7;

pub fn describe(scale: Scale) -> String {
    let s = Sizes::of(scale);
    format!(
        "Scale {}. `git-add+commit`: `git add -A` + `git commit` of {} new files of a few bytes; `git-status`: `git status --porcelain` in that repository with one file changed (per run of {}); `make-j2`: a clean `make -j2` of {} C files and main.c with gcc -O1, then linking; `tar-xf` and `tar-cf`: extracting and archiving (into an archive on the same file system) a tree of {} files of 1-4 KiB in {} directories; `find+xargs-grep`: `find | xargs grep -l` of a word one file in {NEEDLE_EVERY} holds; `rsync-a`: `rsync -a` of the tree to a new directory beside it; `python-import`: python3 importing a package tree of {} subpackages of {} modules (compiled once before, untimed; per run of {}, the interpreter's start included); `sqlite-insert`: sqlite3 inserting {} rows in {} transactions (default journal) in a new database; `true-start`: `/bin/true` started {} times by the shell, its current directory in the mount (what starting a process costs: fork, exec, the shim's start-up, exit and wait). Values in ms per program run (process start included), µs per inserted row for sqlite and per `/bin/true`.",
        scale.name(),
        s.repo_files,
        s.statuses,
        s.c_files,
        s.tree_files,
        s.tree_files.div_ceil(PER_DIR),
        s.py_packages,
        s.py_modules,
        s.imports,
        s.transactions * s.rows,
        s.transactions,
        s.trues,
    )
}

/// What the rows read from outside the measured directory, made natively
/// before the timed runs: the repository's files, the C project, the tree's
/// archive and the python package.
struct Inputs {
    root: PathBuf,
    /// Files of the tree holding the word grep looks for.
    needles: usize,
}

impl Inputs {
    /// The inputs under `root`, made there unless a run before made them
    /// for the same sizes (they are only read).
    fn make(root: &Path, s: &Sizes) -> io::Result<Inputs> {
        let inputs = Inputs {
            root: root.to_path_buf(),
            needles: s.tree_files.div_ceil(NEEDLE_EVERY),
        };
        let ready = root.join("ready");
        let stamp = format!("{s:?}");
        if std::fs::read_to_string(&ready).is_ok_and(|r| r == stamp) {
            return Ok(inputs);
        }
        let _ = std::fs::remove_dir_all(root);
        std::fs::create_dir_all(root)?;
        crate::cleanup::remember_scratch(root);
        // The repository: numbered files in directories of PER_DIR.
        for i in 0..s.repo_files {
            let d = root.join(format!("repo/d{:03}", i / PER_DIR));
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join(format!("f{i:04}.txt")), format!("file {i}\n"))?;
        }
        // The C project: fNN.c each defining fNN(x) = x + NN, main.c
        // printing the sum of fNN(1), every file including the same header.
        let c = root.join("cproj");
        std::fs::create_dir_all(&c)?;
        let mut header = String::from("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n");
        let mut main = String::from("#include \"common.h\"\nint main(void) {\n    long sum = 0;\n");
        for i in 1..=s.c_files {
            writeln!(header, "int f{i}(int x);").ok();
            writeln!(main, "    sum += f{i}(1);").ok();
            std::fs::write(
                c.join(format!("f{i}.c")),
                format!(
                    "#include \"common.h\"\nint f{i}(int x) {{\n    char buf[32];\n    snprintf(buf, sizeof buf, \"%d\", x + {i});\n    return atoi(buf) + (int)strlen(\"\") ;\n}}\n"
                ),
            )?;
        }
        main += "    printf(\"%ld\\n\", sum);\n    return 0;\n}\n";
        std::fs::write(c.join("common.h"), header)?;
        std::fs::write(c.join("main.c"), main)?;
        std::fs::write(
            c.join("Makefile"),
            "SRCS := $(wildcard *.c)\nOBJS := $(SRCS:.c=.o)\nprog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n%.o: %.c common.h\n\t$(CC) -O1 -c -o $@ $<\n",
        )?;
        // The tree: files of 1-4 KiB of text, one in NEEDLE_EVERY with the
        // word grep looks for.
        for i in 0..s.tree_files {
            let d = root.join(format!("tree/d{:03}", i / PER_DIR));
            std::fs::create_dir_all(&d)?;
            let mut text = String::new();
            let lines = 16 + (i * 37) % 48;
            for l in 0..lines {
                writeln!(
                    text,
                    "line {l} of file {i}: the quick brown fox jumps over the lazy dog"
                )
                .ok();
            }
            if i % NEEDLE_EVERY == 0 {
                text += "shortfuseneedle\n";
            }
            std::fs::write(d.join(format!("f{i:05}.txt")), text)?;
        }
        run_cmd(
            Command::new("tar")
                .arg("-C")
                .arg(root)
                .args(["-cf", "tree.tar", "tree"])
                .current_dir(root),
        )?;
        std::fs::remove_dir_all(root.join("tree"))?;
        // The package: sfpkg/sNN/mMM.py; COUNT is the modules imported.
        let pkg = root.join("pylib/sfpkg");
        std::fs::create_dir_all(&pkg)?;
        let mut top = String::new();
        for p in 0..s.py_packages {
            let sub = pkg.join(format!("s{p:02}"));
            std::fs::create_dir_all(&sub)?;
            let mut init = String::new();
            for m in 0..s.py_modules {
                writeln!(init, "from . import m{m:02}").ok();
                std::fs::write(
                    sub.join(format!("m{m:02}.py")),
                    format!("\"\"\"Module {p}.{m}.\"\"\"\n\nVALUE = {m}\n\n\ndef value(x):\n    return x + VALUE\n\n\nclass Thing:\n    def __init__(self):\n        self.n = {p}\n"),
                )?;
            }
            writeln!(init, "COUNT = {}", s.py_modules).ok();
            std::fs::write(sub.join("__init__.py"), init)?;
            writeln!(top, "from . import s{p:02}").ok();
        }
        let subs: Vec<String> = (0..s.py_packages).map(|p| format!("s{p:02}.COUNT")).collect();
        writeln!(
            top,
            "COUNT = {}",
            if subs.is_empty() { "0".into() } else { subs.join(" + ") }
        )
        .ok();
        std::fs::write(pkg.join("__init__.py"), top)?;
        std::fs::write(ready, stamp)?;
        Ok(inputs)
    }
}

/// Runs `cmd`, an error with its stderr when it fails.
fn run_cmd(cmd: &mut Command) -> io::Result<()> {
    crate::config::run(cmd).map_err(io::Error::other)
}

/// python3 itself, not a version manager's wrapper script of that name
/// (pyenv's shims run bash and pyenv before the interpreter, which would be
/// most of what a row measures).
fn python() -> String {
    Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// Runs every row in `dir`, reading the inputs from `input_root` (outside
/// the measured file system; made by the first run, kept for the others;
/// the caller removes it).
pub fn run(dir: &Path, input_root: &Path, scale: Scale, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let s = Sizes::of(scale);
    let w = preload_worker(dir);
    let w = w.as_ref();
    progress("making the inputs");
    let inputs = Inputs::make(input_root, &s)?;
    let i = quote(&inputs.root);
    let d = quote(dir);
    let py = quote(Path::new(&python()));
    let mut sql = String::from("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);\n");
    for t in 0..s.transactions {
        sql += "BEGIN;\n";
        for r in 0..s.rows {
            sql += &format!("INSERT INTO t (v) VALUES ('row {t} {r} {}');\n", "x".repeat(64));
        }
        sql += "COMMIT;\n";
    }
    sql += "SELECT count(*) FROM t;\n";
    let rows = s.transactions * s.rows;
    let count = |n: usize| n.to_string();
    // In ROWS order; each in the directory left by the ones before.
    let steps = [
        Step {
            prepare: format!(
                "cp -r {i}/repo {d}/repo; cd {d}/repo; git init -q; git config user.email bench@shortfuse; git config user.name bench"
            ),
            body: "git add -A; git commit -qm init".into(),
            check: "git ls-files | wc -l".into(),
            want: count(s.repo_files),
            what: "files committed",
            ..Step::new(s.repo_files)
        },
        Step {
            prepare: format!("cd {d}/repo; echo changed >> d000/f0000.txt"),
            body: format!(
                "for ((i = 0; i < {}; i++)); do git status --porcelain > /dev/null; done",
                s.statuses
            ),
            check: "git status --porcelain".into(),
            want: "M d000/f0000.txt".into(),
            what: "git status (one file changed)",
            per: s.statuses,
            ..Step::new(s.statuses)
        },
        Step {
            prepare: format!("cp -r {i}/cproj {d}/cproj; cd {d}/cproj"),
            body: "make -s -j2".into(),
            check: "./prog".into(),
            want: count(s.c_files + s.c_files * (s.c_files + 1) / 2),
            what: "the built program's sum",
            ..Step::new(s.c_files)
        },
        Step {
            body: format!("tar xf {i}/tree.tar"),
            check: "find tree -type f | wc -l".into(),
            want: count(s.tree_files),
            what: "files extracted",
            ..Step::new(s.tree_files)
        },
        Step {
            body: "tar cf tree.tar tree".into(),
            check: "tar tf tree.tar | grep -vc '/$'; rm tree.tar".into(),
            want: count(s.tree_files),
            what: "files archived",
            ..Step::new(s.tree_files)
        },
        Step {
            // grep exits 1 for a batch without a match: the count decides.
            body: "n=$(find tree -type f -print0 | xargs -0 grep -l shortfuseneedle | wc -l)".into(),
            check: "echo $n".into(),
            want: count(inputs.needles),
            what: "files found",
            ..Step::new(s.tree_files)
        },
        Step {
            body: "rsync -a tree/ copy/".into(),
            check: "find copy -type f | wc -l".into(),
            want: count(s.tree_files),
            what: "files copied",
            ..Step::new(s.tree_files)
        },
        Step {
            // Compiled once, as an installed package would be.
            prepare: format!("cp -r {i}/pylib {d}/pylib; cd {d}/pylib; {py} -c 'import sfpkg'"),
            body: format!("for ((i = 0; i < {}; i++)); do {py} -c 'import sfpkg'; done", s.imports),
            check: format!("{py} -c 'import sfpkg; print(sfpkg.COUNT)'"),
            want: count(s.py_packages * s.py_modules),
            what: "modules imported",
            per: s.imports,
            ..Step::new(s.imports)
        },
        Step {
            prepare: format!("cd {d}; rm -f bench.db"),
            body: "sqlite3 -bail bench.db > count.txt".into(),
            check: "cat count.txt".into(),
            stdin: sql,
            want: count(rows),
            what: "rows counted",
            per: rows,
            unit: "us",
            ..Step::new(rows)
        },
        Step {
            body: format!("for ((i = 0; i < {}; i++)); do /bin/true; done", s.trues),
            check: "echo $i".into(),
            want: count(s.trues),
            what: "processes started",
            per: s.trues,
            unit: "us",
            ..Step::new(s.trues)
        },
    ];
    let mut out = Vec::new();
    for (op, mut step) in ROWS.iter().zip(steps) {
        progress(op);
        if step.prepare.is_empty() {
            step.prepare = format!("cd {d}");
        }
        let value = timed(w, &step.prepare, &step.body, &step.check, &step.stdin).and_then(|(t, got)| {
            if got.trim() == step.want {
                let scale = if step.unit == "us" { 1e6 } else { 1e3 };
                Ok(t * scale / step.per as f64)
            } else {
                Err(io::Error::other(format!(
                    "{}: {:?}, expected {:?}",
                    step.what,
                    got.trim(),
                    step.want
                )))
            }
        });
        out.push(row(op, step.unit, value, step.samples));
    }
    Ok(out)
}

/// One row: bash runs `prepare` (untimed), `body` (timed) and `check`,
/// whose output must be `want`.
struct Step {
    prepare: String,
    body: String,
    check: String,
    stdin: String,
    want: String,
    /// What `want` counts, for the error.
    what: &'static str,
    /// The figure is the time over `per` (runs of the program, rows).
    per: usize,
    unit: &'static str,
    /// Items the row handled, for the JSON.
    samples: usize,
}

impl Step {
    /// A row in ms for one run of its program.
    fn new(samples: usize) -> Step {
        Step {
            prepare: String::new(),
            body: String::new(),
            check: String::new(),
            stdin: String::new(),
            want: String::new(),
            what: "",
            per: 1,
            unit: "ms",
            samples,
        }
    }
}

/// A row's figure: its value, or why it has none.
fn row(op: &str, unit: &str, value: io::Result<f64>, samples: usize) -> Figure {
    let (value, error) = match value {
        Ok(v) => (v, None),
        Err(e) => (f64::NAN, Some(e.to_string())),
    };
    Figure {
        op: op.into(),
        unit: unit.into(),
        value,
        samples: samples as u64,
        lower_is_better: true,
        error,
        ..Figure::default()
    }
}

/// Seconds that `body` took in a bash that first ran `prepare` (all on
/// the configuration), with `stdin` fed to it, and what `check` printed
/// after it.
fn timed(
    worker: Option<&PreloadWorker>,
    prepare: &str,
    body: &str,
    check: &str,
    stdin: &str,
) -> io::Result<(f64, String)> {
    let check = if check.is_empty() { ":" } else { check };
    let script =
        format!("set -e; {prepare}; s=$EPOCHREALTIME; {body}; e=$EPOCHREALTIME; {check}; echo \"@time $s $e\"");
    let out = bash(worker, &script, stdin)?;
    let (before, last) = out.trim_end().rsplit_once('\n').unwrap_or(("", out.trim_end()));
    let times: Vec<f64> = last
        .strip_prefix("@time ")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    match times[..] {
        [start, end] if end >= start => Ok((end - start, before.to_string())),
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
        let (t, said) = timed(None, "true", "sleep 0.05", "echo checked; echo twice", "").unwrap();
        assert!((0.04..5.0).contains(&t), "{t}");
        assert_eq!(said, "checked\ntwice");
        let e = timed(None, "true", "false", "", "").unwrap_err().to_string();
        assert!(e.contains("exit status"), "{e}");
        assert!(bash(None, "cat", "fed").unwrap() == "fed");
    }
}
