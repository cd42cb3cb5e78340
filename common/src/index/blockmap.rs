//! Block maps and versioned reads (ARCHITECTURE.md §7).
//!
//! A regular file's inode names its **block map**: for each 4 KiB page of
//! the file, the data page in the region holding it, or nothing (a hole,
//! read as zeros). The map grows from a small root leaf of
//! [`SMALL_FANOUT`] entries to a radix tree of [`FANOUT`]-wide nodes; the
//! inode's map word packs the root's offset with the tree's height.
//!
//! ```text
//! map word (inode field data, InodeOff::map):  root offset | small (bit 3) | height (bits 0..3)
//! node item: header u64, then entries (leaf) or child offsets (inner)
//! leaf entry:  page (bits 0..40) | version (bits 40..62) | start (62) | end (63)
//! ```
//!
//! Only Kfs writes maps. A commit that changes pages `a..=b` gives all
//! their entries one new version `V`, marks the first `start` and the last
//! `end`, and stores them in increasing page order with `Release`; before
//! that it closes the neighbouring runs (`end` on page `a-1`, `start` on
//! page `b+1`) and it picks `V` unlike every version it replaces or
//! borders. A reader loads the entries it needs in increasing order with
//! `Acquire` and accepts them only if every change of version between two
//! neighbours is a closed run meeting an opened one ([`runs_are_whole`]):
//! a half-stored commit always leaves a run that is open where the old
//! version resumes. It then copies the data, loads the entries again and
//! checks that the inode still names the same root (a small root leaf that
//! a file outgrows is copied into a full one, and later changes go to the
//! copy only); if nothing changed, the snapshot was the map's state at one
//! instant (a changed entry never returns to its old value while the reader
//! is in its epoch, since a replaced page is not reused until then). Pages
//! are never written after their commit (writes copy on write), so the
//! copied data is that state's data. The one exception is Kfs zeroing the
//! bytes a shrink left past a file's end before the file grows over them:
//! it gives that page's entry a new version first and stores the larger
//! size after the zeros, and a reader loads the size again after the
//! entries, so a reader whose copy could overlap the zeroing fails one
//! check or the other.

use std::sync::atomic::Ordering;

use super::layout::InodeOff;
use crate::format::PageNo;
use crate::pm::Words;

/// Bytes of a data page.
pub const PAGE: u64 = 4096;
/// Entries (or children) of a full node.
pub const FANOUT: u64 = 63;
/// Bytes of a full node: header and [`FANOUT`] words, one 512-byte item.
pub const NODE_SIZE: u64 = 8 + 8 * FANOUT;
/// Entries of the small root leaf a file starts with.
pub const SMALL_FANOUT: u64 = 7;
/// Bytes of the small root leaf.
pub const SMALL_SIZE: u64 = 8 + 8 * SMALL_FANOUT;
/// First entry of a node.
pub const N_SLOTS: u64 = 8;

/// Entry (or child) `i` of the node at `node`. Wrapping: a damaged word
/// must give a refused offset, not a panic (loads outside the index read
/// as holes).
#[inline(always)]
pub const fn node_slot(node: u64, i: u64) -> u64 {
    node.wrapping_add(N_SLOTS + 8 * i)
}
/// Tallest tree: [`FANOUT`]^(MAX_HEIGHT+1) pages.
pub const MAX_HEIGHT: u32 = 5;
/// Largest file: 16 TiB.
pub const MAX_FILE_SIZE: u64 = 1 << 44;
/// Pages of the largest file.
pub const MAX_FILE_PAGES: u64 = MAX_FILE_SIZE / PAGE;

/// Map word: height of the tree (0: the root is a leaf).
pub const MAP_HEIGHT: u64 = 0x7;
/// Map word: the root is a small leaf.
pub const MAP_SMALL: u64 = 0x8;
/// Map word: the root's offset.
pub const MAP_ROOT: u64 = !0xF;

const PAGE_BITS: u32 = 40;
const VERSION_BITS: u32 = 22;
/// Entry: the data page number (0: a hole).
pub const E_PAGE: u64 = (1 << PAGE_BITS) - 1;
/// Entry: first page of its commit.
pub const E_START: u64 = 1 << 62;
/// Entry: last page of its commit.
pub const E_END: u64 = 1 << 63;
/// Versions are taken modulo this (and never 0, the holes' version).
pub const VERSION_MOD: u64 = 1 << VERSION_BITS;

/// An entry for data page `page` committed in `version`.
pub const fn entry(page: PageNo, version: u64) -> u64 {
    page.get() & E_PAGE | (version % VERSION_MOD) << PAGE_BITS
}
/// The data page of an entry ([`PageNo::NONE`]: a hole).
#[inline]
pub const fn entry_page(e: u64) -> PageNo {
    PageNo::new(e & E_PAGE)
}
/// The version of an entry (0: a hole).
pub const fn entry_version(e: u64) -> u64 {
    (e >> PAGE_BITS) & (VERSION_MOD - 1)
}
/// True if the entry opens its run (a hole is a run of its own).
pub const fn entry_starts(e: u64) -> bool {
    e == 0 || e & E_START != 0
}
/// True if the entry closes its run.
pub const fn entry_ends(e: u64) -> bool {
    e == 0 || e & E_END != 0
}

/// Pages a tree of this height covers.
pub const fn capacity(height: u32) -> u64 {
    let mut c = FANOUT;
    let mut h = 0;
    while h < height {
        c *= FANOUT;
        h += 1;
    }
    c
}

/// The slot that page `page` takes in a node `level` levels above the
/// leaves (0 for a leaf). Each arm divides by a constant, which compiles
/// to multiplications, where a computed power of [`FANOUT`] would cost a
/// hardware divide on every level of every walk.
pub const fn digit(page: u64, level: u32) -> u64 {
    const C0: u64 = capacity(0);
    const C1: u64 = capacity(1);
    const C2: u64 = capacity(2);
    const C3: u64 = capacity(3);
    const C4: u64 = capacity(4);
    let above = match level {
        0 => page,
        1 => page / C0,
        2 => page / C1,
        3 => page / C2,
        4 => page / C3,
        5 => page / C4,
        _ => page / capacity(level - 1),
    };
    above % FANOUT
}

/// Pages the map a map word names covers.
pub const fn word_capacity(word: u64) -> u64 {
    if word == 0 {
        0
    } else if word & MAP_SMALL != 0 {
        SMALL_FANOUT
    } else {
        capacity((word & MAP_HEIGHT) as u32)
    }
}

/// The read rule: true if `entries` (consecutive pages, loaded in order)
/// can be one state of the map, i.e. wherever the version changes between
/// two neighbours, the left one closes its run and the right one opens
/// its own. A commit caught half-stored fails it: where its new entries
/// meet old ones, either the new run is not closed yet, or the new run is
/// entered past its start.
pub fn runs_are_whole(entries: &[u64]) -> bool {
    entries.windows(2).all(|w| {
        let (a, b) = (w[0], w[1]);
        entry_version(a) == entry_version(b) || (entry_ends(a) && entry_starts(b))
    })
}

/// Where a map's entries come from: the shared index, or a model.
pub trait EntrySource {
    /// The entry of file page `page`, loaded with `Acquire` (0 for a hole).
    fn entry(&self, page: u64) -> u64;
}

/// The map of one inode, read through an index mapping.
#[derive(Debug, Clone, Copy)]
pub struct MapReader<'a, W: Words + ?Sized> {
    mem: &'a W,
    word: u64,
}

impl<'a, W: Words + ?Sized> MapReader<'a, W> {
    /// The map of the inode at `inode`, as its map word names it now.
    pub fn of_inode(mem: &'a W, inode: InodeOff) -> Self {
        // Acquire: pairs with Kfs's Release store of a new root, which it
        // makes after filling the root in.
        let word = mem.load_u64(inode.map(), Ordering::Acquire);
        MapReader { mem, word }
    }

    /// The map a map word names.
    pub fn new(mem: &'a W, word: u64) -> Self {
        MapReader { mem, word }
    }

    /// True if the inode at `inode` still names this map. A reader checks
    /// this with its entries after copying: when a file outgrows its small
    /// root leaf, Kfs copies that leaf into a full one and makes later
    /// changes there, so the old leaf's entries stay as they were and
    /// checking them again alone would miss those changes.
    pub fn is_current(&self, inode: InodeOff) -> bool {
        // Acquire: as in `of_inode`.
        self.mem.load_u64(inode.map(), Ordering::Acquire) == self.word
    }
}

impl<W: Words + ?Sized> MapReader<'_, W> {
    /// The offset of page `page`'s entry; `None` if the tree does not reach
    /// it (a hole).
    pub fn slot(&self, page: u64) -> Option<u64> {
        let w = self.word;
        if page >= word_capacity(w) {
            return None;
        }
        let mut node = w & MAP_ROOT;
        if w & MAP_SMALL != 0 {
            return Some(node_slot(node, page));
        }
        let mut level = (w & MAP_HEIGHT) as u32;
        while level > 0 {
            // Acquire: pairs with Kfs's Release store of a child link, made
            // after the child was zeroed.
            // Wrapping (`node_slot`): a damaged word must give a refused
            // offset, not a panic (loads outside the index read as holes).
            node = self
                .mem
                .load_u64(node_slot(node, digit(page, level)), Ordering::Acquire);
            if node == 0 {
                return None;
            }
            level -= 1;
        }
        Some(node_slot(node, digit(page, 0)))
    }
}

/// What a write into part of file page `page` keeps of it, in the file
/// at `inode` of `size` bytes: the page holding its bytes and how many of
/// its first bytes lie inside the file; `None` if it keeps nothing (a
/// hole, or a page past the end). The rest of the page reads as zeros:
/// past the end a page may still hold what a shrink left behind.
pub fn kept_bytes<W: Words + ?Sized>(
    mem: &W,
    inode: InodeOff,
    size: u64,
    page: u64,
) -> Option<(PageNo, usize)> {
    let keep = size.saturating_sub(page.saturating_mul(PAGE)).min(PAGE);
    if keep == 0 {
        return None;
    }
    let at = entry_page(MapReader::of_inode(mem, inode).entry(page));
    // At most PAGE: lossless.
    let keep = usize::try_from(keep).ok()?;
    (!at.is_none()).then_some((at, keep))
}

impl<W: Words + ?Sized> EntrySource for MapReader<'_, W> {
    fn entry(&self, page: u64) -> u64 {
        // Acquire: pairs with Kfs's Release store of the entry, made after
        // the page's data was persisted.
        self.slot(page)
            .map_or(0, |at| self.mem.load_u64(at, Ordering::Acquire))
    }
}

/// Loads the entries of pages `first..first + out.len()` in increasing
/// order into `out`.
pub fn load_entries(src: &impl EntrySource, first: u64, out: &mut [u64]) {
    for (i, e) in out.iter_mut().enumerate() {
        *e = src.entry(first + i as u64);
    }
}

/// True if the entries are unchanged since `snapshot` was taken.
pub fn entries_unchanged(src: &impl EntrySource, first: u64, snapshot: &[u64]) -> bool {
    snapshot
        .iter()
        .enumerate()
        .all(|(i, &e)| src.entry(first + i as u64) == e)
}

/// Where Kfs stores a map's entries: the index, or a model.
pub trait EntryStore: EntrySource {
    /// Stores the entry of file page `page` with `Release`.
    fn set_entry(&mut self, page: u64, e: u64);

    /// Stores the entry of file page `page` and returns the one it
    /// replaced (a store that can reach the slot once does so).
    fn swap_entry(&mut self, page: u64, e: u64) -> u64 {
        let old = self.entry(page);
        self.set_entry(page, e);
        old
    }
}

/// The version a commit of pages `first..first + n` should use: the one
/// after `last`, skipped past any version it would replace or border, so
/// that a half-stored commit always shows a version change where old and
/// new entries meet.
pub fn next_version(src: &impl EntrySource, last: u64, first: u64, n: u64) -> u64 {
    let lo = first.saturating_sub(1);
    let hi = first + n;
    let mut v = last;
    loop {
        v = v % (VERSION_MOD - 1) + 1;
        if (lo..=hi).all(|p| entry_version(src.entry(p)) != v) {
            return v;
        }
    }
}

/// Publishes a commit: pages `first..` now live in `pages` (data page
/// numbers as requests carry them, never 0) with `version` (from [`next_version`]). Closes the
/// neighbouring runs first, then stores the new entries in increasing page
/// order, so that a reader running alongside sees either the whole commit
/// or a state [`runs_are_whole`] refuses. Appends the entries replaced to
/// `replaced`.
pub fn publish(
    store: &mut impl EntryStore,
    first: u64,
    pages: &[u64],
    version: u64,
    replaced: &mut Vec<u64>,
) {
    let n = pages.len() as u64;
    if n == 0 {
        return;
    }
    if first > 0 {
        let left = store.entry(first - 1);
        if left != 0 && left & E_END == 0 {
            store.set_entry(first - 1, left | E_END);
        }
    }
    let right = store.entry(first + n);
    if right != 0 && right & E_START == 0 {
        store.set_entry(first + n, right | E_START);
    }
    for (i, &p) in pages.iter().enumerate() {
        let mut e = entry(PageNo::new(p), version);
        if i == 0 {
            e |= E_START;
        }
        if i as u64 == n - 1 {
            e |= E_END;
        }
        replaced.push(store.swap_entry(first + i as u64, e));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Default)]
    struct Model(BTreeMap<u64, u64>);

    impl EntrySource for Model {
        fn entry(&self, page: u64) -> u64 {
            self.0.get(&page).copied().unwrap_or(0)
        }
    }
    impl EntryStore for Model {
        fn set_entry(&mut self, page: u64, e: u64) {
            self.0.insert(page, e);
        }
    }

    /// Every intermediate state of a commit, as stored one entry at a time.
    fn states(m: &Model, first: u64, pages: &[u64], last: u64) -> Vec<Vec<u64>> {
        struct Rec<'a>(&'a mut Model, &'a mut Vec<Vec<u64>>);
        impl EntrySource for Rec<'_> {
            fn entry(&self, page: u64) -> u64 {
                self.0.entry(page)
            }
        }
        impl EntryStore for Rec<'_> {
            fn set_entry(&mut self, page: u64, e: u64) {
                self.0.set_entry(page, e);
                self.1.push((0..16).map(|p| self.0.entry(p)).collect());
            }
        }
        let mut copy = Model(m.0.clone());
        let mut out = vec![(0..16).map(|p| copy.entry(p)).collect()];
        let v = next_version(&copy, last, first, pages.len() as u64);
        publish(
            &mut Rec(&mut copy, &mut out),
            first,
            pages,
            v,
            &mut Vec::new(),
        );
        out
    }

    #[test]
    fn committed_states_pass_and_half_stored_ones_fail_where_they_meet() {
        let mut m = Model::default();
        let mut last = 0;
        let mut next_page = 100;
        for (first, n) in [(0u64, 8u64), (2, 3), (4, 6), (0, 1), (9, 1), (3, 9)] {
            let pages: Vec<u64> = (0..n)
                .map(|_| {
                    next_page += 1;
                    next_page
                })
                .collect();
            let all = states(&m, first, &pages, last);
            let (before, after) = (&all[0], all.last().unwrap());
            assert!(runs_are_whole(before) && runs_are_whole(after));
            // A reader whose range spans the commit and its surroundings
            // sees every intermediate state either as the old one, the new
            // one, or refuses it.
            for s in &all {
                let lo = usize::try_from(first.saturating_sub(1)).unwrap();
                let window = &s[lo..usize::try_from(first + n + 1).unwrap()];
                let new: Vec<PageNo> = s.iter().map(|e| entry_page(*e)).collect();
                let whole = runs_are_whole(window);
                let is_old = new.iter().zip(before).all(|(a, b)| *a == entry_page(*b));
                let is_new = new.iter().zip(after).all(|(a, b)| *a == entry_page(*b));
                assert!(!whole || is_old || is_new, "torn state accepted: {s:x?}");
            }
            let v = next_version(&m, last, first, n);
            publish(&mut m, first, &pages, v, &mut Vec::new());
            last = v;
        }
    }

    #[test]
    fn versions_skip_what_they_replace_or_border() {
        let mut m = Model::default();
        m.set_entry(0, entry(PageNo::new(7), 1) | E_START | E_END);
        m.set_entry(1, entry(PageNo::new(8), 2) | E_START | E_END);
        m.set_entry(2, entry(PageNo::new(9), 3) | E_START | E_END);
        assert_eq!(next_version(&m, 0, 1, 1), 4);
        assert_eq!(next_version(&m, VERSION_MOD - 1, 5, 1), 1);
    }

    #[test]
    fn tree_capacities() {
        assert_eq!(capacity(0), 63);
        assert_eq!(capacity(1), 63 * 63);
        assert!(capacity(MAX_HEIGHT) >= MAX_FILE_PAGES);
        assert!(capacity(MAX_HEIGHT - 1) < MAX_FILE_PAGES);
        assert_eq!(NODE_SIZE, 512);
        assert_eq!(SMALL_SIZE, 64);
    }
}
