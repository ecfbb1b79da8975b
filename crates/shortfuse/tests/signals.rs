//! A session's SIGINT may reach a thread the file system started before
//! the session blocked its signals (a client connecting while the file
//! system was built, as distfs does): the session still unmounts and
//! returns, and the process lives on. Its own test binary: the session
//! changes process-wide signal handlers while it runs.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use shortfuse::{DevSession, SessionOptions};
use shortfuse::{Filesystem, MountOptions};

struct Empty;

impl Filesystem for Empty {}

fn is_mounted(p: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts.lines().any(|l| l.split(' ').nth(1) == p.to_str())
}

#[test]
fn sigint_at_a_thread_started_before_the_session_unmounts() {
    let dir = std::env::temp_dir().join(format!("shortfuse-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Started before the session: this thread does not block SIGINT, so
    // the signal's default action (the process dies) would run here.
    let stop = Arc::new(AtomicBool::new(false));
    let (tid_tx, tid_rx) = mpsc::channel();
    let early = {
        let stop = stop.clone();
        thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            while !stop.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let early_tid = tid_rx.recv().unwrap();
    let session = SessionOptions {
        control_socket: false,
        ..SessionOptions::default()
    };
    let opts = MountOptions {
        threads: Some(1),
        ..MountOptions::default()
    };
    let dev = DevSession::mount(Arc::new(Empty), &dir, opts, session).expect("mount");
    let (ready_tx, ready_rx) = mpsc::channel();
    let runner = thread::spawn(move || dev.run(move || ready_tx.send(()).unwrap()));
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the session never got ready");
    assert!(is_mounted(&dir));
    // SAFETY: tgkill to a thread of this process that is still running.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), early_tid, libc::SIGINT) };
    assert_eq!(rc, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !runner.is_finished() {
        assert!(Instant::now() < deadline, "SIGINT did not end the session");
        thread::sleep(Duration::from_millis(10));
    }
    runner.join().unwrap().expect("the session ended with an error");
    assert!(!is_mounted(&dir), "SIGINT did not unmount");
    stop.store(true, Ordering::Release);
    early.join().unwrap();
    std::fs::remove_dir(&dir).unwrap();
}
