//! See `shortfuse_fuzz::paths`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shortfuse_fuzz::paths(data));
