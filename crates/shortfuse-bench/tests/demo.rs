//! `make demo` as a user meets it: the Makefile builds every artifact the
//! demo's configurations need (the preload shim included, in the profile
//! of the `shortfuse` it runs), and a bench run in which a configuration
//! does not complete exits with a failure, with a log that reads as text.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use shortfuse_bench::{Config, SUITES};
use support::{mounts_under, shortfuse_bin};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn make_demo_builds_what_its_configurations_need() {
    // -n prints the recipe without running it (setup included).
    let out = Command::new("make")
        .args(["-n", "demo"])
        .current_dir(workspace())
        .output()
        .expect("make");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let recipe = String::from_utf8_lossy(&out.stdout);
    let bench = recipe
        .lines()
        .find(|l| l.contains("shortfuse bench"))
        .unwrap_or_else(|| panic!("no bench line in {recipe}"));
    let profile = if bench.contains("/release/shortfuse") {
        "--release"
    } else {
        panic!("the demo should run the release build: {bench}")
    };
    let builds: Vec<&str> = recipe
        .lines()
        .filter(|l| l.contains(" build ") && l.contains(profile))
        .collect();
    let built = |package: &str| {
        builds.iter().any(|l| {
            l.contains("--workspace")
                || l.split_whitespace()
                    .collect::<Vec<_>>()
                    .windows(2)
                    .any(|w| w == ["-p", package])
        })
    };
    assert!(built("shortfuse-cli"), "shortfuse is not built in {profile}: {recipe}");
    let suites: Vec<&str> = bench.split_whitespace().filter(|w| SUITES.contains(w)).collect();
    // The demo shows real programs beside the per-operation figures.
    for want in ["latency", "programs"] {
        assert!(suites.contains(&want), "the demo does not run {want}: {bench}");
    }
    assert!(
        !bench.contains("--configs"),
        "the demo runs each suite on its defaults: {bench}"
    );
    for suite in suites {
        for c in Config::defaults(suite) {
            if c.needs_shim() {
                assert!(
                    built("shortfuse-preload"),
                    "{suite} runs {} under the preload shim, which make demo does not build in {profile}: {recipe}",
                    c.name
                );
            }
        }
    }
}

#[test]
fn a_configuration_that_does_not_complete_fails_the_run() {
    let dir = std::env::temp_dir().join(format!("sfbench-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A shortfuse without the shim beside it: the preload row cannot run.
    let bin = dir.join("shortfuse");
    std::fs::copy(shortfuse_bin(), &bin).unwrap();
    let out_dir = dir.join("out");
    let out = Command::new(&bin)
        .args(["bench", "--tiny", "latency", "--configs", "native,preload", "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a run without preload passed: {stderr}");
    assert!(stderr.contains("1 suite run(s) did not complete"), "{stderr}");
    // stderr is a pipe here: lines, not a terminal's rewritten line.
    assert!(!stderr.contains('\r') && !stderr.contains('\x1b'), "{stderr:?}");
    assert!(stderr.contains("latency on native, run 2/2: done"), "{stderr}");
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(md.contains("`preload` did not run"), "{md}");
    assert!(md.contains("1 suite run(s) did not complete"), "{md}");
    assert!(mounts_under(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
