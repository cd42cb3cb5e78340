//! An open file system as Kfs holds it: the image, the live namespace, the
//! log, and the state of every mechanism that serves file data. Opening
//! one is recovery ([`crate::recovery`]); every change is logged, then
//! applied to the namespace; retirements of the log (`retire`) write
//! what changed into the metadata store (see [`crate::store`]) and start
//! the log over; closing one retires the log and marks the image clean.
//!
//! The mechanisms the volume owns, one module each:
//!
//! - `leases`: opens, closes and write leases;
//! - `grants`: grants of free pages into pools, and pools given back;
//! - `commit`: copy-on-write commits, truncation and sizes;
//! - `protection`: the protection of clients' data pages, Kfs's side;
//! - `retire`: retirements of the log into the metadata store;
//! - `warmer`: the cache warmer of direct commits.

use std::path::Path;
use std::sync::Arc;

use kucofs_common::format::meta::BatchWriter;
use kucofs_common::format::PAGE_SIZE;
use kucofs_common::index::Ino;
use kucofs_common::index::NAME_MAX;
use kucofs_common::pm::{Hardware, Persist, Protection, Protector};
use kucofs_common::proto::{Creds, Node, Reply, Request, Statfs};
use kucofs_common::Errno;

use kucofs_common::channel::Segment;
use parking_lot::Mutex;

use crate::image::Image;
use crate::intmap::IntMap;
use crate::log::Log;
use crate::namespace::{Namespace, Outcome};
use crate::pages::{page_index, Pages};
use crate::record::Record;
use crate::recovery::Replayed;
use crate::store::Loaded;
use crate::{Error, Result};

mod commit;
mod grants;
mod inspect;
mod leases;
mod protection;
mod retire;
mod warmer;

pub use grants::POOL_MAX;
pub use leases::LEASE_WAIT;
pub use protection::{make_deferred, Changes, Failure};
use protection::{Held, Pending, View};
pub(crate) use retire::apply_batch;
pub use retire::Retirements;
pub use warmer::{WarmEntry, Warmer};

/// A page's size, as `statfs` reports it.
const PAGE_BYTES: u32 = 4096;
const _: () = assert!(PAGE_BYTES as u64 == PAGE_SIZE);

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
pub type Readers = Arc<Mutex<Vec<(u32, Segment)>>>;

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
    data: DataState,
    protection: protection::State,
    readers: Readers,
    /// Reader-epoch eviction (see `Volume::set_eviction`).
    eviction: Eviction,
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

    /// [`Volume::open`] with a chosen persistence backend: recovery (see
    /// `crate::recovery::open`).
    pub fn open_with(path: &Path, persist: Arc<dyn Persist>) -> Result<Volume> {
        crate::recovery::open(path, persist)
    }

    /// The volume recovery rebuilt (see [`crate::recovery::open`]), before
    /// its retirement at open.
    pub(crate) fn recovered(
        image: Image,
        ns: Namespace,
        log: Log,
        replayed: Replayed,
        loaded: Loaded,
        pages: Pages,
    ) -> Volume {
        Volume {
            image,
            ns,
            log,
            replayed,
            loaded,
            retirements: Retirements::default(),
            batch: BatchWriter::new(),
            pages,
            data: DataState::default(),
            protection: protection::State::default(),
            readers: Readers::default(),
            eviction: Eviction::default(),
            failed: false,
        }
    }

    /// The request segments whose epochs reclamation must wait for.
    pub fn set_readers(&mut self, readers: Readers) {
        self.readers = readers;
    }

    /// Evicts a client one of whose threads holds back reclamation with
    /// the same reader epoch for `after` or longer (ARCHITECTURE.md §9);
    /// `None` (the default) never does. Only for clients in processes of
    /// their own: an evicted client's reads fail from then on, and its
    /// requests too (`ENOTCONN`), until the daemon has detached it (see
    /// [`Volume::take_evicted`]).
    pub fn set_eviction(&mut self, after: Option<std::time::Duration>) {
        self.eviction.after = after;
    }

    /// The clients evicted since the last call, for the daemon to close
    /// their connections.
    pub fn take_evicted(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.eviction.evicted)
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
        let mut readers = self.readers.lock();
        for client in self.eviction.stuck(&readers) {
            // The word first, then no more waiting for the client: a read
            // section of it that loaded anything freed from now on finds
            // the word when it ends (see `Segment::evicted`).
            readers.retain(|(id, seg)| {
                if *id == client {
                    seg.evict();
                }
                *id != client
            });
            if let Some(c) = self.data.clients.get_mut(&client) {
                c.evicted = true;
            }
            self.eviction.evicted.push(client);
        }
        let oldest =
            crate::arena::oldest_reader(readers.iter().flat_map(|(_, s)| s.epochs()), epoch);
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

    /// What `statfs` reports: store pages count as used, and the files
    /// that may still be made as what the free pages and slots hold
    /// (ARCHITECTURE.md §11).
    pub fn statfs(&self) -> Statfs {
        let blocks = self.image.superblock().geometry.data.pages;
        let blocks_free = blocks.saturating_sub(self.used_pages());
        let files_free = self.files_free();
        Statfs {
            block_size: PAGE_BYTES,
            blocks,
            blocks_free,
            blocks_avail: blocks_free,
            files: self.ns.inode_count().saturating_add(files_free),
            files_free,
            name_max: NAME_MAX as u64,
        }
    }

    /// Handles one request: check it, log it, apply it, and make the log
    /// entry durable before returning the reply.
    pub fn handle(&mut self, req: &Request<'_>, caller: Caller) -> Result<Reply, Errno> {
        if self.failed && !matches!(req, Request::Ping | Request::Close { .. } | Request::Statfs) {
            return Err(Errno::EIO);
        }
        if self
            .data
            .clients
            .get(&caller.client)
            .is_some_and(|c| c.evicted)
        {
            return Err(Errno::ENOTCONN);
        }
        self.fill_stock();
        let r = match self.may_name(req, caller) {
            Err(e) => Err(e),
            Ok(()) => match self.handle_data(req, caller) {
                Some(r) => r,
                None => self
                    .handle_inner(req, caller.creds)
                    .and_then(|node| Reply::of_change(req.reply_kind(), node)),
            },
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

/// What Kfs keeps about one attached client: its opens (see `leases`)
/// and its protection state (see `protection`).
#[derive(Debug, Default)]
pub(crate) struct ClientData {
    /// Its view of the region, if Kfs changes its protection.
    view: Option<View>,
    protection: Protection,
    /// Open files: ino -> (opens, write opens).
    opens: IntMap<Ino, (u32, u32)>,
    /// Open files its credentials allowed it to read when it opened them
    /// (what [`Request::Read`](kucofs_common::proto::Request::Read)
    /// serves), until their last close.
    readable: IntMap<Ino, ()>,
    /// Committed pages still writable, per slot (batched protection).
    pending: IntMap<u32, Pending>,
    /// Its staging area, where a client that cannot write into the image
    /// (a daemon's) leaves the data of its writes (see
    /// [`Request::Write`](kucofs_common::proto::Request::Write)).
    staging: Option<kucofs_common::pm::Shm>,
    /// Evicted for holding a reader epoch too long: its requests fail
    /// with `ENOTCONN` until it is detached.
    evicted: bool,
}

/// Which reader epochs have been held how long, to evict a client that
/// holds back reclamation too long (ARCHITECTURE.md §9).
#[derive(Debug, Default)]
struct Eviction {
    /// The bound; `None`: never evict.
    after: Option<std::time::Duration>,
    /// (client, slot) -> the epoch word last seen there, and since when.
    held: std::collections::HashMap<(u32, usize), (u64, std::time::Instant)>,
    /// Evicted, not yet taken by the daemon.
    evicted: Vec<u32>,
}

impl Eviction {
    /// The clients of `readers` that have held one reader epoch for the
    /// bound or longer. Called after the global epoch advanced: a thread
    /// that left its read section and entered another since the last call
    /// publishes a newer word, so a word seen again is one read section.
    fn stuck(&mut self, readers: &[(u32, Segment)]) -> Vec<u32> {
        let Some(after) = self.after else {
            return Vec::new();
        };
        let now = std::time::Instant::now();
        let mut held = std::collections::HashMap::new();
        let mut stuck = Vec::new();
        for (id, seg) in readers {
            for (slot, word) in seg.epochs().enumerate() {
                if word == 0 {
                    continue;
                }
                let since = match self.held.get(&(*id, slot)) {
                    Some(&(w, t)) if w == word => t,
                    _ => now,
                };
                held.insert((*id, slot), (word, since));
                if now.duration_since(since) >= after && !stuck.contains(id) {
                    stuck.push(*id);
                }
            }
        }
        held.retain(|(id, _), _| !stuck.contains(id));
        self.held = held;
        stuck
    }
}

/// Leases and clients.
#[derive(Debug)]
pub(crate) struct DataState {
    /// Write leases: file -> the one client that may commit to it (while
    /// it has the file open for writing), and the lease's generation.
    leases: IntMap<Ino, leases::Lease>,
    /// Files whose lease a client waits for (see `leases`).
    waiters: IntMap<Ino, leases::Waiter>,
    /// The last lease generation given.
    next_lease: u64,
    /// How long a writer may keep a lease another client waits for.
    lease_wait: std::time::Duration,
    clients: IntMap<u32, ClientData>,
}

impl Default for DataState {
    fn default() -> Self {
        DataState {
            leases: IntMap::default(),
            waiters: IntMap::default(),
            next_lease: 0,
            lease_wait: leases::LEASE_WAIT,
            clients: IntMap::default(),
        }
    }
}

impl Volume {
    /// Registers a client; its pool pages are made writable (and back)
    /// through `protector`, under `protection`.
    pub fn attach_client(
        &mut self,
        client: u32,
        protector: Option<Protector>,
        protection: Protection,
        staging: Option<kucofs_common::pm::Shm>,
    ) {
        let view = protector.map(|protector| View {
            client,
            protector,
            base: self.pages.first_page(),
            held: vec![Held::Never; page_index(self.pages.total_pages())],
        });
        self.data.clients.insert(
            client,
            ClientData {
                view,
                protection,
                staging,
                ..ClientData::default()
            },
        );
    }

    /// Forgets a client: its opens are closed, its leases and its unused
    /// pool pages given back, its reader epochs dropped. The daemon calls
    /// this (through [`crate::Kfs::detach`]) for a client whose connection
    /// closed; in embedded mode the one client lives as long as Kfs.
    pub fn detach_client(&mut self, client: u32) -> Result<(), Errno> {
        // Its reader epochs no longer hold back reclamation.
        self.readers.lock().retain(|(id, _)| *id != client);
        let Some(mut c) = self.data.clients.remove(&client) else {
            return Ok(());
        };
        if let Some(v) = &mut c.view {
            for pend in c.pending.values_mut() {
                pend.flip(v, &self.pages, &mut self.protection.changes);
            }
        }
        let _ = self.settle_protection();
        self.data.leases.retain(|_, l| l.client != client);
        self.data.waiters.retain(|_, w| w.client != client);
        self.pages.release_client(client);
        // Every open goes, whatever one of them answers.
        let mut first_err = Ok(());
        for (ino, (n, _)) in c.opens {
            for _ in 0..n {
                if let Err(e) = self.ns.unpin(ino) {
                    first_err = first_err.and(Err(e));
                }
            }
        }
        self.retire_replaced();
        first_err
    }

    /// Handles the data requests; `None` for any other.
    fn handle_data(&mut self, req: &Request<'_>, caller: Caller) -> Option<Result<Reply, Errno>> {
        Some(match *req {
            Request::Open {
                at,
                flags,
                mode,
                hint,
            } => self.open_file(at, flags, mode, hint, caller),
            Request::Close { ino, write } => self.close_file(ino, write, caller),
            // A client with a staging area (a daemon's, unless the daemon
            // trusts it with writes, ARCHITECTURE.md §2) cannot write into
            // the pages of a pool: they would hold whatever their last
            // file left there, and it could commit them to read it. Its
            // writes take pages through `Request::Write` only, so it
            // never holds a pool to commit or give back either.
            Request::Grant { .. }
                if self
                    .data
                    .clients
                    .get(&caller.client)
                    .is_some_and(|c| c.staging.is_some()) =>
            {
                Err(Errno::EPERM)
            }
            Request::Grant { pages } => self.grant(pages, caller),
            Request::Commit {
                ino,
                first,
                size,
                extents,
            } => {
                let r = self.commit(ino, first, size, &extents, caller);
                self.hand_over(ino, caller);
                r
            }
            Request::Truncate { ino, size } => {
                let r = self.truncate(ino, size, caller);
                self.hand_over(ino, caller);
                r
            }
            Request::Write { ino, offset, len } => {
                let r = self.write_staged(ino, offset, len, caller);
                self.hand_over(ino, caller);
                r
            }
            Request::Lease { ino } => self.take_lease(ino, caller),
            Request::Unpool { slot, start, pages } => self.unpool(slot, start, pages, caller),
            Request::Statfs => Ok(Reply::Statfs(self.statfs())),
            Request::Stat { at } => self.stat(at, caller),
            Request::Lookup { dir, name } => self.lookup(dir, name, caller),
            Request::ReadDir { dir, after } => self.read_dir(dir, after, caller),
            Request::ReadLink { at } => self.read_link(at, caller),
            Request::Read { ino, offset, len } => self.read_staged(ino, offset, len, caller),
            _ => return None,
        })
    }

    fn client(&mut self, caller: Caller) -> Result<&mut ClientData, Errno> {
        self.data
            .clients
            .get_mut(&caller.client)
            .ok_or(Errno::EINVAL)
    }

    /// Puts the pages the namespace replaced or dropped to wait for their
    /// grace period.
    fn retire_replaced(&mut self) {
        let epoch = self.ns.epoch();
        let pages = &mut self.pages;
        self.ns.drain_replaced(|p| pages.retire(p.get(), epoch));
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod node_tests;
