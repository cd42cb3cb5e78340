//! The per-file range lock that writers inside one process take (ARCHITECTURE.md §8,
//! "two-level locking"): the write lease orders processes, this orders the
//! threads of one process. A writer locks the byte range `[start, end)` it is
//! about to write; writers of disjoint ranges run in parallel, writers of
//! overlapping ranges take turns.
//!
//! It is a mutex around a short list of requests plus one condition variable.
//! Every request — held or waiting — sits in the list with a ticket taken in
//! arrival order, and a request is granted once no *earlier* request overlaps
//! it. So a waiter is never overtaken by a later overlapping request and
//! cannot starve behind a stream of them; the price is that a later request
//! also waits behind an earlier overlapping *waiter* even when nothing it
//! overlaps is held yet. A release wakes every waiter and each one checks its
//! own range again: the list is a handful of entries (one per writing thread),
//! so a scan is cheaper than anything cleverer.
//!
//! An uncontended `lock` and the guard's drop each take the mutex once, and
//! the list keeps its capacity, so in steady state neither allocates.

use std::fmt;

/// The one place that picks the primitives: loom's under `cfg(loom)`, so the
/// model in `tests/loom_range_lock.rs` explores every interleaving of this
/// very code, and parking_lot's otherwise (as the rest of Ulib uses). The two
/// differ only in how they report poisoning and how `wait` takes the guard.
mod sync {
    #[cfg(loom)]
    pub(super) use loom::sync::{Condvar, Mutex, MutexGuard};
    #[cfg(not(loom))]
    pub(super) use parking_lot::{Condvar, Mutex, MutexGuard};

    #[cfg(loom)]
    pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        // No change to the list is ever left half-done, so the list behind a
        // poisoned mutex is whole: use it, as parking_lot would.
        mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[cfg(not(loom))]
    pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        mutex.lock()
    }

    #[cfg(loom)]
    pub(super) fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        condvar
            .wait(guard)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[cfg(not(loom))]
    pub(super) fn wait<'a, T>(
        condvar: &Condvar,
        mut guard: MutexGuard<'a, T>,
    ) -> MutexGuard<'a, T> {
        condvar.wait(&mut guard);
        guard
    }
}

use sync::{Condvar, Mutex};

/// Locks byte ranges of one file. Held by the open file that writers share.
pub struct RangeLock {
    requests: Mutex<Requests>,
    /// Signalled (all waiters) when a held range is released.
    released: Condvar,
}

/// Held on the byte range it was made for; dropping it unlocks the range.
#[must_use = "the range is unlocked as soon as the guard is dropped"]
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    start: u64,
    end: u64,
    /// `None` for an empty range, which was never entered in the list.
    ticket: Option<u64>,
}

/// What the mutex protects: every request not yet released, in no order
/// (tickets carry the order), and how many of them are waiting.
#[derive(Debug, Default)]
struct Requests {
    list: Vec<Request>,
    next_ticket: u64,
    waiting: usize,
}

#[derive(Debug, Clone, Copy)]
struct Request {
    start: u64,
    end: u64,
    ticket: u64,
}

impl Request {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

impl Requests {
    /// Whether any request other than `ticket` that came before it overlaps
    /// `[start, end)`. Every such request is either held or itself waiting
    /// its turn, and either way this one must wait behind it.
    fn blocked(&self, ticket: u64, start: u64, end: u64) -> bool {
        self.list
            .iter()
            .any(|r| r.ticket < ticket && r.overlaps(start, end))
    }

    fn enter(&mut self, start: u64, end: u64) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.list.push(Request { start, end, ticket });
        ticket
    }
}

impl RangeLock {
    pub fn new() -> RangeLock {
        RangeLock {
            requests: Mutex::new(Requests::default()),
            released: Condvar::new(),
        }
    }

    /// Locks `[start, end)` (`end == u64::MAX` reaches to the end of any
    /// file), blocking while an overlapping range is held or an earlier
    /// overlapping request is still waiting. An empty range (`start >= end`)
    /// locks nothing and returns at once.
    pub fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        if start >= end {
            return self.guard(start, end, None);
        }
        let mut requests = sync::lock(&self.requests);
        let ticket = requests.enter(start, end);
        if requests.blocked(ticket, start, end) {
            requests.waiting += 1;
            while requests.blocked(ticket, start, end) {
                requests = sync::wait(&self.released, requests);
            }
            requests.waiting -= 1;
        }
        self.guard(start, end, Some(ticket))
    }

    /// Locks `[start, end)` if no overlapping range is held or waited for,
    /// else returns `None` without waiting. An empty range always succeeds.
    pub fn try_lock(&self, start: u64, end: u64) -> Option<RangeGuard<'_>> {
        if start >= end {
            return Some(self.guard(start, end, None));
        }
        let mut requests = sync::lock(&self.requests);
        // Every request in the list is earlier than this one would be.
        if requests.list.iter().any(|r| r.overlaps(start, end)) {
            return None;
        }
        let ticket = requests.enter(start, end);
        Some(self.guard(start, end, Some(ticket)))
    }

    fn guard(&self, start: u64, end: u64, ticket: Option<u64>) -> RangeGuard<'_> {
        RangeGuard {
            lock: self,
            start,
            end,
            ticket,
        }
    }

    fn release(&self, ticket: u64) {
        let mut requests = sync::lock(&self.requests);
        let Some(i) = requests.list.iter().position(|r| r.ticket == ticket) else {
            unreachable!("range lock: ticket {ticket} released but not held");
        };
        // `swap_remove` keeps the capacity and the order does not matter.
        requests.list.swap_remove(i);
        // Only a release can unblock a waiter (a grant only turns a waiting
        // request into a held one), and the count read under the mutex is
        // exact, so skipping the notify when it is zero loses no wake-up.
        if requests.waiting > 0 {
            self.released.notify_all();
        }
    }

    /// How many requests are blocked in `lock`, for tests that must know a
    /// thread is waiting before they release what it waits for.
    #[cfg(all(test, not(loom)))]
    fn waiting(&self) -> usize {
        sync::lock(&self.requests).waiting
    }
}

impl Default for RangeLock {
    fn default() -> RangeLock {
        RangeLock::new()
    }
}

impl fmt::Debug for RangeLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The mutex is only ever held inside this module, never across a call
        // out, so taking it here cannot deadlock.
        let requests = sync::lock(&self.requests);
        let mut list = requests.list.clone();
        list.sort_unstable_by_key(|r| r.ticket);
        f.debug_struct("RangeLock")
            .field(
                "requests",
                &list.iter().map(|r| r.start..r.end).collect::<Vec<_>>(),
            )
            .field("waiting", &requests.waiting)
            .finish()
    }
}

impl RangeGuard<'_> {
    /// The first byte of the locked range.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// One past the last byte of the locked range.
    pub fn end(&self) -> u64 {
        self.end
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            self.lock.release(ticket);
        }
    }
}

impl fmt::Debug for RangeGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RangeGuard")
            .field("range", &(self.start..self.end))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::thread;

    /// Spins (yielding) until `lock` has `n` blocked requests. Not a timing
    /// assumption: it only makes sure the thread under test has got as far
    /// as waiting before the test goes on.
    fn until_waiting(lock: &RangeLock, n: usize) {
        while lock.waiting() != n {
            thread::yield_now();
        }
    }

    #[test]
    fn is_send_sync_default_and_debug() {
        fn check<T: Send + Sync + Default + fmt::Debug>() {}
        check::<RangeLock>();
        fn guard<T: Send + Sync + fmt::Debug>() {}
        guard::<RangeGuard<'_>>();
    }

    #[test]
    fn overlapping_range_is_refused_while_held() {
        let lock = RangeLock::new();
        let held = lock.lock(0, 100);
        assert!(lock.try_lock(50, 150).is_none());
        assert!(lock.try_lock(0, 1).is_none());
        assert!(lock.try_lock(99, 100).is_none());
        assert!(lock.try_lock(0, 100).is_none());
        drop(held);
        assert!(lock.try_lock(50, 150).is_some());
    }

    #[test]
    fn overlapping_lock_blocks_until_guard_drops() {
        let lock = RangeLock::new();
        let held = lock.lock(0, 4096);
        let (tx, rx) = mpsc::channel();
        thread::scope(|s| {
            s.spawn(|| {
                let guard = lock.lock(1024, 8192);
                tx.send((guard.start(), guard.end())).unwrap();
            });
            until_waiting(&lock, 1);
            // The other thread is parked on the overlap: it has sent nothing.
            assert_eq!(rx.try_recv(), Err(mpsc::TryRecvError::Empty));
            drop(held);
            assert_eq!(rx.recv(), Ok((1024, 8192)));
        });
        assert_eq!(lock.waiting(), 0);
        assert!(lock.try_lock(0, u64::MAX).is_some());
    }

    #[test]
    fn disjoint_ranges_are_held_at_once() {
        let lock = RangeLock::new();
        let a = lock.lock(0, 10);
        let b = lock.lock(20, 30);
        let c = lock
            .try_lock(10, 20)
            .expect("the gap between two held ranges is free");
        assert!(lock.try_lock(5, 25).is_none());
        drop((a, b, c));

        // And from two threads, each waiting inside its guard for the other
        // to be inside its own: this only finishes if both hold at once.
        let inside = AtomicUsize::new(0);
        thread::scope(|s| {
            for (start, end) in [(0, 10), (10, 20)] {
                let (lock, inside) = (&lock, &inside);
                s.spawn(move || {
                    let _guard = lock.lock(start, end);
                    inside.fetch_add(1, Ordering::SeqCst);
                    while inside.load(Ordering::SeqCst) < 2 {
                        thread::yield_now();
                    }
                });
            }
        });
    }

    #[test]
    fn adjacent_ranges_do_not_conflict() {
        let lock = RangeLock::new();
        let _low = lock.lock(0, 4096);
        let _high = lock
            .try_lock(4096, 8192)
            .expect("[0, 4096) and [4096, 8192) share no byte");
        assert!(lock.try_lock(4095, 4097).is_none());
    }

    #[test]
    fn infinite_range_conflicts_with_everything_after_its_start() {
        let lock = RangeLock::new();
        let _tail = lock.lock(100, u64::MAX);
        for (start, end) in [
            (100, 101),
            (99, 101),
            (1 << 40, 1 << 41),
            (u64::MAX - 1, u64::MAX),
        ] {
            assert!(lock.try_lock(start, end).is_none(), "[{start}, {end})");
        }
        assert!(lock.try_lock(0, u64::MAX).is_none());
        let _head = lock
            .try_lock(0, 100)
            .expect("[0, 100) ends where the infinite range starts");
    }

    #[test]
    fn empty_range_locks_nothing() {
        let lock = RangeLock::new();
        let _all = lock.lock(0, u64::MAX);
        // Inside the held range and reversed: neither blocks nor conflicts.
        let empty = lock.lock(10, 10);
        assert_eq!((empty.start(), empty.end()), (10, 10));
        let _reversed = lock.lock(20, 5);
        assert!(lock.try_lock(7, 7).is_some());
        drop(empty);
        assert!(lock.try_lock(0, 1).is_none());
    }

    #[test]
    fn later_request_does_not_overtake_a_waiter() {
        let lock = RangeLock::new();
        let held = lock.lock(0, 10);
        let (tx, rx) = mpsc::channel();
        thread::scope(|s| {
            let (lock, waiter_tx) = (&lock, tx.clone());
            s.spawn(move || {
                let _guard = lock.lock(5, 20);
                waiter_tx.send("waiter").unwrap();
            });
            until_waiting(lock, 1);
            // [15, 25) overlaps nothing held, but it overlaps the waiter,
            // which came first.
            assert!(lock.try_lock(15, 25).is_none());
            s.spawn(move || {
                let _guard = lock.lock(15, 25);
                tx.send("later").unwrap();
            });
            until_waiting(lock, 2);
            drop(held);
            assert_eq!(rx.recv(), Ok("waiter"));
            assert_eq!(rx.recv(), Ok("later"));
        });
    }

    #[test]
    fn overlapping_writers_never_share_a_byte() {
        const CELLS: usize = 16;
        let lock = RangeLock::new();
        let owners: Vec<AtomicUsize> = (0..CELLS).map(|_| AtomicUsize::new(0)).collect();
        thread::scope(|s| {
            for t in 0..4u64 {
                let (lock, owners) = (&lock, &owners);
                s.spawn(move || {
                    let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    for _ in 0..2000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let start = x % CELLS as u64;
                        let end = start + 1 + (x >> 32) % (CELLS as u64 - start);
                        let _guard = lock.lock(start, end);
                        let cells =
                            &owners[usize::try_from(start).unwrap()..usize::try_from(end).unwrap()];
                        for cell in cells {
                            assert_eq!(cell.fetch_add(1, Ordering::Relaxed), 0);
                        }
                        for cell in cells {
                            cell.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(lock.waiting(), 0);
    }

    #[test]
    fn steady_state_keeps_capacity() {
        let lock = RangeLock::new();
        drop((lock.lock(0, 1), lock.lock(1, 2)));
        let capacity = sync::lock(&lock.requests).list.capacity();
        for i in 0..100 {
            drop((lock.lock(i, i + 1), lock.try_lock(i + 1, i + 2)));
        }
        let requests = sync::lock(&lock.requests);
        assert!(requests.list.is_empty());
        assert_eq!(requests.list.capacity(), capacity);
    }

    #[test]
    fn debug_lists_requests_in_arrival_order() {
        let lock = RangeLock::new();
        let _b = lock.lock(20, 30);
        let a = lock.lock(0, 10);
        assert_eq!(format!("{a:?}"), "RangeGuard { range: 0..10 }");
        assert_eq!(
            format!("{lock:?}"),
            "RangeLock { requests: [20..30, 0..10], waiting: 0 }"
        );
    }
}
