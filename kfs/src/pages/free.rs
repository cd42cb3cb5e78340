//! The free data pages as a bitmap, with two summaries that find the lowest
//! free page and the lowest run of free pages covering a whole aligned
//! group of 64 in a few word reads, however scattered the free pages are.
//!
//! Overwrites free pages one at a time all over the data area. An ordered
//! map of free runs grows a node for each such page and costs a tree walk
//! (cache misses on a large tree) for every page freed and every grant; the
//! bitmap costs a bit, and its summaries a bit each when a word changes.

/// Free pages, by index from the first data page.
#[derive(Debug)]
pub(super) struct FreeMap {
    /// Bit `i % 64` of word `i / 64`: page `i` is free.
    words: Vec<u64>,
    /// Bit `w % 64` of word `w / 64`: word `w` has a free page.
    any: Vec<u64>,
    /// Bit `w % 64` of word `w / 64`: every page of word `w` is free.
    full: Vec<u64>,
    /// The lowest word of `any` with a bit set (its length if none).
    any_from: usize,
    /// The lowest word of `full` with a bit set (its length if none).
    full_from: usize,
    /// Pages free.
    count: u64,
    /// Pages in all.
    len: u64,
}

/// Sets or clears bit `bit` of `summary`, keeping `from` at its lowest
/// word with a bit set (or past the end): lowered when a bit is set below
/// it, moved up past the empty words when its word empties.
fn mark(summary: &mut [u64], from: &mut usize, bit: usize, on: bool) {
    let (w, b) = (bit / 64, bit % 64);
    if on {
        summary[w] |= 1 << b;
        *from = (*from).min(w);
    } else {
        summary[w] &= !(1 << b);
        while *from < summary.len() && summary[*from] == 0 {
            *from += 1;
        }
    }
}

/// The lowest bit set in `summary`, whose lowest word with a bit set is
/// `from`.
fn lowest(summary: &[u64], from: usize) -> Option<usize> {
    let s = *summary.get(from)?;
    Some(from * 64 + s.trailing_zeros() as usize)
}

impl FreeMap {
    /// `len` pages, none of them free.
    pub(super) fn new(len: u64) -> FreeMap {
        let words = super::page_index(len).div_ceil(64);
        let summary = words.div_ceil(64);
        FreeMap {
            words: vec![0; words],
            any: vec![0; summary],
            full: vec![0; summary],
            any_from: summary,
            full_from: summary,
            count: 0,
            len,
        }
    }

    /// Pages free.
    pub(super) fn count(&self) -> u64 {
        self.count
    }

    /// True if page `i` is free.
    #[cfg(test)]
    pub(super) fn is_free(&self, i: u64) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Marks pages `i..i + n` free (`on`) or not, counting only those
    /// whose state changes.
    pub(super) fn set(&mut self, i: u64, n: u64, on: bool) {
        debug_assert!(i + n <= self.len);
        let mut at = i;
        let end = i + n;
        while at < end {
            let w = (at / 64) as usize;
            let b = at % 64;
            let k = (end - at).min(64 - b);
            let mask = if k == 64 { !0 } else { ((1u64 << k) - 1) << b };
            let old = self.words[w];
            let new = if on { old | mask } else { old & !mask };
            if new != old {
                if on {
                    self.count += u64::from((new & !old).count_ones());
                } else {
                    self.count -= u64::from((old & !new).count_ones());
                }
                self.words[w] = new;
                if (old != 0) != (new != 0) {
                    mark(&mut self.any, &mut self.any_from, w, new != 0);
                }
                if (old == !0) != (new == !0) {
                    mark(&mut self.full, &mut self.full_from, w, new == !0);
                }
            }
            at += k;
        }
    }

    /// The lowest free page.
    pub(super) fn lowest(&self) -> Option<u64> {
        let w = lowest(&self.any, self.any_from)?;
        Some(w as u64 * 64 + u64::from(self.words[w].trailing_zeros()))
    }

    /// The first page of the lowest run of free pages that covers a whole
    /// aligned group of 64 (every run of 127 pages or more does, and none
    /// shorter than 64).
    pub(super) fn lowest_long(&self) -> Option<u64> {
        let w = lowest(&self.full, self.full_from)?;
        // The run reaches back into the word before, which is not full
        // (else it would be the lowest full word): by its top free bits.
        let back = match w.checked_sub(1) {
            Some(prev) => u64::from(self.words[prev].leading_ones()),
            None => 0,
        };
        Some(w as u64 * 64 - back)
    }

    /// How many pages from `i` on are free in a row, counting no further
    /// than `max`.
    pub(super) fn run_from(&self, i: u64, max: u64) -> u64 {
        let mut at = i;
        while at < self.len && at - i < max {
            let w = (at / 64) as usize;
            let b = at % 64;
            let ones = u64::from((self.words[w] >> b).trailing_ones()).min(64 - b);
            at += ones;
            if ones < 64 - b {
                break;
            }
        }
        (at - i).min(max).min(self.len - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pages::page_index;

    /// The free pages by a scan of every page.
    fn scan(f: &FreeMap) -> Vec<u64> {
        (0..f.len).filter(|&i| f.is_free(i)).collect()
    }

    #[test]
    fn marks_count_and_find_the_lowest_free_page() {
        let mut f = FreeMap::new(300);
        assert_eq!(f.lowest(), None);
        assert_eq!(f.lowest_long(), None);
        f.set(10, 200, true);
        assert_eq!(f.count(), 200);
        assert_eq!(f.lowest(), Some(10));
        // Marking again changes nothing, nor the count.
        f.set(50, 20, true);
        assert_eq!(f.count(), 200);
        f.set(10, 5, false);
        assert_eq!(f.count(), 195);
        assert_eq!(f.lowest(), Some(15));
        assert_eq!(f.run_from(15, u64::MAX), 195);
        assert_eq!(f.run_from(15, 7), 7);
        assert_eq!(f.run_from(5, 7), 0);
        // The lowest page freed later, below the earlier lowest, is found.
        f.set(3, 1, true);
        assert_eq!(f.lowest(), Some(3));
        assert_eq!(f.run_from(3, u64::MAX), 1);
        assert_eq!(scan(&f).len() as u64, f.count());
        // The last pages, in a partial last word.
        f.set(290, 10, true);
        assert_eq!(f.run_from(290, u64::MAX), 10);
        assert!(!f.is_free(300));
    }

    #[test]
    fn a_long_run_covers_an_aligned_group_and_starts_where_its_pages_do() {
        let mut f = FreeMap::new(1024);
        // 64 free pages not aligned to a group: not long.
        f.set(100, 64, true);
        assert_eq!(f.lowest_long(), None);
        // 127 from 300: covers 320..384, and starts at 300.
        f.set(300, 127, true);
        assert_eq!(f.lowest_long(), Some(300));
        assert_eq!(f.run_from(300, u64::MAX), 127);
        // Taking a page of the group leaves no long run; a longer run
        // covers the next group too, and then starts after that page.
        f.set(330, 1, false);
        assert_eq!(f.lowest_long(), None);
        f.set(427, 73, true);
        assert_eq!(f.lowest_long(), Some(331));
        assert_eq!(f.run_from(331, u64::MAX), 169);
        // An aligned group at 0 has nothing before it.
        f.set(0, 64, true);
        assert_eq!(f.lowest_long(), Some(0));
        assert_eq!(f.run_from(0, u64::MAX), 64);
    }

    #[test]
    fn random_changes_agree_with_a_page_by_page_model() {
        let len = 700;
        let mut f = FreeMap::new(len);
        let mut model = vec![false; page_index(len)];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for _ in 0..3000 {
            let i = next(len);
            let n = next(len - i).min(next(150)) + 1;
            let on = next(3) != 0;
            f.set(i, n, on);
            for m in &mut model[page_index(i)..page_index(i + n)] {
                *m = on;
            }
            let free: Vec<u64> = (0..len).filter(|&p| model[page_index(p)]).collect();
            assert_eq!(scan(&f), free);
            assert_eq!(f.count(), free.len() as u64);
            assert_eq!(f.lowest(), free.first().copied());
            // The lowest long run, by the model: the first free page of a
            // run that holds a whole free aligned group.
            let long = (0..len / 64)
                .find(|g| (g * 64..g * 64 + 64).all(|p| model[page_index(p)]))
                .map(|g| {
                    let mut s = g * 64;
                    while s > 0 && model[page_index(s) - 1] {
                        s -= 1;
                    }
                    s
                });
            assert_eq!(f.lowest_long(), long);
            let at = next(len);
            let run = (at..len).take_while(|&p| model[page_index(p)]).count() as u64;
            assert_eq!(f.run_from(at, u64::MAX), run);
            assert_eq!(f.run_from(at, 5), run.min(5));
        }
    }
}
