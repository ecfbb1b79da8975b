//! Every mount a run makes is remembered here, so that Ctrl-C or SIGTERM
//! unmounts them all before the process exits.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

static ACTIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static WATCH: Once = Once::new();

/// Notes a mount that must be undone on interruption.
pub fn remember(mnt: &Path) {
    ACTIVE.lock().unwrap_or_else(|e| e.into_inner()).push(mnt.to_path_buf());
}

/// The mount was undone normally.
pub fn forget(mnt: &Path) {
    ACTIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|m| m != mnt);
}

/// Starts the thread that waits for SIGINT/SIGTERM. Must run before other
/// threads start, since it blocks those signals for the whole process.
pub fn install() {
    WATCH.call_once(|| {
        let set = signal_set();
        // SAFETY: `set` is a valid, initialised signal set; blocking SIGINT
        // and SIGTERM here lets the watcher thread receive them with sigwait.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        std::thread::spawn(move || {
            let mut sig = 0;
            // SAFETY: `set` and `sig` are valid for the duration of the call.
            unsafe { libc::sigwait(&set, &mut sig) };
            let mounts = std::mem::take(&mut *ACTIVE.lock().unwrap_or_else(|e| e.into_inner()));
            eprintln!("\ninterrupted: unmounting {} file system(s)", mounts.len());
            for m in mounts {
                crate::config::unmount(&m);
            }
            std::process::exit(130);
        });
    });
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the zeroed set; sigaddset only adds
    // valid signal numbers to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}
