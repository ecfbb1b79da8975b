//! Locks that stay usable after a thread panicked while holding them.
//!
//! A panic in one request (a bug in a file system, a failed assertion)
//! unwinds its worker thread and poisons the locks it held. The state
//! behind them is as consistent as the code left it between two
//! statements; refusing every later request for it would turn one failed
//! request into a dead mount, so every lock in the workspace is taken
//! through [`lock`] or [`Unpoison::unpoison`], which take the guard anyway.

use std::sync::{LockResult, Mutex, MutexGuard, PoisonError};

/// The guard (or value) of a lock operation, poisoned or not.
pub trait Unpoison<T> {
    /// What the operation gives, whether or not a panicking thread held
    /// the lock before.
    fn unpoison(self) -> T;
}

impl<T> Unpoison<T> for LockResult<T> {
    fn unpoison(self) -> T {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

/// Locks `m`, poisoned or not.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unpoison()
}
