//! Calls that go to the kernel unchanged, told apart before anything is
//! done to serve them: data calls on a kernel descriptor of a backing file
//! (see `kernel`), and calls on a descriptor that is not ours at all (a
//! pipe's read, an anonymous mmap, a write to the terminal). The serving
//! path blocks asynchronous signals around every call it looks at (two
//! rt_sigprocmask calls, once the program has a handler); these need not
//! be looked at, so they need not be blocked either.
//!
//! The test is lock-free (the descriptor table's bitmaps): a handler that
//! interrupts it finds no lock of ours held. What it answers must be what
//! [`super::dispatch`] would: `None`.

use shortfuse_vfs::Held;

use super::table::{Call, Direction};
use crate::state;

/// Whether call `nr` with arguments `a` would reach the kernel unchanged
/// (`dispatch` would answer `None`). `false` when unsure.
pub fn straight_to_kernel(nr: i64, a: [i64; 6]) -> bool {
    // A FUSE daemon's own calls on /dev/fuse are looked at first.
    if crate::daemon::on() {
        return false;
    }
    let Some(call) = Call::decode(nr, a) else {
        return true;
    };
    // Reads pass on both; writes on a kernel descriptor drop cached
    // attributes after the kernel ran them, so only those on descriptors
    // not ours pass.
    let (fd, reads) = match call {
        Call::Read { fd, .. }
        | Call::Pread { fd, .. }
        | Call::Lseek { fd, .. }
        | Call::Fsync { fd, .. }
        | Call::Advise { fd }
        | Call::Ioctl { fd }
        | Call::Getdents { fd, .. }
        | Call::Mmap { fd, .. } => (fd, true),
        Call::Vectored { fd, dir, .. } => (fd, dir == Direction::Read),
        Call::Write { fd, .. } | Call::Pwrite { fd, .. } => (fd, false),
        _ => return false,
    };
    match state().fds.quick(fd.0) {
        Some(Held::NotOurs) => true,
        Some(Held::KernelBacked) => reads,
        Some(Held::Ours) | None => false,
    }
}
