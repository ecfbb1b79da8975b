//! The FUSE wire protocol, version 7.45 (Linux 6.18): opcodes, the
//! `#[repr(C)]` request and reply structs, flag families, notifications,
//! directory entries, FUSE-over-io_uring and passthrough structs, and a
//! zero-copy parser.
//!
//! Plain data, no I/O. Struct and constant names follow the kernel's
//! `include/uapi/linux/fuse.h` so that they can be checked against it
//! (`type` fields are spelled `typ`). Every struct derives the `zerocopy`
//! traits: encode with `IntoBytes::as_bytes`, decode with [`parse()`].

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![allow(non_camel_case_types)]

pub mod dirent;
pub mod flags;
pub mod ioctl;
pub mod notify;
pub mod opcodes;
pub mod parse;
pub mod reply;
pub mod request;
pub mod uring;

pub use dirent::*;
pub use flags::*;
pub use ioctl::*;
pub use notify::*;
pub use opcodes::*;
pub use parse::{
    parse, parse_header, parse_with, ForgetList, Operation, ParseConfig, ParseError, ParseErrorKind, RemoveMappingList,
    Request,
};
pub use reply::*;
pub use request::*;
pub use uring::*;
