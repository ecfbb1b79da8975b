//! `shortfuse bench`: the workloads of the FUSE research it builds on run against native ext4, every
//! shortfuse transport and the peer FUSE file systems, in one run, reported
//! as ratios to native.
//!
//! Each suite runs on each configuration over a fresh directory (a fresh
//! mount for FUSE configurations); a configuration that cannot run, or a
//! workload that fails on it, is reported with the reason and the run goes
//! on. Every mount and every workload process is undone on the way out, also
//! on failure and on Ctrl-C (see [`cleanup`]).

pub mod cache;
pub mod cleanup;
pub mod config;
pub mod data;
pub mod dist;
pub mod fio;
pub mod io;
pub mod latency;
pub mod meta;
pub mod personalities;
pub mod plot;
pub mod programs;
pub mod report;
pub mod rings;
mod samples;
pub mod scale;
pub mod sftp;
pub mod sshd;
pub mod sshfs_read;
mod sys;
pub mod transport;
pub mod workloads;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use config::{Config, Env, Kind};
pub use report::{ConfigResult, Figure, Report, SuiteResult};
pub use scale::Scale;

/// Suites this build runs, in the order a full run takes them.
pub const SUITES: &[&str] = &[
    "latency",
    "fio",
    "meta",
    "workloads",
    "personalities",
    "sshfs-read",
    "sftp",
    "data",
    "transport",
    "dist",
    "programs",
    "cache",
    "rings",
];

/// Former suite names, still accepted on the command line and by [`run`] so
/// that scripts written for them keep working; `--help` lists only
/// [`SUITES`].
const OLD_NAMES: &[(&str, &str)] = &[("table2", "workloads"), ("thesis", "sshfs-read")];

/// The suite `name` selects: one of [`SUITES`], or the suite a former name
/// now stands for.
pub fn suite_named(name: &str) -> Option<&'static str> {
    SUITES
        .iter()
        .copied()
        .find(|s| *s == name)
        .or_else(|| OLD_NAMES.iter().find(|(old, _)| *old == name).map(|(_, new)| *new))
}

/// What `shortfuse bench` was asked.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub suites: Vec<String>,
    /// Configurations for every suite; `None` runs each suite on its own
    /// defaults ([`Config::defaults`]).
    pub configs: Option<Vec<Config>>,
    pub quick: bool,
    /// About a second per suite per configuration, for the test suite
    /// (wins over `quick`).
    pub tiny: bool,
    pub out: PathBuf,
    pub shortfuse_bin: PathBuf,
    /// Workers for `meta` (default: one per core) and N for `workloads`'
    /// N-thread rows (default: two per core).
    pub threads: Option<usize>,
    /// Thread counts of `transport`'s threaded rows (default: 1 to 2x the
    /// cores, [`transport::machine_thread_counts`]).
    pub thread_counts: Option<Vec<usize>>,
}

impl BenchOptions {
    /// Every suite on every configuration at full scale, writing to `out`.
    pub fn new(out: PathBuf) -> BenchOptions {
        BenchOptions {
            suites: SUITES.iter().map(|s| s.to_string()).collect(),
            configs: None,
            quick: false,
            tiny: false,
            out,
            shortfuse_bin: default_shortfuse_bin(),
            threads: None,
            thread_counts: None,
        }
    }

    pub fn scale(&self) -> Scale {
        if self.tiny {
            Scale::Tiny
        } else if self.quick {
            Scale::Quick
        } else {
            Scale::Full
        }
    }
}

/// The `shortfuse` binary next to the running one, else the workspace's
/// debug build.
pub fn default_shortfuse_bin() -> PathBuf {
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("shortfuse")))
        .filter(|p| p.is_file());
    sibling.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/shortfuse"))
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

struct Plan {
    scale: Scale,
    /// For suites that start servers and mounts of their own (`dist`).
    bin: PathBuf,
    meta_workers: usize,
    n: usize,
    /// `transport`'s thread counts.
    thread_counts: Vec<usize>,
    /// The run's scratch directory (not measured): inputs that suites
    /// read, made once per run.
    work: PathBuf,
}

/// Progress on stderr: one line rewritten in place on a terminal; plain
/// lines, without carriage returns or escape codes, when stderr is a file
/// or a pipe (a log must read as text).
struct Progress {
    terminal: bool,
}

impl Progress {
    fn new() -> Progress {
        use std::io::IsTerminal;
        Progress {
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn step(&mut self, label: &str, started: std::time::Instant, step: &str) {
        if self.terminal {
            eprint!("\r\x1b[2K{label} ({:.0}s): {step}", started.elapsed().as_secs_f64());
            let _ = std::io::stderr().flush();
        }
    }

    fn done(&mut self, label: &str, started: std::time::Instant, ok: bool) {
        let line = format!(
            "{label}: {} in {:.1}s",
            if ok { "done" } else { "failed" },
            started.elapsed().as_secs_f64()
        );
        if self.terminal {
            eprintln!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    }
}

/// How many times a suite runs on each configuration: every figure is the
/// median of these runs, shown with their range. `dist` (its modes take
/// turns inside one run) and `rings` (a fresh daemon per run) repeat their
/// rows themselves, so the runner runs them once. `programs` runs twice at
/// the quick scale: each of its rows times one run of a real program over
/// thousands of files (its figure is already a sum over them), and its
/// rounds took most of `make demo`'s measuring (tar and rsync of the
/// 5,000-file tree on the FUSE mounts above all); two keep a range beside
/// every median.
pub fn repeats(suite: &str, scale: Scale) -> usize {
    match suite {
        "dist" | "rings" => 1,
        "programs" => scale.pick(2, 2, 5),
        _ => scale.pick(2, 3, 5),
    }
}

/// Untimed runs of a suite on each configuration before its timed
/// rounds, their figures dropped. `programs` takes one at the quick and
/// full scales: with two rounds, one run of a configuration on caches left
/// cold (the programs' own files, the inputs just made, write-back of what
/// the configuration before wrote) decided its median; natively that moved
/// `tar xf` and `rsync -a` 3x and 8x between runs.
pub fn warm_ups(suite: &str, scale: Scale) -> usize {
    match suite {
        "programs" => scale.pick(0, 1, 1),
        _ => 0,
    }
}

impl Plan {
    fn repeats(&self, suite: &str) -> usize {
        repeats(suite, self.scale)
    }

    fn warm_ups(&self, suite: &str) -> usize {
        warm_ups(suite, self.scale)
    }

    fn describe(&self, suite: &str) -> String {
        let s = self.scale;
        match suite {
            "latency" => {
                let z = latency::Sizes::of(s);
                format!(
                    "Scale {}: {} metadata operations, {} data operations per row, {} MiB sequential read (the median latency of each run in µs; the mean and p99 in the JSON).",
                    s.name(),
                    z.meta_ops,
                    z.data_ops,
                    z.seq_mib
                )
            }
            "fio" => fio::describe(s),
            "meta" => meta::describe(s, self.meta_workers),
            "workloads" => workloads::describe(s, self.n),
            "personalities" => format!(
                "Scale {}: {}. Flow ops/s, and per-step latency in µs (mean; p50/p99 in the JSON).",
                s.name(),
                personalities::Persona::describe(s, personalities::duration(s))
            ),
            "sshfs-read" => sshfs_read::describe(s),
            "sftp" => sftp::describe(s),
            "data" => data::describe(s),
            "transport" => transport::describe(s, &self.thread_counts),
            "dist" => dist::describe(s),
            "programs" => programs::describe(s),
            "cache" => cache::describe(s),
            "rings" => rings::describe(s),
            _ => String::new(),
        }
    }

    fn run(
        &self,
        suite: &str,
        config: &Config,
        dir: &Path,
        source: &Path,
        raw: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> std::io::Result<Vec<Figure>> {
        let s = self.scale;
        if let (Some(w), "meta" | "transport" | "sshfs-read" | "personalities") = (config::preload_worker(dir), suite) {
            let p = latency::SuiteParams {
                workers: self.meta_workers,
                thread_counts: &self.thread_counts,
                holds_files: config.holds_files(),
            };
            return latency::suite_in_worker(&w, suite, dir, s, &p, progress);
        }
        match suite {
            "latency" => latency::run(dir, latency::Sizes::of(s), progress),
            "fio" => fio::run(dir, raw, s, progress),
            "meta" => meta::run(dir, s, self.meta_workers, progress),
            "workloads" => workloads::run(dir, s, self.n, progress),
            "personalities" => personalities::suite(dir, s, progress),
            "sshfs-read" => sshfs_read::run(dir, s, progress),
            "sftp" => {
                let shim = config::preload_worker(dir);
                sftp::run(dir, source, &self.work.join("sftp-local"), s, shim.as_ref(), progress)
            }
            "data" => data::run(dir, s, progress),
            "transport" => transport::run(dir, s, config.holds_files(), &self.thread_counts, progress),
            "dist" => dist::run(dir, s, &self.bin, progress),
            "programs" => programs::run(dir, &self.work.join("programs-input"), s, progress),
            // In memory: the cache structures alone, no mount.
            "cache" => cache::run(s, progress),
            // Its own `shortfuse serve` daemons, called over their rings.
            "rings" => rings::run(dir, s, &self.bin, progress),
            other => Err(std::io::Error::other(format!("unknown suite {other}"))),
        }
    }
}

/// Runs every asked suite on every asked configuration, then writes
/// `report.md`, `report.json` and the plots under `opts.out`.
pub fn run(opts: &BenchOptions) -> Result<Report, String> {
    let mut opts = opts.clone();
    for s in &mut opts.suites {
        match suite_named(s) {
            Some(name) => *s = name.to_string(),
            None => return Err(format!("unknown suite {s:?}; this build has: {}", SUITES.join(", "))),
        }
    }
    let opts = &opts;
    if opts.configs.as_ref().is_some_and(|c| c.is_empty()) {
        return Err("no configuration to run".into());
    }
    if opts.threads == Some(0) {
        return Err("threads must be at least 1".into());
    }
    cleanup::install();
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let env = Env {
        shortfuse_bin: opts.shortfuse_bin.clone(),
        work: opts.out.join("work"),
    };
    let plan = Plan {
        scale: opts.scale(),
        bin: opts.shortfuse_bin.clone(),
        meta_workers: opts.threads.unwrap_or_else(cores),
        n: opts.threads.unwrap_or(2 * cores()).max(2),
        thread_counts: opts
            .thread_counts
            .clone()
            .unwrap_or_else(transport::machine_thread_counts),
        work: env.work.clone(),
    };
    let mut suites = Vec::new();
    let mut log = Progress::new();
    for suite in &opts.suites {
        let configs = opts.configs.clone().unwrap_or_else(|| Config::defaults(suite));
        let repeats = plan.repeats(suite);
        // Each configuration's runs so far, or why it stopped.
        let mut runs: Vec<Result<Vec<Vec<Figure>>, String>> = vec![Ok(Vec::new()); configs.len()];
        for (i, config) in configs.iter().enumerate() {
            if !config.holds_files() && suite != "transport" {
                runs[i] = Err(format!(
                    "not applicable: {} keeps no files, and {suite} needs them (only transport runs on it)",
                    config.name
                ));
            }
        }
        let warm_ups = plan.warm_ups(suite);
        // Rounds: every configuration once per round, the first of a round
        // rotating, so that a slow spell of this shared machine hits every
        // configuration alike rather than all runs of one. The warm-up
        // rounds come first and count for nothing but a failure.
        for round in 0..warm_ups + repeats {
            let warm_up = round < warm_ups;
            for k in 0..configs.len() {
                let i = (k + round) % configs.len();
                let config = &configs[i];
                if runs[i].is_err() {
                    continue;
                }
                let run = if warm_up {
                    "warm-up".to_string()
                } else {
                    format!("run {}", round - warm_ups + 1)
                };
                let of = if warm_up { String::new() } else { format!("/{repeats}") };
                let label = format!("[{}/{}] {suite} on {}, {run}{of}", k + 1, configs.len(), config.name);
                let started = std::time::Instant::now();
                let mut progress = |step: &str| log.step(&label, started, step);
                progress("preparing");
                let raw = opts
                    .out
                    .join("raw")
                    .join(suite)
                    .join(&config.name)
                    .join(run.replace(' ', "-"));
                let outcome = config.prepare(&env).and_then(|p| {
                    let figures = plan
                        .run(suite, config, &p.dir, &p.source, &raw, &mut progress)
                        .map_err(|e| format!("workload failed: {e}"))?;
                    p.check_transport(&env)?;
                    if figures.is_empty() {
                        return Err("the workload gave no figures".to_string());
                    }
                    Ok(figures)
                });
                log.done(&label, started, outcome.is_ok());
                match outcome {
                    Ok(_) if warm_up => {}
                    Ok(figures) => {
                        if let Ok(r) = &mut runs[i] {
                            r.push(figures);
                        }
                    }
                    Err(e) => runs[i] = Err(if round == 0 { e } else { format!("{run}: {e}") }),
                }
            }
        }
        let results: Vec<ConfigResult> = configs
            .iter()
            .zip(runs)
            .map(|(config, r)| match r.and_then(report::merge_runs) {
                Ok(figures) => ConfigResult {
                    config: config.name.clone(),
                    error: None,
                    figures,
                },
                Err(e) => ConfigResult {
                    config: config.name.clone(),
                    error: Some(e),
                    figures: vec![],
                },
            })
            .collect();
        suites.push(SuiteResult {
            suite: suite.clone(),
            scale: plan.describe(suite),
            repeats,
            comparisons: report::comparisons(&results),
            results,
        });
    }
    let _ = std::fs::remove_dir_all(&env.work);
    let mut report = Report {
        environment: report::Environment::probe(),
        suites,
        plots: vec![],
        plot_error: None,
    };
    match plot::draw(&report, &opts.out) {
        Ok(p) => report.plots = p,
        Err(e) => report.plot_error = Some(e),
    }
    std::fs::write(opts.out.join("report.md"), report.markdown()).map_err(|e| e.to_string())?;
    std::fs::write(opts.out.join("report.json"), report.json()).map_err(|e| e.to_string())?;
    Ok(report)
}

const USAGE: &str = "usage: shortfuse bench [SUITE...] [--quick | --tiny] [--configs a,b,...] [--out DIR]
                       [--threads N] [--thread-counts N,N,...] [--shortfuse PATH]

Runs the workloads of the FUSE research it builds on on native ext4, shortfuse and peer FUSE file
systems, and writes report.md, report.json and plots/*.png to DIR
(default: bench-results). --thread-counts sets the thread counts of transport's threaded rows
(default: 1 to 2x this machine's cores; e.g. 8,16,32 on 16 cores).";

/// What `--help` prints: the usage, the suites (current names only), the
/// configurations and each suite's defaults.
fn help() -> String {
    let mut out = format!("{USAGE}\n\nsuites: {}\n", SUITES.join(", "));
    let names: Vec<_> = Config::all().into_iter().map(|c| c.name).collect();
    out += &format!("configurations: {}\n", names.join(", "));
    out += "\nwithout --configs, each suite runs on its defaults:\n";
    for s in SUITES {
        let names: Vec<_> = Config::defaults(s).into_iter().map(|c| c.name).collect();
        out += &format!("  {s}: {}\n", names.join(", "));
    }
    out
}

/// `shortfuse bench ARGS...` (ARGS without the `bench` word): parses, runs,
/// prints the report and where the plots are. Returns the exit status.
pub fn cli_main(args: &[String]) -> i32 {
    if let Some(code) = latency::worker_main(args) {
        return code;
    }
    if let Some(code) = latency::suite_worker_main(args) {
        return code;
    }
    let opts = match parse_args(args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{}", help());
            return 0;
        }
        Err(e) => {
            eprintln!("shortfuse bench: {e}\n{USAGE}");
            return 2;
        }
    };
    let result = run(&opts);
    cleanup::unless_interrupted();
    match result {
        Ok(report) => {
            println!("{}", report.markdown());
            println!("Report: {}", opts.out.join("report.md").display());
            println!("Raw figures: {}", opts.out.join("report.json").display());
            for p in &report.plots {
                println!("Plot: {}", opts.out.join(p).display());
            }
            if let Some(e) = &report.plot_error {
                eprintln!("no plots: {e}");
            }
            let failed = report.incomplete().len();
            if failed > 0 {
                // A demo that lost a configuration must not pass for a
                // complete one (make stops here).
                eprintln!("{failed} suite run(s) did not complete; see the report for why");
                return 1;
            }
            0
        }
        Err(e) => {
            eprintln!("shortfuse bench: {e}");
            1
        }
    }
}

/// `Ok(None)` means help was asked.
pub fn parse_args(args: &[String]) -> Result<Option<BenchOptions>, String> {
    let mut opts = BenchOptions::new(PathBuf::from("bench-results"));
    let mut suites = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| -> Result<String, String> {
            it.next().cloned().ok_or_else(|| format!("{flag} needs a value"))
        };
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--quick" => opts.quick = true,
            "--tiny" => opts.tiny = true,
            "--configs" => {
                let names: Vec<String> = value(a)?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                opts.configs = Some(Config::select(&names)?);
            }
            "--out" => opts.out = PathBuf::from(value(a)?),
            "--shortfuse" => opts.shortfuse_bin = PathBuf::from(value(a)?),
            "--threads" => {
                let v = value(a)?;
                let n: usize = v.parse().map_err(|_| format!("--threads: {v:?} is not a number"))?;
                if n == 0 {
                    return Err("--threads must be at least 1".into());
                }
                opts.threads = Some(n);
            }
            "--thread-counts" => opts.thread_counts = Some(transport::parse_thread_counts(&value(a)?)?),
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s => match suite_named(s) {
                Some(name) => suites.push(name.to_string()),
                None => return Err(format!("unknown suite {s:?}; suites: {}", SUITES.join(", "))),
            },
        }
    }
    if !suites.is_empty() {
        opts.suites = suites;
    }
    Ok(Some(opts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn parses_the_cli_form() {
        let o = parse_args(&args("latency fio --quick --configs native,bindfs --out /tmp/x"))
            .unwrap()
            .unwrap();
        assert_eq!(o.suites, vec!["latency", "fio"]);
        assert!(o.quick);
        assert_eq!(o.scale(), Scale::Quick);
        let names: Vec<_> = o.configs.iter().flatten().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["native", "bindfs"]);
        assert_eq!(o.out, PathBuf::from("/tmp/x"));
        let all = parse_args(&[]).unwrap().unwrap();
        assert_eq!(all.suites.len(), SUITES.len());
        assert_eq!(all.scale(), Scale::Full);
        assert!(all.configs.is_none());
    }

    #[test]
    fn every_suite_has_runnable_defaults() {
        for s in SUITES {
            let d = Config::defaults(s);
            assert!(d.iter().any(|c| c.name == "native"), "{s}: {d:?}");
            if *s != "transport" {
                assert!(d.iter().all(Config::holds_files), "{s}: {d:?}");
            }
        }
        let t: Vec<_> = Config::defaults("transport").into_iter().map(|c| c.name).collect();
        for want in ["dev", "uring", "null-dev", "null-uring"] {
            assert!(t.iter().any(|n| n == want), "{t:?}");
        }
        let d: Vec<_> = Config::defaults("data").into_iter().map(|c| c.name).collect();
        assert_eq!(d, ["native", "dev", "dev-passthrough", "uring-passthrough"]);
    }

    #[test]
    fn dev_passthrough_differs_from_the_defaults_by_passing_readers_through() {
        // With kernel passthrough and the reader cache both defaults of
        // `mount passthrough`, a plain `-o passthrough` mounts what `dev`
        // mounts, and their comparison column says nothing.
        let all = Config::all();
        let pt = all.iter().find(|c| c.name == "dev-passthrough").unwrap();
        assert!(
            pt.describe().contains("-o passthrough,no_reader_cache"),
            "{}",
            pt.describe()
        );
        let dev = all.iter().find(|c| c.name == "dev").unwrap();
        assert!(dev.describe().ends_with("its defaults"), "{}", dev.describe());
    }

    #[test]
    fn former_names_select_the_renamed_suites() {
        let o = parse_args(&args("table2 thesis latency")).unwrap().unwrap();
        assert_eq!(o.suites, ["workloads", "sshfs-read", "latency"]);
        assert_eq!(suite_named("thesis"), Some("sshfs-read"));
        assert_eq!(suite_named("table2"), Some("workloads"));
        assert_eq!(suite_named("workloads"), Some("workloads"));
        assert_eq!(suite_named("nosuch"), None);
    }

    #[test]
    fn help_lists_only_the_current_names() {
        let h = help();
        for s in SUITES {
            assert!(h.contains(&format!("  {s}: native")), "{s} missing: {h}");
        }
        for (old, _) in OLD_NAMES {
            assert!(!h.contains(old), "help names {old}: {h}");
        }
    }

    #[test]
    fn rejects_bad_arguments() {
        assert!(parse_args(&args("nosuch")).is_err());
        assert!(parse_args(&args("--configs native,nope")).is_err());
        assert!(parse_args(&args("--out")).is_err());
        assert!(parse_args(&args("--threads 0")).is_err());
        let o = parse_args(&args("transport --thread-counts 16,8,32")).unwrap().unwrap();
        assert_eq!(o.thread_counts, Some(vec![8, 16, 32]));
        assert!(parse_args(&args("--thread-counts 0,2")).is_err());
        assert!(parse_args(&args("--frobnicate")).is_err());
        assert!(parse_args(&args("--help")).unwrap().is_none());
    }
}
