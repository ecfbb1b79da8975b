//! shortfuse-preload: loaded with LD_PRELOAD, it serves the system calls of
//! an unmodified program on shortfuse mounts inside the program's own
//! process (Prefuse).
//!
//! At load time the constructor reads `SHORTFUSE_MOUNTS`
//! (`MOUNTPOINT=FS[:SOURCE]`, several separated by `;`, FS being `mem` or
//! `passthrough`), builds each file system in process behind a
//! `shortfuse_vfs::Vfs`, then rewrites every `syscall` instruction of the
//! loaded objects into a call to our hook ([`zpoline`]).
//!
//! The hook sends every call that is not a file call straight to the kernel.
//! File calls on mount paths and mount descriptors are served by the VFS;
//! others go to the kernel unchanged (or with the path resolved for them,
//! when a walk left a mount through `..` or a symbolic link). Our own work
//! runs with a per-thread flag set, so the system calls of the file system
//! and of our allocator reach the kernel directly.
//!
//! Descriptors of the mount are real kernel descriptor numbers: an O_PATH
//! open of /dev/null holds each number, so the kernel never hands it out
//! twice. Calls we do not serve on such a descriptor (mmap, poll, ...) reach
//! the kernel and fail on the placeholder.
//!
//! Not yet: Syscall User Dispatch for code loaded after start-up (dlopen,
//! JIT) — such code bypasses the mount; handing descriptors and the
//! current directory over `exec`; state shared between processes (a `mem`
//! mount is private to each process image, fork copies it); signal handlers
//! that touch the mount while the interrupted thread is inside the hook.

#![deny(unsafe_code)]

mod calls;
mod sys;
mod user;
mod zpoline;

use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use shortfuse::{Filesystem, MountOptions, Stats};
use shortfuse_vfs::{Creds, FdTable, InProcess, Location, Vfs};

/// Everything the shim knows; built once by the constructor.
pub(crate) struct State {
    pub mounts: Vec<Arc<Vfs>>,
    pub fds: FdTable,
    /// The current directory when it is inside a mount.
    pub cwd: Mutex<Option<(Arc<Vfs>, Location)>>,
    /// The kernel's current directory (kept in step with chdir/fchdir).
    pub host_cwd: Mutex<Vec<u8>>,
}

static STATE: OnceLock<State> = OnceLock::new();
static ACTIVE: AtomicBool = AtomicBool::new(false);

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

pub(crate) fn state() -> &'static State {
    // The hook only runs this after ACTIVE is set, which follows the set.
    STATE.get().expect("shortfuse-preload state")
}

fn build_fs(spec: &str) -> Result<Arc<dyn Filesystem>, String> {
    let (name, source) = match spec.split_once(':') {
        Some((n, s)) => (n, Some(s)),
        None => (spec, None),
    };
    match (name, source) {
        ("mem", None) => Ok(Arc::new(shortfuse_fs::mem::MemFs::new())),
        ("passthrough", Some(src)) => shortfuse_fs::passthrough::PassthroughFs::new(Path::new(src))
            .map(|fs| Arc::new(fs) as Arc<dyn Filesystem>)
            .map_err(|e| format!("passthrough {src}: {e}")),
        ("passthrough", None) => Err("passthrough needs a source: passthrough:/dir".into()),
        _ => Err(format!("unknown file system {spec:?} (mem, passthrough:SOURCE)")),
    }
}

fn build(spec: &str) -> Result<State, String> {
    let mut mounts = Vec::new();
    let creds = Creds {
        uid: sys::raw(libc::SYS_geteuid, 0, 0, 0, 0, 0, 0) as u32,
        gid: sys::raw(libc::SYS_getegid, 0, 0, 0, 0, 0, 0) as u32,
        pid: sys::raw(libc::SYS_getpid, 0, 0, 0, 0, 0, 0) as u32,
    };
    let umask = sys::raw(libc::SYS_umask, 0o022, 0, 0, 0, 0, 0);
    sys::raw(libc::SYS_umask, umask, 0, 0, 0, 0, 0);
    for (i, m) in spec.split(';').filter(|s| !s.is_empty()).enumerate() {
        let (mp, fs) = m
            .split_once('=')
            .ok_or_else(|| format!("mount {m:?}: expected MOUNTPOINT=FS"))?;
        if !mp.starts_with('/') {
            return Err(format!("mount point {mp:?} is not absolute"));
        }
        let fs = build_fs(fs)?;
        let backend = InProcess::new(fs, MountOptions::default(), Arc::new(Stats::new()));
        // A device number no disk uses: major 0 is for anonymous devices.
        let dev = 0xf5_0000 + i as u64;
        let vfs = Vfs::new(Box::new(backend), &shortfuse_vfs::normalize(mp.as_bytes()), dev, creds)
            .map_err(|e| format!("mount {mp}: {e}"))?;
        vfs.set_umask(umask as u32);
        mounts.push(Arc::new(vfs));
    }
    let cwd = std::env::current_dir()
        .map(|p| p.as_os_str().as_encoded_bytes().to_vec())
        .unwrap_or_else(|_| b"/".to_vec());
    Ok(State {
        mounts,
        fds: FdTable::new(),
        cwd: Mutex::new(None),
        host_cwd: Mutex::new(cwd),
    })
}

/// The LD_PRELOAD constructor.
extern "C" fn init() {
    let Ok(spec) = std::env::var("SHORTFUSE_MOUNTS") else {
        return;
    };
    let state = match build(&spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("shortfuse-preload: {e}; running without mounts");
            return;
        }
    };
    if STATE.set(state).is_err() {
        return;
    }
    match zpoline::install() {
        Ok(n) => {
            if std::env::var_os("SHORTFUSE_DEBUG").is_some() {
                eprintln!("shortfuse-preload: {n} system-call sites rewritten");
            }
            ACTIVE.store(true, Ordering::Release);
        }
        Err(zpoline::SetupError::Page0(errno)) => eprintln!(
            "shortfuse-preload: cannot map the trampoline at address 0 (errno {errno}): set vm.mmap_min_addr=0 \
             (Syscall User Dispatch fallback not implemented); mounts are not served"
        ),
        Err(zpoline::SetupError::Maps(e)) => eprintln!("shortfuse-preload: /proc/self/maps: {e}"),
    }
}

#[used]
#[allow(unsafe_code)]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// Called by the trampoline for every rewritten system call.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn shortfuse_hook(a1: i64, a2: i64, a3: i64, a4: i64, a5: i64, a6: i64, nr: i64) -> i64 {
    if calls::is_file_call(nr) && ACTIVE.load(Ordering::Acquire) {
        let outer = IN_HOOK.with(|f| !f.replace(true));
        if outer {
            let r = calls::dispatch(nr, [a1, a2, a3, a4, a5, a6]);
            IN_HOOK.with(|f| f.set(false));
            if let Some(r) = r {
                return r;
            }
        }
    }
    sys::raw(nr, a1, a2, a3, a4, a5, a6)
}
