//! Requests that wait for the storage device (FSYNC, FSYNCDIR), served on
//! helper threads so that the transport's readers keep reading.
//!
//! A reader that runs an fsync itself waits for a device flush (a
//! millisecond or more) and reads nothing meanwhile: with one or two
//! readers, programs syncing different files queue behind each other in
//! the daemon although the device would take their flushes together (four
//! `fio` threads writing 4 KiB with `fdatasync` each got a fifth of what
//! they get natively). libfuse's multi-threaded loop starts more readers
//! for them (up to ten); more readers of one queue, though, make every
//! later request wake a different, cold thread (see `session::pool`). So
//! these requests go to helpers that read no queue: started when none is
//! free, up to [`MAX_HELPERS`], ended after [`IDLE_FOR`] without work.
//! The reply goes to the transport's sink from the helper.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::sync::Unpoison;

/// At most this many requests wait for the device at once; more queue.
pub const MAX_HELPERS: usize = 16;

/// A helper without work for this long ends.
const IDLE_FOR: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Helpers running.
    helpers: usize,
    /// Helpers waiting for a job.
    idle: usize,
    /// Jobs taken and not finished.
    running: usize,
}

/// The helpers of one connection.
#[derive(Default)]
pub(crate) struct Offload {
    state: Mutex<State>,
    /// A job was queued.
    work: Condvar,
    /// A job finished (for [`Offload::wait_idle`]).
    done: Condvar,
}

impl Offload {
    /// Runs `job` on a helper: a waiting one, or a new one when none waits
    /// for work and fewer than [`MAX_HELPERS`] run; otherwise it queues.
    pub(crate) fn run(self: &Arc<Offload>, job: Job) {
        let mut st = self.state.lock().unpoison();
        st.jobs.push_back(job);
        if st.jobs.len() <= st.idle {
            drop(st);
            self.work.notify_one();
            return;
        }
        if st.helpers >= MAX_HELPERS {
            return;
        }
        st.helpers += 1;
        drop(st);
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("shortfuse-sync".into())
            .spawn(move || me.helper());
        if let Err(e) = spawned {
            tracing::warn!("starting a helper for a device wait: {e}; running it here");
            let mut st = self.state.lock().unpoison();
            st.helpers -= 1;
            // Nobody else may take it: run the job (or whichever came first) here.
            if let Some(job) = st.jobs.pop_front() {
                drop(st);
                job();
            }
        }
    }

    fn helper(&self) {
        let mut st = self.state.lock().unpoison();
        loop {
            if let Some(job) = st.jobs.pop_front() {
                st.running += 1;
                drop(st);
                // A panic answers EIO (the reply handle's drop) and must
                // not take the count of running jobs with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                st = self.state.lock().unpoison();
                st.running -= 1;
                self.done.notify_all();
                continue;
            }
            st.idle += 1;
            let (guard, waited) = self.work.wait_timeout(st, IDLE_FOR).unpoison();
            st = guard;
            st.idle -= 1;
            if waited.timed_out() && st.jobs.is_empty() {
                st.helpers -= 1;
                return;
            }
        }
    }

    /// Waits until no job is queued or running (the session ended: nothing
    /// may run beside the file system's `destroy`).
    pub(crate) fn wait_idle(&self) {
        let mut st = self.state.lock().unpoison();
        while !st.jobs.is_empty() || st.running > 0 {
            st = self.done.wait(st).unpoison();
        }
    }
}
