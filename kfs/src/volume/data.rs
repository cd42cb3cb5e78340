//! File data as Kfs serves it (ARCHITECTURE.md §8): opens and write leases, page
//! pools, copy-on-write commits, truncation, and the protection of
//! clients' pool pages.
//!
//! A client thread writes into pages of its own pool, with non-temporal
//! stores; its commit names them. They are durable before the commit's
//! log entry: the client fences them before it queues the commit, or,
//! applying the commit itself, leaves them to the fence Kfs's log makes
//! before the entry (on the same thread). Kfs checks that the client
//! holds the file's write lease and that every page is an unused page of
//! that thread's pool, logs the commit, publishes the new block-map
//! entries, puts the replaced pages to wait for their grace period, and
//! fences the log entry before it replies.

use kucofs_common::index::blockmap::{entry_page, MapReader, MAX_FILE_PAGES, MAX_FILE_SIZE, PAGE};
use kucofs_common::index::{Ino, InodeOff, Kind};
use kucofs_common::pm::{Protection, Protector, Shm, Words, BATCH_PAGES, BATCH_TIME};
use kucofs_common::proto::{open, Extents, Reply, Request, COMMIT_PAGES_MAX, GRANT_RUNS};
use kucofs_common::Errno;
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Caller, Volume};
use crate::intmap::IntMap;
use crate::namespace::{now_ns, STAMP_LEAD};
use crate::pages::{Holder, PageTableAddr};
use crate::record::Record;

/// Largest pool one grant hands out (16 MiB).
pub const POOL_MAX: u32 = 4096;
/// A grant hands out at most this fraction of the free pages: a pool is
/// one thread's stock, and the other threads must find pages too when the
/// file system is nearly full (a pool's unused pages come back when its
/// process goes, or when a thread of it finds no page free and asks,
/// [`Request::Unpool`]).
const POOL_SHARE: u64 = 8;
/// Reclamation rounds a grant waits for replaced pages before `ENOSPC`.
const GRANT_TRIES: u32 = 10_000;

/// Warms the cache for a commit a client thread is about to apply
/// directly: while its data pages drain to memory, it starts loading the
/// block-map entry and the page state the commit will read under the
/// volume's lock, which a random overwrite would otherwise miss one after
/// another there. Hints only: nothing is changed. It reads the index
/// outside any reader epoch, so it may walk items Kfs has since reused
/// (the index stays mapped and every load is bounds-checked, so that
/// cannot fault); what it finds then is a useless load, never acted on.
#[derive(Debug, Clone)]
pub struct Warmer {
    /// The index, as Kfs maps it (the client's read-only view is another
    /// mapping of it, with other TLB entries).
    index: Arc<Shm>,
    states: PageTableAddr,
    /// The store's owner entries (a replaced page's is cleared).
    owners: Option<PageTableAddr>,
}

impl Warmer {
    /// Starts loading the block-map entry of file page `page` of the
    /// inode at `inode`, and its neighbours on the cache line: the walk
    /// down to the leaf loads the inode's map word and the inner nodes
    /// above the leaf (one for every 63 nodes below it), and only the
    /// leaf's line is prefetched.
    /// Returns where the entry is, for [`Warmer::replaced`]; `None` for a
    /// page the map does not reach.
    pub fn map(&self, inode: u64, page: u64) -> Option<WarmEntry> {
        let at = MapReader::of_inode(&*self.index, InodeOff::new(inode)).slot(page)?;
        self.index.prefetch(at);
        Some(WarmEntry(at))
    }

    /// Starts loading the state and the owner entry of the data page the
    /// entry at `entry` names: the page a commit replaces. Best once
    /// [`Warmer::map`] had time to load the entry.
    pub fn replaced(&self, entry: WarmEntry) {
        // Relaxed: a hint; Kfs reads the entry again under the lock.
        let e = self.index.load_u64(entry.0, Ordering::Relaxed);
        if e != 0 {
            self.states.prefetch(entry_page(e).get());
            if let Some(owners) = &self.owners {
                owners.prefetch(entry_page(e).get());
            }
        }
    }
}

/// Where [`Warmer::map`] found a block-map entry.
#[derive(Debug, Clone, Copy)]
pub struct WarmEntry(pub(super) u64);

/// What Kfs keeps about one attached client.
#[derive(Debug, Default)]
pub(crate) struct ClientData {
    /// Its view of the region, if Kfs changes its protection.
    view: Option<View>,
    protection: Protection,
    /// Open files: ino -> (opens, write opens).
    opens: IntMap<u64, (u32, u32)>,
    /// Committed pages still writable, per slot (batched protection).
    pending: IntMap<u32, Pending>,
}

/// How a client's view holds one data page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Never granted to it: not faulted in, read-only.
    Never,
    ReadOnly,
    Writable,
    /// A change to it failed: writable or read-only, not known; the next
    /// decision either way changes it again.
    Unknown,
}

/// A client's view of the region as Kfs protects it. Writable pages are
/// its pool pages, its pages committed inside the batched window (and
/// those of them replaced before the batch's flush, until Kfs grants them
/// to another client), and under
/// `off` every page that was ever in its pools and is in no other
/// client's now (no reader returns the bytes of a page no file holds,
/// since a reader checks after copying that its entries did not
/// change).
#[derive(Debug)]
struct View {
    /// The client whose view it is.
    client: u32,
    protector: Protector,
    /// The first data page; `held[i]` is about page `base + i`.
    base: u64,
    held: Vec<Held>,
}

impl View {
    fn held(&self, page: u64) -> Held {
        self.held[(page - self.base) as usize]
    }

    /// True if every page of `range` is writable here.
    fn writable(&self, range: std::ops::Range<u64>) -> bool {
        range.into_iter().all(|q| self.held(q) == Held::Writable)
    }

    /// Decides that every page of `start..start + n` becomes writable
    /// (faulting in those the view never had) or read-only, with one
    /// protection change from the first page not so already to the last:
    /// the pages between that are so already lose nothing by being changed
    /// again, and a change costs far more per call than per page. Pages the
    /// view never had stay as they are when made read-only. The change is
    /// queued on `changes`; `held` says what the view will be once the
    /// queue is made ([`Changes::make`]).
    fn set(&mut self, start: u64, n: u64, writable: bool, changes: &mut Changes) {
        let needs = |h: Held| match writable {
            true => h != Held::Writable,
            false => matches!(h, Held::Writable | Held::Unknown),
        };
        let Some(std::ops::Range { start: r, end: q }) =
            hull(start..start + n, |q| needs(self.held(q)))
        else {
            return;
        };
        let change = |first, pages, what| Change {
            client: self.client,
            protector: self.protector.clone(),
            first,
            pages,
            what,
        };
        let held = &mut self.held[(r - self.base) as usize..(q - self.base) as usize];
        if writable {
            changes.0.push(change(r, q - r, What::Writable));
            each_run(
                r..q,
                |x| held[(x - r) as usize] == Held::Never,
                |f, k| changes.0.push(change(f, k, What::Populate)),
            );
            held.fill(Held::Writable);
        } else {
            changes.0.push(change(r, q - r, What::ReadOnly));
            for h in held
                .iter_mut()
                .filter(|h| matches!(h, Held::Writable | Held::Unknown))
            {
                *h = Held::ReadOnly;
            }
        }
    }

    /// Counts the pages of a change that failed as [`Held::Unknown`].
    fn failed(&mut self, f: &Failure) {
        let (a, b) = (f.first - self.base, f.first + f.pages - self.base);
        self.held[a as usize..b as usize].fill(Held::Unknown);
    }
}

/// What a [`Change`] does to its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum What {
    ReadOnly,
    Writable,
    /// Faults them in, writable (after they were made writable).
    Populate,
}

/// One protection change Kfs decided for a client's view.
#[derive(Debug)]
struct Change {
    client: u32,
    protector: Protector,
    first: u64,
    pages: u64,
    what: What,
}

/// A protection change that failed (see [`Changes::make`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub(crate) client: u32,
    pub(crate) first: u64,
    pub(crate) pages: u64,
    /// It was to make the pages writable (a grant's).
    pub(crate) writable: bool,
}

/// Protection changes decided under the volume's lock and not yet made,
/// in the order they were decided.
///
/// Each is a system call that changes page-table entries (and interrupts
/// the other cores running the process to drop stale translations), far
/// dearer than the bookkeeping around it. Kfs makes them at once, unless
/// a client thread applying its own request defers them
/// ([`Volume::handle_deferred`]) to make them after releasing the lock,
/// so that the other threads' commits go on meanwhile. Changes are made
/// under [`Volume::protection_order`], taken before the volume's lock is
/// released: a later decision about the same pages, made under the
/// volume's lock, is then made after them.
#[derive(Debug, Default)]
pub struct Changes(Vec<Change>);

impl Changes {
    /// True if there is nothing to make.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Makes the changes, in order (the caller holds
    /// [`Volume::protection_order`]), and returns those that failed, for
    /// [`Volume::protection_failed`]. A failed change to writable is a
    /// grant the client must not write to; one to read-only costs
    /// protection, not data, and the next decision about its pages makes
    /// it again.
    pub fn make(self) -> Vec<Failure> {
        let mut failed = Vec::new();
        for c in self.0 {
            let writable = match c.what {
                What::Populate => {
                    c.protector.populate(c.first, c.pages);
                    continue;
                }
                What::ReadOnly => false,
                What::Writable => true,
            };
            if c.protector.set(c.first, c.pages, writable).is_err() {
                failed.push(Failure {
                    client: c.client,
                    first: c.first,
                    pages: c.pages,
                    writable,
                });
            }
        }
        failed
    }
}

/// The shortest range that holds every page of `range` that `pick`
/// picks; `None` if it picks none.
fn hull(range: std::ops::Range<u64>, pick: impl Fn(u64) -> bool) -> Option<std::ops::Range<u64>> {
    let first = range.clone().find(|&q| pick(q))?;
    let last = (first..range.end).rev().find(|&q| pick(q))?;
    Some(first..last + 1)
}

/// Calls `f(first, len)` for every maximal run of pages in `range` that
/// `pick` picks.
fn each_run(
    range: std::ops::Range<u64>,
    mut pick: impl FnMut(u64) -> bool,
    mut f: impl FnMut(u64, u64),
) {
    let mut run: Option<u64> = None;
    for q in range.start..=range.end {
        let picked = q < range.end && pick(q);
        match (picked, run) {
            (true, None) => run = Some(q),
            (false, Some(r)) => {
                f(r, q - r);
                run = None;
            }
            _ => {}
        }
    }
}

/// One client thread's batch under batched protection: the runs of pages
/// it committed that are still writable, and how many pages they hold.
#[derive(Debug, Default)]
struct Pending {
    runs: Vec<(u64, u64)>,
    pages: u64,
    /// When the first of them was committed, at the latest: the commit's
    /// own stamp ([`Namespace::stamp`](crate::namespace::Namespace::stamp))
    /// less [`STAMP_LEAD`], so that batching costs no clock read of its
    /// own. That is never later than [`now_ns`] at the
    /// commit, so Kfs's expiry check, which reads the precise clock,
    /// flips the batch no later than [`BATCH_TIME`] after its first
    /// commit.
    since: i64,
}

/// True once a batch opened at `since` has been open [`BATCH_TIME`] at
/// `now`, or if the clock went back (a batch must not outlive its bound
/// because the wall clock was set back).
fn batch_expired(since: i64, now: i64) -> bool {
    now < since || now >= batch_deadline(since)
}

/// The time ([`now_ns`]) by which a batch opened at `since` must be
/// flipped.
fn batch_deadline(since: i64) -> i64 {
    since.saturating_add(BATCH_TIME.as_nanos() as i64)
}

/// Leases and clients.
#[derive(Debug, Default)]
pub(crate) struct DataState {
    /// Write leases: file -> the one client that may commit to it (while
    /// it has the file open for writing).
    leases: IntMap<u64, u32>,
    clients: IntMap<u32, ClientData>,
    /// When Kfs will next make the expired batches read-only
    /// ([`Volume::plan_expiry_check`]; 0 until it says).
    expiry_check_at: i64,
    /// A commit opened a batch due before that check, and Kfs must be
    /// woken to look at it sooner ([`Volume::take_wake_kfs`]).
    wake_kfs: bool,
    /// Protection changes decided and not yet made.
    changes: Changes,
    /// Changes are left for the caller to make
    /// ([`Volume::handle_deferred`]).
    defer: bool,
    /// Held while changes are made ([`Volume::protection_order`]).
    order: Arc<Mutex<()>>,
}

impl Volume {
    /// Registers a client; its pool pages are made writable (and back)
    /// through `protector`, under `protection`.
    pub fn attach_client(
        &mut self,
        client: u32,
        protector: Option<Protector>,
        protection: Protection,
    ) {
        let view = protector.map(|protector| View {
            client,
            protector,
            base: self.pages.first_page(),
            held: vec![Held::Never; self.pages.total_pages() as usize],
        });
        self.data.clients.insert(
            client,
            ClientData {
                view,
                protection,
                ..ClientData::default()
            },
        );
    }

    /// Forgets a client: its opens are closed, its leases and its unused
    /// pool pages given back. In embedded mode nothing calls this yet (the
    /// one client lives as long as Kfs); the daemon will, for a client
    /// that closed or died.
    pub fn detach_client(&mut self, client: u32) -> Result<(), Errno> {
        let Some(mut c) = self.data.clients.remove(&client) else {
            return Ok(());
        };
        if let Some(v) = &mut c.view {
            for pend in c.pending.values_mut() {
                pend.flip(v, &self.pages, &mut self.data.changes);
            }
        }
        let _ = self.settle_protection();
        self.data.leases.retain(|_, &mut c| c != client);
        self.pages.release_client(client);
        for (ino, (n, _)) in c.opens {
            for _ in 0..n {
                self.ns.unpin(Ino::new(ino))?;
            }
        }
        self.retire_replaced();
        Ok(())
    }

    /// Handles the data requests; `None` for any other.
    pub(super) fn handle_data(
        &mut self,
        req: &Request<'_>,
        caller: Caller,
    ) -> Option<Result<Reply, Errno>> {
        Some(match *req {
            Request::Open {
                path,
                flags,
                mode,
                hint,
            } => self.open_file(path, flags, mode, hint, caller),
            Request::Close { ino, write } => self.close_file(ino, write, caller),
            Request::Grant { pages } => self.grant(pages, caller),
            Request::Commit {
                ino,
                first,
                size,
                extents,
            } => self.commit(ino, first, size, &extents, caller),
            Request::Truncate { ino, size } => self.truncate(ino, size, caller),
            Request::Unpool { slot, start, pages } => self.unpool(slot, start, pages, caller),
            _ => return None,
        })
    }

    fn client(&mut self, caller: Caller) -> Result<&mut ClientData, Errno> {
        self.data
            .clients
            .get_mut(&caller.client)
            .ok_or(Errno::EINVAL)
    }

    fn open_file(
        &mut self,
        path: &[u8],
        flags: u32,
        mode: u32,
        hint: Option<kucofs_common::proto::Hint>,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        if flags & !open::ALL != 0 || mode & !0o7777 != 0 {
            return Err(Errno::EINVAL);
        }
        self.client(caller)?;
        let write = flags & open::WRITE != 0;
        let mut created = false;
        let inode = match self.ns.reader().resolve(path, true) {
            Ok(_) if flags & open::CREATE != 0 && flags & open::EXCL != 0 => {
                return Err(Errno::EEXIST)
            }
            Ok(inode) => inode,
            Err(Errno::ENOENT) if flags & open::CREATE != 0 => {
                let create = Request::Create {
                    path,
                    mode: libc::S_IFREG | mode,
                    target: b"",
                    hint,
                };
                created = true;
                InodeOff::new(self.handle_inner(&create, caller.creds)?.inode)
            }
            Err(e) => return Err(e),
        };
        let r = self.ns.reader();
        let kind = r.kind(inode).ok_or(Errno::EIO)?;
        let ino = r.ino(inode).get();
        let gen = kucofs_common::index::layout::header_gen(r.header(inode.get()));
        if kind == Kind::Dir && (write || flags & open::TRUNC != 0) {
            return Err(Errno::EISDIR);
        }
        if write
            && self
                .data
                .leases
                .get(&ino)
                .is_some_and(|&c| c != caller.client)
        {
            // Another process holds the write lease.
            return Err(Errno::ETXTBSY);
        }
        // As on Linux, truncating a file that was there already changes its
        // times even when it is empty; a file this open made is left alone.
        if write && flags & open::TRUNC != 0 && !created {
            self.set_size(inode.get(), ino, 0)?;
        }
        let reply = Reply {
            errno: 0,
            ino,
            inode: inode.get(),
            gen,
            // 1: this open created the file.
            value: u64::from(created),
            ..Reply::default()
        };
        if kind == Kind::File {
            self.ns.pin(Ino::new(ino));
            let c = self.client(caller)?;
            let o = c.opens.entry(ino).or_default();
            o.0 += 1;
            o.1 += u32::from(write);
            if write {
                self.data.leases.insert(ino, caller.client);
            }
        }
        Ok(reply)
    }

    fn close_file(&mut self, ino: u64, write: bool, caller: Caller) -> Result<Reply, Errno> {
        let c = self.client(caller)?;
        let Some(o) = c.opens.get_mut(&ino) else {
            return Err(Errno::EBADF);
        };
        // A write close needs a write open, and a read close a read open:
        // a client that closed a write open as a read one would keep the
        // file's lease with nothing left open.
        if (write && o.1 == 0) || (!write && o.0 == o.1) {
            return Err(Errno::EBADF);
        }
        o.0 -= 1;
        o.1 -= u32::from(write);
        let (opens, writes) = *o;
        if opens == 0 {
            c.opens.remove(&ino);
        }
        if write && writes == 0 {
            self.data.leases.remove(&ino);
        }
        self.ns.unpin(Ino::new(ino))?;
        self.retire_replaced();
        Ok(Reply::default())
    }

    /// The inode of a file `caller` holds the write lease of. A lease is
    /// only taken on a regular file, which stays while it is open.
    fn leased(&self, ino: u64, caller: Caller) -> Result<u64, Errno> {
        if self.data.leases.get(&ino) != Some(&caller.client) {
            return Err(Errno::EBADF);
        }
        self.ns.file_inode(Ino::new(ino)).map(InodeOff::get)
    }

    fn grant(&mut self, pages: u32, caller: Caller) -> Result<Reply, Errno> {
        let protection = self.client(caller)?.protection;
        let want = u64::from(pages.clamp(1, POOL_MAX));
        if self.pages.free_pages() == 0 {
            // The last free pages go to file data before a grant fails:
            // those no reader holds any more, then the store's stock
            // beyond what it has promised. (Only then: given back any
            // earlier, the stock would be taken again before the next
            // change, at every grant.)
            self.reclaim_now();
            if self.pages.free_pages() == 0 {
                for p in self.ns.store_mut().spare_stock() {
                    self.pages.release_meta(p);
                }
            }
        }
        // Pages replaced a moment ago become free once the readers still
        // in their epoch move on (readers take no lock, so waiting here
        // holds none of them up).
        let mut tries = 0;
        let mut unreserved = 0;
        let ((start, n), lowest_ready, cap) = loop {
            // The lowest free pages when they are writable here already
            // (always under `off`, which never flips them back); else,
            // since each run costs a protection change, the lowest long
            // run.
            let lowest_ready = match protection {
                Protection::Off | Protection::Keys => true,
                Protection::Strict => false,
                Protection::Batched => match &self.data.clients[&caller.client].view {
                    Some(v) => self
                        .pages
                        .lowest_free(want)
                        .is_some_and(|(s, l)| v.writable(s..s + l)),
                    None => true,
                },
            };
            let share = (self.pages.free_pages() / POOL_SHARE).max(1);
            let cap = want.min(share);
            match self.grant_reserved(caller, cap, !lowest_ready, &mut unreserved) {
                Ok(g) => break (g, lowest_ready, cap),
                // Reserving failed again after a reclamation (which may
                // have freed pages that have memory): the room is gone.
                Err(e) if self.pages.waiting() == 0 || tries == GRANT_TRIES || unreserved > 1 => {
                    return Err(e)
                }
                Err(_) => {
                    if tries > 0 {
                        std::thread::yield_now();
                    }
                    self.reclaim_now();
                    tries += 1;
                }
            }
        };
        // Where free pages lie scattered (each random overwrite frees one
        // somewhere), up to GRANT_RUNS runs more, so that a pool holds
        // more than the page or two of one: under `off` and `keys`, whose
        // pages are writable already, not where each run may cost a
        // protection change.
        let mut runs = [(0, 0); 1 + GRANT_RUNS];
        runs[0] = (start, n);
        let mut count = 1;
        let mut total = n;
        let more = lowest_ready && matches!(protection, Protection::Off | Protection::Keys);
        while more && count < runs.len() && total < cap {
            let Ok(g) = self.grant_reserved(caller, cap - total, false, &mut unreserved) else {
                break;
            };
            runs[count] = g;
            count += 1;
            total += g.1;
        }
        let runs = &runs[..count];
        let changes = &mut self.data.changes;
        for (&id, c) in self.data.clients.iter_mut() {
            let Some(v) = &mut c.view else { continue };
            // Another client's view may still have some of these pages
            // writable (they left a file there): not any more.
            for &(s, n) in runs {
                v.set(s, n, id == caller.client, changes);
            }
        }
        let reply = Reply::grant(runs).ok_or(Errno::EIO);
        if self.settle_protection().is_err() || reply.is_err() {
            for &(s, n) in runs {
                self.undo_grant(caller, s, n);
            }
            return Err(Errno::EIO);
        }
        reply
    }

    /// Frees a run of idle pages from the pool of the caller's slot `slot`
    /// (see [`Request::Unpool`]). Under `strict` they become read-only in
    /// the caller's view at once; otherwise they stay writable there until
    /// Kfs grants them to another client, as pages a batch left writable
    /// do.
    fn unpool(
        &mut self,
        slot: u32,
        start: u64,
        pages: u32,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        let h = Holder {
            client: caller.client,
            slot,
        };
        let n = u64::from(pages);
        // Refused for a client that is not attached too: it holds no pool.
        self.pages.unpool(h, start, n)?;
        let Some(c) = self.data.clients.get_mut(&caller.client) else {
            return Ok(Reply::default());
        };
        if let (Protection::Strict, Some(v)) = (c.protection, &mut c.view) {
            // Free pages hold nothing a file reads: a failed change costs
            // protection, not data.
            v.set(start, n, false, &mut self.data.changes);
            let _ = self.settle_protection();
        }
        Ok(Reply::default())
    }

    /// Zeroes the bytes of the page holding byte `old_size` from there to
    /// the page's end, before a change makes them part of the file: they
    /// may hold what a shrink left behind. This is the one write to a
    /// committed page, so its entry gets a new version first: a reader
    /// that took its size from before the shrink either loaded the entry
    /// before that (and fails its check of the entries after copying) or
    /// after it (and finds the size changed since it loaded it, before it
    /// copies anything). The size covering the zeros is stored after them.
    fn zero_tail(
        &mut self,
        inode: u64,
        old_size: u64,
        unless: std::ops::Range<u64>,
    ) -> Result<(), Errno> {
        let at = old_size % PAGE;
        let page = old_size / PAGE;
        if at == 0 || unless.contains(&page) {
            return Ok(());
        }
        let Some(data_page) = self.ns.reversion_page(InodeOff::new(inode), page)? else {
            return Ok(());
        };
        let off = data_page.byte_offset() + at;
        let region = self.image.region();
        region
            .fill(off, PAGE - at, 0)
            .and_then(|()| region.persist(off, PAGE - at))
            .map_err(|_| Errno::EIO)
    }

    fn commit(
        &mut self,
        ino: u64,
        first: u64,
        size: u64,
        extents: &Extents,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        let n = extents.pages();
        if n == 0
            || n > COMMIT_PAGES_MAX
            || first.checked_add(n).is_none_or(|end| end > MAX_FILE_PAGES)
            || size > MAX_FILE_SIZE
        {
            return Err(Errno::EINVAL);
        }
        let inode = self.leased(ino, caller)?;
        let old_size = self.ns.shm_u64(InodeOff::new(inode).size());
        let new_size = old_size.max(size);
        // The last page committed holds bytes of the file (`first + n` was
        // checked against the largest file, so this cannot overflow).
        if (first + n - 1) * PAGE >= new_size {
            return Err(Errno::EINVAL);
        }
        // Most commits are a few pages: no allocation for those.
        kucofs_common::scratch::with_words(n as usize, |pages| {
            for (slot, p) in pages.iter_mut().zip(extents.iter_pages()) {
                *slot = p;
            }
            let pages = &*pages;
            let h = holder(caller);
            self.pages.take(h, pages)?;
            if new_size > old_size {
                if let Err(e) = self.zero_tail(inode, old_size, first..first + n) {
                    self.pages.untake(h, pages);
                    return Err(e);
                }
            }
            let time = self.ns.stamp();
            let rec = Record::Write {
                ino: Ino::new(ino),
                first,
                extents: *extents,
                size: new_size,
                time,
            };
            if let Err(e) = self.log_record(&rec) {
                self.pages.untake(h, pages);
                return Err(e);
            }
            self.ns
                .write_pages(InodeOff::new(inode), first, pages, new_size, time)?;
            self.retire_replaced();
            self.after_commit(caller, extents, time);
            self.maybe_checkpoint();
            Ok(Reply {
                ino,
                inode,
                value: new_size,
                ..Reply::default()
            })
        })
    }

    fn truncate(&mut self, ino: u64, size: u64, caller: Caller) -> Result<Reply, Errno> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let inode = self.leased(ino, caller)?;
        self.set_size(inode, ino, size)?;
        Ok(Reply {
            ino,
            inode,
            value: size,
            ..Reply::default()
        })
    }

    fn set_size(&mut self, inode: u64, ino: u64, size: u64) -> Result<(), Errno> {
        let old_size = self.ns.shm_u64(InodeOff::new(inode).size());
        if size > old_size {
            self.zero_tail(inode, old_size, 0..0)?;
        }
        let time = self.ns.stamp();
        self.log_record(&Record::Truncate {
            ino: Ino::new(ino),
            size,
            time,
        })?;
        self.ns.truncate_file(InodeOff::new(inode), size, time)?;
        self.retire_replaced();
        self.maybe_checkpoint();
        Ok(())
    }

    /// Makes pages the metadata store just took read-only in every
    /// client's view that may still have them writable (a page a file
    /// gave up stays writable in its writer's view until it is granted
    /// elsewhere, see [`Pending::flip`]). Best effort: a change that
    /// fails leaves the page's state unknown in that view, and the next
    /// decision about it changes it again.
    pub(super) fn protect_store_pages(&mut self, taken: &[u64]) {
        if taken.is_empty() {
            return;
        }
        let changes = &mut self.data.changes;
        for c in self.data.clients.values_mut() {
            let Some(v) = &mut c.view else { continue };
            for &p in taken {
                v.set(p, 1, false, changes);
            }
        }
        let _ = self.settle_protection();
    }

    /// Puts the pages the namespace replaced or dropped to wait for their
    /// grace period.
    pub(super) fn retire_replaced(&mut self) {
        let epoch = self.ns.epoch();
        let pages = &mut self.pages;
        self.ns.drain_replaced(|p| pages.retire(p.get(), epoch));
    }

    /// Makes committed pages read-only again as the client's protection
    /// mode says.
    fn after_commit(&mut self, caller: Caller, extents: &Extents, now: i64) {
        let Some(c) = self.data.clients.get_mut(&caller.client) else {
            return;
        };
        let Some(v) = &mut c.view else {
            return;
        };
        match c.protection {
            Protection::Off | Protection::Keys => {}
            Protection::Strict => {
                for e in extents.as_slice() {
                    v.set(e.start, u64::from(e.len), false, &mut self.data.changes);
                }
            }
            Protection::Batched => {
                let pend = c.pending.entry(caller.slot).or_default();
                if pend.runs.is_empty() {
                    pend.since = now.saturating_sub(STAMP_LEAD);
                    self.data.wake_kfs |= batch_deadline(pend.since) < self.data.expiry_check_at;
                }
                for e in extents.as_slice() {
                    let (s, l) = (e.start, u64::from(e.len));
                    match pend.runs.last_mut() {
                        Some(last) if last.0 + last.1 == s => last.1 += l,
                        _ => pend.runs.push((s, l)),
                    }
                    pend.pages += l;
                }
                if pend.pages >= BATCH_PAGES || batch_expired(pend.since, now) {
                    pend.flip(v, &self.pages, &mut self.data.changes);
                }
            }
        }
        // Read-only changes only: a failure costs protection, not data.
        let _ = self.settle_protection();
    }

    /// The earliest time by which a batch open now must be flipped (by
    /// [`Volume::expire_protection`] if no commit of its thread does it
    /// first); `None` if no batch is open.
    pub fn batch_deadline(&self) -> Option<i64> {
        self.data
            .clients
            .values()
            .flat_map(|c| c.pending.values())
            .filter(|p| !p.runs.is_empty())
            .map(|p| batch_deadline(p.since))
            .min()
    }

    /// Records when Kfs will next call [`Volume::expire_protection`]
    /// ([`now_ns`] time): a batch opened later with an earlier deadline
    /// asks for Kfs to be woken ([`Volume::take_wake_kfs`]).
    pub fn plan_expiry_check(&mut self, at: i64) {
        self.data.expiry_check_at = at;
    }

    /// True if a commit since the last call opened a batch due before
    /// the planned check; the caller wakes Kfs.
    pub fn take_wake_kfs(&mut self) -> bool {
        std::mem::take(&mut self.data.wake_kfs)
    }

    /// Makes read-only the committed pages that have stayed writable for
    /// [`BATCH_TIME`] (Kfs calls this while idle).
    pub fn expire_protection(&mut self) {
        let now = now_ns();
        for c in self.data.clients.values_mut() {
            // Only a client with a view has batches (see `after_commit`).
            let Some(v) = &mut c.view else { continue };
            for pend in c.pending.values_mut() {
                if !pend.runs.is_empty() && batch_expired(pend.since, now) {
                    pend.flip(v, &self.pages, &mut self.data.changes);
                }
            }
        }
        let _ = self.settle_protection();
    }

    /// Handles `req` as [`Volume::handle`] does, but leaves the protection
    /// changes it calls for to the caller, to make after releasing the
    /// volume's lock (see [`Changes`]): a client thread applying its own
    /// request does this, and must not return the reply before it has
    /// made them (a grant's pages are not writable until then). It takes
    /// them with [`Volume::take_protection_changes`] before releasing the
    /// lock.
    pub fn handle_deferred(&mut self, req: &Request<'_>, caller: Caller) -> Reply {
        self.data.defer = true;
        let reply =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(req, caller)));
        // Even after a panic: the next call must not leave its changes to
        // a caller that is gone (those queued are made by the next call
        // that makes its own); and an entry this thread logged must drain
        // on this thread, whose fence alone waits for its stores, before
        // the volume's lock passes to another.
        self.data.defer = false;
        self.log.fence(self.image.region());
        reply.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// The protection changes decided and not yet made (after
    /// [`Volume::handle_deferred`]), for the caller to
    /// [make](Changes::make) under [`Volume::protection_order`], taken
    /// before it releases the volume's lock.
    pub fn take_protection_changes(&mut self) -> Changes {
        std::mem::take(&mut self.data.changes)
    }

    /// A [`Warmer`] for client threads applying commits directly.
    pub fn warmer(&self) -> Warmer {
        Warmer {
            index: self.ns.arena().shm_handle(),
            states: self.pages.state_addr(),
            owners: self.ns.store().owner_addr(),
        }
    }

    /// The lock protection changes are made under, in the order they were
    /// decided (see [`Changes`]).
    pub fn protection_order(&self) -> Arc<Mutex<()>> {
        self.data.order.clone()
    }

    /// After changes that [`Volume::handle_deferred`] left failed: records
    /// them ([`Volume::protection_failed`]), and if `req` was a grant whose
    /// pages could not be made writable, takes the grant (`reply`) back
    /// and answers `EIO` instead. The caller holds the volume's lock again.
    pub fn deferred_changes_failed(
        &mut self,
        failed: &[Failure],
        req: &Request<'_>,
        caller: Caller,
        reply: Reply,
    ) -> Reply {
        self.protection_failed(failed);
        let grant = matches!(req, Request::Grant { .. }) && reply.errno == 0;
        if !grant || !failed.iter().any(|f| f.writable) {
            return reply;
        }
        // The caller's thread, which alone takes from that pool, is the
        // one asking: nothing took from the grant since. Every run of it
        // goes back: the caller, told EIO, learns of none.
        for (start, n) in reply.granted() {
            self.undo_grant(caller, start, n);
        }
        Reply::err(Errno::EIO)
    }

    /// Records changes that failed: their pages count as neither writable
    /// nor read-only, so the next decision about them makes it again.
    pub(crate) fn protection_failed(&mut self, failed: &[Failure]) {
        for f in failed {
            if let Some(v) = self
                .data
                .clients
                .get_mut(&f.client)
                .and_then(|c| c.view.as_mut())
            {
                v.failed(f);
            }
        }
    }

    /// Grants `caller` up to `cap` free pages (the lowest long run if
    /// `long`, see `Pages::grant`) and gives them their memory
    /// ([`Volume::reserve_granted`]), counting in `unreserved` the calls
    /// whose first reservation failed. Where a sparse image's file system has no
    /// room for a long run, pages never used, the lowest free pages next:
    /// used before, they may have their memory still.
    fn grant_reserved(
        &mut self,
        caller: Caller,
        cap: u64,
        long: bool,
        unreserved: &mut u32,
    ) -> Result<(u64, u64), Errno> {
        let h = holder(caller);
        let (s, n) = self.pages.grant(h, cap, long)?;
        let reserved = self.reserve_granted(caller, s, n);
        if reserved.is_ok() {
            return reserved;
        }
        *unreserved += 1;
        if !long {
            return reserved;
        }
        let (s, n) = self.pages.grant(h, cap, false)?;
        self.reserve_granted(caller, s, n)
    }

    /// Gives the `n` pages from `start` just granted to `caller` their
    /// memory, if the image is sparse, before the client may store to
    /// them: a store to a page the file system under the image has no room
    /// for would kill the client. Where the room runs out, the grant is cut
    /// short (the rest goes back); with none, it fails (`ENOSPC`).
    fn reserve_granted(&mut self, caller: Caller, start: u64, n: u64) -> Result<(u64, u64), Errno> {
        let (got, why) = reserve_prefix(self.image.region(), start, n);
        if got < n {
            self.undo_grant(caller, start + got, n - got);
        }
        match got {
            0 => Err(why.unwrap_or(Errno::ENOSPC)),
            _ => Ok((start, got)),
        }
    }

    /// Takes back a grant whose pages could not be made writable, or
    /// given memory: they go back to the free ones
    /// ([`Volume::protection_failed`] has counted those not made writable
    /// as not known in the caller's view).
    fn undo_grant(&mut self, caller: Caller, start: u64, n: u64) {
        let _ = self.pages.unpool(holder(caller), start, n);
    }

    /// Makes the protection changes decided so far, unless they are
    /// deferred. `EIO` if a change to writable failed.
    fn settle_protection(&mut self) -> Result<(), Errno> {
        if self.data.defer || self.data.changes.is_empty() {
            return Ok(());
        }
        let changes = std::mem::take(&mut self.data.changes);
        let failed = {
            let _order = self.data.order.lock();
            changes.make()
        };
        self.protection_failed(&failed);
        match failed.iter().any(|f| f.writable) {
            true => Err(Errno::EIO),
            false => Ok(()),
        }
    }
}

/// How many of the `n` pages from page `s` have their memory now (see
/// [`Region::reserve`](kucofs_common::pm::Region::reserve)): all of
/// them, or where the file system under a sparse image has too little
/// room, the longest prefix found by halving, and why the rest has not.
fn reserve_prefix(region: &kucofs_common::pm::Region, s: u64, n: u64) -> (u64, Option<Errno>) {
    let mut want = n;
    let mut why = None;
    while want > 0 {
        match region.reserve(s * PAGE, want * PAGE) {
            Ok(()) => return (want, why),
            Err(e) => why = Some(Errno::new(e.errno()).unwrap_or(Errno::EIO)),
        }
        want /= 2;
    }
    (0, why)
}

fn holder(caller: Caller) -> Holder {
    Holder {
        client: caller.client,
        slot: caller.slot,
    }
}

/// A batch's flip spans a gap of at most this many pages between two of
/// its runs, making the pages in it read-only too (except pool pages), so
/// that runs taken from nearby grants cost one protection change.
const BRIDGE: u64 = 64;

impl Pending {
    /// Ends the batch: makes read-only in `view` its pages that files
    /// still hold, in as few protection changes as the pools allow. Pages
    /// in a pool stay writable (a page replaced since its commit may be
    /// back in one). A page no file holds any more (an overwrite replaced
    /// it) stays writable until Kfs grants it to another client: it holds
    /// nothing a reader returns (ARCHITECTURE.md §7), and a grant of it back to this
    /// client then costs no protection change. Free or waiting pages
    /// between two pages in files are made read-only with them, since a
    /// change costs far more per call than per page.
    fn flip(&mut self, view: &mut View, pages: &crate::pages::Pages, changes: &mut Changes) {
        // Read-only, one change per stretch between pool pages, from its
        // first page in a file to its last.
        let mut flip_span = |view: &mut View, (a, b): (u64, u64)| {
            each_run(
                a..b,
                |q| !pages.in_pool(q),
                |r, n| {
                    if let Some(h) = hull(r..r + n, |q| pages.in_file(q)) {
                        view.set(h.start, h.end - h.start, false, changes);
                    }
                },
            );
        };
        self.runs.sort_unstable();
        let mut span: Option<(u64, u64)> = None;
        for &(s, l) in &self.runs {
            span = match span {
                Some((a, b)) if s <= b + BRIDGE => Some((a, b.max(s + l))),
                done => {
                    if let Some(done) = done {
                        flip_span(view, done);
                    }
                    Some((s, s + l))
                }
            };
        }
        if let Some(done) = span {
            flip_span(view, done);
        }
        self.runs.clear();
        self.pages = 0;
    }
}
