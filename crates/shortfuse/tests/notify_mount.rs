//! Notifications on real mounts, over /dev/fuse and over io_uring: a file
//! system whose names and contents change behind the kernel's back, with
//! the kernel told to cache everything for an hour. A reader sees each
//! change only once the file system sends the notification; STORE puts data
//! in the kernel's page cache, RETRIEVE reads it back, and a POLL wake-up
//! ends a `poll(2)` that would otherwise wait.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use shortfuse::{
    Attr, DirSink, Entry, Errno, FileHandle, FileType, Filesystem, InitConfig, MountOptions, NodeId, Notifier,
    PollEvents, PollHandle, Request, Transport,
};

mod support;

const HOUR: Duration = Duration::from_secs(3600);

/// Names in the root, each a file with its own node; changed by the test
/// directly, never through the mount.
#[derive(Default)]
struct Changing {
    files: Mutex<BTreeMap<OsString, (NodeId, Vec<u8>)>>,
    notifier: OnceLock<Notifier>,
    /// The poll handle the kernel gave, and whether the file is ready.
    waiting: Mutex<Option<PollHandle>>,
    ready: AtomicBool,
}

impl Changing {
    fn attr(&self, node: NodeId) -> Option<Attr> {
        if node == NodeId::ROOT {
            return Some(Attr {
                ino: 1,
                mode: FileType::Directory.mode_bits() | 0o755,
                nlink: 2,
                ..Attr::default()
            });
        }
        let files = self.files.lock().unwrap();
        let (_, data) = files.values().find(|(n, _)| *n == node)?;
        Some(Attr {
            ino: node.0,
            mode: FileType::Regular.mode_bits() | 0o644,
            nlink: 1,
            size: data.len() as u64,
            ..Attr::default()
        })
    }

    fn set(&self, name: &str, node: u64, data: &[u8]) {
        self.files
            .lock()
            .unwrap()
            .insert(name.into(), (NodeId(node), data.to_vec()));
    }

    fn notifier(&self) -> &Notifier {
        self.notifier.get().expect("init gave the file system its notifier")
    }
}

impl Filesystem for Changing {
    fn init(&self, config: &mut InitConfig) -> shortfuse::Result<()> {
        let _ = self.notifier.set(config.notifier.clone());
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: NodeId, name: &OsStr) -> shortfuse::Result<Entry> {
        if parent != NodeId::ROOT {
            return Err(Errno::ENOENT);
        }
        let node = self.files.lock().unwrap().get(name).map(|(n, _)| *n);
        let node = node.ok_or(Errno::ENOENT)?;
        Ok(Entry::new(node, self.attr(node).ok_or(Errno::ENOENT)?))
    }

    fn getattr(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>) -> shortfuse::Result<Attr> {
        self.attr(node).ok_or(Errno::ENOENT)
    }

    fn read(
        &self,
        _req: &Request,
        node: NodeId,
        _fh: FileHandle,
        off: u64,
        buf: &mut [u8],
    ) -> shortfuse::Result<usize> {
        let files = self.files.lock().unwrap();
        let (_, data) = files.values().find(|(n, _)| *n == node).ok_or(Errno::ENOENT)?;
        let rest = data.get(off as usize..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }

    fn readdir(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> shortfuse::Result<()> {
        let files = self.files.lock().unwrap();
        for (i, (name, (node, _))) in files.iter().enumerate().skip(offset as usize) {
            if !sink.add(node.0, i as u64 + 1, FileType::Regular, name) {
                break;
            }
        }
        Ok(())
    }

    fn poll(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        handle: Option<PollHandle>,
        events: PollEvents,
    ) -> shortfuse::Result<PollEvents> {
        if self.ready.load(Ordering::SeqCst) {
            return Ok(events & PollEvents::IN);
        }
        if let Some(h) = handle {
            *self.waiting.lock().unwrap() = Some(h);
        }
        Ok(PollEvents::empty())
    }
}

struct Mounted {
    m: support::Mounted,
    fs: Arc<Changing>,
}

impl Mounted {
    fn new(tag: &str, transport: Transport) -> Mounted {
        let fs = Arc::new(Changing::default());
        fs.set("f", 2, b"old content");
        fs.set("g", 3, b"to be removed");
        fs.set("h", 4, b"to be deleted");
        fs.set("s", 5, b"from the file system");
        let opts = MountOptions {
            attr_timeout: HOUR,
            entry_timeout: HOUR,
            negative_timeout: HOUR,
            keep_cache: true,
            transport,
            ..MountOptions::default()
        };
        let m = support::Mounted::new(&format!("notify-{tag}"), fs.clone(), opts);
        assert!(fs.notifier.get().is_some(), "no notifier after INIT");
        Mounted { m, fs }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.m.mp.join(name)
    }
}

fn read(p: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    fs::File::open(p).unwrap().read_to_end(&mut v).unwrap();
    v
}

fn exists(p: &Path) -> bool {
    fs::metadata(p).is_ok()
}

fn everything(m: &Mounted) {
    let fs = &m.fs;
    let n = fs.notifier();
    assert!(n.has_kernel());

    // Data: the kernel keeps the old pages until told.
    assert_eq!(read(&m.path("f")), b"old content");
    fs.set("f", 2, b"new content");
    assert_eq!(read(&m.path("f")), b"old content", "the kernel did not cache the data");
    n.inval_inode(NodeId(2), 0, 0).unwrap();
    assert_eq!(read(&m.path("f")), b"new content");

    // A removed name stays until INVAL_ENTRY.
    assert!(exists(&m.path("g")));
    fs.files.lock().unwrap().remove(OsStr::new("g"));
    assert!(exists(&m.path("g")), "the kernel did not cache the name");
    n.inval_entry(NodeId::ROOT, OsStr::new("g")).unwrap();
    assert!(!exists(&m.path("g")));

    // ... or DELETE.
    assert!(exists(&m.path("h")));
    fs.files.lock().unwrap().remove(OsStr::new("h"));
    assert!(exists(&m.path("h")));
    n.delete(NodeId::ROOT, NodeId(4), OsStr::new("h")).unwrap();
    assert!(!exists(&m.path("h")));

    // A new name hidden by a cached negative entry.
    assert!(!exists(&m.path("new")));
    fs.set("new", 6, b"x");
    assert!(!exists(&m.path("new")), "the kernel did not cache the missing name");
    n.inval_entry(NodeId::ROOT, OsStr::new("new")).unwrap();
    assert_eq!(read(&m.path("new")), b"x");

    // STORE: the kernel serves what the file system put in its cache.
    assert_eq!(read(&m.path("s")), b"from the file system");
    n.store(NodeId(5), 0, b"FROM THE NOTIFIER!!!").unwrap();
    assert_eq!(read(&m.path("s")), b"FROM THE NOTIFIER!!!");

    // RETRIEVE: what the kernel's page cache holds.
    let got = n
        .retrieve(NodeId(5), 0, 20)
        .unwrap()
        .wait(Duration::from_secs(30))
        .unwrap();
    assert_eq!(got.offset, 0);
    assert_eq!(got.data, b"FROM THE NOTIFIER!!!");

    // POLL: a reader waits until the file system wakes it.
    let f = fs::File::open(m.path("f")).unwrap();
    let fd = f.as_raw_fd();
    let poller = thread::spawn(move || {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. 60 s: an anti-hang bound only.
        let r = unsafe { libc::poll(&mut p, 1, 60_000) };
        (r, p.revents)
    });
    let start = Instant::now();
    let handle = loop {
        if let Some(h) = *fs.waiting.lock().unwrap() {
            break h;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no POLL with a handle came");
        thread::sleep(Duration::from_millis(5));
    };
    thread::sleep(Duration::from_millis(50));
    assert!(!poller.is_finished(), "poll returned before the file was ready");
    fs.ready.store(true, Ordering::SeqCst);
    n.poll_wakeup(handle).unwrap();
    let (r, revents) = poller.join().unwrap();
    assert_eq!(r, 1, "poll timed out: the wake-up did not reach it");
    assert_eq!(revents & libc::POLLIN, libc::POLLIN);
    drop(f);

    // A node the kernel does not know: ENOENT, not a hang or a panic.
    let e = n.inval_inode(NodeId(999), 0, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
}

// Test set-up of the same shape as node_mount.rs (one test per kernel
// transport): kept apart so each test reads on its own.
#[test]
fn notifications_over_dev() {
    let m = Mounted::new("dev", Transport::Dev);
    everything(&m);
}

#[test]
fn notifications_over_uring() {
    let m = Mounted::new("uring", Transport::Uring);
    everything(&m);
    assert!(m.m.served_over(Transport::Uring) > 0, "nothing travelled over io_uring");
}
