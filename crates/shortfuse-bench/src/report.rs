//! Results: raw figures per configuration, the Markdown table with ratios to
//! native and seed 001's four classes, and JSON with every raw figure and
//! the environment.

use serde::Serialize;

/// One measured figure.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figure {
    pub op: String,
    pub unit: String,
    /// Mean latency, or throughput.
    pub value: f64,
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
    /// What was scaled from the seeds' definitions, in words.
    pub scale: String,
    pub results: Vec<ConfigResult>,
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

/// Seed 001's classes of the relative difference to native (positive is
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
        let ops: Vec<&Figure> = self
            .results
            .iter()
            .find(|r| r.error.is_none())
            .map(|r| r.figures.iter().collect())
            .unwrap_or_default();
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
                        _ => fmt_value(g.value),
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
        s.push_str("\n\nCells: value (ratio to native; class of the relative difference as in seed 001: green better than -5%, yellow -5..-25%, orange -25..-50%, red worse).\n");
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
}
