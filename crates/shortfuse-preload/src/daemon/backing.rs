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
//!
//! A daemon that registers nothing but keeps its descriptor of the backing
//! file as the handle (bindfs) is lent the same way when `serve` was told
//! so (`--backing-handles`), for read-only opens alone: a ring client's
//! writes must still reach the daemon, after which `serve` tells the
//! kernel mount (whose page cache such a daemon does not bypass) what
//! changed.

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

/// Whether the daemon's handles are its descriptors of the backing files
/// (see the module doc).
fn handles_are_backing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(shortfuse_ring::foreign::BACKING_HANDLES_VAR).is_some_and(|v| v == "1"))
}

/// For a ring client's read-only OPEN (`req`) answered with `reply` (the
/// whole message, fixed up in place): when the daemon's handle is its
/// read-only descriptor of a regular file and `serve` was told its
/// handles are backing files, a copy of that descriptor to lend, the
/// reply then marked FOPEN_PASSTHROUGH as a registration would be (for
/// the ring client alone: the kernel never sees this reply).
pub(super) fn lent_by_handle(req: &[u8], reply: &mut [u8]) -> Option<i32> {
    const HEADER: usize = std::mem::size_of::<abi::fuse_in_header>();
    const OUT: usize = std::mem::size_of::<abi::fuse_out_header>();
    if !handles_are_backing() || reply.len() != OUT + std::mem::size_of::<abi::fuse_open_out>() {
        return None;
    }
    let h = abi::parse_header(req).ok()?;
    let flags = req.get(HEADER..HEADER + 4)?;
    let flags = i32::from_ne_bytes(flags.try_into().ok()?);
    if h.opcode != abi::FUSE_OPEN || flags & libc::O_ACCMODE != libc::O_RDONLY {
        return None;
    }
    let fh = u64::from_ne_bytes(reply[OUT..OUT + 8].try_into().ok()?);
    let fd = i32::try_from(fh)
        .ok()
        .filter(|&fd| fd >= 0 && i64::from(fd) < super::CHANNEL_FLOOR)?;
    // The daemon's own descriptor, as it opened it: reading, of a regular
    // file (a handle that is a table index fails here or names another
    // file, hence the declaration `serve` needs).
    let mut st: libc::stat = user::zeroed();
    let access = fs::fcntl_int(fd, libc::F_GETFL, 0);
    if access < 0
        || access as i32 & libc::O_ACCMODE != libc::O_RDONLY
        || fs::fstat(fd, &mut st) != 0
        || st.st_mode & libc::S_IFMT != libc::S_IFREG
    {
        return None;
    }
    let copy = fs::fcntl_int(fd, libc::F_DUPFD_CLOEXEC, super::CHANNEL_FLOOR);
    if copy < 0 {
        return None;
    }
    let open_flags = OUT + 8;
    let marked = u32::from_ne_bytes(reply[open_flags..open_flags + 4].try_into().ok()?) | abi::FOPEN_PASSTHROUGH;
    reply[open_flags..open_flags + 4].copy_from_slice(&marked.to_ne_bytes());
    Some(copy as i32)
}
