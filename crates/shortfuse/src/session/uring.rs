//! The `uring` session: FUSE over io_uring (protocol 7.42+, Linux 6.14+),
//! mainline's take on the per-core rings of RFUSE (FAST '24).
//!
//! Concepts:
//! - One *queue* per possible CPU (`qid` = CPU number). The kernel sends a
//!   request to the queue of the CPU its caller runs on; queues never steal
//!   from each other, so every queue needs a worker.
//! - A *ring entry* is a pair of buffers registered with the kernel: a
//!   288-byte header (`fuse_uring_req_header`) and a payload buffer of
//!   `max(8192, max_write, max_pages * 4096)` bytes. Each entry carries one
//!   request at a time; `uring_depth` entries per worker.
//! - A *worker* is a thread pinned to its queue's CPU that owns its own
//!   io_uring (`IORING_SETUP_SQE128`) and its own entries; `uring_workers`
//!   per queue (RFUSE uses 2 so that one slow request does not stall a
//!   core).
//!
//! Life of an entry: REGISTER (an `IORING_OP_URING_CMD` on the /dev/fuse
//! fd) parks it in the kernel; its completion means a request is in the
//! buffers; the worker assembles the request into one contiguous message,
//! runs it through the same [`Dispatcher`] as the `dev` session (recorded
//! as [`Transport::Uring`]), splits the reply back into the buffers and
//! submits COMMIT_AND_FETCH, which delivers the reply and parks the entry
//! again. Buffers are reused: nothing is allocated per request.
//!
//! A request the file system answers later (see [`crate::reply`]) leaves
//! its entry with the worker: the answering thread puts the reply in the
//! worker's mailbox and signals its eventfd, on which the worker keeps a
//! poll; the worker then stores the reply in the entry's buffers and
//! commits it. Meanwhile the worker serves its other entries.
//!
//! Waiting (RFUSE's hybrid polling, `uring_spin`): once its completions
//! are served, a worker submits the commits and then polls its completion
//! queue for a bounded time before sleeping in `io_uring_enter`
//! (GETEVENTS). The kernel queues a request on the caller's CPU, where the
//! worker is pinned, so the worker cannot spin the CPU away from the caller
//! it just answered: it yields between polls. The caller runs, sends its
//! next request (task work on the worker, which is runnable, not asleep)
//! and blocks; the worker gets the CPU back, the task work posts the
//! completion on the way out of `sched_yield`, and no sleep or wake-up was
//! paid. One system call per request when sleeping; while polling, the
//! submit and one `sched_yield` per poll.
//!
//! Polling only pays when the CPU is otherwise idle but for the caller:
//! each yield moves the worker's scheduling deadline back, so on a busy CPU
//! a polling worker waits behind other tasks where a sleeping one would be
//! woken ahead of them (measured with two CPU hogs: a failing stat took
//! 25 µs polling, 5 µs sleeping). So a poll that ends without a request, or
//! a yield that outlasts the whole window, turns polling off for
//! [`SPIN_BACKOFF`] windows. Spinning without yielding is no better: the
//! caller waits for the window to end whenever it is not woken ahead of
//! the worker. Nor is polling from the other CPU: a cross-CPU wake-up costs
//! about 13 µs on these virtual machines, against 2.4 µs for a same-CPU
//! round trip.
//!
//! Rules the caller keeps:
//! - Switch the kernel on ([`enable_kernel_switch`]) before mounting: the
//!   kernel offers `FUSE_OVER_IO_URING` in INIT only when it is on.
//! - Start the rings after FUSE_INIT was answered over /dev/fuse, and keep a
//!   /dev/fuse reader running: FORGET, INTERRUPT and notifications never
//!   travel over the rings. (REGISTER before the INIT reply is visible gets
//!   EAGAIN; the workers resubmit.)
//! - Teardown: unmounting aborts the connection and the kernel completes
//!   every parked entry with an error (ENOTCONN), which ends the workers;
//!   [`UringSession::join`] then returns. [`UringSession::stop`] ends the
//!   workers without the kernel (for daemon errors): close the connection
//!   (unmount or abort) too, since requests already routed to a queue would
//!   otherwise wait for an entry that never comes back. For the same reason
//!   a worker that fails calls the `on_error` hook given to
//!   [`UringSession::start`], which should abort the connection.

mod entry;
mod sys;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Once};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use shortfuse_abi as abi;

use crate::dispatch::{Dispatcher, Negotiated, Outcome};
use crate::errno::Errno;
use crate::reply::ReplySink;
use crate::stats::Transport;
use crate::sync::Unpoison;

use entry::HEADER_SIZE;
use sys::{EventFd, Region, Ring};

/// The kernel's switch for FUSE over io_uring.
pub const ENABLE_URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
/// Where the possible CPUs (one queue each) are listed.
pub const POSSIBLE_CPUS: &str = "/sys/devices/system/cpu/possible";
/// Entries per worker when `uring_depth` is not given (libfuse's default).
pub const DEFAULT_DEPTH: u32 = 8;
/// Workers per queue when `uring_workers` is not given.
pub const DEFAULT_WORKERS: usize = 1;
/// Largest `uring_depth` accepted: each entry pins a payload buffer of up
/// to 1 MiB per worker.
pub const MAX_DEPTH: u32 = 1024;
/// Largest `uring_workers` accepted.
pub const MAX_WORKERS: usize = 64;
/// How long a worker polls for the next request before sleeping when
/// `uring_spin` is not given. Measured on 2 vCPUs at light load (null file
/// system, medians, mounts interleaved): a request that follows its
/// predecessor within the window skips the worker's sleep and wake-up,
/// which took create from 16.1 to 12.6 µs, open+close of a directory from
/// 7.8 to 5.2 µs and a failing stat from 4.8 to 4.6 µs; 5 and 10 µs gave
/// the same medians with longer tails, 50 and 200 µs nothing more.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);
/// Largest `uring_spin` accepted.
pub const MAX_SPIN: Duration = Duration::from_millis(10);
/// After a poll that found nothing, a worker sleeps at once for this many
/// polling windows (20 ms at the default).
pub const SPIN_BACKOFF: u32 = 1000;

/// How many rings and entries to set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringConfig {
    /// Ring entries per worker (`-o uring_depth=N`).
    pub depth: u32,
    /// Workers (threads, each with its own io_uring) per queue
    /// (`-o uring_workers=N`).
    pub workers: usize,
}

impl Default for UringConfig {
    fn default() -> UringConfig {
        UringConfig {
            depth: DEFAULT_DEPTH,
            workers: DEFAULT_WORKERS,
        }
    }
}

/// Switches FUSE over io_uring on in the kernel (writes `Y` to
/// [`ENABLE_URING_PARAM`]; says so on stderr once per process). `Err` says
/// in one line why the rings cannot be used, for a fall back to `dev`.
pub fn enable_kernel_switch() -> Result<(), String> {
    let current = std::fs::read_to_string(ENABLE_URING_PARAM).map_err(|e| {
        format!("cannot read {ENABLE_URING_PARAM} ({e}): this kernel has no FUSE over io_uring (CONFIG_FUSE_IO_URING)")
    })?;
    if current.trim() == "Y" {
        return Ok(());
    }
    if !is_root() {
        return Err(format!(
            "not root, so {ENABLE_URING_PARAM} cannot be switched on (it is {})",
            current.trim()
        ));
    }
    std::fs::write(ENABLE_URING_PARAM, "Y").map_err(|e| format!("cannot write Y to {ENABLE_URING_PARAM}: {e}"))?;
    static SAID: Once = Once::new();
    SAID.call_once(|| tracing::info!("switched FUSE over io_uring on (wrote Y to {ENABLE_URING_PARAM})"));
    Ok(())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Parses a kernel CPU list (`0-3,8,10-11`).
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let num = |t: &str| t.trim().parse::<usize>().map_err(|_| format!("bad CPU list {s:?}"));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b || b >= libc::CPU_SETSIZE as usize {
                    return Err(format!("bad CPU range {part:?} in {s:?}"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    if cpus.is_empty() {
        return Err(format!("empty CPU list {s:?}"));
    }
    Ok(cpus)
}

/// The possible CPUs: the kernel has one queue for each.
pub fn possible_cpus() -> io::Result<Vec<usize>> {
    let s = std::fs::read_to_string(POSSIBLE_CPUS)?;
    parse_cpu_list(&s).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{POSSIBLE_CPUS}: {e}")))
}

/// Payload buffer size the kernel requires of every entry:
/// `max(FUSE_MIN_READ_BUFFER, max_write, max_pages * 4096)`.
pub fn payload_size(n: &Negotiated) -> usize {
    (abi::FUSE_MIN_READ_BUFFER)
        .max(n.max_write as usize)
        .max(usize::from(n.max_pages) * 4096)
}

/// `user_data` of the stop poll; entries use their index.
const STOP: u64 = u64::MAX;
/// `user_data` of the poll on the mailbox of replies answered later.
const WAKE: u64 = u64::MAX - 1;
/// How long REGISTER keeps being resubmitted on EAGAIN (INIT reply not yet
/// visible to the kernel).
const REGISTER_RETRY: Duration = Duration::from_millis(1);
const REGISTER_ATTEMPTS: u32 = 5000;

/// Called with the error when a worker ends for another reason than the
/// connection's end.
pub type OnError = Arc<dyn Fn(&io::Error) + Send + Sync>;

/// Running rings: the worker threads of every queue.
pub struct UringSession {
    stop: Arc<EventFd>,
    workers: Vec<(usize, JoinHandle<io::Result<()>>)>,
}

impl UringSession {
    /// Starts `config.workers` pinned workers on every queue, each
    /// registering `config.depth` entries on `dev` (the session's /dev/fuse
    /// fd, duplicated per worker). Call after FUSE_INIT was answered.
    /// Returns once every worker has its ring and submitted its REGISTERs;
    /// ring creation errors come back here.
    pub fn start(
        dev: BorrowedFd<'_>,
        dispatcher: Arc<Dispatcher>,
        config: &UringConfig,
        on_error: OnError,
    ) -> io::Result<UringSession> {
        let negotiated = dispatcher
            .negotiated()
            .ok_or_else(|| io::Error::other("uring session started before FUSE_INIT was answered"))?;
        if !negotiated.has(abi::FUSE_OVER_IO_URING) {
            return Err(io::Error::other(
                "the kernel did not offer FUSE_OVER_IO_URING in INIT (was enable_uring on before mounting?)",
            ));
        }
        if config.depth == 0 || config.depth > MAX_DEPTH || config.workers == 0 || config.workers > MAX_WORKERS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("uring_depth must be 1..={MAX_DEPTH} and uring_workers 1..={MAX_WORKERS}, got {config:?}"),
            ));
        }
        let cpus = possible_cpus()?;
        let payload = payload_size(negotiated);
        let stop = Arc::new(EventFd::new()?);
        let mut session = UringSession {
            stop: stop.clone(),
            workers: Vec::new(),
        };
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        for (qid, &cpu) in cpus.iter().enumerate() {
            let qid = u16::try_from(qid).map_err(|_| io::Error::other("more than 65536 queues"))?;
            for w in 0..config.workers {
                let setup = WorkerSetup {
                    dev: dev.try_clone_to_owned()?,
                    dispatcher: dispatcher.clone(),
                    stop: stop.clone(),
                    qid,
                    cpu,
                    depth: config.depth as usize,
                    payload,
                };
                let ready = ready_tx.clone();
                let on_error = on_error.clone();
                let handle = thread::Builder::new()
                    .name(format!("sf-uring-q{qid}w{w}"))
                    .spawn(move || match Worker::new(setup) {
                        Ok(mut worker) => {
                            let _ = ready.send(Ok(()));
                            let r = worker.run();
                            if let Err(e) = &r {
                                on_error(e);
                            }
                            r
                        }
                        Err(e) => {
                            let _ = ready.send(Err(io::Error::new(e.kind(), e.to_string())));
                            Err(e)
                        }
                    })?;
                session.workers.push((usize::from(qid), handle));
            }
        }
        drop(ready_tx);
        for _ in 0..session.workers.len() {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(io::Error::new(e.kind(), format!("uring worker setup: {e}"))),
                Err(_) => return Err(io::Error::other("uring worker ended during setup")),
            }
        }
        Ok(session)
    }

    /// Tells every worker to close its ring and end. See the module doc:
    /// the connection must be closed as well.
    pub fn stop(&self) {
        self.stop.signal();
    }

    /// Waits for every worker to end (after unmount, an abort or
    /// [`UringSession::stop`]); the first worker error, if any.
    pub fn join(mut self) -> io::Result<()> {
        self.join_all()
    }

    fn join_all(&mut self) -> io::Result<()> {
        let mut first = Ok(());
        for (qid, handle) in self.workers.drain(..) {
            let r = match handle.join() {
                Ok(r) => r,
                Err(_) => Err(io::Error::other(format!("uring worker of queue {qid} panicked"))),
            };
            if let Err(e) = r {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl Drop for UringSession {
    fn drop(&mut self) {
        if !self.workers.is_empty() {
            self.stop();
            if let Err(e) = self.join_all() {
                tracing::warn!("uring: {e}");
            }
        }
    }
}

struct WorkerSetup {
    dev: OwnedFd,
    dispatcher: Arc<Dispatcher>,
    stop: Arc<EventFd>,
    qid: u16,
    cpu: usize,
    depth: usize,
    payload: usize,
}

/// What an entry's command in flight is, to resubmit it after EINTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    Register {
        attempts: u32,
    },
    Commit {
        unique: u64,
    },
    /// The file system answers the request later (see [`Mailbox`]).
    Deferred {
        unique: u64,
    },
    /// Ended (connection gone or an error): not resubmitted.
    Done,
}

/// One thread's ring and entries. Field order matters: the ring is dropped
/// first, which cancels the kernel's use of the buffers before they are
/// unmapped.
struct Worker {
    ring: Ring,
    headers: Region,
    payloads: Region,
    /// `iov[0]` header, `iov[1]` payload per entry, read by the kernel at
    /// REGISTER (possibly later, from io-wq): kept for the worker's life.
    iovs: Box<[[libc::iovec; 2]]>,
    pending: Vec<Pending>,
    /// The request of the entry being served, as one message.
    request: Vec<u8>,
    reply: Vec<u8>,
    completions: Vec<(u64, i32)>,
    dev: OwnedFd,
    dispatcher: Arc<Dispatcher>,
    stop: Arc<EventFd>,
    mailbox: Arc<Mailbox>,
    /// `mailbox` as the dispatcher takes it.
    later: Arc<dyn ReplySink>,
    /// Replies taken from the mailbox, reused.
    arrived: Vec<(u64, Vec<u8>)>,
    qid: u16,
    payload: usize,
    setxattr_ext: bool,
    /// `uring_spin`: how long [`Worker::wait`] polls before sleeping.
    spin: Duration,
    /// Polling is off until then: the last poll did not pay.
    no_spin_until: Instant,
}

impl Worker {
    fn new(s: WorkerSetup) -> io::Result<Worker> {
        if let Err(e) = sys::pin_to_cpu(s.cpu) {
            // An offline CPU cannot be pinned to; its queue still needs an
            // entry for the rings to switch on, so serve it from anywhere.
            tracing::warn!("uring: queue {} not pinned to CPU {}: {e}", s.qid, s.cpu);
        }
        // The entries' commands and the two polls.
        let entries = u32::try_from(s.depth + 2).map_err(|_| io::Error::other("uring_depth too large"))?;
        let ring = Ring::builder()
            .setup_cqsize(entries.saturating_mul(2))
            .build(entries)
            .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup with SQE128: {e}")))?;
        let headers = Region::new(s.depth * HEADER_SIZE)?;
        let payloads = Region::new(s.depth * s.payload)?;
        let iovs = (0..s.depth)
            .map(|i| {
                [
                    libc::iovec {
                        iov_base: headers.addr(i * HEADER_SIZE).cast(),
                        iov_len: HEADER_SIZE,
                    },
                    libc::iovec {
                        iov_base: payloads.addr(i * s.payload).cast(),
                        iov_len: s.payload,
                    },
                ]
            })
            .collect();
        let negotiated = s.dispatcher.negotiated().expect("checked in start");
        let setxattr_ext = negotiated.has(abi::FUSE_SETXATTR_EXT);
        let spin = s.dispatcher.options().uring_spin.min(MAX_SPIN);
        let reply_cap = s.dispatcher.buffer_size().max(s.payload + 4096);
        let mailbox = Arc::new(Mailbox {
            replies: Mutex::new(Vec::new()),
            wake: EventFd::new()?,
        });
        let mut w = Worker {
            ring,
            headers,
            payloads,
            iovs,
            pending: vec![Pending::Register { attempts: 0 }; s.depth],
            request: Vec::with_capacity(HEADER_SIZE + s.payload),
            reply: Vec::with_capacity(reply_cap),
            completions: Vec::with_capacity(2 * (s.depth + 1)),
            dev: s.dev,
            dispatcher: s.dispatcher,
            stop: s.stop,
            later: mailbox.clone(),
            mailbox,
            arrived: Vec::new(),
            qid: s.qid,
            payload: s.payload,
            setxattr_ext,
            spin,
            no_spin_until: Instant::now(),
        };
        w.push_stop_poll()?;
        w.push_wake_poll()?;
        for i in 0..s.depth {
            w.push_register(i)?;
        }
        w.submit(0)?;
        Ok(w)
    }

    fn push_stop_poll(&mut self) -> io::Result<()> {
        let e = sys::poll_stop(self.stop.raw(), STOP);
        // SAFETY: the poll references no memory; the eventfd lives in the
        // Arc held by this worker.
        unsafe { sys::push(&mut self.ring, &e) }
    }

    fn push_wake_poll(&mut self) -> io::Result<()> {
        let e = sys::poll_stop(self.mailbox.wake.raw(), WAKE);
        // SAFETY: as for the stop poll; the mailbox lives in this worker.
        unsafe { sys::push(&mut self.ring, &e) }
    }

    /// Commits the replies answered later that reached the mailbox.
    fn commit_later(&mut self) -> io::Result<()> {
        self.mailbox.wake.clear();
        self.push_wake_poll()?;
        std::mem::swap(&mut self.arrived, &mut self.mailbox.replies.lock().unpoison());
        for (unique, reply) in std::mem::take(&mut self.arrived) {
            let Some(i) = self.pending.iter().position(|p| *p == Pending::Deferred { unique }) else {
                continue;
            };
            // SAFETY: entry `i` waits for this reply: its last completion
            // was reaped and no command of it is in flight, so the kernel
            // does not touch its buffers.
            let (header, body) = unsafe {
                (
                    self.headers.slice_mut(i * HEADER_SIZE, HEADER_SIZE),
                    self.payloads.slice_mut(i * self.payload, self.payload),
                )
            };
            entry::store_reply(&reply, unique, header, body);
            self.push_commit(i, unique)?;
            self.pending[i] = Pending::Commit { unique };
        }
        Ok(())
    }

    fn push_register(&mut self, i: usize) -> io::Result<()> {
        let req = abi::fuse_uring_cmd_req {
            qid: self.qid,
            ..Default::default()
        };
        let e = sys::fuse_cmd(
            self.dev.as_raw_fd(),
            abi::FUSE_IO_URING_CMD_REGISTER,
            &req,
            Some((self.iovs[i].as_ptr(), 2)),
            i as u64,
        );
        // SAFETY: the iovec array and the buffers it points to are owned by
        // this worker and outlive the ring (field order).
        unsafe { sys::push(&mut self.ring, &e) }
    }

    fn push_commit(&mut self, i: usize, unique: u64) -> io::Result<()> {
        let req = abi::fuse_uring_cmd_req {
            commit_id: unique,
            qid: self.qid,
            ..Default::default()
        };
        let e = sys::fuse_cmd(
            self.dev.as_raw_fd(),
            abi::FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
            &req,
            None,
            i as u64,
        );
        // SAFETY: as for REGISTER: the entry's buffers live as long as the ring.
        unsafe { sys::push(&mut self.ring, &e) }
    }

    fn submit(&mut self, wait: usize) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(wait) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(io::Error::new(e.kind(), format!("io_uring_enter: {e}"))),
            }
        }
    }

    /// Submits what is queued (commits) and returns once at least one
    /// completion is waiting: first by polling the completion queue for up
    /// to `spin`, yielding the CPU between polls (see the module doc), then
    /// by sleeping in `io_uring_enter(GETEVENTS)`.
    fn wait(&mut self) -> io::Result<()> {
        if self.spin.is_zero() {
            return self.submit(1);
        }
        let start = Instant::now();
        if start < self.no_spin_until {
            return self.submit(1);
        }
        if !self.ring.submission().is_empty() {
            self.submit(0)?;
        }
        let deadline = start + self.spin;
        loop {
            if !self.ring.completion().is_empty() {
                return Ok(());
            }
            let before = Instant::now();
            if before >= deadline {
                break;
            }
            // sched_yield(2): returns at once when nothing else wants this
            // CPU, which makes this a plain busy-poll.
            thread::yield_now();
            // A yield that outlasted the whole window means other work
            // holds this CPU: polling would only push this worker behind it
            // (each yield moves its scheduling deadline back).
            if before.elapsed() > self.spin {
                break;
            }
        }
        // The poll did not pay: sleep at once for a while, so that a busy
        // CPU or an idle connection costs one window per backoff, not one
        // per request.
        self.no_spin_until = Instant::now() + self.spin * SPIN_BACKOFF;
        self.submit(1)
    }

    fn live(&self) -> usize {
        self.pending.iter().filter(|p| **p != Pending::Done).count()
    }

    /// Serves requests until every entry has ended or `stop` is signalled.
    fn run(&mut self) -> io::Result<()> {
        let mut first_err: Option<io::Error> = None;
        let mut live = self.live();
        while live > 0 {
            self.wait()?;
            self.completions.clear();
            self.completions
                .extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for k in 0..self.completions.len() {
                let (ud, res) = self.completions[k];
                if ud == STOP {
                    return first_err.map_or(Ok(()), Err);
                }
                if ud == WAKE {
                    self.commit_later()?;
                    continue;
                }
                let i = ud as usize;
                let Some(&pending) = self.pending.get(i) else { continue };
                let next = match (res, pending) {
                    (0, _) => match self.serve(i) {
                        (unique, true) => Pending::Deferred { unique },
                        (unique, false) => {
                            self.push_commit(i, unique)?;
                            Pending::Commit { unique }
                        }
                    },
                    (r, Pending::Register { attempts }) if r == -libc::EAGAIN && attempts < REGISTER_ATTEMPTS => {
                        thread::sleep(REGISTER_RETRY);
                        self.push_register(i)?;
                        Pending::Register { attempts: attempts + 1 }
                    }
                    (r, Pending::Register { attempts }) if r == -libc::EINTR => {
                        self.push_register(i)?;
                        Pending::Register { attempts }
                    }
                    (r, Pending::Commit { unique }) if r == -libc::EINTR => {
                        self.push_commit(i, unique)?;
                        Pending::Commit { unique }
                    }
                    (r, p) => {
                        live -= 1;
                        if let Some(e) = self.ended(i, p, -r) {
                            first_err.get_or_insert(e);
                        }
                        Pending::Done
                    }
                };
                self.pending[i] = next;
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// An entry's command failed with `errno`: the connection's end is
    /// quiet, anything else is reported.
    fn ended(&self, i: usize, p: Pending, errno: i32) -> Option<io::Error> {
        let what = match p {
            Pending::Register { .. } => "REGISTER",
            _ => "COMMIT_AND_FETCH",
        };
        match errno {
            libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => None,
            libc::EOPNOTSUPP => Some(io::Error::other(format!(
                "uring queue {}: REGISTER refused (EOPNOTSUPP): {ENABLE_URING_PARAM} is off",
                self.qid
            ))),
            _ => {
                let e = io::Error::from_raw_os_error(errno);
                Some(io::Error::new(
                    e.kind(),
                    format!("uring queue {} entry {i}: {what} failed: {e}", self.qid),
                ))
            }
        }
    }

    /// Serves the request in entry `i` and leaves the reply in its
    /// buffers; returns the request's `unique` (the commit id) and whether
    /// the reply comes later, through the mailbox, instead.
    fn serve(&mut self, i: usize) -> (u64, bool) {
        let Worker {
            headers,
            payloads,
            request,
            reply,
            dispatcher,
            payload,
            setxattr_ext,
            later,
            ..
        } = self;
        // SAFETY: entry `i`'s completion was just reaped and its next
        // command is pushed only after this returns, so the kernel does not
        // touch these ranges now; the two regions are distinct mappings.
        let (header, body) = unsafe {
            (
                headers.slice_mut(i * HEADER_SIZE, HEADER_SIZE),
                payloads.slice_mut(i * *payload, *payload),
            )
        };
        match entry::assemble(header, body, *setxattr_ext, request) {
            Ok(arrived) => {
                match dispatcher.handle_with(request, reply, Transport::Uring, Some(later)) {
                    Outcome::Reply | Outcome::Destroy => entry::store_reply(reply, arrived.unique, header, body),
                    Outcome::Deferred => return (arrived.unique, true),
                    // Only requests that take no answer (never sent over the
                    // rings) or unreadable ones get here; the entry must
                    // still be committed to be fetched again.
                    Outcome::NoReply => entry::store_error(arrived.unique, Errno::EIO, header),
                }
                (arrived.unique, false)
            }
            Err((arrived, why)) => {
                tracing::warn!(
                    "uring: {} request {} malformed ({why:?}); answering EIO",
                    abi::opcode_name(arrived.opcode),
                    arrived.unique
                );
                entry::store_error(arrived.unique, Errno::EIO, header);
                (arrived.unique, false)
            }
        }
    }
}

/// Replies answered later, on their way from the answering thread to the
/// worker that holds the request's entry.
struct Mailbox {
    replies: Mutex<Vec<(u64, Vec<u8>)>>,
    wake: EventFd,
}

impl ReplySink for Mailbox {
    fn send(&self, unique: u64, reply: &[u8]) {
        self.replies.lock().unpoison().push((unique, reply.to_vec()));
        self.wake.signal();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("0-2,4,6-7").unwrap(), vec![0, 1, 2, 4, 6, 7]);
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert!(parse_cpu_list("0-99999").is_err());
    }

    #[test]
    fn possible_cpus_of_this_machine() {
        let cpus = possible_cpus().unwrap();
        assert!(!cpus.is_empty());
        assert_eq!(cpus[0], 0);
    }

    #[test]
    fn payload_follows_negotiation() {
        let mut n = Negotiated {
            major: 7,
            minor: 45,
            kernel_flags: 0,
            flags: 0,
            max_write: 4096,
            max_pages: 1,
            max_readahead: 0,
            max_background: 12,
            congestion_threshold: 9,
            time_gran: 1,
        };
        assert_eq!(payload_size(&n), 8192);
        n.max_write = 131072;
        n.max_pages = 32;
        assert_eq!(payload_size(&n), 131072);
        n.max_write = 65536;
        n.max_pages = 256;
        assert_eq!(payload_size(&n), 1 << 20);
    }
}
