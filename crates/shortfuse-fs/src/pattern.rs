//! Reproducible file contents for the tests and benchmarks of the file
//! systems, made without a dependency.

/// `len` bytes of an xorshift stream seeded by `seed`: the same for the
/// same seed, and never one repeated byte, so that a copy which moved the
/// wrong block shows.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
