//! Open file descriptions shared between processes, for files of a shared
//! daemon (`shortfuse serve`, reached over the rings).
//!
//! Such a file has no backing file the kernel could keep a description of
//! (see `kernel`), so its descriptors become a memfd made for this open
//! alone (when the description may leave the process, see below): a kernel
//! open file description that stands for ours.
//! The kernel then does for it what it does for any description:
//!
//! - its file offset is the file's offset (the shim reads and moves it
//!   around each read, write and lseek), shared by dup, by fork between
//!   parent and child, and by the images that exec inherits it;
//! - descriptors without FD_CLOEXEC survive exec, the others close;
//! - its memfd name says what it is open on (mount point, node, handle,
//!   status flags): a new image adopts the inherited
//!   descriptors at start-up ([`adopt`]), from the descriptors themselves,
//!   so it needs nothing in its environment and follows a descriptor
//!   however it was moved (dup2 in a posix_spawn child, passed over a Unix
//!   socket);
//! - the daemon, handed the memfd with the handle (`Backend::anchor`),
//!   releases the handle (and the description's flock and OFD locks) when
//!   the kernel drops the description: the last descriptor closed, in
//!   whichever process, however it ended.
//!
//! Handing the memfd over costs more than the rest of an empty create (a
//! message with a descriptor to a daemon thread that must be woken, then
//! an inotify watch): about 30 µs. Making the memfd (memfd_create, seals,
//! a copy of our own, the closes) costs as much as the ring round trips of
//! the open. Neither matters while the description stays in this process,
//! so both wait until it can reach another ([`anchor_all`], [`sent`]):
//!
//! - until then the program's descriptors are placeholders (as a
//!   directory's), the offset is the open file's own (shared by dup,
//!   which shares the open file), and the handle is this process's,
//!   released by our close or, if the process ends first, by the daemon
//!   (which watches the processes of its connections);
//! - then [`describe`] makes the memfd at the current offset and puts it in
//!   place of every descriptor of the description at once (dup3 keeps the
//!   number and its FD_CLOEXEC; [`descriptors`] keeps the calls that change
//!   descriptor numbers in the kernel before our table out of the way),
//!   and the handle goes to the daemon with it.
//!
//! A description reaches another process only through
//!
//! - a new process (fork, vfork, clone without CLONE_FILES): every
//!   description is made and given before the call ([`before_clone`]);
//!   one opened by another thread while the call runs does so itself
//!   ([`settle`]);
//! - exec: every description is made and given first (the new image adopts
//!   those that survive, and the kernel's close of the others must reach
//!   the daemon even while a process forked earlier keeps the connection);
//! - a descriptor passed over a Unix socket (sendmsg, sendmmsg);
//! - flock and OFD locks, which live as long as the description.
//!
//! Not followed: pidfd_getfd by another process, which takes a descriptor
//! without our part (the daemon may then release the handle under it when
//! this process ends).
//!
//! The memfd is empty and sealed: a program without the shim that
//! inherits it reads nothing and fails to write (EPERM).
//!
//! Mounts served in process keep descriptors of their own image: a `mem`
//! mount's data is private to each image, and an image of a `stripe` or
//! `pack` mount does not see what another changed (not even a file it just
//! created), so there is nothing the new image could open again.
#![allow(unsafe_code)]

use shortfuse::sync::Unpoison;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use shortfuse::{FileType, NodeId};
use shortfuse_vfs::{Anchor, FdTable, OpenFile, Vfs};

use super::descriptors::OWN_FD_FLOOR;
use super::table::Call;
use crate::sys::{fs, owned_file, raw};

/// The memfd name prefix of a description.
const PREFIX: &[u8] = b"sfofd:";

/// Whether opens of `f` get a shared description.
pub fn wanted(f: &OpenFile, flags: i32) -> bool {
    flags & libc::O_PATH == 0 && f.file_type() == FileType::Regular && f.handle().is_some() && f.vfs().client().shared()
}

/// Whether `f` stands for a shared description not made yet: its
/// descriptors are placeholders, its offset is ours alone (see the module
/// doc).
pub fn pending(f: &OpenFile) -> bool {
    f.shared().is_none() && !f.kernel_backed() && wanted(f, f.flags())
}

/// Serialises the swaps of [`describe`] with the calls that give a
/// descriptor number to one of our open files, or take one from it, in the
/// kernel before the table (dup, dup2, dup3, F_DUPFD, F_SETFD,
/// close_range): a swap then sees every descriptor of a description, with
/// its FD_CLOEXEC as the kernel has it, and never one the program has
/// since closed or reused. `close` needs none: it leaves the table first.
pub fn descriptors() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unpoison()
}

/// Makes the shared descriptions of those `files` still [`pending`]: a
/// sealed memfd each, named after what it is open on, at the open file's
/// offset, which then replaces each descriptor of it in place (dup3, with
/// the descriptor's FD_CLOEXEC). A file whose memfd cannot be made (no
/// descriptor left) stays pending: its handle stays this process's.
/// Allocates nothing (see [`anchor_all`]).
pub fn describe<'a>(files: impl Iterator<Item = &'a Arc<OpenFile>> + Clone) {
    if !files.clone().any(|f| pending(f)) {
        return;
    }
    let st = crate::state();
    let _swapping = descriptors();
    for f in files {
        if !pending(f) {
            continue;
        }
        let Ok(own) = memfd(f) else { continue };
        st.fds.each_descriptor_of(f, |fd, cloexec| {
            let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
            fs::dup3(own as i32, fd, flags);
        });
        f.share(owned_file(own));
    }
}

/// A new sealed memfd for `f` (see the module doc), above
/// [`OWN_FD_FLOOR`] and close-on-exec.
fn memfd(f: &OpenFile) -> Result<i64, i64> {
    let fh = f.handle().ok_or(-i64::from(libc::EINVAL))?;
    let mp = mount_hash(f.vfs().mountpoint());
    // Written on the stack (see `anchor_all`); the rest stays NUL. The
    // kernel takes 249 bytes of a memfd's name.
    let mut name = [0u8; 250];
    let mut w = &mut name[..249];
    std::io::Write::write_fmt(
        &mut w,
        format_args!("sfofd:{mp:016x}:{}:{fh}:{}", f.node().0, f.flags()),
    )
    .map_err(|_| -i64::from(libc::ENAMETOOLONG))?;
    // Then the path it was opened by, when it fits: what /proc/self/fd
    // names in the image that adopts it.
    let path = f.path();
    if w.len() > path.len() && !path.contains(&0) {
        w[0] = b':';
        w[1..=path.len()].copy_from_slice(path);
    }
    let mflags = libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC;
    // SAFETY: a NUL-terminated name of ours.
    let fd = unsafe {
        raw(
            libc::SYS_memfd_create,
            name.as_ptr() as i64,
            i64::from(mflags),
            0,
            0,
            0,
            0,
        )
    };
    if fd < 0 {
        return Err(fd);
    }
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    fs::fcntl_int(fd as i32, libc::F_ADD_SEALS, i64::from(seals));
    let own = fs::fcntl_int(fd as i32, libc::F_DUPFD_CLOEXEC, OWN_FD_FLOOR);
    fs::close(fd as i32);
    if own < 0 {
        return Err(own);
    }
    Ok(own)
}

/// The clone clock before an open makes its descriptor: see [`settle`].
pub fn clock() -> u64 {
    crate::sys::cfg().clones.load(Ordering::SeqCst)
}

/// After an open made the descriptor of `f` and put it in the table:
/// makes the description and gives it the handle at once if a new process
/// may copy the descriptor without [`before_clone`] seeing it (made while
/// a clone ran, or a clone started since `before`, the [`clock`] read
/// before the descriptor was made). The fork gate (`crate::fork_gate`)
/// holds that clone back until this call has returned.
pub fn settle(f: &Arc<OpenFile>, before: u64) {
    let running = before & CLONES_RUNNING;
    if running != 0 || clock() != before {
        describe(std::iter::once(f));
        anchor(std::iter::once(&**f));
    }
}

/// Bits of the clone clock that count the clone calls running (the rest
/// counts those started).
const CLONES_RUNNING: u64 = 0xffff_ffff;

/// Before a clone-family call (`nr`, clone's `flags`): the clock moved
/// (see [`settle`]); unless the child is a thread sharing our memory and
/// descriptors, every description is made and given to the daemon, if
/// files were opened since that was last done.
///
/// libc's fork does that in its prepare handler already (`crate::serve`
/// registers it), where the work is safe: at the system call, a program
/// with threads has the allocator's locks taken by libc, so another
/// thread holding one of our locks (an offset, the descriptor table)
/// while it waits for the allocator would wait for us forever.
pub fn before_clone(nr: i64, flags: i64) {
    if new_process(nr, flags) && OPENED.load(Ordering::SeqCst) != GIVEN.load(Ordering::SeqCst) {
        anchor_all();
    }
}

/// Opens of files with a description to make ([`opened`]), and how many
/// of them [`anchor_all`] took care of (they were in the table when it
/// began).
static OPENED: AtomicU64 = AtomicU64::new(0);
static GIVEN: AtomicU64 = AtomicU64::new(0);

/// An open made a [`pending`] file and put its descriptor in the table.
pub fn opened() {
    OPENED.fetch_add(1, Ordering::SeqCst);
}

/// Whether clone-family call `nr` (clone's `flags`) makes a child that
/// could close or keep our descriptions behind our back: anything but a
/// thread sharing our memory and descriptor table.
pub fn new_process(nr: i64, flags: i64) -> bool {
    let thread = (libc::CLONE_VM | libc::CLONE_FILES) as i64;
    nr != libc::SYS_clone || flags & thread != thread
}

/// sendmsg and sendmmsg.
pub fn sends(nr: i64) -> bool {
    matches!(nr, libc::SYS_sendmsg | libc::SYS_sendmmsg)
}

/// Whether a sendmsg or sendmmsg passes descriptors (SCM_RIGHTS).
pub fn passes_descriptors(c: &Call) -> bool {
    let mut fds = Vec::new();
    passed(c, &mut fds);
    !fds.is_empty()
}

/// The descriptors a sendmsg or sendmmsg passes.
fn passed(c: &Call, fds: &mut Vec<i32>) {
    let Call::Send { msgs, vlen } = *c else {
        return;
    };
    if msgs.is_null() {
        return;
    }
    let Some(vlen) = vlen else {
        // A bad message passes nothing: the kernel fails the call.
        // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
        if let Ok(m) = unsafe { crate::user::get::<libc::msghdr>(msgs.0) } {
            crate::user::passed_fds(&m, fds);
        }
        return;
    };
    let n = (vlen as usize).min(libc::UIO_MAXIOV as usize);
    for i in 0..n {
        let at = msgs.0 + (i * std::mem::size_of::<libc::mmsghdr>()) as i64;
        // SAFETY: a pointer argument of the call, into the program's memory, to a plain C type.
        let Ok(m) = (unsafe { crate::user::get::<libc::mmsghdr>(at) }) else {
            return;
        };
        crate::user::passed_fds(&m.msg_hdr, fds);
    }
}

/// Gives every description of this process to the daemon (see the module
/// doc).
///
/// Allocates nothing: at a fork's system call (see [`before_clone`]) libc
/// may hold the allocator's locks. So the files go by batches on the
/// stack, until a batch changes nothing (what is left failed).
pub fn anchor_all() {
    let upto = OPENED.load(Ordering::SeqCst);
    by_batches(pending, |b| describe(b.iter().flatten()));
    by_batches(OpenFile::unanchored, |b| anchor(b.iter().flatten().map(|f| &**f)));
    GIVEN.fetch_max(upto, Ordering::SeqCst);
}

/// Runs `act` on the files of the table for which `pick` holds, a stack
/// batch at a time, until none is left or a batch changes nothing.
fn by_batches(pick: fn(&OpenFile) -> bool, act: impl Fn(&[Option<Arc<OpenFile>>])) {
    let fds = &crate::state().fds;
    let mut batch: [Option<Arc<OpenFile>>; 32] = Default::default();
    loop {
        batch.fill(None);
        let n = fds.files_where(pick, &mut batch);
        if n == 0 {
            break;
        }
        act(&batch[..n]);
        if batch[..n].iter().flatten().all(|f| pick(f)) {
            // Those left failed.
            break;
        }
    }
}

/// Gives the descriptions among the descriptors a sendmsg or sendmmsg
/// passes (SCM_RIGHTS) to the daemon; the call itself goes on to the kernel.
pub fn sent(c: &Call) {
    let mut fds = Vec::new();
    passed(c, &mut fds);
    let st = crate::state();
    let files: Vec<Arc<OpenFile>> = fds.into_iter().filter_map(|fd| st.fds.get(fd)).collect();
    describe(files.iter());
    anchor(files.iter().map(|f| &**f));
}

/// A descriptor of a shared description of `f`, for a process that is not
/// to keep `f` in its table (a vfork child's open, see `spawn`): the
/// description is made and its handle given to the daemon at once, so
/// that the image the child execs adopts it (it is never this process's
/// to release). The lowest free descriptor, close-on-exec when `cloexec`;
/// or a negated errno, and then `f` releases its handle as usual.
pub fn hand_out(f: &OpenFile, cloexec: bool) -> i64 {
    let own = match memfd(f) {
        Ok(own) => own,
        Err(e) => return e,
    };
    f.share(owned_file(own));
    if shortfuse_vfs::anchor_files(std::iter::once(f)).is_err() || !f.anchored() {
        return -i64::from(libc::EIO);
    }
    let cmd = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
    fs::fcntl_int(own as i32, cmd, 0)
}

fn anchor<'a>(files: impl Iterator<Item = &'a OpenFile> + Clone) {
    // On failure (the daemon is gone or stuck) the handles stay this
    // process's: right within it, not beyond it.
    let _ = shortfuse_vfs::anchor_files(files);
}

/// The lock owner of flock and OFD locks on `f`'s shared description (the
/// daemon computes the same from the memfd it was given). Those locks live
/// as long as the description, which only the daemon follows: it is given
/// its handle first.
pub fn description_owner(f: &Arc<OpenFile>) -> Option<u64> {
    describe(std::iter::once(f));
    let s = f.shared()?;
    anchor(std::iter::once(&**f));
    let mut st: libc::stat = crate::user::zeroed();
    let r = fs::fstat(s.as_raw_fd(), &mut st);
    (r == 0).then_some(shortfuse_ring::DESCRIPTION_OWNER | st.st_ino)
}

/// The mount point as a description's name carries it (FNV-1a): names are
/// short, and the memfd stays empty, so that a program without the shim
/// that inherits one reads nothing (and cannot write: it is sealed).
fn mount_hash(mountpoint: &[u8]) -> u64 {
    mountpoint.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// What an inherited description says of itself.
#[derive(Debug, PartialEq, Eq)]
struct Found {
    fd: i32,
    ino: u64,
    mount: u64,
    node: u64,
    fh: u64,
    flags: i32,
    path: Vec<u8>,
}

/// Parses `sfofd:MOUNT:NODE:FH:FLAGS[:PATH]` (MOUNT in hex) from a
/// memfd's magic link target (`/memfd:NAME (deleted)`): (mount, node, fh,
/// flags, path, empty when the name had no room for it).
fn parse_name(link: &[u8]) -> Option<(u64, u64, u64, i32, Vec<u8>)> {
    let name = link.strip_prefix(b"/memfd:")?.strip_prefix(PREFIX)?;
    let name = name.strip_suffix(b" (deleted)").unwrap_or(name);
    let mut it = name.splitn(5, |&b| b == b':');
    let mut num = || std::str::from_utf8(it.next()?).ok().map(str::to_owned);
    let mount = u64::from_str_radix(&num()?, 16).ok()?;
    let node = num()?.parse().ok()?;
    let fh = num()?.parse().ok()?;
    let flags = num()?.parse().ok()?;
    let path = match it.next() {
        None => Vec::new(),
        Some(p) if p.starts_with(b"/") => p.to_vec(),
        Some(_) => return None,
    };
    Some((mount, node, fh, flags, path))
}

fn inspect(fd: i32, link: &[u8]) -> Option<Found> {
    let (mount, node, fh, flags, path) = parse_name(link)?;
    let mut st: libc::stat = crate::user::zeroed();
    let r = fs::fstat(fd, &mut st);
    (r == 0).then_some(Found {
        fd,
        ino: st.st_ino,
        mount,
        node,
        fh,
        flags,
        path,
    })
}

/// Takes in the descriptors this image inherited from the one that exec'd
/// it (see the module doc): each becomes a descriptor of ours again, those
/// of one description sharing one open file.
pub fn adopt(mounts: &[Arc<Vfs>], fds: &FdTable, inherited: &[(i32, Vec<u8>)]) {
    let mut found: Vec<Found> = inherited.iter().filter_map(|(fd, link)| inspect(*fd, link)).collect();
    found.sort_by_key(|f| (f.ino, f.fd));
    let mut last: Option<(u64, Arc<OpenFile>)> = None;
    // One descriptor of each description, by mount, for the daemon.
    let mut claims: Vec<(&Arc<Vfs>, Anchor<'_>)> = Vec::new();
    for d in found {
        let file = match &last {
            Some((ino, f)) if *ino == d.ino => f.clone(),
            _ => {
                let Some(vfs) = mounts
                    .iter()
                    .find(|m| mount_hash(m.mountpoint()) == d.mount && m.client().shared())
                else {
                    continue;
                };
                let own = fs::fcntl_int(d.fd, libc::F_DUPFD_CLOEXEC, OWN_FD_FLOOR);
                if own < 0 {
                    continue;
                }
                let f = vfs.adopt(NodeId(d.node), d.fh, d.flags, d.path, owned_file(own));
                claims.push((
                    vfs,
                    Anchor {
                        node: NodeId(d.node),
                        fh: d.fh,
                        dir: d.flags & libc::O_DIRECTORY != 0,
                        // SAFETY: the program's descriptor, open until
                        // the claims below have gone.
                        description: unsafe { std::os::fd::BorrowedFd::borrow_raw(d.fd) },
                    },
                ));
                last = Some((d.ino, f.clone()));
                f
            }
        };
        let fdflags = fs::fcntl_int(d.fd, libc::F_GETFD, 0);
        let cloexec = fdflags > 0 && fdflags & i64::from(libc::FD_CLOEXEC) != 0;
        fds.insert(d.fd, file, cloexec);
    }
    // The daemon lets this image name the nodes of the descriptions it
    // shows it holds (a node id alone proves nothing).
    for vfs in mounts {
        let mine: Vec<Anchor<'_>> = claims
            .iter()
            .filter(|(v, _)| Arc::ptr_eq(v, vfs))
            .map(|(_, a)| *a)
            .collect();
        // On failure (the daemon is gone or stuck) the daemon answers
        // ESTALE for those nodes: refused, never served to the wrong one.
        let _ = vfs.client().claim(&mine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_others_are_refused() {
        assert_eq!(
            parse_name(b"/memfd:sfofd:00000000000000ff:12:7:32769 (deleted)"),
            Some((255, 12, 7, 32769, Vec::new()))
        );
        assert_eq!(parse_name(b"/memfd:sfofd:a:12:7:-1"), Some((10, 12, 7, -1, Vec::new())));
        assert_eq!(
            parse_name(b"/memfd:sfofd:a:12:7:1:/d/a:b c (deleted)"),
            Some((10, 12, 7, 1, b"/d/a:b c".to_vec()))
        );
        for other in [
            &b"/memfd:shortfuse-placeholder (deleted)"[..],
            b"/memfd:sfofd:1:12:7 (deleted)",
            b"/memfd:sfofd:1:12:7:1:9 (deleted)",
            b"/memfd:sfofd:x:1:7:1 (deleted)",
            b"/tmp/sfofd:1:2:3:4",
        ] {
            assert_eq!(parse_name(other), None, "{}", String::from_utf8_lossy(other));
        }
        assert_ne!(mount_hash(b"/mnt/a"), mount_hash(b"/mnt/b"));
    }
}
