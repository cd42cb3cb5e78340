//! Hash maps keyed by numbers Kfs hands out itself: inode numbers, client
//! numbers and slot numbers. Std's default hasher guards against keys an
//! adversary picks, at the cost of a keyed hash on every lookup; these keys
//! are Kfs's own, and a commit looks up several of them, so one
//! multiplication does.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hash map keyed by a number Kfs assigned.
pub(crate) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// Fibonacci hashing of an integer key: one multiplication by 2^64/φ
/// spreads the key over the high bits (the table's control bytes). The
/// low bits (its bucket index) would depend on the key's low bits only, so
/// the high half, multiplied once more, is folded into them: keys alike in
/// their low bits (multiples of a power of two) do not share a bucket.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

/// 2^64 / φ, odd.
pub(crate) const PHI: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        let x = self.0 ^ (self.0 >> 32);
        x ^ (x.wrapping_mul(PHI) >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(29) ^ n).wrapping_mul(PHI);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(k: u64) -> u64 {
        let mut h = IntHasher::default();
        h.write_u64(k);
        h.finish()
    }

    #[test]
    fn consecutive_keys_spread_over_high_and_low_bits() {
        // Consecutive keys, and keys that share their low 20 bits.
        for step in [1u64, 1 << 20] {
            let hashes: Vec<u64> = (0u64..1024).map(|k| hash(k * step)).collect();
            let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
            let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 1023).collect();
            assert!(
                top.len() > 100,
                "step {step}: top 7 bits take {} values",
                top.len()
            );
            // 1,024 keys thrown at random into 1,024 buckets fill about 647.
            assert!(
                low.len() > 550,
                "step {step}: low 10 bits take {} values",
                low.len()
            );
        }
        let mut m: IntMap<u64, u64> = IntMap::default();
        for k in 0..10_000 {
            m.insert(k, k * 2);
        }
        assert!((0..10_000).all(|k| m[&k] == k * 2));
    }
}
