//! File systems bundled with shortfuse.

pub mod null;
