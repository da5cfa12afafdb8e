//! The crate's counter-based random generator. Value `i` of a stream depends only on the seed and `i`,
//! so any backend (a CPU thread, a GPU thread) can produce any element independently and every backend
//! produces the same numbers for the same seed.
//!
//! Uniform values come from a SplitMix64 hash of `(seed, i)`, keeping the top 53 bits. Normal values use
//! the Box–Muller transform on uniforms `2i` and `2i + 1` (the cosine branch).

/// The golden-ratio increment of SplitMix64 (2^64 / φ), which spaces the streams' counters.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijective 64-bit mix.
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64 random bits for element `index` of stream `seed`.
pub const fn bits(seed: u64, index: u64) -> u64 {
    keyed_bits(stream_key(seed), index)
}

/// The key of stream `seed`, `mix64(seed ^ GOLDEN)`: what [`keyed_bits`] takes, computed once per
/// stream rather than per element.
pub const fn stream_key(seed: u64) -> u64 {
    mix64(seed ^ GOLDEN)
}

/// [`bits`] for element `index` of the stream whose key is `key` ([`stream_key`]).
pub const fn keyed_bits(key: u64, index: u64) -> u64 {
    mix64(key.wrapping_add(index.wrapping_mul(GOLDEN)))
}

/// Uniform on `[0, 1)` for element `index` of stream `seed`.
pub fn uniform(seed: u64, index: u64) -> f64 {
    (bits(seed, index) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Standard normal for element `index` of stream `seed`.
pub fn normal(seed: u64, index: u64) -> f64 {
    let u1 = 1.0 - uniform(seed, index.wrapping_mul(2)); // (0, 1]: ln is finite
    let u2 = uniform(seed, index.wrapping_mul(2).wrapping_add(1));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A sequential host-side generator over the same streams, for test inputs and host-made data.
#[derive(Clone, Debug)]
pub struct HostRng {
    seed: u64,
    counter: u64,
}

impl HostRng {
    /// A generator for stream `seed`, starting at element 0.
    pub fn new(seed: u64) -> Self {
        HostRng { seed, counter: 0 }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.counter += 1;
        bits(self.seed, self.counter - 1)
    }

    /// The next uniform value on `[low, high)`.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        self.counter += 1;
        low + (high - low) * uniform(self.seed, self.counter - 1)
    }

    /// The next standard normal value.
    pub fn normal(&mut self) -> f64 {
        self.counter += 1;
        normal(self.seed, self.counter - 1)
    }

    /// `n` uniform values on `[low, high)`.
    pub fn uniform_vec(&mut self, n: usize, low: f64, high: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(low, high)).collect()
    }

    /// A uniformly random permutation of `0..n` (Fisher–Yates).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            p.swap(i, j);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_have_plausible_moments() {
        let n = 20_000u64;
        let mean_u: f64 = (0..n).map(|i| uniform(7, i)).sum::<f64>() / n as f64;
        assert!((mean_u - 0.5).abs() < 0.01, "{mean_u}");
        let xs: Vec<f64> = (0..n).map(|i| normal(7, i)).collect();
        let m = xs.iter().sum::<f64>() / n as f64;
        let v = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
        assert!(m.abs() < 0.03 && (v - 1.0).abs() < 0.05, "{m} {v}");
        assert_ne!(uniform(1, 0), uniform(2, 0));
        let mut p = HostRng::new(3).permutation(10);
        p.sort_unstable();
        assert_eq!(p, (0..10).collect::<Vec<_>>());
    }
}
