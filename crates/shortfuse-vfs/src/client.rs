//! The FUSE client: one method per opcode that encodes the request the
//! kernel would send, passes it to the [`Backend`] and decodes the reply.
//!
//! Buffers are per thread and reused; a nested call on the same thread
//! (a file system calling back into its own mount) gets fresh ones.

use shortfuse::sync::Unpoison;
use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use shortfuse::{Attr, Errno, NodeId, SetAttr, SetTime, Statfs, Timestamp};
use shortfuse_abi as abi;
use zerocopy::{FromBytes, IntoBytes};

use crate::backend::Backend;
use crate::once::MadeOnce;

/// What LOOKUP, MKDIR, CREATE, ... return: a node with its cache lifetimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryOut {
    pub node: NodeId,
    pub generation: u64,
    pub attr: Attr,
    pub entry_ttl: Duration,
    pub attr_ttl: Duration,
}

/// The answer to LOOKUP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(EntryOut),
    /// The name does not exist; the file system allows caching that for `ttl`.
    Negative(Duration),
}

/// What OPEN, OPENDIR and the second half of CREATE return.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct OpenOut {
    pub fh: u64,
    /// `FOPEN_*`.
    pub open_flags: u32,
}

/// The answer to GETXATTR/LISTXATTR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XattrOut {
    /// The size the value (or list) needs: the answer to a size of 0.
    Size(u32),
    Data(Vec<u8>),
}

/// What INIT agreed on, as the client uses it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitOut {
    pub minor: u32,
    /// The INIT flags in effect (flags | flags2 << 32).
    pub flags: u64,
    /// Largest WRITE payload and largest READ the client sends.
    pub max_io: u32,
}

/// The credentials every request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The credentials of the thread that makes a request, now: its fsuid and
/// fsgid (the request header's uid and gid) and its supplementary groups
/// (sent as the FUSE_EXT_GROUPS request extension when there are any).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Caller {
    /// Whether `gid` is the caller's group or one of its supplementary
    /// groups (the kernel's in_group_p).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The INIT flags the client offers: the ones whose meaning it implements.
const OFFERED: u64 = abi::FUSE_ATOMIC_O_TRUNC | abi::FUSE_BIG_WRITES | abi::FUSE_MAX_PAGES | abi::FUSE_INIT_EXT;
/// Offered to a shared daemon too: a listing that brings each entry's
/// node and attributes saves `ls -l` a LOOKUP round trip per name. A file
/// system in the program's own process gains nothing from it (its lookups
/// are calls, not round trips) and would look up every name of every
/// listing.
const OFFERED_SHARED: u64 = OFFERED | abi::FUSE_DO_READDIRPLUS;
/// The largest request the client sends (1 MiB, the dispatcher's cap).
const MAX_IO: u32 = 1 << 20;

thread_local! {
    static BUFS: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `go` on this thread's request and reply buffers, or on fresh ones
/// for a thread past its thread-local destructors (a pthread key destructor
/// closing a file, say) or a call made while they are in use.
fn with_bufs<R>(go: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>) -> R) -> R {
    let mut go = Some(go);
    let reused = BUFS.try_with(|cell| {
        let mut bufs = cell.try_borrow_mut().ok()?;
        let (req, reply) = &mut *bufs;
        go.take().map(|go| go(req, reply))
    });
    match (reused, go) {
        (Ok(Some(r)), _) => r,
        (_, Some(go)) => go(&mut Vec::new(), &mut Vec::new()),
        // `go` is taken only where it runs and its result comes back.
        (_, None) => unreachable!("with_bufs: ran without a result"),
    }
}

/// Encodes requests for one connection.
pub struct Client {
    backend: Box<dyn Backend>,
    unique: AtomicU64,
    creds: std::sync::RwLock<Creds>,
    /// Where the caller's current credentials come from (the preload
    /// shim's per-thread ones); without it, `creds` for every request.
    caller: std::sync::OnceLock<fn() -> std::sync::Arc<Caller>>,
    /// The file system answered FLUSH with ENOSYS: as the kernel does, and
    /// as the trait promises, it is never sent again.
    no_flush: AtomicBool,
    /// The xattr calls (bits of [`XATTR_GET`] and the others) the file
    /// system answered with ENOSYS: as the kernel's FUSE client does, they
    /// are not sent again (a daemon without xattrs, sshfs for one, would
    /// otherwise see two for every name `ls -l` lists).
    no_xattr: AtomicU8,
    /// What INIT agreed on, once it was sent.
    init: MadeOnce<InitOut>,
    /// The root's attributes fetched with INIT over a deferred backend,
    /// until the VFS takes them ([`Client::take_root`]).
    root: std::sync::Mutex<Option<(Attr, Duration)>>,
    root_waiting: AtomicBool,
    /// The backend sets its transport up at the first request
    /// ([`Backend::deferred`]): INIT goes first then, not at the start.
    deferred: bool,
}

/// [`Client`]'s `no_xattr` bits.
const XATTR_GET: u8 = 1;
const XATTR_LIST: u8 = 2;
const XATTR_SET: u8 = 4;
const XATTR_REMOVE: u8 = 8;

fn ttl(sec: u64, nsec: u32) -> Duration {
    // A file system may answer u64::MAX seconds ("forever"): saturate.
    Duration::from_secs(sec.min(u64::from(u32::MAX))) + Duration::from_nanos(u64::from(nsec.min(999_999_999)))
}

fn attr_from(a: &abi::fuse_attr) -> Attr {
    Attr {
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        atime: Timestamp {
            sec: a.atime as i64,
            nsec: a.atimensec,
        },
        mtime: Timestamp {
            sec: a.mtime as i64,
            nsec: a.mtimensec,
        },
        ctime: Timestamp {
            sec: a.ctime as i64,
            nsec: a.ctimensec,
        },
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
    }
}

/// The argument of READDIR and READDIRPLUS: `size` bytes of the open
/// directory `fh` from `offset`.
fn dir_read_in(fh: u64, offset: u64, size: u32) -> abi::fuse_read_in {
    abi::fuse_read_in {
        fh,
        offset,
        size,
        ..Default::default()
    }
}

fn entry_from(e: &abi::fuse_entry_out) -> EntryOut {
    EntryOut {
        node: NodeId(e.nodeid),
        generation: e.generation,
        attr: attr_from(&e.attr),
        entry_ttl: ttl(e.entry_valid, e.entry_valid_nsec),
        attr_ttl: ttl(e.attr_valid, e.attr_valid_nsec),
    }
}

/// Reads a `T` from the start of a payload.
fn decode<T: FromBytes>(payload: &[u8]) -> Result<T, Errno> {
    T::read_from_prefix(payload).map(|(t, _)| t).map_err(|_| Errno::EIO)
}

fn name_bytes(name: &OsStr) -> Result<&[u8], Errno> {
    let b = name.as_bytes();
    if b.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(b)
}

impl Client {
    pub fn new(backend: Box<dyn Backend>, creds: Creds) -> Client {
        let deferred = backend.deferred();
        Client {
            backend,
            unique: AtomicU64::new(1),
            creds: std::sync::RwLock::new(creds),
            caller: std::sync::OnceLock::new(),
            no_flush: AtomicBool::new(false),
            no_xattr: AtomicU8::new(0),
            init: MadeOnce::new(),
            root: std::sync::Mutex::new(None),
            root_waiting: AtomicBool::new(false),
            deferred,
        }
    }

    pub fn set_creds(&self, creds: Creds) {
        *self.creds.write().unpoison() = creds;
    }

    pub fn creds(&self) -> Creds {
        *self.creds.read().unpoison()
    }

    /// Every request from now on carries the credentials `source` gives
    /// for the thread that makes it (read at each request).
    pub fn set_caller(&self, source: fn() -> std::sync::Arc<Caller>) {
        let _ = self.caller.set(source);
    }

    /// Who makes a request on this thread now.
    pub fn caller(&self) -> std::sync::Arc<Caller> {
        match self.caller.get() {
            Some(source) => source(),
            None => {
                let c = self.creds();
                std::sync::Arc::new(Caller {
                    uid: c.uid,
                    gid: c.gid,
                    groups: Vec::new(),
                })
            }
        }
    }

    /// Sends `opcode` for `node` with `parts` concatenated as its body; each
    /// `names` item follows NUL-terminated. `f` sees the reply payload.
    fn call<T>(
        &self,
        opcode: u32,
        node: NodeId,
        parts: &[&[u8]],
        names: &[&[u8]],
        f: impl FnOnce(&[u8]) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        if opcode != abi::FUSE_INIT {
            self.opened()?;
        }
        with_bufs(|req, reply| self.call_with(req, reply, opcode, node, parts, names, f))
    }

    /// Sends `opcode` for `node` without waiting for its reply (see
    /// [`Backend::send`]): only a transport failure is reported.
    fn send(&self, opcode: u32, node: NodeId, parts: &[&[u8]]) -> Result<(), Errno> {
        self.opened()?;
        with_bufs(|req, reply| {
            self.encode(req, opcode, node, parts, &[])?;
            self.backend.send(req, reply)
        })
    }

    /// Encodes a request into `req`; returns its `unique`.
    fn encode(
        &self,
        req: &mut Vec<u8>,
        opcode: u32,
        node: NodeId,
        parts: &[&[u8]],
        names: &[&[u8]],
    ) -> Result<u64, Errno> {
        let creds = self.creds();
        let caller = self.caller.get().map(|source| source());
        let (uid, gid) = caller.as_ref().map_or((creds.uid, creds.gid), |c| (c.uid, c.gid));
        let unique = self.unique.fetch_add(1, Ordering::Relaxed);
        req.clear();
        let header = abi::fuse_in_header {
            len: 0,
            opcode,
            unique,
            nodeid: node.0,
            uid,
            gid,
            pid: creds.pid,
            total_extlen: 0,
            padding: 0,
        };
        req.extend_from_slice(header.as_bytes());
        for p in parts {
            req.extend_from_slice(p);
        }
        for n in names {
            req.extend_from_slice(n);
            req.push(0);
        }
        if let Some(c) = caller.filter(|c| !c.groups.is_empty()) {
            // FUSE_EXT_GROUPS: header, count, groups, padded to 8 bytes.
            let start = req.len();
            let size = (8 + 4 + 4 * c.groups.len()).next_multiple_of(8);
            let units = u16::try_from(size / 8).map_err(|_| Errno::E2BIG)?;
            let ext = abi::fuse_ext_header {
                size: size as u32,
                typ: abi::FUSE_EXT_GROUPS,
            };
            req.extend_from_slice(ext.as_bytes());
            req.extend_from_slice(&(c.groups.len() as u32).to_ne_bytes());
            for g in &c.groups {
                req.extend_from_slice(&g.to_ne_bytes());
            }
            req.resize(start + size, 0);
            let at = std::mem::offset_of!(abi::fuse_in_header, total_extlen);
            req[at..at + 2].copy_from_slice(&units.to_ne_bytes());
        }
        let len = u32::try_from(req.len()).map_err(|_| Errno::E2BIG)?;
        req[..4].copy_from_slice(&len.to_ne_bytes());
        Ok(unique)
    }

    #[allow(clippy::too_many_arguments)]
    fn call_with<T>(
        &self,
        req: &mut Vec<u8>,
        reply: &mut Vec<u8>,
        opcode: u32,
        node: NodeId,
        parts: &[&[u8]],
        names: &[&[u8]],
        f: impl FnOnce(&[u8]) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let unique = self.encode(req, opcode, node, parts, names)?;
        self.exchange(req, reply, unique, opcode, f)
    }

    /// Sends request `req`, encoded already with number `unique`, and
    /// hands the payload of its reply to `f`.
    fn exchange<T>(
        &self,
        req: &[u8],
        reply: &mut Vec<u8>,
        unique: u64,
        opcode: u32,
        f: impl FnOnce(&[u8]) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        reply.clear();
        self.backend.call(req, reply)?;
        let info = abi::op_info(opcode);
        if info.is_some_and(|i| !i.reply) {
            return f(&[]);
        }
        let out = decode::<abi::fuse_out_header>(reply)?;
        let hdr = std::mem::size_of::<abi::fuse_out_header>();
        if out.unique != unique || out.len as usize != reply.len() || reply.len() < hdr {
            return Err(Errno::EIO);
        }
        if out.error != 0 {
            return Err(if out.error < 0 {
                Errno::from_raw(-out.error)
            } else {
                Errno::EIO
            });
        }
        f(&reply[hdr..])
    }

    /// FUSE_INIT: must be the first request.
    /// Sends INIT now (the first request of a backend that is not
    /// [`Backend::deferred`]) and returns what it agreed on, which
    /// [`Client::init_out`] then gives.
    pub fn init(&self) -> Result<InitOut, Errno> {
        let out = self.send_init()?;
        self.init.set(out);
        Ok(out)
    }

    /// What INIT agreed on. Over a deferred backend the first request of
    /// the process sends INIT first, once, whichever thread makes it; a
    /// vfork child that would have to set the transport up gets ENOTCONN
    /// (see [`Backend::may_start`]).
    pub fn init_out(&self) -> Result<InitOut, Errno> {
        if let Some(out) = self.init.get() {
            return Ok(*out);
        }
        if !self.deferred {
            // Vfs::new sends it before anything else.
            return Err(Errno::ENOTCONN);
        }
        if !self.backend.may_start() {
            return Err(Errno::ENOTCONN);
        }
        self.init.get_or_try(|| self.open_deferred()).copied()
    }

    /// The first requests over a deferred backend, INIT and the root's
    /// GETATTR (what [`crate::Vfs::new`] sends at once otherwise), handed
    /// to the backend's set-up, which may carry them with its own (the
    /// rings' hello): one round trip for both.
    fn open_deferred(&self) -> Result<InitOut, Errno> {
        let init = self.init_arg();
        let getattr = abi::fuse_getattr_in::default();
        let (mut first, mut then) = (Vec::new(), Vec::new());
        let init_unique = self.encode(&mut first, abi::FUSE_INIT, NodeId(0), &[init.as_bytes()], &[])?;
        let root_unique = self.encode(&mut then, abi::FUSE_GETATTR, NodeId::ROOT, &[getattr.as_bytes()], &[])?;
        let requests = [first, then];
        self.backend.start(&requests)?;
        let mut reply = Vec::new();
        let out = self.exchange(&requests[0], &mut reply, init_unique, abi::FUSE_INIT, init_reply)?;
        if let Ok(root) = self.exchange(&requests[1], &mut reply, root_unique, abi::FUSE_GETATTR, attr_reply) {
            *self.root.lock().unpoison() = Some(root);
            self.root_waiting.store(true, Ordering::Release);
        }
        Ok(out)
    }

    /// The root's attributes and their time to live, fetched with INIT
    /// over a deferred backend and not taken yet.
    pub fn take_root(&self) -> Option<(Attr, Duration)> {
        if !self.root_waiting.load(Ordering::Acquire) {
            return None;
        }
        self.root_waiting.store(false, Ordering::Relaxed);
        self.root.lock().unpoison().take()
    }

    /// Before a request over a deferred backend: INIT, if it was not sent.
    fn opened(&self) -> Result<(), Errno> {
        if self.deferred && self.init.get().is_none() {
            self.init_out()?;
        }
        Ok(())
    }

    fn send_init(&self) -> Result<InitOut, Errno> {
        let arg = self.init_arg();
        self.call(abi::FUSE_INIT, NodeId(0), &[arg.as_bytes()], &[], init_reply)
    }

    /// What INIT offers.
    fn init_arg(&self) -> abi::fuse_init_in {
        let offered = if self.shared() { OFFERED_SHARED } else { OFFERED };
        abi::fuse_init_in {
            major: abi::FUSE_KERNEL_VERSION,
            minor: abi::FUSE_KERNEL_MINOR_VERSION,
            max_readahead: 128 << 10,
            flags: offered as u32,
            flags2: (offered >> 32) as u32,
            unused: [0; 11],
        }
    }

    pub fn lookup(&self, parent: NodeId, name: &OsStr) -> Result<Lookup, Errno> {
        let n = name_bytes(name)?;
        self.call(abi::FUSE_LOOKUP, parent, &[], &[n], |p| {
            let e: abi::fuse_entry_out = decode(p)?;
            if e.nodeid == 0 {
                Ok(Lookup::Negative(ttl(e.entry_valid, e.entry_valid_nsec)))
            } else {
                Ok(Lookup::Found(entry_from(&e)))
            }
        })
    }

    pub fn forget(&self, node: NodeId, nlookup: u64) {
        let arg = abi::fuse_forget_in { nlookup };
        // FORGET has no reply, so nothing waits for it (as the kernel queues
        // it), and a transport failure leaves nothing to report.
        let _ = self.send(abi::FUSE_FORGET, node, &[arg.as_bytes()]);
    }

    pub fn getattr(&self, node: NodeId, fh: Option<u64>) -> Result<(Attr, Duration), Errno> {
        let arg = abi::fuse_getattr_in {
            getattr_flags: if fh.is_some() { abi::FUSE_GETATTR_FH } else { 0 },
            dummy: 0,
            fh: fh.unwrap_or(0),
        };
        self.call(abi::FUSE_GETATTR, node, &[arg.as_bytes()], &[], attr_reply)
    }

    pub fn setattr(&self, node: NodeId, set: &SetAttr) -> Result<(Attr, Duration), Errno> {
        let mut arg = abi::fuse_setattr_in::default();
        field_in(&mut arg.valid, abi::FATTR_MODE, set.mode, &mut arg.mode);
        field_in(&mut arg.valid, abi::FATTR_UID, set.uid, &mut arg.uid);
        field_in(&mut arg.valid, abi::FATTR_GID, set.gid, &mut arg.gid);
        field_in(&mut arg.valid, abi::FATTR_SIZE, set.size, &mut arg.size);
        field_in(&mut arg.valid, abi::FATTR_FH, set.fh.map(|fh| fh.0), &mut arg.fh);
        // As the kernel's FUSE client: a truncation by a caller without
        // CAP_FSETID clears the set-id bits (the file system decides which,
        // from the mode and the caller's groups).
        if set.kill_suidgid || (set.size.is_some() && self.caller().uid != 0) {
            arg.valid |= abi::FATTR_KILL_SUIDGID;
        }
        let (a, m);
        (a, arg.atime, arg.atimensec) = time_in(set.atime, abi::FATTR_ATIME, abi::FATTR_ATIME_NOW);
        (m, arg.mtime, arg.mtimensec) = time_in(set.mtime, abi::FATTR_MTIME, abi::FATTR_MTIME_NOW);
        arg.valid |= a | m;
        if let Some(t) = set.ctime {
            arg.valid |= abi::FATTR_CTIME;
            arg.ctime = t.sec as u64;
            arg.ctimensec = t.nsec;
        }
        self.call(abi::FUSE_SETATTR, node, &[arg.as_bytes()], &[], attr_reply)
    }

    pub fn readlink(&self, node: NodeId) -> Result<Vec<u8>, Errno> {
        self.call(abi::FUSE_READLINK, node, &[], &[], |p| Ok(p.to_vec()))
    }

    pub fn symlink(&self, parent: NodeId, name: &OsStr, target: &[u8]) -> Result<EntryOut, Errno> {
        if target.contains(&0) {
            return Err(Errno::EINVAL);
        }
        self.call(
            abi::FUSE_SYMLINK,
            parent,
            &[],
            &[name_bytes(name)?, target],
            entry_reply,
        )
    }

    pub fn mknod(&self, parent: NodeId, name: &OsStr, mode: u32, rdev: u32, umask: u32) -> Result<EntryOut, Errno> {
        let arg = abi::fuse_mknod_in {
            mode,
            rdev,
            umask,
            padding: 0,
        };
        self.call(
            abi::FUSE_MKNOD,
            parent,
            &[arg.as_bytes()],
            &[name_bytes(name)?],
            entry_reply,
        )
    }

    pub fn mkdir(&self, parent: NodeId, name: &OsStr, mode: u32, umask: u32) -> Result<EntryOut, Errno> {
        let arg = abi::fuse_mkdir_in { mode, umask };
        self.call(
            abi::FUSE_MKDIR,
            parent,
            &[arg.as_bytes()],
            &[name_bytes(name)?],
            entry_reply,
        )
    }

    pub fn unlink(&self, parent: NodeId, name: &OsStr) -> Result<(), Errno> {
        self.call(abi::FUSE_UNLINK, parent, &[], &[name_bytes(name)?], |_| Ok(()))
    }

    pub fn rmdir(&self, parent: NodeId, name: &OsStr) -> Result<(), Errno> {
        self.call(abi::FUSE_RMDIR, parent, &[], &[name_bytes(name)?], |_| Ok(()))
    }

    pub fn rename(
        &self,
        parent: NodeId,
        name: &OsStr,
        new_parent: NodeId,
        new_name: &OsStr,
        flags: u32,
    ) -> Result<(), Errno> {
        let names = [name_bytes(name)?, name_bytes(new_name)?];
        if flags == 0 {
            let arg = abi::fuse_rename_in { newdir: new_parent.0 };
            self.call(abi::FUSE_RENAME, parent, &[arg.as_bytes()], &names, |_| Ok(()))
        } else {
            let arg = abi::fuse_rename2_in {
                newdir: new_parent.0,
                flags,
                padding: 0,
            };
            self.call(abi::FUSE_RENAME2, parent, &[arg.as_bytes()], &names, |_| Ok(()))
        }
    }

    pub fn link(&self, node: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<EntryOut, Errno> {
        let arg = abi::fuse_link_in { oldnodeid: node.0 };
        self.call(
            abi::FUSE_LINK,
            new_parent,
            &[arg.as_bytes()],
            &[name_bytes(new_name)?],
            entry_reply,
        )
    }

    pub fn open(&self, node: NodeId, flags: i32, dir: bool) -> Result<OpenOut, Errno> {
        let arg = abi::fuse_open_in {
            flags: flags as u32,
            open_flags: 0,
        };
        let op = if dir { abi::FUSE_OPENDIR } else { abi::FUSE_OPEN };
        self.call(op, node, &[arg.as_bytes()], &[], |p| {
            let o: abi::fuse_open_out = decode(p)?;
            Ok(OpenOut {
                fh: o.fh,
                open_flags: o.open_flags,
            })
        })
    }

    pub fn create(
        &self,
        parent: NodeId,
        name: &OsStr,
        flags: i32,
        mode: u32,
        umask: u32,
    ) -> Result<(EntryOut, OpenOut), Errno> {
        let arg = abi::fuse_create_in {
            // With O_CREAT, as the kernel sends it: daemons that open the
            // backing file with these flags (bindfs) need it.
            flags: (flags | libc::O_CREAT) as u32,
            mode,
            umask,
            open_flags: 0,
        };
        self.call(abi::FUSE_CREATE, parent, &[arg.as_bytes()], &[name_bytes(name)?], |p| {
            let e: abi::fuse_entry_out = decode(p)?;
            let rest = p.get(std::mem::size_of::<abi::fuse_entry_out>()..).ok_or(Errno::EIO)?;
            let o: abi::fuse_open_out = decode(rest)?;
            Ok((
                entry_from(&e),
                OpenOut {
                    fh: o.fh,
                    open_flags: o.open_flags,
                },
            ))
        })
    }

    /// READ into `buf`; returns the bytes read.
    pub fn read(&self, node: NodeId, fh: u64, offset: u64, buf: &mut [u8], flags: i32) -> Result<usize, Errno> {
        let arg = abi::fuse_read_in {
            fh,
            offset,
            size: u32::try_from(buf.len()).map_err(|_| Errno::EINVAL)?,
            flags: flags as u32,
            ..Default::default()
        };
        self.call(abi::FUSE_READ, node, &[arg.as_bytes()], &[], |p| {
            let n = p.len().min(buf.len());
            buf[..n].copy_from_slice(&p[..n]);
            Ok(n)
        })
    }

    pub fn write(&self, node: NodeId, fh: u64, offset: u64, data: &[u8], flags: i32) -> Result<usize, Errno> {
        let arg = abi::fuse_write_in {
            fh,
            offset,
            size: u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?,
            flags: flags as u32,
            // A write by a caller without CAP_FSETID clears the set-id
            // bits, as the kernel's FUSE client asks.
            write_flags: if self.caller().uid != 0 {
                abi::FUSE_WRITE_KILL_SUIDGID
            } else {
                0
            },
            ..Default::default()
        };
        self.call(abi::FUSE_WRITE, node, &[arg.as_bytes(), data], &[], |p| {
            let o: abi::fuse_write_out = decode(p)?;
            Ok((o.size as usize).min(data.len()))
        })
    }

    pub fn flush(&self, node: NodeId, fh: u64, lock_owner: u64) -> Result<(), Errno> {
        let arg = abi::fuse_flush_in {
            fh,
            unused: 0,
            padding: 0,
            lock_owner,
        };
        if !self.flushes() {
            return Err(Errno::ENOSYS);
        }
        let r = self.call(abi::FUSE_FLUSH, node, &[arg.as_bytes()], &[], |_| Ok(()));
        if r == Err(Errno::ENOSYS) {
            self.no_flush.store(true, Ordering::Relaxed);
        }
        r
    }

    /// Whether a close still sends FLUSH (see [`Client::flush`]).
    pub fn flushes(&self) -> bool {
        !self.no_flush.load(Ordering::Relaxed)
    }

    pub fn release(&self, node: NodeId, fh: u64, flags: i32, dir: bool) -> Result<(), Errno> {
        let arg = abi::fuse_release_in {
            fh,
            flags: flags as u32,
            release_flags: 0,
            lock_owner: 0,
        };
        let op = if dir { abi::FUSE_RELEASEDIR } else { abi::FUSE_RELEASE };
        // As the kernel: in the background, its errors ignored (close has
        // returned by then); nothing the program does next waits for it.
        self.send(op, node, &[arg.as_bytes()])
    }

    pub fn fsync(&self, node: NodeId, fh: u64, datasync: bool, dir: bool) -> Result<(), Errno> {
        let arg = abi::fuse_fsync_in {
            fh,
            fsync_flags: if datasync { abi::FUSE_FSYNC_FDATASYNC } else { 0 },
            padding: 0,
        };
        let op = if dir { abi::FUSE_FSYNCDIR } else { abi::FUSE_FSYNC };
        self.call(op, node, &[arg.as_bytes()], &[], |_| Ok(()))
    }

    /// READDIR: calls `each(ino, next_offset, dt_type, name)` for every
    /// entry of one reply of at most `size` bytes; returns how many there were.
    pub fn readdir(
        &self,
        node: NodeId,
        fh: u64,
        offset: u64,
        size: u32,
        mut each: impl FnMut(u64, u64, u32, &[u8]),
    ) -> Result<usize, Errno> {
        let arg = dir_read_in(fh, offset, size);
        self.call(abi::FUSE_READDIR, node, &[arg.as_bytes()], &[], |mut p| {
            let mut count = 0;
            // An entry cut short at the end is left for the next call, as
            // the kernel does: libfuse's high-level readdir slices its buffer
            // at the size asked, mid-entry.
            while let Ok((d, _)) = abi::fuse_dirent::read_from_prefix(p) {
                let end = abi::FUSE_NAME_OFFSET + d.namelen as usize;
                let Some(name) = p.get(abi::FUSE_NAME_OFFSET..end) else {
                    break;
                };
                each(d.ino, d.off, d.typ, name);
                count += 1;
                p = p
                    .get(abi::fuse_dirent_size(d.namelen as usize).min(p.len())..)
                    .unwrap_or(&[]);
            }
            Ok(count)
        })
    }

    /// READDIRPLUS: calls `each(entry, ino, next_offset, dt_type, name)`
    /// for every entry of one reply of at most `size` bytes, `entry` being
    /// the lookup the file system counted for it (see
    /// [`abi::fuse_direntplus::counts_as_lookup`]), which the caller must
    /// record whatever else it does with the entry; returns how many
    /// entries there were.
    pub fn readdirplus(
        &self,
        node: NodeId,
        fh: u64,
        offset: u64,
        size: u32,
        mut each: impl FnMut(Option<EntryOut>, u64, u64, u32, &[u8]),
    ) -> Result<usize, Errno> {
        let arg = dir_read_in(fh, offset, size);
        self.call(abi::FUSE_READDIRPLUS, node, &[arg.as_bytes()], &[], |p| {
            let mut count = 0;
            for (d, name) in abi::direntplus_entries(p) {
                let entry = d.counts_as_lookup(name).then(|| entry_from(&d.entry_out));
                each(entry, d.dirent.ino, d.dirent.off, d.dirent.typ, name);
                count += 1;
            }
            Ok(count)
        })
    }

    pub fn statfs(&self, node: NodeId) -> Result<Statfs, Errno> {
        self.call(abi::FUSE_STATFS, node, &[], &[], |p| {
            let s: abi::fuse_statfs_out = decode(p)?;
            Ok(Statfs {
                blocks: s.st.blocks,
                bfree: s.st.bfree,
                bavail: s.st.bavail,
                files: s.st.files,
                ffree: s.st.ffree,
                bsize: s.st.bsize,
                namelen: s.st.namelen,
                frsize: s.st.frsize,
            })
        })
    }

    pub fn access(&self, node: NodeId, mask: i32) -> Result<(), Errno> {
        let arg = abi::fuse_access_in {
            mask: mask as u32,
            padding: 0,
        };
        self.call(abi::FUSE_ACCESS, node, &[arg.as_bytes()], &[], |_| Ok(()))
    }

    pub fn fallocate(&self, node: NodeId, fh: u64, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        let arg = abi::fuse_fallocate_in {
            fh,
            offset,
            length,
            mode: mode as u32,
            padding: 0,
        };
        self.call(abi::FUSE_FALLOCATE, node, &[arg.as_bytes()], &[], |_| Ok(()))
    }

    pub fn lseek(&self, node: NodeId, fh: u64, offset: u64, whence: i32) -> Result<u64, Errno> {
        let arg = abi::fuse_lseek_in {
            fh,
            offset,
            whence: whence as u32,
            padding: 0,
        };
        self.call(abi::FUSE_LSEEK, node, &[arg.as_bytes()], &[], |p| {
            Ok(decode::<abi::fuse_lseek_out>(p)?.offset)
        })
    }

    /// Whether the file system is shared with other processes (a daemon).
    pub fn shared(&self) -> bool {
        self.backend.shared()
    }

    /// See [`Backend::anchor`].
    pub fn anchor(&self, anchors: &[crate::backend::Anchor<'_>]) -> Result<(), Errno> {
        self.backend.anchor(anchors)
    }

    /// See [`Backend::claim`].
    pub fn claim(&self, descriptions: &[crate::backend::Anchor<'_>]) -> Result<(), Errno> {
        self.backend.claim(descriptions)
    }

    /// See [`Backend::backing_file`].
    pub fn backing_file(
        &self,
        node: NodeId,
        fh: u64,
        description: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<std::os::fd::OwnedFd, Errno> {
        self.backend.backing_file(node, fh, description)
    }

    /// See [`Backend::kernel_node`].
    pub fn kernel_node(&self, node: NodeId) -> Result<std::os::fd::OwnedFd, Errno> {
        self.backend.kernel_node(node)
    }

    /// See [`Backend::watch_node`].
    pub fn watch_node(&self, node: NodeId, parent: NodeId, name: &[u8]) -> Result<std::os::fd::OwnedFd, Errno> {
        self.backend.watch_node(node, parent, name)
    }

    /// FUSE_GETLK: the first lock that would conflict with `lock` taken by
    /// `owner` (`typ` F_UNLCK when none).
    pub fn getlk(
        &self,
        node: NodeId,
        fh: u64,
        owner: u64,
        lock: &abi::fuse_file_lock,
    ) -> Result<abi::fuse_file_lock, Errno> {
        let arg = abi::fuse_lk_in {
            fh,
            owner,
            lk: *lock,
            lk_flags: 0,
            padding: 0,
        };
        self.call(abi::FUSE_GETLK, node, &[arg.as_bytes()], &[], |p| {
            decode::<abi::fuse_lk_out>(p).map(|o| o.lk)
        })
    }

    /// FUSE_SETLK/SETLKW: POSIX and OFD locks, or with `flock` a whole-file
    /// flock(2) lock (`FUSE_LK_FLOCK`).
    pub fn setlk(
        &self,
        node: NodeId,
        fh: u64,
        owner: u64,
        lock: &abi::fuse_file_lock,
        sleep: bool,
        flock: bool,
    ) -> Result<(), Errno> {
        let arg = abi::fuse_lk_in {
            fh,
            owner,
            lk: *lock,
            lk_flags: if flock { abi::FUSE_LK_FLOCK } else { 0 },
            padding: 0,
        };
        let op = if sleep { abi::FUSE_SETLKW } else { abi::FUSE_SETLK };
        self.call(op, node, &[arg.as_bytes()], &[], |_| Ok(()))
    }

    /// A name and its attributes from the daemon's shared table (see
    /// [`Backend::shared_entry`]): the node must never be sent. For the calling thread's user.
    pub fn shared_entry(&self, parent: NodeId, name: &[u8]) -> Option<(NodeId, Attr)> {
        self.backend
            .shared_entry(parent, name, self.caller().uid)
            .map(|(n, a)| (n, attr_from(&a)))
    }

    /// The daemon's shared listing of `dir` (see
    /// [`Backend::shared_listing`]), for the calling thread's user: `None`
    /// when there is none valid.
    pub fn shared_listing(&self, dir: NodeId) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.backend
            .shared_listing(dir, self.caller().uid, &mut out)
            .then_some(out)
    }

    /// Whether [`Client::shared_entry`] may find anything. A transport
    /// set up at the first request is set up now: a walk needs it anyway.
    pub fn has_shared_entries(&self) -> bool {
        self.opened().is_ok() && self.backend.has_shared_entries()
    }

    /// Whether the backend may have invalidations to drain (see
    /// [`Backend::invalidations_pending`]).
    pub fn invalidations_pending(&self) -> bool {
        self.backend.invalidations_pending()
    }

    /// Drains the backend's invalidations (see [`Backend::invalidations`]).
    pub fn invalidations(&self, apply: &mut dyn FnMut(crate::backend::Invalidation<'_>)) {
        self.backend.invalidations(apply);
    }

    /// GETXATTR (`list` false) or LISTXATTR (`list` true; `name` unused)
    /// with the caller's buffer size: 0 asks for the size only.
    pub fn xattr_get(&self, node: NodeId, name: &[u8], list: bool, size: u32) -> Result<XattrOut, Errno> {
        let arg = abi::fuse_getxattr_in { size, padding: 0 };
        let names: &[&[u8]] = if list { &[] } else { &[name] };
        let op = if list { abi::FUSE_LISTXATTR } else { abi::FUSE_GETXATTR };
        if name.contains(&0) {
            return Err(Errno::EINVAL);
        }
        let bit = if list { XATTR_LIST } else { XATTR_GET };
        self.unless_unimplemented(bit, || {
            self.call(op, node, &[arg.as_bytes()], names, |p| {
                if size == 0 {
                    Ok(XattrOut::Size(decode::<abi::fuse_getxattr_out>(p)?.size))
                } else {
                    Ok(XattrOut::Data(p.to_vec()))
                }
            })
        })
    }

    /// Runs `call` unless the file system already answered the xattr call
    /// `bit` with ENOSYS, and remembers when it does (see `no_xattr`).
    fn unless_unimplemented<T>(&self, bit: u8, call: impl FnOnce() -> Result<T, Errno>) -> Result<T, Errno> {
        if self.no_xattr.load(Ordering::Relaxed) & bit != 0 {
            return Err(Errno::ENOSYS);
        }
        let r = call();
        if matches!(r, Err(e) if e == Errno::ENOSYS) {
            self.no_xattr.fetch_or(bit, Ordering::Relaxed);
        }
        r
    }

    pub fn setxattr(&self, node: NodeId, name: &[u8], value: &[u8], flags: i32) -> Result<(), Errno> {
        let arg = abi::fuse_setxattr_in {
            size: u32::try_from(value.len()).map_err(|_| Errno::E2BIG)?,
            flags: flags as u32,
            setxattr_flags: 0,
            padding: 0,
        };
        if name.contains(&0) {
            return Err(Errno::EINVAL);
        }
        // Without FUSE_SETXATTR_EXT (not offered) the 8-byte form; the
        // value follows the NUL-terminated name.
        let mut body = name.to_vec();
        body.push(0);
        body.extend_from_slice(value);
        let head = &arg.as_bytes()[..abi::FUSE_COMPAT_SETXATTR_IN_SIZE];
        self.unless_unimplemented(XATTR_SET, || {
            self.call(abi::FUSE_SETXATTR, node, &[head, &body], &[], |_| Ok(()))
        })
    }

    pub fn removexattr(&self, node: NodeId, name: &[u8]) -> Result<(), Errno> {
        if name.contains(&0) {
            return Err(Errno::EINVAL);
        }
        self.unless_unimplemented(XATTR_REMOVE, || {
            self.call(abi::FUSE_REMOVEXATTR, node, &[], &[name], |_| Ok(()))
        })
    }

    /// The largest READ or WRITE payload to send.
    pub const fn max_io_cap() -> u32 {
        MAX_IO
    }
}

/// What INIT's reply `p` agreed on.
fn init_reply(p: &[u8]) -> Result<InitOut, Errno> {
    let out: abi::fuse_init_out = if p.len() >= std::mem::size_of::<abi::fuse_init_out>() {
        decode(p)?
    } else {
        let mut full = abi::fuse_init_out::default();
        let n = p.len().min(std::mem::size_of::<abi::fuse_init_out>());
        full.as_mut_bytes()[..n].copy_from_slice(&p[..n]);
        full
    };
    if out.major != abi::FUSE_KERNEL_VERSION {
        return Err(Errno::EPROTO);
    }
    let flags = u64::from(out.flags) | (u64::from(out.flags2) << 32);
    let pages = if flags & abi::FUSE_MAX_PAGES != 0 {
        u32::from(out.max_pages) * 4096
    } else {
        0
    };
    Ok(InitOut {
        minor: out.minor,
        flags,
        max_io: out.max_write.max(pages).clamp(4096, MAX_IO),
    })
}

fn attr_reply(p: &[u8]) -> Result<(Attr, Duration), Errno> {
    let a: abi::fuse_attr_out = decode(p)?;
    Ok((attr_from(&a.attr), ttl(a.attr_valid, a.attr_valid_nsec)))
}

fn entry_reply(p: &[u8]) -> Result<EntryOut, Errno> {
    let e: abi::fuse_entry_out = decode(p)?;
    if e.nodeid == 0 {
        return Err(Errno::EIO);
    }
    Ok(entry_from(&e))
}

/// One optional SETATTR field: when given, its `valid` bit and its value.
fn field_in<T>(valid: &mut u32, bit: u32, value: Option<T>, slot: &mut T) {
    if let Some(v) = value {
        *valid |= bit;
        *slot = v;
    }
}

/// One settable time as SETATTR carries it: the `valid` bits (`set`, and
/// `now` too when the file system is to read its own clock) and the time
/// (zero unless given).
fn time_in(t: Option<SetTime>, set: u32, now: u32) -> (u32, u64, u32) {
    match t {
        Some(SetTime::Now) => (set | now, 0, 0),
        Some(SetTime::At(t)) => (set, t.sec as u64, t.nsec),
        None => (0, 0, 0),
    }
}
