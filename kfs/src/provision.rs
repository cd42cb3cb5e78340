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

    /// Populates one chunk ahead of use, if any is due; false if all is
    /// provisioned.
    pub fn step(&mut self) -> bool {
        let used = self.index.load_u64(HDR_USED, Ordering::Relaxed);
        let target = (used + AHEAD).min(self.index.len());
        if self.index_done < used {
            // Allocation overtook us: what lies behind was touched anyway.
            self.index_done = used;
        }
        if self.index_done < target {
            let n = CHUNK.min(target - self.index_done);
            self.index.populate(self.index_done, n);
            self.index_done += n;
            return true;
        }
        let pos = self.log_pos.load(Ordering::Relaxed);
        let target = (pos + AHEAD).min(self.log.len());
        if self.log_done < pos {
            self.log_done = pos;
        }
        if self.log_done < target {
            let n = CHUNK.min(target - self.log_done);
            self.region.prefault(self.log.offset() + self.log_done, n);
            self.log_done += n;
            return true;
        }
        false
    }
}
