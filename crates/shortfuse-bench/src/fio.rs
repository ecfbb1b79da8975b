//! The `fio` suite: RFUSE's fio jobs (FAST '24) run with Debian's fio and
//! its JSON output parsed. psync, iodepth 1, buffered, norandommap,
//! group_reporting, end_fsync; sequential 128 KiB write then read, random
//! 4 KiB write (fdatasync after each, as in the scaling runs) then read;
//! numjobs 1, 2, 4, 8 with the total size fixed. Raw fio JSON is kept next
//! to the report.
//!
//! Every read phase reads warm caches on every configuration: fio reads the
//! files once before the phase (`pre_read`) and never invalidates them.
//! Dropping caches instead left configurations in different states: fio's
//! invalidate and a `drop_caches` racing the daemon's own flush emptied
//! ext4's cache under native but could leave a FUSE file's backing file
//! cached, so FUSE "beat" native by reading memory against disk.

use std::io;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cleanup;
use crate::report::Figure;
use crate::scale::Scale;

/// numjobs per scale: each fio run costs 0.3-0.8 s of start-up and cache
/// pre-reads besides the capped phases, so the quick scale (every suite in two
/// minutes) keeps one under- and one over-subscribed point of this 2-core
/// machine.
pub fn threads(scale: Scale) -> &'static [usize] {
    scale.pick(&[1, 2], &[1, 4], &[1, 2, 4, 8])
}

struct Sizes {
    /// Total bytes over all jobs (paper: 32 x 4 GiB).
    total: u64,
    /// Cap for every phase but the sequential write that lays the files out.
    runtime: Duration,
}

fn sizes(scale: Scale) -> Sizes {
    Sizes {
        // Quick: fio's own start-up and the pre-reads take about as long
        // as the capped runs on a 2-core machine.
        total: scale.pick(8 << 20, 32 << 20, 4 << 30),
        runtime: scale.pick(
            Duration::from_millis(100),
            Duration::from_millis(100),
            Duration::from_secs(20),
        ),
    }
}

pub fn describe(scale: Scale) -> String {
    let s = sizes(scale);
    format!(
        "Scale {}: {} MiB in total per thread count (RFUSE (FAST '24): 32 x 4 GiB), numjobs {:?} (RFUSE: up to 32), reads and random writes capped at {} ms each; no remount between phases, every read phase on warm caches (its files read once before it, nothing invalidated), the same on every configuration. Values in MB/s; `-clat` rows: the median completion latency of each run in µs (fio's p50; the mean and p99 in the JSON).",
        scale.name(),
        s.total >> 20,
        threads(scale),
        s.runtime.as_millis()
    )
}

struct Phase {
    name: &'static str,
    rw: &'static str,
    bs: &'static str,
    capped: bool,
    /// Read the files once before the phase, so that it starts warm.
    warm_before: bool,
    extra: &'static [&'static str],
}

const PHASES: &[Phase] = &[
    Phase {
        name: "seq-write",
        rw: "write",
        bs: "128k",
        capped: false,
        warm_before: false,
        extra: &[],
    },
    Phase {
        name: "seq-read",
        rw: "read",
        bs: "128k",
        capped: true,
        warm_before: true,
        extra: &[],
    },
    Phase {
        name: "rand-write",
        rw: "randwrite",
        bs: "4k",
        capped: true,
        warm_before: false,
        extra: &["--fdatasync=1"],
    },
    Phase {
        name: "rand-read",
        rw: "randread",
        bs: "4k",
        capped: true,
        warm_before: true,
        extra: &[],
    },
];

/// The job file for `jobs` threads: the four phases as stonewalled sections
/// of one fio run, since each fio process costs 0.3-0.8 s of start-up on
/// this machine, as long as a quick phase itself. Nothing is invalidated,
/// and each read phase pre-reads its files (see the module's notes). Kept
/// beside the raw JSON so a run can be repeated by hand.
fn job_file(dir: &Path, jobs: usize, s: &Sizes) -> String {
    let mut f = format!(
        "[global]\ndirectory={}\nfilename_format=f.$jobnum\nsize={}\nnumjobs={jobs}\nthread\nioengine=psync\niodepth=1\ndirect=0\ninvalidate=0\nnorandommap\ngroup_reporting\nend_fsync=1\nfallocate=none\n",
        dir.display(),
        s.total / jobs as u64,
    );
    for phase in PHASES {
        f += &format!("\n[{}]\nstonewall\nrw={}\nbs={}\n", phase.name, phase.rw, phase.bs);
        for extra in phase.extra {
            f += extra.trim_start_matches("--");
            f += "\n";
        }
        if phase.capped {
            f += &format!("runtime={}ms\n", s.runtime.as_millis());
        }
        if phase.warm_before {
            f += "pre_read=1\n";
        }
    }
    f
}

/// Runs the job file `job` (in `raw`, where fio also leaves its prerun
/// output); returns fio's JSON. The child is killed if it runs far past its
/// expected time, and always reaped.
fn fio(job: &Path, raw: &Path, jobs: usize, s: &Sizes) -> io::Result<String> {
    let mut cmd = Command::new("fio");
    cmd.arg(job)
        .arg("--output-format=json")
        .current_dir(raw)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cleanup::spawn(&mut cmd)
        .map_err(|e| io::Error::new(e.kind(), format!("fio: {e} (is Debian's fio installed?)")))?;
    let limit = Duration::from_secs(60) + s.runtime * 10 * PHASES.len() as u32;
    let started = Instant::now();
    // Drain the pipes on threads so a chatty fio cannot block on a full pipe.
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(o) = stdout.as_mut() {
            let _ = io::Read::read_to_end(o, &mut v);
        }
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(e) = stderr.as_mut() {
            let _ = io::Read::read_to_end(e, &mut v);
        }
        v
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Ok(st),
            Ok(None) if started.elapsed() > limit => break Err(io::Error::other(format!("fio ran over {limit:?}"))),
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => break Err(e),
        }
    };
    cleanup::reap(&mut child);
    let status = status?;
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if !status.success() {
        return Err(io::Error::other(format!(
            "fio x{jobs} failed ({status}): {}",
            String::from_utf8_lossy(&err).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Throughput and completion latency of the (group-reported) phase `name`.
fn parse(json: &str, name: &str, rw: &str) -> io::Result<(f64, f64, f64, f64, u64)> {
    // fio may print warnings (and exec_prerun notes) before the JSON document.
    let start = json.find("\n{").map(|i| i + 1).or_else(|| json.find('{'));
    let start = start.ok_or_else(|| io::Error::other("fio printed no JSON"))?;
    let v: serde_json::Value =
        serde_json::from_str(&json[start..]).map_err(|e| io::Error::other(format!("fio JSON: {e}")))?;
    let job = v["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["jobname"] == name))
        .ok_or_else(|| io::Error::other(format!("fio JSON has no job {name}")))?;
    if job["error"].as_i64().unwrap_or(0) != 0 {
        return Err(io::Error::other(format!("fio {name} error {}", job["error"])));
    }
    let side = if rw.contains("read") {
        &job["read"]
    } else {
        &job["write"]
    };
    let bw = side["bw_bytes"]
        .as_f64()
        .ok_or_else(|| io::Error::other("fio JSON lacks bw_bytes"))?;
    let clat = &side["clat_ns"];
    let us = |x: &serde_json::Value| x.as_f64().unwrap_or(f64::NAN) / 1e3;
    Ok((
        bw,
        us(&clat["mean"]),
        us(&clat["percentile"]["50.000000"]),
        us(&clat["percentile"]["99.000000"]),
        side["total_ios"].as_u64().unwrap_or(0),
    ))
}

/// A phase's completion latency row: the median (fio's p50), as the
/// latency suite's rows. With more jobs than CPUs, or fdatasync after each
/// write, a few calls that wait for a CPU or a journal commit carry the
/// mean, and how many do follows how fast the configuration goes rather
/// than what a call costs (native's 4-job random write: p50 4.7 µs, mean
/// 13.8). The mean and p99 stay in the JSON.
fn clat_figure(phase: &str, jobs: usize, (mean, p50, p99): (f64, f64, f64), ios: u64) -> Figure {
    Figure {
        op: format!("{phase}-{jobs}th-clat"),
        unit: "us".into(),
        value: if p50.is_finite() { p50 } else { mean },
        mean: Some(mean),
        p50: Some(p50),
        p99: Some(p99),
        samples: ios,
        lower_is_better: true,
        ..Figure::default()
    }
}

pub fn run(dir: &Path, raw: &Path, scale: Scale, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    let s = sizes(scale);
    std::fs::create_dir_all(raw)?;
    let mut out = Vec::new();
    let mut lat = Vec::new();
    for &jobs in threads(scale) {
        let d = dir.join(format!("fio-{jobs}"));
        std::fs::create_dir_all(&d)?;
        progress(&format!("{jobs} thread(s)"));
        let job = raw.join(format!("fio-{jobs}.fio"));
        std::fs::write(&job, job_file(&d, jobs, &s))?;
        let json = fio(&job, raw, jobs, &s)?;
        std::fs::write(raw.join(format!("fio-{jobs}.json")), &json)?;
        for phase in PHASES {
            let (bw, mean, p50, p99, ios) = parse(&json, phase.name, phase.rw)?;
            if bw <= 0.0 {
                return Err(io::Error::other(format!("fio {} x{jobs} moved no data", phase.name)));
            }
            out.push(Figure::rate(format!("{}-{jobs}th", phase.name), "MB/s", bw / 1e6, ios).at(phase.name, jobs));
            lat.push(clat_figure(phase.name, jobs, (mean, p50, p99), ios));
        }
        std::fs::remove_dir_all(&d)?;
    }
    out.extend(lat);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_phase_by_name() {
        let json = r#"sr : Saving output of prerun in sr.prerun.txt
{"jobs":[{"jobname":"seq-write","error":0,"write":{"bw_bytes":7000000,"total_ios":3,"clat_ns":{"mean":500.0,"percentile":{"50.000000":400,"99.000000":900}}},"read":{"bw_bytes":0}},
{"jobname":"rand-read","error":0,"read":{"bw_bytes":2000000,"total_ios":10,"clat_ns":{"mean":1500.0,"percentile":{"50.000000":1000,"99.000000":9000}}},"write":{"bw_bytes":0}}]}"#;
        let (bw, mean, p50, p99, ios) = parse(json, "rand-read", "randread").unwrap();
        assert_eq!((bw, mean, p50, p99, ios), (2e6, 1.5, 1.0, 9.0, 10));
        assert_eq!(parse(json, "seq-write", "write").unwrap().0, 7e6);
        assert!(
            parse(json, "rand-write", "randwrite").is_err(),
            "a missing phase must not pass"
        );
        assert!(parse("{\"jobs\":[{\"jobname\":\"x\",\"error\":5}]}", "x", "read").is_err());
        assert!(parse("garbage", "x", "read").is_err());
    }

    #[test]
    fn a_latency_row_is_the_median_call_with_the_mean_beside_it() {
        let f = clat_figure("rand-write", 4, (13.8, 4.7, 96.8), 100);
        assert_eq!(
            (f.op.as_str(), f.value, f.mean, f.p99),
            ("rand-write-4th-clat", 4.7, Some(13.8), Some(96.8))
        );
        // A fio without percentiles still gives a row.
        assert_eq!(clat_figure("seq-read", 1, (9.0, f64::NAN, f64::NAN), 1).value, 9.0);
    }

    #[test]
    fn job_file_has_every_phase_with_its_cap_and_drop() {
        let s = sizes(Scale::Quick);
        let f = job_file(Path::new("/d"), 2, &s);
        for phase in PHASES {
            let at = f.find(&format!("[{}]", phase.name)).expect(phase.name);
            let section = f[at..].split("\n\n").next().unwrap();
            assert!(section.contains("stonewall"), "{section}");
            assert_eq!(section.contains("runtime="), phase.capped, "{section}");
            assert_eq!(section.contains("pre_read=1"), phase.warm_before, "{section}");
            assert!(!section.contains("drop_caches"), "{section}");
        }
        assert!(f.contains("numjobs=2\n") && f.contains(&format!("size={}\n", s.total / 2)));
        assert!(f.contains("fdatasync=1\n"));
        // Caches stay as the phases leave them, the same on every configuration.
        assert!(f.contains("invalidate=0\n"), "{f}");
    }
}
