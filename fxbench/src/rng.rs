//! A small, fast, deterministic pseudo-random generator for picking paths
//! inside a timed loop, where a call must cost a few instructions and runs
//! must repeat exactly.

/// Marsaglia's xorshift64 generator.
#[derive(Debug, Clone)]
pub struct XorShift64 {
    state: u64,
}

impl XorShift64 {
    /// A generator for stream `seed`; different seeds give unrelated
    /// sequences (the seed is scrambled by SplitMix64, and zero, the one
    /// state xorshift cannot leave, is avoided).
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        XorShift64 { state: z.max(1) }
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        x
    }

    /// A value in `0..n` (Lemire's multiply-shift: it takes the high
    /// bits, which xorshift mixes better than the low ones; the bias, at
    /// most n / 2^64, is immaterial here).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        let (mut a, mut b) = (XorShift64::new(7), XorShift64::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn different_seeds_give_different_sequences() {
        let (mut a, mut b) = (XorShift64::new(0), XorShift64::new(1));
        let same = (0..100).filter(|_| a.next_u64() == b.next_u64()).count();
        assert_eq!(same, 0);
    }

    #[test]
    fn below_covers_the_whole_range_and_nothing_more() {
        let mut rng = XorShift64::new(3);
        let mut seen = [0u32; 64];
        for _ in 0..64 * 200 {
            seen[usize::try_from(rng.below(64)).unwrap()] += 1;
        }
        assert_eq!(rng.below(1), 0);
        // Every bucket hit, none wildly over: about 200 each.
        assert!(seen.iter().all(|&c| (100..300).contains(&c)), "{seen:?}");
    }
}
