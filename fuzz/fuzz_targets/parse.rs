//! Any byte string: `parse` returns a view or an error, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for setxattr_ext in [false, true] {
        let _ = shortfuse_abi::parse_with(data, shortfuse_abi::ParseConfig { setxattr_ext });
    }
});
