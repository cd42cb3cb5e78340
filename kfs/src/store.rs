//! The metadata store as Kfs keeps it (ARCHITECTURE.md §11): where each
//! inode, directory entry and symlink target lies in the image, which of
//! them the changes since the last retirement of the log touched, and the
//! retirement that writes those into the store as one batch.
//!
//! The store's records live in data pages the owner table names (see
//! `kucofs_common::format::meta`). Kfs changes its index, not the store,
//! when it applies a change; each hook here notes what the change touched
//! (an inode number, an entry made or removed, a data page's owner). A
//! retirement then turns the notes into physical writes: the records as
//! the index holds them now. Its work is proportional to what changed
//! since the last one, whatever the number of files.
//!
//! A change that will need a store page *promises* one, and is refused
//! with `ENOSPC` unless the store holds a page for it in its **stock**:
//! free pages the volume takes for the store before each change (and
//! gives their memory, on a sparse image), so that a retirement never
//! lacks a page, and a full file system refuses the change that needs one,
//! not a retirement. While recovery replays the log there is no stock: a
//! replayed change must not take a page a later entry of the log names as
//! file data; the retirement after the replay takes what it needs.

use kucofs_common::format::meta::{
    cells_for, encode_entry, inode_slot, slots_per_page, BatchWriter, InodeRecord, Owner,
    BATCH_WRITE_HEAD, CELL, INLINE_TARGET, INODES_PER_PAGE, INODE_RECORD, MAX_CELLS,
    OWNER_FILE_PAGE_MAX, OWNER_INO_MAX,
};
use kucofs_common::format::PageNo;
use kucofs_common::format::{Area, Geometry, OWNERS_PER_PAGE, OWNER_SIZE, PAGE_LEN, PAGE_SIZE};
use kucofs_common::index::layout::{shape_kind, TAG_DIRENT};
use kucofs_common::index::{DirentOff, Ino, InodeOff, Kind, NAME_MAX};
use kucofs_common::Errno;

use crate::intmap::IntMap;
use crate::namespace::Namespace;
use crate::pages::{PageTableAddr, Pages};

mod load;

pub use load::{held_pages, load, LoadError, Loaded};

/// `itable` value of a table index whose page is promised, not yet taken.
const PENDING: u64 = u64::MAX;

/// Bit of an owner word (one the format never sets) marking an entry
/// changed since the last retirement.
const DIRTY: u64 = 1 << 63;

/// Owner entries a retirement writes together: a cache line of them, so
/// that copying them into place is whole lines of non-temporal stores.
const OWNERS_PER_LINE: u64 = 64 / OWNER_SIZE;
/// What a line of owner entries costs a batch, and a whole owner page.
const OWNER_LINE_COST: u64 = 64 + WRITE;
const OWNER_PAGE_COST: u64 = PAGE_SIZE + WRITE;
const _: () = assert!(
    (kucofs_common::format::meta::OWNER_TARGET + 1)
        << kucofs_common::format::meta::OWNER_KIND_SHIFT
        <= DIRTY
);

/// Store pages the stock keeps beyond those promised: the most one change
/// may promise (an inode page, an entry page, a target page).
pub const STOCK_AHEAD: u64 = 3;

/// Bytes a batch write costs beyond its data (its header).
const WRITE: u64 = BATCH_WRITE_HEAD as u64;

/// Writes of inode, entry and target records after which a retirement
/// is due, whatever their bytes. Each lands on a cache line of the store
/// the retirement has not touched, and those lines, not the bytes, make
/// most of a retirement's time and so Kfs's longest pause: a batch of
/// removals is a few bytes a record. (Owner entries that file data
/// changes are counted by their bytes alone: they lie together in the
/// owner table, a cache line holds eight, and a retirement writes them a
/// run of lines at a time. A new store page counts as two writes, its
/// clearing and its owner entry.)
pub const RETIRE_WRITES: u64 = 4096;

/// An index into, or a length of, one of the store's tables in memory.
// Each table holds a word or more for every data page, owner-table page,
// inode page or inode of an image that is mapped and indexed in memory,
// so every count and index among them fits the address space, and a
// `usize`.
#[allow(clippy::cast_possible_truncation)]
#[inline(always)]
fn ix(n: u64) -> usize {
    n as usize
}

/// A length of at most a page (a page, an inode record, an entry slot) as
/// the `u32` length of a batch write.
// At most `PAGE_LEN`, which a `u32` holds.
#[allow(clippy::cast_possible_truncation)]
const fn write_len(n: usize) -> u32 {
    debug_assert!(n <= PAGE_LEN);
    n as u32
}

/// Where a directory entry's record lies: its page and slot, as the
/// index's entries carry it ([`DirentOff::slot`]).
fn slot_id(page: u64, slot: u64) -> u64 {
    page << 8 | slot
}

fn slot_parts(id: u64) -> (u64, u64) {
    (id >> 8, id & 0xff)
}

/// One page of directory entries.
#[derive(Debug, Clone)]
struct EntryPage {
    /// The data page (0: this place in the class's list is unused).
    page: u64,
    /// A bit per slot in use.
    used: u64,
    /// Listed in the class's `with_free`.
    listed: bool,
}

/// The entry pages of one record size.
#[derive(Debug, Clone, Default)]
struct Class {
    cells: u8,
    pages: Vec<EntryPage>,
    /// Indices into `pages` that may have a free slot, each at most once
    /// (checked on use: a page filled or given up since is dropped then).
    with_free: Vec<u32>,
    /// Unused places in `pages`.
    spare: Vec<u32>,
    /// Free slots in `pages`.
    free_slots: u64,
    /// Slots free for new entries: free slots in the pages, plus those of
    /// pages promised, less the entries made and not yet given one.
    avail: u64,
}

impl Class {
    fn per_page(&self) -> u64 {
        slots_per_page(self.cells)
    }

    /// Lists page `idx` as one that may have a free slot.
    fn list(&mut self, idx: u32) {
        let ep = &mut self.pages[idx as usize];
        if !ep.listed {
            ep.listed = true;
            self.with_free.push(idx);
        }
    }

    /// Takes a free slot of one of the pages, if any has one.
    fn take_slot(&mut self) -> Option<(u64, u64)> {
        let per = self.per_page();
        let full = if per == 64 { u64::MAX } else { (1 << per) - 1 };
        while let Some(&pi) = self.with_free.last() {
            let ep = &mut self.pages[pi as usize];
            if ep.page == 0 || ep.used & full == full {
                ep.listed = false;
                self.with_free.pop();
                continue;
            }
            let slot = u64::from((!ep.used).trailing_zeros());
            ep.used |= 1 << slot;
            self.free_slots -= 1;
            return Some((ep.page, slot));
        }
        None
    }
}

/// What one retirement wrote and changed.
#[derive(Debug, Default, Clone)]
pub struct Retirement {
    /// Pages it made store pages (to be made read-only in every view).
    pub taken: Vec<u64>,
    /// Inode records written or cleared.
    pub inodes: u64,
    /// Entry records written.
    pub entries: u64,
    /// Entry records cleared.
    pub cleared: u64,
    /// Owner entries written.
    pub owners: u64,
}

/// How much of the image the store uses.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreUse {
    /// Pages of the inode table.
    pub inode_pages: u64,
    /// Pages of directory entries.
    pub entry_pages: u64,
    /// Pages of symlink targets.
    pub target_pages: u64,
}

impl StoreUse {
    /// Every page the store holds.
    pub fn pages(&self) -> u64 {
        self.inode_pages + self.entry_pages + self.target_pages
    }
}

/// The metadata store's bookkeeping.
#[derive(Debug, Default)]
pub struct Store {
    /// Off for a namespace with no image behind it (tests, tools).
    enabled: bool,
    /// While the store itself is read back: nothing is new.
    loading: bool,
    data: Option<Area>,
    owners_at: u64,
    /// Every data page's owner entry as the store should hold it, with
    /// [`DIRTY`] set where it changed since the last retirement (one word
    /// a page, so that a change to a page's owner touches one cache line).
    owners: Vec<u64>,
    /// The owner-table pages with a changed entry, each listed once.
    dirty_groups: Vec<u64>,
    /// The cache lines with a changed entry in each owner-table page, a
    /// bit each (64 of them to a page).
    group_lines: Vec<u64>,
    /// Inode page of each table index (0: none; [`PENDING`]: promised).
    itable: Vec<u64>,
    /// Inodes of the index in each table index's range.
    ilive: Vec<u8>,
    /// Free inode slots in the pages of `itable` (promised ones included).
    inode_slots: u64,
    dirty_inos: Vec<u64>,
    dirty_ino_bits: Vec<u64>,
    classes: Vec<Class>,
    /// Each data page's place in its entry class's `pages` (by index from
    /// the first data page; `u32::MAX` for a page that holds no entries).
    entry_idx: Vec<u32>,
    /// Index entries made since the last retirement (offsets; some may be
    /// removed since, or reused).
    new_entries: Vec<DirentOff>,
    /// Slots of entries removed since the last retirement.
    freed_slots: Vec<u64>,
    /// Symlinks whose target has a page: ino -> page (0: promised).
    targets: IntMap<u64, u64>,
    /// Pages promised since the last retirement.
    promised: u64,
    /// Free pages taken for the store and not used yet.
    stock: Vec<u64>,
    /// Pages given up, free once a retirement has cleared their owner
    /// entries durably.
    released: Vec<u64>,
    /// An upper bound on the bytes of the batch a retirement now would
    /// write (so that it is made before the log cannot hold it).
    pending_bytes: u64,
    /// An upper bound on its writes.
    pending_writes: u64,
}

#[inline]
fn set_bit(bits: &mut Vec<u64>, i: u64) -> bool {
    let w = (i / 64) as usize;
    if w >= bits.len() {
        bits.resize((w + 1).next_power_of_two(), 0);
    }
    let m = 1u64 << (i % 64);
    let was = bits[w] & m != 0;
    bits[w] |= m;
    !was
}

impl Store {
    /// The bookkeeping for an image of geometry `g` whose store is empty
    /// (mkfs; [`load`] fills it from an image).
    pub fn new(g: &Geometry) -> Store {
        Store {
            enabled: true,
            data: Some(g.data),
            owners_at: g.owners.offset(),
            owners: crate::pages::page_table(ix(g.data.pages), 0),
            entry_idx: vec![u32::MAX; ix(g.data.pages)],
            group_lines: vec![0; ix(g.data.pages.div_ceil(OWNERS_PER_PAGE))],
            classes: (1..=MAX_CELLS)
                .map(|cells| Class {
                    cells,
                    ..Class::default()
                })
                .collect(),
            ..Store::default()
        }
    }

    /// Where the owner entries lie, for a thread that warms the cache
    /// ahead of a commit (none without data pages). The owner vector is
    /// never resized, so this holds while the store lives.
    pub fn owner_addr(&self) -> Option<PageTableAddr> {
        self.data.map(|d| PageTableAddr::of(&self.owners, d.start))
    }

    /// True if changes are noted (a namespace with an image behind it).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Pages promised since the last retirement.
    pub fn promised(&self) -> u64 {
        self.promised
    }

    /// Store pages to take now so that the stock covers what is promised
    /// and what one more change may promise.
    pub fn stock_wanted(&self) -> u64 {
        if !self.enabled {
            return 0;
        }
        (self.promised + STOCK_AHEAD).saturating_sub(self.stock.len() as u64)
    }

    /// Adds page `p`, just taken from the free pages, to the stock.
    pub fn add_stock(&mut self, p: u64) {
        self.stock.push(p);
    }

    /// Pages in the stock, used or not.
    pub fn stock(&self) -> u64 {
        self.stock.len() as u64
    }

    /// Takes back the stock's pages that nothing has promised, for a
    /// grant that finds no free page: file data may use the last pages,
    /// and then a change that needs a store page is refused.
    pub fn spare_stock(&mut self) -> Vec<u64> {
        let keep = ix(self.promised).min(self.stock.len());
        self.stock.split_off(keep)
    }

    /// An upper bound on the bytes of the batch a retirement now would
    /// write.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// An upper bound on the record writes of the batch a retirement now
    /// would make (see [`RETIRE_WRITES`]).
    pub fn pending_writes(&self) -> u64 {
        self.pending_writes
    }

    /// Counts a write of `bytes` (at most) in the coming batch, `writes`
    /// writes in all.
    #[inline]
    fn charge(&mut self, bytes: u64, writes: u64) {
        self.pending_bytes += bytes;
        self.pending_writes += writes;
    }

    /// True if a retirement now would write nothing.
    pub fn is_clean(&self) -> bool {
        self.dirty_inos.is_empty()
            && self.dirty_groups.is_empty()
            && self.new_entries.is_empty()
            && self.freed_slots.is_empty()
    }

    /// Files the store can still take, as far as `free_pages` (free data
    /// pages, not counting the stock) allow: each costs an inode record
    /// and a short-named entry record, and the count is of the bytes free
    /// for them, in free pages, the stock's unpromised pages, and free
    /// slots of the store's pages, so that it falls by one with each file
    /// made whatever pages that takes, and rises with each one removed.
    pub fn files_free(&self, free_pages: u64, inodes: u64, max_inodes: u64) -> u64 {
        let entry_bytes: u64 = self
            .classes
            .iter()
            .map(|c| c.avail * (CELL as u64) * u64::from(c.cells))
            .sum::<u64>()
            + self.freed_slots.len() as u64 * CELL as u64;
        let pages = (free_pages + self.stock.len() as u64).saturating_sub(self.promised);
        let bytes = pages * PAGE_SIZE + self.inode_slots * INODE_RECORD as u64 + entry_bytes;
        (bytes / (INODE_RECORD + CELL) as u64).min(max_inodes.saturating_sub(inodes))
    }

    // ---- promises ------------------------------------------------------

    fn class(&self, name_len: usize) -> &Class {
        &self.classes[usize::from(cells_for(name_len)) - 1]
    }

    /// Pages a new entry with a name of `name_len` bytes needs promised.
    fn entry_needs(&self, name_len: usize) -> u64 {
        u64::from(self.enabled && self.class(name_len).avail == 0)
    }

    /// Pages a new inode `ino` needs promised.
    fn inode_needs(&self, ino: u64) -> u64 {
        let k = (ino / INODES_PER_PAGE) as usize;
        u64::from(self.enabled && self.itable.get(k).is_none_or(|&p| p == 0))
    }

    /// `ENOSPC` unless the stock holds the pages a create of inode `ino`
    /// named by `name_len` bytes, with a symlink target of `target_len`
    /// bytes, needs.
    pub fn check_create(&self, ino: Ino, name_len: usize, target_len: usize) -> Result<(), Errno> {
        let target = u64::from(self.enabled && target_len > INLINE_TARGET);
        self.check(self.inode_needs(ino.get()) + self.entry_needs(name_len) + target)
    }

    /// `ENOSPC` unless the stock holds what a new entry named by
    /// `name_len` bytes needs.
    pub fn check_entry(&self, name_len: usize) -> Result<(), Errno> {
        self.check(self.entry_needs(name_len))
    }

    fn check(&self, pages: u64) -> Result<(), Errno> {
        if pages == 0 || self.promised + pages <= self.stock.len() as u64 {
            Ok(())
        } else {
            Err(Errno::ENOSPC)
        }
    }

    /// Promises `n` store pages: each costs the batch a cleared page and
    /// an owner entry.
    fn promise(&mut self, n: u64) {
        self.promised += n;
        self.charge(n * (2 * WRITE + OWNER_SIZE), 2 * n);
    }

    /// Free inode slots of table index `k`'s page, if it has one.
    fn slots_of(&self, k: usize) -> u64 {
        match self.itable.get(k) {
            Some(&p) if p != 0 => INODES_PER_PAGE - u64::from(self.ilive[k]),
            _ => 0,
        }
    }

    // ---- hooks: what changes touch ---------------------------------------

    /// Inode `ino`'s attributes changed (or it was made or dropped): its
    /// record, written or cleared.
    #[inline]
    pub fn inode_changed(&mut self, ino: Ino) {
        let ino = ino.get();
        if self.enabled && !self.loading && set_bit(&mut self.dirty_ino_bits, ino) {
            self.dirty_inos.push(ino);
            self.charge(INODE_RECORD as u64 + WRITE, 1);
        }
    }

    /// Inode `ino` was made, with a symlink target of `target_len` bytes.
    pub fn inode_made(&mut self, ino: Ino, target_len: usize) {
        if !self.enabled {
            return;
        }
        let ino = ino.get();
        let k = (ino / INODES_PER_PAGE) as usize;
        if k >= self.itable.len() {
            self.itable.resize(k + 1, 0);
            self.ilive.resize(k + 1, 0);
        }
        if self.loading {
            // Counted once the store is read (see `load`).
            self.ilive[k] += 1;
            return;
        }
        self.inode_slots -= self.slots_of(k);
        self.ilive[k] += 1;
        if self.itable[k] == 0 {
            self.itable[k] = PENDING;
            self.promise(1);
        }
        self.inode_slots += self.slots_of(k);
        if target_len > INLINE_TARGET {
            // Written once, when its page is taken: targets never change.
            self.targets.insert(ino, 0);
            self.promise(1);
            self.charge(target_len as u64 + WRITE, 1);
        }
        self.inode_changed(Ino::new(ino));
    }

    /// Inode `ino` was dropped.
    pub fn inode_dropped(&mut self, ino: Ino) {
        if !self.enabled {
            return;
        }
        let ino = ino.get();
        let k = (ino / INODES_PER_PAGE) as usize;
        if k < self.ilive.len() {
            self.inode_slots -= self.slots_of(k);
            self.ilive[k] = self.ilive[k].saturating_sub(1);
            self.inode_slots += self.slots_of(k);
        }
        match self.targets.remove(&ino) {
            // Promised, never taken: the promise goes with it.
            Some(0) => self.promised = self.promised.saturating_sub(1),
            Some(p) => self.release(p),
            None => {}
        }
        self.inode_changed(Ino::new(ino));
    }

    /// An index entry was made at `node` with a name of `name_len` bytes.
    #[inline]
    pub fn entry_made(&mut self, node: DirentOff, name_len: usize) {
        if !self.enabled || self.loading {
            return;
        }
        let ci = usize::from(cells_for(name_len)) - 1;
        if self.classes[ci].avail == 0 {
            let per = self.classes[ci].per_page();
            self.classes[ci].avail += per;
            self.promise(1);
        }
        self.classes[ci].avail -= 1;
        self.new_entries.push(node);
        self.charge((CELL * usize::from(cells_for(name_len))) as u64 + WRITE, 1);
    }

    /// The index entry whose store slot is `slot` (0 if it had none yet),
    /// named by `name_len` bytes, was removed.
    #[inline]
    pub fn entry_removed(&mut self, slot: u64, name_len: usize) {
        if !self.enabled {
            return;
        }
        if slot == 0 {
            // Made since the last retirement: its promise is given back.
            self.classes[usize::from(cells_for(name_len)) - 1].avail += 1;
        } else {
            self.freed_slots.push(slot);
            self.charge(WRITE, 1);
        }
    }

    /// Data page `p` now holds page `file_page` of file `ino`.
    #[inline]
    pub fn page_owned(&mut self, p: PageNo, ino: Ino, file_page: u64) {
        if self.enabled {
            let ino = ino.get();
            debug_assert!(ino <= OWNER_INO_MAX && file_page <= OWNER_FILE_PAGE_MAX);
            let o = Owner::File {
                ino,
                page: file_page,
            }
            .encode()
            .unwrap_or(0);
            self.set_owner(p.get(), o);
        }
    }

    /// Data page `p` no longer holds file data.
    #[inline]
    pub fn page_freed(&mut self, p: PageNo) {
        if self.enabled {
            self.set_owner(p.get(), 0);
        }
    }

    fn set_owner(&mut self, p: u64, o: u64) {
        let Some(data) = self.data else { return };
        if !data.contains(p) {
            return;
        }
        let i = p - data.start;
        let w = &mut self.owners[ix(i)];
        if self.loading {
            *w = o;
            return;
        }
        let was = *w;
        *w = o | DIRTY;
        if was & DIRTY == 0 {
            let group = (i / OWNERS_PER_PAGE) as usize;
            let line = 1u64 << ((i % OWNERS_PER_PAGE) / OWNERS_PER_LINE);
            let lines = &mut self.group_lines[group];
            if *lines == 0 {
                self.dirty_groups.push(group as u64);
            }
            // Its cache line, until the page's lines would cost more than
            // the whole page (which is then written instead): a page is
            // charged at most `OWNER_PAGE_COST`, as the log is sized for.
            if *lines & line == 0 {
                let charged = u64::from(lines.count_ones()) * OWNER_LINE_COST;
                self.pending_bytes += OWNER_LINE_COST.min(OWNER_PAGE_COST.saturating_sub(charged));
                *lines |= line;
            }
        }
    }

    /// Gives up store page `p`: its owner entry is cleared by the coming
    /// retirement, and it is free once that retirement is durable.
    fn release(&mut self, p: u64) {
        self.set_owner(p, 0);
        self.released.push(p);
    }

    /// Makes page `p` a store page of `owner`'s, cleared by the batch
    /// before anything is written into it.
    fn use_page(&mut self, p: u64, owner: Owner, batch: &mut BatchWriter) {
        batch.zero(p * PAGE_SIZE, write_len(PAGE_LEN));
        self.set_owner(p, owner.encode().unwrap_or(0));
    }

    /// Sets data page `p`'s owner entry as read from the image.
    fn load_owner(&mut self, p: u64, o: Owner) {
        if let Some(data) = self.data {
            self.owners[ix(p - data.start)] = o.encode().unwrap_or(0);
        }
    }

    /// The owner entry the store should hold for data page `p` (also
    /// fsck's cross-check).
    pub fn owner(&self, p: u64) -> Option<Owner> {
        let data = self.data?;
        data.contains(p)
            .then(|| Owner::decode(self.owners[ix(p - data.start)] & !DIRTY))
            .flatten()
    }

    /// Adds entry page `p` to class `ci`, with the slots `used` in use.
    fn add_entry_page(&mut self, ci: usize, p: u64, used: u64) {
        let c = &mut self.classes[ci];
        let entry = EntryPage {
            page: p,
            used,
            listed: false,
        };
        let idx = match c.spare.pop() {
            Some(i) => {
                // A stale listing of the place stays: it now lists this page.
                let listed = c.pages[i as usize].listed;
                c.pages[i as usize] = EntryPage { listed, ..entry };
                i
            }
            None => {
                c.pages.push(entry);
                u32::try_from(c.pages.len() - 1).expect(
                    "fewer than u32::MAX places: `load` refuses more entry pages, and a \
                     new one holds an entry of the index, which holds far fewer",
                )
            }
        };
        if let Some(d) = self.data.filter(|d| d.contains(p)) {
            self.entry_idx[ix(p - d.start)] = idx;
        }
        let free = c.per_page() - u64::from(used.count_ones());
        if free > 0 {
            c.free_slots += free;
            c.list(idx);
        }
    }
}

/// The record of inode `inode` (at that index offset) as the index holds
/// it, its target in a page of its own being at `target_page`.
fn inode_record(ns: &Namespace, inode: InodeOff, target_page: u64) -> Option<InodeRecord> {
    let r = ns.reader();
    let a = r.attr(inode)?;
    let mut rec = InodeRecord {
        ino: a.ino.get(),
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        btime: a.btime,
        ..InodeRecord::default()
    };
    if a.kind() == Some(Kind::Symlink) {
        let target = r.readlink(inode).unwrap_or_default();
        rec.target_len =
            u16::try_from(target.len()).expect("readlink gives at most PATH_MAX bytes");
        if target.len() > INLINE_TARGET {
            rec.target_page = target_page;
            rec.target_crc = kucofs_common::checksum::crc32c(&target);
        } else {
            rec.inline[..target.len()].copy_from_slice(&target);
        }
    }
    Some(rec)
}

/// Writes into `batch` every record the changes since the last retirement
/// touched, taking the store pages they need from the stock (or from
/// `pages` after a replay, calling `reserve` on each, for an image file
/// whose pages take memory only when asked), and notes the new entries'
/// slots in the index. The caller logs the batch, applies it, and then
/// calls [`retired`]. The writes come in an order in which each range is
/// written after anything it overlaps: new pages are cleared before
/// records go into them, and an entry slot freed now is reused only by a
/// later retirement.
///
/// Nothing changes, and the error is `ENOSPC`, if the batch could be
/// larger than `room` bytes (what the log can still take), or a page it
/// needs cannot be had: the notes stay, for a retirement once there is
/// room. Past those checks it cannot fail.
pub fn retire(
    ns: &mut Namespace,
    pages: &mut Pages,
    batch: &mut BatchWriter,
    reserve: &dyn Fn(u64) -> bool,
    room: u64,
) -> Result<Retirement, Errno> {
    let mut out = Retirement::default();
    if !ns.store().enabled {
        return Ok(out);
    }
    if ns.store().pending_bytes > room {
        return Err(Errno::ENOSPC);
    }
    // The entries to write: made since, still in the index, with no slot.
    // An item removed and reused for a newer entry since is listed twice
    // and written once.
    let fresh: Vec<(DirentOff, usize)> = {
        let r = ns.reader();
        let mut nodes = ns.store().new_entries.clone();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
            .into_iter()
            .filter(|&node| r.is_live(node.get(), TAG_DIRENT, None) && ns.shm_u64(node.slot()) == 0)
            .map(|node| {
                let len = (ns.shm_u64(node.shape()) & 0xffff) as usize;
                (node, usize::from(cells_for(len.clamp(1, NAME_MAX))) - 1)
            })
            .collect()
    };
    // The pages it will take: every one was promised, so after a change
    // the stock holds them; after a replay they come from `pages`.
    let needed = {
        let st = ns.store();
        let r = ns.reader();
        let mut want = [0u64; MAX_CELLS as usize];
        for &(_, ci) in &fresh {
            want[ci] += 1;
        }
        let entry_pages: u64 = st
            .classes
            .iter()
            .zip(want)
            .map(|(c, w)| w.saturating_sub(c.free_slots).div_ceil(c.per_page()))
            .sum();
        let inode_pages = st
            .dirty_inos
            .iter()
            .filter(|&&ino| {
                let k = (ino / INODES_PER_PAGE) as usize;
                matches!(st.itable.get(k), Some(&0) | Some(&PENDING) | None)
                    && !r.inode_by_ino(Ino::new(ino)).is_null()
            })
            .map(|&ino| ino / INODES_PER_PAGE)
            .collect::<std::collections::BTreeSet<u64>>()
            .len() as u64;
        let target_pages = st
            .dirty_inos
            .iter()
            .filter(|ino| st.targets.get(ino) == Some(&0))
            .count() as u64;
        entry_pages + inode_pages + target_pages
    };
    let mut extra = Vec::new();
    while (ns.store().stock.len() + extra.len()) < ix(needed) {
        match pages.take_meta() {
            Some(p) if reserve(p) => extra.push(p),
            taken => {
                extra.extend(taken);
                for p in extra {
                    pages.release_meta(p);
                }
                return Err(Errno::ENOSPC);
            }
        }
    }
    let mut st = std::mem::take(ns.store_mut());
    st.stock.extend(extra);
    let take = |st: &mut Store, owner: Owner, batch: &mut BatchWriter, out: &mut Retirement| {
        // Counted above: the stock holds one for every page used below.
        let p = st.stock.pop().unwrap_or_default();
        st.use_page(p, owner, batch);
        out.taken.push(p);
        p
    };
    // Entries removed: their slots cleared.
    for &id in &st.freed_slots {
        let (p, s) = slot_parts(id);
        let Some(Owner::Entries { cells }) = st.owner(p) else {
            continue;
        };
        let at = p * PAGE_SIZE + s * (CELL as u64) * u64::from(cells);
        batch.zero(at, write_len(CELL * usize::from(cells)));
        out.cleared += 1;
    }
    // Entries made: a slot each, and their records.
    let mut name = [0u8; NAME_MAX];
    for &(node, ci) in &fresh {
        let (page, slot) = match st.classes[ci].take_slot() {
            Some(at) => at,
            None => {
                let cells = st.classes[ci].cells;
                let p = take(&mut st, Owner::Entries { cells }, batch, &mut out);
                st.add_entry_page(ci, p, 0);
                st.classes[ci].take_slot().unwrap_or((p, 0))
            }
        };
        let r = ns.reader();
        let len = r.name_into(node, &mut name);
        let parent = r.ino(InodeOff::new(ns.shm_u64(node.dir()))).get();
        let ino = ns.shm_u64(node.ino());
        let kind = shape_kind(ns.shm_u64(node.shape()));
        let cells = st.classes[ci].cells;
        let at = page * PAGE_SIZE + slot * (CELL as u64) * u64::from(cells);
        encode_entry(
            parent,
            ino,
            kind,
            &name[..len],
            batch.put_with(at, CELL * usize::from(cells)),
        );
        ns.set_dirent_slot(node, slot_id(page, slot));
        out.entries += 1;
    }
    st.new_entries.clear();
    // Every entry has its slot: what was promised for entries is settled.
    for c in &mut st.classes {
        c.avail = c.free_slots;
    }
    // Inodes: their records as the index holds them, or cleared.
    let mut dirty = std::mem::take(&mut st.dirty_inos);
    dirty.sort_unstable();
    for &ino in &dirty {
        st.dirty_ino_bits[ix(ino / 64)] &= !(1 << (ino % 64));
        let (k, at) = inode_slot(ino);
        let k = ix(k);
        if k >= st.itable.len() {
            st.itable.resize(k + 1, 0);
            st.ilive.resize(k + 1, 0);
        }
        let inode = ns.reader().inode_by_ino(Ino::new(ino));
        if inode.is_null() {
            // Gone. Its page goes too once the last inode in it has.
            match st.itable[k] {
                PENDING | 0 if st.ilive[k] == 0 => {
                    st.inode_slots -= st.slots_of(k);
                    st.itable[k] = 0;
                }
                PENDING | 0 => {}
                p if st.ilive[k] == 0 => {
                    st.inode_slots -= st.slots_of(k);
                    st.release(p);
                    st.itable[k] = 0;
                }
                p => {
                    batch.zero(p * PAGE_SIZE + at, write_len(INODE_RECORD));
                    out.inodes += 1;
                }
            }
            continue;
        }
        if st.itable[k] == PENDING || st.itable[k] == 0 {
            st.inode_slots -= st.slots_of(k);
            st.itable[k] = take(&mut st, Owner::Inodes { index: k as u64 }, batch, &mut out);
            st.inode_slots += st.slots_of(k);
        }
        let target_page = match st.targets.get(&ino).copied() {
            Some(0) => {
                // The target, written once with its page.
                let p = take(&mut st, Owner::Target { ino }, batch, &mut out);
                st.targets.insert(ino, p);
                let target = ns.reader().readlink(inode).unwrap_or_default();
                batch.put(p * PAGE_SIZE, &target);
                p
            }
            Some(p) => p,
            None => 0,
        };
        let Some(record) = inode_record(ns, inode, target_page) else {
            continue;
        };
        batch.put(st.itable[k] * PAGE_SIZE + at, &record.encode());
        out.inodes += 1;
    }
    dirty.clear();
    st.dirty_inos = dirty;
    // Owner entries, an owner page at a time in page order: the cache
    // lines holding changed entries, in runs, or the whole page where that
    // is less.
    let mut groups = std::mem::take(&mut st.dirty_groups);
    groups.sort_unstable();
    let mut lines = Vec::with_capacity(ix(OWNERS_PER_PAGE / OWNERS_PER_LINE));
    for &group in &groups {
        let mask = std::mem::take(&mut st.group_lines[ix(group)]);
        let first = group * OWNERS_PER_PAGE;
        let end = (first + OWNERS_PER_PAGE).min(st.owners.len() as u64);
        lines.clear();
        let mut n = 0;
        let mut m = mask;
        while m != 0 {
            let line = first / OWNERS_PER_LINE + u64::from(m.trailing_zeros());
            m &= m - 1;
            lines.push(line);
            let from = line * OWNERS_PER_LINE;
            for w in &mut st.owners[ix(from)..ix((from + OWNERS_PER_LINE).min(end))] {
                n += u64::from(*w & DIRTY != 0);
                *w &= !DIRTY;
            }
        }
        if n == 0 {
            continue;
        }
        // A run starts at each marked line whose predecessor is not.
        let runs = u64::from((mask & !(mask << 1)).count_ones());
        let mut put = |from: u64, to: u64| {
            let (from, to) = (from.max(first), to.min(end));
            let buf = batch.put_with(
                st.owners_at + from * OWNER_SIZE,
                ix((to - from) * OWNER_SIZE),
            );
            for o in &st.owners[ix(from)..ix(to)] {
                buf.extend_from_slice(&o.to_le_bytes());
            }
        };
        if runs * WRITE + lines.len() as u64 * 64 > OWNER_PAGE_COST {
            put(first, end);
        } else {
            let mut a = 0;
            while a < lines.len() {
                let mut b = a + 1;
                while b < lines.len() && lines[b] == lines[b - 1] + 1 {
                    b += 1;
                }
                put(
                    lines[a] * OWNERS_PER_LINE,
                    (lines[b - 1] + 1) * OWNERS_PER_LINE,
                );
                a = b;
            }
        }
        out.owners += n;
    }
    groups.clear();
    st.dirty_groups = groups;
    // Everything promised was taken or is no longer needed.
    st.promised = 0;
    st.pending_bytes = 0;
    st.pending_writes = 0;
    *ns.store_mut() = st;
    debug_assert!(batch.bytes().len() as u64 <= room);
    Ok(out)
}

/// After a retirement's batch is durable and in place: the slots it freed
/// take new entries, entry pages left empty go (when the class keeps a
/// page's worth of free slots besides), and the pages given up earlier
/// whose cleared owner entries are now in the store go back to `pages`.
pub fn retired(ns: &mut Namespace, pages: &mut Pages) {
    let st = ns.store_mut();
    if !st.enabled {
        return;
    }
    for id in std::mem::take(&mut st.freed_slots) {
        let (p, s) = slot_parts(id);
        let Some(&idx) = st
            .data
            .filter(|d| d.contains(p))
            .and_then(|d| st.entry_idx.get(ix(p - d.start)))
            .filter(|&&i| i != u32::MAX)
        else {
            continue;
        };
        let Some(Owner::Entries { cells }) = st.owner(p) else {
            continue;
        };
        let ci = usize::from(cells) - 1;
        let c = &mut st.classes[ci];
        let per = c.per_page();
        let ep = &mut c.pages[idx as usize];
        if ep.used & (1 << s) == 0 {
            continue;
        }
        ep.used &= !(1 << s);
        let empty = ep.used == 0;
        c.free_slots += 1;
        c.avail += 1;
        c.list(idx);
        if !empty || c.free_slots < 2 * per {
            continue;
        }
        // An empty page: given up. Its owner entry is cleared by the next
        // retirement, and it is free once that one is durable.
        c.free_slots -= per;
        c.avail -= per;
        let ep = &mut c.pages[idx as usize];
        let gone = std::mem::replace(&mut ep.page, 0);
        c.spare.push(idx);
        if let Some(d) = st.data.filter(|d| d.contains(gone)) {
            st.entry_idx[ix(gone - d.start)] = u32::MAX;
        }
        st.release(gone);
    }
    // Given-up pages whose cleared owner entries are in the store now (and
    // that the store has not taken again).
    let data = st.data;
    let owners = &st.owners;
    // (A word of 0: free, and not changed since the last retirement.)
    let (ready, later): (Vec<u64>, Vec<u64>) = st
        .released
        .drain(..)
        .partition(|&p| data.is_some_and(|d| owners[ix(p - d.start)] == 0));
    st.released = later;
    for p in ready {
        pages.release_meta(p);
    }
}

#[cfg(test)]
mod tests;
