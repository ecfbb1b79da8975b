//! Requests answered later, through the dispatcher alone: a transport that
//! waits ([`Dispatcher::handle`], as the in-process and shared-memory
//! transports do) gets the reply answered from another thread; one with a
//! sink gets `Deferred` and the reply at the sink; FUSE_INTERRUPT reaches a
//! waiting handle, also when it arrives first; a handle dropped unanswered
//! answers EIO.

#[path = "dispatch_common.rs"]
mod common;

use std::ffi::OsStr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;
use shortfuse::abi;
use shortfuse::*;
use zerocopy::{FromBytes, IntoBytes};

/// Offsets that tell the file system what to do with a READ.
const KEEP: u64 = 1;
const DROP: u64 = 2;

#[derive(Default)]
struct Threads {
    kept: Mutex<Option<ReplyData>>,
}

impl Filesystem for Threads {
    fn answers_later(&self) -> bool {
        true
    }

    fn lookup_deferred(&self, _req: &Request, _parent: NodeId, name: &OsStr, reply: ReplyEntry) {
        let found = name == "x";
        thread::spawn(move || {
            if found {
                reply.entry(&Entry::new(NodeId(7), Attr::new(FileType::Regular, 0o644)))
            } else {
                reply.error(Errno::ENOENT)
            }
        });
    }

    fn getattr_deferred(&self, _req: &Request, node: NodeId, _fh: Option<FileHandle>, reply: ReplyAttr) {
        thread::spawn(move || {
            reply.attr(&Attr {
                ino: node.0,
                ..Attr::new(FileType::Regular, 0o600)
            })
        });
    }

    fn read_deferred(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        offset: u64,
        size: usize,
        reply: ReplyData,
    ) {
        match offset {
            KEEP => *self.kept.lock().unwrap() = Some(reply),
            DROP => drop(reply),
            _ => {
                thread::spawn(move || reply.data(&vec![b'r'; size]));
            }
        }
    }

    fn write_deferred(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        data: &[u8],
        _args: &WriteArgs,
        reply: ReplyWrite,
    ) {
        let n = data.len();
        thread::spawn(move || reply.written(n));
    }

    fn setattr_deferred(&self, _req: &Request, node: NodeId, set: &SetAttr, reply: ReplyAttr) {
        let size = set.size;
        thread::spawn(move || match size {
            Some(size) => reply.attr(&Attr {
                ino: node.0,
                size,
                ..Attr::new(FileType::Regular, 0o600)
            }),
            None => reply.error(Errno::EPERM),
        });
    }
}

/// A transport's sink that hands each reply to the test.
struct Channel(Mutex<mpsc::Sender<(u64, Vec<u8>)>>);

impl ReplySink for Channel {
    fn send(&self, unique: u64, reply: &[u8]) {
        let _ = self.0.lock().unwrap().send((unique, reply.to_vec()));
    }
}

fn connected(opts: MountOptions) -> (Arc<Threads>, Dispatcher) {
    let fs = Arc::new(Threads::default());
    let d = Dispatcher::with_max_pages_limit(fs.clone(), opts, Arc::new(Stats::new()), 256);
    let mut buf = Vec::new();
    assert_eq!(
        d.handle(&init_msg(1, 45, KERNEL_FLAGS, 65536), &mut buf, Transport::Dev),
        Outcome::Reply
    );
    (fs, d)
}

fn waited(d: &Dispatcher, m: &[u8]) -> Reply {
    let mut buf = Vec::new();
    assert_eq!(d.handle(m, &mut buf, Transport::Ring), Outcome::Reply);
    check_reply(&buf)
}

#[test]
fn a_waiting_transport_gets_replies_answered_from_other_threads() {
    let opts = MountOptions {
        negative_timeout: Duration::from_secs(5),
        ..MountOptions::default()
    };
    let (_fs, d) = connected(opts);
    let r = waited(&d, &msg(abi::FUSE_READ, 7, 10, read_in(0, 0, 100).as_bytes()));
    assert_eq!((r.error, r.unique, r.payload), (0, 10, vec![b'r'; 100]));

    let r = waited(
        &d,
        &msg(abi::FUSE_GETATTR, 9, 11, abi::fuse_getattr_in::default().as_bytes()),
    );
    let out = abi::fuse_attr_out::read_from_bytes(&r.payload).unwrap();
    assert_eq!((r.error, out.attr.ino, out.attr.mode), (0, 9, libc::S_IFREG | 0o600));

    let r = waited(&d, &msg(abi::FUSE_LOOKUP, 1, 12, b"x\0"));
    assert_eq!(abi::fuse_entry_out::read_from_bytes(&r.payload).unwrap().nodeid, 7);
    // ENOENT with a negative timeout: the cached negative entry.
    let r = waited(&d, &msg(abi::FUSE_LOOKUP, 1, 13, b"y\0"));
    let neg = abi::fuse_entry_out::read_from_bytes(&r.payload).unwrap();
    assert_eq!((r.error, neg.nodeid, neg.entry_valid), (0, 0, 5));

    let mut write = abi::fuse_write_in {
        size: 3,
        ..Default::default()
    }
    .as_bytes()
    .to_vec();
    write.extend_from_slice(b"abc");
    let r = waited(&d, &msg(abi::FUSE_WRITE, 7, 14, &write));
    assert_eq!(abi::fuse_write_out::read_from_bytes(&r.payload).unwrap().size, 3);
    assert_eq!(d.deferred_in_flight(), 0);
}

#[test]
fn setattr_is_answered_later_at_the_sink() {
    // A truncation that must wait for the kernel (distfs with the page
    // cache drops pages first, which waits for READs a worker must serve)
    // leaves the worker at once.
    let (_fs, d) = connected(MountOptions::default());
    let (tx, rx) = mpsc::channel();
    let sink: Arc<dyn ReplySink> = Arc::new(Channel(Mutex::new(tx)));
    let mut buf = Vec::new();
    let truncate = abi::fuse_setattr_in {
        valid: abi::FATTR_SIZE,
        size: 42,
        ..Default::default()
    };
    assert_eq!(
        d.handle_with(
            &msg(abi::FUSE_SETATTR, 7, 30, truncate.as_bytes()),
            &mut buf,
            Transport::Dev,
            Some(&sink)
        ),
        Outcome::Deferred
    );
    let (unique, reply) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let r = check_reply(&reply);
    let out = abi::fuse_attr_out::read_from_bytes(&r.payload).unwrap();
    assert_eq!((unique, r.error, out.attr.ino, out.attr.size), (30, 0, 7, 42));

    let chmod = abi::fuse_setattr_in {
        valid: abi::FATTR_MODE,
        mode: 0o644,
        ..Default::default()
    };
    let r = waited(&d, &msg(abi::FUSE_SETATTR, 7, 31, chmod.as_bytes()));
    assert_eq!((r.unique, r.error), (31, -libc::EPERM));
    assert_eq!(d.deferred_in_flight(), 0);
}

#[test]
fn a_sink_gets_the_reply_and_an_interrupt_reaches_the_handle() {
    let (fs, d) = connected(MountOptions::default());
    let (tx, rx) = mpsc::channel();
    let sink: Arc<dyn ReplySink> = Arc::new(Channel(Mutex::new(tx)));
    let mut buf = Vec::new();
    let mut send = |m: &[u8]| d.handle_with(m, &mut buf, Transport::Dev, Some(&sink));

    assert_eq!(
        send(&msg(abi::FUSE_READ, 7, 20, read_in(0, 0, 4).as_bytes())),
        Outcome::Deferred
    );
    let (unique, reply) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let r = check_reply(&reply);
    assert_eq!((unique, r.unique, r.payload), (20, 20, b"rrrr".to_vec()));

    // Kept: waits until interrupted.
    assert_eq!(
        send(&msg(abi::FUSE_READ, 7, 21, read_in(0, KEEP, 4).as_bytes())),
        Outcome::Deferred
    );
    let kept = fs.kept.lock().unwrap().take().unwrap();
    assert!(!kept.is_interrupted());
    let (itx, irx) = mpsc::channel();
    kept.on_interrupt(move || itx.send(()).unwrap());
    assert_eq!(d.deferred_in_flight(), 1);
    let interrupt = abi::fuse_interrupt_in { unique: 21 };
    assert_eq!(
        send(&msg(abi::FUSE_INTERRUPT, 0, 22 | 1 << 63, interrupt.as_bytes())),
        Outcome::NoReply
    );
    irx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(kept.is_interrupted());
    kept.error(Errno::EINTR);
    let (_, reply) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(check_reply(&reply).error, -libc::EINTR);
    assert_eq!(d.deferred_in_flight(), 0);

    // An interrupt read before its request (another worker has it).
    let interrupt = abi::fuse_interrupt_in { unique: 23 };
    assert_eq!(
        send(&msg(abi::FUSE_INTERRUPT, 0, 24 | 1 << 63, interrupt.as_bytes())),
        Outcome::NoReply
    );
    assert_eq!(
        send(&msg(abi::FUSE_READ, 7, 23, read_in(0, KEEP, 4).as_bytes())),
        Outcome::Deferred
    );
    let kept = fs.kept.lock().unwrap().take().unwrap();
    assert!(kept.is_interrupted());
    let (itx, irx) = mpsc::channel();
    kept.on_interrupt(move || itx.send(()).unwrap());
    irx.recv_timeout(Duration::from_secs(30)).unwrap();
    drop(kept);

    // Dropped unanswered (above, and here at once): EIO.
    let (_, reply) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(check_reply(&reply).error, -libc::EIO);
    assert_eq!(
        send(&msg(abi::FUSE_READ, 7, 25, read_in(0, DROP, 4).as_bytes())),
        Outcome::Deferred
    );
    let (unique, reply) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!((unique, check_reply(&reply).error), (25, -libc::EIO));
}
