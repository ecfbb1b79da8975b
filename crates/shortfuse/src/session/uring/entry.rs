//! One ring entry's bytes: the kernel's split layout (header buffer with
//! `in_out`, `op_in` and `ring_ent_in_out`; payload buffer) to and from the
//! contiguous message that the dispatcher reads and writes.

use core::mem::size_of;

use shortfuse_abi::{self as abi, FUSE_URING_IN_OUT_HEADER_SZ, FUSE_URING_OP_IN_OUT_SZ};
use zerocopy::{FromBytes, IntoBytes};

use crate::errno::Errno;

/// `struct fuse_uring_req_header`: `iov[0]` of REGISTER.
pub(super) const HEADER_SIZE: usize = size_of::<abi::fuse_uring_req_header>();
const IN_HEADER: usize = size_of::<abi::fuse_in_header>();
const OUT_HEADER: usize = size_of::<abi::fuse_out_header>();
const OP_IN: usize = FUSE_URING_IN_OUT_HEADER_SZ;
const ENT_IN_OUT: usize = OP_IN + FUSE_URING_OP_IN_OUT_SZ;
const PAYLOAD_SZ: usize = ENT_IN_OUT + core::mem::offset_of!(abi::fuse_uring_ent_in_out, payload_sz);

/// Bytes the kernel put in `op_in`: the request's first argument, or 0 for
/// requests whose first argument is a name (LOOKUP, UNLINK, ...), which
/// the kernel sends as a zero-sized argument followed by the name in the
/// payload. SETXATTR's argument grows with `FUSE_SETXATTR_EXT`.
/// NOTIFY_REPLY (the answer to a retrieve) is sent the same way: a zero
/// first argument, then `fuse_notify_retrieve_in` and the data.
pub(super) fn op_in_size(opcode: u32, setxattr_ext: bool) -> usize {
    let size = match opcode {
        abi::FUSE_SETXATTR if setxattr_ext => size_of::<abi::fuse_setxattr_in>(),
        abi::FUSE_NOTIFY_REPLY => 0,
        _ => abi::op_info(opcode).map_or(0, |i| i.arg_size),
    };
    size.min(FUSE_URING_OP_IN_OUT_SZ)
}

/// Why an entry's request could not be assembled.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Malformed {
    /// `payload_sz` larger than the registered payload buffer.
    PayloadTooLarge { payload_sz: u32, buffer: usize },
}

/// The request in an entry: its header fields needed to answer it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Arrived {
    pub opcode: u32,
    pub unique: u64,
}

/// Reads the request of a completed entry into `out` as one message
/// (`fuse_in_header`, first argument, payload) with `len` set to its size.
/// `out` is cleared first and must have room for `IN_HEADER + 128 +
/// payload.len()` bytes so that nothing is allocated.
pub(super) fn assemble(
    header: &[u8],
    payload: &[u8],
    setxattr_ext: bool,
    out: &mut Vec<u8>,
) -> Result<Arrived, (Arrived, Malformed)> {
    let (h, _) = abi::fuse_in_header::read_from_prefix(&header[..IN_HEADER]).expect("header buffer holds 40 bytes");
    let ent = abi::fuse_uring_ent_in_out::read_from_bytes(&header[ENT_IN_OUT..HEADER_SIZE])
        .expect("header buffer holds fuse_uring_ent_in_out");
    let arrived = Arrived {
        opcode: h.opcode,
        unique: h.unique,
    };
    let payload_sz = ent.payload_sz as usize;
    if payload_sz > payload.len() {
        let why = Malformed::PayloadTooLarge {
            payload_sz: ent.payload_sz,
            buffer: payload.len(),
        };
        return Err((arrived, why));
    }
    let arg = op_in_size(h.opcode, setxattr_ext);
    out.clear();
    out.extend_from_slice(&header[..IN_HEADER]);
    out.extend_from_slice(&header[OP_IN..OP_IN + arg]);
    out.extend_from_slice(&payload[..payload_sz]);
    // The kernel's `len` counts the /dev/fuse message; recompute it for the
    // message assembled here so the parser sees a consistent request.
    let len = u32::try_from(out.len()).unwrap_or(u32::MAX);
    out[..4].copy_from_slice(&len.to_ne_bytes());
    Ok(arrived)
}

/// Puts a dispatcher reply (`fuse_out_header` + payload) into the entry:
/// the header into `in_out`, the rest into the payload buffer, its size into
/// `payload_sz`. A reply that does not fit (or has no header) becomes an
/// EIO answer to `unique`.
pub(super) fn store_reply(reply: &[u8], unique: u64, header: &mut [u8], payload: &mut [u8]) {
    match reply.split_at_checked(OUT_HEADER) {
        Some((out, body)) if body.len() <= payload.len() => {
            header[..OUT_HEADER].copy_from_slice(out);
            payload[..body.len()].copy_from_slice(body);
            set_payload_sz(header, body.len() as u32);
        }
        _ => {
            tracing::warn!(
                "uring: reply of {} bytes does not fit the {}-byte payload buffer; answering EIO",
                reply.len(),
                payload.len()
            );
            store_error(unique, Errno::EIO, header);
        }
    }
}

/// An error answer to `unique` with no payload.
pub(super) fn store_error(unique: u64, errno: Errno, header: &mut [u8]) {
    let out = abi::fuse_out_header {
        len: OUT_HEADER as u32,
        error: -errno.raw(),
        unique,
    };
    header[..OUT_HEADER].copy_from_slice(out.as_bytes());
    set_payload_sz(header, 0);
}

fn set_payload_sz(header: &mut [u8], n: u32) {
    header[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&n.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_with(h: &abi::fuse_in_header, op_in: &[u8], payload_sz: u32) -> Vec<u8> {
        let mut hdr = vec![0xAAu8; HEADER_SIZE];
        hdr[..IN_HEADER].copy_from_slice(h.as_bytes());
        hdr[OP_IN..OP_IN + op_in.len()].copy_from_slice(op_in);
        let ent = abi::fuse_uring_ent_in_out {
            commit_id: h.unique,
            payload_sz,
            ..Default::default()
        };
        hdr[ENT_IN_OUT..].copy_from_slice(ent.as_bytes());
        hdr
    }

    #[test]
    fn write_request_is_header_then_arg_then_data() {
        let h = abi::fuse_in_header {
            len: 999,
            opcode: abi::FUSE_WRITE,
            unique: 7,
            nodeid: 5,
            ..Default::default()
        };
        let w = abi::fuse_write_in {
            fh: 3,
            offset: 4096,
            size: 5,
            ..Default::default()
        };
        let hdr = header_with(&h, w.as_bytes(), 5);
        let mut payload = vec![0u8; 8192];
        payload[..5].copy_from_slice(b"hello");
        let mut out = Vec::with_capacity(IN_HEADER + 128 + payload.len());
        let cap = out.capacity();
        let a = assemble(&hdr, &payload, false, &mut out).unwrap();
        assert_eq!(
            a,
            Arrived {
                opcode: abi::FUSE_WRITE,
                unique: 7
            }
        );
        assert_eq!(out.len(), IN_HEADER + size_of::<abi::fuse_write_in>() + 5);
        assert_eq!(u32::from_ne_bytes(out[..4].try_into().unwrap()) as usize, out.len());
        assert_eq!(&out[4..IN_HEADER], &h.as_bytes()[4..]);
        assert_eq!(&out[IN_HEADER..IN_HEADER + 40], w.as_bytes());
        assert_eq!(&out[IN_HEADER + 40..], b"hello");
        assert_eq!(out.capacity(), cap, "no reallocation");
        let req = abi::parse(&out).unwrap();
        assert!(matches!(req.op, abi::Operation::Write { data, .. } if data == b"hello"));
    }

    #[test]
    fn name_only_requests_have_an_empty_op_in() {
        let h = abi::fuse_in_header {
            opcode: abi::FUSE_LOOKUP,
            unique: 9,
            nodeid: 1,
            ..Default::default()
        };
        // op_in holds stale bytes from an earlier request: they must not leak in.
        let hdr = header_with(&h, &[1, 2, 3, 4], 4);
        let mut payload = vec![0u8; 8192];
        payload[..4].copy_from_slice(b"abc\0");
        let mut out = Vec::new();
        assemble(&hdr, &payload, false, &mut out).unwrap();
        assert_eq!(&out[IN_HEADER..], b"abc\0");
        let req = abi::parse(&out).unwrap();
        assert!(matches!(req.op, abi::Operation::Lookup { name } if name.as_encoded_bytes() == b"abc"));
    }

    #[test]
    fn setxattr_arg_size_follows_the_extension() {
        assert_eq!(op_in_size(abi::FUSE_SETXATTR, false), abi::FUSE_COMPAT_SETXATTR_IN_SIZE);
        assert_eq!(op_in_size(abi::FUSE_SETXATTR, true), size_of::<abi::fuse_setxattr_in>());
        assert_eq!(op_in_size(abi::FUSE_GETATTR, false), size_of::<abi::fuse_getattr_in>());
        assert_eq!(op_in_size(abi::FUSE_UNLINK, false), 0);
        assert_eq!(op_in_size(0xdead, false), 0);
    }

    #[test]
    fn oversized_payload_is_refused() {
        let h = abi::fuse_in_header {
            opcode: abi::FUSE_WRITE,
            unique: 11,
            ..Default::default()
        };
        let hdr = header_with(&h, &[0; 40], 9000);
        let mut out = Vec::new();
        let (a, why) = assemble(&hdr, &[0u8; 8192], false, &mut out).unwrap_err();
        assert_eq!(a.unique, 11);
        assert_eq!(
            why,
            Malformed::PayloadTooLarge {
                payload_sz: 9000,
                buffer: 8192
            }
        );
    }

    #[test]
    fn reply_is_split_into_header_and_payload() {
        let mut hdr = vec![0u8; HEADER_SIZE];
        let mut payload = vec![0u8; 8192];
        let out = abi::fuse_out_header {
            len: 16 + 3,
            error: 0,
            unique: 42,
        };
        let mut reply = out.as_bytes().to_vec();
        reply.extend_from_slice(b"xyz");
        store_reply(&reply, 42, &mut hdr, &mut payload);
        assert_eq!(&hdr[..16], out.as_bytes());
        assert_eq!(&payload[..3], b"xyz");
        let ent = abi::fuse_uring_ent_in_out::read_from_bytes(&hdr[ENT_IN_OUT..]).unwrap();
        assert_eq!(ent.payload_sz, 3);
    }

    #[test]
    fn reply_too_large_becomes_eio() {
        let mut hdr = vec![0u8; HEADER_SIZE];
        let mut payload = vec![0u8; 4];
        let mut reply = abi::fuse_out_header {
            len: 16 + 8,
            error: 0,
            unique: 5,
        }
        .as_bytes()
        .to_vec();
        reply.extend_from_slice(&[7; 8]);
        store_reply(&reply, 5, &mut hdr, &mut payload);
        let (out, _) = abi::fuse_out_header::read_from_prefix(&hdr).unwrap();
        assert_eq!((out.len, out.error, out.unique), (16, -libc::EIO, 5));
        let ent = abi::fuse_uring_ent_in_out::read_from_bytes(&hdr[ENT_IN_OUT..]).unwrap();
        assert_eq!(ent.payload_sz, 0);
    }
}
