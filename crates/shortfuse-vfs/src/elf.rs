//! Whether a program will load the preload shim: a 64-bit ELF program with
//! no interpreter (PT_INTERP) is linked statically, and the dynamic
//! loader, which applies LD_PRELOAD, never runs in it.

/// Whether the file read by `read_at(offset, buf) -> bytes read` is a
/// statically linked 64-bit ELF program. Anything else (a dynamic program,
/// a script, a file too short or foreign to tell) is `false`.
pub fn is_static_elf(read_at: &mut dyn FnMut(u64, &mut [u8]) -> usize) -> bool {
    const PT_INTERP: u32 = 3;
    let mut h = [0u8; 64];
    if read_at(0, &mut h) < h.len() || h[..4] != *b"\x7fELF" || h[4] != 2 {
        return false;
    }
    let phoff = u64::from_le_bytes([h[32], h[33], h[34], h[35], h[36], h[37], h[38], h[39]]);
    let entsize = u64::from(u16::from_le_bytes([h[54], h[55]]));
    let count = u16::from_le_bytes([h[56], h[57]]).min(256);
    (0..u64::from(count)).all(|i| {
        let mut kind = [0u8; 4];
        // A header that cannot be read: say nothing.
        read_at(phoff + i * entsize, &mut kind) == 4 && u32::from_le_bytes(kind) != PT_INTERP
    }) && count > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(bytes: &[u8]) -> impl FnMut(u64, &mut [u8]) -> usize + '_ {
        move |off, buf| {
            let off = (off as usize).min(bytes.len());
            let n = buf.len().min(bytes.len() - off);
            buf[..n].copy_from_slice(&bytes[off..off + n]);
            n
        }
    }

    #[test]
    fn programs_of_this_machine_are_told_apart() {
        let sh = std::fs::read("/bin/sh").unwrap();
        assert!(!is_static_elf(&mut reader(&sh)));
        assert!(!is_static_elf(&mut reader(b"#!/bin/sh\necho hi\n")));
        // The same program with its PT_INTERP header renamed PT_NOTE.
        let mut fake = sh.clone();
        let phoff = u64::from_le_bytes(sh[32..40].try_into().unwrap()) as usize;
        let entsize = u16::from_le_bytes([sh[54], sh[55]]) as usize;
        for i in 0..u16::from_le_bytes([sh[56], sh[57]]) as usize {
            let at = phoff + i * entsize;
            if fake[at..at + 4] == 3u32.to_le_bytes() {
                fake[at..at + 4].copy_from_slice(&4u32.to_le_bytes());
            }
        }
        assert!(is_static_elf(&mut reader(&fake)));
    }
}
