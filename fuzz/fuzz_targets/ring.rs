//! See `shortfuse_fuzz::ring`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shortfuse_fuzz::ring(data));
