//! `shortfuse run -m MOUNTPOINT=FS[:SOURCE] [-m ...] [-o OPTS] -- PROGRAM
//! ARGS...`: starts PROGRAM with the preload shim (`libshortfuse_preload.so`,
//! or `libshortfuse_preload_sftp.so` when a mount is sftp's) loaded, so that its file calls on the mounts are served inside its own
//! process, without FUSE and without a kernel mount.
//!
//! The mounts travel in `SHORTFUSE_MOUNTS` (format in
//! `shortfuse_vfs::spec`), the shim in `LD_PRELOAD`: every process PROGRAM
//! starts inherits both, and with them the mounts. We check everything we
//! can before the exec (file system names, sources, options), since the
//! shim can only complain on stderr and run without its mounts.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use shortfuse::cache::{CacheOptions, CACHE_KEYS};
use shortfuse::MountOptions;
use shortfuse_fs::registry::{bundled, FsKind, Source, LOCAL};
use shortfuse_vfs::spec::{check_distinct, format_mounts, MountSpec, RUN_MOUNT_OPTIONS};

use crate::filesystems;

/// The shim's file name, next to the `shortfuse` binary: it builds the
/// local file systems ([`LOCAL`]) in process and serves `serve` daemons.
pub const SHIM: &str = "libshortfuse_preload.so";

/// The shim built with sftp too, loaded only when a mount needs it: the SSH
/// client, its async runtime and crypto are about half of what the dynamic
/// loader relocates in the shim, which every process under `run` pays
/// before its first instruction.
pub const SHIM_SFTP: &str = "libshortfuse_preload_sftp.so";

/// The shim that serves `specs`: the one every process can load cheaply
/// unless a mount's file system is built in process and not among those it
/// links.
pub fn shim_for(specs: &[MountSpec]) -> &'static str {
    let light = |m: &MountSpec| m.is_daemon() || LOCAL.iter().any(|k| k.name == m.fs);
    if specs.iter().all(light) {
        SHIM
    } else {
        SHIM_SFTP
    }
}

/// Exit status for a bad command line (clap's usage errors use it too).
const USAGE: u8 = 2;

#[derive(clap::Args)]
pub struct RunArgs {
    /// A mount for the program and its children: MOUNTPOINT=mem or
    /// MOUNTPOINT=passthrough:SOURCE (served in process), or MOUNTPOINT
    /// alone (the `shortfuse serve` daemon of that mount point, shared by
    /// every program). The mount point need not exist.
    #[arg(
        short = 'm',
        long = "mount",
        value_name = "MOUNTPOINT[=FS[:SOURCE]]",
        required = true
    )]
    mounts: Vec<String>,
    /// Options for every mount, comma-separated: ro, attr_timeout=S,
    /// entry_timeout=S, negative_timeout=S, the cache's (cache=on|off|auto,
    /// page_size=, page_cache_size=, ..., config=FILE) and the file
    /// system's own (passthrough: symlinks=raw|beneath, one_file_system).
    /// May be repeated.
    #[arg(short = 'o', value_name = "OPT[,OPT...]")]
    options: Vec<String>,
    /// Append the in-process caches' statistics to FILE as each process
    /// image exits: one JSON line per mount with a cache (sets
    /// SHORTFUSE_STATS=FILE for the program and its children).
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    /// Set vm.mmap_min_addr to 0 (as root) when it is not, so that processes
    /// without CAP_SYS_RAWIO (a program that drops root, or is setuid to
    /// another user) get the rewritten fast path too. Machine-wide and left
    /// so: every process on the machine may then map page 0, which turns
    /// the kernel's NULL-pointer bugs into exploitable ones. Also set by
    /// SHORTFUSE_ZERO_PAGE=1.
    #[arg(long)]
    zero_page: bool,
    /// The program and its arguments (after `--`).
    #[arg(
        value_name = "PROGRAM",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    program: Vec<OsString>,
}

pub fn after_help() -> String {
    let mut s = String::from("File systems served in process:\n");
    for kind in bundled().filter(|k| k.in_process) {
        let src = kind
            .source
            .describe()
            .map(|s| format!(" (SOURCE = {s})"))
            .unwrap_or_default();
        s.push_str(&format!("  {}{src}\n", kind.name));
    }
    s.push_str("\nOptions (-o):\n");
    for (k, v) in RUN_MOUNT_OPTIONS {
        s.push_str(&format!("  {k:<26}{v}\n"));
    }
    s.push_str(
        "\nEvery process started by PROGRAM inherits the mounts (through SHORTFUSE_MOUNTS and LD_PRELOAD in \
         its environment), but each process image serves them itself: a `mem` mount lives in one process \
         image, and every program it execs starts with its own empty one (sharing comes with the daemon \
         over shared-memory rings); a passthrough mount is shared through its SOURCE directory. At exec, \
         descriptors of passthrough mounts that are not close-on-exec become kernel descriptors of their \
         backing files (so `cmd > /mnt/file` works in a shell), and a current directory inside a mount is \
         kept; descriptors of `mem` mounts do not survive exec.\n\
         \nThe shim rewrites each system call site into a call to a trampoline at address 0, which root \
         (CAP_SYS_RAWIO) may map whatever vm.mmap_min_addr says. Other users need vm.mmap_min_addr = 0, \
         which run leaves alone unless asked (--zero-page, as root; it weakens the whole machine): \
         without it the shim serves with Syscall User Dispatch alone, a SIGSYS signal for every system \
         call the program makes, about 3 us more per call than the rewritten path (dd bs=1 of 200 kB, \
         400 000 calls: 1.9 s against 0.65 s; 0.14 s natively).\n\
         \nExit status: PROGRAM's; 2 for a bad mount or option; 126/127 when PROGRAM cannot be run.\n\
         \nExamples:\n  shortfuse run -m /mnt/m=mem -- python3 build.py\n  \
         shortfuse run -m /data=passthrough:/srv/data -o ro -- bash -c 'ls -lR /data | wc -l'",
    );
    s
}

/// Validates the mounts, prepares the environment and execs PROGRAM; only
/// returns when that fails.
pub fn main(args: RunArgs) -> ExitCode {
    let (specs, told) = match specs(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("shortfuse run: {e}");
            return ExitCode::from(USAGE);
        }
    };
    let shim = match shim_path(shim_for(&specs)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("shortfuse run: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.zero_page || std::env::var_os("SHORTFUSE_ZERO_PAGE").is_some_and(|v| v == "1") {
        page_zero();
    }
    if let Some(msg) = unreachable_argument(&args.program, &specs) {
        eprintln!("shortfuse run: {msg}");
        return ExitCode::from(126);
    }
    // A program on a mount is not in the kernel's file system, and this
    // process has no shim to find it: a copy of this binary with the shim
    // loaded (see [`TRAMPOLINE`]) execs it, through the shim's exec path.
    let mut cmd = if program_in_mount(&args.program[0], &specs) {
        let exe = match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("shortfuse run: cannot find the shortfuse binary: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut c = Command::new(exe);
        c.arg(TRAMPOLINE).args(&args.program);
        c
    } else {
        let mut c = Command::new(&args.program[0]);
        c.args(&args.program[1..]);
        c
    };
    cmd.env("SHORTFUSE_MOUNTS", format_mounts(&specs));
    cmd.env("LD_PRELOAD", ld_preload(&shim, std::env::var_os("LD_PRELOAD")));
    // A current directory handed over by an outer `run` means nothing here.
    cmd.env_remove("SHORTFUSE_CWD");
    // What the daemons told us, so that each process connects only when it
    // first needs its daemon (see `shortfuse_ring::Told`).
    if told.is_empty() {
        cmd.env_remove(shortfuse_ring::TOLD_VAR);
    } else {
        cmd.env(shortfuse_ring::TOLD_VAR, shortfuse_ring::encode_told(&told));
    }
    if let Some(f) = &args.stats {
        // Absolute: the program's processes may run anywhere.
        let f = std::env::current_dir().map(|d| d.join(f)).unwrap_or_else(|_| f.clone());
        cmd.env("SHORTFUSE_STATS", f);
    }
    exec_failed(&args.program[0], cmd.exec())
}

/// The first argument that makes `shortfuse` exec the rest as a program
/// (with the shim loaded, from `run`): the kernel cannot exec a program
/// that lies on a mount served in process or by a `serve` daemon, but the
/// shim's exec can (the backing file of a passthrough, a copy of the file
/// otherwise).
pub const TRAMPOLINE: &str = "__run-exec";

/// `shortfuse __run-exec PROGRAM ARGS...`: execs PROGRAM (found in PATH
/// as execvp does); only returns when that fails.
pub fn trampoline(program: &[OsString]) -> ExitCode {
    let Some(prog) = program.first() else {
        eprintln!("shortfuse run: no program");
        return ExitCode::from(USAGE);
    };
    use std::os::unix::ffi::OsStrExt;
    let Ok(args) = program
        .iter()
        .map(|a| std::ffi::CString::new(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
    else {
        return exec_failed(prog, std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // libc's execvp, not std's Command: the shim serves the execve it makes.
    // SAFETY: NUL-terminated strings and a NULL-terminated vector, alive
    // across the call.
    unsafe { libc::execvp(argv[0], argv.as_ptr()) };
    exec_failed(prog, std::io::Error::last_os_error())
}

/// The report and exit status of a failed exec of `prog`.
fn exec_failed(prog: &OsString, e: std::io::Error) -> ExitCode {
    eprintln!("shortfuse run: {}: {e}", Path::new(prog).display());
    ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// Whether `path` (absolute) is a mount point of `specs` or lies beneath one.
fn in_mount(path: &[u8], specs: &[MountSpec]) -> bool {
    let a = shortfuse_vfs::normalize(path);
    a.starts_with(b"/")
        && specs.iter().any(|m| {
            let mp = shortfuse_vfs::normalize(m.mountpoint.as_bytes());
            a.strip_prefix(mp.as_slice())
                .is_some_and(|r| r.is_empty() || r[0] == b'/')
        })
}

/// Whether exec'ing `prog` may need a mount: its path (made absolute) is in
/// one, or, for a bare name, a directory of PATH is.
fn program_in_mount(prog: &OsString, specs: &[MountSpec]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let inside = |p: &Path| in_mount(absolute(&cwd, p).as_bytes(), specs);
    if prog.as_bytes().contains(&b'/') {
        return inside(Path::new(prog));
    }
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|d| inside(&d)))
}

/// Why PROGRAM cannot be run: it is linked statically (the shim never
/// loads into it, so only the kernel serves its calls) and an argument
/// names a path in a mount whose mount point is not a kernel mount, where
/// it would reach whatever the kernel has at that path.
fn unreachable_argument(program: &[OsString], specs: &[MountSpec]) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileExt;
    let prog = Path::new(&program[0]);
    let found = if prog.as_os_str().as_bytes().contains(&b'/') {
        Some(prog.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(prog))
                .find(|p| p.is_file())
        })
    };
    let file = std::fs::File::open(found?).ok()?;
    if !shortfuse_vfs::elf::is_static_elf(&mut |off, buf| file.read_at(buf, off).unwrap_or(0)) {
        return None;
    }
    let arg = program[1..].iter().find(|a| {
        specs
            .iter()
            .any(|m| !kernel_mount(Path::new(&m.mountpoint)) && in_mount(a.as_bytes(), std::slice::from_ref(m)))
    })?;
    Some(format!(
        "{}: refused: the program is statically linked, so the mounts cannot be served in it, and its argument {} \
         is in a mount that the kernel cannot reach",
        prog.display(),
        Path::new(arg).display()
    ))
}

/// Whether `mp` is a FUSE mount in the kernel (a `shortfuse serve` daemon
/// mounted beside its rings).
fn kernel_mount(mp: &Path) -> bool {
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    let Ok(c) = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: a NUL-terminated path and a statfs buffer of the right size.
    let r = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    // SAFETY: filled in by a successful statfs (zeroed otherwise).
    r == 0 && unsafe { st.assume_init() }.f_type == FUSE_SUPER_MAGIC
}

/// What each daemon told, by normalised mount point.
type ToldByMount = Vec<(Vec<u8>, shortfuse_ring::Told)>;

/// The mounts of the command line, with `-o` applied to each, checked as
/// far as can be done before the program runs, and what the daemons of
/// those served by one told us when we connected to check them (by
/// normalised mount point).
fn specs(args: &RunArgs) -> Result<(Vec<MountSpec>, ToldByMount), String> {
    let options = args
        .options
        .iter()
        .filter(|o| !o.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    let options = expand_cache_config(&options)?;
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let mut specs = Vec::new();
    let mut told = Vec::new();
    for m in &args.mounts {
        let Some((mp, rest)) = m.split_once('=') else {
            // No file system: the `shortfuse serve` daemon of that mount point.
            let spec = MountSpec::daemon(absolute(&cwd, Path::new(m)), options.clone());
            spec.check_syntax().map_err(|e| format!("-m {m}: {e}"))?;
            let ring = shortfuse_vfs::Ring::connect(spec.mountpoint.as_bytes()).map_err(|e| format!("-m {m}: {e}"))?;
            if let Some(t) = ring.client().and_then(|c| c.told()) {
                told.push((shortfuse_vfs::normalize(spec.mountpoint.as_bytes()), t));
            }
            specs.push(spec);
            continue;
        };
        let (fs, source) = match rest.split_once(':') {
            Some((f, s)) => (f, Some(s.to_string())),
            None => (rest, None),
        };
        let mut spec = MountSpec {
            mountpoint: absolute(&cwd, Path::new(mp)),
            fs: fs.to_string(),
            source,
            options: options.clone(),
        };
        spec.check_syntax().map_err(|e| format!("-m {m}: {e}"))?;
        let kind = in_process_kind(&spec.fs).map_err(|e| format!("-m {m}: {e}"))?;
        match (kind.source, &spec.source) {
            // Connected once now, for a clear error before the program
            // runs; the shim gets the absolute remote path, so that each
            // process image connects only when it uses the mount.
            (Source::Remote(_), _) => spec.source = Some(remote_resolved(&spec).map_err(|e| format!("-m {m}: {e}"))?),
            // Several directories, created by the file system when missing.
            (Source::Dirs(_), Some(src)) => {
                let dirs: Vec<String> = src.split(',').map(|d| absolute(&cwd, Path::new(d))).collect();
                spec.source = Some(dirs.join(","));
            }
            (_, Some(src)) => {
                let src = std::fs::canonicalize(absolute(&cwd, Path::new(src)))
                    .map_err(|e| format!("-m {m}: source {src}: {e}"))?;
                spec.source = Some(src.to_string_lossy().into_owned());
            }
            (_, None) => {}
        }
        spec.check_syntax().map_err(|e| format!("-m {m}: {e}"))?;
        if !matches!(kind.source, Source::Remote(_)) {
            check_fs(&spec).map_err(|e| format!("-m {m}: {e}"))?;
        }
        let run = spec.run_options()?;
        if let Some(line) = run.cache.describe(&spec.fs, kind.network) {
            eprintln!("shortfuse run: {}: {line}", spec.mountpoint);
        }
        specs.push(spec);
    }
    check_distinct(&specs)?;
    Ok((specs, told))
}

/// A `config=FILE` among the options is read here, once, and replaced by
/// the cache options it gives (with the other cache options applied over
/// them): every process of the program then gets the values, whatever its
/// current directory, without reading the file again.
fn expand_cache_config(options: &str) -> Result<String, String> {
    let items: Vec<&str> = options.split(',').filter(|i| !i.is_empty()).collect();
    let key = |i: &str| i.split_once('=').map_or(i, |(k, _)| k).to_string();
    if !items.iter().any(|i| key(i) == "config") {
        return Ok(options.to_string());
    }
    let mut cache: shortfuse::options::FsOptions = items
        .iter()
        .filter(|i| CACHE_KEYS.contains(&key(i).as_str()))
        .map(|i| (key(i), i.split_once('=').map(|(_, v)| v.to_string())))
        .collect();
    let cache = CacheOptions::take_from(&mut cache)?;
    let mut out: Vec<String> = items
        .iter()
        .filter(|i| !CACHE_KEYS.contains(&key(i).as_str()))
        .map(|i| i.to_string())
        .collect();
    out.push(cache.to_options());
    Ok(out.join(","))
}

/// The remote (sftp) SOURCE with its path made absolute on the server.
fn remote_resolved(spec: &MountSpec) -> Result<String, String> {
    let target = spec
        .source
        .as_deref()
        .ok_or("sftp needs a SOURCE: [user@]host:[path]")?;
    let run = spec.run_options()?;
    let fs = shortfuse_fs::sftp::SftpFs::connect(target, &run.fs).map_err(|e| e.to_string())?;
    shortfuse_fs::sftp::config::with_remote_path(target, &fs.root())
        .ok_or_else(|| format!("sftp: {target:?} is not [user@]host:[path]"))
}

/// `p` made absolute against `cwd`, lexically normalised.
pub fn absolute(cwd: &Path, p: &Path) -> String {
    let joined = cwd.join(p);
    let norm = shortfuse_vfs::normalize(joined.as_os_str().as_encoded_bytes());
    String::from_utf8_lossy(&norm).into_owned()
}

/// The file system called `name`, when the shim builds it in process.
fn in_process_kind(name: &str) -> Result<&'static FsKind, String> {
    match filesystems::all().find(|k| k.name == name) {
        Some(kind) if kind.in_process => Ok(kind),
        known => {
            let served: Vec<&str> = bundled().filter(|k| k.in_process).map(|k| k.name).collect();
            let hint = match known {
                Some(_) => format!(" (mount {name} with `shortfuse mount` instead)"),
                None => String::new(),
            };
            Err(format!(
                "unknown file system {name:?} for run: choose {}{hint}",
                served.join(", ")
            ))
        }
    }
}

/// The shim builds the file system here too: the source exists and is a
/// directory, the file system knows its options.
fn check_fs(spec: &MountSpec) -> Result<(), String> {
    let run = spec.run_options()?;
    let mut scratch = MountOptions::default();
    // Building a passthrough raises RLIMIT_NOFILE (as a daemon wants); the
    // program must start with the limit it was given.
    let mut saved = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `saved` is a valid out-pointer for getrlimit.
    let have = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut saved) } == 0;
    let built = filesystems::build(&spec.fs, spec.source.as_deref().map(Path::new), &run.fs, &mut scratch)
        .map(drop)
        .map_err(|e| e.to_string());
    if have {
        // SAFETY: `saved` is a valid in-pointer; lowering a limit needs no privilege.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &saved) };
    }
    built
}

/// The shim called `name` ([`SHIM`] or [`SHIM_SFTP`]) next to this binary.
pub(crate) fn shim_path(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the shortfuse binary: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let so = dir.join(name);
    if !so.is_file() {
        return Err(format!(
            "the preload shim {} is missing: build it next to shortfuse ({})",
            so.display(),
            build_hint(dir, name)
        ));
    }
    let s = so.to_string_lossy();
    if s.contains([' ', ':']) {
        return Err(format!(
            "the preload shim's path {s} holds a space or a colon, which LD_PRELOAD cannot carry"
        ));
    }
    Ok(so)
}

/// The command that builds the shim called `name` where a `shortfuse` in
/// `dir` looks for it: cargo puts each profile in its own directory, so a
/// release binary needs a release build of the shim (a plain `cargo build`
/// makes a debug copy it never finds).
fn build_hint(dir: &Path, name: &str) -> String {
    // The package is named as its library, with dashes.
    let package = name.trim_start_matches("lib").trim_end_matches(".so").replace('_', "-");
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => format!("cargo build -p {package}"),
        Some("release") => format!("cargo build --release -p {package}"),
        Some(profile) if dir.parent().is_some_and(|p| p.join("CACHEDIR.TAG").is_file()) => {
            format!("cargo build --profile {profile} -p {package}")
        }
        _ => format!(
            "cargo build --release -p {package}, then copy target/release/{name} to {}",
            dir.display()
        ),
    }
}

/// LD_PRELOAD with the shim first (the program's own preloads follow). A
/// shim an outer `run` preloaded, of either build or another build
/// directory, goes: two shims in one process would both rewrite its calls.
pub(crate) fn ld_preload(shim: &Path, existing: Option<OsString>) -> OsString {
    let is_shim = |p: &Path| p == shim || p.file_name().is_some_and(|n| n == SHIM || n == SHIM_SFTP);
    let mut v = OsString::from(shim);
    if let Some(old) = existing {
        let rest: Vec<_> = old
            .to_string_lossy()
            .split([' ', ':'])
            .filter(|p| !p.is_empty() && !is_shim(Path::new(p)))
            .map(str::to_string)
            .collect();
        if !rest.is_empty() {
            v.push(":");
            v.push(rest.join(":"));
        }
    }
    v
}

/// --zero-page: vm.mmap_min_addr = 0, so that processes without
/// CAP_SYS_RAWIO can map the trampoline page.
fn page_zero() {
    const KNOB: &str = "/proc/sys/vm/mmap_min_addr";
    let now = match std::fs::read_to_string(KNOB) {
        Ok(v) => v.trim().to_string(),
        Err(e) => {
            eprintln!("shortfuse run: --zero-page: {KNOB}: {e}");
            return;
        }
    };
    if now == "0" {
        return;
    }
    match std::fs::write(KNOB, "0") {
        Ok(()) => eprintln!(
            "shortfuse run: set vm.mmap_min_addr from {now} to 0 for the whole machine (--zero-page); \
             `sysctl vm.mmap_min_addr={now}` puts it back"
        ),
        Err(e) => eprintln!(
            "shortfuse run: --zero-page: cannot set vm.mmap_min_addr from {now} to 0 ({e}; it takes root): \
             processes without CAP_SYS_RAWIO run with Syscall User Dispatch alone"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_builds_the_shim_in_the_binary_s_own_profile() {
        assert_eq!(
            build_hint(Path::new("/w/target/debug"), SHIM),
            "cargo build -p shortfuse-preload"
        );
        assert_eq!(
            build_hint(Path::new("/w/target/release"), SHIM_SFTP),
            "cargo build --release -p shortfuse-preload-sftp"
        );
        assert!(build_hint(Path::new("/usr/local/bin"), SHIM)
            .contains("copy target/release/libshortfuse_preload.so to /usr/local/bin"));
    }

    #[test]
    fn only_an_sftp_mount_loads_the_shim_built_with_sftp() {
        let spec = |fs: &str| MountSpec {
            mountpoint: "/m".into(),
            fs: fs.into(),
            source: Some("/s".into()),
            options: String::new(),
        };
        let daemon = MountSpec::daemon("/d".into(), String::new());
        assert_eq!(shim_for(&[spec("passthrough"), spec("mem"), daemon.clone()]), SHIM);
        assert_eq!(shim_for(&[spec("passthrough"), spec("sftp")]), SHIM_SFTP);
    }

    #[test]
    fn the_shim_goes_first_in_ld_preload() {
        let shim = Path::new("/t/libshortfuse_preload.so");
        assert_eq!(ld_preload(shim, None), OsString::from("/t/libshortfuse_preload.so"));
        assert_eq!(
            ld_preload(shim, Some("/a.so /t/libshortfuse_preload.so:/b.so".into())),
            OsString::from("/t/libshortfuse_preload.so:/a.so:/b.so")
        );
        // An outer run's shim of the other build, from elsewhere.
        assert_eq!(
            ld_preload(shim, Some("/u/libshortfuse_preload_sftp.so:/a.so".into())),
            OsString::from("/t/libshortfuse_preload.so:/a.so")
        );
    }

    #[test]
    fn a_cache_config_file_becomes_options() {
        assert_eq!(expand_cache_config("ro,cache=on").unwrap(), "ro,cache=on");
        let f = std::env::temp_dir().join(format!("sf-run-cache-{}.toml", std::process::id()));
        std::fs::write(&f, "cache = true\npage_size = 65536\nreadahead = 2\n").unwrap();
        let out = expand_cache_config(&format!("ro,readahead=3,config={}", f.display())).unwrap();
        std::fs::remove_file(&f).unwrap();
        assert!(out.starts_with("ro,cache=on,page_size=65536,"), "{out}");
        assert!(out.contains("readahead=3") && !out.contains("config="), "{out}");
        assert!(expand_cache_config("config=/nonexistent/cache.toml").is_err());
    }

    #[test]
    fn mount_points_are_made_absolute() {
        assert_eq!(absolute(Path::new("/w"), Path::new("m/../n/")), "/w/n");
        assert_eq!(absolute(Path::new("/w"), Path::new("/x//y")), "/x/y");
    }
}
