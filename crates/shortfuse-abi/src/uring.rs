//! FUSE over io_uring (7.42, Linux 6.14+): the header buffer each ring
//! entry registers and the command in the SQE's 80-byte command area.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::request::wire;

/// Room for `fuse_in_header`/`fuse_out_header` in the ring header.
pub const FUSE_URING_IN_OUT_HEADER_SZ: usize = 128;
/// Room for the first (fixed) argument of a request.
pub const FUSE_URING_OP_IN_OUT_SZ: usize = 128;

wire! {
    /// The per-entry part of the ring header.
    pub struct fuse_uring_ent_in_out {
        /// Zero (no flags defined yet).
        pub flags: u64,
        /// The request's `unique`; given back in COMMIT_AND_FETCH.
        pub commit_id: u64,
        /// Bytes of the payload buffer in use.
        pub payload_sz: u32,
        /// Zero.
        pub padding: u32,
        /// Zero.
        pub reserved: u64,
    }
}

/// The header buffer (`iov[0]` of REGISTER) of one ring entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct fuse_uring_req_header {
    /// `fuse_in_header` of a request, `fuse_out_header` of a reply.
    pub in_out: [u8; FUSE_URING_IN_OUT_HEADER_SZ],
    /// The request's fixed argument.
    pub op_in: [u8; FUSE_URING_OP_IN_OUT_SZ],
    /// Commit id and payload size.
    pub ring_ent_in_out: fuse_uring_ent_in_out,
}

/// `enum fuse_uring_cmd`, placed in `sqe->cmd_op`.
pub const FUSE_IO_URING_CMD_INVALID: u32 = 0;
/// Register a ring entry; the kernel fills it with a request when one comes.
pub const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
/// Commit a reply and fetch the next request into the same entry.
pub const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

wire! {
    /// In the SQE's command area (SQE128 rings).
    pub struct fuse_uring_cmd_req {
        /// Zero (no flags defined yet).
        pub flags: u64,
        /// For COMMIT_AND_FETCH: the `unique` of the request answered.
        pub commit_id: u64,
        /// Queue (CPU) index.
        pub qid: u16,
        /// Zero.
        pub padding: [u8; 6],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(size_of::<fuse_uring_ent_in_out>(), 32);
        assert_eq!(offset_of!(fuse_uring_ent_in_out, commit_id), 8);
        assert_eq!(offset_of!(fuse_uring_ent_in_out, payload_sz), 16);
        assert_eq!(offset_of!(fuse_uring_ent_in_out, reserved), 24);
        assert_eq!(size_of::<fuse_uring_req_header>(), 288);
        assert_eq!(offset_of!(fuse_uring_req_header, op_in), 128);
        assert_eq!(offset_of!(fuse_uring_req_header, ring_ent_in_out), 256);
        assert_eq!(size_of::<fuse_uring_cmd_req>(), 24);
        assert_eq!(offset_of!(fuse_uring_cmd_req, qid), 16);
    }
}
