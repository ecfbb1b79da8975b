//! Extended attributes of mount files: getxattr, listxattr, setxattr and
//! removexattr in their path, `l` (no final symlink) and `f` forms, sent to
//! the file system as GETXATTR, LISTXATTR, SETXATTR and REMOVEXATTR after the
//! checks the kernel makes first. ENOSYS from the file system reads as
//! EOPNOTSUPP, as the kernel reports it.
#![allow(unsafe_code)] // the program's memory, through `user`

use std::sync::Arc;

use shortfuse::{Errno, FileType, NodeId};
use shortfuse_vfs::{Vfs, XattrOut};

use super::reply::err;
use super::resolve::{file, lookup_follow, ours};
use super::table::{Ptr, Regs, XattrOn, XattrOp};
use crate::user;

/// The kernel's XATTR_SIZE_MAX and XATTR_NAME_MAX.
const SIZE_MAX: usize = 65536;
const NAME_MAX: usize = 255;

fn unsupported(e: Errno) -> Errno {
    if e == Errno::ENOSYS {
        Errno::EOPNOTSUPP
    } else {
        e
    }
}

/// An xattr call the kernel serves beneath a namespace map (on the
/// backing file's own descriptor, or by path on the directory holding
/// it): `None`, but for a name or value in page 0, which the kernel would
/// read from the trampoline: EFAULT, as natively.
pub(crate) fn reads_page_zero(op: XattrOp) -> Option<i64> {
    let low = |p: super::table::Ptr| (p.0 as u64) < crate::zpoline::PAGE as u64;
    let reads_page_zero = match op {
        XattrOp::Get { name, .. } | XattrOp::Remove { name } => low(name),
        XattrOp::Set { name, value, size, .. } => low(name) || (size > 0 && low(value)),
        // The kernel writes the list: page 0 is not writable.
        XattrOp::List { .. } => false,
    };
    reads_page_zero.then(|| err(Errno::EFAULT))
}

/// Serves one xattr call; `None` when the path or descriptor is not ours.
pub fn call(regs: Regs, on: XattrOn, op: XattrOp) -> Option<i64> {
    let (vfs, node, kind) = match on {
        XattrOn::Fd(fd) => {
            let f = file(fd)?;
            if f.beneath_map() {
                return reads_page_zero(op);
            }
            (f.vfs().clone(), f.node(), f.file_type())
        }
        XattrOn::Path { at, follow } => {
            let (vfs, t) = ours!(lookup_follow(regs, at, follow));
            match t.node {
                Some((node, attr)) => (vfs, node, attr.file_type()),
                None => return Some(err(Errno::ENOENT)),
            }
        }
    };
    // As the kernel's xattr_permission: user.* only on regular files and
    // directories (elsewhere the permission bits mean something else).
    let user_elsewhere = |name: Ptr| {
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        unsafe { user::cstr(name.0) }.is_ok_and(|n| n.starts_with(b"user."))
            && !matches!(kind, FileType::Regular | FileType::Directory)
    };
    Some(match op {
        XattrOp::Get { name, .. } if user_elsewhere(name) => err(Errno::ENODATA),
        XattrOp::Set { name, .. } | XattrOp::Remove { name } if user_elsewhere(name) => err(Errno::EPERM),
        XattrOp::Get { name, value, size } => {
            let name = match checked_name(name) {
                Ok(n) => n,
                Err(e) => return Some(err(e)),
            };
            get(&vfs, node, name, false, value, size)
        }
        XattrOp::List { list, size } => get(&vfs, node, b"", true, list, size),
        XattrOp::Set {
            name,
            value,
            size,
            flags,
        } => {
            let name = match checked_name(name) {
                Ok(n) => n,
                Err(e) => return Some(err(e)),
            };
            if size > SIZE_MAX {
                return Some(err(Errno::E2BIG));
            }
            if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
                return Some(err(Errno::EINVAL));
            }
            if vfs.is_read_only() {
                return Some(err(Errno::EROFS));
            }
            // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
            let value = match unsafe { user::slice(value.0, size) } {
                Ok(v) => v,
                Err(e) => return Some(err(e)),
            };
            let r = vfs.client().setxattr(node, name, value, flags);
            vfs.invalidate_attr(node);
            match r {
                Ok(()) => 0,
                Err(e) => err(unsupported(e)),
            }
        }
        XattrOp::Remove { name } => {
            let name = match checked_name(name) {
                Ok(n) => n,
                Err(e) => return Some(err(e)),
            };
            if vfs.is_read_only() {
                return Some(err(Errno::EROFS));
            }
            let r = vfs.client().removexattr(node, name);
            vfs.invalidate_attr(node);
            match r {
                Ok(()) => 0,
                Err(e) => err(unsupported(e)),
            }
        }
    })
}

/// The attribute name, unless the kernel would refuse it (empty or longer
/// than XATTR_NAME_MAX: ERANGE; a bad pointer: EFAULT).
fn checked_name<'a>(p: Ptr) -> Result<&'a [u8], Errno> {
    // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
    match unsafe { user::cstr_max(p.0, NAME_MAX + 1) } {
        Ok(n) if !n.is_empty() => Ok(n),
        Err(e) if e == Errno::EFAULT => Err(e),
        _ => Err(Errno::ERANGE),
    }
}

/// GETXATTR/LISTXATTR into the caller's buffer (`size` 0: the size needed).
fn get(vfs: &Arc<Vfs>, node: NodeId, name: &[u8], list: bool, buf: Ptr, size: i64) -> i64 {
    let size = (size.max(0) as usize).min(SIZE_MAX);
    match vfs.client().xattr_get(node, name, list, size as u32) {
        Ok(XattrOut::Size(n)) => i64::from(n),
        Ok(XattrOut::Data(d)) if d.len() > size => err(Errno::ERANGE),
        // SAFETY: a pointer argument of the call, into the program's memory, used during the call only.
        Ok(XattrOut::Data(d)) => match unsafe { user::slice_mut(buf.0, d.len()) } {
            Ok(out) => {
                out.copy_from_slice(&d);
                d.len() as i64
            }
            Err(e) => err(e),
        },
        Err(e) => err(unsupported(e)),
    }
}
