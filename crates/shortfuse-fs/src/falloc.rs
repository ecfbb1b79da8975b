//! `fallocate(2)`'s arguments as the kernel's VFS checks them, for the file
//! systems that serve the call (mem, stripe, pack).

use shortfuse::{Errno, FallocateFlags, Result};

/// What one `fallocate(2)` asks, once its mode and range were checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Falloc {
    /// FALLOC_FL_PUNCH_HOLE: the range reads as zeros, a hole.
    pub punch: bool,
    /// FALLOC_FL_ZERO_RANGE: the range reads as zeros.
    pub zero: bool,
    /// FALLOC_FL_KEEP_SIZE: the size never grows.
    pub keep_size: bool,
    /// The end of the range (offset + length).
    pub end: u64,
}

impl Falloc {
    /// Checks `mode`, `offset` and `length`: EOPNOTSUPP for modes other
    /// than the default, KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE, and for a
    /// hole punched without KEEP_SIZE (a punched hole never changes the
    /// size); EINVAL for PUNCH_HOLE with ZERO_RANGE and for an empty range;
    /// EFBIG for a range past what an offset can hold.
    pub fn parse(offset: u64, length: u64, mode: FallocateFlags) -> Result<Falloc> {
        let supported = FallocateFlags::KEEP_SIZE | FallocateFlags::PUNCH_HOLE | FallocateFlags::ZERO_RANGE;
        if !supported.contains(mode) {
            return Err(Errno::EOPNOTSUPP);
        }
        let punch = mode.contains(FallocateFlags::PUNCH_HOLE);
        let zero = mode.contains(FallocateFlags::ZERO_RANGE);
        let keep_size = mode.contains(FallocateFlags::KEEP_SIZE);
        if punch && zero {
            return Err(Errno::EINVAL);
        }
        if punch && !keep_size {
            return Err(Errno::EOPNOTSUPP);
        }
        if length == 0 {
            return Err(Errno::EINVAL);
        }
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        Ok(Falloc {
            punch,
            zero,
            keep_size,
            end,
        })
    }
}
