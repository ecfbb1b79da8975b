//! Raw system calls, the hook entry and the per-thread state the assembly
//! reads. Everything here runs with the program's registers and stack: no
//! libc, no locks.
//!
//! Registers. A system call preserves every register but rax (the result),
//! rcx and r11 (the CPU overwrites them). The entry therefore lets the
//! kernel run non-file calls straight from its fast path (a bitmap test and
//! our own `syscall`), and around the Rust hook it saves the argument
//! registers, rflags and the vector state (`xsave`, or `fxsave` on CPUs
//! without it, or moves of the registers where AVX or AVX-512 is all there
//! is, see [`Cfg::xsave_on`]): glibc's memcpy inside the hook uses ymm/zmm
//! registers that the interrupted code may hold live across its
//! `syscall`. (The hook leaves the x87 state, MXCSR's control bits and
//! PKRU as they were: Rust and glibc keep the control words, which the ABI
//! makes callee-saved, and nothing of ours computes on the x87 stack.) The
//! `call *%rax` of a rewritten site stores its return address at rsp-8,
//! the top slot of the interrupted function's red zone; every zpoline-style
//! rewrite shares that limitation. The remaining 120 bytes are stepped over
//! before anything else is pushed.
#![allow(unsafe_code)]

pub mod fs;
pub mod mm;
pub mod process;

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

/// A system call straight to the kernel: the rings' wrapper of the
/// `syscall` instruction, inlined here, in our own mapping, which is never
/// rewritten and is exempt from Syscall User Dispatch. Its `# Safety`
/// section is the contract of every caller.
pub use shortfuse_ring::raw_syscall as raw;

/// Bytes of the stack [`on_own_stack`] runs code on.
const OWN_STACK: usize = 8 << 20;

/// Runs `f` on a stack of its own (mapped for the call, unmapped after):
/// for a vfork child, which runs on its parent's small spawn stack
/// (posix_spawn's is about 32 KiB) and must not grow it. Without memory
/// for the stack, `f` does not run.
pub fn on_own_stack(f: &mut dyn FnMut()) {
    let flags = i64::from(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE);
    let prot = i64::from(libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: a fresh anonymous map where the kernel finds room.
    let base = unsafe { mm::mmap(0, OWN_STACK as i64, prot, flags, -1, 0) };
    if base < 0 {
        return;
    }
    call_on_stack(base as usize + OWN_STACK, f);
    // SAFETY: the stack mapped above, which `f` has left.
    unsafe { mm::munmap(base, OWN_STACK as i64) };
}

/// Calls `f` with the stack pointer at `top` (rounded down to 16 bytes,
/// as the ABI wants), and back.
fn call_on_stack(top: usize, f: &mut dyn FnMut()) {
    extern "C" fn trampoline(data: *mut u8) {
        // SAFETY: `data` is the `&mut &mut dyn FnMut()` passed below, alive
        // for the whole call.
        let f = unsafe { &mut *(data as *mut &mut dyn FnMut()) };
        f();
    }
    let top = top & !15;
    let mut f = f;
    let data = &mut f as *mut &mut dyn FnMut() as *mut u8;
    // SAFETY: switches to the given stack for one call of `trampoline` and
    // back: r12 (callee-saved, so kept by the call) holds the old stack
    // pointer; every register the C ABI lets the callee change is marked
    // clobbered.
    unsafe {
        core::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "call {tramp}",
            "mov rsp, r12",
            top = in(reg) top,
            tramp = sym trampoline,
            in("rdi") data,
            out("r12") _,
            clobber_abi("C"),
        );
    }
}

/// Bytes of a thread's hook stack (below it, one guard page). Mapped
/// with MAP_NORESERVE: only the pages the hook touches cost memory.
pub const HOOK_STACK: usize = 4 << 20;
const GUARD: usize = 4096;

/// [`ThreadState::hook_top`] while the stack is being mapped.
const MAPPING: u64 = 1;

/// Maps this thread's hook stack (see [`ThreadState::hook_top`]); the top,
/// or None (no memory, or being mapped by an outer call of this thread).
/// The entry does the same in assembly.
fn hook_stack_top(t: &ThreadState) -> Option<usize> {
    match t.hook_top.load(Ordering::Relaxed) {
        0 => {}
        MAPPING => return None,
        top => return Some(top as usize),
    }
    t.hook_top.store(MAPPING, Ordering::Relaxed);
    let flags = i64::from(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE);
    let prot = i64::from(libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: a fresh anonymous map where the kernel finds room.
    let base = unsafe { mm::mmap(0, (HOOK_STACK + GUARD) as i64, prot, flags, -1, 0) };
    if base < 0 {
        t.hook_top.store(0, Ordering::Relaxed);
        return None;
    }
    // SAFETY: the guard page at the bottom of the map just made.
    unsafe { mm::mprotect(base, GUARD as i64, i64::from(libc::PROT_NONE)) };
    let top = base as usize + GUARD + HOOK_STACK;
    t.hook_top.store(top as u64, Ordering::Relaxed);
    Some(top)
}

/// Runs `f` on this thread's hook stack, unless an outer call of this
/// thread is on it (a signal handler interrupted the hook), or without
/// memory for one: the program's stack may be a goroutine's few
/// kilobytes, or a signal stack of the kernel's minimum size, where the
/// hook's frames do not fit. A vfork child uses the hook stack of the
/// thread that vforked while that thread has no call on it.
///
/// `interrupted_sp` is the stack pointer the signal interrupted. Below an
/// outer call on the hook stack, `f` runs where the signal's frame is when
/// that is the hook stack; when the kernel put the frame on the program's
/// signal stack (the outer call made a system call that trapped: the exec
/// the hook serves with the program's selector), `f` goes on below the
/// outer call's frames, under the interrupted stack pointer: that signal
/// stack may hold little more than the kernel's frame (Rust's is
/// SIGSTKSZ or the kernel's minimum).
pub fn on_hook_stack(interrupted_sp: usize, f: &mut dyn FnMut()) {
    let t = thread();
    if t.vforked.load(Ordering::Relaxed) != 0 {
        // A vfork child: the thread that vforked sleeps, and its hook stack
        // is free unless one of its calls is on it (a file system that
        // starts a process). Its count of calls there is left alone (an
        // exec from here never comes back to lower it); the child's mark
        // (2) keeps a nested call off the top.
        let top = t.hook_top.load(Ordering::Relaxed);
        if t.vforked.load(Ordering::Relaxed) == 1 && t.hook_depth.load(Ordering::Relaxed) == 0 && top > MAPPING {
            t.vforked.store(2, Ordering::Relaxed);
            call_on_stack(top as usize, f);
            t.vforked.store(1, Ordering::Relaxed);
            return;
        }
        return f();
    }
    if t.hook_depth.load(Ordering::Relaxed) != 0 {
        let top = t.hook_top.load(Ordering::Relaxed) as usize;
        let on_hook = |a: usize| top > MAPPING as usize && (top - HOOK_STACK..top).contains(&a);
        let here = &top as *const usize as usize;
        if !on_hook(here) && on_hook(interrupted_sp) {
            // Past the interrupted code's red zone.
            return call_on_stack(interrupted_sp - RED_ZONE, f);
        }
        return f();
    }
    let Some(top) = hook_stack_top(t) else { return f() };
    // Counted before the switch and after the way back, so that a signal
    // handler's call in between never takes the top of a stack in use.
    t.hook_depth.fetch_add(1, Ordering::Relaxed);
    call_on_stack(top, f);
    t.hook_depth.fetch_sub(1, Ordering::Relaxed);
}

/// Bytes below its stack pointer that x86-64 code may use without moving it.
const RED_ZONE: usize = 128;

/// When running on this thread's hook stack: makes its free part, below
/// the caller's frame, the thread's signal stack.
pub fn signal_stack_below_here() {
    let top = thread().hook_top.load(Ordering::Relaxed) as usize;
    let here = &top as *const usize as usize;
    if top <= MAPPING as usize || !(top - HOOK_STACK..top).contains(&here) {
        return;
    }
    let base = top - HOOK_STACK;
    let st = libc::stack_t {
        ss_sp: base as *mut libc::c_void,
        ss_flags: 0,
        ss_size: (here - 4096 - base) & !15,
    };
    // SAFETY: a stack_t of ours naming the unused part of this thread's
    // hook stack, which lives as long as the thread.
    unsafe { raw(libc::SYS_sigaltstack, &st as *const libc::stack_t as i64, 0, 0, 0, 0, 0) };
}

/// Before a thread exits: its hook stack goes (unless an outer call is on
/// it, or it is the stack of the thread that vforked us).
pub fn free_hook_stack() {
    let t = thread();
    let top = t.hook_top.load(Ordering::Relaxed) as usize;
    if t.vforked.load(Ordering::Relaxed) != 0 || top <= MAPPING as usize || t.hook_depth.load(Ordering::Relaxed) != 0 {
        return;
    }
    t.hook_top.store(0, Ordering::Relaxed);
    let base = top - HOOK_STACK - GUARD;
    // SAFETY: this thread's hook stack, which no call is on (checked above).
    unsafe { mm::munmap(base as i64, (HOOK_STACK + GUARD) as i64) };
}

/// Takes ownership of descriptor `fd`, which the caller made and owns.
pub fn owned_file(fd: i64) -> std::fs::File {
    // SAFETY: callers pass a descriptor they just created and hand over.
    unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) }
}

/// [`raw`] with three arguments.
///
/// # Safety
///
/// As for [`raw`].
pub unsafe fn raw3(nr: i64, a1: i64, a2: i64, a3: i64) -> i64 {
    // SAFETY: the caller's contract, as for `raw`.
    unsafe { raw(nr, a1, a2, a3, 0, 0, 0) }
}

/// [`raw`] with the six arguments in an array.
///
/// # Safety
///
/// As for [`raw`].
pub unsafe fn raw6(nr: i64, a: [i64; 6]) -> i64 {
    // SAFETY: the caller's contract, as for `raw`.
    unsafe { raw(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

/// Appends `data` to the file at `path` (created 0644), in one write so
/// that lines of several processes do not interleave. Errors are dropped:
/// the caller is a destructor with nowhere to report them.
pub fn append_file(path: &[u8], data: &[u8]) {
    let mut p = path.to_vec();
    p.push(0);
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC;
    let fd = fs::openat(libc::AT_FDCWD, &p, flags, 0o644);
    if fd < 0 {
        return;
    }
    fs::write(fd as i32, data);
    fs::close(fd as i32);
}

/// Settings the assembly reads, in one block at a fixed layout
/// (`shortfuse_cfg`, defined below so that it is local to our object and
/// reachable rip-relative).
#[repr(C)]
pub struct Cfg {
    /// Bit n set: system call n leaves the fast path (file calls, signal
    /// calls when Syscall User Dispatch is on, the clone family).
    pub slow: [AtomicU64; 8],
    /// Offset of [`ThreadState`] from the thread pointer (`%fs:0`).
    pub tls_off: AtomicU64,
    /// Bytes reserved on the stack for the vector state.
    pub xsave_size: AtomicU64,
    /// 0: `fxsave`/`fxrstor`; 1: `xsave`/`xrstor`; 2: `xsavec`/`xrstor`
    /// (the compacted form skips components in their initial state: the
    /// AVX-512 registers a program seldom uses); 3: on CPUs whose only
    /// vector state is AVX, moves of ymm0-15 (of xmm0-15 when the upper
    /// halves are not in use, which `vzeroupper` then leaves clean); 4: on
    /// CPUs whose vector state is AVX-512 (with 64-bit masks, AVX512BW), moves
    /// of zmm0-31, k0-7 and MXCSR (xsavec and xrstor of the same state
    /// cost several times as much, mostly their own microcode: glibc's
    /// string functions keep zmm16-31 and the masks in use, so the
    /// compacted form saves little).
    pub xsave_on: AtomicU64,
    /// Non-zero: new threads and forked children turn on Syscall User
    /// Dispatch for themselves.
    pub sud_on: AtomicU64,
    /// Our own executable mapping, exempt from Syscall User Dispatch.
    pub text_start: AtomicU64,
    pub text_len: AtomicU64,
    /// Set by the assembly in every new process (a clone without CLONE_VM,
    /// libc's fork or a raw one): see `crate::serve`.
    pub forked: AtomicU64,
    /// The clone clock: high half, clone-family calls started (moved by
    /// [`clone_starts`] before each); low half, those running (moved back
    /// by the assembly once the call returns in the parent, and in a child
    /// with memory of its own). See `calls::shared::settle`.
    pub clones: AtomicU64,
    /// Clone-family calls about to run or running (moved by
    /// `crate::fork_gate` before each, back by the assembly once the call
    /// returns in the parent; zeroed in a child with memory of its own):
    /// served calls wait while it is non-zero.
    pub forking: AtomicU64,
    /// Non-zero while a closed placeholder is kept open for the next open
    /// (`calls::spare`): every system call then leaves the fast path, so
    /// that the kernel never sees the number the program gave back.
    pub spare: AtomicU64,
    _line: [AtomicU64; 6],
    /// On a cache line of its own (every fast-path call reads the one
    /// above). Moved before every call that may unmap memory or take a protection
    /// away (by the entry's fast path, and by [`crate::before_serving`]):
    /// pages found readable while it is unchanged still are (see `user`).
    pub mem_gen: AtomicU64,
}

const _: () = {
    assert!(core::mem::offset_of!(Cfg, tls_off) == 64);
    assert!(core::mem::offset_of!(Cfg, xsave_size) == 72);
    assert!(core::mem::offset_of!(Cfg, xsave_on) == 80);
    assert!(core::mem::offset_of!(Cfg, sud_on) == 88);
    assert!(core::mem::offset_of!(Cfg, text_start) == 96);
    assert!(core::mem::offset_of!(Cfg, text_len) == 104);
    assert!(core::mem::offset_of!(Cfg, forked) == 112);
    assert!(core::mem::offset_of!(Cfg, clones) == 120);
    assert!(core::mem::offset_of!(Cfg, forking) == 128);
    assert!(core::mem::offset_of!(Cfg, spare) == 136);
    assert!(core::mem::offset_of!(Cfg, mem_gen) == 192);
    assert!(core::mem::size_of::<Cfg>() <= 256);
};

extern "C" {
    static shortfuse_cfg: Cfg;
    pub fn shortfuse_entry();
    /// Runs a clone-family call or rt_sigreturn for the program: entered
    /// with rsp as at the system call, r11 the address to return to, rax the
    /// number and the arguments in their registers.
    pub fn shortfuse_special();
    /// `sa_restorer` of our SIGSYS handler: its rt_sigreturn is issued from
    /// our text, which Syscall User Dispatch lets through.
    pub fn shortfuse_restorer();
}

/// A clone-family call is about to run (see [`Cfg::clones`]).
pub fn clone_starts() {
    cfg().clones.fetch_add((1 << 32) + 1, Ordering::SeqCst);
}

pub fn cfg() -> &'static Cfg {
    // SAFETY: a zero-initialised block of atomics, defined in the assembly
    // below with the size and alignment of `Cfg`.
    unsafe { &shortfuse_cfg }
}

/// Selector values of Syscall User Dispatch.
pub const ALLOW: u8 = 0;
pub const BLOCK: u8 = 1;

/// Per-thread state, at a fixed offset from the thread pointer (the shim
/// is loaded at start-up, so its TLS block is in the static TLS area). The
/// assembly reads and writes the first fields.
#[repr(C)]
pub struct ThreadState {
    /// Return address of a vfork-like call: its child runs on this very
    /// stack, so the address cannot be kept there.
    pub vfork_ret: AtomicU64,
    /// Set in the child of a vfork-like call (it shares our memory and this
    /// state until it execs or exits); cleared when the parent resumes.
    pub vforked: AtomicU8,
    /// The Syscall User Dispatch selector of this thread.
    pub selector: AtomicU8,
    /// Inside `calls::dispatch`: the file system's own system calls go to
    /// the kernel.
    pub in_hook: AtomicBool,
    /// The top of this thread's hook stack ([`HOOK_STACK`] bytes, mapped
    /// by the entry or [`on_hook_stack`] on the thread's first call that
    /// leaves the fast path, unmapped when the thread calls exit); 0: none
    /// yet; [`MAPPING`]: being mapped. The hook runs there, not on the
    /// program's stack: a goroutine's stack has a few hundred bytes to
    /// spare below a system call, far less than the hook's frames and the
    /// vector state the entry saves.
    pub hook_top: AtomicU64,
    /// Where the entry keeps the call's registers while it maps the hook
    /// stack (rdi, rsi, rdx, r10, r8, r9, rax), and a new thread or
    /// process its own while it turns on Syscall User Dispatch
    /// (`shortfuse_sud_child`).
    pub saved: [AtomicU64; 7],
    /// Calls of this thread that switched to the hook stack and have not
    /// left it (0 or 1; a `longjmp` out of a signal handler that
    /// interrupted the hook leaves it at 1, and the thread's calls then
    /// stay on their own stacks).
    pub hook_depth: AtomicU64,
    /// Pages of the program's found readable, or writable with the low bit
    /// set (see `user`), while
    /// [`Cfg::mem_gen`] is `probed_gen`; 0: none.
    pub probed: [AtomicU64; PROBED],
    pub probed_gen: AtomicU64,
    pub probed_next: AtomicU64,
    /// Which of the fork gate's counters this thread's served calls move,
    /// plus one; 0: none chosen yet (see `crate::fork_gate`).
    pub gate_stripe: AtomicU64,
}

/// Readable pages each thread remembers. A program's calls pass paths and
/// buffers from its stack, its heap and its libraries' constants, a few
/// dozen pages in turn (git status: about thirty), which a list of four
/// kept pushing each other out of: one page of libc's constants was probed
/// again and again. Looking through them all costs less than one probe.
pub const PROBED: usize = 32;

/// Whether system call `nr` may unmap memory or take a protection away
/// (the calls the entry's fast path moves [`Cfg::mem_gen`] for).
pub fn moves_memory(nr: i64) -> bool {
    matches!(nr, 9..=12 | 25 | 28 | 30 | 67 | 329)
}

/// Moves [`Cfg::mem_gen`]: pages found readable or writable must be probed again.
pub fn memory_moved() {
    cfg().mem_gen.fetch_add(1, Ordering::SeqCst);
}

const _: () = {
    assert!(core::mem::offset_of!(ThreadState, vforked) == 8);
    assert!(core::mem::offset_of!(ThreadState, selector) == 9);
    assert!(core::mem::offset_of!(ThreadState, hook_top) == 16);
    assert!(core::mem::offset_of!(ThreadState, saved) == 24);
    assert!(core::mem::offset_of!(ThreadState, hook_depth) == 80);
    assert!(HOOK_STACK == 0x40_0000 && GUARD == 0x1000 && MAPPING == 1);
};

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            vfork_ret: AtomicU64::new(0),
            vforked: AtomicU8::new(0),
            selector: AtomicU8::new(BLOCK),
            in_hook: AtomicBool::new(false),
            hook_top: AtomicU64::new(0),
            saved: [const { AtomicU64::new(0) }; 7],
            hook_depth: AtomicU64::new(0),
            probed: [const { AtomicU64::new(0) }; PROBED],
            probed_gen: AtomicU64::new(0),
            probed_next: AtomicU64::new(0),
            gate_stripe: AtomicU64::new(0),
        }
    };
}

/// This thread's state. A `const` thread-local without a destructor: no
/// registration, no allocation, usable from a signal handler.
pub fn thread() -> &'static ThreadState {
    // SAFETY: the reference does not outlive the thread in practice: every
    // caller uses it within the current call; 'static only spares lifetimes
    // through the hook's plumbing.
    THREAD.with(|t| unsafe { &*(t as *const ThreadState) })
}

fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: on x86-64 Linux %fs:0 holds the thread pointer itself (TLS ABI).
    unsafe { asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

/// Fills the parts of [`Cfg`] that depend on the CPU and the TLS layout.
pub fn init_cfg() {
    let c = cfg();
    let off = (thread() as *const ThreadState as usize).wrapping_sub(thread_pointer());
    c.tls_off.store(off as u64, Ordering::Relaxed);
    let (on, size) = inherited_xsave_layout().unwrap_or_else(|| {
        let layout = xsave_layout();
        pass_xsave_layout(layout);
        layout
    });
    c.xsave_on.store(on as u64, Ordering::Relaxed);
    c.xsave_size.store(size as u64, Ordering::Relaxed);
}

/// Where the first process of a program leaves the layout that
/// [`xsave_layout`] found, for the processes it starts: `XCR0:MODE:SIZE`
/// in hexadecimal. Each `cpuid` traps to the hypervisor in a virtual
/// machine (18 µs each here, up to six of them on an AVX-512 CPU: a tenth
/// of what the shim costs a short process at start).
const XSAVE_VAR: &str = "SHORTFUSE_XSAVE";

/// The layout handed down by [`XSAVE_VAR`], when it was found under the
/// same enabled state components (XCR0) as ours: the CPU and the kernel's
/// choice are then the same, hence the layout.
fn inherited_xsave_layout() -> Option<(u8, usize)> {
    let v = std::env::var(XSAVE_VAR).ok()?;
    let mut f = v.split(':').map(|x| u64::from_str_radix(x, 16).ok());
    let (xcr0, on, size) = (f.next()??, f.next()??, f.next()??);
    if f.next().is_some() || on > 4 || !(512..=1 << 16).contains(&size) || size % 64 != 0 {
        return None;
    }
    (Some(xcr0) == current_xcr0()).then_some((on as u8, size as usize))
}

fn pass_xsave_layout((on, size): (u8, usize)) {
    if let Some(xcr0) = current_xcr0() {
        // In the constructor, before the program's main: no other thread of
        // the program reads the environment yet.
        std::env::set_var(XSAVE_VAR, format!("{xcr0:x}:{on:x}:{size:x}"));
    }
}

/// XCR0 (the state components the kernel enabled), when the CPU has
/// `xgetbv` (OSXSAVE, from the cpuid leaf glibc read at start-up).
fn current_xcr0() -> Option<u64> {
    if glibc_cpuid(CPUID_INDEX_1).map(|r| r[2] & (1 << 27) != 0) != Some(true) {
        return None;
    }
    let (lo, hi): (u32, u32);
    // SAFETY: OSXSAVE is set, so xgetbv with ecx=0 is allowed.
    unsafe { asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) };
    Some(u64::from(hi) << 32 | u64::from(lo))
}

/// glibc's indexes of cpuid leaf 1 and of leaf 0xd, sub-leaf 1
/// (<sys/platform/x86.h>).
const CPUID_INDEX_1: u32 = 0;
const CPUID_INDEX_7: u32 = 1;
const CPUID_INDEX_D_ECX_1: u32 = 3;

/// The registers (eax, ebx, ecx, edx) of a cpuid leaf as glibc read them
/// when the process started (`__x86_get_cpuid_feature_leaf`, glibc 2.33):
/// no `cpuid` instruction, so no trap to a hypervisor.
fn glibc_cpuid(index: u32) -> Option<[u32; 4]> {
    type Leaf = unsafe extern "C" fn(u32) -> *const [u32; 8];
    // SAFETY: a lookup by a NUL-terminated name; a null result is checked.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__x86_get_cpuid_feature_leaf".as_ptr()) };
    if f.is_null() {
        return None;
    }
    // SAFETY: glibc's `const struct cpuid_feature *(unsigned int)`; the
    // struct starts with the four cpuid registers, then four words of usable
    // bits, and lives as long as the process.
    unsafe {
        let leaf = core::mem::transmute::<*mut libc::c_void, Leaf>(f)(index);
        (!leaf.is_null()).then(|| {
            let r = &*leaf;
            [r[0], r[1], r[2], r[3]]
        })
    }
}

/// How the entry saves the vector state (see [`Cfg::xsave_on`]), and the
/// size of the area: for the save instructions, that of the components
/// they save (x87, SSE, AVX, MPX, AVX-512: mask 0xff; the standard layout,
/// which the compacted one never exceeds); for the moves, 16 registers of
/// 32 bytes and a flag, or 32 of 64 bytes, 8 masks, MXCSR and a flag.
fn xsave_layout() -> (u8, usize) {
    use core::arch::x86_64::__cpuid_count;
    let l1 = glibc_cpuid(CPUID_INDEX_1).map_or_else(|| __cpuid_count(1, 0).ecx, |r| r[2]);
    if l1 & (1 << 27) == 0 {
        return (0, 512);
    }
    let d1 = glibc_cpuid(CPUID_INDEX_D_ECX_1).map_or_else(|| __cpuid_count(0xd, 1).eax, |r| r[0]);
    let xsavec = d1 & (1 << 1) != 0;
    let (lo, hi): (u32, u32);
    // SAFETY: OSXSAVE is set, so xgetbv with ecx=0 is allowed.
    unsafe { asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) };
    // x87, SSE and AVX, and PKRU (which the hook never writes), but no
    // AVX-512 or later state: the registers the hook may clobber are
    // ymm0-15, which plain moves save in 7 ns where xsavec and xrstor take
    // 170 (measured on these VMs). XINUSE (xgetbv 1) says whether their
    // upper halves are in use.
    let avx_only = lo & 0b110 == 0b110 && lo & !(0b111 | 1 << 9) == 0 && hi == 0;
    if avx_only && d1 & (1 << 2) != 0 {
        return (3, 576);
    }
    // x87, SSE, AVX, the masks, the upper halves of zmm0-15 and zmm16-31
    // (and PKRU): all a move can reach, with AVX512F and AVX512BW (kmovq).
    let l7 = glibc_cpuid(CPUID_INDEX_7).map_or_else(|| __cpuid_count(7, 0).ebx, |r| r[1]);
    let avx512 = lo & !(1 << 9) == 0xe7 && hi == 0 && l7 & (1 << 16 | 1 << 30) == 1 << 16 | 1 << 30;
    if avx512 {
        return (4, 2176);
    }
    let mut end = 576; // legacy area and header
    for i in 2..8 {
        if lo & (1 << i) != 0 {
            let s = __cpuid_count(0xd, i);
            end = end.max((s.ebx + s.eax) as usize);
        }
    }
    (if xsavec { 2 } else { 1 }, end.next_multiple_of(64))
}

/// Marks system call `nr` as one the fast path leaves alone.
pub fn set_slow(nr: i64) {
    if (0..512).contains(&nr) {
        cfg().slow[nr as usize / 64].fetch_or(1 << (nr % 64), Ordering::Relaxed);
    }
}

/// Stores two bytes with one instruction, so that another CPU fetching
/// them sees the old or the new pair, never a mix (the caller keeps the
/// pair inside one cache line).
///
/// # Safety
/// `p` must be writable for two bytes.
pub unsafe fn store2(p: *mut u8, v: [u8; 2]) {
    // SAFETY: forwarded to the caller.
    unsafe { asm!("mov word ptr [{p}], {v:x}", p = in(reg) p, v = in(reg) u16::from_le_bytes(v), options(nostack)) };
}

// The trampoline at address 0 ends in `jmp *%r11` to `shortfuse_entry`,
// the stack 0x80 bytes below the return address that `call *%rax` pushed.
//
// Fast path: a number the bitmap does not mark goes to the kernel from
// here, every register as the program left it, unless a spare placeholder
// is parked (`Cfg::spare`).
//
// Slow path: switch to the thread's hook stack (the old stack pointer is
// the first thing pushed there), save arguments, rflags and vector state,
// call `shortfuse_hook(a1..a6, nr)` on a 16-byte aligned stack, restore.
// exit (60) unmaps the thread's hook stack, then exits.
//
// rt_sigreturn (15) runs on the stack its signal frame is on. clone 56,
// fork 57 and vfork 58 first take the slow path (the hook gives the
// descriptions of a daemon's files to the daemon before a new process can
// inherit them, see `calls::shared`), then, like clone3 435, go to
// `shortfuse_special` with r11 = return address and the stack as at the
// call site:
// - clone3 answers ENOSYS (as seccomp sandboxes do); glibc then uses clone,
//   whose stack argument we can see.
// - clone with a new stack: the return address is copied to the top of
//   the child's stack (rsi -= 8 for the call, restored after), the child
//   `ret`s there; the parent keeps its copy below its red zone.
// - fork-like (fork, clone without CLONE_VM and without a stack): the
//   child has a copy of our stack, so the address stays below the red zone.
// - vfork-like (vfork, clone with CLONE_VM and no stack): the child runs on
//   this stack and would overwrite anything we left there, so the address
//   waits in the thread's ThreadState.vfork_ret (the child shares it, and
//   the parent sleeps until the child has exec'd or exited).
// - children: `shortfuse_child` turns on Syscall User Dispatch for a new
//   thread or process (it is not inherited), and marks a vfork child,
//   which gets it too: its calls before the exec (posix_spawn's file
//   actions, the exec of a program on a mount) trap where no site is
//   rewritten (with Syscall User Dispatch alone, or a site that could not
//   be rewritten while the parent has threads). It shares the parent's
//   ThreadState, whose selector it leaves at BLOCK, as the parent's was.
global_asm!(
    ".pushsection .bss.shortfuse_cfg,\"aw\",@nobits",
    ".balign 64",
    ".globl shortfuse_cfg",
    ".hidden shortfuse_cfg",
    "shortfuse_cfg:",
    ".zero 256",
    ".popsection",
    "",
    ".globl shortfuse_entry",
    ".hidden shortfuse_entry",
    ".type shortfuse_entry,@function",
    "shortfuse_entry:",
    "cmp $512, %rax",
    "jae 10f",
    "btq %rax, shortfuse_cfg(%rip)",
    "jc 10f",
    "cmpq $0, shortfuse_cfg+136(%rip)",
    "jne 10f",
    // mmap 9 with MAP_FIXED, mprotect 10, munmap 11, brk 12, mremap 25,
    // madvise 28, shmat 30 (SHM_REMAP), shmdt 67 and pkey_mprotect 329
    // move `Cfg::mem_gen` first (r11 is free: the call clobbers it).
    "cmp $64, %rax",
    "jae 53f",
    "cmp $9, %rax",
    "je 56f",
    "mov $0x52001c00, %r11d",
    "bt %rax, %r11",
    "jnc 54f",
    "55:",
    "lock incq shortfuse_cfg+192(%rip)",
    "jmp 54f",
    "56:",
    "test $0x10, %r10",
    "jnz 55b",
    "jmp 54f",
    "53:",
    "cmp $67, %rax",
    "je 55b",
    "cmp $329, %rax",
    "je 55b",
    "54:",
    "syscall",
    "add $0x80, %rsp",
    "ret",
    "10:",
    "cmp $15, %rax",
    "je 20f",
    "cmp $435, %rax",
    "je 21f",
    "cmp $60, %rax",
    "je 40f",
    // Onto this thread's hook stack (sizes: HOOK_STACK, GUARD; offsets:
    // ThreadState), with nothing stored on the program's stack: r11 and rcx
    // are free (a system call clobbers them). Stay where we are in a vfork
    // child, while an outer call maps the stack, and while an outer call
    // of this thread is on it (a signal handler's call, on the hook stack
    // below the outer frames or on a signal stack). Pushed there: the old
    // stack pointer, then 1 if we switched (the count of calls on the
    // stack goes down by it on the way out, once off the stack).
    "mov %fs:0, %r11",
    "add shortfuse_cfg+64(%rip), %r11",
    "cmpb $0, 8(%r11)",
    "jne 31f",
    "mov 16(%r11), %rcx",
    "cmp $1, %rcx",
    "jb 32f",
    "je 31f",
    "cmpq $0, 80(%r11)",
    "jne 31f",
    "34:",
    "incq 80(%r11)",
    "mov %rsp, %r11",
    "mov %rcx, %rsp",
    "push %r11",
    "push $1",
    "jmp 35f",
    "31:",
    "mov %rsp, %r11",
    "push %r11",
    "push $0",
    "35:",
    "push %rbp",
    "mov %rsp, %rbp",
    "pushfq",
    "push %rdi",
    "push %rsi",
    "push %rdx",
    "push %r10",
    "push %r8",
    "push %r9",
    "push %rax",
    "sub shortfuse_cfg+72(%rip), %rsp",
    "and $-64, %rsp",
    "cmpb $4, shortfuse_cfg+80(%rip)",
    "je 70f",
    "cmpb $3, shortfuse_cfg+80(%rip)",
    "jne 16f",
    "mov $1, %ecx",
    "xgetbv",
    "and $4, %eax",
    "mov %rax, 512(%rsp)",
    "jz 17f",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "vmovdqu %ymm\\i, (\\i*32)(%rsp)",
    ".endr",
    "jmp 12f",
    "17:",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "vmovdqu %xmm\\i, (\\i*16)(%rsp)",
    ".endr",
    "jmp 12f",
    "16:",
    "cmpb $0, shortfuse_cfg+80(%rip)",
    "je 11f",
    "xor %eax, %eax",
    "mov %rax, 512(%rsp)",
    "mov %rax, 520(%rsp)",
    "mov %rax, 528(%rsp)",
    "mov %rax, 536(%rsp)",
    "mov %rax, 544(%rsp)",
    "mov %rax, 552(%rsp)",
    "mov %rax, 560(%rsp)",
    "mov %rax, 568(%rsp)",
    "mov $0xff, %eax",
    "xor %edx, %edx",
    "cmpb $2, shortfuse_cfg+80(%rip)",
    "je 15f",
    "xsave64 (%rsp)",
    "jmp 12f",
    "15:",
    "xsavec64 (%rsp)",
    "jmp 12f",
    "11:",
    "fxsave64 (%rsp)",
    "jmp 12f",
    // AVX-512 by moves (layout: zmm0-31, k0-7, MXCSR, then whether any
    // upper half of zmm0-15 is non-zero). With the upper halves all zero,
    // the restore writes the low halves and vzeroupper leaves them clean
    // again; the hook itself runs with them clean either way.
    "70:",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
    "vmovdqa64 %zmm\\i, (\\i*64)(%rsp)",
    ".endr",
    ".irp i, 0,1,2,3,4,5,6,7",
    "kmovq %k\\i, (2048+\\i*8)(%rsp)",
    ".endr",
    "stmxcsr 2112(%rsp)",
    ".irp i, 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "vpord %zmm\\i, %zmm0, %zmm0",
    ".endr",
    "vptestmq %zmm0, %zmm0, %k1",
    "kmovw %k1, %eax",
    "and $0xfc, %eax",
    "mov %rax, 2120(%rsp)",
    "vzeroupper",
    "12:",
    "sub $16, %rsp",
    "mov -64(%rbp), %rax",
    "mov %rax, (%rsp)",
    "mov -16(%rbp), %rdi",
    "mov -24(%rbp), %rsi",
    "mov -32(%rbp), %rdx",
    "mov -40(%rbp), %rcx",
    "mov -48(%rbp), %r8",
    "mov -56(%rbp), %r9",
    "cld",
    "call shortfuse_hook",
    "add $16, %rsp",
    "mov %rax, %r11",
    "cmpb $4, shortfuse_cfg+80(%rip)",
    "je 71f",
    "cmpb $3, shortfuse_cfg+80(%rip)",
    "jne 18f",
    "cmpq $0, 512(%rsp)",
    "je 19f",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "vmovdqu (\\i*32)(%rsp), %ymm\\i",
    ".endr",
    "jmp 14f",
    "19:",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "vmovdqu (\\i*16)(%rsp), %xmm\\i",
    ".endr",
    "vzeroupper",
    "jmp 14f",
    "18:",
    "cmpb $0, shortfuse_cfg+80(%rip)",
    "je 13f",
    "mov $0xff, %eax",
    "xor %edx, %edx",
    "xrstor64 (%rsp)",
    "jmp 14f",
    "13:",
    "fxrstor64 (%rsp)",
    "jmp 14f",
    "71:",
    "cmpq $0, 2120(%rsp)",
    "je 72f",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "vmovdqa64 (\\i*64)(%rsp), %zmm\\i",
    ".endr",
    "jmp 73f",
    "72:",
    "vzeroupper",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "vmovdqa (\\i*64)(%rsp), %xmm\\i",
    ".endr",
    "73:",
    ".irp i, 16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
    "vmovdqa64 (\\i*64)(%rsp), %zmm\\i",
    ".endr",
    ".irp i, 0,1,2,3,4,5,6,7",
    "kmovq (2048+\\i*8)(%rsp), %k\\i",
    ".endr",
    "ldmxcsr 2112(%rsp)",
    "14:",
    "mov %r11, %rax",
    "mov -16(%rbp), %rdi",
    "mov -24(%rbp), %rsi",
    "mov -32(%rbp), %rdx",
    "mov -40(%rbp), %r10",
    "mov -48(%rbp), %r8",
    "mov -56(%rbp), %r9",
    "mov -64(%rbp), %r11",
    "sub $56, %r11",
    "cmp $2, %r11",
    "jbe 15f",
    "lea -8(%rbp), %rsp",
    "popfq",
    "pop %rbp",
    "pop %rcx",
    "pop %rsp",
    "mov %fs:0, %r11",
    "add shortfuse_cfg+64(%rip), %r11",
    "sub %rcx, 80(%r11)",
    "add $0x80, %rsp",
    "ret",
    // clone, fork, vfork: the hook has run; now the call itself. The
    // unwinding is the one above, written twice on purpose: once popfq has
    // put back the program's flags, and the other registers hold the call's
    // arguments and the stack pointers, no register is left to branch on.
    "15:",
    "mov -64(%rbp), %rax",
    "lea -8(%rbp), %rsp",
    "popfq",
    "pop %rbp",
    "pop %rcx",
    "pop %rsp",
    "mov %fs:0, %r11",
    "add shortfuse_cfg+64(%rip), %r11",
    "sub %rcx, 80(%r11)",
    "jmp 21f",
    // The thread's first slow call: map its hook stack and a guard page
    // below it, the call's registers kept in ThreadState meanwhile.
    "32:",
    "movq $1, 16(%r11)",
    "mov %rdi, 24(%r11)",
    "mov %rsi, 32(%r11)",
    "mov %rdx, 40(%r11)",
    "mov %r10, 48(%r11)",
    "mov %r8, 56(%r11)",
    "mov %r9, 64(%r11)",
    "mov %rax, 72(%r11)",
    "mov $9, %eax",
    "xor %edi, %edi",
    "mov $0x401000, %esi",
    "mov $3, %edx",
    "mov $0x24022, %r10d",
    "mov $-1, %r8",
    "xor %r9d, %r9d",
    "syscall",
    "xor %ecx, %ecx",
    "cmp $-4096, %rax",
    "ja 37f",
    "mov %rax, %rdi",
    "mov $0x1000, %esi",
    "xor %edx, %edx",
    "mov $10, %eax",
    "syscall",
    "lea 0x401000(%rdi), %rcx",
    "37:",
    "mov %fs:0, %r11",
    "add shortfuse_cfg+64(%rip), %r11",
    "mov %rcx, 16(%r11)",
    "mov 24(%r11), %rdi",
    "mov 32(%r11), %rsi",
    "mov 40(%r11), %rdx",
    "mov 48(%r11), %r10",
    "mov 56(%r11), %r8",
    "mov 64(%r11), %r9",
    "mov 72(%r11), %rax",
    "test %rcx, %rcx",
    "jz 31b",
    "jmp 34b",
    // exit (of a thread): its hook stack goes first, unless this is a
    // vfork child or an outer call is on that stack.
    "40:",
    "mov %fs:0, %r11",
    "add shortfuse_cfg+64(%rip), %r11",
    "cmpb $0, 8(%r11)",
    "jne 41f",
    "cmpq $0, 80(%r11)",
    "jne 41f",
    "mov 16(%r11), %rcx",
    "cmp $1, %rcx",
    "jbe 41f",
    "movq $0, 16(%r11)",
    "mov %rdi, %rdx",
    "lea -0x401000(%rcx), %rdi",
    "mov $0x401000, %esi",
    "mov $11, %eax",
    "syscall",
    "mov %rdx, %rdi",
    "mov $60, %eax",
    "41:",
    "syscall",
    "add $0x80, %rsp",
    "ret",
    // rt_sigreturn
    "20:",
    "add $0x88, %rsp",
    "syscall",
    "ud2",
    // the clone family
    "21:",
    "mov 0x80(%rsp), %r11",
    "add $0x88, %rsp",
    "jmp shortfuse_special",
    ".size shortfuse_entry, .-shortfuse_entry",
    "",
    ".globl shortfuse_special",
    ".hidden shortfuse_special",
    ".type shortfuse_special,@function",
    "shortfuse_special:",
    "cmp $15, %rax",
    "jne 1f",
    "syscall",
    "ud2",
    "1:",
    "cmp $435, %rax",
    "jne 2f",
    "mov $-38, %rax",
    "jmp *%r11",
    "2:",
    "cmp $58, %rax",
    "je 5f",
    "cmp $57, %rax",
    "je 4f",
    // clone
    "test %rsi, %rsi",
    "jnz 3f",
    "test $0x100, %edi",
    "jnz 5f",
    "jmp 4f",
    // clone onto a new stack
    "3:",
    "lea -0x80(%rsp), %rsp",
    "push %r11",
    "mov %r11, -8(%rsi)",
    "sub $8, %rsi",
    "syscall",
    "lea 8(%rsi), %rsi",
    "test %rax, %rax",
    "jnz 60f",
    "mov %rdi, %r11",
    "call shortfuse_child",
    "ret",
    // fork-like
    "4:",
    "lea -0x80(%rsp), %rsp",
    "push %r11",
    "syscall",
    "test %rax, %rax",
    "jnz 6f",
    "xor %r11d, %r11d",
    "call shortfuse_child",
    "jmp 7f",
    // the parent of a clone onto a new stack: a thread (CLONE_VM |
    // CLONE_THREAD, in rdi still) did not close the fork gate
    // (`fork_gate::makes_thread`), so only the clone clock moves back
    "60:",
    "mov %edi, %ecx",
    "and $0x10100, %ecx",
    "cmp $0x10100, %ecx",
    "jne 6f",
    "lock decq shortfuse_cfg+120(%rip)",
    "jmp 7f",
    // the parent: the call no longer runs (see Cfg::clones)
    "6:",
    "lock decq shortfuse_cfg+120(%rip)",
    "lock decq shortfuse_cfg+128(%rip)",
    "7:",
    "mov %fs:0, %rcx",
    "add shortfuse_cfg+64(%rip), %rcx",
    "movb $0, 8(%rcx)",
    "pop %r11",
    "lea 0x80(%rsp), %rsp",
    "jmp *%r11",
    // vfork-like
    "5:",
    "mov %fs:0, %rcx",
    "add shortfuse_cfg+64(%rip), %rcx",
    "mov %r11, (%rcx)",
    "syscall",
    "mov %fs:0, %rcx",
    "add shortfuse_cfg+64(%rip), %rcx",
    "test %rax, %rax",
    "setz 8(%rcx)",
    "jz 9f",
    "lock decq shortfuse_cfg+120(%rip)",
    "lock decq shortfuse_cfg+128(%rip)",
    "8:",
    "jmp *(%rcx)",
    // the vfork child, on the parent's stack
    "9:",
    "lea 8b(%rip), %r11",
    "jmp shortfuse_sud_child",
    ".size shortfuse_special, .-shortfuse_special",
    "",
    // In a child, r11 = clone flags (0 for fork). Preserves every register
    // but rcx, r11 and rflags.
    ".hidden shortfuse_child",
    ".type shortfuse_child,@function",
    "shortfuse_child:",
    "push %rax",
    "mov %r11, %rax",
    "and $0x4100, %eax",
    "cmp $0x4100, %eax",
    "jne 1f",
    "mov %fs:0, %rcx",
    "add shortfuse_cfg+64(%rip), %rcx",
    "movb $1, 8(%rcx)",
    "jmp 3f",
    "1:",
    "test $0x100, %r11d",
    "jnz 3f",
    "movq $1, shortfuse_cfg+112(%rip)",
    // memory of its own: the clone it came from no longer runs here, nor
    // does any other thread's
    "lock decq shortfuse_cfg+120(%rip)",
    "movq $0, shortfuse_cfg+128(%rip)",
    "3:",
    "lea 2f(%rip), %r11",
    "jmp shortfuse_sud_child",
    "2:",
    "pop %rax",
    "ret",
    ".size shortfuse_child, .-shortfuse_child",
    "",
    // Turns on Syscall User Dispatch for a new thread or process when the
    // shim runs with it, without the stack (a vfork child runs on its
    // parent's, red zone included): the registers wait in
    // ThreadState.saved. r11 = where to go on; clobbers rcx, r11, rflags.
    ".hidden shortfuse_sud_child",
    ".type shortfuse_sud_child,@function",
    "shortfuse_sud_child:",
    "cmpb $0, shortfuse_cfg+88(%rip)",
    "je 1f",
    "mov %fs:0, %rcx",
    "add shortfuse_cfg+64(%rip), %rcx",
    "mov %rdi, 24(%rcx)",
    "mov %rsi, 32(%rcx)",
    "mov %rdx, 40(%rcx)",
    "mov %r10, 48(%rcx)",
    "mov %r8, 56(%rcx)",
    "mov %rax, 64(%rcx)",
    "mov %r11, 72(%rcx)",
    "movb $1, 9(%rcx)",
    "lea 9(%rcx), %r8",
    "mov $157, %eax",
    "mov $59, %edi",
    "mov $1, %esi",
    "mov shortfuse_cfg+96(%rip), %rdx",
    "mov shortfuse_cfg+104(%rip), %r10",
    "syscall",
    "mov %fs:0, %rcx",
    "add shortfuse_cfg+64(%rip), %rcx",
    "mov 24(%rcx), %rdi",
    "mov 32(%rcx), %rsi",
    "mov 40(%rcx), %rdx",
    "mov 48(%rcx), %r10",
    "mov 56(%rcx), %r8",
    "mov 64(%rcx), %rax",
    "mov 72(%rcx), %r11",
    "1:",
    "jmp *%r11",
    ".size shortfuse_sud_child, .-shortfuse_sud_child",
    "",
    ".globl shortfuse_restorer",
    ".hidden shortfuse_restorer",
    ".type shortfuse_restorer,@function",
    "shortfuse_restorer:",
    "mov $15, %eax",
    "syscall",
    "ud2",
    ".size shortfuse_restorer, .-shortfuse_restorer",
    options(att_syntax)
);
