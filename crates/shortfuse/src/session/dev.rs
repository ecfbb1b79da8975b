//! The /dev/fuse session: up to N worker threads, each blocked in read(2)
//! on its own fd cloned with `FUSE_DEV_IOC_CLONE`, so replies go back on the
//! fd that read the request and the kernel spreads requests over the
//! readers. Readers start on demand (the `pool` module): one at first, more
//! while requests keep waiting. One thread is the "base" of To FUSE or Not to FUSE (FAST '17)
//! configuration.
//!
//! Each worker owns one read buffer, sized for the largest request INIT may
//! agree on, and one reply buffer: nothing is allocated per request here.
//!
//! Shutdown: the kernel ends every read with ENODEV once the connection is
//! gone (unmounted, aborted, or DESTROY answered); workers then return. On
//! SIGINT/SIGTERM the session detaches the mount (MNT_DETACH, as libfuse);
//! with no users left that ends the connection at once. A second signal
//! aborts the connection even if the detached file system is still in use.
//!
//! With `MountOptions::transport` set to `Transport::Uring` the requests
//! travel over FUSE-over-io_uring rings ([`super::uring`]) once INIT is
//! answered; one /dev/fuse worker
//! stays for INIT, FORGET, INTERRUPT and notifications.

use crate::sync::Unpoison;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a reader polls for the next request before it sleeps in
/// read(2) when `dev_spin` is not given. Measured on 2 vCPUs of a quiet
/// machine (`bench latency --quick`, passthrough, medians of 3): a request
/// that follows within the window skips the reader's sleep and the wake-up
/// of its idle CPU, which took open+close from 48.6-50.9 to 18.0 µs and
/// unlink from 77.8 to 47.4 µs; 10 µs caught only part of it (36.4 µs),
/// 100 µs nothing more than 25.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(25);
/// Largest `dev_spin` accepted.
pub const MAX_SPIN: Duration = Duration::from_millis(10);

use crate::control::ControlServer;
use crate::dispatch::{Dispatcher, Outcome};
use crate::filesystem::Filesystem;
use crate::mount::Mount;
use crate::notify::Notifier;
use crate::options::MountOptions;
use crate::reply::ReplySink;
use crate::session::pool::{Backlog, Pool, Seen};
use crate::session::{uring, SessionOptions};
use crate::stats::{Stats, Transport};
use crate::sys::{self, SignalMask};

/// A mounted file system whose requests are not being served yet.
pub struct DevSession {
    mount: Mount,
    dev: File,
    dispatcher: Arc<Dispatcher>,
    threads: usize,
    session: SessionOptions,
}

impl DevSession {
    /// Mounts; requests queue in the kernel until [`DevSession::run`].
    pub fn mount(
        fs: Arc<dyn Filesystem>,
        mount_point: &Path,
        mut opts: MountOptions,
        session: SessionOptions,
    ) -> io::Result<DevSession> {
        // Before mounting: the kernel offers io_uring in INIT only if the
        // switch is on when the mount sends INIT.
        match opts.transport {
            Transport::Dev => {}
            Transport::Uring => {
                if let Err(why) = uring::enable_kernel_switch() {
                    tracing::warn!("--transport uring unavailable, serving over /dev/fuse: {why}");
                    opts.transport = Transport::Dev;
                }
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a kernel mount is served over dev or uring, not {other}"),
                ))
            }
        }
        let threads = opts.worker_threads();
        let (mount, dev) = Mount::new(mount_point, &opts, session.method)?;
        let dispatcher = Dispatcher::new(fs, opts, Arc::new(Stats::new()));
        // Notifications go over /dev/fuse whatever carries the requests.
        dispatcher.notifier().attach_kernel(dev.try_clone()?);
        let dispatcher = Arc::new(dispatcher);
        Ok(DevSession {
            mount,
            dev,
            dispatcher,
            threads,
            session,
        })
    }

    /// Where the file system is mounted.
    pub fn mount_point(&self) -> &Path {
        self.mount.mount_point()
    }

    /// The session's statistics (`shortfuse stats`).
    pub fn stats(&self) -> &Arc<Stats> {
        self.dispatcher.stats()
    }

    /// The notifier the file system gets in `init`: the kernel connection
    /// of this mount, and whatever else is added to it (a ring server of
    /// the same daemon).
    pub fn notifier(&self) -> &Notifier {
        self.dispatcher.notifier()
    }

    /// The dispatcher that serves this mount's requests (to
    /// [`Dispatcher::observe`] them).
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// Worker threads the session will run.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Serves requests until the file system is unmounted. `ready` is called
    /// once every worker, the control socket and the signal handler are in
    /// place. Returns the first worker error, if any; the mount is gone
    /// when it returns.
    pub fn run(self, ready: impl FnOnce()) -> io::Result<()> {
        let DevSession {
            mount,
            dev,
            dispatcher,
            threads,
            session,
        } = self;
        // Blocked before any thread starts, so every thread inherits the mask
        // and only the signal thread takes these signals.
        let mask = if session.handle_signals {
            Some(SignalMask::block(SIGNALS)?)
        } else {
            None
        };
        let control = if session.control_socket {
            let o = dispatcher.options();
            let subtype = o.subtype.as_deref().unwrap_or_default();
            let about = crate::control::About {
                fs: subtype.strip_prefix("shortfuse-").unwrap_or(subtype).to_string(),
                source: o.fsname.clone().unwrap_or_default(),
                transport: o.transport.to_string(),
            };
            Some(ControlServer::start_described(
                mount.mount_point(),
                dispatcher.stats().clone(),
                about,
            )?)
        } else {
            None
        };
        if dispatcher.options().passthrough {
            // Backing ids are registered on the connection's fd (kernel passthrough).
            dispatcher.passthrough().attach_device(std::os::fd::AsFd::as_fd(&dev))?;
        }
        let ring_dev = if dispatcher.options().transport == Transport::Uring {
            Some(dev.try_clone()?)
        } else {
            None
        };
        let pool = Pool::new(dev, dispatcher.clone(), threads, worker);
        let mount = Arc::new(Mutex::new(mount));
        let done = Arc::new(AtomicBool::new(false));
        let signals = match &mask {
            Some(mask) => {
                let set = mask.set();
                let (mount, done, stats) = (mount.clone(), done.clone(), dispatcher.stats().clone());
                let (taken, taking) = std::sync::mpsc::sync_channel(1);
                let thread = std::thread::Builder::new()
                    .name("shortfuse-signals".to_string())
                    .spawn(move || signal_loop(set, taken, &mount, &done, &stats))?;
                // Serving starts only once a signal to any thread reaches it.
                let _ = taking.recv();
                Some(thread)
            }
            None => None,
        };
        let mut spawn_error = pool.grow().err();
        let mut rings = None;
        if let (None, Some(ring_dev)) = (&spawn_error, &ring_dev) {
            let m = mount.clone();
            let on_error: uring::OnError = Arc::new(move |_| {
                // Requests routed to a dead queue would wait forever.
                let m = m.lock().unpoison();
                let _ = m.abort();
            });
            match start_rings(ring_dev, &dispatcher, &pool, on_error) {
                Ok(r) => rings = Some(r),
                Err(e) => spawn_error = Some(e),
            }
        }
        drop(ring_dev);
        if spawn_error.is_some() {
            // The workers already running end when the connection does.
            let m = mount.lock().unpoison();
            let _ = m.abort();
        } else {
            ready();
        }
        let mut result = spawn_error.map_or(Ok(()), Err);
        let r = pool.join();
        if result.is_ok() {
            result = r;
        }
        if let Some(rings) = rings {
            let r = rings.join();
            if result.is_ok() {
                result = r;
            }
        }
        // No request is served any more.
        dispatcher.finish();
        done.store(true, Ordering::Release);
        if let Some(s) = signals {
            let _ = s.join();
        }
        drop(control);
        // Unmounts if the connection ended while still mounted (aborted).
        drop(mount);
        drop(mask);
        result
    }
}

/// Starts the rings once the /dev/fuse worker has answered INIT.
fn start_rings(
    dev: &File,
    dispatcher: &Arc<Dispatcher>,
    workers: &Pool,
    on_error: uring::OnError,
) -> io::Result<uring::UringSession> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while dispatcher.negotiated().is_none() {
        if workers.all_finished() {
            return Err(io::Error::other("the connection ended before FUSE_INIT"));
        }
        if std::time::Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no FUSE_INIT from the kernel within 30 s",
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let opts = dispatcher.options();
    let config = uring::UringConfig {
        depth: opts.uring_depth,
        workers: opts.uring_workers,
    };
    uring::UringSession::start(dev.as_fd(), dispatcher.clone(), &config, on_error)
        .map_err(|e| io::Error::new(e.kind(), format!("starting the io_uring rings: {e}")))
}

/// What the session's signal thread takes.
const SIGNALS: &[libc::c_int] = &[libc::SIGINT, libc::SIGTERM, libc::SIGUSR1];

fn signal_loop(
    set: sys::SignalSet,
    taken: std::sync::mpsc::SyncSender<()>,
    mount: &Mutex<Mount>,
    done: &AtomicBool,
    stats: &Stats,
) {
    let _taker = match set.take_here() {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!("taking signals from the file system's own threads: {e}");
            None
        }
    };
    let _ = taken.send(());
    let mut stopping = false;
    while !done.load(Ordering::Acquire) {
        let Some(sig) = set.wait(Duration::from_millis(100)) else {
            continue;
        };
        let mut m = mount.lock().unpoison();
        match sig {
            libc::SIGUSR1 => tracing::info!("statistics (SIGUSR1):\n{}", stats.snapshot().table()),
            _ if !stopping => {
                stopping = true;
                if let Err(e) = m.unmount(true) {
                    tracing::warn!("unmounting {}: {e}", m.mount_point().display());
                    let _ = m.abort();
                }
            }
            _ => {
                if let Err(e) = m.abort() {
                    tracing::warn!("aborting the connection: {e}");
                }
            }
        }
    }
}

/// One worker: read a request, dispatch it, write the reply, until the
/// connection ends.
fn worker(dev: File, dispatcher: &Dispatcher, pool: &Arc<Pool>) -> io::Result<()> {
    // Replies answered later go out on this reader's descriptor from
    // whichever thread answers (see `crate::reply`).
    let later: Arc<dyn ReplySink> = Arc::new(LaterReplies(dev.try_clone()?));
    let mut buf = vec![0u8; dispatcher.buffer_size()];
    let mut reply = Vec::with_capacity(4096);
    let mut backlog = Backlog::default();
    // Under uring this reader only sees INIT, FORGET and INTERRUPT.
    let grows = dispatcher.options().transport != Transport::Uring;
    let spin = dispatcher.options().dev_spin.min(MAX_SPIN);
    if !spin.is_zero() {
        set_nonblocking(&dev)?;
    }
    loop {
        let n = match read_request(&dev, &mut buf, spin) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // ENOENT: the request was interrupted before we got it.
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(io::Error::new(e.kind(), format!("reading /dev/fuse: {e}"))),
            },
        };
        let seen = Seen::of(&buf[..n]);
        if grows {
            backlog.read(seen, pool);
        }
        let outcome = dispatcher.handle_with(&buf[..n], &mut reply, Transport::Dev, Some(&later));
        if matches!(outcome, Outcome::NoReply | Outcome::Deferred) {
            continue;
        }
        if grows {
            // Before the reply: this request's caller cannot have sent another yet.
            backlog.handled(seen, &dev, pool);
        }
        if write_reply(&dev, &reply) == Some(libc::ENODEV) {
            return Ok(());
        }
        if outcome == Outcome::Destroy {
            return Ok(());
        }
    }
}

/// Reads the next request. With a `spin` window the descriptor is
/// non-blocking: the reader tries again for up to `spin`, yielding between
/// tries so that a caller waiting on this CPU runs first, then sleeps in
/// poll(2) until a request (or the connection's end) is there. Errors are
/// read(2)'s, for the caller to sort.
fn read_request(dev: &File, buf: &mut [u8], spin: Duration) -> io::Result<usize> {
    if spin.is_zero() {
        return { dev }.read(buf);
    }
    let mut since: Option<Instant> = None;
    loop {
        match { dev }.read(buf) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
            r => return r,
        }
        let started = *since.get_or_insert_with(Instant::now);
        if started.elapsed() < spin {
            std::thread::yield_now();
        } else {
            wait_readable(dev)?;
            since = None;
        }
    }
}

/// Sleeps until `dev` has a request or its connection is gone (the read
/// that follows then says which).
fn wait_readable(dev: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: dev.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
    Ok(())
}

/// Makes reads of this reader's own descriptor (cloned, so its own file
/// description) return EAGAIN instead of sleeping.
fn set_nonblocking(dev: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = dev.as_raw_fd();
    // SAFETY: fcntl on a descriptor this reader owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes one reply (one write(2): the kernel takes a message per call).
/// Returns the error number of a failure the caller must see: ENODEV, the
/// connection is gone. ENOENT (the request was interrupted and is gone) is
/// quiet, anything else is logged.
fn write_reply(dev: &File, reply: &[u8]) -> Option<i32> {
    let mut w: &File = dev;
    let e = w.write(reply).err()?;
    match e.raw_os_error() {
        Some(libc::ENOENT) => None,
        Some(libc::ENODEV) => Some(libc::ENODEV),
        _ => {
            tracing::warn!("writing a reply of {} bytes: {e}", reply.len());
            None
        }
    }
}

/// The /dev/fuse descriptor a deferred reply is written to.
struct LaterReplies(File);

impl ReplySink for LaterReplies {
    fn send(&self, _unique: u64, reply: &[u8]) {
        let _ = write_reply(&self.0, reply);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Empty;
    impl Filesystem for Empty {}

    #[test]
    fn a_kernel_mount_refuses_the_transports_that_bypass_the_kernel() {
        let dir = std::env::temp_dir().join(format!("lib-transport-{}", std::process::id()));
        for transport in [Transport::Ring, Transport::InProcess] {
            let opts = MountOptions {
                transport,
                ..MountOptions::default()
            };
            let err = DevSession::mount(Arc::new(Empty), &dir, opts, SessionOptions::default())
                .err()
                .expect("refused before mounting");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{transport}: {err}");
        }
    }

    #[test]
    fn worker_threads_are_read_from_the_mount_options() {
        let o = MountOptions {
            threads: Some(3),
            ..MountOptions::default()
        };
        assert_eq!(o.worker_threads(), 3);
        let base = MountOptions::base();
        assert_eq!(base.worker_threads(), 1);
        let uring = MountOptions {
            transport: Transport::Uring,
            ..o
        };
        assert_eq!(uring.worker_threads(), 1, "one /dev/fuse reader beside the rings");
    }
}
