#![cfg(loom)]
//! Loom models of the range lock (`ulib/src/range_lock.rs`, which builds on
//! loom's `Mutex` and `Condvar` under `cfg(loom)`): loom runs each model
//! under every interleaving of its threads and fails on a panic, a deadlock
//! or a spin that never ends. The models are small enough to explore without
//! a preemption bound, all of them in a few seconds in release.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p kucofs-ulib --release --test loom_range_lock
//! ```
//!
//! Each model of `lock` also runs against a deliberately broken lock and
//! must fail there, which shows it can see the bug it is meant to catch.
//! (`try_lock_excludes_like_lock` has no broken twin: the broken locks have
//! no `try_lock`.)

use kucofs_ulib::range_lock::{RangeGuard, RangeLock};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The bytes the models write, in cells of `CELL` bytes.
const CELL: u64 = 10;
const CELLS: usize = 4;

/// What the models lock with: the real lock, or a broken one.
trait Ranges: Send + Sync + 'static {
    fn lock(&self, start: u64, end: u64) -> RangeGuard<'_>;
}

impl Ranges for RangeLock {
    fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        RangeLock::lock(self, start, end)
    }
}

/// Broken: locks only the first byte of each range, so ranges that overlap
/// without sharing a start byte run at the same time.
struct FirstByteOnly(RangeLock);

impl Ranges for FirstByteOnly {
    fn lock(&self, start: u64, _end: u64) -> RangeGuard<'_> {
        self.0.lock(start, start + 1)
    }
}

/// Broken the other way: every range is the whole file, so disjoint writers
/// take turns instead of running at once.
struct WholeFile(RangeLock);

impl Ranges for WholeFile {
    fn lock(&self, _start: u64, _end: u64) -> RangeGuard<'_> {
        self.0.lock(0, u64::MAX)
    }
}

/// The file the writers write. All its atomics are `Relaxed` on purpose: the
/// range lock alone must order one holder's accesses before the next's.
struct File {
    /// How many writers are inside a guard covering each cell right now.
    holders: [AtomicUsize; CELLS],
    /// How many writes each cell has taken, bumped with a separate load and
    /// store (not an atomic add), so two writers at once, or a lock that does
    /// not carry the last writer's store to the next, lose an update.
    writes: [AtomicUsize; CELLS],
}

impl File {
    fn new() -> File {
        File {
            holders: std::array::from_fn(|_| AtomicUsize::new(0)),
            writes: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }

    fn cells(start: u64, end: u64) -> std::ops::Range<usize> {
        (start / CELL) as usize..end.div_ceil(CELL) as usize
    }

    /// What a writer does inside its guard on `[start, end)`.
    fn write(&self, start: u64, end: u64) {
        for cell in File::cells(start, end) {
            let inside = self.holders[cell].fetch_add(1, Ordering::Relaxed);
            assert_eq!(inside, 0, "two holders of cell {cell} inside at once");
            let writes = self.writes[cell].load(Ordering::Relaxed);
            self.writes[cell].store(writes + 1, Ordering::Relaxed);
        }
        for cell in File::cells(start, end) {
            self.holders[cell].fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn writes(&self) -> [usize; CELLS] {
        std::array::from_fn(|cell| self.writes[cell].load(Ordering::Relaxed))
    }
}

/// Three writers of a chain of ranges: [0, 20) and [10, 30) overlap, as do
/// [10, 30) and [20, 40); [0, 20) and [20, 40) are disjoint. So the middle
/// one waits for either end, and while it waits it holds up the other end
/// too: no two overlapping holders are ever inside at once, no update is
/// lost, and every waiter is woken (else loom reports a deadlock).
fn overlapping_writers<L: Ranges>(new: fn() -> L) {
    loom::model(move || {
        let lock = Arc::new(new());
        let file = Arc::new(File::new());
        let writers: Vec<_> = [(0, 20), (10, 30)]
            .into_iter()
            .map(|(start, end)| {
                let (lock, file) = (Arc::clone(&lock), Arc::clone(&file));
                thread::spawn(move || {
                    let _guard = lock.lock(start, end);
                    file.write(start, end);
                })
            })
            .collect();
        {
            let _guard = lock.lock(20, 40);
            file.write(20, 40);
        }
        for writer in writers {
            writer.join().unwrap();
        }
        // Joined: every write happens-before these loads.
        assert_eq!(
            file.writes(),
            [1, 2, 2, 1],
            "a write was lost: two writers were inside at once, or one's store \
             was not ordered before the next one's load"
        );
    });
}

#[test]
fn overlapping_writers_exclude_each_other() {
    overlapping_writers(RangeLock::new);
}

#[test]
#[should_panic(expected = "inside at once")]
fn model_catches_lock_of_first_byte_only() {
    overlapping_writers(|| FirstByteOnly(RangeLock::new()));
}

/// `try_lock` excludes like `lock`: a writer that gets the range while
/// another holds an overlapping one would be caught inside with it.
#[test]
fn try_lock_excludes_like_lock() {
    loom::model(|| {
        let lock = Arc::new(RangeLock::new());
        let file = Arc::new(File::new());
        let writer = {
            let (lock, file) = (Arc::clone(&lock), Arc::clone(&file));
            thread::spawn(move || {
                let _guard = lock.lock(0, 20);
                file.write(0, 20);
            })
        };
        let wrote = match lock.try_lock(10, 30) {
            Some(_guard) => {
                file.write(10, 30);
                true
            }
            None => false,
        };
        writer.join().unwrap();
        assert_eq!(
            file.writes(),
            [1, usize::from(wrote) + 1, usize::from(wrote), 0]
        );
    });
}

/// Two writers of [0, 10) and [10, 20): each, inside its guard, waits for
/// the other to be inside too. That ends only if both hold their ranges at
/// once; a lock that made them take turns leaves one spinning forever.
fn disjoint_writers<L: Ranges>(new: fn() -> L) {
    loom::model(move || {
        let lock = Arc::new(new());
        // Release on the store, Acquire on the load, though nothing is
        // published through them: the flags only report "I am inside".
        let inside = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let writers: Vec<_> = [(0, 10), (10, 20)]
            .into_iter()
            .enumerate()
            .map(|(me, (start, end))| {
                let (lock, inside) = (Arc::clone(&lock), Arc::clone(&inside));
                thread::spawn(move || {
                    let _guard = lock.lock(start, end);
                    inside[me].store(true, Ordering::Release);
                    while !inside[1 - me].load(Ordering::Acquire) {
                        thread::yield_now();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
    });
}

#[test]
fn disjoint_writers_hold_at_once() {
    disjoint_writers(RangeLock::new);
}

#[test]
#[should_panic(expected = "Model exceeded maximum number of branches")]
fn model_catches_lock_of_whole_file() {
    disjoint_writers(|| WholeFile(RangeLock::new()));
}
