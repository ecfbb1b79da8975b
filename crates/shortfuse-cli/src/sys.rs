//! Process plumbing for going into the background: fork, setsid, and
//! pointing the standard streams away from the terminal.

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

/// Points stdin at /dev/null and stdout and stderr at `log`.
pub fn detach_stdio(log: &File) -> io::Result<()> {
    let null = File::options().read(true).write(true).open("/dev/null")?;
    for (fd, file) in [(0, &null), (1, log), (2, log)] {
        // SAFETY: dup2 onto the standard fds replaces them atomically; the
        // files stay open for the call.
        if unsafe { libc::dup2(file.as_raw_fd(), fd) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The effective user and group ids of this process.
pub fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid cannot fail and touch no memory.
    unsafe { (libc::geteuid(), libc::getegid()) }
}
