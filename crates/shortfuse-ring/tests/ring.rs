//! The rings without the shim: a `Server` over `MemFs` in this process,
//! clients speaking raw FUSE through `RingClient`, a client in a child
//! process that is killed mid-request, a client that scribbles over
//! its own shared memory, a handle that outlives its connection with the
//! open file description it was given to, handles owned by the process
//! that opened them, a waiting SETLKW, the locks of a description gone
//! once it closes, a stop with a request in flight,
//! and positions reserved and published late or never.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shortfuse::{Attr, Errno, FileHandle, Filesystem, MountOptions, NodeId, Stats};
use shortfuse_abi as abi;
use shortfuse_fs::mem::MemFs;
use shortfuse_fs::pattern::Xorshift;
use shortfuse_ring::region::{self, slot, Geometry};
use shortfuse_ring::{Anchoring, Notice, RingClient, Server, ServerConfig};
use zerocopy::{FromBytes, IntoBytes};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sf-ring-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join("ring.sock")
}

fn server(path: &Path) -> (Server, Arc<Stats>) {
    server_with(path, 2, 2)
}

/// A server over `MemFs` with `queues` queues of `slots` slots.
fn server_with(path: &Path, queues: u32, slots: u32) -> (Server, Arc<Stats>) {
    let stats = Arc::new(Stats::new());
    let config = ServerConfig {
        queues,
        slots,
        max_io: 64 << 10,
        records: 8,
        ..ServerConfig::default()
    };
    let s = Server::start(
        path,
        Arc::new(MemFs::new()),
        MountOptions::default(),
        stats.clone(),
        config,
    )
    .unwrap();
    (s, stats)
}

static UNIQUE: AtomicU32 = AtomicU32::new(1);

/// A FUSE request: header, fixed argument, NUL-terminated names.
fn request(opcode: u32, nodeid: u64, arg: &[u8], names: &[&[u8]]) -> Vec<u8> {
    let mut r = Vec::new();
    let h = abi::fuse_in_header {
        len: 0,
        opcode,
        unique: u64::from(UNIQUE.fetch_add(1, Ordering::Relaxed)),
        nodeid,
        uid: 0,
        gid: 0,
        pid: 1,
        total_extlen: 0,
        padding: 0,
    };
    r.extend_from_slice(h.as_bytes());
    r.extend_from_slice(arg);
    for n in names {
        r.extend_from_slice(n);
        r.push(0);
    }
    let len = r.len() as u32;
    r[..4].copy_from_slice(&len.to_ne_bytes());
    r
}

/// Sends a request; the reply's error and payload.
fn call(c: &RingClient, req: &[u8]) -> Result<(i32, Vec<u8>), Errno> {
    let mut reply = Vec::new();
    c.call(req, &mut reply)?;
    if reply.is_empty() {
        return Ok((0, reply));
    }
    let (h, _) = abi::fuse_out_header::read_from_prefix(&reply).unwrap();
    assert_eq!(h.len as usize, reply.len());
    assert_eq!(&h.unique.to_ne_bytes()[..], &req[8..16]);
    Ok((h.error, reply[16..].to_vec()))
}

fn init_request() -> Vec<u8> {
    init_request_offering(0)
}

/// An INIT that offers the `FUSE_*` capability bits `flags`.
fn init_request_offering(flags: u32) -> Vec<u8> {
    let arg = abi::fuse_init_in {
        major: abi::FUSE_KERNEL_VERSION,
        minor: abi::FUSE_KERNEL_MINOR_VERSION,
        max_readahead: 0,
        flags,
        flags2: 0,
        unused: [0; 11],
    };
    request(abi::FUSE_INIT, 0, arg.as_bytes(), &[])
}

fn init(c: &RingClient) {
    init_offering(c, 0);
}

fn init_offering(c: &RingClient, flags: u32) {
    let (err, _) = call(c, &init_request_offering(flags)).unwrap();
    assert_eq!(err, 0);
}

fn create(c: &RingClient, name: &[u8]) -> (u64, u64) {
    let arg = abi::fuse_create_in {
        flags: libc::O_RDWR as u32,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        open_flags: 0,
    };
    let (err, p) = call(c, &request(abi::FUSE_CREATE, 1, arg.as_bytes(), &[name])).unwrap();
    assert_eq!(err, 0, "create {name:?}");
    let (e, rest) = abi::fuse_entry_out::read_from_prefix(&p).unwrap();
    let (o, _) = abi::fuse_open_out::read_from_prefix(rest).unwrap();
    (e.nodeid, o.fh)
}

fn write(c: &RingClient, node: u64, fh: u64, data: &[u8]) -> i32 {
    let arg = abi::fuse_write_in {
        fh,
        offset: 0,
        size: data.len() as u32,
        ..Default::default()
    };
    let mut a = arg.as_bytes().to_vec();
    a.extend_from_slice(data);
    call(c, &request(abi::FUSE_WRITE, node, &a, &[])).unwrap().0
}

fn read(c: &RingClient, node: u64, fh: u64, size: u32) -> Vec<u8> {
    let arg = abi::fuse_read_in {
        fh,
        offset: 0,
        size,
        ..Default::default()
    };
    let (err, p) = call(c, &request(abi::FUSE_READ, node, arg.as_bytes(), &[])).unwrap();
    assert_eq!(err, 0);
    p
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// Test set-up of the same shape recurs from test to test below: kept apart
// so each test reads on its own.
#[test]
fn requests_round_trip_and_largest_writes_fit() {
    let path = scratch("rt");
    let (_s, stats) = server(&path);
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    let (node, fh) = create(&c, b"f");
    let big = vec![0x5a; 64 << 10];
    assert_eq!(write(&c, node, fh, &big), 0);
    assert_eq!(read(&c, node, fh, 64 << 10), big);
    // Larger than a slot: refused before it reaches the daemon.
    let mut reply = Vec::new();
    assert_eq!(c.call(&vec![0; (64 << 10) + 8192], &mut reply), Err(Errno::E2BIG));
    // Threads on both queues at once.
    std::thread::scope(|s| {
        for t in 0..4 {
            let c = &c;
            s.spawn(move || {
                for _ in 0..200 {
                    let (err, _) = call(c, &request(abi::FUSE_GETATTR, 1, &[0; 16], &[])).unwrap();
                    assert_eq!(err, 0, "thread {t}");
                }
            });
        }
    });
    let snap = stats.snapshot();
    let ring = snap.transports.iter().find(|(t, _)| t.name() == "ring").unwrap().1;
    assert!(ring >= 803, "{ring} requests over the ring");
    // DESTROY would end the file system for everyone.
    let (err, _) = call(&c, &request(abi::FUSE_DESTROY, 0, &[], &[])).unwrap();
    assert_eq!(err, -libc::EPERM);
}

/// The notices pending for `c`, as words.
fn notices(c: &RingClient) -> Vec<String> {
    let mut seen = Vec::new();
    c.notices(|n| {
        seen.push(match n {
            Notice::Inode(i) => format!("inode {i}"),
            Notice::Entry { parent, name } => format!("entry {parent} {}", String::from_utf8_lossy(name)),
            Notice::All => "all".into(),
        })
    });
    seen
}

#[test]
fn other_clients_are_told_what_changed() {
    let path = scratch("notify");
    let (_s, _) = server(&path);
    let a = RingClient::connect(&path).unwrap();
    let b = RingClient::connect(&path).unwrap();
    init(&a);
    init(&b);
    let (node, fh) = create(&a, b"shared");
    assert_eq!(write(&a, node, fh, b"x"), 0);
    assert_eq!(notices(&b), ["entry 1 shared".to_string(), format!("inode {node}")]);
    // The writer is not told about its own changes.
    a.notices(|n| panic!("a was told {n:?}"));
    // More changes than records: b is told to drop everything, once.
    for _ in 0..20 {
        assert_eq!(write(&a, node, fh, b"y"), 0);
    }
    let mut all = 0;
    b.notices(|n| {
        assert_eq!(n, Notice::All);
        all += 1;
    });
    assert_eq!(all, 1);
    b.notices(|n| panic!("b was told {n:?} twice"));
}

/// An open with O_TRUNC (as the kernel and the shim send it once
/// `FUSE_ATOMIC_O_TRUNC` is agreed) empties the file: the other clients are
/// told, as of a write; an open without it changes nothing and is not.
#[test]
fn an_open_that_truncates_is_announced() {
    let path = scratch("otrunc");
    let (_s, _) = server(&path);
    let a = RingClient::connect(&path).unwrap();
    let b = RingClient::connect(&path).unwrap();
    init_offering(&a, abi::FUSE_ATOMIC_O_TRUNC as u32);
    init_offering(&b, abi::FUSE_ATOMIC_O_TRUNC as u32);
    let (node, fh) = create(&a, b"trunc");
    assert_eq!(write(&a, node, fh, b"data"), 0);
    b.notices(|_| {});
    let open = |flags: i32| {
        let arg = abi::fuse_open_in {
            flags: flags as u32,
            open_flags: 0,
        };
        let (err, _) = call(&a, &request(abi::FUSE_OPEN, node, arg.as_bytes(), &[])).unwrap();
        assert_eq!(err, 0, "open {flags:#o}");
    };
    open(libc::O_RDWR);
    assert_eq!(notices(&b), Vec::<String>::new(), "a plain open changes nothing");
    open(libc::O_RDWR | libc::O_TRUNC);
    assert_eq!(read(&b, node, fh, 16), b"", "the open emptied the file");
    assert_eq!(notices(&b), [format!("inode {node}")]);
}

/// What the file system notifies through the notifier its `init` got (the
/// server's) reaches every client's notification ring.
#[test]
fn the_file_systems_notifications_reach_every_client() {
    /// `MemFs` that keeps the notifier it is given.
    struct Keeps(MemFs, std::sync::OnceLock<shortfuse::Notifier>);
    impl Filesystem for Keeps {
        fn init(&self, config: &mut shortfuse::InitConfig) -> shortfuse::Result<()> {
            let _ = self.1.set(config.notifier.clone());
            self.0.init(config)
        }
    }
    let path = scratch("fsnotify");
    let fs = Arc::new(Keeps(MemFs::new(), std::sync::OnceLock::new()));
    let s = Server::start(
        &path,
        fs.clone(),
        MountOptions::default(),
        Arc::new(Stats::new()),
        ServerConfig::default(),
    )
    .unwrap();
    let a = RingClient::connect(&path).unwrap();
    let b = RingClient::connect(&path).unwrap();
    init(&a);
    init(&b);
    let n = fs.1.get().expect("init gave the notifier");
    assert_eq!(
        n,
        s.notifier(),
        "every client's dispatcher shares the server's notifier"
    );
    // No kernel behind this server: the clients hear, the kernel part says so.
    let e = n.inval_inode(NodeId(7), 0, 0).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotConnected);
    let _ = n.delete(NodeId::ROOT, NodeId(7), std::ffi::OsStr::new("gone"));
    let _ = n.store(NodeId(8), 0, b"data");
    for c in [&a, &b] {
        assert_eq!(notices(c), ["inode 7", "entry 1 gone", "inode 8"]);
    }
}

#[test]
fn a_stopped_daemon_fails_calls_with_enotconn() {
    let path = scratch("stop");
    let (mut s, _) = server(&path);
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    s.stop();
    let t = Instant::now();
    let mut reply = Vec::new();
    assert_eq!(
        c.call(&request(abi::FUSE_GETATTR, 1, &[0; 16], &[]), &mut reply),
        Err(Errno::ENOTCONN)
    );
    // Against a hang only: how soon (the README's 50 ms) is measured by
    // `shortfuse bench rings`.
    assert!(t.elapsed() < Duration::from_secs(30));
    assert!(c.is_dead());
    assert!(RingClient::connect(&path).is_err());
}

/// A file system whose getattr takes a while, and which records whether
/// one was still running when it was destroyed.
#[derive(Default)]
struct SlowAttr {
    running: AtomicU32,
    destroyed_while_running: AtomicBool,
}

impl Filesystem for SlowAttr {
    fn getattr(&self, _: &shortfuse::Request, node: NodeId, _: Option<FileHandle>) -> shortfuse::Result<Attr> {
        self.running.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(300));
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(Attr {
            ino: node.0,
            mode: libc::S_IFDIR | 0o755,
            nlink: 2,
            ..Attr::default()
        })
    }

    fn destroy(&self) {
        if self.running.load(Ordering::SeqCst) != 0 {
            self.destroyed_while_running.store(true, Ordering::SeqCst);
        }
    }
}

#[test]
fn stop_waits_for_the_requests_in_flight() {
    let path = scratch("stop-in-flight");
    let fs = Arc::new(SlowAttr::default());
    let mut s = Server::start(
        &path,
        fs.clone(),
        MountOptions::default(),
        Arc::new(Stats::new()),
        ServerConfig::default(),
    )
    .unwrap();
    let c = Arc::new(RingClient::connect(&path).unwrap());
    init(&c);
    let asking = {
        let c = c.clone();
        std::thread::spawn(move || c.call(&request(abi::FUSE_GETATTR, 1, &[0; 16], &[]), &mut Vec::new()))
    };
    wait_for("the getattr to reach the file system", || {
        fs.running.load(Ordering::SeqCst) == 1
    });
    s.stop();
    // What a daemon does next (serve.rs): the file system's last call.
    fs.destroy();
    assert!(
        !fs.destroyed_while_running.load(Ordering::SeqCst),
        "stop returned with a request still in the file system"
    );
    // The caller got an answer or ENOTCONN, never a hang.
    assert!(matches!(asking.join().unwrap(), Ok(()) | Err(Errno::ENOTCONN)));
}

/// Creates and writes files, each left open: 100 of them against a server
/// of its own, or, as the child of `a_killed_client_gives_back_its_handles`
/// (`SF_RING_CHILD` names the socket), until killed.
#[test]
fn child_client() {
    let (path, own) = match std::env::var_os("SF_RING_CHILD") {
        Some(p) => (PathBuf::from(p), None),
        None => {
            let p = scratch("child");
            let s = server(&p);
            (p, Some(s))
        }
    };
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    let forever = own.is_none();
    let mut i = 0u64;
    while forever || i < 100 {
        let (node, fh) = create(&c, format!("c{i}").as_bytes());
        assert_eq!(write(&c, node, fh, &[1; 4096]), 0);
        i += 1;
    }
    assert_eq!(own.map(|(s, _)| s.held()), Some((100, 100)));
}

#[test]
fn a_killed_client_gives_back_its_handles() {
    let path = scratch("kill");
    let (s, _) = server(&path);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_client", "--nocapture"])
        .env("SF_RING_CHILD", &path)
        .spawn()
        .unwrap();
    wait_for("the child's handles", || s.held().0 >= 20);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_for("the child's departure", || s.clients() == 0);
    assert_eq!(s.held(), (0, 0));
    // The daemon serves the next client as before.
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    let (node, fh) = create(&c, b"after");
    assert_eq!(write(&c, node, fh, b"ok"), 0);
    assert_eq!(read(&c, node, fh, 10), b"ok");
}

/// A memfd, as the shim makes for an open file description.
fn description() -> std::fs::File {
    // SAFETY: a NUL-terminated name; the result is a new descriptor we own.
    let fd = unsafe { libc::memfd_create(c"sfofd:test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd is new and ours.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

#[test]
fn an_anchored_handle_outlives_its_connection_until_its_description_closes() {
    use std::os::fd::AsFd;
    let path = scratch("anchor");
    let (s, stats) = server(&path);
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    let (node, fh) = create(&c, b"f");
    let d = description();
    // A handle the client does not hold is not taken.
    let other = description();
    let anchoring = |fh, d| Anchoring {
        node,
        fh,
        dir: false,
        description: d,
    };
    c.anchor(&[anchoring(fh, d.as_fd()), anchoring(fh + 1000, other.as_fd())])
        .unwrap();
    // Taken once anchor returns.
    assert_eq!(s.held(), (1, 1));
    // The connection goes (an exec'd image, say); the description stays.
    drop(c);
    wait_for("the departure", || s.clients() == 0);
    assert_eq!(s.held(), (1, 0));
    let releases = count(&stats, abi::FUSE_RELEASE);
    // Its last descriptor closes: the handle goes back.
    drop(d);
    wait_for("the release", || s.held() == (0, 0));
    assert_eq!(count(&stats, abi::FUSE_RELEASE), releases + 1);
}

fn release_request(node: u64, fh: u64) -> Vec<u8> {
    let arg = abi::fuse_release_in {
        fh,
        ..Default::default()
    };
    request(abi::FUSE_RELEASE, node, arg.as_bytes(), &[])
}

#[test]
fn a_process_sharing_a_connection_owns_the_handles_it_opened() {
    let path = scratch("forked");
    let (s, stats) = server(&path);
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    let (node, fh) = create(&c, b"parents");
    // Built before the fork: the child allocates nothing (another thread
    // of the test may hold the allocator's lock).
    let not_its_own = release_request(node, fh);
    let create_arg = abi::fuse_create_in {
        flags: libc::O_RDWR as u32,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        open_flags: 0,
    };
    let create_req = request(abi::FUSE_CREATE, 1, create_arg.as_bytes(), &[b"childs"]);
    let mut reply = Vec::with_capacity(4096);
    let releases = count(&stats, abi::FUSE_RELEASE);
    // SAFETY: the child only uses the ring (atomics, futexes, no lock, no
    // allocation) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // A RELEASE of the parent's handle is answered and not passed on;
        // the child's own handle is never released by it: the daemon gives
        // it back when the child ends, while the connection lives on.
        let ok = c.call(&not_its_own, &mut reply).is_ok() && c.call(&create_req, &mut reply).is_ok();
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(status, 0);
    // The daemon counts a RELEASE once it has run, after the handle left
    // its table.
    wait_for("the child's handle to go", || {
        s.held().0 == 1 && count(&stats, abi::FUSE_RELEASE) > releases
    });
    assert_eq!(s.clients(), 1);
    assert_eq!(count(&stats, abi::FUSE_RELEASE), releases + 1);
    // The parent's handle is still good, and still its own to release.
    assert_eq!(write(&c, node, fh, b"still open"), 0);
    let (err, _) = call(&c, &release_request(node, fh)).unwrap();
    assert_eq!(err, 0);
    assert_eq!(s.held().0, 0);
    wait_for("the parent's RELEASE to count", || {
        count(&stats, abi::FUSE_RELEASE) > releases + 1
    });
    assert_eq!(count(&stats, abi::FUSE_RELEASE), releases + 2);
}

fn count(stats: &Stats, opcode: u32) -> u64 {
    stats
        .snapshot()
        .ops
        .iter()
        .filter(|o| o.opcode == Some(opcode))
        .map(|o| o.count)
        .sum()
}

fn setlk(c: &RingClient, node: u64, fh: u64, owner: u64, typ: i32, wait: bool) -> i32 {
    lock_call(c, node, fh, owner, typ, wait, 0)
}

/// flock(2) as FUSE sends it: a whole-file SETLK with FUSE_LK_FLOCK.
fn flock(c: &RingClient, node: u64, fh: u64, owner: u64, typ: i32) -> i32 {
    lock_call(c, node, fh, owner, typ, false, abi::FUSE_LK_FLOCK)
}

fn lock_call(c: &RingClient, node: u64, fh: u64, owner: u64, typ: i32, wait: bool, lk_flags: u32) -> i32 {
    let arg = abi::fuse_lk_in {
        fh,
        owner,
        lk: abi::fuse_file_lock {
            start: 0,
            end: u64::MAX,
            typ: typ as u32,
            pid: 0,
        },
        lk_flags,
        padding: 0,
    };
    let op = if wait { abi::FUSE_SETLKW } else { abi::FUSE_SETLK };
    call(c, &request(op, node, arg.as_bytes(), &[])).unwrap().0
}

#[test]
fn a_waiting_setlkw_holds_up_no_other_request() {
    let path = scratch("setlkw");
    let (_s, _) = server(&path);
    let a = RingClient::connect(&path).unwrap();
    init(&a);
    let (node, fh) = create(&a, b"locked");
    assert_eq!(setlk(&a, node, fh, 1, libc::F_WRLCK, false), 0);
    let b = Arc::new(RingClient::connect(&path).unwrap());
    init(&b);
    assert_eq!(setlk(&b, node, fh, 2, libc::F_WRLCK, false), -libc::EAGAIN);
    let waiter = {
        let b = b.clone();
        std::thread::spawn(move || setlk(&b, node, fh, 2, libc::F_WRLCK, true))
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(!waiter.is_finished());
    // The waiting client's other requests are served meanwhile, on every queue.
    for _ in 0..8 {
        assert_eq!(write(&b, node, fh, b"meanwhile"), 0);
    }
    assert_eq!(setlk(&a, node, fh, 1, libc::F_UNLCK, false), 0);
    assert_eq!(waiter.join().unwrap(), 0);
    assert_eq!(setlk(&a, node, fh, 1, libc::F_RDLCK, false), -libc::EAGAIN);
}

/// `MemFs` whose release takes a while, as a daemon's that forwards it
/// to another (`shortfuse serve -- bindfs`).
struct SlowRelease(MemFs);

impl Filesystem for SlowRelease {
    fn init(&self, config: &mut shortfuse::InitConfig) -> shortfuse::Result<()> {
        self.0.init(config)
    }

    fn create(
        &self,
        req: &shortfuse::Request,
        parent: NodeId,
        name: &std::ffi::OsStr,
        new: &shortfuse::NewNode,
        flags: shortfuse::OpenFlags,
    ) -> shortfuse::Result<shortfuse::Created> {
        self.0.create(req, parent, name, new, flags)
    }

    fn release(
        &self,
        req: &shortfuse::Request,
        node: NodeId,
        fh: FileHandle,
        args: &shortfuse::ReleaseArgs,
    ) -> shortfuse::Result<()> {
        std::thread::sleep(Duration::from_millis(500));
        self.0.release(req, node, fh, args)
    }
}

/// As a kernel drops a description's flock and OFD locks in its last
/// close, a lock request sent after that close no longer meets them, even
/// while the daemon is still releasing the description's handle.
#[test]
fn a_closed_description_s_locks_are_gone_for_the_next_request() {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    // In a process of its own: a child another test forks meanwhile holds
    // a copy of the description, and the test's close is not the last.
    if std::env::var_os("SF_RING_ALONE").is_none() {
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_closed_description_s_locks_are_gone_for_the_next_request",
                "--nocapture",
            ])
            .env("SF_RING_ALONE", "1")
            .status()
            .unwrap();
        assert!(status.success(), "{status}");
        return;
    }
    let path = scratch("closed-locks");
    let s = Server::start(
        &path,
        Arc::new(SlowRelease(MemFs::new())),
        MountOptions::default(),
        Arc::new(Stats::new()),
        ServerConfig::default(),
    )
    .unwrap();
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    let owner = |d: &std::fs::File| shortfuse_ring::DESCRIPTION_OWNER | d.metadata().unwrap().ino();
    for round in 0..2 {
        let (node, fh) = create(&c, format!("f{round}").as_bytes());
        let (first, second) = (description(), description());
        c.anchor(&[Anchoring {
            node,
            fh,
            dir: false,
            description: first.as_fd(),
        }])
        .unwrap();
        let (a, b) = (owner(&first), owner(&second));
        // Round 0 with flock, round 1 with an OFD byte-range lock.
        let take = |o, typ| {
            if round == 0 {
                flock(&c, node, fh, o, typ)
            } else {
                setlk(&c, node, fh, o, typ, false)
            }
        };
        assert_eq!(take(a, libc::F_WRLCK), 0);
        assert_eq!(take(b, libc::F_WRLCK), -libc::EAGAIN);
        drop(first);
        assert_eq!(
            take(b, libc::F_WRLCK),
            0,
            "round {round}: the closed description's lock stayed"
        );
        assert_eq!(take(b, libc::F_UNLCK), 0);
    }
    // And the handles go back too.
    wait_for("the releases", || s.held().0 == 0);
}

/// A client that does the handshake itself and keeps its region's memfd.
fn raw_client(path: &Path) -> (OwnedFd, OwnedFd, Geometry) {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain socket calls on descriptors this test owns; the
    // buffers outlive the calls.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let sock = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as u16;
        for (d, s) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
            *d = *s as libc::c_char;
        }
        let r = libc::connect(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of_val(&addr) as u32,
        );
        assert_eq!(r, 0);
        let hello: [u64; 2] = [region::MAGIC, u64::from(region::VERSION)];
        assert!(libc::send(fd, hello.as_ptr().cast(), 16, 0) == 16);
        let mut buf = [0u8; 256];
        let mut cbuf = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        assert!(libc::recvmsg(fd, &mut msg, 0) > 0);
        let c = libc::CMSG_FIRSTHDR(&msg);
        assert!(!c.is_null());
        let memfd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>()));
        let w: [u32; 6] = std::ptr::read_unaligned(buf[12..].as_ptr().cast());
        let g = Geometry {
            queues: w[0],
            slots: w[1],
            slot_data: w[2],
            records: w[3],
        };
        (sock, memfd, g)
    }
}

#[test]
fn garbage_in_a_clients_ring_harms_nobody_else() {
    let path = scratch("fuzz");
    let (s, _) = server(&path);
    let good = RingClient::connect(&path).unwrap();
    init(&good);
    let (node, fh) = create(&good, b"mine");
    assert_eq!(write(&good, node, fh, b"private"), 0);
    let (sock, memfd, g) = raw_client(&path);
    let len = g.bytes();
    // The memfd is sealed: the client cannot shrink it under the daemon.
    // SAFETY: ftruncate on our own descriptor.
    assert!(unsafe { libc::ftruncate(memfd.as_raw_fd(), 4096) } < 0);
    // SAFETY: a fresh shared mapping of the client's region; this test is
    // the only user of the pointer and unmaps it at the end.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            0,
        )
    } as *mut u8;
    assert!(base as isize != -1);
    let word = |off: usize| {
        // SAFETY: `off` is inside the mapping and 4-aligned.
        unsafe { &*(base.add(off) as *const AtomicU32) }
    };
    // xorshift: reproducible garbage.
    let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
    let started = Instant::now();
    let mut rounds = 0;
    while started.elapsed() < Duration::from_secs(2) {
        rounds += 1;
        for _ in 0..64 {
            let q = (rng.next_u64() % u64::from(g.queues)) as usize;
            let i = (rng.next_u64() % u64::from(g.slots)) as usize;
            let off = g.slot_off(q, i);
            match rng.next_u64() % 6 {
                // Random words anywhere in the region.
                0 => word((rng.next_u64() as usize % (len / 4)) * 4).store(rng.next_u64() as u32, Ordering::Relaxed),
                // A slot with an absurd length, or a plausible header with a
                // random opcode and random body.
                1 => word(off + 4).store(rng.next_u64() as u32, Ordering::Relaxed),
                2 | 3 => {
                    let n = 40 + (rng.next_u64() % 200) as usize;
                    for k in (0..n).step_by(4) {
                        word(off + region::SLOT_HEADER + k).store(rng.next_u64() as u32, Ordering::Relaxed);
                    }
                    word(off + region::SLOT_HEADER).store(n as u32, Ordering::Relaxed);
                    word(off + region::SLOT_HEADER + 4).store((rng.next_u64() % 60) as u32, Ordering::Relaxed);
                    word(off + 4).store(n as u32, Ordering::Relaxed);
                }
                // Publish random (often out-of-range) indices, ring the bell.
                _ => {
                    let pos = word(g.tail_off(q)).fetch_add(1, Ordering::Relaxed);
                    let idx = if rng.next_u64().is_multiple_of(2) {
                        i as u32
                    } else {
                        rng.next_u64() as u32
                    };
                    word(g.entry_off(q, pos)).store(region::entry(pos, idx), Ordering::Release);
                    word(g.slot_off(q, i)).store(slot::SUBMITTED, Ordering::Release);
                    word(g.doorbell_off(q)).store(0, Ordering::SeqCst);
                    // SAFETY: a futex wake on a word of the mapping.
                    unsafe { libc::syscall(libc::SYS_futex, word(g.doorbell_off(q)).as_ptr(), libc::FUTEX_WAKE, 1) };
                }
            }
        }
        // The well-behaved client is served, and sees only its own data.
        assert_eq!(read(&good, node, fh, 100), b"private", "round {rounds}");
    }
    // SAFETY: the mapping is not used after this.
    unsafe { libc::munmap(base.cast(), len) };
    drop(memfd);
    drop(sock);
    wait_for("the garbage client's departure", || s.clients() == 1);
    assert_eq!(read(&good, node, fh, 100), b"private");
}

/// A client whose region this test writes itself, word by word, as a
/// process of the connection would (or a buggy one).
struct RawRegion {
    _sock: OwnedFd,
    _memfd: OwnedFd,
    base: *mut u8,
    g: Geometry,
}

impl RawRegion {
    fn connect(path: &Path) -> RawRegion {
        let (sock, memfd, g) = raw_client(path);
        // SAFETY: a fresh shared mapping of the client's region, unmapped on drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                g.bytes(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                memfd.as_raw_fd(),
                0,
            )
        } as *mut u8;
        assert!(base as isize != -1);
        RawRegion {
            _sock: sock,
            _memfd: memfd,
            base,
            g,
        }
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= self.g.bytes() && off.is_multiple_of(4));
        // SAFETY: `off` is inside the mapping and 4-aligned (checked).
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    /// Reserves the next position of queue `q`.
    fn reserve(&self, q: usize) -> u32 {
        self.word(self.g.tail_off(q)).fetch_add(1, Ordering::Relaxed)
    }

    /// Writes `req` into slot `i` of queue `q`, submitted.
    fn fill(&self, q: usize, i: usize, req: &[u8]) {
        let off = self.g.slot_off(q, i);
        for (k, chunk) in req.chunks(4).enumerate() {
            let mut w = [0u8; 4];
            w[..chunk.len()].copy_from_slice(chunk);
            self.word(off + region::SLOT_HEADER + 4 * k)
                .store(u32::from_ne_bytes(w), Ordering::Relaxed);
        }
        self.word(off + 4).store(req.len() as u32, Ordering::Relaxed);
        self.word(off).store(slot::SUBMITTED, Ordering::Release);
    }

    /// Publishes slot `i` at position `pos` of queue `q` and rings.
    fn publish(&self, q: usize, pos: u32, i: u32) {
        self.word(self.g.entry_off(q, pos))
            .store(region::entry(pos, i), Ordering::Release);
        let bell = self.word(self.g.doorbell_off(q));
        bell.store(0, Ordering::SeqCst);
        // SAFETY: a futex wake on a word of the mapping.
        unsafe { libc::syscall(libc::SYS_futex, bell.as_ptr(), libc::FUTEX_WAKE, 1) };
    }

    fn done(&self, q: usize, i: usize) -> bool {
        self.word(self.g.slot_off(q, i)).load(Ordering::Acquire) == slot::DONE
    }

    /// Until queue `q`'s worker has gone to sleep on its doorbell.
    fn wait_asleep(&self, q: usize) {
        wait_for("the worker to sleep", || {
            self.word(self.g.doorbell_off(q)).load(Ordering::SeqCst) == 1
        });
    }
}

impl Drop for RawRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping is not used after this.
        unsafe { libc::munmap(self.base.cast(), self.g.bytes()) };
    }
}

fn getattr_root() -> Vec<u8> {
    request(abi::FUSE_GETATTR, 1, &[0; 16], &[])
}

#[test]
fn a_position_reserved_and_never_published_is_skipped_and_served_if_it_comes() {
    let path = scratch("hole");
    let (_s, _) = server(&path);
    let good = RingClient::connect(&path).unwrap();
    init(&good);
    // Another connection: a process of it reserved a position and stalled
    // (or died) before it published a slot there.
    let raw = RawRegion::connect(&path);
    let q = 0;
    assert_eq!(raw.reserve(q), 0);
    raw.fill(q, 1, &init_request());
    let pos = raw.reserve(q);
    raw.publish(q, pos, 1);
    wait_for("the request behind the hole", || raw.done(q, 1));
    assert!(raw.word(raw.g.slot_off(q, 1) + 4).load(Ordering::Relaxed) > 16);
    // The well-behaved client was served throughout.
    let (err, _) = call(&good, &getattr_root()).unwrap();
    assert_eq!(err, 0);
    // The stalled process publishes after all: it is served too.
    raw.fill(q, 0, &getattr_root());
    raw.publish(q, 0, 0);
    wait_for("the request published late", || raw.done(q, 0));
}

#[test]
fn a_thread_slow_to_publish_is_waited_for_while_others_ring() {
    let path = scratch("slow-publisher");
    let (_s, _) = server_with(&path, 1, 4);
    let raw = RawRegion::connect(&path);
    let q = 0;
    // One thread reserves position 0 and is descheduled; two others
    // publish behind it, each waking the worker.
    let slow = raw.reserve(q);
    for i in 1..3 {
        raw.wait_asleep(q);
        raw.fill(q, i, &getattr_root());
        let pos = raw.reserve(q);
        raw.publish(q, pos, i as u32);
    }
    raw.wait_asleep(q);
    raw.fill(q, 0, &getattr_root());
    raw.publish(q, slow, 0);
    wait_for("every request", || (0..3).all(|i| raw.done(q, i)));
}

/// The daemon's ring workers in this process (`sf-ring-c<client>q<queue>`),
/// each with the system call it is blocked in (`/proc/.../syscall`'s first
/// field, "running" when it runs or wants to) and how many times it has
/// been given a CPU (`schedstat`'s third field).
fn ring_threads() -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if name.strip_prefix("sf-ring-c").is_some_and(|n| n.contains('q')) {
            let call = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
            let sched = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            out.push((
                name.trim().to_string(),
                call.split_whitespace().next().unwrap_or_default().to_string(),
                sched
                    .split_whitespace()
                    .nth(2)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
            ));
        }
    }
    out.sort();
    out
}

/// Polling is bounded: once the calls stop, the daemon's workers sleep on
/// their futex and are not woken while nobody calls. Runs in a child
/// process of its own (`SF_RING_IDLE`), so that only this test's workers
/// are looked at. A worker that kept polling (even one that yields its CPU,
/// or naps, between polls) is never seen blocked in futex, or is given a
/// CPU again while nothing is asked of it. How little CPU an idle daemon
/// takes is measured by `shortfuse bench rings`.
#[test]
fn idle_rings_use_no_cpu() {
    if std::env::var_os("SF_RING_IDLE").is_none() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "idle_rings_use_no_cpu", "--nocapture"])
            .env("SF_RING_IDLE", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "idle child: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let path = scratch("idle");
    let (_s, _) = server(&path);
    let clients = [RingClient::connect(&path).unwrap(), RingClient::connect(&path).unwrap()];
    std::thread::scope(|t| {
        for c in &clients {
            t.spawn(move || {
                init(c);
                for _ in 0..500 {
                    let (err, _) = call(c, &request(abi::FUSE_GETATTR, 1, &[0; 16], &[])).unwrap();
                    assert_eq!(err, 0);
                }
            });
        }
    });
    let futex = libc::SYS_futex.to_string();
    let asleep = || {
        let w = ring_threads();
        (w.len() == 4 && w.iter().all(|(_, call, _)| *call == futex)).then_some(w)
    };
    let start = Instant::now();
    let before = loop {
        if let Some(w) = asleep() {
            break w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "idle workers never all slept on their futex (two per client): {:?}",
            ring_threads()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // A second with no calls. A sleeping worker wakes only to look for a
    // request whose publisher was descheduled (twice a second); one that
    // polled, even napping between polls, would be given a CPU hundreds of
    // times.
    std::thread::sleep(Duration::from_secs(1));
    let after = ring_threads();
    let names = |w: &[(String, String, u64)]| w.iter().map(|(n, ..)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&before), names(&after));
    for ((name, _, was), (_, _, now)) in before.iter().zip(&after) {
        assert!(now - was <= 10, "{name} ran {} times in an idle second", now - was);
    }
}

/// A server over `MemFs` at a new socket that other users can reach, with
/// `-o allow_other`.
fn shared_server(tag: &str) -> (Server, PathBuf) {
    let path = scratch(tag);
    std::fs::set_permissions(
        path.parent().unwrap(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let opts = MountOptions {
        allow_other: true,
        ..MountOptions::default()
    };
    let s = Server::start(
        &path,
        Arc::new(MemFs::new()),
        opts,
        Arc::new(Stats::new()),
        ServerConfig::default(),
    )
    .unwrap();
    (s, path)
}

/// Runs test `name` of this binary again as uid and gid 65534, with `env`
/// (which tells it it is the child); asserts that it passed.
fn as_nobody(name: &str, env: &[(&str, String)]) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .uid(65534)
        .gid(65534)
        .status()
        .unwrap();
    assert!(status.success(), "the other user's client: {status}");
}

/// A client at `path` that says INIT as `uid` (also its gid).
fn client_as(path: &Path, uid: u32) -> RingClient {
    let c = RingClient::connect(path).unwrap();
    let mut hello = init_request();
    hello[24..32].copy_from_slice(&[uid.to_ne_bytes(), uid.to_ne_bytes()].concat());
    assert_eq!(call(&c, &hello).unwrap().0, 0, "init");
    c
}

/// A request of `uid`/`gid` (the header's fsuid and fsgid).
fn request_as(uid: u32, gid: u32, opcode: u32, nodeid: u64, arg: &[u8], names: &[&[u8]]) -> Vec<u8> {
    let mut r = request(opcode, nodeid, arg, names);
    r[24..28].copy_from_slice(&uid.to_ne_bytes());
    r[28..32].copy_from_slice(&gid.to_ne_bytes());
    r
}

/// With allow_other, a client of another user is served, but only on the
/// nodes it was given: a node id it never looked up (here a file below a
/// directory of mode 0700 it may not search) is refused with ESTALE, and
/// that refusal gives it no lookup either; nodes it looked up work.
#[test]
fn a_client_of_another_user_names_only_nodes_it_was_given() {
    const NOBODY: u32 = 65534;
    if let Some(path) = std::env::var_os("SF_RING_STRANGER") {
        // The child, uid and gid 65534 (set by the parent's Command).
        let secret: u64 = std::env::var("SF_RING_SECRET").unwrap().parse().unwrap();
        let c = client_as(Path::new(&path), NOBODY);
        let getattr = abi::fuse_getattr_in::default();
        let ask = |node: u64| {
            call(
                &c,
                &request_as(NOBODY, NOBODY, abi::FUSE_GETATTR, node, getattr.as_bytes(), &[]),
            )
        };
        assert_eq!(ask(secret).unwrap().0, -libc::ESTALE, "a node never looked up");
        assert_eq!(ask(secret).unwrap().0, -libc::ESTALE, "the refusal gave nothing");
        let (err, p) = call(&c, &request_as(NOBODY, NOBODY, abi::FUSE_LOOKUP, 1, &[], &[b"open"])).unwrap();
        assert_eq!(err, 0, "lookup of a public file");
        let (e, _) = abi::fuse_entry_out::read_from_prefix(&p).unwrap();
        assert_eq!(ask(e.nodeid).unwrap().0, 0, "a node looked up");
        assert_eq!(ask(1).unwrap().0, 0, "the root");
        return;
    }
    let (s, path) = shared_server("stranger");
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    let mkdir = abi::fuse_mkdir_in { mode: 0o700, umask: 0 };
    let (err, p) = call(&c, &request(abi::FUSE_MKDIR, 1, mkdir.as_bytes(), &[b"private"])).unwrap();
    assert_eq!(err, 0);
    let (dir, _) = abi::fuse_entry_out::read_from_prefix(&p).unwrap();
    let mknod = abi::fuse_mknod_in {
        mode: libc::S_IFREG | 0o644,
        ..Default::default()
    };
    let (err, p) = call(
        &c,
        &request(abi::FUSE_MKNOD, dir.nodeid, mknod.as_bytes(), &[b"secret"]),
    )
    .unwrap();
    assert_eq!(err, 0);
    let (secret, _) = abi::fuse_entry_out::read_from_prefix(&p).unwrap();
    let (err, _) = call(&c, &request(abi::FUSE_MKNOD, 1, mknod.as_bytes(), &[b"open"])).unwrap();
    assert_eq!(err, 0);
    as_nobody(
        "a_client_of_another_user_names_only_nodes_it_was_given",
        &[
            ("SF_RING_STRANGER", path.display().to_string()),
            ("SF_RING_SECRET", secret.nodeid.to_string()),
        ],
    );
    drop(s);
}

/// MKNOD of `name` in `parent` as `uid`/`gid`: the new node's id.
fn mknod_as(c: &RingClient, uid: u32, gid: u32, parent: u64, name: &[u8], mode: u32, rdev: u32) -> u64 {
    let arg = abi::fuse_mknod_in {
        mode,
        rdev,
        ..Default::default()
    };
    let (err, p) = call(
        c,
        &request_as(uid, gid, abi::FUSE_MKNOD, parent, arg.as_bytes(), &[name]),
    )
    .unwrap();
    assert_eq!(err, 0, "mknod {name:?}");
    abi::fuse_entry_out::read_from_prefix(&p).unwrap().0.nodeid
}

/// Opens the kernel node behind O_PATH descriptor `fd` as the program
/// does (through its magic link): the new descriptor, or the errno.
fn reopen(fd: &OwnedFd, flags: i32) -> Result<OwnedFd, i32> {
    let p = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    // SAFETY: a NUL-terminated path; the descriptor returned is ours.
    let r = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// The kernel nodes a root daemon hands out for FIFOs and device nodes
/// carry the mount node's type, device number, owner, group and mode, so
/// that a client of another user who reopens one is checked by the kernel
/// as on the mount's node (EACCES on root's 0600 FIFO, even without the
/// shim's own check), and meets the daemon's other clients in one FIFO;
/// a node the client never looked up is refused (ESTALE), as is a
/// regular file (EINVAL).
#[test]
fn kernel_nodes_are_the_mount_nodes_and_only_for_nodes_given() {
    const NOBODY: u32 = 65534;
    if let Some(path) = std::env::var_os("SF_RING_NODES") {
        // The child, uid and gid 65534 (set by the parent's Command).
        let secret: u64 = std::env::var("SF_RING_SECRET").unwrap().parse().unwrap();
        let c = client_as(Path::new(&path), NOBODY);
        assert_eq!(
            c.kernel_node(secret).err(),
            Some(Errno::ESTALE),
            "a node never looked up"
        );
        let look = |parent: u64, name: &[u8]| {
            let (err, p) = call(&c, &request_as(NOBODY, NOBODY, abi::FUSE_LOOKUP, parent, &[], &[name])).unwrap();
            assert_eq!(err, 0, "lookup {name:?}");
            abi::fuse_entry_out::read_from_prefix(&p).unwrap().0.nodeid
        };
        let closed = c.kernel_node(look(1, b"root600")).unwrap();
        assert_eq!(
            reopen(&closed, libc::O_RDONLY | libc::O_NONBLOCK).err(),
            Some(libc::EACCES),
            "root's 0600 FIFO"
        );
        let public = look(1, b"pub");
        let open = c.kernel_node(look(public, b"fifo")).unwrap();
        let w = reopen(&open, libc::O_WRONLY | libc::O_NONBLOCK).expect("the parent reads the FIFO");
        assert_eq!(nix_write(&w, b"hi"), 2);
        return;
    }
    let (s, path) = shared_server("nodes");
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    let mkdir = |mode: u32, name: &[u8]| {
        let arg = abi::fuse_mkdir_in { mode, umask: 0 };
        let (err, p) = call(&c, &request(abi::FUSE_MKDIR, 1, arg.as_bytes(), &[name])).unwrap();
        assert_eq!(err, 0);
        abi::fuse_entry_out::read_from_prefix(&p).unwrap().0.nodeid
    };
    let public = mkdir(0o777, b"pub");
    let fifo = mknod_as(&c, NOBODY, 65531, public, b"fifo", libc::S_IFIFO | 0o640, 0);
    let node = c.kernel_node(fifo).unwrap();
    let st = std::fs::metadata(format!("/proc/self/fd/{}", node.as_raw_fd())).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (st.mode(), st.uid(), st.gid()),
        (libc::S_IFIFO | 0o640, NOBODY, 65531),
        "the mount node's type, owner, group and mode"
    );
    let dev = mknod_as(&c, 0, 0, 1, b"null", libc::S_IFCHR | 0o666, libc::makedev(1, 3) as u32);
    let dev = c.kernel_node(dev).unwrap();
    let st = std::fs::metadata(format!("/proc/self/fd/{}", dev.as_raw_fd())).unwrap();
    assert_eq!(st.rdev(), libc::makedev(1, 3), "the device number");
    mknod_as(&c, 0, 0, 1, b"root600", libc::S_IFIFO | 0o600, 0);
    let file = mknod_as(&c, 0, 0, 1, b"file", libc::S_IFREG | 0o644, 0);
    assert_eq!(c.kernel_node(file).err(), Some(Errno::EINVAL), "a regular file");
    let secret = mknod_as(&c, 0, 0, mkdir(0o700, b"private"), b"secret", libc::S_IFIFO | 0o666, 0);
    let reader = reopen(&node, libc::O_RDONLY | libc::O_NONBLOCK).unwrap();
    as_nobody(
        "kernel_nodes_are_the_mount_nodes_and_only_for_nodes_given",
        &[
            ("SF_RING_NODES", path.display().to_string()),
            ("SF_RING_SECRET", secret.to_string()),
        ],
    );
    let mut buf = [0u8; 8];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::read(reader.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(&buf[..n.max(0) as usize], b"hi", "both clients met in one FIFO");
    drop(s);
}

fn nix_write(fd: &OwnedFd, data: &[u8]) -> isize {
    // SAFETY: data is readable for its length.
    unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) }
}

/// A client of another user may name a node that only an open file
/// description holds (no lookup of its own: an image exec'd with an
/// inherited descriptor) once it has shown the daemon that description's
/// descriptor (`claim_descriptions`); another client's description, a
/// claim with the wrong handle or with a description the daemon never
/// anchored give it nothing (ESTALE).
#[test]
fn a_client_names_only_the_anchored_nodes_of_its_own_descriptions() {
    use std::os::fd::{AsFd, BorrowedFd};
    const NOBODY: u32 = 65534;
    if let Some(path) = std::env::var_os("SF_RING_CLAIM") {
        // The child, uid and gid 65534 (set by the parent's Command).
        let num = |k: &str| -> u64 { std::env::var(k).unwrap().parse().unwrap() };
        let (node, fh, fd) = (num("SF_RING_NODE"), num("SF_RING_FH"), num("SF_RING_FD") as i32);
        let c = client_as(Path::new(&path), NOBODY);
        let getattr = abi::fuse_getattr_in::default();
        let ask = || {
            call(
                &c,
                &request_as(NOBODY, NOBODY, abi::FUSE_GETATTR, node, getattr.as_bytes(), &[]),
            )
            .unwrap()
            .0
        };
        assert_eq!(ask(), -libc::ESTALE, "another client's description");
        // SAFETY: a descriptor inherited from the parent, open for the test.
        let inherited = unsafe { BorrowedFd::borrow_raw(fd) };
        let stranger = description();
        let claiming = |fh, d| Anchoring {
            node,
            fh,
            dir: false,
            description: d,
        };
        c.claim_descriptions(&[claiming(fh + 1, inherited), claiming(fh, stranger.as_fd())])
            .unwrap();
        assert_eq!(ask(), -libc::ESTALE, "a wrong handle, a description never anchored");
        c.claim_descriptions(&[claiming(fh, inherited)]).unwrap();
        assert_eq!(ask(), 0, "its own description");
        return;
    }
    let (s, path) = shared_server("claim");
    let c = RingClient::connect(&path).unwrap();
    init(&c);
    let (node, fh) = create(&c, b"f");
    let d = description();
    c.anchor(&[Anchoring {
        node,
        fh,
        dir: false,
        description: d.as_fd(),
    }])
    .unwrap();
    // SAFETY: dup of our descriptor (without FD_CLOEXEC: the child inherits it).
    let inherited = unsafe { OwnedFd::from_raw_fd(libc::dup(d.as_raw_fd())) };
    as_nobody(
        "a_client_names_only_the_anchored_nodes_of_its_own_descriptions",
        &[
            ("SF_RING_CLAIM", path.display().to_string()),
            ("SF_RING_NODE", node.to_string()),
            ("SF_RING_FH", fh.to_string()),
            ("SF_RING_FD", inherited.as_raw_fd().to_string()),
        ],
    );
    drop(s);
}

/// A new process's first requests (INIT, the root's GETATTR) travel with
/// its hello and come back with the welcome: none reaches the queues, whose
/// workers are only being started then, so setting up a mount costs one
/// round trip instead of three. Each answer is given once, to exactly its
/// request; any other request, and one the daemon does not answer early,
/// goes over the rings.
#[test]
fn the_first_requests_are_answered_with_the_welcome() {
    let path = scratch("early");
    let (_s, stats) = server(&path);
    let init = init_request();
    let root = request(abi::FUSE_GETATTR, 1, &[0; 16], &[]);
    let later = request(
        abi::FUSE_MKDIR,
        1,
        &[0o755u32.to_ne_bytes(), 0u32.to_ne_bytes()].concat(),
        &[b"d"],
    );
    let c = RingClient::connect_with(&path, &[init.clone(), root.clone(), later.clone()]).unwrap();
    let (err, _) = call(&c, &init).unwrap();
    assert_eq!(err, 0);
    let (err, attr) = call(&c, &root).unwrap();
    assert_eq!(err, 0);
    let (out, _) = abi::fuse_attr_out::read_from_prefix(&attr).unwrap();
    assert_eq!(out.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    assert_eq!(
        c.published(),
        0,
        "requests answered with the welcome went to the queues"
    );
    // Not served early (MKDIR changes the tree): the daemon left it alone,
    // and it is made when sent.
    let (err, _) = call(&c, &later).unwrap();
    assert_eq!(err, 0);
    assert_eq!(c.published(), 1);
    // Answered once: the same bytes again are a new request.
    let (err, _) = call(&c, &root).unwrap();
    assert_eq!(err, 0);
    assert_eq!(c.published(), 2);
    // The daemon counts what it served, the early ones too.
    let snap = stats.snapshot();
    let ring = snap.transports.iter().find(|(t, _)| t.name() == "ring").unwrap().1;
    assert_eq!(ring, 4);
}
