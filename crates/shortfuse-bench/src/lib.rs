//! `shortfuse bench`: the seeds' workloads run against native ext4, every
//! shortfuse transport and the peer FUSE file systems, in one run, reported
//! as ratios to native.

pub mod cleanup;
pub mod config;
pub mod latency;
pub mod report;
mod sys;

use std::io::Write;
use std::path::PathBuf;

pub use config::{Config, Env, Kind};
pub use report::{ConfigResult, Figure, Report, SuiteResult};

/// Suites this build runs.
pub const SUITES: &[&str] = &["latency"];

/// What `shortfuse bench` was asked.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub suites: Vec<String>,
    pub configs: Vec<Config>,
    pub quick: bool,
    /// Seconds-long runs for the test suite.
    pub tiny: bool,
    pub out: PathBuf,
    pub shortfuse_bin: PathBuf,
}

/// Runs every asked suite on every asked configuration. A configuration
/// that cannot run is reported with its reason; it does not stop the run.
pub fn run(opts: &BenchOptions) -> Result<Report, String> {
    for s in &opts.suites {
        if !SUITES.contains(&s.as_str()) {
            return Err(format!("unknown suite {s:?}; this build has: {}", SUITES.join(", ")));
        }
    }
    cleanup::install();
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let env = Env {
        shortfuse_bin: opts.shortfuse_bin.clone(),
        work: opts.out.join("work"),
    };
    let mut suites = Vec::new();
    for suite in &opts.suites {
        let (scale, words) = if opts.tiny {
            (latency::Scale::tiny(), "tiny")
        } else if opts.quick {
            (latency::Scale::quick(), "quick")
        } else {
            (latency::Scale::full(), "full")
        };
        let mut results = Vec::new();
        for (i, config) in opts.configs.iter().enumerate() {
            let label = format!("[{}/{}] {suite} on {}", i + 1, opts.configs.len(), config.name);
            let mut progress = |step: &str| {
                eprint!("\r\x1b[2K{label}: {step}");
                let _ = std::io::stderr().flush();
            };
            progress("preparing");
            let outcome = config
                .prepare(&env)
                .and_then(|p| latency::run(&p.dir, scale, &mut progress).map_err(|e| format!("workload failed: {e}")));
            eprintln!("\r\x1b[2K{label}: {}", if outcome.is_ok() { "done" } else { "failed" });
            results.push(match outcome {
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
            });
        }
        suites.push(SuiteResult {
            suite: suite.clone(),
            scale: format!(
                "Scale {words}: {} metadata operations, {} data operations per row, {} MiB sequential read (mean latency in µs; p50/p99 in the JSON).",
                scale.meta_ops, scale.data_ops, scale.seq_mib
            ),
            results,
        });
    }
    let _ = std::fs::remove_dir_all(&env.work);
    let report = Report {
        environment: report::Environment::probe(),
        suites,
    };
    std::fs::write(opts.out.join("report.md"), report.markdown()).map_err(|e| e.to_string())?;
    std::fs::write(opts.out.join("report.json"), report.json()).map_err(|e| e.to_string())?;
    Ok(report)
}
