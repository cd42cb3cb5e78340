//! Memory provisioning ahead of use. Index items and log entries land on
//! pages that the kernel allocates (and zeroes) on first touch — for an
//! emulated region, for the index always. Touching a fresh page costs a
//! fault and a page clear, a few microseconds, on the path of the request
//! that happens to touch it. The Kfs thread, when it has nothing to serve,
//! populates the pages just ahead of the index's allocation point and the
//! log's write position instead, so requests find them ready.
//!
//! Populating needs no lock: it changes no contents, only makes pages
//! present, and may run while another thread writes nearby.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kucofs_common::format::Area;
use kucofs_common::index::layout::HDR_USED;
use kucofs_common::pm::{Region, Shm, Words};

/// Pages are kept populated this far ahead of use.
const AHEAD: u64 = 32 << 20;
/// One step populates this much, so a step never delays a queued request
/// by much.
const CHUNK: u64 = 512 << 10;

/// The Kfs thread's background page provisioning.
#[derive(Debug)]
pub struct Provisioner {
    index: Arc<Shm>,
    region: Arc<Region>,
    log: Area,
    log_pos: Arc<AtomicU64>,
    index_done: u64,
    log_done: u64,
}

impl Provisioner {
    /// Provisioning for an index and a region's log area whose write
    /// position `log_pos` publishes.
    pub fn new(index: Arc<Shm>, region: Arc<Region>, log: Area, log_pos: Arc<AtomicU64>) -> Self {
        Provisioner {
            index,
            region,
            log,
            log_pos,
            index_done: 0,
            log_done: 0,
        }
    }

    /// True if a chunk is due: [`Provisioner::step`] would populate one.
    pub fn is_due(&self) -> bool {
        let used = self.index.load_u64(HDR_USED, Ordering::Relaxed);
        let pos = self.log_pos.load(Ordering::Relaxed);
        let (mut index_done, mut log_done) = (self.index_done, self.log_done);
        due(&mut index_done, used, self.index.len()).is_some()
            || due(&mut log_done, pos, self.log.len()).is_some()
    }

    /// Populates one chunk ahead of use, if any is due; false if all is
    /// provisioned.
    pub fn step(&mut self) -> bool {
        let used = self.index.load_u64(HDR_USED, Ordering::Relaxed);
        if let Some(n) = due(&mut self.index_done, used, self.index.len()) {
            self.index.populate(self.index_done, n);
            self.index_done += n;
            return true;
        }
        let pos = self.log_pos.load(Ordering::Relaxed);
        if let Some(n) = due(&mut self.log_done, pos, self.log.len()) {
            self.region.prefault(self.log.offset() + self.log_done, n);
            self.log_done += n;
            return true;
        }
        false
    }
}

/// The bytes to populate next from `done`, for a space of `len` bytes used
/// up to `at`: a whole [`CHUNK`] once that much of the [`AHEAD`] window is
/// unpopulated, or the rest of the space at its end. Never less: the
/// window slides on by a few bytes with every allocation or log entry, and
/// populating such slivers would cost a system call for each.
fn due(done: &mut u64, at: u64, len: u64) -> Option<u64> {
    // Use overtook provisioning: what lies behind was touched anyway.
    *done = (*done).max(at);
    let target = at.saturating_add(AHEAD).min(len);
    let left = target.saturating_sub(*done);
    (left >= CHUNK || (left > 0 && target == len)).then(|| left.min(CHUNK))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provisioning_goes_in_whole_chunks_except_at_the_end() {
        let len = 4 * AHEAD;
        let mut done = 0;
        assert_eq!(due(&mut done, 0, len), Some(CHUNK));
        // Everything ahead populated: a few bytes more use is not a chunk.
        done = AHEAD;
        assert_eq!(due(&mut done, 64, len), None);
        assert_eq!(due(&mut done, CHUNK - 1, len), None);
        assert_eq!(due(&mut done, CHUNK, len), Some(CHUNK));
        // Use that overtook provisioning moves it on.
        done = 0;
        assert_eq!(due(&mut done, 3 * AHEAD, len), Some(CHUNK));
        assert_eq!(done, 3 * AHEAD);
        // Near the end, the rest, however short.
        done = len - 100;
        assert_eq!(due(&mut done, len - AHEAD, len), Some(100));
        done = len;
        assert_eq!(due(&mut done, len - 10, len), None);
    }
}
