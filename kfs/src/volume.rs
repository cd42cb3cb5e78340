//! An open file system as Kfs holds it: the image, the live namespace, and
//! the log. Opening one is recovery (see [`crate::recovery`]); every change
//! is logged, then applied to the namespace; retirements of the log write
//! what changed into the metadata store (see [`crate::store`]) and start
//! the log over; closing one retires the log and marks the image clean.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kucofs_common::format::meta::{BatchWrite, BatchWriter};
use kucofs_common::format::PAGE_SIZE;
use kucofs_common::pm::{Hardware, Persist, Region};
use kucofs_common::proto::{Creds, Node, Reply, Request};
use kucofs_common::Errno;

use kucofs_common::channel::Segment;
use parking_lot::Mutex;

use crate::image::Image;
use crate::log::Log;
use crate::namespace::{Namespace, Outcome};
use crate::pages::Pages;
use crate::record::Record;
use crate::recovery::{each_write, Replayed};
use crate::store::Loaded;
use crate::{Error, Result};

mod data;

pub use data::{Changes, Failure, WarmEntry, Warmer, POOL_MAX};

/// Who sent a request: an attached client, the slot of the thread, and the
/// credentials the change is made with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller {
    /// The client (an attached process).
    pub client: u32,
    /// The thread's request slot.
    pub slot: u32,
    /// Its credentials.
    pub creds: Creds,
}

/// The request segments whose epoch slots hold back reclamation.
pub type Readers = Arc<Mutex<Vec<Segment>>>;

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
) -> std::result::Result<(), String> {
    static ZEROS: [u8; PAGE_SIZE as usize] = [0; PAGE_SIZE as usize];
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
        done.map_err(|e| format!("writing the store: {e}"))
    })?;
    region.fence();
    Ok(())
}

/// An open file system.
#[derive(Debug)]
pub struct Volume {
    image: Image,
    ns: Namespace,
    log: Log,
    replayed: Replayed,
    loaded: Loaded,
    retirements: Retirements,
    batch: BatchWriter,
    pages: Pages,
    data: data::DataState,
    readers: Readers,
    /// A retirement failed after it changed the store's bookkeeping (its
    /// batch invalid, or not written): the log must stay as it is for
    /// recovery, so every change is refused with `EIO` from then on.
    failed: bool,
}

impl Volume {
    /// Opens (and recovers) the file system in `path`.
    pub fn open(path: &Path) -> Result<Volume> {
        Volume::open_with(path, Arc::new(Hardware::new()))
    }

    /// [`Volume::open`] with a chosen persistence backend.
    ///
    /// Recovery: the log walked; its complete batches applied to the store
    /// (durably, before anything else is written); the store loaded and
    /// the records after the batches replayed; the entries of a batch left
    /// without its end made invalid; then a retirement, which writes what the replay changed
    /// into the store and starts the log over. A crash at any point of
    /// this leaves an image that recovers the same way.
    pub fn open_with(path: &Path, persist: Arc<dyn Persist>) -> Result<Volume> {
        let mut image = Image::open_with(path, persist)?;
        let sb = image.superblock().clone();
        let g = sb.geometry;
        let failed = |why: String| Error::Recovery {
            path: path.into(),
            why,
        };
        let region = image.region();
        let read = |off: u64, buf: &mut [u8]| region.read(off, buf).is_ok();
        let scanned = crate::recovery::scan(&sb, &read).map_err(failed)?;
        for b in &scanned.batches {
            apply_batch(region, &g, b).map_err(failed)?;
        }
        let (ns, loaded, replayed) =
            crate::recovery::rebuild(&g, &scanned, &read).map_err(failed)?;
        let (files, store_pages) = crate::store::held_pages(&ns);
        let pages = Pages::new(&g, files, store_pages).map_err(failed)?;
        let mut log = Log::new(
            g.log,
            sb.uuid,
            sb.log_seq,
            scanned.head.pos,
            scanned.head.next_seq,
            scanned.head.entries,
        );
        log.invalidate(image.region(), &scanned.stale)
            .map_err(|e| failed(format!("clearing a batch left without its end: {e:?}")))?;
        image.set_clean(false)?;
        let mut v = Volume {
            image,
            ns,
            log,
            replayed,
            loaded,
            retirements: Retirements::default(),
            batch: BatchWriter::new(),
            pages,
            data: data::DataState::default(),
            readers: Readers::default(),
            failed: false,
        };
        if v.log.entries() > 0 || !v.ns.store().is_clean() {
            v.checkpoint()
                .map_err(|e| failed(format!("retiring the log after recovery: {e:?}")))?;
        }
        Ok(v)
    }

    /// The request segments whose epochs reclamation must wait for.
    pub fn set_readers(&mut self, readers: Readers) {
        self.readers = readers;
    }

    /// The data pages.
    pub fn pages(&self) -> &Pages {
        &self.pages
    }

    /// A round of housekeeping: flips the protection batches that are due
    /// and frees what no reader can still see; returns how many index
    /// items and data pages it freed.
    pub fn keep_house(&mut self) -> usize {
        self.expire_protection();
        self.reclaim_now()
    }

    /// Advances the directories' table doublings under way by at most
    /// `buckets` buckets (see [`Namespace::grow_step`]), and the retiring
    /// of removed directories' lists by twice as many nodes
    /// ([`Namespace::dismantle_step`]); true if either is still under way.
    pub fn grow_step(&mut self, buckets: u64) -> bool {
        let growing = self.ns.grow_step(buckets);
        // Retiring a sentinel (a cache miss) costs about half what
        // migrating a bucket does.
        growing | self.ns.dismantle_step(2 * buckets).unwrap_or(false)
    }

    /// Frees index items and data pages that no client thread can still
    /// be reading; returns how many.
    pub fn reclaim_now(&mut self) -> usize {
        if self.ns.arena().retired() == 0 && self.pages.waiting() == 0 {
            return 0;
        }
        let Ok(epoch) = self.ns.advance_epoch() else {
            return 0;
        };
        let readers = self.readers.lock();
        let oldest = crate::arena::oldest_reader(readers.iter().flat_map(Segment::epochs), epoch);
        drop(readers);
        self.ns.free_retired(oldest).unwrap_or(0) + self.pages.reclaim(oldest)
    }

    /// The namespace.
    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// The image.
    pub fn image(&self) -> &Image {
        &self.image
    }

    /// The log.
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// Background page provisioning for this volume's index, log and data
    /// pages.
    pub fn provisioner(&self) -> crate::provision::Provisioner {
        crate::provision::Provisioner::new(
            self.ns.arena().shm_handle(),
            self.image.region_handle(),
            (self.log.area(), self.log.position_handle()),
            (
                self.image.superblock().geometry.data,
                self.pages.high_water_handle(),
            ),
        )
    }

    /// Lets the log, the index and the data pages live in huge pages, for
    /// an image on tmpfs: from now on the Kfs thread makes each 2 MiB
    /// chunk huge as it provisions the log and the index ahead of use,
    /// and the data pages ahead of the highest grant or, without huge
    /// pages ahead (`ServerConfig::huge_ahead`), once writes pause (see
    /// `provision`). Random access over many pages then misses the TLB
    /// far less. The price is memory in 2 MiB
    /// steps, and the time to clear each huge page, which is far longer
    /// than its share of small pages while the machine's memory is cold (a
    /// virtual machine whose host takes freed memory back). True if the
    /// region can have huge pages.
    pub fn enable_huge_pages(&self) -> bool {
        let index = self.ns.arena().shm().enable_huge_pages();
        self.image.region().enable_huge_pages() && index
    }

    /// Bytes of the region and of the index held in huge pages.
    pub fn huge_bytes(&self) -> u64 {
        self.image.region().huge_bytes() + self.ns.arena().shm().huge_bytes()
    }

    /// What recovery replayed when the volume was opened.
    pub fn replayed(&self) -> Replayed {
        self.replayed
    }

    /// What recovery read from the store when the volume was opened.
    pub fn loaded(&self) -> Loaded {
        self.loaded
    }

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

    /// Data pages files and the metadata store hold, counting those
    /// promised to the store (and not those of its stock not promised).
    pub fn used_pages(&self) -> u64 {
        let st = self.ns.store();
        (self.pages.used_pages() + st.promised()).saturating_sub(st.stock())
    }

    /// Inodes the file system can still take, as far as its free pages
    /// and inode numbers allow.
    pub fn files_free(&self) -> u64 {
        let free = self.pages.free_pages();
        self.ns
            .store()
            .files_free(free, self.ns.inode_count(), crate::namespace::MAX_INODES)
    }

    /// Handles one request: check it, log it, apply it, and make the log
    /// entry durable before returning the reply.
    pub fn handle(&mut self, req: &Request<'_>, caller: Caller) -> Result<Reply, Errno> {
        if self.failed && !matches!(req, Request::Ping | Request::Close { .. }) {
            return Err(Errno::EIO);
        }
        self.fill_stock();
        let r = match self.handle_data(req, caller) {
            Some(r) => r,
            None => self
                .handle_inner(req, caller.creds)
                .and_then(|node| Reply::of_change(req.reply_kind(), node)),
        };
        // The change's log entry drained while the index took the change:
        // durable now, before the reply (and before the volume's lock is
        // released, so the next change is logged after it).
        self.log.fence(self.image.region());
        r
    }

    /// Takes free pages into the store's stock until it holds every page
    /// promised and what one more change may promise (see
    /// [`crate::store`]): a change that needs a store page the stock
    /// cannot give is refused with `ENOSPC`, before anything is logged.
    /// On a sparse image each page is given its memory first.
    fn fill_stock(&mut self) {
        let region = self.image.region();
        for _ in 0..self.ns.store().stock_wanted() {
            match self.pages.take_meta() {
                Some(p) if region.reserve(p * PAGE_SIZE, PAGE_SIZE).is_ok() => {
                    self.ns.store_mut().add_stock(p)
                }
                Some(p) => {
                    self.pages.release_meta(p);
                    break;
                }
                None => break,
            }
        }
    }

    /// The most store records one change can call for (bytes of batch):
    /// one that drops a file holding every data page clears the whole
    /// owner table.
    fn change_bound(&self) -> u64 {
        let g = self.image.superblock().geometry;
        g.owners.len() + g.owners.pages * 12 + (64 << 10)
    }

    /// Writes `rec` to the log (durable at the next [`Log::fence`], which
    /// [`Volume::handle`] makes before it replies), retiring the log first
    /// if the log could not then take the retirement's batch. Index space
    /// for applying it is made to exist first: once a change that
    /// allocates is logged, applying it cannot run out of index space
    /// half-way. Changes that allocate nothing (removals above all) need
    /// no room, so a full index can still be emptied.
    fn log_record(&mut self, rec: &Record<'_>) -> std::result::Result<(), Errno> {
        if rec.allocates() {
            self.ns.make_room()?;
        }
        let batch = |v: &Volume| v.ns.store().pending_bytes() + v.change_bound();
        if !self.log.prepare(rec, batch(self))? {
            self.checkpoint()?;
            if !self.log.prepare(rec, batch(self))? {
                return Err(Errno::ENOSPC);
            }
        }
        self.log.append_prepared(self.image.region())
    }

    /// Retires the log once its entries and the store records they call
    /// for reach [`Geometry::retire_bytes`](kucofs_common::format::Geometry::retire_bytes),
    /// or the pending record writes [`crate::store::RETIRE_WRITES`].
    fn maybe_checkpoint(&mut self) {
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

    fn handle_inner(
        &mut self,
        req: &Request<'_>,
        creds: Creds,
    ) -> std::result::Result<Option<Node>, Errno> {
        let p = match self.ns.prepare(req, creds)? {
            Outcome::Done(r) => return Ok(r),
            Outcome::Change(p) => p,
        };
        self.log_record(&p.record)?;
        let reply = self.ns.commit(p)?;
        // An unlink or rename may have dropped a file and its pages.
        self.retire_replaced();
        // A failed step has dropped what it could not do, never the change.
        let _ = self.ns.dismantle_step(crate::namespace::DISMANTLE_STEP);
        self.maybe_checkpoint();
        Ok(reply)
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

    /// Closes cleanly: a last retirement, then the clean flag.
    pub fn close(mut self) -> Result<()> {
        self.checkpoint().map_err(|e| {
            Error::Region(kucofs_common::Error::Io {
                action: "retire the log of",
                path: self.image.region().path().into(),
                cause: e.into(),
            })
        })?;
        self.image.set_clean(true)
    }
}

#[cfg(test)]
mod tests;
