//! Reproducible file contents and random streams for the tests, checks and
//! benchmarks of the file systems, made without a dependency.

/// xorshift64 (shifts 13, 7, 17): a reproducible stream, not a
/// cryptographic one. The state must not be zero.
pub struct Xorshift(pub u64);

impl Xorshift {
    /// Any seed, spread over the state (never zero).
    pub fn seeded(seed: u64) -> Xorshift {
        Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `len` bytes of the [`Xorshift`] stream seeded by `seed`: the same for
/// the same seed, and never one repeated byte, so that a copy which moved
/// the wrong block shows.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = Xorshift::seeded(seed);
    (0..len).map(|_| x.next_u64() as u8).collect()
}
