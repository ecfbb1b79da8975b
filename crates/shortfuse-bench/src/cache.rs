//! The `cache` suite: Table 4 of the Prefuse-SSHFS caching thesis, the cache micro-benchmarks, run
//! on shortfuse's caches and on a `moka::sync::Cache` configured as the
//! thesis did (LRU eviction, capacity in entries), in the same process
//! and run. No file system is involved: the cache structures alone.
//!
//! Rows, each the time of 1000 operations (µs, median of the repetitions):
//! - `cache_write`: 1000 pages of 128 KiB into an empty cache of 1000;
//! - `cache_overwrite`: 1000 new pages into the full cache (each evicts);
//! - `cache_read`: 1000 pages it holds; `cache_read_miss`: 1000 it does not;
//! - `metacache_*`: the same with attributes (a `stat`) by file name.
//!
//! Our side is what the caches use: `shortfuse::cache::page::PageStore`
//! for pages and `MetaCache` (name to node, node to attributes) for
//! metadata, each behind the mutex their users take per call; pages are
//! moved in (no copy), their buffers reused as they are evicted. moka
//! gets `Arc`s of the same pages (its values are cloned on every get)
//! and (file name, page) keys, as in the thesis, built before the clock
//! starts (an insert clones its key, a get borrows it). Ratios are moka's time over ours.
//! `policy_hits` rows compare the eviction policies' hit ratios on a
//! skewed trace with sequential scans mixed in.

use shortfuse::sync::Unpoison;
use std::hint::black_box;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moka::policy::EvictionPolicy;
use shortfuse::cache::page::{Page, PageStore, Policy};
use shortfuse::cache::MetaCache;
use shortfuse::{Attr, NodeId};

use crate::report::Figure;
use crate::samples::{Rng, Samples};
use crate::scale::Scale;

/// Entries in every cache, and operations per timed run (Table 4).
const ENTRIES: usize = 1000;
const PAGE: usize = 128 * 1024;

fn repeats(scale: Scale) -> usize {
    scale.pick(5, 30, 100)
}

pub fn describe(scale: Scale) -> String {
    format!(
        "Scale {}: Table 4 of the Prefuse-SSHFS caching thesis: {ENTRIES} operations on caches of {ENTRIES} entries (pages of {} KiB; metadata: attributes by name), repeated {} times (thesis: 100); value = µs per {ENTRIES} operations, the median run (thesis: the mean). `shortfuse/clock` is the default policy, `shortfuse/lru` exact LRU, `moka/lru` a moka::sync::Cache with LRU eviction as in the thesis; `x over moka` rows are moka's time over ours (higher is better; goal: 2). The thesis measured moka at 928 (write), 1041 (overwrite), 223 (read), 155 (read miss) µs for pages and 1162, 1192, 266, 185 µs for metadata. `policy_hits` rows: hit ratio (%) of a {ENTRIES}-page cache on a skewed trace with scans.",
        scale.name(),
        PAGE >> 10,
        repeats(scale)
    )
}

/// One implementation under test: the four Table 4 operations.
trait Bench {
    /// An empty cache.
    fn reset(&mut self);
    fn write(&mut self, key: usize);
    fn read(&mut self, key: usize) -> bool;
}

struct Pages {
    store: Mutex<PageStore>,
    policy: Policy,
    /// Page buffers to move in (refilled from evicted pages).
    pool: Vec<Vec<u8>>,
}

impl Pages {
    fn new(policy: Policy) -> Pages {
        Pages {
            store: Mutex::new(PageStore::new(policy, ENTRIES)),
            policy,
            pool: (0..ENTRIES).map(|_| vec![0u8; PAGE]).collect(),
        }
    }
}

impl Bench for Pages {
    fn reset(&mut self) {
        let mut s = self.store.lock().unpoison();
        for k in s.keys() {
            if let Some(p) = s.remove(k) {
                self.pool.push(p.data);
            }
        }
        *s = PageStore::new(self.policy, ENTRIES);
    }

    #[inline]
    fn write(&mut self, key: usize) {
        let data = self.pool.pop().unwrap_or_else(|| vec![0u8; PAGE]);
        let evicted = self.store.lock().unpoison().insert(Page::new((1, key as u64), data));
        if let Some(p) = evicted {
            self.pool.push(p.data);
        }
    }

    #[inline]
    fn read(&mut self, key: usize) -> bool {
        let mut s = self.store.lock().unpoison();
        s.get((1, key as u64)).map(|p| black_box(p.data.len())).is_some()
    }
}

/// The thesis's page: data and how much of it is valid.
struct MokaPage {
    data: Vec<u8>,
    size: usize,
}

struct MokaPages {
    cache: moka::sync::Cache<(String, u64), Arc<MokaPage>>,
    pool: Vec<Arc<MokaPage>>,
    /// (file name, page number), built before the clock starts: an insert
    /// clones one (the key is owned), a get borrows it.
    keys: Vec<(String, u64)>,
}

fn moka_cache<K, V>() -> moka::sync::Cache<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    moka::sync::Cache::builder()
        .max_capacity(ENTRIES as u64)
        .eviction_policy(EvictionPolicy::lru())
        .build()
}

impl MokaPages {
    fn new() -> MokaPages {
        MokaPages {
            cache: moka_cache(),
            pool: (0..ENTRIES)
                .map(|_| {
                    Arc::new(MokaPage {
                        data: vec![0u8; PAGE],
                        size: PAGE,
                    })
                })
                .collect(),
            keys: (0..2 * ENTRIES as u64)
                .map(|i| ("/mnt/sftp/file".to_string(), i))
                .collect(),
        }
    }
}

impl Bench for MokaPages {
    fn reset(&mut self) {
        self.cache = moka_cache();
    }

    #[inline]
    fn write(&mut self, key: usize) {
        let page = self.pool[key % ENTRIES].clone();
        self.cache.insert(self.keys[key].clone(), page);
    }

    #[inline]
    fn read(&mut self, key: usize) -> bool {
        self.cache
            .get(&self.keys[key])
            .map(|p| black_box(p.size.min(p.data.len())))
            .is_some()
    }
}

fn names() -> Vec<String> {
    (0..2 * ENTRIES).map(|i| format!("file-{i:06}")).collect()
}

fn attr(i: usize) -> Attr {
    Attr {
        ino: i as u64 + 2,
        size: i as u64 * 4096,
        mode: libc::S_IFREG | 0o644,
        nlink: 1,
        ..Attr::default()
    }
}

struct Meta {
    cache: Mutex<MetaCache>,
    policy: Policy,
    names: Vec<String>,
    expires: u64,
}

impl Meta {
    fn new(policy: Policy) -> Meta {
        Meta {
            cache: Mutex::new(MetaCache::new(policy, ENTRIES)),
            policy,
            names: names(),
            expires: MetaCache::expires_in(Duration::from_secs(3600)),
        }
    }
}

impl Bench for Meta {
    fn reset(&mut self) {
        *self.cache.lock().unpoison() = MetaCache::new(self.policy, ENTRIES);
    }

    #[inline]
    fn write(&mut self, key: usize) {
        let a = attr(key);
        let mut c = self.cache.lock().unpoison();
        c.set_name(1, self.names[key].as_bytes(), NodeId(a.ino), 0, self.expires);
        c.set_attr(a.ino, a, self.expires);
    }

    #[inline]
    fn read(&mut self, key: usize) -> bool {
        let now = MetaCache::now();
        let mut c = self.cache.lock().unpoison();
        let Some((node, _)) = c.name(1, self.names[key].as_bytes(), now) else {
            return false;
        };
        c.attr(node.0, now).map(|a| black_box(a.size)).is_some()
    }
}

struct MokaMeta {
    cache: moka::sync::Cache<String, Attr>,
    paths: Vec<String>,
}

impl Bench for MokaMeta {
    fn reset(&mut self) {
        self.cache = moka_cache();
    }

    #[inline]
    fn write(&mut self, key: usize) {
        self.cache.insert(self.paths[key].clone(), attr(key));
    }

    #[inline]
    fn read(&mut self, key: usize) -> bool {
        self.cache
            .get(self.paths[key].as_str())
            .map(|a| black_box(a.size))
            .is_some()
    }
}

/// µs for each of the four operations, `repeats` times each.
fn table4(b: &mut dyn Bench, repeats: usize, progress: &mut dyn FnMut(&str), what: &str) -> io::Result<[Samples; 4]> {
    let mut out: [Samples; 4] = Default::default();
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_nanos() as u64
    };
    for r in 0..repeats {
        if r % 10 == 0 {
            progress(&format!("{what} {r}/{repeats}"));
        }
        b.reset();
        out[0].0.push(time(&mut || (0..ENTRIES).for_each(|k| b.write(k))));
        out[1]
            .0
            .push(time(&mut || (ENTRIES..2 * ENTRIES).for_each(|k| b.write(k))));
        let mut hits = 0;
        out[2].0.push(time(&mut || {
            (ENTRIES..2 * ENTRIES).for_each(|k| hits += b.read(k) as usize)
        }));
        let mut misses = 0;
        out[3]
            .0
            .push(time(&mut || (0..ENTRIES).for_each(|k| misses += !b.read(k) as usize)));
        if hits != ENTRIES || misses != ENTRIES {
            return Err(io::Error::other(format!(
                "{what}: {hits} of {ENTRIES} reads hit and {misses} missed where all should have"
            )));
        }
    }
    Ok(out)
}

/// Hit ratio (%) of a page store on a trace: 80% of the accesses to a
/// hot 20% of 4x the cache's pages, the rest uniform, and every 5000
/// accesses a scan of 2x the cache size (a big file read once).
fn hit_ratio(policy: Policy) -> f64 {
    let mut s = PageStore::new(policy, ENTRIES);
    let mut rng = Rng::new(7);
    let span = 4 * ENTRIES as u64;
    let (mut hits, mut total) = (0u64, 0u64);
    let mut scan = 1_000_000u64;
    for i in 0..200_000u64 {
        let key = if i % 5000 < 2 * ENTRIES as u64 && i >= 5000 {
            scan += 1;
            scan
        } else if rng.below(100) < 80 {
            rng.below(span / 5)
        } else {
            rng.below(span)
        };
        total += 1;
        if s.get((1, key)).is_some() {
            hits += 1;
        } else {
            s.insert(Page::new((1, key), Vec::new()));
        }
    }
    100.0 * hits as f64 / total as f64
}

pub fn run(scale: Scale, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<Figure>> {
    const OPS: [&str; 4] = ["write", "overwrite", "read", "read_miss"];
    let repeats = repeats(scale);
    let mut out = Vec::new();
    let mut means: Vec<(String, [f64; 4])> = Vec::new();
    let paths: Vec<String> = names().iter().map(|n| format!("/mnt/sftp/dir/{n}")).collect();
    let mut cases: Vec<(&str, &str, Box<dyn Bench>)> = vec![
        ("cache", "shortfuse/clock", Box::new(Pages::new(Policy::Clock))),
        ("cache", "shortfuse/lru", Box::new(Pages::new(Policy::Lru))),
        ("cache", "moka/lru", Box::new(MokaPages::new())),
        ("metacache", "shortfuse/clock", Box::new(Meta::new(Policy::Clock))),
        ("metacache", "shortfuse/lru", Box::new(Meta::new(Policy::Lru))),
        (
            "metacache",
            "moka/lru",
            Box::new(MokaMeta {
                cache: moka_cache(),
                paths,
            }),
        ),
    ];
    for (kind, who, b) in cases.iter_mut() {
        let samples = table4(b.as_mut(), repeats, progress, &format!("{kind} {who}"))?;
        let mut m = [0.0; 4];
        for (i, s) in samples.into_iter().enumerate() {
            // A sample is one run of 1000 operations: µs per 1000. The
            // median, not the mean: on a busy machine a run that loses the
            // CPU for a time slice would weigh more than the rest.
            let mut f = s.figure(&format!("{kind}_{} {who}", OPS[i]));
            f.value = f.p50.unwrap_or(f.value);
            m[i] = f.value;
            out.push(f);
        }
        means.push((format!("{kind} {who}"), m));
    }
    for kind in ["cache", "metacache"] {
        let find = |who: &str| means.iter().find(|(n, _)| *n == format!("{kind} {who}")).map(|m| m.1);
        let (Some(ours), Some(moka)) = (find("shortfuse/clock"), find("moka/lru")) else {
            continue;
        };
        for i in 0..4 {
            out.push(Figure::rate(
                format!("{kind}_{} x over moka", OPS[i]),
                "x",
                moka[i] / ours[i],
                repeats as u64,
            ));
        }
    }
    progress("policy hit ratios");
    for policy in [Policy::Clock, Policy::Lru] {
        out.push(Figure::rate(
            format!("policy_hits {}", policy.name()),
            "%",
            hit_ratio(policy),
            1,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_implementation_hits_and_misses_as_table_4_expects() {
        let mut quiet = |_: &str| {};
        for b in [
            Box::new(Pages::new(Policy::Clock)) as Box<dyn Bench>,
            Box::new(Meta::new(Policy::Lru)),
            Box::new(MokaPages::new()),
        ]
        .iter_mut()
        {
            let s = table4(b.as_mut(), 1, &mut quiet, "test").unwrap();
            assert!(s.iter().all(|s| s.len() == 1));
        }
        let (c, l) = (hit_ratio(Policy::Clock), hit_ratio(Policy::Lru));
        assert!(c > 10.0 && c < 100.0 && l > 10.0 && l < 100.0, "{c} {l}");
    }
}
