//! Every mount a run makes, and every workload process it starts (fio), is
//! remembered here, so that Ctrl-C or SIGTERM stops the processes (which
//! hold files open inside the mounts) and then unmounts everything before
//! the process exits.

use shortfuse::sync::Unpoison;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};

static ACTIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Notes a scratch directory to delete on interruption (after the unmounts,
/// so the deletion never walks into a live mount).
pub fn remember_scratch(dir: &Path) {
    SCRATCH.lock().unpoison().push(dir.to_path_buf());
}

pub fn forget_scratch(dir: &Path) {
    SCRATCH.lock().unpoison().retain(|d| d != dir);
}
static WATCH: Once = Once::new();
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Spawns `cmd` in its own process group, remembered until [`reap`]. Its own
/// group keeps the terminal's Ctrl-C away from it: the watcher decides when
/// it dies, before the unmounts.
pub fn spawn(cmd: &mut std::process::Command) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let mut children = CHILDREN.lock().unpoison();
    let child = cmd.process_group(0).spawn()?;
    children.push(child.id());
    Ok(child)
}

/// Kills (if still running) and waits for a child from [`spawn`].
pub fn reap(child: &mut std::process::Child) {
    kill_group(child.id());
    let _ = child.wait();
    CHILDREN.lock().unpoison().retain(|&p| p != child.id());
}

fn kill_group(pid: u32) {
    // SAFETY: signalling a process group this module created; a group that
    // is already gone just yields ESRCH.
    unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
}

/// Notes a mount that must be undone on interruption.
pub fn remember(mnt: &Path) {
    ACTIVE.lock().unpoison().push(mnt.to_path_buf());
}

/// The mount was undone normally.
pub fn forget(mnt: &Path) {
    ACTIVE.lock().unpoison().retain(|m| m != mnt);
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
            INTERRUPTED.store(true, Ordering::SeqCst);
            let children = std::mem::take(&mut *CHILDREN.lock().unpoison());
            for &pid in &children {
                kill_group(pid);
            }
            for pid in children {
                // SAFETY: waiting for our own child; a null status pointer is allowed.
                unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
            }
            let mounts = std::mem::take(&mut *ACTIVE.lock().unpoison());
            eprintln!("\ninterrupted: unmounting {} file system(s)", mounts.len());
            let mut all_gone = true;
            for m in mounts {
                crate::config::unmount(&m);
                all_gone &= !crate::config::is_mounted(&m);
            }
            if all_gone {
                for d in std::mem::take(&mut *SCRATCH.lock().unpoison()) {
                    let _ = std::fs::remove_dir_all(d);
                }
            }
            std::process::exit(130);
        });
    });
}

/// Called when a run returns: if a signal stopped it (the killed children
/// made it return early), waits for the watcher, which unmounts and exits
/// with 130, instead of reporting the run as finished.
pub fn unless_interrupted() {
    if INTERRUPTED.load(Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
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
