//! `shortfuse serve FS [SOURCE] MOUNTPOINT`: one daemon that programs
//! under `shortfuse run -m MOUNTPOINT` reach over shared-memory rings
//! (`shortfuse-ring`), and, with `--transport dev|uring`, a kernel mount of
//! the same file system at the same place, so programs with and without
//! the shim see one file system.
//!
//! The daemon stays in the foreground (start it with `&` or under a
//! supervisor); SIGINT or SIGTERM stop it: the kernel mount goes, and every
//! ring client's calls fail with ENOTCONN.
//!
//! Coherence: ring clients hear of every change made through another
//! client or through the kernel mount (FUSE notifications in their rings),
//! and the kernel hears of every change made through a ring client
//! (INVAL_ENTRY / INVAL_INODE written to its /dev/fuse), so the kernel
//! mount keeps its caches for the timeouts `-o` gives, as the ring clients
//! do. What the file system notifies itself (through the notifier its
//! `init` gets) reaches both.
//!
//! Statistics: one table for the kernel's requests and the rings'
//! (`shortfuse stats MOUNTPOINT`, with the count per transport), and the
//! cache's counters when `-o cache` puts one in front of the file system:
//! one cache for the rings and the kernel mount alike, written back when
//! the daemon stops.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use shortfuse::cache::{CacheOptions, CachedFs};
use shortfuse::control::ControlServer;
use shortfuse::options::FsOptions;
use shortfuse::{DevSession, Filesystem, MountOptions, SessionOptions, Stats, Transport};
use shortfuse_ring::foreign::DEFAULT_DAEMON_SPIN_US;
use shortfuse_ring::{Announcing, Server, ServerConfig, DEFAULT_SPIN_US};

use crate::filesystems;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// File system: as for mount (null, mem, passthrough, stripe, pack, sftp, dist).
    #[arg(required_unless_present = "command")]
    fs: Option<String>,
    /// [SOURCE] MOUNTPOINT: SOURCE is what the file system serves; programs
    /// reach the daemon by MOUNTPOINT (`shortfuse run -m MOUNTPOINT`).
    #[arg(value_name = "[SOURCE] MOUNTPOINT", num_args = 1..=2, required_unless_present = "command")]
    paths: Vec<PathBuf>,
    /// `-- COMMAND ARGS...`: an unmodified FUSE daemon (sshfs, bindfs, a
    /// libfuse, go-fuse or fuser file system) run in the foreground; its
    /// kernel mount stays, and programs under `shortfuse run -m
    /// MOUNTPOINT` reach the same daemon over the rings.
    #[arg(last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<std::ffi::OsString>,
    /// With COMMAND: the daemon's mount point, when it is not one of its
    /// arguments as written.
    #[arg(long, value_name = "DIR", requires = "command")]
    pub(crate) mountpoint: Option<PathBuf>,
    /// With COMMAND: the file handle the daemon answers an open with is its
    /// descriptor of the file's backing file, holding the file's bytes as
    /// they are (bindfs, libfuse's passthrough examples). A program's
    /// read-only open then reads the backing file itself, as a daemon's
    /// kernel passthrough registration lets it; writes still go to the
    /// daemon. Wrong for a daemon that changes the bytes (compresses,
    /// encrypts) or keeps anything else in its handles.
    #[arg(long, requires = "command")]
    pub(crate) backing_handles: bool,
    /// Mount options, comma-separated, as for `shortfuse mount`. May be repeated.
    #[arg(short = 'o', value_name = "OPT[,OPT...]")]
    pub(crate) options: Vec<String>,
    /// Also mount in the kernel at MOUNTPOINT, over this transport.
    #[arg(long, value_enum, default_value_t = KernelMount::None)]
    pub(crate) transport: KernelMount,
    /// Worker threads of the kernel mount (as for mount).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub(crate) threads: Option<u16>,
    /// How long (µs) an idle ring worker spins before it sleeps on a futex.
    #[arg(long, value_name = "US", default_value_t = DEFAULT_SPIN_US)]
    pub(crate) spin_us: u64,
    /// How long (µs) a client spins for its reply before it sleeps [default:
    /// --spin-us]. SHORTFUSE_RING_SPIN_US in a client's environment overrides it.
    #[arg(long, value_name = "US")]
    pub(crate) client_spin_us: Option<u64>,
    /// With COMMAND: how long (µs) the daemon's readers poll for the next
    /// request before they sleep (0: at once). A request that comes within
    /// the window spares a sleep and the wake-up of an idle CPU, which
    /// costs more than most requests' work; a reader that finds nothing
    /// spends the window's CPU. A reader on the CPU of the program it
    /// answered yields at every look.
    #[arg(long, value_name = "US", default_value_t = DEFAULT_DAEMON_SPIN_US, requires = "command",
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub(crate) daemon_spin_us: u64,
    /// Request slots per CPU queue (requests in flight per CPU).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=992))]
    pub(crate) slots: u32,
}

/// Whether `serve` also mounts in the kernel, and over which transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum KernelMount {
    /// No kernel mount: the rings alone.
    None,
    /// /dev/fuse.
    Dev,
    /// FUSE over io_uring.
    Uring,
}

impl KernelMount {
    /// The kernel transport, when there is a kernel mount.
    fn transport(self) -> Option<Transport> {
        match self {
            KernelMount::None => None,
            KernelMount::Dev => Some(Transport::Dev),
            KernelMount::Uring => Some(Transport::Uring),
        }
    }
}

/// The mount point as clients name it: absolute, lexically normalised.
pub fn client_mountpoint(mp: &Path) -> io::Result<PathBuf> {
    let cwd = std::env::current_dir()?;
    Ok(PathBuf::from(crate::run::absolute(&cwd, mp)))
}

pub fn main(args: ServeArgs) -> io::Result<()> {
    if !args.command.is_empty() {
        return crate::foreign::main(&args);
    }
    let fs_name = args.fs.clone().unwrap_or_default();
    let (source, mountpoint) = match args.paths.as_slice() {
        [mp] => (None, mp),
        [src, mp] => (Some(src.as_path()), mp),
        _ => return Err(filesystems::invalid("expected [SOURCE] MOUNTPOINT".to_string())),
    };
    let kernel = args.transport.transport();
    let mut opts = MountOptions {
        transport: kernel.unwrap_or(Transport::Dev),
        ..MountOptions::default()
    };
    let mut rest = FsOptions::new();
    for o in &args.options {
        opts.apply(o, Some(&mut rest))?;
    }
    if opts.fsname.is_none() {
        opts.fsname = Some(source.map_or(fs_name.clone(), |s| s.display().to_string()));
    }
    if opts.subtype.is_none() {
        opts.subtype = Some(format!("shortfuse-{fs_name}"));
    }
    let cache = CacheOptions::take_from(&mut rest).map_err(filesystems::invalid)?;
    let fs = filesystems::build(&fs_name, source, &rest, &mut opts)?;
    // One cache tier for every client: the rings and the kernel mount.
    let filesystems::Cached { fs, cache: cached } = filesystems::with_cache(&fs_name, fs, &cache)?;
    let client_mp = client_mountpoint(mountpoint)?;
    let config = ServerConfig {
        slots: args.slots,
        spin: Duration::from_micros(args.spin_us),
        client_spin: Duration::from_micros(args.client_spin_us.unwrap_or(args.spin_us)),
        // A mirror works on the host's files: as root the daemon acts with
        // each caller's credentials, so the kernel checks them on the
        // source and the caller owns what it creates.
        impersonate: filesystems::find(&fs_name)?.mirror && crate::sys::effective_ids().0 == 0,
        // Clients use the source as the kernel's view of the mount (see
        // `ServerConfig::source`), unless a cache here holds newer data.
        source: source
            .filter(|_| filesystems::find(&fs_name).is_ok_and(|f| f.mirror) && cached.is_none())
            .map(Path::to_path_buf),
        // Clients of our own user serve reading path calls in the kernel
        // beneath the source (none when a cache sits in front: it may
        // hold what the source does not show yet).
        names: fs.namespace_map(),
        ..ServerConfig::default()
    };
    let ring_path = shortfuse_ring::socket_path(&client_mp);
    if kernel.is_none() {
        let stats = Arc::new(Stats::new());
        if let Some(c) = &cached {
            stats.attach_cache(c.stats().clone());
        }
        if let Some(f) = fs.figures() {
            stats.attach_figures(f);
        }
        let about = shortfuse::control::About {
            fs: fs_name.clone(),
            source: opts.fsname.clone().unwrap_or_default(),
            transport: "rings".to_string(),
        };
        let _control = ControlServer::start_described(&client_mp, stats.clone(), about)?;
        let signals = SignalSet::block()?;
        let mut server = Server::start(&ring_path, fs.clone(), opts, stats, config)?;
        eprintln!(
            "shortfuse serve: {} at {} (rings: {})",
            fs_name,
            client_mp.display(),
            ring_path.display()
        );
        crate::sys::notify_ready();
        signals.wait();
        server.stop();
        return finish(&*fs, cached.as_deref());
    }
    // --threads wins over a profile's or `-o threads=N`.
    if let Some(n) = args.threads {
        opts.threads = Some(usize::from(n));
    }
    let kernel_fs = Arc::new(Announcing::new(fs.clone()));
    let dev = DevSession::mount(kernel_fs.clone(), mountpoint, opts.clone(), SessionOptions::default())?;
    if let Some(c) = &cached {
        dev.stats().attach_cache(c.stats().clone());
    }
    if let Some(f) = fs.figures() {
        dev.stats().attach_figures(f);
    }
    // Before the ring threads start, so that they inherit the mask and the
    // session's signal thread takes every SIGINT, SIGTERM and SIGUSR1.
    let _signals = SignalSet::block()?;
    // One notifier for the kernel mount and the rings: each side's changes
    // reach the other's caches, and the file system's reach both.
    let config = ServerConfig {
        notifier: Some(dev.notifier().clone()),
        ..config
    };
    let mut server = Server::start(&ring_path, fs.clone(), opts, dev.stats().clone(), config)?;
    kernel_fs.attach(server.announcer(), dev.dispatcher());
    let name = fs_name.clone();
    let result = dev.run(|| {
        crate::sys::notify_ready();
        eprintln!(
            "shortfuse serve: {name} at {} (kernel mount over {}; rings: {})",
            client_mp.display(),
            kernel.map_or("none", Transport::name),
            ring_path.display()
        );
    });
    server.stop();
    result.and(finish(&*fs, cached.as_deref()))
}

/// The daemon stops, its rings and kernel mount served no more: the
/// cache's dirty pages go to the file system, which then gets its
/// `destroy` (nobody else gives it: the kernel's DESTROY does not end a
/// daemon that also serves rings) and writes back what it holds, as distfs
/// does its block cache.
fn finish(fs: &dyn Filesystem, cached: Option<&CachedFs<dyn Filesystem>>) -> io::Result<()> {
    let flushed = match cached.map(CachedFs::flush_all) {
        Some(Err(e)) => Err(io::Error::other(format!(
            "writing back the cache's dirty pages at shutdown: {e}"
        ))),
        _ => Ok(()),
    };
    fs.destroy();
    flushed
}

/// SIGINT, SIGTERM and SIGUSR1, blocked in every thread (they inherit the
/// mask) and taken by `wait` (SIGUSR1 by the kernel session's thread, which
/// logs the statistics; with rings alone, and for `dist up`, it stops the
/// daemon too).
pub(crate) struct SignalSet(libc::sigset_t);

impl SignalSet {
    pub(crate) fn block() -> io::Result<SignalSet> {
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t; pthread_sigmask only reads it.
        let r = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(SignalSet(set))
    }

    pub(crate) fn wait(&self) {
        let mut sig = 0;
        // SAFETY: a valid set and out-pointer; retried on spurious errors.
        while unsafe { libc::sigwait(&self.0, &mut sig) } != 0 {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).map(|c| c.serve)
    }

    #[test]
    fn daemon_spin_us() {
        let daemon = ["--", "bindfs", "-f", "src", "mnt"];
        let with = |opt: &[&str]| parse(&[opt, &daemon[..]].concat());
        assert_eq!(with(&[]).unwrap().daemon_spin_us, DEFAULT_DAEMON_SPIN_US);
        assert_eq!(with(&["--daemon-spin-us", "0"]).unwrap().daemon_spin_us, 0);
        assert_eq!(with(&["--daemon-spin-us=10000"]).unwrap().daemon_spin_us, 10_000);
        for bad in ["10001", "-1", "2.5", "1K", ""] {
            assert!(with(&["--daemon-spin-us", bad]).is_err(), "{bad}");
        }
        // It concerns a daemon started with `--` alone.
        assert!(parse(&["--daemon-spin-us", "5", "null", "mnt"]).is_err());
    }
}
