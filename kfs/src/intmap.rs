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
/// spreads consecutive numbers over the high bits (the table's control
/// bytes) and, the factor being odd, keeps the low bits (its bucket index)
/// a bijection of the key's.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

const PHI: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
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

    #[test]
    fn consecutive_keys_spread_over_high_and_low_bits() {
        let hashes: Vec<u64> = (0u64..1024)
            .map(|k| {
                let mut h = IntHasher::default();
                h.write_u64(k);
                h.finish()
            })
            .collect();
        let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 1023).collect();
        assert!(top.len() > 100, "top 7 bits take {} values", top.len());
        assert_eq!(low.len(), 1024);
        let mut m: IntMap<u64, u64> = IntMap::default();
        for k in 0..10_000 {
            m.insert(k, k * 2);
        }
        assert!((0..10_000).all(|k| m[&k] == k * 2));
    }
}
