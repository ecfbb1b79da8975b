//! See `shortfuse_fuzz::parse`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shortfuse_fuzz::parse(data));
