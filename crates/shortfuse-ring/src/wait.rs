//! Hybrid polling (RFUSE): spin a bounded time for the other side, then
//! sleep on a futex. Spinning saves the two context switches and the
//! wake-up latency of a sleep (several microseconds each) when the other
//! side answers quickly; the bound keeps a slow request from burning a CPU.

use std::hint::spin_loop;
use std::time::{Duration, Instant};

/// Spins until `done()` holds or `budget` has passed; true if it holds.
/// The clock is read every 64 checks (a vDSO call costs tens of
/// nanoseconds, a check a few).
pub fn spin_until(budget: Duration, mut done: impl FnMut() -> bool) -> bool {
    if done() {
        return true;
    }
    if budget.is_zero() {
        return false;
    }
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            spin_loop();
            if done() {
                return true;
            }
        }
        if start.elapsed() >= budget {
            return false;
        }
    }
}
