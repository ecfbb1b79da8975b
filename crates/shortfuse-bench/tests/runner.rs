//! The runner at a tiny scale on real mounts: a well-formed report, and no
//! mount left behind when a workload fails.

use std::path::PathBuf;

use shortfuse_bench::{config, BenchOptions, Config, Kind};

fn options(name: &str, configs: Vec<Config>) -> BenchOptions {
    let out = std::env::temp_dir().join(format!("sfbench-{name}-{}", std::process::id()));
    BenchOptions {
        suites: vec!["latency".into()],
        configs,
        quick: true,
        tiny: true,
        out,
        shortfuse_bin: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/shortfuse"),
    }
}

fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&prefix))
        .collect()
}

#[test]
fn tiny_latency_report_is_well_formed() {
    let opts = options("ok", Config::select(&["native".into(), "bindfs".into()]).unwrap());
    let report = shortfuse_bench::run(&opts).expect("run");
    let suite = &report.suites[0];
    assert_eq!(suite.results.len(), 2);
    for r in &suite.results {
        assert!(r.error.is_none(), "{} failed: {:?}", r.config, r.error);
        let ops: Vec<_> = r.figures.iter().map(|f| f.op.as_str()).collect();
        for op in [
            "stat",
            "open+close",
            "create",
            "unlink",
            "4KiB-pread-cached",
            "4KiB-write",
            "seq-read",
        ] {
            assert!(ops.contains(&op), "{} lacks {op}: {ops:?}", r.config);
        }
        assert!(r.figures.iter().all(|f| f.value.is_finite() && f.value > 0.0));
    }
    let md = std::fs::read_to_string(opts.out.join("report.md")).unwrap();
    assert!(md.contains("| stat | us |") && md.contains("x, "), "{md}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(opts.out.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["suites"][0]["results"][1]["config"], "bindfs");
    assert!(mounts_under(&opts.out).is_empty());
    std::fs::remove_dir_all(&opts.out).unwrap();
}

#[test]
fn failed_workload_is_reported_and_unmounted() {
    // A read-only bindfs mount makes the first create fail inside the workload.
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
    let opts = options("fail", vec![ro, missing]);
    let report = shortfuse_bench::run(&opts).expect("run");
    let results = &report.suites[0].results;
    let err = results[0].error.as_deref().expect("read-only run must fail");
    assert!(err.contains("workload failed"), "{err}");
    assert!(results[1].error.is_some());
    assert!(
        mounts_under(&opts.out).is_empty(),
        "left behind: {:?}",
        mounts_under(&opts.out)
    );
    assert!(!config::is_mounted(&opts.out.join("work")));
    std::fs::remove_dir_all(&opts.out).unwrap();
}
