//! Bytes in, trait call, bytes out: decode one FUSE request, call the
//! `Filesystem`, encode the reply. The same code serves every transport.
//!
//! [`Dispatcher::handle`] is called by each worker with its own reused
//! reply buffer. Apart from what a trait method itself returns (e.g. the
//! `Vec` of `readlink`), serving a request allocates nothing: READ reads
//! straight into the reply buffer after the `fuse_out_header`, READDIR
//! encodes entries straight into it, BATCH_FORGET hands the file system
//! chunks of a stack array.
//!
//! Rules of the protocol that the dispatcher keeps for every file system:
//! - Before FUSE_INIT every request but INIT is answered with EIO; so is a
//!   second INIT. After DESTROY every request is answered with EIO.
//! - FORGET, BATCH_FORGET, INTERRUPT and NOTIFY_REPLY get no reply.
//! - A malformed request whose header is readable gets EINVAL (ENOSYS for an
//!   unknown opcode); one whose header is unreadable, or whose `unique` is 0
//!   (a reply would read as a notification), is dropped with a line on
//!   stderr.
//! - INTERRUPT reaches only requests answered later (see [`crate::reply`]):
//!   their handles see it. A request served synchronously runs to
//!   completion on the thread that took it and is always answered; the
//!   protocol lets a daemon ignore interrupts, and the kernel then simply
//!   waits for the normal reply (the interrupted system call sees that
//!   reply or its own signal error).
//! - Opcodes the trait does not cover (BMAP, IOCTL, POLL, STATX, TMPFILE,
//!   SYNCFS, SETUPMAPPING, REMOVEMAPPING, CUSE_INIT) get ENOSYS, which the
//!   kernel remembers for most of them.

mod dir;
pub mod encode;
mod init;
mod offload;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use shortfuse_abi::{self as abi, Operation};

use crate::backing::{Access, Passthrough};
use crate::datamap::DataMap;
use crate::errno::{Errno, Result};
use crate::filesystem::Filesystem;
use crate::notify::{Notifier, PollHandle};
use crate::options::MountOptions;
use crate::reply::{AttrTtl, InFlight, Replies, ReplySink, Wait};
use crate::stats::{Stats, Transport};
use crate::types::*;

pub use init::Negotiated;

use encode::{reply_bytes, reply_error, reply_ok, reply_struct, OUT_HEADER};

/// What the transport does after `handle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Write the reply buffer (fuse_out_header + payload) back.
    Reply,
    /// Nothing to send (FORGET, BATCH_FORGET, INTERRUPT, dropped request).
    NoReply,
    /// FUSE_DESTROY was served (reply in the buffer): the session ends.
    Destroy,
    /// The file system took the request to answer later: the reply goes
    /// to the [`ReplySink`] given to [`Dispatcher::handle_with`].
    Deferred,
}

/// One connection's dispatcher, shared by all worker threads.
pub struct Dispatcher {
    fs: Arc<dyn Filesystem>,
    opts: MountOptions,
    stats: Arc<Stats>,
    max_pages_limit: u32,
    negotiated: OnceLock<Negotiated>,
    destroyed: AtomicBool,
    passthrough: Passthrough,
    notifier: Notifier,
    map_tap: Option<MapTap>,
    /// [`Filesystem::answers_later`], asked once.
    answers_later: bool,
    inflight: Arc<InFlight>,
    /// Helpers for requests that wait for the device (see [`offload`]).
    offload: Arc<offload::Offload>,
    observer: OnceLock<Observer>,
    /// [`InitConfig::file_attr_timeout`](crate::InitConfig), once agreed.
    file_attr_timeout: OnceLock<Duration>,
}

/// Sees the data map of every successful OPEN and CREATE (see
/// [`Dispatcher::with_map_tap`]).
pub type MapTap = Arc<dyn Fn(NodeId, FileHandle, &DataMap) + Send + Sync>;

/// Sees every request a dispatcher answered without an error, and the
/// reply (see [`Dispatcher::observe`]).
pub type Observer = Box<dyn Fn(&abi::Request<'_>, &[u8]) + Send + Sync>;

/// Whether `reply` answers its request without an error (an empty one,
/// of a request that takes none, does not).
pub fn answered_ok(reply: &[u8]) -> bool {
    use zerocopy::FromBytes;
    abi::fuse_out_header::read_from_prefix(reply).is_ok_and(|(o, _)| o.error == 0)
}

/// Result of serving one decoded request.
type Served = Result<Outcome>;

impl Dispatcher {
    /// A dispatcher for a kernel connection: `max_pages` is capped by
    /// `/proc/sys/fs/fuse/max_pages_limit`.
    pub fn new(fs: Arc<dyn Filesystem>, opts: MountOptions, stats: Arc<Stats>) -> Dispatcher {
        Dispatcher::with_max_pages_limit(fs, opts, stats, init::read_max_pages_limit())
    }

    /// A dispatcher with an explicit page limit, for transports without the
    /// kernel's sysctl (in-process, shared-memory rings) and for tests.
    pub fn with_max_pages_limit(
        fs: Arc<dyn Filesystem>,
        opts: MountOptions,
        stats: Arc<Stats>,
        max_pages_limit: u32,
    ) -> Dispatcher {
        Dispatcher {
            opts,
            stats,
            max_pages_limit: max_pages_limit.max(1),
            negotiated: OnceLock::new(),
            destroyed: AtomicBool::new(false),
            passthrough: Passthrough::new(),
            notifier: Notifier::new(),
            map_tap: None,
            answers_later: fs.answers_later(),
            inflight: Arc::default(),
            offload: Arc::default(),
            fs,
            observer: OnceLock::new(),
            file_attr_timeout: OnceLock::new(),
        }
    }

    /// Hands `tap` the data map of every open this dispatcher answers
    /// (after it was validated): a transport that cannot carry the map in
    /// its reply (the shared-memory rings) keeps what it needs of it, to
    /// give a client the backing file for a shared memory map.
    pub fn with_map_tap(mut self, tap: MapTap) -> Dispatcher {
        self.map_tap = Some(tap);
        self
    }

    /// Hands `observer` every request answered without an error, once the
    /// file system served it and before the reply goes out: a daemon that
    /// serves other clients beside this connection (the rings beside a
    /// kernel mount) tells them what the request changed. Only the first
    /// observer set is kept.
    pub fn observe(&self, observer: Observer) {
        let _ = self.observer.set(observer);
    }

    /// Shares `notifier` instead of a notifier of its own: every client of
    /// one daemon (its kernel mount and each ring client) reaches the same
    /// caches through one handle, the one the file system gets in `init`.
    pub fn with_notifier(mut self, notifier: Notifier) -> Dispatcher {
        self.notifier = notifier;
        self
    }

    /// The notifier the file system gets in [`crate::InitConfig::notifier`].
    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// The session is over (unmounted, or the connection aborted): the
    /// file system gets its `destroy` now unless DESTROY came, as libfuse
    /// does at session end, since the kernel sends DESTROY only for
    /// `fuseblk` mounts: a file system that writes back at `destroy`
    /// (distfs's cache, pack's sizes) would otherwise lose that at umount.
    /// Once, and only after INIT (nothing was set up before).
    pub fn finish(&self) {
        // An fsync still running on a helper ends before `destroy`.
        self.offload.wait_idle();
        if self.negotiated.get().is_some() && !self.destroyed.swap(true, Ordering::Relaxed) {
            self.fs.destroy();
        }
    }

    /// What INIT agreed on; `None` until INIT has been answered.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.get()
    }

    /// Bytes a /dev/fuse read buffer must hold: `max_write` plus one page
    /// for headers, at least `FUSE_MIN_READ_BUFFER`. Before INIT this is the
    /// largest size INIT may agree on; after INIT the agreed size.
    pub fn buffer_size(&self) -> usize {
        match self.negotiated.get() {
            Some(n) => n.buffer_size(),
            None => init::buffer_size_for(init::max_write_limit(self.max_pages_limit)),
        }
    }

    /// The mount options this connection serves.
    pub fn options(&self) -> &MountOptions {
        &self.opts
    }

    /// The connection's statistics.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Kernel passthrough bookkeeping. A kernel session calls
    /// `Passthrough::attach_device` with its /dev/fuse fd before serving.
    pub(crate) fn passthrough(&self) -> &Passthrough {
        &self.passthrough
    }

    /// Serves one request. `reply` is cleared and, for `Outcome::Reply` and
    /// `Outcome::Destroy`, holds the whole reply message. A request the file
    /// system answers later (see [`crate::reply`]) is waited for here: this
    /// is for transports that answer each request before they take the
    /// next.
    pub fn handle(&self, request: &[u8], reply: &mut Vec<u8>, transport: Transport) -> Outcome {
        self.handle_with(request, reply, transport, None)
    }

    /// Requests taken to be answered later whose answers are not sent yet.
    pub fn deferred_in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// As [`Dispatcher::handle`], for a transport that can send a reply
    /// after the request left it: a request the file system answers later
    /// returns [`Outcome::Deferred`] at once and its reply reaches `sink`
    /// from whatever thread answers (with `None`, it is waited for).
    pub fn handle_with(
        &self,
        request: &[u8],
        reply: &mut Vec<u8>,
        transport: Transport,
        sink: Option<&Arc<dyn ReplySink>>,
    ) -> Outcome {
        let start = self.stats.timed().then(Instant::now);
        reply.clear();
        let config = abi::ParseConfig {
            setxattr_ext: self.negotiated.get().is_some_and(|n| n.has(abi::FUSE_SETXATTR_EXT)),
        };
        let (opcode, outcome) = match abi::parse_with(request, config) {
            Ok(req) => {
                let unique = req.header.unique;
                let debug = tracing::enabled!(target: REQUESTS, tracing::Level::DEBUG);
                if debug {
                    log_request(&req.header, request.len());
                }
                let outcome = match self.serve(&req, reply, sink) {
                    Ok(o) => {
                        if let Some(observe) = self.observer.get() {
                            if answered_ok(reply) {
                                observe(&req, reply);
                            }
                        }
                        o
                    }
                    Err(e) => self.error_reply(reply, req.header.opcode, unique, e),
                };
                if debug {
                    log_reply(unique, &outcome, reply);
                }
                (req.header.opcode, outcome)
            }
            Err(err) => (err.header().map_or(0, |h| h.opcode), self.malformed(&err, reply)),
        };
        let nanos = start.map_or(0, |s| u64::try_from(s.elapsed().as_nanos()).unwrap_or(u64::MAX));
        self.stats.record(opcode, transport, nanos);
        outcome
    }

    /// An error answer, unless the opcode takes no reply or `unique` is 0.
    fn error_reply(&self, reply: &mut Vec<u8>, opcode: u32, unique: u64, err: Errno) -> Outcome {
        let replies = abi::op_info(opcode).is_none_or(|i| i.reply);
        if !replies || unique == 0 {
            reply.clear();
            return Outcome::NoReply;
        }
        reply_error(reply, unique, err);
        Outcome::Reply
    }

    fn malformed(&self, err: &abi::ParseError, reply: &mut Vec<u8>) -> Outcome {
        tracing::warn!("{err}");
        match err.header() {
            Some(h) => {
                let errno = if err.kind == abi::ParseErrorKind::UnknownOpcode {
                    Errno::ENOSYS
                } else {
                    Errno::EINVAL
                };
                self.error_reply(reply, h.opcode, h.unique, errno)
            }
            None => Outcome::NoReply,
        }
    }

    fn serve(&self, r: &abi::Request<'_>, reply: &mut Vec<u8>, sink: Option<&Arc<dyn ReplySink>>) -> Served {
        let h = &r.header;
        let unique = h.unique;
        let negotiated = match (&r.op, self.negotiated.get()) {
            (Operation::Init { arg }, None) => return self.init(arg, unique, reply),
            (Operation::Init { .. }, Some(_)) => {
                tracing::warn!("second FUSE_INIT refused");
                return Err(Errno::EIO);
            }
            (_, None) => {
                tracing::warn!("{} before FUSE_INIT refused", abi::opcode_name(h.opcode));
                return Err(Errno::EIO);
            }
            (_, Some(n)) => n,
        };
        if self.destroyed.load(Ordering::Relaxed) {
            return Err(Errno::EIO);
        }
        let fs = &*self.fs;
        let req = Request {
            unique,
            uid: h.uid,
            gid: h.gid,
            pid: h.pid,
        };
        let carried = abi::supp_groups(r.extensions).filter(|g| !g.is_empty());
        let _groups = crate::types::ServingGroups::set(carried);
        let node = NodeId(h.nodeid);
        let o = &self.opts;
        if self.answers_later {
            let mut later = |call: &dyn Fn(&Replies)| self.later(unique, sink, reply, call);
            match r.op {
                Operation::Lookup { name } => {
                    let (e, a, n) = (o.entry_timeout, self.attr_ttls(), o.negative_timeout);
                    return later(&|rs| fs.lookup_deferred(&req, node, name, rs.entry(e, a, n)));
                }
                Operation::Getattr { arg } => {
                    let fh = (arg.getattr_flags & abi::FUSE_GETATTR_FH != 0).then_some(FileHandle(arg.fh));
                    return later(&|rs| fs.getattr_deferred(&req, node, fh, rs.attr(self.attr_ttls())));
                }
                Operation::Setattr { arg } => {
                    let set = set_attr(&arg);
                    return later(&|rs| fs.setattr_deferred(&req, node, &set, rs.attr(self.attr_ttls())));
                }
                Operation::Read { arg } => {
                    let size = checked_size(arg.size, negotiated)?;
                    let fh = FileHandle(arg.fh);
                    return later(&|rs| fs.read_deferred(&req, node, fh, arg.offset, size, rs.data()));
                }
                Operation::Write { arg, data } => {
                    let args = write_args(&arg);
                    return later(&|rs| fs.write_deferred(&req, node, FileHandle(arg.fh), data, &args, rs.write()));
                }
                Operation::Interrupt { arg } => {
                    self.inflight.interrupt(arg.unique);
                    return Ok(Outcome::NoReply);
                }
                _ => {}
            }
        }
        if let (Some(sink), Operation::Fsync { arg } | Operation::Fsyncdir { arg }) = (sink, &r.op) {
            return Ok(self.sync_on_helper(h.opcode, req, node, arg, sink));
        }
        match r.op {
            Operation::Lookup { name } => match fs.lookup(&req, node, name) {
                Ok(e) => self.entry(reply, unique, &e),
                Err(e) if e == Errno::ENOENT && !o.negative_timeout.is_zero() => {
                    // A zero node id with a timeout is a cached negative entry.
                    let (entry_valid, entry_valid_nsec) = encode::split_duration(o.negative_timeout);
                    let out = abi::fuse_entry_out {
                        entry_valid,
                        entry_valid_nsec,
                        ..Default::default()
                    };
                    reply_struct(reply, unique, &out);
                    Ok(Outcome::Reply)
                }
                Err(e) => Err(e),
            },
            Operation::Forget { arg } => {
                self.passthrough.forget(node);
                fs.forget(node, arg.nlookup);
                Ok(Outcome::NoReply)
            }
            Operation::BatchForget { nodes, .. } => {
                let mut chunk = [Forget {
                    node: NodeId(0),
                    nlookup: 0,
                }; 64];
                let mut n = 0;
                for f in nodes.iter() {
                    self.passthrough.forget(NodeId(f.nodeid));
                    chunk[n] = Forget {
                        node: NodeId(f.nodeid),
                        nlookup: f.nlookup,
                    };
                    n += 1;
                    if n == chunk.len() {
                        fs.batch_forget(&chunk);
                        n = 0;
                    }
                }
                if n > 0 {
                    fs.batch_forget(&chunk[..n]);
                }
                Ok(Outcome::NoReply)
            }
            Operation::Getattr { arg } => {
                let fh = (arg.getattr_flags & abi::FUSE_GETATTR_FH != 0).then_some(FileHandle(arg.fh));
                let attr = fs.getattr(&req, node, fh)?;
                reply_struct(reply, unique, &encode::attr_out(&attr, self.attr_ttl(&attr)));
                Ok(Outcome::Reply)
            }
            Operation::Setattr { arg } => {
                let attr = fs.setattr(&req, node, &set_attr(&arg))?;
                reply_struct(reply, unique, &encode::attr_out(&attr, self.attr_ttl(&attr)));
                Ok(Outcome::Reply)
            }
            Operation::Readlink => {
                let target = fs.readlink(&req, node)?;
                reply_bytes(reply, unique, &target);
                Ok(Outcome::Reply)
            }
            Operation::Symlink { name, target } => {
                let e = fs.symlink(&req, node, name, target)?;
                self.entry(reply, unique, &e)
            }
            Operation::Mknod { arg, name } => {
                let new = NewNode {
                    mode: arg.mode,
                    umask: arg.umask,
                    rdev: arg.rdev,
                };
                let e = fs.mknod(&req, node, name, &new)?;
                self.entry(reply, unique, &e)
            }
            Operation::Mkdir { arg, name } => {
                // The kernel sends only permission bits; the type is implied.
                let new = NewNode {
                    mode: arg.mode | libc::S_IFDIR,
                    umask: arg.umask,
                    rdev: 0,
                };
                let e = fs.mkdir(&req, node, name, &new)?;
                self.entry(reply, unique, &e)
            }
            Operation::Unlink { name } => {
                fs.unlink(&req, node, name)?;
                ok(reply, unique)
            }
            Operation::Rmdir { name } => {
                fs.rmdir(&req, node, name)?;
                ok(reply, unique)
            }
            Operation::Rename { arg, name, new_name } => {
                fs.rename(&req, node, name, NodeId(arg.newdir), new_name, RenameFlags::default())?;
                ok(reply, unique)
            }
            Operation::Rename2 { arg, name, new_name } => {
                let flags = RenameFlags::from_raw(arg.flags);
                if flags.raw() != arg.flags {
                    return Err(Errno::EINVAL);
                }
                fs.rename(&req, node, name, NodeId(arg.newdir), new_name, flags)?;
                ok(reply, unique)
            }
            Operation::Link { arg, name } => {
                let e = fs.link(&req, NodeId(arg.oldnodeid), node, name)?;
                self.entry(reply, unique, &e)
            }
            Operation::Open { arg } => {
                let opened = fs.open(&req, node, OpenFlags::from_raw(arg.flags as i32))?;
                let out = self.file_open_out(fs, &req, node, &opened, arg.flags)?;
                reply_struct(reply, unique, &out);
                Ok(Outcome::Reply)
            }
            Operation::Opendir { arg } => {
                let opened = fs.opendir(&req, node, OpenFlags::from_raw(arg.flags as i32))?;
                let out = self.open_out(&opened, false);
                reply_struct(reply, unique, &out);
                Ok(Outcome::Reply)
            }
            Operation::Create { arg, name } => {
                let new = NewNode {
                    mode: arg.mode,
                    umask: arg.umask,
                    rdev: 0,
                };
                let created = fs.create(&req, node, name, &new, OpenFlags::from_raw(arg.flags as i32))?;
                let open = match self.file_open_out(fs, &req, created.entry.node, &created.opened, arg.flags) {
                    Ok(open) => open,
                    Err(e) => {
                        // The kernel never learns of the new name: give back
                        // its lookup so the file system does not leak it.
                        fs.forget(created.entry.node, 1);
                        return Err(e);
                    }
                };
                let entry = encode::entry_out(&created.entry, o.entry_timeout, self.attr_ttl(&created.entry.attr));
                encode::begin(reply, unique);
                reply.extend_from_slice(zerocopy::IntoBytes::as_bytes(&entry));
                reply.extend_from_slice(zerocopy::IntoBytes::as_bytes(&open));
                encode::finish(reply);
                Ok(Outcome::Reply)
            }
            Operation::Read { arg } => {
                let size = checked_size(arg.size, negotiated)?;
                encode::begin(reply, unique);
                reply.resize(OUT_HEADER + size, 0);
                match fs.read(&req, node, FileHandle(arg.fh), arg.offset, &mut reply[OUT_HEADER..]) {
                    Ok(n) => {
                        reply.truncate(OUT_HEADER + n.min(size));
                        encode::finish(reply);
                        Ok(Outcome::Reply)
                    }
                    Err(e) => Err(e),
                }
            }
            Operation::Write { arg, data } => {
                let args = write_args(&arg);
                let n = fs.write(&req, node, FileHandle(arg.fh), data, &args)?;
                let out = abi::fuse_write_out {
                    size: n.min(data.len()) as u32,
                    padding: 0,
                };
                reply_struct(reply, unique, &out);
                Ok(Outcome::Reply)
            }
            Operation::Statfs => {
                let st = fs.statfs(&req, node)?;
                reply_struct(reply, unique, &encode::statfs_out(&st));
                Ok(Outcome::Reply)
            }
            Operation::Release { arg } => {
                let flush = arg.release_flags & abi::FUSE_RELEASE_FLUSH != 0;
                let flock_release = arg.release_flags & abi::FUSE_RELEASE_FLOCK_UNLOCK != 0;
                let args = ReleaseArgs {
                    flags: OpenFlags::from_raw(arg.flags as i32),
                    flush,
                    flock_release,
                    lock_owner: (flush || flock_release).then_some(arg.lock_owner),
                };
                let released = fs.release(&req, node, FileHandle(arg.fh), &args);
                // The file is closed whatever the file system answers.
                self.passthrough.release(node);
                released?;
                ok(reply, unique)
            }
            Operation::Releasedir { arg } => {
                fs.releasedir(&req, node, FileHandle(arg.fh), OpenFlags::from_raw(arg.flags as i32))?;
                ok(reply, unique)
            }
            Operation::Fsync { arg } => {
                fs.fsync(
                    &req,
                    node,
                    FileHandle(arg.fh),
                    arg.fsync_flags & abi::FUSE_FSYNC_FDATASYNC != 0,
                )?;
                ok(reply, unique)
            }
            Operation::Fsyncdir { arg } => {
                fs.fsyncdir(
                    &req,
                    node,
                    FileHandle(arg.fh),
                    arg.fsync_flags & abi::FUSE_FSYNC_FDATASYNC != 0,
                )?;
                ok(reply, unique)
            }
            Operation::Flush { arg } => {
                fs.flush(&req, node, FileHandle(arg.fh), arg.lock_owner)?;
                ok(reply, unique)
            }
            Operation::Readdir { arg } => {
                let size = checked_size(arg.size, negotiated)?;
                encode::begin(reply, unique);
                let mut sink = dir::DirBuf {
                    buf: reply,
                    limit: OUT_HEADER + size,
                };
                fs.readdir(&req, node, FileHandle(arg.fh), arg.offset, &mut sink)?;
                encode::finish(reply);
                Ok(Outcome::Reply)
            }
            Operation::Readdirplus { arg } => {
                let size = checked_size(arg.size, negotiated)?;
                encode::begin(reply, unique);
                let mut sink = dir::DirPlusBuf {
                    buf: reply,
                    limit: OUT_HEADER + size,
                    entry_ttl: o.entry_timeout,
                    attr_ttl: o.attr_timeout,
                    file_attr_ttl: self.file_attr_timeout.get().copied(),
                };
                match fs.readdirplus(&req, node, FileHandle(arg.fh), arg.offset, &mut sink) {
                    Err(e) if e == Errno::ENOSYS => {
                        sink.buf.truncate(OUT_HEADER);
                        dir::emulate_readdirplus(fs, &req, node, FileHandle(arg.fh), arg.offset, &mut sink, size)?;
                    }
                    r => r?,
                }
                encode::finish(reply);
                Ok(Outcome::Reply)
            }
            Operation::Setxattr { arg, name, value } => {
                fs.setxattr(&req, node, name, value, XattrFlags::from_raw(arg.flags as i32))?;
                ok(reply, unique)
            }
            Operation::Getxattr { arg, name } => {
                let value = fs.getxattr(&req, node, name)?;
                xattr_reply(reply, unique, arg.size, &value)
            }
            Operation::Listxattr { arg } => {
                let names = fs.listxattr(&req, node)?;
                xattr_reply(reply, unique, arg.size, &names)
            }
            Operation::Removexattr { name } => {
                fs.removexattr(&req, node, name)?;
                ok(reply, unique)
            }
            Operation::Access { arg } => {
                fs.access(&req, node, AccessMode::from_raw(arg.mask as i32))?;
                ok(reply, unique)
            }
            Operation::Getlk { arg } => {
                let lock = fs.getlk(&req, node, FileHandle(arg.fh), arg.owner, &Lock::try_from(&arg.lk)?)?;
                reply_struct(reply, unique, &abi::fuse_lk_out::from(lock));
                Ok(Outcome::Reply)
            }
            Operation::Setlk { arg } => self.setlk(fs, &req, node, &arg, false, reply, unique),
            Operation::Setlkw { arg } => self.setlk(fs, &req, node, &arg, true, reply, unique),
            Operation::Fallocate { arg } => {
                fs.fallocate(
                    &req,
                    node,
                    FileHandle(arg.fh),
                    arg.offset,
                    arg.length,
                    FallocateFlags::from_raw(arg.mode as i32),
                )?;
                ok(reply, unique)
            }
            Operation::Lseek { arg } => {
                let whence = Whence::from_raw(arg.whence as i32).ok_or(Errno::EINVAL)?;
                let offset = fs.lseek(&req, node, FileHandle(arg.fh), arg.offset, whence)?;
                reply_struct(reply, unique, &abi::fuse_lseek_out { offset });
                Ok(Outcome::Reply)
            }
            Operation::CopyFileRange { arg } => {
                let n = fs.copy_file_range(&req, &copy_range(node, &arg))?;
                // The 32-bit reply: the kernel caps `len` below 4 GiB for it.
                let out = abi::fuse_write_out {
                    size: u32::try_from(n).unwrap_or(u32::MAX),
                    padding: 0,
                };
                reply_struct(reply, unique, &out);
                Ok(Outcome::Reply)
            }
            Operation::CopyFileRange64 { arg } => {
                let n = fs.copy_file_range(&req, &copy_range(node, &arg))?;
                reply_struct(reply, unique, &abi::fuse_copy_file_range_out { bytes_copied: n as u64 });
                Ok(Outcome::Reply)
            }
            Operation::NotifyReply { arg, data } => {
                // The kernel's answer to a FUSE_NOTIFY_RETRIEVE we sent.
                self.notifier.retrieved(unique, arg.offset, data);
                Ok(Outcome::NoReply)
            }
            Operation::Poll { arg } => {
                let handle = (arg.flags & abi::FUSE_POLL_SCHEDULE_NOTIFY != 0).then_some(PollHandle(arg.kh));
                let events = PollEvents::from_raw(arg.events);
                let revents = fs.poll(&req, node, FileHandle(arg.fh), handle, events)?.bits();
                reply_struct(reply, unique, &abi::fuse_poll_out { revents, padding: 0 });
                Ok(Outcome::Reply)
            }
            Operation::Interrupt { .. } => Ok(Outcome::NoReply),
            Operation::Destroy => {
                if !self.destroyed.swap(true, Ordering::Relaxed) {
                    fs.destroy();
                }
                reply_ok(reply, unique);
                Ok(Outcome::Destroy)
            }
            Operation::Init { .. } => Err(Errno::EIO),
            Operation::Bmap { .. }
            | Operation::Ioctl { .. }
            | Operation::SetupMapping { .. }
            | Operation::RemoveMapping { .. }
            | Operation::Syncfs { .. }
            | Operation::Tmpfile { .. }
            | Operation::Statx { .. }
            | Operation::CuseInit { .. } => Err(Errno::ENOSYS),
        }
    }

    /// FSYNC or FSYNCDIR (`opcode`) served on a helper thread, answered to
    /// `sink` from there: the reader that took it goes on reading while
    /// the device flushes (see [`offload`]).
    fn sync_on_helper(
        &self,
        opcode: u32,
        req: Request,
        node: NodeId,
        arg: &abi::fuse_fsync_in,
        sink: &Arc<dyn ReplySink>,
    ) -> Outcome {
        let reply = Replies {
            sink: sink.clone(),
            inflight: self.inflight.clone(),
            unique: req.unique,
        }
        .empty();
        let fs = self.fs.clone();
        let fh = FileHandle(arg.fh);
        let datasync = arg.fsync_flags & abi::FUSE_FSYNC_FDATASYNC != 0;
        let dir = opcode == abi::FUSE_FSYNCDIR;
        self.offload.run(Box::new(move || {
            reply.result(if dir {
                fs.fsyncdir(&req, node, fh, datasync)
            } else {
                fs.fsync(&req, node, fh, datasync)
            })
        }));
        Outcome::Deferred
    }

    /// Hands `call` the makers of a reply handle for `unique`: the reply
    /// goes to `sink`, or, without one, is waited for and left in `reply`.
    fn later(
        &self,
        unique: u64,
        sink: Option<&Arc<dyn ReplySink>>,
        reply: &mut Vec<u8>,
        call: &dyn Fn(&Replies),
    ) -> Served {
        let wait = match sink {
            Some(sink) => {
                call(&Replies {
                    sink: sink.clone(),
                    inflight: self.inflight.clone(),
                    unique,
                });
                return Ok(Outcome::Deferred);
            }
            None => Arc::new(Wait::default()),
        };
        call(&Replies {
            sink: wait.clone(),
            inflight: self.inflight.clone(),
            unique,
        });
        wait.take(reply);
        Ok(Outcome::Reply)
    }

    fn init(&self, arg: &abi::fuse_init_in, unique: u64, reply: &mut Vec<u8>) -> Served {
        if arg.major > abi::FUSE_KERNEL_VERSION {
            // Protocol: answer with our major only; the kernel sends a new INIT.
            let out = abi::fuse_init_out {
                major: abi::FUSE_KERNEL_VERSION,
                minor: abi::FUSE_KERNEL_MINOR_VERSION,
                ..Default::default()
            };
            reply_struct(reply, unique, &out);
            return Ok(Outcome::Reply);
        }
        if arg.major < abi::FUSE_KERNEL_VERSION || arg.minor < init::MIN_MINOR {
            tracing::warn!(
                "kernel FUSE protocol {}.{} is too old (need 7.{} or later)",
                arg.major,
                arg.minor,
                init::MIN_MINOR
            );
            return Err(Errno::EPROTO);
        }
        let kernel_flags = if u64::from(arg.flags) & abi::FUSE_INIT_EXT != 0 {
            abi::join_init_flags(arg.flags, arg.flags2)
        } else {
            u64::from(arg.flags)
        };
        let mut cfg = init::initial_config(&self.opts, arg, kernel_flags, self.max_pages_limit);
        cfg.notifier = self.notifier.clone();
        self.fs.init(&mut cfg)?;
        if let Some(t) = cfg.file_attr_timeout {
            let _ = self.file_attr_timeout.set(t);
        }
        let (negotiated, out) = init::finish(&cfg, arg, kernel_flags, self.max_pages_limit);
        let passthrough = negotiated.has(abi::FUSE_PASSTHROUGH);
        if self.negotiated.set(negotiated).is_err() {
            // Another worker answered an INIT at the same time.
            return Err(Errno::EIO);
        }
        self.passthrough.set_active(passthrough);
        reply_struct(reply, unique, &out);
        Ok(Outcome::Reply)
    }

    /// How long the kernel may trust attributes: the file system's timeout
    /// for regular files, if it set one, else the mount's.
    fn attr_ttls(&self) -> AttrTtl {
        AttrTtl {
            any: self.opts.attr_timeout,
            regular: self.file_attr_timeout.get().copied(),
        }
    }

    /// [`Dispatcher::attr_ttls`] of `attr`.
    fn attr_ttl(&self, attr: &Attr) -> Duration {
        self.attr_ttls().of(attr)
    }

    fn entry(&self, reply: &mut Vec<u8>, unique: u64, e: &Entry) -> Served {
        let out = encode::entry_out(e, self.opts.entry_timeout, self.attr_ttl(&e.attr));
        reply_struct(reply, unique, &out);
        Ok(Outcome::Reply)
    }

    /// `fuse_open_out`; for files, the mount's `direct_io`/`keep_cache`
    /// are added to what the file system chose.
    fn open_out(&self, opened: &Opened, file: bool) -> abi::fuse_open_out {
        let f = &opened.flags;
        let mut flags = 0;
        let mut set = |on: bool, bit: u32| {
            if on {
                flags |= bit;
            }
        };
        set(f.direct_io || (file && self.opts.direct_io), abi::FOPEN_DIRECT_IO);
        set(f.keep_cache || (file && self.opts.keep_cache), abi::FOPEN_KEEP_CACHE);
        set(f.nonseekable, abi::FOPEN_NONSEEKABLE);
        set(f.cache_dir, abi::FOPEN_CACHE_DIR);
        set(f.noflush, abi::FOPEN_NOFLUSH);
        set(f.parallel_direct_writes, abi::FOPEN_PARALLEL_DIRECT_WRITES);
        abi::fuse_open_out {
            fh: opened.fh.0,
            open_flags: flags,
            backing_id: 0,
        }
    }

    /// `fuse_open_out` of OPEN/CREATE: checks the file system's data map
    /// and, under kernel passthrough, registers the open (see
    /// [`crate::backing`]). An invalid map fails the open with EINVAL after
    /// the file system's handle is released.
    fn file_open_out(
        &self,
        fs: &dyn Filesystem,
        req: &Request,
        node: NodeId,
        opened: &Opened,
        open_flags: u32,
    ) -> Result<abi::fuse_open_out> {
        let mut backing_stat = None;
        if let Some(map) = &opened.data_map {
            match map.validate_stat() {
                Ok(st) => backing_stat = st.filter(|_| map.as_whole().is_some()),
                Err(e) => {
                    tracing::warn!(
                        "{}: open of node {} returned an invalid data map: {e}",
                        self.fs_name(),
                        node.0
                    );
                    let args = ReleaseArgs {
                        flags: OpenFlags::from_raw(open_flags as i32),
                        ..ReleaseArgs::default()
                    };
                    let _ = fs.release(req, node, opened.fh, &args);
                    return Err(Errno::EINVAL);
                }
            }
        }
        if let (Some(tap), Some(map)) = (&self.map_tap, &opened.data_map) {
            tap(node, opened.fh, map);
        }
        let mut out = self.open_out(opened, true);
        let setid_writer = self.setid_writer(fs, req, node, opened, open_flags);
        // A first open by such a writer puts the inode in daemon mode (no
        // map): its writes then come here with FUSE_WRITE_KILL_SUIDGID.
        let map = opened.data_map.as_ref().filter(|_| !setid_writer);
        let access = if open_flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32 {
            Access::Write
        } else if self.opts.reader_cache
            && open_flags & libc::O_TRUNC as u32 == 0
            && backing_stat
                .as_ref()
                .is_none_or(|st| st.st_size as u64 <= self.opts.reader_cache_max)
        {
            // A larger file is passed through: its pages stay in the
            // source's page cache only, whose large folios copy faster in
            // big reads than the mount's single pages.
            Access::CachedRead
        } else {
            Access::Read
        };
        let Some(id) = self.passthrough.open(node, map, access) else {
            // Served here, from the page cache: a reader keeps the pages of
            // earlier opens while the file is unchanged.
            if access == Access::CachedRead
                && self.passthrough.is_active()
                && out.open_flags & abi::FOPEN_DIRECT_IO == 0
            {
                // A whole map's file holds the file's bytes, so its size
                // and times (read by the map's check above) tell changed
                // data as the file system's attributes would.
                let keep = match &backing_stat {
                    Some(st) => self.passthrough.keeps_cache(node, &Attr::from_stat(st)),
                    None => fs
                        .getattr(req, node, Some(opened.fh))
                        .is_ok_and(|a| self.passthrough.keeps_cache(node, &a)),
                };
                if keep {
                    out.open_flags |= abi::FOPEN_KEEP_CACHE;
                }
            }
            return Ok(out);
        };
        if setid_writer {
            // Another open already passes this inode through, so the
            // writes of this one will never reach the daemon: clear
            // the bits now, at open rather than at the first write.
            let kill = SetAttr {
                fh: Some(opened.fh),
                kill_suidgid: true,
                ..SetAttr::default()
            };
            if let Err(e) = fs.setattr(req, node, &kill) {
                tracing::warn!(
                    "{}: clearing set-id bits of node {} at a passthrough open: {e}",
                    self.fs_name(),
                    node.0
                );
            }
        }
        out.open_flags = Passthrough::open_flags(out.open_flags);
        out.backing_id = id;
        Ok(out)
    }

    /// Whether this open, if passed through, would let a writer without
    /// CAP_FSETID (taken as: not root) modify a set-user-ID or set-group-ID
    /// file without clearing those bits. Kernel passthrough writes with
    /// the credentials that registered the backing file (the daemon's,
    /// which hold CAP_FSETID), so the backing file system keeps the bits
    /// that a native write by this user would clear. Only asked under
    /// passthrough, for writers other than root.
    fn setid_writer(&self, fs: &dyn Filesystem, req: &Request, node: NodeId, opened: &Opened, flags: u32) -> bool {
        let writes = flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
        if !writes || req.uid == 0 || !self.passthrough.is_active() {
            return false;
        }
        if opened.data_map.as_ref().and_then(DataMap::as_whole).is_none() {
            return false;
        }
        fs.getattr(req, node, Some(opened.fh))
            .is_ok_and(|a| a.mode & libc::S_IFMT == libc::S_IFREG && req.setid_bits_to_clear(a.mode, a.gid) != 0)
    }

    /// How log lines name the file system: `fsname`, else `subtype`.
    fn fs_name(&self) -> &str {
        self.opts
            .fsname
            .as_deref()
            .or(self.opts.subtype.as_deref())
            .unwrap_or("file system")
    }

    #[allow(clippy::too_many_arguments)]
    fn setlk(
        &self,
        fs: &dyn Filesystem,
        req: &Request,
        node: NodeId,
        arg: &abi::fuse_lk_in,
        sleep: bool,
        reply: &mut Vec<u8>,
        unique: u64,
    ) -> Served {
        let fh = FileHandle(arg.fh);
        if arg.lk_flags & abi::FUSE_LK_FLOCK != 0 {
            let kind = match LockType::from_raw(arg.lk.typ as i32) {
                Some(LockType::Read) => FlockKind::Shared,
                Some(LockType::Write) => FlockKind::Exclusive,
                Some(LockType::Unlock) => FlockKind::Unlock,
                None => return Err(Errno::EINVAL),
            };
            fs.flock(req, node, fh, arg.owner, FlockOp { kind, wait: sleep })?;
        } else {
            fs.setlk(req, node, fh, arg.owner, &Lock::try_from(&arg.lk)?, sleep)?;
        }
        ok(reply, unique)
    }
}

fn write_args(arg: &abi::fuse_write_in) -> WriteArgs {
    WriteArgs {
        offset: arg.offset,
        write_flags: arg.write_flags,
        flags: OpenFlags::from_raw(arg.flags as i32),
        lock_owner: (arg.write_flags & abi::FUSE_WRITE_LOCKOWNER != 0).then_some(arg.lock_owner),
    }
}

fn ok(reply: &mut Vec<u8>, unique: u64) -> Served {
    reply_ok(reply, unique);
    Ok(Outcome::Reply)
}

/// READ/READDIR sizes beyond what INIT agreed on are refused rather than
/// allocated: a garbled size must not make the daemon reserve gigabytes.
fn checked_size(size: u32, n: &Negotiated) -> Result<usize> {
    let size = size as usize;
    if size > n.max_io() {
        return Err(Errno::EINVAL);
    }
    Ok(size)
}

/// The reply of GETXATTR/LISTXATTR: the size for a probe (`size == 0`),
/// ERANGE when the caller's buffer is too small, the bytes otherwise.
fn xattr_reply(reply: &mut Vec<u8>, unique: u64, size: u32, value: &[u8]) -> Served {
    if size == 0 {
        let out = abi::fuse_getxattr_out {
            size: u32::try_from(value.len()).map_err(|_| Errno::E2BIG)?,
            padding: 0,
        };
        reply_struct(reply, unique, &out);
    } else if value.len() > size as usize {
        return Err(Errno::ERANGE);
    } else {
        reply_bytes(reply, unique, value);
    }
    Ok(Outcome::Reply)
}

fn copy_range(node: NodeId, arg: &abi::fuse_copy_file_range_in) -> CopyRange {
    CopyRange {
        node_in: node,
        fh_in: FileHandle(arg.fh_in),
        off_in: arg.off_in,
        node_out: NodeId(arg.nodeid_out),
        fh_out: FileHandle(arg.fh_out),
        off_out: arg.off_out,
        len: arg.len,
        flags: arg.flags,
    }
}

/// `SetAttr` from the `FATTR_*` bits of `fuse_setattr_in.valid`.
fn set_attr(arg: &abi::fuse_setattr_in) -> SetAttr {
    let v = arg.valid;
    let has = |bit: u32| v & bit != 0;
    let time = |set: u32, now: u32, sec: u64, nsec: u32| {
        if has(now) {
            Some(SetTime::Now)
        } else if has(set) {
            Some(SetTime::At(Timestamp { sec: sec as i64, nsec }))
        } else {
            None
        }
    };
    SetAttr {
        mode: has(abi::FATTR_MODE).then_some(arg.mode),
        uid: has(abi::FATTR_UID).then_some(arg.uid),
        gid: has(abi::FATTR_GID).then_some(arg.gid),
        size: has(abi::FATTR_SIZE).then_some(arg.size),
        atime: time(abi::FATTR_ATIME, abi::FATTR_ATIME_NOW, arg.atime, arg.atimensec),
        mtime: time(abi::FATTR_MTIME, abi::FATTR_MTIME_NOW, arg.mtime, arg.mtimensec),
        ctime: has(abi::FATTR_CTIME).then_some(Timestamp {
            sec: arg.ctime as i64,
            nsec: arg.ctimensec,
        }),
        fh: has(abi::FATTR_FH).then_some(FileHandle(arg.fh)),
        kill_suidgid: has(abi::FATTR_KILL_SUIDGID),
    }
}

/// The tracing target of `-o debug`: each request and its reply, one line
/// each, as libfuse's `-d` prints them.
pub const REQUESTS: &str = "shortfuse::requests";

fn log_request(h: &abi::fuse_in_header, len: usize) {
    tracing::debug!(
        target: REQUESTS,
        "unique: {}, opcode: {} ({}), nodeid: {}, insize: {len}, pid: {}",
        h.unique,
        abi::opcode_name(h.opcode),
        h.opcode,
        h.nodeid,
        h.pid
    );
}

fn log_reply(unique: u64, outcome: &Outcome, reply: &[u8]) {
    if *outcome == Outcome::Deferred {
        tracing::debug!(target: REQUESTS, "   unique: {unique}, answered later");
        return;
    }
    if !matches!(outcome, Outcome::Reply | Outcome::Destroy) || reply.len() < 16 {
        tracing::debug!(target: REQUESTS, "   unique: {unique}, no reply");
        return;
    }
    let error = i32::from_ne_bytes([reply[4], reply[5], reply[6], reply[7]]);
    if error == 0 {
        tracing::debug!(target: REQUESTS, "   unique: {unique}, success, outsize: {}", reply.len());
    } else {
        tracing::debug!(
            target: REQUESTS,
            "   unique: {unique}, error: {error} ({}), outsize: {}",
            std::io::Error::from_raw_os_error(-error).to_string().split(" (os error").next().unwrap_or(""),
            reply.len()
        );
    }
}
