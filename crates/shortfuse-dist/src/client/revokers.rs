//! The pool of threads that run revocations.

use shortfuse::sync::lock;
use shortfuse::sync::Unpoison;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long an idle revocation thread waits for more work before it ends.
pub(super) const REVOKER_IDLE: Duration = Duration::from_secs(5);

pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Threads that run revocations, which wait for running I/O and for the
/// server and so never run on the connection's reader. Idle threads are
/// reused, so a lease that moves costs no thread start; another starts
/// when all are busy, so that a revocation held back (see
/// [`Inner::hold`]) never delays the next one.
#[derive(Default)]
pub(super) struct Revokers {
    /// Jobs not yet taken, and how many threads wait for one.
    pub(super) queue: Mutex<(VecDeque<Job>, usize)>,
    pub(super) wake: Condvar,
}

impl Revokers {
    pub(super) fn run(self: &Arc<Self>, job: Job) -> std::io::Result<()> {
        let mut q = lock(&self.queue);
        q.0.push_back(job);
        // A waiting thread leaves the count when it wakes: as many waiting
        // as queued jobs means each will be taken.
        if q.1 >= q.0.len() {
            drop(q);
            self.wake.notify_one();
            return Ok(());
        }
        drop(q);
        let me = self.clone();
        std::thread::Builder::new()
            .name("distfs-revoke".into())
            .spawn(move || me.work())
            .map(|_| ())
    }

    pub(super) fn work(&self) {
        let mut q = lock(&self.queue);
        loop {
            if let Some(job) = q.0.pop_front() {
                drop(q);
                job();
                q = lock(&self.queue);
                continue;
            }
            q.1 += 1;
            let (g, wait) = self.wake.wait_timeout(q, REVOKER_IDLE).unpoison();
            q = g;
            q.1 -= 1;
            if wait.timed_out() && q.0.is_empty() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revokers_run_every_job_and_a_waiting_one_holds_up_no_other() {
        let pool = Arc::new(Revokers::default());
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        // The first job waits for the second: one thread for both would
        // never finish it.
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let first = tx.clone();
        pool.run(Box::new(move || {
            let got = go_rx.recv_timeout(Duration::from_secs(10)).is_ok();
            first.send(u32::from(got)).unwrap();
        }))
        .unwrap();
        pool.run(Box::new(move || go_tx.send(()).unwrap())).unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(20)),
            Ok(1),
            "the first job never saw the second"
        );
        // Idle threads take later jobs, one each.
        for k in 0..20 {
            let tx = tx.clone();
            pool.run(Box::new(move || tx.send(10 + k).unwrap())).unwrap();
        }
        let mut got: Vec<u32> = (0..20)
            .map(|_| rx.recv_timeout(Duration::from_secs(20)).unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, (10..30).collect::<Vec<u32>>());
    }
}
