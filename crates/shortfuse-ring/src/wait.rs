//! Hybrid polling (RFUSE): poll a bounded time for the other side, then
//! sleep on a futex. Polling saves the sleep and the wake-up (a cross-CPU
//! wake-up costs about 13 µs on these 2-core virtual machines, see the
//! uring session's notes) when the other side answers quickly.
//!
//! Two rules learnt on 2 cores shared with other work:
//! - Yield between polls. The other side may be waiting for this very CPU
//!   (the client and the worker often share one); a poll that keeps the CPU
//!   only delays the answer it waits for. `sched_yield` returns at once when
//!   nothing else wants the CPU.
//! - Back off. A poll that ends without the answer means the other side is
//!   slow or the CPUs are busy: polling then only costs, so the next
//!   [`BACKOFF`] waits sleep at once.

use std::cell::Cell;
use std::hint::spin_loop;
use std::time::{Duration, Instant};

use crate::sys;

/// Waits that sleep at once after a poll that failed.
pub const BACKOFF: u32 = 16;

/// One waiter's polling state (a worker's, or a client thread's).
#[derive(Default)]
pub struct Poll {
    skip: Cell<u32>,
}

impl Poll {
    /// Polls until `done()` holds or `budget` has passed; true if it holds.
    pub fn until(&self, budget: Duration, mut done: impl FnMut() -> bool) -> bool {
        if done() {
            return true;
        }
        if budget.is_zero() {
            return false;
        }
        if self.skip.get() > 0 {
            self.skip.set(self.skip.get() - 1);
            return false;
        }
        let start = Instant::now();
        loop {
            for _ in 0..16 {
                spin_loop();
                if done() {
                    return true;
                }
            }
            sys::sched_yield();
            if done() {
                return true;
            }
            if start.elapsed() >= budget {
                self.skip.set(BACKOFF);
                return false;
            }
        }
    }
}

thread_local! {
    static CLIENT: Poll = const { Poll { skip: Cell::new(0) } };
}

/// [`Poll::until`] with the calling thread's own state (client threads).
pub fn spin_until(budget: Duration, done: impl FnMut() -> bool) -> bool {
    CLIENT.with(|p| p.until(budget, done))
}
