//! The `O_PATH` descriptor each inode is named by, kept within a budget.
//!
//! Holding one descriptor per inode the kernel knows (as `passthrough_hp`
//! does) makes the number of inodes a workload may keep in the kernel's
//! caches equal to `RLIMIT_NOFILE`: a `find` over a large tree or a
//! create-heavy run then fails with `EMFILE`, and an unprivileged daemon
//! cannot raise its hard limit. Like virtiofsd's `inode_file_handles`, an
//! inode here can give its descriptor up and keep a file handle
//! (`name_to_handle_at`) instead, reopened with `open_by_handle_at` on next
//! use. Descriptors are given up in a clock order (recently used ones get a
//! second chance) once more than the budget are open.
//!
//! Reopening by handle needs `CAP_DAC_READ_SEARCH` and a source file system
//! that exports handles (ext4, xfs, btrfs, tmpfs do); the [`Budget`] checks
//! both on the root when the first inode below it is looked up (not at
//! start: under `shortfuse run` every process builds the file system, and
//! most short ones look nothing up), and without them descriptors are
//! never given up (the old behaviour). The root, inodes on other devices
//! than the root (mount points below the source, where the root's
//! descriptor is no mount fd for `open_by_handle_at`) and inodes with open
//! handles keep theirs: an unlinked file that is still open could not be
//! found by handle again.
//!
//! A handle names an inode, not a path: reopening cannot resolve anything,
//! so it cannot leave the source either.
//!
//! Lock order: a slot's mutex is a leaf, taken under the inode table's lock
//! by [`super::inodes::InodeTable::shed`] and never held while another lock
//! is taken.

use shortfuse::sync::Unpoison;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use shortfuse::{Errno, Result};

use super::sys::{self, Handle};

/// Descriptors the daemon keeps for other things than inodes (open files,
/// directory streams, the session) are not counted: the budget is a share
/// of the limit that leaves room for them.
const MIN_BUDGET: usize = 16;

/// How many `O_PATH` descriptors may be open, and the means to reopen.
#[derive(Debug)]
pub struct Budget {
    /// The source root, to probe file handles on.
    root: Arc<OwnedFd>,
    /// The lowest number the mount descriptor may take (see
    /// `IN_PROCESS_FD_FLOOR`): the probe may run before the program's
    /// calls are served, when nothing else moves it there.
    fd_floor: i32,
    /// Set by the first probe: `None` when handles do not work here, and
    /// descriptors are never given up.
    mount: OnceLock<Option<OwnedFd>>,
    root_dev: u64,
    limit: usize,
    open: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` descriptors over the root `root` (on device
    /// `root_dev`), if file handles work there; unlimited otherwise.
    /// The descriptor it keeps goes at `fd_floor` or above.
    pub fn new(root: Arc<OwnedFd>, root_dev: u64, limit: usize, fd_floor: i32) -> Budget {
        Budget {
            root,
            fd_floor,
            mount: OnceLock::new(),
            root_dev,
            limit: limit.max(MIN_BUDGET),
            open: AtomicUsize::new(0),
        }
    }

    /// Whether inode descriptors can be given up for file handles: the
    /// root opened for reading (the mount descriptor `open_by_handle_at`
    /// wants) and a handle of it opened again. Probed once.
    pub fn handles_work(&self) -> bool {
        self.mount
            .get_or_init(|| {
                let root = self.root.as_fd();
                let works = sys::open_dir(root).and_then(|mount| {
                    let h = sys::name_to_handle(root)?;
                    sys::open_by_handle(mount.as_fd(), &h, libc::O_PATH)?;
                    Ok(match self.fd_floor {
                        0 => mount,
                        floor => sys::dup_at_least(mount.as_fd(), floor).unwrap_or(mount),
                    })
                });
                works
                    .inspect_err(|e| {
                        tracing::warn!(
                            "passthrough: file handles do not work on the source ({e}): every inode the kernel \
                             keeps holds a descriptor, as many as RLIMIT_NOFILE allows"
                        )
                    })
                    .ok()
            })
            .is_some()
    }

    /// The budget's size, or None when descriptors are never given up.
    pub fn limit(&self) -> Option<usize> {
        self.handles_work().then_some(self.limit)
    }

    /// Descriptors open now that count against the budget.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// How many descriptors to give up now (a quarter of the budget at once,
    /// so that the sweep's cost is spread over many opens).
    pub fn excess(&self) -> usize {
        // Nothing counts against it until a slot found handles work.
        if self.mount.get().is_none_or(Option::is_none) {
            return 0;
        }
        let open = self.open();
        if open <= self.limit {
            0
        } else {
            open - self.limit + self.limit / 4
        }
    }
}

/// One inode's descriptor, or the handle to get it back.
#[derive(Debug)]
pub struct PathSlot {
    state: Mutex<SlotState>,
    /// Set on use, cleared by a sweep that passes over it.
    used: AtomicBool,
    budget: Arc<Budget>,
    /// Counts against the budget (may be given up).
    sheddable: bool,
}

#[derive(Debug)]
struct SlotState {
    fd: Option<Arc<OwnedFd>>,
    handle: Option<Handle>,
    /// A plain read-only descriptor of the file, shared by its read-only
    /// opens (see [`PathSlot::reader`]); counts against the budget and is
    /// given up with `fd`.
    reader: Option<Arc<OwnedFd>>,
}

/// A use of an inode's descriptor; it stays open while this lives.
pub struct PathFd(Arc<OwnedFd>);

impl AsFd for PathFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl PathSlot {
    /// A slot holding `fd`, of an inode on device `dev`. `pinned` slots (the
    /// root) never give their descriptor up.
    pub fn new(fd: OwnedFd, dev: u64, pinned: bool, budget: &Arc<Budget>) -> PathSlot {
        let sheddable = !pinned && dev == budget.root_dev && budget.handles_work();
        if sheddable {
            budget.open.fetch_add(1, Ordering::Relaxed);
        }
        PathSlot {
            state: Mutex::new(SlotState {
                fd: Some(Arc::new(fd)),
                handle: None,
                reader: None,
            }),
            used: AtomicBool::new(true),
            budget: budget.clone(),
            sheddable,
        }
    }

    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // Every update leaves the state consistent: a poisoned lock is fine.
        self.state.lock().unpoison()
    }

    /// The descriptor, reopened by handle if it was given up. `ESTALE` when
    /// the inode is gone from the source.
    pub fn get(&self) -> Result<PathFd> {
        self.used.store(true, Ordering::Relaxed);
        let mut st = self.lock();
        if let Some(fd) = &st.fd {
            return Ok(PathFd(fd.clone()));
        }
        let (Some(Some(mount)), Some(handle)) = (self.budget.mount.get(), st.handle.as_ref()) else {
            // Only a slot with a handle gives its descriptor up.
            return Err(Errno::EIO);
        };
        let fd = Arc::new(reopen(mount.as_fd(), handle)?);
        st.fd = Some(fd.clone());
        self.budget.open.fetch_add(1, Ordering::Relaxed);
        Ok(PathFd(fd))
    }

    /// The file's shared read-only descriptor, made by `open` from the
    /// inode's `O_PATH` one the first time. Opening costs the daemon a
    /// path walk through `/proc/self/fd` (more than bindfs's open by name);
    /// reads name their offset (`pread`), so read-only opens that ask
    /// nothing else of their description can share one, as long as the
    /// inode keeps its descriptor.
    pub fn reader(&self, open: impl FnOnce(BorrowedFd<'_>) -> Result<OwnedFd>) -> Result<Arc<OwnedFd>> {
        if let Some(r) = &self.lock().reader {
            self.used.store(true, Ordering::Relaxed);
            return Ok(r.clone());
        }
        let path = self.get()?;
        let fd = Arc::new(open(path.as_fd())?);
        let mut st = self.lock();
        if let Some(r) = &st.reader {
            // Another open made one meanwhile: use that one.
            return Ok(r.clone());
        }
        st.reader = Some(fd.clone());
        if self.sheddable {
            self.budget.open.fetch_add(1, Ordering::Relaxed);
        }
        Ok(fd)
    }

    /// Puts `fd` (a fresh descriptor of the same inode, from a lookup) back
    /// into a slot that gave its own up; otherwise `fd` is dropped.
    pub fn refill(&self, fd: OwnedFd) {
        let mut st = self.lock();
        if st.fd.is_none() {
            st.fd = Some(Arc::new(fd));
            self.budget.open.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One step of the clock sweep: a slot used since the last pass gets a
    /// second chance; otherwise its descriptor is given up for a handle.
    /// `busy` (open handles on the inode) keeps it. True if one was closed.
    pub fn shed(&self, busy: bool) -> bool {
        if !self.sheddable || busy || self.used.swap(false, Ordering::Relaxed) {
            return false;
        }
        // Never wait here: the sweep runs under the inode table's lock.
        let Ok(mut st) = self.state.try_lock() else {
            return false;
        };
        let Some(fd) = st.fd.as_ref() else {
            return false;
        };
        if st.handle.is_none() {
            match sys::name_to_handle(fd.as_fd()) {
                Ok(h) => st.handle = Some(h),
                // This inode cannot be found by handle: it keeps its descriptor.
                Err(_) => return false,
            }
        }
        // A request still using the descriptor keeps it open until it ends.
        st.fd = None;
        let given_up = 1 + usize::from(st.reader.take().is_some());
        self.budget.open.fetch_sub(given_up, Ordering::Relaxed);
        true
    }

    /// True while the descriptor is open (for tests).
    pub fn is_open(&self) -> bool {
        self.lock().fd.is_some()
    }
}

impl Drop for PathSlot {
    fn drop(&mut self) {
        if self.sheddable {
            let st = self.lock();
            let held = usize::from(st.fd.is_some()) + usize::from(st.reader.is_some());
            self.budget.open.fetch_sub(held, Ordering::Relaxed);
        }
    }
}

/// `open_by_handle_at` of a given-up inode. An inode whose last name went
/// while the kernel is still evicting it is found half-freed: ext4's iget
/// then reports ENOMEM instead of ESTALE (seen on a CI machine). Eviction
/// ends within microseconds, so a few short retries turn that into the
/// ESTALE the caller expects; a real shortage stays ENOMEM.
fn reopen(mount: BorrowedFd<'_>, handle: &Handle) -> Result<OwnedFd> {
    let mut tries = 0;
    loop {
        match sys::open_by_handle(mount, handle, libc::O_PATH) {
            Err(Errno::ENOMEM) if tries < 5 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(1 << tries));
            }
            other => return other,
        }
    }
}
