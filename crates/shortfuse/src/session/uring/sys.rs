//! The system-level pieces of the uring session, and the only `unsafe` in
//! it: memory shared with the kernel, SQE construction and submission,
//! CPU pinning and the stop eventfd.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use io_uring::{opcode, squeue, types, IoUring};
use zerocopy::IntoBytes;

use shortfuse_abi as abi;

/// The ring type of every worker: 128-byte SQEs (`IORING_SETUP_SQE128`, the
/// FUSE command needs the 80-byte command area), plain 16-byte CQEs.
pub(super) type Ring = IoUring<squeue::Entry128, io_uring::cqueue::Entry>;

/// Anonymous memory that the kernel reads and writes between our system
/// calls: the header and payload buffers of ring entries. Pre-faulted
/// (`MAP_POPULATE`) so that the first request does not pay for page faults,
/// as libfuse does.
pub(super) struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory owned by one worker; moving the owner
// to another thread moves the only handle.
unsafe impl Send for Region {}

impl Region {
    pub(super) fn new(len: usize) -> io::Result<Region> {
        let len = len.max(1);
        // SAFETY: a fresh anonymous private mapping; no existing memory is
        // touched and the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Region { ptr, len })
    }

    /// Address of byte `offset`, for iovecs handed to the kernel.
    pub(super) fn addr(&self, offset: usize) -> *mut u8 {
        assert!(offset <= self.len);
        // SAFETY: in bounds of the mapping (checked above).
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    /// # Safety
    /// The kernel must not be using `offset..offset + len` now: the ring
    /// entry that owns it has completed (its CQE was reaped) and has not
    /// been submitted again; and no other slice of the range is alive.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds; the caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; the owner drops
        // the ring (which cancels the kernel's use) before its regions.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Offset of `len` in `struct io_uring_sqe` (after opcode, flags, ioprio,
/// fd, off and addr).
const SQE_LEN_OFFSET: usize = 24;

/// A FUSE ring command (`IORING_OP_URING_CMD` on the /dev/fuse fd, the
/// command in the SQE's 80-byte area). `addr`/`len` carry the iovec array
/// of REGISTER; the `io-uring` builder has no `len` setter, so the field is
/// written into the finished entry.
pub(super) fn fuse_cmd(
    dev: RawFd,
    cmd_op: u32,
    req: &abi::fuse_uring_cmd_req,
    iov: Option<(*const libc::iovec, u32)>,
    user_data: u64,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    let bytes = req.as_bytes();
    cmd[..bytes.len()].copy_from_slice(bytes);
    let mut b = opcode::UringCmd80::new(types::Fd(dev), cmd_op).cmd(cmd);
    if let Some((ptr, _)) = iov {
        b = b.addr(Some(ptr as u64));
    }
    let entry = b.build().user_data(user_data);
    let Some((_, len)) = iov else { return entry };
    // SAFETY: `Entry128` is `#[repr(C)]` around the kernel's 64-byte
    // `io_uring_sqe` (plain integers and unions of integers) followed by 64
    // bytes of command, 128 bytes without padding, so every byte pattern is
    // a valid value and the round trip through an array is sound.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute::<squeue::Entry128, [u8; 128]>(entry) };
    raw[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// `POLL_ADD` for readability of the stop eventfd; does not consume the
/// counter, so one write wakes every worker.
pub(super) fn poll_stop(efd: RawFd, user_data: u64) -> squeue::Entry128 {
    squeue::Entry128::from(
        opcode::PollAdd::new(types::Fd(efd), libc::POLLIN as u32)
            .build()
            .user_data(user_data),
    )
}

/// Queues `entry`.
///
/// # Safety
/// Every buffer the entry points to (iovec array, header and payload
/// regions) must stay valid until its completion is reaped or the ring is
/// dropped.
pub(super) unsafe fn push(ring: &mut Ring, entry: &squeue::Entry128) -> io::Result<()> {
    // SAFETY: forwarded to the caller.
    unsafe { ring.submission().push(entry) }
        .map_err(|_| io::Error::other("io_uring submission queue full (more entries than its size)"))
}

/// Pins the calling thread to `cpu` (`sched_setaffinity(2)`).
pub(super) fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} out of range"),
        ));
    }
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write inside it
    // (index checked above) and sched_setaffinity only reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An eventfd that wakes the workers: to stop, or to commit replies
/// answered later.
pub(super) struct EventFd(OwnedFd);

impl EventFd {
    pub(super) fn new() -> io::Result<EventFd> {
        // SAFETY: plain system call; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(super) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our own eventfd. A
        // failure can only be a saturated counter, which is signalled anyway.
        unsafe {
            libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// Resets the counter (after its poll completed).
    pub(super) fn clear(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from our own non-blocking
        // eventfd; EAGAIN (already zero) is fine.
        unsafe {
            libc::read(self.0.as_raw_fd(), (&mut n as *mut u64).cast(), 8);
        }
    }

    pub(super) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(e: squeue::Entry128) -> [u8; 128] {
        assert_eq!(std::mem::size_of::<squeue::Entry128>(), 128);
        // SAFETY: as in `fuse_cmd`: 128 bytes of plain integers.
        unsafe { std::mem::transmute::<squeue::Entry128, [u8; 128]>(e) }
    }

    #[test]
    fn register_sqe_layout_matches_the_kernel() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let req = abi::fuse_uring_cmd_req {
            commit_id: 0x1122_3344_5566_7788,
            qid: 3,
            ..Default::default()
        };
        let raw = bytes(fuse_cmd(
            7,
            abi::FUSE_IO_URING_CMD_REGISTER,
            &req,
            Some((iov.as_ptr(), 2)),
            42,
        ));
        let u32_at = |o: usize| u32::from_ne_bytes(raw[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(raw[o..o + 8].try_into().unwrap());
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(u32_at(4), 7, "fd");
        assert_eq!(u32_at(8), abi::FUSE_IO_URING_CMD_REGISTER, "cmd_op");
        assert_eq!(u64_at(16), iov.as_ptr() as u64, "addr");
        assert_eq!(u32_at(24), 2, "len");
        assert_eq!(u64_at(32), 42, "user_data");
        // The command area starts at byte 48 of a 128-byte SQE.
        assert_eq!(&raw[48..72], req.as_bytes());
        assert!(raw[72..].iter().all(|&b| b == 0));
    }

    #[test]
    fn commit_sqe_has_no_iovec() {
        let req = abi::fuse_uring_cmd_req {
            commit_id: 9,
            qid: 1,
            ..Default::default()
        };
        let raw = bytes(fuse_cmd(5, abi::FUSE_IO_URING_CMD_COMMIT_AND_FETCH, &req, None, 1));
        assert_eq!(u32::from_ne_bytes(raw[8..12].try_into().unwrap()), 2);
        assert_eq!(&raw[16..28], &[0u8; 12], "addr and len");
        assert_eq!(&raw[48..72], req.as_bytes());
    }
}
