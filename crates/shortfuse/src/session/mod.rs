//! Kernel sessions: serve a [`Filesystem`] on a mount point.
//!
//! [`serve`] is the whole life of a mount in one call: mount, answer
//! requests until the file system is unmounted, clean up. [`DevSession`]
//! splits it in two ([`DevSession::mount`], then [`DevSession::run`]) for
//! callers that need to act in between, such as the CLI, which forks into
//! the background after mounting and before any thread exists.

pub mod dev;
mod pool;
pub mod uring;

use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::filesystem::Filesystem;
use crate::mount::MountMethod;
use crate::options::MountOptions;

pub use dev::DevSession;

/// How a session runs, as opposed to what the mount looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
/// (Worker threads are [`MountOptions::threads`].)
pub struct SessionOptions {
    /// How to mount: mount(2) as root, fusermount3 otherwise.
    pub method: MountMethod,
    /// Listen on the control socket (`shortfuse stats`).
    pub control_socket: bool,
    /// Take SIGINT/SIGTERM (unmount and exit) and SIGUSR1 (log the stats
    /// table to stderr). The signals are blocked in the calling thread
    /// while the session runs.
    pub handle_signals: bool,
}

impl Default for SessionOptions {
    fn default() -> SessionOptions {
        SessionOptions {
            method: MountMethod::Auto,
            control_socket: true,
            handle_signals: true,
        }
    }
}

/// Mounts `fs` at `mount_point` and serves it over /dev/fuse until it is
/// unmounted (`shortfuse umount`, umount(8), SIGINT/SIGTERM).
pub fn serve(
    fs: Arc<dyn Filesystem>,
    mount_point: &Path,
    opts: MountOptions,
    session: SessionOptions,
) -> io::Result<()> {
    DevSession::mount(fs, mount_point, opts, session)?.run(|| {})
}
