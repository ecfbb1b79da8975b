//! A value made once per process, by the first thread that needs it, where
//! making it is slow (a connection to a daemon, its INIT): [`MadeOnce`].
//!
//! `std::sync::OnceLock` would do but for fork: a process forked while
//! another thread was making the value would find it being made forever,
//! by a thread that did not come along. Here the maker is known by its
//! process, and a thread of a forked child takes over the making from its
//! parent's.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// A value made at most once per process (see the module doc).
pub(crate) struct MadeOnce<T> {
    value: OnceLock<T>,
    /// The process one of whose threads is making the value; 0: none.
    maker: AtomicU32,
}

impl<T> MadeOnce<T> {
    pub(crate) const fn new() -> MadeOnce<T> {
        MadeOnce {
            value: OnceLock::new(),
            maker: AtomicU32::new(0),
        }
    }

    /// Records a value made by other means (no lock, no system call); a
    /// value made already stays.
    pub(crate) fn set(&self, value: T) {
        let _ = self.value.set(value);
    }

    /// A value made already.
    pub(crate) fn made(value: T) -> MadeOnce<T> {
        let once = MadeOnce::new();
        once.set(value);
        once
    }

    pub(crate) fn get(&self) -> Option<&T> {
        self.value.get()
    }

    /// The value, made by `make` if no thread made it yet. Threads that
    /// ask meanwhile wait; a failure leaves it unmade, for the next to try.
    pub(crate) fn get_or_try<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<&T, E> {
        if let Some(v) = self.value.get() {
            return Ok(v);
        }
        let me = shortfuse_ring::pid();
        loop {
            match self.maker.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                // A thread of the process we were forked from: not here.
                Err(other)
                    if other != me
                        && self
                            .maker
                            .compare_exchange(other, me, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok() =>
                {
                    break
                }
                Err(_) => {
                    if let Some(v) = self.value.get() {
                        return Ok(v);
                    }
                    std::thread::yield_now();
                }
            }
        }
        let made = match self.value.get() {
            Some(v) => Ok(v),
            None => make().map(|v| self.value.get_or_init(|| v)),
        };
        self.maker.store(0, Ordering::Release);
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_and_tried_again_after_a_failure() {
        let once = MadeOnce::new();
        assert_eq!(once.get_or_try(|| Err::<u32, _>("no")), Err("no"));
        assert_eq!(once.get(), None);
        assert_eq!(once.get_or_try(|| Ok::<_, ()>(7)), Ok(&7));
        assert_eq!(once.get_or_try(|| Ok::<_, ()>(8)), Ok(&7));
    }

    #[test]
    fn a_maker_of_another_process_is_taken_over() {
        let once = MadeOnce::new();
        // As a forked child finds it: made by its parent's thread.
        once.maker.store(shortfuse_ring::pid() + 1, Ordering::Relaxed);
        assert_eq!(once.get_or_try(|| Ok::<_, ()>(3)), Ok(&3));
        assert_eq!(once.maker.load(Ordering::Relaxed), 0);
    }
}
