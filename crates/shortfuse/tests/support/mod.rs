//! A file system mounted in this process for a test, over /dev/fuse or
//! io_uring, served by a thread of its own and unmounted on drop.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;

use shortfuse::mount::MountMethod;
use shortfuse::{DevSession, Filesystem, MountOptions, SessionOptions, Stats, Transport};

pub struct Mounted {
    dir: PathBuf,
    pub mp: PathBuf,
    pub stats: Arc<Stats>,
    runner: Option<thread::JoinHandle<std::io::Result<()>>>,
}

impl Mounted {
    /// Mounts `fs` at a fresh directory named after `tag`, and waits for
    /// INIT (the first request waits for it).
    pub fn new(tag: &str, fs: Arc<dyn Filesystem>, mut opts: MountOptions) -> Mounted {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "mounting needs root");
        let dir = std::env::temp_dir().join(format!("lib-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mp = dir.join("mnt");
        fs::create_dir_all(&mp).unwrap();
        opts.threads = Some(2);
        let session = SessionOptions {
            method: MountMethod::Auto,
            control_socket: false,
            handle_signals: false,
        };
        let dev = DevSession::mount(fs, &mp, opts, session).expect("mount");
        let stats = dev.stats().clone();
        let runner = thread::spawn(move || dev.run(|| {}));
        fs::metadata(&mp).unwrap();
        Mounted {
            dir,
            mp,
            stats,
            runner: Some(runner),
        }
    }

    /// Requests served over `transport` so far.
    pub fn served_over(&self, transport: Transport) -> u64 {
        let snap = self.stats.snapshot();
        snap.transports
            .iter()
            .find(|(t, _)| *t == transport)
            .map_or(0, |(_, n)| *n)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.mp.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        if let Some(r) = self.runner.take() {
            let _ = r.join();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
