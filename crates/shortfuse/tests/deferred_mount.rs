//! Requests answered later, on real mounts over /dev/fuse and io_uring: a
//! file system that keeps every READ's reply handle and answers from
//! another thread, and one whose READ of `forever` never ends unless the
//! kernel interrupts it.

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use shortfuse::{
    Attr, DirSink, Entry, Errno, FileHandle, FileType, Filesystem, MountOptions, NodeId, Opened, ReplyData, Request,
    Transport,
};

mod support;

/// READs held at once before any is answered: more than the /dev/fuse
/// readers the test session may start (2), so a session that held a
/// thread per waiting request could never gather them.
const HELD: usize = 6;

/// A generous bound against hangs: a correct run takes milliseconds.
const PATIENCE: Duration = Duration::from_secs(30);

const DATA: &[u8] = b"answered later\n";
const DATA_NODE: u64 = 2;
const FOREVER_NODE: u64 = 3;

#[derive(Default)]
struct Held {
    /// Replies of `data` reads not answered yet.
    data: Vec<ReplyData>,
    /// The reply of the `forever` read, until an interrupt answers it.
    forever: Option<ReplyData>,
    forever_reads: usize,
    interrupted: usize,
    /// Answer `data` reads at once (after a failed gathering, so that the
    /// readers the session could not take yet end too).
    answer_now: bool,
}

#[derive(Default)]
struct Later {
    held: Arc<(Mutex<Held>, Condvar)>,
}

impl Later {
    /// Waits (bounded) until `done` holds of what the file system holds.
    fn wait_for(&self, done: impl Fn(&Held) -> bool) -> bool {
        let (lock, cv) = &*self.held;
        let deadline = Instant::now() + PATIENCE;
        let mut held = lock.lock().unwrap();
        while !done(&held) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            held = cv.wait_timeout(held, left).unwrap().0;
        }
        true
    }
}

fn attr(node: u64) -> Attr {
    let a = match node {
        1 => Attr::new(FileType::Directory, 0o755),
        n => Attr::new(FileType::Regular, 0o444).with_size(if n == DATA_NODE { DATA.len() as u64 } else { 4096 }),
    };
    Attr { ino: node, ..a }
}

impl Filesystem for Later {
    fn answers_later(&self) -> bool {
        true
    }

    fn lookup(&self, _req: &Request, parent: NodeId, name: &OsStr) -> shortfuse::Result<Entry> {
        let node = match (parent, name.to_str()) {
            (NodeId::ROOT, Some("data")) => DATA_NODE,
            (NodeId::ROOT, Some("forever")) => FOREVER_NODE,
            _ => return Err(Errno::ENOENT),
        };
        Ok(Entry::new(NodeId(node), attr(node)))
    }

    fn getattr(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>) -> shortfuse::Result<Attr> {
        Ok(attr(node.0))
    }

    fn open(&self, _req: &Request, _node: NodeId, _flags: shortfuse::OpenFlags) -> shortfuse::Result<Opened> {
        // Direct I/O: each read(2) is one READ its caller waits for.
        let mut o = Opened::default();
        o.flags.direct_io = true;
        Ok(o)
    }

    fn readdir(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        _offset: u64,
        _sink: &mut dyn DirSink,
    ) -> shortfuse::Result<()> {
        Ok(())
    }

    fn read_deferred(
        &self,
        _req: &Request,
        node: NodeId,
        _fh: FileHandle,
        offset: u64,
        _size: usize,
        reply: ReplyData,
    ) {
        let (lock, cv) = &*self.held;
        let mut held = lock.lock().unwrap();
        match node.0 {
            DATA_NODE if offset > 0 => reply.data(&[]),
            DATA_NODE if held.answer_now => reply.data(DATA),
            DATA_NODE => held.data.push(reply),
            FOREVER_NODE => {
                held.forever_reads += 1;
                held.forever = Some(reply);
                let state = self.held.clone();
                let r = held.forever.as_ref().expect("just kept");
                // The callback may run at once (an interrupt that came
                // first), on this thread: it answers from another one, which
                // waits for this lock.
                r.on_interrupt(move || {
                    thread::spawn(move || {
                        let (lock, cv) = &*state;
                        let mut held = lock.lock().unwrap();
                        if let Some(r) = held.forever.take() {
                            assert!(r.is_interrupted());
                            held.interrupted += 1;
                            r.error(Errno::EINTR);
                        }
                        cv.notify_all();
                    });
                });
            }
            _ => reply.error(Errno::EIO),
        }
        cv.notify_all();
    }
}

struct Mounted {
    m: support::Mounted,
    fs: Arc<Later>,
}

impl Mounted {
    fn new(tag: &str, transport: Transport) -> Mounted {
        let fs = Arc::new(Later::default());
        let opts = MountOptions {
            transport,
            ..MountOptions::default()
        };
        let m = support::Mounted::new(&format!("deferred-{tag}"), fs.clone(), opts);
        Mounted { m, fs }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.m.mp.join(name)
    }
}

/// `HELD` readers at once; the file system answers none before it holds
/// all of them, then answers them together from a thread of its own.
fn many_held_then_answered_from_another_thread(m: &Mounted) {
    let readers: Vec<_> = (0..HELD)
        .map(|_| {
            let p = m.path("data");
            thread::spawn(move || fs::read(p))
        })
        .collect();
    let gathered = m.fs.wait_for(|h| h.data.len() == HELD);
    let replies = {
        let mut held = m.fs.held.0.lock().unwrap();
        held.answer_now = !gathered;
        std::mem::take(&mut held.data)
    };
    let held = replies.len();
    // Answered from here even when not all came, so that no reader hangs.
    thread::spawn(move || {
        for r in replies {
            r.data(DATA);
        }
    })
    .join()
    .unwrap();
    assert!(gathered, "only {held} of {HELD} reads reached the file system at once");
    for r in readers {
        assert_eq!(r.join().unwrap().unwrap(), DATA);
    }
}

/// A `cat` of `forever`, killed while its READ waits: the interrupt reaches
/// the reply handle, the file system answers EINTR, the process is gone at
/// once and the mount still serves.
fn a_killed_reader_is_interrupted(m: &Mounted) {
    let mut cat = Command::new("cat")
        .arg(m.path("forever"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let reached = m.fs.wait_for(|h| h.forever_reads == 1);
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(cat.id() as i32, libc::SIGKILL) };
    let seen = m.fs.wait_for(|h| h.interrupted == 1);
    let deadline = Instant::now() + PATIENCE;
    let mut exited = cat.try_wait().unwrap().is_some();
    while !exited && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
        exited = cat.try_wait().unwrap().is_some();
    }
    // Without the interrupt the reader waits for an answer: give it one.
    if let Some(r) = m.fs.held.0.lock().unwrap().forever.take() {
        r.error(Errno::EIO);
    }
    let _ = cat.wait();
    assert!(reached, "the read of forever never reached the file system");
    assert!(seen, "the file system never saw the interrupt");
    assert!(exited, "the killed reader did not end while its READ waited");
    let mut again = String::new();
    let p = m.path("data");
    let reader = thread::spawn(move || fs::File::open(p).and_then(|mut f| f.read_to_string(&mut again).map(|_| again)));
    assert!(m.fs.wait_for(|h| !h.data.is_empty()), "the mount stopped serving");
    for r in std::mem::take(&mut m.fs.held.0.lock().unwrap().data) {
        r.data(DATA);
    }
    assert_eq!(reader.join().unwrap().unwrap().as_bytes(), DATA);
}

#[test]
fn answered_later_over_dev() {
    let m = Mounted::new("dev", Transport::Dev);
    many_held_then_answered_from_another_thread(&m);
    a_killed_reader_is_interrupted(&m);
    assert!(m.m.served_over(Transport::Dev) > 0);
}

#[test]
fn answered_later_over_uring() {
    let m = Mounted::new("uring", Transport::Uring);
    many_held_then_answered_from_another_thread(&m);
    a_killed_reader_is_interrupted(&m);
    assert!(m.m.served_over(Transport::Uring) > 0, "the reads went over the rings");
}
