//! An open file system as Kfs holds it: the image, the live namespace, and
//! the log. Opening one is recovery (DESIGN §10): load the checkpoint the
//! superblock names, replay the log after it, and mark the image in use;
//! closing one checkpoints and marks it clean.

use std::path::Path;
use std::sync::Arc;

use kucofs_common::format::{scan_log_with, Geometry, Superblock};
use kucofs_common::pm::{Hardware, Persist};
use kucofs_common::proto::{Creds, Reply, Request};
use kucofs_common::Errno;

use kucofs_common::channel::Segment;
use kucofs_common::index::Kind;
use parking_lot::Mutex;

use crate::checkpoint;
use crate::image::Image;
use crate::log::Log;
use crate::namespace::{Namespace, Outcome};
use crate::pages::Pages;
use crate::record::Record;
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

/// What recovery found in the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Entries replayed.
    pub entries: u64,
    /// Bytes they occupied.
    pub bytes: u64,
}

/// Rebuilds the namespace an image describes: its checkpoint plus its log.
/// `read` copies image bytes at an offset. Returns the namespace and where
/// the log ends.
pub fn recover(
    sb: &Superblock,
    read: impl Fn(u64, &mut [u8]) -> bool,
) -> std::result::Result<(Namespace, Replayed), String> {
    let g = &sb.geometry;
    let mut ns = match sb.checkpoint {
        Some(c) => {
            let (_, body) = checkpoint::read(g, c, &read)?;
            checkpoint::load(&body)?
        }
        None => Namespace::new(Creds::default(), 0).map_err(|e| format!("index: {e}"))?,
    };
    let mut replayed = Replayed::default();
    let mut failure = None;
    let base = g.log.offset();
    scan_log_with(
        g.log.len(),
        sb.log_seq,
        |at, buf| read(base + at, buf),
        |at, h, payload| {
            if failure.is_some() {
                return;
            }
            let applied = Record::decode(h.op, payload)
                .map_err(|e| {
                    format!(
                        "log entry {} (sequence {}): undecodable: {e:?}",
                        replayed.entries, h.seq
                    )
                })
                .and_then(|rec| {
                    ns.apply(&rec).map_err(|e| {
                        format!(
                            "log entry {} (sequence {}): replay failed: {e:?}",
                            replayed.entries, h.seq
                        )
                    })
                });
            match applied {
                Ok(_) => {
                    replayed.entries += 1;
                    replayed.bytes = at + h.footprint();
                }
                Err(why) => failure = Some(why),
            }
        },
    );
    if let Some(why) = failure {
        return Err(why);
    }
    ns.rebuild_free_inos();
    // Pages replaced during replay are simply free: free space is rebuilt
    // from the files.
    ns.drain_replaced(|_| {});
    Ok((ns, replayed))
}

/// Every data page the files of `ns` hold.
pub fn used_pages(ns: &Namespace) -> Vec<u64> {
    let mut used = Vec::new();
    ns.for_each_inode(|a| {
        if a.kind() == Some(Kind::File) {
            ns.file_pages(a.offset, |_, p| used.push(p));
        }
    });
    used
}

/// Writes the checkpoint of a fresh file system: a root directory owned by
/// `root`, in slot 0, covering the log from sequence 1.
pub(crate) fn initial_checkpoint(
    region: &kucofs_common::pm::Region,
    g: &Geometry,
    root: Creds,
) -> std::result::Result<(), Errno> {
    let ns = Namespace::new(root, crate::namespace::now_ns())?;
    checkpoint::write(region, g, 0, 1, &ns)
}

/// An open file system.
#[derive(Debug)]
pub struct Volume {
    image: Image,
    ns: Namespace,
    log: Log,
    replayed: Replayed,
    checkpoints: u64,
    pages: Pages,
    data: data::DataState,
    readers: Readers,
}

impl Volume {
    /// Opens (and recovers) the file system in `path`.
    pub fn open(path: &Path) -> Result<Volume> {
        Volume::open_with(path, Arc::new(Hardware::new()))
    }

    /// [`Volume::open`] with a chosen persistence backend.
    pub fn open_with(path: &Path, persist: Arc<dyn Persist>) -> Result<Volume> {
        let mut image = Image::open_with(path, persist)?;
        let sb = image.superblock().clone();
        let region = image.region();
        let (ns, replayed) =
            recover(&sb, |off, buf| region.read(off, buf).is_ok()).map_err(|why| {
                Error::Recovery {
                    path: path.into(),
                    why,
                }
            })?;
        let pages = Pages::new(&sb.geometry, used_pages(&ns)).map_err(|why| Error::Recovery {
            path: path.into(),
            why,
        })?;
        let log = Log::new(
            sb.geometry.log,
            replayed.bytes,
            sb.log_seq + replayed.entries,
            replayed.entries,
        );
        image.set_clean(false)?;
        Ok(Volume {
            image,
            ns,
            log,
            replayed,
            checkpoints: 0,
            pages,
            data: data::DataState::default(),
            readers: Readers::default(),
        })
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
    /// `buckets` buckets (see [`Namespace::grow_step`]); true if one is
    /// still under way.
    pub fn grow_step(&mut self, buckets: u64) -> bool {
        self.ns.grow_step(buckets)
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

    /// Checkpoints taken since the volume was opened.
    pub fn checkpoints(&self) -> u64 {
        self.checkpoints
    }

    /// Handles one request: check it, log it, apply it, and make the log
    /// entry durable before returning the reply.
    pub fn handle(&mut self, req: &Request<'_>, caller: Caller) -> Reply {
        let r = match self.handle_data(req, caller) {
            Some(r) => r,
            None => self.handle_inner(req, caller.creds),
        };
        // The change's log entry drained while the index took the change:
        // durable now, before the reply (and before the volume's lock is
        // released, so the next change is logged after it).
        self.log.fence(self.image.region());
        match r {
            Ok(r) => r,
            Err(e) => Reply::err(e),
        }
    }

    /// Writes `rec` to the log (durable at the next [`Log::fence`], which
    /// [`Volume::handle`] makes before it replies), checkpointing first if
    /// it does not fit. Index space for applying it is made to exist first: once a
    /// change that allocates is logged, applying it cannot run out of
    /// index space half-way. Changes that allocate nothing (removals above
    /// all) need no room, so a full index can still be emptied.
    fn log_record(&mut self, rec: &Record<'_>) -> std::result::Result<(), Errno> {
        if rec.allocates() {
            self.ns.make_room()?;
        }
        if !self.log.prepare(rec)? {
            self.checkpoint()?;
            if !self.log.prepare(rec)? {
                return Err(Errno::ENOSPC);
            }
        }
        self.log.append_prepared(self.image.region())
    }

    /// Checkpoints once the log is three quarters full.
    fn maybe_checkpoint(&mut self) {
        if self.log.fill() > self.log.capacity() / 4 * 3 {
            // Best effort: a failed checkpoint leaves the log to fill up,
            // and the next change that does not fit retries it.
            let _ = self.checkpoint();
        }
    }

    fn handle_inner(
        &mut self,
        req: &Request<'_>,
        creds: Creds,
    ) -> std::result::Result<Reply, Errno> {
        let p = match self.ns.prepare(req, creds)? {
            Outcome::Done(r) => return Ok(r),
            Outcome::Change(p) => p,
        };
        self.log_record(&p.record)?;
        let reply = self.ns.commit(p)?;
        // An unlink or rename may have dropped a file and its pages.
        self.retire_replaced();
        self.maybe_checkpoint();
        Ok(reply)
    }

    /// Writes a checkpoint of the whole namespace and starts the log over.
    pub fn checkpoint(&mut self) -> std::result::Result<(), Errno> {
        let sb = self.image.superblock().clone();
        let slot = match sb.checkpoint {
            Some(c) => 1 - (c.slot & 1),
            None => 0,
        };
        // The entries it covers are durable before it is.
        self.log.fence(self.image.region());
        let seq = self.log.next_seq();
        checkpoint::write(self.image.region(), &sb.geometry, slot, seq, &self.ns)?;
        let mut next = sb;
        next.checkpoint = Some(kucofs_common::format::CheckpointRef { slot, seq });
        next.log_seq = seq;
        self.image.update_superblock(next).map_err(|_| Errno::EIO)?;
        self.log.restart();
        self.checkpoints += 1;
        Ok(())
    }

    /// Checkpoints if the log holds anything (Kfs calls this when idle).
    pub fn checkpoint_if_dirty(&mut self) -> std::result::Result<bool, Errno> {
        if self.log.entries() == 0 {
            return Ok(false);
        }
        self.checkpoint()?;
        Ok(true)
    }

    /// Closes cleanly: a final checkpoint, the free-page bitmap, then the
    /// clean flag.
    pub fn close(mut self) -> Result<()> {
        let io = |v: &Volume, action, e: Errno| {
            Error::Region(kucofs_common::Error::Io {
                action,
                path: v.image.region().path().into(),
                cause: e.into(),
            })
        };
        self.checkpoint().map_err(|e| io(&self, "checkpoint", e))?;
        // The bitmap describes the files the checkpoint holds: a file
        // unlinked while open holds pages still, but not in the checkpoint.
        let g = self.image.superblock().geometry;
        let bitmap = Pages::new(&g, used_pages(&self.ns))
            .map_err(|_| io(&self, "count the pages of", Errno::EIO))?
            .used_bitmap();
        let area = g.bitmap;
        let region = self.image.region();
        region
            .write(area.offset(), &bitmap)
            .and_then(|()| region.persist(area.offset(), bitmap.len() as u64))
            .map_err(|_| io(&self, "write the free-page bitmap of", Errno::EIO))?;
        self.image.set_clean(true)
    }
}

#[cfg(test)]
mod tests;
