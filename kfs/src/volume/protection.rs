//! Protection of clients' data pages, Kfs's side (ARCHITECTURE.md §13):
//! for each client view Kfs changes the protection of, which data pages
//! are writable there ([`View`]); the decisions that make pages writable
//! (a grant) or read-only again (a commit under the client's
//! [`Protection`] mode, the expiry of a batch, pages the metadata store
//! takes); the protection changes decided and not yet made ([`Changes`]),
//! made at once or deferred past the volume's lock ([`make_deferred`]);
//! and what a change that failed leaves ([`Failure`]).
//!
//! The other pieces live elsewhere:
//!
//! - the primitive: the [`Protection`] modes (the user-facing option),
//!   [`BATCH_PAGES`] and [`BATCH_TIME`], the [`Protector`] that calls
//!   `mprotect` on a view's write window, protection keys, and the
//!   [`PoolWriter`](kucofs_common::pm::PoolWriter) a client stores
//!   through, in `common/src/pm/region.rs` and `common/src/pm/keys.rs`;
//! - in `kfs/src/server.rs`: `Direct` hands a client thread's own
//!   request to [`Volume::handle_deferred`] and then its lock to
//!   [`make_deferred`]; the Kfs thread calls
//!   [`Volume::expire_protection`] by the [`Volume::batch_deadline`] it
//!   planned;
//! - the client's side (its views, its protection mode, the writes
//!   through its pool) in `ulib/src/fs.rs` and `ulib/src/file.rs`.

use std::sync::Arc;

use kucofs_common::pm::{Protection, Protector, BATCH_PAGES, BATCH_TIME};
use kucofs_common::proto::{Extents, Reply, Request};
use kucofs_common::Errno;
use parking_lot::{Mutex, MutexGuard};

use super::{Caller, Volume};
use crate::namespace::{now_ns, STAMP_LEAD};
use crate::pages::page_index;

/// How a client's view holds one data page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
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
pub(super) struct View {
    /// The client whose view it is.
    pub(super) client: u32,
    pub(super) protector: Protector,
    /// The first data page; `held[i]` is about page `base + i`.
    pub(super) base: u64,
    pub(super) held: Vec<Held>,
}

impl View {
    fn held(&self, page: u64) -> Held {
        self.held[page_index(page - self.base)]
    }

    /// True if every page of `range` is writable here.
    pub(super) fn writable(&self, range: std::ops::Range<u64>) -> bool {
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
    pub(super) fn set(&mut self, start: u64, n: u64, writable: bool, changes: &mut Changes) {
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
        let held = &mut self.held[page_index(r - self.base)..page_index(q - self.base)];
        if writable {
            changes.0.push(change(r, q - r, What::Writable));
            each_run(
                r..q,
                |x| held[page_index(x - r)] == Held::Never,
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
        self.held[page_index(a)..page_index(b)].fill(Held::Unknown);
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
    /// `Volume::protection_failed`. A failed change to writable is a
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
pub(super) struct Pending {
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
    since.saturating_add(BATCH_NS)
}

/// [`BATCH_TIME`] in the nanoseconds of [`now_ns`].
// Lossless: the bound is a few milliseconds, far inside an `i64` of
// nanoseconds, which the assertion checks at compile time.
#[allow(clippy::cast_possible_truncation)]
const BATCH_NS: i64 = {
    assert!(BATCH_TIME.as_nanos() < 1 << 62);
    BATCH_TIME.as_nanos() as i64
};

/// The protection state that is not any one client's.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// When Kfs will next make the expired batches read-only
    /// ([`Volume::plan_expiry_check`]; 0 until it says).
    expiry_check_at: i64,
    /// A commit opened a batch due before that check, and Kfs must be
    /// woken to look at it sooner ([`Volume::take_wake_kfs`]).
    wake_kfs: bool,
    /// Protection changes decided and not yet made.
    pub(super) changes: Changes,
    /// Changes are left for the caller to make
    /// ([`Volume::handle_deferred`]).
    defer: bool,
    /// Held while changes are made ([`Volume::protection_order`]).
    order: Arc<Mutex<()>>,
}

impl Volume {
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
        let changes = &mut self.protection.changes;
        for c in self.data.clients.values_mut() {
            let Some(v) = &mut c.view else { continue };
            for &p in taken {
                v.set(p, 1, false, changes);
            }
        }
        let _ = self.settle_protection();
    }

    /// Makes committed pages read-only again as the client's protection
    /// mode says.
    pub(super) fn after_commit(&mut self, caller: Caller, extents: &Extents, now: i64) {
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
                    v.set(
                        e.start.get(),
                        u64::from(e.len),
                        false,
                        &mut self.protection.changes,
                    );
                }
            }
            Protection::Batched => {
                let pend = c.pending.entry(caller.slot).or_default();
                if pend.runs.is_empty() {
                    pend.since = now.saturating_sub(STAMP_LEAD);
                    self.protection.wake_kfs |=
                        batch_deadline(pend.since) < self.protection.expiry_check_at;
                }
                for e in extents.as_slice() {
                    let (s, l) = (e.start.get(), u64::from(e.len));
                    match pend.runs.last_mut() {
                        Some(last) if last.0 + last.1 == s => last.1 += l,
                        _ => pend.runs.push((s, l)),
                    }
                    pend.pages += l;
                }
                if pend.pages >= BATCH_PAGES || batch_expired(pend.since, now) {
                    pend.flip(v, &self.pages, &mut self.protection.changes);
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
        self.protection.expiry_check_at = at;
    }

    /// True if a commit since the last call opened a batch due before
    /// the planned check; the caller wakes Kfs.
    pub fn take_wake_kfs(&mut self) -> bool {
        std::mem::take(&mut self.protection.wake_kfs)
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
                    pend.flip(v, &self.pages, &mut self.protection.changes);
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
    pub fn handle_deferred(&mut self, req: &Request<'_>, caller: Caller) -> Result<Reply, Errno> {
        self.protection.defer = true;
        let reply =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(req, caller)));
        // Even after a panic: the next call must not leave its changes to
        // a caller that is gone (those queued are made by the next call
        // that makes its own); and an entry this thread logged must drain
        // on this thread, whose fence alone waits for its stores, before
        // the volume's lock passes to another.
        self.protection.defer = false;
        self.log.fence(self.image.region());
        reply.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// The protection changes decided and not yet made (after
    /// [`Volume::handle_deferred`]), for the caller to
    /// [make](Changes::make) under [`Volume::protection_order`], taken
    /// before it releases the volume's lock.
    pub fn take_protection_changes(&mut self) -> Changes {
        std::mem::take(&mut self.protection.changes)
    }

    /// The lock protection changes are made under, in the order they were
    /// decided (see [`Changes`]).
    pub fn protection_order(&self) -> Arc<Mutex<()>> {
        self.protection.order.clone()
    }

    /// After changes that [`Volume::handle_deferred`] left failed: records
    /// them (`Volume::protection_failed`), and if `req` was a grant whose
    /// pages could not be made writable, takes the grant (`reply`) back
    /// and answers `EIO` instead. The caller holds the volume's lock again.
    pub fn deferred_changes_failed(
        &mut self,
        failed: &[Failure],
        req: &Request<'_>,
        caller: Caller,
        reply: Result<Reply, Errno>,
    ) -> Result<Reply, Errno> {
        self.protection_failed(failed);
        let grant = match reply {
            Ok(Reply::Grant(g)) if matches!(req, Request::Grant { .. }) => g,
            _ => return reply,
        };
        if !failed.iter().any(|f| f.writable) {
            return reply;
        }
        // The caller's thread, which alone takes from that pool, is the
        // one asking: nothing took from the grant since. Every run of it
        // goes back: the caller, told EIO, learns of none.
        for (start, n) in grant.runs() {
            self.undo_grant(caller, start.get(), n);
        }
        Err(Errno::EIO)
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

    /// Makes the protection changes decided so far, unless they are
    /// deferred. `EIO` if a change to writable failed.
    pub(super) fn settle_protection(&mut self) -> Result<(), Errno> {
        if self.protection.defer || self.protection.changes.is_empty() {
            return Ok(());
        }
        let changes = std::mem::take(&mut self.protection.changes);
        let failed = {
            let _order = self.protection.order.lock();
            changes.make()
        };
        self.protection_failed(&failed);
        match failed.iter().any(|f| f.writable) {
            true => Err(Errno::EIO),
            false => Ok(()),
        }
    }
}

/// Makes the protection changes a request applied under `guard` (the
/// lock of the volume in `lock`, through [`Volume::handle_deferred`])
/// decided, after releasing `guard`, and returns `reply`, or what
/// [`Volume::deferred_changes_failed`] makes of it if some failed. The
/// changes are taken under the volume's lock and made under its
/// [protection order](Volume::protection_order), `order`, taken before
/// the volume's lock is released: changes are made in the order they were
/// decided, while other requests go on. A failure takes `lock` again.
pub fn make_deferred(
    mut guard: MutexGuard<'_, Option<Volume>>,
    lock: &Mutex<Option<Volume>>,
    order: &Mutex<()>,
    req: &Request<'_>,
    caller: Caller,
    reply: Result<Reply, Errno>,
) -> Result<Reply, Errno> {
    let Some(volume) = guard.as_mut() else {
        return reply;
    };
    let changes = volume.take_protection_changes();
    if changes.is_empty() {
        return reply;
    }
    let order = order.lock();
    drop(guard);
    let failed = changes.make();
    drop(order);
    if failed.is_empty() {
        return reply;
    }
    match lock.lock().as_mut() {
        Some(v) => v.deferred_changes_failed(&failed, req, caller, reply),
        None => reply,
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
    pub(super) fn flip(
        &mut self,
        view: &mut View,
        pages: &crate::pages::Pages,
        changes: &mut Changes,
    ) {
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
