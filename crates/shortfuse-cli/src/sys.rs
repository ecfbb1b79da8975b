//! Process plumbing for going into the background: fork, setsid, and
//! pointing the standard streams at /dev/null.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

pub enum Forked {
    Parent,
    Child,
}

/// fork(2). Call only while the process has one thread: the child gets
/// copies of locks other threads might hold.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: the caller guarantees a single-threaded process, so the child
    // starts from a consistent state.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        _ => Ok(Forked::Parent),
    }
}

/// Leaves the terminal's session and process group, so that closing the
/// terminal or Ctrl-C there does not reach the daemon.
pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes no arguments and touches no memory of ours.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Points stdin, stdout and stderr at /dev/null.
pub fn detach_stdio() -> io::Result<()> {
    let null = File::options().read(true).write(true).open("/dev/null")?;
    for fd in 0..3 {
        // SAFETY: dup2 onto the standard fds replaces them atomically; `null`
        // stays open for the call.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
