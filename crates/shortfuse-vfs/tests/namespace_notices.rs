//! A path call beneath a shared daemon's namespace map first takes in what
//! other clients changed, but drains (under the mount's cache lock) only
//! when the daemon announced something: the threads of a program stat'ing
//! beneath the map then share no lock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shortfuse::{Errno, MountOptions, NamespaceMap, Stats};
use shortfuse_fs::mem::MemFs;
use shortfuse_vfs::*;

/// An in-process backend that says whether it has news, and counts the
/// times the VFS drained it.
struct Announcing {
    inner: InProcess,
    news: Arc<AtomicBool>,
    drains: Arc<AtomicUsize>,
}

impl Backend for Announcing {
    fn call(&self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), Errno> {
        self.inner.call(request, reply)
    }

    fn invalidations_pending(&self) -> bool {
        self.news.load(Ordering::SeqCst)
    }

    fn invalidations(&self, apply: &mut dyn FnMut(Invalidation<'_>)) {
        self.drains.fetch_add(1, Ordering::SeqCst);
        if self.news.swap(false, Ordering::SeqCst) {
            apply(Invalidation::All);
        }
    }
}

#[test]
fn a_shared_map_is_drained_only_when_the_daemon_announced_a_change() {
    let news = Arc::new(AtomicBool::new(false));
    let drains = Arc::new(AtomicUsize::new(0));
    let backend = Announcing {
        inner: InProcess::new(Arc::new(MemFs::new()), MountOptions::default(), Arc::new(Stats::new())),
        news: news.clone(),
        drains: drains.clone(),
    };
    let vfs = Vfs::new(Box::new(backend), b"/mnt/x", 1, Creds::default()).unwrap();
    let root = Arc::new(std::os::fd::OwnedFd::from(std::fs::File::open("/").unwrap()));
    let map = NamespaceMap { root, no_xdev: false };
    // Over the rings: the map serves the daemon's user alone.
    vfs.set_namespace(Namespace::new(map, Duration::from_secs(60), Some(0)));
    let caller = Arc::new(Caller {
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    });
    let open = || {
        Ok(std::os::fd::OwnedFd::from(
            std::fs::File::open("/").map_err(Errno::from)?,
        ))
    };
    vfs.namespace_current().unwrap().dir(b"a", &caller, open).unwrap();
    let before = drains.load(Ordering::SeqCst);
    for _ in 0..1000 {
        assert!(vfs.namespace_current().is_some());
    }
    assert_eq!(
        drains.load(Ordering::SeqCst) - before,
        0,
        "drains with nothing announced"
    );
    assert_eq!(vfs.namespace().unwrap().kept_dirs(), 1);
    // An announced change is taken in at the next call, and forgets the
    // kept directories.
    news.store(true, Ordering::SeqCst);
    vfs.namespace_current().unwrap();
    assert_eq!(drains.load(Ordering::SeqCst) - before, 1);
    assert_eq!(vfs.namespace().unwrap().kept_dirs(), 0);
}
