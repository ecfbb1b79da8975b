//! The lookup count of one node, as the FUSE protocol keeps it.
//!
//! Every reply that hands the kernel (or a ring client) a reference to a
//! node — LOOKUP, CREATE, MKNOD, MKDIR, SYMLINK, LINK, and each entry of a
//! READDIRPLUS listing other than `.` and `..` — adds one to that node's
//! lookup count. The kernel gives them back with FORGET (or BATCH_FORGET)
//! of `nlookup`, possibly many at once; when the count reaches zero it no
//! longer names the node, and the file system may drop it (and reuse its
//! id). The root is the exception: the kernel never forgets it.
//!
//! One type counts them wherever shortfuse keeps such a count: the node
//! layer ([`crate::NodeFs`], the references the kernel holds), the
//! metadata cache ([`crate::cache`], split into the lookups the inner file
//! system handed out and those the cache answered itself, each a count of
//! this kind) and the ring server (per client, to give back what a client
//! held when it goes; its clients list directories with READDIR only, so
//! it counts the other replies). What differs between them is only what
//! they hold beside the count, not how it is counted.

/// Lookups of one node handed out and not yet forgotten.
///
/// A FORGET of more than is held saturates at zero: a confused or
/// malicious peer cannot underflow it, and extra forgets of a forgotten
/// node change nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupCount(u64);

impl LookupCount {
    /// A count of `n` lookups (1 for the root, which the kernel holds from
    /// the mount on).
    pub const fn new(n: u64) -> LookupCount {
        LookupCount(n)
    }

    /// `n` more lookups handed out (1 per entry in a reply).
    pub fn add(&mut self, n: u64) {
        self.0 = self.0.saturating_add(n);
    }

    /// `n` lookups given back (FORGET's `nlookup`); returns whether the
    /// node is forgotten now (the count is zero).
    #[must_use = "a forgotten node is to be dropped"]
    pub fn forget(&mut self, n: u64) -> bool {
        self.take(n);
        self.0 == 0
    }

    /// Gives back up to `n` lookups and returns how many it held of them
    /// (for a count that absorbs the first part of a FORGET and passes the
    /// rest on).
    pub fn take(&mut self, n: u64) -> u64 {
        let taken = self.0.min(n);
        self.0 -= taken;
        taken
    }

    /// Lookups held now.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Whether any lookup is held.
    pub const fn held(self) -> bool {
        self.0 > 0
    }
}

#[cfg(test)]
mod tests {
    use super::LookupCount;

    #[test]
    fn adds_and_forgets() {
        let mut c = LookupCount::default();
        assert!(!c.held());
        c.add(1);
        c.add(2);
        assert_eq!(c.get(), 3);
        assert!(!c.forget(2), "one lookup still held");
        assert_eq!(c.get(), 1);
        assert!(c.forget(1), "the last one forgotten");
        assert!(!c.held());
    }

    #[test]
    fn forgetting_more_than_held_saturates() {
        let mut c = LookupCount::new(2);
        assert!(c.forget(5));
        assert_eq!(c.get(), 0);
        assert!(c.forget(1), "a forgotten node stays forgotten");
        assert_eq!(c.get(), 0);
        c.add(u64::MAX);
        c.add(1);
        assert_eq!(c.get(), u64::MAX, "adding saturates too");
    }

    #[test]
    fn take_gives_back_what_it_held() {
        let mut c = LookupCount::new(2);
        assert_eq!(c.take(3), 2);
        assert_eq!(c.take(3), 0);
        c.add(4);
        assert_eq!(c.take(1), 1);
        assert_eq!(c.get(), 3);
    }
}
