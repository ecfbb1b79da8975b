//! zpoline: every `syscall` instruction of the loaded objects (found by
//! disassembling their executable mappings with iced-x86, so only true
//! instructions are touched) becomes `call *%rax`. The call lands in a sled
//! at address `nr` of the page at 0 (five-byte `cmp`s that decode alike
//! from any of their bytes: zpoline's one-byte `nop`s, five at a time) and
//! slides into [`crate::sys::shortfuse_entry`].
//!
//! When Syscall User Dispatch is on (the default), no site is rewritten at
//! start-up: each is reported the first time it runs and rewritten then by
//! [`rewrite_site`] (lazypoline's approach), so the program pays a signal
//! for each site it uses, once, instead of the disassembly of every loaded
//! object: `git status` in a repository of 200 files went from 46 ms to
//! 8 ms (native 2.6 to 3.7, Syscall User Dispatch alone 7.5 to 8), 40 ms
//! of which were spent decoding git's own text, which holds no `syscall`
//! at all; `/bin/true` from 20 to 1.5 ms (native 0.6). Without it
//! ([`rewrite_loaded`]) every object loaded at start-up is rewritten at
//! once, and code loaded later bypasses the hook. The sites an image
//! rewrote are handed to the images it execs ([`known_sites`]), which
//! rewrite all of an object's at its first site that traps.
#![allow(unsafe_code)]

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use iced_x86::{Code, Decoder, DecoderOptions};

use crate::known_sites::{self, Object};
use crate::sys::{fs, process, raw, raw3};

const SYS_MMAP: i64 = 9;
const SYS_MPROTECT: i64 = 10;
/// Every system-call number below this lands in the sled.
const SLED: usize = 512;
pub(crate) const PAGE: usize = 4096;

/// Why the rewrite did not happen.
#[derive(Debug)]
pub enum SetupError {
    /// mmap at address 0 refused (vm.mmap_min_addr is not 0); the errno.
    Page0(i64),
}

/// Maps the trampoline page at address 0.
fn map_trampoline() -> Result<(), SetupError> {
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as i64;
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as i64;
    // SAFETY: page 0 or a page of loaded code that this module changes the protection of for a
    // rewrite, and restores; nothing of Rust's lives there.
    let r = unsafe { raw(SYS_MMAP, 0, PAGE as i64, prot, flags, -1, 0) };
    if r != 0 {
        return Err(SetupError::Page0(-r));
    }
    // The sled: `cmp $0x3d3d3d3d,%eax` (3d + imm32) decodes the same from
    // any of its bytes, so a call landing at `nr` slides to the end in
    // (512 - nr) / 5 instructions, not 512 - nr nops. It only changes the
    // flags, which the entry clobbers anyway (as does every `syscall`
    // wrapper's `cmp` on the result). The last one may reach 4 bytes past
    // the sled: 4 nops there land every path on the code after them.
    let mut code = vec![0x3du8; SLED];
    code.extend_from_slice(&[0x90; 4]);
    // sub $0x80,%rsp (step over the red zone); movabs $entry,%r11; jmp *%r11
    code.extend_from_slice(&[0x48, 0x81, 0xec, 0x80, 0x00, 0x00, 0x00]);
    code.extend_from_slice(&[0x49, 0xbb]);
    code.extend_from_slice(&(crate::sys::shortfuse_entry as *const () as usize as u64).to_le_bytes());
    code.extend_from_slice(&[0x41, 0xff, 0xe3]);
    // SAFETY: page 0 was just mapped read-write, PAGE bytes long; `code` is
    // shorter than a page. A volatile copy, since address 0 is "null" to the
    // compiler.
    unsafe {
        let base = core::ptr::null_mut::<u8>();
        for (i, b) in code.iter().enumerate() {
            core::ptr::write_volatile(base.wrapping_add(i), *b);
        }
    }
    // Execute-only: a stray read of a null pointer still faults.
    // SAFETY: page 0 or a page of loaded code that this module changes the protection of for a
    // rewrite, and restores; nothing of Rust's lives there.
    let r = unsafe { raw3(SYS_MPROTECT, 0, PAGE as i64, libc::PROT_EXEC as i64) };
    if r != 0 {
        return Err(SetupError::Page0(-r));
    }
    Ok(())
}

struct Region {
    start: usize,
    end: usize,
    prot: i32,
}

/// Executable mappings of other objects, from /proc/self/maps.
fn regions(own: usize) -> std::io::Result<Vec<Region>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let name = line.split_whitespace().nth(5).unwrap_or("");
        if !perms.contains('x') || !perms.starts_with('r') {
            continue;
        }
        if name.starts_with("[vsyscall]") || name.starts_with("[vdso]") || name.starts_with("[vvar") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if start == 0 || (start..end).contains(&own) {
            continue;
        }
        let mut prot = libc::PROT_READ | libc::PROT_EXEC;
        if perms.as_bytes().get(1) == Some(&b'w') {
            prot |= libc::PROT_WRITE;
        }
        out.push(Region { start, end, prot });
    }
    Ok(out)
}

/// Rewrites one region; returns the number of sites.
fn rewrite(r: &Region) -> usize {
    // SAFETY: the region is mapped readable for its whole length (from
    // /proc/self/maps, read just now, before any other thread exists).
    let code = unsafe { core::slice::from_raw_parts(r.start as *const u8, r.end - r.start) };
    let mut sites = Vec::new();
    let mut dec = Decoder::with_ip(64, code, r.start as u64, DecoderOptions::NONE);
    for ins in &mut dec {
        if matches!(ins.code(), Code::Syscall | Code::Sysenter) {
            sites.push(ins.ip() as usize - r.start);
        }
    }
    if sites.is_empty() {
        return 0;
    }
    let len = (r.end - r.start) as i64;
    let rwx = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as i64;
    // SAFETY: page 0 or a page of loaded code that this module changes the protection of for a
    // rewrite, and restores; nothing of Rust's lives there.
    if unsafe { raw3(SYS_MPROTECT, r.start as i64, len, rwx) } != 0 {
        return 0;
    }
    for &off in &sites {
        // SAFETY: `off` is the start of a two-byte syscall instruction inside
        // the region, now writable; `call *%rax` (ff d0) is two bytes too.
        unsafe {
            let p = (r.start + off) as *mut u8;
            core::ptr::write_volatile(p, 0xff);
            core::ptr::write_volatile(p.add(1), 0xd0);
        }
    }
    // SAFETY: page 0 or a page of loaded code that this module changes the protection of for a
    // rewrite, and restores; nothing of Rust's lives there.
    unsafe { raw3(SYS_MPROTECT, r.start as i64, len, r.prot as i64) };
    sites.len()
}

/// Maps the trampoline: from now on a site may be rewritten.
pub fn install() -> Result<(), SetupError> {
    map_trampoline()?;
    TRAMPOLINE.store(true, Ordering::Release);
    Ok(())
}

/// Rewrites every loaded object but ours (after [`install`]). Returns the
/// number of rewritten sites.
pub fn rewrite_loaded() -> std::io::Result<usize> {
    let own = install as *const () as usize;
    let mut n = 0;
    for r in regions(own)? {
        n += rewrite(&r);
    }
    Ok(n)
}

/// libc functions whose `syscall` a vfork child (posix_spawn, `system`,
/// python's subprocess) may run to exec, and to change directory or open a
/// file before it (python's `cwd=`, posix_spawn's file actions): their
/// sites are rewritten before the first vfork-like clone. Syscall User
/// Dispatch, which finds every other site the first time it runs, is not
/// on in a vfork child (it shares our memory, not our task), and these are
/// all the shim serves there (`calls::vfork_exec`, `calls::spawn`). Not at
/// start-up: iced-x86 builds its decoder tables on first use, 1.1 ms that a
/// process that never vforks (most) need not pay.
const EXEC_FUNCTIONS: [&core::ffi::CStr; 9] = [
    c"execve",
    c"execveat",
    c"fexecve",
    c"syscall",
    c"chdir",
    c"fchdir",
    c"open64",
    c"openat64",
    // posix_spawn's `addopen` (GLIBC_PRIVATE, absent from other libcs).
    c"__open64_nocancel",
];

/// glibc's `RTLD_DL_SYMENT`: `dladdr1` also gives the symbol's entry.
const RTLD_DL_SYMENT: i32 = 1;

/// [`rewrite_exec_functions`], the first time only (once the trampoline is
/// there).
pub fn rewrite_exec_functions_once() {
    static DONE: AtomicBool = AtomicBool::new(false);
    // Again while a site is left (one straddling a cache line, in a
    // process with threads then): the next vfork may find it alone.
    if active() && !DONE.swap(true, Ordering::AcqRel) && !rewrite_exec_functions() {
        DONE.store(false, Ordering::Release);
    }
}

/// Rewrites the sites of [`EXEC_FUNCTIONS`] (after [`install`]), each
/// decoded from its symbol's start over its size (true instruction
/// boundaries). Returns whether it is done: every site now calls the
/// trampoline, or those left never will (see [`alone`]).
fn rewrite_exec_functions() -> bool {
    let mut all = true;
    for name in EXEC_FUNCTIONS {
        // SAFETY: a lookup by a NUL-terminated name; a null result is checked.
        let addr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        if addr.is_null() {
            continue;
        }
        // SAFETY: `dladdr1` fills `info` and points `sym` at the symbol's
        // entry in the object's dynamic symbol table (valid while it stays
        // loaded: libc never unloads).
        let size = unsafe {
            let mut info: libc::Dl_info = core::mem::zeroed();
            let mut sym: *mut libc::c_void = core::ptr::null_mut();
            if libc::dladdr1(addr, &mut info, &mut sym, RTLD_DL_SYMENT) == 0 || sym.is_null() {
                continue;
            }
            (*(sym as *const libc::Elf64_Sym)).st_size as usize
        };
        // SAFETY: the function's own bytes, mapped executable and readable.
        let code = unsafe { core::slice::from_raw_parts(addr as *const u8, size) };
        for ins in Decoder::with_ip(64, code, addr as u64, DecoderOptions::NONE) {
            if ins.code() == Code::Syscall {
                all &= rewrite_site(ins.ip() as usize);
            }
        }
    }
    // With threads, a left site stays so: no need to look again.
    all || THREADED.load(Ordering::Relaxed)
}

/// The trampoline page is mapped: a rewritten site has somewhere to go.
static TRAMPOLINE: AtomicBool = AtomicBool::new(false);

pub fn active() -> bool {
    TRAMPOLINE.load(Ordering::Acquire)
}

/// Serialises lazy rewrites: two threads changing the protection of one
/// page would otherwise restore it under each other's store. Holds the
/// holder's process and thread ids (`pid << 32 | tid`), 0 when free: a
/// forked child finds the lock held by a thread of another process (one
/// of its parent's, which does not exist in the child and will never
/// release it) and takes it over, and a thread that finds it held by
/// itself (a handler of a fault inside the rewrite, whose own system call
/// traps) leaves the site to Syscall User Dispatch instead of waiting for
/// itself.
static REWRITING: AtomicU64 = AtomicU64::new(0);

/// The value [`REWRITING`] holds while this thread rewrites.
fn rewriter_id() -> u64 {
    let pid = process::getpid() as u64;
    let tid = process::gettid() as u64;
    pid << 32 | (tid & 0xffff_ffff)
}

/// Takes [`REWRITING`]; false when this thread already holds it, or,
/// unless `wait`, when another thread of this process does.
fn lock_rewrites(me: u64, wait: bool) -> bool {
    loop {
        match REWRITING.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(held) if held == me => return false,
            // Held in the process we were forked from.
            Err(held) if held >> 32 != me >> 32 => {
                if REWRITING
                    .compare_exchange(held, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return true;
                }
            }
            Err(_) if !wait => return false,
            Err(_) => {
                process::sched_yield();
            }
        }
    }
}

/// Rewrites the `syscall` instruction at `site` into `call *%rax`, with
/// other threads possibly running that very code. Returns whether the site
/// now holds `call *%rax`.
///
/// The two bytes are stored with one instruction inside one cache line,
/// so another CPU executes either instruction, never a mix. A pair that
/// straddles a line is rewritten only while this thread is the process's
/// only one ([`alone`]: nobody can run it meanwhile); otherwise it is left
/// alone and keeps being served by Syscall User Dispatch. The page
/// is made writable while staying executable, then given back its
/// protection: that of the loaded segment's program header
/// ([`segment_of`]), or, for code no object holds (a JIT's), that of
/// /proc/self/maps. Called from the SIGSYS handler: no allocation, raw
/// system calls only. The spin lock is safe across fork and re-entry (see
/// [`REWRITING`]), and never held while the loader's lock is.
///
/// A process is not forked meanwhile (`fork_gate`): `dl_iterate_phdr`
/// holds the loader's lock, which a fork by another thread would leave
/// held for ever in the child (glibc does not reset it there), whose first
/// rewrite then waits for it.
pub fn rewrite_site(site: usize) -> bool {
    rewrite_site_or_not(site, true)
}

/// [`rewrite_site`], from the SIGSYS handler: while another thread
/// rewrites (threads started together trap on the same sites at once),
/// the call is served through Syscall User Dispatch this time rather than
/// spinning until the lock is free; its site is rewritten on a later run.
pub fn rewrite_site_unless_busy(site: usize) -> bool {
    rewrite_site_or_not(site, false)
}

fn rewrite_site_or_not(site: usize, wait: bool) -> bool {
    if !active() || site % 64 == 63 && !alone() {
        return false;
    }
    crate::fork_gate::enter();
    let done = rewrite_unforked(site, wait);
    crate::fork_gate::leave();
    done
}

fn rewrite_unforked(site: usize, wait: bool) -> bool {
    let Some(seg) = segment_of(site).or_else(|| mapping_of(site)) else {
        return false;
    };
    let (start, end, prot) = (seg.start, seg.end, seg.prot);
    if site < start || prot & libc::PROT_READ == 0 {
        return false;
    }
    // A pair on the last byte of a mapping goes on in the next one (the
    // pages of an object split into mappings as their sites are
    // rewritten), whose protection is given back to it.
    let next = if site + 2 > end {
        match segment_of(end).or_else(|| mapping_of(end)) {
            Some(s) if s.start == end && s.prot & libc::PROT_READ != 0 => s.prot,
            _ => return false,
        }
    } else {
        prot
    };
    let me = rewriter_id();
    if !lock_rewrites(me, wait) {
        return false;
    }
    let id = seg.object.and_then(|o| Some((o, o.build_id()?)));
    if let Some((object, id)) = id {
        if let Some(offsets) = known_sites::take(id, object.base) {
            rewrite_handed_down(&object, offsets);
        }
    }
    let done = match rewrite_locked(site, prot, next) {
        Rewrite::Now => {
            if let Some((object, id)) = id {
                known_sites::learned(id, site - object.base);
            }
            true
        }
        Rewrite::Before => true,
        Rewrite::Not => false,
    };
    REWRITING.store(0, Ordering::Release);
    done
}

/// Rewrites the sites handed down for `object` (offsets from its load
/// address, see [`known_sites`]) that still hold `syscall`: one pair of
/// mprotect calls for each of its code segments that holds any. Under the
/// rewrite lock.
fn rewrite_handed_down(object: &Object, offsets: &[usize]) {
    for (start, end, prot) in object.code_segments() {
        let sites = offsets.iter().map(|&o| object.base.wrapping_add(o));
        // Both bytes inside the segment and inside one cache line (so also
        // one page): a pair across a line is left to the one-by-one rewrite,
        // which may only do it while the process has one thread.
        let fits = move |&s: &usize| {
            (start..end.saturating_sub(1)).contains(&s)
                && s % 64 != 63
                // SAFETY: both bytes are inside a loaded segment that its
                // header says is readable and executable.
                && unsafe { [core::ptr::read_volatile(s as *const u8), core::ptr::read_volatile((s + 1) as *const u8)] }
                    == [0x0f, 0x05]
        };
        let Some(first) = sites.clone().filter(fits).min() else {
            continue;
        };
        let last = sites.clone().filter(fits).max().unwrap_or(first);
        let page = first & !(PAGE - 1);
        let len = ((last + 2 + PAGE - 1) & !(PAGE - 1)) - page;
        let rwx = (prot | libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as i64;
        // SAFETY: pages of loaded code that this module changes the protection of for a rewrite,
        // and restores; nothing of Rust's lives there.
        if unsafe { raw3(SYS_MPROTECT, page as i64, len as i64, rwx) } != 0 {
            continue;
        }
        for s in sites.filter(fits) {
            // SAFETY: a `syscall` (checked just now) in the pages just made
            // writable; `call *%rax` is two bytes too, stored in one write
            // inside one cache line, so another thread runs one or the other.
            unsafe { crate::sys::store2(s as *mut u8, [0xff, 0xd0]) };
        }
        // SAFETY: as above: the protection its header gives the segment back.
        unsafe { raw3(SYS_MPROTECT, page as i64, len as i64, prot as i64) };
    }
}

/// Set once the process was seen with more than one thread: from then on
/// straddling sites are not rewritten (threads rarely all end, and the
/// check costs three system calls).
static THREADED: AtomicBool = AtomicBool::new(false);

/// Whether the calling thread is the only one of the process (field 20 of
/// /proc/self/stat). Raw system calls and a stack buffer only.
fn alone() -> bool {
    if THREADED.load(Ordering::Relaxed) {
        return false;
    }
    let fd = open_read(b"/proc/self/stat\0");
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 1024];
    let n = fs::read(fd as i32, &mut buf);
    fs::close(fd as i32);
    let Ok(n) = usize::try_from(n) else { return false };
    let stat = &buf[..n];
    // The command name may hold spaces and parentheses: count from the last ')'.
    let Some(close) = stat.iter().rposition(|&b| b == b')') else {
        return false;
    };
    let threads = stat[close + 1..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .nth(17)
        .and_then(|f| {
            f.iter()
                .try_fold(0u64, |v, &d| d.is_ascii_digit().then(|| v * 10 + u64::from(d - b'0')))
        });
    if threads != Some(1) {
        THREADED.store(true, Ordering::Relaxed);
        return false;
    }
    true
}

/// What [`rewrite_locked`] found.
enum Rewrite {
    /// The site was a `syscall` and now calls the trampoline.
    Now,
    /// It called the trampoline already.
    Before,
    /// It is left as it is.
    Not,
}

/// `next`: the protection of the page after `site`'s, when the pair
/// reaches into it.
fn rewrite_locked(site: usize, prot: i32, next: i32) -> Rewrite {
    let p = site as *mut u8;
    // SAFETY: the mapping is readable (checked above) for both bytes.
    let cur = unsafe { [core::ptr::read_volatile(p), core::ptr::read_volatile(p.add(1))] };
    if cur == [0xff, 0xd0] {
        return Rewrite::Before;
    }
    if cur != [0x0f, 0x05] {
        return Rewrite::Not;
    }
    let page = site & !(PAGE - 1);
    let len = ((site + 1) & !(PAGE - 1)) + PAGE - page;
    let rwx = (prot | libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as i64;
    // SAFETY: page 0 or a page of loaded code that this module changes the protection of for a
    // rewrite, and restores; nothing of Rust's lives there.
    if unsafe { raw3(SYS_MPROTECT, page as i64, len as i64, rwx) } != 0 {
        return Rewrite::Not;
    }
    // SAFETY: both bytes are in the page range just made writable.
    unsafe { crate::sys::store2(p, [0xff, 0xd0]) };
    // SAFETY: pages of loaded code that this module made writable for the
    // rewrite, given back their protections; nothing of Rust's lives there.
    unsafe {
        if next == prot {
            raw3(SYS_MPROTECT, page as i64, len as i64, prot as i64);
        } else {
            raw3(SYS_MPROTECT, page as i64, PAGE as i64, prot as i64);
            raw3(SYS_MPROTECT, (page + PAGE) as i64, PAGE as i64, next as i64);
        }
    }
    Rewrite::Now
}

/// Opens NUL-terminated `path` for reading: the descriptor or a negated
/// errno.
fn open_read(path: &[u8]) -> i64 {
    fs::openat(libc::AT_FDCWD, path, libc::O_RDONLY | libc::O_CLOEXEC, 0)
}

/// Where a site lies: a page range, the protection to give it back, and
/// the loaded object it belongs to (None: code no object holds).
#[derive(Clone, Copy)]
struct Segment {
    start: usize,
    end: usize,
    prot: i32,
    object: Option<Object>,
}

/// The loaded segment holding `addr`: its page range and the protection its
/// program header (PT_LOAD) asks for, which is the protection the loader
/// gave its pages, from the loader's own list of objects
/// (`dl_iterate_phdr`): no system call, where reading /proc/self/maps costs
/// 65 µs a site (the kernel prints every mapping). A program that changed
/// the protection of its own text afterwards (none we know of does) would
/// get the header's back on a page holding a rewritten site.
///
/// The loader's lock taken here is recursive (a handler interrupting the
/// thread that holds it goes on) and nothing of ours is held meanwhile.
fn segment_of(addr: usize) -> Option<Segment> {
    struct Find {
        addr: usize,
        found: Option<Segment>,
    }
    extern "C" fn each(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: the loader hands a valid entry and our `Find`, for the
        // length of this call.
        let (info, find) = unsafe { (&*info, &mut *(data as *mut Find)) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers, which
        // the loader keeps as long as the object stays loaded (a site of an
        // object that another thread unloads meanwhile is code the program
        // could no longer run anyway).
        let headers = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        let base = info.dlpi_addr as usize;
        for ph in headers.iter().filter(|ph| ph.p_type == libc::PT_LOAD) {
            let start = base.wrapping_add(ph.p_vaddr as usize);
            let end = start.wrapping_add(ph.p_memsz as usize);
            if !(start..end).contains(&find.addr) {
                continue;
            }
            find.found = Some(Segment {
                start: start & !(PAGE - 1),
                end: (end + PAGE - 1) & !(PAGE - 1),
                prot: known_sites::protection(ph.p_flags),
                object: Some(Object { base, headers }),
            });
            return 1;
        }
        0
    }
    let mut find = Find { addr, found: None };
    // SAFETY: `each` only reads the entries it is handed and writes `find`,
    // which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut find as *mut Find as *mut libc::c_void) };
    find.found
}

/// The mapping holding `addr`, from /proc/self/maps, read with raw system
/// calls into a stack buffer.
fn mapping_of(addr: usize) -> Option<Segment> {
    let fd = open_read(b"/proc/self/maps\0");
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 8192];
    let mut len = 0;
    let mut skipping = false;
    let mut found = None;
    'read: loop {
        let n = fs::read(fd as i32, &mut buf[len..]);
        if n <= 0 {
            if len > 0 && !skipping {
                found = parse_maps_line(&buf[..len], addr);
            }
            break;
        }
        len += n as usize;
        let mut from = 0;
        while let Some(nl) = buf[from..len].iter().position(|&b| b == b'\n') {
            if !skipping {
                if let Some(m) = parse_maps_line(&buf[from..from + nl], addr) {
                    found = Some(m);
                    break 'read;
                }
            }
            skipping = false;
            from += nl + 1;
        }
        buf.copy_within(from..len, 0);
        len -= from;
        if len == buf.len() {
            // A line longer than the buffer (a long path): its address range
            // and permissions are at the start.
            if let Some(m) = parse_maps_line(&buf[..len], addr) {
                found = Some(m);
                break;
            }
            skipping = true;
            len = 0;
        }
    }
    fs::close(fd as i32);
    found.map(|(start, end, prot)| Segment {
        start,
        end,
        prot,
        object: None,
    })
}

/// `start-end perms ...`: the range and protection if it holds `addr`.
fn parse_maps_line(line: &[u8], addr: usize) -> Option<(usize, usize, i32)> {
    let mut f = line.split(|&b| b == b' ');
    let range = f.next()?;
    let perms = f.next()?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let start = hex(&range[..dash])?;
    let end = hex(&range[dash + 1..])?;
    if !(start..end).contains(&addr) {
        return None;
    }
    let mut prot = 0;
    for (c, p) in [
        (b'r', libc::PROT_READ),
        (b'w', libc::PROT_WRITE),
        (b'x', libc::PROT_EXEC),
    ] {
        if perms.contains(&c) {
            prot |= p;
        }
    }
    Some((start, end, prot))
}

fn hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0usize;
    for &b in s {
        v = v * 16 + (b as char).to_digit(16)? as usize;
    }
    Some(v)
}

/// The executable mapping holding our own code: exempt from Syscall User
/// Dispatch, so that our raw system calls and our signal restorer always
/// reach the kernel.
pub fn own_text() -> Option<(usize, usize)> {
    let s = segment_of(crate::sys::shortfuse_special as *const () as usize)?;
    (s.prot & libc::PROT_EXEC != 0).then_some((s.start, s.end - s.start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse() {
        let l = b"7f12a000-7f12c000 r-xp 00002000 08:01 1234   /usr/lib/libc.so.6";
        assert_eq!(
            parse_maps_line(l, 0x7f12a100),
            Some((0x7f12a000, 0x7f12c000, libc::PROT_READ | libc::PROT_EXEC))
        );
        assert_eq!(parse_maps_line(l, 0x7f12c000), None);
        assert_eq!(parse_maps_line(b"garbage", 1), None);
    }
}
