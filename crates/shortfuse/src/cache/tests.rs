use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;

use std::ffi::OsStr;
use std::sync::atomic::Ordering;

use super::layer::readable;
use super::*;
use crate::errno::Errno;

/// Files in memory, counting the data calls that reach them.
#[derive(Default)]
struct Backing {
    files: Mutex<HashMap<u64, (Vec<u8>, i64)>>,
    reads: AtomicUsize,
    writes: AtomicUsize,
    /// Names in the root: name -> node.
    names: Mutex<HashMap<Vec<u8>, u64>>,
    lookups: AtomicUsize,
    getattrs: AtomicUsize,
    /// Lookups handed out minus those forgotten, per node.
    held: Mutex<HashMap<u64, i64>>,
    /// Says it has threads of its own ([`Filesystem::answers_later`]).
    threads: bool,
    /// When set, a read past the first byte says so on the sender after
    /// copying its data, then waits on the receiver before returning.
    gate: Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
    /// Writes running now, and the most seen at once.
    writing: AtomicUsize,
    most_writing: AtomicUsize,
    /// When set, a write waits (a few seconds at most) for another to
    /// start before it returns, so writes made at once are seen at once.
    await_company: bool,
    /// When set, a write says so on the sender, then waits on the
    /// receiver (until its sender is gone) before it does anything.
    write_gate: Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
    /// Every write fails with EIO.
    fail_writes: bool,
}

impl Backing {
    fn with(node: u64, data: &[u8]) -> Backing {
        let b = Backing::default();
        b.files.lock().unwrap().insert(node, (data.to_vec(), 1));
        b
    }

    fn data(&self, node: u64) -> Vec<u8> {
        self.files.lock().unwrap()[&node].0.clone()
    }

    /// A change made behind the cache's back.
    fn replace(&self, node: u64, data: &[u8]) {
        let mut f = self.files.lock().unwrap();
        let e = f.get_mut(&node).unwrap();
        e.0 = data.to_vec();
        e.1 += 1;
    }
}

/// Counts a write as over when dropped.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Filesystem for Backing {
    fn lookup(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        assert_eq!(parent, NodeId::ROOT);
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let node = *self
            .names
            .lock()
            .unwrap()
            .get(name.as_encoded_bytes())
            .ok_or(Errno::ENOENT)?;
        *self.held.lock().unwrap().entry(node).or_default() += 1;
        let attr = self.getattr(req, NodeId(node), None)?;
        Ok(Entry::new(NodeId(node), attr))
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        *self.held.lock().unwrap().entry(node.0).or_default() -= nlookup as i64;
    }

    fn unlink(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<()> {
        assert_eq!(parent, NodeId::ROOT);
        self.names
            .lock()
            .unwrap()
            .remove(name.as_encoded_bytes())
            .map(drop)
            .ok_or(Errno::ENOENT)
    }

    fn getattr(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>) -> Result<Attr> {
        self.getattrs.fetch_add(1, Ordering::Relaxed);
        let f = self.files.lock().unwrap();
        let (d, mtime) = f.get(&node.0).ok_or(Errno::ENOENT)?;
        Ok(Attr {
            ino: node.0,
            size: d.len() as u64,
            mtime: Timestamp { sec: *mtime, nsec: 0 },
            mode: libc::S_IFREG | 0o644,
            ..Attr::default()
        })
    }

    fn setattr(&self, req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        if let Some(size) = set.size {
            let mut f = self.files.lock().unwrap();
            let e = f.get_mut(&node.0).ok_or(Errno::ENOENT)?;
            e.0.resize(size as usize, 0);
            e.1 += 1;
        }
        if let Some(SetTime::At(t)) = set.mtime {
            self.files.lock().unwrap().get_mut(&node.0).ok_or(Errno::ENOENT)?.1 = t.sec;
        }
        self.getattr(req, node, None)
    }

    fn read(&self, _req: &Request, node: NodeId, _fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let n = {
            let f = self.files.lock().unwrap();
            let d = &f.get(&node.0).ok_or(Errno::ENOENT)?.0;
            let start = (offset as usize).min(d.len());
            let n = (d.len() - start).min(buf.len());
            buf[..n].copy_from_slice(&d[start..start + n]);
            n
        };
        if offset > 0 {
            if let Some((copied, go)) = &*self.gate.lock().unwrap() {
                copied.send(()).unwrap();
                go.recv().unwrap();
            }
        }
        Ok(n)
    }

    fn answers_later(&self) -> bool {
        self.threads
    }

    fn write(&self, _req: &Request, node: NodeId, _fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if let Some((entered, go)) = &*self.write_gate.lock().unwrap() {
            let _ = entered.send(());
            let _ = go.recv();
        }
        if self.fail_writes {
            return Err(Errno::EIO);
        }
        let now = self.writing.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_writing.fetch_max(now, Ordering::SeqCst);
        if self.await_company {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while self.most_writing.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let _done = Leave(&self.writing);
        let mut f = self.files.lock().unwrap();
        let e = f.get_mut(&node.0).ok_or(Errno::ENOENT)?;
        let end = args.offset as usize + data.len();
        if e.0.len() < end {
            e.0.resize(end, 0);
        }
        e.0[args.offset as usize..end].copy_from_slice(data);
        e.1 += 1;
        Ok(data.len())
    }
}

const PS: usize = 4096;
const R: Request = Request {
    unique: 1,
    uid: 0,
    gid: 0,
    pid: 1,
};
const N: NodeId = NodeId(7);
const FH: FileHandle = FileHandle(1);

fn cached(b: Backing, pages: usize, policy: Policy, readahead: usize) -> CachedFs<Backing> {
    let config = CacheConfig {
        page_size: PS,
        capacity: pages * PS,
        policy,
        readahead,
        ..CacheConfig::default()
    };
    CachedFs::new(Arc::new(b), config).unwrap()
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

fn read(fs: &CachedFs<Backing>, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let n = fs.read(&R, N, FH, off, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// The first `n` pages, read one at a time from the start.
fn read_pages_in_order(fs: &CachedFs<Backing>, n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| read(fs, (i * PS) as u64, PS)).collect()
}

#[test]
fn reads_hit_after_the_first_and_clip_at_eof() {
    let data = pattern(10 * PS + 100);
    let fs = cached(Backing::with(7, &data), 64, Policy::Clock, 1);
    fs.open(&R, N, OpenFlags::RDONLY).unwrap();
    assert_eq!(read(&fs, 100, 3 * PS), data[100..100 + 3 * PS]);
    let calls = fs.inner().reads.load(Ordering::Relaxed);
    assert_eq!(read(&fs, 200, 2 * PS), data[200..200 + 2 * PS]);
    assert_eq!(
        fs.inner().reads.load(Ordering::Relaxed),
        calls,
        "a cached range went to the inner fs"
    );
    assert_eq!(read(&fs, 10 * PS as u64, PS), data[10 * PS..]);
    assert_eq!(read(&fs, 10 * PS as u64 + 100, PS), b"");
    assert_eq!(read(&fs, 20 * PS as u64, PS), b"");
    assert!(fs.stats().hits.load(Ordering::Relaxed) > 0);
}

#[test]
fn sequential_reads_fetch_ahead() {
    let data = pattern(64 * PS);
    let fs = cached(Backing::with(7, &data), 64, Policy::Lru, 8);
    fs.open(&R, N, OpenFlags::RDONLY).unwrap();
    assert!(read_pages_in_order(&fs, 64) == data);
    assert_eq!(fs.inner().reads.load(Ordering::Relaxed), 8, "8 pages per inner read");
    // Random reads do not fetch ahead.
    let fs = cached(Backing::with(7, &data), 64, Policy::Lru, 8);
    for i in [40u64, 3, 17] {
        read(&fs, i * PS as u64 + 5, 10);
    }
    assert_eq!(fs.stats().bytes_in.load(Ordering::Relaxed), 3 * PS as u64);
}

#[test]
fn writes_are_written_back_on_flush_fsync_release_and_destroy() {
    let data = pattern(3 * PS);
    let fs = cached(Backing::with(7, &data), 16, Policy::Clock, 1);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let args = |offset| WriteArgs {
        offset,
        ..WriteArgs::default()
    };
    fs.write(&R, N, FH, b"hello", &args(10)).unwrap();
    // Past the end: the file grows, the gap reads as zeros.
    fs.write(&R, N, FH, b"tail", &args(5 * PS as u64)).unwrap();
    assert_eq!(
        fs.inner().writes.load(Ordering::Relaxed),
        0,
        "write-back, not write-through"
    );
    assert_eq!(fs.getattr(&R, N, None).unwrap().size, 5 * PS as u64 + 4);
    let mut want = data.clone();
    want[10..15].copy_from_slice(b"hello");
    want.resize(5 * PS, 0);
    want.extend_from_slice(b"tail");
    assert!(read(&fs, 0, 6 * PS) == want, "read through the cache before write-back");
    fs.flush(&R, N, FH, 0).unwrap();
    assert!(fs.inner().data(7) == want, "inner copy after flush");
    let w = fs.inner().writes.load(Ordering::Relaxed);
    fs.fsync(&R, N, FH, false).unwrap();
    assert_eq!(
        fs.inner().writes.load(Ordering::Relaxed),
        w,
        "clean pages written again"
    );
    fs.write(&R, N, FH, b"X", &args(0)).unwrap();
    fs.release(&R, N, FH, &ReleaseArgs::default()).unwrap();
    assert_eq!(fs.inner().data(7)[0], b'X');
    fs.write(&R, N, FH, b"Y", &args(1)).unwrap();
    fs.destroy();
    assert_eq!(fs.inner().data(7)[1], b'Y');
}

#[test]
fn truncate_and_remote_changes_invalidate() {
    let data = pattern(4 * PS);
    let fs = cached(Backing::with(7, &data), 16, Policy::Clock, 4);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    assert_eq!(read(&fs, 0, 4 * PS), data);
    fs.write(
        &R,
        N,
        FH,
        b"dirty",
        &WriteArgs {
            offset: 3 * PS as u64,
            ..Default::default()
        },
    )
    .unwrap();
    let set = SetAttr {
        size: Some(PS as u64 + 1),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&R, N, &set).unwrap().size, PS as u64 + 1);
    assert_eq!(read(&fs, 0, 4 * PS), data[..PS + 1]);
    // Growing again: zeros after the old end, not the end of file.
    let grow = SetAttr {
        size: Some(2 * PS as u64 + 5),
        ..SetAttr::default()
    };
    fs.setattr(&R, N, &grow).unwrap();
    let mut want = data[..PS + 1].to_vec();
    want.resize(2 * PS + 5, 0);
    assert!(read(&fs, 0, 4 * PS) == want);
    fs.setattr(&R, N, &set).unwrap();
    fs.release(&R, N, FH, &ReleaseArgs::default()).unwrap();
    // Changed behind the cache: still cached until reopened.
    fs.inner().replace(7, b"new contents");
    fs.open(&R, N, OpenFlags::RDONLY).unwrap();
    assert_eq!(read(&fs, 0, PS), b"new contents");
    assert!(fs.stats().invalidations.load(Ordering::Relaxed) > 0);
}

#[test]
fn eviction_writes_dirty_pages_back() {
    for policy in [Policy::Clock, Policy::Lru] {
        let fs = cached(Backing::with(7, b""), 4, policy, 1);
        fs.open(&R, N, OpenFlags::RDWR).unwrap();
        let data = pattern(32 * PS);
        for (i, page) in data.chunks(PS).enumerate() {
            fs.write(
                &R,
                N,
                FH,
                page,
                &WriteArgs {
                    offset: (i * PS) as u64,
                    ..Default::default()
                },
            )
            .unwrap();
        }
        assert!(fs.stats().evictions.load(Ordering::Relaxed) >= 28, "{policy:?}");
        assert!(read(&fs, 0, 32 * PS) == data, "{policy:?}: read back");
        fs.flush(&R, N, FH, 0).unwrap();
        assert!(fs.inner().data(7) == data, "{policy:?}: inner copy");
    }
}

#[test]
fn bad_configs_are_refused() {
    let bad = |page_size, capacity, readahead| {
        CachedFs::new(
            Arc::new(Backing::default()),
            CacheConfig {
                page_size,
                capacity,
                policy: Policy::Lru,
                readahead,
                ..CacheConfig::default()
            },
        )
        .is_err()
    };
    assert!(bad(1000, 1 << 20, 1));
    assert!(bad(4096, 100, 1));
    assert!(bad(4096, 1 << 20, 0));
    assert!(!bad(4096, 1 << 20, 1));
}

#[test]
fn metadata_is_cached_and_lookups_are_given_back_in_order() {
    let b = Backing::with(7, b"seven");
    b.names.lock().unwrap().insert(b"f".to_vec(), 7);
    let fs = cached(b, 16, Policy::Clock, 1);
    let name = OsStr::new("f");
    let e = fs.lookup(&R, NodeId::ROOT, name).unwrap();
    assert_eq!((e.node, e.attr.size), (N, 5));
    for _ in 0..3 {
        assert_eq!(fs.lookup(&R, NodeId::ROOT, name).unwrap().node, N);
        assert_eq!(fs.getattr(&R, N, None).unwrap().size, 5);
    }
    assert_eq!(fs.inner().lookups.load(Ordering::Relaxed), 1, "names from the cache");
    assert_eq!(
        fs.inner().getattrs.load(Ordering::Relaxed),
        1,
        "attributes from the cache"
    );
    assert!(fs.stats().meta_hits.load(Ordering::Relaxed) >= 6);
    // The kernel holds 4 lookups, the inner file system handed out 1: the
    // cache's 3 are given back first, the inner one last.
    fs.forget(N, 2);
    assert_eq!(fs.inner().held.lock().unwrap()[&7], 1);
    fs.forget(N, 1);
    assert_eq!(fs.inner().held.lock().unwrap()[&7], 1);
    fs.forget(N, 1);
    assert_eq!(fs.inner().held.lock().unwrap()[&7], 0);
    // Forgotten by the inner file system: not answered from the cache again.
    fs.lookup(&R, NodeId::ROOT, name).unwrap();
    assert_eq!(fs.inner().lookups.load(Ordering::Relaxed), 2);
    // A write drops the attributes; an unlink the name.
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let g = fs.inner().getattrs.load(Ordering::Relaxed);
    fs.write(&R, N, FH, b"longer now", &WriteArgs::default()).unwrap();
    fs.release(&R, N, FH, &ReleaseArgs::default()).unwrap();
    assert_eq!(fs.getattr(&R, N, None).unwrap().size, 10);
    assert!(fs.inner().getattrs.load(Ordering::Relaxed) > g);
    fs.unlink(&R, NodeId::ROOT, name).unwrap();
    assert_eq!(fs.lookup(&R, NodeId::ROOT, name).unwrap_err(), Errno::ENOENT);
}

#[test]
fn flush_all_writes_back_what_is_dirty_when_the_daemon_stops() {
    let fs = cached(Backing::with(7, b""), 16, Policy::Lru, 1);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    fs.write(&R, N, FH, &pattern(3 * PS), &WriteArgs::default()).unwrap();
    assert_eq!(fs.stats().dirty_bytes.load(Ordering::Relaxed), 3 * PS as u64);
    assert!(fs.inner().data(7).is_empty());
    fs.flush_all().unwrap();
    assert!(fs.inner().data(7) == pattern(3 * PS));
    assert_eq!(fs.stats().dirty_bytes.load(Ordering::Relaxed), 0);
}

#[test]
fn concurrent_readers_and_writers_leave_the_cache_equal_to_the_file() {
    let fs = Arc::new(cached(Backing::with(7, &vec![0u8; 16 * PS]), 4, Policy::Clock, 2));
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut rng = t * 7919 + 1;
                for i in 0..300u64 {
                    rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let page = (rng >> 33) % 16;
                    if t % 2 == 0 {
                        let fill = [(t * 64 + i % 64) as u8 + 1; PS];
                        let args = WriteArgs {
                            offset: page * PS as u64,
                            ..WriteArgs::default()
                        };
                        fs.write(&R, N, FH, &fill, &args).unwrap();
                    } else {
                        let got = read(&fs, page * PS as u64, PS);
                        assert_eq!(got.len(), PS);
                        assert!(got.iter().all(|&b| b == got[0]), "page {page} torn");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    fs.flush(&R, N, FH, 0).unwrap();
    let inner = fs.inner().data(7);
    assert!(read(&fs, 0, 16 * PS) == inner, "the cache and the file differ");
}

#[test]
fn write_only_opens_are_made_readable_unless_refused() {
    let asked = Mutex::new(Vec::new());
    let wa = OpenFlags::WRONLY | OpenFlags::APPEND;
    let rwa = OpenFlags::RDWR | OpenFlags::APPEND;
    let open = |refuse_read: bool| {
        asked.lock().unwrap().clear();
        readable(wa, |f| {
            asked.lock().unwrap().push(f);
            if refuse_read && f.access_mode() == OpenFlags::RDWR {
                Err(Errno::EACCES)
            } else {
                Ok(f)
            }
        })
    };
    assert_eq!(open(false).unwrap(), (rwa, false));
    assert_eq!(open(true).unwrap(), (wa, true));
    assert_eq!(*asked.lock().unwrap(), [rwa, wa]);
    assert_eq!(readable(OpenFlags::RDONLY, Ok).unwrap(), (OpenFlags::RDONLY, false));
    assert_eq!(
        readable(OpenFlags::WRONLY, |_| Err::<OpenFlags, _>(Errno::ENOENT)),
        Err(Errno::ENOENT)
    );
}

#[test]
fn held_writes_move_mtime_and_an_mtime_set_meanwhile_stays() {
    let fs = cached(Backing::with(7, &pattern(PS)), 16, Policy::Clock, 1);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let before = Timestamp::now();
    fs.write(&R, N, FH, b"x", &WriteArgs::default()).unwrap();
    let a = fs.getattr(&R, N, None).unwrap();
    assert!(
        a.mtime >= before && a.ctime >= before,
        "a held write shows in mtime and ctime: {a:?}"
    );
    // utimensat while the write is held: the write-back must not move the
    // mtime set afterwards.
    let set = SetAttr {
        mtime: Some(SetTime::At(Timestamp { sec: 1000, nsec: 0 })),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&R, N, &set).unwrap().mtime.sec, 1000);
    fs.release(&R, N, FH, &ReleaseArgs::default()).unwrap();
    assert_eq!(fs.inner().data(7)[0], b'x');
    assert_eq!(fs.inner().getattr(&R, N, None).unwrap().mtime.sec, 1000);
    assert_eq!(fs.getattr(&R, N, None).unwrap().mtime.sec, 1000);
}

#[test]
fn sequential_reads_over_a_threaded_fs_fetch_the_next_window_before_it_is_asked_for() {
    let data = pattern(64 * PS);
    let b = Backing {
        threads: true,
        ..Backing::with(7, &data)
    };
    let fs = cached(b, 64, Policy::Lru, 8);
    fs.open(&R, N, OpenFlags::RDONLY).unwrap();
    assert_eq!(read(&fs, 0, PS), data[..PS]);
    // Release waits for the reads ahead made through the handle.
    fs.release(&R, N, FH, &ReleaseArgs::default()).unwrap();
    assert_eq!(
        fs.inner().reads.load(Ordering::Relaxed),
        2,
        "pages 8..16 were not read ahead of the reader"
    );
    // Read whole, each window goes to the file system once.
    let b = Backing {
        threads: true,
        ..Backing::with(7, &data)
    };
    let fs = cached(b, 64, Policy::Lru, 8);
    fs.open(&R, N, OpenFlags::RDONLY).unwrap();
    assert!(read_pages_in_order(&fs, 64) == data);
    assert_eq!(fs.inner().reads.load(Ordering::Relaxed), 8, "8 pages per inner read");
    assert_eq!(fs.stats().bytes_in.load(Ordering::Relaxed), 64 * PS as u64);
}

#[test]
fn a_window_read_ahead_before_a_truncation_is_not_kept() {
    let data = pattern(16 * PS);
    let (copied_tx, copied) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let b = Backing {
        threads: true,
        gate: Mutex::new(Some((copied_tx, go_rx))),
        ..Backing::with(7, &data)
    };
    let fs = cached(b, 64, Policy::Lru, 8);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    assert_eq!(read(&fs, 0, PS), data[..PS]);
    // The read ahead of pages 8..16 holds the old data now.
    copied
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("pages 8..16 were not read ahead");
    for size in [8 * PS, 16 * PS] {
        let set = SetAttr {
            size: Some(size as u64),
            ..SetAttr::default()
        };
        fs.setattr(&R, N, &set).unwrap();
    }
    go.send(()).unwrap();
    *fs.inner().gate.lock().unwrap() = None;
    let got = read(&fs, 8 * PS as u64, 2 * PS);
    assert_eq!(got.len(), 2 * PS);
    assert!(got.iter().all(|&b| b == 0), "stale pages were kept");
}

#[test]
fn consecutive_dirty_pages_are_written_back_in_one_call() {
    let fs = cached(Backing::with(7, &vec![0u8; 16 * PS]), 64, Policy::Clock, 1);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let data = pattern(16 * PS);
    for i in 0..16 {
        let args = WriteArgs {
            offset: (i * PS) as u64,
            ..WriteArgs::default()
        };
        fs.write(&R, N, FH, &data[i * PS..(i + 1) * PS], &args).unwrap();
    }
    fs.flush(&R, N, FH, 0).unwrap();
    assert_eq!(fs.inner().writes.load(Ordering::Relaxed), 2, "16 pages in runs of 8");
    assert!(fs.inner().data(7) == data);
    assert_eq!(fs.stats().dirty_bytes.load(Ordering::Relaxed), 0);
}

#[test]
fn a_write_back_over_a_threaded_fs_keeps_several_calls_in_flight() {
    let b = Backing {
        threads: true,
        await_company: true,
        ..Backing::with(7, &vec![0u8; 64 * PS])
    };
    let fs = cached(b, 64, Policy::Clock, 1);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let data = pattern(64 * PS);
    write_pages(&fs, &data, 0..64).unwrap();
    fs.flush(&R, N, FH, 0).unwrap();
    assert!(fs.inner().data(7) == data);
    assert_eq!(fs.inner().writes.load(Ordering::Relaxed), 8, "64 pages in calls of 8");
    assert!(
        fs.inner().most_writing.load(Ordering::Relaxed) >= 2,
        "one write call at a time"
    );
    assert_eq!(fs.stats().dirty_bytes.load(Ordering::Relaxed), 0);
    assert_eq!(fs.stats().bytes_out.load(Ordering::Relaxed), 64 * PS as u64);
}

/// Writes pages `from..to` of [`N`] one at a time, as `cp` does.
fn write_pages(fs: &CachedFs<Backing>, data: &[u8], pages: std::ops::Range<usize>) -> Result<()> {
    for i in pages {
        let args = WriteArgs {
            offset: (i * PS) as u64,
            ..WriteArgs::default()
        };
        fs.write(&R, N, FH, &data[i * PS..(i + 1) * PS], &args)?;
    }
    Ok(())
}

/// The first two runs of 8 pages of `data` reached the file system before
/// any flush: the writer waited for them, having 4 more out.
fn assert_first_runs_written_behind(fs: &CachedFs<Backing>, data: &[u8]) {
    let early = fs.inner().data(7);
    assert!(
        early.len() >= 16 * PS && early[..16 * PS] == data[..16 * PS],
        "{} bytes reached the file system before the flush",
        early.len()
    );
}

#[test]
fn a_sequential_writer_has_its_runs_written_behind_it() {
    let b = Backing {
        threads: true,
        ..Backing::with(7, &[])
    };
    // Room for all 48 pages: nothing is evicted, so without writes behind
    // nothing would reach the file system before the flush.
    let fs = cached(b, 64, Policy::Clock, 1);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let data = pattern(48 * PS);
    write_pages(&fs, &data, 0..48).unwrap();
    // Six runs of 8 pages went out; with at most 4 (and the one just
    // started) out at once, the writer waited for the first two.
    assert_first_runs_written_behind(&fs, &data);
    assert_eq!(
        fs.getattr(&R, N, None).unwrap().size,
        48 * PS as u64,
        "the cache's size"
    );
    fs.flush(&R, N, FH, 0).unwrap();
    assert!(fs.inner().data(7) == data);
    assert_eq!(fs.inner().writes.load(Ordering::Relaxed), 6, "48 pages in runs of 8");
    assert_eq!(fs.stats().dirty_bytes.load(Ordering::Relaxed), 0);
    assert_eq!(fs.stats().bytes_out.load(Ordering::Relaxed), 48 * PS as u64);
}

#[test]
fn writes_across_page_boundaries_have_their_runs_written_behind_too() {
    let b = Backing {
        threads: true,
        ..Backing::with(7, &[])
    };
    let fs = cached(b, 64, Policy::Clock, 1);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let data = pattern(48 * PS);
    // Writes of a page and a half: few of them end on a run's last byte.
    for (i, piece) in data.chunks(PS * 3 / 2).enumerate() {
        let args = WriteArgs {
            offset: (i * PS * 3 / 2) as u64,
            ..WriteArgs::default()
        };
        fs.write(&R, N, FH, piece, &args).unwrap();
    }
    assert_first_runs_written_behind(&fs, &data);
    fs.flush(&R, N, FH, 0).unwrap();
    assert!(fs.inner().data(7) == data);
    assert_eq!(fs.inner().writes.load(Ordering::Relaxed), 6, "48 pages in runs of 8");
}

#[test]
fn runs_written_behind_hold_no_lock_while_they_are_out() {
    let (entered, at_gate) = std::sync::mpsc::channel();
    let (open_gate, go) = std::sync::mpsc::channel::<()>();
    let b = Backing {
        threads: true,
        write_gate: Mutex::new(Some((entered, go))),
        ..Backing::with(7, &[])
    };
    b.files.lock().unwrap().insert(8, (pattern(PS), 1));
    // Smaller than what is written: pages leave the cache while written.
    let fs = Arc::new(cached(b, 32, Policy::Clock, 1));
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let data = pattern(48 * PS);
    let writer = {
        let (fs, data) = (fs.clone(), data.clone());
        std::thread::spawn(move || write_pages(&fs, &data, 0..48))
    };
    at_gate.recv().unwrap();
    // A write is held in the file system: another file's read must not
    // wait for it.
    let (read_done, got) = std::sync::mpsc::channel();
    let reader = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; PS];
            let _ = read_done.send(fs.read(&R, NodeId(8), FH, 0, &mut buf).map(|n| buf[..n].to_vec()));
        })
    };
    let read = got.recv_timeout(std::time::Duration::from_secs(20));
    drop(open_gate);
    reader.join().unwrap();
    writer.join().unwrap().unwrap();
    assert_eq!(
        read.expect("the read of another file waited for a write in the file system"),
        Ok(pattern(PS))
    );
    fs.flush(&R, N, FH, 0).unwrap();
    assert!(fs.inner().data(7) == data);
}

#[test]
fn a_run_written_behind_that_failed_is_reported_at_the_flush() {
    let b = Backing {
        threads: true,
        fail_writes: true,
        ..Backing::with(7, &[])
    };
    let fs = cached(b, 16, Policy::Clock, 1);
    fs.open(&R, N, OpenFlags::RDWR).unwrap();
    let data = pattern(48 * PS);
    // The failed runs' pages were evicted while out: nothing is left to
    // write again, the writes themselves succeeded, and the close says so.
    write_pages(&fs, &data, 0..48).expect("the writer was not told");
    assert_eq!(fs.flush(&R, N, FH, 0), Err(Errno::EIO));
    assert!(
        fs.inner().writes.load(Ordering::Relaxed) >= 5,
        "runs went out behind the writer"
    );
}
