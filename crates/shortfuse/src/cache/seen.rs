//! What a cache last saw of a file, for the close-to-open check.
//!
//! A change made elsewhere is noticed at open by a different size or
//! mtime. An mtime is only as fine as the file system's clock: SFTP v3
//! carries whole seconds, ext4 the kernel's tick. A same-size change made
//! within that granule of the last look leaves both unchanged, so pages
//! cached then cannot be told from stale ones ("racy", as git calls its
//! index entries in the same spot). Attributes are therefore trusted only
//! when the mtime is older than the moment they were taken by a window:
//! `COARSE_WINDOW` for whole-second mtimes (one second of granule, one
//! of a server clock a little ahead of ours), `FINE_WINDOW` for mtimes
//! with a fraction (a local clock's tick, 4-10 ms, with room to spare). A
//! racily clean file's pages are dropped at open, and trusted again once a
//! later look finds it settled.

use crate::types::{Attr, Timestamp};

/// How much older than the look a whole-second mtime must be, in ns.
pub(crate) const COARSE_WINDOW: i128 = 2_000_000_000;
/// The same for an mtime with a fraction of a second, in ns.
pub(crate) const FINE_WINDOW: i128 = 50_000_000;

/// The size and mtime a cache saw, and when it looked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    size: u64,
    mtime: Timestamp,
    at: Timestamp,
}

impl Seen {
    /// `attr` as reported now.
    pub fn now(attr: &Attr) -> Seen {
        Seen::at(attr, Timestamp::now())
    }

    /// What `attr` says, looked at at time `at`.
    pub fn at(attr: &Attr, at: Timestamp) -> Seen {
        Seen {
            size: attr.size,
            mtime: attr.mtime,
            at,
        }
    }

    /// The size seen.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether pages cached since this look still hold for a file now
    /// reported as `now`.
    pub fn still_holds(&self, now: &Seen) -> bool {
        self.size == now.size && self.mtime == now.mtime && !self.racy()
    }

    /// Whether a change after the look could have left size and mtime as
    /// they were.
    fn racy(&self) -> bool {
        let window = if self.mtime.nsec == 0 {
            COARSE_WINDOW
        } else {
            FINE_WINDOW
        };
        ns(self.at) - ns(self.mtime) < window
    }
}

fn ns(t: Timestamp) -> i128 {
    i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(size: u64, sec: i64) -> Attr {
        Attr {
            size,
            mtime: Timestamp { sec, nsec: 0 },
            ..Attr::default()
        }
    }

    fn at(sec: i64) -> Timestamp {
        Timestamp { sec, nsec: 0 }
    }

    fn fine(sec: i64, nsec: u32) -> Timestamp {
        Timestamp { sec, nsec }
    }

    #[test]
    fn settled_files_hold_until_size_or_mtime_moves() {
        let seen = Seen::at(&attr(10, 100), at(200));
        assert!(seen.still_holds(&Seen::at(&attr(10, 100), at(300))));
        assert!(!seen.still_holds(&Seen::at(&attr(11, 100), at(300))));
        assert!(!seen.still_holds(&Seen::at(&attr(10, 101), at(300))));
    }

    #[test]
    fn a_file_changed_near_the_look_is_not_trusted() {
        // Same size and mtime, but the mtime's second was still running
        // (or just ended) when we looked: another write could hide in it.
        for look in [100, 101] {
            let seen = Seen::at(&attr(10, 100), at(look));
            assert!(
                !seen.still_holds(&Seen::at(&attr(10, 100), at(look + 50))),
                "look at {look}"
            );
        }
        let settled = Seen::at(&attr(10, 100), at(102));
        assert!(settled.still_holds(&Seen::at(&attr(10, 100), at(150))));
    }

    #[test]
    fn fine_mtimes_settle_after_a_tick_or_so() {
        let a = Attr {
            size: 10,
            mtime: fine(100, 5_000_000),
            ..Attr::default()
        };
        let later = Seen::at(&a, at(200));
        assert!(!Seen::at(&a, fine(100, 30_000_000)).still_holds(&later));
        assert!(Seen::at(&a, fine(100, 60_000_000)).still_holds(&later));
    }

    #[test]
    fn an_mtime_ahead_of_our_clock_is_racy() {
        let seen = Seen::at(&attr(10, 500), at(100));
        assert!(!seen.still_holds(&Seen::at(&attr(10, 500), at(101))));
    }
}
