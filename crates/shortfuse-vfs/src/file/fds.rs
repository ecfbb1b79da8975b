//! The descriptor table.

use shortfuse::sync::Unpoison;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use shortfuse::Errno;

use super::OpenFile;

/// One descriptor: its open file description and its own flag.
#[derive(Clone)]
struct Slot {
    file: Arc<OpenFile>,
    cloexec: bool,
}

/// Descriptors below this are looked up in a lock-free bitmap first.
const FAST_FDS: usize = 1 << 16;

/// Hashes descriptor numbers for the table: they are small, dense and
/// chosen by the kernel, not by an adversary, so a multiply spreads them
/// well enough and costs a fraction of SipHash (every served call on a
/// descriptor looks one up).
#[derive(Default)]
struct FdHasher(u64);

impl std::hash::Hasher for FdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_i32(&mut self, v: i32) {
        self.0 = u64::from(v as u32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type FdHash = std::hash::BuildHasherDefault<FdHasher>;

/// The descriptor table: descriptor numbers (chosen by the caller, e.g. the
/// kernel numbers of placeholders) to open files.
pub struct FdTable {
    slots: Mutex<HashMap<i32, Slot, FdHash>>,
    /// One bit per descriptor below `FAST_FDS`: is it ours?
    bits: Box<[AtomicU64]>,
    /// One bit per descriptor below `FAST_FDS`: is it ours and a kernel
    /// descriptor of its backing file ([`OpenFile::kernel_backed`] when it
    /// was installed)? Read without the lock by [`FdTable::quick`].
    kernel_bits: Box<[AtomicU64]>,
}

/// What the lock-free bitmaps know of a descriptor (see [`FdTable::quick`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Not ours.
    NotOurs,
    /// Ours, a kernel descriptor of its backing file.
    KernelBacked,
    /// Ours, and something else (or being replaced right now).
    Ours,
}

impl Default for FdTable {
    fn default() -> FdTable {
        FdTable::new()
    }
}

impl FdTable {
    pub fn new() -> FdTable {
        FdTable {
            slots: Mutex::new(HashMap::default()),
            bits: (0..FAST_FDS / 64).map(|_| AtomicU64::new(0)).collect(),
            kernel_bits: (0..FAST_FDS / 64).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<i32, Slot, FdHash>> {
        self.slots.lock().unpoison()
    }

    fn mark(&self, fd: i32, on: bool) {
        Self::set_bit(&self.bits, fd, on);
    }

    fn mark_kernel(&self, fd: i32, on: bool) {
        Self::set_bit(&self.kernel_bits, fd, on);
    }

    fn set_bit(bits: &[AtomicU64], fd: i32, on: bool) {
        if let Ok(i) = usize::try_from(fd) {
            if i < FAST_FDS {
                let bit = 1u64 << (i % 64);
                if on {
                    bits[i / 64].fetch_or(bit, Ordering::Release);
                } else {
                    bits[i / 64].fetch_and(!bit, Ordering::Release);
                }
            }
        }
    }

    /// What `fd` is, without the lock (so without waiting for a thread
    /// that holds it, or for one that a signal interrupted holding it):
    /// `None` at and above 65536, where only the locked table knows.
    pub fn quick(&self, fd: i32) -> Option<Held> {
        let i = match usize::try_from(fd) {
            Ok(i) if i < FAST_FDS => i,
            Ok(_) => return None,
            Err(_) => return Some(Held::NotOurs),
        };
        let bit = 1u64 << (i % 64);
        Some(if self.bits[i / 64].load(Ordering::Acquire) & bit == 0 {
            Held::NotOurs
        } else if self.kernel_bits[i / 64].load(Ordering::Acquire) & bit != 0 {
            Held::KernelBacked
        } else {
            Held::Ours
        })
    }

    /// Whether `fd` is one of ours: lock-free for descriptors below 65536.
    pub fn contains(&self, fd: i32) -> bool {
        match usize::try_from(fd) {
            Ok(i) if i < FAST_FDS => self.bits[i / 64].load(Ordering::Acquire) & (1u64 << (i % 64)) != 0,
            Ok(_) => self.lock().contains_key(&fd),
            Err(_) => false,
        }
    }

    pub fn get(&self, fd: i32) -> Option<Arc<OpenFile>> {
        if !self.contains(fd) {
            return None;
        }
        self.lock().get(&fd).map(|s| s.file.clone())
    }

    /// Installs `file` at `fd`; returns what was there (to be closed by
    /// the caller outside any lock of ours).
    pub fn insert(&self, fd: i32, file: Arc<OpenFile>, cloexec: bool) -> Option<Arc<OpenFile>> {
        let kernel = file.kernel_backed();
        let mut slots = self.lock();
        // A lock-free reader never takes the new file for kernel-backed
        // when it is not: the bit goes off before the slot changes, on after.
        if !kernel {
            self.mark_kernel(fd, false);
        }
        let old = slots.insert(fd, Slot { file, cloexec });
        self.mark(fd, true);
        if kernel {
            self.mark_kernel(fd, true);
        }
        old.map(|s| s.file)
    }

    /// Removes `fd`: FLUSH now, RELEASE when it was the last descriptor of
    /// the open file. `None` when `fd` is not ours.
    pub fn close(&self, fd: i32, lock_owner: u64) -> Option<Result<(), Errno>> {
        self.close_with_cloexec(fd, lock_owner).map(|(r, _)| r)
    }

    /// [`FdTable::close`], and whether `fd` had FD_CLOEXEC.
    pub fn close_with_cloexec(&self, fd: i32, lock_owner: u64) -> Option<(Result<(), Errno>, bool)> {
        let slot = {
            let mut slots = self.lock();
            let s = slots.remove(&fd);
            if s.is_some() {
                self.mark_kernel(fd, false);
                self.mark(fd, false);
            }
            s
        }?;
        let r = slot.file.flush(lock_owner);
        let cloexec = slot.cloexec;
        drop(slot);
        Some((r, cloexec))
    }

    /// `dup2`/`dup3`/`F_DUPFD`: `new` shares `old`'s open file. Returns the
    /// file that `new` held before, if it was ours (already removed).
    pub fn dup(&self, old: i32, new: i32, cloexec: bool) -> Result<Option<Arc<OpenFile>>, Errno> {
        let file = self.get(old).ok_or(Errno::EBADF)?;
        Ok(self.insert(new, file, cloexec))
    }

    pub fn cloexec(&self, fd: i32) -> Option<bool> {
        self.lock().get(&fd).map(|s| s.cloexec)
    }

    pub fn set_cloexec(&self, fd: i32, on: bool) -> Result<(), Errno> {
        let mut slots = self.lock();
        let s = slots.get_mut(&fd).ok_or(Errno::EBADF)?;
        s.cloexec = on;
        Ok(())
    }

    /// Every descriptor in `lo..=hi` that is ours, removed (close_range).
    pub fn close_range(&self, lo: u32, hi: u32, lock_owner: u64) {
        let fds: Vec<i32> = self
            .lock()
            .keys()
            .copied()
            .filter(|&fd| fd >= 0 && (fd as u32) >= lo && (fd as u32) <= hi)
            .collect();
        for fd in fds {
            self.close(fd, lock_owner);
        }
    }

    /// Descriptors with FD_CLOEXEC (dropped at exec).
    pub fn cloexec_fds(&self) -> Vec<i32> {
        self.lock()
            .iter()
            .filter(|(_, s)| s.cloexec)
            .map(|(&fd, _)| fd)
            .collect()
    }

    /// Fills `out` with open files for which `pick` holds, each once
    /// however many descriptors share it, as many as fit: returns how many.
    /// Allocates nothing (see [`anchor_files`]).
    pub fn files_where(&self, pick: impl Fn(&OpenFile) -> bool, out: &mut [Option<Arc<OpenFile>>]) -> usize {
        let mut n = 0;
        for s in self.lock().values() {
            if n == out.len() {
                break;
            }
            if pick(&s.file) && !out[..n].iter().flatten().any(|f| Arc::ptr_eq(f, &s.file)) {
                out[n] = Some(s.file.clone());
                n += 1;
            }
        }
        n
    }

    /// Runs `each` on every descriptor of `file` (number, FD_CLOEXEC)
    /// with the table locked: a descriptor this table lists is the
    /// program's meanwhile, since `close` takes it out of the table before
    /// the kernel closes the number (so `each` may replace the kernel's
    /// descriptor at that number, and nobody else's).
    pub fn each_descriptor_of(&self, file: &Arc<OpenFile>, mut each: impl FnMut(i32, bool)) {
        let slots = self.lock();
        for (&fd, s) in slots.iter() {
            if Arc::ptr_eq(&s.file, file) {
                each(fd, s.cloexec);
            }
        }
    }

    /// Whether no descriptor is ours.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every descriptor of ours with its flag.
    pub fn fds(&self) -> Vec<(i32, bool)> {
        let mut v: Vec<(i32, bool)> = self.lock().iter().map(|(&fd, s)| (fd, s.cloexec)).collect();
        v.sort_unstable();
        v
    }
}
