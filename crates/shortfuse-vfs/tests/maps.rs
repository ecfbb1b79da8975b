//! The DataMap fast path and the M-Cache against the bundled file systems
//! of the three patterns: passthrough (1-to-1), stripe (1-to-M) and pack
//! (M-to-1). Reads and writes of a mapped open must not reach the file
//! system (no READ or WRITE request), and a re-open while the attributes
//! are valid must not send OPEN.

use std::sync::Arc;
use std::time::Duration;

use shortfuse::{Filesystem, MountOptions, Stats};
use shortfuse_abi as abi;
use shortfuse_vfs::*;

struct Fx {
    vfs: Arc<Vfs>,
    stats: Arc<Stats>,
    _dir: std::path::PathBuf,
}

fn count(stats: &Stats, opcode: u32) -> u64 {
    stats
        .snapshot()
        .ops
        .iter()
        .find(|o| o.opcode == Some(opcode))
        .map_or(0, |o| o.count)
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sfvfs-maps-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fixture(name: &str, make: impl FnOnce(&std::path::Path) -> Arc<dyn Filesystem>) -> Fx {
    let dir = scratch(name);
    let fs = make(&dir);
    let (fs, maps) = MapTap::wrap(fs, 4);
    let stats = Arc::new(Stats::new());
    let opts = MountOptions {
        attr_timeout: Duration::from_secs(60),
        entry_timeout: Duration::from_secs(60),
        ..MountOptions::default()
    };
    let vfs = Vfs::new(
        Box::new(InProcess::new(fs, opts, stats.clone())),
        b"/mnt/m",
        0x5f,
        Creds::default(),
    )
    .unwrap();
    vfs.set_maps(maps);
    vfs.set_umask(0o022);
    Fx {
        vfs: Arc::new(vfs),
        stats,
        _dir: dir,
    }
}

impl Fx {
    fn target(&self, path: &str) -> Target {
        match self
            .vfs
            .walk(
                &Location::root(),
                path.as_bytes(),
                WalkFlags {
                    attrs_only: false,
                    follow: true,
                    create: false,
                },
                0,
            )
            .unwrap()
        {
            Walk::Inside(t) => t,
            Walk::Outside { path, .. } => panic!("{path:?} left the mount"),
        }
    }

    /// Creates `path` with `data` through the file system, then reopens it
    /// and checks that I/O through its map skips READ/WRITE and a second
    /// re-open skips OPEN.
    fn check(&self, path: &str, data: &[u8], whole: bool) {
        let f = self
            .vfs
            .open(&self.target(path), libc::O_CREAT | libc::O_RDWR, 0o644)
            .unwrap();
        assert_eq!(f.pwrite(data, 0).unwrap(), data.len());
        drop(f);
        // Reopened: the map the file system gives now covers the data.
        let f = self.vfs.open(&self.target(path), libc::O_RDWR, 0).unwrap();
        let m = f.data_map().expect("a data map");
        assert_eq!(m.whole().is_some(), whole);
        let (reads, writes) = (count(&self.stats, abi::FUSE_READ), count(&self.stats, abi::FUSE_WRITE));
        let mut back = vec![0u8; data.len()];
        assert_eq!(f.pread(&mut back, 0).unwrap(), data.len());
        assert_eq!(back, data);
        if whole {
            // A 1-to-1 file may grow through its map.
            assert_eq!(f.pwrite(b"tail", data.len() as u64).unwrap(), 4);
        } else {
            assert_eq!(f.pwrite(&data[..10], 5).unwrap(), 10);
        }
        assert_eq!(
            count(&self.stats, abi::FUSE_READ),
            reads,
            "a mapped read reached the file system"
        );
        assert_eq!(
            count(&self.stats, abi::FUSE_WRITE),
            writes,
            "a mapped write reached the file system"
        );
        drop(f);
        // M-Cache: the attributes are valid, the map cached: no OPEN.
        self.vfs.getattr_fresh(self.target(path).node.unwrap().0, None).unwrap();
        let opens = count(&self.stats, abi::FUSE_OPEN);
        let f = self.vfs.open(&self.target(path), libc::O_RDONLY, 0).unwrap();
        assert!(f.from_map_cache());
        assert_eq!(count(&self.stats, abi::FUSE_OPEN), opens, "the re-open was sent");
        // Writers too, when the map is 1-to-1 (it grows with the file).
        let w = self.vfs.open(&self.target(path), libc::O_WRONLY, 0).unwrap();
        assert_eq!(w.from_map_cache(), whole);
        drop(w);
        let opens = opens + u64::from(!whole);
        let mut head = [0u8; 4];
        assert_eq!(f.pread(&mut head, 0).unwrap(), 4);
        assert_eq!(&head, &data[..4]);
        // Creating or truncating opens still go to the file system.
        drop(f);
        let f = self
            .vfs
            .open(&self.target(path), libc::O_WRONLY | libc::O_TRUNC, 0)
            .unwrap();
        assert!(!f.from_map_cache());
        assert_eq!(count(&self.stats, abi::FUSE_OPEN), opens + 1);
    }
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn one_to_one_passthrough() {
    let fx = fixture("pt", |d| {
        Arc::new(shortfuse_fs::passthrough::PassthroughFs::new(d).unwrap()) as Arc<dyn Filesystem>
    });
    fx.check("/f", &data(100_000), true);
}

#[test]
fn one_to_many_stripe() {
    let fx = fixture("stripe", |d| {
        let dirs: Vec<_> = (0..3)
            .map(|i| {
                let p = d.join(format!("d{i}"));
                std::fs::create_dir(&p).unwrap();
                p
            })
            .collect();
        Arc::new(shortfuse_fs::stripe::StripeFs::new(dirs, 4096).unwrap()) as Arc<dyn Filesystem>
    });
    // Three chunks of 4 KiB and more: the map has three extents.
    fx.check("/f", &data(20_000), false);
}

#[test]
fn many_to_one_pack() {
    let fx = fixture("pack", |d| {
        Arc::new(shortfuse_fs::pack::PackFs::new(d).unwrap()) as Arc<dyn Filesystem>
    });
    fx.check("/a", &data(3000), false);
    fx.check("/b", &data(5000), false);
    // A write past the map's end goes to the file system, which grows the
    // file (and may move it): the old map retires.
    let f = fx.vfs.open(&fx.target("/a"), libc::O_RDWR, 0).unwrap();
    let big = data(50_000);
    assert_eq!(f.pwrite(&big, 0).unwrap(), big.len());
    let mut back = vec![0u8; big.len()];
    assert_eq!(f.pread(&mut back, 0).unwrap(), big.len());
    assert_eq!(back, big);
    // `check` ended with a truncating open of /b: its old map must not
    // serve the old bytes.
    let g = fx.vfs.open(&fx.target("/b"), libc::O_RDONLY, 0).unwrap();
    let mut b = vec![0u8; 5000];
    assert_eq!(g.pread(&mut b, 0).unwrap(), 0);
}
