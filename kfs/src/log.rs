//! The operation log (ARCHITECTURE.md §10): checksummed redo
//! entries in the region's log area. An entry is written with
//! non-temporal stores before Kfs applies its change to the index, and
//! fenced before Kfs replies (the stores drain while the index changes),
//! so every acknowledged change survives a crash; a torn entry fails its
//! checksum and ends the log, which is right, since its change was never
//! acknowledged. Each entry is durable before the next one's first store,
//! so a damaged entry with valid ones after it is damage, not a crash.
//!
//! A retirement appends its batch of store records as entries too (see
//! [`Log::append_batch`]), then starts the log over at the area's
//! beginning with the next sequence number.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kucofs_common::format::{
    Area, Lap, LogEntryHeader, LOG_ENTRY_ALIGN, LOG_ENTRY_HEADER_SIZE, LOG_PAYLOAD_MAX,
};
use kucofs_common::pm::Region;
use kucofs_common::Errno;

use crate::record::{op, Record};

/// The write end of the log.
#[derive(Debug)]
pub struct Log {
    area: Area,
    /// The image's uuid, which keys every lap's checksums.
    uuid: [u8; 16],
    /// The lap being written.
    lap: Lap,
    /// Byte offset of the next entry within the area.
    pos: u64,
    /// Sequence number of the next entry.
    next_seq: u64,
    /// Entries appended since the last checkpoint.
    entries: u64,
    /// End of the part of the area whose pages are allocated (an emulated
    /// region allocates memory on first touch).
    prefaulted: u64,
    /// `pos`, published for the Kfs thread's page provisioning.
    published: Arc<AtomicU64>,
    /// An entry was appended and not yet fenced.
    unfenced: bool,
    buf: Vec<u8>,
}

/// Log pages are allocated this far ahead of the write position.
const PREFAULT_STEP: u64 = 2 << 20;

impl Log {
    /// The log of the image with `uuid`, in the lap that began at
    /// `first_seq`, positioned after `entries` valid entries ending at
    /// `pos`, the next of which gets sequence `next_seq`.
    pub fn new(
        area: Area,
        uuid: [u8; 16],
        first_seq: u64,
        pos: u64,
        next_seq: u64,
        entries: u64,
    ) -> Log {
        Log {
            area,
            uuid,
            lap: Lap::new(&uuid, first_seq),
            pos,
            next_seq,
            entries,
            prefaulted: pos,
            published: Arc::new(AtomicU64::new(pos)),
            unfenced: false,
            buf: Vec::with_capacity(4096),
        }
    }

    /// The area the log occupies.
    pub fn area(&self) -> Area {
        self.area
    }

    /// The write position, as the Kfs thread's provisioning reads it.
    pub fn position_handle(&self) -> Arc<AtomicU64> {
        self.published.clone()
    }

    /// Bytes in use.
    pub fn fill(&self) -> u64 {
        self.pos
    }

    /// Bytes the area holds.
    pub fn capacity(&self) -> u64 {
        self.area.len()
    }

    /// Entries since the last checkpoint.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Sequence number the next entry gets (a checkpoint taken now covers
    /// everything before it).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn encode(&mut self, rec: &Record) -> Result<(), Errno> {
        self.buf.clear();
        self.buf.resize(LOG_ENTRY_HEADER_SIZE, 0);
        let header = rec
            .encode(&mut self.buf)
            .and_then(|()| {
                LogEntryHeader::new(
                    &self.lap,
                    self.next_seq,
                    rec.op(),
                    &self.buf[LOG_ENTRY_HEADER_SIZE..],
                )
                .ok_or(Errno::ENAMETOOLONG)
            })
            // Nothing half-encoded is left for an append.
            .inspect_err(|_| self.buf.clear())?;
        self.buf[..LOG_ENTRY_HEADER_SIZE].copy_from_slice(&header.encode());
        let padded = header.footprint_len();
        self.buf.resize(padded, 0);
        Ok(())
    }

    /// Encodes `rec` as the next entry; `Ok(false)` if the log could not
    /// take it and then a batch of `batch` bytes (the caller retires the
    /// log, restarting it, and encodes again). `ENAMETOOLONG` for a record
    /// too long for any entry.
    pub fn prepare(&mut self, rec: &Record, batch: u64) -> Result<bool, Errno> {
        self.encode(rec)?;
        let len = self.buf.len() as u64;
        let after = self.pos + len;
        let chunks = batch / LOG_PAYLOAD_MAX as u64 + 1;
        Ok(after.saturating_add(Log::footprint(batch, chunks)) <= self.area.len())
    }

    /// Appends the entry [`prepare`](Self::prepare) encoded, after a fence:
    /// the non-temporal stores and flushed lines of this thread before it
    /// (a commit's data pages) are durable before any of the entry's
    /// stores is made. It is durable after the next [`fence`](Self::fence),
    /// which the caller makes before it replies. `ENOSPC` if it does not
    /// fit.
    pub fn append_prepared(&mut self, region: &Region) -> Result<(), Errno> {
        let len = self.buf.len() as u64;
        if len == 0 || self.pos + len > self.area.len() {
            return Err(Errno::ENOSPC);
        }
        if self.pos + len > self.prefaulted {
            let to = (self.pos + len)
                .max(self.prefaulted + PREFAULT_STEP)
                .min(self.area.len());
            region.prefault(self.area.offset() + self.prefaulted, to - self.prefaulted);
            self.prefaulted = to;
        }
        let at = self.area.offset() + self.pos;
        // A client thread applying its own commit left the commit's pages
        // unfenced (see `Direct::try_apply_after`). With nothing in flight
        // the fence costs a fraction of a nanosecond (a C loop here).
        region.fence();
        // Entries start on cache lines and are padded to whole lines, so
        // the non-temporal copy needs no flush; the fence makes it durable.
        region.write_nt(at, &self.buf).map_err(|_| Errno::EIO)?;
        self.unfenced = true;
        self.buf.clear();
        self.pos += len;
        self.published.store(self.pos, Ordering::Relaxed);
        self.next_seq += 1;
        self.entries += 1;
        Ok(())
    }

    /// Makes the entries appended so far durable: waits for their
    /// non-temporal stores to drain, unless none is pending. It must run
    /// on the thread that appended them (a fence waits for its own
    /// thread's stores only). Kfs applies a change to the index while its
    /// entry drains, and fences before it replies and before the volume's
    /// lock passes on: a reader may see a change a moment before its entry
    /// is durable (as a page cache shows a write before writing it back),
    /// and a crash in that moment loses the change, which was never
    /// acknowledged; no acknowledged change goes without its entry, and
    /// no entry is logged behind one that has not drained.
    pub fn fence(&mut self, region: &Region) {
        if std::mem::take(&mut self.unfenced) {
            region.fence();
        }
    }

    /// Appends a retirement's batch (the payload of its physical writes)
    /// as entries of at most [`LOG_PAYLOAD_MAX`] bytes, then an end entry
    /// naming the first: recovery applies a batch only if its end is
    /// there. Each entry is fenced before the next one is stored, as every
    /// entry is. `ENOSPC` if the log cannot hold it (the geometry sizes
    /// the log so that it always can).
    pub fn append_batch(&mut self, region: &Region, payload: &[u8]) -> Result<(), Errno> {
        let chunks = payload.chunks(LOG_PAYLOAD_MAX).count() as u64;
        if self.pos + Log::footprint(payload.len() as u64, chunks) > self.area.len() {
            return Err(Errno::ENOSPC);
        }
        let first = self.next_seq;
        for chunk in payload.chunks(LOG_PAYLOAD_MAX) {
            self.append_raw(region, op::BATCH, chunk)?;
            self.fence(region);
        }
        let mut end = Vec::with_capacity(16);
        end.extend_from_slice(&first.to_le_bytes());
        end.extend_from_slice(&chunks.to_le_bytes());
        self.append_raw(region, op::BATCH_END, &end)?;
        self.fence(region);
        Ok(())
    }

    /// The largest batch payload the log can still take.
    pub fn batch_room(&self) -> u64 {
        let free = self.area.len() - self.pos;
        free.saturating_sub(Log::footprint(0, free / LOG_PAYLOAD_MAX as u64 + 1))
    }

    /// Bytes a batch of `len` payload bytes in `chunks` entries takes in
    /// the log, with the headers, padding and the end entry.
    pub fn footprint(len: u64, chunks: u64) -> u64 {
        len + chunks * (LOG_ENTRY_HEADER_SIZE as u64 + LOG_ENTRY_ALIGN) + LOG_ENTRY_ALIGN
    }

    fn append_raw(&mut self, region: &Region, op: u16, payload: &[u8]) -> Result<(), Errno> {
        self.buf.clear();
        let header =
            LogEntryHeader::new(&self.lap, self.next_seq, op, payload).ok_or(Errno::EINVAL)?;
        self.buf.extend_from_slice(&header.encode());
        self.buf.extend_from_slice(payload);
        self.buf.resize(header.footprint_len(), 0);
        self.append_prepared(region)
    }

    /// Makes the valid entries at `stale` (byte offsets in the area, past
    /// the write position) invalid, durably, by clearing the cache line
    /// each starts on (its header). After a crash these are the entries
    /// of a retirement's batch whose end never became durable: new entries
    /// go where the batch began, and must not end up followed by a valid
    /// leftover of it, which would read as an acknowledged entry after a
    /// damaged one. Past the batch, the area holds nothing valid of this
    /// lap (recovery checks that before it gets here).
    pub fn invalidate(&mut self, region: &Region, stale: &[u64]) -> Result<(), Errno> {
        if stale.is_empty() {
            return Ok(());
        }
        // Last to first, each durable before the next: at any crash the
        // batch's valid entries are still a run from its start (a batch
        // without its end, again), never a gap followed by valid ones.
        for &at in stale.iter().rev() {
            let line = self.area.offset() + at;
            region
                .fill(line, LOG_ENTRY_ALIGN, 0)
                .and_then(|()| region.flush(line, LOG_ENTRY_ALIGN))
                .map_err(|_| Errno::EIO)?;
            region.fence();
        }
        Ok(())
    }

    /// Starts over at the area's beginning after a retirement that wrote
    /// everything before `next_seq` into the store. Old entries need no
    /// erasing: their sequence numbers are all lower, so a scan from
    /// `next_seq` stops at them. The pages written so far stay allocated,
    /// so `prefaulted` stays where it is.
    pub fn restart(&mut self) {
        self.lap = Lap::new(&self.uuid, self.next_seq);
        self.pos = 0;
        self.published.store(0, Ordering::Relaxed);
        self.entries = 0;
    }
}
