//! Where an open file's data lives, so that data I/O can skip the daemon
//! (DeFUSE, IEEE Access 2019). A map covers the file with up to
//! [`DataMap::MAX_EXTENTS`] extents, each a range of one backing file.
//!
//! The three patterns of DeFUSE:
//! - 1-to-1: one extent `[0, ∞)` at backing offset 0 ([`DataMap::whole`]);
//!   kernel sessions turn it into kernel passthrough.
//! - 1-to-M: a file split over several backing files, one extent per range.
//! - M-to-1: many files packed into one backing file, each file's map one
//!   (or a few) ranges of the container.
//!
//! # What a valid map states
//!
//! Extents are listed in file order: the first starts at file offset 0 and
//! each next one starts where the previous one ends, so a map has neither
//! holes nor overlaps by construction of its list (see
//! [`DataMap::validate`]). The map therefore also states how far the file
//! may reach:
//! - if the last extent has `len == u64::MAX` ("to the end of the file,
//!   whatever its size"), the file may grow without bound into that
//!   extent's backing file;
//! - otherwise the file may hold at most the sum of the extent lengths, and
//!   [`DataMap::write_at`] refuses bytes beyond it with `EFBIG` (the file
//!   system must then grow the file itself and hand out a new map).
//! - An empty map (no extents) is an empty file that cannot grow.
//!
//! The file's current size is where the data runs out: a backing file that
//! ends inside its extent ends the file there. [`DataMap::write_at`] keeps
//! that true: before it writes into an extent, it extends the backing files
//! of the extents before it to their full length (zeros), so a write far
//! into the file leaves a readable hole rather than an early end.
//!
//! Maps are plain values (shared descriptors and offsets) so that the
//! daemon, the kernel sessions and the preload shim can all use them.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::errno::Errno;

/// A backing file shared by the extents that point into it.
pub type BackingFile = Arc<OwnedFd>;

/// One range of the file mapped onto a range of a backing file.
#[derive(Clone, Debug)]
pub struct Extent {
    /// The file the bytes live in.
    pub backing: BackingFile,
    /// Where the extent starts in the mapped file.
    pub file_offset: u64,
    /// Where the extent starts in the backing file.
    pub backing_offset: u64,
    /// Length in bytes; `u64::MAX` for "to the end of the file, whatever
    /// its size" (allowed on the last extent only).
    pub len: u64,
}

impl Extent {
    /// Whether this extent runs to the end of the file, whatever its size.
    pub fn open_ended(&self) -> bool {
        self.len == u64::MAX
    }

    /// First file offset past this extent (`u64::MAX` when open-ended).
    pub fn file_end(&self) -> u64 {
        if self.open_ended() {
            u64::MAX
        } else {
            self.file_offset.saturating_add(self.len)
        }
    }

    /// Bytes of this extent from file offset `off` on (which must lie in it).
    fn remaining_from(&self, off: u64) -> u64 {
        self.file_end() - off
    }
}

/// A file-to-file data map. See the module docs for what a valid map means.
#[derive(Clone, Debug, Default)]
pub struct DataMap {
    /// The extents, in file order, without holes or overlaps.
    pub extents: Vec<Extent>,
}

/// Why [`DataMap::validate`] refused a map. `index` is the extent's position
/// in [`DataMap::extents`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvalidMap {
    /// More than [`DataMap::MAX_EXTENTS`] extents.
    TooManyExtents {
        /// How many the map had.
        count: usize,
    },
    /// An extent of length 0.
    EmptyExtent {
        /// The extent.
        index: usize,
    },
    /// An extent starts after the previous one ends (or the first one
    /// after 0): the bytes in between belong to no backing file.
    Hole {
        /// The extent.
        index: usize,
        /// Where it should start.
        expected: u64,
        /// Where it starts.
        found: u64,
    },
    /// An extent starts before the previous one ends.
    Overlap {
        /// The extent.
        index: usize,
        /// Where it should start.
        expected: u64,
        /// Where it starts.
        found: u64,
    },
    /// An open-ended extent (`len == u64::MAX`) that is not the last one.
    OpenEndedNotLast {
        /// The extent.
        index: usize,
    },
    /// `file_offset + len` or `backing_offset + len` does not fit in an
    /// `i64` file offset.
    OutOfRange {
        /// The extent.
        index: usize,
    },
    /// The backing descriptor is not a regular file (`st_mode` given).
    NotRegular {
        /// The extent.
        index: usize,
        /// The backing file's `st_mode`.
        mode: u32,
    },
    /// `fstat` on the backing descriptor failed.
    Stat {
        /// The extent.
        index: usize,
        /// Why `fstat` failed.
        errno: Errno,
    },
}

impl fmt::Display for InvalidMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            InvalidMap::TooManyExtents { count } => {
                write!(f, "{count} extents, at most {} allowed", DataMap::MAX_EXTENTS)
            }
            InvalidMap::EmptyExtent { index } => write!(f, "extent {index} has length 0"),
            InvalidMap::Hole { index, expected, found } => write!(
                f,
                "hole before extent {index}: it starts at file offset {found}, the file is covered up to {expected}"
            ),
            InvalidMap::Overlap { index, expected, found } => write!(
                f,
                "extent {index} overlaps the one before: it starts at file offset {found}, before {expected}"
            ),
            InvalidMap::OpenEndedNotLast { index } => {
                write!(
                    f,
                    "extent {index} runs to end of file (len u64::MAX) but is not the last"
                )
            }
            InvalidMap::OutOfRange { index } => write!(f, "extent {index} reaches past the largest file offset"),
            InvalidMap::NotRegular { index, mode } => {
                write!(
                    f,
                    "backing file of extent {index} is not a regular file (mode {mode:#o})"
                )
            }
            InvalidMap::Stat { index, errno } => write!(f, "fstat of the backing file of extent {index}: {errno}"),
        }
    }
}

impl std::error::Error for InvalidMap {}

impl From<InvalidMap> for Errno {
    fn from(_: InvalidMap) -> Errno {
        Errno::EINVAL
    }
}

/// Largest file offset the kernel accepts (`loff_t` is signed).
const MAX_OFFSET: u64 = i64::MAX as u64;

impl DataMap {
    /// Most extents one map may carry.
    pub const MAX_EXTENTS: usize = 16;

    /// The 1-to-1 map: the whole file is the backing file.
    pub fn whole(backing: BackingFile) -> DataMap {
        DataMap {
            extents: vec![Extent {
                backing,
                file_offset: 0,
                backing_offset: 0,
                len: u64::MAX,
            }],
        }
    }

    /// The backing file when this map is the 1-to-1 case.
    pub fn as_whole(&self) -> Option<&BackingFile> {
        match self.extents.as_slice() {
            [e] if e.file_offset == 0 && e.backing_offset == 0 && e.len == u64::MAX => Some(&e.backing),
            _ => None,
        }
    }

    /// Bytes the map can hold: the end of its last extent (`u64::MAX` when
    /// the last extent is open-ended, 0 for an empty map).
    pub fn limit(&self) -> u64 {
        self.extents.last().map_or(0, Extent::file_end)
    }

    /// Checks the rules of the module docs, then `fstat`s every backing
    /// descriptor (each distinct one once) to check it is a regular file.
    pub fn validate(&self) -> Result<(), InvalidMap> {
        self.validate_stat().map(drop)
    }

    /// [`DataMap::validate`], which returns the status of the first
    /// backing file that the check reads anyway (`None` for an empty map):
    /// an open that needs the size or times of a whole map's file then
    /// makes no second system call for them.
    pub fn validate_stat(&self) -> Result<Option<libc::stat>, InvalidMap> {
        self.validate_layout()?;
        let mut first = None;
        for (index, e) in self.extents.iter().enumerate() {
            let seen = self.extents[..index]
                .iter()
                .any(|p| Arc::ptr_eq(&p.backing, &e.backing));
            if seen {
                continue;
            }
            let st = sys::fstat(e.backing.as_fd()).map_err(|errno| InvalidMap::Stat { index, errno })?;
            let mode = st.st_mode;
            if mode & libc::S_IFMT != libc::S_IFREG {
                return Err(InvalidMap::NotRegular { index, mode });
            }
            first.get_or_insert(st);
        }
        Ok(first)
    }

    /// The checks of [`DataMap::validate`] that need no system call.
    pub fn validate_layout(&self) -> Result<(), InvalidMap> {
        if self.extents.len() > Self::MAX_EXTENTS {
            return Err(InvalidMap::TooManyExtents {
                count: self.extents.len(),
            });
        }
        let mut covered = 0u64;
        let last = self.extents.len().saturating_sub(1);
        for (index, e) in self.extents.iter().enumerate() {
            if e.len == 0 {
                return Err(InvalidMap::EmptyExtent { index });
            }
            if e.file_offset > covered {
                return Err(InvalidMap::Hole {
                    index,
                    expected: covered,
                    found: e.file_offset,
                });
            }
            if e.file_offset < covered {
                return Err(InvalidMap::Overlap {
                    index,
                    expected: covered,
                    found: e.file_offset,
                });
            }
            if e.open_ended() {
                if index != last {
                    return Err(InvalidMap::OpenEndedNotLast { index });
                }
                if e.file_offset > MAX_OFFSET || e.backing_offset > MAX_OFFSET {
                    return Err(InvalidMap::OutOfRange { index });
                }
            } else {
                let fits = |start: u64| start.checked_add(e.len).is_some_and(|end| end <= MAX_OFFSET);
                if !fits(e.file_offset) || !fits(e.backing_offset) {
                    return Err(InvalidMap::OutOfRange { index });
                }
            }
            covered = e.file_end();
        }
        Ok(())
    }

    /// The extent holding file offset `off` and its index.
    fn find(&self, off: u64) -> Option<(usize, &Extent)> {
        // Extents are in file order and at most 16: a linear scan beats a
        // binary search at this size.
        self.extents
            .iter()
            .enumerate()
            .find(|(_, e)| off >= e.file_offset && off < e.file_end())
    }

    /// `pread` through the map: reads up to `buf.len()` bytes of the file at
    /// `off`, crossing extents as needed. Returns fewer bytes only at the
    /// end of the file (end of the map, or a backing file that ends inside
    /// its extent). The map is assumed valid.
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off.saturating_add(done as u64);
            let Some((_, e)) = self.find(pos) else { break };
            let want = (buf.len() - done).min(usize::try_from(e.remaining_from(pos)).unwrap_or(usize::MAX));
            let at = e.backing_offset + (pos - e.file_offset);
            let got = pread_full(e.backing.as_fd(), &mut buf[done..done + want], at)?;
            done += got;
            if got < want {
                break;
            }
        }
        Ok(done)
    }

    /// `pwrite` through the map: writes all of `data` at file offset `off`,
    /// crossing extents as needed, after extending the backing files of
    /// earlier extents to their full length (see the module docs).
    ///
    /// Bytes past the end of a map whose last extent is not open-ended
    /// cannot be placed: if the first byte is already past it the call
    /// fails with `EFBIG`, otherwise it returns the bytes that fit.
    pub fn write_at(&self, off: u64, data: &[u8]) -> io::Result<usize> {
        let mut done = 0usize;
        while done < data.len() {
            let pos = off.saturating_add(done as u64);
            let Some((index, e)) = self.find(pos) else {
                if done == 0 {
                    return Err(Errno::EFBIG.into());
                }
                break;
            };
            if done == 0 {
                self.fill_before(index)?;
            }
            let want = (data.len() - done).min(usize::try_from(e.remaining_from(pos)).unwrap_or(usize::MAX));
            let at = e.backing_offset + (pos - e.file_offset);
            pwrite_full(e.backing.as_fd(), &data[done..done + want], at)?;
            done += want;
        }
        Ok(done)
    }

    /// Extends the backing files of extents `..index` so that each covers
    /// its whole extent; stops at the first one that already does (the
    /// ones before it do too, since every write goes through here first).
    fn fill_before(&self, index: usize) -> io::Result<()> {
        for e in self.extents[..index].iter().rev() {
            let end = e.backing_offset + e.len;
            let size = sys::fstat_size(e.backing.as_fd()).map_err(io::Error::from)?;
            if size >= end {
                break;
            }
            sys::ftruncate(e.backing.as_fd(), end).map_err(io::Error::from)?;
        }
        Ok(())
    }
}

/// `pread` until `buf` is full or the file ends; retries on EINTR.
fn pread_full(fd: BorrowedFd<'_>, buf: &mut [u8], mut at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match sys::pread(fd, &mut buf[done..], at) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                at += n as u64;
            }
            Err(e) if e == Errno::EINTR => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// `pwrite` until all of `data` is written; retries on EINTR.
fn pwrite_full(fd: BorrowedFd<'_>, data: &[u8], mut at: u64) -> io::Result<()> {
    let mut done = 0;
    while done < data.len() {
        match sys::pwrite(fd, &data[done..], at) {
            Ok(0) => return Err(Errno::EIO.into()),
            Ok(n) => {
                done += n;
                at += n as u64;
            }
            Err(e) if e == Errno::EINTR => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The system calls of this module; every `unsafe` block of it lives here.
mod sys {
    use super::*;

    pub fn fstat(fd: BorrowedFd<'_>) -> Result<libc::stat, Errno> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `fd` is open for the call and `st` is writable memory of
        // the size fstat fills.
        let ret = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
        if ret < 0 {
            return Err(Errno::last());
        }
        // SAFETY: fstat succeeded, so it initialised the whole struct.
        Ok(unsafe { st.assume_init() })
    }

    pub fn fstat_size(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
        fstat(fd).map(|st| st.st_size as u64)
    }

    pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> Result<(), Errno> {
        let len = libc::off_t::try_from(len).map_err(|_| Errno::EFBIG)?;
        // SAFETY: `fd` is open for the call; no memory is passed.
        let ret = unsafe { libc::ftruncate(fd.as_raw_fd(), len) };
        if ret < 0 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    }

    pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], at: u64) -> Result<usize, Errno> {
        let at = libc::off_t::try_from(at).map_err(|_| Errno::EINVAL)?;
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the
        // call and `fd` is open.
        let ret = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), at) };
        if ret < 0 {
            Err(Errno::last())
        } else {
            Ok(ret as usize)
        }
    }

    pub fn pwrite(fd: BorrowedFd<'_>, data: &[u8], at: u64) -> Result<usize, Errno> {
        let at = libc::off_t::try_from(at).map_err(|_| Errno::EFBIG)?;
        // SAFETY: `data` is valid for reads of `data.len()` bytes for the
        // call and `fd` is open.
        let ret = unsafe { libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), at) };
        if ret < 0 {
            Err(Errno::last())
        } else {
            Ok(ret as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::FileExt;

    fn temp(name: &str, content: &[u8]) -> (BackingFile, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("shortfuse-datamap-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        std::fs::write(&dir, content).unwrap();
        let f = OpenOptions::new().read(true).write(true).open(&dir).unwrap();
        (Arc::new(OwnedFd::from(f)), dir)
    }

    fn ext(backing: &BackingFile, file_offset: u64, backing_offset: u64, len: u64) -> Extent {
        Extent {
            backing: backing.clone(),
            file_offset,
            backing_offset,
            len,
        }
    }

    #[test]
    fn layout_rules() {
        let (b, p) = temp("layout", b"");
        let map = |extents: Vec<Extent>| DataMap { extents };
        assert_eq!(map(vec![]).validate(), Ok(()));
        assert_eq!(DataMap::whole(b.clone()).validate(), Ok(()));
        assert_eq!(
            map(vec![ext(&b, 0, 0, 10), ext(&b, 10, 100, u64::MAX)]).validate(),
            Ok(())
        );
        assert_eq!(
            map(vec![ext(&b, 1, 0, 10)]).validate(),
            Err(InvalidMap::Hole {
                index: 0,
                expected: 0,
                found: 1
            })
        );
        assert_eq!(
            map(vec![ext(&b, 0, 0, 10), ext(&b, 11, 0, 10)]).validate(),
            Err(InvalidMap::Hole {
                index: 1,
                expected: 10,
                found: 11
            })
        );
        assert_eq!(
            map(vec![ext(&b, 0, 0, 10), ext(&b, 9, 0, 10)]).validate(),
            Err(InvalidMap::Overlap {
                index: 1,
                expected: 10,
                found: 9
            })
        );
        assert_eq!(
            map(vec![ext(&b, 0, 0, u64::MAX), ext(&b, 10, 0, 10)]).validate(),
            Err(InvalidMap::OpenEndedNotLast { index: 0 })
        );
        assert_eq!(
            map(vec![ext(&b, 0, 0, 0)]).validate(),
            Err(InvalidMap::EmptyExtent { index: 0 })
        );
        assert_eq!(
            map(vec![ext(&b, 0, i64::MAX as u64, 1)]).validate(),
            Err(InvalidMap::OutOfRange { index: 0 })
        );
        let many: Vec<Extent> = (0..17).map(|i| ext(&b, i, i, 1)).collect();
        assert_eq!(map(many).validate(), Err(InvalidMap::TooManyExtents { count: 17 }));
        let sixteen: Vec<Extent> = (0..16).map(|i| ext(&b, i, i, 1)).collect();
        assert_eq!(map(sixteen).validate(), Ok(()));
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn backing_must_be_regular() {
        let dir = File::open(std::env::temp_dir()).unwrap();
        let map = DataMap::whole(Arc::new(OwnedFd::from(dir)));
        assert!(matches!(map.validate(), Err(InvalidMap::NotRegular { index: 0, .. })));
        assert_eq!(Errno::from(map.validate().unwrap_err()), Errno::EINVAL);
    }

    #[test]
    fn read_and_write_across_extents() {
        let (a, pa) = temp("a", b"");
        let (b, pb) = temp("b", b"");
        let (c, pc) = temp("c", b"");
        // Bytes [0,4) in a at 100, [4,8) in b at 0, [8,12) in a at 0, the
        // rest in c.
        let map = DataMap {
            extents: vec![
                ext(&a, 0, 100, 4),
                ext(&b, 4, 0, 4),
                ext(&a, 8, 0, 4),
                ext(&c, 12, 0, u64::MAX),
            ],
        };
        map.validate().unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(map.read_at(0, &mut buf).unwrap(), 0, "nothing written yet");
        assert_eq!(map.write_at(2, b"0123456789").unwrap(), 10);
        let mut got = vec![0u8; 32];
        let n = map.read_at(0, &mut got).unwrap();
        assert_eq!(&got[..n], b"\0\x000123456789");
        let n = map.read_at(5, &mut got[..3]).unwrap();
        assert_eq!(&got[..n], b"345");
        let fa = File::open(&pa).unwrap();
        let mut raw = [0u8; 4];
        fa.read_exact_at(&mut raw, 100).unwrap();
        assert_eq!(&raw, b"\0\x0001");
        fa.read_exact_at(&mut raw, 0).unwrap();
        assert_eq!(&raw, b"6789");
        assert_eq!(std::fs::read(&pb).unwrap(), b"2345");
        assert_eq!(map.write_at(11, b"XYZ").unwrap(), 3);
        assert_eq!(std::fs::read(&pc).unwrap(), b"YZ");
        let n = map.read_at(0, &mut got).unwrap();
        assert_eq!(&got[..n], b"\0\x00012345678XYZ");
        std::fs::remove_file(pc).unwrap();
        std::fs::remove_file(pa).unwrap();
        std::fs::remove_file(pb).unwrap();
    }

    #[test]
    fn write_far_in_leaves_a_readable_hole() {
        let (a, pa) = temp("ha", b"");
        let (b, pb) = temp("hb", b"");
        let map = DataMap {
            extents: vec![ext(&a, 0, 0, 8), ext(&b, 8, 0, u64::MAX)],
        };
        assert_eq!(map.write_at(10, b"xy").unwrap(), 2);
        let mut got = [0xffu8; 20];
        assert_eq!(map.read_at(0, &mut got).unwrap(), 12);
        assert_eq!(&got[..12], b"\0\0\0\0\0\0\0\0\0\0xy");
        std::fs::remove_file(pa).unwrap();
        std::fs::remove_file(pb).unwrap();
    }

    #[test]
    fn bounded_map_refuses_growth() {
        let (a, pa) = temp("bounded", b"hello world");
        let map = DataMap {
            extents: vec![ext(&a, 0, 6, 5)],
        };
        let mut got = [0u8; 10];
        assert_eq!(map.read_at(0, &mut got).unwrap(), 5);
        assert_eq!(&got[..5], b"world");
        assert_eq!(map.read_at(5, &mut got).unwrap(), 0);
        assert_eq!(map.write_at(3, b"LDxx").unwrap(), 2);
        assert_eq!(
            map.write_at(5, b"x").unwrap_err().raw_os_error(),
            Some(libc::EFBIG),
            "past the end of a bounded map"
        );
        assert_eq!(std::fs::read(&pa).unwrap(), b"hello worLD");
        assert_eq!(DataMap::default().read_at(0, &mut got).unwrap(), 0);
        std::fs::remove_file(pa).unwrap();
    }
}
