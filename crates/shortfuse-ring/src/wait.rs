//! Hybrid polling (RFUSE): poll a bounded time for the other side, then
//! sleep on a futex. Polling saves the sleep and the wake-up (a cross-CPU
//! wake-up costs about 13 µs on these 2-core virtual machines, see the
//! uring session's notes) when the other side answers quickly.
//!
//! What suits 2 cores shared with other work:
//! - Workers run where the scheduler puts them. A client submits to the
//!   queue of the CPU it runs on; the scheduler puts a polling worker on
//!   the other CPU when it is idle, so both ends of a round trip poll at
//!   once. A worker pinned off its client's CPU (as before) is no faster
//!   on an idle machine and far slower on a busy one: woken, it must wait
//!   for the one CPU it may use, where another program runs out its time
//!   slice, even when its client has gone to sleep and freed the other.
//!   Measured (release, `null`, a program under `shortfuse run` doing
//!   10,000 calls, mean per call): with two busy loops on the 2 CPUs, a
//!   stat of a missing name took 890-950 µs pinned, 98-170 µs not, and a
//!   create 1800-2500 µs against 94-204 µs (/dev/fuse: 10-27 and 86-113
//!   µs); on the idle machine, in `shortfuse bench transport --quick`
//!   (3 runs each, p50), the same either way: stat-missing 1.44-1.79 µs
//!   pinned, 1.44-1.72 not; create 4.4-5.0 and 4.3-5.1; open+close of the
//!   root 2.8-3.5 and 2.9-3.5.
//! - Keep the CPU for [`EAGER`] first: an empty request comes back within
//!   about a microsecond when the other side polls on the other CPU, and a
//!   `sched_yield` costs 0.3 to 0.9 µs even when nobody else wants the CPU
//!   (and hands it to a compiler for a whole time slice when somebody
//!   does): yielding before the answer is due only delays noticing it.
//! - Then yield between polls, up to the budget (`--spin-us`, default
//!   [`crate::DEFAULT_SPIN_US`]). The other side may be waiting for this
//!   very CPU (a client that moved, more threads than CPUs); a poll that
//!   keeps the CPU longer only delays the answer it waits for.
//! - Back off. A poll that ends without the answer means the other side is
//!   slow or the CPUs are busy: polling then only costs, so the next
//!   [`BACKOFF`] waits sleep after the eager poll alone (which still
//!   catches an answer that comes at once, and then ends the back-off:
//!   without it one slow reply made the next 16 calls each wait for a
//!   wake-up; null-ring rows, 6 runs each at load 8: p99 of empty create
//!   33 to 92 µs, median 47, against 35 to 103, median 80; of open+close
//!   6 to 19 µs, median 7, against 5 to 25, median 13; same p50s). An
//!   idle client or daemon sleeps. A
//!   worker woken by the doorbell with work polls again at once
//!   ([`Poll::reset`]): otherwise each of the next requests of a client
//!   that resumed would ring and wait for a wake-up. Measured with the
//!   transport bench's null-ring rows alone (6 runs each, load 4 to 5 on
//!   2 CPUs, same p50s): p99 of stat-missing 2.6 to 4.4 µs in 5 runs of 6
//!   (25.8 in the sixth) against 18 to 26 µs (6013 in one), of empty
//!   create 46 to 112 µs in 5 (2791 in one) against 98 to 201 (1198).
//!
//! Measured with `ring_rtt` (release, empty GETATTRs, p50, while 4 other
//! engineers compiled: load 6 to 14 on 2 CPUs; compare within a line):
//! - yielding every 16 polls from the start, workers anywhere (before):
//!   2.9 to 3.8 µs; a worker off the client's CPU and [`EAGER`] of 2 µs:
//!   1.0 to 1.3 µs; the eager phase with the workers anywhere: 6.4 to
//!   7.2 µs (client and worker taking turns on one CPU).
//! - one queue (one worker, on either CPU): 7.9 to 8.0 µs; two: 1.1 to
//!   1.3 µs.
//! - spin budget 0 (a futex wait and wake each time): 17 µs; 5 µs: the
//!   same p50 as 20 µs but p99 35 µs against 17 µs (the worker is often
//!   asleep when the next call of a program comes); 50 µs: p50 and p99 as
//!   20 µs, mean 6.0-6.4 µs against 6.7-7.3 µs, for 2.5 times the CPU
//!   burnt before each sleep. Hence 20 µs.
//!
//! Through the shim (`shortfuse bench transport --quick --configs
//! null-dev,null-uring,null-ring,null-preload`, p50, 3 runs): a stat of a
//! missing name on `null` went from 5.9-6.4 µs to 1.9-2.2 µs (in process
//! 1.2-1.3 µs; /dev/fuse 10.0-11.2 µs, FUSE over io_uring 9.3-9.8 µs in
//! the same runs: half of the 20.5 µs /dev/fuse took on a quieter machine
//! earlier, probably because busy CPUs wake faster), open+close of the
//! root (2 round trips) from 12.0-12.7 µs to 4.7-5.0 µs.

use std::cell::Cell;
use std::hint::spin_loop;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use crate::sys;

/// Waits that sleep at once after a poll that failed.
pub const BACKOFF: u32 = 16;

/// How long a poll keeps its CPU before it starts yielding it.
pub const EAGER: Duration = Duration::from_micros(2);

/// Polls between two looks at the clock (a `pause` takes 10 to 140 cycles
/// depending on the CPU, 80 ns here; a clock read 30 to 100 ns).
const BATCH: u32 = 16;

/// One waiter's polling state (a worker's, or a client thread's).
#[derive(Default)]
pub struct Poll {
    skip: Cell<u32>,
}

impl Poll {
    /// The other side is busy again (a worker woken with work to do):
    /// polling pays again, so the back-off ends.
    pub fn reset(&self) {
        self.skip.set(0);
    }

    /// Polls until `done()` holds or `budget` has passed; true if it holds.
    pub fn until(&self, budget: Duration, done: impl FnMut() -> bool) -> bool {
        self.until_sharing(budget, false, done)
    }

    /// [`Poll::until`], told whether the other side last ran on this
    /// thread's CPU (`sharing`). Then it cannot answer while this thread
    /// keeps the CPU: the eager poll and the spins between yields only
    /// delay the answer, so every look is followed by a yield. Measured
    /// (release, bindfs served over the rings, a stat of a missing name,
    /// p50, the program and the daemon found on one CPU at every look):
    /// 13.7 µs with the eager poll, against 4.7 µs when they ran apart;
    /// sleeping at once instead of polling took 10 µs.
    pub fn until_sharing(&self, budget: Duration, sharing: bool, mut done: impl FnMut() -> bool) -> bool {
        if done() {
            return true;
        }
        if budget.is_zero() {
            return false;
        }
        let backing_off = self.skip.get() > 0;
        if backing_off {
            self.skip.set(self.skip.get() - 1);
        }
        let start = Instant::now();
        let eager = EAGER.min(budget);
        if !sharing {
            loop {
                for _ in 0..BATCH {
                    spin_loop();
                    if done() {
                        // Quick again: the back-off is over.
                        self.skip.set(0);
                        return true;
                    }
                }
                if start.elapsed() >= eager {
                    break;
                }
            }
        }
        if backing_off {
            return false;
        }
        loop {
            sys::sched_yield();
            if done() {
                if sharing {
                    self.skip.set(0);
                }
                return true;
            }
            if start.elapsed() >= budget {
                self.skip.set(BACKOFF);
                return false;
            }
            if sharing {
                continue;
            }
            for _ in 0..BATCH {
                spin_loop();
                if done() {
                    return true;
                }
            }
        }
    }
}

thread_local! {
    static CLIENT: Poll = const { Poll { skip: Cell::new(0) } };
}

/// [`Poll::until`] with the calling thread's own state (client threads).
pub fn spin_until(budget: Duration, done: impl FnMut() -> bool) -> bool {
    spin_until_sharing(budget, false, done)
}

/// [`Poll::until_sharing`] with the calling thread's own state.
pub fn spin_until_sharing(budget: Duration, sharing: bool, done: impl FnMut() -> bool) -> bool {
    CLIENT.with(|p| p.until_sharing(budget, sharing, done))
}

/// The CPU this thread runs on, plus one; 0 when it cannot be told (as
/// [`crate::region::header::CALLER_CPU`] keeps it).
pub fn cpu_mark() -> u32 {
    sys::cpu().map_or(0, |c| c.wrapping_add(1))
}

/// Stores `mark` in `word` unless it holds it already (the line then
/// stays shared between the CPUs that read it).
pub fn note_cpu(word: &AtomicU32, mark: u32) {
    if word.load(std::sync::atomic::Ordering::Relaxed) != mark {
        word.store(mark, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_poll_backs_off_until_reset_or_a_quick_answer() {
        let poll = Poll::default();
        let never = || false;
        assert!(!poll.until(Duration::from_micros(50), never));
        assert_eq!(poll.skip.get(), BACKOFF);
        // Backing off: the eager poll alone, and one wait fewer to go.
        assert!(!poll.until(Duration::from_micros(50), never));
        assert_eq!(poll.skip.get(), BACKOFF - 1);
        poll.reset();
        assert_eq!(poll.skip.get(), 0);
        assert!(!poll.until(Duration::from_micros(50), never));
        // An answer on the third look, within the eager poll: quick again.
        let looks = Cell::new(0u32);
        assert!(poll.until(Duration::from_micros(50), || {
            looks.set(looks.get() + 1);
            looks.get() == 3
        }));
        assert_eq!(poll.skip.get(), 0);
    }

    /// Pins the calling thread to `cpu`.
    #[allow(unsafe_code)]
    fn pin(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and the call only
        // touch the set we own.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set), 0);
        }
    }

    #[test]
    fn a_poll_beside_the_other_side_yields_at_each_look() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        // The other side on this very CPU answers only when it gets it.
        let ready = Arc::new(AtomicBool::new(false));
        let asked = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicBool::new(false));
        pin(0);
        let other = {
            let (ready, asked, answered) = (ready.clone(), asked.clone(), answered.clone());
            std::thread::spawn(move || {
                pin(0);
                ready.store(true, Ordering::Release);
                while !asked.load(Ordering::Acquire) {
                    sys::sched_yield();
                }
                answered.store(true, Ordering::Release);
            })
        };
        while !ready.load(Ordering::Acquire) {
            sys::sched_yield();
        }
        let poll = Poll::default();
        let looks = Cell::new(0u32);
        asked.store(true, Ordering::Release);
        assert!(poll.until_sharing(Duration::from_secs(5), true, || {
            looks.set(looks.get() + 1);
            answered.load(Ordering::Acquire)
        }));
        other.join().unwrap();
        // Spinning first would have made a batch of looks before the
        // first yield, none of which could see the answer.
        assert!(looks.get() < BATCH, "{} looks", looks.get());
    }
}
