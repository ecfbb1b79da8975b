//! Per-opcode request counts and log2 latency histograms of the time each
//! request spends in the daemon (as To FUSE or Not to FUSE (FAST '17) instrumented FUSE). Lock-free
//! relaxed atomics, cheap enough to stay on: `record` is four uncontended
//! atomic adds on the opcode's own cache lines.
//!
//! Histogram bucket `b` counts latencies in `[2^(b-1), 2^b)` nanoseconds
//! (bucket 0 counts zero); percentiles are estimated by interpolating inside
//! the bucket that holds the wanted rank, so they are accurate to within a
//! factor of two and never exceed the recorded maximum.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A path requests travel over: the kernel's two ([`Transport::Dev`],
/// [`Transport::Uring`]), which [`MountOptions::transport`] chooses for a
/// mount, and the two that bypass the kernel (the rings of `shortfuse
/// serve` and the preload shim's in-process calls). Statistics count
/// requests per transport. Parses from and displays as the name the CLI's
/// `--transport` uses (`dev`, `uring`, `ring`, `inprocess`).
///
/// [`MountOptions::transport`]: crate::MountOptions::transport
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Transport {
    /// /dev/fuse read/write.
    #[default]
    Dev,
    /// FUSE-over-io_uring.
    Uring,
    /// Shared-memory rings from preloaded programs.
    Ring,
    /// In-process calls from the preload shim.
    InProcess,
}

impl Transport {
    /// Every transport, in the order tables show them.
    pub const ALL: [Transport; 4] = [Transport::Dev, Transport::Uring, Transport::Ring, Transport::InProcess];

    /// The transport's name in tables and JSON (`dev`, `uring`, `ring`, `inprocess`).
    pub fn name(self) -> &'static str {
        match self {
            Transport::Dev => "dev",
            Transport::Uring => "uring",
            Transport::Ring => "ring",
            Transport::InProcess => "inprocess",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Transport, String> {
        Transport::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown transport {s:?} (dev, uring, ring or inprocess)"))
    }
}

/// Opcodes below this number get their own counters; the rest (CUSE_INIT,
/// garbage) share the last slot.
pub(crate) const OPCODE_SLOTS: usize = 64;
/// Number of log2 buckets per histogram.
pub(crate) const BUCKETS: usize = 64;

struct OpCounters {
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl Default for OpCounters {
    fn default() -> OpCounters {
        OpCounters {
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Counters for one connection.
pub struct Stats {
    /// Per opcode slot, made at its first request (see [`Stats::counters`]).
    ops: Box<[OnceLock<Box<OpCounters>>]>,
    transports: [AtomicU64; 4],
    started: Instant,
    /// The user-space cache in front of the file system, when there is one.
    cache: OnceLock<Arc<CacheStats>>,
    /// Figures the file system itself reports (see [`Figures`]).
    figures: OnceLock<Arc<dyn Figures>>,
    /// Latencies are measured (see [`Stats::untimed`]).
    timed: bool,
}

/// One named figure a file system reports beside the requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Figure {
    /// Lower case with underscores (`revocations`).
    pub name: &'static str,
    /// Its value now.
    pub value: u64,
    /// A level that goes down as well as up; otherwise a count that only
    /// grows (`_total` in the Prometheus format).
    pub gauge: bool,
    /// One sentence for the Prometheus `# HELP` line.
    pub help: &'static str,
}

/// Figures a file system counts of its own work (a distributed file
/// system's leases, say), shown by `shortfuse stats` in every format
/// beside the requests and the cache, under the name of their group
/// (see [`crate::Filesystem::figures`]).
pub trait Figures: Send + Sync {
    /// The group's name, lower case (`lease`): the table line's and the
    /// JSON key, and the Prometheus names' prefix after `shortfuse_`.
    fn group(&self) -> &'static str;
    /// The figures now, in the order tables show them.
    fn figures(&self) -> Vec<Figure>;
}

/// A group of figures at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FigureGroup {
    /// See [`Figures::group`].
    pub group: &'static str,
    /// See [`Figures::figures`].
    pub figures: Vec<Figure>,
}

impl FigureGroup {
    /// One line: `GROUP: name=.. name=..`.
    pub fn line(&self) -> String {
        let parts: Vec<String> = self.figures.iter().map(|f| format!("{}={}", f.name, f.value)).collect();
        format!("{}: {}\n", self.group, parts.join(" "))
    }

    /// One JSON object.
    pub fn json(&self) -> String {
        let parts: Vec<String> = self
            .figures
            .iter()
            .map(|f| format!("\"{}\":{}", f.name, f.value))
            .collect();
        format!("{{{}}}", parts.join(","))
    }

    /// The Prometheus families, each labelled with `labels`: a gauge as
    /// `shortfuse_GROUP_NAME`, a count as `shortfuse_GROUP_NAME_total`.
    fn prometheus(&self, s: &mut String, labels: &str) {
        for f in &self.figures {
            let (name, kind) = match f.gauge {
                true => (format!("{}_{}", self.group, f.name), "gauge"),
                false => (format!("{}_{}_total", self.group, f.name), "counter"),
            };
            let _ = writeln!(
                s,
                "# HELP shortfuse_{name} {}\n# TYPE shortfuse_{name} {kind}\nshortfuse_{name}{{{labels}}} {}",
                f.help, f.value
            );
        }
    }
}

/// Counters of a user-space cache (`shortfuse::cache`), shown by
/// `shortfuse stats` beside the requests.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Pages found in the cache, and not.
    pub hits: AtomicU64,
    /// Pages not in the cache, read from the file system.
    pub misses: AtomicU64,
    /// Pages evicted to make room.
    pub evictions: AtomicU64,
    /// Files whose pages were dropped (truncation, a change seen at open,
    /// a notification).
    pub invalidations: AtomicU64,
    /// Bytes read from and written to the file system behind the cache.
    pub bytes_in: AtomicU64,
    /// Bytes written to the file system behind the cache.
    pub bytes_out: AtomicU64,
    /// Bytes written into the cache and not yet to the file system (a
    /// level, not a count; 0 for a write-through cache).
    pub dirty_bytes: AtomicU64,
    /// Attributes and names served from the metadata cache, and not.
    pub meta_hits: AtomicU64,
    /// Attributes and names the metadata cache did not hold.
    pub meta_misses: AtomicU64,
}

/// [`CacheStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// See [`CacheStats::hits`].
    pub hits: u64,
    /// See [`CacheStats::misses`].
    pub misses: u64,
    /// See [`CacheStats::evictions`].
    pub evictions: u64,
    /// See [`CacheStats::invalidations`].
    pub invalidations: u64,
    /// See [`CacheStats::bytes_in`].
    pub bytes_in: u64,
    /// See [`CacheStats::bytes_out`].
    pub bytes_out: u64,
    /// See [`CacheStats::dirty_bytes`].
    pub dirty_bytes: u64,
    /// See [`CacheStats::meta_hits`].
    pub meta_hits: u64,
    /// See [`CacheStats::meta_misses`].
    pub meta_misses: u64,
}

impl CacheStats {
    fn fields(&self) -> [(&'static str, &AtomicU64); 9] {
        [
            ("hits", &self.hits),
            ("misses", &self.misses),
            ("evictions", &self.evictions),
            ("invalidations", &self.invalidations),
            ("bytes_in", &self.bytes_in),
            ("bytes_out", &self.bytes_out),
            ("dirty_bytes", &self.dirty_bytes),
            ("meta_hits", &self.meta_hits),
            ("meta_misses", &self.meta_misses),
        ]
    }

    /// The counters now.
    pub fn snapshot(&self) -> CacheCounters {
        let v = self.fields().map(|(_, a)| a.load(Relaxed));
        CacheCounters {
            hits: v[0],
            misses: v[1],
            evictions: v[2],
            invalidations: v[3],
            bytes_in: v[4],
            bytes_out: v[5],
            dirty_bytes: v[6],
            meta_hits: v[7],
            meta_misses: v[8],
        }
    }

    /// Zeroes the counts (not `dirty_bytes`, which is a level).
    pub fn reset(&self) {
        for (name, a) in self.fields() {
            if name != "dirty_bytes" {
                a.store(0, Relaxed);
            }
        }
    }
}

impl CacheCounters {
    /// Each counter with its name, in the order tables show them.
    pub fn pairs(&self) -> [(&'static str, u64); 9] {
        [
            ("hits", self.hits),
            ("misses", self.misses),
            ("evictions", self.evictions),
            ("invalidations", self.invalidations),
            ("bytes_in", self.bytes_in),
            ("bytes_out", self.bytes_out),
            ("dirty_bytes", self.dirty_bytes),
            ("meta_hits", self.meta_hits),
            ("meta_misses", self.meta_misses),
        ]
    }

    /// One line: `cache: hits=.. misses=.. ...`.
    pub fn line(&self) -> String {
        self.group().line()
    }

    /// One JSON object.
    pub fn json(&self) -> String {
        self.group().json()
    }

    /// The counters as the figures of group `cache`.
    pub fn group(&self) -> FigureGroup {
        const HELP: [&str; 9] = [
            "Pages found in the user-space cache.",
            "Pages the user-space cache did not hold, read from the file system.",
            "Pages the user-space cache evicted to make room.",
            "Files whose pages the user-space cache dropped.",
            "Bytes read into the user-space cache from the file system.",
            "Bytes the user-space cache wrote to the file system.",
            "Bytes written into the user-space cache and not yet to the file system.",
            "Attributes and names served from the metadata cache.",
            "Attributes and names the metadata cache did not hold.",
        ];
        let figures = self
            .pairs()
            .iter()
            .zip(HELP)
            .map(|(&(name, value), help)| Figure {
                name,
                value,
                // dirty_bytes is a level; the rest only grow.
                gauge: name == "dirty_bytes",
                help,
            })
            .collect();
        FigureGroup {
            group: "cache",
            figures,
        }
    }
}

impl Default for Stats {
    fn default() -> Stats {
        Stats::new()
    }
}

/// The bucket that counts a latency of `nanos`.
pub(crate) fn bucket_of(nanos: u64) -> usize {
    ((u64::BITS - nanos.leading_zeros()) as usize).min(BUCKETS - 1)
}

/// Smallest and largest latency counted by bucket `b`.
pub(crate) fn bucket_range(b: usize) -> (u64, u64) {
    match b {
        0 => (0, 0),
        b if b >= BUCKETS - 1 => (1 << (BUCKETS - 2), u64::MAX),
        b => (1 << (b - 1), (1 << b) - 1),
    }
}

impl Stats {
    /// Empty counters, timing each request.
    pub fn new() -> Stats {
        Stats {
            ops: (0..=OPCODE_SLOTS).map(|_| OnceLock::new()).collect(),
            transports: Default::default(),
            started: Instant::now(),
            cache: OnceLock::new(),
            figures: OnceLock::new(),
            timed: true,
        }
    }

    /// Counters whose latencies nobody reads (a file system served in the
    /// preload shim's own process): the dispatcher then spares the two
    /// clock reads per request, and requests count with a latency of 0.
    pub fn untimed() -> Stats {
        Stats {
            timed: false,
            ..Stats::new()
        }
    }

    /// Whether latencies are measured.
    pub fn timed(&self) -> bool {
        self.timed
    }

    /// Shows `cache`'s counters with these (the first one attached wins).
    pub fn attach_cache(&self, cache: Arc<CacheStats>) {
        let _ = self.cache.set(cache);
    }

    /// Shows the file system's own figures with these (the first one
    /// attached wins).
    pub fn attach_figures(&self, figures: Arc<dyn Figures>) {
        let _ = self.figures.set(figures);
    }

    /// The cache's counters, when one was attached.
    pub fn cache(&self) -> Option<&Arc<CacheStats>> {
        self.cache.get()
    }

    /// The counters of `opcode`'s slot, made on its first request. Every
    /// program under the preload shim counts its requests, and a short one
    /// serves a handful of opcodes: it then writes a few slots, not all 65
    /// (35 KB, nine pages touched in every new process).
    fn counters(&self, opcode: u32) -> &OpCounters {
        self.ops[(opcode as usize).min(OPCODE_SLOTS)].get_or_init(Box::default)
    }

    /// Records one request of `opcode` served in `nanos` over `transport`.
    pub fn record(&self, opcode: u32, transport: Transport, nanos: u64) {
        let c = self.counters(opcode);
        c.count.fetch_add(1, Relaxed);
        c.sum.fetch_add(nanos, Relaxed);
        c.max.fetch_max(nanos, Relaxed);
        c.buckets[bucket_of(nanos)].fetch_add(1, Relaxed);
        self.transports[transport.index()].fetch_add(1, Relaxed);
    }

    /// Records `n` requests of `opcode` over `transport` whose times were
    /// not taken (counted as served at once).
    pub fn record_untimed(&self, opcode: u32, transport: Transport, n: u64) {
        let c = self.counters(opcode);
        c.count.fetch_add(n, Relaxed);
        c.buckets[bucket_of(0)].fetch_add(n, Relaxed);
        self.transports[transport.index()].fetch_add(n, Relaxed);
    }

    /// Zeroes every counter. Requests recorded meanwhile may be half counted.
    pub fn reset(&self) {
        for c in self.ops.iter().filter_map(OnceLock::get) {
            c.count.store(0, Relaxed);
            c.sum.store(0, Relaxed);
            c.max.store(0, Relaxed);
            for b in &c.buckets {
                b.store(0, Relaxed);
            }
        }
        for t in &self.transports {
            t.store(0, Relaxed);
        }
        if let Some(c) = self.cache.get() {
            c.reset();
        }
    }

    /// A copy of the counters of every opcode seen at least once. Concurrent
    /// `record`s may make a row's count and buckets differ by a few.
    pub fn snapshot(&self) -> StatsSnapshot {
        let ops = self
            .ops
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| Some((slot, c.get()?)))
            .filter(|(_, c)| c.count.load(Relaxed) > 0)
            .map(|(slot, c)| {
                let mut buckets = [0u64; BUCKETS];
                for (b, v) in buckets.iter_mut().zip(&c.buckets) {
                    *b = v.load(Relaxed);
                }
                OpStats {
                    opcode: (slot < OPCODE_SLOTS).then_some(slot as u32),
                    count: c.count.load(Relaxed),
                    sum_nanos: c.sum.load(Relaxed),
                    max_nanos: c.max.load(Relaxed),
                    buckets,
                }
            })
            .collect();
        StatsSnapshot {
            uptime: self.started.elapsed(),
            transports: Transport::ALL.map(|t| (t, self.transports[t.index()].load(Relaxed))),
            ops,
            cache: self.cache.get().map(|c| c.snapshot()),
            figures: self.figures.get().map(|f| FigureGroup {
                group: f.group(),
                figures: f.figures(),
            }),
        }
    }
}

/// One opcode's counters at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpStats {
    /// `None` for the slot shared by opcodes 64 and above.
    pub opcode: Option<u32>,
    /// Requests served.
    pub count: u64,
    /// Their total time.
    pub sum_nanos: u64,
    /// The longest one.
    pub max_nanos: u64,
    /// Requests per log2 latency bucket: bucket `b` counts latencies in
    /// `[2^(b-1), 2^b)` nanoseconds, bucket 0 counts zero.
    pub buckets: [u64; BUCKETS],
}

impl OpStats {
    /// The kernel's name of the opcode (`LOOKUP`), `OTHER` for the shared slot.
    pub fn name(&self) -> &'static str {
        match self.opcode {
            Some(op) => shortfuse_abi::opcodes::opcode_name(op),
            None => "OTHER",
        }
    }

    /// Mean time per request.
    pub fn mean_nanos(&self) -> u64 {
        self.sum_nanos.checked_div(self.count).unwrap_or(0)
    }

    /// Estimated latency below which a fraction `q` (0.0 to 1.0) of the
    /// requests fall.
    pub fn percentile_nanos(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return 0;
        }
        // Rank of the wanted request, 1-based.
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0u64;
        for (b, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if seen + n >= rank {
                let (lo, hi) = bucket_range(b);
                let hi = hi.min(self.max_nanos.max(lo));
                // Spread the bucket's requests evenly across its range.
                let frac = (rank - seen) as f64 / n as f64;
                return lo + ((hi - lo) as f64 * frac) as u64;
            }
            seen += n;
        }
        self.max_nanos
    }
}

/// Counters of a whole connection at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Time since the counters started (or were reset).
    pub uptime: Duration,
    /// Requests per transport.
    pub transports: [(Transport, u64); 4],
    /// Opcodes seen at least once, in opcode order.
    pub ops: Vec<OpStats>,
    /// The user-space cache's counters, when the daemon has one.
    pub cache: Option<CacheCounters>,
    /// The file system's own figures, when it reports any.
    pub figures: Option<FigureGroup>,
}

/// `1234` ns as `1.23µs`, and so on: three significant digits.
pub(crate) fn format_nanos(n: u64) -> String {
    let (v, unit) = match n {
        0..=999 => return format!("{n}ns"),
        1_000..=999_999 => (n as f64 / 1e3, "µs"),
        1_000_000..=999_999_999 => (n as f64 / 1e6, "ms"),
        _ => (n as f64 / 1e9, "s"),
    };
    if v >= 100.0 {
        format!("{v:.0}{unit}")
    } else if v >= 10.0 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.2}{unit}")
    }
}

impl StatsSnapshot {
    /// Requests over every transport.
    pub fn total_requests(&self) -> u64 {
        self.ops.iter().map(|o| o.count).sum()
    }

    /// A table with one row per opcode: count, mean, p50, p99, max.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<20} {:>12} {:>10} {:>10} {:>10} {:>10}",
            "opcode", "count", "mean", "p50", "p99", "max"
        );
        for o in &self.ops {
            let _ = writeln!(
                s,
                "{:<20} {:>12} {:>10} {:>10} {:>10} {:>10}",
                o.name(),
                o.count,
                format_nanos(o.mean_nanos()),
                format_nanos(o.percentile_nanos(0.5)),
                format_nanos(o.percentile_nanos(0.99)),
                format_nanos(o.max_nanos)
            );
        }
        let transports: Vec<String> = self
            .transports
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(t, n)| format!("{}={n}", t.name()))
            .collect();
        let _ = writeln!(
            s,
            "{} requests in {:.1}s{}{}",
            self.total_requests(),
            self.uptime.as_secs_f64(),
            if transports.is_empty() { "" } else { "; " },
            transports.join(" ")
        );
        if let Some(c) = &self.cache {
            s.push_str(&c.line());
        }
        if let Some(f) = &self.figures {
            s.push_str(&f.line());
        }
        s
    }

    /// The snapshot in the Prometheus text exposition format (version
    /// 0.0.4), every series labelled with `mountpoint`: requests by
    /// transport, a latency histogram per operation (seconds; the log2
    /// buckets up to about a minute, then `+Inf`), the cache's counters,
    /// the file system's own figures.
    pub fn prometheus(&self, mount_point: &str) -> String {
        /// The last bucket given its own `le`: 2^36 ns, about 69 s.
        const LAST_LE_BUCKET: usize = 36;
        let mp = mount_point
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let mut s = String::new();
        fn family(s: &mut String, name: &str, kind: &str, help: &str) {
            let _ = writeln!(s, "# HELP shortfuse_{name} {help}\n# TYPE shortfuse_{name} {kind}");
        }
        family(
            &mut s,
            "uptime_seconds",
            "gauge",
            "Seconds since the daemon started serving.",
        );
        let _ = writeln!(
            s,
            "shortfuse_uptime_seconds{{mountpoint=\"{mp}\"}} {}",
            self.uptime.as_secs_f64()
        );
        family(&mut s, "requests_total", "counter", "Requests served, by transport.");
        for (t, n) in &self.transports {
            let _ = writeln!(
                s,
                "shortfuse_requests_total{{mountpoint=\"{mp}\",transport=\"{}\"}} {n}",
                t.name()
            );
        }
        family(
            &mut s,
            "request_duration_seconds",
            "histogram",
            "Time from a request's arrival to its reply, by operation.",
        );
        for o in &self.ops {
            let labels = format!("mountpoint=\"{mp}\",op=\"{}\"", o.name());
            let mut cumulative = 0;
            for (b, n) in o.buckets.iter().enumerate().take(LAST_LE_BUCKET + 1) {
                cumulative += n;
                let le = bucket_range(b).1 as f64 / 1e9;
                let _ = writeln!(
                    s,
                    "shortfuse_request_duration_seconds_bucket{{{labels},le=\"{le:e}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                s,
                "shortfuse_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                o.count
            );
            let _ = writeln!(
                s,
                "shortfuse_request_duration_seconds_sum{{{labels}}} {}",
                o.sum_nanos as f64 / 1e9
            );
            let _ = writeln!(s, "shortfuse_request_duration_seconds_count{{{labels}}} {}", o.count);
        }
        let labels = format!("mountpoint=\"{mp}\"");
        for g in self.cache.map(|c| c.group()).iter().chain(&self.figures) {
            g.prometheus(&mut s, &labels);
        }
        s
    }

    /// The snapshot as one JSON object (nanoseconds throughout). Buckets are
    /// listed sparsely as `[bucket, count]` pairs.
    pub fn json(&self) -> String {
        let mut s = String::new();
        let _ = write!(s, "{{\"uptime_nanos\":{},\"transports\":{{", self.uptime.as_nanos());
        for (i, (t, n)) in self.transports.iter().enumerate() {
            let _ = write!(s, "{}\"{}\":{n}", if i > 0 { "," } else { "" }, t.name());
        }
        s.push_str("},\"ops\":[");
        for (i, o) in self.ops.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let opcode = o.opcode.map_or("null".to_string(), |op| op.to_string());
            let _ = write!(
                s,
                "{{\"opcode\":{opcode},\"name\":\"{}\",\"count\":{},\"sum_nanos\":{},\"mean_nanos\":{},\
                 \"p50_nanos\":{},\"p99_nanos\":{},\"max_nanos\":{},\"buckets\":[",
                o.name(),
                o.count,
                o.sum_nanos,
                o.mean_nanos(),
                o.percentile_nanos(0.5),
                o.percentile_nanos(0.99),
                o.max_nanos
            );
            let mut first = true;
            for (b, &n) in o.buckets.iter().enumerate().filter(|(_, n)| **n > 0) {
                let _ = write!(s, "{}[{b},{n}]", if first { "" } else { "," });
                first = false;
            }
            s.push_str("]}");
        }
        s.push(']');
        if let Some(c) = &self.cache {
            let _ = write!(s, ",\"cache\":{}", c.json());
        }
        if let Some(f) = &self.figures {
            let _ = write!(s, ",\"{}\":{}", f.group, f.json());
        }
        s.push('}');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_counters_take_under_a_page_until_requests_come() {
        let s = Stats::untimed();
        assert!(
            std::mem::size_of_val(&*s.ops) < 4096,
            "{}",
            std::mem::size_of_val(&*s.ops)
        );
        s.record_untimed(1, Transport::Dev, 1);
        s.record(70, Transport::Ring, 5);
        let snap = s.snapshot();
        assert_eq!(snap.total_requests(), 2);
        assert_eq!(snap.ops.iter().map(|o| o.opcode).collect::<Vec<_>>(), [Some(1), None]);
        s.reset();
        assert_eq!(s.snapshot().total_requests(), 0);
    }

    #[test]
    fn transports_parse_and_display_as_the_cli_spells_them() {
        for t in Transport::ALL {
            assert_eq!(t.to_string().parse::<Transport>(), Ok(t));
        }
        assert_eq!("uring".parse::<Transport>(), Ok(Transport::Uring));
        assert!("io_uring".parse::<Transport>().is_err());
        assert_eq!(Transport::default(), Transport::Dev);
    }

    #[test]
    fn buckets_are_log2() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 1);
        assert_eq!(bucket_of(2), 2);
        assert_eq!(bucket_of(3), 2);
        assert_eq!(bucket_of(4), 3);
        assert_eq!(bucket_of(1023), 10);
        assert_eq!(bucket_of(1024), 11);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        for n in [1u64, 5, 999, 1 << 20, (1 << 40) + 3] {
            let (lo, hi) = bucket_range(bucket_of(n));
            assert!(lo <= n && n <= hi, "{n} in [{lo}, {hi}]");
        }
        assert_eq!(bucket_range(0), (0, 0));
        assert_eq!(bucket_range(63).1, u64::MAX);
    }

    #[test]
    fn counts_sum_max_mean() {
        let s = Stats::new();
        for n in [100, 200, 300, 400] {
            s.record(1, Transport::Dev, n);
        }
        s.record(26, Transport::Uring, 7);
        s.record(4096, Transport::Dev, 9);
        let snap = s.snapshot();
        assert_eq!(snap.ops.len(), 3);
        let lookup = &snap.ops[0];
        assert_eq!((lookup.opcode, lookup.name(), lookup.count), (Some(1), "LOOKUP", 4));
        assert_eq!(
            (lookup.sum_nanos, lookup.max_nanos, lookup.mean_nanos()),
            (1000, 400, 250)
        );
        assert_eq!(snap.ops[1].name(), "INIT");
        assert_eq!((snap.ops[2].opcode, snap.ops[2].name()), (None, "OTHER"));
        assert_eq!(snap.transports[0], (Transport::Dev, 5));
        assert_eq!(snap.transports[1], (Transport::Uring, 1));
        assert_eq!(snap.total_requests(), 6);
        s.reset();
        assert!(s.snapshot().ops.is_empty());
    }

    #[test]
    fn percentiles_stay_within_a_factor_of_two() {
        let s = Stats::new();
        // 990 fast requests around 1 µs, 10 slow ones around 1 ms.
        for i in 0..990 {
            s.record(3, Transport::Dev, 1000 + i % 7);
        }
        for i in 0..10 {
            s.record(3, Transport::Dev, 1_000_000 + i);
        }
        let op = &s.snapshot().ops[0];
        let p50 = op.percentile_nanos(0.5);
        let p99 = op.percentile_nanos(0.99);
        let p999 = op.percentile_nanos(0.999);
        assert!((512..=2047).contains(&p50), "p50 {p50}");
        assert!((512..=2047).contains(&p99), "p99 {p99}: 99% are fast");
        assert!((524_288..=1_000_009).contains(&p999), "p999 {p999}");
        assert_eq!(op.percentile_nanos(1.0), 1_000_009, "the top is capped at the max");
        assert!(op.percentile_nanos(0.0) >= 512);
    }

    #[test]
    fn percentile_of_one_value_and_of_nothing() {
        let op = OpStats {
            opcode: Some(1),
            count: 1,
            sum_nanos: 5000,
            max_nanos: 5000,
            buckets: {
                let mut b = [0; BUCKETS];
                b[bucket_of(5000)] = 1;
                b
            },
        };
        assert_eq!(op.percentile_nanos(0.5), 5000);
        let empty = OpStats {
            count: 0,
            sum_nanos: 0,
            max_nanos: 0,
            buckets: [0; BUCKETS],
            ..op
        };
        assert_eq!((empty.percentile_nanos(0.5), empty.mean_nanos()), (0, 0));
    }

    #[test]
    fn table_and_json() {
        let s = Stats::new();
        s.record(1, Transport::Dev, 1500);
        s.record(1, Transport::Dev, 2500);
        let snap = s.snapshot();
        let t = snap.table();
        assert!(t.lines().next().unwrap().contains("p99"));
        let row = t.lines().nth(1).unwrap();
        assert!(
            row.starts_with("LOOKUP") && row.contains(" 2 ") && row.contains("2.00µs"),
            "{row}"
        );
        assert!(t.contains("2 requests") && t.contains("dev=2"), "{t}");
        let j = snap.json();
        assert!(j.starts_with("{\"uptime_nanos\":") && j.ends_with("]}]}"), "{j}");
        assert!(
            j.contains("\"name\":\"LOOKUP\",\"count\":2,\"sum_nanos\":4000,\"mean_nanos\":2000"),
            "{j}"
        );
        assert!(j.contains("\"buckets\":[[11,1],[12,1]]"), "{j}");
        assert!(j.contains("\"dev\":2,\"uring\":0"), "{j}");
    }

    #[test]
    fn nanos_format() {
        assert_eq!(format_nanos(0), "0ns");
        assert_eq!(format_nanos(999), "999ns");
        assert_eq!(format_nanos(1234), "1.23µs");
        assert_eq!(format_nanos(12_345), "12.3µs");
        assert_eq!(format_nanos(123_456), "123µs");
        assert_eq!(format_nanos(2_500_000_000), "2.50s");
    }

    #[test]
    fn concurrent_records_all_count() {
        let s = std::sync::Arc::new(Stats::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000 {
                        s.record(15, Transport::Dev, i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let op = &s.snapshot().ops[0];
        assert_eq!(op.count, 40_000);
        assert_eq!(op.buckets.iter().sum::<u64>(), 40_000);
        assert_eq!(op.max_nanos, 9_999);
    }
}
