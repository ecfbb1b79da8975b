//! The shared memory of one client and where everything lives in it.
//!
//! ```text
//! page 0                header: magic, version, geometry, spin budget, daemon state
//! page 1 + q            queue q: doorbell (futex), producer tail, entries[slots]
//! then, per slot        state (futex), length, sender's pid, data (request, then reply)
//!                       from byte 16: an empty request and its reply share one
//!                       cache line with the state word
//! then                  notification ring: head, tail, overflow; then records
//! ```
//!
//! Offsets come from a [`Geometry`] the daemon chose and keeps in private
//! memory: the daemon never reads an offset, index or length from the
//! shared pages without checking it against its own copy, so a client
//! that scribbles over its region only harms itself.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::sys;

pub const PAGE: usize = 4096;
pub const MAGIC: u64 = 0x5346_5249_4e47_0001; // "SFRING" v1
pub const VERSION: u32 = 5;

/// Room before a slot's data: the state word, the length and the sender's
/// pid. The data follows on the same cache line, so that a small request
/// or reply travels with its state (one line from client to daemon and
/// back); one thread owns a slot at a time, so nothing shares it falsely.
pub const SLOT_HEADER: usize = 16;
/// A notification record: length word, then one FUSE notification
/// (`fuse_out_header` + INVAL_ENTRY with a name of up to NAME_MAX).
pub const RECORD: usize = 512;
/// Entries of a queue start here; the doorbell and the tail have a cache
/// line each before them.
const ENTRIES_AT: usize = 128;
/// Most slots a queue can have (its entries fill the rest of its page).
pub const MAX_SLOTS: u32 = ((PAGE - ENTRIES_AT) / 4) as u32;
// A queue entry holds a slot index in 16 bits (see `entry`).
const _: () = assert!(MAX_SLOTS <= 0xffff);
pub const MAX_QUEUES: u32 = 256;
/// The largest data area of a slot: 16 MiB and a page of headers.
pub const MAX_SLOT_DATA: u32 = (16 << 20) + PAGE as u32;
pub const MAX_RECORDS: u32 = 1 << 16;

/// Header offsets.
pub mod header {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const QUEUES: usize = 12;
    pub const SLOTS: usize = 16;
    pub const SLOT_DATA: usize = 20;
    pub const RECORDS: usize = 24;
    pub const SPIN_NS: usize = 32;
    /// [`super::DAEMON_ALIVE`] or [`super::DAEMON_GONE`].
    pub const DAEMON: usize = 40;
    /// Written by the server alone: 1 once some client asked it for a
    /// lock (SETLK, SETLKW), 0 before. Until then a close has no
    /// lock to let go, and an unmodified daemon taking the requests itself
    /// answers FLUSH without the server (a client that writes 0 here only
    /// keeps its own locks past its closes).
    pub const LOCKS: usize = 44;
    /// The CPU, plus one (0: not known), of the client thread that last
    /// published a request; on a cache line of its own.
    pub const CALLER_CPU: usize = 64;
    /// The CPU, plus one, of the thread that last took a request of this
    /// client from its queues; on a cache line of its own. Together they
    /// tell each side whether the other waits on its own CPU (see
    /// `wait`): advisory, a wrong value costs time, never correctness.
    pub const TAKER_CPU: usize = 128;
}

pub const DAEMON_ALIVE: u32 = 1;
pub const DAEMON_GONE: u32 = 2;

/// Slot states (the slot's futex word).
pub mod slot {
    /// Nobody's: a client thread may claim it.
    pub const FREE: u32 = 0;
    /// Claimed by a client thread, request being written.
    pub const BUSY: u32 = 1;
    /// Handed to the daemon; the client polls.
    pub const SUBMITTED: u32 = 2;
    /// Handed to the daemon; the client sleeps on the word.
    pub const SLEEPING: u32 = 3;
    /// Reply written; the client copies it out and frees the slot.
    pub const DONE: u32 = 4;
    /// Handed to the daemon, and nobody waits for the reply (RELEASE, as
    /// the kernel sends it in the background): the daemon frees the slot.
    pub const DETACHED: u32 = 5;
}

/// A queue entry before its first use. Its tag matches positions 0xffff
/// modulo 2^16 only, long after a client wrote every entry; and its index
/// is out of range: at worst it is dropped, as garbage is.
pub const EMPTY: u32 = u32::MAX;

/// The queue entry publishing slot `i` at position `pos`: the position's
/// low 16 bits tag the slot index, so that the daemon tells a new entry
/// from the one `slots` positions earlier without writing the entry back
/// (a write would pull the line away from the client between requests).
pub fn entry(pos: u32, i: u32) -> u32 {
    (pos << 16) | (i & 0xffff)
}

/// The slot index an entry read at position `pos` publishes, if it was
/// written for that position.
pub fn entry_slot(pos: u32, e: u32) -> Option<u32> {
    (e >> 16 == pos & 0xffff).then_some(e & 0xffff)
}

/// The shape of one client's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Submission queues (one per CPU).
    pub queues: u32,
    /// Slots per queue.
    pub slots: u32,
    /// Bytes of request or reply a slot holds.
    pub slot_data: u32,
    /// Notification records.
    pub records: u32,
}

impl Geometry {
    /// Refuses shapes the layout cannot hold.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_QUEUES).contains(&self.queues) {
            return Err(format!("queues must be 1..={MAX_QUEUES}, got {}", self.queues));
        }
        if !(1..=MAX_SLOTS).contains(&self.slots) {
            return Err(format!("slots per queue must be 1..={MAX_SLOTS}, got {}", self.slots));
        }
        if !(PAGE as u32..=MAX_SLOT_DATA).contains(&self.slot_data) {
            return Err(format!(
                "slot size must be {PAGE}..={MAX_SLOT_DATA}, got {}",
                self.slot_data
            ));
        }
        if !(1..=MAX_RECORDS).contains(&self.records) {
            return Err(format!(
                "notification records must be 1..={MAX_RECORDS}, got {}",
                self.records
            ));
        }
        Ok(())
    }

    pub fn total_slots(&self) -> usize {
        self.queues as usize * self.slots as usize
    }

    pub fn queue_off(&self, q: usize) -> usize {
        PAGE * (1 + q)
    }

    pub fn doorbell_off(&self, q: usize) -> usize {
        self.queue_off(q)
    }

    pub fn tail_off(&self, q: usize) -> usize {
        self.queue_off(q) + 64
    }

    pub fn entry_off(&self, q: usize, pos: u32) -> usize {
        self.queue_off(q) + ENTRIES_AT + 4 * (pos % self.slots) as usize
    }

    fn slot_stride(&self) -> usize {
        (SLOT_HEADER + self.slot_data as usize).div_ceil(PAGE) * PAGE
    }

    /// Slot `i` of queue `q`.
    pub fn slot_off(&self, q: usize, i: usize) -> usize {
        PAGE * (1 + self.queues as usize) + (q * self.slots as usize + i) * self.slot_stride()
    }

    pub fn notify_off(&self) -> usize {
        self.slot_off(0, 0) + self.total_slots() * self.slot_stride()
    }

    pub fn notify_head_off(&self) -> usize {
        self.notify_off()
    }

    pub fn notify_tail_off(&self) -> usize {
        self.notify_off() + 64
    }

    pub fn notify_overflow_off(&self) -> usize {
        self.notify_off() + 128
    }

    pub fn record_off(&self, pos: u32) -> usize {
        self.notify_off() + PAGE + RECORD * (pos % self.records) as usize
    }

    /// Bytes of the whole region.
    pub fn bytes(&self) -> usize {
        self.notify_off() + PAGE + RECORD * self.records as usize
    }
}

/// A shared mapping; unmapped on drop.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; all concurrent access goes through
// atomics or through byte copies of data that is validated after copying.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes of `fd` shared; refuses a file shorter than that.
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<Region> {
        let size = sys::file_size(fd)?;
        if size < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("ring memory is {size} bytes, expected {len}"),
            ));
        }
        let p = sys::map_shared(fd, len)?;
        let ptr = NonNull::new(p).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Region { ptr, len })
    }

    /// [`Region::map`] to read only: [`Region::write`] and stores through
    /// its words fault, so only loads may be used.
    pub fn map_read_only(fd: BorrowedFd<'_>, len: usize) -> io::Result<Region> {
        if sys::file_size(fd)? < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared memory shorter than expected",
            ));
        }
        let p = sys::map_shared_read(fd, len)?;
        let ptr = NonNull::new(p).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Region { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 32-bit word at `off`. Offsets come from a checked [`Geometry`];
    /// one outside the region is a bug of ours, caught here.
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "ring offset {off} outside the region"
        );
        // SAFETY: in bounds and aligned (the mapping is page-aligned); the
        // memory lives as long as `self`; AtomicU32 tolerates concurrent
        // access from the other process.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "ring offset {off} outside the region"
        );
        // SAFETY: as in `u32_at`.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// Copies `dst.len()` bytes from `off` out of the region. The other side
    /// may be writing them meanwhile: what arrives is untrusted bytes, to be
    /// validated after the copy, never in place.
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(
            off.checked_add(dst.len()).is_some_and(|e| e <= self.len),
            "ring read outside the region"
        );
        // SAFETY: in bounds; the destination is private memory.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len()) };
    }

    /// Copies `src` into the region at `off`.
    pub fn write(&self, off: usize, src: &[u8]) {
        assert!(
            off.checked_add(src.len()).is_some_and(|e| e <= self.len),
            "ring write outside the region"
        );
        // SAFETY: in bounds; the source is private memory.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len()) };
    }

    /// Appends `n` bytes at `off` to `out` (a reply, copied out once).
    pub fn read_into(&self, off: usize, n: usize, out: &mut Vec<u8>) {
        assert!(
            off.checked_add(n).is_some_and(|e| e <= self.len),
            "ring read outside the region"
        );
        out.reserve(n);
        let start = out.len();
        // SAFETY: the vector has room for n more bytes; they are initialised
        // by the copy before the length covers them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr().add(start), n);
            out.set_len(start + n);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: every borrow of the mapping borrows `self`, so none is left.
        unsafe { sys::unmap(self.ptr.as_ptr(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_keeps_parts_apart() {
        let g = Geometry {
            queues: 2,
            slots: 4,
            slot_data: (1 << 20) + 4096,
            records: 128,
        };
        g.check().unwrap();
        assert_eq!(g.entry_off(1, 5), g.queue_off(1) + ENTRIES_AT + 4);
        assert!(g.entry_off(1, 3) + 4 <= g.queue_off(2));
        assert!(g.queue_off(1) + PAGE <= g.slot_off(0, 0));
        assert!(g.slot_off(0, 0) + SLOT_HEADER + g.slot_data as usize <= g.slot_off(0, 1));
        assert!(g.slot_off(1, 3) + SLOT_HEADER + g.slot_data as usize <= g.notify_off());
        assert_eq!(g.record_off(128), g.record_off(0));
        assert_eq!(g.record_off(127) + RECORD, g.bytes());
        assert_eq!(entry_slot(7, entry(7, 3)), Some(3));
        assert_eq!(entry_slot(7 + g.slots, entry(7, 3)), None);
        assert_eq!(entry_slot(0x1_0007, entry(7, 3)), Some(3));
        assert_eq!(entry_slot(0xffff, EMPTY), Some(0xffff));
        for pos in [0, 1, g.slots, 0x1_0000 + g.slots] {
            assert_eq!(entry_slot(pos, EMPTY), None, "position {pos}");
        }
        for bad in [
            Geometry { queues: 0, ..g },
            Geometry {
                slots: MAX_SLOTS + 1,
                ..g
            },
            Geometry { slot_data: 10, ..g },
            Geometry { records: 0, ..g },
        ] {
            assert!(bad.check().is_err());
        }
    }
}
