//! Syscall User Dispatch (Linux 5.11+): every system call issued while this
//! thread's selector byte says BLOCK, from outside our own text, raises
//! SIGSYS. That catches what the start-up rewrite missed: code loaded with
//! dlopen, JIT code, skipped sites, and with no trampoline page, everything.
//!
//! The SIGSYS handler, when the trampoline is mapped, rewrites the site
//! into `call *%rax` and resumes on it, so a site pays for one signal only.
//! Otherwise it serves the call itself: file calls through the same
//! `calls::dispatch`, the clone family and rt_sigreturn by resuming in
//! `shortfuse_special` (they cannot run inside a signal frame), the rest by
//! a raw system call with the program's signal mask.
//!
//! Why the selector *and* an exempt range. Our text (`offset`/`len` of the
//! prctl) is exempt, so our raw system calls and the rt_sigreturn of our
//! handler (its `sa_restorer` is ours) pass with the selector at BLOCK.
//! But the file system serving a call uses libc (allocator, std::fs), whose
//! calls come from libc's text: the selector is ALLOW while we serve, and
//! asynchronous signals are blocked then (the handler's `sa_mask`, or in
//! the zpoline path an explicit mask once the program has a handler), so a
//! program's signal handler never runs with the selector at ALLOW and
//! escapes interception.
//!
//! Keeping SIGSYS deliverable. A trap while SIGSYS is blocked kills the
//! process, and the program's own handlers run with their `sa_mask`: so
//! SIGSYS is removed from every mask the program hands the kernel
//! (rt_sigprocmask, rt_sigaction masks, rt_sigsuspend, ppoll, pselect6,
//! epoll_pwait(2)), and the program's `sigaction(SIGSYS)` is recorded
//! instead of replacing ours; a SIGSYS that is not a dispatch trap goes to
//! the handler the program asked for.
//!
//! Not inherited by threads or children: `shortfuse_child` turns it on in
//! each new thread and forked child; a vfork child runs without it until
//! exec, and exec clears it (the shim, preloaded again, turns it back on).
#![allow(unsafe_code)]

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::sys::{self, process, raw, raw6, thread, ALLOW, BLOCK};

const PR_SET_SYSCALL_USER_DISPATCH: i64 = 59;
const PR_SYS_DISPATCH_ON: i64 = 1;
/// si_code of a dispatch trap.
const SYS_USER_DISPATCH: i32 = 2;
const SA_RESTORER: u64 = 0x0400_0000;

pub(crate) const SIGSYS_BIT: u64 = 1 << (libc::SIGSYS - 1);

/// Signals blocked while we serve a call: everything but SIGSYS and the
/// synchronous faults (a fault in our code is reported, not deferred
/// forever: the kernel kills a thread that faults with the signal blocked).
pub const ASYNC_MASK: u64 = !(SIGSYS_BIT
    | 1 << (libc::SIGSEGV - 1)
    | 1 << (libc::SIGBUS - 1)
    | 1 << (libc::SIGILL - 1)
    | 1 << (libc::SIGFPE - 1)
    | 1 << (libc::SIGTRAP - 1));

/// The kernel's `struct sigaction` on x86-64.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KSigaction {
    handler: u64,
    flags: u64,
    restorer: u64,
    mask: u64,
}

/// The SIGSYS action the program asked for (handler, flags, restorer,
/// mask), reported back by `sigaction(SIGSYS)` and used for SIGSYS signals
/// that are not dispatch traps.
static APP_SIGSYS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn app_sigsys() -> KSigaction {
    KSigaction {
        handler: APP_SIGSYS[0].load(Ordering::Acquire),
        flags: APP_SIGSYS[1].load(Ordering::Acquire),
        restorer: APP_SIGSYS[2].load(Ordering::Acquire),
        mask: APP_SIGSYS[3].load(Ordering::Acquire),
    }
}

pub fn on() -> bool {
    sys::cfg().sud_on.load(Ordering::Relaxed) != 0
}

/// Installs the SIGSYS handler and turns dispatch on for this thread; our
/// text `[start, start+len)` is exempt. Returns the errno on failure.
pub fn install(text: (usize, usize)) -> Result<(), i64> {
    let act = KSigaction {
        handler: sigsys as *const () as u64,
        flags: (libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK) as u64 | SA_RESTORER,
        restorer: sys::shortfuse_restorer as *const () as u64,
        mask: ASYNC_MASK,
    };
    let mut old = KSigaction::default();
    // SAFETY: kernel sigaction structs of ours, alive across the call, with an 8-byte mask as the
    // size says.
    let r = unsafe {
        raw(
            libc::SYS_rt_sigaction,
            libc::SIGSYS as i64,
            &act as *const _ as i64,
            &mut old as *mut _ as i64,
            8,
            0,
            0,
        )
    };
    if r < 0 {
        return Err(-r);
    }
    for (slot, v) in APP_SIGSYS.iter().zip([old.handler, old.flags, old.restorer, old.mask]) {
        slot.store(v, Ordering::Release);
    }
    let c = sys::cfg();
    c.text_start.store(text.0 as u64, Ordering::Relaxed);
    c.text_len.store(text.1 as u64, Ordering::Relaxed);
    let r = enable_thread();
    if r < 0 {
        // Put the program's action back: nothing will trap.
        // SAFETY: kernel sigaction structs of ours, alive across the call, with an 8-byte mask as
        // the size says.
        unsafe {
            raw(
                libc::SYS_rt_sigaction,
                libc::SIGSYS as i64,
                &old as *const _ as i64,
                0,
                8,
                0,
                0,
            )
        };
        return Err(-r);
    }
    c.sud_on.store(1, Ordering::Release);
    for nr in SIGNAL_CALLS {
        sys::set_slow(nr);
    }
    Ok(())
}

fn enable_thread() -> i64 {
    let c = sys::cfg();
    let t = thread();
    t.selector.store(BLOCK, Ordering::SeqCst);
    // SAFETY: our own text range; the selector byte lives as long as the thread.
    unsafe {
        raw(
            libc::SYS_prctl,
            PR_SET_SYSCALL_USER_DISPATCH,
            PR_SYS_DISPATCH_ON,
            c.text_start.load(Ordering::Relaxed) as i64,
            c.text_len.load(Ordering::Relaxed) as i64,
            &t.selector as *const _ as i64,
            0,
        )
    }
}

/// Asynchronous signals for which the program installed a handler (bit
/// n-1 for signal n). While none is, no code of the program can run inside
/// the hook, and the zpoline path skips blocking signals around a served
/// call (two system calls saved per file call). A handler installed by one
/// thread while another is already inside the hook can interrupt that one
/// call; its file calls then reach the kernel.
static HANDLED: AtomicU64 = AtomicU64::new(0);

/// Whether the actions in place before our constructor have been read
/// into [`HANDLED`] (see [`scan_handlers`]).
static SCANNED: AtomicBool = AtomicBool::new(false);

/// Whether asynchronous signals must be blocked while a call is served.
/// The first answer reads the actions a constructor that ran before ours
/// may have installed: a process that never has a call served (`/bin/true`,
/// most of a build's short processes) never asks the kernel about its 64
/// signals. Not to be asked in a vfork child (posix_spawn's resets its
/// actions, and the record is its parent's).
pub fn handlers_installed() -> bool {
    if !SCANNED.load(Ordering::Acquire) {
        scan_handlers();
        SCANNED.store(true, Ordering::Release);
    }
    HANDLED.load(Ordering::Relaxed) != 0
}

/// Records the action an rt_sigaction call installs (`act`, the program's
/// pointer, may be null).
pub fn note_sigaction(sig: i64, act: i64) {
    if act != 0 {
        // SAFETY: the program's new action, as the kernel reads it.
        let handler = unsafe { core::ptr::read_unaligned(act as *const u64) } as usize;
        note_caught(sig, handler != libc::SIG_DFL && handler != libc::SIG_IGN);
    }
}

/// Adds the handlers in place now to the record (a constructor that ran
/// before ours may have installed some). It only adds: the program's own
/// rt_sigaction calls, recorded as they pass, may have run meanwhile on
/// another thread, and one that put a default action back while we read is
/// at worst a handler we still block signals for.
fn scan_handlers() {
    if let Some(caught) = caught_signals() {
        for sig in 1..=64 {
            if caught & 1 << (sig - 1) != 0 {
                note_caught(sig, true);
            }
        }
        return;
    }
    // No /proc (a chroot, a sandbox): the actions one by one.
    for sig in 1..=64 {
        let mut old = KSigaction::default();
        // SAFETY: kernel sigaction structs of ours, alive across the call, with an 8-byte mask as
        // the size says.
        let r = unsafe { raw(libc::SYS_rt_sigaction, sig, 0, &mut old as *mut _ as i64, 8, 0, 0) };
        if r == 0 && old.handler as usize != libc::SIG_DFL && old.handler as usize != libc::SIG_IGN {
            note_caught(sig, true);
        }
    }
}

/// The signals that have a handler (neither default nor ignored), bit n-1
/// for signal n: the `SigCgt` line of /proc/self/status, which the kernel
/// fills from the actions the process's threads share. An open, a few reads
/// and a close where asking for each action is 64 calls; the kernel spends
/// about as long on either (it formats the whole text), but a traced or
/// filtered program sees three calls. None if it cannot be read.
fn caught_signals() -> Option<u64> {
    let fd = sys::fs::openat(
        libc::AT_FDCWD,
        b"/proc/self/status\0",
        libc::O_RDONLY | libc::O_CLOEXEC,
        0,
    );
    if fd < 0 {
        return None;
    }
    // Read in small pieces, keeping the start of each line: this may run
    // on a small stack (a signal handler's), and a long Groups line comes
    // before SigCgt.
    let mut buf = [0u8; 256];
    let mut line = [0u8; 32];
    let mut at = 0;
    let mut caught = None;
    'text: loop {
        let n = sys::fs::read(fd as i32, &mut buf);
        let Ok(n) = usize::try_from(n) else { break };
        if n == 0 {
            break;
        }
        for &b in &buf[..n] {
            if b == b'\n' {
                caught = sig_cgt(&line[..at]);
                if caught.is_some() {
                    break 'text;
                }
                at = 0;
            } else if at < line.len() {
                line[at] = b;
                at += 1;
            }
        }
    }
    sys::fs::close(fd as i32);
    caught
}

/// The mask of a `SigCgt:` line of a /proc/PID/status text (16 hex digits).
fn sig_cgt(line: &[u8]) -> Option<u64> {
    let hex = std::str::from_utf8(line.strip_prefix(b"SigCgt:")?).ok()?.trim();
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok()).flatten()
}

/// Records whether signal `sig` now has a handler (`caught`).
fn note_caught(sig: i64, caught: bool) {
    // glibc's SIGSETXID (33) handler only issues set*id calls.
    if !(1..=64).contains(&sig) || sig == 33 {
        return;
    }
    let bit = 1u64 << (sig - 1);
    if bit & ASYNC_MASK == 0 {
        return;
    }
    if caught {
        HANDLED.fetch_or(bit, Ordering::Relaxed);
    } else {
        HANDLED.fetch_and(!bit, Ordering::Relaxed);
    }
}

/// The calls that carry a signal mask or set SIGSYS's action.
const SIGNAL_CALLS: [i64; 7] = [
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigsuspend,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
];

fn read_u64(p: i64) -> u64 {
    // SAFETY: a sigset argument: the kernel would read 8 bytes there.
    unsafe { core::ptr::read_unaligned(p as *const u64) }
}

fn write_u64(p: i64, v: u64) {
    // SAFETY: an output sigset argument: the kernel would write 8 bytes.
    unsafe { core::ptr::write_unaligned(p as *mut u64, v) }
}

/// The signal calls, with SIGSYS kept deliverable. `frame_mask` is the
/// interrupted context's mask when we run inside the SIGSYS handler: the
/// program's rt_sigprocmask then acts on it (rt_sigreturn installs it).
/// None: not a signal call, or nothing to change.
pub fn signal_call(nr: i64, a: [i64; 6], frame_mask: Option<&mut u64>) -> Option<i64> {
    const EINVAL: i64 = -(libc::EINVAL as i64);
    match nr {
        libc::SYS_rt_sigaction => {
            if a[3] != 8 {
                return None;
            }
            // A vfork child (posix_spawn's resets its handlers) shares our
            // records with its parent: they stay the parent's, and SIGSYS
            // stays ours until the exec (which resets it).
            let vforked = thread().vforked.load(Ordering::Relaxed) != 0;
            if vforked && a[0] == libc::SIGSYS as i64 {
                return Some(0);
            }
            if !vforked {
                note_sigaction(a[0], a[1]);
            }
            if a[0] == libc::SIGSYS as i64 {
                let old = app_sigsys();
                if a[1] != 0 {
                    // SAFETY: the program's new action, as the kernel would read it.
                    let new: KSigaction = unsafe { core::ptr::read_unaligned(a[1] as *const KSigaction) };
                    for (slot, v) in APP_SIGSYS.iter().zip([new.handler, new.flags, new.restorer, new.mask]) {
                        slot.store(v, Ordering::Release);
                    }
                }
                if a[2] != 0 {
                    // SAFETY: the program's output action.
                    unsafe { core::ptr::write_unaligned(a[2] as *mut KSigaction, old) };
                }
                return Some(0);
            }
            if a[1] == 0 {
                return None;
            }
            // SAFETY: as above.
            let mut act: KSigaction = unsafe { core::ptr::read_unaligned(a[1] as *const KSigaction) };
            act.mask &= !SIGSYS_BIT;
            let mut b = a;
            b[1] = &act as *const _ as i64;
            // SAFETY: the program's call with its signal set replaced by a copy of ours that
            // outlives the call; the rest as it gave them.
            Some(unsafe { raw6(nr, b) })
        }
        libc::SYS_rt_sigprocmask => {
            if a[3] != 8 {
                return Some(EINVAL);
            }
            if let Some(cur) = frame_mask {
                let old = *cur;
                if a[1] != 0 {
                    let set = read_u64(a[1]);
                    *cur = match a[0] as i32 {
                        libc::SIG_BLOCK => old | set,
                        libc::SIG_UNBLOCK => old & !set,
                        libc::SIG_SETMASK => set,
                        _ => return Some(EINVAL),
                    } & !SIGSYS_BIT;
                }
                if a[2] != 0 {
                    write_u64(a[2], old);
                }
                return Some(0);
            }
            if a[1] == 0 {
                return None;
            }
            let set = read_u64(a[1]) & !SIGSYS_BIT;
            let mut b = a;
            b[1] = &set as *const u64 as i64;
            // SAFETY: the program's call with its signal set replaced by a copy of ours that
            // outlives the call; the rest as it gave them.
            Some(unsafe { raw6(nr, b) })
        }
        libc::SYS_rt_sigsuspend | libc::SYS_ppoll | libc::SYS_epoll_pwait | libc::SYS_epoll_pwait2 => {
            let i = match nr {
                libc::SYS_rt_sigsuspend => 0,
                libc::SYS_ppoll => 3,
                _ => 4,
            };
            if a[i] == 0 {
                return None;
            }
            let set = read_u64(a[i]) & !SIGSYS_BIT;
            let mut b = a;
            b[i] = &set as *const u64 as i64;
            // SAFETY: the program's call with its signal set replaced by a copy of ours that
            // outlives the call; the rest as it gave them.
            Some(with_mask(frame_mask, || unsafe { raw6(nr, b) }))
        }
        libc::SYS_pselect6 => {
            if a[5] == 0 {
                return None;
            }
            // SAFETY: pselect6's sixth argument: { const sigset_t *, size_t }.
            let [ss, len]: [u64; 2] = unsafe { core::ptr::read_unaligned(a[5] as *const [u64; 2]) };
            if ss == 0 {
                return None;
            }
            let set = read_u64(ss as i64) & !SIGSYS_BIT;
            let pair = [&set as *const u64 as u64, len];
            let mut b = a;
            b[5] = pair.as_ptr() as i64;
            // SAFETY: the program's call with its signal set replaced by a copy of ours that
            // outlives the call; the rest as it gave them.
            Some(with_mask(frame_mask, || unsafe { raw6(nr, b) }))
        }
        _ => None,
    }
}

/// Inside the SIGSYS handler, a call that waits for signals runs with the
/// program's mask (the handler's own blocks them all).
fn with_mask(frame_mask: Option<&mut u64>, f: impl FnOnce() -> i64) -> i64 {
    if let Some(m) = frame_mask {
        program_mask(*m);
    }
    f()
}

/// Selector back to BLOCK, then the program's mask: from here on a signal
/// handler of the program may run, and its calls are intercepted.
pub fn program_mask(m: u64) {
    thread().selector.store(BLOCK, Ordering::SeqCst);
    let set = m & !SIGSYS_BIT;
    // SAFETY: 8-byte signal masks of ours, as the size says.
    unsafe {
        raw(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK as i64,
            &set as *const u64 as i64,
            0,
            8,
            0,
            0,
        )
    };
}

fn is_special(nr: i64) -> bool {
    crate::calls::table::is_entry_call(nr)
}

/// The SIGSYS handler: its frame is on the signal stack when the thread
/// has one (SA_ONSTACK: a Go thread's, whose goroutine stacks have no
/// room for it), and otherwise it runs on the thread's hook stack (see
/// `sys::ThreadState::hook_top`).
extern "C" fn sigsys(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: as in `handle_sigsys`.
    let (code, g) = unsafe { ((*info).si_code, &(*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs) };
    if code == SYS_USER_DISPATCH && g[libc::REG_RAX as usize] == libc::SYS_exit {
        // A thread ends: its hook stack goes first (we are not on it yet).
        let status = g[libc::REG_RDI as usize];
        sys::free_hook_stack();
        // SAFETY: no memory is passed.
        unsafe { raw(libc::SYS_exit, status, 0, 0, 0, 0, 0) };
    }
    if code == SYS_USER_DISPATCH && g[libc::REG_RAX as usize] == libc::SYS_exit_group {
        // The process ends: its site runs once, so rewriting it (and
        // mapping a hook stack to do so) would be all the work a short
        // process such as /bin/true pays us at its end.
        // SAFETY: the program's own exit_group, with its status: no memory.
        unsafe { raw(libc::SYS_exit_group, g[libc::REG_RDI as usize], 0, 0, 0, 0, 0) };
    }
    // SAFETY: as above.
    let alt = unsafe { (*(ctx as *const libc::ucontext_t)).uc_stack };
    let start = alt.ss_sp as usize;
    let frame_on_alt = alt.ss_flags & libc::SS_DISABLE == 0 && (start..start + alt.ss_size).contains(&(ctx as usize));
    let sp = g[libc::REG_RSP as usize] as usize;
    sys::on_hook_stack(sp, &mut || {
        if frame_on_alt {
            // A signal that arrives while the handler waits with the
            // program's mask (`program_mask`) would put its frame at the top
            // of the signal stack, over ours: until rt_sigreturn installs
            // the program's again, the signal stack is the free part of the
            // hook stack.
            sys::signal_stack_below_here();
        }
        handle_sigsys(sig, info, ctx)
    });
}

fn handle_sigsys(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let t = thread();
    t.selector.store(ALLOW, Ordering::SeqCst);
    // SAFETY: the kernel passes a valid siginfo and ucontext to an
    // SA_SIGINFO handler; we are their only user until we return.
    let (info_ref, uc) = unsafe { (&*info, &mut *(ctx as *mut libc::ucontext_t)) };
    if info_ref.si_code != SYS_USER_DISPATCH {
        foreign(sig, info, ctx);
        t.selector.store(BLOCK, Ordering::SeqCst);
        return;
    }
    let g = &mut uc.uc_mcontext.gregs;
    let nr = g[libc::REG_RAX as usize];
    let ret = g[libc::REG_RIP as usize];
    let a = [
        g[libc::REG_RDI as usize],
        g[libc::REG_RSI as usize],
        g[libc::REG_RDX as usize],
        g[libc::REG_R10 as usize],
        g[libc::REG_R8 as usize],
        g[libc::REG_R9 as usize],
    ];
    // Rewrite the site and run it again through the trampoline (rax still
    // holds the number: the kernel rolled it back).
    if (0..512).contains(&nr)
        && t.vforked.load(Ordering::Relaxed) == 0
        && crate::zpoline::rewrite_site_unless_busy(ret as usize - 2)
    {
        g[libc::REG_RIP as usize] = ret - 2;
        t.selector.store(BLOCK, Ordering::SeqCst);
        return;
    }
    crate::before_serving(nr);
    if is_special(nr) {
        if crate::is_clone(nr) {
            // SAFETY: uc_sigmask is at least 8 bytes, suitably aligned.
            let mask = unsafe { *(&uc.uc_sigmask as *const libc::sigset_t as *const u64) };
            crate::before_clone(nr, a, Some(mask));
        }
        let g = &mut uc.uc_mcontext.gregs;
        g[libc::REG_R11 as usize] = ret;
        g[libc::REG_RIP as usize] = sys::shortfuse_special as *const () as i64;
        t.selector.store(BLOCK, Ordering::SeqCst);
        return;
    }
    // The kernel's sigset is the first 8 bytes of uc_sigmask.
    // SAFETY: uc_sigmask is at least 8 bytes, suitably aligned.
    let mask = unsafe { &mut *(&mut uc.uc_sigmask as *mut libc::sigset_t as *mut u64) };
    if nr == libc::SYS_sigaltstack {
        let sp = uc.uc_mcontext.gregs[libc::REG_RSP as usize] as usize;
        uc.uc_mcontext.gregs[libc::REG_RAX as usize] = sigaltstack(a, sp, &mut uc.uc_stack);
        t.selector.store(BLOCK, Ordering::SeqCst);
        return;
    }
    let r = match crate::serve_daemon_wait(nr, a, Some(*mask)).or_else(|| signal_call(nr, a, Some(&mut *mask))) {
        Some(r) => r,
        None => match crate::serve(nr, a, Some(*mask)) {
            Some(r) => r,
            None if crate::page0::faults(nr, &a) => -i64::from(libc::EFAULT),
            None => {
                program_mask(*mask);
                crate::calls::spare::before_kernel(nr);
                // SAFETY: the program's own call, its arguments as it gave them: the kernel checks
                // them as it would have.
                unsafe { raw6(nr, a) }
            }
        },
    };
    uc.uc_mcontext.gregs[libc::REG_RAX as usize] = r;
    t.selector.store(BLOCK, Ordering::SeqCst);
}

/// sigaltstack inside the SIGSYS handler, for a call made with stack
/// pointer `sp`. rt_sigreturn installs the signal stack saved in the frame
/// (`saved`, as it was when the call trapped): a new one is written there
/// too, or it would be undone (a Go thread's first sigaltstack, which traps
/// before the thread has a signal stack).
///
/// The frame holds the kernel's stored flags, not what sigaltstack reports:
/// a thread that never had a signal stack reads there as one of size 0
/// that is on. The old stack is reported as the kernel would (SS_DISABLE
/// when there is none, SS_ONSTACK when `sp` is on it): a Go thread linked
/// against glibc adopts a signal stack it finds on, and one of size 0
/// left it with none, so that the SIGSYS frames of its calls went on its
/// goroutines' stacks of a few kilobytes, over their neighbours.
fn sigaltstack(a: [i64; 6], sp: usize, saved: &mut libc::stack_t) -> i64 {
    let old = reported(saved, sp);
    if a[0] != 0 {
        if old.ss_flags & libc::SS_ONSTACK != 0 {
            return -(libc::EPERM as i64);
        }
        // The kernel checks the new stack (our own stack is not on it).
        // SAFETY: the program's own argument, as it gave it.
        let r = unsafe { raw(libc::SYS_sigaltstack, a[0], 0, 0, 0, 0, 0) };
        if r < 0 {
            return r;
        }
        // SAFETY: the program's stack_t, which the kernel just read.
        let new: libc::stack_t = unsafe { core::ptr::read_unaligned(a[0] as *const libc::stack_t) };
        *saved = if new.ss_flags & libc::SS_DISABLE != 0 {
            libc::stack_t {
                ss_sp: core::ptr::null_mut(),
                ss_flags: libc::SS_DISABLE,
                ss_size: 0,
            }
        } else {
            new
        };
    }
    if a[1] != 0 {
        // SAFETY: the program's output stack_t, as the kernel would write it.
        unsafe { core::ptr::write_unaligned(a[1] as *mut libc::stack_t, old) };
    }
    0
}

/// SS_AUTODISARM: the kernel disables the stack while a handler runs on it.
const SS_AUTODISARM: i32 = 1 << 31;

/// What sigaltstack reports for the stored stack `st` to a caller at `sp`
/// (the kernel's `sas_ss_flags`).
fn reported(st: &libc::stack_t, sp: usize) -> libc::stack_t {
    let mut out = *st;
    let base = st.ss_sp as usize;
    let autodisarm = st.ss_flags & SS_AUTODISARM;
    out.ss_flags = if st.ss_size == 0 {
        libc::SS_DISABLE
    } else if autodisarm == 0 && sp > base && sp - base <= st.ss_size {
        libc::SS_ONSTACK
    } else {
        0
    } | autodisarm;
    out
}

/// A SIGSYS that is not a dispatch trap (seccomp, kill): what the program
/// asked for.
fn foreign(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let act = app_sigsys();
    match act.handler as usize {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // Default action (core dump): give the signal back to the kernel
            // with no handler. Dispatch traps can no longer be served, which
            // does not matter: the process is ending.
            let dfl = KSigaction::default();
            // SAFETY: kernel sigaction structs of ours, alive across the call, with an 8-byte mask
            // as the size says.
            unsafe { raw(libc::SYS_rt_sigaction, sig as i64, &dfl as *const _ as i64, 0, 8, 0, 0) };
            let unblock = SIGSYS_BIT;
            // SAFETY: 8-byte signal masks of ours, as the size says.
            unsafe {
                raw(
                    libc::SYS_rt_sigprocmask,
                    libc::SIG_UNBLOCK as i64,
                    &unblock as *const u64 as i64,
                    0,
                    8,
                    0,
                    0,
                )
            };
            let pid = process::getpid();
            let tid = process::gettid();
            // SAFETY: no memory is passed.
            unsafe { raw(libc::SYS_tgkill, pid, tid, sig as i64, 0, 0, 0) };
        }
        h => {
            t_block_for_app();
            if act.flags & libc::SA_SIGINFO as u64 != 0 {
                // SAFETY: the program registered this function as an
                // SA_SIGINFO handler for SIGSYS.
                let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { core::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the program registered this function as a plain
                // SIGSYS handler.
                let f: extern "C" fn(i32) = unsafe { core::mem::transmute(h) };
                f(sig);
            }
        }
    }
}

/// The program's handler runs as it would have: selector at BLOCK.
fn t_block_for_app() {
    thread().selector.store(BLOCK, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caught_mask_is_read_from_its_status_line() {
        assert_eq!(sig_cgt(b"SigCgt:\t0000000180014002"), Some(0x0000_0001_8001_4002));
        assert_eq!(sig_cgt(b"SigIgn:\t0000000000001000"), None);
        assert_eq!(sig_cgt(b"SigCgt:\t12"), None);
    }

    #[test]
    fn a_handler_in_place_is_among_the_caught_signals() {
        extern "C" fn nothing(_: libc::c_int) {}
        let bit = 1u64 << (libc::SIGURG - 1);
        // SAFETY: a handler that does nothing, for a signal nothing sends the test.
        let old = unsafe { libc::signal(libc::SIGURG, nothing as *const () as libc::sighandler_t) };
        let caught = caught_signals();
        // SAFETY: the action the test found, put back.
        unsafe { libc::signal(libc::SIGURG, old) };
        assert_eq!(caught.map(|c| c & bit), Some(bit));
        assert_eq!(caught_signals().map(|c| c & bit), Some(0));
    }
}
