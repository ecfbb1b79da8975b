//! Open file descriptions shared between processes, for files of a shared
//! daemon (`shortfuse serve`, reached over the rings).
//!
//! Such a file has no backing file the kernel could keep a description of
//! (see `kernel`), so the descriptor the program gets is a memfd made for
//! this open alone: a kernel open file description that stands for ours.
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
//! The memfd is empty and sealed: a program without the shim that
//! inherits it reads nothing and fails to write (EPERM).
//!
//! Mounts served in process keep descriptors of their own image: a `mem`
//! mount's data is private to each image, and an image of a `stripe` or
//! `pack` mount does not see what another changed (not even a file it just
//! created), so there is nothing the new image could open again.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use shortfuse::{FileType, NodeId};
use shortfuse_vfs::{FdTable, OpenFile, Vfs};

use super::{with_nul, OWN_FD_FLOOR};
use crate::sys::{owned_file, raw};

/// The memfd name prefix of a description.
const PREFIX: &[u8] = b"sfofd:";

/// Whether opens of `f` get a shared description.
pub fn wanted(f: &OpenFile, flags: i32) -> bool {
    flags & libc::O_PATH == 0 && f.file_type() == FileType::Regular && f.handle().is_some() && f.vfs().client().shared()
}

/// Makes the shared description of `f` (see the module doc): returns the
/// program's descriptor (the lowest free number, as open gives), or a
/// negated errno (the caller then falls back to a private placeholder).
pub fn create(f: &OpenFile, cloexec: bool) -> i64 {
    let Some(fh) = f.handle() else {
        return -i64::from(libc::EINVAL);
    };
    let mp = mount_hash(f.vfs().mountpoint());
    let name = with_nul(format!("sfofd:{mp:016x}:{}:{fh}:{}", f.node().0, f.flags()).into_bytes());
    let mut mflags = libc::MFD_ALLOW_SEALING;
    if cloexec {
        mflags |= libc::MFD_CLOEXEC;
    }
    let fd = raw(
        libc::SYS_memfd_create,
        name.as_ptr() as i64,
        i64::from(mflags),
        0,
        0,
        0,
        0,
    );
    if fd < 0 {
        return fd;
    }
    let fail = |e: i64| {
        raw(libc::SYS_close, fd, 0, 0, 0, 0, 0);
        e
    };
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    raw(
        libc::SYS_fcntl,
        fd,
        i64::from(libc::F_ADD_SEALS),
        i64::from(seals),
        0,
        0,
        0,
    );
    let own = raw(
        libc::SYS_fcntl,
        fd,
        i64::from(libc::F_DUPFD_CLOEXEC),
        OWN_FD_FLOOR,
        0,
        0,
        0,
    );
    if own < 0 {
        return fail(own);
    }
    f.share(owned_file(own));
    if let Some(s) = f.shared() {
        // On failure the handle stays the connection's (released by us, or
        // by the daemon when the connection ends): right within this
        // process image, not beyond it.
        let _ = f.anchor(s.as_fd());
    }
    fd
}

/// The lock owner of flock and OFD locks on `f`'s shared description (the
/// daemon computes the same from the memfd it was given).
pub fn description_owner(f: &OpenFile) -> Option<u64> {
    let s = f.shared()?;
    let mut st: libc::stat = crate::user::zeroed();
    let r = raw(
        libc::SYS_fstat,
        i64::from(s.as_raw_fd()),
        &mut st as *mut libc::stat as i64,
        0,
        0,
        0,
        0,
    );
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
}

/// Parses `sfofd:MOUNT:NODE:FH:FLAGS` (MOUNT in hex) from a memfd's magic
/// link target (`/memfd:NAME (deleted)`): (mount, node, fh, flags).
fn parse_name(link: &[u8]) -> Option<(u64, u64, u64, i32)> {
    let name = link.strip_prefix(b"/memfd:")?.strip_prefix(PREFIX)?;
    let name = name.strip_suffix(b" (deleted)").unwrap_or(name);
    let mut it = std::str::from_utf8(name).ok()?.split(':');
    let mount = u64::from_str_radix(it.next()?, 16).ok()?;
    let node = it.next()?.parse().ok()?;
    let fh = it.next()?.parse().ok()?;
    let flags = it.next()?.parse().ok()?;
    it.next().is_none().then_some((mount, node, fh, flags))
}

fn inspect(fd: i32) -> Option<Found> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let (mount, node, fh, flags) = parse_name(link.as_os_str().as_encoded_bytes())?;
    let mut st: libc::stat = crate::user::zeroed();
    let r = raw(
        libc::SYS_fstat,
        i64::from(fd),
        &mut st as *mut libc::stat as i64,
        0,
        0,
        0,
        0,
    );
    (r == 0).then_some(Found {
        fd,
        ino: st.st_ino,
        mount,
        node,
        fh,
        flags,
    })
}

/// Takes in the descriptors this image inherited from the one that exec'd
/// it (see the module doc): each becomes a descriptor of ours again, those
/// of one description sharing one open file.
pub fn adopt(mounts: &[Arc<Vfs>], fds: &FdTable) {
    // Only a daemon's files have descriptions to adopt: spare the others
    // the look at every descriptor.
    if !mounts.iter().any(|m| m.client().shared()) {
        return;
    }
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let mut found: Vec<Found> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(inspect)
        .collect();
    found.sort_by_key(|f| (f.ino, f.fd));
    let mut last: Option<(u64, Arc<OpenFile>)> = None;
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
                let own = raw(
                    libc::SYS_fcntl,
                    i64::from(d.fd),
                    i64::from(libc::F_DUPFD_CLOEXEC),
                    OWN_FD_FLOOR,
                    0,
                    0,
                    0,
                );
                if own < 0 {
                    continue;
                }
                let f = vfs.adopt(NodeId(d.node), d.fh, d.flags, Vec::new(), owned_file(own));
                last = Some((d.ino, f.clone()));
                f
            }
        };
        let fdflags = raw(libc::SYS_fcntl, i64::from(d.fd), i64::from(libc::F_GETFD), 0, 0, 0, 0);
        let cloexec = fdflags > 0 && fdflags & i64::from(libc::FD_CLOEXEC) != 0;
        fds.insert(d.fd, file, cloexec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_others_are_refused() {
        assert_eq!(
            parse_name(b"/memfd:sfofd:00000000000000ff:12:7:32769 (deleted)"),
            Some((255, 12, 7, 32769))
        );
        assert_eq!(parse_name(b"/memfd:sfofd:a:12:7:-1"), Some((10, 12, 7, -1)));
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
