//! Configurations a benchmark runs on: native ext4, shortfuse mounts and
//! peer FUSE file systems from Debian, each prepared over a fresh source
//! directory and torn down afterwards (also on failure or Ctrl-C).

use shortfuse::sync::Unpoison;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cleanup;
use crate::sshd::Sshd;

/// How one configuration gets its directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The source directory itself (ext4).
    Native,
    /// `shortfuse mount FS SRC MNT --transport T -o OPTS`.
    Shortfuse {
        fs: String,
        transport: String,
        opts: String,
        threads: Option<usize>,
    },
    /// Debian's bindfs, with extra arguments.
    Bindfs { args: Vec<String> },
    /// libfuse's low-level passthrough example, compiled at run time.
    PassthroughLl,
    /// No mount: the workload runs in a worker process under `shortfuse run
    /// -m MNT=passthrough:SRC` (the preload shim serves the file system
    /// inside that process). Only suites that know how to start such a
    /// worker run here (`latency`, `programs`); see [`preload_worker`].
    /// Without `maps`, the shim leaves the file system's data maps unused
    /// (`SHORTFUSE_MAPS=off`), to show what they are worth.
    Preload { maps: bool },
    /// No kernel mount: the workload runs in a worker under `shortfuse run`
    /// (as for [`Kind::Preload`]); with `ring`, the worker's mount is
    /// `shortfuse serve FS SRC MNT`, a daemon reached over shared-memory
    /// rings (`-m MNT`); otherwise FS is served in the worker's process.
    Shim { fs: String, ring: bool },
    /// `shortfuse mount sftp` of a loopback sshd serving the source
    /// directory (see [`crate::sshd`]); the daemon's cache as `-o cache=`
    /// defaults (on for sftp).
    Sftp,
    /// `sftp` served in the worker's own process (`shortfuse run -m
    /// MNT=sftp:...`, as for [`Kind::Preload`]) from the same kind of
    /// server, with the shim's user-space page and metadata cache on or off
    /// (Prefuse, from the Prefuse-SSHFS caching thesis over SSHFS, with and without its cache).
    SftpShim { cache: bool },
    /// Debian's sshfs, on the same kind of server; with `direct_io` the
    /// kernel page cache is bypassed (`-o direct_io`, the Prefuse-SSHFS caching thesis's "SSHFS
    /// with O_DIRECT").
    Sshfs { direct_io: bool },
    /// Debian's bindfs (`sshfs`: Debian's sshfs from a loopback sshd) run
    /// unmodified under `shortfuse serve -- DAEMON`: the workload runs in a
    /// worker under `shortfuse run -m MNT` (as for [`Kind::Preload`]) whose
    /// calls reach that daemon over shared-memory rings, its kernel mount
    /// beside; `cache`: with the program's own page cache in front of it
    /// (`run -o cache=on`), as the kernel's page cache stands in front of
    /// its kernel mount; `backing`: bindfs's handles are declared to be
    /// its descriptors of the backing files (`serve --backing-handles`), so
    /// that read-only opens read those files themselves.
    ServedDaemon { sshfs: bool, cache: bool, backing: bool },
}

/// A named configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub name: String,
    pub kind: Kind,
}

impl Config {
    /// Every configuration this build knows, in report order.
    pub fn all() -> Vec<Config> {
        let null = |name: &str, transport: &str| Config {
            name: name.to_string(),
            kind: Kind::Shortfuse {
                fs: "null".into(),
                transport: transport.into(),
                opts: String::new(),
                threads: None,
            },
        };
        let sf = |name: &str, transport: &str, opts: &str, threads: Option<usize>| Config {
            name: name.to_string(),
            kind: Kind::Shortfuse {
                fs: "passthrough".into(),
                transport: transport.into(),
                opts: opts.into(),
                threads,
            },
        };
        vec![
            Config {
                name: "native".into(),
                kind: Kind::Native,
            },
            sf("dev-base", "dev", "base", Some(1)),
            sf("dev", "dev", "", None),
            sf("dev-opt", "dev", "optimized", None),
            // Every open passed through, readers too: the pure kernel
            // passthrough that `dev`'s reader cache departs from.
            sf("dev-passthrough", "dev", "passthrough,no_reader_cache", None),
            sf("uring", "uring", "", None),
            sf("uring-passthrough", "uring", "passthrough", None),
            Config {
                name: "bindfs".into(),
                kind: Kind::Bindfs { args: vec![] },
            },
            Config {
                name: "passthrough_ll".into(),
                kind: Kind::PassthroughLl,
            },
            null("null-dev", "dev"),
            null("null-uring", "uring"),
            Config {
                name: "preload".into(),
                kind: Kind::Preload { maps: true },
            },
            Config {
                name: "preload-nomaps".into(),
                kind: Kind::Preload { maps: false },
            },
            Config {
                name: "ring".into(),
                kind: Kind::Shim {
                    fs: "passthrough".into(),
                    ring: true,
                },
            },
            Config {
                name: "null-ring".into(),
                kind: Kind::Shim {
                    fs: "null".into(),
                    ring: true,
                },
            },
            Config {
                name: "null-preload".into(),
                kind: Kind::Shim {
                    fs: "null".into(),
                    ring: false,
                },
            },
            Config {
                name: "sftp".into(),
                kind: Kind::Sftp,
            },
            Config {
                name: "sshfs".into(),
                kind: Kind::Sshfs { direct_io: false },
            },
            Config {
                name: "sshfs-direct".into(),
                kind: Kind::Sshfs { direct_io: true },
            },
            Config {
                name: "sftp-preload".into(),
                kind: Kind::SftpShim { cache: false },
            },
            Config {
                name: "bindfs-ring".into(),
                kind: Kind::ServedDaemon {
                    sshfs: false,
                    cache: false,
                    backing: false,
                },
            },
            Config {
                name: "bindfs-ring-map".into(),
                kind: Kind::ServedDaemon {
                    sshfs: false,
                    cache: false,
                    backing: true,
                },
            },
            Config {
                name: "sshfs-ring".into(),
                kind: Kind::ServedDaemon {
                    sshfs: true,
                    cache: false,
                    backing: false,
                },
            },
            Config {
                name: "sshfs-ring-cache".into(),
                kind: Kind::ServedDaemon {
                    sshfs: true,
                    cache: true,
                    backing: false,
                },
            },
            Config {
                name: "sftp-preload-cache".into(),
                kind: Kind::SftpShim { cache: true },
            },
        ]
    }

    /// What a suite runs on when `--configs` is not given: `transport`
    /// compares the two transports and the shim in process and over the
    /// rings (empty operations on `null`, files on `passthrough`), `data` compares kernel passthrough with the same file
    /// system without maps, the others take every configuration holding
    /// files except DeFUSE's uring-passthrough pairing and the network
    /// rows; `sshfs-read` is the comparison of the Prefuse-SSHFS caching thesis (native, dev, Debian's sshfs
    /// with and without the kernel page cache, our sftp in the daemon and
    /// in process without and with the user-space cache); `sftp` times `cp`
    /// and `ls -lR` on our SFTP client and Debian's sshfs; `latency` and
    /// `meta` (the fxmark workloads: run it with `--threads 1` and
    /// `--threads 2`) add the shim in process (`preload`) and over the
    /// rings (`ring`).
    pub fn defaults(suite: &str) -> Vec<Config> {
        let names: &[&str] = match suite {
            "transport" => &[
                "native",
                "preload",
                "ring",
                "dev",
                "uring",
                "null-dev",
                "null-uring",
                "null-ring",
                "null-preload",
            ],
            // Starts its own server and client mounts in native's directory.
            "dist" => &["native"],
            // Cache structures in memory: no file system at all.
            "cache" => &["native"],
            // Starts its own `shortfuse serve` daemons in native's directory.
            "rings" => &["native"],
            "data" => &["native", "dev", "dev-passthrough", "uring-passthrough"],
            "sshfs-read" => &[
                "native",
                "dev",
                "sshfs",
                "sshfs-direct",
                "sftp",
                "sftp-preload",
                "sftp-preload-cache",
            ],
            "sftp" => &["native", "sftp", "sshfs"],
            "programs" => &["native", "preload", "ring", "dev", "uring"],
            "latency" | "meta" => &[
                "native",
                "preload",
                "ring",
                "dev-base",
                "dev",
                "dev-opt",
                "dev-passthrough",
                "uring",
                "bindfs",
                "passthrough_ll",
            ],
            _ => &[
                "native",
                "dev-base",
                "dev",
                "dev-opt",
                "dev-passthrough",
                "uring",
                "bindfs",
                "passthrough_ll",
            ],
        };
        let all = Config::all();
        names
            .iter()
            .filter_map(|n| all.iter().find(|c| c.name == *n).cloned())
            .collect()
    }

    /// What this configuration is, in a few words for the report's legend:
    /// the transport, the file system and the options.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Native => "ext4 itself, no FUSE: the baseline every ratio is taken against".into(),
            Kind::Shortfuse {
                fs,
                transport,
                opts,
                threads,
            } => {
                let via = match transport.as_str() {
                    "uring" => "FUSE over io_uring",
                    "dev" => "FUSE over /dev/fuse",
                    t => t,
                };
                let opts = match opts.as_str() {
                    "" => "its defaults".to_string(),
                    "base" => "-o base (1 thread, 4 KiB writes, no write-back cache, no splice: StackfsBase of To FUSE or Not to FUSE (FAST '17))".into(),
                    "optimized" => "-o optimized (write-back cache, 128 KiB writes, splice, a thread per CPU: StackfsOpt of To FUSE or Not to FUSE (FAST '17))".into(),
                    "passthrough" => "-o passthrough (the kernel reads and writes the backing file itself; opens and metadata still go to the daemon)".into(),
                    "passthrough,no_reader_cache" => "-o passthrough,no_reader_cache (every open passed through, readers too: the kernel reads and writes the source file itself and the mount keeps no pages; opens and metadata still go to the daemon)".into(),
                    o => format!("-o {o}"),
                };
                let threads = threads.map(|t| format!(", --threads {t}")).unwrap_or_default();
                format!("`shortfuse mount {fs}` {via}, {opts}{threads}")
            }
            Kind::Bindfs { args } if args.is_empty() => "Debian's bindfs, its defaults".into(),
            Kind::Bindfs { args } => format!("Debian's bindfs {}", args.join(" ")),
            Kind::PassthroughLl => {
                "libfuse's passthrough_ll example, built with cc -O2 from libfuse3-dev, -o cache=always,writeback as its authors suggest for speed"
                    .into()
            }
            Kind::Preload { maps: true } => {
                "no kernel mount: the preload shim serves passthrough inside the process (`shortfuse run`), with data maps".into()
            }
            Kind::Preload { maps: false } => "as preload, with the data maps off (SHORTFUSE_MAPS=off)".into(),
            Kind::Shim { fs, ring: true } => {
                format!("no kernel mount: the shim sends each call to a `shortfuse serve {fs}` daemon over shared-memory rings")
            }
            Kind::Shim { fs, ring: false } => format!("no kernel mount: the shim serves {fs} inside the process"),
            Kind::Sftp => "`shortfuse mount sftp` over /dev/fuse from a loopback sshd, its defaults".into(),
            Kind::SftpShim { cache } => format!(
                "sftp served inside the process by the shim from a loopback sshd, user-space cache {}",
                if *cache { "on" } else { "off" }
            ),
            Kind::Sshfs { direct_io: false } => "Debian's sshfs from the same kind of loopback sshd, its defaults".into(),
            Kind::Sshfs { direct_io: true } => "Debian's sshfs with -o direct_io (no kernel page cache)".into(),
            Kind::ServedDaemon { sshfs, cache, backing } => format!(
                "no kernel mount in the way: Debian's {}, unmodified, under `shortfuse serve {}--`, each call sent to it over shared-memory rings{}{}",
                if *sshfs { "sshfs from a loopback sshd" } else { "bindfs" },
                if *backing { "--backing-handles " } else { "" },
                if *backing {
                    ", reads of read-only opens from the backing files bindfs opened"
                } else {
                    ""
                },
                if *cache {
                    ", the program's own page cache in front (run -o cache=on, the default for a remote daemon)"
                } else {
                    ", without the program's page cache (run -o cache=off)"
                }
            ),
        }
    }

    /// Whether files written here can be read back: `null` forgets every
    /// name, so only the `transport` suite's empty operations run on it.
    pub fn holds_files(&self) -> bool {
        !matches!(&self.kind, Kind::Shortfuse { fs, .. } | Kind::Shim { fs, .. } if fs == "null")
    }

    /// Whether this configuration runs its workload under the preload shim
    /// (`libshortfuse_preload.so`, or `libshortfuse_preload_sftp.so` for
    /// sftp, beside the `shortfuse` binary).
    pub fn needs_shim(&self) -> bool {
        matches!(
            self.kind,
            Kind::Preload { .. } | Kind::Shim { .. } | Kind::SftpShim { .. } | Kind::ServedDaemon { .. }
        )
    }

    /// Whether this configuration asked for FUSE over io_uring.
    pub fn wants_uring(&self) -> bool {
        matches!(&self.kind, Kind::Shortfuse { transport, .. } if transport == "uring")
    }

    /// Configurations by name; an unknown name is an error listing the known ones.
    pub fn select(names: &[String]) -> Result<Vec<Config>, String> {
        let all = Config::all();
        names
            .iter()
            .map(|n| {
                all.iter().find(|c| &c.name == n).cloned().ok_or_else(|| {
                    let known: Vec<_> = all.iter().map(|c| c.name.as_str()).collect();
                    format!("unknown configuration {n:?}; known: {}", known.join(", "))
                })
            })
            .collect()
    }
}

/// What a run needs from outside: where the shortfuse binary is and where
/// to put scratch files and built peers.
pub struct Env {
    pub shortfuse_bin: PathBuf,
    pub work: PathBuf,
}

/// A prepared configuration: `dir` is where the workload runs. Dropping it
/// unmounts and removes the scratch directories.
pub struct Prepared {
    pub dir: PathBuf,
    /// The directory the mount serves (the same as `dir` on native; for
    /// the network rows, the directory the loopback sshd serves).
    pub source: PathBuf,
    root: PathBuf,
    mountpoint: Option<PathBuf>,
    uring: bool,
    preload: bool,
    /// The loopback sshd of a network row, stopped after the unmount.
    server: Option<Sshd>,
    /// The `shortfuse serve` daemon of a ring row, stopped on drop.
    daemon: Option<std::process::Child>,
}

/// How to run a workload on a `preload` configuration's directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreloadWorker {
    /// The `shortfuse` binary (its `run` subcommand starts the worker).
    pub shortfuse_bin: PathBuf,
    /// The worker's mount (`shortfuse run -m` argument): the prepared
    /// directory, with the file system served in process or alone (the
    /// daemon serving it).
    pub mount: String,
    /// Environment the worker runs with (the shim's switches).
    pub env: Vec<(String, String)>,
    /// `-o` options of the mount (empty: none).
    pub options: String,
}

impl PreloadWorker {
    /// `shortfuse run -m MOUNT [-o OPTIONS] --` with the worker's
    /// environment: the program and its arguments follow.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.shortfuse_bin);
        c.args(["run", "-m", &self.mount]);
        if !self.options.is_empty() {
            c.args(["-o", &self.options]);
        }
        c.arg("--").envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }
}

/// The prepared `preload` directories: mount point -> worker. The suites
/// get a directory only, and a mount point of the shim exists nowhere else.
static PRELOAD: std::sync::Mutex<Vec<(PathBuf, PreloadWorker)>> = std::sync::Mutex::new(Vec::new());

/// The worker to start when `dir` is the mount point of a prepared
/// `preload` configuration.
pub fn preload_worker(dir: &Path) -> Option<PreloadWorker> {
    let list = PRELOAD.lock().unpoison();
    list.iter().find(|(d, _)| d == dir).map(|(_, w)| w.clone())
}

impl Prepared {
    /// For a configuration that asked for io_uring: an error unless the
    /// daemon served most requests over it (the mount falls back to
    /// /dev/fuse, with a warning only, when the kernel switch is off). Call
    /// after the workload, while still mounted.
    pub fn check_transport(&self, env: &Env) -> Result<(), String> {
        let Some(mnt) = self.mountpoint.as_deref().filter(|_| self.uring) else {
            return Ok(());
        };
        let (dev, uring) = transport_counts(env, mnt)?;
        if uring <= dev {
            return Err(format!(
                "asked for --transport uring but the daemon served {dev} requests over /dev/fuse and {uring} over io_uring (the mount fell back?)"
            ));
        }
        Ok(())
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if self.preload {
            PRELOAD.lock().unpoison().retain(|(d, _)| d != &self.dir);
        }
        if let Some(mnt) = self.mountpoint.take() {
            unmount(&mnt);
            cleanup::forget(&mnt);
        }
        drop(self.server.take());
        if let Some(mut d) = self.daemon.take() {
            // SIGTERM: the daemon removes its socket; SIGKILL if it hangs.
            let _ = Command::new("kill").arg(d.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(d.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
        cleanup::forget_scratch(&self.root);
    }
}

/// Starts `shortfuse serve FS [SRC] MNT` (rings only) and waits until it
/// says it serves; its output goes to `root/serve.log`.
fn start_daemon(env: &Env, fs: &str, src: &Path, mnt: &Path, root: &Path) -> Result<std::process::Child, String> {
    let mut args: Vec<std::ffi::OsString> = vec![fs.into()];
    if takes_source(fs) {
        args.push(src.into());
    }
    args.push(mnt.into());
    start_serve(env, &args, root)
}

/// Starts `shortfuse serve ARGS` and waits until it says it serves; its
/// output goes to `root/serve.log`.
fn start_serve(env: &Env, args: &[std::ffi::OsString], root: &Path) -> Result<std::process::Child, String> {
    let log_path = root.join("serve.log");
    let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let mut c = Command::new(&env.shortfuse_bin);
    c.arg("serve").args(args);
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("shortfuse serve: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if text.contains("shortfuse serve:") {
            return Ok(child);
        }
        if !matches!(child.try_wait(), Ok(None)) || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("shortfuse serve did not start: {}", text.trim()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Unmounts `mnt`, lazily if the normal unmount fails, and waits until the
/// mount table no longer lists it.
pub fn unmount(mnt: &Path) {
    let quiet = |c: &mut Command| {
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
    };
    if !quiet(Command::new("umount").arg(mnt)).unwrap_or(false) {
        let _ = quiet(Command::new("umount").arg("-l").arg(mnt));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while is_mounted(mnt) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `mnt` is a mount point in this process's mount table.
pub fn is_mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| t.lines().any(|l| l.split(' ').nth(4) == Some(&*want)))
        .unwrap_or(false)
}

/// Runs `cmd` to completion; an error carries its stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn wait_mounted(mnt: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_mounted(mnt) {
        if Instant::now() > deadline {
            return Err(format!("{} did not appear in the mount table", mnt.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The options that reach `server` by key with its own known_hosts (the
/// same names for sshfs and shortfuse's sftp).
fn sftp_options(server: &Sshd) -> String {
    format!(
        "port={},IdentityFile={},UserKnownHostsFile={},StrictHostKeyChecking=yes",
        server.port,
        server.client_key().display(),
        server.known_hosts().display()
    )
}

/// Whether `shortfuse mount FS` takes a SOURCE (`null` and `mem` keep
/// everything, or nothing, in the daemon; distfs is not measured here).
fn takes_source(fs: &str) -> bool {
    shortfuse_fs::registry::FsKind::find(fs).is_none_or(|k| k.source != shortfuse_fs::registry::Source::None)
}

/// Requests the daemon serving `mnt` received over each transport, from
/// `shortfuse stats MNT --json`: (dev, uring).
fn transport_counts(env: &Env, mnt: &Path) -> Result<(u64, u64), String> {
    let out = Command::new(&env.shortfuse_bin)
        .arg("stats")
        .arg(mnt)
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", env.shortfuse_bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "shortfuse stats {}: {}",
            mnt.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("shortfuse stats JSON: {e}"))?;
    let count = |t: &str| {
        v["transports"][t]
            .as_u64()
            .ok_or_else(|| format!("shortfuse stats JSON has no transports.{t}"))
    };
    Ok((count("dev")?, count("uring")?))
}

/// `name` in a directory of $PATH.
fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Builds libfuse's passthrough_ll from the sources shipped in
/// libfuse3-dev (once per work directory).
fn passthrough_ll(env: &Env) -> Result<PathBuf, String> {
    let examples = Path::new("/usr/share/doc/libfuse3-dev/examples");
    let bin = env.work.join("peers/passthrough_ll");
    if bin.exists() {
        return Ok(bin);
    }
    let dir = env.work.join("peers");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for f in ["passthrough_ll.c", "passthrough_helpers.h"] {
        std::fs::copy(examples.join(f), dir.join(f))
            .map_err(|e| format!("{}: {e} (is libfuse3-dev installed?)", examples.join(f).display()))?;
    }
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "fuse3"])
        .output()
        .map_err(|e| format!("pkg-config: {e}"))?;
    let flags = String::from_utf8_lossy(&flags.stdout).to_string();
    run(Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(dir.join("passthrough_ll.c"))
        .args(flags.split_whitespace()))?;
    Ok(bin)
}

impl Config {
    /// Makes a fresh source directory and, for FUSE configurations, mounts
    /// it. An error says why this configuration cannot run.
    pub fn prepare(&self, env: &Env) -> Result<Prepared, String> {
        let root = env.work.join(format!("run-{}-{}", self.name, std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let src = root.join("src");
        let mnt = root.join("mnt");
        std::fs::create_dir_all(&src).map_err(|e| format!("{}: {e}", src.display()))?;
        std::fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
        let mut prepared = Prepared {
            dir: src.clone(),
            source: src.clone(),
            root,
            mountpoint: None,
            uring: self.wants_uring(),
            preload: false,
            server: None,
            daemon: None,
        };
        cleanup::remember_scratch(&prepared.root);
        let mut cmd = match &self.kind {
            Kind::Native => return Ok(prepared),
            Kind::ServedDaemon { sshfs, cache, backing } => {
                let mut args: Vec<std::ffi::OsString> = Vec::new();
                if *backing {
                    args.push("--backing-handles".into());
                }
                args.push("--".into());
                if *sshfs {
                    let server = Sshd::start(&prepared.root.join("sshd"), &src)?;
                    let bin = find_in_path("sshfs").ok_or("sshfs is not installed (apt-get install sshfs)")?;
                    args.extend([bin.into(), "-f".into(), "-o".into()]);
                    args.push(format!("{},BatchMode=yes", sftp_options(&server)).into());
                    args.push(server.target().into());
                    prepared.server = Some(server);
                } else {
                    let bin = find_in_path("bindfs").ok_or("bindfs is not installed (apt-get install bindfs)")?;
                    args.extend([bin.into(), "-f".into(), src.clone().into()]);
                }
                args.push(mnt.clone().into());
                cleanup::remember(&mnt);
                prepared.mountpoint = Some(mnt.clone());
                prepared.daemon = Some(start_serve(env, &args, &prepared.root)?);
                let worker = PreloadWorker {
                    shortfuse_bin: env.shortfuse_bin.clone(),
                    mount: mnt.display().to_string(),
                    env: vec![],
                    // Said either way: `auto` turns the cache on for a remote
                    // daemon (sshfs), and `sshfs-ring` measures the rings alone.
                    options: if *cache { "cache=on" } else { "cache=off" }.into(),
                };
                PRELOAD.lock().unpoison().push((mnt.clone(), worker));
                prepared.dir = mnt;
                prepared.preload = true;
                return Ok(prepared);
            }
            Kind::Preload { .. } | Kind::Shim { .. } | Kind::SftpShim { .. } => {
                // The mount point exists only for the worker's shim.
                std::fs::remove_dir(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
                // `run` loads the shim built with sftp for an sftp mount.
                let (name, package) = match &self.kind {
                    Kind::SftpShim { .. } => ("libshortfuse_preload_sftp.so", "shortfuse-preload-sftp"),
                    _ => ("libshortfuse_preload.so", "shortfuse-preload"),
                };
                let so = env.shortfuse_bin.with_file_name(name);
                if !so.is_file() {
                    return Err(format!(
                        "{} is missing (built by cargo build -p {package})",
                        so.display()
                    ));
                }
                let mount = match &self.kind {
                    Kind::Shim { fs, ring: true } => {
                        prepared.daemon = Some(start_daemon(env, fs, &src, &mnt, &prepared.root)?);
                        mnt.display().to_string()
                    }
                    Kind::Shim { fs, .. } if !takes_source(fs) => format!("{}={fs}", mnt.display()),
                    Kind::Shim { fs, .. } => format!("{}={fs}:{}", mnt.display(), src.display()),
                    _ => format!("{}=passthrough:{}", mnt.display(), src.display()),
                };
                let mut options = String::new();
                let mount = match &self.kind {
                    Kind::SftpShim { cache } => {
                        let server = Sshd::start(&prepared.root.join("sshd"), &src)?;
                        options = format!("{},cache={}", sftp_options(&server), if *cache { "on" } else { "off" });
                        let mount = format!("{}=sftp:{}", mnt.display(), server.target());
                        prepared.server = Some(server);
                        mount
                    }
                    _ => mount,
                };
                let worker = PreloadWorker {
                    shortfuse_bin: env.shortfuse_bin.clone(),
                    mount,
                    env: match &self.kind {
                        Kind::Preload { maps: false } => vec![("SHORTFUSE_MAPS".into(), "off".into())],
                        _ => vec![],
                    },
                    options,
                };
                PRELOAD.lock().unpoison().push((mnt.clone(), worker));
                prepared.dir = mnt;
                prepared.preload = true;
                return Ok(prepared);
            }
            Kind::Shortfuse {
                fs,
                transport,
                opts,
                threads,
            } => {
                let mut c = Command::new(&env.shortfuse_bin);
                c.arg("mount").arg(fs);
                if takes_source(fs) {
                    c.arg(&src);
                }
                c.arg(&mnt).args(["--transport", transport]);
                if !opts.is_empty() {
                    c.args(["-o", opts]);
                }
                if let Some(t) = threads {
                    c.args(["--threads", &t.to_string()]);
                }
                c
            }
            Kind::Bindfs { args } => {
                let mut c = Command::new("bindfs");
                c.args(args).arg(&src).arg(&mnt);
                c
            }
            Kind::Sftp | Kind::Sshfs { .. } => {
                let client = if self.kind == Kind::Sftp {
                    env.shortfuse_bin.clone()
                } else {
                    find_in_path("sshfs").ok_or("sshfs is not installed (apt-get install sshfs)")?
                };
                let server = Sshd::start(&prepared.root.join("sshd"), &src)?;
                let mut c = Command::new(client);
                if self.kind == Kind::Sftp {
                    c.args(["mount", "sftp"]);
                }
                c.arg(server.target()).arg(&mnt).args(["-o", &sftp_options(&server)]);
                match self.kind {
                    Kind::Sftp => {
                        c.args(["--transport", "dev"]);
                    }
                    Kind::Sshfs { direct_io } => {
                        // No terminal to ask for a password on.
                        c.args(["-o", "BatchMode=yes"]);
                        if direct_io {
                            c.args(["-o", "direct_io"]);
                        }
                    }
                    _ => {}
                }
                prepared.server = Some(server);
                c
            }
            Kind::PassthroughLl => {
                let mut c = Command::new(passthrough_ll(env)?);
                c.arg("-o")
                    .arg(format!("source={},cache=always,writeback", src.display()))
                    .arg(&mnt);
                c
            }
        };
        cleanup::remember(&mnt);
        prepared.mountpoint = Some(mnt.clone());
        run(&mut cmd)?;
        wait_mounted(&mnt)?;
        prepared.dir = mnt;
        Ok(prepared)
    }
}
