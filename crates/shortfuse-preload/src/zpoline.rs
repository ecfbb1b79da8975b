//! zpoline: every `syscall` instruction of the loaded objects (found by
//! disassembling their executable mappings with iced-x86, so only true
//! instructions are touched) becomes `call *%rax`. The call lands in a sled
//! of one-byte `nop`s at address `nr` of the page at 0 and slides into
//! [`crate::sys::shortfuse_entry`].
#![allow(unsafe_code)]

use iced_x86::{Code, Decoder, DecoderOptions};

use crate::sys::{raw, raw3};

const SYS_MMAP: i64 = 9;
const SYS_MPROTECT: i64 = 10;
/// Every system-call number below this lands in the sled.
const SLED: usize = 512;
const PAGE: usize = 4096;

/// Why the rewrite did not happen.
#[derive(Debug)]
pub enum SetupError {
    /// mmap at address 0 refused (vm.mmap_min_addr is not 0); the errno.
    Page0(i64),
    Maps(std::io::Error),
}

/// Maps the trampoline page at address 0.
fn map_trampoline() -> Result<(), SetupError> {
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as i64;
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as i64;
    let r = raw(SYS_MMAP, 0, PAGE as i64, prot, flags, -1, 0);
    if r != 0 {
        return Err(SetupError::Page0(-r));
    }
    let mut code = vec![0x90u8; SLED];
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
    let r = raw3(SYS_MPROTECT, 0, PAGE as i64, libc::PROT_EXEC as i64);
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
fn regions(own: usize) -> Result<Vec<Region>, SetupError> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(SetupError::Maps)?;
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
    if raw3(SYS_MPROTECT, r.start as i64, len, rwx) != 0 {
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
    raw3(SYS_MPROTECT, r.start as i64, len, r.prot as i64);
    sites.len()
}

/// Maps the trampoline and rewrites every loaded object but ours. Returns
/// the number of rewritten sites.
pub fn install() -> Result<usize, SetupError> {
    map_trampoline()?;
    let own = install as *const () as usize;
    let mut n = 0;
    for r in regions(own)? {
        n += rewrite(&r);
    }
    Ok(n)
}
