//! The `preload` configuration of the latency suite: the workload runs in a
//! worker process under `shortfuse run` and its figures come back into the
//! report next to native's. Needs root (vm.mmap_min_addr) and the shim built
//! next to the `shortfuse` binary.

mod support;

use support::shortfuse_bin;

use shortfuse_bench::{BenchOptions, Config};

#[test]
fn latency_runs_in_a_preload_worker() {
    let bin = shortfuse_bin();
    let shim = bin.with_file_name("libshortfuse_preload.so");
    assert!(
        shim.is_file(),
        "{} missing: build the workspace (make build)",
        shim.display()
    );
    let out = std::env::temp_dir().join(format!("sfbench-preload-{}", std::process::id()));
    let mut opts = BenchOptions::new(out.clone());
    opts.suites = vec!["latency".into()];
    opts.configs = Some(Config::select(&["native".into(), "preload".into()]).unwrap());
    opts.tiny = true;
    opts.shortfuse_bin = bin;
    let report = shortfuse_bench::run(&opts).unwrap();
    let suite = &report.suites[0];
    let ops = |name: &str| -> Vec<String> {
        let r = suite.results.iter().find(|r| r.config == name).unwrap();
        assert!(r.error.is_none(), "{name}: {:?}", r.error);
        r.figures.iter().map(|f| f.op.clone()).collect()
    };
    let native = ops("native");
    assert!(native.contains(&"getpid".to_string()), "{native:?}");
    assert_eq!(ops("preload"), native);
    let preload = suite.results.iter().find(|r| r.config == "preload").unwrap();
    for f in &preload.figures {
        assert!(f.value.is_finite() && f.value > 0.0, "{f:?}");
    }
    // The mount point existed only for the worker's shim.
    let work = out.join("work");
    let leftovers: Vec<_> = std::fs::read_dir(&work)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&out);
}
