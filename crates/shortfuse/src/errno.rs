//! One error type for every file-system call: a positive `errno` value.

use std::fmt;
use std::num::NonZeroI32;

/// A non-zero, positive `errno` value. Only the dispatcher turns it into a
/// reply (`fuse_out_header.error = -errno`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(NonZeroI32);

macro_rules! errnos {
    ($($name:ident),* $(,)?) => {
        impl Errno {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Errno = Errno(match NonZeroI32::new(libc::$name) {
                    Some(v) => v,
                    None => panic!("zero errno"),
                });
            )*
        }
    };
}

errnos!(
    EPERM,
    ENOENT,
    EIO,
    ENXIO,
    E2BIG,
    EBADF,
    EAGAIN,
    ENOMEM,
    EACCES,
    EFAULT,
    EBUSY,
    EEXIST,
    EXDEV,
    ENODEV,
    ENOTDIR,
    EISDIR,
    EINVAL,
    ENFILE,
    EMFILE,
    ETXTBSY,
    EFBIG,
    ENOSPC,
    ESPIPE,
    EROFS,
    EMLINK,
    ERANGE,
    ENAMETOOLONG,
    ENOSYS,
    ENOTEMPTY,
    ELOOP,
    ENODATA,
    EOVERFLOW,
    EOPNOTSUPP,
    ENOTCONN,
    ETIMEDOUT,
    EINTR,
    ENOTSUP,
    EDEADLK,
    ENOLCK,
    ESTALE,
    EPROTO,
    ECONNREFUSED,
);

impl Errno {
    /// Wraps a raw errno; zero or negative values become `EIO` so that a
    /// buggy caller can never produce a "success" error.
    pub fn from_raw(raw: i32) -> Errno {
        match NonZeroI32::new(raw) {
            Some(v) if raw > 0 => Errno(v),
            _ => Errno::EIO,
        }
    }

    /// The calling thread's `errno` after a failed libc call.
    pub fn last() -> Errno {
        Errno::from_raw(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }

    /// The positive errno value.
    pub fn raw(self) -> i32 {
        self.0.get()
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Errno {
        Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.raw())
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Errno({}: {})",
            self.raw(),
            std::io::Error::from_raw_os_error(self.raw())
        )
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&std::io::Error::from_raw_os_error(self.raw()), f)
    }
}

impl std::error::Error for Errno {}

/// Result of every file-system call.
pub type Result<T> = std::result::Result<T, Errno>;
