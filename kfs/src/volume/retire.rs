//! Retirements of the log (ARCHITECTURE.md §11): the store records the
//! changes logged since the last retirement touched, written as one batch
//! that is logged before it is copied into place; then the superblock
//! names the log's next entry and the log starts over. What goes into
//! the batch is the metadata store's business ([`crate::store::retire`]);
//! this is the volume's side: when to retire, and writing the batch.

use std::time::{Duration, Instant};

use kucofs_common::format::meta::BatchWrite;
use kucofs_common::format::{PAGE_LEN, PAGE_SIZE};
use kucofs_common::pm::Region;
use kucofs_common::Errno;

use super::Volume;
use crate::recovery::{each_write, RecoveryError};

/// Retirements of the log, counted and timed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retirements {
    /// Retirements since the volume was opened.
    pub count: u64,
    /// The longest one.
    pub longest: Duration,
    /// All of them.
    pub total: Duration,
    /// Store records written (inodes, entries, owner entries).
    pub records: u64,
    /// The longest since [`Volume::take_longest_retirement`] last asked.
    pub longest_recent: Duration,
}

/// Applies a batch's writes to the region and makes them durable: each
/// range with non-temporal stores, then one fence.
pub(crate) fn apply_batch(
    region: &Region,
    g: &kucofs_common::format::Geometry,
    batch: &[u8],
) -> std::result::Result<(), RecoveryError> {
    static ZEROS: [u8; PAGE_LEN] = [0; PAGE_LEN];
    each_write(g, batch, |w| {
        let done = match w {
            BatchWrite::Bytes(at, b) => region.write_nt(at, b),
            BatchWrite::Zero(at, len) => {
                let mut off = 0;
                let mut r = Ok(());
                while off < len && r.is_ok() {
                    let n = (len - off).min(PAGE_SIZE);
                    r = region.write_nt(at + off, &ZEROS[..n as usize]);
                    off += n;
                }
                r
            }
        };
        done.map_err(RecoveryError::WriteStore)
    })?;
    region.fence();
    Ok(())
}

impl Volume {
    /// Retirements of the log since the volume was opened (each also
    /// called a checkpoint).
    pub fn checkpoints(&self) -> u64 {
        self.retirements.count
    }

    /// Retirements of the log, counted and timed.
    pub fn retirements(&self) -> Retirements {
        self.retirements
    }

    /// The longest retirement since the last call.
    pub fn take_longest_retirement(&mut self) -> Duration {
        std::mem::take(&mut self.retirements.longest_recent)
    }

    /// Retires the log once its entries and the store records they call
    /// for reach [`Geometry::retire_bytes`](kucofs_common::format::Geometry::retire_bytes),
    /// or the pending record writes [`crate::store::RETIRE_WRITES`].
    pub(super) fn maybe_checkpoint(&mut self) {
        let due = self.image.superblock().geometry.retire_bytes();
        let st = self.ns.store();
        if self.log.fill() + st.pending_bytes() >= due
            || st.pending_writes() >= crate::store::RETIRE_WRITES
        {
            // Best effort: a retirement that fails changes nothing, and
            // the next change tries again before the log could not take
            // the retirement's batch.
            let _ = self.checkpoint();
        }
    }

    /// Retires the log: writes every store record the changes logged
    /// since the last retirement touched, as one batch logged before it
    /// is copied into place, then names the log's next entry in the
    /// superblock and starts the log over. Its work is proportional to
    /// those changes. A crash before the batch's end is durable leaves
    /// the store as it was and the changes in the log; after it, recovery
    /// applies the batch again.
    pub fn checkpoint(&mut self) -> std::result::Result<(), Errno> {
        if self.failed {
            return Err(Errno::EIO);
        }
        let t0 = Instant::now();
        let region = self.image.region();
        // The entries it covers are durable before it is.
        self.log.fence(region);
        self.batch.clear();
        let reserve = |p: u64| region.reserve(p * PAGE_SIZE, PAGE_SIZE).is_ok();
        let room = self.log.batch_room();
        let out = crate::store::retire(
            &mut self.ns,
            &mut self.pages,
            &mut self.batch,
            &reserve,
            room,
        )?;
        // The pages it takes were free, and may still be writable in a
        // client's view: read-only before the batch writes records there.
        self.protect_store_pages(&out.taken);
        // From here a failure leaves the bookkeeping ahead of the image:
        // the log, which still holds every change, is kept for recovery.
        if let Err(e) = self.write_retirement() {
            self.failed = true;
            return Err(e);
        }
        self.log.restart();
        crate::store::retired(&mut self.ns, &mut self.pages);
        let took = t0.elapsed();
        let r = &mut self.retirements;
        r.count += 1;
        r.total += took;
        r.longest = r.longest.max(took);
        r.longest_recent = r.longest_recent.max(took);
        r.records += out.inodes + out.entries + out.cleared + out.owners;
        Ok(())
    }

    /// Logs the batch [`crate::store::retire`] built, copies it into place,
    /// and names the next log entry in the superblock.
    fn write_retirement(&mut self) -> std::result::Result<(), Errno> {
        let g = self.image.superblock().geometry;
        let region = self.image.region();
        // A batch that writes outside the store is never logged (recovery
        // would refuse it).
        crate::recovery::each_write(&g, self.batch.bytes(), |_| Ok(())).map_err(|_| Errno::EIO)?;
        if !self.batch.bytes().is_empty() {
            self.log.append_batch(region, self.batch.bytes())?;
            apply_batch(region, &g, self.batch.bytes()).map_err(|_| Errno::EIO)?;
        }
        let mut next = self.image.superblock().clone();
        next.log_seq = self.log.next_seq();
        self.image.update_superblock(next).map_err(|_| Errno::EIO)
    }

    /// Retires the log if anything changed since the last retirement (Kfs
    /// calls this when idle).
    pub fn checkpoint_if_dirty(&mut self) -> std::result::Result<bool, Errno> {
        if self.log.entries() == 0 && self.ns.store().is_clean() {
            return Ok(false);
        }
        self.checkpoint()?;
        Ok(true)
    }
}
