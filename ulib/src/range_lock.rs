//! Byte-range locks of one file inside a process (DESIGN §8).

use parking_lot::{Condvar, Mutex};

/// Locks on byte ranges of one file.
#[derive(Debug, Default)]
pub struct RangeLock {
    held: Mutex<Vec<(u64, u64)>>,
    freed: Condvar,
}

/// A held range; unlocked on drop.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    range: (u64, u64),
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl RangeLock {
    /// No range held.
    pub fn new() -> RangeLock {
        RangeLock::default()
    }

    /// Locks `[start, end)`, waiting while an overlapping range is held.
    pub fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let mut held = self.held.lock();
        while held.iter().any(|&r| overlaps(r, (start, end))) {
            self.freed.wait(&mut held);
        }
        held.push((start, end));
        RangeGuard {
            lock: self,
            range: (start, end),
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.lock.held.lock();
        if let Some(i) = held.iter().position(|&r| r == self.range) {
            held.swap_remove(i);
        }
        self.lock.freed.notify_all();
    }
}
