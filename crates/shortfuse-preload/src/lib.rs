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
mod mounts;
mod sys;
mod user;
mod zpoline;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use shortfuse_vfs::{FdTable, Location, Vfs};

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

/// The LD_PRELOAD constructor.
extern "C" fn init() {
    let Ok(spec) = std::env::var("SHORTFUSE_MOUNTS") else {
        return;
    };
    let state = match mounts::build(&spec) {
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
