//! The runner at a tiny scale on real mounts: every suite produces a
//! well-formed report (Markdown row per figure, JSON with every figure, PNG
//! plots), and no mount is left behind when a workload fails.

mod support;

use std::path::Path;
use support::{mounts_under, shortfuse_bin};

use shortfuse_bench::{config, BenchOptions, Config, Kind, SUITES};

fn options(name: &str, suites: &[&str], configs: Option<Vec<Config>>) -> BenchOptions {
    let out = std::env::temp_dir().join(format!("sfbench-{name}-{}", std::process::id()));
    let mut o = BenchOptions::new(out);
    o.suites = suites.iter().map(|s| s.to_string()).collect();
    o.configs = configs;
    o.tiny = true;
    o.shortfuse_bin = shortfuse_bin();
    o
}

fn check_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.len() > 1000, "{} is only {} bytes", path.display(), bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
}

/// Runs `suites` on `configs` (each suite's defaults when `None`), checks
/// everything the report must hold, and returns it with its Markdown.
fn well_formed_on(
    name: &str,
    suites: &[&str],
    configs: Option<Vec<Config>>,
    expected_plots: &[&str],
) -> (shortfuse_bench::Report, String) {
    let opts = options(name, suites, configs.clone());
    let report = shortfuse_bench::run(&opts).expect("run");
    assert_eq!(report.suites.len(), suites.len());
    let md = std::fs::read_to_string(opts.out.join("report.md")).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(opts.out.join("report.json")).unwrap()).unwrap();
    assert!(json["environment"]["kernel"].as_str().is_some_and(|k| !k.is_empty()));
    for (si, suite) in report.suites.iter().enumerate() {
        let want = configs.clone().unwrap_or_else(|| Config::defaults(&suite.suite)).len();
        assert_eq!(suite.results.len(), want);
        assert!(md.contains(&format!("### {}", suite.suite)), "{md}");
        for (ri, r) in suite.results.iter().enumerate() {
            assert!(
                r.error.is_none(),
                "{} on {} failed: {:?}",
                suite.suite,
                r.config,
                r.error
            );
            assert!(!r.figures.is_empty(), "{} on {}: no figures", suite.suite, r.config);
            let jfigs = json["suites"][si]["results"][ri]["figures"].as_array().unwrap();
            assert_eq!(jfigs.len(), r.figures.len());
            for (f, j) in r.figures.iter().zip(jfigs) {
                assert!(
                    f.value.is_finite() && f.value > 0.0,
                    "{} {}: {f:?}",
                    suite.suite,
                    r.config
                );
                assert!(
                    md.contains(&format!("| {} | {} |", f.op, f.unit)),
                    "no row for {}: {md}",
                    f.op
                );
                assert_eq!(j["op"], f.op.as_str());
                let jv = j["value"].as_f64().unwrap();
                assert!(
                    (jv - f.value).abs() <= 1e-9 * f.value,
                    "{} JSON {jv} != {}",
                    f.op,
                    f.value
                );
            }
        }
        // The columns after native carry ratios and classes (a suite on
        // native alone, like cache, has none).
        if suite.results.len() > 1 {
            assert!(suite.markdown().contains("x, "), "{}", suite.markdown());
        }
    }
    assert!(report.plot_error.is_none(), "{:?}", report.plot_error);
    for p in expected_plots {
        assert!(report.plots.iter().any(|q| q == p), "{p} not in {:?}", report.plots);
    }
    for p in &report.plots {
        check_png(&opts.out.join(p));
        assert!(md.contains(p.as_str()));
    }
    assert!(mounts_under(&opts.out).is_empty());
    std::fs::remove_dir_all(&opts.out).unwrap();
    (report, md)
}

/// Runs `suites` on native and bindfs.
fn well_formed(name: &str, suites: &[&str], expected_plots: &[&str]) {
    let configs = Config::select(&["native".into(), "bindfs".into()]).unwrap();
    well_formed_on(name, suites, Some(configs), expected_plots);
}

/// The ops of `config` in `suite`, in order.
fn ops_of(suite: &shortfuse_bench::SuiteResult, config: &str) -> Vec<String> {
    let r = suite.results.iter().find(|r| r.config == config).unwrap();
    r.figures.iter().map(|f| f.op.clone()).collect()
}

/// The comparison cell of `op` in the column `title`, from the Markdown
/// table after the main one.
fn comparison_cell(suite: &shortfuse_bench::SuiteResult, title: &str, op: &str) -> String {
    let col = suite
        .comparisons
        .iter()
        .position(|c| c.title == title)
        .unwrap_or_else(|| {
            panic!("no comparison {title:?} in {:?}", suite.comparisons);
        });
    let md = suite.markdown();
    let line = md
        .lines()
        .filter(|l| l.starts_with(&format!("| {op} |")))
        .find(|l| !l.contains(" | us |") && !l.contains(" | MB/s |") && !l.contains(" | ops/s |"))
        .unwrap_or_else(|| panic!("no comparison row for {op}: {md}"));
    line.split(" | ")
        .nth(col + 1)
        .unwrap_or_default()
        .trim_end_matches(" |")
        .to_string()
}

#[test]
fn tiny_latency_fio_meta_sshfs_read() {
    well_formed(
        "a",
        &["latency", "fio", "meta", "sshfs-read"],
        &[
            "plots/latency-latency.png",
            "plots/fio-seq-read.png",
            "plots/fio-rand-write.png",
            "plots/fio-latency.png",
            "plots/sshfs-read-latency.png",
        ],
    );
}

#[test]
fn tiny_workloads_personalities_data() {
    well_formed(
        "b",
        &["workloads", "personalities", "data"],
        &["plots/personalities-latency.png", "plots/data-fileserver.png"],
    );
}

#[test]
fn tiny_cache_is_table_4_beside_moka() {
    let (report, _) = well_formed_on("c", &["cache"], None, &["plots/cache-latency.png"]);
    let ops = ops_of(&report.suites[0], "native");
    for kind in ["cache", "metacache"] {
        for op in ["write", "overwrite", "read", "read_miss"] {
            for who in ["shortfuse/clock", "shortfuse/lru", "moka/lru", "x over moka"] {
                let row = format!("{kind}_{op} {who}");
                assert!(ops.contains(&row), "no row {row}: {ops:?}");
            }
        }
    }
    assert!(ops.iter().any(|o| o == "policy_hits clock") && ops.iter().any(|o| o == "policy_hits lru"));
}

#[test]
fn tiny_programs_on_its_defaults() {
    // Every program on native, the shim in process and over the rings,
    // dev and uring: each row on each, with the range of its runs.
    let (report, md) = well_formed_on("p", &["programs"], None, &["plots/programs-ratio.png"]);
    let suite = &report.suites[0];
    let configs: Vec<&str> = suite.results.iter().map(|r| r.config.as_str()).collect();
    assert_eq!(configs, ["native", "preload", "ring", "dev", "uring"]);
    for r in &suite.results {
        assert_eq!(
            ops_of(suite, &r.config),
            shortfuse_bench::programs::ROWS,
            "{}",
            r.config
        );
        for f in &r.figures {
            assert!(f.error.is_none(), "{} {}: {:?}", r.config, f.op, f.error);
            assert_eq!(f.runs.len(), suite.repeats, "{} {}", r.config, f.op);
        }
    }
    // Each cell is the median with the smallest and largest run.
    for op in shortfuse_bench::programs::ROWS {
        let line = md
            .lines()
            .find(|l| l.starts_with(&format!("| {op} |")))
            .unwrap_or_else(|| panic!("no row {op}: {md}"));
        assert_eq!(line.matches(" [").count(), configs.len(), "{line}");
    }
}

/// The transport suite's threaded series, in the order it runs them.
const TRANSPORT_SERIES: [&str; 5] = [
    "rand-read-4K",
    "rand-read-4K-cached",
    "rand-read-4K-direct",
    "create",
    "create-own-dir",
];

#[test]
fn tiny_transport_on_its_defaults() {
    let (report, md) = well_formed_on(
        "t",
        &["transport"],
        None,
        &[
            "plots/transport-latency.png",
            "plots/transport-rand-read-4K.png",
            "plots/transport-rand-read-4K-cached.png",
            "plots/transport-rand-read-4K-direct.png",
            "plots/transport-create.png",
            "plots/transport-create-own-dir.png",
        ],
    );
    let suite = &report.suites[0];
    let empty = ["empty-create", "empty-stat-missing", "empty-open+close-root"];
    // Every threaded row on 1 to 2x this machine's cores.
    let cores = std::thread::available_parallelism().unwrap().get();
    let counts = shortfuse_bench::transport::thread_counts(cores);
    assert!(
        counts.first() == Some(&1) && counts.last() == Some(&(2 * cores)),
        "{counts:?}"
    );
    let mut files: Vec<String> = Vec::new();
    for series in TRANSPORT_SERIES {
        files.extend(counts.iter().map(|t| format!("{series}-{t}th")));
    }
    for c in ["null-dev", "null-uring"] {
        assert_eq!(ops_of(suite, c), empty, "{c}");
        // Latencies are medians, with the mean beside them.
        let r = suite.results.iter().find(|r| r.config == c).unwrap();
        for f in &r.figures {
            assert_eq!(Some(f.value), f.p50, "{c} {}", f.op);
            assert!(f.mean.is_some_and(|m| m > 0.0), "{c} {}", f.op);
        }
    }
    for c in ["native", "preload", "ring", "dev", "uring"] {
        assert_eq!(ops_of(suite, c), files, "{c}");
        // The shim's figures come back from its worker as points of the
        // curves, as the others' do.
        let r = suite.results.iter().find(|r| r.config == c).unwrap();
        for f in &r.figures {
            assert!(f.series.is_some() && f.threads.is_some(), "{c}: {f:?}");
        }
    }
    // Every row has its dev-vs-uring speed-up, from the matching pair.
    for op in empty {
        let cell = comparison_cell(suite, "uring vs dev", op);
        assert!(cell.contains("x null-uring/null-dev ("), "{op}: {cell:?}");
    }
    for op in &files {
        let cell = comparison_cell(suite, "uring vs dev", op);
        assert!(cell.contains("x uring/dev ("), "{op}: {cell:?}");
    }
    assert!(md.contains("null answers CREATE but keeps nothing"), "{md}");
}

#[test]
fn transport_threaded_rows_follow_the_chosen_thread_counts_in_and_out_of_the_shim() {
    // Counts this machine would not pick by itself (3 threads on 2 cores is
    // not 1 to 2x's powers of two; on 3 cores 5 is not), so the rows can
    // only come from the flag, through the worker under `shortfuse run`.
    let names: Vec<String> = ["native", "preload", "ring"].map(String::from).into();
    let mut opts = options("tcounts", &["transport"], Some(Config::select(&names).unwrap()));
    opts.thread_counts = Some(vec![3, 5]);
    let report = shortfuse_bench::run(&opts).expect("run");
    let suite = &report.suites[0];
    let mut want = Vec::new();
    for series in TRANSPORT_SERIES {
        want.extend([3, 5].map(|t| format!("{series}-{t}th")));
    }
    for c in &names {
        let r = suite.results.iter().find(|r| &r.config == c).expect(c);
        assert!(r.error.is_none(), "{c}: {:?}", r.error);
        assert_eq!(ops_of(suite, c), want, "{c}");
        for f in &r.figures {
            assert!(f.value.is_finite() && f.value > 0.0, "{c}: {f:?}");
            assert!(f.threads == Some(3) || f.threads == Some(5), "{c}: {f:?}");
        }
    }
    let md = std::fs::read_to_string(opts.out.join("report.md")).unwrap();
    assert!(md.contains("rows on [3, 5] threads"), "{md}");
    assert!(mounts_under(&opts.out).is_empty());
    std::fs::remove_dir_all(&opts.out).unwrap();
}

#[test]
fn tiny_data_on_its_defaults() {
    let (report, _) = well_formed_on("d", &["data"], None, &["plots/data-fileserver.png"]);
    let suite = &report.suites[0];
    let mut want = vec!["stream-write-1M".to_string(), "stream-read-1M".to_string()];
    for row in [
        "seq-rd-1th-1f",
        "seq-rd-2th-2f",
        "rnd-rd-1th-1f",
        "rnd-rd-2th-1f",
        "seq-wr-1th-1f",
        "seq-wr-2th-2f",
        "rnd-wr-1th-1f",
        "rnd-wr-2th-1f",
    ] {
        want.extend(["4K", "32K", "128K", "1M"].map(|io| format!("{row}-{io}")));
    }
    want.extend([1, 2, 4, 8].map(|t| format!("fileserver-{t}th")));
    for c in ["native", "dev", "dev-passthrough", "uring-passthrough"] {
        assert_eq!(ops_of(suite, c), want, "{c}");
    }
    for op in &want {
        for title in [
            "dev-passthrough vs dev (readers passed through vs the defaults)",
            "uring-passthrough vs dev (no maps)",
        ] {
            let cell = comparison_cell(suite, title, op);
            assert!(cell.ends_with(')') && cell.contains("x ("), "{op} {title}: {cell:?}");
        }
    }
}

#[test]
fn null_runs_only_the_transport_suite() {
    let configs = Config::select(&["null-dev".into()]).unwrap();
    let opts = options("null", &["latency", "transport"], Some(configs));
    let report = shortfuse_bench::run(&opts).expect("run");
    let err = report.suites[0].results[0].error.as_deref().unwrap();
    assert!(err.starts_with("not applicable"), "{err}");
    let t = &report.suites[1].results[0];
    assert!(t.error.is_none(), "{:?}", t.error);
    assert_eq!(t.figures.len(), 3);
    assert!(mounts_under(&opts.out).is_empty());
    std::fs::remove_dir_all(&opts.out).unwrap();
}

#[test]
fn every_suite_is_covered() {
    let tested = [
        "latency",
        "fio",
        "meta",
        "sshfs-read",
        "sftp", // tests/network.rs
        "workloads",
        "personalities",
        "data",
        "transport",
        "dist", // tests/dist.rs
        "programs",
        "cache",
        "rings", // tests/test_ring.py (needs the shortfuse binary's `serve`)
    ];
    for s in SUITES {
        assert!(tested.contains(s), "suite {s} has no tiny-scale test");
    }
}

#[test]
fn former_suite_names_still_run_and_help_shows_the_new_ones() {
    let bench = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shortfuse-bench"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let help = bench(&["--help"]);
    let listed = help.lines().find_map(|l| l.strip_prefix("suites: ")).expect(&help);
    let listed: Vec<_> = listed.split(", ").collect();
    assert_eq!(listed, SUITES, "{help}");
    for old in ["table2", "thesis"] {
        assert!(!help.contains(old), "help names {old}: {help}");
    }
    // A script written for the former name runs the renamed suite.
    let out = std::env::temp_dir().join(format!("sfbench-old-{}", std::process::id()));
    let shortfuse = shortfuse_bin();
    let md = bench(&[
        "thesis",
        "--tiny",
        "--configs",
        "native",
        "--out",
        out.to_str().unwrap(),
        "--shortfuse",
        shortfuse.to_str().unwrap(),
    ]);
    assert!(md.contains("### sshfs-read"), "{md}");
    assert!(md.contains("| 100x1MiB-read |"), "{md}");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn failed_workload_is_reported_and_unmounted() {
    // A read-only bindfs mount makes the first create fail inside each
    // workload, including while fio runs as a child process.
    let ro = Config {
        name: "bindfs-ro".into(),
        kind: Kind::Bindfs {
            args: vec!["-o".into(), "ro".into()],
        },
    };
    let missing = Config {
        name: "no-such-fs".into(),
        kind: Kind::Shortfuse {
            fs: "nonexistent".into(),
            transport: "dev".into(),
            opts: String::new(),
            threads: None,
        },
    };
    let opts = options("fail", &["latency", "fio"], Some(vec![ro, missing]));
    let report = shortfuse_bench::run(&opts).expect("run");
    for suite in &report.suites {
        let results = &suite.results;
        let err = results[0].error.as_deref().expect("read-only run must fail");
        assert!(err.contains("workload failed"), "{err}");
        assert!(results[1].error.is_some());
    }
    let md = std::fs::read_to_string(opts.out.join("report.md")).unwrap();
    assert!(md.contains("`bindfs-ro` did not run"), "{md}");
    assert!(
        mounts_under(&opts.out).is_empty(),
        "left behind: {:?}",
        mounts_under(&opts.out)
    );
    assert!(!config::is_mounted(&opts.out.join("work")));
    std::fs::remove_dir_all(&opts.out).unwrap();
}

fn fio_processes_in(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.starts_with("fio ") && c.contains(&needle))
        .collect()
}

#[test]
fn ctrl_c_during_fio_stops_fio_and_unmounts() {
    let out = std::env::temp_dir().join(format!("sfbench-int-{}", std::process::id()));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shortfuse-bench"))
        .args(["fio", "--quick", "--configs", "bindfs", "--out"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while fio_processes_in(&out).is_empty() {
        assert!(std::time::Instant::now() < deadline, "fio never started");
        assert!(child.try_wait().unwrap().is_none(), "bench ended before fio ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!mounts_under(&out).is_empty(), "bindfs is not mounted while fio runs");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(fio_processes_in(&out).is_empty(), "{:?}", fio_processes_in(&out));
    assert!(mounts_under(&out).is_empty(), "left behind: {:?}", mounts_under(&out));
    let work: Vec<_> = std::fs::read_dir(out.join("work"))
        .map(|d| d.count())
        .into_iter()
        .collect();
    assert!(
        work.iter().all(|&n| n == 0),
        "scratch left in {}",
        out.join("work").display()
    );
    std::fs::remove_dir_all(&out).unwrap();
}
