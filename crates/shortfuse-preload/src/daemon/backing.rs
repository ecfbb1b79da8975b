//! The daemon's kernel passthrough registrations, lent to the rings.
//!
//! A daemon that serves a file by kernel passthrough (libfuse's
//! `fuse_passthrough_open`, as in passthrough_hp) registers the backing
//! file with FUSE_DEV_IOC_BACKING_OPEN and answers OPEN with
//! FOPEN_PASSTHROUGH and the id the kernel gave. The registration still
//! goes to the kernel (its mount reads and writes through it), and we keep
//! a descriptor of the same file under that id: when the daemon answers a
//! ring client's OPEN or CREATE with that id, the reply carries the
//! descriptor to `shortfuse serve`, which lends it to the client, whose
//! reads and writes then go to the backing file as the kernel's do. The
//! open reply is what makes the pairing: no other message can race it.

use std::sync::Mutex;

use shortfuse::sync::Unpoison;
use shortfuse_abi as abi;

use crate::sys::fs;
use crate::user;

/// Backing id -> our descriptor of its file (above the daemon's numbers).
static REGISTERED: Mutex<Vec<(i32, i32)>> = Mutex::new(Vec::new());

/// ioctl `request` with `arg` on a /dev/fuse descriptor of the daemon,
/// made by `reissue`: the registrations are noted, everything else is the
/// kernel's alone (None).
pub(super) fn ioctl(request: u32, arg: i64, reissue: impl Fn() -> i64) -> Option<i64> {
    match request {
        abi::FUSE_DEV_IOC_BACKING_OPEN => {
            // SAFETY: the call's own argument, a plain C struct in the program's memory.
            let map = unsafe { user::get::<abi::fuse_backing_map>(arg) };
            let id = reissue();
            if let (Ok(map), Ok(id32)) = (map, i32::try_from(id)) {
                if id32 > 0 {
                    let ours = fs::fcntl_int(map.fd, libc::F_DUPFD_CLOEXEC, super::CHANNEL_FLOOR);
                    if ours >= 0 {
                        let mut t = REGISTERED.lock().unpoison();
                        // An id the kernel hands out again was closed meanwhile.
                        if let Some(old) = t.iter().position(|&(i, _)| i == id32) {
                            fs::close(t.swap_remove(old).1);
                        }
                        t.push((id32, ours as i32));
                    }
                }
            }
            Some(id)
        }
        abi::FUSE_DEV_IOC_BACKING_CLOSE => {
            // SAFETY: the call's own argument, a u32 in the program's memory.
            let id = unsafe { user::get::<u32>(arg) };
            let r = reissue();
            if let (0, Ok(id)) = (r, id) {
                let mut t = REGISTERED.lock().unpoison();
                if let Some(at) = t.iter().position(|&(i, _)| i as u32 == id) {
                    fs::close(t.swap_remove(at).1);
                }
            }
            Some(r)
        }
        _ => None,
    }
}

/// A descriptor of the backing file a ring reply names (a copy of ours,
/// for the caller to close once sent: another thread may close the id
/// meanwhile), when it is an
/// OPEN or CREATE reply with FOPEN_PASSTHROUGH and a registered id (by
/// its length and fields: a reply of another request that happened to
/// look like one only passes a descriptor `shortfuse serve` drops).
/// `peek(at, buf)` copies the reply's bytes at `at`.
pub(super) fn lent_by(total: usize, peek: impl Fn(usize, &mut [u8]) -> bool) -> Option<i32> {
    const HEADER: usize = std::mem::size_of::<abi::fuse_out_header>();
    const OPEN: usize = std::mem::size_of::<abi::fuse_open_out>();
    const ENTRY: usize = std::mem::size_of::<abi::fuse_entry_out>();
    let at = match total {
        t if t == HEADER + OPEN => HEADER,
        t if t == HEADER + ENTRY + OPEN => HEADER + ENTRY,
        _ => return None,
    };
    let mut o = [0u8; 16];
    // fuse_open_out: fh, open_flags, backing_id.
    if !peek(at, &mut o) {
        return None;
    }
    let flags = u32::from_ne_bytes([o[8], o[9], o[10], o[11]]);
    let id = i32::from_ne_bytes([o[12], o[13], o[14], o[15]]);
    if flags & abi::FOPEN_PASSTHROUGH == 0 || id <= 0 {
        return None;
    }
    let t = REGISTERED.lock().unpoison();
    let &(_, fd) = t.iter().find(|&&(i, _)| i == id)?;
    let copy = fs::fcntl_int(fd, libc::F_DUPFD_CLOEXEC, super::CHANNEL_FLOOR);
    (copy >= 0).then_some(copy as i32)
}
