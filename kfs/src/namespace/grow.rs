//! Doubling a directory's bucket table a few buckets at a time (see the
//! index layout for the structure).
//!
//! When a directory's entries outgrow its table, Kfs allocates a table of
//! twice the size and *migrates* the old buckets into it in order: old
//! bucket `b` gets a new sentinel in its middle, linked into the list, and
//! the new table's slots `2b` (the old sentinel) and `2b + 1` (the new
//! one) are written. Every change that adds an entry to the directory
//! migrates [`GROW_STEP`] buckets, and Kfs migrates more while it has
//! nothing to serve ([`Namespace::grow_step`]); no request ever waits for
//! a whole table. The old table stays published throughout, and is always
//! complete: a search through it walks past the new sentinels as ordinary
//! nodes, since each sits at its own key. Once every old bucket is
//! migrated, the new table, complete too, is published and the old one
//! retired.
//!
//! What a doubling has done so far is Kfs's own state ([`Doublings`]), not
//! the index's: the index only ever shows complete tables, so lock-free
//! readers need nothing new. (Kfs's own scan of a whole directory,
//! `IndexReader::for_each_entry`, ends a bucket's chain at the next
//! bucket's sentinel, not at the first marker, which may be a new one.)
//! Entries added or removed meanwhile need nothing either: a
//! migrated bucket's sentinels stay where they are whatever comes and goes
//! around them, and a bucket not yet migrated is walked when its turn
//! comes.

use std::cmp::Ordering as Cmp;
use std::collections::BTreeMap;

use kucofs_common::index::layout::*;
use kucofs_common::index::{BucketTable, DirentOff, InodeOff};
use kucofs_common::pm::Words;
use kucofs_common::Errno;

use super::Namespace;

/// Old buckets that a change adding an entry to a growing directory
/// migrates. A doubling of a table of `2^bits` buckets starts when the
/// entries pass `LOAD · 2^bits`, and the next one is due when they pass
/// `LOAD · 2^(bits+1)`: at least `LOAD · 2^bits` adds later, since only
/// adds step a doubling and removals put the next one further off. At
/// `GROW_STEP` buckets an add the `2^bits` old buckets are migrated within
/// `2^bits / GROW_STEP` adds, a quarter of the way to the next doubling,
/// even if Kfs is never idle: a doubling always ends well before the next
/// is due, and a directory grows by whole doublings, never falling behind.
/// Small, because the work is on the add's path: a bucket costs a walk
/// down half its chain (about one node, at one entry a bucket), a
/// sentinel and two slots, a few hundred nanoseconds with its cache
/// misses in a directory of millions (the step's chains are walked in
/// step, so that their misses overlap).
pub const GROW_STEP: u64 = 4;
// A doubling ends at most half-way to the next.
const _: () = assert!(GROW_STEP * LOAD >= 2);

/// Chains walked in step (each next node prefetched, so that their cache
/// misses overlap) when a doubling migrates several buckets at once.
const BATCH: usize = 32;

/// A directory's table doubling under way.
#[derive(Debug, Clone, Copy)]
struct Doubling {
    /// The new table: slots `0..2 * next` written, the rest not yet (and
    /// never read before they are).
    table: BucketTable,
    /// The next old bucket to migrate.
    next: u64,
}

/// The bucket-table doublings under way, by directory.
#[derive(Debug)]
pub(super) struct Doublings {
    /// Directory (its inode's offset) → its doubling. Ordered, so idle
    /// steps go through directories in a fixed order.
    dirs: BTreeMap<InodeOff, Doubling>,
    /// Old buckets migrated so far, over all directories.
    migrated: u64,
    /// Buckets an add migrates: [`GROW_STEP`] (tests change it).
    per_add: u64,
}

impl Default for Doublings {
    fn default() -> Self {
        Doublings {
            dirs: BTreeMap::new(),
            migrated: 0,
            per_add: GROW_STEP,
        }
    }
}

impl Namespace {
    /// Advances `dir`'s table growth after an entry was added: migrates a
    /// step of buckets of the doubling under way, or starts one (and
    /// migrates its first step) once the entries outgrow the table. A
    /// directory whose entries pass the next doubling's threshold while
    /// one is under way (which the step makes impossible through adds
    /// alone) finishes that one first, a step an add; the next starts at
    /// the add after it ends. So one change allocates at most one table
    /// and [`GROW_STEP`] sentinels.
    pub(super) fn maybe_grow(&mut self, dir: InodeOff) -> Result<(), Errno> {
        let budget = self.doublings.per_add;
        if self.doublings.dirs.contains_key(&dir) {
            return self.migrate(dir, budget);
        }
        let table = BucketTable::new(self.arena.get(dir.buckets()));
        let bits = table_bits(self.arena.get(table.bits()));
        let entries = self.arena.get(dir.entries());
        if bits >= BUCKET_BITS_MAX || entries <= LOAD << bits {
            return Ok(());
        }
        let nb = bits + 1;
        // Every slot is written by the migration before the table is
        // published, so it needs neither clearing nor its pages now.
        let new = BucketTable::new(self.arena.alloc_unset(TAG_BUCKETS, BucketTable::size(nb))?);
        self.arena.put(new.bits(), u64::from(nb))?;
        self.doublings.dirs.insert(
            dir,
            Doubling {
                table: new,
                next: 0,
            },
        );
        self.migrate(dir, budget)
    }

    /// Advances the doublings under way by at most `budget` old buckets in
    /// all, for Kfs to call while it has nothing to serve; true if one is
    /// still under way after it. False also if the index has no room for
    /// the sentinels: the changes that add entries advance them then,
    /// with the room made for them.
    pub fn grow_step(&mut self, mut budget: u64) -> bool {
        while budget > 0 {
            let Some((&dir, d)) = self.doublings.dirs.first_key_value() else {
                return false;
            };
            let n = budget.min(self.buckets(dir) - d.next);
            if n == 0 || self.migrate(dir, n).is_err() {
                return false;
            }
            budget -= n;
        }
        !self.doublings.dirs.is_empty()
    }

    /// The doubling under way in `dir`, if any: its new table, and how
    /// many old buckets it has migrated (fsck checks what they put in the
    /// list and in the new table).
    pub(crate) fn doubling(&self, dir: InodeOff) -> Option<(BucketTable, u64)> {
        self.doublings.dirs.get(&dir).map(|d| (d.table, d.next))
    }

    /// Drops the doubling under way in `dir`, which is being removed: its
    /// table, never published, is retired with the directory's list (the
    /// sentinels it migrated are in the list).
    pub(super) fn abandon_doubling(&mut self, dir: InodeOff) -> Result<(), Errno> {
        match self.doublings.dirs.remove(&dir) {
            Some(d) => self.arena.retire(d.table.get()),
            None => Ok(()),
        }
    }

    /// Buckets in `dir`'s published table.
    fn buckets(&self, dir: InodeOff) -> u64 {
        let table = BucketTable::new(self.arena.get(dir.buckets()));
        1 << self.arena.get(table.bits())
    }

    /// Migrates up to `budget` old buckets of `dir`'s doubling, and
    /// publishes the new table once the last one is done. On an error
    /// (no index space for a sentinel), what was migrated stays migrated
    /// and recorded, and the rest is left for later.
    fn migrate(&mut self, dir: InodeOff, budget: u64) -> Result<(), Errno> {
        let Some(&Doubling { table: new, next }) = self.doublings.dirs.get(&dir) else {
            return Ok(());
        };
        let buckets = self.buckets(dir);
        let end = next + budget.min(buckets - next);
        let mut done = next;
        let moved = self.migrate_buckets(dir, new, &mut done, end);
        self.doublings.migrated += done - next;
        if let Some(d) = self.doublings.dirs.get_mut(&dir) {
            d.next = done;
        }
        moved?;
        if done < buckets {
            return Ok(());
        }
        let old = self.arena.get(dir.buckets());
        // Release: every slot of the new table is visible before the table
        // is (pairs with the Acquire in `bucket_start`), and so is every
        // sentinel it points at (each linked with its own Release). The
        // slots written by earlier steps are covered too: those steps came
        // before this store on this thread, or on a thread that held the
        // volume's lock before this one took it, which orders them first.
        self.arena.put(dir.buckets(), new.get())?;
        self.doublings.dirs.remove(&dir);
        self.arena.retire(old)
    }

    /// Migrates old buckets `*done..end` of `dir` into table `new`,
    /// advancing `*done` past each one as it is finished, so that it
    /// counts exactly the buckets migrated even on an error.
    ///
    /// A bucket's new sentinel goes after the last node below its middle
    /// key: a walk down its chain, a cache miss a node (the links' tags
    /// say where to stop, so the node after the place is not read). The
    /// chains of a batch of buckets are walked in step, each next node
    /// prefetched, so that their misses overlap.
    fn migrate_buckets(
        &mut self,
        dir: InodeOff,
        new: BucketTable,
        done: &mut u64,
        end: u64,
    ) -> Result<(), Errno> {
        let old = BucketTable::new(self.arena.get(dir.buckets()));
        let bits = table_bits(self.arena.get(old.bits()));
        let nb = bits + 1;
        while *done < end {
            let first = *done;
            // At most `BATCH`, which any `usize` holds.
            #[allow(clippy::cast_possible_truncation)]
            let n = (end - first).min(BATCH as u64) as usize;
            let r = self.arena.reader();
            // Each chain's node to link the sentinel after, and that node's
            // link (what the sentinel links to).
            let mut cur = [DirentOff::NULL; BATCH];
            let mut next = [0u64; BATCH];
            let mut placed = [false; BATCH];
            for (b, c) in (first..).zip(&mut cur[..n]) {
                *c = DirentOff::new(self.arena.get(old.slot(b)));
                r.mem().prefetch(c.next());
            }
            let mut left = n;
            while left > 0 {
                for i in 0..n {
                    if placed[i] {
                        continue;
                    }
                    let mid = bucket_start(2 * (first + i as u64) + 1, nb);
                    let l = r.link(cur[i]);
                    if link_node(l).is_null() || r.cmp_link(l, mid, b"") != Cmp::Less {
                        next[i] = l;
                        placed[i] = true;
                        left -= 1;
                    } else {
                        cur[i] = link_node(l);
                        r.mem().prefetch(cur[i].next());
                    }
                }
            }
            for i in 0..n {
                let b = first + i as u64;
                let start = self.arena.get(old.slot(b));
                let mid = bucket_start(2 * b + 1, nb);
                let s = DirentOff::new(self.arena.alloc(TAG_SENTINEL, dirent_size(0))?);
                self.arena.put(s.hash(), mid)?;
                self.arena.put(s.dir(), dir.get())?;
                self.arena.put(s.next(), next[i])?;
                // Release: the sentinel is complete before it is linked
                // (pairs with the Acquire of a reader's `link`).
                self.arena.put(cur[i].next(), link(s, mid))?;
                self.arena.put(new.slot(2 * b), start)?;
                self.arena.put(new.slot(2 * b + 1), s.get())?;
                *done = b + 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
