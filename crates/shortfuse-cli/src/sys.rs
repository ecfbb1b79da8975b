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

/// The real user and group ids of this process.
pub fn real_ids() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// This process's effective capability set (`CapEff` of
/// /proc/self/status), or None when it cannot be read.
pub fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Tells systemd the mount is live (sd_notify's `READY=1`), when it runs us
/// with `NOTIFY_SOCKET` set (`Type=notify`); `MAINPID` names the process
/// that serves, the background daemon included (which needs
/// `NotifyAccess=all`). Nothing is sent without the variable, and a failure
/// to send is only reported: systemd then times the unit out by itself.
pub fn notify_ready() {
    let Some(addr) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let msg = format!("READY=1\nMAINPID={}\n", std::process::id());
    let sent = std::os::unix::net::UnixDatagram::unbound().and_then(|sock| {
        use std::os::unix::ffi::OsStrExt;
        let bytes = addr.as_bytes();
        // `@name`: a name in the abstract namespace.
        let target = match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name)?
            }
            None => std::os::unix::net::SocketAddr::from_pathname(std::path::Path::new(&addr))?,
        };
        sock.send_to_addr(msg.as_bytes(), &target)
    });
    if let Err(e) = sent {
        eprintln!(
            "shortfuse: telling systemd the mount is ready (NOTIFY_SOCKET={}): {e}",
            addr.to_string_lossy()
        );
    }
}
