//! shortfuse-preload: loaded with LD_PRELOAD, it serves the system calls of
//! an unmodified program on shortfuse mounts inside the program's own
//! process (Prefuse).
//!
//! At load time the constructor reads `SHORTFUSE_MOUNTS`
//! (`MOUNTPOINT=FS[:SOURCE]`, several separated by `;`, FS being `mem` or
//! `passthrough`), builds each file system in process behind a
//! `shortfuse_vfs::Vfs`, then intercepts system calls, as
//! `SHORTFUSE_INTERCEPT` says:
//!
//! - `both` (default): Syscall User Dispatch ([`sud`]) reports each
//!   `syscall` instruction the first time it runs, and the site becomes a
//!   call into our hook ([`zpoline`], needs `vm.mmap_min_addr=0` or
//!   CAP_SYS_RAWIO, which root has): code loaded at start-up, with dlopen
//!   or by a JIT alike. Without page 0 it runs with Syscall User Dispatch
//!   alone and says so once; without Syscall User Dispatch it rewrites
//!   every loaded object at start-up.
//! - `zpoline`: the rewrite alone, of every object loaded at start-up (code
//!   loaded later bypasses the mount).
//! - `sud`: Syscall User Dispatch alone: every system call pays a signal.
//!
//! `SHORTFUSE_MAPS=off` leaves the file systems' data maps unused (every
//! read and write a request; for measuring what the maps are worth).
//!
//! The hook sends every call that is not a file call straight to the kernel
//! (in the zpoline path without leaving the assembly entry). File calls on
//! mount paths and mount descriptors are served by the VFS; others go to the
//! kernel unchanged (or with the path resolved for them, when a walk left a
//! mount through `..` or a symbolic link).
//!
//! Re-entry and signals. While a call is served, asynchronous signals are
//! blocked (in the zpoline path two rt_sigprocmask calls per file call, paid
//! only once the program has installed a handler for an asynchronous signal,
//! and not for calls told lock-free to go to the kernel unchanged, see
//! `calls::straight_to_kernel`; free in the SIGSYS path, where the handler's
//! mask does it) and a per-thread
//! flag sends the file system's own system calls to the kernel. A program's
//! signal handler therefore never runs inside the hook: it runs when the
//! served call returns, and its file calls on the mount are served like any
//! other; no lock of ours or of the allocator is held when it runs.
//! Synchronous faults (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP) stay
//! unblocked. A bad pointer handed to a served call does not fault: every
//! path, struct and buffer of the program is checked before it is touched
//! and gives EFAULT as the kernel's copy_from_user does (`user`), and an
//! address in page 0 (the trampoline's, which the kernel itself would read)
//! is EFAULT too. A served call that blocks (none does today: the file
//! systems are in process) would delay signals until it returns. exec is
//! served with the program's mask and selector, since the new image
//! inherits them.
//!
//! Stacks. The hook runs on a stack of its own per thread (4 MiB reserved,
//! mapped on the thread's first call that leaves the fast path, with a
//! guard page, unmapped at the thread's exit; see `sys::ThreadState`):
//! the program's stack may be a goroutine's, with a few hundred bytes to
//! spare. The SIGSYS handler's frame goes on the thread's signal stack
//! when it has one (a Go thread's), and the handler's work on the hook
//! stack.
//!
//! Credentials. Every request carries the calling thread's fsuid, fsgid
//! and supplementary groups as they are now (`creds`: read again after the
//! program's setuid, setgroups, setresgid... calls), and every walk checks
//! that the caller may search each directory it looks a name up in, cached
//! names included, as the kernel's `default_permissions` does. A mount that
//! cannot be built or reached (no daemon, a daemon that refuses this user)
//! stops the program with exit status 2 before it runs.
//!
//! Threads and processes. clone3 answers ENOSYS (glibc falls back to clone,
//! as under seccomp sandboxes); clone with a new stack returns on that stack;
//! vfork, and clone(CLONE_VM) without a stack, keep their return address off
//! the shared stack; clone, fork and vfork first pass through the hook,
//! which hands a daemon the descriptions a new process could inherit
//! (`calls::shared`); every new process (libc's fork or a raw clone) is marked
//! by the assembly, and its first served call tells the rings its pid; the
//! child of a vfork-like call (posix_spawn) shares our
//! memory and sends everything to the kernel until it execs, so it cannot
//! change the parent's descriptor table; new threads and forked children
//! turn Syscall User Dispatch on for themselves. rt_sigreturn runs on the
//! stack of its signal frame; exit and exit_group go to the kernel from the
//! fast path.
//!
//! Descriptors of the mount are real kernel descriptor numbers. A regular
//! file whose file system answered the open with a 1-to-1 data map
//! (passthrough) gets a kernel descriptor of its backing file: the kernel
//! then keeps the open file description, so offsets shared across fork,
//! descriptors kept or closed (O_CLOEXEC) at exec, flock/POSIX/OFD locks,
//! mmap, sendfile, splice and the dynamic loader all behave as on any file,
//! among every process of the program tree (the design and why it beats a
//! table in shared memory: `calls::kernel`). A regular file of a daemon
//! (`shortfuse serve`, over the rings) gets a memfd of its own standing for
//! its open file description (`calls::shared`): the kernel shares its offset
//! across fork, keeps or closes it at exec, and the new image adopts it;
//! the daemon releases the handle when the kernel drops the description, and
//! keeps its flock, POSIX and OFD locks (`calls::locks`). Every other
//! descriptor is a placeholder (an O_PATH duplicate of a private memfd)
//! standing for an open file of this process image. On both kinds reads and
//! writes go to the file system, or straight to the backing files of a
//! 1-to-M or M-to-1 map (the DataMap fast path); maps of a daemon's file
//! with a single backing file are the kernel's maps of it (`calls::lent`),
//! other MAP_PRIVATE maps get a copy of the bytes and MAP_SHARED fails
//! with ENODEV; locks of placeholders are
//! taken on a per-node anonymous file (`OpenFile::lock_fd`), and a process's
//! POSIX locks go at any close of one of its descriptors of the file;
//! copy_file_range, sendfile and splice copy through a buffer; FIONREAD is
//! answered. Extended attributes go to the file
//! system. inotify_add_watch on a passthrough path (a daemon's too, which
//! tells its clients its source) watches its backing file or directory
//! (events name entries relative to it, as on the mount); on a daemon's
//! mount without one it watches the kernel mirror of the node on which the
//! daemon replays its changes (`calls::paths`); in process without a
//! source it fails with ENOSYS. bind and connect of a Unix
//! socket to a mount path use the backing path (`calls::sockets`).
//!
//! Process exit (Prefuse's open problem, with memory maps): nothing is lost,
//! since no data waits in user space: writes reach the file system or the
//! backing files before the call returns, and shared maps are the kernel's
//! maps of backing files. Files still open at exit get no FLUSH or RELEASE
//! (the in-process file system ends with the process).
//!
//! exec: the new image loads the shim again and builds its mounts afresh;
//! kernel-backed descriptors survive by themselves, descriptors of
//! passthrough files that are placeholders (the reopen failed) are replaced
//! by kernel descriptors of their backing files, descriptors of a daemon's
//! files are adopted from the descriptors themselves, the current directory
//! travels in `SHORTFUSE_CWD` (and the kernel's follows it to a safe place,
//! for programs the shim will not reach: `calls::kernel_cwd_inside`; those
//! that would meet a mount they cannot reach are refused,
//! `calls::unserved`), a program on a passthrough mount is exec'd
//! from its backing file and one on a mount without a source from a memfd
//! copy (also from a vfork/posix_spawn child, on a stack of its own). A
//! `mem` mount is private to each process image (fork copies it, exec
//! starts an empty one): its descriptors, data and locks are not shared with
//! other processes; sharing them needs the daemon (`shortfuse serve`). Libraries a program needs at start-up (DT_NEEDED) are loaded by
//! the dynamic loader before the shim runs: from a mount they are found
//! through an `$ORIGIN` run path of a program exec'd from a passthrough
//! mount, or LD_LIBRARY_PATH where the mount has a backing directory
//! (`calls::libpath`); dlopen() later is served.
//!
//! Not yet: programs that use clone3 with no
//! fallback to clone; threads created with CLONE_VM but without their own
//! TLS (they would share our per-thread state); system-call numbers of 512
//! and above (x32) in the zpoline path; the top 8 bytes of a red zone, which
//! the `call *%rax` of a rewritten site overwrites (zpoline's own limit);
//! loading the shim later than start-up (dlopen): the assembly finds its
//! per-thread state at a fixed offset from the thread pointer, which only
//! holds for objects in the static TLS block; a F_SETLKW or flock that
//! waits for a daemon's lock is not interrupted by signals (they are
//! blocked while a call is served: kill -9 still ends it), and the daemon
//! detects no deadlock between waiters.

#![deny(unsafe_code)]

mod calls;
mod creds;
mod daemon;
mod known_sites;
mod lazy_libm;
mod mounts;
mod nsmap;
mod page0;
mod sud;
mod sys;
mod user;
mod zpoline;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use shortfuse_vfs::{FdTable, Vfs};

/// Everything the shim knows; built once by the constructor.
pub(crate) struct State {
    pub mounts: Vec<Arc<Vfs>>,
    pub fds: FdTable,
    /// The current directory when it is inside a mount.
    pub cwd: Mutex<Option<(Arc<Vfs>, calls::Here)>>,
    /// The kernel's current directory (kept in step with chdir/fchdir).
    pub host_cwd: Mutex<Vec<u8>>,
}

static STATE: OnceLock<State> = OnceLock::new();
static ACTIVE: AtomicBool = AtomicBool::new(false);

pub(crate) fn state() -> &'static State {
    // The hook only runs this after ACTIVE is set, which follows the set.
    STATE.get().expect("shortfuse-preload state")
}

/// How system calls are intercepted (`SHORTFUSE_INTERCEPT`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Zpoline,
    Sud,
    Both,
}

fn mode() -> Mode {
    match std::env::var("SHORTFUSE_INTERCEPT").as_deref() {
        Ok("zpoline") => Mode::Zpoline,
        Ok("sud") => Mode::Sud,
        Ok("both") | Ok("") | Err(_) => Mode::Both,
        Ok(other) => {
            eprintln!("shortfuse-preload: SHORTFUSE_INTERCEPT={other:?} is not zpoline, sud or both; using both");
            Mode::Both
        }
    }
}

/// Whether the parent process runs the shim without its page 0: it has
/// already said what this process would say (so a shell script warns once,
/// not once per command).
fn parent_fell_back(text: Option<(usize, usize)>) -> bool {
    let Some((start, _)) = text else { return false };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let Some(own) = maps
        .lines()
        .find(|l| l.split('-').next().and_then(|a| usize::from_str_radix(a, 16).ok()) == Some(start))
        .and_then(|l| l.split_whitespace().nth(5))
    else {
        return false;
    };
    let ppid = std::os::unix::process::parent_id();
    std::fs::read_to_string(format!("/proc/{ppid}/maps"))
        .is_ok_and(|m| m.contains(own) && !m.lines().any(|l| l.starts_with("00000000-")))
}

/// Numbers the entry hands to the hook: file calls and the clone family.
fn mark_slow_calls() {
    use calls::table::{ENTRY_CALLS, FILE_CALLS, HOOK_CALLS};
    // Credential changes: requests carry the caller's current ones.
    for &nr in FILE_CALLS
        .iter()
        .chain(ENTRY_CALLS)
        .chain(HOOK_CALLS)
        .chain(&creds::CALLS)
    {
        sys::set_slow(nr);
    }
    // Calls given page 0 where they need memory fail as natively.
    for nr in page0::calls() {
        sys::set_slow(nr);
    }
    // A daemon's /dev/fuse descriptor may come from fusermount3, and its
    // waits on it must see the rings' requests too.
    for &nr in calls::table::DAEMON_CALLS {
        if daemon::wants(nr) {
            sys::set_slow(nr);
        }
    }
}

/// The LD_PRELOAD constructor.
#[allow(unsafe_code)]
extern "C" fn init() {
    // A FUSE daemon under `shortfuse serve --` may have no mounts of its own.
    let spec = match std::env::var("SHORTFUSE_MOUNTS") {
        Ok(spec) => spec,
        Err(_) if daemon::setup() => String::new(),
        Err(_) => return,
    };
    let state = match mounts::build(&spec) {
        Ok(s) => s,
        Err(e) => {
            // Never run a program without the mounts it asked for: its
            // calls would reach whatever the kernel has at those paths.
            eprintln!("shortfuse-preload: {e}; not running without the mounts");
            // SAFETY: no memory is passed.
            unsafe { sys::raw(libc::SYS_exit_group, 2, 0, 0, 0, 0, 0) };
            return;
        }
    };
    if STATE.set(state).is_err() {
        return;
    }
    calls::libpath::restore();
    known_sites::load();
    let mode = mode();
    let debug = std::env::var_os("SHORTFUSE_DEBUG").is_some();
    sys::init_cfg();
    mark_slow_calls();
    let text = zpoline::own_text();
    let mut zpoline_on = false;
    if mode != Mode::Sud {
        match zpoline::install() {
            Ok(()) => zpoline_on = true,
            Err(zpoline::SetupError::Page0(errno)) if mode == Mode::Both => {
                if !parent_fell_back(text) {
                    eprintln!(
                        "shortfuse-preload: cannot map the trampoline at address 0 (errno {errno}; vm.mmap_min_addr \
                         is not 0): running with Syscall User Dispatch alone (a signal per system call)"
                    );
                }
            }
            Err(zpoline::SetupError::Page0(errno)) => {
                eprintln!(
                    "shortfuse-preload: cannot map the trampoline at address 0 (errno {errno}): set \
                     vm.mmap_min_addr=0, or SHORTFUSE_INTERCEPT=sud; mounts are not served"
                );
                return;
            }
        }
    }
    let mut sud_on = false;
    if mode != Mode::Zpoline {
        let r = match text {
            Some(t) => sud::install(t).map_err(|e| format!("errno {e}")),
            None => Err("our own code is not found in /proc/self/maps".to_string()),
        };
        match r {
            Ok(()) => {
                sud_on = true;
                if debug {
                    eprintln!("shortfuse-preload: Syscall User Dispatch on");
                }
            }
            Err(e) if zpoline_on => eprintln!(
                "shortfuse-preload: Syscall User Dispatch unavailable ({e}): code loaded after start-up bypasses \
                 the mounts"
            ),
            Err(e) => {
                eprintln!("shortfuse-preload: Syscall User Dispatch unavailable ({e}): mounts are not served");
                return;
            }
        }
    }
    // Beside Syscall User Dispatch each site is rewritten when it first
    // runs (see `zpoline`, and `before_clone` for a vfork child's exec);
    // without it, every site must be found now.
    if zpoline_on && !sud_on {
        match zpoline::rewrite_loaded() {
            Ok(n) if debug => eprintln!("shortfuse-preload: {n} system-call sites rewritten"),
            Ok(_) => {}
            Err(e) => {
                eprintln!("shortfuse-preload: /proc/self/maps: {e}; mounts are not served");
                return;
            }
        }
    }
    if STATE
        .get()
        .is_some_and(|s| s.mounts.iter().any(|m| m.client().shared()))
    {
        at_fork_prepare(before_fork);
    }
    ACTIVE.store(true, Ordering::Release);
}

#[allow(unsafe_code)]
fn at_fork_prepare(prepare: extern "C" fn()) {
    // SAFETY: a plain registration of a handler that lives as long as the
    // process (the shim is never unloaded).
    unsafe { libc::pthread_atfork(Some(prepare), None, None) };
}

/// libc's fork runs this before it takes its own locks (the allocator's
/// among them): the work the fork needs from us is done here, served as
/// the fork call itself would be (see `calls::shared::before_clone`).
extern "C" fn before_fork() {
    let _ = serve(libc::SYS_fork, [0; 6], None);
}

#[used]
#[allow(unsafe_code)]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// `SHORTFUSE_STATS=FILE`: when a process image exits (exit(3), or the
/// end of main), it appends one JSON line per mount with a page cache to
/// FILE: `{"pid":..,"mountpoint":"..","cache":{"hits":..,...}}`. Images
/// that end in `_exit` or exec (a shell's children), or never used the
/// cache, write nothing; every other process of the program writes its
/// own line.
pub const STATS_VAR: &str = "SHORTFUSE_STATS";

/// The destructor: the cache statistics, as [`STATS_VAR`] asks.
extern "C" fn fini() {
    let (Some(state), Some(path)) = (STATE.get(), std::env::var_os(STATS_VAR)) else {
        return;
    };
    let pid = sys::process::getpid();
    let mut out = String::new();
    for m in &state.mounts {
        // Images that never used the cache (a shell's helpers) say nothing.
        if let Some(pc) = m.page_cache().filter(|pc| pc.stats().snapshot() != Default::default()) {
            let mp: String = String::from_utf8_lossy(m.mountpoint())
                .chars()
                .flat_map(|c| match c {
                    '"' | '\\' => vec!['\\', c],
                    c if (c as u32) < 0x20 => vec!['?'],
                    c => vec![c],
                })
                .collect();
            out.push_str(&format!(
                "{{\"pid\":{pid},\"mountpoint\":\"{mp}\",\"cache\":{}}}\n",
                pc.stats().snapshot().json()
            ));
        }
    }
    if !out.is_empty() {
        sys::append_file(path.as_encoded_bytes(), out.as_bytes());
    }
}

#[used]
#[allow(unsafe_code)]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

/// Called by the entry for every intercepted call the fast path does not
/// take: file calls, and signal calls when Syscall User Dispatch is on.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn shortfuse_hook(a1: i64, a2: i64, a3: i64, a4: i64, a5: i64, a6: i64, nr: i64) -> i64 {
    let a = [a1, a2, a3, a4, a5, a6];
    before_serving(nr);
    if is_clone(nr) {
        before_clone(nr, a, None);
        // The entry runs the call itself (`sys::shortfuse_special`).
        return 0;
    }
    // A vfork child's actions are its own (it shares our records).
    if nr == libc::SYS_rt_sigaction && !sud::on() && sys::thread().vforked.load(Ordering::Relaxed) == 0 {
        sud::note_sigaction(a1, a2);
    }
    if sud::on() {
        if let Some(r) = serve_daemon_wait(nr, a, None).or_else(|| sud::signal_call(nr, a, None)) {
            return r;
        }
    }
    if let Some(r) = serve(nr, a, None) {
        return r;
    }
    if sys::thread().in_hook.load(Ordering::Relaxed) {
        // The file system's own call: its descriptors go above the
        // program's numbers.
        // SAFETY: the call is our own code's, as it made it.
        return unsafe { calls::nested(nr, a) };
    }
    if page0::faults(nr, &a) {
        return -i64::from(libc::EFAULT);
    }
    calls::spare::before_kernel(nr);
    // SAFETY: the program's own call, its arguments as it gave them: the kernel checks them as it
    // would have.
    unsafe { sys::raw6(nr, a) }
}

/// First thing for every call that reaches the hook (from the assembly or
/// the SIGSYS handler): a spare placeholder goes before any call of the
/// program but those that keep it until they reach the kernel
/// (`calls::spare::keeps`). The file system's own calls leave it: their
/// descriptors go above the program's.
pub(crate) fn before_serving(nr: i64) {
    if sys::moves_memory(nr) {
        sys::memory_moved();
    }
    if !sys::thread().in_hook.load(Ordering::Relaxed) {
        if !calls::spare::keeps(nr) {
            calls::spare::before_kernel(nr);
        }
        creds::before_call(nr);
    }
}

/// clone, fork and vfork: the calls after which another process may hold
/// our descriptors.
pub(crate) fn is_clone(nr: i64) -> bool {
    calls::table::is_clone(nr)
}

/// Runs before every clone, fork and vfork (from the entry's slow path or
/// the SIGSYS handler, `frame_mask` as for [`serve`]): moves the clone clock
/// and hands the daemons our descriptions (`calls::shared::before_clone`).
pub(crate) fn before_clone(nr: i64, a: [i64; 6], frame_mask: Option<u64>) {
    let vfork = i64::from(libc::CLONE_VM | libc::CLONE_VFORK);
    let vfork_like = nr == libc::SYS_vfork || nr == libc::SYS_clone && a[0] & vfork == vfork;
    if vfork_like {
        calls::spawn::reset();
    }
    if vfork_like && sud::on() {
        // The child runs without Syscall User Dispatch: its exec must find
        // its site rewritten already.
        zpoline::rewrite_exec_functions_once();
    }
    sys::clone_starts();
    let process = calls::shared::new_process(nr, a[0]);
    if process {
        let _ = serve(nr, a, frame_mask);
    }
    if !fork_gate::makes_thread(nr, a) {
        fork_gate::close(process);
    }
}

/// Keeps served calls and new processes apart. A child gets a copy of our
/// memory with every lock as it was at the clone: a lock another thread
/// held then (in the VFS, a cache, the descriptor table) would stay held
/// in the child forever, and its first call on the mount would hang. So a
/// clone that makes a process waits until no thread is inside a served
/// call, and no call starts until the clone has returned.
///
/// A clone that only makes a thread (pthread_create) copies nothing and
/// leaves the gate open: served calls of other threads go on meanwhile.
///
/// Both waits are bounded: a call that blocks (a lock wait on a daemon)
/// delays a fork by [`DRAIN`] at most, and a vfork child slow to exec
/// holds up the parent's other threads by [`HOLD`] at most, after which
/// each goes on as it would without the gate.
mod fork_gate {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use crate::sys;

    /// Threads inside a served call, counted apart by thread: every served
    /// call of every thread moves its count on entry and on the way out,
    /// and one counter for all made each call write the same cache line,
    /// which then travels from CPU to CPU as the threads take turns. A
    /// thread keeps to one stripe, on a line of its own; a clone adds them
    /// up. Beyond [`STRIPES`] threads share stripes, which costs lines, not
    /// correctness.
    static INSIDE: [Stripe; STRIPES] = [const { Stripe(AtomicU64::new(0)) }; STRIPES];

    /// Stripes of [`INSIDE`].
    pub(crate) const STRIPES: usize = 64;

    /// One counter on a cache line of its own (two lines: the adjacent
    /// line prefetcher pairs them).
    #[repr(align(128))]
    struct Stripe(AtomicU64);

    /// Stripes given to threads so far (round robin).
    static GIVEN: AtomicU64 = AtomicU64::new(0);

    /// This thread's stripe, chosen at its first served call.
    fn mine() -> &'static AtomicU64 {
        &INSIDE[stripe_index()].0
    }

    /// The index of this thread's stripe.
    pub(crate) fn stripe_index() -> usize {
        let t = sys::thread();
        let mut s = t.gate_stripe.load(Ordering::Relaxed);
        if s == 0 {
            s = GIVEN.fetch_add(1, Ordering::Relaxed) % STRIPES as u64 + 1;
            t.gate_stripe.store(s, Ordering::Relaxed);
        }
        s as usize - 1
    }

    /// Threads inside a served call now (as a clone sees them: a count it
    /// read before a thread's increment is made up for by that thread,
    /// which then sees `forking` and steps out).
    pub(crate) fn inside() -> u64 {
        INSIDE.iter().map(|s| s.0.load(Ordering::SeqCst)).sum()
    }

    const DRAIN: Duration = Duration::from_millis(100);
    const HOLD: Duration = Duration::from_secs(1);

    fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) {
        let end = Instant::now() + limit;
        while !done() && Instant::now() < end {
            sys::process::sched_yield();
        }
    }

    /// A thread of this process, on a stack of its own (clone with
    /// CLONE_VM | CLONE_THREAD and a stack): it shares our memory, so no
    /// lock can stay held in a copy, and the gate stays open. The
    /// assembly's parent path skips its `forking` decrement for exactly
    /// these clones (`sys::shortfuse_special`: clone onto a new stack with
    /// both flags), so the two tests must stay the same.
    pub fn makes_thread(nr: i64, a: [i64; 6]) -> bool {
        let thread = i64::from(libc::CLONE_VM | libc::CLONE_THREAD);
        nr == libc::SYS_clone && a[1] != 0 && a[0] & thread == thread
    }

    /// Before any other clone-family call (the assembly opens the gate
    /// again when it returns): for a new process, waits for the calls of the other
    /// threads to end (a file system may start a process from inside a
    /// call: an sftp mount its ssh).
    pub fn close(process: bool) {
        sys::cfg().forking.fetch_add(1, Ordering::SeqCst);
        if process {
            let mine = u64::from(sys::thread().in_hook.load(Ordering::Relaxed));
            wait_until(DRAIN, || inside() <= mine);
        }
    }

    /// A served call starts (waiting while a clone is made).
    pub fn enter() {
        let forking = &sys::cfg().forking;
        let inside = mine();
        inside.fetch_add(1, Ordering::SeqCst);
        if forking.load(Ordering::SeqCst) == 0 {
            return;
        }
        inside.fetch_sub(1, Ordering::SeqCst);
        let end = Instant::now() + HOLD;
        loop {
            wait_until(end.saturating_duration_since(Instant::now()), || {
                forking.load(Ordering::SeqCst) == 0
            });
            inside.fetch_add(1, Ordering::SeqCst);
            if forking.load(Ordering::SeqCst) == 0 || Instant::now() >= end {
                return;
            }
            inside.fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub fn leave() {
        mine().fetch_sub(1, Ordering::SeqCst);
    }

    /// Runs `wait` (a served call's wait for another process, holding
    /// none of our locks) as if outside the call: a fork meanwhile need
    /// not wait for it, and the call goes on once no clone is being made.
    pub fn outside<R>(wait: impl FnOnce() -> R) -> R {
        leave();
        let r = wait();
        enter();
        r
    }

    /// In a new process: the other threads, and whatever they were inside,
    /// stayed behind.
    pub fn forked() {
        for s in &INSIDE {
            s.0.store(0, Ordering::SeqCst);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The address of the counter this thread's served calls move.
        fn counter() -> usize {
            mine() as *const AtomicU64 as usize
        }

        #[test]
        fn threads_in_served_calls_at_once_write_no_cache_line_in_common() {
            let barrier = std::sync::Barrier::new(4);
            let lines: Vec<usize> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            enter();
                            let line = counter() / 64;
                            // All four inside together: a clone counts them.
                            barrier.wait();
                            assert!(inside() >= 4);
                            barrier.wait();
                            leave();
                            line
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let mut distinct = lines.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), lines.len(), "cache lines of the counters: {lines:x?}");
            assert_eq!(inside(), 0);
        }
    }
}

/// A FUSE daemon's ppoll and pselect6 on its /dev/fuse descriptors, served
/// before Syscall User Dispatch's handling of the signal masks they carry
/// (`daemon` waits with the program's mask, SIGSYS taken out, itself).
pub(crate) fn serve_daemon_wait(nr: i64, a: [i64; 6], frame_mask: Option<u64>) -> Option<i64> {
    if matches!(nr, libc::SYS_ppoll | libc::SYS_pselect6) && daemon::wants(nr) {
        serve(nr, a, frame_mask)
    } else {
        None
    }
}

/// Serves a file call on the mounts: None sends it to the kernel.
/// `frame_mask`: None from the zpoline entry (asynchronous signals are
/// blocked here meanwhile); from the SIGSYS handler, the program's mask in
/// the signal frame (the handler's own mask already blocks them).
///
/// exec is the exception: the new image inherits the signal mask, so
/// execve/execveat are served with the program's mask and selector. A
/// handler that interrupts them finds `in_hook` set and reaches the kernel.
#[allow(unsafe_code)]
pub(crate) fn serve(nr: i64, a: [i64; 6], frame_mask: Option<u64>) -> Option<i64> {
    if !(calls::is_file_call(nr) || is_clone(nr) || daemon::wants(nr)) || !ACTIVE.load(Ordering::Acquire) {
        return None;
    }
    if calls::shared::sends(nr)
        && !calls::table::Call::decode(nr, a).is_some_and(|c| calls::shared::passes_descriptors(&c))
    {
        // Most messages pass no descriptor: spare them the rest.
        return None;
    }
    let t = sys::thread();
    if t.in_hook.load(Ordering::Relaxed) {
        return None;
    }
    let cfg = sys::cfg();
    if cfg.forked.load(Ordering::Relaxed) != 0 && cfg.forked.swap(0, Ordering::Relaxed) != 0 {
        // A new process: the rings stamp requests with its pid. libc's fork
        // also tells them (pthread_atfork); a raw clone system call only
        // tells us.
        shortfuse_ring::after_fork();
        fork_gate::forked();
        // Pages the parent found readable may not be ours (MADV_DONTFORK).
        sys::memory_moved();
    }
    if t.vforked.load(Ordering::Relaxed) != 0 {
        // A vfork child shares our memory: it must not change our tables.
        // Its exec of a program on a passthrough mount is mapped to the
        // source (posix_spawn of a program on the mount); see
        // `calls::vfork_exec` for why nothing more.
        if matches!(nr, libc::SYS_execve | libc::SYS_execveat) {
            if let Some(m) = frame_mask {
                sud::program_mask(m);
            }
            return calls::vfork_exec(nr, a);
        }
        // Its chdir and its opens (posix_spawn's file actions) of mount
        // paths; the file system's own calls meanwhile reach the kernel.
        t.in_hook.store(true, Ordering::Relaxed);
        let r = calls::vfork_call(nr, a);
        t.in_hook.store(false, Ordering::Relaxed);
        return r;
    }
    if matches!(nr, libc::SYS_execve | libc::SYS_execveat) {
        t.in_hook.store(true, Ordering::Relaxed);
        if let Some(m) = frame_mask {
            sud::program_mask(m);
        }
        let r = calls::dispatch(nr, a);
        t.in_hook.store(false, Ordering::Relaxed);
        return r;
    }
    let mut old_mask = 0u64;
    let block = frame_mask.is_none() && sud::handlers_installed();
    if block && calls::straight_to_kernel(nr, a) {
        // Nothing of ours runs for it: no signal to hold back.
        return None;
    }
    if block {
        let all = sud::ASYNC_MASK;
        // SAFETY: 8-byte signal masks of ours, as the size says.
        unsafe {
            sys::raw(
                libc::SYS_rt_sigprocmask,
                libc::SIG_BLOCK as i64,
                &all as *const u64 as i64,
                &mut old_mask as *mut u64 as i64,
                8,
                0,
                0,
            )
        };
    }
    // Only now: a handler that ran before the mask went on was not inside.
    t.in_hook.store(true, Ordering::Relaxed);
    let selector = t.selector.swap(sys::ALLOW, Ordering::SeqCst);
    fork_gate::enter();
    // What a call that waits for another process runs with (`calls::special`).
    calls::special::set_program_mask(if block { Some(old_mask) } else { frame_mask });
    let r = calls::dispatch(nr, a);
    fork_gate::leave();
    t.selector.store(selector, Ordering::SeqCst);
    // Last: a signal pending meanwhile is delivered as the mask comes off,
    // and its handler's file calls must find us out of the hook.
    t.in_hook.store(false, Ordering::Relaxed);
    if block {
        // SAFETY: 8-byte signal masks of ours, as the size says.
        unsafe {
            sys::raw(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK as i64,
                &old_mask as *const u64 as i64,
                0,
                8,
                0,
                0,
            )
        };
    }
    r
}
