//! A wrapped recording file system: every call made on a layer that
//! overrides nothing reaches the file system below it.

use std::sync::Mutex;

use super::*;
use crate::errno::Errno;
use crate::notify::Notifier;
use crate::reply::ReplyEntry;

/// Records the name of every method called on it.
#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<&'static str>>,
}

impl Recording {
    fn hit(&self, name: &'static str) {
        self.calls.lock().unwrap().push(name);
    }
}

// Test set-up: one recording body per trait method (the shape of the
// trait itself, on purpose).
impl Filesystem for Recording {
    fn init(&self, _config: &mut InitConfig) -> Result<()> {
        self.hit("init");
        Err(Errno::EIO)
    }

    fn destroy(&self) {
        self.hit("destroy")
    }

    fn figures(&self) -> Option<Arc<dyn Figures>> {
        self.hit("figures");
        None
    }

    fn namespace_map(&self) -> Option<crate::NamespaceMap> {
        self.hit("namespace_map");
        None
    }

    fn lookup(&self, _req: &Request, _parent: NodeId, _name: &OsStr) -> Result<Entry> {
        self.hit("lookup");
        Err(Errno::EIO)
    }

    fn forget(&self, _node: NodeId, _nlookup: u64) {
        self.hit("forget")
    }

    fn batch_forget(&self, _forgets: &[Forget]) {
        self.hit("batch_forget")
    }

    fn getattr(&self, _req: &Request, _node: NodeId, _fh: Option<FileHandle>) -> Result<Attr> {
        self.hit("getattr");
        Err(Errno::EIO)
    }

    fn setattr(&self, _req: &Request, _node: NodeId, _set: &SetAttr) -> Result<Attr> {
        self.hit("setattr");
        Err(Errno::EIO)
    }

    fn readlink(&self, _req: &Request, _node: NodeId) -> Result<Vec<u8>> {
        self.hit("readlink");
        Err(Errno::EIO)
    }

    fn symlink(&self, _req: &Request, _parent: NodeId, _name: &OsStr, _target: &OsStr) -> Result<Entry> {
        self.hit("symlink");
        Err(Errno::EIO)
    }

    fn mknod(&self, _req: &Request, _parent: NodeId, _name: &OsStr, _new: &NewNode) -> Result<Entry> {
        self.hit("mknod");
        Err(Errno::EIO)
    }

    fn mkdir(&self, _req: &Request, _parent: NodeId, _name: &OsStr, _new: &NewNode) -> Result<Entry> {
        self.hit("mkdir");
        Err(Errno::EIO)
    }

    fn unlink(&self, _req: &Request, _parent: NodeId, _name: &OsStr) -> Result<()> {
        self.hit("unlink");
        Err(Errno::EIO)
    }

    fn rmdir(&self, _req: &Request, _parent: NodeId, _name: &OsStr) -> Result<()> {
        self.hit("rmdir");
        Err(Errno::EIO)
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: NodeId,
        _name: &OsStr,
        _new_parent: NodeId,
        _new_name: &OsStr,
        _flags: RenameFlags,
    ) -> Result<()> {
        self.hit("rename");
        Err(Errno::EIO)
    }

    fn link(&self, _req: &Request, _node: NodeId, _new_parent: NodeId, _new_name: &OsStr) -> Result<Entry> {
        self.hit("link");
        Err(Errno::EIO)
    }

    fn open(&self, _req: &Request, _node: NodeId, _flags: OpenFlags) -> Result<Opened> {
        self.hit("open");
        Err(Errno::EIO)
    }

    fn create(
        &self,
        _req: &Request,
        _parent: NodeId,
        _name: &OsStr,
        _new: &NewNode,
        _flags: OpenFlags,
    ) -> Result<Created> {
        self.hit("create");
        Err(Errno::EIO)
    }

    fn read(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _offset: u64, _buf: &mut [u8]) -> Result<usize> {
        self.hit("read");
        Err(Errno::EIO)
    }

    fn write(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _data: &[u8], _args: &WriteArgs) -> Result<usize> {
        self.hit("write");
        Err(Errno::EIO)
    }

    fn flush(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _lock_owner: u64) -> Result<()> {
        self.hit("flush");
        Err(Errno::EIO)
    }

    fn release(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _args: &ReleaseArgs) -> Result<()> {
        self.hit("release");
        Err(Errno::EIO)
    }

    fn fsync(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        self.hit("fsync");
        Err(Errno::EIO)
    }

    fn opendir(&self, _req: &Request, _node: NodeId, _flags: OpenFlags) -> Result<Opened> {
        self.hit("opendir");
        Err(Errno::EIO)
    }

    fn readdir(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        _offset: u64,
        _sink: &mut dyn DirSink,
    ) -> Result<()> {
        self.hit("readdir");
        Err(Errno::EIO)
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        _offset: u64,
        _sink: &mut dyn DirPlusSink,
    ) -> Result<()> {
        self.hit("readdirplus");
        Err(Errno::EIO)
    }

    fn releasedir(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _flags: OpenFlags) -> Result<()> {
        self.hit("releasedir");
        Err(Errno::EIO)
    }

    fn fsyncdir(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _datasync: bool) -> Result<()> {
        self.hit("fsyncdir");
        Err(Errno::EIO)
    }

    fn statfs(&self, _req: &Request, _node: NodeId) -> Result<Statfs> {
        self.hit("statfs");
        Err(Errno::EIO)
    }

    fn setxattr(&self, _req: &Request, _node: NodeId, _name: &OsStr, _value: &[u8], _flags: XattrFlags) -> Result<()> {
        self.hit("setxattr");
        Err(Errno::EIO)
    }

    fn getxattr(&self, _req: &Request, _node: NodeId, _name: &OsStr) -> Result<Vec<u8>> {
        self.hit("getxattr");
        Err(Errno::EIO)
    }

    fn listxattr(&self, _req: &Request, _node: NodeId) -> Result<Vec<u8>> {
        self.hit("listxattr");
        Err(Errno::EIO)
    }

    fn removexattr(&self, _req: &Request, _node: NodeId, _name: &OsStr) -> Result<()> {
        self.hit("removexattr");
        Err(Errno::EIO)
    }

    fn access(&self, _req: &Request, _node: NodeId, _mask: AccessMode) -> Result<()> {
        self.hit("access");
        Err(Errno::EIO)
    }

    fn getlk(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _lock_owner: u64, _lock: &Lock) -> Result<Lock> {
        self.hit("getlk");
        Err(Errno::EIO)
    }

    fn setlk(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        _lock_owner: u64,
        _lock: &Lock,
        _sleep: bool,
    ) -> Result<()> {
        self.hit("setlk");
        Err(Errno::EIO)
    }

    fn flock(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _lock_owner: u64, _op: FlockOp) -> Result<()> {
        self.hit("flock");
        Err(Errno::EIO)
    }

    fn fallocate(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: FallocateFlags,
    ) -> Result<()> {
        self.hit("fallocate");
        Err(Errno::EIO)
    }

    fn lseek(&self, _req: &Request, _node: NodeId, _fh: FileHandle, _offset: u64, _whence: Whence) -> Result<u64> {
        self.hit("lseek");
        Err(Errno::EIO)
    }

    fn poll(
        &self,
        _req: &Request,
        _node: NodeId,
        _fh: FileHandle,
        _handle: Option<PollHandle>,
        _events: PollEvents,
    ) -> Result<PollEvents> {
        self.hit("poll");
        Err(Errno::EIO)
    }

    fn copy_file_range(&self, _req: &Request, _range: &CopyRange) -> Result<usize> {
        self.hit("copy_file_range");
        Err(Errno::EIO)
    }

    fn map_file(&self, _node: NodeId, _fh: FileHandle) -> Result<crate::BackingFile> {
        self.hit("map_file");
        Err(Errno::EIO)
    }
}

/// A layer that changes nothing.
struct Pass(Recording);

impl Layer for Pass {
    type Inner = Recording;
    fn inner(&self) -> &Recording {
        &self.0
    }
}

struct Sink;

impl DirSink for Sink {
    fn add(&mut self, _: u64, _: u64, _: FileType, _: &OsStr) -> bool {
        false
    }
}

impl DirPlusSink for Sink {
    fn add(&mut self, _: &Entry, _: u64, _: &OsStr) -> bool {
        false
    }
}

/// Calls every method of the trait once, in the trait's order.
fn call_every_method(fs: &dyn Filesystem) {
    let req = Request {
        unique: 1,
        uid: 0,
        gid: 0,
        pid: 0,
    };
    let new = NewNode {
        mode: 0o644,
        umask: 0,
        rdev: 0,
    };
    let range = CopyRange {
        node_in: NodeId(2),
        fh_in: FileHandle(4),
        off_in: 0,
        node_out: NodeId(3),
        fh_out: FileHandle(5),
        off_out: 0,
        len: 1,
        flags: 0,
    };
    let mut config = InitConfig {
        kernel_major: 7,
        kernel_minor: 45,
        kernel_flags: 0,
        want: 0,
        max_write: 4096,
        max_readahead: 4096,
        max_background: 0,
        congestion_threshold: 0,
        time_gran: 1,
        notifier: Notifier::new(),
        file_attr_timeout: None,
        entry_timeout: std::time::Duration::from_secs(1),
    };
    let mut buf = [0u8; 8];
    let (mut sink, mut plus) = (Sink, Sink);
    let _ = fs.init(&mut config);
    fs.destroy();
    let _ = fs.figures();
    let _ = fs.namespace_map();
    let _ = fs.lookup(&req, NodeId(1), OsStr::new("n"));
    fs.forget(NodeId(2), 1);
    fs.batch_forget(&[]);
    let _ = fs.getattr(&req, NodeId(2), Some(FileHandle(4)));
    let _ = fs.setattr(&req, NodeId(2), &SetAttr::default());
    let _ = fs.readlink(&req, NodeId(2));
    let _ = fs.symlink(&req, NodeId(1), OsStr::new("n"), OsStr::new("t"));
    let _ = fs.mknod(&req, NodeId(1), OsStr::new("n"), &new);
    let _ = fs.mkdir(&req, NodeId(1), OsStr::new("n"), &new);
    let _ = fs.unlink(&req, NodeId(1), OsStr::new("n"));
    let _ = fs.rmdir(&req, NodeId(1), OsStr::new("n"));
    let _ = fs.rename(
        &req,
        NodeId(1),
        OsStr::new("n"),
        NodeId(3),
        OsStr::new("m"),
        RenameFlags::default(),
    );
    let _ = fs.link(&req, NodeId(2), NodeId(3), OsStr::new("m"));
    let _ = fs.open(&req, NodeId(2), OpenFlags::RDONLY);
    let _ = fs.create(&req, NodeId(1), OsStr::new("n"), &new, OpenFlags::RDONLY);
    let _ = fs.read(&req, NodeId(2), FileHandle(4), 0, &mut buf);
    let _ = fs.write(&req, NodeId(2), FileHandle(4), b"d", &Default::default());
    let _ = fs.flush(&req, NodeId(2), FileHandle(4), 5);
    let _ = fs.release(&req, NodeId(2), FileHandle(4), &Default::default());
    let _ = fs.fsync(&req, NodeId(2), FileHandle(4), false);
    let _ = fs.opendir(&req, NodeId(2), OpenFlags::RDONLY);
    let _ = fs.readdir(&req, NodeId(2), FileHandle(4), 0, &mut sink);
    let _ = fs.readdirplus(&req, NodeId(2), FileHandle(4), 0, &mut plus);
    let _ = fs.releasedir(&req, NodeId(2), FileHandle(4), OpenFlags::RDONLY);
    let _ = fs.fsyncdir(&req, NodeId(2), FileHandle(4), false);
    let _ = fs.statfs(&req, NodeId(2));
    let _ = fs.setxattr(&req, NodeId(2), OsStr::new("n"), b"v", XattrFlags::empty());
    let _ = fs.getxattr(&req, NodeId(2), OsStr::new("n"));
    let _ = fs.listxattr(&req, NodeId(2));
    let _ = fs.removexattr(&req, NodeId(2), OsStr::new("n"));
    let _ = fs.access(&req, NodeId(2), AccessMode::EXISTS);
    let _ = fs.getlk(&req, NodeId(2), FileHandle(4), 5, &Lock::default());
    let _ = fs.setlk(&req, NodeId(2), FileHandle(4), 5, &Lock::default(), false);
    let _ = fs.flock(
        &req,
        NodeId(2),
        FileHandle(4),
        5,
        FlockOp::from_raw(libc::LOCK_SH).unwrap(),
    );
    let _ = fs.fallocate(&req, NodeId(2), FileHandle(4), 0, 1, FallocateFlags::empty());
    let _ = fs.lseek(&req, NodeId(2), FileHandle(4), 0, Whence::Data);
    let _ = fs.poll(&req, NodeId(2), FileHandle(4), None, PollEvents::IN);
    let _ = fs.copy_file_range(&req, &range);
    let _ = fs.map_file(NodeId(2), FileHandle(4));
}

/// The names of the methods of `Filesystem`, read from its source.
fn trait_methods() -> Vec<String> {
    let src = include_str!("../filesystem.rs");
    let body = &src[src.find("pub trait Filesystem").expect("the trait")..];
    body.lines()
        .filter_map(|l| l.strip_prefix("    fn "))
        .map(|l| l[..l.find('(').expect("a method")].to_string())
        .collect()
}

/// The methods a layer forwards: all but those it answers itself.
fn forwarded_methods() -> Vec<String> {
    trait_methods()
        .into_iter()
        .filter(|m| !ANSWERED_HERE.contains(&m.as_str()))
        .collect()
}

#[test]
fn the_layer_names_every_method_of_the_trait() {
    let methods = trait_methods();
    assert!(methods.len() > 30, "{methods:?}");
    for m in ANSWERED_HERE {
        assert!(methods.iter().any(|t| t == m), "{m} is no longer a method of the trait");
    }
    assert_eq!(
        METHODS,
        forwarded_methods(),
        "a Filesystem method the layer does not forward"
    );
}

/// A file system that answers later, and records which way it was asked.
#[derive(Default)]
struct Later(Recording);

impl Filesystem for Later {
    fn answers_later(&self) -> bool {
        true
    }

    fn lookup(&self, req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        self.0.lookup(req, parent, name)
    }

    fn lookup_deferred(&self, _req: &Request, _parent: NodeId, _name: &OsStr, reply: ReplyEntry) {
        self.0.hit("lookup_deferred");
        reply.error(Errno::EIO)
    }
}

struct OverLater(Later);

impl Layer for OverLater {
    type Inner = Later;
    fn inner(&self) -> &Later {
        &self.0
    }
}

/// Keeps what is answered.
#[derive(Default)]
struct Answers(Mutex<Vec<Vec<u8>>>);

impl crate::reply::ReplySink for Answers {
    fn send(&self, _unique: u64, reply: &[u8]) {
        self.0.lock().unwrap().push(reply.to_vec());
    }
}

#[test]
fn a_layer_answers_at_once_through_the_synchronous_methods_below() {
    let fs = OverLater(Later::default());
    assert!(Filesystem::answers_later(&fs.0));
    assert!(!Filesystem::answers_later(&fs), "a layer answers at once");
    let sink = Arc::new(Answers::default());
    let replies = crate::reply::Replies {
        sink: sink.clone(),
        inflight: Default::default(),
        unique: 9,
    };
    let req = Request {
        unique: 9,
        uid: 0,
        gid: 0,
        pid: 0,
    };
    let ttl = std::time::Duration::ZERO;
    let attr_ttl = crate::reply::AttrTtl {
        any: ttl,
        regular: None,
    };
    Filesystem::lookup_deferred(&fs, &req, NodeId(1), OsStr::new("n"), replies.entry(ttl, attr_ttl, ttl));
    assert_eq!(
        *fs.0 .0.calls.lock().unwrap(),
        ["lookup"],
        "the synchronous lookup below was asked"
    );
    assert_eq!(sink.0.lock().unwrap().len(), 1, "the request was answered");
}

#[test]
fn a_layer_that_overrides_nothing_forwards_every_call() {
    let direct = Recording::default();
    call_every_method(&direct);
    let called = direct.calls.into_inner().unwrap();
    assert_eq!(
        called,
        forwarded_methods(),
        "the recording file system records every forwarded method"
    );
    let wrapped = Pass(Recording::default());
    call_every_method(&wrapped);
    assert_eq!(wrapped.0.calls.into_inner().unwrap(), called);
}
