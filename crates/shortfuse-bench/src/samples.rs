//! Per-operation latency samples and the figure they summarise to.

use std::io;
use std::time::Instant;

use crate::report::Figure;

/// Per-operation samples in nanoseconds.
#[derive(Default)]
pub struct Samples(pub Vec<u64>);

impl Samples {
    pub fn with_capacity(n: usize) -> Samples {
        Samples(Vec::with_capacity(n))
    }

    /// Runs `op` once and keeps its duration.
    pub fn time<T>(&mut self, op: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let t = Instant::now();
        let r = op()?;
        self.0.push(t.elapsed().as_nanos() as u64);
        Ok(r)
    }

    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// [`Samples::figure`] with the median as its value, and the mean kept
    /// beside p50 and p99.
    pub fn median_figure(self, op: &str) -> Figure {
        let f = self.figure(op);
        Figure {
            value: f.p50.unwrap_or(f.value),
            mean: Some(f.value),
            ..f
        }
    }

    /// Mean, p50 and p99 in microseconds.
    pub fn figure(mut self, op: &str) -> Figure {
        self.0.sort_unstable();
        let n = self.0.len().max(1);
        let mean = self.0.iter().sum::<u64>() as f64 / n as f64;
        let pct = |p: f64| self.0.get(((n as f64 * p) as usize).min(n - 1)).copied().unwrap_or(0) as f64;
        Figure {
            op: op.to_string(),
            unit: "us".into(),
            value: mean / 1e3,
            p50: Some(pct(0.50) / 1e3),
            p99: Some(pct(0.99) / 1e3),
            samples: self.0.len() as u64,
            lower_is_better: true,
            ..Figure::default()
        }
    }
}

/// A small, fast, seedable generator (xorshift64*): workloads need
/// reproducible offsets and sizes, not cryptographic randomness.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        (-2.0 * self.unit().ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }

    /// Gamma-distributed with the given mean and shape (Marsaglia and Tsang),
    /// as filebench draws file sizes.
    pub fn gamma(&mut self, mean: f64, shape: f64) -> f64 {
        let boost = if shape < 1.0 {
            self.unit().powf(1.0 / shape)
        } else {
            1.0
        };
        let k = if shape < 1.0 { shape + 1.0 } else { shape };
        let d = k - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.unit();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v * boost * mean / shape;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_mean_is_close() {
        let mut r = Rng::new(7);
        let n = 20_000;
        let mean = (0..n).map(|_| r.gamma(128.0, 1.5)).sum::<f64>() / n as f64;
        assert!((mean - 128.0).abs() < 6.0, "{mean}");
    }

    #[test]
    fn percentiles_come_from_sorted_samples() {
        let f = Samples((1..=100).rev().map(|i| i * 1000).collect()).figure("x");
        assert_eq!(f.p50, Some(51.0));
        assert_eq!(f.p99, Some(100.0));
        assert!((f.value - 50.5).abs() < 1e-9);
    }
}
