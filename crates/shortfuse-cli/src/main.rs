//! `shortfuse`: mount, unmount and inspect shortfuse file systems.

mod filesystems;
mod foreign;
mod helper;
mod list;
mod logging;
mod metrics;
mod rights;
mod run;
mod serve;
mod sys;

use std::fs::File;
use std::io::{self, BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use shortfuse::cache::{CacheOptions, CACHE_OPTION_HELP};
use shortfuse::options::{FsOptions, OPTION_HELP};
use shortfuse::{DevSession, MountOptions, SessionOptions, Transport};

#[derive(Parser)]
#[command(name = "shortfuse", version = env!("SHORTFUSE_VERSION"), about = "Serve user-space file systems through FUSE")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount a file system. Returns once the mount is live; the daemon stays
    /// in the background (use -f to keep it in the foreground) and logs to
    /// DIR/BASENAME-HASH.log (BASENAME: the mount point's last component),
    /// beside its control socket; DIR is /run/shortfuse (root),
    /// $XDG_RUNTIME_DIR/shortfuse, or /tmp/shortfuse-UID (created 0700,
    /// refused when another user made it).
    #[command(after_long_help = mount_options_help())]
    Mount {
        /// File system: null, mem, passthrough, stripe, pack, sftp, dist (see below).
        fs: String,
        /// [SOURCE] MOUNTPOINT: SOURCE is what the file system serves (see below).
        #[arg(value_name = "[SOURCE] MOUNTPOINT", num_args = 1..=2, required = true)]
        paths: Vec<PathBuf>,
        /// Mount options, comma-separated, like mount(8): -o ro,max_write=1M.
        /// May be repeated. See the list below (--help).
        #[arg(short = 'o', value_name = "OPT[,OPT...]")]
        options: Vec<String>,
        /// The server's port, as sshfs's -p: the same as -o port=PORT (sftp).
        #[arg(short = 'p', value_name = "PORT")]
        port: Option<u16>,
        /// Stay in the foreground (logs go to stderr; Ctrl-C unmounts).
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Log every request and reply, as libfuse's -d (-o debug too);
        /// implies -f.
        #[arg(short = 'd')]
        debug: bool,
        /// How requests reach the daemon: `dev` (/dev/fuse) or `uring`
        /// (FUSE over io_uring, per-CPU rings; root; falls back to `dev`
        /// when the kernel switch cannot be turned on).
        #[arg(long, default_value = "dev", value_parser = kernel_transport())]
        transport: Transport,
        /// Worker threads, each with its own /dev/fuse fd [default: one per
        /// CPU; 1 with -o base].
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
        threads: Option<u16>,
    },
    /// Unmount a shortfuse (or any FUSE) mount; works when its daemon died.
    #[command(alias = "unmount")]
    Umount {
        /// Lazy: detach now, even while busy; the file system goes away when
        /// the last user leaves.
        #[arg(short = 'l', short_alias = 'z', long)]
        lazy: bool,
        mountpoint: PathBuf,
    },
    /// Run the benchmark suites against native ext4, the shortfuse transports
    /// and peer FUSE file systems (`shortfuse bench --help` lists them).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// distfs servers: `dist up --data DIR` runs lease manager, metadata and
    /// block storage in one process (foreground; mount it with `shortfuse
    /// mount dist ADDR MOUNTPOINT`).
    Dist {
        #[command(subcommand)]
        command: DistCommand,
    },
    /// Run a program with mounts served inside its own process by the
    /// preload shim (no FUSE, no kernel mount; children inherit them).
    #[command(after_long_help = run::after_help())]
    Run(run::RunArgs),
    /// Serve a file system to programs under `shortfuse run -m MOUNTPOINT`
    /// over shared-memory rings (and, with --transport, in the kernel too).
    Serve(serve::ServeArgs),
    /// Link DIR/mount.fuse.shortfuse-NAME to this binary for every bundled
    /// file system, so that mount(8) and /etc/fstab mount type
    /// fuse.shortfuse-NAME (see README "mount(8) and /etc/fstab").
    InstallHelpers {
        /// Where mount(8) looks for helpers.
        #[arg(long, value_name = "DIR", default_value = "/sbin")]
        dir: PathBuf,
    },
    /// Print the log of the daemon serving MOUNTPOINT (where its stderr
    /// goes: DIR/BASENAME-HASH.log in the background).
    Logs { mountpoint: PathBuf },
    /// List every shortfuse mount and daemon: mount point, file system,
    /// source, transport, daemon pid and log (`-` where unknown: a dead
    /// daemon, or another user's).
    List,
    /// Print per-operation counts and latencies (count, mean, p50, p99, max)
    /// of the daemon serving MOUNTPOINT.
    Stats {
        mountpoint: PathBuf,
        /// Print JSON instead of a table (nanoseconds).
        #[arg(long)]
        json: bool,
        /// Print the Prometheus text format (seconds; for a node exporter's
        /// textfile collector, or `-o metrics=ADDR:PORT` to be scraped).
        #[arg(long, conflicts_with = "json")]
        prometheus: bool,
        /// Zero the counters (after printing nothing).
        #[arg(long, conflicts_with_all = ["json", "prometheus"])]
        reset: bool,
    },
}

#[derive(Subcommand)]
enum DistCommand {
    /// Serve DIR (metadata and blocks) on ADDR until stopped; with --etcd,
    /// serve as one agent of the file system whose metadata is in etcd.
    Up {
        #[arg(long, value_name = "DIR")]
        data: PathBuf,
        /// etcd client URLs, comma-separated (http://IP:2379,...): metadata
        /// in etcd, blocks under DIR (every agent names the same DIR).
        #[arg(long, value_name = "URLS", value_delimiter = ',')]
        etcd: Vec<String>,
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7420")]
        listen: std::net::SocketAddr,
        /// Blocks in an S3 bucket instead of DIR/blocks:
        /// http://[KEY:SECRET@]HOST:PORT/BUCKET (credentials also from
        /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; none: unsigned).
        #[arg(long, value_name = "URL")]
        s3: Option<String>,
    },
    /// Consistency checker: one client per MOUNT (mounts of one server)
    /// reads and writes shared files at once; fails when a read saw
    /// neither the latest completed write nor a concurrent one. Works in a
    /// new directory `.shortfuse-check-PID-N` that it makes in the first
    /// MOUNT and removes at the end; existing files are never touched.
    Check {
        /// Directories in distfs mounts of one server (two or more).
        #[arg(required = true, num_args = 2..)]
        mounts: Vec<PathBuf>,
        /// Run on directories that are not in distfs mounts too.
        #[arg(long)]
        force: bool,
        #[arg(long, default_value_t = 2)]
        files: usize,
        /// Operations per client.
        #[arg(long, default_value_t = 200)]
        ops: usize,
        #[arg(long, default_value_t = 50)]
        read_percent: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn mount_options_help() -> String {
    let width = OPTION_HELP.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut s = filesystems::help();
    s.push_str("\nMount options (-o), later ones win:\n");
    for (k, v) in OPTION_HELP {
        s.push_str(&format!("  {k:<width$}  {v}\n"));
    }
    s.push_str("\nDefaults of `shortfuse mount FS` (before your -o, which win), and what each trades:\n");
    for k in filesystems::all().filter(|k| !k.mount_defaults.is_empty()) {
        for (o, why) in k.mount_defaults {
            s.push_str(&format!("  {:<width$}  {}: {why}\n", o, k.name));
        }
    }
    for k in filesystems::all().filter(|k| k.mirror && k.kernel_permissions) {
        s.push_str(&format!(
            "  {:<width$}  {}: {}\n",
            "default_permissions",
            k.name,
            rights::MIRROR_HELP
        ));
    }
    s.push_str("\nUser-space cache (-o, also for serve and run; README \"Caching\"):\n");
    for (k, v) in CACHE_OPTION_HELP {
        s.push_str(&format!("  {k:<width$}  {v}\n"));
    }
    s.push_str(&format!(
        "\nMonitoring:\n  {:<width$}  answer GET /metrics there in the Prometheus text format (also: \
         shortfuse stats --prometheus)\n",
        "metrics=ADDR:PORT"
    ));
    s.push_str(
        "\nOther options go to the file system, which refuses those it does not know.\n\
         \nExamples:\n  shortfuse mount mem /mnt/m\n  shortfuse mount passthrough /srv/data /mnt/d -o optimized\n  \
         shortfuse mount null /mnt/n -o base -f",
    );
    s
}

fn main() -> ExitCode {
    // Run by mount(8) as mount.fuse.shortfuse-NAME.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(fs) = argv
        .first()
        .and_then(|a| helper::fs_of_program(std::path::Path::new(a)))
    {
        return helper::main(&fs, &argv[1..]);
    }
    // Exec'd by `run` for a program on a mount (no clap: the program's
    // arguments are its own).
    if argv.get(1).is_some_and(|a| a == run::TRAMPOLINE) {
        return run::trampoline(&argv[2..]);
    }
    let cli = Cli::parse();
    match &cli.command {
        Command::Run(_) => logging::init_run(),
        Command::Mount { options, debug, .. } => logging::init(*debug || logging::asks_debug(options)),
        _ => logging::init(false),
    }
    let result = match cli.command {
        Command::Run(args) => return run::main(args),
        Command::Serve(args) => serve::main(args),
        Command::Mount {
            fs,
            paths,
            mut options,
            port,
            foreground,
            debug,
            transport,
            threads,
        } => {
            // First, so that a port in -o wins as a later option does.
            if let Some(p) = port {
                options.insert(0, format!("port={p}"));
            }
            if debug {
                options.push("debug".to_string());
            }
            mount(
                &fs,
                &paths,
                &options,
                foreground || debug,
                transport,
                threads.map(usize::from),
            )
        }
        Command::Bench { mut args } => {
            if !args.iter().any(|a| a == "--shortfuse") {
                if let Ok(me) = std::env::current_exe() {
                    args.extend(["--shortfuse".to_string(), me.display().to_string()]);
                }
            }
            return ExitCode::from(shortfuse_bench::cli_main(&args).clamp(0, 255) as u8);
        }
        Command::Dist {
            command: DistCommand::Up { data, etcd, listen, s3 },
        } => {
            // Blocked before the server's threads start (they inherit the
            // mask), so SIGINT and SIGTERM reach the wait below and the
            // server shuts down and exits 0 instead of dying of the signal.
            match serve::SignalSet::block() {
                Ok(signals) => shortfuse_dist::server::run_up(
                    shortfuse_dist::server::ServerConfig {
                        s3,
                        ..shortfuse_dist::server::ServerConfig::agent(etcd, data, listen)
                    },
                    || signals.wait(),
                ),
                Err(e) => Err(e),
            }
        }
        Command::Dist {
            command:
                DistCommand::Check {
                    mounts,
                    files,
                    ops,
                    read_percent,
                    seed,
                    force,
                },
        } => shortfuse_dist::check::cli(
            &mounts,
            &shortfuse_dist::check::Workload {
                files,
                ops,
                read_percent,
                seed,
                ..Default::default()
            },
            force,
        ),
        Command::InstallHelpers { dir } => helper::install(&dir),
        Command::List => list::main(),
        Command::Logs { mountpoint } => list::print_log(&mountpoint),
        Command::Umount { lazy, mountpoint } => shortfuse::mount::unmount(&mountpoint, lazy).inspect(|()| {
            // The daemon of a killed mount left its socket behind.
            shortfuse::control::remove_stale_socket(&mountpoint);
        }),
        Command::Stats {
            mountpoint,
            json,
            prometheus,
            reset,
        } => {
            let request = match (json, prometheus, reset) {
                (_, _, true) => "reset",
                (true, _, _) => "stats json",
                (_, true, _) => "stats prometheus",
                _ => "stats",
            };
            shortfuse::control::request(&mountpoint, request).map(|out| {
                if !reset {
                    print!("{out}");
                }
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shortfuse: {e}");
            ExitCode::FAILURE
        }
    }
}

use filesystems::invalid;

/// `--transport` of a kernel mount: the two the kernel offers, by the
/// names [`Transport`] parses.
fn kernel_transport() -> impl clap::builder::TypedValueParser<Value = Transport> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new([Transport::Dev.name(), Transport::Uring.name()])
        .map(|s| s.parse::<Transport>().expect("one of the possible values"))
}

pub(crate) fn mount(
    fs_name: &str,
    paths: &[PathBuf],
    options: &[String],
    foreground: bool,
    transport: Transport,
    threads: Option<usize>,
) -> io::Result<()> {
    let (source, mountpoint) = match paths {
        [mp] => (None, mp),
        [src, mp] => (Some(src.as_path()), mp),
        _ => return Err(invalid("expected [SOURCE] MOUNTPOINT".to_string())),
    };
    let mut opts = MountOptions {
        transport,
        ..MountOptions::default()
    };
    // The file system's defaults first: the user's options, later, win.
    for o in defaults(filesystems::find(fs_name)?, &opts, options) {
        opts.apply(o, None)?;
    }
    let mut rest = FsOptions::new();
    for o in options {
        opts.apply(o, Some(&mut rest))?;
    }
    if opts.fsname.is_none() {
        opts.fsname = Some(match source {
            Some(s) => s.display().to_string(),
            None => fs_name.to_string(),
        });
    }
    if opts.subtype.is_none() {
        opts.subtype = Some(format!("shortfuse-{fs_name}"));
    }
    let cache = CacheOptions::take_from(&mut rest).map_err(filesystems::invalid)?;
    let metrics = metrics::take_from(&mut rest)?;
    // Taken by logging::init already.
    rest.retain(|(k, _)| k != "debug");
    let fs = filesystems::build(fs_name, source, &rest, &mut opts)?;
    let filesystems::Cached { fs, cache: cached } = filesystems::with_cache(fs_name, fs, &cache)?;
    // --threads wins over a profile's or `-o threads=N`.
    if threads.is_some() {
        opts.threads = threads;
    }
    let figures = fs.figures();
    let dev = DevSession::mount(fs, mountpoint, opts, SessionOptions::default())?;
    if let Some(c) = &cached {
        dev.stats().attach_cache(c.stats().clone());
    }
    if let Some(f) = figures {
        dev.stats().attach_figures(f);
    }
    // Unmounted (umount, SIGINT/SIGTERM): what the cache still holds dirty
    // goes to the file system before the daemon exits.
    let finish = move |result: io::Result<()>| match cached.map(|c| c.flush_all()) {
        Some(Err(e)) => {
            let e = io::Error::other(format!("writing back the cache's dirty pages at unmount: {e}"));
            eprintln!("shortfuse: {e}");
            result.and(Err(e))
        }
        _ => result,
    };
    // Started in the process that serves (threads do not survive the fork).
    let start_metrics = {
        let stats = dev.stats().clone();
        let mp = dev.mount_point().to_path_buf();
        move || metrics.map_or(Ok(()), |l| metrics::serve(l, stats, mp))
    };
    if foreground {
        start_metrics()?;
        return finish(dev.run(sys::notify_ready));
    }
    background(dev, start_metrics, finish)
}

/// The mount defaults of `kind` that go on top of `base` before the user's
/// `options`: those the daemon's user cannot have (kernel passthrough
/// without root) and those the user's options cannot go with (their
/// `writeback_cache` beside the default `passthrough`) are left out, so
/// that the user's choice wins rather than fails.
fn defaults<'a>(kind: &'a shortfuse_fs::registry::FsKind, base: &MountOptions, options: &[String]) -> Vec<&'a str> {
    let euid = sys::effective_ids().0;
    kind.mount_defaults
        .iter()
        .map(|(o, _)| *o)
        .filter(|o| shortfuse_fs::registry::default_applies(o, euid))
        .filter(|o| {
            let mut with = base.clone();
            let mut rest = FsOptions::new();
            with.apply(o, None).is_ok() && options.iter().all(|u| with.apply(u, Some(&mut rest)).is_ok())
        })
        .collect()
}

/// Forks: the child serves, the parent waits until the child reports that
/// it is serving (or why it failed) and exits with that status.
fn background(
    dev: DevSession,
    before_serving: impl FnOnce() -> io::Result<()>,
    finish: impl FnOnce(io::Result<()>) -> io::Result<()>,
) -> io::Result<()> {
    // Opened before the fork, so that a refused runtime directory or log
    // is reported here, and the mount undone, rather than lost.
    let log = shortfuse::control::open_log(dev.mount_point())?;
    let (mut rx, tx) = pipe()?;
    match sys::fork()? {
        sys::Forked::Parent => {
            drop(tx);
            // One line: the child keeps its end open while it serves.
            let mut msg = String::new();
            let _ = io::BufReader::new(&mut rx).read_line(&mut msg);
            // Exit without running destructors: the mount belongs to the child.
            if msg == "ok\n" {
                std::process::exit(0);
            }
            let msg = msg.trim();
            eprintln!(
                "shortfuse: {}",
                if msg.is_empty() {
                    "the daemon exited before serving"
                } else {
                    msg
                }
            );
            std::process::exit(1);
        }
        sys::Forked::Child => {
            drop(rx);
            sys::setsid()?;
            let _ = std::env::set_current_dir("/");
            sys::detach_stdio(&log)?;
            let mut ready_tx = tx.try_clone()?;
            let result = before_serving().and_then(|()| {
                finish(dev.run(move || {
                    sys::notify_ready();
                    let _ = ready_tx.write_all(b"ok\n");
                }))
            });
            if let Err(e) = &result {
                let mut tx = tx;
                let _ = writeln!(tx, "{e}");
            }
            std::process::exit(if result.is_ok() { 0 } else { 1 });
        }
    }
}

fn pipe() -> io::Result<(File, File)> {
    let (r, w) = std::os::unix::net::UnixStream::pair()?;
    Ok((
        File::from(std::os::fd::OwnedFd::from(r)),
        File::from(std::os::fd::OwnedFd::from(w)),
    ))
}
