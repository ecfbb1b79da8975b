//! File systems bundled with shortfuse.

pub mod mem;
pub mod null;
pub mod passthrough;
