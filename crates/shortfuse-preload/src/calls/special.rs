//! Opens of FIFOs, sockets and device nodes on a mount: kernel objects,
//! as on any file system.
//!
//! The kernel never sends OPEN for these to a FUSE daemon: it opens its own
//! pipe for a FIFO (the open waits for the other end, a non-blocking
//! writer without a reader gets ENXIO, readers see end of file when the
//! last writer closes), the driver for a device, and refuses a socket
//! (ENXIO). The shim does the same with a kernel node standing for the
//! mount's node, and the program's descriptor is a kernel descriptor of
//! it (reads, writes, poll, fcntl and exec are the kernel's; `fstat`
//! still reports the mount's node):
//!
//! - on a mount with a source directory (passthrough) the node's backing
//!   file itself, so that every process of the program, with the shim or
//!   without, meets in one FIFO;
//! - on a daemon's mount (`shortfuse serve`) a node the daemon makes, of
//!   the same type (and, for a root daemon, owner, group and mode), one per
//!   daemon and node, so that the programs of every `shortfuse run` on
//!   that daemon meet there, whatever user they run as: the daemon hands
//!   an O_PATH descriptor of it, which the program reopens through
//!   `/proc/self/fd` (the kernel then checks the caller's credentials on
//!   the node, not on the daemon's private directory holding it);
//! - on a mount served in process without a source (mem), such a node
//!   made, opened O_PATH and unlinked at first use: this image and its
//!   forked children (which share the file system) reopen it through
//!   `/proc/self/fd`, and nothing is left behind.
//!
//! A FIFO's open blocks until its peer comes: it runs with the program's
//! signal mask (see [`with_program_mask`]), so a signal interrupts or
//! restarts it as it would the kernel's open, and no lock of ours is held
//! meanwhile. No request reaches the daemon, so no daemon thread waits.
#![allow(unsafe_code)]

use shortfuse::sync::Unpoison;
use std::cell::Cell;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use shortfuse::{Attr, Errno, FileType, NodeId};
use shortfuse_vfs::{Target, Vfs};

use super::descriptors::OWN_FD_FLOOR;
use super::reply::err;
use super::resolve::with_nul;
use super::spare;
use crate::state;

use crate::sys::{fs, process};

/// Whether an open of a node of type `kind` is the kernel's (see the
/// module doc).
pub fn is_special(kind: FileType) -> bool {
    matches!(
        kind,
        FileType::Fifo | FileType::Socket | FileType::CharDevice | FileType::BlockDevice
    )
}

/// Opens special node `t` (found with `attr`) for the program with `flags`:
/// the descriptor, or a negated errno.
pub fn open(vfs: &Arc<Vfs>, t: &Target, node: NodeId, attr: &Attr, flags: i32) -> i64 {
    let kind = attr.file_type();
    if kind == FileType::Socket {
        // As the kernel: a socket is reached with connect(2), not open(2).
        return err(Errno::ENXIO);
    }
    let acc = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => libc::R_OK,
        libc::O_WRONLY => libc::W_OK,
        _ => libc::R_OK | libc::W_OK,
    };
    if let Err(e) = vfs.access(t, acc) {
        return err(e);
    }
    // The daemon's node, held while it is opened.
    let mut daemons = None;
    let path = if vfs.source().is_none() && vfs.client().shared() {
        match vfs.client().kernel_node(node) {
            Ok(fd) => {
                let p = proc_fd(fd.as_raw_fd() as i64);
                daemons = Some(fd);
                p
            }
            Err(e) => return err(e),
        }
    } else {
        match kernel_node(vfs, &t.path(), node, attr) {
            Ok(p) => p,
            Err(e) => return err(e),
        }
    };
    // Creation was the walk's; O_NOFOLLOW would refuse the magic link of
    // a node held open; a FIFO cannot be truncated.
    let keep = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_DIRECTORY);
    spare::flush();
    let fd = with_program_mask(|| fs::openat(libc::AT_FDCWD, &path, keep, 0));
    drop(daemons);
    if fd < 0 {
        return fd;
    }
    let f = vfs.open_in_kernel(node, kind, flags, t.path());
    state().fds.insert(fd as i32, f, flags & libc::O_CLOEXEC != 0);
    fd
}

/// The kernel path (NUL-terminated) of the node standing for mount node
/// `node` at `path` below the mount point, on a mount with a source or
/// served in process (see the module doc).
fn kernel_node(vfs: &Arc<Vfs>, path: &[u8], node: NodeId, attr: &Attr) -> Result<Vec<u8>, Errno> {
    if let Some(src) = vfs.source() {
        return Ok(super::exec::backing_path(src, path));
    }
    held_node(vfs, &nodes_dir()?, node, attr)
}

/// `/proc/self/fd/N`, NUL-terminated: the kernel file of descriptor `fd`.
fn proc_fd(fd: i64) -> Vec<u8> {
    with_nul(format!("/proc/self/fd/{fd}").into_bytes())
}

/// Makes a node of `attr`'s type at `p` (NUL-terminated), unless one of
/// that type is there.
fn make_node(p: &[u8], attr: &Attr) -> Result<(), Errno> {
    let mode = attr.mode & libc::S_IFMT | 0o666;
    let r = fs::mknodat(libc::AT_FDCWD, p, mode, attr.rdev);
    if r == 0 {
        // Access is checked against the mount's node (see `open`); the
        // umask must not narrow what the image may do after a setuid.
        fs::fchmodat(libc::AT_FDCWD, p, 0o666);
        return Ok(());
    }
    if r != -i64::from(libc::EEXIST) {
        return Err(Errno::from_raw(-r as i32));
    }
    let mut st: libc::stat = crate::user::zeroed();
    let s = fs::newfstatat(libc::AT_FDCWD, p, &mut st, libc::AT_SYMLINK_NOFOLLOW);
    let same = s == 0 && st.st_mode & libc::S_IFMT == attr.mode & libc::S_IFMT && st.st_rdev == u64::from(attr.rdev);
    if same {
        return Ok(());
    }
    // A node of a removed file whose number came back with another type.
    fs::unlinkat(libc::AT_FDCWD, p, 0);
    make_node(p, attr)
}

/// Nodes of in-process mounts, held open O_PATH (see the module doc), by
/// mount point and node.
type Held = HashMap<(Vec<u8>, u64), i64>;

fn held() -> &'static Mutex<Held> {
    static HELD: std::sync::OnceLock<Mutex<Held>> = std::sync::OnceLock::new();
    HELD.get_or_init(Default::default)
}

/// `/proc/self/fd/N` of the held node standing for `node` of an in-process
/// mount, made at first use.
fn held_node(vfs: &Vfs, dir: &[u8], node: NodeId, attr: &Attr) -> Result<Vec<u8>, Errno> {
    let mut table = held().lock().unpoison();
    let key = (vfs.mountpoint().to_vec(), node.0);
    let fd = match table.get(&key) {
        Some(&fd) => fd,
        None => {
            let pid = process::getpid();
            let mut p = dir.to_vec();
            p.extend_from_slice(format!("/held-{pid}-{}", node.0).as_bytes());
            let p = with_nul(p);
            make_node(&p, attr)?;
            let flags = i64::from(libc::O_PATH | libc::O_CLOEXEC);
            let o = fs::openat(libc::AT_FDCWD, &p, flags as i32, 0);
            fs::unlinkat(libc::AT_FDCWD, &p, 0);
            if o < 0 {
                return Err(Errno::from_raw(-o as i32));
            }
            let high = fs::fcntl_int(o as i32, libc::F_DUPFD_CLOEXEC, OWN_FD_FLOOR);
            let fd = if high >= 0 {
                fs::close(o as i32);
                high
            } else {
                o
            };
            table.insert(key, fd);
            fd
        }
    };
    Ok(proc_fd(fd))
}

/// The directory where the nodes of in-process mounts are made (each
/// unlinked at once), in the user's runtime directory, created if missing.
fn nodes_dir() -> Result<Vec<u8>, Errno> {
    let base = shortfuse::control::runtime_dir().map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    let mut dir = base.into_os_string().into_encoded_bytes();
    dir.extend_from_slice(b"/in-process-nodes");
    let c = with_nul(dir.clone());
    let r = fs::mkdirat(libc::AT_FDCWD, &c, 0o700);
    if r < 0 && r != -i64::from(libc::EEXIST) {
        return Err(Errno::from_raw(-r as i32));
    }
    Ok(dir)
}

thread_local! {
    /// The program's signal mask while this thread serves one of its
    /// calls with asynchronous signals blocked (see `crate::serve`).
    static PROGRAM_MASK: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Records the program's signal mask for the call this thread serves
/// (`None`: the mask was left as the program had it).
pub fn set_program_mask(m: Option<u64>) {
    PROGRAM_MASK.with(|c| c.set(m));
}

/// The program's signal mask recorded for the call this thread serves.
pub fn program_mask() -> Option<u64> {
    PROGRAM_MASK.with(Cell::get)
}

/// Runs `f` (a system call that may wait for another process) with the
/// program's signal mask, so that a signal stops or restarts the wait as
/// it would natively.
fn with_program_mask(f: impl FnOnce() -> i64) -> i64 {
    let Some(program) = PROGRAM_MASK.with(Cell::get) else {
        return f();
    };
    let set = program & !crate::sud::SIGSYS_BIT;
    let mut ours = 0u64;
    process::set_signal_mask(set, Some(&mut ours));
    let r = f();
    process::set_signal_mask(ours, None);
    r
}
