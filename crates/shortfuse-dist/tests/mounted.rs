//! Two real /dev/fuse mounts (needs root) of one embedded distfs server:
//! what one writes the other reads, through the kernel, including data
//! still in the writer's cache and pages the reader read before (files are
//! opened direct-io, so no stale page can come from the kernel's cache).

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use shortfuse::{DevSession, Filesystem, MountOptions, SessionOptions};
use shortfuse_dist::client::{ClientConfig, DistFs};
use shortfuse_dist::server::{DistServer, ServerConfig};
use shortfuse_fs::pattern::bytes;

fn require_root() {
    // SAFETY: geteuid cannot fail and touches no memory.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "mounted tests need root (mount(2), /dev/fuse)");
}

// Test set-up of the same shape as crates/shortfuse-fs/tests/datamap_mount.rs:
// kept apart so each test reads on its own.
struct Mounted {
    mp: PathBuf,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Mounted {
    fn new(fs: Arc<dyn Filesystem>, mp: &Path) -> Mounted {
        require_root();
        fs::create_dir_all(mp).unwrap();
        // Names are not cached: another mount may change them at any time.
        // Attributes keep the default timeout, so that a stale page would
        // not be caught by the kernel's mtime check (auto_inval_data): only
        // direct-io keeps the data coherent here.
        let opts = MountOptions::parse("default_permissions,entry_timeout=0").unwrap();
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
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || s.run(move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the session never became ready");
        Mounted {
            mp: mp.to_path_buf(),
            thread: Some(thread),
        }
    }

    fn unmount(mut self) {
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

fn mount_client(s: &DistServer, mp: &Path) -> Mounted {
    let fs = DistFs::new(ClientConfig::new(s.addr().to_string())).unwrap();
    Mounted::new(Arc::new(fs), mp)
}

#[test]
fn two_mounts_see_each_others_writes() {
    let base = tempfile::tempdir().unwrap();
    let data_dir = base.path().join("data");
    let server = DistServer::start(ServerConfig::new(data_dir.clone(), "127.0.0.1:0".parse().unwrap())).unwrap();
    let m1 = mount_client(&server, &base.path().join("m1"));
    let m2 = mount_client(&server, &base.path().join("m2"));
    let (p1, p2) = (m1.mp.join("f"), m2.mp.join("f"));

    // Whole file, unaligned size, several blocks.
    let data = bytes(1, 1_000_003);
    fs::write(&p1, &data).unwrap();
    assert_eq!(fs::read(&p2).unwrap(), data);

    // m2 reads through an open descriptor (without direct-io the kernel
    // would keep these pages); m1 changes them behind its back, and m2
    // reads again through the same descriptor.
    let r = fs::File::open(&p2).unwrap();
    let mut got = vec![0u8; 7];
    r.read_exact_at(&mut got, 4096).unwrap();
    assert_eq!(got, data[4096..4103]);
    let w = OpenOptions::new().write(true).open(&p1).unwrap();
    w.write_all_at(b"CHANGED", 4096).unwrap();
    r.read_exact_at(&mut got, 4096).unwrap();
    assert_eq!(got, b"CHANGED", "a stale page was served");
    // And back: m1's cache was revoked, m2 now writes.
    fs::OpenOptions::new()
        .append(true)
        .open(&p2)
        .unwrap()
        .write_all(b"tail")
        .unwrap();
    let mut all = Vec::new();
    fs::File::open(&p1).unwrap().read_to_end(&mut all).unwrap();
    assert_eq!(all.len(), data.len() + 4);
    assert_eq!(&all[all.len() - 4..], b"tail");
    assert_eq!(&all[4096..4103], b"CHANGED");
    w.write_all_at(b"again", 0).unwrap();
    w.sync_all().unwrap();
    drop((w, r));

    // Name-space changes show at once on the other mount.
    fs::create_dir(m1.mp.join("d")).unwrap();
    fs::rename(&p1, m1.mp.join("d/g")).unwrap();
    assert!(!p2.exists());
    assert_eq!(&fs::read(m2.mp.join("d/g")).unwrap()[..5], b"again");
    let names: Vec<_> = fs::read_dir(m2.mp.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["g"]);

    m1.unmount();
    m2.unmount();
    // Everything written is on the server once the mounts are gone.
    drop(server);
    let server = DistServer::start(ServerConfig::new(data_dir, "127.0.0.1:0".parse().unwrap())).unwrap();
    let m3 = mount_client(&server, &base.path().join("m3"));
    let back = fs::read(m3.mp.join("d/g")).unwrap();
    assert_eq!(back.len(), data.len() + 4);
    assert_eq!(&back[..5], b"again");
    assert_eq!(&back[5..4096], &data[5..4096]);
    m3.unmount();
}
