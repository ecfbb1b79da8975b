//! File systems bundled with shortfuse.

pub mod mem;
pub mod null;
pub mod pack;
pub mod stripe;
pub mod passthrough;
pub mod sftp;
