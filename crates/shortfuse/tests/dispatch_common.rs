//! Shared by the dispatch tests: a small file system, request builders and
//! a reply checker (a fake transport that feeds bytes to `handle`).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shortfuse::abi;
use shortfuse::*;
use zerocopy::{FromBytes, IntoBytes};

pub const HELLO: u64 = 2;
pub const DIR: u64 = 3;
pub const CONTENT: &[u8] = b"hello world\n";
/// Files in `dir`, enough to page READDIR.
pub const DIR_FILES: usize = 100;
pub const FIRST_CHILD: u64 = 100;

/// root(1) holds "hello" (2) and "dir" (3); dir holds f000..f099 (100..).
#[derive(Default)]
pub struct TestFs {
    pub calls: Mutex<Vec<String>>,
    pub xattrs: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    pub last_setattr: Mutex<Option<SetAttr>>,
    pub last_write: Mutex<Option<(u64, Vec<u8>, WriteArgs)>>,
    pub forgets: Mutex<Vec<Forget>>,
    /// Flags `init` adds to `want`.
    pub init_add: u64,
    /// Serve READDIRPLUS natively (otherwise ENOSYS, emulated).
    pub native_plus: bool,
    pub destroyed: Mutex<bool>,
    /// What `init` sets as `file_attr_timeout`.
    pub file_attr_timeout: Option<std::time::Duration>,
}

pub fn attr_of(node: u64) -> Attr {
    let (mode, size, nlink) = match node {
        1 | DIR => (libc::S_IFDIR | 0o755, 4096, 2),
        HELLO => (libc::S_IFREG | 0o644, CONTENT.len() as u64, 1),
        _ => (libc::S_IFREG | 0o600, 0, 1),
    };
    Attr {
        ino: node + 1000,
        size,
        blocks: size.div_ceil(512),
        atime: Timestamp { sec: 1, nsec: 2 },
        mtime: Timestamp { sec: 3, nsec: 4 },
        ctime: Timestamp { sec: 5, nsec: 6 },
        mode,
        nlink,
        uid: 10,
        gid: 20,
        rdev: 0,
        blksize: 4096,
    }
}

pub fn child_name(i: usize) -> String {
    format!("f{i:03}")
}

impl TestFs {
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }

    fn children(&self, dir: u64) -> Vec<(u64, FileType, Vec<u8>)> {
        let mut v = vec![
            (dir, FileType::Directory, b".".to_vec()),
            (1, FileType::Directory, b"..".to_vec()),
        ];
        match dir {
            1 => {
                v.push((HELLO, FileType::Regular, b"hello".to_vec()));
                v.push((DIR, FileType::Directory, b"dir".to_vec()));
            }
            DIR => {
                for i in 0..DIR_FILES {
                    v.push((FIRST_CHILD + i as u64, FileType::Regular, child_name(i).into_bytes()));
                }
            }
            _ => {}
        }
        v
    }
}

impl Filesystem for TestFs {
    fn init(&self, config: &mut InitConfig) -> Result<()> {
        config.want |= self.init_add;
        config.file_attr_timeout = self.file_attr_timeout;
        Ok(())
    }

    fn destroy(&self) {
        *self.destroyed.lock().unwrap() = true;
    }

    fn lookup(&self, _req: &Request, parent: NodeId, name: &OsStr) -> Result<Entry> {
        self.log(format!("lookup {} {}", parent.0, name.to_string_lossy()));
        self.children(parent.0)
            .into_iter()
            .skip(2)
            .find(|(_, _, n)| n == name.as_bytes())
            .map(|(node, _, _)| Entry {
                node: NodeId(node),
                generation: 9,
                attr: attr_of(node),
                ttl: if node == DIR {
                    Some(Duration::from_millis(1500))
                } else {
                    None
                },
            })
            .ok_or(Errno::ENOENT)
    }

    fn forget(&self, node: NodeId, nlookup: u64) {
        self.forgets.lock().unwrap().push(Forget { node, nlookup });
    }

    fn getattr(&self, _req: &Request, node: NodeId, fh: Option<FileHandle>) -> Result<Attr> {
        self.log(format!("getattr {} {:?}", node.0, fh.map(|f| f.0)));
        Ok(attr_of(node.0))
    }

    fn setattr(&self, _req: &Request, node: NodeId, set: &SetAttr) -> Result<Attr> {
        *self.last_setattr.lock().unwrap() = Some(*set);
        let mut a = attr_of(node.0);
        if let Some(m) = set.mode {
            a.mode = m;
        }
        Ok(a)
    }

    fn readlink(&self, _req: &Request, _node: NodeId) -> Result<Vec<u8>> {
        Ok(b"target".to_vec())
    }

    fn mkdir(&self, _req: &Request, _parent: NodeId, name: &OsStr, new: &NewNode) -> Result<Entry> {
        self.log(format!(
            "mkdir {} {:o} {:o}",
            name.to_string_lossy(),
            new.mode,
            new.umask
        ));
        Ok(Entry::new(NodeId(50), attr_of(DIR)))
    }

    fn open(&self, _req: &Request, node: NodeId, flags: OpenFlags) -> Result<Opened> {
        self.log(format!("open {} {flags:#x}", node.0));
        Ok(Opened::handle(77))
    }

    fn create(
        &self,
        _req: &Request,
        _parent: NodeId,
        name: &OsStr,
        new: &NewNode,
        flags: OpenFlags,
    ) -> Result<Created> {
        self.log(format!("create {} {:o} {flags:#x}", name.to_string_lossy(), new.mode));
        Ok(Created {
            entry: Entry::new(NodeId(51), attr_of(HELLO)),
            opened: Opened {
                fh: FileHandle(78),
                flags: FopenFlags {
                    direct_io: true,
                    ..FopenFlags::default()
                },
                data_map: None,
            },
        })
    }

    fn read(&self, _req: &Request, node: NodeId, _fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if node.0 != HELLO {
            return Err(Errno::EISDIR);
        }
        let start = (offset as usize).min(CONTENT.len());
        let n = buf.len().min(CONTENT.len() - start);
        buf[..n].copy_from_slice(&CONTENT[start..start + n]);
        Ok(n)
    }

    fn write(&self, _req: &Request, node: NodeId, _fh: FileHandle, data: &[u8], args: &WriteArgs) -> Result<usize> {
        *self.last_write.lock().unwrap() = Some((node.0, data.to_vec(), *args));
        Ok(data.len())
    }

    fn readdir(
        &self,
        _req: &Request,
        node: NodeId,
        _fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> Result<()> {
        for (i, (ino, typ, name)) in self.children(node.0).into_iter().enumerate().skip(offset as usize) {
            if !sink.add(ino + 1000, i as u64 + 1, typ, OsStr::from_bytes(&name)) {
                break;
            }
        }
        Ok(())
    }

    fn readdirplus(
        &self,
        req: &Request,
        node: NodeId,
        _fh: FileHandle,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> Result<()> {
        if !self.native_plus {
            return Err(Errno::ENOSYS);
        }
        for (i, (_, _, name)) in self
            .children(node.0)
            .into_iter()
            .enumerate()
            .skip((offset as usize).max(2))
        {
            let e = self.lookup(req, node, OsStr::from_bytes(&name))?;
            if !sink.add(&e, i as u64 + 1, OsStr::from_bytes(&name)) {
                break;
            }
        }
        Ok(())
    }

    fn statfs(&self, _req: &Request, _node: NodeId) -> Result<Statfs> {
        Ok(Statfs {
            blocks: 1,
            bfree: 2,
            bavail: 3,
            files: 4,
            ffree: 5,
            bsize: 512,
            namelen: 255,
            frsize: 1024,
        })
    }

    fn setxattr(&self, _req: &Request, _node: NodeId, name: &OsStr, value: &[u8], _flags: XattrFlags) -> Result<()> {
        self.xattrs
            .lock()
            .unwrap()
            .insert(name.as_bytes().to_vec(), value.to_vec());
        Ok(())
    }

    fn getxattr(&self, _req: &Request, _node: NodeId, name: &OsStr) -> Result<Vec<u8>> {
        self.xattrs
            .lock()
            .unwrap()
            .get(name.as_bytes())
            .cloned()
            .ok_or(Errno::ENODATA)
    }

    fn listxattr(&self, _req: &Request, _node: NodeId) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for k in self.xattrs.lock().unwrap().keys() {
            out.extend_from_slice(k);
            out.push(0);
        }
        Ok(out)
    }

    fn flock(&self, _req: &Request, node: NodeId, fh: FileHandle, owner: u64, op: FlockOp) -> Result<()> {
        self.log(format!("flock {} {} {owner} {}", node.0, fh.0, op.raw()));
        Ok(())
    }

    fn setlk(
        &self,
        _req: &Request,
        node: NodeId,
        _fh: FileHandle,
        _owner: u64,
        lock: &Lock,
        sleep: bool,
    ) -> Result<()> {
        self.log(format!(
            "setlk {} {}-{} {} {sleep}",
            node.0,
            lock.start,
            lock.end,
            lock.typ.raw()
        ));
        Ok(())
    }

    fn lseek(&self, _req: &Request, _node: NodeId, _fh: FileHandle, offset: u64, whence: Whence) -> Result<u64> {
        Ok(offset + whence.raw() as u64)
    }

    fn copy_file_range(&self, _req: &Request, range: &CopyRange) -> Result<usize> {
        Ok(range.len as usize)
    }
}

/// Everything a 6.18 kernel offers (flags2 bits included).
pub const KERNEL_FLAGS: u64 = 0x7ff_ffff_ffff & !abi::FUSE_INIT_RESERVED;

pub fn msg(opcode: u32, nodeid: u64, unique: u64, body: &[u8]) -> Vec<u8> {
    let h = abi::fuse_in_header {
        len: (40 + body.len()) as u32,
        opcode,
        unique,
        nodeid,
        uid: 1000,
        gid: 1000,
        pid: 42,
        total_extlen: 0,
        padding: 0,
    };
    let mut v = h.as_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

pub fn with_names(arg: &[u8], names: &[&[u8]]) -> Vec<u8> {
    let mut v = arg.to_vec();
    for n in names {
        v.extend_from_slice(n);
        v.push(0);
    }
    v
}

pub fn init_msg(unique: u64, minor: u32, kernel_flags: u64, max_readahead: u32) -> Vec<u8> {
    let (flags, flags2) = abi::split_init_flags(kernel_flags | abi::FUSE_INIT_EXT);
    let arg = abi::fuse_init_in {
        major: 7,
        minor,
        max_readahead,
        flags,
        flags2,
        unused: [0; 11],
    };
    msg(abi::FUSE_INIT, 0, unique, arg.as_bytes())
}

/// A reply split into header fields and payload, after checking that the
/// header's length is the buffer's length.
pub struct Reply {
    pub error: i32,
    pub unique: u64,
    pub payload: Vec<u8>,
}

pub fn check_reply(buf: &[u8]) -> Reply {
    let (h, payload) = abi::fuse_out_header::read_from_prefix(buf).expect("reply shorter than its header");
    assert_eq!(h.len as usize, buf.len(), "reply length field");
    assert!(h.error <= 0 && h.error > -4096, "error {}", h.error);
    if h.error != 0 {
        assert!(payload.is_empty(), "error reply with payload");
    }
    Reply {
        error: h.error,
        unique: h.unique,
        payload: payload.to_vec(),
    }
}

pub struct Harness {
    pub fs: Arc<TestFs>,
    pub d: Dispatcher,
    pub buf: Vec<u8>,
    pub unique: u64,
}

impl Harness {
    pub fn new(fs: TestFs, opts: MountOptions) -> Harness {
        let fs = Arc::new(fs);
        let d = Dispatcher::with_max_pages_limit(fs.clone(), opts, Arc::new(Stats::new()), 256);
        Harness {
            fs,
            d,
            buf: Vec::new(),
            unique: 100,
        }
    }

    /// Connected with every flag offered.
    pub fn ready(fs: TestFs, opts: MountOptions) -> Harness {
        let mut h = Harness::new(fs, opts);
        let r = h.call_raw(&init_msg(1, 45, KERNEL_FLAGS, 128 * 1024));
        assert_eq!(r.error, 0);
        h
    }

    pub fn call_raw(&mut self, m: &[u8]) -> Reply {
        let out = self.d.handle(m, &mut self.buf, Transport::Dev);
        assert_eq!(out, Outcome::Reply, "outcome");
        check_reply(&self.buf)
    }

    /// Sends one request with a fresh unique and checks the reply names it.
    pub fn call(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> Reply {
        self.unique += 1;
        let u = self.unique;
        let r = self.call_raw(&msg(opcode, nodeid, u, body));
        assert_eq!(r.unique, u);
        r
    }

    pub fn ok(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> Vec<u8> {
        let r = self.call(opcode, nodeid, body);
        assert_eq!(r.error, 0, "{} failed", abi::opcode_name(opcode));
        r.payload
    }

    pub fn err(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> i32 {
        let r = self.call(opcode, nodeid, body);
        assert_ne!(r.error, 0, "{} succeeded", abi::opcode_name(opcode));
        -r.error
    }
}

pub fn read_in(fh: u64, offset: u64, size: u32) -> abi::fuse_read_in {
    abi::fuse_read_in {
        fh,
        offset,
        size,
        ..Default::default()
    }
}

/// Little-endian golden bytes from a list of fields.
pub enum F {
    U64(u64),
    U32(u32),
    U16(u16),
    Bytes(&'static [u8]),
    Zero(usize),
}

pub fn golden(fields: &[F]) -> Vec<u8> {
    let mut v = Vec::new();
    for f in fields {
        match f {
            F::U64(x) => v.extend_from_slice(&x.to_le_bytes()),
            F::U32(x) => v.extend_from_slice(&x.to_le_bytes()),
            F::U16(x) => v.extend_from_slice(&x.to_le_bytes()),
            F::Bytes(b) => v.extend_from_slice(b),
            F::Zero(n) => v.resize(v.len() + n, 0),
        }
    }
    v
}

/// Golden bytes of `attr_of(node)` as `struct fuse_attr`.
pub fn golden_attr(node: u64) -> Vec<F> {
    let a = attr_of(node);
    vec![
        F::U64(a.ino),
        F::U64(a.size),
        F::U64(a.blocks),
        F::U64(1),
        F::U64(3),
        F::U64(5),
        F::U32(2),
        F::U32(4),
        F::U32(6),
        F::U32(a.mode),
        F::U32(a.nlink),
        F::U32(10),
        F::U32(20),
        F::U32(0),
        F::U32(4096),
        F::U32(0),
    ]
}
