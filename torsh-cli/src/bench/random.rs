//! Random host inputs for the peers (ours draws its own with `Backend::randn`).

/// `len` values uniform in [-1, 1) from a xorshift generator (never all zeros).
pub fn random_host(len: usize, seed: u64) -> Vec<f32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_inputs_are_random_and_in_range() {
        let x = super::random_host(1000, 3);
        assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
        assert!(x.iter().filter(|v| **v != 0.0).count() > 990);
        assert_ne!(x, super::random_host(1000, 4));
    }
}
