//! How big a run is. Every suite sizes itself from one of three scales.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// About a second per suite per configuration, for the test suite.
    Tiny,
    /// `--quick`: every suite on its default configurations finishes in
    /// under two minutes; about a second per workload and configuration,
    /// more for `latency` and `fio` (`make demo`).
    Quick,
    /// The papers' workloads scaled to this machine (2 cores, one virtual disk).
    Full,
}

impl Scale {
    pub fn name(self) -> &'static str {
        match self {
            Scale::Tiny => "tiny",
            Scale::Quick => "quick",
            Scale::Full => "full",
        }
    }

    /// Picks one of three values by scale.
    pub fn pick<T>(self, tiny: T, quick: T, full: T) -> T {
        match self {
            Scale::Tiny => tiny,
            Scale::Quick => quick,
            Scale::Full => full,
        }
    }
}
