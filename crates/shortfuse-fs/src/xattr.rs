//! Extended attributes of one inode, with ext4's answers: the namespaces
//! it stores, `XATTR_CREATE`/`XATTR_REPLACE`, the order of listing.
//! Shared by `mem` and by `pack`/`stripe`; the permission checks (who may
//! read or write `user.*`) stay with the file system.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use shortfuse::{Errno, Result, XattrFlags};

/// The longest name, namespace prefix included (`XATTR_NAME_MAX`).
const NAME_MAX: usize = 255;
/// Largest value the VFS lets through (`XATTR_SIZE_MAX`).
const SIZE_MAX: usize = 65536;

/// Name and value pairs in the order they were first set, as ext4 lists
/// its in-inode attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Xattrs(pub Vec<(OsString, Vec<u8>)>);

/// Which namespaces ext4 stores; anything else is EOPNOTSUPP.
pub fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > NAME_MAX {
        return Err(Errno::ERANGE);
    }
    let suffix = ["user.", "trusted.", "security."]
        .iter()
        .find_map(|p| b.strip_prefix(p.as_bytes()))
        .ok_or(Errno::EOPNOTSUPP)?;
    if suffix.is_empty() {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// Whether `name` is in the `user.` namespace, whose access follows the
/// file's permission bits.
pub fn is_user(name: &OsStr) -> bool {
    name.as_bytes().starts_with(b"user.")
}

impl Xattrs {
    /// `setxattr(2)` with its `XATTR_CREATE`/`XATTR_REPLACE` flags.
    pub fn set(&mut self, name: &OsStr, value: &[u8], flags: XattrFlags) -> Result<()> {
        check_name(name)?;
        if value.len() > SIZE_MAX {
            return Err(Errno::E2BIG);
        }
        match self.0.iter().position(|(n, _)| n == name) {
            Some(_) if flags.contains(XattrFlags::CREATE) => Err(Errno::EEXIST),
            None if flags.contains(XattrFlags::REPLACE) => Err(Errno::ENODATA),
            Some(i) => {
                self.0[i].1 = value.to_vec();
                Ok(())
            }
            None => {
                self.0.push((name.to_owned(), value.to_vec()));
                Ok(())
            }
        }
    }

    pub fn get(&self, name: &OsStr) -> Result<Vec<u8>> {
        check_name(name)?;
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or(Errno::ENODATA)
    }

    /// Names, each followed by a NUL, as `listxattr(2)` returns them.
    pub fn list(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, _) in &self.0 {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
        }
        out
    }

    pub fn remove(&mut self, name: &OsStr) -> Result<()> {
        check_name(name)?;
        let i = self.0.iter().position(|(n, _)| n == name).ok_or(Errno::ENODATA)?;
        self.0.remove(i);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_namespaces_and_order_as_ext4() {
        let mut x = Xattrs::default();
        let n = |s: &str| OsString::from(s);
        assert_eq!(x.set(&n("user.b"), b"1", XattrFlags::empty()), Ok(()));
        assert_eq!(x.set(&n("user.a"), b"", XattrFlags::CREATE), Ok(()));
        assert_eq!(x.set(&n("user.a"), b"2", XattrFlags::CREATE), Err(Errno::EEXIST));
        assert_eq!(x.set(&n("user.c"), b"2", XattrFlags::REPLACE), Err(Errno::ENODATA));
        assert_eq!(x.set(&n("bogus.c"), b"2", XattrFlags::empty()), Err(Errno::EOPNOTSUPP));
        assert_eq!(x.set(&n("user."), b"2", XattrFlags::empty()), Err(Errno::EINVAL));
        assert_eq!(
            x.set(&n("user.big"), &vec![0; SIZE_MAX + 1], XattrFlags::empty()),
            Err(Errno::E2BIG)
        );
        assert_eq!(x.list(), b"user.b\0user.a\0");
        assert_eq!(x.get(&n("user.a")), Ok(Vec::new()));
        assert_eq!(x.remove(&n("user.b")), Ok(()));
        assert_eq!(x.remove(&n("user.b")), Err(Errno::ENODATA));
        assert_eq!(x.get(&n("user.b")), Err(Errno::ENODATA));
    }
}
