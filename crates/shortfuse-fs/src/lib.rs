//! File systems bundled with shortfuse.

pub mod falloc;
pub mod mem;
pub mod null;
pub mod pack;
pub mod passthrough;
pub mod pattern;
pub mod registry;
pub mod sftp;
pub mod stripe;
pub mod xattr;
