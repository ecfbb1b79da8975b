//! Any byte string after a valid INIT: `handle` never panics and every
//! reply's length field equals its length.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use shortfuse::abi;
use shortfuse::{Dispatcher, MountOptions, Outcome, Stats, Transport};

struct Fs;
impl shortfuse::Filesystem for Fs {}

fn dispatcher() -> &'static Dispatcher {
    static D: OnceLock<Dispatcher> = OnceLock::new();
    D.get_or_init(|| {
        let d = Dispatcher::with_max_pages_limit(Arc::new(Fs), MountOptions::default(), Arc::new(Stats::new()), 256);
        let mut init = vec![0u8; 40 + 64];
        init[..4].copy_from_slice(&104u32.to_ne_bytes());
        init[4..8].copy_from_slice(&abi::FUSE_INIT.to_ne_bytes());
        init[8..16].copy_from_slice(&1u64.to_ne_bytes());
        init[40..44].copy_from_slice(&7u32.to_ne_bytes());
        init[44..48].copy_from_slice(&45u32.to_ne_bytes());
        let mut buf = Vec::new();
        assert_eq!(d.handle(&init, &mut buf, Transport::Dev), Outcome::Reply);
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let mut buf = Vec::new();
    if dispatcher().handle(data, &mut buf, Transport::Dev) != Outcome::NoReply {
        assert!(buf.len() >= 16);
        assert_eq!(u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize, buf.len());
    }
});
