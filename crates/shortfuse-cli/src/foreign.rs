//! `shortfuse serve [OPTIONS] -- COMMAND ARGS...`: an unmodified FUSE
//! daemon served to programs under `shortfuse run -m MOUNTPOINT` over the
//! shared-memory rings, its kernel mount kept for everybody else.
//!
//! COMMAND runs with the preload shim in daemon mode (see
//! `shortfuse_ring::foreign`): it mounts as it always does (mount(2) as
//! root, fusermount3 otherwise), and its /dev/fuse descriptor then carries
//! the ring clients' requests beside the kernel's. Once the daemon has
//! answered the kernel's INIT, its mount point is known (`--mountpoint`, or
//! the argument of COMMAND that names a FUSE mount now) and the rings open
//! there. SIGINT and SIGTERM are passed on to the daemon (which unmounts
//! as usual); when it exits the rings close, clients' calls fail with
//! ENOTCONN, and `serve` exits with the daemon's status.
//!
//! Ring clients list with READDIRPLUS when the daemon agreed to it with
//! the kernel, each entry's node and attributes cached as a LOOKUP's
//! (`-o readdirplus=no` before the `--` keeps them on READDIR).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shortfuse::control::{About, ControlServer};
use shortfuse::options::FsOptions;
use shortfuse::{MountOptions, Stats};
use shortfuse_ring::foreign::{
    Bridge, BridgeFigures, BACKING_HANDLES_VAR, DAEMON_BELL_VAR, DAEMON_FD_VAR, DAEMON_LANES_VAR, DAEMON_SPIN_VAR,
    DIRECT_VAR, LANES,
};
use shortfuse_ring::{Server, ServerConfig};

use crate::serve::{client_mountpoint, ServeArgs, SignalSet};

/// How long the daemon may take to mount (sshfs connects first).
const MOUNT_WAIT: Duration = Duration::from_secs(120);

pub fn main(args: &ServeArgs) -> io::Result<()> {
    let command = &args.command;
    let mut opts = MountOptions::default();
    let mut rest = FsOptions::new();
    for o in &args.options {
        opts.apply(o, Some(&mut rest))?;
    }
    let shim = crate::run::shim_path(crate::run::SHIM).map_err(io::Error::other)?;
    let (ours, theirs) = socket_pair()?;
    let (our_lanes, their_lanes): (Vec<OwnedFd>, Vec<OwnedFd>) = (0..LANES)
        .map(|_| socket_pair())
        .collect::<io::Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let lane_list = their_lanes
        .iter()
        .map(|l| l.as_raw_fd().to_string())
        .collect::<Vec<_>>()
        .join(",");
    // The daemon takes the ring clients' requests from their queues
    // itself, woken through this eventfd when it sleeps.
    let bell = if std::env::var_os(DIRECT_VAR).is_none_or(|v| v != "0") {
        // SAFETY: plain eventfd creation; the descriptor is owned at once.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor we just made and own alone.
        Some(unsafe { OwnedFd::from_raw_fd(fd) })
    } else {
        None
    };
    let mut child = Command::new(&command[0]);
    if let Some(b) = &bell {
        child.env(DAEMON_BELL_VAR, b.as_raw_fd().to_string());
    }
    if args.backing_handles {
        child.env(BACKING_HANDLES_VAR, "1");
    }
    let mut child = child
        .args(&command[1..])
        .env(
            "LD_PRELOAD",
            crate::run::ld_preload(&shim, std::env::var_os("LD_PRELOAD")),
        )
        .env(DAEMON_FD_VAR, theirs.as_raw_fd().to_string())
        .env(DAEMON_LANES_VAR, lane_list)
        .env(DAEMON_SPIN_VAR, args.daemon_spin_us.to_string())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot start {}: {e}", command[0].to_string_lossy())))?;
    drop(theirs);
    drop(their_lanes);
    let pid = child.id() as libc::pid_t;
    // After the spawn: the daemon starts with the signals we found.
    let signals = SignalSet::block()?;
    std::thread::Builder::new()
        .name("sf-serve-signals".into())
        .spawn(move || loop {
            signals.wait();
            // SAFETY: a signal to our own child, which we have not reaped yet
            // (the main thread reaps it only after it exits).
            unsafe { libc::kill(pid, libc::SIGTERM) };
        })?;
    let config = ServerConfig {
        slots: args.slots,
        spin: Duration::from_micros(args.spin_us),
        client_spin: Duration::from_micros(args.client_spin_us.unwrap_or(args.spin_us)),
        ..ServerConfig::default()
    };
    let config = ServerConfig {
        max_io: message_room(&ours, config.max_io),
        ..config
    };
    let readdirplus = opts.readdirplus != shortfuse::Readdirplus::No;
    let bridge = Bridge::new(ours, our_lanes, config.max_io, readdirplus);
    if let Some(b) = bell {
        bridge.set_direct(b);
    }
    let b = bridge.clone();
    std::thread::Builder::new()
        .name("sf-serve-daemon".into())
        .spawn(move || b.run())?;
    let start = Instant::now();
    while !bridge.wait_init(Duration::from_millis(100)) {
        if let Some(status) = child.try_wait()? {
            return Err(io::Error::other(format!(
                "{} exited ({status}) before it mounted",
                command[0].to_string_lossy()
            )));
        }
        if start.elapsed() > MOUNT_WAIT {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let _ = child.wait();
            return Err(io::Error::other(format!(
                "{} did not mount within {} s (is it a FUSE daemon, run in the foreground with -f?)",
                command[0].to_string_lossy(),
                MOUNT_WAIT.as_secs()
            )));
        }
    }
    let mountpoint = match &args.mountpoint {
        Some(m) => client_mountpoint(m)?,
        None => find_mountpoint(&command[1..]).ok_or_else(|| {
            io::Error::other(format!(
                "none of the arguments of {} names its FUSE mount: say which with --mountpoint",
                command[0].to_string_lossy()
            ))
        })?,
    };
    let stats = Arc::new(Stats::new());
    stats.attach_figures(Arc::new(BridgeFigures(bridge.clone())));
    let name = Path::new(&command[0])
        .file_name()
        .map_or_else(|| "daemon".into(), |n| n.to_string_lossy().into_owned());
    let about = About {
        fs: name.clone(),
        source: name.clone(),
        transport: "rings+kernel".to_string(),
    };
    let control = ControlServer::start_described(&mountpoint, stats.clone(), about);
    let ring_path = shortfuse_ring::socket_path(&mountpoint);
    let mut server = Server::start_forward(&ring_path, bridge.clone(), opts, stats, config)?;
    bridge.attach(server.announcer());
    eprintln!(
        "shortfuse serve: {name} at {} (its kernel mount, and rings: {})",
        mountpoint.display(),
        ring_path.display()
    );
    crate::sys::notify_ready();
    let status = child.wait()?;
    server.stop();
    drop(control);
    if status.success() {
        return Ok(());
    }
    Err(io::Error::other(match status.signal() {
        Some(sig) => format!("{} was killed by signal {sig}", command[0].to_string_lossy()),
        None => format!("{} exited with {status}", command[0].to_string_lossy()),
    }))
}

/// A SOCK_SEQPACKET pair: ours (close-on-exec) and the daemon's (inherited).
fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are ours alone.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: plain fcntl on a descriptor we own.
    if unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_SETFD, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // A message is one request or reply whole (a READ's or WRITE's payload
    // up to max_io): each end's send buffer must hold it. Root may pass
    // net.core.wmem_max; others get what it allows (`message_room`).
    for fd in [&ours, &theirs] {
        let want: libc::c_int = SEND_BUFFER;
        for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
            // SAFETY: an int option of the right size on a socket we own.
            let r = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&want as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r == 0 {
                break;
            }
        }
    }
    Ok((ours, theirs))
}

/// The send buffer asked for each end of the socket to the daemon.
const SEND_BUFFER: libc::c_int = 4 << 20;

/// The largest READ/WRITE payload that fits one message on `sock`, within
/// `max_io`: the kernel keeps about half a send buffer for data.
fn message_room(sock: &OwnedFd, max_io: u32) -> u32 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int out-parameter of the right size on a socket we own.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    let room = if r == 0 {
        (v.max(0) as u32 / 2).saturating_sub(64 << 10)
    } else {
        0
    };
    (room & !4095).clamp(4096, max_io)
}

/// The last of `args` that names a FUSE mount point now (the daemon has
/// just mounted), as clients name it.
fn find_mountpoint(args: &[OsString]) -> Option<PathBuf> {
    args.iter()
        .rev()
        .filter(|a| !a.as_bytes().starts_with(b"-"))
        .filter_map(|a| client_mountpoint(Path::new(a)).ok())
        .find(|p| shortfuse::mount::fuse_mount_at(p).ok().flatten().is_some())
}
