//! Recovery (ARCHITECTURE.md §12): the namespace an image
//! describes, rebuilt from its metadata store and its log.
//!
//! The log holds, from its start, the entries logged since the last
//! retirement that reached the superblock: redo records of changes, and
//! the batches of store records of retirements that did not (each a run
//! of batch entries closed by an end entry). Recovery
//!
//! 1. walks the log, and tells a torn end (a crash) from damage (a bad
//!    entry with acknowledged ones after it, which it refuses);
//! 2. applies every complete batch to the store, in order: a batch holds
//!    whole records at fixed places, so applying one again changes
//!    nothing, whatever part of it reached the store before the crash; a
//!    batch without its end was never applied and is ignored;
//! 3. loads the store, one pass over its pages;
//! 4. replays the records after the last complete batch, in order: the
//!    store held everything before it.
//!
//! 5. invalidates the entries of a batch left without its end, and
//!    retires the log: what the replay changed goes into the store, and
//!    the log starts over (`open`).
//!
//! Its work is one pass over the store plus the log, which holds at most
//! a retirement period's entries. [`recover`] does steps 1 to 4
//! read-only, for fsck, with the batches applied to an in-memory
//! [`Overlay`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use kucofs_common::format::meta::{batch_writes, BatchWrite, RecordFault};
use kucofs_common::format::{
    find_damage, scan_log_with, Geometry, Lap, LogDamage, LogEnd, Superblock, PAGE_LEN, PAGE_SIZE,
};
use kucofs_common::pm::Persist;
use kucofs_common::Errno;

use crate::image::Image;
use crate::log::Log;
use crate::namespace::Namespace;
use crate::pages::{HeldPagesError, Pages};
use crate::record::{op, Record};
use crate::store::{LoadError, Loaded};
use crate::volume::{apply_batch, Volume};
use crate::Error;

/// Why recovery could not rebuild the file system of an image. Each names
/// what it found where (a log entry's sequence, a page, a byte range);
/// [`Error::Recovery`] adds the image's path.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// A batch end entry with no batch entries before it.
    #[error("log entry {seq}: a batch end with no batch")]
    BatchEndAlone { seq: u64 },
    /// A batch end entry whose first sequence or length is not its batch's.
    #[error("log entry {seq}: a batch end that does not match its batch")]
    BatchEndMismatch { seq: u64 },
    /// A change logged between a batch's entries and its end.
    #[error("log entry {seq}: a change inside a batch")]
    ChangeInsideBatch { seq: u64 },
    /// An entry that fails its checks with acknowledged entries after it.
    #[error("{0}")]
    Damaged(LogDamage),
    /// A batch's records do not decode.
    #[error("a retirement batch in the log: {0}")]
    BadBatch(RecordFault),
    /// A batch writes outside the owner table and the data pages.
    #[error("a retirement batch in the log writes {len} bytes at {at}, outside the store")]
    BatchOutsideStore { at: u64, len: u64 },
    /// A batch names a page past the image's end.
    #[error("page {page} is outside the image")]
    PageOutsideImage { page: u64 },
    /// Applying a batch to the store failed.
    #[error("writing the store: {0}")]
    WriteStore(kucofs_common::Error),
    /// The metadata store does not load ([`LoadError`] says why and
    /// where).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A redo record in the log does not decode.
    #[error("log entry {seq}: undecodable: {errno:?}")]
    Undecodable { seq: u64, errno: Errno },
    /// A redo record in the log could not be applied.
    #[error("log entry {seq}: replay failed: {errno:?}")]
    Replay { seq: u64, errno: Errno },
    /// The pages the rebuilt files and store hold are not a set of data
    /// pages.
    #[error(transparent)]
    HeldPages(#[from] HeldPagesError),
    /// The entries of a batch left without its end could not be made
    /// invalid.
    #[error("clearing a batch left without its end: {0:?}")]
    ClearStale(Errno),
    /// The retirement that ends recovery failed.
    #[error("retiring the log after recovery: {0:?}")]
    Retire(Errno),
}

/// What recovery found in the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Redo records replayed.
    pub entries: u64,
    /// Bytes the log's valid entries occupy.
    pub bytes: u64,
    /// Complete retirement batches applied.
    pub batches: u64,
}

/// The log of an image, walked: what to apply and what to replay.
#[derive(Debug, Default)]
pub struct Scanned {
    /// The payloads of the complete batches, in order (each the
    /// concatenation of its entries' payloads).
    pub batches: Vec<Vec<u8>>,
    /// The redo records after the last complete batch: (sequence,
    /// operation, payload).
    pub replay: Vec<(u64, u16, Vec<u8>)>,
    /// Where new entries go: past the last valid entry, or at the start
    /// of a batch that has no end (it is overwritten).
    pub head: LogEnd,
    /// The offsets of the entries of a batch that has no end, past
    /// `head`: they are made invalid before anything is written.
    pub stale: Vec<u64>,
}

/// Walks the log of the image `sb` describes, reading image bytes through
/// `read`. Fails on damage: an entry that fails its checks with
/// acknowledged entries after it, or entries in an order no run of Kfs
/// writes.
pub fn scan(
    sb: &Superblock,
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<Scanned, RecoveryError> {
    let g = &sb.geometry;
    let base = g.log.offset();
    let area = |at: u64, buf: &mut [u8]| read(base + at, buf);
    let mut out = Scanned::default();
    // An open batch: where it starts, its first sequence, its payload.
    let mut open: Option<(u64, u64, Vec<u8>)> = None;
    let mut batch_entries = Vec::new();
    let mut fault = None;
    let lap = Lap::of(sb);
    let end = scan_log_with(g.log.len(), &lap, area, |at, h, payload| {
        if fault.is_some() {
            return;
        }
        match h.op {
            op::BATCH => {
                if open.is_none() {
                    batch_entries.clear();
                }
                let b = open.get_or_insert_with(|| (at, h.seq, Vec::new()));
                b.2.extend_from_slice(payload);
                batch_entries.push(at);
            }
            op::BATCH_END => {
                let Some((_, first, body)) = open.take() else {
                    fault = Some(RecoveryError::BatchEndAlone { seq: h.seq });
                    return;
                };
                let mut want = [0u8; 16];
                want[..8].copy_from_slice(&first.to_le_bytes());
                want[8..].copy_from_slice(&(h.seq - first).to_le_bytes());
                if payload != want {
                    fault = Some(RecoveryError::BatchEndMismatch { seq: h.seq });
                    return;
                }
                out.batches.push(body);
                // Everything before the batch is in it.
                out.replay.clear();
            }
            _ if open.is_some() => {
                fault = Some(RecoveryError::ChangeInsideBatch { seq: h.seq });
            }
            _ => out.replay.push((h.seq, h.op, payload.to_vec())),
        }
    });
    if let Some(f) = fault {
        return Err(f);
    }
    if !sb.clean {
        if let Some(d) = find_damage(g.log.len(), &lap, &end, area) {
            return Err(RecoveryError::Damaged(d));
        }
    }
    out.head = end;
    if let Some((at, first, _)) = open {
        // A batch whose end never became durable: its retirement did not
        // happen, and new entries go where it began.
        out.head.pos = at;
        out.head.next_seq = first;
        out.head.entries -= end.next_seq - first;
        out.stale = batch_entries;
    }
    Ok(out)
}

/// Checks that a batch writes only inside the owner table and the data
/// pages, and hands each of its writes to `apply`, in order.
pub fn each_write(
    g: &Geometry,
    batch: &[u8],
    mut apply: impl FnMut(BatchWrite<'_>) -> Result<(), RecoveryError>,
) -> Result<(), RecoveryError> {
    let lo = g.owners.offset();
    let hi = g.size;
    for w in batch_writes(batch) {
        let w = w.map_err(RecoveryError::BadBatch)?;
        let (at, len) = w.range();
        if at < lo || at.checked_add(len).is_none_or(|e| e > hi) {
            return Err(RecoveryError::BatchOutsideStore { at, len });
        }
        apply(w)?;
    }
    Ok(())
}

/// The image as it reads with the complete batches applied, without
/// writing it (for fsck): the pages the batches touch, held in memory.
#[derive(Debug, Default)]
pub struct Overlay {
    pages: HashMap<u64, Box<[u8]>>,
}

impl Overlay {
    /// The pages `batches` write, applied in order over what `read` reads.
    pub fn new(
        g: &Geometry,
        batches: &[Vec<u8>],
        read: &dyn Fn(u64, &mut [u8]) -> bool,
    ) -> Result<Overlay, RecoveryError> {
        let mut o = Overlay::default();
        for b in batches {
            each_write(g, b, |w| {
                let (at, len) = w.range();
                let mut done = 0;
                while done < len {
                    let off = at + done;
                    let page = off / PAGE_SIZE;
                    let in_page = offset_in_page(off);
                    // The rest of the page, or of the write if it ends first.
                    let n =
                        (PAGE_LEN - in_page).min(usize::try_from(len - done).unwrap_or(usize::MAX));
                    let p = match o.pages.entry(page) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(e) => {
                            let mut buf = vec![0u8; PAGE_LEN].into_boxed_slice();
                            if !read(page * PAGE_SIZE, &mut buf) {
                                return Err(RecoveryError::PageOutsideImage { page });
                            }
                            e.insert(buf)
                        }
                    };
                    match w {
                        BatchWrite::Bytes(_, b) => {
                            let from = usize::try_from(done).expect("below the bytes' length");
                            p[in_page..in_page + n].copy_from_slice(&b[from..from + n]);
                        }
                        BatchWrite::Zero(..) => p[in_page..in_page + n].fill(0),
                    }
                    done += n as u64;
                }
                Ok(())
            })?;
        }
        Ok(o)
    }

    /// Reads image bytes at `off`: the overlay's pages where it has them,
    /// else through `read`.
    pub fn read(&self, off: u64, buf: &mut [u8], read: &dyn Fn(u64, &mut [u8]) -> bool) -> bool {
        if !read(off, buf) {
            return false;
        }
        if self.pages.is_empty() {
            return true;
        }
        // Page by page: each piece of `buf` that an overlay page covers.
        let mut done = 0;
        while done < buf.len() {
            let at = off + done as u64;
            let in_page = offset_in_page(at);
            let n = (PAGE_LEN - in_page).min(buf.len() - done);
            if let Some(p) = self.pages.get(&(at / PAGE_SIZE)) {
                buf[done..done + n].copy_from_slice(&p[in_page..in_page + n]);
            }
            done += n;
        }
        true
    }
}

/// Where image byte `off` lies in its page.
// Lossless: the remainder is below `PAGE_SIZE`.
#[allow(clippy::cast_possible_truncation)]
fn offset_in_page(off: u64) -> usize {
    (off % PAGE_SIZE) as usize
}

/// Rebuilds the namespace: loads the store through `read` (which must
/// see the complete batches applied) and replays the log's records after
/// them.
pub fn rebuild(
    g: &Geometry,
    scanned: &Scanned,
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<(Namespace, Loaded, Replayed), RecoveryError> {
    let (mut ns, loaded) = crate::store::load(g, read)?;
    let mut replayed = Replayed {
        entries: 0,
        bytes: scanned.head.pos,
        batches: scanned.batches.len() as u64,
    };
    for (seq, op, payload) in &scanned.replay {
        let rec = Record::decode(*op, payload)
            .map_err(|errno| RecoveryError::Undecodable { seq: *seq, errno })?;
        ns.apply(&rec)
            .map_err(|errno| RecoveryError::Replay { seq: *seq, errno })?;
        replayed.entries += 1;
    }
    ns.rebuild_free_inos();
    // Pages replaced during replay are simply free: free space is rebuilt
    // from the owner entries.
    ns.drain_replaced(|_| {});
    Ok((ns, loaded, replayed))
}

/// Recovers the namespace of an image read-only: the log walked, its
/// complete batches applied in memory, the store loaded and the log
/// replayed (fsck and tools).
pub fn recover(
    sb: &Superblock,
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<(Namespace, Loaded, Replayed), RecoveryError> {
    let scanned = scan(sb, read)?;
    let overlay = Overlay::new(&sb.geometry, &scanned.batches, read)?;
    rebuild(&sb.geometry, &scanned, &|off, buf| {
        overlay.read(off, buf, read)
    })
}

/// Opens the file system in `path` and recovers it: the log walked; its
/// complete batches applied to the store (durably, before anything else
/// is written); the store loaded and the records after the batches
/// replayed; the entries of a batch left without its end made invalid;
/// then a retirement, which writes what the replay changed into the store
/// and starts the log over. A crash at any point of this leaves an image
/// that recovers the same way.
pub(crate) fn open(path: &Path, persist: Arc<dyn Persist>) -> crate::Result<Volume> {
    let mut image = Image::open_with(path, persist)?;
    let sb = image.superblock().clone();
    let g = sb.geometry;
    let failed = |cause: RecoveryError| Error::Recovery {
        path: path.into(),
        cause,
    };
    let region = image.region();
    let read = |off: u64, buf: &mut [u8]| region.read(off, buf).is_ok();
    let scanned = scan(&sb, &read).map_err(failed)?;
    for b in &scanned.batches {
        apply_batch(region, &g, b).map_err(failed)?;
    }
    let (ns, loaded, replayed) = rebuild(&g, &scanned, &read).map_err(failed)?;
    let (files, store_pages) = crate::store::held_pages(&ns);
    let pages = Pages::new(&g, files, store_pages).map_err(|e| failed(e.into()))?;
    let mut log = Log::new(
        g.log,
        sb.uuid,
        sb.log_seq,
        scanned.head.pos,
        scanned.head.next_seq,
        scanned.head.entries,
    );
    log.invalidate(image.region(), &scanned.stale)
        .map_err(|e| failed(RecoveryError::ClearStale(e)))?;
    image.set_clean(false)?;
    let mut v = Volume::recovered(image, ns, log, replayed, loaded, pages);
    if v.log().entries() > 0 || !v.namespace().store().is_clean() {
        v.checkpoint()
            .map_err(|e| failed(RecoveryError::Retire(e)))?;
    }
    Ok(v)
}
