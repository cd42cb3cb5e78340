#![cfg(loom)]
//! Loom model of the versioned, lock-free read of block maps (ARCHITECTURE.md §7,
//! `common/src/index/blockmap.rs`): Kfs commits with the crate's
//! `next_version` and `publish` while a reader reads with `load_entries`,
//! `runs_are_whole` and `entries_unchanged`, and loom runs the two under
//! every interleaving and every value the memory model lets each load
//! return. The models are small enough to explore without a preemption
//! bound, all of them in a few seconds in release.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p kucofs-common --release --test loom_blockmap
//! ```
//!
//! The map is five loom atomics behind `EntrySource`/`EntryStore` (loom's
//! atomics cannot live in the real mmap). Each data page holds one stamp,
//! the number of the commit that wrote it; every commit takes fresh pages,
//! stamps them, publishes them, and never writes them again, as copy on
//! write and the grace period guarantee. A read the reader accepts must
//! show the stamps the file held before the writer started or after one
//! of its commits; anything else is a torn read. One reader suffices:
//! readers only load, so a second one would add interleavings but no
//! behaviour to either.
//!
//! Each rule is also dropped in turn, and the model must catch that:
//! - without the run check, one commit tears: the reader loads the
//!   commit's first entries stored and the rest not yet, and re-checks
//!   before Kfs stores the rest, so the re-check sees nothing change and
//!   accepts a state the map really held, half-stored;
//! - without the re-check, one commit cannot tear (every half-stored state
//!   fails the run check), but two in a row can: a reader that loads page
//!   1 before the first commit and pages 2 to 4 after the second sees the
//!   second commit without the first, and where the versions change, an
//!   old run closed on both sides meets the second commit's start;
//! - a writer that gives a commit the version of the run it cuts into (the
//!   plain counter, once it comes round) hides a half-stored commit from
//!   the run check, and the re-check cannot see it either;
//! - a writer that stores entries `Relaxed` lets a reader see a new entry
//!   and still load its page's stamp from before the commit (0 here).

use kucofs_common::format::PageNo;
use kucofs_common::index::blockmap::{
    entries_unchanged, entry_page, load_entries, next_version, publish, runs_are_whole,
    EntrySource, EntryStore, VERSION_MOD,
};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// File pages of the model map.
const PAGES: usize = 5;
/// Data pages of the model region. Page 0 is never handed out: entries
/// name it for a hole, and its stamp stays 0.
const DATA: usize = 16;
/// Reads a reader tries before giving up.
const TRIES: usize = 3;

/// A write of `n` pages from file page `first`.
#[derive(Debug, Clone, Copy)]
struct Commit {
    first: u64,
    n: u64,
}

/// What the model runs: commits made before the reader starts, the
/// commits the writer makes while it reads, and the pages it reads.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    before: &'static [Commit],
    during: &'static [Commit],
    read: Commit,
}

/// One run over the whole file, then a commit of pages 1-3 inside it, so
/// that `publish` closes the runs on both sides of it too; the reader reads
/// the whole file, the commit and both its neighbours.
const ONE_COMMIT: Scenario = Scenario {
    before: &[Commit { first: 0, n: 5 }],
    during: &[Commit { first: 1, n: 3 }],
    read: Commit { first: 0, n: 5 },
};

/// The same, but the reader reads pages 2-4: it enters the commit past
/// its start.
const PART_OF_ONE_COMMIT: Scenario = Scenario {
    read: Commit { first: 2, n: 3 },
    ..ONE_COMMIT
};

/// Five one-page runs (every old entry closed on both sides), then two
/// overlapping commits, of pages 1-2 and of pages 2-4.
const TWO_COMMITS: Scenario = Scenario {
    before: &[
        Commit { first: 0, n: 1 },
        Commit { first: 1, n: 1 },
        Commit { first: 2, n: 1 },
        Commit { first: 3, n: 1 },
        Commit { first: 4, n: 1 },
    ],
    during: &[Commit { first: 1, n: 2 }, Commit { first: 2, n: 3 }],
    read: Commit { first: 0, n: 5 },
};

/// Which checks the reader makes.
#[derive(Debug, Clone, Copy)]
struct Rule {
    runs: bool,
    recheck: bool,
}

const FULL: Rule = Rule {
    runs: true,
    recheck: true,
};
const RECHECK_ONLY: Rule = Rule {
    runs: false,
    recheck: true,
};
const RUNS_ONLY: Rule = Rule {
    runs: true,
    recheck: false,
};

/// How the writer picks a commit's version.
#[derive(Debug, Clone, Copy)]
enum Versions {
    /// The crate's `next_version`, from the last version used.
    Skipping,
    /// The counter after the last version, whatever the pages around hold.
    /// The writer starts it at `VERSION_MOD - 1`, as if it had come round
    /// since the commits before the reader, so its first version is 1, the
    /// version of the run its commit cuts into.
    Counter,
}

/// How the writer commits.
#[derive(Debug, Clone, Copy)]
struct Writer {
    versions: Versions,
    /// The ordering of its stores of entries.
    publish: Ordering,
}

/// The writer Kfs is.
const KFS: Writer = Writer {
    versions: Versions::Skipping,
    publish: Ordering::Release,
};

/// The shared memory: the map and the data pages.
struct Fs {
    map: [AtomicU64; PAGES],
    stamps: [AtomicU64; DATA],
}

impl EntrySource for Fs {
    fn entry(&self, page: u64) -> u64 {
        // Acquire: pairs with the Release store in `Kfs::set_entry`, made
        // after the stamp of the page the entry names.
        self.map
            .get(page as usize)
            .map_or(0, |e| e.load(Ordering::Acquire))
    }
}

impl Fs {
    fn new() -> Fs {
        Fs {
            map: std::array::from_fn(|_| AtomicU64::new(0)),
            stamps: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The stamp of data page `page`. Relaxed on purpose: the Acquire load
    /// of the entry that named the page must alone make the stamp visible.
    fn stamp(&self, page: PageNo) -> u64 {
        self.stamps[page.get() as usize].load(Ordering::Relaxed)
    }
}

/// The one writer of the map, as Kfs is.
struct Kfs {
    fs: Arc<Fs>,
    /// The entries as Kfs last stored them. Kfs reads its own entries from
    /// here rather than from the map: being the only writer, it would load
    /// back exactly these values, and a load of its own would hide the
    /// reader's loads from loom's race detection, which remembers only the
    /// last access to each atomic (tokio-rs/loom#166, #392). With those
    /// loads in, loom explores a single interleaving of each model here,
    /// and the broken variants below pass.
    entries: [u64; PAGES],
    writer: Writer,
    /// The last version used.
    last: u64,
    /// The next fresh data page.
    next_page: u64,
    /// Commits made: the stamp of the next one, less 1.
    commits: u64,
}

impl EntrySource for Kfs {
    fn entry(&self, page: u64) -> u64 {
        self.entries.get(page as usize).copied().unwrap_or(0)
    }
}

impl EntryStore for Kfs {
    fn set_entry(&mut self, page: u64, e: u64) {
        self.entries[page as usize] = e;
        // Release (as `KFS` has it): pairs with the reader's Acquire loads
        // in `Fs::entry`, so a reader that sees the entry sees the stamps
        // stored before it.
        self.fs.map[page as usize].store(e, self.writer.publish);
    }
}

impl Kfs {
    fn new(fs: Arc<Fs>) -> Kfs {
        Kfs {
            fs,
            entries: [0; PAGES],
            writer: KFS,
            last: 0,
            next_page: 1,
            commits: 0,
        }
    }

    /// From now on, commits as `writer` says.
    fn switch_to(&mut self, writer: Writer) {
        self.writer = writer;
        if let Versions::Counter = writer.versions {
            self.last = VERSION_MOD - 1;
        }
    }

    /// Writes `c` copy-on-write: stamps fresh pages with the commit's
    /// number, then publishes them.
    fn commit(&mut self, c: Commit) {
        self.commits += 1;
        let pages: Vec<u64> = (0..c.n)
            .map(|_| {
                let page = self.next_page;
                self.next_page += 1;
                // Relaxed: the Release stores of `publish` order it before
                // any reader's load of the page.
                self.fs.stamps[page as usize].store(self.commits, Ordering::Relaxed);
                page
            })
            .collect();
        let version = match self.writer.versions {
            Versions::Skipping => next_version(self, self.last, c.first, c.n),
            Versions::Counter => self.last % (VERSION_MOD - 1) + 1,
        };
        publish(self, c.first, &pages, version, &mut Vec::new());
        self.last = version;
    }
}

/// The stamps of the pages the scenario reads, in each state the file
/// passes through: before the writer starts, and after each of its commits.
fn states(s: Scenario) -> Vec<Vec<u64>> {
    let mut file = [0; PAGES];
    let mut out = Vec::new();
    let read = s.read.first as usize..(s.read.first + s.read.n) as usize;
    for (i, c) in s.before.iter().chain(s.during).enumerate() {
        file[c.first as usize..(c.first + c.n) as usize].fill(i as u64 + 1);
        if i + 1 >= s.before.len() {
            out.push(file[read.clone()].to_vec());
        }
    }
    out
}

/// Reads the pages `read` names as a reader following `rule` does: the
/// stamps it accepts, or `None` if it gave up.
fn read(fs: &Fs, read: Commit, rule: Rule) -> Option<Vec<u64>> {
    for _ in 0..TRIES {
        let mut entries = vec![0; read.n as usize];
        load_entries(fs, read.first, &mut entries);
        if rule.runs && !runs_are_whole(&entries) {
            thread::yield_now();
            continue;
        }
        let stamps = entries.iter().map(|&e| fs.stamp(entry_page(e))).collect();
        if rule.recheck && !entries_unchanged(fs, read.first, &entries) {
            thread::yield_now();
            continue;
        }
        return Some(stamps);
    }
    None
}

/// Runs the scenario with `writer` against one reader following `rule`
/// under loom; panics with "torn read" if the reader accepts stamps the
/// file never held.
fn model(s: Scenario, rule: Rule, writer: Writer) {
    let states = states(s);
    loom::model(move || {
        let fs = Arc::new(Fs::new());
        let mut kfs = Kfs::new(Arc::clone(&fs));
        for &c in s.before {
            kfs.commit(c);
        }
        kfs.switch_to(writer);
        let writer = thread::spawn(move || {
            for &c in s.during {
                kfs.commit(c);
            }
        });
        if let Some(stamps) = read(&fs, s.read, rule) {
            assert!(
                states.contains(&stamps),
                "torn read: the reader accepted stamps {stamps:?}, but the pages \
                 only ever held {states:?}"
            );
        }
        writer.join().unwrap();
    });
}

#[test]
fn reader_sees_a_commit_whole_or_not_at_all() {
    model(ONE_COMMIT, FULL, KFS);
}

#[test]
fn reader_of_part_of_a_commit_sees_it_whole_or_not_at_all() {
    model(PART_OF_ONE_COMMIT, FULL, KFS);
}

#[test]
fn reader_sees_commits_in_order() {
    model(TWO_COMMITS, FULL, KFS);
}

#[test]
#[should_panic(expected = "torn read")]
fn model_catches_reader_without_run_check() {
    model(ONE_COMMIT, RECHECK_ONLY, KFS);
}

/// The run check alone keeps one commit whole; what the re-check adds is
/// the order of commits (next test).
#[test]
fn run_check_alone_keeps_one_commit_whole() {
    model(ONE_COMMIT, RUNS_ONLY, KFS);
}

#[test]
#[should_panic(expected = "torn read")]
fn model_catches_reader_without_recheck() {
    model(TWO_COMMITS, RUNS_ONLY, KFS);
}

#[test]
#[should_panic(expected = "torn read")]
fn model_catches_writer_reusing_a_bordering_version() {
    model(
        ONE_COMMIT,
        FULL,
        Writer {
            versions: Versions::Counter,
            ..KFS
        },
    );
}

#[test]
#[should_panic(expected = "torn read")]
fn model_catches_writer_publishing_relaxed() {
    model(
        ONE_COMMIT,
        FULL,
        Writer {
            publish: Ordering::Relaxed,
            ..KFS
        },
    );
}
