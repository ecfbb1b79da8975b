//! Zero-copy parsing of one request message into a borrowed per-opcode view.
//!
//! Fixed argument structs are copied out by value (they are small, and the
//! message buffer need not be 8-byte aligned); names and data stay borrowed
//! slices of the message. Every length is checked: a truncated, oversized
//! or garbled message gives a [`ParseError`], never a panic.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;

use zerocopy::FromBytes;

use crate::notify::fuse_notify_retrieve_in;
use crate::opcodes::*;
use crate::request::*;

/// What the daemon negotiated that changes request layouts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParseConfig {
    /// `FUSE_SETXATTR_EXT` was negotiated: SETXATTR carries the 16-byte
    /// `fuse_setxattr_in`.
    pub setxattr_ext: bool,
}

/// One parsed request: header, per-opcode arguments, raw extensions.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The header: opcode, `unique`, node, caller.
    pub header: fuse_in_header,
    /// The opcode's arguments.
    pub op: Operation<'a>,
    /// Request extensions (`total_extlen * 8` bytes at the end), unparsed.
    pub extensions: &'a [u8],
}

impl Request<'_> {
    /// The `FUSE_*` opcode.
    pub fn opcode(&self) -> u32 {
        self.header.opcode
    }

    /// The request id the reply carries back.
    pub fn unique(&self) -> u64 {
        self.header.unique
    }
}

/// The array of a BATCH_FORGET request, read item by item.
#[derive(Clone, Copy, Debug)]
pub struct ForgetList<'a>(&'a [u8]);

impl<'a> ForgetList<'a> {
    /// Number of forgotten nodes.
    pub fn len(&self) -> usize {
        self.0.len() / core::mem::size_of::<fuse_forget_one>()
    }

    /// No forgotten nodes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each of them, in order.
    pub fn iter(&self) -> impl Iterator<Item = fuse_forget_one> + 'a {
        self.0
            .chunks_exact(core::mem::size_of::<fuse_forget_one>())
            .filter_map(|c| fuse_forget_one::read_from_bytes(c).ok())
    }
}

/// The array of a REMOVEMAPPING request, read item by item.
#[derive(Clone, Copy, Debug)]
pub struct RemoveMappingList<'a>(&'a [u8]);

impl<'a> RemoveMappingList<'a> {
    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.0.len() / core::mem::size_of::<fuse_removemapping_one>()
    }

    /// No ranges.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each of them, in order.
    pub fn iter(&self) -> impl Iterator<Item = fuse_removemapping_one> + 'a {
        self.0
            .chunks_exact(core::mem::size_of::<fuse_removemapping_one>())
            .filter_map(|c| fuse_removemapping_one::read_from_bytes(c).ok())
    }
}

/// The arguments of each opcode. Names are given without their NUL byte.
#[derive(Clone, Copy, Debug)]
pub enum Operation<'a> {
    /// LOOKUP: find a name in the header's directory.
    Lookup {
        /// The name looked up.
        name: &'a OsStr,
    },
    /// FORGET: the kernel drops lookups of the header's node (no reply).
    Forget {
        /// The fixed argument.
        arg: fuse_forget_in,
    },
    /// GETATTR: the header's node's attributes.
    Getattr {
        /// The fixed argument.
        arg: fuse_getattr_in,
    },
    /// SETATTR: change the header's node's attributes.
    Setattr {
        /// The fixed argument.
        arg: fuse_setattr_in,
    },
    /// READLINK: the target of the header's symbolic link.
    Readlink,
    /// SYMLINK: create a symbolic link in the header's directory.
    Symlink {
        /// Name of the new link.
        name: &'a OsStr,
        /// What the link points to.
        target: &'a OsStr,
    },
    /// MKNOD: create a node in the header's directory.
    Mknod {
        /// The fixed argument.
        arg: fuse_mknod_in,
        /// Name of the new node.
        name: &'a OsStr,
    },
    /// MKDIR: create a directory in the header's directory.
    Mkdir {
        /// The fixed argument.
        arg: fuse_mkdir_in,
        /// Name of the new directory.
        name: &'a OsStr,
    },
    /// UNLINK: remove a name from the header's directory.
    Unlink {
        /// The name removed.
        name: &'a OsStr,
    },
    /// RMDIR: remove an empty directory from the header's directory.
    Rmdir {
        /// The name removed.
        name: &'a OsStr,
    },
    /// RENAME: move a name of the header's directory to `arg.newdir`.
    Rename {
        /// The fixed argument.
        arg: fuse_rename_in,
        /// The name in the header's directory.
        name: &'a OsStr,
        /// The name in `arg.newdir`.
        new_name: &'a OsStr,
    },
    /// LINK: a new name in the header's directory for `arg.oldnodeid`.
    Link {
        /// The fixed argument.
        arg: fuse_link_in,
        /// The new name.
        name: &'a OsStr,
    },
    /// OPEN: open the header's file.
    Open {
        /// The fixed argument.
        arg: fuse_open_in,
    },
    /// READ from an open file.
    Read {
        /// The fixed argument.
        arg: fuse_read_in,
    },
    /// WRITE to an open file.
    Write {
        /// The fixed argument.
        arg: fuse_write_in,
        /// The bytes to write.
        data: &'a [u8],
    },
    /// STATFS: the file system's figures.
    Statfs,
    /// RELEASE: the last close of an open file.
    Release {
        /// The fixed argument.
        arg: fuse_release_in,
    },
    /// FSYNC: sync an open file.
    Fsync {
        /// The fixed argument.
        arg: fuse_fsync_in,
    },
    /// SETXATTR: set an extended attribute. Without `FUSE_SETXATTR_EXT`,
    /// `setxattr_flags` reads as 0.
    Setxattr {
        /// The fixed argument.
        arg: fuse_setxattr_in,
        /// The attribute's name.
        name: &'a OsStr,
        /// The value.
        value: &'a [u8],
    },
    /// GETXATTR: an extended attribute of the header's node.
    Getxattr {
        /// The fixed argument.
        arg: fuse_getxattr_in,
        /// The attribute's name.
        name: &'a OsStr,
    },
    /// LISTXATTR: the extended attribute names of the header's node.
    Listxattr {
        /// The fixed argument.
        arg: fuse_getxattr_in,
    },
    /// REMOVEXATTR: remove an extended attribute.
    Removexattr {
        /// The attribute's name.
        name: &'a OsStr,
    },
    /// FLUSH: a `close(2)` of one descriptor of an open file.
    Flush {
        /// The fixed argument.
        arg: fuse_flush_in,
    },
    /// INIT: the kernel's offer. From a kernel older than 7.36 the
    /// missing fields read as 0.
    Init {
        /// The fixed argument.
        arg: fuse_init_in,
    },
    /// OPENDIR: open the header's directory.
    Opendir {
        /// The fixed argument.
        arg: fuse_open_in,
    },
    /// READDIR: list an open directory.
    Readdir {
        /// The fixed argument.
        arg: fuse_read_in,
    },
    /// RELEASEDIR: the last close of an open directory.
    Releasedir {
        /// The fixed argument.
        arg: fuse_release_in,
    },
    /// FSYNCDIR: sync an open directory.
    Fsyncdir {
        /// The fixed argument.
        arg: fuse_fsync_in,
    },
    /// GETLK: test for a conflicting POSIX lock.
    Getlk {
        /// The fixed argument.
        arg: fuse_lk_in,
    },
    /// SETLK: take or drop a lock without waiting.
    Setlk {
        /// The fixed argument.
        arg: fuse_lk_in,
    },
    /// SETLKW: take a lock, waiting for conflicting ones to go.
    Setlkw {
        /// The fixed argument.
        arg: fuse_lk_in,
    },
    /// ACCESS: may the caller access the header's node.
    Access {
        /// The fixed argument.
        arg: fuse_access_in,
    },
    /// CREATE: create and open a file in the header's directory.
    Create {
        /// The fixed argument.
        arg: fuse_create_in,
        /// Name of the new file.
        name: &'a OsStr,
    },
    /// INTERRUPT: the caller gave up on an earlier request.
    Interrupt {
        /// The fixed argument.
        arg: fuse_interrupt_in,
    },
    /// BMAP: map a file block to a device block.
    Bmap {
        /// The fixed argument.
        arg: fuse_bmap_in,
    },
    /// DESTROY: the connection ends.
    Destroy,
    /// IOCTL on an open file.
    Ioctl {
        /// The fixed argument.
        arg: fuse_ioctl_in,
        /// `arg.in_size` bytes of input.
        data: &'a [u8],
    },
    /// POLL: is an open file ready.
    Poll {
        /// The fixed argument.
        arg: fuse_poll_in,
    },
    /// NOTIFY_REPLY: the kernel's answer to `FUSE_NOTIFY_RETRIEVE` (no reply).
    NotifyReply {
        /// The fixed argument.
        arg: fuse_notify_retrieve_in,
        /// The cached bytes found.
        data: &'a [u8],
    },
    /// BATCH_FORGET: FORGET of several nodes (no reply).
    BatchForget {
        /// The fixed argument.
        arg: fuse_batch_forget_in,
        /// The nodes and the lookups dropped of each.
        nodes: ForgetList<'a>,
    },
    /// FALLOCATE: allocate, punch or zero a range of an open file.
    Fallocate {
        /// The fixed argument.
        arg: fuse_fallocate_in,
    },
    /// READDIRPLUS: list an open directory with attributes.
    Readdirplus {
        /// The fixed argument.
        arg: fuse_read_in,
    },
    /// RENAME2: RENAME with `renameat2(2)` flags.
    Rename2 {
        /// The fixed argument.
        arg: fuse_rename2_in,
        /// The name in the header's directory.
        name: &'a OsStr,
        /// The name in `arg.newdir`.
        new_name: &'a OsStr,
    },
    /// LSEEK: find data or a hole in an open file.
    Lseek {
        /// The fixed argument.
        arg: fuse_lseek_in,
    },
    /// COPY_FILE_RANGE: copy between two open files.
    CopyFileRange {
        /// The fixed argument.
        arg: fuse_copy_file_range_in,
    },
    /// SETUPMAPPING: map part of a file into the DAX window.
    SetupMapping {
        /// The fixed argument.
        arg: fuse_setupmapping_in,
    },
    /// REMOVEMAPPING: remove DAX mappings.
    RemoveMapping {
        /// The fixed argument.
        arg: fuse_removemapping_in,
        /// The ranges to unmap.
        entries: RemoveMappingList<'a>,
    },
    /// SYNCFS: sync the whole file system.
    Syncfs {
        /// The fixed argument.
        arg: fuse_syncfs_in,
    },
    /// TMPFILE: create an unnamed open file in the header's directory.
    Tmpfile {
        /// The fixed argument.
        arg: fuse_create_in,
        /// Name the kernel gives the unnamed file.
        name: &'a OsStr,
    },
    /// STATX: the header's node's `statx(2)` attributes.
    Statx {
        /// The fixed argument.
        arg: fuse_statx_in,
    },
    /// COPY_FILE_RANGE_64: COPY_FILE_RANGE with a 64-bit count in the reply.
    CopyFileRange64 {
        /// The fixed argument.
        arg: fuse_copy_file_range_in,
    },
    /// CUSE_INIT: first request of a CUSE connection.
    CuseInit {
        /// The fixed argument.
        arg: cuse_init_in,
    },
}

/// Why a message could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// Fewer bytes than a `fuse_in_header`.
    ShortHeader {
        /// Bytes in the message.
        have: usize,
    },
    /// `fuse_in_header.len` differs from the message length.
    LengthMismatch {
        /// What the header says.
        header_len: u32,
        /// Bytes in the message.
        have: usize,
    },
    /// `total_extlen` claims more bytes than the body holds.
    BadExtensions {
        /// Bytes of extensions claimed.
        extlen: usize,
        /// Bytes after the header.
        body: usize,
    },
    /// An opcode this crate does not know.
    UnknownOpcode,
    /// The fixed argument or trailing data is cut short.
    Truncated {
        /// Bytes the opcode needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// A name has no terminating NUL byte.
    UnterminatedName,
    /// A count field does not fit the message.
    BadCount {
        /// The count.
        count: u64,
    },
}

/// A message that could not be parsed. When the header itself was readable,
/// [`ParseError::header`] gives it, so the caller can still answer
/// `unique` with an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The header, when it could be read.
    pub header: Option<fuse_in_header>,
    /// What is wrong.
    pub kind: ParseErrorKind,
}

impl ParseError {
    /// The header, when it could be read.
    pub fn header(&self) -> Option<&fuse_in_header> {
        self.header.as_ref()
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.header {
            Some(h) => write!(
                f,
                "bad FUSE request (opcode {} {}, unique {}): ",
                h.opcode,
                opcode_name(h.opcode),
                h.unique
            )?,
            None => f.write_str("bad FUSE request: ")?,
        }
        match self.kind {
            ParseErrorKind::ShortHeader { have } => write!(f, "{have} bytes, shorter than the 40-byte header"),
            ParseErrorKind::LengthMismatch { header_len, have } => {
                write!(f, "header says {header_len} bytes, message has {have}")
            }
            ParseErrorKind::BadExtensions { extlen, body } => {
                write!(f, "{extlen} bytes of extensions in a {body}-byte body")
            }
            ParseErrorKind::UnknownOpcode => f.write_str("unknown opcode"),
            ParseErrorKind::Truncated { need, have } => write!(f, "needs {need} bytes of arguments, has {have}"),
            ParseErrorKind::UnterminatedName => f.write_str("name without NUL terminator"),
            ParseErrorKind::BadCount { count } => write!(f, "count {count} does not fit the message"),
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses one request with the default layouts (no `FUSE_SETXATTR_EXT`).
pub fn parse(buf: &[u8]) -> Result<Request<'_>, ParseError> {
    parse_with(buf, ParseConfig::default())
}

/// Only the header: enough to answer a request whose body is unusable.
pub fn parse_header(buf: &[u8]) -> Result<fuse_in_header, ParseError> {
    match fuse_in_header::read_from_prefix(buf) {
        Ok((h, _)) => Ok(h),
        Err(_) => Err(ParseError {
            header: None,
            kind: ParseErrorKind::ShortHeader { have: buf.len() },
        }),
    }
}

/// Parses one request message; `buf` must be exactly the message
/// (`fuse_in_header.len` bytes).
pub fn parse_with(buf: &[u8], config: ParseConfig) -> Result<Request<'_>, ParseError> {
    let header = parse_header(buf)?;
    let err = |kind| ParseError {
        header: Some(header),
        kind,
    };
    if header.len as usize != buf.len() {
        return Err(err(ParseErrorKind::LengthMismatch {
            header_len: header.len,
            have: buf.len(),
        }));
    }
    let body = &buf[core::mem::size_of::<fuse_in_header>()..];
    let extlen = header.total_extlen as usize * 8;
    if extlen > body.len() {
        return Err(err(ParseErrorKind::BadExtensions {
            extlen,
            body: body.len(),
        }));
    }
    let (body, extensions) = body.split_at(body.len() - extlen);
    // The opcode table says which opcodes exist and their smallest argument.
    let info = op_info(header.opcode).ok_or(err(ParseErrorKind::UnknownOpcode))?;
    if body.len() < info.arg_size {
        return Err(err(ParseErrorKind::Truncated {
            need: info.arg_size,
            have: body.len(),
        }));
    }
    let op = parse_op(header.opcode, body, config).map_err(err)?;
    Ok(Request { header, op, extensions })
}

/// A cursor over the body of one message.
struct Body<'a>(&'a [u8]);

impl<'a> Body<'a> {
    fn arg<T: FromBytes>(&mut self) -> Result<T, ParseErrorKind> {
        match T::read_from_prefix(self.0) {
            Ok((v, rest)) => {
                self.0 = rest;
                Ok(v)
            }
            Err(_) => Err(ParseErrorKind::Truncated {
                need: core::mem::size_of::<T>(),
                have: self.0.len(),
            }),
        }
    }

    /// A struct of which older peers send only a prefix of at least `min`
    /// bytes; the rest reads as zero.
    fn arg_prefix<T: FromBytes + zerocopy::IntoBytes>(&mut self, min: usize) -> Result<T, ParseErrorKind> {
        let size = core::mem::size_of::<T>();
        if self.0.len() < min {
            return Err(ParseErrorKind::Truncated {
                need: min,
                have: self.0.len(),
            });
        }
        let take = self.0.len().min(size);
        let mut v = T::new_zeroed();
        v.as_mut_bytes()[..take].copy_from_slice(&self.0[..take]);
        self.0 = &self.0[take..];
        Ok(v)
    }

    fn name(&mut self) -> Result<&'a OsStr, ParseErrorKind> {
        let nul = self
            .0
            .iter()
            .position(|&b| b == 0)
            .ok_or(ParseErrorKind::UnterminatedName)?;
        let name = &self.0[..nul];
        self.0 = &self.0[nul + 1..];
        Ok(OsStr::from_bytes(name))
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], ParseErrorKind> {
        if self.0.len() < n {
            return Err(ParseErrorKind::Truncated {
                need: n,
                have: self.0.len(),
            });
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array(&mut self, count: u64, item: usize) -> Result<&'a [u8], ParseErrorKind> {
        let n = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(item))
            .filter(|&n| n <= self.0.len())
            .ok_or(ParseErrorKind::BadCount { count })?;
        self.bytes(n)
    }
}

fn parse_op(opcode: u32, body: &[u8], config: ParseConfig) -> Result<Operation<'_>, ParseErrorKind> {
    use Operation as O;
    let mut b = Body(body);
    Ok(match opcode {
        FUSE_LOOKUP => O::Lookup { name: b.name()? },
        FUSE_FORGET => O::Forget { arg: b.arg()? },
        FUSE_GETATTR => O::Getattr { arg: b.arg()? },
        FUSE_SETATTR => O::Setattr { arg: b.arg()? },
        FUSE_READLINK => O::Readlink,
        FUSE_SYMLINK => O::Symlink {
            name: b.name()?,
            target: b.name()?,
        },
        FUSE_MKNOD => O::Mknod {
            arg: b.arg()?,
            name: b.name()?,
        },
        FUSE_MKDIR => O::Mkdir {
            arg: b.arg()?,
            name: b.name()?,
        },
        FUSE_UNLINK => O::Unlink { name: b.name()? },
        FUSE_RMDIR => O::Rmdir { name: b.name()? },
        FUSE_RENAME => O::Rename {
            arg: b.arg()?,
            name: b.name()?,
            new_name: b.name()?,
        },
        FUSE_LINK => O::Link {
            arg: b.arg()?,
            name: b.name()?,
        },
        FUSE_OPEN => O::Open { arg: b.arg()? },
        FUSE_READ => O::Read { arg: b.arg()? },
        FUSE_WRITE => {
            let arg: fuse_write_in = b.arg()?;
            O::Write {
                arg,
                data: b.bytes(arg.size as usize)?,
            }
        }
        FUSE_STATFS => O::Statfs,
        FUSE_RELEASE => O::Release { arg: b.arg()? },
        FUSE_FSYNC => O::Fsync { arg: b.arg()? },
        FUSE_SETXATTR => {
            let arg: fuse_setxattr_in = if config.setxattr_ext {
                b.arg()?
            } else {
                let size: u32 = b.arg()?;
                let flags: u32 = b.arg()?;
                fuse_setxattr_in {
                    size,
                    flags,
                    ..Default::default()
                }
            };
            let name = b.name()?;
            O::Setxattr {
                arg,
                name,
                value: b.bytes(arg.size as usize)?,
            }
        }
        FUSE_GETXATTR => O::Getxattr {
            arg: b.arg()?,
            name: b.name()?,
        },
        FUSE_LISTXATTR => O::Listxattr { arg: b.arg()? },
        FUSE_REMOVEXATTR => O::Removexattr { name: b.name()? },
        FUSE_FLUSH => O::Flush { arg: b.arg()? },
        FUSE_INIT => O::Init {
            arg: b.arg_prefix(FUSE_COMPAT_INIT_IN_SIZE)?,
        },
        FUSE_OPENDIR => O::Opendir { arg: b.arg()? },
        FUSE_READDIR => O::Readdir { arg: b.arg()? },
        FUSE_RELEASEDIR => O::Releasedir { arg: b.arg()? },
        FUSE_FSYNCDIR => O::Fsyncdir { arg: b.arg()? },
        FUSE_GETLK => O::Getlk { arg: b.arg()? },
        FUSE_SETLK => O::Setlk { arg: b.arg()? },
        FUSE_SETLKW => O::Setlkw { arg: b.arg()? },
        FUSE_ACCESS => O::Access { arg: b.arg()? },
        FUSE_CREATE => O::Create {
            arg: b.arg()?,
            name: b.name()?,
        },
        FUSE_INTERRUPT => O::Interrupt { arg: b.arg()? },
        FUSE_BMAP => O::Bmap { arg: b.arg()? },
        FUSE_DESTROY => O::Destroy,
        FUSE_IOCTL => {
            let arg: fuse_ioctl_in = b.arg()?;
            O::Ioctl {
                arg,
                data: b.bytes(arg.in_size as usize)?,
            }
        }
        FUSE_POLL => O::Poll { arg: b.arg()? },
        FUSE_NOTIFY_REPLY => {
            let arg: fuse_notify_retrieve_in = b.arg()?;
            O::NotifyReply {
                arg,
                data: b.bytes(arg.size as usize)?,
            }
        }
        FUSE_BATCH_FORGET => {
            let arg: fuse_batch_forget_in = b.arg()?;
            let nodes = b.array(arg.count.into(), core::mem::size_of::<fuse_forget_one>())?;
            O::BatchForget {
                arg,
                nodes: ForgetList(nodes),
            }
        }
        FUSE_FALLOCATE => O::Fallocate { arg: b.arg()? },
        FUSE_READDIRPLUS => O::Readdirplus { arg: b.arg()? },
        FUSE_RENAME2 => O::Rename2 {
            arg: b.arg()?,
            name: b.name()?,
            new_name: b.name()?,
        },
        FUSE_LSEEK => O::Lseek { arg: b.arg()? },
        FUSE_COPY_FILE_RANGE => O::CopyFileRange { arg: b.arg()? },
        FUSE_SETUPMAPPING => O::SetupMapping { arg: b.arg()? },
        FUSE_REMOVEMAPPING => {
            let arg: fuse_removemapping_in = b.arg()?;
            let entries = b.array(arg.count.into(), core::mem::size_of::<fuse_removemapping_one>())?;
            O::RemoveMapping {
                arg,
                entries: RemoveMappingList(entries),
            }
        }
        FUSE_SYNCFS => O::Syncfs { arg: b.arg()? },
        FUSE_TMPFILE => O::Tmpfile {
            arg: b.arg()?,
            name: b.name()?,
        },
        FUSE_STATX => O::Statx { arg: b.arg()? },
        FUSE_COPY_FILE_RANGE_64 => O::CopyFileRange64 { arg: b.arg()? },
        CUSE_INIT => O::CuseInit { arg: b.arg()? },
        _ => return Err(ParseErrorKind::UnknownOpcode),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    fn msg(opcode: u32, body: &[u8]) -> Vec<u8> {
        let h = fuse_in_header {
            len: (40 + body.len()) as u32,
            opcode,
            unique: 7,
            nodeid: 1,
            ..Default::default()
        };
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn lookup_name_without_nul() {
        let m = msg(FUSE_LOOKUP, b"hello\0");
        let r = parse(&m).unwrap();
        assert_eq!(r.unique(), 7);
        match r.op {
            Operation::Lookup { name } => assert_eq!(name, "hello"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn write_data_is_borrowed_and_checked() {
        let arg = fuse_write_in {
            size: 4,
            offset: 10,
            ..Default::default()
        };
        let mut body = arg.as_bytes().to_vec();
        body.extend_from_slice(b"abcd");
        let m = msg(FUSE_WRITE, &body);
        match parse(&m).unwrap().op {
            Operation::Write { arg, data } => {
                assert_eq!(arg.offset, 10);
                assert_eq!(data, b"abcd");
            }
            other => panic!("{other:?}"),
        }
        let short = msg(FUSE_WRITE, &body[..body.len() - 1]);
        let e = parse(&short).unwrap_err();
        assert_eq!(e.header().unwrap().unique, 7);
        assert_eq!(e.kind, ParseErrorKind::Truncated { need: 4, have: 3 });
    }

    #[test]
    fn rename_two_names_and_errors() {
        let mut body = fuse_rename_in { newdir: 5 }.as_bytes().to_vec();
        body.extend_from_slice(b"a\0bb\0");
        match parse(&msg(FUSE_RENAME, &body)).unwrap().op {
            Operation::Rename { arg, name, new_name } => {
                assert_eq!(
                    (arg.newdir, name.as_bytes(), new_name.as_bytes()),
                    (5, &b"a"[..], &b"bb"[..])
                );
            }
            other => panic!("{other:?}"),
        }
        body.pop();
        let e = parse(&msg(FUSE_RENAME, &body)).unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::UnterminatedName);
    }

    #[test]
    fn header_errors() {
        assert_eq!(
            parse(&[0u8; 39]).unwrap_err().kind,
            ParseErrorKind::ShortHeader { have: 39 }
        );
        let mut m = msg(FUSE_STATFS, &[]);
        m.push(0);
        assert!(matches!(
            parse(&m).unwrap_err().kind,
            ParseErrorKind::LengthMismatch { .. }
        ));
        let m = msg(999, &[]);
        assert_eq!(parse(&m).unwrap_err().kind, ParseErrorKind::UnknownOpcode);
        let mut m = msg(FUSE_STATFS, &[]);
        m[36] = 1; // total_extlen = 1: 8 bytes of extensions in an empty body
        assert!(matches!(
            parse(&m).unwrap_err().kind,
            ParseErrorKind::BadExtensions { .. }
        ));
    }

    #[test]
    fn init_accepts_the_short_form() {
        let arg = fuse_init_in {
            major: 7,
            minor: 31,
            max_readahead: 4096,
            flags: 1,
            ..Default::default()
        };
        let m = msg(FUSE_INIT, &arg.as_bytes()[..16]);
        match parse(&m).unwrap().op {
            Operation::Init { arg: got } => assert_eq!(got, arg),
            other => panic!("{other:?}"),
        }
        assert!(parse(&msg(FUSE_INIT, &arg.as_bytes()[..15])).is_err());
    }

    #[test]
    fn batch_forget_count_is_checked() {
        let mut body = fuse_batch_forget_in { count: 2, dummy: 0 }.as_bytes().to_vec();
        body.extend_from_slice(fuse_forget_one { nodeid: 3, nlookup: 1 }.as_bytes());
        assert_eq!(
            parse(&msg(FUSE_BATCH_FORGET, &body)).unwrap_err().kind,
            ParseErrorKind::BadCount { count: 2 }
        );
        body.extend_from_slice(fuse_forget_one { nodeid: 4, nlookup: 2 }.as_bytes());
        match parse(&msg(FUSE_BATCH_FORGET, &body)).unwrap().op {
            Operation::BatchForget { nodes, .. } => {
                let v: Vec<_> = nodes.iter().map(|f| (f.nodeid, f.nlookup)).collect();
                assert_eq!(v, [(3, 1), (4, 2)]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn setxattr_both_layouts() {
        let mut body = Vec::new();
        body.extend_from_slice(&3u32.to_ne_bytes());
        body.extend_from_slice(&1u32.to_ne_bytes());
        body.extend_from_slice(b"user.a\0xyz");
        match parse(&msg(FUSE_SETXATTR, &body)).unwrap().op {
            Operation::Setxattr { arg, name, value } => {
                assert_eq!(
                    (arg.size, arg.flags, name.as_bytes(), value),
                    (3, 1, &b"user.a"[..], &b"xyz"[..])
                );
            }
            other => panic!("{other:?}"),
        }
        let ext = ParseConfig { setxattr_ext: true };
        let arg = fuse_setxattr_in {
            size: 3,
            flags: 1,
            setxattr_flags: 1,
            padding: 0,
        };
        let mut body = arg.as_bytes().to_vec();
        body.extend_from_slice(b"user.a\0xyz");
        match parse_with(&msg(FUSE_SETXATTR, &body), ext).unwrap().op {
            Operation::Setxattr { arg: got, value, .. } => assert_eq!((got, value), (arg, &b"xyz"[..])),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_known_opcode_rejects_every_short_body_without_panic() {
        for info in OPCODES {
            let full = [0xffu8; 200];
            for cut in 0..full.len() {
                let _ = parse(&msg(info.opcode, &full[..cut]));
            }
            if info.arg_size > 0 {
                let e = parse(&msg(info.opcode, &full[..info.arg_size - 1])).unwrap_err();
                assert!(matches!(e.kind, ParseErrorKind::Truncated { .. }), "{}: {e}", info.name);
            }
        }
    }
}
