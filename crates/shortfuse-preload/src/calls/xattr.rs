//! Extended attributes of mount files: getxattr, listxattr, setxattr and
//! removexattr in their path, `l` (no final symlink) and `f` forms, sent to
//! the file system as GETXATTR, LISTXATTR, SETXATTR and REMOVEXATTR after the
//! checks the kernel makes first. ENOSYS from the file system reads as
//! EOPNOTSUPP, as the kernel reports it.

use std::sync::Arc;

use shortfuse::{Errno, FileType, NodeId};
use shortfuse_vfs::{Vfs, XattrOut};

use super::{err, file, reissue, resolve, Resolved, AT_FDCWD};
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

/// Serves one xattr call; `None` when the path or descriptor is not ours.
pub fn call(nr: i64, a: [i64; 6]) -> Option<i64> {
    let (vfs, node, kind) = match nr {
        libc::SYS_fgetxattr | libc::SYS_flistxattr | libc::SYS_fsetxattr | libc::SYS_fremovexattr => {
            let f = file(a[0])?;
            (f.vfs().clone(), f.node(), f.file_type())
        }
        _ => {
            let follow = matches!(
                nr,
                libc::SYS_getxattr | libc::SYS_listxattr | libc::SYS_setxattr | libc::SYS_removexattr
            );
            let path = match user::cstr(a[0]) {
                Ok(p) => p,
                Err(e) => return Some(err(e)),
            };
            match resolve(AT_FDCWD, path, follow) {
                Err(e) => return Some(err(e)),
                Ok(Resolved::Kernel(None)) => return None,
                Ok(Resolved::Kernel(Some(p))) => return Some(reissue(nr, a, 0, false, &p)),
                Ok(Resolved::Ours(vfs, t)) => match t.node {
                    Some((node, attr)) => (vfs, node, attr.file_type()),
                    None => return Some(err(Errno::ENOENT)),
                },
            }
        }
    };
    // As the kernel's xattr_permission: user.* only on regular files and
    // directories (elsewhere the permission bits mean something else).
    let user_elsewhere = user::cstr(a[1]).is_ok_and(|n| n.starts_with(b"user."))
        && !matches!(kind, FileType::Regular | FileType::Directory);
    if user_elsewhere && !matches!(nr, libc::SYS_listxattr | libc::SYS_llistxattr | libc::SYS_flistxattr) {
        let getting = matches!(nr, libc::SYS_getxattr | libc::SYS_lgetxattr | libc::SYS_fgetxattr);
        return Some(err(if getting { Errno::ENODATA } else { Errno::EPERM }));
    }
    Some(match nr {
        libc::SYS_getxattr | libc::SYS_lgetxattr | libc::SYS_fgetxattr => {
            let name = match checked_name(a[1]) {
                Ok(n) => n,
                Err(e) => return Some(err(e)),
            };
            get(&vfs, node, name, false, a[2], a[3])
        }
        libc::SYS_listxattr | libc::SYS_llistxattr | libc::SYS_flistxattr => get(&vfs, node, b"", true, a[1], a[2]),
        libc::SYS_setxattr | libc::SYS_lsetxattr | libc::SYS_fsetxattr => {
            let name = match checked_name(a[1]) {
                Ok(n) => n,
                Err(e) => return Some(err(e)),
            };
            let (size, flags) = (a[3] as usize, a[4] as i32);
            if size > SIZE_MAX {
                return Some(err(Errno::E2BIG));
            }
            if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
                return Some(err(Errno::EINVAL));
            }
            if vfs.is_read_only() {
                return Some(err(Errno::EROFS));
            }
            let value = match user::slice(a[2], size) {
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
        _ => {
            let name = match checked_name(a[1]) {
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
fn checked_name<'a>(p: i64) -> Result<&'a [u8], Errno> {
    match user::cstr_max(p, NAME_MAX + 1) {
        Ok(n) if !n.is_empty() => Ok(n),
        Err(e) if e == Errno::EFAULT => Err(e),
        _ => Err(Errno::ERANGE),
    }
}

/// GETXATTR/LISTXATTR into the caller's buffer (`size` 0: the size needed).
fn get(vfs: &Arc<Vfs>, node: NodeId, name: &[u8], list: bool, buf: i64, size: i64) -> i64 {
    let size = (size.max(0) as usize).min(SIZE_MAX);
    match vfs.client().xattr_get(node, name, list, size as u32) {
        Ok(XattrOut::Size(n)) => i64::from(n),
        Ok(XattrOut::Data(d)) if d.len() > size => err(Errno::ERANGE),
        Ok(XattrOut::Data(d)) => match user::slice_mut(buf, d.len()) {
            Ok(out) => {
                out.copy_from_slice(&d);
                d.len() as i64
            }
            Err(e) => err(e),
        },
        Err(e) => err(unsupported(e)),
    }
}
