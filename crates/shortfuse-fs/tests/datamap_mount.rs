//! Data maps on real /dev/fuse mounts (needs root): kernel passthrough on
//! `passthrough` (the data never reaches the daemon), and data
//! verification on `stripe` and `pack`, whose maps the daemon serves.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use shortfuse::stats::Stats;
use shortfuse::{DevSession, Filesystem, MountOptions, SessionOptions};
use shortfuse_fs::pack::PackFs;
use shortfuse_fs::passthrough::PassthroughFs;
use shortfuse_fs::pattern::bytes;
use shortfuse_fs::stripe::StripeFs;

fn require_root() {
    // SAFETY: geteuid cannot fail and touches no memory.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "mounted tests need root (mount(2), /dev/fuse, backing ids)");
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sf-dm-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

// Test set-up of the same shape as crates/shortfuse-dist/tests/mounted.rs:
// kept apart so each test reads on its own.
struct Mounted {
    mp: PathBuf,
    stats: Arc<Stats>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Mounted {
    fn new(fs: Arc<dyn Filesystem>, mp: &Path, opts: &str) -> Mounted {
        require_root();
        fs::create_dir_all(mp).unwrap();
        let opts = MountOptions::parse(opts).unwrap();
        let session = SessionOptions {
            control_socket: false,
            handle_signals: false,
            ..SessionOptions::default()
        };
        let s = DevSession::mount(
            fs,
            mp,
            MountOptions {
                threads: Some(2),
                ..opts
            },
            session,
        )
        .unwrap();
        let stats = s.stats().clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || s.run(move || tx.send(()).unwrap()));
        rx.recv().unwrap();
        Mounted {
            mp: mp.to_path_buf(),
            stats,
            thread: Some(thread),
        }
    }

    fn count(&self, op: &str) -> u64 {
        self.stats
            .snapshot()
            .ops
            .iter()
            .filter(|o| o.name() == op)
            .map(|o| o.count)
            .sum()
    }

    fn unmount(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(t) = self.thread.take() {
            shortfuse::mount::unmount(&self.mp, false).unwrap();
            t.join().unwrap().unwrap();
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = shortfuse::mount::unmount(&self.mp, true);
        }
    }
}

#[test]
fn kernel_passthrough_keeps_data_away_from_the_daemon() {
    let base = tempdir("pt");
    let src = base.join("src");
    fs::create_dir(&src).unwrap();
    let fs_ = Arc::new(PassthroughFs::new(&src).unwrap());
    let m = Mounted::new(fs_, &base.join("mnt"), "passthrough");
    let f = m.mp.join("f");
    let data = bytes(1, 3_000_000);
    fs::write(&f, &data).unwrap();
    assert_eq!(fs::read(&f).unwrap(), data);
    assert_eq!(fs::read(src.join("f")).unwrap(), data, "bytes reached the backing file");
    // The same inode open twice at once, in different modes.
    let r = fs::File::open(&f).unwrap();
    let w = fs::OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all_at(b"hello", 10).unwrap();
    let mut got = [0u8; 5];
    r.read_exact_at(&mut got, 10).unwrap();
    assert_eq!(&got, b"hello");
    w.set_len(100).unwrap();
    drop((r, w));
    assert_eq!(fs::metadata(&f).unwrap().len(), 100);
    let mut want = data[..100].to_vec();
    want[10..15].copy_from_slice(b"hello");
    assert_eq!(fs::read(&f).unwrap(), want);
    assert!(m.count("OPEN") + m.count("CREATE") >= 4);
    assert_eq!(m.count("READ"), 0, "reads went to the backing file");
    assert_eq!(m.count("WRITE"), 0, "writes went to the backing file");
    m.unmount();
    fs::remove_dir_all(base).unwrap();
}

#[test]
fn writeback_cache_and_passthrough_are_refused() {
    let e = MountOptions::parse("writeback_cache,passthrough").unwrap_err();
    assert!(e.to_string().contains("writeback_cache"), "{e}");
}

/// Writes files of several sizes, reads them back, renames and deletes
/// some; returns what the tree should hold.
fn exercise(mp: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let sizes = [0usize, 1, 4095, 4096, 70_000, 131_072, 500_000, 2_000_000];
    fs::create_dir(mp.join("d")).unwrap();
    let mut files = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let p = mp.join("d").join(format!("f{i}"));
        let data = bytes(i as u64 + 10, size);
        fs::write(&p, &data).unwrap();
        files.push((p, data));
    }
    for (p, data) in &files {
        assert_eq!(&fs::read(p).unwrap(), data, "{}", p.display());
    }
    // Overwrite in the middle, append.
    let (p, data) = &mut files[6];
    let f = fs::OpenOptions::new().write(true).open(&*p).unwrap();
    f.write_all_at(b"middle", 1000).unwrap();
    data[1000..1006].copy_from_slice(b"middle");
    f.write_all_at(b"end", data.len() as u64).unwrap();
    data.extend_from_slice(b"end");
    drop(f);
    // Rename over another file and into another directory, delete two.
    fs::rename(&files[7].0, &files[2].0).unwrap();
    let moved = files.remove(7).1;
    files[2].1 = moved;
    fs::create_dir(mp.join("e")).unwrap();
    let to = mp.join("e").join("moved");
    fs::rename(&files[4].0, &to).unwrap();
    files[4].0 = to;
    fs::remove_file(&files[5].0).unwrap();
    fs::remove_file(&files[1].0).unwrap();
    files.remove(5);
    files.remove(1);
    check(&files);
    files
}

fn check(files: &[(PathBuf, Vec<u8>)]) {
    for (p, data) in files {
        assert_eq!(&fs::read(p).unwrap(), data, "{}", p.display());
        assert_eq!(fs::metadata(p).unwrap().len(), data.len() as u64);
    }
}

#[test]
fn stripe_mount_keeps_data() {
    let base = tempdir("stripe");
    let dirs: Vec<PathBuf> = (0..3).map(|i| base.join(format!("d{i}"))).collect();
    let mp = base.join("mnt");
    let m = Mounted::new(Arc::new(StripeFs::new(dirs.clone(), 65536).unwrap()), &mp, "");
    let files = exercise(&mp);
    assert!(m.count("READ") > 0, "striped files are served by the daemon");
    m.unmount();
    // Every directory got a share of the 2 MB file.
    for d in &dirs {
        let used: u64 = fs::read_dir(d.join("data"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(used >= 65536, "{}: {used}", d.display());
    }
    let m = Mounted::new(Arc::new(StripeFs::new(dirs, 65536).unwrap()), &mp, "");
    check(&files);
    m.unmount();
    fs::remove_dir_all(base).unwrap();
}

#[test]
fn pack_mount_keeps_data_through_compaction() {
    let base = tempdir("pack");
    let dir = base.join("store");
    let mp = base.join("mnt");
    let m = Mounted::new(Arc::new(PackFs::new(&dir).unwrap()), &mp, "");
    let files = exercise(&mp);
    m.unmount();
    let pack = PackFs::new(&dir).unwrap();
    let (garbage, _) = pack.space();
    assert!(garbage > 0, "renames and deletes left garbage");
    let c = pack.compact().unwrap();
    assert!(c.bytes_reclaimed > 0, "{c:?}");
    let m = Mounted::new(Arc::new(pack), &mp, "");
    check(&files);
    // Small files only: many files share one container.
    let small: Vec<(PathBuf, Vec<u8>)> = (0..200)
        .map(|i| (mp.join(format!("s{i}")), bytes(1000 + i, (i as usize * 37) % 3000)))
        .collect();
    for (p, d) in &small {
        fs::write(p, d).unwrap();
    }
    check(&small);
    m.unmount();
    let containers = fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("pack-"))
        .count();
    assert!(containers <= 3, "{containers} containers for 206 files");
    let m = Mounted::new(Arc::new(PackFs::new(&dir).unwrap()), &mp, "");
    check(&small);
    check(&files);
    m.unmount();
    fs::remove_dir_all(base).unwrap();
}
