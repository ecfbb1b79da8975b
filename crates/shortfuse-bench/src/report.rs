//! Results: raw figures per configuration, the Markdown table with ratios to
//! native and the four classes of To FUSE or Not to FUSE (FAST '17), and JSON with every raw figure and
//! the environment.

use serde::Serialize;

/// One measured figure.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figure {
    pub op: String,
    pub unit: String,
    /// Mean latency (or the median, when `mean` is set), or throughput.
    pub value: f64,
    /// The mean latency, when `value` is the median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub samples: u64,
    pub lower_is_better: bool,
    /// For scaling runs: the curve this point belongs to (plotted against
    /// `threads`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// For figures measured in several runs: each run's value, in the
    /// order run (`value` is their median; the Markdown shows the range).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<f64>,
    /// Why this row has no value on this configuration (the other rows of
    /// the configuration measured); `value` is NaN then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Figure {
    /// A throughput-like figure where higher is better.
    pub fn rate(op: impl Into<String>, unit: &str, value: f64, samples: u64) -> Figure {
        Figure {
            op: op.into(),
            unit: unit.into(),
            value,
            samples,
            ..Figure::default()
        }
    }

    /// Marks this figure as the point at `threads` of curve `series`.
    pub fn at(mut self, series: &str, threads: usize) -> Figure {
        self.series = Some(series.to_string());
        self.threads = Some(threads as u32);
        self
    }

    /// A figure measured in several runs: the median as the value, every
    /// run kept (on a shared machine one run can be off by several times;
    /// the median and the range say what a single figure cannot).
    pub fn median_of(op: impl Into<String>, unit: &str, runs: Vec<f64>) -> Figure {
        Figure {
            value: median(&runs),
            samples: runs.len() as u64,
            runs,
            ..Figure::rate(op, unit, 0.0, 0)
        }
    }

    /// The smallest and largest run, when there were several.
    pub fn range(&self) -> Option<(f64, f64)> {
        (self.runs.len() > 1).then(|| {
            let min = self.runs.iter().copied().fold(f64::INFINITY, f64::min);
            let max = self.runs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (min, max)
        })
    }
}

/// The middle value (the mean of the two middle ones for an even count);
/// NaN for none.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Folds the runs of one configuration (each a list of figures, in the
/// same order) into one list: each figure's value is the median of its runs,
/// which are kept with it; p50, p99 and the mean are the medians of theirs.
/// A figure that some run lacks is an error (a run that silently measured
/// less must not pass). A single run is returned as it is (a suite that
/// repeats inside, like `dist`, already gave medians).
pub fn merge_runs(runs: Vec<Vec<Figure>>) -> Result<Vec<Figure>, String> {
    let mut runs = runs.into_iter();
    let Some(first) = runs.next() else {
        return Err("no run completed".into());
    };
    let rest: Vec<Vec<Figure>> = runs.collect();
    if rest.is_empty() {
        return Ok(first);
    }
    let mut out = Vec::with_capacity(first.len());
    for f in first {
        let mut same = vec![f.clone()];
        for (i, run) in rest.iter().enumerate() {
            let g = run
                .iter()
                .find(|g| g.op == f.op)
                .ok_or_else(|| format!("run {} has no figure for {}", i + 2, f.op))?;
            same.push(g.clone());
        }
        let of = |pick: &dyn Fn(&Figure) -> Option<f64>| -> Option<f64> {
            let v: Option<Vec<f64>> = same.iter().map(pick).collect();
            v.map(|v| median(&v))
        };
        // One failed run fails the row: a program that fails now and then
        // is not a figure.
        let error = same
            .iter()
            .enumerate()
            .find_map(|(i, g)| g.error.as_ref().map(|e| format!("run {}: {e}", i + 1)));
        let runs: Vec<f64> = same.iter().filter(|g| g.error.is_none()).map(|g| g.value).collect();
        out.push(Figure {
            value: if error.is_some() { f64::NAN } else { median(&runs) },
            error,
            mean: of(&|g| g.mean),
            p50: of(&|g| g.p50),
            p99: of(&|g| g.p99),
            samples: same.iter().map(|g| g.samples).sum(),
            runs,
            ..f
        });
    }
    Ok(out)
}

/// The outcome of one configuration in one suite.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigResult {
    pub config: String,
    /// Set when the configuration could not run, with the reason.
    pub error: Option<String>,
    pub figures: Vec<Figure>,
}

/// One suite across configurations.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteResult {
    pub suite: String,
    /// What was scaled from the published workloads, in words.
    pub scale: String,
    /// Runs per configuration; every figure is their median.
    pub repeats: usize,
    /// Pairings reported next to the ratios to native (see [`comparisons`]).
    pub comparisons: Vec<Comparison>,
    pub results: Vec<ConfigResult>,
}

/// A column of speed-ups of one configuration over another.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The column heading, e.g. "uring vs dev".
    pub title: String,
    /// (configuration, baseline) pairs; each row uses the first pair where
    /// both measured it (so `null-uring` against `null-dev` for the empty
    /// operations, `uring` against `dev` for the rest).
    pub pairs: Vec<(String, String)>,
}

/// The pairings the issues ask about, kept when one of their pairs has both
/// configurations in `results`: the two transports against each other
///, and kernel passthrough against native (the main table) and
/// against the same file system's defaults (`dev`, whose readers of
/// unchanged files read the mount's page cache), and
/// shortfuse's SFTP client (in the daemon, and in process with the
/// user-space cache) against the kernel-FUSE sshfs on the same kind of
/// loopback server (the comparison of the Prefuse-SSHFS caching thesis).
pub fn comparisons(results: &[ConfigResult]) -> Vec<Comparison> {
    let has = |c: &str| results.iter().any(|r| r.config == c);
    let candidates: [(&str, &[(&str, &str)]); 6] = [
        ("uring vs dev", &[("null-uring", "null-dev"), ("uring", "dev")]),
        (
            "dev-passthrough vs dev (readers passed through vs the defaults)",
            &[("dev-passthrough", "dev")],
        ),
        ("uring-passthrough vs dev (no maps)", &[("uring-passthrough", "dev")]),
        (
            "uring-passthrough vs dev-passthrough",
            &[("uring-passthrough", "dev-passthrough")],
        ),
        ("sftp vs sshfs", &[("sftp", "sshfs")]),
        // The goal of the Prefuse-SSHFS caching thesis: Prefuse with its user-space cache beats kernel-FUSE sshfs.
        ("sftp-preload-cache vs sshfs", &[("sftp-preload-cache", "sshfs")]),
    ];
    candidates
        .iter()
        .filter_map(|(title, pairs)| {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .filter(|(a, b)| has(a) && has(b))
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            (!pairs.is_empty()).then(|| Comparison {
                title: title.to_string(),
                pairs,
            })
        })
        .collect()
}

/// Where and on what the run happened.
#[derive(Clone, Debug, Serialize)]
pub struct Environment {
    pub kernel: String,
    pub cpu: String,
    pub cpus: usize,
    pub commit: String,
    pub date_unix: u64,
}

impl Environment {
    pub fn probe() -> Environment {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| t.lines().find(|l| l.starts_with("model name")).map(|l| l.to_string()))
            .and_then(|l| l.split_once(':').map(|(_, v)| v.trim().to_string()))
            .unwrap_or_else(|| "unknown".into());
        // The source tree this binary was built from, wherever it runs.
        let commit = std::process::Command::new("git")
            .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| option_env!("SHORTFUSE_COMMIT").unwrap_or("unknown").to_string());
        Environment {
            kernel,
            cpu,
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            commit,
            date_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub environment: Environment,
    pub suites: Vec<SuiteResult>,
    /// PNG files written next to the report, relative to the output directory.
    pub plots: Vec<String>,
    /// Why plots are missing, when they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plot_error: Option<String>,
}

/// How much better than native a figure must be to be flagged: closer
/// than this is the same speed on this machine.
pub const FASTER: f64 = 0.05;

/// A bound on what one kernel entry and exit cost, in µs, when the run has
/// no `getpid` row of native's to measure it: well above any machine the
/// bench runs on (0.14 µs on the 2-core guests it was built on).
const ENTRY_US: f64 = 0.5;

/// How many system calls a row's operation makes at most where the shim can
/// save them (open+close: two).
const CALLS_SAVED: f64 = 2.0;

/// Why a configuration can legitimately beat native: the ones served inside
/// the calling process skip the system call native pays. That saves at
/// most a kernel entry and exit per call (`entry_us`, native's getpid in
/// the same run), so it explains only a per-operation row (µs) that gains
/// no more than that; a create that gains 200 µs, or a whole program that
/// gains a third, is not explained by it and must be flagged as such.
fn in_process_reason(config: &str, fig: &Figure, native: &Figure, entry_us: f64) -> Option<&'static str> {
    let in_process =
        ["preload", "ring", "null-ring", "null-preload"].contains(&config) || config.starts_with("sftp-preload");
    let gain_us = native.value - fig.value;
    let small = fig.unit == "us" && fig.lower_is_better && gain_us <= CALLS_SAVED * entry_us;
    (in_process && small).then_some(
        "the preload shim answers it in the calling process (ring: over shared memory with its daemon) without entering the kernel, as native's system call must",
    )
}

/// Whether the configuration caches writes in the kernel (write-back).
fn writes_back(config: &str) -> bool {
    crate::Config::all().iter().any(|c| {
        c.name == config
            && match &c.kind {
                crate::Kind::PassthroughLl => true,
                crate::Kind::Shortfuse { opts, .. } => {
                    opts.split(',').any(|o| o == "optimized" || o == "writeback_cache")
                }
                _ => false,
            }
    })
}

/// Whether two figures' runs overlap (a figure of one run overlaps
/// nothing but equal values).
fn ranges_overlap(a: &Figure, b: &Figure) -> bool {
    let (alo, ahi) = a.range().unwrap_or((a.value, a.value));
    let (blo, bhi) = b.range().unwrap_or((b.value, b.value));
    alo <= bhi && blo <= ahi
}

/// The classes of To FUSE or Not to FUSE (FAST '17) for the relative difference to native (positive is
/// better than native).
pub fn class(rel: f64) -> &'static str {
    if rel >= -0.05 {
        "green"
    } else if rel >= -0.25 {
        "yellow"
    } else if rel >= -0.50 {
        "orange"
    } else {
        "red"
    }
}

/// The relative performance difference of `value` to `native`, as
/// throughput: for latencies, half the latency is +100%.
pub fn relative(value: f64, native: f64, lower_is_better: bool) -> f64 {
    if value <= 0.0 || native <= 0.0 {
        return f64::NAN;
    }
    if lower_is_better {
        native / value - 1.0
    } else {
        value / native - 1.0
    }
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

impl SuiteResult {
    /// A Markdown table: one row per operation, one column per configuration,
    /// each cell the value and its ratio to native with the class.
    pub fn markdown(&self) -> String {
        let mut s = format!("### {}\n\n{}\n\n", self.suite, self.scale);
        let native = self.results.iter().find(|r| r.config == "native" && r.error.is_none());
        let ops = self.ops();
        s.push_str("| op | unit |");
        for r in &self.results {
            s.push_str(&format!(" {} |", r.config));
        }
        s.push_str("\n|---|---|");
        for _ in &self.results {
            s.push_str("---|");
        }
        s.push('\n');
        for f in ops {
            s.push_str(&format!("| {} | {} |", f.op, f.unit));
            let base = native.and_then(|n| n.figures.iter().find(|g| g.op == f.op));
            for r in &self.results {
                let cell = match r.figures.iter().find(|g| g.op == f.op) {
                    None => "n/a".to_string(),
                    Some(g) if g.error.is_some() => "failed (why: below)".to_string(),
                    Some(g) => {
                        let mut cell = fmt_value(g.value);
                        if let Some((lo, hi)) = g.range() {
                            cell += &format!(" [{}-{}]", fmt_value(lo), fmt_value(hi));
                        }
                        if let Some(b) = base.filter(|b| r.config != "native" && b.error.is_none()) {
                            let rel = relative(g.value, b.value, g.lower_is_better);
                            cell += &format!(" ({:.2}x, {})", g.value / b.value, class(rel));
                            if rel > FASTER {
                                cell += " **faster than native**";
                            }
                        }
                        cell
                    }
                };
                s.push_str(&format!(" {cell} |"));
            }
            s.push('\n');
        }
        for r in self.results.iter().filter(|r| r.error.is_some()) {
            s.push_str(&format!(
                "\n- `{}` did not run: {}",
                r.config,
                r.error.as_deref().unwrap_or("")
            ));
        }
        for r in &self.results {
            for g in r.figures.iter().filter(|g| g.error.is_some()) {
                s.push_str(&format!(
                    "\n- `{}` {} failed: {}",
                    r.config,
                    g.op,
                    g.error.as_deref().unwrap_or("")
                ));
            }
        }
        s.push_str(&format!(
            "\n\nCells: the median of {} run(s) [smallest-largest] (ratio to native; class of the relative difference as in To FUSE or Not to FUSE (FAST '17): green better than -5%, yellow -5..-25%, orange -25..-50%, red worse). Every run is in the JSON.\n",
            self.repeats
        ));
        let faster = self.faster_than_native();
        if !faster.is_empty() {
            s.push_str("\nFaster than native by more than 5% (a measuring error unless explained):\n\n");
            for x in &faster {
                s.push_str(&format!("- {x}\n"));
            }
        }
        if !self.comparisons.is_empty() {
            s.push_str(&self.comparison_table());
        }
        s
    }

    /// Figures of other configurations that beat native by more than
    /// [`FASTER`], each with why (or that nothing explains it).
    pub fn faster_than_native(&self) -> Vec<String> {
        let Some(native) = self.results.iter().find(|r| r.config == "native" && r.error.is_none()) else {
            return Vec::new();
        };
        let entry_us = native
            .figures
            .iter()
            .find(|f| f.op == "getpid" && f.unit == "us" && f.error.is_none() && f.value > 0.0)
            .map_or(ENTRY_US, |f| f.value);
        let mut out = Vec::new();
        for r in self
            .results
            .iter()
            .filter(|r| r.config != "native" && r.error.is_none())
        {
            for g in r.figures.iter().filter(|g| g.error.is_none()) {
                let Some(b) = native.figures.iter().find(|b| b.op == g.op && b.error.is_none()) else {
                    continue;
                };
                if relative(g.value, b.value, g.lower_is_better) <= FASTER {
                    continue;
                }
                let why = if let Some(reason) = in_process_reason(&r.config, g, b, entry_us) {
                    // Only runs that do not overlap native's show the
                    // difference; overlapping ones may be noise whatever
                    // the shim saves.
                    if ranges_overlap(g, b) {
                        format!("{reason}, but the runs' ranges overlap native's, so this run does not show it beyond this machine's noise")
                    } else {
                        format!("{reason} (every run beat every run of native's)")
                    }
                } else if g.op.contains("write") && g.lower_is_better && writes_back(&r.config) {
                    "the write-back cache: a write only lands in FUSE's page cache, while ext4's own buffered write also reserves blocks for delayed allocation and updates the inode; the data reaches ext4 later, after the timed call (fsync and end_fsync include it)".to_string()
                } else if ranges_overlap(g, b) {
                    "the runs' ranges overlap: within this machine's noise".to_string()
                } else {
                    "not explained: treat it as a measuring error".to_string()
                };
                out.push(format!(
                    "`{}` {}: {} {} against native's {}: {why}",
                    r.config,
                    g.op,
                    fmt_value(g.value),
                    g.unit,
                    fmt_value(b.value)
                ));
            }
        }
        out
    }

    /// Each configuration's speed relative to native over the rows both
    /// measured (geometric mean of native's time over its time, so 1.0 is as
    /// fast as native and 0.5 half as fast), fastest first.
    pub fn speed_to_native(&self) -> Vec<(String, f64)> {
        let Some(native) = self.results.iter().find(|r| r.config == "native" && r.error.is_none()) else {
            return Vec::new();
        };
        let mut out: Vec<(String, f64)> = self
            .results
            .iter()
            .filter(|r| r.config != "native" && r.error.is_none())
            .filter_map(|r| {
                let logs: Vec<f64> = r
                    .figures
                    .iter()
                    .filter_map(|g| {
                        let b = native.figures.iter().find(|b| b.op == g.op)?;
                        let x = 1.0 + relative(g.value, b.value, g.lower_is_better);
                        (x.is_finite() && x > 0.0).then(|| x.ln())
                    })
                    .collect();
                (!logs.is_empty()).then(|| (r.config.clone(), (logs.iter().sum::<f64>() / logs.len() as f64).exp()))
            })
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        out
    }

    /// Every operation some configuration measured, in order of first
    /// appearance (configurations may measure different rows: `null` only
    /// the empty operations).
    fn ops(&self) -> Vec<&Figure> {
        let mut ops: Vec<&Figure> = Vec::new();
        for r in self.results.iter().filter(|r| r.error.is_none()) {
            for f in &r.figures {
                if !ops.iter().any(|g| g.op == f.op) {
                    ops.push(f);
                }
            }
        }
        ops
    }

    fn value(&self, config: &str, op: &str) -> Option<&Figure> {
        self.results
            .iter()
            .find(|r| r.config == config && r.error.is_none())?
            .figures
            .iter()
            .find(|f| f.op == op)
    }

    /// The speed-up of `config` over `baseline` for one row, if both have it.
    pub fn speedup(&self, config: &str, baseline: &str, op: &str) -> Option<f64> {
        let (a, b) = (self.value(config, op)?, self.value(baseline, op)?);
        let rel = relative(a.value, b.value, a.lower_is_better);
        rel.is_finite().then_some(1.0 + rel)
    }

    fn comparison_table(&self) -> String {
        let mut s = String::from("\n| op |");
        for c in &self.comparisons {
            s.push_str(&format!(" {} |", c.title));
        }
        s.push_str("\n|---|");
        for _ in &self.comparisons {
            s.push_str("---|");
        }
        s.push('\n');
        for f in self.ops() {
            s.push_str(&format!("| {} |", f.op));
            for c in &self.comparisons {
                let cell = c
                    .pairs
                    .iter()
                    .find_map(|(a, b)| Some((self.speedup(a, b, &f.op)?, a, b)))
                    .map(|(x, a, b)| {
                        let name = if c.pairs.len() > 1 {
                            format!(" {a}/{b}")
                        } else {
                            String::new()
                        };
                        format!("{x:.2}x{name} ({})", class(x - 1.0))
                    })
                    .unwrap_or_else(|| "n/a".into());
                s.push_str(&format!(" {cell} |"));
            }
            s.push('\n');
        }
        s.push_str("\nSpeed-up of the first configuration over the second (above 1 is faster: for latencies the second's latency over the first's, for throughputs the first's over the second's), with the class as above.\n");
        s
    }
}

impl Report {
    pub fn markdown(&self) -> String {
        let e = &self.environment;
        let mut s = String::from("# shortfuse bench\n\n");
        s.push_str(&self.summary());
        s.push_str(&self.legend());
        s.push_str(&format!(
            "Run on kernel {}, {} x {}, commit {}. This machine is shared: compare figures within one run, not across runs.\n\n",
            e.kernel, e.cpus, e.cpu, e.commit
        ));
        for suite in &self.suites {
            s.push_str(&suite.markdown());
            s.push('\n');
        }
        if !self.plots.is_empty() {
            s.push_str("## Plots\n\n");
            for p in &self.plots {
                s.push_str(&format!("- [{p}]({p})\n"));
            }
        }
        if let Some(e) = &self.plot_error {
            s.push_str(&format!("\nNo plots: {e}\n"));
        }
        s
    }

    /// Configurations that did not complete a suite, as "suite on config:
    /// why" (the run's exit status says so too).
    pub fn incomplete(&self) -> Vec<String> {
        self.suites
            .iter()
            .flat_map(|s| {
                s.results
                    .iter()
                    .flat_map(move |r| match (&r.error, r.figures.is_empty()) {
                        (Some(e), _) => vec![format!("{} on {}: {e}", s.suite, r.config)],
                        (None, true) => vec![format!("{} on {}: no figures", s.suite, r.config)],
                        (None, false) => r
                            .figures
                            .iter()
                            .filter_map(|g| {
                                Some(format!("{} on {}: {}: {}", s.suite, r.config, g.op, g.error.as_ref()?))
                            })
                            .collect(),
                    })
            })
            .collect()
    }

    /// The opening: what was measured and what it shows, in plain words.
    fn summary(&self) -> String {
        let names: Vec<&str> = self.suites.iter().map(|s| s.suite.as_str()).collect();
        let mut configs: Vec<&str> = Vec::new();
        for r in self.suites.iter().flat_map(|s| &s.results) {
            if !configs.contains(&r.config.as_str()) {
                configs.push(&r.config);
            }
        }
        let runs: Vec<String> = self.suites.iter().map(|s| s.repeats.to_string()).collect();
        let mut runs_said = runs.clone();
        runs_said.dedup();
        let mut s = format!(
            "What was measured: the {} suite(s) on {} configurations (see the legend below), every configuration over a fresh directory or mount of the same ext4 file system; every figure is the median of {} runs, with the smallest and largest run beside it, and each ratio is to native ext4 in the same run.\n\n",
            names.join(" and "),
            configs.len(),
            runs_said.join(" or ")
        );
        s.push_str("What it shows:\n\n");
        for suite in &self.suites {
            let speeds = suite.speed_to_native();
            if speeds.is_empty() {
                continue;
            }
            let list: Vec<String> = speeds.iter().map(|(c, x)| format!("{c} {x:.2}x")).collect();
            s.push_str(&format!(
                "- {}: speed relative to native (geometric mean over its rows; 1.00x is native's speed, 0.50x half of it), fastest first: {}.",
                suite.suite,
                list.join(", ")
            ));
            let faster = suite.faster_than_native().len();
            if faster > 0 {
                s.push_str(&format!(
                    " {faster} figure(s) beat native by more than 5%; each is flagged under the table with why."
                ));
            }
            s.push('\n');
        }
        let incomplete = self.incomplete();
        if incomplete.is_empty() {
            s.push_str("- Every configuration completed every suite.\n");
        } else {
            s.push_str(&format!(
                "- {} suite run(s) did not complete (the run exits with a failure): {}.\n",
                incomplete.len(),
                incomplete.join("; ")
            ));
        }
        s.push('\n');
        s
    }

    /// Every configuration of the run with what it is.
    fn legend(&self) -> String {
        let all = crate::Config::all();
        let mut s = String::from("| configuration | what it is |\n|---|---|\n");
        let mut seen: Vec<&str> = Vec::new();
        for r in self.suites.iter().flat_map(|s| &s.results) {
            if seen.contains(&r.config.as_str()) {
                continue;
            }
            seen.push(&r.config);
            let what = all
                .iter()
                .find(|c| c.name == r.config)
                .map(crate::Config::describe)
                .unwrap_or_else(|| "a configuration given by the caller".into());
            s.push_str(&format!("| {} | {what} |\n", r.config));
        }
        s.push('\n');
        s
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_seed_001() {
        assert_eq!(class(0.10), "green");
        assert_eq!(class(-0.04), "green");
        assert_eq!(class(-0.10), "yellow");
        assert_eq!(class(-0.30), "orange");
        assert_eq!(class(-0.60), "red");
    }

    #[test]
    fn several_runs_give_the_median_and_the_range() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        let f = Figure::median_of("rnd lease", "MB/s", vec![12.0, 3.0, 10.0]);
        assert_eq!((f.value, f.samples, f.range()), (10.0, 3, Some((3.0, 12.0))));
        assert_eq!(Figure::median_of("one", "x", vec![2.0]).range(), None);
        let suite = SuiteResult {
            suite: "dist".into(),
            scale: String::new(),
            repeats: 1,
            comparisons: Vec::new(),
            results: vec![ConfigResult {
                config: "native".into(),
                error: None,
                figures: vec![f],
            }],
        };
        let md = suite.markdown();
        assert!(md.contains("| rnd lease | MB/s | 10.0 [3.00-12.0] |"), "{md}");
        assert!(md.contains("the median of 1 run(s) [smallest-largest]"), "{md}");
    }

    #[test]
    fn a_row_that_failed_says_why_and_fails_the_run() {
        let time = |op: &str, v: f64| Figure {
            op: op.into(),
            unit: "ms".into(),
            value: v,
            lower_is_better: true,
            ..Figure::default()
        };
        let failed = Figure {
            error: Some("rsync: command not found".into()),
            ..time("rsync-a", f64::NAN)
        };
        // One failed run of three fails the row, with the run named.
        let merged = merge_runs(vec![
            vec![time("tar-xf", 3.0), time("rsync-a", 5.0)],
            vec![time("tar-xf", 4.0), failed.clone()],
            vec![time("tar-xf", 5.0), time("rsync-a", 6.0)],
        ])
        .unwrap();
        assert_eq!((merged[0].value, merged[0].error.as_deref()), (4.0, None));
        assert!(merged[1].value.is_nan());
        assert_eq!(merged[1].error.as_deref(), Some("run 2: rsync: command not found"));
        let report = Report {
            environment: Environment::probe(),
            suites: vec![SuiteResult {
                suite: "programs".into(),
                scale: String::new(),
                repeats: 3,
                comparisons: vec![],
                results: vec![
                    result("native", vec![time("tar-xf", 2.0), time("rsync-a", 4.0)]),
                    result("ring", merged),
                ],
            }],
            plots: vec![],
            plot_error: None,
        };
        let md = report.markdown();
        assert!(md.contains("| rsync-a | ms | 4.00 | failed (why: below) |"), "{md}");
        assert!(
            md.contains("- `ring` rsync-a failed: run 2: rsync: command not found"),
            "{md}"
        );
        assert!(
            md.contains("| tar-xf | ms | 2.00 | 4.00 [3.00-5.00] (2.00x, orange) |"),
            "{md}"
        );
        assert_eq!(
            report.incomplete(),
            ["programs on ring: rsync-a: run 2: rsync: command not found"]
        );
        assert!(report.suites[0].faster_than_native().is_empty());
    }

    #[test]
    fn latency_ratio_counts_as_throughput() {
        // Twice the latency is half the throughput: -50%.
        assert!((relative(2.0, 1.0, true) + 0.5).abs() < 1e-9);
        assert!((relative(2.0, 1.0, false) - 1.0).abs() < 1e-9);
        assert!(relative(0.0, 1.0, true).is_nan());
    }

    #[test]
    fn markdown_lists_failures_and_ratios() {
        let fig = |v| Figure {
            op: "stat".into(),
            unit: "us".into(),
            value: v,
            p50: None,
            p99: None,
            samples: 1,
            lower_is_better: true,
            ..Figure::default()
        };
        let suite = SuiteResult {
            suite: "latency".into(),
            scale: "tiny".into(),
            repeats: 1,
            comparisons: vec![],
            results: vec![
                ConfigResult {
                    config: "native".into(),
                    error: None,
                    figures: vec![fig(1.0)],
                },
                ConfigResult {
                    config: "dev".into(),
                    error: None,
                    figures: vec![fig(4.0)],
                },
                ConfigResult {
                    config: "x".into(),
                    error: Some("no bindfs".into()),
                    figures: vec![],
                },
            ],
        };
        let md = suite.markdown();
        assert!(md.contains("4.00 (4.00x, red)"), "{md}");
        assert!(md.contains("`x` did not run: no bindfs"), "{md}");
    }

    fn result(config: &str, figures: Vec<Figure>) -> ConfigResult {
        ConfigResult {
            config: config.into(),
            error: None,
            figures,
        }
    }

    #[test]
    fn comparisons_pair_transports_and_maps() {
        let lat = |op: &str, v| Figure {
            op: op.into(),
            unit: "us".into(),
            value: v,
            lower_is_better: true,
            ..Figure::default()
        };
        let rate = |op: &str, v| Figure::rate(op, "MB/s", v, 1);
        let results = vec![
            result("native", vec![rate("rd", 100.0)]),
            result("dev", vec![rate("rd", 40.0)]),
            result("uring", vec![rate("rd", 50.0)]),
            result("null-dev", vec![lat("create", 30.0)]),
            result("null-uring", vec![lat("create", 15.0)]),
        ];
        let cmp = comparisons(&results);
        assert_eq!(cmp.len(), 1, "{cmp:?}");
        assert_eq!(cmp[0].pairs.len(), 2);
        let suite = SuiteResult {
            suite: "transport".into(),
            scale: String::new(),
            repeats: 1,
            comparisons: cmp,
            results,
        };
        assert_eq!(suite.speedup("null-uring", "null-dev", "create"), Some(2.0));
        assert_eq!(suite.speedup("uring", "dev", "rd"), Some(1.25));
        assert_eq!(suite.speedup("uring", "dev", "create"), None);
        let md = suite.markdown();
        // Rows only null measured are in the main table too.
        assert!(md.contains("| create | us | n/a | n/a | n/a | 30.0 | 15.0 |"), "{md}");
        assert!(md.contains("| create | 2.00x null-uring/null-dev (green) |"), "{md}");
        assert!(md.contains("| rd | 1.25x uring/dev (green) |"), "{md}");

        let data = vec![
            result("native", vec![rate("rd", 100.0)]),
            result("dev", vec![rate("rd", 25.0)]),
            result("dev-passthrough", vec![rate("rd", 97.0)]),
            result("uring-passthrough", vec![rate("rd", 98.0)]),
        ];
        let titles: Vec<_> = comparisons(&data).into_iter().map(|c| c.title).collect();
        assert_eq!(
            titles,
            [
                "dev-passthrough vs dev (readers passed through vs the defaults)",
                "uring-passthrough vs dev (no maps)",
                "uring-passthrough vs dev-passthrough"
            ]
        );
        let suite = SuiteResult {
            suite: "data".into(),
            scale: String::new(),
            repeats: 1,
            comparisons: comparisons(&data),
            results: data,
        };
        let md = suite.markdown();
        assert!(
            md.contains("| rd | MB/s | 100 | 25.0 (0.25x, red) | 97.0 (0.97x, green) |"),
            "{md}"
        );
        assert!(
            md.contains("| rd | 3.88x (green) | 3.92x (green) | 1.01x (green) |"),
            "{md}"
        );
    }

    #[test]
    fn runs_merge_to_medians_and_a_missing_figure_fails() {
        let lat = |op: &str, v| Figure {
            op: op.into(),
            unit: "us".into(),
            value: v,
            p50: Some(v),
            p99: Some(2.0 * v),
            samples: 10,
            lower_is_better: true,
            ..Figure::default()
        };
        let merged = merge_runs(vec![
            vec![lat("stat", 3.0), lat("create", 9.0)],
            vec![lat("stat", 1.0), lat("create", 30.0)],
            vec![lat("create", 10.0), lat("stat", 2.0)],
        ])
        .unwrap();
        assert_eq!(merged.len(), 2);
        assert_eq!((merged[0].op.as_str(), merged[0].value), ("stat", 2.0));
        assert_eq!(merged[0].runs, [3.0, 1.0, 2.0]);
        assert_eq!((merged[0].p99, merged[0].samples), (Some(4.0), 30));
        assert_eq!((merged[1].value, merged[1].range()), (10.0, Some((9.0, 30.0))));
        let err = merge_runs(vec![vec![lat("stat", 1.0), lat("create", 2.0)], vec![lat("stat", 1.0)]]).unwrap_err();
        assert!(err.contains("run 2 has no figure for create"), "{err}");
        assert!(merge_runs(vec![]).is_err());
    }

    #[test]
    fn the_report_opens_with_a_summary_and_a_legend_and_flags_faster_than_native() {
        let rate = |v: f64, runs: Vec<f64>| Figure {
            runs,
            ..Figure::rate("seq-read", "GB/s", v, 1)
        };
        let results = vec![
            result("native", vec![rate(8.0, vec![7.5, 8.0, 8.5])]),
            result("dev-passthrough", vec![rate(20.0, vec![19.0, 20.0, 25.0])]),
            result("dev", vec![rate(4.0, vec![3.0, 4.0, 5.0])]),
            ConfigResult {
                config: "preload".into(),
                error: Some("libshortfuse_preload.so is missing".into()),
                figures: vec![],
            },
        ];
        let report = Report {
            environment: Environment::probe(),
            suites: vec![SuiteResult {
                suite: "latency".into(),
                scale: String::new(),
                repeats: 3,
                comparisons: vec![],
                results,
            }],
            plots: vec![],
            plot_error: None,
        };
        let md = report.markdown();
        let head = &md[..md.find("### latency").unwrap()];
        assert!(head.contains("What was measured"), "{head}");
        assert!(head.contains("median of 3 runs"), "{head}");
        assert!(head.contains("dev-passthrough 2.50x, dev 0.50x"), "{head}");
        assert!(
            head.contains("| dev | `shortfuse mount passthrough` FUSE over /dev/fuse, its defaults |"),
            "{head}"
        );
        assert!(head.contains("| native | ext4 itself"), "{head}");
        assert!(head.contains("1 suite run(s) did not complete"), "{head}");
        assert!(
            md.contains("20.0 [19.0-25.0] (2.50x, green) **faster than native**"),
            "{md}"
        );
        assert!(
            md.contains("`dev-passthrough` seq-read: 20.0 GB/s against native's 8.00: not explained"),
            "{md}"
        );
        assert_eq!(report.incomplete().len(), 1);

        // A configuration served in the calling process may beat native,
        // but only runs clear of native's show it.
        let fig = |op: &str, unit: &str, v: f64, runs: Vec<f64>| Figure {
            op: op.into(),
            unit: unit.into(),
            value: v,
            lower_is_better: true,
            runs,
            ..Figure::default()
        };
        let latency = |results: Vec<ConfigResult>| SuiteResult {
            suite: "latency".into(),
            scale: String::new(),
            repeats: 3,
            comparisons: vec![],
            results,
        };
        let lat = |v: f64, runs: Vec<f64>| fig("stat", "us", v, runs);
        let suite = latency(vec![
            result("native", vec![lat(1.0, vec![0.5, 1.0, 1.5])]),
            result("preload", vec![lat(0.8, vec![0.7, 0.8, 0.9])]),
            result("ring", vec![lat(0.3, vec![0.2, 0.3, 0.4])]),
        ]);
        let faster = suite.faster_than_native();
        assert!(
            faster[0].starts_with("`preload` stat") && faster[0].contains("ranges overlap native's"),
            "{faster:?}"
        );
        assert!(
            faster[1].starts_with("`ring` stat") && faster[1].contains("every run beat every run of native's"),
            "{faster:?}"
        );
        assert!(faster.iter().all(|f| !f.contains("a real difference")), "{faster:?}");

        // Skipping a kernel entry explains a gain of a call or two, measured
        // by native's getpid in the same run, and nothing larger: not a
        // create that ext4 makes take 20 or 800 µs, not a whole program.
        let suite = latency(vec![
            result(
                "native",
                vec![
                    fig("getpid", "us", 0.14, vec![0.14, 0.14, 0.14]),
                    fig("stat-missing", "us", 0.88, vec![0.87, 0.88, 0.89]),
                    fig("stat", "us", 1.0, vec![0.99, 1.0, 1.01]),
                    fig("create", "us", 807.0, vec![19.0, 807.0, 814.0]),
                    fig("git-add+commit", "ms", 1100.0, vec![1093.0, 1109.0]),
                ],
            ),
            result(
                "preload",
                vec![
                    fig("getpid", "us", 0.19, vec![0.19, 0.19, 0.19]),
                    fig("stat-missing", "us", 0.83, vec![0.83, 0.83, 0.83]),
                    fig("stat", "us", 0.5, vec![0.49, 0.5, 0.51]),
                    fig("create", "us", 577.0, vec![20.0, 577.0, 811.0]),
                    fig("git-add+commit", "ms", 697.0, vec![358.0, 1036.0]),
                ],
            ),
        ]);
        let faster = suite.faster_than_native();
        let about = |op: &str| {
            faster
                .iter()
                .find(|f| f.starts_with(&format!("`preload` {op}:")))
                .unwrap()
        };
        assert!(about("stat-missing").contains("calling process"), "{faster:?}");
        assert!(about("stat").contains("not explained"), "{faster:?}");
        assert!(about("create").contains("within this machine's noise"), "{faster:?}");
        assert!(about("git-add+commit").contains("not explained"), "{faster:?}");
        assert!(
            faster.iter().filter(|f| f.contains("calling process")).count() == 1,
            "{faster:?}"
        );

        // A write-back cache answers writes before ext4 sees them: said so.
        let write = |v: f64| Figure {
            op: "4KiB-write".into(),
            unit: "us".into(),
            value: v,
            lower_is_better: true,
            ..Figure::default()
        };
        let suite = SuiteResult {
            suite: "latency".into(),
            scale: String::new(),
            repeats: 1,
            comparisons: vec![],
            results: vec![
                result("native", vec![write(3.0)]),
                result("dev-opt", vec![write(2.0)]),
                result("dev", vec![write(2.0)]),
            ],
        };
        let faster = suite.faster_than_native();
        assert!(
            faster[0].starts_with("`dev-opt` 4KiB-write") && faster[0].contains("write-back cache"),
            "{faster:?}"
        );
        assert!(
            faster[1].starts_with("`dev` 4KiB-write") && faster[1].contains("not explained"),
            "{faster:?}"
        );
    }
}
