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
    /// What was scaled from the papers' definitions, in words.
    pub scale: String,
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
/// against the same file system without maps, plain `dev`, and
/// shortfuse's SFTP client (in the daemon, and in process with the
/// user-space cache) against the kernel-FUSE sshfs on the same kind of
/// loopback server (the comparison of the Prefuse-SSHFS caching thesis).
pub fn comparisons(results: &[ConfigResult]) -> Vec<Comparison> {
    let has = |c: &str| results.iter().any(|r| r.config == c);
    let candidates: [(&str, &[(&str, &str)]); 6] = [
        ("uring vs dev", &[("null-uring", "null-dev"), ("uring", "dev")]),
        ("dev-passthrough vs dev (no maps)", &[("dev-passthrough", "dev")]),
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

/// The classes of To FUSE or Not to FUSE (FAST '17) of the relative difference to native (positive is
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
                    Some(g) => match base {
                        Some(b) if r.config != "native" => {
                            let ratio = g.value / b.value;
                            let rel = relative(g.value, b.value, g.lower_is_better);
                            format!("{} ({:.2}x, {})", fmt_value(g.value), ratio, class(rel))
                        }
                        _ => match g.range() {
                            Some((lo, hi)) => format!("{} [{}-{}]", fmt_value(g.value), fmt_value(lo), fmt_value(hi)),
                            None => fmt_value(g.value),
                        },
                    },
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
        s.push_str("\n\nCells: value (ratio to native; class of the relative difference as in To FUSE or Not to FUSE (FAST '17): green better than -5%, yellow -5..-25%, orange -25..-50%, red worse).");
        if self
            .results
            .iter()
            .flat_map(|r| &r.figures)
            .any(|f| f.range().is_some())
        {
            s.push_str(
                " A value with [min-max] is the median of several runs, with the range (every run in the JSON).",
            );
        }
        s.push('\n');
        if !self.comparisons.is_empty() {
            s.push_str(&self.comparison_table());
        }
        s
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
        let mut s = format!(
            "# shortfuse bench\n\nkernel {}, {} x {}, commit {}\n\n",
            e.kernel, e.cpus, e.cpu, e.commit
        );
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
            comparisons: Vec::new(),
            results: vec![ConfigResult {
                config: "native".into(),
                error: None,
                figures: vec![f],
            }],
        };
        let md = suite.markdown();
        assert!(md.contains("| rnd lease | MB/s | 10.0 [3.00-12.0] |"), "{md}");
        assert!(md.contains("median of several runs"), "{md}");
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
                "dev-passthrough vs dev (no maps)",
                "uring-passthrough vs dev (no maps)",
                "uring-passthrough vs dev-passthrough"
            ]
        );
        let suite = SuiteResult {
            suite: "data".into(),
            scale: String::new(),
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
}
