//! Memory provisioning ahead of use. Index items and log entries land on
//! pages that the kernel allocates (and zeroes) on first touch — for an
//! emulated region, for the index always. Touching a fresh page costs a
//! fault and a page clear, a few microseconds, on the path of the request
//! that happens to touch it. The Kfs thread, when it has nothing to serve,
//! populates the pages just ahead of the index's allocation point and the
//! log's write position instead, so requests find them ready.
//!
//! With huge pages enabled (`ServerConfig::huge_pages`) for an image on
//! tmpfs, the log's and the index's memory comes in huge pages instead
//! (2 MiB each, one TLB entry where small pages take 512), and so do the
//! data pages. How depends on the clients:
//!
//! - *Ahead* ([`Provisioner::set_huge_ahead`], for clients whose pages'
//!   protection never changes): the Kfs thread makes huge the chunks just
//!   ahead of the highest page granted so far, where grants of fresh pages
//!   go next. Making a chunk huge allocates and clears 2 MiB: about 0.5
//!   ms, and several ms while the machine's memory is cold. Done on the
//!   path of the writer whose grant needed the chunk, that stalled every
//!   write behind it.
//! - Otherwise the chunks ahead are allocated in small pages, as without
//!   huge pages (below), and made huge later, behind.
//!
//! *Behind*: a writer can outrun the Kfs thread, and without huge pages
//! ahead every chunk is allocated small; so the Kfs thread goes back over
//! the chunks below, one per step, and makes huge those not huge yet (the
//! kernel copies their small pages into the huge one). It does so only
//! once Kfs has been quiet a while, a chunk at a time a pace apart, or all
//! at once when asked (see [`Behind`]): a chunk made huge under a writer
//! unmaps the writer's pages, and on a fresh image, making chunks huge as
//! fast as the writers outran provisioning kept the Kfs thread busy
//! clearing memory and the writer faulting, several times slower than
//! with huge pages off. Made behind, random overwrites run as fast as
//! with huge pages off, and reads of the chunks, huge once written, gain
//! from the fewer TLB misses.
//!
//! A chunk the kernel would not make huge when asked, for a reason of the
//! moment (no huge page free, a page of it busy), is asked for again once
//! nothing else is due, one chunk at a time, a second after the last try
//! at the soonest and longer after each that fails (`RETRY_FIRST`).
//!
//! Without huge pages ahead, the data pages just ahead of the highest
//! granted of a sparse image
//! ([`Space::Sparse`](kucofs_common::pm::Space::Sparse)) are allocated
//! and cleared all the same (one chunk a step): a client maps each run
//! granted to it into its view at once, and where the image had no
//! memory for the pages yet, that mapping allocated and cleared them on
//! the writer's path (a quarter of a random overwriter's time on a fresh
//! image). Their memory is asked for first ([`Region::reserve`]), and
//! only then are they touched ([`Region::touch`]): a touch of a page the
//! file system under the image has no room for would kill the process;
//! a failed reservation is left to the grant of those pages, which fails
//! with `ENOSPC`. Reserving alone is not enough: tmpfs clears a page at
//! its first fault, so the writer would pay for the clear. A reserved
//! image (the default) was allocated and cleared when it was made, and
//! nothing is done for its data pages, which reading a byte of each
//! through Kfs's own mapping would only map there, at a cost to the
//! writers and no gain.
//! The log's pages ahead are read a byte each through Kfs's own mapping
//! ([`Region::prefault`]) rather than populated in one system call:
//! populating holds the process's memory-map lock, and in the same
//! process a client's protection changes wait for it (in profiles of a
//! random overwriter, they waited for the log's provisioning).
//!
//! Populating needs no lock: it changes no contents, only makes pages
//! present, and may run while another thread writes nearby.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kucofs_common::format::{Area, PAGE_SIZE};
use kucofs_common::index::layout::HDR_USED;
use kucofs_common::pm::{Region, Shm, Words, HUGE_PAGE};

/// Pages are kept populated this far ahead of use.
pub(crate) const AHEAD: u64 = 32 << 20;
/// One step populates this much, so a step never delays a queued request
/// by much.
const CHUNK: u64 = 512 << 10;
/// A chunk the kernel would not make huge is asked for again no sooner
/// than this after the last such try: what stopped it (memory short of
/// free huge pages) passes slowly, and each try costs a system call that
/// may copy 2 MiB, or make the kernel compact memory. Each try that fails
/// doubles the wait, up to [`RETRY_MAX`]; one that succeeds resets it.
pub(crate) const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between retries.
const RETRY_MAX: Duration = Duration::from_secs(64);

/// The Kfs thread's background page provisioning.
#[derive(Debug)]
pub struct Provisioner {
    index: Arc<Shm>,
    region: Arc<Region>,
    log: Area,
    log_pos: Arc<AtomicU64>,
    /// The data pages, and one past the highest page granted so far.
    data: Area,
    data_high: Arc<AtomicU64>,
    index_done: u64,
    log_done: u64,
    data_done: u64,
    /// How far the catch-up over the data chunks below those provisioned
    /// or granted has come: every chunk below was asked for.
    data_back: u64,
    /// When a chunk the kernel would not make huge was last asked for
    /// again, and how long to wait after that before the next try.
    retried: Option<(Instant, Duration)>,
    /// With huge pages: the data chunks just ahead of the grants are made
    /// huge too, not only allocated ([`Provisioner::set_huge_ahead`]).
    huge_ahead: bool,
    /// When a chunk below those provisioned ahead was last made huge.
    behind_at: Option<Instant>,
}

/// When the Kfs thread, with huge pages, makes huge the data chunks below
/// those provisioned ahead: chunks writers reached before provisioning
/// did, and those it allocated in small pages (without
/// [`Provisioner::set_huge_ahead`]). Making a chunk huge that a writer is
/// filling unmaps the writer's pages, so that every one faults again, and
/// takes the Kfs thread's time to copy and clear 2 MiB: on a fresh image,
/// doing it as soon as nothing else was due took random overwrites from
/// 0.9x tmpfs to 0.3x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behind {
    /// Not now: Kfs was asked for something lately.
    Hold,
    /// Kfs has been quiet: one chunk every `BEHIND_PACE`, so that
    /// a quiet Kfs leaves the machine's processors and memory to others.
    Paced,
    /// Every chunk due, one a step.
    Now,
}

/// The least time between two chunks made huge under [`Behind::Paced`].
pub(crate) const BEHIND_PACE: Duration = Duration::from_millis(10);

impl Provisioner {
    /// Provisioning for an index, a region's log area whose write
    /// position `log_pos` publishes, and its data pages, granted up to
    /// the page `data_high` publishes.
    pub fn new(
        index: Arc<Shm>,
        region: Arc<Region>,
        (log, log_pos): (Area, Arc<AtomicU64>),
        (data, data_high): (Area, Arc<AtomicU64>),
    ) -> Self {
        Provisioner {
            index,
            region,
            log,
            log_pos,
            data,
            data_high,
            index_done: 0,
            log_done: 0,
            data_done: 0,
            data_back: 0,
            retried: None,
            huge_ahead: true,
            behind_at: None,
        }
    }

    /// Whether, with huge pages, the data chunks just ahead of the grants
    /// are made huge (on, the default) or only allocated in small pages,
    /// to be made huge once writes pause (see [`Behind`]).
    pub fn set_huge_ahead(&mut self, on: bool) {
        self.huge_ahead = on;
    }

    /// True if, with huge pages, a data chunk below those provisioned may
    /// still need making huge: whatever [`Behind`] says now, a sleeping
    /// Kfs thread then wakes at least every `BEHIND_PACE`, so that the
    /// chunks are made soon once Kfs is quiet.
    pub fn behind_pending(&self) -> bool {
        self.region.can_make_huge() && self.behind() > 0
    }

    /// With huge pages, whether the data chunks just ahead of the grants
    /// are made huge.
    fn ahead_huge(&self) -> bool {
        self.huge_ahead && self.region.can_make_huge()
    }

    /// The bytes of data pages below those provisioned or granted so far
    /// that were not gone over to be made huge, from `data_back`.
    fn behind(&self) -> u64 {
        self.data_done
            .max(self.granted())
            .saturating_sub(self.data_back)
    }

    /// How far into the data pages grants have reached (a hint, as
    /// `Pages::grant` says).
    fn granted(&self) -> u64 {
        let high = self.data_high.load(Ordering::Relaxed);
        high.saturating_sub(self.data.start) * PAGE_SIZE
    }

    /// True if a chunk is due: [`Provisioner::step`] would populate one,
    /// given `behind`.
    pub fn is_due(&self, behind: Behind) -> bool {
        self.next(behind).is_some()
    }

    /// Populates one chunk ahead of use, if any is due, the data chunks
    /// below those ahead made huge as `behind` says; false if all is
    /// provisioned.
    pub fn step(&mut self, behind: Behind) -> bool {
        let Some((stream, at, n)) = self.next(behind) else {
            return false;
        };
        match stream {
            Stream::Index => {
                self.index.populate(at, n);
                self.index_done = at + n;
            }
            Stream::Log => {
                // A sparse image's log had its memory when it was opened.
                self.region.prefault(self.log.offset() + at, n);
                self.log_done = at + n;
            }
            Stream::Data => {
                let offset = self.data.offset() + at;
                if self.ahead_huge() {
                    self.region.make_huge(offset, n);
                } else if self.region.reserve(offset, n).is_ok() {
                    // Cleared here, not at the client's first store. If
                    // there was no room, a grant of these pages fails
                    // with `ENOSPC`.
                    self.region.touch(offset, n);
                }
                self.data_done = at + n;
            }
            Stream::Behind => {
                self.region.make_huge(self.data.offset() + at, n);
                self.data_back = at + n;
                self.behind_at = Some(Instant::now());
            }
            Stream::Retry => {
                let made = self.region.retry_huge().or_else(|| self.index.retry_huge());
                let wait = next_wait(made, self.retried.map(|(_, wait)| wait));
                self.retried = Some((Instant::now(), wait));
            }
        }
        true
    }

    /// The chunk to provision next, in the order index, log, data: its
    /// stream, its offset in that stream's space, and its length.
    fn next(&self, behind: Behind) -> Option<(Stream, u64, u64)> {
        let used = self.index.load_u64(HDR_USED, Ordering::Relaxed);
        if let Some((at, n)) = due(self.index_done, used, self.index.len(), CHUNK) {
            return Some((Stream::Index, at, n));
        }
        let pos = self.log_pos.load(Ordering::Relaxed);
        if let Some((at, n)) = due(self.log_done, pos, self.log.len(), CHUNK) {
            return Some((Stream::Log, at, n));
        }
        // Without huge pages ahead, a reserved image's data pages need
        // nothing: they have their memory already.
        let chunk = match self.ahead_huge() {
            true => Some(HUGE_PAGE as u64),
            false => (!self.region.is_reserved()).then_some(CHUNK),
        };
        if let Some((at, n)) =
            chunk.and_then(|c| due(self.data_done, self.granted(), self.data.len(), c))
        {
            return Some((Stream::Data, at, n));
        }
        let now = match behind {
            Behind::Hold => false,
            Behind::Paced => self.behind_at.is_none_or(|t| t.elapsed() >= BEHIND_PACE),
            Behind::Now => true,
        };
        if now && self.behind_pending() {
            let n = self.behind().min(HUGE_PAGE as u64);
            return Some((Stream::Behind, self.data_back, n));
        }
        // The index may have huge pages where the region has none. The
        // clock is read only when a chunk waits: this runs at every idle
        // poll of the Kfs thread.
        let retry = (self.region.huge_retry_due() || self.index.huge_retry_due())
            && self.retried.is_none_or(|(at, wait)| at.elapsed() >= wait);
        retry.then_some((Stream::Retry, 0, 0))
    }
}

/// How long to wait after a retry whose outcome was `made` (`Some(true)`:
/// the chunk is huge now; `None`: no chunk was left to ask for), the wait
/// before that retry having been `last`: twice as long after a failure
/// that followed one, up to [`RETRY_MAX`]; else [`RETRY_FIRST`].
fn next_wait(made: Option<bool>, last: Option<Duration>) -> Duration {
    match (made, last) {
        (Some(false), Some(wait)) => (wait * 2).min(RETRY_MAX),
        _ => RETRY_FIRST,
    }
}

/// What a provisioning step prepares.
#[derive(Debug, Clone, Copy)]
enum Stream {
    /// The index's memory, just past its allocation point.
    Index,
    /// The log area, just past its write position.
    Log,
    /// The data pages just past the highest granted, made huge, or else
    /// allocated.
    Data,
    /// The data pages below those, made huge where use overtook
    /// [`Stream::Data`] (chunks already asked for cost nothing).
    Behind,
    /// One chunk, of the region or else the index, that the kernel would
    /// not make huge when asked, asked for again.
    Retry,
}

/// The bytes to populate next, as (offset, length), in a space of `len`
/// bytes used up to `at` and populated up to `done`: a whole `chunk` once
/// that much of the [`AHEAD`] window is unpopulated, or the rest of the
/// space at its end. Never less: the window slides on by a few bytes with
/// every allocation or log entry, and populating such slivers would cost a
/// step for each.
fn due(done: u64, at: u64, len: u64, chunk: u64) -> Option<(u64, u64)> {
    // Use overtook provisioning: what lies behind was touched anyway.
    let from = done.max(at);
    let target = at.saturating_add(AHEAD).min(len);
    let left = target.saturating_sub(from);
    (left >= chunk || (left > 0 && target == len)).then(|| (from, left.min(chunk)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provisioning_goes_in_whole_chunks_except_at_the_end() {
        let len = 4 * AHEAD;
        let due = |done, at| due(done, at, len, CHUNK);
        assert_eq!(due(0, 0), Some((0, CHUNK)));
        // Everything ahead populated: a few bytes more use is not a chunk.
        assert_eq!(due(AHEAD, 64), None);
        assert_eq!(due(AHEAD, CHUNK - 1), None);
        assert_eq!(due(AHEAD, CHUNK), Some((AHEAD, CHUNK)));
        // Use that overtook provisioning moves it on.
        assert_eq!(due(0, 3 * AHEAD), Some((3 * AHEAD, CHUNK)));
        // Near the end, the rest, however short.
        assert_eq!(due(len - 100, len - AHEAD), Some((len - 100, 100)));
        assert_eq!(due(len, len - 10), None);
    }

    #[test]
    fn retries_that_fail_wait_twice_as_long_each_time_up_to_the_most() {
        let mut wait = next_wait(Some(false), None);
        assert_eq!(wait, RETRY_FIRST);
        let mut waits = vec![wait];
        for _ in 0..10 {
            wait = next_wait(Some(false), Some(wait));
            waits.push(wait);
        }
        let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 64, 64, 64, 64]);
        // A success, or nothing left to ask for, starts over.
        assert_eq!(next_wait(Some(true), Some(RETRY_MAX)), RETRY_FIRST);
        assert_eq!(next_wait(None, Some(RETRY_MAX)), RETRY_FIRST);
    }
}
