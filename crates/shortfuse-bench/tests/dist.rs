//! The `dist` suite at tiny scale: a server and 12 client mounts of its
//! own, every row of the tiny matrix run several times for every
//! consistency mode (medians, ranges and the runs) with its
//! lease/writethrough ratio, the client curves plotted, the consistency
//! checker run, and nothing left mounted or running afterwards.

mod support;

use support::{mounts_under, shortfuse_bin};

use shortfuse_bench::{dist, BenchOptions, Scale};

#[test]
fn tiny_dist() {
    let out = std::env::temp_dir().join(format!("sfbench-dist-{}", std::process::id()));
    let mut o = BenchOptions::new(out.clone());
    o.suites = vec!["dist".into()];
    o.tiny = true;
    o.shortfuse_bin = shortfuse_bin();
    let report = shortfuse_bench::run(&o).expect("run");
    let suite = &report.suites[0];
    assert_eq!(suite.results.len(), 1);
    let r = &suite.results[0];
    assert_eq!(r.config, "native");
    assert!(r.error.is_none(), "{:?}", r.error);
    let rows = dist::row_count(Scale::Tiny);
    assert_eq!(r.figures.len(), rows * (dist::MODES.len() + 1));
    for f in &r.figures {
        assert!(f.value.is_finite() && f.value > 0.0, "{f:?}");
        // Each row ran several times per mode: the figure is their median.
        assert_eq!(f.runs.len(), dist::runs(Scale::Tiny), "{f:?}");
        let (lo, hi) = f.range().unwrap();
        assert!(lo <= f.value && f.value <= hi, "{f:?}");
    }
    let ratios = r
        .figures
        .iter()
        .filter(|f| f.op.ends_with("lease/writethrough"))
        .count();
    assert_eq!(ratios, rows);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| rnd r0w100 c0 n4 lease | MB/s |"), "{md}");
    assert!(md.contains("[smallest-largest]"), "{md}");
    let json = std::fs::read_to_string(out.join("report.json")).unwrap();
    assert!(json.contains("\"runs\""), "the runs are not in the JSON");
    for mode in dist::MODES {
        let plot = format!("plots/dist-clients-{mode}.png");
        assert!(report.plots.contains(&plot), "{plot} not in {:?}", report.plots);
    }
    assert!(mounts_under(&out).is_empty());
    let left = std::process::Command::new("pgrep")
        .args(["-f", &format!("dist up --listen 127.0.0.1:0 --data {}", out.display())])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "the server was left running");
    std::fs::remove_dir_all(&out).unwrap();
}
