//! File systems bundled with shortfuse.

pub mod mem;
pub mod null;
