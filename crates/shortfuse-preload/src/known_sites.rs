//! System-call sites learned once and handed down from image to image.
//!
//! Syscall User Dispatch reports each `syscall` instruction the first time
//! it runs, and [`crate::zpoline`] rewrites it then: a signal, two mprotect
//! calls and a return from the signal per site. Every process image paid
//! that again for the same sites of the same libc (`git status` about 30,
//! each of a build's compilers as many). So an image hands the sites it
//! knows, those it was handed and those it rewrote itself, to the image it
//! execs, in [`VAR`], per loaded object named by its GNU build-id (a forked
//! child has them already, in its copy of our memory). At the first site
//! of an object that traps, the new image rewrites every site handed down
//! for that object at once, with one pair of mprotect calls per executable
//! segment. An image that never traps (`/bin/true`, whose only call after
//! our constructor is its exit) pays nothing for them.
//!
//! What makes an offset safe to rewrite: it comes from an image whose
//! object had the same build-id (the same bytes), in which the kernel
//! reported a `syscall` that ran at that offset, so it is an instruction
//! boundary. Before the rewrite it is checked again: inside an executable
//! segment of the object, holding `0f 05`, not across a cache line. An
//! object without a build-id is never handed down. The variable is the
//! program's own environment: a program that forges it can only rewrite
//! its own code, as it could with mprotect.
//!
//! Nothing here allocates after the constructor but [`for_exec`], which
//! runs while an exec is served.
#![allow(unsafe_code)]

use core::fmt::Write;
use core::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// `ID:OFFSET,OFFSET,...;ID:...`, the build-id and the offsets from the
/// object's load address in lowercase hexadecimal.
pub const VAR: &str = "SHORTFUSE_SITES";

/// The longest build-id kept (GNU ld's are 16 or 20 bytes).
const ID_MAX: usize = 32;
/// Sites handed down at most: the variable stays a few kilobytes (a shell
/// and its programs use about a hundred).
const HANDED_MAX: usize = 1024;
/// Objects and sites this image learns at most; the rest are not handed down.
const LEARNED_OBJECTS: usize = 16;
const LEARNED_SITES: usize = 512;

/// A loaded object as the dynamic loader lists it: its load address and
/// program headers.
#[derive(Clone, Copy)]
pub struct Object {
    pub base: usize,
    pub headers: &'static [libc::Elf64_Phdr],
}

impl Object {
    /// The GNU build-id note's bytes, read from the object's loaded notes.
    pub fn build_id(&self) -> Option<&'static [u8]> {
        self.headers
            .iter()
            .filter(|ph| ph.p_type == libc::PT_NOTE)
            .find_map(|ph| {
                let start = self.base.wrapping_add(ph.p_vaddr as usize);
                // SAFETY: a PT_NOTE segment lies inside a loaded read-only
                // segment of the object, mapped while it stays loaded.
                let notes = unsafe { core::slice::from_raw_parts(start as *const u8, ph.p_memsz as usize) };
                gnu_build_id(notes, if ph.p_align == 8 { 8 } else { 4 })
            })
    }

    /// The object's loaded segments that hold code: their address ranges
    /// and the protection their headers ask for.
    pub fn code_segments(&self) -> impl Iterator<Item = (usize, usize, i32)> + '_ {
        self.headers
            .iter()
            .filter(|ph| ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 && ph.p_flags & libc::PF_R != 0)
            .map(|ph| {
                let start = self.base.wrapping_add(ph.p_vaddr as usize);
                (start, start.wrapping_add(ph.p_memsz as usize), protection(ph.p_flags))
            })
    }
}

/// The mmap protection a program header's flags ask for.
pub fn protection(flags: u32) -> i32 {
    let mut prot = 0;
    for (flag, p) in [
        (libc::PF_R, libc::PROT_READ),
        (libc::PF_W, libc::PROT_WRITE),
        (libc::PF_X, libc::PROT_EXEC),
    ] {
        if flags & flag != 0 {
            prot |= p;
        }
    }
    prot
}

/// NT_GNU_BUILD_ID.
const NT_GNU_BUILD_ID: u32 = 3;

/// The descriptor of the GNU build-id note among `notes` (entries padded
/// to `align`).
fn gnu_build_id(mut notes: &[u8], align: usize) -> Option<&[u8]> {
    let pad = |n: usize| n.checked_add(align - 1).map(|n| n & !(align - 1));
    let word = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
    };
    while notes.len() >= 12 {
        let (namesz, descsz, kind) = (word(notes, 0)?, word(notes, 4)?, word(notes, 8)?);
        let desc = 12usize.checked_add(pad(namesz)?)?;
        let next = desc.checked_add(pad(descsz)?)?;
        let name = notes.get(12..12 + namesz)?;
        let bytes = notes.get(desc..desc + descsz)?;
        if kind == NT_GNU_BUILD_ID as usize && name == b"GNU\0" && !bytes.is_empty() {
            return Some(bytes);
        }
        notes = notes.get(next..)?;
    }
    None
}

/// Sites handed down for one object.
struct Handed {
    id: Vec<u8>,
    offsets: Vec<usize>,
    /// One past the load address at which they were last rewritten (0:
    /// never).
    at: AtomicUsize,
}

static HANDED: OnceLock<Vec<Handed>> = OnceLock::new();

/// Reads [`VAR`] (in the constructor). A malformed entry is skipped.
pub fn load() {
    let v = std::env::var_os(VAR)
        .map(|v| parse(v.as_encoded_bytes()))
        .unwrap_or_default();
    let _ = HANDED.set(v);
}

fn parse(s: &[u8]) -> Vec<Handed> {
    let mut out: Vec<Handed> = Vec::new();
    let mut total = 0;
    for entry in s.split(|&b| b == b';') {
        let Some(colon) = entry.iter().position(|&b| b == b':') else {
            continue;
        };
        let Some(id) = unhex(&entry[..colon]) else { continue };
        if id.is_empty() || id.len() > ID_MAX || out.iter().any(|h| h.id == id) {
            continue;
        }
        let mut offsets: Vec<usize> = entry[colon + 1..].split(|&b| b == b',').filter_map(hex).collect();
        offsets.sort_unstable();
        offsets.dedup();
        offsets.truncate(HANDED_MAX - total);
        total += offsets.len();
        out.push(Handed {
            id,
            offsets,
            at: AtomicUsize::new(0),
        });
    }
    out
}

/// The offsets handed down for the object with build-id `id`, the first
/// time they are asked for at load address `base` (from the SIGSYS handler:
/// no allocation).
pub fn take(id: &[u8], base: usize) -> Option<&'static [usize]> {
    let h = HANDED.get()?.iter().find(|h| h.id == id)?;
    // Plus one: a program that is not position-independent loads at 0.
    let mark = base.wrapping_add(1);
    (h.at.swap(mark, Ordering::AcqRel) != mark).then_some(&h.offsets[..])
}

/// An object this image rewrote a site of: its build-id, `len` bytes.
struct LearnedObject {
    len: AtomicUsize,
    id: [AtomicU8; ID_MAX],
}

static OBJECTS: [LearnedObject; LEARNED_OBJECTS] = [const {
    LearnedObject {
        len: AtomicUsize::new(0),
        id: [const { AtomicU8::new(0) }; ID_MAX],
    }
}; LEARNED_OBJECTS];
static OBJECT_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Sites this image rewrote one by one: the object's index in [`OBJECTS`]
/// in the top 16 bits, the offset in the others.
static SITES: [AtomicU64; LEARNED_SITES] = [const { AtomicU64::new(0) }; LEARNED_SITES];
static SITE_COUNT: AtomicUsize = AtomicUsize::new(0);

impl LearnedObject {
    fn id(&self) -> Vec<u8> {
        let len = self.len.load(Ordering::Acquire).min(ID_MAX);
        self.id[..len].iter().map(|b| b.load(Ordering::Relaxed)).collect()
    }

    fn is(&self, id: &[u8]) -> bool {
        self.len.load(Ordering::Acquire) == id.len()
            && self.id.iter().zip(id).all(|(a, &b)| a.load(Ordering::Relaxed) == b)
    }
}

/// Records a site of the object with build-id `id`, `offset` bytes from its
/// load address, that this image rewrote on its own. From the SIGSYS
/// handler, under `zpoline`'s rewrite lock (one writer at a time): no
/// allocation; readers see an entry only once it is whole.
pub fn learned(id: &[u8], offset: usize) {
    if id.len() > ID_MAX || offset >> 48 != 0 {
        return;
    }
    let objects = OBJECT_COUNT.load(Ordering::Acquire);
    let object = match OBJECTS[..objects].iter().position(|o| o.is(id)) {
        Some(i) => i,
        None if objects < LEARNED_OBJECTS => {
            let o = &OBJECTS[objects];
            for (slot, &b) in o.id.iter().zip(id) {
                slot.store(b, Ordering::Relaxed);
            }
            o.len.store(id.len(), Ordering::Release);
            OBJECT_COUNT.store(objects + 1, Ordering::Release);
            objects
        }
        None => return,
    };
    let n = SITE_COUNT.load(Ordering::Acquire);
    if n < LEARNED_SITES {
        SITES[n].store((object as u64) << 48 | offset as u64, Ordering::Relaxed);
        SITE_COUNT.store(n + 1, Ordering::Release);
    }
}

/// The value of [`VAR`] for the image an exec starts: the sites handed to
/// this image and those it learned. None when it knows none.
pub fn for_exec() -> Option<Vec<u8>> {
    let mut known: Vec<(Vec<u8>, Vec<usize>)> = HANDED
        .get()
        .map(|v| v.iter().map(|h| (h.id.clone(), h.offsets.clone())).collect())
        .unwrap_or_default();
    // Sites first: an object is published before any of its sites.
    let sites = SITE_COUNT.load(Ordering::Acquire);
    let objects = OBJECT_COUNT.load(Ordering::Acquire);
    let ids: Vec<Vec<u8>> = OBJECTS[..objects].iter().map(LearnedObject::id).collect();
    for site in &SITES[..sites] {
        let v = site.load(Ordering::Relaxed);
        let Some(id) = ids.get((v >> 48) as usize) else {
            continue;
        };
        let offset = (v & ((1 << 48) - 1)) as usize;
        match known.iter_mut().find(|(k, _)| k == id) {
            Some((_, offsets)) => offsets.push(offset),
            None => known.push((id.clone(), vec![offset])),
        }
    }
    let mut out = String::new();
    let mut total = 0;
    for (id, mut offsets) in known {
        offsets.sort_unstable();
        offsets.dedup();
        offsets.truncate(HANDED_MAX - total);
        if offsets.is_empty() {
            continue;
        }
        total += offsets.len();
        if !out.is_empty() {
            out.push(';');
        }
        for b in id {
            let _ = write!(out, "{b:02x}");
        }
        out.push(':');
        for (i, o) in offsets.iter().enumerate() {
            let _ = write!(out, "{}{o:x}", if i > 0 { "," } else { "" });
        }
    }
    (!out.is_empty()).then_some(out.into_bytes())
}

fn hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 12 {
        return None;
    }
    s.iter()
        .try_fold(0usize, |v, &b| (b as char).to_digit(16).map(|d| v << 4 | d as usize))
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2)
        .map(|p| Some(((p[0] as char).to_digit(16)? << 4 | (p[1] as char).to_digit(16)?) as u8))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_parses_and_skips_what_is_malformed() {
        let v = parse(b"0a1b:10,2f,10;zz:1;0a1b:5;c0ffee:;beef:xyz,7");
        let got: Vec<_> = v.iter().map(|h| (h.id.clone(), h.offsets.clone())).collect();
        assert_eq!(
            got,
            vec![
                (vec![0x0a, 0x1b], vec![0x10, 0x2f]),
                (vec![0xc0, 0xff, 0xee], vec![]),
                (vec![0xbe, 0xef], vec![7]),
            ]
        );
    }

    #[test]
    fn a_build_id_is_found_among_notes() {
        let mut notes = Vec::new();
        // An ABI tag note first, then the build-id.
        for (name, kind, desc) in [
            (&b"GNU\0"[..], 1u32, &[0u8, 0, 0, 0, 3, 0, 0, 0][..]),
            (b"GNU\0", 3, &[1, 2, 3, 4, 5]),
        ] {
            notes.extend_from_slice(&(name.len() as u32).to_le_bytes());
            notes.extend_from_slice(&(desc.len() as u32).to_le_bytes());
            notes.extend_from_slice(&kind.to_le_bytes());
            notes.extend_from_slice(name);
            notes.extend_from_slice(desc);
            while notes.len() % 4 != 0 {
                notes.push(0);
            }
        }
        assert_eq!(gnu_build_id(&notes, 4), Some(&[1u8, 2, 3, 4, 5][..]));
        assert_eq!(gnu_build_id(&notes[..20], 4), None);
    }
}
